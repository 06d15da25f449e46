/* The few-token GEMM (issue 25): y = x W^T for MXFP8 / NVFP4 weights at 9-64 tokens (decode
 * batches, verify passes), and the MoE's routed experts at ~1-32 slots per expert (9-512
 * tokens: each of the 128 experts gets a few of a step's slots), under precision bf16. Every
 * weight is read from HBM once per launch for up to 64 tokens (linears) or 32 slots (an expert's).
 * CPU reference: src/backend/cpu/linear.c and moe.c (m3_cpu_linear, m3_cpu_moe) with the bf16
 * mode's roundings (x and h rounded to bf16, f32 sums); bench/bench_cuda_moe.c and
 * bench/bench_cuda_gemm.c (op16) check it in double at real shapes.
 *
 * Why not the wgmma GEMM (gemm_tc.cu): at these token counts a step is a pass over the weights
 * (~4 GB of NVFP4 experts per layer), and the work per weight byte is the expansion, not the
 * multiply. The wgmma kernel keeps one CTA of 8 consumer warps per SM (its registers and shared
 * memory are sized for 128-token tiles), and they wait on latency (7.5 cycles between a warp's
 * instructions; the MoE took 3.1-3.9 ms a layer whatever the rows). Here: mma.sync m16n8k16
 * with the weights as the A operand expanded in registers, the tokens as n8 tiles of B, and
 * small CTAs, 2-4 per SM, so that 16-32 warps hide the latency.
 *
 * Linears (MODE 0, m3_cu_linear_ft): x staged once (k_ft_stage, rows = tokens), one launch per
 * matrix: CTA (token group of 8 NT tokens: NT 2, 4 or 8 for up to 16, 32, 64 tokens; 128 weight
 * rows; a K slice); K slices when the matrix has too few row chunks to fill the GPU in one wave,
 * their partial sums added in slice order (k_ft_sum_slices: deterministic); where whole slices
 * would leave much of the wave empty, a stream-K split instead (src/backend/streamk.h: one CTA
 * per place, each an equal share of the tiles' K blocks, partial sums added in CTA order by
 * k_ft_sum_sk: deterministic for a given GPU). NVFP4 takes one group
 * of 64 tokens rather than two of 32: each group expands the weights again (see m3_cu_linear_ft).
 *
 * MoE:
 * Layout (k_ft_layout): the T K slots sorted by expert into "staged rows", each expert's rows
 * contiguous and padded to 8 (one n8 tile), cut into segments of at most NT tiles (one CTA
 * column). x is staged once in that row order (k_ft_stage, see Arithmetic; NVFP4: the 16-byte
 * chunks of every 128-value block in the order the fragment loads read them, see below); gate +
 * up (k_ft_gemm MODE 1) writes h = SwiGLU-OAI, rounded to bf16, in the same row order, staged
 * the same way for down (MODE 2), which writes f32 rows ye[slot][H] for the combine (moe.cu).
 *
 * k_ft_gemm: CTA = 8 warps x 16 weight rows (MODE 1: warps 0-3 gate rows 64c .. 64c + 63,
 * warps 4-7 the same up rows, so SwiGLU pairs them through shared memory; MODE 2: 128 down rows)
 * times one segment's rows, over all of K in stages of 128 values: a NS-stage cp.async ring
 * shared by the CTA (each stage: the 8 row tiles' bytes, one contiguous run per tile in the
 * tiled layout (common.cuh), their scales, and the segment's x rows), CUTLASS's sm80
 * multistage scheme; each thread's copy addresses are computed once.
 *
 * Arithmetic: f16 MMAs (mma.sync m16n8k16, f32 sums) on exact operands. The weights expand to
 * f16 as in the tensor-core GEMV (linear_mma.cu): NVFP4 codes by nv_pair (value x 2^-14) times
 * the block's E4M3 scale (one HMUL2 per pair; 2^14 and the global scale in the epilogue), MXFP8
 * by the hardware E4M3 converter with each 32-value unit's E8M0 scale on its f32 partial sums.
 * x is rounded to bf16 (the bf16 mode's GEMM input) and staged as f16 times 2^s_r, a power of
 * two per staged row that puts the row's largest |x| in [2^14, 2^15): bf16's 8 significant
 * bits then fit f16 exactly for every value down to 2^-31 of the row's largest (f16 subnormals
 * included); smaller ones round, by at most 2^-40 of the largest, far below one f32 rounding of
 * the sums. h is bounded (|h| <= (limit + 1) max(limit, 0.28 / alpha)), so it is staged the same
 * way with one power of two. The epilogue multiplies by 2^-s. Instructions bound this kernel, and
 * the f16 expansion takes half those of a bf16 one (nv_bf2 + a bf16 multiply per pair): the
 * first version, on bf16 operands, ran the MoE at ~1.8 TB/s.
 * Fragments:
 *   NVFP4 (one 128-value unit a stage): lane (g, t) holds 16 bytes of rows g and g + 8 (32
 *     codes each, values 32t .. 32t + 31 of the unit); k16 step s takes codes 4s + {0,1} (A
 *     columns 2t, 2t + 1) and 4s + {2,3} (columns 2t + 8, 2t + 9). x: lane (g, t) reads values
 *     32t + 8j .. 32t + 8j + 7 of its token g for steps 2j, 2j + 1, a 16-byte chunk stored at
 *     chunk position 4j + t of the block, so the 8 lanes of a quarter warp read 2 rows x 64
 *     contiguous bytes: with rows 320 bytes apart (= 64 mod 128) no two hit one bank group.
 *   MXFP8 (four 32-value units a stage): lane (g, t) holds 8 bytes of rows g and g + 8 (values
 *     8t .. 8t + 7 of the unit); x in natural order, the lane's 8 values of unit u are chunk
 *     4u + t of the row. */
#include "backend/streamk.h"
#include "common.cuh"
#include "ptx.cuh"

namespace {

/* stages of the ring: 4, 3 with 8 tiles of x (64 tokens: two CTAs an SM still fit); the MoE's NVFP4
 * segments of 4 tiles take 3 too (m3_cu_moe_ft: three CTAs an SM) */
template <int NT> __host__ __device__ constexpr int n_stages() { return NT == 8 ? 3 : 4; }
constexpr int XR = 320;   /* bytes between staged rows in shared memory (256 + 64, see above) */
constexpr int KS = 128;   /* K values per stage */

template <int FMT> struct ftc {
    enum {
        WB = FMT == M3_WF_NVFP4 ? 1024 : 2048, /* a 16-row tile's value bytes per stage */
        SB = FMT == M3_WF_NVFP4 ? 128 : 64,    /* ... and scale bytes */
    };
};
template <int FMT, int NT> __host__ __device__ constexpr int stage_bytes() {
    return 8 * (ftc<FMT>::WB + ftc<FMT>::SB) + NT * 8 * XR;
}

struct ft_args {
    m3_linear W;         /* MODE 0: the matrix */
    int T, ks;           /* MODE 0: tokens, K slices */
    float *y;            /* MODE 0: y [T][N], or with K slices / stream-K the partial sums [part][T][N] */
    const m3_mlp_w *tab; /* device table of experts */
    const int *seg;      /* [0] segments, [1] staged rows in use, then per segment: expert, first row, tiles */
    const int *rowmap;   /* slot of each staged row (-1: padding) */
    const uint16_t *xs;  /* staged rows [rows][K]: f16 of bf16(x) 2^s */
    const float *xsc;    /* MODES 0, 1: 2^-s of each staged row */
    float hsc;           /* MODE 2: 2^-s of the staged h (one for all rows) */
    float hmul;          /* MODE 1: 2^s of the staged h */
    int K, N;            /* the pass's matrix shape: MODE 0 W's; MODE 1 gate / up F x H, MODE 2 down H x F */
    int perm_h;          /* MODE 1: stage h in NVFP4's chunk order (the down matrix is NVFP4) */
    uint16_t *hs;        /* MODE 1: h [rows][N], f16 of bf16(h) 2^s */
    float *ye;           /* MODE 2: [slot][N] */
    float alpha, limit;
};

/* staged-row chunk c (16 bytes, 8 values) of a K row -> where it is stored: NVFP4 chunk order
 * (position 4j + t for the lane t's j-th chunk of a 128-value block), else as is */
static __device__ __forceinline__ int chunk_pos(int c, int perm) {
    return perm ? (c & ~15) | ((c & 3) << 2) | ((c >> 2) & 3) : c;
}

/* the slots' layout: counts per expert, each expert's rows padded to 8 from off[e], segments
 * of at most nt tiles; map[r] the token of staged row r, rowmap[r] its slot (-1: padding) */
__global__ void __launch_bounds__(1024) k_ft_layout(const int32_t *pick, int S, int K, int E, int nt, int *map, int *rowmap,
                                                    int *seg) {
    extern __shared__ int lsm[];
    int *cnt = lsm, *off = cnt + E, *soff = off + E + 1, *fill = soff + E + 1;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = fill[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const int e = pick[s];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* prefix sums of the padded rows and of the segments, a warp scan per 32 experts */
        int base = 0, sbase = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int e = e0 + threadIdx.x;
            const int tiles = e < E ? (cnt[e] + 7) / 8 : 0, v = tiles * 8, sv = (tiles + nt - 1) / nt;
            int inc = v, sinc = sv;
            for (int d = 1; d < 32; d *= 2) {
                const int o = __shfl_up_sync(0xffffffffu, inc, d), so = __shfl_up_sync(0xffffffffu, sinc, d);
                if ((int)threadIdx.x >= d) { inc += o; sinc += so; }
            }
            if (e < E) { off[e] = base + inc - v; soff[e] = sbase + sinc - sv; }
            base += __shfl_sync(0xffffffffu, inc, 31);
            sbase += __shfl_sync(0xffffffffu, sinc, 31);
        }
        if (threadIdx.x == 0) {
            off[E] = base;
            soff[E] = sbase;
            seg[0] = sbase;
            seg[1] = base;
        }
    }
    __syncthreads();
    for (int r = threadIdx.x; r < off[E]; r += blockDim.x) map[r] = rowmap[r] = -1;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const int tiles = (cnt[e] + 7) / 8;
        for (int i = 0; soff[e] + i < soff[e + 1]; i++) {
            int *p = seg + 2 + 3 * (soff[e] + i);
            p[0] = e;
            p[1] = off[e] + 8 * nt * i;
            p[2] = tiles - nt * i < nt ? tiles - nt * i : nt;
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

/* the power of two 2^sh a staged row is scaled by, from its largest finite |x| (see the top) */
static __device__ __forceinline__ int stage_shift(float mx) {
    mx = __bfloat162float(__float2bfloat16_rn(mx)); /* the largest staged value */
    int e = 0;
    if (mx > 0.f && mx < INFINITY) frexpf(mx, &e); /* mx < 2^e */
    return e < -100 ? 115 : 15 - e;                 /* 2^sh and 2^-sh stay f32 normals */
}
/* 8 values of x -> 8 staged f16 of bf16(x) 2^sh (up = 2^sh) */
static __device__ __forceinline__ uint4 stage8(float4 a, float4 b, float up) {
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float lo = __bfloat162float(__float2bfloat16_rn(v[2 * i])) * up;
        const float hi = __bfloat162float(__float2bfloat16_rn(v[2 * i + 1])) * up;
        const __half2 h = __floats2half2_rn(lo, hi);
        w[i] = *(const uint32_t *)&h;
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}
/* the largest finite |value| of 4 (an Inf stays Inf alone: it is not the row's scale) */
static __device__ __forceinline__ float amax4(float4 v, float mx) {
    const float a4[4] = {fabsf(v.x), fabsf(v.y), fabsf(v.z), fabsf(v.w)};
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (a4[i] < INFINITY) mx = fmaxf(mx, a4[i]);
    return mx;
}

/* staged row r <- f16(bf16(x[map[r]]) 2^s_r), zeros for padding, chunks placed by chunk_pos,
 * xsc[r] = 2^-s_r (see the top); a warp per row; rows past the ones in use are not written */
__global__ void k_ft_stage(const float *x, int K, const int *map, const int *seg, int rows, int perm, uint16_t *xs, float *xsc) {
    /* map NULL: the rows are x's rows 0 .. rows - 1, padded with zero rows to a multiple of 8 */
    const int used = map ? (seg[1] < rows ? seg[1] : rows) : (rows + 7) / 8 * 8, lane = threadIdx.x & 31;
    for (int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < used; r += gridDim.x * (blockDim.x / 32)) {
        const int t = map ? map[r] : r < rows ? r : -1;
        uint16_t *o = xs + (size_t)r * K;
        if (t < 0) {
            for (int c = lane; c < K / 8; c += 32) *(uint4 *)(o + 8 * c) = make_uint4(0, 0, 0, 0);
            if (lane == 0) xsc[r] = 1.0f;
            continue;
        }
        const float *xr = x + (size_t)t * K;
        float mx = 0.f;
        for (int k = 4 * lane; k < K; k += 128) mx = amax4(*(const float4 *)(xr + k), mx);
        const int sh = stage_shift(warp_max(mx));
        const float up = ldexpf(1.0f, sh);
        if (lane == 0) xsc[r] = ldexpf(1.0f, -sh);
        for (int c = lane; c < K / 8; c += 32)
            *(uint4 *)(o + 8 * chunk_pos(c, perm)) = stage8(*(const float4 *)(xr + 8 * c), *(const float4 *)(xr + 8 * c + 4), up);
    }
}

/* The same staging with a CTA (256 threads) per row, for K <= 256 * 8 * SR_CH: each thread loads its
 * chunks of 8 values (chunks tid, tid + 256, ...) into registers, all in flight at once, the row's
 * largest value comes from a block reduction, and the chunks are converted from the registers (one
 * pass over x). The warp-per-row kernel above waits on its row's loads one by one (a warp reads
 * 24 KB in two passes): 13 us for 64 rows of 6144. */
constexpr int SR_CH = 6; /* chunks of 8 values a thread holds: K up to 12288 */
__global__ void __launch_bounds__(256) k_ft_stage_cta(const float *x, int K, const int *map, const int *seg, int rows, int perm,
                                                      uint16_t *xs, float *xsc) {
    __shared__ float part[32];
    const int used = map ? (seg[1] < rows ? seg[1] : rows) : (rows + 7) / 8 * 8, nc = K / 8;
    for (int r = blockIdx.x; r < used; r += gridDim.x) { /* uniform across the CTA */
        const int t = map ? map[r] : r < rows ? r : -1;
        uint16_t *o = xs + (size_t)r * K;
        if (t < 0) {
            for (int c = threadIdx.x; c < nc; c += 256) *(uint4 *)(o + 8 * c) = make_uint4(0, 0, 0, 0);
            if (threadIdx.x == 0) xsc[r] = 1.0f;
            continue;
        }
        const float *xr = x + (size_t)t * K;
        float4 va[SR_CH], vb[SR_CH];
        float mx = 0.f;
#pragma unroll
        for (int i = 0; i < SR_CH; i++) {
            const int c = threadIdx.x + 256 * i;
            va[i] = vb[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (c < nc) {
                va[i] = *(const float4 *)(xr + 8 * c);
                vb[i] = *(const float4 *)(xr + 8 * c + 4);
            }
        }
#pragma unroll
        for (int i = 0; i < SR_CH; i++) mx = amax4(vb[i], amax4(va[i], mx));
        const int sh = stage_shift(block_max_f(mx, part));
        const float up = ldexpf(1.0f, sh);
        if (threadIdx.x == 0) xsc[r] = ldexpf(1.0f, -sh);
#pragma unroll
        for (int i = 0; i < SR_CH; i++) {
            const int c = threadIdx.x + 256 * i;
            if (c < nc) *(uint4 *)(o + 8 * chunk_pos(c, perm)) = stage8(va[i], vb[i], up);
        }
    }
}

/* stage rows of x (see k_ft_stage) by whichever kernel fits K */
static void ft_stage(m3_cuda *c, const float *x, int K, const int *map, const int *seg, int rows, int perm, uint16_t *xs, float *xsc) {
    static int cta = -1; /* M3_FT_STAGE_CTA=0: the warp-per-row kernel (measurements) */
    if (cta < 0) cta = m3_cu_env_int("M3_FT_STAGE_CTA", 1) != 0;
    const int padded = map ? rows : (rows + 7) / 8 * 8;
    if (K <= 256 * 8 * SR_CH && cta)
        k_ft_stage_cta<<<padded < 4096 ? padded : 4096, 256, 0, c->st>>>(x, K, map, seg, rows, perm, xs, xsc);
    else
        k_ft_stage<<<cdiv(padded, 8) < 1024 ? cdiv(padded, 8) : 1024, 256, 0, c->st>>>(x, K, map, seg, rows, perm, xs, xsc);
}

/* The grouped GEMM of one pass (see the top). grid: (row chunks, segment bound) */
/* One output tile's K blocks kb0 .. kb1 - 1: row chunk c (128 rows; MODE 1: 64 gate + 64 up rows of
 * expert m), staged rows r0 .. r0 + 8 ng - 1; MODE 0 writes y0 [T][N] (y, a K slice's or a
 * stream-K partial's buffer). Every thread of the CTA calls it; the ring is empty before and after. */
/* NG: the tile's token tiles when known at compile time (1..NT: no per-tile tests in the loop, so
 * no predicated MMAs for absent tiles, and the MMAs of different tiles interleave), 0: ng at run time */
template <int FMT, int NT, int MODE, int NS, int NG>
static __device__ __forceinline__ void ft_tile(const ft_args &a, uint8_t *sm, int r0, int ng, int c, int kb0, int kb1,
                                               const m3_mlp_w *m, float *y0) {
    constexpr int NU = NG > 0 ? NG : NT; /* token tiles the unrolled loops cover */
    if (NG > 0) ng = NG;
    constexpr int WB = ftc<FMT>::WB, SB = ftc<FMT>::SB, STAGE = stage_bytes<FMT, NT>();
    constexpr int VPT = 8 * WB / 16 / 256, XPT = (NT * 8 * 16 + 255) / 256; /* copies per thread: values, x rows */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    /* the CTA's row tile i (0-7): its matrix and 16-row tile index there */
    auto tile_mat = [&](int i) -> const m3_linear * {
        return MODE == 0 ? &a.W : MODE == 1 ? (i < 4 ? &m->gate : &m->up) : &m->down;
    };
    auto tile_idx = [&](int i) -> int { return MODE == 1 ? c * 4 + (i & 3) : c * 8 + i; };
    const int ntile = a.N / 16; /* 16-row tiles of the matrix (MODES 0, 2: the last chunk may hold fewer) */
    const bool live = tile_idx(warp) < ntile;
    const int NK = kb1 - kb0;
    const uint32_t s0 = smem_u32(sm);

    /* this thread's copies of every stage: sources at stage 0 (a stage moves them by WB, SB, 2 KS
     * bytes) and destinations in slot 0. No per-stage tests: a row tile past the matrix (MODES 0, 2)
     * copies the last tile's bytes again into the slots of a warp that computes nothing (!live), and
     * with ng at run time the x rows past the segment repeat its last row into rows no MMA reads;
     * with NG known the x copies of absent token tiles are left out, whole warps at a time (8 NG rows
     * x 256 bytes = 128 NG copies); the scales are warps 0-1's (MXFP8: warp 0's). */
    const uint8_t *vsrc[VPT], *ssrc = NULL, *xsrc[XPT];
    uint32_t vdst[VPT], sdst = 0, xdst[XPT];
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int q = threadIdx.x + 256 * j, i = q / (WB / 16), o = (q % (WB / 16)) * 16;
        const m3_linear *W = tile_mat(i);
        vsrc[j] = W->w + (size_t)min(tile_idx(i), ntile - 1) * 16 * W->row_bytes + o;
        vdst[j] = i * WB + o;
    }
    constexpr int SCOPIES = 8 * (SB / 16); /* 64 (NVFP4) or 32 (MXFP8): whole warps */
    if (threadIdx.x < SCOPIES) {
        const int i = threadIdx.x / (SB / 16), o = (threadIdx.x % (SB / 16)) * 16;
        const m3_linear *W = tile_mat(i);
        ssrc = W->scale + (size_t)min(tile_idx(i), ntile - 1) * 16 * W->scale_row + o;
        sdst = 8 * WB + i * SB + o;
    }
#pragma unroll
    for (int j = 0; j < XPT; j++) {
        const int q = threadIdx.x + 256 * j, rr = q >> 4, o = (q & 15) * 16;
        xsrc[j] = (const uint8_t *)(a.xs + (size_t)(r0 + min(rr, ng * 8 - 1)) * a.K) + o;
        xdst[j] = 8 * (WB + SB) + rr * XR + o;
    }
    auto issue = [&](int kl) { /* the slice's stage kl (K block kb0 + kl) */
        const uint32_t st = s0 + (kl % NS) * STAGE;
        const int kb = kb0 + kl;
#pragma unroll
        for (int j = 0; j < VPT; j++) cp_async16(st + vdst[j], vsrc[j] + (size_t)kb * WB);
        if (threadIdx.x < SCOPIES) cp_async16(st + sdst, ssrc + (size_t)kb * SB);
#pragma unroll
        for (int j = 0; j < XPT; j++)
            if (NG == 0 || (256 * j < NG * 128 && threadIdx.x + 256 * j < NG * 128))
                cp_async16(st + xdst[j], xsrc[j] + (size_t)kb * KS * 2);
    };

    float acc[NU][4];
#pragma unroll
    for (int j = 0; j < NU; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        if (s < NK) issue(s);
        cp_commit();
    }
    for (int kb = 0; kb < NK; kb++) {
        cp_wait<NS - 2>();
        __syncthreads(); /* stage kb landed for every thread; stage kb - 1's slot is free */
        if (kb + NS - 1 < NK) issue(kb + NS - 1);
        cp_commit();
        if (!live) continue;
        const uint32_t st = s0 + (kb % NS) * STAGE; /* kb: the slice's stage */
        const uint32_t sw = st + warp * WB, ss = st + 8 * WB + warp * SB, sx = st + 8 * (WB + SB) + g * XR + 16 * t;
        /* per k16 step pair: the A fragments of both steps first, then each token tile's x chunk and
         * its two MMAs (one x chunk in registers at a time: 8 tiles of 64 tokens fit two CTAs an SM) */
        if (FMT == M3_WF_NVFP4) {
            const uint4 qa = lds128(sw + g * 64 + 16 * t), qb = lds128(sw + (g + 8) * 64 + 16 * t);
            const uint32_t sa = e4m3x2_h2(lds16(ss + g * 8 + 2 * t)), sb = e4m3x2_h2(lds16(ss + (g + 8) * 8 + 2 * t));
            const uint32_t wa[4] = {qa.x, qa.y, qa.z, qa.w}, wb[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
            for (int j = 0; j < 4; j++) { /* x chunk j: k16 steps 2j, 2j + 1; block scale j / 2 */
                uint32_t a[8];
                if (j < 2) {
                    a[0] = hmul2_bc<0>(nv_pair<0>(wa[j]), sa); a[2] = hmul2_bc<0>(nv_pair<1>(wa[j]), sa);
                    a[1] = hmul2_bc<0>(nv_pair<0>(wb[j]), sb); a[3] = hmul2_bc<0>(nv_pair<1>(wb[j]), sb);
                    a[4] = hmul2_bc<0>(nv_pair<2>(wa[j]), sa); a[6] = hmul2_bc<0>(nv_pair<3>(wa[j]), sa);
                    a[5] = hmul2_bc<0>(nv_pair<2>(wb[j]), sb); a[7] = hmul2_bc<0>(nv_pair<3>(wb[j]), sb);
                } else {
                    a[0] = hmul2_bc<1>(nv_pair<0>(wa[j]), sa); a[2] = hmul2_bc<1>(nv_pair<1>(wa[j]), sa);
                    a[1] = hmul2_bc<1>(nv_pair<0>(wb[j]), sb); a[3] = hmul2_bc<1>(nv_pair<1>(wb[j]), sb);
                    a[4] = hmul2_bc<1>(nv_pair<2>(wa[j]), sa); a[6] = hmul2_bc<1>(nv_pair<3>(wa[j]), sa);
                    a[5] = hmul2_bc<1>(nv_pair<2>(wb[j]), sb); a[7] = hmul2_bc<1>(nv_pair<3>(wb[j]), sb);
                }
                if (NG > 0) { /* tiles in pairs: both first k16 steps, then both second ones (no two MMAs in a
                                 row on one sum, and only two tiles' x in registers) */
#pragma unroll
                    for (int n = 0; n < NU; n += 2) {
                        const uint4 x0 = lds128(sx + n * 8 * XR + 64 * j);
                        const uint4 x1 = n + 1 < NU ? lds128(sx + (n + 1) * 8 * XR + 64 * j) : x0;
                        mma16816(acc[n], a[0], a[1], a[2], a[3], x0.x, x0.y);
                        if (n + 1 < NU) mma16816(acc[n + 1], a[0], a[1], a[2], a[3], x1.x, x1.y);
                        mma16816(acc[n], a[4], a[5], a[6], a[7], x0.z, x0.w);
                        if (n + 1 < NU) mma16816(acc[n + 1], a[4], a[5], a[6], a[7], x1.z, x1.w);
                    }
                } else {
#pragma unroll
                    for (int n = 0; n < NU; n++)
                        if (n < ng) {
                            const uint4 xv = lds128(sx + n * 8 * XR + 64 * j);
                            mma16816(acc[n], a[0], a[1], a[2], a[3], xv.x, xv.y);
                            mma16816(acc[n], a[4], a[5], a[6], a[7], xv.z, xv.w);
                        }
                }
            }
        } else {
            const uint32_t ea4 = lds32(ss + g * 4), eb4 = lds32(ss + (g + 8) * 4);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const uint2 qa = lds64(sw + u * 512 + g * 32 + 8 * t), qb = lds64(sw + u * 512 + (g + 8) * 32 + 8 * t);
                const uint32_t a[8] = {e4m3x2_h2(qa.x & 0xffffu), e4m3x2_h2(qb.x & 0xffffu), e4m3x2_h2(qa.x >> 16),
                                       e4m3x2_h2(qb.x >> 16),     e4m3x2_h2(qa.y & 0xffffu), e4m3x2_h2(qb.y & 0xffffu),
                                       e4m3x2_h2(qa.y >> 16),     e4m3x2_h2(qb.y >> 16)};
                const float fa = e8_byte(ea4, u), fb = e8_byte(eb4, u);
#pragma unroll
                for (int n = 0; n < NU; n++)
                    if (NG > 0 || n < ng) {
                        const uint4 xv = lds128(sx + n * 8 * XR + 64 * u);
                        float p[4] = {0.f, 0.f, 0.f, 0.f}; /* the unit's sums, times its E8M0 scales */
                        mma16816(p, a[0], a[1], a[2], a[3], xv.x, xv.y);
                        mma16816(p, a[4], a[5], a[6], a[7], xv.z, xv.w);
                        acc[n][0] += p[0] * fa;
                        acc[n][1] += p[1] * fa;
                        acc[n][2] += p[2] * fb;
                        acc[n][3] += p[3] * fb;
                    }
            }
        }
    }

    /* epilogue: this lane's values: rows g, g + 8 of the warp's tile, staged rows r0 + 8n + 2t (+ 1) */
    const m3_linear *Wm = tile_mat(warp);
    const float gm = FMT == M3_WF_NVFP4 ? Wm->gmul * 16384.0f : 1.0f; /* nv_pair: x 2^-14 */
    if (MODE != 1) {
        if (!live) return;
        const int n0 = tile_idx(warp) * 16;
        float *y = MODE == 0 ? y0 : a.ye;
#pragma unroll
        for (int n = 0; n < NU; n++) {
            if (n >= ng) break;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                /* staged row r: MODE 0 token r (times its 2^-s), MODE 2 the slot rowmap[r] (times h's 2^-s) */
                const int r = r0 + 8 * n + 2 * t + (i & 1);
                const int dst = MODE == 0 ? (r < a.T ? r : -1) : __ldg(a.rowmap + r);
                if (dst >= 0) y[(size_t)dst * a.N + n0 + g + 8 * (i >> 1)] = acc[n][i] * gm * (MODE == 0 ? __ldg(a.xsc + r) : a.hsc);
            }
        }
        return;
    }
    /* MODE 1: the gate warps hand their sums to the up warps of the same rows */
    cp_wait<0>();
    __syncthreads(); /* every stage read: the ring becomes the exchange buffer */
    float *xbuf = (float *)sm;
    if (warp < 4) {
#pragma unroll
        for (int n = 0; n < NU; n++)
            if (n < ng)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    xbuf[((warp * NT + n) * 4 + i) * 32 + lane] = acc[n][i] * gm * __ldg(a.xsc + r0 + 8 * n + 2 * t + (i & 1));
    }
    __syncthreads();
    if (warp < 4) return;
    const int f0 = c * 64 + (warp - 4) * 16;
#pragma unroll
    for (int n = 0; n < NU; n++) {
        if (n >= ng) break;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = r0 + 8 * n + 2 * t + (i & 1);
            const float gt = xbuf[(((warp - 4) * NT + n) * 4 + i) * 32 + lane], up = acc[n][i] * gm * __ldg(a.xsc + r);
            const float h = swiglu_oai(gt, up, a.alpha, a.limit);
            const int f = f0 + g + 8 * (i >> 1);
            const int pos = a.perm_h ? (f & ~127) | (((f >> 3) & 3) << 5) | (((f >> 5) & 3) << 3) | (f & 7) : f;
            a.hs[(size_t)r * a.N + pos] = __half_as_ushort(__float2half_rn(__bfloat162float(__float2bfloat16_rn(h)) * a.hmul));
        }
    }
}

/* ft_tile for the tile's ng token tiles: a loop of its own for each count up to 4 (the MoE's segments
 * and the linears' groups of 2 / 4 tiles), and for a full group of 8; the run-time count otherwise */
template <int FMT, int NT, int MODE, int NS>
static __device__ __forceinline__ void ft_tile_ng(const ft_args &a, uint8_t *sm, int r0, int ng, int c, int kb0, int kb1,
                                                  const m3_mlp_w *m, float *y0) {
    if (ng == NT) return ft_tile<FMT, NT, MODE, NS, NT>(a, sm, r0, ng, c, kb0, kb1, m, y0);
    if constexpr (NT <= 4) { /* ng is 1 .. NT - 1 */
        if (ng == 1) return ft_tile<FMT, NT, MODE, NS, 1>(a, sm, r0, ng, c, kb0, kb1, m, y0);
        if constexpr (NT == 4) {
            if (ng == 2) return ft_tile<FMT, NT, MODE, NS, 2>(a, sm, r0, ng, c, kb0, kb1, m, y0);
            return ft_tile<FMT, NT, MODE, NS, 3>(a, sm, r0, ng, c, kb0, kb1, m, y0);
        }
    } else {
        ft_tile<FMT, NT, MODE, NS, 0>(a, sm, r0, ng, c, kb0, kb1, m, y0);
    }
}

/* The grouped GEMM of one pass (see the top). MODE 0: grid (token groups, row chunks x K slices),
 * the groups of a chunk side by side (they share its weights in L2), or with SK a stream-K grid
 * of any number of CTAs (streamk.h: the (chunk, group) tiles of K / KS blocks each, a partial sum
 * per tile a CTA's range touches, in a.y [part][T][N]); MoE: grid (row chunks, segment bound) */
template <int FMT, int NT, int MODE, int NS = n_stages<NT>(), bool SK = false>
__global__ void __launch_bounds__(256, NT == 2 ? (FMT == M3_WF_NVFP4 ? 4 : 3) : NT == 4 && NS == 3 ? 3 : 2)
    k_ft_gemm(const __grid_constant__ ft_args a) {
    extern __shared__ __align__(128) uint8_t sm[];
    if constexpr (SK) { /* MODE 0 only */
        const int KB = a.K / KS, groups = (a.T + 8 * NT - 1) / (8 * NT), G = (int)gridDim.x;
        const long long W = (long long)((a.N + 127) / 128) * groups * KB, xe = m3_sk_start(W, G, blockIdx.x + 1);
        for (long long x = m3_sk_start(W, G, blockIdx.x); x < xe;) {
            const int u = (int)(x / KB), k0 = (int)(x % KB), k1 = xe - x < KB - k0 ? k0 + (int)(xe - x) : KB;
            const int part = (int)blockIdx.x - m3_sk_owner(W, G, (long long)u * KB);
            const int r0 = (u % groups) * NT * 8, ng = (a.T - r0 + 7) / 8 < NT ? (a.T - r0 + 7) / 8 : NT;
            ft_tile_ng<FMT, NT, MODE, NS>(a, sm, r0, ng, u / groups, k0, k1, NULL, a.y + (size_t)part * a.T * a.N);
            x += k1 - k0;
            if (x < xe) { /* the next tile refills the ring: every thread's reads of it are done */
                cp_wait<0>();
                __syncthreads();
            }
        }
    } else {
        int r0, ng, c, kb0 = 0, kb1 = a.K / KS, ksl = 0;
        const m3_mlp_w *m = NULL;
        if (MODE == 0) {
            r0 = blockIdx.x * NT * 8;
            ng = (a.T - r0 + 7) / 8 < NT ? (a.T - r0 + 7) / 8 : NT;
            c = blockIdx.y / a.ks;
            ksl = blockIdx.y % a.ks;
            kb0 = (int)((long)kb1 * ksl / a.ks);
            kb1 = (int)((long)kb1 * (ksl + 1) / a.ks);
        } else {
            const int si = blockIdx.y;
            if (si >= __ldg(a.seg)) return;
            const int *sp = a.seg + 2 + 3 * si;
            m = &a.tab[__ldg(sp)];
            r0 = __ldg(sp + 1);
            ng = __ldg(sp + 2);
            c = blockIdx.x;
        }
        ft_tile_ng<FMT, NT, MODE, NS>(a, sm, r0, ng, c, kb0, kb1, m, MODE == 0 ? a.y + (size_t)ksl * a.T * a.N : NULL);
    }
}

/* the kernel's shared-memory attribute, set in each device's context (tensor parallel ranks: one per
 * GPU, on threads of their own), and the CTAs an SM holds there (registers and shared memory); 0 on
 * failure */
template <int FMT, int NT, int MODE, int NS = n_stages<NT>(), bool SK = false> static int prepare(m3_cuda *c) {
    constexpr int smem = NS * stage_bytes<FMT, NT>();
    static int nb[64];
    static unsigned long long set; /* devices whose context has the attribute */
    const unsigned long long bit = 1ull << (c->dev & 63);
    if (!(__atomic_load_n(&set, __ATOMIC_ACQUIRE) & bit)) {
        if (CK(c, cudaFuncSetAttribute(k_ft_gemm<FMT, NT, MODE, NS, SK>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem))) return 0;
        int n = 0;
        if (CK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_ft_gemm<FMT, NT, MODE, NS, SK>, 256, smem))) return 0;
        nb[c->dev & 63] = n > 0 ? n : 1;
        __atomic_fetch_or(&set, bit, __ATOMIC_RELEASE);
    }
    return nb[c->dev & 63];
}

template <int FMT, int NT, int MODE, int NS = n_stages<NT>(), bool SK = false>
static int launch(m3_cuda *c, const ft_args &a, int gx, int gy) {
    if (!prepare<FMT, NT, MODE, NS, SK>(c)) return -1;
    k_ft_gemm<FMT, NT, MODE, NS, SK><<<dim3(gx, gy), 256, NS * stage_bytes<FMT, NT>(), c->st>>>(a);
    return CK_LAUNCH(c, "gemm_ft") ? -1 : 0;
}

/* y[i] = the slices' partial sums part[k][i], added in slice order */
__global__ void k_ft_sum_slices(const float *part, int ks, size_t n, float *y) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = part[i];
        for (int k = 1; k < ks; k++) v += part[(size_t)k * n + i];
        y[i] = v;
    }
}

/* y[i] = the stream-K partial sums of element i (token t, row n: tile (chunk n / 128, group t / tg)),
 * added in the order of the G CTAs that made them */
__global__ void k_ft_sum_sk(const float *part, int T, int N, int tg, int KB, int G, float *y) {
    const size_t n = (size_t)T * N;
    const int groups = (T + tg - 1) / tg;
    const long long W = (long long)((N + 127) / 128) * groups * KB;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(i / N), r = (int)(i % N), u = (r / 128) * groups + t / tg;
        const int np = m3_sk_owner(W, G, (long long)u * KB + KB - 1) - m3_sk_owner(W, G, (long long)u * KB) + 1;
        float v = part[i];
        for (int k = 1; k < np; k++) v += part[(size_t)k * n + i];
        y[i] = v;
    }
}

/* a linear's launch (MODE 0) for its format (nv: NVFP4, else MXFP8) and token tiles per group; SK: the
 * stream-K kernel (a grid of gx CTAs), else the slices' (gx token groups, gy row chunks x slices) */
template <bool SK> static int launch_linear(m3_cuda *c, const ft_args &a, int nv, int nt, int gx, int gy) {
    if (nv)
        return nt == 2 ? launch<M3_WF_NVFP4, 2, 0, n_stages<2>(), SK>(c, a, gx, gy)
               : nt == 4 ? launch<M3_WF_NVFP4, 4, 0, n_stages<4>(), SK>(c, a, gx, gy)
                         : launch<M3_WF_NVFP4, 8, 0, n_stages<8>(), SK>(c, a, gx, gy);
    return nt == 2 ? launch<M3_WF_MXFP8, 2, 0, n_stages<2>(), SK>(c, a, gx, gy) : launch<M3_WF_MXFP8, 4, 0, n_stages<4>(), SK>(c, a, gx, gy);
}

/* CTAs of the linear kernel for (format, tiles) an SM holds */
static int ft_ctas(m3_cuda *c, int nv, int nt) {
    if (nv) return nt == 2 ? prepare<M3_WF_NVFP4, 2, 0>(c) : nt == 4 ? prepare<M3_WF_NVFP4, 4, 0>(c) : prepare<M3_WF_NVFP4, 8, 0>(c);
    return nt == 2 ? prepare<M3_WF_MXFP8, 2, 0>(c) : prepare<M3_WF_MXFP8, 4, 0>(c); /* MXFP8 takes 2 or 4 (m3_cu_linear_ft) */
}

} // namespace

int m3_cu_moe_ft_ok(const m3_mlp_w *e0) {
    const m3_linear *g = &e0->gate, *u = &e0->up, *d = &e0->down;
    const m3_linear *ms[3] = {g, u, d};
    if (g->fmt != M3_WF_NVFP4 && g->fmt != M3_WF_MXFP8) return 0;
    for (int i = 0; i < 3; i++) {
        const m3_linear *W = ms[i];
        const int nv = W->fmt == M3_WF_NVFP4;
        if (W->fmt != g->fmt || !W->tiled || !W->w || !W->scale || W->N % 16 || W->K % KS) return 0;
        if (W->row_bytes != (size_t)W->K / (nv ? 2 : 1) || W->scale_row != (size_t)W->K / (nv ? 16 : 32)) return 0;
        if (((uintptr_t)W->w & 15) || ((uintptr_t)W->scale & 15)) return 0;
    }
    return g->N == u->N && g->K == u->K && g->N % 64 == 0 && d->K == g->N;
}
/* h is staged in f16 by a bound that needs a finite SwiGLU-OAI limit and alpha > 0; kept to realistic
 * values (M3: 1.702, 7) so that the bound stays within 2^15 of h's values that matter */
int m3_cu_moe_ft_act_ok(float alpha, float limit) { return alpha >= 0.1f && limit > 0.0f && limit <= 100.0f; }

int m3_cu_linear_ft_ok(const m3_linear *W) {
    if (!W || (W->fmt != M3_WF_NVFP4 && W->fmt != M3_WF_MXFP8) || !W->tiled || !W->w || !W->scale) return 0;
    const int nv = W->fmt == M3_WF_NVFP4;
    if (W->N % 16 || W->K % KS || W->row_bytes != (size_t)W->K / (nv ? 2 : 1) || W->scale_row != (size_t)W->K / (nv ? 16 : 32))
        return 0;
    return !((uintptr_t)W->w & 15) && !((uintptr_t)W->scale & 15);
}

int m3_cu_linear_ft(m3_cuda *c, int n, const m3_linear *const *W, const float *x, int T, float *const *y) {
    /* token tiles per group: 2 up to 16 tokens, else 4; NVFP4 8 above 32 (one group of 64 tokens expands
     * each weight once: 8192 x 6144 at 64 tokens 60.3 -> 48.4 us; MXFP8, whose expansion is one convert
     * per pair, got slower: 59.3 -> 62.0 us, 12288 x 6144 75.3 -> 95.3 us) */
    const int K = W[0]->K, nv = W[0]->fmt == M3_WF_NVFP4, nt = T <= 16 ? 2 : T <= 32 || !nv ? 4 : 8, rows = (T + 7) / 8 * 8;
    uint16_t *xs = (uint16_t *)m3_cu_scratch(c, SC_GEMM_X, (size_t)rows * K * 2 + (size_t)rows * 4 + 256);
    if (!xs) return -1;
    float *xsc = (float *)(xs + (size_t)rows * K);
    const int perm = nv;
    if ((uintptr_t)x & 15) return m3_cu_failf(c, "gemm_ft: x is not 16-byte aligned"), -1;
    for (int i = 1; i < n; i++)
        if (W[i]->fmt != W[0]->fmt || W[i]->K != K) return m3_cu_failf(c, "gemm_ft: matrices of one input differ"), -1;
    ft_stage(c, x, K, NULL, NULL, T, perm, xs, xsc);
    if (CK_LAUNCH(c, "gemm_ft stage")) return -1;
    for (int i = 0; i < n; i++) {
        ft_args a;
        memset(&a, 0, sizeof a);
        a.W = *W[i];
        a.T = T;
        a.xs = xs;
        a.xsc = xsc;
        a.K = K;
        a.N = W[i]->N;
        /* K slices so that the CTAs fill the GPU in one wave (a second, partial wave cost more than it
         * gave: 9 slices of 8192 x 6144 at 16 tokens, 576 CTAs for 528 places), each slice at least 4
         * stages (512 values) */
        const int groups = (T + 8 * nt - 1) / (8 * nt), chunks = (a.N + 127) / 128, KB = K / KS;
        const long slots = (long)c->sm_count * ft_ctas(c, perm, nt);
        long ks = slots / ((long)groups * chunks);
        if (ks > KB / 4) ks = KB / 4;
        if (ks < 1) ks = 1;
        a.ks = (int)ks;
        a.y = y[i];
        /* stream-K where the slices leave over 15% of the wave's places empty and each CTA still gets
         * 4+ K blocks (M3_FT_SK=0: slices). H200, 64 tokens, MXFP8 (192 CTAs for 264 places): 6144 x
         * 8192 66.5 -> 58.0 us, 12288 x 6144 89.4 -> 79.0; NVFP4 6144 x 8192 at 240 of 264 places
         * got slower (39.6 -> 44.7 us), hence the 15% */
        static int sk_on = -1;
        if (sk_on < 0) sk_on = m3_cu_env_int("M3_FT_SK", 1) != 0;
        const long tiles = (long)groups * chunks;
        const int sk = sk_on && tiles * ks * 20 < slots * 17 && tiles * KB >= 4 * slots ? (int)slots : 0;
        const int parts = sk ? m3_sk_max_parts((int)tiles, KB, sk) : (int)ks;
        if (parts > 1 && !(a.y = (float *)m3_cu_scratch(c, SC_SPLITK, sizeof(float) * (size_t)parts * T * a.N))) return -1;
        if (sk ? launch_linear<true>(c, a, perm, nt, sk, 1) : launch_linear<false>(c, a, perm, nt, groups, chunks * (int)ks)) return -1;
        const size_t m = (size_t)T * a.N;
        if (sk) {
            k_ft_sum_sk<<<cdiv(m, 256) < 4096 ? cdiv(m, 256) : 4096, 256, 0, c->st>>>(a.y, T, a.N, 8 * nt, KB, sk, y[i]);
            if (CK_LAUNCH(c, "gemm_ft stream-K sums")) return -1;
        } else if (ks > 1) {
            k_ft_sum_slices<<<cdiv(m, 256) < 4096 ? cdiv(m, 256) : 4096, 256, 0, c->st>>>(a.y, ks, m, y[i]);
            if (CK_LAUNCH(c, "gemm_ft slices")) return -1;
        }
    }
    return 0;
}

/* tiles a segment holds: 2 while the experts average up to 8 slots, else 4 */
static int ft_nt(long long S, int E) {
    const int f = m3_cu_env_int("M3_MOE_FT_NT", 0); /* 2 or 4 forces one (measurements) */
    return f == 2 || f == 4 ? f : S <= 8LL * E ? 2 : 4;
}

size_t m3_cu_moe_ft_work(int T, int K, int E, int H, int F) {
    const long long S = (long long)T * K, nz = S < E ? S : E;
    const long long rows = S + 7 * nz, segs = nz + rows / (8 * ft_nt(S, E)) + 1;
    return ((size_t)(2 + 3 * segs + 3 * rows) * sizeof(int) + 255) / 256 * 256 + (size_t)rows * (H + F) * 2 + 256;
}

int m3_cu_moe_ft(m3_cuda *c, const m3_mlp_w *tab, const m3_mlp_w *e0, const float *x, int T, int K, int E,
                            const int32_t *pick, void *work, float alpha, float limit, float *ye) {
    const int H = e0->gate.K, F = e0->gate.N;
    const long long S = (long long)T * K, nz = S < E ? S : E;
    const int nt = ft_nt(S, E);
    /* NVFP4 segments of 4 tiles in a 3-stage ring: 3 CTAs an SM instead of 2 (the MoE op at 256 / 512
     * tokens 1.896 / 2.875 -> 1.808 / 2.745 ms; M3_MOE_FT_NS=4: the 4-stage ring) */
    static int ns3 = -1;
    if (ns3 < 0) ns3 = m3_cu_env_int("M3_MOE_FT_NS", 3) == 3;
    const int rows = (int)(S + 7 * nz), maxseg = (int)(nz + rows / (8 * nt) + 1);
    int *seg = (int *)work, *map = seg + 2 + 3 * maxseg, *rowmap = map + rows;
    float *xsc = (float *)(rowmap + rows);
    uint16_t *xs = (uint16_t *)((uint8_t *)work + ((size_t)(2 + 3 * maxseg + 3 * rows) * sizeof(int) + 255) / 256 * 256);
    uint16_t *hs = xs + (size_t)rows * H;
    const int nv = e0->gate.fmt == M3_WF_NVFP4;
    k_ft_layout<<<1, 1024, sizeof(int) * (4 * (size_t)E + 2), c->st>>>(pick, (int)S, K, E, nt, map, rowmap, seg);
    if (CK_LAUNCH(c, "gemm_ft moe layout")) return -1;
    ft_stage(c, x, H, map, seg, rows, nv, xs, xsc);
    if (CK_LAUNCH(c, "gemm_ft moe stage")) return -1;
    ft_args a;
    memset(&a, 0, sizeof a);
    a.tab = tab;
    a.seg = seg;
    a.rowmap = rowmap;
    a.alpha = alpha;
    a.limit = limit;
    a.xs = xs;
    a.xsc = xsc;
    /* h staged as f16 times 2^(15 - he), 2^he > 2 bound: |h| <= (limit + 1) max(limit, 0.28 / alpha)
     * (SwiGLU-OAI clamps g above and u both ways; g sigmoid(alpha g) >= -0.2785 / alpha) */
    const float gb = 0.28f / alpha > limit ? 0.28f / alpha : limit;
    int he = 0;
    frexpf(2.0f * (limit + 1.0f) * gb, &he);
    a.hmul = ldexpf(1.0f, 15 - he);
    a.hsc = ldexpf(1.0f, he - 15);
    a.K = H;
    a.N = F;
    a.perm_h = e0->down.fmt == M3_WF_NVFP4;
    a.hs = hs;
    int rc;
    if (nv) rc = nt == 2 ? launch<M3_WF_NVFP4, 2, 1>(c, a, F / 64, maxseg)
                 : ns3 ? launch<M3_WF_NVFP4, 4, 1, 3>(c, a, F / 64, maxseg) : launch<M3_WF_NVFP4, 4, 1>(c, a, F / 64, maxseg);
    else rc = nt == 2 ? launch<M3_WF_MXFP8, 2, 1>(c, a, F / 64, maxseg) : launch<M3_WF_MXFP8, 4, 1>(c, a, F / 64, maxseg);
    if (rc) return -1;
    a.xs = hs;
    a.K = F;
    a.N = e0->down.N;
    a.ye = ye;
    const int dch = (a.N + 127) / 128;
    if (nv) rc = nt == 2 ? launch<M3_WF_NVFP4, 2, 2>(c, a, dch, maxseg)
                 : ns3 ? launch<M3_WF_NVFP4, 4, 2, 3>(c, a, dch, maxseg) : launch<M3_WF_NVFP4, 4, 2>(c, a, dch, maxseg);
    else rc = nt == 2 ? launch<M3_WF_MXFP8, 2, 2>(c, a, dch, maxseg) : launch<M3_WF_MXFP8, 4, 2>(c, a, dch, maxseg);
    return rc;
}
