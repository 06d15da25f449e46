/* m3 serve: the HTTP/1.1 server side, on libevent bufferevents: connections, requests
 * (parsed by http_parse.c) and responses, fixed-length or streamed (chunked).
 *
 * What it guarantees, for every client:
 *   - a request is refused as RFC 9112 says (http_parse.h), in the application's error shape
 *     (http_opts.error_body), before the application sees it; the connection then closes
 *     after the answer is written (a lingering close: what the client still sends is read and
 *     dropped for up to 2 s, so it gets the answer rather than a reset);
 *   - a request must arrive whole within timeout seconds of its wait's start (the accept, or
 *     the previous response written), however it trickles in; an idle connection closes then;
 *   - a response the client does not take for timeout seconds closes the connection;
 *   - at most max_connections at once: the listener pauses at the cap (new clients wait in
 *     the kernel's backlog) and when the process runs out of descriptors (100 ms at a time);
 *   - while a request is being answered its connection is still read (up to 64 KiB ahead),
 *     so a client that leaves is seen at once (on_close);
 *   - pipelined requests are answered in order, one at a time.
 *
 * Lifetime of a request: the handler gets it, and it is the application's until its response
 * is written whole (on_sent) or its client is gone (on_close); after either callback returns,
 * the request is freed. A request handed on (to another thread's work, to a generation) must
 * have its callbacks set (http_req_on) so its holder learns of its end. Loop thread only. */
#ifndef M3_SERVER_HTTP_H
#define M3_SERVER_HTTP_H

#include <stddef.h>
#include <sys/uio.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "http_parse.h"

typedef struct http_server http_server;
typedef struct http_req http_req;

typedef struct http_opts {
    size_t max_head;        /* request line + header fields, and chunked trailers (bytes) */
    size_t max_body;        /* the decoded body (bytes) */
    double timeout;         /* seconds (above); 0: none */
    int max_connections;    /* 0: no cap */
    int sndbuf;             /* SO_SNDBUF of accepted sockets (the kernel doubles it); 0: the system's */
    /* the body of an error this layer answers itself (into buf, at most cap bytes; returns its
     * length), sent as error_type; target: the request's, NULL when its request line was not read */
    size_t (*error_body)(char *buf, size_t cap, int status, const char *msg, const char *target);
    const char *error_type;
    /* a connection awaiting its first request got it or closed (http_stats.awaiting_first fell);
     * called with the handler's arg, before the request (if any) is handled. NULL: none */
    void (*first_done)(void *arg);
    /* a reply was all handed to the kernel, or its connection closed before (http_stats.sending
     * fell); called with the handler's arg. NULL: none. Both callbacks run inside this layer's
     * write and close paths (before a closing connection's on_close): they must not drop, free
     * or answer connections; arming an event for later is what they are for */
    void (*sent_done)(void *arg);
} http_opts;

typedef void (*http_handler)(http_req *r, void *arg);
typedef void (*http_req_cb)(http_req *r, void *arg);

typedef struct http_stats {
    int connections;           /* open now */
    unsigned long accepted;
    unsigned long refused;         /* requests answered with an error by this layer */
    unsigned long slow_requests;   /* requests that did not arrive whole within the timeout */
    unsigned long write_timeouts;  /* connections closed: the client took no bytes for the timeout */
    unsigned long turned_away;     /* connections closed as soon as accepted: no memory for their state */
    unsigned long accept_pauses, cap_pauses;
    unsigned long accept_resumes;  /* accept pauses ended (the 100 ms timer): at most one pause is pending */
    int awaiting_first;            /* open connections whose first request has not come (a new client's, or one
                                    * taken from the listen queue at the stop): a server stopping answers them first */
    int sending;                   /* open connections whose whole reply is in this layer's buffers, not yet all
                                    * written to the socket: a server stopping lets them go out before it exits */
} http_stats;

http_server *http_server_new(struct event_base *base, const http_opts *o, http_handler handler, void *arg);
/* Listens on host:port (0: any free port). Returns the port, or -1 with the reason in err. */
int http_server_listen(http_server *hs, const char *host, int port, char *err, size_t errcap);
/* Listens on a Unix socket at path (a socket left there by a server that is gone is replaced;
 * a live one, or a path that is not a socket, is an error). Returns 0, or -1 with the reason in
 * err. The path is removed when the listener closes. */
int http_server_listen_unix(http_server *hs, const char *path, char *err, size_t errcap);
void http_server_stop_listening(http_server *hs); /* new clients are refused; open connections go on */
/* Closes every connection (requests in flight get on_close) and frees the server. */
void http_server_free(http_server *hs);
void http_server_stats(const http_server *hs, http_stats *st);

/* ---- the request */
const char *http_method(const http_req *r);
const char *http_target(const http_req *r);  /* origin-form: path and query */
const char *http_header(const http_req *r, const char *name); /* the first such field's value; NULL: none */
const http_field *http_field_of(const http_req *r, const char *name, int *count);
struct evbuffer *http_body(http_req *r);     /* the decoded body (empty, never NULL but out of memory) */
int http_fd(const http_req *r);              /* the client's socket (logs, tests) */

/* ---- the response: http_reply, or http_reply_start + http_reply_chunk... + http_reply_end */
int http_add_header(http_req *r, const char *name, const char *value); /* 0, -1: no memory (or a bad name / value) */
void http_close_after(http_req *r);          /* Connection: close */
/* status with body (taken: drained; NULL: none) of content_type (NULL: none) */
void http_reply(http_req *r, int status, const char *content_type, struct evbuffer *body);
void http_reply_start(http_req *r, int status, const char *content_type);
int http_reply_chunk(http_req *r, const void *data, size_t n); /* 0; -1: out of memory */
int http_reply_chunkv(http_req *r, const struct iovec *iov, int n); /* one chunk of n pieces */
void http_reply_end(http_req *r);
size_t http_unsent(const http_req *r);       /* bytes handed over and not yet written to the socket */
/* the callbacks of the request's end (above); NULLs clear them */
void http_req_on(http_req *r, http_req_cb on_sent, http_req_cb on_close, void *arg);
/* closes the client's connection now (a client that stopped reading); no callback follows,
 * and r is gone */
void http_drop(http_req *r);

const char *http_reason(int status);

#endif
