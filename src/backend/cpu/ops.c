/* CPU implementations of the op table (except linear: linear.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/num.h"
#include "../../base/fault.h"
#include "cpu.h"

/* ------------------------------------------------------------------ memory */

void *m3_cpu_scratch(m3_cpu *c, size_t bytes, const char *op) {
    void *p = m3_fault_malloc(M3_FAULT_BACKEND, bytes ? bytes : 1);
    if (!p && !__atomic_exchange_n(&c->failed, 1, __ATOMIC_ACQ_REL))
        snprintf(c->fail_msg, sizeof c->fail_msg, "CPU backend: out of memory (%zu bytes of scratch in %s)", bytes, op);
    return p;
}

/* the op table's check: an op's failure since the last call (then cleared) */
static int cpu_check(void *ctx, m3_err *err) {
    m3_cpu *c = ctx;
    if (!__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE)) return 0;
    if (err) m3_errf(err, "%s", c->fail_msg);
    __atomic_store_n(&c->failed, 0, __ATOMIC_RELEASE);
    return -1;
}

/* After a failed step (ops.recover): host memory keeps no state to lose, so the backend goes
 * on; for tests the fault module "device" reports the device lost instead (src/base/fault.h). */
static int cpu_recover(void *ctx, m3_err *err) {
    m3_cpu *c = ctx;
    __atomic_store_n(&c->failed, 0, __ATOMIC_RELEASE);
    if (m3_fault_hit(M3_FAULT_DEVICE)) return m3_errf(err, "the device is lost (injected: fault module 'device')");
    return 0;
}

static void *cpu_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p) memset(p, 0, n ? n : 64);
    return p;
}
static void cpu_release(void *ctx, void *p) { (void)ctx; free(p); }
static void cpu_copy(void *ctx, void *dst, const void *src, size_t n) { (void)ctx; memmove(dst, src, n); }

/* ------------------------------------------------------------------ elementwise */

static void cpu_embed(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out) {
    (void)ctx;
    for (int t = 0; t < T; t++) m3_cpu_decode_rows(E, ids[t], ids[t] + 1, 0, E->K, out + (size_t)t * E->K);
}

static void rms_row(const float *x, const float *w, int dim, float eps, float *out) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / dim + eps));
    for (int i = 0; i < dim; i++) out[i] = (x[i] * r) * (1.0f + w[i]);
}

static void cpu_rmsnorm(void *ctx, const float *x, const float *w, int rows, int dim, float eps, float *out) {
    (void)ctx;
    for (int r = 0; r < rows; r++) rms_row(x + (size_t)r * dim, w, dim, eps, out + (size_t)r * dim);
}

static void cpu_add(void *ctx, float *y, const float *x, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_linear_op(void *ctx, const m3_linear *W, const float *x, int T, float *y) {
    m3_cpu_linear(ctx, W, x, T, y);
}

/* inv_freq and angles in f32, as the reference's rotary embedding computes them */
static void cpu_head_norm_rope(void *ctx, float *x, int T, int heads, int dim, const float *w, float eps,
                               int rotary_dim, double theta, const int32_t *pos) {
    int half = rotary_dim / 2;
    float cs[1024], sn[1024];
    float *c = half <= 1024 ? cs : m3_cpu_scratch(ctx, sizeof(float) * (size_t)half * 2, "head_norm_rope");
    float *s = half <= 1024 ? sn : c + half;
    if (!c) return;
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < half; j++) {
            float e = (float)(2 * j) / (float)rotary_dim;
            float inv = 1.0f / powf((float)theta, e);
            float a = (float)pos[t] * inv;
            c[j] = cosf(a);
            s[j] = sinf(a);
        }
        for (int h = 0; h < heads; h++) {
            float *v = x + ((size_t)t * heads + h) * dim;
            rms_row(v, w, dim, eps, v);
            for (int j = 0; j < half; j++) {
                float a = v[j], b = v[j + half];
                v[j] = a * c[j] - b * s[j];
                v[j + half] = b * c[j] + a * s[j];
            }
        }
    }
    if (c != cs) free(c);
}

static void cpu_kv_store(void *ctx, m3_kv *kv, int layer, const m3_batch *b, const float *k, const float *v,
                         const float *ik) {
    (void)ctx;
    size_t kw = (size_t)kv->nkv * kv->D;
    for (int t = 0; t < b->T; t++) {
        const m3_kv_seq *s = b->seqs[b->seq[t]];
        m3_kv_store(kv, s, layer, M3_KV_K, b->pos[t], k + t * kw);
        m3_kv_store(kv, s, layer, M3_KV_V, b->pos[t], v + t * kw);
        if (ik) m3_kv_store(kv, s, layer, M3_KV_IK, b->pos[t], ik + (size_t)t * kv->Di);
    }
}

/* ------------------------------------------------------------------ indexer */

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

static void cpu_index_select(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *iq, int ni,
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

/* ------------------------------------------------------------------ attention */

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

static void cpu_attention(void *ctx, const m3_kv *kv, int layer, const m3_batch *b, const float *q, int nh,
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

static void cpu_dspark_attention(void *ctx, const float *q, const float *kb, const float *vb, int n, int nh, int nkv, int D,
                                 const float *kr, const float *vr, int cap, int lo, int len, int pos, int window,
                                 float *out) {
    m3_cpu *c = ctx;
    dsa_job j = {c, q, kb, vb, kr, vr, n, nh, nkv, D, cap, lo, len, pos, window, out};
    m3_pool_for(c->pool, (size_t)n * nh, 1, dsa_items, &j);
}

/* ------------------------------------------------------------------ MLP / MoE */

static void swiglu_oai(const float *gate, const float *up, size_t n, float alpha, float limit, float *out) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i] < limit ? gate[i] : limit;
        float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        out[i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
    }
}

static void mlp_run(m3_cpu *c, const m3_mlp_w *m, const float *x, int T, float alpha, float limit, float *out) {
    int F = m->gate.N;
    float *g = m3_cpu_scratch(c, sizeof(float) * (size_t)T * F * 2, "mlp");
    if (!g) { memset(out, 0, sizeof(float) * (size_t)T * m->down.N); return; }
    float *u = g + (size_t)T * F;
    m3_cpu_linear(c, &m->gate, x, T, g);
    m3_cpu_linear(c, &m->up, x, T, u);
    swiglu_oai(g, u, (size_t)T * F, alpha, limit, g);
    m3_cpu_linear(c, &m->down, g, T, out);
    free(g);
}

static void cpu_mlp(void *ctx, const m3_mlp_w *m, const float *x, int T, float alpha, float limit, float *out) {
    mlp_run(ctx, m, x, T, alpha, limit, out);
}

static void cpu_moe(void *ctx, const m3_layer_w *L, const float *x, int T, int E, int K, float routed_scale,
                    float alpha, float limit, float *out) {
    m3_cpu *c = ctx;
    const int H = L->router.K;
    float *logits = m3_cpu_scratch(c, sizeof(float) * (size_t)T * E, "moe");
    int *pick = m3_cpu_scratch(c, sizeof(int) * (size_t)T * K, "moe");
    float *wt = m3_cpu_scratch(c, sizeof(float) * (size_t)T * K, "moe");
    int *rows = m3_cpu_scratch(c, sizeof(int) * (size_t)T, "moe");
    float *rw = m3_cpu_scratch(c, sizeof(float) * (size_t)T, "moe");
    float *xe = m3_cpu_scratch(c, sizeof(float) * (size_t)T * H * 2, "moe");
    float *s = m3_cpu_scratch(c, sizeof(float) * (size_t)E * 2, "moe");
    memset(out, 0, sizeof(float) * (size_t)T * H);
    if (!logits || !pick || !wt || !rows || !rw || !xe || !s) goto done;
    float *ye = xe + (size_t)T * H, *choice = s + E;
    m3_cpu_linear(c, &L->router, x, T, logits);
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) {
            s[e] = 1.0f / (1.0f + expf(-logits[(size_t)t * E + e]));
            choice[e] = s[e] + (L->route_bias ? L->route_bias[e] : 0.0f);
        }
        float sum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (choice[e] != -INFINITY && (best < 0 || choice[e] > choice[best])) best = e;
            pick[t * K + k] = best;
            choice[best] = -INFINITY;
            sum += s[best];
        }
        for (int k = 0; k < K; k++) wt[t * K + k] = s[pick[t * K + k]] / sum * routed_scale;
    }
    /* experts in ascending order; each token adds its experts' outputs in that order */
    for (int e = 0; e < E; e++) {
        if (!L->experts[e].gate.w) continue; /* expert parallel: held by another rank */
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (pick[t * K + k] == e) { rows[n] = t; rw[n] = wt[t * K + k]; n++; }
        if (!n) continue;
        for (int i = 0; i < n; i++) memcpy(xe + (size_t)i * H, x + (size_t)rows[i] * H, sizeof(float) * H);
        mlp_run(c, &L->experts[e], xe, n, alpha, limit, ye);
        for (int i = 0; i < n; i++) m3_cpu_axpy(out + (size_t)rows[i] * H, rw[i], ye + (size_t)i * H, H);
    }
    if (L->has_shared) {
        mlp_run(c, &L->shared, x, T, alpha, limit, xe);
        for (size_t i = 0; i < (size_t)T * H; i++) out[i] += xe[i];
    }
done:
    free(logits); free(pick); free(wt); free(rows); free(rw); free(xe); free(s);
}

/* ------------------------------------------------------------------ table */

int m3_cpu_ops_init(m3_ops *ops, int threads, m3_err *err) {
    memset(ops, 0, sizeof *ops);
    m3_cpu *c = calloc(1, sizeof *c);
    if (!c) return m3_errf(err, "out of memory");
    c->pool = m3_pool_create(threads);
    if (!c->pool) { free(c); return m3_errf(err, "cannot start worker threads"); }
    c->nthreads = m3_pool_size(c->pool);
    ops->name = "cpu";
    ops->ctx = c;
    ops->alloc = cpu_alloc;
    ops->release = cpu_release;
    ops->upload = cpu_copy;
    ops->download = cpu_copy;
    ops->embed = cpu_embed;
    ops->rmsnorm = cpu_rmsnorm;
    ops->add = cpu_add;
    ops->linear = cpu_linear_op;
    ops->head_norm_rope = cpu_head_norm_rope;
    ops->kv_store = cpu_kv_store;
    ops->index_select = cpu_index_select;
    ops->attention = cpu_attention;
    ops->dspark_attention = cpu_dspark_attention;
    ops->copy = cpu_copy;
    ops->mlp = cpu_mlp;
    ops->moe = cpu_moe;
    ops->check = cpu_check;
    ops->recover = cpu_recover;
    m3_cpu_vision_ops(ops);
    if (m3_ops_complete(ops, err)) { /* the fused ops: their plain compositions (../compose.c) */
        m3_cpu_ops_free(ops);
        return -1;
    }
    return 0;
}

void m3_cpu_ops_free(m3_ops *ops) {
    m3_cpu *c = ops->ctx;
    if (c) { m3_pool_free(c->pool); free(c); }
    memset(ops, 0, sizeof *ops);
}
