/* The weights layer, below the backends, the parallel views and the model: the weight formats
 * (m3_wfmt), the linear descriptor every backend's kernels read (m3_linear), and the model's
 * weights bound to a checkpoint. Weights stay in their stored format inside the safetensors
 * mapping; kernels dequantize on the fly. Only small vectors (norm weights, routing bias) are
 * converted to f32 copies. */
#ifndef M3_WEIGHTS_H
#define M3_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../io/config.h"
#include "../io/safetensors.h"

typedef enum {
    M3_WF_F32, M3_WF_BF16, M3_WF_F16,
    M3_WF_MXFP8,  /* E4M3 values, one E8M0 scale per 32 along K */
    M3_WF_NVFP4,  /* E2M1 codes (2 per byte, low nibble first), E4M3 scale per 16, f32 global */
    M3_WF_COUNT
} m3_wfmt;

const char *m3_wfmt_name(m3_wfmt f);

/* A [N, K] matrix (y = x W^T). Row n's data starts at w + n * row_bytes. */
typedef struct m3_linear {
    m3_wfmt fmt;
    int N, K;
    const uint8_t *w;
    size_t row_bytes;
    const uint8_t *scale;   /* MXFP8: E8M0 [N][K/32]; NVFP4: E4M3 [N][K/16] */
    size_t scale_row;       /* scale bytes per row */
    float gmul;             /* NVFP4: global multiplier (1/weight_global_scale, or weight_scale_2) */
    int tiled;              /* CUDA device copies only: rows in tiles of 16 stored unit by unit
                             * (backend/cuda/common.cuh, wt_tiled); 0 everywhere else */
    int scale_max;          /* CUDA device copies of tiled MXFP8 matrices only: their largest E8M0
                             * code (the wgmma GEMM's weight expansion, gemm_tc.cu); 0 elsewhere */
} m3_linear;

/* Bytes of weight data (values + scales) one full pass over W reads. */
size_t m3_linear_bytes(const m3_linear *W);
/* Bytes of one row's K values, and of its block scales, stored densely. A column slice of a
 * larger matrix (tensor parallelism, src/parallel/shard.h) keeps the full matrix's row_bytes /
 * scale_row as strides, larger than these. */
size_t m3_linear_dense_row_bytes(const m3_linear *W);
size_t m3_linear_dense_scale_row(const m3_linear *W);

typedef struct m3_mlp_w { m3_linear gate, up, down; } m3_mlp_w;

typedef struct m3_layer_w {
    int sparse, moe;
    float *in_norm, *post_norm, *q_norm, *k_norm;
    m3_linear q, k, v, o;
    /* sparse layers: the lightning indexer */
    m3_linear iq, ik;
    float *iq_norm, *ik_norm;
    /* dense layers */
    m3_mlp_w mlp;
    /* MoE layers */
    m3_linear router;
    float *route_bias;        /* [E] or NULL */
    m3_mlp_w *experts;        /* [E] */
    int has_shared;
    m3_mlp_w shared;
    void *backend;            /* backend-private data of this layer (CUDA: device expert table) */
} m3_layer_w;

#define M3_WEIGHTS_AUX 4

typedef struct m3_weights {
    m3_st *st;
    m3_layer_w *layers;
    int n_layers;
    int hidden, head_dim, index_dim, n_experts; /* vector lengths: norms, routing bias, experts[] */
    m3_linear embed;          /* [V, H], plain format */
    m3_linear lm_head;        /* [V, H] */
    float *final_norm;
    void *dev_arena;          /* backend copies: the one device allocation holding every tensor */
    /* Tensors of a companion model that ride the same upload (the DSpark draft, src/model/dspark.h,
     * says which are which): linears with w NULL and vectors NULL are absent. Vectors are owned
     * (m3_weights_free frees them) and aux_vec_n[i] floats long. */
    m3_linear aux[M3_WEIGHTS_AUX];
    float *aux_vec[M3_WEIGHTS_AUX];
    int aux_vec_n[M3_WEIGHTS_AUX];
    char prefix[64];          /* "language_model." (hub layout) or "" (bare model.*) */
    /* summary */
    size_t n_tensors_used;
    uint64_t bytes_by_fmt[M3_WF_COUNT];
    int count_by_fmt[M3_WF_COUNT];
} m3_weights;

/* Binds every tensor the config needs from the opened checkpoint, validating names,
 * dtypes and shapes. On error, names the tensor with expected and found shapes. */
int m3_weights_bind(m3_weights *w, const m3_config *c, m3_st *st, m3_err *err);
void m3_weights_free(m3_weights *w);

/* Shapes without data: the first n_layers layers of c in the real checkpoint's formats (MXFP8
 * attention, indexer, dense MLP and shared expert; NVFP4 routed experts; BF16 router,
 * embeddings and lm_head), tensor pointers set to a placeholder that must never be read and
 * vectors NULL. For building random weights of real shapes on a device, whole or as a
 * tensor-parallel rank's view (m3_shard_weights). Free with m3_weights_free. */
int m3_weights_shapes(m3_weights *w, const m3_config *c, int n_layers, m3_err *err);
/* One linear [N, K] of fmt in the manner of m3_weights_shapes (its bytes nowhere), counted in
 * w's summary. */
void m3_weights_shape_linear(m3_weights *w, m3_linear *L, m3_wfmt fmt, int N, int K);

/* Binds one linear [N, K] stored under prefix + base (+ ".weight", scales...) in any supported
 * format, or one vector [n] (prefix + name) as an owned f32 copy; errors name the tensor.
 * For checkpoints other than the model's (the DSpark draft). */
int m3_weights_bind_linear(m3_st *st, const char *prefix, const char *base, int N, int K, m3_linear *L, m3_err *err);
int m3_weights_bind_vec(m3_st *st, const char *prefix, const char *name, int n, float **out, m3_err *err);

/* Reads every mapped byte once so the weights are resident before the first step;
 * progress(done, total, arg) is called about every 64 MB. */
void m3_weights_prefault(const m3_st *st, void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg);

#endif
