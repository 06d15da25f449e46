/* y = x W^T for every weight format, dequantizing W on the fly.
 *
 * Work is split over row tiles of W. For each tile and a block of tokens, a chunk of
 * KC columns of R rows is decoded to f32 in L1 (once per token block), then a register-
 * blocked micro-kernel multiplies it with those tokens. At T = 1 this reads every weight
 * byte exactly once; at large T, decoding is amortized over TB tokens. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/num.h"
#include "cpu.h"

#define R 4      /* rows per tile */
#define KC 256   /* columns per decoded chunk (multiple of 32) */
#define TB 32    /* tokens per block */

static int simd_level = -1; /* 0 scalar, 1 avx2 */

/* scale decoders as tables: E8M0 (MXFP8) and E4M3 (NVFP4 block scales) */
static float tab_e8m0[256], tab_e4m3[256];
/* E8M0 x 256, used with E4M3 codes read as F16 (value / 256): the product is the exact
 * weight. Above 246 the table would overflow; those groups take the two-step multiply. */
static float tab_e8m0_x256[256];
#define E8M0_X256_MAX 246

__attribute__((constructor)) static void init_tables(void) {
    for (int i = 0; i < 256; i++) {
        tab_e8m0[i] = m3_e8m0_to_f32((uint8_t)i);
        tab_e4m3[i] = m3_e4m3_to_f32((uint8_t)i);
        tab_e8m0_x256[i] = i <= E8M0_X256_MAX ? tab_e8m0[i] * 256.0f : tab_e8m0[i];
    }
}

static int have_avx2(void) {
    if (simd_level < 0) {
        const char *e = getenv("M3_SIMD");
        __builtin_cpu_init();
        simd_level = (e && strcmp(e, "scalar") == 0) ? 0
                     : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) ? 1 : 0;
    }
    return simd_level;
}

const char *m3_cpu_simd_name(void) { return have_avx2() ? "avx2" : "scalar"; }

/* ------------------------------------------------------------------ scalar reference */

static void decode_scalar(const m3_linear *W, int n, int k0, int len, float *out) {
    const uint8_t *row = W->w + (size_t)n * W->row_bytes;
    switch (W->fmt) {
    case M3_WF_F32: memcpy(out, row + (size_t)k0 * 4, (size_t)len * 4); break;
    case M3_WF_BF16:
        for (int i = 0; i < len; i++) { uint16_t h; memcpy(&h, row + 2 * (size_t)(k0 + i), 2); out[i] = m3_bf16_to_f32(h); }
        break;
    case M3_WF_F16:
        for (int i = 0; i < len; i++) { uint16_t h; memcpy(&h, row + 2 * (size_t)(k0 + i), 2); out[i] = m3_f16_to_f32(h); }
        break;
    case M3_WF_MXFP8: {
        const uint8_t *sc = W->scale + (size_t)n * W->scale_row;
        for (int i = 0; i < len; i++) {
            int k = k0 + i;
            out[i] = m3_e4m3_to_f32(row[k]) * m3_e8m0_to_f32(sc[k / 32]);
        }
        break;
    }
    case M3_WF_NVFP4: {
        const uint8_t *sc = W->scale + (size_t)n * W->scale_row;
        for (int i = 0; i < len; i++) {
            int k = k0 + i;
            uint8_t b = row[k / 2];
            uint8_t code = (k & 1) ? (b >> 4) : (b & 15);
            out[i] = m3_e2m1_values[code] * (m3_e4m3_to_f32(sc[k / 16]) * W->gmul);
        }
        break;
    }
    default: memset(out, 0, (size_t)len * 4);
    }
}

/* ------------------------------------------------------------------ AVX2 */

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 E4M3 bytes -> 16 floats times a group scale, exactly: the E4M3 bits placed into an F16
 * give value / 256, so one multiply by (scale x 256) rounds nothing (pre = 256 then). For
 * scales whose x256 would overflow, pre = 256 and s256 = scale: two exact multiplies. */
AVX2 static inline __m256i e4m3_as_f16x16(const uint8_t *p) {
    __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
                           _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
}

AVX2 static inline void e4m3x16(const uint8_t *p, uint8_t e, float *out) {
    __m256i h = e4m3_as_f16x16(p);
    __m256 s = _mm256_set1_ps(tab_e8m0_x256[e]);
    __m256 a = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), b = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    if (e > E8M0_X256_MAX) {
        a = _mm256_mul_ps(a, _mm256_set1_ps(256.0f));
        b = _mm256_mul_ps(b, _mm256_set1_ps(256.0f));
    }
    _mm256_storeu_ps(out, _mm256_mul_ps(a, s));
    _mm256_storeu_ps(out + 8, _mm256_mul_ps(b, s));
}

AVX2 static void decode_avx2(const m3_linear *W, int n, int k0, int len, float *out) {
    const uint8_t *row = W->w + (size_t)n * W->row_bytes;
    switch (W->fmt) {
    case M3_WF_F32: memcpy(out, row + (size_t)k0 * 4, (size_t)len * 4); return;
    case M3_WF_BF16:
        for (int i = 0; i < len; i += 8) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)(k0 + i))));
            _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        return;
    case M3_WF_F16:
        for (int i = 0; i < len; i += 8)
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)(k0 + i)))));
        return;
    case M3_WF_MXFP8: {
        const uint8_t *sc = W->scale + (size_t)n * W->scale_row;
        for (int i = 0; i < len; i += 32) {
            int k = k0 + i;
            e4m3x16(row + k, sc[k / 32], out + i);
            e4m3x16(row + k + 16, sc[k / 32], out + i + 16);
        }
        return;
    }
    case M3_WF_NVFP4: {
        const uint8_t *sc = W->scale + (size_t)n * W->scale_row;
        /* 2 * E2M1 as int8 for codes 0..15 */
        const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
        const __m128i m4 = _mm_set1_epi8(0x0f);
        for (int i = 0; i < len; i += 32) {
            int k = k0 + i;
            __m128i b = _mm_loadu_si128((const __m128i *)(row + k / 2));
            __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, m4));
            __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
            __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
            __m256 s0 = _mm256_set1_ps(tab_e4m3[sc[k / 16]] * W->gmul * 0.5f);
            __m256 s1 = _mm256_set1_ps(tab_e4m3[sc[k / 16 + 1]] * W->gmul * 0.5f);
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0)), s0));
            _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8))), s0));
            _mm256_storeu_ps(out + i + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1)), s1));
            _mm256_storeu_ps(out + i + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8))), s1));
        }
        return;
    }
    default: memset(out, 0, (size_t)len * 4);
    }
}

/* acc[r][t] += dot(w[r][0:len], x[t][0:len]) for r < nr (<= R), t < nt (<= 2) */
AVX2 static void micro_avx2(const float *w, int nr, const float *x0, const float *x1, int len, float *acc0, float *acc1) {
    __m256 a00 = _mm256_setzero_ps(), a10 = a00, a20 = a00, a30 = a00;
    __m256 a01 = a00, a11 = a00, a21 = a00, a31 = a00;
    const float *w0 = w, *w1 = w + KC, *w2 = w + 2 * KC, *w3 = w + 3 * KC;
    if (x1) {
        for (int k = 0; k < len; k += 8) {
            __m256 xa = _mm256_loadu_ps(x0 + k), xb = _mm256_loadu_ps(x1 + k);
            __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
            __m256 v2 = _mm256_loadu_ps(w2 + k), v3 = _mm256_loadu_ps(w3 + k);
            a00 = _mm256_fmadd_ps(v0, xa, a00); a01 = _mm256_fmadd_ps(v0, xb, a01);
            a10 = _mm256_fmadd_ps(v1, xa, a10); a11 = _mm256_fmadd_ps(v1, xb, a11);
            a20 = _mm256_fmadd_ps(v2, xa, a20); a21 = _mm256_fmadd_ps(v2, xb, a21);
            a30 = _mm256_fmadd_ps(v3, xa, a30); a31 = _mm256_fmadd_ps(v3, xb, a31);
        }
    } else {
        for (int k = 0; k < len; k += 8) {
            __m256 xa = _mm256_loadu_ps(x0 + k);
            a00 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xa, a00);
            a10 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), xa, a10);
            a20 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), xa, a20);
            a30 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), xa, a30);
        }
    }
    __m256 r0[4] = {a00, a10, a20, a30}, r1[4] = {a01, a11, a21, a31};
    for (int r = 0; r < nr; r++) {
        acc0[r] += hsum256(r0[r]);
        if (x1) acc1[r] += hsum256(r1[r]);
    }
}

/* Small T (decode): one pass over each row, decoding in registers and multiplying with up
 * to 4 tokens. The sums are formed exactly as the tiled path forms them (the same decoded
 * values, one 8-lane accumulator per chunk of KC, reduced in the same order), so a token's
 * result does not depend on how many tokens share the step. */
#define FUSED_MAX_T 4

AVX2 static inline __attribute__((always_inline)) void fma_t(__m256 w, const float *const *x, int k, int nt, __m256 *a) {
    for (int t = 0; t < nt; t++) a[t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[t] + k), a[t]);
}

/* always inlined with a constant nt, so the accumulators stay in registers */
AVX2 static inline __attribute__((always_inline)) void fused_row_impl(const m3_linear *W, int n, const float *const *x, int nt, float *out) {
    const int K = W->K;
    const uint8_t *row = W->w + (size_t)n * W->row_bytes;
    const uint8_t *sc = W->scale ? W->scale + (size_t)n * W->scale_row : NULL;
    float acc[FUSED_MAX_T] = {0};
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), m4 = _mm_set1_epi8(0x0f);
    for (int k0 = 0; k0 < K; k0 += KC) {
        int len = K - k0 < KC ? K - k0 : KC;
        __m256 a[FUSED_MAX_T];
        for (int t = 0; t < nt; t++) a[t] = _mm256_setzero_ps();
        switch (W->fmt) {
        case M3_WF_F32:
            for (int k = k0; k < k0 + len; k += 8) fma_t(_mm256_loadu_ps((const float *)row + k), x, k, nt, a);
            break;
        case M3_WF_BF16:
            for (int k = k0; k < k0 + len; k += 8) {
                __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k)));
                fma_t(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), x, k, nt, a);
            }
            break;
        case M3_WF_F16:
            for (int k = k0; k < k0 + len; k += 8)
                fma_t(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k))), x, k, nt, a);
            break;
        case M3_WF_MXFP8:
            for (int k = k0; k < k0 + len; k += 32) {
                uint8_t e = sc[k / 32];
                __m256 s = _mm256_set1_ps(tab_e8m0_x256[e]);
                __m256 pre = _mm256_set1_ps(e > E8M0_X256_MAX ? 256.0f : 1.0f);
                for (int h = 0; h < 32; h += 16) {
                    __m256i f = e4m3_as_f16x16(row + k + h);
                    __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(f)), hi = _mm256_cvtph_ps(_mm256_extracti128_si256(f, 1));
                    if (e > E8M0_X256_MAX) { lo = _mm256_mul_ps(lo, pre); hi = _mm256_mul_ps(hi, pre); }
                    fma_t(_mm256_mul_ps(lo, s), x, k + h, nt, a);
                    fma_t(_mm256_mul_ps(hi, s), x, k + h + 8, nt, a);
                }
            }
            break;
        case M3_WF_NVFP4:
            for (int k = k0; k < k0 + len; k += 32) {
                __m128i b = _mm_loadu_si128((const __m128i *)(row + k / 2));
                __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, m4));
                __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
                __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
                __m256 s0 = _mm256_set1_ps(tab_e4m3[sc[k / 16]] * W->gmul * 0.5f);
                __m256 s1 = _mm256_set1_ps(tab_e4m3[sc[k / 16 + 1]] * W->gmul * 0.5f);
                fma_t(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0)), s0), x, k, nt, a);
                fma_t(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8))), s0), x, k + 8, nt, a);
                fma_t(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1)), s1), x, k + 16, nt, a);
                fma_t(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8))), s1), x, k + 24, nt, a);
            }
            break;
        default: break;
        }
        for (int t = 0; t < nt; t++) acc[t] += hsum256(a[t]);
    }
    for (int t = 0; t < nt; t++) out[t] = acc[t];
}

AVX2 static void fused_row_avx2(const m3_linear *W, int n, const float *const *x, int nt, float *out) {
    switch (nt) {
    case 1: fused_row_impl(W, n, x, 1, out); break;
    case 2: fused_row_impl(W, n, x, 2, out); break;
    case 3: fused_row_impl(W, n, x, 3, out); break;
    default: fused_row_impl(W, n, x, 4, out); break;
    }
}

AVX2 float m3_cpu_dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

AVX2 static void axpy_avx2(float *y, float a, const float *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* ------------------------------------------------------------------ portable */

static void micro_scalar(const float *w, int nr, const float *x0, const float *x1, int len, float *acc0, float *acc1) {
    for (int r = 0; r < nr; r++) {
        const float *wr = w + (size_t)r * KC;
        float s0 = 0, s1 = 0;
        for (int k = 0; k < len; k++) {
            s0 += wr[k] * x0[k];
            if (x1) s1 += wr[k] * x1[k];
        }
        acc0[r] += s0;
        if (x1) acc1[r] += s1;
    }
}

float m3_cpu_dot(const float *a, const float *b, int n) {
    if (have_avx2()) return m3_cpu_dot_avx2(a, b, n);
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void m3_cpu_axpy(float *y, float a, const float *x, int n) {
    if (have_avx2()) { axpy_avx2(y, a, x, n); return; }
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* the AVX2 decoders work in groups of 32 (quantized) or 8 (bf16/f16) */
static int avx_ok(const m3_linear *W, int len) {
    if (!have_avx2()) return 0;
    if (W->fmt == M3_WF_F32) return 1;
    if (W->fmt == M3_WF_BF16 || W->fmt == M3_WF_F16) return len % 8 == 0;
    return len % 32 == 0;
}

void m3_cpu_decode_rows(const m3_linear *W, int n0, int n1, int k0, int len, float *out) {
    int avx = avx_ok(W, len);
    for (int n = n0; n < n1; n++) {
        if (avx) decode_avx2(W, n, k0, len, out + (size_t)(n - n0) * len);
        else decode_scalar(W, n, k0, len, out + (size_t)(n - n0) * len);
    }
}

/* ------------------------------------------------------------------ driver */

typedef struct {
    const m3_linear *W;
    const float *x;
    int T;
    float *y;
} lin_job;

/* rows the fused path can take: whole chunks decodable by the AVX2 decoders */
static int fused_ok(const m3_linear *W) {
    int K = W->K;
    for (int k0 = 0; k0 < K; k0 += KC) {
        int len = K - k0 < KC ? K - k0 : KC;
        if (!avx_ok(W, len) || len % 8) return 0;
    }
    return 1;
}

static void lin_tiles(void *arg, size_t b, size_t e, int worker) {
    (void)worker;
    lin_job *j = arg;
    const m3_linear *W = j->W;
    const int K = W->K, N = W->N, T = j->T;
    int avx = have_avx2();
    if (T <= FUSED_MAX_T && fused_ok(W)) {
        const float *xs[FUSED_MAX_T];
        float o[FUSED_MAX_T];
        for (int t = 0; t < T; t++) xs[t] = j->x + (size_t)t * K;
        for (size_t tile = b; tile < e; tile++) {
            int n0 = (int)tile * R, n1 = n0 + R < N ? n0 + R : N;
            for (int n = n0; n < n1; n++) {
                fused_row_avx2(W, n, xs, T, o);
                for (int t = 0; t < T; t++) j->y[(size_t)t * N + n] = o[t];
            }
        }
        return;
    }
    float wbuf[R * KC] __attribute__((aligned(32)));
    float acc[TB][R];
    for (int t0 = 0; t0 < T; t0 += TB) {
        int nt = T - t0 < TB ? T - t0 : TB;
        for (size_t tile = b; tile < e; tile++) {
            int n0 = (int)tile * R, nr = N - n0 < R ? N - n0 : R;
            memset(acc, 0, sizeof acc);
            for (int k0 = 0; k0 < K; k0 += KC) {
                int len = K - k0 < KC ? K - k0 : KC;
                for (int r = 0; r < nr; r++) {
                    if (avx_ok(W, len))
                        decode_avx2(W, n0 + r, k0, len, wbuf + r * KC);
                    else
                        decode_scalar(W, n0 + r, k0, len, wbuf + r * KC);
                }
                for (int r = nr; r < R; r++) memset(wbuf + r * KC, 0, sizeof(float) * KC);
                for (int t = 0; t < nt; t += 2) {
                    const float *x0 = j->x + (size_t)(t0 + t) * K + k0;
                    const float *x1 = t + 1 < nt ? x0 + K : NULL;
                    if (avx && len % 8 == 0) micro_avx2(wbuf, nr, x0, x1, len, acc[t], x1 ? acc[t + 1] : NULL);
                    else micro_scalar(wbuf, nr, x0, x1, len, acc[t], x1 ? acc[t + 1] : NULL);
                }
            }
            for (int t = 0; t < nt; t++)
                for (int r = 0; r < nr; r++) j->y[(size_t)(t0 + t) * N + n0 + r] = acc[t][r];
        }
    }
}

void m3_cpu_linear(m3_cpu *c, const m3_linear *W, const float *x, int T, float *y) {
    lin_job j = {W, x, T, y};
    size_t tiles = ((size_t)W->N + R - 1) / R;
    /* small tasks keep both cores busy at T = 1; at least ~64 KB of weights per task */
    size_t per_tile = m3_linear_bytes(W) / (tiles ? tiles : 1);
    size_t grain = per_tile ? (65536 / per_tile) + 1 : 1;
    m3_pool_for(c->pool, tiles, grain, lin_tiles, &j);
}
