/* Small vector helpers for attention and the indexer: dot products, axpy, exp.
 * AVX2 where present, portable C otherwise. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../base/simd.h"
#include "cpu.h"

#define AVX2 M3_AVX2

AVX2 static float dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    if (i + 8 <= n) { s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0); i += 8; }
    float s = m3_hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* 8 values of a stored row: f32, or bf16 widened in registers */
AVX2 static inline __m256 ld8(const void *row, int bf16, int j) {
    if (!bf16) return _mm256_loadu_ps((const float *)row + j);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + j));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float ld1(const void *row, int bf16, size_t j) {
    if (!bf16) return ((const float *)row)[j];
    uint32_t u = (uint32_t)((const uint16_t *)row)[j] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* four keys at a time: q is loaded once per 8 columns, the four sums reduced together */
AVX2 static void dots_avx2(const float *q, const void *k, int bf16, int n, int d, float *out) {
    const size_t es = bf16 ? 2 : 4;
    const char *kb = k;
    int i = 0;
    if (d % 8 == 0) {
        for (; i + 4 <= n; i += 4) {
            const char *k0 = kb + (size_t)i * d * es, *k1 = k0 + d * es, *k2 = k1 + d * es, *k3 = k2 + d * es;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int j = 0; j < d; j += 8) {
                __m256 qv = _mm256_loadu_ps(q + j);
                a0 = _mm256_fmadd_ps(qv, ld8(k0, bf16, j), a0);
                a1 = _mm256_fmadd_ps(qv, ld8(k1, bf16, j), a1);
                a2 = _mm256_fmadd_ps(qv, ld8(k2, bf16, j), a2);
                a3 = _mm256_fmadd_ps(qv, ld8(k3, bf16, j), a3);
            }
            __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            _mm_storeu_ps(out + i, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
        }
    }
    for (; i < n; i++) {
        const char *ki = kb + (size_t)i * d * es;
        __m256 a = _mm256_setzero_ps();
        int j = 0;
        for (; j + 8 <= d; j += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), ld8(ki, bf16, j), a);
        float s = m3_hsum8(a);
        for (; j < d; j++) s += q[j] * ld1(ki, bf16, (size_t)j);
        out[i] = s;
    }
}

AVX2 static void axpy_avx2(float *y, float a, const float *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* acc[c] += sum_i p[i] * v[i][c]: the accumulator stays in registers for 32 columns at a
 * time while the rows (f32 or bf16) stream past */
AVX2 static void pv_avx2(float *acc, const float *p, const void *v, int bf16, int n, int d) {
    const size_t rs = (size_t)d * (bf16 ? 2 : 4);
    const char *vb = v;
    int c = 0;
    for (; c + 32 <= d; c += 32) {
        __m256 a0 = _mm256_loadu_ps(acc + c), a1 = _mm256_loadu_ps(acc + c + 8);
        __m256 a2 = _mm256_loadu_ps(acc + c + 16), a3 = _mm256_loadu_ps(acc + c + 24);
        for (int i = 0; i < n; i++) {
            const char *vi = vb + i * rs;
            __m256 pi = _mm256_set1_ps(p[i]);
            a0 = _mm256_fmadd_ps(pi, ld8(vi, bf16, c), a0);
            a1 = _mm256_fmadd_ps(pi, ld8(vi, bf16, c + 8), a1);
            a2 = _mm256_fmadd_ps(pi, ld8(vi, bf16, c + 16), a2);
            a3 = _mm256_fmadd_ps(pi, ld8(vi, bf16, c + 24), a3);
        }
        _mm256_storeu_ps(acc + c, a0);
        _mm256_storeu_ps(acc + c + 8, a1);
        _mm256_storeu_ps(acc + c + 16, a2);
        _mm256_storeu_ps(acc + c + 24, a3);
    }
    for (; c + 8 <= d; c += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + c);
        for (int i = 0; i < n; i++) a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[i]), ld8(vb + i * rs, bf16, c), a0);
        _mm256_storeu_ps(acc + c, a0);
    }
    for (; c < d; c++)
        for (int i = 0; i < n; i++) acc[c] += p[i] * ld1(vb + i * rs, bf16, (size_t)c);
}

AVX2 static float exp_shift_avx2(float *x, int n, float m) {
    __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = m3_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = m3_hsum8(acc);
    if (i < n) { /* tail through the same polynomial */
        float t[8] = {0};
        for (int j = i; j < n; j++) t[j - i] = x[j] - m;
        for (int j = n - i; j < 8; j++) t[j] = -INFINITY;
        __m256 e = m3_exp8(_mm256_loadu_ps(t));
        _mm256_storeu_ps(t, e);
        for (int j = i; j < n; j++) { x[j] = t[j - i]; s += t[j - i]; }
    }
    return s;
}

float m3_cpu_dot(const float *a, const float *b, int n) {
    if (m3_have_avx2()) return dot_avx2(a, b, n);
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void m3_cpu_dots(const float *q, const void *k, int bf16, int n, int d, float *out) {
    if (m3_have_avx2()) { dots_avx2(q, k, bf16, n, d, out); return; }
    const size_t es = bf16 ? 2 : 4;
    for (int i = 0; i < n; i++) {
        float s = 0;
        for (int j = 0; j < d; j++) s += q[j] * ld1((const char *)k + (size_t)i * d * es, bf16, (size_t)j);
        out[i] = s;
    }
}

void m3_cpu_axpy(float *y, float a, const float *x, int n) {
    if (m3_have_avx2()) { axpy_avx2(y, a, x, n); return; }
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

float m3_cpu_exp_shift(float *x, int n, float m) {
    if (m3_have_avx2()) return exp_shift_avx2(x, n, m);
    float s = 0;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - m); s += x[i]; }
    return s;
}

void m3_cpu_pv(float *acc, const float *p, const void *v, int bf16, int n, int d) {
    if (m3_have_avx2()) { pv_avx2(acc, p, v, bf16, n, d); return; }
    const size_t rs = (size_t)d * (bf16 ? 2 : 4);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < d; c++) acc[c] += p[i] * ld1((const char *)v + i * rs, bf16, (size_t)c);
}
