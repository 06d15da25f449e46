/* CUDA backend (Hopper, sm_90a): the op table of src/backend/ops.h on one GPU.
 *
 * Memory: activations, the KV / index-K pages and a copy of the weights live on the GPU
 * (ops.device_memory = 1); weights are uploaded once at load in their stored formats
 * (MXFP8, NVFP4, BF16...) into one device arena (sized by a counting pass) and decoded in
 * registers by the kernels; MXFP8 / NVFP4 matrices are stored tiled (16-row tiles, unit by
 * unit: common.cuh, wt_voff) so a GEMV warp reads contiguous runs. Every op is queued on
 * one stream; download() synchronizes. A failed CUDA call makes the backend sticky-failed:
 * m3_cuda_check (called by m3_forward at the end of a step through ops.check) reports it.
 *
 * Files, one per op family (the CPU backend's files of the same names, src/backend/cpu/, are
 * their references; each file's top comment names the function it must match):
 *   backend.cu   the op table, memory, step metadata, graphs, profiling
 *   weights.cu   weight upload (arena, tiling)
 *   formats.cuh  the number formats' decoders (E4M3, E8M0, E2M1, NVFP4 blocks, bf16, f16)
 *   embed.cu norm.cu elem.cu rope.cu
 *                embedding rows, Gemma RMSNorm (+ residual add, + MoE combine), add, SwiGLU-OAI,
 *                per-head norm + partial RoPE
 *   kv_store.cu  KV / index-K insert with the spec's rounding (kv.cuh), fused norm + RoPE + insert
 *   indexer.cu   lightning indexer scores + per-head block top-k
 *   attention.cu block-sparse paged attention (split over keys, LSE merge)
 *   dspark_attention.cu the DSpark draft's sliding-window attention over its context ring and
 *                block (key chunks on the tensor cores, 3xTF32; the chunks combined per head)
 *   argmax.cu    rows' argmax (+ finite flags): greedy draws and greedy outputs on the device
 *   draw.cu      rows' sampling distributions and one draw each: the draft's probabilistic draws
 *   linear.cu    linear dispatch; SIMT GEMV for every format (linear_simt.cuh); dequantize + cuBLAS
 *                SGEMM (f32) for more than 64 tokens
 *   linear_mma.cu MXFP8 / NVFP4 GEMV on the tensor cores for up to 8 tokens (weights through a
 *                per-warp cp.async ring), several matrices or every MoE slot per launch
 *   router.cu    MoE router + top-k (routing fused into the router GEMV: router.cuh)
 *   moe.cu       dense MLP; MoE experts (per slot, grouped by expert, or grouped on the host),
 *                SwiGLU, combine (graph-free: no host sync for <= 8 tokens)
 *   vision.cu    the vision tower's LayerNorm, bias + GELU, table RoPE, full attention
 *   random.cu    random weights of any config straight on the GPU (m3 bench --random-weights)
 * scripts/kernel_renames.txt maps the kernels' names before issue 24 to today's.
 * Benchmarks with a CPU check: bench/bench_cuda_linear.c, bench/bench_cuda_attn.c; per-kernel
 * times of a whole step: scripts/gpu-ncu.sh.
 *
 * Thread-safety: one backend context per thread; ops are not reentrant. */
#ifndef M3_CUDA_H
#define M3_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* the project's C headers too: the .cu files call into C */
#endif

#include "../../base/err.h"
#include "../../base/fault.h"
#include "../../io/config.h"
#include "../../weights/weights.h"
#include "../ops.h"

/* 1 when this binary was built with the CUDA backend */
int m3_cuda_built(void);
/* number of usable CUDA devices (0 without a driver or a GPU, or when not built with CUDA) */
int m3_cuda_device_count(void);
/* Fills ops with the CUDA backend on device dev. -1 + err when no GPU or the init failed. */
int m3_cuda_ops_init(m3_ops *ops, int dev, m3_err *err);
void m3_cuda_ops_free(m3_ops *ops);
/* The CUDA stream (cudaStream_t) every op of this backend is queued on: tensor parallelism
 * queues its NCCL collectives there too (src/parallel/comm.h), in order with the ops. */
void *m3_cuda_stream(const m3_ops *ops);
/* "NVIDIA H200, 132 SMs, 139.8 GiB" */
const char *m3_cuda_device_name(const m3_ops *ops);
/* device memory: bytes free and total right now; peak bytes the backend allocated */
void m3_cuda_mem_info(const m3_ops *ops, size_t *free_b, size_t *total_b, size_t *peak_b);

/* Random weights for config c (first n_layers layers; 0 = all) built on the GPU in the
 * formats of the real checkpoint: MXFP8 linears, NVFP4 routed experts, BF16 router /
 * embeddings / lm_head, f32 norms (0: Gemma norms scale by 1). Values are chosen so that
 * activations stay finite. *w is a device-side m3_weights (release with weights_release). */
/* One linear uploaded in the device layout (MXFP8 / NVFP4 tiled); w and scale are released
 * with ops->release. For benchmarks of single matrices. */
int m3_cuda_upload_linear(m3_ops *ops, const m3_linear *host, m3_linear *dev, m3_err *err);
int m3_cuda_random_weights(m3_ops *ops, const m3_config *c, int n_layers, uint64_t seed, m3_weights *w, m3_err *err);
/* The same in the shapes and formats of `shape` (m3_weights_shapes, or a tensor-parallel
 * rank's view of it: experts without weights there stay absent; its aux tensors too, as the
 * DSpark draft's m3_dspark_weights_shapes sets them). */
int m3_cuda_random_weights_like(m3_ops *ops, const m3_config *c, const m3_weights *shape, uint64_t seed, m3_weights *w,
                                m3_err *err);

/* Device-to-device copy bandwidth in bytes/s (read + write counted), measured over bytes. */
double m3_cuda_copy_bandwidth(m3_ops *ops, size_t bytes);
/* Recorded steps replayed so far (CUDA graphs; tests). */
long m3_cuda_graph_replays(const m3_ops *ops);
/* step shapes refused recording after failed recordings (graph_refuse.h); *on: whether the
 * backend still records graphs at all (NULL: not asked) */
int m3_cuda_graphs_refused(const m3_ops *ops, int *on);
/* Dense matrix rate ceiling: best of 10 cuBLAS BF16 GEMMs n x n x n (f32 accumulation) in
 * FLOP/s (2 n^3 per product), on random data; 0 on failure. */
double m3_cuda_gemm_rate(m3_ops *ops, int n);
/* Wall time of the queued work, for benchmarks: synchronizes and returns seconds. */
double m3_cuda_sync_time(m3_ops *ops);

/* For benchmarks: when on, the MoE op records which experts each layer's step used
 * (host sync per layer: not for timed runs). Returns the number of distinct (layer, expert)
 * pairs since the last reset. */
void m3_cuda_count_experts(m3_ops *ops, int on);
/* Precision of the linear layers: 0 exact (f32 inputs: the reference mode, the default for now),
 * 1 bf16 (inputs rounded to bf16 on the tensor cores' GEMM for more than 64 tokens; the rest of
 * the step unchanged). Issue 25 takes the bf16 mode to every GEMM and makes it the default. */
void m3_cuda_set_precision(m3_ops *ops, int bf16);
long m3_cuda_experts_used(m3_ops *ops, int reset);

/* Per-op GPU time (CUDA events around every op; adds a little overhead): on = 1 starts
 * recording, m3_cuda_profile_report prints the sum per op since then and stops. */
void m3_cuda_profile(m3_ops *ops, int on);
void m3_cuda_profile_report(m3_ops *ops, int steps, void *file /* FILE * */);

#ifdef __cplusplus
}
#endif

#endif
