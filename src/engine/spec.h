/* Speculative decoding with a DSpark draft (spec section 4): configuration, drafting with the
 * Markov correction, and the lossless verify step.
 *
 * One speculative step of a request whose last emitted token a (the anchor) sits at position
 * P with no KV entry yet:
 *   1. m3_spec_draft (m3_spec_draft_n: the step's requests in one draft pass): the draft's
 *      base logits for k slots [a, noise...] at P..P+k-1, then left to right: row_i +=
 *      Markov(prev) (prev = a, then the token drawn at i-1), and a draw. The rows stay where
 *      the draft runs (the GPU) until the draw; a plain greedy request's draw is an argmax
 *      there (m3_sampler_plain_greedy: the same token), any other's comes to the host.
 *   2. the target runs [a, d_1..d_k] at P..P+k in the same m3_forward as the other rows of
 *      the step; its logits rows 0..k are what plain decoding would have seen at each prefix.
 *   3. m3_spec_verify: emits 1..k+1 tokens, exactly distributed as plain sampling would.
 *
 * Verification, per request (the request's own m3_sampler, so every sampling option applies:
 * allowed / banned ids, logit_bias, min_tokens, repetition / frequency / presence penalties,
 * temperature, min-p, top-k, top-p):
 *   greedy request   for i = 0..k: t = m3_sampler_sample(row_i) (the argmax of the processed
 *                    row, as plain decoding takes it); emit t; go on while t == d_{i+1}.
 *                    Tokens and logprobs are bitwise those of plain decoding (the CPU forward
 *                    is batch invariant per token).
 *   sampled request  for i = 0..k-1: p = m3_sampler_probs(row_i) (the processed target
 *                    distribution, from the same pipeline m3_sampler_sample draws from, with
 *                    the penalty counts of the tokens accepted so far), q = the draft's
 *                    distribution of d_{i+1} (one-hot for greedy drafting); accept d_{i+1} with
 *                    probability min(1, p(d)/q(d)) (one uniform from the request's RNG); on
 *                    rejection emit a draw from normalize(max(0, p - q)) and stop; after k
 *                    acceptances emit a bonus token m3_sampler_sample(row_k). Every emitted
 *                    token is m3_sampler_accept'ed before the next row is processed, so the
 *                    penalties count accepted tokens only.
 * A sampled request whose distribution is plain (m3_sampler_draw_ids: temperature, top-k, top-p,
 * min-p alone, no logprobs) on a backend that draws (m3_spec_draws_on_backend) is verified where
 * its rows are instead (the engine, ops verify_rows): p_i made in place by draw_rows (the bonus
 * row drawn with the uniform the loop above would take for it), the same acceptance tests with
 * the same uniforms, the residual drawn in 2^-40 units (the same law; ids within rounding of a
 * boundary may differ from m3_spec_residual's); the ids come back, m3_spec_verify_ids emits
 * them, and the request's RNG skips the uniforms the verification took.
 * The standard speculative-sampling argument (Leviathan et al., Chen et al.) makes each
 * emitted token distributed as p given the emitted prefix, for any q with q(d) > 0 at the
 * drafted d; tests/spec checks it by chi-square, on synthetic rows and end to end.
 *
 * Where the spec is silent (section 4 [open]), we follow vLLM's generic DSpark proposer:
 *   - the block has num_speculative_tokens slots (vLLM: num_speculative_tokens query slots,
 *     slot 0 the anchor), not dspark_block_size; all k are always drafted, and the engine may
 *     verify fewer near max_tokens / the context limit or under a small token budget;
 *   - probabilistic drafting draws d_i from q_i = the request's processed distribution of the
 *     Markov-corrected draft row (vLLM applies temperature / top-k / top-p to the draft rows;
 *     we apply the whole pipeline, penalties with the counts at drafting time); the draw uses
 *     a per-request draft RNG, so the target's RNG stream is used only by verification;
 *   - greedy drafting (and any greedy request) takes the argmax of the processed draft row;
 *   - the confidence head (sigmoid(proj([h_i ; markov_w1[prev_i]])), h_i the slot's final-normed
 *     hidden state, prev_i the token its Markov correction used: the spec leaves which hidden
 *     open) only shortens verification: with "dspark_confidence_threshold" t > 0 the engine
 *     verifies d_1..d_m, m the length of the leading run of drafts whose confidence is >= t
 *     (m = 0: a plain decode step); outputs stay exactly distributed (fewer drafts proposed
 *     changes no token's law), greedy tokens stay those of plain decoding.
 */
#ifndef M3_SPEC_H
#define M3_SPEC_H

#include <stdint.h>

#include "../base/err.h"
#include "../model/dspark.h"
#include "sampler.h"

#define M3_SPEC_MAX_TOKENS 32 /* num_speculative_tokens limit */

enum { M3_SPEC_NONE = 0, M3_SPEC_DSPARK = 1 };
enum { M3_SPEC_DRAFT_PROBABILISTIC = 0, M3_SPEC_DRAFT_GREEDY = 1 };

typedef struct m3_spec_config {
    int method;                 /* M3_SPEC_NONE (off) or M3_SPEC_DSPARK */
    int num_speculative_tokens; /* k, 1..M3_SPEC_MAX_TOKENS */
    int draft_sample_method;    /* M3_SPEC_DRAFT_PROBABILISTIC (default) or M3_SPEC_DRAFT_GREEDY */
    int last_layer_final_norm;  /* [open] switch of the draft context (m3_dspark_config) */
    int draft_on_cpu;           /* "dspark_draft_backend": "cpu": the draft on a CPU op table beside a
                                 * GPU target (default "target": on the target's device when it has one) */
    double confidence_threshold; /* "dspark_confidence_threshold" in [0, 1]: verify the drafts while the
                                 * draft's confidence head gives each at least this (0: all, the default) */
    int disable_by_batch_size;  /* vLLM's "disable_by_batch_size": a step with more running requests than
                                 * this decodes without drafts (the draft's context still takes every
                                 * committed row, so speculation resumes when the batch shrinks); 0: never */
    int max_model_len;          /* vLLM's "max_model_len" of the draft: a request whose tokens and k drafts
                                 * would pass it decodes without drafts; 0: no limit */
    char draft_dir[4096];       /* where the draft checkpoint is */
} m3_spec_config;

/* Parses --speculative-config JSON: {"method": "dspark", "num_speculative_tokens": 7,
 * "draft_sample_method": "probabilistic" | "greedy", "model": DIR (optional),
 * "dspark_last_layer_final_norm": false (optional), "dspark_draft_backend": "target" | "cpu"
 * (optional), "dspark_confidence_threshold": 0.5 (optional), and vLLM's "disable_by_batch_size": 16
 * (optional, >= 2 or null), "max_model_len": N (optional, or null), "draft_tensor_parallel_size": 1
 * (optional: the only value)}. The draft directory is draft_dir when
 * non-NULL (--draft), else "model", else <model_dir>/dspark. Unknown keys are errors. */
int m3_spec_config_parse(m3_spec_config *c, const char *json, const char *model_dir, const char *draft_dir,
                         m3_err *err);

/* ---- the pieces of the verify step, over probability rows [V] ---- */

/* Accept a draft with target probability p_d and draft probability q_d given a uniform u in
 * [0, 1): u * q_d < p_d, i.e. with probability min(1, p_d / q_d) (never when p_d == 0). */
static inline int m3_spec_accept(double p_d, double q_d, double u) { return p_d > 0 && u * q_d < p_d; }
/* A draw from prob[V] (need not be normalized) with u in [0, 1), walking ids in order. */
int32_t m3_spec_draw(const float *prob, int V, double u);
/* A draw from normalize(max(0, p - q)); q NULL: one-hot at `draft` (greedy drafting). When
 * the residual has no mass (p <= q everywhere: only through rounding), draws from p. */
int32_t m3_spec_residual(const float *p, const float *q, int32_t draft, int V, double u);

/* ---- drafting ---- */

/* Drafts k tokens for a request: base logits from the draft (anchor at pos == ctx->len),
 * Markov-corrected left to right, each slot drawn with the request's sampling pipeline
 * (m3_sampler_probs): the argmax for greedy requests or method M3_SPEC_DRAFT_GREEDY, else a
 * draw from q_i with rng. rows: scratch [k][V]. q: [k][V], filled with q_i for probabilistic
 * drafting of a sampling request (then *q_used = 1), untouched otherwise (*q_used = 0). */
int m3_spec_draft(m3_dspark *d, const m3_dspark_ctx *ctx, m3_sampler *s, m3_sample_ws *ws, m3_rng *rng, int method,
                  int32_t anchor, int pos, int k, float *rows, int32_t *draft, float *q, int *q_used, m3_err *err);

/* The drafts of several requests: their blocks in one forward of the draft
 * (m3_dspark_block_n), then slot by slot the Markov rows of all of them added on the draft's
 * backend and the rows drawn on the host, each request as m3_spec_draft draws it. */
#define M3_SPEC_DRAFT_BATCH M3_DSPARK_BATCH_MAX /* requests drafted in one pass (dspark.h) */
typedef struct m3_spec_draft_req {
    const m3_dspark_ctx *ctx;
    m3_sampler *s;
    m3_rng *rng;
    int32_t anchor;
    int pos;
    int32_t *draft;             /* out: [k] */
    float *q;                   /* [k][V] as in m3_spec_draft (NULL: q_dev, else not kept) */
    float *conf;                /* out when non-NULL (the draft has a confidence head): [k] the head's
                                 * estimate that draft i will be accepted */
    int q_used;                 /* out */
    int failed;                 /* out: this request's draws failed (the others went on) */
    float *q_dev;               /* NULL, or the draft's backend memory [k][V]: q_i goes there instead of q
                                 * when the draws run on the backend, or when q is NULL (the target
                                 * verifies there: ops verify_rows) */
    int q_dev_used;             /* out: q_used, and the rows are in q_dev (q untouched) */
} m3_spec_draft_req;

/* 1 when plain rows (m3_sampler_plain_params) are drawn where they are (ops draw_rows: the
 * draft's probabilistic chain, the target's sampled output rows), 0 when on the host: by default
 * on a device backend (no row comes back) and not on the CPU (the host's sampler is the faster
 * there); M3_DRAWS=backend or host overrides it (tests, A/B runs). */
int m3_spec_draws_on_backend(const m3_ops *op);

/* n in [1, M3_SPEC_DRAFT_BATCH]; rows: host scratch [n][V]. -1 + err when the pass failed
 * (every request's drafts are missing), else 0 with each request's failed flag. */
int m3_spec_draft_n(m3_dspark *d, m3_spec_draft_req *rq, int n, m3_sample_ws *ws, int method, int k, float *rows,
                    m3_err *err);

/* ---- the verify step ---- */

typedef struct m3_spec_result {
    int n_emit;                 /* tokens emitted, 1..k+1 (fewer when a stop id or max_emit cut it) */
    int n_accepted;             /* drafts accepted: the target KV rows 0..n_accepted stay valid */
    int stopped;                /* emission ended at a stop id or at max_emit */
    m3_sample_out out[M3_SPEC_MAX_TOKENS + 1]; /* the emitted tokens, as m3_sampler_sample reports them */
} m3_spec_result;

/* m3_spec_verify of a request whose rows need only their argmax (m3_sampler_greedy_ids > 0),
 * from those: ids [k + 1], the argmax of each row; the same tokens and counts. */
int m3_spec_verify_ids(m3_sampler *s, const int32_t *ids, const int32_t *draft, int k, const int32_t *stop, int n_stop,
                       int max_emit, m3_spec_result *res, m3_err *err);

/* Verifies k drafts (0 <= k <= M3_SPEC_MAX_TOKENS) against the target's logits rows [k+1][V]
 * (row i follows the prefix ending in d_i; row 0 the anchor). q: [k][V] draft distributions,
 * or NULL for greedy drafts (one-hot). Emission stops after a token in stop[0..n_stop) or
 * after max_emit (>= 1) tokens. Every emitted token is m3_sampler_accept'ed. p: scratch [V].
 * -1 + err on sampler errors (every token masked, out of memory). */
int m3_spec_verify(m3_sampler *s, m3_sample_ws *ws, float *p, const float *logits, const int32_t *draft,
                   const float *q, int k, const int32_t *stop, int n_stop, int max_emit, m3_spec_result *res,
                   m3_err *err);

#endif
