/* Compares two `m3 logits` outputs (for example CPU and CUDA on the same checkpoint):
 * logits rows (relative L2), greedy tokens (equal), greedy logits, index blocks (equal as
 * sets). usage: logits_diff A.safetensors B.safetensors [--tol 1e-3] [--allow FRAC]; exit 1 on
 * mismatch. --allow: with quantized caches a block score that ties in exact arithmetic can
 * rank differently under another f32 summation order, flipping one block choice and the
 * logits of the rows that follow; up to FRAC of the index rows and of the prompt logit rows
 * may then differ (greedy tokens and decode logits must still agree). */
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
    double tol = 1e-3, allow = 0;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tol")) tol = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--allow")) allow = atof(argv[i + 1]);
    }
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
        size_t wr = 0, over = 0;
        double *es = malloc(sizeof(double) * rows);
        for (size_t r = 0; r < rows; r++) {
            double e = rel_l2((const float *)y->data + r * V, (const float *)x->data + r * V, V);
            if (es) es[r] = e;
            if (!(e <= worst)) { worst = e; wr = r; }
            if (!(e <= tol)) over++;
        }
        double med = 0;
        if (es) {
            for (size_t i = 1; i < rows; i++)
                for (size_t j = i; j > 0 && es[j] < es[j - 1]; j--) { double t = es[j]; es[j] = es[j - 1]; es[j - 1] = t; }
            med = es[rows / 2];
            free(es);
        }
        int bad = m == 1 ? over > 0 : (double)over > allow * rows;
        printf("%s: %zu rows, max rel L2 %.3g (row %zu), median %.3g, %zu rows over %.0e%s\n", mats[m], rows, worst, wr, med,
               over, tol, bad ? "  FAIL" : "");
        if (bad) fail = 1;
    }
    const m3_tensor *ga = m3_st_find(a, "greedy_tokens"), *gb = m3_st_find(b, "greedy_tokens");
    if (ga && gb) {
        int eq = ga->numel == gb->numel && !memcmp(ga->data, gb->data, ga->nbytes);
        printf("greedy tokens: %s\n", eq ? "equal" : "DIFFER");
        if (!eq) fail = 1;
    }
    int layers = 0, mism = 0;
    long index_rows = 0;
    for (int l = 0; l < 1024; l++) {
        char nm[64];
        snprintf(nm, sizeof nm, "index_blocks.layer%d", l);
        const m3_tensor *x = m3_st_find(a, nm), *y = m3_st_find(b, nm);
        if (!x) continue;
        layers++;
        if (!y || x->numel != y->numel) { mism++; continue; }
        int K = (int)x->shape[2];
        int32_t *p = malloc(sizeof(int32_t) * K * 2), *q = p + K;
        index_rows += x->shape[0] * x->shape[1];
        for (int64_t r = 0; r < x->shape[0] * x->shape[1]; r++) {
            memcpy(p, (const int32_t *)x->data + r * K, sizeof(int32_t) * K);
            memcpy(q, (const int32_t *)y->data + r * K, sizeof(int32_t) * K);
            qsort(p, K, sizeof *p, cmp_i32);
            qsort(q, K, sizeof *q, cmp_i32);
            if (memcmp(p, q, sizeof(int32_t) * K)) mism++;
        }
        free(p);
    }
    if (layers) printf("index blocks: %d layers, %d of %ld rows differ\n", layers, mism, index_rows);
    if ((double)mism > allow * (double)index_rows) fail = 1;
    printf("%s\n", fail ? "FAIL" : "ok");
    m3_st_close(a);
    m3_st_close(b);
    return fail;
}
