#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../base/num.h"

static const char *FMT_NAMES[M3_WF_COUNT] = {"f32", "bf16", "f16", "mxfp8", "nvfp4"};
const char *m3_wfmt_name(m3_wfmt f) { return (unsigned)f < M3_WF_COUNT ? FMT_NAMES[f] : "?"; }

size_t m3_linear_dense_row_bytes(const m3_linear *W) {
    switch (W->fmt) {
    case M3_WF_F32: return 4 * (size_t)W->K;
    case M3_WF_BF16: case M3_WF_F16: return 2 * (size_t)W->K;
    case M3_WF_MXFP8: return (size_t)W->K;
    case M3_WF_NVFP4: return (size_t)W->K / 2;
    default: return W->row_bytes;
    }
}

size_t m3_linear_dense_scale_row(const m3_linear *W) {
    return W->fmt == M3_WF_MXFP8 ? (size_t)W->K / 32 : W->fmt == M3_WF_NVFP4 ? (size_t)W->K / 16 : W->scale_row;
}

/* counts the K columns a pass reads, not the row stride (equal for a matrix stored whole) */
size_t m3_linear_bytes(const m3_linear *W) {
    return (size_t)W->N * (m3_linear_dense_row_bytes(W) + m3_linear_dense_scale_row(W));
}

typedef struct {
    const m3_config *c;
    m3_st *st;
    m3_weights *w;
    m3_err *err;
} binder;

static const m3_tensor *find(binder *b, const char *name) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", b->w->prefix, name);
    return m3_st_find(b->st, full);
}

static int shape_err(binder *b, const m3_tensor *t, int ndim, const int64_t *want) {
    char ws[128], fs[128];
    m3_shape_str(want, ndim, ws, sizeof ws);
    m3_shape_str(t->shape, t->ndim, fs, sizeof fs);
    return m3_errf(b->err, "tensor '%s': expected shape %s, found %s", t->name, ws, fs);
}

static int check_shape(binder *b, const m3_tensor *t, int ndim, const int64_t *want) {
    if (t->ndim != ndim) return shape_err(b, t, ndim, want);
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != want[i]) return shape_err(b, t, ndim, want);
    return 0;
}

static const m3_tensor *need(binder *b, const char *name) {
    const m3_tensor *t = find(b, name);
    if (!t) m3_errf(b->err, "missing tensor '%s%s'", b->w->prefix, name);
    return t;
}

static void count(binder *b, m3_wfmt f, size_t bytes) {
    b->w->bytes_by_fmt[f] += bytes;
    b->w->count_by_fmt[f]++;
}

/* A vector [n] in f32/bf16/f16, converted to an owned f32 array. */
static int bind_vec(binder *b, const char *name, int n, float **out) {
    const m3_tensor *t = need(b, name);
    if (!t) return -1;
    int64_t want[1] = {n};
    if (check_shape(b, t, 1, want)) return -1;
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return m3_errf(b->err, "out of memory");
    for (int i = 0; i < n; i++) {
        switch (t->dtype) {
        case M3_DT_F32: memcpy(&v[i], (const char *)t->data + 4 * (size_t)i, 4); break;
        case M3_DT_BF16: { uint16_t h; memcpy(&h, (const char *)t->data + 2 * (size_t)i, 2); v[i] = m3_bf16_to_f32(h); break; }
        case M3_DT_F16: { uint16_t h; memcpy(&h, (const char *)t->data + 2 * (size_t)i, 2); v[i] = m3_f16_to_f32(h); break; }
        default:
            free(v);
            return m3_errf(b->err, "tensor '%s': dtype %s not supported for a vector (need F32, BF16 or F16)", t->name,
                           m3_dtype_name(t->dtype));
        }
    }
    *out = v;
    b->w->n_tensors_used++;
    return 0;
}

static int scalar_f32(binder *b, const m3_tensor *t, float *out) {
    if (t->numel != 1 || t->dtype != M3_DT_F32)
        return m3_errf(b->err, "tensor '%s': expected one F32 value, found %s with %lld elements", t->name,
                       m3_dtype_name(t->dtype), (long long)t->numel);
    memcpy(out, t->data, 4);
    return 0;
}

/* A linear [N, K] in any supported format; the format is read from what is stored. */
static int bind_linear(binder *b, const char *base, int N, int K, m3_linear *L) {
    char nm[512];
    memset(L, 0, sizeof *L);
    L->N = N;
    L->K = K;
    snprintf(nm, sizeof nm, "%s.weight_packed", base);
    const m3_tensor *packed = find(b, nm);
    snprintf(nm, sizeof nm, "%s.weight", base);
    const m3_tensor *wt = find(b, nm);
    if (!packed && !wt) return m3_errf(b->err, "missing tensor '%s%s.weight'", b->w->prefix, base);
    int64_t want[2] = {N, K};
    if (packed || (wt->dtype == M3_DT_U8)) {
        /* NVFP4: compressed-tensors (weight_packed, weight_scale, weight_global_scale divisor)
         * or ModelOpt (weight U8, weight_scale, weight_scale_2 multiplier) */
        const m3_tensor *codes = packed ? packed : wt;
        if (K % 16) return m3_errf(b->err, "tensor '%s': NVFP4 needs K (%d) divisible by 16", codes->name, K);
        int64_t wp[2] = {N, K / 2};
        if (codes->dtype != M3_DT_U8)
            return m3_errf(b->err, "tensor '%s': expected dtype U8, found %s", codes->name, m3_dtype_name(codes->dtype));
        if (check_shape(b, codes, 2, wp)) return -1;
        snprintf(nm, sizeof nm, "%s.weight_scale", base);
        const m3_tensor *sc = need(b, nm);
        if (!sc) return -1;
        int64_t ws[2] = {N, K / 16};
        if (sc->dtype != M3_DT_F8_E4M3)
            return m3_errf(b->err, "tensor '%s': expected dtype F8_E4M3, found %s", sc->name, m3_dtype_name(sc->dtype));
        if (check_shape(b, sc, 2, ws)) return -1;
        float g;
        if (packed) {
            snprintf(nm, sizeof nm, "%s.weight_global_scale", base);
            const m3_tensor *gs = need(b, nm);
            if (!gs || scalar_f32(b, gs, &g)) return -1;
            if (!(g > 0) || !isfinite(g)) return m3_errf(b->err, "tensor '%s': global scale %g must be positive and finite", gs->name, g);
            L->gmul = 1.0f / g;
        } else {
            snprintf(nm, sizeof nm, "%s.weight_scale_2", base);
            const m3_tensor *s2 = need(b, nm);
            if (!s2 || scalar_f32(b, s2, &g)) return -1;
            if (!isfinite(g)) return m3_errf(b->err, "tensor '%s': scale %g is not finite", s2->name, g);
            L->gmul = g;
        }
        L->fmt = M3_WF_NVFP4;
        L->w = codes->data;
        L->row_bytes = (size_t)K / 2;
        L->scale = sc->data;
        L->scale_row = (size_t)K / 16;
        b->w->n_tensors_used += 3;
    } else if (wt->dtype == M3_DT_F8_E4M3) {
        if (check_shape(b, wt, 2, want)) return -1;
        if (K % 32) return m3_errf(b->err, "tensor '%s': MXFP8 needs K (%d) divisible by 32", wt->name, K);
        snprintf(nm, sizeof nm, "%s.weight_scale_inv", base);
        const m3_tensor *sc = find(b, nm);
        if (!sc) {
            snprintf(nm, sizeof nm, "%s.weight_scale", base);
            sc = find(b, nm);
        }
        if (!sc) return m3_errf(b->err, "missing tensor '%s%s.weight_scale_inv' (MXFP8 scales for %s)", b->w->prefix, base, wt->name);
        int64_t ws[2] = {N, K / 32};
        if (sc->dtype != M3_DT_U8)
            return m3_errf(b->err, "tensor '%s': expected dtype U8 (E8M0 scales per 32), found %s", sc->name, m3_dtype_name(sc->dtype));
        if (check_shape(b, sc, 2, ws)) return -1;
        L->fmt = M3_WF_MXFP8;
        L->w = wt->data;
        L->row_bytes = (size_t)K;
        L->scale = sc->data;
        L->scale_row = (size_t)K / 32;
        b->w->n_tensors_used += 2;
    } else if (wt->dtype == M3_DT_BF16 || wt->dtype == M3_DT_F16 || wt->dtype == M3_DT_F32) {
        if (check_shape(b, wt, 2, want)) return -1;
        L->fmt = wt->dtype == M3_DT_BF16 ? M3_WF_BF16 : wt->dtype == M3_DT_F16 ? M3_WF_F16 : M3_WF_F32;
        L->w = wt->data;
        L->row_bytes = (size_t)K * m3_dtype_size(wt->dtype);
        b->w->n_tensors_used++;
    } else {
        return m3_errf(b->err, "tensor '%s': dtype %s not supported for a linear weight (BF16, F16, F32, F8_E4M3 + scales, U8 NVFP4)",
                       wt->name, m3_dtype_name(wt->dtype));
    }
    count(b, L->fmt, m3_linear_bytes(L));
    return 0;
}

static int bind_mlp(binder *b, const char *base, const char *g, const char *u, const char *d, int H, int F, m3_mlp_w *m) {
    char nm[512];
    snprintf(nm, sizeof nm, "%s.%s", base, g);
    if (bind_linear(b, nm, F, H, &m->gate)) return -1;
    snprintf(nm, sizeof nm, "%s.%s", base, u);
    if (bind_linear(b, nm, F, H, &m->up)) return -1;
    snprintf(nm, sizeof nm, "%s.%s", base, d);
    return bind_linear(b, nm, H, F, &m->down);
}

static int bind_layer(binder *b, int l, m3_layer_w *L) {
    const m3_config *c = b->c;
    char p[256], nm[512];
    int H = c->hidden, D = c->head_dim;
    snprintf(p, sizeof p, "model.layers.%d", l);
    L->sparse = c->layer_sparse[l];
    L->moe = c->layer_moe[l];
#define NM(fmt, ...) (snprintf(nm, sizeof nm, fmt, __VA_ARGS__), nm)
    if (bind_vec(b, NM("%s.input_layernorm.weight", p), H, &L->in_norm)) return -1;
    if (bind_vec(b, NM("%s.post_attention_layernorm.weight", p), H, &L->post_norm)) return -1;
    if (bind_linear(b, NM("%s.self_attn.q_proj", p), c->n_heads * D, H, &L->q)) return -1;
    if (bind_linear(b, NM("%s.self_attn.k_proj", p), c->n_kv_heads * D, H, &L->k)) return -1;
    if (bind_linear(b, NM("%s.self_attn.v_proj", p), c->n_kv_heads * D, H, &L->v)) return -1;
    if (bind_linear(b, NM("%s.self_attn.o_proj", p), H, c->n_heads * D, &L->o)) return -1;
    if (bind_vec(b, NM("%s.self_attn.q_norm.weight", p), D, &L->q_norm)) return -1;
    if (bind_vec(b, NM("%s.self_attn.k_norm.weight", p), D, &L->k_norm)) return -1;
    if (L->sparse) {
        int Di = c->index_dim;
        if (bind_linear(b, NM("%s.self_attn.index_q_proj", p), c->index_heads * Di, H, &L->iq)) return -1;
        if (bind_linear(b, NM("%s.self_attn.index_k_proj", p), Di, H, &L->ik)) return -1;
        if (bind_vec(b, NM("%s.self_attn.index_q_norm.weight", p), Di, &L->iq_norm)) return -1;
        if (bind_vec(b, NM("%s.self_attn.index_k_norm.weight", p), Di, &L->ik_norm)) return -1;
    }
    if (!L->moe) {
        if (bind_mlp(b, NM("%s.mlp", p), "gate_proj", "up_proj", "down_proj", H, c->dense_inter, &L->mlp)) return -1;
        return 0;
    }
    int E = c->n_experts;
    if (bind_linear(b, NM("%s.block_sparse_moe.gate", p), E, H, &L->router)) return -1;
    if (c->use_routing_bias && bind_vec(b, NM("%s.block_sparse_moe.e_score_correction_bias", p), E, &L->route_bias)) return -1;
    L->experts = calloc((size_t)E, sizeof *L->experts);
    if (!L->experts) return m3_errf(b->err, "out of memory");
    for (int e = 0; e < E; e++) {
        char base[256];
        snprintf(base, sizeof base, "%s.block_sparse_moe.experts.%d", p, e);
        if (bind_mlp(b, base, "w1", "w3", "w2", H, c->moe_inter, &L->experts[e])) return -1;
    }
    if (c->n_shared) {
        L->has_shared = 1;
        if (bind_mlp(b, NM("%s.block_sparse_moe.shared_experts", p), "gate_proj", "up_proj", "down_proj", H,
                     c->shared_inter, &L->shared))
            return -1;
    }
#undef NM
    return 0;
}

int m3_weights_bind(m3_weights *w, const m3_config *c, m3_st *st, m3_err *err) {
    memset(w, 0, sizeof *w);
    w->st = st;
    binder b = {c, st, w, err};
    /* hub layout: "language_model.model.*" + "language_model.lm_head"; bare: "model.*" + "lm_head" */
    if (m3_st_find(st, "language_model.model.embed_tokens.weight")) snprintf(w->prefix, sizeof w->prefix, "language_model.");
    else if (m3_st_find(st, "model.embed_tokens.weight")) w->prefix[0] = 0;
    else return m3_errf(err, "missing tensor 'language_model.model.embed_tokens.weight' (also tried 'model.embed_tokens.weight')");
    int H = c->hidden, V = c->vocab;
    int rc = 0;
    w->n_layers = c->n_layers;
    w->hidden = H;
    w->head_dim = c->head_dim;
    w->index_dim = c->index_dim;
    w->n_experts = c->n_experts;
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) return m3_errf(err, "out of memory");
    if ((rc = bind_linear(&b, "model.embed_tokens", V, H, &w->embed))) goto out;
    if (w->embed.fmt != M3_WF_BF16 && w->embed.fmt != M3_WF_F16 && w->embed.fmt != M3_WF_F32) {
        rc = m3_errf(err, "tensor '%smodel.embed_tokens.weight': embeddings must be BF16, F16 or F32", w->prefix);
        goto out;
    }
    if (c->tie_embeddings && !find(&b, "lm_head.weight")) w->lm_head = w->embed;
    else if ((rc = bind_linear(&b, "lm_head", V, H, &w->lm_head))) goto out;
    if ((rc = bind_vec(&b, "model.norm.weight", H, &w->final_norm))) goto out;
    for (int l = 0; l < c->n_layers; l++)
        if ((rc = bind_layer(&b, l, &w->layers[l]))) goto out;
out:
    if (rc) { m3_weights_free(w); return -1; }
    return 0;
}

void m3_weights_free(m3_weights *w) {
    if (!w->layers) return;
    for (int l = 0; l < w->n_layers; l++) {
        m3_layer_w *L = &w->layers[l];
        free(L->in_norm); free(L->post_norm); free(L->q_norm); free(L->k_norm);
        free(L->iq_norm); free(L->ik_norm); free(L->route_bias); free(L->experts);
    }
    free(w->layers);
    free(w->final_norm);
    for (int i = 0; i < M3_WEIGHTS_AUX; i++) {
        free(w->aux_vec[i]);
        w->aux_vec[i] = NULL;
    }
    w->layers = NULL;
    w->final_norm = NULL;
}

/* a dense [N, K] of fmt whose bytes are nowhere (see m3_weights_shapes) */
void m3_weights_shape_linear(m3_weights *w, m3_linear *L, m3_wfmt fmt, int N, int K) {
    static const uint8_t nowhere[64]; /* the placeholder: views offset it, nobody reads it */
    memset(L, 0, sizeof *L);
    L->fmt = fmt;
    L->N = N;
    L->K = K;
    L->gmul = 1.0f;
    L->w = nowhere;
    L->row_bytes = m3_linear_dense_row_bytes(L);
    L->scale_row = m3_linear_dense_scale_row(L);
    L->scale = L->scale_row ? nowhere : NULL;
    w->bytes_by_fmt[fmt] += m3_linear_bytes(L);
    w->count_by_fmt[fmt]++;
}

int m3_weights_shapes(m3_weights *w, const m3_config *c, int n_layers, m3_err *err) {
    memset(w, 0, sizeof *w);
    if (n_layers <= 0 || n_layers > c->n_layers) n_layers = c->n_layers;
    const int H = c->hidden, D = c->head_dim, E = c->n_experts;
    w->layers = calloc((size_t)n_layers, sizeof *w->layers);
    if (!w->layers) return m3_errf(err, "out of memory");
    w->n_layers = n_layers;
    w->hidden = H;
    w->head_dim = D;
    w->index_dim = c->index_dim;
    w->n_experts = E;
    for (int l = 0; l < n_layers; l++) {
        m3_layer_w *L = &w->layers[l];
        L->sparse = c->layer_sparse[l];
        L->moe = c->layer_moe[l];
        m3_weights_shape_linear(w, &L->q, M3_WF_MXFP8, c->n_heads * D, H);
        m3_weights_shape_linear(w, &L->k, M3_WF_MXFP8, c->n_kv_heads * D, H);
        m3_weights_shape_linear(w, &L->v, M3_WF_MXFP8, c->n_kv_heads * D, H);
        m3_weights_shape_linear(w, &L->o, M3_WF_MXFP8, H, c->n_heads * D);
        if (L->sparse) {
            m3_weights_shape_linear(w, &L->iq, M3_WF_MXFP8, c->index_heads * c->index_dim, H);
            m3_weights_shape_linear(w, &L->ik, M3_WF_MXFP8, c->index_dim, H);
        }
        if (!L->moe) {
            m3_weights_shape_linear(w, &L->mlp.gate, M3_WF_MXFP8, c->dense_inter, H);
            m3_weights_shape_linear(w, &L->mlp.up, M3_WF_MXFP8, c->dense_inter, H);
            m3_weights_shape_linear(w, &L->mlp.down, M3_WF_MXFP8, H, c->dense_inter);
            continue;
        }
        m3_weights_shape_linear(w, &L->router, M3_WF_BF16, E, H);
        L->experts = calloc((size_t)E, sizeof *L->experts);
        if (!L->experts) { m3_weights_free(w); return m3_errf(err, "out of memory"); }
        for (int e = 0; e < E; e++) {
            m3_weights_shape_linear(w, &L->experts[e].gate, M3_WF_NVFP4, c->moe_inter, H);
            m3_weights_shape_linear(w, &L->experts[e].up, M3_WF_NVFP4, c->moe_inter, H);
            m3_weights_shape_linear(w, &L->experts[e].down, M3_WF_NVFP4, H, c->moe_inter);
        }
        if (c->n_shared) {
            L->has_shared = 1;
            m3_weights_shape_linear(w, &L->shared.gate, M3_WF_MXFP8, c->shared_inter, H);
            m3_weights_shape_linear(w, &L->shared.up, M3_WF_MXFP8, c->shared_inter, H);
            m3_weights_shape_linear(w, &L->shared.down, M3_WF_MXFP8, H, c->shared_inter);
        }
    }
    m3_weights_shape_linear(w, &w->embed, M3_WF_BF16, c->vocab, H);
    m3_weights_shape_linear(w, &w->lm_head, M3_WF_BF16, c->vocab, H);
    return 0;
}

/* One tensor at a time, for other modules' checkpoints (the DSpark draft): the same
 * format detection and checks as the model's own tensors. */
int m3_weights_bind_linear(m3_st *st, const char *prefix, const char *base, int N, int K, m3_linear *L, m3_err *err) {
    m3_weights tmp;
    memset(&tmp, 0, sizeof tmp);
    snprintf(tmp.prefix, sizeof tmp.prefix, "%s", prefix);
    binder b = {NULL, st, &tmp, err};
    return bind_linear(&b, base, N, K, L);
}

int m3_weights_bind_vec(m3_st *st, const char *prefix, const char *name, int n, float **out, m3_err *err) {
    m3_weights tmp;
    memset(&tmp, 0, sizeof tmp);
    snprintf(tmp.prefix, sizeof tmp.prefix, "%s", prefix);
    binder b = {NULL, st, &tmp, err};
    return bind_vec(&b, name, n, out);
}

void m3_weights_prefault(const m3_st *st, void (*progress)(uint64_t, uint64_t, void *), void *arg) {
    uint64_t total = m3_st_total_bytes(st), done = 0, next = 64u << 20;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < m3_st_count(st); i++) {
        const m3_tensor *t = m3_st_at(st, i);
        const uint8_t *p = t->data;
        for (size_t o = 0; o < t->nbytes; o += 4096) sink ^= p[o];
        done += t->nbytes;
        if (progress && done >= next) { progress(done, total, arg); next = done + (64u << 20); }
    }
    (void)sink;
    if (progress) progress(total, total, arg);
}
