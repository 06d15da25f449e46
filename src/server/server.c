/* m3 serve: see server.h. */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <jansson.h>

#include "../text/parsers.h"

/* ------------------------------------------------------------------ state */

typedef struct sreq {
    struct srv *s;
    struct evhttp_request *req;
    struct evhttp_connection *conn;
    uint64_t id;          /* engine id */
    unsigned long serial;
    int chat, stream, include_usage;
    int closed;           /* client went away: req is gone */
    int done;             /* response finished (or client gone); wait for the engine's end */
    int engine_ended;     /* engine reported finished */
    int finish_reason;    /* M3_FINISH_* as reported to the client */
    int n_prompt, n_gen;
    long created;
    m3_tok_stream *ts;
    m3_out *out;
    m3_stop *stop;
    char *text; size_t len, cap, emitted, checked;
    json_t *acc_reason, *acc_content, *acc_tools; /* non-stream chat: strings built up / array */
    char *acc_text; size_t acc_len, acc_cap;       /* non-stream content (completions and chat) */
    char *rbuf; size_t rlen, rcap;                 /* non-stream reasoning */
    json_t *tools_arr;                              /* non-stream chat tool calls */
    int sent_role, cancel_sent;
    struct sreq *prev, *next; /* srv.active while not done */
} sreq;

typedef struct qitem { sreq *r; int32_t token; int finished, reason; } qitem;

typedef struct srv {
    m3_engine *e;
    const m3_tok *tok;
    const m3_chat *chat;
    int vocab;
    int reasoning_parser, tool_parser;
    const m3_server_opts *o;
    struct event_base *base;
    struct event *notify, *sigint, *sigterm;
    pthread_mutex_t mu;
    qitem *q; size_t qn, qcap;
    volatile int stop_engine;
    unsigned long serial;
    uint64_t seed_ctr;
    sreq *active;
    struct event *peek;
} srv;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ small helpers */

static int buf_add(char **b, size_t *len, size_t *cap, const char *p, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 64;
        while (nc < *len + n + 1) nc *= 2;
        char *nb = realloc(*b, nc);
        if (!nb) return -1;
        *b = nb; *cap = nc;
    }
    if (n) memcpy(*b + *len, p, n);
    *len += n;
    (*b)[*len] = 0;
    return 0;
}

static void send_json(struct evhttp_request *req, int code, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    struct evbuffer *b = evbuffer_new();
    if (s) evbuffer_add(b, s, strlen(s));
    free(s);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    const char *reason = code == 200 ? "OK" : code == 400 ? "Bad Request" : code == 401 ? "Unauthorized"
                       : code == 404 ? "Not Found" : code == 405 ? "Method Not Allowed" : "Error";
    evhttp_send_reply(req, code, reason, b);
    evbuffer_free(b);
}

static void send_error(struct evhttp_request *req, int code, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(struct evhttp_request *req, int code, const char *type, const char *fmt, ...) {
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *j = json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", msg, "type", type, "param", "code", code);
    send_json(req, code, j);
}
#define BAD(req, ...) send_error(req, 400, "invalid_request_error", __VA_ARGS__)

static int check_auth(srv *s, struct evhttp_request *req) {
    if (!s->o->api_key) return 1;
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    const char *key = s->o->api_key;
    size_t kl = strlen(key);
    const char *given = "";
    if (h && !strncmp(h, "Bearer ", 7)) given = h + 7;
    size_t gl = strlen(given);
    /* constant time over the key's length; length mismatch folded in */
    unsigned diff = (unsigned)(gl != kl);
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < gl ? given[i] : 0);
    if (!diff) return 1;
    send_error(req, 401, "authentication_error", "invalid or missing API key");
    return 0;
}

/* Reads and parses the body; sends 400 and returns NULL when it is not a JSON object. */
static json_t *read_body(struct evhttp_request *req) {
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    char *p = malloc(n + 1);
    if (!p) { send_error(req, 500, "server_error", "out of memory"); return NULL; }
    evbuffer_copyout(in, p, n);
    p[n] = 0;
    json_error_t je;
    json_t *j = json_loadb(p, n, 0, &je);
    free(p);
    if (!j) { BAD(req, "invalid JSON body: %s (line %d, column %d)", je.text, je.line, je.column); return NULL; }
    if (!json_is_object(j)) { json_decref(j); BAD(req, "the request body must be a JSON object"); return NULL; }
    return j;
}

/* number field: absent/null -> keep *out, returns 0; wrong type or range -> 400, returns -1 */
static int get_num(struct evhttp_request *req, json_t *b, const char *k, double lo, double hi, double *out) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) { BAD(req, "'%s' must be a number", k); return -1; }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) { BAD(req, "'%s' must be in [%g, %g]", k, lo, hi); return -1; }
    *out = x;
    return 0;
}
static int get_int(struct evhttp_request *req, json_t *b, const char *k, long long lo, long long hi, long long *out) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) { BAD(req, "'%s' must be an integer", k); return -1; }
    long long x = json_integer_value(v);
    if (x < lo || x > hi) { BAD(req, "'%s' must be in [%lld, %lld]", k, lo, hi); return -1; }
    *out = x;
    return 0;
}

/* ------------------------------------------------------------------ engine thread side */

static void on_token(void *arg, uint64_t id, int32_t token, float logprob, int finished, int reason) {
    (void)id; (void)logprob;
    sreq *r = arg;
    srv *s = r->s;
    pthread_mutex_lock(&s->mu);
    if (s->qn == s->qcap) {
        size_t nc = s->qcap ? s->qcap * 2 : 256;
        qitem *nq = realloc(s->q, nc * sizeof *nq);
        if (!nq) { pthread_mutex_unlock(&s->mu); return; } /* nothing sane to do */
        s->q = nq; s->qcap = nc;
    }
    s->q[s->qn++] = (qitem){r, token, finished, reason};
    pthread_mutex_unlock(&s->mu);
    event_active(s->notify, EV_READ, 0);
}

static void *engine_main(void *arg) {
    srv *s = arg;
    m3_err err;
    while (!s->stop_engine) {
        if (!m3_engine_has_work(s->e)) { m3_engine_wait_work(s->e, 100); continue; }
        if (m3_engine_step(s->e, &err) < 0) fprintf(stderr, "m3 serve: step failed: %s\n", err.msg);
    }
    return NULL;
}

/* ------------------------------------------------------------------ requests */

static void sreq_free(sreq *r) {
    if (!r) return;
    m3_tok_stream_free(r->ts);
    m3_out_free(r->out);
    m3_stop_free(r->stop);
    free(r->text); free(r->acc_text); free(r->rbuf);
    json_decref(r->tools_arr);
    free(r);
}

static void set_done(sreq *r) {
    if (r->done) return;
    r->done = 1;
    if (r->prev) r->prev->next = r->next; else if (r->s->active == r) r->s->active = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

/* libevent 2.1 does not notice a client that closes while its request waits for the
 * reply (no read on the connection then): peek every active request's socket. */
static void peek_cb(evutil_socket_t fd_, short what, void *arg) {
    (void)fd_; (void)what;
    srv *s = arg;
    for (sreq *r = s->active; r; r = r->next) {
        if (r->cancel_sent) continue;
        struct bufferevent *bev = evhttp_connection_get_bufferevent(r->conn);
        evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
        if (fd < 0) continue;
        char c;
        ssize_t k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            r->cancel_sent = 1;
            m3_engine_cancel(s->e, r->id);
        }
    }
}

static void conn_closed(struct evhttp_connection *c, void *arg) {
    (void)c;
    sreq *r = arg;
    if (r->done) return;
    r->closed = 1;
    set_done(r);
    r->req = NULL;
    m3_engine_cancel(r->s->e, r->id);
}

static const char *finish_str(int reason) {
    return reason == M3_FINISH_STOP ? "stop" : reason == M3_FINISH_LENGTH ? "length" : reason == M3_FINISH_ERROR ? "error" : "stop";
}

static json_t *usage_json(sreq *r) {
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", r->n_prompt, "completion_tokens", r->n_gen, "total_tokens",
                     r->n_prompt + r->n_gen);
}

static void sse_send(sreq *r, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return;
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "data: %s\n\n", s);
    free(s);
    evhttp_send_reply_chunk(r->req, b);
    evbuffer_free(b);
}

static json_t *chunk_base(sreq *r) {
    char id[64];
    snprintf(id, sizeof id, "%s-%lu", r->chat ? "chatcmpl" : "cmpl", r->serial);
    return json_pack("{s:s,s:s,s:I,s:s}", "id", id, "object", r->chat ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)r->created, "model", r->s->o->model_name);
}

/* Passes decoded, stop-checked text downstream (stream chunks or accumulation). */
static void emit_deltas(sreq *r, const m3_out_delta *d, size_t n) {
    if (!n) return;
    if (r->stream) {
        json_t *c = chunk_base(r);
        json_t *delta = m3_out_delta_json(d, n);
        json_object_set_new(c, "choices", json_pack("[{s:i,s:o,s:n,s:n}]", "index", 0, "delta", delta, "logprobs",
                                                    "finish_reason"));
        sse_send(r, c);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (d[i].kind == M3_OUT_CONTENT) buf_add(&r->acc_text, &r->acc_len, &r->acc_cap, d[i].text, d[i].len);
        else if (d[i].kind == M3_OUT_REASONING) buf_add(&r->rbuf, &r->rlen, &r->rcap, d[i].text, d[i].len);
        else if (d[i].kind == M3_OUT_TOOL_BEGIN) {
            if (!r->tools_arr) r->tools_arr = json_array();
            json_array_append_new(r->tools_arr, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", d[i].id, "type", "function",
                                                          "function", "name", d[i].name, "arguments", ""));
        } else if (d[i].kind == M3_OUT_TOOL_ARGS && r->tools_arr) {
            json_t *f = json_object_get(json_array_get(r->tools_arr, json_array_size(r->tools_arr) - 1), "function");
            const char *old = json_string_value(json_object_get(f, "arguments"));
            size_t ol = old ? strlen(old) : 0;
            char *nw = malloc(ol + d[i].len + 1);
            if (nw) {
                memcpy(nw, old ? old : "", ol);
                memcpy(nw + ol, d[i].text, d[i].len);
                nw[ol + d[i].len] = 0;
                json_object_set_new(f, "arguments", json_stringn_nocheck(nw, ol + d[i].len));
                free(nw);
            }
        }
    }
}

static void emit_text(sreq *r, const char *p, size_t n, int final) {
    const m3_out_delta *d = NULL;
    size_t nd = 0;
    m3_err err;
    if (r->out) {
        if (n && m3_out_feed(r->out, p, n, &d, &nd, &err) == 0) emit_deltas(r, d, nd);
        if (final && m3_out_finish(r->out, &d, &nd, &err) == 0) emit_deltas(r, d, nd);
        return;
    }
    if (!n) return;
    if (r->stream && !r->chat) {
        json_t *c = chunk_base(r);
        json_object_set_new(c, "choices", json_pack("[{s:i,s:s%,s:n,s:n}]", "index", 0, "text", p, n, "logprobs",
                                                    "finish_reason"));
        sse_send(r, c);
        return;
    }
    m3_out_delta one = {M3_OUT_CONTENT, -1, p, n, NULL, NULL};
    emit_deltas(r, &one, 1);
}

static void finish_response(sreq *r) {
    set_done(r);
    evhttp_connection_set_closecb(r->conn, NULL, NULL);
    const char *fr = finish_str(r->finish_reason);
    if (r->stream) {
        json_t *c = chunk_base(r);
        if (r->chat)
            json_object_set_new(c, "choices", json_pack("[{s:i,s:{},s:n,s:s}]", "index", 0, "delta", "logprobs",
                                                        "finish_reason", fr));
        else
            json_object_set_new(c, "choices", json_pack("[{s:i,s:s,s:n,s:s}]", "index", 0, "text", "", "logprobs",
                                                        "finish_reason", fr));
        sse_send(r, c);
        if (r->include_usage) {
            c = chunk_base(r);
            json_object_set_new(c, "choices", json_array());
            json_object_set_new(c, "usage", usage_json(r));
            sse_send(r, c);
        }
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(b, "data: [DONE]\n\n");
        evhttp_send_reply_chunk(r->req, b);
        evbuffer_free(b);
        evhttp_send_reply_end(r->req);
        return;
    }
    char id[64];
    snprintf(id, sizeof id, "%s-%lu", r->chat ? "chatcmpl" : "cmpl", r->serial);
    json_t *choice;
    const char *content = r->acc_text ? r->acc_text : "";
    if (r->chat) {
        json_t *msg = json_pack("{s:s,s:s%}", "role", "assistant", "content", content, r->acc_len);
        if (!json_object_get(msg, "content")) json_object_set_new(msg, "content", json_string(""));
        if (r->rbuf) json_object_set_new(msg, "reasoning_content", json_stringn(r->rbuf, r->rlen));
        if (r->tools_arr) {
            json_object_set(msg, "tool_calls", r->tools_arr);
            if (r->finish_reason == M3_FINISH_STOP) fr = "tool_calls";
        }
        choice = json_pack("{s:i,s:o,s:n,s:s}", "index", 0, "message", msg, "logprobs", "finish_reason", fr);
    } else {
        choice = json_pack("{s:i,s:s%,s:n,s:s}", "index", 0, "text", content, r->acc_len, "logprobs", "finish_reason", fr);
    }
    if (!choice) choice = json_pack("{s:i,s:s,s:s}", "index", 0, "text", "", "finish_reason", fr); /* bad UTF-8 */
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", id, "object", r->chat ? "chat.completion" : "text_completion",
                          "created", (json_int_t)r->created, "model", r->s->o->model_name, "choices", choice, "usage",
                          usage_json(r));
    send_json(r->req, 200, j);
}

/* HTTP thread: one engine record. */
static void handle_item(srv *s, qitem *it) {
    sreq *r = it->r;
    if (it->finished) r->engine_ended = 1;
    if (!r->done && it->token >= 0) {
        r->n_gen++;
        const char *p = NULL;
        size_t n = 0;
        m3_err err;
        int is_stop_tok = it->finished && it->reason == M3_FINISH_STOP;
        if (!is_stop_tok && m3_tok_stream_push(r->ts, it->token, &p, &n, &err) == 0 && n)
            buf_add(&r->text, &r->len, &r->cap, p, n);
        if (it->finished) {
            m3_tok_stream_finish(r->ts, &p, &n);
            if (n) buf_add(&r->text, &r->len, &r->cap, p, n);
        }
        size_t upto = r->len;
        int hit = 0;
        if (r->stop) {
            m3_stop_match m;
            if (m3_stop_scan(r->stop, r->text ? r->text : "", r->len, r->checked, &m)) { upto = m.start; hit = 1; }
            else if (!it->finished) upto = m.safe;
            r->checked = r->len;
        }
        if (upto > r->emitted) emit_text(r, r->text + r->emitted, upto - r->emitted, 0);
        if (upto > r->emitted) r->emitted = upto;
        if (hit) {
            m3_engine_cancel(s->e, r->id);
            r->finish_reason = M3_FINISH_STOP;
            emit_text(r, NULL, 0, 1);
            finish_response(r);
        } else if (it->finished) {
            r->finish_reason = it->reason;
            emit_text(r, NULL, 0, 1);
            finish_response(r);
        }
    } else if (!r->done && it->finished) { /* ended without a token (error) */
        r->finish_reason = it->reason;
        if (r->stream) { emit_text(r, NULL, 0, 1); finish_response(r); }
        else {
            set_done(r);
            evhttp_connection_set_closecb(r->conn, NULL, NULL);
            send_error(r->req, 500, "server_error", "generation failed");
        }
    }
    if (r->engine_ended && r->done) sreq_free(r);
}

static void notify_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        qitem *q = s->q;
        size_t n = s->qn;
        s->q = NULL; s->qn = 0; s->qcap = 0;
        pthread_mutex_unlock(&s->mu);
        if (!n) { free(q); return; }
        for (size_t i = 0; i < n; i++) handle_item(s, &q[i]);
        free(q);
    }
}

/* ------------------------------------------------------------------ prompt building */

static int ids_from_json(struct evhttp_request *req, json_t *a, int vocab, int32_t **ids, size_t *n) {
    size_t k = json_array_size(a);
    if (!k) { BAD(req, "the prompt is empty"); return -1; }
    int32_t *v = malloc(k * sizeof *v);
    if (!v) { send_error(req, 500, "server_error", "out of memory"); return -1; }
    for (size_t i = 0; i < k; i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab) {
            free(v);
            BAD(req, "token id at index %zu is not an integer in [0, %d)", i, vocab);
            return -1;
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    *ids = v; *n = k;
    return 0;
}

static int encode_text(srv *s, struct evhttp_request *req, const char *t, size_t len, int allow_special, int32_t **ids,
                       size_t *n) {
    m3_err err;
    if (m3_tok_encode(s->tok, t, len, allow_special, ids, n, &err)) { BAD(req, "cannot tokenize the prompt: %s", err.msg); return -1; }
    return 0;
}

/* Renders messages through the chat template and encodes them. */
static int chat_prompt(srv *s, struct evhttp_request *req, json_t *b, int32_t **ids, size_t *n) {
    json_t *msgs = json_object_get(b, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs)) { BAD(req, "'messages' must be a non-empty array"); return -1; }
    if (!s->chat) { BAD(req, "this model has no chat template"); return -1; }
    json_t *tools = json_object_get(b, "tools");
    if (tools && json_is_null(tools)) tools = NULL;
    if (tools && !json_is_array(tools)) { BAD(req, "'tools' must be an array"); return -1; }
    json_t *kw = json_object_get(b, "chat_template_kwargs");
    if (kw && json_is_null(kw)) kw = NULL;
    if (kw && !json_is_object(kw)) { BAD(req, "'chat_template_kwargs' must be an object"); return -1; }
    int agp = 1;
    json_t *a = json_object_get(b, "add_generation_prompt");
    if (json_is_boolean(a)) agp = json_is_true(a);
    m3_err err;
    size_t len;
    char *text = m3_chat_render(s->chat, msgs, tools, agp, kw, NULL, &len, &err);
    if (!text) { BAD(req, "chat template: %s", err.msg); return -1; }
    int rc = encode_text(s, req, text, len, 1, ids, n);
    free(text);
    return rc;
}

/* ------------------------------------------------------------------ handlers */

static void h_health(struct evhttp_request *req, srv *s) {
    (void)s;
    send_json(req, 200, json_pack("{s:s}", "status", "ok"));
}

static void h_models(struct evhttp_request *req, srv *s) {
    if (!check_auth(s, req)) return;
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", s->o->model_name, "object", "model", "created",
                          (json_int_t)time(NULL), "owned_by", "m3", "max_model_len", m3_engine_max_model_len(s->e));
    send_json(req, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

static void h_tokenize(struct evhttp_request *req, srv *s) {
    if (!check_auth(s, req)) return;
    json_t *b = read_body(req);
    if (!b) return;
    int32_t *ids = NULL;
    size_t n = 0;
    json_t *p = json_object_get(b, "prompt");
    if (json_is_string(p)) {
        int sp = 1;
        json_t *x = json_object_get(b, "add_special_tokens");
        (void)x;
        if (encode_text(s, req, json_string_value(p), json_string_length(p), sp, &ids, &n)) goto out;
    } else if (json_object_get(b, "messages")) {
        if (chat_prompt(s, req, b, &ids, &n)) goto out;
    } else { BAD(req, "give 'prompt' (a string) or 'messages'"); goto out; }
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    send_json(req, 200, json_pack("{s:i,s:i,s:o}", "count", (int)n, "max_model_len", m3_engine_max_model_len(s->e),
                                  "tokens", a));
out:
    free(ids);
    json_decref(b);
}

static void h_detokenize(struct evhttp_request *req, srv *s) {
    if (!check_auth(s, req)) return;
    json_t *b = read_body(req);
    if (!b) return;
    json_t *t = json_object_get(b, "tokens");
    int32_t *ids = NULL;
    size_t n = 0;
    if (!json_is_array(t)) { BAD(req, "'tokens' must be an array of token ids"); goto out; }
    if (json_array_size(t) && ids_from_json(req, t, m3_tok_n_vocab(s->tok), &ids, &n)) goto out;
    m3_err err;
    size_t len;
    char *text = m3_tok_decode(s->tok, ids, n, 0, &len, &err);
    if (!text) { BAD(req, "%s", err.msg); goto out; }
    json_t *j = json_pack("{s:s%}", "prompt", text, len);
    free(text);
    if (!j) j = json_pack("{s:s}", "prompt", "");
    send_json(req, 200, j);
out:
    free(ids);
    json_decref(b);
}

static void h_generate(struct evhttp_request *req, srv *s, int chat) {
    if (!check_auth(s, req)) return;
    json_t *b = read_body(req);
    if (!b) return;
    int32_t *ids = NULL, *stop_ids = NULL;
    size_t n = 0, n_stop_ids = 0;
    const char **stop_strs = NULL;
    size_t n_stop_strs = 0;
    sreq *r = NULL;
    m3_err err;

    json_t *model = json_object_get(b, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) { BAD(req, "'model' must be a string"); goto out; }
        if (strcmp(json_string_value(model), s->o->model_name)) {
            send_error(req, 404, "not_found_error", "the model '%s' does not exist", json_string_value(model));
            goto out;
        }
    }
    json_t *nn = json_object_get(b, "n");
    if (nn && !json_is_null(nn) && !(json_is_integer(nn) && json_integer_value(nn) == 1)) { BAD(req, "only n = 1 is supported"); goto out; }
    if (chat) {
        if (chat_prompt(s, req, b, &ids, &n)) goto out;
    } else {
        json_t *p = json_object_get(b, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
        if (json_is_array(p) && json_array_size(p) == 1 && json_is_array(json_array_get(p, 0))) p = json_array_get(p, 0);
        if (json_is_string(p)) {
            if (encode_text(s, req, json_string_value(p), json_string_length(p), 1, &ids, &n)) goto out;
        } else if (json_is_array(p)) {
            if (ids_from_json(req, p, s->vocab, &ids, &n)) goto out;
        } else { BAD(req, "'prompt' must be a string or an array of token ids"); goto out; }
    }
    if (!n) { BAD(req, "the prompt is empty"); goto out; }
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= s->vocab) { BAD(req, "prompt token %d is outside the model's vocabulary (%d)", ids[i], s->vocab); goto out; }

    double temperature = 1.0, top_p = 1.0, min_p = 0, pp = 0, fp = 0, rp = 0;
    long long top_k = 0, seed = -1, max_tokens = -1;
    if (get_num(req, b, "temperature", 0, 2, &temperature) || get_num(req, b, "top_p", 0, 1, &top_p) ||
        get_num(req, b, "min_p", 0, 1, &min_p) || get_num(req, b, "presence_penalty", -2, 2, &pp) ||
        get_num(req, b, "frequency_penalty", -2, 2, &fp) || get_num(req, b, "repetition_penalty", 0, 100, &rp) ||
        get_int(req, b, "top_k", -1, 1 << 30, &top_k) || get_int(req, b, "seed", INT64_MIN, INT64_MAX, &seed) ||
        get_int(req, b, "max_tokens", 1, 1 << 30, &max_tokens) ||
        get_int(req, b, "max_completion_tokens", 1, 1 << 30, &max_tokens))
        goto out;
    int mml = m3_engine_max_model_len(s->e);
    if ((int)n >= mml) { BAD(req, "the prompt has %zu tokens; this model's context is %d tokens", n, mml); goto out; }
    if (max_tokens < 0) max_tokens = chat ? mml - (long long)n : 16;
    if (max_tokens > mml - (long long)n) max_tokens = mml - (long long)n;

    /* stop strings, stop_token_ids */
    json_t *st = json_object_get(b, "stop");
    if (json_is_string(st)) {
        stop_strs = malloc(sizeof *stop_strs);
        stop_strs[n_stop_strs++] = json_string_value(st);
    } else if (json_is_array(st)) {
        stop_strs = malloc(sizeof *stop_strs * (json_array_size(st) + 1));
        for (size_t i = 0; i < json_array_size(st); i++) {
            json_t *x = json_array_get(st, i);
            if (!json_is_string(x)) { BAD(req, "'stop' must be a string or an array of strings"); goto out; }
            if (json_string_length(x)) stop_strs[n_stop_strs++] = json_string_value(x);
        }
    } else if (st && !json_is_null(st)) { BAD(req, "'stop' must be a string or an array of strings"); goto out; }
    if (json_is_string(st) && !json_string_length(st)) n_stop_strs = 0;
    json_t *sti = json_object_get(b, "stop_token_ids");
    if (sti && !json_is_null(sti)) {
        if (!json_is_array(sti)) { BAD(req, "'stop_token_ids' must be an array"); goto out; }
        if (json_array_size(sti) && ids_from_json(req, sti, s->vocab, &stop_ids, &n_stop_ids)) goto out;
    }
    int32_t tok_eos = m3_tok_eos_id(s->tok);
    if (tok_eos >= 0 && tok_eos < s->vocab) {
        int32_t *ns = realloc(stop_ids, (n_stop_ids + 1) * sizeof *ns);
        if (ns) { stop_ids = ns; stop_ids[n_stop_ids++] = tok_eos; }
    }

    r = calloc(1, sizeof *r);
    if (!r) { send_error(req, 500, "server_error", "out of memory"); goto out; }
    r->s = s;
    r->req = req;
    r->conn = evhttp_request_get_connection(req);
    r->chat = chat;
    r->serial = ++s->serial;
    r->created = (long)time(NULL);
    r->n_prompt = (int)n;
    json_t *stream = json_object_get(b, "stream");
    r->stream = json_is_true(stream);
    json_t *so = json_object_get(b, "stream_options");
    r->include_usage = json_is_object(so) && json_is_true(json_object_get(so, "include_usage"));
    if (!(r->ts = m3_tok_stream_new(s->tok, 1, &err))) { send_error(req, 500, "server_error", "%s", err.msg); goto out; }
    if (n_stop_strs && !(r->stop = m3_stop_create(stop_strs, (int)n_stop_strs, NULL, 0, &err))) { BAD(req, "%s", err.msg); goto out; }
    if (chat) {
        m3_out_opts oo = {s->reasoning_parser, M3_THINK_ENABLED, s->tool_parser, NULL};
        json_t *kw = json_object_get(b, "chat_template_kwargs");
        const char *tm = json_string_value(json_object_get(kw, "thinking_mode"));
        if (tm && !strcmp(tm, "disabled")) oo.thinking = M3_THINK_DISABLED;
        else if (tm && !strcmp(tm, "adaptive")) oo.thinking = M3_THINK_ADAPTIVE;
        json_t *et = json_object_get(kw, "enable_thinking");
        if (json_is_false(et)) oo.thinking = M3_THINK_DISABLED;
        json_t *tools = json_object_get(b, "tools");
        if (!json_is_array(tools)) tools = NULL;
        if (!(r->out = m3_out_new(&oo, tools, &err))) { BAD(req, "%s", err.msg); goto out; }
    }

    m3_engine_request er = {0};
    er.prompt = ids;
    er.n_prompt = (int)n;
    er.sampling.temperature = (float)temperature;
    er.sampling.top_p = (float)top_p;
    er.sampling.top_k = (int)top_k;
    er.sampling.min_p = (float)min_p;
    er.sampling.presence_penalty = (float)pp;
    er.sampling.frequency_penalty = (float)fp;
    er.sampling.repetition_penalty = (float)rp;
    er.sampling.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) * 6364136223846793005ull + ++s->seed_ctr;
    er.max_tokens = (int)max_tokens;
    er.stop_ids = stop_ids;
    er.n_stop_ids = (int)n_stop_ids;
    json_t *ie = json_object_get(b, "ignore_eos");
    er.ignore_eos = json_is_true(ie);
    er.on_token = on_token;
    er.arg = r;
    r->id = m3_engine_add(s->e, &er, &err);
    if (!r->id) { BAD(req, "%s", err.msg); goto out; }
    if (r->stream) {
        struct evkeyvalq *h = evhttp_request_get_output_headers(req);
        evhttp_add_header(h, "Content-Type", "text/event-stream");
        evhttp_add_header(h, "Cache-Control", "no-cache");
        evhttp_send_reply_start(req, 200, "OK");
        if (chat) { /* first chunk: the role */
            json_t *c = chunk_base(r);
            json_object_set_new(c, "choices", json_pack("[{s:i,s:{s:s,s:s},s:n,s:n}]", "index", 0, "delta", "role",
                                                        "assistant", "content", "", "logprobs", "finish_reason"));
            sse_send(r, c);
        }
    }
    evhttp_connection_set_closecb(r->conn, conn_closed, r);
    r->next = s->active;
    if (s->active) s->active->prev = r;
    s->active = r;
    r = NULL; /* owned by the queue now */
out:
    sreq_free(r);
    free(ids);
    free(stop_ids);
    free(stop_strs);
    json_decref(b);
}

static void route(struct evhttp_request *req, void *arg) {
    srv *s = arg;
    const char *uri = evhttp_request_get_uri(req);
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    char path[256];
    size_t i = 0;
    for (; uri[i] && uri[i] != '?' && i + 1 < sizeof path; i++) path[i] = uri[i];
    path[i] = 0;
    double t0 = now_s();
    int get = cmd == EVHTTP_REQ_GET, post = cmd == EVHTTP_REQ_POST;
    if (!strcmp(path, "/health")) { if (get) h_health(req, s); else goto method; }
    else if (!strcmp(path, "/v1/models")) { if (get) h_models(req, s); else goto method; }
    else if (!strcmp(path, "/tokenize")) { if (post) h_tokenize(req, s); else goto method; }
    else if (!strcmp(path, "/detokenize")) { if (post) h_detokenize(req, s); else goto method; }
    else if (!strcmp(path, "/v1/completions")) { if (post) h_generate(req, s, 0); else goto method; }
    else if (!strcmp(path, "/v1/chat/completions")) { if (post) h_generate(req, s, 1); else goto method; }
    else send_error(req, 404, "not_found_error", "no route for %s", path);
    (void)t0;
    return;
method:
    send_error(req, 405, "invalid_request_error", "method not allowed for %s", path);
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    (void)sig; (void)what;
    srv *s = arg;
    event_base_loopbreak(s->base);
}

int m3_server_run(m3_engine *e, const m3_tok *tok, const m3_chat *chat, int vocab, const m3_server_opts *o, m3_err *err) {
    srv s;
    memset(&s, 0, sizeof s);
    s.e = e; s.tok = tok; s.chat = chat; s.vocab = vocab; s.o = o;
    const char *src = chat ? m3_chat_source(chat) : NULL;
    s.reasoning_parser = src && strstr(src, "mm:think") != NULL;
    s.tool_parser = src && strstr(src, "minimax[>[") != NULL;
    pthread_mutex_init(&s.mu, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (evthread_use_pthreads()) return m3_errf(err, "evthread_use_pthreads failed");
    s.base = event_base_new();
    if (!s.base) return m3_errf(err, "event_base_new failed");
    struct evhttp *http = evhttp_new(s.base);
    evhttp_set_max_body_size(http, o->max_body ? (ev_ssize_t)o->max_body : 32 << 20);
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_gencb(http, route, &s);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(http, o->host, (ev_uint16_t)o->port);
    if (!bs) {
        evhttp_free(http);
        event_base_free(s.base);
        return m3_errf(err, "cannot listen on %s:%d", o->host, o->port);
    }
    int port = o->port;
    {
        struct sockaddr_storage ss;
        ev_socklen_t sl = sizeof ss;
        if (!getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl)) {
            if (ss.ss_family == AF_INET) port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            else if (ss.ss_family == AF_INET6) port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    s.notify = event_new(s.base, -1, EV_PERSIST | EV_READ, notify_cb, &s);
    s.sigint = evsignal_new(s.base, SIGINT, on_signal, &s);
    s.sigterm = evsignal_new(s.base, SIGTERM, on_signal, &s);
    event_add(s.sigint, NULL);
    event_add(s.sigterm, NULL);
    s.peek = event_new(s.base, -1, EV_PERSIST, peek_cb, &s);
    struct timeval tv = {0, 200000};
    event_add(s.peek, &tv);
    pthread_t th;
    if (pthread_create(&th, NULL, engine_main, &s)) {
        evhttp_free(http);
        event_base_free(s.base);
        return m3_errf(err, "cannot start the engine thread");
    }
    fprintf(stderr, "m3 serve: listening on http://%s:%d (model '%s', context %d tokens, KV capacity %d tokens)\n",
            o->host, port, o->model_name, m3_engine_max_model_len(e), m3_engine_capacity_tokens(e));
    fflush(stderr);
    event_base_dispatch(s.base);
    fprintf(stderr, "m3 serve: shutting down\n");
    s.stop_engine = 1;
    pthread_join(th, NULL);
    evhttp_free(http);
    event_free(s.notify);
    event_free(s.sigint);
    event_free(s.sigterm);
    event_free(s.peek);
    event_base_free(s.base);
    free(s.q); /* requests still in flight are dropped (process exit) */
    pthread_mutex_destroy(&s.mu);
    return 0;
}
