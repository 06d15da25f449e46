/* Prefill attention in token tiles: the tensor-core attention (attn_mma.cuh) with each chunk
 * of K / V read once for TT neighbouring tokens.
 * CPU reference: src/backend/cpu/attention.c (m3_cpu_attention).
 *
 * The split kernel (k_attn_mma, attention.cu) runs a CTA per (token, KV group), so at
 * prefill every token reads all of its keys from L2 on its own: 1 MB a (token, group) at the
 * M3.1-Flash shapes (16 blocks of 128 keys, bf16), ~17 GB a 4096-token layer. Here a CTA takes
 * TT consecutive tokens of one KV group, a warp each. The keys of the tile are the union of
 * its tokens' selected blocks (or, on dense layers, each sequence's [0, last position]), cut
 * in 32-key chunks and walked in ascending order (of sequence run, then block); each chunk is
 * loaded once into a double-buffered stage (cp.async for bf16 caches, word loads in flight
 * across the compute for FP8 / NVFP4) and every warp whose token sees it runs the chunk step,
 * masked at the token's position. Neighbouring tokens share most blocks (the local and
 * initial blocks always; every block of a sequence of at most topk x B tokens).
 *
 * A token's selected blocks are distinct (the indexer's top-k), each visited once here.
 * A token's chunks are its selected blocks in ascending order, whatever the tile holds, so its
 * output does not depend on its neighbours; it agrees with the f32 kernels to rounding (the
 * chunk step is exact in f32, see attn_mma.cuh). Tokens of different sequences may share a
 * tile (a chunk belongs to one sequence run of the tile). No splits: a warp walks all of its
 * token's chunks and writes the output itself. */
#include <math.h>

#include "attn_keys.cuh"
#include "attn_mma.cuh"
#include "kv.cuh"
#include "ptx.cuh"

template <int ND, int TT, int NP>
__global__ void __launch_bounds__(TT * 32) k_attn_tile(kvdesc d, const int32_t *pos, const int32_t *seq, const float *q, int nh,
                                                         int T, const int32_t *sel, int B, int topk, float *out, float scale) {
    pdl_trigger();
    constexpr int D = ND * 8, DP = D + 8, NT = TT * 32;
    extern __shared__ __align__(16) uint16_t tsm[];
    uint16_t *qall = tsm;                           /* [TT][NP][16][DP]: each warp's token's queries */
    uint16_t *kvs = qall + TT * NP * 16 * DP;       /* [2 stages][K, V][ACH][DP] */
    const tile_keys tk = tile_keys_at((int *)(kvs + 2 * 2 * ACH * DP), TT, topk, false);
    const int *trun = tk.trun, *tposs = tk.tpos, *rseq = tk.rseq, *skey = tk.skey;
    const int g = blockIdx.y, t0 = blockIdx.x * TT, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int G = nh / d.nkv, cpb = (B + ACH - 1) / ACH;
    tile_keys_build<TT>(tk, pos, seq, sel, t0, T, g, d.nkv, topk, ACH, cpb, tid, NT);
    const int nch = tk.nch[0];
    auto chunk_at = [&](int i, int *r, int *a, int *e, int *key) { tile_chunk(tk, sel != NULL, i, B, ACH, cpb, r, a, e, key); };
    /* how K / V rows load: 1 bf16 by cp.async, 2 FP8 and 3 NVFP4 by word loads, 0 read8 */
    const size_t al = d.rb | d.kvpart | d.page_bytes | (uintptr_t)d.base;
    const int ld = d.dt == M3_KV_BF16 ? ((al & 15) == 0 ? 1 : 0)
                   : d.dt == M3_KV_FP8 ? ((al & 7) == 0 ? 2 : 0)
                   : d.dt == M3_KV_NVFP4 ? ((al & 3) == 0 ? 3 : 0) : 0;
    constexpr int PPT = (ACH * ND + NT - 1) / NT; /* 8-value pieces of K (and of V) per thread */
    uint2 rk[PPT], rv[PPT];            /* FP8 / NVFP4 words in flight */
    /* the row of key j of the chunk [a, e) of run r; pg: its first row when the chunk lies in one page
     * (always where the page is a multiple of 32 keys), else NULL */
    auto chunk_rows = [&](int r, int a, int e) -> const uint8_t * {
        if (e <= a || a / d.page != (e - 1) / d.page) return NULL;
        return (const uint8_t *)page_of(d, rseq[r], a) + ((size_t)g * d.page + a % d.page) * d.rb;
    };
    auto row_at = [&](const uint8_t *pg, int r, int a, int j) {
        if (pg) return pg + (size_t)j * d.rb;
        const int kp = a + j;
        return (const uint8_t *)page_of(d, rseq[r], kp) + ((size_t)g * d.page + kp % d.page) * d.rb;
    };
    /* start loading chunk (r, a, e) into stage st: bf16 copies issued (committed), FP8 / NVFP4 words into rk / rv */
    auto load_start = [&](int st, int r, int a, int e) {
        uint16_t *ks = kvs + st * 2 * ACH * DP, *vs = ks + ACH * DP;
        const int n = e - a;
        const uint8_t *pg = chunk_rows(r, a, e);
        if (ld == 1) {
#pragma unroll
            for (int k = 0; k < PPT; k++) {
                const int i = tid + NT * k, j = i / ND, x = (i % ND) * 8;
                if (ACH * ND % NT && i >= ACH * ND) break;
                uint16_t *kd = ks + j * DP + x, *vd = vs + j * DP + x;
                if (j < n) {
                    const uint8_t *row = row_at(pg, r, a, j);
                    cp_async16(smem_u32(kd), row + 2 * x);
                    cp_async16(smem_u32(vd), row + d.kvpart + 2 * x);
                } else {
                    *(uint4 *)kd = make_uint4(0, 0, 0, 0);
                    *(uint4 *)vd = make_uint4(0, 0, 0, 0);
                }
            }
            cp_commit();
        } else if (ld == 2 || ld == 3) {
#pragma unroll
            for (int k = 0; k < PPT; k++) {
                const int i = tid + NT * k, j = i / ND, x = (i % ND) * 8;
                if (ACH * ND % NT && i >= ACH * ND) break;
                rk[k] = rv[k] = make_uint2(0, 0); /* zero codes decode to 0.0 (rows past the chunk) */
                if (j < n) piece_load(ld == 3, row_at(pg, r, a, j), d.kvpart, D, x, &rk[k], &rv[k]);
            }
        }
    };
    /* finish it: FP8 / NVFP4 words converted into the stage, other caches read there now */
    auto load_finish = [&](int st, int r, int a, int e) {
        uint16_t *ks = kvs + st * 2 * ACH * DP, *vs = ks + ACH * DP;
        const int n = e - a;
        if (ld == 2 || ld == 3) {
#pragma unroll
            for (int k = 0; k < PPT; k++) {
                const int i = tid + NT * k, j = i / ND, x = (i % ND) * 8;
                if (ACH * ND % NT && i >= ACH * ND) break;
                *(uint4 *)(ks + j * DP + x) = piece_bf16(ld == 3, rk[k]);
                *(uint4 *)(vs + j * DP + x) = piece_bf16(ld == 3, rv[k]);
            }
        } else if (ld == 0) {
#pragma unroll 1
            for (int i = tid; i < ACH * ND; i += NT) {
                const int j = i / ND, x = (i % ND) * 8;
                float kf[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                if (j < n) {
                    const uint8_t *row = row_at(NULL, r, a, j);
                    read8(row, d.dt, D, x, kf);
                    read8(row + d.kvpart, d.dt, D, x, vf);
                }
                *(uint4 *)(ks + j * DP + x) = bf8(kf);
                *(uint4 *)(vs + j * DP + x) = bf8(vf);
            }
        }
    };
    const int myrun = trun[warp], myp = tposs[warp];
    uint16_t *myq = qall + warp * NP * 16 * DP;
    int cr, ca, ce, ckey; /* the current chunk */
    if (nch > 0) {
        chunk_at(0, &cr, &ca, &ce, &ckey);
        load_start(0, cr, ca, ce);
    }
    if (myrun >= 0) attn_stage_q<ND, NP>(q, t0 + warp, nh, g, G, myq, lane, 32);
    if (nch > 0) load_finish(0, cr, ca, ce);
    cp_wait<0>();
    __syncthreads();
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    int kp = 0; /* sparse: this token's next key in skey */
    for (int i = 0; i < nch; i++) {
        const int st = i & 1;
        int nr_ = 0, na = 0, ne = 0, nkey = 0;
        const bool more = i + 1 < nch;
        if (more) {
            chunk_at(i + 1, &nr_, &na, &ne, &nkey);
            load_start(st ^ 1, nr_, na, ne);
        }
        /* does this warp's token see chunk i? */
        bool mine = myrun == cr;
        if (mine && sel) {
            const int *sk = skey + warp * topk;
            while (kp < topk && sk[kp] < ckey) kp++;
            mine = kp < topk && sk[kp] == ckey;
        }
        const int n = min(ce, myp + 1) - ca; /* the token's keys of the chunk */
        if (mine && n > 0) {
            const uint16_t *ks = kvs + st * 2 * ACH * DP;
            attn_chunk_mma<ND, NP>(myq, ks, smem_u32(ks + ACH * DP), n, scale, lane, o, m0, m1, l0, l1);
        }
        if (more) load_finish(st ^ 1, nr_, na, ne);
        cp_wait<0>();
        __syncthreads(); /* stage st is free, stage st ^ 1 is loaded */
        cr = nr_; ca = na; ce = ne; ckey = nkey;
    }
    if (myrun < 0) return;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int gr = lane >> 2, tg = lane & 3;
    float *o0 = out + ((size_t)(t0 + warp) * nh + (size_t)g * G + gr) * D + 2 * tg, *o1 = o0 + 8 * (size_t)D;
#pragma unroll
    for (int nt = 0; nt < ND; nt++) {
        if (gr < G) *(float2 *)(o0 + nt * 8) = make_float2(l0 > 0 ? o[nt][0] / l0 : 0.f, l0 > 0 ? o[nt][1] / l0 : 0.f);
        if (gr + 8 < G) *(float2 *)(o1 + nt * 8) = make_float2(l1 > 0 ? o[nt][2] / l1 : 0.f, l1 > 0 ? o[nt][3] / l1 : 0.f);
    }
}

static size_t tile_smem(int D, int tt, int topk, int np) {
    const size_t DP = (size_t)D + 8;
    return sizeof(uint16_t) * ((size_t)tt * np * 16 * DP + (size_t)2 * 2 * ACH * DP) + sizeof(int) * tile_keys_ints(tt, topk, false);
}

template <int TT, int NP>
static void (*tile_fn(int ND))(kvdesc, const int32_t *, const int32_t *, const float *, int, int, const int32_t *, int, int, float *,
                               float) {
    return ND == 4 ? k_attn_tile<4, TT, NP> : ND == 6 ? k_attn_tile<6, TT, NP>
           : ND == 8 ? k_attn_tile<8, TT, NP> : k_attn_tile<16, TT, NP>;
}

/* Whether tiles of tt tokens take T tokens of the step: where the step's runs (c->T tokens,
 * c->n_runs runs) average a tile or more (prefill chunks, verify passes of 8 tokens; not a decode batch with one short chunk beside it: its lone tokens would each hold a CTA's
 * warps in turn) and the tiles fill the GPU's SMs. M3_ATTN_TILE=0: never, 1: every step. */
int m3_cu_attn_tiles_fit(m3_cuda *c, int T, int tt, int nkv) {
    static int on = -2;
    if (on == -2) on = m3_cu_env_int("M3_ATTN_TILE", -1);
    return on == 1 || (on != 0 && (long)c->T >= (long)tt * c->n_runs && (long)cdiv((size_t)T, (size_t)tt) * nkv >= c->sm_count);
}

/* Tokens [t0, t0 + T) of the step, where m3_cu_attn_tiles_fit. */
int m3_cu_attention_tile(m3_cuda *c, const m3_kv *kv, int layer, int t0, int T, const float *q, int nh, const int32_t *sel,
                         int block, int topk, int np, float *out) {
    const int D = kv->D, ND = D / 8, nkv = kv->nkv;
    static int tt = -1; /* M3_ATTN_TILE_TOKENS=8: tiles of 8 tokens */
    if (tt < 0) tt = m3_cu_env_int("M3_ATTN_TILE_TOKENS", 4) == 8 ? 8 : 4;
    if (!m3_cu_attn_tiles_fit(c, T, tt, nkv)) return 1;
    /* the shapes it takes: G <= 16, D of 4 / 6 / 8 / 16 column tiles; keys (run << 24 | block) need
     * blocks below 2^24; the tile's sort of its TT x topk keys is quadratic: topk <= 64 (M3: 16) */
    if (!(ND == 4 || ND == 6 || ND == 8 || ND == 16) || nh / nkv > 16) return 1;
    if (sel && (topk < 1 || topk > 64 || block < 1 || c->max_pos / block >= (1 << 24))) return 1;
    const size_t sm = tile_smem(D, tt, sel ? topk : 0, np);
    if (sm > c->smem_optin) return 1;
    void (*fn)(kvdesc, const int32_t *, const int32_t *, const float *, int, int, const int32_t *, int, int, float *, float) =
        np == 1 ? (tt == 8 ? tile_fn<8, 1>(ND) : tile_fn<4, 1>(ND)) : (tt == 8 ? tile_fn<8, 3>(ND) : tile_fn<4, 3>(ND));
    if (sm > 48 * 1024) cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    const size_t qo = (size_t)t0 * nh * D; /* tokens [t0, t0 + T) of the step */
    fn<<<dim3((unsigned)cdiv((size_t)T, (size_t)tt), nkv), tt * 32, sm, c->st>>>(desc(c, kv, layer), c->d_pos + t0, c->d_seq + t0, q + qo,
                                                                                 nh, T, sel ? sel + (size_t)t0 * nkv * topk : NULL, block,
                                                                                 sel ? topk : 0, out + qo, 1.0f / sqrtf((float)D));
    return CK_LAUNCH(c, "attention (token tiles)") ? -1 : 0;
}
