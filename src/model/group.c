/* The TP group runner (see group.h): one persistent thread per rank, jobs dispatched to all. */
#include "group.h"
#include "../base/clock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct rank_t rank_t;
typedef int (*job_fn)(m3_group *g, rank_t *rk, void *arg);

struct rank_t {
    m3_group *g;
    int r;
    pthread_t th;
    int started;
    m3_ops ops;
    int ops_ok;
    m3_model m;
    int model_ok;
    m3_kv kv;
    int kv_ok;
    int index_writer;  /* the lowest rank holding its index heads writes them into the merged taps */
    m3_taps taps;      /* this step's taps */
    m3_err err;
};

struct m3_group {
    int n;
    const m3_model *full;
    m3_group_opts o;
    rank_t *ranks;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long gen;
    int pending, stop, first_fail;
    job_fn job;
    void *job_arg;
    int broken;
    char broken_msg[512];
    /* index selections of the current step, merged over ranks: [layer] -> [T][index_heads][topk] */
    int32_t **isel;
    int isel_T;
    const m3_taps *user_taps; /* the current step's */
};

static void abort_all(m3_group *g) {
    for (int r = 0; r < g->n; r++)
        if (g->o.comms[r]) m3_comm_abort(g->o.comms[r]);
}

static void *rank_main(void *a) {
    rank_t *rk = a;
    m3_group *g = rk->g;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->gen == seen && !g->stop) pthread_cond_wait(&g->go, &g->mu);
        if (g->stop) { pthread_mutex_unlock(&g->mu); break; }
        seen = g->gen;
        job_fn job = g->job;
        void *arg = g->job_arg;
        pthread_mutex_unlock(&g->mu);
        int rc = job(g, rk, arg);
        if (rc) { /* first failure: remember who, then wake the ranks waiting in collectives */
            pthread_mutex_lock(&g->mu);
            int first = g->first_fail < 0;
            if (first) g->first_fail = rk->r;
            pthread_mutex_unlock(&g->mu);
            if (first) abort_all(g);
        }
        pthread_mutex_lock(&g->mu);
        if (--g->pending == 0) pthread_cond_signal(&g->done);
        pthread_mutex_unlock(&g->mu);
    }
    return NULL;
}

/* runs job on every rank and waits; -1 + the first failing rank's message */
static int dispatch(m3_group *g, job_fn job, void *arg, m3_err *err) {
    pthread_mutex_lock(&g->mu);
    g->job = job;
    g->job_arg = arg;
    g->pending = g->n;
    g->first_fail = -1;
    g->gen++;
    pthread_cond_broadcast(&g->go);
    while (g->pending > 0) pthread_cond_wait(&g->done, &g->mu);
    int f = g->first_fail;
    pthread_mutex_unlock(&g->mu);
    if (f < 0) return 0;
    m3_errf(err, "rank %d of %d: %s", f, g->n, g->ranks[f].err.msg);
    /* collectives were aborted: a thread communicator can be reused, NCCL's cannot */
    for (int r = 0; r < g->n; r++) {
        m3_err e2;
        if (g->o.comms[r] && m3_comm_reset(g->o.comms[r], &e2) && !g->broken) {
            g->broken = 1;
            snprintf(g->broken_msg, sizeof g->broken_msg, "tensor parallel group unusable after an earlier failure (%s)",
                     e2.msg);
        }
    }
    return -1;
}

/* ------------------------------------------------------------------ jobs */

static int job_init(m3_group *g, rank_t *rk, void *arg) {
    (void)arg;
    double t0 = m3_now();
    const m3_model *full = g->full;
    m3_comm *comm = g->o.comms[rk->r];
    if (g->o.ops_init(g->o.arg, rk->r, &rk->ops, comm, &rk->err)) return -1;
    rk->ops_ok = 1;
    m3_model *m = &rk->m;
    memset(m, 0, sizeof *m);
    if (m3_shard_plan(&m->shard, &full->cfg, rk->r, g->n, g->o.moe, &rk->err)) return -1;
    if (m3_shard_weights(&full->w, &full->cfg, &m->shard, &m->w, &rk->err)) return -1;
    m->cfg = full->cfg; /* borrowed (is_view): never freed through the rank */
    m->st = full->st;
    m->ops = &rk->ops;
    m->comm = comm;
    m->is_view = 1;
    rk->model_ok = 1;
    if (g->o.weights_fill || rk->ops.weights_upload) { /* only this rank's slices travel */
        m->dw = calloc(1, sizeof *m->dw);
        if (!m->dw) return m3_errf(&rk->err, "out of memory");
        if (g->o.weights_fill ? g->o.weights_fill(g->o.arg, rk->r, &rk->ops, &m->w, m->dw, &rk->err)
                              : rk->ops.weights_upload(rk->ops.ctx, &m->w, m->dw, &rk->err)) {
            free(m->dw);
            m->dw = NULL;
            return -1;
        }
    }
    m->load_seconds = m3_now() - t0;
    return 0;
}

static int job_free(m3_group *g, rank_t *rk, void *arg) {
    (void)arg;
    if (rk->kv_ok) m3_kv_destroy(&rk->kv);
    rk->kv_ok = 0;
    if (rk->model_ok || rk->m.w.layers) m3_model_free(&rk->m);
    rk->model_ok = 0;
    if (rk->ops_ok && g->o.ops_free) g->o.ops_free(g->o.arg, rk->r, &rk->ops);
    rk->ops_ok = 0;
    return 0;
}

typedef struct { m3_kv_dtype dt, idt; int page, n_pages; } kv_args;

static int job_kv(m3_group *g, rank_t *rk, void *arg) {
    kv_args *a = arg;
    if (rk->kv_ok) m3_kv_destroy(&rk->kv);
    rk->kv_ok = 0;
    m3_config c = g->full->cfg; /* shallow: only read by m3_kv_create_in */
    c.n_kv_heads = rk->m.shard.n_kv_heads;
    m3_kv_mem mem = m3_model_kv_mem(&rk->m);
    if (m3_kv_create_in(&rk->kv, &c, a->dt, a->idt, a->page, a->n_pages, &mem, &rk->err)) return -1;
    rk->kv_ok = 1;
    return 0;
}

typedef struct {
    const m3_batch *b;
    const int32_t *ids;
    const m3_embed_override *ov;
    const int *out_rows;
    int n_out;
    float *logits;
} fwd_args;

static int job_forward(m3_group *g, rank_t *rk, void *arg) {
    (void)g;
    fwd_args *a = arg;
    if (!rk->kv_ok) return m3_errf(&rk->err, "no KV cache on this rank (m3_group_kv_create failed or was not called)");
    const m3_taps *t = rk->taps.hidden || rk->taps.index || rk->taps.capture ? &rk->taps : NULL;
    return m3_forward_ex(&rk->m, &rk->kv, a->b, a->ids, a->ov, a->out_rows, a->n_out, rk->r == 0 ? a->logits : NULL, t,
                         &rk->err);
}

typedef struct {
    int (*fn)(void *arg, int rank, m3_model *m, m3_kv *kv, m3_err *err);
    void *arg;
} run_args;

static int job_run(m3_group *g, rank_t *rk, void *arg) {
    (void)g;
    run_args *a = arg;
    return a->fn(a->arg, rk->r, &rk->m, rk->kv_ok ? &rk->kv : NULL, &rk->err);
}

/* ------------------------------------------------------------------ API */

static void stop_threads(m3_group *g) {
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    for (int r = 0; r < g->n; r++)
        if (g->ranks[r].started) pthread_join(g->ranks[r].th, NULL);
}

m3_group *m3_group_create(const m3_model *full, const m3_group_opts *o, m3_err *err) {
    if (!o || o->size < 1 || !o->comms || !o->ops_init) {
        m3_errf(err, "tensor parallel group: need a size >= 1, communicator handles and an ops_init");
        return NULL;
    }
    for (int r = 0; r < o->size; r++)
        if (!o->comms[r] || o->comms[r]->rank != r || o->comms[r]->size != o->size) {
            m3_errf(err, "tensor parallel group: communicator handle %d is not rank %d of %d", r, r, o->size);
            return NULL;
        }
    /* every rank's plan and views first, here: a shape that does not split is reported once,
     * for the lowest rank it fails on, before any backend starts */
    for (int r = 0; r < o->size; r++) {
        m3_shard s;
        m3_weights v;
        if (m3_shard_plan(&s, &full->cfg, r, o->size, o->moe, err) || m3_shard_weights(&full->w, &full->cfg, &s, &v, err))
            return NULL;
        m3_shard_weights_free(&v);
    }
    m3_group *g = calloc(1, sizeof *g);
    if (!g) { m3_errf(err, "out of memory"); return NULL; }
    g->n = o->size;
    g->full = full;
    g->o = *o;
    g->first_fail = -1;
    g->ranks = calloc((size_t)g->n, sizeof *g->ranks);
    g->isel = calloc((size_t)full->cfg.n_layers, sizeof *g->isel);
    if (!g->ranks || !g->isel) { free(g->ranks); free(g->isel); free(g); m3_errf(err, "out of memory"); return NULL; }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->done, NULL);
    for (int r = 0; r < g->n; r++) {
        rank_t *rk = &g->ranks[r];
        rk->g = g;
        rk->r = r;
        if (pthread_create(&rk->th, NULL, rank_main, rk) != 0) {
            m3_errf(err, "tensor parallel group: cannot start the thread of rank %d", r);
            m3_group_free(g);
            return NULL;
        }
        rk->started = 1;
    }
    if (dispatch(g, job_init, NULL, err)) {
        m3_group_free(g);
        return NULL;
    }
    for (int r = 0; r < g->n; r++) {
        const m3_shard *s = &g->ranks[r].m.shard;
        g->ranks[r].index_writer = r == 0 || g->ranks[r - 1].m.shard.index_head0 != s->index_head0;
    }
    return g;
}

void m3_group_free(m3_group *g) {
    if (!g) return;
    m3_err e;
    int all = 1;
    for (int r = 0; r < g->n; r++) all &= g->ranks[r].started;
    if (all) dispatch(g, job_free, NULL, &e); /* else no job ever ran: nothing to free on the ranks */
    stop_threads(g);
    for (int l = 0; l < g->full->cfg.n_layers; l++) free(g->isel[l]);
    free(g->isel);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->go);
    pthread_cond_destroy(&g->done);
    free(g->ranks);
    free(g);
}

int m3_group_size(const m3_group *g) { return g->n; }
m3_model *m3_group_model(m3_group *g, int rank) { return rank >= 0 && rank < g->n ? &g->ranks[rank].m : NULL; }
m3_kv *m3_group_kv(m3_group *g, int rank) {
    return rank >= 0 && rank < g->n && g->ranks[rank].kv_ok ? &g->ranks[rank].kv : NULL;
}

int m3_group_kv_create(m3_group *g, m3_kv_dtype dt, m3_kv_dtype idt, int page_tokens, int n_pages, m3_err *err) {
    kv_args a = {dt, idt, page_tokens, n_pages};
    return dispatch(g, job_kv, &a, err);
}

int m3_group_run(m3_group *g, int (*fn)(void *arg, int rank, m3_model *m, m3_kv *kv, m3_err *err), void *arg,
                 m3_err *err) {
    run_args a = {fn, arg};
    return dispatch(g, job_run, &a, err);
}

/* rank 0's hidden / capture taps: the caller's */
static void tap0_hidden(void *arg, int layer, const float *h, int T, int H) {
    const m3_taps *u = ((rank_t *)arg)->g->user_taps;
    u->hidden(u->arg, layer, h, T, H);
}
static void tap0_capture(void *arg, int layer, const float *h, int T, int H) {
    const m3_taps *u = ((rank_t *)arg)->g->user_taps;
    u->capture(u->arg, layer, h, T, H);
}

/* per-rank index tap: the rank's heads go to their place in the merged selection */
static void rank_index_tap(void *arg, int layer, const int32_t *sel, int T, int ni, int topk) {
    rank_t *rk = arg;
    m3_group *g = rk->g;
    int32_t *dst = g->isel[layer];
    const int nall = g->full->cfg.index_heads, h0 = rk->m.shard.index_head0;
    if (!dst || T != g->isel_T) return;
    for (int t = 0; t < T; t++)
        memcpy(dst + ((size_t)t * nall + h0) * topk, sel + (size_t)t * ni * topk, sizeof(int32_t) * (size_t)ni * topk);
}

int m3_group_forward_ex(m3_group *g, const m3_batch *b, const int32_t *ids, const m3_embed_override *ov,
                        const int *out_rows, int n_out, float *logits, const m3_taps *taps, m3_err *err) {
    const m3_config *c = &g->full->cfg;
    if (g->broken) return m3_errf(err, "%s", g->broken_msg);
    /* every rank would have to overwrite its copy of the stream at once: not built */
    if (taps && taps->stream) return m3_errf(err, "tensor parallel group: teacher forcing (a stream tap) is not supported");
    if (taps && taps->n_lp)
        return m3_errf(err, "tensor parallel group: prompt logprob rows reduced where the logits are (their logits come back whole)");
    m3_kv *kv0 = m3_group_kv(g, 0);
    if (!kv0) return m3_errf(err, "tensor parallel group: no KV cache (m3_group_kv_create first)");
    const int T = b->T;
    if (T <= 0) return 0;
    for (int t = 0; t < T; t++) { /* as m3_forward checks, before pages are taken */
        if (ids[t] < 0 || ids[t] >= c->vocab)
            return m3_errf(err, "token id %d at index %d is out of range (vocab %d)", ids[t], t, c->vocab);
        if (b->pos[t] < 0) return m3_errf(err, "negative position %d at index %d", b->pos[t], t);
    }
    for (int t = 0; t < T; t++) /* one page table per sequence, valid in every rank's pool */
        if (m3_kv_seq_reserve(kv0, b->seqs[b->seq[t]], b->pos[t] + 1, err)) return -1;
    const int want_index = taps && taps->index && c->n_sparse_layers;
    if (want_index) {
        size_t n = (size_t)T * c->index_heads * c->topk_blocks;
        for (int l = 0; l < c->n_layers; l++) {
            if (!c->layer_sparse[l]) continue;
            free(g->isel[l]);
            g->isel[l] = malloc(sizeof(int32_t) * n);
            if (!g->isel[l]) return m3_errf(err, "out of memory for the index selections of %d tokens", T);
        }
        g->isel_T = T;
    }
    g->user_taps = taps;
    for (int r = 0; r < g->n; r++) { /* every rank's taps carry the rank (arg) */
        rank_t *rk = &g->ranks[r];
        memset(&rk->taps, 0, sizeof rk->taps);
        rk->taps.arg = rk;
        if (r == 0 && taps) { /* the residual stream is whole on every rank: rank 0's */
            rk->taps.hidden = taps->hidden ? tap0_hidden : NULL;
            rk->taps.capture = taps->capture ? tap0_capture : NULL;
            rk->taps.capture_layers = taps->capture_layers;
        }
        if (want_index && rk->index_writer) rk->taps.index = rank_index_tap;
    }
    fwd_args a = {b, ids, ov, out_rows, n_out, logits};
    if (dispatch(g, job_forward, &a, err)) return -1;
    for (int t = 0; t < T; t++) { /* what m3_forward does at TP1 */
        int s = b->seq[t];
        if (b->seqs[s]->len < b->pos[t] + 1) b->seqs[s]->len = b->pos[t] + 1;
    }
    if (want_index)
        for (int l = 0; l < c->n_layers; l++)
            if (c->layer_sparse[l] && g->isel[l]) taps->index(taps->arg, l, g->isel[l], T, c->index_heads, c->topk_blocks);
    return 0;
}

int m3_group_forward(m3_group *g, const m3_batch *b, const int32_t *ids, const int *out_rows, int n_out, float *logits,
                     const m3_taps *taps, m3_err *err) {
    return m3_group_forward_ex(g, b, ids, NULL, out_rows, n_out, logits, taps, err);
}
