/* OpenAI request parsing and validation (see openai.h). */
#include "openai.h"

#include <ctype.h>
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "../base/fault.h"

#define o_malloc(n) m3_fault_malloc(M3_FAULT_SERVER, n)
#define o_realloc(p, n) m3_fault_realloc(M3_FAULT_SERVER, p, n)

static const char BAD[] = "invalid_request_error";

/* Makes s valid UTF-8 in place: bytes that begin no valid character become '?', an
 * unfinished character at the end is cut. */
static void utf8_fix(char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n) {
        int k = m3_utf8_len((const uint8_t *)s + i, n - i);
        if (k > 0) { i += (size_t)k; continue; }
        if (k == 0) { s[i] = 0; return; }
        s[i++] = '?';
    }
}

int m3_oai_errorf(m3_oai_error *e, int status, const char *type, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    m3_oai_verrorf(e, status, type, param, fmt, ap);
    va_end(ap);
    return status;
}

int m3_oai_verrorf(m3_oai_error *e, int status, const char *type, const char *param, const char *fmt, va_list ap) {
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    utf8_fix(e->message);
    if (!e->message[0]) snprintf(e->message, sizeof e->message, "error %d", status);
    e->status = status;
    e->type = type;
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    utf8_fix(e->param);
    return status;
}

#define OAI_BAD(e, param, ...) m3_oai_errorf(e, 400, BAD, param, __VA_ARGS__)
#define OAI_OOM(e) m3_oai_errorf(e, 500, "server_error", NULL, "out of memory")
/* a failure of the tokenizer (err): its memory the server's (500, told by err's kind, since the
 * message may quote the text), the rest the request's (400) */
#define OAI_TOK(e, err, param, ...) m3_oai_errorf(e, (err).oom ? 500 : 400, (err).oom ? "server_error" : BAD, param, __VA_ARGS__)

/* text quoted from the request, at most ~60 bytes, cut at a character boundary */
static const char *clip(const char *s, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", s);
    if (strlen(s) >= cap) {
        size_t k = cap > 4 ? cap - 4 : 0;
        while (k && ((unsigned char)buf[k] & 0xC0) == 0x80) k--;
        memcpy(buf + k, "...", 4);
    }
    utf8_fix(buf);
    return buf;
}

int m3_oai_parse_body(const char *text, size_t len, json_t **body, m3_oai_error *e) {
    json_error_t je;
    m3_fault_suspend(1); /* jansson's lexer does not survive a failed allocation (fault.h) */
    json_t *j = json_loadb(text ? text : "", len, 0, &je);
    m3_fault_suspend(0);
    *body = NULL;
    if (!j) {
        if (json_error_code(&je) == json_error_out_of_memory) return OAI_OOM(e);
        return OAI_BAD(e, NULL, "invalid JSON body: %s (line %d, column %d)", je.text, je.line, je.column);
    }
    if (!json_is_object(j)) {
        json_decref(j);
        return OAI_BAD(e, NULL, "the request body must be a JSON object");
    }
    *body = j;
    return 0;
}

/* ------------------------------------------------------------------ fields */

/* absent / null: *out kept, 0; wrong type or range: the 400 */
static int get_num(m3_oai_error *e, json_t *b, const char *k, double lo, double hi, double *out) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return OAI_BAD(e, k, "'%s' must be a number", k);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return OAI_BAD(e, k, "'%s' must be in [%g, %g]", k, lo, hi);
    *out = x;
    return 0;
}

static int get_int(m3_oai_error *e, json_t *b, const char *k, long long lo, long long hi, long long *out) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return OAI_BAD(e, k, "'%s' must be an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return OAI_BAD(e, k, "'%s' must be in [%lld, %lld]", k, lo, hi);
    *out = x;
    return 0;
}

static int get_bool(m3_oai_error *e, json_t *b, const char *k, int *out) {
    json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return OAI_BAD(e, k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 0;
}

int m3_oai_ids(json_t *a, int vocab, const char *param, int32_t **ids, size_t *n, m3_oai_error *e) {
    size_t k = json_array_size(a);
    int32_t *v = o_malloc((k ? k : 1) * sizeof *v);
    if (!v) return OAI_OOM(e);
    for (size_t i = 0; i < k; i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab) {
            free(v);
            return OAI_BAD(e, param, "token id at index %zu is not an integer in [0, %d)", i, vocab);
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    *ids = v;
    *n = k;
    return 0;
}

void m3_oai_params_free(m3_oai_params *g) {
    free(g->ids);
    free(g->stop_ids);
    free(g->bias);
    free(g->echo_text);
    free(g->constraint_text);
    free(g->allowed);
    free(g->bad_ids);
    free(g->bad_off);
    m3_engine_grammar_release(g->grammar);
    m3_media_free(&g->media);
    memset(g, 0, sizeof *g);
}

/* Assistant tool calls sent back the OpenAI way carry function.arguments as a JSON string; the
 * template writes an object's members as the model writes them (<city>Paris</city>) and a string
 * as it is, so, as vLLM does, a string holding a JSON object becomes that object before
 * rendering (one that does not parse stays a string). msgs is the body's (or an earlier render
 * copy, *out); when anything changes, *out becomes a copy with the objects (the old *out freed).
 * 0, or the status of the error in e (no memory). */
static int tool_args_objects(json_t *msgs, json_t **out, m3_oai_error *e) {
    int any = 0;
    for (size_t i = 0; !any && i < json_array_size(msgs); i++) {
        json_t *tc = json_object_get(json_array_get(msgs, i), "tool_calls");
        for (size_t k = 0; !any && k < json_array_size(tc); k++)
            any = json_is_string(json_object_get(json_object_get(json_array_get(tc, k), "function"), "arguments"));
    }
    if (!any) return 0;
    /* a render copy: the body stays as the client sent it. jansson's copy drops what it finds no
     * memory for without a word: a copy that is not equal is no copy. */
    json_t *copy = json_deep_copy(msgs);
    if (!copy || !json_equal(copy, msgs)) {
        json_decref(copy);
        return m3_oai_errorf(e, 500, "server_error", NULL, "out of memory");
    }
    for (size_t i = 0; i < json_array_size(copy); i++) {
        json_t *tc = json_object_get(json_array_get(copy, i), "tool_calls");
        for (size_t k = 0; k < json_array_size(tc); k++) {
            json_t *fn = json_object_get(json_array_get(tc, k), "function");
            json_t *a = json_object_get(fn, "arguments");
            if (!json_is_string(a)) continue;
            /* jansson's parser mishandles a failed allocation (akheron/jansson#362): parsed with
             * injection suspended, as request bodies are (fault.h); a real one reads as no object */
            json_error_t je;
            m3_fault_suspend(1);
            /* a key twice (the parser streams duplicates as they come): the last wins (parsers.h) */
            json_t *o = json_loadb(json_string_value(a), json_string_length(a), 0, &je);
            m3_fault_suspend(0);
            if (!o && json_error_code(&je) == json_error_out_of_memory) {
                json_decref(copy);
                return m3_oai_errorf(e, 500, "server_error", NULL, "out of memory");
            }
            int bad = json_is_object(o) && json_object_set(fn, "arguments", o); /* set takes its own reference */
            json_decref(o);
            if (bad) {
                json_decref(copy);
                return m3_oai_errorf(e, 500, "server_error", NULL, "out of memory");
            }
        }
    }
    json_decref(*out);
    *out = copy;
    return 0;
}

/* chat_template_kwargs, with enable_thinking: false spelled as the template's thinking_mode
 * "disabled": a new reference, or NULL (the error in e) */
static json_t *chat_kwargs(m3_oai_error *e, json_t *b) {
    json_t *kw = json_object_get(b, "chat_template_kwargs");
    if (!kw || json_is_null(kw)) kw = NULL;
    else if (!json_is_object(kw)) {
        OAI_BAD(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        return NULL;
    }
    /* copied key by key: json_copy drops the keys it finds no memory for, silently */
    json_t *r = json_object();
    if (!r) { OAI_OOM(e); return NULL; }
    const char *k;
    json_t *v;
    if (kw)
        json_object_foreach(kw, k, v) {
            if (json_object_set(r, k, v)) {
                json_decref(r);
                OAI_OOM(e);
                return NULL;
            }
        }
    if (json_is_false(json_object_get(r, "enable_thinking")) && !json_object_get(r, "thinking_mode")) {
        json_t *d = json_string("disabled");
        if (!d || json_object_set_new(r, "thinking_mode", d)) {
            json_decref(r);
            OAI_OOM(e);
            return NULL;
        }
    }
    /* OpenAI's reasoning_effort, where the kwargs leave thinking alone: "none" turns thinking off,
     * any other effort on (the template has a switch, not a budget), as /v1/responses does */
    json_t *re = json_object_get(b, "reasoning_effort");
    if (re && !json_is_null(re)) {
        static const char *const EFF[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
        const char *es = json_string_value(re);
        int known = 0;
        for (size_t i = 0; es && i < sizeof EFF / sizeof *EFF; i++) known |= !strcmp(es, EFF[i]);
        if (!known) {
            json_decref(r);
            OAI_BAD(e, "reasoning_effort", "'reasoning_effort' must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\"");
            return NULL;
        }
        if (!json_object_get(r, "thinking_mode") && !json_object_get(r, "enable_thinking") &&
            json_object_set_new(r, "thinking_mode", json_string(strcmp(es, "none") ? "enabled" : "disabled"))) {
            json_decref(r);
            OAI_OOM(e);
            return NULL;
        }
    }
    return r;
}

/* continue_final_message: the last message's text (a string, or its last part with text; ""
 * continues nothing: the conversation without a generation prompt) */
static int final_text(json_t *msgs, const char **t, size_t *len, m3_oai_error *e) {
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1), *ct = json_object_get(last, "content");
    if (json_is_array(ct))
        for (size_t i = json_array_size(ct); i-- > 0;) {
            json_t *p = json_array_get(ct, i);
            if (json_is_string(json_object_get(p, "text"))) {
                ct = json_object_get(p, "text");
                break;
            }
        }
    if (!json_is_string(ct))
        return OAI_BAD(e, "continue_final_message", "continue_final_message is set but the final message has no text to continue");
    *t = json_string_value(ct);
    *len = json_string_length(ct);
    return 0;
}

/* The rendered prompt cut where Hugging Face's apply_chat_template(continue_final_message=True)
 * cuts it: at the last place the final message's text (stripped of surrounding whitespace)
 * appears, after the text with its trailing whitespace when the template kept it, else after
 * the stripped text; -1 when it appears nowhere. */
static int cut_after_final(char *text, size_t *len, const char *f, size_t fl) {
    const size_t a = m3_utf8_space_run(f, fl, 0), z = a < fl ? m3_utf8_space_run(f + a, fl - a, 1) : 0;
    const char *st = f + a;
    const size_t sl = fl - a - z; /* strip(f) */
    size_t loc = *len;            /* Python's rindex of "": the end */
    if (sl) {
        size_t i = *len >= sl ? *len - sl + 1 : 0;
        while (i-- > 0 && memcmp(text + i, st, sl)) {}
        if (i == (size_t)-1) return -1;
        loc = i;
    }
    /* rendered[loc : loc + len(lstrip(f))] == f: f had no leading whitespace and the template kept it whole */
    const size_t cut = a == 0 && loc + fl <= *len && !memcmp(text + loc, f, fl) ? loc + fl : loc + sl;
    *len = cut;
    text[cut] = 0;
    return 0;
}

/* 1 when text[0..n) ends inside the reasoning: in its final turn (after the last turn header
 * "]~b]" of the MiniMax template), the last <mm:think> after the last </mm:think>; tags in
 * earlier turns (quoted by a user, say) do not count */
static int ends_in_think(const char *text, size_t n) {
    static const char op[] = "<mm:think>", cl[] = "</mm:think>", turn[] = "]~b]";
    size_t from = 0;
    for (size_t i = n >= sizeof turn - 1 ? n - (sizeof turn - 1) + 1 : 0; i-- > 0;)
        if (!memcmp(text + i, turn, sizeof turn - 1)) { from = i; break; }
    long lo = -1, lc = -1;
    for (size_t i = from; i + sizeof op - 1 <= n; i++) {
        if (!memcmp(text + i, op, sizeof op - 1)) lo = (long)i;
        if (i + sizeof cl - 1 <= n && !memcmp(text + i, cl, sizeof cl - 1)) lc = (long)i;
    }
    return lo > lc;
}

int m3_oai_chat_prompt(const m3_oai_ctx *c, json_t *b, int32_t **ids, size_t *n, m3_media *media, int *cont, int *agp_out,
                       m3_oai_error *e) {
    json_t *msgs = json_object_get(b, "messages");
    if (cont) *cont = -1;
    /* a template of the request's own: chat_template, or chat_template_kwargs.chat_template (the
     * keyword of apply_chat_template, which wins as it does in vLLM); served only under
     * --trust-request-chat-template, refused with vLLM's words otherwise */
    const char *tparam = "chat_template";
    json_t *ctpl = json_object_get(b, "chat_template"), *kwo = json_object_get(b, "chat_template_kwargs");
    json_t *kwt = json_is_object(kwo) ? json_object_get(kwo, "chat_template") : NULL;
    if (ctpl && json_is_null(ctpl)) ctpl = NULL;
    if (!c->trust_templates && (ctpl || (kwt && !json_is_null(kwt))))
        return OAI_BAD(e, ctpl ? "chat_template" : "chat_template_kwargs.chat_template",
                       "Chat template is passed with request, but --trust-request-chat-template is not set. "
                       "Refused request with untrusted chat template.");
    if (kwt) { /* the kwargs' key, even null (the model's template then), wins as vLLM's update() makes it */
        ctpl = json_is_null(kwt) ? NULL : kwt;
        tparam = "chat_template_kwargs.chat_template";
    }
    if (ctpl && !json_is_string(ctpl)) return OAI_BAD(e, tparam, "'%s' must be a string (a Jinja template)", tparam);
    if (ctpl && !json_string_length(ctpl)) ctpl = NULL; /* "": the model's, as vLLM's `or` falls back */
    if (!json_is_array(msgs) || !json_array_size(msgs))
        return OAI_BAD(e, "messages", "'messages' must be a non-empty array");
    if (json_array_size(msgs) > M3_OAI_MAX_MESSAGES)
        return OAI_BAD(e, "messages", "'messages' has %zu entries; the limit is %d", json_array_size(msgs),
                       M3_OAI_MAX_MESSAGES);
    if (!c->chat && !ctpl) return OAI_BAD(e, NULL, "this model has no chat template");
    json_t *tools = json_object_get(b, "tools");
    if (tools && json_is_null(tools)) tools = NULL;
    if (tools && !json_is_array(tools)) return OAI_BAD(e, "tools", "'tools' must be an array");
    if (json_array_size(tools) > M3_OAI_MAX_TOOLS)
        return OAI_BAD(e, "tools", "'tools' has %zu entries; the limit is %d", json_array_size(tools), M3_OAI_MAX_TOOLS);
    int agp = 1, cfm = 0, rc;
    if ((rc = get_bool(e, b, "add_generation_prompt", &agp)) || (rc = get_bool(e, b, "continue_final_message", &cfm))) return rc;
    /* continue_final_message (vLLM, Hugging Face's apply_chat_template): the prompt ends inside the
     * last message, which the model goes on writing (an assistant turn begun by the client) */
    const char *final = NULL;
    size_t final_len = 0;
    if (cfm) {
        if (agp && json_is_true(json_object_get(b, "add_generation_prompt")))
            return OAI_BAD(e, "continue_final_message",
                           "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
        agp = 0;
        if ((rc = final_text(msgs, &final, &final_len, e))) return rc;
    }
    /* images: decoded now (their sizes give their token counts); the template sees image parts */
    m3_media local = {0}, *mm = media ? media : &local;
    json_t *render = NULL;
    if ((rc = m3_media_collect(c->media, msgs, &render, mm, e))) {
        m3_media_free(&local);
        return rc;
    }
    if ((rc = tool_args_objects(render ? render : msgs, &render, e))) {
        json_decref(render);
        m3_media_free(&local);
        return rc;
    }
    json_t *kw = chat_kwargs(e, b);
    if (!kw) {
        json_decref(render);
        m3_media_free(&local);
        return e->status;
    }
    json_object_del(kw, "chat_template"); /* the template itself, not a variable */
    m3_chat *own = NULL; /* the request's template, with the model's special tokens */
    if (ctpl) {
        m3_err perr;
        own = m3_chat_derive(c->chat, json_string_value(ctpl), json_string_length(ctpl), tparam, &perr);
        if (!own) {
            json_decref(kw);
            json_decref(render);
            m3_media_free(&local);
            if (perr.oom) return m3_oai_errorf(e, 500, "server_error", NULL, "%s", perr.msg);
            return OAI_BAD(e, tparam, "%s", perr.msg);
        }
    }
    const m3_chat *chat = own ? own : c->chat;
    { /* a kwarg adds a template variable; it never replaces the validated request (vLLM refuses them too) */
        const char *k;
        json_t *v;
        json_object_foreach(kw, k, v)
            if (m3_chat_defines(chat, k)) { /* k belongs to kw: the error is written first */
                char param[96];
                snprintf(param, sizeof param, "chat_template_kwargs.%.60s", k);
                m3_oai_errorf(e, 400, "invalid_request_error", param,
                              "'chat_template_kwargs' cannot set '%.60s': the request (or the tokenizer's config) defines it", k);
                json_decref(kw);
                json_decref(render);
                m3_chat_free(own);
                m3_media_free(&local);
                return e->status;
            }
    }
    m3_err err;
    size_t len;
    char *text = m3_chat_render(chat, render ? render : msgs, tools, agp, kw, NULL, &len, &err);
    json_decref(kw);
    json_decref(render);
    const int own_tpl = own != NULL; /* the prompt's faults below are then the request template's */
    m3_chat_free(own);
    if (!text) {
        m3_media_free(&local);
#ifdef __GLIBC__
        malloc_trim(0); /* a render stopped at its memory limit leaves up to 1 GiB free but held */
#endif
    }
    /* the template's own failures are the request's (400); memory is the server's (500), told by
     * the error's kind, not its text (a template's raise_exception may say "out of memory") */
    if (!text && err.oom) return m3_oai_errorf(e, 500, "server_error", NULL, "chat template: %s", err.msg);
    if (!text && own_tpl) return OAI_BAD(e, tparam, "%s", err.msg); /* the message names the field */
    if (!text) return OAI_BAD(e, "messages", "chat template: %s", err.msg);
    if (cfm && cut_after_final(text, &len, final, final_len)) {
        free(text);
        m3_media_free(&local);
        return OAI_BAD(e, "continue_final_message",
                       "continue_final_message is set but the final message does not appear in the chat after applying the "
                       "chat template (the template changes or drops it)");
    }
    if (cfm && cont) *cont = c->reasoning_parser && ends_in_think(text, len);
    if (agp_out) *agp_out = agp;
    rc = 0;
    if (m3_tok_encode(c->tok, text, len, 1, ids, n, &err))
        rc = OAI_TOK(e, err, own_tpl ? tparam : "messages", "cannot tokenize the prompt%s: %s",
                     own_tpl ? " the request's chat_template rendered" : "", err.msg);
    free(text);
    if (!rc && mm->px.n_images && (rc = m3_media_expand(c->media, mm, ids, n, e)) && own_tpl && e->status == 400)
        snprintf(e->param, sizeof e->param, "%s", tparam); /* its image placeholders are the template's doing */
    m3_media_free(&local);
    return rc;
}

/* one prompt of a completions request (a string or token ids), appended to g */
static int add_prompt(const m3_oai_ctx *c, json_t *p, const char *param, m3_oai_params *g, m3_oai_error *e) {
    m3_err err;
    int32_t *ids = NULL;
    size_t n = 0;
    char *echo = NULL;
    size_t elen = 0;
    int rc = 0;
    if (json_is_string(p)) {
        if (m3_tok_encode(c->tok, json_string_value(p), json_string_length(p), 1, &ids, &n, &err))
            return OAI_TOK(e, err, param, "cannot tokenize the prompt: %s", err.msg);
        if (g->echo) {
            elen = json_string_length(p);
            if (!(echo = o_malloc(elen + 1))) rc = OAI_OOM(e);
            else memcpy(echo, json_string_value(p), elen + 1);
        }
    } else if (json_is_array(p)) {
        rc = m3_oai_ids(p, c->vocab, param, &ids, &n, e);
        if (!rc && g->echo && n && !(echo = m3_tok_decode(c->tok, ids, n, 0, &elen, &err)))
            rc = OAI_TOK(e, err, param, "cannot decode the prompt: %s", err.msg);
    } else {
        return OAI_BAD(e, param, "a prompt must be a string or an array of token ids");
    }
    if (!rc && !n) rc = OAI_BAD(e, param, "the prompt is empty");
    if (!rc && g->truncate > 0 && n > (size_t)g->truncate) { /* truncate_prompt_tokens: its last (first) tokens; echo: their text */
        if (!g->trunc_right) memmove(ids, ids + (n - (size_t)g->truncate), sizeof *ids * (size_t)g->truncate);
        n = (size_t)g->truncate;
        if (g->echo) {
            free(echo);
            if (!(echo = m3_tok_decode(c->tok, ids, n, 0, &elen, &err)))
                rc = OAI_TOK(e, err, param, "cannot decode the prompt: %s", err.msg);
        }
    }
    if (!rc && n) {
        int32_t *ni = o_realloc(g->ids, sizeof *ni * (g->n_ids + n));
        if (!ni) rc = OAI_OOM(e);
        else {
            g->ids = ni;
            memcpy(g->ids + g->n_ids, ids, sizeof *ids * n);
            g->n_ids += n;
        }
    }
    if (!rc && elen) {
        char *ne = o_realloc(g->echo_text, g->echo_len + elen + 1);
        if (!ne) rc = OAI_OOM(e);
        else {
            g->echo_text = ne;
            memcpy(g->echo_text + g->echo_len, echo, elen);
            g->echo_len += elen;
            g->echo_text[g->echo_len] = 0;
        }
    }
    free(ids);
    free(echo);
    if (rc) return rc;
    g->n_prompts++;
    g->prompt_off[g->n_prompts] = g->n_ids;
    g->echo_off[g->n_prompts] = g->echo_len;
    return 0;
}

/* "prompt": a string, token ids, or a batch of either (OpenAI's list of prompts): each prompt
 * gets n choices, indexed prompt * n + choice, as separate requests would */
static int completion_prompt(const m3_oai_ctx *c, json_t *b, m3_oai_params *g, m3_oai_error *e) {
    json_t *p = json_object_get(b, "prompt");
    g->n_prompts = 0;
    if (!json_is_array(p) || !json_array_size(p) || json_is_integer(json_array_get(p, 0))) {
        if (!json_is_string(p) && !json_is_array(p))
            return OAI_BAD(e, "prompt", "'prompt' must be a string, an array of token ids, or an array of those");
        return add_prompt(c, p, "prompt", g, e);
    }
    size_t np = json_array_size(p);
    if (np > M3_OAI_MAX_PROMPTS)
        return OAI_BAD(e, "prompt", "'prompt' holds %zu prompts; the limit is %d a request", np, M3_OAI_MAX_PROMPTS);
    for (size_t i = 0; i < np; i++) {
        char param[32];
        snprintf(param, sizeof param, "prompt[%zu]", i);
        json_t *x = json_array_get(p, i);
        if (!json_is_string(x) && !json_is_array(x))
            return OAI_BAD(e, param, "a batch of prompts holds strings or arrays of token ids");
        int rc = add_prompt(c, x, param, g, e);
        if (rc) return rc;
    }
    return 0;
}

static int parse_stop(const m3_oai_ctx *c, json_t *b, m3_oai_params *g, m3_oai_error *e) {
    json_t *st = json_object_get(b, "stop");
    if (json_is_string(st)) {
        if (json_string_length(st)) g->stop_strs[g->n_stop_strs++] = json_string_value(st);
    } else if (json_is_array(st)) {
        if (json_array_size(st) > M3_OAI_MAX_STOP)
            return OAI_BAD(e, "stop", "'stop' has %zu strings; the limit is %d", json_array_size(st), M3_OAI_MAX_STOP);
        for (size_t i = 0; i < json_array_size(st); i++) {
            json_t *x = json_array_get(st, i);
            if (!json_is_string(x)) return OAI_BAD(e, "stop", "'stop' must be a string or an array of strings");
            if (json_string_length(x)) g->stop_strs[g->n_stop_strs++] = json_string_value(x);
        }
    } else if (st && !json_is_null(st)) return OAI_BAD(e, "stop", "'stop' must be a string or an array of strings");
    size_t stop_bytes = 0; /* each choice keeps a matcher of 5 bytes per stop byte */
    for (int i = 0; i < g->n_stop_strs; i++) stop_bytes += strlen(g->stop_strs[i]);
    if (stop_bytes > M3_OAI_MAX_STOP_BYTES)
        return OAI_BAD(e, "stop", "the stop strings have %zu bytes in all; the limit is %d", stop_bytes, M3_OAI_MAX_STOP_BYTES);
    json_t *sti = json_object_get(b, "stop_token_ids");
    size_t k = 0;
    if (sti && !json_is_null(sti)) {
        if (!json_is_array(sti)) return OAI_BAD(e, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
        if (json_array_size(sti) > M3_OAI_MAX_STOP_IDS)
            return OAI_BAD(e, "stop_token_ids", "'stop_token_ids' has %zu ids; the limit is %d", json_array_size(sti),
                           M3_OAI_MAX_STOP_IDS);
        int rc = m3_oai_ids(sti, c->vocab, "stop_token_ids", &g->stop_ids, &k, e);
        if (rc) return rc;
    }
    /* the tokenizer's EOS (the end of an assistant turn) stops too unless ignore_eos; the
     * config's EOS is the engine's own stop id */
    int32_t eos = m3_tok_eos_id(c->tok);
    int32_t *ns = o_realloc(g->stop_ids, (k + 1) * sizeof *ns);
    if (!ns) return OAI_OOM(e);
    g->stop_ids = ns;
    if (!g->ignore_eos && eos >= 0 && eos < c->vocab) g->stop_ids[k++] = eos;
    g->n_stop_ids = k;
    return 0;
}

static int parse_logit_bias(const m3_oai_ctx *c, json_t *b, m3_oai_params *g, m3_oai_error *e) {
    json_t *lb = json_object_get(b, "logit_bias");
    if (!lb || json_is_null(lb)) return 0;
    if (!json_is_object(lb))
        return OAI_BAD(e, "logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    size_t n = json_object_size(lb);
    if (n > M3_OAI_MAX_LOGIT_BIAS)
        return OAI_BAD(e, "logit_bias", "'logit_bias' has %zu entries; the limit is %d", n, M3_OAI_MAX_LOGIT_BIAS);
    g->bias = o_malloc((n ? n : 1) * sizeof *g->bias);
    if (!g->bias) return OAI_OOM(e);
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        char *end, q[64];
        errno = 0;
        long id = strtol(k, &end, 10);
        if (!isdigit((unsigned char)*k) || *end || errno || id < 0 || id >= c->vocab)
            return OAI_BAD(e, "logit_bias", "'logit_bias' key '%s' is not a token id in [0, %d)", clip(k, q, sizeof q),
                           c->vocab);
        if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100))
            return OAI_BAD(e, "logit_bias", "'logit_bias' value for token %ld must be a number in [-100, 100]", id);
        g->bias[g->n_bias++] = (m3_logit_bias){(int32_t)id, (float)json_number_value(v)};
    }
    return 0;
}

/* vLLM's truncate_prompt_tokens: k keeps each prompt's last k tokens; -1 the model's length */
static int parse_truncate(const m3_oai_ctx *c, json_t *b, m3_oai_params *g, m3_oai_error *e) {
    json_t *v = json_object_get(b, "truncate_prompt_tokens");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) == 0)
        return OAI_BAD(e, "truncate_prompt_tokens", "'truncate_prompt_tokens' must be a positive integer, or -1 (the model's length)");
    long long k = json_integer_value(v);
    if (k > c->max_model_len)
        return OAI_BAD(e, "truncate_prompt_tokens",
                       "truncate_prompt_tokens value (%lld) is greater than max_model_len (%lld). Please, select a smaller "
                       "truncation size.", k, (long long)c->max_model_len);
    g->truncate = k < 0 ? c->max_model_len : k;
    return 0;
}

/* appends one token sequence to g's bad words; 0 or the error status */
static int add_bad_seq(m3_oai_params *g, const int32_t *ids, size_t n, m3_oai_error *e) {
    const size_t have = g->n_bad ? (size_t)g->bad_off[g->n_bad] : 0;
    int32_t *ni = o_realloc(g->bad_ids, sizeof *ni * (have + n)), *no;
    if (!ni) return OAI_OOM(e);
    g->bad_ids = ni;
    if (!(no = o_realloc(g->bad_off, sizeof *no * (size_t)(g->n_bad + 2)))) return OAI_OOM(e);
    g->bad_off = no;
    memcpy(g->bad_ids + have, ids, sizeof *ids * n);
    g->bad_off[0] = 0;
    g->bad_off[g->n_bad + 1] = (int32_t)(have + n);
    g->n_bad++;
    return 0;
}

/* vLLM's bad_words: each string, its leading whitespace stripped, tokenized alone and after a
 * space (the second kept when it starts with another token and has as many: the word inside a
 * text); the sampler bans a sequence's last token right after its others */
static int parse_bad_words(const m3_oai_ctx *c, json_t *b, m3_oai_params *g, m3_oai_error *e) {
    json_t *v = json_object_get(b, "bad_words");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return OAI_BAD(e, "bad_words", "'bad_words' must be an array of strings");
    if (json_array_size(v) > M3_OAI_MAX_BAD_WORDS)
        return OAI_BAD(e, "bad_words", "'bad_words' has %zu strings; the limit is %d", json_array_size(v), M3_OAI_MAX_BAD_WORDS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *w = json_array_get(v, i);
        if (!json_is_string(w)) return OAI_BAD(e, "bad_words", "bad_words[%zu] is not a string", i);
        const char *t = json_string_value(w);
        const size_t lead = m3_utf8_space_run(t, json_string_length(w), 0), tl = json_string_length(w) - lead;
        if (!tl) return OAI_BAD(e, "bad_words", "bad_words[%zu] is empty (or only whitespace)", i);
        char *sp = o_malloc(tl + 2);
        if (!sp) return OAI_OOM(e);
        sp[0] = ' ';
        memcpy(sp + 1, t + lead, tl);
        sp[tl + 1] = 0;
        int32_t *a = NULL, *s2 = NULL;
        size_t na = 0, n2 = 0;
        m3_err err;
        int rc = 0;
        if (m3_tok_encode(c->tok, sp + 1, tl, 1, &a, &na, &err) || m3_tok_encode(c->tok, sp, tl + 1, 1, &s2, &n2, &err))
            rc = OAI_TOK(e, err, "bad_words", "bad_words[%zu]: cannot tokenize it: %s", i, err.msg);
        else if (!na || na > M3_OAI_MAX_BAD_WORD_TOKENS) /* (the form after a space counts only with as many) */
            rc = OAI_BAD(e, "bad_words", "bad_words[%zu] is %zu tokens; 1 to %d are taken", i, na, M3_OAI_MAX_BAD_WORD_TOKENS);
        for (size_t k = 0; !rc && k < na + (n2 == na ? n2 : 0); k++) /* tokenizer ids past the model's rows */
            if ((k < na ? a[k] : s2[k - na]) >= c->vocab)
                rc = OAI_BAD(e, "bad_words", "bad_words[%zu] holds token %d, outside the model's vocabulary (%d)", i,
                             (int)(k < na ? a[k] : s2[k - na]), c->vocab);
        if (!rc && !(rc = add_bad_seq(g, a, na, e)) && n2 == na && s2[0] != a[0])
            rc = add_bad_seq(g, s2, n2, e);
        free(sp);
        free(a);
        free(s2);
        if (rc) return rc;
    }
    return 0;
}

/* vLLM's other per-request extras: allowed_token_ids, return_tokens_as_token_ids, cache_salt
 * served; the rest accepted at the value that changes nothing, refused otherwise (never
 * silently ignored) */
static int parse_vllm_extras(const m3_oai_ctx *c, json_t *b, int chat, m3_oai_params *g, m3_oai_error *e) {
    json_t *v;
    int rc;
    if ((v = json_object_get(b, "allowed_token_ids")) && !json_is_null(v)) {
        if (!json_is_array(v)) return OAI_BAD(e, "allowed_token_ids", "'allowed_token_ids' must be an array of token ids");
        if (!json_array_size(v)) return OAI_BAD(e, "allowed_token_ids", "'allowed_token_ids' is empty: no token could come out");
        if ((rc = m3_oai_ids(v, c->vocab, "allowed_token_ids", &g->allowed, &g->n_allowed, e))) return rc;
    }
    g->ids_as_tokens = c->ids_as_tokens;
    if ((rc = get_bool(e, b, "return_tokens_as_token_ids", &g->ids_as_tokens)) || (rc = get_bool(e, b, "return_token_ids", &g->return_ids)))
        return rc;
    if ((v = json_object_get(b, "truncation_side")) && !json_is_null(v)) {
        const char *ts = json_string_value(v);
        if (!ts || (strcmp(ts, "left") && strcmp(ts, "right")))
            return OAI_BAD(e, "truncation_side", "'truncation_side' must be \"left\" or \"right\"");
        g->trunc_right = !strcmp(ts, "right");
    }
    if ((v = json_object_get(b, "request_id")) && !json_is_null(v)) { /* it names the response: printable, short */
        const char *ri = json_string_value(v);
        size_t rl = ri ? json_string_length(v) : 0, i = 0;
        while (i < rl && ri[i] > 0x20 && ri[i] < 0x7f) i++;
        if (!ri || !rl || rl >= sizeof g->request_id || i < rl)
            return OAI_BAD(e, "request_id", "'request_id' must be 1 to %zu printable ASCII characters without spaces",
                           sizeof g->request_id - 1);
        memcpy(g->request_id, ri, rl + 1);
    }
    if ((v = json_object_get(b, "cache_salt")) && !json_is_null(v)) {
        if (!json_is_string(v) || !json_string_length(v))
            return OAI_BAD(e, "cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.");
        g->cache_salt = json_string_value(v);
        g->cache_salt_len = json_string_length(v);
    }
    int t = 1;
    if ((rc = get_bool(e, b, "skip_special_tokens", &t))) return rc;
    g->keep_special = !t;
    /* accepted: the decoder joins special tokens without spaces whatever it says (as vLLM's fast
     * detokenizer does), and prompts are encoded without added BOS / EOS */
    if ((rc = get_bool(e, b, "spaces_between_special_tokens", &t)) || (rc = get_bool(e, b, "add_special_tokens", &t))) return rc;
    t = 0;
    if ((rc = get_bool(e, b, "use_beam_search", &t))) return rc;
    if (t) return OAI_BAD(e, "use_beam_search", "'use_beam_search' is not supported");
    if ((v = json_object_get(b, "priority")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN || json_integer_value(v) > INT32_MAX)
            return OAI_BAD(e, "priority", "'priority' must be a 32-bit integer");
        if (json_integer_value(v) && !c->priority_policy)
            return OAI_BAD(e, "priority", "Got priority %lld but Priority scheduling is not enabled.", (long long)json_integer_value(v));
        g->priority = (int)json_integer_value(v);
    }
    if ((rc = parse_bad_words(c, b, g, e))) return rc;
    /* thinking_token_budget (vLLM's): at most this many tokens inside the reasoning, then its
     * closing tag (the sampler's think budget; the tags must be single tokens) */
    g->think_budget = -2; /* absent; -1: no budget (a chat request's way out of --reasoning-budget) */
    if ((rc = get_int(e, b, "thinking_token_budget", -1, INT32_MAX, &g->think_budget))) return rc;
    if (g->think_budget == -2) g->think_budget = chat && c->has_think_budget ? c->think_budget : -1; /* --reasoning-budget: chat's */
    if (g->think_budget >= 0) {
        g->think_on = 1;
        g->think_open = m3_tok_token_to_id(c->tok, "<mm:think>");
        g->think_close = m3_tok_token_to_id(c->tok, "</mm:think>");
        if (g->think_open < 0 || g->think_open >= c->vocab || g->think_close < 0 || g->think_close >= c->vocab)
            return OAI_BAD(e, "thinking_token_budget",
                           "'thinking_token_budget' needs the reasoning tags <mm:think> and </mm:think> as single tokens, "
                           "which this tokenizer lacks");
    }
    static const char *const refused[] = {"logits_processors", "documents", "chat_template", "mm_processor_kwargs",
                                          "kv_transfer_params", "vllm_xargs"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if ((!chat || strcmp(refused[i], "chat_template")) && /* chat: m3_oai_chat_prompt's */
            (v = json_object_get(b, refused[i])) && !json_is_null(v) &&
            !((json_is_array(v) && !json_array_size(v)) || (json_is_object(v) && !json_object_size(v))))
            return OAI_BAD(e, refused[i], "'%s' is not supported%s", refused[i],
                           !strcmp(refused[i], "chat_template") ? " (a completion's prompt is not rendered by a template)" : "");
    return 0;
}

/* Fields we do not implement answer 400 rather than being silently ignored. */
static int unsupported(json_t *b, int chat, long long n, m3_oai_error *e) {
    json_t *v;
    if ((v = json_object_get(b, "best_of")) && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == n))
        return OAI_BAD(e, "best_of", "'best_of' other than n is not supported");
    if ((v = json_object_get(b, "suffix")) && !json_is_null(v) && !(json_is_string(v) && !json_string_length(v)))
        return OAI_BAD(e, "suffix", "'suffix' is not supported");
    /* vLLM's constrained-decoding extras not served (guided_json / _regex / _choice are): one
     * refusal policy, never silently unconstrained text */
    static const char *const guided[] = {"guided_whitespace_pattern"};
    for (size_t i = 0; i < sizeof guided / sizeof *guided; i++)
        if ((v = json_object_get(b, guided[i])) && !json_is_null(v))
            return OAI_BAD(e, guided[i],
                           "'%s' is not supported (served: response_format, guided_json, guided_regex, guided_choice, guided_grammar)",
                           guided[i]);
    /* the backend vLLM should use: m3 has its own, which serves the same outputs */
    if ((v = json_object_get(b, "guided_decoding_backend")) && !json_is_null(v) && !json_is_string(v))
        return OAI_BAD(e, "guided_decoding_backend", "'guided_decoding_backend' must be a string");
    return 0;
}

/* a JSON Schema given as an object, a boolean, or (guided_json) a string holding one */
static int take_schema(m3_oai_params *g, json_t *sc, int string_ok, const char *param, m3_oai_error *e) {
    json_t *own = NULL;
    if (string_ok && json_is_string(sc)) {
        json_error_t je;
        m3_fault_suspend(1);
        own = json_loadb(json_string_value(sc), json_string_length(sc), JSON_DECODE_ANY, &je);
        m3_fault_suspend(0);
        if (!own) return OAI_BAD(e, param, "'%s' is not a JSON schema: invalid JSON: %s", param, je.text);
        sc = own;
    }
    if (!json_is_object(sc) && !json_is_boolean(sc)) {
        json_decref(own);
        return OAI_BAD(e, param, "'%s' must be a JSON schema (an object)", param);
    }
    g->constraint_text = json_dumps(sc, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(own);
    if (!g->constraint_text) return OAI_OOM(e);
    g->constraint = M3_OAI_C_JSON_SCHEMA;
    g->constraint_param = param;
    return 0;
}

/* guided_regex: an ECMAScript pattern the whole output matches (src/grammar/regex.c) */
static int take_regex(m3_oai_params *g, json_t *v, const char *param, m3_oai_error *e) {
    if (!json_is_string(v)) return OAI_BAD(e, param, "'%s' must be a string (a regular expression)", param);
    if (strlen(json_string_value(v)) != json_string_length(v)) return OAI_BAD(e, param, "'%s' holds a NUL character", param);
    if (!(g->constraint_text = strdup(json_string_value(v)))) return OAI_OOM(e);
    g->constraint = M3_OAI_C_REGEX;
    g->constraint_param = param;
    return 0;
}

/* guided_grammar (llama.cpp: grammar): a GBNF grammar of the whole output (src/grammar/ebnf.c) */
static int take_grammar(m3_oai_params *g, json_t *v, const char *param, m3_oai_error *e) {
    if (!json_is_string(v)) return OAI_BAD(e, param, "'%s' must be a string (a GBNF grammar)", param);
    if (strlen(json_string_value(v)) != json_string_length(v)) return OAI_BAD(e, param, "'%s' holds a NUL character", param);
    if (!(g->constraint_text = strdup(json_string_value(v)))) return OAI_OOM(e);
    g->constraint = M3_OAI_C_GRAMMAR;
    g->constraint_param = param;
    return 0;
}

/* guided_choice: the output is exactly one of the strings */
static int take_choice(m3_oai_params *g, json_t *v, const char *param, m3_oai_error *e) {
    size_t i;
    json_t *x;
    if (!json_is_array(v) || !json_array_size(v)) return OAI_BAD(e, param, "'%s' must be a non-empty array of strings", param);
    if (json_array_size(v) > 4096) return OAI_BAD(e, param, "'%s' has %zu choices (at most 4096)", param, json_array_size(v));
    json_array_foreach(v, i, x) {
        if (!json_is_string(x)) return OAI_BAD(e, param, "'%s[%zu]' must be a string", param, i);
    }
    if (!(g->constraint_text = json_dumps(v, JSON_COMPACT))) return OAI_OOM(e);
    g->constraint = M3_OAI_C_CHOICE;
    g->constraint_param = param;
    return 0;
}

/* response_format, vLLM's guided_json / _regex / _choice / structured_outputs, tool_choice, parallel_tool_calls */
static int parse_structured(const m3_oai_ctx *c, json_t *b, int chat, m3_oai_params *g, m3_oai_error *e) {
    json_t *v;
    int rc;
    g->parallel_tool_calls = 1;
    g->g_start = g->g_open = -1;
    if ((v = json_object_get(b, "response_format")) && !json_is_null(v)) {
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!json_is_object(v) || !t)
            return OAI_BAD(e, "response_format", "'response_format' must be an object with a 'type'");
        if (!strcmp(t, "json_object")) {
            g->constraint = M3_OAI_C_JSON_OBJECT;
            g->constraint_param = "response_format";
        } else if (!strcmp(t, "json_schema")) {
            json_t *js = json_object_get(v, "json_schema");
            if (!json_is_object(js))
                return OAI_BAD(e, "response_format", "'response_format.json_schema' must be an object {name, schema, strict}");
            json_t *sc = json_object_get(js, "schema");
            if (!sc) return OAI_BAD(e, "response_format", "'response_format.json_schema.schema' is missing");
            if ((rc = take_schema(g, sc, 0, "response_format", e))) return rc;
        } else if (strcmp(t, "text"))
            return OAI_BAD(e, "response_format", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
    /* "grammar": llama.cpp's server spelling of guided_grammar */
    static const char *const guided[] = {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "grammar"};
    for (int i = 0; i < 5; i++) {
        if (!(v = json_object_get(b, guided[i])) || json_is_null(v)) continue;
        if (g->constraint) return OAI_BAD(e, guided[i], "'%s' beside '%s': give one of them", guided[i], g->constraint_param);
        rc = i == 0 ? take_schema(g, v, 1, guided[i], e) : i == 1 ? take_regex(g, v, guided[i], e)
             : i == 2 ? take_choice(g, v, guided[i], e) : take_grammar(g, v, guided[i], e);
        if (rc) return rc;
    }
    if ((v = json_object_get(b, "structured_outputs")) && !json_is_null(v)) {
        if (!json_is_object(v)) return OAI_BAD(e, "structured_outputs", "'structured_outputs' must be an object");
        const char *k, *which = NULL;
        json_t *x;
        int n = 0;
        json_object_foreach(v, k, x) {
            if (json_is_null(x) || json_is_false(x)) continue;
            char q[64];
            if (!strcmp(k, "json") || (!strcmp(k, "json_object") && json_is_true(x)) || !strcmp(k, "regex") || !strcmp(k, "choice") ||
                !strcmp(k, "grammar")) {
                n++;
                which = k;
            } else
                return OAI_BAD(e, "structured_outputs",
                               "'structured_outputs.%s' is not supported (served: 'json', 'json_object', 'regex', 'choice', 'grammar')",
                               clip(k, q, sizeof q));
        }
        if (n != 1)
            return OAI_BAD(e, "structured_outputs", "'structured_outputs' needs exactly one of 'json', 'json_object', 'regex', 'choice', 'grammar'");
        if (g->constraint)
            return OAI_BAD(e, "structured_outputs", "'structured_outputs' beside '%s': give one of them", g->constraint_param);
        x = json_object_get(v, which);
        if (!strcmp(which, "json")) rc = take_schema(g, x, 1, "structured_outputs", e);
        else if (!strcmp(which, "regex")) rc = take_regex(g, x, "structured_outputs", e);
        else if (!strcmp(which, "choice")) rc = take_choice(g, x, "structured_outputs", e);
        else if (!strcmp(which, "grammar")) rc = take_grammar(g, x, "structured_outputs", e);
        else {
            g->constraint = M3_OAI_C_JSON_OBJECT;
            g->constraint_param = "structured_outputs";
            rc = 0;
        }
        if (rc) return rc;
    }
    if (!chat) return 0;
    if ((rc = get_bool(e, b, "parallel_tool_calls", &g->parallel_tool_calls))) return rc;
    json_t *tc = json_object_get(b, "tool_choice");
    if (tc && !json_is_null(tc)) {
        const char *ts = json_string_value(tc);
        if (ts && (!strcmp(ts, "auto") || !strcmp(ts, "none"))) {
        } else if (ts && !strcmp(ts, "required")) {
            g->constraint_param = g->constraint ? g->constraint_param : "tool_choice";
            if (g->constraint) goto both;
            g->constraint = M3_OAI_C_TOOLS;
        } else if (json_is_object(tc) && json_is_string(json_object_get(json_object_get(tc, "function"), "name"))) {
            const char *ty = json_string_value(json_object_get(tc, "type"));
            if (ty && strcmp(ty, "function"))
                return OAI_BAD(e, "tool_choice", "'tool_choice.type' must be \"function\"");
            if (g->constraint) goto both;
            g->constraint = M3_OAI_C_TOOLS;
            g->constraint_param = "tool_choice";
            g->tool_name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        } else
            return OAI_BAD(e, "tool_choice",
                           "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (g->constraint == M3_OAI_C_TOOLS) {
            json_t *tools = json_object_get(b, "tools");
            if (!json_is_array(tools) || !json_array_size(tools))
                return OAI_BAD(e, "tool_choice", "'tool_choice' forcing a tool call needs 'tools'");
            if (!c->tool_parser)
                return OAI_BAD(e, "tool_choice", "forced tool calls need a chat template that writes MiniMax tool calls");
            g->constraint_param = "tool_choice";
        }
    }
    /* strict tools (function.strict: true, every one of them; the OpenAI Agents SDK marks all) under
     * tool_choice auto: the calls the model makes are valid calls, as OpenAI guarantees. With some
     * tools not strict the calls stay free (the grammar would bind those too). Another constraint
     * (a JSON answer) takes precedence. */
    json_t *tools = json_object_get(b, "tools"), *tc2 = json_object_get(b, "tool_choice");
    size_t i;
    json_t *t;
    int strict = json_array_size(tools) > 0;
    json_array_foreach(tools, i, t) {
        json_t *st = json_object_get(json_object_get(t, "function"), "strict");
        if (st && !json_is_null(st) && !json_is_boolean(st))
            return OAI_BAD(e, "tools", "'tools[%zu].function.strict' must be a boolean", i);
        strict &= json_is_true(st);
    }
    if (strict && !g->constraint && (!tc2 || json_is_null(tc2) || (json_is_string(tc2) && !strcmp(json_string_value(tc2), "auto"))) &&
        c->tool_parser) {
        g->constraint = M3_OAI_C_TOOLS_AUTO;
        g->constraint_param = "tools";
    }
    return 0;
both:
    return OAI_BAD(e, "tool_choice", "a forced tool call ('tool_choice') cannot be combined with '%s'", g->constraint_param);
}

/* vLLM's echo for chat: every choice's content begins with the last message's content when that
 * message has the role of the answer (the assistant's with add_generation_prompt, else the last
 * message's own: a continued final message, then its whole text); a list's text parts joined by
 * newlines. Into echo_text / echo_off as a completion's echo of one prompt. */
static int chat_echo(json_t *b, m3_oai_params *g, m3_oai_error *e) {
    json_t *msgs = json_object_get(b, "messages"), *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    g->echo_off[0] = g->echo_off[1] = 0;
    if (!role || strcmp(role, g->role)) return 0;
    json_t *ct = json_object_get(last, "content");
    size_t n = json_is_string(ct) ? json_string_length(ct) : 0;
    int parts = 0;
    for (size_t i = 0; json_is_array(ct) && i < json_array_size(ct); i++) {
        json_t *x = json_object_get(json_array_get(ct, i), "text");
        if (json_is_string(x)) n += (parts++ ? 1 : 0) + json_string_length(x);
    }
    char *t = o_malloc(n + 1);
    if (!t) return OAI_OOM(e);
    size_t k = 0;
    if (json_is_string(ct)) memcpy(t, json_string_value(ct), k = n);
    for (size_t i = 0, j = 0; json_is_array(ct) && i < json_array_size(ct); i++) {
        json_t *x = json_object_get(json_array_get(ct, i), "text");
        if (!json_is_string(x)) continue;
        if (j++) t[k++] = '\n';
        memcpy(t + k, json_string_value(x), json_string_length(x));
        k += json_string_length(x);
    }
    t[k] = 0;
    g->echo_text = t;
    g->echo_len = k;
    g->echo_off[1] = k;
    return 0;
}

int m3_oai_parse_generate(const m3_oai_ctx *c, json_t *b, int chat, m3_oai_params *g, m3_oai_error *e) {
    memset(g, 0, sizeof *g);
    g->prompt_logprobs = -1;
    int rc;
    if (!json_is_object(b)) return OAI_BAD(e, NULL, "the request body must be a JSON object");
    json_t *model = json_object_get(b, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return OAI_BAD(e, "model", "'model' must be a string");
        char q[64];
        int known = !c->model_name || !strcmp(json_string_value(model), c->model_name);
        for (const char *const *n = c->model_names; !known && n && *n; n++) known = !strcmp(json_string_value(model), *n);
        if (!known)
            return m3_oai_errorf(e, 404, "not_found_error", "model", "the model '%s' does not exist",
                                 clip(json_string_value(model), q, sizeof q));
    }
    const m3_oai_defaults *dd = c->defaults;
    g->temperature = dd && dd->has_temperature ? dd->temperature : 1.0;
    g->top_p = dd && dd->has_top_p ? dd->top_p : 1.0;
    if (dd && dd->has_min_p) g->min_p = dd->min_p;
    if (dd && dd->has_repetition_penalty) g->rp = dd->repetition_penalty;
    if (dd && dd->has_top_k) g->top_k = dd->top_k;
    g->max_tokens = -1;
    g->n = 1;
    if ((rc = get_int(e, b, "n", 1, M3_OAI_MAX_N, &g->n)) || (rc = unsupported(b, chat, g->n, e)) ||
        (rc = get_bool(e, b, "stream", &g->stream)) || (rc = get_bool(e, b, "ignore_eos", &g->ignore_eos)) ||
        (rc = get_bool(e, b, "include_stop_str_in_output", &g->include_stop)) ||
        (rc = get_bool(e, b, "echo", &g->echo)) ||
        (rc = get_num(e, b, "temperature", 0, 2, &g->temperature)) || (rc = get_num(e, b, "top_p", 0, 1, &g->top_p)) ||
        (rc = get_num(e, b, "min_p", 0, 1, &g->min_p)) || (rc = get_num(e, b, "presence_penalty", -2, 2, &g->pp)) ||
        (rc = get_num(e, b, "frequency_penalty", -2, 2, &g->fp)) ||
        (rc = get_num(e, b, "repetition_penalty", 0, 100, &g->rp)) ||
        (rc = get_int(e, b, "top_k", -1, 1 << 30, &g->top_k)) ||
        (rc = get_int(e, b, "max_tokens", 0, 1 << 30, &g->max_tokens)) ||
        (rc = get_int(e, b, "max_completion_tokens", 0, 1 << 30, &g->max_tokens)) ||
        (rc = get_int(e, b, "min_tokens", 0, 1 << 30, &g->min_tokens)))
        return rc;
    json_t *seed = json_object_get(b, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return OAI_BAD(e, "seed", "'seed' must be an integer");
        g->seed = json_integer_value(seed);
        g->has_seed = 1;
    }
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return OAI_BAD(e, "stream_options", "'stream_options' must be an object");
        if ((rc = get_bool(e, so, "include_usage", &g->include_usage)) ||
            (rc = get_bool(e, so, "continuous_usage_stats", &g->continuous_usage)))
            return rc;
    }
    g->include_usage |= c->force_usage; /* (vLLM's --enable-force-include-usage: as if asked) */
    g->continuous_usage &= g->include_usage; /* as vLLM: only with include_usage */
    /* logprobs: completions take an integer (alternatives per token), chat a boolean plus
     * top_logprobs */
    if (chat) {
        if ((rc = get_bool(e, b, "logprobs", &g->logprobs)) ||
            (rc = get_int(e, b, "top_logprobs", 0, M3_SAMPLE_MAX_TOP_LOGPROBS, &g->top_logprobs)))
            return rc;
        if (g->top_logprobs && !g->logprobs) return OAI_BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else {
        long long lp = -1;
        if ((rc = get_int(e, b, "logprobs", 0, M3_SAMPLE_MAX_TOP_LOGPROBS, &lp))) return rc;
        g->logprobs = lp >= 0;
        g->top_logprobs = lp > 0 ? lp : 0;
        if (g->echo && g->logprobs) g->prompt_logprobs = (int)g->top_logprobs; /* the prompt's entries lead the logprobs */
    }
    /* vLLM's prompt_logprobs: the logprob of every prompt token, with this many alternatives */
    json_t *plp = json_object_get(b, "prompt_logprobs");
    if (plp && !json_is_null(plp)) {
        if (!json_is_integer(plp)) return OAI_BAD(e, "prompt_logprobs", "'prompt_logprobs' must be an integer");
        long long v = json_integer_value(plp);
        if (v < -1)
            return OAI_BAD(e, "prompt_logprobs", "'prompt_logprobs' must be a non-negative integer, or -1 (every token)");
        if (v == -1 || v > M3_SAMPLE_MAX_TOP_LOGPROBS)
            return OAI_BAD(e, "prompt_logprobs", "Requested prompt logprobs of %lld, which is greater than max allowed: %d",
                           v == -1 ? (long long)c->vocab : v, M3_SAMPLE_MAX_TOP_LOGPROBS);
        if (g->stream) return OAI_BAD(e, "prompt_logprobs", "'prompt_logprobs' is not available when 'stream' is true");
        g->prompt_logprobs = (int)v;
    }
    if (g->max_tokens == 0 && !(g->echo && !chat))
        return OAI_BAD(e, "max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo': the prompt alone), got 0");
    if ((rc = parse_vllm_extras(c, b, chat, g, e)) || (rc = parse_truncate(c, b, g, e))) return rc;
    int cont = -1; /* continue_final_message: inside the reasoning or not */
    if (chat) {
        int agp;
        if ((rc = m3_oai_chat_prompt(c, b, &g->ids, &g->n_ids, &g->media, &cont, &agp, e))) return rc;
        if (g->truncate > 0 && g->n_ids > (size_t)g->truncate) {
            if (g->trunc_right) cont = -1; /* the prompt no longer ends where the final message did */
            if (g->media.px.n_images)
                return OAI_BAD(e, "truncate_prompt_tokens", "truncate_prompt_tokens %lld would cut a prompt with images (%zu tokens)",
                               g->truncate, g->n_ids);
            if (!g->trunc_right) memmove(g->ids, g->ids + (g->n_ids - (size_t)g->truncate), sizeof *g->ids * (size_t)g->truncate);
            g->n_ids = (size_t)g->truncate;
        }
        g->n_prompts = 1;
        g->prompt_off[1] = g->n_ids;
        { /* the answer's role (vLLM's): the assistant's after a generation prompt, else the last message's */
            json_t *msgs = json_object_get(b, "messages");
            const char *lr = json_string_value(json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "role"));
            snprintf(g->role, sizeof g->role, "%s", !agp && lr && strlen(lr) < sizeof g->role ? lr : "assistant");
        }
        if (g->echo && (rc = chat_echo(b, g, e))) return rc;
        if (g->think_on) { /* the reasoning budget reads the final turn's tags: one quoted earlier opens nothing */
            const int32_t turn = m3_tok_token_to_id(c->tok, "]~b]");
            for (size_t i = g->n_ids; turn >= 0 && i-- > 0;)
                if (g->ids[i] == turn) { g->think_from = (int)i; break; }
        }
    } else if ((rc = completion_prompt(c, b, g, e))) return rc;
    if (g->n * g->n_prompts > M3_OAI_MAX_CHOICES)
        return OAI_BAD(e, "n", "%d prompts x n = %lld choices; the limit is %d a request", g->n_prompts, g->n * g->n_prompts,
                       M3_OAI_MAX_CHOICES);
    const char *pp = chat ? "messages" : "prompt";
    if (!g->n_ids) return OAI_BAD(e, pp, "the prompt is empty");
    for (size_t i = 0; i < g->n_ids; i++)
        if (g->ids[i] < 0 || g->ids[i] >= c->vocab)
            return OAI_BAD(e, pp, "prompt token %d is outside the model's vocabulary (%d)", g->ids[i], c->vocab);
    long long mml = c->max_model_len, np = 0; /* the longest prompt of a batch */
    for (int p = 0; p < g->n_prompts; p++) {
        long long len = (long long)(g->prompt_off[p + 1] - g->prompt_off[p]);
        if (len > mml || (len == mml && g->max_tokens != 0)) {
            /* worded as OpenAI and vLLM word it: clients (LiteLLM, agent frameworks) recognise an
             * overflow by "maximum context length" */
            if (g->n_prompts > 1)
                OAI_BAD(e, pp, "This model's maximum context length is %lld tokens. However, prompt %d has %lld tokens "
                        "(prompt + completion must fit).", mml, p, len);
            else OAI_BAD(e, pp, "This model's maximum context length is %lld tokens. However, the prompt has %lld tokens "
                         "(prompt + completion must fit).", mml, len);
            e->code = "context_length_exceeded"; /* OpenAI's code for it */
            return e->status;
        }
        if (len > np) np = len;
    }
    if (g->max_tokens > mml - np) {
        OAI_BAD(e, "max_tokens",
                "This model's maximum context length is %lld tokens. However, the request asks for %lld (%lld in the "
                "prompt, %lld to generate): reduce the prompt or max_tokens.",
                mml, np + g->max_tokens, np, g->max_tokens);
        e->code = "context_length_exceeded";
        return e->status;
    }
    if (g->max_tokens < 0) { /* the server's default (generation_config's max_new_tokens), else OpenAI's */
        const long long dm = c->defaults && c->defaults->has_max_new_tokens ? c->defaults->max_new_tokens : chat ? mml - np : 16;
        g->max_tokens = dm < mml - np ? dm : mml - np;
    }
    if (g->min_tokens > g->max_tokens)
        return OAI_BAD(e, "min_tokens", "'min_tokens' (%lld) is larger than max_tokens (%lld)", g->min_tokens,
                       g->max_tokens);
    if ((rc = parse_stop(c, b, g, e)) || (rc = parse_logit_bias(c, b, g, e)) || (rc = parse_structured(c, b, chat, g, e)))
        return rc;
    if (g->n_allowed) { /* an allowed id must be samplable: a token (ids past the tokenizer's, or that no token
                          * spells, never are) and, before min_tokens, not one that ends the request */
        int tok_any = 0, go_any = 0;
        for (size_t i = 0; i < g->n_allowed; i++) {
            const int32_t id = g->allowed[i];
            if (!(id < m3_tok_n_vocab(c->tok) && m3_tok_id_to_token(c->tok, id))) continue;
            tok_any = 1;
            int ends = !g->ignore_eos && id == c->eos_id;
            for (size_t k = 0; k < g->n_stop_ids && !ends; k++) ends = g->stop_ids[k] == id;
            go_any |= !ends || g->min_tokens == 0;
        }
        if (!tok_any)
            return OAI_BAD(e, "allowed_token_ids", "no id of 'allowed_token_ids' is a token of the tokenizer: nothing could be sampled");
        if (!go_any)
            return OAI_BAD(e, "allowed_token_ids", "every token of 'allowed_token_ids' ends the request (a stop id or EOS), and "
                           "'min_tokens' is %lld: nothing could be generated", g->min_tokens);
    }
    if (chat) {
        g->oo = (m3_out_opts){c->reasoning_parser, M3_THINK_ENABLED, c->tool_parser, NULL};
        json_t *kw = chat_kwargs(e, b);
        if (!kw) return e->status;
        const char *tm = json_string_value(json_object_get(kw, "thinking_mode"));
        if (tm && !strcmp(tm, "disabled")) g->oo.thinking = M3_THINK_DISABLED;
        else if (tm && !strcmp(tm, "adaptive")) g->oo.thinking = M3_THINK_ADAPTIVE;
        json_decref(kw);
        /* continue_final_message: the output goes on where the prompt ends, in the reasoning or in the content */
        if (cont >= 0) g->oo.thinking = cont ? M3_THINK_ENABLED : M3_THINK_DISABLED;
        json_t *tc = json_object_get(b, "tool_choice");
        if (json_is_string(tc) && !strcmp(json_string_value(tc), "none")) g->oo.tools = 0;
        /* a constrained answer (JSON, a regex, a choice) is the answer and nothing else: text
         * inside it is never a tool call. Left on, the parser would take
         * ["<opener><invoke name=", 1, ">...</tool_call>"] for a call named `, 1, `. */
        if (g->constraint && g->constraint != M3_OAI_C_TOOLS && g->constraint != M3_OAI_C_TOOLS_AUTO) g->oo.tools = 0;
        g->tools = json_object_get(b, "tools");
        if (!json_is_array(g->tools)) g->tools = NULL;
        /* with the reasoning parser on, the constraint starts once the reasoning ends: after the
         * </mm:think> token (thinking enabled), or at once unless the first token opens it
         * (adaptive); thinking disabled: at once */
        if (g->constraint && g->oo.reasoning && g->oo.thinking != M3_THINK_DISABLED) {
            g->g_start = m3_tok_token_to_id(c->tok, "</mm:think>");
            if (g->oo.thinking == M3_THINK_ADAPTIVE) g->g_open = m3_tok_token_to_id(c->tok, "<mm:think>");
            if (g->g_start < 0 || g->g_start >= c->vocab || (g->oo.thinking == M3_THINK_ADAPTIVE && (g->g_open < 0 || g->g_open >= c->vocab)))
                return OAI_BAD(e, g->constraint_param,
                               "'%s' with thinking on needs the reasoning tags as single tokens, which this tokenizer lacks "
                               "(disable thinking: chat_template_kwargs {\"enable_thinking\": false})",
                               g->constraint_param);
        }
    }
    return 0;
}

/* the sampling fields of j into d; where (NULL: none) names the source in errors; strict: other keys refused */
static int defaults_apply(m3_oai_defaults *d, json_t *j, const char *where, int strict, m3_err *err) {
    static const struct { const char *key; double lo, hi; size_t off, has; int integer; } F[] = {
        {"temperature", 0, 2, offsetof(m3_oai_defaults, temperature), offsetof(m3_oai_defaults, has_temperature), 0},
        {"top_p", 0, 1, offsetof(m3_oai_defaults, top_p), offsetof(m3_oai_defaults, has_top_p), 0},
        {"min_p", 0, 1, offsetof(m3_oai_defaults, min_p), offsetof(m3_oai_defaults, has_min_p), 0},
        {"repetition_penalty", 0, 100, offsetof(m3_oai_defaults, repetition_penalty),
         offsetof(m3_oai_defaults, has_repetition_penalty), 0},
        {"top_k", -1, 1 << 30, offsetof(m3_oai_defaults, top_k), offsetof(m3_oai_defaults, has_top_k), 1},
        {"max_new_tokens", 1, 1 << 30, offsetof(m3_oai_defaults, max_new_tokens), offsetof(m3_oai_defaults, has_max_new_tokens), 1},
    };
    if (strict) {
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            size_t i = 0;
            while (i < sizeof F / sizeof *F && strcmp(F[i].key, k)) i++;
            if (i == sizeof F / sizeof *F)
                return m3_errf(err, "%s%s'%s': m3 takes temperature, top_p, top_k, min_p, repetition_penalty and "
                               "max_new_tokens as the defaults of requests that leave them out", where ? where : "",
                               where ? ": " : "", k);
        }
    }
    for (size_t i = 0; i < sizeof F / sizeof *F; i++) {
        json_t *v = json_object_get(j, F[i].key);
        if (v && json_is_null(v) && strict) *(int *)((char *)d + F[i].has) = 0; /* the override's null: no default */
        if (!v || json_is_null(v)) continue;
        double x = json_number_value(v);
        if (!json_is_number(v) || !(x >= F[i].lo && x <= F[i].hi) || (F[i].integer && !json_is_integer(v)))
            return m3_errf(err, "%s%s'%s' must be %s in [%g, %g]", where ? where : "", where ? ": " : "", F[i].key,
                           F[i].integer ? "an integer" : "a number", F[i].lo, F[i].hi);
        if (F[i].integer) *(long long *)((char *)d + F[i].off) = (long long)json_integer_value(v);
        else *(double *)((char *)d + F[i].off) = x;
        *(int *)((char *)d + F[i].has) = 1;
    }
    return 0;
}

int m3_oai_defaults_load(m3_oai_defaults *d, const char *dir, m3_err *err) {
    memset(d, 0, sizeof *d);
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    json_error_t je;
    json_t *j = json_loadf(f, 0, &je);
    fclose(f);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return m3_errf(err, "%s: not a JSON object (%s)", path, je.text);
    }
    int rc = defaults_apply(d, j, path, 0, err);
    json_decref(j);
    return rc;
}

int m3_oai_defaults_override(m3_oai_defaults *d, const char *text, m3_err *err) {
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return j ? m3_errf(err, "a JSON object of sampling defaults is expected") : m3_errf(err, "not JSON: %s", je.text);
    }
    m3_oai_defaults o = *d; /* all or nothing */
    int rc = defaults_apply(&o, j, NULL, 1, err);
    json_decref(j);
    if (!rc) *d = o;
    return rc;
}
