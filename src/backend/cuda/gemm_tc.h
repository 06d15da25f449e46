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
 * K % 128 == 0, T >= 1 (meant for T >= 64: fewer tokens are the GEMVs' work). */
int m3_cu_gemm_tc_ok(const m3_linear *W, int T);
/* bytes of the staged copy of x [T][K] (T rounded up to 64 tokens, bf16) */
size_t m3_cu_gemm_tc_xbytes(int T, int K);
/* x [T][K] f32 (device) -> staged bf16 copy at xs (device, m3_cu_gemm_tc_xbytes bytes) */
int m3_cu_gemm_tc_stage_x(void *stream, const float *x, int T, int K, void *xs, m3_err *err);
/* y [T][N] = staged x times W^T */
int m3_cu_gemm_tc_staged(void *stream, const m3_linear *W, const void *xs, int T, float *y, m3_err *err);
/* both: ws is device scratch of at least m3_cu_gemm_tc_xbytes(T, W->K) bytes */
int m3_cu_gemm_tc(void *stream, const m3_linear *W, const float *x, int T, float *y, void *ws, size_t ws_bytes,
                  m3_err *err);
/* For a HOST MXFP8 matrix (before upload): 1 when every E8M0 scale code is in 10..246, where the
 * kernel's folding of the scale into the bf16 weight is exact (E4M3 x 2^(e-127) stays a bf16
 * normal); other codes give inexact (flushed / overflowed) weights. Other formats: 1. */
int m3_cu_gemm_tc_scales_exact(const m3_linear *host);

#ifdef __cplusplus
}
#endif

#endif
