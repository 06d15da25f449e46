/* The DSpark draft attention op (ops.h: dspark_attention) against a reference in double
 * precision written from the spec's definition (spec section 4): slot i of a block at positions
 * pos..pos+n-1 attends to the context positions that are readable (>= lo) and inside its window
 * (>= pos + i - window + 1, < len) and to every key of the block (non-causal inside it); GQA maps
 * query head h to KV head h / (nh / nkv); context position p lives in ring slot p % cap.
 * Cases: no context, a context shorter than the window, a ring that wrapped, a window that cuts
 * the context differently for each slot, a window of 1 (block keys only for the last slots), MQA
 * and GQA head layouts. Everything goes through the op table (alloc / upload / copy / download),
 * so a GPU backend's op can be checked the same way; the CPU's is checked here, and its copy op
 * on the ring rows.
 * Usage: test_dspark_attn (no data needed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/ops.h"

#include "../check.h"

static float urand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

typedef struct {
    int n, nh, nkv, D, cap, lo, len, pos, window;
    const char *what;
} dsa_case;

/* out[i][h][:] from the definition (double) */
static void reference(const dsa_case *k, const float *q, const float *kb, const float *vb, const float *kr, const float *vr,
                      double *out) {
    const int G = k->nh / k->nkv, D = k->D;
    const size_t kw = (size_t)k->nkv * D;
    double *s = malloc(sizeof(double) * ((size_t)k->len + k->n + 1));
    for (int i = 0; i < k->n; i++)
        for (int h = 0; h < k->nh; h++) {
            const int g = h / G;
            const float *qh = q + ((size_t)i * k->nh + h) * D;
            int ns = 0;
            double mx = -INFINITY;
            long first = (long)k->pos + i - k->window + 1;
            if (first < k->lo) first = k->lo;
            for (long p = first; p < k->len; p++) { /* the context keys this slot sees */
                const float *kp = kr + (size_t)(p % k->cap) * kw + (size_t)g * D;
                double d = 0;
                for (int x = 0; x < D; x++) d += (double)qh[x] * kp[x];
                s[ns] = d / sqrt((double)D);
                if (s[ns] > mx) mx = s[ns];
                ns++;
            }
            const int nc = ns;
            for (int b = 0; b < k->n; b++) { /* every block key */
                double d = 0;
                for (int x = 0; x < D; x++) d += (double)qh[x] * kb[(size_t)b * kw + (size_t)g * D + x];
                s[ns] = d / sqrt((double)D);
                if (s[ns] > mx) mx = s[ns];
                ns++;
            }
            double sum = 0;
            for (int j = 0; j < ns; j++) sum += s[j] = exp(s[j] - mx);
            double *o = out + ((size_t)i * k->nh + h) * D;
            for (int x = 0; x < D; x++) o[x] = 0;
            for (int j = 0; j < nc; j++) {
                const float *vp = vr + (size_t)((first + j) % k->cap) * kw + (size_t)g * D;
                for (int x = 0; x < D; x++) o[x] += s[j] / sum * vp[x];
            }
            for (int b = 0; b < k->n; b++)
                for (int x = 0; x < D; x++) o[x] += s[nc + b] / sum * vb[(size_t)b * kw + (size_t)g * D + x];
        }
    free(s);
}

static void run_case(m3_ops *op, const dsa_case *k, uint64_t seed) {
    void *X = op->ctx;
    const size_t kw = (size_t)k->nkv * k->D, qn = (size_t)k->n * k->nh * k->D, bn = (size_t)k->n * kw,
                 rn = (size_t)k->cap * kw;
    float *q = malloc(sizeof(float) * qn), *kb = malloc(sizeof(float) * bn), *vb = malloc(sizeof(float) * bn);
    float *kr = malloc(sizeof(float) * rn), *vr = malloc(sizeof(float) * rn), *got = malloc(sizeof(float) * qn);
    double *want = malloc(sizeof(double) * qn);
    for (size_t i = 0; i < qn; i++) q[i] = 2.0f * urand(&seed);
    for (size_t i = 0; i < bn; i++) { kb[i] = urand(&seed); vb[i] = urand(&seed); }
    for (size_t i = 0; i < rn; i++) { kr[i] = urand(&seed); vr[i] = urand(&seed); }
    float *dq = op->alloc(X, sizeof(float) * qn), *dkb = op->alloc(X, sizeof(float) * bn), *dvb = op->alloc(X, sizeof(float) * bn);
    float *dkr = op->alloc(X, sizeof(float) * rn), *dvr = op->alloc(X, sizeof(float) * rn), *dout = op->alloc(X, sizeof(float) * qn);
    float *stage = op->alloc(X, sizeof(float) * rn);
    CHECK(dq && dkb && dvb && dkr && dvr && dout && stage, "%s: backend allocations", k->what);
    if (dq && dkb && dvb && dkr && dvr && dout && stage) {
        op->upload(X, dq, q, sizeof(float) * qn);
        op->upload(X, dkb, kb, sizeof(float) * bn);
        op->upload(X, dvb, vb, sizeof(float) * bn);
        /* the rings reach the backend through copy, row by row in reverse (as the draft writes them) */
        op->upload(X, stage, kr, sizeof(float) * rn);
        for (int r = k->cap - 1; r >= 0; r--) op->copy(X, dkr + (size_t)r * kw, stage + (size_t)r * kw, sizeof(float) * kw);
        op->upload(X, stage, vr, sizeof(float) * rn);
        for (int r = k->cap - 1; r >= 0; r--) op->copy(X, dvr + (size_t)r * kw, stage + (size_t)r * kw, sizeof(float) * kw);
        op->dspark_attention(X, dq, dkb, dvb, k->n, k->nh, k->nkv, k->D, dkr, dvr, k->cap, k->lo, k->len, k->pos, k->window,
                             dout);
        m3_err err = {0};
        CHECK(!op->check || op->check(X, &err) == 0, "%s: %s", k->what, err.msg);
        op->download(X, got, dout, sizeof(float) * qn);
        reference(k, q, kb, vb, kr, vr, want);
        double worst = 0;
        for (size_t i = 0; i < qn; i++) {
            double e = fabs((double)got[i] - want[i]);
            if (e > worst) worst = e;
        }
        CHECK(worst < 2e-5, "%s: max |op - reference| %.3g", k->what, worst);
        printf("%-58s max |op - reference| %.2g\n", k->what, worst);
    }
    float *ps[] = {dq, dkb, dvb, dkr, dvr, dout, stage};
    for (int i = 0; i < 7; i++)
        if (ps[i]) op->release(X, ps[i]);
    free(q); free(kb); free(vb); free(kr); free(vr); free(got); free(want);
}

int main(void) {
    m3_ops ops;
    m3_err err = {0};
    if (m3_cpu_ops_init(&ops, 2, &err)) { fprintf(stderr, "cpu ops: %s\n", err.msg); return 1; }
    CHECK(ops.dspark_attention != NULL && ops.copy != NULL, "the CPU op table has dspark_attention and copy");
    if (!ops.dspark_attention || !ops.copy) { m3_cpu_ops_free(&ops); return 1; }
    /* n, nh, nkv, D, cap, lo, len, pos, window */
    const dsa_case cases[] = {
        {4, 8, 2, 32, 1, 0, 0, 0, 4096, "no context (first block): block keys only"},
        {7, 8, 2, 32, 64, 0, 40, 40, 4096, "context shorter than the window (GQA 4:1)"},
        {8, 4, 4, 16, 32, 68, 100, 100, 32, "wrapped ring: positions 68..99 readable (MHA)"},
        {5, 6, 1, 24, 16, 34, 50, 50, 12, "window cuts the context per slot (MQA)"},
        {3, 4, 2, 8, 8, 22, 30, 30, 1, "window of 1: no context for any slot"},
        {6, 8, 2, 32, 64, 25, 60, 60, 4096, "reset at 25: positions below it unread"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&ops, &cases[i], 0x1234 + i);
    m3_cpu_ops_free(&ops);
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    else printf("all DSpark attention checks passed\n");
    return failures != 0;
}
