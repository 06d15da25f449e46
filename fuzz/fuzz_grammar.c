/* libFuzzer: arbitrary token sequences through matchers of a fixed set of schemas
 * (src/grammar/grammar.h, the vocabulary of fuzz/grammar_vocab.h). Input: byte 0 picks the
 * schema, then each byte is a token (b < 0xF0: id b * FZ_V / 0xF0) or a rollback of (b & 3) + 1
 * steps. At every step the cached mask equals the mask of every token tried by accept + rollback
 * and the cache-free trie walk; accepting a token agrees with its mask bit and with feeding its
 * bytes one at a time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar_vocab.h"

static const char *const fz_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":4},\"n\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}},\"required\":[\"name\"]}",
    "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}}}},\"$ref\":\"#/$defs/t\"}",
    "{\"anyOf\":[{\"type\":\"array\",\"items\":{\"type\":\"number\",\"exclusiveMinimum\":0.5},\"maxItems\":3},{\"enum\":[\"x\",null,true]}]}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}},\"additionalProperties\":{\"type\":\"string\"}}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":3},\"minItems\":1,\"maxItems\":40}",
    NULL, /* json_object mode */
};
#define NS (int)(sizeof fz_schemas / sizeof fz_schemas[0])

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static m3_grammar_vocab *v;
    static m3_grammar *g[NS];
    static m3_grammar_compiled *gc[NS];
    m3_err err;
    if (!v) {
        v = fz_vocab();
        m3_grammar_opts o;
        m3_grammar_opts_default(&o);
        o.max_depth = 6; /* reach the depth limit */
        for (int i = 0; i < NS; i++) {
            g[i] = fz_schemas[i] ? m3_grammar_from_schema(fz_schemas[i], strlen(fz_schemas[i]), &o, &err) : m3_grammar_json(&o, &err);
            if (!g[i] || !(gc[i] = m3_grammar_compile(g[i], v, NULL, &err))) abort();
        }
    }
    if (!size) return 0;
    m3_matcher *m = m3_matcher_new(gc[data[0] % NS], &err);
    if (!m) abort();
    uint32_t mask[(FZ_V + 31) / 32], slow[(FZ_V + 31) / 32], brute[(FZ_V + 31) / 32];
    for (size_t i = 1; i < size && i < 512; i++) {
        if (m3_matcher_fill_mask(m, mask) || m3_matcher_fill_mask_slow(m, slow)) abort();
        if (memcmp(mask, slow, sizeof mask)) abort();
        memset(brute, 0, sizeof brute);
        for (int32_t t = 0; t < FZ_V; t++)
            if (m3_matcher_accept(m, t) == 0) {
                brute[t >> 5] |= 1u << (t & 31);
                if (m3_matcher_rollback(m, 1)) abort();
            }
        if (memcmp(mask, brute, sizeof mask)) abort();
        uint8_t b = data[i];
        if (b >= 0xF0) {
            int n = (b & 3) + 1, h = m3_matcher_history(m);
            if (m3_matcher_rollback(m, n) != (n <= h ? 0 : -1)) abort();
            continue;
        }
        int32_t t = (int32_t)b * FZ_V / 0xF0;
        int bit = (mask[t >> 5] >> (t & 31)) & 1;
        if (t != FZ_EOS) { /* the same token as single bytes */
            uint32_t L;
            const char *tb = fz_tok(t, &L);
            int h0 = m3_matcher_history(m), ok = 1;
            uint32_t k = 0;
            for (; k < L && ok; k++) ok = m3_matcher_accept_bytes(m, tb + k, 1) == 0;
            if (ok != bit) abort();
            if (m3_matcher_rollback(m, m3_matcher_history(m) - h0)) abort();
        }
        int r = m3_matcher_accept(m, t);
        if ((r == 0) != bit) abort();
    }
    m3_matcher_free(m);
    return 0;
}
