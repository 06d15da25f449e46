/* m3 bench --random-weights --dspark-config FILE: the DSpark draft on the GPU beside the target
 * (src/cli/bench_gpu.c), with random weights of the draft config's shapes. Per batch: the
 * draft (the context append of the rows a step commits, the block forward of k slots, the k
 * Markov rows and the draws on the host, as the engine drafts), the verify pass of k + 1
 * tokens with the draft's capture on the device, the whole speculative step, and what the step
 * would give at the seed's mean accepted lengths: a projection, since random weights accept
 * nothing worth measuring. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/cuda/cuda.h"
#include "../engine/sampler.h"
#include "../engine/spec.h"
#include "../io/files.h"
#include "../model/dspark.h"
#include "../weights/weights.h"
#include "cli.h"


int m3_bench_dspark_load(const char *path, m3_model *m, int full_layers, uint64_t seed, m3_dspark *d, m3_err *err) {
    char *text = m3_read_text(path, NULL, (size_t)16 << 20, err);
    if (!text) return -1;
    /* checked against the whole target; with fewer layers the captured ones are spread over
     * those (layer l of L -> l * layers / L), so the verify pass captures as many */
    m3_config full = m->cfg; /* shallow: only the layer count differs */
    full.n_layers = full_layers;
    m3_dspark_config dc;
    int rc = m3_dspark_config_parse(&dc, text, path, &full, err);
    free(text);
    if (rc) return -1;
    for (int i = 0; i < dc.n_target; i++) {
        dc.target_layers[i] = (int)((long)dc.target_layers[i] * m->cfg.n_layers / full_layers);
        if (i && dc.target_layers[i] <= dc.target_layers[i - 1]) {
            m3_dspark_config_free(&dc);
            return m3_errf(err, "%s: %d layers are too few to spread the draft's %d captured layers over", path,
                           m->cfg.n_layers, dc.n_target);
        }
    }
    m3_weights shape, dw;
    if (m3_dspark_weights_shapes(&dc, &shape, err)) { m3_dspark_config_free(&dc); return -1; }
    rc = m3_cuda_random_weights_like(m->ops, &dc.base, &shape, seed, &dw, err);
    m3_weights_free(&shape);
    if (rc) { m3_dspark_config_free(&dc); return -1; }
    return m3_dspark_from_device(d, &dc, m, m->ops, &dw, err);
}

/* whether v is among a[0..n) */
static int memchr_i32(const int32_t *a, int32_t v, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] == v) return 1;
    return 0;
}

static void sort(double *a, long n) {
    for (long i = 1; i < n; i++)
        for (long k = i; k > 0 && a[k] < a[k - 1]; k--) { double t = a[k]; a[k] = a[k - 1]; a[k - 1] = t; }
}

/* capture taps into feat (device [T][F]) */
typedef struct { m3_dspark *d; float *feat; } cap_arg;
static void cap(void *arg, int layer, const float *h, int T, int H) {
    cap_arg *c = arg;
    int s = m3_dspark_feat_slot(c->d, layer), F = m3_dspark_feat_dim(c->d);
    if (s < 0) return;
    const m3_ops *op = c->d->ops;
    op->copy_rows(op, c->feat + (size_t)s * H, sizeof(float) * (size_t)F, h, sizeof(float) * (size_t)H,
                  sizeof(float) * (size_t)H, (size_t)T);
}

/* the q rows the last verify captured for each sequence, appended in one pass (the engine's way) */
static int append_all(m3_dspark *d, m3_dspark_ctx *cx, long nb, const float *feat, int q, m3_err *err) {
    m3_dspark_rows a[M3_SPEC_DRAFT_BATCH];
    const int F = m3_dspark_feat_dim(d);
    for (long s = 0; s < nb; s++) a[s] = (m3_dspark_rows){&cx[s], feat + (size_t)s * q * F, cx[s].len, q};
    return m3_dspark_ctx_append_n(d, a, (int)nb, err);
}

/* The bytes a draft pass must read (its HBM floor at the copy bandwidth): the append's fc and each
 * layer's K and V projections; the block's layers, the target's lm_head and each request's ring
 * (min(ctx, window) positions of K and V a layer); markov_w2 once per slot. Norms, embedding rows
 * and the activations are left out (a few MB). */
static double draft_bytes(const m3_dspark *d, const m3_model *m, long nb, long ctx, int k) {
    const m3_config *b = &d->cfg.base;
    double by = (double)m3_linear_bytes(&d->fc) + (double)m3_linear_bytes(&m->dw->lm_head) +
                (double)k * m3_linear_bytes(&d->markov_w2);
    for (int l = 0; l < b->n_layers; l++) {
        const m3_dspark_layer *L = &d->layers[l];
        by += 2.0 * ((double)m3_linear_bytes(&L->k) + m3_linear_bytes(&L->v)) + (double)m3_linear_bytes(&L->q) +
              m3_linear_bytes(&L->o) + m3_linear_bytes(&L->mlp.gate) + m3_linear_bytes(&L->mlp.up) + m3_linear_bytes(&L->mlp.down);
    }
    const long keys = ctx < d->cfg.window ? ctx : d->cfg.window;
    by += (double)nb * b->n_layers * 2.0 * keys * b->n_kv_heads * b->head_dim * sizeof(float);
    return by;
}

int m3_bench_dspark(m3_model *m, m3_kv *kv, m3_dspark *d, long nb, long ctx, int k, long steps, double decode_s,
                    double verify_s, double decode_floor_s, double verify_floor_s, double bw, int profile, m3_err *err) {
    m3_ops *ops = m->ops;
    const int V = m->cfg.vocab, F = m3_dspark_feat_dim(d), q = k + 1;
    const long T = nb * q;
    int rc = 0;
    if (nb > M3_SPEC_DRAFT_BATCH) return m3_errf(err, "dspark bench: batch %ld > %d", nb, M3_SPEC_DRAFT_BATCH);
    m3_kv_seq *seqs = calloc((size_t)nb, sizeof *seqs);
    m3_kv_seq **sp = calloc((size_t)nb, sizeof *sp);
    m3_dspark_ctx *cx = calloc((size_t)nb, sizeof *cx);
    m3_sampler **sm = calloc((size_t)nb, sizeof *sm);
    m3_rng *rng = calloc((size_t)nb, sizeof *rng);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * 3), *pos = ids ? ids + T : NULL, *sq = ids ? pos + T : NULL;
    int32_t *drafts = malloc(sizeof(int32_t) * (size_t)nb * M3_SPEC_MAX_TOKENS);
    int *rows = malloc(sizeof(int) * (size_t)T);
    float *hrows = malloc(sizeof(float) * (size_t)nb * V);
    double *st = malloc(sizeof(double) * (size_t)steps * 3);
    float *feat = ops->alloc(ops->ctx, sizeof(float) * (size_t)T * F);
    m3_sample_ws *ws = m3_sample_ws_create(V, err);
    m3_spec_draft_req rq[M3_SPEC_DRAFT_BATCH];
    if (!seqs || !sp || !cx || !sm || !rng || !ids || !drafts || !rows || !hrows || !st || !feat || !ws) {
        rc = m3_errf(err, "dspark bench: out of memory");
        goto out;
    }
    const int W = d->cfg.window;
    /* the draft contexts: the last min(ctx, window) positions, from the capture buffer's rows */
    for (long s = 0; s < nb && !rc; s++) {
        m3_sampling sg = {0};
        int32_t p0 = 1;
        if (!(sm[s] = m3_sampler_create(&sg, V, &p0, 1, err))) { rc = -1; break; }
        m3_rng_seed(&rng[s], 7 + (uint64_t)s);
        long first = ctx > W ? ctx - W : 0;
        m3_dspark_ctx_reset(&cx[s], (int)first);
        for (long p = first; p < ctx && !rc; p += T) {
            long n = ctx - p < T ? ctx - p : T;
            rc = m3_dspark_ctx_append_dev(d, &cx[s], feat, (int)p, (int)n, err);
        }
    }
    if (rc) goto out;
    double *t_draft = st, *t_ver = st + steps, *t_all = st + 2 * steps;
    long experts = 0, distinct = 0;
    cap_arg ca = {d, feat};
    m3_taps taps = {.arg = &ca, .capture_layers = d->capture, .capture = cap, .capture_dev = 1,
                    .graph_key = (uint64_t)(uintptr_t)feat};
    /* each timed step: draft (append of the k + 1 rows of the last verify, block, Markov and
     * draws), then the verify pass of [anchor, drafts] per sequence, capturing into feat */
    for (long it = 0; it < steps + 2 && !rc; it++) {
        double a = m3_cuda_sync_time(ops);
        if (it > 0) rc = append_all(d, cx, nb, feat, q, err);
        for (long s = 0; s < nb; s++)
            rq[s] = (m3_spec_draft_req){&cx[s], sm[s], &rng[s], (int32_t)((s * 7919 + it) % V), cx[s].len,
                                        drafts + s * M3_SPEC_MAX_TOKENS, NULL, NULL, 0, 0, NULL, 0};
        if (!rc) rc = m3_spec_draft_n(d, rq, (int)nb, ws, M3_SPEC_DRAFT_GREEDY, k, hrows, err);
        double b = m3_cuda_sync_time(ops);
        /* the target's caches: each sequence at its draft position (the context grows by q a step) */
        for (long s = 0; s < nb && !rc; s++) {
            sp[s] = &seqs[s];
            int p0 = (int)(ctx + it * q);
            if (m3_kv_seq_reserve(kv, &seqs[s], p0 + q, err)) { rc = -1; break; }
            seqs[s].len = p0;
            for (int j = 0; j < q; j++) {
                long t = s * q + j;
                ids[t] = j ? drafts[s * M3_SPEC_MAX_TOKENS + j - 1] : rq[s].anchor;
                pos[t] = p0 + j;
                sq[t] = (int32_t)s;
                rows[t] = (int)t;
            }
        }
        m3_batch bt = {(int)T, pos, sq, sp};
        /* the untimed second step counts the (layer, expert) pairs the drafts' routing reads: the
         * verify's time follows them, and drafts of random weights may repeat tokens */
        if (it == 1) m3_cuda_count_experts(ops, 1);
        double c0 = m3_cuda_sync_time(ops);
        if (!rc) rc = m3_forward(m, kv, &bt, ids, rows, (int)T, NULL, &taps, err);
        double c1 = m3_cuda_sync_time(ops);
        if (it == 1) {
            m3_cuda_count_experts(ops, 0);
            experts = m3_cuda_experts_used(ops, 1);
            for (long s = 0; s < nb; s++)
                for (int j = 0; j < q; j++) distinct += !memchr_i32(ids + s * q, ids[s * q + j], j);
        }
        if (it >= 2) {
            t_draft[it - 2] = b - a;
            t_ver[it - 2] = c1 - c0;
            t_all[it - 2] = (b - a) + (c1 - c0);
        }
    }
    if (rc) goto out;
    sort(t_draft, steps);
    sort(t_ver, steps);
    sort(t_all, steps);
    /* The whole step counts the verify pass of k + 1 distinct tokens (m3 bench's, verify_s): the
     * drafts of random weights repeat tokens, and a verify of repeated tokens routes to fewer
     * experts than a real draft's distinct tokens would (at 30 layers, batch 1: 951 against 1,345
     * (layer, expert) pairs, 15.5 against 17.3 ms) */
    double dm = t_draft[steps / 2], vm = t_ver[steps / 2], am = t_all[steps / 2], wm = dm + verify_s;
    printf("  dspark (k %d, %d draft layers, window %d, %ld sequences drafted in one pass): draft %.3f ms (append %d rows each + "
           "block + %d Markov rows + draws); verify of the drafts with capture %.3f ms (%ld distinct tokens of %ld, %ld experts "
           "read; draft + it %.3f ms = %.2f decode steps)\n",
           k, d->cfg.base.n_layers, W, nb, dm * 1e3, q, k, vm * 1e3, distinct, T, experts, am * 1e3, am / decode_s);
    printf("  dspark whole step (the draft + the verify pass of %d distinct tokens above): %.3f ms = %.2f decode steps\n", q,
           wm * 1e3, wm / decode_s);
    printf("  dspark projection (random weights: acceptance not measured): at MAL 3.48 %.2fx, at MAL 4.77 %.2fx the "
           "decode speed (MAL x decode step / whole step)\n",
           3.48 * decode_s / wm, 4.77 * decode_s / wm);
    /* the same step at its HBM floor: how far it is from it, and the ratio no kernel can go under (a
     * faster decode step moves the step-count ratio up, toward this one) */
    const double dfl = draft_bytes(d, m, nb, ctx, k) / bw, wfl = dfl + verify_floor_s;
    printf("  dspark whole step floor %.3f ms (draft %.3f + verify %.3f at %.0f GB/s): the step runs at %.0f%% of it; at the "
           "floors the step is %.2f decode steps (decode floor %.3f ms), the projection at MAL 4.77 %.2fx\n",
           wfl * 1e3, dfl * 1e3, verify_floor_s * 1e3, bw / 1e9, 100 * wfl / wm, wfl / decode_floor_s, decode_floor_s * 1e3,
           4.77 * decode_floor_s / wfl);
    { /* sampled requests' drafts (probabilistic, T 0.8, top-p 0.95: q comes to the host for the
       * verification): the draws on the device (draw_rows) against the host's slot-by-slot loop
       * (M3_DRAWS=host), beside greedy drafts; block + Markov rows + draws, no append */
        /* the q rows land where the engine puts them: page-locked when the backend has it */
        const size_t qbytes = sizeof(float) * (size_t)nb * k * V;
        float *qb = ops->host_alloc ? ops->host_alloc(ops->ctx, qbytes) : NULL;
        const int qpinned = qb != NULL;
        if (!qb) qb = malloc(qbytes);
        m3_sampler **ss = calloc((size_t)nb, sizeof *ss);
        double med[4] = {0, 0, 0, 0};
        if (!qb || !ss) rc = m3_errf(err, "dspark bench: out of memory");
        for (long s = 0; s < nb && !rc; s++) {
            m3_sampling sg = {0};
            sg.temperature = 0.8f;
            sg.top_p = 0.95f;
            int32_t p0 = 1;
            if (!(ss[s] = m3_sampler_create(&sg, V, &p0, 1, err))) rc = -1;
        }
        const char *was = getenv("M3_DRAWS");
        for (int v = 0; v < 4 && !rc; v++) { /* 0 greedy, 1 sampled on the device, 2 on the host, 3 on the device without q */
            if (v == 2) setenv("M3_DRAWS", "host", 1);
            for (long it = 0; it < steps + 1 && !rc; it++) {
                for (long s = 0; s < nb; s++)
                    rq[s] = (m3_spec_draft_req){&cx[s], v ? ss[s] : sm[s], &rng[s], (int32_t)((s * 7919 + it) % V), cx[s].len,
                                                drafts + s * M3_SPEC_MAX_TOKENS, v && v < 3 ? qb + (size_t)s * k * V : NULL, NULL,
                                                0, 0, NULL, 0};
                double t0 = m3_cuda_sync_time(ops);
                rc = m3_spec_draft_n(d, rq, (int)nb, ws, v ? M3_SPEC_DRAFT_PROBABILISTIC : M3_SPEC_DRAFT_GREEDY, k, hrows, err);
                double t1 = m3_cuda_sync_time(ops);
                if (it) t_draft[it - 1] = t1 - t0;
            }
            if (was) setenv("M3_DRAWS", was, 1);
            else unsetenv("M3_DRAWS");
            sort(t_draft, steps);
            med[v] = t_draft[steps / 2];
        }
        if (!rc)
            printf("  dspark drafts of sampled requests (T 0.8, top-p 0.95, probabilistic; block + Markov rows + draws, no append): "
                   "greedy %.3f ms, sampled with the draws on the device %.3f ms (%.3f ms without the distributions' "
                   "download), on the host %.3f ms\n",
                   med[0] * 1e3, med[1] * 1e3, med[3] * 1e3, med[2] * 1e3);
        if (!rc && ops->verify_rows && ops->draw_rows) {
            /* the target's side of a sampled speculative step on the device: each request's k + 1
             * rows drawn (draw_rows, T 0.8, top-p 0.95) and its drafts verified (verify_rows) against
             * the q rows the host run above left; stand-in rows: standard normal logits (flat: every
             * radix pass of the draw runs; the drafts mostly rejected: a residual a request) */
            const int R = (int)nb * (k + 1);
            const size_t rb = sizeof(float) * (size_t)V;
            float *hx = malloc(rb * (size_t)R), *master = ops->alloc(ops->ctx, rb * (size_t)R), *xr = ops->alloc(ops->ctx, rb * (size_t)R);
            float *dq = ops->alloc(ops->ctx, rb * (size_t)nb * k);
            int32_t *dout = ops->alloc(ops->ctx, sizeof(int32_t) * (size_t)R);
            m3_draw_param *par = malloc(sizeof *par * (size_t)R);
            m3_verify_group *vg = calloc((size_t)nb, sizeof *vg);
            double *td = malloc(sizeof(double) * (size_t)steps), *tv = malloc(sizeof(double) * (size_t)steps);
            if (!hx || !master || !xr || !dq || !dout || !par || !vg || !td || !tv) rc = m3_errf(err, "dspark bench: out of memory");
            m3_rng br;
            m3_rng_seed(&br, 99);
            for (size_t i = 0; !rc && i < (size_t)R * V; i++) hx[i] = (float)m3_rng_normal(&br);
            for (long g = 0; !rc && g < nb; g++) {
                vg[g].row0 = (int)g * (k + 1);
                vg[g].k = k;
                vg[g].q = dq + (size_t)g * k * V;
                for (int i = 0; i < k; i++) vg[g].d[i] = (int32_t)((g * 131 + i * 7919) % V);
                for (int i = 0; i <= k; i++) vg[g].u[i] = m3_rng_uniform(&br);
                for (int i = 0; i <= k; i++)
                    par[vg[g].row0 + i] = (m3_draw_param){0.8f, 0.95f, 0.0f, 0, V, i == k ? vg[g].u[k] : 0.0};
            }
            if (!rc) {
                ops->upload(ops->ctx, master, hx, rb * (size_t)R);
                ops->upload(ops->ctx, dq, qb, rb * (size_t)nb * k);
            }
            for (long it = 0; it < steps + 1 && !rc; it++) {
                ops->copy(ops->ctx, xr, master, rb * (size_t)R);
                const double t0 = m3_cuda_sync_time(ops);
                ops->draw_rows(ops->ctx, xr, R, V, (size_t)V, par, dout);
                const double t1 = m3_cuda_sync_time(ops);
                ops->verify_rows(ops->ctx, xr, V, (size_t)V, (int)nb, vg, dout);
                const double t2 = m3_cuda_sync_time(ops);
                if (ops->check && ops->check(ops->ctx, err)) rc = -1;
                if (it) { td[it - 1] = t1 - t0; tv[it - 1] = t2 - t1; }
            }
            if (!rc) {
                sort(td, steps);
                sort(tv, steps);
                printf("  dspark verification of sampled requests on the device (%d rows of standard normal logits, T 0.8, "
                       "top-p 0.95): draw_rows %.3f ms (%.1f us a row), verify_rows %.3f ms (%ld requests, k %d)\n",
                       R, td[steps / 2] * 1e3, td[steps / 2] * 1e6 / R, tv[steps / 2] * 1e3, nb, k);
            }
            free(hx); free(par); free(vg); free(td); free(tv);
            if (master) ops->release(ops->ctx, master);
            if (xr) ops->release(ops->ctx, xr);
            if (dq) ops->release(ops->ctx, dq);
            if (dout) ops->release(ops->ctx, dout);
        }
        for (long s = 0; ss && s < nb; s++) m3_sampler_free(ss[s]);
        free(ss);
        if (qpinned) ops->host_free(ops->ctx, qb);
        else free(qb);
    }
    if (profile) { /* where the draft's time goes: 3 drafts (append + block + Markov + draws), per op */
        m3_cuda_profile(ops, 1);
        double wa = 0, wd = 0; /* wall time of the appends and of the rest (block, Markov, draws) */
        for (int it = 0; it < 3 && !rc; it++) {
            double t0 = m3_cuda_sync_time(ops);
            rc = append_all(d, cx, nb, feat, q, err);
            double t1 = m3_cuda_sync_time(ops);
            /* greedy requests of the greedy samplers (the sampled drafts' samplers are freed by now) */
            for (long s = 0; s < nb; s++)
                rq[s] = (m3_spec_draft_req){&cx[s], sm[s], &rng[s], (int32_t)((s * 7919 + it) % V), cx[s].len,
                                            drafts + s * M3_SPEC_MAX_TOKENS, NULL, NULL, 0, 0, NULL, 0};
            if (!rc) rc = m3_spec_draft_n(d, rq, (int)nb, ws, M3_SPEC_DRAFT_GREEDY, k, hrows, err);
            double t2 = m3_cuda_sync_time(ops);
            wa += t1 - t0;
            wd += t2 - t1;
        }
        if (!rc) {
            printf("  dspark draft per op (3 drafts; wall, profiled: append %.3f ms, block + Markov + draws %.3f ms):\n",
                   wa / 3 * 1e3, wd / 3 * 1e3);
            m3_cuda_profile_report(ops, 3, stdout);
        }
        m3_cuda_profile(ops, 0);
    }
out:
    for (long s = 0; seqs && s < nb; s++) m3_kv_seq_release(kv, &seqs[s]);
    for (long s = 0; cx && s < nb; s++) m3_dspark_ctx_free(&cx[s]);
    for (long s = 0; sm && s < nb; s++) m3_sampler_free(sm[s]);
    if (feat) ops->release(ops->ctx, feat);
    m3_sample_ws_free(ws);
    free(seqs); free(sp); free(cx); free(sm); free(rng); free(ids); free(drafts); free(rows); free(hrows); free(st);
    return rc ? -1 : 0;
}
