/* Anthropic Messages requests translated without HTTP (src/server/anthropic.h):
 *   1. accepted requests become the OpenAI chat request that means the same (compared whole);
 *   2. refused ones get a 400 naming the field at fault;
 *   3. allocation failure at every point of each accepted translation: the same request as
 *      without the failure, or a clean 500 (never a request with a message or tool missing);
 *   4. the error body is Anthropic's shape with the type of its status, valid JSON also when
 *      the message is cut to fit.
 * Usage: test_anthropic */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "server/anthropic.h"

#include "../check.h"

static json_t *load(const char *s) {
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j) fprintf(stderr, "test JSON does not parse: %s: %s\n", je.text, s);
    return j;
}

static const struct { const char *in, *want; int count; } OK[] = {
    /* the minimum; unknown fields ignored (as on the OpenAI endpoint), metadata accepted */
    {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"metadata\":{\"user_id\":\"u\"},"
     "\"service_tier\":\"auto\",\"n\":3}",
     "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 0},
    /* system blocks, sampling, stop_sequences, stream, thinking off */
    {"{\"model\":\"m\",\"max_tokens\":9,\"system\":[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":{\"type\":\"ephemeral\"}},"
     "{\"type\":\"text\",\"text\":\"b\"}],\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q\"}]}],"
     "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":7,\"stop_sequences\":[\"x\",\"y\"],\"stream\":true,\"thinking\":{\"type\":\"disabled\"}}",
     "{\"model\":\"m\",\"max_tokens\":9,\"stream\":true,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":7,\"stop\":[\"x\",\"y\"],"
     "\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q\"}]}],\"chat_template_kwargs\":{\"thinking_mode\":\"disabled\"}}", 0},
    /* a tool round trip: tool_use in history, tool_result (is_error, image content) before text,
     * thinking and redacted_thinking, images by base64 and url, tools and tool_choice */
    {"{\"model\":\"m\",\"max_tokens\":9,\"messages\":["
     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"see\"},{\"type\":\"image\",\"source\":{\"type\":\"base64\","
     "\"media_type\":\"image/png\",\"data\":\"QUJD\"}}]},"
     "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"s\"},{\"type\":\"redacted_thinking\","
     "\"data\":\"zz\"},{\"type\":\"text\",\"text\":\"ok\"},{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"w\",\"input\":{\"city\":\"P\"}}]},"
     "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"is_error\":true,\"content\":[{\"type\":\"text\","
     "\"text\":\"no\"},{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":\"https://a/b.png\"}}]},{\"type\":\"text\",\"text\":\"and?\"}]}],"
     "\"tools\":[{\"name\":\"w\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}},{\"type\":\"custom\",\"name\":\"v\","
     "\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"w\",\"disable_parallel_tool_use\":true},"
     "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}}",
     "{\"model\":\"m\",\"max_tokens\":9,\"messages\":["
     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"see\"},{\"type\":\"image_url\",\"image_url\":{\"url\":"
     "\"data:image/png;base64,QUJD\"}}]},"
     "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"t1\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":"
     "{\"city\":\"P\"}}}],\"content\":[{\"type\":\"text\",\"text\":\"ok\"}],\"reasoning_content\":\"hm\"},"
     "{\"role\":\"tool\",\"tool_call_id\":\"t1\",\"content\":[{\"type\":\"text\",\"text\":\"Error: \"},{\"type\":\"text\",\"text\":\"no\"},"
     "{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://a/b.png\"}}]},"
     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"and?\"}]}],"
     "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"}}},"
     "{\"type\":\"function\",\"function\":{\"name\":\"v\",\"parameters\":{}}}],"
     "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"w\"}},\"parallel_tool_calls\":false,"
     "\"thinking_token_budget\":1024,\"chat_template_kwargs\":{\"thinking_mode\":\"enabled\"}}", 0},
    /* a budget past a 32-bit count: no limit */
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"enabled\","
     "\"budget_tokens\":99999999999}}",
     "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking_token_budget\":2147483647,"
     "\"chat_template_kwargs\":{\"thinking_mode\":\"enabled\"}}", 0},
    /* tool_choice any / none / auto, thinking adaptive */
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"any\"},"
     "\"thinking\":{\"type\":\"adaptive\"}}",
     "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\","
     "\"chat_template_kwargs\":{\"thinking_mode\":\"adaptive\"}}", 0},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"none\"}}",
     "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"none\"}", 0},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"auto\","
     "\"disable_parallel_tool_use\":false}}",
     "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"auto\"}", 0},
    /* a prefill: the answer continues the final assistant message (string or blocks, thinking
     * as its reasoning); count_tokens counts the same prompt */
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"Bon\"}]}",
     "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"Bon\"}],"
     "\"continue_final_message\":true,\"add_generation_prompt\":false}", 0},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"R\","
     "\"signature\":\"s\"},{\"type\":\"text\",\"text\":\" {\\\"a\\\":\"}]}]}",
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\" {\\\"a\\\":\"}],"
     "\"reasoning_content\":\"R\"}],\"continue_final_message\":true,\"add_generation_prompt\":false}", 1},
    /* an empty final assistant message is no prefill: the answer is a new turn */
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\"}]}",
     "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 0},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[]}]}",
     "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 0},
    /* consecutive user or assistant turns are one turn (Anthropic's rule): merged after translation */
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
     "\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"r\",\"signature\":\"\"},{\"type\":\"text\","
     "\"text\":\"c\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"s\",\"signature\":\"\"},{\"type\":\"tool_use\","
     "\"id\":\"t\",\"name\":\"w\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":\"ok\"}]},"
     "{\"role\":\"user\",\"content\":\"d\"}]}",
     "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
     "\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"c\"}],\"reasoning_content\":\"rs\",\"tool_calls\":"
     "[{\"id\":\"t\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":{}}}]},{\"role\":\"tool\",\"tool_call_id\":\"t\","
     "\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]},{\"role\":\"user\",\"content\":\"d\"}]}", 0},
    /* a final turn of several assistant messages is the prefill: merged, the last with content
     * continued (an empty one adds nothing; whitespace before the end is text) */
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"A \"},{\"role\":\"assistant\","
     "\"content\":\"B\"},{\"role\":\"assistant\",\"content\":\"\"}]}",
     "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"A \"},"
     "{\"type\":\"text\",\"text\":\"B\"}]}],\"continue_final_message\":true,\"add_generation_prompt\":false}", 0},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"Bon\"},{\"role\":\"assistant\","
     "\"content\":[]}]}",
     "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"Bon\"}],"
     "\"continue_final_message\":true,\"add_generation_prompt\":false}", 0},
    /* count_tokens: no max_tokens needed; stream and sampling have no part in it */
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,\"temperature\":1}",
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 1},
};

static const struct { const char *in; int count; const char *param, *says; } BADS[] = {
    {"[]", 0, "", "JSON object"},
    {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 0, "model", "'model' is required"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 0, "max_tokens", "'max_tokens' is required"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[]}", 0, "messages", "non-empty"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", 0, "messages[0]", "'system'"},
    /* a tool_use anywhere in a final turn of several messages */
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"b\",\"input\":{}}]},{\"role\":\"assistant\",\"content\":\"y\"}]}", 0,
     "messages[1]", "tool_use"},
    /* prefills that cannot be continued: trailing whitespace (Anthropic's rule; U+3000 too, as
     * Python's str.isspace), a tool_use block, thinking with no text, an empty last text block */
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y \"}]}", 0, "messages[1]", "trailing whitespace"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\\n\"}]}", 0, "messages[1]", "trailing whitespace"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\u3000\"}]}", 0, "messages[1]", "trailing whitespace"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"y\\t\"}]}]}", 0, "messages[1]", "trailing whitespace"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"y\"},{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"b\",\"input\":{}}]}]}", 0,
     "messages[1]", "tool_use"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t\",\"signature\":\"\"}]}]}", 1, "messages[1]", "text block to continue"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"y\"},{\"type\":\"text\",\"text\":\"\"}]}]}", 0, "messages[1]", "empty"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"document\"}]}]}", 0,
     "messages[0].content[0]", "'document'"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"b\","
     "\"input\":{}}]}]}", 0, "messages[0].content[0]", "'tool_use'"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"file\"}}]}]}",
     0, "messages[0].content[0]", "base64"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 0,
     "messages[0].content[0]", "'text' string"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"content\":\"x\"}]}]}",
     0, "messages[0].content[0]", "tool_use_id"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":["
     "{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"b\",\"input\":\"{}\"}]},{\"role\":\"user\",\"content\":\"y\"}]}", 0,
     "messages[1].content[0]", "'input' object"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"bash_20250124\","
     "\"name\":\"bash\"}]}", 0, "tools[0]", "bash_20250124"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"a\"}]}", 0,
     "tools[0]", "input_schema"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"tool\"}}", 0,
     "tool_choice", "'name'"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"any\"}", 0,
     "tool_choice", "object"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"enabled\"}}", 0,
     "thinking", "budget_tokens"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"on\"}}", 0,
     "thinking", "'thinking.type'"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":\"x\"}", 0,
     "stop_sequences", "array of strings"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":[{\"type\":\"image\"}]}", 0,
     "system[0]", "'image'"},
    {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"metadata\":\"u\"}", 0, "metadata",
     "object"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":7}]}", 1, "messages[0].content", "string or an array"},
};

int main(void) {
    m3_oai_error e;
    json_t *out;
    /* 1. translations */
    for (size_t k = 0; k < sizeof OK / sizeof *OK; k++) {
        json_t *in = load(OK[k].in), *want = load(OK[k].want);
        int rc = m3_anth_to_oai(in, OK[k].count, &out, &e);
        int same = !rc && json_equal(out, want);
        if (!same) {
            char *got = out ? json_dumps(out, JSON_COMPACT) : NULL;
            CHECK(same, "request %zu: %d %s -> %s", k, rc, rc ? e.message : "", got ? got : "(none)");
            free(got);
        }
        json_decref(out);
        json_decref(in);
        json_decref(want);
    }
    printf("1. %zu requests translated\n", sizeof OK / sizeof *OK);
    /* 2. refusals */
    for (size_t k = 0; k < sizeof BADS / sizeof *BADS; k++) {
        json_t *in = load(BADS[k].in);
        int rc = m3_anth_to_oai(in, BADS[k].count, &out, &e);
        CHECK(rc == 400 && !out && !strcmp(e.type, "invalid_request_error") && !strcmp(e.param, BADS[k].param) &&
                  strstr(e.message, BADS[k].says),
              "refusal %zu: %d param '%s' (want '%s'): %s", k, rc, e.param, BADS[k].param, e.message);
        json_decref(out);
        json_decref(in);
    }
    printf("2. %zu requests refused with the field at fault\n", sizeof BADS / sizeof *BADS);
    /* 3. one allocation failing at every point */
    long runs = 0, same = 0, oom = 0;
    for (size_t k = 0; k < sizeof OK / sizeof *OK; k++) {
        json_t *in = load(OK[k].in), *want = load(OK[k].want);
        m3_fault_json_hook(1);
        m3_fault_arm(M3_FAULT_SERVER, 1, 0, 1);
        int rc = m3_anth_to_oai(in, OK[k].count, &out, &e);
        long total = m3_fault_seen(M3_FAULT_SERVER);
        m3_fault_disarm(M3_FAULT_SERVER);
        json_decref(out);
        CHECK(rc == 0 && total > 0, "request %zu without faults: %d (%ld allocations)", k, rc, total);
        for (long n = 1; n <= total; n++) {
            m3_fault_arm(M3_FAULT_SERVER, n, 1, 1);
            rc = m3_anth_to_oai(in, OK[k].count, &out, &e);
            m3_fault_disarm(M3_FAULT_SERVER);
            runs++;
            if (!rc) {
                int s = json_equal(out, want);
                CHECK(s, "request %zu, allocation %ld failing: accepted as another request", k, n);
                same += s;
            } else {
                int clean = rc == 500 && !out && !strcmp(e.type, "server_error") && strstr(e.message, "memory");
                CHECK(clean, "request %zu, allocation %ld failing: %d %s", k, n, rc, e.message);
                oom += clean;
            }
            json_decref(out);
        }
        m3_fault_json_hook(0);
        json_decref(in);
        json_decref(want);
    }
    printf("3. %ld translations with one allocation failing: %ld the same request, %ld a clean 500\n", runs, same, oom);
    CHECK(runs > 0 && same + oom == runs, "fault runs: %ld not clean", runs - same - oom);
    /* 4. the error body */
    static const struct { int status; const char *type; } T[] = {
        {400, "invalid_request_error"}, {401, "authentication_error"}, {403, "permission_error"}, {404, "not_found_error"},
        {405, "invalid_request_error"}, {413, "request_too_large"}, {429, "rate_limit_error"}, {500, "api_error"},
        {503, "overloaded_error"}, {529, "overloaded_error"}};
    char buf[4096], longmsg[3000];
    for (size_t i = 0; i < sizeof longmsg - 1; i++) longmsg[i] = "ab\"\\\n"[i % 5];
    longmsg[sizeof longmsg - 1] = 0;
    for (size_t i = 0; i < sizeof T / sizeof *T; i++) {
        size_t n = m3_anth_error_json(buf, sizeof buf, T[i].status, "a \"quoted\"\nmessage");
        json_t *j = json_loadb(buf, n, 0, NULL);
        CHECK(j && !strcmp(json_string_value(json_object_get(j, "type")), "error") &&
                  !strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "type")), T[i].type) &&
                  !strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "message")), "a \"quoted\"\nmessage"),
              "error body for %d: %s", T[i].status, buf);
        json_decref(j);
    }
    for (size_t cap = 128; cap <= sizeof buf; cap *= 2) { /* cut to fit: still JSON */
        size_t n = m3_anth_error_json(buf, cap, 400, longmsg);
        json_t *j = json_loadb(buf, n, 0, NULL);
        CHECK(j && n < cap, "error body cut to %zu bytes is not JSON: %s", cap, buf);
        json_decref(j);
    }
    printf("4. error bodies in Anthropic's shape\n");
    if (failures) { printf("%d checks FAILED\n", failures); return 1; }
    printf("all passed\n");
    return 0;
}
