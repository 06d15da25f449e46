/* Gemma RMSNorm on the CPU: out = x rsqrt(mean(x^2) + eps) (1 + w), the sum of squares in double. */
#include <math.h>

#include "cpu.h"

void m3_cpu_rms_row(const float *x, const float *w, int dim, float eps, float *out) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / dim + eps));
    for (int i = 0; i < dim; i++) out[i] = (x[i] * r) * (1.0f + w[i]);
}

void m3_cpu_rmsnorm(void *ctx, const float *x, const float *w, int rows, int dim, float eps, float *out) {
    (void)ctx;
    for (int r = 0; r < rows; r++) m3_cpu_rms_row(x + (size_t)r * dim, w, dim, eps, out + (size_t)r * dim);
}
