/* Backend-neutral op table. The model (src/model/m3.c) says what to compute through these
 * ops; a backend (cpu/, cuda/) says how. Activation buffers are backend memory obtained from
 * alloc(); the model never reads them except through ops. All activations are f32 row-major:
 * a [T, N] buffer holds token t's row at t * N.
 *
 * Every compute op the forward pass calls is mandatory. The fused ops (linear_n, add_rmsnorm,
 * head_norm_rope_n, head_norm_rope_store, moe_add_rmsnorm, copy_rows, copy_n) are defined as compositions of the
 * others, written once in compose.c; m3_ops_complete installs those wherever a backend leaves
 * a fused op NULL, and a backend overrides one with a faster kernel computing the same thing.
 * Fused ops take the table itself (they may call its other ops); the rest take the backend's
 * context. The hooks marked "optional" and the capabilities at the end (DSpark drafting, the
 * vision tower) may stay NULL. */
#ifndef M3_OPS_H
#define M3_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/rows.h"
#include "../kv/kv.h"
#include "../weights/weights.h"

/* What the MoE computes beyond its weights: the config's routing and activation constants, and
 * fc1_quant, the routed experts' FC1 (gate and up) input as is (M3_FC1_EXACT) or quantized per
 * token to NVFP4 and back (M3_FC1_NVFP4: the M3.1 experts' training numerics, spec section 1; the
 * rule: src/backend/cpu/act_quant.c). The router and the shared expert always take x as is. */
typedef enum { M3_FC1_EXACT = 0, M3_FC1_NVFP4 = 1 } m3_fc1_quant;
typedef struct m3_moe_p {
    int n_experts, top_k;
    float routed_scale, alpha, limit;
    m3_fc1_quant fc1_quant;
} m3_moe_p;

/* The tokens of one forward step: token t belongs to sequence seq[t] at position pos[t].
 * Tokens of one sequence appear in increasing position order. */
typedef struct m3_batch {
    int T;
    const int32_t *pos;
    const int32_t *seq;
    m3_kv_seq *const *seqs;
} m3_batch;

/* one tensor for head_norm_rope_n: x [T, heads * dim], normed and rotated in place */
typedef struct m3_rope_job {
    float *x;
    int heads, dim;
    const float *w;
} m3_rope_job;

/* one request's context for dspark_attention_n: ring kr / vr [cap][nkv * D] (NULL while nothing
 * is readable), context positions [lo, len), the block's first position pos */
typedef struct m3_dspark_attn_req {
    const float *kr, *vr;
    int cap, lo, len, pos;
} m3_dspark_attn_req;

/* one row of draw_rows: the sampler's temperature (below 1e-5: greedy), top-k (0: off), top-p
 * (0 or 1: off) and min-p (0: off) over the ids [0, n), and the uniform u in [0, 1) of its draw */
typedef struct m3_draw_param {
    float temperature, top_p, min_p;
    int top_k, n;
    double u;
} m3_draw_param;

/* one speculative request of verify_rows: its k drafts against the target's k + 1 drawn rows */
#define M3_VERIFY_K_MAX 32
typedef struct m3_verify_group {
    int row0, k;                   /* rows row0 .. row0 + k of x; 0 <= k <= M3_VERIFY_K_MAX */
    const float *q;                /* backend memory [k][V]: the draft's distributions (NULL: one-hot
                                    * at the drafts: greedy drafting) */
    int32_t d[M3_VERIFY_K_MAX];    /* the drafts */
    double u[M3_VERIFY_K_MAX + 1]; /* the request's uniforms in stream order: u[i] tests d_i, u[r + 1]
                                    * draws the residual of a rejection at r (u[k]: draw_rows' bonus) */
} m3_verify_group;

typedef struct m3_ops m3_ops;

struct m3_ops {
    const char *name;
    void *ctx;
    int device_memory;  /* nonzero: backend memory is not host-addressable (CUDA); caches go there too */
    void *(*alloc)(void *ctx, size_t bytes);  /* zeroed, NULL on failure */
    void (*release)(void *ctx, void *p);
    void (*upload)(void *ctx, void *dst, const void *src, size_t bytes);   /* host -> backend */
    void (*download)(void *ctx, void *dst, const void *src, size_t bytes); /* backend -> host */

    /* Optional: host memory downloads land in best (a device's: page-locked, a download into it
     * runs at the link's full speed; the CPU's: its own allocation), and its release. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);

    /* Optional (NULL on the CPU, whose ops read the mapped checkpoint in place): copy the
     * weights into backend memory; *dev gets the same structure with backend pointers (and
     * whatever per-layer tables the backend needs in m3_layer_w.backend). */
    int (*weights_upload)(void *ctx, const m3_weights *host, m3_weights *dev, m3_err *err);
    void (*weights_release)(void *ctx, m3_weights *dev);
    /* Optional: called by m3_forward before the first op of a step (a backend copies the
     * positions, page tables and token ids (host) of the batch to its memory once per step). */
    int (*begin_step)(void *ctx, const m3_kv *kv, const m3_batch *b, const int32_t *ids, m3_err *err);
    /* Optional, both or neither: graph_begin(key) returns 1 when it launched a recorded replay
     * of a step with this key (same shapes: the backend adds what else its kernels depend on),
     * else 0, and the ops are issued (maybe being recorded); graph_end closes a recording and
     * launches it, returning -1 when recording failed (the ops are then issued again). */
    int (*graph_begin)(void *ctx, const m3_kv *kv, uint64_t key);
    int (*graph_end)(void *ctx);
    /* Optional: -1 + err when an op failed since the last call (ops return nothing; a
     * backend whose calls can fail keeps the first error). m3_forward calls it at the end. */
    int (*check)(void *ctx, m3_err *err);
    /* Optional (device backends): the device's free and total memory in bytes, as the driver
     * reports them now (other processes' allocations included). */
    void (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);
    /* Optional: after a failed step, clears the backend's error state (its recordings too)
     * when the device can go on: 0; -1 + err when it cannot (an error that sticks to the
     * device, such as an illegal memory access). Absent: nothing to recover. */
    int (*recover)(void *ctx, m3_err *err);

    /* out[t] = E[ids[t]]; ids in host memory */
    void (*embed)(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out);
    /* capability, optional: the same with ids in backend memory (written by an earlier op, such
     * as argmax_rows: the DSpark draft's greedy chain stays on the device) */
    void (*embed_dev)(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out);
    /* Gemma RMSNorm over rows of dim: out = x * rsqrt(mean(x^2) + eps) * (1 + w); out may be x */
    void (*rmsnorm)(void *ctx, const float *x, const float *w, int rows, int dim, float eps, float *out);
    /* y += x */
    void (*add)(void *ctx, float *y, const float *x, size_t n);
    /* fused: h += o, then out = rmsnorm(h) as rmsnorm does (rows of dim) */
    void (*add_rmsnorm)(const m3_ops *ops, float *h, const float *o, const float *w, int rows, int dim, float eps, float *out);
    /* y[T, N] = x[T, K] W^T */
    void (*linear)(void *ctx, const m3_linear *W, const float *x, int T, float *y);
    /* fused: y_i = x W_i^T for n (<= 6) matrices sharing x, as n linear calls would */
    void (*linear_n)(const m3_ops *ops, int n, const m3_linear *const *W, const float *x, int T, float *const *y);
    /* In place on x [T, heads * dim]: per-head Gemma RMSNorm with w [dim], then NeoX RoPE
     * on the first rotary_dim channels of each head at position pos[t]. */
    void (*head_norm_rope)(void *ctx, float *x, int T, int heads, int dim, const float *w, float eps,
                           int rotary_dim, double theta, const int32_t *pos);
    /* fused: head_norm_rope over n (<= 4) tensors of the same tokens */
    void (*head_norm_rope_n)(const m3_ops *ops, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim, double theta,
                             const int32_t *pos);
    /* fused: head_norm_rope_n over (q, k) or (q, k, index q, index k), then kv_store of k =
     * jobs[1].x, v and ik = jobs[3].x (n == 4; else none), as the two calls would */
    void (*head_norm_rope_store)(const m3_ops *ops, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim, double theta,
                                 m3_kv *kv, int layer, const m3_batch *b, const float *v);
    /* Writes K, V [T, nkv*D] and (sparse layers) index-K [T, Di] of each token to its slot. */
    void (*kv_store)(void *ctx, m3_kv *kv, int layer, const m3_batch *b, const float *k, const float *v,
                     const float *ik);
    /* Lightning indexer: sel [T][ni][topk] block ids chosen for each token and head,
     * ascending, -1 for empty slots. iq is [T, ni * Di]. */
    void (*index_select)(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *iq, int ni,
                         int block, int topk, int local_blocks, int init_blocks, int32_t *sel);
    /* Causal attention of q [T, nh*D] over the cache; with sel (sparse layers) each query
     * head of group g only sees the blocks sel[t][g][*]. out [T, nh*D]. */
    void (*attention)(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *q, int nh,
                      const int32_t *sel, int block, int topk, float *out);
    /* capability, optional: DSpark draft attention (src/model/dspark.c; NULL: this backend
     * drafts no DSpark). Slot i
     * of n (position pos + i), head h (KV head h / (nh / nkv)): softmax(q k^T / sqrt(D)) v over
     * the context positions [max(lo, pos + i - window + 1), len) - ring slot p % cap of kr / vr
     * [cap][nkv * D], NULL while no position is readable (lo == len) - and over all n block keys
     * kb / vb [n][nkv * D] (non-causal inside the block); q, out [n][nh * D]. */
    void (*dspark_attention)(void *ctx, const float *q, const float *kb, const float *vb, int n, int nh, int nkv, int D,
                             const float *kr, const float *vr, int cap, int lo, int len, int pos, int window,
                             float *out);
    /* capability, optional: dspark_attention for nreq requests at once, request r's n slots at
     * rows r * n of q, kb, vb and out, its context as rq[r] says (as nreq calls would) */
    void (*dspark_attention_n)(void *ctx, int nreq, const m3_dspark_attn_req *rq, const float *q, const float *kb,
                               const float *vb, int n, int nh, int nkv, int D, int window, float *out);
    /* capability, optional: a draft pass's requests for all its nl layers (rq[l * nreq + r]), put
     * in the backend's memory once at the pass's start (after begin_step), so that the pass's
     * dspark_attention_n calls read the positions there with launch shapes that do not depend on
     * them (the pass may then be recorded in a graph and replayed with new positions). 1 when
     * taken, 0 when not (shapes it does not take: the calls then read their arguments as before);
     * the next begin_step forgets it. */
    int (*dspark_attention_table)(void *ctx, int nl, int nreq, const m3_dspark_attn_req *rq, int n, int nh, int nkv,
                                  int D, int window);
    /* capability, optional: out[r] (backend memory) = the first index of the largest of the
     * row's values x[r * ld .. r * ld + n) (m3_row_argmax's rule: NaN never wins, a NaN at 0
     * gives 0): the DSpark draft's greedy draws without the rows leaving the device */
    void (*argmax_rows)(void *ctx, const float *x, int rows, int n, size_t ld, int32_t *out);
    /* capability, optional: argmax_rows, and fin[r] (backend memory) = 1 when the row's first nf
     * values are all finite, else 0 (greedy output rows: only ids and flags leave the device) */
    void (*argmax_rows_fin)(void *ctx, const float *x, int rows, int n, int nf, size_t ld, int32_t *out, int32_t *fin);
    /* capability, optional: prompt logprobs where the logits are: row r of x (stride ld, backend
     * memory) gives out[r] (backend memory) = m3_row_logprobs(row, n, tok[r], k) (base/rows.h;
     * tok: host int32 [rows]; the log-sum-exp may be summed in another order and precision: its
     * value within float rounding of the CPU's, ranks and top ids exact) and out[r].fin = 1 when
     * all V of its values are finite, else 0 (and the rest unspecified); 1 <= n <= V, 0 <= k <= 20 */
    void (*logprob_rows)(void *ctx, const float *x, int rows, int n, int V, size_t ld, const int32_t *tok, int k,
                         m3_row_lp *out);
    /* capability, optional: each row x[r * ld .. r * ld + V) (backend memory) becomes the
     * distribution par[r] (host memory) makes of it, and out[r] (backend memory) one draw from
     * it: sampled output rows and the DSpark draft's probabilistic draws without the rows
     * leaving the device. The rule
     * (cpu/draw.c, both backends) is the sampler's steps 3-4 (engine/sampler.h) with masses in
     * units of 2^-40: a = argmax_rows' index over [0, n); greedy, or x[a] not finite: one-hot at
     * a. Else e_i = exp((x_i - x[a]) / T) over [0, n) (0 beyond), kept when e_i > 0 and e_i >=
     * min_p; top-k keeps the k largest, top-p then the smallest prefix (ranked by value, then
     * the lower id) whose mass reaches top_p of what is left; the row = e / total on the kept
     * ids, 0 elsewhere; the draw: the first kept id, in id order, where the running sum of e
     * passes u * total (rounding past the end: the last kept id). */
    void (*draw_rows)(void *ctx, float *x, int rows, int V, size_t ld, const m3_draw_param *par, int32_t *out);
    /* capability, optional (with draw_rows): draw_rows with the rows' parameters in backend memory
     * (par[rows]): a recorded graph of draws replays with the parameters found there then */
    void (*draw_rows_dev)(void *ctx, float *x, int rows, int V, size_t ld, const m3_draw_param *par, int32_t *out);
    /* capability, optional (with draw_rows): DSpark's verification of sampled requests where the
     * rows are (engine/spec.h's rule). Group g (host memory): rows row0 .. row0 + k of x (stride
     * ld) hold the target's distributions p_0 .. p_k as draw_rows left them, out[row0 + k]
     * (backend memory) its draw from p_k (the bonus token). For i = 0, 1, ...: d_i is accepted
     * when p_i[d_i] > 0 and u[i] * q_i[d_i] < p_i[d_i] (q one-hot: q_i[d_i] = 1), and out[row0 +
     * i] = d_i; at the first rejection r, out[row0 + r] = a draw with u[r + 1] from max(p_r - q_r,
     * 0): weights in units of 2^-40 rounded down (float differences), integer sums, the first id
     * in id order whose running sum passes floor(u * total); when no weight is left (rounding
     * only), from p_r without d_r. out's rows after r are left as they were. So the ids before
     * the first that differs from its draft are the accepted ones, and that one is emitted (a
     * residual never equals its draft); with every draft accepted, the bonus. (cpu/verify.c) */
    void (*verify_rows)(void *ctx, const float *x, int V, size_t ld, int n, const m3_verify_group *g, int32_t *out);
    /* bytes from backend memory to backend memory */
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    /* fused: rows copies of width bytes, from src + r * spitch to dst + r * dpitch (backend
     * memory both), as rows copy calls would (the DSpark capture of one layer's rows into the
     * draft's feature rows) */
    void (*copy_rows)(const m3_ops *ops, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t rows);
    /* fused: n copies of bytes[i] from src[i] to dst[i] (backend memory, no two overlapping), as
     * n copy calls would (the DSpark context append: every request's K and V ring rows of a layer) */
    void (*copy_n)(const m3_ops *ops, int n, void *const *dst, const void *const *src, const size_t *bytes);
    /* SwiGLU-OAI MLP: out[T, H] = down((clamp(up)+1) * g * sigmoid(alpha g)), g = min(gate, limit) */
    void (*mlp)(void *ctx, const m3_mlp_w *m, const float *x, int T, float alpha, float limit, float *out);
    /* Sigmoid router + routed experts + shared expert, out [T, H] (overwritten). Under expert
     * parallelism (src/parallel/shard.h) experts held by other ranks have no weights
     * (experts[e].gate.w == NULL, shapes kept): routing still sees every expert, those add
     * nothing here. */
    void (*moe)(void *ctx, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out);
    /* fused: moe into out, then add_rmsnorm(h, out, w, T, H, eps, normed), as the two calls
     * (H = L->router.K; normed may be x: it is written after the experts have read x) */
    void (*moe_add_rmsnorm)(const m3_ops *ops, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out,
                            float *h, const float *w, float eps, float *normed);
    /* capability, optional: the vision tower's ops (src/model/vision.c; a backend without them
     * runs no vision):
     * layer_norm   LayerNorm with bias over rows of dim (mean and variance in double); out may be x
     * bias_act     y[rows][n] += b (b NULL: nothing), then GELU (erf form) when gelu
     * rope_table   on each head of x [n, heads * hd]: channel i < half rotates with i + half by the
     *              angle whose cos / sin are cs / sn [n][half] (backend memory)
     * attention_full  softmax(q k^T / sqrt(hd)) v of every token over all n tokens, per head;
     *              q, k, v, out [n, heads * hd] */
    void (*layer_norm)(void *ctx, const float *x, const float *w, const float *b, int rows, int dim, double eps, float *out);
    void (*bias_act)(void *ctx, float *y, const float *b, int rows, int n, int gelu);
    void (*rope_table)(void *ctx, float *x, int n, int heads, int hd, int half, const float *cs, const float *sn);
    void (*attention_full)(void *ctx, const float *q, const float *k, const float *v, int n, int heads, int hd, float *out);
};

/* Called by every backend's init, last: installs the plain compositions (compose.c) of the
 * fused ops the backend left NULL, then checks that every mandatory op is set. 0, or -1 + err
 * naming the first op missing. */
int m3_ops_complete(m3_ops *ops, m3_err *err);

#endif
