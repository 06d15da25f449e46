/* CPU backend: a thread pool over all cores, SIMD kernels chosen at run time
 * (AVX2+FMA+F16C where present, portable C otherwise). */
#ifndef M3_CPU_H
#define M3_CPU_H

#include "../../base/pool.h"
#include "../ops.h"

/* Fills ops for the CPU backend. threads <= 0: all cores ($M3_THREADS overrides).
 * Returns -1 on failure. Free with m3_cpu_ops_free. */
int m3_cpu_ops_init(m3_ops *ops, int threads, m3_err *err);
void m3_cpu_ops_free(m3_ops *ops);

/* "avx2" or "scalar": the kernel set in use ($M3_SIMD=scalar forces the portable one). */
const char *m3_cpu_simd_name(void);

/* ---- kernels shared inside the CPU backend ---- */
void m3_cpu_vision_ops(m3_ops *ops); /* fills the vision tower's ops (vision_ops.c) */
typedef struct m3_cpu {
    m3_pool *pool;
    int nthreads;
    int failed;         /* an op's scratch allocation failed since the last check (atomic) */
    char fail_msg[160]; /* what failed: written by the thread that set failed */
} m3_cpu;

/* Scratch memory of an op (free() it). NULL when out of memory, after recording the failure:
 * the op then skips its work and the op table's check fails the forward pass with the
 * message (no silent wrong output). Counted by the fault-injection module "backend". */
void *m3_cpu_scratch(m3_cpu *c, size_t bytes, const char *op);

/* y[T, N] = x[T, K] W^T on the pool. */
void m3_cpu_linear(m3_cpu *c, const m3_linear *W, const float *x, int T, float *y);
/* Rows [n0, n1) of W, columns [k0, k0+len) (len a multiple of 32, k0 too), as f32 into out[n1-n0][len]. */
void m3_cpu_decode_rows(const m3_linear *W, int n0, int n1, int k0, int len, float *out);
/* 1 when the AVX2+FMA+F16C kernels are in use (chosen once, at first use) */
int m3_cpu_have_avx2(void);

/* small vector helpers (simd.c) */
float m3_cpu_dot(const float *a, const float *b, int n);            /* a . b */
void m3_cpu_axpy(float *y, float a, const float *x, int n);          /* y += a x */
/* out[i] = q . k[i] for n rows of d values, stored as f32 (bf16 = 0) or bf16 (bf16 = 1) */
void m3_cpu_dots(const float *q, const void *k, int bf16, int n, int d, float *out);
/* acc[c] += sum_i p[i] v[i][c] for c < d, n rows of d stored as f32 or bf16 */
void m3_cpu_pv(float *acc, const float *p, const void *v, int bf16, int n, int d);
/* x[i] = exp(x[i] - m) for i < n; returns the sum of the results */
float m3_cpu_exp_shift(float *x, int n, float m);
/* The sampler's first pass over a row: e = exp((w - m) * s) (the sub, the mul, then the exp of
 * the product minus 0, as scaling then m3_cpu_exp_shift(e, n, 0) would), and per block of
 * M3_CPU_MASS_BLOCK values (blk[n / block, rounded up]) the sum of the values e >= thr (kept)
 * and, when want >= 1, the number of values >= lv[j] (lcnt[j]) and, when want == 2, their sum
 * (lmass[j]); sums in float over 64 values, double beyond. Blocks are independent: a row may be
 * cut into ranges of whole blocks run on several threads. */
#define M3_CPU_MASS_BLOCK 256
typedef struct { double kept, lmass[2]; int lcnt[2]; } m3_cpu_blk;
void m3_cpu_exp_stats(const float *w, float *e, int n, float m, float s, float thr, const float lv[2], int want,
                      m3_cpu_blk *blk);
/* sum of exp(x[i] - m) (float within a block, double across blocks) */
double m3_cpu_sum_exp(const float *x, int n, float m);
/* the sum of the x[i] >= v (float over 64 values, double beyond) and (*cnt) how many */
double m3_cpu_mass_ge(const float *x, int n, float v, int *cnt);
/* out[i] = e[i] * inv (in double, rounded to float) where e[i] > 0 and e[i] >= thr, else 0 */
void m3_cpu_scale_kept(const float *e, int n, float thr, double inv, float *out);
/* the sum of the positive (double) p[i] - q[i] (q NULL: of the positive p[i]) */
double m3_cpu_pos_sum(const float *p, const float *q, int n);
/* how many x[i] > v */
int m3_cpu_count_gt(const float *x, int n, float v);
/* the first i in [from, n) with x[i] > v (ge = 0) or x[i] >= v (ge = 1); n when none */
int m3_cpu_find(const float *x, int from, int n, float v, int ge);
/* keys[] := (bits of x[i]) << 32 | ~i for every i with x[i] >= v (ge = 1) or x[i] > v (ge = 0), in
 * no particular order; returns how many. keys needs room for that many + 8. For x >= 0 a
 * larger key means a larger value, then a lower index. */
int m3_cpu_keys_above(const float *x, int n, float v, int ge, uint64_t *keys);
/* the first index of the largest value of x[0..n) (ties: the lowest index; NaN never larger) */
int m3_cpu_argmax(const float *x, int n);

#endif
