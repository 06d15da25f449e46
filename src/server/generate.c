/* m3 serve: POST /v1/completions and /v1/chat/completions (see server.h and srv.h).
 *
 * A request becomes n choices, each an engine request with its own sampler (seed + i when
 * the request gives a seed). Engine records reach the HTTP thread one token at a time
 * (srv_handle_item): the token is decoded (streaming UTF-8), the text checked against stop
 * strings (text that could still begin one is held back), passed through the chat output
 * parsers (reasoning, tool calls) and sent as a stream chunk or kept for the response.
 * Logprobs ride along: a stream chunk carries the entries of the tokens that arrived since
 * the choice's previous chunk, so their texts concatenate to the streamed text. */
#include "srv.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>

/* ------------------------------------------------------------------ request fields */

/* number field: absent / null -> *out kept, 0; wrong type or range -> 400 sent, its status */
static int get_num(struct evhttp_request *req, json_t *b, const char *k, double lo, double hi, double *out) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return SRV_BAD(req, "'%s' must be a number", k);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return SRV_BAD(req, "'%s' must be in [%g, %g]", k, lo, hi);
    *out = x;
    return 0;
}

static int get_int(struct evhttp_request *req, json_t *b, const char *k, long long lo, long long hi, long long *out) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return SRV_BAD(req, "'%s' must be an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return SRV_BAD(req, "'%s' must be in [%lld, %lld]", k, lo, hi);
    *out = x;
    return 0;
}

static int get_bool(struct evhttp_request *req, json_t *b, const char *k, int *out) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return SRV_BAD(req, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 0;
}

typedef struct gparams {
    int32_t *ids;
    size_t n_ids;
    double temperature, top_p, min_p, pp, fp, rp;
    long long top_k, seed, max_tokens, n, min_tokens, top_logprobs;
    int has_seed, stream, include_usage, echo, ignore_eos, logprobs;
    const char *stop_strs[SRV_MAX_STOP];
    int n_stop_strs;
    int32_t *stop_ids;
    size_t n_stop_ids;
    m3_logit_bias *bias;
    int n_bias;
    m3_out_opts oo;
    json_t *tools;            /* borrowed from the body */
    char *echo_text;
    size_t echo_len;
} gparams;

static void gparams_free(gparams *g) {
    free(g->ids);
    free(g->stop_ids);
    free(g->bias);
    free(g->echo_text);
}

/* chat_template_kwargs with enable_thinking: false spelled as the template's
 * thinking_mode "disabled" (new reference; NULL + *code when invalid) */
static json_t *chat_kwargs(struct evhttp_request *req, json_t *b, int *code) {
    json_t *kw = json_object_get(b, "chat_template_kwargs");
    *code = 0;
    if (!kw || json_is_null(kw)) kw = NULL;
    else if (!json_is_object(kw)) { *code = SRV_BAD(req, "'chat_template_kwargs' must be an object"); return NULL; }
    json_t *r = kw ? json_copy(kw) : json_object();
    if (!r) { *code = srv_send_error(req, 500, "server_error", "out of memory"); return NULL; }
    if (json_is_false(json_object_get(r, "enable_thinking")) && !json_object_get(r, "thinking_mode"))
        json_object_set_new(r, "thinking_mode", json_string("disabled"));
    return r;
}

int srv_chat_prompt(srv *s, struct evhttp_request *req, json_t *b, int32_t **ids, size_t *n) {
    json_t *msgs = json_object_get(b, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs)) return SRV_BAD(req, "'messages' must be a non-empty array");
    if (json_array_size(msgs) > SRV_MAX_MESSAGES)
        return SRV_BAD(req, "'messages' has %zu entries; the limit is %d", json_array_size(msgs), SRV_MAX_MESSAGES);
    if (!s->chat) return SRV_BAD(req, "this model has no chat template");
    json_t *tools = json_object_get(b, "tools");
    if (tools && json_is_null(tools)) tools = NULL;
    if (tools && !json_is_array(tools)) return SRV_BAD(req, "'tools' must be an array");
    if (json_array_size(tools) > SRV_MAX_TOOLS)
        return SRV_BAD(req, "'tools' has %zu entries; the limit is %d", json_array_size(tools), SRV_MAX_TOOLS);
    int agp = 1, rc;
    if ((rc = get_bool(req, b, "add_generation_prompt", &agp))) return rc;
    json_t *kw = chat_kwargs(req, b, &rc);
    if (!kw) return rc;
    m3_err err;
    size_t len;
    char *text = m3_chat_render(s->chat, msgs, tools, agp, kw, NULL, &len, &err);
    json_decref(kw);
    if (!text) return SRV_BAD(req, "chat template: %s", err.msg);
    rc = 0;
    if (m3_tok_encode(s->tok, text, len, 1, ids, n, &err)) rc = SRV_BAD(req, "cannot tokenize the prompt: %s", err.msg);
    free(text);
    return rc;
}

static int completion_prompt(srv *s, struct evhttp_request *req, json_t *b, gparams *g) {
    json_t *p = json_object_get(b, "prompt");
    /* a one-element batch is the prompt itself; longer batches are one request per prompt */
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_array(p) && json_array_size(p) > 1 && !json_is_integer(json_array_get(p, 0)))
        return SRV_BAD(req, "batched prompts are not supported: send one prompt per request (or use 'n')");
    m3_err err;
    if (json_is_string(p)) {
        if (m3_tok_encode(s->tok, json_string_value(p), json_string_length(p), 1, &g->ids, &g->n_ids, &err))
            return SRV_BAD(req, "cannot tokenize the prompt: %s", err.msg);
        if (g->echo) {
            g->echo_len = json_string_length(p);
            g->echo_text = malloc(g->echo_len + 1);
            if (!g->echo_text) return srv_send_error(req, 500, "server_error", "out of memory");
            memcpy(g->echo_text, json_string_value(p), g->echo_len + 1);
        }
        return 0;
    }
    if (!json_is_array(p)) return SRV_BAD(req, "'prompt' must be a string or an array of token ids");
    int rc = srv_ids_from_json(req, p, s->vocab, &g->ids, &g->n_ids);
    if (rc) return rc;
    if (g->echo && g->n_ids && !(g->echo_text = m3_tok_decode(s->tok, g->ids, g->n_ids, 0, &g->echo_len, &err)))
        return SRV_BAD(req, "cannot decode the prompt: %s", err.msg);
    return 0;
}

static int parse_stop(srv *s, struct evhttp_request *req, json_t *b, gparams *g) {
    json_t *st = json_object_get(b, "stop");
    if (json_is_string(st)) {
        if (json_string_length(st)) g->stop_strs[g->n_stop_strs++] = json_string_value(st);
    } else if (json_is_array(st)) {
        if (json_array_size(st) > SRV_MAX_STOP)
            return SRV_BAD(req, "'stop' has %zu strings; the limit is %d", json_array_size(st), SRV_MAX_STOP);
        for (size_t i = 0; i < json_array_size(st); i++) {
            json_t *x = json_array_get(st, i);
            if (!json_is_string(x)) return SRV_BAD(req, "'stop' must be a string or an array of strings");
            if (json_string_length(x)) g->stop_strs[g->n_stop_strs++] = json_string_value(x);
        }
    } else if (st && !json_is_null(st)) return SRV_BAD(req, "'stop' must be a string or an array of strings");
    json_t *sti = json_object_get(b, "stop_token_ids");
    size_t k = 0;
    if (sti && !json_is_null(sti)) {
        if (!json_is_array(sti)) return SRV_BAD(req, "'stop_token_ids' must be an array of token ids");
        if (json_array_size(sti) > SRV_MAX_STOP_IDS)
            return SRV_BAD(req, "'stop_token_ids' has %zu ids; the limit is %d", json_array_size(sti), SRV_MAX_STOP_IDS);
        int rc = srv_ids_from_json(req, sti, s->vocab, &g->stop_ids, &k);
        if (rc) return rc;
    }
    /* the tokenizer's EOS (the end of an assistant turn) stops too unless ignore_eos; the
     * config's EOS is the engine's own stop id */
    int32_t eos = m3_tok_eos_id(s->tok);
    int32_t *ns = realloc(g->stop_ids, (k + 1) * sizeof *ns);
    if (!ns) return srv_send_error(req, 500, "server_error", "out of memory");
    g->stop_ids = ns;
    if (!g->ignore_eos && eos >= 0 && eos < s->vocab) g->stop_ids[k++] = eos;
    g->n_stop_ids = k;
    return 0;
}

static int parse_logit_bias(srv *s, struct evhttp_request *req, json_t *b, gparams *g) {
    json_t *lb = json_object_get(b, "logit_bias");
    if (!lb || json_is_null(lb)) return 0;
    if (!json_is_object(lb)) return SRV_BAD(req, "'logit_bias' must be an object mapping token ids to biases");
    size_t n = json_object_size(lb);
    if (n > SRV_MAX_LOGIT_BIAS) return SRV_BAD(req, "'logit_bias' has %zu entries; the limit is %d", n, SRV_MAX_LOGIT_BIAS);
    g->bias = malloc((n ? n : 1) * sizeof *g->bias);
    if (!g->bias) return srv_send_error(req, 500, "server_error", "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        char *end;
        errno = 0;
        long id = strtol(k, &end, 10);
        if (!isdigit((unsigned char)*k) || *end || errno || id < 0 || id >= s->vocab)
            return SRV_BAD(req, "'logit_bias' key '%s' is not a token id in [0, %d)", k, s->vocab);
        if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100))
            return SRV_BAD(req, "'logit_bias' value for token %ld must be a number in [-100, 100]", id);
        g->bias[g->n_bias++] = (m3_logit_bias){(int32_t)id, (float)json_number_value(v)};
    }
    return 0;
}

/* Fields we do not implement answer 400 rather than being silently ignored. */
static int unsupported(struct evhttp_request *req, json_t *b, int chat, long long n) {
    json_t *v;
    if ((v = json_object_get(b, "best_of")) && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == n))
        return SRV_BAD(req, "'best_of' other than n is not supported");
    if ((v = json_object_get(b, "suffix")) && !json_is_null(v) && !(json_is_string(v) && !json_string_length(v)))
        return SRV_BAD(req, "'suffix' is not supported");
    if ((v = json_object_get(b, "response_format")) && !json_is_null(v)) {
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!t || strcmp(t, "text")) return SRV_BAD(req, "'response_format' other than {\"type\": \"text\"} is not supported");
    }
    if (chat && (v = json_object_get(b, "tool_choice")) && !json_is_null(v) &&
        !(json_is_string(v) && (!strcmp(json_string_value(v), "auto") || !strcmp(json_string_value(v), "none"))))
        return SRV_BAD(req, "'tool_choice' must be \"auto\" or \"none\" (forced tool calls are not supported)");
    if (chat && json_is_true(json_object_get(b, "echo"))) return SRV_BAD(req, "'echo' is not supported for chat completions");
    return 0;
}

static int parse_params(srv *s, struct evhttp_request *req, json_t *b, int chat, gparams *g) {
    int rc;
    json_t *model = json_object_get(b, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return SRV_BAD(req, "'model' must be a string");
        if (strcmp(json_string_value(model), s->o->model_name))
            return srv_send_error(req, 404, "not_found_error", "the model '%s' does not exist", json_string_value(model));
    }
    g->temperature = 1.0;
    g->top_p = 1.0;
    g->max_tokens = -1;
    g->n = 1;
    if ((rc = get_int(req, b, "n", 1, SRV_MAX_N, &g->n)) || (rc = unsupported(req, b, chat, g->n)) ||
        (rc = get_bool(req, b, "stream", &g->stream)) || (rc = get_bool(req, b, "ignore_eos", &g->ignore_eos)) ||
        (!chat && (rc = get_bool(req, b, "echo", &g->echo))) ||
        (rc = get_num(req, b, "temperature", 0, 2, &g->temperature)) || (rc = get_num(req, b, "top_p", 0, 1, &g->top_p)) ||
        (rc = get_num(req, b, "min_p", 0, 1, &g->min_p)) || (rc = get_num(req, b, "presence_penalty", -2, 2, &g->pp)) ||
        (rc = get_num(req, b, "frequency_penalty", -2, 2, &g->fp)) ||
        (rc = get_num(req, b, "repetition_penalty", 0, 100, &g->rp)) || (rc = get_int(req, b, "top_k", -1, 1 << 30, &g->top_k)) ||
        (rc = get_int(req, b, "max_tokens", 1, 1 << 30, &g->max_tokens)) ||
        (rc = get_int(req, b, "max_completion_tokens", 1, 1 << 30, &g->max_tokens)) ||
        (rc = get_int(req, b, "min_tokens", 0, 1 << 30, &g->min_tokens)))
        return rc;
    json_t *seed = json_object_get(b, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return SRV_BAD(req, "'seed' must be an integer");
        g->seed = json_integer_value(seed);
        g->has_seed = 1;
    }
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return SRV_BAD(req, "'stream_options' must be an object");
        if ((rc = get_bool(req, so, "include_usage", &g->include_usage))) return rc;
    }
    /* logprobs: completions take an integer (alternatives per token), chat a boolean plus
     * top_logprobs */
    if (chat) {
        if ((rc = get_bool(req, b, "logprobs", &g->logprobs)) ||
            (rc = get_int(req, b, "top_logprobs", 0, M3_SAMPLE_MAX_TOP_LOGPROBS, &g->top_logprobs)))
            return rc;
        if (g->top_logprobs && !g->logprobs) return SRV_BAD(req, "'top_logprobs' needs 'logprobs': true");
    } else {
        long long lp = -1;
        if ((rc = get_int(req, b, "logprobs", 0, M3_SAMPLE_MAX_TOP_LOGPROBS, &lp))) return rc;
        g->logprobs = lp >= 0;
        g->top_logprobs = lp > 0 ? lp : 0;
        if (g->echo && g->logprobs) return SRV_BAD(req, "'echo' with 'logprobs' is not supported (no prompt logprobs)");
    }
    if ((rc = chat ? srv_chat_prompt(s, req, b, &g->ids, &g->n_ids) : completion_prompt(s, req, b, g))) return rc;
    if (!g->n_ids) return SRV_BAD(req, "the prompt is empty");
    for (size_t i = 0; i < g->n_ids; i++)
        if (g->ids[i] >= s->vocab)
            return SRV_BAD(req, "prompt token %d is outside the model's vocabulary (%d)", g->ids[i], s->vocab);
    long long mml = m3_engine_max_model_len(s->e), np = (long long)g->n_ids;
    if (np >= mml)
        return SRV_BAD(req, "the prompt has %lld tokens; this model's context is %lld tokens (prompt + completion)", np, mml);
    if (g->max_tokens > mml - np)
        return SRV_BAD(req, "this model's context is %lld tokens; the request asks for %lld (%lld in the prompt, %lld to "
                       "generate): reduce the prompt or max_tokens", mml, np + g->max_tokens, np, g->max_tokens);
    if (g->max_tokens < 0) g->max_tokens = chat ? mml - np : (16 < mml - np ? 16 : mml - np);
    if (g->min_tokens > g->max_tokens)
        return SRV_BAD(req, "'min_tokens' (%lld) is larger than max_tokens (%lld)", g->min_tokens, g->max_tokens);
    if ((rc = parse_stop(s, req, b, g)) || (rc = parse_logit_bias(s, req, b, g))) return rc;
    if (chat) {
        g->oo = (m3_out_opts){s->reasoning_parser, M3_THINK_ENABLED, s->tool_parser, NULL};
        json_t *kw = chat_kwargs(req, b, &rc);
        if (!kw) return rc;
        const char *tm = json_string_value(json_object_get(kw, "thinking_mode"));
        if (tm && !strcmp(tm, "disabled")) g->oo.thinking = M3_THINK_DISABLED;
        else if (tm && !strcmp(tm, "adaptive")) g->oo.thinking = M3_THINK_ADAPTIVE;
        json_decref(kw);
        json_t *tc = json_object_get(b, "tool_choice");
        if (json_is_string(tc) && !strcmp(json_string_value(tc), "none")) g->oo.tools = 0;
        g->tools = json_object_get(b, "tools");
        if (!json_is_array(g->tools)) g->tools = NULL;
    }
    return 0;
}

/* ------------------------------------------------------------------ lifetime */

static void choice_clear(choice *c) {
    m3_tok_stream_free(c->ts);
    m3_out_free(c->out);
    m3_stop_free(c->stop);
    free(c->text.p);
    free(c->content.p);
    free(c->reasoning.p);
    json_decref(c->tools);
    json_decref(c->lp);
}

static void hreq_free(hreq *h) {
    for (int i = 0; i < h->n; i++) choice_clear(&h->ch[i]);
    free(h->ch);
    free(h->echo_text);
    free(h);
}

/* Frees h once the engine ended every choice, the response is written (or the client is
 * gone) and nothing up the stack uses it. */
static void hreq_release(hreq *h) {
    if (h->busy || h->n_open || !(h->closed || h->flushed)) return;
    srv *s = h->s;
    if (h->prev) h->prev->next = h->next;
    else s->live = h->next;
    if (h->next) h->next->prev = h->prev;
    s->n_live--;
    hreq_free(h);
    srv_maybe_exit(s);
}

static void cancel_open(hreq *h) {
    for (int i = 0; i < h->n; i++)
        if (h->ch[i].id && !h->ch[i].engine_ended) m3_engine_cancel(h->s->e, h->ch[i].id);
}

static void client_gone(hreq *h) {
    h->closed = 1;
    h->req = NULL;
    h->conn = NULL;
    cancel_open(h);
}

/* The connection closed: the client left, or the reply could not be written. */
static void conn_closed(struct evhttp_connection *conn, void *arg) {
    (void)conn;
    hreq *h = arg;
    if (h->replied) { h->flushed = 1; hreq_release(h); return; }
    if (h->closed) return;
    /* libevent detaches an unfinished request from its failed connection (it is not freed
     * with it): it is ours to free now, or it leaks */
    if (h->req && !evhttp_request_get_connection(h->req)) evhttp_request_free(h->req);
    client_gone(h);
    hreq_release(h);
}

/* the last byte of the response was written */
static void on_flushed(struct evhttp_request *req, void *arg) {
    (void)req;
    hreq *h = arg;
    h->flushed = 1;
    if (h->conn) evhttp_connection_set_closecb(h->conn, NULL, NULL); /* the connection may serve others now */
    hreq_release(h);
}

void srv_peek(srv *s) {
    for (hreq *h = s->live, *nx; h; h = nx) {
        nx = h->next;
        if (h->replied || h->closed || !h->conn) continue;
        struct bufferevent *bev = evhttp_connection_get_bufferevent(h->conn);
        evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
        if (fd < 0) continue;
        char c;
        ssize_t k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            struct evhttp_connection *conn = h->conn;
            h->busy++;
            evhttp_connection_set_closecb(conn, NULL, NULL);
            client_gone(h);
            evhttp_connection_free(conn); /* frees the request with it */
            h->busy--;
            hreq_release(h);
        }
    }
}

void srv_cancel_all(srv *s) {
    for (hreq *h = s->live; h; h = h->next)
        if (!h->replied && !h->closed) cancel_open(h); /* their choices end as cancelled: "abort" / 503 */
}

void srv_free_all(srv *s) {
    while (s->live) {
        hreq *h = s->live;
        s->live = h->next;
        hreq_free(h);
    }
    s->n_live = 0;
}

/* ------------------------------------------------------------------ output */

static const char *finish_str(const choice *c) {
    switch (c->finish_reason) {
    case M3_FINISH_STOP: return c->out && m3_out_tool_calls(c->out) > 0 ? "tool_calls" : "stop";
    case M3_FINISH_LENGTH: return "length";
    case M3_FINISH_CANCELLED: return "abort";
    case M3_FINISH_ERROR: return "error";
    default: return "stop";
    }
}

static json_t *usage_json(const hreq *h) {
    int gen = 0;
    for (int i = 0; i < h->n; i++) gen += h->ch[i].n_gen;
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", h->n_prompt, "completion_tokens", gen, "total_tokens",
                     h->n_prompt + gen);
}

static void sse_send(hreq *h, json_t *j) {
    if (!j) return;
    char *txt = h->req ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    struct evbuffer *b = txt ? evbuffer_new() : NULL;
    if (b) {
        evbuffer_add(b, "data: ", 6);
        evbuffer_add(b, txt, strlen(txt));
        evbuffer_add(b, "\n\n", 2);
        evhttp_send_reply_chunk(h->req, b);
        evbuffer_free(b);
    }
    free(txt);
}

static json_t *chunk_base(const hreq *h) {
    char id[64];
    snprintf(id, sizeof id, "%s-%lu", h->chat ? "chatcmpl" : "cmpl", h->serial);
    return json_pack("{s:s,s:s,s:I,s:s}", "id", id, "object", h->chat ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)h->created, "model", h->s->o->model_name);
}

/* a chunk with one choice: {"index", "delta" | "text", "logprobs", "finish_reason"} (takes body) */
static void send_chunk(hreq *h, int index, json_t *body, json_t *logprobs, const char *finish) {
    json_t *c = chunk_base(h);
    json_t *ch = json_pack("{s:i,s:o,s:o,s:o}", "index", index, h->chat ? "delta" : "text", body ? body : json_string(""),
                           "logprobs", logprobs ? logprobs : json_null(), "finish_reason",
                           finish ? json_string(finish) : json_null());
    if (!c || !ch || json_object_set_new(c, "choices", json_pack("[o]", ch))) { json_decref(c); return; }
    sse_send(h, c);
}

static json_t *lp_new(const hreq *h) {
    if (!h->logprobs) return NULL;
    if (h->chat) return json_array();
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* The logprob entries kept so far, in the response's shape, and a fresh list for the next
 * ones. NULL (JSON null) when none were asked for, or none are pending and empty is false. */
static json_t *lp_take(choice *c, int empty_ok) {
    hreq *h = c->h;
    if (!h->logprobs || !c->lp) return NULL;
    size_t k = h->chat ? json_array_size(c->lp) : json_array_size(json_object_get(c->lp, "tokens"));
    if (!k && !empty_ok) return NULL;
    json_t *r = h->chat ? json_pack("{s:o}", "content", c->lp) : c->lp;
    c->lp = lp_new(h);
    return r;
}

static size_t utf8_chars(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

static json_t *bytes_json(const char *p, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

static double lp_value(float x) { return isfinite(x) ? (double)x : -9999.0; } /* JSON has no -inf */

/* Records the logprobs of one generated token whose decoded text is text[0..len). */
static void lp_add(srv *s, choice *c, const m3_sample_out *so, const char *text, size_t len) {
    hreq *h = c->h;
    if (!c->lp) return;
    json_t *tops = h->chat ? json_array() : json_object();
    for (int i = 0; tops && i < so->n_top && i < h->top_logprobs; i++) {
        m3_err err;
        size_t tl = 0;
        char *t = m3_tok_decode(s->tok, &so->top_ids[i], 1, 0, &tl, &err);
        const char *tt = t ? t : "";
        double v = lp_value(so->top_logprobs[i]);
        if (h->chat)
            json_array_append_new(tops, json_pack("{s:s%,s:f,s:o}", "token", tt, tl, "logprob", v, "bytes", bytes_json(tt, tl)));
        else if (!json_object_get(tops, tt)) /* texts can repeat (byte tokens); the likelier one stays */
            json_object_set_new(tops, tt, json_real(v));
        free(t);
    }
    if (h->chat) {
        json_array_append_new(c->lp, json_pack("{s:s%,s:f,s:o,s:o}", "token", text, len, "logprob", lp_value(so->logprob),
                                               "bytes", bytes_json(text, len), "top_logprobs", tops ? tops : json_array()));
    } else {
        json_array_append_new(json_object_get(c->lp, "tokens"), json_stringn(text, len));
        json_array_append_new(json_object_get(c->lp, "token_logprobs"), json_real(lp_value(so->logprob)));
        json_array_append_new(json_object_get(c->lp, "top_logprobs"), tops ? tops : json_object());
        size_t off = (h->echo ? utf8_chars(h->echo_text ? h->echo_text : "", h->echo_len) : 0) + c->text_chars;
        json_array_append_new(json_object_get(c->lp, "text_offset"), json_integer((json_int_t)off));
        c->text_chars += utf8_chars(text, len);
    }
}

/* Passes parsed deltas on: a stream chunk, or the non-stream accumulators. */
static void emit_deltas(choice *c, const m3_out_delta *d, size_t n) {
    hreq *h = c->h;
    if (!n) return;
    if (h->stream) {
        send_chunk(h, c->index, m3_out_delta_json(d, n), lp_take(c, 0), NULL);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (d[i].kind == M3_OUT_CONTENT) sbuf_add(&c->content, d[i].text, d[i].len);
        else if (d[i].kind == M3_OUT_REASONING) sbuf_add(&c->reasoning, d[i].text, d[i].len);
        else if (d[i].kind == M3_OUT_TOOL_BEGIN) {
            if (!c->tools) c->tools = json_array();
            json_array_append_new(c->tools, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", d[i].id, "type", "function",
                                                      "function", "name", d[i].name, "arguments", ""));
        } else if (d[i].kind == M3_OUT_TOOL_ARGS && c->tools) {
            json_t *f = json_object_get(json_array_get(c->tools, json_array_size(c->tools) - 1), "function");
            const char *old = json_string_value(json_object_get(f, "arguments"));
            sbuf a = {0};
            if (!sbuf_add(&a, old ? old : "", old ? strlen(old) : 0) && !sbuf_add(&a, d[i].text, d[i].len))
                json_object_set_new(f, "arguments", json_stringn_nocheck(a.p, a.n));
            free(a.p);
        }
    }
}

/* Text that passed the stop-string check goes through the chat parsers (or straight out). */
static void emit_text(choice *c, const char *p, size_t n, int final) {
    const m3_out_delta *d = NULL;
    size_t nd = 0;
    m3_err err;
    if (c->out) {
        if (n && m3_out_feed(c->out, p, n, &d, &nd, &err) == 0) emit_deltas(c, d, nd);
        if (final && m3_out_finish(c->out, &d, &nd, &err) == 0) emit_deltas(c, d, nd);
        return;
    }
    if (!n) return;
    if (c->h->stream && !c->h->chat) {
        send_chunk(c->h, c->index, json_stringn(p, n), lp_take(c, 0), NULL);
        return;
    }
    m3_out_delta one = {M3_OUT_CONTENT, -1, p, n, NULL, NULL};
    emit_deltas(c, &one, 1);
}

/* Non-stream: the whole response, or an error when a choice failed or was cancelled. */
static int send_final(hreq *h) {
    srv *s = h->s;
    for (int i = 0; i < h->n; i++) {
        if (h->ch[i].finish_reason == M3_FINISH_CANCELLED)
            return srv_send_error(h->req, 503, "service_unavailable_error",
                                  "the request was cancelled: the server is shutting down");
        if (h->ch[i].finish_reason == M3_FINISH_ERROR)
            return srv_send_error(h->req, 500, "server_error", "generation failed (see the server log)");
    }
    json_t *choices = json_array();
    for (int i = 0; choices && i < h->n; i++) {
        choice *c = &h->ch[i];
        json_t *ch, *lp = lp_take(c, 1);
        if (h->chat) {
            json_t *msg = json_pack("{s:s,s:s%}", "role", "assistant", "content", c->content.p ? c->content.p : "",
                                    c->content.n);
            if (msg && c->reasoning.p) json_object_set_new(msg, "reasoning_content", json_stringn(c->reasoning.p, c->reasoning.n));
            if (msg && c->tools) json_object_set(msg, "tool_calls", c->tools);
            ch = json_pack("{s:i,s:o,s:o,s:s}", "index", i, "message", msg ? msg : json_object(), "logprobs",
                           lp ? lp : json_null(), "finish_reason", finish_str(c));
        } else {
            sbuf t = {0};
            if (h->echo && h->echo_text) sbuf_add(&t, h->echo_text, h->echo_len);
            sbuf_add(&t, c->content.p ? c->content.p : "", c->content.n);
            ch = json_pack("{s:i,s:s%,s:o,s:s}", "index", i, "text", t.p ? t.p : "", t.n, "logprobs", lp ? lp : json_null(),
                           "finish_reason", finish_str(c));
            free(t.p);
        }
        json_array_append_new(choices, ch);
    }
    char id[64];
    snprintf(id, sizeof id, "%s-%lu", h->chat ? "chatcmpl" : "cmpl", h->serial);
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", id, "object", h->chat ? "chat.completion" : "text_completion",
                          "created", (json_int_t)h->created, "model", s->o->model_name, "choices", choices, "usage",
                          usage_json(h));
    return srv_send_json(h->req, 200, j);
}

static void finish_response(hreq *h) {
    srv *s = h->s;
    double t = srv_now();
    int status = 499; /* nginx's "client closed request" */
    if (!h->closed && h->req) {
        evhttp_request_set_on_complete_cb(h->req, on_flushed, h);
        if (h->stream) {
            if (h->include_usage) {
                json_t *c = chunk_base(h);
                if (c && !json_object_set_new(c, "choices", json_array()) && !json_object_set_new(c, "usage", usage_json(h)))
                    sse_send(h, c);
                else json_decref(c);
            }
            struct evbuffer *b = evbuffer_new();
            if (b) {
                evbuffer_add(b, "data: [DONE]\n\n", 14);
                evhttp_send_reply_chunk(h->req, b);
                evbuffer_free(b);
            }
            struct evhttp_request *req = h->req;
            h->req = NULL; /* reply_end may complete (and free req) before it returns */
            h->replied = 1;
            evhttp_send_reply_end(req);
            status = 200;
        } else {
            h->replied = 1;
            status = send_final(h); /* completes later (on_flushed) */
            h->req = NULL;
        }
    }
    h->replied = 1;
    int completion = 0;
    for (int i = 0; i < h->n; i++) completion += h->ch[i].n_gen;
    m3_metrics_http(&s->m, status);
    if (status == 200) m3_hist_observe(&s->m.e2e, t - h->t0);
    srv_log(s, h->serial, h->chat ? "POST /v1/chat/completions" : "POST /v1/completions", status, h->n_prompt, completion,
            h->t_first > 0 ? h->t_first - h->t0 : -1, t - h->t0);
}

/* A choice is complete: flush its parsers, tell a stream client, and answer when it was the last. */
static void choice_end(choice *c, int reason) {
    hreq *h = c->h;
    c->done = 1;
    c->finish_reason = reason;
    h->n_done++;
    h->s->m.finished[reason]++;
    if (!h->closed) {
        if (reason == M3_FINISH_CANCELLED || reason == M3_FINISH_ERROR) { /* text held back for stop strings */
            if (c->text.n > c->emitted) emit_text(c, c->text.p + c->emitted, c->text.n - c->emitted, 0);
            c->emitted = c->text.n;
        }
        emit_text(c, NULL, 0, 1);
        if (h->stream) send_chunk(h, c->index, h->chat ? json_object() : json_string(""), lp_take(c, 0), finish_str(c));
    }
    if (h->n_done == h->n) finish_response(h);
}

/* One generated token of choice c. */
static void on_token(srv *s, choice *c, const m3_sample_out *so, int finished, int reason) {
    hreq *h = c->h;
    double t = srv_now();
    c->n_gen++;
    s->m.generation_tokens++;
    if (c->n_gen == 1) {
        m3_hist_observe(&s->m.ttft, t - h->t0);
        if (h->t_first <= 0) h->t_first = t;
    } else m3_hist_observe(&s->m.itl, t - c->t_last);
    c->t_last = t;
    if (h->closed) { /* nobody to tell: just wait for the end */
        if (finished) choice_end(c, reason);
        return;
    }
    const char *p = NULL;
    size_t n = 0, before = c->text.n;
    m3_err err;
    /* a stop id (EOS included) ends the output and is not part of its text */
    int stop_tok = finished && reason == M3_FINISH_STOP;
    if (!stop_tok && m3_tok_stream_push(c->ts, so->token, &p, &n, &err) == 0 && n) sbuf_add(&c->text, p, n);
    if (finished) {
        m3_tok_stream_finish(c->ts, &p, &n);
        if (n) sbuf_add(&c->text, p, n);
    }
    if (!stop_tok) lp_add(s, c, so, c->text.p ? c->text.p + before : "", c->text.n - before);
    size_t upto = c->text.n;
    int hit = 0;
    if (c->stop && c->n_gen > h->min_tokens) { /* min_tokens holds stop strings back too (vLLM) */
        m3_stop_match m;
        if (m3_stop_scan(c->stop, c->text.p ? c->text.p : "", c->text.n, c->checked, &m)) { upto = m.start; hit = 1; }
        else if (!finished) upto = m.safe;
    }
    c->checked = c->text.n;
    if (upto > c->emitted) {
        emit_text(c, c->text.p + c->emitted, upto - c->emitted, 0);
        c->emitted = upto;
    }
    if (hit) {
        m3_engine_cancel(s->e, c->id);
        choice_end(c, M3_FINISH_STOP);
    } else if (finished) choice_end(c, reason);
}

void srv_handle_item(srv *s, qitem *it) {
    choice *c = it->c;
    hreq *h = c->h;
    h->busy++;
    if (it->finished && !c->engine_ended) { c->engine_ended = 1; h->n_open--; }
    if (!c->done) {
        if (it->has_tok) on_token(s, c, &it->so, it->finished, it->reason);
        else if (it->finished) choice_end(c, it->reason); /* cancelled or failed without a token */
    }
    h->busy--;
    hreq_release(h);
}

/* ------------------------------------------------------------------ submission */

/* engine thread */
static void on_output(void *arg, uint64_t id, const m3_sample_out *out, int finished, int reason) {
    (void)id;
    choice *c = arg;
    qitem it = {c, {0}, out != NULL, finished, reason};
    if (out) it.so = *out;
    srv_push(c->h->s, &it);
}

static int start(srv *s, struct evhttp_request *req, int chat, gparams *g, unsigned long serial, double t0) {
    m3_err err;
    hreq *h = calloc(1, sizeof *h);
    if (!h || !(h->ch = calloc((size_t)g->n, sizeof *h->ch))) {
        free(h);
        return srv_send_error(req, 500, "server_error", "out of memory");
    }
    h->s = s;
    h->req = req;
    h->conn = evhttp_request_get_connection(req);
    h->serial = serial;
    h->chat = chat;
    h->stream = g->stream;
    h->include_usage = g->include_usage;
    h->n = (int)g->n;
    h->echo = g->echo;
    h->logprobs = g->logprobs;
    h->top_logprobs = (int)g->top_logprobs;
    h->min_tokens = (int)g->min_tokens;
    h->n_prompt = (int)g->n_ids;
    h->created = (long)time(NULL);
    h->t0 = t0;
    h->echo_text = g->echo_text;
    h->echo_len = g->echo_len;
    g->echo_text = NULL;
    int rc = 0;
    for (int i = 0; i < h->n && !rc; i++) {
        choice *c = &h->ch[i];
        c->h = h;
        c->index = i;
        if (!(c->ts = m3_tok_stream_new(s->tok, 1, &err))) rc = srv_send_error(req, 500, "server_error", "%s", err.msg);
        else if (g->n_stop_strs && !(c->stop = m3_stop_create(g->stop_strs, g->n_stop_strs, NULL, 0, &err)))
            rc = SRV_BAD(req, "%s", err.msg);
        else if (chat && !(c->out = m3_out_new(&g->oo, g->tools, &err))) rc = SRV_BAD(req, "%s", err.msg);
        else if (h->logprobs && !(c->lp = lp_new(h))) rc = srv_send_error(req, 500, "server_error", "out of memory");
    }
    if (rc) { hreq_free(h); return rc; }

    /* min_tokens holds back every id that would end the request */
    int32_t min_ids[SRV_MAX_STOP_IDS + 2];
    int n_min = 0;
    for (size_t i = 0; i < g->n_stop_ids; i++) min_ids[n_min++] = g->stop_ids[i];
    if (!g->ignore_eos && s->o->eos_id >= 0 && s->o->eos_id < s->vocab) min_ids[n_min++] = s->o->eos_id;
    m3_engine_request er = {0};
    er.prompt = g->ids;
    er.n_prompt = (int)g->n_ids;
    m3_sampling *sp = &er.sampling;
    sp->temperature = (float)g->temperature;
    sp->top_p = (float)g->top_p;
    sp->top_k = (int)g->top_k;
    sp->min_p = (float)g->min_p;
    sp->presence_penalty = (float)g->pp;
    sp->frequency_penalty = (float)g->fp;
    sp->repetition_penalty = (float)g->rp;
    sp->logit_bias = g->bias;
    sp->n_logit_bias = g->n_bias;
    sp->min_tokens = (int)g->min_tokens;
    sp->min_tokens_ids = min_ids;
    sp->n_min_tokens_ids = g->min_tokens ? n_min : 0;
    sp->logprobs = 1;
    sp->top_logprobs = h->top_logprobs;
    er.max_tokens = (int)g->max_tokens;
    er.stop_ids = g->stop_ids;
    er.n_stop_ids = (int)g->n_stop_ids;
    er.ignore_eos = g->ignore_eos;
    er.on_output = on_output;

    /* on the live list first: the engine may report before the loop below ends */
    h->next = s->live;
    if (s->live) s->live->prev = h;
    s->live = h;
    s->n_live++;
    h->busy++;
    uint64_t base = (uint64_t)time(NULL) * 6364136223846793005ull + ++s->seed_ctr * 1442695040888963407ull;
    for (int i = 0; i < h->n; i++) {
        sp->seed = g->has_seed ? (uint64_t)g->seed + (uint64_t)i : base + (uint64_t)i * 0x9e3779b97f4a7c15ull;
        er.arg = &h->ch[i];
        h->ch[i].id = m3_engine_add(s->e, &er, &err);
        if (!h->ch[i].id) { rc = SRV_BAD(req, "%s", err.msg); break; }
        h->n_open++;
    }
    if (rc) { /* the choices already queued end as cancelled; h goes when they have */
        cancel_open(h);
        for (int i = 0; i < h->n; i++) h->ch[i].done = 1;
        h->req = NULL;
        h->conn = NULL;
        h->replied = h->flushed = 1;
        h->busy--;
        hreq_release(h);
        return rc;
    }
    s->m.prompt_tokens += g->n_ids;
    if (h->stream) {
        struct evkeyvalq *hd = evhttp_request_get_output_headers(req);
        evhttp_add_header(hd, "Content-Type", "text/event-stream");
        evhttp_add_header(hd, "Cache-Control", "no-cache");
        evhttp_send_reply_start(req, 200, "OK");
        for (int i = 0; i < h->n; i++) {
            if (chat) send_chunk(h, i, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL, NULL);
            else if (h->echo && h->echo_text) send_chunk(h, i, json_stringn(h->echo_text, h->echo_len), NULL, NULL);
        }
    }
    evhttp_connection_set_closecb(h->conn, conn_closed, h);
    h->busy--;
    hreq_release(h);
    return 0;
}

int srv_generate(srv *s, struct evhttp_request *req, int chat, unsigned long serial, double t0) {
    int rc = srv_check_auth(s, req);
    if (rc) return rc;
    json_t *b = srv_read_body(req, &rc);
    if (!b) return rc;
    gparams g;
    memset(&g, 0, sizeof g);
    rc = parse_params(s, req, b, chat, &g);
    if (!rc) {
        m3_engine_stats st;
        m3_engine_get_stats(s->e, &st);
        if (st.waiting >= s->o->max_waiting) {
            s->m.requests_rejected_overload++;
            rc = srv_send_error(req, 429, "rate_limit_error",
                                "the server is busy: %d requests are waiting (limit %d); retry later", st.waiting,
                                s->o->max_waiting);
        }
    }
    if (!rc) rc = start(s, req, chat, &g, serial, t0);
    gparams_free(&g);
    json_decref(b);
    return rc;
}
