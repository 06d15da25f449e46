/* Tensor-parallel plans and weight views (see shard.h). */
#include "shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *m3_moe_split_name(m3_moe_split s) { return s == M3_MOE_WIDTH ? "width" : "experts"; }

int m3_moe_split_parse(const char *s, m3_moe_split *out) {
    if (!strcmp(s, "experts") || !strcmp(s, "ep")) { *out = M3_MOE_EXPERTS; return 0; }
    if (!strcmp(s, "width") || !strcmp(s, "tp")) { *out = M3_MOE_WIDTH; return 0; }
    return -1;
}

void m3_shard_vocab_range(int V, int size, int rank, int *vocab0, int *n) {
    long a = (long)V * rank / size, b = (long)V * (rank + 1) / size;
    *vocab0 = (int)a;
    *n = (int)(b - a);
}

int m3_shard_plan(m3_shard *s, const m3_config *c, int rank, int size, m3_moe_split moe, m3_err *err) {
    memset(s, 0, sizeof *s);
    if (size < 1 || rank < 0 || rank >= size)
        return m3_errf(err, "tensor parallel: rank %d of %d is not a valid rank", rank, size);
    const int nh = c->n_heads, nkv = c->n_kv_heads;
    s->rank = rank;
    s->size = size;
    s->moe = moe;
    if (nh % size)
        return m3_errf(err, "tensor parallel size %d: the %d query heads do not split evenly over the ranks", size, nh);
    s->n_heads = nh / size;
    s->head0 = rank * s->n_heads;
    if (nkv % size == 0) {
        s->n_kv_heads = nkv / size;
        s->kv_head0 = rank * s->n_kv_heads;
    } else if (size % nkv == 0) { /* more ranks than KV heads: each KV head on size / nkv ranks */
        s->n_kv_heads = 1;
        s->kv_head0 = rank / (size / nkv);
    } else {
        return m3_errf(err,
                       "tensor parallel size %d: the %d KV heads neither split over the ranks nor replicate evenly "
                       "(the size must divide %d or be a multiple of it)",
                       size, nkv, nkv);
    }
    /* the rank's query heads must use exactly its KV heads (GQA: head h uses KV head h / G) */
    int G = nh / nkv;
    if (s->head0 / G != s->kv_head0 || (s->head0 + s->n_heads - 1) / G != s->kv_head0 + s->n_kv_heads - 1)
        return m3_errf(err, "tensor parallel size %d: query heads %d..%d of rank %d do not map onto KV heads %d..%d", size,
                       s->head0, s->head0 + s->n_heads - 1, rank, s->kv_head0, s->kv_head0 + s->n_kv_heads - 1);
    if (c->n_sparse_layers) { /* index heads == KV heads (checked by the config loader) */
        s->index_heads = s->n_kv_heads;
        s->index_head0 = s->kv_head0;
    }
    m3_shard_vocab_range(c->vocab, size, rank, &s->vocab0, &s->n_vocab);
    s->vocab_stride = (c->vocab + size - 1) / size;
    if (moe == M3_MOE_EXPERTS && c->n_moe_layers) {
        if (c->n_experts < size)
            return m3_errf(err, "tensor parallel size %d: expert parallel needs at least one of the %d experts per rank "
                                "(use the width split)", size, c->n_experts);
        s->expert0 = (int)((long)c->n_experts * rank / size);
        s->n_experts = (int)((long)c->n_experts * (rank + 1) / size) - s->expert0;
    } else {
        s->expert0 = 0;
        s->n_experts = c->n_experts;
    }
    return 0;
}

/* ------------------------------------------------------------------ views of one matrix */

/* columns a block scale covers (a column slice must not cut one) */
static int scale_group(m3_wfmt f) { return f == M3_WF_MXFP8 ? 32 : f == M3_WF_NVFP4 ? 16 : 1; }
/* the unit width splits deal out: a scale group, or 8 columns (SIMD width) for plain formats */
static int width_unit(m3_wfmt f) { return f == M3_WF_MXFP8 ? 32 : f == M3_WF_NVFP4 ? 16 : 8; }

/* bytes of columns [0, k) of a row */
static size_t col_bytes(m3_wfmt f, int k) {
    switch (f) {
    case M3_WF_F32: return 4 * (size_t)k;
    case M3_WF_BF16: case M3_WF_F16: return 2 * (size_t)k;
    case M3_WF_MXFP8: return (size_t)k;
    default: return (size_t)k / 2; /* NVFP4: two codes per byte, k even */
    }
}

void m3_linear_rows(const m3_linear *W, int n0, int nn, m3_linear *out) {
    *out = *W;
    out->N = nn;
    out->w = W->w ? W->w + (size_t)n0 * W->row_bytes : NULL;
    out->scale = W->scale ? W->scale + (size_t)n0 * W->scale_row : NULL;
}

int m3_linear_cols(const m3_linear *W, int k0, int nk, m3_linear *out, const char *what, m3_err *err) {
    int g = scale_group(W->fmt);
    if (k0 < 0 || nk < 0 || k0 + nk > W->K)
        return m3_errf(err, "%s: columns [%d, %d) are outside its %d columns", what, k0, k0 + nk, W->K);
    if (k0 % g || (nk % g && k0 + nk != W->K))
        return m3_errf(err, "%s: columns [%d, %d) of a %s matrix cut a %d-column scale group; this split needs "
                            "boundaries on multiples of %d",
                       what, k0, k0 + nk, m3_wfmt_name(W->fmt), g, g);
    *out = *W;
    out->K = nk;
    out->w = W->w ? W->w + col_bytes(W->fmt, k0) : NULL;
    out->scale = W->scale ? W->scale + k0 / g : NULL;
    return 0; /* row_bytes / scale_row stay the full matrix's: a strided view */
}

/* intermediate columns [f0, f0 + nf) of rank r: units of `unit` columns dealt out balanced */
static void width_range(int F, int unit, int size, int rank, int *f0, int *nf) {
    int U = (F + unit - 1) / unit;
    int u0 = (int)((long)U * rank / size), u1 = (int)((long)U * (rank + 1) / size);
    int end = u1 * unit < F ? u1 * unit : F;
    *f0 = u0 * unit < F ? u0 * unit : F;
    *nf = end - *f0;
}

/* rank s's share of an MLP by intermediate width; *empty = 1 when it gets no column */
static int split_mlp(const m3_mlp_w *m, const m3_shard *s, m3_mlp_w *out, int *empty, const char *what, m3_err *err) {
    int f0, nf;
    width_range(m->gate.N, width_unit(m->down.fmt), s->size, s->rank, &f0, &nf);
    memset(out, 0, sizeof *out);
    *empty = nf == 0;
    if (*empty) return 0;
    m3_linear_rows(&m->gate, f0, nf, &out->gate);
    m3_linear_rows(&m->up, f0, nf, &out->up);
    char nm[192];
    snprintf(nm, sizeof nm, "%s down projection", what);
    return m3_linear_cols(&m->down, f0, nf, &out->down, nm, err);
}

static int empty_err(const m3_mlp_w *m, const m3_shard *s, const char *what, const char *hint, m3_err *err) {
    int u = width_unit(m->down.fmt);
    return m3_errf(err,
                   "%s: width %d (%s, dealt out in %d-column units) leaves rank %d of %d without a share; "
                   "use a tensor parallel size of at most %d%s",
                   what, m->gate.N, m3_wfmt_name(m->down.fmt), u, s->rank, s->size, (m->gate.N + u - 1) / u, hint);
}

static void tally(m3_weights *v, const m3_linear *L) {
    if (!L->w || L->N <= 0 || L->K <= 0) return;
    v->bytes_by_fmt[L->fmt] += m3_linear_bytes(L);
    v->count_by_fmt[L->fmt]++;
}

static void tally_mlp(m3_weights *v, const m3_mlp_w *m) {
    tally(v, &m->gate);
    tally(v, &m->up);
    tally(v, &m->down);
}

/* ------------------------------------------------------------------ the model's view */

int m3_shard_weights(const m3_weights *full, const m3_config *c, const m3_shard *s, m3_weights *v, m3_err *err) {
    memset(v, 0, sizeof *v);
    v->st = full->st;
    v->n_layers = full->n_layers;
    v->hidden = full->hidden;
    v->head_dim = full->head_dim;
    v->index_dim = full->index_dim;
    v->n_experts = full->n_experts;
    memcpy(v->prefix, full->prefix, sizeof v->prefix);
    v->n_tensors_used = full->n_tensors_used;
    v->layers = calloc((size_t)full->n_layers, sizeof *v->layers);
    if (!v->layers) return m3_errf(err, "out of memory");
    const int D = c->head_dim, Di = c->index_dim, E = full->n_experts;
    char what[160];
    for (int l = 0; l < full->n_layers; l++) {
        const m3_layer_w *F = &full->layers[l];
        m3_layer_w *L = &v->layers[l];
        *L = *F; /* flags, norm vectors, router and routing bias: shared with the full model */
        L->experts = NULL;
        L->backend = NULL;
        m3_linear_rows(&F->q, s->head0 * D, s->n_heads * D, &L->q);
        m3_linear_rows(&F->k, s->kv_head0 * D, s->n_kv_heads * D, &L->k);
        m3_linear_rows(&F->v, s->kv_head0 * D, s->n_kv_heads * D, &L->v);
        snprintf(what, sizeof what, "layer %d self_attn.o_proj (query heads %d..%d of rank %d, head_dim %d)", l, s->head0,
                 s->head0 + s->n_heads - 1, s->rank, D);
        if (m3_linear_cols(&F->o, s->head0 * D, s->n_heads * D, &L->o, what, err)) goto fail;
        tally(v, &L->q); tally(v, &L->k); tally(v, &L->v); tally(v, &L->o);
        if (F->sparse) {
            m3_linear_rows(&F->iq, s->index_head0 * Di, s->index_heads * Di, &L->iq);
            L->ik = F->ik; /* one index-K head for all: replicated */
            tally(v, &L->iq); tally(v, &L->ik);
        }
        int empty;
        if (!F->moe) {
            snprintf(what, sizeof what, "layer %d dense MLP", l);
            if (split_mlp(&F->mlp, s, &L->mlp, &empty, what, err)) goto fail;
            if (empty) { empty_err(&F->mlp, s, what, "", err); goto fail; }
            tally_mlp(v, &L->mlp);
            continue;
        }
        tally(v, &L->router);
        L->experts = calloc((size_t)E, sizeof *L->experts);
        if (!L->experts) { m3_errf(err, "out of memory"); goto fail; }
        for (int e = 0; e < E; e++) {
            const m3_mlp_w *fe = &F->experts[e];
            m3_mlp_w *le = &L->experts[e];
            if (s->moe == M3_MOE_EXPERTS) {
                *le = *fe;
                if (e < s->expert0 || e >= s->expert0 + s->n_experts) { /* another rank's: shapes kept, no weights */
                    le->gate.w = le->up.w = le->down.w = NULL;
                    le->gate.scale = le->up.scale = le->down.scale = NULL;
                }
            } else {
                snprintf(what, sizeof what, "layer %d expert %d", l, e);
                if (split_mlp(fe, s, le, &empty, what, err)) goto fail;
                if (empty) { empty_err(fe, s, what, ", or the expert-parallel split", err); goto fail; }
            }
            tally_mlp(v, le);
        }
        if (F->has_shared) {
            snprintf(what, sizeof what, "layer %d shared expert", l);
            if (split_mlp(&F->shared, s, &L->shared, &empty, what, err)) goto fail;
            if (empty) { /* too narrow for every rank: the ranks with a share compute it */
                L->has_shared = 0;
                memset(&L->shared, 0, sizeof L->shared);
            }
            tally_mlp(v, &L->shared);
        }
    }
    v->embed = full->embed; /* replicated */
    m3_linear_rows(&full->lm_head, s->vocab0, s->n_vocab, &v->lm_head);
    v->final_norm = full->final_norm;
    tally(v, &v->embed);
    if (full->lm_head.w != full->embed.w) tally(v, &v->lm_head);
    return 0;
fail:
    m3_shard_weights_free(v);
    return -1;
}

void m3_shard_weights_free(m3_weights *v) {
    if (v->layers)
        for (int l = 0; l < v->n_layers; l++) free(v->layers[l].experts);
    free(v->layers);
    memset(v, 0, sizeof *v);
}
