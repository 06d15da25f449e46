/* The priority scheduling policy (engine.h opts.scheduling_priority, vLLM's --scheduling-policy
 * priority) on m3-tiny, CPU backend, 2 threads:
 *   1. admission order: with one sequence at a time, requests queued together are admitted by
 *      (priority, arrival): smaller values first, equal values in arrival order; under FCFS in
 *      arrival order whatever their priorities;
 *   2. the preemption victim: two requests that cannot both hold their KV in a tight pool; under
 *      FCFS the most recently admitted is preempted (the first finishes first), under the
 *      priority policy the one of the larger priority value (the later, more urgent one finishes
 *      first, however late it came); a preempted request goes back in the queue by its priority;
 *   3. a victim taken while another request prefills in chunks (under priority, one before it in
 *      the running list);
 *   in every run each request's greedy tokens equal its tokens alone, and the pool's blocks all
 *   come back.
 * Usage: test_priority [CHECKPOINT_DIR (default tests/data/m3-tiny)] (run from the repo root) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "engine/engine.h"
#include "model/m3.h"

#include "../check.h"

enum { NR = 5, MAXTOK = 160 };

typedef struct {
    int32_t tok[MAXTOK];
    int n, finished, admitted;
    int admit_seq, finish_seq; /* the order of its first admission and of its end among the requests */
    int *admits, *finishes;
} rec;

static void on_token(void *arg, uint64_t id, int32_t token, float logprob, int finished, int reason) {
    rec *r = arg;
    (void)id;
    (void)logprob;
    (void)reason;
    if (token >= 0 && r->n < MAXTOK) r->tok[r->n++] = token;
    if (finished) {
        r->finished = 1;
        r->finish_seq = (*r->finishes)++;
    }
}

static void on_admit(void *arg, uint64_t id, int cached) {
    rec *r = arg;
    (void)id;
    (void)cached;
    if (!r->admitted) r->admit_seq = (*r->admits)++;
    r->admitted = 1;
}

typedef struct {
    const int32_t *prompt;
    int n_prompt, max_tokens, priority;
    int arrive; /* the step before which it is added */
} job;

/* Adds jobs[0..n) to a fresh engine (each before step `arrive`), runs it dry; 0 or -1. */
static int run(m3_model *m, const m3_engine_opts *o, const job *jobs, int n, rec *recs, m3_engine_stats *st) {
    m3_err err;
    static int admits, finishes;
    admits = finishes = 0;
    memset(recs, 0, sizeof *recs * (size_t)n);
    m3_engine *e = m3_engine_create(m, o, &err);
    if (!e) { CHECK(0, "engine: %s", err.msg); return -1; }
    int rc = 0, added = 0;
    for (int step = 0; added < n || m3_engine_has_work(e); step++) {
      for (int i = 0; i < n; i++) {
        if (jobs[i].arrive != step) continue;
        m3_engine_request q;
        memset(&q, 0, sizeof q);
        q.prompt = jobs[i].prompt;
        q.n_prompt = jobs[i].n_prompt;
        q.max_tokens = jobs[i].max_tokens;
        q.ignore_eos = 1;
        q.priority = jobs[i].priority;
        q.on_token = on_token;
        q.on_admit = on_admit;
        q.arg = &recs[i];
        recs[i].admits = &admits;
        recs[i].finishes = &finishes;
        if (!m3_engine_add(e, &q, &err)) { CHECK(0, "add %d: %s", i, err.msg); rc = -1; goto out; }
        added++;
      }
        if (m3_engine_step(e, &err) < 0) { CHECK(0, "step: %s", err.msg); rc = -1; goto out; }
        if (step > 100000) { CHECK(0, "the engine does not finish"); rc = -1; goto out; }
    }
    m3_engine_get_stats(e, st);
out:
    m3_engine_destroy(e);
    return rc;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/data/m3-tiny";
    m3_ops ops;
    m3_model m;
    m3_err err;
    if (m3_cpu_ops_init(&ops, 2, &err)) { fprintf(stderr, "cpu ops: %s\n", err.msg); return 1; }
    if (m3_model_load(&m, dir, &ops, NULL, NULL, &err)) {
        fprintf(stderr, "load %s: %s\n", dir, err.msg);
        m3_cpu_ops_free(&ops);
        return 1;
    }
    static int32_t prompts[NR][64];
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < NR; i++)
        for (int t = 0; t < 64; t++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            prompts[i][t] = 2 + (int32_t)(s % (uint64_t)(m.cfg.vocab - 2));
        }
    static rec recs[NR], alone[NR];
    m3_engine_stats st;
    m3_engine_opts o;

    /* ---- 1. admission order ---- */
    const int prio[NR] = {5, 1, 3, 1, -2}; /* expected order: 4 (-2), 1, 3 (1, in arrival order), 2 (3), 0 (5) */
    const int want[NR] = {4, 1, 3, 2, 0};  /* the admission rank of each request */
    job j1[NR];
    for (int i = 0; i < NR; i++) j1[i] = (job){prompts[i], 24, 3, prio[i], 0};
    for (int pol = 0; pol < 2; pol++) {
        m3_engine_opts_default(&o);
        o.kv_pages = 64;
        o.max_num_seqs = 1;
        o.scheduling_priority = pol;
        if (run(&m, &o, j1, NR, recs, &st)) goto done;
        int in_order = 1;
        for (int i = 0; i < NR; i++) in_order &= recs[i].finished && recs[i].admit_seq == (pol ? want[i] : i);
        CHECK(in_order, "%s: admitted %d %d %d %d %d", pol ? "priority" : "fcfs", recs[0].admit_seq, recs[1].admit_seq,
              recs[2].admit_seq, recs[3].admit_seq, recs[4].admit_seq);
        printf("1. %s, one sequence at a time, priorities 5 1 3 1 -2: admitted as %d %d %d %d %d\n", pol ? "priority" : "fcfs    ",
               recs[0].admit_seq, recs[1].admit_seq, recs[2].admit_seq, recs[3].admit_seq, recs[4].admit_seq);
    }

    /* ---- 2. the preemption victim ---- */
    /* A (priority 10) arrives first, B (priority 0) second; each grows to 64 + 120 tokens (12
     * pages of 16), the pool holds 16: they cannot both finish without a preemption */
    job j2[2] = {{prompts[0], 64, 120, 10, 0}, {prompts[1], 64, 120, 0, 0}};
    for (int i = 0; i < 2; i++) {
        m3_engine_opts_default(&o);
        o.kv_pages = 32;
        if (run(&m, &o, &j2[i], 1, &alone[i], &st)) goto done;
    }
    for (int pol = 0; pol < 2; pol++) {
        m3_engine_opts_default(&o);
        o.kv_pages = 16;
        o.enable_prefix_caching = 0;
        o.scheduling_priority = pol;
        if (run(&m, &o, j2, 2, recs, &st)) goto done;
        int eq = 1;
        for (int i = 0; i < 2; i++)
            eq &= recs[i].finished && recs[i].n == 120 && !memcmp(recs[i].tok, alone[i].tok, sizeof(int32_t) * 120);
        /* FCFS: B (admitted last) is preempted, A ends first; priority: A (10) is, B ends first */
        const int first = recs[0].finish_seq < recs[1].finish_seq ? 0 : 1;
        CHECK(eq && st.preemptions > 0 && first == (pol ? 1 : 0) && st.kv_blocks_used == 0,
              "%s: equal to alone %d, %llu preemptions, %c finished first, %d blocks still used", pol ? "priority" : "fcfs", eq,
              (unsigned long long)st.preemptions, 'A' + first, st.kv_blocks_used);
        printf("2. %s, a 16-page pool, A (priority 10, first) and B (priority 0): %llu preemptions, %c finished first, "
               "tokens equal to alone: %s\n", pol ? "priority" : "fcfs    ", (unsigned long long)st.preemptions, 'A' + first,
               eq ? "yes" : "NO");
    }
    /* ---- 3. a victim taken while another request prefills ----
     * A (priority 5) decodes; B (priority 0, a 200-token prompt) arrives at step 3 and prefills in
     * chunks of at most 32 tokens; the pool (16 pages) cannot hold both: B's chunk finds no page.
     * FCFS takes B itself (the latest admitted), priority takes A, which sits before B in the
     * running list (the scheduler's index steps back over it) */
    static int32_t longp[200];
    for (int t = 0; t < 200; t++) longp[t] = prompts[2][t % 64] ^ (t / 64);
    job j3[2] = {{prompts[3], 64, 120, 5, 0}, {longp, 200, 8, 0, 3}};
    for (int i = 0; i < 2; i++) {
        job a = j3[i];
        a.arrive = 0;
        m3_engine_opts_default(&o);
        o.kv_pages = 32;
        if (run(&m, &o, &a, 1, &alone[i], &st)) goto done;
    }
    for (int pol = 0; pol < 2; pol++) {
        m3_engine_opts_default(&o);
        o.kv_pages = 16;
        o.max_num_batched_tokens = 32;
        o.enable_prefix_caching = 0;
        o.scheduling_priority = pol;
        if (run(&m, &o, j3, 2, recs, &st)) goto done;
        const int eq = recs[0].finished && recs[1].finished && recs[0].n == 120 && recs[1].n == 8 &&
                       !memcmp(recs[0].tok, alone[0].tok, sizeof(int32_t) * 120) && !memcmp(recs[1].tok, alone[1].tok, sizeof(int32_t) * 8);
        const int first = recs[0].finish_seq < recs[1].finish_seq ? 0 : 1;
        CHECK(eq && st.preemptions > 0 && first == (pol ? 1 : 0) && st.kv_blocks_used == 0,
              "prefill victim, %s: equal %d, %llu preemptions, %c first", pol ? "priority" : "fcfs", eq,
              (unsigned long long)st.preemptions, 'A' + first);
        printf("3. %s, B prefilling in chunks of 32 beside A decoding: %llu preemptions, %c finished first, tokens equal to "
               "alone: %s\n", pol ? "priority" : "fcfs    ", (unsigned long long)st.preemptions, 'A' + first, eq ? "yes" : "NO");
    }
done:
    m3_model_free(&m);
    m3_cpu_ops_free(&ops);
    if (failures) { fprintf(stderr, "test_priority: %d checks failed\n", failures); return 1; }
    printf("test_priority: all checks passed\n");
    return 0;
}
