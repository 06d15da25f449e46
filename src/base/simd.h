/* The CPU's vector units: which kernel set runs (chosen once: AVX-512, AVX2 + FMA + F16C, or
 * portable C; $M3_SIMD=scalar|avx2 caps it, for tests and comparisons), and the AVX2 building
 * blocks that several modules' kernels share. x86-64 only. */
#ifndef M3_BASE_SIMD_H
#define M3_BASE_SIMD_H

#include <immintrin.h>

/* 0: portable C, 1: AVX2 + FMA + F16C, 2: AVX-512 (F, BW) too */
int m3_simd_level(void);
static inline int m3_have_avx2(void) { return m3_simd_level() >= 1; }

#define M3_AVX2 __attribute__((target("avx2,fma")))

/* the sum of the 8 lanes */
M3_AVX2 static inline float m3_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x <= 0 (softmax terms): range reduction by ln 2 in two parts, the classic
 * degree-6 minimax polynomial for exp on [-ln2/2, ln2/2] (about 1 ulp), 2^n by exponent
 * arithmetic; below -87.3 the result is 0. */
M3_AVX2 static inline __m256 m3_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

#endif
