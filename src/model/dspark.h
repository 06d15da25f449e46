/* DSpark draft model (spec section 4): a small dense decoder that drafts a block of tokens
 * from the target's hidden states, sharing the target's embeddings and lm_head.
 *
 * Checkpoint: <model>/dspark/ (config.json + safetensors, tensors under
 * "language_model.model.dspark." or "model.dspark."): fc [H, n_t*H], hidden_norm, final_norm,
 * markov_head.markov_w{1,2} [V, r], confidence_head.proj {weight [1, H+r], bias [1]} and
 * layers.i.decoder_layer.* (an M3 dense decoder layer, MXFP8 linears in the real one).
 *
 * What it computes:
 *   context  for every committed target position t, ctx_t = hidden_norm(fc(concat_l h_l[t]))
 *            (h_l: the target's residual stream after layer l, ascending l); each draft layer
 *            keeps K = rope(k_norm(k_proj(ctx_t)), t) and V = v_proj(ctx_t) (no input norm, no
 *            query, no MLP) in a per-request ring of `sliding_window` positions
 *            (m3_dspark_ctx).
 *   block    slots [anchor, noise, ..., noise] at positions pos..pos+n-1, embedded with the
 *            target's embeddings, through the draft layers (input norm, q/k/v, per-head QK
 *            norm + partial RoPE, attention, o_proj, post norm, SwiGLU-OAI MLP), each slot
 *            attending to the context keys of positions < pos within its window (keys at
 *            positions >= its own position - window + 1) and to ALL the block's keys
 *            (non-causal inside the block); final_norm, then the target's lm_head: base
 *            logits, slot i predicting position pos+i+1.
 *   markov   logits_i += markov_w2 @ markov_w1[prev] (prev: the anchor for slot 0, else the
 *            token drawn at slot i-1); the drawing itself lives in src/engine/spec.c.
 *   confidence  c_i = sigmoid(proj([h_i ; markov_w1[prev]])), h_i slot i's final-normed hidden
 *            state (the spec leaves which hidden open), prev as for the Markov row
 *            (m3_dspark_confidence_n); it only decides how many drafts to verify and never
 *            changes outputs (spec section 4): the engine uses it when
 *            "dspark_confidence_threshold" is set (src/engine/spec.h), else verifies all.
 *
 * Open item kept a switch: cfg.last_layer_final_norm (default 0) feeds the last target
 * layer's stream after the target's final norm, as one port does, instead of the raw stream.
 *
 * Backends. Everything goes through m3_ops: linears, norms, RoPE, the MLP, the embedding
 * lookups, the attention over (context ring + block) (dspark_attention) and the context ring,
 * which lives in the backend's memory (alloc / copy). On a backend that keeps its own copy of
 * the weights (weights_upload: CUDA) the draft's weights go there through the same upload as
 * the target's (packed into an m3_weights, see dspark.c), and the draft must share the
 * target's op table (it reads the target's embeddings and lm_head there). A pass is a step
 * for the backend (begin_step: its positions and ids copied once). The blocks of several
 * requests go through one forward (m3_dspark_block_n); their logits stay in backend memory,
 * where the Markov rows are added slot by slot (m3_dspark_markov_n); then either the slot's
 * greedy draws are made there (m3_dspark_argmax_n: only the ids come back; m3_dspark_greedy_n:
 * every slot's draw and Markov row on the backend, one download for the pass;
 * m3_dspark_draw_n: the same with probabilistic draws, draw_rows, the distributions left in
 * backend memory for the target's verification there, verify_rows) or its rows come to the
 * host for the draw (src/engine/spec.c). The context may be appended from feature rows in
 * backend memory (m3_dspark_ctx_append_dev: the engine's device capture; m3_dspark_ctx_append_n:
 * a step's appends in one pass). The requests' full context rings are reserved out of the KV
 * budget (m3_dspark_reserve; at the real shapes 84 MB a request, f32). Not yet: the draft's own
 * CUDA graphs (a pass is launched op by op: ~135 launches at batch 1, ~0.15-0.2 ms of gaps).
 *
 * Threads: a loaded m3_dspark is read-only except for its workspace, so one thread at a
 * time calls the functions below (the engine thread); m3_dspark_ctx belongs to a request. */
#ifndef M3_DSPARK_H
#define M3_DSPARK_H

#include <stdint.h>

#include "m3.h"

typedef struct m3_dspark_config {
    m3_config base;             /* decoder shapes: hidden, heads, head_dim, rotary, eps, dense width */
    int n_target;               /* n_t: target layers fed into fc */
    int *target_layers;         /* [n_target], 0-based target layer ids, strictly ascending */
    int block_size;             /* dspark_block_size (informational: the engine drafts num_speculative_tokens) */
    int noise_id;               /* dspark_noise_token_id */
    int markov_rank;            /* r */
    int window;                 /* sliding_window (positions a query may look back, itself included) */
    int confidence_head;        /* enable_confidence_head */
    int last_layer_final_norm;  /* [open] switch, see above */
} m3_dspark_config;

/* Parses a draft config.json text (VL wrapper or flat) and checks it against the target's
 * config (hidden size, vocabulary, layer ids). `what` names the source in messages. */
int m3_dspark_config_parse(m3_dspark_config *c, const char *json, const char *what, const m3_config *target,
                           m3_err *err);
void m3_dspark_config_free(m3_dspark_config *c);

typedef struct m3_dspark_layer {
    float *in_norm, *post_norm, *q_norm, *k_norm;
    m3_linear q, k, v, o;
    m3_mlp_w mlp;
} m3_dspark_layer;

typedef struct m3_dspark {
    m3_dspark_config cfg;
    const m3_model *target;     /* borrowed: embeddings, lm_head, final norm */
    m3_ops *ops;
    m3_st *st;
    char prefix[64];            /* tensor name prefix found in the checkpoint */
    m3_linear fc;               /* [H, n_t*H] */
    float *hidden_norm, *final_norm;
    m3_linear markov_w1, markov_w2; /* [V, r] */
    m3_linear conf_w;           /* [1, H + r] (when cfg.confidence_head) */
    float *conf_bias;           /* [1] */
    float conf_bias_h;          /* its value on the host (m3_dspark_confidence_n reads it once) */
    int conf_bias_read;
    m3_dspark_layer *layers;    /* [cfg.base.n_layers] */
    uint8_t *capture;           /* [target n_layers]: 1 for the layers the context needs (m3_taps.capture_layers) */
    size_t n_tensors;
    uint64_t bytes;             /* weight bytes bound */
    void *ws;                   /* workspace (backend memory), grown on demand */
    size_t ws_bytes;
    float *hbias;               /* [V] host copy of a Markov row (backends with device memory) */
    m3_weights *dw;             /* the weights in backend memory (weights_upload), else NULL; the
                                 * fields above then point there */
    /* the last block pass (m3_dspark_block_n), in the workspace: logits [n][nreq][V] slot-major,
     * the Markov scratch [nreq][r] and [nreq][V] */
    float *lg, *mk_r, *mk_v;
    float *lg_h, *cf_in, *cf_out;   /* final-normed hidden [n][nreq][H] slot-major; the confidence head's
                                     * input [nreq][H + r] and output [n][nreq] */
    int32_t *mk_ids;            /* [n + 1][nreq] greedy draws (m3_dspark_argmax_n, m3_dspark_greedy_n) */
    m3_draw_param *mk_par;      /* [n][nreq] a drawn chain's parameters (backend memory: draw_rows_dev) */
    m3_draw_param *mk_hpar;     /* ... their host copy, mk_hpar_cap rows */
    int mk_hpar_cap;
    int lg_nreq, lg_n;
    /* host metadata of a pass (positions, sequence ids, token ids) and its batch (begin_step) */
    int32_t *hpos, *hseq, *hids;
    int meta_cap;
    m3_batch pb;
    m3_kv_seq *pseq[1];
} m3_dspark;

/* Loads the draft in dir (config.json + safetensors) for target (which must outlive it). */
int m3_dspark_load(m3_dspark *d, const char *dir, const m3_model *target, m3_ops *ops, m3_err *err);
void m3_dspark_free(m3_dspark *d);

/* Requests one block pass takes at most (the engine's M3_SPEC_DRAFT_BATCH). */
#define M3_DSPARK_BATCH_MAX 32
/* The memory a draft needs besides its weights to serve max_seqs requests in steps of up to
 * max_tokens tokens with k drafts: its workspace is grown now (in the backend's memory, so that a
 * KV budget computed afterwards counts it), and *ring_bytes gets what the requests' context rings
 * take once every one holds a full window (they grow as the requests do). */
int m3_dspark_reserve(m3_dspark *d, int max_seqs, int max_tokens, int k, size_t *ring_bytes, m3_err *err);

/* Width of one context feature row: n_target * hidden (the captured rows, concatenated). */
int m3_dspark_feat_dim(const m3_dspark *d);
/* Index of target layer l in the feature row, or -1 when the draft does not use it. */
int m3_dspark_feat_slot(const m3_dspark *d, int target_layer);

/* A request's context cache: K/V of every draft layer for the positions [first, len) that
 * fit the window, in a ring grown on demand up to `window` slots. Zero-initialize. */
typedef struct m3_dspark_ctx {
    int first;                  /* first position appended since the last reset */
    int len;                    /* positions [0, len) are context (those < first are never read) */
    int cap;                    /* ring slots */
    float **k, **v;             /* [n_layers] rings [cap][nkv*D] in the backend's memory */
    int n_layers;
    m3_ops *ops;                /* the op table the rings belong to (the draft's) */
} m3_dspark_ctx;

/* Forgets every entry; the next append starts at position pos (admission after a prefix
 * cache hit: positions < pos lie outside every later query's window). */
void m3_dspark_ctx_reset(m3_dspark_ctx *c, int pos);
void m3_dspark_ctx_free(m3_dspark_ctx *c);

/* Adds positions [pos0, pos0 + n) (pos0 == c->len) from feat, host f32 [n][feat_dim]: the
 * target's captured rows of those positions. Only committed positions may be added. */
int m3_dspark_ctx_append(m3_dspark *d, m3_dspark_ctx *c, const float *feat, int pos0, int n, m3_err *err);

/* The same from feature rows in the draft's backend memory (the engine's device capture). */
int m3_dspark_ctx_append_dev(m3_dspark *d, m3_dspark_ctx *c, const float *feat, int pos0, int n, m3_err *err);

/* One context's rows of a batched append: positions [pos0, pos0 + n) (pos0 == ctx->len) from
 * feat, [n][feat_dim] in the draft's backend memory. */
typedef struct m3_dspark_rows {
    m3_dspark_ctx *ctx;
    const float *feat;
    int pos0, n;
} m3_dspark_rows;

/* The appends of na contexts (each at most once) in one pass of the draft: one fc and one K / V
 * projection per layer over all their rows, then each context's ring. n == 0 entries are
 * skipped. On failure no context's length changes. */
int m3_dspark_ctx_append_n(m3_dspark *d, const m3_dspark_rows *a, int na, m3_err *err);

/* Base logits (before the Markov term) of a block of n slots [anchor, noise...] at positions
 * pos.. (pos == c->len): host f32 [n][V]. */
int m3_dspark_block_logits(m3_dspark *d, const m3_dspark_ctx *c, int32_t anchor, int pos, int n, float *logits,
                           m3_err *err);

/* logits[V] += markov_w2 @ markov_w1[prev] (host row). */
int m3_dspark_markov(m3_dspark *d, int32_t prev, float *logits, m3_err *err);

/* The blocks of nreq requests (request j: context c[j], anchor[j] at pos[j] == c[j]->len), n
 * slots each, in one forward: base logits kept in backend memory (d->lg) for
 * m3_dspark_markov_n. A later pass of any kind (append, block, markov) may reuse the memory. */
int m3_dspark_block_n(m3_dspark *d, int nreq, const m3_dspark_ctx *const *c, const int32_t *anchor, const int *pos,
                      int n, m3_err *err);

/* Slot `slot` of the last m3_dspark_block_n: each request j's row gets markov_w2 @
 * markov_w1[prev[j]] added in backend memory, then the nreq corrected rows come to rows
 * (host f32 [nreq][V]; NULL: they stay). Slots in order, each once. */
int m3_dspark_markov_n(m3_dspark *d, int slot, const int32_t *prev, float *rows, m3_err *err);

/* ids[j] = the first index of the largest of slot `slot`'s row j over [0, n_text), computed where
 * the rows are (ops argmax_rows; -1 + err without it): the greedy draws of requests whose
 * sampler changes nothing (m3_sampler_plain_greedy), after m3_dspark_markov_n of the slot. */
int m3_dspark_argmax_n(m3_dspark *d, int slot, int n_text, int32_t *ids, m3_err *err);
/* Slots 0..k-1 of the last m3_dspark_block_n drawn greedily on the backend, each Markov row
 * corrected with the draw before it (anchor[j] at slot 0), as m3_dspark_markov_n and
 * m3_dspark_argmax_n slot by slot would, but with one download at the end (ops embed_dev and
 * argmax_rows; -1 + err without them): ids [k][nreq] slot-major; conf (NULL: not wanted) gets
 * the confidence head's [k][nreq] as m3_dspark_confidence_n would. */
int m3_dspark_greedy_n(m3_dspark *d, const int32_t *anchor, int k, int n_text, int32_t *ids, float *conf, m3_err *err);
/* Slots 0..k-1 chained as m3_dspark_greedy_n chains them, each slot's Markov-corrected rows
 * drawn on the backend (op draw_rows): request j's row becomes the distribution par[j] makes
 * of it (its .u ignored: u[i * nreq + j] is the uniform of slot i's draw), ids [k][nreq] the
 * draws; request j's k distributions go to qd[j] (backend memory [k][V]: the target's
 * verification reads them there, ops verify_rows), else to q[j] (host [k][V]), else nowhere (q,
 * qd or their entries NULL); conf as m3_dspark_greedy_n's. One download of the ids, one copy or
 * download per distribution row. */
int m3_dspark_draw_n(m3_dspark *d, const int32_t *anchor, int k, const m3_draw_param *par, const double *u, int32_t *ids,
                     float *const *q, float *const *qd, float *conf, m3_err *err);
/* The confidence head of slot `slot` of every request of the last block pass, after
 * m3_dspark_markov_n of the slot (whose Markov input it reads): conf[j] = sigmoid(proj([h ;
 * markov_w1[prev_j]])), h the slot's final-normed hidden state. -1 when the draft has none. */
int m3_dspark_confidence_n(m3_dspark *d, int slot, float *conf, m3_err *err);

/* Weight shapes of a draft (m3_weights_shapes' way: the bytes nowhere), packed as dspark.c
 * packs a draft for the upload: for random device weights of real shapes (m3 bench). */
int m3_dspark_weights_shapes(const m3_dspark_config *c, m3_weights *w, m3_err *err);

/* A draft from weights already in ops' memory, packed as above (random weights: m3 bench):
 * takes cfg and *dw (both freed with the draft, also on failure). */
int m3_dspark_from_device(m3_dspark *d, m3_dspark_config *cfg, const m3_model *target, m3_ops *ops, m3_weights *dw,
                          m3_err *err);

#endif
