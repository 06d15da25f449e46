/* libFuzzer: regex or grammar text -> m3_grammar, the first byte choosing the form (mod 3): 0,
 * m3_grammar_from_regex (vLLM's guided_regex: the whole output matches); 1, the JSON Schema
 * {"type": "string", "pattern": ...} (when the text is UTF-8); 2, m3_grammar_from_gbnf (GBNF,
 * src/grammar/ebnf.c). Never a crash, a leak or a
 * hang; an accepted pattern compiles for a small vocabulary (fuzz/grammar_vocab.h) and a random
 * walk (seeded by the input) keeps the cached mask equal to the cache-free one, is never stuck,
 * and ends in valid UTF-8 (the regex form) or a JSON string (the pattern form). What the texts
 * mean is tests/grammar/regex_diff.mjs's to check, against JavaScript's RegExp. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "grammar/grammar.h"
#include "grammar_vocab.h"

static int utf8_ok(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int k = m3_utf8_len((const uint8_t *)s + i, n - i);
        if (k <= 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static m3_grammar_vocab *v;
    if (!v) v = fz_vocab();
    if (size < 1 || size > 512) return 0;
    int form = data[0] % 3, pattern = form == 1;
    const char *re = (const char *)data + 1;
    size_t n = size - 1;
    m3_err err;
    m3_grammar *g = NULL;
    m3_grammar_opts o; /* bigger automata fail while built: sanitized, the subset construction takes ~0.4 ms a state */
    m3_grammar_opts_default(&o);
    o.max_states = 5000;
    if (form == 0) g = m3_grammar_from_regex(re, n, &o, &err);
    else if (form == 2) g = m3_grammar_from_gbnf(re, n, &o, &err);
    else {
        json_t *s = json_stringn(re, n); /* NULL: not UTF-8 (or a NUL), nothing to try */
        json_t *sc = s ? json_pack("{s:s,s:o}", "type", "string", "pattern", s) : NULL;
        char *txt = sc ? json_dumps(sc, JSON_COMPACT) : NULL;
        if (txt) g = m3_grammar_from_schema(txt, strlen(txt), &o, &err);
        free(txt);
        json_decref(sc);
    }
    if (!g) return 0;
    m3_grammar_compiled *gc = m3_grammar_compile(g, v, NULL, &err);
    m3_matcher *m = gc ? m3_matcher_new(gc, &err) : NULL;
    if (!m) goto done;
    static char doc[16384];
    size_t len = 0;
    int ended = fz_walk(m, data, size, doc, sizeof doc, &len);
    if (ended) {
        if (!pattern && !utf8_ok(doc, len)) abort();
        if (pattern) {
            json_t *j = json_loadb(doc, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL); /* \u0000 is a character too */
            if (!json_is_string(j)) abort();
            json_decref(j);
        }
    }
done:
    m3_matcher_free(m);
    m3_grammar_compiled_free(gc);
    m3_grammar_free(g);
    return 0;
}
