/* The regex grammars (src/grammar/regex.c) for a differential test against JavaScript's RegExp
 * (tests/grammar/regex_diff.mjs): reads JSON lines
 *   {"re": "...", "mode": "full" | "pattern", "probes": ["...", ...], "samples": N, "seed": S}
 * or {"schema": {...}, "probes": [...], "samples": N, "seed": S} (any JSON Schema: "format" ...)
 * or {"gbnf": "root ::= ...", "probes": [...], "samples": N, "seed": S} (m3_grammar_from_gbnf)
 * and answers one JSON line each
 *   {"error": null | "...", "accept": [true, ...], "samples": ["...", ...]}
 * mode full: m3_grammar_from_regex (the whole text matches); pattern: the JSON Schema
 * {"type": "string", "pattern": re}, probes and samples being JSON string documents. A probe is
 * accepted when the matcher takes its bytes and may end there; samples are random walks of the
 * matcher over bytes (uniform over the allowed bytes for a random number of steps, then the
 * byte that brings the end nearest), each ended where the matcher allows an end (null: a walk
 * that did not end, or bytes that are not UTF-8).
 * usage: regex_check < requests.jsonl > answers.jsonl */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

#define NB 257 /* bytes 0..255, 256 the end */

static uint64_t rng;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static int bit(const uint32_t *m, int t) { return (int)((m[t >> 5] >> (t & 31)) & 1); }

/* one random walk: its text (malloc'd, *len bytes) or NULL when it did not end */
static char *walk(const m3_grammar_compiled *gc, size_t *len) {
    m3_err err;
    m3_matcher *m = m3_matcher_new(gc, &err);
    if (!m) return NULL;
    uint32_t mask[(NB + 31) / 32];
    size_t cap = 256, n = 0;
    char *out = malloc(cap);
    int uniform = (int)(rnd() % 24), ended = 0;
    for (int step = 0; step < 4000 && out; step++) {
        if (m3_matcher_fill_mask(m, mask)) break;
        int t = -1;
        if (m3_matcher_can_end(m) && (step >= uniform || rnd() % 6 == 0)) t = 256;
        else if (step < uniform) {
            int cnt = 0;
            for (int b = 0; b < 256; b++) cnt += bit(mask, b);
            if (!cnt) { t = bit(mask, 256) ? 256 : -1; }
            else {
                int k = (int)(rnd() % (uint32_t)cnt);
                for (int b = 0; b < 256 && t < 0; b++)
                    if (bit(mask, b) && k-- == 0) t = b;
            }
        } else {
            int64_t best = INT64_MAX;
            for (int b = 0; b < 256; b++) {
                if (!bit(mask, b) || m3_matcher_accept(m, b)) continue;
                int64_t d = m3_matcher_min_bytes_to_end(m);
                m3_matcher_rollback(m, 1);
                if (d < best || (d == best && rnd() % 2)) { best = d; t = b; }
            }
        }
        if (t < 0) break;
        if (m3_matcher_accept(m, t)) break;
        if (t == 256) { ended = 1; break; }
        if (n + 1 >= cap) {
            char *o = realloc(out, cap *= 2);
            if (!o) { free(out); out = NULL; break; }
            out = o;
        }
        out[n++] = (char)t;
    }
    m3_matcher_free(m);
    if (!ended || !out) { free(out); return NULL; }
    *len = n;
    return out;
}

int main(void) {
    /* the vocabulary: one token a byte, 256 the end */
    static char bytes[256];
    const char *tok[NB];
    uint32_t lens[NB];
    for (int b = 0; b < 256; b++) { bytes[b] = (char)b; tok[b] = bytes + b; lens[b] = 1; }
    tok[256] = NULL;
    lens[256] = 0;
    int32_t eos = 256;
    m3_err err;
    m3_grammar_vocab *v = m3_grammar_vocab_new(NB, tok, lens, &eos, 1, &err);
    if (!v) { fprintf(stderr, "regex_check: %s\n", err.msg); return 1; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *rq = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &je);
        if (!rq) { fprintf(stderr, "regex_check: bad request line: %s\n", je.text); return 1; }
        json_t *re = json_object_get(rq, "re");
        const char *mode = json_string_value(json_object_get(rq, "mode"));
        int pattern = mode && !strcmp(mode, "pattern");
        rng = (uint64_t)json_integer_value(json_object_get(rq, "seed")) * 0x9E3779B97F4A7C15ull + 1;
        m3_grammar *g;
        json_t *schema = json_object_get(rq, "schema"), *gbnf = json_object_get(rq, "gbnf");
        if (gbnf) g = m3_grammar_from_gbnf(json_string_value(gbnf), json_string_length(gbnf), NULL, &err);
        else if (pattern || schema) {
            json_t *sc = schema ? json_incref(schema) : json_pack("{s:s,s:O}", "type", "string", "pattern", re);
            char *txt = json_dumps(sc, JSON_COMPACT);
            g = m3_grammar_from_schema(txt, strlen(txt), NULL, &err);
            free(txt);
            json_decref(sc);
        } else g = m3_grammar_from_regex(json_string_value(re), json_string_length(re), NULL, &err);
        m3_grammar_compiled *gc = g ? m3_grammar_compile(g, v, NULL, &err) : NULL;
        json_t *ans = json_object();
        json_object_set_new(ans, "error", gc ? json_null() : json_string(err.msg));
        json_t *acc = json_array(), *smp = json_array();
        m3_matcher *m = gc ? m3_matcher_new(gc, &err) : NULL;
        json_t *pr = json_object_get(rq, "probes");
        for (size_t i = 0; m && i < json_array_size(pr); i++) {
            json_t *p = json_array_get(pr, i);
            m3_matcher_reset(m);
            size_t L = json_string_length(p); /* the empty text: the start may end (accept_bytes wants bytes) */
            int ok = (L == 0 || m3_matcher_accept_bytes(m, json_string_value(p), L) == 0) && m3_matcher_can_end(m);
            json_array_append_new(acc, json_boolean(ok));
        }
        int ns = (int)json_integer_value(json_object_get(rq, "samples"));
        for (int i = 0; gc && i < ns; i++) {
            size_t L = 0;
            char *s = walk(gc, &L);
            json_t *js = s ? json_stringn(s, L) : NULL; /* NULL: not UTF-8, or the walk did not end */
            json_array_append_new(smp, js ? js : json_null());
            free(s);
        }
        json_object_set_new(ans, "accept", acc);
        json_object_set_new(ans, "samples", smp);
        char *out = json_dumps(ans, JSON_COMPACT);
        printf("%s\n", out);
        fflush(stdout);
        free(out);
        json_decref(ans);
        m3_matcher_free(m);
        m3_grammar_compiled_free(gc);
        m3_grammar_free(g);
        json_decref(rq);
    }
    free(line);
    m3_grammar_vocab_free(v);
    return 0;
}
