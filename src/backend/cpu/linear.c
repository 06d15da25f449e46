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

/* 32 E4M3 bytes -> 32 floats equal to value / 256, exactly: each byte goes to the high byte
 * of a 16-bit lane (sign at bit 15, magnitude at 8..14); an arithmetic shift right by one
 * puts the magnitude at 7..13, where an F16 keeps exponent and mantissa (F16 reads it as
 * value / 256, subnormals included), and the mask clears the copied sign bit. One multiply
 * by (scale x 256) then rounds nothing. */
AVX2 static inline void e4m3x32_as_f32_div256(const uint8_t *p, __m256 *out) {
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
 * f32 by placing them in the upper half. The columns come out in NVFP4_PERM order (x is
 * permuted to match once per call, see m3_cpu_linear): lane 0 of the codes holds the low
 * nibbles (even columns), lane 1 the high nibbles (odd columns). out[0..1] are columns
 * 0..15 (first scale group), out[2..3] columns 16..31. Values are E2M1, unscaled. */
static const uint8_t NVFP4_PERM[32] = {0,  2,  4,  6,  1,  3,  5,  7,  8,  10, 12, 14, 9,  11, 13, 15,
                                       16, 18, 20, 22, 17, 19, 21, 23, 24, 26, 28, 30, 25, 27, 29, 31};

AVX2 static inline void nvfp4x32_perm(const uint8_t *p, __m256 *out) {
    const __m256i lut_lo = _mm256_setr_epi8(0, 0, (char)0x80, (char)0xC0, 0, 0x40, (char)0x80, (char)0xC0, 0, 0, (char)0x80,
                                            (char)0xC0, 0, 0x40, (char)0x80, (char)0xC0, 0, 0, (char)0x80, (char)0xC0, 0, 0x40,
                                            (char)0x80, (char)0xC0, 0, 0, (char)0x80, (char)0xC0, 0, 0x40, (char)0x80, (char)0xC0);
    const __m256i lut_hi = _mm256_setr_epi8(0, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, (char)0x80, (char)0xBF, (char)0xBF,
                                            (char)0xBF, (char)0xC0, (char)0xC0, (char)0xC0, (char)0xC0, 0, 0x3F, 0x3F, 0x3F, 0x40,
                                            0x40, 0x40, 0x40, (char)0x80, (char)0xBF, (char)0xBF, (char)0xBF, (char)0xC0,
                                            (char)0xC0, (char)0xC0, (char)0xC0);
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
            uint8_t e = sc[k / 32];
            __m256 s = _mm256_set1_ps(tab_e8m0_x256[e]), w[4];
            e4m3x32_as_f32_div256(row + k, w);
            for (int q = 0; q < 4; q++) {
                if (e > E8M0_X256_MAX) w[q] = _mm256_mul_ps(w[q], _mm256_set1_ps(256.0f));
                _mm256_storeu_ps(out + i + 8 * q, _mm256_mul_ps(w[q], s));
            }
        }
        return;
    }
    case M3_WF_NVFP4: { /* columns in NVFP4_PERM order within each 32 */
        const uint8_t *sc = W->scale + (size_t)n * W->scale_row;
        for (int i = 0; i < len; i += 32) {
            int k = k0 + i;
            __m256 v[4];
            nvfp4x32_perm(row + k / 2, v);
            __m256 s0 = _mm256_set1_ps(tab_e4m3[sc[k / 16]] * W->gmul), s1 = _mm256_set1_ps(tab_e4m3[sc[k / 16 + 1]] * W->gmul);
            _mm256_storeu_ps(out + i, _mm256_mul_ps(v[0], s0));
            _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(v[1], s0));
            _mm256_storeu_ps(out + i + 16, _mm256_mul_ps(v[2], s1));
            _mm256_storeu_ps(out + i + 24, _mm256_mul_ps(v[3], s1));
        }
        return;
    }
    default: memset(out, 0, (size_t)len * 4);
    }
}

/* The summation order every path follows (so a token's result never depends on the path
 * or on the other tokens of the step): within each chunk of KC columns, four 8-lane
 * accumulators take the 8-column groups in turn (group g -> accumulator g % 4), in column
 * order; at the chunk's end hsum((A0 + A1) + (A2 + A3)) is added to the row's sum. Four
 * independent chains also keep the FMA latency off the critical path. */
AVX2 static inline float chunk_sum(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    return hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

/* acc0[r] (+ acc1[r]) += dot(w[r][0:len], x0 (x1)) over one chunk, for r < nr; len % 8 == 0 */
AVX2 static void micro_avx2(const float *w, int nr, const float *x0, const float *x1, int len, float *acc0, float *acc1) {
    for (int r = 0; r < nr; r++) {
        const float *wr = w + (size_t)r * KC;
        __m256 a[2][4];
        for (int j = 0; j < 4; j++) a[0][j] = a[1][j] = _mm256_setzero_ps();
        int k = 0;
        if (x1) {
            for (; k + 32 <= len; k += 32)
                for (int j = 0; j < 4; j++) {
                    __m256 v = _mm256_loadu_ps(wr + k + 8 * j);
                    a[0][j] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x0 + k + 8 * j), a[0][j]);
                    a[1][j] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x1 + k + 8 * j), a[1][j]);
                }
            for (int j = 0; k < len; k += 8, j++) {
                __m256 v = _mm256_loadu_ps(wr + k);
                a[0][j] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x0 + k), a[0][j]);
                a[1][j] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x1 + k), a[1][j]);
            }
            acc1[r] += chunk_sum(a[1][0], a[1][1], a[1][2], a[1][3]);
        } else {
            for (; k + 32 <= len; k += 32)
                for (int j = 0; j < 4; j++)
                    a[0][j] = _mm256_fmadd_ps(_mm256_loadu_ps(wr + k + 8 * j), _mm256_loadu_ps(x0 + k + 8 * j), a[0][j]);
            for (int j = 0; k < len; k += 8, j++)
                a[0][j] = _mm256_fmadd_ps(_mm256_loadu_ps(wr + k), _mm256_loadu_ps(x0 + k), a[0][j]);
        }
        acc0[r] += chunk_sum(a[0][0], a[0][1], a[0][2], a[0][3]);
    }
}

/* Small T (decode): one pass over each row, decoding in registers, one or two tokens at a
 * time; the same decoded values and summation order as the tiled path. */
#define FUSED_MAX_T 4
#ifndef PF_DIST
#define PF_DIST 1024 /* bytes ahead of the weight stream to prefetch */
#endif

#define FMA_J(w, k, j)                                                                            \
    do {                                                                                          \
        __m256 w_ = (w);                                                                          \
        a[0][j] = _mm256_fmadd_ps(w_, _mm256_loadu_ps(x0 + (k)), a[0][j]);                       \
        if (nt == 2) a[1][j] = _mm256_fmadd_ps(w_, _mm256_loadu_ps(x1 + (k)), a[1][j]);           \
    } while (0)

AVX2 static inline __m256 ld8_plain(const m3_linear *W, const uint8_t *row, int k) {
    if (W->fmt == M3_WF_F32) return _mm256_loadu_ps((const float *)row + k);
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k));
    if (W->fmt == M3_WF_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* always inlined with a constant nt, so the accumulators stay in registers */
AVX2 static inline __attribute__((always_inline)) void fused_row_impl(const m3_linear *W, int n, const float *x0,
                                                                     const float *x1, int nt, float *out) {
    const int K = W->K;
    const uint8_t *row = W->w + (size_t)n * W->row_bytes;
    const uint8_t *sc = W->scale ? W->scale + (size_t)n * W->scale_row : NULL;
    float acc0 = 0, acc1 = 0;
    for (int k0 = 0; k0 < K; k0 += KC) {
        int end = K - k0 < KC ? K : k0 + KC;
        __m256 a[2][4];
        for (int j = 0; j < 4; j++) a[0][j] = a[1][j] = _mm256_setzero_ps();
        int k = k0;
        switch (W->fmt) {
        case M3_WF_F32:
        case M3_WF_BF16:
        case M3_WF_F16:
            for (; k + 32 <= end; k += 32) {
                _mm_prefetch((const char *)row + 2 * (size_t)k + PF_DIST, _MM_HINT_T0);
                FMA_J(ld8_plain(W, row, k), k, 0);
                FMA_J(ld8_plain(W, row, k + 8), k + 8, 1);
                FMA_J(ld8_plain(W, row, k + 16), k + 16, 2);
                FMA_J(ld8_plain(W, row, k + 24), k + 24, 3);
            }
            if (k < end) FMA_J(ld8_plain(W, row, k), k, 0);
            if (k + 8 < end) FMA_J(ld8_plain(W, row, k + 8), k + 8, 1);
            if (k + 16 < end) FMA_J(ld8_plain(W, row, k + 16), k + 16, 2);
            break;
        case M3_WF_MXFP8:
            for (; k < end; k += 32) {
                _mm_prefetch((const char *)row + k + PF_DIST, _MM_HINT_T0);
                uint8_t e = sc[k / 32];
                __m256 s = _mm256_set1_ps(tab_e8m0_x256[e]);
                __m256 w[4];
                e4m3x32_as_f32_div256(row + k, w);
                if (__builtin_expect(e > E8M0_X256_MAX, 0))
                    for (int q = 0; q < 4; q++) w[q] = _mm256_mul_ps(w[q], _mm256_set1_ps(256.0f));
                FMA_J(_mm256_mul_ps(w[0], s), k, 0);
                FMA_J(_mm256_mul_ps(w[1], s), k + 8, 1);
                FMA_J(_mm256_mul_ps(w[2], s), k + 16, 2);
                FMA_J(_mm256_mul_ps(w[3], s), k + 24, 3);
            }
            break;
        case M3_WF_NVFP4: /* x is in NVFP4_PERM order */
            for (; k < end; k += 32) {
                if ((k & 63) == 0) _mm_prefetch((const char *)row + k / 2 + PF_DIST, _MM_HINT_T0);
                __m256 v[4];
                nvfp4x32_perm(row + k / 2, v);
                __m256 s0 = _mm256_set1_ps(tab_e4m3[sc[k / 16]] * W->gmul), s1 = _mm256_set1_ps(tab_e4m3[sc[k / 16 + 1]] * W->gmul);
                FMA_J(_mm256_mul_ps(v[0], s0), k, 0);
                FMA_J(_mm256_mul_ps(v[1], s0), k + 8, 1);
                FMA_J(_mm256_mul_ps(v[2], s1), k + 16, 2);
                FMA_J(_mm256_mul_ps(v[3], s1), k + 24, 3);
            }
            break;
        default: break;
        }
        acc0 += chunk_sum(a[0][0], a[0][1], a[0][2], a[0][3]);
        if (nt == 2) acc1 += chunk_sum(a[1][0], a[1][1], a[1][2], a[1][3]);
    }
    out[0] = acc0;
    if (nt == 2) out[1] = acc1;
}
#undef FMA_J

/* out[t] = dot(row n, x[t]) for t < nt (<= FUSED_MAX_T), tokens taken in pairs */
AVX2 static void fused_row_avx2(const m3_linear *W, int n, const float *const *x, int nt, float *out) {
    int t = 0;
    for (; t + 2 <= nt; t += 2) fused_row_impl(W, n, x[t], x[t + 1], 2, out + t);
    if (t < nt) fused_row_impl(W, n, x[t], NULL, 1, out + t);
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
    int avx = avx_ok(W, len) && W->fmt != M3_WF_NVFP4; /* the AVX2 NVFP4 decoder permutes columns */
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
    int avx = have_avx2(), whole_avx = fused_ok(W);
    if (T <= FUSED_MAX_T && whole_avx) {
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
                    /* NVFP4's AVX2 decoder permutes columns: only when x was permuted too */
                    if (avx_ok(W, len) && (W->fmt != M3_WF_NVFP4 || whole_avx))
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
    float *xp = NULL;
    if (W->fmt == M3_WF_NVFP4 && fused_ok(W)) {
        /* the AVX2 NVFP4 decoders yield columns in NVFP4_PERM order: permute x to match */
        const int K = W->K;
        xp = malloc(sizeof(float) * (size_t)T * K);
        if (!xp) { memset(y, 0, sizeof(float) * (size_t)T * W->N); return; }
        for (size_t t = 0; t < (size_t)T; t++)
            for (int g = 0; g < K; g += 32)
                for (int i = 0; i < 32; i++) xp[t * K + g + i] = x[t * K + g + NVFP4_PERM[i]];
        x = xp;
    }
    lin_job j = {W, x, T, y};
    size_t tiles = ((size_t)W->N + R - 1) / R;
    /* small tasks keep both cores busy at T = 1; at least ~64 KB of weights per task */
    size_t per_tile = m3_linear_bytes(W) / (tiles ? tiles : 1);
    size_t grain = per_tile ? (65536 / per_tile) + 1 : 1;
    m3_pool_for(c->pool, tiles, grain, lin_tiles, &j);
    free(xp);
}
