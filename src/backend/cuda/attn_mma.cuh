/* The tensor-core attention's step over one chunk of 32 keys, shared by the split kernel
 * (k_attn_mma, attention.cu: decode and verify steps) and the token-tile kernel
 * (k_attn_tile, attention_tile.cu: prefill).
 *
 * A warp holds one token's 16 query rows (a KV group's heads; rows past G are zero) in shared
 * memory as NP bf16 parts: at precision exact three (hi, mid, lo: f32's 24 bits, so every
 * product with a bf16-exact key is exact in f32), at precision bf16 one (q rounded; below);
 * the chunk's K and V rows as bf16 (exact for bf16, FP8 E4M3 and NVFP4 caches; an f32 cache's
 * rounded, precision bf16 only), and its output O (16 rows x D, f32) in registers with the rows'
 * running max m and sum l (online softmax). S = Q K^T on mma.sync, the softmax of the rows, then
 * O += P V with P in NP parts too and V's fragments by ldmatrix.trans. Precision bf16 runs a third
 * of the MMAs (H100, 4096-token prefill at 8 layers: attention 26.7 -> 15.1 ms, docs/PERF.md). */
#ifndef M3_CUDA_ATTN_MMA_CUH
#define M3_CUDA_ATTN_MMA_CUH

#include "backend/attn_pow2.h"
#include "formats.cuh"
#include "ptx.cuh"

#define ACH 32 /* keys per chunk */

/* Precision bf16 (NP = 1; m3_cpu_attention computes the same, src/backend/cpu/attention.c): q and
 * the probabilities are GEMM inputs rounded to bf16 like every other, K and V are bf16 as staged,
 * and the probabilities are defined so that their rounding does not depend on the order the keys
 * are visited in: with s2_j = (bf16(q) . k_j) * (log2(e) / sqrt(D)) (f32) and any integer M >=
 * max s2, P_j = bf16(2^(s2_j - M)) and out = sum P_j v_j / sum P_j. A running max kept integer
 * (ceil) rescales by exact powers of two, which commute with the rounding; the running max is in
 * log2 units, and so are the partial results' maxima that the merges weigh by powers of two too. */

/* 8 floats (exact in bf16) -> 8 bf16 */
static __device__ __forceinline__ uint4 bf8(const float *f) {
    return make_uint4(bf2(f[0], f[1]), bf2(f[2], f[3]), bf2(f[4], f[5]), bf2(f[6], f[7]));
}

/* word loads of the 8-value pieces at x of a K row and of its V row (kvpart bytes further): FP8
 * (nvfp4 = 0): 8 E4M3 codes; NVFP4: x = 8 E2M1 codes, y = their block's scale byte (rows of D / 2
 * code bytes, then the scales) */
static __device__ __forceinline__ void piece_load(bool nvfp4, const uint8_t *row, size_t kvpart, int D, int x, uint2 *k, uint2 *v) {
    if (!nvfp4) {
        *k = *(const uint2 *)(row + x);
        *v = *(const uint2 *)(row + kvpart + x);
    } else {
        *k = make_uint2(*(const uint32_t *)(row + x / 2), row[D / 2 + x / 16]);
        *v = make_uint2(*(const uint32_t *)(row + kvpart + x / 2), row[kvpart + D / 2 + x / 16]);
    }
}

/* 8 cached values as bf16, from a word load of the row: FP8 (nvfp4 = 0): r holds 8 E4M3 codes;
 * NVFP4: r.x 8 E2M1 codes, r.y their block's E4M3 scale byte */
static __device__ __forceinline__ uint4 piece_bf16(bool nvfp4, uint2 r) {
    float f[8];
    if (!nvfp4) {
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const float2 v = e4m3x2_f32(((h < 2 ? r.x : r.y) >> (16 * (h & 1))) & 0xffffu);
            f[2 * h] = v.x;
            f[2 * h + 1] = v.y;
        }
    } else {
        const float sc = nvfp4_scale(r.y);
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const float2 v = e2m1x2_f32((r.x >> (8 * h)) & 0xffu);
            f[2 * h] = v.x * sc;
            f[2 * h + 1] = v.y * sc;
        }
    }
    return bf8(f);
}

/* One chunk: keys [0, n) of ks / vs (rows of D + 8 bf16; rows past n are zero), queries qs
 * ([NP][16][D + 8] bf16 parts), vs_a the shared address of vs. Updates o and the running max
 * (m0, m1) and this thread's share of the sums (l0, l1) of rows gr = lane / 4 and gr + 8.
 * NP = 3: q and P in three parts (f32 precision); NP = 1: bf16(q) and bf16(P) (precision bf16). */
template <int ND, int NP>
static __device__ __forceinline__ void attn_chunk_mma(const uint16_t *qs, const uint16_t *ks, uint32_t vs_a, int n, float scale,
                                                      int lane, float (&o)[ND][4], float &m0, float &m1, float &l0, float &l1) {
    constexpr int D = ND * 8, DP = D + 8;
    const int gr = lane >> 2, tg = lane & 3;
    /* S = Q K^T: 16 rows x 32 keys (4 column tiles), each part of q in accumulators of its own (12
     * chains of D / 16 MMAs, not 4 of 3 D / 16: a chain's MMAs wait on each other), summed lo + mid + hi */
    float sp[NP][4][4];
#pragma unroll
    for (int pt = 0; pt < NP; pt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) sp[pt][nt][0] = sp[pt][nt][1] = sp[pt][nt][2] = sp[pt][nt][3] = 0.f;
#pragma unroll 1 /* rolled: fewer instructions to fetch cold (a warp often runs one chunk) */
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t af[NP][4];
#pragma unroll
        for (int pt = 0; pt < NP; pt++) {
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
            for (int pt = 0; pt < NP; pt++) mma_bf16(sp[pt][nt], af[pt], b0, b1);
        }
    }
    float sc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (NP == 3) sc[nt][i] = sp[2][nt][i] + sp[1][nt][i] + sp[0][nt][i];
            else sc[nt][i] = sp[0][nt][i];
        }
    /* online softmax of rows gr (c0, c1) and gr + 8 (c2, c3); key of c_i: 8 nt + 2 tg + (i & 1).
     * NP = 1 works in powers of two (above): scores s log2(e) / sqrt(D), an integer
     * running max, each probability rounded to bf16 and summed as rounded */
    const float sl = NP == 1 ? scale * M3_LOG2E_F : scale;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = nt * 8 + 2 * tg + (i & 1);
            const float v = j < n ? sc[nt][i] * sl : -INFINITY;
            sc[nt][i] = v;
            if (i < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
        }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if constexpr (NP == 1) {
        mx0 = ceilf(mx0);
        mx1 = ceilf(mx1);
    }
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1); /* finite: n >= 1 key in the chunk */
    /* 0 on the first chunk; NP = 1: exact powers of two */
    const float c0 = NP == 1 ? m3_pow2_int(m0 - n0) : expf(m0 - n0), c1 = NP == 1 ? m3_pow2_int(m1 - n1) : expf(m1 - n1);
    m0 = n0;
    m1 = n1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int nt = 0; nt < ND; nt++) { o[nt][0] *= c0; o[nt][1] *= c0; o[nt][2] *= c1; o[nt][3] *= c1; }
    uint32_t pb[4][2]; /* NP = 1: the probabilities as bf16 pairs (rows gr, gr + 8) */
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        if constexpr (NP == 1) {
            pb[nt][0] = bf2(exp2f(sc[nt][0] - n0), exp2f(sc[nt][1] - n0));
            pb[nt][1] = bf2(exp2f(sc[nt][2] - n1), exp2f(sc[nt][3] - n1));
            l0 += __uint_as_float(pb[nt][0] << 16) + __uint_as_float(pb[nt][0] & 0xffff0000u);
            l1 += __uint_as_float(pb[nt][1] << 16) + __uint_as_float(pb[nt][1] & 0xffff0000u);
        } else {
            sc[nt][0] = expf(sc[nt][0] - n0); sc[nt][1] = expf(sc[nt][1] - n0);
            sc[nt][2] = expf(sc[nt][2] - n1); sc[nt][3] = expf(sc[nt][3] - n1);
            l0 += sc[nt][0] + sc[nt][1];
            l1 += sc[nt][2] + sc[nt][3];
        }
    }
    /* O += P V: keys in two k16 steps; P's A fragments are S's C fragments, in NP parts */
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
        uint32_t pa[NP][4];
#pragma unroll
        for (int h = 0; h < 4; h++) {
            /* A fragment h: rows gr / gr + 8 (h & 1), keys + 0 / + 8 (h >> 1) */
            const float *s2 = &sc[2 * kk + (h >> 1)][2 * (h & 1)];
            if constexpr (NP == 3) split3(s2[0], s2[1], &pa[0][h], &pa[1][h], &pa[2][h]);
            else pa[0][h] = pb[2 * kk + (h >> 1)][h & 1];
        }
        const int mi = lane >> 3, r = lane & 7;
#pragma unroll
        for (int np = 0; np < ND / 2; np++) {
            const uint32_t ad = vs_a + (uint32_t)(((kk * 16 + (mi & 1) * 8 + r) * DP + np * 16 + (mi >> 1) * 8) * 2);
            uint32_t b0, b1, b2, b3;
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(ad));
#pragma unroll
            for (int pt = 0; pt < NP; pt++) {
                mma_bf16(o[2 * np], pa[pt], b0, b1);
                mma_bf16(o[2 * np + 1], pa[pt], b2, b3);
            }
        }
    }
}

/* query rows of token t, group g (heads g G .. g G + G - 1 of nh, rows >= G zero) -> qs as NP
 * bf16 parts (NP = 1: rounded to bf16); threads tid, tid + nt, ... of the caller */
template <int ND, int NP>
static __device__ __forceinline__ void attn_stage_q(const float *q, int t, int nh, int g, int G, uint16_t *qs, int tid, int nt) {
    constexpr int D = ND * 8, DP = D + 8;
    for (int i = tid; i < 16 * D / 2; i += nt) {
        const int h = i / (D / 2), x = (i % (D / 2)) * 2;
        float2 v = make_float2(0.f, 0.f);
        if (h < G) v = *(const float2 *)(q + ((size_t)t * nh + (size_t)g * G + h) * D + x);
        if constexpr (NP == 1) {
            *(uint32_t *)&qs[h * DP + x] = bf2(v.x, v.y);
        } else {
            uint32_t a3, b3, c3;
            split3(v.x, v.y, &a3, &b3, &c3);
            *(uint32_t *)&qs[(0 * 16 + h) * DP + x] = a3;
            *(uint32_t *)&qs[(1 * 16 + h) * DP + x] = b3;
            *(uint32_t *)&qs[(2 * 16 + h) * DP + x] = c3;
        }
    }
}

#endif
