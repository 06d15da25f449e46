/* Token sampling with OpenAI / vLLM semantics, and stop-condition helpers.
 *
 * Pieces:
 *   m3_sampling   the request's parameters (plain struct; zero means "off" for every field
 *                 after the first four, so `m3_sampling p = {T, top_k, top_p, seed};` works).
 *   m3_sampler    per-request state: a copy of the parameters, the seeded RNG, and sparse
 *                 counts of the tokens seen (prompt ids for the repetition penalty, generated
 *                 ids for presence / frequency). Owned by the request; not thread-safe, but
 *                 different samplers may be used from different threads at once.
 *   m3_sample_ws  scratch for one sampling call (about 16 bytes per vocabulary entry). One per
 *                 worker thread, shared by every request that thread samples for.
 *   m3_stop       stop token ids and stop strings, with the hold-back a streaming server needs.
 *
 * Order of operations (vLLM V1's sampler):
 *   0. the reasoning budget spent (think_budget), and think_end_id allowed by the token mask if one
 *      is set (a grammar constraining the row decides): the row is think_end_id alone (the rest
 *      -inf, whatever steps 1-2 would do; vLLM's logits processor sets that logit to 1e9);
 *   1. allowed ids (everything else -inf), the token mask (m3_sampler_set_mask: ids whose bit
 *      is clear -inf; grammar-constrained decoding), banned ids -inf, min_tokens (the min_tokens_ids
 *      are -inf until min_tokens tokens were accepted), bad words (a sequence's last token -inf
 *      right after its other tokens were generated), logit_bias added;
 *   2. penalties over the counts: repetition (prompt + generated ids: positive logits divided,
 *      others multiplied), then frequency (logit -= f * count) and presence
 *      (logit -= p * (count > 0)) over generated ids only;
 *   3. temperature < 1e-5: greedy, the argmax of the result of 2 (lowest id on ties); no
 *      filtering, no random number drawn;
 *   4. otherwise softmax(logits / T), then min-p (keep p >= min_p * p_max), then top-k, then
 *      top-p over what is left (renormalized), then one draw. min-p comes before top-k/top-p
 *      as in vLLM V1 (V0 and HF apply it last; the two differ only when top_p is also set).
 *   top-k keeps exactly k tokens, ties broken toward the lower id (vLLM keeps every token tied
 *   with the k-th; exact k makes top_k = 1 equal greedy). top-p keeps a token when the mass of
 *   the tokens ranked above it is < top_p (so at least one is kept), as vLLM does.
 *
 * Reproducibility / batch invariance: a call's result depends only on the logits row, the
 * sampler's state (RNG + counts) and its parameters: no threads, no reductions whose order
 * depends on anything else, one uniform draw per non-greedy call. The same seed and the same
 * logits give the same tokens whatever else shares the batch.
 *
 * Logprobs (m3_sampling.logprobs / top_logprobs): by default (M3_LOGPROBS_RAW) computed from
 * the raw model logits, log_softmax of the row as passed in, before bias, penalties,
 * temperature and filtering: vLLM's default logprobs_mode "raw_logprobs".
 * M3_LOGPROBS_PROCESSED reports the distribution actually sampled from: after steps 1-2,
 * divided by T, filtered tokens at -inf (for greedy: log_softmax of the result of 2).
 */
#ifndef M3_SAMPLER_H
#define M3_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../base/rows.h"

#define M3_SAMPLE_MAX_TOP_LOGPROBS M3_ROW_TOP_MAX /* 20: OpenAI's limit */

typedef struct m3_logit_bias { int32_t token; float bias; } m3_logit_bias;

enum { M3_LOGPROBS_RAW = 0, M3_LOGPROBS_PROCESSED = 1 };

typedef struct m3_sampling {
    float temperature;   /* < 1e-5 = greedy */
    int top_k;           /* <= 0 or >= V = off */
    float top_p;         /* <= 0 or >= 1 = off */
    uint64_t seed;       /* the RNG seed (a server picks one when the request gives none) */
    float min_p;         /* <= 0 = off */
    float presence_penalty, frequency_penalty; /* 0 = off (OpenAI range -2..2; not checked here) */
    float repetition_penalty;                  /* 0 or 1 = off; must be >= 0 */
    /* arrays are copied by m3_sampler_create; ids must lie in [0, V) */
    const m3_logit_bias *logit_bias; int n_logit_bias;
    const int32_t *allowed_ids; int n_allowed; /* n_allowed > 0: only these ids can come out */
    const int32_t *banned_ids; int n_banned;
    /* bad words (vLLM's bad_words): n_bad_words token sequences, sequence i at
     * bad_words[bad_word_off[i] .. bad_word_off[i + 1]) (n_bad_words + 1 offsets, each sequence
     * at least one token): a sequence's last token cannot come out right after its other tokens
     * were the last ones generated (a one-token sequence: never) */
    const int32_t *bad_words, *bad_word_off; int n_bad_words;
    int min_tokens; const int32_t *min_tokens_ids; int n_min_tokens_ids; /* typically EOS + stop ids */
    int logprobs;        /* nonzero: report the chosen token's logprob and rank */
    int top_logprobs;    /* 0..M3_SAMPLE_MAX_TOP_LOGPROBS most likely tokens with logprobs */
    int logprobs_mode;   /* M3_LOGPROBS_RAW (default) or M3_LOGPROBS_PROCESSED */
    /* > 0 and < V: only ids below it exist as text (a checkpoint pads its vocabulary past the
     * tokenizer's): ids from n_text on never come out, as if masked, and are left out of
     * logprobs (raw ones included: the log-softmax runs over [0, n_text)); 0: all V */
    int n_text;
    /* a reasoning budget (vLLM's thinking_token_budget), when think_on: at most think_budget
     * (>= 0) tokens come out inside a reasoning section (after a think_start_id token, until a
     * think_end_id), then think_end_id comes out whatever the row (step 0 below); a later
     * think_start_id opens a new section with a new budget. The prompt's tags from index
     * think_from on count (0: all, as vLLM; a chat's final turn, where tags quoted in earlier
     * turns do not open anything). Both ids in [0, n_text) */
    int think_on;
    int32_t think_start_id, think_end_id;
    int think_budget, think_from;
} m3_sampling;

typedef struct m3_sample_out {
    int32_t token;
    float logprob;       /* chosen token's logprob (when logprobs or top_logprobs asked) */
    int32_t rank;        /* 1 + number of tokens with a strictly larger logprob */
    int n_top;           /* entries in top_ids / top_logprobs, most likely first (ties: lower id) */
    int32_t top_ids[M3_SAMPLE_MAX_TOP_LOGPROBS];
    float top_logprobs[M3_SAMPLE_MAX_TOP_LOGPROBS];
} m3_sample_out;

typedef struct m3_sampler m3_sampler;
typedef struct m3_sample_ws m3_sample_ws;

/* Checks the parameters against vocabulary size V and copies them; prompt[0..n_prompt) are
 * counted for the repetition penalty. NULL + err on bad parameters or out of memory. */
m3_sampler *m3_sampler_create(const m3_sampling *p, int V, const int32_t *prompt, int n_prompt, m3_err *err);
void m3_sampler_free(m3_sampler *s);
/* Records a generated token (counts for the penalties, min_tokens progress). Sampling does
 * not accept by itself: speculative decoding may reject what was sampled. */
int m3_sampler_accept(m3_sampler *s, int32_t token, m3_err *err);
/* A token mask for the calls that follow (sample, probs, describe), until set again: ids whose
 * bit (mask[id >> 5] >> (id & 31) & 1) is clear are -inf in step 1. Borrowed: the caller keeps
 * it alive and unchanged while it is set; NULL: none (costs nothing). The engine sets it per
 * row for grammar-constrained requests (src/grammar). */
void m3_sampler_set_mask(m3_sampler *s, const uint32_t *mask);
int m3_sampler_n_generated(const m3_sampler *s);
/* Picks the next token from logits[V] (V as given to create; the row is not modified).
 * Fails only when every token is masked (-inf) or ws is too small. */
int m3_sampler_sample(m3_sampler *s, const float *logits, m3_sample_ws *ws, m3_sample_out *out, m3_err *err);

/* ---- speculative decoding (src/engine/spec.c) ----
 * The verify step needs the distribution a call would draw from without drawing, and the
 * request's own RNG, so that speculative output is distributed exactly as plain sampling. */
/* 1 when the request samples greedily (temperature < 1e-5: the argmax, no random draw). */
int m3_sampler_is_greedy(const m3_sampler *s);
/* The plain answers below hold for the rows of a verification of the k drafts path[0..k) (k + 1
 * rows, row i read only when path[0..i) were accepted; k 0: the next draw alone; path NULL: any k
 * drafts): nothing changes those rows (no penalties, bias, allowed / banned ids, min_tokens, mask,
 * and no reasoning budget running out at one of them). */
/* n > 0 when the request samples greedily and nothing changes its rows: its token is then the
 * first index of the row's largest value over the ids [0, n) (the text ids); else 0. */
int m3_sampler_plain_greedy(const m3_sampler *s, const int32_t *path, int k);
/* m3_sampler_plain_greedy's n when the request also wants no logprobs: its draw is then only that
 * first index (m3_sampler_sample's output the token alone), which a backend can compute where the
 * logits are; else 0. */
int m3_sampler_greedy_ids(const m3_sampler *s, const int32_t *path, int k);
/* 1 when nothing changes the request's rows (as for m3_sampler_plain_greedy) and its
 * distribution is thus the row's under these alone: temperature, top_k, top_p, min_p (as
 * m3_sampling holds them) and the text ids [0, *n); else 0. (A backend can then make the
 * distribution and its draws where the row is: ops.h draw_rows.) */
int m3_sampler_plain_params(const m3_sampler *s, const int32_t *path, int k, float *temperature, int *top_k, float *top_p,
                            float *min_p, int *n);
/* m3_sampler_plain_params' 1 and parameters when the request also samples (not greedy) and
 * wants no logprobs: its draw is then the token alone, from one uniform (the next of its RNG's,
 * as m3_sampler_sample would take it), which a backend can draw where the logits are. */
int m3_sampler_draw_ids(const m3_sampler *s, const int32_t *path, int k, float *temperature, int *top_k, float *top_p,
                        float *min_p, int *n);
/* The vocabulary size the sampler was created for. */
int m3_sampler_vocab(const m3_sampler *s);
/* prob[V] = the distribution m3_sampler_sample would draw from for this row in the sampler's
 * current state (steps 1-4: filtered tokens 0, the kept ones e_i / total); greedy: one-hot
 * at the argmax. Draws nothing. -1 + err when every token is masked. */
int m3_sampler_probs(m3_sampler *s, const float *logits, m3_sample_ws *ws, float *prob, m3_err *err);
/* One uniform in [0, 1) from the request's RNG (the stream m3_sampler_sample draws from). */
double m3_sampler_uniform(m3_sampler *s);
/* The next n uniforms m3_sampler_uniform would give, without taking them (a draw made elsewhere
 * that takes a number of them known only afterwards: ops verify_rows), and their taking. */
void m3_sampler_peek_uniforms(const m3_sampler *s, int n, double *u);
void m3_sampler_skip_uniforms(m3_sampler *s, int n);
/* out as m3_sampler_sample reports it when `token` is the one chosen for this row (logprob,
 * rank and top_logprobs per the request's logprobs mode); draws nothing. */
int m3_sampler_describe(m3_sampler *s, const float *logits, m3_sample_ws *ws, int32_t token, m3_sample_out *out,
                        m3_err *err);

/* The raw logprobs of one row (log_softmax of logits[0..n), n the text ids): token's logprob and
 * rank, and the k (<= M3_SAMPLE_MAX_TOP_LOGPROBS) most likely ids, as m3_sampler_sample reports
 * them in M3_LOGPROBS_RAW mode (out->token = token). A token at or past n (no text spells it) has
 * logprob -inf and rank n + 1. Stateless: any thread, any row (prompt logprobs). */
void m3_logprobs_row(const float *logits, int n, int32_t token, int k, m3_sample_out *out);
/* out's logprob, rank and first k top entries from a row's log-softmax (base/rows.h: what the op
 * logprob_rows leaves where the logits are); out->token is the caller's */
void m3_sample_from_row_lp(const m3_row_lp *lp, int k, m3_sample_out *out);

m3_sample_ws *m3_sample_ws_create(int V, m3_err *err);
void m3_sample_ws_free(m3_sample_ws *ws);
/* Splits a row's longest passes (the exp pass; m3_sampler_probs' scaling) over pool's threads
 * (NULL: the calling thread alone). The tokens, probabilities and logprobs are the same for any
 * pool. A draw through ws must not run inside a loop of that same pool. */
struct m3_pool;
void m3_sample_ws_set_pool(m3_sample_ws *ws, struct m3_pool *pool);

/* ---- RNG and the stateless API (no penalties, bias or logprobs) ---- */
typedef struct m3_rng { uint64_t s[4]; } m3_rng;

void m3_rng_seed(m3_rng *r, uint64_t seed);
/* uniform in [0, 1) with 53 random bits */
double m3_rng_uniform(m3_rng *r);
/* standard normal (Box-Muller from two uniforms; for test and benchmark rows) */
double m3_rng_normal(m3_rng *r);

/* Picks a token from logits[V] with temperature / top-k / top-p / min-p (the sampling part of
 * the pipeline above; the other fields of p are ignored). scratch: m3_sample_scratch_bytes(V). */
int m3_sample(const m3_sampling *p, const float *logits, int V, m3_rng *r, void *scratch);
size_t m3_sample_scratch_bytes(int V);
/* For tests: top-k / top-p select with at most cap partitions before sorting the rest (-1: the
 * default budget, 16 + 2 log2 n) */
void m3_sampler_test_part_budget(int cap);
/* For tests: rows of at least n ids are split over a workspace's pool (default 32768) */
void m3_sampler_test_split_min(int n);
/* index of the largest value; ties go to the lowest index */
int m3_argmax(const float *x, int n);

/* ---- stop conditions ---- */
typedef struct m3_stop m3_stop;

typedef struct m3_stop_match {
    int which;           /* index of the stop string found, -1 if none */
    size_t start, end;   /* its bytes in the text: emit text[0..start) (or [0..end) to include it) */
    size_t safe;         /* no match: text[0..safe) can be emitted; the rest could still begin a stop string */
} m3_stop_match;

/* Copies the strings (non-empty) and ids. NULL + err on empty strings or out of memory. */
m3_stop *m3_stop_create(const char *const *strs, int n_strs, const int32_t *ids, int n_ids, m3_err *err);
void m3_stop_free(m3_stop *s);
int m3_stop_is_token(const m3_stop *s, int32_t token);
/* text[0..len) is the whole output text so far; text[0..checked) was scanned by an earlier
 * call (0 the first time; then the previous len), so the search only looks at stop strings
 * that end after `checked`. Returns 1 when a stop string occurs (the earliest start wins; on
 * the same start, the one listed first) and fills m->which/start/end; else 0 and m->safe =
 * len minus the longest suffix of the text that is a proper prefix of a stop string.
 * Time: linear in the new text (len - checked) times the number of strings, whatever their
 * length (s keeps one KMP automaton per string; a call whose `checked` is not the previous
 * call's len reads text[0..checked) again). Not thread-safe on one s. */
int m3_stop_scan(m3_stop *s, const char *text, size_t len, size_t checked, m3_stop_match *m);

#endif
