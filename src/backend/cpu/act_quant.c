/* NVFP4 quantization of activations, per token (the MoE's FC1 input under --moe-act-quant nvfp4;
 * spec section 1: the M3.1 experts were trained with NVFP4 activations there, one global scale per
 * token). Each row of H values (H a multiple of 16), in f32 with each operation rounded once:
 *   amax = max |x|;  gs = 2688 / amax (6 x 448: the row's largest value lands on E2M1's 6 times
 *   E4M3's 448);  y = x * gs;  then the KV cache's NVFP4 rule (spec section 3, m3_kv_round_nvfp4)
 *   on y: per 16 values s = e4m3(amax16(y) / 6), code = nearest E2M1 of y / s (saturated at 6,
 *   exact ties to the even code), s == 0 a zero block;  out = (e2m1(code) * s) / gs.
 * A row of zeros, with a value that is not finite, or whose amax is so small that gs overflows
 * (below ~7.9e-36), is copied as it is. A value that rounds to zero comes out +0.
 * The GPU does the same (src/backend/cuda/act_quant.cu); tools/make_act_oracle.py patches the
 * reference with it.
 *
 * The E2M1 choice without branches, so that a block's 16 values vectorize: the magnitude is the sum
 * of the steps between neighbouring E2M1 values (0.5, 0.5, 0.5, 0.5, 1, 1, 2) whose midpoint
 * (0.25 .. 5) |y / s| passes, a midpoint itself passing where the value above it has the even code
 * (m3_f32_to_e2m1's rule; tests/test_quantize.c checks the two agree). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/num.h"
#include "cpu.h"

static void row(const float *xr, int H, float *o) {
    float amax = 0;
    int bad = 0;
    for (int i = 0; i < H; i++) {
        amax = fabsf(xr[i]) > amax ? fabsf(xr[i]) : amax;
        bad |= !isfinite(xr[i]);
    }
    const float gs = 2688.0f / amax;
    if (bad || !(amax > 0) || !isfinite(gs)) { /* gs overflows below amax ~7.9e-36 */
        if (o != xr) memcpy(o, xr, sizeof(float) * (size_t)H);
        return;
    }
    for (int b = 0; b < H / 16; b++) {
        float y[16], m = 0;
        for (int i = 0; i < 16; i++) {
            y[i] = xr[16 * b + i] * gs;
            m = fabsf(y[i]) > m ? fabsf(y[i]) : m;
        }
        const float s = m3_e4m3_to_f32(m3_f32_to_e4m3(m / 6.0f));
        float *ob = o + 16 * b;
        if (s == 0) {
            memset(ob, 0, sizeof(float) * 16);
            continue;
        }
        for (int i = 0; i < 16; i++) {
            const float q = y[i] / s, a = fabsf(q);
            /* a midpoint passes where the value above it has the even code: 0.75 (-> 1), 1.75 (-> 2), 3.5 (-> 4) */
            const float mag = (a > 0.25f ? 0.5f : 0.0f) + (a >= 0.75f ? 0.5f : 0.0f) + (a > 1.25f ? 0.5f : 0.0f) +
                              (a >= 1.75f ? 0.5f : 0.0f) + (a > 2.5f ? 1.0f : 0.0f) + (a >= 3.5f ? 1.0f : 0.0f) +
                              (a > 5.0f ? 2.0f : 0.0f);
            const float v = mag * s / gs;
            ob[i] = q < 0 && mag > 0 ? -v : v; /* (-mag * s) / gs = -(mag * s / gs) exactly; zero is +0 */
        }
    }
}

void m3_cpu_act_quant_nvfp4(const float *x, int T, int H, float *out) {
    for (int t = 0; t < T; t++) row(x + (size_t)t * H, H, out + (size_t)t * H);
}

typedef struct { const float *x; float *out; int H; } rows_arg;
static void rows_fn(void *ctx, size_t b, size_t e, int w) {
    const rows_arg *a = ctx;
    (void)w;
    for (size_t t = b; t < e; t++) row(a->x + t * a->H, a->H, a->out + t * a->H);
}

void m3_cpu_act_quant_nvfp4_pool(m3_cpu *c, const float *x, int T, int H, float *out) {
    rows_arg a = {x, out, H};
    if (T > 1 && c->pool) m3_pool_for(c->pool, (size_t)T, 1, rows_fn, &a);
    else m3_cpu_act_quant_nvfp4(x, T, H, out);
}
