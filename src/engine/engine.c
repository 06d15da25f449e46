/* Engine core: inbox -> scheduler (continuous batching, chunked prefill, preemption) ->
 * one m3_forward per step -> per-request samplers -> callbacks. See engine.h. */
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/random.h>

#include "../base/pool.h"
#include "../model/group.h"
#include "../kv/blocks.h"
#include "../base/fault.h"
#include "images.h"
#include "kv_budget.h"

/* request- and step-level allocations are counted by the fault-injection hook (fault.h) */
#define e_malloc(n) m3_fault_malloc(M3_FAULT_ENGINE, n)
#define e_calloc(k, n) m3_fault_calloc(M3_FAULT_ENGINE, k, n)
#define e_realloc(p, n) m3_fault_realloc(M3_FAULT_ENGINE, p, n)

typedef struct req {
    uint64_t id;
    int32_t *tok;              /* prompt then generated ids; capacity `limit` */
    int n_prompt, n_tok, limit; /* limit: n_tok at which the request ends with "length" */
    int max_tokens, n_gen;
    int32_t *stop;
    int n_stop;
    m3_sampler *smp;
    m3_engine_token_fn cb;
    m3_engine_output_fn cb_out;
    m3_engine_error_fn cb_err;
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
    int q_used;
    int32_t draft[M3_SPEC_MAX_TOKENS];
    /* this step */
    int n_sched, decode, out_idx, done;
    int k_sched;               /* drafts verified this step (0: not a speculative decode) */
    int row0;                  /* first row of the request in the step's batch */
    int ov0, n_ov;             /* its image rows among the step's embedding overrides */
    int fwd_failed;            /* its forward pass failed alone this step (why_buf says why) */
    /* this step's plain sample, drawn before the serial pass (sample_rows) */
    m3_sample_out so;
    int so_finite, so_rc;
    struct req *next;          /* inbox link */
} req;

struct m3_engine {
    m3_model *m;
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
    m3_kv_seq **seqs;          /* [max_seqs] */
    float *logits;             /* [max rows][V] */
    int max_rows;
    int cap_row0;                /* on_capture: batch row 0 is this step row (a request run alone) */
    int32_t *zeros;              /* [max_tokens_step] sequence index 0 of a request run alone */
    char dead[512];              /* the device failed: why (every request ends, none is taken) */
    char pool_how[320];          /* how the pool's size was chosen (m3_engine_pool_how) */
    /* speculative decoding */
    int spec, k, draft_method; /* spec: the draft is loaded */
    m3_dspark draft;
    float *feat;               /* [max_tokens_step][feat_dim] captured target rows of the step */
    float *drows;              /* [k][V] draft logits (scratch) */
    float *pbuf;               /* [V] verify scratch */
    void (*draft_hook)(void *, uint64_t, const int32_t *, int, int32_t *, int);
    void *draft_hook_arg;
    /* images */
    const m3_vision *vision;   /* NULL: none */
    m3_vision vision_dev;      /* its weights in a device backend's memory (vops->device_memory) */
    int vision_dev_ok;
    m3_ops *vops;
    uint64_t img_key[2];       /* secret key of the image content hashes */
    int32_t *ov_rows;          /* [max_tokens_step] batch rows taking image embeddings this step */
    float *ov_emb;             /* [max_tokens_step][hidden] their embeddings */
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
    int active;                /* running + waiting after the last drain / step */
    m3_engine_stats snap;
};

const char *m3_engine_finish_name(int r) {
    switch (r) {
    case M3_FINISH_STOP: return "stop";
    case M3_FINISH_LENGTH: return "length";
    case M3_FINISH_CANCELLED: return "cancelled";
    case M3_FINISH_ERROR: return "error";
    default: return "";
    }
}

/* The sampling threads (opts.sample_threads; 0: 1 on a host backend, else one per online CPU up
 * to 8): a step's draws are spread over them, and a draw the engine thread makes alone (a batch
 * of one, speculative drafting and verifying) splits its row's passes over them. Short of memory
 * or threads the engine thread samples alone: the tokens are the same. */
static void sampling_threads(m3_engine *e, int want, int device) {
    e->wss = &e->ws;
    e->n_wss = 1;
    if (want <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        want = !device ? 1 : cpus < 1 ? 1 : cpus > 8 ? 8 : (int)cpus;
    }
    if (want > 64) want = 64;
    if (want < 2) return;
    m3_sample_ws **w = e_calloc((size_t)want, sizeof *w);
    req **ts = e_calloc((size_t)e->max_seqs, sizeof *ts);
    m3_pool *p = w && ts ? m3_pool_create(want) : NULL;
    int ok = p != NULL;
    if (ok) w[0] = e->ws;
    for (int i = 1; i < want && ok; i++) {
        m3_err e2;
        ok = (w[i] = m3_sample_ws_create(e->V, &e2)) != NULL;
    }
    if (!ok) {
        for (int i = 1; w && i < want; i++) m3_sample_ws_free(w[i]);
        free(w);
        free(ts);
        m3_pool_free(p);
        return;
    }
    e->spool = p;
    m3_sample_ws_set_pool(e->ws, p);
    e->wss = w;
    e->n_wss = want;
    e->to_sample = ts;
}

void m3_engine_opts_default(m3_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->kv_bytes = (size_t)1 << 30;
    o->kv_dtype = o->index_dtype = M3_KV_F32;
    o->max_num_seqs = 64;
    o->max_num_batched_tokens = 512;
    o->enable_prefix_caching = 1;
}

static void req_free(req *r) {
    if (!r) return;
    m3_dspark_ctx_free(&r->dctx);
    free(r->q);
    m3_sampler_free(r->smp);
    m3_engine_images_release(r->im);
    free(r->extra);
    free(r->tok);
    free(r->stop);
    free(r);
}

/* the engine's own pool (a group's pools go with the group) */
static void kv_drop(m3_engine *e) {
    if (!e->group) m3_kv_destroy(&e->kv_own);
}

m3_engine *m3_engine_create(m3_model *m, const m3_engine_opts *o, m3_err *err) {
    m3_engine_opts d;
    if (!o) { m3_engine_opts_default(&d); o = &d; }
    if (!m) { m3_errf(err, "engine: no model"); return NULL; }
    if (o->max_num_seqs < 1 || o->max_num_batched_tokens < 1) {
        m3_errf(err, "engine: max_num_seqs (%d) and max_num_batched_tokens (%d) must be >= 1", o->max_num_seqs,
                o->max_num_batched_tokens);
        return NULL;
    }
    m3_engine *e = e_calloc(1, sizeof *e);
    if (!e) { m3_errf(err, "engine: out of memory"); return NULL; }
    const m3_config *c = &m->cfg;
    e->m = m;
    e->V = c->vocab;
    e->eos = c->eos_id;
    e->page = m3_kv_page_tokens(c);
    e->max_seqs = o->max_num_seqs;
    e->max_tokens_step = o->max_num_batched_tokens;
    e->prefix = o->enable_prefix_caching != 0;
    e->next_id = 1;
    int pages = o->kv_pages;
    size_t kv_bytes = o->kv_bytes;
    snprintf(e->pool_how, sizeof e->pool_how, "%s", pages > 0 ? "pages given" : "bytes given");
    if (pages <= 0 && o->gpu_memory_utilization > 0) { /* sized from the memory there is (kv_budget.h) */
        const m3_ops *op0 = o->group ? m3_group_model(o->group, 0)->ops : m->ops;
        int rc = 0;
        if (op0 && op0->mem_info && o->group)
            rc = m3_kv_budget_group(o->group, o->gpu_memory_utilization, &kv_bytes, e->pool_how, sizeof e->pool_how, err);
        else if (op0 && op0->mem_info) {
            int k1 = o->spec.method == M3_SPEC_DSPARK ? o->spec.num_speculative_tokens + 1 : 1;
            long rows = (long)o->max_num_seqs * k1;
            rc = m3_kv_budget_device(m, o->kv_dtype, o->index_dtype, o->max_num_batched_tokens,
                                     rows < o->max_num_batched_tokens ? (int)rows : o->max_num_batched_tokens,
                                     o->gpu_memory_utilization, &kv_bytes, e->pool_how, sizeof e->pool_how, err);
        } else {
            kv_bytes = m3_kv_budget_host(e->pool_how, sizeof e->pool_how);
            if (o->group) kv_bytes /= (size_t)m3_group_size(o->group); /* the ranks share the host */
        }
        if (rc) { free(e); return NULL; }
    }
    if (pages <= 0) {
        m3_kv probe; /* one page, to learn the page size in bytes for these dtypes */
        m3_config pc = *c; /* shallow: read by m3_kv_create only */
        if (o->group) pc.n_kv_heads = m3_group_model(o->group, 0)->shard.n_kv_heads; /* kv_bytes is per rank */
        if (m3_kv_create(&probe, &pc, o->kv_dtype, o->index_dtype, e->page, 1, err)) { free(e); return NULL; }
        size_t pb = m3_kv_bytes_per_token(&probe) * (size_t)e->page;
        m3_kv_destroy(&probe);
        size_t n = pb ? kv_bytes / pb : 0;
        if (n < 1) {
            m3_errf(err, "engine: kv cache of %zu bytes holds no page (%zu bytes per %d-token page)", kv_bytes, pb,
                    e->page);
            free(e);
            return NULL;
        }
        pages = n > (1u << 30) ? (1 << 30) : (int)n;
    }
    if (o->group) { /* every rank's pool has these pages (its own KV heads); rank 0's is managed here */
        e->group = o->group;
        if (m3_group_kv_create(e->group, o->kv_dtype, o->index_dtype, e->page, pages, err)) { free(e); return NULL; }
        e->kv = m3_group_kv(e->group, 0);
    } else {
        m3_kv_mem mem = m3_model_kv_mem(m); /* device memory on a device backend */
        e->kv = &e->kv_own;
        if (m3_kv_create_in(e->kv, c, o->kv_dtype, o->index_dtype, e->page, pages, &mem, err)) { free(e); return NULL; }
    }
    int cap = pages * e->page;
    if (pages > INT32_MAX / e->page) cap = INT32_MAX;
    if (o->max_model_len > cap) {
        m3_errf(err, "engine: max_model_len %d exceeds the kv cache capacity of %d tokens", o->max_model_len, cap);
        kv_drop(e);
        free(e);
        return NULL;
    }
    /* by default the context the model was trained for (max_position_embeddings), as far as the pool holds it */
    e->max_len = o->max_model_len > 0 ? o->max_model_len : c->max_positions > 0 && c->max_positions < cap ? c->max_positions : cap;
    if (o->vision && o->vision->present) {
        m3_ops *vo = o->vision_ops ? o->vision_ops : m->ops;
        if (o->vision->cfg.text_hidden != c->hidden)
            m3_errf(err, "engine: the vision tower's text hidden size %d differs from the model's %d", o->vision->cfg.text_hidden,
                    c->hidden);
        else if (!vo || !vo->attention_full)
            m3_errf(err, "engine: the vision tower needs an op table with vision ops (opts.vision_ops) beside backend '%s'",
                    vo ? vo->name : "none");
        else {
            e->vision = o->vision;
            e->vops = vo;
        }
        if (!e->vision) { kv_drop(e); free(e); return NULL; }
        /* the key of the image content hashes: unknown outside the process, so nobody can craft
         * an image whose blocks collide with another's */
        if (getrandom(e->img_key, sizeof e->img_key, GRND_NONBLOCK) != (ssize_t)sizeof e->img_key) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            e->img_key[0] ^= (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)e;
            e->img_key[1] ^= (uint64_t)ts.tv_sec * 0xbf58476d1ce4e5b9ull ^ (uint64_t)(uintptr_t)&ts;
        }
    }
    if (o->spec.method == M3_SPEC_DSPARK) {
        e->k = o->spec.num_speculative_tokens;
        e->draft_method = o->spec.draft_sample_method;
        e->draft_hook = o->draft_hook;
        e->draft_hook_arg = o->draft_hook_arg;
        if (e->k < 1 || e->k > M3_SPEC_MAX_TOKENS)
            m3_errf(err, "engine: num_speculative_tokens %d, expected 1..%d", e->k, M3_SPEC_MAX_TOKENS);
        else if (!(o->draft_ops ? o->draft_ops : m->ops))
            m3_errf(err, "engine: DSpark beside a tensor-parallel group needs a host-memory op table (opts.draft_ops)");
        else if (strcmp((o->draft_ops ? o->draft_ops : m->ops)->name, "cpu") != 0)
            m3_errf(err, "engine: DSpark drafting runs on the CPU backend only (backend '%s')",
                    (o->draft_ops ? o->draft_ops : m->ops)->name);
        else if (m3_dspark_load(&e->draft, o->spec.draft_dir, m, o->draft_ops ? o->draft_ops : m->ops, err) == 0) {
            e->spec = 1;
            e->draft.cfg.last_layer_final_norm = o->spec.last_layer_final_norm;
            if (e->k > e->draft.cfg.window) {
                m3_errf(err, "engine: num_speculative_tokens %d exceeds the draft's sliding window %d", e->k,
                        e->draft.cfg.window);
                e->spec = 0;
                m3_dspark_free(&e->draft);
            }
        }
        if (!e->spec) { kv_drop(e); free(e); return NULL; }
    }
    e->bm = m3_blocks_create(e->kv, err);
    if (!e->bm) {
        if (e->spec) m3_dspark_free(&e->draft);
        kv_drop(e);
        free(e);
        return NULL;
    }
    e->max_rows = e->max_seqs < e->max_tokens_step ? e->max_seqs : e->max_tokens_step;
    if (e->spec) { /* a speculative decode asks for k + 1 rows */
        long rows = (long)e->max_seqs * (e->k + 1);
        e->max_rows = rows < e->max_tokens_step ? (int)rows : e->max_tokens_step;
    }
    size_t T = (size_t)e->max_tokens_step;
    e->running = e_calloc((size_t)e->max_seqs, sizeof *e->running);
    e->ids = e_malloc(T * sizeof *e->ids);
    e->pos = e_malloc(T * sizeof *e->pos);
    e->sq = e_malloc(T * sizeof *e->sq);
    e->rows = e_malloc((size_t)e->max_rows * sizeof *e->rows);
    e->zeros = e_calloc(T, sizeof *e->zeros);
    e->seqs = e_calloc((size_t)e->max_seqs, sizeof *e->seqs);
    e->logits = e_malloc((size_t)e->max_rows * (size_t)e->V * sizeof(float));
    e->ws = m3_sample_ws_create(e->V, err);
    int spec_ok = 1;
    if (e->vision) {
        e->ov_rows = e_malloc(T * sizeof *e->ov_rows);
        e->ov_emb = e_malloc(T * (size_t)c->hidden * sizeof(float));
        spec_ok = e->ov_rows && e->ov_emb;
    }
    if (e->spec) {
        e->feat = e_malloc(T * (size_t)m3_dspark_feat_dim(&e->draft) * sizeof(float));
        e->drows = e_malloc((size_t)e->k * (size_t)e->V * sizeof(float));
        e->pbuf = e_malloc((size_t)e->V * sizeof(float));
        spec_ok = spec_ok && e->feat && e->drows && e->pbuf;
    }
    int mu_ok = !pthread_mutex_init(&e->mu, NULL);
    int cv_ok = mu_ok && !pthread_cond_init(&e->cv, NULL);
    if (!e->running || !e->ids || !e->pos || !e->sq || !e->rows || !e->zeros || !e->seqs || !e->logits || !e->ws || !cv_ok ||
        !spec_ok) {
        if (e->ws) m3_errf(err, "engine: out of memory");
        if (cv_ok) pthread_cond_destroy(&e->cv);
        if (mu_ok) pthread_mutex_destroy(&e->mu);
        m3_blocks_destroy(e->bm);
        kv_drop(e);
        m3_sample_ws_free(e->ws);
        free(e->running); free(e->ids); free(e->pos); free(e->sq); free(e->rows); free(e->zeros); free(e->seqs); free(e->logits);
        free(e->feat); free(e->drows); free(e->pbuf);
        free(e->ov_rows); free(e->ov_emb);
        if (e->spec) m3_dspark_free(&e->draft);
        free(e);
        return NULL;
    }
    e->tot.spec_k = e->spec ? e->k : 0;
    e->tot.page_tokens = e->page;
    e->tot.kv_blocks_total = pages;
    e->snap = e->tot;
    sampling_threads(e, o->sample_threads, e->group || (e->m->ops && e->m->ops->device_memory));
    if (e->vision && e->vops->device_memory) { /* the tower on a device backend: its weights go there once */
        if (m3_vision_upload(e->vision, e->vops, &e->vision_dev, err)) {
            m3_err_prefix(err, "engine: vision tower");
            m3_engine_destroy(e);
            return NULL;
        }
        e->vision_dev_ok = 1;
        e->vision = &e->vision_dev;
    }
    return e;
}

void m3_engine_destroy(m3_engine *e) {
    if (!e) return;
    for (int i = 0; i < e->n_running; i++) { m3_blocks_free(e->bm, &e->running[i]->bs); req_free(e->running[i]); }
    for (int i = 0; i < e->n_waiting; i++) { m3_blocks_free(e->bm, &e->waiting[i]->bs); req_free(e->waiting[i]); }
    for (req *r = e->in_head, *n; r; r = n) { n = r->next; req_free(r); }
    m3_blocks_destroy(e->bm);
    kv_drop(e);
    if (e->vision_dev_ok) m3_vision_release(&e->vision_dev, e->vops);
    m3_pool_free(e->spool);
    for (int i = 1; i < e->n_wss; i++) m3_sample_ws_free(e->wss[i]);
    if (e->wss != &e->ws) free(e->wss);
    free(e->to_sample);
    m3_sample_ws_free(e->ws);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e->running); free(e->waiting); free(e->cancels);
    free(e->ids); free(e->pos); free(e->sq); free(e->rows); free(e->zeros); free(e->seqs); free(e->logits);
    free(e->feat); free(e->drows); free(e->pbuf);
    free(e->ov_rows); free(e->ov_emb);
    if (e->spec) m3_dspark_free(&e->draft);
    free(e);
}

m3_engine_images *m3_engine_images_create(m3_engine *e, m3_pixels *px, const int32_t *rows, int n_rows, m3_err *err) {
    return m3_images_new(e->vision, e->m->cfg.hidden, e->img_key, px, rows, n_rows, err);
}

/* ---------------- inbox (any thread) ---------------- */

uint64_t m3_engine_add(m3_engine *e, const m3_engine_request *q, m3_err *err) {
    pthread_mutex_lock(&e->mu);
    int dead = e->dead[0] != 0;
    pthread_mutex_unlock(&e->mu);
    if (dead) { m3_errf(err, "the engine has stopped: %s", e->dead); return 0; }
    if (!q || !q->prompt || q->n_prompt < 1) { m3_errf(err, "request: empty prompt"); return 0; }
    if (q->max_tokens < 1) { m3_errf(err, "request: max_tokens %d, expected >= 1", q->max_tokens); return 0; }
    if (q->n_stop_ids < 0 || (q->n_stop_ids && !q->stop_ids)) { m3_errf(err, "request: bad stop ids"); return 0; }
    if (q->n_prompt >= e->max_len) {
        m3_errf(err, "request: prompt of %d tokens leaves no room to generate (context limit %d tokens)", q->n_prompt,
                e->max_len);
        return 0;
    }
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= e->V) {
            m3_errf(err, "request: prompt token id %d at index %d is out of range (vocab %d)", q->prompt[i], i, e->V);
            return 0;
        }
    const m3_engine_images *im = q->images;
    if (im) {
        if (!e->vision) { m3_errf(err, "request: images given, but the engine has no vision tower"); return 0; }
        int32_t img_id = e->vision->cfg.image_token;
        for (int i = 0; i < im->n_rows; i++)
            if (im->rows[i] >= q->n_prompt || q->prompt[im->rows[i]] != img_id) {
                m3_errf(err, "request: image token position %d is %s", im->rows[i],
                        im->rows[i] >= q->n_prompt ? "outside the prompt" : "not an image token");
                return 0;
            }
    }
    req *r = e_calloc(1, sizeof *r);
    if (!r) { m3_errf(err, "request: out of memory"); return 0; }
    if (im) {
        m3_images_retain(q->images);
        r->im = q->images;
        if (m3_images_block_keys(im, e->page, &r->extra, &r->n_extra, err)) { req_free(r); m3_err_prefix(err, "request"); return 0; }
    }
    long lim = (long)q->n_prompt + q->max_tokens;
    r->limit = lim > e->max_len ? e->max_len : (int)lim;
    r->n_prompt = r->n_tok = q->n_prompt;
    r->max_tokens = q->max_tokens;
    r->cb = q->on_token;
    r->cb_out = q->on_output;
    r->cb_err = q->on_error;
    r->arg = q->arg;
    r->tok = e_malloc(sizeof(int32_t) * (size_t)r->limit);
    int with_eos = !q->ignore_eos && e->eos >= 0;
    r->stop = e_malloc(sizeof(int32_t) * (size_t)(q->n_stop_ids + with_eos + 1));
    if (!r->tok || !r->stop) { req_free(r); m3_errf(err, "request: out of memory"); return 0; }
    memcpy(r->tok, q->prompt, sizeof(int32_t) * (size_t)q->n_prompt);
    if (q->n_stop_ids) memcpy(r->stop, q->stop_ids, sizeof(int32_t) * (size_t)q->n_stop_ids);
    r->n_stop = q->n_stop_ids;
    if (with_eos) r->stop[r->n_stop++] = e->eos;
    m3_sampling sp = q->sampling;
    r->smp = m3_sampler_create(&sp, e->V, q->prompt, q->n_prompt, err);
    if (!r->smp) { req_free(r); m3_err_prefix(err, "request"); return 0; }
    m3_rng_seed(&r->drng, sp.seed ^ 0x64737061726b2121ull); /* the draft's own stream ("dspark!!") */
    pthread_mutex_lock(&e->mu);
    r->id = e->next_id++;
    if (e->in_tail) e->in_tail->next = r;
    else e->in_head = r;
    e->in_tail = r;
    e->n_in++;
    e->snap.requests_added++;
    pthread_cond_broadcast(&e->cv);
    uint64_t id = r->id;
    pthread_mutex_unlock(&e->mu);
    return id;
}

int m3_engine_cancel(m3_engine *e, uint64_t id) {
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    if (e->n_cancels == e->cap_cancels) {
        int nc = e->cap_cancels ? 2 * e->cap_cancels : 16;
        uint64_t *p = e_realloc(e->cancels, sizeof *p * (size_t)nc);
        if (!p) rc = -1;
        else { e->cancels = p; e->cap_cancels = nc; }
    }
    if (!rc) {
        e->cancels[e->n_cancels++] = id;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int m3_engine_has_work(m3_engine *e) {
    pthread_mutex_lock(&e->mu);
    int w = e->n_in > 0 || e->n_cancels > 0 || e->active > 0;
    pthread_mutex_unlock(&e->mu);
    return w;
}

int m3_engine_wait_work(m3_engine *e, int timeout_ms) {
    pthread_mutex_lock(&e->mu);
    struct timespec dl;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    }
    while (!(e->n_in > 0 || e->n_cancels > 0 || e->active > 0)) {
        int rc = timeout_ms >= 0 ? pthread_cond_timedwait(&e->cv, &e->mu, &dl) : pthread_cond_wait(&e->cv, &e->mu);
        if (rc == ETIMEDOUT) break;
    }
    int w = e->n_in > 0 || e->n_cancels > 0 || e->active > 0;
    pthread_mutex_unlock(&e->mu);
    return w;
}

void m3_engine_get_stats(m3_engine *e, m3_engine_stats *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->snap;
    st->waiting += e->n_in;
    pthread_mutex_unlock(&e->mu);
}

void m3_engine_last_step(const m3_engine *e, m3_engine_step_stats *st) { *st = e->last; }
const char *m3_engine_pool_how(const m3_engine *e) { return e->pool_how; }

int m3_engine_capacity_tokens(const m3_engine *e) {
    long c = (long)e->kv->n_pages * e->page;
    return c > INT32_MAX ? INT32_MAX : (int)c;
}
int m3_engine_max_model_len(const m3_engine *e) { return e->max_len; }

/* ---------------- engine thread ---------------- */

static void emit(req *r, const m3_sample_out *so, int reason) {
    int fin = reason != M3_FINISH_NONE;
    if (reason == M3_FINISH_ERROR && r->cb_err) r->cb_err(r->arg, r->id, r->why ? r->why : "the engine failed");
    if (r->cb_out) r->cb_out(r->arg, r->id, so, fin, reason);
    else if (r->cb) r->cb(r->arg, r->id, so ? so->token : -1, so ? so->logprob : 0.0f, fin, reason);
}

/* ends r (which holds no place in running / waiting any more): frees its blocks, calls back */
static void finish(m3_engine *e, req *r, int reason) {
    m3_blocks_free(e->bm, &r->bs);
    e->tot.requests_finished[reason]++;
    emit(r, NULL, reason);
    req_free(r);
}

static void fail(m3_engine *e, req *r, const char *why) {
    r->why = why;
    finish(e, r, M3_FINISH_ERROR);
}

static const char OOM[] = "out of memory in the engine";

/* 1 when every value of the n logits is finite: NaN or Inf in the weights (or an overflow)
 * ends the request with an error instead of sampling garbage. On the bits (|x| >= the
 * exponent-all-ones pattern), so that it vectorizes: a small cost next to the forward. */
/* no Inf / NaN (exponent bits all set) in x[0..n); written as an OR of compares, which the
 * compiler vectorizes with SSE2 (an unsigned max does not: 117 -> 29 us a 200K row) */
static int logits_finite(const float *x, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        bad |= (b & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

static int waiting_push(m3_engine *e, req *r, int at_head) {
    if (e->n_waiting == e->cap_waiting) {
        int nc = e->cap_waiting ? 2 * e->cap_waiting : 16;
        req **p = e_realloc(e->waiting, sizeof *p * (size_t)nc);
        if (!p) return -1;
        e->waiting = p;
        e->cap_waiting = nc;
    }
    if (at_head) {
        memmove(e->waiting + 1, e->waiting, sizeof *e->waiting * (size_t)e->n_waiting);
        e->waiting[0] = r;
    } else {
        e->waiting[e->n_waiting] = r;
    }
    e->n_waiting++;
    return 0;
}

static void waiting_remove(m3_engine *e, int i) {
    memmove(e->waiting + i, e->waiting + i + 1, sizeof *e->waiting * (size_t)(e->n_waiting - i - 1));
    e->n_waiting--;
}

static void running_remove(m3_engine *e, int i) {
    memmove(e->running + i, e->running + i + 1, sizeof *e->running * (size_t)(e->n_running - i - 1));
    e->n_running--;
}

/* Takes new requests and cancellations from the inbox. */
static void drain(m3_engine *e) {
    pthread_mutex_lock(&e->mu);
    req *head = e->in_head;
    e->in_head = e->in_tail = NULL;
    e->n_in = 0;
    uint64_t *cancels = e->cancels;
    int n_cancels = e->n_cancels;
    e->cancels = NULL;
    e->n_cancels = e->cap_cancels = 0;
    pthread_mutex_unlock(&e->mu);
    for (req *r = head, *n; r; r = n) {
        n = r->next;
        r->next = NULL;
        if (waiting_push(e, r, 0)) fail(e, r, OOM);
    }
    for (int k = 0; k < n_cancels; k++) {
        uint64_t id = cancels[k];
        int found = 0;
        for (int i = 0; i < e->n_waiting && !found; i++)
            if (e->waiting[i]->id == id) {
                req *r = e->waiting[i];
                waiting_remove(e, i);
                finish(e, r, M3_FINISH_CANCELLED);
                found = 1;
            }
        for (int i = 0; i < e->n_running && !found; i++)
            if (e->running[i]->id == id) {
                req *r = e->running[i];
                running_remove(e, i);
                finish(e, r, M3_FINISH_CANCELLED);
                found = 1;
            }
    }
    free(cancels);
}

/* Moves the most recently admitted running sequence back to the head of the waiting queue,
 * freeing its blocks; gives back the budget it had been given this step. */
static req *preempt_last(m3_engine *e, int *budget) {
    req *v = e->running[e->n_running - 1];
    e->n_running--;
    *budget += v->n_sched;
    v->n_sched = 0;
    v->decode = 0;
    v->k_sched = 0;
    m3_blocks_free(e->bm, &v->bs);
    v->n_done = 0;
    e->tot.preemptions++;
    e->last.n_preempted++;
    if (waiting_push(e, v, 1)) fail(e, v, OOM);
    return v;
}

static void schedule(m3_engine *e) {
    int budget = e->max_tokens_step;
    m3_err e2;
    for (int i = 0; i < e->n_running; i++) e->running[i]->n_sched = e->running[i]->decode = e->running[i]->k_sched = 0;
    /* 1: decodes (one pending token), 2: sequences still prefilling, oldest first */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < e->n_running && budget > 0; i++) {
            req *r = e->running[i];
            int rem = r->n_tok - r->n_done;
            if (r->n_sched || (pass == 0) != (rem == 1)) continue;
            int n = rem < budget ? rem : budget, k = 0;
            if (pass == 0 && e->spec) { /* a speculative decode: the anchor + k drafts */
                k = e->k;
                if (k > r->limit - r->n_tok - 1) k = r->limit - r->n_tok - 1; /* room to emit k + 1 */
                if (k > budget - 1) k = budget - 1;
                if (k < 0) k = 0;
                n = 1 + k;
            }
            int ok = 1;
            for (;;) {
                int need = r->n_done + n - r->bs.n_tokens;
                int rc = need > 0 ? m3_blocks_allocate(e->bm, &r->bs, need, &e2) : 0;
                if (rc == 0) break;
                if (rc < 0) { /* cannot ever fit (or no memory): end it */
                    running_remove(e, i);
                    fail(e, r, "the KV cache cannot hold this request");
                    i--;
                    ok = 0;
                    break;
                }
                req *v = preempt_last(e, &budget);
                if (v == r) { ok = 0; break; }
            }
            if (!ok) continue;
            r->n_sched = n;
            r->decode = pass == 0;
            r->k_sched = k;
            budget -= n;
        }
    }
    /* 3: admit waiting requests, FCFS, unless someone was just preempted */
    while (!e->last.n_preempted && e->n_waiting > 0 && budget > 0 && e->n_running < e->max_seqs) {
        req *r = e->waiting[0];
        int hit = 0;
        if (e->prefix) {
            /* with a draft, the last `window` positions are recomputed: their hidden rows feed
             * the draft context (admit reuses at most n_look - 1 tokens) */
            long n_look = r->n_tok;
            if (e->spec) n_look = (long)r->n_tok - e->draft.cfg.window + 1 > 1 ? (long)r->n_tok - e->draft.cfg.window + 1 : 1;
            hit = m3_blocks_admit(e->bm, &r->bs, r->tok, (int)n_look, r->extra, r->n_extra, &e2);
            if (hit < 0) { waiting_remove(e, 0); fail(e, r, OOM); continue; }
        }
        r->n_done = hit;
        if (e->spec) m3_dspark_ctx_reset(&r->dctx, hit);
        int rem = r->n_tok - hit;
        int n = rem < budget ? rem : budget;
        int need = hit + n - r->bs.n_tokens;
        int rc = need > 0 ? m3_blocks_allocate(e->bm, &r->bs, need, &e2) : 0;
        if (rc) {
            m3_blocks_free(e->bm, &r->bs);
            r->n_done = 0;
            if (rc < 0) { waiting_remove(e, 0); fail(e, r, "the KV cache cannot hold this request"); continue; }
            break; /* does not fit now: wait (FCFS: nobody overtakes it) */
        }
        waiting_remove(e, 0);
        e->running[e->n_running++] = r;
        r->n_sched = n;
        r->decode = 0;
        budget -= n;
        e->tot.prefix_hit_tokens += (uint64_t)hit;
        e->last.n_admitted++;
    }
}

static void snapshot(m3_engine *e) {
    m3_blocks_stats bs;
    m3_blocks_get_stats(e->bm, &bs);
    e->tot.running = e->n_running;
    e->tot.waiting = e->n_waiting;
    e->tot.kv_blocks_used = bs.used;
    e->tot.kv_blocks_cached = bs.cached;
    e->tot.kv_blocks_total = bs.total;
    pthread_mutex_lock(&e->mu);
    uint64_t added = e->snap.requests_added; /* counted at add time, under the lock */
    e->snap = e->tot;
    e->snap.requests_added = added;
    e->active = e->n_running + e->n_waiting;
    pthread_mutex_unlock(&e->mu);
}

/* m3_taps.capture: the step's rows of one target layer the draft reads */
static void on_capture(void *arg, int layer, const float *h, int T, int H) {
    m3_engine *e = arg;
    int slot = m3_dspark_feat_slot(&e->draft, layer), F = m3_dspark_feat_dim(&e->draft);
    if (slot < 0) return;
    for (int t = 0; t < T; t++)
        memcpy(e->feat + (size_t)(e->cap_row0 + t) * F + (size_t)slot * H, h + (size_t)t * H, sizeof(float) * H);
}

/* Draws the drafts of every speculative decode of this step; a request whose draft fails ends
 * with an error. */
static void draft_all(m3_engine *e) {
    for (int i = 0; i < e->n_running; i++) {
        req *r = e->running[i];
        if (!r->n_sched || !r->k_sched) continue;
        m3_err e2;
        int rc = 0;
        if (!r->q && !m3_sampler_is_greedy(r->smp) && e->draft_method == M3_SPEC_DRAFT_PROBABILISTIC) {
            r->q = e_malloc(sizeof(float) * (size_t)e->k * (size_t)e->V);
            if (!r->q) rc = -1;
        }
        /* always all k slots, so the drafts do not depend on how many get verified */
        if (!rc)
            rc = m3_spec_draft(&e->draft, &r->dctx, r->smp, e->ws, &r->drng, e->draft_method, r->tok[r->n_tok - 1],
                               r->n_done, e->k, e->drows, r->draft, r->q, &r->q_used, &e2);
        if (rc) {
            running_remove(e, i--);
            fail(e, r, "drafting failed");
            continue;
        }
        if (e->draft_hook && m3_sampler_is_greedy(r->smp))
            e->draft_hook(e->draft_hook_arg, r->id, r->tok, r->n_tok, r->draft, e->k);
    }
}

/* Runs the vision tower for every scheduled request whose chunk reaches image positions
 * that are not encoded yet (prefix-cache hits skip it); a failure ends that request. */
static void encode_images(m3_engine *e) {
    for (int i = 0; i < e->n_running; i++) {
        req *r = e->running[i];
        if (!r->n_sched || !r->im || r->im->emb) continue;
        int k = m3_images_first_row(r->im, r->n_done);
        if (k == r->im->n_rows || r->im->rows[k] >= r->n_done + r->n_sched) continue;
        m3_err e2;
        if (m3_images_encode(r->im, e->vision, e->vops, &e2)) {
            running_remove(e, i--);
            fail(e, r, "the vision tower failed on the request's images (out of memory)");
            continue;
        }
        e->tot.vision_runs++;
        e->tot.vision_images += (uint64_t)r->im->n_images;
    }
}

/* One request of sample_rows: its row's finiteness, then (finite) its draw. */
static void sample_one(m3_engine *e, req *r, m3_sample_ws *ws) {
    const float *lg = e->logits + (size_t)r->out_idx * e->V;
    m3_err e2;
    r->so_finite = logits_finite(lg, (size_t)e->V);
    r->so_rc = r->so_finite ? m3_sampler_sample(r->smp, lg, ws, &r->so, &e2) : 0;
}

static void sample_range(void *ctx, size_t begin, size_t end, int worker) {
    m3_engine *e = ctx;
    for (size_t i = begin; i < end; i++) sample_one(e, e->to_sample[i], e->wss[worker]);
}

/* The plain samples of a step (rows with no drafts to verify), before the serial pass that
 * accepts and delivers them in order: spread over the sampling threads when there are
 * several. Each draw reads only its request's logits row and sampler (its RNG and counts):
 * the same tokens as one after the other. */
static void sample_rows(m3_engine *e, int nr) {
    int n = 0;
    for (int i = 0; i < nr; i++) {
        req *r = e->running[i];
        if (!r->n_sched || r->k_sched || r->out_idx < 0 || r->fwd_failed) continue;
        if (e->spool) e->to_sample[n++] = r; /* at most n_running <= max_seqs */
        else sample_one(e, r, e->ws);
    }
    if (n == 1) sample_one(e, e->to_sample[0], e->ws);
    else if (n > 1) {
        m3_sample_ws_set_pool(e->ws, NULL); /* worker 0's workspace: no loop inside the pool's own loop */
        m3_pool_for(e->spool, (size_t)n, 1, sample_range, e);
        m3_sample_ws_set_pool(e->ws, e->spool);
        e->tot.tokens_sampled_parallel += (uint64_t)n;
    }
}

/* Reports sampled/verified tokens of r: appends them, calls back; returns the finish reason. */
static int deliver(m3_engine *e, req *r, const m3_sample_out *outs, int n) {
    int reason = M3_FINISH_NONE;
    for (int j = 0; j < n && !reason; j++) {
        const m3_sample_out *so = &outs[j];
        r->tok[r->n_tok++] = so->token;
        r->n_gen++;
        e->tot.tokens_generated++;
        for (int k = 0; k < r->n_stop; k++)
            if (r->stop[k] == so->token) reason = M3_FINISH_STOP;
        if (!reason && (r->n_gen >= r->max_tokens || r->n_tok >= r->limit)) reason = M3_FINISH_LENGTH;
        e->tot.requests_finished[reason] += reason != M3_FINISH_NONE;
        emit(r, so, reason);
    }
    return reason;
}


/* ---------------- a failed forward pass ---------------- */

/* The backend after a failed step: 0 when it can go on (its error state cleared), -1 + err
 * when the device is lost (a CUDA error that sticks to the context). */
static int backend_recover(m3_engine *e, m3_err *err) {
    if (e->group) {
        for (int k = 0; k < m3_group_size(e->group); k++) {
            const m3_ops *op = m3_group_model(e->group, k)->ops;
            if (op && op->recover && op->recover(op->ctx, err)) return m3_err_prefix(err, "rank %d", k);
        }
        return 0;
    }
    const m3_ops *op = e->m->ops;
    return op && op->recover ? op->recover(op->ctx, err) : 0;
}

/* Every request, running, waiting or in the inbox, ends with the engine's death. */
static void fail_all(m3_engine *e) {
    drain(e);
    while (e->n_running) {
        req *r = e->running[e->n_running - 1];
        running_remove(e, e->n_running - 1);
        fail(e, r, e->dead);
    }
    while (e->n_waiting) {
        req *r = e->waiting[0];
        waiting_remove(e, 0);
        fail(e, r, e->dead);
    }
}

/* The device is lost: every request ends with the reason, and the engine takes no more. */
static void go_dead(m3_engine *e, const char *what, const char *dev) {
    pthread_mutex_lock(&e->mu);
    if (!e->dead[0]) snprintf(e->dead, sizeof e->dead, "the device failed and cannot go on (%s; then: %s)", what, dev);
    pthread_mutex_unlock(&e->mu);
    fail_all(e);
}

/* Runs request r's rows of this step alone (the step's arrays, r's slice of them). */
static int forward_alone(m3_engine *e, req *r, m3_err *err) {
    const int si = e->sq[r->row0], n = r->n_sched;
    int rows[M3_SPEC_MAX_TOKENS + 1], n_out = 0;
    if (r->out_idx >= 0) {
        if (r->k_sched) for (int j = 0; j <= r->k_sched; j++) rows[n_out++] = j;
        else rows[n_out++] = n - 1;
    }
    int32_t ovr[64];
    int n_ov = r->n_ov <= 64 ? r->n_ov : 0, rc = 0;
    for (int k = 0; k < n_ov; k++) ovr[k] = e->ov_rows[r->ov0 + k] - r->row0;
    m3_batch b = {n, e->pos + r->row0, e->zeros, &e->seqs[si]};
    m3_embed_override ov = {n_ov, ovr, n_ov ? e->ov_emb + (size_t)r->ov0 * e->m->cfg.hidden : NULL};
    m3_taps taps = {.arg = e, .capture_layers = e->spec ? e->draft.capture : NULL, .capture = on_capture};
    float *lg = r->out_idx >= 0 ? e->logits + (size_t)r->out_idx * e->V : NULL;
    if (r->n_ov > 64) return m3_errf(err, "%d image rows in one chunk (a retry alone takes 64)", r->n_ov);
    e->cap_row0 = r->row0;
    rc = e->group ? m3_group_forward_ex(e->group, &b, e->ids + r->row0, n_ov ? &ov : NULL, rows, n_out, lg,
                                        e->spec ? &taps : NULL, err)
                  : m3_forward_ex(e->m, e->kv, &b, e->ids + r->row0, n_ov ? &ov : NULL, rows, n_out, lg,
                                  e->spec ? &taps : NULL, err);
    e->cap_row0 = 0;
    return rc;
}

/* The step's forward pass failed (err: why). A failure is one request's or the device's:
 *   - the backend recovers (the device is usable): a step of one request fails that request;
 *     a step of several runs each of them again alone, and only those that fail alone end
 *     (with their own error), the others go on as if the step had not failed;
 *   - it does not (a device error that sticks): every request ends with the reason, the engine
 *     takes no more (m3_engine_dead), and the server stops.
 * err gets the step's shape and what became of it (for the log). 0: the step goes on with the
 * requests whose rows ran; -1: nothing is left of it. */
static int step_failed(m3_engine *e, int T, int ns, int n_out, m3_err *err) {
    char what[512], shape[160];
    snprintf(what, sizeof what, "%s", err->msg);
    snprintf(shape, sizeof shape, "engine step of %d tokens (%d sequences: %d decoding, %d prefill tokens; %d logits rows)",
             T, ns, e->last.n_decode, e->last.n_prefill_tokens, n_out);
    m3_err_prefix(err, "%s", shape);
    m3_err e2;
    if (backend_recover(e, &e2)) {
        go_dead(e, what, e2.msg);
        m3_errf(err, "%s: %s", shape, e->dead);
        return -1;
    }
    int n_bad = 0;
    for (int i = 0; i < e->n_running; i++) {
        req *r = e->running[i];
        if (!r->n_sched) continue;
        const char *why = what;
        if (ns > 1) { /* whose failure is it? each alone */
            if (!forward_alone(e, r, &e2)) continue;
            why = e2.msg;
            m3_err e3;
            if (backend_recover(e, &e3)) {
                go_dead(e, e2.msg, e3.msg);
                m3_errf(err, "%s: %s", shape, e->dead);
                return -1;
            }
        }
        snprintf(r->why_buf, sizeof r->why_buf, "the model's forward pass failed: %s", why);
        r->fwd_failed = 1;
        n_bad++;
    }
    size_t l = strlen(err->msg);
    if (ns > 1 && l + 1 < sizeof err->msg)
        snprintf(err->msg + l, sizeof err->msg - l, "; run again one request at a time: %d of %d failed alone%s", n_bad, ns,
                 n_bad ? "" : " (the others go on)");
    return 0;
}

const char *m3_engine_dead(m3_engine *e) {
    pthread_mutex_lock(&e->mu);
    const char *d = e->dead[0] ? e->dead : NULL;
    pthread_mutex_unlock(&e->mu);
    return d;
}

int m3_engine_step(m3_engine *e, m3_err *err) {
    memset(&e->last, 0, sizeof e->last);
    if (e->dead[0]) { /* requests that reached the inbox as the device failed */
        fail_all(e);
        snapshot(e);
        return m3_errf(err, "%s", e->dead);
    }
    drain(e);
    schedule(e);
    if (e->spec) draft_all(e);
    if (e->vision) encode_images(e);
    const int V = e->V, H = e->m->cfg.hidden;
    int step_rc = 0; /* -1: the forward failed, some requests may have gone on (step_failed) */
    int n_ov = 0; /* batch rows whose embeddings are image embeddings */
    const int F = e->spec ? m3_dspark_feat_dim(&e->draft) : 0;
    int T = 0, ns = 0, n_out = 0;
    for (int i = 0; i < e->n_running; i++) {
        req *r = e->running[i];
        if (!r->n_sched) continue;
        e->seqs[ns] = &r->bs.kv;
        r->row0 = T;
        for (int j = 0; j < r->n_sched; j++) {
            /* a speculative decode runs [anchor, d_1..d_k] */
            e->ids[T] = j && r->k_sched ? r->draft[j - 1] : r->tok[r->n_done + j];
            e->pos[T] = r->n_done + j;
            e->sq[T] = ns;
            T++;
        }
        r->ov0 = n_ov;
        if (r->im && r->im->emb) /* the image positions of this chunk */
            for (int k = m3_images_first_row(r->im, r->n_done); k < r->im->n_rows && r->im->rows[k] < r->n_done + r->n_sched;
                 k++) {
                e->ov_rows[n_ov] = r->row0 + (r->im->rows[k] - r->n_done);
                memcpy(e->ov_emb + (size_t)n_ov * H, r->im->emb + (size_t)k * H, sizeof(float) * (size_t)H);
                n_ov++;
            }
        r->n_ov = n_ov - r->ov0;
        r->out_idx = -1;
        if (r->k_sched) { /* every row's logits: row i verifies d_{i+1} */
            r->out_idx = n_out;
            for (int j = 0; j <= r->k_sched; j++) e->rows[n_out++] = r->row0 + j;
            e->last.n_spec++;
            e->last.n_draft += r->k_sched;
        } else if (r->n_done + r->n_sched == r->n_tok) {
            r->out_idx = n_out;
            e->rows[n_out++] = T - 1;
        }
        ns++;
        if (r->decode) e->last.n_decode++;
        else e->last.n_prefill_tokens += r->n_sched;
    }
    e->last.n_tokens = T;
    e->last.n_seqs = ns;
    e->last.n_logits = n_out;
    if (T > 0) {
        e->tot.steps++;
        m3_batch b = {T, e->pos, e->sq, e->seqs};
        m3_taps taps = {.arg = e, .capture_layers = e->spec ? e->draft.capture : NULL, .capture = on_capture};
        m3_embed_override ov = {n_ov, e->ov_rows, e->ov_emb};
        int frc = e->group ? m3_group_forward_ex(e->group, &b, e->ids, n_ov ? &ov : NULL, e->rows, n_out, e->logits,
                                                 e->spec ? &taps : NULL, err)
                           : m3_forward_ex(e->m, e->kv, &b, e->ids, n_ov ? &ov : NULL, e->rows, n_out, e->logits,
                                           e->spec ? &taps : NULL, err);
        if (frc && step_failed(e, T, ns, n_out, err) < 0) {
            snapshot(e);
            return -1;
        }
        step_rc = frc ? -1 : 0;
        e->tot.tokens_prefilled += (uint64_t)e->last.n_prefill_tokens;
        int nr = e->n_running;
        sample_rows(e, nr);
        for (int i = 0; i < nr; i++) {
            req *r = e->running[i];
            r->done = 0;
            if (!r->n_sched) continue;
            m3_err e2;
            const int P = r->n_done;
            int n_valid = r->n_sched; /* positions whose KV entries stay: all but rejected drafts */
            int reason = M3_FINISH_NONE;
            const int plain = !r->k_sched && r->out_idx >= 0; /* sampled by sample_rows */
            if (r->fwd_failed) { /* its forward pass failed with it alone (step_failed) */
                r->fwd_failed = 0;
                r->why = r->why_buf;
                r->done = M3_FINISH_ERROR;
                continue;
            }
            if (r->out_idx >= 0 &&
                !(plain ? r->so_finite : logits_finite(e->logits + (size_t)r->out_idx * V, (size_t)V * (size_t)(1 + r->k_sched)))) {
                r->why = "the model produced non-finite logits (NaN or Inf)";
                e->tot.nonfinite_logits++;
                r->done = M3_FINISH_ERROR;
                continue;
            }
            if (r->k_sched) {
                m3_spec_result res;
                int max_emit = r->max_tokens - r->n_gen < r->limit - r->n_tok ? r->max_tokens - r->n_gen : r->limit - r->n_tok;
                if (m3_spec_verify(r->smp, e->ws, e->pbuf, e->logits + (size_t)r->out_idx * V, r->draft,
                                   r->q_used ? r->q : NULL, r->k_sched, r->stop, r->n_stop, max_emit, &res, &e2)) {
                    r->why = "speculative verification failed";
                    r->done = M3_FINISH_ERROR;
                    continue;
                }
                n_valid = 1 + (res.n_accepted < res.n_emit ? res.n_accepted : res.n_emit);
                /* roll back: the rejected drafts' entries past kv.len are never read (a later
                 * forward rewrites a position before any query reaches it) */
                r->n_done = P + n_valid;
                r->bs.kv.len = r->n_done;
                e->tot.spec_verify_steps++;
                e->tot.spec_draft_tokens += (uint64_t)r->k_sched;
                e->tot.spec_accepted_tokens += (uint64_t)res.n_accepted;
                e->tot.spec_emitted_tokens += (uint64_t)res.n_emit;
                for (int j = 0; j < r->k_sched; j++) {
                    e->tot.spec_drafted_per_pos[j]++;
                    e->tot.spec_accepted_per_pos[j] += j < res.n_accepted;
                }
                reason = deliver(e, r, res.out, res.n_emit);
            } else {
                r->n_done += r->n_sched;
            }
            /* only positions below n_done (committed tokens) reach the prefix cache */
            if (e->prefix && m3_blocks_commit(e->bm, &r->bs, r->tok, r->n_done, r->extra, r->n_extra, &e2)) {
                r->why = OOM;
                r->done = M3_FINISH_ERROR;
                continue;
            }
            if (plain) {
                if (r->so_rc || m3_sampler_accept(r->smp, r->so.token, &e2)) {
                    r->why = "sampling failed (out of memory)";
                    r->done = M3_FINISH_ERROR;
                    continue;
                }
                reason = deliver(e, r, &r->so, 1);
            }
            /* the draft context takes the committed rows (not needed once the request ends) */
            if (e->spec && !reason &&
                m3_dspark_ctx_append(&e->draft, &r->dctx, e->feat + (size_t)r->row0 * F, P, n_valid, &e2)) {
                r->why = "the draft context failed (out of memory)";
                r->done = M3_FINISH_ERROR;
                continue;
            }
            r->done = reason;
        }
        /* drop finished ones (their callbacks were made above, errors get theirs here) */
        int k = 0;
        for (int i = 0; i < nr; i++) {
            req *r = e->running[i];
            if (!r->done) { e->running[k++] = r; continue; }
            if (r->done == M3_FINISH_ERROR) {
                finish(e, r, M3_FINISH_ERROR);
                continue;
            }
            m3_blocks_free(e->bm, &r->bs);
            req_free(r);
        }
        e->n_running = k;
    }
    snapshot(e);
    return step_rc ? -1 : e->n_running + e->n_waiting;
}
