/* The engine thread: inbox -> scheduler (continuous batching, chunked prefill, preemption) ->
 * one m3_forward per step -> per-request samplers -> callbacks; a failed step's requests
 * run again alone (see engine.h). */
#include "engine_int.h"
#include "../base/clock.h"

/* ---------------- engine thread ---------------- */

static void emit(req *r, const m3_sample_out *so, int reason) {
    int fin = reason != M3_FINISH_NONE;
    if (reason == M3_FINISH_ERROR && r->cb_err) r->cb_err(r->arg, r->id, r->why ? r->why : "the engine failed");
    if (r->cb_out) r->cb_out(r->arg, r->id, so, fin, reason);
    else if (r->cb) r->cb(r->arg, r->id, so ? so->token : -1, so ? so->logprob : 0.0f, fin, reason);
}

/* ends r (which holds no place in running / waiting any more): frees its blocks, calls back */
static void finish(m3_engine *e, req *r, int reason) {
    if (r->gr) m3_engine_masks_wait(e); /* the mask thread may be computing its mask */
    m3_blocks_free(e->bm, &r->bs);
    e->tot.requests_finished[reason]++;
    emit(r, NULL, reason);
    m3_engine_req_free(r);
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

/* under the priority policy: a is served after b (a larger priority value, or as large and later) */
static int later(const req *a, const req *b) { return a->priority > b->priority || (a->priority == b->priority && a->id > b->id); }

/* Queues r: last (or at_head: first, a preempted request) under FCFS; by (priority, arrival)
 * under the priority policy. */
static int waiting_push(m3_engine *e, req *r, int at_head) {
    if (e->n_waiting == e->cap_waiting) {
        int nc = e->cap_waiting ? 2 * e->cap_waiting : 16;
        req **p = e_realloc(e->waiting, sizeof *p * (size_t)nc);
        if (!p) return -1;
        e->waiting = p;
        e->cap_waiting = nc;
    }
    if (e->prio) { /* by (priority, arrival): after the last that comes before it (from the tail: a new one is usually last) */
        int j = e->n_waiting;
        while (j > 0 && later(e->waiting[j - 1], r)) j--;
        memmove(e->waiting + j + 1, e->waiting + j, sizeof *e->waiting * (size_t)(e->n_waiting - j));
        e->waiting[j] = r;
    } else if (at_head) {
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

/* Moves a running sequence back to the waiting queue (its head under FCFS), freeing its blocks;
 * gives back the budget and logits rows it had been given this step. The victim: the most
 * recently admitted, or under the priority policy the one served last (largest (priority,
 * arrival)). *cur, the caller's index into running, follows the removal. */
static req *preempt_one(m3_engine *e, int *budget, int *rows, int *cur) {
    int j = e->n_running - 1;
    for (int i = 0; e->prio && i < e->n_running; i++)
        if (later(e->running[i], e->running[j])) j = i;
    req *v = e->running[j];
    running_remove(e, j);
    if (j <= *cur) (*cur)--; /* (the victim itself: the loop's next index is the one after it) */
    *budget += v->n_sched;
    *rows += v->rows_sched;
    v->n_sched = 0;
    v->rows_sched = 0;
    v->decode = 0;
    v->k_sched = 0;
    m3_blocks_free(e->bm, &v->bs);
    v->n_done = 0;
    e->tot.preemptions++;
    e->last.n_preempted++;
    if (waiting_push(e, v, 1)) fail(e, v, OOM);
    return v;
}

/* The prompt positions of r's next n tokens whose logprobs are due ([*lo, *lo + return)): from
 * plp_next (earlier ones were reported) to n_prompt - 1 (the last position's row samples). */
static int plp_span(const req *r, int n, int *lo) {
    *lo = r->n_done;
    if (!r->cb_prompt) return 0;
    int a = r->n_done > r->plp_next ? r->n_done : r->plp_next, b = r->n_done + n < r->n_prompt - 1 ? r->n_done + n : r->n_prompt - 1;
    *lo = a;
    return b > a ? b - a : 0;
}

/* the logits rows r asks for when n of its tokens run from n_done (not a speculative decode):
 * its prompt rows (unless the backend reduces them: lp_dev), and the row that samples when the
 * chunk completes its pending tokens */
static int rows_of(const m3_engine *e, const req *r, int n) {
    int lo;
    return (e->lp_dev ? 0 : plp_span(r, n, &lo)) + (r->n_done + n == r->n_tok && r->max_tokens > 0);
}

/* the longest chunk of at most n tokens whose rows fit in `rows` (rows_of grows with n) */
static int fit_rows(const m3_engine *e, const req *r, int n, int rows) {
    if (rows_of(e, r, n) <= rows) return n;
    int lo = 0, hi = n; /* rows_of(lo) <= rows < rows_of(hi) */
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (rows_of(e, r, mid) <= rows) lo = mid;
        else hi = mid;
    }
    return lo;
}

static void schedule(m3_engine *e) {
    int budget = e->max_tokens_step;
    /* logits rows: one a sequence (k + 1 with drafts) never runs out; prompt logprobs' rows take
     * what is left, in chunks */
    int rows_left = e->max_rows;
    m3_err e2;
    for (int i = 0; i < e->n_running; i++)
        e->running[i]->n_sched = e->running[i]->decode = e->running[i]->k_sched = e->running[i]->rows_sched = 0;
    /* disable_by_batch_size: past it a step decodes without drafts (verification stops paying
     * when the batch alone fills the GPU); the draft's context still takes every committed row */
    const int drafts = !e->spec_off_bs || e->n_running <= e->spec_off_bs;
    /* 1: decodes (one pending token), 2: sequences still prefilling, oldest first */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < e->n_running && budget > 0; i++) {
            req *r = e->running[i];
            int rem = r->n_tok - r->n_done;
            if (r->n_sched || (pass == 0) != (rem == 1)) continue;
            int n = rem < budget ? rem : budget, k = 0;
            const int spec_decode = pass == 0 && e->spec && !r->gr; /* (never constrained ones) */
            if (spec_decode && drafts) { /* a speculative decode: the anchor + k drafts */
                k = e->k;
                if (e->spec_max_len && r->n_tok + k > e->spec_max_len) k = 0; /* past the draft's max_model_len */
                if (k > r->limit - r->n_tok - 1) k = r->limit - r->n_tok - 1; /* room to emit k + 1 */
                if (k > budget - 1) k = budget - 1;
                if (k > rows_left - 1) k = rows_left - 1;
                if (k < 0) k = 0;
                n = 1 + k;
            }
            int nrows = spec_decode ? n : 0;
            if (!spec_decode) {
                n = fit_rows(e, r, n, rows_left);
                nrows = rows_of(e, r, n);
            }
            if (n < 1 || nrows > rows_left) continue; /* its rows next step */
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
                req *v = preempt_one(e, &budget, &rows_left, &i);
                if (v == r) { ok = 0; break; }
            }
            if (!ok) continue;
            r->n_sched = n;
            r->decode = pass == 0;
            r->k_sched = k;
            r->rows_sched = nrows;
            budget -= n;
            rows_left -= nrows;
            if (spec_decode && !drafts) e->tot.spec_off_batch++;
        }
    }
    /* 3: admit waiting requests, FCFS, unless someone was just preempted */
    while (!e->last.n_preempted && e->n_waiting > 0 && budget > 0 && e->n_running < e->max_seqs) {
        req *r = e->waiting[0];
        int hit = 0;
        long n_look = 0; /* prompt tokens looked up in the prefix cache */
        if (e->prefix) {
            /* with a draft, the last `window` positions are recomputed: their hidden rows feed
             * the draft context (admit reuses at most n_look - 1 tokens) */
            n_look = r->n_tok;
            if (e->spec) n_look = (long)r->n_tok - e->draft.cfg.window + 1 > 1 ? (long)r->n_tok - e->draft.cfg.window + 1 : 1;
            /* prompt logprobs still due: their positions are computed (a hit ends at plp_next) */
            if (r->cb_prompt && r->plp_next < r->n_prompt - 1 && n_look > r->plp_next + 1) n_look = r->plp_next + 1 > 1 ? r->plp_next + 1 : 0;
            if (n_look > 0) hit = m3_blocks_admit(e->bm, &r->bs, r->tok, (int)n_look, r->extra, r->n_extra, &e2);
            if (hit < 0) { waiting_remove(e, 0); fail(e, r, OOM); continue; }
        }
        r->n_done = hit;
        if (e->spec) m3_dspark_ctx_reset(&r->dctx, hit);
        int rem = r->n_tok - hit;
        int n = fit_rows(e, r, rem < budget ? rem : budget, rows_left);
        if (n < 1) { /* no rows left for its first chunk: it waits (FCFS) */
            m3_blocks_free(e->bm, &r->bs);
            r->n_done = 0;
            break;
        }
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
        r->rows_sched = rows_of(e, r, n);
        budget -= n;
        rows_left -= r->rows_sched;
        e->tot.prefix_hit_tokens += (uint64_t)hit; /* both counted once a request is admitted (not each wait) */
        e->tot.prefix_query_tokens += (uint64_t)n_look;
        if (!r->admitted && r->cb_admit) r->cb_admit(r->arg, r->id, hit);
        r->admitted = 1;
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
    uint64_t added = e->snap.requests_added, gadded = e->snap.grammar_requests; /* counted at add time, under the lock */
    e->snap = e->tot;
    e->snap.requests_added = added;
    e->snap.grammar_requests = gadded;
    e->active = e->n_running + e->n_waiting;
    pthread_mutex_unlock(&e->mu);
}

/* m3_taps.capture: the step's rows of one target layer the draft reads (h on the host, or
 * with the draft on the device, in device memory: one 2D copy there, recorded with the step) */
static void on_capture(void *arg, int layer, const float *h, int T, int H) {
    m3_engine *e = arg;
    int slot = m3_dspark_feat_slot(&e->draft, layer), F = m3_dspark_feat_dim(&e->draft);
    if (slot < 0) return;
    float *dst = e->feat + (size_t)e->cap_row0 * F + (size_t)slot * H;
    if (e->draft_dev) {
        const m3_ops *op = e->draft.ops;
        op->copy_rows(op, dst, sizeof(float) * (size_t)F, h, sizeof(float) * (size_t)H, sizeof(float) * (size_t)H, (size_t)T);
        return;
    }
    for (int t = 0; t < T; t++) memcpy(dst + (size_t)t * F, h + (size_t)t * H, sizeof(float) * H);
}

/* the step's taps: the draft's capture (rows from cap_row0 on) */
static m3_taps capture_taps(m3_engine *e) {
    m3_taps t = {.arg = e, .capture_layers = e->draft.capture, .capture = on_capture, .capture_dev = e->draft_dev};
    /* a recorded step's copies write where this one's do */
    t.graph_key = (uint64_t)(uintptr_t)(e->feat + (size_t)e->cap_row0 * m3_dspark_feat_dim(&e->draft));
    return t;
}

/* 1 when r's rows (its draw, or its k_sched drafts' verification: path its drafts, NULL before
 * they are drawn) are drawn where the logits are (a plain sampled request without logprobs, on
 * a backend that draws: then e->m->ops is that backend's), with the parameters in *dp (its .u
 * not set) */
static int drawn_on_backend(const m3_engine *e, const req *r, const int32_t *path, m3_draw_param *dp) {
    return e->draw_dev && !r->gr &&
           m3_sampler_draw_ids(r->smp, path, r->k_sched, &dp->temperature, &dp->top_k, &dp->top_p, &dp->min_p, &dp->n);
}

/* Draws the drafts of every speculative decode of this step, up to M3_SPEC_DRAFT_BATCH
 * requests in one pass of the draft; a request whose draft fails ends with an error. */
static void draft_all(m3_engine *e) {
    req *batch[M3_SPEC_DRAFT_BATCH];
    m3_spec_draft_req rq[M3_SPEC_DRAFT_BATCH];
    int i = 0, qslot = 0, qdslot = 0;
    while (i < e->n_running) {
        int n = 0;
        for (; i < e->n_running && n < e->n_drows; i++) {
            req *r = e->running[i];
            if (!r->n_sched || !r->k_sched) continue;
            r->qv = r->qd = NULL;
            r->q_dev_used = 0;
            if (!m3_sampler_is_greedy(r->smp) && e->draft_method == M3_SPEC_DRAFT_PROBABILISTIC) {
                m3_draw_param dp;
                /* a request the target verifies on the backend: its q rows stay there */
                if (qdslot < e->qdev_n && drawn_on_backend(e, r, NULL, &dp))
                    r->qd = e->qdev + (size_t)qdslot++ * e->k * (size_t)e->V;
                if (!r->qd) { /* its q rows to the host (with a device slot: only if its verification falls back, q_to_host) */
                    if (qslot < e->qstage_n) r->qv = e->qstage + (size_t)qslot++ * e->k * (size_t)e->V;
                    else if (!r->q && !(r->q = e_malloc(sizeof(float) * (size_t)e->k * (size_t)e->V))) {
                        running_remove(e, i--);
                        fail(e, r, "drafting failed");
                        continue;
                    } else r->qv = r->q;
                }
            }
            batch[n] = r;
            /* always all k slots, so the drafts do not depend on how many get verified */
            rq[n] = (m3_spec_draft_req){&r->dctx, r->smp, &r->drng, r->tok[r->n_tok - 1], r->n_done, r->draft, r->qv,
                                        e->conf_thr > 0 ? r->conf : NULL, 0, 0, r->qd, 0};
            n++;
        }
        if (!n) continue;
        m3_err e2;
        int rc = m3_spec_draft_n(&e->draft, rq, n, e->ws, e->draft_method, e->k, e->drows, &e2);
        for (int j = 0; j < n; j++) {
            req *r = batch[j];
            if (rc || rq[j].failed) {
                for (int x = 0; x < e->n_running; x++)
                    if (e->running[x] == r) {
                        running_remove(e, x);
                        if (x < i) i--;
                        break;
                    }
                fail(e, r, "drafting failed");
                continue;
            }
            r->q_used = rq[j].q_used;
            r->q_dev_used = rq[j].q_dev_used;
            if (e->conf_thr > 0) { /* verify the leading drafts the confidence head trusts (0: a plain decode) */
                int m = 0;
                while (m < r->k_sched && r->conf[m] >= e->conf_thr) m++;
                e->tot.spec_conf_skipped += (uint64_t)(r->k_sched - m);
                r->k_sched = m;
                r->n_sched = 1 + m;
            }
            if (e->draft_hook && m3_sampler_is_greedy(r->smp))
                e->draft_hook(e->draft_hook_arg, r->id, r->tok, r->n_tok, r->draft, e->k);
        }
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

/* Requests whose drafts' q rows are on the backend but whose rows came back whole (the verify
 * on the backend was not taken, or the step failed and ran again request by request): the q
 * rows to the host staging for m3_spec_verify. */
static void q_to_host(m3_engine *e) {
    for (int i = 0; i < e->n_running; i++) {
        req *r = e->running[i];
        if (!r->n_sched || !r->k_sched || !r->q_dev_used || r->gdev || r->fwd_failed) continue;
        if (!r->qv && !r->q && !(r->q = e_malloc(sizeof(float) * (size_t)e->k * (size_t)e->V))) {
            snprintf(r->why_buf, sizeof r->why_buf, "speculative verification failed: out of memory for its draft distributions");
            r->fwd_failed = 1; /* ends with the error in the serial pass, as a failed forward does */
            continue;
        }
        if (!r->qv) r->qv = r->q;
        const m3_ops *op = e->draft.ops;
        op->download(op->ctx, r->qv, r->qd, sizeof(float) * (size_t)r->k_sched * (size_t)e->V);
        r->q_dev_used = 0;
    }
}

/* One request of sample_rows: its rows' finiteness, then (finite) its draw, or with drafts
 * (k_sched > 0) their verification (the emitted tokens in r->sres; the serial pass delivers them). */
static void sample_one(m3_engine *e, req *r, m3_sample_ws *ws, float *p) {
    const float *lg = e->logits + (size_t)r->out_idx * e->V;
    m3_err e2;
    if (r->gdev) { /* its rows came back as their argmax (or draw) and finite flag (m3_taps.greedy_n) */
        r->so_finite = 1;
        for (int j = 0; j <= r->k_sched; j++) r->so_finite &= e->gfin[r->out_idx + j] != 0;
        r->so_rc = 0;
        if (!r->so_finite) return;
        const int32_t *ids = e->gid + r->out_idx;
        if (r->k_sched) {
            const int max_emit = r->max_tokens - r->n_gen < r->limit - r->n_tok ? r->max_tokens - r->n_gen : r->limit - r->n_tok;
            if (r->vdev) { /* verified on the backend: the uniforms it took (ops verify_rows), then emitted alike */
                int a = 0;
                while (a < r->k_sched && ids[a] == r->draft[a]) a++;
                m3_sampler_skip_uniforms(r->smp, a < r->k_sched ? a + 2 : r->k_sched + 1);
            }
            r->sres_rc = m3_spec_verify_ids(r->smp, ids, r->draft, r->k_sched, r->stop, r->n_stop, max_emit, &r->sres, &e2);
            if (r->sres_rc) snprintf(r->why_buf, sizeof r->why_buf, "speculative verification failed: %s", e2.msg);
            return;
        }
        memset(&r->so, 0, sizeof r->so); /* m3_sampler_sample's output for such a row */
        r->so.token = ids[0];
        return;
    }
    r->so_finite = logits_finite(lg, (size_t)e->V * (size_t)(1 + r->k_sched));
    r->so_rc = 0;
    if (!r->so_finite) return;
    if (r->k_sched) {
        const int max_emit = r->max_tokens - r->n_gen < r->limit - r->n_tok ? r->max_tokens - r->n_gen : r->limit - r->n_tok;
        r->sres_rc = m3_spec_verify(r->smp, ws, p, lg, r->draft, r->q_used ? r->qv : NULL, r->k_sched, r->stop, r->n_stop,
                                    max_emit, &r->sres, &e2);
        if (r->sres_rc) snprintf(r->why_buf, sizeof r->why_buf, "speculative verification failed: %s", e2.msg);
        return;
    }
    if (r->gr && m3_engine_mask_row(e, r)) { /* a constrained row: its grammar's mask */
        r->so_rc = -1;
        snprintf(r->why_buf, sizeof r->why_buf, "sampling: out of memory for the grammar's token mask");
        return;
    }
    r->so_rc = m3_sampler_sample(r->smp, lg, ws, &r->so, &e2);
    if (r->so_rc) snprintf(r->why_buf, sizeof r->why_buf, "%s", e2.msg); /* "sampling: ..." (e.g. every token masked) */
    if (r->gr) m3_sampler_set_mask(r->smp, NULL);
}

static void sample_range(void *ctx, size_t begin, size_t end, int worker) {
    m3_engine *e = ctx;
    for (size_t i = begin; i < end; i++) sample_one(e, e->to_sample[i], e->wss[worker], e->pbufs ? e->pbufs[worker] : NULL);
}

/* The samples and speculative verifications of a step, before the serial pass that delivers
 * them in order: spread over the sampling threads when there are several. Each reads only its
 * request's logits rows, drafts and sampler (its RNG and counts): the same tokens as one after
 * the other. (64 speculative streams of 8 rows each: 512 rows of 200,064 logits a step, which
 * the engine thread checked and verified alone.) */
static void sample_rows(m3_engine *e, int nr) {
    int n = 0;
    for (int i = 0; i < nr; i++) {
        req *r = e->running[i];
        if (!r->n_sched || r->out_idx < 0 || r->fwd_failed) continue;
        if (e->spool) e->to_sample[n++] = r; /* at most n_running <= max_seqs */
        else sample_one(e, r, e->ws, e->pbufs ? e->pbufs[0] : NULL);
    }
    if (n == 1) sample_one(e, e->to_sample[0], e->ws, e->pbufs ? e->pbufs[0] : NULL);
    else if (n > 1) {
        m3_sample_ws_set_pool(e->ws, NULL); /* worker 0's workspace: no loop inside the pool's own loop */
        m3_pool_for(e->spool, (size_t)n, 1, sample_range, e);
        m3_sample_ws_set_pool(e->ws, e->spool);
        e->tot.tokens_sampled_parallel += (uint64_t)n;
    }
}

/* prompt logprobs: row j of the step's prompt rows (its finiteness, then its log-softmax): from
 * the backend's answer (lp_dev), or from its logits row */
static void prompt_row(m3_engine *e, int j) {
    const req *r = e->plp_req[j];
    if (e->lp_dev) {
        const m3_row_lp *lp = &e->lp_res[j];
        m3_sample_out *so = &e->plp_out[j];
        e->plp_fin[j] = (unsigned char)(lp->fin != 0);
        memset(so, 0, sizeof *so);
        so->token = e->lp_tok[j];
        if (lp->fin) m3_sample_from_row_lp(lp, r->plp_top, so);
        return;
    }
    const int o = e->plp_row[j];
    const float *lg = e->logits + (size_t)o * e->V;
    e->plp_fin[j] = (unsigned char)logits_finite(lg, (size_t)e->V);
    /* the row of position p gives prompt[p + 1]: p = its row in the batch less the request's first, plus n_done */
    const int p = e->rows[o] - r->row0 + r->n_done;
    if (e->plp_fin[j]) m3_logprobs_row(lg, r->n_text, r->tok[p + 1], r->plp_top, &e->plp_out[j]);
}

static void prompt_range(void *ctx, size_t begin, size_t end, int worker) {
    (void)worker;
    for (size_t j = begin; j < end; j++) prompt_row(ctx, (int)j);
}

/* The step's prompt rows, over the sampling threads when there are several (a row reads only
 * its logits: the same values in any order). */
static void prompt_rows(m3_engine *e) {
    if (e->spool && e->n_plp > 1 && !e->lp_dev) m3_pool_for(e->spool, (size_t)e->n_plp, 1, prompt_range, e);
    else
        for (int j = 0; j < e->n_plp; j++) prompt_row(e, j);
}

/* Reports r's prompt logprobs of this step (the positions after plp_next, in order); 0, or -1
 * when a row is not finite (nothing reported then). */
static int deliver_prompt(m3_engine *e, req *r) {
    for (int j = 0; j < r->plp_n; j++)
        if (!e->plp_fin[r->plp_j0 + j]) return -1;
    int lo;
    plp_span(r, r->n_sched, &lo);
    for (int j = 0; j < r->plp_n; j++) r->cb_prompt(r->arg, r->id, lo + j + 1, &e->plp_out[r->plp_j0 + j]);
    r->plp_next = lo + r->plp_n;
    e->tot.prompt_logprobs += (uint64_t)r->plp_n;
    return 0;
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

/* taps asks for n prompt rows (batch rows `rows`) whose answers go to the step's prompt rows j0.. */
static void lp_taps(m3_engine *e, m3_taps *t, const int32_t *rows, int j0, int n) {
    t->lp_rows = rows;
    t->lp_tok = e->lp_tok + j0;
    t->lp_n = e->lp_n + j0;
    t->n_lp = n;
    t->lp_k = e->lp_k;
    t->lp_out = e->lp_res + j0;
}

/* Runs request r's rows of this step alone (the step's arrays, r's slice of them). */
static int forward_alone(m3_engine *e, req *r, m3_err *err) {
    const int si = e->sq[r->row0], n = r->n_sched;
    int *rows = e->rows_alone, n_out = 0, first = r->out_idx; /* its rows as the step asked for them */
    if (r->plp_n && !e->lp_dev) {
        first = r->plp_idx; /* its prompt rows, then its sampling row: contiguous */
        for (int j = 0; j < r->plp_n; j++) rows[n_out++] = e->rows[r->plp_idx + j] - r->row0;
    }
    if (r->out_idx >= 0) {
        if (r->k_sched) for (int j = 0; j <= r->k_sched; j++) rows[n_out++] = j;
        else rows[n_out++] = n - 1;
    }
    int32_t ovr[64];
    int n_ov = r->n_ov <= 64 ? r->n_ov : 0, rc = 0;
    for (int k = 0; k < n_ov; k++) ovr[k] = e->ov_rows[r->ov0 + k] - r->row0;
    m3_batch b = {n, e->pos + r->row0, e->zeros, &e->seqs[si]};
    m3_embed_override ov = {n_ov, ovr, n_ov ? e->ov_emb + (size_t)r->ov0 * e->m->cfg.hidden : NULL};
    float *lg = n_out ? e->logits + (size_t)first * e->V : NULL;
    if (r->n_ov > 64) return m3_errf(err, "%d image rows in one chunk (a retry alone takes 64)", r->n_ov);
    e->cap_row0 = r->row0;
    m3_taps taps = e->spec ? capture_taps(e) : (m3_taps){0};
    const int lp = e->lp_dev && r->plp_n > 0; /* its prompt rows, reduced as the step asked */
    if (lp) {
        for (int j = 0; j < r->plp_n; j++) e->lp_alone[j] = e->lp_rows[r->plp_j0 + j] - r->row0;
        lp_taps(e, &taps, e->lp_alone, r->plp_j0, r->plp_n);
    }
    const m3_taps *tp = e->spec || lp ? &taps : NULL;
    rc = e->group ? m3_group_forward_ex(e->group, &b, e->ids + r->row0, n_ov ? &ov : NULL, rows, n_out, lg, tp, err)
                  : m3_forward_ex(e->m, e->kv, &b, e->ids + r->row0, n_ov ? &ov : NULL, rows, n_out, lg, tp, err);
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
    const double t_begin = e->trace ? m3_now() : 0;
    double t_draft = 0, t_fwd = 0, t_sample = 0;
    drain(e);
    schedule(e);
    if (e->spec) draft_all(e);
    if (e->trace) t_draft = m3_now();
    if (e->vision) encode_images(e);
    const int H = e->m->cfg.hidden;
    int step_rc = 0; /* -1: the forward failed, some requests may have gone on (step_failed) */
    int n_ov = 0; /* batch rows whose embeddings are image embeddings */
    const int F = e->spec ? m3_dspark_feat_dim(&e->draft) : 0;
    int T = 0, ns = 0, n_out = 0, n_greedy = 0, n_vg = 0;
    e->n_plp = 0;
    e->lp_k = 0;
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
        r->plp_n = 0;
        r->gdev = 0;
        /* rows whose draw is their argmax alone come back as ids (m3_taps.greedy_n) */
        const int g = e->group || r->gr ? 0 : m3_sampler_greedy_ids(r->smp, r->draft, r->k_sched);
        r->vdev = 0;
        if (r->k_sched) { /* every row's logits: row i verifies d_{i+1} */
            r->out_idx = n_out;
            m3_draw_param dp;
            /* a plain sampled request without logprobs whose q rows are on the backend (or one-hot:
             * greedy drafts): its rows drawn and verified there (ops verify_rows), only ids back */
            if (!g && drawn_on_backend(e, r, r->draft, &dp) && e->m->ops->verify_rows && (r->q_dev_used || !r->q_used) &&
                r->k_sched <= M3_VERIFY_K_MAX) {
                m3_verify_group *vg = &e->vgroups[n_vg++];
                vg->row0 = n_out;
                vg->k = r->k_sched;
                vg->q = r->q_dev_used ? r->qd : NULL;
                memcpy(vg->d, r->draft, sizeof(int32_t) * (size_t)r->k_sched);
                m3_sampler_peek_uniforms(r->smp, r->k_sched + 1, vg->u);
                for (int j = 0; j <= r->k_sched; j++) {
                    e->gpar[n_out + j] = dp;
                    e->gpar[n_out + j].u = j == r->k_sched ? vg->u[j] : 0; /* the bonus's draw; the others' unused */
                }
                r->vdev = 1;
            }
            for (int j = 0; j <= r->k_sched; j++) {
                e->gn[n_out] = r->vdev ? -1 : g;
                e->rows[n_out++] = r->row0 + j;
            }
            e->last.n_spec++;
            e->last.n_draft += r->k_sched;
        } else {
            int lo, np = plp_span(r, r->n_sched, &lo); /* its prompt rows, then its sampling row (contiguous) */
            r->plp_idx = n_out;
            r->plp_j0 = e->n_plp;
            r->plp_n = np;
            for (int j = 0; j < np; j++) {
                const int row = r->row0 + (lo - r->n_done) + j; /* position lo + j: it gives prompt[lo + j + 1] */
                e->plp_req[e->n_plp] = r;
                if (e->lp_dev) { /* reduced where the logits are: no output row */
                    e->lp_rows[e->n_plp] = row;
                    e->lp_tok[e->n_plp] = r->tok[lo + j + 1];
                    e->lp_n[e->n_plp] = r->n_text;
                } else {
                    e->gn[n_out] = 0;
                    e->plp_row[e->n_plp] = n_out;
                    e->rows[n_out++] = row;
                }
                e->n_plp++;
            }
            if (np && r->plp_top > e->lp_k) e->lp_k = r->plp_top;
            e->last.n_prompt_rows += np;
        }
        if (!r->k_sched && r->n_done + r->n_sched == r->n_tok && r->max_tokens > 0) {
            r->out_idx = n_out;
            e->gn[n_out] = g;
            m3_draw_param *dp = &e->gpar[n_out];
            /* a plain sampled row without logprobs: drawn where the logits are, with the uniform
             * m3_sampler_sample would take (the same stream) */
            if (!g && drawn_on_backend(e, r, NULL, dp)) {
                dp->u = m3_sampler_uniform(r->smp);
                e->gn[n_out] = -1;
            }
            e->rows[n_out++] = T - 1;
        }
        n_greedy += r->out_idx >= 0 && e->gn[r->out_idx] != 0;
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
        m3_taps taps = e->spec ? capture_taps(e) : (m3_taps){0};
        int gdone = 0;
        if (n_greedy) {
            taps.greedy_n = e->gn;
            taps.greedy_ids = e->gid;
            taps.greedy_fin = e->gfin;
            taps.greedy_done = &gdone;
            taps.draw_par = e->gpar;
            taps.verify = e->vgroups;
            taps.n_verify = n_vg;
        }
        if (e->lp_dev && e->n_plp) lp_taps(e, &taps, e->lp_rows, 0, e->n_plp);
        m3_embed_override ov = {n_ov, e->ov_rows, e->ov_emb};
        const m3_taps *tp = e->spec || n_greedy || taps.n_lp ? &taps : NULL;
        int frc = e->group ? m3_group_forward_ex(e->group, &b, e->ids, n_ov ? &ov : NULL, e->rows, n_out, e->logits, tp, err)
                           : m3_forward_ex(e->m, e->kv, &b, e->ids, n_ov ? &ov : NULL, e->rows, n_out, e->logits, tp, err);
        if (!frc && gdone)
            for (int i = 0; i < e->n_running; i++) {
                req *r = e->running[i];
                r->gdev = r->n_sched && r->out_idx >= 0 && e->gn[r->out_idx] != 0;
            }
        if (frc && step_failed(e, T, ns, n_out, err) < 0) {
            snapshot(e);
            return -1;
        }
        step_rc = frc ? -1 : 0;
        e->tot.tokens_prefilled += (uint64_t)e->last.n_prefill_tokens;
        int nr = e->n_running;
        m3_engine_masks_wait(e); /* the masks computed while the forward ran */
        if (e->trace) t_fwd = m3_now();
        q_to_host(e);
        sample_rows(e, nr);
        prompt_rows(e);
        if (e->trace) t_sample = m3_now();
        int n_app = 0; /* draft context appends */
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
            /* sample_rows checked every row of it, prompt_rows its prompt rows */
            if ((r->out_idx >= 0 && !r->so_finite) || (r->plp_n && deliver_prompt(e, r))) {
                r->why = "the model produced non-finite logits (NaN or Inf)";
                e->tot.nonfinite_logits++;
                r->done = M3_FINISH_ERROR;
                continue;
            }
            if (r->k_sched) {
                const m3_spec_result *res = &r->sres; /* verified by sample_rows */
                if (r->sres_rc) {
                    r->why = r->why_buf;
                    r->done = M3_FINISH_ERROR;
                    continue;
                }
                n_valid = 1 + (res->n_accepted < res->n_emit ? res->n_accepted : res->n_emit);
                /* roll back: the rejected drafts' entries past kv.len are never read (a later
                 * forward rewrites a position before any query reaches it) */
                r->n_done = P + n_valid;
                r->bs.kv.len = r->n_done;
                e->tot.spec_verify_steps++;
                e->tot.spec_verify_backend += (uint64_t)(r->vdev && r->gdev);
                e->tot.spec_draft_tokens += (uint64_t)r->k_sched;
                e->tot.spec_accepted_tokens += (uint64_t)res->n_accepted;
                e->tot.spec_emitted_tokens += (uint64_t)res->n_emit;
                for (int j = 0; j < r->k_sched; j++) {
                    e->tot.spec_drafted_per_pos[j]++;
                    e->tot.spec_accepted_per_pos[j] += j < res->n_accepted;
                }
                reason = deliver(e, r, res->out, res->n_emit);
            } else {
                r->n_done += r->n_sched;
            }
            /* only positions below n_done (committed tokens) reach the prefix cache */
            if (e->prefix && m3_blocks_commit(e->bm, &r->bs, r->tok, r->n_done, r->extra, r->n_extra, &e2)) {
                r->why = OOM;
                r->done = M3_FINISH_ERROR;
                continue;
            }
            if (!r->max_tokens && r->n_done == r->n_tok) { /* max_tokens 0: the prompt alone, done */
                reason = M3_FINISH_LENGTH;
                e->tot.requests_finished[reason]++;
                emit(r, NULL, reason);
            }
            if (plain) {
                int gend = 0;
                if (r->gr) {
                    e->tot.grammar_inline_s += r->g_inline_s;
                    e->g_inline_n += (uint64_t)r->g_inline_n;
                    r->g_inline_s = 0;
                    r->g_inline_n = 0;
                }
                if (r->so_rc || m3_sampler_accept(r->smp, r->so.token, &e2)) {
                    if (!r->so_rc) snprintf(r->why_buf, sizeof r->why_buf, "%s", e2.msg);
                    r->why = r->why_buf;
                    r->done = M3_FINISH_ERROR;
                    continue;
                }
                if (r->gr && (gend = m3_engine_grammar_accept(r, r->so.token)) < 0) {
                    r->done = M3_FINISH_ERROR;
                    continue;
                }
                reason = deliver(e, r, &r->so, 1);
                if (!reason && gend) { /* the grammar is complete: the request ends here */
                    reason = M3_FINISH_STOP;
                    e->tot.requests_finished[reason]++;
                    emit(r, NULL, reason);
                }
            }
            /* the draft context takes the committed rows (not needed once the request ends): all
             * requests' rows in one pass of the draft, below */
            if (e->spec && !reason && n_valid > 0) {
                e->app_req[n_app] = r;
                e->apps[n_app++] = (m3_dspark_rows){&r->dctx, e->feat + (size_t)r->row0 * F, P, n_valid};
            }
            r->done = reason;
        }
        m3_err ea;
        if (n_app && m3_dspark_ctx_append_n(&e->draft, e->apps, n_app, &ea)) {
            for (int j = 0; j < n_app; j++) {
                e->app_req[j]->why = "the draft context failed (out of memory)";
                e->app_req[j]->done = M3_FINISH_ERROR;
            }
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
            m3_engine_req_free(r);
        }
        e->n_running = k;
        m3_engine_masks_post(e); /* the next step's masks, computed while it is scheduled and run */
    }
    e->tot.grammar_masks = e->g_inline_n + e->tot.grammar_masks_ahead;
    snapshot(e);
    if (e->trace && T > 0) {
        const double t_end = m3_now();
        fprintf(e->trace, "%.4f %d %d %d %d %.3f %.3f %.3f %.3f\n", t_begin - e->trace_t0, T, ns, e->last.n_prefill_tokens,
                e->last.n_decode, (t_draft - t_begin) * 1e3, (t_fwd - t_draft) * 1e3, (t_sample - t_fwd) * 1e3,
                (t_end - t_begin) * 1e3);
        fflush(e->trace);
    }
    return step_rc ? -1 : e->n_running + e->n_waiting;
}
