/* The lightning indexer on the GPU: each token's block scores (max over a block's keys of
 * index q . index k, per indexer head) over the paged index-K cache, then the per-head block
 * top-k (forced local / initial blocks, lowest block on ties, ascending, -1 padded).
 * Index-K caches of bf16, FP8 or NVFP4 with Di of 32, 64 or 128 score on the tensor cores
 * (k_index_scores_mma: the tokens of a verify pass or a prefill chunk share the key reads);
 * others, and M3_INDEX_MMA=0, on CUDA cores.
 * CPU reference: src/backend/cpu/indexer.c (m3_cpu_index_select). */
#include <math.h>

#include "kv.cuh"
#include "ptx.cuh"

/* scores[t][g][blk] = max over the keys of block blk visible to token t of iq[t][g] . ik;
 * a warp per block, lanes over keys (blocks of more than 256 keys or Di % 16 != 0; else
 * k_index_scores_thread_per_key) */
__global__ void k_index_scores_warp_per_block(kvdesc d, const int32_t *pos, const int32_t *seq, const float *iq, int ni, int B, int nbmax,
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
 * every SM. Same products in the same order as k_index_scores_warp_per_block. With rs > 0
 * each thread first copies its key's index-K row into shared memory (rows rs bytes apart after
 * the q and maxima areas), with the query's loads in flight at the same time; with ta.tctr the
 * last CTA of each token runs its top-k (topk_warp). */
__global__ void __launch_bounds__(256, 2) k_index_scores_thread_per_key(kvdesc d, const int32_t *pos, const int32_t *seq, const float *iq,
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

/* ------------------------------------------------------------------ block scores on the tensor cores
 * The same scores as one MMA per 16 keys: a CTA per (block, run), where a run is up to RUN_MAX
 * consecutive tokens of one sequence at consecutive positions (begin_step: a verify pass, a
 * prefill chunk; a decode token is a run of one), so the tokens of a run read the block's
 * index-K rows once. The rows are staged in shared memory as bf16 (cp.async for a bf16 cache;
 * FP8 and NVFP4 values are exact in bf16: every piece's load in flight, then converted), the
 * A operand (16 keys x 16 values, ldmatrix); the run's (token, head) queries are the columns of
 * B, each split into three bf16 parts (split3), so every product is exact in f32 and the sums
 * are f32 sums in the MMA's order. Warp w takes key tiles w, w + 4, ...; a key counts for a
 * column when it is at or before that token's position. With ta.tctr (runs of at most 8
 * columns) the run's last CTA then runs the top-k of its columns. KD = Di / 16. CPA: a bf16
 * cache of aligned rows, staged by copies alone (no registers hold rows: more CTAs an SM). */
template <int KD, bool CPA>
__global__ void __launch_bounds__(128) k_index_scores_mma(kvdesc d, const int32_t *pos, const int32_t *seq, const int32_t *lead,
                                                      const int32_t *rlen, const float *iq, int ni, int B, int nbmax,
                                                      float *scores, topk_args ta) {
    constexpr int Di = KD * 16, DP = Di + 8; /* rows padded by 16 bytes: ldmatrix conflict-free */
    extern __shared__ __align__(16) uint16_t ks[]; /* [MT * 16][DP]; the fused top-k's rows afterwards */
    __shared__ float red[4][8 * RUN_MAX];
    const int r = blockIdx.y, blk = blockIdx.x, t0 = lead[r], R = rlen[r];
    const int plast = pos[t0 + R - 1], nb = plast / B + 1;
    if (blk >= nb) return; /* uniform across the CTA */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gr = lane >> 2, tg = lane & 3;
    const int MT = (B + 15) / 16, p0 = blk * B, n = min(B, plast - p0 + 1), sq = seq[t0], cols = R * ni;
    /* how rows load: 1 bf16 by cp.async, 2 FP8 by 16-byte words, 3 NVFP4 by 8-byte words + a scale
     * byte (rows aligned for them), 0 read16 */
    const size_t al = d.irb | d.kvpart | d.page_bytes | (uintptr_t)d.base;
    const int ld = d.idt == M3_KV_BF16 ? ((al & 15) == 0 ? 1 : 0)
                   : d.idt == M3_KV_FP8 ? ((al & 15) == 0 ? 2 : 0)
                   : d.idt == M3_KV_NVFP4 ? ((al & 7) == 0 ? 3 : 0) : 0;
    constexpr int PP = 8; /* 16-value pieces a thread has in flight */
    const int npieces = MT * 16 * KD;
    if constexpr (CPA) { /* a bf16 cache with aligned rows (ld == 1): copies only, no registers held for them */
        const uint8_t *pbase = NULL;
        int pkp = -1;
        for (int i = tid; i < npieces; i += 128) {
            const int j = i / KD, x = (i % KD) * 16;
            uint16_t *dst = ks + j * DP + x;
            if (j >= n) {
                *(uint4 *)dst = make_uint4(0, 0, 0, 0);
                *(uint4 *)(dst + 8) = make_uint4(0, 0, 0, 0);
                continue;
            }
            const int kp = p0 + j;
            if (kp / d.page != pkp) { /* a block's keys span one page or a few */
                pkp = kp / d.page;
                pbase = page_of(d, sq, kp);
            }
            const uint8_t *row = pbase + 2 * d.kvpart + (size_t)(kp % d.page) * d.irb;
            cp_async16(smem_u32(dst), row + 2 * x);
            cp_async16(smem_u32(dst + 8), row + 2 * x + 16);
        }
    } else
    for (int i0 = 0; i0 < npieces; i0 += PP * 128) {
        uint4 raw[PP];
        const uint8_t *rows[PP];
#pragma unroll
        for (int u = 0; u < PP; u++) {
            const int i = i0 + u * 128 + tid, j = i / KD, x = (i % KD) * 16;
            rows[u] = NULL;
            raw[u] = make_uint4(0, 0, 0, 0);
            if (i >= npieces || j >= n) continue;
            const int kp = p0 + j;
            const uint8_t *row = page_of(d, sq, kp) + 2 * d.kvpart + (size_t)(kp % d.page) * d.irb;
            rows[u] = row;
            uint16_t *dst = ks + j * DP + x;
            if (ld == 1) {
                cp_async16(smem_u32(dst), row + 2 * x);
                cp_async16(smem_u32(dst + 8), row + 2 * x + 16);
            } else if (ld == 2) {
                raw[u] = *(const uint4 *)(row + x);
            } else if (ld == 3) {
                const uint2 c2 = *(const uint2 *)(row + x / 2);
                raw[u] = make_uint4(c2.x, c2.y, row[Di / 2 + x / 16], 0);
            }
        }
#pragma unroll
        for (int u = 0; u < PP; u++) {
            const int i = i0 + u * 128 + tid, j = i / KD, x = (i % KD) * 16;
            if (i >= npieces) continue;
            uint16_t *dst = ks + j * DP + x;
            if (!rows[u]) { /* past the block's visible keys: zeros */
                *(uint4 *)dst = make_uint4(0, 0, 0, 0);
                *(uint4 *)(dst + 8) = make_uint4(0, 0, 0, 0);
                continue;
            }
            if (ld == 1) continue;
            float f[16];
            if (ld == 2) {
                const uint32_t w[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
#pragma unroll
                for (int h = 0; h < 8; h++) {
                    const float2 v = e4m3x2_f32((w[h / 2] >> (16 * (h & 1))) & 0xffffu);
                    f[2 * h] = v.x;
                    f[2 * h + 1] = v.y;
                }
            } else if (ld == 3) {
                const float sc = nvfp4_scale(raw[u].z);
#pragma unroll
                for (int h = 0; h < 8; h++) {
                    const float2 v = e2m1x2_f32(((h < 4 ? raw[u].x : raw[u].y) >> (8 * (h & 3))) & 0xffu);
                    f[2 * h] = v.x * sc;
                    f[2 * h + 1] = v.y * sc;
                }
            } else {
                read16(rows[u], d.idt, Di, x, f);
            }
            *(uint4 *)dst = make_uint4(bf2(f[0], f[1]), bf2(f[2], f[3]), bf2(f[4], f[5]), bf2(f[6], f[7]));
            *(uint4 *)(dst + 8) = make_uint4(bf2(f[8], f[9]), bf2(f[10], f[11]), bf2(f[12], f[13]), bf2(f[14], f[15]));
        }
    }
    cp_commit();
    cp_wait<0>();
    __syncthreads();
    const uint32_t ks_a = smem_u32(ks);
    for (int nt = 0; nt * 8 < cols; nt++) {
        /* B: column nt * 8 + gr = (token, head) of the run, its query's three parts */
        const int cb = nt * 8 + gr;
        const float *qr = cb < cols ? iq + ((size_t)(t0 + cb / ni) * ni + cb % ni) * Di : NULL;
        uint32_t bq[KD][3][2];
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            float2 u = make_float2(0.f, 0.f), v = make_float2(0.f, 0.f);
            if (qr) {
                u = *(const float2 *)(qr + kk * 16 + 2 * tg);
                v = *(const float2 *)(qr + kk * 16 + 8 + 2 * tg);
            }
            split3(u.x, u.y, &bq[kk][0][0], &bq[kk][1][0], &bq[kk][2][0]);
            split3(v.x, v.y, &bq[kk][0][1], &bq[kk][1][1], &bq[kk][2][1]);
        }
        /* this thread's accumulator columns c0, c0 + 1: key j of the block counts where j <= lim */
        const int c0 = nt * 8 + 2 * tg;
        const int lim0 = c0 < cols ? min(pos[t0 + c0 / ni] - p0, n - 1) : -1;
        const int lim1 = c0 + 1 < cols ? min(pos[t0 + (c0 + 1) / ni] - p0, n - 1) : -1;
        float best0 = -INFINITY, best1 = -INFINITY;
        for (int mt = warp; mt < MT && mt * 16 < n; mt += 4) {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int kk = 0; kk < KD; kk++) {
                uint32_t a[4];
                ldmatrix_x4(a, ks_a + (uint32_t)(((mt * 16 + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8) * 2));
#pragma unroll
                for (int pt = 0; pt < 3; pt++) mma_bf16(acc, a, bq[kk][pt][0], bq[kk][pt][1]);
            }
            const int ja = mt * 16 + gr, jb = ja + 8;
            if (ja <= lim0) best0 = fmaxf(best0, acc[0]);
            if (ja <= lim1) best1 = fmaxf(best1, acc[1]);
            if (jb <= lim0) best0 = fmaxf(best0, acc[2]);
            if (jb <= lim1) best1 = fmaxf(best1, acc[3]);
        }
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
            best0 = fmaxf(best0, __shfl_xor_sync(0xffffffffu, best0, o));
            best1 = fmaxf(best1, __shfl_xor_sync(0xffffffffu, best1, o));
        }
        if (gr == 0) {
            red[warp][c0] = best0;
            red[warp][c0 + 1] = best1;
        }
    }
    __syncthreads();
    for (int cc = tid; cc < cols; cc += 128) {
        const int tt = t0 + cc / ni;
        if (blk > pos[tt] / B) continue; /* a block past this token's own */
        scores[((size_t)tt * ni + cc % ni) * nbmax + blk] = fmaxf(fmaxf(red[0][cc], red[1][cc]), fmaxf(red[2][cc], red[3][cc]));
    }
    if (!ta.tctr || !last_cta(ta.tctr + r, nb)) return;
    /* every block of the run is scored: the top-k of each column, a warp per column */
    for (int cc = warp; cc < cols; cc += 4) {
        const int tt = t0 + cc / ni, g = cc % ni, qb = pos[tt] / B;
        float *row = (float *)ks + (size_t)cc * nbmax;
        int *pk = (int *)((float *)ks + (size_t)cols * nbmax) + cc * ta.topk;
        const float *src = scores + ((size_t)tt * ni + g) * nbmax;
        for (int b = lane; b <= qb; b += 32) row[b] = __ldcg(src + b);
        __syncwarp();
        topk_warp(row, qb + 1, qb, ta.topk, ta.local, ta.init, pk, ta.sel + ((size_t)tt * ni + g) * ta.topk, lane);
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
    static int mma_on = -1;
    if (mma_on < 0) mma_on = m3_cu_env_int("M3_INDEX_MMA", 1) != 0;
    const int KD = kv->Di / 16;
    if (mma_on && kv->Di % 16 == 0 && (KD == 2 || KD == 4 || KD == 8) && kv->idt != M3_KV_F32) {
        /* on the tensor cores, a CTA per (block, run) */
        const size_t mt = (size_t)(block + 15) / 16; /* 16-key tiles of a block */
        size_t sm = sizeof(uint16_t) * mt * 16 * (size_t)(kv->Di + 8);
        const int cols = c->max_run * ni;
        const size_t tsm = sizeof(float) * (size_t)cols * nbmax + sizeof(int) * (size_t)cols * topk;
        topk_args ta = {NULL, topk, local, init, sel};
        /* the top-k by each run's last CTA while the launch is a few waves at most; from 2048 (block,
         * run) CTAs the separate k_index_topk (decode batch 64 at 8K, bench_cuda_attn: 62.6 against
         * 70.1 us a layer; batch 256, 8 layers: 16.9-17.1 against 17.3-17.4 ms a step): each CTA's
         * arrival, a fence and an atomic, held its staged rows. M3_INDEX_FUSE_MAX: the bound */
        static long fuse_max = -1;
        if (fuse_max < 0) fuse_max = m3_cu_env_int("M3_INDEX_FUSE_MAX", 2048);
        if (m3_cu_fuse_on() && cols <= 8 && nbmax <= 256 && c->n_runs <= CTR_AUX - CTR_AUX_TOK &&
            (long)nbmax * c->n_runs < fuse_max) {
            ta.tctr = ctr_aux(c, CTR_AUX_TOK);
            if (tsm > sm) sm = tsm;
        }
        /* bf16 rows 16-byte aligned: the copies-only staging, 80 registers against 125 (6 CTAs an SM
         * against 4; decode batch 256: 2.32 -> 1.86 ms a step at 8 layers) and 2,048 SASS instructions
         * against 11,008. Alone (bench_cuda_attn, code warm) it is slower in a single wave (8 x 8
         * tokens 27.7 -> 31.2 us), but in a model's step, where each layer's kernels arrive cold, it
         * is faster: 30 layers at 8K, decode batch 1 6.22 -> 6.05 ms, batch 8 and the verify passes
         * the same or better (docs/PERF.md, session 27). M3_INDEX_CPA=0: never */
        static int cpa_on = -1;
        if (cpa_on < 0) cpa_on = m3_cu_env_int("M3_INDEX_CPA", 1) != 0;
        const bool cpa = cpa_on && kv->idt == M3_KV_BF16 &&
                         ((d.irb | d.kvpart | d.page_bytes | (uintptr_t)d.base) & 15) == 0;
        void (*fn)(kvdesc, const int32_t *, const int32_t *, const int32_t *, const int32_t *, const float *, int, int, int, float *,
                   topk_args) = KD == 2 ? (cpa ? k_index_scores_mma<2, true> : k_index_scores_mma<2, false>)
                                : KD == 4 ? (cpa ? k_index_scores_mma<4, true> : k_index_scores_mma<4, false>)
                                          : (cpa ? k_index_scores_mma<8, true> : k_index_scores_mma<8, false>);
        if (sm > (size_t)c->smem_optin) {
            m3_cu_failf(c, "CUDA backend: the indexer needs %zu bytes of shared memory (blocks of %d keys)", sm, block);
            m3_cu_prof_end(c, OP_INDEX);
            return;
        }
        if (sm > 48 * 1024) cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        fn<<<dim3(nbmax, c->n_runs), 128, sm, c->st>>>(d, c->d_pos, c->d_seq, c->d_lead, c->d_rlen, iq, ni, block, nbmax, scores, ta);
        if (ta.tctr) {
            CK_LAUNCH(c, "index_scores (tensor cores) + top-k");
            m3_cu_prof_end(c, OP_INDEX);
            return;
        }
    } else if (block <= 256 && kv->Di % 16 == 0) { /* a CTA per (block, token), a thread per key */
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
        if (sm > 48 * 1024) cudaFuncSetAttribute(k_index_scores_thread_per_key, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        k_index_scores_thread_per_key<<<dim3(nbmax, T), th, sm, c->st>>>(d, c->d_pos, c->d_seq, iq, ni, block, nbmax, scores, ta, rs);
        if (ta.tctr) {
            CK_LAUNCH(c, "index_scores + top-k");
            m3_cu_prof_end(c, OP_INDEX);
            return;
        }
    } else { /* enough CTAs to cover the blocks of the longest sequence with 4 warps each */
        unsigned gx = cdiv(nbmax, 4);
        if (gx > 256) gx = 256;
        k_index_scores_warp_per_block<<<dim3(gx, T), 128, sizeof(float) * (size_t)ni * kv->Di, c->st>>>(d, c->d_pos, c->d_seq, iq, ni, block,
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
