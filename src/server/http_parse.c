/* m3 serve: HTTP/1.1 requests, parsed strictly and incrementally (see http_parse.h). */
#include "http_parse.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../base/fault.h"

enum { P_LINE, P_HEADERS, P_BODY, P_CHUNK_SIZE, P_CHUNK_DATA, P_CHUNK_END, P_TRAILERS, P_DONE, P_ERR };

#define MAX_FIELDS 1000       /* header fields of one request */
#define MAX_BLANK_LINES 8     /* empty lines tolerated before a request line */
#define MAX_CHUNK_LINE 1024   /* a chunk-size line, extensions included */

static int fail(http_parser *p, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(http_parser *p, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
    p->status = status;
    p->state = P_ERR;
    return HTTP_ERROR;
}

void http_parser_init(http_parser *p, size_t max_head, size_t max_body) {
    memset(p, 0, sizeof *p);
    p->max_head = max_head;
    p->max_body = max_body;
    p->m.content_length = -1;
}

void http_msg_free(http_msg *m) {
    for (int i = 0; i < m->nlines; i++) free(m->lines[i]);
    free(m->lines);
    free(m->f);
    if (m->body) evbuffer_free(m->body);
    memset(m, 0, sizeof *m);
    m->content_length = -1;
}

void http_parser_free(http_parser *p) { http_msg_free(&p->m); }

void http_parser_take(http_parser *p, http_msg *m) {
    *m = p->m;
    memset(&p->m, 0, sizeof p->m);
    p->m.content_length = -1;
    p->state = P_LINE;
    p->head_bytes = 0;
    p->left = 0;
    p->blank_lines = 0;
    p->started = 0;
}

const http_field *http_msg_field(const http_msg *m, const char *name, int *count) {
    const http_field *first = NULL;
    int n = 0;
    for (int i = 0; i < m->nf; i++)
        if (!strcasecmp(m->f[i].name, name)) {
            if (!first) first = &m->f[i];
            n++;
        }
    if (count) *count = n;
    return first;
}

static int is_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* a field value's bytes: HTAB, SP, visible ASCII and obs-text (RFC 9110 section 5.5) */
static int is_field_byte(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

/* One line, without its LF (and a CR before it), into *out (malloc'd, NUL-terminated).
 * 1: a line; 0: not all here yet; -1: longer than limit bytes; -2: out of memory. */
static int get_line(struct evbuffer *in, size_t limit, char **out, size_t *len) {
    size_t eol_len = 0;
    struct evbuffer_ptr e = evbuffer_search_eol(in, NULL, &eol_len, EVBUFFER_EOL_LF);
    if (e.pos < 0) return evbuffer_get_length(in) > limit ? -1 : 0;
    size_t n = (size_t)e.pos;
    if (n > limit) return -1;
    char *s = m3_fault_malloc(M3_FAULT_SERVER, n + 1);
    if (!s) return -2;
    if (n) evbuffer_remove(in, s, n);
    evbuffer_drain(in, eol_len);
    if (n && s[n - 1] == '\r') n--;
    s[n] = 0;
    *out = s;
    *len = n;
    return 1;
}

/* keeps line s in the message (its strings point into it); -1 when out of memory (s freed) */
static int keep_line(http_msg *m, char *s) {
    if (m->nlines == m->caplines) {
        int nc = m->caplines ? 2 * m->caplines : 16;
        char **nl = m3_fault_realloc(M3_FAULT_SERVER, m->lines, sizeof *nl * (size_t)nc);
        if (!nl) { free(s); return -1; }
        m->lines = nl;
        m->caplines = nc;
    }
    m->lines[m->nlines++] = s;
    return 0;
}

static int request_line(http_parser *p, char *s, size_t n) {
    http_msg *m = &p->m;
    char *sp1 = memchr(s, ' ', n);
    if (!sp1 || sp1 == s) return fail(p, 400, "a malformed request line (expected: METHOD TARGET HTTP/1.1)");
    for (char *q = s; q < sp1; q++)
        if (!is_tchar((unsigned char)*q)) return fail(p, 400, "a malformed method in the request line (byte 0x%02x)", (unsigned char)*q);
    char *t = sp1 + 1, *end = s + n;
    char *sp2 = memchr(t, ' ', (size_t)(end - t));
    if (!sp2) return fail(p, 400, "a request line without an HTTP version (HTTP/0.9 is not served)");
    if (sp2 == t) return fail(p, 400, "a malformed request line (expected: METHOD TARGET HTTP/1.1)");
    for (char *q = t; q < sp2; q++)
        if (*q <= 0x20 || *q >= 0x7f) return fail(p, 400, "a request target with a byte 0x%02x (not visible ASCII)", (unsigned char)*q);
    const char *v = sp2 + 1;
    if ((size_t)(end - v) != 8 || memcmp(v, "HTTP/", 5) || v[5] < '0' || v[5] > '9' || v[6] != '.' || v[7] < '0' || v[7] > '9')
        return fail(p, 400, "a malformed HTTP version '%.16s' in the request line", v);
    if (v[5] != '1') return fail(p, 505, "HTTP/%c.%c is not supported (HTTP/1.0 and HTTP/1.1 are)", v[5], v[7]);
    m->minor = v[7] == '0' ? 0 : 1;
    *sp1 = 0;
    *sp2 = 0;
    m->method = s;
    /* absolute-form (http://host/path): what is served is its path and query */
    if (!strncasecmp(t, "http://", 7) || !strncasecmp(t, "https://", 8)) {
        char *a = strstr(t, "//") + 2;
        char *path = strchr(a, '/');
        if (path) t = path;
        else t = (char *)"/";
    }
    m->target = t;
    return 0;
}

/* A header line; store 0 (trailers): checked, not kept. */
static int field_line(http_parser *p, char *s, size_t n, int store) {
    http_msg *m = &p->m;
    if (s[0] == ' ' || s[0] == '\t') return fail(p, 400, "obsolete line folding (a header line that begins with whitespace)");
    char *colon = memchr(s, ':', n);
    if (!colon) return fail(p, 400, "a header line without a colon");
    if (colon == s) return fail(p, 400, "a header line with an empty name");
    for (char *q = s; q < colon; q++) {
        if (*q == ' ' || *q == '\t') return fail(p, 400, "whitespace between the header name '%.*s' and its colon", (int)(q - s), s);
        if (!is_tchar((unsigned char)*q))
            return fail(p, 400, "a header name with the byte 0x%02x ('%.40s')", (unsigned char)*q, s);
    }
    char *v = colon + 1, *end = s + n;
    for (char *q = v; q < end; q++)
        if (!is_field_byte((unsigned char)*q)) {
            *colon = 0;
            return fail(p, 400, "a control character (0x%02x) in the value of the header '%.60s'", (unsigned char)*q, s);
        }
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    int tw = 0;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) { end--; tw++; }
    if (!store) return 0;
    if (m->nf >= MAX_FIELDS) return fail(p, 431, "more than %d header fields", MAX_FIELDS);
    if (m->nf == m->capf) {
        int nc = m->capf ? 2 * m->capf : 16;
        http_field *nf = m3_fault_realloc(M3_FAULT_SERVER, m->f, sizeof *nf * (size_t)nc);
        if (!nf) return fail(p, 500, "out of memory");
        m->f = nf;
        m->capf = nc;
    }
    *colon = 0;
    *end = 0;
    m->f[m->nf++] = (http_field){s, v, (size_t)(end - v), tw};
    return 0;
}

/* the comma-separated elements of a field value, trimmed (empty ones skipped, as RFC 9110 asks) */
static const char *next_elem(const char *s, size_t *len, const char **rest) {
    for (;;) {
        while (*s == ' ' || *s == '\t' || *s == ',') s++;
        if (!*s) return NULL;
        const char *e = s;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > s && (t[-1] == ' ' || t[-1] == '\t')) t--;
        *len = (size_t)(t - s);
        *rest = e;
        return s;
    }
}

static int elem_is(const char *e, size_t n, const char *word) { return strlen(word) == n && !strncasecmp(e, word, n); }

/* the head is complete: framing, Host, Expect, Connection */
static int finish_head(http_parser *p) {
    http_msg *m = &p->m;
    int n_host;
    http_msg_field(m, "Host", &n_host);
    if (m->minor >= 1 && n_host != 1)
        return fail(p, 400, n_host ? "%d Host headers (an HTTP/1.1 request has exactly one)" : "an HTTP/1.1 request without a Host header",
                    n_host);
    int te = 0, n_chunked = 0, last_chunked = 0;
    char other[48] = "";
    const char *cl = NULL;
    size_t cl_len = 0;
    int n_cl = 0;
    unsigned long long clv = 0;
    int expect = 0, close = 0, ka10 = 0;
    for (int i = 0; i < m->nf; i++) {
        const http_field *f = &m->f[i];
        const char *e, *rest = f->value;
        size_t n;
        if (!strcasecmp(f->name, "Transfer-Encoding")) {
            te = 1;
            while ((e = next_elem(rest, &n, &rest))) {
                last_chunked = elem_is(e, n, "chunked");
                if (last_chunked) n_chunked++;
                else if (!other[0]) snprintf(other, sizeof other, "%.*s", (int)(n < 40 ? n : 40), e);
            }
        } else if (!strcasecmp(f->name, "Content-Length")) {
            while ((e = next_elem(rest, &n, &rest))) {
                for (size_t k = 0; k < n; k++)
                    if (e[k] < '0' || e[k] > '9') return fail(p, 400, "Content-Length '%.40s' is not a number", f->value);
                while (n > 1 && *e == '0') { e++; n--; } /* leading zeros are the same length */
                if (n_cl && (n != cl_len || memcmp(e, cl, n)))
                    return fail(p, 400, "two Content-Length values disagree ('%.*s' and '%.*s')", (int)(cl_len < 20 ? cl_len : 20), cl,
                                (int)(n < 20 ? n : 20), e);
                cl = e;
                cl_len = n;
                n_cl++;
            }
            if (!n_cl) return fail(p, 400, "an empty Content-Length");
        } else if (!strcasecmp(f->name, "Expect")) {
            if (strcasecmp(f->value, "100-continue"))
                return fail(p, 417, "Expect: '%.40s' is not supported (only 100-continue is)", f->value);
            expect = 1;
        } else if (!strcasecmp(f->name, "Connection")) {
            while ((e = next_elem(rest, &n, &rest))) {
                if (elem_is(e, n, "close")) close = 1;
                else if (elem_is(e, n, "keep-alive")) ka10 = 1;
            }
        }
    }
    if (te) {
        if (m->minor == 0) return fail(p, 400, "Transfer-Encoding in an HTTP/1.0 request (its framing is not defined there)");
        if (n_cl) return fail(p, 400, "both Transfer-Encoding and Content-Length: the message's length is ambiguous");
        if (!last_chunked)
            return fail(p, 400, "the last transfer coding is not chunked: the body's length cannot be known");
        if (n_chunked > 1) return fail(p, 400, "chunked is applied more than once in Transfer-Encoding");
        if (other[0]) return fail(p, 501, "the transfer coding '%s' is not supported (only chunked is)", other);
        m->chunked = 1;
    }
    if (n_cl) {
        if (cl_len > 18) return fail(p, 413, "the request body has %.*s bytes; the limit is %zu", (int)cl_len, cl, p->max_body);
        for (size_t k = 0; k < cl_len; k++) clv = clv * 10 + (unsigned long long)(cl[k] - '0');
        if (clv > p->max_body) return fail(p, 413, "the request body has %llu bytes; the limit is %zu", clv, p->max_body);
        m->content_length = (long long)clv;
    }
    m->keep_alive = !close && (m->minor >= 1 || ka10);
    if (m->chunked || clv > 0) {
        m->body = evbuffer_new();
        if (!m->body) return fail(p, 500, "out of memory");
        m->expect_continue = expect;
        p->state = m->chunked ? P_CHUNK_SIZE : P_BODY;
        p->left = clv;
        return HTTP_HEAD;
    }
    p->state = P_DONE;
    return HTTP_DONE;
}

static int chunk_size(http_parser *p, const char *s) {
    unsigned long long v = 0;
    int nd = 0, sig = 0; /* digits, and those after leading zeros */
    const char *q = s;
    for (;; q++, nd++) {
        int d = *q >= '0' && *q <= '9' ? *q - '0' : *q >= 'a' && *q <= 'f' ? *q - 'a' + 10 : *q >= 'A' && *q <= 'F' ? *q - 'A' + 10 : -1;
        if (d < 0) break;
        if (v || d) sig++;
        if (sig <= 15) v = v * 16 + (unsigned long long)d;
    }
    if (!nd) return fail(p, 400, "the chunk size '%.20s' is not hexadecimal", s);
    if (sig > 15) return fail(p, 400, "the chunk size '%.20s' is out of range", s);
    while (*q == ' ' || *q == '\t') q++;
    if (*q && *q != ';') return fail(p, 400, "the chunk size line '%.30s' has more than a size and extensions", s);
    for (; *q; q++)
        if (!is_field_byte((unsigned char)*q)) return fail(p, 400, "a control character (0x%02x) in a chunk extension", (unsigned char)*q);
    size_t have = evbuffer_get_length(p->m.body);
    if (v > p->max_body - have) return fail(p, 413, "the request body exceeds the limit of %zu bytes", p->max_body);
    p->left = v;
    p->state = v ? P_CHUNK_DATA : P_TRAILERS;
    return 0;
}

/* moves up to p->left bytes of in to the body; 1 when the piece is complete */
static int move_body(http_parser *p, struct evbuffer *in) {
    size_t avail = evbuffer_get_length(in);
    size_t k = p->left < avail ? (size_t)p->left : avail;
    if (k && evbuffer_remove_buffer(in, p->m.body, k) != (int)k) return fail(p, 500, "out of memory");
    p->left -= k;
    return p->left == 0;
}

int http_parse(http_parser *p, struct evbuffer *in) {
    for (;;) {
        char *s = NULL;
        size_t n = 0;
        int rc;
        switch (p->state) {
        case P_ERR: return HTTP_ERROR;
        case P_DONE: return HTTP_DONE;
        case P_LINE:
        case P_HEADERS:
        case P_TRAILERS: {
            if (evbuffer_get_length(in)) p->started = 1;
            size_t room = p->max_head > p->head_bytes ? p->max_head - p->head_bytes : 0;
            rc = get_line(in, room, &s, &n);
            if (rc == 0) return HTTP_MORE;
            if (rc == -2) return fail(p, 500, "out of memory");
            if (rc == -1) {
                if (p->state == P_LINE) return fail(p, 414, "the request line is longer than %zu bytes", p->max_head);
                return fail(p, 431, "the request's header fields are longer than %zu bytes", p->max_head);
            }
            p->head_bytes += n + 1;
            if (memchr(s, '\r', n)) {
                free(s);
                return fail(p, 400, "a bare CR in the request's head");
            }
            if (p->state == P_LINE) {
                if (!n) {
                    free(s);
                    if (++p->blank_lines > MAX_BLANK_LINES) return fail(p, 400, "empty lines instead of a request line");
                    continue;
                }
                if (keep_line(&p->m, s)) return fail(p, 500, "out of memory");
                if (request_line(p, s, n)) return HTTP_ERROR;
                p->state = P_HEADERS;
            } else if (p->state == P_HEADERS) {
                if (!n) {
                    free(s);
                    return finish_head(p);
                }
                if (keep_line(&p->m, s)) return fail(p, 500, "out of memory");
                if (field_line(p, s, n, 1)) return HTTP_ERROR;
            } else { /* trailers: checked and dropped */
                if (!n) {
                    free(s);
                    p->state = P_DONE;
                    return HTTP_DONE;
                }
                rc = field_line(p, s, n, 0);
                free(s);
                if (rc) return HTTP_ERROR;
            }
            break;
        }
        case P_BODY:
            rc = move_body(p, in);
            if (rc < 0) return HTTP_ERROR;
            if (!rc) return HTTP_MORE;
            p->state = P_DONE;
            return HTTP_DONE;
        case P_CHUNK_SIZE:
            rc = get_line(in, MAX_CHUNK_LINE, &s, &n);
            if (rc == 0) return HTTP_MORE;
            if (rc == -2) return fail(p, 500, "out of memory");
            if (rc == -1) return fail(p, 400, "a chunk size line longer than %d bytes", MAX_CHUNK_LINE);
            rc = chunk_size(p, s);
            free(s);
            if (rc) return HTTP_ERROR;
            break;
        case P_CHUNK_DATA:
            rc = move_body(p, in);
            if (rc < 0) return HTTP_ERROR;
            if (!rc) return HTTP_MORE;
            p->state = P_CHUNK_END;
            break;
        case P_CHUNK_END: /* the CRLF after a chunk's data (a CR alone may still be waiting for its LF) */
            rc = get_line(in, 1, &s, &n);
            if (rc == 0) return HTTP_MORE;
            if (rc == -2) return fail(p, 500, "out of memory");
            free(s);
            if (rc == -1 || n) return fail(p, 400, "chunk data longer than its chunk size (no CRLF after it)");
            p->state = P_CHUNK_SIZE;
            break;
        }
    }
}
