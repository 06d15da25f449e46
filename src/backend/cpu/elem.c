/* Elementwise ops on the CPU: the residual add, SwiGLU-OAI. */
#include <math.h>

#include "cpu.h"

void m3_cpu_add(void *ctx, float *y, const float *x, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* out = (clamp(up) + 1) * g * sigmoid(alpha g), g = min(gate, limit) (out may be gate) */
void m3_cpu_swiglu_oai(const float *gate, const float *up, size_t n, float alpha, float limit, float *out) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i] < limit ? gate[i] : limit;
        float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        out[i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
    }
}
