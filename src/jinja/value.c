/* Jinja runtime values: lists, dicts, the JSON context in, string building, truthiness,
 * equality and Python ordering, a stable sort, code point offsets, call arguments; and
 * jx_fail, the runtime's error exit. See jinja_rt.h. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "jinja/jinja_rt.h"

void jx_fail(rt *R, const jnode *at, const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) m3_errf(R->err, "%s: line %d, column %d: %s", R->name, at->line, at->col, msg);
    else m3_errf(R->err, "%s: %s", R->name, msg);
    longjmp(R->jb, 1);
}

/* ---- lists and dicts */
void jx_push(rt *R, jlist *l, jv x) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jv *nv = ja_alloc(&R->A, nc * sizeof(jv));
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}

jv *jx_find(jdict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (jx_eq(d->k[i], key)) return &d->v[i];
    return NULL;
}
jv *jx_finds(jdict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, key, n)) return &d->v[i];
    return NULL;
}
void jx_set(rt *R, jdict *d, jv key, jv val) {
    jv *p = jx_find(d, key);
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
void jx_sets(rt *R, jdict *d, const char *key, jv val) { jx_set(R, d, v_str(key), val); }

/* ---- JSON in */
jv jx_from_json(rt *R, const json_t *j, int depth) {
    if (depth > 1000) jx_fail(R, NULL, "context JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv d = v_dict(R);
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)j, k, x) jx_set(R, d.u.d, v_str(k), jx_from_json(R, x, depth + 1));
        return d;
    }
    case JSON_ARRAY: {
        jv l = v_list(R, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) jx_push(R, l.u.l, jx_from_json(R, json_array_get(j, i), depth + 1));
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
void jx_put(rt *R, sb *b, const char *s, size_t n) {
    if (b->n + n > R->max_out) jx_fail(R, NULL, "rendered text longer than %zu bytes", R->max_out);
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
void jx_puts(rt *R, sb *b, const char *s) { jx_put(R, b, s, strlen(s)); }

/* ---- truthiness, equality, ordering */
int jx_truthy(jv v) {
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

int jx_eq(jv a, jv b) {
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
            if (!jx_eq(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d == b.u.d) return 1;
        if (a.u.d->n != b.u.d->n || a.u.d->ns || b.u.d->ns) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = jx_find(b.u.d, a.u.d->k[i]);
            if (!o || !jx_eq(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}
int jx_cmp_keys(jv a, jv b) {
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        return c ? c : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    return 0;
}
const char *jx_tname(jv v) {
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "function"};
    return names[v.t];
}
/* Python ordering; errors on incomparable types */
int jx_cmp(rt *R, const jnode *at, jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (inum(a) > inum(b)) - (inum(a) < inum(b));
        return (num(a) > num(b)) - (num(a) < num(b));
    }
    if (a.t == JV_STR && b.t == JV_STR) return jx_cmp_keys(a, b);
    if (a.t == JV_LIST && b.t == JV_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (jx_eq(a.u.l->v[i], b.u.l->v[i])) continue;
            return jx_cmp(R, at, a.u.l->v[i], b.u.l->v[i]);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    jx_fail(R, at, "'<' not supported between instances of '%s' and '%s'", jx_tname(a), jx_tname(b));
}

/* stable merge sort of an index array */
void jx_sort_idx(rt *R, size_t *idx, size_t n, int (*cmp)(rt *, void *, size_t, size_t), void *ctx) {
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
size_t jx_u8_len(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}
/* byte offsets of each code point (plus n at the end) */
size_t *jx_u8_offsets(rt *R, const char *p, size_t n, size_t *count) {
    size_t c = jx_u8_len(p, n);
    size_t *o = ja_alloc(&R->A, (c + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80) o[k++] = i;
    o[k] = n;
    *count = c;
    return o;
}

/* ---- iteration */
jv jx_as_list(rt *R, const jnode *at, jv v) {
    if (v.t == JV_LIST) return v;
    if (v.t == JV_UNDEF) return v_list(R, 0);
    if (v.t == JV_DICT) {
        jv l = v_list(R, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) jx_push(R, l.u.l, v.u.d->k[i]);
        return l;
    }
    if (v.t == JV_STR) {
        size_t cnt;
        size_t *o = jx_u8_offsets(R, v.u.s.p, v.u.s.n, &cnt);
        jv l = v_list(R, cnt);
        for (size_t i = 0; i < cnt; i++) jx_push(R, l.u.l, v_strn(v.u.s.p + o[i], o[i + 1] - o[i]));
        return l;
    }
    jx_fail(R, at, "'%s' object is not iterable", jx_tname(v));
}
jv jx_pair(rt *R, jv a, jv b) {
    jv p = v_list(R, 2);
    jx_push(R, p.u.l, a);
    jx_push(R, p.u.l, b);
    return p;
}
jv jx_dict_items(rt *R, jdict *d) {
    jv l = v_list(R, d->n);
    for (size_t i = 0; i < d->n; i++) jx_push(R, l.u.l, jx_pair(R, d->k[i], d->v[i]));
    return l;
}

/* ---- arguments */
jv jx_arg(args *A, int i, const char *name, jv def) {
    if (i >= 0 && i < A->npos) return A->pos[i];
    for (int k = 0; k < A->nkw; k++)
        if (name && !strcmp(A->names[k], name)) return A->kw[k];
    return def;
}
int jx_has_arg(args *A, int i, const char *name) {
    jv u = v_undef(NULL);
    u.u.s.p = "\x01";
    jv v = jx_arg(A, i, name, u);
    return !(v.t == JV_UNDEF && v.u.s.p && v.u.s.p[0] == 1);
}

jv jx_need_str(rt *R, const jnode *at, jv v, const char *what) {
    if (v.t == JV_STR) return v;
    jx_fail(R, at, "%s: expected a string, got %s", what, jx_tname(v));
}
