/* m3_shard: what rank r of N computes under tensor parallelism, and its view of the weights.
 *
 * The split (Megatron style: one all-reduce after o_proj, one after the MLP / MoE):
 *   attention   query heads [head0, head0 + n_heads), n_heads = n_heads / N: q_proj rows,
 *               o_proj columns (a partial sum of o_proj's output). KV heads: N | nkv gives
 *               each rank nkv / N KV heads; when N > nkv (N a multiple of nkv) each KV head is
 *               replicated on N / nkv ranks and each rank holds the one its query heads use.
 *   indexer     per KV-head group (index heads == KV heads): the rank's index heads
 *               (index_q_proj rows); index_k_proj (one head shared by all) is replicated, and
 *               each rank caches index-K for itself.
 *   dense MLP   intermediate width: gate / up rows, down columns.
 *   MoE         router replicated (every rank routes every token identically), then either
 *               M3_MOE_EXPERTS (expert parallel): rank r holds the contiguous block of experts
 *               [E r / N, E (r+1) / N) whole, the others are left without weights (w NULL)
 *               and contribute nothing on this rank; or M3_MOE_WIDTH: every expert split by
 *               intermediate width like the dense MLP. The shared expert is split by width in
 *               both modes.
 *   lm_head     vocabulary rows [vocab0, vocab0 + n_vocab) (balanced, sizes differ by at most
 *               one); the logits are all-gathered with vocab_stride rows per rank.
 *   embeddings, norms: replicated (the residual stream is whole on every rank).
 * Width splits move in whole units so that block scales stay aligned: 32 columns for MXFP8
 * (one E8M0 scale), 16 for NVFP4 (one E4M3 scale), 8 for plain formats (SIMD width). Units are
 * dealt out balanced and contiguous; a dense MLP or an expert too narrow to give every rank a
 * unit, and an o_proj whose head boundary falls inside a scale group, are errors that say so.
 * A shared expert too narrow for every rank is held by some ranks only (the others skip it).
 *
 * Views: m3_shard_weights builds rank r's m3_weights from the full (bound) weights without
 * copying a byte of tensor data: row slices are pointer offsets, column slices are strided
 * views (fewer columns K, the same row_bytes / scale_row strides as the full matrix).
 * A device backend's weights_upload packs strided views densely. The view owns only its
 * layer and expert arrays (m3_shard_weights_free); norms, tensors and the checkpoint stay the
 * full model's, which must outlive every view. */
#ifndef M3_SHARD_H
#define M3_SHARD_H

#include "../base/err.h"
#include "../io/config.h"
#include "../weights/weights.h"

typedef enum {
    M3_MOE_EXPERTS = 0, /* expert parallel: whole experts per rank */
    M3_MOE_WIDTH = 1,   /* every expert split by intermediate width */
} m3_moe_split;

const char *m3_moe_split_name(m3_moe_split s);               /* "experts" / "width" */
int m3_moe_split_parse(const char *s, m3_moe_split *out);    /* -1 when unknown */

typedef struct m3_shard {
    int rank, size;
    m3_moe_split moe;
    int head0, n_heads;         /* query heads */
    int kv_head0, n_kv_heads;   /* KV heads held (a replica when size > n_kv_heads) */
    int index_head0, index_heads;
    int vocab0, n_vocab;        /* lm_head rows */
    int vocab_stride;           /* rows per rank in the gathered logits: ceil(vocab / size) */
    int expert0, n_experts;     /* experts held whole (expert parallel; all of them otherwise) */
} m3_shard;

/* Plans rank `rank` of `size` for config c. Errors name the dimension that does not split. */
int m3_shard_plan(m3_shard *s, const m3_config *c, int rank, int size, m3_moe_split moe, m3_err *err);

/* Rows [vocab0, vocab0 + n) of rank r of N for vocabulary V (the logits gather uses it). */
void m3_shard_vocab_range(int V, int size, int rank, int *vocab0, int *n);

/* Rank s's view of the full weights (see above). Errors name the tensor and the alignment. */
int m3_shard_weights(const m3_weights *full, const m3_config *c, const m3_shard *s, m3_weights *view, m3_err *err);
void m3_shard_weights_free(m3_weights *view);

/* The column slice [k0, k0 + nk) of W as a strided view; -1 + err when k0 or nk cut a
 * block-scale group (MXFP8: 32, NVFP4: 16). what names the matrix in the message. */
int m3_linear_cols(const m3_linear *W, int k0, int nk, m3_linear *out, const char *what, m3_err *err);
/* The row slice [n0, n0 + nn) of W (any format). */
void m3_linear_rows(const m3_linear *W, int n0, int nn, m3_linear *out);

#endif
