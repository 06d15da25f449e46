/* The number formats' decoders (and the KV cache's encoders) used inside kernels: the one place
 * the CUDA backend turns E4M3, E8M0, E2M1, NVFP4 blocks, BF16 and F16 into values (the device
 * twins of src/base/num.h; the CPU's are src/backend/cpu/formats.c), and the bit-permuted
 * NVFP4 words of the tiled device layout (common.cuh, wt_voff).
 * CPU reference: src/backend/cpu/formats.c (m3_cpu_decode_rows) and src/base/num.c. */
#ifndef M3_CUDA_FORMATS_CUH
#define M3_CUDA_FORMATS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <string.h>

/* NVFP4 values in the tiled layout are also bit-permuted inside each 32-bit word (8 E2M1 codes;
 * code j = values 8i + j of the word's row piece, code 0 the low nibble of its first byte): the
 * sign of code j sits at bit wt_nv_sbit(j), its 3 magnitude bits from wt_nv_ebit(j) up. Codes
 * 2p and 2p + 1 then become an f16 pair (value x 2^-14: sign at bit 15, exponent and mantissa
 * bits at 9..11 of each half) with one or two shifts and masks (nv_pair), no table:
 *   pair 0: w & 0x8E008E00   pair 1: (w << 3) & 0x8E008E00
 *   pair 2: ((w << 9) & 0x0E000E00) | ((w << 2) & 0x80008000)   pair 3: the same with 6 and 1
 * (pairs 2 and 3 computed as one multiply of the masked word: see nv_pair) */
static __host__ __device__ __forceinline__ int wt_nv_sbit(int j) {
    const int p = (j >> 1) & 3;
    return (p == 0 ? 15 : p == 1 ? 12 : p == 2 ? 13 : 14) + 16 * (j & 1);
}
static __host__ __device__ __forceinline__ int wt_nv_ebit(int j) {
    const int p = (j >> 1) & 3;
    return (p == 0 ? 9 : p == 1 ? 6 : p == 2 ? 0 : 3) + 16 * (j & 1);
}
/* 8 codes in plain order (code j at bits 4j..4j+3) -> the permuted word, and back */
static __host__ __device__ __forceinline__ uint32_t wt_nv_perm(uint32_t plain) {
    uint32_t w = 0;
    for (int j = 0; j < 8; j++) {
        const uint32_t c = (plain >> (4 * j)) & 15u;
        w |= ((c >> 3) << wt_nv_sbit(j)) | ((c & 7u) << wt_nv_ebit(j));
    }
    return w;
}
static __host__ __device__ __forceinline__ uint32_t wt_nv_code(uint32_t w, int j) {
    return (((w >> wt_nv_sbit(j)) & 1u) << 3) | ((w >> wt_nv_ebit(j)) & 7u);
}

/* f16 pair P (0-3) of a permuted word: codes 2P and 2P + 1, each value x 2^-14 */
template <int P> static __host__ __device__ __forceinline__ uint32_t nv_pair(uint32_t w) {
    if (P == 0) return w & 0x8E008E00u;
    if (P == 1) return (w << 3) & 0x8E008E00u;
    /* pairs 2 and 3 move magnitude and sign by different shifts: one multiply adds both shifted
     * copies of the masked word (no carry reaches a kept bit), so a mask, an IMAD and a mask
     * instead of two shifts and two masks, and the IMAD runs beside the ALU's masks */
    if (P == 2) return ((w & 0x20072007u) * 516u) & 0x8E008E00u; /* << 9 (magnitude) + << 2 (sign) */
    return ((w & 0x40384038u) * 66u) & 0x8E008E00u;             /* << 6 + << 1 */
}


/* E8M0 scale byte B (0-3) of a word as an f32 2^(e-127): a shift and a mask. Exact for codes
 * 1..254 only; tiled MXFP8 matrices hold no other (weights.cu keeps a matrix with a 0 or 255
 * scale row-major, read through e8m0_f32). */
template <int B> static __host__ __device__ __forceinline__ float e8_of(uint32_t w) {
    const uint32_t b = (B < 3 ? w << (23 - 8 * B) : w >> 1) & 0x7f800000u;
#ifdef __CUDA_ARCH__
    return __uint_as_float(b);
#else
    float f;
    memcpy(&f, &b, 4);
    return f;
#endif
}
/* E8M0: 2^(b-127); 255 NaN; b = 0 is 2^-127 (an f32 subnormal) */
static __device__ __forceinline__ float e8m0_f32(uint32_t b) {
    return b == 255 ? __int_as_float(0x7fc00000) : b ? __int_as_float((int)(b << 23)) : __int_as_float(0x00400000);
}
/* E4M3 (fn): exact through the hardware converter (to f16, exact for every E4M3 value) */
static __device__ __forceinline__ float e4m3_f32(uint32_t b) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(h));
}
/* two E4M3 bytes (low byte first) -> two floats */
static __device__ __forceinline__ float2 e4m3x2_f32(uint32_t two) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    return __half22float2(__half2(h));
}
/* E2M1 code (low 4 bits) -> value * 2^-14 as an f16 bit pattern: magnitude bits e(2) m(1)
 * placed at f16 bits 9..11 give 2^(e-15)(1 + m/2) (e > 0) or m 2^-15 (e = 0), i.e. the
 * E2M1 value times 2^-14, exactly; the caller folds 2^14 into the block scale. */
static __device__ __forceinline__ uint32_t e2m1_h16(uint32_t code) {
    return ((code & 7u) << 9) | ((code & 8u) << 12);
}
/* one byte of two E2M1 codes (low nibble first) -> two floats (times 2^-14) */
static __device__ __forceinline__ float2 e2m1x2_f32(uint32_t byte) {
    uint32_t bits = e2m1_h16(byte & 15u) | (e2m1_h16(byte >> 4) << 16);
    __half2_raw r;
    r.x = (unsigned short)(bits & 0xffff);
    r.y = (unsigned short)(bits >> 16);
    return __half22float2(__half2(r));
}
/* E2M1 code k of a row of packed codes (code 0: the low nibble of byte 0) */
static __device__ __forceinline__ uint32_t e2m1_at(const uint8_t *row, int k) {
    return (k & 1) ? (row[k / 2] >> 4) : (row[k / 2] & 15);
}
/* E2M1 code (low 4 bits) -> its value; an NVFP4 value is this times its block scale */
static __device__ __forceinline__ float e2m1_f32(uint32_t code) { return e2m1x2_f32(code).x * 16384.0f; }
/* an NVFP4 block's E4M3 scale byte as the multiplier of e2m1x2_f32's values (x 2^14) */
static __device__ __forceinline__ float nvfp4_scale(uint32_t b) { return e4m3_f32(b) * 16384.0f; }
static __device__ __forceinline__ float bf16_f32(uint32_t h) { return __int_as_float((int)(h << 16)); }
static __device__ __forceinline__ float f16_f32(uint32_t h) {
    __half_raw r;
    r.x = (unsigned short)h;
    return __half2float(__half(r));
}

/* f32 -> E4M3 RNE saturating to +-448 (NaN -> 0x7f), as m3_f32_to_e4m3 */
static __device__ __forceinline__ uint8_t f32_e4m3(float f) {
    if (f != f) return 0x7f;
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
}
/* nearest E2M1 code (|x| saturated at 6; exact ties to the even code), as m3_f32_to_e2m1 */
static __device__ __forceinline__ uint32_t f32_e2m1(float x) {
    const float vals[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    uint32_t sign = signbit(x) ? 8u : 0u;
    float a = fabsf(x);
    if (!(a <= 6.0f)) a = 6.0f;
    int best = 0;
    float bd = a;
#pragma unroll
    for (int i = 1; i < 8; i++) {
        float d = fabsf(a - vals[i]);
        if (d < bd || (d == bd && (i & 1) == 0)) { bd = d; best = i; }
    }
    return best ? (sign | (uint32_t)best) : 0u;
}
static __device__ __forceinline__ uint16_t f32_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* two E4M3 bytes (low byte first) -> their f16x2 bits (exact), for the tensor cores */
static __device__ __forceinline__ uint32_t e4m3x2_h2(uint32_t two) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* E2M1 code (4 bits) -> f16 bits of its value: 0, 0.5, then 2^(e-1)(1 + m/2) */
static __device__ __forceinline__ uint32_t e2m1_f16bits(uint32_t c) {
    uint32_t m = c & 7, mag = m == 0 ? 0u : m == 1 ? 0x3800u : ((((m >> 1) + 14u) << 10) | ((m & 1u) << 9));
    return mag | ((c & 8u) << 12);
}


/* ---- tensor-core operands (the wgmma GEMM, gemm_tc.cu; the few-token GEMM, gemm_ft.cu) */

/* bf16x2 product (round to nearest; exact wherever the callers use it) */
static __device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    __nv_bfloat162 r = __hmul2(*(const __nv_bfloat162 *)&a, *(const __nv_bfloat162 *)&b);
    return *(uint32_t *)&r;
}
/* f32 pair -> bf16x2 bits (lo in the low half), round to nearest even */
static __device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
    __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&b;
}
/* NVFP4 pair P of a permuted word (nv_pair) as bf16 bits of value x 2^-126: the magnitude bits
 * moved from f16's 9..11 to bf16's 6..8 (exponent bits 0-1, mantissa bit 6), the sign kept
 * (code 1, 0.5, is the bf16 subnormal 2^-127, which the bf16 multiply takes as it is) */
template <int P> static __device__ __forceinline__ uint32_t nv_bf2(uint32_t w) {
    const uint32_t h = nv_pair<P>(w);
    return (h & 0x80008000u) | ((h >> 3) & 0x01C001C0u);
}
/* an NVFP4 block's E4M3 scale times 2^119 as bf16x2 (both halves; exact: 3 mantissa bits, and
 * 2^-9 .. 448 times 2^119 stays a bf16 normal); times nv_bf2's value: the weight x 2^-7 */
static __device__ __forceinline__ uint32_t nv_scale_bf2(uint32_t b) {
    const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(e4m3_f32(b) * 0x1p119f));
    return h | (h << 16);
}
/* E8M0 byte i (0-3) of a word as 2^(e-127); codes 1..254 (tiled MXFP8 matrices hold no other) */
static __device__ __forceinline__ float e8_byte(uint32_t w, int i) { return __uint_as_float(((w >> (8 * i)) & 0xffu) << 23); }

#endif
