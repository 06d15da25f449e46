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
    static char doc[65536];
    size_t len = 0;
    int ended = fz_walk(m, data, size, doc, sizeof doc, &len);
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
