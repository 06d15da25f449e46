/* m3 bench --random-weights: decode and prefill speed at real shapes on the GPU, without a
 * checkpoint. Builds the model of --config (first --layers layers) with random weights in
 * the real formats on the device, then for each context and batch size: B sequences whose
 * caches hold `context` tokens, timed decode steps of one token each, against the floor
 * (bytes the step must read / measured device copy bandwidth). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../backend/cuda/cuda.h"
#include "../base/clock.h"
#include "../model/group.h"
#include "../engine/sampler.h"
#include "cli.h"

static int parse_list(const char *s, long *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *e;
        long v = strtol(s, &e, 10);
        if (e == s || v <= 0) return -1;
        if (*e == 'K' || *e == 'k') { v *= 1024; e++; }
        out[n++] = v;
        s = *e == ',' ? e + 1 : e;
        if (*e && *e != ',') return -1;
    }
    return n;
}

/* weight bytes of one decode step with `experts` distinct (layer, expert) pairs read */
static double weight_bytes(const m3_weights *w, long experts) {
    double b = m3_linear_bytes(&w->lm_head);
    double eb = 0;
    for (int l = 0; l < w->n_layers; l++) {
        const m3_layer_w *L = &w->layers[l];
        b += m3_linear_bytes(&L->q) + m3_linear_bytes(&L->k) + m3_linear_bytes(&L->v) + m3_linear_bytes(&L->o);
        if (L->sparse) b += m3_linear_bytes(&L->iq) + m3_linear_bytes(&L->ik);
        if (!L->moe) { b += m3_linear_bytes(&L->mlp.gate) + m3_linear_bytes(&L->mlp.up) + m3_linear_bytes(&L->mlp.down); continue; }
        b += m3_linear_bytes(&L->router);
        const m3_mlp_w *e = &L->experts[0];
        eb = m3_linear_bytes(&e->gate) + m3_linear_bytes(&e->up) + m3_linear_bytes(&e->down);
        if (L->has_shared) b += m3_linear_bytes(&L->shared.gate) + m3_linear_bytes(&L->shared.up) + m3_linear_bytes(&L->shared.down);
    }
    return b + eb * (double)experts;
}

/* cache bytes one token at position ctx reads in one step (all layers) */
static double kv_bytes(const m3_config *c, int nl, m3_kv_dtype dt, m3_kv_dtype idt, long ctx) {
    double rb = (double)m3_kv_row_bytes(dt, c->head_dim), irb = (double)m3_kv_row_bytes(idt, c->index_dim), b = 0;
    for (int l = 0; l < nl; l++) {
        if (c->layer_sparse[l]) {
            long nb = ctx / c->block_size + 1, sel = nb < c->topk_blocks ? nb : c->topk_blocks;
            long keys = sel * c->block_size < ctx + 1 ? sel * c->block_size : ctx + 1;
            b += (double)(ctx + 1) * irb + 2.0 * c->n_kv_heads * keys * rb;
        } else {
            b += 2.0 * c->n_kv_heads * (double)(ctx + 1) * rb;
        }
    }
    return b;
}

/* Builds nb sequences with ctx cached tokens and times steps of q tokens per sequence
 * (q = 1: decode; q = k + 1: a speculative verify pass); median step time in *med and the
 * (layer, expert) pairs one step reads in *experts. With profile, 3 more steps with per-op
 * timing are recorded (the caller prints them). */
static int time_steps(m3_model *m, m3_kv *kv, m3_ops *ops, long nb, int q, long ctx, long steps, int profile, double *med,
                      long *experts, m3_err *err) {
    const int V = m->cfg.vocab;
    long T = nb * q;
    m3_kv_seq *seqs = calloc((size_t)nb, sizeof *seqs);
    m3_kv_seq **sp = calloc((size_t)nb, sizeof *sp);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * 3), *pos = ids + T, *sq = pos + T;
    int *rows = malloc(sizeof(int) * (size_t)T);
    double *st = malloc(sizeof(double) * (size_t)steps);
    int rc = 0;
    if (!seqs || !sp || !ids || !rows || !st) rc = m3_errf(err, "out of memory");
    for (long s = 0; !rc && s < nb; s++) {
        sp[s] = &seqs[s];
        if (m3_kv_seq_reserve(kv, &seqs[s], (int)(ctx + q), err)) { rc = -1; break; }
        seqs[s].len = (int)ctx;
        for (int j = 0; j < q; j++) {
            long t = s * q + j;
            ids[t] = (int32_t)((t * 7919 + 13) % V);
            pos[t] = (int32_t)(ctx + j);
            sq[t] = (int32_t)s;
            rows[t] = (int)t;
        }
    }
    m3_batch b = {(int)T, pos, sq, sp};
    if (!rc) { /* one untimed step counting the experts the routing picks */
        m3_cuda_count_experts(ops, 1);
        m3_cuda_experts_used(ops, 1);
        rc = m3_forward(m, kv, &b, ids, rows, (int)T, NULL, NULL, err);
        m3_cuda_count_experts(ops, 0);
        *experts = m3_cuda_experts_used(ops, 1);
        m3_cuda_sync_time(ops);
    }
    for (long i = 0; !rc && i < steps + 2; i++) {
        double a = m3_cuda_sync_time(ops);
        rc = m3_forward(m, kv, &b, ids, rows, (int)T, NULL, NULL, err);
        double e = m3_cuda_sync_time(ops);
        if (i >= 2) st[i - 2] = e - a;
    }
    if (!rc) {
        for (long a = 1; a < steps; a++)
            for (long k = a; k > 0 && st[k] < st[k - 1]; k--) { double t = st[k]; st[k] = st[k - 1]; st[k - 1] = t; }
        *med = st[steps / 2];
        if (profile) { /* a few more steps with per-op timing (events between ops, no graph): where the time goes */
            m3_cuda_profile(ops, 1);
            for (int i = 0; i < 3 && !rc; i++) rc = m3_forward(m, kv, &b, ids, rows, (int)T, NULL, NULL, err);
        }
    }
    for (long s = 0; seqs && s < nb; s++) m3_kv_seq_release(kv, &seqs[s]);
    free(seqs); free(sp); free(ids); free(rows); free(st);
    return rc ? -1 : 0;
}

/* ------------------------------------------------------------------ -tp N: one GPU per rank
 * Each rank builds random weights in the shapes of its view of the full model's shapes
 * (m3_weights_shapes + m3_shard_weights), so the whole model never exists anywhere: the
 * 60-layer M3.1-Flash fits two H200s. A step is m3_group_forward (logits stay on the GPUs);
 * it is timed until every rank's stream is idle. The floor per GPU: the bytes all ranks read
 * (each rank's weights without routed experts, the routed experts the step picks, each
 * rank's caches) / ranks / copy bandwidth. The all-reduces of a step (two per layer over
 * the step's hidden rows) are timed alone too. */

typedef struct {
    const m3_config *c;
    uint64_t seed;
    double bw;                 /* rank 0's copy bandwidth */
    double ar_s;               /* all-reduce time */
    long ar_elems;
    int ar_count;
} tp_bench;

static int tpb_ops_init(void *arg, int rank, m3_ops *ops, m3_comm *comm, m3_err *err) {
    (void)arg;
    if (m3_cuda_ops_init(ops, rank, err)) return -1;
    m3_cli_apply_precision(ops);
    if (m3_comm_set_stream(comm, m3_cuda_stream(ops), err)) { m3_cuda_ops_free(ops); return -1; }
    return 0;
}
static void tpb_ops_free(void *arg, int rank, m3_ops *ops) { (void)arg; (void)rank; m3_cuda_ops_free(ops); }
static int tpb_weights(void *arg, int rank, m3_ops *ops, const m3_weights *view, m3_weights *dw, m3_err *err) {
    tp_bench *t = arg;
    return m3_cuda_random_weights_like(ops, t->c, view, t->seed + 7919u * (uint64_t)rank, dw, err);
}
static int tpb_sync(void *arg, int rank, m3_model *m, m3_kv *kv, m3_err *err) {
    (void)arg; (void)rank; (void)kv; (void)err;
    m3_cuda_sync_time(m->ops);
    return 0;
}
static int tpb_bw(void *arg, int rank, m3_model *m, m3_kv *kv, m3_err *err) {
    (void)kv; (void)err;
    if (rank == 0) ((tp_bench *)arg)->bw = m3_cuda_copy_bandwidth(m->ops, (size_t)2 << 30);
    return 0;
}
/* ar_count all-reduces of ar_elems floats, as a step makes them; rank 0's time */
static int tpb_allreduce(void *arg, int rank, m3_model *m, m3_kv *kv, m3_err *err) {
    (void)kv;
    tp_bench *t = arg;
    float *buf = m->ops->alloc(m->ops->ctx, sizeof(float) * (size_t)t->ar_elems);
    if (!buf) return m3_errf(err, "out of device memory");
    int rc = 0;
    for (int pass = 0; pass < 2 && !rc; pass++) { /* the first pass warms NCCL up */
        double a = m3_cuda_sync_time(m->ops);
        for (int i = 0; i < t->ar_count && !rc; i++) rc = m3_comm_all_reduce_sum(m->comm, buf, (size_t)t->ar_elems, err);
        double b = m3_cuda_sync_time(m->ops);
        if (rank == 0) t->ar_s = b - a;
    }
    m->ops->release(m->ops->ctx, buf);
    return rc;
}

static int bench_tp(const char *cfgp, m3_config *c, long layers, int N, m3_moe_split split, const long *B, int nB,
                    const long *C, int nC, long steps, m3_kv_dtype kdt, m3_kv_dtype idt, long seed) {
    m3_err err;
    int rc = 1;
    if (!m3_comm_nccl_built()) { fprintf(stderr, "m3 bench: -tp %d needs NCCL, and this m3 was built without it\n", N); return 1; }
    if (m3_cuda_device_count() < N) { fprintf(stderr, "m3 bench: -tp %d needs %d GPUs, %d visible\n", N, N, m3_cuda_device_count()); return 1; }
    m3_model full;
    memset(&full, 0, sizeof full);
    full.cfg = *c; /* shallow: c stays the caller's */
    full.cfg.n_layers = (int)layers;
    if (m3_weights_shapes(&full.w, &full.cfg, (int)layers, &err)) { fprintf(stderr, "m3 bench: %s\n", err.msg); return 1; }
    m3_comm **comms = calloc((size_t)N, sizeof *comms);
    int *devs = malloc(sizeof(int) * (size_t)N);
    m3_group *g = NULL;
    tp_bench t = {&full.cfg, (uint64_t)seed, 0, 0, 0, 0};
    if (!comms || !devs) { fprintf(stderr, "m3 bench: out of memory\n"); goto out; }
    for (int r = 0; r < N; r++) devs[r] = r;
    if (m3_comm_nccl_create(N, devs, comms, &err)) { fprintf(stderr, "m3 bench: %s\n", err.msg); goto out; }
    double t0 = m3_now();
    m3_group_opts o = {N, split, comms, tpb_ops_init, tpb_ops_free, &t, tpb_weights};
    g = m3_group_create(&full, &o, &err);
    if (!g) { fprintf(stderr, "m3 bench: %s\n", err.msg); goto out; }
    if (m3_group_run(g, tpb_bw, &t, &err)) { fprintf(stderr, "m3 bench: %s\n", err.msg); goto out; }
    const m3_config *cf = &full.cfg;
    double nonexp = 0, eb_full = 0;
    for (int l = 0; l < cf->n_layers; l++)
        if (full.w.layers[l].moe) {
            const m3_mlp_w *e = &full.w.layers[l].experts[0];
            eb_full = (double)(m3_linear_bytes(&e->gate) + m3_linear_bytes(&e->up) + m3_linear_bytes(&e->down));
            break;
        }
    printf("tensor parallel %d (%s), NCCL; model: %s, %ld of %d layers, random weights built in %.1f s\n", N,
           m3_moe_split_name(split), cfgp, layers, c->n_layers, m3_now() - t0);
    for (int r = 0; r < N; r++) {
        m3_model *m = m3_group_model(g, r);
        size_t fr, tot, pk;
        m3_cuda_mem_info(m->ops, &fr, &tot, &pk);
        double wb = weight_bytes(m->dw, 0); /* without routed experts */
        nonexp += wb;
        printf("  rank %d: %s; %.1f GB of weights without routed experts, %.1f GiB in use\n", r, m3_cuda_device_name(m->ops),
               wb / 1e9, (tot - fr) / 1073741824.0);
    }
    printf("device copy bandwidth (rank 0): %.0f GB/s%s\n", t.bw / 1e9, cf->fc1_quant ? "; the routed experts' FC1 input in NVFP4 per token" : "");
    printf("%-7s %-8s %10s %12s %7s %12s %9s %14s\n", "batch", "context", "step_ms", "floor_ms/GPU", "ratio", "tokens/s", "experts",
           "allreduce_ms");
    fflush(stdout);
    int page = m3_kv_page_tokens(cf), V = cf->vocab;
    for (int ci = 0; ci < nC; ci++)
        for (int bi = 0; bi < nB; bi++) {
            long ctx = C[ci], nb = B[bi], T = nb;
            long pages = (ctx + 1 + page - 1) / page * nb;
            if (m3_group_kv_create(g, kdt, idt, page, (int)pages, &err)) {
                printf("%-7ld %-8ld  skipped: %s\n", nb, ctx, err.msg);
                fflush(stdout);
                continue;
            }
            m3_kv *kv0 = m3_group_kv(g, 0);
            m3_kv_seq *seqs = calloc((size_t)nb, sizeof *seqs);
            m3_kv_seq **sp = calloc((size_t)nb, sizeof *sp);
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * 3), *pos = ids ? ids + T : NULL, *sq = ids ? pos + T : NULL;
            int *rows = malloc(sizeof(int) * (size_t)T);
            double *st = malloc(sizeof(double) * (size_t)steps);
            int bad = !seqs || !sp || !ids || !rows || !st;
            for (long s = 0; !bad && s < nb; s++) {
                sp[s] = &seqs[s];
                if (m3_kv_seq_reserve(kv0, &seqs[s], (int)(ctx + 1), &err)) { bad = 1; break; }
                seqs[s].len = (int)ctx;
                ids[s] = (int32_t)((s * 7919 + 13) % V);
                pos[s] = (int32_t)ctx;
                sq[s] = (int32_t)s;
                rows[s] = (int)s;
            }
            m3_batch b = {(int)T, pos, sq, sp};
            long experts = 0;
            if (!bad) { /* one untimed step counting the experts the routing picks (rank 0 routes every token) */
                m3_ops *o0 = m3_group_model(g, 0)->ops;
                m3_cuda_count_experts(o0, 1);
                m3_cuda_experts_used(o0, 1);
                bad = m3_group_forward(g, &b, ids, rows, (int)T, NULL, NULL, &err) || m3_group_run(g, tpb_sync, NULL, &err);
                m3_cuda_count_experts(o0, 0);
                experts = m3_cuda_experts_used(o0, 1);
            }
            for (long i = 0; !bad && i < steps + 2; i++) {
                double a = m3_now();
                bad = m3_group_forward(g, &b, ids, rows, (int)T, NULL, NULL, &err) || m3_group_run(g, tpb_sync, NULL, &err);
                if (i >= 2) st[i - 2] = m3_now() - a;
            }
            if (!bad) {
                t.ar_elems = T * cf->hidden;
                t.ar_count = 2 * cf->n_layers;
                bad = m3_group_run(g, tpb_allreduce, &t, &err);
            }
            if (bad) {
                fprintf(stderr, "m3 bench: %s\n", err.msg);
            } else {
                for (long a = 1; a < steps; a++)
                    for (long k = a; k > 0 && st[k] < st[k - 1]; k--) { double x = st[k]; st[k] = st[k - 1]; st[k - 1] = x; }
                double med = st[steps / 2], kvb = 0;
                for (int r = 0; r < N; r++) {
                    m3_config rc = *cf;
                    rc.n_kv_heads = m3_group_model(g, r)->shard.n_kv_heads;
                    kvb += (double)nb * kv_bytes(&rc, cf->n_layers, kdt, idt, ctx);
                }
                double floor_s = (nonexp + eb_full * (double)experts + kvb) / N / t.bw;
                printf("%-7ld %-8ld %10.3f %12.3f %6.0f%% %12.1f %9ld %14.3f\n", nb, ctx, med * 1e3, floor_s * 1e3,
                       100 * floor_s / med, nb / med, experts, t.ar_s * 1e3);
            }
            fflush(stdout);
            for (long s = 0; seqs && s < nb; s++) m3_kv_seq_release(kv0, &seqs[s]);
            free(seqs); free(sp); free(ids); free(rows); free(st);
            if (bad) goto out;
        }
    rc = 0;
out:
    m3_group_free(g);
    if (comms) m3_comm_destroy_all(comms, N);
    free(comms);
    free(devs);
    m3_weights_free(&full.w);
    return rc;
}

int m3_cmd_bench_random(int argc, char **argv) {
    const char *cfgp = NULL, *kvd = "bf16", *ikd = NULL, *bs = "1,8,64,256", *cs = "8192,131072";
    long layers = 0, steps = 10, seed = 1, prefill = 2048, verify = 0, tpn = 1, pchunk = 4096;
    const char *moe_split = NULL, *dspark_cfg = NULL;
    int profile = 0;
    m3_err err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = 0;
        if (!strcmp(a, "--random-weights")) continue;
        if (!strcmp(a, "--profile")) { profile = 1; continue; }
        if (!v) { fprintf(stderr, "m3 bench: %s needs a value (or is unknown)\n", a); return 2; }
        if (!strcmp(a, "--config")) cfgp = v;
        else if (!strcmp(a, "--layers")) r = m3_cli_int(a, v, 1, 100000, &layers, &err);
        else if (!strcmp(a, "--steps")) r = m3_cli_int(a, v, 1, 100000, &steps, &err);
        else if (!strcmp(a, "--seed")) r = m3_cli_int(a, v, 0, 1L << 40, &seed, &err);
        else if (!strcmp(a, "--prefill")) r = m3_cli_int(a, v, 0, 1 << 20, &prefill, &err);
        else if (!strcmp(a, "--prefill-chunk")) r = m3_cli_int(a, v, 1, 1 << 20, &pchunk, &err);
        else if (!strcmp(a, "--verify")) r = m3_cli_int(a, v, 1, 15, &verify, &err);
        else if (!strcmp(a, "-tp") || !strcmp(a, "--tensor-parallel-size")) r = m3_cli_int(a, v, 1, 64, &tpn, &err);
        else if (!strcmp(a, "--moe-split")) moe_split = v;
        else if (!strcmp(a, "--dspark-config")) dspark_cfg = v;
        else if (!strcmp(a, "--precision")) { if (m3_cli_set_precision(v, "bench")) return 2; }
        else if (!strcmp(a, "--moe-act-quant")) { if (m3_cli_set_moe_act_quant(v, "bench")) return 2; }
        else if (!strcmp(a, "--batch")) bs = v;
        else if (!strcmp(a, "--context")) cs = v;
        else if (!strcmp(a, "--kv-cache-dtype")) kvd = v;
        else if (!strcmp(a, "--index-cache-dtype")) ikd = v;
        else if (!strcmp(a, "--backend")) { if (strcmp(v, "cuda")) { fprintf(stderr, "m3 bench: --random-weights runs on the cuda backend\n"); return 2; } }
        else { fprintf(stderr, "m3 bench: unknown option '%s'\n", a); return 2; }
        if (r) { fprintf(stderr, "m3 bench: %s\n", err.msg); return 2; }
        i++;
    }
    long B[16], C[16];
    int nB = parse_list(bs, B, 16), nC = parse_list(cs, C, 16);
    if (!cfgp || nB <= 0 || nC <= 0) {
        fprintf(stderr, "m3 bench: usage: m3 bench --random-weights --config CONFIG.json [--layers N] [--batch 1,8,64,256] "
                        "[--context 8192,131072] [--steps N] [--prefill TOKENS] [--prefill-chunk TOKENS] [--kv-cache-dtype bf16] [--profile] "
                        "[--verify K] "
                        "[--precision exact|bf16] [--moe-act-quant none|nvfp4] [--dspark-config DRAFT.json] [-tp N [--moe-split experts|width]]\n");
        return 2;
    }
    m3_kv_dtype kdt, idt;
    if (m3_kv_dtype_parse(kvd, &kdt) || (ikd ? m3_kv_dtype_parse(ikd, &idt) : (idt = kdt, 0))) {
        fprintf(stderr, "m3 bench: unknown cache dtype\n");
        return 2;
    }
    m3_model m;
    memset(&m, 0, sizeof m);
    if (m3_config_load(&m.cfg, cfgp, &err)) { fprintf(stderr, "m3 bench: %s\n", err.msg); return 1; }
    m3_config *c = &m.cfg;
    if (m3_cli_apply_moe_act_quant(c, "bench")) { m3_config_free(c); return 2; }
    if (layers <= 0 || layers > c->n_layers) layers = c->n_layers;
    if (tpn > 1 && dspark_cfg) {
        fprintf(stderr, "m3 bench: --dspark-config runs on one GPU (no -tp)\n");
        m3_config_free(c);
        return 2;
    }
    if (tpn > 1) {
        m3_moe_split split = M3_MOE_EXPERTS;
        if (moe_split && m3_moe_split_parse(moe_split, &split)) {
            fprintf(stderr, "m3 bench: --moe-split: unknown split '%s' (experts or width)\n", moe_split);
            m3_config_free(c);
            return 2;
        }
        int rc = bench_tp(cfgp, c, layers, (int)tpn, split, B, nB, C, nC, steps, kdt, idt, seed);
        m3_config_free(c);
        return rc;
    }
    m3_ops ops;
    if (m3_cli_ops_init(&ops, "cuda", 0, "bench")) { m3_config_free(c); return 1; }
    m.ops = &ops;
    m.dw = calloc(1, sizeof *m.dw);
    double t0 = m3_now();
    if (!m.dw || m3_cuda_random_weights(&ops, c, (int)layers, (uint64_t)seed, m.dw, &err)) {
        fprintf(stderr, "m3 bench: %s\n", m.dw ? err.msg : "out of memory");
        free(m.dw);
        m.dw = NULL;
        m3_model_free(&m);
        m3_cli_ops_free(&ops);
        return 1;
    }
    const int full_layers = c->n_layers;
    c->n_layers = (int)layers;
    m3_dspark draft;
    int have_draft = 0;
    memset(&draft, 0, sizeof draft);
    if (dspark_cfg) {
        if (!verify) verify = 7; /* the seed's num_speculative_tokens */
        if (m3_bench_dspark_load(dspark_cfg, &m, full_layers, (uint64_t)seed + 1000, &draft, &err)) {
            fprintf(stderr, "m3 bench: --dspark-config: %s\n", err.msg);
            m3_model_free(&m);
            m3_cli_ops_free(&ops);
            return 1;
        }
        have_draft = 1;
        printf("dspark draft: %s, %d layers, captures target layers", dspark_cfg, draft.cfg.base.n_layers);
        for (int i = 0; i < draft.cfg.n_target; i++) printf(" %d", draft.cfg.target_layers[i]);
        printf(" (spread over the %ld benchmarked), random weights on the GPU\n", layers);
    }
    size_t fr, tot, pk;
    m3_cuda_mem_info(&ops, &fr, &tot, &pk);
    double bw = m3_cuda_copy_bandwidth(&ops, (size_t)2 << 30);
    printf("device: %s\n", m3_cuda_device_name(&ops));
    printf("model: %s, %ld of %d layers, random weights (%.1f GB on the GPU, built in %.1f s); KV %s, index-K %s\n", cfgp,
           layers, c->n_layers, (tot - fr) / 1e9, m3_now() - t0, m3_kv_dtype_name(kdt), m3_kv_dtype_name(idt));
    printf("device copy bandwidth: %.0f GB/s (read + write); precision %s%s\n", bw / 1e9, m3_cli_precision("cuda") ? "bf16" : "exact",
           c->fc1_quant ? "; the routed experts' FC1 input in NVFP4 per token" : "");
    printf("%-7s %-8s %10s %10s %10s %7s %12s %9s %10s\n", "batch", "context", "step_ms", "floor_ms", "MB/step", "ratio",
           "tokens/s", "experts", "mem_GiB");
    fflush(stdout);
    int page = m3_kv_page_tokens(c), V = c->vocab, rc = 0;
    m3_kv_mem mem = m3_model_kv_mem(&m);
    for (int ci = 0; ci < nC; ci++)
        for (int bi = 0; bi < nB; bi++) {
            long ctx = C[ci], nb = B[bi];
            /* with the draft, each timed speculative step moves the sequences verify + 1 on */
            long grow = have_draft ? (steps + 3) * (verify + 1) : 0;
            long ppseq = (ctx + 1 + verify + grow + page - 1) / page, pages = ppseq * nb;
            m3_kv probe;
            if (m3_kv_create(&probe, c, kdt, idt, page, 1, &err)) { fprintf(stderr, "m3 bench: %s\n", err.msg); rc = 1; goto out; }
            double per_page = 0;
            for (int l = 0; l < c->n_layers; l++) per_page += (double)probe.page_bytes[l];
            m3_kv_destroy(&probe);
            m3_cuda_mem_info(&ops, &fr, &tot, &pk);
            double need = per_page * pages + 4.0 * (1 << 30) + (double)nb * V * 4 * 2;
            if (need > (double)fr) {
                printf("%-7ld %-8ld  skipped: the caches of %ld x %ld tokens need %.1f GiB, %.1f GiB free\n", nb, ctx, nb, ctx,
                       per_page * pages / 1073741824.0, fr / 1073741824.0);
                fflush(stdout);
                continue;
            }
            m3_kv kv;
            if (m3_kv_create_in(&kv, c, kdt, idt, page, (int)pages, &mem, &err)) {
                printf("%-7ld %-8ld  skipped: %s\n", nb, ctx, err.msg);
                continue;
            }
            double med = 0, med1 = 0, medv = 0, fl1 = 0, flv = 0;
            long experts = 0;
            int qs[2] = {1, (int)verify + 1}, nq = verify ? 2 : 1;
            for (int qi = 0; qi < nq && !rc; qi++) {
                int q = qs[qi];
                if (time_steps(&m, &kv, &ops, nb, q, ctx, steps, profile, &med, &experts, &err)) {
                    fprintf(stderr, "m3 bench: %s\n", err.msg);
                    rc = 1;
                    break;
                }
                if (qi == 0) med1 = med;
                else medv = med;
                double bytes = weight_bytes(m.dw, experts) + (double)nb * q * kv_bytes(c, c->n_layers, kdt, idt, ctx);
                double floor_s = bytes / bw;
                if (qi == 0) fl1 = floor_s;
                else flv = floor_s;
                m3_cuda_mem_info(&ops, &fr, &tot, &pk);
                if (q == 1)
                    printf("%-7ld %-8ld %10.3f %10.3f %10.1f %6.0f%% %12.1f %9ld %10.1f\n", nb, ctx, med * 1e3, floor_s * 1e3,
                           bytes / 1e6, 100 * floor_s / med, nb / med, experts, (tot - fr) / 1073741824.0);
                else
                    printf("  verify pass of %d tokens per sequence: %.3f ms = %.2f x one decode step (floor %.3f ms, %ld experts "
                           "read); break-even mean accepted length %.2f\n",
                           q, med * 1e3, med / med1, floor_s * 1e3, experts, med / med1);
                if (profile) m3_cuda_profile_report(&ops, 3, stdout);
                m3_cuda_profile(&ops, 0);
                fflush(stdout);
            }
            if (!rc && have_draft) {
                m3_cuda_profile(&ops, 0);
                if (m3_bench_dspark(&m, &kv, &draft, nb, ctx, (int)verify, steps, med1, medv, fl1, flv, bw, profile, &err)) {
                    fprintf(stderr, "m3 bench: dspark: %s\n", err.msg);
                    rc = 1;
                }
                fflush(stdout);
            }
            /* prefill speed once per context: one sequence, `prefill` tokens in chunks of pchunk (the
             * server's --max-num-batched-tokens) */
            if (!rc && bi == nB - 1 && prefill > 0) {
                long n = prefill;
                m3_kv_seq one = {0};
                int32_t *pid = malloc(sizeof(int32_t) * (size_t)n);
                if (pid) {
                    for (long t = 0; t < n; t++) pid[t] = (int32_t)((t * 31 + 7) % V);
                    double a = m3_cuda_sync_time(&ops);
                    if (m3_run_tokens(&m, &kv, &one, pid, (int)n, 0, (int)pchunk, NULL, &err))
                        fprintf(stderr, "m3 bench: prefill: %s\n", err.msg);
                    else {
                        const double el = m3_cuda_sync_time(&ops) - a;
                        printf("prefill: %ld tokens (chunks of %ld, from position 0) in %.3f s = %.0f tokens/s\n", n, pchunk, el,
                               n / el);
                    }
                    m3_kv_seq_release(&kv, &one);
                    if (profile) { /* the same prefill again, per op (events between ops): where its time goes */
                        m3_kv_seq again = {0};
                        m3_cuda_profile(&ops, 1);
                        if (m3_run_tokens(&m, &kv, &again, pid, (int)n, 0, (int)pchunk, NULL, &err))
                            fprintf(stderr, "m3 bench: prefill (profiled): %s\n", err.msg);
                        else {
                            printf("  the same prefill again, per op:\n");
                            m3_cuda_profile_report(&ops, 1, stdout);
                        }
                        m3_cuda_profile(&ops, 0);
                        m3_kv_seq_release(&kv, &again);
                    }
                    free(pid);
                }
            }
            m3_kv_destroy(&kv);
            if (rc) goto out;
        }
    m3_cuda_mem_info(&ops, &fr, &tot, &pk);
out:
    if (have_draft) m3_dspark_free(&draft);
    m3_model_free(&m);
    m3_cli_ops_free(&ops);
    return rc;
}
