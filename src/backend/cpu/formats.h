/* The CPU backend's number-format decoders, in one place: E4M3 / E8M0 value tables, the
 * E2M1 -> bf16 byte tables, the scalar decoder of any weight format (formats.c), and the AVX2
 * and AVX-512 decoders of 32 / 64 columns and of NVFP4 block scales that the linear kernels
 * inline (linear.c, linear_tiled.c), with the same tables and the same E4M3-as-F16 trick. The
 * values are src/base/num.h's (m3_e4m3_to_f32, m3_e8m0_to_f32, m3_e2m1_values), exactly (the
 * vector decoders of E4M3 weights read the NaN codes as +-480; the scales' take the table's).
 * Included by linear.c, linear_tiled.c and formats.c only. */
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

/* ---- AVX-512 (linear.c's one- and two-token kernel, linear_tiled.c's many-token kernel) */

#define AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))

/* 16 columns of a plain-format row (F32, BF16 or F16) from column k */
AVX512 static INLINE __m512 ld16_plain(m3_wfmt fmt, const uint8_t *row, int k) {
    if (fmt == M3_WF_F32) return _mm512_loadu_ps((const float *)row + k);
    __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)k));
    if (fmt == M3_WF_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* 32 E4M3 bytes -> value / 256 as two 16-lane vectors, natural order (e4m3x32's F16 trick) */
AVX512 static INLINE void e4m3x32_512(const uint8_t *p, __m512 *v0, __m512 *v1) {
    __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
    __m512i f = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w, 8), 1), _mm512_set1_epi16((short)0xBFFF));
    *v0 = _mm512_cvtph_ps(_mm512_castsi512_si256(f));
    *v1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(f, 1));
}

/* NVFP4, 64 columns from 32 packed bytes, unscaled, in NVFP4_PERM512 order (linear.c):
 * lanes 0-3 of the codes are the low nibbles of bytes 0-15 | 16-31, then the high nibbles;
 * two byte lookups give bf16 pairs. w[0], w[1] are x's columns 0-15 and 16-31 of the block
 * (group pair A, scales sa of nvfp4_scales64_512), w[2], w[3] columns 32-47 and 48-63 (sb).
 * lut_lo / lut_hi: NVFP4_BF16_LO / _HI broadcast to the four 128-bit lanes. */
AVX512 static INLINE void nvfp4x64_512(const uint8_t *p, __m512i lut_lo, __m512i lut_hi, __m512 *w) {
    __m256i b = _mm256_loadu_si256((const __m256i *)p);
    __m256i m4 = _mm256_set1_epi8(0x0f);
    __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, m4)),
                                   _mm256_and_si256(_mm256_srli_epi16(b, 4), m4), 1);
    __m512i L = _mm512_shuffle_epi8(lut_lo, c), H = _mm512_shuffle_epi8(lut_hi, c);
    __m512i wa = _mm512_unpacklo_epi8(L, H), wb = _mm512_unpackhi_epi8(L, H);
    const __m512i hi16 = _mm512_set1_epi32((int)0xFFFF0000u);
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(wa, 16));
    w[1] = _mm512_castsi512_ps(_mm512_and_si512(wa, hi16));
    w[2] = _mm512_castsi512_ps(_mm512_slli_epi32(wb, 16));
    w[3] = _mm512_castsi512_ps(_mm512_and_si512(wb, hi16));
}

/* the per-lane scales of nvfp4x64_512's two group pairs, from the block's 4 row scales s4
 * (S[k / 16 ..], S from nvfp4_scales512) */
AVX512 static INLINE void nvfp4_scales64_512(const float *s4, __m512 *sa, __m512 *sb) {
    __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(s4));
    *sa = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2), v);
    *sb = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3, 3), v);
}

/* E4M3 NaN codes (0x7F, 0xFF) among n scale bytes: the table's value times gmul, as the scalar
 * path gives (the F16 trick reads them as +-480) */
static inline void nvfp4_scales_nan(const uint8_t *sc, int n, float gmul, float *S) {
    for (int i = 0; i < n; i++)
        if ((sc[i] & 0x7f) == 0x7f) S[i] = m3_cpu_tab_e4m3[sc[i]] * gmul;
}

/* 16 NVFP4 block scales as f32 times gmul: S[i] = e4m3(sc[i]) * gmul, rounded once: the F16
 * trick reads value / 256, times 256 is exact, times gmul the one rounding (so equal to the
 * table's e4m3 * gmul for every code and gmul) */
AVX512 static INLINE void nvfp4_scales16_512(const uint8_t *sc, float gmul, float *S) {
    __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sc));
    __m256i f = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1), _mm256_set1_epi16((short)0xBFFF));
    _mm512_storeu_ps(S, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtph_ps(f), _mm512_set1_ps(256.0f)), _mm512_set1_ps(gmul)));
    nvfp4_scales_nan(sc, 16, gmul, S);
}

/* NVFP4 row scales as f32 times gmul: S[i] = e4m3(sc[i]) * gmul for i < n (as nvfp4_scales16_512) */
AVX512 static inline void nvfp4_scales512(const uint8_t *sc, int n, float gmul, float *S) {
    int i = 0;
    const __m512 c = _mm512_set1_ps(256.0f), g = _mm512_set1_ps(gmul);
    for (; i + 32 <= n; i += 32) {
        __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(sc + i)));
        __m512i f = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w, 8), 1), _mm512_set1_epi16((short)0xBFFF));
        _mm512_storeu_ps(S + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(f)), c), g));
        _mm512_storeu_ps(S + i + 16, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(f, 1)), c), g));
    }
    nvfp4_scales_nan(sc, i, gmul, S);
    for (; i < n; i++) S[i] = m3_cpu_tab_e4m3[sc[i]] * gmul;
}

#endif
