/* Compares two `m3 logits` outputs (for example CPU and CUDA on the same checkpoint):
 * logits rows (relative L2), greedy tokens (equal), greedy logits, index blocks (equal as
 * sets). usage: logits_diff A.safetensors B.safetensors [--tol 1e-3]; exit 1 on mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { double d = (double)a[i] - ref[i]; num += d * d; den += (double)ref[i] * ref[i]; }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static int cmp_i32(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: logits_diff A B [--tol X]\n"); return 2; }
    double tol = argc >= 5 && !strcmp(argv[3], "--tol") ? atof(argv[4]) : 1e-3;
    m3_err err;
    m3_st *a = m3_st_open(argv[1], &err), *b = a ? m3_st_open(argv[2], &err) : NULL;
    if (!a || !b) { fprintf(stderr, "%s\n", err.msg); return 2; }
    int fail = 0;
    const char *mats[2] = {"logits", "greedy_logits"};
    for (int m = 0; m < 2; m++) {
        const m3_tensor *x = m3_st_find(a, mats[m]), *y = m3_st_find(b, mats[m]);
        if (!x && !y) continue;
        if (!x || !y || x->numel != y->numel || x->ndim != 2) { printf("%s: missing or shaped differently\n", mats[m]); fail = 1; continue; }
        size_t rows = (size_t)x->shape[0], V = (size_t)x->shape[1];
        double worst = 0;
        size_t wr = 0;
        for (size_t r = 0; r < rows; r++) {
            double e = rel_l2((const float *)y->data + r * V, (const float *)x->data + r * V, V);
            if (!(e <= worst)) { worst = e; wr = r; }
        }
        printf("%s: %zu rows, max rel L2 %.3g (row %zu)%s\n", mats[m], rows, worst, wr, worst <= tol ? "" : "  FAIL");
        if (!(worst <= tol)) fail = 1;
    }
    const m3_tensor *ga = m3_st_find(a, "greedy_tokens"), *gb = m3_st_find(b, "greedy_tokens");
    if (ga && gb) {
        int eq = ga->numel == gb->numel && !memcmp(ga->data, gb->data, ga->nbytes);
        printf("greedy tokens: %s\n", eq ? "equal" : "DIFFER");
        if (!eq) fail = 1;
    }
    int layers = 0, mism = 0;
    for (int l = 0; l < 1024; l++) {
        char nm[64];
        snprintf(nm, sizeof nm, "index_blocks.layer%d", l);
        const m3_tensor *x = m3_st_find(a, nm), *y = m3_st_find(b, nm);
        if (!x) continue;
        layers++;
        if (!y || x->numel != y->numel) { mism++; continue; }
        int K = (int)x->shape[2];
        int32_t *p = malloc(sizeof(int32_t) * K * 2), *q = p + K;
        for (int64_t r = 0; r < x->shape[0] * x->shape[1]; r++) {
            memcpy(p, (const int32_t *)x->data + r * K, sizeof(int32_t) * K);
            memcpy(q, (const int32_t *)y->data + r * K, sizeof(int32_t) * K);
            qsort(p, K, sizeof *p, cmp_i32);
            qsort(q, K, sizeof *q, cmp_i32);
            if (memcmp(p, q, sizeof(int32_t) * K)) mism++;
        }
        free(p);
    }
    if (layers) printf("index blocks: %d layers, %d rows differ\n", layers, mism);
    if (mism) fail = 1;
    printf("%s\n", fail ? "FAIL" : "ok");
    m3_st_close(a);
    m3_st_close(b);
    return fail;
}
