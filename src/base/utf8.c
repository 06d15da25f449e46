#include "utf8.h"

int m3_utf8_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0; /* no overlongs */
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F; /* <= U+10FFFF */
    } else return -1;
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        uint8_t x = s[i];
        if (i == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return -i;
    }
    return need;
}

int m3_utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF) cp = 0xFFFD;
    if (cp < 0x10000) return m3_utf8_put(cp, o);
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Python's str.isspace() for one code point */
static int py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* the code point of the UTF-8 character at s (n bytes left, valid text), its length in *k */
static uint32_t cp_at(const char *s, size_t n, int *k) {
    const uint8_t *u = (const uint8_t *)s;
    int l = m3_utf8_len(u, n);
    if (l <= 1) { *k = 1; return u[0]; }
    uint32_t c = u[0] & (0xff >> (l + 1));
    for (int i = 1; i < l; i++) c = c << 6 | (u[i] & 0x3f);
    *k = l;
    return c;
}

size_t m3_utf8_space_run(const char *s, size_t n, int tail) {
    size_t i = 0;
    if (!tail) {
        for (int k; i < n && py_space(cp_at(s + i, n - i, &k)); i += (size_t)k) {}
        return i;
    }
    size_t end = n;
    while (end > 0) {
        size_t b = end - 1;
        while (b > 0 && ((uint8_t)s[b] & 0xc0) == 0x80) b--; /* the last character's first byte */
        int k;
        if (!py_space(cp_at(s + b, end - b, &k))) break;
        end = b;
    }
    return n - end;
}
