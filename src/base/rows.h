/* Reductions and scans over one row of floats (the sampler's and speculative decoding's
 * passes over a vocabulary row), vectorized where the CPU allows (simd.h); every function
 * gives the same result as its portable loop. */
#ifndef M3_BASE_ROWS_H
#define M3_BASE_ROWS_H

#include <stdint.h>

/* The sampler's first pass over a row: e = exp((w - m) * s) (the sub, the mul, then the exp of
 * the product minus 0, as scaling then m3_row_exp_shift(e, n, 0) would), and per block of
 * M3_ROW_MASS_BLOCK values (blk[n / block, rounded up]) the sum of the values e >= thr (kept)
 * and, when want >= 1, the number of values >= lv[j] (lcnt[j]) and, when want == 2, their sum
 * (lmass[j]); sums in float over 64 values, double beyond. Blocks are independent: a row may be
 * cut into ranges of whole blocks run on several threads. */
#define M3_ROW_MASS_BLOCK 256
typedef struct { double kept, lmass[2]; int lcnt[2]; } m3_row_blk;
void m3_row_exp_stats(const float *w, float *e, int n, float m, float s, float thr, const float lv[2], int want,
                      m3_row_blk *blk);
/* sum of exp(x[i] - m) (float within a block, double across blocks) */
double m3_row_sum_exp(const float *x, int n, float m);
/* the sum of the x[i] >= v (float over 64 values, double beyond) and (*cnt) how many */
double m3_row_mass_ge(const float *x, int n, float v, int *cnt);
/* out[i] = e[i] * inv (in double, rounded to float) where e[i] > 0 and e[i] >= thr, else 0 */
void m3_row_scale_kept(const float *e, int n, float thr, double inv, float *out);
/* the sum of the positive (double) p[i] - q[i] (q NULL: of the positive p[i]) */
double m3_row_pos_sum(const float *p, const float *q, int n);
/* how many x[i] > v */
int m3_row_count_gt(const float *x, int n, float v);
/* the first i in [from, n) with x[i] > v (ge = 0) or x[i] >= v (ge = 1); n when none */
int m3_row_find(const float *x, int from, int n, float v, int ge);
/* keys[] := (bits of x[i]) << 32 | ~i for every i with x[i] >= v (ge = 1) or x[i] > v (ge = 0), in
 * no particular order; returns how many. keys needs room for that many + 8. For x >= 0 a
 * larger key means a larger value, then a lower index. */
int m3_row_keys_above(const float *x, int n, float v, int ge, uint64_t *keys);
/* the first index of the largest value of x[0..n) (ties: the lowest index; NaN never larger) */
int m3_row_argmax(const float *x, int n);

/* The k best (value, id) of a row, best first: a larger value, then a lower id (k <= 20). */
#define M3_ROW_TOP_MAX 20
typedef struct { float v; int32_t id; } m3_row_scored;
typedef struct { int n, k; m3_row_scored v[M3_ROW_TOP_MAX]; } m3_row_top;
/* offers (x, id): kept when the list has room or it beats the worst kept */
void m3_row_top_push(m3_row_top *t, float x, int32_t id);
/* offers x[0..n) in id order (only values >= lo (ge) or > lo when lo > -inf) */
void m3_row_top_scan(m3_row_top *t, const float *x, int n, float lo, int ge);

/* The log-softmax of a row at one token, as prompt and raw logprobs report it: lse = m + log(sum
 * exp(x - m)) over x[0..n) (m its largest; the sum as m3_row_sum_exp, lse in double);
 * logprob = x[tok] - lse and rank = 1 + how many x[i] > x[tok] (tok outside [0, n): -inf and
 * n + 1); the k (<= 20) most likely ids with x[id] - lse, best first. fin is the caller's (the
 * op logprob_rows: 1 when the whole row is finite). */
typedef struct m3_row_lp {
    float logprob;
    int32_t rank, fin, n_top;
    int32_t top_ids[M3_ROW_TOP_MAX];
    float top_lp[M3_ROW_TOP_MAX];
} m3_row_lp;
void m3_row_logprobs(const float *x, int n, int32_t tok, int k, m3_row_lp *out);

#endif
