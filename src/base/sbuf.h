/* A growable byte string, always NUL-terminated. A failed allocation sets oom, which sticks:
 * later calls do nothing and fail, so a builder may check once at the end. */
#ifndef M3_BASE_SBUF_H
#define M3_BASE_SBUF_H

#include <stddef.h>

typedef struct m3_sbuf {
    char *p;       /* NULL until something is added */
    size_t n, cap; /* bytes held (the NUL not counted), bytes allocated */
    int oom;
} m3_sbuf;

int m3_sbuf_reserve(m3_sbuf *b, size_t extra);             /* room for extra more bytes; 0, or -1 */
int m3_sbuf_add(m3_sbuf *b, const void *s, size_t n);      /* 0, or -1 when out of memory */
int m3_sbuf_str(m3_sbuf *b, const char *s);
int m3_sbuf_printf(m3_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void m3_sbuf_drop_front(m3_sbuf *b, size_t k);             /* removes the first k bytes */
void m3_sbuf_free(m3_sbuf *b);                             /* back to empty */

#endif
