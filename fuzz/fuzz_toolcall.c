/* libFuzzer: the output parsers (reasoning + namespaced tool calls, src/chat/parsers.h).
 * Input: byte 0 picks the options (reasoning parser on/off, thinking mode, tool parser
 * on/off) and seeds the split; the rest is the model's text, fed in random pieces with a
 * fixed tools schema. Checked: nothing lost or duplicated (reasoning + content + markup
 * bytes == input bytes, reasoning and content are subsequences of the input, and content
 * is the input itself when nothing was taken as markup), argument pieces belong to the
 * call begun last, every call's pieces concatenate to a JSON object (calls stream: a begun
 * call is always closed), rendering never fails, and the split does not change the result. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat/parsers.h"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"temp\":{\"type\":\"number\"},\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},"
    "\"tags\":{\"type\":\"array\"},\"limit\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}]},"
    "\"code\":{\"type\":[\"string\",\"number\"]},\"unit\":{\"enum\":[\"c\",\"f\"]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"query\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"}}}}}]";

typedef struct {
    char *p;
    size_t n, cap;
} sb;

static void sb_add(sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

typedef struct {
    sb r, c, calls; /* calls: "id name args\n" per call */
    sb args;        /* the arguments of the call begun last, so far */
    int ncalls;
    size_t markup;
} acc;

/* the call begun last is complete: its arguments must be a JSON object */
static void call_close(acc *a) {
    if (!a->ncalls) return;
    json_error_t jerr;
    json_t *args = json_loadb(a->args.p ? a->args.p : "", a->args.n, JSON_ALLOW_NUL, &jerr);
    if (!json_is_object(args)) abort();
    json_decref(args);
    sb_add(&a->calls, a->args.p ? a->args.p : "", a->args.n);
    sb_add(&a->calls, "\n", 1);
    a->args.n = 0;
}

static void take(acc *a, const m3_out_delta *d, size_t n) {
    json_t *j = m3_out_delta_json(d, n);
    if (!j) abort();
    json_decref(j);
    for (size_t i = 0; i < n; i++) {
        switch (d[i].kind) {
        case M3_OUT_REASONING: sb_add(&a->r, d[i].text, d[i].len); break;
        case M3_OUT_CONTENT: sb_add(&a->c, d[i].text, d[i].len); break;
        case M3_OUT_TOOL_BEGIN:
            if (d[i].index != a->ncalls) abort();
            call_close(a);
            a->ncalls++;
            sb_add(&a->calls, d[i].id, strlen(d[i].id));
            sb_add(&a->calls, " ", 1);
            sb_add(&a->calls, d[i].name, strlen(d[i].name));
            sb_add(&a->calls, " ", 1);
            break;
        case M3_OUT_TOOL_ARGS:
            if (d[i].index != a->ncalls - 1 || !d[i].len) abort();
            sb_add(&a->args, d[i].text, d[i].len);
            break;
        }
    }
}

static int subsequence(const sb *s, const uint8_t *in, size_t n) {
    size_t j = 0;
    for (size_t i = 0; i < n && j < s->n; i++)
        if ((char)in[i] == s->p[j]) j++;
    return j == s->n;
}

static void run(const m3_out_opts *opts, const json_t *tools, const uint8_t *data, size_t size, uint64_t seed,
                int split, acc *a) {
    memset(a, 0, sizeof *a);
    m3_err err;
    m3_out *o = m3_out_new(opts, tools, &err);
    if (!o) abort();
    const m3_out_delta *d;
    size_t n, pos = 0;
    while (pos < size) {
        size_t len = size - pos;
        if (split) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            len = (size_t)(seed >> 33) % (seed & 1 ? 4 : 40) + 1;
            if (len > size - pos) len = size - pos;
        }
        if (m3_out_feed(o, (const char *)data + pos, len, &d, &n, &err)) abort();
        take(a, d, n);
        pos += len;
    }
    if (m3_out_finish(o, &d, &n, &err)) abort();
    take(a, d, n);
    call_close(a);
    if (m3_out_tool_calls(o) != a->ncalls || m3_out_tool_calls_done(o) != a->ncalls) abort();
    a->markup = m3_out_markup_bytes(o);
    m3_out_free(o);
}

static void acc_free(acc *a) {
    free(a->r.p);
    free(a->c.p);
    free(a->calls.p);
    free(a->args.p);
}

static int same(const sb *x, const sb *y) { return x->n == y->n && (x->n == 0 || !memcmp(x->p, y->p, x->n)); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *tools;
    if (!tools) {
        json_error_t jerr;
        tools = json_loads(TOOLS, 0, &jerr);
        if (!tools) abort();
    }
    if (size < 1) return 0;
    uint8_t ctl = data[0];
    data++, size--;
    m3_out_opts opts = {.reasoning = !(ctl & 0x10), .thinking = (m3_reason_mode)(ctl % 3), .tools = !(ctl & 0x20)};
    acc split, whole;
    run(&opts, tools, data, size, 0x9E3779B97F4A7C15ull ^ ctl, 1, &split);
    run(&opts, tools, data, size, 0, 0, &whole);
    if (split.r.n + split.c.n + split.markup != size) abort();   /* nothing lost or doubled */
    if (!subsequence(&split.r, data, size) || !subsequence(&split.c, data, size)) abort();
    if (split.markup == 0 && split.r.n == 0 && !same(&split.c, &(sb){(char *)data, size, size})) abort();
    if (!same(&split.r, &whole.r) || !same(&split.c, &whole.c) || !same(&split.calls, &whole.calls) ||
        split.markup != whole.markup)
        abort(); /* the split must not matter */
    acc_free(&split);
    acc_free(&whole);
    return 0;
}
