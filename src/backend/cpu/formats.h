/* The CPU backend's number-format decoders, in one place: E4M3 / E8M0 value tables, the
 * E2M1 -> bf16 byte tables, the scalar decoder of any weight format (formats.c) and the AVX2
 * decoders of 32 / 64 columns the linear kernels inline (linear.c; the AVX-512 kernel decodes
 * in its MX512 / NV512 steps with the same tables and the same E4M3-as-F16 trick). The values
 * are src/base/num.h's (m3_e4m3_to_f32, m3_e8m0_to_f32, m3_e2m1_values), exactly.
 * Included by linear.c and formats.c only. */
#ifndef M3_CPU_FORMATS_H
#define M3_CPU_FORMATS_H

#include <immintrin.h>
#include <stdint.h>

#include "cpu.h"

/* E8M0 and E4M3 code -> f32 (filled at load, formats.c) */
extern float m3_cpu_tab_e8m0[256], m3_cpu_tab_e4m3[256];
/* E8M0 x 256, for E4M3 codes read as F16 (value / 256). Above 246 the product would
 * overflow: those groups multiply by 256 first. */
extern float m3_cpu_tab_e8m0_x256[256];
#define E8M0_X256_MAX 246

/* row n of W, columns [k0, k0 + len), as f32 (any format; the portable reference) */
void m3_cpu_decode_row(const m3_linear *W, int n, int k0, int len, float *out);

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE inline __attribute__((always_inline))

/* 32 E4M3 bytes -> 32 floats equal to value / 256, exactly: each byte goes to the high byte
 * of a 16-bit lane (sign at bit 15, magnitude at 8..14); an arithmetic shift right by one
 * puts the magnitude at 7..13, where an F16 keeps exponent and mantissa (F16 reads it as
 * value / 256, subnormals included), and the mask clears the copied sign bit. Columns come
 * out in natural order: out[q] = columns 8q..8q+7. */
AVX2 static INLINE void e4m3x32(const uint8_t *p, __m256 *out) {
    const __m256i z = _mm256_setzero_si256(), m = _mm256_set1_epi16((short)0xBFFF);
    __m256i b = _mm256_loadu_si256((const __m256i *)p);
    __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, b), 1), m); /* bytes 0-7 | 16-23 */
    __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, b), 1), m); /* bytes 8-15 | 24-31 */
    out[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));
    out[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(hi));
    out[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1));
    out[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1));
}

/* NVFP4, 32 columns from 16 packed bytes: codes -> bf16 bits through two byte lookups ->
 * f32 by placing them in the upper half. Columns come out in NVFP4_PERM order (linear.c: x is
 * permuted to match once per call): lane 0 of the codes holds the low nibbles (even
 * columns), lane 1 the high ones. out[0..1] are columns 0..15 (first scale group),
 * out[2..3] columns 16..31. Values are E2M1, unscaled. */
/* bf16 bits of the 16 E2M1 values {0, .5, 1, 1.5, 2, 3, 4, 6, -0, ..., -6}: low and high
 * bytes, twice (one copy per 128-bit lane, as the byte shuffle looks up within a lane) */
static const uint8_t NVFP4_BF16_LO[32] __attribute__((unused)) = {0, 0, 0x80, 0xC0, 0, 0x40, 0x80, 0xC0, 0, 0, 0x80, 0xC0, 0, 0x40, 0x80, 0xC0,
                                          0, 0, 0x80, 0xC0, 0, 0x40, 0x80, 0xC0, 0, 0, 0x80, 0xC0, 0, 0x40, 0x80, 0xC0};
static const uint8_t NVFP4_BF16_HI[32] __attribute__((unused)) = {0,    0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x80, 0xBF, 0xBF,
                                          0xBF, 0xC0, 0xC0, 0xC0, 0xC0, 0,    0x3F, 0x3F, 0x3F, 0x40, 0x40,
                                          0x40, 0x40, 0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0};

AVX2 static INLINE void nvfp4x32(const uint8_t *p, __m256 *out) {
    const __m256i lut_lo = _mm256_loadu_si256((const __m256i *)NVFP4_BF16_LO);
    const __m256i lut_hi = _mm256_loadu_si256((const __m256i *)NVFP4_BF16_HI);
    const __m256i z = _mm256_setzero_si256();
    __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    __m256i c = _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
    __m256i L = _mm256_shuffle_epi8(lut_lo, c), H = _mm256_shuffle_epi8(lut_hi, c);
    __m256i wa = _mm256_unpacklo_epi8(L, H), wb = _mm256_unpackhi_epi8(L, H);
    out[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, wa));
    out[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, wa));
    out[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, wb));
    out[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, wb));
}

/* NVFP4, 64 columns from 32 packed bytes (two 32-column blocks A, B in the two lanes).
 * Each output vector holds 4 columns of A (lane 0) and 4 of B (lane 1) from matching scale
 * groups: out[0..3] are columns 0..15 of A and of B (scales sA0 | sB0), out[4..7] columns
 * 16..31 of A and B (sA1 | sB1). NVFP4_PERM64 (linear.c) lists the columns in output order. */

AVX2 static INLINE void nvfp4x64(const uint8_t *p, __m256 *out) {
    const __m256i lut_lo = _mm256_loadu_si256((const __m256i *)NVFP4_BF16_LO);
    const __m256i lut_hi = _mm256_loadu_si256((const __m256i *)NVFP4_BF16_HI);
    const __m256i z = _mm256_setzero_si256(), m4 = _mm256_set1_epi8(0x0f);
    __m256i b = _mm256_loadu_si256((const __m256i *)p);
    __m256i ce = _mm256_and_si256(b, m4), co = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4); /* even, odd columns */
    __m256i Le = _mm256_shuffle_epi8(lut_lo, ce), He = _mm256_shuffle_epi8(lut_hi, ce);
    __m256i Lo = _mm256_shuffle_epi8(lut_lo, co), Ho = _mm256_shuffle_epi8(lut_hi, co);
    __m256i ea = _mm256_unpacklo_epi8(Le, He), eb = _mm256_unpackhi_epi8(Le, He);
    __m256i oa = _mm256_unpacklo_epi8(Lo, Ho), ob = _mm256_unpackhi_epi8(Lo, Ho);
    out[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, ea));
    out[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, ea));
    out[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, oa));
    out[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, oa));
    out[4] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, eb));
    out[5] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, eb));
    out[6] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, ob));
    out[7] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, ob));
}

#endif
