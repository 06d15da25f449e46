/* Linear layers on the GPU: the dispatch, and the SIMT GEMV for every weight format.
 * CPU reference: src/backend/cpu/linear.c (m3_cpu_linear).
 *
 * linear, up to 8 tokens: MXFP8 / NVFP4 on the tensor cores (linear_mma.cu); BF16 at 1 token and
 * other formats: the SIMT GEMV here. A CTA of 8 warps owns 32 output rows (4 per warp, so each
 * x value read from shared memory serves 4 rows); each lane streams 16-byte chunks of its
 * rows (16 MXFP8 values, 32 NVFP4 values, 8 BF16...) and decodes them in registers; the
 * block scales multiply partial sums. x is staged in shared memory in K tiles. Every weight
 * byte is read once per call; accumulation is f32. BF16 at 2-8 tokens (the lm_head of a
 * verify pass, the router): cuBLAS on the tensor cores with x in three bf16 parts.
 * linear, more tokens: the weight is dequantized to f32 in row chunks and multiplied by
 * cuBLAS SGEMM in pedantic f32 (exact products, no TF32): prefill correctness first. */
#include <stdlib.h>
#include <string.h>

#include "gemm_tc.h"
#include "linear_simt.cuh"
#include "router.cuh"

/* A CTA per GW x GR rows, x staged in KT-column tiles. persist (x whole in one tile): the CTAs
 * stay resident, stage x once, and take row groups blockIdx.x, + gridDim.x, ... (the BF16
 * lm_head at one token: 6,252 CTAs each staging 24 KB of x added 150 MB of L2 reads to 2.46 GB
 * of weights, and ran at 4.2 TB/s) */
template <int F, int NT>
__global__ void __launch_bounds__(GW * 32) k_gemv_simt(m3_linear W, const float *x, int T, int t0, float *y, int KT, int persist,
                                                       int rb) {
    extern __shared__ float xs[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const uint8_t *rw[GR], *rs[GR];
    float gm[GR], acc[GR][NT];
    bool ok[GR];
    if (persist) {
        stage_x<NT>(x, W.K, T, t0, 0, W.K, xs, KT, rb);
        __syncthreads();
        const int groups = (W.N + GW * GR - 1) / (GW * GR);
        for (int rg = blockIdx.x; rg < groups; rg += gridDim.x) {
            const int n0 = rg * (GW * GR) + warp * GR;
            warp_rows_setup<NT>(W, n0, rw, rs, gm, ok, acc);
            warp_rows<F, NT, GR>(rw, rs, gm, ok, 0, W.K, xs, KT, acc);
            rows_store<NT>(acc, ok, lane, t0, T, y, W.N, n0);
        }
        return;
    }
    const int n0 = blockIdx.x * (GW * GR) + warp * GR;
    warp_rows_setup<NT>(W, n0, rw, rs, gm, ok, acc);
    for (int kt0 = 0; kt0 < W.K; kt0 += KT) {
        int klen = W.K - kt0 < KT ? W.K - kt0 : KT;
        __syncthreads();
        stage_x<NT>(x, W.K, T, t0, kt0, klen, xs, KT, rb);
        __syncthreads();
        warp_rows<F, NT, GR>(rw, rs, gm, ok, kt0, klen, xs, KT, acc);
    }
    rows_store<NT>(acc, ok, lane, t0, T, y, W.N, n0);
}

/* Few rows (the MoE router: 128 x 6144): a CTA per GR rows (and K part: ra.kparts), its warps
 * splitting the CTA's K range into GW slices (a warp per GR rows over all of K kept 4 SMs
 * busy; 32 CTAs over all of K took 13.5 us at one token, most of it waiting on memory); sums
 * added in warp order, then in K-part order (deterministic). klen of a slice: a multiple of
 * the format's chunk. x is staged in shared memory where NT rows of the range fit (staged),
 * else read where it lies (T = NT rows from t0; 8 tokens of the router: 196 KB). With ra.ctr,
 * the routing step after it (route_args). */
template <int F, int NT>
__global__ void __launch_bounds__(GW * 32) k_gemv_simt_splitk(m3_linear W, const float *x, int T, int t0, float *y, int slice,
                                                      route_args ra, int staged, int rb) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    const int kparts = ra.ctr && ra.kparts > 1 ? ra.kparts : 1, Kc = W.K / kparts;
    const int ng = gridDim.x / kparts, kp = blockIdx.x / ng, kb = kp * Kc;
    extern __shared__ float xs[]; /* staged: [NT][Kc]; then [GW][GR][NT]; then the routing scratch */
    float *red = staged ? xs + (size_t)NT * Kc : xs;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, n0 = (blockIdx.x % ng) * GR;
    const uint8_t *rw[GR], *rs[GR];
    float gm[GR], acc[GR][NT];
    bool ok[GR];
    warp_rows_setup<NT>(W, n0, rw, rs, gm, ok, acc);
    if (staged) {
        stage_x<NT>(x, W.K, T, t0, kb, Kc, xs, Kc, rb);
        __syncthreads();
    }
    const float *xk = staged ? xs : x + (size_t)t0 * W.K + kb;
    const int k0 = warp * slice, klen = Kc - k0 < slice ? Kc - k0 : slice;
    if (klen > 0) warp_rows<F, NT, GR>(rw, rs, gm, ok, kb + k0, klen, xk + k0, staged ? Kc : W.K, acc);
#pragma unroll
    for (int r = 0; r < GR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = warp_sum(acc[r][t]);
            if (lane == 0) red[(warp * GR + r) * NT + t] = v;
        }
    __syncthreads();
    if (threadIdx.x < GR * NT) {
        const int r = threadIdx.x / NT, t = threadIdx.x % NT;
        float v = 0;
        for (int w = 0; w < GW; w++) v += red[(w * GR + r) * NT + t];
        if (ok[r] && t0 + t < T) {
            if (kparts > 1) ra.part[((size_t)kp * NT + t) * W.N + n0 + r] = v;
            else y[(size_t)(t0 + t) * W.N + n0 + r] = v;
        }
    }
    if (ra.ctr && last_cta(ra.ctr, gridDim.x)) { /* the logits of every token are in: route them */
        if (kparts > 1) {
            for (int i = threadIdx.x; i < T * W.N; i += blockDim.x) {
                float v = 0;
                for (int q = 0; q < kparts; q++) v += __ldcg(ra.part + ((size_t)q * NT + i / W.N) * W.N + i % W.N);
                y[i] = v;
            }
            __syncthreads();
        }
        for (int t = warp; t < T; t += GW)
            route_token(y + (size_t)t * W.N, ra.bias, ra.E, ra.K, ra.scale, ra.pick + (size_t)t * ra.K, ra.wt + (size_t)t * ra.K,
                        red + GW * GR * NT + (size_t)warp * (2 * ra.E + ra.K), lane);
    }
}

/* any shape: a warp per row, element by element (tiny odd shapes only) */
static __device__ __forceinline__ float decode_at(const m3_linear &W, int n, int k) {
    if (W.tiled) { /* MXFP8 / NVFP4 in the tiled layout (common.cuh) */
        if (W.fmt == M3_WF_MXFP8)
            return e4m3_f32(W.w[wt_voff(W.fmt, W.row_bytes, n, (size_t)k)]) *
                   e8m0_f32(W.scale[wt_soff(W.fmt, W.scale_row, n, (size_t)k / 32)]);
        const uint32_t word = *(const uint32_t *)(W.w + wt_voff(W.fmt, W.row_bytes, n, (size_t)(k / 2) & ~(size_t)3));
        return e2m1_f32(wt_nv_code(word, k & 7)) * (e4m3_f32(W.scale[wt_soff(W.fmt, W.scale_row, n, (size_t)k / 16)]) * W.gmul);
    }
    const uint8_t *row = W.w + (size_t)n * W.row_bytes;
    switch (W.fmt) {
    case M3_WF_F32: return ((const float *)row)[k];
    case M3_WF_BF16: return bf16_f32(((const uint16_t *)row)[k]);
    case M3_WF_F16: return f16_f32(((const uint16_t *)row)[k]);
    case M3_WF_MXFP8: return e4m3_f32(row[k]) * e8m0_f32(W.scale[(size_t)n * W.scale_row + k / 32]);
    default: return e2m1_f32(e2m1_at(row, k)) * (e4m3_f32(W.scale[(size_t)n * W.scale_row + k / 16]) * W.gmul);
    }
}

__global__ void k_gemv_by_element(m3_linear W, const float *x, int T, float *y) {
    int n = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
    if (n >= W.N) return;
    for (int t = 0; t < T; t++) {
        float s = 0;
        for (int k = lane; k < W.K; k += 32) s += decode_at(W, n, k) * x[(size_t)t * W.K + k];
        s = warp_sum(s);
        if (lane == 0) y[(size_t)t * W.N + n] = s;
    }
}

/* rows [n0, n0 + rows) of W as f32 [rows][K] */
__global__ void k_dequant_rows_f32(m3_linear W, int n0, int rows, float *out) {
    size_t total = (size_t)rows * W.K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / W.K), k = (int)(i % W.K);
        out[i] = decode_at(W, n0 + r, k);
    }
}

int m3_cu_simt_ok(const m3_linear *W) {
    if (W->tiled) return 0; /* rows are not contiguous: k_gemv_by_element (decode_at) */
    int V = W->fmt == M3_WF_F32 ? 4 : W->fmt == M3_WF_BF16 || W->fmt == M3_WF_F16 ? 8 : W->fmt == M3_WF_MXFP8 ? 16 : 32;
    return W->K % V == 0 && W->row_bytes % 16 == 0 && ((uintptr_t)W->w & 15) == 0;
}

/* kernel<W's format, NT><<<g, GW warps, smem>>>(*W, x, T, t0, y, ...) */
#define GEMV_LAUNCH(kernel, ...)                                                                                      \
    switch (W->fmt) {                                                                                                 \
    case M3_WF_F32: kernel<M3_WF_F32, NT><<<g, GW * 32, smem, c->st>>>(*W, x, T, t0, y, __VA_ARGS__); break;          \
    case M3_WF_BF16: kernel<M3_WF_BF16, NT><<<g, GW * 32, smem, c->st>>>(*W, x, T, t0, y, __VA_ARGS__); break;        \
    case M3_WF_F16: kernel<M3_WF_F16, NT><<<g, GW * 32, smem, c->st>>>(*W, x, T, t0, y, __VA_ARGS__); break;          \
    case M3_WF_MXFP8: kernel<M3_WF_MXFP8, NT><<<g, GW * 32, smem, c->st>>>(*W, x, T, t0, y, __VA_ARGS__); break;      \
    default: kernel<M3_WF_NVFP4, NT><<<g, GW * 32, smem, c->st>>>(*W, x, T, t0, y, __VA_ARGS__); break;               \
    }

/* resident k_gemv_simt CTAs per SM for W's format with smem bytes (at least 1), asked of the runtime
 * once per (format, smem): its answer does not change between launches. Threads of a TP group
 * may race here: a mixed-up pair only sizes a grid (the persistent loop covers any grid). */
template <int NT>
static int gemv_per_sm(int fmt, size_t smem) {
    static int cached[8];
    static size_t cached_smem[8];
    const int f = fmt & 7;
    const int hit = __atomic_load_n(&cached[f], __ATOMIC_ACQUIRE);
    if (hit && __atomic_load_n(&cached_smem[f], __ATOMIC_ACQUIRE) == smem) return hit;
    int n = 0;
    switch (fmt) {
    case M3_WF_F32: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv_simt<M3_WF_F32, NT>, GW * 32, smem); break;
    case M3_WF_BF16: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv_simt<M3_WF_BF16, NT>, GW * 32, smem); break;
    case M3_WF_F16: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv_simt<M3_WF_F16, NT>, GW * 32, smem); break;
    case M3_WF_MXFP8: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv_simt<M3_WF_MXFP8, NT>, GW * 32, smem); break;
    default: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv_simt<M3_WF_NVFP4, NT>, GW * 32, smem); break;
    }
    if (n < 1) n = 1;
    __atomic_store_n(&cached_smem[f], smem, __ATOMIC_RELEASE);
    __atomic_store_n(&cached[f], n, __ATOMIC_RELEASE);
    return n;
}

/* x rounded to bf16 by a launch of its own (m3_cu_gemm_input) where *rb asks for it, which it then
 * clears (the kernel need not round); x itself otherwise. NULL on failure (recorded in c). */
static const float *rounded_first(m3_cuda *c, const float *x, size_t n, int *rb) {
    if (!*rb) return x;
    *rb = 0;
    return m3_cu_gemm_input(c, x, n);
}

/* The shared memory k_gemv_simt_splitk<W's format, NT> may take: 96 KB where that attribute is set
 * (once per device context), so that an x of NT rows it would read where it lies (the MoE router's
 * at 8 tokens: 48 KB a K part) is staged and rounded to bf16 as it lands instead of in a launch of
 * its own; else the default 48 KB. */
#define SPLITK_SMEM (96 * 1024)
template <int NT>
static size_t splitk_smem_max(const m3_cuda *c, int fmt) {
    static unsigned long long set[8]; /* per format: devices whose context has the attribute */
    const unsigned long long bit = 1ull << (c->dev & 63);
    const int f = fmt & 7;
    if (__atomic_load_n(&set[f], __ATOMIC_ACQUIRE) & bit) return SPLITK_SMEM;
    cudaError_t e;
    switch (fmt) {
    case M3_WF_F32: e = cudaFuncSetAttribute(k_gemv_simt_splitk<M3_WF_F32, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, SPLITK_SMEM); break;
    case M3_WF_BF16: e = cudaFuncSetAttribute(k_gemv_simt_splitk<M3_WF_BF16, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, SPLITK_SMEM); break;
    case M3_WF_F16: e = cudaFuncSetAttribute(k_gemv_simt_splitk<M3_WF_F16, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, SPLITK_SMEM); break;
    case M3_WF_MXFP8: e = cudaFuncSetAttribute(k_gemv_simt_splitk<M3_WF_MXFP8, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, SPLITK_SMEM); break;
    default: e = cudaFuncSetAttribute(k_gemv_simt_splitk<M3_WF_NVFP4, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, SPLITK_SMEM); break;
    }
    if (e != cudaSuccess) {
        cudaGetLastError(); /* (not sticky: the launch below stays within 48 KB) */
        return 48 * 1024;
    }
    __atomic_fetch_or(&set[f], bit, __ATOMIC_RELEASE);
    return SPLITK_SMEM;
}

/* ra (may be NULL): the routing step to run at the end of the launch; returns whether it did
 * (only k_gemv_simt_splitk takes it, and only when the routing scratch fits its x buffer);
 * rb: x rounded to bf16 (where the kernel stages x, as it stages it) */
template <int NT>
static int launch_gemv_nt(m3_cuda *c, const m3_linear *W, const float *x, int T, int t0, float *y, const route_args *rap,
                          int rb) {
    const int V = W->fmt == M3_WF_F32 ? 4 : W->fmt == M3_WF_BF16 || W->fmt == M3_WF_F16 ? 8 : W->fmt == M3_WF_MXFP8 ? 16 : 32;
    if (cdiv(W->N, GW * GR) * 2 < (unsigned)c->sm_count && W->K >= 1024) {
        const unsigned ng = cdiv(W->N, GR);
        route_args ra;
        memset(&ra, 0, sizeof ra);
        const size_t rsm = rap ? (size_t)GW * (2 * rap->E + rap->K) : 0; /* routing scratch, floats */
        if (rap && t0 == 0 && T <= NT) ra = *rap;
        /* K over kparts CTAs (routing only: its last CTA adds the parts) while the CTAs fit the SMs
         * and each part splits into whole chunks for every warp */
        int kp = ra.ctr ? ra.kparts : 1;
        while (kp > 1 && (ng * kp > (unsigned)c->sm_count || W->K % (kp * GW * V))) kp /= 2;
        ra.kparts = kp;
        const int Kc = W->K / kp, slice = (Kc / GW + V - 1) / V * V;
        const size_t xsm = sizeof(float) * (size_t)NT * Kc, rest = sizeof(float) * (GW * GR * NT + (ra.ctr ? rsm : 0));
        /* x read where it lies when it does not fit (t0 = 0, T = NT: its rows all exist); where it would be and is to
         * be rounded (rb), staged in up to SPLITK_SMEM instead (M3_ROUND_IN_LOAD=0: 48 KB). Only there: the same
         * kernel either way, so the same sums as with the rounding launch (other T keep k_gemv_simt below). */
        const size_t smax = rb && xsm + rest > 48 * 1024 && t0 == 0 && T == NT ? splitk_smem_max<NT>(c, W->fmt) : 48 * 1024;
        const int staged = xsm + rest <= smax;
        if (staged || (t0 == 0 && T == NT)) {
            const unsigned g = ng * kp;
            const size_t smem = (staged ? xsm : 0) + rest;
            if (!staged && !(x = rounded_first(c, x, (size_t)T * W->K, &rb))) return 0; /* read where it lies */
            GEMV_LAUNCH(k_gemv_simt_splitk, slice, ra, staged, rb);
            return ra.ctr != NULL;
        }
    }
    int KT = (12288 / NT) & ~511;
    if (KT > W->K) KT = (W->K + 31) & ~31;
    size_t smem = sizeof(float) * (size_t)NT * KT;
    unsigned g = cdiv(W->N, GW * GR);
    /* persistent CTAs where x fits one tile and the groups are several waves (M3_GEMV_PERSIST=0: never) */
    static int pers_on = -1;
    if (pers_on < 0) pers_on = m3_cu_env_int("M3_GEMV_PERSIST", 1) != 0;
    int persist = 0;
    if (pers_on && KT >= W->K) {
        const unsigned res = (unsigned)gemv_per_sm<NT>(W->fmt, smem) * (unsigned)c->sm_count;
        if (g > 2 * res) {
            g = res;
            persist = 1;
        }
    }
    GEMV_LAUNCH(k_gemv_simt, KT, persist, rb);
    return 0;
}

/* x -> bf16(x) as f32 */
__global__ void k_round_bf16(const float *x, size_t n, float *y) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}

const float *m3_cu_gemm_input(m3_cuda *c, const float *x, size_t n) {
    if (!c->gemm_bf16 || !n) return x;
    float *r = (float *)m3_cu_scratch(c, SC_XROUND, sizeof(float) * n);
    if (!r) return NULL;
    m3_cu_xsplit_touch(c, r, sizeof(float) * n);
    const unsigned g = cdiv(n, 256);
    k_round_bf16<<<g < 4096 ? g : 4096, 256, 0, c->st>>>(x, n, r);
    return CK_LAUNCH(c, "round x to bf16") ? NULL : r;
}

/* precision bf16: x rounded as the SIMT GEMV and the BF16 cuBLAS path load it, one launch less in
 * each MoE router and before the lm_head (H100, 8 layers, decode batch 1: 2.508 -> 2.449 ms;
 * docs/PERF.md, session 37). M3_ROUND_IN_LOAD=0: by a launch of its own first (m3_cu_gemm_input). */
static int round_in_load(void) {
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_ROUND_IN_LOAD", 1) != 0;
    return on;
}

/* y[T, N] = x[T, K] W^T, T <= 8; with ra, routes too where it can (returns whether it did) */
int m3_cu_gemv_simt(m3_cuda *c, const m3_linear *W, const float *x, int T, float *y, const route_args *ra, int rb) {
    int routed = 0;
    /* (k_gemv_by_element reads x where it lies) */
    if ((!round_in_load() || !m3_cu_simt_ok(W)) && !(x = rounded_first(c, x, (size_t)T * W->K, &rb))) return 0;
    if (!m3_cu_simt_ok(W)) {
        k_gemv_by_element<<<cdiv(W->N, 8), 256, 0, c->st>>>(*W, x, T, y);
    } else if (T == 1) routed = launch_gemv_nt<1>(c, W, x, T, 0, y, ra, rb);
    else if (T == 2) routed = launch_gemv_nt<2>(c, W, x, T, 0, y, ra, rb);
    else if (T <= 4) routed = launch_gemv_nt<4>(c, W, x, T, 0, y, ra, rb);
    else routed = launch_gemv_nt<8>(c, W, x, T, 0, y, ra, rb);
    CK_LAUNCH(c, "gemv");
    return routed;
}

/* ------------------------------------------------------------------ BF16, 2-8 tokens
 * The SIMT GEMV's work grows with T (the lm_head at 8 tokens: 19% of the copy bandwidth; the
 * MoE router at 8 tokens: 4 CTAs, 72 us), so 2-8 tokens of a BF16 matrix go through cuBLAS on
 * the tensor cores: x split into three bf16 rows (x = hi + mid + lo to ~24 bits, f32's
 * precision; the products are exact in f32), one GEMM against the 3T rows, the thirds added. */

/* x[T][K] f32 -> xs[0..T) hi, xs[T..2T) mid, xs[2T..3T) lo (bf16); rb (precision bf16): of x rounded
 * to bf16 (so hi = bf16(x), mid = lo = 0) */
__global__ void k_split_x_bf16x3(const float *x, int T, int K, __nv_bfloat16 *xs, int rb) {
    const size_t n = (size_t)T * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = round_bf16_if(x[i], rb);
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        const float r = v - __bfloat162float(h);
        const __nv_bfloat16 m = __float2bfloat16_rn(r);
        xs[i] = h;
        xs[n + i] = m;
        xs[2 * n + i] = __float2bfloat16_rn(r - __bfloat162float(m));
    }
}

/* y[t][n] = p[t][n] + p[T + t][n] + p[2T + t][n] */
__global__ void k_add_bf16x3_products(const float *p, int T, int N, float *y) {
    const size_t n = (size_t)T * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = p[i] + p[n + i] + p[2 * n + i];
}

/* M3_BF16_BLAS=0 keeps 2-8 tokens on the SIMT GEMV */
static int bf16_blas_on(void) {
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_BF16_BLAS", 1) != 0;
    return on;
}

/* 0 done (or failed: c->failed), -1 not this path */
static int linear_bf16_blas(m3_cuda *c, const m3_linear *W, const float *x, int T, float *y, int rb) {
    /* (not on the side stream: the cuBLAS handle launches on the main one) */
    if (c->side || W->fmt != M3_WF_BF16 || W->tiled || T < 2 || T > 8 || !bf16_blas_on() || (size_t)W->N * W->K < ((size_t)1 << 19) ||
        W->row_bytes != (size_t)2 * W->K || ((uintptr_t)W->w & 15) || W->K % 8)
        return -1;
    if (!round_in_load() && !(x = rounded_first(c, x, (size_t)T * W->K, &rb))) return 0;
    const size_t pn = (size_t)3 * T * W->N, xn = (size_t)3 * T * W->K;
    float *p = (float *)m3_cu_scratch(c, SC_DEQ, sizeof(float) * pn + sizeof(uint16_t) * xn + 256);
    if (!p) return 0;
    __nv_bfloat16 *xs = (__nv_bfloat16 *)(p + ((pn + 63) & ~(size_t)63));
    unsigned g = cdiv((size_t)T * W->K, 256);
    k_split_x_bf16x3<<<g < 1024 ? g : 1024, 256, 0, c->st>>>(x, T, W->K, xs, rb);
    if (CK_LAUNCH(c, "split x (bf16)")) return 0;
    const float one = 1.0f, zero = 0.0f;
    /* column-major view: W^T is K x N (ld K); xs is K x 3T (ld K); p is N x 3T (ld N) */
    cublasStatus_t s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, W->N, 3 * T, W->K, &one, W->w, CUDA_R_16BF, W->K, xs,
                                    CUDA_R_16BF, W->K, &zero, p, CUDA_R_32F, W->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        m3_cu_failf(c, "cuBLAS BF16 GEMM failed (status %d)", (int)s);
        return 0;
    }
    g = cdiv((size_t)T * W->N, 256);
    k_add_bf16x3_products<<<g < 4096 ? g : 4096, 256, 0, c->st>>>(p, T, W->N, y);
    CK_LAUNCH(c, "add thirds");
    return 0;
}

/* precision bf16, M3_GEMM_TC_MIN (32) tokens or more (BF16 weights: 9 or more): the wgmma GEMM (gemm_tc.cu) for every W it
 * takes, x staged (rounded to bf16) once for all of them (H200, M3.1-Flash shapes, 64 tokens: 2.2-4.2x
 * the tensor-core GEMV, which reads the weights once per 8 tokens). 1 when done (or failed:
 * c->failed), 0 not this path. */
static int linear_tc(m3_cuda *c, int n, const m3_linear *const *W, const float *x, int T, float *const *y, int any_t = 0) {
    static int tmin = -1;
    if (tmin < 0) tmin = m3_cu_env_int("M3_GEMM_TC_MIN", 32);
    /* BF16 weights from 9 tokens too: gemm_ft takes the other formats there, and BF16 had only the
     * dequantizing SGEMM below (H200, 8192 x 6144 at 16 tokens: 327 us against 41 us here; the
     * lm_head at decode batches of 9-31 and small verify passes) */
    int bf16 = T > 8;
    for (int i = 0; i < n; i++) bf16 = bf16 && W[i]->fmt == M3_WF_BF16;
    if (!c->gemm_bf16 || T < 1 || (T < tmin && !any_t && !bf16)) return 0;
    for (int i = 0; i < n; i++)
        if (!m3_cu_gemm_tc_ok(W[i], T) || W[i]->K != W[0]->K) return 0;
    size_t xb = m3_cu_gemm_tc_xbytes(T, W[0]->K);
    void *xs = m3_cu_scratch(c, SC_GEMM_X, xb);
    if (!xs) return 1;
    m3_err e;
    if (m3_cu_gemm_tc_stage_x(c->st, x, T, W[0]->K, xs, &e)) { m3_cu_failf(c, "%s", e.msg); return 1; }
    for (int i = 0; i < n; i++) {
        /* few output tiles (few tokens): K slices keep every SM busy (gemm_tc.h) */
        const int ks = m3_cu_gemm_tc_ksplit(W[i], T);
        float *part = ks > 1 ? (float *)m3_cu_scratch(c, SC_SPLITK, sizeof(float) * (size_t)ks * T * W[i]->N) : NULL;
        if (ks > 1 && !part) return 1;
        if (m3_cu_gemm_tc_staged_split(c->st, W[i], xs, T, y[i], ks, part, &e)) { m3_cu_failf(c, "%s", e.msg); return 1; }
    }
    return 1;
}

/* precision bf16, M3_GEMM_FT_MIN (9) .. M3_GEMM_FT_MAX (64) tokens: the few-token GEMM (gemm_ft.cu) when it
 * takes every W (MXFP8 / NVFP4, tiled), x staged once for all of them. 1 when done (or failed), 0 not
 * this path. */
static int linear_ft(m3_cuda *c, int n, const m3_linear *const *W, const float *x, int T, float *const *y) {
    static int tmin = -1, tmax = -1;
    if (tmin < 0) {
        tmin = m3_cu_env_int("M3_GEMM_FT_MIN", 9);
        tmax = m3_cu_env_int("M3_GEMM_FT_MAX", 64);
    }
    if (!c->gemm_bf16 || T < tmin || T > tmax || ((uintptr_t)x & 15)) return 0;
    for (int i = 0; i < n; i++)
        if (!m3_cu_linear_ft_ok(W[i]) || W[i]->K != W[0]->K || W[i]->fmt != W[0]->fmt) return 0;
    m3_cu_linear_ft(c, n, W, x, T, y);
    return 1;
}

/* the same at any T (the MoE's shared expert next to the grouped GEMMs, moe.cu) */
int m3_cu_linear_tc_n(m3_cuda *c, int n, const m3_linear *const *W, const float *x, int T, float *const *y) {
    for (int i = 0; i < n; i++) m3_cu_xsplit_touch(c, y[i], sizeof(float) * (size_t)T * W[i]->N);
    return linear_tc(c, n, W, x, T, y, 1);
}

void m3_cu_linear(void *ctx, const m3_linear *W, const float *x, int T, float *y) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_LINEAR);
    if (T <= 0 || c->failed) { m3_cu_prof_end(c, OP_LINEAR); return; }
    m3_cu_xsplit_touch(c, y, sizeof(float) * (size_t)T * W->N);
    if (linear_ft(c, 1, &W, x, T, &y) || linear_tc(c, 1, &W, x, T, &y)) { m3_cu_prof_end(c, OP_LINEAR); return; }
    /* MXFP8 / NVFP4 on the tensor cores in groups of 8 tokens up to 64 tokens */
    if (T <= 64 && m3_cu_mma_ok(W)) {
        for (int t0 = 0; t0 < T; t0 += 8)
            m3_cu_gemv_mma(c, W, x + (size_t)t0 * W->K, T - t0 < 8 ? T - t0 : 8, y + (size_t)t0 * W->N);
        { m3_cu_prof_end(c, OP_LINEAR); return; }
    }
    if (T <= 8) {
        /* bf16 mode: on bf16(x), rounded where the kernels load x */
        if (linear_bf16_blas(c, W, x, T, y, c->gemm_bf16)) m3_cu_gemv_simt(c, W, x, T, y, NULL, c->gemm_bf16);
        m3_cu_prof_end(c, OP_LINEAR);
        return;
    }
    if (c->side) { /* the cuBLAS handle launches on the main stream: never from the side's work */
        m3_cu_failf(c, "CUDA backend: a %d-token linear (cuBLAS) on the side stream", T);
        m3_cu_prof_end(c, OP_LINEAR);
        return;
    }
    if (!(x = m3_cu_gemm_input(c, x, (size_t)T * W->K))) { m3_cu_prof_end(c, OP_LINEAR); return; }
    /* dequantize row chunks of at most ~256 MB and SGEMM each */
    int chunk = (int)((256u << 20) / (4 * (size_t)W->K));
    if (chunk < 64) chunk = 64;
    if (chunk > W->N) chunk = W->N;
    float *wd = (float *)m3_cu_scratch(c, SC_DEQ, sizeof(float) * (size_t)chunk * W->K);
    if (!wd) { m3_cu_prof_end(c, OP_LINEAR); return; }
    const float one = 1.0f, zero = 0.0f;
    for (int n0 = 0; n0 < W->N; n0 += chunk) {
        int rows = W->N - n0 < chunk ? W->N - n0 : chunk;
        unsigned g = cdiv((size_t)rows * W->K, 256);
        if (g > 65535u * 8) g = 65535u * 8;
        k_dequant_rows_f32<<<g, 256, 0, c->st>>>(*W, n0, rows, wd);
        if (CK_LAUNCH(c, "dequant")) { m3_cu_prof_end(c, OP_LINEAR); return; }
        cublasStatus_t s = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, W->K, &one, wd, W->K, x, W->K, &zero,
                                       y + n0, W->N);
        if (s != CUBLAS_STATUS_SUCCESS) { m3_cu_failf(c, "cuBLAS SGEMM failed (status %d)", (int)s); { m3_cu_prof_end(c, OP_LINEAR); return; } }
    }
    m3_cu_prof_end(c, OP_LINEAR);
}

/* n matrices sharing x: one tensor-core launch per 8 tokens when they all take that path */
void m3_cu_linear_n(void *ctx, int n, const m3_linear *const *W, const float *x, int T, float *const *y) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (c->gemm_bf16 && T >= 1) { /* the wgmma GEMM where it takes the shapes (linear_tc) */
        m3_cu_prof_begin(c, OP_LINEAR);
        for (int i = 0; i < n; i++) m3_cu_xsplit_touch(c, y[i], sizeof(float) * (size_t)T * W[i]->N);
        const int done = c->failed || linear_ft(c, n, W, x, T, y) || linear_tc(c, n, W, x, T, y);
        m3_cu_prof_end(c, OP_LINEAR);
        if (done) return;
    }
    int fused = T >= 1 && T <= 64 && n >= 1 && n <= 6;
    for (int i = 0; i < n && fused; i++)
        fused = m3_cu_mma_ok(W[i]) && W[i]->fmt == W[0]->fmt && W[i]->K == W[0]->K && W[i]->tiled == W[0]->tiled;
    if (!fused) {
        m3_cu_prof_begin(c, OP_LINEAR);
        int done = c->failed || linear_tc(c, n, W, x, T, y);
        m3_cu_prof_end(c, OP_LINEAR);
        if (!done)
            for (int i = 0; i < n; i++) m3_cu_linear(ctx, W[i], x, T, y[i]);
        return;
    }
    m3_cu_prof_begin(c, OP_LINEAR);
    for (int t0 = 0; t0 < T && !c->failed; t0 += 8) {
        float *yt[6];
        for (int i = 0; i < n; i++) yt[i] = y[i] + (size_t)t0 * W[i]->N;
        m3_cu_gemv_mma_n(c, n, W, x + (size_t)t0 * W[0]->K, T - t0 < 8 ? T - t0 : 8, yt);
    }
    m3_cu_prof_end(c, OP_LINEAR);
}
