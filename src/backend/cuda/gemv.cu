/* Linear layers, the dense MLP and the MoE on the GPU.
 *
 * linear, up to 8 tokens: MXFP8 / NVFP4 on the tensor cores (gemv_mma.cu); BF16 at 1 token and
 * other formats: the SIMT GEMV here. A CTA of 8 warps owns 32 output rows (4 per warp, so each
 * x value read from shared memory serves 4 rows); each lane streams 16-byte chunks of its
 * rows (16 MXFP8 values, 32 NVFP4 values, 8 BF16...) and decodes them in registers; the
 * block scales multiply partial sums. x is staged in shared memory in K tiles. Every weight
 * byte is read once per call; accumulation is f32. BF16 at 2-8 tokens (the lm_head of a
 * verify pass, the router): cuBLAS on the tensor cores with x in three bf16 parts.
 * linear, more tokens: the weight is dequantized to f32 in row chunks and multiplied by
 * cuBLAS SGEMM in pedantic f32 (exact products, no TF32): prefill correctness first.
 * MoE, up to 8 tokens: router GEMV, a warp per token picks the top-k (sigmoid + bias,
 * lowest index on ties, as the CPU), then one launch computes gate+up of every (token,
 * expert) slot - for 2 or more tokens every picked expert once for up to 4 of its tokens
 * (gemv_mma.cu, m3_cu_moe_grouped) - reading the rows straight from the device expert table,
 * SwiGLU, one launch the down projections, one the weighted sum: no host synchronization.
 * Batches up to 256 tokens the same, in chunks of 64.
 * MoE, longer runs (prefill chunks): the picks go to the host, tokens are grouped per expert
 * (ascending expert order per token, as the CPU adds them) and each expert runs as a linear. */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

#define GW 8  /* warps per CTA */
#define GR 4  /* rows per warp */

/* values per 16-byte chunk of a row */
template <int F> struct fmt_info;
template <> struct fmt_info<M3_WF_F32> { enum { VALS = 4 }; };
template <> struct fmt_info<M3_WF_BF16> { enum { VALS = 8 }; };
template <> struct fmt_info<M3_WF_F16> { enum { VALS = 8 }; };
template <> struct fmt_info<M3_WF_MXFP8> { enum { VALS = 16 }; };
template <> struct fmt_info<M3_WF_NVFP4> { enum { VALS = 32 }; };

/* acc[t] += dot(chunk q of values k..k+VALS, xs[t][kk..]) with scales; sc: the row's scales */
template <int F, int NT>
static __device__ __forceinline__ void chunk_fma(uint4 q, const uint8_t *sc, int k, float gmul, const float *xs, int xstride,
                                                 int kk, float *acc) {
    uint32_t u[4] = {q.x, q.y, q.z, q.w};
    if (F == M3_WF_F32) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float4 xv = *(const float4 *)(xs + t * xstride + kk);
            acc[t] += __uint_as_float(u[0]) * xv.x + __uint_as_float(u[1]) * xv.y + __uint_as_float(u[2]) * xv.z +
                      __uint_as_float(u[3]) * xv.w;
        }
    } else if (F == M3_WF_BF16 || F == M3_WF_F16) {
        float w[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (F == M3_WF_BF16) {
                w[2 * i] = __uint_as_float(u[i] << 16);
                w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
            } else {
                __half2_raw r;
                r.x = (unsigned short)(u[i] & 0xffff);
                r.y = (unsigned short)(u[i] >> 16);
                float2 f = __half22float2(__half2(r));
                w[2 * i] = f.x;
                w[2 * i + 1] = f.y;
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float *xp = xs + t * xstride + kk;
            float4 a = *(const float4 *)xp, b = *(const float4 *)(xp + 4);
            acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
        }
    } else if (F == M3_WF_MXFP8) {
        float w[16];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 lo = e4m3x2_f32(u[i] & 0xffff), hi = e4m3x2_f32(u[i] >> 16);
            w[4 * i] = lo.x; w[4 * i + 1] = lo.y; w[4 * i + 2] = hi.x; w[4 * i + 3] = hi.y;
        }
        float s = e8m0_f32(sc[k / 32]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float *xp = xs + t * xstride + kk;
            float p = 0;
#pragma unroll
            for (int j = 0; j < 16; j += 4) {
                float4 a = *(const float4 *)(xp + j);
                p += w[j] * a.x + w[j + 1] * a.y + w[j + 2] * a.z + w[j + 3] * a.w;
            }
            acc[t] += p * s;
        }
    } else { /* NVFP4: two groups of 16 values, 8 bytes each */
#pragma unroll
        for (int g = 0; g < 2; g++) {
            float w[16];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                uint32_t v = u[2 * g + i];
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    float2 f = e2m1x2_f32((v >> (8 * b)) & 0xff);
                    w[8 * i + 2 * b] = f.x;
                    w[8 * i + 2 * b + 1] = f.y;
                }
            }
            float s = (e4m3_f32(sc[k / 16 + g]) * gmul) * 16384.0f;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float *xp = xs + t * xstride + kk + 16 * g;
                float p = 0;
#pragma unroll
                for (int j = 0; j < 16; j += 4) {
                    float4 a = *(const float4 *)(xp + j);
                    p += w[j] * a.x + w[j + 1] * a.y + w[j + 2] * a.z + w[j + 3] * a.w;
                }
                acc[t] += p * s;
            }
        }
    }
}

/* A warp's share of one K tile: R rows (each its own data, scale and global multiplier),
 * values [kt0, kt0 + klen) against xs (tile-relative columns). */
template <int F, int NT, int R>
static __device__ __forceinline__ void warp_rows(const uint8_t *const *rw, const uint8_t *const *rs, const float *gm,
                                                 const bool *ok, int kt0, int klen, const float *xs, int xstride,
                                                 float (*acc)[NT]) {
    const int V = fmt_info<F>::VALS, lane = threadIdx.x & 31;
    const int nch = klen / V;
    const int bpv2 = F == M3_WF_F32 ? 8 : F == M3_WF_BF16 || F == M3_WF_F16 ? 4 : F == M3_WF_MXFP8 ? 2 : 1; /* 2x bytes/value */
#pragma unroll 2
    for (int ch = lane; ch < nch; ch += 32) {
        int kk = ch * V, k = kt0 + kk;
        size_t boff = (size_t)k * bpv2 / 2;
        uint4 q[R];
#pragma unroll
        for (int r = 0; r < R; r++) q[r] = ok[r] ? __ldg((const uint4 *)(rw[r] + boff)) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (ok[r]) chunk_fma<F, NT>(q[r], rs[r], k, gm[r], xs, xstride, kk, acc[r]);
    }
}

/* stage x[t0 .. t0+NT) columns [kt0, kt0+klen) into xs[NT][KT] (zeros for t >= T) */
template <int NT>
static __device__ __forceinline__ void stage_x(const float *x, int K, int T, int t0, int kt0, int klen, float *xs, int KT) {
    for (int i = threadIdx.x; i < NT * (klen / 4); i += blockDim.x) {
        int t = i / (klen / 4), j = (i % (klen / 4)) * 4;
        float4 v = make_float4(0, 0, 0, 0);
        if (t0 + t < T) v = *(const float4 *)(x + (size_t)(t0 + t) * K + kt0 + j);
        *(float4 *)(xs + t * KT + j) = v;
    }
}

/* a warp's GR rows from n0: row and scale pointers (rows past N read row 0 and are not
 * stored), multipliers, zeroed sums */
template <int NT>
static __device__ __forceinline__ void warp_rows_setup(const m3_linear &W, int n0, const uint8_t **rw, const uint8_t **rs, float *gm,
                                                       bool *ok, float (*acc)[NT]) {
#pragma unroll
    for (int r = 0; r < GR; r++) {
        const int n = n0 + r;
        ok[r] = n < W.N;
        rw[r] = W.w + (size_t)(ok[r] ? n : 0) * W.row_bytes;
        rs[r] = W.scale ? W.scale + (size_t)(ok[r] ? n : 0) * W.scale_row : NULL;
        gm[r] = W.gmul;
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0;
    }
}

/* a warp's GR x NT sums (lane 0 writes): y[t0 + t][n0 + r] for rows that exist and t0 + t < T */
template <int NT>
static __device__ __forceinline__ void rows_store(float (*acc)[NT], const bool *ok, int lane, int t0, int T, float *y, int N,
                                                  int n0) {
#pragma unroll
    for (int r = 0; r < GR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = warp_sum(acc[r][t]);
            if (lane == 0 && ok[r] && t0 + t < T) y[(size_t)(t0 + t) * N + n0 + r] = v;
        }
}

/* A CTA per GW x GR rows, x staged in KT-column tiles. persist (x whole in one tile): the CTAs
 * stay resident, stage x once, and take row groups blockIdx.x, + gridDim.x, ... (the BF16
 * lm_head at one token: 6,252 CTAs each staging 24 KB of x added 150 MB of L2 reads to 2.46 GB
 * of weights, and ran at 4.2 TB/s) */
template <int F, int NT>
__global__ void __launch_bounds__(GW * 32) k_gemv(m3_linear W, const float *x, int T, int t0, float *y, int KT, int persist) {
    extern __shared__ float xs[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const uint8_t *rw[GR], *rs[GR];
    float gm[GR], acc[GR][NT];
    bool ok[GR];
    if (persist) {
        stage_x<NT>(x, W.K, T, t0, 0, W.K, xs, KT);
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
        stage_x<NT>(x, W.K, T, t0, kt0, klen, xs, KT);
        __syncthreads();
        warp_rows<F, NT, GR>(rw, rs, gm, ok, kt0, klen, xs, KT, acc);
    }
    rows_store<NT>(acc, ok, lane, t0, T, y, W.N, n0);
}

/* One warp per token: sigmoid scores, bias-corrected choice, top-K (lowest index on ties,
 * as the CPU's ascending scan with a strict >), weights s / sum(s) * scale; the K picks are
 * then sorted by expert id so the weighted sum adds experts in ascending order (the CPU's).
 * sm: 2E floats + K ints of this warp's own. Logits are read through L2 (another CTA of the
 * router may have written them, k_gemv_ks). */
static __device__ __forceinline__ void route_token(const float *logits, const float *bias, int E, int K, float scale,
                                                   int32_t *pick, float *wt, float *sm, int lane) {
    float *s = sm, *ch = sm + E;
    int *pk = (int *)(ch + E);
    for (int e = lane; e < E; e += 32) {
        float sv = 1.0f / (1.0f + expf(-__ldcg(logits + e)));
        s[e] = sv;
        ch[e] = sv + (bias ? bias[e] : 0.0f);
    }
    __syncwarp();
    /* as the indexer's top-k (attn.cu): each lane's best remaining expert, the warp's by two
     * redux.sync reductions (order-preserving key of the score; lowest id on ties); each lane
     * owns the experts = lane mod 32. The sum runs in pick order, as the CPU's. */
    const uint32_t none = fkey(-INFINITY);
    float sum = 0;
    for (int k = 0; k < K; k++) {
        uint32_t bk = none;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32) {
            const float v = ch[e];
            const uint32_t key = isnan(v) ? none : fkey(v == 0.0f ? 0.0f : v);
            if (key > bk) { bk = key; bi = e; }
        }
        const uint32_t mk = __reduce_max_sync(0xffffffffu, bk);
        const int best = mk == none ? 0 /* every choice -inf (NaN logits): keep a valid id */
                                    : (int)__reduce_min_sync(0xffffffffu, bk == mk ? (uint32_t)bi : 0x7fffffffu);
        if ((best & 31) == lane) ch[best] = -INFINITY;
        if (lane == 0) pk[k] = best;
        sum += s[best];
    }
    __syncwarp();
    for (int k = lane; k < K; k += 32) { /* ascending expert ids, by rank */
        const int v = pk[k];
        int r = 0;
        for (int j = 0; j < K; j++) r += pk[j] < v || (pk[j] == v && j < k);
        pick[r] = v;
        wt[r] = s[v] / sum * scale;
    }
}

/* the MoE routing step of the router's launch (k_gemv_ks): with ctr set, the CTA that finishes
 * last routes every token (route_token). kparts > 1: K is split over that many CTAs per row
 * group, each writing its sums to part [kparts][8][N], which the last CTA adds in order. */
typedef struct route_args {
    int *ctr;
    const float *bias;
    int E, K;
    float scale;
    int32_t *pick;
    float *wt;
    float *part;
    int kparts;
} route_args;

/* Few rows (the MoE router: 128 x 6144): a CTA per GR rows (and K part: ra.kparts), its warps
 * splitting the CTA's K range into GW slices (a warp per GR rows over all of K kept 4 SMs
 * busy; 32 CTAs over all of K took 13.5 us at one token, most of it waiting on memory); sums
 * added in warp order, then in K-part order (deterministic). klen of a slice: a multiple of
 * the format's chunk. x is staged in shared memory where NT rows of the range fit (staged),
 * else read where it lies (T = NT rows from t0; 8 tokens of the router: 196 KB). With ra.ctr,
 * the routing step after it (route_args). */
template <int F, int NT>
__global__ void __launch_bounds__(GW * 32) k_gemv_ks(m3_linear W, const float *x, int T, int t0, float *y, int slice,
                                                      route_args ra, int staged) {
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
        stage_x<NT>(x, W.K, T, t0, kb, Kc, xs, Kc);
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
        return e2m1x2_f32(wt_nv_code(word, k & 7)).x * 16384.0f *
               (e4m3_f32(W.scale[wt_soff(W.fmt, W.scale_row, n, (size_t)k / 16)]) * W.gmul);
    }
    const uint8_t *row = W.w + (size_t)n * W.row_bytes;
    switch (W.fmt) {
    case M3_WF_F32: return ((const float *)row)[k];
    case M3_WF_BF16: return bf16_f32(((const uint16_t *)row)[k]);
    case M3_WF_F16: return f16_f32(((const uint16_t *)row)[k]);
    case M3_WF_MXFP8: return e4m3_f32(row[k]) * e8m0_f32(W.scale[(size_t)n * W.scale_row + k / 32]);
    default: {
        uint32_t code = (k & 1) ? (row[k / 2] >> 4) : (row[k / 2] & 15);
        return e2m1x2_f32(code).x * 16384.0f * (e4m3_f32(W.scale[(size_t)n * W.scale_row + k / 16]) * W.gmul);
    }
    }
}

__global__ void k_gemv_any(m3_linear W, const float *x, int T, float *y) {
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
__global__ void k_dequant(m3_linear W, int n0, int rows, float *out) {
    size_t total = (size_t)rows * W.K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / W.K), k = (int)(i % W.K);
        out[i] = decode_at(W, n0 + r, k);
    }
}

static int fast_shape(const m3_linear *W) {
    if (W->tiled) return 0; /* rows are not contiguous: k_gemv_any (decode_at) */
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

/* resident k_gemv CTAs per SM for W's format with smem bytes (at least 1), asked of the runtime
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
    case M3_WF_F32: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv<M3_WF_F32, NT>, GW * 32, smem); break;
    case M3_WF_BF16: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv<M3_WF_BF16, NT>, GW * 32, smem); break;
    case M3_WF_F16: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv<M3_WF_F16, NT>, GW * 32, smem); break;
    case M3_WF_MXFP8: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv<M3_WF_MXFP8, NT>, GW * 32, smem); break;
    default: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv<M3_WF_NVFP4, NT>, GW * 32, smem); break;
    }
    if (n < 1) n = 1;
    __atomic_store_n(&cached_smem[f], smem, __ATOMIC_RELEASE);
    __atomic_store_n(&cached[f], n, __ATOMIC_RELEASE);
    return n;
}

/* ra (may be NULL): the routing step to run at the end of the launch; returns whether it did
 * (only k_gemv_ks takes it, and only when the routing scratch fits its x buffer) */
template <int NT>
static int launch_gemv_nt(m3_cuda *c, const m3_linear *W, const float *x, int T, int t0, float *y, const route_args *rap) {
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
        /* x read where it lies when it does not fit (t0 = 0, T = NT: its rows all exist) */
        const int staged = xsm + rest <= 48 * 1024;
        if (staged || (t0 == 0 && T == NT)) {
            const unsigned g = ng * kp;
            const size_t smem = (staged ? xsm : 0) + rest;
            GEMV_LAUNCH(k_gemv_ks, slice, ra, staged);
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
    GEMV_LAUNCH(k_gemv, KT, persist);
    return 0;
}

/* y[T, N] = x[T, K] W^T, T <= 8; with ra, routes too where it can (returns whether it did) */
static int gemv(m3_cuda *c, const m3_linear *W, const float *x, int T, float *y, const route_args *ra = NULL) {
    int routed = 0;
    if (!fast_shape(W)) {
        k_gemv_any<<<cdiv(W->N, 8), 256, 0, c->st>>>(*W, x, T, y);
    } else if (T == 1) routed = launch_gemv_nt<1>(c, W, x, T, 0, y, ra);
    else if (T == 2) routed = launch_gemv_nt<2>(c, W, x, T, 0, y, ra);
    else if (T <= 4) routed = launch_gemv_nt<4>(c, W, x, T, 0, y, ra);
    else routed = launch_gemv_nt<8>(c, W, x, T, 0, y, ra);
    CK_LAUNCH(c, "gemv");
    return routed;
}

/* ------------------------------------------------------------------ BF16, 2-8 tokens
 * The SIMT GEMV's work grows with T (the lm_head at 8 tokens: 19% of the copy bandwidth; the
 * MoE router at 8 tokens: 4 CTAs, 72 us), so 2-8 tokens of a BF16 matrix go through cuBLAS on
 * the tensor cores: x split into three bf16 rows (x = hi + mid + lo to ~24 bits, f32's
 * precision; the products are exact in f32), one GEMM against the 3T rows, the thirds added. */

/* x[T][K] f32 -> xs[0..T) hi, xs[T..2T) mid, xs[2T..3T) lo (bf16) */
__global__ void k_split3_bf16(const float *x, int T, int K, __nv_bfloat16 *xs) {
    const size_t n = (size_t)T * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        const float r = v - __bfloat162float(h);
        const __nv_bfloat16 m = __float2bfloat16_rn(r);
        xs[i] = h;
        xs[n + i] = m;
        xs[2 * n + i] = __float2bfloat16_rn(r - __bfloat162float(m));
    }
}

/* y[t][n] = p[t][n] + p[T + t][n] + p[2T + t][n] */
__global__ void k_add_thirds(const float *p, int T, int N, float *y) {
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
static int linear_bf16_blas(m3_cuda *c, const m3_linear *W, const float *x, int T, float *y) {
    if (W->fmt != M3_WF_BF16 || W->tiled || T < 2 || T > 8 || !bf16_blas_on() || (size_t)W->N * W->K < ((size_t)1 << 19) ||
        W->row_bytes != (size_t)2 * W->K || ((uintptr_t)W->w & 15) || W->K % 8)
        return -1;
    const size_t pn = (size_t)3 * T * W->N, xn = (size_t)3 * T * W->K;
    float *p = (float *)m3_cu_scratch(c, SC_DEQ, sizeof(float) * pn + sizeof(uint16_t) * xn + 256);
    if (!p) return 0;
    __nv_bfloat16 *xs = (__nv_bfloat16 *)(p + ((pn + 63) & ~(size_t)63));
    unsigned g = cdiv((size_t)T * W->K, 256);
    k_split3_bf16<<<g < 1024 ? g : 1024, 256, 0, c->st>>>(x, T, W->K, xs);
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
    k_add_thirds<<<g < 4096 ? g : 4096, 256, 0, c->st>>>(p, T, W->N, y);
    CK_LAUNCH(c, "add thirds");
    return 0;
}

void m3_cu_linear(void *ctx, const m3_linear *W, const float *x, int T, float *y) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_LINEAR);
    if (T <= 0 || c->failed) { m3_cu_prof_end(c, OP_LINEAR); return; }
    m3_cu_xsplit_touch(c, y, sizeof(float) * (size_t)T * W->N);
    /* MXFP8 / NVFP4 on the tensor cores in groups of 8 tokens up to 64 tokens */
    if (T <= 64 && m3_cu_mma_ok(W)) {
        for (int t0 = 0; t0 < T; t0 += 8)
            m3_cu_gemv_mma(c, W, x + (size_t)t0 * W->K, T - t0 < 8 ? T - t0 : 8, y + (size_t)t0 * W->N);
        { m3_cu_prof_end(c, OP_LINEAR); return; }
    }
    if (T <= 8) {
        if (linear_bf16_blas(c, W, x, T, y)) gemv(c, W, x, T, y);
        m3_cu_prof_end(c, OP_LINEAR);
        return;
    }
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
        k_dequant<<<g, 256, 0, c->st>>>(*W, n0, rows, wd);
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
    int fused = T >= 1 && T <= 64 && n >= 1 && n <= 6;
    for (int i = 0; i < n && fused; i++)
        fused = m3_cu_mma_ok(W[i]) && W[i]->fmt == W[0]->fmt && W[i]->K == W[0]->K && W[i]->tiled == W[0]->tiled;
    if (!fused) {
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

/* ------------------------------------------------------------------ dense MLP */

void m3_cu_mlp(void *ctx, const m3_mlp_w *m, const float *x, int T, float alpha, float limit, float *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_MLP);
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)T * m->down.N);
    int F = m->gate.N;
    float *g = (float *)m3_cu_scratch(c, SC_XE, sizeof(float) * (size_t)T * F * 2);
    if (!g) { m3_cu_prof_end(c, OP_MLP); return; }
    float *u = g + (size_t)T * F;
    const m3_linear *gu[2] = {&m->gate, &m->up};
    float *go[2] = {g, u};
    m3_cu_linear_n(c, 2, gu, x, T, go); /* one launch when both take the tensor cores */
    m3_cu_swiglu(c, g, u, (size_t)T * F, alpha, limit, g);
    m3_cu_linear(c, &m->down, g, T, out);
    m3_cu_prof_end(c, OP_MLP);
}

/* ------------------------------------------------------------------ MoE */

/* a warp (a block) per token */
__global__ void k_route(const float *logits, const float *bias, int E, int K, float scale, int32_t *pick, float *wt) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    extern __shared__ float sm[];
    const int t = blockIdx.x;
    route_token(logits + (size_t)t * E, bias, E, K, scale, pick + (size_t)t * K, wt + (size_t)t * K, sm, threadIdx.x);
}

/* gate + up + SwiGLU-OAI of every (token, expert) slot: blockIdx.y = slot; each warp two
 * intermediate rows j, j+1 (4 weight rows: gate j, j+1, up j, j+1) */
template <int F>
__global__ void __launch_bounds__(GW * 32) k_moe_gate_up(const m3_mlp_w *table, const int32_t *pick, int K, const float *x,
                                                          int H, int Fd, float alpha, float limit, float *h, int KT) {
    extern __shared__ float xs[];
    const int slot = blockIdx.y, t = slot / K, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const m3_mlp_w *m = &table[pick[slot]];
    const int j0 = blockIdx.x * (GW * 2) + warp * 2;
    const uint8_t *rw[4], *rs[4];
    float gm[4];
    bool ok[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const m3_linear *W = r < 2 ? &m->gate : &m->up;
        int j = j0 + (r & 1);
        ok[r] = j < Fd;
        rw[r] = W->w + (size_t)(ok[r] ? j : 0) * W->row_bytes;
        rs[r] = W->scale ? W->scale + (size_t)(ok[r] ? j : 0) * W->scale_row : NULL;
        gm[r] = W->gmul;
    }
    float acc[4][1] = {{0}, {0}, {0}, {0}};
    for (int kt0 = 0; kt0 < H; kt0 += KT) {
        int klen = H - kt0 < KT ? H - kt0 : KT;
        __syncthreads();
        stage_x<1>(x, H, t + 1, t, kt0, klen, xs, KT);
        __syncthreads();
        warp_rows<F, 1, 4>(rw, rs, gm, ok, kt0, klen, xs, KT, acc);
    }
    float v[4];
#pragma unroll
    for (int r = 0; r < 4; r++) v[r] = warp_sum(acc[r][0]);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (ok[r]) {
                float g = v[r] < limit ? v[r] : limit;
                float u = v[2 + r] < -limit ? -limit : v[2 + r] > limit ? limit : v[2 + r];
                h[(size_t)slot * Fd + j0 + r] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
            }
}

/* down projection of every slot: ye[slot][H] = down_e . h[slot] */
template <int F>
__global__ void __launch_bounds__(GW * 32) k_moe_down(const m3_mlp_w *table, const int32_t *pick, const float *h, int Fd,
                                                       int H, float *ye, int KT) {
    extern __shared__ float xs[];
    const int slot = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const m3_linear *W = &table[pick[slot]].down;
    const int n0 = blockIdx.x * (GW * GR) + warp * GR;
    const uint8_t *rw[GR], *rs[GR];
    float gm[GR];
    bool ok[GR];
#pragma unroll
    for (int r = 0; r < GR; r++) {
        int n = n0 + r;
        ok[r] = n < H;
        rw[r] = W->w + (size_t)(ok[r] ? n : 0) * W->row_bytes;
        rs[r] = W->scale ? W->scale + (size_t)(ok[r] ? n : 0) * W->scale_row : NULL;
        gm[r] = W->gmul;
    }
    float acc[GR][1];
#pragma unroll
    for (int r = 0; r < GR; r++) acc[r][0] = 0;
    for (int kt0 = 0; kt0 < Fd; kt0 += KT) {
        int klen = Fd - kt0 < KT ? Fd - kt0 : KT;
        __syncthreads();
        stage_x<1>(h, Fd, slot + 1, slot, kt0, klen, xs, KT);
        __syncthreads();
        warp_rows<F, 1, GR>(rw, rs, gm, ok, kt0, klen, xs, KT, acc);
    }
#pragma unroll
    for (int r = 0; r < GR; r++) {
        float v = warp_sum(acc[r][0]);
        if (lane == 0 && ok[r]) ye[(size_t)slot * H + n0 + r] = v;
    }
}

/* h[s][j] = SwiGLU-OAI(gu[s][0][j], gu[s][1][j]), and the f16 split of h (hi [n], then lo) */
__global__ void k_swiglu_pairs(const float *gu, int S, int Fd, float alpha, float limit, float *h, uint16_t *xs) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    size_t n = (size_t)S * Fd;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t s = i / Fd, j = i % Fd;
        float gt = gu[(s * 2) * Fd + j], up = gu[(s * 2 + 1) * Fd + j];
        float g = gt < limit ? gt : limit;
        float u = up < -limit ? -limit : up > limit ? limit : up;
        const float v = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
        h[i] = v;
        split_store(v, xs + i, xs + n + i);
    }
}

/* out[t] = sum_k wt[t,k] ye[t,k] in slot (= ascending expert) order, then + sh[t] (the shared
 * expert's output, added last as the CPU does) when sh is given */
__global__ void k_moe_combine(const float *ye, const float *wt, int K, int H, const float *sh, float *out) {
    int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x) {
        float s = 0;
        for (int k = 0; k < K; k++) s += wt[t * K + k] * ye[((size_t)t * K + k) * H + i];
        if (sh) s += sh[(size_t)t * H + i];
        out[(size_t)t * H + i] = s;
    }
}

__global__ void k_gather_rows(const float *x, const int32_t *rows, int n, int H, float *xe) {
    int i = blockIdx.y;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < H; k += gridDim.x * blockDim.x)
        xe[(size_t)i * H + k] = x[(size_t)rows[i] * H + k];
}
__global__ void k_scatter_add(float *out, const int32_t *rows, const float *w, int n, int H, const float *ye) {
    int i = blockIdx.y;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < H; k += gridDim.x * blockDim.x)
        out[(size_t)rows[i] * H + k] += w[i] * ye[(size_t)i * H + k];
}

static int kt_for(int K) {
    int KT = 12288;
    if (KT > K) KT = (K + 31) & ~31;
    return KT;
}

static void count_experts(m3_cuda *c, const int32_t *d_pick, int n, int E) {
    if ((size_t)n > c->h_pick_cap || !c->h_pick_seen) {
        free(c->h_pick);
        free(c->h_pick_seen);
        c->h_pick = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
        c->h_pick_seen = (uint8_t *)malloc((size_t)E > 4096 ? (size_t)E : 4096);
        c->h_pick_cap = c->h_pick ? (size_t)n : 0;
        if (!c->h_pick || !c->h_pick_seen) return;
    }
    if (CK(c, cudaMemcpyAsync(c->h_pick, d_pick, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost, c->st)) ||
        CK(c, cudaStreamSynchronize(c->st)))
        return;
    memset(c->h_pick_seen, 0, (size_t)E);
    for (int i = 0; i < n; i++)
        if (c->h_pick[i] >= 0 && c->h_pick[i] < E && !c->h_pick_seen[c->h_pick[i]]) { c->h_pick_seen[c->h_pick[i]] = 1; c->experts_used++; }
}

/* the residual add and RMSNorm that may follow the MoE in its combine's launch */
typedef struct moe_post {
    float *h;
    const float *w;
    float eps;
    float *normed;
    int done; /* set when the combine did it */
} moe_post;

static void moe_impl(m3_cuda *c, const m3_layer_w *L, const float *x, int T, int E, int K, float routed_scale, float alpha,
                     float limit, float *out, moe_post *post);

void m3_cu_moe(void *ctx, const m3_layer_w *L, const float *x, int T, int E, int K, float routed_scale, float alpha,
               float limit, float *out) {
    moe_impl((m3_cuda *)ctx, L, x, T, E, K, routed_scale, alpha, limit, out, NULL);
}

void m3_cu_moe_add_rmsnorm(void *ctx, const m3_layer_w *L, const float *x, int T, int E, int K, float routed_scale,
                           float alpha, float limit, float *out, float *h, const float *w, float eps, float *normed) {
    m3_cuda *c = (m3_cuda *)ctx;
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_MOE_NORM", 1) != 0;
    moe_post post = {h, w, eps, normed, 0};
    moe_impl(c, L, x, T, E, K, routed_scale, alpha, limit, out, on ? &post : NULL);
    if (!post.done) m3_cu_add_rmsnorm(c, h, out, w, T, L->router.K, eps, normed);
}

static void moe_impl(m3_cuda *c, const m3_layer_w *L, const float *x, int T, int E, int K, float routed_scale, float alpha,
                     float limit, float *out, moe_post *post) {
    m3_cu_prof_begin(c, OP_MOE);
    if (T <= 0 || c->failed) { m3_cu_prof_end(c, OP_MOE); return; }
    const int H = L->router.K, Fd = L->experts[0].gate.N;
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)T * H);
    /* router logits, picks and weights */
    enum { ROUTE_KPARTS = 4 }; /* the router GEMV's K split over CTAs (k_gemv_ks) */
    char *rb = (char *)m3_cu_scratch(c, SC_ROUTE, sizeof(float) * (size_t)T * E + 2 * sizeof(float) * (size_t)T * K +
                                                      sizeof(float) * ROUTE_KPARTS * 8 * (size_t)E + 64);
    if (!rb) { m3_cu_prof_end(c, OP_MOE); return; }
    float *logits = (float *)rb;
    int32_t *pick = (int32_t *)(logits + (size_t)T * E);
    float *wt = (float *)(pick + (size_t)T * K);
    /* the router's GEMV routes in its last CTA where it can (one launch less), else k_route */
    static int kparts = -1;
    if (kparts < 0) kparts = m3_cu_env_int("M3_ROUTE_KPARTS", ROUTE_KPARTS);
    if (kparts < 1 || kparts > ROUTE_KPARTS) kparts = ROUTE_KPARTS;
    route_args ra = {ctr_aux(c, CTR_AUX_ROUTE), L->route_bias, E, K, routed_scale, pick, wt, wt + (size_t)T * K, kparts};
    int routed = 0;
    m3_cu_xsplit_touch(c, logits, sizeof(float) * (size_t)T * E);
    /* 1, 2, 4 or 8 tokens (a verify pass): k_gemv_ks, which reads x where it lies when it does not fit
     * shared memory (its rows must all exist: T a power of two); 8 tokens: 5.7 us of cuBLAS + 4 us of
     * reduce / add + 5.7 us of k_route before */
    if ((T == 1 || T == 2 || T == 4 || T == 8) && !m3_cu_mma_ok(&L->router) && m3_cu_fuse_on() && fast_shape(&L->router))
        routed = gemv(c, &L->router, x, T, logits, &ra);
    else m3_cu_linear(c, &L->router, x, T, logits);
    if (!routed) {
        k_route<<<T, 32, sizeof(float) * 2 * (size_t)E + sizeof(int) * (size_t)K, c->st>>>(logits, L->route_bias, E, K,
                                                                                           routed_scale, pick, wt);
        if (CK_LAUNCH(c, "route")) { m3_cu_prof_end(c, OP_MOE); return; }
    }
    if (c->count_experts) count_experts(c, pick, T * K, E);

    const m3_mlp_w *e0 = &L->experts[0];
    /* expert parallel (src/parallel/shard.h): experts held by other ranks have no weights; the
     * host-grouped path below skips them (the graph-free kernels read every picked expert) */
    int absent = 0;
    for (int e = 0; e < E && !absent; e++) absent = !L->experts[e].gate.w;
    const int mma = m3_cu_mma_ok(&e0->gate) && m3_cu_mma_ok(&e0->up) && m3_cu_mma_ok(&e0->down);
    /* every expert on the device in one format: the kernels below read them from the device table */
    const int table = !absent && L->backend && e0->gate.fmt == e0->up.fmt && e0->gate.fmt == e0->down.fmt;
    int fast = table && T <= 8 && (mma || (fast_shape(&e0->gate) && fast_shape(&e0->up) && fast_shape(&e0->down)));
    /* 2-8 tokens (and batches up to 4 MOE_GROUP_T in chunks of MOE_GROUP_T): each picked expert read
     * once for all its tokens of a chunk (up to 4 per read; a verify pass of 8 tokens picks ~49
     * distinct experts of 64 slots per layer); M3_MOE_GROUPED=0: one read per slot. Longer runs
     * (prefill chunks) group on the host, below. */
    static int grouped = -1;
    if (grouped < 0) grouped = m3_cu_env_int("M3_MOE_GROUPED", 1) != 0;
    const int gbig = table && mma && grouped && T > 8 && T <= 4 * MOE_GROUP_T && K <= MOE_GROUP_S / MOE_GROUP_T;
    if (fast || gbig) {
        const m3_mlp_w *tab = (const m3_mlp_w *)L->backend;
        for (int t0 = 0; t0 < T && mma; t0 += MOE_GROUP_T) { /* tensor cores: (gate, up) of every slot, SwiGLU, down */
            const int tc = T - t0 < MOE_GROUP_T ? T - t0 : MOE_GROUP_T, S = tc * K;
            const float *xc = x + (size_t)t0 * H;
            const int32_t *pc = pick + (size_t)t0 * K;
            float *h = (float *)m3_cu_scratch(c, SC_MOE, sizeof(float) * (size_t)S * (Fd + H));
            float *gu = (float *)m3_cu_scratch(c, SC_YE, sizeof(float) * (size_t)S * Fd * 2);
            if (!h || !gu) { m3_cu_prof_end(c, OP_MOE); return; }
            float *ye = h + (size_t)S * Fd;
            const int grp = grouped && tc >= 2 && m3_cu_moe_grouped(c, e0, tab, pc, tc, K, E, 0, xc, H, gu) == 0;
            if (!grp) m3_cu_moe_mma(c, e0, tab, pc, K, S, 0, xc, H, gu);
            uint16_t *hs = m3_cu_xsplit_claim(c, h, (size_t)S * Fd);
            if (!hs) { m3_cu_prof_end(c, OP_MOE); return; }
            k_swiglu_pairs<<<cdiv((size_t)S * Fd, 256), 256, 0, c->st>>>(gu, S, Fd, alpha, limit, h, hs);
            if (grp) m3_cu_moe_grouped(c, e0, tab, pc, tc, K, E, 2, h, Fd, ye);
            else m3_cu_moe_mma(c, e0, tab, pc, K, S, 2, h, Fd, ye);
            float *sh = NULL;
            if (L->has_shared) { /* the shared expert first, so that the combine adds it (one launch less) */
                sh = (float *)m3_cu_scratch(c, SC_YE, sizeof(float) * (size_t)tc * H); /* gu is spent */
                if (!sh) { m3_cu_prof_end(c, OP_MOE); return; }
                m3_cu_mlp(c, &L->shared, xc, tc, alpha, limit, sh);
            }
            /* the combine, with the residual add and next norm when asked (the whole batch in this chunk) */
            const norm_combine cb = {ye, wt + (size_t)t0 * K, sh, out + (size_t)t0 * H, K};
            if (post && t0 == 0 && tc == T && m3_cu_combine_add_rmsnorm(c, &cb, post->h, post->w, T, H, post->eps, post->normed))
                post->done = 1;
            else
                k_moe_combine<<<dim3(cdiv(H, 256), tc), 256, 0, c->st>>>(ye, wt + (size_t)t0 * K, K, H, sh,
                                                                          out + (size_t)t0 * H);
            if (CK_LAUNCH(c, "moe (tensor cores)")) { m3_cu_prof_end(c, OP_MOE); return; }
            if (t0 + tc >= T) { m3_cu_prof_end(c, OP_MOE); return; }
        }
        int S = T * K;
        float *h = (float *)m3_cu_scratch(c, SC_MOE, sizeof(float) * (size_t)S * (Fd + H));
        if (!h) { m3_cu_prof_end(c, OP_MOE); return; }
        float *ye = h + (size_t)S * Fd;
        int kt1 = kt_for(H), kt2 = kt_for(Fd);
        dim3 g1(cdiv(Fd, GW * 2), S), g2(cdiv(H, GW * GR), S);
        size_t s1 = sizeof(float) * kt1, s2 = sizeof(float) * kt2;
#define MOE_LAUNCH(FM)                                                                                          \
    k_moe_gate_up<FM><<<g1, GW * 32, s1, c->st>>>(tab, pick, K, x, H, Fd, alpha, limit, h, kt1);                \
    k_moe_down<FM><<<g2, GW * 32, s2, c->st>>>(tab, pick, h, Fd, H, ye, kt2);
        switch (e0->gate.fmt) {
        case M3_WF_F32: MOE_LAUNCH(M3_WF_F32); break;
        case M3_WF_BF16: MOE_LAUNCH(M3_WF_BF16); break;
        case M3_WF_F16: MOE_LAUNCH(M3_WF_F16); break;
        case M3_WF_MXFP8: MOE_LAUNCH(M3_WF_MXFP8); break;
        default: MOE_LAUNCH(M3_WF_NVFP4); break;
        }
#undef MOE_LAUNCH
        if (CK_LAUNCH(c, "moe experts")) { m3_cu_prof_end(c, OP_MOE); return; }
        k_moe_combine<<<dim3(cdiv(H, 256), T), 256, 0, c->st>>>(ye, wt, K, H, NULL, out);
        if (CK_LAUNCH(c, "moe combine")) { m3_cu_prof_end(c, OP_MOE); return; }
    } else {
        /* group tokens by expert on the host */
        int n = T * K;
        int32_t *hp = (int32_t *)malloc(sizeof(int32_t) * (size_t)n * 2 + sizeof(float) * (size_t)n * 2);
        int *off = (int *)malloc(sizeof(int) * (size_t)(E + 1));
        if (!hp || !off) { free(hp); free(off); m3_cu_failf(c, "out of memory"); { m3_cu_prof_end(c, OP_MOE); return; } }
        float *hw = (float *)(hp + n);
        int32_t *rows = (int32_t *)(hw + n);
        float *rw = (float *)(rows + n);
        int m = 0;
        if (CK(c, cudaMemcpyAsync(hp, pick, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost, c->st)) ||
            CK(c, cudaMemcpyAsync(hw, wt, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost, c->st)) ||
            CK(c, cudaStreamSynchronize(c->st)))
            goto slow_done;
        for (int e = 0; e < E; e++) {
            off[e] = m;
            for (int t = 0; t < T; t++)
                for (int k = 0; k < K; k++)
                    if (hp[t * K + k] == e) { rows[m] = t; rw[m] = hw[t * K + k]; m++; }
        }
        off[E] = m;
        {
            int32_t *drows = (int32_t *)m3_cu_scratch(c, SC_IDX, sizeof(int32_t) * (size_t)m * 2 + 64);
            float *xe = (float *)m3_cu_scratch(c, SC_MOE, sizeof(float) * (size_t)T * (2 * (size_t)Fd + 2 * (size_t)H));
            if (!drows || !xe) goto slow_done;
            float *dw = (float *)(drows + m);
            CK(c, cudaMemcpyAsync(drows, rows, sizeof(int32_t) * (size_t)m, cudaMemcpyHostToDevice, c->st));
            CK(c, cudaMemcpyAsync(dw, rw, sizeof(float) * (size_t)m, cudaMemcpyHostToDevice, c->st));
            float *ye = xe + (size_t)T * H, *g = ye + (size_t)T * H, *u = g + (size_t)T * Fd;
            CK(c, cudaMemsetAsync(out, 0, sizeof(float) * (size_t)T * H, c->st));
            for (int e = 0; e < E && !c->failed; e++) {
                int cnt = off[e + 1] - off[e];
                if (!cnt || !L->experts[e].gate.w) continue; /* not picked, or another rank's */
                const m3_mlp_w *me = &L->experts[e];
                dim3 gg(cdiv(H, 256) < 64 ? cdiv(H, 256) : 64, cnt);
                m3_cu_xsplit_touch(c, xe, sizeof(float) * (size_t)cnt * H);
                k_gather_rows<<<gg, 256, 0, c->st>>>(x, drows + off[e], cnt, H, xe);
                m3_cu_linear(c, &me->gate, xe, cnt, g);
                m3_cu_linear(c, &me->up, xe, cnt, u);
                m3_cu_swiglu(c, g, u, (size_t)cnt * Fd, alpha, limit, g);
                m3_cu_linear(c, &me->down, g, cnt, ye);
                k_scatter_add<<<gg, 256, 0, c->st>>>(out, drows + off[e], dw + off[e], cnt, H, ye);
                CK_LAUNCH(c, "moe expert");
            }
            CK(c, cudaStreamSynchronize(c->st)); /* rows / rw (host) were read by async copies */
        }
    slow_done:
        free(hp);
        free(off);
        if (c->failed) { m3_cu_prof_end(c, OP_MOE); return; }
    }
    /* the SIMT and host-grouped paths: the shared expert added after the routed ones */
    if (L->has_shared) {
        float *sh = (float *)m3_cu_scratch(c, SC_YE, sizeof(float) * (size_t)T * H);
        if (!sh) { m3_cu_prof_end(c, OP_MOE); return; }
        m3_cu_mlp(c, &L->shared, x, T, alpha, limit, sh);
        m3_cu_add(c, out, sh, (size_t)T * H);
    }
    m3_cu_prof_end(c, OP_MOE);
}
