/* Tensor / expert parallelism on the CPU with the thread communicator (src/parallel):
 *   1. the communicator: all_reduce_sum sums in rank order (bitwise equal to a sequential
 *      sum, the same bits on every rank), all_gather is rank-major, a count mismatch is an
 *      error on every rank, abort wakes ranks waiting in a collective, reset makes it usable;
 *   2. weight views: column slices decode to the full matrix's columns (MXFP8, NVFP4, BF16),
 *      slices that cut a scale group and shapes that do not split are errors naming them;
 *   3. the model: a prompt (chunked prefill crossing pages and index blocks) plus greedy
 *      decode steps on every reference checkpoint, at TP1 (m3_forward) and through a group of
 *      1 (bitwise equal), 2 and 4 ranks with the expert-parallel and the width-split MoE:
 *      logits within 1e-5 relative L2 of TP1 at every row, greedy tokens equal, indexer
 *      blocks equal; combinations whose shapes do not split are skipped with the reason;
 *   4. a rank that fails mid-step (the others waiting in a collective) fails the step with
 *      its message, and the group works again afterwards.
 * Usage: test_tp [DATA_DIR (default tests/data)] */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "model/group.h"

#include "../check.h"

#define TOL 1e-5

/* ------------------------------------------------------------------ 1. communicator */

typedef struct {
    m3_comm *c;
    int n;
    float *buf;
    float *gath;
    int rc_reduce, rc_gather, rc_mismatch;
    m3_err err;
} comm_arg;

#define CN 1000

static void *comm_thread(void *a) {
    comm_arg *x = a;
    int r = x->c->rank;
    for (int i = 0; i < CN; i++) x->buf[i] = (float)((i * 7 + r * 13) % 17) * 0.1f + 1e-3f * (float)r;
    x->rc_reduce = m3_comm_all_reduce_sum(x->c, x->buf, CN, &x->err);
    float mine[5];
    for (int i = 0; i < 5; i++) mine[i] = (float)(100 * r + i);
    x->rc_gather = m3_comm_all_gather(x->c, mine, 5, x->gath, &x->err);
    x->rc_mismatch = m3_comm_all_reduce_sum(x->c, x->buf, r == 0 ? 3 : 4, &x->err);
    return NULL;
}

static void test_comm(void) {
    for (int n = 1; n <= 3; n++) {
        m3_comm *cs[3];
        m3_err err;
        CHECK(!m3_comm_threads_create(n, cs, &err), "%s", err.msg);
        comm_arg a[3];
        pthread_t th[3];
        for (int r = 0; r < n; r++) {
            memset(&a[r], 0, sizeof a[r]);
            a[r].c = cs[r];
            a[r].n = n;
            a[r].buf = malloc(sizeof(float) * CN);
            a[r].gath = malloc(sizeof(float) * 5 * n);
            pthread_create(&th[r], NULL, comm_thread, &a[r]);
        }
        for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < n; r++) {
            CHECK(a[r].rc_reduce == 0 && a[r].rc_gather == 0, "n %d rank %d: %s", n, r, a[r].err.msg);
            int bad = 0;
            for (int i = 0; i < CN; i++) {
                float s = 0;
                for (int q = 0; q < n; q++) { /* rank order, as the communicator sums */
                    float v = (float)((i * 7 + q * 13) % 17) * 0.1f + 1e-3f * (float)q;
                    s = q ? s + v : v;
                }
                if (memcmp(&s, &a[r].buf[i], 4)) bad++;
            }
            CHECK(!bad, "n %d rank %d: %d sums differ from the rank-order sum", n, r, bad);
            for (int q = 0; q < n; q++)
                for (int i = 0; i < 5; i++) CHECK(a[r].gath[q * 5 + i] == (float)(100 * q + i), "gather n %d rank %d", n, r);
            if (n > 1) CHECK(a[r].rc_mismatch == -1 && strstr(a[r].err.msg, "elements"), "mismatch n %d: %s", n, a[r].err.msg);
            free(a[r].buf);
            free(a[r].gath);
        }
        m3_comm_destroy_all(cs, n);
    }
}

typedef struct { m3_comm *c; int rc; m3_err err; } abort_arg;
static void *abort_waiter(void *p) {
    abort_arg *x = p;
    float v[4] = {1, 2, 3, 4};
    x->rc = m3_comm_all_reduce_sum(x->c, v, 4, &x->err); /* rank 1 never comes: only an abort ends this */
    return NULL;
}

static void test_abort(void) {
    m3_comm *cs[2];
    m3_err err;
    if (m3_comm_threads_create(2, cs, &err)) { CHECK(0, "%s", err.msg); return; }
    abort_arg x = {.c = cs[0]};
    pthread_t th;
    pthread_create(&th, NULL, abort_waiter, &x);
    while (m3_comm_threads_waiting(cs[1]) < 1) sched_yield(); /* rank 0 blocked in the barrier: then abort */
    m3_comm_abort(cs[1]);
    pthread_join(th, NULL);
    CHECK(x.rc == -1 && strstr(x.err.msg, "aborted"), "abort: rc %d '%s'", x.rc, x.err.msg);
    CHECK(!m3_comm_reset(cs[0], &err), "reset: %s", err.msg);
    m3_comm_destroy_all(cs, 2);
}

/* ------------------------------------------------------------------ 2. views */

static void test_views(const char *dir_q) {
    m3_model m;
    m3_err err;
    if (m3_model_load(&m, dir_q, NULL, NULL, NULL, &err)) { CHECK(0, "load %s: %s", dir_q, err.msg); return; }
    const m3_layer_w *L = &m.w.layers[1]; /* MoE layer: MXFP8 attention, NVFP4 experts */
    const m3_linear *mats[3] = {&L->o, &L->experts[0].down, &m.w.lm_head};
    for (int i = 0; i < 3; i++) {
        const m3_linear *W = mats[i];
        int g = W->fmt == M3_WF_MXFP8 ? 32 : W->fmt == M3_WF_NVFP4 ? 16 : 8;
        int k0 = W->K / 2 / g * g, nk = W->K - k0;
        m3_linear v;
        CHECK(!m3_linear_cols(W, k0, nk, &v, "test", &err), "%s: %s", m3_wfmt_name(W->fmt), err.msg);
        float *a = malloc(sizeof(float) * (size_t)W->N * W->K), *b = malloc(sizeof(float) * (size_t)W->N * nk);
        m3_cpu_decode_rows(W, 0, W->N, 0, W->K, a);
        m3_cpu_decode_rows(&v, 0, W->N, 0, nk, b);
        int bad = 0;
        for (int n = 0; n < W->N; n++)
            for (int k = 0; k < nk; k++) bad += a[(size_t)n * W->K + k0 + k] != b[(size_t)n * nk + k];
        CHECK(!bad, "%s column view: %d values differ", m3_wfmt_name(W->fmt), bad);
        CHECK(m3_linear_bytes(&v) < m3_linear_bytes(W), "%s: a view's bytes count its columns", m3_wfmt_name(W->fmt));
        free(a);
        free(b);
        if (W->fmt == M3_WF_MXFP8 || W->fmt == M3_WF_NVFP4) {
            CHECK(m3_linear_cols(W, g / 2, g, &v, "layer 1 thing", &err) && strstr(err.msg, "layer 1 thing") &&
                      strstr(err.msg, "scale group"),
                  "misaligned %s slice: '%s'", m3_wfmt_name(W->fmt), err.msg);
        }
    }
    m3_shard s;
    CHECK(m3_shard_plan(&s, &m.cfg, 0, 3, M3_MOE_EXPERTS, &err) && strstr(err.msg, "query heads"), "tp3 heads: %s", err.msg);
    CHECK(m3_shard_plan(&s, &m.cfg, 0, 16, M3_MOE_EXPERTS, &err) && strstr(err.msg, "query heads"), "tp16: %s", err.msg);
    m3_model_free(&m);
}

/* ------------------------------------------------------------------ 3. the model */

#define P_MAX 200
#define G_STEPS 6

typedef struct {
    int P, V, ni, topk, n_layers;
    float *logits;      /* [P][V] */
    float *glog;        /* [G][V] */
    int32_t gtok[G_STEPS];
    int32_t **sel;      /* [layer] -> [P][ni][topk] */
    int t0;             /* current chunk (taps) */
} result;

static void tap_index(void *arg, int layer, const int32_t *sel, int T, int ni, int topk) {
    result *r = arg;
    if (!r->sel[layer]) r->sel[layer] = calloc((size_t)r->P * ni * topk, sizeof(int32_t));
    if (r->sel[layer]) memcpy(r->sel[layer] + (size_t)r->t0 * ni * topk, sel, sizeof(int32_t) * (size_t)T * ni * topk);
}

static void result_free(result *r) {
    if (r->sel)
        for (int l = 0; l < r->n_layers; l++) free(r->sel[l]);
    free(r->sel);
    free(r->logits);
    free(r->glog);
    memset(r, 0, sizeof *r);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* prompt ids[0..P) in chunks of U, then G_STEPS greedy steps: on m (g NULL) or on the group */
static int run(m3_model *m, m3_group *g, const int32_t *ids, int P, int U, result *res, m3_err *err) {
    const m3_config *c = &m->cfg;
    int V = c->vocab, page = m3_kv_page_tokens(c), pages = (P + G_STEPS + page - 1) / page + 1;
    memset(res, 0, sizeof *res);
    res->P = P; res->V = V; res->ni = c->index_heads; res->topk = c->topk_blocks; res->n_layers = c->n_layers;
    res->logits = malloc(sizeof(float) * (size_t)P * V);
    res->glog = malloc(sizeof(float) * (size_t)G_STEPS * V);
    res->sel = calloc((size_t)c->n_layers, sizeof *res->sel);
    if (!res->logits || !res->glog || !res->sel) return m3_errf(err, "out of memory");
    m3_kv kv, *kvp = &kv;
    if (g) {
        if (m3_group_kv_create(g, M3_KV_F32, M3_KV_F32, page, pages, err)) return -1;
        kvp = m3_group_kv(g, 0);
    } else if (m3_kv_create(&kv, c, M3_KV_F32, M3_KV_F32, page, pages, err)) {
        return -1;
    }
    m3_kv_seq seq = {0};
    m3_kv_seq *seqs[1] = {&seq};
    int32_t pos[P_MAX], sq[P_MAX] = {0};
    int rows[P_MAX], rc = 0;
    m3_taps taps = {.arg = res, .index = tap_index};
    for (int t0 = 0; t0 < P && !rc; t0 += U) {
        int n = P - t0 < U ? P - t0 : U;
        for (int i = 0; i < n; i++) { pos[i] = t0 + i; rows[i] = i; }
        m3_batch b = {n, pos, sq, seqs};
        res->t0 = t0;
        rc = g ? m3_group_forward(g, &b, ids + t0, rows, n, res->logits + (size_t)t0 * V, &taps, err)
               : m3_forward(m, kvp, &b, ids + t0, rows, n, res->logits + (size_t)t0 * V, &taps, err);
    }
    const float *last = res->logits + (size_t)(P - 1) * V;
    for (int i = 0; i < G_STEPS && !rc; i++) {
        res->gtok[i] = argmax(last, V);
        int32_t p = P + i, s0 = 0;
        int r0 = 0;
        m3_batch b = {1, &p, &s0, seqs};
        rc = g ? m3_group_forward(g, &b, &res->gtok[i], &r0, 1, res->glog + (size_t)i * V, NULL, err)
               : m3_forward(m, kvp, &b, &res->gtok[i], &r0, 1, res->glog + (size_t)i * V, NULL, err);
        last = res->glog + (size_t)i * V;
    }
    m3_kv_seq_release(kvp, &seq);
    if (!g) m3_kv_destroy(&kv);
    return rc;
}

static double rel_l2(const float *a, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) { double d = (double)a[i] - ref[i]; num += d * d; den += (double)ref[i] * ref[i]; }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int cmp_i32(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

/* worst relative L2 over prompt and greedy rows; counts mismatched tokens / index rows */
static double compare(const result *a, const result *ref, const m3_config *c, int *tok_bad, int *idx_bad) {
    double worst = 0;
    for (int t = 0; t < ref->P; t++) {
        double e = rel_l2(a->logits + (size_t)t * ref->V, ref->logits + (size_t)t * ref->V, ref->V);
        if (!(e <= worst)) worst = e;
    }
    *tok_bad = 0;
    for (int i = 0; i < G_STEPS; i++) {
        if (a->gtok[i] != ref->gtok[i]) (*tok_bad)++;
        double e = rel_l2(a->glog + (size_t)i * ref->V, ref->glog + (size_t)i * ref->V, ref->V);
        if (!(e <= worst)) worst = e;
    }
    *idx_bad = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layer_sparse[l]) continue;
        if (!a->sel[l] || !ref->sel[l]) { (*idx_bad)++; continue; }
        int k = ref->topk;
        for (size_t row = 0; row < (size_t)ref->P * ref->ni; row++) {
            int32_t x[64], y[64];
            memcpy(x, a->sel[l] + row * k, sizeof(int32_t) * k);
            memcpy(y, ref->sel[l] + row * k, sizeof(int32_t) * k);
            qsort(x, k, 4, cmp_i32);
            qsort(y, k, 4, cmp_i32);
            if (memcmp(x, y, sizeof(int32_t) * k)) (*idx_bad)++;
        }
    }
    return worst;
}

static int ops_init(void *arg, int rank, m3_ops *ops, m3_comm *comm, m3_err *err) {
    (void)arg; (void)rank; (void)comm;
    return m3_cpu_ops_init(ops, 1, err);
}
static void ops_free(void *arg, int rank, m3_ops *ops) { (void)arg; (void)rank; m3_cpu_ops_free(ops); }

static m3_group *make_group(m3_model *full, int n, m3_moe_split moe, m3_comm **cs, m3_err *err) {
    if (m3_comm_threads_create(n, cs, err)) return NULL;
    m3_group_opts o = {n, moe, cs, ops_init, ops_free, NULL, NULL};
    m3_group *g = m3_group_create(full, &o, err);
    if (!g) m3_comm_destroy_all(cs, n);
    return g;
}

static int ran_tp2;

static void test_model(const char *data, const char *name, int P, int U) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", data, name);
    m3_err err;
    m3_ops ops;
    if (m3_cpu_ops_init(&ops, 1, &err)) { CHECK(0, "%s", err.msg); return; }
    m3_model m;
    if (m3_model_load(&m, dir, &ops, NULL, NULL, &err)) { CHECK(0, "load %s: %s", dir, err.msg); m3_cpu_ops_free(&ops); return; }
    int32_t ids[P_MAX];
    uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)P;
    for (int i = 0; i < P; i++) { s = s * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int32_t)((s >> 33) % (uint64_t)m.cfg.vocab); }
    result ref;
    if (run(&m, NULL, ids, P, U, &ref, &err)) { CHECK(0, "%s TP1: %s", name, err.msg); goto out; }
    m3_model host; /* the group's full model: host weights only, as the CLI loads it */
    if (m3_model_load(&host, dir, NULL, NULL, NULL, &err)) { CHECK(0, "%s: %s", name, err.msg); result_free(&ref); goto out; }
    const int sizes[3] = {1, 2, 4};
    for (int si = 0; si < 3; si++)
        for (int mo = 0; mo < 2; mo++) {
            int n = sizes[si];
            m3_moe_split moe = mo ? M3_MOE_WIDTH : M3_MOE_EXPERTS;
            m3_comm *cs[4];
            m3_group *g = make_group(&host, n, moe, cs, &err);
            if (!g) {
                printf("  %-9s TP%d %-7s skipped: %s\n", name, n, m3_moe_split_name(moe), err.msg);
                continue;
            }
            result r;
            if (run(&host, g, ids, P, U, &r, &err)) {
                CHECK(0, "%s TP%d %s: %s", name, n, m3_moe_split_name(moe), err.msg);
            } else {
                int tb, ib;
                double e = compare(&r, &ref, &m.cfg, &tb, &ib);
                int bitwise = n == 1 && !memcmp(r.logits, ref.logits, sizeof(float) * (size_t)P * ref.V) &&
                              !memcmp(r.glog, ref.glog, sizeof(float) * (size_t)G_STEPS * ref.V);
                printf("  %-9s TP%d %-7s max rel L2 %.2e, greedy tokens %s, index rows differing %d%s\n", name, n,
                       m3_moe_split_name(moe), e, tb ? "DIFFER" : "equal", ib, n == 1 ? (bitwise ? " (bitwise equal)" : " (NOT bitwise)") : "");
                CHECK(e <= TOL, "%s TP%d %s: max rel L2 %.3g > %.0e", name, n, m3_moe_split_name(moe), e, TOL);
                CHECK(!tb, "%s TP%d %s: %d greedy tokens differ", name, n, m3_moe_split_name(moe), tb);
                CHECK(!ib, "%s TP%d %s: %d index rows differ", name, n, m3_moe_split_name(moe), ib);
                if (n == 1) CHECK(bitwise, "%s: a group of one differs from m3_forward", name);
                if (n == 2) ran_tp2++;
            }
            result_free(&r);
            m3_group_free(g);
            m3_comm_destroy_all(cs, n);
        }
    m3_model_free(&host);
    result_free(&ref);
out:
    m3_model_free(&m);
    m3_cpu_ops_free(&ops);
}

/* ------------------------------------------------------------------ 4. failures */

/* rank 1 fails at once; rank 0 waits in an all-reduce that rank 1 never joins */
static int fail_fn(void *arg, int rank, m3_model *m, m3_kv *kv, m3_err *err) {
    (void)arg; (void)kv;
    if (rank == 1) return m3_errf(err, "injected failure");
    float v[8] = {0};
    return m3_comm_all_reduce_sum(m->comm, v, 8, err);
}

static void test_failure(const char *data) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/m3-tiny", data);
    m3_err err;
    m3_model host;
    if (m3_model_load(&host, dir, NULL, NULL, NULL, &err)) { CHECK(0, "%s", err.msg); return; }
    m3_comm *cs[2];
    m3_group *g = make_group(&host, 2, M3_MOE_EXPERTS, cs, &err);
    if (!g) { CHECK(0, "%s", err.msg); m3_model_free(&host); return; }
    CHECK(m3_group_run(g, fail_fn, NULL, &err) == -1 && strstr(err.msg, "rank 1 of 2: injected failure"), "failure: '%s'", err.msg);
    /* usable again: a step after the failure */
    result r;
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK(!run(&host, g, ids, 8, 8, &r, &err), "step after a failure: %s", err.msg);
    result_free(&r);
    int32_t bad = 5000;
    int32_t p = 0, s0 = 0;
    int r0 = 0;
    m3_kv_seq seq = {0};
    m3_kv_seq *seqs[1] = {&seq};
    m3_batch b = {1, &p, &s0, seqs};
    CHECK(m3_group_forward(g, &b, &bad, &r0, 1, NULL, NULL, &err) == -1 && strstr(err.msg, "out of range"), "bad id: '%s'", err.msg);
    m3_group_free(g);
    m3_comm_destroy_all(cs, 2);
    m3_model_free(&host);
}

/* m3_weights_shapes at the M3.1-Flash shapes (what `m3 bench --random-weights -tp N` builds
 * each rank's device weights from) and the ranks' views of it: every matrix split as the
 * plan says, the split bytes adding up to the whole, experts held or absent by rank */
static void test_shapes(const char *data) {
    char path[512];
    snprintf(path, sizeof path, "%s/m3.1-flash-shapes.json", data);
    m3_config c;
    m3_err err;
    if (m3_config_load(&c, path, &err)) { CHECK(0, "%s", err.msg); return; }
    m3_weights full;
    if (m3_weights_shapes(&full, &c, 4, &err)) { CHECK(0, "%s", err.msg); m3_config_free(&c); return; }
    CHECK(full.n_layers == 4 && full.layers[0].q.N == c.n_heads * c.head_dim && full.layers[0].q.fmt == M3_WF_MXFP8 &&
              full.lm_head.fmt == M3_WF_BF16 && full.lm_head.N == c.vocab, "shapes: layer 0 q %d x %d", full.layers[0].q.N,
          full.layers[0].q.K);
    int moe_l = -1;
    for (int l = 0; l < 4; l++) if (full.layers[l].moe) { moe_l = l; break; }
    CHECK(moe_l >= 0 && full.layers[moe_l].experts[0].gate.fmt == M3_WF_NVFP4, "shapes: an NVFP4 MoE layer among the first 4");
    if (moe_l < 0) { m3_weights_free(&full); m3_config_free(&c); return; }
    const m3_layer_w *F = &full.layers[moe_l];
    for (int split = 0; split < 2; split++)
        for (int n = 2; n <= 4; n *= 2) {
            double qb = 0, ob = 0, eb = 0, lb = 0;
            int held = 0;
            for (int r = 0; r < n; r++) {
                m3_shard s;
                m3_weights v;
                if (m3_shard_plan(&s, &c, r, n, split ? M3_MOE_WIDTH : M3_MOE_EXPERTS, &err) ||
                    m3_shard_weights(&full, &c, &s, &v, &err)) {
                    CHECK(0, "tp%d rank %d: %s", n, r, err.msg);
                    continue;
                }
                const m3_layer_w *L = &v.layers[moe_l];
                CHECK(L->q.N == c.n_heads * c.head_dim / n && L->o.K == c.n_heads * c.head_dim / n && L->o.N == c.hidden,
                      "tp%d rank %d: q %d rows, o %d columns", n, r, L->q.N, L->o.K);
                qb += (double)m3_linear_bytes(&L->q);
                ob += (double)m3_linear_bytes(&L->o);
                lb += (double)m3_linear_bytes(&v.lm_head);
                for (int e = 0; e < c.n_experts; e++) {
                    if (!L->experts[e].gate.w) continue;
                    held++;
                    eb += (double)(m3_linear_bytes(&L->experts[e].gate) + m3_linear_bytes(&L->experts[e].down));
                    CHECK(split ? L->experts[e].gate.N == c.moe_inter / n && L->experts[e].down.K == c.moe_inter / n
                                : L->experts[e].gate.N == c.moe_inter && e >= s.expert0 && e < s.expert0 + s.n_experts,
                          "tp%d %s rank %d expert %d: gate %d rows", n, split ? "width" : "experts", r, e, L->experts[e].gate.N);
                }
                m3_shard_weights_free(&v);
            }
            double fe = (double)c.n_experts * (double)(m3_linear_bytes(&F->experts[0].gate) + m3_linear_bytes(&F->experts[0].down));
            CHECK(qb == (double)m3_linear_bytes(&F->q) && ob == (double)m3_linear_bytes(&F->o) &&
                      lb == (double)m3_linear_bytes(&full.lm_head) && eb == fe &&
                      held == (split ? n * c.n_experts : c.n_experts),
                  "tp%d %s: the ranks' bytes add up to the whole (q %.0f/%.0f, experts %.0f/%.0f, %d held)", n,
                  split ? "width" : "experts", qb, (double)m3_linear_bytes(&F->q), eb, fe, held);
        }
    m3_weights_free(&full);
    m3_config_free(&c);
}

int main(int argc, char **argv) {
    const char *data = argc > 1 ? argv[1] : "tests/data";
    char q[512];
    test_comm();
    test_abort();
    snprintf(q, sizeof q, "%s/m3-tiny-q", data);
    test_views(q);
    test_shapes(data);
    test_failure(data);
    /* prompt length and chunk: past several index blocks (16 tokens; 128 for m3-wide-q) and pages */
    test_model(data, "m3-tiny", 100, 37);
    test_model(data, "m3-tiny-q", 100, 37);
    test_model(data, "m3-gqa3", 90, 41);
    test_model(data, "m3-gqa3-q", 90, 41);
    test_model(data, "m3-mqa", 90, 41);
    test_model(data, "m3-mqa-q", 90, 41);
    test_model(data, "m3-wide-q", 160, 64);
    CHECK(ran_tp2 >= 10, "only %d TP2 runs (expected both MoE splits of m3-tiny, m3-tiny-q, m3-gqa3, m3-mqa, m3-mqa-q, m3-wide-q)", ran_tp2);
    if (failures) { fprintf(stderr, "test_tp: %d failure(s)\n", failures); return 1; }
    printf("test_tp: ok\n");
    return 0;
}
