/* DSpark speculative decoding end to end on a tiny random target + draft (m3 make-tiny
 * --with-dspark), CPU backend ($M3_THREADS threads, default all cores):
 *   1. greedy: requests with random prompts arriving at different steps, batched under a small
 *      token budget, give bitwise the tokens and logprobs of the engine without speculation, for
 *      every k from 1 to 8: with the real (random) draft, and with a test hook that proposes
 *      the true continuation with some tokens corrupted (so every acceptance length, full
 *      acceptance + bonus included, occurs);
 *   1b. disable_by_batch_size: steps with more running requests decode without drafts, outputs
 *      bitwise those of plain decoding; the drafts after speculation resumes are those of an
 *      engine that drafted all along (the draft's context took the rows of the plain steps);
 *   2. the same under a tight KV pool (preemptions) with prefix caching, and with NVFP4 caches;
 *   3. rejected tokens never reach the prefix cache: a request that reuses the blocks of an
 *      earlier speculative request (prompt = its prompt + output) gives bitwise the output of
 *      an engine without speculation;
 *   4. cache state after rejections (m3_forward level): verify forwards with wrong drafts and
 *      a roll back of the sequence length give bitwise the logits of plain decoding at every
 *      next step (f32 and NVFP4 KV, sparse layers crossing blocks and pages), and the draft
 *      context built from committed rows only gives bitwise the draft logits of a context
 *      built from scratch (its ring grown and wrapped past the window);
 *   4b. the draft's block logits (+ Markov term) against a double-precision reference written
 *      straight from spec section 4, inside and past the sliding window;
 *   5. sampled: the first 4 tokens of requests with allowed_ids (4 tokens), penalties,
 *      temperature and top-p (the draft's draws on the host), and of plain requests (temperature,
 *      top-k 4, top-p: the draft's distributions and draws and the verification on the backend,
 *      ops draw_rows / verify_rows), drawn with DSpark (probabilistic and greedy drafts) and
 *      without, against their exact joint distribution computed from the target (chi-square);
 *   5b. (CPU) such requests verified on the backend give the tokens of the host's verification,
 *      also when a step's forward fails once (verified on the host with the q rows brought back)
 *      and beside a request with a penalty (the draft's draws on the host, q rows uploaded);
 *   6. acceptance statistics (MAL, per position) and draft loading errors.
 * Usage: test_spec_engine CHECKPOINT_DIR (with dspark/ inside) [SECTIONS: a comma list of greedy,
 * cache, sampled, errors; default all] [BACKEND: cpu (default) or cuda]
 * With cuda (scripts/gpu.sh section 9, issue 27) the target, and with it the engine's draft, run
 * on the GPU in exact precision: section 5 then checks the GPU draft's sampled outputs against the
 * GPU target's exact joint. (The greedy sections compare logprobs bitwise with the engine without
 * speculation, which holds where a verify pass and a decode step run the same arithmetic: on the
 * CPU, not across the GPU's kernels for 1 and k + 1 tokens.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"
#include "base/clock.h"
#include "model/group.h"
#include "engine/engine.h"
#include "model/dspark.h"
#include "model/m3.h"

#include "../check.h"

enum { MAXTOK = 200, MAXREQ = 16, MAXPROMPT = 400 };

static const char *DIR_;

typedef struct {
    int32_t prompt[MAXPROMPT];
    int n_prompt;
    m3_sampling sp;
    int max_tokens, ignore_eos, arrive;
    int no_logprobs; /* the token alone (a plain sampled row is then drawn where its logits are) */
} rspec;

typedef struct {
    uint64_t id;
    int32_t tok[MAXTOK];
    float lp[MAXTOK];
    int n, finished, reason, bad;
} result;

static void on_token(void *arg, uint64_t id, int32_t token, float logprob, int finished, int reason) {
    result *r = arg;
    if (r->finished || (r->id && id != r->id)) { r->bad++; return; }
    if (token >= 0) {
        if (r->n < MAXTOK) { r->tok[r->n] = token; r->lp[r->n] = logprob; }
        r->n++;
    }
    if (finished) { r->finished = 1; r->reason = reason; }
}

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

/* ---- the oracle draft hook: the expected continuation, some positions corrupted ---- */
typedef struct {
    const rspec *specs;
    const result *expect;   /* the outputs without speculation */
    result *res;            /* to map ids to specs */
    int n;
    int corrupt_pct;
    int calls;
} oracle;

static void oracle_hook(void *arg, uint64_t id, const int32_t *tok, int n_tok, int32_t *draft, int k) {
    oracle *o = arg;
    for (int i = 0; i < o->n; i++) {
        if (o->res[i].id != id) continue;
        int g = n_tok - o->specs[i].n_prompt; /* tokens generated so far */
        uint64_t h = id * 0x9e3779b97f4a7c15ull ^ (uint64_t)n_tok * 0xbf58476d1ce4e5b9ull;
        for (int j = 0; j < k; j++) {
            int idx = g + j;
            int32_t want = idx < o->expect[i].n ? o->expect[i].tok[idx] : 7;
            if ((int)(rnd(&h) % 100) < o->corrupt_pct) want = (want + 1 + (int32_t)(rnd(&h) % 50)) % 1000;
            draft[j] = want;
        }
        o->calls++;
        (void)tok;
        return;
    }
}

typedef struct {
    int steps, max_step_tokens;
    m3_engine_stats st;
} run_info;

static int run(m3_model *m, const m3_engine_opts *o, const rspec *specs, int n, result *res, run_info *ri) {
    m3_err err;
    memset(ri, 0, sizeof *ri);
    memset(res, 0, sizeof *res * (size_t)n);
    m3_engine *e = m3_engine_create(m, o, &err);
    if (!e) { CHECK(0, "engine create: %s", err.msg); return -1; }
    int added = 0, step = 0, rc = 0;
    for (;;) {
        for (int i = 0; i < n; i++)
            if (!res[i].id && specs[i].arrive <= step) {
                m3_engine_request q = {.prompt = specs[i].prompt, .n_prompt = specs[i].n_prompt, .sampling = specs[i].sp,
                                       .max_tokens = specs[i].max_tokens, .ignore_eos = specs[i].ignore_eos,
                                       .on_token = on_token, .arg = &res[i]};
                q.sampling.logprobs = !specs[i].no_logprobs; /* compared bitwise */
                res[i].id = m3_engine_add(e, &q, &err);
                if (!res[i].id) { CHECK(0, "add %d: %s", i, err.msg); rc = -1; goto out; }
                added++;
            }
        if (added == n && !m3_engine_has_work(e)) break;
        if (m3_engine_step(e, &err) < 0) { CHECK(0, "step %d: %s", step, err.msg); rc = -1; goto out; }
        m3_engine_step_stats ss;
        m3_engine_last_step(e, &ss);
        if (ss.n_tokens > ri->max_step_tokens) ri->max_step_tokens = ss.n_tokens;
        if (ss.n_tokens > o->max_num_batched_tokens) { CHECK(0, "step %d: %d tokens over the budget", step, ss.n_tokens); }
        if (++step > 200000) { CHECK(0, "engine does not finish"); rc = -1; goto out; }
    }
    ri->steps = step;
    m3_engine_get_stats(e, &ri->st);
out:
    m3_engine_destroy(e);
    return rc;
}

static int same(const result *a, const result *b) {
    return a->finished && b->finished && a->n == b->n && a->reason == b->reason && a->n <= MAXTOK && !a->bad && !b->bad &&
           !memcmp(a->tok, b->tok, sizeof(int32_t) * (size_t)a->n) && !memcmp(a->lp, b->lp, sizeof(float) * (size_t)a->n);
}

static int compare(const char *what, const result *a, const result *b, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        int ok = same(&a[i], &b[i]);
        CHECK(ok, "%s: request %d: %d tokens (%s) vs %d (%s)", what, i, a[i].n, m3_engine_finish_name(a[i].reason), b[i].n,
              m3_engine_finish_name(b[i].reason));
        k += ok;
    }
    return k;
}

static double mal(const m3_engine_stats *st) {
    return st->spec_verify_steps ? (double)st->spec_emitted_tokens / st->spec_verify_steps : 0;
}

static void spec_opts(m3_engine_opts *o, int k, int method) {
    memset(&o->spec, 0, sizeof o->spec);
    o->spec.method = M3_SPEC_DSPARK;
    o->spec.num_speculative_tokens = k;
    o->spec.draft_sample_method = method;
    snprintf(o->spec.draft_dir, sizeof o->spec.draft_dir, "%s/dspark", DIR_);
}

static void print_pos(const m3_engine_stats *st) {
    for (int i = 0; i < st->spec_k; i++)
        printf(" %.2f", st->spec_drafted_per_pos[i] ? (double)st->spec_accepted_per_pos[i] / st->spec_drafted_per_pos[i] : 0);
}

/* ---------------------------------------------------------------- 1-3: greedy */

#define THINK_OPEN(V) ((V) - 3)
#define THINK_CLOSE(V) ((V) - 2)

static void greedy_specs(rspec *s, int n, int V, uint64_t seed) {
    uint64_t r = seed;
    for (int i = 0; i < n; i++) {
        memset(&s[i], 0, sizeof s[i]);
        s[i].n_prompt = 1 + (int)(rnd(&r) % 120);
        for (int j = 0; j < s[i].n_prompt; j++) s[i].prompt[j] = 2 + (int32_t)(rnd(&r) % (uint64_t)(V - 2));
        s[i].max_tokens = 8 + (int)(rnd(&r) % 28);
        s[i].ignore_eos = i % 2;
        s[i].arrive = (int)(rnd(&r) % 10);
        if (i % 4 == 3) { s[i].sp.repetition_penalty = 1.3f; s[i].sp.frequency_penalty = 0.4f; } /* greedy + penalties */
        if (i % 4 == 1) { /* a reasoning budget (sampler.h): the prompt ends inside reasoning, the close tag forced
                           * within a verification; no logprobs, so its other rows are the backend's (greedy ids) */
            s[i].prompt[s[i].n_prompt - 1] = THINK_OPEN(V);
            s[i].sp.think_on = 1;
            s[i].sp.think_start_id = THINK_OPEN(V);
            s[i].sp.think_end_id = THINK_CLOSE(V);
            s[i].sp.think_budget = 5 + (i / 4) * 2;
            s[i].no_logprobs = 1;
            if (s[i].max_tokens < 20) s[i].max_tokens = 20;
        }
    }
}

/* the requests of greedy_specs with a reasoning budget close it where the budget runs out */
static void check_think_closed(const rspec *s, const result *r, int n, int V) {
    int closed = 0;
    for (int i = 0; i < n; i++) {
        const int b = s[i].sp.think_budget;
        if (!s[i].sp.think_on || b >= r[i].n) continue;
        int early = 0;
        for (int j = 0; j < b; j++) early |= r[i].tok[j] == THINK_CLOSE(V);
        CHECK(!early && r[i].tok[b] == THINK_CLOSE(V), "request %d: budget %d, token %d is %d, not the close tag %d", i, b, b,
              r[i].tok[b], THINK_CLOSE(V));
        closed++;
    }
    CHECK(closed > 0, "no request closed its reasoning");
}

static void test_greedy(m3_model *m) {
    enum { N = 8 };
    static rspec specs[N];
    static result base[N], got[N];
    const int V = m->cfg.vocab;
    greedy_specs(specs, N, V, 0x1234567);
    m3_engine_opts o;
    m3_engine_opts_default(&o);
    o.kv_pages = 200;
    o.max_num_seqs = 6;
    o.max_num_batched_tokens = 64;
    run_info rb, ri;
    if (run(m, &o, specs, N, base, &rb)) return;
    check_think_closed(specs, base, N, V);
    printf("1. greedy, %d requests (prompts 1..120, up to 35 tokens, 6 seqs / 64 tokens per step; reasoning budgets closing, "
           "penalties), bitwise equal to no speculation:\n", N);
    for (int hook = 0; hook < 2; hook++) {
        for (int k = 1; k <= 8; k++) {
            m3_engine_opts os = o;
            spec_opts(&os, k, M3_SPEC_DRAFT_PROBABILISTIC);
            oracle orc = {specs, base, got, N, 20, 0};
            if (hook) { os.draft_hook = oracle_hook; os.draft_hook_arg = &orc; }
            /* odd k: the step's verifications on 4 sampling threads (sample_rows), the same tokens */
            os.sample_threads = k % 2 ? 4 : 1;
            if (run(m, &os, specs, N, got, &ri)) return;
            int eq = compare(hook ? "greedy, oracle drafts" : "greedy, dspark drafts", got, base, N);
            if (k % 2) CHECK(ri.st.tokens_sampled_parallel > 0, "k %d: no verification ran on the sampling threads", k);
            CHECK(ri.st.kv_blocks_used == 0, "blocks used at the end: %d", ri.st.kv_blocks_used);
            CHECK(ri.st.spec_verify_steps > 0 && ri.st.spec_k == k, "verify steps %llu", (unsigned long long)ri.st.spec_verify_steps);
            if (hook) CHECK(ri.st.spec_accepted_tokens > 0 && ri.st.spec_accepted_per_pos[k - 1] > 0,
                            "oracle drafts: accepted %llu, at the last position %llu", (unsigned long long)ri.st.spec_accepted_tokens,
                            (unsigned long long)ri.st.spec_accepted_per_pos[k - 1]);
            printf("   %s k %d: %2d / %d equal; %3d steps (no spec %3d); %4llu verify steps, %4llu drafts, %4llu accepted, "
                   "MAL %.2f; by position:",
                   hook ? "oracle (20% corrupted)" : "dspark (random)       ", k, eq, N, ri.steps, rb.steps,
                   (unsigned long long)ri.st.spec_verify_steps, (unsigned long long)ri.st.spec_draft_tokens,
                   (unsigned long long)ri.st.spec_accepted_tokens, mal(&ri.st));
            print_pos(&ri.st);
            printf("\n");
        }
    }
    /* the [open] switch: the last target layer after the final norm (outputs stay exact) */
    {
        m3_engine_opts os = o;
        spec_opts(&os, 3, M3_SPEC_DRAFT_PROBABILISTIC);
        os.spec.last_layer_final_norm = 1;
        if (run(m, &os, specs, N, got, &ri)) return;
        int eq = compare("last layer after the final norm", got, base, N);
        printf("   dspark_last_layer_final_norm k 3: %d / %d equal\n", eq, N);
    }
    /* 2: tight pool with prefix caching (preemptions), and NVFP4 caches */
    for (int variant = 0; variant < 2; variant++) {
        m3_engine_opts t = o;
        if (variant == 0) {
            t.kv_pages = 12; /* 192 tokens; the largest request needs 155 */
            t.enable_prefix_caching = 1;
        } else {
            t.kv_dtype = t.index_dtype = M3_KV_NVFP4;
        }
        static result b2[N];
        run_info r2;
        if (run(m, &t, specs, N, b2, &r2)) return;
        spec_opts(&t, 4, M3_SPEC_DRAFT_PROBABILISTIC);
        oracle orc = {specs, b2, got, N, 25, 0};
        t.draft_hook = oracle_hook;
        t.draft_hook_arg = &orc;
        if (run(m, &t, specs, N, got, &ri)) return;
        int eq = compare(variant ? "nvfp4 caches" : "tight pool", got, b2, N);
        if (!variant) CHECK(ri.st.preemptions > 0, "preemptions %llu", (unsigned long long)ri.st.preemptions);
        CHECK(ri.st.kv_blocks_used == 0, "blocks used at the end %d", ri.st.kv_blocks_used);
        printf("2. %s, k 4, oracle drafts: %d / %d equal to no speculation; %llu preemptions (no spec: %llu); MAL %.2f\n",
               variant ? "NVFP4 KV + index-K caches" : "tight pool (12 pages) + prefix cache", eq, N,
               (unsigned long long)ri.st.preemptions, (unsigned long long)r2.st.preemptions, mal(&ri.st));
    }
    /* 3: blocks of a speculative request reused through the prefix cache */
    {
        static rspec a[1], b[1];
        memset(a, 0, sizeof a);
        a[0].n_prompt = 10;
        for (int j = 0; j < 10; j++) a[0].prompt[j] = 100 + 37 * j;
        a[0].max_tokens = 150;
        a[0].ignore_eos = 1;
        m3_engine_opts t = o;
        t.enable_prefix_caching = 1;
        spec_opts(&t, 5, M3_SPEC_DRAFT_PROBABILISTIC);
        static result ra[1], rb1[1], rb2[1];
        m3_engine *e = m3_engine_create(m, &t, NULL);
        CHECK(e != NULL, "create");
        if (!e) return;
        /* A then B in one engine: B's prompt = A's prompt + output, so B's admission finds A's blocks */
        m3_err err;
        memset(ra, 0, sizeof ra);
        m3_engine_request q = {.prompt = a[0].prompt, .n_prompt = 10, .max_tokens = 150, .ignore_eos = 1,
                               .sampling = {.logprobs = 1}, .on_token = on_token, .arg = &ra[0]};
        m3_engine_add(e, &q, &err);
        while (m3_engine_step(e, &err) > 0) {}
        b[0] = a[0];
        b[0].n_prompt = 10 + ra[0].n;
        memcpy(b[0].prompt + 10, ra[0].tok, sizeof(int32_t) * (size_t)ra[0].n);
        b[0].max_tokens = 20;
        memset(rb1, 0, sizeof rb1);
        q.prompt = b[0].prompt;
        q.n_prompt = b[0].n_prompt;
        q.max_tokens = 20;
        q.arg = &rb1[0];
        m3_engine_add(e, &q, &err);
        while (m3_engine_step(e, &err) > 0) {}
        m3_engine_stats st;
        m3_engine_get_stats(e, &st);
        m3_engine_destroy(e);
        m3_engine_opts plain = o;
        plain.enable_prefix_caching = 0;
        run_info r3;
        if (run(m, &plain, b, 1, rb2, &r3)) return;
        int eq = same(&rb1[0], &rb2[0]);
        CHECK(eq, "prefix reuse after speculation: %d tokens vs %d", rb1[0].n, rb2[0].n);
        CHECK(st.prefix_hit_tokens >= 80, "prefix hit tokens %llu", (unsigned long long)st.prefix_hit_tokens);
        CHECK(st.spec_draft_tokens > st.spec_accepted_tokens, "rejections happened (%llu drafts, %llu accepted)",
              (unsigned long long)st.spec_draft_tokens, (unsigned long long)st.spec_accepted_tokens);
        printf("3. prefix cache after rejections: a request reusing %llu cached tokens of a speculative one (%llu drafts, "
               "%llu rejected) gives bitwise the output of plain decoding: %s\n",
               (unsigned long long)st.prefix_hit_tokens, (unsigned long long)st.spec_draft_tokens,
               (unsigned long long)(st.spec_draft_tokens - st.spec_accepted_tokens), eq ? "yes" : "NO");
    }
}

/* ---------------------------------------------------------------- 1b: disable_by_batch_size */

/* the drafts the engine proposed, by (request, tokens so far); the hook changes none */
enum { DREC_K = 4, DREC_POS = MAXPROMPT + MAXTOK };
typedef struct {
    const result *res;
    int n;
    int32_t d[8][DREC_POS][DREC_K];
    uint8_t have[8][DREC_POS];
    int calls;
} draft_rec;

static void rec_hook(void *arg, uint64_t id, const int32_t *tok, int n_tok, int32_t *draft, int k) {
    draft_rec *o = arg;
    (void)tok;
    for (int i = 0; i < o->n; i++)
        if (o->res[i].id == id && n_tok < DREC_POS && k == DREC_K) {
            memcpy(o->d[i][n_tok], draft, sizeof(int32_t) * DREC_K);
            o->have[i][n_tok] = 1;
            o->calls++;
        }
}

/* vLLM's disable_by_batch_size: while more requests run than it, steps decode without drafts;
 * outputs stay bitwise those of plain decoding, and once the batch shrinks the drafts are
 * exactly those of an engine that drafted all along (the draft's context took every row) */
static void test_disable_by_batch(m3_model *m) {
    enum { N = 8 };
    static rspec specs[N];
    static result base[N], got[N], all[N];
    greedy_specs(specs, N, m->cfg.vocab, 0x5eed1b5);
    for (int i = 0; i < N; i++) specs[i].sp.repetition_penalty = specs[i].sp.frequency_penalty = 0; /* greedy alone */
    m3_engine_opts o;
    m3_engine_opts_default(&o);
    o.kv_pages = 200;
    o.max_num_seqs = 6;
    o.max_num_batched_tokens = 64;
    run_info rb, ra, ri;
    if (run(m, &o, specs, N, base, &rb)) return;
    static draft_rec ref, off;
    m3_engine_opts os = o;
    spec_opts(&os, DREC_K, M3_SPEC_DRAFT_PROBABILISTIC);
    memset(&ref, 0, sizeof ref);
    ref.res = all;
    ref.n = N;
    os.draft_hook = rec_hook;
    os.draft_hook_arg = &ref;
    if (run(m, &os, specs, N, all, &ra)) return;
    os.spec.disable_by_batch_size = 3;
    memset(&off, 0, sizeof off);
    off.res = got;
    off.n = N;
    os.draft_hook_arg = &off;
    if (run(m, &os, specs, N, got, &ri)) return;
    int eq = compare("disable_by_batch_size 3", got, base, N);
    int cmp = 0, diff = 0;
    for (int i = 0; i < N; i++)
        for (int t = 0; t < DREC_POS; t++)
            if (off.have[i][t]) {
                if (!ref.have[i][t]) continue; /* (the reference stepped past t in one verify) */
                cmp++;
                diff += memcmp(off.d[i][t], ref.d[i][t], sizeof(int32_t) * DREC_K) != 0;
            }
    CHECK(ri.st.spec_off_batch > 0, "no decode ran without drafts (%llu)", (unsigned long long)ri.st.spec_off_batch);
    CHECK(ri.st.spec_verify_steps > 0 && ri.st.spec_verify_steps < ra.st.spec_verify_steps,
          "verify steps %llu with the limit, %llu without", (unsigned long long)ri.st.spec_verify_steps,
          (unsigned long long)ra.st.spec_verify_steps);
    CHECK(cmp > 0 && diff == 0, "drafts after speculation resumed: %d of %d differ from those of an engine drafting all along",
          diff, cmp);
    CHECK(ra.st.spec_off_batch == 0, "without the limit %llu decodes ran without drafts", (unsigned long long)ra.st.spec_off_batch);
    CHECK(ri.st.kv_blocks_used == 0, "blocks used at the end: %d", ri.st.kv_blocks_used);
    printf("1b. disable_by_batch_size 3 (k %d, up to 6 running): %d / %d equal to no speculation; %llu decodes without drafts, "
           "%llu verify steps (%llu drafting all along); %d drafts after speculation resumed, %d differ from those of an "
           "engine drafting all along\n",
           DREC_K, eq, N, (unsigned long long)ri.st.spec_off_batch, (unsigned long long)ri.st.spec_verify_steps,
           (unsigned long long)ra.st.spec_verify_steps, cmp, diff);
}

/* ---------------------------------------------------------------- 4: cache state */

typedef struct {
    const m3_dspark *d;
    float *feat; /* [T][F] */
} cap_ctx;

static void capture(void *arg, int layer, const float *h, int T, int H) {
    cap_ctx *c = arg;
    int s = m3_dspark_feat_slot(c->d, layer), F = m3_dspark_feat_dim(c->d);
    for (int t = 0; t < T; t++) memcpy(c->feat + (size_t)t * F + (size_t)s * H, h + (size_t)t * H, sizeof(float) * H);
}

/* runs ids at pos0.. on seq, logits of every row, captured rows into feat */
static int fwd(m3_model *m, m3_kv *kv, m3_kv_seq *seq, const int32_t *ids, int n, int pos0, float *logits, cap_ctx *cc,
               m3_err *err) {
    int32_t pos[64], sq[64];
    int rows[64];
    m3_kv_seq *seqs[1] = {seq};
    for (int i = 0; i < n; i++) { pos[i] = pos0 + i; sq[i] = 0; rows[i] = i; }
    m3_batch b = {n, pos, sq, seqs};
    m3_taps taps = {.arg = cc, .capture_layers = cc->d->capture, .capture = capture};
    return m3_forward(m, kv, &b, ids, rows, n, logits, &taps, err);
}

/* The context ring growing (64 -> 128 -> 256 slots) while its entries wrap (a context reset at
 * position 50, as after a prefix-cache hit), then past the window: appended 7 positions at a time,
 * every readable entry equals the one a single append writes (the moves at growth go in runs). */
static void test_ring_growth(m3_dspark *d) {
    const int w0 = d->cfg.window, F = m3_dspark_feat_dim(d), P0 = 50, P1 = 400;
    const size_t kw = (size_t)d->cfg.base.n_kv_heads * d->cfg.base.head_dim;
    d->cfg.window = 256; /* the rings' size only: no block pass runs here */
    float *feat = malloc(sizeof(float) * (size_t)(P1 - P0) * F);
    m3_dspark_ctx a = {0}, b = {0};
    m3_err err;
    int ok = feat != NULL, caps[3] = {0, 0, 0}, nc = 0;
    uint64_t x = 12345;
    for (size_t i = 0; ok && i < (size_t)(P1 - P0) * F; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        feat[i] = (float)((x >> 40) % 2001) / 1000.0f - 1.0f;
    }
    m3_dspark_ctx_reset(&a, P0);
    m3_dspark_ctx_reset(&b, P0);
    if (ok && m3_dspark_ctx_append(d, &a, feat, P0, P1 - P0, &err)) { CHECK(0, "one append: %s", err.msg); ok = 0; }
    for (int p = P0; ok && p < P1; p += 7) {
        const int n = P1 - p < 7 ? P1 - p : 7;
        if (m3_dspark_ctx_append(d, &b, feat + (size_t)(p - P0) * F, p, n, &err)) { CHECK(0, "append at %d: %s", p, err.msg); ok = 0; }
        if (ok && nc < 3 && (!nc || caps[nc - 1] != b.cap)) caps[nc++] = b.cap;
    }
    if (ok) {
        CHECK(nc == 3 && caps[0] == 64 && caps[1] == 128 && caps[2] == 256 && a.cap == 256,
              "ring sizes while appending 7 at a time: %d %d %d (want 64 128 256), one append %d", caps[0], caps[1], caps[2], a.cap);
        int same = 1;
        for (int l = 0; l < a.n_layers && same; l++)
            for (int p = P1 - 256; p < P1 && same; p++)
                same = !memcmp(a.k[l] + (size_t)(p % a.cap) * kw, b.k[l] + (size_t)(p % b.cap) * kw, sizeof(float) * kw) &&
                       !memcmp(a.v[l] + (size_t)(p % a.cap) * kw, b.v[l] + (size_t)(p % b.cap) * kw, sizeof(float) * kw);
        CHECK(same, "the grown, wrapped ring holds what one append writes (positions %d..%d)", P1 - 256, P1 - 1);
        printf("context ring grown 64 -> 128 -> 256 while wrapped, then past the window: entries equal to one append: %s\n",
               same ? "yes" : "NO");
    }
    m3_dspark_ctx_free(&a);
    m3_dspark_ctx_free(&b);
    free(feat);
    d->cfg.window = w0;
}

static void test_cache_state(m3_model *m, m3_dspark *d) {
    const int V = m->cfg.vocab, F = m3_dspark_feat_dim(d), K = 6;
    enum { PROMPT = 37, GEN = 110 };
    const int total = PROMPT + GEN + 8;
    m3_err err;
    float *la = malloc(sizeof(float) * (size_t)total * V), *lb = malloc(sizeof(float) * 64 * (size_t)V);
    float *fa = malloc(sizeof(float) * (size_t)total * F), *fb = malloc(sizeof(float) * 64 * (size_t)F);
    float *da = malloc(sizeof(float) * (size_t)K * V), *db = malloc(sizeof(float) * (size_t)K * V);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)total);
    if (!la || !lb || !fa || !fb || !da || !db || !tok) { CHECK(0, "oom"); goto out; }
    for (int dt = 0; dt < 2; dt++) {
        m3_kv_dtype kd = dt ? M3_KV_NVFP4 : M3_KV_F32;
        m3_kv kv;
        if (m3_kv_create(&kv, &m->cfg, kd, kd, m3_kv_page_tokens(&m->cfg), 40, &err)) { CHECK(0, "kv: %s", err.msg); goto out; }
        m3_kv_seq A = {0}, B = {0};
        uint64_t r = 99 + (uint64_t)dt;
        for (int i = 0; i < PROMPT; i++) tok[i] = 2 + (int32_t)(rnd(&r) % (uint64_t)(V - 2));
        /* A: plain decoding, one token per forward; logits of position p predict p + 1 */
        cap_ctx ca = {d, fa};
        int rc = fwd(m, &kv, &A, tok, PROMPT, 0, la, &ca, &err);
        for (int p = PROMPT; !rc && p < total; p++) {
            tok[p] = m3_argmax(la + (size_t)(p - 1) * V, V);
            ca.feat = fa + (size_t)p * F;
            rc = fwd(m, &kv, &A, tok + p, 1, p, la + (size_t)p * V, &ca, &err);
        }
        if (rc) { CHECK(0, "plain run: %s", err.msg); m3_kv_destroy(&kv); goto out; }
        /* B: speculative-style: [anchor, drafts] with j correct then wrong drafts, roll back */
        cap_ctx cb = {d, fb};
        rc = fwd(m, &kv, &B, tok, PROMPT, 0, lb, &cb, &err);
        m3_dspark_ctx cxb = {0};
        m3_dspark_ctx_reset(&cxb, 0);
        if (!rc) rc = m3_dspark_ctx_append(d, &cxb, fb, 0, PROMPT, &err);
        int P = PROMPT, steps = 0, logit_ok = 1, draft_ok = 1, draft_cmp = 0, rejected = 0;
        while (!rc && P + K + 1 < total) {
            int j = (int)(rnd(&r) % (K + 1)); /* drafts accepted */
            int32_t ids[16];
            ids[0] = tok[P];
            for (int i = 1; i <= K; i++) ids[i] = i <= j ? tok[P + i] : (tok[P + i] + 1 + (int32_t)(rnd(&r) % 100)) % V;
            rejected += K - j;
            /* draft logits now vs a context rebuilt from scratch from the plain run's rows */
            if (steps % 3 == 0) {
                m3_dspark_ctx fresh = {0};
                m3_dspark_ctx_reset(&fresh, 0);
                rc = m3_dspark_ctx_append(d, &fresh, fa, 0, P, &err) || m3_dspark_block_logits(d, &fresh, tok[P], P, K, da, &err) ||
                     m3_dspark_block_logits(d, &cxb, tok[P], P, K, db, &err);
                draft_ok &= !rc && !memcmp(da, db, sizeof(float) * (size_t)K * V);
                draft_cmp++;
                m3_dspark_ctx_free(&fresh);
                if (rc) break;
            }
            rc = fwd(m, &kv, &B, ids, K + 1, P, lb, &cb, &err);
            if (rc) break;
            /* rows 0..j are what plain decoding saw at P..P+j */
            logit_ok &= !memcmp(lb, la + (size_t)P * V, sizeof(float) * (size_t)(j + 1) * V);
            B.len = P + j + 1; /* roll back past the accepted drafts */
            rc = m3_dspark_ctx_append(d, &cxb, fb, P, j + 1, &err);
            P += j + 1;
            steps++;
        }
        /* and the next plain step after the last roll back */
        if (!rc) rc = fwd(m, &kv, &B, tok + P, 1, P, lb, &cb, &err);
        if (rc) CHECK(0, "speculative run: %s", err.msg);
        else logit_ok &= !memcmp(lb, la + (size_t)P * V, sizeof(float) * V);
        CHECK(logit_ok, "%s KV: logits after roll backs differ from plain decoding", m3_kv_dtype_name(kd));
        CHECK(draft_ok, "%s KV: draft logits from the incremental context differ from a fresh one", m3_kv_dtype_name(kd));
        CHECK(cxb.cap == d->cfg.window && P > d->cfg.window, "the context ring wrapped (cap %d, window %d, %d positions)",
              cxb.cap, d->cfg.window, P);
        printf("4. cache state, %s KV: %d verify forwards of %d drafts (%d rejected, rolled back), %d positions: target "
               "logits bitwise equal to plain decoding at every accepted row and the next step: %s; draft logits from the "
               "incremental context vs one rebuilt from scratch (window %d, ring wrapped): %d / %d bitwise equal\n",
               m3_kv_dtype_name(kd), steps, K, rejected, P, logit_ok ? "yes" : "NO", d->cfg.window, draft_ok ? draft_cmp : 0,
               draft_cmp);
        m3_dspark_ctx_free(&cxb);
        m3_kv_seq_release(&kv, &A);
        m3_kv_seq_release(&kv, &B);
        m3_kv_destroy(&kv);
    }
out:
    free(la); free(lb); free(fa); free(fb); free(da); free(db); free(tok);
}

/* ---------------------------------------------------------------- 4b: the draft vs a reference */

/* W as a dense f32 matrix [N][K] (decoded once) */
static float *dense(const m3_linear *W) {
    float *m = malloc(sizeof(float) * (size_t)W->N * W->K);
    if (m) m3_cpu_decode_rows(W, 0, W->N, 0, W->K, m);
    return m;
}

static void ref_lin(const float *W, int N, int K, const double *x, double *y) {
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int k = 0; k < K; k++) s += (double)W[(size_t)n * K + k] * x[k];
        y[n] = s;
    }
}

static void ref_norm(double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) x[i] = x[i] * r * (1.0 + w[i]);
}

static void ref_rope(double *x, int D, int rd, double theta, int pos) {
    int half = rd / 2;
    for (int j = 0; j < half; j++) {
        double a = pos * pow(theta, -2.0 * j / rd), c = cos(a), s = sin(a);
        double x0 = x[j], x1 = x[j + half];
        x[j] = x0 * c - x1 * s;
        x[j + half] = x1 * c + x0 * s;
    }
    (void)D;
}

/* Straight from spec section 4, in double: draft logits of a block at position P (Markov
 * term included for the given predecessors), from context features feat [P][F]. */
static int ref_draft(const m3_model *m, const m3_dspark *d, const float *feat, int P, int32_t anchor, int n,
                     const int32_t *prev, double *out) {
    const m3_config *b = &d->cfg.base;
    const int H = b->hidden, nh = b->n_heads, nkv = b->n_kv_heads, D = b->head_dim, G = nh / nkv, V = b->vocab;
    const int F = m3_dspark_feat_dim(d), L = b->n_layers, W = d->cfg.window, Fi = b->dense_inter, R = d->cfg.markov_rank;
    const double eps = b->rms_eps;
    const size_t kw = (size_t)nkv * D;
    int lo = P - W + 1 < 0 ? 0 : P - W + 1; /* the first slot's window; later slots see less */
    int nc = P - lo;
    double *ctx = malloc(sizeof(double) * H), *fx = malloc(sizeof(double) * F);
    double *Kc = malloc(sizeof(double) * (size_t)L * nc * kw), *Vc = malloc(sizeof(double) * (size_t)L * nc * kw);
    double *x = malloc(sizeof(double) * (size_t)n * H), *a = malloc(sizeof(double) * H), *q = malloc(sizeof(double) * (size_t)n * nh * D);
    double *kb = malloc(sizeof(double) * (size_t)n * kw), *vb = malloc(sizeof(double) * (size_t)n * kw);
    double *att = malloc(sizeof(double) * nh * D), *o = malloc(sizeof(double) * H), *g = malloc(sizeof(double) * Fi);
    double *u = malloc(sizeof(double) * Fi), *sc = malloc(sizeof(double) * (size_t)(nc + n)), *mk = malloc(sizeof(double) * R);
    float *fc = dense(&d->fc), *emb = dense(&m->w.embed), *lm = dense(&m->w.lm_head), *w1 = dense(&d->markov_w1),
          *w2 = dense(&d->markov_w2);
    int ok = ctx && fx && Kc && Vc && x && a && q && kb && vb && att && o && g && u && sc && mk && fc && emb && lm && w1 && w2;
    float **Wl = calloc((size_t)L * 7, sizeof *Wl);
    ok = ok && Wl;
    for (int l = 0; ok && l < L; l++) {
        const m3_dspark_layer *Ly = &d->layers[l];
        const m3_linear *ws[7] = {&Ly->q, &Ly->k, &Ly->v, &Ly->o, &Ly->mlp.gate, &Ly->mlp.up, &Ly->mlp.down};
        for (int i = 0; i < 7; i++) ok = ok && (Wl[l * 7 + i] = dense(ws[i])) != NULL;
    }
    if (!ok) goto out;
    /* context K/V of positions [lo, P) */
    for (int t = 0; t < nc; t++) {
        for (int i = 0; i < F; i++) fx[i] = feat[(size_t)(lo + t) * F + i];
        ref_lin(fc, H, F, fx, ctx);
        ref_norm(ctx, d->hidden_norm, H, eps);
        for (int l = 0; l < L; l++) {
            double *k = Kc + ((size_t)l * nc + t) * kw, *v = Vc + ((size_t)l * nc + t) * kw;
            ref_lin(Wl[l * 7 + 1], nkv * D, H, ctx, k);
            ref_lin(Wl[l * 7 + 2], nkv * D, H, ctx, v);
            for (int h = 0; h < nkv; h++) {
                ref_norm(k + (size_t)h * D, d->layers[l].k_norm, D, eps);
                ref_rope(k + (size_t)h * D, D, b->rotary_dim, b->rope_theta, lo + t);
            }
        }
    }
    for (int i = 0; i < n; i++) {
        int32_t id = i ? d->cfg.noise_id : anchor;
        for (int c = 0; c < H; c++) x[(size_t)i * H + c] = emb[(size_t)id * H + c];
    }
    for (int l = 0; l < L; l++) {
        const m3_dspark_layer *Ly = &d->layers[l];
        for (int i = 0; i < n; i++) {
            for (int c = 0; c < H; c++) a[c] = x[(size_t)i * H + c];
            ref_norm(a, Ly->in_norm, H, eps);
            ref_lin(Wl[l * 7 + 0], nh * D, H, a, q + (size_t)i * nh * D);
            ref_lin(Wl[l * 7 + 1], nkv * D, H, a, kb + (size_t)i * kw);
            ref_lin(Wl[l * 7 + 2], nkv * D, H, a, vb + (size_t)i * kw);
            for (int h = 0; h < nh; h++) {
                ref_norm(q + ((size_t)i * nh + h) * D, Ly->q_norm, D, eps);
                ref_rope(q + ((size_t)i * nh + h) * D, D, b->rotary_dim, b->rope_theta, P + i);
            }
            for (int h = 0; h < nkv; h++) {
                ref_norm(kb + (size_t)i * kw + (size_t)h * D, Ly->k_norm, D, eps);
                ref_rope(kb + (size_t)i * kw + (size_t)h * D, D, b->rotary_dim, b->rope_theta, P + i);
            }
        }
        double *xn = malloc(sizeof(double) * (size_t)n * H);
        if (!xn) { ok = 0; goto out; }
        memcpy(xn, x, sizeof(double) * (size_t)n * H);
        for (int i = 0; i < n; i++) {
            for (int h = 0; h < nh; h++) {
                const double *qh = q + ((size_t)i * nh + h) * D;
                int gk = h / G, ns = 0, t0 = P + i - W + 1 - lo; /* this slot's window start, in [0, nc] */
                if (t0 < 0) t0 = 0;
                double mx = -1e300;
                for (int t = t0; t < nc; t++) {
                    double s2 = 0;
                    for (int c = 0; c < D; c++) s2 += qh[c] * Kc[((size_t)l * nc + t) * kw + (size_t)gk * D + c];
                    sc[ns++] = s2 / sqrt((double)D);
                }
                for (int j = 0; j < n; j++) { /* non-causal inside the block */
                    double s2 = 0;
                    for (int c = 0; c < D; c++) s2 += qh[c] * kb[(size_t)j * kw + (size_t)gk * D + c];
                    sc[ns++] = s2 / sqrt((double)D);
                }
                for (int z = 0; z < ns; z++) mx = sc[z] > mx ? sc[z] : mx;
                double sum = 0;
                for (int z = 0; z < ns; z++) sum += (sc[z] = exp(sc[z] - mx));
                double *ah = att + (size_t)h * D;
                for (int c = 0; c < D; c++) ah[c] = 0;
                int z = 0;
                for (int t = t0; t < nc; t++, z++)
                    for (int c = 0; c < D; c++) ah[c] += sc[z] / sum * Vc[((size_t)l * nc + t) * kw + (size_t)gk * D + c];
                for (int j = 0; j < n; j++, z++)
                    for (int c = 0; c < D; c++) ah[c] += sc[z] / sum * vb[(size_t)j * kw + (size_t)gk * D + c];
            }
            ref_lin(Wl[l * 7 + 3], H, nh * D, att, o);
            for (int c = 0; c < H; c++) xn[(size_t)i * H + c] += o[c];
            for (int c = 0; c < H; c++) a[c] = xn[(size_t)i * H + c];
            ref_norm(a, Ly->post_norm, H, eps);
            ref_lin(Wl[l * 7 + 4], Fi, H, a, g);
            ref_lin(Wl[l * 7 + 5], Fi, H, a, u);
            double al = b->swiglu_alpha, lim = b->swiglu_limit;
            for (int c = 0; c < Fi; c++) {
                double gg = g[c] < lim ? g[c] : lim, uu = u[c] < -lim ? -lim : u[c] > lim ? lim : u[c];
                g[c] = (uu + 1) * gg / (1 + exp(-al * gg));
            }
            ref_lin(Wl[l * 7 + 6], H, Fi, g, o);
            for (int c = 0; c < H; c++) xn[(size_t)i * H + c] += o[c];
        }
        memcpy(x, xn, sizeof(double) * (size_t)n * H);
        free(xn);
    }
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < H; c++) a[c] = x[(size_t)i * H + c];
        ref_norm(a, d->final_norm, H, eps);
        ref_lin(lm, V, H, a, out + (size_t)i * V);
        for (int r = 0; r < R; r++) mk[r] = w1[(size_t)prev[i] * R + r];
        for (int v = 0; v < V; v++) {
            double s2 = 0;
            for (int r = 0; r < R; r++) s2 += (double)w2[(size_t)v * R + r] * mk[r];
            out[(size_t)i * V + v] += s2;
        }
    }
out:
    if (Wl) for (int i = 0; i < L * 7; i++) free(Wl[i]);
    free(Wl); free(ctx); free(fx); free(Kc); free(Vc); free(x); free(a); free(q); free(kb); free(vb); free(att); free(o);
    free(g); free(u); free(sc); free(mk); free(fc); free(emb); free(lm); free(w1); free(w2);
    return ok ? 0 : -1;
}

static void test_draft_reference(m3_model *m, m3_dspark *d) {
    const int V = m->cfg.vocab, F = m3_dspark_feat_dim(d), K = 5;
    m3_err err;
    for (int c = 0; c < 2; c++) {
        const int P = c ? 100 : 20; /* past the window (64) and inside it */
        float *feat = malloc(sizeof(float) * (size_t)P * F), *lg = malloc(sizeof(float) * (size_t)P * V);
        float *dl = malloc(sizeof(float) * (size_t)K * V);
        double *ref = malloc(sizeof(double) * (size_t)K * V);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)P);
        m3_kv kv;
        m3_kv_seq seq = {0};
        int kv_ok = !m3_kv_create(&kv, &m->cfg, M3_KV_F32, M3_KV_F32, m3_kv_page_tokens(&m->cfg), 16, &err);
        if (!feat || !lg || !dl || !ref || !ids || !kv_ok) { CHECK(0, "setup"); goto next; }
        uint64_t r = 31 + (uint64_t)c;
        for (int i = 0; i < P; i++) ids[i] = 2 + (int32_t)(rnd(&r) % (uint64_t)(V - 2));
        cap_ctx cc = {d, feat};
        for (int t0 = 0; t0 < P; t0 += 50) { /* fwd takes at most 64 rows */
            int n = P - t0 < 50 ? P - t0 : 50;
            cc.feat = feat + (size_t)t0 * F;
            if (fwd(m, &kv, &seq, ids + t0, n, t0, lg + (size_t)t0 * V, &cc, &err)) { CHECK(0, "%s", err.msg); goto next; }
        }
        m3_dspark_ctx cx = {0};
        m3_dspark_ctx_reset(&cx, 0);
        int32_t anchor = 77, prev[8] = {77, 5, 9, 300, 12, 4, 4, 4};
        int rc = m3_dspark_ctx_append(d, &cx, feat, 0, P, &err) || m3_dspark_block_logits(d, &cx, anchor, P, K, dl, &err);
        for (int i = 0; !rc && i < K; i++) rc = m3_dspark_markov(d, prev[i], dl + (size_t)i * V, &err);
        m3_dspark_ctx_free(&cx);
        if (rc) { CHECK(0, "draft: %s", err.msg); goto next; }
        if (ref_draft(m, d, feat, P, anchor, K, prev, ref)) { CHECK(0, "reference: out of memory"); goto next; }
        double md = 0, mx = 0;
        for (size_t i = 0; i < (size_t)K * V; i++) {
            md = fmax(md, fabs(dl[i] - ref[i]));
            mx = fmax(mx, fabs(ref[i]));
        }
        CHECK(md < 1e-4 * fmax(1, mx), "draft at %d vs the reference: max |diff| %g (max |logit| %g)", P, md, mx);
        printf("4b. draft block (%d slots, position %d, %s the window) vs a double-precision reference written from spec "
               "section 4 (fc + hidden_norm context, windowed context K/V, non-causal block, Markov term): max |diff| "
               "%.2e over logits up to %.1f\n",
               K, P, P > d->cfg.window ? "past" : "inside", md, mx);
    next:
        if (kv_ok) { m3_kv_seq_release(&kv, &seq); m3_kv_destroy(&kv); }
        free(feat); free(lg); free(dl); free(ref); free(ids);
    }
}

/* ---------------------------------------------------------------- 5: sampled, chi-square */

enum { NA = 4, MT = 4 }; /* tokens each position can take, tokens per request */
static const int32_t ALLOWED[NA] = {5, 17, 300, 999};

/* variant 0: allowed_ids, penalties, temperature and top-p (the draws on the host: their rows
 * change with the penalties); variant 1: plain temperature, top-k 4 and top-p (every draw of
 * the draft on the backend: ops draw_rows); variant 2: variant 1 after the prompt's open tag with
 * a reasoning budget of 2 (the third token forced to the close tag, within a verification; the
 * rows near it on the host, the others on the backend) */
static m3_sampling samp_params(int variant, uint64_t seed, int V) {
    m3_sampling sp = {.temperature = 1.3f, .top_p = 0.97f, .seed = seed};
    if (variant == 2) {
        sp.think_on = 1;
        sp.think_start_id = THINK_OPEN(V);
        sp.think_end_id = THINK_CLOSE(V);
        sp.think_budget = 2;
    }
    if (variant == 0) {
        sp.presence_penalty = 0.3f;
        sp.frequency_penalty = 0.5f;
        sp.repetition_penalty = 1.3f;
        sp.allowed_ids = ALLOWED;
        sp.n_allowed = NA;
    } else {
        sp.top_k = NA;
    }
    return sp;
}

static double chi2(const double *p, const long *cnt, int n, long N, int *df) {
    double s = 0, pe = 0, pc = 0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * N;
        if (e < 5) { pe += e; pc += cnt[i]; continue; }
        s += (cnt[i] - e) * (cnt[i] - e) / e;
        bins++;
    }
    if (pe > 0) { s += (pc - pe) * (pc - pe) / pe; bins++; }
    *df = bins - 1 > 0 ? bins - 1 : 1;
    return s;
}

static double chi2_limit(int k) { /* 99.9% quantile, Wilson-Hilferty */
    double z = 3.0902;
    return k * pow(1 - 2.0 / (9 * k) + z * sqrt(2.0 / (9 * k)), 3);
}

/* The tree of what the first MT tokens can be: after the prefix `pre` (base-NA digits, the
 * child taken at each position) of i tokens, child a is token kid[i][pre][a] (-1: none) with
 * probability pr[i][pre][a]. */
static int32_t kid[MT][64][NA];
static double pr[MT][64][NA];

static void test_sampled_variant(m3_model *m, int variant) {
    const int V = m->cfg.vocab;
    enum { NP = 12, NREQ = 1200 };
    int32_t prompt[NP];
    uint64_t r = 5;
    for (int i = 0; i < NP; i++) prompt[i] = 2 + (int32_t)(rnd(&r) % (uint64_t)(V - 5)); /* no tag */
    if (variant == 2) prompt[NP - 1] = THINK_OPEN(V); /* in reasoning */
    static double pj[256];
    m3_err err;
    m3_kv kv;
    const m3_kv_mem mem = m3_model_kv_mem(m); /* device memory on a device backend */
    if (m3_kv_create_in(&kv, &m->cfg, M3_KV_F32, M3_KV_F32, m3_kv_page_tokens(&m->cfg), 8, &mem, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    float *lg = malloc(sizeof(float) * (size_t)V), *p = malloc(sizeof(float) * (size_t)V);
    m3_sample_ws *ws = m3_sample_ws_create(V, &err);
    if (!lg || !p || !ws) { CHECK(0, "oom"); goto out; }
    /* the exact tree: target rows for every prefix (85 of them), through m3_sampler_probs */
    for (int i = 0; i < MT; i++)
        for (int pre = 0; pre < (1 << (2 * i)); pre++) {
            int32_t seq[NP + MT];
            memcpy(seq, prompt, sizeof prompt);
            int ok = 1;
            for (int j = 0; j < i; j++) {
                const int up = pre >> (2 * (i - j)), a = (pre >> (2 * (i - 1 - j))) & 3;
                seq[NP + j] = kid[j][up][a];
                ok &= seq[NP + j] >= 0;
            }
            for (int a = 0; a < NA; a++) { kid[i][pre][a] = -1; pr[i][pre][a] = 0; }
            if (!ok) continue; /* an absent child: no prefix through it */
            m3_sampling sp = samp_params(variant, 0, V);
            m3_sampler *s = m3_sampler_create(&sp, V, prompt, NP, &err);
            m3_kv_seq q = {0};
            int rc = !s || m3_run_tokens(m, &kv, &q, seq, NP + i, 0, 64, lg, &err);
            m3_kv_seq_release(&kv, &q);
            for (int j = 0; !rc && j < i; j++) rc = m3_sampler_accept(s, seq[NP + j], &err);
            if (!rc) rc = m3_sampler_probs(s, lg, ws, p, &err);
            m3_sampler_free(s);
            if (rc) { CHECK(0, "exact distribution: %s", err.msg); goto out; }
            if (variant == 0)
                for (int a = 0; a < NA; a++) { kid[i][pre][a] = ALLOWED[a]; pr[i][pre][a] = p[ALLOWED[a]]; }
            else { /* the kept ids (top-k 4: at most four), ascending */
                int a = 0, extra = 0;
                for (int t = 0; t < V; t++) {
                    if (!(p[t] > 0)) continue;
                    if (a < NA) { kid[i][pre][a] = t; pr[i][pre][a] = p[t]; a++; }
                    else extra++;
                }
                CHECK(!extra, "top-k %d kept %d ids", NA, NA + extra);
            }
        }
    for (int idx = 0; idx < 256; idx++) {
        double x = 1;
        for (int i = 0; i < MT; i++) x *= pr[i][idx >> (2 * (MT - i))][(idx >> (2 * (MT - 1 - i))) & 3];
        pj[idx] = x;
    }
    double tot = 0;
    for (int i = 0; i < 256; i++) tot += pj[i];
    CHECK(fabs(tot - 1) < 1e-4, "exact joint sums to %g", tot);
    static rspec specs[NREQ];
    static result res[NREQ];
    for (int mode = 0; mode < 3; mode++) { /* 0: no speculation, 1: probabilistic drafts, 2: greedy drafts */
        for (int i = 0; i < NREQ; i++) {
            memset(&specs[i], 0, sizeof specs[i]);
            memcpy(specs[i].prompt, prompt, sizeof prompt);
            specs[i].n_prompt = NP;
            specs[i].sp = samp_params(variant, 0xabc000 + (uint64_t)i * 7919 + (uint64_t)mode * 1000003 + (uint64_t)variant * 77, V);
            specs[i].max_tokens = MT;
            specs[i].no_logprobs = variant >= 1;
        }
        m3_engine_opts o;
        m3_engine_opts_default(&o);
        o.kv_pages = 512;
        o.max_num_seqs = 256;
        o.max_num_batched_tokens = 1024;
        if (mode) spec_opts(&o, 3, mode == 1 ? M3_SPEC_DRAFT_PROBABILISTIC : M3_SPEC_DRAFT_GREEDY);
        o.sample_threads = 4; /* the step's draws and verifications spread over 4 threads */
        run_info ri;
        if (run(m, &o, specs, NREQ, res, &ri)) goto out;
        static long cnt[256];
        memset(cnt, 0, sizeof cnt);
        int bad = 0;
        for (int i = 0; i < NREQ; i++) {
            int idx = 0;
            if (res[i].n != MT) { bad++; continue; }
            for (int j = 0; j < MT; j++) {
                int a = 0;
                while (a < NA && kid[j][idx][a] != res[i].tok[j]) a++;
                if (a == NA) { bad++; break; }
                idx = idx * NA + a;
            }
            cnt[idx]++;
        }
        CHECK(!bad, "variant %d mode %d: %d requests with a wrong length or a token the distribution excludes", variant, mode, bad);
        int df;
        double st = chi2(pj, cnt, 256, NREQ, &df);
        CHECK(st < chi2_limit(df), "variant %d mode %d: first %d tokens are not distributed as plain sampling (chi2 %.1f, df %d, "
              "limit %.1f)", variant, mode, MT, st, df, chi2_limit(df));
        printf("5. sampled (%s), %s: first %d tokens of %d requests vs the exact joint: chi2 %.1f (df %d, 99.9%% limit %.1f)",
               variant == 0   ? "allowed_ids x4, T 1.3, top-p 0.97, penalties"
               : variant == 1 ? "T 1.3, top-k 4, top-p 0.97: draws on the backend"
                              : "the same, a reasoning budget of 2: the 3rd token forced",
               mode == 0 ? "no speculation       " : mode == 1 ? "dspark k 3, prob. drafts" : "dspark k 3, greedy drafts", MT,
               NREQ, st, df, chi2_limit(df));
        /* plain rows on the backend: speculative decodes verified there too (ops verify_rows): with
         * greedy drafts every one, with probabilistic ones those whose q rows a step keeps there
         * (QDEV_MAX of the step's up to 256; the others on the host, in the same steps) */
        if (mode && variant == 1)
            CHECK(ri.st.spec_verify_backend > 0 && (mode == 1 || ri.st.spec_verify_backend == ri.st.spec_verify_steps),
                  "mode %d: %llu of %llu speculative steps verified on the backend", mode,
                  (unsigned long long)ri.st.spec_verify_backend, (unsigned long long)ri.st.spec_verify_steps);
        if (variant == 2) { /* every request's third token the close tag */
            int closed = 0;
            for (int i = 0; i < NREQ; i++) closed += res[i].n == MT && res[i].tok[2] == THINK_CLOSE(V);
            CHECK(closed == NREQ, "variant 2 mode %d: %d of %d requests closed their reasoning at the 3rd token", mode, closed, NREQ);
        }
        if (mode) {
            if (variant >= 1) printf("; %llu verify steps on the backend", (unsigned long long)ri.st.spec_verify_backend);
            printf("; MAL %.2f, accepted %.1f%%, by position:", mal(&ri.st),
                   100.0 * ri.st.spec_accepted_tokens / (ri.st.spec_draft_tokens ? ri.st.spec_draft_tokens : 1));
            print_pos(&ri.st);
        }
        printf("\n");
    }
out:
    free(lg);
    free(p);
    m3_sample_ws_free(ws);
    m3_kv_destroy(&kv);
}

/* An op table whose check fails once: at the first target forward (begin_step with a cache)
 * after fail_after others; the backend recovers (the CPU's has nothing to recover). */
static m3_ops base_ops;
static int target_steps, fail_after, failed_once;

static int wrap_begin(void *ctx, const m3_kv *kv, const m3_batch *b, const int32_t *ids, m3_err *err) {
    if (kv) target_steps++;
    return base_ops.begin_step ? base_ops.begin_step(ctx, kv, b, ids, err) : 0;
}

static int wrap_check(void *ctx, m3_err *err) {
    if (!failed_once && target_steps == fail_after + 1) {
        failed_once = 1;
        return m3_errf(err, "injected: the step's forward failed");
    }
    return base_ops.check ? base_ops.check(ctx, err) : 0;
}

/* Runs specs[0..n) on m (spec k 3, probabilistic drafts) until done; draws: M3_DRAWS; fail: the
 * second target step's forward fails once. Returns the steps that reported a failure. */
static int run_5b(m3_model *m, const rspec *specs, int n, const char *draws, int fail, result *res, m3_engine_stats *st) {
    m3_err err;
    setenv("M3_DRAWS", draws, 1);
    target_steps = 0;
    fail_after = fail ? 1 : 1 << 30;
    failed_once = 0;
    m3_engine_opts o;
    m3_engine_opts_default(&o);
    o.kv_pages = 256;
    o.max_num_seqs = 8;
    o.max_num_batched_tokens = 256; /* every prompt in the first step, then speculative decodes */
    spec_opts(&o, 3, M3_SPEC_DRAFT_PROBABILISTIC);
    memset(res, 0, sizeof *res * (size_t)n);
    memset(st, 0, sizeof *st);
    int failed_steps = 0;
    m3_engine *e = m3_engine_create(m, &o, &err);
    if (!e) { CHECK(0, "engine: %s", err.msg); unsetenv("M3_DRAWS"); return -1; }
    for (int i = 0; i < n; i++) {
        m3_engine_request q = {.prompt = specs[i].prompt, .n_prompt = specs[i].n_prompt, .sampling = specs[i].sp,
                               .max_tokens = specs[i].max_tokens, .ignore_eos = 1, .on_token = on_token, .arg = &res[i]};
        res[i].id = m3_engine_add(e, &q, &err);
        CHECK(res[i].id, "add: %s", err.msg);
    }
    for (int step = 0; m3_engine_has_work(e) && step < 1000; step++) failed_steps += m3_engine_step(e, &err) < 0;
    m3_engine_get_stats(e, st);
    m3_engine_destroy(e);
    unsetenv("M3_DRAWS");
    return failed_steps;
}

static int same_tokens(const result *a, const result *b, const rspec *specs, int from, int to) {
    int ok = 1;
    for (int i = from; i < to; i++)
        ok &= a[i].finished && b[i].finished && a[i].reason == b[i].reason && a[i].n == b[i].n && a[i].n == specs[i].max_tokens &&
              !memcmp(a[i].tok, b[i].tok, sizeof(int32_t) * (size_t)a[i].n);
    return ok;
}

/* 5b. Sampled requests (temperature alone: the target's and the draft's distributions overlap
 * everywhere, so acceptances and residuals both read q) verified where the rows are (ops
 * verify_rows, the CPU's op table) give the tokens of the host's verification (M3_DRAWS=host:
 * m3_spec_verify, the same uniforms); so they do when a step's forward fails once (the engine runs
 * the step again request by request, their rows come back whole, the q rows to the host,
 * q_to_host) and when a request whose sampler is not plain shares their draft pass (the pass's
 * draws on the host, their q rows uploaded where the target verifies them). */
static void test_verify_after_failure(m3_model *m0, m3_ops *ops) {
    enum { N = 6 };
    base_ops = *ops;
    m3_ops w = *ops;
    w.begin_step = wrap_begin;
    w.check = wrap_check;
    m3_model m;
    m3_err err;
    if (m3_model_load(&m, DIR_, &w, NULL, NULL, &err)) { CHECK(0, "load: %s", err.msg); return; }
    static rspec specs[N + 1];
    uint64_t r = 77;
    for (int i = 0; i <= N; i++) {
        memset(&specs[i], 0, sizeof specs[i]);
        specs[i].n_prompt = 10 + i;
        for (int j = 0; j < specs[i].n_prompt; j++) specs[i].prompt[j] = 2 + (int32_t)(rnd(&r) % (uint64_t)(m0->cfg.vocab - 2));
        specs[i].sp = (m3_sampling){.temperature = 1.5f, .seed = 500 + (uint64_t)i};
        specs[i].max_tokens = 12;
        specs[i].ignore_eos = 1;
        specs[i].no_logprobs = 1;
    }
    specs[N].sp.repetition_penalty = 1.2f; /* not plain: drawn and verified on the host */
    static result host[N + 1], dev[N + 1], failed[N + 1], mixed[N + 1];
    m3_engine_stats sh, sd, sf, sm;
    run_5b(&m, specs, N, "host", 0, host, &sh);
    run_5b(&m, specs, N, "backend", 0, dev, &sd);
    const int nf = run_5b(&m, specs, N, "backend", 1, failed, &sf), f_once = failed_once;
    run_5b(&m, specs, N + 1, "backend", 0, mixed, &sm);
    const int s_dev = same_tokens(host, dev, specs, 0, N), s_fail = same_tokens(dev, failed, specs, 0, N),
              s_mix = same_tokens(dev, mixed, specs, 0, N);
    CHECK(sh.spec_verify_backend == 0 && sd.spec_verify_steps > 0 && sd.spec_verify_backend == sd.spec_verify_steps,
          "5b. verify steps on the backend: %llu of %llu with M3_DRAWS=host, %llu of %llu without",
          (unsigned long long)sh.spec_verify_backend, (unsigned long long)sh.spec_verify_steps,
          (unsigned long long)sd.spec_verify_backend, (unsigned long long)sd.spec_verify_steps);
    CHECK(sd.spec_accepted_tokens > 0, "5b. no draft accepted: the test would not read q");
    CHECK(s_dev, "5b. verified on the backend, tokens differ from the host's verification");
    CHECK(f_once && nf == 1, "5b. the injected failure: %d, failed steps %d", f_once, nf);
    CHECK(s_fail, "5b. after a failed step verified on the host, tokens differ from the clean run's");
    CHECK(sf.spec_verify_steps == sd.spec_verify_steps && sf.spec_verify_backend + N == sf.spec_verify_steps,
          "5b. failed run: %llu of %llu verify steps on the backend (the failed step's %d on the host)",
          (unsigned long long)sf.spec_verify_backend, (unsigned long long)sf.spec_verify_steps, N);
    CHECK(s_mix && sm.spec_verify_backend == sd.spec_verify_steps && sm.spec_verify_steps > sd.spec_verify_steps,
          "5b. beside a request with a penalty: tokens %s, %llu of %llu verify steps on the backend (want %llu)",
          s_mix ? "equal" : "DIFFER", (unsigned long long)sm.spec_verify_backend, (unsigned long long)sm.spec_verify_steps,
          (unsigned long long)sd.spec_verify_steps);
    printf("5b. %d sampled requests, %d tokens each, verified on the backend (%llu of %llu drafts accepted): the host's "
           "tokens %s; a step failing once (its %d verifications on the host, q rows brought back): %s; beside a request "
           "with a penalty (the draft's draws on the host, q rows uploaded): %s\n", N, specs[0].max_tokens,
           (unsigned long long)sd.spec_accepted_tokens, (unsigned long long)sd.spec_draft_tokens, s_dev ? "yes" : "NO", N,
           s_fail ? "the same tokens" : "DIFFER", s_mix ? "the same tokens" : "DIFFER");
    m3_model_free(&m);
}

static void test_sampled(m3_model *m) {
    test_sampled_variant(m, 0);
    setenv("M3_DRAWS", "backend", 1); /* the CPU too draws plain rows through draw_rows (target and draft) */
    test_sampled_variant(m, 1);
    test_sampled_variant(m, 2);
    unsetenv("M3_DRAWS");
}

/* 6. m3_forward refuses verified groups that do not fit the step (before running it): a draft
 * outside the vocabulary, rows past the output rows, a row not drawn, a uniform outside [0, 1) */
static void test_verify_taps_errors(m3_model *m) {
    m3_err err;
    m3_kv kv;
    const m3_kv_mem mem = m3_model_kv_mem(m);
    if (m3_kv_create_in(&kv, &m->cfg, M3_KV_F32, M3_KV_F32, m3_kv_page_tokens(&m->cfg), 4, &mem, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    m3_kv_seq seq = {0};
    m3_kv_seq *seqs[1] = {&seq};
    int32_t ids[3] = {5, 6, 7}, pos[3] = {0, 1, 2}, sq[3] = {0, 0, 0}, gn[3] = {-1, -1, -1}, gid[3], gfin[3];
    int rows[3] = {0, 1, 2}, done = 0;
    m3_draw_param par[3] = {{1, 1, 0, 0, m->cfg.vocab, 0.5}, {1, 1, 0, 0, m->cfg.vocab, 0.5}, {1, 1, 0, 0, m->cfg.vocab, 0.5}};
    m3_verify_group g;
    const char *what[4] = {"a draft outside the vocabulary", "rows past the output rows", "a row not drawn", "a uniform of 1"};
    for (int c = 0; c < 4; c++) {
        memset(&g, 0, sizeof g);
        g.k = 2;
        g.d[0] = 9;
        g.d[1] = c == 0 ? m->cfg.vocab : 11;
        g.row0 = c == 1 ? 1 : 0;
        g.u[2] = c == 3 ? 1.0 : 0.25;
        gn[1] = c == 2 ? 0 : -1;
        m3_batch b = {3, pos, sq, seqs};
        m3_taps taps = {.greedy_n = gn, .greedy_ids = gid, .greedy_fin = gfin, .greedy_done = &done, .draw_par = par,
                        .verify = &g, .n_verify = 1};
        float *lg = malloc(sizeof(float) * 3 * (size_t)m->cfg.vocab);
        int rc = m3_forward_ex(m, &kv, &b, ids, NULL, rows, 3, lg, &taps, &err);
        CHECK(rc == -1 && strstr(err.msg, "verified group"), "%s: rc %d, '%s'", what[c], rc, rc ? err.msg : "");
        free(lg);
        m3_kv_seq_release(&kv, &seq);
    }
    printf("6. verified groups that do not fit the step are refused before it runs (%s, %s, %s, %s)\n", what[0], what[1],
           what[2], what[3]);
    m3_kv_destroy(&kv);
}

/* ---------------------------------------------------------------- 6: loading errors */

static void test_load_errors(m3_model *m, m3_ops *ops) {
    m3_dspark d;
    m3_err err;
    char path[1024];
    snprintf(path, sizeof path, "%s/no-such-draft", DIR_);
    CHECK(m3_dspark_load(&d, path, m, ops, &err) == -1 && strstr(err.msg, "no-such-draft"), "missing dir: %s", err.msg);
    /* the target checkpoint itself is not a draft */
    CHECK(m3_dspark_load(&d, DIR_, m, ops, &err) == -1 && strstr(err.msg, "DSparkMiniMaxDraftModel"), "target as draft: %s", err.msg);
    m3_dspark_config c;
    m3_config tc = m->cfg;
    const char *base = "{\"architectures\":[\"DSparkMiniMaxDraftModel\"],\"text_config\":{\"vocab_size\":1024,\"hidden_size\":128,"
                       "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,"
                       "\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,\"moe_layer_freq\":[0],\"dense_intermediate_size\":64,"
                       "\"dspark_noise_token_id\":5,\"dspark_markov_rank\":8,%s}}";
    const struct { const char *extra, *want; } cases[] = {
        {"\"dspark_target_layer_ids\":[1,1]", "dspark_target_layer_ids[1]"},
        {"\"dspark_target_layer_ids\":[9]", "dspark_target_layer_ids[0]"},
        {"\"dspark_target_layer_ids\":[0],\"dspark_markov_head_type\":\"tree\"", "dspark_markov_head_type"},
        {"\"dspark_target_layer_ids\":[0],\"dspark_hybrid_context_fusion\":true", "dspark_hybrid_context_fusion"},
        {"\"dspark_target_layer_ids\":[0],\"sliding_window\":0", "sliding_window"},
        {"\"x\":1", "dspark_target_layer_ids"},
    };
    int ok = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char js[2048];
        snprintf(js, sizeof js, base, cases[i].extra);
        int rc = m3_dspark_config_parse(&c, js, "test", &tc, &err);
        int good = rc == -1 && strstr(err.msg, cases[i].want);
        CHECK(good, "config case %zu: rc %d, message '%s' should name %s", i, rc, err.msg, cases[i].want);
        ok += good;
        if (!rc) m3_dspark_config_free(&c);
    }
    printf("6. draft loading errors name the directory / field: %d / %zu config cases\n", ok, sizeof cases / sizeof cases[0]);
}

/* ---------------------------------------------------------------- 5: tensor parallel target
 * The target as a TP2 group of thread ranks (experts split), the draft on the model's own
 * CPU ops reading rank 0's hidden states: greedy output with DSpark bitwise equal to the
 * same group without it, for k = 1, 4, 8. */

static int tp_ops_init(void *arg, int rank, m3_ops *ops, m3_comm *comm, m3_err *err) {
    (void)arg; (void)rank; (void)comm;
    return m3_cpu_ops_init(ops, 1, err);
}
static void tp_ops_free(void *arg, int rank, m3_ops *ops) { (void)arg; (void)rank; m3_cpu_ops_free(ops); }

static void test_tp(m3_model *m) {
    enum { N = 6 };
    static rspec specs[N];
    static result base[N], got[N];
    greedy_specs(specs, N, m->cfg.vocab, 0x7e57);
    m3_err err;
    m3_comm *cs[2] = {0};
    if (m3_comm_threads_create(2, cs, &err)) { CHECK(0, "%s", err.msg); return; }
    m3_group_opts go = {2, M3_MOE_EXPERTS, cs, tp_ops_init, tp_ops_free, NULL, NULL};
    m3_group *g = m3_group_create(m, &go, &err);
    if (!g) { CHECK(0, "group: %s", err.msg); m3_comm_destroy_all(cs, 2); return; }
    m3_engine_opts o;
    m3_engine_opts_default(&o);
    o.kv_pages = 200;
    o.max_num_seqs = 4;
    o.max_num_batched_tokens = 64;
    o.group = g;
    run_info rb, ri;
    printf("5. TP2 target (thread ranks), draft on the CPU ops beside it:");
    if (!run(m, &o, specs, N, base, &rb)) {
        const int ks[4] = {1, 4, 8, 6};
        for (int i = 0; i < 4; i++) {
            m3_engine_opts os = o;
            spec_opts(&os, ks[i], M3_SPEC_DRAFT_PROBABILISTIC);
            os.draft_ops = m->ops;
            oracle orc = {specs, base, got, N, 20, 0};
            if (i == 3) { os.draft_hook = oracle_hook; os.draft_hook_arg = &orc; } /* accepted drafts, rolled-back rejections */
            if (run(m, &os, specs, N, got, &ri)) break;
            int eq = compare(i == 3 ? "TP2 + oracle drafts" : "TP2 + dspark", got, base, N);
            CHECK(ri.st.spec_verify_steps > 0 && ri.st.kv_blocks_used == 0, "TP2 k %d: %llu verify steps, %d blocks left", ks[i],
                  (unsigned long long)ri.st.spec_verify_steps, ri.st.kv_blocks_used);
            if (i == 3) CHECK(mal(&ri.st) > 2.0, "TP2 oracle drafts: MAL %.2f", mal(&ri.st));
            printf(" %s k %d: %d / %d equal (MAL %.2f);", i == 3 ? "oracle" : "dspark", ks[i], eq, N, mal(&ri.st));
        }
    }
    printf("\n");
    m3_group_free(g);
    m3_comm_destroy_all(cs, 2);
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: test_spec_engine CHECKPOINT_DIR [greedy,cache,sampled,errors,tp] [cpu|cuda]\n"); return 2; }
    DIR_ = argv[1];
    const char *sec = argc > 2 ? argv[2] : "greedy,cache,sampled,errors,tp";
    const int cuda = argc > 3 && !strcmp(argv[3], "cuda");
    if (argc > 3 && !cuda && strcmp(argv[3], "cpu")) { fprintf(stderr, "unknown backend '%s' (cpu or cuda)\n", argv[3]); return 2; }
    m3_err err;
    m3_ops ops;
    m3_model m;
    /* threads: $M3_THREADS, else every core (ctest runs the long sections on one thread: the
     * pool's spinning workers slow tiny ops down a lot on a busy 2-core machine) */
    if (cuda ? m3_cuda_ops_init(&ops, 0, &err) : m3_cpu_ops_init(&ops, 0, &err)) {
        fprintf(stderr, "%s ops: %s\n", cuda ? "cuda" : "cpu", err.msg);
        return 1;
    }
    if (cuda) m3_cuda_set_precision(&ops, 0); /* exact: the joint below is computed by the same arithmetic */
    if (m3_model_load(&m, DIR_, &ops, NULL, NULL, &err)) {
        fprintf(stderr, "load %s: %s\n", DIR_, err.msg);
        if (cuda) m3_cuda_ops_free(&ops);
        else m3_cpu_ops_free(&ops);
        return 1;
    }
    char dd[1024];
    snprintf(dd, sizeof dd, "%s/dspark", DIR_);
    m3_dspark d;
    if (m3_dspark_load(&d, dd, &m, &ops, &err)) {
        fprintf(stderr, "draft: %s\n", err.msg);
        m3_model_free(&m);
        if (cuda) m3_cuda_ops_free(&ops);
        else m3_cpu_ops_free(&ops);
        return 1;
    }
    printf("target %s (%d layers, vocab %d); draft: %d layers, %zu tensors (%.2f MB), target layers", DIR_, m.cfg.n_layers,
           m.cfg.vocab, d.cfg.base.n_layers, d.n_tensors, d.bytes / 1e6);
    for (int i = 0; i < d.cfg.n_target; i++) printf(" %d", d.cfg.target_layers[i]);
    printf(", window %d\n", d.cfg.window);
    double t0 = m3_now();
    if (strstr(sec, "greedy")) { test_greedy(&m); test_disable_by_batch(&m); }
    double t1 = m3_now();
    if (strstr(sec, "cache")) { test_ring_growth(&d); test_cache_state(&m, &d); test_draft_reference(&m, &d); }
    double t2 = m3_now();
    if (strstr(sec, "sampled")) {
        test_sampled(&m);
        if (!cuda) test_verify_after_failure(&m, &ops);
    }
    double t3 = m3_now();
    if (strstr(sec, "errors")) {
        test_load_errors(&m, &ops);
        test_verify_taps_errors(&m);
        /* what a device draft keeps out of the KV pool: its workspace grown now, the rings counted */
        size_t ring = 0, ws0 = d.ws_bytes;
        const m3_config *b = &d.cfg.base;
        const size_t want = 5 * 2 * (size_t)b->n_layers * (size_t)d.cfg.window * (size_t)b->n_kv_heads * b->head_dim * 4;
        CHECK(m3_dspark_reserve(&d, 5, 300, 4, &ring, &err) == 0 && ring == want && d.ws_bytes >= ws0 &&
                  d.ws_bytes >= (size_t)300 * (size_t)(m3_dspark_feat_dim(&d) + b->hidden) * 4,
              "m3_dspark_reserve: rings %zu (want %zu), workspace %zu bytes", ring, want, d.ws_bytes);
    }
    if (strstr(sec, "tp")) test_tp(&m);
    printf("time: greedy %.1fs, cache state %.1fs, sampled %.1fs\n", t1 - t0, t2 - t1, t3 - t2);
    m3_dspark_free(&d);
    m3_model_free(&m);
    if (cuda) m3_cuda_ops_free(&ops);
    else m3_cpu_ops_free(&ops);
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    else printf("all spec engine checks passed\n");
    return failures ? 1 : 0;
}
