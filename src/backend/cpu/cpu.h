/* CPU backend: a thread pool over all cores, SIMD kernels chosen at run time
 * (AVX2+FMA+F16C where present, portable C otherwise).
 *
 * Files, one per op family (the CUDA backend's files of the same names match them):
 *   ops.c       the op table, scratch memory, the failure check
 *   formats.c   the number formats' decoders (tables, scalar decoder; formats.h: AVX2 decoders)
 *   embed.c norm.c elem.c rope.c kv_store.c indexer.c attention.c linear.c router.c moe.c vision.c
 *   simd.c      small vector helpers (dot, axpy, exp) */
#ifndef M3_CPU_H
#define M3_CPU_H

#include "../../base/pool.h"
#include "../ops.h"

/* Fills ops for the CPU backend. threads <= 0: all cores ($M3_THREADS overrides).
 * Returns -1 on failure. Free with m3_cpu_ops_free. */
int m3_cpu_ops_init(m3_ops *ops, int threads, m3_err *err);
void m3_cpu_ops_free(m3_ops *ops);

/* Precision of every GEMM (the linears, the router, the dense / shared / routed experts, lm_head,
 * and attention's q K^T and P V, attention.c):
 * 0 exact (f32 inputs, the default), 1 bf16 (inputs rounded to bf16, products summed in f32): what
 * the GPU's tensor-core path computes, so the two stay comparable (issue 25's accuracy contract;
 * tools/make_bf16gemm_oracles.py makes references of this arithmetic). */
void m3_cpu_set_precision(m3_ops *ops, int bf16);

/* Near-tie recording (accuracy checks: m3 logits --near-ties, oracle_check --teacher-forced).
 * With precision bf16 a GEMM input element whose f32 value lies within `ulps` f32 ulps of a
 * bf16 rounding midpoint (low 16 bits within ulps of 0x8000) may round the other way than a
 * float64 reference's value of the same element: such elements are counted per token, in
 * first[t] for the first GEMM since the counts were last cleared (a layer's q / k / v / index
 * input when cleared at the layer's start) and in all[t] for every GEMM input row of token t
 * (routed experts' rows counted for their token). A bf16 KV / index-K cache rounds K, V and
 * index-K to bf16 on insert: those rows' near-ties count in first[t] and all[t] too (a K / V
 * element rounded the other way moves this and every later token's attention; an f32 cache's K / V
 * count alike, which precision bf16's attention rounds). Attention adds to all[t] its token's q
 * elements and probabilities that weigh enough to matter (attention.c). The caller
 * clears the arrays (and calls); rows are tokens of the current step: T at most the arrays'
 * length. NULL stops recording. */
typedef struct m3_cpu_ties {
    int ulps;
    int T;          /* length of first / all */
    int32_t *first, *all;
    int calls;      /* GEMMs since the caller last set it to 0 */
} m3_cpu_ties;
void m3_cpu_record_ties(m3_ops *ops, m3_cpu_ties *r);
/* elements of x[n] within ulps f32 ulps of a bf16 rounding midpoint */
int m3_cpu_bf16_ties(const float *x, int n, int ulps);

/* "avx2" or "scalar": the kernel set in use ($M3_SIMD=scalar forces the portable one). */
const char *m3_cpu_simd_name(void);

/* ---- kernels shared inside the CPU backend ---- */
void m3_cpu_vision_ops(m3_ops *ops); /* fills the vision tower's ops (vision.c) */
typedef struct m3_cpu {
    m3_pool *pool;
    int nthreads;
    int failed;         /* an op's scratch allocation failed since the last check (atomic) */
    char fail_msg[160]; /* what failed: written by the thread that set failed */
    int gemm_bf16;      /* precision bf16: every GEMM's input rounded to bf16 first (m3_cpu_linear) */
    m3_cpu_ties *ties;  /* near-tie recording, or NULL */
    const int *tie_rows; /* while set: the token of each GEMM input row (moe.c's routed experts) */
} m3_cpu;

/* Scratch memory of an op (free() it). NULL when out of memory, after recording the failure:
 * the op then skips its work and the op table's check fails the forward pass with the
 * message (no silent wrong output). Counted by the fault-injection module "backend". */
void *m3_cpu_scratch(m3_cpu *c, size_t bytes, const char *op);

/* ---- the ops, by the file of their family (ops.c puts them in the table) ---- */
/* embed.c */
void m3_cpu_embed(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out);
/* norm.c: one row, and the op */
void m3_cpu_rms_row(const float *x, const float *w, int dim, float eps, float *out);
void m3_cpu_rmsnorm(void *ctx, const float *x, const float *w, int rows, int dim, float eps, float *out);
/* elem.c */
void m3_cpu_add(void *ctx, float *y, const float *x, size_t n);
void m3_cpu_swiglu_oai(const float *gate, const float *up, size_t n, float alpha, float limit, float *out);
/* rope.c */
void m3_cpu_head_norm_rope(void *ctx, float *x, int T, int heads, int dim, const float *w, float eps, int rotary_dim,
                           double theta, const int32_t *pos);
/* kv_store.c */
void m3_cpu_kv_store(void *ctx, m3_kv *kv, int layer, const m3_batch *b, const float *k, const float *v, const float *ik);
/* indexer.c */
void m3_cpu_index_select(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *iq, int ni, int block,
                         int topk, int local, int init, int32_t *sel);
/* attention.c */
void m3_cpu_attention(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *q, int nh, const int32_t *sel,
                      int block, int topk, float *out);
void m3_cpu_argmax_rows(void *ctx, const float *x, int rows, int n, size_t ld, int32_t *out);
void m3_cpu_argmax_rows_fin(void *ctx, const float *x, int rows, int n, int nf, size_t ld, int32_t *out, int32_t *fin);
/* logprob.c */
void m3_cpu_logprob_rows(void *ctx, const float *x, int rows, int n, int V, size_t ld, const int32_t *tok, int k,
                         m3_row_lp *out);
void m3_cpu_draw_rows(void *ctx, float *x, int rows, int V, size_t ld, const m3_draw_param *par, int32_t *out);
void m3_cpu_verify_rows(void *ctx, const float *x, int V, size_t ld, int n, const m3_verify_group *g, int32_t *out);
void m3_cpu_dspark_attention(void *ctx, const float *q, const float *kb, const float *vb, int n, int nh, int nkv, int D,
                             const float *kr, const float *vr, int cap, int lo, int len, int pos, int window, float *out);
void m3_cpu_dspark_attention_n(void *ctx, int nreq, const m3_dspark_attn_req *rq, const float *q, const float *kb,
                               const float *vb, int n, int nh, int nkv, int D, int window, float *out);
/* router.c: logits [T][E] -> the K experts of each token, ascending by score rank, and their
 * weights, pick / wt [T][K]; s: 2E floats of scratch */
void m3_cpu_route(const float *logits, const float *bias, int T, int E, int K, float scale, float *s, int *pick, float *wt);
/* moe.c */
void m3_cpu_mlp(void *ctx, const m3_mlp_w *m, const float *x, int T, float alpha, float limit, float *out);
void m3_cpu_moe(void *ctx, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out);
/* act_quant.c: x [T, H] quantized to NVFP4 per token and back, into out (may be x; H a multiple of 16);
 * the _pool form spreads the rows over c's threads */
void m3_cpu_act_quant_nvfp4(const float *x, int T, int H, float *out);
void m3_cpu_act_quant_nvfp4_pool(m3_cpu *c, const float *x, int T, int H, float *out);

/* y[T, N] = x[T, K] W^T on the pool (linear.c). */
void m3_cpu_linear(m3_cpu *c, const m3_linear *W, const float *x, int T, float *y);
/* Rows [n0, n1) of W, columns [k0, k0+len) (len a multiple of 32, k0 too), as f32 into out[n1-n0][len]
 * (formats.c: the number formats' decoders). */
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
