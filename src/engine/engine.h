/* Engine core: requests in, tokens out, continuous batching over one model (vLLM V1-like).
 *
 * One m3_engine_step = drain the inbox (new requests, cancellations), schedule, run ONE
 * m3_forward over every scheduled token of every sequence, sample, call back.
 *
 * Scheduling (each step, under a budget of max_num_batched_tokens tokens and max_num_seqs
 * running sequences):
 *   1. running decodes (sequences with exactly one token to run), oldest first, one token each;
 *   2. running sequences still in prefill (chunked prefill: as many prompt tokens as the
 *      budget leaves), oldest first;
 *   3. waiting requests, FCFS (requests preempted earlier first), admitted through
 *      m3_blocks_admit (prefix-cache hits skip the cached tokens) while a sequence slot and
 *      budget remain. Nothing is admitted in a step that preempted someone, and admission
 *      never preempts: a waiting request that does not fit waits (and blocks those behind it).
 * Blocks are allocated per step (m3_blocks_allocate) for exactly the positions scheduled.
 * When the pool is exhausted, the most recently admitted running sequence is preempted: its
 * blocks are freed (its full committed blocks stay in the prefix cache) and it goes back to
 * the head of the waiting queue; when readmitted it recomputes prompt + generated tokens, and
 * since its sampler (seeded RNG, token counts) is kept, it continues exactly as it would have.
 * After the forward, newly full blocks are committed to the prefix cache (when enabled).
 * Only rows that complete a sequence's pending tokens (prefill done, or a decode) ask for
 * logits: the rows a step asks for are at most max_rows (max_num_seqs, or (k + 1) x
 * max_num_seqs with a draft, or opts.max_logits_rows when more, at most the token budget). The
 * prompt rows of a request that wants prompt logprobs (on_prompt) are reduced where the logits
 * are when the backend can (ops logprob_rows: each position's logprob, rank and alternatives
 * come back, not its logits; m3_taps.lp_rows), so such a prefill runs in chunks as long as any;
 * else (a tensor-parallel group, or opts.prompt_logprobs_host) they come back as logits rows and
 * its chunks are cut to the rows the step has left.
 *
 * Speculative decoding (opts.spec.method M3_SPEC_DSPARK; src/engine/spec.h). The engine loads
 * the DSpark draft and gives every request its own draft state (context cache, draft RNG).
 * Every forward captures the target layers the draft reads (m3_taps.capture), and the rows of
 * committed positions (prefill chunks, plain decodes, the anchor + accepted drafts of a verify)
 * are added to the request's context. A decode with room for more than one token becomes a
 * speculative decode: k drafts (k = num_speculative_tokens, fewer near max_tokens or the
 * context limit, or under a small token budget) are drawn before the forward, the request's
 * rows [anchor, d_1..d_k] join the same m3_forward as everyone else's, and m3_spec_verify
 * emits 1..k+1 tokens (one callback each). Rejected positions leave no trace: the sequence's
 * KV length (kv.len, n_done) is rolled back to the anchor + accepted drafts (their entries
 * were written by the forward, the rejected ones past kv.len are overwritten before anything
 * reads them), only positions below n_done are ever committed to the prefix cache, and the
 * draft context only receives committed rows. The slots already allocated for the rejected
 * positions stay with the sequence (private, never hashed) and serve its next step.
 * Prefix-cache reuse is capped so that the positions the draft's window needs are recomputed
 * (the draft context is per request, not in the paged cache): at most n - sliding_window
 * tokens of a prompt come from the cache. Greedy requests give bitwise the tokens and logprobs
 * they give without speculation; sampled ones are distributed identically (their RNG stream is
 * consumed differently) and stay reproducible per request as long as each speculative step
 * gets its k (that is, unless the token budget is smaller than the decodes need).
 *
 * Images (opts.vision set; src/engine/images.h). A request may carry the images of its prompt
 * (m3_engine_images: preprocessed pixels and the prompt positions of their image tokens,
 * shared by the requests of one HTTP request). The vision tower runs on the engine thread the
 * first time a step schedules one of the image positions (never when the prefix cache already
 * holds them all), on opts.vision_ops (a host-memory op table: the model's own on the CPU
 * backend, a separate CPU one beside a device backend), and its output replaces the
 * embeddings of the image tokens through m3_forward_ex; the embeddings are kept while a
 * request holds the object, so chunked prefill and recompute after preemption reuse them.
 * Prefix caching keys blocks that hold image tokens on the images' content as well (a
 * keyed hash of the pixels and the token's index in its image, m3_blocks' extra key), so
 * equal token ids with different images never share KV blocks past the first image token.
 *
 * Structured outputs (src/grammar; m3_engine_request.grammar). A request may carry a compiled
 * grammar (shared by every request of the same schema: m3_engine_grammar, refcounted) and its
 * own matcher. Before a constrained row is sampled, the tokens the grammar does not allow at
 * its position are -inf (m3_sampler_set_mask; the end ids only when the output may end); the
 * accepted token advances the matcher; once the output is complete and nothing may follow, the
 * request ends at once with M3_FINISH_STOP (a final callback with token -1). The constraint may
 * start after a given token (the end of the reasoning: grammar_start_id), the text before it
 * free. Masks are computed ahead: right after a step's tokens are accepted, a mask thread
 * (opts.grammar_threads; by default on device backends) computes the masks of the next step's
 * constrained rows while the engine thread goes on to schedule and run that step's forward;
 * the engine waits for them only before sampling. A mask not computed ahead (a request's first
 * constrained token; every one without a mask thread) is computed as its row is sampled, in
 * parallel across rows on the sampling threads.
 * Unconstrained requests pay nothing (no mask, no copy of their row). Constrained requests
 * are never drafted for (speculative decoding verifies unconstrained requests only; theirs
 * are plain decodes).
 *
 * Batch invariance: a request's tokens and logprobs depend only on the request (prompt,
 * sampling parameters and seed), not on what shares its steps, how its prompt was chunked,
 * preemption, or prefix-cache hits: the CPU forward is bitwise batch-invariant per token and
 * each request has its own m3_sampler. tests/engine/test_engine.c checks this bitwise.
 *
 * Ownership. The engine borrows the model (it must outlive the engine; the engine is its only
 * user while it exists) and owns its KV pool, block manager, samplers and request copies
 * (the prompt, stop ids and sampling arrays are copied by m3_engine_add).
 *
 * Threads. m3_engine_add, m3_engine_cancel, m3_engine_has_work, m3_engine_wait_work,
 * m3_engine_get_stats and m3_engine_capacity_tokens may be called from any thread at any
 * time (a mutex-protected inbox and a stats snapshot). m3_engine_step and
 * m3_engine_last_step run on one engine thread only (never two steps at once); every
 * callback is called on that thread, from inside m3_engine_step. A callback may call
 * m3_engine_add / m3_engine_cancel (they only queue) but not m3_engine_step or destroy.
 * m3_engine_destroy needs every other thread done with the engine. */
#ifndef M3_ENGINE_H
#define M3_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../grammar/grammar.h"
#include "../kv/kv.h"
#include "../model/m3.h"
#include "../model/vision.h"
#include "sampler.h"
#include "spec.h"

typedef struct m3_engine m3_engine;

enum {
    M3_FINISH_NONE = 0,      /* not finished: more tokens follow */
    M3_FINISH_STOP = 1,      /* a stop token id (or EOS) was generated; that token is reported. Or the
                              * request's grammar completed: its last token came with finish 0, the
                              * final callback has token -1 */
    M3_FINISH_LENGTH = 2,    /* max_tokens generated, or the context limit reached */
    M3_FINISH_CANCELLED = 3, /* m3_engine_cancel; token -1 */
    M3_FINISH_ERROR = 4,     /* the request failed (out of memory, non-finite logits, a failed step: see on_error); token -1 */
};
const char *m3_engine_finish_name(int reason); /* "stop", "length", "cancelled", "error", "" */

/* Called once per generated token (finished 0 or 1), and once with token -1 and finished 1
 * when a request ends without a token (cancelled, error). logprob: the token's logprob per
 * the request's logprobs_mode (raw log_softmax by default) when its sampling asked for
 * logprobs or top_logprobs (a full-vocabulary log-softmax per token: not done otherwise),
 * else 0; 0 for token -1. */
typedef void (*m3_engine_token_fn)(void *arg, uint64_t id, int32_t token, float logprob, int finished,
                                   int finish_reason);

/* The same with the sampler's whole output (token, logprob, rank, top_logprobs when the
 * request's sampling asked for them); out is NULL for the token -1 endings. */
typedef void (*m3_engine_output_fn)(void *arg, uint64_t id, const m3_sample_out *out, int finished,
                                    int finish_reason);

/* Why a request ends with M3_FINISH_ERROR: called (engine thread) just before that final
 * callback. msg ("out of memory in the engine", "the model produced non-finite logits (NaN or
 * Inf)", "the model's forward pass failed: CUDA: ...") is valid during the call only. */
typedef void (*m3_engine_error_fn)(void *arg, uint64_t id, const char *msg);

/* A request's first admission (engine thread, before its first output): cached_tokens prompt
 * tokens were found in the prefix cache and are not computed again (0 without a hit). */
typedef void (*m3_engine_admit_fn)(void *arg, uint64_t id, int cached_tokens);

/* Prompt logprobs (vLLM's prompt_logprobs; completions' echo with logprobs): called once for
 * every prompt position pos in [1, n_prompt), in order, all before the request's first generated
 * token: out->token = prompt[pos], out->logprob its raw logprob given prompt[0..pos) (a
 * log-softmax over the text ids, m3_logprobs_row, whatever the sampling's logprobs_mode),
 * out->rank, and the request's prompt_top most likely ids. Preemption and recompute never repeat
 * a position. out is valid during the call only. */
typedef void (*m3_engine_prompt_fn)(void *arg, uint64_t id, int pos, const m3_sample_out *out);

typedef struct m3_engine_opts {
    int kv_pages;               /* pool size in pages; 0: from kv_bytes */
    size_t kv_bytes;            /* pool size in bytes (rounded down to whole pages) when kv_pages is 0 */
    m3_kv_dtype kv_dtype, index_dtype;
    int max_num_seqs;           /* running sequences at once (default 64) */
    int max_num_batched_tokens; /* tokens per step, all sequences together (default 512) */
    /* vLLM's --scheduling-policy priority: waiting requests are admitted by (priority, arrival),
     * the lowest value first, and a preemption takes the running request of the largest
     * (priority, arrival); 0: first come, first served (a preemption takes the most recently
     * admitted), priorities ignored */
    int scheduling_priority;
    /* logits rows a step may ask for, when more than one a sequence (k + 1 with a draft): where
     * prompt logprobs come back as rows (a TP group, prompt_logprobs_host) their prefill chunks are
     * cut to the rows a step has left (0: no more; each row is vocab x 4 bytes of host memory,
     * and of device memory the KV budget leaves out) */
    int max_logits_rows;
    /* prompt logprobs from whole logits rows on the host even where the backend reduces them (as
     * a tensor-parallel group does; comparisons and benchmarks; also $M3_PROMPT_LOGPROBS=host) */
    int prompt_logprobs_host;
    int enable_prefix_caching;
    int max_model_len;          /* prompt + generated tokens per request; 0: the config's max_position_embeddings,
                                 * at most the pool's capacity */
    /* > 0 (and kv_pages 0): the pool is sized from the memory there is, not from kv_bytes
     * (src/engine/kv_budget.h): on a device, this fraction of its memory less what the weights
     * and a profiled step of max_num_batched_tokens use (vLLM's --gpu-memory-utilization); on
     * the host, a quarter of the available memory, at most 4 GiB */
    double gpu_memory_utilization;
    /* Image inputs: the vision tower (borrowed, must outlive the engine; NULL or not present:
     * requests with images are refused) and the op table it runs on, on the engine thread
     * (vision_ops NULL: the model's; it needs the vision ops of ops.h). On a device backend the
     * engine copies the tower's weights there once (m3_vision_upload). */
    const m3_vision *vision;
    m3_ops *vision_ops;
    m3_spec_config spec;        /* speculative decoding; method M3_SPEC_NONE (0): off */
    /* Tensor parallelism (borrowed, must outlive the engine; NULL: off): steps run over the
     * group's ranks (m3_group_forward), the model given to m3_engine_create is the full model
     * the group was made from (its config; its ops are not used). The KV pool is made in every
     * rank (m3_group_kv_create: kv_pages, or kv_bytes per rank); the block manager manages rank
     * 0's, whose page ids are valid in every rank's pool. With speculative decoding the draft
     * runs on draft_ops and reads the target's hidden states from rank 0. */
    struct m3_group *group;
    /* Threads that sample the requests of a step (a request's draw reads only its logits row and
     * its own sampler, so the tokens are the same for any count). 0: 1 on a host backend (the
     * forward's own threads are busy there), else one per online CPU up to 8. A sampled token
     * costs 0.2-0.9 ms on one core at a 200K vocabulary (bench: test_sampler): a batch of 64
     * would keep the GPU waiting for one thread for longer than its decode step. */
    int sample_threads;
    /* Threads that compute the token masks of the next step's constrained rows while the forward
     * runs (structured outputs), started with the engine, idle without constrained requests.
     * -1: none, every mask is computed as its row is sampled; 0: one on a device backend, none on
     * a host backend (the forward's threads take every core there: a mask thread beside them
     * waits for a core, and the engine for it, longer than the masks take inline). */
    int grammar_threads;
    /* The DSpark draft's op table (host memory; NULL: the model's own). Needed with a group. */
    m3_ops *draft_ops;
    /* Tests only (NULL normally): after a GREEDY request's drafts are drawn, may overwrite
     * draft[0..k) (greedy verification is exact whatever the drafts); tok[0..n_tok) is the
     * request's prompt + generated ids. */
    void (*draft_hook)(void *arg, uint64_t id, const int32_t *tok, int n_tok, int32_t *draft, int k);
    void *draft_hook_arg;
} m3_engine_opts;

/* Defaults: 1 GiB pool, f32 caches, 64 seqs, 512 tokens per step, prefix caching on. */
void m3_engine_opts_default(m3_engine_opts *o);

typedef struct m3_engine_request {
    const int32_t *prompt;      /* n_prompt >= 1 ids in [0, vocab); copied */
    int n_prompt;
    m3_sampling sampling;       /* copied (arrays too); logprobs computed only when asked */
    int max_tokens;             /* >= 0; 0: the request ends once its prompt ran (M3_FINISH_LENGTH, a final
                                 * callback with token -1): its prompt logprobs, its prompt in the prefix cache */
    const int32_t *stop_ids;    /* extra stop token ids; copied */
    int n_stop_ids;
    int ignore_eos;             /* nonzero: the config's eos id does not stop the request */
    m3_engine_token_fn on_token; /* may be NULL */
    m3_engine_output_fn on_output; /* when set, called instead of on_token */
    m3_engine_error_fn on_error; /* may be NULL */
    m3_engine_admit_fn on_admit; /* may be NULL */
    /* prompt logprobs (NULL: none), with prompt_top (0..M3_SAMPLE_MAX_TOP_LOGPROBS) alternatives a
     * position. Such a request asks for a logits row at every prompt position: its prefill runs
     * in chunks of at most the step's rows left (opts: max_num_seqs, or k + 1 rows a sequence with
     * speculation), and the prefix cache does not skip positions whose logprobs are still due. */
    m3_engine_prompt_fn on_prompt;
    int prompt_top;
    void *arg;                  /* passed to the callbacks */
    struct m3_engine_images *images; /* the prompt's images (NULL: none); m3_engine_add takes a reference */
    /* Structured output (NULL: none): the output is constrained by this grammar (m3_engine_add
     * takes a reference; each request gets its own matcher). Its vocabulary's width must be the
     * model's vocabulary. grammar_start_id < 0: from the first generated token; else the text
     * is free until that token is generated (the end of the reasoning, e.g. </mm:think>), the
     * constraint starts after it. grammar_open_id >= 0 (with a start id): the first token is
     * constrained but may also be this one (the reasoning's opening tag, adaptive thinking),
     * which makes the text free until the start id. */
    struct m3_engine_grammar *grammar;
    int32_t grammar_start_id, grammar_open_id;
    /* Prefix-cache isolation (vLLM's cache_salt; NULL or "": none): the request's KV blocks are
     * keyed on the salt too (a keyed hash, unknown outside the process), so it shares cached
     * blocks only with requests of the same salt; read by m3_engine_add only. */
    const char *cache_salt;
    size_t cache_salt_len;
    int priority; /* opts.scheduling_priority: smaller values are served first (vLLM's) */
} m3_engine_request;

/* A compiled grammar shared by the requests that use it (refcounted). */
typedef struct m3_engine_grammar m3_engine_grammar;
/* Takes g and gc (gc compiled from g; both freed with the last reference; the vocabulary gc
 * was compiled for must outlive them). The caller holds one reference. NULL + err when out of
 * memory (g and gc are freed then). Any thread. */
m3_engine_grammar *m3_engine_grammar_new(m3_grammar *g, m3_grammar_compiled *gc, m3_err *err);
void m3_engine_grammar_retain(m3_engine_grammar *eg);
void m3_engine_grammar_release(m3_engine_grammar *eg); /* NULL is ignored */
const m3_grammar_compiled *m3_engine_grammar_compiled(const m3_engine_grammar *eg);

/* The images of one prompt, shared by the requests that use it (refcounted). */
typedef struct m3_engine_images m3_engine_images;

/* Makes the images of a prompt for engine e (which must have a vision tower): px, the
 * preprocessed images in prompt order (m3_image_preprocess), is taken, also on failure (its
 * arrays belong to the object; *px is zeroed); rows: the n_rows prompt positions of their
 * image tokens, ascending, as many as the images make (m3_vision_check_pixels), copied.
 * Hashes the pixels for the prefix cache. The caller holds one reference. NULL + err on bad
 * input, a model without a vision tower, or no memory. Any thread. */
m3_engine_images *m3_engine_images_create(m3_engine *e, m3_pixels *px, const int32_t *rows, int n_rows, m3_err *err);
/* Drops one reference (the last frees it). Any thread; NULL is ignored. */
void m3_engine_images_release(m3_engine_images *im);

typedef struct m3_engine_stats {
    int running, waiting;       /* requests admitted (holding blocks) / queued (inbox included) */
    int kv_blocks_used, kv_blocks_cached, kv_blocks_total; /* pages in use / cached (reusable, evictable) / pool */
    int page_tokens;
    uint64_t steps;
    uint64_t prefix_hit_tokens;  /* prompt tokens skipped thanks to the prefix cache (at admission) */
    uint64_t prefix_query_tokens; /* prompt tokens looked up in the prefix cache (at admission, cache on) */
    uint64_t preemptions;
    uint64_t tokens_prefilled;   /* tokens run through the model that were not decodes (recompute included) */
    uint64_t tokens_generated;   /* tokens sampled */
    uint64_t requests_added, requests_finished[5]; /* by finish reason (index 0 unused) */
    /* speculative decoding (0 when off). MAL (mean accepted length, tokens per verify step)
     * = spec_emitted_tokens / spec_verify_steps; acceptance at position i (0-based) =
     * spec_accepted_per_pos[i] / spec_drafted_per_pos[i]. */
    int spec_k;                       /* num_speculative_tokens */
    uint64_t spec_verify_steps;       /* speculative decodes (one request, one step) */
    uint64_t spec_draft_tokens;       /* drafts verified */
    uint64_t spec_accepted_tokens;    /* of those, accepted */
    uint64_t spec_emitted_tokens;     /* tokens emitted by verify steps (accepted + 1 each, less when a stop cut it) */
    uint64_t spec_drafted_per_pos[M3_SPEC_MAX_TOKENS];  /* verify steps that verified a draft at position i */
    uint64_t spec_accepted_per_pos[M3_SPEC_MAX_TOKENS]; /* ... and accepted it */
    uint64_t spec_conf_skipped;       /* drafts left unverified by dspark_confidence_threshold */
    uint64_t spec_off_batch;          /* decodes that would have speculated, run without drafts because the
                                       * step had more running requests than disable_by_batch_size */
    uint64_t spec_verify_backend;     /* speculative decodes of sampled requests verified where the rows are
                                       * (ops verify_rows: only ids came back) */
    /* requests ended with M3_FINISH_ERROR because a logits row they were to sample from held
     * a NaN or an Inf (every sampled row is checked) */
    uint64_t nonfinite_logits;
    uint64_t tokens_sampled_parallel; /* draws (a speculative decode's verification: one) made by the
                                       * sampling threads with others of the same step (sample_threads > 1) */
    /* structured outputs: token masks computed for constrained rows, of those computed ahead
     * (by the mask thread while the forward ran), the seconds the engine thread waited for the
     * mask thread after the forward, and the seconds masks took on the sampling path (those
     * not computed ahead) */
    uint64_t grammar_masks, grammar_masks_ahead;
    double grammar_wait_s, grammar_inline_s;
    uint64_t grammar_requests;   /* requests added with a grammar */
    uint64_t vision_runs;        /* vision tower runs (one per image object actually encoded) */
    uint64_t vision_images;      /* images encoded by them */
    uint64_t prompt_logprobs;    /* prompt positions whose logprobs were reported (on_prompt) */
} m3_engine_stats;

/* What the last m3_engine_step did. */
typedef struct m3_engine_step_stats {
    int n_tokens;               /* tokens in the forward (<= max_num_batched_tokens) */
    int n_seqs;                 /* sequences in the forward (<= max_num_seqs) */
    int n_decode;               /* of those, decode rows (1 token) */
    int n_prefill_tokens;       /* tokens of sequences in (re)prefill */
    int n_logits;               /* rows that asked for logits (sampled tokens, verified drafts, prompt logprobs) */
    int n_prompt_rows;          /* of those, prompt logprobs' rows */
    int n_preempted;            /* sequences preempted while scheduling this step */
    int n_admitted;             /* waiting requests admitted this step */
    int n_spec;                 /* speculative decodes (verify steps) in the forward */
    int n_draft;                /* draft tokens in the forward */
} m3_engine_step_stats;

/* Creates the KV pool and block manager for model m (and loads the draft when opts.spec asks
 * for one). NULL + err on bad options / no memory / a bad draft checkpoint. */
m3_engine *m3_engine_create(m3_model *m, const m3_engine_opts *o, m3_err *err);
/* Frees everything; requests still queued or running are dropped without callbacks. */
void m3_engine_destroy(m3_engine *e);

/* Queues a request; returns its id (>= 1), or 0 + err on bad parameters (empty prompt, id out
 * of range, prompt longer than the context limit, bad sampling parameters, image positions
 * outside the prompt or not holding the image token) or no memory. */
uint64_t m3_engine_add(m3_engine *e, const m3_engine_request *r, m3_err *err);
/* Asks for request id to end with M3_FINISH_CANCELLED at the next step (its blocks freed
 * then). Unknown or already finished ids are ignored. 0, or -1 when out of memory. */
int m3_engine_cancel(m3_engine *e, uint64_t id);

/* Before serving (no other thread stepping e): one request of min(n_tokens, the step budget, the
 * context and pool) prompt tokens and 3 generated tokens, run to its end on the calling thread,
 * then min(8, max_num_seqs) requests of twice as many prompt tokens in all, together (steps of
 * several prompts, of prompts beside decodes, decode batches); then the counters, the last-step
 * record and the prefix cache are as if nothing had run. The
 * first requests would otherwise pay first-use costs (on a GPU: step buffers sized for the
 * largest step, kernels loaded on first launch, decode graphs recorded). Returns the prompt
 * tokens it ran (0: none, n_tokens < 1), or -1 + err (the forward failed, or no memory). */
int m3_engine_warmup(m3_engine *e, int n_tokens, m3_err *err);

/* One step (engine thread). Returns the number of requests still queued or running after
 * it (0: idle; requests added while it ran are not counted: see m3_engine_has_work), or -1 +
 * err (the step's shape and the backend's message) when the forward pass failed. Then:
 *   - the backend recovered (ops.recover; the device is usable): a step of one request ends
 *     that request with M3_FINISH_ERROR; a step of several runs each of them again alone, and
 *     only those that fail alone end (with their own message), the others go on unharmed;
 *   - it did not (a device error that sticks to the context): every request ends with
 *     M3_FINISH_ERROR and the reason, m3_engine_dead says why, and m3_engine_add refuses
 *     every request from then on. */
int m3_engine_step(m3_engine *e, m3_err *err);
/* NULL while the engine works; why it stopped once its device failed (any thread). */
const char *m3_engine_dead(m3_engine *e);
/* Nonzero when a step has something to do (requests running, waiting, or in the inbox). */
int m3_engine_has_work(m3_engine *e);
/* Blocks until there is work or timeout_ms passed (< 0: no timeout); returns has_work. */
int m3_engine_wait_work(m3_engine *e, int timeout_ms);

void m3_engine_get_stats(m3_engine *e, m3_engine_stats *st);
void m3_engine_last_step(const m3_engine *e, m3_engine_step_stats *st);
/* Pool capacity in tokens (pages x page size), and the effective per-request token limit. */
int m3_engine_capacity_tokens(const m3_engine *e);
int m3_engine_max_model_len(const m3_engine *e);
/* How the pool's size was chosen (a line for the server's start-up message). */
const char *m3_engine_pool_how(const m3_engine *e);

#endif
