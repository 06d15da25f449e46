/* m3 serve: POST /v1/completions and /v1/chat/completions (see server.h and srv.h).
 *
 * A request is parsed and checked by openai.c (no HTTP there), then becomes n choices, each an
 * engine request with its own sampler (seed + i when the request gives a seed). Engine
 * records reach the HTTP thread one token at a time (srv_handle_item): the token is decoded
 * (streaming UTF-8), the text checked against stop strings (text that could still begin one
 * is held back), passed through the chat output parsers (reasoning, tool calls) and sent as a
 * stream chunk or kept for the response. Logprobs ride along: a stream chunk carries the
 * entries of the tokens that arrived since the choice's previous chunk, so their texts
 * concatenate to the streamed text.
 *
 * Failures never pass silently: when a piece of the response cannot be built (no memory) or
 * an engine record was lost, the request is marked failed (h->failed), its choices are
 * cancelled and the response ends with an error: a 500 in OpenAI's shape, or for a stream an
 * error event (data: {"error": ...}) and [DONE]. A choice the engine ends with an error (out
 * of memory, NaN / Inf logits) does the same with the engine's reason.
 *
 * POST /v1/messages (Anthropic's API, h->api) is a chat completion here too: everything above
 * applies; only the shapes differ, written by anthropic.c (content blocks, its events, its
 * errors). */
#include "srv.h"
#include "responses.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>

static const char NOMEM[] = "out of memory while building the response";

/* the first failure wins; the request ends with an error once its current record is handled */
static void mark_failed(hreq *h, const char *why) {
    if (!h->failed) h->failed = why;
}

/* the same with a message of the moment (copied: it names the real cause) */
static void mark_failed_err(hreq *h, const m3_err *err) {
    if (h->failed) return;
    snprintf(h->fail_msg, sizeof h->fail_msg, "%s", err->msg[0] ? err->msg : NOMEM);
    h->failed = h->fail_msg;
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
    free(c->ab_text.p);
    json_decref(c->ab_blocks);
    json_decref(c->ab_tool);
    json_decref(c->r_lp);
    json_decref(c->r_lp_pend);
    json_decref(c->plp);
    json_decref(c->tids);
    m3_tok_stream_free(c->pts);
}

static void hreq_free(hreq *h) {
    if (h->px_bytes) atomic_fetch_sub(&h->s->px_held, h->px_bytes);
    for (int i = 0; i < h->n; i++) choice_clear(&h->ch[i]);
    free(h->ch);
    free(h->echo_text);
    free(h->pids);
    srv_resp_free(h);
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

/* asks the engine to end choice c; a cancel that finds no memory is retried by srv_peek */
static void choice_cancel(choice *c) {
    if (c->id && !c->engine_ended) c->cancel_pending = m3_engine_cancel(c->h->s->e, c->id) != 0;
}

static void cancel_open(hreq *h) {
    for (int i = 0; i < h->n; i++) choice_cancel(&h->ch[i]);
}

static void client_gone(hreq *h) {
    h->closed = 1;
    h->req = NULL;
    cancel_open(h);
}

/* The connection closed: the client left, or the reply could not be written (http.h: the
 * request is gone once this returns). */
static void conn_closed(http_req *req, void *arg) {
    (void)req;
    hreq *h = arg;
    if (h->replied) { h->flushed = 1; hreq_release(h); return; }
    if (h->closed) return;
    client_gone(h);
    hreq_release(h);
}

/* the last byte of the response was written */
static void on_flushed(http_req *req, void *arg) {
    (void)req;
    hreq *h = arg;
    h->flushed = 1;
    hreq_release(h);
}

/* Closes h's connection and cancels what it asked for. */
static void drop_client(hreq *h) {
    http_req *req = h->req;
    h->busy++;
    client_gone(h);
    http_drop(req);
    h->busy--;
    hreq_release(h);
}

void srv_peek(srv *s) {
    double now = m3_now();
    for (hreq *h = s->live, *nx; h; h = nx) {
        nx = h->next;
        for (int i = 0; i < h->n; i++)
            if (h->ch[i].cancel_pending) choice_cancel(&h->ch[i]);
        if (h->replied || h->closed || !h->req) continue;
        /* A stream whose client does not read: the write timeout restarts whenever output is
         * added, so it would never fire while tokens keep coming. Output piling up beyond
         * SRV_STALL_BYTES for the whole timeout means the client is not keeping up: drop it. */
        size_t pend = http_unsent(h->req);
        if (pend < SRV_STALL_BYTES) h->stall_since = 0;
        else if (h->stall_since <= 0) h->stall_since = now;
        else if (s->o->timeout > 0 && now - h->stall_since >= s->o->timeout) {
            s->m.slow_clients_dropped++;
            drop_client(h);
            continue;
        }
        /* a stream silent for a while (its request waits in the engine's queue or behind long
         * prefills) gets an SSE comment, for the proxies between us and the client */
        double ka = s->o->timeout > 0 && s->o->timeout / 2 < SRV_KEEPALIVE_S ? s->o->timeout / 2 : SRV_KEEPALIVE_S;
        if (h->stream && now - h->t_write >= ka && !http_reply_chunk(h->req, ": keep-alive\n\n", 14)) {
            h->t_write = now;
            s->m.keepalives++;
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

/* completions with echo: the text of choice i's prompt (NULL: no echo) */
static const char *echo_of(const hreq *h, int i, size_t *len) {
    if (!h->echo || !h->echo_text) return NULL;
    int p = i / h->n_per;
    *len = h->echo_off[p + 1] - h->echo_off[p];
    return h->echo_text + h->echo_off[p];
}

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
    int gen = 0, cached = 0;
    for (int i = 0; i < h->n; i++) {
        gen += h->ch[i].n_gen;
        if (i % h->n_per == 0) cached += atomic_load(&h->ch[i].n_cached); /* each prompt's first choice: its hit */
    }
    json_t *u = json_pack("{s:i,s:i,s:i}", "prompt_tokens", h->n_prompt, "completion_tokens", gen, "total_tokens",
                          h->n_prompt + gen);
    if (u && h->s->o->prompt_tokens_details &&
        json_object_set_new(u, "prompt_tokens_details", json_pack("{s:i}", "cached_tokens", cached))) {
        json_decref(u);
        return NULL;
    }
    return u;
}

/* one SSE event; raw text (len bytes) */
static int sse_raw(hreq *h, const char *txt, size_t len) {
    if (!h->req) return 0;
    struct iovec v[3] = {{(void *)"data: ", 6}, {(void *)txt, len}, {(void *)"\n\n", 2}};
    int rc = http_reply_chunkv(h->req, v, 3);
    if (!rc) h->t_write = m3_now();
    return rc;
}

/* one SSE event (takes j); a NULL j (a failed allocation) fails the request */
static void sse_send(hreq *h, json_t *j) {
    size_t n = 0;
    char *txt = h->req ? srv_json_text(j, &n) : NULL;
    json_decref(j);
    if (!h->req) return;
    if (!txt || sse_raw(h, txt, n)) mark_failed(h, NOMEM);
    free(txt);
}

/* a stream's error event, in OpenAI's error shape (no allocation but libevent's buffer) */
static void sse_error(hreq *h, int code, const char *type, const char *msg) {
    if (h->api == SRV_API_ANTHROPIC) { srv_anth_sse_error(h, code, msg); return; }
    if (h->api == SRV_API_RESPONSES) { srv_resp_sse_failed(h, msg); return; }
    char buf[1400];
    size_t n = srv_error_json(buf, sizeof buf, code, type, NULL, msg);
    sse_raw(h, buf, n);
}

static json_t *chunk_base(const hreq *h) {
    char id[160];
    snprintf(id, sizeof id, "%s-%s", h->chat ? "chatcmpl" : "cmpl", h->id_sfx);
    return json_pack("{s:s,s:s,s:I,s:s}", "id", id, "object", h->chat ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)h->created, "model", h->s->o->model_name);
}

/* prompt p's ids (return_token_ids) */
static json_t *prompt_ids_json(const hreq *h, int p) {
    json_t *a = json_array();
    for (size_t i = h->pid_off[p]; a && i < h->pid_off[p + 1]; i++)
        if (json_array_append_new(a, json_integer(h->pids[i]))) { json_decref(a); return NULL; }
    return a;
}

/* return_token_ids in a stream chunk of choice c: the ids generated since its last chunk
 * (token_ids), and in its first chunk its prompt's (prompt_token_ids: the choice's in
 * completions, the chunk's in chat); 0, or -1 out of memory */
static int ids_to_chunk(hreq *h, choice *c, json_t *chunk, json_t *ch) {
    json_t *fresh = json_array(), *t = c->tids;
    if (!fresh) return -1;
    c->tids = fresh;
    if (json_object_set_new(ch, "token_ids", t ? t : json_array())) return -1; /* (set_new takes t, also on failure) */
    if (c->pids_sent) return 0;
    c->pids_sent = 1;
    json_t *p = prompt_ids_json(h, c->index / h->n_per);
    return !p || json_object_set_new(h->chat ? chunk : ch, "prompt_token_ids", p) ? -1 : 0;
}

/* a chunk with one choice: {"index", "delta" | "text", "logprobs", "finish_reason"} (takes body) */
static void send_chunk(hreq *h, int index, json_t *body, json_t *logprobs, const char *finish) {
    json_t *c = chunk_base(h);
    if (!body) { /* the piece of output it was to carry is lost: fail rather than send a gap */
        json_decref(c);
        json_decref(logprobs);
        mark_failed(h, NOMEM);
        return;
    }
    json_t *ch = json_pack("{s:i,s:o,s:o,s:o}", "index", index, h->chat ? "delta" : "text", body, "logprobs",
                           logprobs ? logprobs : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
    if (ch && h->return_ids && ids_to_chunk(h, &h->ch[index], c, ch)) {
        json_decref(ch);
        ch = NULL;
    }
    if (!c || !ch || json_object_set_new(c, "choices", json_pack("[o]", ch))) { /* set_new / pack take ch */
        if (!c) json_decref(ch);
        json_decref(c);
        mark_failed(h, NOMEM);
        return;
    }
    if (h->continuous_usage) { /* the choice's tokens so far (vLLM's continuous_usage_stats) */
        int gen = h->ch[index].n_gen, np = h->ch[index].n_prompt_toks;
        if (json_object_set_new(c, "usage", json_pack("{s:i,s:i,s:i}", "prompt_tokens", np, "completion_tokens", gen,
                                                      "total_tokens", np + gen))) {
            json_decref(c);
            mark_failed(h, NOMEM);
            return;
        }
    }
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
    if (!r || !c->lp) mark_failed(h, NOMEM);
    return r;
}

static size_t utf8_chars(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

static json_t *bytes_json(const char *p, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer((unsigned char)p[i]))) { json_decref(a); return NULL; }
    return a;
}

static double lp_value(float x) { return isfinite(x) ? (double)x : -9999.0; } /* JSON has no -inf */

/* the text of one id, as a logprob entry names it (NULL: no memory; *len its bytes): its
 * decoded text, or with return_tokens_as_token_ids "token_id:<id>" */
static char *id_text(srv *s, int as_ids, int32_t id, size_t *len) {
    m3_err err;
    *len = 0;
    if (as_ids) {
        char *t = malloc(24);
        if (t) *len = (size_t)snprintf(t, 24, "token_id:%d", (int)id);
        return t;
    }
    return m3_tok_decode(s->tok, &id, 1, 0, len, &err);
}

/* with return_tokens_as_token_ids: an entry's own token named by its id in buf (*text, *len
 * pointed there); else its decoded text stays */
static void own_name(const hreq *h, int32_t id, char buf[24], const char **text, size_t *len) {
    if (!h->ids_as_tokens) return;
    *len = (size_t)snprintf(buf, 24, "token_id:%d", (int)id);
    *text = buf;
}

/* A completions top_logprobs dict: the k most likely by text (texts can repeat: byte tokens
 * decode to U+FFFD; the likelier keeps the text, so the top value is the best token's), then
 * with `mine` the entry's own token where its text is not there yet (vLLM lists it). NULL: no
 * memory. */
static json_t *top_dict(srv *s, const hreq *h, const m3_sample_out *so, int k, int mine) {
    json_t *d = json_object();
    for (int i = 0; d && i <= k && i <= so->n_top; i++) {
        const int own = i == k || i == so->n_top;
        if (own && !mine) break;
        size_t tl;
        char *t = id_text(s, h->ids_as_tokens, own ? so->token : so->top_ids[i], &tl);
        int bad = !t || (!json_object_get(d, t) &&
                         json_object_set_new(d, t, json_real(lp_value(own ? so->logprob : so->top_logprobs[i]))));
        free(t);
        if (bad) { json_decref(d); return NULL; }
    }
    return d;
}

/* One entry of completions' logprobs (takes logprob and tops; NULL: no memory); 0 or -1. */
static int lp_entry(choice *c, const char *text, size_t len, json_t *logprob, json_t *tops, size_t offset) {
    int bad = !logprob || !tops;
    bad |= json_array_append_new(json_object_get(c->lp, "tokens"), json_stringn(text, len)) != 0;
    bad |= json_array_append_new(json_object_get(c->lp, "token_logprobs"), logprob) != 0;
    bad |= json_array_append_new(json_object_get(c->lp, "top_logprobs"), tops) != 0;
    bad |= json_array_append_new(json_object_get(c->lp, "text_offset"), json_integer((json_int_t)offset)) != 0;
    return bad ? -1 : 0;
}

/* Records the logprobs of one generated token whose decoded text is text[0..len). */
static void lp_add(srv *s, choice *c, const m3_sample_out *so, const char *text, size_t len) {
    hreq *h = c->h;
    if (!c->lp) return;
    int bad = 0;
    char nb[24];
    const size_t tlen = len; /* text_offset counts the text's code points */
    const char *ttext = text;
    own_name(h, so->token, nb, &text, &len);
    if (h->chat) {
        json_t *tops = json_array();
        bad |= !tops;
        for (int i = 0; tops && i < so->n_top && i < h->top_logprobs; i++) {
            size_t tl = 0;
            char *t = id_text(s, h->ids_as_tokens, so->top_ids[i], &tl);
            const char *tt = t ? t : "";
            bad |= json_array_append_new(tops, json_pack("{s:s%,s:f,s:o}", "token", tt, tl, "logprob",
                                                         lp_value(so->top_logprobs[i]), "bytes", bytes_json(tt, tl))) != 0;
            free(t);
        }
        bad |= json_array_append_new(c->lp, json_pack("{s:s%,s:f,s:o,s:o}", "token", text, len, "logprob",
                                                      lp_value(so->logprob), "bytes", bytes_json(text, len),
                                                      "top_logprobs", tops ? tops : json_array())) != 0;
    } else {
        bad |= lp_entry(c, text, len, json_real(lp_value(so->logprob)), top_dict(s, h, so, h->top_logprobs, 0),
                        c->echo_chars + c->text_chars);
        c->text_chars += utf8_chars(ttext, tlen);
    }
    if (bad) mark_failed(h, NOMEM);
}

/* ------------------------------------------------------------------ prompt logprobs */

/* vLLM's entry of one prompt position: {"<id>": {"logprob", "rank", "decoded_token"}}, the
 * prompt's token first, then the k most likely (ranks 1..k) */
static json_t *plp_entry(srv *s, const m3_sample_out *so, int k) {
    json_t *d = json_object();
    int bad = !d;
    for (int i = -1; d && i < k && i < so->n_top; i++) {
        const int32_t id = i < 0 ? so->token : so->top_ids[i];
        char key[16];
        snprintf(key, sizeof key, "%d", (int)id);
        if (json_object_get(d, key)) continue; /* the prompt's token among the most likely */
        size_t tl;
        char *t = id_text(s, 0, id, &tl); /* vLLM's decoded_token: the text, whatever the names */
        bad |= !t || json_object_set_new(d, key, json_pack("{s:f,s:i,s:s%}", "logprob", lp_value(i < 0 ? so->logprob : so->top_logprobs[i]),
                                                             "rank", i < 0 ? (int)so->rank : i + 1, "decoded_token", t ? t : "",
                                                             tl)) != 0;
        free(t);
    }
    if (bad) { json_decref(d); return NULL; }
    return d;
}

/* echo with logprobs: one prompt token's entry of choices[].logprobs (so NULL: the first token,
 * which has no logprob); its text comes from the choice's prompt decoder */
static int echo_entry(srv *s, choice *c, int32_t token, const m3_sample_out *so) {
    hreq *h = c->h;
    const char *p = NULL;
    size_t n = 0;
    m3_err err;
    if (m3_tok_stream_push(c->pts, token, &p, &n, &err)) return -1;
    const size_t tlen = n; /* text_offset counts the text's code points */
    const char *ttext = p ? p : "";
    char nb[24];
    own_name(h, token, nb, &p, &n);
    /* the logprobs most likely and the prompt's token (lm-eval's is_greedy compares its logprob
     * with the top value), as vLLM lists them */
    int bad = lp_entry(c, p ? p : "", n, so ? json_real(lp_value(so->logprob)) : json_null(),
                       so ? top_dict(s, h, so, h->top_logprobs, 1) : json_null(), c->p_chars);
    c->p_chars += utf8_chars(ttext, tlen);
    return bad;
}

/* the prompt's positions are all in: what the decoder held back goes to the last token's text,
 * and a stream sends the echo with its entries */
static void prompt_done(choice *c) {
    hreq *h = c->h;
    if (!h->echo_lp) return;
    const char *p = NULL;
    size_t n = 0;
    m3_tok_stream_finish(c->pts, &p, &n);
    if (n && !h->ids_as_tokens) { /* (tokens named by their ids keep their names) */
        json_t *toks = json_object_get(c->lp, "tokens");
        json_t *last = json_array_get(toks, json_array_size(toks) - 1);
        m3_sbuf t = {0};
        if (!last || m3_sbuf_add(&t, json_string_value(last), json_string_length(last)) || m3_sbuf_add(&t, p, n) ||
            json_array_set_new(toks, json_array_size(toks) - 1, json_stringn(t.p, t.n)))
            mark_failed(h, NOMEM);
        free(t.p);
    }
    if (h->stream && !h->failed) {
        size_t elen;
        const char *et = echo_of(h, c->index, &elen);
        send_chunk(h, c->index, json_stringn(et ? et : "", et ? elen : 0), lp_take(c, 1), NULL);
    }
}

/* One prompt position's logprobs (pos >= 1, in order, before the choice's first token). */
static void on_prompt_item(srv *s, choice *c, int pos, const m3_sample_out *so) {
    hreq *h = c->h;
    if (h->closed) return;
    c->plp_got++;
    if (c->plp) {
        json_t *d = plp_entry(s, so, h->prompt_logprobs);
        if (!d || json_array_append_new(c->plp, d)) { mark_failed(h, NOMEM); return; }
    }
    if (h->echo_lp && echo_entry(s, c, so->token, so)) { mark_failed(h, NOMEM); return; }
    if (pos == c->n_prompt_toks - 1) prompt_done(c);
}

/* Passes parsed deltas on: a stream chunk, or the non-stream accumulators. */
static void emit_deltas(choice *c, const m3_out_delta *d, size_t n) {
    hreq *h = c->h;
    if (!n && h->api != SRV_API_RESPONSES) return; /* (responses.c: where the logprobs of a token of no text go) */
    if (h->api == SRV_API_ANTHROPIC) { /* content blocks (anthropic.c) */
        srv_anth_deltas(c, d, n);
        return;
    }
    if (h->api == SRV_API_RESPONSES) { /* output items (responses.c) */
        srv_resp_deltas(c, d, n);
        return;
    }
    if (h->stream) {
        send_chunk(h, c->index, m3_out_delta_json(d, n), lp_take(c, 0), NULL);
        return;
    }
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i].kind == M3_OUT_CONTENT) bad |= m3_sbuf_add(&c->content, d[i].text, d[i].len) != 0;
        else if (d[i].kind == M3_OUT_REASONING) bad |= m3_sbuf_add(&c->reasoning, d[i].text, d[i].len) != 0;
        else if (d[i].kind == M3_OUT_TOOL_BEGIN) {
            if (!c->tools && !(c->tools = json_array())) { bad = 1; continue; }
            bad |= json_array_append_new(c->tools, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", d[i].id, "type", "function",
                                                             "function", "name", d[i].name, "arguments", "")) != 0;
        } else if (d[i].kind == M3_OUT_TOOL_ARGS && c->tools) {
            json_t *f = json_object_get(json_array_get(c->tools, json_array_size(c->tools) - 1), "function");
            const char *old = json_string_value(json_object_get(f, "arguments"));
            m3_sbuf a = {0};
            if (!f || m3_sbuf_add(&a, old ? old : "", old ? strlen(old) : 0) || m3_sbuf_add(&a, d[i].text, d[i].len) ||
                json_object_set_new(f, "arguments", json_stringn_nocheck(a.p, a.n)))
                bad = 1;
            free(a.p);
        }
    }
    if (bad) mark_failed(h, NOMEM);
}

/* Text that passed the stop-string check goes through the chat parsers (or straight out). */
static void emit_text(choice *c, const char *p, size_t n, int final) {
    const m3_out_delta *d = NULL;
    size_t nd = 0;
    m3_err err;
    if (c->out) { /* the tool-call parser parses argument values with jansson: no injection there (fault.h) */
        if (n) {
            m3_fault_suspend(1);
            int rc = m3_out_feed(c->out, p, n, &d, &nd, &err);
            m3_fault_suspend(0);
            if (rc) mark_failed(c->h, NOMEM);
            else emit_deltas(c, d, nd);
        }
        if (final) {
            m3_fault_suspend(1);
            int rc = m3_out_finish(c->out, &d, &nd, &err);
            m3_fault_suspend(0);
            if (rc) mark_failed(c->h, NOMEM);
            else emit_deltas(c, d, nd);
        }
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

/* the error a choice ended with: 503 when cancelled by the shutdown, 500 when it failed */
static int choice_error(const hreq *h, const choice *c, const char **why) {
    if (c->finish_reason == M3_FINISH_CANCELLED) {
        *why = M3_SERVER_CANCELLED;
        return 503;
    }
    *why = h->failed ? h->failed : c->eng_err ? c->eng_err : "generation failed";
    return 500;
}

/* Non-stream: the whole response, or an error when a choice failed or was cancelled. */
static int send_final(hreq *h) {
    srv *s = h->s;
    for (int i = 0; i < h->n; i++) {
        choice *c = &h->ch[i];
        const char *why;
        if (c->finish_reason == M3_FINISH_CANCELLED || c->finish_reason == M3_FINISH_ERROR || h->failed) {
            int code = choice_error(h, c, &why);
            return srv_send_error(h->req, code, code == 503 ? "service_unavailable_error" : "server_error", "%s%s",
                                  code == 503 ? "" : "generation failed: ", why);
        }
    }
    if (h->api == SRV_API_ANTHROPIC) return srv_anth_final(h);
    if (h->api == SRV_API_RESPONSES) return srv_resp_final(h);
    json_t *choices = json_array();
    int bad = !choices;
    for (int i = 0; choices && i < h->n; i++) {
        choice *c = &h->ch[i];
        json_t *ch, *lp = lp_take(c, 1);
        if (h->chat) {
            size_t elen = 0;
            const char *et = echo_of(h, i, &elen); /* vLLM's echo: the last message's content first */
            m3_sbuf t = {0};
            if (et) bad |= m3_sbuf_add(&t, et, elen) != 0;
            bad |= m3_sbuf_add(&t, c->content.p ? c->content.p : "", c->content.n) != 0;
            json_t *msg = json_pack("{s:s,s:s%}", "role", h->role, "content", t.p ? t.p : "", t.n);
            free(t.p);
            if (msg && c->reasoning.p) /* vLLM's current field, and the one older clients read */
                bad |= json_object_set_new(msg, "reasoning", json_stringn(c->reasoning.p, c->reasoning.n)) != 0 ||
                       json_object_set_new(msg, "reasoning_content", json_stringn(c->reasoning.p, c->reasoning.n)) != 0;
            if (msg && c->tools) bad |= json_object_set(msg, "tool_calls", c->tools) != 0;
            bad |= !msg;
            ch = json_pack("{s:i,s:o,s:o,s:s}", "index", i, "message", msg ? msg : json_object(), "logprobs",
                           lp ? lp : json_null(), "finish_reason", finish_str(c));
            if (ch && h->return_ids) bad |= json_object_set(ch, "token_ids", c->tids) != 0; /* vLLM's */
        } else {
            m3_sbuf t = {0};
            size_t elen;
            const char *et = echo_of(h, i, &elen);
            if (et) bad |= m3_sbuf_add(&t, et, elen) != 0;
            bad |= m3_sbuf_add(&t, c->content.p ? c->content.p : "", c->content.n) != 0;
            ch = json_pack("{s:i,s:s%,s:o,s:s}", "index", i, "text", t.p ? t.p : "", t.n, "logprobs", lp ? lp : json_null(),
                           "finish_reason", finish_str(c));
            free(t.p);
            if (ch && c->plp) bad |= json_object_set(ch, "prompt_logprobs", c->plp) != 0; /* vLLM's, a choice's */
            if (ch && h->return_ids) /* vLLM's: its prompt's ids and its own */
                bad |= json_object_set_new(ch, "prompt_token_ids", prompt_ids_json(h, i / h->n_per)) != 0 ||
                       json_object_set(ch, "token_ids", c->tids) != 0;
        }
        bad |= json_array_append_new(choices, ch) != 0;
    }
    char id[160];
    snprintf(id, sizeof id, "%s-%s", h->chat ? "chatcmpl" : "cmpl", h->id_sfx);
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", id, "object", h->chat ? "chat.completion" : "text_completion",
                          "created", (json_int_t)h->created, "model", s->o->model_name, "choices", choices, "usage",
                          usage_json(h));
    if (j && h->chat && h->ch[0].plp) bad |= json_object_set(j, "prompt_logprobs", h->ch[0].plp) != 0; /* vLLM's, the request's */
    if (j && h->chat && h->return_ids) bad |= json_object_set_new(j, "prompt_token_ids", prompt_ids_json(h, 0)) != 0;
    if (bad || h->failed) { /* a part is missing: no truncated answer */
        json_decref(j);
        return srv_send_error(h->req, 500, "server_error", "generation failed: %s", h->failed ? h->failed : NOMEM);
    }
    return srv_send_json(h->req, 200, j); /* NULL j: a 500 */
}

static void finish_response(hreq *h) {
    srv *s = h->s;
    double t = m3_now();
    int status = 499; /* nginx's "client closed request" */
    if (!h->closed && h->req) {
        if (h->stream && h->api != SRV_API_OPENAI) { /* its events ended with message_stop / response.completed (or an error) */
            if (h->failed) sse_error(h, 500, "server_error", h->failed);
            http_req *req = h->req;
            h->req = NULL;
            h->replied = 1;
            http_reply_end(req);
            status = 200;
        } else if (h->stream) {
            if (h->include_usage && !h->failed) {
                json_t *c = chunk_base(h), *u = usage_json(h);
                if (!c || !u || json_object_set_new(c, "choices", json_array())) { /* u not taken yet */
                    json_decref(u);
                    json_decref(c);
                    mark_failed(h, NOMEM);
                } else if (json_object_set_new(c, "usage", u)) { /* takes u even when it fails */
                    json_decref(c);
                    mark_failed(h, NOMEM);
                } else sse_send(h, c);
            }
            if (h->failed) sse_error(h, 500, "server_error", h->failed);
            http_reply_chunk(h->req, "data: [DONE]\n\n", 14);
            http_req *req = h->req;
            h->req = NULL; /* the request is http.h's now: on_flushed or conn_closed follow */
            h->replied = 1;
            http_reply_end(req);
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
    const char *what = h->api == SRV_API_ANTHROPIC ? "POST /v1/messages"
                       : h->api == SRV_API_RESPONSES ? "POST /v1/responses"
                       : h->chat                   ? "POST /v1/chat/completions"
                                                   : "POST /v1/completions";
    srv_log(s, h->serial, what, status, h->n_prompt, completion, h->t_first > 0 ? h->t_first - h->t0 : -1, t - h->t0);
}

/* A choice is complete: flush its parsers, tell a stream client, and answer when it was the last. */
static void choice_end(choice *c, int reason) {
    hreq *h = c->h;
    c->done = 1;
    c->finish_reason = reason;
    h->n_done++;
    h->s->m.finished[reason]++;
    if (!h->closed && !h->failed) {
        if (reason == M3_FINISH_CANCELLED || reason == M3_FINISH_ERROR) { /* text held back for stop strings */
            if (c->text.n > c->emitted) emit_text(c, c->text.p + c->emitted, c->text.n - c->emitted, 0);
            c->emitted = c->text.n;
        }
        emit_text(c, NULL, 0, 1);
        if (h->stream && !h->failed && h->api != SRV_API_OPENAI) {
            /* an error (or the shutdown's cancel) ends the stream with an error event, in place of the message's end */
            if (reason == M3_FINISH_ERROR || reason == M3_FINISH_CANCELLED) {
                const char *why;
                int code = choice_error(h, c, &why);
                sse_error(h, code, "server_error", why);
            } else if (h->api == SRV_API_ANTHROPIC) srv_anth_stream_end(c);
            else srv_resp_stream_end(c);
        } else if (h->stream && !h->failed) {
            if (reason == M3_FINISH_ERROR) {
                const char *why;
                choice_error(h, c, &why);
                sse_error(h, 500, "server_error", why);
            }
            send_chunk(h, c->index, h->chat ? json_object() : json_string(""), lp_take(c, 0), finish_str(c));
        }
    }
    if (h->n_done == h->n && !h->failed) finish_response(h);
}

/* The response cannot be completed (h->failed): every choice still open is cancelled and
 * counted as failed, and the response ends with the error. */
static void fail_response(hreq *h) {
    if (h->replied) return;
    cancel_open(h);
    for (int i = 0; i < h->n; i++) {
        choice *c = &h->ch[i];
        if (c->done) continue;
        c->done = 1;
        c->finish_reason = M3_FINISH_ERROR;
        h->n_done++;
        h->s->m.finished[M3_FINISH_ERROR]++;
    }
    finish_response(h);
}

/* One generated token of choice c. */
static void on_token(srv *s, choice *c, const m3_sample_out *so, int finished, int reason) {
    hreq *h = c->h;
    double t = m3_now();
    c->n_gen++;
    s->m.generation_tokens++;
    if (h->return_ids && (!c->tids || json_array_append_new(c->tids, json_integer(so->token)))) mark_failed(h, NOMEM);
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
    if (!stop_tok && m3_tok_stream_push(c->ts, so->token, &p, &n, &err)) {
        mark_failed_err(h, &err); /* an id the tokenizer refuses, or no memory: say which */
        return;
    }
    if (!stop_tok && n && m3_sbuf_add(&c->text, p, n)) {
        mark_failed(h, NOMEM);
        return;
    }
    if (finished) {
        m3_tok_stream_finish(c->ts, &p, &n);
        if (n && m3_sbuf_add(&c->text, p, n)) { mark_failed(h, NOMEM); return; }
    }
    int not_text = h->api == SRV_API_RESPONSES && srv_resp_token(c, so->token); /* (reasoning: not the message's) */
    /* a stop token has no text, but completions list its logprob (as vLLM and OpenAI do: clients
     * such as lm-evaluation-harness read the entries after the prompt's, the last one the token
     * generated); its entry's text is what the decoder still held back (usually nothing), so the
     * entries keep adding up to the text; chat leaves it out */
    if ((!stop_tok || !h->chat) && !not_text) lp_add(s, c, so, c->text.p ? c->text.p + before : "", c->text.n - before);
    size_t upto = c->text.n;
    int hit = 0;
    if (c->stop && c->n_gen > h->min_tokens) { /* min_tokens holds stop strings back too (vLLM) */
        m3_stop_match m;
        if (m3_stop_scan(c->stop, c->text.p ? c->text.p : "", c->text.n, c->checked, &m)) {
            upto = h->include_stop ? m.end : m.start;
            hit = 1;
            c->stop_hit = 1; /* Anthropic's answer names the string (stop_sequence) */
            c->stop_start = m.start;
            c->stop_end = m.end;
        }
        else if (!finished) upto = m.safe;
    }
    c->checked = c->text.n;
    if (upto > c->emitted) {
        emit_text(c, c->text.p + c->emitted, upto - c->emitted, 0);
        c->emitted = upto;
    }
    if (h->failed) return;
    /* at most one call: the choice ends once the first call's arguments are complete */
    if (!hit && !finished && h->one_call && c->out && m3_out_tool_calls_done(c->out) > 0) hit = 1;
    if (hit) {
        choice_cancel(c);
        choice_end(c, M3_FINISH_STOP);
    } else if (finished) choice_end(c, reason);
}

void srv_handle_item(srv *s, qitem *it) {
    choice *c = it->c;
    hreq *h = c->h;
    h->busy++;
    if (it->finished && !c->engine_ended) { c->engine_ended = 1; h->n_open--; c->cancel_pending = 0; }
    if (atomic_load(&c->lost) && !c->done) mark_failed(h, "an engine record was lost (out of memory)");
    if (!c->done && !h->failed) {
        if (it->ppos) on_prompt_item(s, c, it->ppos, &it->so);
        else if (it->has_tok) on_token(s, c, &it->so, it->finished, it->reason);
        else if (it->finished) choice_end(c, it->reason); /* cancelled or failed without a token */
    }
    if (h->failed) fail_response(h);
    h->busy--;
    hreq_release(h);
}

/* ------------------------------------------------------------------ submission */

/* engine thread, before the final record of a choice the engine failed (msg: valid during the call) */
static void on_error(void *arg, uint64_t id, const char *msg) {
    (void)id;
    choice *c = arg;
    snprintf(c->eng_err_buf, sizeof c->eng_err_buf, "%s", msg ? msg : "the engine failed");
    c->eng_err = c->eng_err_buf;
}

/* engine thread, before the first output of a choice */
static void on_admit(void *arg, uint64_t id, int cached) {
    (void)id;
    atomic_store(&((choice *)arg)->n_cached, cached);
}

/* engine thread */
static void on_output(void *arg, uint64_t id, const m3_sample_out *out, int finished, int reason) {
    (void)id;
    choice *c = arg;
    qitem it = {c, {0}, out != NULL, finished, reason, 0};
    if (out) it.so = *out;
    srv_push(c->h->s, &it);
}

/* engine thread: a prompt position's logprobs */
static void on_prompt(void *arg, uint64_t id, int pos, const m3_sample_out *out) {
    (void)id;
    choice *c = arg;
    qitem it = {c, *out, 0, 0, 0, pos};
    srv_push(c->h->s, &it);
}

/* a choice's output parser, its tool call ids unique to the response: call_<response id>_<index>
 * (toolu_... for Anthropic's API, as its clients know them) */
static m3_out *out_new(const hreq *h, const m3_oai_params *g, m3_err *err) {
    char prefix[48];
    snprintf(prefix, sizeof prefix, "%s%.24s_", h->api == SRV_API_ANTHROPIC ? "toolu_" : "call_", h->rid);
    m3_out_opts oo = g->oo;
    oo.id_prefix = prefix;
    return m3_out_new(&oo, g->tools, err);
}

static int start(srv *s, http_req *req, int chat, int api, m3_oai_params *g, m3_engine_images *images, int n_img,
                 size_t *px_bytes, unsigned long serial, double t0, m3_resp_req *resp) {
    m3_err err;
    hreq *h = srv_calloc(1, sizeof *h);
    if (!h || !(h->ch = srv_calloc((size_t)g->n * (size_t)g->n_prompts, sizeof *h->ch))) {
        free(h);
        return srv_send_error(req, 500, "server_error", "out of memory");
    }
    h->s = s;
    srv_random_hex(h->rid, sizeof h->rid); /* response ids never repeat, across restarts too */
    h->px_bytes = *px_bytes; /* hreq_free gives it back, whatever happens from here */
    *px_bytes = 0;
    h->req = req;
    h->serial = serial;
    h->chat = chat;
    h->api = api;
    h->stream = g->stream;
    h->include_usage = g->include_usage;
    h->continuous_usage = g->continuous_usage;
    h->include_stop = g->include_stop;
    h->n_per = (int)g->n;
    h->n = (int)g->n * g->n_prompts;
    h->echo = g->echo;
    h->logprobs = g->logprobs;
    h->top_logprobs = (int)g->top_logprobs;
    h->prompt_logprobs = g->prompt_logprobs;
    h->echo_lp = !chat && g->echo && g->logprobs;
    h->ids_as_tokens = g->ids_as_tokens;
    snprintf(h->role, sizeof h->role, "%s", g->role[0] ? g->role : "assistant");
    h->return_ids = g->return_ids;
    { /* the response's id: vLLM's, the X-Request-Id header's, else the body's request_id, else a random one */
        const char *xr = srv_request_id(req);
        snprintf(h->id_sfx, sizeof h->id_sfx, "%s", xr ? xr : g->request_id[0] ? g->request_id : h->rid);
    }
    if (h->return_ids) {
        memcpy(h->pid_off, g->prompt_off, sizeof h->pid_off);
        if (!(h->pids = srv_malloc(sizeof *h->pids * (g->n_ids ? g->n_ids : 1)))) {
            hreq_free(h);
            return srv_send_error(req, 500, "server_error", "out of memory");
        }
        memcpy(h->pids, g->ids, sizeof *h->pids * g->n_ids);
    }
    h->min_tokens = (int)g->min_tokens;
    h->n_prompt = (int)g->n_ids;
    h->created = (long)time(NULL);
    h->t0 = t0;
    h->echo_text = g->echo_text;
    h->echo_len = g->echo_len;
    memcpy(h->echo_off, g->echo_off, sizeof h->echo_off);
    g->echo_text = NULL;
    int rc = 0;
    if (resp) { /* the Responses API's request fields, for its response object (responses.c) */
        h->r_echo = resp->echo;
        h->r_turn = resp->turn;
        h->r_items = resp->items;
        resp->echo = resp->turn = resp->items = NULL;
        h->r_store = resp->store;
        /* reasoning tokens are counted by their tags: from the start (thinking enabled) or from an
         * opening tag (adaptive) to the closing one */
        h->r_think_open = g->oo.reasoning ? m3_tok_token_to_id(s->tok, "<mm:think>") : -1;
        h->r_think_end = g->oo.reasoning ? m3_tok_token_to_id(s->tok, "</mm:think>") : -1;
        if (resp->previous_id && !(h->r_prev = strdup(resp->previous_id)))
            rc = srv_send_error(req, 500, "server_error", "out of memory");
    }
    for (int i = 0; i < h->n && !rc; i++) {
        choice *c = &h->ch[i];
        c->h = h;
        c->index = i;
        size_t elen;
        const char *et = echo_of(h, i, &elen);
        c->echo_chars = et ? utf8_chars(et, elen) : 0; /* (generated tokens' text_offset starts after it) */
        c->r_reason = !resp || !g->oo.reasoning || g->oo.thinking == M3_THINK_DISABLED ? -1
                      : h->r_think_end < 0 ? 2 /* no single-token tags: counted by the parser's output */
                      : g->oo.thinking == M3_THINK_ENABLED ? 1 : 0;
        /* special tokens' text left out, unless skip_special_tokens is false (a stop token's always is) */
        if (!(c->ts = m3_tok_stream_new(s->tok, !g->keep_special, &err))) rc = srv_send_error(req, 500, "server_error", "%s", err.msg);
        else if (g->n_stop_strs && !(c->stop = m3_stop_create(g->stop_strs, g->n_stop_strs, NULL, 0, &err)))
            rc = srv_send_error(req, 500, "server_error", "%s", err.msg); /* checked strings: out of memory */
        else if (chat && !(c->out = out_new(h, g, &err))) /* memory is the server's (500), bad tools the request's */
            rc = err.oom ? srv_send_error(req, 500, "server_error", "%s", err.msg) : SRV_BAD(req, "%s", err.msg);
        else if (h->logprobs && !(c->lp = lp_new(h))) rc = srv_send_error(req, 500, "server_error", "out of memory");
        else if (h->return_ids && !(c->tids = json_array())) rc = srv_send_error(req, 500, "server_error", "out of memory");
        else if (h->prompt_logprobs >= 0 && (!chat || i == 0) && !(c->plp = json_pack("[n]")))
            rc = srv_send_error(req, 500, "server_error", "out of memory");
        else if (h->echo_lp) { /* the prompt's first token leads, without a logprob */
            const int p = i / h->n_per;
            c->n_prompt_toks = (int)(g->prompt_off[p + 1] - g->prompt_off[p]);
            if (!(c->pts = m3_tok_stream_new(s->tok, 0, &err))) rc = srv_send_error(req, 500, "server_error", "%s", err.msg);
            else if (echo_entry(s, c, g->ids[g->prompt_off[p]], NULL))
                rc = srv_send_error(req, 500, "server_error", "cannot decode the prompt (out of memory?)");
        }
    }
    if (rc) { hreq_free(h); return rc; }

    /* min_tokens holds back every id that would end the request */
    int32_t min_ids[M3_OAI_MAX_STOP_IDS + 2];
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
    sp->logprobs = h->logprobs; /* a full-vocabulary log-softmax per token: only when asked */
    sp->n_text = s->n_text;     /* ids no token spells are never sampled */
    sp->banned_ids = s->holes;
    sp->n_banned = s->n_holes;
    sp->allowed_ids = g->allowed; /* vLLM's allowed_token_ids */
    sp->n_allowed = (int)g->n_allowed;
    sp->bad_words = g->bad_ids; /* vLLM's bad_words */
    sp->bad_word_off = g->bad_off;
    sp->n_bad_words = g->n_bad;
    sp->top_logprobs = h->top_logprobs;
    if (g->think_on) { /* vLLM's thinking_token_budget */
        sp->think_on = 1;
        sp->think_from = g->think_from;
        sp->think_start_id = g->think_open;
        sp->think_end_id = g->think_close;
        sp->think_budget = (int)g->think_budget;
    }
    er.max_tokens = (int)g->max_tokens;
    er.stop_ids = g->stop_ids;
    er.n_stop_ids = (int)g->n_stop_ids;
    er.ignore_eos = g->ignore_eos;
    er.on_output = on_output;
    er.on_error = on_error;
    er.on_admit = on_admit;
    /* vLLM's list takes prompt_logprobs alternatives, echo's entries logprobs of them */
    er.prompt_top = h->echo_lp && h->top_logprobs > h->prompt_logprobs ? h->top_logprobs : h->prompt_logprobs;
    er.images = images; /* made by the preparation thread; shared by the n choices, each engine request takes a reference */
    er.grammar = g->grammar; /* structured output (structured.c): each engine request takes a reference */
    er.grammar_start_id = g->g_start;
    er.grammar_open_id = g->g_open;
    er.priority = g->priority;
    er.cache_salt = g->cache_salt; /* (read by m3_engine_add) */
    er.cache_salt_len = g->cache_salt_len;
    /* parallel_tool_calls false without a forced call: the output is free, a choice ends at its first call */
    h->one_call = chat && !g->parallel_tool_calls && g->constraint != M3_OAI_C_TOOLS && g->oo.tools;

    /* on the live list first: the engine may report before the loop below ends */
    h->next = s->live;
    if (s->live) s->live->prev = h;
    s->live = h;
    s->n_live++;
    h->busy++;
    uint64_t base = (s->o->has_seed ? s->o->seed : (uint64_t)time(NULL)) * 6364136223846793005ull +
                    ++s->seed_ctr * 1442695040888963407ull;
    for (int i = 0; i < h->n; i++) {
        /* choice j of every prompt draws as choice j of a request of that prompt alone would */
        const int p = i / h->n_per, j = i % h->n_per;
        er.prompt = g->ids + g->prompt_off[p];
        er.n_prompt = (int)(g->prompt_off[p + 1] - g->prompt_off[p]);
        h->ch[i].n_prompt_toks = er.n_prompt;
        sp->seed = g->has_seed ? (uint64_t)g->seed + (uint64_t)j : base + (uint64_t)i * 0x9e3779b97f4a7c15ull;
        er.on_prompt = h->ch[i].plp || h->echo_lp ? on_prompt : NULL; /* (chat: the first choice's, for all) */
        er.arg = &h->ch[i];
        h->ch[i].id = m3_engine_add(s->e, &er, &err);
        /* the parameters were checked: what is left is the engine out of memory */
        if (!h->ch[i].id) { rc = srv_send_error(req, 500, "server_error", "%s", err.msg); break; }
        h->n_open++;
    }
    if (rc) { /* the choices already queued end as cancelled; h goes when they have */
        cancel_open(h);
        for (int i = 0; i < h->n; i++) h->ch[i].done = 1;
        h->req = NULL;
        h->replied = h->flushed = 1;
        h->busy--;
        hreq_release(h);
        return rc;
    }
    s->m.prompt_tokens += g->n_ids;
    s->m.images += (uint64_t)n_img;
    if (h->stream) {
        http_add_header(req, "Cache-Control", "no-cache");
        http_reply_start(req, 200, "text/event-stream");
        h->t_write = m3_now();
        if (api == SRV_API_ANTHROPIC) srv_anth_start(h);
        if (api == SRV_API_RESPONSES) srv_resp_start(h);
        for (int i = 0; i < h->n && api == SRV_API_OPENAI; i++) {
            if (chat) {
                send_chunk(h, i, json_pack("{s:s,s:s}", "role", h->role, "content", ""), NULL, NULL);
                size_t elen;
                const char *et = echo_of(h, i, &elen); /* vLLM's echo: the last message's content, a chunk of its own */
                if (et && elen) send_chunk(h, i, json_pack("{s:s%}", "content", et, elen), NULL, NULL);
            } else if (!h->echo_lp) { /* (with logprobs, the echo goes once its prompt's entries are in: prompt_done) */
                size_t elen;
                const char *et = echo_of(h, i, &elen);
                if (et) send_chunk(h, i, json_stringn(et, elen), NULL, NULL);
            }
        }
    }
    for (int i = 0; i < h->n && h->echo_lp; i++) /* a one-token prompt has no positions to wait for */
        if (h->ch[i].n_prompt_toks == 1) prompt_done(&h->ch[i]);
    http_req_on(req, on_flushed, conn_closed, h);
    if (h->failed) fail_response(h);
    h->busy--;
    hreq_release(h);
    return 0;
}

int srv_generate_start(srv *s, http_req *req, int chat, int api, m3_oai_params *g, m3_engine_images *images,
                       int n_images, size_t *px_bytes, unsigned long serial, double t0, m3_resp_req *resp) {
    m3_engine_stats st;
    m3_engine_get_stats(s->e, &st);
    if (st.waiting >= s->o->max_waiting) {
        s->m.requests_rejected_overload++;
        return srv_send_error(req, 429, "rate_limit_error", "the server is busy: %d requests are waiting (limit %d); retry later",
                              st.waiting, s->o->max_waiting);
    }
    return start(s, req, chat, api, g, images, n_images, px_bytes, serial, t0, resp);
}
