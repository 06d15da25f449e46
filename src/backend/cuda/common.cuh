/* Shared by the CUDA backend's .cu files: the context, error checks, the tiled weight layout,
 * warp / block / cluster helpers, and the declarations of the ops each kernel file implements.
 * The number-format decoders are in formats.cuh. */
#ifndef M3_CUDA_COMMON_CUH
#define M3_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "../graph_refuse.h"
#include "cuda.h"
#include "formats.cuh"
#include "swiglu.cuh"

/* grow-only scratch buffers, one per purpose (no allocation inside a steady-state step) */
enum { SC_IDS, SC_DEQ, SC_XE, SC_YE, SC_MOE, SC_ROUTE, SC_ATT, SC_IDX, SC_META, SC_TMP, SC_XSPLIT, SC_XSPLIT2, SC_GEMM_X, SC_XROUND,
       SC_SPLITK, SC_DSA, SC_AMAX, SC_DRAW, SC_DSA_TAB, SC_LOGP, SC_ACTQ, SC_COUNT };

typedef struct m3_cuda {
    int dev, sm_count;
    size_t smem_optin;
    size_t smem_per_sm;        /* shared memory of one SM (all its resident CTAs) */
    cudaStream_t st;            /* where ops launch: the main stream, or the side's inside m3_cu_side_begin / end */
    cudaStream_t st_main, st_side;
    cudaEvent_t ev_fork, ev_join;
    int side, side_pending;     /* in the side section; the side's work not yet joined (m3_cu_side_join) */
    cublasHandle_t blas;
    char name[128];
    int failed;
    char errmsg[512];
    void *sc[2 * SC_COUNT];     /* the main stream's slots, then the side's (m3_cu_scratch) */
    size_t sc_bytes[2 * SC_COUNT];
    size_t allocated, peak;
    /* weight arena (m3_cu_alloc while uploading weights): 1 = counting bytes only (no copies,
     * no launches), 2 = carving from wa_base; 0 = plain cudaMalloc */
    int wa_mode;
    uint8_t *wa_base;
    size_t wa_size, wa_used;
    /* the current step (begin_step): device copies of positions, sequence of each token,
     * page table rows [n_seqs][ptab_stride] and sequence lengths; the step's runs (consecutive
     * tokens of one sequence at consecutive positions, at most RUN_MAX each: their first tokens
     * d_lead and lengths d_rlen, n_runs of them, the longest max_run) */
    const void *step_b;
    int T, n_seqs, ptab_stride, max_pos, n_runs, max_run;
    int32_t *d_pos, *d_seq, *d_ptab, *d_ids, *d_lead, *d_rlen;
    const m3_kv *step_kv;
    /* recorded decode graphs (cu_graph_begin / cu_graph_end) */
    int graphs_on, capturing, scratch_grew, n_graphs, n_seen;
    int gemm_bf16;              /* precision bf16: the input of every GEMM with a weight rounded to bf16 (the
                                 * GEMV splits, m3_cu_gemm_input, the staged x of the wgmma GEMM, which takes
                                 * linears of more than 64 tokens); 0 (exact): f32 inputs throughout */
    uint64_t capture_key, graph_clock, seen[64];
    long graph_replays;
    struct { uint64_t key, used; cudaGraphExec_t exec; } graphs[16];
    m3_graph_fails graph_fails; /* failed recordings per key, refused keys (graph_refuse.h) */
    int32_t *h_meta;            /* pinned staging */
    size_t h_meta_cap;
    /* per-op timing for benchmarks (m3_cuda_profile): event pairs around each op */
    int prof, prof_depth;
    int prof_n, prof_cap;
    struct { int op; cudaEvent_t a, b; } *prof_ev;
    double prof_ms[16];
    long prof_calls[16];
    /* f16 hi / lo splits of activation buffers (linear_mma.cu), and the tensor-core GEMV's
     * arrival counters (zero between launches) */
    struct { const float *src; size_t n; uint16_t *buf; } xs[2], xs_other[2]; /* xs_other: the side's while on the main stream, and back */
    int xs_next, xs_next_other;
    void *blas_ws;              /* cuBLAS workspace (set on the handle) */
    size_t blas_ws_bytes;
    int *ctr, *ctr_other;       /* ctr_other: the side's counters while on the main stream, and back */
    long ctr_n;                 /* GEMV arrival counters; CTR_AUX more follow them (ctr_aux) */
    /* a draft pass's DSpark attention requests (dspark_attention_table): the host's copy
     * [nl][nreq] (to find a call's layer) and the device's, while dsa_tab_on (until begin_step) */
    int dsa_tab_on, dsa_tab_nl, dsa_tab_nreq, dsa_tab_n, dsa_tab_window;
    m3_dspark_attn_req *dsa_tab, *d_dsa_tab;
    /* expert counting for benchmarks */
    int count_experts;
    long experts_used;
    uint8_t *h_pick_seen;       /* host scratch */
    int32_t *h_pick;
    size_t h_pick_cap;
} m3_cuda;

#define RUN_MAX 8 /* tokens of a run (the indexer's key reads are shared within one) */
#define GRAPH_T_MAX 8 /* steps of at most this many tokens are recorded (cu_graph_begin) */

/* MoE grouped by expert on the tensor cores (linear_mma.cu): at most MOE_GROUP_T tokens and
 * MOE_GROUP_S (token, expert) slots per launch; larger batches go in chunks */
#define MOE_GROUP_T 64
#define MOE_GROUP_S 512

/* Arrival counters of the kernels that finish with a last-CTA step (zero between launches,
 * each launch leaves them zero): after the GEMVs' ctr_n, CTR_AUX_ROUTE (the router's routing
 * step), then one per token from CTR_AUX_TOK (the indexer's top-k), CTR_AUX in all. */
#define CTR_AUX_ROUTE 0
#define CTR_AUX_TOK 16
#define CTR_AUX (CTR_AUX_TOK + 65536)
static inline int *ctr_aux(const m3_cuda *c, int i) { return c->ctr + c->ctr_n + i; }

/* Release / acquire fence at GPU scope: orders this thread's earlier writes before its later
 * ones (the arrival counter) and, after observing another thread's release, its later reads
 * after that thread's earlier writes. Lighter than __threadfence (a sequentially consistent
 * fence, which also waits for unrelated traffic). */
static __device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

/* atomic add with release semantics at GPU scope (this thread's earlier writes, and those
 * ordered before them, are visible before the add); returns the old value */
static __device__ __forceinline__ int atom_add_release(int *p, int v) {
    int old;
    asm volatile("atom.release.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

/* The last CTA of a grid to arrive (after every CTA has called it once, all threads): true in
 * that CTA only, with every other CTA's writes visible; it resets the counter. */
static __device__ __forceinline__ bool last_cta(int *ctr, int expected) {
    __shared__ int last;
    fence_acq_rel();
    __syncthreads();
    if (threadIdx.x == 0) {
        fence_acq_rel(); /* cumulative: the CTA's writes, seen through the barrier, before the arrival */
        last = atomicAdd(ctr, 1) == expected - 1;
        if (last) *ctr = 0; /* ready for the next launch (stream order) */
    }
    __syncthreads();
    if (last) fence_acq_rel();
    return last;
}

enum { OP_EMBED, OP_NORM, OP_ADD, OP_LINEAR, OP_ROPE, OP_KV, OP_INDEX, OP_ATTN, OP_MLP, OP_MOE, OP_DSA, OP_COPY, OP_ARGMAX,
       OP_LOGPROB, OP_COUNT };
/* profiling brackets (no-ops unless m3_cuda_profile is on); nested ops are charged to the outer one */
void m3_cu_prof_begin(m3_cuda *c, int op);
void m3_cu_prof_end(m3_cuda *c, int op);

/* Tiled device layout of MXFP8 / NVFP4 matrices (N % 16 == 0): the tensor-core GEMV reads a
 * 16-row tile unit by unit (a unit: 32 values for MXFP8 = 32 bytes + 1 scale byte; 128 for
 * NVFP4 = 64 bytes + 8), so the device copy stores exactly that order: values
 * [N/16][K/UV][16 rows][UB bytes], scales [N/16][K/UV][16][SB] (MXFP8: see wt_soff). A warp's slice of a tile is
 * one contiguous run of memory (HBM pages read whole) instead of 16 rows' short pieces. */
static __host__ __device__ __forceinline__ int wt_ub(int fmt) { return fmt == M3_WF_NVFP4 ? 64 : 32; }
static __host__ __device__ __forceinline__ int wt_sb(int fmt) { return fmt == M3_WF_NVFP4 ? 8 : 1; }
/* byte offset of byte b of row n's values / scales in the tiled layout */
static __host__ __device__ __forceinline__ size_t wt_voff(int fmt, size_t row_bytes, int n, size_t b) {
    const int ub = wt_ub(fmt);
    return (size_t)(n >> 4) * 16 * row_bytes + (b / ub) * 16 * ub + (size_t)(n & 15) * ub + b % ub;
}
/* MXFP8 scales go by 4 units (one GEMV pipeline stage): [N/16][K/128][16 rows][4], so a lane
 * reads its row's 4 scales of a stage as one word (scale_row % 4 == 0: K % 128 == 0) */
static __host__ __device__ __forceinline__ size_t wt_soff(int fmt, size_t scale_row, int n, size_t j) {
    if (fmt != M3_WF_NVFP4) return (size_t)(n >> 4) * 16 * scale_row + (j / 4) * 64 + (size_t)(n & 15) * 4 + j % 4;
    const int sb = wt_sb(fmt);
    return (size_t)(n >> 4) * 16 * scale_row + (j / sb) * 16 * sb + (size_t)(n & 15) * sb + j % sb;
}

/* the formats and shapes stored tiled on the device */
int m3_cu_tileable(const m3_linear *W);

/* float -> uint32 with the same order, for integer reductions (redux.sync) over scores
 * (-0 sorts below +0: callers pass 0.0f for both; NaN is the caller's to handle) */
static __device__ __forceinline__ uint32_t fkey(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Programmatic dependent launch (Hopper): a kernel launched with m3_cu_pdl_attr may start while
 * the kernel before it in the stream is still running, once that one has called
 * pdl_trigger(); it must call pdl_wait() before reading anything the earlier kernels write or
 * writing anything they read. Outside such a launch both are no-ops. */
static __device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
static __device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
/* an integer switch from the environment (dflt when unset or empty) */
int m3_cu_env_int(const char *name, int dflt);
/* whether GEMV launches use it (M3_CUDA_PDL=1; off by default) */
int m3_cu_pdl_on(void);
/* whether ops are fused (M3_CUDA_FUSE, default 1) */
int m3_cu_fuse_on(void);

/* Records the first failure (sticky) and returns nonzero when e is an error. */
int m3_cu_fail(m3_cuda *c, cudaError_t e, const char *what, const char *file, int line);
#define CK(c, call) m3_cu_fail((c), (call), #call, __FILE__, __LINE__)
#define CK_LAUNCH(c, what) m3_cu_fail((c), cudaGetLastError(), what, __FILE__, __LINE__)
void m3_cu_failf(m3_cuda *c, const char *fmt, ...);

/* scratch slot of at least bytes (device), NULL + sticky error on failure */
void *m3_cu_scratch(m3_cuda *c, int slot, size_t bytes);
void *m3_cu_alloc(m3_cuda *c, size_t bytes);
/* builds device weights d in one arena: pass runs twice, first counting bytes, then carving */
int m3_cu_arena_build(m3_cuda *c, m3_weights *d, m3_err *err, int (*pass)(m3_cuda *, const void *, m3_weights *, m3_err *),
                      const void *arg);
void m3_cu_graphs_clear(m3_cuda *c);

/* The side stream: work that depends only on what the main stream has issued so far (the fork)
 * and that the main stream needs only later (the join), e.g. the MoE's shared expert beside the
 * router and the routed experts. Between m3_cu_side_begin and m3_cu_side_end ops launch on the
 * side stream with scratch slots, x-split buffers and GEMV arrival counters of their own, so the
 * two streams share nothing they write; m3_cu_side_join makes the main stream wait for the side's
 * work (CUDA graphs record the fork and join). begin returns 0 (nothing changed: run the work on
 * the main stream) when the side is off (M3_CUDA_SIDE=0, per-op profiling). */
int m3_cu_side_begin(m3_cuda *c);
void m3_cu_side_end(m3_cuda *c);
void m3_cu_side_join(m3_cuda *c);

/* ---- the ops, by the file that implements them (each names its CPU reference) ---- */
/* weights.cu: upload to the device arena, release */
int m3_cu_weights_upload(void *ctx, const m3_weights *h, m3_weights *d, m3_err *err);
void m3_cu_weights_release(void *ctx, m3_weights *w);
/* embed.cu */
void m3_cu_embed(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out);
void m3_cu_embed_dev(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out);
/* norm.cu */
void m3_cu_rmsnorm(void *ctx, const float *x, const float *w, int rows, int dim, float eps, float *out);
void m3_cu_add_rmsnorm(void *ctx, float *h, const float *o, const float *w, int rows, int dim, float eps, float *out);
/* the MoE's last step (moe.cu; with the add + norm after it: norm.cu): out[t] = sum_k wt[t][k]
 * ye[t][k] (+ sh[t]), rows of K slots */
typedef struct norm_combine {
    const float *ye, *wt, *sh;
    float *out;
    int K;
} norm_combine;
int m3_cu_combine_add_rmsnorm(m3_cuda *c, const norm_combine *cb, float *h, const float *w, int rows, int dim, float eps,
                              float *out);
/* elem.cu */
void m3_cu_add(void *ctx, float *y, const float *x, size_t n);
/* the routed experts at few slots per expert (gemm_ft.cu, precision bf16): m3_cu_moe_ft_ok says
 * whether the experts are taken (e0: a device copy's host struct); m3_cu_moe_ft writes
 * ye[slot][H] = down(SwiGLU-OAI(gate x, up x)) of every slot's expert (pick[T * K] on the device,
 * tab the device table) using work (device, m3_cu_moe_ft_work bytes); 0, or -1 (c failed) */
int m3_cu_moe_ft_ok(const m3_mlp_w *e0);
/* y[i] [T][N] = x [T][K] W[i]^T for n matrices of one format and K sharing x (gemm_ft.cu, precision
 * bf16, meant for 9-64 tokens): m3_cu_linear_ft_ok says whether a matrix is taken; 0, or -1 (c failed) */
int m3_cu_linear_ft_ok(const m3_linear *W);
int m3_cu_linear_ft(m3_cuda *c, int n, const m3_linear *const *W, const float *x, int T, float *const *y);
int m3_cu_moe_ft_act_ok(float alpha, float limit);
size_t m3_cu_moe_ft_work(int T, int K, int E, int H, int F);
int m3_cu_moe_ft(m3_cuda *c, const m3_mlp_w *tab, const m3_mlp_w *e0, const float *x, int T, int K, int E,
                            const int32_t *pick, void *work, float alpha, float limit, float *ye);
/* precision bf16: n linears sharing x on the wgmma GEMM (gemm_tc.cu) at any T; 1 when done (or
 * failed: c->failed), 0 when not taken (every W must be) */
int m3_cu_linear_tc_n(m3_cuda *c, int n, const m3_linear *const *W, const float *x, int T, float *const *y);
/* split: write out's f16 split too (the down projection's input on the GEMVs) */
void m3_cu_swiglu(m3_cuda *c, const float *gate, const float *up, size_t n, float alpha, float limit, float *out, int split);
/* rope.cu */
void m3_cu_head_norm_rope(void *ctx, float *x, int T, int heads, int dim, const float *w, float eps, int rotary_dim,
                          double theta, const int32_t *pos);
void m3_cu_head_norm_rope_n(void *ctx, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim, double theta,
                            const int32_t *pos);
/* kv_store.cu */
void m3_cu_kv_store(void *ctx, m3_kv *kv, int layer, const m3_batch *b, const float *k, const float *v, const float *ik);
void m3_cu_argmax_rows(void *ctx, const float *x, int rows, int n, size_t ld, int32_t *out);
void m3_cu_argmax_rows_fin(void *ctx, const float *x, int rows, int n, int nf, size_t ld, int32_t *out, int32_t *fin);
/* logprob.cu */
void m3_cu_logprob_rows(void *ctx, const float *x, int rows, int n, int V, size_t ld, const int32_t *tok, int k,
                        m3_row_lp *out);
void m3_cu_draw_rows(void *ctx, float *x, int rows, int V, size_t ld, const m3_draw_param *par, int32_t *out);
void m3_cu_draw_rows_dev(void *ctx, float *x, int rows, int V, size_t ld, const m3_draw_param *par, int32_t *out);
void m3_cu_verify_rows(void *ctx, const float *x, int V, size_t ld, int n, const m3_verify_group *g, int32_t *out);
void m3_cu_dspark_attention_n(void *ctx, int nreq, const m3_dspark_attn_req *rq, const float *q, const float *kb,
                              const float *vb, int n, int nh, int nkv, int D, int window, float *out);
void m3_cu_dspark_attention(void *ctx, const float *q, const float *kb, const float *vb, int n, int nh, int nkv, int D,
                            const float *kr, const float *vr, int cap, int lo, int len, int pos, int window, float *out);
int m3_cu_dspark_attention_table(void *ctx, int nl, int nreq, const m3_dspark_attn_req *rq, int n, int nh, int nkv, int D,
                                 int window);
void m3_cu_head_norm_rope_store(void *ctx, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim, double theta,
                                m3_kv *kv, int layer, const m3_batch *b, const float *v);
/* indexer.cu */
void m3_cu_index_select(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *iq, int ni, int block,
                        int topk, int local, int init, int32_t *sel);
/* attention.cu */
void m3_cu_attention(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *q, int nh,
                     const int32_t *sel, int block, int topk, float *out);
/* attention_tile.cu: prefill attention in token tiles (for caches the tensor-core attention takes;
 * np: q and P in np = 3 bf16 parts or np = 1, attn_mma.cuh); 0 when it ran, -1 on failure
 * (recorded in c), 1 when the step or shape is not one it takes */
int m3_cu_attention_tile(m3_cuda *c, const m3_kv *kv, int layer, int t0, int T, const float *q, int nh, const int32_t *sel,
                         int block, int topk, int np, float *out);
/* whether token tiles of tt tokens take T tokens of the step (attention_tile.cu; M3_ATTN_TILE) */
int m3_cu_attn_tiles_fit(m3_cuda *c, int T, int tt, int nkv);
/* attention_wg.cu: the same tiles on wgmma (precision bf16; bf16, FP8, NVFP4 caches; D 64 / 128); returns as
 * m3_cu_attention_tile does */
int m3_cu_attention_wg(m3_cuda *c, const m3_kv *kv, int layer, int t0, int T, const float *q, int nh, const int32_t *sel,
                       int block, int topk, int np, float *out);
/* linear.cu: dispatch (tensor cores, SIMT GEMV, bf16 cuBLAS, dequantize + SGEMM) */
void m3_cu_linear(void *ctx, const m3_linear *W, const float *x, int T, float *y);
void m3_cu_linear_n(void *ctx, int n, const m3_linear *const *W, const float *x, int T, float *const *y);
/* linear_mma.cu: tensor-core GEMV, 0 when it ran, -1 when the format / shape is not one it takes */
int m3_cu_mma_ok(const m3_linear *W);
int m3_cu_gemv_mma(m3_cuda *c, const m3_linear *W, const float *x, int T, float *y);
int m3_cu_gemv_mma_n(m3_cuda *c, int n, const m3_linear *const *W, const float *x, int T, float *const *y);
/* linear_mma.cu, the split cache: forget splits of memory an op writes; a buffer for a kernel to
 * write the split of x[n] into (hi, then lo n values further), registered as x's split */
void m3_cu_xsplit_reset(m3_cuda *c);
/* The split is read by the tensor-core GEMVs alone, which take up to 64 rows (linears) and 256
 * (the MoE's grouped experts); past m3_cu_xsplit_rows() rows (256; $M3_XSPLIT_ROWS) the wgmma
 * GEMM or cuBLAS reads x itself, so the ops that write an activation (RMSNorm, SwiGLU) write no
 * split there (a GEMV that wants one still gets it: m3_cu_xsplit_get splits what no cache holds). */
int m3_cu_xsplit_rows(void);
void m3_cu_xsplit_touch(m3_cuda *c, const void *p, size_t bytes);
uint16_t *m3_cu_xsplit_claim(m3_cuda *c, const float *x, size_t n);
/* linear.cu: precision bf16, a GEMM path that reads f32 x: x rounded to bf16 (a scratch copy), x
 * itself in exact mode; NULL on failure (recorded in c) */
const float *m3_cu_gemm_input(m3_cuda *c, const float *x, size_t n);
/* router.cu: the MoE router's logits, picks [T][K] and weights [T][K] (routing scratch); -1 on failure */
int m3_cu_route(m3_cuda *c, const m3_layer_w *L, const float *x, int T, int E, int K, float routed_scale, int32_t **pick,
                float **wt);
/* moe.cu: the dense MLP, the MoE (+ the add + norm after it), the expert launches on the tensor cores */
void m3_cu_mlp(void *ctx, const m3_mlp_w *m, const float *x, int T, float alpha, float limit, float *out);
void m3_cu_moe(void *ctx, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out);
void m3_cu_moe_add_rmsnorm(void *ctx, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out, float *h,
                           const float *w, float eps, float *normed);
/* act_quant.cu: x [T, H] quantized to NVFP4 per token and back, into out (the CPU's rule,
 * src/backend/cpu/act_quant.c; H a multiple of 16, rows 16-byte aligned), and when xs is given the
 * f16 split of out (hi [T * H], then lo; split_store, rounded to bf16 first under c->gemm_bf16);
 * -1 on failure (recorded) */
int m3_cu_act_quant_nvfp4(m3_cuda *c, const float *x, int T, int H, float *out, uint16_t *xs);
int m3_cu_moe_grouped(m3_cuda *c, const m3_mlp_w *host_e0, const m3_mlp_w *tab, const int32_t *pick, int T, int topk,
                      int E, int part, const float *x, int xstride, float *out);
int m3_cu_moe_mma(m3_cuda *c, const m3_mlp_w *host_e0, const m3_mlp_w *tab, const int32_t *pick, int topk, int S, int part,
                  const float *x, int xstride, float *out);
/* vision.cu */
void m3_cu_vision_ops(m3_ops *ops);

/* ---- device helpers ---- */
/* D += A B on the tensor cores, m16n8k16, f16 inputs, f32 sums (a warp's fragments, PTX ISA layout) */
static __device__ __forceinline__ void mma16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* f16x2 product with one half of b in both lanes (HMUL2's operand swizzle: no extra instruction) */
template <int H> static __device__ __forceinline__ uint32_t hmul2_bc(uint32_t a, uint32_t b) {
    const __half2 bb = *(const __half2 *)&b;
    __half2 r = __hmul2(*(const __half2 *)&a, H ? __high2half2(bb) : __low2half2(bb));
    return *(uint32_t *)&r;
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) { /* exact: integer counts, masses */
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* f16 hi / lo of v: the split the tensor-core GEMV multiplies (linear_mma.cu); rb (precision
 * bf16): of v rounded to bf16 first, so that every GEMM input is bf16 in that mode, as on the CPU */
static __device__ __forceinline__ void split_store(float v, uint16_t *hi, uint16_t *lo, int rb) {
    if (rb) v = __bfloat162float(__float2bfloat16_rn(v));
    __half h = __float2half_rn(v), l = __float2half_rn(v - __half2float(h));
    *hi = *(uint16_t *)&h;
    *lo = *(uint16_t *)&l;
}

/* block-wide sum of a double (blockDim.x a multiple of 32, <= 1024); part: 32 shared doubles.
 * Starts with a barrier, so one part array serves consecutive calls. */
static __device__ __forceinline__ double block_sum_d(double v, double *part) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads();
    if (l == 0) part[w] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < (int)blockDim.x / 32; i++) s += part[i];
    return s;
}

/* block-wide max of a float, the same shape as block_sum_d (part: 32 shared floats) */
static __device__ __forceinline__ float block_max_f(float v, float *part) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads();
    if (l == 0) part[w] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int i = 0; i < (int)blockDim.x / 32; i++) m = fmaxf(m, part[i]);
    return m;
}

/* thread block clusters (sm_90): this CTA's rank and the cluster's size, a barrier of every
 * thread of the cluster (release / acquire: shared-memory writes before it are seen after it),
 * and a double from CTA `rank`'s shared memory at the address of p in this CTA's */
static __device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
static __device__ __forceinline__ uint32_t cluster_size() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
    return r;
}
static __device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ double cluster_ld_f64(const double *p, uint32_t rank) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p), ra;
    double v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(rank));
    asm volatile("ld.shared::cluster.f64 %0, [%1];\n" : "=d"(v) : "r"(ra) : "memory");
    return v;
}

/* NeoX RoPE on the first rot channels of one head at v, by a warp (lane): channel j < rot / 2
 * turns with j + rot / 2 by the angle p / theta^(2j / rot), in f32 as the reference computes it */
static __device__ __forceinline__ void rope_rotate(float *v, int rot, float theta, float p, int lane) {
    const int half = rot / 2;
    for (int j = lane; j < half; j += 32) {
        float e = (float)(2 * j) / (float)rot;
        float inv = 1.0f / powf(theta, e);
        float a = p * inv, cs, sn;
        sincosf(a, &sn, &cs);
        float x0 = v[j], x1 = v[j + half];
        v[j] = x0 * cs - x1 * sn;
        v[j + half] = x1 * cs + x0 * sn;
    }
}

/* out[i] (float4 i of a row at row) = RMSNorm scaling of v (Gemma: x r (1 + w)), with the f16
 * split of the four values when xs is given (hi at xs, lo n values further) */
static __device__ __forceinline__ void norm_store4(float4 v, float4 wv, float r, float *out, uint16_t *xs, size_t n,
                                                   size_t row, int i, int rb) {
    float4 y;
    y.x = (v.x * r) * (1.0f + wv.x);
    y.y = (v.y * r) * (1.0f + wv.y);
    y.z = (v.z * r) * (1.0f + wv.z);
    y.w = (v.w * r) * (1.0f + wv.w);
    ((float4 *)(out + row))[i] = y;
    if (xs) {
        const size_t k = row + 4 * (size_t)i;
        split_store(y.x, xs + k, xs + n + k, rb);
        split_store(y.y, xs + k + 1, xs + n + k + 1, rb);
        split_store(y.z, xs + k + 2, xs + n + k + 2, rb);
        split_store(y.w, xs + k + 3, xs + n + k + 3, rb);
    }
}

static inline unsigned cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

#endif
