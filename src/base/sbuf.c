/* Growable byte strings: see sbuf.h. */
#include "sbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int m3_sbuf_reserve(m3_sbuf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->n + extra + 1 <= b->cap && b->p) return 0;
    if (extra > SIZE_MAX / 4 - b->n) { b->oom = 1; return -1; }
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

int m3_sbuf_add(m3_sbuf *b, const void *s, size_t n) {
    if (m3_sbuf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int m3_sbuf_str(m3_sbuf *b, const char *s) { return m3_sbuf_add(b, s, strlen(s)); }

int m3_sbuf_printf(m3_sbuf *b, const char *fmt, ...) {
    if (b->oom) return -1;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0 || m3_sbuf_reserve(b, (size_t)k)) { b->oom = 1; return -1; }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
    return 0;
}

void m3_sbuf_drop_front(m3_sbuf *b, size_t k) {
    if (k >= b->n) b->n = 0;
    else if (k) {
        memmove(b->p, b->p + k, b->n - k);
        b->n -= k;
    }
    if (b->p) b->p[b->n] = 0;
}

void m3_sbuf_free(m3_sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
    b->oom = 0;
}
