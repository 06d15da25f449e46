/* m3 serve: HTTP/1.1 connections, requests and responses on libevent bufferevents (see http.h).
 *
 * A connection is in one of four states:
 *   READ     a request is arriving (parsed as bytes come: http_parse.c), under its deadline;
 *   BUSY     the application holds the request (its handler, a preparation thread, a
 *            generation); the socket is still read, so an EOF is seen at once;
 *   SENDING  the whole response is handed over and being written; when the output is empty
 *            the request ends (on_sent), and the connection reads the next one or closes;
 *   LINGER   the answer was the connection's last (an error, Connection: close): the write
 *            side is shut and what the client still sends is read and dropped, up to 2 s.
 * Before, libevent's evhttp did this: it restarted its timeout on every byte (one byte every
 * 20 s held a connection forever), counted no connections, answered malformed framing with
 * its own HTML 413 or not at all, and hid the raw header bytes (issue 23). */
#include "http.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/bufferevent.h>
#include <event2/listener.h>

#include "../base/fault.h"

#define BUSY_READ_AHEAD ((size_t)64 << 10) /* bytes read ahead of a request in flight (pipelining) */
#define LINGER_S 2.0

enum { C_READ, C_BUSY, C_SENDING, C_LINGER, C_CLOSED };

typedef struct http_conn http_conn;

struct http_server {
    struct event_base *base;
    http_opts o;
    http_handler handler;
    void *arg;
    struct evconnlistener *lis;
    struct event *relisten;
    int stopped, paused_cap;
    int draining_queue;      /* http_server_stop_listening is taking in the listen queue */
    char *uds;               /* the Unix socket's path (http_server_listen_unix), removed when it closes */
    dev_t uds_dev;           /* ... and its file, as bound */
    ino_t uds_ino;
    http_conn *conns;
    http_stats st;
    time_t date_t;
    char date[48];
};

struct http_conn {
    http_server *hs;
    struct bufferevent *bev;
    struct event *tmr;
    http_parser p;
    http_req *cur;           /* the request in flight (BUSY, SENDING) */
    int state;
    int close_after;         /* the connection ends with the response being sent */
    int fresh;               /* its first request has not come yet (a server stopping waits for it) */
    http_conn *prev, *next;
};

struct http_req {
    http_conn *c;            /* NULL once the request has ended */
    http_msg m;
    int started, streaming, chunked, head_only, close_after;
    char **oh;               /* response header lines, "Name: value" */
    int noh, capoh;
    http_req_cb on_sent, on_close;
    void *arg;
};

static void conn_free(http_conn *c);
static void process(http_conn *c);

const char *http_reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

static const char *date_now(http_server *hs) {
    time_t t = time(NULL);
    if (t != hs->date_t) {
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(hs->date, sizeof hs->date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        hs->date_t = t;
    }
    return hs->date;
}

static struct timeval tv_of(double s) {
    struct timeval tv = {(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)};
    return tv;
}

/* ------------------------------------------------------------------ requests */

static void req_free(http_req *r) {
    http_msg_free(&r->m);
    for (int i = 0; i < r->noh; i++) free(r->oh[i]);
    free(r->oh);
    free(r);
}

const char *http_method(const http_req *r) { return r->m.method; }
const char *http_target(const http_req *r) { return r->m.target; }

const http_field *http_field_of(const http_req *r, const char *name, int *count) { return http_msg_field(&r->m, name, count); }

const char *http_header(const http_req *r, const char *name) {
    const http_field *f = http_msg_field(&r->m, name, NULL);
    return f ? f->value : NULL;
}

struct evbuffer *http_body(http_req *r) {
    if (!r->m.body) r->m.body = evbuffer_new();
    return r->m.body;
}

int http_fd(const http_req *r) { return r->c ? (int)bufferevent_getfd(r->c->bev) : -1; }

void http_req_on(http_req *r, http_req_cb on_sent, http_req_cb on_close, void *arg) {
    r->on_sent = on_sent;
    r->on_close = on_close;
    r->arg = arg;
}

int http_add_header(http_req *r, const char *name, const char *value) {
    if (!*name) return -1;
    for (const char *q = name; *q; q++)
        if (*q <= 0x20 || *q >= 0x7f || *q == ':') return -1;
    for (const unsigned char *q = (const unsigned char *)value; *q; q++)
        if (*q < 0x20 && *q != '\t') return -1; /* no CR / LF: a header cannot be split */
    if (r->noh == r->capoh) {
        int nc = r->capoh ? 2 * r->capoh : 8;
        char **no = m3_fault_realloc(M3_FAULT_SERVER, r->oh, sizeof *no * (size_t)nc);
        if (!no) return -1;
        r->oh = no;
        r->capoh = nc;
    }
    size_t n = strlen(name) + strlen(value) + 3;
    char *line = m3_fault_malloc(M3_FAULT_SERVER, n);
    if (!line) return -1;
    snprintf(line, n, "%s: %s", name, value);
    r->oh[r->noh++] = line;
    return 0;
}

void http_close_after(http_req *r) { r->close_after = 1; }

size_t http_unsent(const http_req *r) { return r->c ? evbuffer_get_length(bufferevent_get_output(r->c->bev)) : 0; }

/* status line and header fields; clen -1: a streamed body (chunked, or to the close for HTTP/1.0) */
static void write_head(http_req *r, int status, const char *ctype, long long clen) {
    http_conn *c = r->c;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    r->started = 1;
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nDate: %s\r\n", status, http_reason(status), date_now(c->hs));
    if (ctype) evbuffer_add_printf(out, "Content-Type: %s\r\n", ctype);
    for (int i = 0; i < r->noh; i++) evbuffer_add_printf(out, "%s\r\n", r->oh[i]);
    if (status == 204) {} /* no body and no length (RFC 9110 section 8.6) */
    else if (clen >= 0) evbuffer_add_printf(out, "Content-Length: %lld\r\n", clen);
    else if (r->m.minor >= 1) {
        evbuffer_add_printf(out, "Transfer-Encoding: chunked\r\n");
        r->chunked = 1;
    } else r->close_after = 1; /* HTTP/1.0: the body ends with the connection */
    if (!r->m.keep_alive) r->close_after = 1;
    if (r->close_after) evbuffer_add_printf(out, "Connection: close\r\n");
    else if (r->m.minor == 0) evbuffer_add_printf(out, "Connection: keep-alive\r\n");
    evbuffer_add(out, "\r\n", 2);
}

/* every change of a connection's state: http_stats.sending counts those in C_SENDING */
static void set_state(http_conn *c, int state) {
    if (state == c->state) return;
    const int was = c->state == C_SENDING;
    c->state = state;
    if (state == C_SENDING) c->hs->st.sending++;
    else if (was) {
        c->hs->st.sending--;
        if (c->hs->o.sent_done) c->hs->o.sent_done(c->hs->arg);
    }
}

/* the whole response is handed over: the request ends once it is written */
static void reply_done(http_req *r) {
    http_conn *c = r->c;
    set_state(c, C_SENDING);
    if (r->close_after) c->close_after = 1;
    /* an empty output (a HEAD reply is never empty; this is for safety) would never call back */
    if (!evbuffer_get_length(bufferevent_get_output(c->bev))) bufferevent_trigger(c->bev, EV_WRITE, BEV_TRIG_DEFER_CALLBACKS);
}

void http_reply(http_req *r, int status, const char *content_type, struct evbuffer *body) {
    if (!r->c || r->started) return;
    size_t n = body ? evbuffer_get_length(body) : 0;
    write_head(r, status, content_type, (long long)n);
    if (n && !r->head_only) evbuffer_add_buffer(bufferevent_get_output(r->c->bev), body);
    else if (n) evbuffer_drain(body, n);
    reply_done(r);
}

void http_reply_start(http_req *r, int status, const char *content_type) {
    if (!r->c || r->started) return;
    r->streaming = 1;
    write_head(r, status, content_type, r->head_only ? 0 : -1);
}

int http_reply_chunkv(http_req *r, const struct iovec *iov, int n) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += iov[i].iov_len;
    if (!r->c || !r->streaming || !len || r->head_only) return 0;
    struct evbuffer *out = bufferevent_get_output(r->c->bev);
    if (r->chunked && evbuffer_add_printf(out, "%zx\r\n", len) < 0) return -1;
    for (int i = 0; i < n; i++)
        if (iov[i].iov_len && evbuffer_add(out, iov[i].iov_base, iov[i].iov_len)) return -1;
    if (r->chunked && evbuffer_add(out, "\r\n", 2)) return -1;
    return 0;
}

int http_reply_chunk(http_req *r, const void *data, size_t n) {
    struct iovec v = {(void *)data, n};
    return http_reply_chunkv(r, &v, 1);
}

void http_reply_end(http_req *r) {
    if (!r->c || !r->streaming) return;
    if (r->chunked && !r->head_only) evbuffer_add(bufferevent_get_output(r->c->bev), "0\r\n\r\n", 5);
    reply_done(r);
}

void http_drop(http_req *r) {
    http_conn *c = r->c;
    if (!c) return;
    c->cur = NULL;
    r->c = NULL;
    req_free(r);
    conn_free(c);
}

/* ------------------------------------------------------------------ connections */

static void set_read_ahead(http_conn *c, size_t n) { bufferevent_setwatermark(c->bev, EV_READ, 0, n); }

/* waiting for a request: the deadline runs from now, whatever trickles in */
static void wait_request(http_conn *c) {
    set_state(c, C_READ);
    set_read_ahead(c, c->hs->o.max_head + ((size_t)64 << 10));
    if (c->hs->o.timeout > 0) {
        struct timeval tv = tv_of(c->hs->o.timeout);
        evtimer_add(c->tmr, &tv);
    }
}

static void linger(http_conn *c) {
    set_state(c, C_LINGER);
    shutdown(bufferevent_getfd(c->bev), SHUT_WR);
    bufferevent_disable(c->bev, EV_WRITE);
    struct evbuffer *in = bufferevent_get_input(c->bev);
    evbuffer_drain(in, evbuffer_get_length(in));
    set_read_ahead(c, 0);
    bufferevent_enable(c->bev, EV_READ);
    struct timeval tv = tv_of(LINGER_S);
    evtimer_add(c->tmr, &tv);
}

/* a new client has sent its first request (or gone): a server stopping need not wait for it */
static void fresh_done(http_conn *c) {
    if (!c->fresh) return;
    c->fresh = 0;
    c->hs->st.awaiting_first--;
    if (c->hs->o.first_done) c->hs->o.first_done(c->hs->arg);
}

/* an error this layer answers itself (no request of the application's in flight); the
 * connection closes after it */
static void answer_error(http_conn *c, int status, const char *msg) {
    http_server *hs = c->hs;
    fresh_done(c);
    char body[1024];
    size_t n = hs->o.error_body ? hs->o.error_body(body, sizeof body, status, msg, c->p.m.target) : 0;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nDate: %s\r\n", status, http_reason(status), date_now(hs));
    if (n && hs->o.error_type) evbuffer_add_printf(out, "Content-Type: %s\r\n", hs->o.error_type);
    evbuffer_add_printf(out, "Content-Length: %zu\r\nConnection: close\r\n\r\n", n);
    evbuffer_add(out, body, n);
    evtimer_del(c->tmr);
    set_state(c, C_SENDING);
    c->close_after = 1;
    hs->st.refused++;
}

static void dispatch(http_conn *c) {
    fresh_done(c);
    http_req *r = m3_fault_calloc(M3_FAULT_SERVER, 1, sizeof *r);
    if (!r) { answer_error(c, 500, "out of memory"); return; }
    r->c = c;
    http_parser_take(&c->p, &r->m);
    r->close_after = !r->m.keep_alive;
    r->head_only = !strcmp(r->m.method, "HEAD");
    c->cur = r;
    set_state(c, C_BUSY);
    evtimer_del(c->tmr);
    set_read_ahead(c, BUSY_READ_AHEAD);
    c->hs->handler(r, c->hs->arg);
}

static void process(http_conn *c) {
    struct evbuffer *in = bufferevent_get_input(c->bev);
    while (c->state == C_READ) {
        int rc = http_parse(&c->p, in);
        if (rc == HTTP_MORE) return;
        if (rc == HTTP_ERROR) { answer_error(c, c->p.status, c->p.err); return; }
        if (rc == HTTP_HEAD) {
            if (c->p.m.expect_continue && c->p.m.minor >= 1)
                evbuffer_add_printf(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n");
            continue;
        }
        dispatch(c);
    }
}

static void read_cb(struct bufferevent *bev, void *arg) {
    http_conn *c = arg;
    if (c->state == C_READ) process(c);
    else if (c->state == C_LINGER) evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
    /* BUSY / SENDING: a pipelined request waits in the input (up to BUSY_READ_AHEAD) */
}

static void write_cb(struct bufferevent *bev, void *arg) {
    http_conn *c = arg;
    if (c->state != C_SENDING || evbuffer_get_length(bufferevent_get_output(bev))) return;
    http_req *r = c->cur;
    c->cur = NULL;
    if (r) {
        r->c = NULL;
        if (r->on_sent) r->on_sent(r, r->arg);
        req_free(r);
    }
    if (c->close_after) { linger(c); return; }
    wait_request(c);
    process(c); /* a request that came meanwhile */
}

static void event_cb(struct bufferevent *bev, short what, void *arg) {
    (void)bev;
    http_conn *c = arg;
    if ((what & BEV_EVENT_EOF) && c->state == C_SENDING) {
        /* the client is done sending (a half close): the answer still goes out, then the close */
        c->close_after = 1;
        bufferevent_disable(c->bev, EV_READ);
        return;
    }
    if (what & BEV_EVENT_TIMEOUT) c->hs->st.write_timeouts++;
    conn_free(c); /* EOF while busy: the client left; errors; a write that made no progress */
}

static void tmr_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    http_conn *c = arg;
    if (c->state == C_READ && (c->p.started || evbuffer_get_length(bufferevent_get_input(c->bev)))) {
        c->hs->st.slow_requests++;
        char msg[96];
        snprintf(msg, sizeof msg, "the request did not arrive whole within %g s", c->hs->o.timeout);
        answer_error(c, 408, msg);
        return;
    }
    conn_free(c); /* idle past the timeout, or the linger is over */
}

static void resume_listener(http_server *hs) {
    if (hs->lis && !hs->stopped) evconnlistener_enable(hs->lis);
}

static void conn_free(http_conn *c) {
    http_server *hs = c->hs;
    fresh_done(c);
    set_state(c, C_CLOSED); /* (a reply cut off by the close is not waited for) */
    http_req *r = c->cur;
    c->cur = NULL;
    if (r) {
        r->c = NULL;
        if (r->on_close) r->on_close(r, r->arg);
        req_free(r);
    }
    bufferevent_free(c->bev);
    event_free(c->tmr);
    http_parser_free(&c->p);
    if (c->prev) c->prev->next = c->next;
    else hs->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    hs->st.connections--;
    free(c);
    if (hs->paused_cap && hs->st.connections < hs->o.max_connections) {
        hs->paused_cap = 0;
        resume_listener(hs);
    }
}

static void accept_cb(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg) {
    (void)salen;
    http_server *hs = arg;
    if (hs->o.sndbuf > 0) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &hs->o.sndbuf, sizeof hs->o.sndbuf);
    int one = 1; /* tokens go out as they come, not 40 ms later behind Nagle's algorithm */
    if (!sa || sa->sa_family != AF_UNIX) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    http_conn *c = m3_fault_calloc(M3_FAULT_SERVER, 1, sizeof *c);
    if (c) c->bev = bufferevent_socket_new(hs->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (c && c->bev) c->tmr = evtimer_new(hs->base, tmr_cb, c);
    if (!c || !c->tmr) { /* out of memory: the client is turned away (its connection closed, counted) */
        if (c && c->bev) bufferevent_free(c->bev);
        else close(fd);
        free(c);
        hs->st.turned_away++;
        return;
    }
    c->hs = hs;
    http_parser_init(&c->p, hs->o.max_head, hs->o.max_body);
    bufferevent_setcb(c->bev, read_cb, write_cb, event_cb, c);
    /* a long answer goes out 256 KiB a write, between other clients' events (one write of 20 MB
     * held the loop for tens of ms) */
    bufferevent_set_max_single_write(c->bev, (size_t)256 << 10);
    if (hs->o.timeout > 0) {
        struct timeval tv = tv_of(hs->o.timeout);
        bufferevent_set_timeouts(c->bev, NULL, &tv); /* a response the client does not take */
    }
    c->next = hs->conns;
    if (hs->conns) hs->conns->prev = c;
    hs->conns = c;
    hs->st.connections++;
    hs->st.accepted++;
    c->fresh = 1;
    hs->st.awaiting_first++;
    wait_request(c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    if (hs->draining_queue) return; /* (the listener closes next: no cap to keep) */
    if (hs->o.max_connections > 0 && hs->st.connections >= hs->o.max_connections && !hs->paused_cap) {
        evconnlistener_disable(lis);
        hs->paused_cap = 1;
        if (hs->st.cap_pauses++ % 100 == 0)
            fprintf(stderr, "m3 serve: %d connections (--max-connections %d): new clients wait until some close\n",
                    hs->st.connections, hs->o.max_connections);
    }
}

/* Out of file descriptors (EMFILE / ENFILE): the listener stays readable, and accepting again
 * at once would spin (8 s of CPU in 10 and nobody served, issue 23). It pauses for 100 ms
 * instead; the clients wait in the kernel's backlog meanwhile. */
static void accept_error_cb(struct evconnlistener *lis, void *arg) {
    http_server *hs = arg;
    int e = EVUTIL_SOCKET_ERROR();
    if (e != EMFILE && e != ENFILE && e != ENOBUFS && e != ENOMEM) return; /* a client's own failure (ECONNABORTED...) */
    evconnlistener_disable(lis);
    if (hs->st.accept_pauses++ % 100 == 0)
        fprintf(stderr, "m3 serve: cannot accept connections (%s): new clients wait 100 ms at a time (%lu pauses so far)\n",
                evutil_socket_error_to_string(e), hs->st.accept_pauses);
    struct timeval tv = {0, 100000};
    event_add(hs->relisten, &tv);
}

static void relisten_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    http_server *hs = arg;
    hs->st.accept_resumes++;
    if (!hs->paused_cap) resume_listener(hs);
}

/* ------------------------------------------------------------------ the server */

http_server *http_server_new(struct event_base *base, const http_opts *o, http_handler handler, void *arg) {
    http_server *hs = calloc(1, sizeof *hs);
    if (!hs) return NULL;
    hs->base = base;
    hs->o = *o;
    hs->handler = handler;
    hs->arg = arg;
    hs->relisten = evtimer_new(base, relisten_cb, hs);
    if (!hs->relisten) { free(hs); return NULL; }
    return hs;
}

int http_server_listen(http_server *hs, const char *host, int port, char *err, size_t errcap) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g) {
        snprintf(err, errcap, "cannot listen on %s:%d: %s", host, port, gai_strerror(g));
        return -1;
    }
    int e = 0;
    for (struct addrinfo *ai = res; ai && !hs->lis; ai = ai->ai_next) {
        hs->lis = evconnlistener_new_bind(hs->base, accept_cb, hs, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
                                          1024, ai->ai_addr, (int)ai->ai_addrlen);
        if (!hs->lis) e = errno;
    }
    freeaddrinfo(res);
    if (!hs->lis) {
        snprintf(err, errcap, "cannot listen on %s:%d: %s", host, port, strerror(e ? e : EADDRNOTAVAIL));
        return -1;
    }
    evconnlistener_set_error_cb(hs->lis, accept_error_cb);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (!getsockname(evconnlistener_get_fd(hs->lis), (struct sockaddr *)&ss, &sl)) {
        if (ss.ss_family == AF_INET) port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6) port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    return port;
}

int http_server_listen_unix(http_server *hs, const char *path, char *err, size_t errcap) {
    struct sockaddr_un sun;
    memset(&sun, 0, sizeof sun);
    sun.sun_family = AF_UNIX;
    const size_t n = strlen(path);
    if (!n || n >= sizeof sun.sun_path) {
        snprintf(err, errcap, "cannot listen on the Unix socket '%s': the path must have 1 to %zu bytes", path,
                 sizeof sun.sun_path - 1);
        return -1;
    }
    memcpy(sun.sun_path, path, n);
    struct stat st;
    if (!lstat(path, &st)) { /* a socket left by a server that is gone is replaced; anything else is kept */
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, errcap, "cannot listen on the Unix socket '%s': the path exists and is not a socket", path);
            return -1;
        }
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = fd >= 0 && !connect(fd, (struct sockaddr *)&sun, sizeof sun);
        int ce = errno;
        if (fd >= 0) close(fd);
        if (live || fd < 0 || ce != ECONNREFUSED) { /* (not known to be stale: kept) */
            snprintf(err, errcap, "cannot listen on the Unix socket '%s': %s", path,
                     live ? "a server is listening there" : strerror(ce));
            return -1;
        }
        unlink(path);
    }
    if (!(hs->uds = strdup(path))) { snprintf(err, errcap, "out of memory"); return -1; }
    hs->lis = evconnlistener_new_bind(hs->base, accept_cb, hs, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 1024,
                                      (struct sockaddr *)&sun, (int)sizeof sun);
    if (!hs->lis) {
        snprintf(err, errcap, "cannot listen on the Unix socket '%s': %s", path, strerror(errno));
        free(hs->uds);
        hs->uds = NULL;
        return -1;
    }
    evconnlistener_set_error_cb(hs->lis, accept_error_cb);
    if (!lstat(path, &st)) { /* removed at shutdown only while it is still this socket */
        hs->uds_dev = st.st_dev;
        hs->uds_ino = st.st_ino;
    }
    return 0;
}

void http_server_stop_listening(http_server *hs) {
    struct stat st; /* new clients find no socket (unless another server has put its own there) */
    if (hs->uds && !lstat(hs->uds, &st) && st.st_dev == hs->uds_dev && st.st_ino == hs->uds_ino) unlink(hs->uds);
    free(hs->uds);
    hs->uds = NULL;
    /* The clients already in the listen queue (connected, their request perhaps sent) are taken in
     * before the socket closes: each gets an answer (a draining server's 503) where closing the
     * socket would reset them unread, and a client could not tell such a request from one the
     * server ran and lost. On a Unix socket none can join the queue once its path is gone (above);
     * out of descriptors or memory, the rest are reset as before. */
    if (hs->lis && !hs->stopped) {
        const evutil_socket_t lfd = evconnlistener_get_fd(hs->lis);
        evutil_make_socket_nonblocking(lfd);
        hs->draining_queue = 1;
        for (int k = 0; k < 65536; k++) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            const int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0) accept_cb(hs->lis, fd, (struct sockaddr *)&ss, (int)sl, hs);
            else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                     errno == ENOMEM || errno == EBADF || errno == EINVAL)
                break; /* the queue is empty, or no descriptor / memory for the rest */
            /* else a client's own failure (ECONNABORTED, EPROTO...) or EINTR: the next one */
        }
        hs->draining_queue = 0;
    }
    hs->stopped = 1;
    if (hs->lis) evconnlistener_free(hs->lis);
    hs->lis = NULL;
}

void http_server_stats(const http_server *hs, http_stats *st) { *st = hs->st; }

void http_server_free(http_server *hs) {
    if (!hs) return;
    hs->stopped = 1; /* (no client taken in from the queue only to be closed) */
    http_server_stop_listening(hs);
    while (hs->conns) conn_free(hs->conns);
    event_free(hs->relisten);
    free(hs);
}
