/* The tokenizer files m3 make-tiny writes: a tokenizer.json with the MiniMax-M3 chat tokens
 * added, and its tokenizer_config.json. See m3_tok_files_make in tokenizer.h. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* The special tokens of the MiniMax-M3 chat format (spec section 5). Turn markers and the
 * end-of-turn (stop) token are special, so a decoder that skips special tokens drops them;
 * the think tags and the tool-call namespace are plain added tokens, so decoded text keeps
 * them for the reasoning and tool-call parsers (as in MiniMax's own tokenizer.json). */
static const struct { const char *text; int special; } M3_ADDED_TOKENS[] = {
    {"]~!b[", 1}, {"]~b]", 1}, {"[e~[", 1}, {"<mm:think>", 0}, {"</mm:think>", 0}, {"]<]minimax[>[", 0},
};

/* id of token text in tokenizer.json (added tokens, then the model vocabulary); -1 if absent */
static json_int_t tok_json_id(json_t *added, json_t *vocab, const char *text) {
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        const char *t = json_string_value(json_object_get(a, "content"));
        if (t && !strcmp(t, text)) return json_integer_value(json_object_get(a, "id"));
    }
    json_t *v = json_object_get(vocab, text);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

int m3_tok_files_make(const char *path, m3_tok_files *out, m3_err *err) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_int_t max_id = -1, bos = -1, eos = -1;
    int rc = -1;
    memset(out, 0, sizeof *out);
    if (!root && je.line < 1) return m3_errf(err, "--tokenizer %s: %s", path, je.text); /* could not read it */
    if (!root) return m3_errf(err, "%s: bad JSON: %s (line %d)", path, je.text, je.line);
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) { m3_errf(err, "%s: no model.vocab object", path); goto out; }
    if (!added) { added = json_array(); json_object_set_new(root, "added_tokens", added); }
    if (!json_is_array(added)) { m3_errf(err, "%s: added_tokens is not an array", path); goto out; }
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (id > max_id) max_id = id;
    }
    for (size_t t = 0; t < sizeof M3_ADDED_TOKENS / sizeof *M3_ADDED_TOKENS; t++) {
        json_int_t id = tok_json_id(added, vocab, M3_ADDED_TOKENS[t].text);
        if (id < 0) {
            id = ++max_id;
            json_t *a = json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", M3_ADDED_TOKENS[t].text,
                                  "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special",
                                  M3_ADDED_TOKENS[t].special);
            if (!a || json_array_append_new(added, a)) { m3_errf(err, "out of memory"); goto out; }
        }
        if (t == 0) bos = id;
        if (t == 2) eos = id;
    }
    out->tokenizer_json = json_dumps(root, JSON_COMPACT);
    json_t *tcfg = json_pack("{s:s,s:s}", "bos_token", M3_ADDED_TOKENS[0].text, "eos_token", M3_ADDED_TOKENS[2].text);
    out->tokenizer_config_json = tcfg ? json_dumps(tcfg, JSON_INDENT(2)) : NULL;
    json_decref(tcfg);
    if (!out->tokenizer_json || !out->tokenizer_config_json) { m3_errf(err, "out of memory"); goto out; }
    out->max_id = max_id;
    out->bos_id = bos;
    out->eos_id = eos;
    rc = 0;
out:
    if (rc) m3_tok_files_free(out);
    json_decref(root);
    return rc;
}

void m3_tok_files_free(m3_tok_files *f) {
    free(f->tokenizer_json);
    free(f->tokenizer_config_json);
    memset(f, 0, sizeof *f);
}
