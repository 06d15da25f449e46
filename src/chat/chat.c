/* m3_chat: template loading (checkpoint dir, tokenizer_config.json, built-in MiniMax-M3)
 * and rendering with the transformers context. See chat.h. */
#include "chat/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct m3_chat {
    m3_jinja *tmpl;       /* default */
    m3_jinja *tool_tmpl;  /* "tool_use" from a named list, or NULL */
    char *source;         /* text of the default template */
    json_t *tokens;       /* {bos_token: ..., eos_token: ...} */
    char origin[512];
};

/* The built-in MiniMax-M3 template (spec section 5). */
static const char minimax_m3_template[] =
    "{#- MiniMax-M3 chat template, built into m3 (spec section 5). A checkpoint's own\n"
    "    chat_template.jinja wins over this one.\n"
    "    chat_template_kwargs: thinking_mode = \"enabled\" (default) | \"disabled\" | \"adaptive\";\n"
    "    enable_thinking = false is read as thinking_mode \"disabled\".\n"
    "    An image content part is written as one bracketed image placeholder; the server\n"
    "    expands it to the image's tokens (spec section 6). -#}\n"
    "{%- set NS = ']<]minimax[>[' -%}\n"
    "{%- if thinking_mode is defined and thinking_mode -%}\n"
    "    {%- set mode = thinking_mode -%}\n"
    "{%- elif enable_thinking is defined and enable_thinking is false -%}\n"
    "    {%- set mode = 'disabled' -%}\n"
    "{%- else -%}\n"
    "    {%- set mode = 'enabled' -%}\n"
    "{%- endif -%}\n"
    "{%- if mode not in ['enabled', 'disabled', 'adaptive'] -%}\n"
    "    {{- raise_exception(\"thinking_mode must be 'enabled', 'disabled' or 'adaptive', got '\" ~ mode ~ \"'\") -}}\n"
    "{%- endif -%}\n"
    "{%- macro text_of(content) -%}\n"
    "    {%- if content is string -%}\n"
    "        {{- content -}}\n"
    "    {%- elif content is iterable and content is not mapping -%}\n"
    "        {%- for part in content -%}\n"
    "            {%- if part is string -%}\n"
    "                {{- part -}}\n"
    "            {%- elif part is mapping and part.type == 'text' -%}\n"
    "                {{- part.text -}}\n"
    "            {%- elif part is mapping and (part.type == 'image' or part.type == 'image_url') -%}\n"
    "                {{- ']<]start of image[>[]<]image[>[]<]end of image[>[' -}}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- elif content is not none and content is defined -%}\n"
    "        {{- content -}}\n"
    "    {%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{%- macro arg_value(v) -%}\n"
    "    {%- if v is string -%}{{- v -}}{%- else -%}{{- v | tojson -}}{%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{{- ']~!b[' -}}\n"
    "{%- set system = none -%}\n"
    "{%- set convo = messages -%}\n"
    "{%- if messages and messages[0].role == 'system' -%}\n"
    "    {%- set system = messages[0] -%}\n"
    "    {%- set convo = messages[1:] -%}\n"
    "{%- endif -%}\n"
    "{%- if system is not none or tools -%}\n"
    "    {{- ']~b]system\\n' -}}\n"
    "    {%- if system is not none -%}\n"
    "        {{- text_of(system.content) -}}\n"
    "    {%- endif -%}\n"
    "    {%- if tools -%}\n"
    "        {%- if system is not none -%}{{- '\\n\\n' -}}{%- endif -%}\n"
    "        {{- '# Tools\\nYou may call one or more tools to assist with the user query.\\nHere are the tools available in JSONSchema format:\\n<tools>\\n' -}}\n"
    "        {%- for tool in tools -%}\n"
    "            {{- (tool.function if tool.function is defined else tool) | tojson -}}\n"
    "            {{- '\\n' -}}\n"
    "        {%- endfor -%}\n"
    "        {{- '</tools>\\n\\nTo call tools, reply in this format:\\n' -}}\n"
    "        {{- NS ~ '<tool_call>\\n' ~ NS ~ '<invoke name=\"TOOL_NAME\">\\n' ~ NS ~ '<ARGUMENT_NAME>value' ~ NS ~ '</ARGUMENT_NAME>\\n' ~ NS ~ '</invoke>\\n' ~ NS ~ '</tool_call>' -}}\n"
    "    {%- endif -%}\n"
    "    {{- '[e~[\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- for message in convo -%}\n"
    "    {%- if message.role == 'system' or message.role == 'developer' or message.role == 'user' -%}\n"
    "        {{- ']~b]' ~ message.role ~ '\\n' ~ text_of(message.content) ~ '[e~[\\n' -}}\n"
    "    {%- elif message.role == 'assistant' -%}\n"
    "        {{- ']~b]ai\\n' -}}\n"
    "        {%- set content = text_of(message.content) -%}\n"
    "        {%- set reasoning = '' -%}\n"
    "        {%- if message.reasoning_content is string -%}\n"
    "            {%- set reasoning = message.reasoning_content -%}\n"
    "        {%- elif '</mm:think>' in content -%}\n"
    "            {%- set reasoning = content.split('</mm:think>')[0].split('<mm:think>')[-1] -%}\n"
    "            {%- set content = content.split('</mm:think>')[-1] -%}\n"
    "        {%- endif -%}\n"
    "        {%- if reasoning -%}\n"
    "            {{- '<mm:think>' ~ reasoning ~ '</mm:think>' -}}\n"
    "        {%- endif -%}\n"
    "        {{- content -}}\n"
    "        {%- if message.tool_calls -%}\n"
    "            {%- if content -%}{{- '\\n' -}}{%- endif -%}\n"
    "            {{- NS ~ '<tool_call>\\n' -}}\n"
    "            {%- for call in message.tool_calls -%}\n"
    "                {%- set fn = call.function if call.function is defined else call -%}\n"
    "                {{- NS ~ '<invoke name=\"' ~ fn.name ~ '\">\\n' -}}\n"
    "                {%- if fn.arguments is string -%}\n"
    "                    {{- fn.arguments ~ '\\n' -}}\n"
    "                {%- elif fn.arguments is mapping -%}\n"
    "                    {%- for name, value in fn.arguments | items -%}\n"
    "                        {{- NS ~ '<' ~ name ~ '>' ~ arg_value(value) ~ NS ~ '</' ~ name ~ '>\\n' -}}\n"
    "                    {%- endfor -%}\n"
    "                {%- endif -%}\n"
    "                {{- NS ~ '</invoke>\\n' -}}\n"
    "            {%- endfor -%}\n"
    "            {{- NS ~ '</tool_call>' -}}\n"
    "        {%- endif -%}\n"
    "        {{- '[e~[\\n' -}}\n"
    "    {%- elif message.role == 'tool' -%}\n"
    "        {{- ']~b]tool\\n' ~ text_of(message.content) ~ '[e~[\\n' -}}\n"
    "    {%- else -%}\n"
    "        {{- raise_exception('unknown message role: ' ~ message.role) -}}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- ']~b]ai\\n' -}}\n"
    "    {%- if mode == 'enabled' -%}\n"
    "        {{- '<mm:think>' -}}\n"
    "    {%- elif mode == 'disabled' -%}\n"
    "        {{- '<mm:think></mm:think>' -}}\n"
    "    {%- endif -%}\n"
    "{%- endif -%}\n";

const char *m3_chat_builtin_minimax_source(void) { return minimax_m3_template; }

static char *read_file(const char *path, size_t *len, m3_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) { m3_errf(err, "%s: cannot open", path); return NULL; }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); fclose(f); m3_errf(err, "%s: out of memory", path); return NULL; }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); m3_errf(err, "%s: read error", path); return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static m3_chat *chat_new(void) {
    m3_chat *c = calloc(1, sizeof *c);
    if (c) c->tokens = json_object();
    if (c && !c->tokens) { free(c); c = NULL; }
    return c;
}

m3_chat *m3_chat_from_source(const char *src, size_t len, const char *name, m3_err *err) {
    m3_chat *c = chat_new();
    if (!c) { m3_errf(err, "%s: out of memory", name); return NULL; }
    c->tmpl = m3_jinja_parse(src, len, name, err);
    c->source = malloc(len + 1);
    if (!c->tmpl || !c->source) {
        if (c->tmpl && !c->source) m3_errf(err, "%s: out of memory", name);
        m3_chat_free(c);
        return NULL;
    }
    memcpy(c->source, src, len);
    c->source[len] = 0;
    snprintf(c->origin, sizeof c->origin, "%s", name);
    return c;
}

m3_chat *m3_chat_derive(const m3_chat *base, const char *src, size_t len, const char *name, m3_err *err) {
    m3_chat *c = m3_chat_from_source(src, len, name, err);
    if (c && base && json_object_update(c->tokens, base->tokens)) {
        m3_errf(err, "%s: out of memory", name);
        m3_chat_free(c);
        return NULL;
    }
    return c;
}

m3_chat *m3_chat_builtin_minimax(m3_err *err) {
    return m3_chat_from_source(minimax_m3_template, strlen(minimax_m3_template), "builtin:minimax-m3", err);
}

/* bos_token & co: a string or {"content": "..."} (AddedToken spelling) */
static void copy_tokens(m3_chat *c, json_t *cfg) {
    const char *key;
    json_t *v;
    json_object_foreach(cfg, key, v) {
        size_t kl = strlen(key);
        if (kl < 6 || strcmp(key + kl - 6, "_token") != 0) continue;
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (json_is_string(v)) json_object_set_new(c->tokens, key, json_string(json_string_value(v)));
    }
}

static int is_minimax(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (!cfg) return 0;
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    const char *tmt = json_string_value(json_object_get(json_object_get(cfg, "text_config"), "model_type"));
    int yes = (mt && !strncmp(mt, "minimax_m3", 10)) || (tmt && !strncmp(tmt, "minimax_m3", 10));
    json_decref(cfg);
    return yes;
}

m3_chat *m3_chat_load(const char *dir, m3_err *err) { return m3_chat_load_with(dir, NULL, err); }

/* dir/tokenizer_config.json into *tc (NULL when there is none); -1 + err when it does not parse */
static int load_tokenizer_config(const char *dir, json_t **tc, m3_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    *tc = NULL;
    FILE *probe = fopen(path, "rb");
    if (!probe) return 0;
    fclose(probe);
    /* model_max_length is often 1e30 written as an integer, which jansson refuses ("too big
     * integer"): numbers load as reals (only strings are read from this file) */
    json_error_t je;
    *tc = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!*tc) return m3_errf(err, "%s: line %d: %s", path, je.line, je.text);
    if (!json_is_object(*tc)) {
        json_decref(*tc);
        *tc = NULL;
        return m3_errf(err, "%s: expected a JSON object", path);
    }
    return 0;
}

int m3_chat_tokens_from(m3_chat *c, const char *dir, m3_err *err) {
    json_t *tc;
    if (load_tokenizer_config(dir, &tc, err)) return -1;
    json_object_clear(c->tokens);
    if (tc) copy_tokens(c, tc);
    json_decref(tc);
    return 0;
}

m3_chat *m3_chat_load_with(const char *dir, const char *override, m3_err *err) {
    char path[4096];
    json_t *tc = NULL;
    if (load_tokenizer_config(dir, &tc, err)) return NULL;
    m3_chat *c = NULL;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *probe = override ? NULL : fopen(path, "rb");
    FILE *ov = override ? fopen(override, "rb") : NULL;
    /* the template file: --chat-template FILE, else the checkpoint's chat_template.jinja */
    const char *file = ov ? override : probe ? path : NULL;
    if (ov) fclose(ov);
    if (probe) fclose(probe);
    if (file) {
        size_t len;
        char *src = read_file(file, &len, err);
        if (!src) { json_decref(tc); return NULL; }
        c = m3_chat_from_source(src, len, file, err);
        free(src);
        if (!c) { json_decref(tc); return NULL; }
    } else if (override) { /* --chat-template TEXT: the template itself */
        c = m3_chat_from_source(override, strlen(override), "--chat-template", err);
        if (!c) { json_decref(tc); return NULL; }
    } else if (tc && json_object_get(tc, "chat_template")) {
        json_t *ct = json_object_get(tc, "chat_template");
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        if (json_is_string(ct)) {
            c = m3_chat_from_source(json_string_value(ct), json_string_length(ct), path, err);
        } else if (json_is_array(ct)) {
            json_t *def = NULL, *tool = NULL;
            size_t i;
            json_t *e;
            json_array_foreach(ct, i, e) {
                const char *nm = json_string_value(json_object_get(e, "name"));
                json_t *t = json_object_get(e, "template");
                if (!nm || !json_is_string(t)) {
                    json_decref(tc);
                    m3_errf(err, "%s: chat_template[%zu]: expected {\"name\": string, \"template\": string}", path, i);
                    return NULL;
                }
                if (!strcmp(nm, "default")) def = t;
                else if (!strcmp(nm, "tool_use")) tool = t;
            }
            if (!def) {
                json_decref(tc);
                m3_errf(err, "%s: chat_template: no template named \"default\"", path);
                return NULL;
            }
            char name[4200];
            snprintf(name, sizeof name, "%s (default)", path);
            c = m3_chat_from_source(json_string_value(def), json_string_length(def), name, err);
            if (c && tool) {
                snprintf(name, sizeof name, "%s (tool_use)", path);
                c->tool_tmpl = m3_jinja_parse(json_string_value(tool), json_string_length(tool), name, err);
                if (!c->tool_tmpl) { m3_chat_free(c); c = NULL; }
            }
        } else {
            json_decref(tc);
            m3_errf(err, "%s: chat_template: expected a string or a list of {name, template}", path);
            return NULL;
        }
        if (!c) { json_decref(tc); return NULL; }
    } else if (is_minimax(dir)) {
        c = m3_chat_builtin_minimax(err);
        if (!c) { json_decref(tc); return NULL; }
    } else {
        json_decref(tc);
        return m3_errf(err, "%s: no chat template (no chat_template.jinja, no \"chat_template\" in tokenizer_config.json, not a MiniMax-M3 checkpoint)", dir), NULL;
    }
    if (tc) copy_tokens(c, tc);
    json_decref(tc);
    return c;
}

int m3_chat_defines(const m3_chat *c, const char *name) {
    return !strcmp(name, "messages") || !strcmp(name, "tools") || !strcmp(name, "add_generation_prompt") ||
           json_object_get(c->tokens, name) != NULL;
}

char *m3_chat_render(const m3_chat *c, const json_t *messages, const json_t *tools, int add_generation_prompt,
                     const json_t *kwargs, const m3_jinja_limits *limits, size_t *out_len, m3_err *err) {
    if (!json_is_array(messages)) { m3_errf(err, "messages: expected a JSON array"); return NULL; }
    if (tools && !json_is_array(tools) && !json_is_null(tools)) { m3_errf(err, "tools: expected a JSON array"); return NULL; }
    if (kwargs && !json_is_object(kwargs)) { m3_errf(err, "chat template kwargs: expected a JSON object"); return NULL; }
    if (kwargs) { /* kwargs add variables; they never replace what the request or the tokenizer defines */
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)kwargs, k, v)
            if (m3_chat_defines(c, k)) {
                m3_errf(err, "chat template kwargs: '%.60s' is set by the request or the tokenizer's config and cannot be "
                        "overridden", k);
                return NULL;
            }
    }
    json_t *ctx = json_object();
    if (!ctx) { m3_errf(err, "out of memory"); return NULL; }
    /* a context missing a key (no memory) would render another prompt: fail instead */
    if (json_object_set(ctx, "messages", (json_t *)messages) ||
        json_object_set_new(ctx, "tools", tools ? json_incref((json_t *)tools) : json_null()) ||
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt)) ||
        json_object_update(ctx, c->tokens) || (kwargs && json_object_update(ctx, (json_t *)kwargs))) {
        json_decref(ctx);
        m3_errf(err, "out of memory");
        return NULL;
    }
    const m3_jinja *t = c->tmpl;
    if (c->tool_tmpl && tools && json_array_size(tools) > 0) t = c->tool_tmpl;
    char *out = m3_jinja_render(t, ctx, limits, out_len, err);
    json_decref(ctx);
    return out;
}

const char *m3_chat_origin(const m3_chat *c) { return c->origin; }

const char *m3_chat_source(const m3_chat *c) { return c->source; }

void m3_chat_free(m3_chat *c) {
    if (!c) return;
    m3_jinja_free(c->tmpl);
    m3_jinja_free(c->tool_tmpl);
    free(c->source);
    json_decref(c->tokens);
    free(c);
}
