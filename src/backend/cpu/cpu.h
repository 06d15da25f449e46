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

/* small vector helpers (simd.c) */
float m3_cpu_dot(const float *a, const float *b, int n);            /* a . b */
void m3_cpu_axpy(float *y, float a, const float *x, int n);          /* y += a x */
/* out[i] = q . k[i] for n rows of d values, stored as f32 (bf16 = 0) or bf16 (bf16 = 1) */
void m3_cpu_dots(const float *q, const void *k, int bf16, int n, int d, float *out);
/* acc[c] += sum_i p[i] v[i][c] for c < d, n rows of d stored as f32 or bf16 */
void m3_cpu_pv(float *acc, const float *p, const void *v, int bf16, int n, int d);
/* x[i] = exp(x[i] - m) for i < n; returns the sum of the results */
float m3_cpu_exp_shift(float *x, int n, float m);
#endif
