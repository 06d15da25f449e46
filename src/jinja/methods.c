/* Jinja string and dict methods (`s.strip()`, `d.items()`), as Python's str and dict
 * methods behave: two tables, name -> function. Attribute access (eval.c) asks the tables
 * whether a name is a method; a call runs it through jx_call_method. See jinja_rt.h. */
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_rt.h"

typedef jv method_fn(rt *R, const jnode *at, jv self, args *A);
typedef struct { const char *name; method_fn *fn; } method;

/* ---- str */
static int64_t cp_index(const char *p, size_t byte_off) { return (int64_t)jx_u8_len(p, byte_off); }

static jv m_strip(rt *R, const jnode *at, jv s, args *A) { return jx_strip(R, s, jx_arg(A, 0, "chars", v_none()), 1, 1); }
static jv m_lstrip(rt *R, const jnode *at, jv s, args *A) { return jx_strip(R, s, jx_arg(A, 0, "chars", v_none()), 1, 0); }
static jv m_rstrip(rt *R, const jnode *at, jv s, args *A) { return jx_strip(R, s, jx_arg(A, 0, "chars", v_none()), 0, 1); }

static jv m_split(rt *R, const jnode *at, jv s, args *A) {
    jv sep = jx_arg(A, 0, "sep", v_none());
    jv mx = jx_arg(A, 1, "maxsplit", v_int(-1));
    return jx_split(R, at, s, sep, inum(mx));
}

static jv m_rsplit(rt *R, const jnode *at, jv s, args *A) {
    jv sep = jx_arg(A, 0, "sep", v_none());
    jv mx = jx_arg(A, 1, "maxsplit", v_int(-1));
    if (inum(mx) < 0) return jx_split(R, at, s, sep, inum(mx));
    /* with a limit: split from the right */
    jv all = jx_split(R, at, s, sep, -1);
    int64_t k = inum(mx);
    if ((int64_t)all.u.l->n <= k + 1 && sep.t == JV_STR) return all;
    if (sep.t != JV_STR) { /* from the right; the head keeps its leading whitespace */
        const char *p = s.u.s.p;
        size_t e = s.u.s.n, w;
        jv l = v_list(R, 0);
        for (int64_t done = 0;; done++) {
            while (e > 0 && (w = m3_utf8_space_before(p, e))) e -= w;
            if (e == 0) break;
            if (done >= k) { jx_push(R, l.u.l, v_strn(p, e)); break; }
            size_t st = e;
            int32_t c;
            while (st > 0 && !m3_utf8_space_before(p, st)) st -= jx_u8_back(p, st, &c);
            jx_push(R, l.u.l, v_strn(p + st, e - st));
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
        if (i) jx_put(R, &b, sep.u.s.p, sep.u.s.n);
        jx_put(R, &b, all.u.l->v[i].u.s.p, all.u.l->v[i].u.s.n);
    }
    jv l = v_list(R, 0);
    jx_push(R, l.u.l, sb_val(&b));
    for (size_t i = head; i < all.u.l->n; i++) jx_push(R, l.u.l, all.u.l->v[i]);
    return l;
}

/* startswith / endswith: the argument is a string or a list of them */
static jv affix(rt *R, const jnode *at, jv s, args *A, const char *m, int ends) {
    jv x = jx_arg(A, 0, "prefix", v_undef(NULL));
    jv one[1] = {x};
    jv *cands = one;
    size_t nc = 1;
    if (x.t == JV_LIST) { cands = x.u.l->v; nc = x.u.l->n; }
    for (size_t i = 0; i < nc; i++) {
        jv c = jx_need_str(R, at, cands[i], m);
        if (c.u.s.n <= s.u.s.n && !memcmp(s.u.s.p + (ends ? s.u.s.n - c.u.s.n : 0), c.u.s.p, c.u.s.n)) return v_bool(1);
    }
    return v_bool(0);
}
static jv m_startswith(rt *R, const jnode *at, jv s, args *A) { return affix(R, at, s, A, "startswith", 0); }
static jv m_endswith(rt *R, const jnode *at, jv s, args *A) { return affix(R, at, s, A, "endswith", 1); }

static jv m_upper(rt *R, const jnode *at, jv s, args *A) { return jx_case(R, s, 0); }
static jv m_lower(rt *R, const jnode *at, jv s, args *A) { return jx_case(R, s, 1); }
static jv m_title(rt *R, const jnode *at, jv s, args *A) { return jx_case(R, s, 2); }
static jv m_capitalize(rt *R, const jnode *at, jv s, args *A) { jv l = jx_case(R, s, 1); return jx_case(R, l, 3); }

static jv m_replace(rt *R, const jnode *at, jv s, args *A) {
    jv o = jx_need_str(R, at, jx_arg(A, 0, "old", v_undef(NULL)), "replace");
    jv nw = jx_need_str(R, at, jx_arg(A, 1, "new", v_undef(NULL)), "replace");
    return jx_replace(R, s, o, nw, inum(jx_arg(A, 2, "count", v_int(-1))));
}

/* find / rfind / index: the code point index of the first (last) match, or -1 (index: an error) */
static jv find_sub(rt *R, const jnode *at, jv s, args *A, const char *m, int from_right, int must) {
    jv x = jx_need_str(R, at, jx_arg(A, 0, "sub", v_undef(NULL)), m);
    const char *hit = NULL;
    if (from_right) {
        for (size_t i = s.u.s.n + 1; i-- > 0;)
            if (i + x.u.s.n <= s.u.s.n && !memcmp(s.u.s.p + i, x.u.s.p, x.u.s.n)) { hit = s.u.s.p + i; break; }
    } else hit = jx_memfind(s.u.s.p, s.u.s.n, x.u.s.p, x.u.s.n);
    if (!hit && must) jx_fail(R, at, "substring not found");
    return v_int(hit ? cp_index(s.u.s.p, (size_t)(hit - s.u.s.p)) : -1);
}
static jv m_find(rt *R, const jnode *at, jv s, args *A) { return find_sub(R, at, s, A, "find", 0, 0); }
static jv m_rfind(rt *R, const jnode *at, jv s, args *A) { return find_sub(R, at, s, A, "rfind", 1, 0); }
static jv m_index(rt *R, const jnode *at, jv s, args *A) { return find_sub(R, at, s, A, "index", 0, 1); }

static jv m_count(rt *R, const jnode *at, jv s, args *A) {
    jv x = jx_need_str(R, at, jx_arg(A, 0, "sub", v_undef(NULL)), "count");
    if (x.u.s.n == 0) return v_int((int64_t)jx_u8_len(s.u.s.p, s.u.s.n) + 1);
    int64_t c = 0;
    const char *p = s.u.s.p, *e = p + s.u.s.n, *q;
    while ((q = jx_memfind(p, (size_t)(e - p), x.u.s.p, x.u.s.n))) { c++; p = q + x.u.s.n; }
    return v_int(c);
}

static jv m_join(rt *R, const jnode *at, jv s, args *A) {
    jv l = jx_as_list(R, at, jx_arg(A, 0, "iterable", v_undef(NULL)));
    sb b = {0};
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (i) jx_put(R, &b, s.u.s.p, s.u.s.n);
        jv x = jx_need_str(R, at, l.u.l->v[i], "join");
        jx_put(R, &b, x.u.s.p, x.u.s.n);
    }
    return sb_val(&b);
}

static jv m_splitlines(rt *R, const jnode *at, jv s, args *A) {
    jv l = v_list(R, 0);
    size_t i = 0, n = s.u.s.n;
    const char *p = s.u.s.p;
    while (i < n) { /* Python's line boundaries: \n \r \r\n \v \f \x1c-\x1e U+0085 U+2028 U+2029 */
        size_t j = i, w = 0;
        while (j < n) {
            int32_t c;
            w = jx_u8_dec(p + j, n - j, &c);
            if ((c >= '\n' && c <= '\r') || (c >= 0x1c && c <= 0x1e) || c == 0x85 || c == 0x2028 || c == 0x2029) break;
            j += w;
        }
        jx_push(R, l.u.l, v_strn(p + i, j - i));
        if (j >= n) break;
        if (p[j] == '\r' && j + 1 < n && p[j + 1] == '\n') w = 2;
        i = j + w;
    }
    return l;
}

static jv m_isspace(rt *R, const jnode *at, jv s, args *A) {
    if (s.u.s.n == 0) return v_bool(0);
    for (size_t i = 0, w; i < s.u.s.n; i += w)
        if (!(w = m3_utf8_space_at(s.u.s.p + i, s.u.s.n - i))) return v_bool(0);
    return v_bool(1);
}

/* isdigit / isalpha / isalnum / islower / isupper over ASCII classes; islower and isupper
 * also need one cased character */
enum { IS_DIGIT, IS_ALPHA, IS_ALNUM, IS_LOWER, IS_UPPER };
static jv ascii_is(jv s, int what) {
    if (s.u.s.n == 0) return v_bool(0);
    int cased = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char c = (unsigned char)s.u.s.p[i];
        int dg = c >= '0' && c <= '9', lo = c >= 'a' && c <= 'z', up = c >= 'A' && c <= 'Z';
        int ok = what == IS_DIGIT ? dg : what == IS_ALPHA ? lo || up : what == IS_ALNUM ? lo || up || dg
               : what == IS_LOWER ? !up : !lo;
        if (!ok) return v_bool(0);
        cased |= lo || up;
    }
    if ((what == IS_LOWER || what == IS_UPPER) && !cased) return v_bool(0);
    return v_bool(1);
}
static jv m_isdigit(rt *R, const jnode *at, jv s, args *A) { return ascii_is(s, IS_DIGIT); }
static jv m_isalpha(rt *R, const jnode *at, jv s, args *A) { return ascii_is(s, IS_ALPHA); }
static jv m_isalnum(rt *R, const jnode *at, jv s, args *A) { return ascii_is(s, IS_ALNUM); }
static jv m_islower(rt *R, const jnode *at, jv s, args *A) { return ascii_is(s, IS_LOWER); }
static jv m_isupper(rt *R, const jnode *at, jv s, args *A) { return ascii_is(s, IS_UPPER); }

/* "{}", "{0}", "{name}"; no format specs */
static jv m_format(rt *R, const jnode *at, jv s, args *A) {
    sb b = {0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    int auto_i = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') { jx_puts(R, &b, "{"); i++; continue; }
        if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') { jx_puts(R, &b, "}"); i++; continue; }
        if (p[i] != '{') { jx_put(R, &b, p + i, 1); continue; }
        size_t j = i + 1;
        while (j < n && p[j] != '}') j++;
        if (j >= n) jx_fail(R, at, "format: single '{' encountered in format string");
        char key[64];
        size_t kl = j - i - 1 < sizeof key - 1 ? j - i - 1 : sizeof key - 1;
        memcpy(key, p + i + 1, kl);
        key[kl] = 0;
        jv v;
        if (kl == 0) v = jx_arg(A, auto_i++, NULL, v_undef(NULL));
        else if (key[0] >= '0' && key[0] <= '9') v = jx_arg(A, atoi(key), NULL, v_undef(NULL));
        else v = jx_arg(A, -1, key, v_undef(NULL));
        if (v.t == JV_UNDEF) jx_fail(R, at, "format: missing argument '%s'", key);
        jx_to_str_sb(R, &b, v, 0);
        i = j;
    }
    return sb_val(&b);
}

static const method STR_METHODS[] = {
    {"strip", m_strip}, {"lstrip", m_lstrip}, {"rstrip", m_rstrip}, {"split", m_split}, {"rsplit", m_rsplit},
    {"startswith", m_startswith}, {"endswith", m_endswith}, {"upper", m_upper}, {"lower", m_lower},
    {"replace", m_replace}, {"find", m_find}, {"rfind", m_rfind}, {"count", m_count}, {"title", m_title},
    {"capitalize", m_capitalize}, {"format", m_format}, {"join", m_join}, {"splitlines", m_splitlines},
    {"isdigit", m_isdigit}, {"isalpha", m_isalpha}, {"isalnum", m_isalnum}, {"isspace", m_isspace},
    {"islower", m_islower}, {"isupper", m_isupper}, {"index", m_index},
};

/* ---- dict */
static jv m_get(rt *R, const jnode *at, jv self, args *A) {
    jv *v = jx_find(self.u.d, jx_arg(A, 0, "key", v_none()));
    return v ? *v : jx_arg(A, 1, "default", v_none());
}
static jv m_keys(rt *R, const jnode *at, jv self, args *A) { return jx_as_list(R, at, self); }
static jv m_values(rt *R, const jnode *at, jv self, args *A) {
    jdict *d = self.u.d;
    jv l = v_list(R, d->n);
    for (size_t i = 0; i < d->n; i++) jx_push(R, l.u.l, d->v[i]);
    return l;
}
static jv m_items(rt *R, const jnode *at, jv self, args *A) { return jx_dict_items(R, self.u.d); }

static const method DICT_METHODS[] = {{"get", m_get}, {"keys", m_keys}, {"values", m_values}, {"items", m_items}};

/* ---- lookup */
#define N_OF(a) (sizeof(a) / sizeof *(a))

static const method *find_method(const method *tab, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(tab[i].name, name)) return &tab[i];
    return NULL;
}

int jx_has_str_method(const char *name) { return find_method(STR_METHODS, N_OF(STR_METHODS), name) != NULL; }
int jx_has_dict_method(const char *name) { return find_method(DICT_METHODS, N_OF(DICT_METHODS), name) != NULL; }

/* self is a string or a dict (attribute access only makes methods of those) */
jv jx_call_method(rt *R, const jnode *at, jv self, const char *name, args *A) {
    int str = self.t == JV_STR;
    const method *m = str ? find_method(STR_METHODS, N_OF(STR_METHODS), name)
                          : find_method(DICT_METHODS, N_OF(DICT_METHODS), name);
    if (!m) jx_fail(R, at, "%s has no method '%s'", str ? "str" : "dict", name);
    return m->fn(R, at, self, A);
}
