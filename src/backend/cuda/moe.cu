/* The dense MLP and the MoE experts on the GPU: expert dispatch (per slot, grouped by expert,
 * or grouped on the host), SwiGLU-OAI and the weighted combine (+ the shared expert).
 * CPU reference: src/backend/cpu/moe.c (m3_cpu_moe, m3_cpu_mlp).
 *
 * Which path (the routing is always the router GEMV + a warp per token picking the top-k:
 * sigmoid + bias, lowest index on ties, as the CPU):
 * - precision bf16, 9-512 tokens: the few-slot grouped kernels of gemm_ft.cu (moe_ft below);
 *   more tokens (from 128 when gemm_ft does not take the experts): the grouped wgmma GEMMs of
 *   gemm_tc.cu (moe_tc). Both lay the slots out by expert on the GPU; no host synchronization.
 * - otherwise, up to 256 tokens: one launch computes gate+up of every (token,
 *   expert) slot - for 2 or more tokens every picked expert once for up to 4 of its tokens
 *   (m3_cu_moe_grouped, on the tensor-core GEMV of linear_mma.cu) - reading the rows straight
 *   from the device expert table, SwiGLU, one launch the down projections, one the weighted sum;
 *   batches in chunks of 64.
 * - otherwise (prefill chunks in exact precision): the picks go to the host, tokens are grouped
 *   per expert (ascending expert order per token, as the CPU adds them) and each expert runs as
 *   a linear. */
#include <stdlib.h>
#include <string.h>

#include "backend/gemm_tiles.h"
#include "gemm_tc.h"
#include "linear_mma.cuh"
#include "linear_simt.cuh"
#include "router.cuh"

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
    m3_cu_swiglu(c, g, u, (size_t)T * F, alpha, limit, g, T <= m3_cu_xsplit_rows());
    m3_cu_linear(c, &m->down, g, T, out);
    m3_cu_prof_end(c, OP_MLP);
}

/* gate + up + SwiGLU-OAI of every (token, expert) slot: blockIdx.y = slot; each warp two
 * intermediate rows j, j+1 (4 weight rows: gate j, j+1, up j, j+1) */
template <int F>
__global__ void __launch_bounds__(GW * 32) k_moe_gate_up_swiglu_simt(const m3_mlp_w *table, const int32_t *pick, int K, const float *x,
                                                          int H, int Fd, float alpha, float limit, float *h, int KT,
                                                          int rb) {
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
                const float hv = swiglu_oai(v[r], v[2 + r], alpha, limit);
                h[(size_t)slot * Fd + j0 + r] = round_bf16_if(hv, rb); /* the down GEMM's input */
            }
}

/* down projection of every slot: ye[slot][H] = down_e . h[slot] */
template <int F>
__global__ void __launch_bounds__(GW * 32) k_moe_down_simt(const m3_mlp_w *table, const int32_t *pick, const float *h, int Fd,
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
__global__ void k_moe_swiglu_split(const float *gu, int S, int Fd, float alpha, float limit, float *h, uint16_t *xs, int rb) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    size_t n = (size_t)S * Fd;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t s = i / Fd, j = i % Fd;
        const float v = swiglu_oai(gu[(s * 2) * Fd + j], gu[(s * 2 + 1) * Fd + j], alpha, limit);
        h[i] = v;
        split_store(v, xs + i, xs + n + i, rb);
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

__global__ void k_moe_gather_rows(const float *x, const int32_t *rows, int n, int H, float *xe) {
    int i = blockIdx.y;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < H; k += gridDim.x * blockDim.x)
        xe[(size_t)i * H + k] = x[(size_t)rows[i] * H + k];
}
__global__ void k_moe_scatter_add(float *out, const int32_t *rows, const float *w, int n, int H, const float *ye) {
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

/* ------------------------------------------------------------------ MoE as grouped GEMMs */

/* The slots' layout for the grouped GEMMs (DeepGEMM's "contiguous layout"): the S = T * K
 * (token, expert) slots sorted by expert into staged rows, each expert's rows contiguous from
 * off[e] and padded to unit (the tile bn, or 64 with rest tiles: gemm_tc.h). One block: counts
 * (shared atomics), the padded prefix sums, then each slot takes the next row of its expert.
 * map[r]: the token of staged row r, rowmap[r] its slot (t K + k), both -1 for padding; tiles:
 * the full tiles of bn rows (maxa places), then the rest tiles of 64, 128 and 192 rows (maxr[0..2]
 * places; an expert's rows past its full tiles, gemm_tiles.h), each {first row, expert}, in
 * expert order; cnt[0]: the groups of 64 rows in use (staging), cnt[1] the full tiles, cnt[2 + c]
 * the rest tiles of 64 (c + 1) rows. The order of an expert's rows follows the atomics (not fixed),
 * but no result depends on it: each row's sums are computed alone and land at its slot. */
struct moe_rest_caps {
    int n[3];
};
__global__ void __launch_bounds__(1024) k_moe_tc_layout(const int32_t *pick, int S, int K, int E, int bn, int unit, int maxa,
                                                        moe_rest_caps maxr, int fat, int *map, int *rowmap, int *tiles, int *cnt) {
    extern __shared__ int lsm[];
    int *num = lsm, *off = lsm + E, *fill = off + E + 1, *toff = fill + E, *roff = toff + E + 1;
    for (int e = threadIdx.x; e < E; e += blockDim.x) num[e] = fill[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const int e = pick[s];
        if (e >= 0 && e < E) atomicAdd(&num[e], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* prefix sums of the padded rows and the full tiles, a warp scan per 32 experts
                             * (the rest tiles, one an expert at most, numbered per size by ballots) */
        int base = 0, tbase = 0, rbase[3] = {0, 0, 0};
        const unsigned lt = (1u << threadIdx.x) - 1;
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int e = e0 + threadIdx.x;
            const int v = e < E ? (num[e] + unit - 1) / unit * unit : 0;
            const m3_moe_tiles mt = m3_moe_expert_tiles(v, bn, unit, fat);
            const int tv = mt.full, rc = mt.rest / 64 - 1; /* rc: the rest's list, -1 for none */
            int inc = v, tinc = tv, ridx = -1;
            for (int d = 1; d < 32; d *= 2) {
                const int o = __shfl_up_sync(0xffffffffu, inc, d), to = __shfl_up_sync(0xffffffffu, tinc, d);
                if ((int)threadIdx.x >= d) {
                    inc += o;
                    tinc += to;
                }
            }
#pragma unroll
            for (int c = 0; c < 3; c++) {
                const unsigned m = __ballot_sync(0xffffffffu, rc == c);
                if (rc == c) ridx = rbase[c] + __popc(m & lt);
                rbase[c] += __popc(m);
            }
            if (e < E) {
                off[e] = base + inc - v;
                toff[e] = tbase + tinc - tv;
                roff[e] = ridx;
            }
            base += __shfl_sync(0xffffffffu, inc, 31);
            tbase += __shfl_sync(0xffffffffu, tinc, 31);
        }
        if (threadIdx.x == 0) {
            off[E] = base;
            cnt[0] = (base + 63) / 64;
            cnt[1] = tbase;
            for (int c = 0; c < 3; c++) cnt[2 + c] = rbase[c];
        }
    }
    __syncthreads();
    const int used = off[E];
    for (int r = threadIdx.x; r < (used + 63) / 64 * 64; r += blockDim.x) map[r] = rowmap[r] = -1;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const int v = off[e + 1] - off[e];
        const m3_moe_tiles mt = m3_moe_expert_tiles(v, bn, unit, fat);
        for (int i = 0; i < mt.full; i++) {
            tiles[2 * (toff[e] + i)] = off[e] + bn * i;
            tiles[2 * (toff[e] + i) + 1] = e;
        }
        if (mt.rest) { /* the rows past the full tiles, one tile in the list of its size */
            const int rc = mt.rest / 64 - 1;
            int at = maxa + roff[e];
            for (int c = 0; c < rc; c++) at += maxr.n[c];
            tiles[2 * at] = off[e] + bn * mt.full;
            tiles[2 * at + 1] = e;
        }
    }
    __syncthreads();
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const int e = pick[s];
        if (e < 0 || e >= E) continue;
        const int r = off[e] + atomicAdd(&fill[e], 1);
        map[r] = s / K;
        rowmap[r] = s;
    }
}

/* precision bf16, T >= M3_MOE_TC_MIN tokens (default 128; H200, M3.1-Flash shapes: ~3.4-4.0 ms a
 * layer up to 256 tokens, where the GEMV path takes ~2.1 ms per 64): the routed experts as two grouped
 * GEMMs on the wgmma kernel (gemm_tc.cu) - gate + up of every expert with SwiGLU-OAI in one
 * launch, down in a second - over the slots laid out by k_moe_tc_layout; x and h rounded to
 * bf16 (staged), f32 sums. The shared expert on the same GEMM (gemm_tc per matrix), then the
 * weighted sum in each token's ascending expert order + the shared expert (k_moe_combine, as the
 * CPU adds them). No host synchronization. 1 when done (or failed), 0 when not taken. */
static int moe_tc(m3_cuda *c, const m3_layer_w *L, const float *x, const float *xr, int T, int E, int K, float routed_scale,
                  float alpha, float limit, float *out, moe_post *post) {
    const m3_mlp_w *e0 = &L->experts[0];
    if (!c->gemm_bf16 || !L->backend || E < 1 || E > 2048 || !m3_cu_gemm_tc_moe_ok(e0)) return 0;
    if (m3_cu_env_int("M3_MOE_TC", 1) == 0 || T < m3_cu_env_int("M3_MOE_TC_MIN", 128)) return 0;
    /* expert parallel: every expert here, in one format and shape, and each taken (tiled: the upload
     * keeps a matrix with E8M0 codes 0 / 255 row-major, per matrix) */
    /* e0m: expert 0's shapes and formats, its scale_max the largest of every expert's matrices (0 if
     * any is unknown): the grouped GEMMs expand one way for all (gemm_tc.cu, FMT_MXB) */
    m3_mlp_w e0m = *e0;
    int smax = 0, sunknown = 0;
    for (int e = 0; e < E; e++) {
        const m3_mlp_w *m = &L->experts[e];
        if (!m->gate.w || m->gate.fmt != e0->gate.fmt || m->down.N != e0->down.N || m->gate.N != e0->gate.N ||
            !m3_cu_gemm_tc_moe_ok(m))
            return 0;
        const int sm[3] = {m->gate.scale_max, m->up.scale_max, m->down.scale_max};
        for (int j = 0; j < 3; j++) {
            smax = sm[j] > smax ? sm[j] : smax;
            sunknown |= sm[j] == 0;
        }
    }
    e0m.gate.scale_max = e0m.up.scale_max = e0m.down.scale_max = sunknown ? 0 : smax;
    if (L->has_shared) {
        const m3_linear *sg = &L->shared.gate, *su = &L->shared.up, *sd = &L->shared.down;
        if (!m3_cu_gemm_tc_ok(sg, T) || !m3_cu_gemm_tc_ok(su, T) || !m3_cu_gemm_tc_ok(sd, T) || sg->K != su->K) return 0;
    }
    const int H = L->router.K, F = e0->gate.N;
    const long long S = (long long)T * K;
    if (S > (1 << 26)) return 0;
    /* the tile: 128 staged rows when the experts average 64+ rows (H200, M3.1-Flash shapes: T 2048
     * 8.8 ms at 128 vs 11.7 at 64), 256 (NVFP4) when they average 256+ (H100, T 4096: 11.22 -> 10.09
     * ms; at T 2048, ~128 rows an expert, 5.93 -> 6.04), else the smallest of 16 / 32 / 64 that holds
     * the average expert's rows: the padding rows of a tile are staged, copied and multiplied like
     * real ones (at 64 tokens, tiles of 64 made the staged x ~100 MB, read once per 64 weight rows);
     * M3_MOE_TC_BN forces one (256: NVFP4 only) */
    int bn = m3_cu_env_int("M3_MOE_TC_BN", 0);
    const int nv = e0->gate.fmt == M3_WF_NVFP4;
    if (bn != 16 && bn != 32 && bn != 64 && bn != 128 && !(bn == 256 && nv))
        bn = S >= 256LL * E && nv ? 256 : S >= 64LL * E ? 128 : S >= 32LL * E ? 64 : S >= 16LL * E ? 32 : 16;
    /* 128- and 256-row tiles in units of 64: an expert's rows padded to 64, those past its full tiles
     * one tile of 64 (at 128: a "tail"), 128 or 192 (4096 tokens, 256 +- 16 slots an expert: 288 rows
     * computed an expert instead of 320 at 128; M3_MOE_TC_TAIL=0: padded to the tile) */
    const int unit = bn >= 128 && m3_cu_env_int("M3_MOE_TC_TAIL", 1) ? 64 : bn;
    /* an expert's last 128 + 64 rows one tile of 192, not a full tile and a tail (a tail's CTA expands
     * as many weights as a full one; H100, uniform routing: the op at 2048 / 4096 tokens 6.81 -> 6.06 /
     * 11.84 -> 11.19 ms; M3_MOE_TC_FAT=0: tails) */
    const int fat = bn == 128 && unit == 64 && e0->gate.fmt != M3_WF_BF16 /* (BF16: no 192-row tiles, gemm_tc.cu) */ &&
                    m3_cu_env_int("M3_MOE_TC_FAT", 1) != 0;
    const long long nz = S < E ? S : E;
    const int rows = (int)m3_moe_rows_bound(S, E, unit), maxa = rows / bn;
    moe_rest_caps maxr;
    int nplaces = maxa;
    for (int k = 0; k < 3; k++) nplaces += maxr.n[k] = m3_moe_rest_possible(64 * (k + 1), bn, unit, fat) ? (int)nz : 0;
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)T * H);
    int32_t *pick;
    float *wt;
    if (m3_cu_route(c, L, x, T, E, K, routed_scale, &pick, &wt)) return 1;
    if (c->count_experts) count_experts(c, pick, (int)S, E);
    int *map = (int *)m3_cu_scratch(c, SC_IDX, sizeof(int) * ((size_t)rows * 2 + 2 * (size_t)nplaces + 64));
    void *xs = m3_cu_scratch(c, SC_GEMM_X, m3_cu_gemm_tc_xbytes(rows, H));
    float *h = (float *)m3_cu_scratch(c, SC_MOE, sizeof(float) * ((size_t)rows * F + (size_t)S * H));
    void *hs = m3_cu_scratch(c, SC_DEQ, m3_cu_gemm_tc_xbytes(rows, F));
    if (!map || !xs || !h || !hs) return 1;
    int *rowmap = map + rows, *tiles = rowmap + rows, *cnt = tiles + 2 * (size_t)nplaces;
    float *ye = h + (size_t)rows * F;
    m3_cu_xsplit_touch(c, h, sizeof(float) * ((size_t)rows * F + (size_t)S * H));
    const m3_mlp_w *tab = (const m3_mlp_w *)L->backend;
    m3_err err;
    k_moe_tc_layout<<<1, 1024, sizeof(int) * (5 * (size_t)E + 2), c->st>>>(pick, (int)S, K, E, bn, unit, maxa, maxr, fat, map,
                                                                             rowmap, tiles, cnt);
    if (CK_LAUNCH(c, "moe layout")) return 1;
    if (m3_cu_gemm_tc_stage_x_map(c->st, xr, rows, H, map, cnt, xs, &err) ||
        m3_cu_gemm_tc_moe(c->st, 0, tab, &e0m, bn, xs, rows, tiles, maxa, maxr.n, cnt, NULL, alpha, limit, h, &err) ||
        m3_cu_gemm_tc_stage_x_map(c->st, h, rows, F, NULL, cnt, hs, &err) ||
        m3_cu_gemm_tc_moe(c->st, 2, tab, &e0m, bn, hs, rows, tiles, maxa, maxr.n, cnt, rowmap, alpha, limit, ye, &err)) {
        m3_cu_failf(c, "moe (grouped GEMMs): %s", err.msg);
        return 1;
    }
    float *sh = NULL;
    if (L->has_shared) { /* gate + up sharing staged x, SwiGLU, down: all on the wgmma GEMM */
        const int Fs = L->shared.gate.N;
        sh = (float *)m3_cu_scratch(c, SC_YE, sizeof(float) * (size_t)T * H);
        float *g = (float *)m3_cu_scratch(c, SC_XE, sizeof(float) * (size_t)T * Fs * 2);
        if (!sh || !g) return 1;
        float *u = g + (size_t)T * Fs;
        const m3_linear *gu[2] = {&L->shared.gate, &L->shared.up}, *dn = &L->shared.down;
        float *go[2] = {g, u};
        if (!m3_cu_linear_tc_n(c, 2, gu, x, T, go)) return m3_cu_failf(c, "moe: shared expert not on the GEMM"), 1;
        m3_cu_swiglu(c, g, u, (size_t)T * Fs, alpha, limit, g, 0); /* down: the wgmma GEMM */
        if (!m3_cu_linear_tc_n(c, 1, &dn, g, T, &sh)) return m3_cu_failf(c, "moe: shared expert not on the GEMM"), 1;
    }
    const norm_combine cb = {ye, wt, sh, out, K};
    if (post && m3_cu_combine_add_rmsnorm(c, &cb, post->h, post->w, T, H, post->eps, post->normed)) post->done = 1;
    else k_moe_combine<<<dim3(cdiv(H, 256), T), 256, 0, c->st>>>(ye, wt, K, H, sh, out);
    CK_LAUNCH(c, "moe combine (grouped GEMMs)");
    return 1;
}

/* precision bf16, M3_MOE_FT_MIN (9) .. M3_MOE_FT_MAX (512) tokens: the routed experts on gemm_ft.cu's
 * grouped mma.sync kernels (every expert's weights read once per launch for up to 32 of its slots,
 * several CTAs per SM), the shared expert on the dense MLP path, then the combine as moe_tc's.
 * No host synchronization. 1 when done (or failed), 0 when not taken. */
static int moe_ft(m3_cuda *c, const m3_layer_w *L, const float *x, const float *xr, int T, int E, int K, float routed_scale,
                  float alpha, float limit, float *out, moe_post *post) {
    const m3_mlp_w *e0 = &L->experts[0];
    if (!c->gemm_bf16 || !L->backend || E < 1 || E > 2048 || !m3_cu_moe_ft_ok(e0) || !m3_cu_moe_ft_act_ok(alpha, limit)) return 0;
    if (m3_cu_env_int("M3_MOE_FT", 1) == 0 || T < m3_cu_env_int("M3_MOE_FT_MIN", 9) || T > m3_cu_env_int("M3_MOE_FT_MAX", 512))
        return 0;
    /* expert parallel: every expert here, in one format and shape, and each tiled (the upload keeps a
     * matrix with E8M0 codes 0 / 255 row-major, per matrix) */
    for (int e = 0; e < E; e++)
        if (!L->experts[e].gate.w || L->experts[e].gate.fmt != e0->gate.fmt || L->experts[e].down.N != e0->down.N ||
            L->experts[e].gate.N != e0->gate.N || !m3_cu_moe_ft_ok(&L->experts[e]))
            return 0;
    const int H = L->router.K, F = e0->gate.N;
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)T * H);
    int32_t *pick;
    float *wt;
    if (m3_cu_route(c, L, x, T, E, K, routed_scale, &pick, &wt)) return 1;
    if (c->count_experts) count_experts(c, pick, T * K, E);
    void *work = m3_cu_scratch(c, SC_GEMM_X, m3_cu_moe_ft_work(T, K, E, H, F));
    float *ye = (float *)m3_cu_scratch(c, SC_MOE, sizeof(float) * (size_t)T * K * H);
    if (!work || !ye) return 1;
    m3_cu_xsplit_touch(c, ye, sizeof(float) * (size_t)T * K * H);
    if (m3_cu_moe_ft(c, (const m3_mlp_w *)L->backend, e0, xr, T, K, E, pick, work, alpha, limit, ye)) return 1;
    float *sh = NULL;
    if (L->has_shared) {
        sh = (float *)m3_cu_scratch(c, SC_YE, sizeof(float) * (size_t)T * H);
        if (!sh) return 1;
        m3_cu_mlp(c, &L->shared, x, T, alpha, limit, sh);
    }
    const norm_combine cb = {ye, wt, sh, out, K};
    if (post && m3_cu_combine_add_rmsnorm(c, &cb, post->h, post->w, T, H, post->eps, post->normed)) post->done = 1;
    else k_moe_combine<<<dim3(cdiv(H, 256), T), 256, 0, c->st>>>(ye, wt, K, H, sh, out);
    CK_LAUNCH(c, "moe combine (few slots per expert)");
    return 1;
}

static void moe_impl(m3_cuda *c, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out, moe_post *post);

void m3_cu_moe(void *ctx, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out) {
    moe_impl((m3_cuda *)ctx, L, p, x, T, out, NULL);
}

void m3_cu_moe_add_rmsnorm(void *ctx, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out, float *h,
                           const float *w, float eps, float *normed) {
    m3_cuda *c = (m3_cuda *)ctx;
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_MOE_NORM", 1) != 0;
    moe_post post = {h, w, eps, normed, 0};
    moe_impl(c, L, p, x, T, out, on ? &post : NULL);
    if (!post.done) m3_cu_add_rmsnorm(c, h, out, w, T, L->router.K, eps, normed);
}

static void moe_body(m3_cuda *c, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out, moe_post *post);

/* the MoE; the side stream's shared expert (moe_body) joined on every way out */
static void moe_impl(m3_cuda *c, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out, moe_post *post) {
    moe_body(c, L, p, x, T, out, post);
    m3_cu_side_join(c);
}

/* x goes to the router and the shared expert; xr, the routed experts' input, is x or x quantized
 * per token (p->fc1_quant, act_quant.cu) */
static void moe_body(m3_cuda *c, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out, moe_post *post) {
    const int E = p->n_experts, K = p->top_k;
    const float routed_scale = p->routed_scale, alpha = p->alpha, limit = p->limit;
    m3_cu_prof_begin(c, OP_MOE);
    if (T <= 0 || c->failed) { m3_cu_prof_end(c, OP_MOE); return; }
    const int H = L->router.K, Fd = L->experts[0].gate.N;
    const m3_mlp_w *e0 = &L->experts[0];
    /* expert parallel (src/parallel/shard.h): experts held by other ranks have no weights; the
     * host-grouped path below skips them (the graph-free kernels read every picked expert) */
    int absent = 0;
    for (int e = 0; e < E && !absent; e++) absent = !L->experts[e].gate.w;
    const int mma = m3_cu_mma_ok(&e0->gate) && m3_cu_mma_ok(&e0->up) && m3_cu_mma_ok(&e0->down);
    /* every expert on the device in one format: the kernels below read them from the device table */
    const int table = !absent && L->backend && e0->gate.fmt == e0->up.fmt && e0->gate.fmt == e0->down.fmt;
    int fast = table && T <= 8 && (mma || (m3_cu_simt_ok(&e0->gate) && m3_cu_simt_ok(&e0->up) && m3_cu_simt_ok(&e0->down)));
    /* 2-8 tokens (and batches up to 4 MOE_GROUP_T in chunks of MOE_GROUP_T): each picked expert read
     * once for all its tokens of a chunk (up to 4 per read; a verify pass of 8 tokens picks ~49
     * distinct experts of 64 slots per layer); M3_MOE_GROUPED=0: one read per slot. Longer runs
     * (prefill chunks) group on the host, below. */
    static int grouped = -1;
    if (grouped < 0) grouped = m3_cu_env_int("M3_MOE_GROUPED", 1) != 0;
    const int gbig = table && mma && grouped && T > 8 && T <= 4 * MOE_GROUP_T && K <= MOE_GROUP_S / MOE_GROUP_T;
    const float *xr = x;
    if (p->fc1_quant == M3_FC1_NVFP4) {
        float *xq = (float *)m3_cu_scratch(c, SC_ACTQ, sizeof(float) * (size_t)T * H);
        if (!xq) { m3_cu_prof_end(c, OP_MOE); return; }
        m3_cu_xsplit_touch(c, xq, sizeof(float) * (size_t)T * H);
        /* the f16 split written with it where the tensor-core GEMVs below read it: up to 8 tokens,
         * and grouped runs at exact precision (in bf16 moe_ft takes those) of one chunk, or of
         * more without a shared expert (the shared expert's GEMVs between the chunks would take
         * the split's slot back) */
        uint16_t *xs = NULL;
        if (mma && (fast || (gbig && !c->gemm_bf16 && (T <= MOE_GROUP_T || !L->has_shared)))) {
            xs = m3_cu_xsplit_claim(c, xq, (size_t)T * H);
            if (!xs) { m3_cu_prof_end(c, OP_MOE); return; }
        }
        if (m3_cu_act_quant_nvfp4(c, x, T, H, xq, xs)) {
            m3_cu_xsplit_touch(c, xq, sizeof(float) * (size_t)T * H); /* the claimed split was not written */
            m3_cu_prof_end(c, OP_MOE);
            return;
        }
        xr = xq;
    }
    if (moe_ft(c, L, x, xr, T, E, K, routed_scale, alpha, limit, out, post) ||
        moe_tc(c, L, x, xr, T, E, K, routed_scale, alpha, limit, out, post)) {
        m3_cu_prof_end(c, OP_MOE);
        return;
    }
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)T * H);
    /* The shared expert reads x alone: on the side stream (m3_cu_side_begin) it runs beside the
     * router and the routed experts, and the combine waits for it (30 layers at 8K: decode batch 8
     * 17.05 -> 16.79 ms, the verify of 8 at batch 1 16.99 -> 16.78; batch 1 the same: there its
     * GEMVs fill the SMs as the routed ones do). Up to 8 tokens and a shared expert the tensor-core
     * GEMV takes whole (cuBLAS, which BF16 matrices at 2-8 tokens would take, is bound to the main
     * stream). M3_CUDA_SIDE=0: after the routed experts. */
    float *sh_side = NULL;
    if (L->has_shared && fast && mma && m3_cu_mma_ok(&L->shared.gate) && m3_cu_mma_ok(&L->shared.up) &&
        m3_cu_mma_ok(&L->shared.down) && m3_cu_side_begin(c)) {
        sh_side = (float *)m3_cu_scratch(c, SC_YE, sizeof(float) * (size_t)T * H); /* the side's SC_YE */
        if (sh_side) m3_cu_mlp(c, &L->shared, x, T, alpha, limit, sh_side);
        m3_cu_side_end(c);
        if (!sh_side) { m3_cu_prof_end(c, OP_MOE); return; }
    }
    /* router logits, picks and weights (router.cu) */
    int32_t *pick;
    float *wt;
    if (m3_cu_route(c, L, x, T, E, K, routed_scale, &pick, &wt)) { m3_cu_prof_end(c, OP_MOE); return; }
    if (c->count_experts) count_experts(c, pick, T * K, E);
    if (fast || gbig) {
        const m3_mlp_w *tab = (const m3_mlp_w *)L->backend;
        for (int t0 = 0; t0 < T && mma; t0 += MOE_GROUP_T) { /* tensor cores: (gate, up) of every slot, SwiGLU, down */
            const int tc = T - t0 < MOE_GROUP_T ? T - t0 : MOE_GROUP_T, S = tc * K;
            const float *xc = x + (size_t)t0 * H, *xrc = xr + (size_t)t0 * H;
            const int32_t *pc = pick + (size_t)t0 * K;
            float *h = (float *)m3_cu_scratch(c, SC_MOE, sizeof(float) * (size_t)S * (Fd + H));
            float *gu = (float *)m3_cu_scratch(c, SC_YE, sizeof(float) * (size_t)S * Fd * 2);
            if (!h || !gu) { m3_cu_prof_end(c, OP_MOE); return; }
            float *ye = h + (size_t)S * Fd;
            const int grp = grouped && tc >= 2 && m3_cu_moe_grouped(c, e0, tab, pc, tc, K, E, 0, xrc, H, gu) == 0;
            if (!grp) m3_cu_moe_mma(c, e0, tab, pc, K, S, 0, xrc, H, gu);
            uint16_t *hs = m3_cu_xsplit_claim(c, h, (size_t)S * Fd);
            if (!hs) { m3_cu_prof_end(c, OP_MOE); return; }
            k_moe_swiglu_split<<<cdiv((size_t)S * Fd, 256), 256, 0, c->st>>>(gu, S, Fd, alpha, limit, h, hs, c->gemm_bf16);
            if (grp) m3_cu_moe_grouped(c, e0, tab, pc, tc, K, E, 2, h, Fd, ye);
            else m3_cu_moe_mma(c, e0, tab, pc, K, S, 2, h, Fd, ye);
            float *sh = NULL;
            if (sh_side) { /* the side stream's */
                m3_cu_side_join(c);
                sh = sh_side;
            } else if (L->has_shared) { /* the shared expert first, so that the combine adds it (one launch less) */
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
        const float *xg = m3_cu_gemm_input(c, xr, (size_t)T * H); /* bf16 mode: the experts' GEMMs take bf16(x) */
        if (!xg) { m3_cu_prof_end(c, OP_MOE); return; }
        int kt1 = kt_for(H), kt2 = kt_for(Fd);
        dim3 g1(cdiv(Fd, GW * 2), S), g2(cdiv(H, GW * GR), S);
        size_t s1 = sizeof(float) * kt1, s2 = sizeof(float) * kt2;
#define MOE_LAUNCH(FM)                                                                                          \
    k_moe_gate_up_swiglu_simt<FM><<<g1, GW * 32, s1, c->st>>>(tab, pick, K, xg, H, Fd, alpha, limit, h, kt1, c->gemm_bf16); \
    k_moe_down_simt<FM><<<g2, GW * 32, s2, c->st>>>(tab, pick, h, Fd, H, ye, kt2);
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
                k_moe_gather_rows<<<gg, 256, 0, c->st>>>(xr, drows + off[e], cnt, H, xe);
                m3_cu_linear(c, &me->gate, xe, cnt, g);
                m3_cu_linear(c, &me->up, xe, cnt, u);
                m3_cu_swiglu(c, g, u, (size_t)cnt * Fd, alpha, limit, g, cnt <= m3_cu_xsplit_rows());
                m3_cu_linear(c, &me->down, g, cnt, ye);
                k_moe_scatter_add<<<gg, 256, 0, c->st>>>(out, drows + off[e], dw + off[e], cnt, H, ye);
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

/* One MoE launch over the device expert table (modes of gv_args.moe): mats matrices of W's
 * shape, outputs [S][2][N] (gate + up) or [S][N] (down); grouped modes take 8 columns per item. */
static int moe_launch(m3_cuda *c, const m3_linear *W, const m3_mlp_w *tab, const int32_t *pick, int topk, const int *groups,
                      int mode, int mats, int S, int part, const uint16_t *xh, const uint16_t *xl, int xstride, float *out) {
    gv_args a;
    memset(&a, 0, sizeof a);
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)S * (part == 2 ? 1 : 2) * W->N);
    a.j[0].W = *W; /* shape only: each matrix comes from the device table */
    a.j[0].xh = xh;
    a.j[0].xl = xl;
    a.j[0].xstride = xstride;
    a.j[0].y = out;
    a.j[0].T = mode >= 3 ? 8 : 1;
    a.nj = 1;
    a.moe = mode;
    a.tab = tab;
    a.pick = pick;
    a.topk = topk;
    a.groups = groups;
    m3_cu_gv_launch(c, &a, W->fmt, 1, &mats); /* one token per slot, or at most GRP_CAP per group: x_hi, x_lo in one MMA */
    return 0;
}

/* MoE experts of S = T*topk slots: gu[S][2][F] = (gate, up) rows of each slot's expert,
 * or (part 2) ye[S][H] = down rows against h[S][F]. -1 when the format is not supported. */
int m3_cu_moe_mma(m3_cuda *c, const m3_mlp_w *host_e0, const m3_mlp_w *tab, const int32_t *pick, int topk, int S, int part,
                  const float *x, int xstride, float *out) {
    const m3_linear *W = part == 2 ? &host_e0->down : &host_e0->gate;
    if (!m3_cu_mma_ok(W) || (part != 2 && (!m3_cu_mma_ok(&host_e0->up) || host_e0->up.fmt != W->fmt))) return -1;
    const int rows = part == 2 ? S : S / topk; /* x rows: tokens (gate/up) or slots (down) */
    const uint16_t *xh, *xl;
    if (m3_cu_xsplit_get(c, x, (size_t)rows * xstride, &xh, &xl)) return 0;
    return moe_launch(c, W, tab, pick, topk, NULL, part == 2 ? 2 : 1, part == 2 ? S : 2 * S, S, part, xh, xl, xstride, out);
}

/* the distinct experts of a step's S = T*K picks, ascending, each with its slots in token
 * order, at most GRP_CAP slots per group (an expert picked by more tokens gets more groups,
 * so that the kernel carries every token's x_hi and x_lo in one MMA): out[0] = groups, then
 * per group {expert, count, slots[8]}. One thread per slot (S <= MOE_GROUP_S, one block): slot i
 * counts the slots of its expert (cnt) and those before it (rank); the group of slot i is the
 * groups of every smaller expert picked plus rank / GRP_CAP. */
#define GRP_CAP 4
__global__ void __launch_bounds__(MOE_GROUP_S) k_moe_group_by_expert(const int32_t *pick, int T, int K, int *out) {
    __shared__ int e[MOE_GROUP_S], ng[MOE_GROUP_S];
    const int S = T * K, i = threadIdx.x;
    e[i] = i < S ? pick[i] : 0x7fffffff;
    __syncthreads();
    int cnt = 0, rank = 0;
    for (int j = 0; j < S; j++) {
        cnt += e[j] == e[i];
        rank += j < i && e[j] == e[i];
    }
    ng[i] = i < S && rank == 0 ? (cnt + GRP_CAP - 1) / GRP_CAP : 0; /* groups of this expert, at its first slot */
    __syncthreads();
    int base = 0, total = 0;
    for (int j = 0; j < S; j++) {
        base += e[j] < e[i] ? ng[j] : 0;
        total += ng[j];
    }
    if (i == 0) out[0] = total;
    if (i >= S) return;
    int *g = out + 1 + (base + rank / GRP_CAP) * 10;
    if (rank % GRP_CAP == 0) {
        g[0] = e[i];
        g[1] = cnt - rank < GRP_CAP ? cnt - rank : GRP_CAP;
    }
    g[2 + rank % GRP_CAP] = i;
}

/* The MoE experts grouped by expert (2 <= T <= MOE_GROUP_T tokens, T * topk <= MOE_GROUP_S):
 * each picked expert's rows are read once for up to GRP_CAP of the tokens routed to it (a
 * speculative verify pass, a batch of decodes);
 * outputs land where m3_cu_moe_mma puts them (gu[S][2][F], then ye[S][H]). part 0: route the
 * picks into groups and run gate + up; part 2: down. -1 when not supported. */
int m3_cu_moe_grouped(m3_cuda *c, const m3_mlp_w *host_e0, const m3_mlp_w *tab, const int32_t *pick, int T, int topk,
                      int E, int part, const float *x, int xstride, float *out) {
    const m3_linear *W = part == 2 ? &host_e0->down : &host_e0->gate;
    if (T < 2 || T > MOE_GROUP_T || T * topk > MOE_GROUP_S || !m3_cu_mma_ok(W) ||
        (part != 2 && (!m3_cu_mma_ok(&host_e0->up) || host_e0->up.fmt != W->fmt)))
        return -1;
    const int S = T * topk, gmax = S; /* groups: at most one per slot */
    int *groups = (int *)m3_cu_scratch(c, SC_IDX, sizeof(int) * (size_t)(1 + 10 * gmax) + 64);
    if (!groups) return 0;
    if (part != 2) {
        k_moe_group_by_expert<<<1, (S + 31) / 32 * 32, 0, c->st>>>(pick, T, topk, groups);
        if (CK_LAUNCH(c, "moe groups")) return 0;
    }
    const int rows = part == 2 ? S : T; /* x rows: tokens (gate/up) or slots (down) */
    const uint16_t *xh, *xl;
    if (m3_cu_xsplit_get(c, x, (size_t)rows * xstride, &xh, &xl)) return 0;
    return moe_launch(c, W, tab, pick, topk, groups, part == 2 ? 4 : 3, part == 2 ? gmax : 2 * gmax, S, part, xh, xl, xstride,
                      out);
}
