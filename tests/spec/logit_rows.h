/* Logit rows for the draw and verify tests (test_draw_rows.c, test_verify_rows.c): a fixed
 * generator, so a seed gives the same rows in both. */
#ifndef M3_TEST_SPEC_LOGIT_ROWS_H
#define M3_TEST_SPEC_LOGIT_ROWS_H

#include <math.h>
#include <stdint.h>

/* uniform in [0, 1) from a 64-bit LCG state */
static inline double urand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) * 0x1.0p-53;
}

/* a row like a model's: a normal floor (standard deviation sd) and 24 ids lifted by up to lift */
static inline void fill_row(float *x, int V, uint64_t *s, double sd, double lift) {
    for (int i = 0; i < V; i++) {
        const double a = urand(s) + 1e-12, b = urand(s);
        x[i] = (float)(sd * sqrt(-2 * log(a)) * cos(6.283185307179586 * b));
    }
    for (int j = 0; j < 24; j++) x[(int)(urand(s) * V)] += (float)(lift * urand(s));
}

#endif
