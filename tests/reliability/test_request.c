/* OpenAI request parsing without HTTP (src/server/openai.h), on a byte-level tokenizer and the
 * built-in MiniMax-M3 template:
 *   1. accepted requests give the parameters asked for (sampling, limits, stop strings and ids,
 *      logit_bias, echo, chat options), defaults where fields are absent;
 *   2. every refused one gets its status, type, the field at fault, and a message that is valid
 *      UTF-8 (also when it quotes invalid or oversized text from the request);
 *   3. allocation failure at every point of parsing each accepted request: either the same
 *      parameters as without the failure, or a clean 500 (never a truncated request: a lost
 *      stop id or message would change what is generated). Leaks: the sanitizer build.
 *   4. the server's 500 (an allocation failed: m3_err's oom) is told from the request's 400 by the
 *      error's kind, never by its words: a request whose refusal quotes "out of memory" gets 400;
 *      each allocation of the tokenizer and of the images' decoding and preprocessing failing in
 *      turn (alloc_fail.h: they do not count through base/fault.h) gets a 500 or the result as
 *      without it.
 * Usage: test_request */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "base/fault.h"
#include "server/media.h"
#include "server/openai.h"

#include "../../fuzz/bytetok.h"
#include "../alloc_fail.h"
#include "../check.h"

static m3_oai_ctx ctx;

static int valid_utf8(const char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n) {
        int k = m3_utf8_len((const uint8_t *)s + i, n - i);
        if (k <= 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* parses body for chat / completions: the status (0 when accepted). The parameters borrow from
 * the parsed body: it is kept (bodies[]) until release() */
static json_t *bodies[64];
static int n_bodies;

static int parse(const char *body, int chat, m3_oai_params *g, m3_oai_error *e) {
    json_t *b = NULL;
    memset(g, 0, sizeof *g);
    int rc = m3_oai_parse_body(body, strlen(body), &b, e);
    if (!rc) rc = m3_oai_parse_generate(&ctx, b, chat, g, e);
    if (b && n_bodies < 64) bodies[n_bodies++] = b;
    else json_decref(b);
    return rc;
}

/* a chat request of one user message "Hi" with more fields */
static int parse_hi(const char *fields, m3_oai_params *g, m3_oai_error *e) {
    char body[512];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],%s}", fields);
    return parse(body, 1, g, e);
}

static void release(void) {
    while (n_bodies) json_decref(bodies[--n_bodies]);
}

static int same_params(const m3_oai_params *a, const m3_oai_params *b) {
    if (a->n_ids != b->n_ids || memcmp(a->ids, b->ids, a->n_ids * sizeof *a->ids)) return 0;
    if (a->n_stop_ids != b->n_stop_ids || (a->n_stop_ids && memcmp(a->stop_ids, b->stop_ids, a->n_stop_ids * 4))) return 0;
    if (a->n_bias != b->n_bias || (a->n_bias && memcmp(a->bias, b->bias, (size_t)a->n_bias * sizeof *a->bias))) return 0;
    if (a->n_stop_strs != b->n_stop_strs) return 0;
    for (int i = 0; i < a->n_stop_strs; i++)
        if (strcmp(a->stop_strs[i], b->stop_strs[i])) return 0;
    if ((a->echo_text == NULL) != (b->echo_text == NULL) || a->echo_len != b->echo_len ||
        (a->echo_text && memcmp(a->echo_text, b->echo_text, a->echo_len)))
        return 0;
    return a->temperature == b->temperature && a->top_p == b->top_p && a->max_tokens == b->max_tokens && a->n == b->n &&
           a->prompt_logprobs == b->prompt_logprobs &&
           a->min_tokens == b->min_tokens && a->top_logprobs == b->top_logprobs && a->logprobs == b->logprobs &&
           a->stream == b->stream && a->include_usage == b->include_usage && a->seed == b->seed &&
           a->oo.thinking == b->oo.thinking && a->oo.tools == b->oo.tools;
}

int main(void) {
    m3_err err;
    char *tj = m3_test_bytetok_json();
    m3_tok *tok = tj ? m3_tok_load_json(tj, strlen(tj), &err) : NULL;
    free(tj);
    m3_chat *chat = m3_chat_builtin_minimax(&err);
    if (!tok || !chat) { fprintf(stderr, "setup: %s\n", err.msg); return 1; }
    ctx = (m3_oai_ctx){tok, chat, m3_tok_n_vocab(tok), "m3-test", NULL, 1024, 1, 1, NULL, NULL, 0, -1, 0, 0, 0, 0, 0};
    m3_oai_params g;
    m3_oai_error e;

    /* ---- 1. accepted ---- */
    int rc = parse("{\"model\":\"m3-test\",\"prompt\":\"Hello\",\"max_tokens\":5,\"temperature\":0.5,\"top_p\":0.9,"
                   "\"n\":3,\"seed\":11,\"stop\":[\"a\",\"\",\"bc\"],\"stop_token_ids\":[7,8],\"logit_bias\":{\"65\":2.5},"
                   "\"logprobs\":2,\"min_tokens\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                   0, &g, &e);
    CHECK(rc == 0, "completions with every field: %d %s", rc, e.message);
    if (!rc) {
        CHECK(g.n_ids == 5 && g.ids[0] == 'H' && g.max_tokens == 5 && g.temperature == 0.5 && g.n == 3 && g.has_seed &&
                  g.seed == 11 && g.n_stop_strs == 2 && !strcmp(g.stop_strs[1], "bc") && g.n_stop_ids == 2 &&
                  g.stop_ids[1] == 8 && g.n_bias == 1 && g.bias[0].token == 65 && g.bias[0].bias == 2.5f &&
                  g.logprobs && g.top_logprobs == 2 && g.min_tokens == 1 && g.stream && g.include_usage,
              "completions fields parsed");
    }
    m3_oai_params_free(&g);
    rc = parse("{\"prompt\":[72,105],\"echo\":true}", 0, &g, &e);
    CHECK(rc == 0 && g.n_ids == 2 && g.echo && g.echo_len == 2 && !memcmp(g.echo_text, "Hi", 2) && g.max_tokens == 16 &&
              g.temperature == 1.0 && g.n == 1 && g.prompt_logprobs == -1,
          "completions defaults + echo of token ids: %d %s", rc, e.message);
    m3_oai_params_free(&g);
    /* prompt logprobs: echo with logprobs takes its alternatives, vLLM's prompt_logprobs its own */
    rc = parse("{\"prompt\":\"Hi\",\"echo\":true,\"logprobs\":3,\"max_tokens\":0}", 0, &g, &e);
    CHECK(rc == 0 && g.prompt_logprobs == 3 && g.max_tokens == 0, "echo + logprobs 3: prompt logprobs %d: %d %s",
          g.prompt_logprobs, rc, e.message);
    m3_oai_params_free(&g);
    rc = parse("{\"prompt\":\"Hi\",\"echo\":true,\"logprobs\":3,\"prompt_logprobs\":0}", 0, &g, &e);
    CHECK(rc == 0 && g.prompt_logprobs == 0, "echo + logprobs 3 + prompt_logprobs 0: %d: %d %s", g.prompt_logprobs, rc, e.message);
    m3_oai_params_free(&g);
    /* chat echo (vLLM's): the last message's content when it has the answer's role; a budget's tags
     * read from the final turn */
    rc = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\","
               "\"text\":\"A\"},{\"type\":\"text\",\"text\":\"b\"}]}],\"echo\":true,\"continue_final_message\":true,"
               "\"add_generation_prompt\":false,\"thinking_token_budget\":4}", 1, &g, &e);
    CHECK(rc == 0 && g.echo && g.echo_len == 3 && !memcmp(g.echo_text, "A\nb", 3) && g.echo_off[1] == 3 && g.think_on &&
              g.think_budget == 4 && g.think_from > 0 && (size_t)g.think_from < g.n_ids,
          "chat echo of a continued message: %d '%.*s', think_from %d of %zu: %s", rc, (int)g.echo_len, g.echo_text ? g.echo_text : "",
          g.think_from, g.n_ids, e.message);
    m3_oai_params_free(&g);
    rc = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"echo\":true}", 1, &g, &e);
    CHECK(rc == 0 && g.echo && g.echo_len == 0, "chat echo, the user's message under the generation prompt: nothing: %d %s", rc, e.message);
    m3_oai_params_free(&g);
    /* a request's own chat_template (vLLM's): refused with vLLM's words unless the server trusts
     * request templates; then it renders the prompt with the model's special tokens, the
     * kwargs' chat_template winning, its failures the request's (400 naming the field) */
    {
        static const char *const untrusted[][3] = {
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template\":\"{{ 1 }}\"}", "1", "chat_template"},
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template_kwargs\":{\"chat_template\":\"x\"}}", "1",
             "chat_template_kwargs.chat_template"},
            {"{\"prompt\":\"Hi\",\"chat_template\":\"{{ 1 }}\"}", "0", "chat_template"},
        };
        rc = parse_hi("\"chat_template_kwargs\":{\"chat_template\":null}", &g, &e);
        CHECK(rc == 0, "untrusted, chat_template_kwargs.chat_template null: served (vLLM refuses only a template): %d %s", rc,
              e.message);
        m3_oai_params_free(&g);
        for (int i = 0; i < 2; i++) {
            ctx.trust_templates = i;
            for (size_t k = 0; k < sizeof untrusted / sizeof *untrusted; k++) {
                if (i && k < 2) continue; /* trusted: rendered (below) */
                rc = parse(untrusted[k][0], untrusted[k][1][0] == '1', &g, &e);
                CHECK(rc == 400 && !strcmp(e.param, untrusted[k][2]) &&
                          (k == 2 || strstr(e.message, "--trust-request-chat-template")),
                      "trust %d: %s: 400 naming %s: %d %s: %s", i, untrusted[k][0], untrusted[k][2], rc, e.param, e.message);
                m3_oai_params_free(&g);
            }
        }
        ctx.trust_templates = 1;
        static const char *const rendered[][2] = {
            {"\"chat_template\":\"<{{ messages[0].content }}|{{ add_generation_prompt }}>\"", "<Hi|True>"},
            {"\"chat_template\":\"A\",\"chat_template_kwargs\":{\"chat_template\":\"B{{ x }}\",\"x\":\"y\"}", "By"},
            {"\"chat_template\":\"{{ messages | length }}{{ tools is none }}\",\"add_generation_prompt\":false", "1True"},
        };
        for (size_t k = 0; k < sizeof rendered / sizeof *rendered; k++) {
            rc = parse_hi(rendered[k][0], &g, &e);
            size_t L = strlen(rendered[k][1]);
            int same = rc == 0 && g.n_ids == L;
            for (size_t q = 0; same && q < L; q++) same = g.ids[q] == (unsigned char)rendered[k][1][q];
            CHECK(same, "trusted template %s: the prompt is '%s': %d %s", rendered[k][0], rendered[k][1], rc, e.message);
            m3_oai_params_free(&g);
        }
        m3_oai_params p0, p1;
        int r0 = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 1, &p0, &e);
        int r1 = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template\":null}", 1, &p1, &e);
        CHECK(r0 == 0 && r1 == 0 && p0.n_ids == p1.n_ids && !memcmp(p0.ids, p1.ids, sizeof(int32_t) * p0.n_ids),
              "chat_template null: the model's template");
        m3_oai_params_free(&p1);
        /* the model's template too for "" (vLLM's `or`) and for the kwargs' key null, which wins */
        static const char *const models[] = {"\"chat_template\":\"\"", "\"chat_template\":\"X\",\"chat_template_kwargs\":{\"chat_template\":null}",
                                             "\"chat_template_kwargs\":{\"chat_template\":\"\"}"};
        for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
            r1 = parse_hi(models[k], &p1, &e);
            CHECK(r0 == 0 && r1 == 0 && p0.n_ids == p1.n_ids && !memcmp(p0.ids, p1.ids, sizeof(int32_t) * p0.n_ids),
                  "%s: the model's template: %d %s", models[k], r1, e.message);
            m3_oai_params_free(&p1);
        }
        m3_oai_params_free(&p0);
        static const char *const bad[][2] = {
            {"\"chat_template\":\"{% if %}\"", "chat_template"},
            {"\"chat_template\":\"{{ raise_exception('no system role') }}\"", "chat_template"},
            {"\"chat_template\":5", "chat_template"},
            {"\"chat_template_kwargs\":{\"chat_template\":[\"x\"]}", "chat_template_kwargs.chat_template"},
            {"\"chat_template\":\"{{ x }}\",\"chat_template_kwargs\":{\"messages\":[]}", "chat_template_kwargs.messages"},
            /* the template's words are never taken for the server's allocation failure */
            {"\"chat_template\":\"{{ raise_exception('out of memory') }}\"", "chat_template"},
            /* a prompt that cannot be tokenized is the template's fault, not the messages' */
            {"\"chat_template\":\"{{ '\\\\ud800' }}\"", "chat_template"},
        };
        for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
            rc = parse_hi(bad[k][0], &g, &e);
            CHECK(rc == 400 && !strcmp(e.param, bad[k][1]) && (k != 1 || strstr(e.message, "no system role")),
                  "trusted, %s: 400 naming %s: %d %s: %s", bad[k][0], bad[k][1], rc, e.param, e.message);
            m3_oai_params_free(&g);
        }
        ctx.trust_templates = 0;
    }
    rc = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"prompt_logprobs\":5}", 1, &g, &e);
    CHECK(rc == 0 && g.prompt_logprobs == 5, "chat prompt_logprobs 5: %d: %d %s", g.prompt_logprobs, rc, e.message);
    m3_oai_params_free(&g);
    rc = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":false},"
               "\"tool_choice\":\"none\",\"logprobs\":true,\"top_logprobs\":3}",
               1, &g, &e);
    CHECK(rc == 0 && g.oo.thinking == M3_THINK_DISABLED && g.oo.tools == 0 && g.logprobs && g.top_logprobs == 3 &&
              g.max_tokens == 1024 - (long long)g.n_ids,
          "chat: thinking off, tool_choice none, logprobs, max_tokens = rest of the context: %d %s", rc, e.message);
    m3_oai_params_free(&g);
    /* a JSON answer is never read as tool calls (text in its strings could spell one), whatever
     * the tools; a forced call and a free answer keep the tool parser */
    {
        static const char *const cases[][2] = {
            {"\"response_format\":{\"type\":\"json_object\"}", "0"},
            {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":{\"type\":\"array\"}}}", "0"},
            {"\"guided_json\":{\"type\":\"object\"}", "0"},
            {"\"guided_regex\":\"a\"", "0"},
            {"\"guided_choice\":[\"a\"]", "0"},
            {"\"tool_choice\":\"required\"", "1"},
            {"\"tool_choice\":\"auto\"", "1"},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            char body[512];
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":"
                     "{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}],%s}", cases[i][0]);
            rc = parse(body, 1, &g, &e);
            CHECK(rc == 0 && g.oo.tools == cases[i][1][0] - '0', "tool parser with %s: %d (rc %d %s)", cases[i][0], g.oo.tools, rc,
                  e.message);
            m3_oai_params_free(&g);
        }
    }
    /* strict tools: constrained under tool_choice auto / absent, not under none, and a JSON answer
     * takes precedence (M3_OAI_C_TOOLS_AUTO) */
    {
        static const struct { const char *extra; int constraint; } sc[] = {
            {"", M3_OAI_C_TOOLS_AUTO}, {",\"tool_choice\":\"auto\"", M3_OAI_C_TOOLS_AUTO}, {",\"tool_choice\":\"none\"", M3_OAI_C_NONE},
            {",\"tool_choice\":\"required\"", M3_OAI_C_TOOLS}, {",\"response_format\":{\"type\":\"json_object\"}", M3_OAI_C_JSON_OBJECT}};
        for (size_t i = 0; i < sizeof sc / sizeof *sc; i++) {
            char body[512];
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":"
                     "{\"name\":\"f\",\"strict\":true,\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]%s}", sc[i].extra);
            rc = parse(body, 1, &g, &e);
            CHECK(rc == 0 && g.constraint == sc[i].constraint, "strict tools with '%s': constraint %d, want %d (rc %d %s)", sc[i].extra,
                  g.constraint, sc[i].constraint, rc, e.message);
            m3_oai_params_free(&g);
        }
        /* one tool strict, another not: the calls stay free (the grammar would bind both) */
        rc = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                   "\"strict\":true,\"parameters\":{\"type\":\"object\"}}},{\"type\":\"function\",\"function\":{\"name\":\"g\","
                   "\"parameters\":{\"type\":\"object\"}}}]}",
                   1, &g, &e);
        CHECK(rc == 0 && g.constraint == M3_OAI_C_NONE, "strict and non-strict tools: constraint %d (rc %d %s)", g.constraint, rc, e.message);
        m3_oai_params_free(&g);
    }
    /* a tool-call history sent back the OpenAI way (function.arguments a JSON string) renders as the
     * same object would: the model's own <city>Paris</city>, never the raw JSON (issue 26) */
    {
        const char *as_str = "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
                             "\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
                             "\"w\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 3}\"}}]},{\"role\":\"tool\","
                             "\"tool_call_id\":\"c1\",\"content\":\"sun\"}]}";
        const char *as_obj = "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
                             "\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
                             "\"w\",\"arguments\":{\"city\": \"Paris\", \"days\": 3}}}]},{\"role\":\"tool\","
                             "\"tool_call_id\":\"c1\",\"content\":\"sun\"}]}";
        const char *as_bad = "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
                             "\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
                             "\"w\",\"arguments\":\"city=Paris\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sun\"}]}";
        /* a key twice (the streamed arguments keep duplicates in their text): the last one wins */
        const char *as_dup = "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
                             "\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
                             "\"w\",\"arguments\":\"{\\\"city\\\": \\\"Rome\\\", \\\"days\\\": 3, \\\"city\\\": \\\"Paris\\\"}\"}}]},"
                             "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sun\"}]}";
        m3_oai_params a, o, x, dd;
        int ra = parse(as_str, 1, &a, &e), ro = parse(as_obj, 1, &o, &e), rx = parse(as_bad, 1, &x, &e);
        int rd = parse(as_dup, 1, &dd, &e);
        CHECK(rd == 0 && dd.n_ids == o.n_ids && !memcmp(dd.ids, o.ids, sizeof(int32_t) * o.n_ids),
              "arguments with a key twice render with the last value: %zu vs %zu ids", dd.n_ids, o.n_ids);
        m3_oai_params_free(&dd);
        CHECK(ra == 0 && ro == 0 && a.n_ids == o.n_ids && !memcmp(a.ids, o.ids, sizeof(int32_t) * a.n_ids),
              "tool-call arguments as a JSON string render as the object: %zu vs %zu ids", a.n_ids, o.n_ids);
        CHECK(rx == 0 && x.n_ids != o.n_ids, "arguments that are not JSON stay a string (%d)", rx);
        m3_oai_params_free(&a);
        m3_oai_params_free(&o);
        m3_oai_params_free(&x);
        release();
    }
    /* generation_config.json's defaults fill what the request leaves out, and only that */
    m3_oai_defaults dd = {0};
    dd.temperature = 0.3, dd.has_temperature = 1, dd.top_k = 20, dd.has_top_k = 1, dd.top_p = 0.8, dd.has_top_p = 1;
    ctx.defaults = &dd;
    rc = parse("{\"prompt\":\"x\",\"top_p\":0.5}", 0, &g, &e);
    CHECK(rc == 0 && g.temperature == 0.3 && g.top_k == 20 && g.top_p == 0.5 && g.min_p == 0,
          "generation_config defaults: temperature %g top_k %lld top_p %g (given: 0.5)", g.temperature, g.top_k, g.top_p);
    m3_oai_params_free(&g);
    ctx.defaults = NULL;

    /* ---- 2. refused ---- */
    struct { const char *body; int chat, status; const char *param; } bad[] = {
        {"{\"prompt\": ", 0, 400, ""},
        {"[1]", 0, 400, ""},
        {"{\"prompt\":\"\\ud800\"}", 0, 400, ""},          /* lone surrogate */
        {"{\"prompt\":\"a\\u0000b\"}", 0, 400, ""},         /* NUL */
        {"{\"prompt\":\"\xff\xfe\"}", 0, 400, ""},           /* invalid UTF-8 */
        {"{\"model\":\"other\",\"prompt\":\"x\"}", 0, 404, "model"},
        {"{\"model\":5,\"prompt\":\"x\"}", 0, 400, "model"},
        {"{\"prompt\":\"x\",\"n\":17}", 0, 400, "n"},
        {"{\"prompt\":\"x\",\"max_tokens\":0}", 0, 400, "max_tokens"},
        {"{\"prompt\":\"x\",\"max_tokens\":1024}", 0, 400, "max_tokens"},
        {"{\"prompt\":\"x\",\"temperature\":\"hot\"}", 0, 400, "temperature"},
        {"{\"prompt\":\"x\",\"top_p\":2}", 0, 400, "top_p"},
        {"{\"prompt\":\"x\",\"logprobs\":21}", 0, 400, "logprobs"},
        {"{\"prompt\":\"x\",\"stop\":5}", 0, 400, "stop"},
        {"{\"prompt\":\"x\",\"stop_token_ids\":[999]}", 0, 400, "stop_token_ids"},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"1\":101}}", 0, 400, "logit_bias"},
        {"{\"prompt\":\"x\",\"min_tokens\":20,\"max_tokens\":2}", 0, 400, "min_tokens"},
        {"{\"prompt\":\"x\",\"best_of\":3}", 0, 400, "best_of"},
        {"{\"prompt\":\"x\",\"suffix\":\"y\"}", 0, 400, "suffix"},
        {"{\"prompt\":\"x\",\"prompt_logprobs\":21}", 0, 400, "prompt_logprobs"},
        {"{\"prompt\":\"x\",\"prompt_logprobs\":-1}", 0, 400, "prompt_logprobs"},
        {"{\"prompt\":\"x\",\"prompt_logprobs\":true}", 0, 400, "prompt_logprobs"},
        {"{\"prompt\":\"x\",\"prompt_logprobs\":1,\"stream\":true}", 0, 400, "prompt_logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 1, 400, "max_tokens"},
        {"{\"prompt\":[1,999]}", 0, 400, "prompt"},
        {"{\"prompt\":[\"a\",\"\"]}", 0, 400, "prompt[1]"},
        {"{\"prompt\":[\"a\",5]}", 0, 400, "prompt[1]"},
        {"{\"prompt\":\"\"}", 0, 400, "prompt"},
        {"{\"messages\":[]}", 1, 400, "messages"},
        {"{\"messages\":\"hi\"}", 1, 400, "messages"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", 1, 400, "tools"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", 1, 400, "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 1, 400, "top_logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":[]}", 1, 400, "chat_template_kwargs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"thinking_mode\":\"x\"}}", 1, 400,
         "messages"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}", 1, 400,
         "response_format"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\"}}", 1, 400,
         "response_format"},
        {"{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":5}}}", 0, 400,
         "response_format"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"function\"}}", 1, 400, "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"always\"}", 1, 400, "tool_choice"},
        /* vLLM's constrained decoding: malformed or not served (a grammar) -> refused, never ignored */
        {"{\"prompt\":\"x\",\"guided_json\":\"{nope\"}", 0, 400, "guided_json"},
        {"{\"prompt\":\"x\",\"guided_json\":{},\"response_format\":{\"type\":\"json_object\"}}", 0, 400, "guided_json"},
        {"{\"prompt\":\"x\",\"structured_outputs\":{\"structural_tag\":\"{}\"}}", 0, 400, "structured_outputs"},
        {"{\"prompt\":\"x\",\"structured_outputs\":{}}", 0, 400, "structured_outputs"},
        {"{\"prompt\":\"x\",\"structured_outputs\":{\"regex\":\"a\",\"choice\":[\"a\"]}}", 0, 400, "structured_outputs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"guided_choice\":[]}", 1, 400, "guided_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"guided_choice\":[\"a\",null]}", 1, 400, "guided_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"guided_regex\":[\"a\"]}", 1, 400, "guided_regex"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"guided_grammar\":5}", 1, 400, "guided_grammar"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"grammar\":\"root ::= x\",\"guided_regex\":\"a\"}", 1, 400, "grammar"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"guided_whitespace_pattern\":\" \"}", 1, 400,
         "guided_whitespace_pattern"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"guided_decoding_backend\":1}", 1, 400, "guided_decoding_backend"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":1}}]}", 1,
         400, "tools"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"parallel_tool_calls\":0}", 1, 400, "parallel_tool_calls"},
        /* chat_template_kwargs adds variables; it never replaces the validated request (issue 23) */
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"chat_template_kwargs\":{\"thinking_mode\":\"disabled\","
         "\"messages\":[{\"role\":\"system\",\"content\":\"INJECTED\"},{\"role\":\"user\",\"content\":\"other\"}]}}", 1, 400,
         "chat_template_kwargs.messages"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"add_generation_prompt\":false}}", 1,
         400, "chat_template_kwargs.add_generation_prompt"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"tools\":[]}}", 1, 400,
         "chat_template_kwargs.tools"},
        /* images without a vision tower (no media context), other media */
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"},{\"type\":\"image_url\","
         "\"image_url\":{\"url\":\"data:image/png;base64,iVBORw0KGgo=\"}}]}]}", 1, 400, "messages[0].content[1]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":{}}]}]}", 1, 400,
         "messages[0].content[0]"},
    };
    int nbad = (int)(sizeof bad / sizeof *bad), good = 0;
    for (int i = 0; i < nbad; i++) {
        rc = parse(bad[i].body, bad[i].chat, &g, &e);
        int ok = rc == bad[i].status && e.status == rc && e.type && e.message[0] && valid_utf8(e.message) &&
                 !strcmp(e.param, bad[i].param);
        CHECK(ok, "refused #%d (%s): status %d (want %d), param '%s' (want '%s'): %s", i, bad[i].body, rc, bad[i].status,
              e.param, bad[i].param, e.message);
        good += ok;
        m3_oai_params_free(&g);
        release();
    }
    /* quoted request text is clipped at a character boundary: the message stays valid UTF-8 */
    char big[600];
    strcpy(big, "{\"model\":\"");
    for (int i = 0; i < 100; i++) strcat(big, "\xc3\xa9");
    strcat(big, "\",\"prompt\":\"x\"}");
    rc = parse(big, 0, &g, &e);
    CHECK(rc == 404 && valid_utf8(e.message) && strlen(e.message) < 200, "a long model name is clipped: %s", e.message);
    m3_oai_params_free(&g);
    m3_oai_errorf(&e, 400, "invalid_request_error", NULL, "bad bytes: %s", "\xff\xc3");
    CHECK(valid_utf8(e.message), "invalid bytes in a message are replaced: %s", e.message);
    printf("2. %d/%d refused requests with their status, param and a valid UTF-8 message\n", good, nbad);

    /* ---- 3. allocation failure at every point ---- */
    const struct { const char *body; int chat; } ok_bodies[] = {
        {"{\"prompt\":\"Hello there\",\"stop\":[\"a\",\"bc\"],\"stop_token_ids\":[7,8],\"logit_bias\":{\"65\":2,\"66\":-3},"
         "\"echo\":true,\"max_tokens\":4}",
         0},
        {"{\"prompt\":[72,105,33],\"echo\":true,\"max_tokens\":0,\"logprobs\":2,\"prompt_logprobs\":3}", 0},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Yo\"}],\"echo\":true,"
         "\"continue_final_message\":true,\"add_generation_prompt\":false,\"thinking_token_budget\":2}", 1},
        {"{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
         "{\"role\":\"assistant\",\"content\":\"<mm:think>r</mm:think>Yo\"},{\"role\":\"user\",\"content\":\"More\"}],"
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
         "\"properties\":{\"a\":{\"type\":\"integer\"}}}}}],\"chat_template_kwargs\":{\"thinking_mode\":\"adaptive\"},"
         "\"max_tokens\":8}",
         1},
        /* a tool-call history the OpenAI way (arguments a JSON string), parsed into a render copy */
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":\"\","
         "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":"
         "\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 3}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sun\"}],"
         "\"max_tokens\":4}",
         1},
    };
    long runs = 0, same = 0, oom = 0;
    for (int k = 0; k < (int)(sizeof ok_bodies / sizeof *ok_bodies); k++) {
        m3_oai_params want;
        m3_oai_error we;
        m3_fault_json_hook(1);
        m3_fault_arm(M3_FAULT_SERVER, 1, 0, 1);
        rc = parse(ok_bodies[k].body, ok_bodies[k].chat, &want, &we);
        long total = m3_fault_seen(M3_FAULT_SERVER);
        CHECK(rc == 0 && total > 0, "body %d without faults: %d %s (%ld allocations)", k, rc, we.message, total);
        for (long n = 1; n <= total; n++) {
            m3_fault_arm(M3_FAULT_SERVER, n, 1, 1);
            rc = parse(ok_bodies[k].body, ok_bodies[k].chat, &g, &e);
            m3_fault_disarm(M3_FAULT_SERVER);
            runs++;
            if (rc == 0) {
                int s = same_params(&g, &want);
                CHECK(s, "body %d, allocation %ld failing: accepted with other parameters", k, n);
                same += s;
            } else {
                int clean = rc == 500 && !strcmp(e.type, "server_error") && strstr(e.message, "memory");
                /* jansson values the template makes: a failed one is a template error (400) */
                int tmpl = rc == 400 && ok_bodies[k].chat && strstr(e.message, "chat template");
                CHECK(clean || tmpl, "body %d, allocation %ld failing: %d %s", k, n, rc, e.message);
                oom += clean || tmpl;
            }
            m3_oai_params_free(&g);
            if (n_bodies > 1) json_decref(bodies[--n_bodies]); /* this run's; want's stays */
        }
        m3_oai_params_free(&want);
        release();
    }
    m3_fault_json_hook(0);
    printf("3. %ld parses with one allocation failing: %ld gave the same parameters, %ld a clean error\n", runs, same, oom);
    CHECK(same + oom == runs, "fault runs: %ld not clean", runs - same - oom);

    release();

    /* ---- 4. 500 by the error's kind, 400 whatever its words ---- */
    {
        /* the tokenizer: each allocation failing sets oom (a 500), or the ids come out the same */
        static const char text[] = "Hello there, ]~!b[ \xc3\xa9t\xc3\xa9 \xe2\x82\xac 42!";
        int32_t *want = NULL, *ids = NULL;
        size_t nwant = 0, nids = 0;
        m3_test_alloc_arm(0);
        rc = m3_tok_encode(tok, text, sizeof text - 1, 1, &want, &nwant, &err);
        long total = m3_test_alloc_disarm();
        CHECK(rc == 0 && total > 0, "tokenize without failures: %s (%ld allocations)", err.msg, total);
        long bad_runs = 0;
        for (long k = 1; k <= total; k++) {
            m3_err e2 = {0};
            m3_test_alloc_arm(k);
            rc = m3_tok_encode(tok, text, sizeof text - 1, 1, &ids, &nids, &e2);
            m3_test_alloc_disarm();
            int same = rc == 0 && nids == nwant && !memcmp(ids, want, nids * sizeof *ids);
            int oom = rc != 0 && e2.oom && m3_test_alloc_failed();
            CHECK(same || oom, "tokenize, allocation %ld of %ld failing: rc %d, oom %d: %s", k, total, rc, e2.oom, e2.msg);
            bad_runs += !(same || oom);
            free(ids);
            ids = NULL;
        }
        free(want);
        printf("4. tokenizer: %ld runs with one allocation failing, %ld neither the same ids nor out of memory\n", total, bad_runs);

        /* images: a refusal that quotes "out of memory" is the request's; a failed allocation the
         * server's, at every allocation of checking, decoding and preprocessing a PNG and a JPEG
         * (not WebP: libwebp 1.2 reports its allocation failures as corrupt data or a user abort,
         * and its lossless decoder crashes after some of them) */
        m3_vision_config vc = {.channels = 3, .patch = 14, .temporal = 2, .merge = 2};
        m3_media_ctx mc = {.vc = &vc, .start_id = -1, .end_id = -1};
        m3_image_opts_default(&mc.io);
        static const char *const urls[] = {
            "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAYAAAAFCAIAAADpOgqxAAAAK0lEQVQImWP8////WYafcHSG0YGF4eBPBgYkZM/"
            "OwnAAVcgBU6geU2g/OwBnwiOCkc59XwAAAABJRU5ErkJggg==",
            "data:image/jpeg;base64,/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAYEBQYFBAYGBQYHBwYIChAKCgkJChQODwwQFxQYGBcUFhYaHSUfGhsjHBYWICwgIy"
            "YnKSopGR8tMC0oMCUoKSj/2wBDAQcHBwoIChMKChMoGhYaKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCj/wAARCAAF"
            "AAYDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0"
            "KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKz"
            "tLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBA"
            "cFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0"
            "dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPw"
            "DU8MarP8RvGVzpGu820Nq90vO75w6KP0c0UUV8r4g1qmEzd0qD5Y8sdEfU1sVWy6vUoYSThDmbsttT/9k=",
        };
        json_t *quoted = json_pack("[{s:s,s:[{s:s,s:{s:s}}]}]", "role", "user", "content", "type", "image_url", "image_url", "url",
                                   "data:out of memory;base64,aGVsbG8=");
        json_t *render = NULL;
        m3_media mm = {0};
        rc = m3_media_collect(&mc, quoted, &render, &mm, &e);
        CHECK(rc == 400 && e.status == 400 && !strcmp(e.type, "invalid_request_error") && strstr(e.message, "out of memory"),
              "a data URL whose media type says 'out of memory': 400, got %d %s: %s", rc, e.type, e.message);
        json_decref(render);
        m3_media_free(&mm);
        json_decref(quoted);
        long runs = 0, served = 0, refused = 0;
        for (size_t u = 0; u < sizeof urls / sizeof *urls; u++) {
            json_t *msgs = json_pack("[{s:s,s:[{s:s,s:{s:s}}]}]", "role", "user", "content", "type", "image_url", "image_url", "url",
                                     urls[u]);
            render = NULL;
            m3_test_alloc_arm(0);
            rc = m3_media_collect(&mc, msgs, &render, &mm, &e);
            total = m3_test_alloc_disarm();
            const int want_patches = mm.px.n_patches;
            CHECK(rc == 0 && want_patches > 0 && total > 0, "image %zu without failures: %d %s (%ld allocations)", u, rc, e.message, total);
            json_decref(render);
            m3_media_free(&mm);
            for (long k = 1; k <= total; k++) {
                render = NULL;
                m3_test_alloc_arm(k);
                rc = m3_media_collect(&mc, msgs, &render, &mm, &e);
                m3_test_alloc_disarm();
                runs++;
                if (rc == 0) served += mm.px.n_patches == want_patches;
                refused += rc == 500;
                CHECK((rc == 0 && mm.px.n_patches == want_patches) ||
                          (rc == 500 && e.status == 500 && !strcmp(e.type, "server_error") && m3_test_alloc_failed()),
                      "image %zu, allocation %ld of %ld failing: %d %s: %s", u, k, total, rc, rc ? e.type : "", rc ? e.message : "");
                json_decref(render);
                m3_media_free(&mm);
            }
            json_decref(msgs);
        }
        printf("4. images (PNG, JPEG): %ld runs with one allocation failing: %ld as without it, %ld a 500\n", runs, served,
               refused);
    }

    m3_chat_free(chat);
    m3_tok_free(tok);
    if (failures) { printf("%d checks FAILED\n", failures); return 1; }
    printf("all request checks passed\n");
    return 0;
}
