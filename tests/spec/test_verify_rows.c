/* DSpark's verification where the rows are (ops.h verify_rows) on the CPU, the rule's reference:
 *   1. groups of drawn rows in one call (k 0..7, probabilistic and one-hot q, V 1000 and 200064):
 *      each draft accepted exactly when p(d) > 0 and u q(d) < p(d), accepted ids written as
 *      drafts, the first rejection's id never its draft and where the running sum of max(p - q, 0)
 *      (summed here in double) puts u * total; the rows after it untouched, the bonus kept when
 *      every draft passes; a residual with no mass left (p = q but at d) draws from p without d;
 *   2. the pipeline the engine runs (draw_rows on the target's rows, the bonus drawn with u[k],
 *      then verify_rows), repeated with drafts drawn from q: the first, second and third tokens
 *      emitted are distributed as p_0, p_1, p_2 (chi-square), acceptance as sum min(p, q); with
 *      a q the drafts were not drawn from, the chi-square fails (the test has power);
 *   3. m3_sampler_peek_uniforms gives the uniforms m3_sampler_uniform then gives, and
 *      m3_sampler_skip_uniforms takes them.
 * Usage: test_verify_rows (no data needed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/ops.h"
#include "engine/sampler.h"
#include "engine/spec.h"

#include "../check.h"
#include "logit_rows.h"

static m3_ops OPS;

/* the id where the running sum of max(p - q, 0) (fb: p without d), summed in double, holds
 * u * total; -2 when within tol of a stretch's end (either neighbour is right), -1: no mass */
static int32_t expect_residual(const float *p, const float *q, int32_t d, int V, int fb, double u, double *total_out) {
    double tot = 0;
    for (int i = 0; i < V; i++) {
        const double w = fb ? (i == d ? 0 : p[i]) : (double)p[i] - (q ? q[i] : i == d ? 1.0 : 0.0);
        if (w > 0) tot += w;
    }
    *total_out = tot;
    if (!(tot > 0)) return -1;
    const double x = u * tot, tol = 1e-9 * tot + (double)V * 0x1.0p-40;
    double acc = 0;
    for (int i = 0; i < V; i++) {
        const double w = fb ? (i == d ? 0 : p[i]) : (double)p[i] - (q ? q[i] : i == d ? 1.0 : 0.0);
        if (!(w > 0)) continue;
        if (fabs(x - acc) < tol || fabs(x - acc - w) < tol) return -2;
        acc += w;
        if (x < acc) return i;
    }
    return -2;
}

/* ---- 1: the rule, group by group ---- */

static void test_rule(int V, int n_groups, uint64_t seed) {
    enum { K = 7 };
    const size_t ld = (size_t)V + 3; /* rows need not be packed */
    int rows = 0;
    m3_verify_group *g = calloc((size_t)n_groups, sizeof *g);
    int ks[64];
    uint64_t s = seed;
    for (int j = 0; j < n_groups; j++) {
        ks[j] = j < 2 ? j * K : (int)(urand(&s) * (K + 1)); /* a k of 0 and a k of K at least */
        rows += ks[j] + 1;
    }
    float *x = malloc(sizeof(float) * ld * (size_t)rows), *qs = malloc(sizeof(float) * (size_t)n_groups * K * (size_t)V);
    int32_t *out = malloc(sizeof(int32_t) * (size_t)rows), *bonus = malloc(sizeof(int32_t) * (size_t)rows);
    if (!g || !x || !qs || !out || !bonus) { CHECK(0, "oom"); goto done; }
    int r0 = 0;
    for (int j = 0; j < n_groups; j++) {
        m3_verify_group *G = &g[j];
        G->row0 = r0;
        G->k = ks[j];
        const int one_hot = j % 5 == 4;
        float *q = qs + (size_t)j * K * V;
        G->q = one_hot ? NULL : q;
        /* the target's rows and the draft's (close to them for some groups: acceptances), as
         * draw_rows makes distributions of them */
        const double close = j % 3 == 0 ? 0.0 : j % 3 == 1 ? 0.3 : 3.0;
        for (int i = 0; i <= G->k; i++) {
            float *p = x + (size_t)(r0 + i) * ld;
            fill_row(p, V, &s, 1.5, 10);
            m3_draw_param pp = {1.0f, 0.95f, 0, 0, V, urand(&s)};
            if (i < G->k) {
                for (int t = 0; t < V; t++) q[(size_t)i * V + t] = p[t] + (float)(close * (urand(&s) - 0.5));
                m3_draw_param pq = {1.2f, 0.98f, 0, j % 2 ? 40 : 0, V, urand(&s)};
                int32_t di;
                OPS.draw_rows(OPS.ctx, q + (size_t)i * V, 1, V, (size_t)V, &pq, &di);
                G->d[i] = di; /* drawn from q */
                if (one_hot) { /* greedy drafting: the argmax of the draft's distribution */
                    int a = 0;
                    for (int t = 1; t < V; t++)
                        if (q[(size_t)i * V + t] > q[(size_t)i * V + a]) a = t;
                    G->d[i] = a;
                }
            }
            OPS.draw_rows(OPS.ctx, p, 1, V, ld, &pp, &bonus[r0 + i]);
        }
        for (int i = 0; i <= G->k; i++) G->u[i] = urand(&s);
        r0 += G->k + 1;
    }
    /* a residual with no mass left: p = q except a hair less at d, a uniform just below 1 */
    {
        m3_verify_group *G = &g[1];
        float *q = qs + (size_t)1 * K * V;
        const float *p = x + (size_t)G->row0 * ld;
        int32_t d = 0;
        for (int t = 1; t < V; t++)
            if (p[t] > p[d]) d = t;
        memcpy(q, p, sizeof(float) * (size_t)V);
        q[d] = nextafterf(p[d], 2.0f);
        G->d[0] = d;
        G->u[0] = 1 - 0x1.0p-40;
        G->q = q;
    }
    for (int i = 0; i < rows; i++) out[i] = -7;
    for (int j = 0; j < n_groups; j++) out[g[j].row0 + g[j].k] = bonus[g[j].row0 + g[j].k];
    OPS.verify_rows(OPS.ctx, x, V, ld, n_groups, g, out);
    int n_acc = 0, n_rej = 0, n_fb = 0, n_all = 0, n_edge = 0;
    for (int j = 0; j < n_groups; j++) {
        const m3_verify_group *G = &g[j];
        int i = 0;
        for (; i < G->k; i++) {
            const float *p = x + (size_t)(G->row0 + i) * ld, *q = G->q ? G->q + (size_t)i * V : NULL;
            const int32_t d = G->d[i];
            const int acc = m3_spec_accept(p[d], q ? q[d] : 1.0, G->u[i]);
            const int32_t o = out[G->row0 + i];
            if (acc) {
                CHECK(o == d, "V %d group %d draft %d: accepted (p %g, q %g, u %g) but out %d, draft %d", V, j, i, p[d],
                      q ? q[d] : 1.0, G->u[i], o, d);
                n_acc++;
                continue;
            }
            n_rej++;
            CHECK(o != d && o >= 0 && o < V, "V %d group %d draft %d: rejected, out %d (the draft %d)", V, j, i, o, d);
            double tot;
            int fb = 0;
            int32_t want = expect_residual(p, q, d, V, 0, G->u[i + 1], &tot);
            if (want == -1 || tot < (double)V * 0x1.0p-40) { /* no residual mass (within the units' rounding) */
                fb = 1;
                n_fb++;
                want = expect_residual(p, q, d, V, 1, G->u[i + 1], &tot);
            }
            n_edge += want == -2;
            CHECK(want == -2 || o == want, "V %d group %d draft %d: residual%s drew %d, the running sum says %d", V, j, i,
                  fb ? " (no mass: p without d)" : "", o, want);
            if (o >= 0 && o < V && !fb) CHECK(p[o] > (q ? q[o] : 0.0f), "residual %d: p %g <= q %g", o, p[o], q ? q[o] : 0.0f);
            break;
        }
        if (i == G->k) {
            n_all++;
            CHECK(out[G->row0 + G->k] == bonus[G->row0 + G->k], "group %d: every draft accepted but the bonus changed", j);
        }
        for (int t = i + 1; t <= G->k; t++) /* past the rejection: as they were (the bonus row too) */
            CHECK(out[G->row0 + t] == (t == G->k ? bonus[G->row0 + t] : -7), "group %d row %d past the rejection written", j, t);
    }
    CHECK(n_fb >= 1 && n_rej > 0 && n_acc > 0 && n_all > 0, "V %d: coverage: %d accepted, %d rejected, %d with no residual mass, "
          "%d groups all accepted", V, n_acc, n_rej, n_fb, n_all);
    printf("1. V %6d, %d groups in one call: %d drafts accepted, %d rejected (%d with no residual mass left), %d groups "
           "all accepted: as the rule says (%d draws within rounding of a boundary)\n", V, n_groups, n_acc, n_rej, n_fb, n_all,
           n_edge);
done:
    free(g);
    free(x);
    free(qs);
    free(out);
    free(bonus);
}

/* ---- 2: the engine's pipeline, distribution of what is emitted ---- */

static int chi_ok(const double *p, const long *cnt, int n, long N, double *stat, int *df) {
    double s = 0, pe = 0, pc = 0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        const double e = p[i] * N;
        if (e < 5) {
            pe += e;
            pc += cnt[i];
            if (cnt[i] && p[i] == 0) return *stat = INFINITY, *df = 0, 0;
            continue;
        }
        s += (cnt[i] - e) * (cnt[i] - e) / e;
        bins++;
    }
    if (pe > 0) { s += (pc - pe) * (pc - pe) / pe; bins++; }
    const int k = bins - 1 > 0 ? bins - 1 : 1;
    const double z = 3.0902; /* 99.9% */
    *stat = s;
    *df = k;
    return s < k * pow(1 - 2.0 / (9 * k) + z * sqrt(2.0 / (9 * k)), 3);
}

static void test_pipeline(int greedy_drafts) {
    enum { V = 12, K = 2, N = 200000 };
    uint64_t s = 4242 + (uint64_t)greedy_drafts;
    float lg[K + 1][V], pt[K + 1][V], q[K][V], quni[K][V];
    m3_draw_param par = {0.8f, 0.9f, 0.0f, 9, V, 0};
    for (int i = 0; i <= K; i++) {
        fill_row(lg[i], V, &s, 1.2, 0);
        memcpy(pt[i], lg[i], sizeof pt[i]);
        int32_t dummy;
        OPS.draw_rows(OPS.ctx, pt[i], 1, V, V, &par, &dummy); /* the target's p_i */
    }
    for (int i = 0; i < K; i++) { /* the draft's q_i: another distribution, some ids never proposed */
        double qs = 0;
        for (int t = 0; t < V; t++) {
            q[i][t] = t % 5 == 3 ? 0.0f : expf((float)(1.2 * (urand(&s) - 0.5)) + 0.5f * lg[i][t]);
            qs += q[i][t];
        }
        for (int t = 0; t < V; t++) {
            q[i][t] = (float)(q[i][t] / qs);
            quni[i][t] = 1.0f / V;
        }
    }
    int32_t gd[K];
    for (int i = 0; i < K; i++) {
        gd[i] = 0;
        for (int t = 1; t < V; t++)
            if (q[i][t] > q[i][gd[i]]) gd[i] = t;
    }
    for (int wrong = 0; wrong < (greedy_drafts ? 1 : 2); wrong++) {
        static long cnt[K + 1][V];
        memset(cnt, 0, sizeof cnt);
        long n_at[K + 1] = {0}, acc0 = 0;
        for (long t = 0; t < N; t++) {
            float x[(K + 1) * V];
            memcpy(x, lg, sizeof x);
            m3_verify_group G;
            memset(&G, 0, sizeof G);
            G.k = K;
            G.q = greedy_drafts ? NULL : wrong ? &quni[0][0] : &q[0][0];
            for (int i = 0; i < K; i++) G.d[i] = greedy_drafts ? gd[i] : m3_spec_draw(q[i], V, urand(&s));
            for (int i = 0; i <= K; i++) G.u[i] = urand(&s);
            m3_draw_param ps[K + 1];
            for (int i = 0; i <= K; i++) {
                ps[i] = par;
                ps[i].u = i == K ? G.u[K] : 0;
            }
            int32_t out[K + 1];
            OPS.draw_rows(OPS.ctx, x, K + 1, V, V, ps, out);
            OPS.verify_rows(OPS.ctx, x, V, V, 1, &G, out);
            for (int i = 0; i <= K; i++) { /* emitted: out[0..a], a the accepted count */
                cnt[i][out[i]]++;
                n_at[i]++;
                if (i == K || out[i] != G.d[i]) break;
                acc0 += i == 0;
            }
        }
        double worst = 0;
        int all = 1;
        for (int i = 0; i <= K; i++) {
            double pd[V], st;
            int df;
            for (int v = 0; v < V; v++) pd[v] = pt[i][v];
            const int ok = chi_ok(pd, cnt[i], V, n_at[i], &st, &df);
            all &= ok;
            if (!wrong) CHECK(ok, "%s drafts: token %d emitted not as p_%d (chi2 %.1f, df %d, %ld draws)",
                              greedy_drafts ? "greedy" : "probabilistic", i, i, st, df, n_at[i]);
            if (st > worst) worst = st;
        }
        double expect = 0;
        for (int v = 0; v < V; v++) expect += greedy_drafts ? (v == gd[0] ? pt[0][v] : 0) : fminf(pt[0][v], (wrong ? quni : q)[0][v]);
        const double ar = (double)acc0 / N;
        if (wrong) {
            CHECK(!all, "negative control: verified with a q the drafts were not drawn from, yet every chi-square passed");
            printf("2. negative control (a q the drafts were not drawn from): largest chi2 %.1f, rejected\n", worst);
            continue;
        }
        CHECK(fabs(ar - expect) < 0.01, "acceptance of d_0 %.4f, expected sum min(p, q) = %.4f", ar, expect);
        printf("2. draw_rows + verify_rows, %s drafts, k %d: tokens 0..%d emitted as p_0..p_%d (largest chi2 %.1f over %ld / "
               "%ld / %ld draws), acceptance %.4f (theory %.4f)\n", greedy_drafts ? "greedy" : "probabilistic", K, K, K, worst,
               n_at[0], n_at[1], n_at[2], ar, expect);
    }
}

/* ---- 3: the uniforms a verification on the backend takes ---- */

static void test_uniforms(void) {
    m3_err err;
    m3_sampling sp = {.temperature = 0.7f, .seed = 99};
    m3_sampler *a = m3_sampler_create(&sp, 100, NULL, 0, &err), *b = m3_sampler_create(&sp, 100, NULL, 0, &err);
    CHECK(a && b, "sampler: %s", err.msg);
    if (!a || !b) return;
    double u[9];
    m3_sampler_peek_uniforms(a, 9, u);
    int same = 1;
    for (int i = 0; i < 9; i++) same &= u[i] == m3_sampler_uniform(b);
    m3_sampler_skip_uniforms(a, 9);
    same &= m3_sampler_uniform(a) == m3_sampler_uniform(b);
    CHECK(same, "peeked uniforms differ from those drawn after, or skip took another count");
    printf("3. peeked uniforms are those drawn next; skip takes them: %s\n", same ? "yes" : "NO");
    m3_sampler_free(a);
    m3_sampler_free(b);
}

int main(void) {
    m3_err err;
    if (m3_cpu_ops_init(&OPS, 1, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    CHECK(OPS.verify_rows != NULL && OPS.draw_rows != NULL, "the CPU backend has no verify_rows / draw_rows");
    test_rule(1000, 40, 1);
    test_rule(200064, 12, 2);
    test_pipeline(0);
    test_pipeline(1);
    test_uniforms();
    m3_cpu_ops_free(&OPS);
    if (failures) { printf("%d checks failed\n", failures); return 1; }
    printf("all verify_rows checks passed\n");
    return 0;
}
