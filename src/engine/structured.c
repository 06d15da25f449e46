/* Structured outputs in the engine (engine.h): shared compiled grammars, the mask of a
 * constrained row, the matcher advanced over accepted tokens, and the mask thread that computes
 * the next step's masks while the engine thread schedules and runs the forward.
 *
 * Handoff: after a step's tokens are accepted (m3_engine_masks_post), the engine thread lists
 * the running constrained requests whose mask is stale and wakes the mask thread; from then
 * until m3_engine_masks_wait returns, the mask thread alone touches those requests' matchers
 * and masks (gm, gmask, g_ready), and the engine thread neither reads them nor frees the
 * requests (step.c: finish waits first). The wait comes right after the forward, before the
 * step's rows are sampled. */
#include "engine_int.h"

#include "../base/clock.h"

struct m3_engine_grammar {
    _Atomic int refs;
    m3_grammar *g;
    m3_grammar_compiled *gc;
};

m3_engine_grammar *m3_engine_grammar_new(m3_grammar *g, m3_grammar_compiled *gc, m3_err *err) {
    m3_engine_grammar *eg = e_calloc(1, sizeof *eg);
    if (!eg) {
        m3_grammar_compiled_free(gc);
        m3_grammar_free(g);
        m3_errf(err, "engine grammar: out of memory");
        return NULL;
    }
    eg->refs = 1;
    eg->g = g;
    eg->gc = gc;
    return eg;
}

void m3_engine_grammar_retain(m3_engine_grammar *eg) {
    if (eg) eg->refs++;
}

void m3_engine_grammar_release(m3_engine_grammar *eg) {
    if (!eg || --eg->refs > 0) return;
    m3_grammar_compiled_free(eg->gc);
    m3_grammar_free(eg->g);
    free(eg);
}

const m3_grammar_compiled *m3_engine_grammar_compiled(const m3_engine_grammar *eg) { return eg->gc; }

/* ---------------- the mask of a row ---------------- */

static int fill(req *r) {
    if (m3_matcher_fill_mask(r->gm, r->gmask)) return -1;
    r->g_ready = 1;
    return 0;
}

int m3_engine_mask_row(m3_engine *e, req *r) {
    (void)e;
    if (r->g_phase == G_FREE) {
        m3_sampler_set_mask(r->smp, NULL);
        return 0;
    }
    if (!r->g_ready) { /* on a sampling thread: timed here, summed on the engine thread (step.c) */
        double t0 = m3_now();
        if (fill(r)) return -1;
        r->g_inline_s += m3_now() - t0;
        r->g_inline_n++;
    }
    if (r->g_phase == G_FIRST) { /* adaptive: the reasoning may open instead; this mask is used once */
        r->gmask[r->g_open >> 5] |= 1u << (r->g_open & 31);
        r->g_ready = 0;
    }
    m3_sampler_set_mask(r->smp, r->gmask);
    return 0;
}

int m3_engine_grammar_accept(req *r, int32_t tok) {
    if (r->g_phase == G_FREE) {
        if (tok == r->g_start) {
            r->g_phase = G_ON;
            r->g_ready = 0;
        }
        return 0;
    }
    if (r->g_phase == G_FIRST) {
        r->g_ready = 0;
        if (tok == r->g_open) {
            r->g_phase = G_FREE;
            return 0;
        }
        r->g_phase = G_ON;
    }
    r->g_ready = 0;
    if (m3_matcher_accept(r->gm, tok)) {
        r->why = "structured output: the sampled token is outside the grammar (or out of memory)";
        return -1;
    }
    return m3_matcher_is_ended(r->gm) || m3_matcher_must_end(r->gm);
}

/* ---------------- the mask thread ---------------- */

static void mask_range(void *ctx, size_t b0, size_t b1, int worker) {
    (void)worker;
    m3_engine *e = ctx;
    for (size_t i = b0; i < b1; i++) {
        req *r = e->gq[i];
        if (fill(r)) r->g_ready = 0; /* no memory: computed again as its row is sampled */
    }
}

static void *mask_main(void *arg) {
    m3_engine *e = arg;
    pthread_mutex_lock(&e->gmu);
    for (;;) {
        while (!e->g_job && !e->g_stop) pthread_cond_wait(&e->gcv, &e->gmu);
        if (e->g_stop && !e->g_job) break;
        e->g_job = 0;
        int n = e->gq_n;
        pthread_mutex_unlock(&e->gmu);
        m3_pool_for(e->gpool, (size_t)n, 1, mask_range, e);
        pthread_mutex_lock(&e->gmu);
        e->g_ahead += (uint64_t)n;
        e->g_busy = 0;
        pthread_cond_broadcast(&e->gcv);
    }
    pthread_mutex_unlock(&e->gmu);
    return NULL;
}

int m3_engine_masks_start(m3_engine *e, int threads) {
    if (threads < 0) return 0;
    if (threads == 0) threads = 1;
    if (threads > 64) threads = 64;
    e->gq = e_calloc((size_t)e->max_seqs, sizeof *e->gq);
    if (!e->gq) return -1;
    if (threads > 1 && !(e->gpool = m3_pool_create(threads))) return -1;
    if (pthread_mutex_init(&e->gmu, NULL)) return -1;
    if (pthread_cond_init(&e->gcv, NULL)) {
        pthread_mutex_destroy(&e->gmu);
        return -1;
    }
    if (pthread_create(&e->gth, NULL, mask_main, e)) {
        pthread_cond_destroy(&e->gcv);
        pthread_mutex_destroy(&e->gmu);
        return -1;
    }
    e->gth_on = 1;
    return 0;
}

void m3_engine_masks_stop(m3_engine *e) {
    if (e->gth_on) {
        pthread_mutex_lock(&e->gmu);
        e->g_stop = 1;
        pthread_cond_broadcast(&e->gcv);
        pthread_mutex_unlock(&e->gmu);
        pthread_join(e->gth, NULL);
        pthread_cond_destroy(&e->gcv);
        pthread_mutex_destroy(&e->gmu);
        e->gth_on = 0;
    }
    m3_pool_free(e->gpool);
    e->gpool = NULL;
    free(e->gq);
    e->gq = NULL;
}

void m3_engine_masks_post(m3_engine *e) {
    if (!e->gth_on) return;
    int n = 0;
    for (int i = 0; i < e->n_running; i++) {
        req *r = e->running[i];
        if (r->gr && r->g_phase != G_FREE && !r->g_ready) e->gq[n++] = r;
    }
    if (!n) return;
    pthread_mutex_lock(&e->gmu);
    e->gq_n = n;
    e->g_job = e->g_busy = 1;
    pthread_cond_broadcast(&e->gcv);
    pthread_mutex_unlock(&e->gmu);
}

void m3_engine_masks_wait(m3_engine *e) {
    if (!e->gth_on) return;
    pthread_mutex_lock(&e->gmu);
    if (e->g_busy) {
        double t0 = m3_now();
        while (e->g_busy) pthread_cond_wait(&e->gcv, &e->gmu);
        e->tot.grammar_wait_s += m3_now() - t0;
    }
    e->tot.grammar_masks_ahead = e->g_ahead;
    pthread_mutex_unlock(&e->gmu);
}
