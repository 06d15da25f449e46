/* Output parsers (src/chat/parsers.h): every example is fed unsplit, split at every byte
 * boundary, byte by byte, and in 3 random pieces under many seeds; the accumulated
 * reasoning, content and tool calls must equal the expected values every time, what was
 * emitted so far must always be a prefix of the final result (so no partial tag is ever
 * emitted), every text delta must be complete UTF-8, and reasoning + content + markup
 * bytes must add up to the input. argv[1] (repo root) is not needed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "chat/parsers.h"

static int fails = 0;
#define CHECK(cond, ...) do { if (!(cond)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

#define NS "]<]minimax[>["
#define TC NS "<tool_call>"
#define TCE NS "</tool_call>"
#define INV(n) NS "<invoke name=\"" n "\">"
#define INVE NS "</invoke>"
#define ARG(k, v) NS "<" k ">" v NS "</" k ">"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"temp\":{\"type\":\"number\"},\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"limit\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}]},"
    "\"code\":{\"type\":[\"string\",\"integer\"]},\"zip\":{\"type\":\"string\"},"
    "\"unit\":{\"enum\":[\"c\",\"f\"]},\"free\":{\"description\":\"no type\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"query\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"}}}}},"
    "{\"name\":\"bare\",\"parameters\":{\"properties\":{\"flag\":{\"type\":\"boolean\"}}}}]";

typedef struct {
    const char *name, *args;
} exp_call;

typedef struct {
    const char *label;
    int reasoning, tools; /* parsers on */
    m3_reason_mode mode;
    const char *input;
    const char *reasoning_exp, *content_exp;
    int ncalls;
    exp_call calls[4];
} example;

#define ON 1, 1
static const example EX[] = {
    {"enabled", ON, M3_THINK_ENABLED, "<mm:think>Let me think.</mm:think>\n\nThe answer is 4.",
     "Let me think.", "\n\nThe answer is 4.", 0, {{0}}},
    {"enabled, opened by the prompt", ON, M3_THINK_ENABLED, "I think.</mm:think>Done", "I think.", "Done", 0, {{0}}},
    {"enabled, unterminated", ON, M3_THINK_ENABLED, "thinking < forever </mm:thi", "thinking < forever </mm:thi", "", 0, {{0}}},
    {"enabled, leading close", ON, M3_THINK_ENABLED, "</mm:think>content", "", "content", 0, {{0}}},
    {"enabled, short", ON, M3_THINK_ENABLED, "<", "<", "", 0, {{0}}},
    {"enabled, think tags later are content", ON, M3_THINK_ENABLED, "<mm:think>a</mm:think>b<mm:think>c</mm:think>",
     "a", "b<mm:think>c</mm:think>", 0, {{0}}},
    {"disabled", ON, M3_THINK_DISABLED, "Hello <mm:think>x</mm:think>", "", "Hello <mm:think>x</mm:think>", 0, {{0}}},
    {"disabled, leading open stays", ON, M3_THINK_DISABLED, "<mm:think>x</mm:think>y", "", "<mm:think>x</mm:think>y", 0, {{0}}},
    {"disabled, leading close", ON, M3_THINK_DISABLED, "</mm:think>Hi", "", "Hi", 0, {{0}}},
    {"disabled, short", ON, M3_THINK_DISABLED, "</mm:", "", "</mm:", 0, {{0}}},
    {"adaptive, thinks", ON, M3_THINK_ADAPTIVE, "<mm:think>hmm</mm:think>ok", "hmm", "ok", 0, {{0}}},
    {"adaptive, does not think", ON, M3_THINK_ADAPTIVE, "plain </mm:think> <mm:think>", "", "plain </mm:think> <mm:think>", 0, {{0}}},
    {"adaptive, leading close", ON, M3_THINK_ADAPTIVE, "</mm:think>\nx", "", "\nx", 0, {{0}}},
    {"adaptive, near miss", ON, M3_THINK_ADAPTIVE, "<mm:thinks>", "", "<mm:thinks>", 0, {{0}}},
    {"reasoning parser off", 0, 1, M3_THINK_ENABLED, "<mm:think>a</mm:think>b", "", "<mm:think>a</mm:think>b", 0, {{0}}},
    {"content only, near misses", ON, M3_THINK_DISABLED, "a <mm:thin b ]<]minimax[>[<tool_ca c ]<]mini", "",
     "a <mm:thin b ]<]minimax[>[<tool_ca c ]<]mini", 0, {{0}}},
    {"stray namespace tags", ON, M3_THINK_DISABLED, "x " TCE " " INVE " y", "", "x " TCE " " INVE " y", 0, {{0}}},
    {"one call, every type", ON, M3_THINK_DISABLED,
     "Sure.\n" TC "\n" INV("get_weather") "\n" ARG("city", "Paris, \"FR\"") "\n" ARG("days", "\n3\n") "\n"
     ARG("temp", "21.5") ARG("metric", "true") ARG("opts", "{\"a\": [1, 2]}") ARG("tags", " [\"x\", \"y\"] ")
     "\n" INVE "\n" TCE,
     "", "Sure.\n", 1,
     {{"get_weather", "{\"city\": \"Paris, \\\"FR\\\"\", \"days\": 3, \"temp\": 21.5, \"metric\": true, "
                      "\"opts\": {\"a\": [1, 2]}, \"tags\": [\"x\", \"y\"]}"}}},
    {"several calls and blocks", ON, M3_THINK_DISABLED,
     TC INV("search") ARG("query", "cats") ARG("n", "5") INVE INV("get_weather") ARG("city", "Oslo")
     ARG("limit", "null") INVE TCE "\nthen " TC "\n" INV("unknown_tool") ARG("x", "{\"k\": 1}") ARG("y", "hello")
     ARG("z", "42") ARG("w", "true") ARG("v", "[1,") INVE "\n" TCE " end",
     "", "\nthen  end", 3,
     {{"search", "{\"query\": \"cats\", \"n\": 5}"},
      {"get_weather", "{\"city\": \"Oslo\", \"limit\": null}"},
      {"unknown_tool", "{\"x\": {\"k\": 1}, \"y\": \"hello\", \"z\": 42, \"w\": true, \"v\": \"[1,\"}"}}},
    {"typing edges", ON, M3_THINK_DISABLED,
     TC INV("get_weather") ARG("code", "007") ARG("zip", "02134") ARG("temp", "1e3") ARG("days", "abc")
     ARG("metric", "False") ARG("tags", "not json") ARG("limit", " 7 ") ARG("unit", "c") ARG("free", "3.50")
     ARG("opts", "[1]") INVE INV("get_weather") ARG("temp", ".5") ARG("code", "abc") ARG("city", "null")
     ARG("days", "-12") ARG("free", "text") INVE INV("bare") ARG("flag", "TRUE") INVE TCE,
     "", "", 3,
     {{"get_weather", "{\"code\": 7, \"zip\": \"02134\", \"temp\": 1e3, \"days\": \"abc\", \"metric\": false, "
                      "\"tags\": \"not json\", \"limit\": 7, \"unit\": \"c\", \"free\": 3.50, \"opts\": [1]}"},
      {"get_weather", "{\"temp\": 0.5, \"code\": \"abc\", \"city\": \"null\", \"days\": -12, \"free\": \"text\"}"},
      {"bare", "{\"flag\": true}"}}},
    {"string values keep their text", ON, M3_THINK_DISABLED,
     TC INV("search") ARG("query", "\nline1\n\tline2\n\n") ARG("n", "1") ARG("query", "a</query> b <x>") INVE TCE, "", "", 1,
     {{"search", "{\"query\": \"line1\\n\\tline2\\n\", \"n\": 1, \"query\": \"a</query> b <x>\"}"}}},
    {"duplicates of a typed argument", ON, M3_THINK_DISABLED, TC INV("search") ARG("n", "1") ARG("n", " 2 ") INVE TCE, "", "", 1,
     {{"search", "{\"n\": 1, \"n\": 2}"}}},
    {"newlines around a value", ON, M3_THINK_DISABLED,
     TC INV("search") ARG("query", "\nline1\n\tline2\n\n") INVE TCE, "", "", 1,
     {{"search", "{\"query\": \"line1\\n\\tline2\\n\"}"}}},
    {"no arguments", ON, M3_THINK_DISABLED, TC INV("search") INVE TCE, "", "", 1, {{"search", "{}"}}},
    {"reasoning then tool call", ON, M3_THINK_ENABLED,
     "<mm:think>need weather</mm:think>\n" TC INV("get_weather") ARG("city", "Rome") INVE TCE, "need weather", "\n", 1,
     {{"get_weather", "{\"city\": \"Rome\"}"}}},
    {"tool call inside reasoning is reasoning", ON, M3_THINK_ENABLED,
     "a " TC INV("search") INVE TCE "</mm:think>b", "a " TC INV("search") INVE TCE, "b", 0, {{0}}},
    {"bad nesting", ON, M3_THINK_DISABLED, TC INV("search") NS "<query>x " NS "</n>" INVE TCE "after", "",
     NS "</n>" INVE TCE "after", 1, {{"search", "{\"query\": \"x \"}"}}},
    {"unterminated value", ON, M3_THINK_DISABLED, "a" TC INV("search") NS "<query>x", "", "a", 1, {{"search", "{\"query\": \"x\"}"}}},
    {"unterminated typed value", ON, M3_THINK_DISABLED, TC INV("search") ARG("query", "q") NS "<n>\n12", "", "", 1,
     {{"search", "{\"query\": \"q\", \"n\": 12}"}}},
    {"value cut by a partial close tag", ON, M3_THINK_DISABLED, TC INV("search") NS "<query>x\n" NS "</que", "", NS "</que", 1,
     {{"search", "{\"query\": \"x\"}"}}},
    {"value ending in a partial namespace", ON, M3_THINK_DISABLED, TC INV("search") NS "<query>x]<]mini", "", "", 1,
     {{"search", "{\"query\": \"x]<]mini\"}"}}},
    {"unterminated after the invoke tag", ON, M3_THINK_DISABLED, "x" TC "\n" INV("get_weather") "\n", "", "x", 1,
     {{"get_weather", "{}"}}},
    {"text between arguments", ON, M3_THINK_DISABLED, TC INV("search") ARG("query", "a") " oops " ARG("n", "1") INVE TCE, "",
     "oops " ARG("n", "1") INVE TCE, 1, {{"search", "{\"query\": \"a\"}"}}},
    {"partial tag at the end of a call", ON, M3_THINK_DISABLED, TC INV("search") ARG("query", "a") "\n" NS "<n", "", NS "<n", 1,
     {{"search", "{\"query\": \"a\"}"}}},
    {"newlines only", ON, M3_THINK_DISABLED, TC INV("search") ARG("query", "\n") INVE INV("search") ARG("query", "\n\n\n") INVE TCE,
     "", "", 2, {{"search", "{\"query\": \"\"}"}, {"search", "{\"query\": \"\\n\"}"}}},
    {"invalid UTF-8 in a streamed value", ON, M3_THINK_DISABLED, TC INV("search") ARG("query", "a\xE4\xB8" "b\xff\xF0\x9F") INVE TCE,
     "", "", 1, {{"search", "{\"query\": \"a\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"}"}}},
    {"unterminated close", ON, M3_THINK_DISABLED, "a" TC INV("search") INVE NS "</tool_ca", "", "a" NS "</tool_ca", 1,
     {{"search", "{}"}}},
    {"garbage inside a block", ON, M3_THINK_DISABLED, TC "garbage" TCE, "", TC "garbage" TCE, 0, {{0}}},
    {"garbage between invokes", ON, M3_THINK_DISABLED, TC INV("search") INVE " oops" INV("search") INVE TCE, "",
     " oops" INV("search") INVE TCE, 1, {{"search", "{}"}}},
    {"bad invoke tags", ON, M3_THINK_DISABLED,
     TC NS "<invoke name=search>" TCE TC NS "<invoke name=\"\">" TCE TC NS "<invoke name=\"a\"b\">" TCE TC INV("s")
     NS "<bad name>" INVE TCE TC INV("s") NS "</x>",
     "", TC NS "<invoke name=search>" TCE TC NS "<invoke name=\"\">" TCE TC NS "<invoke name=\"a\"b\">" TCE
     NS "<bad name>" INVE TCE NS "</x>", 2, {{"s", "{}"}, {"s", "{}"}}},
    {"valid call then unterminated one", ON, M3_THINK_DISABLED,
     TC INV("search") ARG("query", "a") INVE "\n" INV("search") NS "<query>b", "", "", 2,
     {{"search", "{\"query\": \"a\"}"}, {"search", "{\"query\": \"b\"}"}}},
    {"recovery at a new opener", ON, M3_THINK_DISABLED,
     TC INV("search") NS "<query>a " TC INV("search") ARG("query", "b") INVE TCE, "", "", 2,
     {{"search", "{\"query\": \"a \"}"}, {"search", "{\"query\": \"b\"}"}}},
    {"doubled opener", ON, M3_THINK_DISABLED, TC TC INV("search") INVE TCE, "", TC, 1, {{"search", "{}"}}},
    {"UTF-8", ON, M3_THINK_ENABLED,
     "<mm:think>考虑一下 🤔</mm:think>答案是 ✓ " TC INV("get_weather") ARG("city", "Zürich 東京 🌧") ARG("tags", "[\"é\"]") INVE TCE "ß",
     "考虑一下 🤔", "答案是 ✓ ß", 1, {{"get_weather", "{\"city\": \"Zürich 東京 🌧\", \"tags\": [\"é\"]}"}}},
    {"tool parser off", 1, 0, M3_THINK_DISABLED, TC INV("search") INVE TCE, "", TC INV("search") INVE TCE, 0, {{0}}},
    {"control characters", ON, M3_THINK_DISABLED, TC INV("search") ARG("query", "a\x01\rb\"\\") INVE TCE, "", "", 1,
     {{"search", "{\"query\": \"a\\u0001\\rb\\\"\\\\\"}"}}},
    {"empty", ON, M3_THINK_ADAPTIVE, "", "", "", 0, {{0}}},
};
#define N_EX ((int)(sizeof EX / sizeof EX[0]))

/* ---- accumulation */

typedef struct {
    char *r, *c;
    size_t rn, cn, rcap, ccap;
    int ncalls;
    char *names[8], *args[8];
    int pieces[8]; /* TOOL_ARGS deltas of each call */
    size_t markup;
} result;

static void app(char **p, size_t *n, size_t *cap, const char *s, size_t len) {
    if (*n + len + 1 > *cap) {
        *cap = (*n + len + 1) * 2;
        *p = realloc(*p, *cap);
        if (!*p) abort();
    }
    memcpy(*p + *n, s, len);
    *n += len;
    (*p)[*n] = 0;
}

static void result_free(result *r) {
    free(r->r);
    free(r->c);
    for (int i = 0; i < r->ncalls && i < 8; i++) free(r->names[i]), free(r->args[i]);
    memset(r, 0, sizeof *r);
}

static int valid_utf8(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t l = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!l || i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

static json_t *g_tools;

/* takes deltas into r; checks per-delta properties; returns 0 when fine */
static int take(const example *e, result *r, const m3_out_delta *d, size_t n, const char *how) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const m3_out_delta *x = &d[i];
        if (x->kind == M3_OUT_REASONING || x->kind == M3_OUT_CONTENT) {
            if (!valid_utf8(x->text, x->len)) {
                CHECK(0, "%s [%s]: a text delta is not complete UTF-8", e->label, how);
                bad = 1;
            }
            if (x->len == 0 || x->text[x->len] != 0) {
                CHECK(0, "%s [%s]: empty or unterminated text delta", e->label, how);
                bad = 1;
            }
            if (x->kind == M3_OUT_REASONING) app(&r->r, &r->rn, &r->rcap, x->text, x->len);
            else app(&r->c, &r->cn, &r->ccap, x->text, x->len);
        } else if (x->kind == M3_OUT_TOOL_BEGIN) {
            char id[32];
            snprintf(id, sizeof id, "call_%d", r->ncalls);
            if (x->index != r->ncalls || strcmp(x->id, id) || r->ncalls >= 8) {
                CHECK(0, "%s [%s]: tool call %d has index %d id %s", e->label, how, r->ncalls, x->index, x->id);
                return 1;
            }
            r->names[r->ncalls] = strdup(x->name);
            r->args[r->ncalls] = strdup("");
            r->ncalls++;
        } else {
            if (x->index != r->ncalls - 1) {
                CHECK(0, "%s [%s]: arguments for call %d while at %d", e->label, how, x->index, r->ncalls - 1);
                return 1;
            }
            size_t an = strlen(r->args[x->index]), cap = an + 1;
            app(&r->args[x->index], &an, &cap, x->text, x->len);
            r->pieces[x->index]++;
        }
    }
    /* what was emitted so far is a prefix of the final result */
    const char *re = e->reasoning_exp, *ce = e->content_exp;
    if (r->rn > strlen(re) || memcmp(r->r ? r->r : "", re, r->rn)) {
        CHECK(0, "%s [%s]: reasoning so far is not a prefix of the expected one", e->label, how);
        bad = 1;
    }
    if (r->cn > strlen(ce) || memcmp(r->c ? r->c : "", ce, r->cn)) {
        CHECK(0, "%s [%s]: content so far \"%.*s\" is not a prefix of the expected one", e->label, how, (int)r->cn, r->c);
        bad = 1;
    }
    return bad;
}

/* feeds the input in pieces ending at cuts[0..ncuts) (increasing), then finishes */
static int run(const example *e, const size_t *cuts, int ncuts, result *r, const char *how) {
    memset(r, 0, sizeof *r);
    m3_out_opts opts = {.reasoning = e->reasoning, .thinking = e->mode, .tools = e->tools};
    m3_err err;
    m3_out *o = m3_out_new(&opts, g_tools, &err);
    if (!o) {
        CHECK(0, "m3_out_new: %s", err.msg);
        return 1;
    }
    const m3_out_delta *d;
    size_t n, len = strlen(e->input), prev = 0;
    int bad = 0;
    for (int i = 0; i <= ncuts && !bad; i++) {
        size_t end = i < ncuts ? cuts[i] : len;
        if (m3_out_feed(o, e->input + prev, end - prev, &d, &n, &err)) {
            CHECK(0, "feed: %s", err.msg);
            bad = 1;
            break;
        }
        bad |= take(e, r, d, n, how);
        prev = end;
    }
    if (!bad) {
        if (m3_out_finish(o, &d, &n, &err)) {
            CHECK(0, "finish: %s", err.msg);
            bad = 1;
        } else {
            bad |= take(e, r, d, n, how);
        }
    }
    r->markup = m3_out_markup_bytes(o);
    if (!bad && r->rn + r->cn + r->markup != len) {
        CHECK(0, "%s [%s]: reasoning %zu + content %zu + markup %zu != input %zu", e->label, how, r->rn, r->cn, r->markup, len);
        bad = 1;
    }
    if (!bad && m3_out_tool_calls(o) != r->ncalls) {
        CHECK(0, "%s [%s]: m3_out_tool_calls", e->label, how);
        bad = 1;
    }
    m3_out_free(o);
    return bad;
}

static int check_expected(const example *e, const result *r, const char *how) {
    int bad = 0;
    if (strcmp(r->r ? r->r : "", e->reasoning_exp)) {
        CHECK(0, "%s [%s]: reasoning \"%s\", expected \"%s\"", e->label, how, r->r ? r->r : "", e->reasoning_exp);
        bad = 1;
    }
    if (strcmp(r->c ? r->c : "", e->content_exp)) {
        CHECK(0, "%s [%s]: content \"%s\", expected \"%s\"", e->label, how, r->c ? r->c : "", e->content_exp);
        bad = 1;
    }
    if (r->ncalls != e->ncalls) {
        CHECK(0, "%s [%s]: %d tool calls, expected %d", e->label, how, r->ncalls, e->ncalls);
        return 1;
    }
    for (int i = 0; i < r->ncalls; i++) {
        if (strcmp(r->names[i], e->calls[i].name)) {
            CHECK(0, "%s [%s]: call %d name %s, expected %s", e->label, how, i, r->names[i], e->calls[i].name);
            bad = 1;
        }
        if (strcmp(r->args[i], e->calls[i].args)) {
            CHECK(0, "%s [%s]: call %d arguments\n   got %s\n  want %s", e->label, how, i, r->args[i], e->calls[i].args);
            bad = 1;
        }
        json_error_t jerr;
        json_t *a = json_loads(r->args[i], 0, &jerr);
        if (!json_is_object(a)) {
            CHECK(0, "%s [%s]: call %d arguments are not a JSON object: %s", e->label, how, i, r->args[i]);
            bad = 1;
        }
        json_decref(a);
    }
    return bad;
}

static uint64_t rng_state;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static long n_runs = 0;

static void test_example(const example *e) {
    size_t len = strlen(e->input);
    result r;
    char how[64];
    if (run(e, NULL, 0, &r, "unsplit") || check_expected(e, &r, "unsplit")) {
        result_free(&r);
        return;
    }
    result_free(&r);
    n_runs++;
    for (size_t k = 0; k <= len; k++) { /* one cut at every byte boundary */
        snprintf(how, sizeof how, "cut at %zu", k);
        int bad = run(e, &k, 1, &r, how) || check_expected(e, &r, how);
        result_free(&r);
        n_runs++;
        if (bad) return;
    }
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    for (size_t k = 0; k < len; k++) cuts[k] = k + 1;
    int bad = run(e, cuts, len ? (int)len - 1 : 0, &r, "byte by byte") || check_expected(e, &r, "byte by byte");
    /* streamed: fed byte by byte, a call with arguments arrives in several pieces */
    for (int i = 0; !bad && i < r.ncalls; i++)
        if (strcmp(r.args[i], "{}") && r.pieces[i] < 2) {
            CHECK(0, "%s [byte by byte]: call %d arguments in %d piece(s)", e->label, i, r.pieces[i]);
            bad = 1;
        }
    result_free(&r);
    n_runs++;
    for (int seed = 1; seed <= 300 && !bad; seed++) { /* 3 random pieces */
        rng_state = 0x9E3779B97F4A7C15ull * (uint64_t)seed + len;
        size_t c[2] = {len ? rnd() % (len + 1) : 0, len ? rnd() % (len + 1) : 0};
        qsort(c, 2, sizeof c[0], cmp_size);
        snprintf(how, sizeof how, "pieces at %zu,%zu", c[0], c[1]);
        bad = run(e, c, 2, &r, how) || check_expected(e, &r, how);
        result_free(&r);
        n_runs++;
    }
    for (int seed = 1; seed <= 50 && !bad && len; seed++) { /* many random pieces */
        rng_state = 0xD1B54A32D192ED03ull * (uint64_t)seed + len;
        int nc = (int)(rnd() % (len < 20 ? len : 20));
        for (int i = 0; i < nc; i++) cuts[i] = rnd() % (len + 1);
        qsort(cuts, nc, sizeof cuts[0], cmp_size);
        snprintf(how, sizeof how, "%d random cuts, seed %d", nc, seed);
        bad = run(e, cuts, nc, &r, how) || check_expected(e, &r, how);
        result_free(&r);
        n_runs++;
    }
    free(cuts);
}

/* ---- the API around the parsers */

/* the deltas of one feed (piece NULL: finish) as text: "B<index>:<name>" for a call's begin,
 * "A<index>:<text>" for arguments, "C:<text>" for content, joined by '|' */
static void feed_str(m3_out *o, const char *piece, char *out, size_t cap) {
    const m3_out_delta *d;
    size_t n;
    m3_err err;
    int rc = piece ? m3_out_feed(o, piece, strlen(piece), &d, &n, &err) : m3_out_finish(o, &d, &n, &err);
    out[0] = 0;
    if (rc) {
        snprintf(out, cap, "error %s", err.msg);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(out);
        if (d[i].kind == M3_OUT_TOOL_BEGIN) snprintf(out + l, cap - l, "%sB%d:%s", i ? "|" : "", d[i].index, d[i].name);
        else if (d[i].kind == M3_OUT_TOOL_ARGS) snprintf(out + l, cap - l, "%sA%d:%.*s", i ? "|" : "", d[i].index, (int)d[i].len, d[i].text);
        else snprintf(out + l, cap - l, "%sC:%.*s", i ? "|" : "", (int)d[i].len, d[i].text);
    }
}

/* what each piece of a tool call brings out, as vLLM streams calls: the name at once, then the
 * arguments as they become known */
static void test_streaming_steps(void) {
    static const char *const steps[][2] = {
        {"Hi " TC "\n" NS "<invoke name=\"get_weather\"", "C:Hi "},
        {">", "B0:get_weather"},
        {"\n" NS "<ci", ""},
        {"ty>", "A0:{\"city\": \""},
        {"\nPa", "A0:Pa"},
        {"ris \"X\"\n", "A0:ris \\\"X\\\""},  /* the newline held: it may be the value's last */
        {"\n\xE6\x9D", "A0:\\n\\n"},               /* half a character held */
        {"\xB1" NS, "A0:\xE6\x9D\xB1"},
        {"</city>\n", "A0:\""},
        {NS "<days>", "A0:, \"days\": "},
        {"1", ""},                                   /* an integer is written whole */
        {"4" NS "</days>", "A0:14"},
        {NS "</invoke>", "A0:}"},
        {"\n" NS "<invoke name=\"search\">", "B1:search"},
        {NS "<query>abc", "A1:{\"query\": \"abc"},
        {NS "</tool_call>", "A1:\"}|C:" NS "</tool_call>"}, /* bad nesting: the call closes, the rest is content */
        {NULL, ""},
    };
    m3_err err;
    m3_out_opts opts = {.reasoning = 0, .tools = 1};
    m3_out *o = m3_out_new(&opts, g_tools, &err);
    char got[512];
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        feed_str(o, steps[i][0], got, sizeof got);
        CHECK(!strcmp(got, steps[i][1]), "streaming step %zu (%s)\n   got %s\n  want %s", i, steps[i][0] ? steps[i][0] : "finish",
              got, steps[i][1]);
    }
    CHECK(m3_out_tool_calls(o) == 2 && m3_out_tool_calls_done(o) == 2, "two calls done");
    m3_out_free(o);

    /* a call begun is counted at once, done at its `</invoke>` (parallel_tool_calls false
     * stops there) */
    o = m3_out_new(&opts, g_tools, &err);
    feed_str(o, TC INV("search") NS "<n>3", got, sizeof got);
    CHECK(m3_out_tool_calls(o) == 1 && m3_out_tool_calls_done(o) == 0, "a call begun, not done");
    feed_str(o, NS "</n>" INVE, got, sizeof got);
    CHECK(!strcmp(got, "A0:3|A0:}") || !strcmp(got, "A0:3}"), "the rest of the call: %s", got);
    CHECK(m3_out_tool_calls_done(o) == 1, "the call done");
    m3_out_free(o);

    /* duplicates stay in the text; JSON parsers keep the last one, as the arguments said */
    o = m3_out_new(&opts, g_tools, &err);
    feed_str(o, TC INV("search") ARG("query", "a") ARG("n", "1") ARG("query", "b") INVE TCE, got, sizeof got);
    const char *args = strstr(got, "A0:");
    json_t *j = args ? json_loads(args + 3, 0, NULL) : NULL;
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "query")), "b") && json_integer_value(json_object_get(j, "n")) == 1,
          "duplicate argument: the last wins when parsed (%s)", got);
    json_decref(j);
    m3_out_free(o);
}

static void test_api(void) {
    m3_err err;
    json_error_t jerr;
    json_t *obj = json_loads("{\"a\": 1}", 0, &jerr);
    CHECK(m3_out_new(NULL, obj, &err) == NULL && strstr(err.msg, "tools"), "tools as an object is an error");
    json_decref(obj);

    m3_out *o = m3_out_new(NULL, NULL, &err);
    CHECK(o != NULL, "default options");
    const m3_out_delta *d;
    size_t n;
    const char *in = "<mm:think>r\xC3</mm:think>c\xff" TC INV("f") ARG("a", "[1, 2]") INVE TCE;
    CHECK(m3_out_feed(o, in, strlen(in), &d, &n, &err) == 0, "feed");
    json_t *j = m3_out_delta_json(d, n);
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    const char *want = "{\"content\":\"c\xEF\xBF\xBD\",\"reasoning\":\"r\xEF\xBF\xBD\",\"reasoning_content\":\"r\xEF\xBF\xBD\",\"tool_calls\":[{\"function\":"
                       "{\"arguments\":\"{\\\"a\\\": [1, 2]}\",\"name\":\"f\"},\"id\":\"call_0\",\"index\":0,\"type\":\"function\"}]}";
    CHECK(s && !strcmp(s, want), "delta json\n   got %s\n  want %s", s, want);
    free(s);
    json_decref(j);
    /* arguments arriving in a later list than their BEGIN */
    m3_out_delta args = {.kind = M3_OUT_TOOL_ARGS, .index = 3, .text = "{}", .len = 2};
    j = m3_out_delta_json(&args, 1);
    s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    CHECK(s && !strcmp(s, "{\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"},\"index\":3}]}"), "args-only json: %s", s);
    free(s);
    json_decref(j);
    j = m3_out_delta_json(NULL, 0);
    CHECK(j && json_object_size(j) == 0, "empty delta list renders {}");
    json_decref(j);
    CHECK(m3_out_finish(o, &d, &n, &err) == 0 && n == 0, "finish with nothing left");
    CHECK(m3_out_feed(o, "x", 1, &d, &n, &err) == -1 && strstr(err.msg, "finish"), "feed after finish is an error");
    m3_out_free(o);

    /* id prefix */
    m3_out_opts opts = {.reasoning = 0, .tools = 1, .id_prefix = "call_req7_"};
    o = m3_out_new(&opts, NULL, &err);
    in = TC INV("f") INVE INV("g") INVE TCE;
    CHECK(m3_out_feed(o, in, strlen(in), &d, &n, &err) == 0 && n == 4, "two calls, %zu deltas", n);
    if (n == 4) CHECK(!strcmp(d[0].id, "call_req7_0") && !strcmp(d[2].id, "call_req7_1") && !strcmp(d[2].name, "g"), "ids");
    m3_out_free(o);

    /* invalid UTF-8 stays as it is in content (rendering replaces it) and is not held forever */
    o = m3_out_new(&opts, NULL, &err);
    m3_out_feed(o, "a\xE4\xB8", 3, &d, &n, &err);
    CHECK(n == 1 && d[0].len == 1, "incomplete UTF-8 tail held back");
    m3_out_feed(o, "x", 1, &d, &n, &err);
    CHECK(n == 1 && d[0].len == 3 && !memcmp(d[0].text, "\xE4\xB8x", 3), "broken sequence flushed when it cannot complete");
    m3_out_feed(o, "\xF0\x9F", 2, &d, &n, &err);
    CHECK(n == 0, "incomplete tail held");
    m3_out_finish(o, &d, &n, &err);
    CHECK(n == 1 && d[0].len == 2, "held tail flushed at finish");
    m3_out_free(o);

    /* a long argument value streamed in small pieces: linear work, exact result */
    o = m3_out_new(&opts, g_tools, &err); /* reasoning parser off */
    const char *head = TC INV("search") NS "<query>", *tail = NS "</query>" INVE TCE;
    size_t vlen = 1 << 20, got_args = 0, pieces = 0;
    char *big = malloc(strlen(head) + vlen + strlen(tail) + 1);
    strcpy(big, head);
    for (size_t i = 0; i < vlen; i++) big[strlen(head) + i] = (char)('a' + i % 26);
    strcpy(big + strlen(head) + vlen, tail);
    size_t total = strlen(big);
    for (size_t p = 0; p < total; p += 3, pieces++) {
        size_t len = total - p < 3 ? total - p : 3;
        m3_out_feed(o, big + p, len, &d, &n, &err);
        for (size_t i = 0; i < n; i++)
            if (d[i].kind == M3_OUT_TOOL_ARGS) got_args += d[i].len;
            else if (d[i].kind != M3_OUT_TOOL_BEGIN) CHECK(0, "long value: unexpected delta kind %d", d[i].kind);
    }
    m3_out_finish(o, &d, &n, &err);
    CHECK(got_args == vlen + strlen("{\"query\": \"\"}"), "long value: %zu argument bytes in %zu pieces", got_args, pieces);
    CHECK(m3_out_markup_bytes(o) == total, "long value: all markup");
    free(big);
    m3_out_free(o);
}

/* the parser of a chat request with tools (the server's start: 500 when err.oom, else 400): with
 * each of its counted allocations failing in turn (base/fault.h: the tools' copies are jansson's),
 * it is made, or the error is out of memory with oom set; bad tools leave oom 0 */
static void test_new_faults(void) {
    m3_err err = {0};
    m3_fault_json_hook(1);
    m3_fault_arm(M3_FAULT_SERVER, 1, 0, 1);
    m3_out *o = m3_out_new(NULL, g_tools, &err);
    long total = m3_fault_seen(M3_FAULT_SERVER);
    m3_fault_disarm(M3_FAULT_SERVER);
    CHECK(o && total > 0, "m3_out_new without failures: %s (%ld allocations)", o ? "made" : err.msg, total);
    m3_out_free(o);
    long oom = 0;
    for (long k = 1; k <= total; k++) {
        m3_err e2 = {0};
        m3_fault_arm(M3_FAULT_SERVER, k, 1, 1);
        o = m3_out_new(NULL, g_tools, &e2);
        m3_fault_disarm(M3_FAULT_SERVER);
        CHECK(o || (e2.oom && strstr(e2.msg, "out of memory")), "m3_out_new, allocation %ld of %ld failing: oom %d: %s", k, total,
              e2.oom, e2.msg);
        oom += !o;
        m3_out_free(o);
    }
    m3_fault_json_hook(0);
    json_t *obj = json_pack("{s:s}", "name", "out of memory");
    snprintf(err.msg, sizeof err.msg, "an earlier failure: out of memory");
    err.oom = 1;
    o = m3_out_new(NULL, obj, &err);
    CHECK(!o && !err.oom, "tools as an object: refused, oom 0 (an earlier error's cleared): %s", err.msg);
    json_decref(obj);
    printf("m3_out_new with each of %ld allocations failing: %ld out of memory\n", total, oom);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    json_error_t jerr;
    g_tools = json_loads(TOOLS, 0, &jerr);
    if (!g_tools) {
        printf("FAIL: tools JSON: %s\n", jerr.text);
        return 1;
    }
    for (int i = 0; i < N_EX; i++) test_example(&EX[i]);
    test_api();
    test_streaming_steps();
    test_new_faults();
    json_decref(g_tools);
    printf("parsers: %d examples, %ld split runs, %d failures\n", N_EX, n_runs, fails);
    return fails != 0;
}
