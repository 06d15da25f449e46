/* m3 bench: prefill and decode speed of a checkpoint on the CPU, against the floor set by
 * this machine's measured memory bandwidth (bytes a decode step must read / bandwidth). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../backend/cpu/cpu.h"
#include "../base/clock.h"
#include "../engine/sampler.h"
#include "cli.h"

typedef struct { const uint8_t *src; uint8_t *dst; size_t n; double *sums; } bw_job;

static void bw_copy(void *arg, size_t b, size_t e, int w) {
    bw_job *j = arg;
    (void)w;
    memcpy(j->dst + b * 4096, j->src + b * 4096, (e - b) * 4096);
}

static void bw_read(void *arg, size_t b, size_t e, int w) {
    bw_job *j = arg;
    const uint64_t *p = (const uint64_t *)(j->src + b * 4096);
    size_t n = (e - b) * 512;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n; i += 4) { s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3]; }
    j->sums[w] += (double)(s0 ^ s1 ^ s2 ^ s3);
}

/* best of several passes over 1 GB buffers with all pool threads; copy counts read + write */
static void measure_bw(m3_pool *pool, double *copy_gbs, double *read_gbs) {
    size_t n = (size_t)1 << 30;
    uint8_t *a = aligned_alloc(4096, n), *b = aligned_alloc(4096, n);
    double sums[1024] = {0};
    *copy_gbs = *read_gbs = 0;
    if (!a || !b) { free(a); free(b); return; }
    memset(a, 1, n);
    memset(b, 2, n);
    bw_job j = {a, b, n, sums};
    for (int rep = 0; rep < 4; rep++) {
        double t0 = m3_now();
        m3_pool_for(pool, n / 4096, 256, bw_copy, &j);
        double t1 = m3_now();
        m3_pool_for(pool, n / 4096, 256, bw_read, &j);
        double t2 = m3_now();
        if (2.0 * n / (t1 - t0) / 1e9 > *copy_gbs) *copy_gbs = 2.0 * n / (t1 - t0) / 1e9;
        if (n / (t2 - t1) / 1e9 > *read_gbs) *read_gbs = n / (t2 - t1) / 1e9;
    }
    free(a);
    free(b);
}

/* weight bytes one decode step (one token) reads: everything but the unchosen experts */
static double step_weight_bytes(const m3_model *m) {
    const m3_config *c = &m->cfg;
    double b = m3_linear_bytes(&m->w.lm_head) + (double)m->w.embed.row_bytes;
    for (int l = 0; l < c->n_layers; l++) {
        const m3_layer_w *L = &m->w.layers[l];
        b += m3_linear_bytes(&L->q) + m3_linear_bytes(&L->k) + m3_linear_bytes(&L->v) + m3_linear_bytes(&L->o);
        if (L->sparse) b += m3_linear_bytes(&L->iq) + m3_linear_bytes(&L->ik);
        if (!L->moe) {
            b += m3_linear_bytes(&L->mlp.gate) + m3_linear_bytes(&L->mlp.up) + m3_linear_bytes(&L->mlp.down);
            continue;
        }
        const m3_mlp_w *e = &L->experts[0];
        b += m3_linear_bytes(&L->router);
        b += (double)c->top_k * (m3_linear_bytes(&e->gate) + m3_linear_bytes(&e->up) + m3_linear_bytes(&e->down));
        if (L->has_shared)
            b += m3_linear_bytes(&L->shared.gate) + m3_linear_bytes(&L->shared.up) + m3_linear_bytes(&L->shared.down);
    }
    return b;
}

int m3_cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--random-weights")) return m3_cmd_bench_random(argc, argv);
    const char *dir = NULL, *kvd = "bf16";
    long prompt = 512, decode = 32, threads = 0;
    m3_err err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { dir = v; i++; }
        else if (!strcmp(a, "--prompt")) { r = m3_cli_int(a, v, 1, 1 << 22, &prompt, &err); i++; }
        else if (!strcmp(a, "--decode")) { r = m3_cli_int(a, v, 1, 1 << 22, &decode, &err); i++; }
        else if (!strcmp(a, "--threads")) { r = m3_cli_int(a, v, 0, 1024, &threads, &err); i++; }
        else if (!strcmp(a, "--moe-act-quant")) { if (m3_cli_set_moe_act_quant(v, "bench")) return 2; i++; }
        else if (!strcmp(a, "--kv-cache-dtype")) { kvd = v; i++; }
        else { fprintf(stderr, "m3 bench: unknown option '%s'\n", a); return 2; }
        if (r) { fprintf(stderr, "m3 bench: %s\n", err.msg); return 2; }
        if (i >= argc) { fprintf(stderr, "m3 bench: %s needs a value\n", a); return 2; }
    }
    if (!dir) { fprintf(stderr, "m3 bench: usage: m3 bench -m DIR [--prompt N] [--decode N] [--threads N] [--moe-act-quant none|nvfp4]\n"); return 2; }
    m3_kv_dtype kdt;
    if (m3_kv_dtype_parse(kvd, &kdt)) { fprintf(stderr, "m3 bench: --kv-cache-dtype: unknown dtype '%s'\n", kvd); return 2; }
    m3_ops ops;
    m3_model m;
    if (m3_cli_load_on(&m, &ops, "cpu", dir, (int)threads, "bench", NULL, 0)) return 1;
    m3_cpu *cpu = ops.ctx;
    const m3_config *c = &m.cfg;
    int rc = 1, V = c->vocab, T = (int)prompt, N = (int)decode;
    int page = m3_kv_page_tokens(c);
    m3_kv kv;
    memset(&kv, 0, sizeof kv);
    m3_kv_seq seq = {0};
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (!ids || !logits) { fprintf(stderr, "m3 bench: out of memory\n"); goto done; }
    if (m3_kv_create(&kv, c, kdt, kdt, page, (T + N + page - 1) / page, &err)) { fprintf(stderr, "m3 bench: %s\n", err.msg); goto done; }
    m3_rng rng;
    m3_rng_seed(&rng, 1);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(m3_rng_uniform(&rng) * V);
    double cbw, rbw;
    measure_bw(cpu->pool, &cbw, &rbw);
    double t0 = m3_now();
    if (m3_run_tokens(&m, &kv, &seq, ids, T, 0, 512, logits, &err)) { fprintf(stderr, "m3 bench: %s\n", err.msg); goto done; }
    double t1 = m3_now();
    double best = 1e9, total = 0;
    double *steps = malloc(sizeof(double) * (size_t)N);
    if (!steps) { fprintf(stderr, "m3 bench: out of memory\n"); goto done; }
    for (int i = 0; i < N; i++) {
        int32_t tok = m3_argmax(logits, V);
        double a = m3_now();
        if (m3_run_tokens(&m, &kv, &seq, &tok, 1, T + i, 1, logits, &err)) {
            fprintf(stderr, "m3 bench: %s\n", err.msg);
            free(steps);
            goto done;
        }
        double d = m3_now() - a;
        steps[i] = d;
        total += d;
        if (d < best) best = d;
    }
    double wbytes = step_weight_bytes(&m);
    double kvbytes = (double)m3_kv_bytes_per_token(&kv) * (T + N / 2); /* dense upper bound on cache reads */
    for (int a = 1; a < N; a++) /* sort for the median */
        for (int b2 = a; b2 > 0 && steps[b2] < steps[b2 - 1]; b2--) { double t = steps[b2]; steps[b2] = steps[b2 - 1]; steps[b2 - 1] = t; }
    double med_ms = steps[N / 2] * 1e3;
    free(steps);
    double floor_ms = (wbytes + kvbytes) / (cbw * 1e9) * 1e3, mean_ms = total / N * 1e3;
    printf("machine: %d threads, %s kernels; copy bandwidth %.1f GB/s (read+write), read bandwidth %.1f GB/s\n",
           cpu->nthreads, m3_cpu_simd_name(), cbw, rbw);
    printf("model: %s, %.2f GB of weights; decode step reads %.1f MB of weights + <= %.1f MB of %s KV\n", dir,
           m3_st_total_bytes(m.st) / 1e9, wbytes / 1e6, kvbytes / 1e6, m3_kv_dtype_name(kdt));
    printf("prefill: %d tokens in %.3f s = %.1f tokens/s\n", T, t1 - t0, T / (t1 - t0));
    printf("decode: %d steps, mean %.2f ms, median %.2f ms, best %.2f ms = %.2f tokens/s (mean)\n", N, mean_ms, med_ms,
           best * 1e3, 1e3 / mean_ms);
    printf("decode floor: %.2f ms/step (bytes / copy bandwidth); at %.0f%% of the floor (mean step), %.0f%% (median), %.0f%% (best)\n",
           floor_ms, 100 * floor_ms / mean_ms, 100 * floor_ms / med_ms, 100 * floor_ms / (best * 1e3));
    rc = 0;
done:
    free(ids); free(logits);
    m3_kv_seq_release(&kv, &seq);
    m3_kv_destroy(&kv);
    m3_model_free(&m);
    m3_cli_ops_free(&ops);
    return rc;
}
