/* The HTTP/1.1 request parser (src/server/http_parse.h): what RFC 9112 says to refuse is refused
 * with the right status, valid requests parse to their parts, and every case gives the same
 * answer whether its bytes arrive whole or cut at any one point. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_parse.h"

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

typedef struct {
    const char *what, *in;
    size_t len;      /* 0: strlen */
    int status;      /* 0: parses; else the error's status */
    const char *msg; /* part of the error message, or "METHOD TARGET minor body" of the first request */
} tcase;

/* parses in (cut at `cut`: the first piece, then the rest; cut 0: whole); the first outcome */
static int parse1(const char *in, size_t n, size_t cut, char *out, size_t cap, int *status) {
    http_parser p;
    http_parser_init(&p, 256, 1000);
    struct evbuffer *b = evbuffer_new();
    int rc = HTTP_MORE;
    size_t off = 0;
    for (int piece = 0; piece < 2 && rc != HTTP_DONE && rc != HTTP_ERROR; piece++) {
        size_t k = piece == 0 && cut ? cut : n - off;
        evbuffer_add(b, in + off, k);
        off += k;
        while ((rc = http_parse(&p, b)) == HTTP_HEAD) {}
    }
    *status = 0;
    out[0] = 0;
    if (rc == HTTP_ERROR) {
        *status = p.status;
        snprintf(out, cap, "%s", p.err);
    } else if (rc == HTTP_DONE) {
        http_msg m;
        http_parser_take(&p, &m);
        size_t bl = m.body ? evbuffer_get_length(m.body) : 0;
        snprintf(out, cap, "%s %s %d %.*s", m.method, m.target, m.minor, (int)bl, bl ? (char *)evbuffer_pullup(m.body, -1) : "");
        http_msg_free(&m);
    } else snprintf(out, cap, "MORE");
    http_parser_free(&p);
    evbuffer_free(b);
    return rc;
}

int main(void) {
    static const tcase cases[] = {
        {"plain GET", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 0, 0, "GET /health 1 "},
        {"bare LF", "GET /a HTTP/1.1\nHost: x\n\n", 0, 0, "GET /a 1 "},
        {"blank lines first", "\r\n\r\nGET /a HTTP/1.0\r\n\r\n", 0, 0, "GET /a 0 "},
        {"absolute-form", "GET http://h:80/p?q=1 HTTP/1.1\r\nHost: h\r\n\r\n", 0, 0, "GET /p?q=1 1 "},
        {"HTTP/1.2 read as 1.1", "GET / HTTP/1.2\r\nHost: x\r\n\r\n", 0, 0, "GET / 1 "},
        {"Content-Length body", "POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", 0, 0, "POST /t 1 hello"},
        {"equal Content-Lengths", "POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 02\r\nContent-Length: 2\r\n\r\nhi", 0, 0, "POST /t 1 hi"},
        {"chunked", "POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;x=\"y\"\r\nabc\r\n02\r\nde\r\n0\r\nT: 1\r\n\r\n", 0, 0,
         "POST /t 1 abcde"},
        {"HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", 0, 505, "HTTP/2.0"},
        {"HTTP/0.9", "GET /\r\n\r\n", 0, 400, "HTTP/0.9"},
        {"lower-case version", "GET / http/1.1\r\nHost: x\r\n\r\n", 0, 400, "version"},
        {"two spaces", "GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "request line"},
        {"control in target", "GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "target"},
        {"no Host", "GET / HTTP/1.1\r\n\r\n", 0, 400, "Host"},
        {"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 0, 400, "Host"},
        {"obs-fold", "GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n c\r\n\r\n", 0, 400, "folding"},
        {"space before colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", 0, 400, "whitespace"},
        {"no colon", "GET / HTTP/1.1\r\nHost x\r\n\r\n", 0, 400, "colon"},
        {"NUL in a value", "GET / HTTP/1.1\r\nHost: x\r\nA: k\0junk\r\n\r\n", 38, 400, "0x00"},
        {"bare CR", "GET / HTTP/1.1\r\nHost: x\rA: b\r\n\r\n", 0, 400, "bare CR"},
        {"CL disagree", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\nContent-Length: 3\r\n\r\n", 0, 400, "disagree"},
        {"CL not digits", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 0, 400, "not a number"},
        {"CL over the limit", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n", 0, 413, "1001"},
        {"CL huge", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", 0, 413, "limit"},
        {"TE + CL", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 0, 400, "ambiguous"},
        {"TE in 1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 400, "HTTP/1.0"},
        {"TE gzip", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 0, 501, "gzip"},
        {"TE not last", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 0, 400, "not chunked"},
        {"TE twice", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 400, "more than once"},
        {"chunk zz", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, 400, "not hexadecimal"},
        {"chunk -5", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n", 0, 400, "not hexadecimal"},
        {"chunk 2^64-1", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n", 0, 400, "out of range"},
        {"chunk over the limit", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n", 0, 413, "limit"},
        {"chunk junk after size", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5 x\r\n", 0, 400, "more than a size"},
        {"chunk without CRLF", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", 0, 400, "longer than"},
        {"bad trailer", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT : 1\r\n\r\n", 0, 400, "whitespace"},
        {"Expect other", "POST / HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n", 0, 417, "100-continue"},
        {"long request line", "GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1\r\n", 0, 414, "request line"},
        {"long headers", "GET / HTTP/1.1\r\nHost: x\r\nA: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nB: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nC: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n", 0, 431, "header"},
    };
    int n = (int)(sizeof cases / sizeof *cases);
    for (int i = 0; i < n; i++) {
        const tcase *c = &cases[i];
        size_t len = c->len ? c->len : strlen(c->in);
        char out[300], out2[300];
        int st, st2;
        parse1(c->in, len, 0, out, sizeof out, &st);
        CHECK(st == c->status && strstr(out, c->msg) != NULL, "%s: status %d (want %d), '%s' (want '%s')", c->what, st,
              c->status, out, c->msg);
        for (size_t cut = 1; cut < len; cut++) { /* the same, whatever the split */
            parse1(c->in, len, cut, out2, sizeof out2, &st2);
            CHECK(st2 == st && !strcmp(out, out2), "%s cut at %zu: %d '%s' (whole: %d '%s')", c->what, cut, st2, out2, st, out);
            if (st2 != st || strcmp(out, out2)) break;
        }
    }
    { /* fields: trimmed values, trailing whitespace counted, keep-alive and Expect read */
        const char *in = "POST /t HTTP/1.1\r\nHost: x\r\nAuthorization: \t Bearer k \t\r\nConnection: Keep-Alive, CLOSE\r\n"
                         "Expect: 100-Continue\r\nContent-Length: 1\r\n\r\nZ";
        http_parser p;
        http_parser_init(&p, 1024, 10);
        struct evbuffer *b = evbuffer_new();
        evbuffer_add(b, in, strlen(in));
        int rc = http_parse(&p, b);
        CHECK(rc == HTTP_HEAD && p.m.expect_continue, "a head with a body to come: HTTP_HEAD (%d), expect_continue", rc);
        rc = http_parse(&p, b);
        CHECK(rc == HTTP_DONE, "then the request (%d)", rc);
        http_msg m;
        http_parser_take(&p, &m);
        int cnt;
        const http_field *f = http_msg_field(&m, "authorization", &cnt);
        CHECK(f && cnt == 1 && !strcmp(f->value, "Bearer k") && f->len == 8 && f->trailing_ws == 2,
              "Authorization trimmed to 'Bearer k' with 2 trailing whitespace bytes");
        CHECK(!m.keep_alive, "Connection: close wins over keep-alive");
        http_msg_free(&m);
        CHECK(http_parse(&p, b) == HTTP_MORE, "the parser is ready for the next request");
        http_parser_free(&p);
        evbuffer_free(b);
    }
    printf("%s: %d failures\n", fails ? "FAIL" : "ok", fails);
    return fails != 0;
}
