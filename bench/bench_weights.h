/* Random weights in the host layout, for the CUDA benchmarks (bench_cuda_linear.c,
 * bench_cuda_gemm.c): BF16 values, MXFP8 (E4M3 values, E8M0 scales near 2^-6) and NVFP4
 * (random codes, E4M3 block scales, global scale 0.5) from one xorshift stream. */
#ifndef M3_BENCH_WEIGHTS_H
#define M3_BENCH_WEIGHTS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/num.h"
#include "weights/weights.h"

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static float urand(void) { return (float)(rnd() >> 8) / 16777216.0f * 2 - 1; }

static void make(m3_linear *L, m3_wfmt f, int N, int K, uint8_t **w, uint8_t **s) {
    memset(L, 0, sizeof *L);
    L->fmt = f; L->N = N; L->K = K; L->gmul = 1;
    size_t rb = f == M3_WF_BF16 ? 2 * (size_t)K : f == M3_WF_MXFP8 ? (size_t)K : (size_t)K / 2;
    size_t sb = f == M3_WF_MXFP8 ? (size_t)K / 32 : f == M3_WF_NVFP4 ? (size_t)K / 16 : 0;
    *w = malloc(rb * N);
    *s = sb ? malloc(sb * N) : NULL;
    if (f == M3_WF_BF16) {
        uint16_t *h = (uint16_t *)*w;
        for (size_t i = 0; i < (size_t)K * N; i++) h[i] = m3_f32_to_bf16(urand() * 0.05f);
    } else if (f == M3_WF_MXFP8) {
        for (size_t i = 0; i < rb * N; i++) (*w)[i] = m3_f32_to_e4m3(urand() * 8);
    } else {
        for (size_t i = 0; i < rb * N; i++) (*w)[i] = (uint8_t)rnd();
    }
    for (size_t i = 0; i < sb * N; i++)
        (*s)[i] = f == M3_WF_MXFP8 ? (uint8_t)(120 + rnd() % 4) : m3_f32_to_e4m3(0.01f + 0.01f * (rnd() % 8));
    if (f == M3_WF_NVFP4) L->gmul = 0.5f;
    L->row_bytes = rb;
    L->scale_row = sb;
    L->w = *w;
    L->scale = *s;
}

#endif
