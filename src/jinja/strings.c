/* Python's str operations on UTF-8 strings, for the string methods and filters: whitespace
 * as str.isspace() sees it (base/utf8.h), strip, upper / lower / title / capitalize (utf8proc's case
 * mappings), replace, split. See jinja_rt.h. */
#include <string.h>

#include <utf8proc.h>

#include "jinja/jinja_rt.h"

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

static size_t u8_step(const char *p, size_t n) {
    int32_t c;
    return jx_u8_dec(p, n, &c);
}
/* bytes of the code point ending at p[n-1], n > 0 (1 for a byte of invalid UTF-8) */
size_t jx_u8_back(const char *p, size_t n, int32_t *cp) {
    size_t st = n - 1;
    while (st > 0 && n - st < 4 && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
    if (jx_u8_dec(p + st, n - st, cp) == n - st) return n - st;
    *cp = (unsigned char)p[n - 1];
    return 1;
}
jv jx_strip(rt *R, jv s, jv chars, int left, int right) {
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
        if (left) a += m3_utf8_space_run(p, b, 0);
        if (right) b -= m3_utf8_space_run(p + a, b - a, 1);
    }
    (void)R;
    return v_strn(p + a, b - a);
}
size_t jx_u8_dec(const char *p, size_t n, int32_t *cp) {
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
jv jx_case(rt *R, jv s, int mode) {
    sb b = {0};
    int prev = 0, first = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        int32_t c, m;
        size_t l = jx_u8_dec(s.u.s.p + i, s.u.s.n - i, &c);
        if (mode == 0) m = utf8proc_toupper(c);
        else if (mode == 1) m = utf8proc_tolower(c);
        else if (mode == 2) {
            m = cased(c) ? (prev ? utf8proc_tolower(c) : utf8proc_totitle(c)) : c;
            prev = cased(c);
        } else if (mode == 3) m = first ? utf8proc_totitle(c) : c;
        else {
            int sep = m3_utf8_space_at(s.u.s.p + i, l) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
            m = sep ? c : prev ? utf8proc_tolower(c) : utf8proc_toupper(c);
            prev = !sep;
        }
        first = 0;
        if (m == c) jx_put(R, &b, s.u.s.p + i, l);
        else {
            utf8proc_uint8_t o[4];
            utf8proc_ssize_t k = utf8proc_encode_char(m, o);
            jx_put(R, &b, (const char *)o, (size_t)k);
        }
        i += l;
    }
    return sb_val(&b);
}
jv jx_replace(rt *R, jv s, jv old, jv nw, int64_t count) {
    sb b = {0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, on = old.u.s.n;
    if (on == 0) { /* Python inserts between every code point */
        size_t cnt;
        size_t *o = jx_u8_offsets(R, p, n, &cnt);
        int64_t done = 0;
        for (size_t i = 0; i <= cnt; i++) {
            if (count < 0 || done < count) { jx_put(R, &b, nw.u.s.p, nw.u.s.n); done++; }
            if (i < cnt) jx_put(R, &b, p + o[i], o[i + 1] - o[i]);
        }
        return sb_val(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i < n) {
        if ((count < 0 || done < count) && n - i >= on && !memcmp(p + i, old.u.s.p, on)) {
            jx_put(R, &b, nw.u.s.p, nw.u.s.n);
            i += on;
            done++;
        } else jx_put(R, &b, p + i++, 1);
    }
    return sb_val(&b);
}
const char *jx_memfind(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && !memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}
jv jx_split(rt *R, const jnode *at, jv s, jv sep, int64_t maxsplit) {
    jv l = v_list(R, 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.t == JV_STR) {
        if (sep.u.s.n == 0) jx_fail(R, at, "split: empty separator");
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *q = (maxsplit < 0 || done < maxsplit) ? jx_memfind(p + i, n - i, sep.u.s.p, sep.u.s.n) : NULL;
            if (!q) { jx_push(R, l.u.l, v_strn(p + i, n - i)); break; }
            jx_push(R, l.u.l, v_strn(p + i, (size_t)(q - (p + i))));
            i = (size_t)(q - p) + sep.u.s.n;
            done++;
        }
        return l;
    }
    size_t i = 0;
    int64_t done = 0;
    for (;;) {
        size_t w;
        while (i < n && (w = m3_utf8_space_at(p + i, n - i))) i += w;
        if (i >= n) break;
        if (maxsplit >= 0 && done >= maxsplit) { /* the rest, trailing whitespace kept (Python) */
            jx_push(R, l.u.l, v_strn(p + i, n - i));
            break;
        }
        size_t j = i;
        while (j < n && !m3_utf8_space_at(p + j, n - j)) j += u8_step(p + j, n - j);
        jx_push(R, l.u.l, v_strn(p + i, j - i));
        done++;
        i = j;
    }
    return l;
}
