/* The verify step of speculative decoding (src/engine/spec.h) on synthetic distributions:
 *   1. q = p (drafts drawn from the target's own processed distribution) accepts every draft;
 *   2. one position, random p (through temperature / top-k / top-p / min-p) and random q (with
 *      zeros on both sides): the emitted token is distributed as p (chi-square, fixed seeds),
 *      for probabilistic and greedy (one-hot q) drafts;
 *   3. a synthetic target and draft over a prefix tree with repetition / frequency / presence
 *      penalties, logit_bias and top-p: the first 3 tokens emitted by repeated draft + verify
 *      steps (k = 1..3) have exactly the joint distribution of plain sampling, computed by
 *      enumeration through m3_sampler_probs (chi-square);
 *   4. greedy verification emits bitwise what m3_sampler_sample gives, accepts the matching
 *      prefix, stops at stop ids and max_emit;
 *   5. m3_spec_config_parse.
 * Usage: test_spec_verify (no data needed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "engine/spec.h"

#include "../check.h"

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* N(0,1)-ish from a hash (sum of uniforms), deterministic */
static float hnorm(uint64_t key) {
    double s = 0;
    for (int i = 0; i < 4; i++) s += (double)(mix(key + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)) >> 11) * 0x1.0p-53;
    return (float)((s - 2.0) * 1.7320508);
}

/* chi-square statistic of counts vs probabilities (bins with expected < 5 pooled); returns
 * whether it is below the 99.9% quantile (Wilson-Hilferty) and the dof through *df */
static int chi_ok(const double *p, const long *cnt, int n, long N, double *stat, int *df) {
    double s = 0, pe = 0, pc = 0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * N;
        if (e < 5) { pe += e; pc += cnt[i]; if (cnt[i] && p[i] == 0) return *stat = INFINITY, *df = 0, 0; continue; }
        s += (cnt[i] - e) * (cnt[i] - e) / e;
        bins++;
    }
    if (pe > 0) { s += (pc - pe) * (pc - pe) / pe; bins++; }
    int k = bins - 1;
    if (k < 1) k = 1;
    double z = 3.0902; /* 99.9% */
    double q = k * pow(1 - 2.0 / (9 * k) + z * sqrt(2.0 / (9 * k)), 3);
    *stat = s;
    *df = k;
    return s < q;
}

static m3_sample_ws *WS;

/* ---- 1 + 2: one position ---- */

static void test_q_equals_p(void) {
    enum { V = 16, K = 6 };
    m3_err err;
    float logits[(K + 1) * V], q[K * V], p[V];
    int32_t draft[K];
    m3_sampling sp = {.temperature = 0.9f, .top_k = 10, .top_p = 0.95f, .seed = 11, .min_p = 0.01f,
                      .presence_penalty = 0.5f, .frequency_penalty = 0.3f, .repetition_penalty = 1.3f};
    int32_t prompt[3] = {1, 2, 3};
    int all = 1, trials = 0;
    for (int t = 0; t < 300; t++) {
        for (int i = 0; i < (K + 1) * V; i++) logits[i] = 2.0f * hnorm((uint64_t)t * 1000 + (uint64_t)i);
        m3_sampler *a = m3_sampler_create(&sp, V, prompt, 3, &err), *b = m3_sampler_create(&sp, V, prompt, 3, &err);
        m3_rng r;
        m3_rng_seed(&r, (uint64_t)t);
        /* drafts from the target's own distributions: b tracks the state a will be in */
        for (int i = 0; i < K; i++) {
            m3_sampler_probs(b, logits + i * V, WS, q + i * V, &err);
            draft[i] = m3_spec_draw(q + i * V, V, m3_rng_uniform(&r));
            m3_sampler_accept(b, draft[i], &err);
        }
        m3_spec_result res;
        int rc = m3_spec_verify(a, WS, p, logits, draft, q, K, NULL, 0, 100, &res, &err);
        CHECK(rc == 0, "verify: %s", err.msg);
        int ok = res.n_accepted == K && res.n_emit == K + 1 && !res.stopped;
        for (int i = 0; ok && i < K; i++) ok = res.out[i].token == draft[i];
        all &= ok;
        trials++;
        m3_sampler_free(a);
        m3_sampler_free(b);
    }
    CHECK(all, "q = p must accept every draft");
    printf("1. q = p: %d trials of %d drafts, every draft accepted, bonus emitted: %s\n", trials, K, all ? "yes" : "NO");
}

static void test_one_position(void) {
    enum { V = 12 };
    m3_err err;
    for (int variant = 0; variant < 4; variant++) {
        /* variant 0: plain T=1; 1: T 0.7 + top-k 7 + top-p 0.9; 2: min-p 0.05 + T 1.3; 3: greedy drafts (q one-hot) */
        m3_sampling sp = {.temperature = 1.0f, .seed = 100 + (uint64_t)variant};
        if (variant == 1) { sp.temperature = 0.7f; sp.top_k = 7; sp.top_p = 0.9f; }
        if (variant == 2) { sp.temperature = 1.3f; sp.min_p = 0.05f; }
        float logits[2 * V], p[V], q[V], pt[V];
        for (int i = 0; i < 2 * V; i++) logits[i] = 1.5f * hnorm(7000 + (uint64_t)(variant * 100 + i));
        /* q: random, with a few zeros (tokens the draft never proposes) */
        double qs = 0;
        for (int i = 0; i < V; i++) {
            q[i] = (i % 5 == 3) ? 0.0f : expf(1.2f * hnorm(9000 + (uint64_t)(variant * 100 + i)));
            qs += q[i];
        }
        for (int i = 0; i < V; i++) q[i] = (float)(q[i] / qs);
        m3_sampler *s = m3_sampler_create(&sp, V, NULL, 0, &err);
        m3_sampler_probs(s, logits, WS, pt, &err); /* no penalties: the state does not change p */
        int32_t greedy_draft = 0;
        for (int i = 1; i < V; i++) if (q[i] > q[greedy_draft]) greedy_draft = i;
        m3_rng r;
        m3_rng_seed(&r, 77 + (uint64_t)variant);
        enum { N = 200000 };
        static long cnt[V];
        memset(cnt, 0, sizeof cnt);
        long acc = 0;
        for (int t = 0; t < N; t++) {
            int32_t d = variant == 3 ? greedy_draft : m3_spec_draw(q, V, m3_rng_uniform(&r));
            m3_spec_result res;
            if (m3_spec_verify(s, WS, p, logits, &d, variant == 3 ? NULL : q, 1, NULL, 0, 1, &res, &err)) {
                CHECK(0, "verify: %s", err.msg);
                break;
            }
            cnt[res.out[0].token]++;
            acc += res.n_accepted;
        }
        double pd[V], stat, expect_acc = 0;
        for (int i = 0; i < V; i++) {
            pd[i] = pt[i];
            expect_acc += variant == 3 ? (i == greedy_draft ? pt[i] : 0) : fmin(pt[i], q[i]);
        }
        int df, ok = chi_ok(pd, cnt, V, N, &stat, &df);
        CHECK(ok, "variant %d: emitted tokens are not distributed as p (chi2 %.1f, df %d)", variant, stat, df);
        double ar = (double)acc / N;
        CHECK(fabs(ar - expect_acc) < 0.01, "variant %d: acceptance %.4f, expected sum min(p, q) = %.4f", variant, ar, expect_acc);
        if (variant == 0) { /* the test has power: verifying against a q other than the drafts' own is caught */
            float qu[V];
            for (int i = 0; i < V; i++) qu[i] = 1.0f / V;
            memset(cnt, 0, sizeof cnt);
            for (int t = 0; t < N; t++) {
                int32_t d = m3_spec_draw(q, V, m3_rng_uniform(&r));
                m3_spec_result res;
                if (m3_spec_verify(s, WS, p, logits, &d, qu, 1, NULL, 0, 1, &res, &err)) break;
                cnt[res.out[0].token]++;
            }
            double st2;
            int df2;
            CHECK(!chi_ok(pd, cnt, V, N, &st2, &df2), "negative control: a wrong q passed the chi-square (%.1f)", st2);
            printf("2.0 negative control (verify with a q the drafts were not drawn from): chi2 %.1f (df %d), rejected\n", st2, df2);
        }
        printf("2.%d one position (%s): chi2 %.1f (df %d) over %d draws; acceptance %.4f (theory %.4f)\n", variant,
               variant == 0 ? "T 1" : variant == 1 ? "T 0.7, top-k 7, top-p 0.9" : variant == 2 ? "T 1.3, min-p 0.05" : "greedy drafts",
               stat, df, N, ar, expect_acc);
        m3_sampler_free(s);
    }
}

/* ---- 3: a synthetic target / draft over a prefix tree, with penalties ---- */

enum { TV = 5, M = 3 };

/* target logits after prefix h[0..n) (n emitted tokens); and the draft's raw distribution */
static void target_row(const int32_t *h, int n, float *row) {
    uint64_t key = 0x1234;
    for (int i = 0; i < n; i++) key = mix(key ^ (uint64_t)(h[i] + 1));
    for (int v = 0; v < TV; v++) row[v] = 1.3f * hnorm(key * 31 + (uint64_t)v);
}
static void draft_row(const int32_t *h, int n, float *row) {
    uint64_t key = 0x777;
    for (int i = 0; i < n; i++) key = mix(key ^ (uint64_t)(h[i] + 1));
    double s = 0;
    for (int v = 0; v < TV; v++) { row[v] = expf(1.0f * hnorm(key * 17 + (uint64_t)v)); s += row[v]; }
    for (int v = 0; v < TV; v++) row[v] = (float)(row[v] / s);
}

static const int32_t PROMPT[2] = {2, 4};

static m3_sampling tree_params(uint64_t seed) {
    static const m3_logit_bias bias[1] = {{3, 0.4f}};
    m3_sampling sp = {.temperature = 1.1f, .top_p = 0.97f, .seed = seed, .presence_penalty = 0.4f,
                      .frequency_penalty = 0.6f, .repetition_penalty = 1.4f, .logit_bias = bias, .n_logit_bias = 1};
    return sp;
}

/* exact joint distribution of the first M plain-sampled tokens */
static void exact_joint(double *pj) {
    m3_err err;
    float row[TV], p[TV];
    for (int idx = 0; idx < TV * TV * TV; idx++) {
        int32_t h[M] = {idx / (TV * TV), (idx / TV) % TV, idx % TV};
        m3_sampling sp = tree_params(0);
        m3_sampler *s = m3_sampler_create(&sp, TV, PROMPT, 2, &err);
        double pr = 1;
        for (int i = 0; i < M; i++) {
            target_row(h, i, row);
            m3_sampler_probs(s, row, WS, p, &err);
            pr *= p[h[i]];
            m3_sampler_accept(s, h[i], &err);
        }
        pj[idx] = pr;
        m3_sampler_free(s);
    }
}

static void test_tree(void) {
    static double pj[TV * TV * TV];
    exact_joint(pj);
    double tot = 0;
    for (int i = 0; i < TV * TV * TV; i++) tot += pj[i];
    CHECK(fabs(tot - 1) < 1e-5, "exact joint sums to %g", tot);
    m3_err err;
    for (int k = 1; k <= 3; k++) {
        for (int greedy_draft = 0; greedy_draft < 2; greedy_draft++) {
            enum { N = 60000 };
            static long cnt[TV * TV * TV];
            memset(cnt, 0, sizeof cnt);
            long steps = 0, emitted = 0, accepted = 0, drafted = 0;
            m3_rng r;
            m3_rng_seed(&r, 4242 + (uint64_t)k);
            for (int t = 0; t < N; t++) {
                m3_sampling sp = tree_params(1000003ull * (uint64_t)t + (uint64_t)k);
                m3_sampler *s = m3_sampler_create(&sp, TV, PROMPT, 2, &err);
                int32_t h[M + 4];
                int n = 0;
                while (n < M) {
                    int ke = k < M - n - 1 ? k : M - n - 1; /* as the engine: room to emit ke + 1 */
                    float logits[(3 + 1) * TV], q[3 * TV], p[TV];
                    int32_t d[3];
                    for (int i = 0; i < ke; i++) { /* drafts: d_i ~ q_i(prefix, d_1..d_{i-1}) */
                        int32_t hh[M + 4];
                        memcpy(hh, h, sizeof(int32_t) * (size_t)n);
                        memcpy(hh + n, d, sizeof(int32_t) * (size_t)i);
                        draft_row(hh, n + i, q + i * TV);
                        if (greedy_draft) { int b = 0; for (int v = 1; v < TV; v++) if (q[i * TV + v] > q[i * TV + b]) b = v; d[i] = b; }
                        else d[i] = m3_spec_draw(q + i * TV, TV, m3_rng_uniform(&r));
                    }
                    for (int i = 0; i <= ke; i++) { /* target rows over [prefix, d_1..d_i] */
                        int32_t hh[M + 4];
                        memcpy(hh, h, sizeof(int32_t) * (size_t)n);
                        memcpy(hh + n, d, sizeof(int32_t) * (size_t)i);
                        target_row(hh, n + i, logits + i * TV);
                    }
                    m3_spec_result res;
                    if (m3_spec_verify(s, WS, p, logits, d, greedy_draft ? NULL : q, ke, NULL, 0, M - n, &res, &err)) {
                        CHECK(0, "verify: %s", err.msg);
                        t = N;
                        break;
                    }
                    for (int i = 0; i < res.n_emit; i++) h[n++] = res.out[i].token;
                    steps++;
                    drafted += ke;
                    emitted += res.n_emit;
                    accepted += res.n_accepted;
                }
                if (n == M) cnt[(h[0] * TV + h[1]) * TV + h[2]]++;
                m3_sampler_free(s);
            }
            double stat;
            int df, ok = chi_ok(pj, cnt, TV * TV * TV, N, &stat, &df);
            CHECK(ok, "k %d (%s drafts): joint of the first %d tokens differs from plain sampling (chi2 %.1f, df %d)", k,
                  greedy_draft ? "greedy" : "probabilistic", M, stat, df);
            printf("3. prefix tree, penalties + bias + top-p, k %d, %s drafts: chi2 %.1f (df %d) over %d sequences; "
                   "%.2f tokens per verify step, %.1f%% of drafts accepted\n",
                   k, greedy_draft ? "greedy" : "probabilistic", stat, df, N, (double)emitted / steps,
                   100.0 * accepted / (drafted ? drafted : 1));
        }
    }
}

/* ---- 4: greedy verification ---- */

static void test_greedy(void) {
    enum { V = 20, K = 5 };
    m3_err err;
    float logits[(K + 1) * V], p[V];
    int32_t argm[K + 1];
    for (int i = 0; i < (K + 1) * V; i++) logits[i] = hnorm(555 + (uint64_t)i);
    for (int i = 0; i <= K; i++) argm[i] = m3_argmax(logits + i * V, V);
    m3_sampling sp = {.temperature = 0, .logprobs = 1, .top_logprobs = 3};
    int ok_all = 1;
    for (int j = 0; j <= K; j++) { /* drafts match the argmax on the first j positions */
        int32_t d[K];
        for (int i = 0; i < K; i++) d[i] = i < j ? argm[i] : (argm[i] + 1) % V;
        m3_sampler *s = m3_sampler_create(&sp, V, NULL, 0, &err), *ref = m3_sampler_create(&sp, V, NULL, 0, &err);
        m3_spec_result res;
        int rc = m3_spec_verify(s, WS, p, logits, d, NULL, K, NULL, 0, 100, &res, &err);
        int ok = rc == 0 && res.n_accepted == j && res.n_emit == j + 1;
        for (int i = 0; ok && i < res.n_emit; i++) {
            m3_sample_out o;
            m3_sampler_sample(ref, logits + i * V, WS, &o, &err);
            ok = !memcmp(&o, &res.out[i], sizeof o) && o.token == argm[i];
        }
        CHECK(ok, "greedy verify with %d matching drafts: accepted %d, emitted %d", j, res.n_accepted, res.n_emit);
        ok_all &= ok;
        m3_sampler_free(s);
        m3_sampler_free(ref);
    }
    /* stop ids and max_emit cut emission; stop on an accepted draft */
    {
        int32_t d[K];
        for (int i = 0; i < K; i++) d[i] = argm[i];
        m3_sampler *s = m3_sampler_create(&sp, V, NULL, 0, &err);
        m3_spec_result res;
        int32_t stop = argm[2];
        int first = 0;
        while (argm[first] != stop) first++;
        m3_spec_verify(s, WS, p, logits, d, NULL, K, &stop, 1, 100, &res, &err);
        CHECK(res.stopped && res.n_emit == first + 1 && res.out[first].token == stop, "stop id: emitted %d", res.n_emit);
        CHECK(m3_sampler_n_generated(s) == res.n_emit, "sampler accepted %d of %d", m3_sampler_n_generated(s), res.n_emit);
        m3_sampler_free(s);
        s = m3_sampler_create(&sp, V, NULL, 0, &err);
        m3_spec_verify(s, WS, p, logits, d, NULL, K, NULL, 0, 2, &res, &err);
        CHECK(res.stopped && res.n_emit == 2, "max_emit 2: emitted %d", res.n_emit);
        m3_sampler_free(s);
    }
    /* m3_spec_verify_ids (the rows' argmaxes computed where the logits are, no logprobs asked)
     * against m3_spec_verify on the rows: the same result for every matching-prefix length, stop
     * id and max_emit */
    {
        m3_sampling g = {.temperature = 0};
        int same = 0, cases = 0;
        for (int j = 0; j <= K; j++)
            for (int cut = 0; cut < 3; cut++) {
                int32_t d[K], stop = argm[j < K ? j : K - 1];
                for (int i = 0; i < K; i++) d[i] = i < j ? argm[i] : (argm[i] + 1) % V;
                m3_sampler *a = m3_sampler_create(&g, V, NULL, 0, &err), *b = m3_sampler_create(&g, V, NULL, 0, &err);
                m3_spec_result ra, rb;
                const int me = cut == 2 ? 2 : 100;
                int rca = m3_spec_verify(a, WS, p, logits, d, NULL, K, cut == 1 ? &stop : NULL, cut == 1, me, &ra, &err);
                int rcb = m3_spec_verify_ids(b, argm, d, K, cut == 1 ? &stop : NULL, cut == 1, me, &rb, &err);
                int ok = m3_sampler_greedy_ids(a, NULL, 0) == V && rca == 0 && rcb == 0 && ra.n_accepted == rb.n_accepted &&
                         ra.n_emit == rb.n_emit && ra.stopped == rb.stopped &&
                         !memcmp(ra.out, rb.out, sizeof ra.out[0] * (size_t)ra.n_emit) &&
                         m3_sampler_n_generated(a) == m3_sampler_n_generated(b);
                CHECK(ok, "verify_ids, %d matching drafts, cut %d: accepted %d / %d, emitted %d / %d", j, cut, rb.n_accepted,
                      ra.n_accepted, rb.n_emit, ra.n_emit);
                same += ok;
                cases++;
                m3_sampler_free(a);
                m3_sampler_free(b);
            }
        m3_sampler *lp = m3_sampler_create(&sp, V, NULL, 0, &err);
        CHECK(m3_sampler_greedy_ids(lp, NULL, 0) == 0, "a request asking for logprobs needs its rows");
        m3_sampler_free(lp);
        printf("4b. verify from the rows' argmaxes: %d / %d cases as from the rows\n", same, cases);
    }
    printf("4. greedy verify: every matching-prefix length gives the plain argmax tokens bitwise (sample_out with "
           "top_logprobs), stop ids and max_emit cut emission: %s\n", ok_all ? "ok" : "FAIL");
}

/* ---- 5: config parsing ---- */

/* ---- the draws over a large vocabulary (blocks of ids): the token a plain CDF walk in id order
 * gives for the same u, the edges (nothing positive, u next to 1, the last id alone, the
 * residual with nothing left falling back to p) ---- */
static int32_t ref_walk(const float *p, const float *q, int skip, int V, double u) {
    double total = 0;
    for (int i = 0; i < V; i++) { double r = i == skip ? 0 : q ? (double)p[i] - q[i] : p[i]; if (r > 0) total += r; }
    if (!(total > 0)) return -1;
    double x = u * total, acc = 0;
    int last = -1;
    for (int i = 0; i < V; i++) {
        double r = i == skip ? 0 : q ? (double)p[i] - q[i] : p[i];
        if (!(r > 0)) continue;
        acc += r;
        last = i;
        if (x < acc) return i;
    }
    return last;
}

static void test_draws(void) {
    const int V = 200064;
    float *p = malloc(sizeof(float) * V), *q = malloc(sizeof(float) * V);
    double sp = 0, sq = 0;
    for (int i = 0; i < V; i++) {
        p[i] = (i % 7 == 3) ? 0.0f : expf(2.5f * hnorm(11 + (uint64_t)i));
        q[i] = (i % 5 == 1) ? 0.0f : expf(2.5f * hnorm(99 + (uint64_t)i));
        sp += p[i]; sq += q[i];
    }
    for (int i = 0; i < V; i++) { p[i] = (float)(p[i] / sp); q[i] = (float)(q[i] / sq); }
    m3_rng r;
    m3_rng_seed(&r, 17);
    int diff = 0, n = 0;
    for (int t = 0; t < 3000; t++, n += 3) {
        const double u = m3_rng_uniform(&r);
        const int32_t d = (int32_t)(m3_rng_uniform(&r) * V);
        diff += m3_spec_draw(p, V, u) != ref_walk(p, NULL, -1, V, u);
        diff += m3_spec_residual(p, q, d, V, u) != ref_walk(p, q, -1, V, u);
        diff += m3_spec_residual(p, NULL, d, V, u) != ref_walk(p, NULL, d, V, u);
    }
    CHECK(diff == 0, "draws over V=%d: %d of %d differ from a plain walk in id order", V, diff, n);
    const double u1 = 1.0 - 0x1.0p-53;
    CHECK(m3_spec_draw(p, V, u1) == ref_walk(p, NULL, -1, V, u1) && m3_spec_draw(p, V, 0.0) == ref_walk(p, NULL, -1, V, 0.0),
          "draw at u = 0 and u next to 1");
    int lastpos = V - 1;
    while (!(p[lastpos] > 0)) lastpos--;
    CHECK(m3_spec_draw(p, V, u1) == lastpos, "u next to 1 draws the last positive id (%d)", lastpos);
    memset(q, 0, sizeof(float) * V);
    CHECK(m3_spec_draw(q, V, 0.5) == -1, "nothing positive: -1");
    q[V - 1] = 1e-30f;
    CHECK(m3_spec_draw(q, V, 0.0) == V - 1 && m3_spec_draw(q, V, u1) == V - 1, "the last id alone");
    q[V - 1] = 0;
    q[70000] = 1.0f;
    CHECK(m3_spec_residual(q, NULL, 70000, V, 0.3) == 70000, "one-hot residual with nothing else: the draw from p");
    CHECK(m3_spec_residual(p, p, 5, V, 0.3) == m3_spec_draw(p, V, 0.3), "residual of p - p: the draw from p");
    printf("draws over V=%d: %d draws equal to a plain walk; edges ok\n", V, n);
    free(p); free(q);
}

static void test_config(void) {
    m3_spec_config c;
    m3_err err;
    CHECK(!m3_spec_config_parse(&c, "{\"method\":\"dspark\",\"num_speculative_tokens\":3,\"draft_sample_method\":\"greedy\"}",
                                "/m", NULL, &err) &&
              c.method == M3_SPEC_DSPARK && c.num_speculative_tokens == 3 && c.draft_sample_method == M3_SPEC_DRAFT_GREEDY &&
              !strcmp(c.draft_dir, "/m/dspark"),
          "parse: %s", err.msg);
    CHECK(!m3_spec_config_parse(&c, "{\"method\":\"dspark\"}", "/m", "/d", &err) && !strcmp(c.draft_dir, "/d") &&
              c.num_speculative_tokens == 7 && c.draft_sample_method == M3_SPEC_DRAFT_PROBABILISTIC,
          "defaults: %s", err.msg);
    CHECK(!m3_spec_config_parse(&c, "{\"method\":\"dspark\",\"model\":\"/x\"}", "/m", NULL, &err) && !strcmp(c.draft_dir, "/x"),
          "model key");
    CHECK(!m3_spec_config_parse(&c, "{\"method\":\"dspark\"}", "/m", NULL, &err) && !c.draft_on_cpu &&
              !m3_spec_config_parse(&c, "{\"method\":\"dspark\",\"dspark_draft_backend\":\"cpu\"}", "/m", NULL, &err) &&
              c.draft_on_cpu &&
              !m3_spec_config_parse(&c, "{\"method\":\"dspark\",\"dspark_draft_backend\":\"target\"}", "/m", NULL, &err) &&
              !c.draft_on_cpu,
          "dspark_draft_backend: %s", err.msg);
    /* vLLM's keys: disable_by_batch_size (>= 2), max_model_len (>= 1), null for unset; draft_tensor_parallel_size 1 */
    CHECK(!m3_spec_config_parse(&c, "{\"method\":\"dspark\"}", "/m", NULL, &err) && c.disable_by_batch_size == 0 &&
              c.max_model_len == 0 &&
              !m3_spec_config_parse(&c, "{\"method\":\"dspark\",\"disable_by_batch_size\":16,\"max_model_len\":4096,"
                                        "\"draft_tensor_parallel_size\":1}", "/m", NULL, &err) &&
              c.disable_by_batch_size == 16 && c.max_model_len == 4096 &&
              !m3_spec_config_parse(&c, "{\"method\":\"dspark\",\"disable_by_batch_size\":null,\"max_model_len\":null,"
                                        "\"draft_tensor_parallel_size\":null}", "/m", NULL, &err) &&
              c.disable_by_batch_size == 0 && c.max_model_len == 0,
          "vLLM keys: %s", err.msg);
    const char *bad[] = {"{\"method\":\"dspark\",\"disable_by_batch_size\":1}", "{\"method\":\"dspark\",\"disable_by_batch_size\":2.5}",
                         "{\"method\":\"dspark\",\"max_model_len\":0}", "{\"method\":\"dspark\",\"max_model_len\":\"8k\"}",
                         "{\"method\":\"dspark\",\"draft_tensor_parallel_size\":2}",
                         "{\"method\":\"eagle\"}", "{\"num_speculative_tokens\":3}", "{\"method\":\"dspark\",\"num_speculative_tokens\":0}",
                         "{\"method\":\"dspark\",\"num_speculative_tokens\":99}", "{\"method\":\"dspark\",\"draft_sample_method\":\"x\"}",
                         "{\"method\":\"dspark\",\"bogus\":1}", "[1]", "{", "{\"method\":\"dspark\",\"dspark_draft_backend\":\"gpu\"}",
                         "{\"method\":\"dspark\",\"dspark_draft_backend\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(m3_spec_config_parse(&c, bad[i], "/m", NULL, &err) == -1 && err.msg[0], "bad config %zu accepted", i);
    m3_spec_config_parse(&c, "{\"method\":\"dspark\",\"bogus\":1}", "/m", NULL, &err);
    CHECK(strstr(err.msg, "bogus") != NULL, "unknown key named: %s", err.msg);
    m3_spec_config_parse(&c, "{\"method\":\"dspark\",\"disable_by_batch_size\":1}", "/m", NULL, &err);
    CHECK(strstr(err.msg, "disable_by_batch_size") != NULL, "bad value named: %s", err.msg);
    printf("5. --speculative-config parsing: defaults, draft directory, draft backend, vLLM's keys, errors naming the field\n");
}

int main(void) {
    test_draws();
    m3_err err;
    WS = m3_sample_ws_create(64, &err);
    if (!WS) { fprintf(stderr, "%s\n", err.msg); return 1; }
    test_q_equals_p();
    test_one_position();
    test_tree();
    test_greedy();
    test_config();
    m3_sample_ws_free(WS);
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    else printf("all spec verify checks passed\n");
    return failures ? 1 : 0;
}
