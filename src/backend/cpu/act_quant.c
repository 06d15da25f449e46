/* NVFP4 quantization of activations, per token (the MoE's FC1 input under --moe-act-quant nvfp4;
 * spec section 1: the M3.1 experts were trained with NVFP4 activations there, one global scale per
 * token). Each row of H values (H a multiple of 16), in f32 with each operation rounded once:
 *   amax = max |x|;  gs = 2688 / amax (6 x 448: the row's largest value lands on E2M1's 6 times
 *   E4M3's 448);  y = x * gs;  then the KV cache's NVFP4 rule (spec section 3, m3_kv_round_nvfp4)
 *   on y: per 16 values s = e4m3(amax16(y) / 6), code = nearest E2M1 of y / s (saturated at 6,
 *   exact ties to the even code), s == 0 a zero block;  out = (e2m1(code) * s) / gs.
 * A row of zeros, with a value that is not finite, or whose amax is so small that gs overflows
 * (below ~7.9e-36), is copied as it is. A value that rounds to zero comes out +0. The GPU does the same
 * (src/backend/cuda/act_quant.cu); tools/make_act_oracle.py patches the reference with it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/num.h"
#include "cpu.h"

void m3_cpu_act_quant_nvfp4(const float *x, int T, int H, float *out) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * H;
        float *o = out + (size_t)t * H;
        float amax = 0;
        int bad = 0;
        for (int i = 0; i < H; i++) {
            amax = fabsf(xr[i]) > amax ? fabsf(xr[i]) : amax;
            bad |= !isfinite(xr[i]);
        }
        const float gs = 2688.0f / amax;
        if (bad || !(amax > 0) || !isfinite(gs)) { /* gs overflows below amax ~7.9e-36 */
            if (o != xr) memcpy(o, xr, sizeof(float) * (size_t)H);
            continue;
        }
        for (int b = 0; b < H / 16; b++) {
            float y[16];
            uint8_t codes[8], sc;
            for (int i = 0; i < 16; i++) y[i] = xr[16 * b + i] * gs;
            m3_kv_round_nvfp4(y, 16, codes, &sc);
            const float s = m3_e4m3_to_f32(sc);
            for (int i = 0; i < 16; i++) {
                const uint8_t c = (uint8_t)(codes[i / 2] >> (4 * (i & 1)) & 15);
                o[16 * b + i] = m3_e2m1_values[c] * s / gs;
            }
        }
    }
}
