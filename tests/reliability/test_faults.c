/* Engine faults (issue 9), on m3-tiny, CPU backend:
 *   1. allocation failure at every point: a scenario (engine created, five requests with mixed
 *      sampling, stop ids, logit_bias and n-gram state, one cancelled, a tight KV pool that
 *      preempts) is run once to count its engine allocations, then once per allocation with
 *      that one failing (then with every allocation from it on failing). Each run must end
 *      cleanly: create fails with a message, or every request added gets exactly one final
 *      callback (an error ending carries a reason), the KV blocks all come back, and after
 *      disarming, the same engine serves a request exactly as a fresh one does. Leaks are the
 *      sanitizer build's to find (ctest runs this under ASan + LSan too);
 *   2. NaN in the weights: a copy of the checkpoint whose embedding row of one token is NaN;
 *      prompts with that token end with M3_FINISH_ERROR and the reason "non-finite logits",
 *      the others give the same tokens as on the clean checkpoint, stats count them;
 *   3. KV pool exhausted: more work than the pool holds, from three threads adding and
 *      cancelling while the engine thread steps (the ThreadSanitizer build runs this too):
 *      everything finishes, blocks back to 0;
 *   4. allocation failure inside the CPU backend's ops (their scratch, fault module "backend"):
 *      the same scenario with the n-th op allocation failing (once, then from there on); a
 *      failed op fails its forward pass with a message, so every request ends cleanly as in 1,
 *      and no request finishes normally with other tokens than it has without faults;
 *   5. a forward pass that fails (an op table whose check fails every step holding one
 *      "poisoned" token, as a request that breaks its batch): with the backend recovering, only
 *      the request with that token ends (with the backend's message), every other request gives
 *      the tokens it gives on a clean op table; with the device lost (recover fails), every
 *      request ends with the reason, m3_engine_dead says it and m3_engine_add refuses.
 * In every section, request 0 (greedy) when it finishes normally gives the reference tokens.
 * Usage: test_faults WORK_DIR [CHECKPOINT_DIR (default tests/data/m3-tiny)] [--sections 1,2,3,4] [--threads N]
 * (from the repo root; the ThreadSanitizer run takes section 3 with 2 threads) */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "engine/engine.h"
#include "base/fault.h"
#include "model/m3.h"

#include "../check.h"

enum { MAXTOK = 64, NREQ = 5 };

typedef struct {
    uint64_t id;
    int32_t tok[MAXTOK];
    int n, finals, reason, errors_reported, after_final;
    const char *why;
    char why_buf[512]; /* the engine's message is valid during the callback only */
} result;

static void on_token(void *arg, uint64_t id, int32_t token, float logprob, int finished, int reason) {
    (void)id; (void)logprob;
    result *r = arg;
    if (r->finals) { r->after_final++; return; }
    if (token >= 0 && r->n < MAXTOK) r->tok[r->n++] = token;
    if (finished) { r->finals++; r->reason = reason; }
}

static void on_error(void *arg, uint64_t id, const char *msg) {
    (void)id;
    result *r = arg;
    r->errors_reported++;
    snprintf(r->why_buf, sizeof r->why_buf, "%s", msg ? msg : "");
    r->why = r->why_buf;
}

typedef struct {
    int32_t prompt[32];
    int n_prompt, max_tokens;
    m3_sampling sp;
    int32_t stop[2];
    int n_stop;
    m3_logit_bias bias[2];
} spec;

static void make_specs(spec *s, int V) {
    memset(s, 0, sizeof *s * NREQ);
    for (int i = 0; i < NREQ; i++) {
        s[i].n_prompt = 6 + 5 * i;
        for (int j = 0; j < s[i].n_prompt; j++) s[i].prompt[j] = (int32_t)(3 + (j * 37 + i * 11) % (V - 3));
        s[i].max_tokens = 6 + i;
    }
    s[1].sp.temperature = 0.9f, s[1].sp.top_p = 0.9f, s[1].sp.seed = 7;
    s[2].sp.temperature = 1.0f, s[2].sp.top_k = 10, s[2].sp.seed = 9, s[2].sp.repetition_penalty = 1.2f,
    s[2].sp.presence_penalty = 0.5f, s[2].sp.frequency_penalty = 0.3f;
    s[3].stop[0] = 5, s[3].n_stop = 1, s[3].sp.logprobs = 1, s[3].sp.top_logprobs = 3;
    s[4].bias[0] = (m3_logit_bias){4, 3.0f}, s[4].bias[1] = (m3_logit_bias){6, -100.0f};
    s[4].sp.logit_bias = s[4].bias, s[4].sp.n_logit_bias = 2, s[4].sp.min_tokens = 2;
}

static m3_engine_request make_req(const spec *s, result *r) {
    m3_engine_request q;
    memset(&q, 0, sizeof q);
    q.prompt = s->prompt;
    q.n_prompt = s->n_prompt;
    q.sampling = s->sp;
    q.max_tokens = s->max_tokens;
    q.stop_ids = s->stop;
    q.n_stop_ids = s->n_stop;
    q.ignore_eos = 1;
    q.on_token = on_token;
    q.on_error = on_error;
    q.arg = r;
    return q;
}

static m3_engine_opts tight_opts(void) {
    m3_engine_opts o;
    m3_engine_opts_default(&o);
    o.kv_pages = 3; /* 5 requests of up to 36 tokens on 3 pages: preemption */
    o.max_num_batched_tokens = 16;
    o.max_num_seqs = 4;
    return o;
}

/* Steps e until idle; 0, or -1 when it does not finish. */
static int drain_engine(m3_engine *e) {
    m3_err err;
    for (int step = 0; m3_engine_has_work(e); step++) {
        if (step > 20000) return -1;
        m3_engine_step(e, &err);
    }
    return 0;
}

/* The reference: request 0 alone on a fresh engine. */
static void reference(m3_model *m, const spec *s, result *ref) {
    memset(ref, 0, sizeof *ref);
    m3_engine_opts o = tight_opts();
    m3_err err;
    m3_engine *e = m3_engine_create(m, &o, &err);
    if (!e) { CHECK(0, "reference engine: %s", err.msg); return; }
    m3_engine_request q = make_req(&s[0], ref);
    ref->id = m3_engine_add(e, &q, &err);
    CHECK(ref->id && !drain_engine(e) && ref->finals == 1, "reference run");
    m3_engine_destroy(e);
}

/* The scenario under whatever fault plan is armed. Returns 1 when it ended cleanly. */
static int scenario(m3_model *m, const spec *s, const result *ref, long n_fault, int persistent, int *created) {
    m3_err err;
    m3_engine_opts o = tight_opts();
    result res[NREQ];
    memset(res, 0, sizeof res);
    m3_engine *e = m3_engine_create(m, &o, &err);
    *created = e != NULL;
    if (!e) {
        m3_fault_disarm(M3_FAULT_ENGINE);
        m3_fault_disarm(M3_FAULT_BACKEND);
        CHECK(strstr(err.msg, "memory") != NULL, "fault %ld: create failed without saying why: %s", n_fault, err.msg);
        return strstr(err.msg, "memory") != NULL;
    }
    int ok = 1;
    for (int i = 0; i < NREQ; i++) {
        m3_engine_request q = make_req(&s[i], &res[i]);
        res[i].id = m3_engine_add(e, &q, &err);
        if (!res[i].id && !strstr(err.msg, "memory")) { CHECK(0, "fault %ld: add %d: %s", n_fault, i, err.msg); ok = 0; }
        if (i == 2) { m3_engine_step(e, &err); m3_engine_cancel(e, res[1].id); }
    }
    if (drain_engine(e)) { CHECK(0, "fault %ld%s: the engine does not finish", n_fault, persistent ? "+" : ""); ok = 0; }
    for (int i = 0; i < NREQ; i++) {
        if (!res[i].id) continue;
        int good = res[i].finals == 1 && !res[i].after_final &&
                   (res[i].reason != M3_FINISH_ERROR || (res[i].errors_reported == 1 && res[i].why && res[i].why[0]));
        CHECK(good, "fault %ld%s: request %d: %d final callbacks, reason %s, %d error reasons", n_fault,
              persistent ? "+" : "", i, res[i].finals, m3_engine_finish_name(res[i].reason), res[i].errors_reported);
        ok &= good;
    }
    /* no silently wrong output: request 0 (greedy), when it finishes normally, as without faults */
    if (res[0].id && res[0].finals == 1 && res[0].reason != M3_FINISH_ERROR) {
        const int same0 = res[0].n == ref->n && !memcmp(res[0].tok, ref->tok, sizeof(int32_t) * (size_t)ref->n);
        CHECK(same0, "fault %ld%s: request 0 finished normally with other tokens than without faults", n_fault,
              persistent ? "+" : "");
        ok &= same0;
    }
    m3_fault_disarm(M3_FAULT_ENGINE);
    m3_fault_disarm(M3_FAULT_BACKEND);
    m3_engine_stats st;
    m3_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_used == 0 && st.running == 0 && st.waiting == 0, "fault %ld%s: blocks used %d, running %d, waiting %d",
          n_fault, persistent ? "+" : "", st.kv_blocks_used, st.running, st.waiting);
    ok &= st.kv_blocks_used == 0;
    /* still serving: the same engine answers request 0 exactly as a fresh one */
    result again;
    memset(&again, 0, sizeof again);
    m3_engine_request q = make_req(&s[0], &again);
    again.id = m3_engine_add(e, &q, &err);
    int same = again.id && !drain_engine(e) && again.finals == 1 && again.n == ref->n &&
               !memcmp(again.tok, ref->tok, sizeof(int32_t) * (size_t)ref->n);
    CHECK(same, "fault %ld%s: after the fault the engine does not serve as before (%d tokens vs %d)", n_fault,
          persistent ? "+" : "", again.n, ref->n);
    m3_engine_destroy(e);
    return ok && same;
}

/* ---- 1 and 4: the scenario with the n-th allocation of a module failing ---- */

typedef struct {
    long total, runs, clean, not_created, injected;
} fault_sweep;

/* Counts module mod's allocations in a clean run of the scenario, then runs it with allocation n
 * failing once, and from n on for every persist-th n: every n up to `dense`, then about 160
 * more spread over the rest, up to total + extra. */
static fault_sweep sweep(m3_model *m, const spec *s, m3_fault_module mod, long extra, long dense, int persist) {
    fault_sweep sw = {0};
    result ref;
    reference(m, s, &ref);
    int created;
    m3_fault_arm(mod, 1, 0, 1); /* count only */
    const int base_ok = scenario(m, s, &ref, 0, 0, &created);
    sw.total = m3_fault_seen(mod);
    CHECK(base_ok && sw.total > 10, "the scenario without faults (%ld allocations)", sw.total);
    const long stride = sw.total > dense ? (sw.total - dense) / 160 + 1 : 1;
    for (long n = 1; n <= sw.total + extra; n += n < dense ? 1 : stride)
        for (int persistent = 0; persistent < 2; persistent++) {
            if (persistent && n % persist) continue;
            m3_fault_arm(mod, n, persistent ? -1 : 1, 1);
            sw.clean += scenario(m, s, &ref, n, persistent, &created);
            sw.not_created += !created;
            sw.injected += m3_fault_failed(mod) > 0;
            sw.runs++;
        }
    m3_fault_disarm(mod);
    return sw;
}

/* ---- 2: a copy of the checkpoint with one embedding row set to NaN ---- */

static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    int rc = a && b ? 0 : -1;
    char buf[1 << 16];
    size_t k;
    while (!rc && (k = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, k, b) != k) rc = -1;
    if (a) fclose(a);
    if (b && fclose(b)) rc = -1;
    return rc;
}

/* Sets row `row` of the BF16 tensor `name` of a single-file safetensors to NaN (0x7FC0). */
static int poison_row(const char *path, const char *name, int row) {
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    uint64_t hl = 0;
    int rc = -1;
    char *h = NULL;
    if (fread(&hl, 8, 1, f) != 1 || hl > (1u << 26) || !(h = calloc(1, hl + 1)) || fread(h, 1, hl, f) != hl) goto out;
    char key[256];
    snprintf(key, sizeof key, "\"%s\"", name);
    char *p = strstr(h, key), *sh, *off;
    if (!p || !(sh = strstr(p, "\"shape\"")) || !(off = strstr(p, "\"data_offsets\"")) || !strstr(p, "BF16")) goto out;
    long rows, cols, begin;
    if (sscanf(strchr(sh, '[') + 1, "%ld , %ld", &rows, &cols) != 2 || sscanf(strchr(off, '[') + 1, "%ld", &begin) != 1 ||
        row >= rows)
        goto out;
    if (fseek(f, (long)(8 + hl) + begin + (long)row * cols * 2, SEEK_SET)) goto out;
    rc = 0;
    for (long i = 0; i < cols && !rc; i++) {
        uint8_t nan[2] = {0xC0, 0x7F};
        if (fwrite(nan, 1, 2, f) != 2) rc = -1;
    }
out:
    free(h);
    if (fclose(f)) rc = -1;
    return rc;
}

static void nan_weights(m3_ops *ops, const char *dir, const char *work, const spec *s) {
    m3_err err;
    char ndir[600], from[700], to[700];
    snprintf(ndir, sizeof ndir, "%s/nan-ck", work);
    mkdir(work, 0755);
    mkdir(ndir, 0755);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/%s", dir, files[i]);
        snprintf(to, sizeof to, "%s/%s", ndir, files[i]);
        if (copy_file(from, to)) { CHECK(0, "copy %s -> %s", from, to); return; }
    }
    /* the poisoned token: one no clean request below produces (checked on the clean model) */
    m3_model clean;
    if (m3_model_load(&clean, dir, ops, NULL, NULL, &err)) { CHECK(0, "load %s: %s", dir, err.msg); return; }
    m3_engine_opts o = tight_opts();
    o.kv_pages = 16;
    result base[NREQ];
    memset(base, 0, sizeof base);
    m3_engine *e = m3_engine_create(&clean, &o, &err);
    for (int i = 0; e && i < NREQ; i++) {
        m3_engine_request q = make_req(&s[i], &base[i]);
        base[i].id = m3_engine_add(e, &q, &err);
    }
    if (e) drain_engine(e);
    m3_engine_destroy(e);
    int32_t bad = -1;
    for (int32_t t = 2; t < clean.cfg.vocab && bad < 0; t++) {
        int used = 0;
        for (int i = 0; i < NREQ; i++) {
            for (int j = 0; j < s[i].n_prompt; j++) used |= s[i].prompt[j] == t;
            for (int j = 0; j < base[i].n; j++) used |= base[i].tok[j] == t;
        }
        if (!used) bad = t;
    }
    m3_model_free(&clean);
    if (bad < 0 || poison_row(to, "language_model.model.embed_tokens.weight", bad)) {
        CHECK(0, "cannot poison embedding row %d of %s", bad, to);
        return;
    }
    m3_model m;
    if (m3_model_load(&m, ndir, ops, NULL, NULL, &err)) { CHECK(0, "load %s: %s", ndir, err.msg); return; }
    e = m3_engine_create(&m, &o, &err);
    if (!e) { CHECK(0, "engine: %s", err.msg); m3_model_free(&m); return; }
    result res[NREQ + 2];
    memset(res, 0, sizeof res);
    spec poisoned[2];
    poisoned[0] = s[0], poisoned[1] = s[2];
    poisoned[0].prompt[3] = bad;                      /* in the middle of a prompt */
    poisoned[1].prompt[poisoned[1].n_prompt - 1] = bad; /* its last token */
    for (int i = 0; i < NREQ + 2; i++) {
        m3_engine_request q = make_req(i < NREQ ? &s[i] : &poisoned[i - NREQ], &res[i]);
        res[i].id = m3_engine_add(e, &q, &err);
        CHECK(res[i].id, "add: %s", err.msg);
    }
    CHECK(!drain_engine(e), "NaN weights: the engine does not finish");
    int clean_same = 0;
    for (int i = 0; i < NREQ; i++)
        clean_same += res[i].finals == 1 && res[i].n == base[i].n && res[i].reason == base[i].reason &&
                      !memcmp(res[i].tok, base[i].tok, sizeof(int32_t) * (size_t)base[i].n);
    int errs = 0;
    for (int i = NREQ; i < NREQ + 2; i++)
        errs += res[i].finals == 1 && res[i].reason == M3_FINISH_ERROR && res[i].n == 0 && res[i].why &&
                strstr(res[i].why, "non-finite") != NULL;
    m3_engine_stats st;
    m3_engine_get_stats(e, &st);
    CHECK(clean_same == NREQ && errs == 2 && st.nonfinite_logits == 2 && st.kv_blocks_used == 0,
          "NaN weights: %d/%d clean requests as on the clean model, %d/2 poisoned ones ended with a non-finite-logits "
          "error (%s), stats %llu, blocks %d",
          clean_same, NREQ, errs, res[NREQ].why ? res[NREQ].why : "-", (unsigned long long)st.nonfinite_logits,
          st.kv_blocks_used);
    printf("2. NaN in the embedding row of token %d: %d/%d clean requests unchanged, %d/2 poisoned ones end with \"%s\"\n",
           bad, clean_same, NREQ, errs, res[NREQ].why ? res[NREQ].why : "-");
    m3_engine_destroy(e);
    m3_model_free(&m);
}

/* ---- 3: producers on three threads against a pool that cannot hold everything ---- */

typedef struct {
    m3_engine *e;
    const spec *s;
    result res[12];
    int seed;
} producer;

static void *produce(void *arg) {
    producer *p = arg;
    m3_err err;
    for (int i = 0; i < 12; i++) {
        spec one = p->s[(i + p->seed) % NREQ];
        one.max_tokens = 20;
        m3_engine_request q = make_req(&one, &p->res[i]);
        q.ignore_eos = 1;
        p->res[i].id = m3_engine_add(p->e, &q, &err);
        if (i >= 2 && i % 3 == 0) m3_engine_cancel(p->e, p->res[i - 2].id);
        m3_engine_stats st;
        m3_engine_get_stats(p->e, &st);
        struct timespec ts = {0, 300000L * (i % 4)};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void threads_tight_pool(m3_model *m, const spec *s, int threads) {
    m3_engine_opts o = tight_opts();
    m3_err err;
    m3_engine *e = m3_engine_create(m, &o, &err);
    if (!e) { CHECK(0, "engine: %s", err.msg); return; }
    producer p[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        memset(&p[i], 0, sizeof p[i]);
        p[i].e = e, p[i].s = s, p[i].seed = i;
        pthread_create(&th[i], NULL, produce, &p[i]);
    }
    int joined = 0, steps = 0;
    for (;;) {
        if (m3_engine_has_work(e)) { m3_engine_step(e, &err); steps++; }
        else if (joined) break;
        else {
            for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
            joined = 1;
        }
        if (steps > 50000) { CHECK(0, "threads: the engine does not finish"); break; }
    }
    int finals = 0, added = 0, bad = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 12; j++) {
            added += p[i].res[j].id != 0;
            finals += p[i].res[j].finals == 1;
            bad += p[i].res[j].after_final + (p[i].res[j].reason == M3_FINISH_ERROR);
        }
    m3_engine_stats st;
    m3_engine_get_stats(e, &st);
    CHECK(added == 36 && finals == 36 && !bad && st.kv_blocks_used == 0 && st.preemptions > 0,
          "threads: %d added, %d finished once, %d bad, blocks %d, preemptions %llu", added, finals, bad,
          st.kv_blocks_used, (unsigned long long)st.preemptions);
    printf("3. three producer threads, %d requests on a %d-page pool (%d compute threads): %d finished (%llu cancelled), "
           "%llu preemptions, blocks back to %d, %d steps\n",
           added, o.kv_pages, threads, finals, (unsigned long long)st.requests_finished[M3_FINISH_CANCELLED],
           (unsigned long long)st.preemptions, st.kv_blocks_used, steps);
    m3_engine_destroy(e);
}


/* ---- 5: a failed forward pass: one request's fault, or the device's ---- */

static m3_ops base_ops;            /* the CPU table the wrapper forwards to */
static int32_t poison_tok = -1;    /* a step holding this id fails */
static int step_poisoned, device_lost, recovers;

static int wrap_begin(void *ctx, const m3_kv *kv, const m3_batch *b, const int32_t *ids, m3_err *err) {
    step_poisoned = 0;
    for (int t = 0; t < b->T; t++) step_poisoned |= ids[t] == poison_tok;
    return base_ops.begin_step ? base_ops.begin_step(ctx, kv, b, ids, err) : 0;
}
static int wrap_check(void *ctx, m3_err *err) {
    if (base_ops.check && base_ops.check(ctx, err)) return -1;
    if (step_poisoned) {
        if (err) m3_errf(err, "injected: a kernel refused token %d", (int)poison_tok);
        return -1;
    }
    return 0;
}
static int wrap_recover(void *ctx, m3_err *err) {
    (void)ctx;
    recovers++;
    return device_lost ? m3_errf(err, "injected: the device is lost") : 0;
}

static void failed_forward(m3_ops *ops, const char *dir, const spec *s) {
    base_ops = *ops;
    m3_ops w = *ops;
    w.begin_step = wrap_begin;
    w.check = wrap_check;
    w.recover = wrap_recover;
    m3_model m;
    m3_err err;
    if (m3_model_load(&m, dir, &w, NULL, NULL, &err)) { CHECK(0, "load: %s", err.msg); return; }
    /* request 3's prompt holds the poisoned id (its 4th token: no other prompt has it there) */
    spec ps[NREQ];
    memcpy(ps, s, sizeof ps);
    int32_t p = ps[3].prompt[3];
    for (int i = 0; i < NREQ; i++)
        for (int j = 0; j < ps[i].n_prompt; j++)
            if (i != 3 && ps[i].prompt[j] == p) ps[i].prompt[j] = (p + 1) % m.cfg.vocab;
    for (int lost = 0; lost < 2; lost++) {
        result ref[NREQ], res[NREQ];
        memset(ref, 0, sizeof ref);
        memset(res, 0, sizeof res);
        for (int run = 0; run < 2; run++) { /* 0: clean, 1: poisoned */
            result *rr = run ? res : ref;
            poison_tok = run ? p : -1;
            device_lost = lost;
            recovers = 0;
            m3_engine_opts o;
            m3_engine_opts_default(&o);
            o.max_num_seqs = 8;
            o.max_num_batched_tokens = 64; /* every request in each step */
            m3_engine *e = m3_engine_create(&m, &o, &err);
            if (!e) { CHECK(0, "engine: %s", err.msg); break; }
            for (int i = 0; i < NREQ; i++) {
                m3_engine_request q = make_req(&ps[i], &rr[i]);
                rr[i].id = m3_engine_add(e, &q, &err);
            }
            int failed_steps = 0;
            for (int step = 0; m3_engine_has_work(e) && step < 1000; step++) failed_steps += m3_engine_step(e, &err) < 0;
            if (run && !lost) {
                int others = 1;
                for (int i = 0; i < NREQ; i++)
                    if (i != 3)
                        others &= rr[i].finals == 1 && rr[i].reason == ref[i].reason && rr[i].n == ref[i].n &&
                                  !memcmp(rr[i].tok, ref[i].tok, sizeof(int32_t) * (size_t)ref[i].n);
                CHECK(others, "5. the requests beside the failing one give their clean tokens");
                CHECK(rr[3].finals == 1 && rr[3].reason == M3_FINISH_ERROR && rr[3].why && strstr(rr[3].why, "refused token"),
                      "5. the failing request ends with the backend's message: %s", rr[3].why ? rr[3].why : "-");
                CHECK(failed_steps >= 1 && recovers >= 1 && !m3_engine_dead(e), "5. %d failed steps, %d recoveries, engine alive",
                      failed_steps, recovers);
                result again;
                memset(&again, 0, sizeof again);
                m3_engine_request q = make_req(&ps[0], &again);
                again.id = m3_engine_add(e, &q, &err);
                int same = again.id && !drain_engine(e) && again.finals == 1 && again.n == ref[0].n &&
                           !memcmp(again.tok, ref[0].tok, sizeof(int32_t) * (size_t)ref[0].n);
                CHECK(same, "5. the engine serves as before afterwards");
                printf("5. a step holding a request that fails its forward pass: %d failed steps; that request ended "
                       "(\"%s\"), the %d others gave their clean tokens\n", failed_steps, rr[3].why, NREQ - 1);
            }
            if (run && lost) {
                int all_err = 1;
                for (int i = 0; i < NREQ; i++)
                    all_err &= rr[i].finals == 1 && rr[i].reason == M3_FINISH_ERROR && rr[i].why && strstr(rr[i].why, "device");
                CHECK(all_err, "5. the device lost: every request ends with the reason (%s)", rr[0].why ? rr[0].why : "-");
                CHECK(m3_engine_dead(e) && strstr(m3_engine_dead(e), "device is lost"), "5. m3_engine_dead says why: %s",
                      m3_engine_dead(e) ? m3_engine_dead(e) : "NULL");
                result late;
                memset(&late, 0, sizeof late);
                m3_engine_request q = make_req(&ps[0], &late);
                CHECK(!m3_engine_add(e, &q, &err) && strstr(err.msg, "stopped"), "5. a request after it is refused: %s", err.msg);
                m3_engine_stats st;
                m3_engine_get_stats(e, &st);
                CHECK(st.kv_blocks_used == 0 && st.running == 0 && st.waiting == 0, "5. nothing left running");
                printf("5. the device lost: %d requests ended with \"%s\"; later requests refused\n", NREQ, rr[0].why);
            }
            m3_engine_destroy(e);
        }
    }
    poison_tok = -1;
    m3_model_free(&m);
}

int main(int argc, char **argv) {
    const char *work = NULL, *dir = "tests/data/m3-tiny", *sections = "1,2,3,4,5";
    int threads = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sections") && i + 1 < argc) sections = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!work) work = argv[i];
        else dir = argv[i];
    }
    if (!work || threads < 1) {
        fprintf(stderr, "usage: test_faults WORK_DIR [CHECKPOINT_DIR] [--sections 1,2,3,4] [--threads N]\n");
        return 2;
    }
    m3_err err;
    m3_ops ops;
    m3_model m;
    if (m3_cpu_ops_init(&ops, threads, &err)) { fprintf(stderr, "cpu ops: %s\n", err.msg); return 1; }
    if (m3_model_load(&m, dir, &ops, NULL, NULL, &err)) {
        fprintf(stderr, "load %s: %s\n", dir, err.msg);
        m3_cpu_ops_free(&ops);
        return 1;
    }
    spec s[NREQ];
    make_specs(s, m.cfg.vocab);

    if (strchr(sections, '1')) { /* every engine allocation of the scenario fails once, then from it on */
        /* the count includes the check after the scenario; 8 more cover allocations that happen
         * only on error paths */
        fault_sweep sw = sweep(&m, s, M3_FAULT_ENGINE, 8, 1L << 30, 3);
        printf("1. %ld engine allocations in the scenario; %ld runs with the n-th failing (once / from there on): %ld "
               "ended cleanly (%ld at engine creation), blocks back, then served as before\n",
               sw.total, sw.runs, sw.clean, sw.not_created);
        CHECK(sw.clean == sw.runs, "%ld of %ld fault runs were not clean", sw.runs - sw.clean, sw.runs);
    }
    if (strchr(sections, '4')) { /* the n-th allocation of the CPU backend's ops fails (once / from there on) */
        /* every one of the first 64, then about 160 more spread over the rest */
        fault_sweep sw = sweep(&m, s, M3_FAULT_BACKEND, 0, 64, 5);
        printf("4. %ld backend allocations in the scenario; %ld runs with the n-th failing (once / from there on): %ld "
               "ended cleanly (%ld with a failure injected), no wrong output, then served as before\n",
               sw.total, sw.runs, sw.clean, sw.injected);
        CHECK(sw.clean == sw.runs, "%ld of %ld backend fault runs were not clean", sw.runs - sw.clean, sw.runs);
        CHECK(sw.injected == sw.runs, "%ld of %ld backend fault runs injected nothing", sw.runs - sw.injected, sw.runs);
    }
    if (strchr(sections, '2')) nan_weights(&ops, dir, work, s);
    if (strchr(sections, '3')) threads_tight_pool(&m, s, threads);
    if (strchr(sections, '5')) failed_forward(&ops, dir, s);

    m3_model_free(&m);
    m3_cpu_ops_free(&ops);
    if (failures) { printf("%d checks FAILED\n", failures); return 1; }
    printf("all fault checks passed\n");
    return 0;
}
