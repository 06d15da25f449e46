/* CUDA attention-side kernels against the CPU reference, one decode step of one sparse layer
 * at the M3.1-Flash shapes (4 KV heads of 128, 64 query heads, indexer 4 heads x 128, blocks
 * of 128 keys, top-16): the KV + index-K store, the lightning indexer (block scores + top-k)
 * and the sparse attention over the chosen blocks.
 *
 * Both backends get the same cache: random K, V and index-K rows written through each one's
 * own kv_store (so each rounds them to the cache dtype itself), then the same decode step.
 * Checks: the block choices are equal, or differ only by near-ties (blocks whose double scores are
 * within 1e-5 relative: f32 sums in another order may pick either), and the attention output of
 * the tokens whose choices agree is within 1e-4 relative L2 of the CPU's. Decode steps of 1, 8
 * and 64 sequences, verify passes (8 tokens a sequence) and prefill steps (cases 6-8). Then each GPU op is timed (100
 * calls) and the bytes it reads are reported
 * against the device copy bandwidth: the indexer reads every index-K row of the sequence, the
 * attention the K and V rows of the chosen blocks.
 * usage: bench_cuda_attn [CONFIG.json]   (default tests/data/m3.1-flash-shapes.json)
 * Then the DSpark draft's attention (ops.h dspark_attention: 8 block slots over a sliding window
 * of 4096 context keys in a ring, and over the block's own keys) against the CPU's, 1e-5 relative
 * L2, with the window empty, partly filled, full, and wrapped around the ring; and 2, 4, 8 requests
 * of such contexts in one dspark_attention_n call (a draft pass's), timed against a call each.
 * Each case runs at both precisions (M3_BENCH_PRECISION=exact / bf16: one of them), both backends
 * set alike: exact (f32 queries and probabilities; the GPU's q and P in three bf16 parts), within
 * 1e-4 of the CPU, and bf16 (q, K, V and the probabilities rounded to bf16, attn_mma.cuh's
 * definition, which the CPU computes too), within BF16_TOL: there a probability whose f32 value
 * lies within the two backends' difference of a bf16 midpoint rounds to neighbouring values (2^-8
 * of it), one heavy one in a decode token's row moves its output by ~5e-5 (measured 1e-5 - 4.6e-5,
 * H100); probabilities left unrounded would be ~1.5e-3 off.
 * M3_BENCH_SELFTEST=1 without a GPU: a second CPU backend stands in for it (checks the
 * harness; the times are then the CPU's). M3_BENCH_REPS: timed calls per op (100; 2 in the
 * self-test). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "base/clock.h"
#include "backend/cuda/cuda.h"
#include "io/config.h"
#include "kv/kv.h"

#define BF16_TOL 2.5e-4 /* precision bf16: the GPU against the CPU (header) */

/* the same pseudo-random value for (stream, index) everywhere: both backends see equal inputs */
static float val(uint64_t stream, uint64_t i) {
    uint64_t x = stream * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    return (float)((int64_t)(x >> 11) - (1ll << 52)) / (float)(1ll << 52);
}
static void fill(float *p, size_t n, uint64_t stream, uint64_t first) {
    for (size_t i = 0; i < n; i++) p[i] = val(stream, first + i);
}

typedef struct {
    m3_ops *ops;
    int gpu; /* timing through m3_cuda_sync_time */
    m3_kv kv;
    m3_kv_seq *seqs;
    m3_kv_seq **sp;
} side;

static double sync_time(side *s) { return s->gpu ? m3_cuda_sync_time(s->ops) : m3_now(); }
/* the optional ops (NULL on the CPU) */
static int begin(m3_ops *o, const m3_kv *kv, const m3_batch *b, const int32_t *ids, m3_err *err) {
    return o->begin_step ? o->begin_step(o->ctx, kv, b, ids, err) : 0;
}
static int checked(m3_ops *o, m3_err *err) { return o->check ? o->check(o->ctx, err) : 0; }

static void *dev_copy(m3_ops *o, const void *h, size_t n) {
    void *d = o->alloc(o->ctx, n);
    if (d) o->upload(o->ctx, d, h, n);
    return d;
}

/* nb sequences of ctx cached tokens, written in chunks through kv_store (room for `more` tokens after them) */
static int build(side *s, const m3_config *c, m3_kv_dtype dt, int nb, int ctx, int more, m3_err *err) {
    const int page = m3_kv_page_tokens(c), D = c->head_dim, nkv = c->n_kv_heads, Di = c->index_dim;
    const int pages = nb * ((ctx + more + page - 1) / page);
    m3_kv_mem mem = {s->ops->alloc, s->ops->release, s->ops->ctx};
    if (m3_kv_create_in(&s->kv, c, dt, dt, page, pages, &mem, err)) return -1;
    s->seqs = calloc((size_t)nb, sizeof *s->seqs);
    s->sp = calloc((size_t)nb, sizeof *s->sp);
    if (!s->seqs || !s->sp) return m3_errf(err, "out of memory");
    const int C = 1024;
    float *k = malloc(sizeof(float) * (size_t)C * nkv * D), *v = malloc(sizeof(float) * (size_t)C * nkv * D);
    float *ik = malloc(sizeof(float) * (size_t)C * Di);
    int32_t *pos = malloc(sizeof(int32_t) * C * 3), *sq = pos + C, *ids = sq + C;
    if (!k || !v || !ik || !pos) return m3_errf(err, "out of memory");
    int rc = 0;
    for (int q = 0; q < nb && !rc; q++) {
        s->sp[q] = &s->seqs[q];
        if (m3_kv_seq_reserve(&s->kv, &s->seqs[q], ctx + more, err)) { rc = -1; break; }
        for (int p0 = 0; p0 < ctx && !rc; p0 += C) {
            const int T = ctx - p0 < C ? ctx - p0 : C;
            for (int t = 0; t < T; t++) { pos[t] = p0 + t; sq[t] = q; ids[t] = 0; }
            fill(k, (size_t)T * nkv * D, 1000 + q, (uint64_t)p0 * nkv * D);
            fill(v, (size_t)T * nkv * D, 2000 + q, (uint64_t)p0 * nkv * D);
            fill(ik, (size_t)T * Di, 3000 + q, (uint64_t)p0 * Di);
            m3_batch b = {T, pos, sq, s->sp};
            float *dk = dev_copy(s->ops, k, sizeof(float) * (size_t)T * nkv * D);
            float *dv = dev_copy(s->ops, v, sizeof(float) * (size_t)T * nkv * D);
            float *dik = dev_copy(s->ops, ik, sizeof(float) * (size_t)T * Di);
            if (!dk || !dv || !dik) rc = m3_errf(err, "out of backend memory");
            if (!rc) rc = begin(s->ops, &s->kv, &b, ids, err);
            if (!rc) s->ops->kv_store(s->ops->ctx, &s->kv, 0, &b, dk, dv, dik);
            if (!rc) rc = checked(s->ops, err);
            sync_time(s);
            s->ops->release(s->ops->ctx, dk);
            s->ops->release(s->ops->ctx, dv);
            s->ops->release(s->ops->ctx, dik);
        }
        s->seqs[q].len = ctx;
    }
    free(k); free(v); free(ik); free(pos);
    return rc;
}

static void teardown(side *s, int nb) {
    for (int q = 0; s->seqs && q < nb; q++) m3_kv_seq_release(&s->kv, &s->seqs[q]);
    free(s->seqs); free(s->sp);
    m3_kv_destroy(&s->kv);
    memset(&s->kv, 0, sizeof s->kv);
    s->seqs = NULL;
    s->sp = NULL;
}

/* the block score in double from the CPU side's cache: max over the keys of block blk visible at
 * position p of sequence sq of iq . ik (head g of token t's index query, as step() fills it) */
static double ref_score(side *s, const m3_config *c, int t, int g, int sq, int p, int blk) {
    const int Di = c->index_dim, ni = c->index_heads, B = c->block_size;
    float *iq = malloc(sizeof(float) * (size_t)ni * Di), *row = malloc(sizeof(float) * (size_t)Di);
    double best = -INFINITY;
    if (iq && row) {
        fill(iq, (size_t)ni * Di, 5000 + t, 0);
        for (int k = blk * B; k < blk * B + B && k <= p; k++) {
            m3_kv_load(&s->kv, &s->seqs[sq], 0, M3_KV_IK, 0, k, 1, row);
            double d = 0;
            for (int i = 0; i < Di; i++) d += (double)iq[(size_t)g * Di + i] * row[i];
            if (d > best) best = d;
        }
    }
    free(iq);
    free(row);
    return best;
}

/* A row whose choices differ is a near-tie when every block only one side picked scores within
 * 1e-5 (relative) of a block only the other side picked, in double: f32 sums in another order
 * may then choose either. *margin: the largest relative gap that had to be excused. */
static int near_tie(side *s, const m3_config *c, const int32_t *a, const int32_t *b, int t, int g, int sq, int p, double *margin) {
    const int topk = c->topk_blocks;
    int ok = 1;
    for (int i = 0; i < topk; i++) {
        int in_b = 0;
        for (int j = 0; j < topk; j++) in_b |= a[i] == b[j];
        if (in_b || a[i] < 0) continue;
        const double sa = ref_score(s, c, t, g, sq, p, a[i]);
        int tied = 0;
        for (int j = 0; j < topk; j++) {
            int in_a = 0;
            for (int k = 0; k < topk; k++) in_a |= b[j] == a[k];
            if (in_a || b[j] < 0) continue;
            const double sb = ref_score(s, c, t, g, sq, p, b[j]), gap = fabs(sa - sb) / fmax(fabs(sa), fabs(sb));
            if (gap <= 1e-5) {
                tied = 1;
                if (gap > *margin) *margin = gap;
            }
        }
        ok &= tied;
    }
    return ok;
}

/* one step of ntok tokens per sequence at positions ctx .. ctx + ntok - 1 (1: a decode step, 8:
 * a verify pass); outputs on the host. With reps, also the op times (seconds per call) of
 * kv_store, index_select, attention. */
static int step(side *s, const m3_config *c, int nb, int ntok, int ctx, int32_t *sel_h, float *out_h, int reps, double *ts,
                m3_err *err) {
    const int T = nb * ntok, D = c->head_dim, nkv = c->n_kv_heads, nh = c->n_heads, Di = c->index_dim, ni = c->index_heads;
    const int topk = c->topk_blocks, B = c->block_size;
    int32_t *pos = malloc(sizeof(int32_t) * T * 3), *sq = pos + T, *ids = sq + T;
    float *h = malloc(sizeof(float) * (size_t)T * (2 * nkv * D + Di + nh * D + ni * Di));
    if (!pos || !h) return m3_errf(err, "out of memory");
    for (int t = 0; t < T; t++) { pos[t] = ctx + t % ntok; sq[t] = t / ntok; ids[t] = 0; }
    float *k = h, *v = k + (size_t)T * nkv * D, *ik = v + (size_t)T * nkv * D, *q = ik + (size_t)T * Di, *iq = q + (size_t)T * nh * D;
    for (int t = 0; t < T; t++) {
        fill(k + (size_t)t * nkv * D, (size_t)nkv * D, 1000 + sq[t], (uint64_t)pos[t] * nkv * D);
        fill(v + (size_t)t * nkv * D, (size_t)nkv * D, 2000 + sq[t], (uint64_t)pos[t] * nkv * D);
        fill(ik + (size_t)t * Di, (size_t)Di, 3000 + sq[t], (uint64_t)pos[t] * Di);
        fill(q + (size_t)t * nh * D, (size_t)nh * D, 4000 + t, 0);
        fill(iq + (size_t)t * ni * Di, (size_t)ni * Di, 5000 + t, 0);
    }
    m3_ops *o = s->ops;
    float *dk = dev_copy(o, k, sizeof(float) * (size_t)T * nkv * D), *dv = dev_copy(o, v, sizeof(float) * (size_t)T * nkv * D);
    float *dik = dev_copy(o, ik, sizeof(float) * (size_t)T * Di), *dq = dev_copy(o, q, sizeof(float) * (size_t)T * nh * D);
    float *diq = dev_copy(o, iq, sizeof(float) * (size_t)T * ni * Di);
    int32_t *dsel = o->alloc(o->ctx, sizeof(int32_t) * (size_t)T * ni * topk);
    float *dout = o->alloc(o->ctx, sizeof(float) * (size_t)T * nh * D);
    int rc = !dk || !dv || !dik || !dq || !diq || !dsel || !dout ? m3_errf(err, "out of backend memory") : 0;
    m3_batch b = {T, pos, sq, s->sp};
    if (!rc) rc = begin(o, &s->kv, &b, ids, err);
    if (!rc) {
        o->kv_store(o->ctx, &s->kv, 0, &b, dk, dv, dik);
        o->index_select(o->ctx, &s->kv, 0, &b, diq, ni, B, topk, c->local_blocks, c->init_blocks, dsel);
        o->attention(o->ctx, &s->kv, 0, &b, dq, nh, dsel, B, topk, dout);
        rc = checked(o, err);
    }
    if (!rc) {
        o->download(o->ctx, sel_h, dsel, sizeof(int32_t) * (size_t)T * ni * topk);
        o->download(o->ctx, out_h, dout, sizeof(float) * (size_t)T * nh * D);
    }
    for (int op = 0; !rc && reps && op < 3; op++) {
        double a = sync_time(s);
        for (int r = 0; r < reps; r++) {
            if (op == 0) o->kv_store(o->ctx, &s->kv, 0, &b, dk, dv, dik);
            else if (op == 1) o->index_select(o->ctx, &s->kv, 0, &b, diq, ni, B, topk, c->local_blocks, c->init_blocks, dsel);
            else o->attention(o->ctx, &s->kv, 0, &b, dq, nh, dsel, B, topk, dout);
        }
        ts[op] = (sync_time(s) - a) / reps;
        rc = checked(o, err);
    }
    o->release(o->ctx, dk); o->release(o->ctx, dv); o->release(o->ctx, dik); o->release(o->ctx, dq);
    o->release(o->ctx, diq); o->release(o->ctx, dsel); o->release(o->ctx, dout);
    free(pos); free(h);
    return rc;
}

/* DSpark draft attention: n slots at pos = len over the context [lo, len) (ring of cap rows) and
 * the block's n keys; *rel the GPU's relative L2 against the CPU's, *us the GPU's time a call */
static int dspark_case(side *sc, side *sg, const m3_config *c, int n, int len, int lo, int window, int reps, double *rel,
                       double *us, m3_err *err) {
    const int nh = c->n_heads, nkv = c->n_kv_heads, D = c->head_dim, cap = window;
    const size_t nq = (size_t)n * nh * D, nb = (size_t)n * nkv * D, nr = (size_t)cap * nkv * D;
    float *h = malloc(sizeof(float) * (2 * nq + 2 * nb + 2 * nr + nq));
    if (!h) return m3_errf(err, "out of memory");
    float *q = h, *kb = q + nq, *vb = kb + nb, *kr = vb + nb, *vr = kr + nr, *oc = vr + nr, *og = oc + nq;
    fill(q, nq, 41, 0); fill(kb, nb, 42, 0); fill(vb, nb, 43, 0); fill(kr, nr, 44, 0); fill(vr, nr, 45, 0);
    sc->ops->dspark_attention(sc->ops->ctx, q, kb, vb, n, nh, nkv, D, kr, vr, cap, lo, len, len, window, oc);
    m3_ops *g = sg->ops;
    float *dq = dev_copy(g, q, sizeof(float) * nq), *dkb = dev_copy(g, kb, sizeof(float) * nb),
          *dvb = dev_copy(g, vb, sizeof(float) * nb), *dkr = dev_copy(g, kr, sizeof(float) * nr),
          *dvr = dev_copy(g, vr, sizeof(float) * nr), *dout = g->alloc(g->ctx, sizeof(float) * nq);
    int rc = !dq || !dkb || !dvb || !dkr || !dvr || !dout ? m3_errf(err, "out of device memory") : 0;
    if (!rc) {
        g->dspark_attention(g->ctx, dq, dkb, dvb, n, nh, nkv, D, dkr, dvr, cap, lo, len, len, window, dout);
        rc = checked(g, err);
    }
    if (!rc) {
        g->download(g->ctx, og, dout, sizeof(float) * nq);
        double num = 0, den = 0;
        for (size_t i = 0; i < nq; i++) {
            const double d = (double)og[i] - oc[i];
            num += d * d;
            den += (double)oc[i] * oc[i];
        }
        *rel = sqrt(num / (den > 0 ? den : 1));
        const double t0 = sync_time(sg);
        for (int r = 0; r < reps; r++) g->dspark_attention(g->ctx, dq, dkb, dvb, n, nh, nkv, D, dkr, dvr, cap, lo, len, len, window, dout);
        *us = reps ? (sync_time(sg) - t0) / reps * 1e6 : 0;
        rc = checked(g, err);
    }
    void *bufs[6] = {dq, dkb, dvb, dkr, dvr, dout};
    for (int i = 0; i < 6; i++)
        if (bufs[i]) g->release(g->ctx, bufs[i]);
    free(h);
    return rc;
}

/* dspark_attention_n: nreq requests of n slots in one call, request r's context lengths cycling
 * through empty, short, a full window and one wrapped around its ring, against the CPU one
 * request at a time; *us the batched call's time, *us1 nreq single calls' */
static int dspark_batch_case(side *sc, side *sg, const m3_config *c, int n, int nreq, int reps, double *rel, double *us,
                             double *us1, m3_err *err) {
    const int nh = c->n_heads, nkv = c->n_kv_heads, D = c->head_dim, cap = 4096, window = 4096;
    static const int lens[4][2] = {{4096, 0}, {100, 0}, {9000, 9000 - 4095}, {0, 0}};
    const size_t nq = (size_t)n * nh * D, nb = (size_t)n * nkv * D, nr = (size_t)cap * nkv * D, R = (size_t)nreq;
    m3_ops *g = sg->ops;
    if (!g->dspark_attention_n) return m3_errf(err, "the GPU backend has no dspark_attention_n");
    float *h = malloc(sizeof(float) * (R * (3 * nq + 2 * nb) + 2 * nr));
    float *d = g->alloc(g->ctx, sizeof(float) * (R * (2 * nq + 2 * nb + 2 * nr)));
    m3_dspark_attn_req *rq = malloc(sizeof *rq * R);
    int rc = !h || !d || !rq ? m3_errf(err, "out of memory") : 0;
    float *q = h, *kb = q + R * nq, *vb = kb + R * nb, *oc = vb + R * nb, *og = oc + R * nq, *kr = og + R * nq, *vr = kr + nr;
    float *dq = d, *dkb = dq + R * nq, *dvb = dkb + R * nb, *dout = dvb + R * nb, *dr = dout + R * nq;
    if (!rc) {
        fill(q, R * nq, 51, 0); fill(kb, R * nb, 52, 0); fill(vb, R * nb, 53, 0);
        g->upload(g->ctx, dq, q, sizeof(float) * R * nq);
        g->upload(g->ctx, dkb, kb, sizeof(float) * R * nb);
        g->upload(g->ctx, dvb, vb, sizeof(float) * R * nb);
        for (int r = 0; r < nreq; r++) { /* each request its own rings */
            fill(kr, nr, 60 + 2 * r, 0); fill(vr, nr, 61 + 2 * r, 0);
            const int len = lens[r % 4][0], lo = lens[r % 4][1];
            sc->ops->dspark_attention(sc->ops->ctx, q + r * nq, kb + r * nb, vb + r * nb, n, nh, nkv, D, kr, vr, cap, lo, len, len,
                                      window, oc + r * nq);
            float *dk = dr + 2 * r * nr, *dv = dk + nr;
            g->upload(g->ctx, dk, kr, sizeof(float) * nr);
            g->upload(g->ctx, dv, vr, sizeof(float) * nr);
            rq[r] = (m3_dspark_attn_req){dk, dv, cap, lo, len, len};
        }
        g->dspark_attention_n(g->ctx, nreq, rq, dq, dkb, dvb, n, nh, nkv, D, window, dout);
        rc = checked(g, err);
    }
    if (!rc) {
        g->download(g->ctx, og, dout, sizeof(float) * R * nq);
        double worst = 0;
        for (int r = 0; r < nreq; r++) {
            double num = 0, den = 0;
            for (size_t i = r * nq; i < (r + 1) * nq; i++) {
                const double e = (double)og[i] - oc[i];
                num += e * e;
                den += (double)oc[i] * oc[i];
            }
            const double x = sqrt(num / (den > 0 ? den : 1));
            worst = x > worst ? x : worst;
        }
        *rel = worst;
        double t0 = sync_time(sg);
        for (int i = 0; i < reps; i++) g->dspark_attention_n(g->ctx, nreq, rq, dq, dkb, dvb, n, nh, nkv, D, window, dout);
        *us = reps ? (sync_time(sg) - t0) / reps * 1e6 : 0;
        t0 = sync_time(sg);
        for (int i = 0; i < reps; i++)
            for (int r = 0; r < nreq; r++)
                g->dspark_attention(g->ctx, dq + r * nq, dkb + r * nb, dvb + r * nb, n, nh, nkv, D, rq[r].kr, rq[r].vr, cap,
                                    rq[r].lo, rq[r].len, rq[r].pos, window, dout + r * nq);
        *us1 = reps ? (sync_time(sg) - t0) / reps * 1e6 : 0;
        rc = checked(g, err);
    }
    if (d) g->release(g->ctx, d);
    free(h);
    free(rq);
    return rc;
}

int main(int argc, char **argv) {
    const char *cfgp = argc > 1 ? argv[1] : "tests/data/m3.1-flash-shapes.json";
    m3_err err;
    m3_config c;
    if (m3_config_load(&c, cfgp, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    c.n_layers = 1; /* one sparse layer */
    if (!c.index_heads || !c.topk_blocks) { fprintf(stderr, "%s: not a sparse-attention config\n", cfgp); return 1; }
    m3_ops cpu, g;
    side sc = {&cpu, 0, {0}, NULL, NULL}, sg = {&g, 1, {0}, NULL, NULL};
    if (m3_cpu_ops_init(&cpu, 0, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    double bw = 0;
    if (m3_cuda_ops_init(&g, 0, &err)) {
        if (!getenv("M3_BENCH_SELFTEST")) { fprintf(stderr, "%s\n", err.msg); return 1; }
        if (m3_cpu_ops_init(&g, 0, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        sg.gpu = 0;
        printf("self-test: a second CPU backend in place of the GPU (times are not GPU times)\n");
    } else {
        bw = m3_cuda_copy_bandwidth(&g, (size_t)2 << 30);
        printf("device: %s; copy bandwidth %.0f GB/s\n", m3_cuda_device_name(&g), bw / 1e9);
    }
    printf("layer: %d query heads, %d KV heads of %d, indexer %d x %d, blocks of %d keys, top %d\n", c.n_heads, c.n_kv_heads,
           c.head_dim, c.index_heads, c.index_dim, c.block_size, c.topk_blocks);
    printf("%-6s %7s %5s %3s %12s %10s | %9s | %9s %8s %6s | %9s %8s %6s\n", "kv", "context", "batch", "tok", "blocks_equal",
           "attn_rel", "store_us", "index_us", "GB/s", "of_bw", "attn_us", "GB/s", "of_bw");
    const int reps = getenv("M3_BENCH_REPS") ? atoi(getenv("M3_BENCH_REPS")) : sg.gpu ? 100 : 2; /* timed calls per op */
    const m3_kv_dtype dts[3] = {M3_KV_BF16, M3_KV_FP8, M3_KV_NVFP4};
    /* context, sequences, tokens per sequence (8: a verify pass); a case with the previous one's
     * context and sequences reuses its cache (M3_BENCH_QUICK=1: the first three only; M3_BENCH_KV=bf16:
     * that cache dtype only; M3_BENCH_CASE=i: case i only) */
    /* the last three: prefill steps (token tiles, attention_tile.cu): 1024 tokens of a new sequence (every
     * block chosen), 512 tokens after 4096 (16 of 36 blocks), and 100 tokens of each of 3 sequences
     * after 2000 (tiles across sequences; the selection starts to choose at 2048) */
    const int cases[][3] = {{8192, 1, 1}, {8192, 8, 1}, {8192, 8, 8}, {8192, 64, 1}, {8192, 64, 8}, {131072, 1, 1},
                            {0, 1, 1024}, {4096, 1, 512}, {2000, 3, 100}};
    const int ncases = getenv("M3_BENCH_QUICK") && atoi(getenv("M3_BENCH_QUICK")) ? 3 : (int)(sizeof cases / sizeof cases[0]);
    const int one = getenv("M3_BENCH_CASE") ? atoi(getenv("M3_BENCH_CASE")) : -1; /* that case only (0-8) */
    int fails = 0;
    const char *only = getenv("M3_BENCH_KV"); /* one cache dtype only (bf16, fp8, nvfp4) */
    const char *ponly = getenv("M3_BENCH_PRECISION"); /* one precision only (exact, bf16) */
    if (ponly && strcmp(ponly, "exact") && strcmp(ponly, "bf16")) {
        fprintf(stderr, "M3_BENCH_PRECISION=%s: the precisions are exact and bf16\n", ponly);
        return 2;
    }
    for (int pi = 0; pi < 2; pi++) {
    if (ponly && strcmp(ponly, pi ? "bf16" : "exact")) continue;
    m3_cpu_set_precision(&cpu, pi);
    if (sg.gpu) m3_cuda_set_precision(&g, pi);
    else m3_cpu_set_precision(&g, pi);
    printf("precision %s\n", pi ? "bf16" : "exact");
    for (int di = 0; di < 3; di++)
        for (int ci = 0; ci < ncases && (!only || !strcmp(only, m3_kv_dtype_name(dts[di]))); ci++) {
            if (one >= 0 && ci != one) continue;
            const int ctx = cases[ci][0], nb = cases[ci][1], ntok = cases[ci][2], ni = c.index_heads, topk = c.topk_blocks;
            const int T = nb * ntok, last = one >= 0 || ci + 1 == ncases || cases[ci + 1][0] != ctx || cases[ci + 1][1] != nb;
            const int fresh = one >= 0 || ci == 0 || cases[ci - 1][0] != ctx || cases[ci - 1][1] != nb;
            const size_t nsel = (size_t)T * ni * topk, nout = (size_t)T * c.n_heads * c.head_dim;
            int32_t *selc = malloc(sizeof(int32_t) * nsel), *selg = malloc(sizeof(int32_t) * nsel);
            float *outc = malloc(sizeof(float) * nout), *outg = malloc(sizeof(float) * nout);
            double ts[3] = {0, 0, 0}, dummy[3];
            int rc = !selc || !selg || !outc || !outg ? m3_errf(&err, "out of memory") : 0;
            int more = ntok; /* room for the steps of the cases that reuse this cache */
            for (int cj = ci + 1; cj < ncases && cases[cj][0] == ctx && cases[cj][1] == nb; cj++)
                if (cases[cj][2] > more) more = cases[cj][2];
            if (!rc && fresh) rc = build(&sc, &c, dts[di], nb, ctx, more, &err) || build(&sg, &c, dts[di], nb, ctx, more, &err);
            if (!rc)
                rc = step(&sc, &c, nb, ntok, ctx, selc, outc, 0, dummy, &err) ||
                     step(&sg, &c, nb, ntok, ctx, selg, outg, reps, ts, &err);
            if (rc) {
                printf("%-6s %7d %5d %3d  FAILED: %s\n", m3_kv_dtype_name(dts[di]), ctx, nb, ntok, err.msg);
                fails++;
            } else {
                size_t eq = 0;
                for (size_t i = 0; i < nsel; i++) eq += selc[i] == selg[i];
                /* rows that differ: each must be a near-tie (printed with its gap) */
                int ties = 0, bad = 0;
                double margin = 0;
                for (size_t r0 = 0; r0 < nsel; r0 += topk)
                    if (memcmp(selc + r0, selg + r0, sizeof(int32_t) * topk)) {
                        const int t = (int)(r0 / topk / ni), g2 = (int)(r0 / topk % ni);
                        const int tie = near_tie(&sc, &c, selc + r0, selg + r0, t, g2, t / ntok, ctx + t % ntok, &margin) &&
                                        near_tie(&sc, &c, selg + r0, selc + r0, t, g2, t / ntok, ctx + t % ntok, &margin);
                        ties += tie;
                        bad += !tie;
                        if (!tie || ties <= 2) {
                            printf("  token %d head %d (%s): cpu", t, g2, tie ? "near-tie" : "NOT a near-tie");
                            for (int j = 0; j < topk; j++) printf(" %d", selc[r0 + j]);
                            printf(" | gpu");
                            for (int j = 0; j < topk; j++) printf(" %d", selg[r0 + j]);
                            printf("\n");
                        }
                    }
                if (ties) printf("  %d rows differ by near-ties (largest gap %.2e)\n", ties, margin);
                /* the attention output of the tokens whose choices agree (a near-tie changes its token's) */
                double num = 0, den = 0;
                const size_t per = (size_t)c.n_heads * c.head_dim;
                for (int t = 0; t < T; t++) {
                    if (memcmp(selc + (size_t)t * ni * topk, selg + (size_t)t * ni * topk, sizeof(int32_t) * ni * topk)) continue;
                    for (size_t i = (size_t)t * per; i < (size_t)(t + 1) * per; i++) {
                        double d = (double)outg[i] - outc[i];
                        num += d * d;
                        den += (double)outc[i] * outc[i];
                    }
                }
                const double rel = sqrt(num / (den > 0 ? den : 1));
                /* bytes read: every index-K row of each sequence once (what the tokens of a sequence
                 * need at least); K and V of each token's chosen blocks */
                const double ib = (double)nb * (ctx + ntok) * (double)m3_kv_row_bytes(dts[di], c.index_dim);
                long keys = 0;
                for (int t = 0; t < T; t++)
                    for (int g2 = 0; g2 < c.n_kv_heads && g2 < ni; g2++)
                        for (int j = 0; j < topk; j++) {
                            const int blk = selg[((size_t)t * ni + g2) * topk + j], p = ctx + t % ntok;
                            if (blk >= 0) keys += blk * c.block_size + c.block_size <= p + 1 ? c.block_size : p + 1 - blk * c.block_size;
                        }
                const double ab = 2.0 * (double)keys * (double)m3_kv_row_bytes(dts[di], c.head_dim);
                const int ok = !bad && rel < (pi ? BF16_TOL : 1e-4);
                if (!ok) fails++;
                printf("%-6s %7d %5d %3d %6zu/%-5zu %10.2e | %9.1f | %9.1f %8.0f %5.0f%% | %9.1f %8.0f %5.0f%% %s\n",
                       m3_kv_dtype_name(dts[di]), ctx, nb, ntok, eq, nsel, rel, ts[0] * 1e6, ts[1] * 1e6, ib / ts[1] / 1e9,
                       bw > 0 ? 100 * ib / ts[1] / bw : 0.0, ts[2] * 1e6, ab / ts[2] / 1e9, bw > 0 ? 100 * ab / ts[2] / bw : 0.0,
                       ok ? "" : "FAIL");
            }
            fflush(stdout);
            if (rc || last) {
                teardown(&sc, nb);
                teardown(&sg, nb);
            }
            free(selc); free(selg); free(outc); free(outg);
            if (rc && !last) /* the cache is gone: skip to the next context */
                while (ci + 1 < ncases && cases[ci + 1][0] == ctx && cases[ci + 1][1] == nb) ci++;
        }
    }
    /* the DSpark draft's attention: window empty, short, full, wrapped around the ring */
    if (!sg.ops->dspark_attention) {
        printf("dspark attention: the GPU backend has none: FAIL\n");
        fails++;
    } else {
        /* {context, first readable position, window}; the last: 313 key chunks, more than one
         * tile of the combine's weights (DSA_WT, dspark_attention.cu) */
        const int dcases[][3] = {{0, 0, 4096}, {100, 0, 4096}, {4096, 0, 4096}, {9000, 9000 - 4095, 4096}, {20000, 0, 20000}};
        printf("dspark attention (8 slots, %d query / %d KV heads of %d): context  window  rel_l2  us\n",
               c.n_heads, c.n_kv_heads, c.head_dim);
        for (int k = 0; k < 5; k++) {
            double rel = 0, us = 0;
            if (dspark_case(&sc, &sg, &c, 8, dcases[k][0], dcases[k][1], dcases[k][2], reps, &rel, &us, &err)) {
                printf("  %5d  FAILED: %s\n", dcases[k][0], err.msg);
                fails++;
                continue;
            }
            const int ok = rel < 1e-5;
            fails += !ok;
            printf("  %5d  %6d  %.2e  %.1f %s\n", dcases[k][0], dcases[k][2], rel, us, ok ? "" : "FAIL");
        }
    }
    if (sg.ops->dspark_attention) { /* the requests of a draft pass in one call */
        printf("dspark attention, requests in one call (8 slots each; contexts 4096, 100, 9000 wrapped, 0, ...):\n"
               "  requests  rel_l2  us (one call)  us (a call each)\n");
        for (int nreq = 2; nreq <= 8; nreq *= 2) {
            double rel = 0, us = 0, us1 = 0;
            if (dspark_batch_case(&sc, &sg, &c, 8, nreq, reps, &rel, &us, &us1, &err)) {
                printf("  %d  FAILED: %s\n", nreq, err.msg);
                fails++;
                continue;
            }
            const int ok = rel < 1e-5;
            fails += !ok;
            printf("  %8d  %.2e  %.1f  %.1f %s\n", nreq, rel, us, us1, ok ? "" : "FAIL");
        }
    }
    printf("%s\n", fails ? "some checks FAILED" : "all attention checks passed");
    if (sg.gpu) m3_cuda_ops_free(&g);
    else m3_cpu_ops_free(&g);
    m3_cpu_ops_free(&cpu);
    return fails ? 1 : 0;
}
