/* The MiniMax-M3 text model: load a checkpoint, run a forward step over a batch of tokens.
 * One forward function, readable top to bottom (m3.c); the math lives in the backend ops. */
#ifndef M3_MODEL_H
#define M3_MODEL_H

#include "../backend/ops.h"
#include "../io/config.h"
#include "../io/safetensors.h"
#include "../parallel/shard.h"
#include "../kv/kv.h"
#include "../weights/weights.h"

struct m3_comm;

typedef struct m3_model {
    m3_config cfg;
    m3_st *st;
    m3_weights w;      /* bound to the checkpoint (host mapping) */
    m3_weights *dw;    /* the same in backend memory when the backend keeps its own copy (CUDA), else NULL */
    m3_ops *ops;
    double load_seconds;
    void *ws;          /* activation workspace (backend memory), reused across steps */
    size_t ws_bytes;
    /* Tensor parallelism (src/model/group.h): a rank's model computes its shard (heads, KV
     * heads, experts or width, vocabulary rows) and sums partial results with comm. At TP1
     * comm is NULL and shard unused. A rank's model is a view: cfg, st and the tensors belong
     * to the full model (w holds the rank's views of them, see m3_shard_weights). */
    m3_shard shard;
    struct m3_comm *comm;
    int is_view;
} m3_model;

/* The weights the ops compute with: the backend's copy when there is one. */
static inline const m3_weights *m3_model_weights(const m3_model *m) { return m->dw ? m->dw : &m->w; }

/* Where the model's KV pages must live (device memory on a device backend). */
static inline m3_kv_mem m3_model_kv_mem(const m3_model *m) {
    m3_kv_mem k = {0, 0, 0};
    if (m->ops && m->ops->device_memory) { k.alloc = m->ops->alloc; k.release = m->ops->release; k.ctx = m->ops->ctx; }
    return k;
}

typedef void (*m3_progress_fn)(uint64_t done, uint64_t total, void *arg);

/* dir: checkpoint directory (config.json + safetensors). progress may be NULL. ops NULL: bind
 * the host weights only (no upload, no prefault): the full model behind a TP group. */
int m3_model_load(m3_model *m, const char *dir, m3_ops *ops, m3_progress_fn progress, void *arg, m3_err *err);
void m3_model_free(m3_model *m);

/* Optional observers of one forward step (tests, --dump-index). */
typedef struct m3_taps {
    void *arg;
    /* residual stream: layer 0 = embeddings, l = after layer l, n_layers = after the final norm; host f32 [T, H] */
    void (*hidden)(void *arg, int layer, const float *h, int T, int H);
    /* block selection of a sparse layer: host [T][ni][topk] */
    void (*index)(void *arg, int layer, const int32_t *sel, int T, int ni, int topk);
    /* Narrow capture (DSpark context): capture(arg, l, h, T, H) gets the residual stream after
     * (0-based) layer l (the layer's output added, no final norm), host f32 [T, H], only for the
     * layers with capture_layers[l] != 0 ([n_layers]); the other layers cost nothing. */
    const uint8_t *capture_layers;
    void (*capture)(void *arg, int layer, const float *h, int T, int H);
    /* Teacher forcing (accuracy checks: m3 logits --teacher-forced): before (0-based) layer l,
     * stream(arg, l, h, T, H) gets the residual stream entering it (host f32 [T, H]) and may
     * overwrite it; it returns 1 when it did (the layer then starts from h: its input norm, its
     * K / V / index-K in the cache, everything after), 0 to leave the stream as it was. So each
     * layer can be checked alone, on a reference's input, without a second forward pass. */
    int (*stream)(void *arg, int layer, float *h, int T, int H);
    /* capture_dev: capture gets h in the op table's memory instead (no download; it may issue
     * ops reading h, such as copy_rows, and nothing else). Such a step may be recorded and
     * replayed (CUDA graphs) when capture is the only tap: graph_key then names what the ops
     * capture issues depend on beyond the step's shapes (where they write), and capture
     * issues the same ops for the same key. */
    int capture_dev;
    uint64_t graph_key;
    /* Greedy output rows (optional; ops argmax_rows_fin, no tensor parallelism): output row i with
     * greedy_n[i] > 0 gets greedy_ids[i] = the first index of the largest of its logits over
     * [0, greedy_n[i]) and greedy_fin[i] = 1 when all V of them are finite (host int32 [n_out]),
     * computed where the logits are; its logits row is not written. *greedy_done = 1 when that
     * was done; 0: every row was written as without greedy_n. Not a tap: such a step still
     * records and replays. */
    const int32_t *greedy_n;
    int32_t *greedy_ids, *greedy_fin;
    int *greedy_done;
    /* Drawn output rows (with greedy_n; op draw_rows): row i with greedy_n[i] < 0 gets greedy_ids[i]
     * = a draw from the distribution draw_par[i] makes of its logits (ops.h draw_rows, its
     * uniform in draw_par[i].u) and greedy_fin[i] as above; its logits row is not written. */
    const m3_draw_param *draw_par;
    /* Verified requests (with draw_par; op verify_rows): verify[0..n_verify) (host), each the k + 1
     * drawn output rows of a speculative request from output row row0 on, its drafts, q rows and
     * uniforms; after the draws, greedy_ids of its rows are as verify_rows leaves them. */
    const m3_verify_group *verify;
    int n_verify;
    /* Prompt logprob rows (optional; op logprob_rows, no tensor parallelism): batch rows
     * lp_rows[0..n_lp) (ascending; not output rows, and not written to logits) each get lp_out[i]
     * (host) = the op's log-softmax of its logits over [0, lp_n[i]) (its text ids) at token
     * lp_tok[i], with its lp_k (<= 20) most likely ids (m3_row_lp; fin 0: a logit was not
     * finite). The final norm and
     * the lm_head run over them M3_LP_TILE rows at a time, and only the answers leave the
     * backend: a prompt's every position costs a tile of logits, not a row each. Not a tap:
     * such a step is issued directly (never recorded in a graph: it is a prefill). */
    const int32_t *lp_rows, *lp_tok, *lp_n;
    int n_lp, lp_k;
    m3_row_lp *lp_out;
} m3_taps;

/* rows of logits a step holds at once for its prompt logprob rows (m3_taps.lp_rows) */
#define M3_LP_TILE 256

/* Runs ids[b->T] (host memory) through the model, writing their K/V/index-K into kv (pages are reserved
 * here). logits: host [n_out, V] for the tokens listed in out_rows (NULL: computed but not copied out).
 * A rank of a TP group (m->comm set) is driven by m3_group_forward on its own thread: kv is the
 * rank's cache (its KV heads), the sequences' pages are reserved (and seq->len advanced) by the
 * group, the all-reduces after o_proj and after the MLP / MoE and the logits all-gather run
 * through m->comm, and logits (whole vocabulary) are written by whichever rank is given them. */
int m3_forward(m3_model *m, m3_kv *kv, const m3_batch *b, const int32_t *ids, const int *out_rows, int n_out,
               float *logits, const m3_taps *taps, m3_err *err);

/* Optional input override of one step (image inputs): batch row rows[i] (an index into ids,
 * 0 <= rows[i] < T) takes emb[i] (host f32 [n][hidden]) in place of the embedding of
 * ids[rows[i]]; the rows keep their ids, positions and cache slots. */
typedef struct m3_embed_override {
    int n;
    const int32_t *rows;
    const float *emb;
} m3_embed_override;

/* m3_forward with an embedding override (ov NULL or ov->n == 0: exactly m3_forward). */
int m3_forward_ex(m3_model *m, m3_kv *kv, const m3_batch *b, const int32_t *ids, const m3_embed_override *ov,
                  const int *out_rows, int n_out, float *logits, const m3_taps *taps, m3_err *err);

/* One sequence: runs ids[0, n) at positions pos0.. through the model in chunks of at most
 * ubatch tokens, and writes the logits of the last one to logits (host [V]; NULL: none). */
int m3_run_tokens(m3_model *m, m3_kv *kv, m3_kv_seq *seq, const int32_t *ids, int n, int pos0, int ubatch,
                  float *logits, m3_err *err);

#endif
