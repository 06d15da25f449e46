/* The MiniMax-M3 vision tower, projector and patch merge (spec section 6), and the prompt
 * side of images (placeholder expansion, embedding override rows).
 *
 *   pixels [N, C*T*P*P] -> patch linear -> pre LayerNorm -> L pre-LN blocks (attention over
 *   the image's own patches with the t/h/w vision RoPE, GELU MLP) = vision_tower_out [N, Hv]
 *   -> projector (linear_1, GELU, linear_2) [N, H] -> every merge block's M*M rows
 *   concatenated [N/M^2, M^2*H] -> patch_merge_mlp (linear_1, GELU, linear_2) = image_embeds.
 *
 * Weights stay in the checkpoint mapping (any format m3_weights_bind_linear reads); biases,
 * norms are f32 copies. The forward runs on an op table's vision ops (LayerNorm, bias + GELU,
 * the RoPE with tables made here, attention over the image's patches) and its linear / add:
 * the CPU's, or a device backend's on a copy of the weights (m3_vision_upload). The image
 * embeddings reach the text forward through m3_embed_override (m3.h).
 *
 * Ownership: m3_vision owns its f32 copies and layer array (m3_vision_free); the linears
 * point into the m3_st it was bound from, which must outlive it. Thread-safety: a loaded
 * m3_vision is read-only; m3_vision_encode may run on several threads at once with
 * different outputs (the op table's own rules apply: the CPU pool runs one loop at a time,
 * so callers sharing one CPU op table serialize). */
#ifndef M3_VISION_H
#define M3_VISION_H

#include <stdint.h>

#include "../backend/ops.h"
#include "../base/err.h"
#include "../base/pool.h"
#include "../image/image.h"
#include "../io/safetensors.h"
#include "../weights/weights.h"

typedef struct m3_vision_config {
    int hidden, inter, layers, heads, head_dim; /* vision_config */
    int channels, patch, temporal, merge;       /* 3, 14, 2, 2 */
    double ln_eps, rope_theta;                  /* 1e-5, 1e4 */
    int proj_hidden;                            /* projector_hidden_size */
    int text_hidden;                            /* text_config.hidden_size */
    int image_token, video_token;               /* image_token_index, video_token_index (-1: absent) */
} m3_vision_config;

/* Reads the vision part of a config.json text. Returns 1 when the file has no
 * vision_config (a text-only checkpoint), 0 when parsed, -1 on a bad field (named). */
int m3_vision_config_parse(m3_vision_config *vc, const char *json, const char *what, m3_err *err);

typedef struct m3_vlinear { m3_linear w; float *b; } m3_vlinear; /* y = x W^T + b */

typedef struct m3_vision_layer {
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    m3_vlinear q, k, v, o, fc1, fc2;
} m3_vision_layer;

typedef struct m3_vision {
    int present;              /* 0: the checkpoint has no vision tower (text-only) */
    m3_vision_config cfg;
    m3_linear patch;          /* patch_embedding [Hv, C*T*P*P] (the Conv3d weight, flattened) */
    float *pre_w, *pre_b;     /* pre_layrnorm */
    m3_vision_layer *layers;
    m3_vlinear proj1, proj2;  /* multi_modal_projector: Hv -> P -> H */
    m3_vlinear merge1, merge2;/* patch_merge_mlp: M*M*H -> P -> H */
    char prefix[32];          /* "" or "model." before vision_tower.* */
    int on_device;            /* 1: a copy in a device backend's memory (m3_vision_upload) */
} m3_vision;

/* Binds the vision tower from dir/config.json and the opened checkpoint. A checkpoint
 * without vision tensors (or without vision_config) loads as text-only: rc 0, present 0.
 * Tensors present but the config or a tensor wrong: -1, the message names it. */
int m3_vision_load(m3_vision *v, const char *dir, m3_st *st, m3_err *err);
void m3_vision_free(m3_vision *v);

/* Patches of one image the tower accepts (a resized image has at most max_pixels / 196 = 2304). */
#define M3_VISION_MAX_PATCHES 16384

/* Image tokens (rows of image_embeds) for one grid (t, gh, gw): t * gh * gw / merge^2;
 * -1 when the grid does not split into merge blocks. */
int m3_vision_image_tokens(const m3_vision_config *vc, const int32_t thw[3]);
/* Sum over the images of px; -1 (with err) when px does not fit the tower (patch size,
 * grids not divisible by merge, grids not adding up to the rows). */
int m3_vision_check_pixels(const m3_vision_config *vc, const m3_pixels *px, m3_err *err);

/* Runs the tower over every image of px (attention within each image) on the op table's
 * vision ops (ops.h): a host-memory backend with v as loaded, a device backend with v from
 * m3_vision_upload. embeds: host [tokens, text_hidden] (tokens = m3_vision_check_pixels);
 * tower_out: NULL or host [px->n_patches, hidden]. */
int m3_vision_encode(const m3_vision *v, m3_ops *ops, const m3_pixels *px, float *embeds,
                     float *tower_out, m3_err *err);

/* A copy of the tower's weights in a device backend's memory (d: the same struct with device
 * pointers, on_device 1), for m3_vision_encode on that backend; release with
 * m3_vision_release (same op table). v must outlive nothing: d owns its copies. */
int m3_vision_upload(const m3_vision *v, m3_ops *ops, m3_vision *d, m3_err *err);
void m3_vision_release(m3_vision *d, m3_ops *ops);

/* Prompt expansion, as the reference processor does it: every image placeholder token
 * (image_id) becomes start_id, counts[i] image tokens, end_id (start / end left out when
 * < 0, or when a lone placeholder already sits between them). A run of image tokens is
 * taken as image i already expanded when its length is counts[i], else as that many
 * placeholders (consecutive images). Placeholders must match the images in number; images
 * are taken in order. out: malloc'd ids; rows: malloc'd positions (indices into out) of the
 * image tokens, in order, sum(counts) of them: the rows image_embeds replace. */
int m3_vision_expand_prompt(const int32_t *ids, int n, int32_t image_id, int32_t start_id, int32_t end_id,
                            const int *counts, int n_images, int32_t **out, int *out_n, int32_t **rows,
                            m3_err *err);

#endif
