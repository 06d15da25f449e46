/* m3 serve: the request side of HTTP/1.1 (RFC 9112), parsed strictly and incrementally from a
 * libevent buffer, with no I/O of its own (http.c drives it on connections; fuzz/fuzz_http.c
 * and tests/test_http.c drive it on bytes).
 *
 * Strict means what RFC 9112 says a server must refuse is refused, before anything acts on
 * the request: a version other than HTTP/1.x (505), a malformed request line, obsolete line
 * folding, whitespace before a field's colon, control characters (NUL included) in a field,
 * a bare CR, an HTTP/1.1 request without exactly one Host, a Content-Length that is not
 * digits or disagrees with another, Transfer-Encoding beside Content-Length or in HTTP/1.0,
 * a transfer coding other than chunked (501), a chunk size that is not hexadecimal, chunk
 * data longer than its size, an Expect other than 100-continue (417). Limits: the request
 * line (414) and the header block (431) together within max_head bytes, chunked trailers
 * too; the body within max_body bytes (413, refused from Content-Length before the body is
 * read). A bare LF ends a line as CRLF does (RFC 9112 section 2.2 allows it). */
#ifndef M3_SERVER_HTTP_PARSE_H
#define M3_SERVER_HTTP_PARSE_H

#include <stddef.h>

#include <event2/buffer.h>

/* a header field: name and value NUL-terminated (a value holds no NUL: that is refused), the
 * value without the whitespace around it; trailing_ws counts the bytes of that whitespace
 * after it (an API key compares the value exactly as sent) */
typedef struct http_field {
    const char *name, *value;
    size_t len;
    int trailing_ws;
} http_field;

typedef struct http_msg {
    char *method;           /* a token, as sent ("GET") */
    char *target;           /* origin-form ("/v1/models?x"); an absolute-form target reduced to it */
    int minor;              /* HTTP/1.minor: 0 or 1 (1.2 and later are read as 1.1) */
    http_field *f;
    int nf, capf;
    int keep_alive;         /* another request may follow on the connection */
    int expect_continue;    /* Expect: 100-continue, with a body to come */
    int chunked;
    long long content_length; /* -1: none */
    struct evbuffer *body;  /* the decoded body */
    char **lines;           /* storage of the strings above */
    int nlines, caplines;
} http_msg;

/* http_parse's answers */
enum { HTTP_MORE = 0, HTTP_HEAD = 1, HTTP_DONE = 2, HTTP_ERROR = -1 };

typedef struct http_parser {
    int state;
    size_t max_head, max_body;
    size_t head_bytes;      /* of the request line, headers and trailers so far */
    unsigned long long left;/* bytes left of the body (Content-Length) or of the current chunk */
    int blank_lines;        /* empty lines before the request line (ignored, a few) */
    int started;            /* a byte of this request has arrived */
    http_msg m;
    int status;             /* HTTP_ERROR: the status to answer */
    char err[200];          /* ... and why */
} http_parser;

void http_parser_init(http_parser *p, size_t max_head, size_t max_body);
/* Reads what it can from in (consuming it). HTTP_MORE: needs more bytes; HTTP_HEAD: the head is
 * complete and a body follows (once per request: the moment for a 100 Continue); HTTP_DONE:
 * p->m is a whole request (take it with http_parser_take); HTTP_ERROR: p->status and p->err
 * say what to answer (the connection then closes: what follows cannot be framed). */
int http_parse(http_parser *p, struct evbuffer *in);
/* Moves the parsed request out to *m (freed with http_msg_free) and readies p for the next. */
void http_parser_take(http_parser *p, http_msg *m);
void http_parser_free(http_parser *p);
void http_msg_free(http_msg *m);

/* the first field named name (case-insensitive); *count how many there are, when count */
const http_field *http_msg_field(const http_msg *m, const char *name, int *count);

#endif
