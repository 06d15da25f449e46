/* Loading tokenizer.json (+ tokenizer_config.json) into an immutable m3_tok, and queries. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer/tok_internal.h"

/* ---------- maps */

static uint32_t *str_slot(const m3_tok *t, const char *s, size_t n) {
    size_t i = tok_hash(s, n) & t->vocab.mask;
    for (;; i = (i + 1) & t->vocab.mask) {
        uint32_t v = t->vocab.slots[i];
        if (!v) return &t->vocab.slots[i];
        uint32_t id = v - 1;
        if (t->len[id] == n && memcmp(t->strs.p + t->off[id], s, n) == 0) return &t->vocab.slots[i];
    }
}

int32_t tok_vocab_get(const m3_tok *t, const char *s, size_t n) {
    if (!t->vocab.slots) return -1;
    uint32_t v = *str_slot(t, s, n);
    return v ? (int32_t)(v - 1) : -1;
}

static uint64_t *pair_slot(const tok_pairmap *m, uint64_t key) {
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & m->mask;
    return &m->keys[i];
}

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p *= 2;
    return p;
}

/* ---------- small JSON helpers */

static int jbool(json_t *o, const char *k, int def) {
    json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : def;
}
static const char *jstr(json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

/* ---------- vocabulary */

/* Model form of a spelling: byte-level models store raw bytes when every character is in
 * the byte alphabet (what the ByteLevel decoder does too). */
static int model_form(const m3_tok *t, const char *s, size_t n, tok_buf *out) {
    out->n = 0;
    if (!t->byte_level) return tok_buf_put(out, s, n);
    size_t i = 0;
    while (i < n) {
        int l = tok_utf8_step((const uint8_t *)s + i, n - i);
        if (l <= 0) break;
        int b = tok_cp_to_byte(tok_utf8_cp((const uint8_t *)s + i, l));
        if (b < 0) break;
        char c = (char)b;
        if (tok_buf_put(out, &c, 1)) return -1;
        i += (size_t)l;
    }
    if (i == n) return 0;
    out->n = 0;
    return tok_buf_put(out, s, n);
}

/* Keeps the vocab map at most half full (added tokens from tokenizer_config.json can come
 * after it was sized). */
static int vocab_reserve(m3_tok *t, m3_err *err) {
    if (t->vocab.slots && (size_t)t->n_ids * 2 <= t->vocab.mask + 1) return 0;
    size_t cap = pow2_at_least(2 * (size_t)t->n_ids + 16);
    uint32_t *old = t->vocab.slots;
    size_t old_cap = old ? t->vocab.mask + 1 : 0;
    if (!(t->vocab.slots = calloc(cap, 4))) { t->vocab.slots = old; return m3_errf(err, "out of memory"); }
    t->vocab.mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i]) {
            uint32_t id = old[i] - 1;
            *str_slot(t, t->strs.p + t->off[id], t->len[id]) = old[i];
        }
    free(old);
    return 0;
}

static int grow_ids(m3_tok *t, int32_t n_ids, m3_err *err) {
    if (n_ids <= t->n_ids) return 0;
    uint32_t *off = realloc(t->off, (size_t)n_ids * 4), *len;
    if (!off) return m3_errf(err, "out of memory");
    t->off = off;
    if (!(len = realloc(t->len, (size_t)n_ids * 4))) return m3_errf(err, "out of memory");
    t->len = len;
    char **sp = realloc(t->spelling, (size_t)n_ids * sizeof *sp);
    if (!sp) return m3_errf(err, "out of memory");
    t->spelling = sp;
    for (int32_t i = t->n_ids; i < n_ids; i++) { t->len[i] = UINT32_MAX; t->off[i] = 0; sp[i] = NULL; }
    t->n_ids = n_ids;
    return 0;
}

/* Records id's spelling and model form; adds it to the lookup map unless taken. */
static int set_token(m3_tok *t, int32_t id, const char *s, size_t n, tok_buf *tmp, m3_err *err) {
    if (t->spelling[id]) return 0; /* vocab entry first; an added token with the same id keeps it */
    if (!(t->spelling[id] = dupn(s, n)) || model_form(t, s, n, tmp)) return m3_errf(err, "out of memory");
    t->off[id] = (uint32_t)t->strs.n;
    t->len[id] = (uint32_t)tmp->n;
    if (tok_buf_put(&t->strs, tmp->p, tmp->n)) return m3_errf(err, "out of memory");
    if (vocab_reserve(t, err)) return -1;
    uint32_t *slot = str_slot(t, t->strs.p + t->off[id], tmp->n);
    if (!*slot) *slot = (uint32_t)id + 1;
    return 0;
}

static int load_vocab(m3_tok *t, json_t *vocab, json_t *added, m3_err *err) {
    if (!json_is_object(vocab)) return m3_errf(err, "model.vocab: expected an object");
    int64_t max_id = -1;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_ID)
            return m3_errf(err, "model.vocab[\"%.40s\"]: expected an id in [0, %d), found %s", k, TOK_MAX_ID,
                           json_is_integer(v) ? "out of range" : "a non-integer");
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (id > max_id && id < TOK_MAX_ID) max_id = id;
    }
    if (grow_ids(t, (int32_t)(max_id + 1), err)) return -1;
    size_t cap = pow2_at_least(2 * ((size_t)max_id + 1 + json_array_size(added)));
    if (!(t->vocab.slots = calloc(cap, 4))) return m3_errf(err, "out of memory");
    t->vocab.mask = cap - 1;
    tok_buf tmp = {0};
    int rc = 0;
    void *it = json_object_iter(vocab);
    for (; it && rc == 0; it = json_object_iter_next(vocab, it)) {
        const char *key = json_object_iter_key(it);
        size_t klen = json_object_iter_key_len(it);
        int32_t id = (int32_t)json_integer_value(json_object_iter_value(it));
        if (t->spelling[id]) rc = m3_errf(err, "model.vocab: id %d appears twice", id);
        else rc = set_token(t, id, key, klen, &tmp, err);
    }
    free(tmp.p);
    return rc;
}

static int split_merge(json_t *m, size_t rank, const char **a, size_t *al, const char **b, size_t *bl,
                       m3_err *err) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        size_t n = json_string_length(m);
        if (!sp || strchr(sp + 1, ' ') || sp == s || (size_t)(sp - s) + 1 == n)
            return m3_errf(err, "model.merges[%zu]: expected \"left right\", found \"%.60s\"", rank, s);
        *a = s; *al = (size_t)(sp - s); *b = sp + 1; *bl = n - *al - 1;
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0)); *al = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1)); *bl = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return m3_errf(err, "model.merges[%zu]: expected a \"a b\" string or an [\"a\", \"b\"] pair", rank);
}

static int32_t form_id(const m3_tok *t, const char *s, size_t n, tok_buf *tmp) {
    if (model_form(t, s, n, tmp)) return -2;
    return tok_vocab_get(t, tmp->p, tmp->n);
}

static int load_merges(m3_tok *t, json_t *merges, m3_err *err) {
    if (!merges) return 0;
    if (!json_is_array(merges)) return m3_errf(err, "model.merges: expected an array");
    size_t cap = pow2_at_least(2 * json_array_size(merges));
    t->merges.keys = calloc(cap, 8);
    t->merges.vals = calloc(cap, 8);
    if (!t->merges.keys || !t->merges.vals) return m3_errf(err, "out of memory");
    t->merges.mask = cap - 1;
    tok_buf tmp = {0}, cat = {0};
    int rc = 0;
    for (size_t r = 0; r < json_array_size(merges) && rc == 0; r++) {
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if ((rc = split_merge(json_array_get(merges, r), r, &a, &al, &b, &bl, err))) break;
        int32_t ia = form_id(t, a, al, &tmp), ib = form_id(t, b, bl, &tmp);
        cat.n = 0;
        if (tok_buf_put(&cat, a, al) || tok_buf_put(&cat, b, bl)) { rc = m3_errf(err, "out of memory"); break; }
        int32_t im = form_id(t, cat.p, cat.n, &tmp);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = m3_errf(err, "model.merges[%zu]: \"%.40s\" + \"%.40s\": %s is not in the vocabulary", r,
                         a, b, ia < 0 ? "the left token" : ib < 0 ? "the right token" : "the merged token");
            break;
        }
        uint64_t key = ((uint64_t)ia << 32 | (uint32_t)ib) + 1;
        uint64_t *slot = pair_slot(&t->merges, key);
        if (*slot) continue; /* a repeated merge keeps its first (best) rank */
        *slot = key;
        t->merges.vals[slot - t->merges.keys] = (uint64_t)r << 32 | (uint32_t)im;
    }
    free(tmp.p);
    free(cat.p);
    return rc;
}

static int load_model(m3_tok *t, json_t *model, json_t *added, m3_err *err) {
    if (!json_is_object(model)) return m3_errf(err, "model: expected an object");
    const char *type = jstr(model, "type");
    if (type && strcmp(type, "BPE") != 0)
        return m3_errf(err, "model.type: only BPE is supported, found \"%s\"", type);
    json_t *drop = json_object_get(model, "dropout");
    if (json_is_number(drop) && json_number_value(drop) > 0)
        return m3_errf(err, "model.dropout: BPE dropout is not supported (found %g)", json_number_value(drop));
    const char *pre = jstr(model, "continuing_subword_prefix"), *suf = jstr(model, "end_of_word_suffix");
    if ((pre && *pre) || (suf && *suf))
        return m3_errf(err, "model: continuing_subword_prefix / end_of_word_suffix are not supported");
    t->ignore_merges = jbool(model, "ignore_merges", 0);
    t->byte_fallback = jbool(model, "byte_fallback", 0);
    t->fuse_unk = jbool(model, "fuse_unk", 0);
    if (load_vocab(t, json_object_get(model, "vocab"), added, err)) return -1;
    if (load_merges(t, json_object_get(model, "merges"), err)) return -1;
    t->unk_id = -1;
    const char *unk = jstr(model, "unk_token");
    if (unk && (t->unk_id = m3_tok_token_to_id(t, unk)) < 0)
        return m3_errf(err, "model.unk_token \"%.60s\" is not in the vocabulary", unk);
    tok_buf tmp = {0};
    for (int b = 0; b < 256; b++) {
        char s[8];
        if (t->byte_level) { s[0] = (char)b; t->byte_id[b] = tok_vocab_get(t, s, 1); }
        else { snprintf(s, sizeof s, "<0x%02X>", b); t->byte_id[b] = form_id(t, s, 6, &tmp); }
    }
    free(tmp.p);
    return 0;
}

/* ---------- normalizers */

static int load_norm(m3_tok *t, json_t *n, const char *where, m3_err *err) {
    if (json_is_null(n) || !n) return 0;
    const char *type = jstr(n, "type");
    if (!type) return m3_errf(err, "%s: missing \"type\"", where);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) return m3_errf(err, "%s.normalizers: expected an array", where);
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) if (load_norm(t, v, where, err)) return -1;
        return 0;
    }
    tok_norm nm = {0};
    if (!strcmp(type, "NFC")) nm.kind = NORM_NFC;
    else if (!strcmp(type, "NFD")) nm.kind = NORM_NFD;
    else if (!strcmp(type, "NFKC")) nm.kind = NORM_NFKC;
    else if (!strcmp(type, "NFKD")) nm.kind = NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) nm.kind = NORM_LOWER;
    else if (!strcmp(type, "Prepend")) {
        const char *p = jstr(n, "prepend");
        if (!p) return m3_errf(err, "%s: Prepend without a \"prepend\" string", where);
        nm.kind = NORM_PREPEND;
        nm.a = strdup(p);
    } else if (!strcmp(type, "Replace")) {
        json_t *pat = json_object_get(n, "pattern");
        const char *s = jstr(pat, "String"), *c = jstr(n, "content");
        if (!s || !*s || !c)
            return m3_errf(err, "%s: Replace is supported with a non-empty {\"String\": ...} pattern and a content only", where);
        nm.kind = NORM_REPLACE;
        nm.a = strdup(s);
        nm.b = strdup(c);
    } else return m3_errf(err, "%s: unsupported normalizer \"%s\"", where, type);
    tok_norm *p = realloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *p);
    if (!p) return m3_errf(err, "out of memory");
    t->norms = p;
    t->norms[t->n_norms++] = nm;
    return 0;
}

/* ---------- pre-tokenizers */

#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static pcre2_code *compile_re(const char *pat, size_t n, int literal, const char *where, m3_err *err) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, n, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        m3_errf(err, "%s: regex /%.80s/ does not compile at offset %zu: %s", where, pat, (size_t)eo, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is absent */
    return re;
}

static int behavior_of(const char *s) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (s && !strcmp(s, names[i])) return i;
    return -1;
}

static int add_pretok(m3_tok *t, tok_pretok p, m3_err *err) {
    tok_pretok *q = realloc(t->pretoks, (size_t)(t->n_pretoks + 1) * sizeof *q);
    if (!q) { if (p.re) pcre2_code_free(p.re); return m3_errf(err, "out of memory"); }
    t->pretoks = q;
    t->pretoks[t->n_pretoks++] = p;
    return 0;
}

static int load_split(m3_tok *t, json_t *n, const char *where, m3_err *err) {
    json_t *pat = json_object_get(n, "pattern");
    json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    tok_pretok p = {.kind = PT_SPLIT, .invert = jbool(n, "invert", 0)};
    if ((p.behavior = behavior_of(jstr(n, "behavior"))) < 0)
        return m3_errf(err, "%s: Split.behavior \"%s\" is not one of Removed, Isolated, MergedWithPrevious, "
                       "MergedWithNext, Contiguous", where, jstr(n, "behavior") ? jstr(n, "behavior") : "(missing)");
    json_t *s = json_is_string(rx) ? rx : lit;
    if (!json_is_string(s)) return m3_errf(err, "%s: Split.pattern: expected {\"Regex\": ...} or {\"String\": ...}", where);
    if (json_string_length(s) == 0) return 0; /* an empty pattern matches nothing: no split */
    if (!(p.re = compile_re(json_string_value(s), json_string_length(s), s == lit, where, err))) return -1;
    return add_pretok(t, p, err);
}

static int load_pretok(m3_tok *t, json_t *n, const char *where, m3_err *err) {
    if (json_is_null(n) || !n) return 0;
    const char *type = jstr(n, "type");
    if (!type) return m3_errf(err, "%s: missing \"type\"", where);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "pretokenizers");
        if (!json_is_array(list)) return m3_errf(err, "%s.pretokenizers: expected an array", where);
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) if (load_pretok(t, v, where, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "Split")) return load_split(t, n, where, err);
    tok_pretok p = {0};
    if (!strcmp(type, "ByteLevel")) {
        p.kind = PT_BYTELEVEL;
        p.add_prefix_space = jbool(n, "add_prefix_space", 1);
        p.behavior = SB_ISOLATED;
        if (jbool(n, "use_regex", 1) && !(p.re = compile_re(GPT2_REGEX, PCRE2_ZERO_TERMINATED, 0, where, err))) return -1;
        t->byte_level = 1;
    } else if (!strcmp(type, "Digits")) {
        p.kind = PT_DIGITS;
        p.individual = jbool(n, "individual_digits", 0);
    } else if (!strcmp(type, "Whitespace")) {
        p.kind = PT_SPLIT; /* words and punctuation runs kept, the rest removed */
        p.behavior = SB_REMOVED;
        p.invert = 1;
        if (!(p.re = compile_re("\\w+|[^\\w\\s]+", PCRE2_ZERO_TERMINATED, 0, where, err))) return -1;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p.kind = PT_SPLIT;
        p.behavior = SB_REMOVED;
        if (!(p.re = compile_re("\\s", PCRE2_ZERO_TERMINATED, 0, where, err))) return -1;
    } else return m3_errf(err, "%s: unsupported pre-tokenizer \"%s\"", where, type);
    return add_pretok(t, p, err);
}

/* ---------- added tokens */

static int add_added(m3_tok *t, json_t *a, const char *where, m3_err *err) {
    json_t *idv = json_object_get(a, "id");
    json_t *cv = json_object_get(a, "content");
    if (!json_is_integer(idv) || json_integer_value(idv) < 0 || json_integer_value(idv) >= TOK_MAX_ID ||
        !json_is_string(cv) || json_string_length(cv) == 0)
        return m3_errf(err, "%s: an entry needs an integer \"id\" >= 0 and a non-empty \"content\"", where);
    int32_t id = (int32_t)json_integer_value(idv);
    if (id < t->n_ids && t->added_of && t->added_of[id] >= 0) return 0; /* already there */
    if (grow_ids(t, id + 1, err)) return -1;
    tok_added *p = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *p);
    if (!p) return m3_errf(err, "out of memory");
    t->added = p;
    tok_added *x = &t->added[t->n_added++];
    *x = (tok_added){.id = id, .special = jbool(a, "special", 0), .lstrip = jbool(a, "lstrip", 0),
                     .rstrip = jbool(a, "rstrip", 0), .single_word = jbool(a, "single_word", 0),
                     .normalized = jbool(a, "normalized", !jbool(a, "special", 0))};
    if (!(x->content = dupn(json_string_value(cv), json_string_length(cv)))) return m3_errf(err, "out of memory");
    tok_buf tmp = {0};
    int rc = set_token(t, id, x->content, json_string_length(cv), &tmp, err);
    free(tmp.p);
    return rc;
}

/* Builds per-id tables and the two tries once every added token is known. */
static int index_added(m3_tok *t, m3_err *err) {
    t->is_special = calloc((size_t)t->n_ids + 1, 1);
    t->added_of = malloc(((size_t)t->n_ids + 1) * 4);
    if (!t->is_special || !t->added_of) return m3_errf(err, "out of memory");
    for (int32_t i = 0; i < t->n_ids; i++) t->added_of[i] = -1;
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        t->added_of[a->id] = i;
        t->is_special[a->id] = (uint8_t)a->special;
        tok_buf nb = {0};
        if (a->normalized) {
            if (tok_normalize(t, a->content, strlen(a->content), &nb, err)) return m3_err_prefix(err, "added token \"%.40s\"", a->content);
            a->match = nb.p ? nb.p : strdup("");
            a->match_len = nb.n;
        } else {
            a->match = strdup(a->content);
            a->match_len = strlen(a->content);
        }
        if (!a->match) return m3_errf(err, "out of memory");
        if (tok_trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, a->match, a->match_len, i))
            return m3_errf(err, "out of memory");
    }
    return 0;
}

static int load_added(m3_tok *t, json_t *added, json_t *cfg, m3_err *err) {
    if (added && !json_is_null(added) && !json_is_array(added)) return m3_errf(err, "added_tokens: expected an array");
    size_t i;
    json_t *v;
    json_array_foreach(added, i, v) if (add_added(t, v, "added_tokens", err)) return -1;
    json_t *dec = json_object_get(cfg, "added_tokens_decoder");
    const char *k;
    json_object_foreach(dec, k, v) {
        char *end;
        long id = strtol(k, &end, 10);
        if (*end || id < 0 || id >= TOK_MAX_ID || !json_is_object(v)) continue;
        json_t *copy = json_deep_copy(v);
        if (!copy) return m3_errf(err, "out of memory");
        json_object_set_new(copy, "id", json_integer(id));
        int rc = add_added(t, copy, "tokenizer_config.json added_tokens_decoder", err);
        json_decref(copy);
        if (rc) return -1;
    }
    return 0;
}

/* ---------- decoders: per-token pieces */

enum { DEC_BYTELEVEL = 1, DEC_BYTEFALLBACK = 2, DEC_FUSE = 4 };
typedef struct {
    int flags;
    char *rep_from[4], *rep_to[4];
    int n_rep;
} dec_cfg;

static int load_decoder(m3_tok *t, json_t *d, dec_cfg *c, m3_err *err) {
    if (!d || json_is_null(d)) return 0;
    const char *type = jstr(d, "type");
    if (!type) return m3_errf(err, "decoder: missing \"type\"");
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(d, "decoders"), i, v) if (load_decoder(t, v, c, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) c->flags |= DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) c->flags |= DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) c->flags |= DEC_FUSE;
    else if (!strcmp(type, "Replace") || !strcmp(type, "Metaspace")) {
        int meta = type[0] == 'M';
        const char *from = meta ? jstr(d, "replacement") : jstr(json_object_get(d, "pattern"), "String");
        const char *to = meta ? " " : jstr(d, "content");
        if (!from || !*from || !to || c->n_rep == 4)
            return m3_errf(err, "decoder: %s is supported with a literal string pattern only", type);
        c->rep_from[c->n_rep] = strdup(from);
        c->rep_to[c->n_rep++] = strdup(to);
        const char *scheme = jstr(d, "prepend_scheme");
        if (meta && (scheme ? strcmp(scheme, "never") != 0 : jbool(d, "add_prefix_space", 1)))
            t->strip_char[0] = ' ', t->strip_char_len = 1, t->strip_start = 1;
    } else if (!strcmp(type, "Strip")) {
        const char *content = jstr(d, "content");
        size_t cl = content ? strlen(content) : 0;
        if (!content || cl == 0 || cl >= sizeof t->strip_char)
            return m3_errf(err, "decoder: Strip needs a one-character \"content\"");
        memcpy(t->strip_char, content, cl + 1);
        t->strip_char_len = (int)cl;
        t->strip_start = (int)json_integer_value(json_object_get(d, "start"));
        t->strip_end = (int)json_integer_value(json_object_get(d, "stop"));
        if (t->strip_start < 0 || t->strip_end < 0 || t->strip_start > 64 || t->strip_end > 64)
            return m3_errf(err, "decoder: Strip start/stop out of range");
    } else return m3_errf(err, "decoder: unsupported decoder \"%s\"", type);
    return 0;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static int piece_of(const dec_cfg *c, const char *s, tok_buf *out, tok_buf *tmp) {
    out->n = 0;
    size_t n = strlen(s);
    if ((c->flags & DEC_BYTEFALLBACK) && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexval(s[3]) >= 0 &&
        hexval(s[4]) >= 0) {
        char b = (char)(hexval(s[3]) * 16 + hexval(s[4]));
        return tok_buf_put(out, &b, 1);
    }
    if (tok_buf_put(out, s, n)) return -1;
    for (int r = 0; r < c->n_rep; r++) { /* literal replace, left to right */
        size_t fl = strlen(c->rep_from[r]), tl = strlen(c->rep_to[r]);
        tmp->n = 0;
        for (size_t i = 0; i < out->n;) {
            if (i + fl <= out->n && !memcmp(out->p + i, c->rep_from[r], fl)) {
                if (tok_buf_put(tmp, c->rep_to[r], tl)) return -1;
                i += fl;
            } else if (tok_buf_put(tmp, out->p + i++, 1)) return -1;
        }
        out->n = 0;
        if (tok_buf_put(out, tmp->p, tmp->n)) return -1;
    }
    if (c->flags & DEC_BYTELEVEL) { /* every char in the byte alphabet, or the token as is */
        tmp->n = 0;
        size_t i = 0;
        while (i < out->n) {
            int l = tok_utf8_step((const uint8_t *)out->p + i, out->n - i);
            int b = l > 0 ? tok_cp_to_byte(tok_utf8_cp((const uint8_t *)out->p + i, l)) : -1;
            if (b < 0) break;
            char ch = (char)b;
            if (tok_buf_put(tmp, &ch, 1)) return -1;
            i += (size_t)l;
        }
        if (i == out->n) { out->n = 0; if (tok_buf_put(out, tmp->p, tmp->n)) return -1; }
    }
    return 0;
}

static int build_pieces(m3_tok *t, json_t *decoder, m3_err *err) {
    dec_cfg c = {0};
    int rc = load_decoder(t, decoder, &c, err);
    t->doff = malloc(((size_t)t->n_ids + 1) * 4);
    t->dlen = malloc(((size_t)t->n_ids + 1) * 4);
    tok_buf piece = {0}, tmp = {0};
    if (rc == 0 && (!t->doff || !t->dlen)) rc = m3_errf(err, "out of memory");
    for (int32_t id = 0; rc == 0 && id < t->n_ids; id++) {
        t->doff[id] = (uint32_t)t->dstrs.n;
        t->dlen[id] = 0;
        if (!t->spelling[id]) continue;
        if (piece_of(&c, t->spelling[id], &piece, &tmp) || tok_buf_put(&t->dstrs, piece.p, piece.n))
            rc = m3_errf(err, "out of memory");
        t->dlen[id] = (uint32_t)piece.n;
    }
    for (int r = 0; r < c.n_rep; r++) { free(c.rep_from[r]); free(c.rep_to[r]); }
    free(piece.p);
    free(tmp.p);
    return rc;
}

/* ---------- tokenizer_config.json */

static int32_t cfg_token(const m3_tok *t, json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    const char *s = json_is_string(v) ? json_string_value(v) : jstr(v, "content");
    return s ? m3_tok_token_to_id(t, s) : -1;
}

/* ---------- load */

static int load_all(m3_tok *t, json_t *root, json_t *cfg, m3_err *err) {
    if (!json_is_object(root)) return m3_errf(err, "expected a JSON object at the top level");
    json_t *added = json_object_get(root, "added_tokens");
    if (load_norm(t, json_object_get(root, "normalizer"), "normalizer", err)) return -1;
    if (load_pretok(t, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", err)) return -1;
    json_t *model = json_object_get(root, "model");
    if (!model) return m3_errf(err, "missing \"model\"");
    if (load_model(t, model, json_is_array(added) ? added : NULL, err)) return -1;
    if (load_added(t, added, cfg, err)) return -1;
    if (index_added(t, err)) return -1;
    if (build_pieces(t, json_object_get(root, "decoder"), err)) return -1;
    t->bos = cfg_token(t, cfg, "bos_token");
    t->eos = cfg_token(t, cfg, "eos_token");
    t->pad = cfg_token(t, cfg, "pad_token");
    t->unk_cfg = cfg_token(t, cfg, "unk_token");
    if (t->unk_cfg < 0) t->unk_cfg = t->unk_id;
    return 0;
}

/* tokenizer_config.json files write model_max_length as 1e30 in integer form, which
 * jansson refuses ("too big integer"): copies the text with ".0" after integer literals of
 * more than 18 digits outside strings, so they load as reals. */
static char *widen_big_ints(const char *s, size_t n, size_t *out_n) {
    tok_buf b = {0};
    int in_str = 0;
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (in_str) {
            size_t k = c == '\\' && i + 1 < n ? 2 : 1;
            if (c == '"') in_str = 0;
            if (tok_buf_put(&b, s + i, k)) goto oom;
            i += k;
            continue;
        }
        if (c == '"') in_str = 1;
        size_t j = i;
        while (j < n && s[j] >= '0' && s[j] <= '9') j++;
        if (j == i) j = i + 1;
        if (tok_buf_put(&b, s + i, j - i)) goto oom;
        if (j - i > 18 && (j >= n || (s[j] != '.' && s[j] != 'e' && s[j] != 'E')) && tok_buf_put(&b, ".0", 2)) goto oom;
        i = j;
    }
    *out_n = b.n;
    return b.p ? b.p : calloc(1, 1);
oom:
    free(b.p);
    return NULL;
}

m3_tok *m3_tok_load_mem(const char *json, size_t len, const char *config_json, size_t config_len,
                        const char *what, m3_err *err) {
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    if (!root) {
        m3_errf(err, "%s: invalid JSON at line %d column %d: %s", what, je.line, je.column, je.text);
        return NULL;
    }
    json_t *cfg = NULL;
    size_t wide_n = 0;
    char *wide = config_json ? widen_big_ints(config_json, config_len, &wide_n) : NULL;
    if (config_json && !wide) {
        json_decref(root);
        m3_errf(err, "out of memory");
        return NULL;
    }
    if (wide) cfg = json_loadb(wide, wide_n, JSON_ALLOW_NUL, &je);
    free(wide);
    if (config_json && !cfg) {
        m3_errf(err, "tokenizer_config.json beside %s: invalid JSON at line %d column %d: %s", what, je.line,
                je.column, je.text);
        json_decref(root);
        return NULL;
    }
    m3_tok *t = calloc(1, sizeof *t);
    int rc = t ? load_all(t, root, cfg, err) : m3_errf(err, "out of memory");
    json_decref(root);
    json_decref(cfg);
    if (rc) {
        m3_err_prefix(err, "%s", what);
        m3_tok_free(t);
        return NULL;
    }
    return t;
}

m3_tok *m3_tok_load_json(const char *json, size_t len, m3_err *err) {
    return m3_tok_load_mem(json, len, NULL, 0, "tokenizer.json", err);
}

static char *read_file(const char *path, size_t *n, m3_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) { m3_errf(err, "%s: %s", path, strerror(errno)); return NULL; }
    tok_buf b = {0};
    char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (tok_buf_put(&b, chunk, k)) { fclose(f); free(b.p); m3_errf(err, "%s: out of memory", path); return NULL; }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(b.p); m3_errf(err, "%s: read error", path); return NULL; }
    *n = b.n;
    return b.p ? b.p : calloc(1, 1);
}

m3_tok *m3_tok_load(const char *path, m3_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) { m3_errf(err, "%s: %s", path, strerror(errno)); return NULL; }
    size_t pl = strlen(path);
    char *file = malloc(pl + 32), *cfgp = malloc(pl + 32);
    if (!file || !cfgp) { free(file); free(cfgp); m3_errf(err, "out of memory"); return NULL; }
    if (S_ISDIR(st.st_mode)) {
        snprintf(file, pl + 32, "%s/tokenizer.json", path);
        snprintf(cfgp, pl + 32, "%s/tokenizer_config.json", path);
    } else {
        memcpy(file, path, pl + 1);
        const char *slash = strrchr(path, '/');
        int dl = slash ? (int)(slash - path + 1) : 0;
        snprintf(cfgp, pl + 32, "%.*stokenizer_config.json", dl, path);
    }
    size_t n = 0, cn = 0;
    char *json = read_file(file, &n, err), *cfg = NULL;
    m3_tok *t = NULL;
    if (json) {
        if (access(cfgp, R_OK) == 0) cfg = read_file(cfgp, &cn, err);
        if (cfg || access(cfgp, R_OK) != 0) t = m3_tok_load_mem(json, n, cfg, cn, file, err);
    }
    free(json);
    free(cfg);
    free(file);
    free(cfgp);
    return t;
}

void m3_tok_free(m3_tok *t) {
    if (!t) return;
    for (int32_t i = 0; t->spelling && i < t->n_ids; i++) free(t->spelling[i]);
    free(t->spelling);
    free(t->off);
    free(t->len);
    free(t->strs.p);
    free(t->vocab.slots);
    free(t->merges.keys);
    free(t->merges.vals);
    for (int i = 0; i < t->n_norms; i++) { free(t->norms[i].a); free(t->norms[i].b); }
    free(t->norms);
    for (int i = 0; i < t->n_pretoks; i++) if (t->pretoks[i].re) pcre2_code_free(t->pretoks[i].re);
    free(t->pretoks);
    for (int i = 0; i < t->n_added; i++) { free(t->added[i].content); free(t->added[i].match); }
    free(t->added);
    free(t->is_special);
    free(t->added_of);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    free(t->doff);
    free(t->dlen);
    free(t->dstrs.p);
    free(t);
}

/* ---------- queries */

int32_t m3_tok_n_vocab(const m3_tok *t) { return t->n_ids; }

int32_t m3_tok_token_to_id(const m3_tok *t, const char *token) {
    for (int i = 0; i < t->n_added; i++)
        if (!strcmp(t->added[i].content, token)) return t->added[i].id;
    tok_buf tmp = {0};
    int32_t id = form_id(t, token, strlen(token), &tmp);
    free(tmp.p);
    return id < 0 ? -1 : id;
}

const char *m3_tok_id_to_token(const m3_tok *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->spelling[id] : NULL;
}

int m3_tok_is_special(const m3_tok *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->is_special && t->is_special[id];
}

int32_t m3_tok_bos_id(const m3_tok *t) { return t->bos; }
int32_t m3_tok_eos_id(const m3_tok *t) { return t->eos; }
int32_t m3_tok_pad_id(const m3_tok *t) { return t->pad; }
int32_t m3_tok_unk_id(const m3_tok *t) { return t->unk_cfg; }
