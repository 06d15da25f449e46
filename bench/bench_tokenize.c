/* Encode speed of m3_tok on one core: loads a tokenizer, reads a corpus file, encodes it
 * (load time excluded) and prints MB/s and tokens. Used by bench/bench_tokenize.mjs.
 * usage: bench_tokenize TOKENIZER.json|DIR CORPUS_FILE [REPEATS] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tokenizer/tokenizer.h"
#include "base/clock.h"

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: bench_tokenize TOKENIZER CORPUS [REPEATS]\n"); return 2; }
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    m3_err err;
    m3_tok *t = m3_tok_load(argv[1], &err);
    if (!t) { fprintf(stderr, "bench_tokenize: %s\n", err.msg); return 1; }
    FILE *f = fopen(argv[2], "rb");
    if (!f) { perror(argv[2]); return 1; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "bench_tokenize: cannot read %s\n", argv[2]); return 1; }
    fclose(f);
    double best = 1e30;
    size_t n_ids = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids;
        double t0 = m3_now();
        if (m3_tok_encode(t, text, (size_t)n, 0, &ids, &n_ids, &err)) { fprintf(stderr, "bench_tokenize: %s\n", err.msg); return 1; }
        double dt = m3_now() - t0;
        if (dt < best) best = dt;
        free(ids);
    }
    printf("{\"bytes\": %ld, \"tokens\": %zu, \"seconds\": %.4f, \"mb_per_s\": %.2f}\n", n, n_ids, best, n / best / 1e6);
    free(text);
    m3_tok_free(t);
    return 0;
}
