/* DSpark draft model: config, weights, context cache and the block forward (see dspark.h). */
#include "dspark.h"
#include "../base/hash.h"
#include "../io/files.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ config */

static json_t *cfg_get(json_t *text, json_t *top, const char *key) {
    json_t *v = json_object_get(text, key);
    if (!v || json_is_null(v)) v = json_object_get(top, key);
    return json_is_null(v) ? NULL : v;
}

static int cfg_int(json_t *text, json_t *top, const char *what, const char *key, int required, int def, int minv,
                   int *out, m3_err *err) {
    json_t *v = cfg_get(text, top, key);
    if (!v) {
        if (required) return m3_errf(err, "%s: missing config field '%s'", what, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < minv || json_integer_value(v) > INT_MAX)
        return m3_errf(err, "%s: config field '%s' must be an integer >= %d", what, key, minv);
    *out = (int)json_integer_value(v);
    return 0;
}

/* a boolean field that must have one value when present (features we do not implement) */
static int cfg_must(json_t *text, json_t *top, const char *what, const char *key, int want, m3_err *err) {
    json_t *v = cfg_get(text, top, key);
    if (!v) return 0;
    if (!json_is_boolean(v) || json_is_true(v) != want)
        return m3_errf(err, "%s: config field '%s' must be %s (the other variant is not supported)", what, key,
                       want ? "true" : "false");
    return 0;
}

int m3_dspark_config_parse(m3_dspark_config *c, const char *json, const char *what, const m3_config *t, m3_err *err) {
    memset(c, 0, sizeof *c);
    if (m3_config_parse(&c->base, json, what, err)) return -1;
    json_error_t je;
    json_t *root = json_loads(json, 0, &je);
    if (!root) { m3_config_free(&c->base); return m3_errf(err, "%s: bad JSON: %s", what, je.text); }
    json_t *text = json_object_get(root, "text_config");
    if (!json_is_object(text)) text = root;
    int rc = -1;
    json_t *arch = json_object_get(root, "architectures");
    if (arch && json_is_array(arch) && json_array_size(arch) > 0) {
        const char *a = json_string_value(json_array_get(arch, 0));
        if (!a || strcmp(a, "DSparkMiniMaxDraftModel") != 0) {
            m3_errf(err, "%s: architectures[0] is '%s', expected 'DSparkMiniMaxDraftModel' (is this the target's config?)",
                    what, a ? a : "?");
            goto done;
        }
    }
    const m3_config *b = &c->base;
    if (b->n_moe_layers || b->n_sparse_layers) {
        m3_errf(err, "%s: draft layers must be dense with plain attention (found %d MoE, %d sparse layers)", what,
                b->n_moe_layers, b->n_sparse_layers);
        goto done;
    }
    if (b->hidden != t->hidden || b->vocab != t->vocab) {
        m3_errf(err, "%s: hidden_size %d / vocab_size %d do not match the target's %d / %d", what, b->hidden, b->vocab,
                t->hidden, t->vocab);
        goto done;
    }
    json_t *ids = cfg_get(text, root, "dspark_target_layer_ids");
    if (!ids) { m3_errf(err, "%s: missing config field 'dspark_target_layer_ids'", what); goto done; }
    if (!json_is_array(ids) || json_array_size(ids) < 1 || json_array_size(ids) > (size_t)t->n_layers) {
        m3_errf(err, "%s: config field 'dspark_target_layer_ids' must be a list of 1 to %d layer ids", what, t->n_layers);
        goto done;
    }
    c->n_target = (int)json_array_size(ids);
    c->target_layers = malloc(sizeof(int) * (size_t)c->n_target);
    if (!c->target_layers) { m3_errf(err, "out of memory"); goto done; }
    for (int i = 0; i < c->n_target; i++) {
        json_t *x = json_array_get(ids, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= t->n_layers ||
            (i && json_integer_value(x) <= c->target_layers[i - 1])) {
            m3_errf(err, "%s: dspark_target_layer_ids[%d] must be a target layer id in [0, %d), ascending", what, i,
                    t->n_layers);
            goto done;
        }
        c->target_layers[i] = (int)json_integer_value(x);
    }
    if (cfg_int(text, root, what, "dspark_block_size", 0, 7, 1, &c->block_size, err)) goto done;
    if (cfg_int(text, root, what, "dspark_noise_token_id", 1, 0, 0, &c->noise_id, err)) goto done;
    if (c->noise_id >= b->vocab) {
        m3_errf(err, "%s: dspark_noise_token_id %d is outside the vocabulary (%d)", what, c->noise_id, b->vocab);
        goto done;
    }
    if (cfg_int(text, root, what, "dspark_markov_rank", 1, 0, 1, &c->markov_rank, err)) goto done;
    /* no sliding_window: every context position stays visible */
    if (cfg_int(text, root, what, "sliding_window", 0, INT_MAX, 1, &c->window, err)) goto done;
    json_t *mh = cfg_get(text, root, "dspark_markov_head_type");
    if (mh && (!json_is_string(mh) || strcmp(json_string_value(mh), "vanilla") != 0)) {
        m3_errf(err, "%s: dspark_markov_head_type '%s' is not supported (only 'vanilla')", what,
                json_is_string(mh) ? json_string_value(mh) : "?");
        goto done;
    }
    if (cfg_must(text, root, what, "dspark_use_dense_ffn", 1, err)) goto done;
    if (cfg_must(text, root, what, "dspark_hybrid_context_fusion", 0, err)) goto done;
    json_t *dc = cfg_get(text, root, "dspark_config");
    if (json_is_object(dc) && cfg_must(dc, dc, what, "hybrid_context_fusion", 0, err)) goto done;
    json_t *ch = cfg_get(text, root, "enable_confidence_head");
    c->confidence_head = ch && json_is_true(ch);
    rc = 0;
done:
    json_decref(root);
    if (rc) m3_dspark_config_free(c);
    return rc;
}

void m3_dspark_config_free(m3_dspark_config *c) {
    m3_config_free(&c->base);
    free(c->target_layers);
    c->target_layers = NULL;
}

/* ------------------------------------------------------------------ weights */


static int bind_lin(m3_dspark *d, const char *name, int N, int K, m3_linear *L, m3_err *err) {
    if (m3_weights_bind_linear(d->st, d->prefix, name, N, K, L, err)) return -1;
    d->n_tensors++;
    d->bytes += m3_linear_bytes(L);
    return 0;
}

static int bind_vec(m3_dspark *d, const char *name, int n, float **out, m3_err *err) {
    if (m3_weights_bind_vec(d->st, d->prefix, name, n, out, err)) return -1;
    d->n_tensors++;
    d->bytes += (uint64_t)n * 2;
    return 0;
}

/* The draft packed as an m3_weights, for the backend's upload (weights_upload, the target's
 * path: formats kept, matrices tiled like the target's): its layers as dense M3 layers, the
 * Markov head as embed (markov_w1, whose rows the embed op reads) and lm_head (markov_w2),
 * final_norm, and the rest as aux tensors. The vectors stay the draft's (pack borrows them). */
enum { AUX_FC, AUX_CONF };          /* aux[] */
enum { AUXV_HIDDEN, AUXV_CONF };    /* aux_vec[] */

static int pack(const m3_dspark *d, m3_weights *w, m3_err *err) {
    const m3_config *b = &d->cfg.base;
    memset(w, 0, sizeof *w);
    w->layers = calloc((size_t)(b->n_layers > 0 ? b->n_layers : 1), sizeof *w->layers);
    if (!w->layers) return m3_errf(err, "out of memory");
    w->n_layers = b->n_layers;
    w->hidden = b->hidden;
    w->head_dim = b->head_dim;
    for (int l = 0; l < b->n_layers; l++) {
        const m3_dspark_layer *S = &d->layers[l];
        m3_layer_w *L = &w->layers[l];
        L->in_norm = S->in_norm; L->post_norm = S->post_norm; L->q_norm = S->q_norm; L->k_norm = S->k_norm;
        L->q = S->q; L->k = S->k; L->v = S->v; L->o = S->o;
        L->mlp = S->mlp;
    }
    w->embed = d->markov_w1;
    w->lm_head = d->markov_w2;
    w->final_norm = d->final_norm;
    w->aux[AUX_FC] = d->fc;
    w->aux[AUX_CONF] = d->conf_w;
    w->aux_vec[AUXV_HIDDEN] = d->hidden_norm;
    w->aux_vec_n[AUXV_HIDDEN] = b->hidden;
    w->aux_vec[AUXV_CONF] = d->conf_bias;
    w->aux_vec_n[AUXV_CONF] = d->conf_bias ? 1 : 0;
    return 0;
}

/* the draft's fields from packed weights w (the reverse of pack) */
static void adopt(m3_dspark *d, const m3_weights *w) {
    for (int l = 0; l < d->cfg.base.n_layers; l++) {
        m3_dspark_layer *S = &d->layers[l];
        const m3_layer_w *L = &w->layers[l];
        S->in_norm = L->in_norm; S->post_norm = L->post_norm; S->q_norm = L->q_norm; S->k_norm = L->k_norm;
        S->q = L->q; S->k = L->k; S->v = L->v; S->o = L->o;
        S->mlp = L->mlp;
    }
    d->markov_w1 = w->embed;
    d->markov_w2 = w->lm_head;
    d->final_norm = w->final_norm;
    d->fc = w->aux[AUX_FC];
    d->conf_w = w->aux[AUX_CONF];
    d->hidden_norm = w->aux_vec[AUXV_HIDDEN];
    d->conf_bias = w->aux_vec[AUXV_CONF];
}

/* the host vectors the draft owns (not those of device weights) */
static void free_host_vecs(m3_dspark *d) {
    if (d->layers)
        for (int l = 0; l < d->cfg.base.n_layers; l++) {
            m3_dspark_layer *L = &d->layers[l];
            free(L->in_norm); free(L->post_norm); free(L->q_norm); free(L->k_norm);
            L->in_norm = L->post_norm = L->q_norm = L->k_norm = NULL;
        }
    free(d->hidden_norm);
    free(d->final_norm);
    free(d->conf_bias);
    d->hidden_norm = d->final_norm = d->conf_bias = NULL;
}

/* the bound weights into the backend's memory; the host vectors are dropped after */
static int upload(m3_dspark *d, m3_err *err) {
    m3_weights hw;
    if (pack(d, &hw, err)) return -1;
    d->dw = calloc(1, sizeof *d->dw);
    int rc = d->dw ? d->ops->weights_upload(d->ops->ctx, &hw, d->dw, err) : m3_errf(err, "out of memory");
    free(hw.layers); /* the vectors are the draft's */
    if (rc) {
        free(d->dw);
        d->dw = NULL;
        return -1;
    }
    free_host_vecs(d);
    adopt(d, d->dw);
    return 0;
}

/* the target's weights the draft reads (embeddings, lm_head, final norm) in the draft's memory */
static const m3_weights *target_w(const m3_dspark *d) {
    return d->ops->device_memory ? m3_model_weights(d->target) : &d->target->w;
}

int m3_dspark_weights_shapes(const m3_dspark_config *c, m3_weights *w, m3_err *err) {
    const m3_config *b = &c->base;
    if (m3_weights_shapes(w, b, b->n_layers, err)) return -1;
    /* the checkpoint's formats (random_dspark.c): BF16 fc, Markov head and confidence head */
    m3_weights_shape_linear(w, &w->embed, M3_WF_BF16, b->vocab, c->markov_rank);
    m3_weights_shape_linear(w, &w->lm_head, M3_WF_BF16, b->vocab, c->markov_rank);
    m3_weights_shape_linear(w, &w->aux[AUX_FC], M3_WF_BF16, b->hidden, c->n_target * b->hidden);
    w->aux_vec_n[AUXV_HIDDEN] = b->hidden;
    if (c->confidence_head) {
        m3_weights_shape_linear(w, &w->aux[AUX_CONF], M3_WF_BF16, 1, b->hidden + c->markov_rank);
        w->aux_vec_n[AUXV_CONF] = 1;
    }
    return 0;
}

int m3_dspark_from_device(m3_dspark *d, m3_dspark_config *cfg, const m3_model *target, m3_ops *ops, m3_weights *dw,
                          m3_err *err) {
    memset(d, 0, sizeof *d);
    d->cfg = *cfg;
    memset(cfg, 0, sizeof *cfg);
    d->target = target;
    d->ops = ops;
    d->dw = malloc(sizeof *d->dw);
    if (d->dw) *d->dw = *dw;
    else if (ops->weights_release) ops->weights_release(ops->ctx, dw);
    memset(dw, 0, sizeof *dw);
    d->layers = calloc((size_t)(d->cfg.base.n_layers > 0 ? d->cfg.base.n_layers : 1), sizeof *d->layers);
    d->capture = calloc((size_t)target->cfg.n_layers, 1);
    if (!d->dw || !d->layers || !d->capture) {
        m3_dspark_free(d);
        return m3_errf(err, "out of memory");
    }
    for (int i = 0; i < d->cfg.n_target; i++)
        if (d->cfg.target_layers[i] >= target->cfg.n_layers) {
            m3_errf(err, "dspark: target layer %d is outside the target's %d layers", d->cfg.target_layers[i],
                    target->cfg.n_layers);
            m3_dspark_free(d);
            return -1;
        } else {
            d->capture[d->cfg.target_layers[i]] = 1;
        }
    adopt(d, d->dw);
    return 0;
}

int m3_dspark_load(m3_dspark *d, const char *dir, const m3_model *target, m3_ops *ops, m3_err *err) {
    memset(d, 0, sizeof *d);
    d->target = target;
    d->ops = ops;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = m3_read_text(path, NULL, (size_t)64 << 20, err);
    if (!text) return m3_err_prefix(err, "dspark draft");
    int rc = m3_dspark_config_parse(&d->cfg, text, path, &target->cfg, err);
    free(text);
    if (rc) return -1;
    d->st = m3_st_open(dir, err);
    if (!d->st) { m3_dspark_config_free(&d->cfg); return m3_err_prefix(err, "dspark draft"); }
    static const char *prefixes[] = {"language_model.model.dspark.", "model.dspark.", "dspark.", ""};
    int found = 0;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0] && !found; i++) {
        snprintf(path, sizeof path, "%sfc.weight", prefixes[i]);
        if (m3_st_find(d->st, path)) { snprintf(d->prefix, sizeof d->prefix, "%s", prefixes[i]); found = 1; }
    }
    const m3_dspark_config *c = &d->cfg;
    const m3_config *b = &c->base;
    const int H = b->hidden, V = b->vocab, r = c->markov_rank, D = b->head_dim;
    char nm[512];
    if (!found) {
        rc = m3_errf(err, "%s: missing tensor 'language_model.model.dspark.fc.weight' (also tried 'model.dspark.', "
                          "'dspark.' and no prefix)", dir);
        goto fail;
    }
    if ((rc = bind_lin(d, "fc", H, c->n_target * H, &d->fc, err))) goto fail;
    if ((rc = bind_vec(d, "hidden_norm.weight", H, &d->hidden_norm, err))) goto fail;
    if ((rc = bind_vec(d, "final_norm.weight", H, &d->final_norm, err))) goto fail;
    if ((rc = bind_lin(d, "markov_head.markov_w1", V, r, &d->markov_w1, err))) goto fail;
    if ((rc = bind_lin(d, "markov_head.markov_w2", V, r, &d->markov_w2, err))) goto fail;
    if (c->confidence_head) {
        if ((rc = bind_lin(d, "confidence_head.proj", 1, H + r, &d->conf_w, err))) goto fail;
        if ((rc = bind_vec(d, "confidence_head.proj.bias", 1, &d->conf_bias, err))) goto fail;
    }
    d->layers = calloc((size_t)b->n_layers, sizeof *d->layers);
    d->capture = calloc((size_t)target->cfg.n_layers, 1);
    if (!d->layers || !d->capture) { rc = m3_errf(err, "out of memory"); goto fail; }
    for (int i = 0; i < c->n_target; i++) d->capture[c->target_layers[i]] = 1;
    for (int l = 0; l < b->n_layers; l++) {
        m3_dspark_layer *L = &d->layers[l];
#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
        const char *p = "layers.%d.decoder_layer.";
        char pre[64];
        snprintf(pre, sizeof pre, p, l);
        if ((rc = bind_vec(d, NM("%sinput_layernorm.weight", pre), H, &L->in_norm, err))) goto fail;
        if ((rc = bind_vec(d, NM("%spost_attention_layernorm.weight", pre), H, &L->post_norm, err))) goto fail;
        if ((rc = bind_vec(d, NM("%sself_attn.q_norm.weight", pre), D, &L->q_norm, err))) goto fail;
        if ((rc = bind_vec(d, NM("%sself_attn.k_norm.weight", pre), D, &L->k_norm, err))) goto fail;
        if ((rc = bind_lin(d, NM("%sself_attn.q_proj", pre), b->n_heads * D, H, &L->q, err))) goto fail;
        if ((rc = bind_lin(d, NM("%sself_attn.k_proj", pre), b->n_kv_heads * D, H, &L->k, err))) goto fail;
        if ((rc = bind_lin(d, NM("%sself_attn.v_proj", pre), b->n_kv_heads * D, H, &L->v, err))) goto fail;
        if ((rc = bind_lin(d, NM("%sself_attn.o_proj", pre), H, b->n_heads * D, &L->o, err))) goto fail;
        if ((rc = bind_lin(d, NM("%smlp.gate_proj", pre), b->dense_inter, H, &L->mlp.gate, err))) goto fail;
        if ((rc = bind_lin(d, NM("%smlp.up_proj", pre), b->dense_inter, H, &L->mlp.up, err))) goto fail;
        if ((rc = bind_lin(d, NM("%smlp.down_proj", pre), H, b->dense_inter, &L->mlp.down, err))) goto fail;
#undef NM
    }
    if (ops->device_memory && target->ops != ops) {
        rc = m3_errf(err, "a draft on backend '%s' must share the target's op table (it reads the target's embeddings "
                          "and lm_head there)", ops->name);
        goto fail;
    }
    if (ops->weights_upload && (rc = upload(d, err))) goto fail;
    return 0;
fail:
    m3_err_prefix(err, "dspark draft %s", dir);
    m3_dspark_free(d);
    return -1;
}

void m3_dspark_free(m3_dspark *d) {
    if (d->ws && d->ops) d->ops->release(d->ops->ctx, d->ws);
    if (d->dw) { /* the vectors are device memory, in the weights' arena */
        if (d->ops && d->ops->weights_release) d->ops->weights_release(d->ops->ctx, d->dw);
        free(d->dw);
    } else {
        free_host_vecs(d);
    }
    free(d->layers);
    free(d->capture);
    free(d->hbias);
    free(d->hpos);
    free(d->mk_hpar);
    m3_st_close(d->st);
    m3_dspark_config_free(&d->cfg);
    memset(d, 0, sizeof *d);
}

int m3_dspark_feat_dim(const m3_dspark *d) { return d->cfg.n_target * d->cfg.base.hidden; }

int m3_dspark_feat_slot(const m3_dspark *d, int l) {
    for (int i = 0; i < d->cfg.n_target; i++)
        if (d->cfg.target_layers[i] == l) return i;
    return -1;
}

/* ------------------------------------------------------------------ workspace */

/* Carves n buffers of sz[i] floats (64-byte aligned) out of the workspace, growing it. */
static size_t ws_need(int n, const size_t *sz) {
    size_t need = 0;
    for (int i = 0; i < n; i++) need += (sz[i] * 4 + 63) & ~(size_t)63;
    return need;
}

static int ws_take(m3_dspark *d, int n, const size_t *sz, float **out, m3_err *err) {
    d->lg = NULL; /* the last block's logits are gone */
    d->lg_nreq = d->lg_n = 0;
    const size_t need = ws_need(n, sz);
    if (need > d->ws_bytes) {
        if (d->ws) d->ops->release(d->ops->ctx, d->ws);
        d->ws = d->ops->alloc(d->ops->ctx, need);
        d->ws_bytes = d->ws ? need : 0;
        if (!d->ws) return m3_errf(err, "dspark: out of memory for a %zu-byte workspace", need);
    }
    char *p = d->ws;
    for (int i = 0; i < n; i++) {
        out[i] = (float *)p;
        p += (sz[i] * 4 + 63) & ~(size_t)63;
    }
    return 0;
}

/* the workspace pieces of a block pass of nreq requests x n slots (m3_dspark_block_n) */
enum { BLOCK_BUFS = 14 };
static void block_sizes(const m3_dspark *d, int nreq, int n, size_t sz[BLOCK_BUFS]) {
    const m3_config *b = &d->cfg.base;
    const size_t NR = (size_t)nreq * n, H = (size_t)b->hidden, V = (size_t)b->vocab, qw = (size_t)b->n_heads * b->head_dim,
                 kw = (size_t)b->n_kv_heads * b->head_dim, r = (size_t)d->cfg.markov_rank, q = (size_t)nreq;
    /* ... the last: the draws' parameters of a chain, a row each (m3_draw_param, in floats) */
    const size_t s[BLOCK_BUFS] = {NR * H, NR * H, NR * qw, NR * kw, NR * kw, NR * qw, NR * H, NR * V, q * r, q * V, NR + q, q * (H + r),
                                  NR, NR * ((sizeof(m3_draw_param) + 3) / 4)};
    memcpy(sz, s, sizeof s);
}

/* the workspace pieces of a context append of n positions (ctx_append) */
static void append_sizes(const m3_dspark *d, int n, size_t sz[4]) {
    const m3_config *b = &d->cfg.base;
    const size_t N = (size_t)n, kw = (size_t)b->n_kv_heads * b->head_dim;
    sz[0] = N * (size_t)m3_dspark_feat_dim(d);
    sz[1] = N * (size_t)b->hidden;
    sz[2] = sz[3] = N * kw;
}

int m3_dspark_reserve(m3_dspark *d, int max_seqs, int max_tokens, int k, size_t *ring_bytes, m3_err *err) {
    const m3_config *b = &d->cfg.base;
    size_t bs[BLOCK_BUFS], as[4];
    const int nreq = max_seqs < 1 ? 1 : max_seqs > M3_DSPARK_BATCH_MAX ? M3_DSPARK_BATCH_MAX : max_seqs;
    block_sizes(d, nreq, k < 1 ? 1 : k, bs);
    append_sizes(d, max_tokens < 1 ? 1 : max_tokens, as);
    size_t need = ws_need(BLOCK_BUFS, bs), na = ws_need(4, as);
    if (na > need) need = na;
    if (need > d->ws_bytes) {
        float *one[1];
        size_t sz1 = need / 4;
        if (ws_take(d, 1, &sz1, one, err)) return -1;
    }
    /* a request's rings at the full window, K and V of every layer */
    const size_t ring = 2 * (size_t)b->n_layers * (size_t)d->cfg.window * (size_t)b->n_kv_heads * b->head_dim * sizeof(float);
    *ring_bytes = (size_t)(max_seqs < 1 ? 1 : max_seqs) * ring;
    return 0;
}

/* ------------------------------------------------------------------ context cache */

void m3_dspark_ctx_free(m3_dspark_ctx *c) {
    for (int l = 0; l < c->n_layers; l++) {
        if (c->k && c->k[l]) c->ops->release(c->ops->ctx, c->k[l]);
        if (c->v && c->v[l]) c->ops->release(c->ops->ctx, c->v[l]);
    }
    free(c->k);
    free(c->v);
    memset(c, 0, sizeof *c);
}

void m3_dspark_ctx_reset(m3_dspark_ctx *c, int pos) {
    c->first = c->len = pos; /* the ring's memory is kept */
}

/* ring slots for positions [first, len + n) within the window, moving stored entries when it grows */
static int ctx_reserve(const m3_dspark *d, m3_dspark_ctx *c, int n, m3_err *err) {
    const m3_config *b = &d->cfg.base;
    const size_t kw = (size_t)b->n_kv_heads * b->head_dim;
    long span = (long)c->len + n - c->first;
    long want = span < d->cfg.window ? span : d->cfg.window;
    if (want <= c->cap) return 0;
    m3_ops *op = d->ops;
    if (c->k && c->ops != op) return m3_errf(err, "dspark context: made by another op table");
    if (!op->copy) return m3_errf(err, "dspark: backend '%s' has no copy op", op->name);
    if (!c->k) {
        c->ops = op;
        c->n_layers = b->n_layers;
        c->k = calloc((size_t)c->n_layers, sizeof *c->k);
        c->v = calloc((size_t)c->n_layers, sizeof *c->v);
        if (!c->k || !c->v) {
            free(c->k); free(c->v);
            c->k = c->v = NULL;
            c->n_layers = 0;
            return m3_errf(err, "dspark context: out of memory");
        }
    }
    long nc = c->cap ? c->cap : 64;
    while (nc < want) nc *= 2;
    if (nc > d->cfg.window) nc = d->cfg.window;
    /* all new rings first, so that a failure leaves the context as it was */
    float **nk = calloc((size_t)c->n_layers * 2, sizeof *nk), **nv = nk ? nk + c->n_layers : NULL;
    int ok = nk != NULL;
    for (int l = 0; ok && l < c->n_layers; l++) { /* rings in the backend's memory */
        nk[l] = op->alloc(op->ctx, sizeof(float) * (size_t)nc * kw);
        nv[l] = op->alloc(op->ctx, sizeof(float) * (size_t)nc * kw);
        ok = nk[l] && nv[l];
    }
    if (!ok) {
        for (int l = 0; nk && l < c->n_layers; l++) {
            if (nk[l]) op->release(op->ctx, nk[l]);
            if (nv[l]) op->release(op->ctx, nv[l]);
        }
        free(nk);
        return m3_errf(err, "dspark context: out of memory for %ld positions", nc);
    }
    /* entries that stay readable: [max(first, len - cap), len), moved in runs of positions that are
     * consecutive in both rings (at most three: each ring wraps once), not one copy a position (a
     * device backend would make a copy call per position and layer) */
    int lo = c->len - c->cap > c->first ? c->len - c->cap : c->first;
    for (int l = 0; l < c->n_layers; l++) {
        for (int p = lo; p < c->len;) {
            int run = c->len - p;
            if (run > c->cap - p % c->cap) run = c->cap - p % c->cap;
            if (run > nc - p % nc) run = (int)(nc - p % nc);
            const size_t bytes = sizeof(float) * kw * (size_t)run;
            op->copy(op->ctx, nk[l] + (size_t)(p % nc) * kw, c->k[l] + (size_t)(p % c->cap) * kw, bytes);
            op->copy(op->ctx, nv[l] + (size_t)(p % nc) * kw, c->v[l] + (size_t)(p % c->cap) * kw, bytes);
            p += run;
        }
        if (c->k[l]) op->release(op->ctx, c->k[l]);
        if (c->v[l]) op->release(op->ctx, c->v[l]);
        c->k[l] = nk[l];
        c->v[l] = nv[l];
    }
    free(nk);
    c->cap = (int)nc;
    return 0;
}

/* Host metadata of a pass of T rows: positions, sequence ids (all 0), token ids, grown on demand. */
static int meta_take(m3_dspark *d, int T, m3_err *err) {
    if (T <= d->meta_cap) return 0;
    int cap = T < 64 ? 64 : T;
    int32_t *p = calloc((size_t)cap * 3, sizeof *p);
    if (!p) return m3_errf(err, "dspark: out of memory");
    free(d->hpos);
    d->hpos = p;
    d->hseq = p + cap;
    d->hids = p + 2 * (size_t)cap;
    d->meta_cap = cap;
    return 0;
}

/* Starts a pass of T rows (d->hpos and d->hids filled) on the backend: a backend that copies a
 * step's metadata once (begin_step: CUDA) gets them, so that embed and head_norm_rope find
 * them in its memory. The draft's own cache is the ring, never a paged one: no kv, no pages. */
static int pass_begin(m3_dspark *d, int T, m3_err *err) {
    m3_ops *op = d->ops;
    if (!op->begin_step) return 0;
    d->pseq[0] = NULL;
    d->pb.T = T;
    d->pb.pos = d->hpos;
    d->pb.seq = d->hseq;
    d->pb.seqs = d->pseq;
    if (op->begin_step(op->ctx, NULL, &d->pb, d->hids, err)) return m3_err_prefix(err, "dspark");
    return 0;
}

/* backend copies gathered for ops.copy_n (one launch on the GPU), issued when full or flushed */
enum { COPIES_MAX = 64 };
typedef struct {
    m3_ops *op;
    int n;
    void *dst[COPIES_MAX];
    const void *src[COPIES_MAX];
    size_t bytes[COPIES_MAX];
} copies;

static void copies_flush(copies *c) {
    if (c->n) c->op->copy_n(c->op, c->n, c->dst, c->src, c->bytes);
    c->n = 0;
}

static void copies_add(copies *c, void *dst, const void *src, size_t bytes) {
    if (c->n == COPIES_MAX) copies_flush(c);
    c->dst[c->n] = dst;
    c->src[c->n] = src;
    c->bytes[c->n++] = bytes;
}

/* rows [0, n) of src (positions pos0..) into a ring of cap rows: at most two copies (the last
 * cap positions survive, wrapping once) */
static void ring_put(copies *c, float *ring, int cap, size_t kw, const float *src, int pos0, int n) {
    int t0 = n > cap ? n - cap : 0;
    while (t0 < n) {
        int slot = (pos0 + t0) % cap, m = n - t0;
        if (m > cap - slot) m = cap - slot;
        copies_add(c, ring + (size_t)slot * kw, src + (size_t)t0 * kw, (size_t)m * kw * 4);
        t0 += m;
    }
}

static int ctx_append(m3_dspark *d, const m3_dspark_rows *a, int na, int on_backend, m3_err *err) {
    const m3_config *b = &d->cfg.base;
    const m3_config *tc = &d->target->cfg;
    m3_ops *op = d->ops;
    void *X = op->ctx;
    const int H = b->hidden, F = m3_dspark_feat_dim(d), nkv = b->n_kv_heads, D = b->head_dim;
    const size_t kw = (size_t)nkv * D;
    long N = 0;
    int used = 0, only = -1;
    for (int j = 0; j < na; j++) {
        if (a[j].n < 0) return m3_errf(err, "dspark context: an append of %d positions", a[j].n);
        if (!a[j].n) continue;
        if (a[j].pos0 != a[j].ctx->len)
            return m3_errf(err, "dspark context: append at position %d, context holds [0, %d)", a[j].pos0, a[j].ctx->len);
        for (int i = 0; i < j; i++)
            if (a[i].n && a[i].ctx == a[j].ctx) return m3_errf(err, "dspark context: one context twice in an append");
        N += a[j].n;
        used++;
        only = j;
    }
    if (!N) return 0;
    if (N > INT_MAX / F) return m3_errf(err, "dspark context: an append of %ld positions", N);
    for (int j = 0; j < na; j++)
        if (a[j].n && ctx_reserve(d, a[j].ctx, a[j].n, err)) return -1;
    float *buf[4];
    size_t sz[4];
    append_sizes(d, (int)N, sz);
    if (ws_take(d, 4, sz, buf, err) || meta_take(d, (int)N, err)) return -1;
    float *x = buf[0], *cx = buf[1], *k = buf[2], *v = buf[3];
    copies cp = {.op = op};
    if (used == 1 && on_backend && !d->cfg.last_layer_final_norm) {
        x = (float *)a[only].feat; /* read in place */
    } else { /* the rows together (a copy also keeps the caller's rows from the norm below) */
        size_t r0 = 0;
        for (int j = 0; j < na; j++) {
            if (!a[j].n) continue;
            const size_t bytes = (size_t)a[j].n * F * 4;
            if (on_backend) copies_add(&cp, x + r0 * F, a[j].feat, bytes);
            else op->upload(X, x + r0 * F, a[j].feat, bytes);
            r0 += (size_t)a[j].n;
        }
        copies_flush(&cp);
    }
    if (d->cfg.last_layer_final_norm) { /* [open] the last target layer after the target's final norm */
        int s = m3_dspark_feat_slot(d, tc->n_layers - 1);
        if (s >= 0)
            for (long t = 0; t < N; t++) {
                float *row = x + (size_t)t * F + (size_t)s * H;
                op->rmsnorm(X, row, target_w(d)->final_norm, 1, H, (float)tc->rms_eps, row);
            }
    }
    for (int j = 0, t = 0; j < na; j++)
        for (int i = 0; i < a[j].n; i++, t++) {
            d->hpos[t] = a[j].pos0 + i;
            d->hids[t] = 0; /* (no embedding in this pass) */
        }
    if (pass_begin(d, (int)N, err)) return -1;
    const float eps = (float)b->rms_eps;
    op->linear(X, &d->fc, x, (int)N, cx);
    op->rmsnorm(X, cx, d->hidden_norm, (int)N, H, eps, cx);
    for (int l = 0; l < b->n_layers; l++) {
        const m3_dspark_layer *L = &d->layers[l];
        const m3_linear *Wkv[2] = {&L->k, &L->v}; /* one launch where both take the tensor cores */
        float *Ykv[2] = {k, v};
        op->linear_n(op, 2, Wkv, cx, (int)N, Ykv);
        op->head_norm_rope(X, k, (int)N, nkv, D, L->k_norm, eps, b->rotary_dim, b->rope_theta, d->hpos);
        size_t r0 = 0;
        for (int j = 0; j < na; j++) { /* into each ring (the backend's memory): every request's copies together */
            if (!a[j].n) continue;
            m3_dspark_ctx *c = a[j].ctx;
            ring_put(&cp, c->k[l], c->cap, kw, k + r0 * kw, a[j].pos0, a[j].n);
            ring_put(&cp, c->v[l], c->cap, kw, v + r0 * kw, a[j].pos0, a[j].n);
            r0 += (size_t)a[j].n;
        }
        copies_flush(&cp); /* before the next layer's K and V overwrite the rows */
    }
    if (op->check && op->check(X, err)) return m3_err_prefix(err, "dspark context");
    for (int j = 0; j < na; j++) a[j].ctx->len = a[j].pos0 + a[j].n;
    return 0;
}

int m3_dspark_ctx_append(m3_dspark *d, m3_dspark_ctx *c, const float *feat, int pos0, int n, m3_err *err) {
    const m3_dspark_rows a = {c, feat, pos0, n};
    return ctx_append(d, &a, 1, 0, err);
}

int m3_dspark_ctx_append_dev(m3_dspark *d, m3_dspark_ctx *c, const float *feat, int pos0, int n, m3_err *err) {
    const m3_dspark_rows a = {c, feat, pos0, n};
    return ctx_append(d, &a, 1, 1, err);
}

int m3_dspark_ctx_append_n(m3_dspark *d, const m3_dspark_rows *a, int na, m3_err *err) {
    return ctx_append(d, a, na, 1, err);
}

/* ------------------------------------------------------------------ block forward */

int m3_dspark_block_n(m3_dspark *d, int nreq, const m3_dspark_ctx *const *cs, const int32_t *anchor, const int *pos,
                      int n, m3_err *err) {
    d->lg = NULL;
    d->lg_nreq = d->lg_n = 0;
    if (n <= 0 || nreq <= 0 || nreq > M3_DSPARK_BATCH_MAX)
        return m3_errf(err, "dspark block: %d requests (1..%d) of %d slots", nreq, M3_DSPARK_BATCH_MAX, n);
    if (n > d->cfg.window) return m3_errf(err, "dspark block of %d slots exceeds the window (%d)", n, d->cfg.window);
    for (int j = 0; j < nreq; j++)
        if (pos[j] != cs[j]->len)
            return m3_errf(err, "dspark block at position %d, context holds [0, %d)", pos[j], cs[j]->len);
    const m3_config *b = &d->cfg.base;
    const m3_weights *tw = target_w(d);
    m3_ops *op = d->ops;
    void *X = op->ctx;
    if (!op->dspark_attention) return m3_errf(err, "dspark: backend '%s' has no DSpark attention", op->name);
    const int H = b->hidden, nh = b->n_heads, nkv = b->n_kv_heads, D = b->head_dim, R = nreq * n;
    const size_t NR = (size_t)R, qw = (size_t)nh * D, kw = (size_t)nkv * D;
    float *buf[BLOCK_BUFS];
    size_t sz[BLOCK_BUFS];
    block_sizes(d, nreq, n, sz);
    if (ws_take(d, BLOCK_BUFS, sz, buf, err) || meta_take(d, R, err)) return -1;
    float *h = buf[0], *a = buf[1], *q = buf[2], *kb = buf[3], *vb = buf[4], *att = buf[5], *o = buf[6], *lg = buf[7];
    /* rows request-major (request j's block: rows j*n..), the attention's layout */
    for (int j = 0; j < nreq; j++)
        for (int i = 0; i < n; i++) {
            d->hids[j * n + i] = i == 0 ? anchor[j] : d->cfg.noise_id;
            d->hpos[j * n + i] = pos[j] + i;
        }
    if (pass_begin(d, R, err)) return -1;
    /* every layer's view of each request's ring: readable context [max(first, len - cap), len) */
    m3_dspark_attn_req *ar = malloc(sizeof *ar * (size_t)b->n_layers * nreq);
    if (!ar) return m3_errf(err, "dspark block: out of memory");
    for (int l = 0; l < b->n_layers; l++)
        for (int j = 0; j < nreq; j++) {
            const m3_dspark_ctx *c = cs[j];
            const int rlo = c->len - c->cap > c->first ? c->len - c->cap : c->first;
            ar[(size_t)l * nreq + j] =
                (m3_dspark_attn_req){c->cap ? c->k[l] : NULL, c->cap ? c->v[l] : NULL, c->cap ? c->cap : 1, rlo, c->len, pos[j]};
        }
    /* With the requests in the backend's memory (dspark_attention_table) no op of the pass takes
     * a position from the host, and a backend with graphs may record the pass and replay it
     * (CUDA: passes of at most 8 rows, one request). Its key: what the ops are handed, besides
     * the weights: the rows, the workspace's buffers, the window. */
    int graphable = op->dspark_attention_n && op->dspark_attention_table && op->graph_begin && op->graph_end &&
                    op->dspark_attention_table(X, b->n_layers, nreq, ar, n, nh, nkv, D, d->cfg.window);
    const uint64_t gv[6] = {(uint64_t)nreq, (uint64_t)n, (uint64_t)(uintptr_t)d->ws, (uint64_t)d->cfg.window,
                            (uint64_t)(uintptr_t)lg, (uint64_t)(uintptr_t)d->fc.w}; /* (another draft's weights) */
    const uint64_t gkey = m3_fold64(0x647370617273ull /* "dspars" */, gv, 6);
issue:
    if (graphable && op->graph_begin(X, NULL, gkey)) goto issued;
    op->embed(X, &tw->embed, d->hids, R, h);
    const float eps = (float)b->rms_eps;
    /* each residual add goes with the norm after it (add_rmsnorm): the MLP's with the next
     * layer's input norm, the last one's with the final norm (one request: no reordering between) */
    op->rmsnorm(X, h, d->layers[0].in_norm, R, H, eps, a);
    for (int l = 0; l < b->n_layers; l++) {
        const m3_dspark_layer *L = &d->layers[l];
        const m3_linear *Ws[3] = {&L->q, &L->k, &L->v};
        float *Ys[3] = {q, kb, vb};
        op->linear_n(op, 3, Ws, a, R, Ys);
        const m3_rope_job jobs[2] = {{q, nh, D, L->q_norm}, {kb, nkv, D, L->k_norm}};
        op->head_norm_rope_n(op, 2, jobs, R, eps, b->rotary_dim, b->rope_theta, d->hpos);
        const m3_dspark_attn_req *al = ar + (size_t)l * nreq;
        if (op->dspark_attention_n) { /* every request in one call */
            op->dspark_attention_n(X, nreq, al, q, kb, vb, n, nh, nkv, D, d->cfg.window, att);
        } else {
            for (int j = 0; j < nreq; j++) {
                const size_t o0 = (size_t)j * n;
                op->dspark_attention(X, q + o0 * qw, kb + o0 * kw, vb + o0 * kw, n, nh, nkv, D, al[j].kr, al[j].vr, al[j].cap,
                                     al[j].lo, al[j].len, al[j].pos, d->cfg.window, att + o0 * qw);
            }
        }
        op->linear(X, &L->o, att, R, o);
        op->add_rmsnorm(op, h, o, L->post_norm, R, H, eps, a);
        op->mlp(X, &L->mlp, a, R, (float)b->swiglu_alpha, (float)b->swiglu_limit, o);
        if (l + 1 < b->n_layers) op->add_rmsnorm(op, h, o, d->layers[l + 1].in_norm, R, H, eps, a);
        else if (nreq == 1) op->add_rmsnorm(op, h, o, d->final_norm, R, H, eps, a);
        else op->add(X, h, o, NR * H);
    }
    /* the final norm and lm_head slot-major (slot i of every request: rows i*nreq..), so that
     * a slot's Markov rows are added and downloaded in one piece */
    if (nreq > 1) {
        float *hs = o; /* free now */
        for (int i = 0; i < n; i++)
            op->copy_rows(op, hs + (size_t)i * nreq * H, (size_t)H * 4, h + (size_t)i * H, (size_t)n * H * 4,
                          (size_t)H * 4, (size_t)nreq);
        op->rmsnorm(X, hs, d->final_norm, R, H, eps, a);
    }
    op->linear(X, &tw->lm_head, a, R, lg);
    if (graphable && op->graph_end(X)) { /* recording failed: the ops issued directly */
        graphable = 0;
        goto issue;
    }
issued:
    free(ar);
    if (op->check && op->check(X, err)) return m3_err_prefix(err, "dspark block");
    d->lg = lg;
    d->mk_r = buf[8];
    d->mk_v = buf[9];
    d->mk_ids = (int32_t *)buf[10];
    d->lg_h = a; /* no later op of the pass writes it */
    d->cf_in = buf[11];
    d->cf_out = buf[12];
    d->mk_par = (m3_draw_param *)buf[13];
    d->lg_nreq = nreq;
    d->lg_n = n;
    return 0;
}

int m3_dspark_markov_n(m3_dspark *d, int slot, const int32_t *prev, float *rows, m3_err *err) {
    const int V = d->cfg.base.vocab, nreq = d->lg_nreq;
    if (!d->lg || slot < 0 || slot >= d->lg_n) return m3_errf(err, "dspark markov: slot %d of no block pass", slot);
    m3_ops *op = d->ops;
    void *X = op->ctx;
    if (meta_take(d, nreq, err)) return -1;
    for (int j = 0; j < nreq; j++) {
        if (prev[j] < 0 || prev[j] >= V)
            return m3_errf(err, "dspark markov: token %d outside the vocabulary (%d)", (int)prev[j], V);
        d->hids[j] = prev[j];
        d->hpos[j] = 0;
    }
    if (pass_begin(d, nreq, err)) return -1;
    float *row = d->lg + (size_t)slot * nreq * V;
    op->embed(X, &d->markov_w1, d->hids, nreq, d->mk_r);
    op->linear(X, &d->markov_w2, d->mk_r, nreq, d->mk_v);
    op->add(X, row, d->mk_v, (size_t)nreq * V);
    if (rows) op->download(X, rows, row, sizeof(float) * (size_t)nreq * V);
    if (op->check && op->check(X, err)) return m3_err_prefix(err, "dspark markov");
    return 0;
}

int m3_dspark_argmax_n(m3_dspark *d, int slot, int n_text, int32_t *ids, m3_err *err) {
    const int V = d->cfg.base.vocab, nreq = d->lg_nreq;
    m3_ops *op = d->ops;
    if (!op->argmax_rows) return m3_errf(err, "dspark: backend '%s' has no argmax_rows op", op->name);
    if (!d->lg || slot < 0 || slot >= d->lg_n) return m3_errf(err, "dspark argmax: slot %d of no block pass", slot);
    if (n_text < 1 || n_text > V) return m3_errf(err, "dspark argmax: %d text ids of %d", n_text, V);
    op->argmax_rows(op->ctx, d->lg + (size_t)slot * nreq * V, nreq, n_text, (size_t)V, d->mk_ids);
    op->download(op->ctx, ids, d->mk_ids, sizeof(int32_t) * (size_t)nreq);
    if (op->check && op->check(op->ctx, err)) return m3_err_prefix(err, "dspark argmax");
    return 0;
}

/* Slots 0..k-1 of the last block pass, each Markov row corrected with the draw before it (the
 * anchor at slot 0): greedy (par NULL: argmax_rows over [0, n_text)) or drawn (draw_rows with
 * par, slot i's uniforms u[i * nreq ..]), one download of the ids at the end. */
static int chain_n(m3_dspark *d, const int32_t *anchor, int k, int n_text, const m3_draw_param *par, const double *u,
                   int32_t *ids, float *const *q, float *const *qd, float *conf, m3_err *err) {
    const int V = d->cfg.base.vocab, H = d->cfg.base.hidden, r = d->cfg.markov_rank, nreq = d->lg_nreq;
    m3_ops *op = d->ops;
    void *X = op->ctx;
    if (!op->embed_dev || !(par ? op->draw_rows != NULL : op->argmax_rows != NULL))
        return m3_errf(err, "dspark: backend '%s' has no device %s draws", op->name, par ? "probabilistic" : "greedy");
    if (!d->lg || k < 1 || k > d->lg_n) return m3_errf(err, "dspark draws: %d slots of a block pass of %d", k, d->lg_n);
    if (!par && (n_text < 1 || n_text > V)) return m3_errf(err, "dspark greedy: %d text ids of %d", n_text, V);
    if (conf && (!d->cfg.confidence_head || !d->conf_w.w)) return m3_errf(err, "dspark: the draft has no confidence head");
    if (conf && !op->copy_rows) return m3_errf(err, "dspark: backend '%s' has no copy_rows op", op->name);
    for (int j = 0; j < nreq; j++) {
        if (anchor[j] < 0 || anchor[j] >= V)
            return m3_errf(err, "dspark draws: token %d outside the vocabulary (%d)", (int)anchor[j], V);
        if (par && (par[j].n < 1 || par[j].n > V)) return m3_errf(err, "dspark draws: %d text ids of %d", par[j].n, V);
        for (int i = 0; par && i < k; i++)
            if (!(u[(size_t)i * nreq + j] >= 0 && u[(size_t)i * nreq + j] < 1))
                return m3_errf(err, "dspark draws: uniform %g outside [0, 1)", u[(size_t)i * nreq + j]);
    }
    /* mk_ids [k + 1][nreq]: the anchors, then each slot's draws, which the next slot's Markov
     * row reads where they are */
    op->upload(X, d->mk_ids, anchor, sizeof(int32_t) * (size_t)nreq);
    m3_draw_param pp[M3_DSPARK_BATCH_MAX];
    const size_t row = sizeof(float) * (size_t)(H + r);
    /* A chain takes nothing from the host but its shape once the anchors (and, drawn, every
     * slot's parameters: draw_rows_dev) are uploaded: a backend with graphs may record one and
     * replay it (CUDA: after a block pass of at most 8 rows). */
    int pdev = par && op->draw_rows_dev && d->mk_par;
    if (pdev && k * nreq > d->mk_hpar_cap) {
        m3_draw_param *h = realloc(d->mk_hpar, sizeof *h * (size_t)k * nreq);
        if (h) {
            d->mk_hpar = h;
            d->mk_hpar_cap = k * nreq;
        }
        pdev = h != NULL; /* (else the parameters go with each launch) */
    }
    if (pdev) {
        for (size_t x = 0; x < (size_t)k * nreq; x++) { /* slot x / nreq of request x % nreq */
            d->mk_hpar[x] = par[x % nreq];
            d->mk_hpar[x].u = u[x];
        }
        op->upload(X, d->mk_par, d->mk_hpar, sizeof(m3_draw_param) * (size_t)k * nreq);
    }
    int graphable = (!par || pdev) && op->graph_begin && op->graph_end;
    const uint64_t gv[8] = {(uint64_t)nreq, (uint64_t)k, (uint64_t)n_text, (uint64_t)(conf != NULL), (uint64_t)(uintptr_t)d->ws,
                            (uint64_t)(uintptr_t)d->lg, (uint64_t)pdev, (uint64_t)(uintptr_t)d->markov_w2.w};
    const uint64_t gkey = m3_fold64(0x6463686169ull /* "dchai" */, gv, 8);
issue:
    if (graphable && op->graph_begin(X, NULL, gkey)) goto issued;
    for (int i = 0; i < k; i++) {
        float *lg = d->lg + (size_t)i * nreq * V;
        op->embed_dev(X, &d->markov_w1, d->mk_ids + (size_t)i * nreq, nreq, d->mk_r);
        op->linear(X, &d->markov_w2, d->mk_r, nreq, d->mk_v);
        op->add(X, lg, d->mk_v, (size_t)nreq * V);
        if (conf) { /* the head reads the same Markov input as the correction */
            op->copy_rows(op, d->cf_in, row, d->lg_h + (size_t)i * nreq * H, sizeof(float) * (size_t)H,
                          sizeof(float) * (size_t)H, (size_t)nreq);
            op->copy_rows(op, d->cf_in + H, row, d->mk_r, sizeof(float) * (size_t)r, sizeof(float) * (size_t)r, (size_t)nreq);
            op->linear(X, &d->conf_w, d->cf_in, nreq, d->cf_out + (size_t)i * nreq);
        }
        if (pdev) {
            op->draw_rows_dev(X, lg, nreq, V, (size_t)V, d->mk_par + (size_t)i * nreq, d->mk_ids + (size_t)(i + 1) * nreq);
        } else if (par) {
            for (int j = 0; j < nreq; j++) {
                pp[j] = par[j];
                pp[j].u = u[(size_t)i * nreq + j];
            }
            op->draw_rows(X, lg, nreq, V, (size_t)V, pp, d->mk_ids + (size_t)(i + 1) * nreq);
        } else {
            op->argmax_rows(X, lg, nreq, n_text, (size_t)V, d->mk_ids + (size_t)(i + 1) * nreq);
        }
    }
    if (graphable && op->graph_end(X)) { /* recording failed: the ops issued directly */
        graphable = 0;
        goto issue;
    }
issued:
    op->download(X, ids, d->mk_ids + nreq, sizeof(int32_t) * (size_t)k * nreq);
    const size_t rb = sizeof(float) * (size_t)V;
    for (int j = 0; (q || qd) && j < nreq; j++) { /* request j's distributions: rows (i, j) of the slot-major rows */
        if (qd && qd[j]) op->copy_rows(op, qd[j], rb, d->lg + (size_t)j * V, rb * nreq, rb, (size_t)k);
        else
            for (int i = 0; q && q[j] && i < k; i++) op->download(X, q[j] + (size_t)i * V, d->lg + ((size_t)i * nreq + j) * V, rb);
    }
    if (conf) {
        op->download(X, conf, d->cf_out, sizeof(float) * (size_t)k * nreq);
        if (!d->conf_bias_read) op->download(X, &d->conf_bias_h, d->conf_bias, sizeof d->conf_bias_h);
    }
    if (op->check && op->check(X, err)) return m3_err_prefix(err, par ? "dspark draws" : "dspark greedy");
    if (conf) {
        d->conf_bias_read = 1;
        for (size_t x = 0; x < (size_t)k * nreq; x++) conf[x] = 1.0f / (1.0f + expf(-(conf[x] + d->conf_bias_h)));
    }
    return 0;
}

int m3_dspark_greedy_n(m3_dspark *d, const int32_t *anchor, int k, int n_text, int32_t *ids, float *conf, m3_err *err) {
    return chain_n(d, anchor, k, n_text, NULL, NULL, ids, NULL, NULL, conf, err);
}

int m3_dspark_draw_n(m3_dspark *d, const int32_t *anchor, int k, const m3_draw_param *par, const double *u, int32_t *ids,
                     float *const *q, float *const *qd, float *conf, m3_err *err) {
    if (!par || !u) return m3_errf(err, "dspark draws: no parameters");
    return chain_n(d, anchor, k, 0, par, u, ids, q, qd, conf, err);
}

int m3_dspark_confidence_n(m3_dspark *d, int slot, float *conf, m3_err *err) {
    const int H = d->cfg.base.hidden, r = d->cfg.markov_rank, nreq = d->lg_nreq;
    m3_ops *op = d->ops;
    if (!d->cfg.confidence_head || !d->conf_w.w) return m3_errf(err, "dspark: the draft has no confidence head");
    if (!d->lg || slot < 0 || slot >= d->lg_n) return m3_errf(err, "dspark confidence: slot %d of no block pass", slot);
    if (!op->copy_rows) return m3_errf(err, "dspark: backend '%s' has no copy_rows op", op->name);
    const size_t row = sizeof(float) * (size_t)(H + r);
    op->copy_rows(op, d->cf_in, row, d->lg_h + (size_t)slot * nreq * H, sizeof(float) * (size_t)H, sizeof(float) * (size_t)H,
                  (size_t)nreq);
    op->copy_rows(op, d->cf_in + H, row, d->mk_r, sizeof(float) * (size_t)r, sizeof(float) * (size_t)r, (size_t)nreq);
    op->linear(op->ctx, &d->conf_w, d->cf_in, nreq, d->cf_out);
    op->download(op->ctx, conf, d->cf_out, sizeof(float) * (size_t)nreq);
    if (!d->conf_bias_read) op->download(op->ctx, &d->conf_bias_h, d->conf_bias, sizeof d->conf_bias_h);
    if (op->check && op->check(op->ctx, err)) return m3_err_prefix(err, "dspark confidence");
    d->conf_bias_read = 1;
    for (int j = 0; j < nreq; j++) conf[j] = 1.0f / (1.0f + expf(-(conf[j] + d->conf_bias_h)));
    return 0;
}

int m3_dspark_block_logits(m3_dspark *d, const m3_dspark_ctx *c, int32_t anchor, int pos, int n, float *logits,
                           m3_err *err) {
    if (n <= 0) return 0;
    if (m3_dspark_block_n(d, 1, &c, &anchor, &pos, n, err)) return -1;
    d->ops->download(d->ops->ctx, logits, d->lg, sizeof(float) * (size_t)n * d->cfg.base.vocab);
    if (d->ops->check && d->ops->check(d->ops->ctx, err)) return m3_err_prefix(err, "dspark block");
    return 0;
}

int m3_dspark_markov(m3_dspark *d, int32_t prev, float *logits, m3_err *err) {
    const int V = d->cfg.base.vocab, r = d->cfg.markov_rank;
    if (prev < 0 || prev >= V) return m3_errf(err, "dspark markov: token %d outside the vocabulary (%d)", (int)prev, V);
    m3_ops *op = d->ops;
    float *buf[2];
    size_t sz[2] = {(size_t)r, (size_t)V};
    d->lg = NULL; /* the workspace is carved anew */
    if (ws_take(d, 2, sz, buf, err) || meta_take(d, 1, err)) return -1;
    d->hids[0] = prev;
    d->hpos[0] = 0;
    if (pass_begin(d, 1, err)) return -1;
    op->embed(op->ctx, &d->markov_w1, d->hids, 1, buf[0]);
    op->linear(op->ctx, &d->markov_w2, buf[0], 1, buf[1]);
    if (op->check && op->check(op->ctx, err)) return m3_err_prefix(err, "dspark markov");
    const float *bias = buf[1];
    if (op->device_memory) { /* the row comes to the host */
        if (!d->hbias && !(d->hbias = malloc(sizeof(float) * (size_t)V))) return m3_errf(err, "dspark markov: out of memory");
        op->download(op->ctx, d->hbias, buf[1], sizeof(float) * (size_t)V);
        bias = d->hbias;
    }
    for (int i = 0; i < V; i++) logits[i] += bias[i];
    return 0;
}
