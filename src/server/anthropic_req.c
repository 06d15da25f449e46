/* Anthropic Messages requests translated to OpenAI chat requests (see anthropic.h). */
#include "anthropic.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/fault.h"
#include "../base/utf8.h"

static const char BAD[] = "invalid_request_error";

#define A_BAD(e, param, ...) m3_oai_errorf(e, 400, BAD, param, __VA_ARGS__)
#define A_OOM(e) m3_oai_errorf(e, 500, "server_error", NULL, "out of memory")

/* jansson reports a failed allocation as a NULL value or a nonzero return: set / append take
 * NULL values and fail, so that a chain of them ORed together says whether any failed */
static int set(json_t *o, const char *k, json_t *v) { return json_object_set_new(o, k, v) != 0; }
static int add(json_t *a, json_t *v) { return json_array_append_new(a, v) != 0; }
static int ref(json_t *o, const char *k, json_t *v) { return json_object_set(o, k, v) != 0; } /* borrowed value */

static const char *type_of(json_t *block) { return json_string_value(json_object_get(block, "type")); }

/* an image block's source -> an OpenAI image_url part (a data: URL, or the URL as it is) */
static json_t *image_part(json_t *blk, const char *param, m3_oai_error *e) {
    json_t *src = json_object_get(blk, "source");
    const char *st = json_string_value(json_object_get(src, "type"));
    json_t *url = NULL;
    if (st && !strcmp(st, "base64")) {
        json_t *mt = json_object_get(src, "media_type"), *data = json_object_get(src, "data");
        if (!json_is_string(mt) || !json_is_string(data)) {
            A_BAD(e, param, "%s.source: a base64 source needs 'media_type' and 'data' strings", param);
            return NULL;
        }
        size_t n = 5 + json_string_length(mt) + 8 + json_string_length(data);
        char *u = m3_fault_malloc(M3_FAULT_SERVER, n + 1);
        if (!u) { A_OOM(e); return NULL; }
        snprintf(u, n + 1, "data:%s;base64,%s", json_string_value(mt), json_string_value(data));
        url = json_stringn(u, n);
        free(u);
    } else if (st && !strcmp(st, "url")) {
        json_t *x = json_object_get(src, "url");
        if (!json_is_string(x)) {
            A_BAD(e, param, "%s.source: a url source needs a 'url' string", param);
            return NULL;
        }
        url = json_incref(x);
    } else {
        A_BAD(e, param, "%s.source.type must be \"base64\" or \"url\"", param);
        return NULL;
    }
    json_t *p = json_pack("{s:s,s:{s:o}}", "type", "image_url", "image_url", "url", url); /* takes url, NULL too */
    if (!p) A_OOM(e);
    return p;
}

static json_t *text_part(json_t *blk, const char *param, m3_oai_error *e) {
    json_t *t = json_object_get(blk, "text");
    if (!json_is_string(t)) {
        A_BAD(e, param, "%s: a text block needs a 'text' string", param);
        return NULL;
    }
    json_t *p = json_pack("{s:s,s:O}", "type", "text", "text", t);
    if (!p) A_OOM(e);
    return p;
}

/* text and image blocks (system, tool_result content): appended to parts as OpenAI parts */
static int plain_parts(json_t *blocks, const char *param, int images, json_t *parts, m3_oai_error *e) {
    for (size_t j = 0; j < json_array_size(blocks); j++) {
        json_t *b = json_array_get(blocks, j);
        const char *t = type_of(b);
        char p[96];
        snprintf(p, sizeof p, "%s[%zu]", param, j);
        json_t *x;
        if (t && !strcmp(t, "text")) x = text_part(b, p, e);
        else if (images && t && !strcmp(t, "image")) x = image_part(b, p, e);
        else return A_BAD(e, p, "%s: blocks of type '%.40s' are not supported here (text%s)", p, t ? t : "(none)",
                          images ? ", image" : "");
        if (!x) return e->status;
        if (add(parts, x)) return A_OOM(e);
    }
    return 0;
}

/* a tool_result block -> {"role": "tool", "tool_call_id", "content"} */
static json_t *tool_message(json_t *b, const char *param, m3_oai_error *e) {
    json_t *id = json_object_get(b, "tool_use_id"), *ct = json_object_get(b, "content");
    if (!json_is_string(id)) {
        A_BAD(e, param, "%s: a tool_result block needs a 'tool_use_id' string", param);
        return NULL;
    }
    json_t *m = json_object(), *parts = json_array();
    if (!m || !parts || set(m, "role", json_string("tool")) || ref(m, "tool_call_id", id)) goto oom;
    /* the template has no place for is_error: the model reads it at the front of the result */
    if (json_is_true(json_object_get(b, "is_error")) && add(parts, json_pack("{s:s,s:s}", "type", "text", "text", "Error: ")))
        goto oom;
    char p[96];
    snprintf(p, sizeof p, "%s.content", param);
    if (json_is_string(ct)) {
        if (add(parts, json_pack("{s:s,s:O}", "type", "text", "text", ct))) goto oom;
    } else if (json_is_array(ct)) {
        if (plain_parts(ct, p, 1, parts, e)) goto fail;
    } else if (ct && !json_is_null(ct)) {
        A_BAD(e, p, "%s must be a string or an array of text / image blocks", p);
        goto fail;
    }
    if (set(m, "content", parts)) { parts = NULL; goto oom; }
    return m;
oom:
    A_OOM(e);
fail:
    json_decref(m);
    json_decref(parts);
    return NULL;
}

/* user content blocks: text / image parts gathered into user messages, each tool_result a
 * tool message where it stands (Anthropic puts them first; any order is kept as given) */
static int user_message(json_t *ct, size_t i, json_t *out, m3_oai_error *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (json_is_string(ct)) return add(out, json_pack("{s:s,s:O}", "role", "user", "content", ct)) ? A_OOM(e) : 0;
    if (!json_is_array(ct)) return A_BAD(e, param, "%s must be a string or an array of content blocks", param);
    json_t *parts = NULL;
    for (size_t j = 0; j < json_array_size(ct); j++) {
        json_t *b = json_array_get(ct, j);
        const char *t = type_of(b);
        char p[96];
        snprintf(p, sizeof p, "%s[%zu]", param, j);
        json_t *x = NULL;
        if (t && !strcmp(t, "tool_result")) {
            if (parts) { /* the text before it goes first */
                if (add(out, json_pack("{s:s,s:o}", "role", "user", "content", parts))) return A_OOM(e);
                parts = NULL;
            }
            if (!(x = tool_message(b, p, e))) return e->status;
            if (add(out, x)) return A_OOM(e);
            continue;
        }
        if (t && !strcmp(t, "text")) x = text_part(b, p, e);
        else if (t && !strcmp(t, "image")) x = image_part(b, p, e);
        else {
            json_decref(parts);
            return A_BAD(e, p, "%s: content blocks of type '%.40s' are not supported in user messages (text, image, tool_result)",
                         p, t ? t : "(none)");
        }
        if (!x) { json_decref(parts); return e->status; }
        if ((!parts && !(parts = json_array())) || add(parts, x)) {
            if (!parts) json_decref(x);
            json_decref(parts);
            return A_OOM(e);
        }
    }
    if (parts && add(out, json_pack("{s:s,s:o}", "role", "user", "content", parts))) return A_OOM(e);
    return 0;
}

/* assistant blocks: text parts, thinking -> reasoning_content, tool_use -> tool_calls */
static int assistant_message(json_t *ct, size_t i, json_t *out, m3_oai_error *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (json_is_string(ct)) return add(out, json_pack("{s:s,s:O}", "role", "assistant", "content", ct)) ? A_OOM(e) : 0;
    if (!json_is_array(ct)) return A_BAD(e, param, "%s must be a string or an array of content blocks", param);
    json_t *m = json_object(), *parts = json_array(), *calls = NULL;
    char *reason = NULL;
    size_t rlen = 0;
    int rc = 0;
    if (!m || !parts || set(m, "role", json_string("assistant"))) goto oom;
    for (size_t j = 0; j < json_array_size(ct); j++) {
        json_t *b = json_array_get(ct, j);
        const char *t = type_of(b);
        char p[96];
        snprintf(p, sizeof p, "%s[%zu]", param, j);
        if (t && !strcmp(t, "text")) {
            json_t *x = text_part(b, p, e);
            if (!x) goto fail;
            if (add(parts, x)) goto oom;
        } else if (t && !strcmp(t, "thinking")) {
            json_t *th = json_object_get(b, "thinking");
            if (!json_is_string(th)) { A_BAD(e, p, "%s: a thinking block needs a 'thinking' string", p); goto fail; }
            char *nr = m3_fault_realloc(M3_FAULT_SERVER, reason, rlen + json_string_length(th) + 1);
            if (!nr) goto oom;
            reason = nr;
            memcpy(reason + rlen, json_string_value(th), json_string_length(th));
            rlen += json_string_length(th);
            reason[rlen] = 0;
        } else if (t && !strcmp(t, "redacted_thinking")) {
            /* another model's encrypted reasoning: nothing the template could write */
        } else if (t && !strcmp(t, "tool_use")) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *in = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(in)) {
                A_BAD(e, p, "%s: a tool_use block needs 'id' and 'name' strings and an 'input' object", p);
                goto fail;
            }
            if (!calls && (!(calls = json_array()) || set(m, "tool_calls", calls))) { calls = NULL; goto oom; }
            /* input is an object: the template writes its members as the model writes arguments */
            if (add(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function", "name", name,
                                     "arguments", in)))
                goto oom;
        } else {
            A_BAD(e, p, "%s: content blocks of type '%.40s' are not supported in assistant messages (text, thinking, "
                  "redacted_thinking, tool_use)", p, t ? t : "(none)");
            goto fail;
        }
    }
    if (set(m, "content", parts)) { parts = NULL; goto oom; }
    parts = NULL;
    if (reason && set(m, "reasoning_content", json_stringn(reason, rlen))) goto oom;
    if (add(out, m)) { m = NULL; goto oom; }
    free(reason);
    return 0;
oom:
    A_OOM(e);
fail:
    rc = e->status;
    free(reason);
    json_decref(parts);
    json_decref(m);
    return rc;
}

/* A final assistant turn is Anthropic's prefill (the OpenAI request gets continue_final_message).
 * A tool_use block anywhere in it cannot be continued: its tool_result must come first. */
static int prefill_tool_use(json_t *ct, const char *p, m3_oai_error *e) {
    for (size_t j = 0; json_is_array(ct) && j < json_array_size(ct); j++) {
        const char *ty = type_of(json_array_get(ct, j));
        if (ty && !strcmp(ty, "tool_use"))
            return A_BAD(e, p, "%s: a final assistant turn (prefill) cannot hold a tool_use block: send its "
                         "tool_result in a user message after it", p);
    }
    return 0;
}

/* ... and the answer continues the text of its last message with content (ct, not empty): its
 * last text block; *cont = 1. Refused as Anthropic's API refuses them: text ending in whitespace,
 * no text to continue (thinking blocks alone). */
static int prefill(json_t *ct, const char *p, int *cont, m3_oai_error *e) {
    const char *t = NULL;
    size_t n = 0;
    if (json_is_string(ct)) {
        t = json_string_value(ct);
        n = json_string_length(ct);
    } else if (json_is_array(ct)) {
        for (size_t j = 0; j < json_array_size(ct); j++) {
            json_t *b = json_array_get(ct, j), *x = json_object_get(b, "text");
            const char *ty = type_of(b);
            if (ty && !strcmp(ty, "text") && json_is_string(x)) {
                t = json_string_value(x);
                n = json_string_length(x);
            }
        }
        if (!t) return A_BAD(e, p, "%s: a final assistant message (prefill) needs a text block to continue", p);
        if (!n) return A_BAD(e, p, "%s: the final assistant message's last text block is empty", p);
    } else return 0; /* its type is refused with the other assistant messages' */
    if (m3_utf8_space_run(t, n, 1))
        return A_BAD(e, p, "%s: final assistant content cannot end with trailing whitespace", p);
    *cont = 1;
    return 0;
}

/* "" or no blocks */
static int empty_content(json_t *ct) {
    return (json_is_string(ct) && !json_string_length(ct)) || (json_is_array(ct) && !json_array_size(ct));
}

/* a message's content as OpenAI parts: a string one text part ("" none), an array as it is */
static json_t *parts_of(json_t *m) {
    json_t *ct = json_object_get(m, "content");
    if (json_is_array(ct)) return json_incref(ct);
    json_t *a = json_array();
    if (a && json_is_string(ct) && json_string_length(ct) && add(a, json_pack("{s:s,s:O}", "type", "text", "text", ct))) {
        json_decref(a);
        return NULL;
    }
    return a;
}

/* Anthropic combines consecutive user or assistant turns into one: translated, each message's
 * in turn, the messages of such a run are merged (content parts in order; an assistant's
 * reasoning and tool calls appended), which is the translation of their blocks as one message */
static int merge_turns(json_t *out, m3_oai_error *e) {
    for (size_t i = 1; i < json_array_size(out);) {
        json_t *a = json_array_get(out, i - 1), *b = json_array_get(out, i);
        const char *ra = json_string_value(json_object_get(a, "role")), *rb = json_string_value(json_object_get(b, "role"));
        if (!ra || !rb || strcmp(ra, rb) || (strcmp(ra, "user") && strcmp(ra, "assistant"))) { i++; continue; }
        json_t *pa = parts_of(a), *pb = parts_of(b);
        int bad = !pa || !pb || json_array_extend(pa, pb);
        if (!bad) bad = set(a, "content", pa); /* takes pa, also on failure */
        else json_decref(pa);
        json_decref(pb);
        json_t *rsa = json_object_get(a, "reasoning_content"), *rsb = json_object_get(b, "reasoning_content");
        if (!bad && json_is_string(rsb)) {
            size_t na = json_is_string(rsa) ? json_string_length(rsa) : 0, nb = json_string_length(rsb);
            char *r = m3_fault_malloc(M3_FAULT_SERVER, na + nb + 1);
            if (!r) bad = 1;
            else {
                if (na) memcpy(r, json_string_value(rsa), na);
                memcpy(r + na, json_string_value(rsb), nb);
                bad = set(a, "reasoning_content", json_stringn(r, na + nb));
                free(r);
            }
        }
        json_t *ta = json_object_get(a, "tool_calls"), *tb = json_object_get(b, "tool_calls");
        if (!bad && json_is_array(tb))
            bad = json_is_array(ta) ? json_array_extend(ta, tb) != 0 : set(a, "tool_calls", json_incref(tb));
        if (bad || json_array_remove(out, i)) return A_OOM(e);
    }
    return 0;
}

/* *cont: 1 when the last message is a prefill to continue */
static int messages(json_t *b, json_t *out, int *cont, m3_oai_error *e) {
    json_t *sys = json_object_get(b, "system");
    if (json_is_string(sys)) {
        if (add(out, json_pack("{s:s,s:O}", "role", "system", "content", sys))) return A_OOM(e);
    } else if (json_is_array(sys)) {
        json_t *parts = json_array();
        if (!parts) return A_OOM(e);
        if (plain_parts(sys, "system", 0, parts, e)) { json_decref(parts); return e->status; }
        if (add(out, json_pack("{s:s,s:o}", "role", "system", "content", parts))) return A_OOM(e);
    } else if (sys && !json_is_null(sys)) return A_BAD(e, "system", "'system' must be a string or an array of text blocks");
    json_t *msgs = json_object_get(b, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs))
        return A_BAD(e, "messages", "'messages' must be a non-empty array");
    const size_t n = json_array_size(msgs);
    if (n > M3_OAI_MAX_MESSAGES)
        return A_BAD(e, "messages", "'messages' has %zu entries; the limit is %d", n, M3_OAI_MAX_MESSAGES);
    /* the final run of assistant messages (one turn) is the prefill: its last message with content
     * is continued; its empty ones ("" or no blocks) add nothing */
    size_t run = n;
    while (run > 0 && json_is_string(json_object_get(json_array_get(msgs, run - 1), "role")) &&
           !strcmp(json_string_value(json_object_get(json_array_get(msgs, run - 1), "role")), "assistant"))
        run--;
    size_t last = n; /* the run's last message with content */
    for (size_t i = run; i < n; i++)
        if (!empty_content(json_object_get(json_array_get(msgs, i), "content"))) last = i;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *ct = json_object_get(m, "content");
        char p[48];
        snprintf(p, sizeof p, "messages[%zu]", i);
        int rc;
        if (!json_is_object(m)) return A_BAD(e, p, "%s must be an object {role, content}", p);
        if (role && !strcmp(role, "user")) rc = user_message(ct, i, out, e);
        else if (role && !strcmp(role, "assistant")) {
            if (i >= run) { /* in the final turn */
                if (empty_content(ct)) continue; /* adds nothing */
                if ((rc = prefill_tool_use(ct, p, e)) || (i == last && (rc = prefill(ct, p, cont, e)))) return rc;
            }
            rc = assistant_message(ct, i, out, e);
        } else return A_BAD(e, p, "%s.role must be \"user\" or \"assistant\" (the system prompt goes in 'system')", p);
        if (rc) return rc;
    }
    return merge_turns(out, e);
}

static int tools(json_t *b, json_t *out, m3_oai_error *e) {
    json_t *tl = json_object_get(b, "tools");
    if (!tl || json_is_null(tl)) return 0;
    if (!json_is_array(tl)) return A_BAD(e, "tools", "'tools' must be an array");
    if (json_array_size(tl) > M3_OAI_MAX_TOOLS)
        return A_BAD(e, "tools", "'tools' has %zu entries; the limit is %d", json_array_size(tl), M3_OAI_MAX_TOOLS);
    json_t *a = json_array();
    if (!a || set(out, "tools", a)) return A_OOM(e);
    for (size_t i = 0; i < json_array_size(tl); i++) {
        json_t *t = json_array_get(tl, i), *name = json_object_get(t, "name"), *sc = json_object_get(t, "input_schema");
        json_t *d = json_object_get(t, "description");
        const char *ty = type_of(t);
        char p[32];
        snprintf(p, sizeof p, "tools[%zu]", i);
        if (ty && strcmp(ty, "custom"))
            return A_BAD(e, p, "%s: tools of type '%.60s' are not supported (custom tools with an input_schema are)", p, ty);
        if (!json_is_string(name) || !json_is_object(sc))
            return A_BAD(e, p, "%s needs a 'name' string and an 'input_schema' object", p);
        if (d && !json_is_null(d) && !json_is_string(d)) return A_BAD(e, p, "%s.description must be a string", p);
        json_t *st = json_object_get(t, "strict");
        if (st && !json_is_null(st) && !json_is_boolean(st)) return A_BAD(e, p, "%s.strict must be a boolean", p);
        /* in the order OpenAI clients write functions: the template writes them as JSON */
        json_t *fn = json_pack("{s:O}", "name", name);
        if (fn && ((json_is_string(d) && ref(fn, "description", d)) || ref(fn, "parameters", sc) ||
                   (json_is_true(st) && ref(fn, "strict", st)))) {
            json_decref(fn);
            fn = NULL;
        }
        if (add(a, json_pack("{s:s,s:o}", "type", "function", "function", fn))) /* fn NULL: the pack fails */
            return A_OOM(e);
    }
    return 0;
}

/* output_config {format: {type: json_schema, schema}, effort} and the beta's top-level
 * output_format: the answer is a JSON document of the schema (OpenAI's response_format);
 * effort is checked and has no effect */
static int output_format(json_t *b, json_t *out, m3_oai_error *e) {
    json_t *oc = json_object_get(b, "output_config"), *f = NULL;
    const char *param = "output_config.format";
    if (oc && !json_is_null(oc)) {
        if (!json_is_object(oc)) return A_BAD(e, "output_config", "'output_config' must be an object");
        json_t *ef = json_object_get(oc, "effort");
        if (ef && !json_is_null(ef) && !json_is_string(ef)) return A_BAD(e, "output_config", "'output_config.effort' must be a string");
        f = json_object_get(oc, "format");
    }
    json_t *of = json_object_get(b, "output_format");
    if (of && !json_is_null(of)) {
        if (f && !json_is_null(f)) return A_BAD(e, "output_format", "'output_format' beside 'output_config.format': give one of them");
        f = of;
        param = "output_format";
    }
    if (!f || json_is_null(f)) return 0;
    const char *t = type_of(f);
    if (!json_is_object(f) || !t || strcmp(t, "json_schema"))
        return A_BAD(e, param, "'%s' must be {\"type\": \"json_schema\", \"schema\": {...}}", param);
    json_t *sc = json_object_get(f, "schema");
    if (!json_is_object(sc)) return A_BAD(e, param, "'%s.schema' must be a JSON schema (an object)", param);
    if (set(out, "response_format", json_pack("{s:s,s:{s:s,s:O}}", "type", "json_schema", "json_schema", "name", "output", "schema", sc)))
        return A_OOM(e);
    return 0;
}

static int tool_choice(json_t *b, json_t *out, m3_oai_error *e) {
    json_t *tc = json_object_get(b, "tool_choice");
    if (!tc || json_is_null(tc)) return 0;
    const char *t = type_of(tc);
    if (!json_is_object(tc) || !t)
        return A_BAD(e, "tool_choice", "'tool_choice' must be an object {type: auto | any | tool | none}");
    json_t *v;
    if (!strcmp(t, "auto")) v = json_string("auto");
    else if (!strcmp(t, "any")) v = json_string("required");
    else if (!strcmp(t, "none")) v = json_string("none");
    else if (!strcmp(t, "tool")) {
        json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) return A_BAD(e, "tool_choice", "'tool_choice' of type \"tool\" needs a 'name' string");
        v = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name);
    } else return A_BAD(e, "tool_choice", "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\"");
    if (set(out, "tool_choice", v)) return A_OOM(e);
    json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (dp && !json_is_null(dp) && !json_is_boolean(dp))
        return A_BAD(e, "tool_choice", "'tool_choice.disable_parallel_tool_use' must be a boolean");
    if (json_is_true(dp) && set(out, "parallel_tool_calls", json_false())) return A_OOM(e);
    return 0;
}

static int thinking(json_t *b, json_t *out, m3_oai_error *e) {
    json_t *th = json_object_get(b, "thinking");
    if (!th || json_is_null(th)) return 0;
    const char *t = type_of(th);
    if (!json_is_object(th) || !t)
        return A_BAD(e, "thinking", "'thinking' must be an object {type: enabled | disabled | adaptive}");
    const char *mode;
    if (!strcmp(t, "enabled")) {
        json_t *bt = json_object_get(th, "budget_tokens");
        if (!json_is_integer(bt) || json_integer_value(bt) < 1)
            return A_BAD(e, "thinking", "'thinking.budget_tokens' must be a positive integer");
        mode = "enabled";
        /* enforced: the reasoning closes after budget_tokens tokens (vLLM's thinking_token_budget;
         * past what that takes, no limit) */
        if (set(out, "thinking_token_budget", json_integer(json_integer_value(bt) < INT32_MAX ? json_integer_value(bt) : INT32_MAX)))
            return A_OOM(e);
    } else if (!strcmp(t, "disabled")) mode = "disabled";
    else if (!strcmp(t, "adaptive")) mode = "adaptive";
    else return A_BAD(e, "thinking", "'thinking.type' must be \"enabled\", \"disabled\" or \"adaptive\"");
    if (set(out, "chat_template_kwargs", json_pack("{s:s}", "thinking_mode", mode))) return A_OOM(e);
    return 0;
}

int m3_anth_to_oai(json_t *b, int count_only, json_t **out, m3_oai_error *e) {
    *out = NULL;
    if (!json_is_object(b)) return A_BAD(e, NULL, "the request body must be a JSON object");
    json_t *o = json_object(), *msgs = json_array();
    if (set(o, "messages", msgs)) { /* takes msgs whatever happens, o NULL too */
        json_decref(o);
        return A_OOM(e);
    }
    int rc = 0;
    json_t *v = json_object_get(b, "model");
    if (!json_is_string(v)) rc = A_BAD(e, "model", "'model' is required (a string)");
    if (!rc && ref(o, "model", v)) rc = A_OOM(e);
    if (!rc && !count_only) {
        v = json_object_get(b, "max_tokens");
        if (!v || json_is_null(v)) rc = A_BAD(e, "max_tokens", "'max_tokens' is required");
        else if (ref(o, "max_tokens", v)) rc = A_OOM(e); /* its type and range: checked as OpenAI's */
        /* the sampling fields mean the same in both APIs: checked by the OpenAI parser */
        static const char *const same[] = {"stream", "temperature", "top_p", "top_k"};
        for (size_t i = 0; !rc && i < sizeof same / sizeof *same; i++)
            if ((v = json_object_get(b, same[i])) && ref(o, same[i], v)) rc = A_OOM(e);
        v = json_object_get(b, "stop_sequences");
        if (!rc && v && !json_is_null(v)) {
            for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++)
                if (!json_is_string(json_array_get(v, i))) v = NULL;
            if (!json_is_array(v)) rc = A_BAD(e, "stop_sequences", "'stop_sequences' must be an array of strings");
            else if (ref(o, "stop", v)) rc = A_OOM(e);
        }
    }
    v = json_object_get(b, "metadata");
    if (!rc && v && !json_is_null(v) && !json_is_object(v)) rc = A_BAD(e, "metadata", "'metadata' must be an object");
    int cont = 0;
    if (!rc) rc = messages(b, msgs, &cont, e);
    /* a prefill: the prompt ends inside the final assistant turn, cut as Hugging Face's
     * apply_chat_template(continue_final_message=True) cuts it */
    if (!rc && cont && (set(o, "continue_final_message", json_true()) || set(o, "add_generation_prompt", json_false())))
        rc = A_OOM(e);
    if (!rc) rc = tools(b, o, e);
    if (!rc) rc = tool_choice(b, o, e);
    if (!rc) rc = thinking(b, o, e);
    if (!rc) rc = output_format(b, o, e);
    if (rc) {
        json_decref(o);
        return rc;
    }
    *out = o;
    return 0;
}

size_t m3_anth_error_json(char *buf, size_t cap, int status, const char *msg) {
    const char *type = status == 400 ? BAD
                       : status == 401 ? "authentication_error"
                       : status == 403 ? "permission_error"
                       : status == 404 ? "not_found_error"
                       : status == 413 ? "request_too_large"
                       : status == 429 ? "rate_limit_error"
                       : status == 503 || status == 529 ? "overloaded_error"
                       : status >= 500 ? "api_error"
                                       : BAD;
    size_t n = 0;
    if (!cap) return 0;
#define PUT(c) do { if (n + 1 < cap) buf[n++] = (c); } while (0)
#define PUTS(str) do { for (const char *q_ = (str); *q_; q_++) PUT(*q_); } while (0)
    PUTS("{\"type\":\"error\",\"error\":{\"type\":\"");
    PUTS(type);
    PUTS("\",\"message\":\"");
    /* the message is cut rather than the JSON: room is kept for its closing bytes */
    for (const unsigned char *q = (const unsigned char *)(msg ? msg : ""); *q && n + 6 + 4 < cap; q++) {
        if (*q == '"' || *q == '\\') { PUT('\\'); PUT((char)*q); }
        else if (*q < 0x20) { char u[8]; snprintf(u, sizeof u, "\\u%04x", *q); PUTS(u); }
        else PUT((char)*q);
    }
    PUTS("\"}}");
#undef PUTS
#undef PUT
    buf[n] = 0;
    return n;
}
