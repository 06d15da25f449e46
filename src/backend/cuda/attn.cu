/* Paged KV / index-K cache on the GPU: insert with the spec's rounding, the lightning
 * indexer (block scores + per-head top-k) and block-sparse / dense attention.
 *
 * Page layout (src/kv/kv.h): layer L's page p at base[L] + p * page_bytes[L]:
 *   K [nkv][page][D], V [nkv][page][D], then (sparse layers) index-K [page][Di],
 * rows in the cache dtype (f32, bf16, FP8 E4M3, NVFP4 codes + E4M3 scales per 16).
 * Readers dequantize rows into shared memory as f32.
 *
 * Attention: a CTA per (key split, KV group, token) walks 32-key chunks of the keys the
 * token may see (the selected blocks, or [0, pos] on dense layers), online softmax per
 * query head of the group; splits are merged by log-sum-exp. Splits are chosen so that a
 * decode step fills the GPU (at least 32 per (token, group) up to 8 tokens: a verify pass);
 * prefill gets one split per (token, group). Caches whose values are exact in bf16 (bf16, FP8,
 * NVFP4; FP8 / NVFP4 from 2 tokens) take the tensor-core kernel (k_attn_mma: a warp per chunk,
 * products on mma.sync with q and the probabilities split in three bf16 parts); f32 caches and
 * other shapes the f32 ones.
 * M3_ATTN_MMA=0 turns the tensor-core kernel off. */
#include <math.h>

#include "common.cuh"

typedef struct kvdesc {
    uint8_t *base;
    size_t page_bytes, kvpart, rb, irb;
    int page, nkv, D, Di, dt, idt;
    const int32_t *ptab;
    int stride;
} kvdesc;

static kvdesc desc(m3_cuda *c, const m3_kv *kv, int layer) {
    kvdesc d;
    d.base = kv->base[layer];
    d.page_bytes = kv->page_bytes[layer];
    d.rb = m3_kv_row_bytes(kv->dt, kv->D);
    d.irb = m3_kv_row_bytes(kv->idt, kv->Di);
    d.kvpart = (size_t)kv->nkv * kv->page * d.rb;
    d.page = kv->page;
    d.nkv = kv->nkv;
    d.D = kv->D;
    d.Di = kv->Di;
    d.dt = kv->dt;
    d.idt = kv->idt;
    d.ptab = c->d_ptab;
    d.stride = c->ptab_stride;
    return d;
}

static __device__ __forceinline__ uint8_t *page_of(const kvdesc &d, int seq, int pos) {
    int pg = d.ptab[(size_t)seq * d.stride + pos / d.page];
    return d.base + (size_t)pg * d.page_bytes;
}

/* element i of a stored row */
static __device__ __forceinline__ float read_el(const uint8_t *row, int dt, int dim, int i) {
    switch (dt) {
    case M3_KV_F32: return ((const float *)row)[i];
    case M3_KV_BF16: return bf16_f32(((const uint16_t *)row)[i]);
    case M3_KV_FP8: return e4m3_f32(row[i]);
    default: {
        uint32_t code = (i & 1) ? (row[i / 2] >> 4) : (row[i / 2] & 15);
        return (e2m1x2_f32(code).x * 16384.0f) * e4m3_f32(row[dim / 2 + i / 16]);
    }
    }
}

/* values [e, e + 8) of a stored row (e % 8 == 0); vector loads where the row is aligned
 * for them (NVFP4 rows of 16 values are 18 bytes long), element loads otherwise */
static __device__ __forceinline__ void read8(const uint8_t *row, int dt, int dim, int e, float *o) {
    const uintptr_t al = (uintptr_t)row & 15;
    if ((dt == M3_KV_F32 && al) || (dt == M3_KV_BF16 && al) || (dt == M3_KV_FP8 && (al & 7))) {
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = read_el(row, dt, dim, e + i);
    } else if (dt == M3_KV_F32) {
        float4 a = *(const float4 *)(row + 4 * e), b = *(const float4 *)(row + 4 * e + 16);
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    } else if (dt == M3_KV_BF16) {
        uint4 q = *(const uint4 *)(row + 2 * e);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) { o[2 * i] = __uint_as_float(u[i] << 16); o[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u); }
    } else if (dt == M3_KV_FP8) {
        uint2 q = *(const uint2 *)(row + e);
        float2 f0 = e4m3x2_f32(q.x & 0xffff), f1 = e4m3x2_f32(q.x >> 16), f2 = e4m3x2_f32(q.y & 0xffff), f3 = e4m3x2_f32(q.y >> 16);
        o[0] = f0.x; o[1] = f0.y; o[2] = f1.x; o[3] = f1.y; o[4] = f2.x; o[5] = f2.y; o[6] = f3.x; o[7] = f3.y;
    } else {
        const uint8_t *cp = row + e / 2;
        uint32_t q = ((uintptr_t)cp & 3) == 0 ? *(const uint32_t *)cp
                                                : (uint32_t)cp[0] | ((uint32_t)cp[1] << 8) | ((uint32_t)cp[2] << 16) | ((uint32_t)cp[3] << 24);
        float s = e4m3_f32(row[dim / 2 + e / 16]) * 16384.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = e2m1x2_f32((q >> (8 * i)) & 0xff);
            o[2 * i] = f.x * s;
            o[2 * i + 1] = f.y * s;
        }
    }
}

/* values [e, e + 16) of a stored row (e % 16 == 0): NVFP4 as one 8-byte word of codes and
 * one scale, FP8 as one 16-byte word, where aligned; else two read8 */
static __device__ __forceinline__ void read16(const uint8_t *row, int dt, int dim, int e, float *o) {
    if (dt == M3_KV_NVFP4 && (((uintptr_t)row + e / 2) & 7) == 0) {
        uint2 q = *(const uint2 *)(row + e / 2);
        float s = e4m3_f32(row[dim / 2 + e / 16]) * 16384.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float2 f = e2m1x2_f32(((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xff);
            o[2 * i] = f.x * s;
            o[2 * i + 1] = f.y * s;
        }
    } else if (dt == M3_KV_FP8 && (((uintptr_t)row + e) & 15) == 0) {
        uint4 q = *(const uint4 *)(row + e);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 a = e4m3x2_f32(u[i] & 0xffff), b = e4m3x2_f32(u[i] >> 16);
            o[4 * i] = a.x; o[4 * i + 1] = a.y; o[4 * i + 2] = b.x; o[4 * i + 3] = b.y;
        }
    } else {
        read8(row, dt, dim, e, o);
        read8(row, dt, dim, e + 8, o + 8);
    }
}

/* threads tid = 0 .. nt - 1 (a block, or a warp) write one row of dim values (NVFP4: one
 * thread per 16-value group) */
static __device__ void write_row(uint8_t *dst, int dt, const float *src, int dim, int tid, int nt) {
    switch (dt) {
    case M3_KV_F32:
        for (int i = tid; i < dim; i += nt) ((float *)dst)[i] = src[i];
        break;
    case M3_KV_BF16:
        for (int i = tid; i < dim; i += nt) ((uint16_t *)dst)[i] = f32_bf16(src[i]);
        break;
    case M3_KV_FP8:
        for (int i = tid; i < dim; i += nt) dst[i] = f32_e4m3(src[i]);
        break;
    default:
        for (int g = tid; g < dim / 16; g += nt) {
            const float *v = src + 16 * g;
            float amax = 0;
            for (int i = 0; i < 16; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
            uint8_t sc = f32_e4m3(amax / 6.0f);
            float s = e4m3_f32(sc);
            dst[dim / 2 + g] = sc;
            for (int i = 0; i < 16; i += 2) {
                uint32_t lo = s == 0 ? 0 : f32_e2m1(v[i] / s), hi = s == 0 ? 0 : f32_e2m1(v[i + 1] / s);
                dst[(16 * g + i) / 2] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
}

/* a block per (token, row): rows 0 .. 2 nkv - 1 the K then V heads, row 2 nkv the index key */
__global__ void k_kv_store(kvdesc d, const int32_t *pos, const int32_t *seq, const float *k, const float *v, const float *ik) {
    const int t = blockIdx.x, r = blockIdx.y, p = pos[t], slot = p % d.page;
    uint8_t *pg = page_of(d, seq[t], p);
    if (r < 2 * d.nkv) {
        int part = r / d.nkv, h = r % d.nkv;
        const float *src = (part ? v : k) + ((size_t)t * d.nkv + h) * d.D;
        write_row(pg + part * d.kvpart + ((size_t)h * d.page + slot) * d.rb, d.dt, src, d.D, threadIdx.x, blockDim.x);
    } else if (ik)
        write_row(pg + 2 * d.kvpart + (size_t)slot * d.irb, d.idt, ik + (size_t)t * d.Di, d.Di, threadIdx.x, blockDim.x);
}

void m3_cu_kv_store(void *ctx, m3_kv *kv, int layer, const m3_batch *b, const float *k, const float *v, const float *ik) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_KV);
    if (c->failed) { m3_cu_prof_end(c, OP_KV); return; }
    if (b != c->step_b) { m3_cu_failf(c, "CUDA backend: kv_store outside its step"); { m3_cu_prof_end(c, OP_KV); return; } }
    k_kv_store<<<dim3(b->T, 2 * kv->nkv + (ik ? 1 : 0)), 64, 0, c->st>>>(desc(c, kv, layer), c->d_pos, c->d_seq, k, v, ik);
    CK_LAUNCH(c, "kv_store");
    m3_cu_prof_end(c, OP_KV);
}

/* ------------------------------------------------------------------ norm + RoPE + KV insert
 * head_norm_rope_n and kv_store in one launch: a warp per (tensor, token, head) of q, k, index
 * q, index k, then a warp per (token, head) of v. A warp holds its head in registers (one load
 * round trip), normalizes it (double sum in the order of head_norm_rope_warp, elem.cu), rotates
 * it through its shared-memory row, writes it back, and writes k, index k and v rows into
 * their cache slots. Same arithmetic as the two ops it replaces. */
#define RS_MAXD 256 /* head dims up to this */
#define RS_WARPS 4
typedef struct { m3_rope_job j[4]; int n, first[6]; const float *v; } rope_store_jobs;

__global__ void __launch_bounds__(RS_WARPS * 32) k_rope_store(const __grid_constant__ rope_store_jobs a, float eps, int rot,
                                                               float theta, kvdesc d, const int32_t *pos, const int32_t *seq) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    __shared__ float rows[RS_WARPS][RS_MAXD];
    const int gw = blockIdx.x * RS_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (gw >= a.first[a.n + 1]) return;
    int i = 0;
    while (gw >= a.first[i + 1]) i++;
    const int local = gw - a.first[i];
    float *sv = rows[threadIdx.x / 32];
    const bool isv = i == a.n; /* a v row: stored as it is */
    const int heads = isv ? d.nkv : a.j[i].heads, dim = isv ? d.D : a.j[i].dim, t = local / heads, h = local % heads;
    float *x = isv ? (float *)a.v + (size_t)local * dim : a.j[i].x + (size_t)local * dim;
    float r[RS_MAXD / 32];
#pragma unroll
    for (int k = 0; k < RS_MAXD / 32; k++)
        if (lane + 32 * k < dim) r[k] = x[lane + 32 * k];
    const int p = pos[t];
    if (!isv) {
        const float *w = a.j[i].w;
        double ss = 0;
#pragma unroll
        for (int k = 0; k < RS_MAXD / 32; k++)
            if (lane + 32 * k < dim) ss += (double)r[k] * r[k];
#pragma unroll
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float rs = (float)(1.0 / sqrt(ss / dim + eps));
#pragma unroll
        for (int k = 0; k < RS_MAXD / 32; k++)
            if (lane + 32 * k < dim) sv[lane + 32 * k] = (r[k] * rs) * (1.0f + w[lane + 32 * k]);
        __syncwarp();
        rope_rotate(sv, rot, theta, (float)p, lane);
        __syncwarp();
        for (int k = lane; k < dim; k += 32) x[k] = sv[k];
    } else {
#pragma unroll
        for (int k = 0; k < RS_MAXD / 32; k++)
            if (lane + 32 * k < dim) sv[lane + 32 * k] = r[k];
        __syncwarp();
    }
    /* k (job 1), index k (job 3) and v rows go to the cache */
    if (i == 1 || i == 3 || isv) {
        uint8_t *pg = page_of(d, seq[t], p);
        const int slot = p % d.page;
        if (i == 3) write_row(pg + 2 * d.kvpart + (size_t)slot * d.irb, d.idt, sv, d.Di, lane, 32);
        else write_row(pg + (isv ? d.kvpart : 0) + ((size_t)h * d.page + slot) * d.rb, d.dt, sv, d.D, lane, 32);
    }
}

void m3_cu_head_norm_rope_store(void *ctx, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim, double theta,
                                m3_kv *kv, int layer, const m3_batch *b, const float *v) {
    m3_cuda *c = (m3_cuda *)ctx;
    int fits = (n == 2 || n == 4) && kv->D <= RS_MAXD && kv->Di <= RS_MAXD && rotary_dim <= kv->D && b == c->step_b &&
               jobs[1].heads == kv->nkv && jobs[1].dim == kv->D && (n == 2 || (jobs[3].heads == 1 && jobs[3].dim == kv->Di));
    for (int i = 0; i < n && fits; i++) fits = jobs[i].dim <= RS_MAXD && rotary_dim <= jobs[i].dim;
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_ROPE_STORE", 1) != 0;
    if (!fits || !on) { /* the two ops */
        m3_cu_head_norm_rope_n(ctx, n, jobs, T, eps, rotary_dim, theta, b->pos);
        m3_cu_kv_store(ctx, kv, layer, b, jobs[1].x, v, n == 4 ? jobs[3].x : NULL);
        return;
    }
    m3_cu_prof_begin(c, OP_ROPE);
    if (c->failed) { m3_cu_prof_end(c, OP_ROPE); return; }
    rope_store_jobs a;
    memset(&a, 0, sizeof a);
    a.n = n;
    a.v = v;
    a.first[0] = 0;
    for (int i = 0; i < n; i++) {
        a.j[i] = jobs[i];
        a.first[i + 1] = a.first[i] + T * jobs[i].heads;
        m3_cu_xsplit_touch(c, jobs[i].x, sizeof(float) * (size_t)T * jobs[i].heads * jobs[i].dim);
    }
    a.first[n + 1] = a.first[n] + T * kv->nkv;
    k_rope_store<<<cdiv(a.first[n + 1], RS_WARPS), RS_WARPS * 32, 0, c->st>>>(a, eps, rotary_dim, (float)theta,
                                                                             desc(c, kv, layer), c->d_pos, c->d_seq);
    CK_LAUNCH(c, "head_norm_rope + kv_store");
    m3_cu_prof_end(c, OP_ROPE);
}

/* ------------------------------------------------------------------ indexer */

/* scores[t][g][blk] = max over the keys of block blk visible to token t of iq[t][g] . ik;
 * a warp per block, lanes over keys (blocks of more than 256 keys or Di % 16 != 0; else
 * k_index_scores_k) */
__global__ void k_index_scores(kvdesc d, const int32_t *pos, const int32_t *seq, const float *iq, int ni, int B, int nbmax,
                               float *scores) {
    extern __shared__ float qs[]; /* [ni][Di] */
    const int t = blockIdx.y, p = pos[t], nb = p / B + 1;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    for (int i = threadIdx.x; i < ni * d.Di; i += blockDim.x) qs[i] = iq[(size_t)t * ni * d.Di + i];
    __syncthreads();
    const bool v8 = d.Di % 8 == 0;
    for (int blk = blockIdx.x * nw + warp; blk < nb; blk += gridDim.x * nw) {
        int p0 = blk * B, n = blk == nb - 1 ? p - p0 + 1 : B;
        float best[8];
#pragma unroll
        for (int g = 0; g < 8; g++) best[g] = -INFINITY;
        for (int i = lane; i < n; i += 32) {
            int kp = p0 + i;
            const uint8_t *row = page_of(d, seq[t], kp) + 2 * d.kvpart + (size_t)(kp % d.page) * d.irb;
            float dot[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (v8) {
                for (int e = 0; e < d.Di; e += 8) {
                    float kv[8];
                    read8(row, d.idt, d.Di, e, kv);
#pragma unroll
                    for (int g = 0; g < 8; g++) {
                        if (g >= ni) break;
                        const float *q = qs + g * d.Di + e;
                        float4 qa = *(const float4 *)q, qb = *(const float4 *)(q + 4);
                        dot[g] += qa.x * kv[0] + qa.y * kv[1] + qa.z * kv[2] + qa.w * kv[3] + qb.x * kv[4] + qb.y * kv[5] +
                                  qb.z * kv[6] + qb.w * kv[7];
                    }
                }
            } else {
                for (int e = 0; e < d.Di; e++) {
                    float kv = read_el(row, d.idt, d.Di, e);
#pragma unroll
                    for (int g = 0; g < 8; g++)
                        if (g < ni) dot[g] += qs[g * d.Di + e] * kv;
                }
            }
#pragma unroll
            for (int g = 0; g < 8; g++)
                if (g < ni) best[g] = fmaxf(best[g], dot[g]);
        }
#pragma unroll
        for (int g = 0; g < 8; g++) {
            if (g >= ni) break;
            float m = warp_max(best[g]);
            if (lane == 0) scores[((size_t)t * ni + g) * nbmax + blk] = m;
        }
    }
}

/* Top-k of one (token, head) row of nb block scores by a warp: the forced local / initial
 * blocks first (qb: the token's own block), then the highest scores (lowest block on ties),
 * written ascending to out[topk], -1 padded. sc is modified; pk: topk ints of scratch. */
static __device__ __forceinline__ void topk_warp(float *sc, int nb, int qb, int topk, int local, int init, int *pk,
                                                 int32_t *out, int lane) {
    for (int blk = lane; blk < nb; blk += 32)
        if ((blk >= qb - local + 1 && blk <= qb) || blk < init) sc[blk] = INFINITY;
    __syncwarp();
    /* Each pass: every lane's best remaining block (highest score, lowest block on ties), then
     * the warp's by two one-instruction reductions (redux.sync) on an order-preserving key of
     * the score and on the block. Each lane reads and writes only blocks = lane mod 32, so the
     * passes need no synchronization; the picks are then put in ascending order by rank. */
    const uint32_t none = fkey(-INFINITY);
    int got = 0;
    for (int k = 0; k < topk && k < nb; k++) {
        uint32_t bk = none;
        int bi = 0x7fffffff;
        for (int blk = lane; blk < nb; blk += 32) {
            const float s = sc[blk];
            const uint32_t key = isnan(s) ? none : fkey(s == 0.0f ? 0.0f : s); /* -0 ties +0 */
            if (key > bk) { bk = key; bi = blk; }
        }
        const uint32_t mk = __reduce_max_sync(0xffffffffu, bk);
        if (mk == none) break;
        const int pick = (int)__reduce_min_sync(0xffffffffu, bk == mk ? (uint32_t)bi : 0x7fffffffu);
        if ((pick & 31) == lane) sc[pick] = -INFINITY;
        if (lane == 0) pk[got] = pick;
        got++;
    }
    __syncwarp();
    for (int k = lane; k < topk; k += 32) {
        if (k < got) {
            const int v = pk[k];
            int r = 0;
            for (int j = 0; j < got; j++) r += pk[j] < v;
            out[r] = v;
        } else
            out[k] = -1;
    }
}

typedef struct topk_args { /* the indexer's top-k, run by the last CTA of a token (tctr set) */
    int *tctr;               /* arrival counters, one per token */
    int topk, local, init;
    int32_t *sel;
} topk_args;

/* `bytes` from global src into shared dst in pieces of type P (uint4 or uint2), 16 pieces
 * requested before any is stored */
template <typename P> static __device__ __forceinline__ void stage_pieces(const uint8_t *src, uint8_t *dst, int bytes) {
    for (int b0 = 0; b0 < bytes; b0 += 16 * (int)sizeof(P)) {
        P r[16];
#pragma unroll
        for (int u = 0; u < 16; u++)
            if (b0 + (int)sizeof(P) * u < bytes) r[u] = __ldg((const P *)(src + b0) + u);
#pragma unroll
        for (int u = 0; u < 16; u++)
            if (b0 + (int)sizeof(P) * u < bytes) ((P *)(dst + b0))[u] = r[u];
    }
}

/* A row of `bytes` (a multiple of 8) from global src into shared dst: every piece requested
 * before any is stored (one memory round trip per 256 bytes, not one per piece the math reads) */
static __device__ __forceinline__ const uint8_t *stage_row(const uint8_t *src, uint8_t *dst, int bytes) {
    if ((bytes & 15) == 0 && ((uintptr_t)src & 15) == 0) stage_pieces<uint4>(src, dst, bytes);
    else stage_pieces<uint2>(src, dst, bytes);
    return dst;
}

/* The same scores with a CTA per (block, token) and a thread per key, for blocks of at most
 * 256 keys and Di % 16 == 0: each thread has all of its key's loads in flight at once (a warp
 * per block waits on memory once per 16 values of 4 keys in turn), and blocks spread over
 * every SM. Same products in the same order as k_index_scores. With rs > 0
 * each thread first copies its key's index-K row into shared memory (rows rs bytes apart after
 * the q and maxima areas), with the query's loads in flight at the same time; with ta.tctr the
 * last CTA of each token runs its top-k (topk_warp). */
__global__ void __launch_bounds__(256, 2) k_index_scores_k(kvdesc d, const int32_t *pos, const int32_t *seq, const float *iq,
                                                        int ni, int B, int nbmax, float *scores, topk_args ta, int rs) {
    extern __shared__ __align__(16) float qs[]; /* [ni][Di], then [warps][8] maxima, then the staged rows;
                                                 * fused top-k: [ni][nbmax], [ni][topk] */
    const int t = blockIdx.y, blk = blockIdx.x, nq = ni * d.Di;
    float qv[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int k = threadIdx.x + u * blockDim.x;
        qv[u] = k < nq ? iq[(size_t)t * nq + k] : 0.0f;
    }
    const int p = pos[t], nb = p / B + 1;
    if (blk >= nb) return; /* uniform across the CTA */
    float *red = qs + nq;
    const int p0 = blk * B, n = blk == nb - 1 ? p - p0 + 1 : B, i = threadIdx.x;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const uint8_t *row = NULL;
    if (i < n) {
        const int kp = p0 + i;
        row = page_of(d, seq[t], kp) + 2 * d.kvpart + (size_t)(kp % d.page) * d.irb;
        if (rs) {
            uint8_t *stage = (uint8_t *)qs + (((size_t)nq + 8 * (blockDim.x / 32)) * sizeof(float) + 15 & ~(size_t)15);
            row = stage_row(row, stage + (size_t)i * rs, d.irb);
        }
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int k = threadIdx.x + u * blockDim.x;
        if (k < nq) qs[k] = qv[u];
    }
    for (int k = threadIdx.x + 8 * blockDim.x; k < nq; k += blockDim.x) qs[k] = iq[(size_t)t * nq + k];
    __syncthreads();
    float dot[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (i < n) {
#pragma unroll 1 /* a rolled loop: the kernel runs once per SM, so its code arrives cold (unrolled x4: 5.7K instructions) */
        for (int e = 0; e < d.Di; e += 16) {
            float kv[16];
            read16(row, d.idt, d.Di, e, kv);
#pragma unroll
            for (int g = 0; g < 8; g++) {
                if (g >= ni) break;
                const float *qp = qs + g * d.Di + e;
#pragma unroll
                for (int h = 0; h < 16; h += 4) {
                    float4 qa = *(const float4 *)(qp + h);
                    dot[g] += qa.x * kv[h] + qa.y * kv[h + 1] + qa.z * kv[h + 2] + qa.w * kv[h + 3];
                }
            }
        }
    }
#pragma unroll
    for (int g = 0; g < 8; g++) {
        if (g >= ni) break;
        float m = warp_max(i < n ? dot[g] : -INFINITY);
        if (lane == 0) red[warp * 8 + g] = m;
    }
    __syncthreads();
    if (threadIdx.x < ni) {
        float m = -INFINITY;
        for (int w = 0; w < (int)blockDim.x / 32; w++) m = fmaxf(m, red[w * 8 + threadIdx.x]);
        scores[((size_t)t * ni + threadIdx.x) * nbmax + blk] = m;
    }
    if (!ta.tctr || !last_cta(ta.tctr + t, nb)) return;
    /* every block of token t is scored: its top-k, a warp per head, each row in shared memory */
    const int nw = blockDim.x / 32;
    for (int g = warp; g < ni; g += nw) {
        float *row = qs + (size_t)g * nbmax;
        int *pk = (int *)(qs + (size_t)ni * nbmax) + g * ta.topk;
        const float *src = scores + ((size_t)t * ni + g) * nbmax;
        for (int b = lane; b < nb; b += 32) row[b] = __ldcg(src + b);
        __syncwarp();
        topk_warp(row, nb, p / B, ta.topk, ta.local, ta.init, pk, ta.sel + ((size_t)t * ni + g) * ta.topk, lane);
    }
}

#define SMEM_TOPK 8192 /* blocks of a score row kept in shared memory (32 KB: 1M tokens of 128-key blocks) */

/* a warp per (token, head) */
__global__ void k_index_topk(const int32_t *pos, int ni, int B, int nbmax, int topk, int local, int init, float *scores,
                             int32_t *sel) {
    const int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
    if (w >= gridDim.x * blockDim.x / 32) return;
    const int t = w / ni, g = w % ni;
    extern __shared__ int picks[];
    int *pk = picks + (threadIdx.x / 32) * topk;
    const int qb = pos[t] / B, nb = qb + 1;
    float *sc = scores + ((size_t)t * ni + g) * nbmax;
    if (blockDim.x == 32 && nbmax <= SMEM_TOPK) { /* the row in shared memory: the top-k passes wait on it, not L2 */
        float *ss = (float *)(picks + topk);
        for (int blk = lane; blk < nb; blk += 32) ss[blk] = sc[blk];
        sc = ss;
    }
    topk_warp(sc, nb, qb, topk, local, init, pk, sel + ((size_t)t * ni + g) * topk, lane);
}

void m3_cu_index_select(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *iq, int ni, int block,
                        int topk, int local, int init, int32_t *sel) {
    m3_cu_xsplit_touch((m3_cuda *)ctx, sel, sizeof(int32_t) * (size_t)b->T * ni * topk);
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_INDEX);
    if (c->failed) { m3_cu_prof_end(c, OP_INDEX); return; }
    if (b != c->step_b) { m3_cu_failf(c, "CUDA backend: index_select outside its step"); { m3_cu_prof_end(c, OP_INDEX); return; } }
    if (ni > 8) { m3_cu_failf(c, "CUDA backend: %d indexer heads (at most 8 supported)", ni); { m3_cu_prof_end(c, OP_INDEX); return; } }
    int T = b->T, nbmax = c->max_pos / block + 1;
    float *scores = (float *)m3_cu_scratch(c, SC_IDX, sizeof(float) * (size_t)T * ni * nbmax);
    if (!scores) { m3_cu_prof_end(c, OP_INDEX); return; }
    kvdesc d = desc(c, kv, layer);
    if (block <= 256 && kv->Di % 16 == 0) { /* a CTA per (block, token), a thread per key */
        const int th = (block + 31) / 32 * 32;
        size_t sm = sizeof(float) * ((size_t)ni * kv->Di + 8 * (th / 32));
        /* each key's row staged in shared memory (a 16-byte pad keeps quarter warps off each
         * other's banks) where it fits */
        const size_t irb = m3_kv_row_bytes(kv->idt, kv->Di), rsz = ((irb + 15) & ~(size_t)15) + 16;
        const size_t ssm = ((sm + 15) & ~(size_t)15) + (size_t)th * rsz;
        /* ... and while every CTA of the launch is resident at once with it (else the shared
         * memory costs a second wave: slower at long contexts) */
        long per_sm = (long)(c->smem_per_sm / (ssm + 1024)); /* CTAs per SM (1 KB of each is the driver's) */
        if (per_sm > 2048 / th) per_sm = 2048 / th;
        int rs = 0;
        if (irb % 8 == 0 && ssm <= (size_t)c->smem_optin && (long)nbmax * T <= per_sm * c->sm_count && m3_cu_fuse_on()) {
            rs = (int)rsz;
            sm = ssm;
        }
        /* the top-k in the same launch (the last CTA of each token) up to 256 blocks (32K tokens of
         * 128-key blocks; at 128K the separate k_index_topk measured faster: 35 against 44 us) */
        const size_t tsm = sizeof(float) * (size_t)ni * nbmax + sizeof(int) * (size_t)ni * topk;
        topk_args ta = {NULL, topk, local, init, sel};
        if (m3_cu_fuse_on() && nbmax <= 256 && tsm <= 32768 && T <= CTR_AUX - CTR_AUX_TOK) {
            ta.tctr = ctr_aux(c, CTR_AUX_TOK);
            if (tsm > sm) sm = tsm;
        }
        if (sm > 48 * 1024) cudaFuncSetAttribute(k_index_scores_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        k_index_scores_k<<<dim3(nbmax, T), th, sm, c->st>>>(d, c->d_pos, c->d_seq, iq, ni, block, nbmax, scores, ta, rs);
        if (ta.tctr) {
            CK_LAUNCH(c, "index_scores + top-k");
            m3_cu_prof_end(c, OP_INDEX);
            return;
        }
    } else { /* enough CTAs to cover the blocks of the longest sequence with 4 warps each */
        unsigned gx = cdiv(nbmax, 4);
        if (gx > 256) gx = 256;
        k_index_scores<<<dim3(gx, T), 128, sizeof(float) * (size_t)ni * kv->Di, c->st>>>(d, c->d_pos, c->d_seq, iq, ni, block,
                                                                                         nbmax, scores);
    }
    if (CK_LAUNCH(c, "index_scores")) { m3_cu_prof_end(c, OP_INDEX); return; }
    int warps = T * ni;
    /* grid covers exactly `warps` warps: 1 warp per CTA keeps the bound check simple */
    const size_t tsm = sizeof(int) * (size_t)topk + (nbmax <= SMEM_TOPK ? sizeof(float) * (size_t)nbmax : 0);
    k_index_topk<<<warps, 32, tsm, c->st>>>(c->d_pos, ni, block, nbmax, topk, local, init, scores, sel);
    CK_LAUNCH(c, "index_topk");
    m3_cu_prof_end(c, OP_INDEX);
}

/* ------------------------------------------------------------------ attention */

#define ACH 32 /* keys per chunk */

/* Key range [*a, *e) of chunk ci of token t / group g: sparse = the selected blocks cut in
 * ACH-key chunks (cpb per block), dense = [0, p] in ACH-key chunks; 0 when the chunk is empty
 * (an unused selection slot or past the token's position). */
static __device__ __forceinline__ int chunk_range(const int32_t *sel, int t, int nkv, int g, int topk, int B, int cpb,
                                                  int ci, int p, int *a, int *e) {
    if (sel) {
        int blk = sel[((size_t)t * nkv + g) * topk + ci / cpb];
        if (blk < 0) return 0;
        *a = blk * B + (ci % cpb) * ACH;
        *e = min(min(*a + ACH, blk * B + B), p + 1);
    } else {
        *a = ci * ACH;
        *e = min(*a + ACH, p + 1);
    }
    return *e > *a;
}

/* Chunks of the keys token t / group g sees: sparse = the selected blocks cut in ACH-key
 * chunks (block / ACH chunks each), dense = [0, pos] in ACH-key chunks. */
__global__ void k_attn(kvdesc d, const int32_t *pos, const int32_t *seq, const float *q, int nh, const int32_t *sel,
                       int B, int topk, int nsplit, float *part, float *out, float scale) {
    extern __shared__ float sm[];
    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z;
    const int D = d.D, G = nh / d.nkv, tid = threadIdx.x, nt = blockDim.x;
    const int DP = D + 1; /* padded K rows: lanes reading different keys hit different banks */
    float *qs = sm;                   /* [G][D] */
    float *ks = qs + G * D;           /* [ACH][DP] */
    float *vs = ks + ACH * DP;        /* [ACH][D] */
    float *ps = vs + ACH * D;         /* [G][ACH] */
    float *acc = ps + G * ACH;        /* [G][D] */
    float *ml = acc + G * D;          /* m[G], l[G], corr[G] */
    const int p = pos[t], sq = seq[t];
    for (int i = tid; i < G * D; i += nt) {
        qs[i] = q[((size_t)t * nh + (size_t)g * G) * D + i];
        acc[i] = 0;
    }
    for (int h = tid; h < G; h += nt) { ml[h] = -INFINITY; ml[G + h] = 0; }
    const int cpb = (B + ACH - 1) / ACH; /* chunks per block */
    const int nchunks = sel ? topk * cpb : p / ACH + 1;
    __syncthreads();
    for (int ci = s; ci < nchunks; ci += nsplit) {
        int a, e;
        if (!chunk_range(sel, t, d.nkv, g, topk, B, cpb, ci, p, &a, &e)) continue; /* uniform across the CTA */
        int n = e - a;
        /* K and V rows of the chunk -> shared f32 */
        if (D % 8 == 0) {
            for (int i = tid; i < n * (D / 8); i += nt) {
                int j = i / (D / 8), x = (i % (D / 8)) * 8, kp = a + j;
                const uint8_t *pg = page_of(d, sq, kp);
                size_t off = ((size_t)g * d.page + kp % d.page) * d.rb;
                float kv[8], vv[8];
                read8(pg + off, d.dt, D, x, kv);
                read8(pg + d.kvpart + off, d.dt, D, x, vv);
#pragma unroll
                for (int e = 0; e < 8; e++) { ks[j * DP + x + e] = kv[e]; vs[j * D + x + e] = vv[e]; }
            }
        } else {
            for (int i = tid; i < n * D; i += nt) {
                int j = i / D, x = i % D, kp = a + j;
                const uint8_t *pg = page_of(d, sq, kp);
                size_t off = ((size_t)g * d.page + kp % d.page) * d.rb;
                ks[j * DP + x] = read_el(pg + off, d.dt, D, x);
                vs[j * D + x] = read_el(pg + d.kvpart + off, d.dt, D, x);
            }
        }
        __syncthreads();
        for (int i = tid; i < G * ACH; i += nt) {
            int h = i / ACH, j = i % ACH;
            float v = -INFINITY;
            if (j < n) {
                float dot = 0;
                const float *qh = qs + h * D, *kj = ks + j * DP;
                for (int x = 0; x < D; x++) dot += qh[x] * kj[x];
                v = dot * scale;
            }
            ps[i] = v;
        }
        __syncthreads();
        /* online softmax: a warp per head */
        for (int h = tid / 32; h < G; h += nt / 32) {
            int lane = tid & 31;
            float v = lane < ACH ? ps[h * ACH + lane] : -INFINITY;
            float mx = fmaxf(ml[h], warp_max(v));
            float e_ = lane < n ? expf(v - mx) : 0.0f;
            if (lane < ACH) ps[h * ACH + lane] = e_;
            float sum = warp_sum(e_);
            if (lane == 0) {
                float corr = expf(ml[h] - mx); /* 0 on the first chunk */
                ml[2 * G + h] = corr;
                ml[G + h] = ml[G + h] * corr + sum;
                ml[h] = mx;
            }
        }
        __syncthreads();
        for (int i = tid; i < G * D; i += nt) {
            int h = i / D, x = i % D;
            float a2 = acc[i] * ml[2 * G + h];
            const float *ph = ps + h * ACH;
            for (int j = 0; j < n; j++) a2 += ph[j] * vs[j * D + x];
            acc[i] = a2;
        }
        __syncthreads();
    }
    if (nsplit == 1) {
        for (int i = tid; i < G * D; i += nt) {
            int h = i / D;
            float l = ml[G + h];
            out[((size_t)t * nh + (size_t)g * G) * D + i] = l > 0 ? acc[i] / l : 0.0f;
        }
        return;
    }
    /* partial: [t][g][s] -> G x (D + 2) */
    float *pp = part + (((size_t)t * d.nkv + g) * nsplit + s) * (size_t)G * (D + 2);
    for (int i = tid; i < G * D; i += nt) pp[(i / D) * (D + 2) + 2 + i % D] = acc[i];
    for (int h = tid; h < G; h += nt) { pp[h * (D + 2)] = ml[h]; pp[h * (D + 2) + 1] = ml[G + h]; }
}

/* The same for G <= 16 query heads per group and D <= 128 (the M3 shapes), with register
 * blocking: NW warps (4 or 8); QK: a warp owns 16 / NW heads, a lane one key (float4 reads, K
 * rows padded to D + 4 floats: conflict-free); PV: a thread owns one channel of HT = 16 * D /
 * (32 NW) heads (all 16 at D = 128 and 4 warps), its accumulators in registers; probabilities
 * read as broadcast float4. */
template <int NW>
__global__ void __launch_bounds__(NW * 32) k_attn_fast(kvdesc d, const int32_t *pos, const int32_t *seq, const float *q, int nh,
                                                   const int32_t *sel, int B, int topk, int nsplit, float *part, float *out,
                                                   float scale) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    extern __shared__ __align__(16) float sm[];
    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z;
    const int D = d.D, G = nh / d.nkv, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int NT = NW * 32, HW = 16 / NW, HT = NW == 4 ? 16 : 8; /* heads per warp (QK), per thread (PV) */
    const int h0 = NW == 4 ? 0 : (tid / D) * HT, ch = NW == 4 ? tid : tid % D; /* PV: first head, channel */
    const int DP = D + 4;
    float *qs = sm;                   /* [G][D] */
    float *ks = qs + G * D;           /* [ACH][DP] */
    float *vs = ks + ACH * DP;        /* [ACH][D] */
    float *ps = vs + ACH * D;         /* [G][ACH] */
    float *ml = ps + G * ACH;         /* m[G], l[G], corr[G] */
    const int p = pos[t], sq = seq[t];
    { /* the group's queries: G x D (<= 2048) values as float4 (D % 8 == 0) */
        const float4 *qg = (const float4 *)(q + ((size_t)t * nh + (size_t)g * G) * D);
        for (int i = tid; i < G * D / 4; i += NT) ((float4 *)qs)[i] = qg[i];
    }
    for (int h = tid; h < G; h += NT) { ml[h] = -INFINITY; ml[G + h] = 0; }
    float acc[HT];
#pragma unroll
    for (int h = 0; h < HT; h++) acc[h] = 0;
    const int cpb = (B + ACH - 1) / ACH;
    const int nchunks = sel ? topk * cpb : p / ACH + 1;
    __syncthreads();
    for (int ci = s; ci < nchunks; ci += nsplit) {
        int a, e;
        if (!chunk_range(sel, t, d.nkv, g, topk, B, cpb, ci, p, &a, &e)) continue; /* uniform across the CTA */
        const int n = e - a;
        for (int i = tid; i < n * (D / 8); i += NT) {
            int j = i / (D / 8), x = (i % (D / 8)) * 8, kp = a + j;
            const uint8_t *pg = page_of(d, sq, kp);
            size_t off = ((size_t)g * d.page + kp % d.page) * d.rb;
            float kv[8], vv[8];
            read8(pg + off, d.dt, D, x, kv);
            read8(pg + d.kvpart + off, d.dt, D, x, vv);
            *(float4 *)&ks[j * DP + x] = make_float4(kv[0], kv[1], kv[2], kv[3]);
            *(float4 *)&ks[j * DP + x + 4] = make_float4(kv[4], kv[5], kv[6], kv[7]);
            *(float4 *)&vs[j * D + x] = make_float4(vv[0], vv[1], vv[2], vv[3]);
            *(float4 *)&vs[j * D + x + 4] = make_float4(vv[4], vv[5], vv[6], vv[7]);
        }
        for (int i = tid; i < (ACH - n) * D; i += NT) vs[n * D + i] = 0; /* keys past n: p = 0, v finite */
        __syncthreads();
        {
            float dot[HW];
#pragma unroll
            for (int hh = 0; hh < HW; hh++) dot[hh] = 0;
            const float *kj = ks + lane * DP;
            for (int x = 0; x < D; x += 4) {
                float4 kv = *(const float4 *)(kj + x);
#pragma unroll
                for (int hh = 0; hh < HW; hh++) {
                    int h = warp * HW + hh;
                    if (h < G) {
                        float4 qv = *(const float4 *)(qs + h * D + x);
                        dot[hh] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
                    }
                }
            }
#pragma unroll
            for (int hh = 0; hh < HW; hh++) {
                int h = warp * HW + hh;
                if (h < G) ps[h * ACH + lane] = lane < n ? dot[hh] * scale : -INFINITY;
            }
        }
        __syncthreads();
        for (int h = warp; h < G; h += NW) {
            float v = ps[h * ACH + lane];
            float mx = fmaxf(ml[h], warp_max(v));
            float e_ = lane < n ? expf(v - mx) : 0.0f;
            ps[h * ACH + lane] = e_;
            float sum = warp_sum(e_);
            if (lane == 0) {
                float corr = expf(ml[h] - mx);
                ml[2 * G + h] = corr;
                ml[G + h] = ml[G + h] * corr + sum;
                ml[h] = mx;
            }
        }
        __syncthreads();
        if (tid < D * (16 / HT)) {
#pragma unroll
            for (int h = 0; h < HT; h++)
                if (h0 + h < G) acc[h] *= ml[2 * G + h0 + h];
            for (int j = 0; j < ACH; j += 4) {
                float v0 = vs[j * D + ch], v1 = vs[(j + 1) * D + ch], v2 = vs[(j + 2) * D + ch], v3 = vs[(j + 3) * D + ch];
#pragma unroll
                for (int h = 0; h < HT; h++)
                    if (h0 + h < G) {
                        float4 pp = *(const float4 *)(ps + (h0 + h) * ACH + j);
                        acc[h] += pp.x * v0 + pp.y * v1 + pp.z * v2 + pp.w * v3;
                    }
            }
        }
        __syncthreads();
    }
    if (tid >= D * (16 / HT)) return;
    if (nsplit == 1) {
#pragma unroll
        for (int h = 0; h < HT; h++)
            if (h0 + h < G) {
                float l = ml[G + h0 + h];
                out[((size_t)t * nh + (size_t)g * G + h0 + h) * D + ch] = l > 0 ? acc[h] / l : 0.0f;
            }
        return;
    }
    float *pp = part + (((size_t)t * d.nkv + g) * nsplit + s) * (size_t)G * (D + 2);
#pragma unroll
    for (int h = 0; h < HT; h++)
        if (h0 + h < G) {
            pp[(h0 + h) * (D + 2) + 2 + ch] = acc[h];
            if (ch == 0) { pp[(h0 + h) * (D + 2)] = ml[h0 + h]; pp[(h0 + h) * (D + 2) + 1] = ml[G + h0 + h]; }
        }
}

/* ------------------------------------------------------------------ attention on the tensor cores
 * The same split / chunk walk with the products on mma.sync (bf16 in, f32 accumulation), for
 * caches whose values are exact in bf16 (bf16, FP8 E4M3, NVFP4: E2M1 x E4M3 has at most 5
 * significant bits), G <= 16 query heads per group (the MMA's 16 rows; rows past G hold zero
 * queries and are not written) and D a multiple of 16 up to 128 (ND = D / 8 column tiles).
 * q and the probabilities are split into three bf16 parts each (hi, mid, lo: 24 bits, f32's
 * precision; the products are exact in f32), so the result agrees with the f32 kernels to
 * rounding. A warp owns whole 32-key chunks: its K and V rows are staged in shared memory as
 * bf16 (cp.async for a bf16 cache), S = Q K^T in registers, online softmax per row, O += P V
 * with V's fragments by ldmatrix.trans; the CTA's warps are then combined in a fixed order
 * (deterministic) into one partial (or the output when nsplit = 1), merged by k_attn_merge. */
#define AT_NW 4 /* warps per CTA */
static __device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* two f32 -> bf16x2 (round to nearest; x0 in the low half) and the values it holds */
static __device__ __forceinline__ uint32_t bf2(float x0, float x1) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    return *(uint32_t *)&h;
}
/* 8 floats (exact in bf16) -> 8 bf16 */
static __device__ __forceinline__ uint4 bf8(const float *f) {
    return make_uint4(bf2(f[0], f[1]), bf2(f[2], f[3]), bf2(f[4], f[5]), bf2(f[6], f[7]));
}
/* (x0, x1) -> three bf16x2 parts whose sum is (x0, x1) to ~2^-24 relative */
static __device__ __forceinline__ void split3(float x0, float x1, uint32_t *p0, uint32_t *p1, uint32_t *p2) {
    const uint32_t h = bf2(x0, x1);
    const float r0 = x0 - __uint_as_float(h << 16), r1 = x1 - __uint_as_float(h & 0xffff0000u);
    const uint32_t m = bf2(r0, r1);
    *p0 = h;
    *p1 = m;
    *p2 = bf2(r0 - __uint_as_float(m << 16), r1 - __uint_as_float(m & 0xffff0000u));
}
static __device__ __forceinline__ void cp16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

template <int ND>
__global__ void __launch_bounds__(AT_NW * 32) k_attn_mma(kvdesc d, const int32_t *pos, const int32_t *seq, const float *q, int nh,
                                                       const int32_t *sel, int B, int topk, int nsplit, float *part, float *out,
                                                       float scale) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    constexpr int D = ND * 8, DP = D + 8; /* bf16 rows padded by 16 bytes: fragment loads conflict-free */
    extern __shared__ __align__(16) uint16_t asm_[];
    uint16_t *qs = asm_;                                        /* [3][16][DP] */
    uint16_t *kv0 = qs + 3 * 16 * DP;                           /* per warp: K [ACH][DP], V [ACH][DP] */
    float *wml = (float *)(kv0 + AT_NW * 2 * ACH * DP);         /* [AT_NW][2][16]: m, l */
    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z;
    const int G = nh / d.nkv, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gr = lane >> 2, tg = lane & 3;
    const int p = pos[t], sq = seq[t];
    uint16_t *ks = kv0 + warp * 2 * ACH * DP, *vs = ks + ACH * DP;
    const uint32_t vs_a = (uint32_t)__cvta_generic_to_shared(vs);
    const int cpb = (B + ACH - 1) / ACH;
    const int nchunks = sel ? topk * cpb : p / ACH + 1;
    const int W = nsplit * AT_NW;
    /* how K / V rows load: 1 bf16 by cp.async, 2 FP8 and 3 NVFP4 by word loads (rows aligned for them), 0 read8 */
    const size_t al = d.rb | d.kvpart | d.page_bytes | (uintptr_t)d.base;
    const int ld = d.dt == M3_KV_BF16 ? ((al & 15) == 0 ? 1 : 0)
                   : d.dt == M3_KV_FP8 ? ((al & 7) == 0 ? 2 : 0)
                   : d.dt == M3_KV_NVFP4 ? ((al & 3) == 0 ? 3 : 0) : 0;
    /* this warp's next chunk from c (>= nchunks: none) and its keys [a, e) */
    auto next_chunk = [&](int c, int *a, int *e) {
        while (c < nchunks && !chunk_range(sel, t, d.nkv, g, topk, B, cpb, c, p, a, e)) c += W;
        return c;
    };
    /* K and V rows [a, e) into ks / vs as bf16 (rows past e: zeros; V must be finite, p = 0 there).
     * A chunk inside one page (the usual case) looks its page up once. bf16: cp.async, waited for
     * by the caller; FP8 / NVFP4: every load in flight, then converted; else read8. */
    auto load_chunk = [&](int a, int e) {
        const int n = e - a;
        const int pa = a / d.page, one = pa == (e - 1) / d.page;
        const uint8_t *pg = one ? page_of(d, sq, a) + ((size_t)g * d.page + (a - pa * d.page)) * d.rb : NULL;
        auto row_of = [&](int j) {
            if (one) return pg + (size_t)j * d.rb;
            const int kp = a + j;
            return (const uint8_t *)page_of(d, sq, kp) + ((size_t)g * d.page + kp % d.page) * d.rb;
        };
        if (ld == 2 || ld == 3) {
            constexpr int PPL = ACH * ND / 32; /* 8-value pieces per lane */
            uint2 rk[PPL], rv[PPL];            /* FP8: 8 bytes; NVFP4: x = 8 codes, y = their scale byte */
#pragma unroll
            for (int k = 0; k < PPL; k++) {
                const int i = lane + 32 * k, j = i / ND, x = (i % ND) * 8;
                rk[k] = rv[k] = make_uint2(0, 0); /* zero codes decode to 0.0 (rows past the chunk) */
                if (j < n) {
                    const uint8_t *row = row_of(j);
                    if (ld == 2) {
                        rk[k] = *(const uint2 *)(row + x);
                        rv[k] = *(const uint2 *)(row + d.kvpart + x);
                    } else {
                        rk[k] = make_uint2(*(const uint32_t *)(row + x / 2), row[D / 2 + x / 16]);
                        rv[k] = make_uint2(*(const uint32_t *)(row + d.kvpart + x / 2), row[d.kvpart + D / 2 + x / 16]);
                    }
                }
            }
#pragma unroll
            for (int k = 0; k < PPL; k++) {
                const int i = lane + 32 * k, j = i / ND, x = (i % ND) * 8;
#pragma unroll
                for (int kv = 0; kv < 2; kv++) {
                    const uint2 r = kv ? rv[k] : rk[k];
                    float f[8];
                    if (ld == 2) {
#pragma unroll
                        for (int h = 0; h < 4; h++) {
                            const float2 v = e4m3x2_f32(((h < 2 ? r.x : r.y) >> (16 * (h & 1))) & 0xffffu);
                            f[2 * h] = v.x;
                            f[2 * h + 1] = v.y;
                        }
                    } else {
                        const float sc = e4m3_f32(r.y) * 16384.0f;
#pragma unroll
                        for (int h = 0; h < 4; h++) {
                            const float2 v = e2m1x2_f32((r.x >> (8 * h)) & 0xffu);
                            f[2 * h] = v.x * sc;
                            f[2 * h + 1] = v.y * sc;
                        }
                    }
                    *(uint4 *)((kv ? vs : ks) + j * DP + x) = bf8(f);
                }
            }
            return;
        }
#pragma unroll 1 /* rolled: the code (read8's formats in each copy) otherwise arrives cold, 16 copies of it */
        for (int i = lane; i < ACH * ND; i += 32) {
            const int j = i / ND, x = (i % ND) * 8;
            uint16_t *kd = ks + j * DP + x, *vd = vs + j * DP + x;
            if (j >= n) {
                *(uint4 *)kd = make_uint4(0, 0, 0, 0);
                *(uint4 *)vd = make_uint4(0, 0, 0, 0);
                continue;
            }
            const uint8_t *row = row_of(j);
            if (ld == 1) {
                cp16((uint32_t)__cvta_generic_to_shared(kd), row + 2 * x);
                cp16((uint32_t)__cvta_generic_to_shared(vd), row + d.kvpart + 2 * x);
            } else {
                float kf[8], vf[8];
                read8(row, d.dt, D, x, kf);
                read8(row + d.kvpart, d.dt, D, x, vf);
                *(uint4 *)kd = bf8(kf);
                *(uint4 *)vd = bf8(vf);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    /* the first chunk's rows are requested before the queries are staged (their loads overlap) */
    int a, e;
    int ci = next_chunk(s * AT_NW + warp, &a, &e);
    if (ci < nchunks) load_chunk(a, e);
    /* the group's queries as three bf16 parts (rows >= G: zero) */
    for (int i = tid; i < 16 * D / 2; i += AT_NW * 32) {
        const int h = i / (D / 2), x = (i % (D / 2)) * 2;
        float2 v = make_float2(0.f, 0.f);
        if (h < G) v = *(const float2 *)(q + ((size_t)t * nh + (size_t)g * G + h) * D + x);
        uint32_t a3, b3, c3;
        split3(v.x, v.y, &a3, &b3, &c3);
        *(uint32_t *)&qs[(0 * 16 + h) * DP + x] = a3;
        *(uint32_t *)&qs[(1 * 16 + h) * DP + x] = b3;
        *(uint32_t *)&qs[(2 * 16 + h) * DP + x] = c3;
    }
    __syncthreads();
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f; /* rows gr, gr + 8 (l: this thread's share) */
    while (ci < nchunks) {
        const int n = e - a;
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncwarp();
        /* S = Q K^T: 16 rows x 32 keys (4 column tiles) */
        float sc[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll 1 /* rolled: fewer instructions to fetch cold (a warp often runs one chunk) */
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t af[3][4];
#pragma unroll
            for (int pt = 0; pt < 3; pt++) {
                const uint16_t *qa = qs + (pt * 16 + gr) * DP + kk * 16 + 2 * tg;
                af[pt][0] = *(const uint32_t *)qa;
                af[pt][1] = *(const uint32_t *)(qa + 8 * DP);
                af[pt][2] = *(const uint32_t *)(qa + 8);
                af[pt][3] = *(const uint32_t *)(qa + 8 * DP + 8);
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const uint16_t *kb = ks + (nt * 8 + gr) * DP + kk * 16 + 2 * tg;
                const uint32_t b0 = *(const uint32_t *)kb, b1 = *(const uint32_t *)(kb + 8);
#pragma unroll
                for (int pt = 0; pt < 3; pt++) mma_bf16(sc[nt], af[pt], b0, b1);
            }
        }
        /* online softmax of rows gr (c0, c1) and gr + 8 (c2, c3); key of c_i: 8 nt + 2 tg + (i & 1) */
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = nt * 8 + 2 * tg + (i & 1);
                const float v = j < n ? sc[nt][i] * scale : -INFINITY;
                sc[nt][i] = v;
                if (i < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1); /* finite: n >= 1 key in the chunk */
        const float c0 = expf(m0 - n0), c1 = expf(m1 - n1);  /* 0 on the first chunk */
        m0 = n0;
        m1 = n1;
        l0 *= c0;
        l1 *= c1;
#pragma unroll
        for (int nt = 0; nt < ND; nt++) { o[nt][0] *= c0; o[nt][1] *= c0; o[nt][2] *= c1; o[nt][3] *= c1; }
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            sc[nt][0] = expf(sc[nt][0] - n0); sc[nt][1] = expf(sc[nt][1] - n0);
            sc[nt][2] = expf(sc[nt][2] - n1); sc[nt][3] = expf(sc[nt][3] - n1);
            l0 += sc[nt][0] + sc[nt][1];
            l1 += sc[nt][2] + sc[nt][3];
        }
        /* O += P V: keys in two k16 steps; P's A fragments are S's C fragments, in three parts */
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t pa[3][4];
            split3(sc[2 * kk][0], sc[2 * kk][1], &pa[0][0], &pa[1][0], &pa[2][0]);
            split3(sc[2 * kk][2], sc[2 * kk][3], &pa[0][1], &pa[1][1], &pa[2][1]);
            split3(sc[2 * kk + 1][0], sc[2 * kk + 1][1], &pa[0][2], &pa[1][2], &pa[2][2]);
            split3(sc[2 * kk + 1][2], sc[2 * kk + 1][3], &pa[0][3], &pa[1][3], &pa[2][3]);
            const int mi = lane >> 3, r = lane & 7;
#pragma unroll
            for (int np = 0; np < ND / 2; np++) {
                const uint32_t ad = vs_a + (uint32_t)(((kk * 16 + (mi & 1) * 8 + r) * DP + np * 16 + (mi >> 1) * 8) * 2);
                uint32_t b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(ad));
#pragma unroll
                for (int pt = 0; pt < 3; pt++) {
                    mma_bf16(o[2 * np], pa[pt], b0, b1);
                    mma_bf16(o[2 * np + 1], pa[pt], b2, b3);
                }
            }
        }
        ci = next_chunk(ci + W, &a, &e);
        if (ci < nchunks) {
            __syncwarp(); /* this chunk's fragments are read */
            load_chunk(a, e);
        }
    }
    /* the warps' results -> shared (each warp over its own K / V buffers), then combined */
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    __syncwarp();
    float *ob = (float *)ks; /* [16][D] f32 (8 KB at D = 128, inside the warp's 17 KB) */
#pragma unroll
    for (int nt = 0; nt < ND; nt++) {
        *(float2 *)&ob[gr * D + nt * 8 + 2 * tg] = make_float2(o[nt][0], o[nt][1]);
        *(float2 *)&ob[(gr + 8) * D + nt * 8 + 2 * tg] = make_float2(o[nt][2], o[nt][3]);
    }
    if (tg == 0) {
        wml[warp * 32 + gr] = m0; wml[warp * 32 + gr + 8] = m1;
        wml[warp * 32 + 16 + gr] = l0; wml[warp * 32 + 16 + gr + 8] = l1;
    }
    __syncthreads();
    float *wf = wml + AT_NW * 32; /* [AT_NW][16] factors exp(m_w - M), then [16] M and [16] L */
    if (tid < 16) {
        float M = -INFINITY, L = 0.f;
#pragma unroll
        for (int w = 0; w < AT_NW; w++) M = fmaxf(M, wml[w * 32 + tid]);
#pragma unroll
        for (int w = 0; w < AT_NW; w++) {
            const float mw = wml[w * 32 + tid], f = mw == -INFINITY ? 0.f : expf(mw - M);
            wf[w * 16 + tid] = f;
            L += wml[w * 32 + 16 + tid] * f;
        }
        wf[AT_NW * 16 + tid] = M;
        wf[AT_NW * 16 + 16 + tid] = L;
    }
    __syncthreads();
    for (int i = tid; i < G * D; i += AT_NW * 32) {
        const int h = i / D, x = i % D;
        const float M = wf[AT_NW * 16 + h], L = wf[AT_NW * 16 + 16 + h];
        float acc = 0.f;
#pragma unroll
        for (int w = 0; w < AT_NW; w++) acc += ((const float *)(kv0 + w * 2 * ACH * DP))[h * D + x] * wf[w * 16 + h];
        if (nsplit == 1) {
            out[((size_t)t * nh + (size_t)g * G + h) * D + x] = L > 0 ? acc / L : 0.0f;
        } else {
            float *pp = part + (((size_t)t * d.nkv + g) * nsplit + s) * (size_t)G * (D + 2) + (size_t)h * (D + 2);
            pp[2 + x] = acc;
            if (x == 0) { pp[0] = M; pp[1] = L; }
        }
    }
}
static size_t attn_mma_smem(int D) {
    const int DP = D + 8;
    return sizeof(uint16_t) * ((size_t)3 * 16 * DP + (size_t)AT_NW * 2 * ACH * DP) + sizeof(float) * (AT_NW * 48 + 32);
}

/* with xs, also the f16 split of out (hi [n], then lo; the o projection's input, gemv_mma.cu).
 * A block per (head, token) of at least Q x D threads (Q <= MERGE_Q): the splits' weights
 * exp(m_s - M) / L once, in shared memory, then thread (q, x) sums channel x over splits q,
 * q + Q, ... (all its loads in flight at once) and the Q partial sums of a channel are added in
 * order of q. */
#define MERGE_MAX 64 /* splits (m3_cu_attention caps nsplit at 64) */
#define MERGE_Q 4
__global__ void __launch_bounds__(1024) k_attn_merge(const float *part, int nkv, int G, int D, int nsplit, int nh, int Q,
                                                     float *out, uint16_t *xs, size_t n) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    __shared__ float wsh[MERGE_MAX], red[2];
    extern __shared__ float psum[]; /* [MERGE_Q][D] */
    const int t = blockIdx.y, hh = blockIdx.x, g = hh / G, h = hh % G;
    const float *base = part + (((size_t)t * nkv + g) * nsplit) * (size_t)G * (D + 2) + (size_t)h * (D + 2);
    const size_t sstride = (size_t)G * (D + 2);
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
        if (lane < nsplit) { m0 = base[lane * sstride]; l0 = base[lane * sstride + 1]; }
        if (lane + 32 < nsplit) { m1 = base[(lane + 32) * sstride]; l1 = base[(lane + 32) * sstride + 1]; }
        const float M = warp_max(fmaxf(m0, m1));
        const float w0 = m0 != -INFINITY ? expf(m0 - M) : 0.0f, w1 = m1 != -INFINITY ? expf(m1 - M) : 0.0f;
        const float L = warp_sum(l0 * w0 + l1 * w1);
        if (lane < nsplit) wsh[lane] = w0;
        if (lane + 32 < nsplit) wsh[lane + 32] = w1;
        if (lane == 0) red[0] = L;
    }
    const int x = threadIdx.x % D, q = threadIdx.x / D; /* q >= Q: padding threads */
    float o = 0;
    for (int i0 = 0; i0 * Q < nsplit; i0 += MERGE_MAX / MERGE_Q) { /* one pass when Q = MERGE_Q */
        float v[MERGE_MAX / MERGE_Q];
#pragma unroll
        for (int i = 0; i < MERGE_MAX / MERGE_Q; i++) {
            const int s = q + Q * (i0 + i);
            v[i] = q < Q && s < nsplit ? base[s * sstride + 2 + x] : 0.0f;
        }
        if (i0 == 0) __syncthreads(); /* the weights */
#pragma unroll
        for (int i = 0; i < MERGE_MAX / MERGE_Q; i++) {
            const int s = q + Q * (i0 + i);
            if (q < Q && s < nsplit) o += v[i] * wsh[s];
        }
    }
    if (q < Q) psum[q * D + x] = o;
    __syncthreads();
    if (q) return;
    for (int j = 1; j < Q; j++) o += psum[j * D + x];
    const float L = red[0];
    const size_t k = ((size_t)t * nh + hh) * D + x;
    const float r = L > 0 ? o / L : 0.0f;
    out[k] = r;
    if (xs) split_store(r, xs + k, xs + n + k);
}

void m3_cu_attention(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *q, int nh, const int32_t *sel,
                     int block, int topk, float *out) {
    m3_cu_xsplit_touch((m3_cuda *)ctx, out, sizeof(float) * (size_t)b->T * nh * kv->D);
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_ATTN);
    if (c->failed) { m3_cu_prof_end(c, OP_ATTN); return; }
    if (b != c->step_b) { m3_cu_failf(c, "CUDA backend: attention outside its step"); { m3_cu_prof_end(c, OP_ATTN); return; } }
    const int T = b->T, nkv = kv->nkv, D = kv->D, G = nh / nkv;
    int nchunks = sel ? topk * ((block + ACH - 1) / ACH) : c->max_pos / ACH + 1;
    /* splits of each (token, KV head)'s keys: about two CTAs per SM in all (fewer measured slower at
     * batch 1: docs/PERF.md) */
    int nsplit = (int)cdiv(2 * (size_t)c->sm_count, (size_t)T * nkv);
    const int ND = D / 8;
    /* FP8 / NVFP4 caches at one token: the f32 kernel (in a decode graph at 128K: 2.35-2.38 against
     * 2.42-2.44 ms; docs/PERF.md) */
    static int mma_on = -1;
    if (mma_on < 0) mma_on = m3_cu_env_int("M3_ATTN_MMA", 1) != 0;
    const int tc = (kv->dt == M3_KV_BF16 || ((kv->dt == M3_KV_FP8 || kv->dt == M3_KV_NVFP4) && T > 1)) && G <= 16 &&
                   D % 16 == 0 && (ND == 4 || ND == 6 || ND == 8 || ND == 16) && mma_on;
    if (tc) { /* AT_NW warps a CTA, each on whole chunks: as many chunks a warp as the GPU's two CTAs per SM need
               * (one chunk a warp at 8 tokens measured slower: docs/PERF.md) */
        const int cpw = (int)cdiv((size_t)nchunks, (size_t)(nsplit > 64 ? 64 : nsplit) * AT_NW);
        nsplit = (int)cdiv((size_t)nchunks, (size_t)cpw * AT_NW);
    } else if (T <= 8 && nsplit < 32) {
        nsplit = 32; /* a verify pass / small batch: a chunk or two per CTA (8 tokens: 4.96 against 5.05 ms a pass
                      * with 9 splits) */
    }
    if (nsplit > 64) nsplit = 64;
    if (nsplit > nchunks) nsplit = nchunks;
    if (nsplit < 1) nsplit = 1;
    size_t smem = sizeof(float) * ((size_t)G * D * 2 + ACH * (size_t)(D + 1) + ACH * (size_t)D + (size_t)G * ACH + 3 * (size_t)G);
    if (smem > c->smem_optin) { m3_cu_failf(c, "CUDA backend: attention needs %zu bytes of shared memory", smem); { m3_cu_prof_end(c, OP_ATTN); return; } }
    if (smem > 48 * 1024) cudaFuncSetAttribute(k_attn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    float *part = NULL;
    if (nsplit > 1) {
        part = (float *)m3_cu_scratch(c, SC_ATT, sizeof(float) * (size_t)T * nkv * nsplit * G * (D + 2));
        if (!part) { m3_cu_prof_end(c, OP_ATTN); return; }
    }
    if (tc) {
        const size_t sm = attn_mma_smem(D);
        void (*fn)(kvdesc, const int32_t *, const int32_t *, const float *, int, const int32_t *, int, int, int, float *, float *,
                   float) = ND == 4 ? k_attn_mma<4> : ND == 6 ? k_attn_mma<6> : ND == 8 ? k_attn_mma<8> : k_attn_mma<16>;
        if (sm > c->smem_optin) { m3_cu_failf(c, "CUDA backend: attention needs %zu bytes of shared memory", sm); m3_cu_prof_end(c, OP_ATTN); return; }
        if (sm > 48 * 1024) cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        fn<<<dim3(nsplit, nkv, T), AT_NW * 32, sm, c->st>>>(desc(c, kv, layer), c->d_pos, c->d_seq, q, nh, sel, block, topk, nsplit,
                                                            part, out, 1.0f / sqrtf((float)D));
    } else if (G <= 16 && D <= 128 && D % 8 == 0) {
        size_t sf = sizeof(float) * ((size_t)G * D + ACH * (size_t)(D + 4) + ACH * (size_t)D + (size_t)G * ACH + 3 * (size_t)G);
        /* 8 warps where D = 128 (a thread per channel and 8 heads): 11.8 against 14.5 us a decode layer */
        if (sf > 48 * 1024)
            cudaFuncSetAttribute(D == 128 ? k_attn_fast<8> : k_attn_fast<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sf);
        if (D == 128)
            k_attn_fast<8><<<dim3(nsplit, nkv, T), 256, sf, c->st>>>(desc(c, kv, layer), c->d_pos, c->d_seq, q, nh, sel, block,
                                                                     topk, nsplit, part, out, 1.0f / sqrtf((float)D));
        else
            k_attn_fast<4><<<dim3(nsplit, nkv, T), 128, sf, c->st>>>(desc(c, kv, layer), c->d_pos, c->d_seq, q, nh, sel, block,
                                                                     topk, nsplit, part, out, 1.0f / sqrtf((float)D));
    } else {
        int threads = G * D >= 256 ? 256 : 128;
        k_attn<<<dim3(nsplit, nkv, T), threads, smem, c->st>>>(desc(c, kv, layer), c->d_pos, c->d_seq, q, nh, sel, block, topk,
                                                                nsplit, part, out, 1.0f / sqrtf((float)D));
    }
    if (CK_LAUNCH(c, "attention")) { m3_cu_prof_end(c, OP_ATTN); return; }
    if (nsplit > 1) {
        const size_t n = (size_t)T * nh * D;
        uint16_t *xs = (size_t)nh * D % 128 == 0 ? m3_cu_xsplit_claim(c, out, n) : NULL; /* o_proj's input */
        if ((size_t)nh * D % 128 == 0 && !xs) { m3_cu_prof_end(c, OP_ATTN); return; }
        int Q = MERGE_Q;
        while (Q > 1 && Q * D > 1024) Q /= 2;
        if (Q * D > 1024) { m3_cu_failf(c, "CUDA backend: head_dim %d above 1024", D); { m3_cu_prof_end(c, OP_ATTN); return; } }
        const int threads = (Q * D + 31) / 32 * 32;
        k_attn_merge<<<dim3(nh, T), threads, sizeof(float) * Q * (size_t)D, c->st>>>(part, nkv, G, D, nsplit, nh, Q, out, xs, n);
        CK_LAUNCH(c, "attention merge");
    }
    m3_cu_prof_end(c, OP_ATTN);
}
