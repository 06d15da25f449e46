/* Per-head Gemma RMSNorm + partial NeoX RoPE on the CPU. */
#include <math.h>
#include <stdlib.h>

#include "cpu.h"

/* inv_freq and angles in f32, as the reference's rotary embedding computes them */
void m3_cpu_head_norm_rope(void *ctx, float *x, int T, int heads, int dim, const float *w, float eps,
                           int rotary_dim, double theta, const int32_t *pos) {
    int half = rotary_dim / 2;
    float cs[1024], sn[1024];
    float *c = half <= 1024 ? cs : m3_cpu_scratch(ctx, sizeof(float) * (size_t)half * 2, "head_norm_rope");
    float *s = half <= 1024 ? sn : c + half;
    if (!c) return;
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < half; j++) {
            float e = (float)(2 * j) / (float)rotary_dim;
            float inv = 1.0f / powf((float)theta, e);
            float a = (float)pos[t] * inv;
            c[j] = cosf(a);
            s[j] = sinf(a);
        }
        for (int h = 0; h < heads; h++) {
            float *v = x + ((size_t)t * heads + h) * dim;
            m3_cpu_rms_row(v, w, dim, eps, v);
            for (int j = 0; j < half; j++) {
                float a = v[j], b = v[j + half];
                v[j] = a * c[j] - b * s[j];
                v[j + half] = b * c[j] + a * s[j];
            }
        }
    }
    if (c != cs) free(c);
}
