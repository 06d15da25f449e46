/* GBNF grammars -> automaton rules (grammar.h: m3_grammar_from_gbnf): llama.cpp's grammar format,
 * which vLLM's guided_grammar takes through xgrammar and llama.cpp's server as "grammar".
 *
 *   root   ::= answer ws "." | "(" root ")"        # a comment
 *   answer ::= [a-z]+ ("," ws [a-z]+){0,3}
 *   ws     ::= [ \t\n]*
 *
 * A rule is `name ::= alternatives`; names are [A-Za-z0-9_-]+, "root" is the whole output.
 * Alternatives are separated by |, a sequence of terms may span lines (a rule ends where the next
 * `name ::=` begins). Terms: "literal" (escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH), a class
 * [a-z] / [^...] of code points (the same escapes, \] and \- too), `.` (any character), a rule's
 * name, ( alternatives ), each optionally repeated by * + ? {m} {m,} {m,n} (counts up to 1000).
 * Rules become rules of the automaton, called by reference (recursion allowed, not left
 * recursion; calls nest up to opts.max_depth). Errors name the line and column. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "grammar/grammar_int.h"

#define EB_MAX_COUNT 1000
#define EB_MAX_DEPTH 128
#define EB_MAX_WORK (1 << 22) /* grammar bytes parsed again for the copies of repetitions, at most */

typedef struct {
    const char *name;
    int len, rule, defined, used_at; /* used_at: 1 + the offset of its first use, 0 none */
} eb_rule;

typedef struct {
    g_nfa *n;
    const char *start, *p, *end;
    eb_rule *r;
    int nr, capr;
    int32_t *tab; /* rule names hashed: open addressing -> rule, -1 empty */
    uint32_t tmask;
    int depth, failed;
    m3_err *err;
    size_t work; /* bytes parsed again (atom_again) */
} eb_t;

static void where(const eb_t *x, const char *at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *q = x->start; q < at && q < x->end; q++) {
        if (*q == '\n') {
            (*line)++;
            *col = 1;
        } else (*col)++;
    }
}

static g_frag eb_err(eb_t *x, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static g_frag eb_err(eb_t *x, const char *at, const char *fmt, ...) {
    if (!x->failed && !x->n->failed) {
        char msg[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        int line, col;
        where(x, at, &line, &col);
        m3_errf(x->err, "grammar: %s (line %d, column %d)", msg, line, col);
        if (x->err) x->err->oom = m3_err_fmt_oom(fmt); /* by the format: msg may quote the grammar */
    }
    x->failed = 1;
    return f_none();
}

static int bad(const eb_t *x) { return x->failed || x->n->failed; }

static int is_name(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; }

/* spaces, tabs, newlines and # comments */
static void ws(eb_t *x) {
    while (x->p < x->end) {
        if (*x->p == ' ' || *x->p == '\t' || *x->p == '\n' || *x->p == '\r') x->p++;
        else if (*x->p == '#')
            while (x->p < x->end && *x->p != '\n') x->p++;
        else break;
    }
}

/* the length of the name at q, 0 when none */
static int name_at(const eb_t *x, const char *q) {
    const char *e = q;
    while (e < x->end && is_name((unsigned char)*e)) e++;
    return (int)(e - q);
}

/* a name at q followed by ::= (the start of the next rule) */
static int rule_start_at(const eb_t *x, const char *q) {
    int L = name_at(x, q);
    if (!L) return 0;
    q += L;
    while (q < x->end && (*q == ' ' || *q == '\t')) q++;
    return x->end - q >= 3 && !memcmp(q, "::=", 3);
}

static uint32_t name_hash(const char *s, int len) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* the rule named name[0..len), made when first seen; -1 on failure */
static int rule_of(eb_t *x, const char *name, int len) {
    uint32_t h = name_hash(name, len);
    for (uint32_t i = h & x->tmask; x->tab; i = (i + 1) & x->tmask) {
        int32_t k = x->tab[i];
        if (k < 0) break;
        if (x->r[k].len == len && !memcmp(x->r[k].name, name, (size_t)len)) return k;
    }
    if (!x->tab || (uint32_t)x->nr * 2 >= x->tmask) { /* grow the table */
        uint32_t size = x->tab ? (x->tmask + 1) * 2 : 64;
        int32_t *t = malloc(size * sizeof *t);
        if (!t) {
            eb_err(x, name, "out of memory");
            return -1;
        }
        memset(t, 0xff, size * sizeof *t);
        for (int k = 0; k < x->nr; k++) {
            uint32_t i = name_hash(x->r[k].name, x->r[k].len) & (size - 1);
            while (t[i] >= 0) i = (i + 1) & (size - 1);
            t[i] = k;
        }
        free(x->tab);
        x->tab = t;
        x->tmask = size - 1;
    }
    if (x->nr == x->capr) {
        int cap = x->capr ? 2 * x->capr : 16;
        eb_rule *r = realloc(x->r, (size_t)cap * sizeof *r);
        if (!r) {
            eb_err(x, name, "out of memory");
            return -1;
        }
        x->r = r;
        x->capr = cap;
    }
    int rule = nfa_rule_new(x->n);
    if (rule < 0) return -1;
    x->r[x->nr] = (eb_rule){name, len, rule, 0, 0};
    uint32_t i = h & x->tmask;
    while (x->tab[i] >= 0) i = (i + 1) & x->tmask;
    x->tab[i] = x->nr;
    return x->nr++;
}


/* one character of a literal or class at x->p (escapes resolved): its code point, or -1 */
static int32_t char_at(eb_t *x, int in_class) {
    const char *at = x->p;
    unsigned char c = (unsigned char)*x->p;
    if (c == '\\') {
        if (x->end - x->p < 2) {
            eb_err(x, at, "\\ at the end");
            return -1;
        }
        char e = x->p[1];
        x->p += 2;
        int k = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (k) {
            uint32_t v = 0;
            for (int i = 0; i < k; i++, x->p++) {
                int h = x->p < x->end ? hexv((unsigned char)*x->p) : -1;
                if (h < 0) {
                    eb_err(x, at, "\\%c needs %d hex digits", e, k);
                    return -1;
                }
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
                eb_err(x, at, "\\%c escape of U+%X: not a character", e, v);
                return -1;
            }
            return (int32_t)v;
        }
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': return (unsigned char)e;
        case '-': case '^':
            if (in_class) return (unsigned char)e;
        }
        eb_err(x, at, "unknown escape \\%c", e >= 0x20 && e < 0x7F ? e : '?');
        return -1;
    }
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    uint32_t v = len > 1 ? c & (0x3F >> (len - 1)) : c;
    for (int i = 1; i < len; i++) {
        if (x->p + i >= x->end || ((unsigned char)x->p[i] & 0xC0) != 0x80) len = 0;
        else v = v << 6 | ((unsigned char)x->p[i] & 0x3F);
    }
    static const uint32_t minv[] = {0, 0, 0x80, 0x800, 0x10000};
    if (!len || v < minv[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        eb_err(x, at, "invalid UTF-8");
        return -1;
    }
    x->p += len;
    return (int32_t)v;
}

static g_frag p_alts(eb_t *x);

/* "literal" after the opening quote */
static g_frag p_literal(eb_t *x, const char *at) {
    g_nfa *n = x->n;
    g_frag f = f_eps(n);
    while (!bad(x)) {
        if (x->p >= x->end || *x->p == '\n') return eb_err(x, at, "a literal without its closing \"");
        if (*x->p == '"') {
            x->p++;
            break;
        }
        int32_t c = char_at(x, 0);
        if (c < 0) break;
        char b[4];
        int L = m3_utf8_put((uint32_t)c, b);
        f = f_seq(n, f, f_lit(n, b, (size_t)L));
    }
    return bad(x) ? f_none() : f;
}

/* [...] after the opening bracket */
static g_frag p_class(eb_t *x, const char *at) {
    int neg = x->p < x->end && *x->p == '^';
    if (neg) x->p++;
    int32_t *lohi = NULL;
    int n = 0, cap = 0;
    while (!bad(x)) {
        if (x->p >= x->end) {
            eb_err(x, at, "a class without its closing ]");
            break;
        }
        if (*x->p == ']') {
            x->p++;
            break;
        }
        int32_t a = char_at(x, 1), b = a;
        if (a < 0) break;
        if (x->end - x->p >= 2 && x->p[0] == '-' && x->p[1] != ']') {
            x->p++;
            b = char_at(x, 1);
            if (b < 0) break;
            if (b < a) {
                eb_err(x, at, "a range out of order in a class");
                break;
            }
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            int32_t *nl = realloc(lohi, (size_t)cap * 2 * sizeof *nl);
            if (!nl) {
                eb_err(x, at, "out of memory");
                break;
            }
            lohi = nl;
        }
        lohi[2 * n] = a;
        lohi[2 * n + 1] = b;
        n++;
    }
    g_frag f = bad(x) ? f_none() : cp_ranges_fragment(x->n, lohi, n, neg);
    free(lohi);
    return f;
}

static g_frag p_atom(eb_t *x) {
    const char *at = x->p;
    if (x->p >= x->end) return eb_err(x, at, "a term expected");
    char c = *x->p;
    if (c == '"') {
        x->p++;
        return p_literal(x, at);
    }
    if (c == '[') {
        x->p++;
        return p_class(x, at);
    }
    if (c == '.') {
        x->p++;
        return cp_ranges_fragment(x->n, NULL, 0, 1);
    }
    if (c == '(') {
        x->p++;
        if (++x->depth > EB_MAX_DEPTH) return eb_err(x, at, "groups nested over %d deep", EB_MAX_DEPTH);
        ws(x);
        g_frag f = p_alts(x);
        x->depth--;
        ws(x);
        if (bad(x)) return f_none();
        if (x->p >= x->end || *x->p != ')') return eb_err(x, at, "a ( without its )");
        x->p++;
        return f;
    }
    int L = name_at(x, x->p);
    if (L) {
        int i = rule_of(x, x->p, L);
        x->p += L;
        if (i < 0) return f_none();
        if (!x->r[i].used_at) x->r[i].used_at = (int)(at - x->start) + 1;
        return f_call(x->n, x->r[i].rule);
    }
    return eb_err(x, at, "unexpected '%c'", c >= 0x20 && c < 0x7F ? c : '?');
}

static g_frag atom_again(eb_t *x, const char *a) {
    const char *save = x->p;
    if ((x->work += (size_t)(save - a)) > EB_MAX_WORK)
        return eb_err(x, a, "too large (its repetitions copy over %d bytes of grammar)", EB_MAX_WORK);
    x->p = a;
    g_frag f = p_atom(x);
    x->p = save;
    return f;
}

typedef struct {
    eb_t *x;
    const char *a;
} eb_again;

static g_frag again_cb(void *ctx) {
    eb_again *g = ctx;
    return atom_again(g->x, g->a);
}

static g_frag p_term(eb_t *x) {
    const char *a = x->p;
    g_frag f = p_atom(x);
    if (bad(x)) return f_none();
    long lo, hi;
    const char *q = x->p;
    char c = x->p < x->end ? *x->p : 0;
    if (c == '*') lo = 0, hi = -1;
    else if (c == '+') lo = 1, hi = -1;
    else if (c == '?') lo = 0, hi = 1;
    else if (c == '{') {
        x->p++;
        lo = grammar_count(&x->p, x->end);
        hi = lo;
        if (lo >= 0 && x->p < x->end && *x->p == ',') {
            x->p++;
            hi = grammar_count(&x->p, x->end);
        }
        if (lo < 0 || x->p >= x->end || *x->p != '}') return eb_err(x, q, "a repetition {m}, {m,} or {m,n} expected");
        if (hi >= 0 && hi < lo) return eb_err(x, q, "a repetition {%ld,%ld} out of order", lo, hi);
        if (lo > EB_MAX_COUNT || hi > EB_MAX_COUNT) return eb_err(x, q, "a repetition count over %d", EB_MAX_COUNT);
    } else return f;
    x->p++;
    eb_again ag = {x, a};
    g_frag out = f_repeat(x->n, f, lo, hi, again_cb, &ag);
    return bad(x) ? f_none() : out;
}

/* terms up to |, ), the end, or the next rule */
static g_frag p_seq(eb_t *x) {
    g_frag f = f_eps(x->n);
    for (;;) {
        ws(x);
        if (bad(x) || x->p >= x->end || *x->p == '|' || *x->p == ')' || rule_start_at(x, x->p)) break;
        f = f_seq(x->n, f, p_term(x));
    }
    return bad(x) ? f_none() : f;
}

static g_frag p_alts(eb_t *x) {
    g_frag all = p_seq(x);
    while (!bad(x) && x->p < x->end && *x->p == '|') {
        x->p++;
        all = f_alt(x->n, all, p_seq(x));
    }
    return bad(x) ? f_none() : all;
}

m3_grammar *m3_grammar_from_gbnf(const char *text, size_t len, const m3_grammar_opts *opts, m3_err *err) {
    m3_grammar_opts o;
    if (grammar_opts_check(opts, &o, err)) return NULL;
    g_nfa n = {0};
    n.max_states = G_MAX_NFA_STATES;
    n.err = err;
    n.what = "grammar";
    eb_t x = {.n = &n, .start = text, .p = text, .end = text + len, .err = err};
    m3_grammar *g = NULL;
    if (rule_of(&x, "root", 4) != 0) goto done; /* rule 0: the output */
    ws(&x);
    if (x.p >= x.end) {
        eb_err(&x, x.p, "an empty grammar (it needs a rule named root)");
        goto done;
    }
    while (!bad(&x) && x.p < x.end) {
        const char *at = x.p;
        int L = name_at(&x, x.p);
        if (!L || !rule_start_at(&x, x.p)) {
            eb_err(&x, at, "a rule (name ::= ...) expected");
            break;
        }
        int i = rule_of(&x, x.p, L);
        if (i < 0) break;
        if (x.r[i].defined) {
            eb_err(&x, at, "the rule \"%.*s\" is defined twice", L, x.p);
            break;
        }
        x.r[i].defined = 1;
        x.p += L;
        ws(&x);
        x.p += 3; /* ::= */
        g_frag f = p_alts(&x);
        if (bad(&x)) break;
        if (x.p < x.end && *x.p == ')') {
            eb_err(&x, x.p, "a ) without its (");
            break;
        }
        nfa_rule_set(&n, x.r[i].rule, f);
        ws(&x);
    }
    for (int i = 0; i < x.nr && !bad(&x); i++)
        if (!x.r[i].defined) {
            if (i == 0) eb_err(&x, x.end, "no rule named root (the whole output)");
            else eb_err(&x, x.start + x.r[i].used_at - 1, "the rule \"%.*s\" is used but not defined", x.r[i].len, x.r[i].name);
        }
    if (!bad(&x)) g = grammar_build(&n, 0, o.max_depth, o.max_states, err);
done:
    free(x.r);
    free(x.tab);
    nfa_free(&n);
    return g;
}
