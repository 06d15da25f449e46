/* A byte-level BPE tokenizer.json for tests and fuzz targets: one token per byte (GPT-2's
 * byte -> code point map), no merges, then the MiniMax-M3 chat tokens as special added tokens
 * (ids 256..261), so that the built-in chat template's markup encodes. Header-only. */
#ifndef M3_FUZZ_BYTETOK_H
#define M3_FUZZ_BYTETOK_H

#include <jansson.h>

/* The JSON text (malloc'd), or NULL when out of memory. */
static inline char *m3_test_bytetok_json(void) {
    static const char *special[] = {"]~!b[", "]~b]", "[e~[", "<mm:think>", "</mm:think>", "]<]minimax[>["};
    json_t *vocab = json_object(), *added = json_array();
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)n++;
        char u[4] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); }
        json_object_set_new(vocab, u, json_integer(b));
    }
    for (int i = 0; i < 6; i++)
        json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b}", "id", 256 + i, "content", special[i], "special", 1,
                                               "normalized", 0));
    json_t *t = json_pack("{s:{s:s,s:b,s:b},s:o,s:{s:s},s:{s:s,s:o,s:[]}}", "pre_tokenizer", "type", "ByteLevel",
                          "add_prefix_space", 0, "use_regex", 1, "added_tokens", added, "decoder", "type", "ByteLevel",
                          "model", "type", "BPE", "vocab", vocab, "merges");
    char *s = t ? json_dumps(t, JSON_COMPACT) : NULL;
    json_decref(t);
    return s;
}

#endif
