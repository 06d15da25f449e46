/* Engine core (src/engine/engine.h) on m3-tiny, CPU backend, 2 threads:
 *   1. batch invariance: requests with random prompts and mixed sampling, arriving at different
 *      steps under a small token budget (chunked prefill), give bitwise the tokens and logprobs
 *      they give alone, the batch sampled by 4 threads, alone by the engine thread; greedy ones
 *      equal the Hugging Face reference's greedy tokens;
 *   2. a tight KV pool forces preemptions: outputs unchanged, blocks back to baseline;
 *   3. prefix caching: shared prefixes hit the cache, outputs equal a run without it;
 *   4. cancellation mid-prefill and mid-decode;
 *   5. the per-step token budget and sequence limit, stop ids and max_tokens;
 *   6. requests added and cancelled from another thread while the engine thread steps.
 * Usage: test_engine [CHECKPOINT_DIR (default tests/data/m3-tiny)] (run from the repo root) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/m3.h"

#include "../check.h"

enum { MAXTOK = 64, MAXREQ = 32, MAXPROMPT = 700 };

typedef struct {
    int32_t prompt[MAXPROMPT];
    int n_prompt;
    m3_sampling sp;
    int max_tokens, ignore_eos;
    int32_t stop_ids[4];
    int n_stop;
    int arrive;           /* step at which it is added */
    int cancel_at;        /* cancel after this many steps since arrival (-1: never) */
    int cancel_after_gen; /* cancel once it generated this many tokens (-1: never) */
} spec;

typedef struct {
    uint64_t id;
    int32_t tok[MAXTOK];
    float lp[MAXTOK];
    int n, finished, reason, after_finish, bad_token;
    int added_step;
    int no_id_check;      /* the id is stored by another thread, maybe after the first callback */
    int *n_finished;      /* counted on finish when set */
} result;

static void on_token(void *arg, uint64_t id, int32_t token, float logprob, int finished, int reason) {
    result *r = arg;
    if (r->finished) { r->after_finish++; return; }
    if (!r->no_id_check && id != r->id) r->bad_token++;
    if (token >= 0) {
        if (r->n < MAXTOK) { r->tok[r->n] = token; r->lp[r->n] = logprob; }
        r->n++;
    } else if (!finished) r->bad_token++;
    if (finished) {
        r->finished = 1;
        r->reason = reason;
        if (r->n_finished) (*r->n_finished)++;
    }
}

typedef struct {
    m3_sample_out out[MAXTOK];
    int n, finished, reason;
} out_rec;

static void on_output(void *arg, uint64_t id, const m3_sample_out *o, int finished, int reason) {
    out_rec *r = arg;
    (void)id;
    if (o && r->n < MAXTOK) r->out[r->n++] = *o;
    if (finished) { r->finished = 1; r->reason = reason; }
}

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

typedef struct {
    int steps, max_step_tokens, max_step_seqs, budget_violations, seq_violations;
    m3_engine_stats st;
} run_info;

static m3_engine_request make_req(const spec *s, result *res) {
    m3_engine_request q;
    memset(&q, 0, sizeof q);
    q.prompt = s->prompt;
    q.n_prompt = s->n_prompt;
    q.sampling = s->sp;
    q.sampling.logprobs = 1; /* compared bitwise below */
    q.max_tokens = s->max_tokens;
    q.stop_ids = s->stop_ids;
    q.n_stop_ids = s->n_stop;
    q.ignore_eos = s->ignore_eos;
    q.on_token = on_token;
    q.arg = res;
    return q;
}

/* Runs specs[0..n) through a fresh engine with options o; results into res. -1 on error. */
static int run(m3_model *m, const m3_engine_opts *o, const spec *specs, int n, result *res, run_info *ri) {
    m3_err err;
    memset(ri, 0, sizeof *ri);
    memset(res, 0, sizeof *res * (size_t)n);
    m3_engine *e = m3_engine_create(m, o, &err);
    if (!e) { CHECK(0, "engine create: %s", err.msg); return -1; }
    int added = 0, step = 0, rc = 0;
    for (;;) {
        for (int i = 0; i < n; i++) {
            if (res[i].id == 0 && specs[i].arrive <= step) {
                m3_engine_request q = make_req(&specs[i], &res[i]);
                res[i].id = m3_engine_add(e, &q, &err);
                res[i].added_step = step;
                if (!res[i].id) { CHECK(0, "add %d: %s", i, err.msg); rc = -1; goto out; }
                added++;
            }
            if (res[i].id && !res[i].finished) {
                int since = step - res[i].added_step;
                if ((specs[i].cancel_at >= 0 && since == specs[i].cancel_at) ||
                    (specs[i].cancel_after_gen >= 0 && res[i].n >= specs[i].cancel_after_gen))
                    m3_engine_cancel(e, res[i].id);
            }
        }
        if (added == n && !m3_engine_has_work(e)) break;
        int left = m3_engine_step(e, &err);
        if (left < 0) { CHECK(0, "step %d: %s", step, err.msg); rc = -1; goto out; }
        m3_engine_step_stats ss;
        m3_engine_last_step(e, &ss);
        if (ss.n_tokens > ri->max_step_tokens) ri->max_step_tokens = ss.n_tokens;
        if (ss.n_seqs > ri->max_step_seqs) ri->max_step_seqs = ss.n_seqs;
        if (ss.n_tokens > o->max_num_batched_tokens) ri->budget_violations++;
        if (ss.n_seqs > o->max_num_seqs) ri->seq_violations++;
        step++;
        if (step > 100000) { CHECK(0, "engine does not finish"); rc = -1; goto out; }
    }
    ri->steps = step;
    m3_engine_get_stats(e, &ri->st);
out:
    m3_engine_destroy(e);
    return rc;
}

/* Each spec alone (arrival 0, no cancellation), generous budget, no prefix cache. */
static int run_alone(m3_model *m, const spec *specs, int n, result *res) {
    m3_engine_opts o;
    m3_engine_opts_default(&o);
    o.kv_pages = 64;
    o.enable_prefix_caching = 0;
    o.max_num_batched_tokens = 1024;
    o.sample_threads = 1;
    for (int i = 0; i < n; i++) {
        spec s = specs[i];
        s.arrive = 0;
        s.cancel_at = s.cancel_after_gen = -1;
        run_info ri;
        if (run(m, &o, &s, 1, &res[i], &ri)) return -1;
    }
    return 0;
}

/* bitwise comparison of two runs' outputs; returns how many requests match */
static int compare(const char *what, const spec *specs, const result *a, const result *b, int n) {
    int same = 0;
    for (int i = 0; i < n; i++) {
        int ok = a[i].finished && b[i].finished && a[i].n == b[i].n && a[i].reason == b[i].reason && a[i].n <= MAXTOK &&
                 !memcmp(a[i].tok, b[i].tok, sizeof(int32_t) * (size_t)a[i].n) &&
                 !memcmp(a[i].lp, b[i].lp, sizeof(float) * (size_t)a[i].n) && !a[i].after_finish && !b[i].after_finish &&
                 !a[i].bad_token && !b[i].bad_token;
        CHECK(ok, "%s: request %d (prompt %d, T %.2f, max_tokens %d): %d tokens (%s) vs %d (%s)", what, i,
              specs[i].n_prompt, specs[i].sp.temperature, specs[i].max_tokens, a[i].n, m3_engine_finish_name(a[i].reason),
              b[i].n, m3_engine_finish_name(b[i].reason));
        same += ok;
    }
    return same;
}

static void random_spec(spec *s, uint64_t *r, int V, int len) {
    memset(s, 0, sizeof *s);
    s->n_prompt = len;
    for (int j = 0; j < 150; j++) s->prompt[j] = 2 + (int32_t)(rnd(r) % (uint64_t)(V - 2));
    s->max_tokens = 8 + (int)(rnd(r) % 17);
    s->cancel_at = s->cancel_after_gen = -1;
    switch (rnd(r) % 3) {
    case 0: break; /* greedy */
    case 1: s->sp.temperature = 0.8f; s->sp.top_p = 0.9f; s->sp.seed = rnd(r); break;
    default: s->sp.temperature = 1.0f; s->sp.top_k = 20; s->sp.seed = rnd(r); break;
    }
}

/* ---- 6: a producer thread adds (and cancels) while this thread runs the engine ---- */
typedef struct {
    m3_engine *e;
    const spec *specs;
    result *res;
    int n, cancel_idx, failed;
    uint64_t ids[MAXREQ];
} producer;

static void sleep_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void *produce(void *arg) {
    producer *p = arg;
    m3_err err;
    for (int i = 0; i < p->n; i++) {
        m3_engine_request q = make_req(&p->specs[i], &p->res[i]);
        p->ids[i] = m3_engine_add(p->e, &q, &err);
        if (!p->ids[i]) p->failed++;
        if (i == p->cancel_idx + 2) m3_engine_cancel(p->e, p->ids[p->cancel_idx]);
        sleep_ms(1 + i % 3);
    }
    return NULL;
}

static const m3_tensor *oracle_get(m3_st *st, const char *fmt, int k) {
    char nm[64];
    snprintf(nm, sizeof nm, fmt, k);
    return m3_st_find(st, nm);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/data/m3-tiny";
    char oracle_path[512];
    snprintf(oracle_path, sizeof oracle_path, "%s.oracle.safetensors", dir);
    m3_err err;
    m3_ops ops;
    m3_model m;
    if (m3_cpu_ops_init(&ops, 2, &err)) { fprintf(stderr, "cpu ops: %s\n", err.msg); return 1; }
    if (m3_model_load(&m, dir, &ops, NULL, NULL, &err)) {
        fprintf(stderr, "load %s: %s\n", dir, err.msg);
        m3_cpu_ops_free(&ops);
        return 1;
    }
    const int V = m.cfg.vocab;
    m3_st *orc = m3_st_open(oracle_path, &err);
    if (!orc) {
        fprintf(stderr, "oracle: %s\n", err.msg);
        m3_model_free(&m);
        m3_cpu_ops_free(&ops);
        return 1;
    }

    static spec specs[MAXREQ];
    static result alone[MAXREQ], got[MAXREQ], got2[MAXREQ];
    run_info ri, ri2;

    /* ---- 0. greedy alone equals the reference on every oracle case ---- */
    int n_cases = 0, cases_ok = 0;
    for (int k = 0; k < 8; k++) {
        const m3_tensor *ids = oracle_get(orc, "case%d.input_ids", k), *gt = oracle_get(orc, "case%d.greedy_tokens", k);
        if (!ids || !gt || ids->numel > MAXPROMPT || gt->numel > MAXTOK) continue;
        spec s;
        memset(&s, 0, sizeof s);
        s.n_prompt = (int)ids->numel;
        memcpy(s.prompt, ids->data, sizeof(int32_t) * (size_t)s.n_prompt);
        s.max_tokens = (int)gt->numel;
        s.ignore_eos = 1;
        s.cancel_at = s.cancel_after_gen = -1;
        result r;
        if (run_alone(&m, &s, 1, &r)) break;
        int ok = r.n == s.max_tokens && r.reason == M3_FINISH_LENGTH && !memcmp(r.tok, gt->data, sizeof(int32_t) * (size_t)r.n);
        CHECK(ok, "oracle case %d (prompt %d): engine greedy tokens differ from the reference", k, s.n_prompt);
        n_cases++;
        cases_ok += ok;
    }
    printf("0. oracle cases: %d / %d greedy sequences equal the reference (%s)\n", cases_ok, n_cases, oracle_path);
    CHECK(n_cases >= 3, "oracle cases found: %d", n_cases);

    /* ---- 1. batch invariance ---- */
    enum { N1 = 12 };
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N1; i++) {
        random_spec(&specs[i], &r, V, 1 + (int)(rnd(&r) % 150));
        specs[i].arrive = (int)(rnd(&r) % 12);
    }
    /* request 0: the reference's case 2, greedy, its 24 tokens */
    {
        const m3_tensor *ids = oracle_get(orc, "case%d.input_ids", 2), *gt = oracle_get(orc, "case%d.greedy_tokens", 2);
        CHECK(ids && gt, "oracle case 2 present");
        if (ids && gt) {
            specs[0].n_prompt = (int)ids->numel;
            memcpy(specs[0].prompt, ids->data, sizeof(int32_t) * (size_t)ids->numel);
            memset(&specs[0].sp, 0, sizeof specs[0].sp);
            specs[0].max_tokens = (int)gt->numel;
            specs[0].ignore_eos = 1;
            specs[0].arrive = 3;
        }
    }
    specs[1].n_prompt = 150; /* longest, arrives first: chunked over several steps */
    specs[1].arrive = 0;
    specs[2].n_prompt = 1;
    m3_engine_opts o;
    m3_engine_opts_default(&o);
    o.kv_pages = 256;
    o.max_num_seqs = 8;
    o.max_num_batched_tokens = 48;
    o.sample_threads = 4; /* a step's draws on 4 threads; alone: on the engine thread */
    m3_sampler_test_split_min(1); /* and a draw the engine thread makes alone splits its row over them */
    if (run_alone(&m, specs, N1, alone)) goto done;
    if (run(&m, &o, specs, N1, got, &ri)) goto done;
    m3_sampler_test_split_min(32768);
    int same = compare("batch invariance", specs, got, alone, N1);
    {
        const m3_tensor *gt = oracle_get(orc, "case%d.greedy_tokens", 2);
        CHECK(gt && got[0].n == 24 && !memcmp(got[0].tok, gt->data, sizeof(int32_t) * 24),
              "batched case 2 equals the reference's 24 greedy tokens");
    }
    CHECK(!ri.budget_violations && !ri.seq_violations, "budget violations %d, seq violations %d", ri.budget_violations,
          ri.seq_violations);
    CHECK(ri.st.kv_blocks_used == 0 && ri.st.running == 0 && ri.st.waiting == 0, "all returned: used %d",
          ri.st.kv_blocks_used);
    int n_len = 0;
    for (int i = 0; i < N1; i++) {
        if (got[i].reason == M3_FINISH_LENGTH) {
            n_len++;
            CHECK(got[i].n == specs[i].max_tokens, "request %d: length after %d of %d tokens", i, got[i].n, specs[i].max_tokens);
        } else {
            CHECK(got[i].reason == M3_FINISH_STOP && got[i].tok[got[i].n - 1] == m.cfg.eos_id, "request %d ends %s", i,
                  m3_engine_finish_name(got[i].reason));
        }
    }
    printf("1. batch invariance: %d / %d requests bitwise equal (tokens + logprobs) to alone; %d steps, "
           "max %d tokens / %d seqs per step (budget 48 / 8); %llu prefilled, %llu generated; %d finished by length\n",
           same, N1, ri.steps, ri.max_step_tokens, ri.max_step_seqs, (unsigned long long)ri.st.tokens_prefilled,
           (unsigned long long)ri.st.tokens_generated, n_len);
    CHECK(ri.max_step_seqs > 1 && ri.max_step_tokens == 48, "steps were batched (max seqs %d, max tokens %d)",
          ri.max_step_seqs, ri.max_step_tokens);
    CHECK(ri.st.tokens_sampled_parallel > 0, "the batch's draws were spread over the sampling threads (%llu)",
          (unsigned long long)ri.st.tokens_sampled_parallel);
    printf("   %llu of %llu tokens drawn by 4 sampling threads beside others of their step\n",
           (unsigned long long)ri.st.tokens_sampled_parallel, (unsigned long long)ri.st.tokens_generated);

    /* ---- 2. tight pool: preemptions ---- */
    {
        m3_engine_opts t = o;
        t.kv_pages = 14; /* 224 tokens; the largest request needs 174 */
        t.max_num_batched_tokens = 64;
        t.enable_prefix_caching = 0;
        for (int pc = 0; pc < 2; pc++) {
            t.enable_prefix_caching = pc;
            if (run(&m, &t, specs, N1, got2, &ri2)) goto done;
            same = compare(pc ? "tight pool + prefix cache" : "tight pool", specs, got2, alone, N1);
            CHECK(ri2.st.preemptions > 0, "preemptions %llu", (unsigned long long)ri2.st.preemptions);
            CHECK(ri2.st.kv_blocks_used == 0, "blocks used at the end %d", ri2.st.kv_blocks_used);
            CHECK(!ri2.budget_violations, "budget violations %d", ri2.budget_violations);
            printf("2. tight pool (%d pages of %d tokens, prefix cache %s): %llu preemptions, %d / %d requests bitwise "
                   "equal; %d steps; %llu prefilled (recompute included); blocks used at end %d / %d\n",
                   t.kv_pages, ri2.st.page_tokens, pc ? "on" : "off", (unsigned long long)ri2.st.preemptions, same, N1,
                   ri2.steps, (unsigned long long)ri2.st.tokens_prefilled, ri2.st.kv_blocks_used, ri2.st.kv_blocks_total);
        }
    }

    /* ---- 3. prefix caching ---- */
    {
        enum { N3 = 8, PRE = 100 };
        spec ps[N3];
        uint64_t r3 = 77;
        int32_t common[PRE];
        for (int j = 0; j < PRE; j++) common[j] = 2 + (int32_t)(rnd(&r3) % (uint64_t)(V - 2));
        for (int i = 0; i < N3; i++) {
            random_spec(&ps[i], &r3, V, PRE + 1 + (int)(rnd(&r3) % 40));
            memcpy(ps[i].prompt, common, sizeof common);
            ps[i].arrive = i == 0 ? 0 : 4 + i;
        }
        ps[N3 - 1].n_prompt = PRE; /* exactly the prefix */
        static result pa[N3], pb[N3];
        run_info ra, rb;
        m3_engine_opts t = o;
        t.enable_prefix_caching = 1;
        if (run(&m, &t, ps, N3, pa, &ra)) goto done;
        t.enable_prefix_caching = 0;
        if (run(&m, &t, ps, N3, pb, &rb)) goto done;
        same = compare("prefix cache", ps, pa, pb, N3);
        CHECK(ra.st.prefix_hit_tokens > 0 && rb.st.prefix_hit_tokens == 0, "hit tokens %llu / %llu",
              (unsigned long long)ra.st.prefix_hit_tokens, (unsigned long long)rb.st.prefix_hit_tokens);
        CHECK(ra.st.tokens_prefilled < rb.st.tokens_prefilled, "cache saves prefill (%llu vs %llu)",
              (unsigned long long)ra.st.tokens_prefilled, (unsigned long long)rb.st.tokens_prefilled);
        CHECK(ra.st.kv_blocks_used == 0 && rb.st.kv_blocks_used == 0, "blocks used at end %d %d", ra.st.kv_blocks_used,
              rb.st.kv_blocks_used);
        printf("3. prefix cache: %d requests sharing %d tokens: %llu hit tokens, %llu vs %llu tokens prefilled; %d / %d "
               "bitwise equal to no caching; cached blocks left %d\n",
               N3, PRE, (unsigned long long)ra.st.prefix_hit_tokens, (unsigned long long)ra.st.tokens_prefilled,
               (unsigned long long)rb.st.tokens_prefilled, same, N3, ra.st.kv_blocks_cached);
    }

    /* ---- 4. cancellation ---- */
    {
        spec cs[6];
        for (int i = 0; i < 6; i++) cs[i] = specs[i + 1];
        cs[0].n_prompt = 150;
        cs[0].arrive = 0;
        cs[0].cancel_at = 1;        /* mid-prefill: 150 tokens take 4 steps at 48 */
        cs[1].arrive = 0;
        cs[1].max_tokens = 24;
        cs[1].ignore_eos = 1;
        cs[1].cancel_after_gen = 3; /* mid-decode */
        cs[2].cancel_at = 0;        /* cancelled before its first step */
        static result ca[6], cal[6];
        run_info rc4;
        if (run(&m, &o, cs, 6, ca, &rc4)) goto done;
        if (run_alone(&m, cs, 6, cal)) goto done;
        CHECK(ca[0].reason == M3_FINISH_CANCELLED && ca[0].n == 0, "mid-prefill: %s after %d tokens",
              m3_engine_finish_name(ca[0].reason), ca[0].n);
        CHECK(ca[1].reason == M3_FINISH_CANCELLED && ca[1].n >= 3 && ca[1].n < 24, "mid-decode: %s after %d tokens",
              m3_engine_finish_name(ca[1].reason), ca[1].n);
        CHECK(ca[1].n <= MAXTOK && !memcmp(ca[1].tok, cal[1].tok, sizeof(int32_t) * (size_t)ca[1].n),
              "mid-decode tokens before the cancel equal alone");
        CHECK(ca[2].reason == M3_FINISH_CANCELLED && ca[2].n == 0, "queued: %s", m3_engine_finish_name(ca[2].reason));
        same = compare("others after cancellations", cs + 3, ca + 3, cal + 3, 3);
        CHECK(rc4.st.kv_blocks_used == 0 && rc4.st.requests_finished[M3_FINISH_CANCELLED] == 3,
              "blocks used %d, cancelled %llu", rc4.st.kv_blocks_used,
              (unsigned long long)rc4.st.requests_finished[M3_FINISH_CANCELLED]);
        printf("4. cancellation: mid-prefill after %d tokens, mid-decode after %d, queued after %d; others %d / 3 "
               "bitwise equal; blocks used at end %d\n",
               ca[0].n, ca[1].n, ca[2].n, same, rc4.st.kv_blocks_used);
    }

    /* ---- 5. stop ids, max_tokens, budget ---- */
    {
        /* a greedy request's 6th token as a stop id: ends there (first occurrence), reason stop */
        spec s = specs[0];
        int stop_tok = alone[0].tok[5], first = 0;
        while (alone[0].tok[first] != stop_tok) first++;
        s.stop_ids[0] = stop_tok;
        s.n_stop = 1;
        s.arrive = 0;
        result rs;
        m3_engine_opts t = o;
        t.max_num_batched_tokens = 7;
        t.max_num_seqs = 2;
        if (run(&m, &t, &s, 1, &rs, &ri2)) goto done;
        CHECK(rs.reason == M3_FINISH_STOP && rs.n == first + 1 && !memcmp(rs.tok, alone[0].tok, sizeof(int32_t) * (size_t)rs.n),
              "stop id %d: %s after %d tokens (expected stop after %d)", stop_tok, m3_engine_finish_name(rs.reason), rs.n,
              first + 1);
        CHECK(ri2.max_step_tokens <= 7 && !ri2.budget_violations, "budget 7: max %d", ri2.max_step_tokens);
        /* max_tokens 1 */
        s.n_stop = 0;
        s.max_tokens = 1;
        if (run(&m, &t, &s, 1, &rs, &ri2)) goto done;
        CHECK(rs.reason == M3_FINISH_LENGTH && rs.n == 1 && rs.tok[0] == alone[0].tok[0], "max_tokens 1: %s, %d",
              m3_engine_finish_name(rs.reason), rs.n);
        /* all 12 under a budget of 7 tokens and 2 seqs: still identical */
        if (run(&m, &t, specs, N1, got2, &ri2)) goto done;
        same = compare("budget 7", specs, got2, alone, N1);
        CHECK(!ri2.budget_violations && !ri2.seq_violations && ri2.max_step_seqs <= 2, "budget %d / seqs %d violations",
              ri2.budget_violations, ri2.seq_violations);
        printf("5. stop id ends after %d tokens (stop), max_tokens 1 (length); budget 7 tokens / 2 seqs: max %d / %d per "
               "step over %d steps, %d / %d bitwise equal\n",
               first + 1, ri2.max_step_tokens, ri2.max_step_seqs, ri2.steps, same, N1);
        /* on_output: the sampler's whole output (top_logprobs) */
        {
            m3_engine *e = m3_engine_create(&m, &o, &err);
            CHECK(e, "create: %s", err.msg);
            out_rec rec = {0};
            m3_engine_request q = make_req(&specs[0], &rs);
            q.sampling.top_logprobs = 3;
            q.on_output = on_output;
            q.arg = &rec;
            uint64_t id = e ? m3_engine_add(e, &q, &err) : 0;
            while (id && m3_engine_step(e, &err) > 0) {}
            m3_engine_destroy(e);
            int ok = rec.n == alone[0].n && rec.finished && rec.reason == alone[0].reason;
            for (int i = 0; ok && i < rec.n; i++)
                ok = rec.out[i].token == alone[0].tok[i] && rec.out[i].logprob == alone[0].lp[i] && rec.out[i].n_top == 3 &&
                     rec.out[i].top_ids[0] == rec.out[i].token && rec.out[i].rank == 1;
            CHECK(ok, "on_output with top_logprobs 3: %d tokens", rec.n);
        }
        /* the warm-up (m3_engine_warmup): two rounds run, nothing counted or left behind, and the
         * next request's tokens those of a fresh engine */
        {
            m3_engine_opts w = o;
            w.enable_prefix_caching = 1;
            m3_engine *e = m3_engine_create(&m, &w, &err);
            CHECK(e, "create: %s", err.msg);
            const int n = e ? m3_engine_warmup(e, 40, &err) : -1;
            m3_engine_stats st;
            if (e) m3_engine_get_stats(e, &st);
            unsigned long long fin = 0;
            for (int i = 0; e && i < 5; i++) fin += st.requests_finished[i];
            CHECK(e && n == (40 < w.max_num_batched_tokens ? 40 : w.max_num_batched_tokens) && st.steps == 0 &&
                      st.tokens_prefilled == 0 && fin == 0 && st.kv_blocks_used == 0 && st.kv_blocks_cached == 0,
                  "warm-up of 40 tokens: ran %d, then %llu steps, %llu prefilled, %llu finished, blocks used %d / cached %d", n,
                  e ? (unsigned long long)st.steps : 0ull, e ? (unsigned long long)st.tokens_prefilled : 0ull, fin,
                  e ? st.kv_blocks_used : -1, e ? st.kv_blocks_cached : -1);
            m3_engine_request q = make_req(&specs[0], &rs);
            memset(&rs, 0, sizeof rs);
            uint64_t id = e ? m3_engine_add(e, &q, &err) : 0;
            while (id && m3_engine_step(e, &err) > 0) {}
            m3_engine_destroy(e);
            CHECK(rs.n == alone[0].n && !memcmp(rs.tok, alone[0].tok, sizeof(int32_t) * (size_t)rs.n),
                  "after the warm-up: %d tokens against a fresh engine's %d", rs.n, alone[0].n);
        }
        /* bad requests */
        m3_engine *e = m3_engine_create(&m, &o, &err);
        m3_engine_request q = make_req(&specs[0], &rs);
        int32_t bad = V;
        q.prompt = &bad;
        q.n_prompt = 1;
        CHECK(e && m3_engine_add(e, &q, &err) == 0, "out-of-range id rejected");
        q = make_req(&specs[0], &rs);
        q.max_tokens = -1; /* (0 runs the prompt alone: test_prompt_logprobs) */
        CHECK(e && m3_engine_add(e, &q, &err) == 0, "max_tokens -1 rejected");
        m3_engine_destroy(e);
    }
    /* ---- 6. another thread adds and cancels ---- */
    {
        static result tr[N1];
        memset(tr, 0, sizeof tr);
        int n_fin = 0;
        for (int i = 0; i < N1; i++) { tr[i].no_id_check = 1; tr[i].n_finished = &n_fin; }
        m3_engine *e = m3_engine_create(&m, &o, &err);
        CHECK(e, "create: %s", err.msg);
        if (!e) goto done;
        producer p = {e, specs, tr, N1, 5, 0, {0}};
        pthread_t th;
        CHECK(!pthread_create(&th, NULL, produce, &p), "thread");
        int steps = 0, idle_waits = 0;
        while (n_fin < N1 && steps < 100000) {
            if (!m3_engine_wait_work(e, 200)) { if (++idle_waits > 50) break; continue; }
            if (m3_engine_step(e, &err) < 0) { CHECK(0, "step: %s", err.msg); break; }
            steps++;
        }
        pthread_join(th, NULL);
        m3_engine_stats st;
        m3_engine_get_stats(e, &st);
        m3_engine_destroy(e);
        int ok_n = 0;
        for (int i = 0; i < N1; i++) {
            int ok = tr[i].finished && !tr[i].after_finish && tr[i].n <= MAXTOK && tr[i].n <= alone[i].n &&
                     !memcmp(tr[i].tok, alone[i].tok, sizeof(int32_t) * (size_t)tr[i].n) &&
                     !memcmp(tr[i].lp, alone[i].lp, sizeof(float) * (size_t)tr[i].n) &&
                     (tr[i].reason == M3_FINISH_CANCELLED ? i == p.cancel_idx
                                                          : tr[i].reason == alone[i].reason && tr[i].n == alone[i].n);
            CHECK(ok, "threaded: request %d: %d tokens (%s) vs alone %d (%s)", i, tr[i].n,
                  m3_engine_finish_name(tr[i].reason), alone[i].n, m3_engine_finish_name(alone[i].reason));
            ok_n += ok;
        }
        CHECK(!p.failed && n_fin == N1 && st.kv_blocks_used == 0 && st.running == 0 && st.waiting == 0,
              "threaded: failed adds %d, finished %d, blocks used %d", p.failed, n_fin, st.kv_blocks_used);
        printf("6. producer thread: %d requests added while stepping, request %d cancelled from there (%s after %d "
               "tokens); %d / %d as expected; %d steps; blocks used at end %d\n",
               N1, p.cancel_idx, m3_engine_finish_name(tr[p.cancel_idx].reason), tr[p.cancel_idx].n, ok_n, N1, steps,
               st.kv_blocks_used);
    }
done:
    m3_st_close(orc);
    m3_model_free(&m);
    m3_cpu_ops_free(&ops);
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    else printf("all engine checks passed\n");
    return failures ? 1 : 0;
}
