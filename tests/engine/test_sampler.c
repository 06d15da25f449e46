/* Sampler tests: each transform exactly on small hand-made rows, distributions (chi-square,
 * fixed seeds), reproducibility, logprobs against a float64 log-softmax, the fast candidate
 * cut against a full sort at V = 200064, stop strings across steps, and ns per sample. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rows.h"
#include "base/clock.h"
#include "base/pool.h"
#include "engine/sampler.h"

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

#define BIGV 200064

static m3_sample_ws *WS; /* sized for BIGV, shared by every test (one thread) */

static m3_sampler *mk(const m3_sampling *p, int V, const int32_t *prompt, int np) {
    m3_err err;
    m3_sampler *s = m3_sampler_create(p, V, prompt, np, &err);
    if (!s) { printf("FAIL create: %s\n", err.msg); exit(1); }
    return s;
}

static int draw(m3_sampler *s, const float *lg, m3_sample_out *o) {
    m3_err err;
    m3_sample_out tmp;
    if (!o) o = &tmp;
    if (m3_sampler_sample(s, lg, WS, o, &err)) { printf("FAIL sample: %s\n", err.msg); exit(1); }
    return o->token;
}

/* float64 log-softmax */
static void ref_logsoftmax(const float *x, int V, double *out) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < V; i++) if (x[i] > m) m = x[i];
    for (int i = 0; i < V; i++) s += exp((double)x[i] - m);
    for (int i = 0; i < V; i++) out[i] = (double)x[i] - m - log(s);
}

/* Draws n tokens and checks the frequencies against want[] (chi-square, df = kept - 1;
 * tokens with want 0 must never appear). The bound is the 1e-4 tail for df <= 9. */
static void chi2(const char *what, m3_sampler *s, const float *lg, int V, const double *want, int n) {
    int cnt[64] = {0};
    for (int i = 0; i < n; i++) cnt[draw(s, lg, NULL)]++;
    double x2 = 0;
    int df = -1, bad = 0;
    for (int i = 0; i < V; i++) {
        if (want[i] == 0) { bad += cnt[i]; continue; }
        double e = want[i] * n;
        x2 += (cnt[i] - e) * (cnt[i] - e) / e;
        df++;
    }
    CHECK(bad == 0, "%s: %d draws of excluded tokens", what, bad);
    CHECK(x2 < 33.7, "%s: chi-square %.2f (df %d) over %d draws", what, x2, df, n);
    printf("  %-34s chi2 %6.2f df %d n %d\n", what, x2, df, n);
}

static void softmax_d(const float *lg, int V, double T, double *p) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < V; i++) if (lg[i] > m) m = lg[i];
    for (int i = 0; i < V; i++) s += (p[i] = exp((lg[i] - m) / T));
    for (int i = 0; i < V; i++) p[i] /= s;
}

/* m3_argmax (vectorized, two passes) against the one-pass rule it replaces, on rows of every
 * length up to 70 and the full vocabulary: ties (lowest index), -inf, NaN anywhere (never the
 * max; a NaN at 0 keeps 0), +-0, and the greedy sample on the raw row against a masked copy */
static int argmax_ref(const float *x, int n) {
    int b = 0;
    float bv = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > bv) { bv = x[i]; b = i; }
    return b;
}

static void test_argmax(void) {
    static float x[BIGV];
    uint64_t r = 12345;
    int bad = 0, cases = 0;
    for (int n = 1; n <= 70; n++)
        for (int rep = 0; rep < 200; rep++) {
            for (int i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                const int k = (int)(r >> 59); /* 0..31 */
                x[i] = k < 2 ? -INFINITY : k == 2 ? NAN : k == 3 ? -0.0f : k == 4 ? 0.0f : (float)(int)((r >> 40) % 7) - 3.0f;
            }
            cases++;
            bad += m3_argmax(x, n) != argmax_ref(x, n);
        }
    for (int rep = 0; rep < 40; rep++) {
        for (int i = 0; i < BIGV; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((r >> 40) % 100000) * 1e-3f;
        }
        if (rep % 4 == 1) x[0] = NAN;
        if (rep % 4 == 2) x[BIGV - 1] = 1e9f;
        if (rep % 4 == 3) x[rep * 997] = NAN;
        cases++;
        bad += m3_argmax(x, BIGV) != argmax_ref(x, BIGV);
    }
    CHECK(!bad, "argmax: %d of %d rows differ from the one-pass rule", bad, cases);
    /* the greedy sample on the raw row equals the one through the working copy (a no-op mask) */
    m3_logit_bias zero[1] = {{5, 0.0f}}; /* a bias of 0: the copy path, the same values */
    m3_sampling plain = {.temperature = 0}, masked = {.temperature = 0, .logit_bias = zero, .n_logit_bias = 1};
    m3_sampler *a = mk(&plain, BIGV, NULL, 0), *b = mk(&masked, BIGV, NULL, 0);
    int diff = 0;
    for (int rep = 0; rep < 8; rep++) {
        for (int i = 0; i < BIGV; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((r >> 40) % 5000) * 1e-2f;
        }
        diff += draw(a, x, NULL) != draw(b, x, NULL);
    }
    CHECK(!diff, "greedy on the raw row differs from greedy through the working copy in %d of 8 rows", diff);
    m3_sampler_free(a);
    m3_sampler_free(b);
    printf("argmax: %d rows equal to the one-pass rule; greedy raw-row path equal\n", cases - bad);
}

static void test_greedy_bias_mask(void) {
    float lg[5] = {0.1f, 2.0f, 2.0f, -1.0f, 0.5f};
    m3_sampling g = {.temperature = 0};
    m3_sampler *s = mk(&g, 5, NULL, 0);
    CHECK(draw(s, lg, NULL) == 1, "greedy tie -> lowest id");
    m3_sampler_free(s);
    /* greedy ignores top-k/top-p/min-p but honours bias and bans */
    m3_logit_bias b[1] = {{3, 3.5f}};
    m3_sampling gb = {.temperature = 0, .top_k = 1, .top_p = 0.1f, .min_p = 0.9f, .logit_bias = b, .n_logit_bias = 1};
    s = mk(&gb, 5, NULL, 0);
    CHECK(draw(s, lg, NULL) == 3, "greedy + logit_bias +3.5 on id 3");
    m3_sampler_free(s);
    int32_t ban[2] = {1, 2};
    m3_sampling gban = {.banned_ids = ban, .n_banned = 2};
    s = mk(&gban, 5, NULL, 0);
    CHECK(draw(s, lg, NULL) == 4, "greedy with 1, 2 banned");
    m3_sampler_free(s);
    /* bias forcing and banning while sampling */
    m3_logit_bias force[1] = {{0, 100}};
    m3_sampling tf = {.temperature = 1, .seed = 3, .logit_bias = force, .n_logit_bias = 1};
    s = mk(&tf, 5, NULL, 0);
    int other = 0;
    for (int i = 0; i < 2000; i++) other += draw(s, lg, NULL) != 0;
    CHECK(other == 0, "logit_bias +100 forces id 0 (%d others)", other);
    m3_sampler_free(s);
    m3_logit_bias nob[2] = {{1, -100}, {2, -100}};
    m3_sampling tb = {.temperature = 1, .seed = 4, .logit_bias = nob, .n_logit_bias = 2};
    s = mk(&tb, 5, NULL, 0);
    int hit = 0;
    for (int i = 0; i < 2000; i++) { int t = draw(s, lg, NULL); hit += t == 1 || t == 2; }
    CHECK(hit == 0, "logit_bias -100 bans ids 1, 2 (%d draws)", hit);
    m3_sampler_free(s);
    int32_t al[2] = {0, 3};
    m3_sampling ta = {.temperature = 1, .seed = 5, .allowed_ids = al, .n_allowed = 2};
    s = mk(&ta, 5, NULL, 0);
    double want[5] = {0};
    want[0] = exp(0.1) / (exp(0.1) + exp(-1.0));
    want[3] = 1 - want[0];
    chi2("allowed ids {0, 3}", s, lg, 5, want, 20000);
    m3_sampler_free(s);
    /* everything masked: an error, not a token */
    int32_t all[5] = {0, 1, 2, 3, 4};
    m3_sampling tm = {.temperature = 1, .banned_ids = all, .n_banned = 5};
    s = mk(&tm, 5, NULL, 0);
    m3_err err;
    m3_sample_out o;
    CHECK(m3_sampler_sample(s, lg, WS, &o, &err) == -1 && strstr(err.msg, "masked"), "all banned -> error");
    m3_sampler_free(s);
    /* min_tokens bans the listed ids until enough were accepted */
    int32_t eos[1] = {1};
    m3_sampling mt = {.temperature = 0, .min_tokens = 2, .min_tokens_ids = eos, .n_min_tokens_ids = 1};
    s = mk(&mt, 5, NULL, 0);
    CHECK(draw(s, lg, NULL) == 2, "min_tokens bans eos id 1 at step 0");
    m3_sampler_accept(s, 2, &err);
    m3_sampler_accept(s, 2, &err);
    CHECK(draw(s, lg, NULL) == 1, "min_tokens lifted after 2 tokens");
    m3_sampler_free(s);
    /* bad parameters */
    m3_logit_bias oob[1] = {{5, 1}};
    m3_sampling bad = {.logit_bias = oob, .n_logit_bias = 1};
    CHECK(!m3_sampler_create(&bad, 5, NULL, 0, &err) && strstr(err.msg, "outside"), "bias id out of range: %s", err.msg);
    m3_sampling badp = {.top_p = 1.5f};
    CHECK(!m3_sampler_create(&badp, 5, NULL, 0, &err), "top_p 1.5 refused");
    int32_t pr[1] = {7};
    CHECK(!m3_sampler_create(&g, 5, pr, 1, &err), "prompt id out of range refused");
}

/* m3_sampler_set_mask (structured outputs): only masked-in ids come out, greedy or sampled, with
 * or without other processing; the greedy fast path (masked argmax) equals the general path
 * (forced by asking for logprobs); processed logprobs put -inf on masked-out ids. */
static void test_token_mask(void) {
    const int V = BIGV, nw = (V + 31) / 32;
    float *lg = malloc(sizeof(float) * V);
    uint32_t *mask = calloc((size_t)nw, 4);
    uint64_t r = 12345;
    for (int i = 0; i < V; i++) { r ^= r << 13; r ^= r >> 7; r ^= r << 17; lg[i] = (float)(r % 1000) / 100.0f; }
    int bad = 0, diff = 0;
    for (int round = 0; round < 40; round++) {
        memset(mask, 0, (size_t)nw * 4);
        int k = 1 + round * 37 % 500;
        for (int j = 0; j < k; j++) { r ^= r << 13; r ^= r >> 7; r ^= r << 17; int id = (int)(r % (uint64_t)V); mask[id >> 5] |= 1u << (id & 31); }
        if (round % 5 == 0) for (int w = 0; w < 200; w++) mask[(round * 97 + w) % nw] = 0xffffffffu; /* whole words too */
        m3_sampling g = {0}, lp = {.logprobs = 1}, t = {.temperature = 0.9f, .top_p = 0.9f, .seed = (uint64_t)round};
        m3_logit_bias b = {5, 3.0f};
        m3_sampling gb = {.logit_bias = &b, .n_logit_bias = 1};
        m3_sampler *s1 = mk(&g, V, NULL, 0), *s2 = mk(&lp, V, NULL, 0), *s3 = mk(&t, V, NULL, 0), *s4 = mk(&gb, V, NULL, 0);
        m3_sampler_set_mask(s1, mask);
        m3_sampler_set_mask(s2, mask);
        m3_sampler_set_mask(s3, mask);
        m3_sampler_set_mask(s4, mask);
        m3_sample_out o2;
        int a = draw(s1, lg, NULL), b2 = draw(s2, lg, &o2), c = draw(s3, lg, NULL), d = draw(s4, lg, NULL);
        diff += a != b2;
        bad += !((mask[a >> 5] >> (a & 31)) & 1) + !((mask[c >> 5] >> (c & 31)) & 1) + !((mask[d >> 5] >> (d & 31)) & 1);
        m3_sampler_set_mask(s1, NULL);
        diff += draw(s1, lg, NULL) != m3_argmax(lg, V); /* the mask lifted */
        m3_sampler_free(s1); m3_sampler_free(s2); m3_sampler_free(s3); m3_sampler_free(s4);
    }
    CHECK(!bad, "token mask: %d draws of masked-out ids", bad);
    CHECK(!diff, "token mask: greedy fast path differs from the general path (or the lifted mask) %d times", diff);
    free(lg);
    free(mask);
}

static void test_penalties(void) {
    /* read the processed logits back through greedy processed logprobs = log_softmax(w) */
    float lg[5] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
    int32_t prompt[2] = {0, 1};
    m3_logit_bias b[1] = {{4, 1.0f}};
    m3_sampling p = {.temperature = 0, .repetition_penalty = 2, .presence_penalty = 0.5f, .frequency_penalty = 0.25f,
                     .logit_bias = b, .n_logit_bias = 1, .top_logprobs = 5, .logprobs = 1,
                     .logprobs_mode = M3_LOGPROBS_PROCESSED};
    m3_sampler *s = mk(&p, 5, prompt, 2);
    m3_err err;
    m3_sampler_accept(s, 2, &err);
    m3_sampler_accept(s, 2, &err);
    m3_sampler_accept(s, 3, &err);
    /* 0: prompt, 2 > 0 -> 1; 1: prompt, -1 -> -2; 2: 0.5/2 - 2*0.25 - 0.5 = -0.75;
     * 3: 3/2 - 0.25 - 0.5 = 0.75; 4: unseen, -2 + bias 1 = -1 */
    float want[5] = {1.0f, -2.0f, -0.75f, 0.75f, -1.0f};
    double lw[5];
    ref_logsoftmax(want, 5, lw);
    m3_sample_out o;
    int t = draw(s, lg, &o);
    CHECK(t == 0, "penalized argmax is id 0 (got %d)", t);
    CHECK(o.n_top == 5, "5 top logprobs");
    double md = 0;
    for (int j = 0; j < o.n_top; j++) md = fmax(md, fabs(o.top_logprobs[j] - lw[o.top_ids[j]]));
    CHECK(md < 1e-6, "penalized logits: max |diff| %.2e", md);
    CHECK(o.top_ids[0] == 0 && o.top_ids[1] == 3 && o.top_ids[2] == 2 && o.top_ids[3] == 4 && o.top_ids[4] == 1, "order of processed top logprobs");
    /* raw mode on the same state reports the unpenalized row */
    m3_sampler_free(s);
    p.logprobs_mode = M3_LOGPROBS_RAW;
    s = mk(&p, 5, prompt, 2);
    m3_sampler_accept(s, 2, &err);
    t = draw(s, lg, &o);
    double lr[5];
    ref_logsoftmax(lg, 5, lr);
    CHECK(o.top_ids[0] == 3 && fabs(o.top_logprobs[0] - lr[3]) < 1e-6, "raw logprobs ignore penalties");
    CHECK(t == 3 && fabs(o.logprob - lr[t]) < 1e-6 && o.rank == 1, "raw chosen logprob / rank (token %d rank %d)", t, o.rank);
    m3_sampler_free(s);
    /* negative presence / frequency raise a seen token */
    m3_sampling q = {.temperature = 0, .presence_penalty = -2};
    s = mk(&q, 5, NULL, 0);
    m3_sampler_accept(s, 0, &err);
    CHECK(draw(s, lg, NULL) == 0, "negative presence penalty favours a generated token");
    m3_sampler_free(s);
    printf("  penalties: processed logits max |diff| %.2e\n", md);
}

static void test_distributions(void) {
    float lg[6] = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f, 1.5f};
    double p[6], w[6];
    int N = 100000;
    /* temperature */
    const float temps[3] = {0.5f, 1.0f, 2.0f};
    for (int k = 0; k < 3; k++) {
        m3_sampling sp = {.temperature = temps[k], .seed = 11 + k};
        m3_sampler *s = mk(&sp, 6, NULL, 0);
        softmax_d(lg, 6, temps[k], p);
        char name[64];
        snprintf(name, sizeof name, "temperature %.1f", temps[k]);
        chi2(name, s, lg, 6, p, N);
        m3_sampler_free(s);
    }
    /* top-k 3 at T = 0.8: ids 2, 5, 1 */
    {
        m3_sampling sp = {.temperature = 0.8f, .top_k = 3, .seed = 21};
        m3_sampler *s = mk(&sp, 6, NULL, 0);
        softmax_d(lg, 6, 0.8, p);
        double z = p[2] + p[5] + p[1];
        for (int i = 0; i < 6; i++) w[i] = (i == 2 || i == 5 || i == 1) ? p[i] / z : 0;
        chi2("top-k 3, T 0.8", s, lg, 6, w, N);
        m3_sampler_free(s);
    }
    /* top-p over probabilities .4 .3 .2 .1 */
    float pl[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    {
        m3_sampling sp = {.temperature = 1, .top_p = 0.75f, .seed = 22};
        m3_sampler *s = mk(&sp, 4, NULL, 0);
        double want[4] = {0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0};
        chi2("top-p 0.75 of .4/.3/.2/.1", s, pl, 4, want, N);
        m3_sampler_free(s);
    }
    /* min-p */
    float ml[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    {
        m3_sampling sp = {.temperature = 1, .min_p = 0.2f, .seed = 24};
        m3_sampler *s = mk(&sp, 4, NULL, 0);
        double want[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
        chi2("min-p 0.2 of .5/.3/.15/.05", s, ml, 4, want, N);
        m3_sampler_free(s);
        /* vLLM V1 order: min-p, then top-p over the renormalized rest (.5/.95 + .3/.95 > .8) */
        m3_sampling sp2 = {.temperature = 1, .min_p = 0.2f, .top_p = 0.8f, .seed = 25};
        s = mk(&sp2, 4, NULL, 0);
        double want2[4] = {0.5 / 0.8, 0.3 / 0.8, 0, 0};
        chi2("min-p 0.2 then top-p 0.8", s, ml, 4, want2, N);
        m3_sampler_free(s);
        /* min-p with T: ratio test on softmax(l / T) */
        m3_sampling sp3 = {.temperature = 2, .min_p = 0.5f, .seed = 26};
        s = mk(&sp3, 4, NULL, 0);
        double q[4];
        softmax_d(ml, 4, 2.0, q);
        double z = 0;
        double q0 = q[0];
        for (int i = 0; i < 4; i++) z += q[i] >= 0.5 * q0 ? q[i] : 0;
        for (int i = 0; i < 4; i++) q[i] = q[i] >= 0.5 * q0 ? q[i] / z : 0;
        chi2("min-p 0.5, T 2", s, ml, 4, q, N);
        m3_sampler_free(s);
    }
    /* top-k + top-p: top-p renormalizes over the top-k set */
    {
        m3_sampling sp = {.temperature = 1, .top_k = 3, .top_p = 0.6f, .seed = 27};
        m3_sampler *s = mk(&sp, 4, NULL, 0);
        /* top-3: .4 .3 .2 (z .9): .4/.9 = .444 < .6 -> keep .3 too; then .7/.9 >= .6 stops */
        double want[4] = {0.4 / 0.7, 0.3 / 0.7, 0, 0};
        chi2("top-k 3 + top-p 0.6", s, pl, 4, want, N);
        m3_sampler_free(s);
    }
    /* the legacy stateless API */
    {
        float two[2] = {0.0f, logf(3.0f)};
        m3_sampling t1 = {.temperature = 1, .top_p = 1};
        m3_rng r;
        m3_rng_seed(&r, 1);
        void *sc = malloc(m3_sample_scratch_bytes(2));
        int c1 = 0, n = 40000;
        for (int i = 0; i < n; i++) c1 += m3_sample(&t1, two, 2, &r, sc);
        double f = (double)c1 / n, sd = sqrt(0.75 * 0.25 / n);
        CHECK(fabs(f - 0.75) < 5 * sd, "legacy m3_sample frequency %.4f, want 0.75", f);
        free(sc);
    }
}

static void test_top_p_small(void) {
    /* top-p 0.35 keeps only the 0.4 token: the mass above the second (.4) is >= .35 */
    float pl[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    m3_sampling sp = {.temperature = 1, .top_p = 0.35f, .seed = 28};
    m3_sampler *s = mk(&sp, 4, NULL, 0);
    int other = 0;
    for (int i = 0; i < 5000; i++) other += draw(s, pl, NULL) != 0;
    CHECK(other == 0, "top-p 0.35 keeps one token (%d others)", other);
    m3_sampler_free(s);
}


static void make_row(float *lg, int V, uint64_t seed, float scale) {
    m3_rng r;
    m3_rng_seed(&r, seed);
    for (int i = 0; i < V; i++) lg[i] = scale * (float)m3_rng_normal(&r);
}

/* reference kept set by a full sort, in the header's order: min-p, top-k, top-p */
typedef struct { float e; int id; } rc;
static int cmp_rc(const void *a, const void *b) {
    const rc *x = a, *y = b;
    if (x->e != y->e) return x->e > y->e ? -1 : 1;
    return x->id - y->id;
}
static int ref_kept(const float *lg, int V, const m3_sampling *p, rc *c, double *total) {
    float m = -INFINITY;
    for (int i = 0; i < V; i++) if (lg[i] > m) m = lg[i];
    int n = 0;
    for (int i = 0; i < V; i++) {
        float e = expf((lg[i] - m) * (1.0f / p->temperature));
        if (e > 0 && e >= p->min_p) { c[n].e = e; c[n].id = i; n++; }
    }
    qsort(c, (size_t)n, sizeof *c, cmp_rc);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double z = 0;
    for (int j = 0; j < n; j++) z += c[j].e;
    if (p->top_p > 0 && p->top_p < 1) {
        double acc = 0;
        int j = 0;
        while (j < n && (j == 0 || acc < p->top_p * z)) acc += c[j++].e;
        n = j;
        z = acc;
    }
    *total = z;
    return n;
}

static void test_big(void) {
    float *lg = malloc(sizeof(float) * BIGV);
    rc *c = malloc(sizeof(rc) * BIGV);
    double *ls = malloc(sizeof(double) * BIGV);
    const struct { float T; int k; float p, minp; float scale; } cases[] = {
        {1.0f, 50, 0, 0, 3}, {0.7f, 0, 0.9f, 0, 3}, {1.0f, 0, 0.95f, 0.01f, 3}, {1.3f, 40, 0.8f, 0.02f, 3},
        {1.0f, 0, 0.9f, 0, 0.2f}, {1.0f, 1000, 0.99f, 0, 1}, {1.0f, 0, 0.5f, 0, 6}};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        make_row(lg, BIGV, 100 + ci, cases[ci].scale);
        m3_sampling sp = {.temperature = cases[ci].T, .top_k = cases[ci].k, .top_p = cases[ci].p, .min_p = cases[ci].minp,
                          .seed = 7, .logprobs = 1, .top_logprobs = 20, .logprobs_mode = M3_LOGPROBS_PROCESSED};
        double total;
        int n = ref_kept(lg, BIGV, &sp, c, &total);
        char *in = calloc(BIGV, 1);
        for (int j = 0; j < n; j++) in[c[j].id] = 1;
        m3_sampler *s = mk(&sp, BIGV, NULL, 0);
        m3_sample_out o;
        int out = 0;
        for (int it = 0; it < 200; it++) {
            int t = draw(s, lg, &o);
            out += !in[t];
        }
        CHECK(out == 0, "case %zu: %d draws outside the reference kept set (%d kept)", ci, out, n);
        /* processed top logprobs = the reference's kept set, renormalized */
        int nt = n < 20 ? n : 20;
        double md = 0;
        int idok = o.n_top == nt;
        for (int j = 0; j < nt && idok; j++) {
            idok &= o.top_ids[j] == c[j].id;
            md = fmax(md, fabs(o.top_logprobs[j] - (log((double)c[j].e) - log(total))));
        }
        CHECK(idok && md < 1e-5, "case %zu: processed top logprobs (ids %s, max diff %.2e)", ci, idok ? "ok" : "differ", md);
        m3_sampler_free(s);
        free(in);
        printf("  V=%d T %.1f top-k %4d top-p %.2f min-p %.2f scale %.1f: kept %6d, draws inside, top20 diff %.1e\n", BIGV,
               cases[ci].T, cases[ci].k, cases[ci].p, cases[ci].minp, cases[ci].scale, n, md);
    }
    /* raw logprobs at V = 200064 against float64 log-softmax */
    make_row(lg, BIGV, 999, 4);
    ref_logsoftmax(lg, BIGV, ls);
    m3_sampling sp = {.temperature = 1, .top_p = 0.9f, .seed = 8, .logprobs = 1, .top_logprobs = 20};
    m3_sampler *s = mk(&sp, BIGV, NULL, 0);
    m3_sample_out o;
    double md = 0;
    int rank_ok = 1, order_ok = 1;
    for (int it = 0; it < 20; it++) {
        int t = draw(s, lg, &o);
        md = fmax(md, fabs(o.logprob - ls[t]));
        int rk = 1;
        for (int i = 0; i < BIGV; i++) rk += ls[i] > ls[t];
        rank_ok &= rk == o.rank;
        for (int j = 0; j < o.n_top; j++) {
            md = fmax(md, fabs(o.top_logprobs[j] - ls[o.top_ids[j]]));
            if (j) order_ok &= o.top_logprobs[j] <= o.top_logprobs[j - 1];
        }
    }
    /* the top 20 ids are the 20 largest */
    for (int i = 0; i < BIGV; i++) { c[i].e = lg[i]; c[i].id = i; }
    qsort(c, BIGV, sizeof *c, cmp_rc);
    int ids_ok = o.n_top == 20;
    for (int j = 0; j < 20 && ids_ok; j++) ids_ok &= o.top_ids[j] == c[j].id;
    CHECK(md < 2e-5, "raw logprobs vs float64 log-softmax: max |diff| %.2e", md);
    CHECK(rank_ok && order_ok && ids_ok, "raw ranks %d, order %d, top-20 ids %d", rank_ok, order_ok, ids_ok);
    printf("  raw logprobs V=%d: max |diff| vs float64 log-softmax %.2e, ranks and top-20 ids exact\n", BIGV, md);
    m3_sampler_free(s);
    free(lg); free(c); free(ls);
}

/* The kept set through m3_sampler_probs against the full-sort reference, exactly (the same ids)
 * and in value (e / total), on rows from peaked to near-flat: every path of keep() (the levels'
 * cuts, every kept token, top-k's quickselect, top-p's prefix select, min-p with both) */
static void test_kept_sets(int budget) {
    m3_sampler_test_part_budget(budget);
    float *lg = malloc(sizeof(float) * BIGV), *prob = malloc(sizeof(float) * BIGV);
    rc *c = malloc(sizeof(rc) * BIGV);
    const float scales[] = {0.05f, 0.5f, 1.5f, 3, 8};
    const struct { float T; int k; float p, minp; } ps[] = {
        {1, 1, 0, 0}, {1, 7, 0, 0}, {0.8f, 300, 0, 0}, {1, 150000, 0, 0}, {1, 0, 0.3f, 0}, {0.7f, 0, 0.9f, 0},
        {1.2f, 0, 0.99f, 0}, {1, 40, 0.95f, 0.01f}, {1, 0, 0.95f, 0.001f}, {2, 5000, 0.8f, 0}, {1, 0, 0, 0.05f}};
    int cases = 0, bad = 0;
    double maxrel = 0;
    for (size_t si = 0; si < sizeof scales / sizeof *scales; si++) {
        make_row(lg, BIGV, 300 + si, scales[si]);
        for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++) {
            m3_sampling sp = {.temperature = ps[pi].T, .top_k = ps[pi].k, .top_p = ps[pi].p, .min_p = ps[pi].minp, .seed = 3};
            double total;
            const int n = ref_kept(lg, BIGV, &sp, c, &total);
            m3_sampler *s = mk(&sp, BIGV, NULL, 0);
            m3_err err;
            if (m3_sampler_probs(s, lg, WS, prob, &err)) { printf("FAIL probs: %s\n", err.msg); exit(1); }
            int got = 0, miss = 0;
            for (int i = 0; i < BIGV; i++) got += prob[i] > 0;
            for (int j = 0; j < n; j++) {
                const double want = c[j].e / total, have = prob[c[j].id];
                if (!(have > 0)) { miss++; continue; }
                maxrel = fmax(maxrel, fabs(have - want) / want);
            }
            cases++;
            if (got != n || miss) {
                bad++;
                printf("FAIL kept set: scale %.2f T %.1f top-k %d top-p %.2f min-p %.3f: %d kept, reference %d (%d missing)\n",
                       scales[si], ps[pi].T, ps[pi].k, ps[pi].p, ps[pi].minp, got, n, miss);
            }
            m3_sampler_free(s);
        }
    }
    m3_sampler_test_part_budget(-1);
    CHECK(!bad && maxrel < 2e-5, "kept sets: %d of %d differ from the full sort; max rel diff of p %.2e", bad, cases, maxrel);
    printf("  kept sets equal to a full sort's in %d cases (peaked to near-flat rows), max rel diff of p %.1e%s\n", cases, maxrel,
           budget == 0 ? " (heapsort only: no partition)" : budget > 0 ? " (partition budget capped)" : "");
    /* a row of -inf only: an error, not a token, on the path that reads the logits directly */
    for (int i = 0; i < 1000; i++) lg[i] = -INFINITY;
    m3_sampling t1 = {.temperature = 1, .top_p = 0.9f};
    m3_sampler *s = mk(&t1, 1000, NULL, 0);
    m3_err err;
    m3_sample_out o;
    CHECK(m3_sampler_sample(s, lg, WS, &o, &err) == -1 && strstr(err.msg, "masked"), "a row of -inf -> error");
    m3_sampler_free(s);
    free(lg); free(prob); free(c);
}

/* A row's passes split over a pool (m3_sample_ws_set_pool): bitwise the same probabilities and
 * the same tokens and logprobs as one thread, in every mode */
static void test_split(void) {
    m3_err err;
    m3_pool *pool = m3_pool_create(3);
    m3_sample_ws *pw = m3_sample_ws_create(BIGV, &err);
    CHECK(pool && pw, "pool / workspace");
    if (!pool || !pw) return;
    m3_sample_ws_set_pool(pw, pool);
    float *lg = malloc(sizeof(float) * BIGV), *p1 = malloc(sizeof(float) * BIGV), *p2 = malloc(sizeof(float) * BIGV);
    const m3_sampling ps[] = {
        {.temperature = 1, .seed = 9}, {.temperature = 0.7f, .top_p = 0.9f, .seed = 9}, {.temperature = 0.8f, .top_k = 40, .seed = 9},
        {.temperature = 1, .min_p = 0.05f, .seed = 9}, {.temperature = 0.8f, .top_p = 0.95f, .seed = 9, .logprobs = 1, .top_logprobs = 5,
                                                      .logprobs_mode = M3_LOGPROBS_PROCESSED},
        {.temperature = 0, .logprobs = 1, .top_logprobs = 3}};
    int bad = 0, draws = 0;
    for (int row = 0; row < 3; row++) {
        make_row(lg, BIGV, 500 + row, row == 0 ? 0.1f : row == 1 ? 1.5f : 4.0f);
        for (size_t k = 0; k < sizeof ps / sizeof *ps; k++) {
            m3_sampler *a = mk(&ps[k], BIGV, NULL, 0), *b = mk(&ps[k], BIGV, NULL, 0);
            m3_sampler_probs(a, lg, WS, p1, &err);
            m3_sampler_probs(b, lg, pw, p2, &err);
            bad += memcmp(p1, p2, sizeof(float) * BIGV) != 0;
            for (int t = 0; t < 20; t++, draws++) {
                m3_sample_out o1, o2;
                m3_sampler_sample(a, lg, WS, &o1, &err);
                m3_sampler_sample(b, lg, pw, &o2, &err);
                bad += o1.token != o2.token || o1.logprob != o2.logprob || o1.rank != o2.rank || o1.n_top != o2.n_top;
            }
            m3_sampler_free(a);
            m3_sampler_free(b);
        }
    }
    CHECK(!bad, "a row split over 3 threads: %d differences from one thread", bad);
    printf("  a row split over 3 threads: probabilities bitwise equal, %d draws equal to one thread's\n", draws);
    m3_sample_ws_free(pw);
    m3_pool_free(pool);
    free(lg); free(p1); free(p2);
}

/* The sampler's vectorized passes (backend/cpu/simd.c) against plain loops, on every length up
 * to 300 and the full vocabulary (the vector tails), with -inf, ties and values at the levels */
static void test_passes(void) {
    float *w = malloc(sizeof(float) * BIGV), *e = malloc(sizeof(float) * BIGV);
    uint64_t *keys = malloc(sizeof(uint64_t) * (BIGV + 8));
    char *seen = malloc(BIGV);
    m3_row_blk *blk = malloc(sizeof(m3_row_blk) * (BIGV / M3_ROW_MASS_BLOCK + 1));
    m3_rng r;
    m3_rng_seed(&r, 77);
    int bad = 0, rows = 0;
    for (int n = 1; n <= BIGV; n = n < 300 ? n + 1 : n == 300 ? BIGV : BIGV + 1) {
        for (int i = 0; i < n; i++) {
            const double u = m3_rng_uniform(&r);
            w[i] = u < 0.05 ? -INFINITY : u < 0.1 ? 0.0f : (float)(int)(m3_rng_uniform(&r) * 64) * 0.125f - 4.0f;
        }
        const float m = w[m3_argmax(w, n)], s = 0.9f, thr = 0.01f, lv[2] = {0.25f, 0.001f};
        for (int want = 0; want < 3; want++) {
            m3_row_exp_stats(w, e, n, m, s, thr, lv, want, blk);
            double worst = 0;
            for (int b0 = 0; b0 < n; b0 += M3_ROW_MASS_BLOCK) {
                double ref = 0, rm[2] = {0, 0};
                int rc_[2] = {0, 0};
                for (int i = b0; i < n && i < b0 + M3_ROW_MASS_BLOCK; i++) {
                    const float arg = (w[i] - m) * s; /* the argument as the pass rounds it */
                    const double x = exp((double)arg);
                    worst = fmax(worst, fabs(e[i] - x) / (x > 1e-30 ? x : 1));
                    if (e[i] >= thr) ref += e[i];
                    for (int j = 0; j < 2; j++) if (e[i] >= lv[j]) { rc_[j]++; rm[j] += e[i]; }
                }
                const m3_row_blk *B = &blk[b0 / M3_ROW_MASS_BLOCK];
                bad += fabs(B->kept - ref) > 1e-6 * (ref + 1e-30);
                if (want >= 1) bad += B->lcnt[0] != rc_[0] || B->lcnt[1] != rc_[1];
                if (want == 2) bad += fabs(B->lmass[0] - rm[0]) > 1e-6 * (rm[0] + 1e-30) || fabs(B->lmass[1] - rm[1]) > 1e-6 * (rm[1] + 1e-30);
            }
            bad += worst > 2e-7;
        }
        /* keys above a level: the same set as a loop, each key once, the key layout */
        for (int ge = 0; ge < 2; ge++) {
            const float v = ge ? e[n / 2] : 0.0f;
            const int k = m3_row_keys_above(e, n, v, ge, keys);
            int want = 0;
            memset(seen, 0, (size_t)n);
            for (int i = 0; i < n; i++) want += ge ? e[i] >= v : e[i] > v;
            for (int j = 0; j < k; j++) {
                const int id = (int)~(uint32_t)keys[j];
                uint32_t u;
                memcpy(&u, &e[id < 0 || id >= n ? 0 : id], 4);
                if (id < 0 || id >= n || seen[id] || (uint32_t)(keys[j] >> 32) != u || !(ge ? e[id] >= v : e[id] > v)) { bad++; break; }
                seen[id] = 1;
            }
            bad += k != want;
            /* find and count against loops */
            int f = 0, cg = 0;
            for (int i = 0; i < n; i++) cg += e[i] > v;
            bad += m3_row_count_gt(e, n, v) != cg;
            int mk_n, mk_ref = 0;
            double mk_ref_m = 0;
            for (int i = 0; i < n; i++) if (e[i] >= v) { mk_ref++; mk_ref_m += e[i]; }
            const double mk_m = m3_row_mass_ge(e, n, v, &mk_n);
            bad += mk_n != mk_ref || fabs(mk_m - mk_ref_m) > 1e-6 * (mk_ref_m + 1e-30);
            for (int from = 0; from < n; from = f + 1) {
                f = m3_row_find(e, from, n, v, ge);
                int g = from;
                while (g < n && !(ge ? e[g] >= v : e[g] > v)) g++;
                if (f != g) { bad++; break; }
                if (n > 300 && from > 4000) break; /* the full row: the first hits are enough */
            }
        }
        double se = 0;
        for (int i = 0; i < n; i++) se += exp((double)w[i] - m);
        bad += fabs(m3_row_sum_exp(w, n, m) - se) > 1e-6 * se;
        rows++;
    }
    CHECK(!bad, "sampler passes: %d mismatches against plain loops over %d rows", bad, rows);
    printf("  vectorized passes (exp + block sums + levels, keys above, find, count, mass above, sum of exp) equal to loops on %d rows\n", rows);
    free(w); free(e); free(keys); free(seen); free(blk);
}

static void test_seeds(void) {
    float *a = malloc(sizeof(float) * BIGV), *b = malloc(sizeof(float) * BIGV);
    make_row(a, BIGV, 1, 2);
    make_row(b, BIGV, 2, 2);
    m3_sampling sp = {.temperature = 1, .top_p = 0.95f, .seed = 1234, .presence_penalty = 0.3f};
    m3_sampling other = {.temperature = 0.8f, .top_k = 20, .seed = 99};
    int seq1[64], seq2[64], seq3[64];
    m3_err err;
    /* alone */
    m3_sampler *s = mk(&sp, BIGV, NULL, 0);
    for (int i = 0; i < 64; i++) { seq1[i] = draw(s, (i & 1) ? a : b, NULL); m3_sampler_accept(s, seq1[i], &err); }
    m3_sampler_free(s);
    /* interleaved with another request sharing the workspace ("batch") */
    s = mk(&sp, BIGV, NULL, 0);
    m3_sampler *o = mk(&other, BIGV, NULL, 0);
    for (int i = 0; i < 64; i++) {
        for (int j = 0; j < i % 3; j++) m3_sampler_accept(o, draw(o, a, NULL), &err);
        seq2[i] = draw(s, (i & 1) ? a : b, NULL);
        m3_sampler_accept(s, seq2[i], &err);
    }
    m3_sampler_free(s); m3_sampler_free(o);
    m3_sampling sp3 = sp;
    sp3.seed = 1235;
    s = mk(&sp3, BIGV, NULL, 0);
    for (int i = 0; i < 64; i++) { seq3[i] = draw(s, (i & 1) ? a : b, NULL); m3_sampler_accept(s, seq3[i], &err); }
    m3_sampler_free(s);
    CHECK(!memcmp(seq1, seq2, sizeof seq1), "same seed, interleaved with another request: same tokens");
    CHECK(memcmp(seq1, seq3, sizeof seq1), "another seed: other tokens");
    free(a); free(b);
}

typedef struct { const char *chunks[8]; const char *want; int stops; } stop_case;

static void test_stop(void) {
    const char *strs[3] = {"</s>", "STOP", "ab"};
    int32_t ids[2] = {7, 9};
    m3_err err;
    m3_stop *st = m3_stop_create(strs, 3, ids, 2, &err);
    CHECK(st && m3_stop_is_token(st, 9) && !m3_stop_is_token(st, 8), "stop ids");
    const stop_case cs[] = {
        {{"hello <", "/", "s> more", NULL}, "hello ", 1},
        {{"x<", "y", " ST", "O", "P!", NULL}, "x<y ", 1},
        {{"no stop here", " at all", NULL}, "no stop here at all", 0},
        {{"a", "a", "a", "b", NULL}, "aa", 1},
        {{"S", "T", "O", "</", "s", ">", NULL}, "STO", 1},
        {{"<</s", ">", NULL}, "<", 1},
        {{"\xc3\xa9", "</", "x", NULL}, "\xc3\xa9</x", 0},
    };
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
        char text[256] = "", emitted[256] = "";
        size_t len = 0, checked = 0, sent = 0;
        int stopped = 0;
        for (int j = 0; cs[k].chunks[j] && !stopped; j++) {
            size_t cl = strlen(cs[k].chunks[j]);
            memcpy(text + len, cs[k].chunks[j], cl);
            len += cl;
            m3_stop_match m;
            stopped = m3_stop_scan(st, text, len, checked, &m);
            checked = len;
            size_t upto = stopped ? m.start : m.safe;
            if (upto > sent) { memcpy(emitted + sent, text + sent, upto - sent); sent = upto; }
            emitted[sent] = 0;
        }
        if (!stopped) { memcpy(emitted + sent, text + sent, len - sent); emitted[len] = 0; } /* flush at the end */
        CHECK(stopped == cs[k].stops && !strcmp(emitted, cs[k].want), "stop case %zu: stopped %d, emitted '%s', want '%s'", k,
              stopped, emitted, cs[k].want);
    }
    /* hold-back amounts */
    m3_stop_match m;
    CHECK(m3_stop_scan(st, "xab", 3, 0, &m) == 1 && m.which == 2 && m.start == 1 && m.end == 3, "match fields");
    CHECK(!m3_stop_scan(st, "xyz ST", 6, 0, &m) && m.safe == 4, "hold 'ST' (safe %zu)", m.safe);
    CHECK(!m3_stop_scan(st, "xyz <", 5, 0, &m) && m.safe == 4, "hold '<'");
    CHECK(!m3_stop_scan(st, "xyz a", 5, 0, &m) && m.safe == 4, "hold 'a'");
    CHECK(!m3_stop_scan(st, "xyz", 3, 0, &m) && m.safe == 3, "nothing held");
    /* an old match is not reported again once checked is past it, the earliest start wins */
    CHECK(m3_stop_scan(st, "1 STOP ab", 9, 0, &m) == 1 && m.which == 1 && m.start == 2, "earliest stop wins");
    const char *empty[1] = {""};
    CHECK(!m3_stop_create(empty, 1, NULL, 0, &err), "empty stop string refused");
    m3_stop_free(st);
}

/* The plain rule, for the randomized check: the earliest-starting occurrence (lowest index on a
 * tie) among those ending after `checked`, else len minus the longest suffix that is a proper
 * prefix of a string. Quadratic, as the matcher was before the automata. */
static int stop_ref(char **strs, int n, const char *text, size_t len, size_t checked, m3_stop_match *m) {
    m->which = -1;
    m->start = m->end = 0;
    m->safe = len;
    size_t best = (size_t)-1;
    for (int i = 0; i < n; i++) {
        size_t L = strlen(strs[i]);
        for (size_t st = 0; st + L <= len; st++)
            if (st + L > checked && !memcmp(text + st, strs[i], L) && st < best) { best = st; m->which = i; m->start = st; m->end = st + L; }
    }
    if (m->which >= 0) { m->safe = m->start; return 1; }
    size_t hold = 0;
    for (int i = 0; i < n; i++) {
        size_t L = strlen(strs[i]);
        for (size_t h = L - 1 < len ? L - 1 : len; h > hold; h--)
            if (!memcmp(text + len - h, strs[i], h)) { hold = h; break; }
    }
    m->safe = len - hold;
    return 0;
}

/* The automata against the plain rule on random texts over a 3-letter alphabet (borders,
 * overlaps, strings inside strings), fed in random chunks; then 16 strings of 16,000 bytes
 * against 200,000 bytes of output that keeps almost matching them, a token at a time (issue 23:
 * the quadratic hold-back took seconds a token there; now linear: it finishes) */
static void test_stop_automata(void) {
    uint64_t r = 12345;
#define RND() (r = r * 6364136223846793005ull + 1442695040888963407ull, (unsigned)(r >> 33))
    int bad = 0, runs = 0;
    for (int it = 0; it < 3000; it++) {
        int n = 1 + (int)(RND() % 4);
        char *strs[4];
        for (int i = 0; i < n; i++) {
            int L = 1 + (int)(RND() % 6);
            strs[i] = malloc((size_t)L + 1);
            for (int j = 0; j < L; j++) strs[i][j] = (char)('a' + RND() % 3);
            strs[i][L] = 0;
        }
        m3_err err;
        m3_stop *st = m3_stop_create((const char *const *)strs, n, NULL, 0, &err);
        char text[64];
        size_t len = 0, checked = 0;
        for (int step = 0; step < 12 && len < 60; step++) {
            size_t add = 1 + RND() % 4;
            for (size_t j = 0; j < add && len < 60; j++) text[len++] = (char)('a' + RND() % 3);
            m3_stop_match a, b;
            int ra = m3_stop_scan(st, text, len, checked, &a), rb = stop_ref(strs, n, text, len, checked, &b);
            runs++;
            if (ra != rb || a.safe != b.safe || (ra && (a.which != b.which || a.start != b.start || a.end != b.end))) {
                if (bad++ < 3) printf("FAIL stop automata: text '%.*s' checked %zu: got %d/%d/%zu, want %d/%d/%zu\n", (int)len, text,
                                      checked, ra, a.which, a.safe, rb, b.which, b.safe);
            }
            if (ra) break;
            checked = len;
        }
        m3_stop_free(st);
        for (int i = 0; i < n; i++) free(strs[i]);
    }
    CHECK(!bad, "stop automata: %d of %d scans differ from the plain rule", bad, runs);
#undef RND
    /* the long strings: dashes, an X, dashes, a number */
    enum { NS = 16, SL = 16000, TL = 200000 };
    char *longs[NS];
    for (int i = 0; i < NS; i++) {
        longs[i] = malloc(SL + 1);
        memset(longs[i], '-', SL);
        longs[i][SL / 2] = 'X';
        snprintf(longs[i] + SL - 3, 4, "%03d", i);
    }
    m3_err err;
    m3_stop *st = m3_stop_create((const char *const *)longs, NS, NULL, 0, &err);
    char *text = malloc(TL);
    size_t checked = 0, emitted = 0;
    int hit = 0;
    double t0 = m3_now();
    for (size_t len = 0; len < TL && !hit;) {
        size_t add = 1 + len % 3;
        for (size_t j = 0; j < add && len < TL; j++, len++) text[len] = (len % 9000 == 8999) ? 'X' : '-';
        m3_stop_match m;
        hit = m3_stop_scan(st, text, len, checked, &m);
        checked = len;
        emitted = hit ? m.start : m.safe;
    }
    printf("stop strings: 16 x 16,000 bytes against %d bytes of near misses a token at a time: %.3f s, %zu bytes "
           "passed on, %s\n", TL, m3_now() - t0, emitted, hit ? "a match" : "no match");
    CHECK(!hit && emitted >= TL - SL, "near misses: no match, all but the held-back tail passed on (%zu)", emitted);
    free(text);
    m3_stop_free(st);
    for (int i = 0; i < NS; i++) free(longs[i]);
}

static double bench(const char *what, const m3_sampling *p, const float *lg, int np) {
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(np ? np : 1));
    for (int i = 0; i < np; i++) prompt[i] = (int32_t)((i * 7919u) % BIGV);
    m3_sampler *s = mk(p, BIGV, prompt, np);
    m3_err err;
    for (int i = 0; i < 3; i++) draw(s, lg, NULL);
    int n = 0;
    double t0 = m3_now(), t1;
    do {
        int t = draw(s, lg, NULL);
        m3_sampler_accept(s, t, &err);
        n++;
        t1 = m3_now();
    } while (t1 - t0 < 0.3 || n < 10);
    double ns = (t1 - t0) / n * 1e9;
    printf("  %-58s %9.0f ns/sample\n", what, ns);
    m3_sampler_free(s);
    free(prompt);
    return ns;
}

static void test_speed(void) {
    float *lg = malloc(sizeof(float) * BIGV);
    make_row(lg, BIGV, 5, 3);
    printf("speed, V=%d, logits N(0, 3^2), one thread:\n", BIGV);
    m3_sampling g = {.temperature = 0};
    bench("greedy", &g, lg, 0);
    m3_sampling t = {.temperature = 1, .seed = 1};
    bench("T 1, no filter", &t, lg, 0);
    m3_sampling k = {.temperature = 0.7f, .top_k = 50, .seed = 1};
    bench("T 0.7, top-k 50", &k, lg, 0);
    m3_sampling pp = {.temperature = 0.7f, .top_p = 0.9f, .seed = 1};
    bench("T 0.7, top-p 0.9", &pp, lg, 0);
    m3_sampling all = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.01f, .seed = 1};
    bench("T 0.8, top-k 40, top-p 0.95, min-p 0.01", &all, lg, 0);
    m3_sampling pen = {.temperature = 0.8f, .top_p = 0.95f, .seed = 1, .repetition_penalty = 1.1f,
                       .presence_penalty = 0.5f, .frequency_penalty = 0.5f};
    bench("T 0.8, top-p 0.95, 3 penalties, 4096-token prompt", &pen, lg, 4096);
    m3_sampling lp = {.temperature = 0.8f, .top_p = 0.95f, .seed = 1, .logprobs = 1, .top_logprobs = 20};
    bench("T 0.8, top-p 0.95, logprobs + top_logprobs 20 (raw)", &lp, lg, 0);
    make_row(lg, BIGV, 6, 0.1f);
    bench("worst case: near-flat logits N(0, 0.1^2), top-p 0.9", &pp, lg, 0);
    free(lg);
}

/* n_text: a vocabulary padded past the tokenizer. Ids from n_text on never come out (greedy,
 * sampled, every filter, the speculative probabilities), raw logprobs are the log-softmax of
 * [0, n_text), and a row whose text ids are all masked is an error naming it. */
static void test_text_vocab(void) {
    enum { V = 1000, NT = 900 };
    float lg[V];
    for (int i = 0; i < V; i++) lg[i] = (float)((i * 37) % 101) / 20.0f;
    lg[950] = 40; /* a padded row the model likes best */
    lg[999] = 39;
    lg[123] = 6;
    m3_sampling g = {0};
    g.n_text = NT;
    g.logprobs = 1;
    g.top_logprobs = 5;
    m3_sampler *s = mk(&g, V, NULL, 0);
    m3_sample_out o;
    CHECK(draw(s, lg, &o) == 123, "greedy skips the padded rows: %d", o.token);
    double mx = -1e30, z = 0;
    for (int i = 0; i < NT; i++) mx = lg[i] > mx ? lg[i] : mx;
    for (int i = 0; i < NT; i++) z += exp((double)lg[i] - mx);
    CHECK(fabs(o.logprob - (float)((double)lg[123] - mx - log(z))) < 1e-5, "raw logprob over the text ids: %g", o.logprob);
    for (int j = 0; j < o.n_top; j++) CHECK(o.top_ids[j] < NT, "top logprob id %d is a padded row", o.top_ids[j]);
    CHECK(o.rank == 1, "rank %d", o.rank);
    m3_sampler_free(s);
    /* sampled with every filter combination, and with a bias on a padded row */
    m3_logit_bias b = {990, 100};
    const float cs[4][4] = {{1.0f, 0, 0, 0}, {1.0f, 50, 0, 0}, {0.7f, 0, 0.9f, 0}, {1.5f, 0, 0, 0.01f}}; /* T, k, p, min-p */
    for (size_t k = 0; k < 4; k++) {
        m3_sampling p = {0};
        p.temperature = cs[k][0];
        p.top_k = (int)cs[k][1];
        p.top_p = cs[k][2];
        p.min_p = cs[k][3];
        p.seed = 7 + k;
        p.n_text = NT;
        p.logit_bias = &b;
        p.n_logit_bias = 1;
        m3_sampler *t = mk(&p, V, NULL, 0);
        int bad = 0;
        for (int r = 0; r < 3000; r++) bad += draw(t, lg, NULL) >= NT;
        CHECK(!bad, "case %zu: %d draws from the padded rows", k, bad);
        static float prob[V];
        m3_err err;
        CHECK(!m3_sampler_probs(t, lg, WS, prob, &err), "probs: %s", err.msg);
        double in = 0, out = 0;
        for (int i = 0; i < V; i++) {
            if (i < NT) in += prob[i];
            else out += prob[i];
        }
        CHECK(out == 0 && fabs(in - 1) < 1e-5, "case %zu: probabilities %g on text ids, %g on padded rows", k, in, out);
        m3_sampler_free(t);
    }
    /* every text id masked: an error, not a padded id */
    int32_t allowed[2] = {950, 999};
    m3_sampling a = {0};
    a.n_text = NT;
    a.allowed_ids = allowed;
    a.n_allowed = 2;
    m3_sampler *u = mk(&a, V, NULL, 0);
    m3_err err;
    CHECK(m3_sampler_sample(u, lg, WS, &o, &err) < 0 && strstr(err.msg, "masked"), "only padded ids allowed: %s", err.msg);
    m3_sampler_free(u);
    m3_sampling bad = {0};
    bad.n_text = -1;
    CHECK(!m3_sampler_create(&bad, V, NULL, 0, &err) && strstr(err.msg, "n_text"), "negative n_text: %s", err.msg);
}

/* bad words: a sequence's last token is banned right after its other tokens were generated
 * (one-token sequences always); greedy and sampled, across accepts, and bad arguments */
static void test_bad_words(void) {
    float lg[6] = {0.1f, 3.0f, 2.0f, -1.0f, 0.5f, 2.5f}; /* greedy: 1, then 5, then 2 */
    /* sequences: {1} never; {4, 5} (5 not right after 4); {2, 3, 5} (5 not right after 2, 3) */
    int32_t bw[6] = {1, 4, 5, 2, 3, 5}, off[4] = {0, 1, 3, 6};
    m3_sampling g = {.temperature = 0, .bad_words = bw, .bad_word_off = off, .n_bad_words = 3};
    m3_sampler *s = mk(&g, 6, NULL, 0);
    m3_err err;
    CHECK(draw(s, lg, NULL) == 5, "bad word {1}: greedy takes 5 instead of 1");
    CHECK(!m3_sampler_accept(s, 4, &err) && draw(s, lg, NULL) == 2, "after 4, {4, 5} bans 5: greedy takes 2");
    CHECK(!m3_sampler_accept(s, 2, &err) && draw(s, lg, NULL) == 5, "after 4 2: 5 is free again");
    CHECK(!m3_sampler_accept(s, 3, &err) && draw(s, lg, NULL) == 2, "after 2 3, {2, 3, 5} bans 5");
    CHECK(!m3_sampler_accept(s, 0, &err) && draw(s, lg, NULL) == 5, "after 3 0: 5 is free again (the ring of 2 wrapped)");
    m3_sampler_free(s);
    /* sampled: after 4, 5 never comes out; its mass goes to the others in proportion */
    m3_sampling t = {.temperature = 1, .seed = 9, .bad_words = bw, .bad_word_off = off, .n_bad_words = 3};
    s = mk(&t, 6, NULL, 0);
    CHECK(!m3_sampler_accept(s, 4, &err), "accept");
    double want[6] = {0}, z = 0;
    for (int i = 0; i < 6; i++) if (i != 1 && i != 5) z += exp(lg[i]);
    for (int i = 0; i < 6; i++) want[i] = i != 1 && i != 5 ? exp(lg[i]) / z : 0;
    chi2("bad words after 4: {1} and {4, 5} banned", s, lg, 6, want, 20000);
    m3_sampler_free(s);
    /* every token a bad word: an error, not a token */
    int32_t all[6] = {0, 1, 2, 3, 4, 5}, aoff[7] = {0, 1, 2, 3, 4, 5, 6};
    m3_sampling ta = {.temperature = 1, .bad_words = all, .bad_word_off = aoff, .n_bad_words = 6};
    s = mk(&ta, 6, NULL, 0);
    m3_sample_out o;
    CHECK(m3_sampler_sample(s, lg, WS, &o, &err) == -1 && strstr(err.msg, "bad words"), "every token a bad word -> error");
    m3_sampler_free(s);
    /* bad arguments */
    int32_t oob[2] = {1, 6}, o2[2] = {0, 2}, empty_off[3] = {0, 0, 1};
    m3_sampling b1 = {.bad_words = oob, .bad_word_off = o2, .n_bad_words = 1};
    CHECK(!m3_sampler_create(&b1, 6, NULL, 0, &err) && strstr(err.msg, "outside the vocabulary"), "bad word id 6 of 6: %s", err.msg);
    m3_sampling b2 = {.bad_words = oob, .bad_word_off = empty_off, .n_bad_words = 2};
    CHECK(!m3_sampler_create(&b2, 6, NULL, 0, &err) && strstr(err.msg, "0 tokens"), "an empty bad word: %s", err.msg);
}

/* the reasoning budget (vLLM's thinking_token_budget): the reasoning's tokens counted from the
 * prompt's open tag or a generated one, the close tag forced once the budget is spent (greedy,
 * sampled, whatever the row says of it), sections reopened, and the horizon of the plain answers */
static void test_think_budget(void) {
    enum { V = 8, OPEN = 6, CLOSE = 7 };
    float lg[V] = {0.5f, 3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f, -INFINITY}; /* greedy: 1; the close tag impossible */
    m3_err err;
    int32_t pr[4] = {0, 2, OPEN, 3}; /* the prompt ends inside reasoning, 1 token in */
    m3_sampling g = {.temperature = 0, .think_on = 1, .think_start_id = OPEN, .think_end_id = CLOSE, .think_budget = 3};
    m3_sampler *s = mk(&g, V, pr, 4);
    int got[8];
    for (int i = 0; i < 8; i++) {
        got[i] = draw(s, lg, NULL);
        CHECK(!m3_sampler_accept(s, got[i], &err), "accept");
    }
    CHECK(got[0] == 1 && got[1] == 1 && got[2] == CLOSE && got[3] == 1 && got[7] == 1,
          "budget 3, 1 token in the prompt: 1 1 then the close tag, then free: %d %d %d %d", got[0], got[1], got[2], got[3]);
    CHECK(!m3_sampler_accept(s, OPEN, &err), "accept"); /* a new section: a new budget */
    for (int i = 0; i < 4; i++) {
        got[i] = draw(s, lg, NULL);
        CHECK(!m3_sampler_accept(s, got[i], &err), "accept");
    }
    CHECK(got[0] == 1 && got[2] == 1 && got[3] == CLOSE, "a reopened section: 3 tokens, then the close tag (%d)", got[3]);
    m3_sampler_free(s);
    /* budget 0 at an open tag: the close tag at once; a prompt whose reasoning closed: free */
    int32_t pr2[2] = {OPEN, CLOSE};
    m3_sampling z = {.temperature = 0, .think_on = 1, .think_start_id = OPEN, .think_end_id = CLOSE, .think_budget = 0};
    s = mk(&z, V, pr, 3);
    CHECK(draw(s, lg, NULL) == CLOSE, "budget 0 after the open tag: the close tag first");
    m3_sampler_free(s);
    s = mk(&z, V, pr2, 2);
    CHECK(draw(s, lg, NULL) == 1, "the prompt's reasoning closed: nothing forced");
    m3_sampler_free(s);
    /* sampled, with processed logprobs: the forced token has all the mass */
    m3_sampling t = {.temperature = 1, .seed = 3, .top_p = 0.5f, .think_on = 1, .think_start_id = OPEN, .think_end_id = CLOSE, .think_budget = 1,
                     .logprobs = 1, .logprobs_mode = M3_LOGPROBS_PROCESSED};
    s = mk(&t, V, pr, 3);
    m3_sample_out o;
    const int first = draw(s, lg, &o);
    CHECK(first != CLOSE && !m3_sampler_accept(s, first, &err), "sampled: the first token is free (%d)", first);
    CHECK(draw(s, lg, &o) == CLOSE && o.logprob == 0, "sampled: then the close tag, logprob %g", o.logprob);
    m3_sampler_free(s);
    /* the plain answers (device draws, verification) for a verification's rows: off when the budget
     * runs out at one of them (along the drafts when they are known; else at any k) */
    m3_sampling far = {.temperature = 0, .think_on = 1, .think_start_id = OPEN, .think_end_id = CLOSE, .think_budget = 8};
    s = mk(&far, V, pr, 3); /* in reasoning, 0 tokens in: forced at row 8 */
    CHECK(m3_sampler_plain_greedy(s, NULL, 7) == V && m3_sampler_plain_greedy(s, NULL, 8) == 0, "8 left: any 7 drafts plain, 8 not");
    CHECK(!m3_sampler_accept(s, 1, &err) && m3_sampler_plain_greedy(s, NULL, 6) == V && m3_sampler_plain_greedy(s, NULL, 7) == 0, "7 left");
    const int32_t closing[8] = {1, CLOSE, 1, 1, 1, 1, 1, 1}, plainp[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(m3_sampler_plain_greedy(s, closing, 8) == V && m3_sampler_plain_greedy(s, plainp, 8) == 0 && m3_sampler_plain_greedy(s, plainp, 6) == V,
          "along the drafts: closed by the 2nd, 8 drafts plain; without a close, the 8th row forced");
    for (int i = 0; i < 7; i++) CHECK(!m3_sampler_accept(s, 1, &err), "accept");
    CHECK(m3_sampler_plain_greedy(s, NULL, 0) == 0, "spent: the next row is forced");
    CHECK(!m3_sampler_accept(s, CLOSE, &err) && m3_sampler_plain_greedy(s, NULL, 8) == V && m3_sampler_plain_greedy(s, NULL, 9) == 0,
          "closed: an open tag and 8 tokens fit 9 rows, the forced close is the 10th");
    m3_sampler_free(s);
    m3_sampling zero = {.temperature = 0, .think_on = 1, .think_start_id = OPEN, .think_end_id = CLOSE, .think_budget = 0};
    s = mk(&zero, V, NULL, 0);
    const int32_t opens[3] = {1, OPEN, 1};
    CHECK(m3_sampler_plain_greedy(s, NULL, 0) == V && m3_sampler_plain_greedy(s, NULL, 1) == 0 && m3_sampler_plain_greedy(s, plainp, 7) == V &&
              m3_sampler_plain_greedy(s, opens, 3) == 0 && m3_sampler_plain_greedy(s, opens, 1) == V,
          "budget 0 outside reasoning: plain along drafts that open nothing (any 7), not along one that opens");
    m3_sampler_free(s);
    /* a grammar's mask constrains the row: it decides, nothing is forced */
    uint32_t mask[1] = {1u << 2}, mask2[1] = {1u << 2 | 1u << CLOSE};
    s = mk(&zero, V, pr, 3);
    m3_sampler_set_mask(s, mask);
    CHECK(draw(s, lg, NULL) == 2, "spent under a token mask without the close tag: the mask's token");
    m3_sampler_set_mask(s, mask2);
    CHECK(draw(s, lg, NULL) == CLOSE, "... under one that allows it: the close tag");
    m3_sampler_set_mask(s, NULL);
    CHECK(draw(s, lg, NULL) == CLOSE, "... and without a mask");
    m3_sampler_free(s);
    /* think_from: the prompt's tags before it do not count (a tag quoted in an earlier turn) */
    m3_sampling from = {.temperature = 0, .think_on = 1, .think_start_id = OPEN, .think_end_id = CLOSE, .think_budget = 0, .think_from = 3};
    s = mk(&from, V, pr, 4);
    CHECK(draw(s, lg, NULL) == 1, "the open tag before think_from: not in reasoning");
    m3_sampler_free(s);
    from.think_from = 2;
    s = mk(&from, V, pr, 4);
    CHECK(draw(s, lg, NULL) == CLOSE, "the open tag at think_from: in reasoning");
    m3_sampler_free(s);
    /* bad arguments */
    m3_sampling b1 = {.think_on = 1, .think_start_id = OPEN, .think_end_id = CLOSE, .think_budget = -1};
    CHECK(!m3_sampler_create(&b1, V, NULL, 0, &err) && strstr(err.msg, "think_budget"), "budget -1: %s", err.msg);
    m3_sampling b2 = {.think_on = 1, .think_start_id = OPEN, .think_end_id = V, .think_budget = 1};
    CHECK(!m3_sampler_create(&b2, V, NULL, 0, &err) && strstr(err.msg, "reasoning tags"), "close tag id 8 of 8: %s", err.msg);
    m3_sampling b3 = {.think_on = 1, .think_start_id = CLOSE, .think_end_id = CLOSE, .think_budget = 1};
    CHECK(!m3_sampler_create(&b3, V, NULL, 0, &err) && strstr(err.msg, "reasoning tags"), "one id for both tags: %s", err.msg);
    m3_sampling b4 = {.think_on = 1, .think_start_id = OPEN, .think_end_id = CLOSE, .think_budget = 1, .think_from = 4};
    CHECK(!m3_sampler_create(&b4, V, pr, 4, &err) && strstr(err.msg, "think_from"), "think_from 4 of 4 prompt ids: %s", err.msg);
}

int main(void) {
    m3_err err;
    WS = m3_sample_ws_create(BIGV, &err);
    if (!WS) { printf("FAIL %s\n", err.msg); return 1; }
    test_argmax();
    test_greedy_bias_mask();
    test_bad_words();
    test_think_budget();
    test_token_mask();
    test_text_vocab();
    test_penalties();
    test_distributions();
    test_top_p_small();
    test_passes();
    test_split();
    test_big();
    test_kept_sets(-1);
    test_kept_sets(0); /* the heapsort a partition budget falls back to */
    test_kept_sets(2);
    test_seeds();
    test_stop();
    test_stop_automata();
    test_speed();
    m3_sample_ws_free(WS);
    if (fails) { printf("%d sampler check(s) failed\n", fails); return 1; }
    printf("sampler tests passed\n");
    return 0;
}
