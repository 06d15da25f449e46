/* The draft-draw op (ops.h draw_rows) on the CPU, the rule's reference:
 *   1. its distributions against the sampler's (m3_sampler_probs) on random rows at V = 200064
 *      and V = 1000: temperature, top-k, top-p, min-p and text ids alone and together; the same
 *      kept ids, every probability within 2e-5 relative;
 *   2. its draws: for uniforms on a grid, the id whose stretch of the running sum holds u, and
 *      the share of a fine grid each id gets equals its probability (within the grid's step);
 *   3. ties at a cut settled as the sampler settles them (the lower ids first): rows of few
 *      distinct values against m3_sampler_probs; top-k 2 over 5, 3, 3, 3 keeps 5 and the first 3;
 *   4. greedy rows, non-finite rows and ids past n: one-hot at argmax_rows' index, nothing past n.
 * Usage: test_draw_rows (no data needed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/ops.h"
#include "base/rows.h"
#include "engine/sampler.h"

#include "../check.h"
#include "logit_rows.h"

static m3_ops OPS;

static int32_t run_op(float *x, int V, m3_draw_param p) {
    int32_t out = -1;
    OPS.draw_rows(OPS.ctx, x, 1, V, (size_t)V, &p, &out);
    return out;
}

/* the id whose stretch of the running sum of q holds u * sum(q); -2 when u is within tol of a
 * boundary (either answer is right there) */
static int32_t expect_draw(const float *q, int V, double u, double tol) {
    double tot = 0;
    for (int i = 0; i < V; i++) tot += q[i];
    const double x = u * tot;
    double acc = 0;
    int last = -1;
    for (int i = 0; i < V; i++) {
        if (!(q[i] > 0)) continue;
        if (fabs(x - acc) < tol * tot) return -2;
        acc += q[i];
        last = i;
        if (x < acc) return i;
    }
    return last;
}

static int QUANT; /* nonzero: logits rounded to multiples of 1/QUANT (ties everywhere) */

static void check_against_sampler(int V, uint64_t seed, double sd, double lift, float T, int top_k, float top_p, float min_p, int n_text) {
    float *x = malloc(sizeof(float) * (size_t)V), *lg = malloc(sizeof(float) * (size_t)V), *prob = malloc(sizeof(float) * (size_t)V);
    m3_err err;
    m3_sample_ws *ws = m3_sample_ws_create(V, &err);
    m3_sampling sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = T;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.min_p = min_p;
    sp.n_text = n_text;
    m3_sampler *s = ws ? m3_sampler_create(&sp, V, NULL, 0, &err) : NULL;
    CHECK(x && lg && prob && s, "setup: %s", err.msg);
    if (!x || !lg || !prob || !s) goto out;
    uint64_t st = seed;
    fill_row(lg, V, &st, sd, lift);
    for (int i = 0; QUANT && i < V; i++) lg[i] = roundf(lg[i] * QUANT) / QUANT;
    CHECK(m3_sampler_probs(s, lg, ws, prob, &err) == 0, "%s", err.msg);
    m3_draw_param p;
    CHECK(m3_sampler_plain_params(s, NULL, 0, &p.temperature, &p.top_k, &p.top_p, &p.min_p, &p.n), "a plain sampler");
    int bad_set = 0, bad_val = 0, n_kept = 0;
    double worst = 0;
    for (int t = 0; t < 5; t++) {
        memcpy(x, lg, sizeof(float) * (size_t)V);
        p.u = t / 5.0 + 0.0371;
        const int32_t id = run_op(x, V, p);
        for (int i = 0; t == 0 && i < V; i++) {
            n_kept += x[i] > 0;
            if ((x[i] > 0) != (prob[i] > 0)) { bad_set++; continue; }
            if (prob[i] > 0) {
                const double rel = fabs((double)x[i] - prob[i]) / prob[i];
                if (rel > worst) worst = rel;
                bad_val += rel > 2e-5;
            }
        }
        const int32_t want = expect_draw(x, V, p.u, 1e-9);
        CHECK(want == -2 || id == want, "V %d T %g k %d p %g min-p %g: u %g drew %d, the running sum says %d", V, T, top_k,
              top_p, min_p, p.u, id, want);
        CHECK(id >= 0 && id < (n_text ? n_text : V) && x[id] > 0, "drew %d, probability %g", id, id >= 0 && id < V ? x[id] : -1);
    }
    CHECK(!bad_set && !bad_val, "V %d T %g k %d p %g min-p %g n %d: %d ids kept by one side only, %d probabilities off (worst rel %.2e)",
          V, T, top_k, top_p, min_p, n_text, bad_set, bad_val, worst);
    printf("1. V %6d T %.1f top-k %4d top-p %.2f min-p %.2f n %6d%s: %6d kept, as the sampler's (worst rel %.1e)\n", V, T, top_k,
           top_p, min_p, n_text ? n_text : V, QUANT ? " (ties)" : "", n_kept, worst);
out:
    m3_sampler_free(s);
    m3_sample_ws_free(ws);
    free(x);
    free(lg);
    free(prob);
}

/* a fine grid of uniforms: each id's share of the grid is its probability */
static void test_draw_shares(void) {
    enum { V = 64, G = 200000 };
    float lg[V], x[V], q[V];
    uint64_t s77 = 77;
    fill_row(lg, V, &s77, 1.0, 2.0);
    m3_draw_param p = {1.1f, 0.95f, 0.01f, 20, V - 4, 0};
    memcpy(q, lg, sizeof lg);
    run_op(q, V, p);
    static int cnt[V];
    for (int g = 0; g < G; g++) {
        memcpy(x, lg, sizeof lg);
        p.u = (g + 0.5) / G;
        const int32_t id = run_op(x, V, p);
        if (id >= 0 && id < V) cnt[id]++;
    }
    double worst = 0;
    int kept = 0;
    for (int i = 0; i < V; i++) {
        const double d = fabs((double)cnt[i] / G - q[i]);
        if (d > worst) worst = d;
        kept += q[i] > 0;
        CHECK(q[i] > 0 || cnt[i] == 0, "id %d of probability 0 drawn %d times", i, cnt[i]);
    }
    CHECK(worst <= 2.0 / G, "a share of the grid off its probability by %g", worst);
    printf("2. draws over a grid of %d uniforms: every id's share within %.1e of its probability (%d kept)\n", G, worst, kept);
}

static void test_ties_and_edges(void) {
    enum { V = 16 };
    float x[V];
    /* top-k 2 over 5, 3, 3, 3: 5 and the first 3 */
    for (int i = 0; i < V; i++) x[i] = -2;
    x[7] = 5;
    x[2] = x[9] = x[12] = 3;
    m3_draw_param p = {1.0f, 1.0f, 0, 2, V, 0.5};
    run_op(x, V, p);
    int kept = 0;
    for (int i = 0; i < V; i++) kept += x[i] > 0;
    CHECK(kept == 2 && x[2] > 0 && x[7] > x[2], "top-k 2 with ties kept %d", kept);
    /* top-k 1: the argmax (the first of equals) */
    for (int i = 0; i < V; i++) x[i] = (float)(i % 5);
    p = (m3_draw_param){0.9f, 1.0f, 0, 1, V, 0.99};
    int32_t id = run_op(x, V, p);
    CHECK(id == 4 && x[4] == 1.0f, "top-k 1 drew %d", id);
    /* greedy: one-hot at the first largest; ids past n never */
    for (int i = 0; i < V; i++) x[i] = (float)(i % 5);
    p = (m3_draw_param){0.0f, 1.0f, 0, 0, V, 0.3};
    id = run_op(x, V, p);
    CHECK(id == 4 && x[4] == 1.0f && x[9] == 0 && x[14] == 0, "greedy drew %d", id);
    for (int i = 0; i < V; i++) x[i] = (float)i;
    p = (m3_draw_param){1.0f, 1.0f, 0, 0, 10, 0.999999};
    id = run_op(x, V, p);
    CHECK(id < 10, "drew %d past n = 10", id);
    for (int i = 10; i < V; i++) CHECK(x[i] == 0, "id %d past n has probability %g", i, x[i]);
    /* non-finite: a +inf value takes everything, a NaN at 0 gives 0 (argmax_rows' rule), -inf rows 0 */
    for (int i = 0; i < V; i++) x[i] = 0;
    x[5] = INFINITY;
    p = (m3_draw_param){1.0f, 0.9f, 0.1f, 3, V, 0.7};
    id = run_op(x, V, p);
    CHECK(id == 5 && x[5] == 1.0f, "a +inf row drew %d", id);
    for (int i = 0; i < V; i++) x[i] = (float)i;
    x[0] = NAN;
    id = run_op(x, V, p);
    CHECK(id == 0 && x[0] == 1.0f, "a NaN at 0 drew %d", id);
    for (int i = 0; i < V; i++) x[i] = -INFINITY;
    id = run_op(x, V, p);
    CHECK(id == 0 && x[0] == 1.0f, "a row of -inf drew %d", id);
    /* NaN elsewhere is never kept */
    for (int i = 0; i < V; i++) x[i] = 1;
    x[3] = NAN;
    p = (m3_draw_param){1.0f, 1.0f, 0, 0, V, 0.2};
    run_op(x, V, p);
    CHECK(x[3] == 0 && fabsf(x[4] - 1.0f / (V - 1)) < 1e-7f, "NaN kept: %g, others %g", x[3], x[4]);
    /* several rows in one call: each its own parameters */
    float y[3 * V];
    m3_draw_param ps[3] = {{0, 1, 0, 0, V, 0}, {1, 1, 0, 1, V, 0.5}, {2, 0.5f, 0, 0, V, 0.25}};
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < V; i++) y[r * V + i] = (float)((i * 7 + r) % V);
    int32_t outs[3];
    OPS.draw_rows(OPS.ctx, y, 3, V, V, ps, outs);
    for (int r = 0; r < 3; r++) {
        float z[V];
        for (int i = 0; i < V; i++) z[i] = (float)((i * 7 + r) % V);
        const int32_t one = run_op(z, V, ps[r]);
        CHECK(one == outs[r] && !memcmp(z, y + r * V, sizeof z), "row %d of three: %d, alone %d", r, outs[r], one);
    }
    printf("3-4. ties at a cut settled, greedy / non-finite / past-n rows, three rows in one call: done\n");
}

int main(void) {
    m3_err err;
    if (m3_cpu_ops_init(&OPS, 1, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    CHECK(OPS.draw_rows != NULL, "the CPU backend has no draw_rows");
    const int BIG = 200064;
    /* peaked rows (a few ids far above a floor) and flat ones (a wide floor) */
    check_against_sampler(BIG, 1, 2.0, 12, 1.0f, 0, 1.0f, 0, 0);
    check_against_sampler(BIG, 2, 1.0, 3, 0.7f, 0, 0.9f, 0, 0);
    check_against_sampler(BIG, 3, 1.5, 4, 1.3f, 40, 1.0f, 0, 0);
    check_against_sampler(BIG, 4, 1.0, 4, 1.0f, 5000, 0.95f, 0.0f, 0);
    check_against_sampler(BIG, 5, 2.0, 12, 0.8f, 0, 0.5f, 0.05f, 0);
    check_against_sampler(BIG, 6, 1.5, 6, 1.0f, 50, 0.8f, 0.02f, BIG - 64);
    check_against_sampler(BIG, 7, 1.0, 2, 2.0f, 0, 0.99f, 0, 0);
    check_against_sampler(BIG, 8, 1.0, 3, 1.0f, 0, 1.0f, 0.3f, 0);
    check_against_sampler(BIG, 12, 1.0, 3, 0.6f, 0, 0.9f, 1e-4f, 0);
    check_against_sampler(BIG, 13, 0.5, 1, 1.0f, 100000, 0.5f, 0, 0);
    check_against_sampler(1000, 9, 1.0, 3, 1.0f, 0, 0.9f, 0, 0);
    check_against_sampler(1000, 10, 1.0, 3, 0.5f, 7, 1.0f, 0, 990);
    check_against_sampler(1000, 11, 1.0, 3, 1.5f, 999, 0.97f, 0.001f, 0);
    QUANT = 4; /* ties at every cut: the sampler's rule (the lower ids first) */
    check_against_sampler(BIG, 14, 1.0, 3, 1.0f, 40, 1.0f, 0, 0);
    check_against_sampler(BIG, 15, 1.0, 3, 1.0f, 0, 0.9f, 0, 0);
    check_against_sampler(BIG, 16, 1.5, 6, 0.8f, 300, 0.7f, 0.01f, 0);
    check_against_sampler(1000, 17, 1.0, 3, 1.0f, 10, 0.5f, 0, 0);
    QUANT = 0;
    test_draw_shares();
    test_ties_and_edges();
    m3_cpu_ops_free(&OPS);
    if (failures) { printf("%d checks failed\n", failures); return 1; }
    printf("all draw_rows checks passed\n");
    return 0;
}
