/* ECMAScript regular expressions -> automaton fragments (grammar_int.h: regex_fragment), for
 * vLLM's guided_regex / structured_outputs.regex (the whole output matches) and JSON Schema's
 * "pattern" (a string whose value contains a match).
 *
 * Syntax and meaning: ECMA-262 with the u flag (the pattern and the texts are code points; escapes
 * strict) and no other flag, what JavaScript's `new RegExp(re, "u")` does:
 *   alternation |, groups ( ) (?: ) (?<name> ), quantifiers * + ? {n} {n,} {n,m} (lazy forms match
 *   the same texts), . (any code point but \n \r U+2028 U+2029), classes [...] [^...] with
 *   ranges, \d \D \w \W \s \S, \t \n \v \f \r \0 \cX \xHH \uHHHH \u{H...} (surrogate pairs
 *   joined), \ before a syntax character or /, ^ at the start and $ at the end of the pattern or
 *   of one of its top-level alternatives.
 * Refused with a message naming the construct and its byte offset: backreferences, lookaround,
 * \b \B, \p{...}, ^ or $ anywhere else, counts over RX_MAX_COUNT, and what the u flag makes a
 * syntax error (a lone { } or ], an unknown escape, a range out of order, ...).
 *
 * Construction: Thompson fragments straight from the parser; a bounded repetition parses its
 * atom again for each copy (the NFA's state limit bounds the total). Texts are UTF-8 without
 * surrogate code points, the texts a model can write: a set of code points becomes byte-range
 * paths by the usual split of code-point ranges into ranges of equal-length UTF-8 sequences. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "grammar/grammar_int.h"

#define RX_MAX_COUNT 1000 /* {n,m}: n and m at most this */
#define RX_MAX_WORK (1 << 22) /* pattern bytes parsed again for the copies of repetitions, at most */
#define RX_MAX_DEPTH 128  /* nested groups */
#define CP_MAX 0x10FFFF

typedef struct {
    int32_t lo, hi;
} cpr;

typedef struct {
    cpr *r;
    int n, cap;
    int oom;
} cpset;

typedef struct {
    g_nfa *n;
    const unsigned char *p, *start, *end;
    int spell, search;
    int depth;
    int failed;
    char *emsg;
    size_t emsg_cap;
    size_t work; /* bytes parsed again (atom_again) */
} rx_t;

static g_frag rx_err(rx_t *x, const unsigned char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static g_frag rx_err(rx_t *x, const unsigned char *at, const char *fmt, ...) {
    if (!x->failed && !x->n->failed) {
        char msg[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(x->emsg, x->emsg_cap, "%s (offset %ld)", msg, (long)(at - x->start));
    }
    x->failed = 1;
    return f_none();
}

static int rx_bad(const rx_t *x) { return x->failed || x->n->failed; }

/* ---- code-point sets ---- */

static void cs_add(cpset *s, int32_t lo, int32_t hi) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        cpr *r = realloc(s->r, (size_t)cap * sizeof *r);
        if (!r) { s->oom = 1; return; }
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n++] = (cpr){lo, hi};
}

static int cpr_cmp(const void *a, const void *b) {
    const cpr *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* sorted, overlapping and adjacent ranges merged */
static void cs_norm(cpset *s) {
    if (s->n < 2) return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, cpr_cmp);
    int k = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi) s->r[k].hi = s->r[i].hi;
        } else s->r[++k] = s->r[i];
    }
    s->n = k + 1;
}

/* the complement within [0, CP_MAX] */
static void cs_negate(cpset *s) {
    cs_norm(s);
    cpset o = {0};
    int32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next) cs_add(&o, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= CP_MAX) cs_add(&o, next, CP_MAX);
    o.oom |= s->oom;
    free(s->r);
    *s = o;
}

static void cs_free(cpset *s) {
    free(s->r);
    memset(s, 0, sizeof *s);
}

/* \d \w \s (ECMA-262: \s is WhiteSpace and LineTerminator) */
static void cs_class_escape(cpset *s, int c) {
    cpset t = {0};
    switch (c | 0x20) {
    case 'd': cs_add(&t, '0', '9'); break;
    case 'w':
        cs_add(&t, '0', '9');
        cs_add(&t, 'A', 'Z');
        cs_add(&t, '_', '_');
        cs_add(&t, 'a', 'z');
        break;
    default: {
        static const int32_t sp[][2] = {{0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                                        {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
        for (size_t i = 0; i < sizeof sp / sizeof *sp; i++) cs_add(&t, sp[i][0], sp[i][1]);
    }
    }
    if (c >= 'A' && c <= 'Z') cs_negate(&t);
    for (int i = 0; i < t.n; i++) cs_add(s, t.r[i].lo, t.r[i].hi);
    s->oom |= t.oom;
    cs_free(&t);
}

/* ---- code points -> bytes ---- */

/* paths s -> e spelling the code points lo..hi in UTF-8 (no surrogates in the range): split until
 * the range is a product of byte ranges (all of one length; below the first differing position
 * every continuation byte runs 80..BF). The paths of one set share their tails of k such full
 * continuation bytes (tail[k], made on first use): fewer NFA states, and fewer DFA states, since
 * the subset construction does not minimize. */
static void utf8_paths(g_nfa *n, int s, int e, uint32_t lo, uint32_t hi, int *tail) {
    static const uint32_t top[] = {0x7F, 0x7FF, 0xFFFF};
    if (lo > hi || n->failed) return;
    for (int i = 0; i < 3; i++)
        if (lo <= top[i] && hi > top[i]) {
            utf8_paths(n, s, e, lo, top[i], tail);
            utf8_paths(n, s, e, top[i] + 1, hi, tail);
            return;
        }
    uint8_t a[4], b[4];
    int len = m3_utf8_put(lo, (char *)a);
    for (int i = 1; i < len; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                utf8_paths(n, s, e, lo, lo | m, tail);
                utf8_paths(n, s, e, (lo | m) + 1, hi, tail);
                return;
            }
            if ((hi & m) != m) {
                utf8_paths(n, s, e, lo, (hi & ~m) - 1, tail);
                utf8_paths(n, s, e, hi & ~m, hi, tail);
                return;
            }
        }
    }
    m3_utf8_put(hi, (char *)b);
    int k = 0; /* full continuation bytes at the end */
    while (k < len - 1 && a[len - 1 - k] == 0x80 && b[len - 1 - k] == 0xBF) k++;
    for (int j = 1; j <= k; j++)
        if (tail[j] < 0) {
            tail[j] = nfa_state(n);
            nfa_edge(n, tail[j], E_BYTE, 0x80, 0xBF, j == 1 ? e : tail[j - 1], -1);
        }
    int cur = s;
    for (int i = 0; i < len - k; i++) {
        int nx = i == len - k - 1 ? (k ? tail[k] : e) : nfa_state(n);
        nfa_edge(n, cur, E_BYTE, a[i], b[i], nx, -1);
        cur = nx;
    }
}

void utf8_range_paths(g_nfa *n, int s, int e, uint32_t lo, uint32_t hi, int tail[4]) {
    if (lo <= 0xDFFF && hi >= 0xD800) { /* no surrogates */
        if (lo < 0xD800) utf8_paths(n, s, e, lo, 0xD7FF, tail);
        if (hi > 0xDFFF) utf8_paths(n, s, e, 0xE000, hi, tail);
        return;
    }
    utf8_paths(n, s, e, lo, hi, tail);
}

static void lit_path(g_nfa *n, int s, int e, const char *t) {
    int cur = s;
    for (size_t i = 0, L = strlen(t); i < L; i++) {
        int nx = i + 1 == L ? e : nfa_state(n);
        nfa_edge(n, cur, E_BYTE, (uint8_t)t[i], (uint8_t)t[i], nx, -1);
        cur = nx;
    }
}

/* code point c (< 0x20, '"' or '\') as JSON.stringify escapes it, a path s -> e */
static void json_escape_path(g_nfa *n, int s, int e, int c) {
    static const char *const shrt[32] = {[8] = "\\b", [9] = "\\t", [10] = "\\n", [12] = "\\f", [13] = "\\r"};
    char t[8];
    if (c == '"') lit_path(n, s, e, "\\\"");
    else if (c == '\\') lit_path(n, s, e, "\\\\");
    else if (shrt[c]) lit_path(n, s, e, shrt[c]);
    else {
        snprintf(t, sizeof t, "\\u%04x", c);
        lit_path(n, s, e, t);
    }
}

/* the fragment of one character of set s (normalized): its UTF-8 bytes, or (RX_JSON) its JSON
 * spelling; surrogates left out */
static g_frag f_cpset(rx_t *x, cpset *cs) {
    g_nfa *n = x->n;
    if (cs->oom) { /* the NFA's failure, as its own allocations' (err with oom, never a refused pattern) */
        nfa_oom(n);
        return f_none();
    }
    cs_norm(cs);
    int s = nfa_state(n), e = nfa_state(n), tail[4] = {-1, -1, -1, -1};
    if (e < 0) return f_none();
    for (int i = 0; i < cs->n && !n->failed; i++) {
        int32_t lo = cs->r[i].lo, hi = cs->r[i].hi;
        for (int32_t c = lo; x->spell == RX_JSON && c <= hi && c < 0x20; c++) json_escape_path(n, s, e, c);
        if (x->spell == RX_JSON && lo < 0x20) lo = 0x20;
        /* the rest in up to four pieces: around '"' and '\' (JSON) and the surrogates */
        int32_t cut[][2] = {{'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}};
        for (int k = 0; k < 3 && lo <= hi; k++) {
            if (k < 2 && x->spell != RX_JSON) continue;
            if (hi < cut[k][0] || lo > cut[k][1]) continue;
            if (lo < cut[k][0]) utf8_paths(n, s, e, (uint32_t)lo, (uint32_t)cut[k][0] - 1, tail);
            if (k < 2) json_escape_path(n, s, e, cut[k][0]);
            lo = cut[k][1] + 1;
        }
        if (lo <= hi) utf8_paths(n, s, e, (uint32_t)lo, (uint32_t)hi, tail);
    }
    return n->failed ? f_none() : (g_frag){s, e};
}

static g_frag f_cp(rx_t *x, int32_t c) {
    cpset s = {0};
    cs_add(&s, c, c);
    g_frag f = f_cpset(x, &s);
    cs_free(&s);
    return f;
}

g_frag cp_ranges_fragment(g_nfa *n, const int32_t *lohi, int nranges, int negate) {
    char msg[64];
    rx_t x = {.n = n, .spell = RX_TEXT, .emsg = msg, .emsg_cap = sizeof msg};
    cpset s = {0};
    for (int i = 0; i < nranges; i++) cs_add(&s, lohi[2 * i], lohi[2 * i + 1]);
    if (negate) cs_negate(&s);
    g_frag f = f_cpset(&x, &s); /* fails as the NFA (out of memory in the set too) */
    cs_free(&s);
    return f;
}

/* ---- the parser ---- */

static int peek(const rx_t *x) { return x->p < x->end ? *x->p : -1; }
static int peek2(const rx_t *x) { return x->p + 1 < x->end ? x->p[1] : -1; }

/* one code point of the pattern's UTF-8 (-1 on invalid UTF-8, with the error set) */
static int32_t next_cp(rx_t *x) {
    const unsigned char *p = x->p;
    uint32_t c = *p;
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || p + len > x->end) goto bad;
    if (len > 1) c &= 0x3F >> (len - 1);
    for (int i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) goto bad;
        c = c << 6 | (p[i] & 0x3F);
    }
    static const uint32_t minv[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < minv[len] || c > CP_MAX || (c >= 0xD800 && c <= 0xDFFF)) goto bad;
    x->p += len;
    return (int32_t)c;
bad:
    rx_err(x, p, "invalid UTF-8 in the pattern");
    return -1;
}


/* exactly k hex digits, or -1 (nothing consumed) */
static int32_t hex_k(rx_t *x, int k) {
    if (x->end - x->p < k) return -1;
    int32_t v = 0;
    for (int i = 0; i < k; i++) {
        int h = hexv(x->p[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    x->p += k;
    return v;
}

/* after "\u": HHHH (a surrogate pair \uHHHH\uHHHH joined) or {H...}; -1 on error */
static int32_t unicode_escape(rx_t *x, const unsigned char *at) {
    if (peek(x) == '{') {
        const unsigned char *q = ++x->p;
        uint32_t v = 0;
        while (x->p < x->end && hexv(*x->p) >= 0) {
            v = v * 16 + (uint32_t)hexv(*x->p++);
            if (v > CP_MAX) break;
        }
        if (x->p == q || v > CP_MAX || peek(x) != '}') {
            rx_err(x, at, "invalid unicode escape");
            return -1;
        }
        x->p++;
        return (int32_t)v;
    }
    int32_t v = hex_k(x, 4);
    if (v < 0) {
        rx_err(x, at, "invalid unicode escape");
        return -1;
    }
    if (v >= 0xD800 && v <= 0xDBFF && x->end - x->p >= 6 && x->p[0] == '\\' && x->p[1] == 'u') {
        const unsigned char *save = x->p;
        x->p += 2;
        int32_t lo = hex_k(x, 4);
        if (lo >= 0xDC00 && lo <= 0xDFFF) return 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
        x->p = save;
    }
    return v;
}

enum { ESC_CP, ESC_SET };

/* after '\': a code point (*cp) or a set added to *set; in_class: inside [...]. ESC_CP, ESC_SET,
 * or -1 on error */
static int escape(rx_t *x, int in_class, int32_t *cp, cpset *set) {
    const unsigned char *at = x->p - 1;
    int c = peek(x);
    if (c < 0) { rx_err(x, at, "\\ at the end of the pattern"); return -1; }
    x->p++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': cs_class_escape(set, c); return ESC_SET;
    case 't': *cp = 9; return ESC_CP;
    case 'n': *cp = 10; return ESC_CP;
    case 'v': *cp = 11; return ESC_CP;
    case 'f': *cp = 12; return ESC_CP;
    case 'r': *cp = 13; return ESC_CP;
    case '0':
        if (peek(x) >= '0' && peek(x) <= '9') break;
        *cp = 0;
        return ESC_CP;
    case 'c': {
        int l = peek(x);
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) break;
        x->p++;
        *cp = l % 32;
        return ESC_CP;
    }
    case 'x': {
        int32_t v = hex_k(x, 2);
        if (v < 0) break;
        *cp = v;
        return ESC_CP;
    }
    case 'u': {
        int32_t v = unicode_escape(x, at);
        if (v < 0) return -1;
        *cp = v; /* a lone surrogate matches nothing: no text holds one (f_cpset) */
        return ESC_CP;
    }
    case 'b':
        if (in_class) { *cp = 8; return ESC_CP; }
        rx_err(x, at, "\\b (a word boundary) is not supported");
        return -1;
    case 'B': rx_err(x, at, "\\B (not a word boundary) is not supported"); return -1;
    case 'p': case 'P': rx_err(x, at, "unicode property escapes (\\%c{...}) are not supported", c); return -1;
    case 'k': rx_err(x, at, "named backreferences (\\k<...>) are not supported"); return -1;
    case '-':
        if (!in_class) break;
        *cp = '-';
        return ESC_CP;
    default:
        if (c >= '1' && c <= '9') {
            rx_err(x, at, "backreferences (\\%c) are not supported", c);
            return -1;
        }
        if (strchr("^$\\.*+?()[]{}|/", c)) {
            *cp = c;
            return ESC_CP;
        }
    }
    rx_err(x, at, "invalid escape \\%c", c >= 0x20 && c < 0x7F ? c : '?');
    return -1;
}

/* [...] / [^...] after '[' */
static g_frag p_class(rx_t *x) {
    const unsigned char *at = x->p - 1;
    int neg = peek(x) == '^';
    if (neg) x->p++;
    cpset s = {0};
    while (!rx_bad(x)) {
        int c = peek(x);
        if (c < 0) { rx_err(x, at, "missing ] of a character class"); break; }
        if (c == ']') { x->p++; break; }
        int32_t a = -1, b = -1;
        int ka, kb;
        const unsigned char *ra = x->p;
        if (c == '\\') {
            x->p++;
            ka = escape(x, 1, &a, &s);
        } else {
            a = next_cp(x);
            ka = a < 0 ? -1 : ESC_CP;
        }
        if (ka < 0) break;
        if (peek(x) == '-' && peek2(x) >= 0 && peek2(x) != ']') {
            x->p++;
            if (peek(x) == '\\') {
                x->p++;
                kb = escape(x, 1, &b, &s);
            } else {
                b = next_cp(x);
                kb = b < 0 ? -1 : ESC_CP;
            }
            if (kb < 0) break;
            if (ka == ESC_SET || kb == ESC_SET) { rx_err(x, ra, "a class escape (\\d, \\w, \\s) as a range's end"); break; }
            if (a > b) { rx_err(x, ra, "range out of order in a character class"); break; }
            cs_add(&s, a, b);
        } else if (ka == ESC_CP) cs_add(&s, a, a);
    }
    if (rx_bad(x)) {
        cs_free(&s);
        return f_none();
    }
    if (neg) cs_negate(&s);
    g_frag f = f_cpset(x, &s);
    cs_free(&s);
    return f;
}

static g_frag p_disj(rx_t *x, int top);

/* one atom; the group or class it opens is parsed whole */
static g_frag p_atom(rx_t *x) {
    const unsigned char *at = x->p;
    int c = peek(x);
    switch (c) {
    case '(': {
        x->p++;
        if (peek(x) == '?') {
            int k = peek2(x);
            if (k == ':') x->p += 2;
            else if (k == '=' || k == '!') return rx_err(x, at, "lookahead (?%c...) is not supported", k);
            else if (k == '<' && x->p + 2 < x->end && (x->p[2] == '=' || x->p[2] == '!'))
                return rx_err(x, at, "lookbehind (?<%c...) is not supported", x->p[2]);
            else if (k == '<') {
                x->p += 2;
                const unsigned char *nm = x->p;
                while (x->p < x->end && (*x->p == '_' || *x->p == '$' || (*x->p >= 'a' && *x->p <= 'z') ||
                                         (*x->p >= 'A' && *x->p <= 'Z') || (x->p > nm && *x->p >= '0' && *x->p <= '9')))
                    x->p++;
                if (x->p == nm || peek(x) != '>') return rx_err(x, at, "invalid group name");
                x->p++;
            } else return rx_err(x, at, "invalid group (?%c", k >= 0x20 && k < 0x7F ? k : '?');
        }
        if (++x->depth > RX_MAX_DEPTH) return rx_err(x, at, "groups nested over %d deep", RX_MAX_DEPTH);
        g_frag f = p_disj(x, 0);
        x->depth--;
        if (rx_bad(x)) return f_none();
        if (peek(x) != ')') return rx_err(x, at, "missing ) of a group");
        x->p++;
        return f;
    }
    case '[': x->p++; return p_class(x);
    case '.': {
        x->p++;
        cpset s = {0};
        cs_add(&s, 0, 9);
        cs_add(&s, 11, 12);
        cs_add(&s, 14, 0x2027);
        cs_add(&s, 0x202A, CP_MAX);
        g_frag f = f_cpset(x, &s);
        cs_free(&s);
        return f;
    }
    case '\\': {
        x->p++;
        int32_t cp = 0;
        cpset s = {0};
        int k = escape(x, 0, &cp, &s);
        g_frag f = k == ESC_CP ? f_cp(x, cp) : k == ESC_SET ? f_cpset(x, &s) : f_none();
        cs_free(&s);
        return f;
    }
    case '*': case '+': case '?': return rx_err(x, at, "nothing to repeat before '%c'", c);
    case '{': case '}': case ']': return rx_err(x, at, "a lone '%c' (escape it as \\%c)", c, c);
    default: {
        int32_t cp = next_cp(x);
        return cp < 0 ? f_none() : f_cp(x, cp);
    }
    }
}

/* another copy of the atom at a (parsed again; x->p restored) */
static g_frag atom_again(rx_t *x, const unsigned char *a) {
    const unsigned char *save = x->p;
    int depth = x->depth;
    if ((x->work += (size_t)(save - a)) > RX_MAX_WORK) /* (a{1000}){1000} and the like: the NFA limit would come late */
        return rx_err(x, a, "too large (its repetitions copy over %d bytes of pattern)", RX_MAX_WORK);
    x->p = a;
    g_frag f = p_atom(x);
    x->p = save;
    x->depth = depth;
    return f;
}

typedef struct {
    rx_t *x;
    const unsigned char *a;
} rx_again;

static g_frag again_cb(void *ctx) {
    rx_again *g = ctx;
    return atom_again(g->x, g->a);
}

/* an atom and its quantifier */
static g_frag p_term(rx_t *x) {
    const unsigned char *a = x->p;
    g_frag f = p_atom(x);
    if (rx_bad(x)) return f_none();
    int c = peek(x);
    long lo, hi;
    const unsigned char *q = x->p;
    if (c == '*') lo = 0, hi = -1;
    else if (c == '+') lo = 1, hi = -1;
    else if (c == '?') lo = 0, hi = 1;
    else if (c == '{') {
        const char *r = (const char *)x->p + 1, *end = (const char *)x->end;
        lo = grammar_count(&r, end);
        hi = lo;
        if (lo >= 0 && r < end && *r == ',') {
            r++;
            hi = grammar_count(&r, end); /* -1: unbounded */
        }
        x->p = (const unsigned char *)r;
        if (lo < 0 || peek(x) != '}') return rx_err(x, q, "incomplete quantifier {");
        if (hi >= 0 && hi < lo) return rx_err(x, q, "numbers out of order in a {} quantifier");
        if (lo > RX_MAX_COUNT || hi > RX_MAX_COUNT) return rx_err(x, q, "a repetition count over %d", RX_MAX_COUNT);
    } else return f;
    x->p++;
    if (peek(x) == '?') x->p++; /* lazy: the same texts */
    rx_again ag = {x, a};
    g_frag out = f_repeat(x->n, f, lo, hi, again_cb, &ag);
    if (peek(x) == '*' || peek(x) == '+' || peek(x) == '?' || peek(x) == '{')
        return rx_err(x, x->p, "nothing to repeat before '%c'", peek(x));
    return rx_bad(x) ? f_none() : out;
}

/* any text (search mode's surroundings) */
static g_frag f_any_text(rx_t *x) {
    cpset s = {0};
    cs_add(&s, 0, CP_MAX);
    g_frag f = f_cpset(x, &s);
    cs_free(&s);
    return f_star(x->n, f);
}

/* alternatives separated by '|'; top: the pattern's own, where ^ / $ may anchor each. In search
 * mode the alternatives are gathered by their anchors (none, ^, $, both) and each group gets its
 * surrounding any-text once: a|b|c as .*(a|b|c).*, not .*a.*|.*b.*|.*c.*, whose DFA subsets
 * would carry every copy of .* */
static g_frag p_disj(rx_t *x, int top) {
    g_nfa *n = x->n;
    g_frag all = f_none(), grp[4] = {f_none(), f_none(), f_none(), f_none()};
    int any = 0, ing[4] = {0, 0, 0, 0};
    for (;;) {
        int as = 0, ae = 0;
        if (top && peek(x) == '^') {
            x->p++;
            as = 1;
        }
        g_frag f = f_eps(n);
        while (!rx_bad(x) && peek(x) >= 0 && peek(x) != '|' && peek(x) != ')') {
            int c = peek(x);
            if (c == '^') return rx_err(x, x->p, "'^' is supported only at the start of the pattern or of a top-level alternative");
            if (c == '$') {
                if (top && (peek2(x) < 0 || peek2(x) == '|')) {
                    x->p++;
                    ae = 1;
                    break;
                }
                return rx_err(x, x->p, "'$' is supported only at the end of the pattern or of a top-level alternative");
            }
            f = f_seq(n, f, p_term(x));
        }
        if (rx_bad(x)) return f_none();
        if (top && x->search) {
            int k = as + 2 * ae;
            grp[k] = ing[k] ? f_alt(n, grp[k], f) : f;
            ing[k] = 1;
        } else {
            all = any ? f_alt(n, all, f) : f;
            any = 1;
        }
        if (peek(x) != '|') break;
        x->p++;
    }
    for (int k = 0; k < 4 && top && x->search && !rx_bad(x); k++) {
        if (!ing[k]) continue;
        g_frag f = grp[k];
        if (!(k & 1)) f = f_seq(n, f_any_text(x), f);
        if (!(k & 2)) f = f_seq(n, f, f_any_text(x));
        all = any ? f_alt(n, all, f) : f;
        any = 1;
    }
    return rx_bad(x) ? f_none() : all;
}

g_frag regex_fragment(g_nfa *n, const char *re, size_t len, int spell, int search, char *emsg, size_t emsg_cap) {
    rx_t x = {.n = n, .p = (const unsigned char *)re, .start = (const unsigned char *)re, .end = (const unsigned char *)re + len,
              .spell = spell, .search = search, .emsg = emsg, .emsg_cap = emsg_cap};
    if (emsg_cap) emsg[0] = 0;
    g_frag f = p_disj(&x, 1);
    if (!rx_bad(&x) && x.p < x.end) rx_err(&x, x.p, "unmatched )");
    return rx_bad(&x) ? f_none() : f;
}

m3_grammar *m3_grammar_from_regex(const char *re, size_t len, const m3_grammar_opts *opts, m3_err *err) {
    m3_grammar_opts o;
    if (grammar_opts_check(opts, &o, err)) return NULL;
    g_nfa n = {0};
    n.max_states = G_MAX_NFA_STATES;
    n.err = err;
    n.what = "regex";
    int r0 = nfa_rule_new(&n);
    char emsg[256];
    g_frag f = regex_fragment(&n, re, len, RX_TEXT, 0, emsg, sizeof emsg);
    m3_grammar *g = NULL;
    if (f.s < 0 && emsg[0]) m3_errf(err, "regex: %s", emsg);
    else if (!n.failed && f.s >= 0) {
        nfa_rule_set(&n, r0, f);
        g = grammar_build(&n, r0, o.max_depth, o.max_states, err);
    }
    nfa_free(&n);
    return g;
}
