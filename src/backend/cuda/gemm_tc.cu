/* Tensor-core GEMM for prefill and large batches (issue 25): y[T][N] = x[T][K] W^T on Hopper's
 * warpgroup MMA (wgmma.mma_async, sm_90a), for BF16, MXFP8 and NVFP4 weights as the backend
 * uploads them (gemm_tc.h has the C API).
 *
 * Roles. The weights are the MMA's A operand (M = weight rows), the tokens its B operand
 * (N = tokens): D[n][t] = sum_k W[n][k] x[t][k], so A can come from REGISTERS, where each
 * thread expands its own weights to bf16 (the way Machete / mixed-input CUTLASS do), and only
 * bf16 x goes through shared memory in the wgmma's canonical layout.
 *
 * CTA tile: 128 weight rows x BN tokens (BN = 128, or 16 / 32 / 64 for fewer tokens: the
 * smallest that holds them; 192 for MXFP8 / NVFP4 and 256 for NVFP4 where they take less time:
 * bn_for; MoE tiles by the average expert's rows, an expert's rows past its full tiles one "rest"
 * tile of 64, 128 or 192 rows: gemm_tiles.h, moe.cu), K in blocks of 128. BN 192 runs one n192
 * wgmma a k16 step (wgmma_tile; M3_GEMM_TC_N192=0: an n128 and an n64 on the same A registers).
 * BN 256: an n256 wgmma, 128 accumulators a thread, the registers moved from the producers to the
 * consumers by setmaxnreg (MXFP8 at 256: in half stages).
 * 384 threads: warps 4-11 are two consumer warpgroups of 64 rows each
 * (warp w of a consumer group owns one 16-row tile of the backend's tiled layout); warps 0-3
 * (warpgroup 0) are the producers. Grid: one CTA per output tile, the
 * row tiles in groups of 8 with the token tiles inside each group (L2 reuse of both operands).
 *
 * Pipeline: STAGES shared-memory stages (BN 128: BF16 3, MXFP8 4, NVFP4 5; BN 64: 4, 6, 8, at two
 * CTAs an SM -, 3, 4; BN 192: -, 3, 3; BN 256: -, -, 3), each holding one 128-wide K block (or
 * half stages, hs_nx: x in a ring of half K blocks, the weights in a ring of their own: MXFP8 at
 * BN 256 (5 halves); half_stages): x (BN x 128 bf16), the raw weight bytes of the 128 rows and
 * their scales. The 4 producer warps fill a stage with 1-D bulk copies (cp.async.bulk ...
 * mbarrier::complete_tx; the tiled MXFP8 / NVFP4 layout is already made of contiguous runs), BF16
 * weights (row-major: one 256-byte run a row) by two tensor-map copies of 128 rows x 64 values,
 * 128-byte swizzled (128 row copies a stage made the producers the bottleneck: the lm_head ran at
 * 39% of the BF16 peak), a quarter of the copies each (a warp issues its lanes' copies one after another), on a
 * full barrier (one arrive.expect_tx per producer warp); consumer warps release it on
 * an empty barrier once the wgmmas that read it have completed. Per K block a consumer does two
 * halves of 4 k16 steps: expand the half's A fragments into registers, wgmma.fence, 4 x wgmma
 * m64nBNk16, commit; while they run it loads the next half's raw bytes from shared memory. MXFP8
 * / NVFP4 keep two A buffers (one per half) and wait_group 1, so a half's expansion overlaps the
 * previous half's wgmmas; BF16, which has nothing to expand, loads after a wait_group 0. Never
 * redefining the registers of an in-flight wgmma is what keeps ptxas from serializing every
 * wgmma (C7513); the other consumer warpgroup fills the tensor cores meanwhile.
 *
 * The K order inside each 128 block is permuted (both operands alike, so the sum is the same):
 * thread t of a quad, which the wgmma A fragment gives logical columns {2t, 2t+1, 2t+8, 2t+9}
 * of k16 step s, is given physical columns 32t + 4s + {0..3} instead. A thread's weights for a
 * K block are then 32 consecutive values of its row: one E8M0 scale (MXFP8: one 32-value
 * unit), two E4M3 scales (NVFP4: 16 bytes of one tiled unit row), 64 bytes (BF16); the staged
 * x (m3_cu_gemm_tc_stage_x) holds x[t][k] at the matching logical position, rounded to bf16,
 * already in the 128-byte-swizzled K-major layout of a wgmma B operand (8-row x 128-byte atoms,
 * 16-byte chunk c of row r at c ^ (r % 8)), so one bulk copy per 64 tokens x 64 columns lands
 * it ready for the descriptors.
 *
 * Expanding (exact; only the f32 sums round):
 *   BF16   as is.
 *   MXFP8  E4M3 pair -> f16x2 (cvt, exact) -> f32 x 2^(e-127) -> bf16x2: exact while the
 *          product is a bf16 normal, i.e. E8M0 codes 10..246 (m3_cu_gemm_tc_scales_exact on
 *          the host copy says whether a matrix is); the backend keeps codes 0 / 255 row-major,
 *          which this kernel does not take.
 *   NVFP4  E2M1 pair -> bf16x2 bits of value x 2^-126 (nv_bf2: the tiled layout's bit
 *          permutation, shifts and masks) -> one bf16x2 multiply by E4M3 scale x 2^119: the
 *          weight x 2^-7 with at most 6 significant bits, always exact. The f32 global scale
 *          (gmul) and 2^7 multiply the f32 sums in the epilogue.
 * Reference: the CPU's m3_cpu_linear (src/backend/cpu/linear.c) on x rounded to bf16, or the
 * double-precision product of bench/bench_cuda_gemm.c; they differ by f32 summation order only.
 *
 * Taken: BF16 row-major, MXFP8 / NVFP4 tiled (N % 16 == 0, K % 128 == 0), K % 128 == 0; any
 * T and N (ragged tiles are masked: rows / tokens past the end are never stored, and the
 * staged x is zero-padded to 64 tokens). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/gemm_tiles.h"
#include "formats.cuh"
#include "gemm_tc.h"
#include "ptx.cuh"
#include "swiglu.cuh"
#include "tmap.cuh"
#include "wgmma.cuh"

namespace {

/* MXFP8 expanded by bit placement (e4_bits: 4 instructions a pair instead of the cvt path's ~7),
 * for matrices whose E8M0 codes are all <= 134 (m3_linear.scale_max; mx_bits); everything but the
 * expansion is MXFP8's */
constexpr int FMT_MXB = 100;
__host__ __device__ constexpr int fmt_of(int f) { return f == FMT_MXB ? (int)M3_WF_MXFP8 : f; }

constexpr int BM = 128;        /* weight rows per CTA */
constexpr int BK = 128;        /* K per stage */
constexpr int NTHREADS = 384;  /* producer warpgroup + 2 consumer warpgroups */
constexpr int SMEM_MAX = 232448; /* 227 KiB opt-in per block on sm_90 */
constexpr int XPIECE = 64 * 128; /* bytes of one staged piece: 64 tokens x 64 columns (bf16) */

/* bytes of the raw weights / scales of one stage */
constexpr int MX_TILE = 4 * 512 + 128; /* MXFP8: 4 units of 16 rows x 32 bytes, unit u at u*512 + pad(u) */
constexpr int BF_ROW = 256 + 16;       /* BF16: a row's 128 values, padded */
__host__ __device__ constexpr int w_bytes(int fmt) { return fmt == M3_WF_BF16 ? BM * BF_ROW : fmt == M3_WF_MXFP8 ? 8 * MX_TILE : 8 * 1024; }
__host__ __device__ constexpr int s_bytes(int fmt) { return fmt == M3_WF_BF16 ? 0 : fmt == M3_WF_MXFP8 ? 8 * 64 : 8 * 128; }
__host__ __device__ constexpr int stage_bytes(int fmt, int bn) { return (bn * 256 + w_bytes(fmt) + s_bytes(fmt) + 1023) / 1024 * 1024; }
/* stages of a CTA when cps CTAs share an SM (each keeps 1 KB for the driver) */
__host__ __device__ constexpr int n_stages(int fmt, int bn, int cps = 1) {
    return ((SMEM_MAX + 1024) / cps - 1024 - 1024 - 256) / stage_bytes(fmt, bn) > 8
               ? 8
               : ((SMEM_MAX + 1024) / cps - 1024 - 1024 - 256) / stage_bytes(fmt, bn);
}
__host__ __device__ constexpr int smem_bytes(int fmt, int bn, int cps = 1) {
    return n_stages(fmt, bn, cps) * stage_bytes(fmt, bn) + 1024 + 256;
}
/* Half stages (HS; by default MXFP8 tiles of 256 tokens, half_stages): two rings instead of one.
 * The x ring holds half K blocks (BN x 64 bf16: the column half a consumer's half reads), the w
 * ring whole K blocks of weights and scales (a consumer loads a block's raw bytes into registers
 * during the half before it and the block's first half, then hands the slot back). A stage of x is
 * then released a half earlier, and more of x fits: MXFP8 at 256 tokens 5 halves (2.5 blocks)
 * against 2 whole stages of 82 KB. */
__host__ __device__ constexpr int w_slot(int fmt) { return (w_bytes(fmt) + s_bytes(fmt) + 1023) / 1024 * 1024; }
/* x halves with nw weight slots (at most 8) */
__host__ __device__ constexpr int hs_nx_w(int fmt, int bn, int nw) {
    return (SMEM_MAX - 1280 - nw * w_slot(fmt)) / (bn * 128) > 8 ? 8 : (SMEM_MAX - 1280 - nw * w_slot(fmt)) / (bn * 128);
}
/* weight slots: 3 where the third costs no x half, else 2. The producers fill a block's weights
 * before its x halves, so the weight ring's lead (about 2 halves a slot) also bounds the x ring's:
 * with 2 slots, halves past the fifth would stay empty */
__host__ __device__ constexpr int hs_nw(int fmt, int bn) { return hs_nx_w(fmt, bn, 3) == hs_nx_w(fmt, bn, 2) ? 3 : 2; }
__host__ __device__ constexpr int hs_nx(int fmt, int bn) { return hs_nx_w(fmt, bn, hs_nw(fmt, bn)); }
__host__ __device__ constexpr int hs_smem(int fmt, int bn) { return hs_nx(fmt, bn) * bn * 128 + hs_nw(fmt, bn) * w_slot(fmt) + 1024 + 256; }
static_assert(hs_nx(M3_WF_MXFP8, 256) == 5 && hs_nx(M3_WF_NVFP4, 256) == 6 && hs_nx(M3_WF_MXFP8, 192) == 7 &&
                  hs_nw(M3_WF_MXFP8, 256) == 3,
              "half stages");
static_assert(hs_smem(M3_WF_MXFP8, 256) <= SMEM_MAX && hs_smem(M3_WF_NVFP4, 256) <= SMEM_MAX && 2 * (8 + 3) * 8 <= 256,
              "half stages: shared memory");
static_assert(n_stages(M3_WF_NVFP4, 16, 2) >= 4 && n_stages(M3_WF_MXFP8, 32, 2) >= 4, "two CTAs an SM");
static_assert(n_stages(M3_WF_BF16, 128) >= 3 && n_stages(M3_WF_MXFP8, 128) >= 4 && n_stages(M3_WF_NVFP4, 128) >= 4, "stages");

struct gemm_args {
    const uint8_t *w, *s; /* device weights (values, scales) */
    size_t row_bytes, scale_row;
    const uint8_t *xs;    /* staged x */
    float *y;
    int N, K, T, nm, nt;  /* nm / nt: row / token tiles */
    int ksplit;           /* K slices (plain linears): each CTA sums K / ksplit into part[slice] */
    float *part;          /* ksplit > 1: [ksplit][T][N] partial sums, added by k_sum_slices */
    float gmul;
    /* MoE grouped mode (m3_cu_gemm_tc_moe): 0 off; 1 gate + up of each tile's expert with
     * SwiGLU-OAI (a CTA's rows: 64 gate rows and the same 64 up rows; y = h [T][N = F]); 2 down
     * (y rows scattered by rowmap). Token tile tt is tiles[2 tt] (its first staged row) of expert
     * tiles[2 tt + 1], for tt < ntile[0] (gemm_tc.h). */
    int mode;
    const m3_mlp_w *tab;
    const int *tiles, *ntile, *rowmap;
    float alpha, limit;
    int spread; /* producer copies dealt round-robin over the 4 producer warps (launch_args; M3_GEMM_TC_SPREAD=0: in order) */
    int mxb;    /* MXFP8: every matrix's E8M0 codes <= 134, expanded by bit placement (FMT_MXB; mx_bits;
                 * taken by tiles of 128+ tokens, the prefill's: launch_args) */
    /* BF16 linears (mode 0): a stage's 128 x 128 weights as two tensor-map copies of 128 rows x 64
     * values with the 128-byte swizzle (tma set), instead of 128 row copies of 256 bytes */
    int tma;
    CUtensorMap tmap;
};

/* ------------------------------------------------------------------ PTX wrappers (mbarriers, wgmma's
 * fence / commit / wait, setmaxnreg: wgmma.cuh) */

/* a 2-D box of the tensor map at (c0 innermost, c1) -> shared dst (1024-aligned for the swizzle), completing on bar */
static __device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
/* the warpgroup's registers a thread (multiple of 8): given back by the producers, taken by the
 * consumers, where moved_regs: BN 256 (128 accumulators a thread) and BN 64 at two CTAs an SM (the
 * launch's 80 would serialize its wgmmas, C7512). The launch gives each thread launch_regs (65536 /
 * 384 / CPS rounded down to 8: 168, 80); the consumers' setmaxnreg.inc waits until the CTA's pool
 * holds what it asks for, so the two must balance that launch count exactly (asserted here, and
 * the kernel's count by the host) */
__host__ __device__ constexpr bool moved_regs(int bn, int cps) { return bn == 256 || (bn == 64 && cps == 2); }
__host__ __device__ constexpr int launch_regs(int cps) { return 65536 / NTHREADS / cps / 8 * 8; }
__host__ __device__ constexpr int producer_regs(int cps) { return cps == 1 ? 56 : 48; }
__host__ __device__ constexpr int consumer_regs(int cps) { return cps == 1 ? 224 : 96; }
static_assert(launch_regs(1) == 168 && 128 * producer_regs(1) + 256 * consumer_regs(1) == NTHREADS * launch_regs(1) &&
                  launch_regs(2) == 80 && 128 * producer_regs(2) + 256 * consumer_regs(2) == NTHREADS * launch_regs(2),
              "setmaxnreg: the CTA's registers");
/* wgmma B descriptor: K-major, 128-byte swizzle (8-row atoms of 1024 bytes, SBO 1024; LBO unused
 * for this layout), start address a (16-byte units, 18-bit shared window). desc_lo: its low word
 * (the high word is constant; desc_of: the whole), so that a tile's k16 steps and token pieces cost
 * an add each: desc_lo(a + n) = desc_lo(a) + n / 16 for n a multiple of 16 (a CTA's shared
 * addresses stay below 2^18, so the start field never carries into the next) */
static __device__ __forceinline__ uint32_t desc_lo(uint32_t a) { return ((a & 0x3ffffu) >> 4) | (1u << 16); }
static __device__ __forceinline__ uint64_t desc_of(uint32_t lo) { return (uint64_t)lo | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62); }
/* the wgmma wrappers of each N (16 .. 256): wgmma.cuh */

/* ------------------------------------------------------------------ weight expansion */

/* f16x2 bits times sc -> bf16x2 */
static __device__ __forceinline__ uint32_t h2_bf2(uint32_t h, float sc) {
    __half2_raw r;
    r.x = (unsigned short)(h & 0xffffu);
    r.y = (unsigned short)(h >> 16);
    const float2 f = __half22float2(__half2(r));
    return bf16x2_rn(f.x * sc, f.y * sc);
}
/* two E4M3 bytes (low byte = lower column) times sc -> bf16x2 */
static __device__ __forceinline__ uint32_t e4_bf2(uint32_t two, float sc) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return h2_bf2((uint32_t)h.x | ((uint32_t)h.y << 16), sc);
}
/* E8M0 code 1..254 -> 2^(e-127) */
static __device__ __forceinline__ float e8_f32(uint32_t b) { return __uint_as_float(b << 23); }
/* MXFP8 by bit placement (FMT_MXB): E4M3 bytes P and P + 1 of w (P = 0 or 2) as the bf16x2 bits of
 * value x 2^-120: the sign to bit 15, exponent and mantissa to bits 4..10 (bf16's exponent field
 * then holds E4M3's, its mantissa E4M3's 3 bits: exact, subnormals included; the NaN codes 0x7f /
 * 0xff become finite). prmt copies each byte and replicates its sign into the byte above it. */
template <int P> static __device__ __forceinline__ uint32_t e4_bits(uint32_t w) {
    uint32_t p;
    asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(p) : "r"(w), "n"(P == 0 ? 0x9180 : 0xB3A2));
    return (p << 4) & 0x87F087F0u;
}
/* E8M0 code e (1..134) -> 2^(e-7) as bf16x2 (both halves): times e4_bits' value, the weight
 * E4M3 x 2^(e-127), exact while a bf16 normal (codes 10..; below, rounded as the cvt path does) */
static __device__ __forceinline__ uint32_t e8_bits_bf2(uint32_t e) {
    const uint32_t h = (e + 120u) << 7;
    return h | (h << 16);
}
/* The raw weight bytes of k16 steps 4h..4h+3 of the warp's 16-row tile i for lane (g, t):
 * rows g and g + 8, physical columns 32t + 16h .. 32t + 16h + 15 of the K block (permuted
 * order, see the top), and their scales. Loaded while the previous half's wgmmas run. */
struct raw_frag {
    uint4 a, b, c, d;
    uint32_t s0, s1;
};
/* shared-memory loads by 32-bit shared address: ptx.cuh */
template <int FMT>
static __device__ __forceinline__ void load_raw(uint32_t W, uint32_t S, int i, int g, int t, int h, raw_frag &r, bool sw = false) {
    if (FMT == M3_WF_MXFP8) {
        /* tile i: [unit 4][16 rows][32 bytes], unit u at u*512 + pad(u), pad = 0, 16, 64, 80 (the
         * 16-byte loads of lanes g = 0, 1 x t = 0..3 then hit 8 different bank groups) */
        const uint32_t u = W + i * MX_TILE + t * 512 + (t & 1) * 16 + (t >> 1) * 64 + 16 * h;
        r.a = lds128(u + g * 32);
        r.b = lds128(u + (g + 8) * 32);
        r.s0 = lds8(S + i * 64 + g * 4 + t);
        r.s1 = lds8(S + i * 64 + (g + 8) * 4 + t);
    } else if (FMT == M3_WF_NVFP4) {
        /* tile i: [16 rows][64 bytes] (one 128-value unit), scales [16 rows][8] */
        const uint32_t u = W + i * 1024 + 16 * t + 8 * h;
        const uint2 q0 = lds64(u + g * 64), q1 = lds64(u + (g + 8) * 64);
        r.a = make_uint4(q0.x, q0.y, q1.x, q1.y);
        r.s0 = lds8(S + i * 128 + g * 8 + 2 * t + h);
        r.s1 = lds8(S + i * 128 + (g + 8) * 8 + 2 * t + h);
    } else if (sw) {
        /* two boxes [128 rows][128 bytes] (columns 0-63, 64-127), 16-byte chunk q of row r at q ^ (r % 8):
         * physical columns 32t + 16h .. + 15 are box t / 2, chunks 4 (t % 2) + 2h and the next */
        const int q = 4 * (t & 1) + 2 * h;
        const uint32_t r0 = W + (t >> 1) * 16384 + (i * 16 + g) * 128, r1 = r0 + 8 * 128;
        r.a = lds128(r0 + ((q ^ g) << 4));
        r.b = lds128(r0 + (((q + 1) ^ g) << 4));
        r.c = lds128(r1 + ((q ^ g) << 4));
        r.d = lds128(r1 + (((q + 1) ^ g) << 4));
    } else {
        /* rows of 128 bf16 (256 bytes, padded to BF_ROW) */
        const uint32_t r0 = W + (i * 16 + g) * BF_ROW + 64 * t + 32 * h, r1 = r0 + 8 * BF_ROW;
        r.a = lds128(r0);
        r.b = lds128(r0 + 16);
        r.c = lds128(r1);
        r.d = lds128(r1 + 16);
    }
}
/* raw bytes -> the half's A fragments: a[4j + 0..3] = step 4h + j's {row g cols 2t, 2t + 1;
 * row g + 8 the same; row g cols 2t + 8, 2t + 9; row g + 8 the same} (the wgmma A layout), i.e.
 * physical columns 32t + 4s + {0, 1} and {2, 3}. */
template <int FMT> static __device__ __forceinline__ void expand(const raw_frag &r, uint32_t (&a)[16]) {
    if (FMT == M3_WF_MXFP8) {
        const float s0 = e8_f32(r.s0), s1 = e8_f32(r.s1);
        const uint32_t w0[4] = {r.a.x, r.a.y, r.a.z, r.a.w}, w1[4] = {r.b.x, r.b.y, r.b.z, r.b.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            a[4 * j + 0] = e4_bf2(w0[j], s0);
            a[4 * j + 1] = e4_bf2(w1[j], s1);
            a[4 * j + 2] = e4_bf2(w0[j] >> 16, s0);
            a[4 * j + 3] = e4_bf2(w1[j] >> 16, s1);
        }
    } else if (FMT == FMT_MXB) {
        const uint32_t m0 = e8_bits_bf2(r.s0), m1 = e8_bits_bf2(r.s1);
        const uint32_t w0[4] = {r.a.x, r.a.y, r.a.z, r.a.w}, w1[4] = {r.b.x, r.b.y, r.b.z, r.b.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            a[4 * j + 0] = bf16x2_mul(e4_bits<0>(w0[j]), m0);
            a[4 * j + 1] = bf16x2_mul(e4_bits<0>(w1[j]), m1);
            a[4 * j + 2] = bf16x2_mul(e4_bits<2>(w0[j]), m0);
            a[4 * j + 3] = bf16x2_mul(e4_bits<2>(w1[j]), m1);
        }
    } else if (FMT == M3_WF_NVFP4) {
        /* value x 2^-126 (bf16 bits) times scale x 2^119 (bf16): the weight x 2^-7, exact (at most
         * 6 significant bits, 2^-17 .. 21), one bf16 multiply per pair; the epilogue puts 2^7 back */
        const uint32_t m0 = nv_scale_bf2(r.s0), m1 = nv_scale_bf2(r.s1);
        /* step j of the half: word j / 2 of the row's 8 bytes, pairs 2 (j % 2) and 2 (j % 2) + 1 */
        a[0] = bf16x2_mul(nv_bf2<0>(r.a.x), m0);
        a[1] = bf16x2_mul(nv_bf2<0>(r.a.z), m1);
        a[2] = bf16x2_mul(nv_bf2<1>(r.a.x), m0);
        a[3] = bf16x2_mul(nv_bf2<1>(r.a.z), m1);
        a[4] = bf16x2_mul(nv_bf2<2>(r.a.x), m0);
        a[5] = bf16x2_mul(nv_bf2<2>(r.a.z), m1);
        a[6] = bf16x2_mul(nv_bf2<3>(r.a.x), m0);
        a[7] = bf16x2_mul(nv_bf2<3>(r.a.z), m1);
        a[8] = bf16x2_mul(nv_bf2<0>(r.a.y), m0);
        a[9] = bf16x2_mul(nv_bf2<0>(r.a.w), m1);
        a[10] = bf16x2_mul(nv_bf2<1>(r.a.y), m0);
        a[11] = bf16x2_mul(nv_bf2<1>(r.a.w), m1);
        a[12] = bf16x2_mul(nv_bf2<2>(r.a.y), m0);
        a[13] = bf16x2_mul(nv_bf2<2>(r.a.w), m1);
        a[14] = bf16x2_mul(nv_bf2<3>(r.a.y), m0);
        a[15] = bf16x2_mul(nv_bf2<3>(r.a.w), m1);
    } else {
        const uint32_t w0[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
        const uint32_t w1[8] = {r.c.x, r.c.y, r.c.z, r.c.w, r.d.x, r.d.y, r.d.z, r.d.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            a[4 * j + 0] = w0[2 * j];
            a[4 * j + 1] = w1[2 * j];
            a[4 * j + 2] = w0[2 * j + 1];
            a[4 * j + 3] = w1[2 * j + 1];
        }
    }
}

template <int BN> static __device__ __forceinline__ void wgmma_bn(float (&d)[BN / 2], const uint32_t *a, uint64_t desc);
template <> __device__ __forceinline__ void wgmma_bn<16>(float (&d)[8], const uint32_t *a, uint64_t desc) {
    wgmma_n16(d, a, desc);
}
template <> __device__ __forceinline__ void wgmma_bn<32>(float (&d)[16], const uint32_t *a, uint64_t desc) {
    wgmma_n32(d, a, desc);
}
template <> __device__ __forceinline__ void wgmma_bn<64>(float (&d)[32], const uint32_t *a, uint64_t desc) {
    wgmma_n64(d, a, desc);
}
template <> __device__ __forceinline__ void wgmma_bn<128>(float (&d)[64], const uint32_t *a, uint64_t desc) {
    wgmma_n128(d, a, desc);
}
template <> __device__ __forceinline__ void wgmma_bn<256>(float (&d)[128], const uint32_t *a, uint64_t desc) {
    wgmma_n256(d, a, desc);
}
/* one k16 step of the CTA's BN tokens, x's K-major tile at the shared address of descriptor low word
 * lo (desc_lo): BN 192 is an n128 wgmma over tokens 0-127 and an n64 one over tokens 128-191 (the
 * staged pieces from 2 * XPIECE on), on the same A registers; their accumulators in a row are BN
 * 192's fragment (token group j at d[4 j ..]) */
template <int BN, bool N192 = false>
static __device__ __forceinline__ void wgmma_tile(float (&d)[BN / 2], const uint32_t *a, uint32_t lo) {
    if constexpr (BN == 192 && N192) {
        wgmma_n192(d, a, desc_of(lo)); /* the same fragment in one instruction (the default) */
    } else if constexpr (BN == 192) {
        wgmma_n128(*reinterpret_cast<float(*)[64]>(&d[0]), a, desc_of(lo));
        wgmma_n64(*reinterpret_cast<float(*)[32]>(&d[64]), a, desc_of(lo + 2 * XPIECE / 16));
    } else wgmma_bn<BN>(d, a, desc_of(lo));
}

/* one half of a K block (4 k16 steps, x's tile at shared address xh): the raw weights expanded into
 * the A registers a, then the half's wgmmas as one committed group (not waited for) */
template <int FMT, int BN, bool N192>
static __device__ __forceinline__ void mma_half(float (&acc)[BN / 2], const raw_frag &r, uint32_t (&a)[16], uint32_t xh) {
    expand<FMT>(r, a);
    pin_f32(acc);
    wg_fence();
#pragma unroll
    for (int j = 0; j < 4; j++) wgmma_tile<BN, N192>(acc, a + 4 * j, desc_lo(xh) + j * 32 / 16);
    wg_commit();
}

/* ------------------------------------------------------------------ the GEMM kernel */

/* CPS: CTAs an SM holds (2, for the small token tiles, whose CTAs wait on latency: fewer stages and
 * 80 registers a thread at launch, a 64-token tile's consumers taking 96 by setmaxnreg; by default
 * for MXFP8 / NVFP4 tiles of 64, two_per_sm64; M3_GEMM_TC_CPS=2, an experiment, for those of 16 /
 * 32). NB: the consumers' A buffers for MXFP8 / NVFP4 (2; 3: M3_GEMM_TC_NB=3, an experiment) */
template <int FX, int BN, int CPS = 1, int NB = 2, bool N192 = false, bool HS = false>
__global__ void __launch_bounds__(NTHREADS, CPS) k_gemm_tc(const __grid_constant__ gemm_args p) {
    constexpr int FMT = fmt_of(FX); /* FX: the expansion (FMT_MXB), FMT: the format */
    static_assert(BN != 256 || (CPS == 1 && NTHREADS == 384), "BN 256: setmaxnreg balances one CTA an SM of 384 threads");
    static_assert(!HS || (FMT != M3_WF_BF16 && BN >= 128 && CPS == 1 && NB == 2), "half stages: MXFP8 / NVFP4, 128+ tokens");
    /* HS: the x ring's NX half stages of XH bytes, then the w ring's NW slots of WSL bytes */
    constexpr int NX = HS ? hs_nx(FMT, BN) : 1, NW = HS ? hs_nw(FMT, BN) : 1, XH = BN * 128, WSL = w_slot(FMT);
    static_assert(!HS || NX * XH >= BN * 256, "half stages: the x ring holds the MoE epilogue's exchange (mode 1)");
    constexpr int STAGES = HS ? NX : n_stages(FMT, BN, CPS), STAGE = HS ? XH : stage_bytes(FMT, BN);
    constexpr int XB = BN * 256, WB = w_bytes(FMT);
    extern __shared__ uint8_t smem_raw[];
    /* 1024-aligned (the 128-byte swizzle atoms), as an offset from smem_raw so that the compiler
     * keeps knowing it is shared memory (shared loads, not generic ones) */
    uint8_t *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    /* full[STAGES], empty[STAGES] (HS: of the x ring; then the w ring's wfull[NW], wempty[NW]) */
    uint64_t *bars = (uint64_t *)(smem + STAGES * STAGE + (HS ? NW * WSL : 0));
    const uint32_t full0 = smem_u32(bars), empty0 = smem_u32(bars + STAGES);
    const uint32_t wfull0 = smem_u32(bars + 2 * STAGES), wempty0 = smem_u32(bars + 2 * STAGES + NW);
    uint8_t *const wring = smem + STAGES * STAGE; /* HS: the w ring */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    /* grouped raster (gemm_tiles.h; groups of 4 or 16 row tiles measured the same, session 17) */
    const m3_gemm_tile rt = m3_gemm_tc_raster(blockIdx.x, p.nm, p.nt, p.ksplit);
    const int ks = rt.ks, mt = rt.mt, tt = rt.tt;
    const int n0 = mt * BM;
    int tok0 = tt * BN;
    const int KB = p.K / BK, kb0 = (int)((long)ks * KB / p.ksplit), NK = (int)((long)(ks + 1) * KB / p.ksplit) - kb0;

    /* the weights: W (all rows), or MoE: the tile's expert's gate (rows 0-63) and up (64-127),
     * or its down matrix; a tile past the groups in use, or of no expert, has nothing to do */
    const uint8_t *pw = p.w, *ps = p.s, *pw2 = NULL, *ps2 = NULL;
    float gm_lo = p.gmul, gm_hi = p.gmul;
    if (p.mode) {
        if (tt >= __ldg(p.ntile)) return; /* past the tiles in use */
        tok0 = __ldg(p.tiles + 2 * tt);
        const int e = __ldg(p.tiles + 2 * tt + 1);
        if (e < 0) return;
        const m3_linear *W = p.mode == 1 ? &p.tab[e].gate : &p.tab[e].down;
        pw = W->w;
        ps = W->scale;
        gm_lo = gm_hi = W->gmul;
        if (p.mode == 1) {
            pw2 = p.tab[e].up.w;
            ps2 = p.tab[e].up.scale;
            gm_hi = p.tab[e].up.gmul;
        }
    }

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES + (HS ? NW : 0); s++) { /* (HS: the w ring's follow the x ring's) */
            mb_init((s < STAGES ? full0 : wfull0 - 8 * STAGES) + 8 * s, 4); /* one arrival (+ its bytes) per producer warp */
            mb_init((s < STAGES ? empty0 : wempty0 - 8 * STAGES) + 8 * s, 8); /* one arrival per consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) {
        if constexpr (moved_regs(BN, CPS)) regs_dec<producer_regs(CPS)>();
        /* producers: the 4 warps of warpgroup 0 share a stage's bulk copies (a copy's operands
         * are uniform registers, so a warp issues its lanes' copies one after another: ~50
         * cycles each, which one warp alone made the bottleneck). Copy q of a stage: x pieces
         * (64 tokens x one column half), then weight runs, then scale runs. */
        /* copy q of a stage goes to thread pl = round-robin over the warps (q = 4 lane + warp), so
         * each warp issues a quarter of the stage's copies; in order, warp 0 issued the first 32
         * one after another and the stages landed late: MXFP8 8192 x 6144 at 4096 tokens 32.3 ->
         * 48.3% of the BF16 peak, NVFP4 44.5 -> 53.7%, BF16 36.8 -> 38.9% (H200, session 17) */
        const int pl = p.spread ? (threadIdx.x % 32) * 4 + threadIdx.x / 32 : threadIdx.x; /* 0..127 */
        const int rows = p.mode == 1 ? BM : p.N - n0 < BM ? p.N - n0 : BM, tiles = (rows + 15) / 16;
        /* x: the staged pieces of 64 rows (8 KB per column half) of the tile; a tile of fewer than
         * 64 rows takes its rows' slice of one piece (whole 8-row atoms: the swizzle phase holds) */
        const int t64 = (p.T + 63) / 64, g0 = tok0 / 64;
        const int ng = BN < 64 ? 1 : t64 - g0 < BN / 64 ? t64 - g0 : BN / 64, nx = 2 * ng;
        constexpr uint32_t XCOPY = BN < 64 ? BN * 128 : XPIECE;
        const size_t xoff = BN < 64 ? (size_t)(tok0 % 64) * 128 : 0;
        const bool tma = FMT == M3_WF_BF16 && p.tma;
        const int nw = FMT == M3_WF_MXFP8 ? tiles * 5 : FMT == M3_WF_NVFP4 ? tiles * 2 : tma ? 2 : rows, total = nx + nw;
        const size_t tstride = 16 * p.row_bytes, sstride = 16 * p.scale_row;
        /* 16-row tile i of the CTA (values, scales), and row c (BF16) */
        auto wtile = [&](int i) -> const uint8_t * {
            return p.mode == 1 ? (i < 4 ? pw : pw2) + (size_t)(mt * 4 + (i & 3)) * tstride : pw + (size_t)(n0 / 16 + i) * tstride;
        };
        auto stile = [&](int i) -> const uint8_t * {
            return p.mode == 1 ? (i < 4 ? ps : ps2) + (size_t)(mt * 4 + (i & 3)) * sstride : ps + (size_t)(n0 / 16 + i) * sstride;
        };
        auto wrow = [&](int c) -> const uint8_t * {
            return p.mode == 1 ? (c < 64 ? pw : pw2) + (size_t)(mt * 64 + (c & 63)) * p.row_bytes : pw + (size_t)(n0 + c) * p.row_bytes;
        };
        /* weight copy c of K block kb (values, then scales) into a stage's Wd / Sd, completing on bar */
        auto wcopy = [&](int c, uint8_t *Wd, uint8_t *Sd, int kb, uint32_t bar) {
            if (FMT == M3_WF_MXFP8) {
                if (c < 4 * tiles) {
                    const int i = c >> 2, u = c & 3;
                    const uint8_t *src = wtile(i) + (size_t)(kb * 4 + u) * 512;
                    bulk_g2s(smem_u32(Wd + i * MX_TILE + u * 512 + (u & 1) * 16 + (u >> 1) * 64), src, 512, bar);
                } else {
                    const int i = c - 4 * tiles;
                    bulk_g2s(smem_u32(Sd + i * 64), stile(i) + (size_t)kb * 64, 64, bar);
                }
            } else if (FMT == M3_WF_NVFP4) {
                if (c < tiles) {
                    bulk_g2s(smem_u32(Wd + c * 1024), wtile(c) + (size_t)kb * 1024, 1024, bar);
                } else {
                    const int i = c - tiles;
                    bulk_g2s(smem_u32(Sd + i * 128), stile(i) + (size_t)kb * 128, 128, bar);
                }
            } else if (tma) {
                tma_2d(smem_u32(Wd + c * 16384), &p.tmap, kb * BK + 64 * c, n0, bar);
            } else {
                bulk_g2s(smem_u32(Wd + c * BF_ROW), wrow(c) + (size_t)kb * 256, 256, bar);
            }
        };
        auto wcopy_bytes = [&](int c) -> uint32_t {
            return FMT == M3_WF_MXFP8 ? (c < 4 * tiles ? 512 : 64) : FMT == M3_WF_NVFP4 ? (c < tiles ? 1024 : 128)
                   : tma ? 16384 : 256; /* (a box counts whole, rows past N included: zeros) */
        };
        if constexpr (HS) {
            /* per K block: its weight slot, then its two x halves (a ring each), every copy of a kind
             * to thread pl = its number round-robin */
            uint32_t mw = 0, mx = 0;
            for (int c = pl; c < nw; c += 128) mw += wcopy_bytes(c);
            for (int gi = pl; gi < ng; gi += 128) mx += XCOPY;
            const uint32_t wsum = __reduce_add_sync(0xffffffffu, mw), xsum = __reduce_add_sync(0xffffffffu, mx);
            for (int kl = 0; kl < NK; kl++) {
                const int kb = kb0 + kl, ws = kl % NW;
                uint8_t *Wd = wring + ws * WSL;
                if (kl >= NW) mb_wait(wempty0 + 8 * ws, ((kl / NW) & 1) ^ 1);
                if (lane == 0) mb_expect_tx(wfull0 + 8 * ws, wsum);
                __syncwarp();
                for (int c = pl; c < nw; c += 128) wcopy(c, Wd, Wd + WB, kb, wfull0 + 8 * ws);
                for (int h = 0; h < 2; h++) {
                    const int q = 2 * kl + h, xs = q % STAGES;
                    if (q >= STAGES) mb_wait(empty0 + 8 * xs, ((q / STAGES) & 1) ^ 1);
                    if (lane == 0) mb_expect_tx(full0 + 8 * xs, xsum);
                    __syncwarp();
                    for (int gi = pl; gi < ng; gi += 128) {
                        const uint8_t *src = p.xs + (((size_t)(g0 + gi) * KB + kb) * 2 + h) * XPIECE + xoff;
                        bulk_g2s(smem_u32(smem + xs * XH + gi * XPIECE), src, XCOPY, full0 + 8 * xs);
                    }
                }
            }
            return;
        }
        /* bytes of this warp's copies (the same every stage) */
        uint32_t mine = 0;
        for (int q = pl; q < total; q += 128) mine += q < nx ? XCOPY : wcopy_bytes(q - nx);
        const uint32_t wbytes = __reduce_add_sync(0xffffffffu, mine);
        for (int kl = 0; kl < NK; kl++) {
            const int kb = kb0 + kl, st = kl % STAGES;
            uint8_t *X = smem + st * STAGE, *Wd = X + XB, *Sd = Wd + WB;
            const uint32_t full = full0 + 8 * st;
            if (kl >= STAGES) mb_wait(empty0 + 8 * st, ((kl / STAGES) & 1) ^ 1);
            if (lane == 0) mb_expect_tx(full, wbytes); /* one arrival per producer warp, even with no bytes */
            __syncwarp();
            for (int q = pl; q < total; q += 128) {
                if (q < nx) {
                    const int gi = q >> 1, col = q & 1;
                    const uint8_t *src = p.xs + (((size_t)(g0 + gi) * KB + kb) * 2 + col) * XPIECE + xoff;
                    bulk_g2s(smem_u32(X + col * BN * 128 + gi * XPIECE), src, XCOPY, full);
                    continue;
                }
                wcopy(q - nx, Wd, Sd, kb, full);
            }
        }
        return;
    }

    /* consumers */
    if constexpr (moved_regs(BN, CPS)) regs_inc<consumer_regs(CPS)>();
    const int wg = warp / 4 - 1, i = wg * 4 + warp % 4; /* the warp's 16-row tile of the CTA's 8 */
    const int g = lane / 4, t = lane % 4;
    float acc[BN / 2];
#pragma unroll
    for (int j = 0; j < BN / 2; j++) acc[j] = 0.0f;
    raw_frag r;
    r.c = r.d = make_uint4(0, 0, 0, 0);
    const uint32_t sm0 = smem_u32(smem), wr0 = smem_u32(wring); /* the stages' shared addresses (see lds128) */
    const bool sw = FMT == M3_WF_BF16 && p.tma;
    if (HS) { /* the first K block's weights (its x: in the loop) */
        mb_wait(wfull0, 0);
        load_raw<FMT>(wr0, wr0 + WB, i, g, t, 0, r);
    } else {
        mb_wait(full0, 0);
        load_raw<FMT>(sm0 + XB, sm0 + XB + WB, i, g, t, 0, r, sw);
    }
    if constexpr (FMT == M3_WF_BF16) {
        /* BF16 has nothing to expand: its raw loads are the wgmma's A registers, so it waits
         * for each half's wgmmas before loading the next (loads into registers of an in-flight
         * wgmma make ptxas serialize every wgmma, C7513) */
        uint32_t a0[16];
        for (int kb = 0; kb < NK; kb++) { /* kb: the CTA's K blocks, from kb0 */
            const int st = kb % STAGES;
            const uint32_t xa = smem_u32(smem + st * STAGE);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mma_half<FX, BN, N192>(acc, r, a0, xa + h * BN * 128);
                wg_wait<0>();
                pin_f32(acc);
                pin_u32(a0);
                if (h == 0) {
                    load_raw<FMT>(sm0 + st * STAGE + XB, sm0 + st * STAGE + XB + WB, i, g, t, 1, r, sw);
                } else if (kb + 1 < NK) {
                    const int sn = (kb + 1) % STAGES;
                    mb_wait(full0 + 8 * sn, ((kb + 1) / STAGES) & 1);
                    load_raw<FMT>(sm0 + sn * STAGE + XB, sm0 + sn * STAGE + XB + WB, i, g, t, 0, r, sw);
                }
            }
            __syncwarp();
            if (lane == 0) mb_arrive(empty0 + 8 * st); /* the stage's wgmmas are done: hand it back */
        }
    } else if constexpr (HS) {
        /* half stages: half q (2 kb + h) waits for its x half, expands into buffer h while the
         * previous half's group runs, and once that group has retired hands its x half back; a
         * block's weights go back as soon as its second half's raw bytes are in registers (during
         * its first half) */
        uint32_t a[2][16];
        for (int kb = 0; kb < NK; kb++) {
            const int ws = kb % NW;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int q = 2 * kb + h, xs = q % STAGES;
                mb_wait(full0 + 8 * xs, (q / STAGES) & 1);
                mma_half<FX, BN, N192>(acc, r, a[h], sm0 + xs * XH);
                if (h == 0) {
                    load_raw<FMT>(wr0 + ws * WSL, wr0 + ws * WSL + WB, i, g, t, 1, r);
                    __syncwarp();
                    if (lane == 0) mb_arrive(wempty0 + 8 * ws);
                } else if (kb + 1 < NK) {
                    const int wn = (kb + 1) % NW;
                    mb_wait(wfull0 + 8 * wn, ((kb + 1) / NW) & 1);
                    load_raw<FMT>(wr0 + wn * WSL, wr0 + wn * WSL + WB, i, g, t, 0, r);
                }
                wg_wait<1>();
                pin_f32(acc);
                pin_u32(a[h ^ 1]);
                if (q > 0) {
                    __syncwarp();
                    if (lane == 0) mb_arrive(empty0 + 8 * ((q - 1) % STAGES));
                }
            }
        }
        wg_wait<0>();
        pin_f32(acc);
        pin_u32(a[0]);
        pin_u32(a[1]);
    } else {
        /* MXFP8 / NVFP4: NB A buffers (2; 3: M3_GEMM_TC_NB=3, an experiment), one per half in turn.
         * Half q (2 kb + h) expands into buffer q % NB while the wgmma groups of the halves before
         * it run: before expanding into a buffer, the group that read it (q - NB) is retired by the
         * wait_group NB - 1 after half q - 1 (NB - 1 groups stay in flight, so ptxas need not
         * serialize: the registers an in-flight wgmma reads are never redefined, C7513). The K
         * blocks go in runs of KU (NB 3: 3, so that every buffer index is known at compile time;
         * NK is then a multiple of 3, the host's condition: a K block skipped inside the loop
         * makes ptxas serialize). A stage goes back to the producers once its second half's group
         * has retired: NB 2 after the next stage's first half, NB 3 after its second (waited for
         * before the stage after it: the producers stay a stage further ahead, which NB 3 needs
         * at least 3 stages for). */
        constexpr int KU = NB == 3 ? 3 : 1;
        static_assert(NB == 2 || (NB == 3 && STAGES >= 3), "three A buffers: at least 3 stages");
        if (NB == 3 && NK % 3) __trap(); /* the host's condition (launch_args): runs of 3 K blocks */
        uint32_t a[NB][16];
        for (int kr = 0; kr < NK; kr += KU) { /* kb: the CTA's K blocks (from its slice's first) */
#pragma unroll
            for (int u = 0; u < KU; u++) {
                const int kb = kr + u, st = kb % STAGES;
                const uint32_t xa = smem_u32(smem + st * STAGE);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mma_half<FX, BN, N192>(acc, r, a[(2 * u + h) % NB], xa + h * BN * 128);
                    /* retire all but NB - 1 groups; at h == NB - 2 the previous stage's last group
                     * is among the retired: hand that stage back */
                    auto retire = [&]() {
                        wg_wait<NB - 1>();
                        pin_f32(acc);
                        pin_u32(a[(2 * u + h + 1) % NB]);
                        if (h == NB - 2 && kb > 0) {
                            __syncwarp();
                            if (lane == 0) mb_arrive(empty0 + 8 * ((kb - 1) % STAGES));
                        }
                    };
                    /* NB 3, second half: before waiting for the next stage */
                    const bool early = NB == 3 && h == 1;
                    if (early) retire();
                    if (h == 0) {
                        load_raw<FMT>(sm0 + st * STAGE + XB, sm0 + st * STAGE + XB + WB, i, g, t, 1, r);
                    } else if (kb + 1 < NK) {
                        const int sn = (kb + 1) % STAGES;
                        mb_wait(full0 + 8 * sn, ((kb + 1) / STAGES) & 1);
                        load_raw<FMT>(sm0 + sn * STAGE + XB, sm0 + sn * STAGE + XB + WB, i, g, t, 0, r);
                    }
                    if (!early) retire();
                }
            }
        }
        wg_wait<0>();
        pin_f32(acc);
#pragma unroll
        for (int b = 0; b < NB; b++) pin_u32(a[b]);
    }
    if (p.mode == 1) {
        /* SwiGLU-OAI: the up warpgroup hands its sums (thread for thread: the same fragment
         * positions) to the gate warpgroup through stage 0's memory, once every consumer is done
         * with the stages (the producers have returned: every stage they filled was consumed) */
        float *xb = (float *)smem;
        const int tw = threadIdx.x % 128;
        const float gg = FMT == M3_WF_NVFP4 ? gm_lo * 128.0f : 1.0f, gu = FMT == M3_WF_NVFP4 ? gm_hi * 128.0f : 1.0f;
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        if (wg == 1)
#pragma unroll
            for (int j = 0; j < BN / 2; j++) xb[j * 128 + tw] = acc[j] * gu;
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        if (wg == 1) return;
        const int r0 = mt * 64 + i * 16 + g;
        const float lim = p.limit, al = p.alpha;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int tok = tok0 + 8 * j + 2 * t + e;
                if (tok < p.T) {
                    float *yr = p.y + (size_t)tok * p.N;
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int q = 4 * j + 2 * hh + e;
                        yr[r0 + 8 * hh] = swiglu_oai(acc[q] * gg, xb[q * 128 + tw], al, lim);
                    }
                }
            }
        }
        return;
    }
    /* epilogue: D[row][token] -> y[token][row] (8 lanes g write 8 consecutive rows of a token) */
    const float gm = FMT == M3_WF_NVFP4 ? gm_lo * 128.0f : 1.0f; /* 2^7: see expand */
    const int r0 = n0 + i * 16 + g;
    const bool ok0 = r0 < p.N, ok1 = r0 + 8 < p.N;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int tok = tok0 + 8 * j + 2 * t + e;
            const int orow = tok < p.T && p.mode == 2 ? __ldg(p.rowmap + tok) : tok;
            if (tok < p.T && orow >= 0) {
                float *yr = (p.ksplit > 1 ? p.part + (size_t)ks * p.T * p.N : p.y) + (size_t)orow * p.N;
                if (ok0) yr[r0] = acc[4 * j + e] * gm;
                if (ok1) yr[r0 + 8] = acc[4 * j + 2 + e] * gm;
            }
        }
    }
}

/* ------------------------------------------------------------------ staging x */

static __device__ __forceinline__ uint32_t bf16_rne(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

/* x [T][K] f32 -> [T/64][K/128][2 column halves][64 tokens][128 bytes] bf16, one 16-byte chunk a
 * thread: chunk position p of row r holds logical chunk c = p ^ (r % 8) of column half col,
 * whose 8 values (logical columns 64 col + 8c + e) are, by the permutation above, the pairs
 * x[32q + 16 col + 2c + {0, 1}] (q = 0..3) of the K block. */
/* With map (the MoE's permuted rows): staged row r is x row map[r] (zeros where map[r] < 0), and
 * only the first cnt[0] groups of 64 rows are written. */
__global__ void k_stage_x(const float *x, int T, int K, uint4 *xs, size_t n, const int *map, const int *cnt) {
    const int KB = K / BK;
    const int ng = cnt ? __ldg(cnt) : 0x7fffffff;
    for (size_t q = blockIdx.x * (size_t)blockDim.x + threadIdx.x; q < n; q += (size_t)gridDim.x * blockDim.x) {
        const int pp = (int)(q & 7), r = (int)((q >> 3) & 63), col = (int)((q >> 9) & 1);
        const size_t rest = q >> 10;
        const int kb = (int)(rest % KB);
        if ((int)(rest / KB) >= ng) break; /* q only grows */
        const int tok = (int)(rest / KB) * 64 + r, c = pp ^ (r & 7);
        const int src = tok < T ? (map ? __ldg(map + tok) : tok) : -1;
        uint4 o = make_uint4(0, 0, 0, 0);
        if (src >= 0) {
            const float *b = x + (size_t)src * K + (size_t)kb * BK + 16 * col + 2 * c;
            const float2 v0 = *(const float2 *)b, v1 = *(const float2 *)(b + 32), v2 = *(const float2 *)(b + 64),
                         v3 = *(const float2 *)(b + 96);
            o.x = bf16_rne(v0.x) | (bf16_rne(v0.y) << 16);
            o.y = bf16_rne(v1.x) | (bf16_rne(v1.y) << 16);
            o.z = bf16_rne(v2.x) | (bf16_rne(v2.y) << 16);
            o.w = bf16_rne(v3.x) | (bf16_rne(v3.y) << 16);
        }
        xs[q] = o;
    }
}

/* 1 when environment variable name is set to val (the switches for measurements) */
static int env_is(const char *name, const char *val) {
    const char *e = getenv(name);
    return e && !strcmp(e, val);
}

/* M3_GEMM_TC_NB=3: three A buffers in the MXFP8 / NVFP4 consumers (tiles of 64 / 128 tokens, one K
 * slice of a multiple of 3 K blocks) */
static int three_bufs(void) {
    static const int v = env_is("M3_GEMM_TC_NB", "3");
    return v;
}

/* 192-token tiles by one n192 wgmma a k16 step (the A fragment read once), not an n128 and an n64
 * (M3_GEMM_TC_N192=0, for measurements): H100, 4096 tokens, 12288 x 6144 NVFP4 / MXFP8 1018 -> 961 /
 * 1081 -> 1046 us (PERF.md session 43) */
static int one_n192(void) {
    static const int v = !env_is("M3_GEMM_TC_N192", "0");
    return v;
}

/* Half stages (the x ring in half K blocks, a ring of weight slots) for a tile of BN tokens of fmt:
 * by default MXFP8 at 256 only, where whole stages of 82 KB leave 2 (H100, 12288 x 6144 at 4096
 * tokens, bit-placement expansion: 954 us against 1008 at 192; 1024 tokens 237 against 329 at 128);
 * at 192 they cost more than they give (MXFP8 1230 against 1048 us), and NVFP4 at 256 keeps its 3
 * whole stages (843 against 869; PERF.md session 44). M3_GEMM_TC_HS=1: every MXFP8 / NVFP4 tile of
 * 192 / 256; M3_GEMM_TC_HS=0: none (and no MXFP8 tile of 256 by default, bn_for). */
static int hs_env(void) {
    static const int v = env_is("M3_GEMM_TC_HS", "1") ? 1 : env_is("M3_GEMM_TC_HS", "0") ? 0 : -1;
    return v;
}
static int half_stages(int fmt, int bn) {
    const int e = hs_env();
    return e >= 0 ? e : fmt == M3_WF_MXFP8 && bn == 256;
}

/* MXFP8 matrices whose largest E8M0 code is scale_max: expanded by bit placement (FMT_MXB) where the
 * scales allow it (2^(e-7) a bf16 normal: codes <= 134; H100, 12288 x 6144 at 4096 tokens 1048 ->
 * 1008 us, the 8-layer prefill's linears 14.7 -> 14.2 ms). M3_GEMM_TC_MXB=0: the conversions */
static int mx_bits(int scale_max) {
    static const int off = env_is("M3_GEMM_TC_MXB", "0");
    return !off && scale_max >= 1 && scale_max <= 134;
}

/* a's shape: W's (rows, values / scales strides, K); the kernel for FMT, BN */
template <int FMT, int BN, int CPS = 1, int NB = 2, bool N192 = false, bool HS = false>
static int launch_args(cudaStream_t st, const gemm_args &a, m3_err *err) {
    if constexpr (FMT == M3_WF_MXFP8 && BN >= 128)
        if (a.mxb) return launch_args<FMT_MXB, BN, CPS, NB, N192, HS>(st, a, err);
    if constexpr (NB == 2 && CPS == 1 && FMT != M3_WF_BF16 && (BN == 64 || BN == 128))
        if (three_bufs() && a.ksplit == 1 && (a.K / BK) % 3 == 0) return launch_args<FMT, BN, CPS, 3>(st, a, err);
    if constexpr (BN == 192 && !N192)
        if (one_n192()) return launch_args<FMT, BN, CPS, NB, true>(st, a, err);
    if constexpr (NB == 2 && CPS == 1 && FMT != M3_WF_BF16 && BN >= 192 && !HS)
        if (half_stages(fmt_of(FMT), BN)) return launch_args<FMT, BN, CPS, NB, N192, true>(st, a, err);
    constexpr int F = fmt_of(FMT), SM = HS ? hs_smem(F, BN) : smem_bytes(F, BN, CPS);
    /* the shared-memory limit is an attribute of the kernel in each device's context (tensor parallel
     * ranks: one per GPU, on threads of their own): set once per device */
    static unsigned long long set;
    int dev = 0;
    cudaError_t de = cudaGetDevice(&dev);
    if (de != cudaSuccess) return m3_errf(err, "gemm_tc: no current device: %s", cudaGetErrorString(de));
    const unsigned long long bit = 1ull << (dev & 63);
    if (!(__atomic_load_n(&set, __ATOMIC_ACQUIRE) & bit)) {
        cudaError_t e = cudaFuncSetAttribute(k_gemm_tc<FMT, BN, CPS, NB, N192, HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, SM);
        if (e != cudaSuccess) return m3_errf(err, "gemm_tc: shared memory attribute: %s", cudaGetErrorString(e));
        if constexpr (moved_regs(BN, CPS)) { /* setmaxnreg balances launch_regs exactly: with fewer, the consumers would wait forever */
            cudaFuncAttributes fa;
            e = cudaFuncGetAttributes(&fa, k_gemm_tc<FMT, BN, CPS, NB, N192, HS>);
            if (e != cudaSuccess) return m3_errf(err, "gemm_tc: kernel attributes: %s", cudaGetErrorString(e));
            if (fa.numRegs != launch_regs(CPS))
                return m3_errf(err, "gemm_tc: the %d-token kernel was built with %d registers a thread, not %d (setmaxnreg would not balance)",
                               BN, fa.numRegs, launch_regs(CPS));
        }
        __atomic_fetch_or(&set, bit, __ATOMIC_RELEASE);
    }
    const long long blocks = (long long)a.nm * a.nt * a.ksplit;
    if (blocks > 0x7fffffffLL) return m3_errf(err, "gemm_tc: %lld tiles", blocks);
    if (blocks < 1) return 0;
    static const int spread = !env_is("M3_GEMM_TC_SPREAD", "0"); /* the producers' copies round-robin over their warps */
    gemm_args b = a;
    b.spread = spread;
    k_gemm_tc<FMT, BN, CPS, NB, N192, HS><<<(unsigned)blocks, NTHREADS, SM, st>>>(b);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return m3_errf(err, "gemm_tc: launch (%s %d x %d, T %d, mode %d): %s", m3_wfmt_name((m3_wfmt)F), a.N,
                                         a.K, a.T, a.mode, cudaGetErrorString(e));
    return 0;
}

/* M3_GEMM_TC_CPS=2: the token tiles of 16 / 32 with two CTAs an SM */
static int two_per_sm(void) {
    static const int v = env_is("M3_GEMM_TC_CPS", "2");
    return v;
}
/* MXFP8 / NVFP4 token tiles of 64 with two CTAs an SM (M3_GEMM_TC_CPS64=1: one): 4 consumer warps a
 * scheduler instead of 2 for CTAs that wait on latency (their expansion's dependent chains), the
 * consumers at 96 registers by setmaxnreg. H100 (PERF.md session 45): the MoE's 64-row rest tiles
 * 27-30% shorter (the op at 4096 tokens -3%, at 1024 -10%), 64-token GEMMs 10-19%; BF16 (2 stages
 * a CTA at two an SM) gained at 6144 x 3072 and lost at 12288 x 6144, and stays at one */
static int two_per_sm64(void) {
    static const int v = !env_is("M3_GEMM_TC_CPS64", "1");
    return v;
}
/* a 64-token tile's launch, at two CTAs an SM where two_per_sm64 (BF16: one, not instantiated) */
template <int F> static int launch64(cudaStream_t st, const gemm_args &a, m3_err *err) {
    if constexpr (F != M3_WF_BF16)
        if (two_per_sm64()) return launch_args<F, 64, 2>(st, a, err);
    return launch_args<F, 64>(st, a, err);
}

/* the tensor-map encoder (tmap.cuh); M3_GEMM_TC_TMA=0: none, BF16 weights by row copies (measurements) */
static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled(void) {
    static const int off = env_is("M3_GEMM_TC_TMA", "0");
    return off ? NULL : m3_cu_encode_tiled();
}
/* a BF16 row-major W as a tensor map of boxes of 128 rows x 64 values, 128-byte swizzled (what the
 * kernel's swizzled loads read); 0 where it cannot be made */
static int bf16_tmap(const m3_linear *W, CUtensorMap *m) {
    const PFN_cuTensorMapEncodeTiled_v12000 enc = encode_tiled();
    if (!enc || ((uintptr_t)W->w & 15) || W->row_bytes % 16 || W->N < BM) return 0;
    const cuuint64_t dim[2] = {(cuuint64_t)W->K, (cuuint64_t)W->N}, stride[1] = {(cuuint64_t)W->row_bytes};
    const cuuint32_t box[2] = {64, BM}, es[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)W->w, dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int FMT, int BN, int CPS = 1>
static int launch(cudaStream_t st, const m3_linear *W, const void *xs, int T, float *y, int ksplit, float *part, m3_err *err) {
    gemm_args a;
    memset(&a, 0, sizeof a);
    a.ksplit = ksplit;
    a.part = part;
    a.w = W->w;
    a.s = W->scale;
    a.row_bytes = W->row_bytes;
    a.scale_row = W->scale_row;
    a.xs = (const uint8_t *)xs;
    a.y = y;
    a.N = W->N;
    a.K = W->K;
    a.T = T;
    a.nm = (W->N + BM - 1) / BM;
    a.nt = (T + BN - 1) / BN;
    a.gmul = W->gmul;
    a.mxb = FMT == M3_WF_MXFP8 && mx_bits(W->scale_max);
    if (FMT == M3_WF_BF16) a.tma = bf16_tmap(W, &a.tmap);
    if constexpr (BN == 64) return launch64<FMT>(st, a, err);
    else return launch_args<FMT, BN, CPS>(st, a, err);
}


} // namespace

/* ------------------------------------------------------------------ C API */

extern "C" int m3_cu_gemm_tc_ok(const m3_linear *W, int T) {
    if (!W || !W->w || T < 1 || W->N < 1 || W->K < BK || W->K % BK) return 0;
    if (((uintptr_t)W->w & 15) || ((uintptr_t)W->scale & 15)) return 0;
    switch (W->fmt) {
    case M3_WF_BF16: return !W->tiled && W->row_bytes % 16 == 0;
    case M3_WF_MXFP8:
    case M3_WF_NVFP4:
        /* the backend's tiled layout, dense rows (a column slice's wider strides are not tiled) */
        return W->tiled && W->scale && W->N % 16 == 0 &&
               W->row_bytes == (size_t)W->K / (W->fmt == M3_WF_NVFP4 ? 2 : 1) &&
               W->scale_row == (size_t)W->K / (W->fmt == M3_WF_NVFP4 ? 16 : 32);
    default: return 0;
    }
}

extern "C" size_t m3_cu_gemm_tc_xbytes(int T, int K) { return (size_t)((T + 63) / 64) * 64 * (size_t)K * 2; }

extern "C" int m3_cu_gemm_tc_stage_x(void *stream, const float *x, int T, int K, void *xs, m3_err *err) {
    if (T < 1 || K < BK || K % BK) return m3_errf(err, "gemm_tc: staging x of %d x %d", T, K);
    const size_t n = m3_cu_gemm_tc_xbytes(T, K) / 16;
    size_t blocks = (n + 255) / 256;
    if (blocks > 132 * 16) blocks = 132 * 16;
    k_stage_x<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(x, T, K, (uint4 *)xs, n, NULL, NULL);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return m3_errf(err, "gemm_tc: staging x: %s", cudaGetErrorString(e));
    return 0;
}

/* y = the sum of the K slices' partial sums, in slice order (deterministic) */
__global__ void k_sum_slices(const float *part, int ksplit, size_t n, float *y) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = part[i];
        for (int k = 1; k < ksplit; k++) v += part[(size_t)k * n + i];
        y[i] = v;
    }
}

static int sm_count(void) {
    static int sms = 0;
    if (!sms) {
        int dev = 0, n = 0;
        const bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
        sms = ok && n > 0 ? n : 132;
    }
    return sms;
}

/* the token tile (gemm_tiles.h: 192 or 256 for MXFP8 and NVFP4 where they save time; MXFP8 at 256
 * in half stages, so not with M3_GEMM_TC_HS=0); M3_GEMM_TC_BN=128 / 192 / 256: that tile above 128
 * tokens (192: MXFP8 / NVFP4; 256 above 192 tokens, MXFP8 / NVFP4), for measurements */
static int bn_for(int T, int fmt, int N) {
    static const int force = env_is("M3_GEMM_TC_BN", "256") ? 256 : env_is("M3_GEMM_TC_BN", "192") ? 192
                             : env_is("M3_GEMM_TC_BN", "128") ? 128 : 0;
    if (force == 256 ? T > 192 && fmt != M3_WF_BF16 : force && T > 128 && (force == 128 || fmt != M3_WF_BF16))
        return force; /* (BF16 at 192: 2 stages) */
    const int maxbn = fmt == M3_WF_NVFP4 ? 256 : fmt == M3_WF_MXFP8 ? (half_stages(fmt, 256) ? 256 : 192) : 128;
    return m3_gemm_tc_bn(T, maxbn, N, sm_count());
}

extern "C" int m3_cu_gemm_tc_ksplit(const m3_linear *W, int T) {
    if (!W || T < 1 || W->N < 1) return 1;
    const int sms = sm_count(), bn = bn_for(T, W->fmt, W->N);
    const long tiles = (long)((W->N + BM - 1) / BM) * ((T + bn - 1) / bn);
    const int KB = W->K / BK;
    static int force = -1; /* M3_GEMM_TC_KS=N: N slices wherever each keeps a K block (measurements) */
    if (force < 0) {
        const char *e = getenv("M3_GEMM_TC_KS");
        force = e ? atoi(e) : 0;
        if (force < 0 || force > 8) force = 0;
    }
    if (force) return force < KB ? force : KB;
    /* about two CTAs per SM (one is resident per SM: the next one's pipeline fill overlaps the tail
     * of the last), each slice at least 6 K blocks */
    long s = (2L * sms + tiles - 1) / tiles;
    if (s > 8) s = 8;
    while (s > 1 && KB / s < 6) s--;
    return (int)s;
}

extern "C" int m3_cu_gemm_tc_staged_split(void *stream, const m3_linear *W, const void *xs, int T, float *y, int ksplit,
                                          float *part, m3_err *err) {
    if (!m3_cu_gemm_tc_ok(W, T))
        return m3_errf(err, "gemm_tc: %s %d x %d (%s) not taken", m3_wfmt_name(W->fmt), W->N, W->K, W->tiled ? "tiled" : "rows");
    if (ksplit < 1 || ksplit > W->K / BK || (ksplit > 1 && !part))
        return m3_errf(err, "gemm_tc: %d K slices of %s %d x %d", ksplit, m3_wfmt_name(W->fmt), W->N, W->K);
    cudaStream_t st = (cudaStream_t)stream;
    const int bn = bn_for(T, W->fmt, W->N);
#define LIN_ARGS st, W, xs, T, y, ksplit, part, err
#define LIN_BN(F) (bn == 16 ? (two_per_sm() ? launch<F, 16, 2>(LIN_ARGS) : launch<F, 16>(LIN_ARGS))        \
                   : bn == 32 ? (two_per_sm() ? launch<F, 32, 2>(LIN_ARGS) : launch<F, 32>(LIN_ARGS)) \
                   : bn == 64 ? launch<F, 64>(LIN_ARGS) : launch<F, 128>(LIN_ARGS))
    int rc;
    switch (W->fmt) {
    case M3_WF_BF16: rc = LIN_BN(M3_WF_BF16); break;
    case M3_WF_MXFP8:
        rc = bn == 256 ? launch<M3_WF_MXFP8, 256>(LIN_ARGS) : bn == 192 ? launch<M3_WF_MXFP8, 192>(LIN_ARGS) : LIN_BN(M3_WF_MXFP8);
        break;
    default:
        rc = bn == 256 ? launch<M3_WF_NVFP4, 256>(LIN_ARGS) : bn == 192 ? launch<M3_WF_NVFP4, 192>(LIN_ARGS) : LIN_BN(M3_WF_NVFP4);
        break;
    }
#undef LIN_BN
#undef LIN_ARGS
    if (rc || ksplit == 1) return rc;
    const size_t n = (size_t)T * W->N;
    size_t blocks = (n + 255) / 256;
    if (blocks > 132 * 8) blocks = 132 * 8;
    k_sum_slices<<<(unsigned)blocks, 256, 0, st>>>(part, ksplit, n, y);
    cudaError_t e = cudaGetLastError();
    return e != cudaSuccess ? m3_errf(err, "gemm_tc: adding K slices: %s", cudaGetErrorString(e)) : 0;
}

extern "C" int m3_cu_gemm_tc_staged(void *stream, const m3_linear *W, const void *xs, int T, float *y, m3_err *err) {
    return m3_cu_gemm_tc_staged_split(stream, W, xs, T, y, 1, NULL, err);
}

extern "C" int m3_cu_gemm_tc(void *stream, const m3_linear *W, const float *x, int T, float *y, void *ws, size_t ws_bytes,
                             m3_err *err) {
    if (!m3_cu_gemm_tc_ok(W, T)) return m3_errf(err, "gemm_tc: %s %d x %d not taken", m3_wfmt_name(W->fmt), W->N, W->K);
    if (ws_bytes < m3_cu_gemm_tc_xbytes(T, W->K)) return m3_errf(err, "gemm_tc: workspace of %zu bytes too small", ws_bytes);
    if (m3_cu_gemm_tc_stage_x(stream, x, T, W->K, ws, err)) return -1;
    return m3_cu_gemm_tc_staged(stream, W, ws, T, y, err);
}

extern "C" int m3_cu_gemm_tc_scales_exact(const m3_linear *h) {
    if (h->fmt != M3_WF_MXFP8 || !h->scale) return 1;
    const size_t n = (size_t)h->K / 32;
    for (int r = 0; r < h->N; r++) {
        const uint8_t *s = h->scale + (size_t)r * h->scale_row;
        for (size_t j = 0; j < n; j++)
            if (s[j] < 10 || s[j] > 246) return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ MoE grouped GEMMs */

extern "C" int m3_cu_gemm_tc_moe_ok(const m3_mlp_w *e0) {
    const m3_linear *g = &e0->gate, *u = &e0->up, *d = &e0->down;
    return m3_cu_gemm_tc_ok(g, 64) && m3_cu_gemm_tc_ok(u, 64) && m3_cu_gemm_tc_ok(d, 64) && g->fmt == u->fmt &&
           g->fmt == d->fmt && g->N == u->N && g->K == u->K && g->row_bytes == u->row_bytes &&
           g->scale_row == u->scale_row && g->N % 64 == 0 && d->K == g->N;
}

extern "C" int m3_cu_gemm_tc_stage_x_map(void *stream, const float *x, int rows, int K, const int *map, const int *cnt,
                                         void *xs, m3_err *err) {
    if (rows < 1 || K < BK || K % BK) return m3_errf(err, "gemm_tc: staging x of %d x %d", rows, K);
    const size_t n = m3_cu_gemm_tc_xbytes(rows, K) / 16;
    size_t blocks = (n + 255) / 256;
    if (blocks > 132 * 16) blocks = 132 * 16;
    k_stage_x<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(x, rows, K, (uint4 *)xs, n, map, cnt);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return m3_errf(err, "gemm_tc: staging x: %s", cudaGetErrorString(e));
    return 0;
}

extern "C" int m3_cu_gemm_tc_moe(void *stream, int part, const m3_mlp_w *tab, const m3_mlp_w *e0, int bn, const void *xs,
                                 int rows, const int *tiles, int maxa, const int maxr[3], const int *cnt, const int *rowmap,
                                 float alpha, float limit, float *y, m3_err *err) {
    const m3_wfmt fmt = e0->gate.fmt;
    int ok = m3_cu_gemm_tc_moe_ok(e0) && (bn == 16 || bn == 32 || bn == 64 || bn == 128 || (bn == 256 && fmt == M3_WF_NVFP4)) &&
             rows >= 1 && rows % 64 == 0 && maxa >= 0;
    for (int c = 0; c < 3; c++) /* rest tiles (with rows in units of 64): the sizes the tiling makes; BF16 not 192 */
        ok = ok && maxr[c] >= 0 && (!maxr[c] || (m3_moe_rest_possible(64 * (c + 1), bn, 64, 1) && (c < 2 || fmt != M3_WF_BF16)));
    if (!ok)
        return m3_errf(err, "gemm_tc: MoE (%s, tile %d, %d rows, rest tiles %d / %d / %d) not taken", m3_wfmt_name(fmt), bn, rows,
                       maxr[0], maxr[1], maxr[2]);
    const m3_linear *W = part == 2 ? &e0->down : &e0->gate;
    gemm_args a;
    memset(&a, 0, sizeof a);
    a.row_bytes = W->row_bytes;
    a.scale_row = W->scale_row;
    a.xs = (const uint8_t *)xs;
    a.y = y;
    a.N = W->N;
    a.K = W->K;
    a.T = rows;
    a.nm = part == 2 ? (W->N + BM - 1) / BM : W->N / 64;
    a.ksplit = 1;
    a.gmul = 1.0f;
    a.mode = part == 2 ? 2 : 1;
    a.mxb = fmt == M3_WF_MXFP8 && mx_bits(W->scale_max); /* (e0's: the largest of every expert's, moe.cu) */
    a.tab = tab;
    a.rowmap = rowmap;
    a.alpha = alpha;
    a.limit = limit;
    cudaStream_t st = (cudaStream_t)stream;
#define MOE_BN(F) (tb == 16 ? (two_per_sm() ? launch_args<F, 16, 2>(st, a, err) : launch_args<F, 16>(st, a, err))        \
                   : tb == 32 ? (two_per_sm() ? launch_args<F, 32, 2>(st, a, err) : launch_args<F, 32>(st, a, err)) \
                   : tb == 64 ? launch64<F>(st, a, err) : launch_args<F, 128>(st, a, err))
    /* the full tiles, then the rest tiles of 64, 128 and 192 rows */
    size_t first = 0;
    for (int pass = 0; pass < 4; pass++) {
        a.nt = pass ? maxr[pass - 1] : maxa;
        a.tiles = tiles + 2 * first;
        a.ntile = cnt + 1 + pass;
        first += (size_t)a.nt;
        if (a.nt < 1) continue;
        const int tb = pass ? 64 * pass : bn; /* the pass's token tile */
        int rc;
        switch (fmt) {
        case M3_WF_BF16: rc = MOE_BN(M3_WF_BF16); break;
        case M3_WF_MXFP8: rc = tb == 192 ? launch_args<M3_WF_MXFP8, 192>(st, a, err) : MOE_BN(M3_WF_MXFP8); break;
        default:
            rc = tb == 256   ? launch_args<M3_WF_NVFP4, 256>(st, a, err)
                 : tb == 192 ? launch_args<M3_WF_NVFP4, 192>(st, a, err)
                             : MOE_BN(M3_WF_NVFP4);
            break;
        }
        if (rc) return rc;
    }
#undef MOE_BN
    return 0;
}
