/* Tensor-core GEMM for many tokens (Hopper, sm_90a wgmma): y[T][N] = x[T][K] W^T for BF16,
 * MXFP8 and NVFP4 weights in the CUDA backend's device layout (m3_cuda_upload_linear: MXFP8 /
 * NVFP4 tiled, BF16 row-major). x and y are f32 in device memory; x is rounded to bf16, the
 * weights are expanded to bf16 exactly inside the kernel, sums are f32. See gemm_tc.cu.
 *
 * Usage: m3_cu_gemm_tc_ok(W, T) says whether a call is taken; m3_cu_gemm_tc stages x (bf16, in
 * the order the kernel reads) into a caller's workspace of m3_cu_gemm_tc_xbytes(T, K) bytes and
 * runs the GEMM. Several matrices with one input (q / k / v, gate / up) can stage x once
 * (m3_cu_gemm_tc_stage_x) and run m3_cu_gemm_tc_staged for each. Everything is queued on
 * `stream` (a cudaStream_t); nothing synchronizes. Each returns 0, or -1 (+ err) when the
 * matrix / shape is not one it takes (the caller falls back) or a launch failed. */
#ifndef M3_CUDA_GEMM_TC_H
#define M3_CUDA_GEMM_TC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../../base/err.h"
#include "../../weights/weights.h"

/* 1 when the GEMM takes W (device copy) for T tokens: BF16 row-major, MXFP8 / NVFP4 tiled,
 * K % 128 == 0, T >= 1 (meant for T >= 32: fewer tokens are the GEMVs' work). */
int m3_cu_gemm_tc_ok(const m3_linear *W, int T);
/* bytes of the staged copy of x [T][K] (T rounded up to 64 tokens, bf16) */
size_t m3_cu_gemm_tc_xbytes(int T, int K);
/* x [T][K] f32 (device) -> staged bf16 copy at xs (device, m3_cu_gemm_tc_xbytes bytes) */
int m3_cu_gemm_tc_stage_x(void *stream, const float *x, int T, int K, void *xs, m3_err *err);
/* y [T][N] = staged x times W^T */
int m3_cu_gemm_tc_staged(void *stream, const m3_linear *W, const void *xs, int T, float *y, m3_err *err);
/* The same over ksplit slices of K (each CTA sums K / ksplit; the slices' sums, part: device
 * memory of ksplit * T * N floats, are then added in slice order): for shapes with few output
 * tiles (few tokens, N of a few thousand), which would leave SMs idle. m3_cu_gemm_tc_ksplit: the
 * slices to use for W at T tokens (1: none). */
int m3_cu_gemm_tc_ksplit(const m3_linear *W, int T);
int m3_cu_gemm_tc_staged_split(void *stream, const m3_linear *W, const void *xs, int T, float *y, int ksplit, float *part,
                               m3_err *err);
/* stage x and multiply: ws is device scratch of at least m3_cu_gemm_tc_xbytes(T, W->K) bytes */
int m3_cu_gemm_tc(void *stream, const m3_linear *W, const float *x, int T, float *y, void *ws, size_t ws_bytes,
                  m3_err *err);
/* MoE experts as grouped GEMMs (moe.cu). The (token, expert) slots are permuted by expert into
 * "staged rows", each expert's rows contiguous from a multiple of 64 and padded to the tile bn (16,
 * 32, 64, 128 or 256 (NVFP4)), or with bn 128 / 256 to 64: then the rows past an expert's full
 * tiles form one "rest" tile of 64, 128 or 192 rows (gemm_tiles.h: with bn 128 a 64-row tail, or
 * where its rows exceed 128 and end in such a half tile (MXFP8 / NVFP4), its last 192 rows one
 * "fat" tile). The tiles: tiles[2 i] the first staged row of tile i, tiles[2 i + 1] its expert;
 * full tiles (bn rows) at i = 0 .. maxa - 1, then maxr[0] places for rest tiles of 64 rows,
 * maxr[1] of 128, maxr[2] of 192 (each run with tiles of that many rows). On the device cnt[0] is
 * the groups of 64 staged rows in use (what staging writes), cnt[1] the full tiles and cnt[2 + c]
 * the rest tiles of 64 (c + 1) rows in use; rows (host) an upper bound, a multiple of 64.
 * m3_cu_gemm_tc_moe_ok: the expert shape (e0, a device copy's host struct) is taken: gate / up /
 * down of one format, each taken by the GEMM, F = gate.N a multiple of 64. */
int m3_cu_gemm_tc_moe_ok(const m3_mlp_w *e0);
/* staged row r <- x row map[r] (zeros where map[r] < 0); groups past cnt[0] are left as they are */
int m3_cu_gemm_tc_stage_x_map(void *stream, const float *x, int rows, int K, const int *map, const int *cnt, void *xs,
                              m3_err *err);
/* part 0: y = h [rows][F] = SwiGLU-OAI(gate x, up x) of each row's expert (tab: the device table
 * of experts; e0: their shapes and formats, its scale_max the largest of all experts'); part 2: y[rowmap[r]][H] = down h (rows with rowmap < 0 not stored); xs: the staged
 * rows (x, or h staged with an identity map) */
int m3_cu_gemm_tc_moe(void *stream, int part, const m3_mlp_w *tab, const m3_mlp_w *e0, int bn, const void *xs, int rows,
                      const int *tiles, int maxa, const int maxr[3], const int *cnt, const int *rowmap, float alpha,
                      float limit, float *y, m3_err *err);
/* For a HOST MXFP8 matrix (before upload): 1 when every E8M0 scale code is in 10..246, where the
 * kernel's folding of the scale into the bf16 weight is exact (E4M3 x 2^(e-127) stays a bf16
 * normal; codes up to 134 by bit placement, the others by conversions); other codes give inexact
 * (flushed / overflowed) weights. Other formats: 1. */
int m3_cu_gemm_tc_scales_exact(const m3_linear *host);

#ifdef __cplusplus
}
#endif

#endif
