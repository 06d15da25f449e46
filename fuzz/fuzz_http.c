/* libFuzzer: the HTTP/1.1 request parser (src/server/http_parse.h). Input: byte 0 seeds how
 * the rest, a byte stream from a client, is cut into pieces (1 to 16 bytes, as TCP may deliver
 * it); the stream is parsed once whole and once piece by piece. Checked: both give the same
 * transcript (every request's method, target, version, fields and body; the head events; the
 * error's status and message), a body never exceeds the limit and matches its Content-Length,
 * no field value holds a control byte, nothing crashes or leaks. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_parse.h"

#define MAX_HEAD 300
#define MAX_BODY 2000

typedef struct { char *p; size_t n, cap; } text;

static void put(text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        t->cap = (t->n + n + 1) * 2;
        t->p = realloc(t->p, t->cap);
        if (!t->p) abort();
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}
static void puts_(text *t, const char *s) { put(t, s, strlen(s)); }

static void record(text *t, const http_msg *m) {
    char b[64];
    puts_(t, "REQ ");
    puts_(t, m->method);
    puts_(t, " ");
    puts_(t, m->target);
    snprintf(b, sizeof b, " 1.%d ka=%d ch=%d cl=%lld ex=%d\n", m->minor, m->keep_alive, m->chunked, m->content_length,
             m->expect_continue);
    puts_(t, b);
    for (int i = 0; i < m->nf; i++) {
        for (size_t k = 0; k < m->f[i].len; k++)
            if ((unsigned char)m->f[i].value[k] < 0x20 && m->f[i].value[k] != '\t') abort();
        puts_(t, m->f[i].name);
        puts_(t, ": ");
        put(t, m->f[i].value, m->f[i].len);
        snprintf(b, sizeof b, " [%d]\n", m->f[i].trailing_ws);
        puts_(t, b);
    }
    size_t n = m->body ? evbuffer_get_length(m->body) : 0;
    if (n > MAX_BODY) abort();
    if (m->content_length >= 0 && !m->chunked && (long long)n != m->content_length) abort();
    snprintf(b, sizeof b, "body %zu\n", n);
    puts_(t, b);
    if (n) put(t, (const char *)evbuffer_pullup(m->body, -1), n);
}

/* feeds the pieces, parses after each; the transcript into t */
static void run(const uint8_t *data, size_t size, unsigned seed, int whole, text *t) {
    http_parser p;
    http_parser_init(&p, MAX_HEAD, MAX_BODY);
    struct evbuffer *in = evbuffer_new();
    size_t off = 0;
    int dead = 0;
    while (off < size && !dead) {
        size_t k = whole ? size : 1 + (seed = seed * 1103515245u + 12345u, (seed >> 16) % 16);
        if (k > size - off) k = size - off;
        evbuffer_add(in, data + off, k);
        off += k;
        for (;;) {
            int rc = http_parse(&p, in);
            if (rc == HTTP_MORE) break;
            if (rc == HTTP_HEAD) { puts_(t, "HEAD\n"); continue; }
            if (rc == HTTP_ERROR) {
                char b[260];
                snprintf(b, sizeof b, "ERR %d %s\n", p.status, p.err);
                puts_(t, b);
                dead = 1;
                break;
            }
            http_msg m;
            http_parser_take(&p, &m);
            record(t, &m);
            http_msg_free(&m);
        }
    }
    http_parser_free(&p);
    evbuffer_free(in);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    text a = {0}, b = {0};
    run(data + 1, size - 1, data[0], 1, &a);
    run(data + 1, size - 1, data[0], 0, &b);
    if (a.n != b.n || (a.n && memcmp(a.p, b.p, a.n))) {
        fprintf(stderr, "whole:\n%s\npieces:\n%s\n", a.p ? a.p : "", b.p ? b.p : "");
        abort();
    }
    free(a.p);
    free(b.p);
    return 0;
}
