/* The lightning indexer on the CPU: each token's block scores (max over a block's keys of index
 * q . index k, per indexer head), then the per-head top-k of blocks (forced local / initial
 * blocks, lowest block on ties), ascending, -1 padded. */
#include <math.h>
#include <stdlib.h>

#include "cpu.h"

typedef struct {
    const m3_kv *kv;
    int layer;
    const m3_batch *b;
    const float *iq;
    int ni, block, topk, local, init;
    int32_t *sel;
    /* the scores of tokens [t0, t0 + nt): score[(t - t0) * ni + g][blk], blocks in chunks of
     * IDX_CHUNK per work item, so one token's long context spreads over every thread */
    float *score;
    int t0, nt, maxnb, nchunk;
    m3_cpu *c;
} idx_job;

#define IDX_CHUNK 16 /* blocks per work item */

/* work items: (token, chunk of blocks); each writes the max over its blocks' keys of q . k */
static void idx_score_items(void *arg, size_t i0, size_t i1, int worker) {
    (void)worker;
    idx_job *j = arg;
    const int Di = j->kv->Di, B = j->block, ni = j->ni;
    /* f32 / bf16 rows are read in place; FP8 / NVFP4 rows are dequantized into rowbuf */
    const int direct = j->kv->idt == M3_KV_F32 || j->kv->idt == M3_KV_BF16, bf16 = j->kv->idt == M3_KV_BF16;
    float *dots = m3_cpu_scratch(j->c, sizeof(float) * (size_t)B * (direct ? 1 : 1 + (size_t)Di), "index_select");
    float *rowbuf = dots ? dots + B : NULL;
    for (size_t it = i0; it < i1; it++) {
        const int tl = (int)(it / (size_t)j->nchunk), ch = (int)(it % (size_t)j->nchunk), t = j->t0 + tl;
        const int pos = j->b->pos[t], qb = pos / B, nb = qb + 1;
        const m3_kv_seq *s = j->b->seqs[j->b->seq[t]];
        const float *q = j->iq + (size_t)t * ni * Di;
        float *score = j->score + (size_t)tl * ni * j->maxnb;
        for (int blk = ch * IDX_CHUNK; blk < nb && blk < (ch + 1) * IDX_CHUNK; blk++) {
            int p0 = blk * B, n = (blk == qb) ? pos - p0 + 1 : B;
            for (int g = 0; g < ni; g++) score[(size_t)g * j->maxnb + blk] = -INFINITY;
            if (!dots) continue; /* out of memory (recorded: the forward pass fails) */
            for (int i0r = 0; i0r < n;) { /* rows in place, one page run at a time */
                int run;
                const void *rows = m3_kv_rows(j->kv, s, j->layer, M3_KV_IK, 0, p0 + i0r, &run);
                if (run > n - i0r) run = n - i0r;
                if (!direct) {
                    m3_kv_load(j->kv, s, j->layer, M3_KV_IK, 0, p0 + i0r, run, rowbuf);
                    rows = rowbuf;
                }
                for (int g = 0; g < ni; g++) {
                    m3_cpu_dots(q + (size_t)g * Di, rows, direct && bf16, run, Di, dots);
                    float *m = &score[(size_t)g * j->maxnb + blk];
                    for (int i = 0; i < run; i++) if (dots[i] > *m) *m = dots[i];
                }
                i0r += run;
            }
        }
    }
    free(dots);
}

/* per token: forced local / initial blocks, then the top-k (lowest block on ties), ascending */
static void idx_topk_tokens(void *arg, size_t i0, size_t i1, int worker) {
    (void)worker;
    idx_job *j = arg;
    for (size_t tl = i0; tl < i1; tl++) {
        const int t = j->t0 + (int)tl, qb = j->b->pos[t] / j->block, nb = qb + 1;
        for (int g = 0; g < j->ni; g++) {
            float *sc = j->score + ((size_t)tl * j->ni + g) * j->maxnb;
            for (int blk = qb - j->local + 1; blk <= qb; blk++) if (blk >= 0) sc[blk] = INFINITY;
            for (int blk = 0; blk < j->init && blk <= qb; blk++) sc[blk] = INFINITY;
            int32_t *out = j->sel + ((size_t)t * j->ni + g) * j->topk;
            int got = 0;
            for (int k = 0; k < j->topk && k < nb; k++) {
                int best = -1;
                for (int blk = 0; blk < nb; blk++)
                    if (sc[blk] != -INFINITY && !isnan(sc[blk]) && (best < 0 || sc[blk] > sc[best])) best = blk;
                if (best < 0) break;
                out[got++] = best;
                sc[best] = -INFINITY;
            }
            /* ascending block order, -1 padding */
            for (int a = 1; a < got; a++)
                for (int c = a; c > 0 && out[c] < out[c - 1]; c--) { int32_t tmp = out[c]; out[c] = out[c - 1]; out[c - 1] = tmp; }
            for (int k = got; k < j->topk; k++) out[k] = -1;
        }
    }
}

void m3_cpu_index_select(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *iq, int ni,
                          int block, int topk, int local, int init, int32_t *sel) {
    m3_cpu *c = ctx;
    int maxnb = 1;
    for (int t = 0; t < b->T; t++) if (b->pos[t] / block + 1 > maxnb) maxnb = b->pos[t] / block + 1;
    /* tokens in groups whose scores fit in ~16 MB */
    int group = (int)(((size_t)16 << 20) / (sizeof(float) * (size_t)ni * maxnb));
    if (group < 1) group = 1;
    if (group > b->T) group = b->T;
    float *score = m3_cpu_scratch(c, sizeof(float) * (size_t)group * ni * maxnb, "index_select");
    if (!score) { /* recorded (the forward pass fails); the attention after it sees no keys */
        for (size_t i = 0; i < (size_t)b->T * ni * topk; i++) sel[i] = -1;
        return;
    }
    idx_job j = {kv, layer, b, iq, ni, block, topk, local, init, sel, score, 0, 0, maxnb, (maxnb + IDX_CHUNK - 1) / IDX_CHUNK, c};
    for (int t0 = 0; t0 < b->T; t0 += group) {
        j.t0 = t0;
        j.nt = b->T - t0 < group ? b->T - t0 : group;
        m3_pool_for(c->pool, (size_t)j.nt * j.nchunk, 1, idx_score_items, &j);
        m3_pool_for(c->pool, (size_t)j.nt, 1, idx_topk_tokens, &j);
    }
    free(score);
}
