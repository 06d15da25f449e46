/* m3 serve: POST /v1/responses output in the Responses API's shapes, and the stored
 * responses (see srv.h, responses.h, resp_store.h).
 *
 * The request was translated to a chat completion (responses_req.c) and runs as one: the
 * engine and the output parsers are generate.c's. The parsers' deltas become output items in
 * the order generated: reasoning -> a reasoning item (its text as reasoning_text content),
 * content -> a message item (one output_text part), each tool call -> a function_call item
 * (call_id, name, arguments as JSON text). An item closes when output of another kind begins.
 *
 * Stream: named SSE events, each with its sequence_number: response.created and
 * response.in_progress; per item output_item.added, (reasoning, message) content_part.added,
 * its deltas (reasoning_text.delta, output_text.delta, function_call_arguments.delta: the text
 * of one engine record in one event), their .done, content_part.done, output_item.done; at the
 * end response.completed, or response.incomplete when max_output_tokens ended it. A failure
 * mid-stream is response.failed (status failed, error {code, message}) and the stream ends.
 * Non-stream: the response object with the same items.
 *
 * Stored: with store (the default) and a store (--responses-store), the completed or
 * incomplete response is kept with what it added to its conversation (its input and its
 * output as chat messages), for previous_response_id and GET /v1/responses/{id}.
 *
 * Failures (no memory for a piece of output) mark the request failed as generate.c does: its
 * response then ends with an error, never with a gap. */
#include "srv.h"
#include "resp_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/queue.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

static const char NOMEM[] = "out of memory while building the response";

enum { RI_NONE = 0, RI_REASONING, RI_MESSAGE, RI_CALL };

static void fail(hreq *h, const char *why) {
    if (!h->failed) h->failed = why;
}

void srv_resp_free(hreq *h) {
    json_decref(h->r_echo);
    json_decref(h->r_turn);
    json_decref(h->r_items);
    free(h->r_prev);
    h->r_echo = h->r_turn = h->r_items = NULL;
    h->r_prev = NULL;
}

int srv_resp_token(choice *c, int32_t t) {
    const hreq *h = c->h;
    if (c->r_reason == 0) c->r_reason = t == h->r_think_open && t >= 0 && c->n_gen == 1 ? 1 : -1; /* adaptive: opened first, or never */
    if (c->r_reason != 1) /* a leading bare closing tag, which the parser drops, is no text of the message either */
        return c->n_gen == 1 && t == h->r_think_end && t >= 0 && c->r_reason != 2;
    c->r_reason_toks++;
    if (t == h->r_think_end) c->r_reason = -1;
    return 1;
}

/* ------------------------------------------------------------------ events */

/* one named event: j gets its type and sequence_number (j taken; NULL fails the request).
 * Once the request has failed nothing but response.failed follows: never an event after a gap. */
static void ev(hreq *h, const char *type, json_t *j) {
    if (!h->req || h->failed) { json_decref(j); return; }
    if (!j || json_object_set_new(j, "type", json_string(type)) ||
        json_object_set_new(j, "sequence_number", json_integer(h->r_seq))) {
        json_decref(j);
        fail(h, NOMEM);
        return;
    }
    h->r_seq++;
    size_t n = 0;
    char *txt = srv_json_text(j, &n);
    json_decref(j);
    struct iovec v[5] = {{(void *)"event: ", 7}, {(void *)type, strlen(type)}, {(void *)"\ndata: ", 7}, {txt, n},
                         {(void *)"\n\n", 2}};
    if (!txt) h->r_seq--; /* not sent: its number is the next event's (the failure event's) */
    if (!txt || http_reply_chunkv(h->req, v, 5)) fail(h, NOMEM);
    else h->t_write = m3_now();
    free(txt);
}

/* ------------------------------------------------------------------ the response object */

static void resp_id(const hreq *h, char *buf, size_t cap) { snprintf(buf, cap, "resp_%s", h->rid); }

static void item_id(const choice *c, char *buf, size_t cap) {
    static const char *const pre[] = {"", "rs", "msg", "fc"};
    snprintf(buf, cap, "%s_%s_%d", pre[c->ab_kind], c->h->rid, c->ab_n - 1);
}

static json_t *usage_json(const choice *c) {
    const hreq *h = c->h;
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", h->n_prompt, "input_tokens_details", "cached_tokens",
                     c->n_cached, "output_tokens", c->n_gen, "output_tokens_details", "reasoning_tokens", c->r_reason_toks,
                     "total_tokens", h->n_prompt + c->n_gen);
}

/* The response object: the request's fields (r_echo), then what this response is. status:
 * in_progress (usage null), completed, incomplete, failed. output taken; NULL when out of
 * memory (a NULL output too). */
static json_t *resp_object(const hreq *h, const char *status, json_t *output, const char *error) {
    char id[48];
    resp_id(h, id, sizeof id);
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", id, "object", "response", "created_at", (json_int_t)h->created,
                          "status", status, "model", h->s->o->model_name);
    const char *k;
    json_t *v;
    int bad = !o;
    if (o)
        json_object_foreach(h->r_echo, k, v) bad |= json_object_set(o, k, v) != 0;
    int incomplete = !strcmp(status, "incomplete");
    if (!o) json_decref(output); /* else set_new takes it, also when it fails */
    bad |= !o || !output || json_object_set_new(o, "output", output) != 0;
    bad |= !o || json_object_set_new(o, "usage", strcmp(status, "in_progress") ? usage_json(&h->ch[0]) : json_null()) != 0;
    bad |= !o || json_object_set_new(o, "incomplete_details",
                                     incomplete ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null()) != 0;
    bad |= !o || json_object_set_new(o, "error", error ? json_pack("{s:s,s:s}", "code", "server_error", "message", error)
                                                       : json_null()) != 0;
    if (strcmp(status, "in_progress") && strcmp(status, "failed"))
        bad |= !o || json_object_set_new(o, "completed_at", json_integer((json_int_t)time(NULL))) != 0;
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

void srv_resp_start(hreq *h) {
    ev(h, "response.created", json_pack("{s:o}", "response", resp_object(h, "in_progress", json_array(), NULL)));
    ev(h, "response.in_progress", json_pack("{s:o}", "response", resp_object(h, "in_progress", json_array(), NULL)));
}

/* ------------------------------------------------------------------ items */

/* stream: the open item's text not sent yet, as one delta event; a message's carries the
 * logprob entries not sent yet (force: also with no text, as the message closes) */
static void flush(choice *c, int force) {
    hreq *h = c->h;
    int pend = c->ab_kind == RI_MESSAGE && json_array_size(c->r_lp_pend) > 0;
    if (!h->stream || !c->ab_kind || (c->ab_text.n <= c->r_sent && !(force && pend))) return;
    char iid[64];
    item_id(c, iid, sizeof iid);
    const char *p = c->ab_text.p ? c->ab_text.p + c->r_sent : "";
    size_t n = c->ab_text.n - c->r_sent;
    c->r_sent = c->ab_text.n;
    if (c->ab_kind == RI_REASONING)
        ev(h, "response.reasoning_text.delta",
           json_pack("{s:s,s:i,s:i,s:s%}", "item_id", iid, "output_index", c->ab_n - 1, "content_index", 0, "delta", p, n));
    else if (c->ab_kind == RI_MESSAGE) {
        json_t *lp = pend ? c->r_lp_pend : json_array();
        if (pend) c->r_lp_pend = NULL;
        ev(h, "response.output_text.delta",
           json_pack("{s:s,s:i,s:i,s:s%,s:o}", "item_id", iid, "output_index", c->ab_n - 1, "content_index", 0, "delta", p, n,
                     "logprobs", lp));
    } else
        ev(h, "response.function_call_arguments.delta",
           json_pack("{s:s,s:i,s:s%}", "item_id", iid, "output_index", c->ab_n - 1, "delta", p, n));
}

/* logprob entries that belong to the open message: its list, and (stream) those not sent yet */
static void attach_lp(choice *c, json_t *lp) {
    hreq *h = c->h;
    if (!c->r_lp && !(c->r_lp = json_array())) fail(h, NOMEM);
    if (c->r_lp && json_array_extend(c->r_lp, lp)) fail(h, NOMEM);
    if (!h->stream) return;
    if (!c->r_lp_pend && !(c->r_lp_pend = json_array())) fail(h, NOMEM);
    if (c->r_lp_pend && json_array_extend(c->r_lp_pend, lp)) fail(h, NOMEM);
}

static json_t *text_content(const choice *c, const char *type, int final) {
    const char *t = c->ab_text.p ? c->ab_text.p : "";
    size_t n = final ? c->ab_text.n : 0;
    if (!strcmp(type, "reasoning_text")) return json_pack("{s:s,s:s%}", "type", type, "text", t, n);
    return json_pack("{s:s,s:s%,s:[],s:o}", "type", type, "text", t, n, "annotations", "logprobs",
                     final && c->r_lp ? json_incref(c->r_lp) : json_array());
}

/* the open item as it stands (final: with its text, else empty as when it is added) */
static json_t *item_json(const choice *c, const char *status, int final) {
    char iid[64];
    item_id(c, iid, sizeof iid);
    switch (c->ab_kind) {
    case RI_REASONING: /* no status: OpenAI's reasoning items have none while they are not being written */
        return json_pack("{s:s,s:s,s:[],s:o}", "id", iid, "type", "reasoning", "summary", "content",
                         final ? json_pack("[o]", text_content(c, "reasoning_text", 1)) : json_array());
    case RI_MESSAGE:
        return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", iid, "type", "message", "status", status, "role", "assistant",
                         "content", final ? json_pack("[o]", text_content(c, "output_text", 1)) : json_array());
    default:
        return json_pack("{s:s,s:s,s:s,s:O,s:O,s:s%}", "id", iid, "type", "function_call", "status", status, "call_id",
                         json_object_get(c->ab_tool, "call_id"), "name", json_object_get(c->ab_tool, "name"), "arguments",
                         final && c->ab_text.p ? c->ab_text.p : "", final ? c->ab_text.n : 0);
    }
}

static void close_item(choice *c, const char *status) {
    hreq *h = c->h;
    if (!c->ab_kind) return;
    int k = c->ab_kind, oi = c->ab_n - 1;
    char iid[64];
    item_id(c, iid, sizeof iid);
    const char *t = c->ab_text.p ? c->ab_text.p : "";
    if (h->stream) {
        flush(c, 1);
        if (k == RI_REASONING || k == RI_MESSAGE) {
            ev(h, k == RI_REASONING ? "response.reasoning_text.done" : "response.output_text.done",
               k == RI_REASONING ? json_pack("{s:s,s:i,s:i,s:s%}", "item_id", iid, "output_index", oi, "content_index", 0, "text",
                                             t, c->ab_text.n)
                                 : json_pack("{s:s,s:i,s:i,s:s%,s:o}", "item_id", iid, "output_index", oi, "content_index", 0,
                                             "text", t, c->ab_text.n, "logprobs", c->r_lp ? json_incref(c->r_lp) : json_array()));
            ev(h, "response.content_part.done",
               json_pack("{s:s,s:i,s:i,s:o}", "item_id", iid, "output_index", oi, "content_index", 0, "part",
                         text_content(c, k == RI_REASONING ? "reasoning_text" : "output_text", 1)));
        } else
            ev(h, "response.function_call_arguments.done",
               json_pack("{s:s,s:i,s:O,s:s%}", "item_id", iid, "output_index", oi, "name", json_object_get(c->ab_tool, "name"),
                         "arguments", t, c->ab_text.n));
    }
    json_t *item = item_json(c, status, 1);
    if (!c->ab_blocks && !(c->ab_blocks = json_array())) fail(h, NOMEM);
    if (!item || !c->ab_blocks || json_array_append(c->ab_blocks, item)) fail(h, NOMEM);
    if (h->stream) ev(h, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", oi, "item", item));
    else json_decref(item);
    json_decref(c->ab_tool);
    c->ab_tool = NULL;
    json_decref(c->r_lp);
    json_decref(c->r_lp_pend);
    c->r_lp = c->r_lp_pend = NULL;
    c->ab_kind = RI_NONE;
    c->ab_text.n = 0;
    c->r_sent = 0;
}

static void open_item(choice *c, int kind, const m3_out_delta *d) {
    hreq *h = c->h;
    close_item(c, "completed");
    c->ab_kind = kind;
    c->ab_n++;
    if (kind == RI_CALL) {
        c->ab_call = d->index;
        if (!(c->ab_tool = json_pack("{s:s,s:s}", "call_id", d->id, "name", d->name))) { fail(h, NOMEM); return; }
    }
    if (!h->stream) return;
    int oi = c->ab_n - 1;
    ev(h, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", oi, "item", item_json(c, "in_progress", 0)));
    if (kind != RI_CALL) {
        char iid[64];
        item_id(c, iid, sizeof iid);
        ev(h, "response.content_part.added",
           json_pack("{s:s,s:i,s:i,s:o}", "item_id", iid, "output_index", oi, "content_index", 0, "part",
                     text_content(c, kind == RI_REASONING ? "reasoning_text" : "output_text", 0)));
    }
}

/* the logprob entries of the tokens since the last call (generate.c keeps them in c->lp, in
 * the chat shape, which is the Responses API's too); NULL: none asked for */
static json_t *take_lp(choice *c) {
    if (!c->lp || !json_array_size(c->lp)) return NULL;
    json_t *a = c->lp;
    if (!(c->lp = json_array())) fail(c->h, NOMEM);
    return a;
}

void srv_resp_deltas(choice *c, const m3_out_delta *d, size_t n) {
    hreq *h = c->h;
    if (!n) { /* a token the parser keeps (markup): its logprobs wait for the text it turns out to be, or go with a call */
        if (c->ab_kind == RI_CALL) json_decref(take_lp(c));
        return;
    }
    if (c->r_reason == 2) /* no single-token tags to count by: the records that carry reasoning */
        for (size_t i = 0; i < n; i++)
            if (d[i].kind == M3_OUT_REASONING && d[i].len) { c->r_reason_toks++; break; }
    /* the logprobs of the tokens whose text this is go with the message's text; those of
     * reasoning and calls are not asked for */
    json_t *lp = take_lp(c);
    for (size_t i = 0; i < n && !h->failed; i++) {
        if (d[i].kind == M3_OUT_TOOL_BEGIN) {
            open_item(c, RI_CALL, &d[i]);
            continue;
        }
        if (d[i].kind == M3_OUT_TOOL_ARGS) {
            if (c->ab_kind != RI_CALL || c->ab_call != d[i].index) { /* the parser's order: arguments follow their call */
                fail(h, "tool call arguments arrived without their call");
                break;
            }
        } else {
            int kind = d[i].kind == M3_OUT_REASONING ? RI_REASONING : RI_MESSAGE;
            if (!d[i].len) continue;
            if (c->ab_kind != kind) open_item(c, kind, NULL);
            if (kind == RI_MESSAGE && lp) { /* before anything closes the message */
                attach_lp(c, lp);
                json_decref(lp);
                lp = NULL;
            }
        }
        if (m3_sbuf_add(&c->ab_text, d[i].text, d[i].len)) fail(h, NOMEM);
    }
    if (lp && c->ab_kind == RI_MESSAGE) attach_lp(c, lp); /* tokens of no text, inside the message */
    json_decref(lp);
    flush(c, 0);
}

/* ------------------------------------------------------------------ the end */

static const char *final_status(const choice *c) { return c->finish_reason == M3_FINISH_LENGTH ? "incomplete" : "completed"; }

/* What the response adds to its conversation: its input and one assistant message (its
 * reasoning, text and calls), as JSON text (malloc'd); NULL when out of memory. */
static char *turn_text(const hreq *h, size_t *len) {
    json_t *m = json_pack("{s:s}", "role", "assistant"), *calls = NULL;
    m3_sbuf text = {0}, reason = {0};
    size_t i;
    json_t *it;
    int bad = !m;
    json_array_foreach(h->ch[0].ab_blocks, i, it) {
        const char *t = json_string_value(json_object_get(it, "type"));
        json_t *part = json_array_get(json_object_get(it, "content"), 0);
        json_t *tx = json_object_get(part, "text");
        if (!strcmp(t, "reasoning")) bad |= m3_sbuf_add(&reason, json_string_value(tx), json_string_length(tx));
        else if (!strcmp(t, "message")) bad |= m3_sbuf_add(&text, json_string_value(tx), json_string_length(tx));
        else {
            if (!calls && !(calls = json_array())) { bad = 1; continue; }
            bad |= json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", json_object_get(it, "call_id"), "type",
                                                          "function", "function", "name", json_object_get(it, "name"),
                                                          "arguments", json_object_get(it, "arguments"))) != 0;
        }
    }
    bad |= !m || json_object_set_new(m, "content", json_stringn_nocheck(text.p ? text.p : "", text.n)) != 0;
    if (reason.n) bad |= !m || json_object_set_new(m, "reasoning_content", json_stringn_nocheck(reason.p, reason.n)) != 0;
    if (calls) bad |= !m || json_object_set(m, "tool_calls", calls) != 0;
    json_decref(calls);
    free(text.p);
    free(reason.p);
    json_t *all = bad ? NULL : json_copy(h->r_turn); /* a shallow copy: the messages are shared, read only */
    char *txt = NULL;
    if (all && json_array_size(all) == json_array_size(h->r_turn) && !json_array_append(all, m)) txt = srv_json_text(all, len);
    json_decref(all);
    json_decref(m);
    return txt;
}

/* Its input items as the API lists them, each with an id (the client's, else one of the
 * server's: msg_, fc_, fco_, rs_ + the response's random id + _in + the item's place) and
 * messages with a status: JSON text (malloc'd), NULL when out of memory. */
static char *items_text(const hreq *h, size_t *len) {
    json_t *a = json_array();
    size_t i;
    json_t *it;
    int bad = !a;
    json_array_foreach(h->r_items, i, it) {
        if (bad) break;
        json_t *x = json_object();
        const char *k, *t = json_string_value(json_object_get(it, "type"));
        json_t *v;
        bad |= !x;
        if (x)
            json_object_foreach(it, k, v) bad |= json_object_set(x, k, v) != 0;
        if (!bad && !json_is_string(json_object_get(it, "id"))) {
            char id[80];
            const char *pre = !t || !strcmp(t, "message") ? "msg" : !strcmp(t, "function_call") ? "fc"
                              : !strcmp(t, "function_call_output") ? "fco" : "rs";
            snprintf(id, sizeof id, "%s_%s_in%zu", pre, h->rid, i);
            bad |= json_object_set_new(x, "id", json_string(id)) != 0;
        }
        if (!bad && (!t || !strcmp(t, "message")) && !json_object_get(it, "status"))
            bad |= json_object_set_new(x, "status", json_string("completed")) != 0;
        if (x) bad |= json_array_append_new(a, x) != 0; /* takes x, also when it fails */
    }
    char *txt = bad ? NULL : srv_json_text(a, len);
    json_decref(a);
    return txt;
}

/* the finished response object (output taken from the choice), kept in the store when asked */
static json_t *finished(hreq *h) {
    choice *c = &h->ch[0];
    close_item(c, final_status(c));
    if (h->failed) return NULL;
    json_t *o = resp_object(h, final_status(c), c->ab_blocks ? json_incref(c->ab_blocks) : json_array(), NULL);
    if (!o) { fail(h, NOMEM); return NULL; }
    srv *s = h->s;
    if (h->r_store && s->store) { /* a response that cannot be stored is still answered; the next one that needs it says so */
        size_t tl = 0, rl = 0, il = 0;
        char *turn = turn_text(h, &tl), *resp = turn ? srv_json_text(o, &rl) : NULL, *items = resp ? items_text(h, &il) : NULL;
        char id[48];
        resp_id(h, id, sizeof id);
        if (turn && resp && items) {
            int rc = m3_resp_store_put(s->store, id, h->r_prev, turn, tl, resp, rl, items, il);
            if (rc) fprintf(stderr, "m3 serve: response %s not stored: %s\n", id,
                            rc > 0 ? "larger than --responses-store" : "out of memory");
        } else {
            free(turn);
            free(resp);
            free(items);
            fprintf(stderr, "m3 serve: response %s not stored: out of memory\n", id);
        }
    }
    return o;
}

void srv_resp_stream_end(choice *c) {
    hreq *h = c->h;
    json_t *o = finished(h);
    if (!o) return; /* failed: generate.c ends the stream with response.failed */
    ev(h, !strcmp(final_status(c), "incomplete") ? "response.incomplete" : "response.completed", json_pack("{s:o}", "response", o));
}

void srv_resp_sse_failed(hreq *h, const char *msg) {
    if (!h->req) return;
    choice *c = &h->ch[0];
    json_t *o = resp_object(h, "failed", c->ab_blocks ? json_incref(c->ab_blocks) : json_array(), msg);
    const char *was = h->failed;
    h->failed = NULL; /* this event is the one that may follow the failure */
    ev(h, "response.failed", json_pack("{s:o}", "response", o));
    if (h->failed && h->req) { /* no memory for it either: the event without the output, from the stack */
        char m[200], data[512];
        size_t k = 0;
        for (const char *q = msg ? msg : NOMEM; *q && k + 1 < sizeof m; q++) /* (printable ASCII only: JSON-safe, whole characters) */
            m[k++] = *q == '"' || *q == '\\' || (unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e ? ' ' : *q;
        m[k] = 0;
        int n = snprintf(data, sizeof data,
                         "{\"type\":\"response.failed\",\"sequence_number\":%ld,\"response\":{\"id\":\"resp_%s\",\"object\":"
                         "\"response\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"%s\"}}}",
                         h->r_seq++, h->rid, m);
        static const char head[] = "event: response.failed\ndata: ";
        struct iovec v[3] = {{(void *)head, sizeof head - 1}, {data, n > 0 && (size_t)n < sizeof data ? (size_t)n : 0},
                             {(void *)"\n\n", 2}};
        if (v[1].iov_len) http_reply_chunkv(h->req, v, 3);
    }
    if (!h->failed) h->failed = was;
    else if (was) h->failed = was;
}

int srv_resp_final(hreq *h) {
    json_t *o = finished(h);
    if (!o || h->failed) {
        json_decref(o);
        return srv_send_error(h->req, 500, "server_error", "generation failed: %s", h->failed ? h->failed : NOMEM);
    }
    return srv_send_json(h->req, 200, o);
}

/* ------------------------------------------------------------------ stored responses */

/* GET /v1/responses/{id}/input_items?order=asc|desc&limit=1..100&after=ITEM&before=ITEM: a page
 * of the stored items (OpenAI's list: newest first by default, 20 a page). On a preparation
 * thread: the stored text of a large input takes a while to parse. */
int srv_resp_input_items(srv *s, const char *target, json_t **page, m3_oai_error *e) {
    *page = NULL;
    char id[160];
    const char *p = target + 14, *sl = strchr(p, '/'); /* /v1/responses/{id}/input_items[?...] */
    snprintf(id, sizeof id, "%.*s", sl ? (int)(sl - p) < 150 ? (int)(sl - p) : 150 : 0, p);
    if (!s->store)
        return m3_oai_errorf(e, 404, "not_found_error", NULL, "no response '%s': this server stores none (--responses-store 0)", id);
    struct evkeyvalq q;
    TAILQ_INIT(&q);
    const char *qs = strchr(target, '?');
    if (qs && evhttp_parse_query_str(qs + 1, &q))
        return m3_oai_errorf(e, 400, "invalid_request_error", NULL, "the query string does not parse");
    const char *order = evhttp_find_header(&q, "order"), *lim = evhttp_find_header(&q, "limit");
    const char *after = evhttp_find_header(&q, "after"), *before = evhttp_find_header(&q, "before");
    int rc = 0;
    long limit = 20;
    char *end = NULL;
    if (order && strcmp(order, "asc") && strcmp(order, "desc"))
        rc = m3_oai_errorf(e, 400, "invalid_request_error", "order", "'order' must be \"asc\" or \"desc\"");
    else if (lim && (!*lim || (limit = strtol(lim, &end, 10), *end) || limit < 1 || limit > 100))
        rc = m3_oai_errorf(e, 400, "invalid_request_error", "limit", "'limit' must be an integer in [1, 100]");
    size_t len = 0;
    int oom = 0;
    char *txt = rc ? NULL : m3_resp_store_get_items(s->store, id, &len, &oom);
    json_t *all = NULL;
    if (txt) {
        json_error_t je;
        m3_fault_suspend(1); /* jansson's parser and failed allocations: see fault.h */
        all = json_loadb(txt, len, 0, &je);
        m3_fault_suspend(0);
        free(txt);
        if (!all) oom = 1; /* the server wrote the text: only memory fails */
    }
    if (!rc && !all)
        rc = oom ? m3_oai_errorf(e, 500, "server_error", NULL, "out of memory")
                 : m3_oai_errorf(e, 404, "not_found_error", NULL,
                                 "no stored response '%s' (responses live in memory within --responses-store: it was never "
                                 "stored, was deleted, or made room for newer ones)", id);
    /* the items in the order asked, then the page after `after` / before `before` */
    size_t n = json_array_size(all), from = 0, to = n;
    int desc = !order || !strcmp(order, "desc");
    for (int pass = 0; pass < 2 && !rc; pass++) {
        const char *cur = pass ? before : after;
        if (!cur) continue;
        size_t k = n;
        for (size_t i = 0; i < n && k == n; i++) {
            const char *iid = json_string_value(json_object_get(json_array_get(all, desc ? n - 1 - i : i), "id"));
            if (iid && !strcmp(iid, cur)) k = i;
        }
        if (k == n)
            rc = m3_oai_errorf(e, 400, "invalid_request_error", pass ? "before" : "after",
                               "'%s' names no input item of response '%s'", pass ? "before" : "after", id);
        else if (pass) to = k < to ? k : to;
        else from = k + 1;
    }
    evhttp_clear_headers(&q);
    if (rc) {
        json_decref(all);
        return rc;
    }
    /* the page: the first `limit` after `after`; with `before` alone the last `limit` before it (the
     * page next to the cursor), has_more then saying whether more lie before the page */
    size_t lo = from, hi = to;
    int more;
    if (before && !after && to - from > (size_t)limit) lo = to - (size_t)limit;
    if (hi - lo > (size_t)limit) hi = lo + (size_t)limit;
    more = before && !after ? lo > from : hi < to;
    json_t *data = json_array();
    int bad = !data;
    for (size_t i = lo; !bad && i < hi; i++) bad |= json_array_append(data, json_array_get(all, desc ? n - 1 - i : i)) != 0;
    json_t *fi = json_object_get(json_array_get(data, 0), "id"), *la = json_object_get(json_array_get(data, json_array_size(data) - 1), "id");
    *page = bad ? NULL : json_pack("{s:s,s:o,s:O,s:O,s:b}", "object", "list", "data", data, "first_id", fi ? fi : json_null(),
                                   "last_id", la ? la : json_null(), "has_more", more);
    if (bad) json_decref(data);
    json_decref(all);
    return *page ? 0 : m3_oai_errorf(e, 500, "server_error", NULL, "out of memory");
}

/* a response still being generated, to be stored, by its id (loop) */
static hreq *in_flight(srv *s, const char *id) {
    for (hreq *h = s->live; h; h = h->next)
        if (h->api == SRV_API_RESPONSES && h->r_store && !h->replied && !strncmp(id, "resp_", 5) && !strcmp(id + 5, h->rid))
            return h;
    return NULL;
}

int srv_resp_in_flight(srv *s, const char *id) { return in_flight(s, id) != NULL; }

int srv_resp_stored(srv *s, http_req *req, const char *raw_id, int del) {
    int rc = srv_check_auth(s, req);
    if (rc) return rc;
    char id[160];
    snprintf(id, sizeof id, "%.150s", raw_id);
    if (!s->store)
        return srv_send_error(req, 404, "not_found_error", "no response '%s': this server stores none (--responses-store 0)", id);
    if (del) {
        int found = m3_resp_store_delete(s->store, id);
        hreq *h = found ? NULL : in_flight(s, id);
        if (h) { /* being generated: it will not be stored */
            h->r_store = 0;
            found = 1;
        }
        if (!found) return srv_send_error(req, 404, "not_found_error", "no stored response '%s'", id);
        return srv_send_json(req, 200, json_pack("{s:s,s:s,s:b}", "id", id, "object", "response", "deleted", 1));
    }
    const char *qs = strchr(http_target(req), '?');
    if (qs) {
        struct evkeyvalq q;
        TAILQ_INIT(&q);
        int bad = evhttp_parse_query_str(qs + 1, &q), streamed = 0;
        const char *st = bad ? NULL : evhttp_find_header(&q, "stream");
        streamed = st && (!strcmp(st, "true") || !strcmp(st, "1"));
        evhttp_clear_headers(&q);
        if (bad) return srv_send_error(req, 400, "invalid_request_error", "the query string does not parse");
        if (streamed)
            return srv_send_error(req, 400, "invalid_request_error",
                                  "streaming a response again is not supported (it is for background responses, which m3 does not run)");
    }
    size_t len = 0;
    int oom = 0;
    char *txt = m3_resp_store_get(s->store, id, &len, &oom);
    if (!txt && oom) return srv_send_error(req, 500, "server_error", "out of memory");
    /* not stored yet: a response still being generated (to be stored) answers as it stands */
    hreq *h = txt ? NULL : in_flight(s, id);
    if (h) {
        choice *c = &h->ch[0];
        json_t *o = resp_object(h, "in_progress", c->ab_blocks ? json_deep_copy(c->ab_blocks) : json_array(), NULL);
        return srv_send_json(req, 200, o); /* NULL: a 500 */
    }
    if (!txt)
        return srv_send_error(req, 404, "not_found_error",
                              "no stored response '%s' (responses live in memory within --responses-store: it was never "
                              "stored, was deleted, or made room for newer ones)", id);
    return srv_send_text(req, 200, txt, len);
}
