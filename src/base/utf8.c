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

/* the whole valid character at s (n >= 1 bytes): its code point in *c and its length; 0 when
 * s[0] begins none */
static int cp_at(const char *s, size_t n, uint32_t *c) {
    const uint8_t *u = (const uint8_t *)s;
    const int l = m3_utf8_len(u, n);
    if (l <= 0) return 0;
    *c = l == 1 ? u[0] : u[0] & (0xff >> (l + 1));
    for (int i = 1; i < l; i++) *c = *c << 6 | (u[i] & 0x3f);
    return l;
}

size_t m3_utf8_space_at(const char *s, size_t n) {
    uint32_t c;
    const int l = n ? cp_at(s, n, &c) : 0;
    return l && py_space(c) ? (size_t)l : 0;
}

size_t m3_utf8_space_before(const char *s, size_t n) {
    if (!n) return 0;
    size_t b = n - 1;
    while (b > 0 && n - b < 4 && ((uint8_t)s[b] & 0xc0) == 0x80) b--; /* the last character's first byte */
    uint32_t c;
    const int l = cp_at(s + b, n - b, &c);
    return (size_t)l == n - b && py_space(c) ? (size_t)l : 0;
}

size_t m3_utf8_space_run(const char *s, size_t n, int tail) {
    size_t i = 0, l;
    if (!tail) {
        while (i < n && (l = m3_utf8_space_at(s + i, n - i))) i += l;
        return i;
    }
    while (i < n && (l = m3_utf8_space_before(s, n - i))) i += l;
    return i;
}
