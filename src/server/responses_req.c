/* OpenAI Responses requests translated to chat requests (see responses.h). */
#include "responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/fault.h"
#include "../base/sbuf.h"

static const char BAD[] = "invalid_request_error";

#define R_BAD(e, param, ...) m3_oai_errorf(e, 400, BAD, param, __VA_ARGS__)
#define R_OOM(e) m3_oai_errorf(e, 500, "server_error", NULL, "out of memory")

/* jansson reports a failed allocation as a NULL value or a nonzero return: set / append take
 * NULL values and fail, so that a chain of them ORed together says whether any failed */
static int set(json_t *o, const char *k, json_t *v) { return json_object_set_new(o, k, v) != 0; }
static int add(json_t *a, json_t *v) { return json_array_append_new(a, v) != 0; }
static int ref(json_t *o, const char *k, json_t *v) { return json_object_set(o, k, v) != 0; } /* borrowed value */

static const char *type_of(json_t *o) { return json_string_value(json_object_get(o, "type")); }
static int absent(json_t *v) { return !v || json_is_null(v); }

/* ------------------------------------------------------------------ input items */

/* the conversation being built: chat messages, and the assistant message still open (an
 * assistant's reasoning, text and calls in a row are one message) */
typedef struct conv {
    json_t *msgs;
    json_t *parts;   /* the open assistant message's text parts (NULL: none) */
    json_t *calls;   /* its tool calls (NULL: none) */
    m3_sbuf reason;  /* its reasoning */
    int open;        /* an assistant message is open */
} conv;

static int close_assistant(conv *cv, m3_oai_error *e) {
    if (!cv->open) return 0;
    json_t *parts = cv->parts ? cv->parts : json_array(), *calls = cv->calls; /* this function's from here on */
    cv->parts = cv->calls = NULL;
    cv->open = 0;
    size_t rn = cv->reason.n;
    cv->reason.n = 0;
    json_t *m = json_pack("{s:s}", "role", "assistant");
    if (!m) {
        json_decref(parts);
        json_decref(calls);
        return R_OOM(e);
    }
    int bad = set(m, "content", parts); /* set_new takes its value, also when it fails */
    if (calls) {
        if (bad) json_decref(calls);
        else bad = set(m, "tool_calls", calls);
    }
    if (!bad && rn) bad = set(m, "reasoning_content", json_stringn_nocheck(cv->reason.p, rn));
    if (bad) {
        json_decref(m);
        return R_OOM(e);
    }
    return add(cv->msgs, m) ? R_OOM(e) : 0; /* append_new takes m, also when it fails */
}

static json_t *text_part(json_t *text) { return json_pack("{s:s,s:O}", "type", "text", "text", text); }

/* an input_image part -> an image_url part */
static json_t *image_part(json_t *p, const char *param, m3_oai_error *e) {
    json_t *url = json_object_get(p, "image_url");
    if (!json_is_string(url)) {
        if (!absent(json_object_get(p, "file_id")))
            R_BAD(e, param, "%s: images by 'file_id' need the Files API, which m3 does not serve: give 'image_url' (a URL or "
                  "a data: URL)", param);
        else R_BAD(e, param, "%s: an input_image part needs an 'image_url' string", param);
        return NULL;
    }
    json_t *d = json_object_get(p, "detail");
    if (!absent(d) && !json_is_string(d)) {
        R_BAD(e, param, "%s.detail must be a string", param);
        return NULL;
    }
    json_t *x = json_pack("{s:s,s:{s:O}}", "type", "image_url", "image_url", "url", url);
    if (!x) R_OOM(e);
    return x;
}

/* content parts of a message (or a function_call_output's output) -> chat parts appended to
 * parts. images: input_image parts allowed; assistant: output_text / refusal parts (the
 * text of what the model said) */
static int parts_of(json_t *ct, const char *param, int images, int assistant, json_t *parts, m3_oai_error *e) {
    for (size_t j = 0; j < json_array_size(ct); j++) {
        json_t *p = json_array_get(ct, j);
        const char *t = type_of(p);
        char pp[96];
        snprintf(pp, sizeof pp, "%s[%zu]", param, j);
        json_t *x = NULL;
        if (t && (!strcmp(t, "input_text") || !strcmp(t, "output_text") || !strcmp(t, "text"))) {
            json_t *tx = json_object_get(p, "text");
            if (!json_is_string(tx)) return R_BAD(e, pp, "%s: a %s part needs a 'text' string", pp, t);
            x = text_part(tx);
        } else if (assistant && t && !strcmp(t, "refusal")) {
            json_t *tx = json_object_get(p, "refusal");
            if (!json_is_string(tx)) return R_BAD(e, pp, "%s: a refusal part needs a 'refusal' string", pp);
            x = text_part(tx);
        } else if (images && t && !strcmp(t, "input_image")) {
            if (!(x = image_part(p, pp, e))) return e->status;
        } else if (t && !strcmp(t, "input_file"))
            return R_BAD(e, pp, "%s: input_file parts are not supported (m3 reads text%s)", pp, images ? " and images" : "");
        else
            return R_BAD(e, pp, "%s: parts of type '%.40s' are not supported here (%s)", pp, t ? t : "(none)",
                         assistant ? "output_text, refusal" : images ? "input_text, input_image" : "input_text");
        if (add(parts, x)) return R_OOM(e);
    }
    return 0;
}

static int message_item(conv *cv, json_t *it, const char *param, m3_oai_error *e) {
    const char *role = json_string_value(json_object_get(it, "role"));
    json_t *ct = json_object_get(it, "content");
    char pc[96];
    snprintf(pc, sizeof pc, "%s.content", param);
    if (!role || (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "assistant")))
        return R_BAD(e, param, "%s.role must be \"user\", \"system\", \"developer\" or \"assistant\"", param);
    if (!json_is_string(ct) && !json_is_array(ct))
        return R_BAD(e, pc, "%s must be a string or an array of content parts", pc);
    int asst = !strcmp(role, "assistant");
    if (asst) {
        if (cv->open && cv->calls && close_assistant(cv, e)) return e->status; /* text after calls: a new message */
        cv->open = 1;
        if (!cv->parts && !(cv->parts = json_array())) return R_OOM(e);
        if (json_is_string(ct)) return add(cv->parts, text_part(ct)) ? R_OOM(e) : 0;
        return parts_of(ct, pc, 0, 1, cv->parts, e);
    }
    if (close_assistant(cv, e)) return e->status;
    json_t *c;
    if (json_is_string(ct)) c = json_incref(ct);
    else {
        if (!(c = json_array())) return R_OOM(e);
        if (parts_of(ct, pc, !strcmp(role, "user"), 0, c, e)) {
            json_decref(c);
            return e->status;
        }
    }
    return add(cv->msgs, json_pack("{s:s,s:o}", "role", role, "content", c)) ? R_OOM(e) : 0;
}

/* a reasoning item: its reasoning_text content, else its summary texts. One with no text (only
 * encrypted_content, as clients that ask for it send back) adds nothing: no empty turn. */
static int reasoning_item(conv *cv, json_t *it, const char *param, m3_oai_error *e) {
    json_t *ct = json_object_get(it, "content"), *sm = json_object_get(it, "summary");
    if (!absent(ct) && !json_is_array(ct)) return R_BAD(e, param, "%s.content must be an array", param);
    if (!absent(sm) && !json_is_array(sm)) return R_BAD(e, param, "%s.summary must be an array", param);
    json_t *from = json_array_size(ct) ? ct : sm;
    const char *want = from == ct ? "reasoning_text" : "summary_text";
    size_t len = 0;
    for (size_t j = 0; j < json_array_size(from); j++) {
        json_t *p = json_array_get(from, j), *tx = json_object_get(p, "text");
        const char *t = type_of(p);
        if (!t || strcmp(t, want) || !json_is_string(tx))
            return R_BAD(e, param, "%s.%s[%zu] must be {\"type\": \"%s\", \"text\": ...}", param,
                         from == ct ? "content" : "summary", j, want);
        len += json_string_length(tx);
    }
    if (!len) return 0;
    if (cv->open && (cv->parts || cv->calls) && close_assistant(cv, e)) return e->status; /* the next step's reasoning */
    cv->open = 1;
    for (size_t j = 0; j < json_array_size(from); j++) {
        json_t *tx = json_object_get(json_array_get(from, j), "text");
        if (!json_string_length(tx)) continue;
        if ((cv->reason.n && m3_sbuf_add(&cv->reason, "\n\n", 2)) ||
            m3_sbuf_add(&cv->reason, json_string_value(tx), json_string_length(tx)))
            return R_OOM(e);
    }
    return 0;
}

/* ids a client sends back (call_id, item ids): the server's are short; a long one is refused
 * rather than kept (a stored conversation holds it for every later response) */
#define ID_MAX 256

static int function_call_item(conv *cv, json_t *it, const char *param, m3_oai_error *e) {
    json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name"), *args = json_object_get(it, "arguments");
    if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
        return R_BAD(e, param, "%s: a function_call item needs 'call_id', 'name' and 'arguments' strings", param);
    if (json_string_length(id) > ID_MAX) return R_BAD(e, param, "%s.call_id is longer than %d bytes", param, ID_MAX);
    cv->open = 1;
    if (!cv->calls && !(cv->calls = json_array())) return R_OOM(e);
    /* arguments: the JSON text, as a chat request's tool call carries it (openai.c parses it) */
    return add(cv->calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function", "name", name,
                                    "arguments", args))
               ? R_OOM(e)
               : 0;
}

static int function_output_item(conv *cv, json_t *it, const char *param, m3_oai_error *e) {
    json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
    if (!json_is_string(id)) return R_BAD(e, param, "%s: a function_call_output item needs a 'call_id' string", param);
    if (json_string_length(id) > ID_MAX) return R_BAD(e, param, "%s.call_id is longer than %d bytes", param, ID_MAX);
    if (close_assistant(cv, e)) return e->status;
    json_t *c;
    if (json_is_string(out)) c = json_incref(out);
    else if (json_is_array(out)) {
        char po[96];
        snprintf(po, sizeof po, "%s.output", param);
        if (!(c = json_array())) return R_OOM(e);
        if (parts_of(out, po, 1, 0, c, e)) {
            json_decref(c);
            return e->status;
        }
    } else return R_BAD(e, param, "%s.output must be a string or an array of input_text / input_image parts", param);
    return add(cv->msgs, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", c)) ? R_OOM(e) : 0;
}

/* input -> chat messages in turn */
static int input_items(json_t *b, json_t *turn, m3_oai_error *e) {
    json_t *in = json_object_get(b, "input");
    if (json_is_string(in)) return add(turn, json_pack("{s:s,s:O}", "role", "user", "content", in)) ? R_OOM(e) : 0;
    if (!json_is_array(in) || !json_array_size(in))
        return R_BAD(e, "input", "'input' must be a string or a non-empty array of input items");
    if (json_array_size(in) > M3_OAI_MAX_MESSAGES)
        return R_BAD(e, "input", "'input' has %zu items; the limit is %d", json_array_size(in), M3_OAI_MAX_MESSAGES);
    conv cv = {turn, NULL, NULL, {0}, 0};
    int rc = 0;
    for (size_t i = 0; i < json_array_size(in) && !rc; i++) {
        json_t *it = json_array_get(in, i);
        char p[48];
        snprintf(p, sizeof p, "input[%zu]", i);
        const char *t = type_of(it);
        json_t *iid = json_is_object(it) ? json_object_get(it, "id") : NULL;
        if (!json_is_object(it)) rc = R_BAD(e, p, "%s must be an object (an input item)", p);
        else if (!absent(iid) && (!json_is_string(iid) || json_string_length(iid) > ID_MAX))
            rc = R_BAD(e, p, "%s.id must be a string of at most %d bytes", p, ID_MAX);
        else if (!t || !strcmp(t, "message")) rc = message_item(&cv, it, p, e);
        else if (!strcmp(t, "reasoning")) rc = reasoning_item(&cv, it, p, e);
        else if (!strcmp(t, "function_call")) rc = function_call_item(&cv, it, p, e);
        else if (!strcmp(t, "function_call_output")) rc = function_output_item(&cv, it, p, e);
        else if (!strcmp(t, "item_reference"))
            rc = R_BAD(e, p, "%s: item references are not supported: send the item itself, or continue a stored response "
                       "with 'previous_response_id'", p);
        else
            rc = R_BAD(e, p, "%s: items of type '%.40s' are not supported (message, reasoning, function_call, "
                       "function_call_output)", p, t);
    }
    if (!rc) rc = close_assistant(&cv, e);
    json_decref(cv.parts);
    json_decref(cv.calls);
    free(cv.reason.p);
    return rc;
}

/* The input as the API lists it: each item a shallow copy, messages with their type and their
 * content as parts ({"type": input_text | output_text, "text"}). NULL when out of memory. */
static json_t *listed_items(json_t *b) {
    json_t *in = json_object_get(b, "input"), *out = json_array();
    if (!out) return NULL;
    if (json_is_string(in)) {
        if (json_array_append_new(out, json_pack("{s:s,s:s,s:[{s:s,s:O}]}", "type", "message", "role", "user", "content", "type",
                                                 "input_text", "text", in))) {
            json_decref(out);
            return NULL;
        }
        return out;
    }
    size_t i;
    json_t *it;
    json_array_foreach(in, i, it) {
        json_t *x = json_object();
        const char *k;
        json_t *v;
        int bad = !x;
        if (x)
            json_object_foreach(it, k, v) bad |= json_object_set(x, k, v) != 0; /* json_copy drops keys silently when short */
        const char *t = type_of(it);
        if (!bad && (!t || !strcmp(t, "message"))) {
            const char *role = json_string_value(json_object_get(it, "role"));
            json_t *ct = json_object_get(it, "content");
            bad |= set(x, "type", json_string("message"));
            if (!bad && json_is_string(ct))
                bad |= set(x, "content", json_pack("[{s:s,s:O}]", "type", role && !strcmp(role, "assistant") ? "output_text" : "input_text",
                                                   "text", ct));
        }
        if (bad || json_array_append_new(out, x)) { /* append_new takes x, also when it fails */
            if (bad) json_decref(x);
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* ------------------------------------------------------------------ tools and formats */

static int tools(json_t *b, json_t *out, m3_oai_error *e) {
    json_t *tl = json_object_get(b, "tools");
    if (absent(tl)) return 0;
    if (!json_is_array(tl)) return R_BAD(e, "tools", "'tools' must be an array");
    if (json_array_size(tl) > M3_OAI_MAX_TOOLS)
        return R_BAD(e, "tools", "'tools' has %zu entries; the limit is %d", json_array_size(tl), M3_OAI_MAX_TOOLS);
    json_t *a = json_array();
    if (!a || set(out, "tools", a)) return R_OOM(e);
    for (size_t i = 0; i < json_array_size(tl); i++) {
        json_t *t = json_array_get(tl, i), *name = json_object_get(t, "name"), *pa = json_object_get(t, "parameters");
        json_t *d = json_object_get(t, "description"), *st = json_object_get(t, "strict");
        const char *ty = type_of(t);
        char p[32];
        snprintf(p, sizeof p, "tools[%zu]", i);
        if (!ty || strcmp(ty, "function"))
            return R_BAD(e, p, "%s: tools of type '%.60s' are not supported (function tools are: m3 runs no tools itself)", p,
                         ty ? ty : "(none)");
        if (!json_is_string(name)) return R_BAD(e, p, "%s needs a 'name' string", p);
        if (!absent(pa) && !json_is_object(pa)) return R_BAD(e, p, "%s.parameters must be a JSON schema (an object)", p);
        if (!absent(d) && !json_is_string(d)) return R_BAD(e, p, "%s.description must be a string", p);
        if (!absent(st) && !json_is_boolean(st)) return R_BAD(e, p, "%s.strict must be a boolean", p);
        json_t *fn = json_pack("{s:O}", "name", name);
        if (fn && ((json_is_string(d) && ref(fn, "description", d)) || (json_is_object(pa) && ref(fn, "parameters", pa)) ||
                   (json_is_true(st) && ref(fn, "strict", st)))) {
            json_decref(fn);
            fn = NULL;
        }
        if (add(a, json_pack("{s:s,s:o}", "type", "function", "function", fn))) return R_OOM(e); /* fn NULL: the pack fails */
    }
    return 0;
}

static int tool_choice(json_t *b, json_t *out, m3_oai_error *e) {
    json_t *tc = json_object_get(b, "tool_choice");
    if (absent(tc)) return 0;
    const char *s = json_string_value(tc), *t = type_of(tc);
    static const char FORMS[] = "'tool_choice' must be \"auto\", \"none\", \"required\", {\"type\": \"function\", \"name\": ...} "
                                "or {\"type\": \"allowed_tools\", \"mode\", \"tools\"}";
    if (s) {
        if (strcmp(s, "auto") && strcmp(s, "none") && strcmp(s, "required")) return R_BAD(e, "tool_choice", FORMS);
        return ref(out, "tool_choice", tc) ? R_OOM(e) : 0;
    }
    if (!json_is_object(tc) || !t) return R_BAD(e, "tool_choice", FORMS);
    if (!strcmp(t, "function")) {
        json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) return R_BAD(e, "tool_choice", "'tool_choice' of type \"function\" needs a 'name' string");
        return set(out, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name)) ? R_OOM(e) : 0;
    }
    if (strcmp(t, "allowed_tools"))
        return R_BAD(e, "tool_choice", "'tool_choice' of type '%.40s' is not supported (m3 serves function tools)", t);
    /* {type: allowed_tools, mode: auto | required, tools: [{type: function, name}]}: the
     * tools offered are cut to those */
    const char *mode = json_string_value(json_object_get(tc, "mode"));
    json_t *al = json_object_get(tc, "tools");
    if (!mode || (strcmp(mode, "auto") && strcmp(mode, "required")))
        return R_BAD(e, "tool_choice", "'tool_choice.mode' must be \"auto\" or \"required\"");
    if (!json_is_array(al)) return R_BAD(e, "tool_choice", "'tool_choice.tools' must be an array of {\"type\": \"function\", \"name\"}");
    if (json_array_size(al) > M3_OAI_MAX_TOOLS)
        return R_BAD(e, "tool_choice", "'tool_choice.tools' has %zu entries; the limit is %d", json_array_size(al), M3_OAI_MAX_TOOLS);
    json_t *names = json_object(), *all = json_object_get(out, "tools"); /* the tools offered, by name */
    size_t i;
    json_t *t2;
    if (!names) return R_OOM(e);
    json_array_foreach(all, i, t2) {
        const char *n = json_string_value(json_object_get(json_object_get(t2, "function"), "name"));
        if (n && json_object_set_new(names, n, json_integer(0))) { json_decref(names); return R_OOM(e); }
    }
    for (i = 0; i < json_array_size(al); i++) {
        json_t *x = json_array_get(al, i);
        const char *n = json_string_value(json_object_get(x, "name")), *xt = type_of(x);
        int rc = 0;
        if (!n || (xt && strcmp(xt, "function")))
            rc = R_BAD(e, "tool_choice", "'tool_choice.tools[%zu]' must be {\"type\": \"function\", \"name\": ...}", i);
        else if (!json_object_get(names, n))
            rc = R_BAD(e, "tool_choice", "'tool_choice.tools[%zu]' names '%.60s', which is not among 'tools'", i, n);
        else if (json_object_set_new(names, n, json_integer(1))) rc = R_OOM(e); /* allowed */
        if (rc) { json_decref(names); return rc; }
    }
    json_t *kept = json_array();
    if (!kept) { json_decref(names); return R_OOM(e); }
    json_array_foreach(all, i, t2) {
        const char *n = json_string_value(json_object_get(json_object_get(t2, "function"), "name"));
        if (json_integer_value(json_object_get(names, n)) == 1 && json_array_append(kept, t2)) {
            json_decref(kept);
            json_decref(names);
            return R_OOM(e);
        }
    }
    json_decref(names);
    if (set(out, "tools", kept) || set(out, "tool_choice", json_string(mode))) return R_OOM(e);
    return 0;
}

/* text {format, verbosity} -> response_format */
static int text_format(json_t *b, json_t *out, m3_oai_error *e) {
    json_t *tx = json_object_get(b, "text");
    if (absent(tx)) return 0;
    if (!json_is_object(tx)) return R_BAD(e, "text", "'text' must be an object {format, verbosity}");
    json_t *vb = json_object_get(tx, "verbosity");
    const char *v = json_string_value(vb);
    if (!absent(vb) && (!v || (strcmp(v, "low") && strcmp(v, "medium") && strcmp(v, "high"))))
        return R_BAD(e, "text.verbosity", "'text.verbosity' must be \"low\", \"medium\" or \"high\"");
    json_t *f = json_object_get(tx, "format");
    if (absent(f)) return 0;
    const char *t = type_of(f);
    if (!json_is_object(f) || !t) return R_BAD(e, "text.format", "'text.format' must be an object {type: text | json_object | json_schema}");
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) return set(out, "response_format", json_pack("{s:s}", "type", "json_object")) ? R_OOM(e) : 0;
    if (strcmp(t, "json_schema"))
        return R_BAD(e, "text.format", "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    json_t *sc = json_object_get(f, "schema"), *name = json_object_get(f, "name"), *st = json_object_get(f, "strict");
    json_t *d = json_object_get(f, "description");
    if (!json_is_object(sc)) return R_BAD(e, "text.format", "'text.format.schema' must be a JSON schema (an object)");
    if (!absent(name) && !json_is_string(name)) return R_BAD(e, "text.format", "'text.format.name' must be a string");
    if (!absent(st) && !json_is_boolean(st)) return R_BAD(e, "text.format", "'text.format.strict' must be a boolean");
    if (!absent(d) && !json_is_string(d)) return R_BAD(e, "text.format", "'text.format.description' must be a string");
    json_t *js = json_pack("{s:O}", "schema", sc);
    if (js && ((json_is_string(name) ? ref(js, "name", name) : set(js, "name", json_string("output"))) ||
               (json_is_boolean(st) && ref(js, "strict", st)) || (json_is_string(d) && ref(js, "description", d)))) {
        json_decref(js);
        js = NULL;
    }
    return set(out, "response_format", json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js)) ? R_OOM(e) : 0;
}

/* reasoning {effort, summary}: "none" turns thinking off, any other effort on */
static int reasoning(json_t *b, json_t *out, m3_oai_error *e) {
    json_t *r = json_object_get(b, "reasoning");
    if (absent(r)) return 0;
    if (!json_is_object(r)) return R_BAD(e, "reasoning", "'reasoning' must be an object {effort, summary}");
    static const char *const EFF[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    static const char *const SUM[] = {"auto", "concise", "detailed"};
    json_t *ef = json_object_get(r, "effort");
    const char *es = json_string_value(ef);
    int known = 0;
    for (size_t i = 0; es && i < sizeof EFF / sizeof *EFF; i++) known |= !strcmp(es, EFF[i]);
    if (!absent(ef) && !known)
        return R_BAD(e, "reasoning.effort", "'reasoning.effort' must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\"");
    static const char *const SK[] = {"summary", "generate_summary"};
    for (size_t k = 0; k < 2; k++) {
        json_t *sv = json_object_get(r, SK[k]);
        const char *ss = json_string_value(sv);
        int ok = 0;
        for (size_t i = 0; ss && i < sizeof SUM / sizeof *SUM; i++) ok |= !strcmp(ss, SUM[i]);
        if (!absent(sv) && !ok) return R_BAD(e, "reasoning.summary", "'reasoning.%s' must be \"auto\", \"concise\" or \"detailed\"", SK[k]);
    }
    if (!es) return 0;
    return set(out, "chat_template_kwargs", json_pack("{s:s}", "thinking_mode", strcmp(es, "none") ? "enabled" : "disabled"))
               ? R_OOM(e)
               : 0;
}

static int include(json_t *b, m3_resp_req *r, m3_oai_error *e) {
    json_t *in = json_object_get(b, "include");
    if (absent(in)) return 0;
    if (!json_is_array(in)) return R_BAD(e, "include", "'include' must be an array of strings");
    for (size_t i = 0; i < json_array_size(in); i++) {
        const char *s = json_string_value(json_array_get(in, i));
        if (s && !strcmp(s, "message.output_text.logprobs")) r->logprobs = 1;
        else if (s && !strcmp(s, "reasoning.encrypted_content")) {
            /* m3's reasoning is in the clear: a client that asks for it encrypted gets it as it is */
        } else
            return R_BAD(e, "include", "'include[%zu]' (%.60s) is not supported (\"message.output_text.logprobs\", "
                         "\"reasoning.encrypted_content\")", i, s ? s : "not a string");
    }
    return 0;
}

/* ------------------------------------------------------------------ the request */

int m3_resp_previous_id(json_t *b, const char **id, m3_oai_error *e) {
    *id = NULL;
    json_t *v = json_is_object(b) ? json_object_get(b, "previous_response_id") : NULL;
    if (absent(v)) return 0;
    if (!json_is_string(v) || !json_string_length(v))
        return R_BAD(e, "previous_response_id", "'previous_response_id' must be a response id (a string)");
    *id = json_string_value(v);
    return 0;
}

/* the request's fields the response object repeats, with OpenAI's defaults */
static int echo(json_t *b, const m3_resp_req *r, json_t **res, m3_oai_error *e) {
    json_t *o = json_object();
    if (!o) return R_OOM(e);
    static const struct { const char *key; int kind; } F[] = { /* kind 0: as given, else null */
        {"instructions", 0}, {"max_output_tokens", 0}, {"temperature", 0}, {"top_p", 0}, {"user", 0},
        {"prompt_cache_key", 0}, {"safety_identifier", 0}};
    int bad = 0;
    for (size_t i = 0; i < sizeof F / sizeof *F; i++) {
        json_t *v = json_object_get(b, F[i].key);
        bad |= absent(v) ? set(o, F[i].key, json_null()) : ref(o, F[i].key, v);
    }
    json_t *v;
    bad |= set(o, "previous_response_id", r->previous_id ? json_string(r->previous_id) : json_null());
    bad |= absent(v = json_object_get(b, "metadata")) ? set(o, "metadata", json_object()) : ref(o, "metadata", v);
    bad |= set(o, "parallel_tool_calls", json_boolean(!json_is_false(json_object_get(b, "parallel_tool_calls"))));
    bad |= set(o, "store", json_boolean(r->store));
    bad |= set(o, "background", json_false());
    bad |= absent(v = json_object_get(b, "truncation")) ? set(o, "truncation", json_string("disabled")) : ref(o, "truncation", v);
    bad |= absent(v = json_object_get(b, "service_tier")) ? set(o, "service_tier", json_string("default")) : ref(o, "service_tier", v);
    bad |= absent(v = json_object_get(b, "top_logprobs")) ? set(o, "top_logprobs", json_integer(0)) : ref(o, "top_logprobs", v);
    /* tools as the request gave them; tool_choice as it applies (allowed_tools: as given) */
    bad |= absent(v = json_object_get(b, "tools")) ? set(o, "tools", json_array()) : ref(o, "tools", v);
    bad |= absent(v = json_object_get(b, "tool_choice")) ? set(o, "tool_choice", json_string("auto")) : ref(o, "tool_choice", v);
    json_t *tx = json_object_get(b, "text"), *f = json_object_get(tx, "format"), *vb = json_object_get(tx, "verbosity");
    json_t *t2 = json_object();
    bad |= !t2 || (absent(f) ? set(t2, "format", json_pack("{s:s}", "type", "text")) : ref(t2, "format", f)) ||
           (absent(vb) ? set(t2, "verbosity", json_string("medium")) : ref(t2, "verbosity", vb));
    bad |= set(o, "text", t2);
    json_t *rs = json_object_get(b, "reasoning"), *ef = json_object_get(rs, "effort"), *sm = json_object_get(rs, "summary");
    bad |= set(o, "reasoning", json_pack("{s:O,s:O}", "effort", absent(ef) ? json_null() : ef, "summary",
                                         absent(sm) ? json_null() : sm));
    if (bad) {
        json_decref(o);
        return R_OOM(e);
    }
    *res = o;
    return 0;
}

static int metadata(json_t *b, m3_oai_error *e) {
    json_t *m = json_object_get(b, "metadata");
    if (absent(m)) return 0;
    if (!json_is_object(m)) return R_BAD(e, "metadata", "'metadata' must be an object of strings");
    if (json_object_size(m) > M3_RESP_MAX_METADATA)
        return R_BAD(e, "metadata", "'metadata' has %zu pairs; the limit is %d", json_object_size(m), M3_RESP_MAX_METADATA);
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (strlen(k) > 64) return R_BAD(e, "metadata", "'metadata' keys are at most 64 characters ('%.64s...')", k);
        if (!json_is_string(v) || json_string_length(v) > 512)
            return R_BAD(e, "metadata", "'metadata.%.64s' must be a string of at most 512 characters", k);
    }
    return 0;
}

static int refused(json_t *b, m3_oai_error *e) {
    json_t *v;
    /* the chat endpoint's spellings: a client that sends them means something this API says otherwise */
    static const struct { const char *chat, *here; } CHAT[] = {
        {"messages", "'input' (a string or input items)"}, {"max_tokens", "'max_output_tokens'"},
        {"max_completion_tokens", "'max_output_tokens'"}, {"response_format", "'text.format'"},
        {"logprobs", "'include': [\"message.output_text.logprobs\"] with 'top_logprobs'"}};
    for (size_t i = 0; i < sizeof CHAT / sizeof *CHAT; i++)
        if (!absent(v = json_object_get(b, CHAT[i].chat)) && !json_is_false(v))
            return R_BAD(e, CHAT[i].chat, "'%s' is the chat endpoint's field; the Responses API's is %s", CHAT[i].chat, CHAT[i].here);
    if (!absent(v = json_object_get(b, "n")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return R_BAD(e, "n", "'n' is not supported: a response has one output (send n requests)");
    if (json_is_true(json_object_get(b, "background")))
        return R_BAD(e, "background", "background responses are not supported: stream the response instead");
    if (!absent(v = json_object_get(b, "background")) && !json_is_boolean(v)) return R_BAD(e, "background", "'background' must be a boolean");
    if (!absent(json_object_get(b, "conversation")))
        return R_BAD(e, "conversation", "conversations are not supported: continue a stored response with 'previous_response_id'");
    if (!absent(json_object_get(b, "prompt")))
        return R_BAD(e, "prompt", "stored prompts are not supported: send 'instructions' and 'input'");
    if (!absent(v = json_object_get(b, "store")) && !json_is_boolean(v)) return R_BAD(e, "store", "'store' must be a boolean");
    if (!absent(v = json_object_get(b, "instructions")) && !json_is_string(v))
        return R_BAD(e, "instructions", "'instructions' must be a string");
    const char *tr = json_string_value(v = json_object_get(b, "truncation"));
    if (!absent(v) && (!tr || (strcmp(tr, "auto") && strcmp(tr, "disabled"))))
        return R_BAD(e, "truncation", "'truncation' must be \"auto\" or \"disabled\"");
    static const char *const STR[] = {"user", "service_tier", "prompt_cache_key", "safety_identifier"};
    for (size_t i = 0; i < sizeof STR / sizeof *STR; i++)
        if (!absent(v = json_object_get(b, STR[i])) && !json_is_string(v)) return R_BAD(e, STR[i], "'%s' must be a string", STR[i]);
    return 0;
}

int m3_resp_add_history(json_t *out, json_t *b, json_t *history, m3_oai_error *e) {
    json_t *msgs = json_object_get(out, "messages");
    size_t at = json_is_string(json_object_get(b, "instructions")) ? 1 : 0; /* after the instructions' system message */
    if (json_array_size(msgs) + json_array_size(history) > M3_OAI_MAX_MESSAGES)
        return R_BAD(e, "previous_response_id", "the conversation has %zu messages with this request's; the limit is %d",
                     json_array_size(msgs) + json_array_size(history), M3_OAI_MAX_MESSAGES);
    for (size_t i = 0; i < json_array_size(history); i++)
        if (json_array_insert(msgs, at + i, json_array_get(history, i))) return R_OOM(e);
    return 0;
}

int m3_resp_to_oai(json_t *b, json_t *history, json_t **out, m3_resp_req *r, m3_oai_error *e) {
    *out = NULL;
    memset(r, 0, sizeof *r);
    if (!json_is_object(b)) return R_BAD(e, NULL, "the request body must be a JSON object");
    int rc = refused(b, e);
    if (!rc) rc = metadata(b, e);
    if (!rc) rc = m3_resp_previous_id(b, &r->previous_id, e);
    if (!rc) rc = include(b, r, e);
    if (rc) return rc;
    r->store = !json_is_false(json_object_get(b, "store"));
    r->truncate = !strcmp(json_string_value(json_object_get(b, "truncation")) ? json_string_value(json_object_get(b, "truncation")) : "", "auto");
    json_t *o = json_object(), *msgs = json_array();
    if (set(o, "messages", msgs)) { /* takes msgs whatever happens, o NULL too */
        json_decref(o);
        return R_OOM(e);
    }
    if (!(r->turn = json_array())) rc = R_OOM(e);
    json_t *v = json_object_get(b, "instructions");
    if (!rc && json_is_string(v) && add(msgs, json_pack("{s:s,s:O}", "role", "system", "content", v))) rc = R_OOM(e);
    if (!rc) rc = input_items(b, r->turn, e);
    if (!rc && !(r->items = listed_items(b))) rc = R_OOM(e);
    if (!rc && json_array_extend(msgs, r->turn)) rc = R_OOM(e);
    if (!rc && json_array_size(msgs) > M3_OAI_MAX_MESSAGES)
        rc = R_BAD(e, "input", "the conversation has %zu messages; the limit is %d", json_array_size(msgs), M3_OAI_MAX_MESSAGES);
    if (!rc && history) rc = m3_resp_add_history(o, b, history, e);
    /* the fields that mean the same on the chat endpoint: checked by its parser */
    static const char *const same[] = {"model", "stream", "temperature", "top_p", "parallel_tool_calls", "top_k", "min_p",
                                       "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
                                       "ignore_eos", "min_tokens", "logit_bias"};
    for (size_t i = 0; !rc && i < sizeof same / sizeof *same; i++)
        if ((v = json_object_get(b, same[i])) && ref(o, same[i], v)) rc = R_OOM(e);
    if (!rc && (v = json_object_get(b, "max_output_tokens")) && ref(o, "max_tokens", v)) rc = R_OOM(e);
    if (!rc && r->logprobs) {
        if (set(o, "logprobs", json_true())) rc = R_OOM(e);
        else if ((v = json_object_get(b, "top_logprobs")) && ref(o, "top_logprobs", v)) rc = R_OOM(e);
    }
    if (!rc) rc = tools(b, o, e);
    if (!rc) rc = tool_choice(b, o, e);
    if (!rc) rc = text_format(b, o, e);
    if (!rc) rc = reasoning(b, o, e);
    if (!rc) rc = echo(b, r, &r->echo, e);
    if (rc) {
        json_decref(o);
        m3_resp_req_free(r);
        return rc;
    }
    *out = o;
    return 0;
}

void m3_resp_req_free(m3_resp_req *r) {
    json_decref(r->echo);
    json_decref(r->turn);
    json_decref(r->items);
    r->echo = r->turn = r->items = NULL;
}

/* dst = src with every `from` replaced by `to` (cut to cap - 1 bytes) */
static void replace_all(char *dst, size_t cap, const char *src, const char *from, const char *to) {
    size_t n = 0, fl = strlen(from);
    for (const char *p = src; *p && n + 1 < cap;) {
        if (!strncmp(p, from, fl)) {
            for (const char *r = to; *r && n + 1 < cap; r++) dst[n++] = *r;
            p += fl;
        } else dst[n++] = *p++;
    }
    dst[n] = 0;
}

void m3_resp_error_names(m3_oai_error *e) {
    const char *code = e->code; /* kept: errorf below resets it */
    /* the fields spelled otherwise here: max_tokens, response_format, a tool's function.X */
    static const char *const R[][2] = {{"max_tokens", "max_output_tokens"}, {"response_format", "text.format"},
                                       {".function.", "."}};
    char p[sizeof e->param], m[sizeof e->message], t[sizeof e->message];
    snprintf(p, sizeof p, "%s", e->param);
    snprintf(m, sizeof m, "%s", e->message);
    int hit = 0;
    for (size_t i = 0; i < sizeof R / sizeof *R; i++) {
        if (!strstr(p, R[i][0]) && !strstr(m, R[i][0])) continue;
        hit = 1;
        replace_all(t, sizeof t, p, R[i][0], R[i][1]);
        snprintf(p, sizeof p, "%s", t);
        replace_all(t, sizeof t, m, R[i][0], R[i][1]);
        snprintf(m, sizeof m, "%s", t);
    }
    int overflow = code && !strcmp(code, "context_length_exceeded"); /* worded as clients recognise it: kept first */
    if (overflow && !strncmp(p, "messages", 8)) m3_oai_errorf(e, e->status, e->type, "input", "%s", m);
    else if (e->status == 400 && !strncmp(p, "messages", 8)) /* the chat messages the input became */
        m3_oai_errorf(e, e->status, e->type, "input", "in the conversation as chat messages (instructions, earlier responses, "
                      "then the input): %s", m);
    else if (hit) m3_oai_errorf(e, e->status, e->type, p, "%s", m); /* (cut at a character's end) */
    e->code = code;
}
