/* Jinja filters (`x | trim`, `xs | map(attribute="n") | join(",")`), as jinja2 defines them:
 * a table, name -> function, each filter a small function of the value and the call's
 * arguments. Aliases (count / length, d / default, e / escape...) share a function. The
 * parser refuses unknown names (jx_known_filter); map(NAME) looks them up at run time.
 * See jinja_rt.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_rt.h"

typedef jv filter_fn(rt *R, const jnode *at, jv v, args *A);
typedef struct { const char *name; filter_fn *fn; } filter;

/* the attribute path "a.b.0" of v (map, sort, selectattr... attribute=) */
static jv attr_path(rt *R, jv v, jv path) {
    if (path.t == JV_INT) return jx_get_item(R, NULL, v, path);
    if (path.t != JV_STR) return v_undef(NULL);
    const char *p = path.u.s.p, *e = p + path.u.s.n;
    while (p <= e) {
        const char *dot = memchr(p, '.', (size_t)(e - p));
        if (!dot) dot = e;
        size_t n = (size_t)(dot - p);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
        if (digits && n < 18) v = jx_get_item(R, NULL, v, v_int(atoll(ja_strndup(&R->A, p, n))));
        else if (v.t == JV_DICT) {
            jv *x = jx_finds(v.u.d, p, n);
            v = x ? *x : v_undef(NULL);
        } else v = jx_get_attr(R, v, ja_strndup(&R->A, p, n));
        p = dot + 1;
    }
    return v;
}

typedef struct sortctx { jv *keys; int cs; const jnode *at; } sortctx;
static jv lower_if(rt *R, jv k, int cs) { return (!cs && k.t == JV_STR) ? jx_case(R, k, 1) : k; }
static int sort_cmp(rt *R, void *c, size_t a, size_t b) {
    sortctx *s = c;
    return jx_cmp(R, s->at, s->keys[a], s->keys[b]);
}

/* select / reject / selectattr / rejectattr: items (or their attribute) passing a test, or truthy */
static jv select_like(rt *R, const jnode *at, const char *name, jv v, args *A) {
    int attr = !strcmp(name, "selectattr") || !strcmp(name, "rejectattr");
    int rej = name[0] == 'r';
    jv l = jx_as_list(R, at, v);
    jv out = v_list(R, 0);
    int off = attr ? 1 : 0;
    jv an = attr ? jx_arg(A, 0, NULL, v_undef(NULL)) : v_undef(NULL);
    jv tn = jx_arg(A, off, NULL, v_undef(NULL));
    args ta = {0};
    if (A->npos > off + 1) { ta.pos = A->pos + off + 1; ta.npos = A->npos - off - 1; }
    char tbuf[32] = "";
    if (tn.t == JV_STR) {
        if (tn.u.s.n >= sizeof tbuf) jx_fail(R, at, "%s: unknown test", name);
        memcpy(tbuf, tn.u.s.p, tn.u.s.n);
        tbuf[tn.u.s.n] = 0;
        if (!strcmp(tbuf, "==")) strcpy(tbuf, "eq");
        else if (!strcmp(tbuf, "!=")) strcpy(tbuf, "ne");
        else if (!strcmp(tbuf, ">")) strcpy(tbuf, "gt");
        else if (!strcmp(tbuf, "<")) strcpy(tbuf, "lt");
        else if (!strcmp(tbuf, ">=")) strcpy(tbuf, "ge");
        else if (!strcmp(tbuf, "<=")) strcpy(tbuf, "le");
        if (!jx_known_test(tbuf)) jx_fail(R, at, "%s: unknown test '%s'", name, tbuf);
    } else if (tn.t != JV_UNDEF) jx_fail(R, at, "%s: test name must be a string", name);
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv x = l.u.l->v[i];
        jv subj = attr ? attr_path(R, x, an) : x;
        int ok = tbuf[0] ? jx_test(R, at, tbuf, subj, &ta) : jx_truthy(subj);
        if (ok != rej) jx_push(R, out.u.l, x);
    }
    return out;
}

static jv f_length(rt *R, const jnode *at, jv v, args *A) {
    if (v.t == JV_STR) return v_int((int64_t)jx_u8_len(v.u.s.p, v.u.s.n));
    if (v.t == JV_LIST) return v_int((int64_t)v.u.l->n);
    if (v.t == JV_DICT) return v_int((int64_t)v.u.d->n);
    if (v.t == JV_UNDEF) return v_int(0);
    jx_fail(R, at, "object of type '%s' has no len()", jx_tname(v));
}

static jv f_default(rt *R, const jnode *at, jv v, args *A) {
    jv def = jx_arg(A, 0, "default_value", v_strn("", 0));
    int boolean = jx_truthy(jx_arg(A, 1, "boolean", v_bool(0)));
    if (v.t == JV_UNDEF || (boolean && !jx_truthy(v))) return def;
    return v;
}

static jv f_safe(rt *R, const jnode *at, jv v, args *A) { return v; }
static jv f_string(rt *R, const jnode *at, jv v, args *A) { return jx_to_str(R, v); }

static jv f_trim(rt *R, const jnode *at, jv v, args *A) {
    return jx_strip(R, jx_to_str(R, v), jx_arg(A, 0, "chars", v_none()), 1, 1);
}

static jv f_upper(rt *R, const jnode *at, jv v, args *A) { return jx_case(R, jx_to_str(R, v), 0); }
static jv f_lower(rt *R, const jnode *at, jv v, args *A) { return jx_case(R, jx_to_str(R, v), 1); }
static jv f_title(rt *R, const jnode *at, jv v, args *A) { return jx_case(R, jx_to_str(R, v), 4); }
static jv f_capitalize(rt *R, const jnode *at, jv v, args *A) { return jx_case(R, jx_case(R, jx_to_str(R, v), 1), 3); }

static jv f_escape(rt *R, const jnode *at, jv v, args *A) {
    jv s = jx_to_str(R, v);
    sb b = {0};
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        if (c == '&') jx_puts(R, &b, "&amp;");
        else if (c == '<') jx_puts(R, &b, "&lt;");
        else if (c == '>') jx_puts(R, &b, "&gt;");
        else if (c == '"') jx_puts(R, &b, "&#34;");
        else if (c == '\'') jx_puts(R, &b, "&#39;");
        else jx_put(R, &b, &c, 1);
    }
    return sb_val(&b);
}

static jv f_replace(rt *R, const jnode *at, jv v, args *A) {
    jv s = jx_to_str(R, v);
    jv o = jx_to_str(R, jx_arg(A, 0, "old", v_strn("", 0))), nw = jx_to_str(R, jx_arg(A, 1, "new", v_strn("", 0)));
    jv c = jx_arg(A, 2, "count", v_none());
    return jx_replace(R, s, o, nw, c.t == JV_INT ? c.u.i : -1);
}

static jv f_join(rt *R, const jnode *at, jv v, args *A) {
    jv l = jx_as_list(R, at, v);
    jv sep = jx_to_str(R, jx_arg(A, 0, "d", v_strn("", 0)));
    jv attrn = jx_arg(A, 1, "attribute", v_none());
    sb b = {0};
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (i) jx_put(R, &b, sep.u.s.p, sep.u.s.n);
        jv x = l.u.l->v[i];
        if (attrn.t != JV_NONE) x = attr_path(R, x, attrn);
        jx_to_str_sb(R, &b, x, 0);
    }
    return sb_val(&b);
}

static jv first_last(rt *R, const jnode *at, const char *fn, jv v, args *A) {
    jv l = jx_as_list(R, at, v);
    if (!l.u.l->n) return v_undef(NULL);
    return fn[0] == 'f' ? l.u.l->v[0] : l.u.l->v[l.u.l->n - 1];
}
static jv f_first(rt *R, const jnode *at, jv v, args *A) { return first_last(R, at, "first", v, A); }
static jv f_last(rt *R, const jnode *at, jv v, args *A) { return first_last(R, at, "last", v, A); }

static jv f_list(rt *R, const jnode *at, jv v, args *A) {
    jv l = jx_as_list(R, at, v);
    if (l.u.l == (v.t == JV_LIST ? v.u.l : NULL)) { /* copy */
        jv c = v_list(R, l.u.l->n);
        for (size_t i = 0; i < l.u.l->n; i++) jx_push(R, c.u.l, l.u.l->v[i]);
        return c;
    }
    return l;
}

static jv f_int(rt *R, const jnode *at, jv v, args *A) {
    jv def = jx_arg(A, 0, "default", v_int(0));
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

static jv f_float(rt *R, const jnode *at, jv v, args *A) {
    jv def = jx_arg(A, 0, "default", v_float(0));
    if (is_num(v)) return v_float(num(v));
    if (v.t == JV_STR) {
        char *s = ja_strndup(&R->A, v.u.s.p, v.u.s.n), *e;
        double d = strtod(s, &e);
        while (*e && py_space((unsigned char)*e)) e++;
        if (e != s && !*e) return v_float(d);
    }
    return def;
}

static jv f_bool(rt *R, const jnode *at, jv v, args *A) { return v_bool(jx_truthy(v)); }

static jv f_abs(rt *R, const jnode *at, jv v, args *A) {
    if (v.t == JV_INT) return v_int(v.u.i < 0 ? -v.u.i : v.u.i);
    if (v.t == JV_FLOAT) return v_float(fabs(v.u.f));
    if (v.t == JV_BOOL) return v_int(v.u.b);
    jx_fail(R, at, "bad operand type for abs(): '%s'", jx_tname(v));
}

static jv f_round(rt *R, const jnode *at, jv v, args *A) {
    if (!is_num(v)) jx_fail(R, at, "round: expected a number, got %s", jx_tname(v));
    int64_t prec = inum(jx_arg(A, 0, "precision", v_int(0)));
    jv meth = jx_arg(A, 1, "method", v_str("common"));
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    double m = pow(10, (double)prec), x = num(v) * m, r;
    if (str_eq(meth, "ceil")) r = ceil(x);
    else if (str_eq(meth, "floor")) r = floor(x);
    else r = round(x);
    return v_float(r / m);
}

static jv f_tojson(rt *R, const jnode *at, jv v, args *A) {
    jv ind = jx_arg(A, 0, "indent", v_none());
    int indent = ind.t == JV_INT ? (int)(ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : ind.u.i) : -1;
    int sk = jx_truthy(jx_arg(A, -1, "sort_keys", v_bool(0)));
    int ea = jx_truthy(jx_arg(A, -1, "ensure_ascii", v_bool(0)));
    const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
    jv seps = jx_arg(A, -1, "separators", v_none());
    if (seps.t == JV_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == JV_STR && seps.u.l->v[1].t == JV_STR) {
        isep = ja_strndup(&R->A, seps.u.l->v[0].u.s.p, seps.u.l->v[0].u.s.n);
        ksep = ja_strndup(&R->A, seps.u.l->v[1].u.s.p, seps.u.l->v[1].u.s.n);
    }
    sb b = {0};
    jx_to_json(R, &b, v, indent, isep, ksep, sk, 0, at);
    if (ea) b = jx_ascii_escape(R, b);
    return sb_val(&b);
}

static jv f_items(rt *R, const jnode *at, jv v, args *A) {
    if (v.t == JV_UNDEF) return v_list(R, 0);
    if (v.t != JV_DICT) jx_fail(R, at, "items: expected a mapping, got %s", jx_tname(v));
    return jx_dict_items(R, v.u.d);
}

static jv f_dictsort(rt *R, const jnode *at, jv v, args *A) {
    if (v.t != JV_DICT) jx_fail(R, at, "dictsort: expected a mapping, got %s", jx_tname(v));
    int cs = jx_truthy(jx_arg(A, 0, "case_sensitive", v_bool(0)));
    jv by = jx_arg(A, 1, "by", v_str("key"));
    int rev = jx_truthy(jx_arg(A, 2, "reverse", v_bool(0)));
    size_t n = v.u.d->n;
    sortctx sc = {ja_alloc(&R->A, (n + 1) * sizeof(jv)), cs, at};
    size_t *idx = ja_alloc(&R->A, (n + 1) * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        idx[i] = i;
        sc.keys[i] = lower_if(R, str_eq(by, "value") ? v.u.d->v[i] : v.u.d->k[i], cs);
    }
    jx_sort_idx(R, idx, n, sort_cmp, &sc);
    jv out = v_list(R, n);
    for (size_t i = 0; i < n; i++) {
        size_t j = rev ? idx[n - 1 - i] : idx[i];
        jx_push(R, out.u.l, jx_pair(R, v.u.d->k[j], v.u.d->v[j]));
    }
    return out;
}

static jv f_selectattr(rt *R, const jnode *at, jv v, args *A) { return select_like(R, at, "selectattr", v, A); }
static jv f_rejectattr(rt *R, const jnode *at, jv v, args *A) { return select_like(R, at, "rejectattr", v, A); }
static jv f_select(rt *R, const jnode *at, jv v, args *A) { return select_like(R, at, "select", v, A); }
static jv f_reject(rt *R, const jnode *at, jv v, args *A) { return select_like(R, at, "reject", v, A); }

static jv f_map(rt *R, const jnode *at, jv v, args *A) {
    jv l = jx_as_list(R, at, v);
    jv out = v_list(R, l.u.l->n);
    if (jx_has_arg(A, -1, "attribute")) {
        jv an = jx_arg(A, -1, "attribute", v_none());
        jv def = jx_arg(A, -1, "default", v_undef(NULL));
        for (size_t i = 0; i < l.u.l->n; i++) {
            jv x = attr_path(R, l.u.l->v[i], an);
            jx_push(R, out.u.l, x.t == JV_UNDEF && jx_has_arg(A, -1, "default") ? def : x);
        }
        return out;
    }
    jv fname = jx_arg(A, 0, NULL, v_undef(NULL));
    if (fname.t != JV_STR || fname.u.s.n > 30) jx_fail(R, at, "map: expected a filter name or attribute=");
    char nb[32];
    memcpy(nb, fname.u.s.p, fname.u.s.n);
    nb[fname.u.s.n] = 0;
    if (!jx_known_filter(nb)) jx_fail(R, at, "map: unknown filter '%s'", nb);
    args sub = {A->pos + 1, A->npos - 1, A->names, A->kw, A->nkw};
    for (size_t i = 0; i < l.u.l->n; i++) jx_push(R, out.u.l, jx_filter(R, at, ja_strndup(&R->A, nb, strlen(nb)), l.u.l->v[i], &sub));
    return out;
}

static jv f_unique(rt *R, const jnode *at, jv v, args *A) {
    jv l = jx_as_list(R, at, v);
    int cs = jx_truthy(jx_arg(A, 0, "case_sensitive", v_bool(0)));
    jv an = jx_arg(A, 1, "attribute", v_none());
    jv out = v_list(R, 0), seen = v_list(R, 0);
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv k = l.u.l->v[i];
        if (an.t != JV_NONE) k = attr_path(R, k, an);
        k = lower_if(R, k, cs);
        int dup = 0;
        for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = jx_eq(seen.u.l->v[j], k);
        if (!dup) { jx_push(R, seen.u.l, k); jx_push(R, out.u.l, l.u.l->v[i]); }
    }
    return out;
}

static jv f_reverse(rt *R, const jnode *at, jv v, args *A) {
    if (v.t == JV_STR) {
        size_t cnt;
        size_t *o = jx_u8_offsets(R, v.u.s.p, v.u.s.n, &cnt);
        sb b = {0};
        for (size_t i = cnt; i-- > 0;) jx_put(R, &b, v.u.s.p + o[i], o[i + 1] - o[i]);
        return sb_val(&b);
    }
    jv l = jx_as_list(R, at, v);
    jv out = v_list(R, l.u.l->n);
    for (size_t i = l.u.l->n; i-- > 0;) jx_push(R, out.u.l, l.u.l->v[i]);
    return out;
}

static jv f_sort(rt *R, const jnode *at, jv v, args *A) {
    jv l = jx_as_list(R, at, v);
    int rev = jx_truthy(jx_arg(A, 0, "reverse", v_bool(0)));
    int cs = jx_truthy(jx_arg(A, 1, "case_sensitive", v_bool(0)));
    jv an = jx_arg(A, 2, "attribute", v_none());
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
        jx_sort_idx(R, idx, n, sort_cmp, &sc);
        jv out = v_list(R, n);
        for (size_t i = n; i-- > 0;) jx_push(R, out.u.l, l.u.l->v[idx[i]]);
        return out;
    }
    jx_sort_idx(R, idx, n, sort_cmp, &sc);
    jv out = v_list(R, n);
    for (size_t i = 0; i < n; i++) jx_push(R, out.u.l, l.u.l->v[idx[i]]);
    return out;
}

static jv f_indent(rt *R, const jnode *at, jv v, args *A) {
    jv s = jx_to_str(R, v);
    jv w = jx_arg(A, 0, "width", v_int(4));
    int first = jx_truthy(jx_arg(A, 1, "first", v_bool(0)));
    int blank = jx_truthy(jx_arg(A, 2, "blank", v_bool(0)));
    jv pad;
    if (w.t == JV_STR) pad = w;
    else {
        int64_t k = inum(w);
        if (k < 0) k = 0;
        if (k > 4096) jx_fail(R, at, "indent: width too large");
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
        if ((line0 ? first : 1) && (blank || !empty) && !(j == n && empty && !line0)) jx_put(R, &b, pad.u.s.p, pad.u.s.n);
        jx_put(R, &b, p + i, j - i);
        if (j < n) jx_puts(R, &b, "\n");
        line0 = 0;
        i = j + 1;
        if (j == n) break;
    }
    return sb_val(&b);
}

static jv f_wordcount(rt *R, const jnode *at, jv v, args *A) {
    jv s = jx_to_str(R, v);
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

static jv batch_slice(rt *R, const jnode *at, const char *fn, jv v, args *A) {
    jv l = jx_as_list(R, at, v);
    int64_t k = inum(jx_arg(A, 0, fn[0] == 'b' ? "linecount" : "slices", v_int(1)));
    if (k <= 0) jx_fail(R, at, "%s: count must be positive", fn);
    jv fill = jx_arg(A, 1, "fill_with", v_none());
    int has_fill = fill.t != JV_NONE;
    jv out = v_list(R, 0);
    size_t n = l.u.l->n;
    if (fn[0] == 'b') {
        for (size_t i = 0; i < n; i += (size_t)k) {
            jv row = v_list(R, 0);
            for (size_t j = i; j < i + (size_t)k; j++) {
                if (j < n) jx_push(R, row.u.l, l.u.l->v[j]);
                else if (has_fill) jx_push(R, row.u.l, fill);
            }
            jx_push(R, out.u.l, row);
            if ((size_t)k > n) break;
        }
        return out;
    }
    size_t per = n / (size_t)k, extra = n % (size_t)k, off = 0;
    for (size_t s = 0; s < (size_t)k; s++) {
        size_t len = per + (s < extra);
        jv row = v_list(R, 0);
        for (size_t j = 0; j < len; j++) jx_push(R, row.u.l, l.u.l->v[off + j]);
        if (has_fill && s >= extra && extra) jx_push(R, row.u.l, fill);
        off += len;
        jx_push(R, out.u.l, row);
    }
    return out;
}
static jv f_batch(rt *R, const jnode *at, jv v, args *A) { return batch_slice(R, at, "batch", v, A); }
static jv f_slice(rt *R, const jnode *at, jv v, args *A) { return batch_slice(R, at, "slice", v, A); }

static jv f_sum(rt *R, const jnode *at, jv v, args *A) {
    jv l = jx_as_list(R, at, v);
    jv an = jx_arg(A, 0, "attribute", v_none());
    jv acc = jx_arg(A, 1, "start", v_int(0));
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv x = an.t != JV_NONE ? attr_path(R, l.u.l->v[i], an) : l.u.l->v[i];
        if (!is_num(x) || !is_num(acc)) jx_fail(R, at, "sum: unsupported operand types");
        if (x.t == JV_FLOAT || acc.t == JV_FLOAT) acc = v_float(num(acc) + num(x));
        else {
            int64_t r;
            if (__builtin_add_overflow(inum(acc), inum(x), &r)) jx_fail(R, at, "integer overflow");
            acc = v_int(r);
        }
    }
    return acc;
}

static jv min_max(rt *R, const jnode *at, const char *fn, jv v, args *A) {
    jv l = jx_as_list(R, at, v);
    if (!l.u.l->n) return v_undef(NULL);
    int cs = jx_truthy(jx_arg(A, 0, "case_sensitive", v_bool(0)));
    jv an = jx_arg(A, 1, "attribute", v_none());
    size_t best = 0;
    for (size_t i = 1; i < l.u.l->n; i++) {
        jv a = l.u.l->v[i], b = l.u.l->v[best];
        if (an.t != JV_NONE) { a = attr_path(R, a, an); b = attr_path(R, b, an); }
        int c = jx_cmp(R, at, lower_if(R, a, cs), lower_if(R, b, cs));
        if (fn[1] == 'i' ? c < 0 : c > 0) best = i;
    }
    return l.u.l->v[best];
}
static jv f_min(rt *R, const jnode *at, jv v, args *A) { return min_max(R, at, "min", v, A); }
static jv f_max(rt *R, const jnode *at, jv v, args *A) { return min_max(R, at, "max", v, A); }

static jv f_attr(rt *R, const jnode *at, jv v, args *A) {
    jv nm = jx_to_str(R, jx_arg(A, 0, "name", v_strn("", 0)));
    if (v.t == JV_DICT) {
        jv *x = jx_finds(v.u.d, nm.u.s.p, nm.u.s.n);
        return x ? *x : v_undef(NULL);
    }
    return v_undef(NULL);
}

static jv f_center(rt *R, const jnode *at, jv v, args *A) {
    jv s = jx_to_str(R, v);
    int64_t w = inum(jx_arg(A, 0, "width", v_int(80)));
    int64_t len = (int64_t)jx_u8_len(s.u.s.p, s.u.s.n);
    if (w > 100000) jx_fail(R, at, "center: width too large");
    if (w <= len) return s;
    int64_t padt = w - len, left = padt / 2 + (padt & w & 1);
    sb b = {0};
    for (int64_t i = 0; i < left; i++) jx_puts(R, &b, " ");
    jx_put(R, &b, s.u.s.p, s.u.s.n);
    for (int64_t i = 0; i < padt - left; i++) jx_puts(R, &b, " ");
    return sb_val(&b);
}

static jv f_truncate(rt *R, const jnode *at, jv v, args *A) {
    jv s = jx_to_str(R, v);
    int64_t len = inum(jx_arg(A, 0, "length", v_int(255)));
    int killw = jx_truthy(jx_arg(A, 1, "killwords", v_bool(0)));
    jv end = jx_to_str(R, jx_arg(A, 2, "end", v_str("...")));
    int64_t leeway = inum(jx_arg(A, 3, "leeway", v_int(5)));
    size_t cnt;
    size_t *o = jx_u8_offsets(R, s.u.s.p, s.u.s.n, &cnt);
    if ((int64_t)cnt <= len + leeway) return s;
    int64_t keep = len - (int64_t)jx_u8_len(end.u.s.p, end.u.s.n);
    if (keep < 0) keep = 0;
    size_t cut = o[keep];
    sb b = {0};
    if (!killw) {
        size_t sp = cut;
        while (sp > 0 && s.u.s.p[sp - 1] != ' ') sp--;
        if (sp > 0) cut = sp - 1;
    }
    jx_put(R, &b, s.u.s.p, cut);
    jx_put(R, &b, end.u.s.p, end.u.s.n);
    return sb_val(&b);
}

static jv f_striptags(rt *R, const jnode *at, jv v, args *A) {
    jv s = jx_to_str(R, v);
    sb b = {0};
    int in = 0, sp = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        if (c == '<') { in = 1; continue; }
        if (c == '>' && in) { in = 0; continue; }
        if (in) continue;
        if (py_space((unsigned char)c)) { sp = b.n > 0; continue; }
        if (sp) { jx_puts(R, &b, " "); sp = 0; }
        jx_put(R, &b, &c, 1);
    }
    return sb_val(&b);
}

static const filter FILTERS[] = {
    {"length", f_length}, {"count", f_length}, {"default", f_default}, {"d", f_default}, {"trim", f_trim},
    {"upper", f_upper}, {"lower", f_lower}, {"title", f_title}, {"capitalize", f_capitalize}, {"replace", f_replace},
    {"join", f_join}, {"first", f_first}, {"last", f_last}, {"list", f_list}, {"string", f_string}, {"int", f_int},
    {"float", f_float}, {"abs", f_abs}, {"round", f_round}, {"tojson", f_tojson}, {"items", f_items},
    {"dictsort", f_dictsort}, {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"select", f_select},
    {"reject", f_reject}, {"map", f_map}, {"unique", f_unique}, {"reverse", f_reverse}, {"sort", f_sort},
    {"safe", f_safe}, {"indent", f_indent}, {"wordcount", f_wordcount}, {"batch", f_batch}, {"e", f_escape},
    {"escape", f_escape}, {"sum", f_sum}, {"min", f_min}, {"max", f_max}, {"attr", f_attr}, {"center", f_center},
    {"truncate", f_truncate}, {"striptags", f_striptags}, {"forceescape", f_safe}, {"bool", f_bool},
    {"slice", f_slice},
};

static const filter *find_filter(const char *name) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof *FILTERS; i++)
        if (!strcmp(FILTERS[i].name, name)) return &FILTERS[i];
    return NULL;
}

int jx_known_filter(const char *name) { return find_filter(name) != NULL; }

jv jx_filter(rt *R, const jnode *at, const char *name, jv v, args *A) {
    const filter *f = find_filter(name);
    if (!f) jx_fail(R, at, "unknown filter '%s'", name);
    return f->fn(R, at, v, A);
}
