/* Reductions and scans over one row of floats, vectorized: see rows.h. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rows.h"
#include "simd.h"

#define AVX2 M3_AVX2

/* the scalar rule: the first index whose value is larger than every one before it (ties: the
 * lowest index; NaN never larger, a NaN at 0 keeps 0) */
static int argmax_scalar(const float *x, int n) {
    int b = 0;
    float bv = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > bv) { bv = x[i]; b = i; }
    return b;
}

/* The same in two streaming passes: the largest value (NaN loads ignored: max takes the running
 * lanes when a load is NaN), then the first index holding it */
AVX2 static int argmax_avx2(const float *x, int n) {
    if (n < 16 || x[0] != x[0]) return argmax_scalar(x, n);
    __m256 m = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    float t[8], best = -INFINITY;
    _mm256_storeu_ps(t, m);
    for (int j = 0; j < 8; j++) best = t[j] > best ? t[j] : best;
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    const __m256 vb = _mm256_set1_ps(best);
    for (i = 0; i + 8 <= n; i += 8) {
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vb, _CMP_EQ_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++)
        if (x[i] == best) return i;
    return 0; /* every value -inf or NaN after x[0] (x[0] -inf): the scalar rule's 0 */
}

int m3_row_argmax(const float *x, int n) {
    if (n <= 0) return 0;
    if (m3_have_avx2()) return argmax_avx2(x, n);
    return argmax_scalar(x, n);
}

/* ---- the sampler's passes over a vocabulary row (engine/sampler.c) ---- */

AVX2 static inline double hsum_pd(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

AVX2 static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* The pass for one choice of level statistics (LV: 0 none, 1 counts, 2 counts and masses; a
 * constant in each instance). Sums run in float over 8 vectors (64 values), then in double. */
AVX2 static inline __attribute__((always_inline)) void exp_stats_core(const float *w, float *e, int n, float m, float s,
                                                                       float thr, const float lv[2], m3_row_blk *blk,
                                                                       const int LV) {
    const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(s), z = _mm256_setzero_ps(), vt = _mm256_set1_ps(thr);
    const __m256 l0 = _mm256_set1_ps(lv[0]), l1 = _mm256_set1_ps(lv[1]);
    for (int b0 = 0; b0 < n; b0 += M3_ROW_MASS_BLOCK) {
        const int b1 = b0 + M3_ROW_MASS_BLOCK < n ? b0 + M3_ROW_MASS_BLOCK : n;
        __m256d d = _mm256_setzero_pd(), m0 = d, m1 = d;
        __m256i c0 = _mm256_setzero_si256(), c1 = c0;
        for (int g0 = b0; g0 < b1; g0 += 64) {
            const int g1 = g0 + 64 < b1 ? g0 + 64 : b1;
            __m256 f = z, f0 = z, f1 = z;
            for (int i = g0; i < g1; i += 8) {
                __m256 x;
                if (i + 8 <= g1) {
                    const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(w + i), vm), vs);
                    x = m3_exp8(_mm256_sub_ps(t, z));
                    _mm256_storeu_ps(e + i, x);
                } else { /* the row's tail through the same polynomial; the padding is exp(-inf) = 0 */
                    float t[8];
                    for (int j = 0; j < 8; j++) t[j] = i + j < g1 ? (w[i + j] - m) * s - 0.0f : -INFINITY;
                    x = m3_exp8(_mm256_loadu_ps(t));
                    _mm256_storeu_ps(t, x);
                    for (int j = i; j < g1; j++) e[j] = t[j - i];
                }
                f = _mm256_add_ps(f, _mm256_and_ps(x, _mm256_cmp_ps(x, vt, _CMP_GE_OQ)));
                if (LV) {
                    const __m256 k0 = _mm256_cmp_ps(x, l0, _CMP_GE_OQ), k1 = _mm256_cmp_ps(x, l1, _CMP_GE_OQ);
                    c0 = _mm256_sub_epi32(c0, _mm256_castps_si256(k0));
                    c1 = _mm256_sub_epi32(c1, _mm256_castps_si256(k1));
                    if (LV == 2) {
                        f0 = _mm256_add_ps(f0, _mm256_and_ps(x, k0));
                        f1 = _mm256_add_ps(f1, _mm256_and_ps(x, k1));
                    }
                }
            }
            d = _mm256_add_pd(d, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f)), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))));
            if (LV == 2) {
                m0 = _mm256_add_pd(m0, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f0)), _mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1))));
                m1 = _mm256_add_pd(m1, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f1)), _mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1))));
            }
        }
        m3_row_blk *B = &blk[b0 / M3_ROW_MASS_BLOCK];
        B->kept = hsum_pd(d);
        B->lcnt[0] = LV ? hsum_epi32(c0) : 0;
        B->lcnt[1] = LV ? hsum_epi32(c1) : 0;
        B->lmass[0] = LV == 2 ? hsum_pd(m0) : 0;
        B->lmass[1] = LV == 2 ? hsum_pd(m1) : 0;
    }
}

AVX2 static void exp_stats_avx2(const float *w, float *e, int n, float m, float s, float thr, const float lv[2], int want,
                                m3_row_blk *blk) {
    if (want == 0) exp_stats_core(w, e, n, m, s, thr, lv, blk, 0);
    else if (want == 1) exp_stats_core(w, e, n, m, s, thr, lv, blk, 1);
    else exp_stats_core(w, e, n, m, s, thr, lv, blk, 2);
}

void m3_row_exp_stats(const float *w, float *e, int n, float m, float s, float thr, const float lv[2], int want,
                      m3_row_blk *blk) {
    if (m3_have_avx2()) { exp_stats_avx2(w, e, n, m, s, thr, lv, want, blk); return; }
    for (int b0 = 0; b0 < n; b0 += M3_ROW_MASS_BLOCK) {
        const int b1 = b0 + M3_ROW_MASS_BLOCK < n ? b0 + M3_ROW_MASS_BLOCK : n;
        m3_row_blk *B = &blk[b0 / M3_ROW_MASS_BLOCK];
        memset(B, 0, sizeof *B);
        for (int i = b0; i < b1; i++) {
            const float x = e[i] = expf((w[i] - m) * s - 0.0f);
            if (x >= thr) B->kept += x;
            for (int j = 0; j < 2 && want; j++)
                if (x >= lv[j]) { B->lcnt[j]++; B->lmass[j] += want == 2 ? x : 0; }
        }
    }
}

AVX2 static double sum_exp_avx2(const float *x, int n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    double s = 0;
    int i = 0;
    while (i + 8 <= n) { /* float within a block of M3_ROW_MASS_BLOCK, double across blocks */
        const int end = i + M3_ROW_MASS_BLOCK < n ? i + M3_ROW_MASS_BLOCK : n;
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= end; i += 8) acc = _mm256_add_ps(acc, m3_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm)));
        s += m3_hsum8(acc);
    }
    if (i < n) {
        float t[8];
        for (int j = 0; j < 8; j++) t[j] = i + j < n ? x[i + j] - m : -INFINITY;
        s += m3_hsum8(m3_exp8(_mm256_loadu_ps(t)));
    }
    return s;
}

double m3_row_sum_exp(const float *x, int n, float m) {
    if (m3_have_avx2()) return sum_exp_avx2(x, n, m);
    double s = 0;
    for (int i = 0; i < n; i++) s += expf(x[i] - m);
    return s;
}

static double mass_ge_scalar(const float *x, int n, float v, int *cnt) {
    double s = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (x[i] >= v) { s += x[i]; k++; }
    *cnt = k;
    return s;
}

AVX2 static double mass_ge_avx2(const float *x, int n, float v, int *cnt) {
    const __m256 vv = _mm256_set1_ps(v);
    __m256i c = _mm256_setzero_si256();
    __m256d d = _mm256_setzero_pd();
    int i = 0;
    while (i + 8 <= n) { /* float over 8 vectors, double beyond */
        const int end = i + 64 < n ? i + 64 : n;
        __m256 f = _mm256_setzero_ps();
        for (; i + 8 <= end; i += 8) {
            const __m256 a = _mm256_loadu_ps(x + i), k = _mm256_cmp_ps(a, vv, _CMP_GE_OQ);
            f = _mm256_add_ps(f, _mm256_and_ps(a, k));
            c = _mm256_sub_epi32(c, _mm256_castps_si256(k));
        }
        d = _mm256_add_pd(d, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f)), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))));
    }
    int tk;
    const double s = hsum_pd(d) + mass_ge_scalar(x + i, n - i, v, &tk);
    *cnt = hsum_epi32(c) + tk;
    return s;
}

double m3_row_mass_ge(const float *x, int n, float v, int *cnt) {
    return m3_have_avx2() ? mass_ge_avx2(x, n, v, cnt) : mass_ge_scalar(x, n, v, cnt);
}

static void scale_kept_scalar(const float *e, int n, float thr, double inv, float *out) {
    for (int i = 0; i < n; i++) out[i] = e[i] > 0 && e[i] >= thr ? (float)(e[i] * inv) : 0.0f;
}

AVX2 static void scale_kept_avx2(const float *e, int n, float thr, double inv, float *out) {
    const __m256 vt = _mm256_set1_ps(thr), z = _mm256_setzero_ps();
    const __m256d vi = _mm256_set1_pd(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(e + i);
        const __m256 k = _mm256_and_ps(_mm256_cmp_ps(x, z, _CMP_GT_OQ), _mm256_cmp_ps(x, vt, _CMP_GE_OQ));
        const __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), vi));
        const __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), vi));
        _mm256_storeu_ps(out + i, _mm256_and_ps(_mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1), k));
    }
    scale_kept_scalar(e + i, n - i, thr, inv, out + i);
}

void m3_row_scale_kept(const float *e, int n, float thr, double inv, float *out) {
    if (m3_have_avx2()) scale_kept_avx2(e, n, thr, inv, out);
    else scale_kept_scalar(e, n, thr, inv, out);
}

static double pos_sum_scalar(const float *p, const float *q, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) {
        const double r = q ? (double)p[i] - q[i] : (double)p[i];
        if (r > 0) s += r;
    }
    return s;
}

AVX2 static double pos_sum_avx2(const float *p, const float *q, int n) {
    const __m256d z = _mm256_setzero_pd();
    __m256d a0 = z, a1 = z;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(p + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        if (q) {
            const __m256 y = _mm256_loadu_ps(q + i);
            lo = _mm256_sub_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
            hi = _mm256_sub_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)));
        }
        a0 = _mm256_add_pd(a0, _mm256_max_pd(lo, z)); /* NaN: max gives the second operand, 0 */
        a1 = _mm256_add_pd(a1, _mm256_max_pd(hi, z));
    }
    return hsum_pd(_mm256_add_pd(a0, a1)) + pos_sum_scalar(p + i, q ? q + i : NULL, n - i);
}

double m3_row_pos_sum(const float *p, const float *q, int n) {
    return m3_have_avx2() ? pos_sum_avx2(p, q, n) : pos_sum_scalar(p, q, n);
}

static int count_gt_scalar(const float *x, int n, float v) {
    int k = 0;
    for (int i = 0; i < n; i++) k += x[i] > v;
    return k;
}

AVX2 static int count_gt_avx2(const float *x, int n, float v) {
    const __m256 vv = _mm256_set1_ps(v);
    __m256i c = _mm256_setzero_si256();
    int i = 0;
    for (; i + 8 <= n; i += 8) c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vv, _CMP_GT_OQ)));
    return hsum_epi32(c) + count_gt_scalar(x + i, n - i, v);
}

int m3_row_count_gt(const float *x, int n, float v) {
    return m3_have_avx2() ? count_gt_avx2(x, n, v) : count_gt_scalar(x, n, v);
}

static int find_scalar(const float *x, int from, int n, float v, int ge) {
    for (int i = from; i < n; i++)
        if (ge ? x[i] >= v : x[i] > v) return i;
    return n;
}

AVX2 static int find_avx2(const float *x, int from, int n, float v, int ge) {
    const __m256 vv = _mm256_set1_ps(v);
    int i = from;
    for (; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_loadu_ps(x + i);
        const int mask = _mm256_movemask_ps(ge ? _mm256_cmp_ps(a, vv, _CMP_GE_OQ) : _mm256_cmp_ps(a, vv, _CMP_GT_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    return find_scalar(x, i, n, v, ge);
}

int m3_row_find(const float *x, int from, int n, float v, int ge) {
    return m3_have_avx2() ? find_avx2(x, from, n, v, ge) : find_scalar(x, from, n, v, ge);
}

/* For a movemask m of 8 compares: the positions of its set bits, packed first, one byte each, and
 * pre-arranged (slot s holds packed element {0,1,4,5,2,3,6,7}[s]) so that unpacking the ids and
 * the values into 64-bit pairs yields the pairs in packed order. */
static const uint64_t KEY_LUT[256] = {
    0x0000000000000000ull, 0x0000000000000000ull, 0x0000000000000001ull, 0x0000000000000100ull,
    0x0000000000000002ull, 0x0000000000000200ull, 0x0000000000000201ull, 0x0000000200000100ull,
    0x0000000000000003ull, 0x0000000000000300ull, 0x0000000000000301ull, 0x0000000300000100ull,
    0x0000000000000302ull, 0x0000000300000200ull, 0x0000000300000201ull, 0x0000030200000100ull,
    0x0000000000000004ull, 0x0000000000000400ull, 0x0000000000000401ull, 0x0000000400000100ull,
    0x0000000000000402ull, 0x0000000400000200ull, 0x0000000400000201ull, 0x0000040200000100ull,
    0x0000000000000403ull, 0x0000000400000300ull, 0x0000000400000301ull, 0x0000040300000100ull,
    0x0000000400000302ull, 0x0000040300000200ull, 0x0000040300000201ull, 0x0000030200040100ull,
    0x0000000000000005ull, 0x0000000000000500ull, 0x0000000000000501ull, 0x0000000500000100ull,
    0x0000000000000502ull, 0x0000000500000200ull, 0x0000000500000201ull, 0x0000050200000100ull,
    0x0000000000000503ull, 0x0000000500000300ull, 0x0000000500000301ull, 0x0000050300000100ull,
    0x0000000500000302ull, 0x0000050300000200ull, 0x0000050300000201ull, 0x0000030200050100ull,
    0x0000000000000504ull, 0x0000000500000400ull, 0x0000000500000401ull, 0x0000050400000100ull,
    0x0000000500000402ull, 0x0000050400000200ull, 0x0000050400000201ull, 0x0000040200050100ull,
    0x0000000500000403ull, 0x0000050400000300ull, 0x0000050400000301ull, 0x0000040300050100ull,
    0x0000050400000302ull, 0x0000040300050200ull, 0x0000040300050201ull, 0x0000030205040100ull,
    0x0000000000000006ull, 0x0000000000000600ull, 0x0000000000000601ull, 0x0000000600000100ull,
    0x0000000000000602ull, 0x0000000600000200ull, 0x0000000600000201ull, 0x0000060200000100ull,
    0x0000000000000603ull, 0x0000000600000300ull, 0x0000000600000301ull, 0x0000060300000100ull,
    0x0000000600000302ull, 0x0000060300000200ull, 0x0000060300000201ull, 0x0000030200060100ull,
    0x0000000000000604ull, 0x0000000600000400ull, 0x0000000600000401ull, 0x0000060400000100ull,
    0x0000000600000402ull, 0x0000060400000200ull, 0x0000060400000201ull, 0x0000040200060100ull,
    0x0000000600000403ull, 0x0000060400000300ull, 0x0000060400000301ull, 0x0000040300060100ull,
    0x0000060400000302ull, 0x0000040300060200ull, 0x0000040300060201ull, 0x0000030206040100ull,
    0x0000000000000605ull, 0x0000000600000500ull, 0x0000000600000501ull, 0x0000060500000100ull,
    0x0000000600000502ull, 0x0000060500000200ull, 0x0000060500000201ull, 0x0000050200060100ull,
    0x0000000600000503ull, 0x0000060500000300ull, 0x0000060500000301ull, 0x0000050300060100ull,
    0x0000060500000302ull, 0x0000050300060200ull, 0x0000050300060201ull, 0x0000030206050100ull,
    0x0000000600000504ull, 0x0000060500000400ull, 0x0000060500000401ull, 0x0000050400060100ull,
    0x0000060500000402ull, 0x0000050400060200ull, 0x0000050400060201ull, 0x0000040206050100ull,
    0x0000060500000403ull, 0x0000050400060300ull, 0x0000050400060301ull, 0x0000040306050100ull,
    0x0000050400060302ull, 0x0000040306050200ull, 0x0000040306050201ull, 0x0006030205040100ull,
    0x0000000000000007ull, 0x0000000000000700ull, 0x0000000000000701ull, 0x0000000700000100ull,
    0x0000000000000702ull, 0x0000000700000200ull, 0x0000000700000201ull, 0x0000070200000100ull,
    0x0000000000000703ull, 0x0000000700000300ull, 0x0000000700000301ull, 0x0000070300000100ull,
    0x0000000700000302ull, 0x0000070300000200ull, 0x0000070300000201ull, 0x0000030200070100ull,
    0x0000000000000704ull, 0x0000000700000400ull, 0x0000000700000401ull, 0x0000070400000100ull,
    0x0000000700000402ull, 0x0000070400000200ull, 0x0000070400000201ull, 0x0000040200070100ull,
    0x0000000700000403ull, 0x0000070400000300ull, 0x0000070400000301ull, 0x0000040300070100ull,
    0x0000070400000302ull, 0x0000040300070200ull, 0x0000040300070201ull, 0x0000030207040100ull,
    0x0000000000000705ull, 0x0000000700000500ull, 0x0000000700000501ull, 0x0000070500000100ull,
    0x0000000700000502ull, 0x0000070500000200ull, 0x0000070500000201ull, 0x0000050200070100ull,
    0x0000000700000503ull, 0x0000070500000300ull, 0x0000070500000301ull, 0x0000050300070100ull,
    0x0000070500000302ull, 0x0000050300070200ull, 0x0000050300070201ull, 0x0000030207050100ull,
    0x0000000700000504ull, 0x0000070500000400ull, 0x0000070500000401ull, 0x0000050400070100ull,
    0x0000070500000402ull, 0x0000050400070200ull, 0x0000050400070201ull, 0x0000040207050100ull,
    0x0000070500000403ull, 0x0000050400070300ull, 0x0000050400070301ull, 0x0000040307050100ull,
    0x0000050400070302ull, 0x0000040307050200ull, 0x0000040307050201ull, 0x0007030205040100ull,
    0x0000000000000706ull, 0x0000000700000600ull, 0x0000000700000601ull, 0x0000070600000100ull,
    0x0000000700000602ull, 0x0000070600000200ull, 0x0000070600000201ull, 0x0000060200070100ull,
    0x0000000700000603ull, 0x0000070600000300ull, 0x0000070600000301ull, 0x0000060300070100ull,
    0x0000070600000302ull, 0x0000060300070200ull, 0x0000060300070201ull, 0x0000030207060100ull,
    0x0000000700000604ull, 0x0000070600000400ull, 0x0000070600000401ull, 0x0000060400070100ull,
    0x0000070600000402ull, 0x0000060400070200ull, 0x0000060400070201ull, 0x0000040207060100ull,
    0x0000070600000403ull, 0x0000060400070300ull, 0x0000060400070301ull, 0x0000040307060100ull,
    0x0000060400070302ull, 0x0000040307060200ull, 0x0000040307060201ull, 0x0007030206040100ull,
    0x0000000700000605ull, 0x0000070600000500ull, 0x0000070600000501ull, 0x0000060500070100ull,
    0x0000070600000502ull, 0x0000060500070200ull, 0x0000060500070201ull, 0x0000050207060100ull,
    0x0000070600000503ull, 0x0000060500070300ull, 0x0000060500070301ull, 0x0000050307060100ull,
    0x0000060500070302ull, 0x0000050307060200ull, 0x0000050307060201ull, 0x0007030206050100ull,
    0x0000070600000504ull, 0x0000060500070400ull, 0x0000060500070401ull, 0x0000050407060100ull,
    0x0000060500070402ull, 0x0000050407060200ull, 0x0000050407060201ull, 0x0007040206050100ull,
    0x0000060500070403ull, 0x0000050407060300ull, 0x0000050407060301ull, 0x0007040306050100ull,
    0x0000050407060302ull, 0x0007040306050200ull, 0x0007040306050201ull, 0x0706030205040100ull,
};

/* ids [from, n) into keys from k on; returns the new count */
static int keys_above_scalar(const float *x, int from, int n, float v, int ge, uint64_t *keys, int k) {
    for (int i = from; i < n; i++)
        if (ge ? x[i] >= v : x[i] > v) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            keys[k++] = (uint64_t)u << 32 | (uint32_t)~(uint32_t)i;
        }
    return k;
}

AVX2 static int keys_above_avx2(const float *x, int n, float v, int ge, uint64_t *keys) {
    const __m256 vv = _mm256_set1_ps(v);
    __m256i id = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i eight = _mm256_set1_epi32(8), ones = _mm256_set1_epi32(-1);
    int k = 0, i = 0;
    for (; i + 8 <= n; i += 8, id = _mm256_add_epi32(id, eight)) {
        const __m256 a = _mm256_loadu_ps(x + i);
        const int mask = _mm256_movemask_ps(ge ? _mm256_cmp_ps(a, vv, _CMP_GE_OQ) : _mm256_cmp_ps(a, vv, _CMP_GT_OQ));
        if (!mask) continue;
        const __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)KEY_LUT[mask]));
        const __m256i pv = _mm256_permutevar8x32_epi32(_mm256_castps_si256(a), perm);
        const __m256i pi = _mm256_xor_si256(_mm256_permutevar8x32_epi32(id, perm), ones);
        _mm256_storeu_si256((__m256i *)(keys + k), _mm256_unpacklo_epi32(pi, pv));
        _mm256_storeu_si256((__m256i *)(keys + k + 4), _mm256_unpackhi_epi32(pi, pv));
        k += __builtin_popcount((unsigned)mask);
    }
    return keys_above_scalar(x, i, n, v, ge, keys, k);
}

int m3_row_keys_above(const float *x, int n, float v, int ge, uint64_t *keys) {
    return m3_have_avx2() ? keys_above_avx2(x, n, v, ge, keys) : keys_above_scalar(x, 0, n, v, ge, keys, 0);
}

/* ---------------- the k best, and a row's log-softmax at one token ---------------- */

/* a ranks before b: larger value, then lower id */
static int better(m3_row_scored a, m3_row_scored b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

void m3_row_top_push(m3_row_top *t, float x, int32_t id) {
    m3_row_scored c = {x, id};
    if (t->n == t->k) {
        if (!better(c, t->v[t->n - 1])) return;
        t->n--;
    }
    int j = t->n++;
    while (j > 0 && better(c, t->v[j - 1])) { t->v[j] = t->v[j - 1]; j--; }
    t->v[j] = c;
}

/* the first k, then only what beats the worst kept (a strictly larger value: an equal one comes
 * later, so ranks lower) */
void m3_row_top_scan(m3_row_top *t, const float *x, int n, float lo, int ge) {
    int i = 0;
    if (t->k <= 0) return;
    while (t->n < t->k && (i = m3_row_find(x, i, n, lo, ge)) < n) { m3_row_top_push(t, x[i], i); i++; }
    while (t->n == t->k && (i = m3_row_find(x, i, n, t->v[t->n - 1].v, 0)) < n) { m3_row_top_push(t, x[i], i); i++; }
}

void m3_row_logprobs(const float *x, int n, int32_t tok, int k, m3_row_lp *out) {
    memset(out, 0, sizeof *out);
    if (n <= 0) return;
    if (k > M3_ROW_TOP_MAX) k = M3_ROW_TOP_MAX;
    const float m = x[m3_row_argmax(x, n)];
    const double lse = (double)m + log(m3_row_sum_exp(x, n, m));
    m3_row_top t = {0, k < 0 ? 0 : k, {{0, 0}}};
    m3_row_top_scan(&t, x, n, -INFINITY, 1);
    if (tok >= 0 && tok < n) {
        out->logprob = (float)((double)x[tok] - lse);
        out->rank = 1 + m3_row_count_gt(x, n, x[tok]);
    } else { /* not a text id */
        out->logprob = -INFINITY;
        out->rank = n + 1;
    }
    out->n_top = t.n;
    for (int j = 0; j < t.n; j++) {
        out->top_ids[j] = t.v[j].id;
        out->top_lp[j] = (float)((double)t.v[j].v - lse);
    }
}
