/* Block-sparse / dense causal attention on the GPU over the paged KV cache (kv.cuh), and the
 * log-sum-exp merge of its key splits.
 * CPU reference: src/backend/cpu/attention.c (m3_cpu_attention).
 *
 * Attention: a CTA per (key split, KV group, token) walks 32-key chunks of the keys the
 * token may see (the selected blocks, or [0, pos] on dense layers), online softmax per
 * query head of the group; splits are merged by log-sum-exp. Splits are chosen so that a
 * decode step fills the GPU (at least 32 per (token, group) up to 8 tokens: a verify pass);
 * prefill gets one split per (token, group). The tensor-core kernel (k_attn_mma: a warp per
 * chunk, products on mma.sync) computes either precision (attn_mma.cuh): bf16, the GPU's default
 * (q, K, V and the probabilities rounded to bf16), for every cache dtype; exact (q and the
 * probabilities in three bf16 parts, f32 precision) for caches whose values are exact in bf16
 * (bf16, FP8, NVFP4; FP8 / NVFP4 from 2 tokens). The rest run the f32 kernels (k_attn_f32_g16 for
 * G <= 16 and D <= 128, k_attn_f32 for other shapes), which compute either precision too.
 * Prefill steps take the token tiles of attention_tile.cu instead, for all
 * their tokens or (sparse layers, bf16 caches) those that see every block: m3_cu_attention says which;
 * the per-chunk step both tensor-core kernels run is attn_mma.cuh.
 * M3_ATTN_MMA=0 turns the tensor-core kernels off, M3_ATTN_TILE=0 the token tiles. */
#include <math.h>

#include "attn_mma.cuh"
#include "kv.cuh"
#include "ptx.cuh"

/* ------------------------------------------------------------------ attention */

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
 * chunks (block / ACH chunks each), dense = [0, pos] in ACH-key chunks. RB: precision bf16
 * (attn_mma.cuh's definition), as k_attn_f32_g16. */
template <bool RB>
__global__ void k_attn_f32(kvdesc d, const int32_t *pos, const int32_t *seq, const float *q, int nh, const int32_t *sel,
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
        const float v = q[((size_t)t * nh + (size_t)g * G) * D + i];
        qs[i] = RB ? bf16_round(v) : v;
        acc[i] = 0;
    }
    const float sl = RB ? scale * M3_LOG2E_F : scale;
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
                for (int e = 0; e < 8; e++) {
                    ks[j * DP + x + e] = RB ? bf16_round(kv[e]) : kv[e];
                    vs[j * D + x + e] = RB ? bf16_round(vv[e]) : vv[e];
                }
            }
        } else {
            for (int i = tid; i < n * D; i += nt) {
                int j = i / D, x = i % D, kp = a + j;
                const uint8_t *pg = page_of(d, sq, kp);
                size_t off = ((size_t)g * d.page + kp % d.page) * d.rb;
                const float kx = read_el(pg + off, d.dt, D, x), vx = read_el(pg + d.kvpart + off, d.dt, D, x);
                ks[j * DP + x] = RB ? bf16_round(kx) : kx;
                vs[j * D + x] = RB ? bf16_round(vx) : vx;
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
                v = dot * sl;
            }
            ps[i] = v;
        }
        __syncthreads();
        /* online softmax: a warp per head */
        for (int h = tid / 32; h < G; h += nt / 32) {
            int lane = tid & 31;
            float v = lane < ACH ? ps[h * ACH + lane] : -INFINITY;
            float mx = fmaxf(ml[h], RB ? ceilf(warp_max(v)) : warp_max(v));
            float e_ = lane < n ? (RB ? bf16_round(exp2f(v - mx)) : expf(v - mx)) : 0.0f;
            if (lane < ACH) ps[h * ACH + lane] = e_;
            float sum = warp_sum(e_);
            if (lane == 0) {
                float corr = RB ? m3_pow2_int(ml[h] - mx) : expf(ml[h] - mx); /* 0 on the first chunk */
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
 * read as broadcast float4. RB: precision bf16 (attn_mma.cuh's definition: q, K, V and the
 * probabilities rounded to bf16, powers of two), for the steps the tensor-core kernel does not take
 * (one token on an FP8 / NVFP4 cache: this kernel is faster there). */
template <int NW, bool RB>
__global__ void __launch_bounds__(NW * 32) k_attn_f32_g16(kvdesc d, const int32_t *pos, const int32_t *seq, const float *q, int nh,
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
        for (int i = tid; i < G * D / 4; i += NT) {
            float4 v = qg[i];
            if (RB) v = make_float4(bf16_round(v.x), bf16_round(v.y), bf16_round(v.z), bf16_round(v.w));
            ((float4 *)qs)[i] = v;
        }
    }
    const float sl = RB ? scale * M3_LOG2E_F : scale;
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
            if (RB && d.dt == M3_KV_F32)
#pragma unroll
                for (int u = 0; u < 8; u++) { kv[u] = bf16_round(kv[u]); vv[u] = bf16_round(vv[u]); }
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
                if (h < G) ps[h * ACH + lane] = lane < n ? dot[hh] * sl : -INFINITY;
            }
        }
        __syncthreads();
        for (int h = warp; h < G; h += NW) {
            float v = ps[h * ACH + lane];
            float mx = fmaxf(ml[h], RB ? ceilf(warp_max(v)) : warp_max(v));
            float e_ = lane < n ? (RB ? bf16_round(exp2f(v - mx)) : expf(v - mx)) : 0.0f;
            ps[h * ACH + lane] = e_;
            float sum = warp_sum(e_);
            if (lane == 0) {
                float corr = RB ? m3_pow2_int(ml[h] - mx) : expf(ml[h] - mx);
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
 * The same split / chunk walk with the products on mma.sync (bf16 in, f32 accumulation; the chunk
 * step in attn_mma.cuh), for
 * caches whose values are exact in bf16 (bf16, FP8 E4M3, NVFP4: E2M1 x E4M3 has at most 5
 * significant bits), G <= 16 query heads per group (the MMA's 16 rows; rows past G hold zero
 * queries and are not written) and D a multiple of 16 up to 128 (ND = D / 8 column tiles).
 * q and the probabilities are split into three bf16 parts each (hi, mid, lo: 24 bits, f32's
 * precision; the products are exact in f32), so the result agrees with the f32 kernels to
 * rounding. A warp owns whole 32-key chunks: its K and V rows are staged in shared memory as
 * bf16 (cp.async for a bf16 cache), S = Q K^T in registers, online softmax per row, O += P V
 * with V's fragments by ldmatrix.trans; the CTA's warps are then combined in a fixed order
 * (deterministic) into one partial (or the output when nsplit = 1), merged by k_attn_merge_lse.
 * BF16A: a bf16 cache of 16-byte aligned rows, known at compile time: the kernel holds the
 * cp.async path alone (2.1K of 13.2K SASS instructions at ND = 16, 130 registers against 196).
 * Steps of at most 8 tokens take it: there each CTA runs once per layer and its code arrives
 * cold; larger launches run the other faster (bench_cuda_attn, 64 x 8 tokens: 592 against
 * 669 us). */
#define AT_NW 4 /* warps per CTA */

template <int ND, bool BF16A, int NP>
__global__ void __launch_bounds__(AT_NW * 32) k_attn_mma(kvdesc d, const int32_t *pos, const int32_t *seq, const float *q, int nh,
                                                        const int32_t *sel, int B, int topk, int nsplit, float *part, float *out,
                                                        float scale) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    constexpr int D = ND * 8, DP = D + 8; /* bf16 rows padded by 16 bytes: fragment loads conflict-free */
    extern __shared__ __align__(16) uint16_t asm_[];
    uint16_t *qs = asm_;                                        /* [NP][16][DP] */
    uint16_t *kv0 = qs + NP * 16 * DP;                          /* per warp: K [ACH][DP], V [ACH][DP] */
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
    const int ld = BF16A ? 1
                   : d.dt == M3_KV_BF16 ? ((al & 15) == 0 ? 1 : 0)
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
                if (j < n) piece_load(ld == 3, row_of(j), d.kvpart, D, x, &rk[k], &rv[k]);
            }
#pragma unroll
            for (int k = 0; k < PPL; k++) {
                const int i = lane + 32 * k, j = i / ND, x = (i % ND) * 8;
                *(uint4 *)(ks + j * DP + x) = piece_bf16(ld == 3, rk[k]);
                *(uint4 *)(vs + j * DP + x) = piece_bf16(ld == 3, rv[k]);
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
                cp_async16(smem_u32(kd), row + 2 * x);
                cp_async16(smem_u32(vd), row + d.kvpart + 2 * x);
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
    attn_stage_q<ND, NP>(q, t, nh, g, G, qs, tid, AT_NW * 32);
    __syncthreads();
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f; /* rows gr, gr + 8 (l: this thread's share) */
    while (ci < nchunks) {
        const int n = e - a;
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncwarp();
        attn_chunk_mma<ND, NP>(qs, ks, vs_a, n, scale, lane, o, m0, m1, l0, l1);
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
    float *wf = wml + AT_NW * 32; /* [AT_NW][16] factors exp(m_w - M) (NP = 1: 2^(m_w - M)), then [16] M and [16] L */
    if (tid < 16) {
        float M = -INFINITY, L = 0.f;
#pragma unroll
        for (int w = 0; w < AT_NW; w++) M = fmaxf(M, wml[w * 32 + tid]);
#pragma unroll
        for (int w = 0; w < AT_NW; w++) {
            const float mw = wml[w * 32 + tid], f = NP == 1 ? m3_pow2_int(mw - M) : mw == -INFINITY ? 0.f : expf(mw - M);
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
static size_t attn_mma_smem(int D, int np) {
    const int DP = D + 8;
    return sizeof(uint16_t) * ((size_t)np * 16 * DP + (size_t)AT_NW * 2 * ACH * DP) + sizeof(float) * (AT_NW * 48 + 32);
}

/* with xs, also the f16 split of out (hi [n], then lo; the o projection's input, linear_mma.cu).
 * A block per (head, token) of at least Q x D threads (Q <= MERGE_Q): the splits' weights
 * exp(m_s - M) / L once, in shared memory, then thread (q, x) sums channel x over splits q,
 * q + Q, ... (all its loads in flight at once) and the Q partial sums of a channel are added in
 * order of q. */
#define MERGE_MAX 64 /* splits (m3_cu_attention caps nsplit at 64) */
#define MERGE_Q 4
__global__ void __launch_bounds__(1024) k_attn_merge_lse(const float *part, int nkv, int G, int D, int nsplit, int nh, int Q,
                                                     float *out, uint16_t *xs, size_t n, int rb, int lg2) {
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
        /* lg2 (precision bf16): maxima in log2 units, integers: exact powers of two (attn_mma.cuh) */
        const float w0 = lg2 ? m3_pow2_int(m0 - M) : m0 != -INFINITY ? expf(m0 - M) : 0.0f;
        const float w1 = lg2 ? m3_pow2_int(m1 - M) : m1 != -INFINITY ? expf(m1 - M) : 0.0f;
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
    if (xs) split_store(r, xs + k, xs + n + k, rb);
}

template <int NP>
static void (*attn_mma_fn(int ND, bool bf16a))(kvdesc, const int32_t *, const int32_t *, const float *, int, const int32_t *, int, int,
                                               int, float *, float *, float) {
    if (bf16a)
        return ND == 4 ? k_attn_mma<4, true, NP> : ND == 6 ? k_attn_mma<6, true, NP>
               : ND == 8 ? k_attn_mma<8, true, NP> : k_attn_mma<16, true, NP>;
    return ND == 4 ? k_attn_mma<4, false, NP> : ND == 6 ? k_attn_mma<6, false, NP>
           : ND == 8 ? k_attn_mma<8, false, NP> : k_attn_mma<16, false, NP>;
}

/* The split kernels over tokens [t0, t0 + T) of the step (whole: all of them; the merge then also
 * writes the o projection's input split) */
static void attn_split(m3_cuda *c, const m3_kv *kv, int layer, int t0, int T, bool whole, const float *q, int nh,
                       const int32_t *sel, int block, int topk, float *out, bool tc, int np) {
    const int nkv = kv->nkv, D = kv->D, G = nh / nkv, ND = D / 8;
    const int32_t *pos = c->d_pos + t0, *seq = c->d_seq + t0;
    q += (size_t)t0 * nh * D;
    out += (size_t)t0 * nh * D;
    if (sel) sel += (size_t)t0 * nkv * topk;
    int nchunks = sel ? topk * ((block + ACH - 1) / ACH) : c->max_pos / ACH + 1;
    /* splits of each (token, KV head)'s keys: about two CTAs per SM in all (fewer measured slower at
     * batch 1: docs/PERF.md); none from one (token, KV head) per SM (decode at 64 sequences, 150.7 ->
     * 99.5 us a layer with 2 splits -> 1: the merge took ~45 of them) */
    int nsplit = (size_t)T * nkv >= (size_t)c->sm_count ? 1 : (int)cdiv(2 * (size_t)c->sm_count, (size_t)T * nkv);
    if (tc) { /* AT_NW warps a CTA, each on whole chunks: as many chunks a warp as the GPU's two CTAs per SM need
               * (one chunk a warp at 8 tokens measured slower: docs/PERF.md) */
        const int cpw = (int)cdiv((size_t)nchunks, (size_t)(nsplit > 64 ? 64 : nsplit) * AT_NW);
        nsplit = (int)cdiv((size_t)nchunks, (size_t)cpw * AT_NW);
    } else if (T <= 8 && nsplit < 32) {
        nsplit = 32; /* a verify pass / small batch: a chunk or two per CTA (8 tokens: 4.96 against 5.05 ms a pass
                      * with 9 splits) */
    }
    static int force = -1; /* M3_ATTN_SPLITS=n: n splits (measurements) */
    if (force < 0) force = m3_cu_env_int("M3_ATTN_SPLITS", 0);
    if (force > 0) nsplit = force;
    if (nsplit > 64) nsplit = 64;
    if (nsplit > nchunks) nsplit = nchunks;
    if (nsplit < 1) nsplit = 1;
    size_t smem = sizeof(float) * ((size_t)G * D * 2 + ACH * (size_t)(D + 1) + ACH * (size_t)D + (size_t)G * ACH + 3 * (size_t)G);
    if (smem > c->smem_optin) { m3_cu_failf(c, "CUDA backend: attention needs %zu bytes of shared memory", smem); return; }
    if (smem > 48 * 1024)
        cudaFuncSetAttribute(np == 1 ? k_attn_f32<true> : k_attn_f32<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    float *part = NULL;
    if (nsplit > 1) {
        part = (float *)m3_cu_scratch(c, SC_ATT, sizeof(float) * (size_t)T * nkv * nsplit * G * (D + 2));
        if (!part) return;
    }
    if (tc) {
        const size_t sm = attn_mma_smem(D, np);
        const kvdesc dd = desc(c, kv, layer);
        static int bf16a_on = -1; /* M3_ATTN_BF16A=0: the kernel of every format for bf16 too (measurements) */
        if (bf16a_on < 0) bf16a_on = m3_cu_env_int("M3_ATTN_BF16A", 1) != 0;
        const bool bf16a = bf16a_on && T <= 8 /* (the header above: larger launches run the other faster) */ &&
                           kv->dt == M3_KV_BF16 && ((dd.rb | dd.kvpart | dd.page_bytes | (uintptr_t)dd.base) & 15) == 0;
        void (*fn)(kvdesc, const int32_t *, const int32_t *, const float *, int, const int32_t *, int, int, int, float *, float *,
                   float) = np == 1 ? attn_mma_fn<1>(ND, bf16a) : attn_mma_fn<3>(ND, bf16a);
        if (sm > c->smem_optin) { m3_cu_failf(c, "CUDA backend: attention needs %zu bytes of shared memory", sm); return; }
        if (sm > 48 * 1024) cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        fn<<<dim3(nsplit, nkv, T), AT_NW * 32, sm, c->st>>>(dd, pos, seq, q, nh, sel, block, topk, nsplit,
                                                            part, out, 1.0f / sqrtf((float)D));
    } else if (G <= 16 && D <= 128 && D % 8 == 0) {
        size_t sf = sizeof(float) * ((size_t)G * D + ACH * (size_t)(D + 4) + ACH * (size_t)D + (size_t)G * ACH + 3 * (size_t)G);
        /* 8 warps where D = 128 (a thread per channel and 8 heads): 11.8 against 14.5 us a decode layer */
        void (*fn)(kvdesc, const int32_t *, const int32_t *, const float *, int, const int32_t *, int, int, int, float *, float *,
                   float) = D == 128 ? (np == 1 ? k_attn_f32_g16<8, true> : k_attn_f32_g16<8, false>)
                                     : (np == 1 ? k_attn_f32_g16<4, true> : k_attn_f32_g16<4, false>);
        if (sf > 48 * 1024) cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sf);
        fn<<<dim3(nsplit, nkv, T), D == 128 ? 256 : 128, sf, c->st>>>(desc(c, kv, layer), pos, seq, q, nh, sel, block, topk, nsplit,
                                                                     part, out, 1.0f / sqrtf((float)D));
    } else {
        int threads = G * D >= 256 ? 256 : 128;
        void (*f32)(kvdesc, const int32_t *, const int32_t *, const float *, int, const int32_t *, int, int, int, float *, float *,
                    float) = np == 1 ? k_attn_f32<true> : k_attn_f32<false>;
        f32<<<dim3(nsplit, nkv, T), threads, smem, c->st>>>(desc(c, kv, layer), pos, seq, q, nh, sel, block, topk, nsplit, part, out,
                                                          1.0f / sqrtf((float)D));
    }
    if (CK_LAUNCH(c, "attention")) return;
    if (nsplit > 1) {
        const size_t n = (size_t)T * nh * D;
        const bool split_out = whole && (size_t)nh * D % 128 == 0; /* the merge writes o_proj's input split too */
        uint16_t *xs = split_out ? m3_cu_xsplit_claim(c, out, n) : NULL;
        if (split_out && !xs) return;
        int Q = MERGE_Q;
        while (Q > 1 && Q * D > 1024) Q /= 2;
        if (Q * D > 1024) { m3_cu_failf(c, "CUDA backend: head_dim %d above 1024", D); return; }
        const int threads = (Q * D + 31) / 32 * 32;
        k_attn_merge_lse<<<dim3(nh, T), threads, sizeof(float) * Q * (size_t)D, c->st>>>(part, nkv, G, D, nsplit, nh, Q, out, xs, n,
                                                                                        c->gemm_bf16, np == 1);
        CK_LAUNCH(c, "attention merge");
    }
}

void m3_cu_attention(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *q, int nh, const int32_t *sel,
                     int block, int topk, float *out) {
    m3_cu_xsplit_touch((m3_cuda *)ctx, out, sizeof(float) * (size_t)b->T * nh * kv->D);
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_ATTN);
    if (c->failed) { m3_cu_prof_end(c, OP_ATTN); return; }
    if (b != c->step_b) { m3_cu_failf(c, "CUDA backend: attention outside its step"); { m3_cu_prof_end(c, OP_ATTN); return; } }
    const int T = b->T, nkv = kv->nkv, D = kv->D, G = nh / nkv, ND = D / 8;
    /* FP8 / NVFP4 caches at one token: the f32 kernel (in a decode graph at 128K: 2.35-2.38 against
     * 2.42-2.44 ms; docs/PERF.md) */
    static int mma_on = -1, parts = -1; /* M3_ATTN_PARTS=1 / 3: q and P as one or three bf16 parts whatever the precision */
    if (mma_on < 0) mma_on = m3_cu_env_int("M3_ATTN_MMA", 1) != 0;
    if (parts < 0) parts = m3_cu_env_int("M3_ATTN_PARTS", 0);
    /* precision bf16: q, K, V and the probabilities rounded to bf16 (attn_mma.cuh; every kernel here
     * computes it, the tensor-core ones for f32 caches too); exact: q and P in three parts */
    const int np = parts == 1 || parts == 3 ? parts : c->gemm_bf16 ? 1 : 3;
    const bool words = kv->dt == M3_KV_FP8 || kv->dt == M3_KV_NVFP4 || (np == 1 && kv->dt == M3_KV_F32); /* from 2 tokens */
    const int tc = (kv->dt == M3_KV_BF16 || (words && T > 1)) && G <= 16 && D % 16 == 0 &&
                   (ND == 4 || ND == 6 || ND == 8 || ND == 16) && mma_on;
    /* prefill (and verify passes of many sequences): token tiles, each chunk read once for the tile's tokens,
     * where the step's runs fill them (attention_tile.cu decides). Precision bf16 (one MMA per product:
     * the tiles' chunk step is short, their smem small) and FP8 / NVFP4 caches (whose values each
     * token's split CTA decodes again): tiles for every token of prefill-like steps (32+ tokens a
     * sequence; not verify passes). H100, 8 layers, 4096-token prefill, attention (session 40): bf16
     * cache 22.3 ms with only the tokens below topk blocks on tiles, 15.1 with every token; FP8 16.4.
     * Exact precision with bf16 caches: on sparse layers only the tokens that see every block (position
     * < topk blocks: all of a tile's tokens then read the same keys; the longest stretch of them) take
     * tiles, the others the split kernel. H100, bench_cuda_attn (docs/PERF.md, session 39), us, split
     * against tiles: bf16 1024-token prefill 416 / 316, 512 tokens after 4096 (16 of 36 blocks) 581 / 796,
     * verify 64 x 8 601 / 1022; NVFP4 739 / 371, 1007 / 973, 1116 / 1249, 3 x 100 tokens across 2048
     * 628 / 463; FP8 512 after 4096 901 / 869, 3 x 100 556 / 461, 64 x 8 949 / 1115.
     * M3_ATTN_TILE_ALL=1: tiles for every token, 0: only below topk blocks. The wgmma tiles
     * (attention_wg.cu: precision bf16, D 64 / 128) take such steps first (M3_ATTN_WG=0: not); H100, the
     * same prefill (session 47): 10.9 ms (9.05 with bf16 chunks by bulk copies), FP8 14.3, against the
     * token tiles' 15.6 / 17.0. */
    int ta = 0, te = tc ? T : 0;
    static int tile_all = -2;
    if (tile_all == -2) tile_all = m3_cu_env_int("M3_ATTN_TILE_ALL", -1);
    const bool all = tile_all == 1 || (tile_all < 0 && (np == 1 || kv->dt != M3_KV_BF16) && (long)T >= 32L * c->n_seqs);
    if (tc && sel && !all) {
        const long span = (long)topk * block; /* positions below it see every block */
        int best = 0;
        te = 0;
        for (int t = 0, r0 = 0; t <= T; t++)
            if (t == T || b->pos[t] >= span) {
                if (t - r0 > best) { best = t - r0; ta = r0; te = t; }
                r0 = t + 1;
            }
    }
    if (te > ta) {
        int rc = m3_cu_attention_wg(c, kv, layer, ta, te - ta, q, nh, sel, block, topk, np, out);
        if (rc == 1) rc = m3_cu_attention_tile(c, kv, layer, ta, te - ta, q, nh, sel, block, topk, np, out);
        if (rc < 0) { m3_cu_prof_end(c, OP_ATTN); return; } /* failed (recorded) */
        if (rc == 0) {
            if (ta > 0) attn_split(c, kv, layer, 0, ta, false, q, nh, sel, block, topk, out, tc, np);
            if (te < T && !c->failed) attn_split(c, kv, layer, te, T - te, false, q, nh, sel, block, topk, out, tc, np);
            m3_cu_prof_end(c, OP_ATTN);
            return;
        }
    }
    attn_split(c, kv, layer, 0, T, true, q, nh, sel, block, topk, out, tc, np);
    m3_cu_prof_end(c, OP_ATTN);
}
