/* m3 serve: HTTP plumbing, routing, the small endpoints, the engine thread and shutdown.
 * Generation lives in generate.c, metrics in metrics.c; see server.h and srv.h. */
#include "srv.h"
#include "anthropic.h"
#include "resp_store.h"
#include "../base/fault.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <errno.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/thread.h>

void m3_server_opts_default(m3_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->max_body = (size_t)32 << 20;
    o->max_waiting = 1024;
    o->shutdown_timeout = 30;
    o->eos_id = -1;
    o->reasoning_budget = -1;
    o->log_requests = 1;
    o->max_header_bytes = 64 << 10;
    o->timeout = 60;
    o->max_image_memory = (size_t)2 << 30;
    o->responses_store = (size_t)256 << 20;
    o->max_connections = 1024;
}

void srv_random_hex(char *out, size_t cap) {
    unsigned char r[32];
    size_t n = (cap - 1) / 2 + 1;
    if (n > sizeof r) n = sizeof r;
    if (getrandom(r, n, GRND_NONBLOCK) != (ssize_t)n) { /* no entropy yet: the clock and a counter */
        static atomic_ulong ctr;
        uint64_t x = (uint64_t)(m3_now() * 1e9) ^ (atomic_fetch_add(&ctr, 1) * 0x9e3779b97f4a7c15ull);
        for (size_t i = 0; i < n; i++) { x = x * 6364136223846793005ull + 1442695040888963407ull; r[i] = (unsigned char)(x >> 56); }
    }
    static const char hx[] = "0123456789abcdef";
    size_t k = 0;
    for (size_t i = 0; k + 1 < cap && i < n; i++) {
        out[k++] = hx[r[i] >> 4];
        if (k + 1 < cap) out[k++] = hx[r[i] & 15];
    }
    out[k] = 0;
}

/* ------------------------------------------------------------------ replies */

/* jansson's json_dumps grows its buffer while it writes and ignores a failed write of an object
 * key (dump.c: dump_string's result is not checked), so under memory pressure it can return
 * well-formed-looking text with a key missing. Sizing first (json_dumpb with no buffer writes
 * nothing) and then writing into a buffer of that size leaves no allocation inside the dump. */
char *srv_json_text(const json_t *j, size_t *len) {
    if (!j) return NULL;
    size_t n = json_dumpb(j, NULL, 0, JSON_COMPACT);
    char *s = n ? m3_fault_malloc(M3_FAULT_SERVER, n + 1) : NULL;
    if (!s) return NULL;
    if (json_dumpb(j, s, n, JSON_COMPACT) != n) { /* cannot change between the two calls but for a failure */
        free(s);
        return NULL;
    }
    s[n] = 0;
    if (len) *len = n;
    return s;
}

static void free_text(const void *data, size_t len, void *arg) {
    (void)data; (void)len;
    free(arg);
}

int srv_send_text(http_req *req, int code, char *text, size_t len) {
    struct evbuffer *b = evbuffer_new();
    /* by reference: a 20 MB answer is not copied on the loop; the buffer frees it once written */
    if (!b || evbuffer_add_reference(b, text, len, free_text, text)) {
        if (b) evbuffer_free(b);
        else free(text);
        return srv_send_error(req, 500, "server_error", "out of memory");
    }
    http_reply(req, code, "application/json", b);
    evbuffer_free(b);
    return code;
}

int srv_send_json(http_req *req, int code, json_t *j) {
    char *s = srv_json_text(j, NULL);
    json_decref(j);
    if (!s) return srv_send_error(req, 500, "server_error", "out of memory");
    struct evbuffer *b = evbuffer_new();
    if (!b) { /* out of memory: a bare status is all that can be said */
        free(s);
        http_reply(req, 500, NULL, NULL);
        return 500;
    }
    evbuffer_add(b, s, strlen(s));
    free(s);
    http_reply(req, code, "application/json", b);
    evbuffer_free(b);
    return code;
}

size_t srv_error_json(char *buf, size_t cap, int code, const char *type, const char *param, const char *msg) {
    return srv_error_json_code(buf, cap, code, NULL, type, param, msg);
}

size_t srv_error_json_code(char *buf, size_t cap, int code, const char *scode, const char *type, const char *param,
                           const char *msg) {
    size_t n = 0;
    if (!cap) return 0;
#define PUT(c) do { if (n + 1 < cap) buf[n++] = (c); } while (0)
#define PUTS(str) do { for (const char *q_ = (str); *q_; q_++) PUT(*q_); } while (0)
#define PUTQ(str) /* a JSON string */                                                   \
    do {                                                                             \
        PUT('"');                                                                    \
        for (const unsigned char *q_ = (const unsigned char *)(str); *q_; q_++) {    \
            if (*q_ == '"' || *q_ == '\\') { PUT('\\'); PUT((char)*q_); }            \
            else if (*q_ < 0x20) { char u_[8]; snprintf(u_, sizeof u_, "\\u%04x", *q_); PUTS(u_); } \
            else PUT((char)*q_);                                                     \
        }                                                                            \
        PUT('"');                                                                    \
    } while (0)
    PUTS("{\"error\":{\"message\":");
    PUTQ(msg ? msg : "");
    PUTS(",\"type\":");
    PUTQ(type ? type : "server_error");
    PUTS(",\"param\":");
    if (param && *param) PUTQ(param);
    else PUTS("null");
    char tail[32];
    snprintf(tail, sizeof tail, ",\"code\":%d}}", code);
    if (scode) {
        PUTS(",\"code\":");
        PUTQ(scode);
        PUTS("}}");
    } else PUTS(tail);
#undef PUTQ
#undef PUTS
#undef PUT
    buf[n] = 0;
    return n;
}

/* Errors in OpenAI's shape, {"error": {"message", "type", "param", "code"}} (code: the HTTP
 * status, as vLLM sends it), written without jansson so that they go out when memory is short. */
int srv_send_oai(http_req *req, const m3_oai_error *e) {
    char body[4096];
    /* the endpoints of Anthropic's API answer in its shape (the type follows from the status) */
    size_t n = srv_api_anthropic(req) ? m3_anth_error_json(body, sizeof body, e->status, e->message)
                                      : srv_error_json_code(body, sizeof body, e->status, e->code, e->type, e->param, e->message);
    struct evbuffer *b = evbuffer_new();
    if (b && !evbuffer_add(b, body, n)) http_reply(req, e->status, "application/json", b);
    else http_reply(req, e->status, NULL, NULL);
    if (b) evbuffer_free(b);
    return e->status;
}

int srv_send_error(http_req *req, int code, const char *type, const char *fmt, ...) {
    m3_oai_error e;
    va_list ap;
    va_start(ap, fmt);
    m3_oai_verrorf(&e, code, type, NULL, fmt, ap);
    va_end(ap);
    return srv_send_oai(req, &e);
}

/* 0 when the field `name` (one such field, nothing after its value, not even whitespace; a NUL or
 * another control byte never gets here: http_parse refuses it) holds prefix + key exactly.
 * Compared in time that does not depend on where the first difference is. */
static unsigned key_diff(http_req *req, const char *name, const char *prefix, const char *key) {
    int count = 0;
    const http_field *f = http_field_of(req, name, &count);
    size_t kl = strlen(key), pl = strlen(prefix);
    const char *given = "";
    size_t gl = 0;
    if (f && count == 1 && !f->trailing_ws && f->len >= pl && !strncmp(f->value, prefix, pl)) {
        given = f->value + pl;
        gl = f->len - pl;
    }
    unsigned diff = (unsigned)(gl != kl);
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < gl ? given[i] : 0);
    return diff | (unsigned)!f;
}

/* The key exactly as configured, as OpenAI's clients send it ("Authorization: Bearer KEY") or
 * Anthropic's ("x-api-key: KEY"): either field holding it lets the request in. */
int srv_check_auth(srv *s, http_req *req) {
    if (!s->o->api_key) return 0;
    unsigned bearer = key_diff(req, "Authorization", "Bearer ", s->o->api_key);
    unsigned xkey = key_diff(req, "x-api-key", "", s->o->api_key);
    if (!bearer || !xkey) return 0;
    return srv_send_error(req, 401, "authentication_error", "invalid or missing API key");
}

void srv_log(srv *s, unsigned long serial, const char *what, int status, int prompt, int completion, double ttft,
             double total) {
    if (!s->o->log_requests) return;
    char pt[24] = "-", ct[24] = "-", tt[32] = "-";
    if (prompt >= 0) snprintf(pt, sizeof pt, "%d", prompt);
    if (completion >= 0) snprintf(ct, sizeof ct, "%d", completion);
    if (ttft >= 0) snprintf(tt, sizeof tt, "%.1fms", ttft * 1e3);
    fprintf(stderr, "m3 serve: req %lu %s %d prompt_tokens=%s completion_tokens=%s ttft=%s total=%.1fms\n", serial, what,
            status, pt, ct, tt, total * 1e3);
}

/* ------------------------------------------------------------------ engine thread */

static void *engine_main(void *arg) {
    srv *s = arg;
    m3_err err;
    while (!atomic_load(&s->stop_engine)) {
        if (!m3_engine_has_work(s->e)) { m3_engine_wait_work(s->e, 100); continue; }
        if (m3_engine_step(s->e, &err) >= 0) continue;
        /* every failed step is logged, with its shape and the backend's message (the engine has
         * run the step's requests again one at a time: see m3_engine_step) */
        fprintf(stderr, "m3 serve: step failed: %s\n", err.msg);
        if (m3_engine_dead(s->e) && !atomic_exchange(&s->engine_dead, 1)) {
            fprintf(stderr, "m3 serve: FATAL: %s; every request in flight ended with this error; the server stops\n",
                    m3_engine_dead(s->e));
            event_active(s->dead_ev, EV_READ, 0);
        }
    }
    return NULL;
}

/* Engine thread: queues one record for the HTTP thread. A token record that finds no memory
 * is dropped and its choice marked lost (the response then ends with an error rather than
 * with a gap); a final record never is: it waits in its choice (srv.fin), which needs no
 * allocation. */
void srv_push(srv *s, const qitem *it) {
    pthread_mutex_lock(&s->mu);
    if (s->qn == s->qcap) {
        size_t nc = s->qcap ? s->qcap * 2 : 256;
        qitem *nq = srv_realloc(s->q, nc * sizeof *nq);
        if (nq) { s->q = nq; s->qcap = nc; }
    }
    if (s->qn < s->qcap) s->q[s->qn++] = *it;
    else if (!it->finished) {
        /* a token the client will not see: its response ends with an error instead
         * (srv_handle_item cancels the request) */
        atomic_store(&it->c->lost, 1);
    } else {
        choice *c = it->c;
        c->fin_reason = it->reason;
        c->fin_has_tok = it->has_tok;
        c->fin_so = it->so;
        c->fin_next = s->fin;
        s->fin = c;
    }
    pthread_mutex_unlock(&s->mu);
    event_active(s->notify, EV_READ, 0);
}

static void notify_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        qitem *q = s->q;
        size_t n = s->qn;
        choice *fin = s->fin;
        s->q = NULL;
        s->qn = s->qcap = 0;
        s->fin = NULL;
        pthread_mutex_unlock(&s->mu);
        if (!n && !fin) { free(q); return; }
        for (size_t i = 0; i < n; i++) srv_handle_item(s, &q[i]);
        free(q);
        /* a choice's records all precede its final one, so the fallback list goes last */
        while (fin) {
            choice *c = fin;
            fin = c->fin_next;
            qitem it = {c, c->fin_so, c->fin_has_tok, 1, c->fin_reason, 0};
            srv_handle_item(s, &it);
        }
    }
}

/* ------------------------------------------------------------------ small endpoints */

static int h_health(http_req *req, srv *s) {
    const char *dead = atomic_load(&s->engine_dead) ? m3_engine_dead(s->e) : NULL;
    if (dead) return srv_send_error(req, 503, "service_unavailable_error", "the engine has stopped: %s", dead);
    return srv_send_json(req, 200, json_pack("{s:s}", "status", "ok"));
}

static int h_metrics(http_req *req, srv *s) {
    m3_engine_stats st;
    m3_engine_get_stats(s->e, &st);
    m3_metrics_info info = {.model_name = s->o->model_name, .capacity_tokens = m3_engine_capacity_tokens(s->e),
                            .max_model_len = m3_engine_max_model_len(s->e), .kv_bytes_per_token = s->o->kv_bytes_per_token,
                            .max_waiting = s->o->max_waiting, .draining = s->draining, .http_in_flight = s->n_live,
                            .preparing = s->n_prep, .prepared = s->n_prepared};
    http_stats hst;
    http_server_stats(s->http, &hst);
    info.http_connections = hst.connections;
    info.http_refused = hst.refused;
    info.http_slow_requests = hst.slow_requests;
    info.http_write_timeouts = hst.write_timeouts;
    info.http_turned_away = hst.turned_away;
    info.http_accept_pauses = hst.accept_pauses;
    info.http_accept_resumes = hst.accept_resumes;
    if (s->store) {
        m3_resp_store_stats rs;
        m3_resp_store_get_stats(s->store, &rs);
        info.responses_store = 1;
        info.responses_stored = rs.n;
        info.responses_evicted = rs.evicted;
        info.responses_bytes = rs.bytes;
        info.responses_cap = rs.cap;
    }
    info.fault_armed = s->o->fault_spec != NULL;
    for (int i = 0; i < M3_FAULT_NMOD; i++) {
        info.fault_injected[i] = m3_fault_failed((m3_fault_module)i);
        info.fault_seen[i] = m3_fault_seen((m3_fault_module)i);
    }
    size_t len;
    char *text = m3_metrics_render(&s->m, &st, &info, &len);
    struct evbuffer *b = text ? evbuffer_new() : NULL;
    if (!b) { free(text); return srv_send_error(req, 500, "server_error", "out of memory"); }
    evbuffer_add(b, text, len);
    free(text);
    http_reply(req, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    evbuffer_free(b);
    return 200;
}

static int h_models(http_req *req, srv *s, const char *raw_id) {
    int rc = srv_check_auth(s, req);
    if (rc) return rc;
    char *id = raw_id ? evhttp_decode_uri(raw_id) : NULL; /* /v1/models/org%2Fname too */
    if (raw_id && !id) return srv_send_error(req, 500, "server_error", "out of memory");
    const char *one_name[2] = {s->o->model_name, NULL};
    const char *const *names = s->o->model_names ? s->o->model_names : one_name;
    json_t *data = json_array();
    int found = 0;
    for (const char *const *n = names; data && *n; n++) {
        if (id && strcmp(id, *n)) continue;
        found = 1;
        json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:s,s:i}", "id", *n, "object", "model", "created", (json_int_t)time(NULL),
                              "owned_by", "m3", "root", s->o->model_name, "max_model_len", m3_engine_max_model_len(s->e));
        if (!m || json_array_append_new(data, m)) { json_decref(data); data = NULL; }
        if (id) break;
    }
    if (id && !found) {
        rc = srv_send_error(req, 404, "not_found_error", "the model '%.200s' does not exist", id);
        free(id);
        json_decref(data);
        return rc;
    }
    if (!data) { free(id); return srv_send_error(req, 500, "server_error", "out of memory"); }
    if (id) {
        free(id);
        json_t *m = json_incref(json_array_get(data, 0));
        json_decref(data);
        return srv_send_json(req, 200, m);
    }
    return srv_send_json(req, 200, json_pack("{s:s,s:o}", "object", "list", "data", data));
}

/* ------------------------------------------------------------------ routing */

/* CORS (--allowed-origins): the answer to a request from an allowed origin says so; a preflight
 * (OPTIONS with Access-Control-Request-Method) is answered 204 with what may follow. Returns 1
 * when req was such a preflight (answered). */
static int cors(srv *s, http_req *req, const char *method, int *status) {
    const char *origin = http_header(req, "Origin");
    if (!s->o->allowed_origins || !origin) return 0;
    int any = 0, ok = 0;
    for (const char *const *o = s->o->allowed_origins; *o; o++) {
        if (!strcmp(*o, "*")) any = 1;
        else if (!strcmp(*o, origin)) ok = 1;
    }
    if (!any && !ok) return 0; /* no header: the browser refuses the answer to the page */
    http_add_header(req, "Access-Control-Allow-Origin", ok ? origin : "*");
    if (ok) http_add_header(req, "Vary", "Origin");
    http_add_header(req, "Access-Control-Expose-Headers", "X-Request-Id");
    if (strcmp(method, "OPTIONS") || !http_header(req, "Access-Control-Request-Method")) return 0;
    const char *hd = http_header(req, "Access-Control-Request-Headers");
    http_add_header(req, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    http_add_header(req, "Access-Control-Allow-Headers", hd && *hd ? hd : "Authorization, Content-Type, X-Request-Id");
    http_add_header(req, "Access-Control-Max-Age", "600");
    http_reply(req, 204, NULL, NULL);
    *status = 204;
    return 1;
}

const char *srv_request_id(http_req *req) {
    const char *xr = http_header(req, "X-Request-Id");
    int ok = xr && *xr && strlen(xr) <= 128;
    for (const char *q = xr; ok && *q; q++) ok = *q > 0x20 && *q < 0x7f;
    return ok ? xr : NULL;
}

static void route(http_req *req, void *arg) {
    srv *s = arg;
    double t0 = m3_now();
    unsigned long serial = ++s->serial;
    const char *uri = http_target(req), *method = http_method(req);
    char path[256], what[300];
    size_t i = 0;
    for (; uri[i] && uri[i] != '?' && i + 1 < sizeof path; i++) path[i] = uri[i];
    path[i] = 0;
    snprintf(what, sizeof what, "%.40s %s", method, path);
    { /* X-Request-Id: the client's (printable, up to 128 bytes), else a new one, on every answer */
        const char *xr = srv_request_id(req);
        char gen[33];
        if (!xr) { srv_random_hex(gen, sizeof gen); xr = gen; }
        http_add_header(req, "X-Request-Id", xr);
    }
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    static const char *const known[] = {"/health", "/metrics", "/v1/models", "/tokenize", "/detokenize",
                                        "/v1/completions", "/v1/chat/completions", "/version", "/v1/messages",
                                        "/v1/messages/count_tokens", "/v1/responses", "/invocations"};
    enum { K_STORED = 100 }; /* GET / DELETE /v1/responses/{id}[/input_items] */
    int k = -1;
    for (int j = 0; j < (int)(sizeof known / sizeof *known); j++)
        if (!strcmp(path, known[j])) k = j;
    const int ping = !strcmp(path, "/ping"); /* vLLM's (SageMaker's) health check, GET or POST */
    if (ping) k = 0;
    const char *model_id = NULL; /* GET /v1/models/{id} */
    if (k < 0 && !strncmp(path, "/v1/models/", 11) && path[11]) {
        k = 2;
        model_id = path + 11;
    }
    char resp_id[160] = ""; /* GET / DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items */
    int resp_items = 0;
    if (k < 0 && !strncmp(path, "/v1/responses/", 14) && path[14]) {
        const char *id = path + 14, *sl = strchr(id, '/');
        resp_items = sl && !strcmp(sl, "/input_items");
        size_t n = sl ? (size_t)(sl - id) : strlen(id);
        if ((!sl || resp_items) && n && n < sizeof resp_id) {
            k = K_STORED;
            memcpy(resp_id, id, n);
            resp_id[n] = 0;
        }
    }
    int want_get = (k >= 0 && k <= 2) || k == 7, del = !strcmp(method, "DELETE");
    int rc;
    if (cors(s, req, method, &rc)) {
        /* a preflight: answered */
    } else if (!strcmp(method, "CONNECT") || !strcmp(method, "TRACE")) { /* never served; the connection closes */
        http_close_after(req);
        rc = srv_send_error(req, 405, "invalid_request_error", "method %s is not served", method);
    } else if (s->draining && k != 1) { /* /metrics stays up for whoever watches the drain */
        http_close_after(req);
        rc = srv_send_error(req, 503, "service_unavailable_error", M3_SERVER_SHUTTING_DOWN);
    } else if (k < 0) rc = srv_send_error(req, 404, "not_found_error", "no route for %s", path);
    else if (k == K_STORED ? !get && (!del || resp_items) : want_get ? !get && !(ping && post) : !post)
        rc = srv_send_error(req, 405, "invalid_request_error", "method %.40s not allowed for %s (use %s)", method, path,
                            k == K_STORED ? resp_items ? "GET" : "GET or DELETE" : ping ? "GET or POST" : want_get ? "GET" : "POST");
    else switch (k) {
        case 0: rc = h_health(req, s); break;
        case 1: rc = h_metrics(req, s); break;
        case 2: rc = h_models(req, s, model_id); break;
        case 7: rc = srv_send_json(req, 200, json_pack("{s:s}", "version", M3_VERSION)); break;
        case K_STORED: /* the items' stored text is parsed on a preparation thread (prep.c) */
            if (!resp_items) rc = srv_resp_stored(s, req, resp_id, del);
            else if ((rc = srv_check_auth(s, req))) {
            } else if (s->store && srv_resp_in_flight(s, resp_id))
                rc = srv_send_error(req, 404, "not_found_error",
                                    "response '%s' is still being generated: its input items are listed once it is stored", resp_id);
            else rc = srv_prep_submit(s, req, SRV_PREP_INPUT_ITEMS, serial, t0);
            break;
        default: /* the rest of the work on a preparation thread (prep.c): the loop goes on */
            rc = srv_check_auth(s, req);
            if (!rc) rc = srv_prep_submit(s, req, k == 3 ? SRV_PREP_TOKENIZE : k == 4 ? SRV_PREP_DETOKENIZE
                                                     : k == 6 ? SRV_PREP_CHAT : k == 8 ? SRV_PREP_MESSAGES
                                                     : k == 9 ? SRV_PREP_COUNT_TOKENS : k == 10 ? SRV_PREP_RESPONSES
                                                     : k == 11 ? SRV_PREP_INVOCATIONS : SRV_PREP_COMPLETION, serial, t0);
            break;
        }
    if (rc == 0) return; /* handed to a preparation thread: answered (counted and logged) from there */
    m3_metrics_http(&s->m, rc);
    srv_log(s, serial, what, rc, -1, -1, -1, m3_now() - t0);
}

/* the errors the HTTP layer answers itself (malformed requests, limits), in OpenAI's shape, or
 * Anthropic's for its endpoints (a body over --max-body to /v1/messages) */
static size_t http_error_body(char *buf, size_t cap, int status, const char *msg, const char *target) {
    if (target && srv_path_anthropic(target)) return m3_anth_error_json(buf, cap, status, msg);
    return srv_error_json(buf, cap, status, status == 408 || status >= 500 ? "server_error" : "invalid_request_error", NULL, msg);
}

/* ------------------------------------------------------------------ shutdown */

static void exit_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    srv *s = arg;
    event_base_loopbreak(s->base);
}

static void exit_wait_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    srv_maybe_exit(arg);
}

/* the HTTP layer: a connection's first request came or the client went, or a reply was written;
 * a stopping server waiting for them looks again once the loop is back (a request handled by then) */
static void exit_recheck(void *arg) {
    srv *s = arg;
    if (!s->draining || !s->exit_wait || !evtimer_pending(s->exit_wait, NULL)) return;
    struct timeval now = {0, 0};
    evtimer_add(s->exit_wait, &now);
}

/* wait (exit_wait) from now until t; 0 where the timer cannot be armed */
static int wait_until(srv *s, double now, double t) {
    const double left = t > now ? t - now : 0;
    struct timeval dl = {(time_t)left, (suseconds_t)((left - (double)(time_t)left) * 1e6)};
    return !evtimer_add(s->exit_wait, &dl);
}

void srv_maybe_exit(srv *s) {
    if (!s->draining || s->n_live || s->n_prep) return;
    /* every generation response is written (hreqs live until then). Clients that connected (or
     * were taken from the listen queue at the stop) and have not sent a request yet get their
     * 503 first: the exit waits until each has sent one or gone (first_done), for at most
     * SRV_FIRST_WAIT s after the stop (a silent client does not hold the exit). Then the small
     * replies (503s, /metrics) still in the HTTP layer's buffers go out: the exit waits until
     * each is written or its connection closed (sent_done), for at most SRV_SEND_WAIT s (a client
     * that does not read does not hold it); not when cancelling (a second signal, the drain
     * deadline: exit at once). A timer that cannot be armed: exit now. */
    http_stats st;
    http_server_stats(s->http, &st);
    const double now = m3_now();
    if (st.awaiting_first > 0 && !s->cancelling && now < s->drain_t0 + SRV_FIRST_WAIT &&
        wait_until(s, now, s->drain_t0 + SRV_FIRST_WAIT))
        return; /* (again: the same deadline) */
    if (st.sending > 0 && !s->cancelling) {
        if (!s->send_dl) s->send_dl = now + SRV_SEND_WAIT;
        if (now < s->send_dl && wait_until(s, now, s->send_dl)) return;
    }
    evtimer_del(s->exit_wait);
    struct timeval tv = {0, 0};
    event_base_once(s->base, -1, EV_TIMEOUT, exit_cb, s, &tv);
}

static void hard_stop_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    srv *s = arg;
    fprintf(stderr, "m3 serve: %d requests still not finished after cancelling; exiting anyway\n", s->n_live);
    event_base_loopbreak(s->base);
}

static void cancel_now(srv *s) {
    if (s->cancelling) return;
    s->cancelling = 1;
    if (s->n_live) fprintf(stderr, "m3 serve: cancelling %d requests still in flight\n", s->n_live);
    srv_cancel_all(s);
    /* the engine answers cancellations at its next step; this is for a stuck client socket */
    struct timeval tv = {10, 0};
    event_add(s->hard_stop, &tv);
    srv_maybe_exit(s);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    cancel_now(arg);
}

/* The engine's device failed: every request has ended with the error (their responses are
 * being written); the listener closes and the server exits once they are out. */
static void dead_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    srv *s = arg;
    if (s->draining) return;
    s->draining = 1;
    s->drain_t0 = m3_now();
    http_server_stop_listening(s->http);
    fprintf(stderr, "m3 serve: the engine stopped; %d responses still being written\n", s->n_live);
    srv_maybe_exit(s);
}

/* SIGINT / SIGTERM (sig), or m3_server_shutdown (sig -1) */
static void on_signal(evutil_socket_t sig, short what, void *arg) {
    (void)what;
    srv *s = arg;
    if (s->draining) { /* a second signal: do not wait */
        if (sig < 0) return;
        fprintf(stderr, "m3 serve: second signal\n");
        cancel_now(s);
        return;
    }
    s->draining = 1;
    s->drain_t0 = m3_now();
    http_server_stop_listening(s->http); /* closes the listener: new clients are refused */
    if (sig > 0)
        fprintf(stderr, "m3 serve: %s: shutting down; %d requests in flight get up to %.0f s to finish\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM", s->n_live, s->o->shutdown_timeout);
    if (!s->n_live && !s->n_prep) { srv_maybe_exit(s); return; }
    double t = s->o->shutdown_timeout > 0 ? s->o->shutdown_timeout : 0;
    struct timeval tv = {(time_t)t, (suseconds_t)((t - (double)(time_t)t) * 1e6)};
    event_add(s->deadline, &tv);
}

/* Lifts the soft limit on open files to the hard one: each connection holds one. */
static void raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= rl.rlim_max) return;
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
}

static void peek_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    srv_peek(arg);
}

/* ------------------------------------------------------------------ run */

void m3_server_shutdown(srv *s) { event_active(s->stop_ev, EV_READ, 0); }

static void srv_cleanup(srv *s) {
    srv_prep_stop(s); /* the workers first: a job they hold names an HTTP request */
    if (s->http) http_server_free(s->http); /* closes connections; their close callbacks still see live hreqs */
    srv_free_all(s);
    struct event *ev[] = {s->notify, s->sigint, s->sigterm, s->peek, s->deadline, s->hard_stop, s->dead_ev, s->stop_ev,
                          s->exit_wait};
    for (size_t i = 0; i < sizeof ev / sizeof *ev; i++)
        if (ev[i]) event_free(ev[i]);
    if (s->base) event_base_free(s->base);
    free(s->q);
    free(s->holes);
    srv_grammars_free(s);
    m3_resp_store_free(s->store);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int m3_server_run(m3_engine *e, const m3_tok *tok, const m3_chat *chat, int vocab, const m3_server_opts *o, m3_err *err) {
    srv *s = calloc(1, sizeof *s);
    if (!s) return m3_errf(err, "out of memory");
    s->e = e; s->tok = tok; s->chat = chat; s->vocab = vocab; s->o = o;
    m3_metrics_init(&s->m);
    pthread_mutex_init(&s->mu, NULL);
    if (srv_grammars_init(s) || (o->responses_store && !(s->store = m3_resp_store_new(o->responses_store)))) {
        srv_cleanup(s);
        return m3_errf(err, "out of memory");
    }
    if (s->store) m3_resp_store_set_max_read(s->store, o->max_body); /* what the conversation sent whole could hold */
    /* Checkpoints pad vocab_size past the tokenizer (200,064 rows for ~200,000 tokens): ids no
     * token spells are not text, so no request samples them (sampling masks them) */
    s->n_text = m3_tok_n_vocab(tok) < vocab ? m3_tok_n_vocab(tok) : vocab;
    for (int32_t i = 0, cap = 0; i < s->n_text; i++) {
        if (m3_tok_id_to_token(tok, i)) continue;
        if (s->n_holes == cap) {
            cap = cap ? 2 * cap : 16;
            int32_t *nh = realloc(s->holes, sizeof *nh * (size_t)cap);
            if (!nh) { srv_cleanup(s); return m3_errf(err, "out of memory"); }
            s->holes = nh;
        }
        s->holes[s->n_holes++] = i;
    }
    if (s->n_text < vocab || s->n_holes)
        fprintf(stderr, "m3 serve: the model has %d vocabulary rows, the tokenizer spells %d of them: the other %d ids are "
                "never sampled\n", vocab, s->n_text - s->n_holes, vocab - s->n_text + s->n_holes);
    const char *src = chat ? m3_chat_source(chat) : NULL;
    s->reasoning_parser = src && strstr(src, "mm:think") != NULL;
    s->tool_parser = src && strstr(src, "minimax[>[") != NULL;
    s->ctx = (m3_oai_ctx){tok, chat, vocab, o->model_name, o->model_names, m3_engine_max_model_len(e), s->reasoning_parser,
                          s->tool_parser, o->media, o->gen_defaults, o->scheduling_priority, o->eos_id,
                          o->reasoning_budget >= 0, o->reasoning_budget, o->force_include_usage, o->ids_as_tokens,
                          o->trust_templates};
    signal(SIGPIPE, SIG_IGN);
    if (evthread_use_pthreads()) { srv_cleanup(s); return m3_errf(err, "evthread_use_pthreads failed"); }
    s->base = event_base_new();
    /* The HTTP layer (http.h): requests refused as RFC 9112 says and bodies over --max-body
     * answered 413 in OpenAI's shape before anything reads them whole; the request line and
     * headers within --max-header-bytes; a request must arrive whole within --timeout, and a
     * client that does not take its bytes for that long is closed (generation itself has no
     * deadline); at most --max-connections at once. Accepted sockets get a bounded send buffer
     * (the kernel doubles it), so that a client that stops reading pins little in the kernel and
     * its output piles up where the stall check sees it (srv_peek); a token stream needs far less. */
    http_opts ho = {o->max_header_bytes ? o->max_header_bytes : (size_t)64 << 10, o->max_body ? o->max_body : (size_t)32 << 20,
                    o->timeout, o->max_connections, (int)SRV_SNDBUF, http_error_body, "application/json", exit_recheck,
                    exit_recheck};
    s->http = s->base ? http_server_new(s->base, &ho, route, s) : NULL;
    if (!s->http) { srv_cleanup(s); return m3_errf(err, "cannot create the HTTP server (out of memory)"); }
    if (!getenv("M3_KEEP_NOFILE")) raise_nofile(); /* tests set it to keep a small limit */
    char lerr[256];
    int port = o->uds ? http_server_listen_unix(s->http, o->uds, lerr, sizeof lerr)
                      : http_server_listen(s->http, o->host, o->port, lerr, sizeof lerr);
    if (port < 0) { srv_cleanup(s); return m3_errf(err, "%s", lerr); }
    s->notify = event_new(s->base, -1, EV_PERSIST | EV_READ, notify_cb, s);
    s->sigint = evsignal_new(s->base, SIGINT, on_signal, s);
    s->sigterm = evsignal_new(s->base, SIGTERM, on_signal, s);
    /* every 200 ms: cancels retried, stalled streams dropped, keep-alive comments (srv_peek) */
    s->peek = event_new(s->base, -1, EV_PERSIST, peek_cb, s);
    s->deadline = evtimer_new(s->base, deadline_cb, s);
    s->hard_stop = evtimer_new(s->base, hard_stop_cb, s);
    s->exit_wait = evtimer_new(s->base, exit_wait_cb, s);
    s->dead_ev = event_new(s->base, -1, 0, dead_cb, s);
    s->stop_ev = event_new(s->base, -1, 0, on_signal, s); /* m3_server_shutdown: no signal number */
    struct timeval tv = {0, 200000};
    if (!s->notify || !s->sigint || !s->sigterm || !s->peek || !s->deadline || !s->hard_stop || !s->dead_ev || !s->stop_ev ||
        !s->exit_wait ||
        event_add(s->sigint, NULL) || event_add(s->sigterm, NULL) || event_add(s->peek, &tv)) {
        srv_cleanup(s);
        return m3_errf(err, "cannot set up the event loop (out of memory)");
    }
    if (srv_prep_start(s, 0)) { srv_cleanup(s); return m3_errf(err, "cannot start the request preparation threads"); }
    pthread_t th;
    if (pthread_create(&th, NULL, engine_main, s)) { srv_cleanup(s); return m3_errf(err, "cannot start the engine thread"); }
    if (o->uds)
        fprintf(stderr, "m3 serve: listening on unix:%s (model '%s', context %d tokens, KV capacity %d tokens)\n", o->uds,
                o->model_name, m3_engine_max_model_len(e), m3_engine_capacity_tokens(e));
    else
        fprintf(stderr, "m3 serve: listening on http://%s:%d (model '%s', context %d tokens, KV capacity %d tokens)\n",
                o->host, port, o->model_name, m3_engine_max_model_len(e), m3_engine_capacity_tokens(e));
    if (o->fault_spec) { /* tests only: allocation failures from here on (src/base/fault.h) */
        m3_err ferr;
        if (m3_fault_arm_spec(o->fault_spec, &ferr)) fprintf(stderr, "m3 serve: %s\n", ferr.msg);
        else fprintf(stderr, "m3 serve: fault injection armed: %s\n", o->fault_spec);
        if (m3_fault_armed(M3_FAULT_SERVER)) m3_fault_json_hook(1);
    }
    fflush(stderr);
    if (o->ready) o->ready(o->ready_arg, s);
    event_base_dispatch(s->base);
    if (o->ready) o->ready(o->ready_arg, NULL); /* srv is about to go: no m3_server_shutdown from here on */
    atomic_store(&s->stop_engine, 1);
    pthread_join(th, NULL);
    if (o->fault_spec) {
        m3_fault_disarm(M3_FAULT_ENGINE);
        m3_fault_disarm(M3_FAULT_SERVER);
    }
    fprintf(stderr, "m3 serve: stopped (%lu requests served)\n", s->serial);
    int dead = atomic_load(&s->engine_dead);
    if (dead) m3_errf(err, "the engine stopped: %s", m3_engine_dead(e));
    srv_cleanup(s);
    return dead ? -1 : 0;
}
