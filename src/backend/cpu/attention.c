/* Attention on the CPU: causal attention over the paged KV cache (dense, or the blocks the
 * indexer selected), online softmax; and the DSpark draft's attention over its ring + block. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/attn_pow2.h"
#include "base/num.h"
#include "cpu.h"

typedef struct {
    const m3_kv *kv;
    int layer;
    const m3_batch *b;
    const float *q;
    int nh;
    const int32_t *sel;
    int block, topk;
    float *out;
    m3_cpu *c;
} att_job;

#define CHUNK 64

/* Near-tie recording (m3_cpu_ties, precision bf16): a probability p = 2^(s2 - M) rounds to bf16
 * at a midpoint within ulps (2 + |s2|) f32 ulps (its error grows with the score's magnitude: s2's
 * absolute f32 error, ~|s2| 2^-23 times a few, is p's relative error over ln 2), and it counts for
 * its token only where it weighs TIE_P_WEIGHT of its row or more at the end (a bf16 flip of it
 * then moves the head's output by >= 2^-8 of that: 4e-6), so that the many light ones do not
 * excuse every position. q's elements count like any GEMM input's. */
#define TIE_P_WEIGHT 1e-3f
static int near_tie_p(float p, float s2, int ulps) {
    const int32_t d = (int32_t)(m3_f32_bits(p) & 0xffffu) - 0x8000;
    const float w = (float)ulps * (2.0f + fabsf(s2));
    return (float)d >= -w && (float)d <= w;
}

/* Precision bf16 (what the GPU's tensor-core attention computes, src/backend/cuda/attn_mma.cuh):
 * q, K and V rounded to bf16 (a bf16 / FP8 / NVFP4 cache's values already are), scores in log2
 * units s2 = (q . k) * (log2(e) / sqrt(D)), an integer running max M, each probability
 * P = bf16(2^(s2 - M)) summed as rounded: out = sum P v / sum P, whatever order the keys come in
 * (the powers of two that rescale the sums commute with the rounding). Exact precision: f32 q,
 * softmax in e^x, as the float64 reference. */
static void att_items(void *arg, size_t i0, size_t i1, int worker) {
    (void)worker;
    att_job *j = arg;
    const m3_kv *kv = j->kv;
    const int D = kv->D, nkv = kv->nkv, G = j->nh / nkv, rb = j->c->gemm_bf16;
    const float scale = 1.0f / sqrtf((float)D), sl = rb ? scale * M3_LOG2E_F : scale;
    /* f32 / bf16 rows are read in place (f32 at precision exact); others are dequantized (and
     * rounded to bf16: f32 at precision bf16) into kbuf / vbuf */
    const int direct = (kv->dt == M3_KV_F32 && !rb) || kv->dt == M3_KV_BF16, bf16 = kv->dt == M3_KV_BF16;
    m3_cpu_ties *tr = rb ? j->c->ties : NULL;
    float *st = m3_cpu_scratch(j->c, sizeof(float) * ((size_t)G * (3 + 2 * D + CHUNK) + (direct ? 0 : 2 * (size_t)CHUNK * D)),
                               "attention");
    if (!st) return;
    float *m = st, *l = st + G, *acc = st + 2 * G, *qr = acc + (size_t)G * D, *sc = qr + (size_t)G * D;
    float *tw = sc + CHUNK + (direct ? 0 : 2 * (size_t)CHUNK * D); /* [G] near-tie weights (below) */
    float *kbuf = sc + CHUNK, *vbuf = kbuf + (size_t)CHUNK * D;
    for (size_t it = i0; it < i1; it++) {
        int t = (int)(it / nkv), g = (int)(it % nkv);
        int pos = j->b->pos[t];
        const m3_kv_seq *s = j->b->seqs[j->b->seq[t]];
        for (int h = 0; h < G; h++) { m[h] = -INFINITY; l[h] = 0; tw[h] = 0; }
        memset(acc, 0, sizeof(float) * (size_t)G * D);
        const float *q = j->q + ((size_t)t * j->nh + (size_t)g * G) * D; /* the group's G query rows */
        int32_t *tie_t = tr && t < tr->T ? &tr->all[t] : NULL; /* (items of one token run on several threads) */
        if (tie_t) __atomic_fetch_add(tie_t, m3_cpu_bf16_ties(q, G * D, tr->ulps), __ATOMIC_RELAXED);
        if (rb) {
            for (int i = 0; i < G * D; i++) qr[i] = m3_bf16_round(q[i]);
            q = qr;
        }
        /* visit key ranges: all of [0, pos] (dense) or the selected blocks (sparse) */
        int nranges = j->sel ? j->topk : 1;
        for (int r = 0; r < nranges; r++) {
            int a, e;
            if (j->sel) {
                int32_t blk = j->sel[((size_t)t * nkv + g) * j->topk + r];
                if (blk < 0) continue;
                a = blk * j->block;
                e = a + j->block;
            } else {
                a = 0;
                e = pos + 1;
            }
            if (e > pos + 1) e = pos + 1;
            for (int c0 = a, n; c0 < e; c0 += n) {
                /* K and V rows read in place: at most CHUNK, within one page */
                const void *kb = m3_kv_rows(kv, s, j->layer, M3_KV_K, g, c0, &n);
                const void *vb = m3_kv_rows(kv, s, j->layer, M3_KV_V, g, c0, &n);
                if (n > e - c0) n = e - c0;
                if (n > CHUNK) n = CHUNK;
                if (!direct) {
                    m3_kv_load(kv, s, j->layer, M3_KV_K, g, c0, n, kbuf);
                    m3_kv_load(kv, s, j->layer, M3_KV_V, g, c0, n, vbuf);
                    if (rb && kv->dt == M3_KV_F32)
                        for (size_t i = 0; i < (size_t)n * D; i++) { kbuf[i] = m3_bf16_round(kbuf[i]); vbuf[i] = m3_bf16_round(vbuf[i]); }
                    kb = kbuf;
                    vb = vbuf;
                }
                for (int h = 0; h < G; h++) {
                    float mx = m[h];
                    m3_cpu_dots(q + (size_t)h * D, kb, direct && bf16, n, D, sc);
                    for (int i = 0; i < n; i++) {
                        sc[i] *= sl;
                        if (sc[i] > mx) mx = sc[i];
                    }
                    float *ah = acc + (size_t)h * D;
                    float sum = 0;
                    if (rb) {
                        mx = ceilf(mx);
                        const float corr = m3_pow2_int(m[h] - mx); /* 0 on the first chunk (m = -inf) */
                        if (corr != 1.0f) for (int d = 0; d < D; d++) ah[d] *= corr;
                        tw[h] *= corr;
                        for (int i = 0; i < n; i++) {
                            const float p = exp2f(sc[i] - mx);
                            if (tie_t && p > tw[h] && near_tie_p(p, sc[i], tr->ulps)) tw[h] = p;
                            sc[i] = m3_bf16_round(p);
                            sum += sc[i];
                        }
                        l[h] = l[h] * corr + sum;
                    } else {
                        const float corr = expf(m[h] - mx); /* 0 on the first chunk (m = -inf) */
                        if (corr != 1.0f) for (int d = 0; d < D; d++) ah[d] *= corr;
                        sum = m3_cpu_exp_shift(sc, n, mx); /* online softmax, flash style */
                        l[h] = l[h] * corr + sum;
                    }
                    m3_cpu_pv(ah, sc, vb, direct && bf16, n, D);
                    m[h] = mx;
                }
            }
        }
        for (int h = 0; h < G; h++) {
            float *o = j->out + ((size_t)t * j->nh + (size_t)g * G + h) * D;
            float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
            if (tie_t && tw[h] * inv >= TIE_P_WEIGHT) __atomic_fetch_add(tie_t, 1, __ATOMIC_RELAXED);
            for (int d = 0; d < D; d++) o[d] = acc[(size_t)h * D + d] * inv;
        }
    }
    free(st);
}

void m3_cpu_attention(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *q, int nh,
                      const int32_t *sel, int block, int topk, float *out) {
    m3_cpu *c = ctx;
    att_job j = {kv, layer, b, q, nh, sel, block, topk, out, c};
    m3_pool_for(c->pool, (size_t)b->T * kv->nkv, 1, att_items, &j);
}

/* ------------------------------------------------------------------ DSpark draft attention */

typedef struct {
    m3_cpu *c;
    const float *q, *kb, *vb, *kr, *vr;
    int n, nh, nkv, D, cap, lo, len, pos, window;
    float *out;
} dsa_job;

/* one (slot, head) per item: softmax over [context keys in the slot's window ; every block key] */
static void dsa_items(void *arg, size_t i0, size_t i1, int worker) {
    (void)worker;
    dsa_job *j = arg;
    const int D = j->D, G = j->nh / j->nkv;
    const size_t kw = (size_t)j->nkv * D;
    const float scale = 1.0f / sqrtf((float)D);
    float *sc = m3_cpu_scratch(j->c, sizeof(float) * ((size_t)(j->len > j->lo ? j->len - j->lo : 0) + (size_t)j->n),
                               "dspark_attention");
    if (!sc) return;
    for (size_t it = i0; it < i1; it++) {
        int i = (int)(it / j->nh), h = (int)(it % j->nh), g = h / G;
        const float *q = j->q + ((size_t)i * j->nh + h) * D;
        float *o = j->out + ((size_t)i * j->nh + h) * D;
        long lo = (long)j->pos + i - j->window + 1;
        if (lo < j->lo) lo = j->lo;
        int nc = lo < j->len ? (int)(j->len - lo) : 0, ns = 0;
        float mx = -INFINITY;
        for (int p = 0; p < nc; p++) {
            const float *k = j->kr + (size_t)((lo + p) % j->cap) * kw + (size_t)g * D;
            float s = m3_cpu_dot(q, k, D) * scale;
            sc[ns++] = s;
            if (s > mx) mx = s;
        }
        for (int b = 0; b < j->n; b++) { /* non-causal inside the block */
            float s = m3_cpu_dot(q, j->kb + (size_t)b * kw + (size_t)g * D, D) * scale;
            sc[ns++] = s;
            if (s > mx) mx = s;
        }
        float sum = m3_cpu_exp_shift(sc, ns, mx), inv = 1.0f / sum;
        memset(o, 0, sizeof(float) * (size_t)D);
        for (int p = 0; p < nc; p++) m3_cpu_axpy(o, sc[p] * inv, j->vr + (size_t)((lo + p) % j->cap) * kw + (size_t)g * D, D);
        for (int b = 0; b < j->n; b++) m3_cpu_axpy(o, sc[nc + b] * inv, j->vb + (size_t)b * kw + (size_t)g * D, D);
    }
    free(sc);
}

void m3_cpu_dspark_attention(void *ctx, const float *q, const float *kb, const float *vb, int n, int nh, int nkv, int D,
                             const float *kr, const float *vr, int cap, int lo, int len, int pos, int window,
                             float *out) {
    m3_cpu *c = ctx;
    dsa_job j = {c, q, kb, vb, kr, vr, n, nh, nkv, D, cap, lo, len, pos, window, out};
    m3_pool_for(c->pool, (size_t)n * nh, 1, dsa_items, &j);
}

void m3_cpu_dspark_attention_n(void *ctx, int nreq, const m3_dspark_attn_req *rq, const float *q, const float *kb,
                               const float *vb, int n, int nh, int nkv, int D, int window, float *out) {
    const size_t rows = (size_t)n * nh * D, krows = (size_t)n * nkv * D;
    for (int r = 0; r < nreq; r++) /* each request's (slot, head) items over the threads */
        m3_cpu_dspark_attention(ctx, q + r * rows, kb + r * krows, vb + r * krows, n, nh, nkv, D, rq[r].kr, rq[r].vr, rq[r].cap,
                                rq[r].lo, rq[r].len, rq[r].pos, window, out + r * rows);
}
