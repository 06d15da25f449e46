/* The Jinja arena: every node of a parsed template and every value of a render is allocated
 * here and freed at once. Allocation is zeroed; out of memory (or over the limit) unwinds
 * with longjmp to the API entry point that set a->jb. See jinja_int.h. */
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_int.h"

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit && a->total + n > a->limit) {
        m3_errf(a->err, "%s: out of template memory (over %zu bytes)", a->name, a->limit);
        longjmp(*a->jb, 1);
    }
    jarena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 - sizeof(jarena_chunk) ? n : 65536 - sizeof(jarena_chunk);
        c = malloc(sizeof(jarena_chunk) + cap);
        if (!c) {
            m3_errf(a->err, "%s: out of memory", a->name);
            longjmp(*a->jb, 1);
        }
        c->used = 0;
        c->cap = cap;
        if (a->head && n > 4096) { /* big block: keep the current chunk for small ones */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

void ja_free_all(jarena *a) {
    jarena_chunk *c = a->head;
    while (c) {
        jarena_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->total = 0;
}

char *ja_strndup(jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}
