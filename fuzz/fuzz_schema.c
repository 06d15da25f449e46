/* libFuzzer: JSON Schema text -> m3_grammar (src/grammar/grammar.h). Never a crash or a leak;
 * an accepted schema compiles for a small vocabulary (fuzz/grammar_vocab.h) and a random walk
 * (seeded by the input: uniform over the mask for a few tokens, then the byte nearest the end)
 * keeps the cached mask equal to the cache-free one and ends in a document that parses and
 * satisfies the schema (tests/grammar/jsv.h). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/grammar/jsv.h"
#include "grammar/grammar.h"
#include "grammar_vocab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static m3_grammar_vocab *v;
    if (!v) v = fz_vocab();
    if (size > 4096) return 0;
    m3_err err;
    m3_grammar *g = m3_grammar_from_schema((const char *)data, size, NULL, &err);
    if (!g) return 0;
    m3_grammar_compiled *gc = m3_grammar_n_states(g) <= 20000 ? m3_grammar_compile(g, v, NULL, &err) : NULL;
    m3_matcher *m = gc ? m3_matcher_new(gc, &err) : NULL;
    if (!m) goto done;
    uint64_t rng = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++) rng = (rng ^ data[i]) * 1099511628211ull;
    uint32_t mask[(FZ_V + 31) / 32], slow[(FZ_V + 31) / 32];
    char doc[65536];
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
        json_t *schema = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
        json_error_t je;
        json_t *j = json_loadb(doc, len, JSON_DECODE_ANY, &je);
        if (!j || !schema || !jsv_valid(schema, schema, j, 0)) abort();
        json_decref(j);
        json_decref(schema);
    }
done:
    m3_matcher_free(m);
    m3_grammar_compiled_free(gc);
    m3_grammar_free(g);
    return 0;
}
