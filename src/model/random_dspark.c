/* The random DSpark draft of m3 make-tiny --with-dspark (spec section 4): its config (built
 * in from the target's shapes, or a given file) and its weights, in OUT/dspark. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/sbuf.h"
#include "../io/files.h"
#include "../io/json_write.h"
#include "dspark.h"
#include "random_weights.h"

/* The built-in draft config for target c: the real draft's keys (spec section 4) with the
 * target's shapes (hidden, heads, head_dim, rotary, eps, vocab, dense width rounded up to 32);
 * 2 layers fed from up to 3 target layers (first, middle, last), block size 7, noise id V - 6,
 * Markov rank 32, sliding window 64 (small, so that tests cross it; the real one is 4096). */
static json_t *dspark_builtin_config(const m3_config *c) {
    const int64_t H = c->hidden, D = c->head_dim, V = c->vocab;
    int64_t F = c->dense_inter > 0 ? c->dense_inter : 2 * H;
    F = (F + 31) / 32 * 32;
    int nt = c->n_layers < 3 ? c->n_layers : 3;
    json_t *tl = json_array(), *lt = json_array(), *mf = json_array();
    if (!tl || !lt || !mf) { json_decref(tl); json_decref(lt); json_decref(mf); return NULL; }
    for (int i = 0; i < nt; i++)
        json_array_append_new(tl, json_integer(nt == 1 ? c->n_layers - 1 : (i * (c->n_layers - 1) + (nt - 1) / 2) / (nt - 1)));
    for (int l = 0; l < 2; l++) { json_array_append_new(lt, json_string("sliding_attention")); json_array_append_new(mf, json_integer(0)); }
    return json_pack("{s:[s],s:s,s:{s:s,s:i,s:I,s:I,s:i,s:i,s:I,s:i,s:f,s:f,s:f,s:I,s:f,s:f,s:s,s:b,s:i,s:o,s:o,s:n,"
                     "s:o,s:i,s:I,s:i,s:s,s:b},s:{s:s,s:[i,i]}}",
                     "architectures", "DSparkMiniMaxDraftModel", "model_type", "minimax_m3_vl", "text_config",
                     "model_type", "minimax_m3", "num_hidden_layers", 2, "hidden_size", (json_int_t)H,
                     "vocab_size", (json_int_t)V, "num_attention_heads", c->n_heads, "num_key_value_heads", c->n_kv_heads,
                     "head_dim", (json_int_t)D, "rotary_dim", c->rotary_dim,
                     "partial_rotary_factor", (double)c->rotary_dim / (double)D, "rope_theta", c->rope_theta,
                     "rms_norm_eps", c->rms_eps, "dense_intermediate_size", (json_int_t)F, "swiglu_alpha",
                     c->swiglu_alpha, "swiglu_limit", c->swiglu_limit, "hidden_act", "swigluoai", "use_gemma_norm", 1,
                     "sliding_window", 64, "layer_types", lt, "moe_layer_freq", mf, "sparse_attention_config",
                     "dspark_target_layer_ids", tl, "dspark_block_size", 7, "dspark_noise_token_id",
                     (json_int_t)(V > 6 ? V - 6 : V - 1), "dspark_markov_rank", 32, "dspark_markov_head_type", "vanilla",
                     "enable_confidence_head", 1, "quantization_config", "quant_method", "mxfp8", "weight_block_size", 1, 32);
}

/* A random DSpark draft for target c in OUT/dspark, in the real layout (spec section 4;
 * tensors "model.dspark.*" under the target's layout prefix): BF16 fc, hidden_norm,
 * final_norm, markov_head.markov_w{1,2}, confidence_head.proj.{weight,bias} (when
 * enable_confidence_head), and per layer an M3 dense decoder layer (BF16 norms, MXFP8
 * q/k/v/o and MLP linears). The config is dcfg_path's text byte for byte (for example
 * shared/configs/m3.1-flash-dspark-shapes.json), checked against the target, or the built-in
 * one above. Values: norms N(0, 0.2), linears N(0, 1/sqrt(K)) (MLP gate/up x3), markov_w1
 * N(0, 1); same seed, same files. Everything is held in memory until the one file is written. */
int m3_rw_write_dspark(const char *out, const m3_config *c, const char *dcfg_path, uint64_t seed, int bare,
                       const rw_zig *zig, m3_pool *pool, m3_rand_report *rep, m3_err *err) {
    char dir[4200], path[4300], nm[256];
    snprintf(dir, sizeof dir, "%s/dspark", out);
    rw_list L = {0};
    rw_out *outs = NULL;
    float *scratch = NULL;
    m3_st_writer *w = NULL;
    m3_sbuf b = {0};
    m3_dspark_config dc;
    memset(&dc, 0, sizeof dc);
    int rc = -1, have_dc = 0;
    if (dcfg_path) {
        FILE *f = fopen(dcfg_path, "rb");
        if (!f) return m3_errf(err, "%s: cannot open: %s", dcfg_path, strerror(errno));
        char chunk[65536];
        size_t got;
        while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) m3_sbuf_add(&b, chunk, got);
        fclose(f);
    } else {
        json_t *root = dspark_builtin_config(c);
        if (root) m3_json_write(&b, root, 1);
        json_decref(root);
        if (!root) b.oom = 1;
    }
    if (b.oom || !b.p) { m3_errf(err, "out of memory"); goto out; }
    if (m3_dspark_config_parse(&dc, b.p, dcfg_path ? dcfg_path : "built-in draft config", c, err)) goto out;
    have_dc = 1;
    if (m3_mkdir_p(dir, err)) goto out;
    const m3_config *d = &dc.base;
    const int64_t H = d->hidden, D = d->head_dim, V = d->vocab, R = dc.markov_rank;
#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
#define ADD(x) do { if (x) goto out; } while (0)
    ADD(m3_rw_add_linear(&L, M3_RQ_NONE, RW_BF16, "model.dspark.fc.weight", H, (int64_t)dc.n_target * H, 1.0f, err));
    ADD(m3_rw_add_spec(&L, "model.dspark.hidden_norm.weight", 1, H, 1, 0.2f, RW_BF16, err));
    ADD(m3_rw_add_spec(&L, "model.dspark.final_norm.weight", 1, H, 1, 0.2f, RW_BF16, err));
    ADD(m3_rw_add_spec(&L, "model.dspark.markov_head.markov_w1.weight", 2, V, R, 1.0f, RW_BF16, err));
    ADD(m3_rw_add_linear(&L, M3_RQ_NONE, RW_BF16, "model.dspark.markov_head.markov_w2.weight", V, R, 1.0f, err));
    if (dc.confidence_head) {
        ADD(m3_rw_add_linear(&L, M3_RQ_NONE, RW_BF16, "model.dspark.confidence_head.proj.weight", 1, H + R, 1.0f, err));
        ADD(m3_rw_add_spec(&L, "model.dspark.confidence_head.proj.bias", 1, 1, 1, 0.2f, RW_BF16, err));
    }
    for (int l = 0; l < d->n_layers; l++) {
        char p[96];
        snprintf(p, sizeof p, "model.dspark.layers.%d.decoder_layer", l);
        ADD(m3_rw_add_spec(&L, NM("%s.input_layernorm.weight", p), 1, H, 1, 0.2f, RW_BF16, err));
        ADD(m3_rw_add_linear(&L, M3_RQ_CT, RW_MXFP8, NM("%s.self_attn.q_proj.weight", p), (int64_t)d->n_heads * D, H, 1.0f, err));
        ADD(m3_rw_add_linear(&L, M3_RQ_CT, RW_MXFP8, NM("%s.self_attn.k_proj.weight", p), (int64_t)d->n_kv_heads * D, H, 1.0f, err));
        ADD(m3_rw_add_linear(&L, M3_RQ_CT, RW_MXFP8, NM("%s.self_attn.v_proj.weight", p), (int64_t)d->n_kv_heads * D, H, 1.0f, err));
        ADD(m3_rw_add_linear(&L, M3_RQ_CT, RW_MXFP8, NM("%s.self_attn.o_proj.weight", p), H, (int64_t)d->n_heads * D, 1.0f, err));
        ADD(m3_rw_add_spec(&L, NM("%s.self_attn.q_norm.weight", p), 1, D, 1, 0.2f, RW_BF16, err));
        ADD(m3_rw_add_spec(&L, NM("%s.self_attn.k_norm.weight", p), 1, D, 1, 0.2f, RW_BF16, err));
        ADD(m3_rw_add_spec(&L, NM("%s.post_attention_layernorm.weight", p), 1, H, 1, 0.2f, RW_BF16, err));
        ADD(m3_rw_add_mlp(&L, M3_RQ_CT, RW_MXFP8, NM("%s.mlp", p), "gate_proj", "up_proj", "down_proj", H, d->dense_inter, err));
    }
    int64_t max_k = 1;
    uint64_t total = 0;
    for (size_t i = 0; i < L.n; i++) {
        if (L.s[i].K > max_k) max_k = L.s[i].K;
        total += L.s[i].bytes;
    }
    outs = calloc(L.n, sizeof *outs);
    scratch = malloc((size_t)m3_pool_size(pool) * (size_t)max_k * sizeof *scratch);
    w = m3_stw_new();
    if (!outs || !scratch || !w) { m3_errf(err, "out of memory"); goto out; }
    for (size_t i = 0; i < L.n; i++)
        ADD(m3_rw_generate(&L.s[i], zig, seed, M3_RQ_CT, pool, scratch, max_k, &outs[i], err) ||
            m3_rw_add_entries(w, &L.s[i], &outs[i], bare ? "" : "language_model.", M3_RQ_CT, NULL, NULL, err));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ADD(m3_stw_write(w, path, err));
    snprintf(path, sizeof path, "%s/config.json", dir);
    ADD(m3_write_file(path, b.p, b.n, err));
    rep->dspark = 1;
    rep->dspark_weights = L.n;
    rep->dspark_bytes = total;
    rep->dspark_layers = d->n_layers;
    rep->dspark_targets[0] = 0;
    for (int i = 0, k = 0; i < dc.n_target && k < (int)sizeof rep->dspark_targets; i++)
        k += snprintf(rep->dspark_targets + k, sizeof rep->dspark_targets - (size_t)k, "%s%d", i ? "," : "", dc.target_layers[i]);
    rc = 0;
#undef ADD
#undef NM
out:
    if (outs)
        for (size_t i = 0; i < L.n; i++) { free(outs[i].a); free(outs[i].b); }
    free(outs);
    free(scratch);
    m3_stw_free(w);
    free(b.p);
    free(L.s);
    if (have_dc) m3_dspark_config_free(&dc);
    return rc;
}
