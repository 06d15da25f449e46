/* Prefill attention on the warpgroup MMA (wgmma, sm_90a): precision bf16; bf16, FP8 and NVFP4 caches.
 * CPU reference: src/backend/cpu/attention.c (m3_cpu_attention at precision bf16).
 *
 * What it computes is attn_mma.cuh's precision-bf16 definition: q and K, V as bf16, scores in
 * log2 units s2 = (q . k) * (log2 e / sqrt(D)) in f32, an integer running max M, each probability
 * P = bf16(2^(s2 - M)) and out = sum P v / sum P (the sums of the rounded P in f32). The token
 * tiles of attention_tile.cu compute the same on mma.sync; there a CTA of 4 warps walks 32-key
 * chunks with a CTA barrier at each (H100: ~110 TF/s at a 4096-token prefill, 11% of the bf16
 * peak; docs/PERF.md session 39). Here:
 *
 * CTA: 8 tokens of one KV group (attn_keys.cuh: their runs, the union of their blocks), two
 * consumer warpgroups of 4 tokens each and one producer warpgroup. A consumer warpgroup's 64
 * MMA rows are its 4 tokens x 16 query heads (warp w: token w, rows the group's heads; rows past
 * G are zero queries and are not written), so the wgmma's M is a warp's token, as in the tiles.
 *
 * Pipeline: NS stages of one 64-key chunk each: K and V as D / 64 column slabs of [64 keys][128
 * bytes] in the 128-byte swizzle. A whole bf16 chunk (64 keys of one page) comes by bulk tensor
 * copies: one producer thread issues its K and V slabs from a tensor map of the layer's pages (the
 * swizzle is the map's) and the stage's full barrier counts their bytes. A partial one (a run's last
 * keys) the producers copy with cp.async (16 bytes a thread, from whatever page each key lies in;
 * rows past the chunk's end zero-filled, so V holds no stale values that a zero probability could
 * turn into NaN) and arrive as their copies land (cp.async.mbarrier.arrive.noinc); FP8 / NVFP4
 * rows they load as words, decode to bf16 (exact) and store, fence for the async proxy and arrive.
 * FP8 / NVFP4 whole chunks (in one page): one producer thread brings each chunk's raw K and V rows
 * into one of 3 raw stages by bulk copies three chunks ahead, and the producers decode from there
 * (rows past the chunk's end as zero codes); M3_ATTN_WG_QBULK=0: the word loads for those too.
 * A consumer warpgroup waits for the stage, fences the generic proxy's writes for the async proxy,
 * and runs:
 *   S = Q K^T: D / 16 wgmma m64n64k16, Q from registers (bf16, loaded once), K K-major;
 *   the online softmax in registers (masked per warp: the token's selected blocks, its position);
 *   O += P V: 4 wgmma m64nDk16, P from registers (the S accumulators' layout is the A fragment
 *   layout), V MN-major (the transposed-B form: V rows as cached);
 * then each warp's lane 0 arrives on the stage's empty barrier. The consumer warpgroups share the
 * stages and overlap one another's softmax with MMA. A chunk no token of a warpgroup sees is skipped
 * by it (a warpgroup-uniform test). Both sides step through the tile's chunks by counters
 * (attn_keys.cuh's tile_walk: no division in the loop).
 *
 * H100, 8 layers, 4096-token prefill (docs/PERF.md, session 47): attention 10.9 ms against the
 * token tiles' 15.6 (bf16 cache), 14.3 against 17.0 (FP8); the bulk copies 9.05 against cp.async's
 * 10.20. Session 48 (the counters' walk, O's rescale skipped where no max moved): bf16 8.06 ms, FP8
 * 13.44 by word loads, 11.48 by raw bulk copies. Measured and removed: P V overlapped with the next chunk's softmax (11.3 ms), 4 tokens a
 * CTA (15.6), 16 FP8 words in flight a producer (docs/logs/s47/wg-variants.diff, PERF.md).
 * M3_ATTN_WG=0 turns it off (the token tiles take the step); M3_ATTN_WG_TMA=0: cp.async only. */
#include <math.h>

#include "attn_keys.cuh"
#include "backend/attn_wg_layout.h"
#include "attn_mma.cuh"
#include "kv.cuh"
#include "ptx.cuh"
#include "tmap.cuh"
#include "wgmma.cuh"

namespace {

constexpr int WCH = M3_WG_CH, SLAB = M3_WG_SLAB; /* keys a chunk, bytes a 64-column slab (attn_wg_layout.h) */
constexpr int WG_SMEM_MAX = 232448;

/* a raw stage (FP8 / NVFP4 rows of rb bytes: a chunk's K, then its V), 128-byte multiples */
__host__ __device__ constexpr uint32_t wg_raw_bytes(int rb) { return (2u * WCH * (uint32_t)rb + 127u) & ~127u; }
/* the stages: shared memory of one (K and V of a 64-key chunk), and how many fit beside the tables */
__host__ __device__ constexpr int wg_stage_bytes(int D) { return 2 * (D / 64) * SLAB; }
static int wg_stages(int D, size_t table_bytes, size_t optin) {
    const long n = ((long)(optin < WG_SMEM_MAX ? optin : WG_SMEM_MAX) - 1024 - 256 - (long)table_bytes) / wg_stage_bytes(D);
    return n > 6 ? 6 : (int)n;
}
/* registers moved by setmaxnreg (384 threads: 168 each at launch) */
constexpr int WG_LAUNCH_REGS = 168, WG_PROD_REGS = 88, WG_CONS_REGS = 208;
static_assert(128 * WG_PROD_REGS + 256 * WG_CONS_REGS == 384 * WG_LAUNCH_REGS && WG_LAUNCH_REGS == 65536 / 384 / 8 * 8,
              "setmaxnreg: the CTA's registers");

constexpr int WG_TT = 8, WG_NT = 384; /* tokens a CTA; threads: 2 consumer warpgroups and a producer one */

template <int ND>
__global__ void __launch_bounds__(WG_NT, 1)
    k_attn_wg(kvdesc d, const int32_t *pos, const int32_t *seq, const float *q, int nh, int T, const int32_t *sel, int B, int topk,
              int ns, float *out, float scale, const __grid_constant__ CUtensorMap kvmap, int tma, int nr) {
    pdl_trigger();
    constexpr int D = ND * 8, TT = WG_TT, NT = WG_NT, SB = wg_stage_bytes(D);
    extern __shared__ __align__(1024) uint8_t wsm[];
    /* the stages first, 1024-aligned for the swizzle; then nr raw stages (FP8 / NVFP4 by bulk copies:
     * a chunk's K rows then its V rows as cached, rb apiece), the barriers and the key tables */
    const uint32_t base = (smem_u32(wsm) + 1023u) & ~1023u;
    uint8_t *gen = wsm + (base - smem_u32(wsm));
    const uint32_t RB = wg_raw_bytes((int)d.rb), raw = base + (uint32_t)ns * SB;
    const uint32_t bars = raw + (uint32_t)nr * RB; /* full[ns], empty[ns], raw full[nr] */
    const tile_keys tk = tile_keys_at((int *)(gen + (bars - base) + 256), TT, topk, true);
    const int g = blockIdx.y, t0 = blockIdx.x * TT, tid = threadIdx.x;
    const int G = nh / d.nkv, cpb = (B + WCH - 1) / WCH;
    if (tid == 0) {
        for (int s = 0; s < ns; s++) {
            mb_init(bars + 8 * s, 128);
            mb_init(bars + 8 * (ns + s), 8);
        }
        for (int s = 0; s < nr; s++) mb_init(bars + 8 * (2 * ns + s), 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); /* for the bulk copies' completions */
    }
    tile_keys_build<TT>(tk, pos, seq, sel, t0, T, g, d.nkv, topk, WCH, cpb, tid, NT); /* ends in __syncthreads */
    const int nch = tk.nch[0];
    const bool sparse = sel != NULL;
    if (tid < 128) {
        /* ---- producers */
        regs_dec<WG_PROD_REGS>();
        /* nr > 0 (FP8 / NVFP4, chunks in one page): thread 0 brings chunk i's raw rows into raw stage i % nr
         * by bulk copies nr chunks ahead (walker wr), the producers decode them from there */
        tile_walk wr = {0, 0};
        auto issue_raw = [&](int rs) {
            int r, a, e, um;
            tile_walk_at(tk, sparse, wr, B, WCH, &r, &a, &e, &um);
            const uint32_t bar = bars + 8 * (2 * ns + rs), dst = raw + (uint32_t)rs * RB, half = WCH * (uint32_t)d.rb;
            if (e <= a) { /* no key: nothing to copy (its page may not exist) */
                mb_arrive(bar);
                return;
            }
            const uint8_t *src = (const uint8_t *)page_of(d, tk.rseq[r], a) + ((size_t)g * d.page + a % d.page) * d.rb;
            mb_expect_tx(bar, 2 * half);
            bulk_g2s(dst, src, half, bar);
            bulk_g2s(dst + half, src + d.kvpart, half, bar);
        };
        if (nr) {
            for (int j = 0; j < nr && j < nch; j++, tile_walk_next(tk, sparse, cpb, wr))
                if (tid == 0) issue_raw(j);
        }
        /* chunk i in stage st = i % ns, of round ph = (i / ns) & 1; raw stage rs = i % nr, of round rph
         * (counted: ns and nr are not constants) */
        tile_walk wk = {0, 0};
        for (int i = 0, st = 0, ph = 0, rs = 0, rph = 0; i < nch;
             i++, st = st + 1 == ns ? 0 : st + 1, ph ^= st == 0, tile_walk_next(tk, sparse, cpb, wk)) {
            if (i >= ns) mb_wait(bars + 8 * (ns + st), ph ^ 1);
            int r, a, e, um;
            tile_walk_at(tk, sparse, wk, B, WCH, &r, &a, &e, &um);
            const int n = e - a, s = tk.rseq[r];
            const uint32_t ks = base + (uint32_t)st * SB, vs = ks + (D / 64) * SLAB;
            if (tma && n == WCH) {
                /* bf16, a whole chunk (in one page: the host asks pages and blocks of multiples of 64 keys): its
                 * K and V slabs by bulk tensor copies from one thread (the 128-byte swizzle is the map's), the
                 * others arriving. A partial chunk takes the copies below, whose zero fill keeps stale rows out. */
                if (tid == 0) {
                    const int pgi = d.ptab[(size_t)s * d.stride + a / d.page], row = g * d.page + a % d.page;
                    mb_expect_tx(bars + 8 * st, SB);
#pragma unroll
                    for (int sl = 0; sl < D / 64; sl++) {
                        tma_4d(ks + sl * SLAB, &kvmap, 64 * sl, row, 0, pgi, bars + 8 * st);
                        tma_4d(vs + sl * SLAB, &kvmap, 64 * sl, row, 1, pgi, bars + 8 * st);
                    }
                } else {
                    mb_arrive(bars + 8 * st);
                }
                continue;
            }
            if (nr) {
                /* FP8 / NVFP4 from the raw stage: rows past n decode as zero codes */
                const bool nv = d.dt == M3_KV_NVFP4;
                mb_wait(bars + 8 * (2 * ns + rs), rph);
                const uint8_t *rk = gen + (raw - base) + (size_t)rs * RB;
#pragma unroll 4
                for (int k = tid; k < WCH * ND; k += 128) {
                    const int j = k / ND, x = k % ND;
                    uint2 pk = make_uint2(0, 0), pv = make_uint2(0, 0);
                    if (j < n) piece_load(nv, rk + (size_t)j * d.rb, (size_t)WCH * d.rb, D, 8 * x, &pk, &pv);
                    const size_t o = m3_wg_off(j, x);
                    *(uint4 *)(gen + (ks - base) + o) = piece_bf16(nv, pk);
                    *(uint4 *)(gen + (vs - base) + o) = piece_bf16(nv, pv);
                }
                fence_proxy_async();
                mb_arrive(bars + 8 * st);
                asm volatile("bar.sync 1, 128;\n" ::: "memory"); /* every producer is done with raw stage rs */
                if (i + nr < nch && tid == 0) {
                    fence_proxy_async(); /* the producers' reads of the stage before the copy's writes */
                    issue_raw(rs);
                }
                if (i + nr < nch) tile_walk_next(tk, sparse, cpb, wr);
                if (++rs == nr) {
                    rs = 0;
                    rph ^= 1;
                }
                continue;
            }
            /* the chunk's first row where it lies in one page (always where pages hold a multiple of 64 keys) */
            const uint8_t *pg = n > 0 && a / d.page == (e - 1) / d.page
                                    ? (const uint8_t *)page_of(d, s, a) + ((size_t)g * d.page + a % d.page) * d.rb
                                    : NULL;
            auto row_of = [&](int j) { /* key j's K row (its V row kvpart bytes further) */
                return pg ? pg + (size_t)j * d.rb : (const uint8_t *)page_of(d, s, a + j) + ((size_t)g * d.page + (a + j) % d.page) * d.rb;
            };
            if (d.dt == M3_KV_BF16) {
#pragma unroll
                for (int k = tid; k < WCH * ND; k += 128) {
                    const int j = k / ND, x = k % ND; /* key j, 16-byte piece x of its row */
                    const uint32_t o = m3_wg_off(j, x);
                    const bool in = j < n;
                    const uint8_t *row = in ? row_of(j) + 16 * x : d.base;
                    cp_async16_z(ks + o, row, in);
                    cp_async16_z(vs + o, in ? row + d.kvpart : row, in);
                }
                mb_arrive_cp(bars + 8 * st);
            } else {
                /* FP8 / NVFP4: word loads of PB pieces in flight, converted to bf16 (exact) and stored, then
                 * the stores fenced for the wgmmas' async proxy before the arrival; zero codes past n decode to 0 */
                constexpr int PB = 4, NPT = WCH * ND / 128; /* pieces a thread: 8 (D 128), 4 (D 64) */
                const bool nv = d.dt == M3_KV_NVFP4;
#pragma unroll 1
                for (int b0 = 0; b0 < NPT; b0 += PB) {
                    uint2 rk[PB], rv[PB];
#pragma unroll
                    for (int u = 0; u < PB; u++) {
                        const int k = tid + 128 * (b0 + u), j = k / ND, x = k % ND;
                        rk[u] = rv[u] = make_uint2(0, 0);
                        if (j < n) piece_load(nv, row_of(j), d.kvpart, D, 8 * x, &rk[u], &rv[u]);
                    }
#pragma unroll
                    for (int u = 0; u < PB; u++) {
                        const int k = tid + 128 * (b0 + u), j = k / ND, x = k % ND;
                        const size_t o = m3_wg_off(j, x);
                        *(uint4 *)(gen + (ks - base) + o) = piece_bf16(nv, rk[u]);
                        *(uint4 *)(gen + (vs - base) + o) = piece_bf16(nv, rv[u]);
                    }
                }
                fence_proxy_async();
                mb_arrive(bars + 8 * st);
            }
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory"); /* no copy outlives its thread */
        return;
    }
    /* ---- consumers: warpgroup wg, warp w of it (token tw = 4 wg + w), lane (gr, tg) */
    regs_inc<WG_CONS_REGS>();
    const int wg = (tid >> 7) - 1, w = (tid >> 5) & 3, lane = tid & 31, gr = lane >> 2, tg = lane & 3;
    const int tw = 4 * wg + w, myrun = tk.trun[tw], myp = tk.tpos[tw];
    /* Q's A fragments (rows gr, gr + 8 = heads; bf16), D / 16 k16 steps */
    uint32_t qa[ND / 2][4];
    {
        const size_t q0 = ((size_t)(t0 + tw) * nh + (size_t)g * G) * D;
#pragma unroll
        for (int kk = 0; kk < ND / 2; kk++)
#pragma unroll
            for (int h = 0; h < 4; h++) {
                const int row = gr + 8 * (h & 1), col = 16 * kk + 8 * (h >> 1) + 2 * tg;
                float2 v = make_float2(0.f, 0.f);
                if (myrun >= 0 && row < G) v = *(const float2 *)(q + q0 + (size_t)row * D + col);
                qa[kk][h] = bf2(v.x, v.y);
            }
    }
    float o[ND * 4];
#pragma unroll
    for (int i = 0; i < ND * 4; i++) o[i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const float sl = scale * M3_LOG2E_F;
    int wrun[4], wpos[4]; /* the warpgroup's tokens: runs, positions */
#pragma unroll
    for (int u = 0; u < 4; u++) {
        wrun[u] = tk.trun[4 * wg + u];
        wpos[u] = tk.tpos[4 * wg + u];
    }
    tile_walk wk = {0, 0};
    for (int i = 0, st = 0, ph = 0; i < nch; i++, st = st + 1 == ns ? 0 : st + 1, ph ^= st == 0, tile_walk_next(tk, sparse, cpb, wk)) {
        int r, a, e, um;
        tile_walk_at(tk, sparse, wk, B, WCH, &r, &a, &e, &um);
        /* the warpgroup's tokens that see chunk i: their run's, their selection's, from its first key */
        bool any = false, mine = false;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const bool sees = wrun[u] == r && wpos[u] >= a && ((um >> (4 * wg + u)) & 1);
            any |= sees;
            if (u == w) mine = sees;
        }
        mb_wait(bars + 8 * st, ph);
        if (!any) {
            if (lane == 0) mb_arrive(bars + 8 * (ns + st));
            continue;
        }
        fence_proxy_async();
        /* the descriptors before any wgmma of a batch is issued (one defined between two wgmmas of a
         * batch serializes them, C7513) */
        const uint32_t ks = base + (uint32_t)st * SB, vs = ks + (D / 64) * SLAB;
        uint64_t dk[ND / 2], vd[4];
#pragma unroll
        for (int kk = 0; kk < ND / 2; kk++) dk[kk] = m3_wg_desc_k_step(ks, kk);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) vd[kk] = m3_wg_desc_v_step(vs, kk); /* keys 16 kk ..: 16 rows of 128 bytes */
        float s[32];
        wg_fence();
        wgmma_n64_first(s, qa[0], dk[0]);
#pragma unroll
        for (int kk = 1; kk < ND / 2; kk++) wgmma_n64(s, qa[kk], dk[kk]);
        wg_commit();
        wg_wait<0>();
        /* softmax of rows gr (s[4j], s[4j + 1]) and gr + 8 (s[4j + 2], s[4j + 3]); key 8j + 2tg + (i & 1) */
        const int lim = mine ? min(e - 1, myp) - a : -1; /* keys 0..lim of the chunk */
        float sv[32]; /* scores in log2 units, -inf where masked (s stays the wgmma's alone) */
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int h = 0; h < 4; h++) {
                const int c = 8 * j + 2 * tg + (h & 1);
                const float v = c <= lim ? s[4 * j + h] * sl : -INFINITY;
                sv[4 * j + h] = v;
                if (h < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, ceilf(mx0)), n1 = fmaxf(m1, ceilf(mx1));
        /* exact powers of two (0 on a row's first keys); a row with no key yet keeps 0 */
        const float c0 = m3_pow2_int(m0 - n0), c1 = m3_pow2_int(m1 - n1);
        const float b0 = n0 == -INFINITY ? 0.f : n0, b1 = n1 == -INFINITY ? 0.f : n1;
        m0 = n0;
        m1 = n1;
        l0 *= c0;
        l1 *= c1;
        uint32_t pa[4][4]; /* P's A fragments, k16 steps of 16 keys */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t p0 = bf2(exp2f(sv[4 * j] - b0), exp2f(sv[4 * j + 1] - b0));
            const uint32_t p1 = bf2(exp2f(sv[4 * j + 2] - b1), exp2f(sv[4 * j + 3] - b1));
            l0 += __uint_as_float(p0 << 16) + __uint_as_float(p0 & 0xffff0000u);
            l1 += __uint_as_float(p1 << 16) + __uint_as_float(p1 & 0xffff0000u);
            pa[j >> 1][2 * (j & 1)] = p0;
            pa[j >> 1][2 * (j & 1) + 1] = p1;
        }
        if (!__all_sync(0xffffffffu, c0 == 1.f && c1 == 1.f)) /* the warp's rows' max moved (rarely: integer maxima) */
#pragma unroll
            for (int j = 0; j < ND; j++) {
                o[4 * j] *= c0;
                o[4 * j + 1] *= c0;
                o[4 * j + 2] *= c1;
                o[4 * j + 3] *= c1;
            }
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if constexpr (ND == 16) wgmma_n128<1>(o, pa[kk], vd[kk]);
            else wgmma_n64<1>(o, pa[kk], vd[kk]);
        }
        wg_commit();
        wg_wait<0>();
        if (lane == 0) mb_arrive(bars + 8 * (ns + st));
    }
    if (myrun < 0) return;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    float *o0 = out + ((size_t)(t0 + tw) * nh + (size_t)g * G + gr) * D + 2 * tg, *o1 = o0 + 8 * (size_t)D;
    const float i0 = l0 > 0 ? 1.f / l0 : 0.f, i1 = l1 > 0 ? 1.f / l1 : 0.f;
#pragma unroll
    for (int j = 0; j < ND; j++) {
        if (gr < G) *(float2 *)(o0 + 8 * j) = make_float2(o[4 * j] * i0, o[4 * j + 1] * i0);
        if (gr + 8 < G) *(float2 *)(o1 + 8 * j) = make_float2(o[4 * j + 2] * i1, o[4 * j + 3] * i1);
    }
}

} /* namespace */

/* Tokens [t0, t0 + T) of the step at precision bf16 (np 1), bf16 / FP8 / NVFP4 caches: 0 done, 1 not
 * taken (another shape, dtype or precision, or too few tokens to fill the SMs: the caller falls
 * back to the token tiles), -1 failed (recorded). */
int m3_cu_attention_wg(m3_cuda *c, const m3_kv *kv, int layer, int t0, int T, const float *q, int nh, const int32_t *sel, int block,
                       int topk, int np, float *out) {
    const int D = kv->D, nkv = kv->nkv;
    static int on = -1; /* M3_ATTN_WG=0: off (the token tiles take the step) */
    if (on < 0) on = m3_cu_env_int("M3_ATTN_WG", 1) != 0;
    static int tma_on = -1; /* M3_ATTN_WG_TMA=0: bf16 chunks by cp.async only, not bulk tensor copies */
    if (tma_on < 0) tma_on = m3_cu_env_int("M3_ATTN_WG_TMA", 1) != 0;
    if (!on || np != 1 || !(kv->dt == M3_KV_BF16 || kv->dt == M3_KV_FP8 || kv->dt == M3_KV_NVFP4) || !(D == 64 || D == 128) ||
        nh / nkv > 16 || nh % nkv)
        return 1;
    if (!m3_cu_attn_tiles_fit(c, T, WG_TT, nkv)) return 1;
    if (sel && (topk < 1 || topk > 64 || block < 1 || c->max_pos / block >= (1 << 24))) return 1;
    const kvdesc dd = desc(c, kv, layer);
    /* aligned for the producers' loads: 16-byte copies (bf16), 8-byte (FP8) and 4-byte (NVFP4) words */
    const size_t al = dd.rb | dd.kvpart | dd.page_bytes | (uintptr_t)dd.base;
    if ((al & (kv->dt == M3_KV_BF16 ? 15 : kv->dt == M3_KV_FP8 ? 7 : 3)) != 0) return 1;
    const size_t tables = sizeof(int) * tile_keys_ints(WG_TT, sel ? topk : 0, true);
    /* FP8 / NVFP4 chunks by bulk copies of their raw rows (H100, case 7: FP8 407.6 -> 337.4 us, NVFP4
     * 497.4 -> 419.1; M3_ATTN_WG_QBULK=0: word loads) */
    static int qb_on = -1;
    if (qb_on < 0) qb_on = m3_cu_env_int("M3_ATTN_WG_QBULK", 1) != 0;
    /* whole chunks lie in one page (pages and blocks of multiples of 64 keys) and start 16-byte aligned:
     * where bulk copies can bring them (64 rows: a multiple of 16 bytes at any rb) */
    const bool whole = dd.page % WCH == 0 && (!sel || block % WCH == 0) && !((uintptr_t)dd.base & 15) && (dd.kvpart | dd.page_bytes) % 16 == 0;
    const int nr = qb_on && kv->dt != M3_KV_BF16 && whole ? 3 : 0;
    const size_t rawb = (size_t)nr * wg_raw_bytes((int)dd.rb);
    const int ns = wg_stages(D, tables + rawb, c->smem_optin);
    if (ns < 2) return 1;
    const size_t sm = 1024 + (size_t)ns * wg_stage_bytes(D) + rawb + 256 + tables;
    /* bf16 pages as a tensor map: {D values, nkv x page rows (stride rb), K / V (kvpart), pages (page_bytes)},
     * boxes of 64 x 64 in the 128-byte swizzle (strides of 16-byte multiples) */
    CUtensorMap kvmap;
    memset(&kvmap, 0, sizeof kvmap);
    int tma = 0;
    if (tma_on && kv->dt == M3_KV_BF16 && whole && dd.rb % 16 == 0) {
        const PFN_cuTensorMapEncodeTiled_v12000 enc = m3_cu_encode_tiled();
        const cuuint64_t dim[4] = {(cuuint64_t)D, (cuuint64_t)nkv * dd.page, 2, (cuuint64_t)kv->n_pages};
        const cuuint64_t stride[3] = {(cuuint64_t)dd.rb, (cuuint64_t)dd.kvpart, (cuuint64_t)dd.page_bytes};
        const cuuint32_t box[4] = {64, WCH, 1, 1}, es[4] = {1, 1, 1, 1};
        tma = enc && enc(&kvmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, dd.base, dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    }
    void (*fn)(kvdesc, const int32_t *, const int32_t *, const float *, int, int, const int32_t *, int, int, int, float *, float,
               const CUtensorMap, int, int) =
        D == 128 ? k_attn_wg<16> : k_attn_wg<8>;
    { /* setmaxnreg balances 168 registers a thread exactly: with fewer, the consumers would wait forever */
        cudaFuncAttributes fa;
        const cudaError_t e = cudaFuncGetAttributes(&fa, fn);
        if (e != cudaSuccess) {
            m3_cu_failf(c, "attention (wgmma tiles): kernel attributes: %s", cudaGetErrorString(e));
            return -1;
        }
        if (fa.numRegs != WG_LAUNCH_REGS) {
            m3_cu_failf(c, "attention (wgmma tiles): the kernel was built with %d registers a thread, not 168 (setmaxnreg would not balance)",
                        fa.numRegs);
            return -1;
        }
    }
    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    const size_t qo = (size_t)t0 * nh * D;
    fn<<<dim3((unsigned)cdiv((size_t)T, (size_t)WG_TT), nkv), WG_NT, sm, c->st>>>(
        dd, c->d_pos + t0, c->d_seq + t0, q + qo, nh, T, sel ? sel + (size_t)t0 * nkv * topk : NULL, block, sel ? topk : 0, ns, out + qo,
        1.0f / sqrtf((float)D), kvmap, tma, nr);
    return CK_LAUNCH(c, "attention (wgmma tiles)") ? -1 : 0;
}
