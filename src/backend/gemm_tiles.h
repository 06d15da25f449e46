/* Token tiles of the tensor-core GEMM (src/backend/cuda/gemm_tc.cu): which tile a linear of T
 * tokens runs in, and how the MoE's grouped GEMMs cut one expert's rows into tiles (moe.cu's
 * k_moe_tc_layout). Plain C, shared by the CUDA backend and the unit tests. */
#ifndef M3_BACKEND_GEMM_TILES_H
#define M3_BACKEND_GEMM_TILES_H

#ifdef __CUDACC__
#define M3_GT_FN static __host__ __device__ __forceinline__
#else
#define M3_GT_FN static inline
#endif

/* The token tile for T tokens of an N-row matrix on sms SMs (maxbn: the largest tile the format
 * takes: BF16 128, MXFP8 256 (in half stages; 192 without), NVFP4 256): the smallest of 16 / 32 /
 * 64 that holds T, else of 128, 192 and 256 the one whose waves of CTAs take least time (the smaller
 * on a tie), a CTA of 192 tokens costing 4/3 of a 128-token one (measured 1.32) and a CTA of 256
 * 1.42 (their A registers, expanded once, feed 1.5x / 2x the MMAs; H100, docs/PERF.md sessions 38
 * and 43; MXFP8's 256 in half stages ~1.46, session 44), 192 and 256 only where their tiles fill
 * two waves (fewer go to K slices, m3_cu_gemm_tc_ksplit). At 1024 tokens of
 * a 6144 x 3072 matrix 128 and 192 are both 3 waves: 192 measured 24% slower; 256 there has 1.5
 * waves, and with K slices took 22% longer than 128. Weight rows per CTA: 128. */
M3_GT_FN int m3_gemm_tc_bn(int T, int maxbn, int N, int sms) {
    if (T <= 64) return T <= 16 ? 16 : T <= 32 ? 32 : 64;
    if (T <= 128 || maxbn <= 128 || sms < 1) return 128;
    static const int bns[3] = {128, 192, 256}, cost[3] = {300, 400, 426};
    const long long nm = (N + 127) / 128;
    int best = 128;
    long long best_t = -1;
    for (int i = 0; i < 3 && bns[i] <= maxbn; i++) {
        const long long tiles = nm * ((T + bns[i] - 1) / bns[i]), t = (tiles + sms - 1) / sms * cost[i];
        if (i && tiles < 2LL * sms) continue;
        if (best_t < 0 || t < best_t) best = bns[i], best_t = t;
    }
    return best;
}

/* Which tile CTA b of the GEMM's grid computes: its K slice ks, row tile mt (of nm) and token tile tt
 * (of nt). Grouped raster: groups of 8 row tiles with the token tiles inside each group (L2 reuse of
 * both operands), the ksplit slices of a tile neighbours. */
typedef struct m3_gemm_tile {
    int ks, mt, tt;
} m3_gemm_tile;

M3_GT_FN m3_gemm_tile m3_gemm_tc_raster(int b, int nm, int nt, int ksplit) {
    m3_gemm_tile r;
    r.ks = b % ksplit;
    const int tile = b / ksplit, per_group = 8 * nt, first = tile / per_group * 8;
    const int gsz = nm - first < 8 ? nm - first : 8, in = tile % per_group;
    r.mt = first + in % gsz;
    r.tt = in / gsz;
    return r;
}

/* One expert's v staged rows (a multiple of unit) in tiles: `full` tiles of bn rows, then at most
 * one "rest" tile of the rows past them (rest: 0, 64, 128 or 192 rows). With unit < bn (bn 128 or
 * 256, unit 64) the rest is v % bn: a 64-row "tail" at bn 128; 64, 128 or 192 rows at bn 256. With
 * fat (bn 128, unit 64, past the first 128 rows) the last full tile and a tail are one "fat" tile of
 * 192 rows: one CTA instead of two that each expand the expert's weights (M3_MOE_TC_FAT=0: tails).
 * Rows covered: full * bn + rest = v. */
typedef struct m3_moe_tiles {
    int full, rest;
} m3_moe_tiles;

M3_GT_FN m3_moe_tiles m3_moe_expert_tiles(int v, int bn, int unit, int fat) {
    m3_moe_tiles r;
    r.full = v / bn;
    r.rest = unit < bn ? v % bn : 0;
    if (fat && bn == 128 && unit == 64 && r.full > 0 && r.rest) {
        r.full--;
        r.rest += bn;
    }
    return r;
}

/* 1 when an expert's rows may end in a rest tile of `rest` rows (64, 128 or 192) under these
 * tiles: the rest lists (moe.cu's layout) hold places only for those */
M3_GT_FN int m3_moe_rest_possible(int rest, int bn, int unit, int fat) {
    return rest > 0 && unit < bn && rest % unit == 0 && (rest < bn || (fat && bn == 128 && unit == 64 && rest == 192));
}

/* An upper bound of the staged rows of S slots over E experts, each expert's rows padded to unit
 * (at most min(S, E) experts get any), rounded up to 64: full tiles <= this / bn, rest tiles of
 * each size <= min(S, E) */
M3_GT_FN long long m3_moe_rows_bound(long long S, int E, int unit) {
    const long long nz = S < E ? S : E;
    return (S + nz * (unit - 1) + 63) / 64 * 64;
}

#endif
