/* JSON Schema -> NFA (grammar_int.h's builder) -> m3_grammar. Each schema node becomes a
 * fragment built in place (inlined); rules (called, with a stack) only where recursion needs
 * them ($ref cycles, nested values of plain JSON) or where copies would be large (array items
 * repeated up to maxItems, a big definition referenced again). See grammar.h for the subset.
 *
 * Why one file of ~1,080 lines: it is one compiler; the small languages (numbers, strings with
 * lengths, decimal ranges) are built only by its keyword handlers, from the same fragment
 * builder, and would otherwise need an internal API of their own. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

#define MAX_NFA_STATES (1 << 21)
#define MAX_NEST 128
#define INLINE_MAX 16000 /* NFA states: a definition or array item bigger than this is called */

typedef struct {
    json_t *s;
    int rule;
    int size; /* NFA states of its first inline copy, 0 before */
} rmap_t;

typedef struct {
    g_nfa *n;
    json_t *root;
    m3_grammar_opts o;
    m3_err *err;
    int failed;
    char path[1024];
    size_t plen;
    json_t *istk[MAX_NEST];
    int ni;
    rmap_t *rm;
    int nrm, caprm;
    int any_obj, any_arr;
    int nest;
    /* raw strings (m3_grammar_raw): string values at the top level written without quotes or
     * escapes; raw_on while building a top-level value (cleared inside objects and arrays) */
    int raw_on;
    const m3_grammar_raw *raw;
} sc_t;

static g_frag sc_err(sc_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static g_frag sc_err(sc_t *c, const char *fmt, ...) {
    if (!c->failed && !c->n->failed) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        m3_errf(c->err, "json schema: %s at %s", msg, c->plen ? c->path : "/ (the root)");
        if (c->err) c->err->oom = m3_err_fmt_oom(fmt); /* by the format: msg and the path quote the schema */
    }
    c->failed = 1;
    return f_none();
}

static int bad(sc_t *c) { return c->failed || c->n->failed; }

static size_t path_push(sc_t *c, const char *key) {
    size_t old = c->plen;
    if (c->plen + 2 < sizeof c->path) c->path[c->plen++] = '/';
    for (const char *p = key; *p && c->plen + 3 < sizeof c->path; p++) {
        if (*p == '~' || *p == '/') {
            c->path[c->plen++] = '~';
            c->path[c->plen++] = *p == '~' ? '0' : '1';
        } else c->path[c->plen++] = *p;
    }
    c->path[c->plen] = 0;
    return old;
}

static size_t path_push_i(sc_t *c, size_t i) {
    char b[32];
    snprintf(b, sizeof b, "%zu", i);
    return path_push(c, b);
}

static void path_pop(sc_t *c, size_t old) {
    c->plen = old;
    c->path[old] = 0;
}

/* ---- small languages ---- */

/* a path s -> e through k positions, each a set of byte ranges given as pairs "loHI..." */
static void f_path(g_nfa *n, int s, int e, const char *const *pos, int k) {
    int cur = s;
    for (int i = 0; i < k; i++) {
        int nx = i == k - 1 ? e : nfa_state(n);
        for (const char *p = pos[i]; p[0] && p[1]; p += 2) nfa_edge(n, cur, E_BYTE, (uint8_t)p[0], (uint8_t)p[1], nx, -1);
        cur = nx;
    }
}

static g_frag f_set(g_nfa *n, const char *ranges) {
    int s = nfa_state(n), e = nfa_state(n);
    f_path(n, s, e, &ranges, 1);
    return (g_frag){s, e};
}

/* [ \t\n]{0,W} */
static g_frag f_ws(sc_t *c) {
    int W = c->o.max_ws;
    int e = nfa_state(c->n), cur = nfa_state(c->n), s = cur;
    for (int i = 0; i < W; i++) {
        int nx = nfa_state(c->n);
        nfa_edge(c->n, cur, E_EPS, 0, 0, e, -1);
        nfa_edge(c->n, cur, E_BYTE, ' ', ' ', nx, -1);
        nfa_edge(c->n, cur, E_BYTE, '\t', '\n', nx, -1);
        cur = nx;
    }
    nfa_edge(c->n, cur, E_EPS, 0, 0, e, -1);
    return (g_frag){s, e};
}

#define HEX "09afAF"
/* one character of a JSON string: printable ASCII but " and \, valid UTF-8 sequences,
 * escapes (\uXXXX: no lone surrogates). escapes 0: no backslash at all (additional keys). */
static g_frag f_char(g_nfa *n, int escapes) {
    int s = nfa_state(n), e = nfa_state(n);
    static const char ascii[] = "  !!#[]\x7f";
    nfa_edge(n, s, E_BYTE, ' ', '!', e, -1);
    nfa_edge(n, s, E_BYTE, '#', '[', e, -1);
    nfa_edge(n, s, E_BYTE, ']', 0x7f, e, -1);
    (void)ascii;
    int tail[4] = {-1, -1, -1, -1}; /* every non-ASCII character, its last continuation bytes shared */
    utf8_range_paths(n, s, e, 0x80, 0x10FFFF, tail);
    if (escapes) {
        int b = nfa_state(n);
        nfa_edge(n, s, E_BYTE, '\\', '\\', b, -1);
        const char *p1[] = {"\"\"\\\\//bbffnnrrtt"};
        f_path(n, b, e, p1, 1);
        const char *pu[] = {"uu", "09acACefEF", HEX, HEX, HEX};
        f_path(n, b, e, pu, 5);
        const char *pd[] = {"uu", "dDdD", "07", HEX, HEX};
        f_path(n, b, e, pd, 5);
        const char *pp[] = {"uu", "dDdD", "89abAB", HEX, HEX, "\\\\", "uu", "dDdD", "cfCF", HEX, HEX};
        f_path(n, b, e, pp, 11);
    }
    return (g_frag){s, e};
}

/* '"' char{lo,hi} '"' (hi < 0: unbounded) */
static g_frag f_string(sc_t *c, long long lo, long long hi, int escapes) {
    g_nfa *n = c->n;
    g_frag q = f_lit(n, "\"", 1);
    int cur = q.e;
    for (long long i = 0; i < lo && !bad(c); i++) cur = f_seq(n, (g_frag){q.s, cur}, f_char(n, escapes)).e;
    int end = nfa_state(n);
    if (hi < 0) {
        g_frag st = f_star(n, f_char(n, escapes));
        nfa_edge(n, cur, E_EPS, 0, 0, st.s, -1);
        nfa_edge(n, st.e, E_EPS, 0, 0, end, -1);
    } else {
        for (long long i = lo; i < hi && !bad(c); i++) {
            nfa_edge(n, cur, E_EPS, 0, 0, end, -1);
            g_frag ch = f_char(n, escapes);
            nfa_edge(n, cur, E_EPS, 0, 0, ch.s, -1);
            cur = ch.e;
        }
        nfa_edge(n, cur, E_EPS, 0, 0, end, -1);
    }
    g_frag close = f_lit(n, "\"", 1);
    nfa_edge(n, end, E_EPS, 0, 0, close.s, -1);
    if (bad(c)) return f_none();
    return (g_frag){q.s, close.e};
}

/* one character of a raw string: valid UTF-8, no control character but tab and newline */
static g_frag f_raw_char(g_nfa *n) {
    g_frag f = f_char(n, 0); /* printable ASCII but " and \, and UTF-8 sequences */
    nfa_edge(n, f.s, E_BYTE, '"', '"', f.e, -1);
    nfa_edge(n, f.s, E_BYTE, '\\', '\\', f.e, -1);
    nfa_edge(n, f.s, E_BYTE, '\t', '\n', f.e, -1);
    return f;
}

/* Every byte string that never contains forbid[0..L) and, unless edges, neither starts nor ends
 * with a newline: a Knuth-Morris-Pratt automaton over (matched prefix, last byte a newline). */
static g_frag f_raw_restrict(g_nfa *n, const char *forbid, int L, int edges) {
    if (L > 64) L = 64;
    int fail[65];
    fail[0] = fail[1] = 0;
    for (int q = 1, k = 0; q < L; q++) {
        while (k > 0 && forbid[q] != forbid[k]) k = fail[k];
        if (forbid[q] == forbid[k]) k++;
        fail[q + 1] = k;
    }
    int K = L > 0 ? L : 1, st[2 * 64 + 1];
    int s0 = nfa_state(n), e = nfa_state(n);
    for (int i = 0; i < 2 * K; i++) st[i] = nfa_state(n); /* (k, last byte a newline) -> st[2k + nl] */
    nfa_edge(n, s0, E_EPS, 0, 0, e, -1);
    for (int from = -1; from < 2 * K; from++) {
        int k = from < 0 ? 0 : from / 2, src = from < 0 ? s0 : st[from];
        if (from >= 0 && (edges || !(from & 1))) nfa_edge(n, src, E_EPS, 0, 0, e, -1);
        int run_to = -1, run_lo = 0;
        for (int b = 0; b <= 256; b++) {
            int to = -1;
            if (b < 256 && !(from < 0 && !edges && b == '\n')) {
                int q = k;
                if (L > 0) {
                    while (q > 0 && (unsigned char)forbid[q] != b) q = fail[q];
                    if ((unsigned char)forbid[q] == b) q++;
                }
                if (L == 0 || q < L) to = st[2 * (L > 0 ? q : 0) + (b == '\n')];
            }
            if (to != run_to) {
                if (run_to >= 0) nfa_edge(n, src, E_BYTE, run_lo, b - 1, run_to, -1);
                run_to = to;
                run_lo = b;
            }
        }
    }
    return (g_frag){s0, e};
}

/* The raw strings a tool-call parser reads as another type (grammar.h, m3_grammar_raw.not_as):
 * [ \t\n\r]* X [ \t\n\r]* with X null, true / false in any case, [+-]?D+, a decimal number as
 * strtod reads one ([+-]? (D+ (.D*)? | .D+) ([eE][+-]?D+)?), or { / [ and anything after. */
static g_frag f_raw_typed(g_nfa *n, unsigned not_as) {
    g_frag x = f_none();
    if (not_as & M3_GRAW_NULL) x = f_alt(n, x, f_lit(n, "null", 4));
    if (not_as & M3_GRAW_BOOL) {
        static const char *const tr[] = {"ttTT", "rrRR", "uuUU", "eeEE"}, *const fa[] = {"ffFF", "aaAA", "llLL", "ssSS", "eeEE"};
        int s = nfa_state(n), e = nfa_state(n);
        f_path(n, s, e, tr, 4);
        f_path(n, s, e, fa, 5);
        x = f_alt(n, x, (g_frag){s, e});
    }
    if (not_as & (M3_GRAW_INT | M3_GRAW_NUM)) {
        g_frag sign = f_opt(n, f_set(n, "++--")), d1 = f_seq(n, f_range(n, '0', '9'), f_star(n, f_range(n, '0', '9')));
        if (not_as & M3_GRAW_NUM) {
            g_frag a = f_seq(n, d1, f_opt(n, f_seq(n, f_lit(n, ".", 1), f_star(n, f_range(n, '0', '9')))));
            g_frag b = f_seq(n, f_lit(n, ".", 1), f_seq(n, f_range(n, '0', '9'), f_star(n, f_range(n, '0', '9'))));
            g_frag ex = f_seq(n, f_seq(n, f_set(n, "eeEE"), f_opt(n, f_set(n, "++--"))),
                              f_seq(n, f_range(n, '0', '9'), f_star(n, f_range(n, '0', '9'))));
            d1 = f_seq(n, f_alt(n, a, b), f_opt(n, ex));
        }
        x = f_alt(n, x, f_seq(n, sign, d1));
    }
    g_frag ws = f_star(n, f_set(n, "  \t\n\r\r"));
    if (not_as & (M3_GRAW_OBJ | M3_GRAW_ARR)) {
        g_frag open = f_set(n, (not_as & M3_GRAW_OBJ) && (not_as & M3_GRAW_ARR) ? "{{[[" : (not_as & M3_GRAW_OBJ) ? "{{" : "[[");
        x = f_alt(n, x, f_seq(n, open, f_star(n, f_range(n, 0, 255))));
    }
    return f_seq(n, f_seq(n, ws, x), f_star(n, f_set(n, "  \t\n\r\r")));
}

/* a raw string of lo..hi characters (hi < 0: unbounded), within the raw restrictions */
static g_frag f_raw_string(sc_t *c, long long lo, long long hi) {
    g_nfa *n = c->n;
    g_frag f = f_eps(n);
    for (long long i = 0; i < lo && !bad(c); i++) f = f_seq(n, f, f_raw_char(n));
    if (hi < 0) f = f_seq(n, f, f_star(n, f_raw_char(n)));
    else {
        int end = nfa_state(n), cur = f.e;
        for (long long i = lo; i < hi && !bad(c); i++) {
            nfa_edge(n, cur, E_EPS, 0, 0, end, -1);
            g_frag ch = f_raw_char(n);
            nfa_edge(n, cur, E_EPS, 0, 0, ch.s, -1);
            cur = ch.e;
        }
        nfa_edge(n, cur, E_EPS, 0, 0, end, -1);
        f = (g_frag){f.s, end};
    }
    if (bad(c)) return f_none();
    const char *fb = c->raw->forbid ? c->raw->forbid : "";
    g_frag r = f;
    if (fb[0] || !c->raw->edge_newlines) r = f_product(n, f, f_raw_restrict(n, fb, (int)strlen(fb), c->raw->edge_newlines), 0);
    if (r.s >= 0 && c->raw->not_as) r = f_product(n, r, f_raw_typed(n, c->raw->not_as), 1);
    if (r.s < 0 && !bad(c)) return sc_err(c, "no raw string of %lld to %lld characters satisfies the restrictions", lo, hi);
    return r;
}

/* a string value: JSON, or raw at the top level of a raw value */
static g_frag f_str_value(sc_t *c, long long lo, long long hi) {
    return c->raw_on ? f_raw_string(c, lo, hi) : f_string(c, lo, hi, 1);
}

/* digits: D{lo,hi} (hi < 0: unbounded) */
static g_frag f_digits(g_nfa *n, int lo, int hi) {
    g_frag f = f_eps(n);
    for (int i = 0; i < lo; i++) f = f_seq(n, f, f_range(n, '0', '9'));
    if (hi < 0) return f_seq(n, f, f_star(n, f_range(n, '0', '9')));
    int end = nfa_state(n), cur = f.e;
    for (int i = lo; i < hi; i++) {
        nfa_edge(n, cur, E_EPS, 0, 0, end, -1);
        int nx = nfa_state(n);
        nfa_edge(n, cur, E_BYTE, '0', '9', nx, -1);
        cur = nx;
    }
    nfa_edge(n, cur, E_EPS, 0, 0, end, -1);
    if (f.s < 0 || end < 0) return f_none();
    return (g_frag){f.s, end};
}

#define INT_DIGITS 18
#define FRAC_DIGITS 18
#define EXP_DIGITS 2

static g_frag f_int_part(g_nfa *n) { /* 0 | [1-9]D{0,17} */
    return f_alt(n, f_lit(n, "0", 1), f_seq(n, f_range(n, '1', '9'), f_digits(n, 0, INT_DIGITS - 1)));
}

static g_frag f_number_plain(g_nfa *n, int is_int, int exp) {
    g_frag f = f_seq(n, f_opt(n, f_lit(n, "-", 1)), f_int_part(n));
    if (is_int) return f;
    f = f_seq(n, f, f_opt(n, f_seq(n, f_lit(n, ".", 1), f_digits(n, 1, FRAC_DIGITS))));
    if (exp) f = f_seq(n, f, f_opt(n, f_seq(n, f_seq(n, f_set(n, "eeEE"), f_opt(n, f_set(n, "++--"))), f_digits(n, 1, EXP_DIGITS))));
    return f;
}

/* ---- decimal comparisons: languages of non-negative decimals (no sign, no exponent) ---- */

typedef struct {
    int neg;
    char ip[512]; /* integer digits, no leading zeros ("0" for zero) */
    char fp[512]; /* fraction digits, no trailing zeros (maybe empty) */
} dec_t;

static int dec_of(json_t *v, dec_t *d) {
    memset(d, 0, sizeof *d);
    if (json_is_integer(v)) {
        long long x = json_integer_value(v);
        d->neg = x < 0;
        unsigned long long u = x < 0 ? 0ull - (unsigned long long)x : (unsigned long long)x;
        snprintf(d->ip, sizeof d->ip, "%llu", u);
        return 0;
    }
    double x = json_real_value(v);
    if (!isfinite(x)) return -1;
    char buf[64];
    int p = 0;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p, x);
        if (strtod(buf, NULL) == x) break;
    }
    snprintf(buf, sizeof buf, "%.*e", p, x);
    const char *s = buf;
    if (*s == '-') { d->neg = 1; s++; }
    char dig[40];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9') dig[nd++] = *s;
    int ex = *s == 'e' ? atoi(s + 1) : 0;
    if (ex > 400 || ex < -400) return -1;
    /* value = 0.dig * 10^(ex+1) */
    int point = ex + 1, ni = 0, nf = 0;
    for (int i = 0; i < point; i++) d->ip[ni++] = i < nd ? dig[i] : '0';
    for (int i = point < 0 ? point : 0; i < 0; i++) d->fp[nf++] = '0';
    for (int i = point > 0 ? point : 0; i < nd; i++) d->fp[nf++] = dig[i];
    d->ip[ni] = 0;
    d->fp[nf] = 0;
    int z = 0;
    while (d->ip[z] == '0') z++;
    memmove(d->ip, d->ip + z, strlen(d->ip + z) + 1);
    if (!d->ip[0]) strcpy(d->ip, "0");
    while (nf && d->fp[nf - 1] == '0') d->fp[--nf] = 0;
    if (!strcmp(d->ip, "0") && !nf) d->neg = 0;
    return 0;
}

static g_frag f_anyfrac(g_nfa *n, int af) {
    return af ? f_opt(n, f_seq(n, f_lit(n, ".", 1), f_digits(n, 1, -1))) : f_eps(n);
}
static g_frag f_digit_range(g_nfa *n, int lo, int hi) { return lo > hi ? f_none() : f_range(n, lo, hi); }

enum { OP_GE, OP_GT, OP_LE, OP_LT };

/* fraction digit strings f (one or more digits) with 0.f OP 0.F, F non-empty */
static g_frag f_fcmp(g_nfa *n, const char *F, int op) {
    int f0 = F[0], last = !F[1];
    g_frag D = f_digits(n, 0, -1);
    if (op == OP_GE || op == OP_GT) {
        g_frag above = f_seq(n, f_digit_range(n, f0 + 1, '9'), D);
        g_frag rest = last ? (op == OP_GE ? f_digits(n, 0, -1)
                                          : f_seq(n, f_seq(n, f_digits(n, 0, -1), f_range(n, '1', '9')), f_digits(n, 0, -1)))
                           : f_fcmp(n, F + 1, op);
        return f_alt(n, above, f_seq(n, f_lit(n, F, 1), rest));
    }
    g_frag below = f_seq(n, f_digit_range(n, '0', f0 - 1), D);
    g_frag rest = last ? (op == OP_LE ? f_star(n, f_lit(n, "0", 1)) : f_none()) : f_opt(n, f_fcmp(n, F + 1, op));
    return f_alt(n, below, rest.s < 0 ? f_none() : f_seq(n, f_lit(n, F, 1), rest));
}

/* the optional fraction part after an integer part equal to the bound's */
static g_frag f_frac_cmp(g_nfa *n, const char *F, int op, int af) {
    if (!F[0]) {
        if (op == OP_GE) return f_anyfrac(n, af);
        if (op == OP_GT) return af ? f_seq(n, f_seq(n, f_lit(n, ".", 1), f_digits(n, 0, -1)), f_seq(n, f_range(n, '1', '9'), f_digits(n, 0, -1))) : f_none();
        if (op == OP_LE) return af ? f_opt(n, f_seq(n, f_lit(n, ".", 1), f_seq(n, f_lit(n, "0", 1), f_star(n, f_lit(n, "0", 1))))) : f_eps(n);
        return f_none();
    }
    if (op == OP_GE || op == OP_GT) return af ? f_seq(n, f_lit(n, ".", 1), f_fcmp(n, F, op)) : f_none();
    return af ? f_opt(n, f_seq(n, f_lit(n, ".", 1), f_fcmp(n, F, op))) : f_eps(n);
}

/* non-negative decimals x (int part, optional fraction when af) with x OP C.F */
static g_frag f_cmp_nonneg(g_nfa *n, const char *C, const char *F, int op, int af) {
    int len = (int)strlen(C);
    int zero = !strcmp(C, "0");
    g_frag out = f_none();
    if (op == OP_GE || op == OP_GT) {
        /* a longer integer part */
        g_frag longer = zero ? f_seq(n, f_range(n, '1', '9'), f_digits(n, 0, -1))
                             : f_seq(n, f_range(n, '1', '9'), f_digits(n, len, -1));
        out = f_seq(n, longer, f_anyfrac(n, af));
        if (!zero) /* the same length, greater */
            for (int i = 0; i < len; i++) {
                g_frag g = f_seq(n, f_seq(n, f_lit(n, C, (size_t)i), f_digit_range(n, C[i] + 1, '9')), f_digits(n, len - i - 1, len - i - 1));
                out = f_alt(n, out, f_seq(n, g, f_anyfrac(n, af)));
            }
    } else {
        if (len >= 2) /* a shorter integer part */
            out = f_seq(n, f_alt(n, f_lit(n, "0", 1), f_seq(n, f_range(n, '1', '9'), f_digits(n, 0, len - 2))), f_anyfrac(n, af));
        for (int i = 0; i < len; i++) {
            int lo = (i == 0 && len > 1) ? '1' : '0';
            g_frag g = f_seq(n, f_seq(n, f_lit(n, C, (size_t)i), f_digit_range(n, lo, C[i] - 1)), f_digits(n, len - i - 1, len - i - 1));
            out = f_alt(n, out, f_seq(n, g, f_anyfrac(n, af)));
        }
    }
    return f_alt(n, out, f_seq(n, f_lit(n, C, strlen(C)), f_frac_cmp(n, F, op, af)));
}

/* all numbers (with sign) x with x OP bound */
static g_frag f_bound(g_nfa *n, const dec_t *b, int op, int af) {
    int zero = !strcmp(b->ip, "0") && !b->fp[0];
    g_frag nonneg = f_seq(n, f_alt(n, f_lit(n, "0", 1), f_seq(n, f_range(n, '1', '9'), f_digits(n, 0, -1))), f_anyfrac(n, af));
    if (op == OP_GE || op == OP_GT) {
        if (!b->neg) return f_cmp_nonneg(n, b->ip, b->fp, op, af); /* no negatives (nor -0) */
        return f_alt(n, nonneg, f_seq(n, f_lit(n, "-", 1), f_cmp_nonneg(n, b->ip, b->fp, op == OP_GE ? OP_LE : OP_LT, af)));
    }
    if (b->neg) return f_seq(n, f_lit(n, "-", 1), f_cmp_nonneg(n, b->ip, b->fp, op == OP_LE ? OP_GE : OP_GT, af));
    g_frag negs = f_seq(n, f_lit(n, "-", 1), (zero && op == OP_LT) ? f_cmp_nonneg(n, "0", "", OP_GT, af) : nonneg);
    return f_alt(n, negs, f_cmp_nonneg(n, b->ip, b->fp, op, af));
}

static g_frag s_number(sc_t *c, json_t *s, int is_int) {
    g_nfa *n = c->n;
    static const char *names[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    static const int ops[] = {OP_GE, OP_GT, OP_LE, OP_LT};
    json_t *v[4];
    int any = 0;
    for (int i = 0; i < 4; i++) {
        v[i] = json_object_get(s, names[i]);
        if (v[i] && json_is_boolean(v[i])) { /* draft 4: exclusiveMinimum: true makes minimum exclusive */
            if (i == 1 || i == 3) continue;
        }
        if (v[i] && !json_is_number(v[i])) {
            size_t pl = path_push(c, names[i]);
            sc_err(c, "\"%s\" must be a number", names[i]);
            path_pop(c, pl);
            return f_none();
        }
        any |= v[i] != NULL;
    }
    if (!any) return f_number_plain(n, is_int, 1);
    g_frag lang = f_number_plain(n, is_int, 0);
    for (int i = 0; i < 4 && !bad(c); i++) {
        if (!v[i] || json_is_boolean(v[i])) continue;
        int op = ops[i];
        json_t *ex = json_object_get(s, i == 0 ? "exclusiveMinimum" : i == 2 ? "exclusiveMaximum" : "");
        if (ex && json_is_true(ex)) op = i == 0 ? OP_GT : OP_LT;
        dec_t d;
        if (dec_of(v[i], &d)) {
            size_t pl = path_push(c, names[i]);
            sc_err(c, "\"%s\" out of range", names[i]);
            path_pop(c, pl);
            return f_none();
        }
        lang = f_product(n, lang, f_bound(n, &d, op, !is_int), 0);
        if (lang.s < 0 && !bad(c)) return sc_err(c, "no %s satisfies the bounds", is_int ? "integer" : "number");
    }
    return lang;
}

/* ---- schema nodes ---- */

static g_frag s_schema(sc_t *c, json_t *s);

static int rule_find(sc_t *c, json_t *s) {
    for (int i = 0; i < c->nrm; i++)
        if (c->rm[i].s == s) return i;
    if (c->nrm == c->caprm) {
        int cap = c->caprm ? c->caprm * 2 : 16;
        rmap_t *r = realloc(c->rm, (size_t)cap * sizeof *r);
        if (!r) return -1;
        c->rm = r;
        c->caprm = cap;
    }
    c->rm[c->nrm] = (rmap_t){s, -1, 0};
    return c->nrm++;
}

/* a call of the rule that matches schema s (built once) */
static g_frag s_call(sc_t *c, json_t *s) {
    int i = rule_find(c, s);
    if (i < 0) return sc_err(c, "out of memory");
    if (c->rm[i].rule < 0) {
        int r = nfa_rule_new(c->n);
        if (r < 0) return f_none();
        c->rm[i].rule = r;
        if (c->ni >= MAX_NEST) return sc_err(c, "nested too deeply");
        c->istk[c->ni++] = s;
        int raw = c->raw_on;
        c->raw_on = 0; /* a rule is shared by its callers: values inside objects and arrays */
        g_frag body = s_schema(c, s);
        c->raw_on = raw;
        c->ni--;
        nfa_rule_set(c->n, r, body);
    }
    return f_call(c->n, c->rm[i].rule);
}

/* an enum / const value; a raw string that would read as another type is left out (f_none) */
static g_frag s_literal(sc_t *c, json_t *v) {
    if (c->raw_on && json_is_string(v)) {
        g_frag f = f_lit(c->n, json_string_value(v), json_string_length(v));
        return c->raw->not_as ? f_product(c->n, f, f_raw_typed(c->n, c->raw->not_as), 1) : f;
    }
    char *txt = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!txt) return sc_err(c, "out of memory");
    g_frag f = f_lit(c->n, txt, strlen(txt));
    free(txt);
    return f;
}

static g_frag s_any(sc_t *c);

/* { ws ( } | member (ws , ws member)* ws } ), values any JSON */
static g_frag any_object(sc_t *c) {
    g_nfa *n = c->n;
    g_frag open = f_seq(n, f_lit(n, "{", 1), f_ws(c));
    g_frag m1 = f_seq(n, f_seq(n, f_seq(n, f_string(c, 0, -1, 1), f_ws(c)), f_seq(n, f_lit(n, ":", 1), f_ws(c))), s_any(c));
    g_frag m2 = f_seq(n, f_seq(n, f_seq(n, f_ws(c), f_lit(n, ",", 1)), f_ws(c)),
                      f_seq(n, f_seq(n, f_seq(n, f_string(c, 0, -1, 1), f_ws(c)), f_seq(n, f_lit(n, ":", 1), f_ws(c))), s_any(c)));
    g_frag body = f_seq(n, f_seq(n, m1, f_star(n, m2)), f_seq(n, f_ws(c), f_lit(n, "}", 1)));
    return f_seq(n, open, f_alt(n, f_lit(n, "}", 1), body));
}

static int any_rules(sc_t *c) {
    if (c->any_obj >= 0) return 0;
    g_nfa *n = c->n;
    int raw = c->raw_on;
    c->raw_on = 0;
    c->any_obj = nfa_rule_new(n);
    c->any_arr = nfa_rule_new(n);
    if (c->any_arr < 0) return -1;
    nfa_rule_set(n, c->any_obj, any_object(c));
    g_frag open = f_seq(n, f_lit(n, "[", 1), f_ws(c));
    g_frag m2 = f_seq(n, f_seq(n, f_seq(n, f_ws(c), f_lit(n, ",", 1)), f_ws(c)), s_any(c));
    g_frag body = f_seq(n, f_seq(n, s_any(c), f_star(n, m2)), f_seq(n, f_ws(c), f_lit(n, "]", 1)));
    nfa_rule_set(n, c->any_arr, f_seq(n, open, f_alt(n, f_lit(n, "]", 1), body)));
    c->raw_on = raw;
    return bad(c) ? -1 : 0;
}

/* any JSON value: scalars inline, objects and arrays called */
static g_frag s_any(sc_t *c) {
    g_nfa *n = c->n;
    if (c->any_obj < 0 && any_rules(c)) return f_none();
    g_frag f = f_str_value(c, 0, -1);
    f = f_alt(n, f, f_number_plain(n, 0, 1));
    f = f_alt(n, f, f_lit(n, "true", 4));
    f = f_alt(n, f, f_lit(n, "false", 5));
    f = f_alt(n, f, f_lit(n, "null", 4));
    f = f_alt(n, f, f_call(n, c->any_obj));
    f = f_alt(n, f, f_call(n, c->any_arr));
    return f;
}

/* additionalProperties: false (NULL), true (json_true) or a schema */
static g_frag s_object(sc_t *c, json_t *s) {
    g_nfa *n = c->n;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) {
        size_t pl = path_push(c, "properties");
        sc_err(c, "\"properties\" must be an object");
        path_pop(c, pl);
        return f_none();
    }
    if (req && !json_is_array(req)) {
        size_t pl = path_push(c, "required");
        sc_err(c, "\"required\" must be an array of strings");
        path_pop(c, pl);
        return f_none();
    }
    if (!addl) addl = props ? json_false() : json_true();
    else if (!json_is_boolean(addl) && !json_is_object(addl)) {
        size_t pl = path_push(c, "additionalProperties");
        sc_err(c, "\"additionalProperties\" must be a boolean or a schema");
        path_pop(c, pl);
        return f_none();
    }
    size_t nreq = req ? json_array_size(req) : 0;
    for (size_t i = 0; i < nreq; i++)
        if (!json_is_string(json_array_get(req, i))) {
            size_t pl = path_push(c, "required");
            sc_err(c, "\"required\" must be an array of strings");
            path_pop(c, pl);
            return f_none();
        }
    /* declared names in order, then required ones that only additionalProperties describes */
    size_t np = props ? json_object_size(props) : 0, nn = 0;
    const char **names = calloc(np + nreq + 1, sizeof *names);
    json_t **schemas = calloc(np + nreq + 1, sizeof *schemas);
    char *isreq = calloc(np + nreq + 1, 1);
    if (!names || !schemas || !isreq) {
        free(names);
        free(schemas);
        free(isreq);
        return sc_err(c, "out of memory");
    }
    if (props) {
        const char *k;
        json_t *v;
        json_object_foreach(props, k, v) {
            names[nn] = k;
            schemas[nn++] = v;
        }
    }
    for (size_t i = 0; i < nreq; i++) {
        const char *r = json_string_value(json_array_get(req, i));
        size_t j = 0;
        while (j < nn && strcmp(names[j], r)) j++;
        if (j == nn) {
            if (json_is_false(addl)) {
                free(names);
                free(schemas);
                free(isreq);
                return sc_err(c, "required property \"%s\" is not in \"properties\" and additionalProperties is false", r);
            }
            names[nn] = r;
            schemas[nn++] = addl;
        }
        isreq[j] = 1;
    }
    g_frag open = f_seq(n, f_lit(n, "{", 1), f_ws(c));
    int t0 = open.e, t1 = -1; /* nothing written yet / something written */
    for (size_t i = 0; i < nn && !bad(c); i++) {
        json_t *ps = schemas[i];
        if (json_is_false(ps)) { /* this property must not appear */
            if (isreq[i]) sc_err(c, "required property \"%s\" has the schema false", names[i]);
            continue;
        }
        json_t *js = json_string(names[i]);
        char *q = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
        json_decref(js);
        if (!q) { sc_err(c, "out of memory"); break; }
        int a = nfa_state(n);
        if (t0 >= 0) {
            g_frag k = f_lit(n, q, strlen(q));
            nfa_edge(n, t0, E_EPS, 0, 0, k.s, -1);
            nfa_edge(n, k.e, E_EPS, 0, 0, a, -1);
        }
        if (t1 >= 0) {
            g_frag k = f_seq(n, f_seq(n, f_seq(n, f_ws(c), f_lit(n, ",", 1)), f_ws(c)), f_lit(n, q, strlen(q)));
            nfa_edge(n, t1, E_EPS, 0, 0, k.s, -1);
            nfa_edge(n, k.e, E_EPS, 0, 0, a, -1);
        }
        free(q);
        size_t pl = path_push(c, ps == addl && (!props || !json_object_get(props, names[i])) ? "additionalProperties" : "properties");
        size_t pl2 = ps == addl && (!props || !json_object_get(props, names[i])) ? pl : path_push(c, names[i]);
        (void)pl2;
        g_frag val = json_is_true(ps) ? s_any(c) : s_schema(c, ps);
        path_pop(c, pl);
        g_frag m = f_seq(n, f_seq(n, f_seq(n, f_ws(c), f_lit(n, ":", 1)), f_ws(c)), val);
        nfa_edge(n, a, E_EPS, 0, 0, m.s, -1);
        int n0 = -1, n1 = nfa_state(n);
        nfa_edge(n, m.e, E_EPS, 0, 0, n1, -1);
        if (!isreq[i]) {
            if (t0 >= 0) {
                n0 = nfa_state(n);
                nfa_edge(n, t0, E_EPS, 0, 0, n0, -1);
            }
            if (t1 >= 0) nfa_edge(n, t1, E_EPS, 0, 0, n1, -1);
        }
        t0 = n0;
        t1 = n1;
    }
    if (!json_is_false(addl) && !bad(c)) {
        /* "key": value pairs after the declared ones; keys without escapes, not a declared name */
        g_frag names_lang = f_none();
        for (size_t i = 0; i < nn && !bad(c); i++) {
            json_t *js = json_string(names[i]);
            char *q = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
            json_decref(js);
            if (!q) { sc_err(c, "out of memory"); break; }
            names_lang = f_alt(n, names_lang, f_lit(n, q, strlen(q)));
            free(q);
        }
        size_t pl = path_push(c, "additionalProperties");
        int L = nfa_state(n);
        for (int copy = 0; copy < 2 && !bad(c); copy++) {
            int from = copy == 0 ? t0 : L;
            if (from < 0) continue;
            g_frag key = f_product(n, f_string(c, 0, -1, 0), names_lang, 1);
            if (copy == 1) key = f_seq(n, f_seq(n, f_seq(n, f_ws(c), f_lit(n, ",", 1)), f_ws(c)), key);
            g_frag val = json_is_true(addl) ? s_any(c) : s_schema(c, addl);
            g_frag m = f_seq(n, f_seq(n, key, f_seq(n, f_seq(n, f_ws(c), f_lit(n, ":", 1)), f_ws(c))), val);
            nfa_edge(n, from, E_EPS, 0, 0, m.s, -1);
            nfa_edge(n, m.e, E_EPS, 0, 0, L, -1);
        }
        path_pop(c, pl);
        if (t1 >= 0) nfa_edge(n, t1, E_EPS, 0, 0, L, -1);
        t1 = L;
    }
    free(names);
    free(schemas);
    free(isreq);
    int end = nfa_state(n);
    if (t0 >= 0) {
        g_frag cl = f_lit(n, "}", 1);
        nfa_edge(n, t0, E_EPS, 0, 0, cl.s, -1);
        nfa_edge(n, cl.e, E_EPS, 0, 0, end, -1);
    }
    if (t1 >= 0) {
        g_frag cl = f_seq(n, f_ws(c), f_lit(n, "}", 1));
        nfa_edge(n, t1, E_EPS, 0, 0, cl.s, -1);
        nfa_edge(n, cl.e, E_EPS, 0, 0, end, -1);
    }
    if (bad(c)) return f_none();
    return (g_frag){open.s, end};
}

static int get_count(sc_t *c, json_t *s, const char *key, long long *out) {
    json_t *v = json_object_get(s, key);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        size_t pl = path_push(c, key);
        sc_err(c, "\"%s\" must be a non-negative integer", key);
        path_pop(c, pl);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

static g_frag s_array(sc_t *c, json_t *s) {
    g_nfa *n = c->n;
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    long long mn = 0, mx = -1;
    if (get_count(c, s, "minItems", &mn) || get_count(c, s, "maxItems", &mx)) return f_none();
    if (items && !json_is_object(items) && !json_is_boolean(items)) {
        size_t pl = path_push(c, "items");
        sc_err(c, "\"items\" must be a schema (tuples: \"prefixItems\")");
        path_pop(c, pl);
        return f_none();
    }
    if (prefix && !json_is_array(prefix)) {
        size_t pl = path_push(c, "prefixItems");
        sc_err(c, "\"prefixItems\" must be an array of schemas");
        path_pop(c, pl);
        return f_none();
    }
    long long np = prefix ? (long long)json_array_size(prefix) : 0;
    int no_more = items && json_is_false(items);
    if (no_more && (mx < 0 || mx > np)) mx = np;
    if (mx >= 0 && mn > mx) return sc_err(c, "minItems %lld > maxItems %lld", mn, mx);
    if (mx > 100000 || mn > 100000) return sc_err(c, "minItems / maxItems over 100000");
    long long explicit_n = mx >= 0 ? mx : (mn > np ? mn : np);
    if (mx < 0 && explicit_n == 0) explicit_n = 1; /* the loop wants one element before it */
    g_frag open = f_seq(n, f_lit(n, "[", 1), f_ws(c));
    int end = nfa_state(n), cur = open.e;
    int item_rule_call = 0, item_size = 0;
    for (long long i = 0; i <= explicit_n && !bad(c); i++) {
        if (i >= mn) { /* may close here */
            g_frag cl = i == 0 ? f_lit(n, "]", 1) : f_seq(n, f_ws(c), f_lit(n, "]", 1));
            nfa_edge(n, cur, E_EPS, 0, 0, cl.s, -1);
            nfa_edge(n, cl.e, E_EPS, 0, 0, end, -1);
        }
        if (i == explicit_n) break;
        json_t *es = i < np ? json_array_get(prefix, (size_t)i) : items;
        size_t pl = i < np ? path_push(c, "prefixItems") : path_push(c, "items");
        if (i < np) path_push_i(c, (size_t)i);
        g_frag el;
        if (i >= np && item_rule_call) el = s_call(c, es ? es : json_true());
        else {
            int before = n->nst;
            el = !es || json_is_true(es) ? s_any(c) : s_schema(c, es);
            if (i >= np) {
                item_size = n->nst - before;
                if ((long long)item_size * (explicit_n - i) > INLINE_MAX) item_rule_call = 1;
            }
        }
        path_pop(c, pl);
        if (i > 0) el = f_seq(n, f_seq(n, f_seq(n, f_ws(c), f_lit(n, ",", 1)), f_ws(c)), el);
        nfa_edge(n, cur, E_EPS, 0, 0, el.s, -1);
        cur = el.e;
    }
    if (mx < 0 && !no_more && !bad(c)) { /* unbounded: (ws , ws item)* after the explicit ones */
        size_t pl = path_push(c, "items");
        g_frag el = item_rule_call ? s_call(c, items ? items : json_true())
                                   : (!items || json_is_true(items) ? s_any(c) : s_schema(c, items));
        path_pop(c, pl);
        g_frag m = f_seq(n, f_seq(n, f_seq(n, f_ws(c), f_lit(n, ",", 1)), f_ws(c)), el);
        nfa_edge(n, cur, E_EPS, 0, 0, m.s, -1);
        nfa_edge(n, m.e, E_EPS, 0, 0, cur, -1);
        g_frag cl = f_seq(n, f_ws(c), f_lit(n, "]", 1));
        nfa_edge(n, cur, E_EPS, 0, 0, cl.s, -1);
        nfa_edge(n, cl.e, E_EPS, 0, 0, end, -1);
    }
    if (bad(c)) return f_none();
    return (g_frag){open.s, end};
}

static json_t *resolve_ref(sc_t *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    json_t *cur = c->root;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/') return NULL;
        p++;
        char tok[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') { tok[k++] = '~'; p += 2; }
            else if (p[0] == '~' && p[1] == '1') { tok[k++] = '/'; p += 2; }
            else tok[k++] = *p++;
        }
        tok[k] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *end;
            long i = strtol(tok, &end, 10);
            if (*end || end == tok || i < 0) return NULL;
            cur = json_array_get(cur, (size_t)i);
        } else return NULL;
        if (!cur) return NULL;
    }
    return cur;
}

static const char *annotations[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};
static const char *known[] = {"type", "properties", "required", "additionalProperties", "items", "prefixItems",
                              "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "minLength",
                              "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "$ref", NULL};

static int in_list(const char *k, const char **l) {
    for (; *l; l++)
        if (!strcmp(k, *l)) return 1;
    return 0;
}

/* the keywords of s other than annotations, excluding `self` */
static const char *other_keyword(json_t *s, const char *self) {
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (!strcmp(k, self) || in_list(k, annotations)) continue;
        return k;
    }
    return NULL;
}

/* the texts of a string value that "format" (matched whole) and "pattern" (a match anywhere, as
 * JSON Schema means it) allow, as a call-free fragment spelled as the string is written (raw, or
 * JSON as JSON.stringify spells it); f_none() + error */
static g_frag s_text_matching(sc_t *c, json_t *fmt, json_t *pat) {
    g_nfa *n = c->n;
    g_frag r = f_none();
    int have = 0;
    json_t *kw[2] = {fmt, pat};
    static const char *const name[2] = {"format", "pattern"};
    for (int k = 0; k < 2 && !bad(c); k++) {
        if (!kw[k]) continue;
        size_t pl = path_push(c, name[k]);
        const char *re = json_string_value(kw[k]);
        if (!re) {
            sc_err(c, "\"%s\" must be a string", name[k]);
        } else if (k == 0 && !(re = schema_format_regex(json_string_value(kw[k])))) {
            char q[48];
            snprintf(q, sizeof q, "%.40s", json_string_value(kw[k]));
            sc_err(c, "unsupported \"format\": \"%s\" (served, for strings: %s)", q, schema_format_names());
        } else {
            char emsg[256];
            g_frag f = regex_fragment(n, re, k == 0 ? strlen(re) : json_string_length(kw[k]), c->raw_on ? RX_TEXT : RX_JSON, k == 1,
                                      emsg, sizeof emsg);
            if (f.s < 0 && emsg[0]) sc_err(c, "\"%s\": %s", name[k], emsg);
            else if (f.s >= 0) {
                r = have ? f_product(n, r, f, 0) : f;
                have = 1;
                if (r.s < 0 || f_is_empty(n, r)) {
                    if (!bad(c)) sc_err(c, k == 0 ? "no string matches the format" : fmt ? "no string matches both \"format\" and \"pattern\""
                                                                                      : "no string matches the pattern");
                    r = f_none();
                }
            }
        }
        path_pop(c, pl);
    }
    return bad(c) ? f_none() : r;
}

/* a string of lo..hi characters (hi < 0: unbounded) of the texts s_text_matching allows, JSON or
 * raw as f_str_value writes it */
static g_frag s_string_matching(sc_t *c, json_t *fmt, json_t *pat, long long lo, long long hi) {
    g_nfa *n = c->n;
    g_frag r = s_text_matching(c, fmt, pat);
    if (r.s < 0) return f_none();
    g_frag f;
    if (c->raw_on) f = f_product(n, f_raw_string(c, lo, hi), r, 0);
    else {
        g_frag q = f_seq(n, f_lit(n, "\"", 1), f_seq(n, r, f_lit(n, "\"", 1)));
        f = lo == 0 && hi < 0 ? q : f_product(n, f_string(c, lo, hi, 1), q, 0);
    }
    if (f.s < 0 && !bad(c)) {
        size_t pl = path_push(c, pat ? "pattern" : "format");
        char len[64];
        if (hi < 0) snprintf(len, sizeof len, "at least %lld", lo);
        else snprintf(len, sizeof len, "%lld to %lld", lo, hi);
        sc_err(c, "no string of %s characters matches the %s", len, fmt && pat ? "format and the pattern" : fmt ? "format" : "pattern");
        path_pop(c, pl);
    }
    return f;
}

static g_frag s_type(sc_t *c, json_t *s, const char *t) {
    g_nfa *n = c->n;
    if (!strcmp(t, "string")) {
        long long lo = 0, hi = -1;
        if (get_count(c, s, "minLength", &lo) || get_count(c, s, "maxLength", &hi)) return f_none();
        if (hi >= 0 && lo > hi) return sc_err(c, "minLength %lld > maxLength %lld", lo, hi);
        if (lo > 100000 || hi > 100000) return sc_err(c, "minLength / maxLength over 100000");
        json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
        if (!pat && !fmt) return f_str_value(c, lo, hi);
        return s_string_matching(c, fmt, pat, lo, hi);
    }
    json_t *fmt = json_object_get(s, "format"); /* a string format served holds for strings only */
    if (fmt && !(json_is_string(fmt) && schema_format_regex(json_string_value(fmt)))) { /* int32, uri, ...: refused, not ignored */
        size_t pl = path_push(c, "format");
        char q[48];
        snprintf(q, sizeof q, "%.40s", json_is_string(fmt) ? json_string_value(fmt) : "?");
        sc_err(c, "unsupported \"format\": \"%s\" (served, for strings: %s)", q, schema_format_names());
        path_pop(c, pl);
        return f_none();
    }
    if (!strcmp(t, "integer")) return s_number(c, s, 1);
    if (!strcmp(t, "number")) return s_number(c, s, 0);
    if (!strcmp(t, "boolean")) return f_alt(n, f_lit(n, "true", 4), f_lit(n, "false", 5));
    if (!strcmp(t, "null")) return f_lit(n, "null", 4);
    if (!strcmp(t, "object") || !strcmp(t, "array")) { /* members are JSON, raw or not */
        int raw = c->raw_on;
        c->raw_on = 0;
        g_frag f = !strcmp(t, "object") ? s_object(c, s) : s_array(c, s);
        c->raw_on = raw;
        return f;
    }
    size_t pl = path_push(c, "type");
    sc_err(c, "unknown type \"%s\"", t);
    path_pop(c, pl);
    return f_none();
}

static g_frag s_schema_in(sc_t *c, json_t *s) {
    g_nfa *n = c->n;
    if (json_is_true(s)) return s_any(c);
    if (json_is_false(s)) return sc_err(c, "the schema false matches nothing");
    if (!json_is_object(s)) return sc_err(c, "a schema must be an object or a boolean");
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (in_list(k, annotations) || in_list(k, known)) continue;
        size_t pl = path_push(c, k);
        sc_err(c, "unsupported keyword \"%s\"", k);
        path_pop(c, pl);
        return f_none();
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        size_t pl = path_push(c, "$ref");
        const char *o = other_keyword(s, "$ref");
        if (o) {
            sc_err(c, "\"$ref\" beside \"%s\" is not supported", o);
            path_pop(c, pl);
            return f_none();
        }
        json_t *t = json_is_string(ref) ? resolve_ref(c, json_string_value(ref)) : NULL;
        if (!t) {
            sc_err(c, "unsupported or unresolvable $ref (local JSON pointers \"#/...\" only)");
            path_pop(c, pl);
            return f_none();
        }
        path_pop(c, pl);
        int on_stack = 0;
        for (int i = 0; i < c->ni; i++) on_stack |= c->istk[i] == t;
        int mi = rule_find(c, t);
        if (mi < 0) return sc_err(c, "out of memory");
        if (on_stack || (c->rm[mi].size > INLINE_MAX && !c->raw_on)) return s_call(c, t);
        if (c->ni >= MAX_NEST) return sc_err(c, "nested too deeply");
        c->istk[c->ni++] = t;
        int before = n->nst;
        char saved[sizeof c->path];
        size_t savedlen = c->plen;
        memcpy(saved, c->path, sizeof saved);
        const char *rp = json_string_value(ref) + 1;
        snprintf(c->path, sizeof c->path, "%s", rp);
        c->plen = strlen(c->path);
        g_frag f = s_schema(c, t);
        memcpy(c->path, saved, sizeof saved);
        c->plen = savedlen;
        c->ni--;
        mi = rule_find(c, t);
        if (mi >= 0 && !c->rm[mi].size) c->rm[mi].size = n->nst - before + 1;
        return f;
    }
    json_t *cv = json_object_get(s, "const");
    if (cv) return s_literal(c, cv);
    json_t *en = json_object_get(s, "enum");
    if (en) {
        size_t pl = path_push(c, "enum");
        if (!json_is_array(en) || !json_array_size(en)) {
            sc_err(c, "\"enum\" must be a non-empty array");
            path_pop(c, pl);
            return f_none();
        }
        g_frag f = f_none();
        for (size_t i = 0; i < json_array_size(en) && !bad(c); i++) f = f_alt(n, f, s_literal(c, json_array_get(en, i)));
        path_pop(c, pl);
        return f;
    }
    static const char *alts[] = {"anyOf", "oneOf", "allOf"};
    for (int a = 0; a < 3; a++) {
        json_t *l = json_object_get(s, alts[a]);
        if (!l) continue;
        size_t pl = path_push(c, alts[a]);
        const char *o = other_keyword(s, alts[a]);
        if (o) {
            sc_err(c, "\"%s\" beside \"%s\" is not supported", alts[a], o);
            path_pop(c, pl);
            return f_none();
        }
        if (!json_is_array(l) || !json_array_size(l)) {
            sc_err(c, "\"%s\" must be a non-empty array", alts[a]);
            path_pop(c, pl);
            return f_none();
        }
        if (a == 2 && json_array_size(l) != 1) {
            sc_err(c, "\"allOf\" with more than one schema is not supported");
            path_pop(c, pl);
            return f_none();
        }
        g_frag f = f_none();
        int ok = 0;
        for (size_t i = 0; i < json_array_size(l) && !bad(c); i++) {
            json_t *m = json_array_get(l, i);
            if (json_is_false(m)) continue;
            size_t pl2 = path_push_i(c, i);
            f = f_alt(n, f, s_schema(c, m));
            path_pop(c, pl2);
            ok = 1;
        }
        if (!ok && !bad(c)) sc_err(c, "no member of \"%s\" can match", alts[a]);
        path_pop(c, pl);
        return f;
    }
    json_t *ty = json_object_get(s, "type");
    if (ty) {
        if (json_is_string(ty)) return s_type(c, s, json_string_value(ty));
        if (json_is_array(ty) && json_array_size(ty)) {
            g_frag f = f_none();
            for (size_t i = 0; i < json_array_size(ty) && !bad(c); i++) {
                json_t *t = json_array_get(ty, i);
                if (!json_is_string(t)) break;
                f = f_alt(n, f, s_type(c, s, json_string_value(t)));
            }
            if (!bad(c) && f.s >= 0) return f;
        }
        size_t pl = path_push(c, "type");
        sc_err(c, "\"type\" must be a type name or a non-empty array of them");
        path_pop(c, pl);
        return f_none();
    }
    /* no type: what the keywords imply, else any value */
    if (json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties"))
        return s_type(c, s, "object");
    if (json_object_get(s, "items") || json_object_get(s, "prefixItems") || json_object_get(s, "minItems") ||
        json_object_get(s, "maxItems"))
        return s_type(c, s, "array");
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") || json_object_get(s, "pattern") ||
        json_object_get(s, "format"))
        return s_type(c, s, "string");
    if (json_object_get(s, "minimum") || json_object_get(s, "maximum") || json_object_get(s, "exclusiveMinimum") ||
        json_object_get(s, "exclusiveMaximum"))
        return s_number(c, s, 0);
    return s_any(c);
}

static g_frag s_schema(sc_t *c, json_t *s) {
    if (bad(c)) return f_none();
    if (++c->nest > MAX_NEST) {
        c->nest--;
        return sc_err(c, "nested too deeply (over %d levels)", MAX_NEST);
    }
    g_frag f = s_schema_in(c, s);
    c->nest--;
    if (f.s < 0 && !bad(c)) return sc_err(c, "no document satisfies this schema");
    return f;
}

void m3_grammar_opts_default(m3_grammar_opts *o) {
    o->max_ws = 2;
    o->max_depth = 32;
    o->max_states = G_MAX_DFA_STATES;
}

int grammar_opts_check(const m3_grammar_opts *opts, m3_grammar_opts *o, m3_err *err) {
    m3_grammar_opts_default(o);
    if (opts) *o = *opts;
    if (o->max_ws < 0 || o->max_ws > 16) return m3_errf(err, "grammar: max_ws %d out of range [0, 16]", o->max_ws);
    if (o->max_depth < 1 || o->max_depth > 1024) return m3_errf(err, "grammar: max_depth %d out of range [1, 1024]", o->max_depth);
    if (o->max_states < 1 || o->max_states > G_MAX_DFA_STATES)
        return m3_errf(err, "grammar: max_states %d out of range [1, %d]", o->max_states, G_MAX_DFA_STATES);
    return 0;
}

g_frag schema_fragment(g_nfa *n, json_t *doc, json_t *value, const m3_grammar_opts *o, const m3_grammar_raw *raw,
                       int json_object_mode, m3_err *err) {
    sc_t c = {0};
    c.n = n;
    c.root = doc;
    c.o = *o;
    c.err = err;
    c.any_obj = c.any_arr = -1;
    c.raw = raw;
    c.raw_on = raw != NULL;
    g_frag f;
    if (json_object_mode) {
        f = any_rules(&c) ? f_none() : any_object(&c); /* the outer object inline: its end is the output's */
    } else {
        c.istk[c.ni++] = value;
        f = s_schema(&c, value);
    }
    free(c.rm);
    if (c.failed || n->failed) return f_none();
    return f;
}

static m3_grammar *build(json_t *root, const m3_grammar_opts *opts, int json_object_mode, m3_err *err) {
    m3_grammar_opts o;
    if (grammar_opts_check(opts, &o, err)) return NULL;
    g_nfa n = {0};
    n.max_states = MAX_NFA_STATES;
    n.err = err;
    int r0 = nfa_rule_new(&n);
    g_frag f = schema_fragment(&n, root, root, &o, NULL, json_object_mode, err);
    m3_grammar *g = NULL;
    if (!n.failed && f.s >= 0) {
        nfa_rule_set(&n, r0, f);
        g = grammar_build(&n, r0, o.max_depth, o.max_states, err);
    }
    nfa_free(&n);
    return g;
}

json_t *schema_parse(const char *text, size_t len, m3_err *err) {
    json_error_t je;
    memset(&je, 0, sizeof je); /* jansson's parser fails an allocation with no text and no code set */
    json_t *root = json_loadb(text, len, JSON_DECODE_ANY, &je);
    if (root) return root;
    if (json_error_code(&je) == json_error_out_of_memory || !je.text[0]) m3_errf(err, "json schema: out of memory");
    else m3_errf(err, "json schema: invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    return NULL;
}

m3_grammar *m3_grammar_from_schema(const char *text, size_t len, const m3_grammar_opts *opts, m3_err *err) {
    json_t *root = schema_parse(text, len, err);
    if (!root) return NULL;
    m3_grammar *g = build(root, opts, 0, err);
    json_decref(root);
    return g;
}

m3_grammar *m3_grammar_json(const m3_grammar_opts *opts, m3_err *err) { return build(NULL, opts, 1, err); }

json_t *schema_pointer(json_t *doc, const char *ptr) {
    sc_t c = {0};
    c.root = doc;
    return ptr && ptr[0] ? resolve_ref(&c, ptr) : doc;
}
