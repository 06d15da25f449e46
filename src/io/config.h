/* MiniMax-M3 text config: read from config.json in the hub spelling (VL wrapper with
 * text_config, sparse_attention_config, moe_layer_freq) or the transformers spelling
 * (layer_types, mlp_layer_types, index_*, rope_parameters), or a flat text config.
 * Every field the engine uses is validated; a missing or bad one is an error naming it. */
#ifndef M3_CONFIG_H
#define M3_CONFIG_H

#include <stdint.h>

#include "../base/err.h"

typedef struct m3_config {
    int vocab, hidden, n_layers;
    int n_heads, n_kv_heads, head_dim, rotary_dim;
    double rope_theta, rms_eps;
    /* MLPs */
    int dense_inter;              /* dense-MLP width */
    int n_experts, top_k, moe_inter;
    int n_shared, shared_inter;   /* shared experts (0 or 1 in M3) */
    double routed_scale, swiglu_alpha, swiglu_limit;
    int use_routing_bias;
    /* lightning indexer / MSA sparse attention */
    int index_heads, index_dim, block_size, topk_blocks, local_blocks, init_blocks;
    /* per layer: 1 = sparse attention / MoE */
    uint8_t *layer_sparse, *layer_moe;
    int n_sparse_layers, n_moe_layers;
    int tie_embeddings;
    int bos_id, eos_id;           /* -1 when absent */
    int max_positions;            /* max_position_embeddings (the context the model was trained for); 0 when absent */
    char quant_method[32];        /* "" when unquantized */
    /* Not read from config.json: a runtime switch (m3_config_set_fc1_quant, --moe-act-quant) */
    int fc1_quant;                /* the routed experts' FC1 input: 0 as is, 1 NVFP4 per token (ops.h m3_moe_p) */
} m3_config;

/* path: config.json or its directory. */
int m3_config_load(m3_config *c, const char *path, m3_err *err);
/* from a JSON text (for tests and fuzzing); `what` names the source in messages */
int m3_config_parse(m3_config *c, const char *json, const char *what, m3_err *err);
void m3_config_free(m3_config *c);
/* The routed experts' FC1 input quantization by name: "none" (as is, the reference's) or "nvfp4"
 * (per token, what the M3.1 experts were trained with; needs hidden_size divisible by 16). -1 with
 * err naming the value or the shape otherwise. */
int m3_config_set_fc1_quant(m3_config *c, const char *name, m3_err *err);

#endif
