/* Jinja values as text: Python's str() and repr() (floats as repr prints them: shortest
 * round-trip digits), and json.dumps for the tojson filter (indent, separators, sort_keys,
 * ensure_ascii). See jinja_rt.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_rt.h"

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
    jx_put(R, b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char e[8];
        if (c == '\\') jx_puts(R, b, "\\\\");
        else if (c == (unsigned char)q) { e[0] = '\\'; e[1] = (char)q; jx_put(R, b, e, 2); }
        else if (c == '\n') jx_puts(R, b, "\\n");
        else if (c == '\r') jx_puts(R, b, "\\r");
        else if (c == '\t') jx_puts(R, b, "\\t");
        else if (c < 0x20 || c == 0x7f) { snprintf(e, sizeof e, "\\x%02x", c); jx_puts(R, b, e); }
        else jx_put(R, b, (const char *)&c, 1);
    }
    jx_put(R, b, &q, 1);
}

/* str(v) as Python would print it */
void jx_to_str_sb(rt *R, sb *b, jv v, int depth) {
    char buf[64];
    switch (v.t) {
    case JV_UNDEF: break;
    case JV_NONE: jx_puts(R, b, "None"); break;
    case JV_BOOL: jx_puts(R, b, v.u.b ? "True" : "False"); break;
    case JV_INT: snprintf(buf, sizeof buf, "%lld", (long long)v.u.i); jx_puts(R, b, buf); break;
    case JV_FLOAT: fmt_float(v.u.f, buf, sizeof buf); jx_puts(R, b, buf); break;
    case JV_STR: jx_put(R, b, v.u.s.p, v.u.s.n); break;
    default: repr(R, b, v, depth); break;
    }
}
static void repr(rt *R, sb *b, jv v, int depth) {
    if (depth > 100) jx_fail(R, NULL, "value nested too deeply to print");
    switch (v.t) {
    case JV_STR: py_str_repr(R, b, v.u.s.p, v.u.s.n); break;
    case JV_UNDEF: break;
    case JV_LIST:
        jx_puts(R, b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jx_puts(R, b, ", ");
            repr(R, b, v.u.l->v[i], depth + 1);
        }
        jx_puts(R, b, "]");
        break;
    case JV_DICT:
        if (v.u.d->ns) jx_puts(R, b, "<Namespace ");
        jx_puts(R, b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) jx_puts(R, b, ", ");
            repr(R, b, v.u.d->k[i], depth + 1);
            jx_puts(R, b, ": ");
            repr(R, b, v.u.d->v[i], depth + 1);
        }
        jx_puts(R, b, "}");
        if (v.u.d->ns) jx_puts(R, b, ">");
        break;
    case JV_FUNC: jx_puts(R, b, "<function "); jx_puts(R, b, v.u.fn->name ? v.u.fn->name : "?"); jx_puts(R, b, ">"); break;
    default: jx_to_str_sb(R, b, v, depth); break;
    }
}
jv jx_to_str(rt *R, jv v) {
    if (v.t == JV_STR) return v;
    sb b = {0};
    jx_to_str_sb(R, &b, v, 0);
    return sb_val(&b);
}

/* json.dumps(v, ensure_ascii=False, indent=indent, separators=(", "|",", ": "), sort_keys) */
static void json_str(rt *R, sb *b, const char *p, size_t n) {
    jx_puts(R, b, "\"");
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
            jx_put(R, b, p + s, i - s);
            jx_puts(R, b, e);
            s = i + 1;
        }
    }
    jx_put(R, b, p + s, n - s);
    jx_puts(R, b, "\"");
}
/* ensure_ascii=True: non-ASCII code points as \uXXXX (UTF-16 surrogate pairs above the BMP) */
sb jx_ascii_escape(rt *R, sb in) {
    sb o = {0};
    const unsigned char *p = (const unsigned char *)in.p;
    for (size_t i = 0; i < in.n;) {
        unsigned char c = p[i];
        if (c < 0x80) { jx_put(R, &o, (const char *)p + i, 1); i++; continue; }
        int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (i + (size_t)len > in.n) len = (int)(in.n - i);
        uint32_t cp = len == 4 ? c & 7 : len == 3 ? c & 15 : c & 31;
        for (int k = 1; k < len; k++) cp = (cp << 6) | (p[i + k] & 63);
        char u[16];
        if (cp >= 0x10000) {
            cp -= 0x10000;
            snprintf(u, sizeof u, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
        } else snprintf(u, sizeof u, "\\u%04x", cp);
        jx_puts(R, &o, u);
        i += (size_t)len;
    }
    return o;
}
static int dict_key_cmp(rt *R, void *ctx, size_t a, size_t b) {
    (void)R;
    jdict *d = ctx;
    return jx_cmp_keys(d->k[a], d->k[b]);
}
void jx_to_json(rt *R, sb *b, jv v, int indent, const char *isep, const char *ksep, int sort_keys, int depth, const jnode *at) {
    if (depth > 100) jx_fail(R, at, "tojson: value nested too deeply");
    char buf[64];
    switch (v.t) {
    case JV_UNDEF: /* jinja2 raises on Undefined; the JS port writes null */
    case JV_NONE: jx_puts(R, b, "null"); return;
    case JV_BOOL: jx_puts(R, b, v.u.b ? "true" : "false"); return;
    case JV_INT: snprintf(buf, sizeof buf, "%lld", (long long)v.u.i); jx_puts(R, b, buf); return;
    case JV_FLOAT:
        if (isnan(v.u.f)) jx_puts(R, b, "NaN");
        else if (isinf(v.u.f)) jx_puts(R, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else { fmt_float(v.u.f, buf, sizeof buf); jx_puts(R, b, buf); }
        return;
    case JV_STR: json_str(R, b, v.u.s.p, v.u.s.n); return;
    case JV_LIST:
    case JV_DICT: {
        int isl = v.t == JV_LIST;
        size_t n = isl ? v.u.l->n : v.u.d->n;
        jx_puts(R, b, isl ? "[" : "{");
        if (n == 0) { jx_puts(R, b, isl ? "]" : "}"); return; }
        size_t *idx = ja_alloc(&R->A, n * sizeof(size_t));
        for (size_t i = 0; i < n; i++) idx[i] = i;
        if (!isl && sort_keys) jx_sort_idx(R, idx, n, dict_key_cmp, v.u.d);
        for (size_t i = 0; i < n; i++) {
            if (i) jx_puts(R, b, isep);
            if (indent >= 0) {
                jx_puts(R, b, "\n");
                for (int q = 0; q < indent * (depth + 1); q++) jx_puts(R, b, " ");
            }
            if (isl) jx_to_json(R, b, v.u.l->v[idx[i]], indent, isep, ksep, sort_keys, depth + 1, at);
            else {
                jv k = v.u.d->k[idx[i]];
                if (k.t == JV_STR) json_str(R, b, k.u.s.p, k.u.s.n);
                else {
                    sb kb = {0};
                    jx_to_str_sb(R, &kb, k, 0);
                    if (k.t == JV_BOOL) kb = (sb){0}, jx_puts(R, &kb, k.u.b ? "true" : "false");
                    if (k.t == JV_NONE) kb = (sb){0}, jx_puts(R, &kb, "null");
                    json_str(R, b, kb.p ? kb.p : "", kb.n);
                }
                jx_puts(R, b, ksep);
                jx_to_json(R, b, v.u.d->v[idx[i]], indent, isep, ksep, sort_keys, depth + 1, at);
            }
        }
        if (indent >= 0) {
            jx_puts(R, b, "\n");
            for (int q = 0; q < indent * depth; q++) jx_puts(R, b, " ");
        }
        jx_puts(R, b, isl ? "]" : "}");
        return;
    }
    default: jx_fail(R, at, "tojson: cannot serialize a function");
    }
}
