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
    uint64_t rng = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++) rng = (rng ^ data[i]) * 1099511628211ull;
    uint32_t mask[(FZ_V + 31) / 32], slow[(FZ_V + 31) / 32];
    char doc[16384];
    size_t len = 0;
    int ended = 0;
    for (int step = 0; step < 3000; step++) {
        if (m3_matcher_fill_mask(m, mask) || m3_matcher_fill_mask_slow(m, slow)) abort();
        if (memcmp(mask, slow, sizeof mask)) abort();
        int32_t t = -1;
        if (m3_matcher_can_end(m) && (step >= 12 || (rng >> 60) == 0)) t = FZ_EOS;
        else if (step < 12) {
            int cnt = 0;
            for (int i = 0; i < (FZ_V + 31) / 32; i++) cnt += __builtin_popcount(mask[i]);
            if (!cnt) abort(); /* stuck */
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            int k = (int)(rng % (uint64_t)cnt);
            for (int32_t i = 0; i < FZ_V; i++)
                if ((mask[i >> 5] >> (i & 31)) & 1 && k-- == 0) { t = i; break; }
        } else {
            if (step == 12 && m3_matcher_min_bytes_to_end(m) > 2000) break; /* a long minimum: not walked */
            int64_t best = INT64_MAX;
            for (int b = 0; b < 256; b++) {
                if (!((mask[b >> 5] >> (b & 31)) & 1)) continue;
                if (m3_matcher_accept(m, b)) abort();
                int64_t d = m3_matcher_min_bytes_to_end(m);
                m3_matcher_rollback(m, 1);
                if (d < best) { best = d; t = b; }
            }
            if (t < 0) abort();
        }
        if (m3_matcher_accept(m, t)) abort();
        if (t == FZ_EOS) { ended = 1; break; }
        uint32_t L;
        const char *b = fz_tok(t, &L);
        if (len + L >= sizeof doc) break;
        memcpy(doc + len, b, L);
        len += L;
    }
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
