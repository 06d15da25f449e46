/* A small byte-level vocabulary for the grammar fuzz targets: the 256 single bytes, JSON-ish
 * multi-byte tokens (some crossing structure: "\":", "},{", a split UTF-8 character), and an
 * end id. Header-only. */
#ifndef M3_FUZZ_GRAMMAR_VOCAB_H
#define M3_FUZZ_GRAMMAR_VOCAB_H

#include <stdint.h>
#include <stdlib.h>
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

/* One random walk of matcher m, seeded by the input: uniform over the mask for 12 tokens, then the
 * byte that brings the end nearest; at every step the cached mask equals the cache-free one, and
 * the walk is never stuck (abort() otherwise: a finding). The text goes to doc (cap bytes, *len);
 * returns whether the walk ended (the end id accepted). */
static inline int fz_walk(m3_matcher *m, const uint8_t *data, size_t size, char *doc, size_t cap, size_t *len) {
    uint64_t rng = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++) rng = (rng ^ data[i]) * 1099511628211ull;
    uint32_t mask[(FZ_V + 31) / 32], slow[(FZ_V + 31) / 32];
    *len = 0;
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
                if ((mask[i >> 5] >> (i & 31)) & 1 && k-- == 0) {
                    t = i;
                    break;
                }
        } else {
            if (step == 12 && m3_matcher_min_bytes_to_end(m) > 2000) return 0; /* a long minimum: not walked */
            int64_t best = INT64_MAX;
            for (int b = 0; b < 256; b++) {
                if (!((mask[b >> 5] >> (b & 31)) & 1)) continue;
                if (m3_matcher_accept(m, b)) abort();
                int64_t d = m3_matcher_min_bytes_to_end(m);
                m3_matcher_rollback(m, 1);
                if (d < best) {
                    best = d;
                    t = b;
                }
            }
            if (t < 0) abort();
        }
        if (m3_matcher_accept(m, t)) abort();
        if (t == FZ_EOS) return 1;
        uint32_t L;
        const char *b = fz_tok(t, &L);
        if (*len + L >= cap) return 0;
        memcpy(doc + *len, b, L);
        *len += L;
    }
    return 0;
}

#endif
