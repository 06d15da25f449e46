/* m3 serve: POST /v1/messages output in Anthropic's shapes (see srv.h, anthropic.h).
 *
 * The request was translated to a chat completion (anthropic_req.c) and runs as one: the
 * engine, stop strings and the output parsers are generate.c's. What differs is the shape of
 * what comes out. The parsers' deltas become content blocks in the order generated:
 * reasoning -> a thinking block, content -> a text block, each tool call -> a tool_use block
 * whose input arrives as pieces of its arguments JSON (input_json_delta, as many as the
 * parser emits). A block closes when output of another kind begins.
 *
 * Stream: event: message_start, ping, then per block content_block_start, its deltas (the
 * text of one engine record in one event), content_block_stop; at the end message_delta
 * (stop_reason, stop_sequence, output_tokens) and message_stop. A failure mid-stream is an
 * `event: error` in Anthropic's error shape, and the stream ends there.
 * Non-stream: the same blocks in a message object.
 *
 * Failures (no memory for a piece of output) mark the request failed as generate.c does: its
 * response then ends with an error, never with a gap. */
#include "srv.h"
#include "anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char NOMEM[] = "out of memory while building the response";

enum { AB_NONE = 0, AB_THINKING, AB_TEXT, AB_TOOL };

static void fail(hreq *h, const char *why) {
    if (!h->failed) h->failed = why;
}

int srv_path_anthropic(const char *p) {
    return !strncmp(p, "/v1/messages", 12) && (!p[12] || p[12] == '/' || p[12] == '?');
}

int srv_api_anthropic(const http_req *req) { return srv_path_anthropic(http_target(req)); }

/* one SSE event with its name; raw data (n bytes). 0, or -1 (no memory) */
static int ev_raw(hreq *h, const char *name, const char *data, size_t n) {
    if (!h->req) return 0;
    struct iovec v[5] = {{(void *)"event: ", 7}, {(void *)name, strlen(name)}, {(void *)"\ndata: ", 7},
                         {(void *)data, n}, {(void *)"\n\n", 2}};
    int rc = http_reply_chunkv(h->req, v, 5);
    if (!rc) h->t_write = m3_now();
    return rc;
}

/* one event (takes j); a NULL j (a failed allocation) fails the request. Once it has failed,
 * nothing but its error event follows: a client never sees events after a gap. */
static void ev(hreq *h, const char *name, json_t *j) {
    size_t n = 0;
    char *txt = h->req && !h->failed ? srv_json_text(j, &n) : NULL;
    json_decref(j);
    if (!h->req || h->failed) return;
    if (!txt || ev_raw(h, name, txt, n)) fail(h, NOMEM);
    free(txt);
}

void srv_anth_sse_error(hreq *h, int code, const char *msg) {
    char buf[1400];
    size_t n = m3_anth_error_json(buf, sizeof buf, code, msg);
    ev_raw(h, "error", buf, n);
}

static const char *stop_reason(const choice *c) {
    if (c->finish_reason == M3_FINISH_LENGTH) return "max_tokens";
    if (c->out && m3_out_tool_calls(c->out) > 0) return "tool_use"; /* as OpenAI's "tool_calls" wins over "stop" */
    if (c->stop_hit) return "stop_sequence";
    return "end_turn";
}

/* the stop string that ended the output, or JSON null */
static json_t *stop_sequence(const choice *c) {
    if (strcmp(stop_reason(c), "stop_sequence")) return json_null();
    return json_stringn(c->text.p + c->stop_start, c->stop_end - c->stop_start);
}

static json_t *message_base(const hreq *h) {
    char id[48];
    snprintf(id, sizeof id, "msg_%s", h->rid);
    return json_pack("{s:s,s:s,s:s,s:s}", "id", id, "type", "message", "role", "assistant", "model", h->s->o->model_name);
}

void srv_anth_start(hreq *h) {
    json_t *m = message_base(h);
    if (!m || json_object_set_new(m, "content", json_array()) || json_object_set_new(m, "stop_reason", json_null()) ||
        json_object_set_new(m, "stop_sequence", json_null()) ||
        json_object_set_new(m, "usage", json_pack("{s:i,s:i}", "input_tokens", h->n_prompt, "output_tokens", 0))) {
        json_decref(m);
        fail(h, NOMEM);
        return;
    }
    ev(h, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", m));
    ev(h, "ping", json_pack("{s:s}", "type", "ping"));
}

/* stream: the open block's text not sent yet, as one delta event */
static void flush(choice *c) {
    hreq *h = c->h;
    if (!h->stream || !c->ab_kind || !c->ab_text.n) return;
    static const char *const dt[] = {"", "thinking_delta", "text_delta", "input_json_delta"};
    static const char *const field[] = {"", "thinking", "text", "partial_json"};
    ev(h, "content_block_delta",
       json_pack("{s:s,s:i,s:{s:s,s:s%}}", "type", "content_block_delta", "index", c->ab_n - 1, "delta", "type",
                 dt[c->ab_kind], field[c->ab_kind], c->ab_text.p, c->ab_text.n));
    c->ab_text.n = 0;
}

/* non-stream: a tool_use block's arguments text -> its input object */
static int tool_input(choice *c) {
    json_t *in;
    if (!c->ab_text.n) in = json_object(); /* a call without arguments */
    else {
        json_error_t je;
        m3_fault_suspend(1); /* jansson's parser and failed allocations: see fault.h */
        in = json_loadb(c->ab_text.p, c->ab_text.n, 0, &je);
        m3_fault_suspend(0);
        if (in && !json_is_object(in)) {
            json_decref(in);
            fail(c->h, "a tool call's arguments are not a JSON object");
            return -1;
        }
        if (!in && json_error_code(&je) != json_error_out_of_memory) {
            fail(c->h, "a tool call's arguments are not JSON");
            return -1;
        }
    }
    if (json_object_set_new(c->ab_tool, "input", in)) { fail(c->h, NOMEM); return -1; }
    return 0;
}

static void close_block(choice *c) {
    hreq *h = c->h;
    if (!c->ab_kind) return;
    if (h->stream) {
        flush(c);
        ev(h, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", c->ab_n - 1));
    } else {
        json_t *b = NULL;
        const char *t = c->ab_text.p ? c->ab_text.p : "";
        if (c->ab_kind == AB_TOOL) {
            if (!tool_input(c)) b = c->ab_tool;
            else json_decref(c->ab_tool);
            c->ab_tool = NULL;
        } else if (c->ab_kind == AB_THINKING) /* no signature: nothing signs m3's reasoning; the field is Anthropic's */
            b = json_pack("{s:s,s:s%,s:s}", "type", "thinking", "thinking", t, c->ab_text.n, "signature", "");
        else b = json_pack("{s:s,s:s%}", "type", "text", "text", t, c->ab_text.n);
        if (!c->ab_blocks) c->ab_blocks = json_array();
        if (!b || !c->ab_blocks || json_array_append_new(c->ab_blocks, b)) { /* append_new takes b, also when it fails */
            if (!c->ab_blocks) json_decref(b);
            fail(h, NOMEM);
        }
    }
    c->ab_kind = AB_NONE;
    c->ab_text.n = 0;
}

static void open_block(choice *c, int kind, const m3_out_delta *d) {
    hreq *h = c->h;
    close_block(c);
    c->ab_kind = kind;
    c->ab_n++;
    if (kind == AB_TOOL) c->ab_call = d->index;
    if (!h->stream && kind != AB_TOOL) return; /* non-stream: text and thinking blocks are made when they close */
    json_t *cb = kind == AB_THINKING ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
                 : kind == AB_TEXT   ? json_pack("{s:s,s:s}", "type", "text", "text", "")
                 : h->stream ? json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", d->id, "name", d->name, "input")
                             : json_pack("{s:s,s:s,s:s}", "type", "tool_use", "id", d->id, "name", d->name); /* input: at its close */
    if (h->stream)
        ev(h, "content_block_start",
           json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", c->ab_n - 1, "content_block", cb));
    else {
        json_decref(c->ab_tool);
        if (!(c->ab_tool = cb)) fail(h, NOMEM);
    }
}

void srv_anth_deltas(choice *c, const m3_out_delta *d, size_t n) {
    hreq *h = c->h;
    for (size_t i = 0; i < n && !h->failed; i++) {
        if (d[i].kind == M3_OUT_TOOL_BEGIN) {
            open_block(c, AB_TOOL, &d[i]);
            continue;
        }
        if (d[i].kind == M3_OUT_TOOL_ARGS) {
            if (c->ab_kind != AB_TOOL || c->ab_call != d[i].index) { /* the parser's order: arguments follow their call */
                fail(h, "tool call arguments arrived without their call");
                break;
            }
        } else {
            int kind = d[i].kind == M3_OUT_REASONING ? AB_THINKING : AB_TEXT;
            if (!d[i].len) continue;
            if (c->ab_kind != kind) open_block(c, kind, NULL);
        }
        if (m3_sbuf_add(&c->ab_text, d[i].text, d[i].len)) fail(h, NOMEM);
    }
    flush(c);
}

void srv_anth_stream_end(choice *c) {
    hreq *h = c->h;
    close_block(c);
    json_t *d = json_pack("{s:s,s:o}", "stop_reason", stop_reason(c), "stop_sequence", stop_sequence(c));
    ev(h, "message_delta",
       json_pack("{s:s,s:o,s:{s:i}}", "type", "message_delta", "delta", d, "usage", "output_tokens", c->n_gen));
    ev(h, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

int srv_anth_final(hreq *h) {
    choice *c = &h->ch[0]; /* one choice: the API has no n */
    close_block(c);
    json_t *m = message_base(h);
    int bad = !m || json_object_set_new(m, "content", c->ab_blocks ? json_incref(c->ab_blocks) : json_array()) ||
              json_object_set_new(m, "stop_reason", json_string(stop_reason(c))) ||
              json_object_set_new(m, "stop_sequence", stop_sequence(c)) ||
              json_object_set_new(m, "usage", json_pack("{s:i,s:i}", "input_tokens", h->n_prompt, "output_tokens", c->n_gen));
    if (bad || h->failed) { /* a part is missing: no truncated answer */
        json_decref(m);
        return srv_send_error(h->req, 500, "server_error", "generation failed: %s", h->failed ? h->failed : NOMEM);
    }
    return srv_send_json(h->req, 200, m);
}
