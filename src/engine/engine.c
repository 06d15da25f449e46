/* Engine core: creation and teardown, the inbox (any thread adds and cancels requests),
 * stats. The engine thread's work (scheduler, samplers, callbacks) is in step.c. See engine.h. */
#include "engine_int.h"
#include "../base/clock.h"
#include "../base/hash.h"

#include <stdlib.h>
#include <string.h>

const char *m3_engine_finish_name(int r) {
    switch (r) {
    case M3_FINISH_STOP: return "stop";
    case M3_FINISH_LENGTH: return "length";
    case M3_FINISH_CANCELLED: return "cancelled";
    case M3_FINISH_ERROR: return "error";
    default: return "";
    }
}

/* a verify scratch per sampling worker: 1, or 0 out of memory */
static int pbufs_alloc(m3_engine *e) {
    if (!(e->pbufs = e_calloc((size_t)e->n_wss, sizeof *e->pbufs))) return 0;
    for (int i = 0; i < e->n_wss; i++)
        if (!(e->pbufs[i] = e_malloc((size_t)e->V * sizeof(float)))) return 0;
    return 1;
}
static void pbufs_free(m3_engine *e) {
    for (int i = 0; e->pbufs && i < e->n_wss; i++) free(e->pbufs[i]);
    free(e->pbufs);
    e->pbufs = NULL;
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

/* The logits rows a step may ask for: one a sequence (k + 1 with a draft: a speculative decode's),
 * or max_logits_rows when more (prompt logprobs' chunks), at most the token budget. */
static int step_rows(const m3_engine_opts *o) {
    const int k1 = o->spec.method == M3_SPEC_DSPARK ? o->spec.num_speculative_tokens + 1 : 1;
    long rows = (long)o->max_num_seqs * k1;
    if (o->max_logits_rows > rows) rows = o->max_logits_rows;
    return rows < o->max_num_batched_tokens ? (int)rows : o->max_num_batched_tokens;
}

void m3_engine_opts_default(m3_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->kv_bytes = (size_t)1 << 30;
    o->kv_dtype = o->index_dtype = M3_KV_F32;
    o->max_num_seqs = 64;
    o->max_num_batched_tokens = 512;
    o->enable_prefix_caching = 1;
}

void m3_engine_req_free(req *r) {
    if (!r) return;
    m3_dspark_ctx_free(&r->dctx);
    free(r->q);
    m3_sampler_free(r->smp);
    m3_engine_images_release(r->im);
    m3_matcher_free(r->gm);
    free(r->gmask);
    m3_engine_grammar_release(r->gr);
    free(r->extra);
    free(r->tok);
    free(r->stop);
    free(r);
}

/* the engine's own pool (a group's pools go with the group) */
static void kv_drop(m3_engine *e) {
    if (!e->group) m3_kv_destroy(&e->kv_own);
}

static void plp_free(m3_engine *e) {
    free(e->rows_alone); free(e->plp_out); free(e->plp_fin); free(e->plp_row); free(e->plp_req);
    free(e->lp_rows); free(e->lp_tok); free(e->lp_n); free(e->lp_alone); free(e->lp_res);
}

/* the capture's rows: host memory, or the draft's device memory */
static void feat_free(m3_engine *e) {
    if (e->feat && e->draft_dev) e->draft.ops->release(e->draft.ops->ctx, e->feat);
    else free(e->feat);
    e->feat = NULL;
    if (e->qstage) e->draft.ops->host_free(e->draft.ops->ctx, e->qstage);
    e->qstage = NULL;
    e->qstage_n = 0;
    if (e->qdev) e->draft.ops->release(e->draft.ops->ctx, e->qdev);
    e->qdev = NULL;
    e->qdev_n = 0;
}

/* a failure of m3_engine_create before the block manager exists */
static void free_early(m3_engine *e) {
    if (e->qstage) e->draft.ops->host_free(e->draft.ops->ctx, e->qstage);
    if (e->qdev) e->draft.ops->release(e->draft.ops->ctx, e->qdev);
    if (e->spec) m3_dspark_free(&e->draft);
    free(e);
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
    e->prio = o->scheduling_priority != 0;
    /* the draft first: on the target's device its weights take memory the KV pool is sized from */
    if (o->spec.method == M3_SPEC_DSPARK) {
        m3_ops *dops = o->draft_ops ? o->draft_ops : m->ops;
        e->k = o->spec.num_speculative_tokens;
        e->draft_method = o->spec.draft_sample_method;
        e->draft_hook = o->draft_hook;
        e->draft_hook_arg = o->draft_hook_arg;
        if (e->k < 1 || e->k > M3_SPEC_MAX_TOKENS)
            m3_errf(err, "engine: num_speculative_tokens %d, expected 1..%d", e->k, M3_SPEC_MAX_TOKENS);
        else if (!dops)
            m3_errf(err, "engine: DSpark beside a tensor-parallel group needs a host-memory op table (opts.draft_ops)");
        else if (dops->device_memory && (o->group || dops != m->ops))
            m3_errf(err, "engine: a DSpark draft on backend '%s' runs on the target's own op table (one device, no "
                         "tensor-parallel group); give a host op table (opts.draft_ops) otherwise", dops->name);
        else if (m3_dspark_load(&e->draft, o->spec.draft_dir, m, dops, err) == 0) {
            e->spec = 1;
            e->draft_dev = dops->device_memory != 0;
            e->draft.cfg.last_layer_final_norm = o->spec.last_layer_final_norm;
            e->conf_thr = (float)o->spec.confidence_threshold;
            e->spec_off_bs = o->spec.disable_by_batch_size;
            e->spec_max_len = o->spec.max_model_len;
            if (e->conf_thr > 0 && !e->draft.cfg.confidence_head) {
                m3_errf(err, "engine: dspark_confidence_threshold %g, but the draft in %s has no confidence head "
                             "(enable_confidence_head is not true in its config.json)",
                        (double)e->conf_thr, o->spec.draft_dir);
                e->spec = 0;
                m3_dspark_free(&e->draft);
            } else if (e->k > e->draft.cfg.window) {
                m3_errf(err, "engine: num_speculative_tokens %d exceeds the draft's sliding window %d", e->k,
                        e->draft.cfg.window);
                e->spec = 0;
                m3_dspark_free(&e->draft);
            }
        }
        if (!e->spec) { free(e); return NULL; }
    }
    /* a draft on the device: its workspace now (the budget below sees it), its requests' context
     * rings kept out of the pool */
    size_t ring_bytes = 0;
    if (e->spec && e->draft_dev &&
        m3_dspark_reserve(&e->draft, o->max_num_seqs, o->max_num_batched_tokens, e->k, &ring_bytes, err)) {
        free_early(e);
        return NULL;
    }
    /* the q rows of probabilistic drafts: staging for one draft batch in host_alloc's memory
     * (page-locked on a device: they come back at the link's speed; past it, or without it,
     * each request's own rows) */
    if (e->spec && e->draft_method == M3_SPEC_DRAFT_PROBABILISTIC && e->draft.ops->host_alloc) {
        const int n = o->max_num_seqs < M3_SPEC_DRAFT_BATCH ? o->max_num_seqs : M3_SPEC_DRAFT_BATCH;
        e->qstage = e->draft.ops->host_alloc(e->draft.ops->ctx, sizeof(float) * (size_t)n * e->k * (size_t)m->cfg.vocab);
        e->qstage_n = e->qstage ? n : 0;
    }
    /* prompt logprobs: reduced where the logits are when the backend can (not a TP group, whose
     * logits are gathered whole; M3_PROMPT_LOGPROBS=host or opts.prompt_logprobs_host: never),
     * up to a step's every token; else host rows, cut to the rows a step has */
    const char *plp_env = getenv("M3_PROMPT_LOGPROBS");
    e->lp_dev = !o->group && m->ops && m->ops->logprob_rows && !o->prompt_logprobs_host &&
                !(plp_env && !strcmp(plp_env, "host"));
    /* plain sampled output rows drawn where the logits are (m3_spec_draws_on_backend) */
    e->draw_dev = !o->group && m->ops && m->ops->argmax_rows_fin && m3_spec_draws_on_backend(m->ops);
    /* and where the target verifies sampled requests (ops verify_rows): the q rows of up to
     * QDEV_MAX requests a step (and QDEV_BYTES) stay in the device's memory (past them, the
     * staging above) */
    if (e->spec && e->draw_dev && m->ops->verify_rows && e->draft.ops == m->ops &&
        e->draft_method == M3_SPEC_DRAFT_PROBABILISTIC) {
        const size_t per = sizeof(float) * (size_t)e->k * (size_t)m->cfg.vocab;
        int n = o->max_num_seqs < QDEV_MAX ? o->max_num_seqs : QDEV_MAX;
        if ((size_t)n * per > QDEV_BYTES) n = QDEV_BYTES / per > 0 ? (int)(QDEV_BYTES / per) : 1;
        e->qdev = e->draft.ops->alloc(e->draft.ops->ctx, (size_t)n * per);
        e->qdev_n = e->qdev ? n : 0;
    }
    int pages = o->kv_pages;
    size_t kv_bytes = o->kv_bytes;
    snprintf(e->pool_how, sizeof e->pool_how, "%s", pages > 0 ? "pages given" : "bytes given");
    if (pages <= 0 && o->gpu_memory_utilization > 0) { /* sized from the memory there is (kv_budget.h) */
        const m3_ops *op0 = o->group ? m3_group_model(o->group, 0)->ops : m->ops;
        int rc = 0;
        if (op0 && op0->mem_info && o->group) {
            rc = m3_kv_budget_group(o->group, o->kv_dtype, o->index_dtype, o->max_num_batched_tokens, step_rows(o),
                                    o->gpu_memory_utilization, &kv_bytes, e->pool_how, sizeof e->pool_how, err);
        } else if (op0 && op0->mem_info) {
            rc = m3_kv_budget_device(m, o->kv_dtype, o->index_dtype, o->max_num_batched_tokens, step_rows(o), e->lp_dev,
                                     o->gpu_memory_utilization, &kv_bytes, e->pool_how, sizeof e->pool_how, err);
        } else {
            kv_bytes = m3_kv_budget_host(e->pool_how, sizeof e->pool_how);
            if (o->group) kv_bytes /= (size_t)m3_group_size(o->group); /* the ranks share the host */
        }
        if (!rc && ring_bytes) {
            if (kv_bytes <= ring_bytes) {
                rc = m3_errf(err, "engine: the KV budget (%.2f GiB) does not hold the DSpark draft's context rings for %d "
                                  "requests (%.2f GiB: %d positions of %d layers each); lower --max-num-seqs",
                             kv_bytes / 1073741824.0, o->max_num_seqs, ring_bytes / 1073741824.0, e->draft.cfg.window,
                             e->draft.cfg.base.n_layers);
            } else {
                kv_bytes -= ring_bytes;
                size_t l = strlen(e->pool_how);
                snprintf(e->pool_how + l, sizeof e->pool_how - l, ", less %.2f GiB for the draft's context rings",
                         ring_bytes / 1073741824.0);
            }
        }
        if (rc) { free_early(e); return NULL; }
    }
    if (pages <= 0) {
        m3_kv probe; /* one page, to learn the page size in bytes for these dtypes */
        m3_config pc = *c; /* shallow: read by m3_kv_create only */
        if (o->group) pc.n_kv_heads = m3_group_model(o->group, 0)->shard.n_kv_heads; /* kv_bytes is per rank */
        if (m3_kv_create(&probe, &pc, o->kv_dtype, o->index_dtype, e->page, 1, err)) { free_early(e); return NULL; }
        size_t pb = m3_kv_bytes_per_token(&probe) * (size_t)e->page;
        m3_kv_destroy(&probe);
        size_t n = pb ? kv_bytes / pb : 0;
        if (n < 1) {
            m3_errf(err, "engine: kv cache of %zu bytes holds no page (%zu bytes per %d-token page)", kv_bytes, pb,
                    e->page);
            free_early(e);
            return NULL;
        }
        pages = n > (1u << 30) ? (1 << 30) : (int)n;
    }
    if (o->group) { /* every rank's pool has these pages (its own KV heads); rank 0's is managed here */
        e->group = o->group;
        if (m3_group_kv_create(e->group, o->kv_dtype, o->index_dtype, e->page, pages, err)) { free_early(e); return NULL; }
        e->kv = m3_group_kv(e->group, 0);
    } else {
        m3_kv_mem mem = m3_model_kv_mem(m); /* device memory on a device backend */
        e->kv = &e->kv_own;
        if (m3_kv_create_in(e->kv, c, o->kv_dtype, o->index_dtype, e->page, pages, &mem, err)) { free_early(e); return NULL; }
    }
    int cap = pages * e->page;
    if (pages > INT32_MAX / e->page) cap = INT32_MAX;
    if (o->max_model_len > cap) {
        m3_errf(err, "engine: max_model_len %d exceeds the kv cache capacity of %d tokens", o->max_model_len, cap);
        kv_drop(e);
        free_early(e);
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
        if (!e->vision) { kv_drop(e); free_early(e); return NULL; }
    }
    /* the key of the image content hashes and cache salts: unknown outside the process, so nobody
     * can craft an image or a salt whose blocks collide with another's */
    if (getrandom(e->blk_key, sizeof e->blk_key, GRND_NONBLOCK) != (ssize_t)sizeof e->blk_key) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        e->blk_key[0] ^= (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)e;
        e->blk_key[1] ^= (uint64_t)ts.tv_sec * 0xbf58476d1ce4e5b9ull ^ (uint64_t)(uintptr_t)&ts;
    }
    e->bm = m3_blocks_create(e->kv, err);
    if (!e->bm) {
        if (e->spec) m3_dspark_free(&e->draft);
        kv_drop(e);
        free(e);
        return NULL;
    }
    e->max_rows = step_rows(o);
    size_t T = (size_t)e->max_tokens_step;
    e->running = e_calloc((size_t)e->max_seqs, sizeof *e->running);
    e->ids = e_malloc(T * sizeof *e->ids);
    e->pos = e_malloc(T * sizeof *e->pos);
    e->sq = e_malloc(T * sizeof *e->sq);
    e->rows = e_malloc((size_t)e->max_rows * sizeof *e->rows);
    e->max_plp = e->lp_dev ? e->max_tokens_step : e->max_rows;
    const size_t MR = (size_t)e->max_rows, MP = (size_t)e->max_plp;
    e->rows_alone = e_malloc(MR * sizeof *e->rows_alone);
    e->plp_out = e_malloc(MP * sizeof *e->plp_out);
    e->plp_fin = e_malloc(MP);
    e->plp_row = e_malloc(MP * sizeof *e->plp_row);
    e->plp_req = e_malloc(MP * sizeof *e->plp_req);
    int plp_ok = e->rows_alone && e->plp_out && e->plp_fin && e->plp_row && e->plp_req;
    if (e->lp_dev) {
        e->lp_rows = e_malloc(MP * sizeof *e->lp_rows);
        e->lp_tok = e_malloc(MP * sizeof *e->lp_tok);
        e->lp_n = e_malloc(MP * sizeof *e->lp_n);
        e->lp_alone = e_malloc(MP * sizeof *e->lp_alone);
        e->lp_res = e_calloc(MP, sizeof *e->lp_res); /* (a failed step's rows are read, not delivered) */
        plp_ok = plp_ok && e->lp_rows && e->lp_tok && e->lp_n && e->lp_alone && e->lp_res;
    }
    e->zeros = e_calloc(T, sizeof *e->zeros);
    e->seqs = e_calloc((size_t)e->max_seqs, sizeof *e->seqs);
    e->logits = e_malloc((size_t)e->max_rows * (size_t)e->V * sizeof(float));
    e->gn = e_malloc((size_t)e->max_rows * 3 * sizeof *e->gn);
    e->gid = e->gn ? e->gn + e->max_rows : NULL;
    e->gfin = e->gn ? e->gn + 2 * (size_t)e->max_rows : NULL;
    e->gpar = e_malloc((size_t)e->max_rows * sizeof *e->gpar);
    e->ws = m3_sample_ws_create(e->V, err);
    int spec_ok = 1;
    if (e->vision) {
        e->ov_rows = e_malloc(T * sizeof *e->ov_rows);
        e->ov_emb = e_malloc(T * (size_t)c->hidden * sizeof(float));
        spec_ok = e->ov_rows && e->ov_emb;
    }
    if (e->spec) {
        const size_t fb = T * (size_t)m3_dspark_feat_dim(&e->draft) * sizeof(float);
        m3_ops *dop = e->draft.ops;
        e->feat = e->draft_dev ? dop->alloc(dop->ctx, fb) : e_malloc(fb); /* the capture's destination */
        e->n_drows = e->max_seqs < M3_SPEC_DRAFT_BATCH ? e->max_seqs : M3_SPEC_DRAFT_BATCH;
        e->drows = e_malloc((size_t)e->n_drows * (size_t)e->V * sizeof(float));
        e->apps = e_malloc((size_t)e->max_seqs * sizeof *e->apps);
        e->app_req = e_malloc((size_t)e->max_seqs * sizeof *e->app_req);
        e->vgroups = e_malloc((size_t)e->max_seqs * sizeof *e->vgroups);
        spec_ok = spec_ok && e->feat && e->drows && e->apps && e->app_req && e->vgroups;
    }
    int mu_ok = !pthread_mutex_init(&e->mu, NULL);
    int cv_ok = mu_ok && !pthread_cond_init(&e->cv, NULL);
    if (!e->running || !e->ids || !e->pos || !e->sq || !e->rows || !e->zeros || !e->seqs || !e->logits || !e->gn || !e->gpar || !e->ws || !cv_ok ||
        !spec_ok || !plp_ok) {
        if (e->ws) m3_errf(err, "engine: out of memory");
        if (cv_ok) pthread_cond_destroy(&e->cv);
        if (mu_ok) pthread_mutex_destroy(&e->mu);
        m3_blocks_destroy(e->bm);
        kv_drop(e);
        m3_sample_ws_free(e->ws);
        free(e->running); free(e->ids); free(e->pos); free(e->sq); free(e->rows); free(e->zeros); free(e->seqs); free(e->logits); free(e->gn); free(e->gpar);
        plp_free(e);
        feat_free(e);
        free(e->drows); free(e->apps); free(e->app_req); free(e->vgroups);
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
    if (e->spec && !pbufs_alloc(e)) {
        m3_errf(err, "engine: out of memory");
        m3_engine_destroy(e);
        return NULL;
    }
    int gthreads = o->grammar_threads;
    if (gthreads == 0 && !(e->group || (e->m->ops && e->m->ops->device_memory))) gthreads = -1; /* host backend: inline */
    if (m3_engine_masks_start(e, gthreads)) {
        m3_errf(err, "engine: cannot start the token mask thread");
        m3_engine_destroy(e);
        return NULL;
    }
    const char *tp = getenv("M3_STEP_TRACE"); /* a diagnostic: where a step's time goes */
    if (tp && *tp) {
        if (!(e->trace = fopen(tp, "w"))) fprintf(stderr, "m3: M3_STEP_TRACE: cannot open '%s' (no step trace)\n", tp);
        else fprintf(e->trace, "# t_s tokens seqs prefill_tokens decode draft_ms forward_ms sample_ms step_ms\n");
        e->trace_t0 = m3_now();
    }
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
    m3_engine_masks_stop(e); /* first: it may hold running requests */
    for (int i = 0; i < e->n_running; i++) { m3_blocks_free(e->bm, &e->running[i]->bs); m3_engine_req_free(e->running[i]); }
    for (int i = 0; i < e->n_waiting; i++) { m3_blocks_free(e->bm, &e->waiting[i]->bs); m3_engine_req_free(e->waiting[i]); }
    for (req *r = e->in_head, *n; r; r = n) { n = r->next; m3_engine_req_free(r); }
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
    free(e->ids); free(e->pos); free(e->sq); free(e->rows); free(e->zeros); free(e->seqs); free(e->logits); free(e->gn); free(e->gpar);
    plp_free(e);
    feat_free(e);
    free(e->drows); free(e->apps); free(e->app_req); free(e->vgroups);
    pbufs_free(e);
    free(e->ov_rows); free(e->ov_emb);
    if (e->spec) m3_dspark_free(&e->draft);
    if (e->trace) fclose(e->trace);
    free(e);
}

m3_engine_images *m3_engine_images_create(m3_engine *e, m3_pixels *px, const int32_t *rows, int n_rows, m3_err *err) {
    return m3_images_new(e->vision, e->m->cfg.hidden, e->blk_key, px, rows, n_rows, err);
}

/* ---------------- inbox (any thread) ---------------- */

uint64_t m3_engine_add(m3_engine *e, const m3_engine_request *q, m3_err *err) {
    pthread_mutex_lock(&e->mu);
    int dead = e->dead[0] != 0;
    pthread_mutex_unlock(&e->mu);
    if (dead) { m3_errf(err, "the engine has stopped: %s", e->dead); return 0; }
    if (!q || !q->prompt || q->n_prompt < 1) { m3_errf(err, "request: empty prompt"); return 0; }
    if (q->max_tokens < 0) { m3_errf(err, "request: max_tokens %d, expected >= 0", q->max_tokens); return 0; }
    if (q->on_prompt && (q->prompt_top < 0 || q->prompt_top > M3_SAMPLE_MAX_TOP_LOGPROBS)) {
        m3_errf(err, "request: prompt_top %d, expected 0..%d", q->prompt_top, M3_SAMPLE_MAX_TOP_LOGPROBS);
        return 0;
    }
    if (q->n_stop_ids < 0 || (q->n_stop_ids && !q->stop_ids)) { m3_errf(err, "request: bad stop ids"); return 0; }
    if (q->n_prompt > e->max_len || (q->n_prompt == e->max_len && q->max_tokens > 0)) {
        m3_errf(err, "request: prompt of %d tokens %s (context limit %d tokens)", q->n_prompt,
                q->n_prompt > e->max_len ? "is longer than the context" : "leaves no room to generate", e->max_len);
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
        if (m3_images_block_keys(im, e->page, &r->extra, &r->n_extra, err)) { m3_engine_req_free(r); m3_err_prefix(err, "request"); return 0; }
    }
    if (q->cache_salt && q->cache_salt_len) { /* block 0's key takes the salt: every block after it chains on it */
        if (!r->n_extra) {
            if (!(r->extra = e_calloc(1, sizeof *r->extra))) { m3_engine_req_free(r); m3_errf(err, "request: out of memory"); return 0; }
            r->n_extra = 1;
        }
        /* a salt's own domain (the tag), never 0 (the key of a text block) */
        r->extra[0] = m3_mix64(r->extra[0] ^ m3_siphash(e->blk_key, q->cache_salt, q->cache_salt_len) ^ 0x73616c7421ull) | 1;
    }
    long lim = (long)q->n_prompt + q->max_tokens;
    r->limit = lim > e->max_len ? e->max_len : (int)lim;
    r->n_prompt = r->n_tok = q->n_prompt;
    r->max_tokens = q->max_tokens;
    r->priority = q->priority;
    r->cb = q->on_token;
    r->cb_out = q->on_output;
    r->cb_err = q->on_error;
    r->cb_admit = q->on_admit;
    r->cb_prompt = q->on_prompt;
    r->plp_top = q->prompt_top;
    r->n_text = q->sampling.n_text > 0 && q->sampling.n_text < e->V ? q->sampling.n_text : e->V;
    r->arg = q->arg;
    r->tok = e_malloc(sizeof(int32_t) * (size_t)r->limit);
    int with_eos = !q->ignore_eos && e->eos >= 0;
    r->stop = e_malloc(sizeof(int32_t) * (size_t)(q->n_stop_ids + with_eos + 1));
    if (!r->tok || !r->stop) { m3_engine_req_free(r); m3_errf(err, "request: out of memory"); return 0; }
    memcpy(r->tok, q->prompt, sizeof(int32_t) * (size_t)q->n_prompt);
    if (q->n_stop_ids) memcpy(r->stop, q->stop_ids, sizeof(int32_t) * (size_t)q->n_stop_ids);
    r->n_stop = q->n_stop_ids;
    if (with_eos) r->stop[r->n_stop++] = e->eos;
    m3_sampling sp = q->sampling;
    r->smp = m3_sampler_create(&sp, e->V, q->prompt, q->n_prompt, err);
    if (!r->smp) { m3_engine_req_free(r); m3_err_prefix(err, "request"); return 0; }
    m3_rng_seed(&r->drng, sp.seed ^ 0x64737061726b2121ull); /* the draft's own stream ("dspark!!") */
    if (q->grammar) {
        const m3_grammar_compiled *gc = m3_engine_grammar_compiled(q->grammar);
        if (m3_grammar_compiled_vocab_size(gc) != e->V) {
            m3_errf(err, "request: the grammar's vocabulary has %d ids, the model %d", m3_grammar_compiled_vocab_size(gc), e->V);
            m3_engine_req_free(r);
            return 0;
        }
        m3_engine_grammar_retain(q->grammar);
        r->gr = q->grammar;
        r->gm = m3_matcher_new(gc, err);
        r->gmask = e_malloc(sizeof(uint32_t) * (((size_t)e->V + 31) / 32));
        if (!r->gm || !r->gmask) {
            m3_engine_req_free(r);
            m3_errf(err, "request: out of memory");
            return 0;
        }
        r->g_start = q->grammar_start_id;
        r->g_open = q->grammar_start_id >= 0 ? q->grammar_open_id : -1;
        r->g_phase = r->g_start < 0 ? G_ON : r->g_open >= 0 ? G_FIRST : G_FREE;
        if ((r->g_start >= e->V) || (r->g_open >= e->V)) {
            m3_errf(err, "request: grammar start / open id out of range");
            m3_engine_req_free(r);
            return 0;
        }
    }
    pthread_mutex_lock(&e->mu);
    r->id = e->next_id++;
    if (e->in_tail) e->in_tail->next = r;
    else e->in_head = r;
    e->in_tail = r;
    e->n_in++;
    e->snap.requests_added++;
    e->snap.grammar_requests += r->gr != NULL;
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

/* adds n_req requests of n prompt tokens each (stand-in ids, shifted per request so that no two
 * share a prefix) and runs the engine until they are done; -1 + err */
static int warm_round(m3_engine *e, int n_req, long n, int32_t *ids, m3_err *err) {
    for (int r = 0; r < n_req; r++) {
        m3_stand_in_ids(ids, (int)n, e->V);
        for (long i = 0; i < n; i++) ids[i] = (int32_t)(((long long)ids[i] + (long long)r * 104729) % e->V);
        m3_engine_request rq;
        memset(&rq, 0, sizeof rq); /* greedy */
        rq.prompt = ids;
        rq.n_prompt = (int)n;
        rq.max_tokens = 3;
        rq.ignore_eos = 1;
        if (!m3_engine_add(e, &rq, err)) return -1;
    }
    for (;;) {
        const int rc = m3_engine_step(e, err);
        if (rc < 0) return -1;
        if (rc == 0 && !m3_engine_has_work(e)) return 0;
    }
}

int m3_engine_warmup(m3_engine *e, int n_tokens, m3_err *err) {
    long n = n_tokens;
    if (n > e->max_tokens_step) n = e->max_tokens_step;
    if (n > e->max_len - 3) n = e->max_len - 3;
    const long cap = (long)e->kv->n_pages * e->page - 2 * e->page; /* the pool, with room for the decodes */
    if (n > cap) n = cap;
    if (n < 1) return 0;
    /* the second round: 8 requests (at most max_num_seqs) of two steps' prompt tokens in all, so
     * that steps of several prompts, prompts beside decodes and decode batches run once */
    const int n_req = e->max_seqs < 8 ? e->max_seqs : 8;
    long n2 = 2 * n / n_req;
    if (n2 > cap / n_req - 2 * e->page) n2 = cap / n_req - 2 * e->page;
    if (n2 > e->max_len - 3) n2 = e->max_len - 3;
    int32_t *ids = malloc(sizeof *ids * (size_t)(n > n2 ? n : n2));
    if (!ids) return m3_errf(err, "warm-up: out of memory");
    int rc = warm_round(e, 1, n, ids, err);
    if (!rc && n_req > 1 && n2 >= 1) rc = warm_round(e, n_req, n2, ids, err);
    free(ids);
    if (rc) return m3_err_prefix(err, "warm-up");
    m3_blocks_reset_cache(e->bm); /* its prompt's pages leave the prefix cache */
    /* the counters as m3_engine_create left them */
    const m3_engine_stats t = e->tot;
    memset(&e->tot, 0, sizeof e->tot);
    e->tot.spec_k = t.spec_k;
    e->tot.page_tokens = t.page_tokens;
    m3_blocks_stats bs;
    m3_blocks_get_stats(e->bm, &bs); /* the pool as it is now (the gauges /metrics reads) */
    e->tot.kv_blocks_used = bs.used;
    e->tot.kv_blocks_cached = bs.cached;
    e->tot.kv_blocks_total = bs.total;
    memset(&e->last, 0, sizeof e->last);
    pthread_mutex_lock(&e->mu);
    e->snap = e->tot;
    pthread_mutex_unlock(&e->mu);
    return (int)n;
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

