/* y = x W^T for every weight format, dequantizing W on the fly.
 *
 * One kernel serves every T: each row of W is read once per block of tokens and decoded in
 * registers, then multiplied with the tokens two at a time (the row stays in L1 between
 * pairs). A token's result is computed the same way whatever else is in the batch, so
 * outputs are bitwise independent of T (batch invariance).
 *
 * Summation order (AVX2), per row and token: columns are split into chunks of KC. Within a
 * chunk, four 8-lane accumulators A0..A3 take the 8-column groups (plain formats) or the
 * scale groups (MXFP8: 32 columns, NVFP4: 16) in turn; a scale group's products are summed
 * first and multiplied by its scale once, with one FMA into its accumulator. At the chunk's
 * end hsum((A0 + A1) + (A2 + A3)) is added to the row's sum. The unscaled values decode
 * exactly (E4M3 via F16 as value / 256; E2M1 via bf16), so only the sums round. */
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/num.h"
#include "../../base/simd.h"
#include "formats.h"
#include "linear_int.h"

#define TB 16     /* tokens per block: a block's activations stay in L2 while rows stream */
#ifndef PF_DIST
#define PF_DIST 1024 /* bytes ahead of the weight stream to prefetch */
#endif

const char *m3_cpu_simd_name(void) { return m3_simd_level() == 2 ? "avx512" : m3_simd_level() == 1 ? "avx2" : "scalar"; }

/* ------------------------------------------------------------------ portable reference */

/* scalar rows: decode a chunk (formats.c), then plain sums */
static void rows_scalar(const m3_linear *W, int n0, int n1, const float *x, int T, float *y) {
    float w[KC];
    for (int n = n0; n < n1; n++)
        for (int t = 0; t < T; t++) y[(size_t)t * W->N + n] = 0;
    for (int n = n0; n < n1; n++)
        for (int k0 = 0; k0 < W->K; k0 += KC) {
            int len = W->K - k0 < KC ? W->K - k0 : KC;
            m3_cpu_decode_row(W, n, k0, len, w);
            for (int t = 0; t < T; t++) {
                const float *xt = x + (size_t)t * W->K + k0;
                float s = 0;
                for (int i = 0; i < len; i++) s += w[i] * xt[i];
                y[(size_t)t * W->N + n] += s;
            }
        }
}

/* ------------------------------------------------------------------ AVX2 */

AVX2 static INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the column orders of nvfp4x32 and nvfp4x64 (formats.h): x is permuted to match */
static const uint8_t NVFP4_PERM[32] = {0,  2,  4,  6,  1,  3,  5,  7,  8,  10, 12, 14, 9,  11, 13, 15,
                                       16, 18, 20, 22, 17, 19, 21, 23, 24, 26, 28, 30, 25, 27, 29, 31};

static const uint8_t NVFP4_PERM64[64] = {
    0,  2,  4,  6,  32, 34, 36, 38, 8,  10, 12, 14, 40, 42, 44, 46, 1,  3,  5,  7,  33, 35, 37, 39, 9,  11, 13, 15, 41, 43, 45, 47,
    16, 18, 20, 22, 48, 50, 52, 54, 24, 26, 28, 30, 56, 58, 60, 62, 17, 19, 21, 23, 49, 51, 53, 55, 25, 27, 29, 31, 57, 59, 61, 63};

/* NVFP4 block scales of one row as f32, times the global multiplier: S[i] = e4m3(sc[i]) * gmul */
AVX2 static void nvfp4_row_scales(const uint8_t *sc, int n, float gmul, float *S) {
    int i = 0;
    const __m256 c = _mm256_set1_ps(256.0f), g = _mm256_set1_ps(gmul);
    for (; i + 32 <= n; i += 32) {
        __m256 v[4];
        e4m3x32(sc + i, v);
        for (int q = 0; q < 4; q++) _mm256_storeu_ps(S + i + 8 * q, _mm256_mul_ps(_mm256_mul_ps(v[q], c), g));
    }
    nvfp4_scales_nan(sc, i, gmul, S);
    for (; i < n; i++) S[i] = m3_cpu_tab_e4m3[sc[i]] * gmul;
}

AVX2 static INLINE __m256 ld8_plain(m3_wfmt fmt, const uint8_t *row, int k) {
    if (fmt == M3_WF_F32) return _mm256_loadu_ps((const float *)row + k);
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k));
    if (fmt == M3_WF_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* Row n against x0 (and x1 when NT == 2); always inlined with a constant NT so the
 * accumulators stay in registers. */
AVX2 static INLINE void row_dot(const m3_linear *W, int n, const float *x0, const float *x1, const int NT, const float *S,
                                float *out) {
    const int K = W->K;
    const m3_wfmt fmt = W->fmt;
    const uint8_t *row = W->w + (size_t)n * W->row_bytes;
    const uint8_t *sc = W->scale ? W->scale + (size_t)n * W->scale_row : NULL;
    float acc0 = 0, acc1 = 0;
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int end = K - k0 < KC ? K : k0 + KC;
        __m256 a0[4], a1[4];
        for (int j = 0; j < 4; j++) a0[j] = a1[j] = _mm256_setzero_ps();
        int k = k0;
/* plain: one FMA per 8 columns into accumulator j */
#define PLAIN(kk, j)                                                                         \
    do {                                                                                     \
        __m256 w_ = ld8_plain(fmt, row, (kk));                                               \
        a0[j] = _mm256_fmadd_ps(w_, _mm256_loadu_ps(x0 + (kk)), a0[j]);                      \
        if (NT == 2) a1[j] = _mm256_fmadd_ps(w_, _mm256_loadu_ps(x1 + (kk)), a1[j]);         \
    } while (0)
/* a scale group of 8 * 2 (or 8 * 4) columns from column kk: products of the unscaled
 * values w0.. summed in column order, times the scale s, one FMA into accumulator j */
#define GSUM(t, x, kk, w0, w1, w2, w3, NV)                                                   \
    do {                                                                                     \
        t = _mm256_mul_ps(w0, _mm256_loadu_ps(x + (kk)));                                     \
        t = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + (kk) + 8), t);                            \
        if ((NV) == 4) {                                                                     \
            t = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + (kk) + 16), t);                       \
            t = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + (kk) + 24), t);                       \
        }                                                                                    \
    } while (0)
#define GROUP(kk, w0, w1, w2, w3, NV, s, j)                                                  \
    do {                                                                                     \
        __m256 t0_, t1_;                                                                     \
        GSUM(t0_, x0, kk, w0, w1, w2, w3, NV);                                               \
        a0[j] = _mm256_fmadd_ps(t0_, (s), a0[j]);                                            \
        if (NT == 2) {                                                                       \
            GSUM(t1_, x1, kk, w0, w1, w2, w3, NV);                                           \
            a1[j] = _mm256_fmadd_ps(t1_, (s), a1[j]);                                        \
        }                                                                                    \
    } while (0)
        switch (fmt) {
        case M3_WF_F32:
        case M3_WF_BF16:
        case M3_WF_F16:
            for (; k + 32 <= end; k += 32) {
                _mm_prefetch((const char *)row + 2 * (size_t)k + PF_DIST, _MM_HINT_T0);
                PLAIN(k, 0); PLAIN(k + 8, 1); PLAIN(k + 16, 2); PLAIN(k + 24, 3);
            }
            if (k < end) PLAIN(k, 0);
            if (k + 8 < end) PLAIN(k + 8, 1);
            if (k + 16 < end) PLAIN(k + 16, 2);
            break;
        case M3_WF_MXFP8: {
/* one 32-column scale group into accumulator j */
#define MX(kk, j)                                                                            \
    do {                                                                                     \
        uint8_t e_ = sc[(kk) / 32];                                                          \
        __m256 v_[4];                                                                        \
        e4m3x32(row + (kk), v_);                                                             \
        if (__builtin_expect(e_ > E8M0_X256_MAX, 0)) {                                       \
            const __m256 c_ = _mm256_set1_ps(256.0f);                                        \
            v_[0] = _mm256_mul_ps(v_[0], c_); v_[1] = _mm256_mul_ps(v_[1], c_);              \
            v_[2] = _mm256_mul_ps(v_[2], c_); v_[3] = _mm256_mul_ps(v_[3], c_);              \
        }                                                                                    \
        GROUP((kk), v_[0], v_[1], v_[2], v_[3], 4, _mm256_set1_ps(m3_cpu_tab_e8m0_x256[e_]), j);    \
    } while (0)
            for (; k + 128 <= end; k += 128) {
                _mm_prefetch((const char *)row + k + PF_DIST, _MM_HINT_T0);
                _mm_prefetch((const char *)row + k + 64 + PF_DIST, _MM_HINT_T0);
                MX(k, 0); MX(k + 32, 1); MX(k + 64, 2); MX(k + 96, 3);
            }
            if (k < end) MX(k, 0);
            if (k + 32 < end) MX(k + 32, 1);
            if (k + 64 < end) MX(k + 64, 2);
#undef MX
            break;
        }
        case M3_WF_NVFP4: { /* x is in NVFP4_PERM64 order (NVFP4_PERM for a 32-column tail); S = row scales */
/* 64 columns: two group pairs (A0|B0), (A1|B1) with per-lane scales, into accumulators j, j + 1 */
#define NV64(kk, j)                                                                          \
    do {                                                                                     \
        __m256 v_[8];                                                                        \
        nvfp4x64(row + (kk) / 2, v_);                                                        \
        __m256 s4_ = _mm256_broadcast_ps((const __m128 *)(S + (kk) / 16));                   \
        __m256 sa_ = _mm256_permutevar8x32_ps(s4_, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)); \
        __m256 sb_ = _mm256_permutevar8x32_ps(s4_, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3)); \
        GROUP((kk), v_[0], v_[1], v_[2], v_[3], 4, sa_, j);                                  \
        GROUP((kk) + 32, v_[4], v_[5], v_[6], v_[7], 4, sb_, (j) + 1);                       \
    } while (0)
            for (; k + 128 <= end; k += 128) {
                _mm_prefetch((const char *)row + k / 2 + PF_DIST, _MM_HINT_T0);
                NV64(k, 0); NV64(k + 64, 2);
            }
            if (k + 64 <= end) { NV64(k, 0); k += 64; }
            if (k < end) { /* 32-column tail */
                __m256 v_[4];
                nvfp4x32(row + k / 2, v_);
                GROUP(k, v_[0], v_[1], v_[0], v_[0], 2, _mm256_set1_ps(S[k / 16]), 2);
                GROUP(k + 16, v_[2], v_[3], v_[2], v_[2], 2, _mm256_set1_ps(S[k / 16 + 1]), 3);
            }
#undef NV64
            break;
        }
        default: break;
        }
#undef PLAIN
#undef GROUP
#undef GSUM
        acc0 += hsum256(_mm256_add_ps(_mm256_add_ps(a0[0], a0[1]), _mm256_add_ps(a0[2], a0[3])));
        if (NT == 2) acc1 += hsum256(_mm256_add_ps(_mm256_add_ps(a1[0], a1[1]), _mm256_add_ps(a1[2], a1[3])));
    }
    out[0] = acc0;
    if (NT == 2) out[1] = acc1;
}

/* rows [n0, n1) for tokens [t0, t1): pairs of tokens, then a single one */
/* rows [n0, n1) for tokens [t0, t1): pairs of tokens, then a single one; the NVFP4 row
 * scales are converted once per row. One driver per kernel set (ATTR, ROW_DOT, SCALES). */
#define DEFINE_ROWS(NAME, ATTR, ROW_DOT, SCALES)                                                      \
    ATTR static void NAME(const m3_linear *W, int n0, int n1, const float *x, int t0, int t1, float *S, \
                          float *y) {                                                                 \
        const int K = W->K, N = W->N;                                                                 \
        float o[2];                                                                                   \
        for (int n = n0; n < n1; n++) {                                                               \
            if (W->fmt == M3_WF_NVFP4) SCALES(W->scale + (size_t)n * W->scale_row, K / 16, W->gmul, S); \
            int t = t0;                                                                               \
            for (; t + 2 <= t1; t += 2) {                                                             \
                ROW_DOT(W, n, x + (size_t)t * K, x + (size_t)(t + 1) * K, 2, S, o);                   \
                y[(size_t)t * N + n] = o[0];                                                          \
                y[(size_t)(t + 1) * N + n] = o[1];                                                    \
            }                                                                                         \
            if (t < t1) {                                                                             \
                ROW_DOT(W, n, x + (size_t)t * K, NULL, 1, S, o);                                      \
                y[(size_t)t * N + n] = o[0];                                                          \
            }                                                                                         \
        }                                                                                             \
    }

DEFINE_ROWS(rows_avx2, AVX2, row_dot, nvfp4_row_scales)

/* ------------------------------------------------------------------ AVX-512
 * The same scheme 16 lanes wide: chunks of KC columns, four 16-lane accumulators taking the
 * 16-column groups (plain) or scale groups in turn, a scale group's products summed before
 * its one scale multiply. MXFP8 decodes 32 columns per group in natural order; NVFP4 decodes
 * 64 columns per step in NVFP4_PERM512 order (x permuted to match). */

/* lanes 0-3 of the 512-bit NVFP4 decode: lo nibbles of bytes 0-15 | 16-31, hi nibbles of
 * bytes 0-15 | 16-31; then even / odd bf16 words. Group pair 1 = columns 0-15 of each
 * 32-column half, pair 2 = columns 16-31. */
static const uint8_t NVFP4_PERM512[64] = {
    0,  4,  8,  12, 32, 36, 40, 44, 1,  5,  9,  13, 33, 37, 41, 45, 2,  6,  10, 14, 34, 38, 42, 46, 3,  7,  11, 15, 35, 39, 43, 47,
    16, 20, 24, 28, 48, 52, 56, 60, 17, 21, 25, 29, 49, 53, 57, 61, 18, 22, 26, 30, 50, 54, 58, 62, 19, 23, 27, 31, 51, 55, 59, 63};

AVX512 static INLINE void row_dot512(const m3_linear *W, int n, const float *x0, const float *x1, const int NT,
                                     const float *S, float *out) {
    const int K = W->K;
    const m3_wfmt fmt = W->fmt;
    const uint8_t *row = W->w + (size_t)n * W->row_bytes;
    const uint8_t *sc = W->scale ? W->scale + (size_t)n * W->scale_row : NULL;
    const __m512i lut_lo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)NVFP4_BF16_LO));
    const __m512i lut_hi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)NVFP4_BF16_HI));
    float acc0 = 0, acc1 = 0;
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int end = K - k0 < KC ? K : k0 + KC;
        __m512 a0[4], a1[4];
        for (int j = 0; j < 4; j++) a0[j] = a1[j] = _mm512_setzero_ps();
        int k = k0;
#define PLAIN16(kk, j)                                                                       \
    do {                                                                                     \
        __m512 w_ = ld16_plain(fmt, row, (kk));                                              \
        a0[j] = _mm512_fmadd_ps(w_, _mm512_loadu_ps(x0 + (kk)), a0[j]);                      \
        if (NT == 2) a1[j] = _mm512_fmadd_ps(w_, _mm512_loadu_ps(x1 + (kk)), a1[j]);         \
    } while (0)
/* a scale group of 32 columns held in w0 (first 16) and w1 (next 16), scale s */
#define GROUP2(kk, w0, w1, s, j)                                                             \
    do {                                                                                     \
        __m512 t0_ = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x0 + (kk) + 16), _mm512_mul_ps(w0, _mm512_loadu_ps(x0 + (kk)))); \
        a0[j] = _mm512_fmadd_ps(t0_, (s), a0[j]);                                            \
        if (NT == 2) {                                                                       \
            __m512 t1_ = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x1 + (kk) + 16), _mm512_mul_ps(w0, _mm512_loadu_ps(x1 + (kk)))); \
            a1[j] = _mm512_fmadd_ps(t1_, (s), a1[j]);                                        \
        }                                                                                    \
    } while (0)
        switch (fmt) {
        case M3_WF_F32:
        case M3_WF_BF16:
        case M3_WF_F16:
            for (; k + 64 <= end; k += 64) {
                _mm_prefetch((const char *)row + 2 * (size_t)k + PF_DIST, _MM_HINT_T0);
                PLAIN16(k, 0); PLAIN16(k + 16, 1); PLAIN16(k + 32, 2); PLAIN16(k + 48, 3);
            }
            if (k < end) PLAIN16(k, 0);
            if (k + 16 < end) PLAIN16(k + 16, 1);
            if (k + 32 < end) PLAIN16(k + 32, 2);
            break;
        case M3_WF_MXFP8: {
#define MX512(kk, j)                                                                         \
    do {                                                                                     \
        uint8_t e_ = sc[(kk) / 32];                                                          \
        __m512 v0_, v1_;                                                                     \
        e4m3x32_512(row + (kk), &v0_, &v1_);                                                 \
        if (__builtin_expect(e_ > E8M0_X256_MAX, 0)) {                                       \
            v0_ = _mm512_mul_ps(v0_, _mm512_set1_ps(256.0f));                                \
            v1_ = _mm512_mul_ps(v1_, _mm512_set1_ps(256.0f));                                \
        }                                                                                    \
        GROUP2((kk), v0_, v1_, _mm512_set1_ps(m3_cpu_tab_e8m0_x256[e_]), j);                 \
    } while (0)
            for (; k + 128 <= end; k += 128) {
                _mm_prefetch((const char *)row + k + PF_DIST, _MM_HINT_T0);
                _mm_prefetch((const char *)row + k + 64 + PF_DIST, _MM_HINT_T0);
                MX512(k, 0); MX512(k + 32, 1); MX512(k + 64, 2); MX512(k + 96, 3);
            }
            if (k < end) MX512(k, 0);
            if (k + 32 < end) MX512(k + 32, 1);
            if (k + 64 < end) MX512(k + 64, 2);
#undef MX512
            break;
        }
        case M3_WF_NVFP4: { /* x in NVFP4_PERM512 order; S = row scales; K % 64 == 0 */
#define NV512(kk, j)                                                                         \
    do {                                                                                     \
        __m512 w_[4], sa_, sb_;                                                              \
        nvfp4x64_512(row + (kk) / 2, lut_lo, lut_hi, w_);                                    \
        nvfp4_scales64_512(S + (kk) / 16, &sa_, &sb_);                                       \
        GROUP2((kk), w_[0], w_[1], sa_, j);                                                  \
        GROUP2((kk) + 32, w_[2], w_[3], sb_, (j) + 1);                                       \
    } while (0)
            for (; k + 128 <= end; k += 128) {
                _mm_prefetch((const char *)row + k / 2 + PF_DIST, _MM_HINT_T0);
                NV512(k, 0); NV512(k + 64, 2);
            }
            if (k < end) NV512(k, 0);
#undef NV512
            break;
        }
        default: break;
        }
#undef PLAIN16
#undef GROUP2
        acc0 += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0[0], a0[1]), _mm512_add_ps(a0[2], a0[3])));
        if (NT == 2) acc1 += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a1[0], a1[1]), _mm512_add_ps(a1[2], a1[3])));
    }
    out[0] = acc0;
    if (NT == 2) out[1] = acc1;
}

DEFINE_ROWS(rows_avx512, AVX512, row_dot512, nvfp4_scales512)

/* ------------------------------------------------------------------ entry points */

/* which kernel a matrix takes: the widest whose column grouping its K fits (AVX-512: whole
 * 16-column groups, 32 for MXFP8, 64 for NVFP4; AVX2: 8, 32, 32), else the portable one */
enum { K_SCALAR, K_AVX2, K_AVX512 };

static int kernel_for(const m3_linear *W) {
    int lvl = m3_simd_level(), K = W->K, q = W->fmt == M3_WF_MXFP8 || W->fmt == M3_WF_NVFP4;
    if (lvl >= 2 && (W->fmt == M3_WF_NVFP4 ? K % 64 == 0 : q ? K % 32 == 0 : K % 16 == 0)) return K_AVX512;
    if (lvl >= 1 && (q ? K % 32 == 0 : K % 8 == 0)) return K_AVX2;
    return K_SCALAR;
}

typedef struct {
    const m3_linear *W;
    const float *x;
    int T, kernel, tiled;
    float *y;
} lin_job;

static void lin_tiles(void *arg, size_t b, size_t e, int worker) {
    (void)worker;
    lin_job *j = arg;
    int n0 = (int)b * R, n1 = (int)e * R < j->W->N ? (int)e * R : j->W->N;
    if (j->kernel == K_SCALAR) { rows_scalar(j->W, n0, n1, j->x, j->T, j->y); return; }
    if (j->tiled) { /* AVX-512 from TILED_MIN tokens: each row decoded once per block of TBT tokens */
        for (int n = n0; n < n1; n += PR)
            for (int t0 = 0; t0 < j->T; t0 += TBT)
                m3_cpu_rows_tiled512(j->W, n, n + PR < n1 ? n + PR : n1, j->x, j->T, t0,
                                     t0 + TBT < j->T ? t0 + TBT : j->T, j->y);
        return;
    }
    float sbuf[1024], *S = sbuf; /* NVFP4 row scales */
    if (j->W->fmt == M3_WF_NVFP4 && j->W->K / 16 > 1024 && !(S = malloc(sizeof(float) * (size_t)(j->W->K / 16)))) {
        rows_scalar(j->W, n0, n1, j->x, j->T, j->y);
        return;
    }
    for (int t0 = 0; t0 < j->T; t0 += TB) {
        int t1 = t0 + TB < j->T ? t0 + TB : j->T;
        if (j->kernel == K_AVX512) rows_avx512(j->W, n0, n1, j->x, t0, t1, S, j->y);
        else rows_avx2(j->W, n0, n1, j->x, t0, t1, S, j->y);
    }
    if (S != sbuf) free(S);
}

void m3_cpu_set_precision(m3_ops *ops, int bf16) { ((m3_cpu *)ops->ctx)->gemm_bf16 = bf16 != 0; }

void m3_cpu_record_ties(m3_ops *ops, m3_cpu_ties *r) { ((m3_cpu *)ops->ctx)->ties = r; }

/* near-ties of the input rows of one GEMM (see m3_cpu_ties): an f32 is halfway between two
 * bf16 values when its low 16 bits are 0x8000; within ulps of that it may round either way
 * in another arithmetic's hands */
int m3_cpu_bf16_ties(const float *x, int n, int ulps) {
    int ties = 0;
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        if ((u & 0x7f800000u) == 0x7f800000u) continue; /* inf / nan: nothing to round */
        int d = (int)(u & 0xffffu) - 0x8000;
        ties += d >= -ulps && d <= ulps;
    }
    return ties;
}
static void count_ties(m3_cpu *c, const float *x, int T, int K) {
    m3_cpu_ties *r = c->ties;
    for (int t = 0; t < T; t++) {
        int row = c->tie_rows ? c->tie_rows[t] : t, n = m3_cpu_bf16_ties(x + (size_t)t * K, K, r->ulps);
        if (row < 0 || row >= r->T) continue;
        if (r->calls == 0) r->first[row] += n;
        r->all[row] += n;
    }
    r->calls++;
}

void m3_cpu_linear(m3_cpu *c, const m3_linear *W, const float *x, int T, float *y) {
    const int K = W->K;
    float *xr = NULL;
    if (c->gemm_bf16) { /* precision bf16: the GEMM of bf16(x) */
        size_t n = (size_t)T * K;
        xr = m3_cpu_scratch(c, sizeof(float) * n, "linear");
        if (!xr) { memset(y, 0, sizeof(float) * (size_t)T * W->N); return; }
        if (c->ties) count_ties(c, x, T, K);
        for (size_t i = 0; i < n; i++) xr[i] = m3_bf16_round(x[i]);
        x = xr;
    }
    lin_job j = {W, x, T, kernel_for(W), 0, y};
    j.tiled = j.kernel == K_AVX512 && T >= TILED_MIN(W->fmt);
    float *xp = NULL;
    if (j.tiled) {
        /* the tiled kernel's input: chunk by chunk, each token's KC columns together, XS apart (in
         * NVFP4_PERM512 order for NVFP4), so a chunk's tokens are one contiguous run */
        const int nch = (K + KC - 1) / KC;
        xp = m3_cpu_scratch(c, sizeof(float) * (size_t)T * nch * XS, "linear");
        if (!xp) { memset(y, 0, sizeof(float) * (size_t)T * W->N); free(xr); return; }
        for (int ch = 0; ch < nch; ch++) {
            const int k0 = ch * KC, len = K - k0 < KC ? K - k0 : KC;
            for (size_t t = 0; t < (size_t)T; t++) {
                float *d = xp + ((size_t)ch * T + t) * XS;
                const float *s = x + t * K + k0;
                if (W->fmt != M3_WF_NVFP4) memcpy(d, s, sizeof(float) * len);
                else /* K % 64 == 0 (kernel_for) */
                    for (int g = 0; g < len; g += 64)
                        for (int i = 0; i < 64; i++) d[g + i] = s[g + NVFP4_PERM512[i]];
            }
        }
        j.x = xp;
    } else if (j.kernel != K_SCALAR && W->fmt == M3_WF_NVFP4) {
        /* the NVFP4 decoders yield columns in a fixed order per block: permute x to match */
        const uint8_t *perm = j.kernel == K_AVX512 ? NVFP4_PERM512 : NVFP4_PERM64;
        xp = m3_cpu_scratch(c, sizeof(float) * (size_t)T * K, "linear");
        if (!xp) { memset(y, 0, sizeof(float) * (size_t)T * W->N); free(xr); return; }
        for (size_t t = 0; t < (size_t)T; t++) {
            int g = 0;
            for (; g + 64 <= K; g += 64)
                for (int i = 0; i < 64; i++) xp[t * K + g + i] = x[t * K + g + perm[i]];
            if (g < K)
                for (int i = 0; i < 32; i++) xp[t * K + g + i] = x[t * K + g + NVFP4_PERM[i]];
        }
        j.x = xp;
    }
    size_t tiles = ((size_t)W->N + R - 1) / R;
    /* at least ~64 KB of weights per task, so two cores share small matrices too; the tiled
     * kernel's tasks are panels of PR rows, so that a chunk of activations serves them all */
    size_t per_tile = m3_linear_bytes(W) / (tiles ? tiles : 1);
    size_t grain = per_tile ? (65536 / per_tile) + 1 : 1;
    if (j.tiled) { /* panels of PR rows, or fewer so that every thread has some */
        size_t nt = c->nthreads > 0 ? (size_t)c->nthreads : 1, share = (tiles + nt - 1) / nt;
        grain = share < PR / R ? (share ? share : 1) : PR / R;
    }
    m3_pool_for(c->pool, tiles, grain, lin_tiles, &j);
    free(xp);
    free(xr);
}
