/* The host side of a decode step's sampling at the M3 vocabulary (200,064): B requests, each
 * with its own sampler and a Zipf-like logits row (p ~ rank^-1.1), drawn one after the other and spread over a thread
 * pool as the engine does (src/engine/engine.c, sample_rows: a workspace per worker, each
 * draw reading only its row and its sampler). Prints ms per step for each thread count and
 * checks that every count draws the same tokens (a batch of 1 splits its row's passes over the
 * threads instead: m3_sample_ws_set_pool). Then the host work of one position of sampled
 * speculative decoding (src/engine/spec.c): the processed distribution of a row
 * (m3_sampler_probs, for the draft's q and the target's p), a draw from it (m3_spec_draw) and a
 * draw from the residual max(p - q, 0) (m3_spec_residual), in us per call.
 * usage: bench_sampling [BATCH (default 64)] [STEPS (default 5)] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/pool.h"
#include "base/clock.h"
#include "engine/sampler.h"
#include "engine/spec.h"

#define V 200064

typedef struct {
    m3_sampler **smp;
    const float *logits;
    m3_sample_ws **ws;
    int32_t *tok;
} job;

static void run_range(void *ctx, size_t begin, size_t end, int worker) {
    job *j = ctx;
    for (size_t i = begin; i < end; i++) {
        m3_sample_out so;
        m3_err err;
        if (m3_sampler_sample(j->smp[i], j->logits + i * (size_t)V, j->ws[worker], &so, &err)) so.token = -1;
        j->tok[i] = so.token;
    }
}

int main(int argc, char **argv) {
    const int B = argc > 1 ? atoi(argv[1]) : 64, steps = argc > 2 ? atoi(argv[2]) : 5;
    if (B < 1 || steps < 1) { fprintf(stderr, "usage: bench_sampling [BATCH] [STEPS]\n"); return 2; }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    float *logits = malloc(sizeof(float) * (size_t)B * V);
    int32_t *ref = malloc(sizeof(int32_t) * (size_t)B * steps), *tok = malloc(sizeof(int32_t) * (size_t)B);
    m3_sampler **smp = malloc(sizeof *smp * (size_t)B);
    m3_sample_ws *ws[64];
    if (!logits || !ref || !tok || !smp) { fprintf(stderr, "out of memory\n"); return 1; }
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < (size_t)B * V; i++) { /* Zipf-like rows: p ~ rank^-1.1, ranks shuffled */
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        logits[i] = (float)(-1.1 * log(1.0 + (double)(r % V)));
    }
    const struct { const char *name; m3_sampling sp; } modes[] = {
        {"greedy", {.temperature = 0}},
        {"T 0.8, top-p 0.95", {.temperature = 0.8f, .top_p = 0.95f, .seed = 7}},
        {"T 0.7, top-k 50", {.temperature = 0.7f, .top_k = 50, .seed = 7}},
        {"T 1, no filter", {.temperature = 1.0f, .seed = 7}},
    };
    printf("batch %d, vocabulary %d, %d steps per measure, %ld CPUs\n", B, V, steps, cpus);
    printf("%-20s %8s %12s %14s %s\n", "sampling", "threads", "ms / step", "us / token", "tokens");
    int fails = 0;
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        for (int nt = 1; nt <= (cpus < 8 ? cpus : 8); nt *= 2) {
            m3_err err;
            for (int i = 0; i < nt; i++) ws[i] = m3_sample_ws_create(V, &err);
            for (int i = 0; i < B; i++) {
                m3_sampling sp = modes[m].sp;
                sp.seed += (uint64_t)i;
                smp[i] = m3_sampler_create(&sp, V, NULL, 0, &err);
            }
            m3_pool *pool = nt > 1 ? m3_pool_create(nt) : NULL;
            if (B == 1) m3_sample_ws_set_pool(ws[0], pool); /* a batch of one: its row split over the threads */
            job j = {smp, logits, ws, tok};
            int same = 1;
            double t0 = m3_now();
            for (int s = 0; s < steps; s++) {
                if (B == 1) run_range(&j, 0, 1, 0);
                else m3_pool_for(pool, (size_t)B, 1, run_range, &j);
                for (int i = 0; i < B; i++) {
                    m3_sampler_accept(smp[i], tok[i] >= 0 ? tok[i] : 0, &err);
                    if (nt == 1) ref[(size_t)s * B + i] = tok[i];
                    else same &= ref[(size_t)s * B + i] == tok[i];
                }
            }
            double dt = (m3_now() - t0) / steps;
            printf("%-20s %8d %12.2f %14.1f %s\n", modes[m].name, nt, dt * 1e3, dt * 1e6 / B,
                   nt == 1 ? "reference" : same ? "same" : "DIFFERENT");
            fails += !same;
            m3_pool_free(pool);
            for (int i = 0; i < B; i++) m3_sampler_free(smp[i]);
            for (int i = 0; i < nt; i++) m3_sample_ws_free(ws[i]);
        }
    }
    /* speculative decoding's host work per draft position, on rows 0 (q) and 1 (p) */
    {
        m3_err err;
        m3_sample_ws *w1 = m3_sample_ws_create(V, &err);
        float *p = malloc(sizeof(float) * V), *q = malloc(sizeof(float) * V);
        m3_sampling sp = {.temperature = 0.8f, .top_p = 0.95f, .seed = 7}, t1 = {.temperature = 1.0f, .seed = 7};
        printf("\nspeculative decoding, one draft position (us per call, vocabulary %d)\n", V);
        for (int m = 0; m < 2 && w1 && p && q; m++) {
            m3_sampler *s = m3_sampler_create(m ? &sp : &t1, V, NULL, 0, &err);
            const int n = 50;
            long sum = 0;
            double t0 = m3_now();
            for (int i = 0; i < n; i++) /* rows 0 and 1 (row 0 twice in a batch of one) */
                m3_sampler_probs(s, logits + (size_t)(B > 1 ? i & 1 : 0) * V, w1, (i & 1) ? p : q, &err);
            double t1s = m3_now();
            for (int i = 0; i < n; i++) sum += m3_spec_draw(q, V, m3_sampler_uniform(s));
            double t2 = m3_now();
            for (int i = 0; i < n; i++) sum += m3_spec_residual(p, q, 5, V, m3_sampler_uniform(s));
            double t3 = m3_now();
            printf("%-20s probs %8.1f   draw %8.1f   residual %8.1f   (%ld)\n", m ? "T 0.8, top-p 0.95" : "T 1, no filter",
                   (t1s - t0) / n * 1e6, (t2 - t1s) / n * 1e6, (t3 - t2) / n * 1e6, sum % 1000);
            m3_sampler_free(s);
        }
        m3_sample_ws_free(w1);
        free(p); free(q);
    }
    free(logits); free(ref); free(tok); free(smp);
    return fails != 0;
}
