/* The MiniMax-M3 vision tower on a host-memory backend: config, weights, forward, prompt
 * expansion. See vision.h; the math is spec section 6. */
#include "vision.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/num.h"
#include "../io/files.h"

/* ------------------------------------------------------------------ config */

static int vget_int(json_t *o, const char *key, int *out, int def, int minv, const char *what, const char *sect, m3_err *err) {
    json_t *v = o ? json_object_get(o, key) : NULL;
    if (!v || json_is_null(v)) {
        if (def < 0) return m3_errf(err, "%s: missing config field '%s%s'", what, sect, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < minv || json_integer_value(v) > (1 << 24))
        return m3_errf(err, "%s: config field '%s%s' must be an integer >= %d", what, sect, key, minv);
    *out = (int)json_integer_value(v);
    return 0;
}

int m3_vision_config_parse(m3_vision_config *vc, const char *text, const char *what, m3_err *err) {
    memset(vc, 0, sizeof *vc);
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) return m3_errf(err, "%s: bad JSON: %s (line %d, column %d)", what, je.text, je.line, je.column);
    int rc = 0;
    json_t *v = json_is_object(root) ? json_object_get(root, "vision_config") : NULL;
    if (!v || json_is_null(v)) { json_decref(root); return 1; }
    const char *S = "vision_config.";
#define TRY(x) do { if ((x)) { rc = -1; goto done; } } while (0)
    if (!json_is_object(v)) { rc = m3_errf(err, "%s: 'vision_config' is not an object", what); goto done; }
    TRY(vget_int(v, "hidden_size", &vc->hidden, -1, 1, what, S, err));
    TRY(vget_int(v, "intermediate_size", &vc->inter, -1, 1, what, S, err));
    TRY(vget_int(v, "num_hidden_layers", &vc->layers, -1, 0, what, S, err));
    TRY(vget_int(v, "num_attention_heads", &vc->heads, -1, 1, what, S, err));
    TRY(vget_int(v, "num_channels", &vc->channels, 3, 1, what, S, err));
    TRY(vget_int(v, "patch_size", &vc->patch, 14, 1, what, S, err));
    if (vc->hidden % vc->heads) {
        rc = m3_errf(err, "%s: vision hidden_size %d is not a multiple of num_attention_heads %d", what, vc->hidden, vc->heads);
        goto done;
    }
    vc->head_dim = vc->hidden / vc->heads;
    if (vc->head_dim > 2048) { rc = m3_errf(err, "%s: vision head_dim %d is larger than 2048", what, vc->head_dim); goto done; }
    /* temporal / merge sizes: in vision_config (transformers), or its img_token_compression_config
     * (hub, vLLM), or a top-level img_token_compression_config */
    {
        json_t *cc = json_object_get(v, "img_token_compression_config");
        if (!json_is_object(cc)) cc = json_object_get(root, "img_token_compression_config");
        if (cc && !json_is_object(cc)) cc = NULL;
        json_t *m = cc ? json_object_get(cc, "image_token_compression_method") : NULL;
        if (m && !(json_is_string(m) && !strcmp(json_string_value(m), "patch_merge"))) {
            rc = m3_errf(err, "%s: image_token_compression_method '%s' is not supported (only 'patch_merge')", what,
                         json_is_string(m) ? json_string_value(m) : "?");
            goto done;
        }
        int def_t = 2, def_m = 2;
        TRY(vget_int(cc, "temporal_patch_size", &def_t, 2, 1, what, "img_token_compression_config.", err));
        TRY(vget_int(cc, "spatial_merge_size", &def_m, 2, 1, what, "img_token_compression_config.", err));
        TRY(vget_int(v, "temporal_patch_size", &vc->temporal, def_t, 1, what, S, err));
        TRY(vget_int(v, "spatial_merge_size", &vc->merge, def_m, 1, what, S, err));
    }
    {
        json_t *e = json_object_get(v, "layer_norm_eps");
        vc->ln_eps = 1e-5;
        if (e && !json_is_null(e)) {
            if (!json_is_number(e) || !(json_number_value(e) >= 0)) { rc = m3_errf(err, "%s: vision_config.layer_norm_eps must be a number >= 0", what); goto done; }
            vc->ln_eps = json_number_value(e);
        }
        /* the hub's CLIP-style spelling names the position scheme: only the 3-D RoPE exists here */
        json_t *pe = json_object_get(v, "position_embedding_type"), *rm = json_object_get(v, "rope_mode");
        if ((pe && !json_is_null(pe) && !(json_is_string(pe) && !strcmp(json_string_value(pe), "rope"))) ||
            (rm && !json_is_null(rm) && !(json_is_string(rm) && !strcmp(json_string_value(rm), "3d")))) {
            rc = m3_errf(err, "%s: vision position embedding '%s' / rope_mode '%s' is not supported (only 'rope' / '3d')", what,
                         json_is_string(pe) ? json_string_value(pe) : "rope", json_is_string(rm) ? json_string_value(rm) : "3d");
            goto done;
        }
        json_t *th = json_object_get(v, "rope_theta"), *rp = json_object_get(v, "rope_parameters");
        if ((!th || json_is_null(th)) && json_is_object(rp)) th = json_object_get(rp, "rope_theta");
        vc->rope_theta = 1e4;
        if (th && !json_is_null(th)) {
            if (!json_is_number(th) || !(json_number_value(th) > 0)) { rc = m3_errf(err, "%s: vision rope_theta must be a positive number", what); goto done; }
            vc->rope_theta = json_number_value(th);
        }
        /* exact-erf GELU everywhere (vision MLP, projector, merge) */
        const char *acts[2] = {"hidden_act", "projector_hidden_act"};
        json_t *objs[2] = {v, root};
        for (int i = 0; i < 2; i++) {
            json_t *a = json_object_get(objs[i], acts[i]);
            if (a && !json_is_null(a) && !(json_is_string(a) && !strcmp(json_string_value(a), "gelu"))) {
                rc = m3_errf(err, "%s: %s%s '%s' is not supported (only 'gelu')", what, i ? "" : S, acts[i],
                             json_is_string(a) ? json_string_value(a) : "?");
                goto done;
            }
        }
    }
    TRY(vget_int(root, "projector_hidden_size", &vc->proj_hidden, -1, 1, what, "", err));
    {
        json_t *tc = json_object_get(root, "text_config");
        TRY(vget_int(json_is_object(tc) ? tc : root, "hidden_size", &vc->text_hidden, -1, 1, what, json_is_object(tc) ? "text_config." : "", err));
        json_t *it = json_object_get(root, "image_token_index");
        if (!it || json_is_null(it)) it = json_object_get(root, "image_token_id");
        json_t *vt = json_object_get(root, "video_token_index");
        if (!vt || json_is_null(vt)) vt = json_object_get(root, "video_token_id");
        if (!json_is_integer(it) || json_integer_value(it) < 0 || json_integer_value(it) > INT32_MAX) {
            rc = m3_errf(err, "%s: missing or bad config field 'image_token_index'", what);
            goto done;
        }
        vc->image_token = (int)json_integer_value(it);
        vc->video_token = json_is_integer(vt) && json_integer_value(vt) >= 0 && json_integer_value(vt) <= INT32_MAX
                              ? (int)json_integer_value(vt) : -1;
    }
#undef TRY
done:
    json_decref(root);
    if (rc) memset(vc, 0, sizeof *vc);
    return rc ? -1 : 0;
}

/* ------------------------------------------------------------------ weights */

void m3_vision_free(m3_vision *v) {
    if (!v) return;
    free(v->pre_w); free(v->pre_b);
    m3_vlinear *vl[4] = {&v->proj1, &v->proj2, &v->merge1, &v->merge2};
    for (int i = 0; i < 4; i++) free(vl[i]->b);
    if (v->layers)
        for (int l = 0; l < v->cfg.layers; l++) {
            m3_vision_layer *L = &v->layers[l];
            free(L->ln1_w); free(L->ln1_b); free(L->ln2_w); free(L->ln2_b);
            m3_vlinear *ll[6] = {&L->q, &L->k, &L->v, &L->o, &L->fc1, &L->fc2};
            for (int i = 0; i < 6; i++) free(ll[i]->b);
        }
    free(v->layers);
    memset(v, 0, sizeof *v);
}

static int bind_vlin(m3_st *st, const char *pfx, const char *base, int N, int K, m3_vlinear *L, m3_err *err) {
    char nm[256];
    if (m3_weights_bind_linear(st, pfx, base, N, K, &L->w, err)) return -1;
    snprintf(nm, sizeof nm, "%s.bias", base);
    return m3_weights_bind_vec(st, pfx, nm, N, &L->b, err);
}

static int bind_ln(m3_st *st, const char *pfx, const char *base, int n, float **w, float **b, m3_err *err) {
    char nm[256];
    snprintf(nm, sizeof nm, "%s.weight", base);
    if (m3_weights_bind_vec(st, pfx, nm, n, w, err)) return -1;
    snprintf(nm, sizeof nm, "%s.bias", base);
    return m3_weights_bind_vec(st, pfx, nm, n, b, err);
}

#define VT "vision_tower.vision_model."

int m3_vision_load(m3_vision *v, const char *dir, m3_st *st, m3_err *err) {
    memset(v, 0, sizeof *v);
    const char *pfx = NULL;
    char nm[256];
    if (m3_st_find(st, VT "embeddings.patch_embedding.weight")) pfx = "";
    else if (m3_st_find(st, "model." VT "embeddings.patch_embedding.weight")) pfx = "model.";
    if (!pfx) return 0; /* text-only checkpoint */
    snprintf(v->prefix, sizeof v->prefix, "%s", pfx);
    /* config */
    char path[4096];
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(path, sizeof path, "%s/config.json", dir);
    else snprintf(path, sizeof path, "%s", dir);
    char *text = m3_read_text(path, "config", (size_t)64 << 20, err);
    if (!text) return -1;
    int prc = m3_vision_config_parse(&v->cfg, text, path, err);
    free(text);
    if (prc < 0) return -1;
    if (prc == 1) return m3_errf(err, "%s: the checkpoint has vision tensors ('%s" VT "...') but no vision_config", path, pfx);
    const m3_vision_config *c = &v->cfg;
    const int Hv = c->hidden, I = c->inter, P = c->proj_hidden, H = c->text_hidden, MM = c->merge * c->merge;
    const int PD = c->channels * c->temporal * c->patch * c->patch;
    /* patch embedding: the Conv3d weight [Hv, C, T, P, P] is a linear over the flattened patch */
    snprintf(nm, sizeof nm, "%s" VT "embeddings.patch_embedding.weight", pfx);
    const m3_tensor *t = m3_st_find(st, nm);
    int64_t want[5] = {Hv, c->channels, c->temporal, c->patch, c->patch};
    int ok = t->ndim == 5;
    for (int i = 0; ok && i < 5; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        char ws[128], fs[128];
        m3_shape_str(want, 5, ws, sizeof ws);
        m3_shape_str(t->shape, t->ndim, fs, sizeof fs);
        return m3_errf(err, "tensor '%s': expected shape %s, found %s", nm, ws, fs);
    }
    if (t->dtype != M3_DT_BF16 && t->dtype != M3_DT_F16 && t->dtype != M3_DT_F32)
        return m3_errf(err, "tensor '%s': dtype %s not supported (BF16, F16 or F32)", nm, m3_dtype_name(t->dtype));
    v->patch.fmt = t->dtype == M3_DT_BF16 ? M3_WF_BF16 : t->dtype == M3_DT_F16 ? M3_WF_F16 : M3_WF_F32;
    v->patch.N = Hv;
    v->patch.K = PD;
    v->patch.w = t->data;
    v->patch.row_bytes = (size_t)PD * m3_dtype_size(t->dtype);
    int rc = 0;
#define TRY(x) do { if ((x)) { rc = -1; goto out; } } while (0)
    TRY(bind_ln(st, pfx, VT "pre_layrnorm", Hv, &v->pre_w, &v->pre_b, err));
    v->layers = calloc((size_t)(c->layers ? c->layers : 1), sizeof *v->layers);
    if (!v->layers) { rc = m3_errf(err, "out of memory"); goto out; }
    for (int l = 0; l < c->layers; l++) {
        m3_vision_layer *L = &v->layers[l];
        char b[160];
#define NM(s) (snprintf(b, sizeof b, VT "encoder.layers.%d.%s", l, s), b)
        TRY(bind_ln(st, pfx, NM("layer_norm1"), Hv, &L->ln1_w, &L->ln1_b, err));
        TRY(bind_ln(st, pfx, NM("layer_norm2"), Hv, &L->ln2_w, &L->ln2_b, err));
        TRY(bind_vlin(st, pfx, NM("self_attn.q_proj"), Hv, Hv, &L->q, err));
        TRY(bind_vlin(st, pfx, NM("self_attn.k_proj"), Hv, Hv, &L->k, err));
        TRY(bind_vlin(st, pfx, NM("self_attn.v_proj"), Hv, Hv, &L->v, err));
        TRY(bind_vlin(st, pfx, NM("self_attn.out_proj"), Hv, Hv, &L->o, err));
        TRY(bind_vlin(st, pfx, NM("mlp.fc1"), I, Hv, &L->fc1, err));
        TRY(bind_vlin(st, pfx, NM("mlp.fc2"), Hv, I, &L->fc2, err));
#undef NM
    }
    TRY(bind_vlin(st, pfx, "multi_modal_projector.linear_1", P, Hv, &v->proj1, err));
    TRY(bind_vlin(st, pfx, "multi_modal_projector.linear_2", H, P, &v->proj2, err));
    TRY(bind_vlin(st, pfx, "patch_merge_mlp.linear_1", P, MM * H, &v->merge1, err));
    TRY(bind_vlin(st, pfx, "patch_merge_mlp.linear_2", H, P, &v->merge2, err));
#undef TRY
    v->present = 1;
out:
    if (rc) {
        m3_vision_config keep = v->cfg;
        m3_vision_free(v);
        v->cfg = keep;
    }
    return rc;
}

/* ------------------------------------------------------------------ shapes */

int m3_vision_image_tokens(const m3_vision_config *vc, const int32_t thw[3]) {
    int m = vc->merge;
    if (thw[0] < 1 || thw[1] < 1 || thw[2] < 1 || thw[1] % m || thw[2] % m) return -1;
    int64_t n = (int64_t)thw[0] * (thw[1] / m) * (thw[2] / m);
    return n > (1 << 26) ? -1 : (int)n;
}

int m3_vision_check_pixels(const m3_vision_config *vc, const m3_pixels *px, m3_err *err) {
    int D = vc->channels * vc->temporal * vc->patch * vc->patch;
    if (px->n_images < 1) return m3_errf(err, "no images");
    if (px->patch_dim != D)
        return m3_errf(err, "pixel values have %d values per patch, the vision tower takes %d (%d x %d x %d x %d)", px->patch_dim,
                       D, vc->channels, vc->temporal, vc->patch, vc->patch);
    int64_t rows = 0, tok = 0;
    for (int i = 0; i < px->n_images; i++) {
        const int32_t *g = px->grid + 3 * i;
        int n = m3_vision_image_tokens(vc, g);
        if (n < 0)
            return m3_errf(err, "image %d: grid (%d, %d, %d) does not split into %d x %d merge blocks", i, g[0], g[1], g[2],
                           vc->merge, vc->merge);
        int64_t np = (int64_t)g[0] * g[1] * g[2];
        if (np > M3_VISION_MAX_PATCHES)
            return m3_errf(err, "image %d: %lld patches; at most %d per image (attention scores are n x n)", i, (long long)np,
                           M3_VISION_MAX_PATCHES);
        rows += np;
        tok += n;
    }
    if (rows != px->n_patches) return m3_errf(err, "image grids add up to %lld patches, pixel values have %d", (long long)rows, px->n_patches);
    if (tok > (1 << 26)) return m3_errf(err, "too many image tokens (%lld)", (long long)tok);
    return (int)tok;
}

/* ------------------------------------------------------------------ forward */

/* Vision RoPE (spec section 6): d3 = 2*((hd/3)/2) channels per axis; the first 3*d3 channels
 * of each head rotate NeoX style (i with i + 3*d3/2) by angles [t*f, row*f, col*f],
 * f[j] = theta^(-2j/d3); the rest pass through. Patches are block-major: (t, block row,
 * block col, row in block, col in block). cs/sn: [n][3*d3/2], host memory. */
static int rope_tables(const m3_vision_config *c, const int32_t thw[3], float **cs, float **sn) {
    int hd = c->head_dim, d3 = 2 * (((2 * (hd / 2)) / 3) / 2), half = 3 * d3 / 2, m = c->merge;
    int n = thw[0] * thw[1] * thw[2];
    *cs = *sn = NULL;
    if (!half) return 0;
    float *a = malloc(sizeof(float) * (size_t)n * half * 2);
    if (!a) return -1;
    double inv[1024]; /* d3 / 2 <= head_dim / 6 < 1024 (head_dim <= 2048, checked at load) */
    for (int j = 0; j < d3 / 2; j++) inv[j] = 1.0 / pow(c->rope_theta, (double)(2 * j) / d3);
    int gh = thw[1], gw = thw[2], bw = gw / m;
    for (int p = 0; p < n; p++) {
        int t = p / (gh * gw), q = p % (gh * gw), blk = q / (m * m), in = q % (m * m);
        int row = (blk / bw) * m + in / m, col = (blk % bw) * m + in % m;
        double pos[3] = {t, row, col};
        for (int ax = 0; ax < 3; ax++)
            for (int j = 0; j < d3 / 2; j++) {
                double ang = pos[ax] * inv[j];
                a[(size_t)p * half + ax * (d3 / 2) + j] = (float)cos(ang);
                a[(size_t)n * half + (size_t)p * half + ax * (d3 / 2) + j] = (float)sin(ang);
            }
    }
    *cs = a;
    *sn = a + (size_t)n * half;
    return 0;
}

static void vlinear(m3_ops *op, const m3_vlinear *L, const float *x, int T, float *y, int gelu) {
    op->linear(op->ctx, &L->w, x, T, y);
    op->bias_act(op->ctx, y, L->b, T, L->w.N, gelu);
}

/* ---- the tower's weights in a device backend's memory (m3_vision_upload) ---- */

static void *dev_copy(m3_ops *op, const void *src, size_t bytes, int *bad) {
    if (!src || !bytes || *bad) return NULL;
    void *p = op->alloc(op->ctx, bytes);
    if (!p) { *bad = 1; return NULL; }
    op->upload(op->ctx, p, src, bytes);
    return p;
}
static void dev_linear(m3_ops *op, const m3_linear *h, m3_linear *d, int *bad) {
    *d = *h;
    d->w = dev_copy(op, h->w, h->row_bytes * (size_t)h->N, bad);
    d->scale = h->scale ? dev_copy(op, h->scale, h->scale_row * (size_t)h->N, bad) : NULL;
}
static void dev_vlinear(m3_ops *op, const m3_vlinear *h, m3_vlinear *d, int *bad) {
    dev_linear(op, &h->w, &d->w, bad);
    d->b = dev_copy(op, h->b, sizeof(float) * (size_t)h->w.N, bad);
}

int m3_vision_upload(const m3_vision *v, m3_ops *op, m3_vision *d, m3_err *err) {
    memset(d, 0, sizeof *d);
    if (!v->present) return m3_errf(err, "the checkpoint has no vision tower (text-only)");
    *d = *v;
    d->layers = calloc((size_t)v->cfg.layers, sizeof *d->layers);
    if (!d->layers) { memset(d, 0, sizeof *d); return m3_errf(err, "out of memory"); }
    d->on_device = 1;
    const int Hv = v->cfg.hidden;
    int bad = 0;
    dev_linear(op, &v->patch, &d->patch, &bad);
    d->pre_w = dev_copy(op, v->pre_w, sizeof(float) * Hv, &bad);
    d->pre_b = dev_copy(op, v->pre_b, sizeof(float) * Hv, &bad);
    for (int l = 0; l < v->cfg.layers; l++) {
        const m3_vision_layer *H = &v->layers[l];
        m3_vision_layer *L = &d->layers[l];
        L->ln1_w = dev_copy(op, H->ln1_w, sizeof(float) * Hv, &bad);
        L->ln1_b = dev_copy(op, H->ln1_b, sizeof(float) * Hv, &bad);
        L->ln2_w = dev_copy(op, H->ln2_w, sizeof(float) * Hv, &bad);
        L->ln2_b = dev_copy(op, H->ln2_b, sizeof(float) * Hv, &bad);
        dev_vlinear(op, &H->q, &L->q, &bad);
        dev_vlinear(op, &H->k, &L->k, &bad);
        dev_vlinear(op, &H->v, &L->v, &bad);
        dev_vlinear(op, &H->o, &L->o, &bad);
        dev_vlinear(op, &H->fc1, &L->fc1, &bad);
        dev_vlinear(op, &H->fc2, &L->fc2, &bad);
    }
    dev_vlinear(op, &v->proj1, &d->proj1, &bad);
    dev_vlinear(op, &v->proj2, &d->proj2, &bad);
    dev_vlinear(op, &v->merge1, &d->merge1, &bad);
    dev_vlinear(op, &v->merge2, &d->merge2, &bad);
    if (!bad && op->check && op->check(op->ctx, err)) bad = 2;
    if (bad) {
        m3_vision_release(d, op);
        return bad == 2 ? -1 : m3_errf(err, "vision tower: out of %s memory for its weights", op->name);
    }
    return 0;
}

static void dev_free(m3_ops *op, const void *p) { if (p) op->release(op->ctx, (void *)p); }
static void dev_free_vlinear(m3_ops *op, const m3_vlinear *L) {
    dev_free(op, L->w.w);
    dev_free(op, L->w.scale);
    dev_free(op, L->b);
}

void m3_vision_release(m3_vision *d, m3_ops *op) {
    if (!d->on_device) return;
    dev_free(op, d->patch.w);
    dev_free(op, d->patch.scale);
    dev_free(op, d->pre_w);
    dev_free(op, d->pre_b);
    for (int l = 0; d->layers && l < d->cfg.layers; l++) {
        const m3_vision_layer *L = &d->layers[l];
        dev_free(op, L->ln1_w); dev_free(op, L->ln1_b); dev_free(op, L->ln2_w); dev_free(op, L->ln2_b);
        dev_free_vlinear(op, &L->q); dev_free_vlinear(op, &L->k); dev_free_vlinear(op, &L->v);
        dev_free_vlinear(op, &L->o); dev_free_vlinear(op, &L->fc1); dev_free_vlinear(op, &L->fc2);
    }
    dev_free_vlinear(op, &d->proj1); dev_free_vlinear(op, &d->proj2);
    dev_free_vlinear(op, &d->merge1); dev_free_vlinear(op, &d->merge2);
    free(d->layers);
    memset(d, 0, sizeof *d);
}

int m3_vision_encode(const m3_vision *v, m3_ops *op, const m3_pixels *px, float *embeds, float *tower_out,
                     m3_err *err) {
    if (!v->present) return m3_errf(err, "the checkpoint has no vision tower (text-only)");
    if (!op->layer_norm || !op->bias_act || !op->rope_table || !op->attention_full)
        return m3_errf(err, "backend '%s' has no vision tower ops", op->name);
    if (op->device_memory != v->on_device)
        return m3_errf(err, "the vision tower's weights are in %s memory, backend '%s' wants %s memory (m3_vision_upload)",
                       v->on_device ? "device" : "host", op->name, op->device_memory ? "device" : "host");
    const m3_vision_config *c = &v->cfg;
    if (m3_vision_check_pixels(c, px, err) < 0) return -1;
    const int Hv = c->hidden, I = c->inter, P = c->proj_hidden, H = c->text_hidden, MM = c->merge * c->merge, hd = c->head_dim;
    const int half = 3 * (2 * (((2 * (hd / 2)) / 3) / 2)) / 2;
    int nmax = 0, tokens = 0;
    for (int i = 0; i < px->n_images; i++) {
        int n = px->grid[3 * i] * px->grid[3 * i + 1] * px->grid[3 * i + 2];
        if (n > nmax) nmax = n;
        tokens += n / MM;
    }
    /* per-image buffers in the backend's memory, sized for the largest image */
    size_t N = (size_t)nmax, wide = (size_t)(I > Hv ? I : Hv), pd = (size_t)px->patch_dim;
    if (wide < (size_t)P) wide = (size_t)P;
    if (wide < (size_t)H) wide = (size_t)H;
    void *X = op->ctx;
    float *pix = op->alloc(X, sizeof(float) * N * pd), *x = op->alloc(X, sizeof(float) * N * Hv);
    float *a = op->alloc(X, sizeof(float) * N * Hv), *q = op->alloc(X, sizeof(float) * N * Hv);
    float *k = op->alloc(X, sizeof(float) * N * Hv), *vv = op->alloc(X, sizeof(float) * N * Hv);
    float *t1 = op->alloc(X, sizeof(float) * N * wide), *t2 = op->alloc(X, sizeof(float) * N * (wide > (size_t)Hv ? wide : (size_t)Hv));
    float *cs = half ? op->alloc(X, sizeof(float) * N * half * 2) : NULL;
    float *emb = op->alloc(X, sizeof(float) * (size_t)(tokens > 0 ? tokens : 1) * H);
    float *hcs = NULL, *hsn = NULL;
    int rc = 0;
    if (!pix || !x || !a || !q || !k || !vv || !t1 || !t2 || (half && !cs) || !emb) {
        rc = m3_errf(err, "out of %s memory for the vision tower over %d patches", op->name, nmax);
        goto done;
    }
    size_t row0 = 0, tok0 = 0;
    for (int im = 0; im < px->n_images && !rc; im++) {
        const int32_t *g = px->grid + 3 * im;
        const int n = g[0] * g[1] * g[2], nt = n / MM;
        if (rope_tables(c, g, &hcs, &hsn)) { rc = m3_errf(err, "out of memory for the vision RoPE tables"); goto done; }
        if (half) op->upload(X, cs, hcs, sizeof(float) * (size_t)n * half * 2); /* cos rows, then sin rows */
        const float *sn = cs + (size_t)n * half;
        op->upload(X, pix, px->data + row0 * pd, sizeof(float) * (size_t)n * pd);
        /* patch embedding + pre LayerNorm */
        op->linear(X, &v->patch, pix, n, a);
        op->layer_norm(X, a, v->pre_w, v->pre_b, n, Hv, c->ln_eps, x);
        for (int l = 0; l < c->layers; l++) {
            const m3_vision_layer *L = &v->layers[l];
            op->layer_norm(X, x, L->ln1_w, L->ln1_b, n, Hv, c->ln_eps, a);
            vlinear(op, &L->q, a, n, q, 0);
            vlinear(op, &L->k, a, n, k, 0);
            vlinear(op, &L->v, a, n, vv, 0);
            if (half) {
                op->rope_table(X, q, n, c->heads, hd, half, cs, sn);
                op->rope_table(X, k, n, c->heads, hd, half, cs, sn);
            }
            op->attention_full(X, q, k, vv, n, c->heads, hd, a);
            vlinear(op, &L->o, a, n, t2, 0);
            op->add(X, x, t2, (size_t)n * Hv);
            op->layer_norm(X, x, L->ln2_w, L->ln2_b, n, Hv, c->ln_eps, a);
            vlinear(op, &L->fc1, a, n, t1, 1);
            vlinear(op, &L->fc2, t1, n, t2, 0);
            op->add(X, x, t2, (size_t)n * Hv);
        }
        if (tower_out) op->download(X, tower_out + row0 * Hv, x, sizeof(float) * (size_t)n * Hv);
        /* projector per patch (Hv -> P -> H), then each merge block's MM rows side by side */
        vlinear(op, &v->proj1, x, n, t1, 1);
        vlinear(op, &v->proj2, t1, n, t2, 0); /* [n, H] == [nt, MM*H] */
        vlinear(op, &v->merge1, t2, nt, t1, 1);
        vlinear(op, &v->merge2, t1, nt, emb + tok0 * H, 0);
        free(hcs);
        hcs = hsn = NULL;
        row0 += (size_t)n;
        tok0 += (size_t)nt;
    }
    if (!rc && op->check && op->check(X, err)) rc = -1;
    if (!rc) op->download(X, embeds, emb, sizeof(float) * tok0 * H);
done:
    free(hcs);
    float *bufs[] = {pix, x, a, q, k, vv, t1, t2, cs, emb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) op->release(X, bufs[i]);
    if (!rc && op->check && op->check(X, err)) rc = -1;
    return rc;
}

/* ------------------------------------------------------------------ prompt */

int m3_vision_expand_prompt(const int32_t *ids, int n, int32_t image_id, int32_t start_id, int32_t end_id,
                            const int *counts, int n_images, int32_t **out, int *out_n, int32_t **rows, m3_err *err) {
    *out = NULL;
    *rows = NULL;
    *out_n = 0;
    /* pass 0 counts and checks, pass 1 writes */
    int32_t *o = NULL, *r = NULL;
    int64_t total = 0, ntok = 0;
    for (int pass = 0; pass < 2; pass++) {
        int64_t m = 0, nr = 0;
        int img = 0;
        for (int i = 0; i < n;) {
            if (ids[i] != image_id) {
                if (pass) o[m] = ids[i];
                m++;
                i++;
                continue;
            }
            int j = i;
            while (j < n && ids[j] == image_id) j++;
            int len = j - i;
            if (img >= n_images)
                return m3_errf(err, "the prompt has more image placeholders (token %d) than images (%d)", image_id, n_images);
            if (len == counts[img]) { /* already expanded */
                for (int t = 0; t < len; t++) {
                    if (pass) { r[nr] = (int32_t)m; o[m] = image_id; }
                    nr++;
                    m++;
                }
                img++;
            } else { /* len placeholders, one image each */
                if (img + len > n_images)
                    return m3_errf(err, "the prompt has more image placeholders (token %d) than images (%d): a run of %d at index %d",
                                   image_id, n_images, len, i);
                int bracketed = len == 1 && i > 0 && ids[i - 1] == start_id && j < n && ids[j] == end_id;
                int wrap = start_id >= 0 && end_id >= 0 && !bracketed;
                for (int k = 0; k < len; k++, img++) {
                    if (wrap) { if (pass) o[m] = start_id; m++; }
                    for (int t = 0; t < counts[img]; t++) {
                        if (pass) { r[nr] = (int32_t)m; o[m] = image_id; }
                        nr++;
                        m++;
                    }
                    if (wrap) { if (pass) o[m] = end_id; m++; }
                }
            }
            i = j;
        }
        if (img != n_images)
            return m3_errf(err, "the prompt has %d image placeholder%s (token %d) for %d image%s", img, img == 1 ? "" : "s", image_id,
                           n_images, n_images == 1 ? "" : "s");
        if (!pass) {
            total = m;
            ntok = nr;
            if (total > (1 << 28)) return m3_errf(err, "expanded prompt too long (%lld tokens)", (long long)total);
            o = malloc(sizeof(int32_t) * (size_t)(total ? total : 1));
            r = malloc(sizeof(int32_t) * (size_t)(ntok ? ntok : 1));
            if (!o || !r) { free(o); free(r); return m3_errf(err, "out of memory"); }
        }
    }
    *out = o;
    *out_n = (int)total;
    *rows = r;
    return 0;
}
