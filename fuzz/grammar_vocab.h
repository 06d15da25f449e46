/* A small byte-level vocabulary for the grammar fuzz targets: the 256 single bytes, JSON-ish
 * multi-byte tokens (some crossing structure: "\":", "},{", a split UTF-8 character), and an
 * end id. Header-only. */
#ifndef M3_FUZZ_GRAMMAR_VOCAB_H
#define M3_FUZZ_GRAMMAR_VOCAB_H

#include <string.h>

#include "grammar/grammar.h"

static const char *const fz_multi[] = {"\":", "\",\"", "{\"", "\"}", "},{", "}}", "]}", "\"]", "[{", "[[", "]]", ", ", ": ", "true",
                                       "false", "null", "12", "0.5", "-3", "e+7", "\\u00e9", "\\n", "\xc3", "\xa9\"", "\xe2\x82",
                                       "\xac", "abc", "name", "\"name\":", "  ", "\n ", "1,", "0]", "9}", "\"\"", "{}", "[]"};
#define FZ_NMULTI (int)(sizeof fz_multi / sizeof fz_multi[0])
#define FZ_EOS (256 + FZ_NMULTI)
#define FZ_V (FZ_EOS + 1)

static inline m3_grammar_vocab *fz_vocab(void) {
    static char bytes[256];
    const char *p[FZ_V];
    uint32_t l[FZ_V];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        p[i] = bytes + i;
        l[i] = 1;
    }
    for (int i = 0; i < FZ_NMULTI; i++) {
        p[256 + i] = fz_multi[i];
        l[256 + i] = (uint32_t)strlen(fz_multi[i]);
    }
    p[FZ_EOS] = NULL;
    l[FZ_EOS] = 0;
    int32_t eos = FZ_EOS;
    m3_err err;
    return m3_grammar_vocab_new(FZ_V, p, l, &eos, 1, &err);
}

static inline const char *fz_tok(int32_t t, uint32_t *len) {
    static char b[256];
    if (t < 256) {
        b[t] = (char)t;
        *len = 1;
        return b + t;
    }
    if (t < FZ_EOS) {
        *len = (uint32_t)strlen(fz_multi[t - 256]);
        return fz_multi[t - 256];
    }
    *len = 0;
    return NULL;
}

#endif
