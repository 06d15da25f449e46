/* The structured-format builder (grammar.h: m3_grammar_builder): nodes are fragments of one
 * NFA (grammar_int.h), built as they are made; a repetition makes its node a rule and calls it
 * min..max times; m3_gb_finish makes the root rule 0 and builds the grammar. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

struct m3_grammar_builder {
    g_nfa n;
    m3_grammar_opts o;
    m3_err *err;
    int failed;
    g_frag *fr;
    uint8_t *used;
    int nfr, capfr;
    int root_rule;
};

static int gb_fail(m3_grammar_builder *b, const char *msg) {
    if (!b->failed && !b->n.failed) {
        m3_errf(b->err, "grammar builder: %s", msg);
        if (b->err) b->err->oom = m3_err_fmt_oom(msg); /* msg: this file's words */
    }
    b->failed = 1;
    return -1;
}

static int gb_bad(const m3_grammar_builder *b) { return !b || b->failed || b->n.failed; }

static int gb_node(m3_grammar_builder *b, g_frag f) {
    if (gb_bad(b)) return -1;
    if (f.s < 0) return gb_fail(b, "a part matches nothing");
    if (b->nfr == b->capfr) {
        int cap = b->capfr ? 2 * b->capfr : 32;
        g_frag *nf = realloc(b->fr, (size_t)cap * sizeof *nf);
        uint8_t *nu = nf ? realloc(b->used, (size_t)cap) : NULL;
        if (nf) b->fr = nf;
        if (!nu) return gb_fail(b, "out of memory");
        b->used = nu;
        b->capfr = cap;
    }
    b->fr[b->nfr] = f;
    b->used[b->nfr] = 0;
    return b->nfr++;
}

/* takes node x (once) */
static int gb_take(m3_grammar_builder *b, int x, g_frag *f) {
    if (gb_bad(b)) return -1;
    if (x < 0 || x >= b->nfr) return gb_fail(b, "no such node");
    if (b->used[x]) return gb_fail(b, "a node used twice");
    b->used[x] = 1;
    *f = b->fr[x];
    return 0;
}

m3_grammar_builder *m3_grammar_builder_new(const m3_grammar_opts *opts, m3_err *err) {
    m3_grammar_builder *b = calloc(1, sizeof *b);
    if (!b) { m3_errf(err, "grammar builder: out of memory"); return NULL; }
    if (grammar_opts_check(opts, &b->o, err)) { free(b); return NULL; }
    b->err = err;
    b->n.max_states = G_MAX_NFA_STATES;
    b->n.err = err;
    b->root_rule = nfa_rule_new(&b->n);
    if (b->root_rule < 0) { m3_grammar_builder_free(b); return NULL; }
    return b;
}

void m3_grammar_builder_free(m3_grammar_builder *b) {
    if (!b) return;
    nfa_free(&b->n);
    free(b->fr);
    free(b->used);
    free(b);
}

int m3_gb_literal(m3_grammar_builder *b, const char *s, size_t n) {
    if (gb_bad(b)) return -1;
    return gb_node(b, n ? f_lit(&b->n, s, n) : f_eps(&b->n));
}

int m3_gb_schema(m3_grammar_builder *b, const char *schema, size_t len, const char *pointer, const m3_grammar_raw *raw) {
    if (gb_bad(b)) return -1;
    json_t *doc = schema_parse(schema, len, b->err);
    if (!doc) {
        b->failed = 1;
        return -1;
    }
    json_t *v = schema_pointer(doc, pointer);
    int r;
    if (!v) {
        m3_errf(b->err, "json schema: nothing at %s", pointer);
        b->failed = 1;
        r = -1;
    } else if (raw && raw->forbid && strlen(raw->forbid) > 64) {
        r = gb_fail(b, "a raw string's forbidden text is longer than 64 bytes");
    } else {
        g_frag f = schema_fragment(&b->n, doc, v, &b->o, raw, 0, b->err);
        if (f.s < 0) b->failed = 1;
        r = f.s < 0 ? -1 : gb_node(b, f);
    }
    json_decref(doc);
    return r;
}

int m3_gb_json_object(m3_grammar_builder *b) {
    if (gb_bad(b)) return -1;
    g_frag f = schema_fragment(&b->n, NULL, NULL, &b->o, NULL, 1, b->err);
    if (f.s < 0) { b->failed = 1; return -1; }
    return gb_node(b, f);
}

int m3_gb_seq(m3_grammar_builder *b, const int *parts, int n) {
    if (gb_bad(b)) return -1;
    if (n < 1) return gb_fail(b, "an empty sequence");
    g_frag f, x;
    if (gb_take(b, parts[0], &f)) return -1;
    for (int i = 1; i < n; i++) {
        if (gb_take(b, parts[i], &x)) return -1;
        f = f_seq(&b->n, f, x);
    }
    return gb_node(b, f);
}

int m3_gb_choice(m3_grammar_builder *b, const int *alts, int n) {
    if (gb_bad(b)) return -1;
    if (n < 1) return gb_fail(b, "an empty choice");
    g_frag f = f_none(), x;
    for (int i = 0; i < n; i++) {
        if (gb_take(b, alts[i], &x)) return -1;
        f = f_alt(&b->n, f, x);
    }
    return gb_node(b, f);
}

int m3_gb_optional(m3_grammar_builder *b, int x) {
    g_frag f;
    if (gb_take(b, x, &f)) return -1;
    return gb_node(b, f_opt(&b->n, f));
}

int m3_gb_repeat(m3_grammar_builder *b, int x, int min, int max) {
    g_frag f;
    if (gb_take(b, x, &f)) return -1;
    if (min < 0 || (max >= 0 && (max < min || max > 64)) || min > 64) return gb_fail(b, "repetition bounds out of range");
    if (max == 1 && min == 1) return gb_node(b, f);
    if (max == 1) return gb_node(b, f_opt(&b->n, f));
    int r = nfa_rule_new(&b->n);
    if (r < 0) return gb_fail(b, "out of memory");
    nfa_rule_set(&b->n, r, f);
    g_nfa *n = &b->n;
    g_frag out = f_eps(n);
    for (int i = 0; i < min; i++) out = f_seq(n, out, f_call(n, r));
    if (max < 0) out = f_seq(n, out, f_star(n, f_call(n, r)));
    else {
        g_frag t = f_eps(n);
        for (int i = 0; i < max - min; i++) t = f_opt(n, f_seq(n, f_call(n, r), t));
        out = f_seq(n, out, t);
    }
    return gb_node(b, out);
}

m3_grammar *m3_gb_finish(m3_grammar_builder *b, int root, m3_err *err) {
    g_frag f;
    if (gb_bad(b) || gb_take(b, root, &f)) {
        if (err && b && b->err && err != b->err) *err = *b->err;
        return NULL;
    }
    nfa_rule_set(&b->n, b->root_rule, f);
    b->n.err = err;
    m3_grammar *g = grammar_build(&b->n, b->root_rule, b->o.max_depth, b->o.max_states, err);
    b->failed = 1; /* the NFA belongs to the grammar's build now: no more nodes */
    return g;
}

m3_grammar *m3_grammar_from_choices(const char *const *texts, const size_t *lens, int n, const m3_grammar_opts *opts,
                                    m3_err *err) {
    if (n < 1) {
        m3_errf(err, "choices: none given");
        return NULL;
    }
    m3_grammar_builder *b = m3_grammar_builder_new(opts, err);
    if (!b) return NULL;
    b->n.what = "choices";
    int *alt = malloc((size_t)n * sizeof *alt), root = -1;
    if (!alt) gb_fail(b, "out of memory");
    for (int i = 0; i < n && alt; i++) alt[i] = m3_gb_literal(b, texts[i], lens[i]);
    if (alt) root = m3_gb_choice(b, alt, n);
    free(alt);
    m3_grammar *g = m3_gb_finish(b, root, err);
    m3_grammar_builder_free(b);
    return g;
}
