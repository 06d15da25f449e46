/* The CPU backend's number-format tables and its scalar decoder of every weight format (the
 * portable reference the SIMD kernels and the CUDA decoders, src/backend/cuda/formats.cuh, match). */
#include <string.h>

#include "../../base/num.h"
#include "formats.h"

float m3_cpu_tab_e8m0[256], m3_cpu_tab_e4m3[256];
/* E8M0 x 256, for E4M3 codes read as F16 (value / 256). Above 246 the product would
 * overflow: those groups multiply by 256 first. */
float m3_cpu_tab_e8m0_x256[256];

__attribute__((constructor)) static void init_tables(void) {
    for (int i = 0; i < 256; i++) {
        m3_cpu_tab_e8m0[i] = m3_e8m0_to_f32((uint8_t)i);
        m3_cpu_tab_e4m3[i] = m3_e4m3_to_f32((uint8_t)i);
        m3_cpu_tab_e8m0_x256[i] = i <= E8M0_X256_MAX ? m3_cpu_tab_e8m0[i] * 256.0f : m3_cpu_tab_e8m0[i];
    }
}

void m3_cpu_decode_row(const m3_linear *W, int n, int k0, int len, float *out) {
    const uint8_t *row = W->w + (size_t)n * W->row_bytes;
    const uint8_t *sc = W->scale ? W->scale + (size_t)n * W->scale_row : NULL;
    for (int i = 0; i < len; i++) {
        int k = k0 + i;
        uint16_t h;
        switch (W->fmt) {
        case M3_WF_F32: memcpy(&out[i], row + 4 * (size_t)k, 4); break;
        case M3_WF_BF16: memcpy(&h, row + 2 * (size_t)k, 2); out[i] = m3_bf16_to_f32(h); break;
        case M3_WF_F16: memcpy(&h, row + 2 * (size_t)k, 2); out[i] = m3_f16_to_f32(h); break;
        case M3_WF_MXFP8: out[i] = m3_cpu_tab_e4m3[row[k]] * m3_cpu_tab_e8m0[sc[k / 32]]; break;
        case M3_WF_NVFP4: {
            uint8_t code = (k & 1) ? (row[k / 2] >> 4) : (row[k / 2] & 15);
            out[i] = m3_e2m1_values[code] * (m3_cpu_tab_e4m3[sc[k / 16]] * W->gmul);
            break;
        }
        default: out[i] = 0;
        }
    }
}

void m3_cpu_decode_rows(const m3_linear *W, int n0, int n1, int k0, int len, float *out) {
    for (int n = n0; n < n1; n++) m3_cpu_decode_row(W, n, k0, len, out + (size_t)(n - n0) * len);
}
