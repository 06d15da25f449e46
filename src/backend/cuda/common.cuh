/* Shared by the CUDA backend's .cu files: the context, error checks, and the number-format
 * decoders used inside kernels (the device twins of src/base/num.h). */
#ifndef M3_CUDA_COMMON_CUH
#define M3_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "cuda.h"

/* grow-only scratch buffers, one per purpose (no allocation inside a steady-state step) */
enum { SC_IDS, SC_DEQ, SC_XE, SC_YE, SC_MOE, SC_ROUTE, SC_ATT, SC_IDX, SC_META, SC_TMP, SC_XSPLIT, SC_XSPLIT2, SC_COUNT };

typedef struct m3_cuda {
    int dev, sm_count;
    size_t smem_optin;
    size_t smem_per_sm;        /* shared memory of one SM (all its resident CTAs) */
    cudaStream_t st;
    cublasHandle_t blas;
    char name[128];
    int failed;
    char errmsg[512];
    void *sc[SC_COUNT];
    size_t sc_bytes[SC_COUNT];
    size_t allocated, peak;
    /* weight arena (m3_cu_alloc while uploading weights): 1 = counting bytes only (no copies,
     * no launches), 2 = carving from wa_base; 0 = plain cudaMalloc */
    int wa_mode;
    uint8_t *wa_base;
    size_t wa_size, wa_used;
    /* the current step (begin_step): device copies of positions, sequence of each token,
     * page table rows [n_seqs][ptab_stride] and sequence lengths */
    const void *step_b;
    int T, n_seqs, ptab_stride, max_pos;
    int32_t *d_pos, *d_seq, *d_ptab, *d_ids;
    const m3_kv *step_kv;
    /* recorded decode graphs (cu_graph_begin / cu_graph_end) */
    int graphs_on, capturing, scratch_grew, n_graphs, n_seen;
    uint64_t capture_key, graph_clock, seen[64];
    long graph_replays;
    struct { uint64_t key, used; cudaGraphExec_t exec; } graphs[16];
    int32_t *h_meta;            /* pinned staging */
    size_t h_meta_cap;
    /* per-op timing for benchmarks (m3_cuda_profile): event pairs around each op */
    int prof, prof_depth;
    int prof_n, prof_cap;
    struct { int op; cudaEvent_t a, b; } *prof_ev;
    double prof_ms[16];
    long prof_calls[16];
    /* f16 hi / lo splits of activation buffers (gemv_mma.cu), and the tensor-core GEMV's
     * arrival counters (zero between launches) */
    struct { const float *src; size_t n; uint16_t *buf; } xs[2];
    int xs_next;
    void *blas_ws;              /* cuBLAS workspace (set on the handle) */
    size_t blas_ws_bytes;
    int *ctr;
    long ctr_n;                 /* GEMV arrival counters; CTR_AUX more follow them (ctr_aux) */
    /* expert counting for benchmarks */
    int count_experts;
    long experts_used;
    uint8_t *h_pick_seen;       /* host scratch */
    int32_t *h_pick;
    size_t h_pick_cap;
} m3_cuda;

/* MoE grouped by expert on the tensor cores (gemv_mma.cu): at most MOE_GROUP_T tokens and
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

enum { OP_EMBED, OP_NORM, OP_ADD, OP_LINEAR, OP_ROPE, OP_KV, OP_INDEX, OP_ATTN, OP_MLP, OP_MOE, OP_COUNT };
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
/* NVFP4 values in the tiled layout are also bit-permuted inside each 32-bit word (8 E2M1 codes;
 * code j = values 8i + j of the word's row piece, code 0 the low nibble of its first byte): the
 * sign of code j sits at bit wt_nv_sbit(j), its 3 magnitude bits from wt_nv_ebit(j) up. Codes
 * 2p and 2p + 1 then become an f16 pair (value x 2^-14: sign at bit 15, exponent and mantissa
 * bits at 9..11 of each half) with one or two shifts and masks (nv_pair), no table:
 *   pair 0: w & 0x8E008E00   pair 1: (w << 3) & 0x8E008E00
 *   pair 2: ((w << 9) & 0x0E000E00) | ((w << 2) & 0x80008000)   pair 3: the same with 6 and 1
 * (pairs 2 and 3 computed as one multiply of the masked word: see nv_pair) */
static __host__ __device__ __forceinline__ int wt_nv_sbit(int j) {
    const int p = (j >> 1) & 3;
    return (p == 0 ? 15 : p == 1 ? 12 : p == 2 ? 13 : 14) + 16 * (j & 1);
}
static __host__ __device__ __forceinline__ int wt_nv_ebit(int j) {
    const int p = (j >> 1) & 3;
    return (p == 0 ? 9 : p == 1 ? 6 : p == 2 ? 0 : 3) + 16 * (j & 1);
}
/* 8 codes in plain order (code j at bits 4j..4j+3) -> the permuted word, and back */
static __host__ __device__ __forceinline__ uint32_t wt_nv_perm(uint32_t plain) {
    uint32_t w = 0;
    for (int j = 0; j < 8; j++) {
        const uint32_t c = (plain >> (4 * j)) & 15u;
        w |= ((c >> 3) << wt_nv_sbit(j)) | ((c & 7u) << wt_nv_ebit(j));
    }
    return w;
}
static __host__ __device__ __forceinline__ uint32_t wt_nv_code(uint32_t w, int j) {
    return (((w >> wt_nv_sbit(j)) & 1u) << 3) | ((w >> wt_nv_ebit(j)) & 7u);
}

/* f16 pair P (0-3) of a permuted word: codes 2P and 2P + 1, each value x 2^-14 */
template <int P> static __host__ __device__ __forceinline__ uint32_t nv_pair(uint32_t w) {
    if (P == 0) return w & 0x8E008E00u;
    if (P == 1) return (w << 3) & 0x8E008E00u;
    /* pairs 2 and 3 move magnitude and sign by different shifts: one multiply adds both shifted
     * copies of the masked word (no carry reaches a kept bit), so a mask, an IMAD and a mask
     * instead of two shifts and two masks, and the IMAD runs beside the ALU's masks */
    if (P == 2) return ((w & 0x20072007u) * 516u) & 0x8E008E00u; /* << 9 (magnitude) + << 2 (sign) */
    return ((w & 0x40384038u) * 66u) & 0x8E008E00u;             /* << 6 + << 1 */
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

/* ops implemented in the kernel files */
void m3_cu_embed(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out);
void m3_cu_rmsnorm(void *ctx, const float *x, const float *w, int rows, int dim, float eps, float *out);
void m3_cu_add(void *ctx, float *y, const float *x, size_t n);
void m3_cu_add_rmsnorm(void *ctx, float *h, const float *o, const float *w, int rows, int dim, float eps, float *out);
void m3_cu_head_norm_rope(void *ctx, float *x, int T, int heads, int dim, const float *w, float eps, int rotary_dim,
                          double theta, const int32_t *pos);
void m3_cu_head_norm_rope_n(void *ctx, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim, double theta,
                            const int32_t *pos);
void m3_cu_vision_ops(m3_ops *ops); /* vision.cu */
void m3_cu_swiglu(m3_cuda *c, const float *gate, const float *up, size_t n, float alpha, float limit, float *out);
void m3_cu_linear(void *ctx, const m3_linear *W, const float *x, int T, float *y);
void m3_cu_mlp(void *ctx, const m3_mlp_w *m, const float *x, int T, float alpha, float limit, float *out);
void m3_cu_moe(void *ctx, const m3_layer_w *L, const float *x, int T, int E, int K, float routed_scale, float alpha,
               float limit, float *out);
void m3_cu_kv_store(void *ctx, m3_kv *kv, int layer, const m3_batch *b, const float *k, const float *v, const float *ik);
/* the MoE's last step (elem.cu): out[t] = sum_k wt[t][k] ye[t][k] (+ sh[t]), rows of K slots */
typedef struct norm_combine {
    const float *ye, *wt, *sh;
    float *out;
    int K;
} norm_combine;
int m3_cu_combine_add_rmsnorm(m3_cuda *c, const norm_combine *cb, float *h, const float *w, int rows, int dim, float eps,
                              float *out);
void m3_cu_moe_add_rmsnorm(void *ctx, const m3_layer_w *L, const float *x, int T, int E, int K, float routed_scale,
                           float alpha, float limit, float *out, float *h, const float *w, float eps, float *normed);
void m3_cu_head_norm_rope_store(void *ctx, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim, double theta,
                                m3_kv *kv, int layer, const m3_batch *b, const float *v);
void m3_cu_index_select(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *iq, int ni, int block,
                        int topk, int local, int init, int32_t *sel);
void m3_cu_attention(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *q, int nh,
                     const int32_t *sel, int block, int topk, float *out);

/* tensor-core GEMV (gemv_mma.cu): 0 when it ran, -1 when the format / shape is not one it takes */
int m3_cu_mma_ok(const m3_linear *W);
int m3_cu_gemv_mma(m3_cuda *c, const m3_linear *W, const float *x, int T, float *y);
int m3_cu_gemv_mma_n(m3_cuda *c, int n, const m3_linear *const *W, const float *x, int T, float *const *y);
/* the split cache: forget splits of memory an op writes; a buffer for a kernel to write the
 * split of x[n] into (hi, then lo n values further), registered as x's split */
void m3_cu_xsplit_reset(m3_cuda *c);
void m3_cu_xsplit_touch(m3_cuda *c, const void *p, size_t bytes);
uint16_t *m3_cu_xsplit_claim(m3_cuda *c, const float *x, size_t n);
void m3_cu_linear_n(void *ctx, int n, const m3_linear *const *W, const float *x, int T, float *const *y);
int m3_cu_moe_grouped(m3_cuda *c, const m3_mlp_w *host_e0, const m3_mlp_w *tab, const int32_t *pick, int T, int topk,
                      int E, int part, const float *x, int xstride, float *out);
int m3_cu_moe_mma(m3_cuda *c, const m3_mlp_w *host_e0, const m3_mlp_w *tab, const int32_t *pick, int topk, int S, int part,
                  const float *x, int xstride, float *out);

/* ------------------------------------------------------------------ device decoders */

/* E8M0 scale byte B (0-3) of a word as an f32 2^(e-127): a shift and a mask. Exact for codes
 * 1..254 only; tiled MXFP8 matrices hold no other (backend.cu keeps a matrix with a 0 or 255
 * scale row-major, read through e8m0_f32). */
template <int B> static __host__ __device__ __forceinline__ float e8_of(uint32_t w) {
    const uint32_t b = (B < 3 ? w << (23 - 8 * B) : w >> 1) & 0x7f800000u;
#ifdef __CUDA_ARCH__
    return __uint_as_float(b);
#else
    float f;
    memcpy(&f, &b, 4);
    return f;
#endif
}
/* E8M0: 2^(b-127); 255 NaN; b = 0 is 2^-127 (an f32 subnormal) */
static __device__ __forceinline__ float e8m0_f32(uint32_t b) {
    return b == 255 ? __int_as_float(0x7fc00000) : b ? __int_as_float((int)(b << 23)) : __int_as_float(0x00400000);
}
/* E4M3 (fn): exact through the hardware converter (to f16, exact for every E4M3 value) */
static __device__ __forceinline__ float e4m3_f32(uint32_t b) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(h));
}
/* two E4M3 bytes (low byte first) -> two floats */
static __device__ __forceinline__ float2 e4m3x2_f32(uint32_t two) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    return __half22float2(__half2(h));
}
/* E2M1 code (low 4 bits) -> value * 2^-14 as an f16 bit pattern: magnitude bits e(2) m(1)
 * placed at f16 bits 9..11 give 2^(e-15)(1 + m/2) (e > 0) or m 2^-15 (e = 0), i.e. the
 * E2M1 value times 2^-14, exactly; the caller folds 2^14 into the block scale. */
static __device__ __forceinline__ uint32_t e2m1_h16(uint32_t code) {
    return ((code & 7u) << 9) | ((code & 8u) << 12);
}
/* one byte of two E2M1 codes (low nibble first) -> two floats (times 2^-14) */
static __device__ __forceinline__ float2 e2m1x2_f32(uint32_t byte) {
    uint32_t bits = e2m1_h16(byte & 15u) | (e2m1_h16(byte >> 4) << 16);
    __half2_raw r;
    r.x = (unsigned short)(bits & 0xffff);
    r.y = (unsigned short)(bits >> 16);
    return __half22float2(__half2(r));
}
static __device__ __forceinline__ float bf16_f32(uint32_t h) { return __int_as_float((int)(h << 16)); }
static __device__ __forceinline__ float f16_f32(uint32_t h) {
    __half_raw r;
    r.x = (unsigned short)h;
    return __half2float(__half(r));
}

/* f32 -> E4M3 RNE saturating to +-448 (NaN -> 0x7f), as m3_f32_to_e4m3 */
static __device__ __forceinline__ uint8_t f32_e4m3(float f) {
    if (f != f) return 0x7f;
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
}
/* nearest E2M1 code (|x| saturated at 6; exact ties to the even code), as m3_f32_to_e2m1 */
static __device__ __forceinline__ uint32_t f32_e2m1(float x) {
    const float vals[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    uint32_t sign = signbit(x) ? 8u : 0u;
    float a = fabsf(x);
    if (!(a <= 6.0f)) a = 6.0f;
    int best = 0;
    float bd = a;
#pragma unroll
    for (int i = 1; i < 8; i++) {
        float d = fabsf(a - vals[i]);
        if (d < bd || (d == bd && (i & 1) == 0)) { bd = d; best = i; }
    }
    return best ? (sign | (uint32_t)best) : 0u;
}
static __device__ __forceinline__ uint16_t f32_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* f16 hi / lo of v: the split the tensor-core GEMV multiplies (gemv_mma.cu) */
static __device__ __forceinline__ void split_store(float v, uint16_t *hi, uint16_t *lo) {
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
                                                   size_t row, int i) {
    float4 y;
    y.x = (v.x * r) * (1.0f + wv.x);
    y.y = (v.y * r) * (1.0f + wv.y);
    y.z = (v.z * r) * (1.0f + wv.z);
    y.w = (v.w * r) * (1.0f + wv.w);
    ((float4 *)(out + row))[i] = y;
    if (xs) {
        const size_t k = row + 4 * (size_t)i;
        split_store(y.x, xs + k, xs + n + k);
        split_store(y.y, xs + k + 1, xs + n + k + 1);
        split_store(y.z, xs + k + 2, xs + n + k + 2);
        split_store(y.w, xs + k + 3, xs + n + k + 3);
    }
}

static inline unsigned cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

#endif
