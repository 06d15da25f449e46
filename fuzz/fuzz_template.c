/* libFuzzer: arbitrary bytes as a Jinja template, parsed and rendered with a small chat
 * context. Must never crash, hang or leak: the limits below turn runaway templates
 * (deep recursion, huge loops, huge strings) into clean errors. */
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja.h"

static const char ctx_json[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9\\ud83d\\ude00\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"r\","
    "  \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"n\": 3}";

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    static json_t *ctx;
    if (!ctx) ctx = json_loads(ctx_json, 0, NULL);
    m3_err err;
    m3_jinja *t = m3_jinja_parse((const char *)data, size, "fuzz", &err);
    if (!t) return 0;
    m3_jinja_limits lim = {.max_output = 1 << 20, .max_memory = 64 << 20, .max_steps = 200000, .max_depth = 200};
    char *out = m3_jinja_render(t, ctx, &lim, NULL, &err);
    free(out);
    m3_jinja_free(t);
    return 0;
}
