/* Row argmax on the CPU (ops.h argmax_rows): base/rows.c's rule, row by row. */
#include "../../base/rows.h"
#include "cpu.h"

void m3_cpu_argmax_rows(void *ctx, const float *x, int rows, int n, size_t ld, int32_t *out) {
    (void)ctx;
    for (int r = 0; r < rows; r++) out[r] = m3_row_argmax(x + (size_t)r * ld, n);
}
