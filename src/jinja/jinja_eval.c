/* Jinja runtime: values, scopes, operators, filters, tests, methods, rendering.
 * Every value of a render lives in one arena (freed at the end); runtime errors longjmp
 * to m3_jinja_render with "NAME: line L, column C: message". */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "jinja/jinja_int.h"

typedef struct frame {
    struct frame *parent;
    jdict vars;
} frame;

enum { F_GLOBAL, F_METHOD, F_MACRO, F_CALLER, F_CYCLE };

struct jfunc {
    int kind;
    const char *name;
    jv self;
    const jnode *def;   /* macro / call block */
    frame *closure;
    jv caller;       /* for macros invoked through {% call %} */
};

typedef struct rt {
    jarena A;
    jmp_buf jb;
    m3_err *err;
    const char *name;
    char *out;
    size_t on, ocap;
    size_t max_out, steps, max_steps;
    int depth, max_depth;
    int ctl; /* 1 break, 2 continue */
} rt;

static void rfail(rt *R, const jnode *at, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
static void rfail(rt *R, const jnode *at, const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) m3_errf(R->err, "%s: line %d, column %d: %s", R->name, at->line, at->col, msg);
    else m3_errf(R->err, "%s: %s", R->name, msg);
    longjmp(R->jb, 1);
}

static void step(rt *R, const jnode *at) {
    if (++R->steps > R->max_steps) rfail(R, at, "template ran more than %zu steps", R->max_steps);
}

/* ---- value constructors */
static jv v_undef(const char *name) { jv v = {0}; v.t = JV_UNDEF; v.u.s.p = name; return v; }
static jv v_none(void) { jv v = {0}; v.t = JV_NONE; return v; }
static jv v_bool(int b) { jv v = {0}; v.t = JV_BOOL; v.u.b = !!b; return v; }
static jv v_int(int64_t i) { jv v = {0}; v.t = JV_INT; v.u.i = i; return v; }
static jv v_float(double f) { jv v = {0}; v.t = JV_FLOAT; v.u.f = f; return v; }
static jv v_strn(const char *p, size_t n) { jv v = {0}; v.t = JV_STR; v.u.s.p = p; v.u.s.n = n; return v; }
static jv v_str(const char *p) { return v_strn(p, strlen(p)); }
static jv v_strdup(rt *R, const char *p, size_t n) { return v_strn(ja_strndup(&R->A, p, n), n); }
static jv v_list(rt *R, size_t cap) {
    jv v = {0};
    v.t = JV_LIST;
    v.u.l = ja_alloc(&R->A, sizeof(jlist));
    if (cap) { v.u.l->v = ja_alloc(&R->A, cap * sizeof(jv)); v.u.l->cap = cap; }
    return v;
}
static jv v_dict(rt *R) {
    jv v = {0};
    v.t = JV_DICT;
    v.u.d = ja_alloc(&R->A, sizeof(jdict));
    return v;
}
static jv v_func(rt *R, int kind, const char *name) {
    jv v = {0};
    v.t = JV_FUNC;
    v.u.fn = ja_alloc(&R->A, sizeof(jfunc));
    v.u.fn->kind = kind;
    v.u.fn->name = name;
    return v;
}

static void l_push(rt *R, jlist *l, jv x) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jv *nv = ja_alloc(&R->A, nc * sizeof(jv));
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}

static int str_eq(jv a, const char *s) { return a.t == JV_STR && a.u.s.n == strlen(s) && !memcmp(a.u.s.p, s, a.u.s.n); }

static int v_eq(jv a, jv b);
static jv *d_find(jdict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (v_eq(d->k[i], key)) return &d->v[i];
    return NULL;
}
static jv *d_finds(jdict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, key, n)) return &d->v[i];
    return NULL;
}
static void d_set(rt *R, jdict *d, jv key, jv val) {
    jv *p = d_find(d, key);
    if (p) { *p = val; return; }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jv *nk = ja_alloc(&R->A, nc * sizeof(jv)), *nv = ja_alloc(&R->A, nc * sizeof(jv));
        if (d->n) { memcpy(nk, d->k, d->n * sizeof(jv)); memcpy(nv, d->v, d->n * sizeof(jv)); }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = key;
    d->v[d->n++] = val;
}
static void d_sets(rt *R, jdict *d, const char *key, jv val) { d_set(R, d, v_str(key), val); }

/* ---- JSON in */
static jv from_json(rt *R, const json_t *j, int depth) {
    if (depth > 1000) rfail(R, NULL, "context JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv d = v_dict(R);
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)j, k, x) d_set(R, d.u.d, v_str(k), from_json(R, x, depth + 1));
        return d;
    }
    case JSON_ARRAY: {
        jv l = v_list(R, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) l_push(R, l.u.l, from_json(R, json_array_get(j, i), depth + 1));
        return l;
    }
    case JSON_STRING: return v_strn(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return v_int((int64_t)json_integer_value(j));
    case JSON_REAL: return v_float(json_real_value(j));
    case JSON_TRUE: return v_bool(1);
    case JSON_FALSE: return v_bool(0);
    default: return v_none();
    }
}

/* ---- string building */
typedef struct sb { char *p; size_t n, cap; } sb;
static void sb_put(rt *R, sb *b, const char *s, size_t n) {
    if (b->n + n > R->max_out) rfail(R, NULL, "rendered text longer than %zu bytes", R->max_out);
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = ja_alloc(&R->A, nc);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_puts(rt *R, sb *b, const char *s) { sb_put(R, b, s, strlen(s)); }
static jv sb_val(sb *b) { return b->p ? v_strn(b->p, b->n) : v_strn("", 0); }

static void emit(rt *R, const char *s, size_t n) {
    sb b = {R->out, R->on, R->ocap};
    sb_put(R, &b, s, n);
    R->out = b.p;
    R->on = b.n;
    R->ocap = b.cap;
}

/* Python repr of a float: shortest round-trip digits, exponent form outside [1e-4, 1e16) */
static void fmt_float(double f, char *o, size_t on) {
    if (isnan(f)) { snprintf(o, on, "nan"); return; }
    if (isinf(f)) { snprintf(o, on, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { snprintf(o, on, signbit(f) ? "-0.0" : "0.0"); return; }
    char buf[64];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf = [-]d.ddde[+-]XX */
    const char *s = buf;
    int neg = 0;
    if (*s == '-') { neg = 1; s++; }
    char dig[32];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') dig[nd++] = *s;
    int ex = atoi(s + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    char *w = o;
    size_t cap = on;
#define PUTC(c) do { if ((size_t)(w - o) + 1 < cap) *w++ = (c); } while (0)
    if (neg) PUTC('-');
    if (ex < -4 || ex >= 16) {
        PUTC(dig[0]);
        if (nd > 1) { PUTC('.'); for (int i = 1; i < nd; i++) PUTC(dig[i]); }
        char e[16];
        snprintf(e, sizeof e, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
        for (char *q = e; *q; q++) PUTC(*q);
    } else if (ex < 0) {
        PUTC('0'); PUTC('.');
        for (int i = 0; i < -ex - 1; i++) PUTC('0');
        for (int i = 0; i < nd; i++) PUTC(dig[i]);
    } else {
        for (int i = 0; i <= ex; i++) PUTC(i < nd ? dig[i] : '0');
        PUTC('.');
        if (nd > ex + 1) for (int i = ex + 1; i < nd; i++) PUTC(dig[i]);
        else PUTC('0');
    }
#undef PUTC
    *w = 0;
}

static void repr(rt *R, sb *b, jv v, int depth);
static void py_str_repr(rt *R, sb *b, const char *p, size_t n) {
    int has_s = memchr(p, '\'', n) != NULL, has_d = memchr(p, '"', n) != NULL;
    char q = has_s && !has_d ? '"' : '\'';
    sb_put(R, b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char e[8];
        if (c == '\\') sb_puts(R, b, "\\\\");
        else if (c == (unsigned char)q) { e[0] = '\\'; e[1] = (char)q; sb_put(R, b, e, 2); }
        else if (c == '\n') sb_puts(R, b, "\\n");
        else if (c == '\r') sb_puts(R, b, "\\r");
        else if (c == '\t') sb_puts(R, b, "\\t");
        else if (c < 0x20 || c == 0x7f) { snprintf(e, sizeof e, "\\x%02x", c); sb_puts(R, b, e); }
        else sb_put(R, b, (const char *)&c, 1);
    }
    sb_put(R, b, &q, 1);
}

/* str(v) as Python would print it */
static void to_str_sb(rt *R, sb *b, jv v, int depth) {
    char buf[64];
    switch (v.t) {
    case JV_UNDEF: break;
    case JV_NONE: sb_puts(R, b, "None"); break;
    case JV_BOOL: sb_puts(R, b, v.u.b ? "True" : "False"); break;
    case JV_INT: snprintf(buf, sizeof buf, "%lld", (long long)v.u.i); sb_puts(R, b, buf); break;
    case JV_FLOAT: fmt_float(v.u.f, buf, sizeof buf); sb_puts(R, b, buf); break;
    case JV_STR: sb_put(R, b, v.u.s.p, v.u.s.n); break;
    default: repr(R, b, v, depth); break;
    }
}
static void repr(rt *R, sb *b, jv v, int depth) {
    if (depth > 100) rfail(R, NULL, "value nested too deeply to print");
    switch (v.t) {
    case JV_STR: py_str_repr(R, b, v.u.s.p, v.u.s.n); break;
    case JV_UNDEF: break;
    case JV_LIST:
        sb_puts(R, b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_puts(R, b, ", ");
            repr(R, b, v.u.l->v[i], depth + 1);
        }
        sb_puts(R, b, "]");
        break;
    case JV_DICT:
        if (v.u.d->ns) sb_puts(R, b, "<Namespace ");
        sb_puts(R, b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) sb_puts(R, b, ", ");
            repr(R, b, v.u.d->k[i], depth + 1);
            sb_puts(R, b, ": ");
            repr(R, b, v.u.d->v[i], depth + 1);
        }
        sb_puts(R, b, "}");
        if (v.u.d->ns) sb_puts(R, b, ">");
        break;
    case JV_FUNC: sb_puts(R, b, "<function "); sb_puts(R, b, v.u.fn->name ? v.u.fn->name : "?"); sb_puts(R, b, ">"); break;
    default: to_str_sb(R, b, v, depth); break;
    }
}
static jv to_str(rt *R, jv v) {
    if (v.t == JV_STR) return v;
    sb b = {0};
    to_str_sb(R, &b, v, 0);
    return sb_val(&b);
}

/* json.dumps(v, ensure_ascii=False, indent=indent, separators=(", "|",", ": "), sort_keys) */
static void json_str(rt *R, sb *b, const char *p, size_t n) {
    sb_puts(R, b, "\"");
    size_t s = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        const char *e = NULL;
        char u[8];
        if (c == '"') e = "\\\"";
        else if (c == '\\') e = "\\\\";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (c == '\b') e = "\\b";
        else if (c == '\f') e = "\\f";
        else if (c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); e = u; }
        if (e) {
            sb_put(R, b, p + s, i - s);
            sb_puts(R, b, e);
            s = i + 1;
        }
    }
    sb_put(R, b, p + s, n - s);
    sb_puts(R, b, "\"");
}
/* ensure_ascii=True: non-ASCII code points as \uXXXX (UTF-16 surrogate pairs above the BMP) */
static sb ascii_escape(rt *R, sb in) {
    sb o = {0};
    const unsigned char *p = (const unsigned char *)in.p;
    for (size_t i = 0; i < in.n;) {
        unsigned char c = p[i];
        if (c < 0x80) { sb_put(R, &o, (const char *)p + i, 1); i++; continue; }
        int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (i + (size_t)len > in.n) len = (int)(in.n - i);
        uint32_t cp = len == 4 ? c & 7 : len == 3 ? c & 15 : c & 31;
        for (int k = 1; k < len; k++) cp = (cp << 6) | (p[i + k] & 63);
        char u[16];
        if (cp >= 0x10000) {
            cp -= 0x10000;
            snprintf(u, sizeof u, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
        } else snprintf(u, sizeof u, "\\u%04x", cp);
        sb_puts(R, &o, u);
        i += (size_t)len;
    }
    return o;
}
static int cmp_keys_str(jv a, jv b);
static void sort_idx(rt *R, size_t *idx, size_t n, int (*cmp)(rt *, void *, size_t, size_t), void *ctx);
static int dict_key_cmp(rt *R, void *ctx, size_t a, size_t b) {
    (void)R;
    jdict *d = ctx;
    return cmp_keys_str(d->k[a], d->k[b]);
}
static void to_json(rt *R, sb *b, jv v, int indent, const char *isep, const char *ksep, int sort_keys, int depth, const jnode *at) {
    if (depth > 100) rfail(R, at, "tojson: value nested too deeply");
    char buf[64];
    switch (v.t) {
    case JV_UNDEF: /* jinja2 raises on Undefined; the JS port writes null */
    case JV_NONE: sb_puts(R, b, "null"); return;
    case JV_BOOL: sb_puts(R, b, v.u.b ? "true" : "false"); return;
    case JV_INT: snprintf(buf, sizeof buf, "%lld", (long long)v.u.i); sb_puts(R, b, buf); return;
    case JV_FLOAT:
        if (isnan(v.u.f)) sb_puts(R, b, "NaN");
        else if (isinf(v.u.f)) sb_puts(R, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else { fmt_float(v.u.f, buf, sizeof buf); sb_puts(R, b, buf); }
        return;
    case JV_STR: json_str(R, b, v.u.s.p, v.u.s.n); return;
    case JV_LIST:
    case JV_DICT: {
        int isl = v.t == JV_LIST;
        size_t n = isl ? v.u.l->n : v.u.d->n;
        sb_puts(R, b, isl ? "[" : "{");
        if (n == 0) { sb_puts(R, b, isl ? "]" : "}"); return; }
        size_t *idx = ja_alloc(&R->A, n * sizeof(size_t));
        for (size_t i = 0; i < n; i++) idx[i] = i;
        if (!isl && sort_keys) sort_idx(R, idx, n, dict_key_cmp, v.u.d);
        for (size_t i = 0; i < n; i++) {
            if (i) sb_puts(R, b, isep);
            if (indent >= 0) {
                sb_puts(R, b, "\n");
                for (int q = 0; q < indent * (depth + 1); q++) sb_puts(R, b, " ");
            }
            if (isl) to_json(R, b, v.u.l->v[idx[i]], indent, isep, ksep, sort_keys, depth + 1, at);
            else {
                jv k = v.u.d->k[idx[i]];
                if (k.t == JV_STR) json_str(R, b, k.u.s.p, k.u.s.n);
                else {
                    sb kb = {0};
                    to_str_sb(R, &kb, k, 0);
                    if (k.t == JV_BOOL) kb = (sb){0}, sb_puts(R, &kb, k.u.b ? "true" : "false");
                    if (k.t == JV_NONE) kb = (sb){0}, sb_puts(R, &kb, "null");
                    json_str(R, b, kb.p ? kb.p : "", kb.n);
                }
                sb_puts(R, b, ksep);
                to_json(R, b, v.u.d->v[idx[i]], indent, isep, ksep, sort_keys, depth + 1, at);
            }
        }
        if (indent >= 0) {
            sb_puts(R, b, "\n");
            for (int q = 0; q < indent * depth; q++) sb_puts(R, b, " ");
        }
        sb_puts(R, b, isl ? "]" : "}");
        return;
    }
    default: rfail(R, at, "tojson: cannot serialize a function");
    }
}

/* ---- truthiness, equality, ordering */
static int truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->ns || v.u.d->n != 0;
    default: return 1;
    }
}
static int is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num(jv v) { return v.t == JV_INT ? (double)v.u.i : v.t == JV_FLOAT ? v.u.f : (double)v.u.b; }
static int64_t inum(jv v) { return v.t == JV_INT ? v.u.i : v.t == JV_BOOL ? v.u.b : (int64_t)v.u.f; }

static int v_eq(jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return inum(a) == inum(b);
        return num(a) == num(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!v_eq(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d == b.u.d) return 1;
        if (a.u.d->n != b.u.d->n || a.u.d->ns || b.u.d->ns) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = d_find(b.u.d, a.u.d->k[i]);
            if (!o || !v_eq(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}
static int cmp_keys_str(jv a, jv b) {
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        return c ? c : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    return 0;
}
static const char *tname(jv v) {
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "function"};
    return names[v.t];
}
/* Python ordering; errors on incomparable types */
static int v_cmp(rt *R, const jnode *at, jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (inum(a) > inum(b)) - (inum(a) < inum(b));
        return (num(a) > num(b)) - (num(a) < num(b));
    }
    if (a.t == JV_STR && b.t == JV_STR) return cmp_keys_str(a, b);
    if (a.t == JV_LIST && b.t == JV_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (v_eq(a.u.l->v[i], b.u.l->v[i])) continue;
            return v_cmp(R, at, a.u.l->v[i], b.u.l->v[i]);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    rfail(R, at, "'<' not supported between instances of '%s' and '%s'", tname(a), tname(b));
}

/* stable merge sort of an index array */
static void sort_idx(rt *R, size_t *idx, size_t n, int (*cmp)(rt *, void *, size_t, size_t), void *ctx) {
    if (n < 2) return;
    size_t *tmp = ja_alloc(&R->A, n * sizeof(size_t));
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = cmp(R, ctx, idx[j], idx[i]) < 0 ? idx[j++] : idx[i++];
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof(size_t));
    }
}

/* ---- UTF-8 helpers */
static size_t u8_len(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}
/* byte offsets of each code point (plus n at the end) */
static size_t *u8_offsets(rt *R, const char *p, size_t n, size_t *count) {
    size_t c = u8_len(p, n);
    size_t *o = ja_alloc(&R->A, (c + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80) o[k++] = i;
    o[k] = n;
    *count = c;
    return o;
}

/* ---- scopes */
static jv *lookup(frame *f, const char *name) {
    size_t n = strlen(name);
    for (; f; f = f->parent) {
        jv *v = d_finds(&f->vars, name, n);
        if (v) return v;
    }
    return NULL;
}
static frame *new_frame(rt *R, frame *parent) {
    frame *f = ja_alloc(&R->A, sizeof(frame));
    f->parent = parent;
    return f;
}

static jv eval(rt *R, frame *f, const jnode *n);
static void exec_body(rt *R, frame *f, const jnode *b);

/* ---- attribute / item access */
static const char *const str_methods[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper",
    "lower", "replace", "find", "rfind", "count", "title", "capitalize", "format", "join", "splitlines", "isdigit",
    "isalpha", "isalnum", "isspace", "islower", "isupper", "index", NULL};
static const char *const dict_methods[] = {"get", "keys", "values", "items", NULL};
static int in_set(const char *const *set, const char *s) {
    for (; *set; set++)
        if (!strcmp(*set, s)) return 1;
    return 0;
}
static jv method(rt *R, jv self, const char *name) {
    jv m = v_func(R, F_METHOD, name);
    m.u.fn->self = self;
    return m;
}

static jv get_attr(rt *R, jv obj, const char *name) {
    if (obj.t == JV_DICT) {
        if (!obj.u.d->ns && in_set(dict_methods, name)) return method(R, obj, name);
        jv *v = d_finds(obj.u.d, name, strlen(name));
        return v ? *v : v_undef(name);
    }
    if (obj.t == JV_STR && in_set(str_methods, name)) return method(R, obj, name);
    return v_undef(name);
}

static jv get_item(rt *R, const jnode *at, jv obj, jv key) {
    if (obj.t == JV_DICT) {
        jv *v = d_find(obj.u.d, key);
        if (v) return *v;
        if (key.t == JV_STR && !obj.u.d->ns && in_set(dict_methods, key.u.s.p) && strlen(key.u.s.p) == key.u.s.n) return method(R, obj, key.u.s.p);
        return v_undef(NULL);
    }
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t i = inum(key);
        if (obj.t == JV_LIST) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            return i >= 0 && i < n ? obj.u.l->v[i] : v_undef(NULL);
        }
        size_t cnt;
        size_t *o = u8_offsets(R, obj.u.s.p, obj.u.s.n, &cnt);
        if (i < 0) i += (int64_t)cnt;
        if (i < 0 || i >= (int64_t)cnt) return v_undef(NULL);
        return v_strn(obj.u.s.p + o[i], o[i + 1] - o[i]);
    }
    if (key.t == JV_STR && obj.t == JV_STR) {
        char nm[32];
        if (key.u.s.n < sizeof nm) {
            memcpy(nm, key.u.s.p, key.u.s.n);
            nm[key.u.s.n] = 0;
            return get_attr(R, obj, ja_strndup(&R->A, nm, key.u.s.n));
        }
    }
    (void)at;
    return v_undef(NULL);
}

static int64_t slice_norm(int64_t i, int64_t n, int step_neg, int is_start, int has) {
    if (!has) return is_start ? (step_neg ? n - 1 : 0) : (step_neg ? -1 : n);
    if (i < 0) { i += n; if (i < 0) i = step_neg ? -1 : 0; }
    else if (i >= n) i = step_neg ? n - 1 : n;
    return i;
}
static jv do_slice(rt *R, const jnode *at, jv obj, jv a, jv b, jv c) {
    int64_t st = 1;
    if (c.t != JV_UNDEF && c.t != JV_NONE) {
        if (c.t != JV_INT) rfail(R, at, "slice indices must be integers");
        st = c.u.i;
        if (st == 0) rfail(R, at, "slice step cannot be zero");
    }
    int has_a = a.t != JV_UNDEF && a.t != JV_NONE, has_b = b.t != JV_UNDEF && b.t != JV_NONE;
    if ((has_a && a.t != JV_INT && a.t != JV_BOOL) || (has_b && b.t != JV_INT && b.t != JV_BOOL)) rfail(R, at, "slice indices must be integers");
    size_t cnt;
    size_t *o = NULL;
    if (obj.t == JV_STR) o = u8_offsets(R, obj.u.s.p, obj.u.s.n, &cnt);
    else if (obj.t == JV_LIST) cnt = obj.u.l->n;
    else if (obj.t == JV_UNDEF) return v_undef(NULL);
    else rfail(R, at, "'%s' object is not subscriptable", tname(obj));
    int64_t n = (int64_t)cnt;
    int64_t s = slice_norm(has_a ? inum(a) : 0, n, st < 0, 1, has_a);
    int64_t e = slice_norm(has_b ? inum(b) : 0, n, st < 0, 0, has_b);
    if (obj.t == JV_LIST) {
        jv l = v_list(R, 0);
        for (int64_t i = s; st > 0 ? i < e : i > e; i += st) l_push(R, l.u.l, obj.u.l->v[i]);
        return l;
    }
    sb out = {0};
    if (st == 1) { if (e > s) sb_put(R, &out, obj.u.s.p + o[s], o[e] - o[s]); }
    else for (int64_t i = s; st > 0 ? i < e : i > e; i += st) sb_put(R, &out, obj.u.s.p + o[i], o[i + 1] - o[i]);
    return sb_val(&out);
}

/* ---- iteration */
static jv as_list(rt *R, const jnode *at, jv v) {
    if (v.t == JV_LIST) return v;
    if (v.t == JV_UNDEF) return v_list(R, 0);
    if (v.t == JV_DICT) {
        jv l = v_list(R, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) l_push(R, l.u.l, v.u.d->k[i]);
        return l;
    }
    if (v.t == JV_STR) {
        size_t cnt;
        size_t *o = u8_offsets(R, v.u.s.p, v.u.s.n, &cnt);
        jv l = v_list(R, cnt);
        for (size_t i = 0; i < cnt; i++) l_push(R, l.u.l, v_strn(v.u.s.p + o[i], o[i + 1] - o[i]));
        return l;
    }
    rfail(R, at, "'%s' object is not iterable", tname(v));
}
static jv pair(rt *R, jv a, jv b) {
    jv p = v_list(R, 2);
    l_push(R, p.u.l, a);
    l_push(R, p.u.l, b);
    return p;
}
static jv dict_items(rt *R, jdict *d) {
    jv l = v_list(R, d->n);
    for (size_t i = 0; i < d->n; i++) l_push(R, l.u.l, pair(R, d->k[i], d->v[i]));
    return l;
}

/* ---- arguments */
typedef struct args {
    jv *pos;
    int npos;
    const char **names;
    jv *kw;
    int nkw;
} args;

static jv arg(args *A, int i, const char *name, jv def) {
    if (i >= 0 && i < A->npos) return A->pos[i];
    for (int k = 0; k < A->nkw; k++)
        if (name && !strcmp(A->names[k], name)) return A->kw[k];
    return def;
}
static int has_arg(args *A, int i, const char *name) {
    jv u = v_undef(NULL);
    u.u.s.p = "\x01";
    jv v = arg(A, i, name, u);
    return !(v.t == JV_UNDEF && v.u.s.p && v.u.s.p[0] == 1);
}

static void eval_args(rt *R, frame *f, const jnode *n, args *A, jv *first) {
    int extra = first ? 1 : 0;
    A->npos = n->nlist + extra;
    A->pos = ja_alloc(&R->A, (size_t)(A->npos + 1) * sizeof(jv));
    if (first) A->pos[0] = *first;
    for (int i = 0; i < n->nlist; i++) A->pos[i + extra] = eval(R, f, n->list[i]);
    A->nkw = n->nlist2;
    A->names = n->names;
    A->kw = ja_alloc(&R->A, (size_t)(A->nkw + 1) * sizeof(jv));
    for (int i = 0; i < n->nlist2; i++) A->kw[i] = eval(R, f, n->list2[i]);
}

static jv need_str(rt *R, const jnode *at, jv v, const char *what) {
    if (v.t == JV_STR) return v;
    rfail(R, at, "%s: expected a string, got %s", what, tname(v));
}

/* ---- string methods */
static int in_chars(const char *chars, size_t nc, const char *p, size_t clen) {
    /* is the code point p[0..clen) one of chars? */
    for (size_t i = 0; i < nc;) {
        size_t l = 1;
        while (i + l < nc && ((unsigned char)chars[i + l] & 0xC0) == 0x80) l++;
        if (l == clen && !memcmp(chars + i, p, l)) return 1;
        i += l;
    }
    return 0;
}
static int py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }
static size_t u8_dec(const char *p, size_t n, int32_t *cp);
/* Python's str.isspace() code points (what strip(), split() and the trim filter remove; the
 * \s of Python's re): ASCII's plus U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029,
 * U+202F, U+205F and U+3000. Not U+FEFF, which JavaScript's trim removes too. */
static int py_space_cp(int32_t c) {
    if (c < 128) return py_space((unsigned char)c);
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}
/* bytes of the whitespace code point starting at p[0] (0: none) */
static size_t space_at(const char *p, size_t n) {
    if (!n) return 0;
    if ((unsigned char)p[0] < 128) return py_space((unsigned char)p[0]);
    int32_t c;
    size_t l = u8_dec(p, n, &c);
    return py_space_cp(c) ? l : 0;
}
static size_t u8_step(const char *p, size_t n) {
    int32_t c;
    return u8_dec(p, n, &c);
}
/* bytes of the code point ending at p[n-1], n > 0 (1 for a byte of invalid UTF-8) */
static size_t u8_back(const char *p, size_t n, int32_t *cp) {
    size_t st = n - 1;
    while (st > 0 && n - st < 4 && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
    if (u8_dec(p + st, n - st, cp) == n - st) return n - st;
    *cp = (unsigned char)p[n - 1];
    return 1;
}
/* bytes of the whitespace code point ending at p[n-1] (0: none) */
static size_t space_before(const char *p, size_t n) {
    if (!n) return 0;
    if ((unsigned char)p[n - 1] < 128) return py_space((unsigned char)p[n - 1]);
    int32_t c;
    size_t l = u8_back(p, n, &c);
    return l > 1 && py_space_cp(c) ? l : 0;
}
static jv str_strip(rt *R, jv s, jv chars, int left, int right) {
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    if (chars.t == JV_STR) {
        while (left && a < b) {
            size_t l = 1;
            while (a + l < b && ((unsigned char)p[a + l] & 0xC0) == 0x80) l++;
            if (!in_chars(chars.u.s.p, chars.u.s.n, p + a, l)) break;
            a += l;
        }
        while (right && b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            if (!in_chars(chars.u.s.p, chars.u.s.n, p + st, b - st)) break;
            b = st;
        }
    } else {
        size_t l;
        while (left && a < b && (l = space_at(p + a, b - a))) a += l;
        while (right && b > a && (l = space_before(p + a, b - a))) b -= l;
    }
    (void)R;
    return v_strn(p + a, b - a);
}
static size_t u8_dec(const char *p, size_t n, int32_t *cp) {
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n, cp);
    if (l <= 0) { *cp = (unsigned char)p[0]; return 1; }
    return (size_t)l;
}
static int cased(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}
/* 0 upper, 1 lower, 2 str.title, 3 first code point to title case (capitalize after lower),
 * 4 jinja2's title filter (words split at whitespace and -({[<) */
static jv str_case(rt *R, jv s, int mode) {
    sb b = {0};
    int prev = 0, first = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        int32_t c, m;
        size_t l = u8_dec(s.u.s.p + i, s.u.s.n - i, &c);
        if (mode == 0) m = utf8proc_toupper(c);
        else if (mode == 1) m = utf8proc_tolower(c);
        else if (mode == 2) {
            m = cased(c) ? (prev ? utf8proc_tolower(c) : utf8proc_totitle(c)) : c;
            prev = cased(c);
        } else if (mode == 3) m = first ? utf8proc_totitle(c) : c;
        else {
            int sep = py_space_cp(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
            m = sep ? c : prev ? utf8proc_tolower(c) : utf8proc_toupper(c);
            prev = !sep;
        }
        first = 0;
        if (m == c) sb_put(R, &b, s.u.s.p + i, l);
        else {
            utf8proc_uint8_t o[4];
            utf8proc_ssize_t k = utf8proc_encode_char(m, o);
            sb_put(R, &b, (const char *)o, (size_t)k);
        }
        i += l;
    }
    return sb_val(&b);
}
static jv str_replace(rt *R, jv s, jv old, jv nw, int64_t count) {
    sb b = {0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, on = old.u.s.n;
    if (on == 0) { /* Python inserts between every code point */
        size_t cnt;
        size_t *o = u8_offsets(R, p, n, &cnt);
        int64_t done = 0;
        for (size_t i = 0; i <= cnt; i++) {
            if (count < 0 || done < count) { sb_put(R, &b, nw.u.s.p, nw.u.s.n); done++; }
            if (i < cnt) sb_put(R, &b, p + o[i], o[i + 1] - o[i]);
        }
        return sb_val(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i < n) {
        if ((count < 0 || done < count) && n - i >= on && !memcmp(p + i, old.u.s.p, on)) {
            sb_put(R, &b, nw.u.s.p, nw.u.s.n);
            i += on;
            done++;
        } else sb_put(R, &b, p + i++, 1);
    }
    return sb_val(&b);
}
static const char *memfind(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && !memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}
static jv str_split(rt *R, const jnode *at, jv s, jv sep, int64_t maxsplit) {
    jv l = v_list(R, 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.t == JV_STR) {
        if (sep.u.s.n == 0) rfail(R, at, "split: empty separator");
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *q = (maxsplit < 0 || done < maxsplit) ? memfind(p + i, n - i, sep.u.s.p, sep.u.s.n) : NULL;
            if (!q) { l_push(R, l.u.l, v_strn(p + i, n - i)); break; }
            l_push(R, l.u.l, v_strn(p + i, (size_t)(q - (p + i))));
            i = (size_t)(q - p) + sep.u.s.n;
            done++;
        }
        return l;
    }
    size_t i = 0;
    int64_t done = 0;
    for (;;) {
        size_t w;
        while (i < n && (w = space_at(p + i, n - i))) i += w;
        if (i >= n) break;
        if (maxsplit >= 0 && done >= maxsplit) { /* the rest, trailing whitespace kept (Python) */
            l_push(R, l.u.l, v_strn(p + i, n - i));
            break;
        }
        size_t j = i;
        while (j < n && !space_at(p + j, n - j)) j += u8_step(p + j, n - j);
        l_push(R, l.u.l, v_strn(p + i, j - i));
        done++;
        i = j;
    }
    return l;
}
static int64_t cp_index(const char *p, size_t byte_off) { return (int64_t)u8_len(p, byte_off); }

static jv call_value(rt *R, frame *f, const jnode *at, jv fn, args *A);

static jv str_method(rt *R, const jnode *at, jv self, const char *m, args *A) {
    jv s = self;
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        jv chars = arg(A, 0, "chars", v_none());
        return str_strip(R, s, chars, m[0] != 'r', m[0] != 'l');
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        jv sep = arg(A, 0, "sep", v_none());
        jv mx = arg(A, 1, "maxsplit", v_int(-1));
        if (!strcmp(m, "rsplit") && inum(mx) >= 0) { /* rsplit with a limit: split from the right */
            jv all = str_split(R, at, s, sep, -1);
            int64_t k = inum(mx);
            if ((int64_t)all.u.l->n <= k + 1 && sep.t == JV_STR) return all;
            if (sep.t != JV_STR) { /* from the right; the head keeps its leading whitespace */
                const char *p = s.u.s.p;
                size_t e = s.u.s.n, w;
                jv l = v_list(R, 0);
                for (int64_t done = 0;; done++) {
                    while (e > 0 && (w = space_before(p, e))) e -= w;
                    if (e == 0) break;
                    if (done >= k) { l_push(R, l.u.l, v_strn(p, e)); break; }
                    size_t st = e;
                    int32_t c;
                    while (st > 0 && !space_before(p, st)) st -= u8_back(p, st, &c);
                    l_push(R, l.u.l, v_strn(p + st, e - st));
                    e = st;
                }
                for (size_t a = 0, b = l.u.l->n; b > a + 1; a++, b--) {
                    jv t = l.u.l->v[a];
                    l.u.l->v[a] = l.u.l->v[b - 1];
                    l.u.l->v[b - 1] = t;
                }
                return l;
            }
            size_t head = all.u.l->n - (size_t)k;
            sb b = {0};
            for (size_t i = 0; i < head; i++) {
                if (i) sb_put(R, &b, sep.u.s.p, sep.u.s.n);
                sb_put(R, &b, all.u.l->v[i].u.s.p, all.u.l->v[i].u.s.n);
            }
            jv l = v_list(R, 0);
            l_push(R, l.u.l, sb_val(&b));
            for (size_t i = head; i < all.u.l->n; i++) l_push(R, l.u.l, all.u.l->v[i]);
            return l;
        }
        return str_split(R, at, s, sep, inum(mx));
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        jv x = arg(A, 0, "prefix", v_undef(NULL));
        int ends = m[0] == 'e';
        jv one[1] = {x};
        jv *cands = one;
        size_t nc = 1;
        if (x.t == JV_LIST) { cands = x.u.l->v; nc = x.u.l->n; }
        for (size_t i = 0; i < nc; i++) {
            jv c = need_str(R, at, cands[i], m);
            if (c.u.s.n <= s.u.s.n && !memcmp(s.u.s.p + (ends ? s.u.s.n - c.u.s.n : 0), c.u.s.p, c.u.s.n)) return v_bool(1);
        }
        return v_bool(0);
    }
    if (!strcmp(m, "upper")) return str_case(R, s, 0);
    if (!strcmp(m, "lower")) return str_case(R, s, 1);
    if (!strcmp(m, "title")) return str_case(R, s, 2);
    if (!strcmp(m, "capitalize")) { jv l = str_case(R, s, 1); return str_case(R, l, 3); }
    if (!strcmp(m, "replace")) {
        jv o = need_str(R, at, arg(A, 0, "old", v_undef(NULL)), "replace");
        jv nw = need_str(R, at, arg(A, 1, "new", v_undef(NULL)), "replace");
        return str_replace(R, s, o, nw, inum(arg(A, 2, "count", v_int(-1))));
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        jv x = need_str(R, at, arg(A, 0, "sub", v_undef(NULL)), m);
        if (!strcmp(m, "count")) {
            if (x.u.s.n == 0) return v_int((int64_t)u8_len(s.u.s.p, s.u.s.n) + 1);
            int64_t c = 0;
            const char *p = s.u.s.p, *e = p + s.u.s.n, *q;
            while ((q = memfind(p, (size_t)(e - p), x.u.s.p, x.u.s.n))) { c++; p = q + x.u.s.n; }
            return v_int(c);
        }
        const char *hit = NULL;
        if (m[0] == 'r') {
            for (size_t i = s.u.s.n + 1; i-- > 0;)
                if (i + x.u.s.n <= s.u.s.n && !memcmp(s.u.s.p + i, x.u.s.p, x.u.s.n)) { hit = s.u.s.p + i; break; }
        } else hit = memfind(s.u.s.p, s.u.s.n, x.u.s.p, x.u.s.n);
        if (!hit && m[0] == 'i') rfail(R, at, "substring not found");
        return v_int(hit ? cp_index(s.u.s.p, (size_t)(hit - s.u.s.p)) : -1);
    }
    if (!strcmp(m, "join")) {
        jv l = as_list(R, at, arg(A, 0, "iterable", v_undef(NULL)));
        sb b = {0};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i) sb_put(R, &b, s.u.s.p, s.u.s.n);
            jv x = need_str(R, at, l.u.l->v[i], "join");
            sb_put(R, &b, x.u.s.p, x.u.s.n);
        }
        return sb_val(&b);
    }
    if (!strcmp(m, "splitlines")) {
        jv l = v_list(R, 0);
        size_t i = 0, n = s.u.s.n;
        const char *p = s.u.s.p;
        while (i < n) { /* Python's line boundaries: \n \r \r\n \v \f \x1c-\x1e U+0085 U+2028 U+2029 */
            size_t j = i, w = 0;
            while (j < n) {
                int32_t c;
                w = u8_dec(p + j, n - j, &c);
                if ((c >= '\n' && c <= '\r') || (c >= 0x1c && c <= 0x1e) || c == 0x85 || c == 0x2028 || c == 0x2029) break;
                j += w;
            }
            l_push(R, l.u.l, v_strn(p + i, j - i));
            if (j >= n) break;
            if (p[j] == '\r' && j + 1 < n && p[j + 1] == '\n') w = 2;
            i = j + w;
        }
        return l;
    }
    if (!strcmp(m, "isspace")) {
        if (s.u.s.n == 0) return v_bool(0);
        for (size_t i = 0, w; i < s.u.s.n; i += w)
            if (!(w = space_at(s.u.s.p + i, s.u.s.n - i))) return v_bool(0);
        return v_bool(1);
    }
    if (!strncmp(m, "is", 2)) {
        if (s.u.s.n == 0) return v_bool(0);
        int cased = 0;
        for (size_t i = 0; i < s.u.s.n; i++) {
            unsigned char c = (unsigned char)s.u.s.p[i];
            int dg = c >= '0' && c <= '9', lo = c >= 'a' && c <= 'z', up = c >= 'A' && c <= 'Z';
            if (!strcmp(m, "isdigit") && !dg) return v_bool(0);
            if (!strcmp(m, "isalpha") && !(lo || up)) return v_bool(0);
            if (!strcmp(m, "isalnum") && !(lo || up || dg)) return v_bool(0);
            if (!strcmp(m, "islower") && up) return v_bool(0);
            if (!strcmp(m, "isupper") && lo) return v_bool(0);
            cased |= lo || up;
        }
        if ((!strcmp(m, "islower") || !strcmp(m, "isupper")) && !cased) return v_bool(0);
        return v_bool(1);
    }
    if (!strcmp(m, "format")) { /* "{}", "{0}", "{name}"; no format specs */
        sb b = {0};
        const char *p = s.u.s.p;
        size_t n = s.u.s.n;
        int auto_i = 0;
        for (size_t i = 0; i < n; i++) {
            if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') { sb_puts(R, &b, "{"); i++; continue; }
            if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') { sb_puts(R, &b, "}"); i++; continue; }
            if (p[i] != '{') { sb_put(R, &b, p + i, 1); continue; }
            size_t j = i + 1;
            while (j < n && p[j] != '}') j++;
            if (j >= n) rfail(R, at, "format: single '{' encountered in format string");
            char key[64];
            size_t kl = j - i - 1 < sizeof key - 1 ? j - i - 1 : sizeof key - 1;
            memcpy(key, p + i + 1, kl);
            key[kl] = 0;
            jv v;
            if (kl == 0) v = arg(A, auto_i++, NULL, v_undef(NULL));
            else if (key[0] >= '0' && key[0] <= '9') v = arg(A, atoi(key), NULL, v_undef(NULL));
            else v = arg(A, -1, key, v_undef(NULL));
            if (v.t == JV_UNDEF) rfail(R, at, "format: missing argument '%s'", key);
            to_str_sb(R, &b, v, 0);
            i = j;
        }
        return sb_val(&b);
    }
    rfail(R, at, "str has no method '%s'", m);
}

static jv dict_method(rt *R, const jnode *at, jv self, const char *m, args *A) {
    jdict *d = self.u.d;
    if (!strcmp(m, "get")) {
        jv *v = d_find(d, arg(A, 0, "key", v_none()));
        return v ? *v : arg(A, 1, "default", v_none());
    }
    if (!strcmp(m, "keys")) return as_list(R, at, self);
    if (!strcmp(m, "values")) {
        jv l = v_list(R, d->n);
        for (size_t i = 0; i < d->n; i++) l_push(R, l.u.l, d->v[i]);
        return l;
    }
    if (!strcmp(m, "items")) return dict_items(R, d);
    rfail(R, at, "dict has no method '%s'", m);
}

/* ---- filters and tests */
static const char *const filter_names[] = {"length", "count", "default", "d", "trim", "upper", "lower", "title",
    "capitalize", "replace", "join", "first", "last", "list", "string", "int", "float", "abs", "round", "tojson",
    "items", "dictsort", "selectattr", "rejectattr", "select", "reject", "map", "unique", "reverse", "sort", "safe",
    "indent", "wordcount", "batch", "e", "escape", "sum", "min", "max", "attr", "center", "truncate", "striptags",
    "forceescape", "bool", "slice", NULL};
static const char *const test_names[] = {"defined", "undefined", "none", "string", "number", "integer", "float",
    "mapping", "iterable", "sequence", "boolean", "true", "false", "equalto", "eq", "sameas", "ne", "in", "callable",
    "odd", "even", "divisibleby", "lower", "upper", "gt", "lt", "ge", "le", "greaterthan", "lessthan", "escaped", NULL};
int jx_known_filter(const char *name) { return in_set(filter_names, name); }
int jx_known_test(const char *name) { return in_set(test_names, name); }

static int run_test(rt *R, const jnode *at, const char *t, jv v, args *A) {
    if (!strcmp(t, "defined")) return v.t != JV_UNDEF;
    if (!strcmp(t, "undefined")) return v.t == JV_UNDEF;
    if (!strcmp(t, "none")) return v.t == JV_NONE;
    if (!strcmp(t, "string")) return v.t == JV_STR;
    if (!strcmp(t, "number")) return is_num(v);
    if (!strcmp(t, "integer")) return v.t == JV_INT;
    if (!strcmp(t, "float")) return v.t == JV_FLOAT;
    if (!strcmp(t, "boolean")) return v.t == JV_BOOL;
    if (!strcmp(t, "true")) return v.t == JV_BOOL && v.u.b;
    if (!strcmp(t, "false")) return v.t == JV_BOOL && !v.u.b;
    if (!strcmp(t, "mapping")) return v.t == JV_DICT && !v.u.d->ns;
    if (!strcmp(t, "iterable")) return v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR || v.t == JV_UNDEF;
    if (!strcmp(t, "sequence")) return v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR || v.t == JV_UNDEF;
    if (!strcmp(t, "callable")) return v.t == JV_FUNC;
    if (!strcmp(t, "escaped")) return 0;
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v.t != JV_STR) return 0;
        jv c = str_case(R, v, t[0] == 'u' ? 0 : 1);
        return v_eq(c, v);
    }
    if (!strcmp(t, "odd") || !strcmp(t, "even")) {
        if (v.t != JV_INT && v.t != JV_BOOL) rfail(R, at, "test '%s' needs an integer", t);
        int64_t i = inum(v);
        return (t[0] == 'o') == ((i % 2) != 0);
    }
    jv x = arg(A, 0, NULL, v_undef(NULL));
    if (!has_arg(A, 0, NULL)) rfail(R, at, "test '%s' needs an argument", t);
    if (!strcmp(t, "equalto") || !strcmp(t, "eq")) return v_eq(v, x);
    if (!strcmp(t, "ne")) return !v_eq(v, x);
    if (!strcmp(t, "sameas")) {
        if (v.t != x.t) return 0;
        if (v.t == JV_NONE || v.t == JV_UNDEF) return 1;
        if (v.t == JV_BOOL) return v.u.b == x.u.b;
        return v_eq(v, x) && (v.t == JV_INT || v.t == JV_FLOAT || (v.t == JV_STR && v.u.s.p == x.u.s.p) ||
                              (v.t == JV_LIST && v.u.l == x.u.l) || (v.t == JV_DICT && v.u.d == x.u.d));
    }
    if (!strcmp(t, "divisibleby")) {
        if (inum(x) == 0) rfail(R, at, "divisibleby: division by zero");
        return inum(v) % inum(x) == 0;
    }
    if (!strcmp(t, "gt") || !strcmp(t, "greaterthan")) return v_cmp(R, at, v, x) > 0;
    if (!strcmp(t, "lt") || !strcmp(t, "lessthan")) return v_cmp(R, at, v, x) < 0;
    if (!strcmp(t, "ge")) return v_cmp(R, at, v, x) >= 0;
    if (!strcmp(t, "le")) return v_cmp(R, at, v, x) <= 0;
    if (!strcmp(t, "in")) {
        if (x.t == JV_STR && v.t == JV_STR) return memfind(x.u.s.p, x.u.s.n, v.u.s.p, v.u.s.n) != NULL;
        if (x.t == JV_DICT) return d_find(x.u.d, v) != NULL;
        jv l = as_list(R, at, x);
        for (size_t i = 0; i < l.u.l->n; i++)
            if (v_eq(l.u.l->v[i], v)) return 1;
        return 0;
    }
    rfail(R, at, "unknown test '%s'", t);
}

static jv attr_path(rt *R, jv v, jv path) {
    /* "a.b.0" */
    if (path.t == JV_INT) return get_item(R, NULL, v, path);
    if (path.t != JV_STR) return v_undef(NULL);
    const char *p = path.u.s.p, *e = p + path.u.s.n;
    while (p <= e) {
        const char *dot = memchr(p, '.', (size_t)(e - p));
        if (!dot) dot = e;
        size_t n = (size_t)(dot - p);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
        if (digits && n < 18) v = get_item(R, NULL, v, v_int(atoll(ja_strndup(&R->A, p, n))));
        else if (v.t == JV_DICT) {
            jv *x = d_finds(v.u.d, p, n);
            v = x ? *x : v_undef(NULL);
        } else v = get_attr(R, v, ja_strndup(&R->A, p, n));
        p = dot + 1;
    }
    return v;
}

static jv apply_filter(rt *R, frame *f, const jnode *at, const char *name, jv v, args *A);

typedef struct sortctx { jv *keys; int cs; const jnode *at; } sortctx;
static jv lower_if(rt *R, jv k, int cs) { return (!cs && k.t == JV_STR) ? str_case(R, k, 1) : k; }
static int sort_cmp(rt *R, void *c, size_t a, size_t b) {
    sortctx *s = c;
    return v_cmp(R, s->at, s->keys[a], s->keys[b]);
}

static jv select_like(rt *R, frame *f, const jnode *at, const char *name, jv v, args *A) {
    int attr = !strcmp(name, "selectattr") || !strcmp(name, "rejectattr");
    int rej = name[0] == 'r';
    jv l = as_list(R, at, v);
    jv out = v_list(R, 0);
    int off = attr ? 1 : 0;
    jv an = attr ? arg(A, 0, NULL, v_undef(NULL)) : v_undef(NULL);
    jv tn = arg(A, off, NULL, v_undef(NULL));
    args ta = {0};
    if (A->npos > off + 1) { ta.pos = A->pos + off + 1; ta.npos = A->npos - off - 1; }
    char tbuf[32] = "";
    if (tn.t == JV_STR) {
        if (tn.u.s.n >= sizeof tbuf) rfail(R, at, "%s: unknown test", name);
        memcpy(tbuf, tn.u.s.p, tn.u.s.n);
        tbuf[tn.u.s.n] = 0;
        if (!strcmp(tbuf, "==")) strcpy(tbuf, "eq");
        else if (!strcmp(tbuf, "!=")) strcpy(tbuf, "ne");
        else if (!strcmp(tbuf, ">")) strcpy(tbuf, "gt");
        else if (!strcmp(tbuf, "<")) strcpy(tbuf, "lt");
        else if (!strcmp(tbuf, ">=")) strcpy(tbuf, "ge");
        else if (!strcmp(tbuf, "<=")) strcpy(tbuf, "le");
        if (!jx_known_test(tbuf)) rfail(R, at, "%s: unknown test '%s'", name, tbuf);
    } else if (tn.t != JV_UNDEF) rfail(R, at, "%s: test name must be a string", name);
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv x = l.u.l->v[i];
        jv subj = attr ? attr_path(R, x, an) : x;
        int ok = tbuf[0] ? run_test(R, at, tbuf, subj, &ta) : truthy(subj);
        if (ok != rej) l_push(R, out.u.l, x);
    }
    (void)f;
    return out;
}

static jv apply_filter(rt *R, frame *f, const jnode *at, const char *name, jv v, args *A) {
    const char *fn = name;
    if (!strcmp(fn, "length") || !strcmp(fn, "count")) {
        if (v.t == JV_STR) return v_int((int64_t)u8_len(v.u.s.p, v.u.s.n));
        if (v.t == JV_LIST) return v_int((int64_t)v.u.l->n);
        if (v.t == JV_DICT) return v_int((int64_t)v.u.d->n);
        if (v.t == JV_UNDEF) return v_int(0);
        rfail(R, at, "object of type '%s' has no len()", tname(v));
    }
    if (!strcmp(fn, "default") || !strcmp(fn, "d")) {
        jv def = arg(A, 0, "default_value", v_strn("", 0));
        int boolean = truthy(arg(A, 1, "boolean", v_bool(0)));
        if (v.t == JV_UNDEF || (boolean && !truthy(v))) return def;
        return v;
    }
    if (!strcmp(fn, "safe") || !strcmp(fn, "forceescape")) return v;
    if (!strcmp(fn, "string")) return to_str(R, v);
    if (!strcmp(fn, "trim")) return str_strip(R, to_str(R, v), arg(A, 0, "chars", v_none()), 1, 1);
    if (!strcmp(fn, "upper")) return str_case(R, to_str(R, v), 0);
    if (!strcmp(fn, "lower")) return str_case(R, to_str(R, v), 1);
    if (!strcmp(fn, "title")) return str_case(R, to_str(R, v), 4);
    if (!strcmp(fn, "capitalize")) return str_case(R, str_case(R, to_str(R, v), 1), 3);
    if (!strcmp(fn, "e") || !strcmp(fn, "escape")) {
        jv s = to_str(R, v);
        sb b = {0};
        for (size_t i = 0; i < s.u.s.n; i++) {
            char c = s.u.s.p[i];
            if (c == '&') sb_puts(R, &b, "&amp;");
            else if (c == '<') sb_puts(R, &b, "&lt;");
            else if (c == '>') sb_puts(R, &b, "&gt;");
            else if (c == '"') sb_puts(R, &b, "&#34;");
            else if (c == '\'') sb_puts(R, &b, "&#39;");
            else sb_put(R, &b, &c, 1);
        }
        return sb_val(&b);
    }
    if (!strcmp(fn, "replace")) {
        jv s = to_str(R, v);
        jv o = to_str(R, arg(A, 0, "old", v_strn("", 0))), nw = to_str(R, arg(A, 1, "new", v_strn("", 0)));
        jv c = arg(A, 2, "count", v_none());
        return str_replace(R, s, o, nw, c.t == JV_INT ? c.u.i : -1);
    }
    if (!strcmp(fn, "join")) {
        jv l = as_list(R, at, v);
        jv sep = to_str(R, arg(A, 0, "d", v_strn("", 0)));
        jv attrn = arg(A, 1, "attribute", v_none());
        sb b = {0};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i) sb_put(R, &b, sep.u.s.p, sep.u.s.n);
            jv x = l.u.l->v[i];
            if (attrn.t != JV_NONE) x = attr_path(R, x, attrn);
            to_str_sb(R, &b, x, 0);
        }
        return sb_val(&b);
    }
    if (!strcmp(fn, "first") || !strcmp(fn, "last")) {
        jv l = as_list(R, at, v);
        if (!l.u.l->n) return v_undef(NULL);
        return fn[0] == 'f' ? l.u.l->v[0] : l.u.l->v[l.u.l->n - 1];
    }
    if (!strcmp(fn, "list")) {
        jv l = as_list(R, at, v);
        if (l.u.l == (v.t == JV_LIST ? v.u.l : NULL)) { /* copy */
            jv c = v_list(R, l.u.l->n);
            for (size_t i = 0; i < l.u.l->n; i++) l_push(R, c.u.l, l.u.l->v[i]);
            return c;
        }
        return l;
    }
    if (!strcmp(fn, "int")) {
        jv def = arg(A, 0, "default", v_int(0));
        if (v.t == JV_INT) return v;
        if (v.t == JV_BOOL) return v_int(v.u.b);
        if (v.t == JV_FLOAT) return isfinite(v.u.f) && fabs(v.u.f) < 9.2e18 ? v_int((int64_t)v.u.f) : def;
        if (v.t == JV_STR) {
            char *s = ja_strndup(&R->A, v.u.s.p, v.u.s.n), *e;
            while (*s && py_space((unsigned char)*s)) s++;
            long long x = strtoll(s, &e, 10);
            while (*e && py_space((unsigned char)*e)) e++;
            if (e != s && !*e) return v_int(x);
            double d = strtod(s, &e);
            while (*e && py_space((unsigned char)*e)) e++;
            if (e != s && !*e && isfinite(d) && fabs(d) < 9.2e18) return v_int((int64_t)d);
        }
        return def;
    }
    if (!strcmp(fn, "float")) {
        jv def = arg(A, 0, "default", v_float(0));
        if (is_num(v)) return v_float(num(v));
        if (v.t == JV_STR) {
            char *s = ja_strndup(&R->A, v.u.s.p, v.u.s.n), *e;
            double d = strtod(s, &e);
            while (*e && py_space((unsigned char)*e)) e++;
            if (e != s && !*e) return v_float(d);
        }
        return def;
    }
    if (!strcmp(fn, "bool")) return v_bool(truthy(v));
    if (!strcmp(fn, "abs")) {
        if (v.t == JV_INT) return v_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == JV_FLOAT) return v_float(fabs(v.u.f));
        if (v.t == JV_BOOL) return v_int(v.u.b);
        rfail(R, at, "bad operand type for abs(): '%s'", tname(v));
    }
    if (!strcmp(fn, "round")) {
        if (!is_num(v)) rfail(R, at, "round: expected a number, got %s", tname(v));
        int64_t prec = inum(arg(A, 0, "precision", v_int(0)));
        jv meth = arg(A, 1, "method", v_str("common"));
        if (prec > 300) prec = 300;
        if (prec < -300) prec = -300;
        double m = pow(10, (double)prec), x = num(v) * m, r;
        if (str_eq(meth, "ceil")) r = ceil(x);
        else if (str_eq(meth, "floor")) r = floor(x);
        else r = round(x);
        return v_float(r / m);
    }
    if (!strcmp(fn, "tojson")) {
        jv ind = arg(A, 0, "indent", v_none());
        int indent = ind.t == JV_INT ? (int)(ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : ind.u.i) : -1;
        int sk = truthy(arg(A, -1, "sort_keys", v_bool(0)));
        int ea = truthy(arg(A, -1, "ensure_ascii", v_bool(0)));
        const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
        jv seps = arg(A, -1, "separators", v_none());
        if (seps.t == JV_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == JV_STR && seps.u.l->v[1].t == JV_STR) {
            isep = ja_strndup(&R->A, seps.u.l->v[0].u.s.p, seps.u.l->v[0].u.s.n);
            ksep = ja_strndup(&R->A, seps.u.l->v[1].u.s.p, seps.u.l->v[1].u.s.n);
        }
        sb b = {0};
        to_json(R, &b, v, indent, isep, ksep, sk, 0, at);
        if (ea) b = ascii_escape(R, b);
        return sb_val(&b);
    }
    if (!strcmp(fn, "items")) {
        if (v.t == JV_UNDEF) return v_list(R, 0);
        if (v.t != JV_DICT) rfail(R, at, "items: expected a mapping, got %s", tname(v));
        return dict_items(R, v.u.d);
    }
    if (!strcmp(fn, "dictsort")) {
        if (v.t != JV_DICT) rfail(R, at, "dictsort: expected a mapping, got %s", tname(v));
        int cs = truthy(arg(A, 0, "case_sensitive", v_bool(0)));
        jv by = arg(A, 1, "by", v_str("key"));
        int rev = truthy(arg(A, 2, "reverse", v_bool(0)));
        size_t n = v.u.d->n;
        sortctx sc = {ja_alloc(&R->A, (n + 1) * sizeof(jv)), cs, at};
        size_t *idx = ja_alloc(&R->A, (n + 1) * sizeof(size_t));
        for (size_t i = 0; i < n; i++) {
            idx[i] = i;
            sc.keys[i] = lower_if(R, str_eq(by, "value") ? v.u.d->v[i] : v.u.d->k[i], cs);
        }
        sort_idx(R, idx, n, sort_cmp, &sc);
        jv out = v_list(R, n);
        for (size_t i = 0; i < n; i++) {
            size_t j = rev ? idx[n - 1 - i] : idx[i];
            l_push(R, out.u.l, pair(R, v.u.d->k[j], v.u.d->v[j]));
        }
        return out;
    }
    if (!strcmp(fn, "selectattr") || !strcmp(fn, "rejectattr") || !strcmp(fn, "select") || !strcmp(fn, "reject"))
        return select_like(R, f, at, fn, v, A);
    if (!strcmp(fn, "map")) {
        jv l = as_list(R, at, v);
        jv out = v_list(R, l.u.l->n);
        if (has_arg(A, -1, "attribute")) {
            jv an = arg(A, -1, "attribute", v_none());
            jv def = arg(A, -1, "default", v_undef(NULL));
            for (size_t i = 0; i < l.u.l->n; i++) {
                jv x = attr_path(R, l.u.l->v[i], an);
                l_push(R, out.u.l, x.t == JV_UNDEF && has_arg(A, -1, "default") ? def : x);
            }
            return out;
        }
        jv fname = arg(A, 0, NULL, v_undef(NULL));
        if (fname.t != JV_STR || fname.u.s.n > 30) rfail(R, at, "map: expected a filter name or attribute=");
        char nb[32];
        memcpy(nb, fname.u.s.p, fname.u.s.n);
        nb[fname.u.s.n] = 0;
        if (!jx_known_filter(nb)) rfail(R, at, "map: unknown filter '%s'", nb);
        args sub = {A->pos + 1, A->npos - 1, A->names, A->kw, A->nkw};
        for (size_t i = 0; i < l.u.l->n; i++) l_push(R, out.u.l, apply_filter(R, f, at, ja_strndup(&R->A, nb, strlen(nb)), l.u.l->v[i], &sub));
        return out;
    }
    if (!strcmp(fn, "unique")) {
        jv l = as_list(R, at, v);
        int cs = truthy(arg(A, 0, "case_sensitive", v_bool(0)));
        jv an = arg(A, 1, "attribute", v_none());
        jv out = v_list(R, 0), seen = v_list(R, 0);
        for (size_t i = 0; i < l.u.l->n; i++) {
            jv k = l.u.l->v[i];
            if (an.t != JV_NONE) k = attr_path(R, k, an);
            k = lower_if(R, k, cs);
            int dup = 0;
            for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = v_eq(seen.u.l->v[j], k);
            if (!dup) { l_push(R, seen.u.l, k); l_push(R, out.u.l, l.u.l->v[i]); }
        }
        return out;
    }
    if (!strcmp(fn, "reverse")) {
        if (v.t == JV_STR) {
            size_t cnt;
            size_t *o = u8_offsets(R, v.u.s.p, v.u.s.n, &cnt);
            sb b = {0};
            for (size_t i = cnt; i-- > 0;) sb_put(R, &b, v.u.s.p + o[i], o[i + 1] - o[i]);
            return sb_val(&b);
        }
        jv l = as_list(R, at, v);
        jv out = v_list(R, l.u.l->n);
        for (size_t i = l.u.l->n; i-- > 0;) l_push(R, out.u.l, l.u.l->v[i]);
        return out;
    }
    if (!strcmp(fn, "sort")) {
        jv l = as_list(R, at, v);
        int rev = truthy(arg(A, 0, "reverse", v_bool(0)));
        int cs = truthy(arg(A, 1, "case_sensitive", v_bool(0)));
        jv an = arg(A, 2, "attribute", v_none());
        size_t n = l.u.l->n;
        sortctx sc = {ja_alloc(&R->A, (n + 1) * sizeof(jv)), cs, at};
        size_t *idx = ja_alloc(&R->A, (n + 1) * sizeof(size_t));
        for (size_t i = 0; i < n; i++) {
            idx[i] = i;
            jv k = l.u.l->v[i];
            if (an.t != JV_NONE) k = attr_path(R, k, an);
            sc.keys[i] = lower_if(R, k, cs);
        }
        if (rev) { /* Python: stable sort with reverse keeps equal items in order */
            for (size_t i = 0; i < n; i++) idx[i] = n - 1 - i;
            sort_idx(R, idx, n, sort_cmp, &sc);
            jv out = v_list(R, n);
            for (size_t i = n; i-- > 0;) l_push(R, out.u.l, l.u.l->v[idx[i]]);
            return out;
        }
        sort_idx(R, idx, n, sort_cmp, &sc);
        jv out = v_list(R, n);
        for (size_t i = 0; i < n; i++) l_push(R, out.u.l, l.u.l->v[idx[i]]);
        return out;
    }
    if (!strcmp(fn, "indent")) {
        jv s = to_str(R, v);
        jv w = arg(A, 0, "width", v_int(4));
        int first = truthy(arg(A, 1, "first", v_bool(0)));
        int blank = truthy(arg(A, 2, "blank", v_bool(0)));
        jv pad;
        if (w.t == JV_STR) pad = w;
        else {
            int64_t k = inum(w);
            if (k < 0) k = 0;
            if (k > 4096) rfail(R, at, "indent: width too large");
            char *p = ja_alloc(&R->A, (size_t)k + 1);
            memset(p, ' ', (size_t)k);
            pad = v_strn(p, (size_t)k);
        }
        sb b = {0};
        const char *p = s.u.s.p;
        size_t n = s.u.s.n, i = 0;
        int line0 = 1;
        while (i <= n) {
            size_t j = i;
            while (j < n && p[j] != '\n') j++;
            int empty = j == i;
            if ((line0 ? first : 1) && (blank || !empty) && !(j == n && empty && !line0)) sb_put(R, &b, pad.u.s.p, pad.u.s.n);
            sb_put(R, &b, p + i, j - i);
            if (j < n) sb_puts(R, &b, "\n");
            line0 = 0;
            i = j + 1;
            if (j == n) break;
        }
        return sb_val(&b);
    }
    if (!strcmp(fn, "wordcount")) {
        jv s = to_str(R, v);
        int64_t c = 0;
        int in = 0;
        for (size_t i = 0; i < s.u.s.n; i++) {
            unsigned char ch = (unsigned char)s.u.s.p[i];
            int w = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || ch >= 0x80;
            if (w && !in) c++;
            in = w;
        }
        return v_int(c);
    }
    if (!strcmp(fn, "batch") || !strcmp(fn, "slice")) {
        jv l = as_list(R, at, v);
        int64_t k = inum(arg(A, 0, fn[0] == 'b' ? "linecount" : "slices", v_int(1)));
        if (k <= 0) rfail(R, at, "%s: count must be positive", fn);
        jv fill = arg(A, 1, "fill_with", v_none());
        int has_fill = fill.t != JV_NONE;
        jv out = v_list(R, 0);
        size_t n = l.u.l->n;
        if (fn[0] == 'b') {
            for (size_t i = 0; i < n; i += (size_t)k) {
                jv row = v_list(R, 0);
                for (size_t j = i; j < i + (size_t)k; j++) {
                    if (j < n) l_push(R, row.u.l, l.u.l->v[j]);
                    else if (has_fill) l_push(R, row.u.l, fill);
                }
                l_push(R, out.u.l, row);
                if ((size_t)k > n) break;
            }
            return out;
        }
        size_t per = n / (size_t)k, extra = n % (size_t)k, off = 0;
        for (size_t s = 0; s < (size_t)k; s++) {
            size_t len = per + (s < extra);
            jv row = v_list(R, 0);
            for (size_t j = 0; j < len; j++) l_push(R, row.u.l, l.u.l->v[off + j]);
            if (has_fill && s >= extra && extra) l_push(R, row.u.l, fill);
            off += len;
            l_push(R, out.u.l, row);
        }
        return out;
    }
    if (!strcmp(fn, "sum")) {
        jv l = as_list(R, at, v);
        jv an = arg(A, 0, "attribute", v_none());
        jv acc = arg(A, 1, "start", v_int(0));
        for (size_t i = 0; i < l.u.l->n; i++) {
            jv x = an.t != JV_NONE ? attr_path(R, l.u.l->v[i], an) : l.u.l->v[i];
            if (!is_num(x) || !is_num(acc)) rfail(R, at, "sum: unsupported operand types");
            if (x.t == JV_FLOAT || acc.t == JV_FLOAT) acc = v_float(num(acc) + num(x));
            else {
                int64_t r;
                if (__builtin_add_overflow(inum(acc), inum(x), &r)) rfail(R, at, "integer overflow");
                acc = v_int(r);
            }
        }
        return acc;
    }
    if (!strcmp(fn, "min") || !strcmp(fn, "max")) {
        jv l = as_list(R, at, v);
        if (!l.u.l->n) return v_undef(NULL);
        int cs = truthy(arg(A, 0, "case_sensitive", v_bool(0)));
        jv an = arg(A, 1, "attribute", v_none());
        size_t best = 0;
        for (size_t i = 1; i < l.u.l->n; i++) {
            jv a = l.u.l->v[i], b = l.u.l->v[best];
            if (an.t != JV_NONE) { a = attr_path(R, a, an); b = attr_path(R, b, an); }
            int c = v_cmp(R, at, lower_if(R, a, cs), lower_if(R, b, cs));
            if (fn[1] == 'i' ? c < 0 : c > 0) best = i;
        }
        return l.u.l->v[best];
    }
    if (!strcmp(fn, "attr")) {
        jv nm = to_str(R, arg(A, 0, "name", v_strn("", 0)));
        if (v.t == JV_DICT) {
            jv *x = d_finds(v.u.d, nm.u.s.p, nm.u.s.n);
            return x ? *x : v_undef(NULL);
        }
        return v_undef(NULL);
    }
    if (!strcmp(fn, "center")) {
        jv s = to_str(R, v);
        int64_t w = inum(arg(A, 0, "width", v_int(80)));
        int64_t len = (int64_t)u8_len(s.u.s.p, s.u.s.n);
        if (w > 100000) rfail(R, at, "center: width too large");
        if (w <= len) return s;
        int64_t padt = w - len, left = padt / 2 + (padt & w & 1);
        sb b = {0};
        for (int64_t i = 0; i < left; i++) sb_puts(R, &b, " ");
        sb_put(R, &b, s.u.s.p, s.u.s.n);
        for (int64_t i = 0; i < padt - left; i++) sb_puts(R, &b, " ");
        return sb_val(&b);
    }
    if (!strcmp(fn, "truncate")) {
        jv s = to_str(R, v);
        int64_t len = inum(arg(A, 0, "length", v_int(255)));
        int killw = truthy(arg(A, 1, "killwords", v_bool(0)));
        jv end = to_str(R, arg(A, 2, "end", v_str("...")));
        int64_t leeway = inum(arg(A, 3, "leeway", v_int(5)));
        size_t cnt;
        size_t *o = u8_offsets(R, s.u.s.p, s.u.s.n, &cnt);
        if ((int64_t)cnt <= len + leeway) return s;
        int64_t keep = len - (int64_t)u8_len(end.u.s.p, end.u.s.n);
        if (keep < 0) keep = 0;
        size_t cut = o[keep];
        sb b = {0};
        if (!killw) {
            size_t sp = cut;
            while (sp > 0 && s.u.s.p[sp - 1] != ' ') sp--;
            if (sp > 0) cut = sp - 1;
        }
        sb_put(R, &b, s.u.s.p, cut);
        sb_put(R, &b, end.u.s.p, end.u.s.n);
        return sb_val(&b);
    }
    if (!strcmp(fn, "striptags")) {
        jv s = to_str(R, v);
        sb b = {0};
        int in = 0, sp = 0;
        for (size_t i = 0; i < s.u.s.n; i++) {
            char c = s.u.s.p[i];
            if (c == '<') { in = 1; continue; }
            if (c == '>' && in) { in = 0; continue; }
            if (in) continue;
            if (py_space((unsigned char)c)) { sp = b.n > 0; continue; }
            if (sp) { sb_puts(R, &b, " "); sp = 0; }
            sb_put(R, &b, &c, 1);
        }
        return sb_val(&b);
    }
    rfail(R, at, "unknown filter '%s'", fn);
}

/* ---- calls */
static jv range_fn(rt *R, const jnode *at, args *A) {
    int64_t a = 0, b, s = 1;
    if (A->npos == 1) b = inum(A->pos[0]);
    else if (A->npos >= 2) { a = inum(A->pos[0]); b = inum(A->pos[1]); if (A->npos > 2) s = inum(A->pos[2]); }
    else rfail(R, at, "range expected at least 1 argument");
    for (int i = 0; i < A->npos; i++)
        if (A->pos[i].t != JV_INT && A->pos[i].t != JV_BOOL) rfail(R, at, "range: arguments must be integers");
    if (s == 0) rfail(R, at, "range() arg 3 must not be zero");
    double cnt = s > 0 ? ceil(((double)b - (double)a) / (double)s) : ceil(((double)a - (double)b) / (double)-s);
    if (cnt > 1e7) rfail(R, at, "range too large (%.0f items)", cnt);
    jv l = v_list(R, cnt > 0 ? (size_t)cnt : 0);
    for (int64_t i = a; s > 0 ? i < b : i > b; i += s) l_push(R, l.u.l, v_int(i));
    return l;
}

static jv capture(rt *R, frame *f, const jnode *body) {
    char *so = R->out;
    size_t sn = R->on, sc = R->ocap;
    R->out = NULL;
    R->on = R->ocap = 0;
    exec_body(R, f, body);
    jv r = R->out ? v_strn(R->out, R->on) : v_strn("", 0);
    R->out = so;
    R->on = sn;
    R->ocap = sc;
    return r;
}

/* Macros and {% call %} callers: def->names are the parameters, def->list2 the defaults
 * (evaluated at call time in the macro's scope), def->c the body. */
static jv call_macro(rt *R, const jnode *at, jfunc *m, args *A, jv caller) {
    const jnode *def = m->def;
    frame *fr = new_frame(R, m->closure);
    int np = def->nnames;
    jv varargs = v_list(R, 0), kwargs = v_dict(R);
    char *set = ja_alloc(&R->A, (size_t)np + 1);
    for (int i = 0; i < A->npos; i++) {
        if (i < np) { d_sets(R, &fr->vars, def->names[i], A->pos[i]); set[i] = 1; }
        else l_push(R, varargs.u.l, A->pos[i]);
    }
    for (int k = 0; k < A->nkw; k++) {
        int hit = 0;
        for (int i = 0; i < np && !hit; i++)
            if (!strcmp(def->names[i], A->names[k])) {
                if (set[i]) rfail(R, at, "macro '%s' got multiple values for argument '%s'", m->name, A->names[k]);
                d_sets(R, &fr->vars, def->names[i], A->kw[k]);
                set[i] = hit = 1;
            }
        if (!hit) d_sets(R, kwargs.u.d, A->names[k], A->kw[k]);
    }
    d_sets(R, &fr->vars, "varargs", varargs);
    d_sets(R, &fr->vars, "kwargs", kwargs);
    if (caller.t == JV_FUNC) d_sets(R, &fr->vars, "caller", caller);
    for (int i = 0; i < np; i++)
        if (!set[i]) d_sets(R, &fr->vars, def->names[i], def->list2[i] ? eval(R, fr, def->list2[i]) : v_undef(def->names[i]));
    int ctl = R->ctl;
    jv r = capture(R, fr, def->c);
    R->ctl = ctl;
    return r;
}

static jv call_value(rt *R, frame *f, const jnode *at, jv fnv, args *A) {
    if (fnv.t == JV_UNDEF) rfail(R, at, "'%s' is undefined", fnv.u.s.p ? fnv.u.s.p : "value");
    if (fnv.t != JV_FUNC) rfail(R, at, "'%s' object is not callable", tname(fnv));
    jfunc *fn = fnv.u.fn;
    switch (fn->kind) {
    case F_METHOD:
        if (fn->self.t == JV_STR) return str_method(R, at, fn->self, fn->name, A);
        return dict_method(R, at, fn->self, fn->name, A);
    case F_MACRO:
    case F_CALLER: return call_macro(R, at, fn, A, v_undef(NULL));
    case F_CYCLE:
        if (!A->npos) rfail(R, at, "no items for cycling given");
        return A->pos[inum(fn->self) % A->npos];
    default: break;
    }
    const char *g = fn->name;
    if (!strcmp(g, "range")) return range_fn(R, at, A);
    if (!strcmp(g, "namespace") || !strcmp(g, "dict")) {
        jv d = v_dict(R);
        d.u.d->ns = g[0] == 'n';
        for (int i = 0; i < A->npos; i++) {
            if (A->pos[i].t != JV_DICT) rfail(R, at, "%s: positional argument must be a mapping", g);
            for (size_t k = 0; k < A->pos[i].u.d->n; k++) d_set(R, d.u.d, A->pos[i].u.d->k[k], A->pos[i].u.d->v[k]);
        }
        for (int k = 0; k < A->nkw; k++) d_sets(R, d.u.d, A->names[k], A->kw[k]);
        return d;
    }
    if (!strcmp(g, "raise_exception")) {
        jv m = to_str(R, arg(A, 0, "message", v_strn("", 0)));
        rfail(R, at, "raise_exception: %.*s", (int)(m.u.s.n > 600 ? 600 : m.u.s.n), m.u.s.p);
    }
    if (!strcmp(g, "strftime_now")) {
        jv fmt = need_str(R, at, arg(A, 0, "format", v_undef(NULL)), "strftime_now");
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char buf[512];
        char *fz = ja_strndup(&R->A, fmt.u.s.p, fmt.u.s.n > 200 ? 200 : fmt.u.s.n);
        size_t n = strftime(buf, sizeof buf, fz, &tmv);
        return v_strdup(R, buf, n);
    }
    (void)f;
    rfail(R, at, "'%s' is not callable", g);
}

static const char *const globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};

static jv arith(rt *R, const jnode *at, int op, jv a, jv b) {
    static const char *ops[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (a.t == JV_UNDEF || b.t == JV_UNDEF) {
        jv u = a.t == JV_UNDEF ? a : b;
        rfail(R, at, "'%s' is undefined", u.u.s.p ? u.u.s.p : "value");
    }
    if (is_num(a) && is_num(b)) {
        int fl = a.t == JV_FLOAT || b.t == JV_FLOAT || op == OP_DIV;
        if (op == OP_POW && !fl && inum(b) < 0) fl = 1;
        if (fl) {
            double x = num(a), y = num(b);
            switch (op) {
            case OP_ADD: return v_float(x + y);
            case OP_SUB: return v_float(x - y);
            case OP_MUL: return v_float(x * y);
            case OP_DIV: if (y == 0) rfail(R, at, "division by zero"); return v_float(x / y);
            case OP_FDIV: if (y == 0) rfail(R, at, "float floor division by zero"); return v_float(floor(x / y));
            case OP_MOD: {
                if (y == 0) rfail(R, at, "float modulo");
                double r = fmod(x, y);
                if (r != 0 && ((r < 0) != (y < 0))) r += y;
                return v_float(r);
            }
            case OP_POW: return v_float(pow(x, y));
            }
        }
        int64_t x = inum(a), y = inum(b), r = 0;
        int ovf = 0;
        switch (op) {
        case OP_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
        case OP_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
        case OP_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
        case OP_FDIV:
        case OP_MOD:
            if (y == 0) rfail(R, at, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) { ovf = 1; break; }
            r = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) r--;
            if (op == OP_MOD) r = x - r * y;
            break;
        case OP_POW:
            r = 1;
            for (int64_t i = 0; i < y && !ovf; i++) ovf = __builtin_mul_overflow(r, x, &r);
            break;
        }
        if (ovf) rfail(R, at, "integer overflow in '%s'", ops[op]);
        return v_int(r);
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        sb s = {0};
        sb_put(R, &s, a.u.s.p, a.u.s.n);
        sb_put(R, &s, b.u.s.p, b.u.s.n);
        return sb_val(&s);
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST) {
        jv l = v_list(R, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++) l_push(R, l.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) l_push(R, l.u.l, b.u.l->v[i]);
        return l;
    }
    if (op == OP_MUL && (a.t == JV_STR || a.t == JV_LIST || b.t == JV_STR || b.t == JV_LIST)) {
        jv seq = (a.t == JV_STR || a.t == JV_LIST) ? a : b, cnt = seq.u.l == a.u.l && seq.t == a.t ? b : a;
        if (cnt.t == JV_INT || cnt.t == JV_BOOL) {
            int64_t k = inum(cnt);
            if (k < 0) k = 0;
            size_t unit = seq.t == JV_STR ? seq.u.s.n : seq.u.l->n * sizeof(jv);
            if (unit && (uint64_t)k > R->max_out / unit) rfail(R, at, "repetition too large");
            if (seq.t == JV_STR) {
                sb s = {0};
                for (int64_t i = 0; i < k; i++) sb_put(R, &s, seq.u.s.p, seq.u.s.n);
                return sb_val(&s);
            }
            jv l = v_list(R, 0);
            for (int64_t i = 0; i < k; i++)
                for (size_t j = 0; j < seq.u.l->n; j++) l_push(R, l.u.l, seq.u.l->v[j]);
            return l;
        }
    }
    rfail(R, at, "unsupported operand type(s) for %s: '%s' and '%s'", ops[op], tname(a), tname(b));
}

static int contains(rt *R, const jnode *at, jv x, jv c) {
    if (c.t == JV_STR) {
        if (x.t != JV_STR) rfail(R, at, "'in <string>' requires string as left operand, not %s", tname(x));
        return memfind(c.u.s.p, c.u.s.n, x.u.s.p, x.u.s.n) != NULL;
    }
    if (c.t == JV_DICT) return d_find(c.u.d, x) != NULL;
    if (c.t == JV_LIST) {
        for (size_t i = 0; i < c.u.l->n; i++)
            if (v_eq(c.u.l->v[i], x)) return 1;
        return 0;
    }
    if (c.t == JV_UNDEF) return 0;
    rfail(R, at, "argument of type '%s' is not iterable", tname(c));
}

static jv eval(rt *R, frame *f, const jnode *n) {
    step(R, n);
    if (++R->depth > R->max_depth) rfail(R, n, "template evaluation nested deeper than %d", R->max_depth);
    jv r;
    switch (n->k) {
    case N_LIT: r = n->lit; break;
    case N_NAME: {
        jv *v = lookup(f, n->str);
        if (v) r = *v;
        else if (in_set(globals, n->str)) r = v_func(R, F_GLOBAL, n->str);
        else r = v_undef(n->str);
        break;
    }
    case N_ATTR: {
        jv o = eval(R, f, n->a);
        r = o.t == JV_UNDEF ? v_undef(n->str) : get_attr(R, o, n->str);
        break;
    }
    case N_ITEM: {
        jv o = eval(R, f, n->a), k = eval(R, f, n->b);
        r = get_item(R, n, o, k);
        break;
    }
    case N_SLICE: {
        jv o = eval(R, f, n->a);
        jv a = n->b ? eval(R, f, n->b) : v_none(), b = n->c ? eval(R, f, n->c) : v_none(), c = n->d ? eval(R, f, n->d) : v_none();
        r = do_slice(R, n, o, a, b, c);
        break;
    }
    case N_CALL: {
        jv fnv = eval(R, f, n->a);
        args A;
        eval_args(R, f, n, &A, NULL);
        r = call_value(R, f, n, fnv, &A);
        break;
    }
    case N_FILTER: {
        jv v = eval(R, f, n->a);
        args A;
        eval_args(R, f, n, &A, NULL);
        r = apply_filter(R, f, n, n->str, v, &A);
        break;
    }
    case N_TEST: {
        jv v = eval(R, f, n->a);
        args A;
        eval_args(R, f, n, &A, NULL);
        r = v_bool(run_test(R, n, n->str, v, &A) != n->op);
        break;
    }
    case N_NOT: r = v_bool(!truthy(eval(R, f, n->a))); break;
    case N_NEG:
    case N_POS: {
        jv v = eval(R, f, n->a);
        if (!is_num(v)) rfail(R, n, "bad operand type for unary %c: '%s'", n->k == N_NEG ? '-' : '+', tname(v));
        if (n->k == N_POS) r = v.t == JV_BOOL ? v_int(v.u.b) : v;
        else if (v.t == JV_FLOAT) r = v_float(-v.u.f);
        else {
            if (inum(v) == INT64_MIN) rfail(R, n, "integer overflow");
            r = v_int(-inum(v));
        }
        break;
    }
    case N_AND: {
        jv a = eval(R, f, n->a);
        r = truthy(a) ? eval(R, f, n->b) : a;
        break;
    }
    case N_OR: {
        jv a = eval(R, f, n->a);
        r = truthy(a) ? a : eval(R, f, n->b);
        break;
    }
    case N_TERN:
        if (truthy(eval(R, f, n->b))) r = eval(R, f, n->a);
        else r = n->c ? eval(R, f, n->c) : v_undef(NULL);
        break;
    case N_LISTLIT:
    case N_TUPLELIT:
        r = v_list(R, (size_t)n->nlist);
        for (int i = 0; i < n->nlist; i++) l_push(R, r.u.l, eval(R, f, n->list[i]));
        break;
    case N_DICTLIT:
        r = v_dict(R);
        for (int i = 0; i < n->nlist; i++) {
            jv k = eval(R, f, n->list[i]);
            if (k.t == JV_LIST || k.t == JV_DICT) rfail(R, n->list[i], "unhashable type: '%s'", tname(k));
            d_set(R, r.u.d, k, eval(R, f, n->list2[i]));
        }
        break;
    case N_BIN: {
        jv a = eval(R, f, n->a), b = eval(R, f, n->b);
        switch (n->op) {
        case OP_CAT: {
            sb s = {0};
            to_str_sb(R, &s, a, 0);
            to_str_sb(R, &s, b, 0);
            r = sb_val(&s);
            break;
        }
        case OP_EQ: r = v_bool(v_eq(a, b)); break;
        case OP_NE: r = v_bool(!v_eq(a, b)); break;
        case OP_LT: r = v_bool(v_cmp(R, n, a, b) < 0); break;
        case OP_LE: r = v_bool(v_cmp(R, n, a, b) <= 0); break;
        case OP_GT: r = v_bool(v_cmp(R, n, a, b) > 0); break;
        case OP_GE: r = v_bool(v_cmp(R, n, a, b) >= 0); break;
        case OP_IN: r = v_bool(contains(R, n, a, b)); break;
        case OP_NOTIN: r = v_bool(!contains(R, n, a, b)); break;
        default: r = arith(R, n, n->op, a, b); break;
        }
        break;
    }
    default: rfail(R, n, "internal: not an expression");
    }
    R->depth--;
    return r;
}

static void unpack(rt *R, const jnode *at, frame *f, const char **names, int nn, jv v) {
    if (nn == 1) { d_sets(R, &f->vars, names[0], v); return; }
    jv l = as_list(R, at, v);
    if ((int)l.u.l->n != nn)
        rfail(R, at, "%s values to unpack (expected %d, got %zu)", (int)l.u.l->n > nn ? "too many" : "not enough", nn, l.u.l->n);
    for (int i = 0; i < nn; i++) d_sets(R, &f->vars, names[i], l.u.l->v[i]);
}

static void exec_for(rt *R, frame *f, const jnode *n) {
    jv it = eval(R, f, n->a);
    jv l = as_list(R, n->a, it);
    if (n->b) { /* {% for x in xs if cond %}: filter first (it defines loop.length) */
        jv kept = v_list(R, 0);
        for (size_t i = 0; i < l.u.l->n; i++) {
            frame *tf = new_frame(R, f);
            unpack(R, n, tf, n->names, n->nnames, l.u.l->v[i]);
            if (truthy(eval(R, tf, n->b))) l_push(R, kept.u.l, l.u.l->v[i]);
        }
        l = kept;
    }
    size_t len = l.u.l->n;
    if (len == 0) {
        if (n->d) exec_body(R, f, n->d);
        return;
    }
    for (size_t i = 0; i < len; i++) {
        step(R, n);
        frame *lf = new_frame(R, f);
        jv loop = v_dict(R);
        jdict *d = loop.u.d;
        d_sets(R, d, "index", v_int((int64_t)i + 1));
        d_sets(R, d, "index0", v_int((int64_t)i));
        d_sets(R, d, "revindex", v_int((int64_t)(len - i)));
        d_sets(R, d, "revindex0", v_int((int64_t)(len - i - 1)));
        d_sets(R, d, "first", v_bool(i == 0));
        d_sets(R, d, "last", v_bool(i == len - 1));
        d_sets(R, d, "length", v_int((int64_t)len));
        d_sets(R, d, "depth", v_int(1));
        d_sets(R, d, "depth0", v_int(0));
        if (i > 0) d_sets(R, d, "previtem", l.u.l->v[i - 1]);
        if (i + 1 < len) d_sets(R, d, "nextitem", l.u.l->v[i + 1]);
        jv cyc = v_func(R, F_CYCLE, "cycle");
        cyc.u.fn->self = v_int((int64_t)i);
        d_sets(R, d, "cycle", cyc);
        d_sets(R, &lf->vars, "loop", loop);
        unpack(R, n, lf, n->names, n->nnames, l.u.l->v[i]);
        exec_body(R, lf, n->c);
        if (R->ctl == 1) { R->ctl = 0; break; }
        R->ctl = 0;
    }
}

static jv apply_filters(rt *R, frame *f, const jnode *const *fl, int nf, jv v) {
    for (int i = 0; i < nf; i++) {
        args A;
        eval_args(R, f, fl[i], &A, NULL);
        v = apply_filter(R, f, fl[i], fl[i]->str, v, &A);
    }
    return v;
}

static void exec_stmt(rt *R, frame *f, const jnode *n) {
    step(R, n);
    switch (n->k) {
    case N_BODY: exec_body(R, f, n); break;
    case N_TEXT: emit(R, n->str, n->slen); break;
    case N_OUT: {
        jv v = eval(R, f, n->a);
        if (v.t == JV_STR) emit(R, v.u.s.p, v.u.s.n);
        else {
            sb b = {0};
            to_str_sb(R, &b, v, 0);
            emit(R, b.p ? b.p : "", b.n);
        }
        break;
    }
    case N_IF:
        for (int i = 0; i < n->nlist; i++)
            if (truthy(eval(R, f, n->list[i]))) { exec_body(R, f, n->list2[i]); return; }
        if (n->c) exec_body(R, f, n->c);
        break;
    case N_FOR: exec_for(R, f, n); break;
    case N_SET: {
        jv v = eval(R, f, n->a);
        if (n->c) {
            jv *ns = lookup(f, n->str);
            if (!ns || ns->t != JV_DICT || !ns->u.d->ns) rfail(R, n, "cannot assign attribute on non-namespace object '%s'", n->str);
            d_sets(R, ns->u.d, n->c->str, v);
        } else unpack(R, n, f, n->names, n->nnames, v);
        break;
    }
    case N_SETBLOCK: {
        jv v = capture(R, f, n->a);
        v = apply_filters(R, f, (const jnode *const *)n->list, n->nlist, v);
        d_sets(R, &f->vars, n->str, v);
        break;
    }
    case N_MACRO: {
        jv m = v_func(R, F_MACRO, n->str);
        m.u.fn->def = n;
        m.u.fn->closure = f;
        d_sets(R, &f->vars, n->str, m);
        break;
    }
    case N_CALLBLOCK: {
        jv caller = v_func(R, F_CALLER, "caller");
        caller.u.fn->def = n;
        caller.u.fn->closure = f;
        const jnode *call = n->a;
        jv fnv = eval(R, f, call->a);
        args A;
        eval_args(R, f, call, &A, NULL);
        if (fnv.t != JV_FUNC || fnv.u.fn->kind != F_MACRO) rfail(R, n, "{%% call %%} needs a macro");
        jv out = call_macro(R, n, fnv.u.fn, &A, caller);
        emit(R, out.u.s.p, out.u.s.n);
        break;
    }
    case N_FILTERBLOCK: {
        jv v = capture(R, f, n->a);
        v = to_str(R, apply_filters(R, f, (const jnode *const *)n->list, n->nlist, v));
        emit(R, v.u.s.p, v.u.s.n);
        break;
    }
    case N_BREAK: R->ctl = 1; break;
    case N_CONTINUE: R->ctl = 2; break;
    case N_DO: eval(R, f, n->a); break;
    default: rfail(R, n, "internal: not a statement");
    }
}

static void exec_body(rt *R, frame *f, const jnode *b) {
    if (++R->depth > R->max_depth) rfail(R, b, "template evaluation nested deeper than %d", R->max_depth);
    for (int i = 0; i < b->nlist && !R->ctl; i++) exec_stmt(R, f, b->list[i]);
    R->depth--;
}

char *m3_jinja_render(const m3_jinja *t, const json_t *ctx, const m3_jinja_limits *limits, size_t *out_len, m3_err *err) {
    if (!t) { m3_errf(err, "template: NULL"); return NULL; }
    if (ctx && !json_is_object(ctx)) { m3_errf(err, "%s: render context must be a JSON object", t->name); return NULL; }
    rt *R = calloc(1, sizeof *R);
    if (!R) { m3_errf(err, "%s: out of memory", t->name); return NULL; }
    R->err = err;
    R->name = t->name;
    R->max_out = limits && limits->max_output ? limits->max_output : (size_t)64 << 20;
    R->max_steps = limits && limits->max_steps ? limits->max_steps : 50000000;
    R->max_depth = limits && limits->max_depth ? limits->max_depth : 600;
    R->A.limit = limits && limits->max_memory ? limits->max_memory : (size_t)1 << 30;
    R->A.jb = &R->jb;
    R->A.err = err;
    R->A.name = t->name;
    char *res = NULL;
    if (setjmp(R->jb) == 0) {
        frame *root = new_frame(R, NULL);
        if (ctx) {
            const char *k;
            json_t *x;
            json_object_foreach((json_t *)ctx, k, x) d_sets(R, &root->vars, k, from_json(R, x, 0));
        }
        frame *tf = new_frame(R, root);
        exec_body(R, tf, t->root);
        res = malloc(R->on + 1);
        if (!res) m3_errf(err, "%s: out of memory", t->name);
        else {
            if (R->on) memcpy(res, R->out, R->on);
            res[R->on] = 0;
            if (out_len) *out_len = R->on;
        }
    }
    ja_free_all(&R->A);
    free(R);
    return res;
}
