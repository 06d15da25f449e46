/* The exact power-of-two rescaling of precision-bf16 attention, shared by the CPU backend
 * (src/backend/cpu/attention.c) and the CUDA kernels (cuda/attn_mma.cuh, cuda/attention.cu): scores
 * are kept in log2 units (scaled by log2(e) / sqrt(D)) and running maxima are integers, so every
 * rescale is a multiply by 2^d for an integer d, exact and independent of the order keys are visited
 * in. Plain C, usable from both compilers. */
#ifndef M3_BACKEND_ATTN_POW2_H
#define M3_BACKEND_ATTN_POW2_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define M3_AP_FN static __host__ __device__ __forceinline__
#else
#define M3_AP_FN static inline
#endif

#define M3_LOG2E_F 1.4426950408889634f

/* 2^d for an integer-valued d <= 0 (-inf, NaN, below the normal range: 0), exactly */
M3_AP_FN float m3_pow2_int(float d) {
    if (!(d >= -126.f)) return 0.f;
    const uint32_t u = (uint32_t)(127 + (int)d) << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
