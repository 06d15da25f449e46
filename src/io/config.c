#include "config.h"
#include "files.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    json_t *text;  /* text config object */
    json_t *top;   /* whole file */
    const char *what;
    m3_err *err;
} ctx;

/* Look up a key in the text config, then at top level (wrapper-level keys such as
 * tie_word_embeddings and quantization_config may sit either place). */
static json_t *get(ctx *c, const char *key) {
    json_t *v = json_object_get(c->text, key);
    if (!v || json_is_null(v)) v = json_object_get(c->top, key);
    return json_is_null(v) ? NULL : v;
}

static int get_int(ctx *c, const char *key, int *out, int required, int def, int minv) {
    json_t *v = get(c, key);
    if (!v) {
        if (required) return m3_errf(c->err, "%s: missing config field '%s'", c->what, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < minv || json_integer_value(v) > (1 << 30))
        return m3_errf(c->err, "%s: config field '%s' must be an integer >= %d", c->what, key, minv);
    *out = (int)json_integer_value(v);
    return 0;
}

static int num_of(ctx *c, json_t *v, const char *key, double *out) {
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return m3_errf(c->err, "%s: config field '%s' must be a number", c->what, key);
    *out = json_number_value(v);
    return 0;
}

static int get_num(ctx *c, const char *key, double *out, int required, double def) {
    json_t *v = get(c, key);
    if (!v) {
        if (required) return m3_errf(c->err, "%s: missing config field '%s'", c->what, key);
        *out = def;
        return 0;
    }
    return num_of(c, v, key, out);
}

static int layer_flags(ctx *c, uint8_t *out, int n, const char *hub_key, json_t *hub_obj,
                       const char *tf_key, const char *tf_yes, const char *tf_no, int *count) {
    json_t *h = hub_obj ? json_object_get(hub_obj, hub_key) : NULL;
    json_t *t = get(c, tf_key);
    *count = 0;
    if (h && !json_is_null(h)) {
        if (json_is_integer(h) && (json_integer_value(h) == 0 || json_integer_value(h) == 1)) {
            for (int i = 0; i < n; i++) out[i] = (uint8_t)json_integer_value(h);
        } else {
            if (!json_is_array(h) || (int)json_array_size(h) != n)
                return m3_errf(c->err, "%s: config field '%s' must be a list of %d entries (num_hidden_layers)",
                               c->what, hub_key, n);
            for (int i = 0; i < n; i++) {
                json_t *x = json_array_get(h, (size_t)i);
                if (!json_is_integer(x) && !json_is_boolean(x))
                    return m3_errf(c->err, "%s: config field '%s'[%d] must be an integer", c->what, hub_key, i);
                out[i] = json_is_boolean(x) ? json_is_true(x) : json_integer_value(x) != 0;
            }
        }
    } else if (t) {
        if (!json_is_array(t) || (int)json_array_size(t) != n)
            return m3_errf(c->err, "%s: config field '%s' must be a list of %d entries (num_hidden_layers)",
                           c->what, tf_key, n);
        for (int i = 0; i < n; i++) {
            const char *s = json_string_value(json_array_get(t, (size_t)i));
            if (s && strcmp(s, tf_yes) == 0) out[i] = 1;
            else if (s && (strcmp(s, tf_no) == 0 || (tf_no[0] == 'f' && strcmp(s, "sliding_attention") == 0))) out[i] = 0;
            else
                return m3_errf(c->err, "%s: config field '%s'[%d] is '%s', expected '%s' or '%s'", c->what, tf_key,
                               i, s ? s : "(not a string)", tf_yes, tf_no);
        }
    } else {
        return -2; /* neither spelling present */
    }
    for (int i = 0; i < n; i++) *count += out[i];
    return 0;
}

int m3_config_parse(m3_config *cfg, const char *text, const char *what, m3_err *err) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) return m3_errf(err, "%s: bad JSON: %s (line %d, column %d)", what, je.text, je.line, je.column);
    if (!json_is_object(root)) { json_decref(root); return m3_errf(err, "%s: not a JSON object", what); }
    ctx c = {root, root, what, err};
    json_t *tc = json_object_get(root, "text_config");
    if (tc && !json_is_null(tc)) {
        if (!json_is_object(tc)) { json_decref(root); return m3_errf(err, "%s: 'text_config' is not an object", what); }
        c.text = tc;
    }
    int rc = 0;
#define TRY(x) do { if ((rc = (x)) != 0) goto done; } while (0)
    TRY(get_int(&c, "vocab_size", &cfg->vocab, 1, 0, 1));
    TRY(get_int(&c, "hidden_size", &cfg->hidden, 1, 0, 1));
    TRY(get_int(&c, "num_hidden_layers", &cfg->n_layers, 1, 0, 1));
    TRY(get_int(&c, "num_attention_heads", &cfg->n_heads, 1, 0, 1));
    TRY(get_int(&c, "num_key_value_heads", &cfg->n_kv_heads, 1, 0, 1));
    if (cfg->n_heads % cfg->n_kv_heads) {
        rc = m3_errf(err, "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", what,
                     cfg->n_heads, cfg->n_kv_heads);
        goto done;
    }
    TRY(get_int(&c, "head_dim", &cfg->head_dim, 0, cfg->hidden / cfg->n_heads, 1));
    if (cfg->head_dim < 1) { rc = m3_errf(err, "%s: head_dim must be >= 1", what); goto done; }
    TRY(get_num(&c, "rms_norm_eps", &cfg->rms_eps, 1, 0));
    if (!(cfg->rms_eps >= 0)) { rc = m3_errf(err, "%s: rms_norm_eps must be >= 0", what); goto done; }

    /* RoPE: rope_theta / rotary_dim / partial_rotary_factor, or rope_parameters{} */
    {
        json_t *rp = get(&c, "rope_parameters");
        if (rp && !json_is_object(rp)) { rc = m3_errf(err, "%s: 'rope_parameters' is not an object", what); goto done; }
        json_t *th = get(&c, "rope_theta");
        if (!th && rp) th = json_object_get(rp, "rope_theta");
        if (!th) { rc = m3_errf(err, "%s: missing config field 'rope_theta' (or rope_parameters.rope_theta)", what); goto done; }
        TRY(num_of(&c, th, "rope_theta", &cfg->rope_theta));
        if (!(cfg->rope_theta > 0)) { rc = m3_errf(err, "%s: rope_theta must be > 0", what); goto done; }
        json_t *rt = rp ? json_object_get(rp, "rope_type") : NULL;
        if (!rt) rt = get(&c, "rope_scaling") ? json_object_get(get(&c, "rope_scaling"), "rope_type") : NULL;
        if (rt && (!json_is_string(rt) || strcmp(json_string_value(rt), "default") != 0)) {
            rc = m3_errf(err, "%s: rope_type '%s' is not supported (only 'default')", what,
                         json_is_string(rt) ? json_string_value(rt) : "?");
            goto done;
        }
        json_t *pf = get(&c, "partial_rotary_factor");
        if (!pf && rp) pf = json_object_get(rp, "partial_rotary_factor");
        json_t *rd = get(&c, "rotary_dim");
        double f = 1.0;
        if (pf) TRY(num_of(&c, pf, "partial_rotary_factor", &f));
        int from_f = (int)lround(f * cfg->head_dim);
        if (rd) {
            if (!json_is_integer(rd) || json_integer_value(rd) < 0) { rc = m3_errf(err, "%s: rotary_dim must be a non-negative integer", what); goto done; }
            cfg->rotary_dim = (int)json_integer_value(rd);
            if (pf && from_f != cfg->rotary_dim) {
                rc = m3_errf(err, "%s: rotary_dim %d disagrees with partial_rotary_factor %g x head_dim %d", what,
                             cfg->rotary_dim, f, cfg->head_dim);
                goto done;
            }
        } else {
            cfg->rotary_dim = from_f;
        }
        if (cfg->rotary_dim % 2 || cfg->rotary_dim > cfg->head_dim) {
            rc = m3_errf(err, "%s: rotary_dim %d must be even and at most head_dim %d", what, cfg->rotary_dim, cfg->head_dim);
            goto done;
        }
    }

    /* layer kinds */
    cfg->layer_sparse = calloc((size_t)cfg->n_layers, 1);
    cfg->layer_moe = calloc((size_t)cfg->n_layers, 1);
    if (!cfg->layer_sparse || !cfg->layer_moe) { rc = m3_errf(err, "out of memory"); goto done; }
    json_t *sac = get(&c, "sparse_attention_config");
    if (sac && !json_is_object(sac)) { rc = m3_errf(err, "%s: 'sparse_attention_config' is not an object", what); goto done; }
    if (sac) {
        json_t *use = json_object_get(sac, "use_sparse_attention");
        if (use && json_is_false(use)) sac = NULL;
    }
    rc = layer_flags(&c, cfg->layer_sparse, cfg->n_layers, "sparse_attention_freq", sac, "layer_types",
                     "minimax_m3_sparse", "full_attention", &cfg->n_sparse_layers);
    if (rc == -2) {
        if (sac) { rc = m3_errf(err, "%s: sparse_attention_config has no 'sparse_attention_freq'", what); goto done; }
        rc = 0; /* no sparse layers */
    }
    if (rc) goto done;
    rc = layer_flags(&c, cfg->layer_moe, cfg->n_layers, "moe_layer_freq", c.text, "mlp_layer_types", "sparse",
                     "dense", &cfg->n_moe_layers);
    if (rc == -2) { rc = m3_errf(err, "%s: missing config field 'moe_layer_freq' (or 'mlp_layer_types')", what); goto done; }
    if (rc) goto done;

    if (cfg->n_sparse_layers) {
        /* hub spelling inside sparse_attention_config, else transformers spelling */
        struct { const char *hub, *tf; int *dst, req, def, minv; } f[] = {
            {"sparse_num_index_heads", "index_n_heads", &cfg->index_heads, 1, 0, 1},
            {"sparse_index_dim", "index_head_dim", &cfg->index_dim, 1, 0, 1},
            {"sparse_block_size", "index_block_size", &cfg->block_size, 1, 0, 1},
            {"sparse_topk_blocks", "index_topk_blocks", &cfg->topk_blocks, 1, 0, 1},
            {"sparse_local_block", "index_local_blocks", &cfg->local_blocks, 0, 1, 1},
            {"sparse_init_block", "index_init_blocks", &cfg->init_blocks, 0, 0, 0},
        };
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
            json_t *v = sac ? json_object_get(sac, f[i].hub) : NULL;
            const char *name = f[i].hub;
            if (!v || json_is_null(v)) { v = get(&c, f[i].tf); name = f[i].tf; }
            if (!v) {
                if (f[i].req) { rc = m3_errf(err, "%s: missing config field '%s' (or '%s')", what, f[i].hub, f[i].tf); goto done; }
                *f[i].dst = f[i].def;
                continue;
            }
            if (!json_is_integer(v) || json_integer_value(v) < f[i].minv || json_integer_value(v) > (1 << 30)) {
                rc = m3_errf(err, "%s: config field '%s' must be an integer >= %d", what, name, f[i].minv);
                goto done;
            }
            *f[i].dst = (int)json_integer_value(v);
        }
        json_t *st = sac ? json_object_get(sac, "sparse_score_type") : NULL;
        if (st && (!json_is_string(st) || strcmp(json_string_value(st), "max") != 0)) {
            rc = m3_errf(err, "%s: sparse_score_type '%s' is not supported (only 'max')", what,
                         json_is_string(st) ? json_string_value(st) : "?");
            goto done;
        }
        if (cfg->index_heads != cfg->n_kv_heads) {
            rc = m3_errf(err, "%s: indexer heads (%d) must equal num_key_value_heads (%d)", what, cfg->index_heads, cfg->n_kv_heads);
            goto done;
        }
        if (cfg->rotary_dim > cfg->index_dim) {
            rc = m3_errf(err, "%s: rotary_dim %d exceeds the indexer head dim %d", what, cfg->rotary_dim, cfg->index_dim);
            goto done;
        }
    }

    if (cfg->n_moe_layers < cfg->n_layers)
        TRY(get_int(&c, "dense_intermediate_size", &cfg->dense_inter, 1, 0, 1));
    if (cfg->n_moe_layers) {
        TRY(get_int(&c, "num_local_experts", &cfg->n_experts, 1, 0, 1));
        TRY(get_int(&c, "num_experts_per_tok", &cfg->top_k, 1, 0, 1));
        TRY(get_int(&c, "intermediate_size", &cfg->moe_inter, 1, 0, 1));
        /* absent: 1, transformers' default (its M3 MoE block always has a shared expert; its
         * saved configs, m3vl-tiny's included, leave the default out) */
        TRY(get_int(&c, "n_shared_experts", &cfg->n_shared, 0, 1, 0));
        if (cfg->n_shared > 1) { rc = m3_errf(err, "%s: n_shared_experts %d: only 0 or 1 is supported", what, cfg->n_shared); goto done; }
        if (cfg->n_shared) TRY(get_int(&c, "shared_intermediate_size", &cfg->shared_inter, 1, 0, 1));
        TRY(get_num(&c, "routed_scaling_factor", &cfg->routed_scale, 0, 1.0));
        if (cfg->top_k > cfg->n_experts) {
            rc = m3_errf(err, "%s: num_experts_per_tok %d exceeds num_local_experts %d", what, cfg->top_k, cfg->n_experts);
            goto done;
        }
        json_t *sf = get(&c, "scoring_func");
        if (sf && (!json_is_string(sf) || strcmp(json_string_value(sf), "sigmoid") != 0)) {
            rc = m3_errf(err, "%s: scoring_func '%s' is not supported (only 'sigmoid')", what,
                         json_is_string(sf) ? json_string_value(sf) : "?");
            goto done;
        }
        json_t *ub = get(&c, "use_routing_bias");
        cfg->use_routing_bias = ub ? json_is_true(ub) : 1;
    }
    TRY(get_num(&c, "swiglu_alpha", &cfg->swiglu_alpha, 0, 1.702));
    TRY(get_num(&c, "swiglu_limit", &cfg->swiglu_limit, 0, 7.0));
    {
        json_t *ha = get(&c, "hidden_act");
        /* the transformers spelling writes "silu" for the same SwiGLU-OAI MLP */
        static const char *acts[] = {"swigluoai", "swiglu_oai", "swiglu", "silu"};
        int act_ok = 0;
        for (size_t i = 0; ha && json_is_string(ha) && i < sizeof acts / sizeof acts[0]; i++)
            act_ok |= strcmp(json_string_value(ha), acts[i]) == 0;
        if (ha && !act_ok) {
            rc = m3_errf(err, "%s: hidden_act '%s' is not supported (SwiGLU-OAI: 'swigluoai' or 'silu')", what,
                         json_is_string(ha) ? json_string_value(ha) : "?");
            goto done;
        }
        json_t *tw = get(&c, "tie_word_embeddings");
        cfg->tie_embeddings = tw ? json_is_true(tw) : 0;
        TRY(get_int(&c, "max_position_embeddings", &cfg->max_positions, 0, 0, 1));
        json_t *b = get(&c, "bos_token_id"), *e = get(&c, "eos_token_id");
        cfg->bos_id = json_is_integer(b) ? (int)json_integer_value(b) : -1;
        if (json_is_array(e)) e = json_array_get(e, 0);
        cfg->eos_id = json_is_integer(e) ? (int)json_integer_value(e) : -1;
        json_t *q = get(&c, "quantization_config");
        if (q) {
            json_t *m = json_object_get(q, "quant_method");
            if (!json_is_string(m)) { rc = m3_errf(err, "%s: quantization_config has no 'quant_method'", what); goto done; }
            const char *ms = json_string_value(m);
            if (strcmp(ms, "mxfp8") && strcmp(ms, "modelopt") && strcmp(ms, "compressed-tensors")) {
                rc = m3_errf(err, "%s: quant_method '%s' is not supported (mxfp8, modelopt, compressed-tensors)", what, ms);
                goto done;
            }
            snprintf(cfg->quant_method, sizeof cfg->quant_method, "%s", ms);
            json_t *bs = json_object_get(q, "weight_block_size");
            if (bs && (!json_is_array(bs) || json_array_size(bs) != 2 ||
                       json_integer_value(json_array_get(bs, 0)) != 1 || json_integer_value(json_array_get(bs, 1)) != 32)) {
                rc = m3_errf(err, "%s: weight_block_size must be [1, 32] for MXFP8", what);
                goto done;
            }
        }
    }
#undef TRY
done:
    json_decref(root);
    if (rc) { m3_config_free(cfg); return -1; }
    return 0;
}

int m3_config_load(m3_config *cfg, const char *path, m3_err *err) {
    char buf[8192];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(buf, sizeof buf, "%s/config.json", path);
    else snprintf(buf, sizeof buf, "%s", path);
    char *text = m3_read_text(buf, "config", (size_t)64 << 20, err);
    if (!text) return -1;
    int rc = m3_config_parse(cfg, text, buf, err);
    free(text);
    return rc;
}

void m3_config_free(m3_config *c) {
    free(c->layer_sparse);
    free(c->layer_moe);
    c->layer_sparse = c->layer_moe = NULL;
}

int m3_config_set_fc1_quant(m3_config *c, const char *name, m3_err *err) {
    if (name && !strcmp(name, "none")) {
        c->fc1_quant = 0;
        return 0;
    }
    if (!name || strcmp(name, "nvfp4"))
        return m3_errf(err, "'%s': none (the routed experts' FC1 input as is, the reference's) or nvfp4 (quantized per "
                            "token, as the M3.1 experts were trained)", name ? name : "");
    if (c->hidden % 16)
        return m3_errf(err, "nvfp4 needs hidden_size divisible by 16 (NVFP4 blocks), the config has %d", c->hidden);
    c->fc1_quant = 1;
    return 0;
}
