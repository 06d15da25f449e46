/* Row argmax on the CPU (ops.h argmax_rows): base/rows.c's rule, row by row. */
#include <string.h>
#include "../../base/rows.h"
#include "cpu.h"

void m3_cpu_argmax_rows(void *ctx, const float *x, int rows, int n, size_t ld, int32_t *out) {
    (void)ctx;
    for (int r = 0; r < rows; r++) out[r] = m3_row_argmax(x + (size_t)r * ld, n);
}

void m3_cpu_argmax_rows_fin(void *ctx, const float *x, int rows, int n, int nf, size_t ld, int32_t *out, int32_t *fin) {
    (void)ctx;
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * ld;
        out[r] = m3_row_argmax(row, n);
        uint32_t bad = 0;
        for (int i = 0; i < nf; i++) {
            uint32_t b;
            memcpy(&b, row + i, sizeof b);
            bad |= (b & 0x7f800000u) == 0x7f800000u;
        }
        fin[r] = !bad;
    }
}
