/* m3 tokenize / m3 detokenize: text <-> token ids through a tokenizer.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tokenizer/tokenizer.h"

static char *read_stdin(size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *p = malloc(cap + 1);
    for (size_t k; p && (k = fread(p + len, 1, cap - len, stdin)) > 0;) {
        len += k;
        if (len == cap) {
            char *q = realloc(p, (cap *= 2) + 1);
            if (!q) { free(p); return NULL; }
            p = q;
        }
    }
    if (p) p[len] = 0;
    *n = len;
    return p;
}

/* -t PATH plus one optional flag; returns 0 or prints usage */
static int parse_args(const char *cmd, int argc, char **argv, const char *flag, const char **path, int *on) {
    *path = NULL;
    *on = 0;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-t") || !strcmp(argv[i], "--tokenizer")) && i + 1 < argc) *path = argv[++i];
        else if (!strcmp(argv[i], flag)) *on = 1;
        else {
            fprintf(stderr, "m3 %s: unknown argument \"%s\" (usage: m3 %s -t TOKENIZER.json|CHECKPOINT_DIR [%s])\n",
                    cmd, argv[i], cmd, flag);
            return -1;
        }
    }
    if (!*path) {
        fprintf(stderr, "m3 %s: missing -t TOKENIZER.json|CHECKPOINT_DIR\n", cmd);
        return -1;
    }
    return 0;
}

int m3_cmd_tokenize(int argc, char **argv) {
    const char *path;
    int special;
    if (parse_args("tokenize", argc, argv, "--special", &path, &special)) return 2;
    m3_err err;
    m3_tok *t = m3_tok_load(path, &err);
    if (!t) { fprintf(stderr, "m3 tokenize: %s\n", err.msg); return 1; }
    size_t n, n_ids;
    char *text = read_stdin(&n);
    int32_t *ids = NULL;
    int rc = !text ? (m3_errf(&err, "cannot read stdin"), -1) : m3_tok_encode(t, text, n, special, &ids, &n_ids, &err);
    if (rc == 0) {
        for (size_t i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    } else fprintf(stderr, "m3 tokenize: %s\n", err.msg);
    free(ids);
    free(text);
    m3_tok_free(t);
    return rc ? 1 : (fflush(stdout) != 0);
}

/* ids separated by whitespace and/or commas */
static int parse_id_list(const char *s, int32_t **ids, size_t *n, m3_err *err) {
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    for (const char *p = s; *p;) {
        if (strchr(" \t\r\n,", *p)) { p++; continue; }
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || !strchr(" \t\r\n,", *end) || v < 0 || v > INT32_MAX)
            return m3_errf(err, "bad token id \"%.20s\" at byte %zu of stdin (expected integers separated by "
                           "spaces or commas)", p, (size_t)(p - s));
        if (*n == cap) {
            int32_t *q = realloc(*ids, (cap = cap ? cap * 2 : 256) * sizeof *q);
            if (!q) return m3_errf(err, "out of memory");
            *ids = q;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    return 0;
}

int m3_cmd_detokenize(int argc, char **argv) {
    const char *path;
    int skip;
    if (parse_args("detokenize", argc, argv, "--skip-special", &path, &skip)) return 2;
    m3_err err;
    m3_tok *t = m3_tok_load(path, &err);
    if (!t) { fprintf(stderr, "m3 detokenize: %s\n", err.msg); return 1; }
    size_t n, n_ids = 0, len = 0;
    char *in = read_stdin(&n), *text = NULL;
    int32_t *ids = NULL;
    int rc = !in ? m3_errf(&err, "cannot read stdin") : parse_id_list(in, &ids, &n_ids, &err);
    if (rc == 0 && !(text = m3_tok_decode(t, ids, n_ids, skip, &len, &err))) rc = -1;
    if (rc == 0) fwrite(text, 1, len, stdout);
    else fprintf(stderr, "m3 detokenize: %s\n", err.msg);
    free(text);
    free(ids);
    free(in);
    m3_tok_free(t);
    return rc ? 1 : (fflush(stdout) != 0);
}
