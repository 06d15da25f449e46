/* Attention on the CPU: causal attention over the paged KV cache (dense, or the blocks the
 * indexer selected), online softmax; and the DSpark draft's attention over its ring + block. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

static void att_items(void *arg, size_t i0, size_t i1, int worker) {
    (void)worker;
    att_job *j = arg;
    const m3_kv *kv = j->kv;
    const int D = kv->D, nkv = kv->nkv, G = j->nh / nkv;
    const float scale = 1.0f / sqrtf((float)D);
    /* f32 / bf16 rows are read in place; FP8 / NVFP4 rows are dequantized into kbuf / vbuf */
    const int direct = kv->dt == M3_KV_F32 || kv->dt == M3_KV_BF16, bf16 = kv->dt == M3_KV_BF16;
    float *st = m3_cpu_scratch(j->c, sizeof(float) * ((size_t)G * (2 + D + CHUNK) + (direct ? 0 : 2 * (size_t)CHUNK * D)),
                               "attention");
    if (!st) return;
    float *m = st, *l = st + G, *acc = st + 2 * G, *sc = acc + (size_t)G * D;
    float *kbuf = sc + CHUNK, *vbuf = kbuf + (size_t)CHUNK * D;
    for (size_t it = i0; it < i1; it++) {
        int t = (int)(it / nkv), g = (int)(it % nkv);
        int pos = j->b->pos[t];
        const m3_kv_seq *s = j->b->seqs[j->b->seq[t]];
        for (int h = 0; h < G; h++) { m[h] = -INFINITY; l[h] = 0; }
        memset(acc, 0, sizeof(float) * (size_t)G * D);
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
                    kb = kbuf;
                    vb = vbuf;
                }
                for (int h = 0; h < G; h++) {
                    const float *qh = j->q + ((size_t)t * j->nh + (size_t)g * G + h) * D;
                    float mx = m[h];
                    m3_cpu_dots(qh, kb, direct && bf16, n, D, sc);
                    for (int i = 0; i < n; i++) {
                        sc[i] *= scale;
                        if (sc[i] > mx) mx = sc[i];
                    }
                    float corr = expf(m[h] - mx); /* 0 on the first chunk (m = -inf) */
                    float *ah = acc + (size_t)h * D;
                    if (corr != 1.0f) for (int d = 0; d < D; d++) ah[d] *= corr;
                    float sum = m3_cpu_exp_shift(sc, n, mx); /* online softmax, flash style */
                    m3_cpu_pv(ah, sc, vb, direct && bf16, n, D);
                    l[h] = l[h] * corr + sum;
                    m[h] = mx;
                }
            }
        }
        for (int h = 0; h < G; h++) {
            float *o = j->out + ((size_t)t * j->nh + (size_t)g * G + h) * D;
            float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
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
