/* Token byte strings for the grammar tests and benchmark: a tokenizer.json's ids mapped to the
 * bytes they stand for (byte-level BPE: each code point of the stored spelling is one byte,
 * GPT-2's byte <-> code point table), added tokens as empty (never allowed by a grammar).
 * Header-only; the grammar module itself never sees the tokenizer. */
#ifndef M3_TEST_GRAMMAR_VOCAB_H
#define M3_TEST_GRAMMAR_VOCAB_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

typedef struct {
    int32_t n;
    char **bytes;
    uint32_t *lens;
    int32_t eos;
} test_vocab;

static inline void test_vocab_free(test_vocab *v) {
    for (int32_t i = 0; v->bytes && i < v->n; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
    memset(v, 0, sizeof *v);
}

/* 0, or -1 when the tokenizer cannot be loaded */
static inline int test_vocab_load(const char *path, test_vocab *v, m3_tok **tok_out) {
    m3_err err;
    m3_tok *t = m3_tok_load(path, &err);
    if (!t) return -1;
    int inv[512];
    for (int i = 0; i < 512; i++) inv[i] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        inv[printable ? b : 256 + k++] = b;
    }
    v->n = m3_tok_n_vocab(t);
    v->bytes = calloc((size_t)v->n, sizeof *v->bytes);
    v->lens = calloc((size_t)v->n, sizeof *v->lens);
    v->eos = m3_tok_eos_id(t);
    for (int32_t id = 0; id < v->n; id++) {
        const char *s = m3_tok_id_to_token(t, id);
        if (!s || m3_tok_is_special(t, id)) continue;
        size_t L = strlen(s), n = 0;
        char *out = malloc(L + 1);
        int ok = 1;
        for (size_t i = 0; i < L && ok;) { /* UTF-8 code points -> bytes */
            unsigned c = (unsigned char)s[i], cp;
            if (c < 0x80) { cp = c; i += 1; }
            else if ((c & 0xE0) == 0xC0 && i + 1 < L) { cp = ((c & 0x1F) << 6) | ((unsigned char)s[i + 1] & 0x3F); i += 2; }
            else { ok = 0; break; }
            if (cp >= 512 || inv[cp] < 0) ok = 0;
            else out[n++] = (char)inv[cp];
        }
        if (!ok || !n) { free(out); continue; }
        v->bytes[id] = out;
        v->lens[id] = (uint32_t)n;
    }
    if (v->eos < 0) /* any special token stands for the end */
        for (int32_t id = 0; id < v->n && v->eos < 0; id++)
            if (m3_tok_is_special(t, id)) v->eos = id;
    if (tok_out) *tok_out = t;
    else m3_tok_free(t);
    return 0;
}

#endif
