/* The engine's internals, shared by engine.c (creation, the inbox any thread writes, stats)
 * and step.c (the engine thread: scheduling, sampling, failures, m3_engine_step). Not an API:
 * see engine.h. */
#ifndef M3_ENGINE_INT_H
#define M3_ENGINE_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/random.h>

#include "../base/fault.h"
#include "../base/pool.h"
#include "../kv/blocks.h"
#include "../model/group.h"
#include "engine.h"
#include "images.h"
#include "kv_budget.h"

/* request- and step-level allocations are counted by the fault-injection hook (fault.h) */
#define e_malloc(n) m3_fault_malloc(M3_FAULT_ENGINE, n)
#define e_calloc(k, n) m3_fault_calloc(M3_FAULT_ENGINE, k, n)
/* requests a step whose drafts' q rows stay on the device for the target's verification */
#define QDEV_MAX 64
#define QDEV_BYTES ((size_t)512 << 20) /* ... and of at most this much memory (64 at k 7 and 200,064 ids) */
#define e_realloc(p, n) m3_fault_realloc(M3_FAULT_ENGINE, p, n)

enum { G_FREE = 0, G_ON = 1, G_FIRST = 2 }; /* g_phase: before the start id; constrained; adaptive first token */

typedef struct req {
    uint64_t id;               /* also the arrival order */
    int priority;              /* opts.scheduling_priority: (priority, id) orders the queue */
    int32_t *tok;              /* prompt then generated ids; capacity `limit` */
    int n_prompt, n_tok, limit; /* limit: n_tok at which the request ends with "length" */
    int max_tokens, n_gen;
    int32_t *stop;
    int n_stop;
    m3_sampler *smp;
    m3_engine_token_fn cb;
    m3_engine_output_fn cb_out;
    m3_engine_error_fn cb_err;
    m3_engine_admit_fn cb_admit;
    m3_engine_prompt_fn cb_prompt; /* prompt logprobs (NULL: none), plp_top alternatives */
    int plp_top, n_text;       /* n_text: the text ids [0, n_text) the log-softmax runs over */
    int plp_next;              /* the rows of positions below it are reported (it reports prompt[plp_next + 1]) */
    int plp_idx, plp_n;        /* this step: its prompt rows' first output row (host rows), and how many */
    int plp_j0;                /* ... and the first of them among the step's prompt rows (plp_*, lp_*) */
    int admitted;              /* cb_admit was called (a preempted request is admitted again) */
    void *arg;
    const char *why;           /* why it ends with M3_FINISH_ERROR (a static string, or why_buf) */
    char why_buf[384];         /* a message of the moment (a forward pass that failed with it alone) */
    m3_blocks_seq bs;
    int n_done;                /* positions whose KV entries are written (== bs.kv.len) */
    /* images of the prompt (NULL: none) and the prefix-cache keys of the blocks holding them */
    m3_engine_images *im;
    uint64_t *extra;
    int n_extra;
    /* speculative decoding */
    m3_dspark_ctx dctx;        /* draft context of positions [.., n_done) */
    m3_rng drng;               /* draft draws */
    float *q;                  /* [k][V] draft distributions (probabilistic drafting of a sampled request) */
    float *qv;                 /* this step's host rows: a slot of e->qstage, else q (NULL with a device
                                * slot, until a fallback to the host needs them: q_to_host) */
    float *qd;                 /* this step's slot of e->qdev (NULL: none) */
    int q_used, q_dev_used;    /* q_dev_used: the drafts' q rows are in qd, not in qv */
    int vdev;                  /* this step's verification runs on the backend (ops verify_rows) */
    int32_t draft[M3_SPEC_MAX_TOKENS];
    float conf[M3_SPEC_MAX_TOKENS]; /* the confidence head's estimates of the drafts (a threshold is set) */
    /* this step */
    int n_sched, decode, out_idx, done;
    int rows_sched;            /* logits rows it asks for this step (given back when preempted) */
    int k_sched;               /* drafts verified this step (0: not a speculative decode) */
    int row0;                  /* first row of the request in the step's batch */
    int ov0, n_ov;             /* its image rows among the step's embedding overrides */
    int fwd_failed;            /* its forward pass failed alone this step (why_buf says why) */
    /* structured output (engine.h): the grammar, this request's matcher, the mask of its next
     * constrained token ([(V + 31) / 32] words; g_ready: it is the matcher's current one) */
    m3_engine_grammar *gr;
    m3_matcher *gm;
    uint32_t *gmask;
    int g_phase, g_ready;
    int32_t g_start, g_open;
    double g_inline_s;         /* masks computed as its row was sampled: time and count, not yet summed */
    int g_inline_n;
    /* this step's plain sample or speculative verification, made before the serial pass
     * (sample_rows); so_finite: every logits row of it is finite */
    m3_sample_out so;
    int so_finite, so_rc;
    int gdev;                  /* this step's rows came back as argmax ids (e->gid, e->gfin at out_idx) */
    m3_spec_result sres;       /* k_sched > 0: the verification (sres_rc: m3_spec_verify's) */
    int sres_rc;
    struct req *next;          /* inbox link */
} req;

struct m3_engine {
    m3_model *m;
    FILE *trace;                 /* M3_STEP_TRACE: a line a step (times, sizes), or NULL */
    double trace_t0;
    m3_kv kv_own, *kv;           /* kv_own, or rank 0's pool of the tensor-parallel group */
    m3_group *group;
    m3_blocks *bm;
    int page, V, max_seqs, max_tokens_step, prefix, max_len;
    int eos;
    /* engine thread only */
    req **running;             /* admission order (oldest first) */
    int n_running;
    req **waiting;             /* FCFS, head first */
    int n_waiting, cap_waiting;
    m3_sample_ws *ws;
    /* sampling threads (sample_rows): the pool (NULL: the engine thread alone), a workspace per
     * worker (wss[0] == ws) and the step's requests to sample [max_seqs] */
    m3_pool *spool;
    m3_sample_ws **wss;
    int n_wss;
    struct req **to_sample;
    int32_t *ids, *pos, *sq;   /* [max_tokens_step] */
    int *rows;                 /* [max rows] */
    int *rows_alone;           /* [max rows] a request's rows when it runs alone (step_failed) */
    /* prompt logprobs: the step's prompt rows j = 0 .. n_plp ([max plp]: max rows, or the token
     * budget where the backend reduces them, lp_dev) */
    int lp_dev;                /* reduced where the logits are (m3_taps.lp_rows; ops logprob_rows): no host rows */
    int max_plp;
    m3_sample_out *plp_out;    /* [max plp] their logprobs */
    unsigned char *plp_fin;    /* [max plp] ... and whether the row was finite */
    int *plp_row;              /* [max plp] host rows: their output rows */
    struct req **plp_req;      /* [max plp] their requests */
    int32_t *lp_rows, *lp_tok, *lp_n, *lp_alone; /* [max plp] lp_dev: batch rows, tokens, text ids; a retry's rows */
    m3_row_lp *lp_res;         /* [max plp] lp_dev: the backend's answers */
    int lp_k;                  /* lp_dev: this step's most alternatives */
    int n_plp;
    m3_kv_seq **seqs;          /* [max_seqs] */
    float *logits;             /* [max rows][V] */
    int max_rows;
    int cap_row0;                /* on_capture: batch row 0 is this step row (a request run alone) */
    int32_t *zeros;              /* [max_tokens_step] sequence index 0 of a request run alone */
    char dead[512];              /* the device failed: why (every request ends, none is taken) */
    char pool_how[320];          /* how the pool's size was chosen (m3_engine_pool_how) */
    /* speculative decoding */
    int spec, k, draft_method; /* spec: the draft is loaded */
    float conf_thr;            /* verify drafts while the confidence head gives them this (0: all) */
    int spec_max_len;          /* the draft's max_model_len: no drafts for a request whose tokens + k pass it (0: none) */
    int spec_off_bs;           /* disable_by_batch_size: no drafts in a step of more running requests (0: never) */
    m3_dspark draft;
    float *feat;               /* [max_tokens_step][feat_dim] captured target rows of the step: host
                                * memory, or (draft_dev) the draft's backend memory */
    int32_t *gn, *gid, *gfin;  /* [max_rows] per output row: m3_sampler_greedy_ids (0: the whole
                                * row comes back; -1: drawn on the backend with gpar), then the
                                * backend's argmax or draw and finite flag */
    m3_draw_param *gpar;       /* [max_rows] the drawn rows' parameters and uniforms */
    float *qstage;             /* [qstage_n][k][V] from the draft's host_alloc (page-locked on a device):
                                * the q rows of a step's first qstage_n probabilistic drafts */
    int qstage_n;
    float *qdev;               /* [qdev_n][k][V] in the draft's backend memory: the q rows of a step's
                                * first qdev_n probabilistic drafts the target verifies there */
    int qdev_n;
    m3_verify_group *vgroups;  /* [max_seqs] the step's requests verified on the backend */
    int draw_dev;              /* plain sampled rows are drawn on the backend (ops draw_rows) */
    m3_dspark_rows *apps;      /* a step's draft context appends [max_seqs], and their requests */
    req **app_req;
    int draft_dev;             /* the draft runs on the target's device op table (capture stays there) */
    int n_drows;               /* drafts drawn together: min(max_seqs, M3_SPEC_DRAFT_BATCH) */
    float *drows;              /* [n_drows][V] draft rows (scratch) */
    float **pbufs;             /* [n_wss][V]: a verify scratch per sampling worker (spec only) */
    void (*draft_hook)(void *, uint64_t, const int32_t *, int, int32_t *, int);
    void *draft_hook_arg;
    /* images */
    const m3_vision *vision;   /* NULL: none */
    m3_vision vision_dev;      /* its weights in a device backend's memory (vops->device_memory) */
    int vision_dev_ok;
    m3_ops *vops;
    uint64_t blk_key[2];       /* secret key of the prefix-cache block keys (image contents, cache salts) */
    int32_t *ov_rows;          /* [max_tokens_step] batch rows taking image embeddings this step */
    float *ov_emb;             /* [max_tokens_step][hidden] their embeddings */
    /* structured outputs: the mask thread (engine.h) computes the masks of gq[0..gq_n) while the
     * engine thread runs the forward; g_busy from a post until they are done (under gmu) */
    pthread_t gth;
    int gth_on;
    m3_pool *gpool;
    pthread_mutex_t gmu;
    pthread_cond_t gcv;
    struct req **gq;
    int gq_n, g_job, g_busy, g_stop;
    uint64_t g_ahead;          /* masks computed by the mask thread (read under gmu) */
    uint64_t g_inline_n;       /* masks computed as rows were sampled (engine thread) */
    m3_engine_step_stats last;
    m3_engine_stats tot;       /* counters kept by the engine thread */
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    req *in_head, *in_tail;
    int n_in;
    uint64_t *cancels;
    int n_cancels, cap_cancels;
    uint64_t next_id;
    int prio;                  /* opts.scheduling_priority */
    int active;                /* running + waiting after the last drain / step */
    m3_engine_stats snap;
};

void m3_engine_req_free(req *r); /* engine.c */
/* structured.c */
int m3_engine_masks_start(m3_engine *e, int threads); /* the mask thread; 0 or -1 */
void m3_engine_masks_stop(m3_engine *e);
void m3_engine_masks_post(m3_engine *e);  /* after a step: the next step's masks, ahead */
void m3_engine_masks_wait(m3_engine *e);  /* before sampling, or touching / freeing a posted request */
/* a constrained row's mask before its draw (computed when not ready); 0 or -1 (no memory) */
int m3_engine_mask_row(m3_engine *e, req *r);
/* the accepted token of a plain decode: 0, 1 when the grammar is complete (the request ends),
 * -1 when the matcher refuses it or has no memory (r->why set) */
int m3_engine_grammar_accept(req *r, int32_t tok);

#endif
