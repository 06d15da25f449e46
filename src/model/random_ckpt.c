/* m3 make-tiny's checkpoint: config, tensor plan, shards, tokenizer files, then the draft.
 * See random_ckpt.h. */
#include "random_ckpt.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/pool.h"
#include "../base/sbuf.h"
#include "../io/config.h"
#include "../io/files.h"
#include "../io/json_write.h"
#include "../io/safetensors.h"
#include "../tokenizer/tokenizer.h"
#include "random_weights.h"

/* The m3-tiny shapes of ../shared/testdata (make_m3_oracle.py hub_config), unquantized. */
static const char BUILTIN_CONFIG[] =
    "{\"architectures\": [\"MiniMaxM3SparseForConditionalGeneration\"], \"model_type\": \"minimax_m3_vl\","
    " \"text_config\": {\"model_type\": \"minimax_m3\", \"architectures\": [\"MiniMaxM3SparseForCausalLM\"],"
    " \"vocab_size\": 1024, \"hidden_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 32, \"intermediate_size\": 64, \"shared_intermediate_size\": 64,"
    " \"n_shared_experts\": 1, \"dense_intermediate_size\": 160, \"num_local_experts\": 8,"
    " \"num_experts_per_tok\": 2, \"scoring_func\": \"sigmoid\", \"use_routing_bias\": true,"
    " \"routed_scaling_factor\": 2.0, \"hidden_act\": \"swigluoai\", \"swiglu_alpha\": 1.702,"
    " \"swiglu_limit\": 7.0, \"rms_norm_eps\": 1e-06, \"use_gemma_norm\": true, \"use_qk_norm\": true,"
    " \"qk_norm_type\": \"per_head\", \"rotary_dim\": 16, \"partial_rotary_factor\": 0.5,"
    " \"rope_theta\": 10000.0, \"max_position_embeddings\": 524288, \"tie_word_embeddings\": false,"
    " \"bos_token_id\": 0, \"eos_token_id\": 1, \"moe_layer_freq\": [0, 1, 1, 1],"
    " \"sparse_attention_config\": {\"use_sparse_attention\": true, \"sparse_index_dim\": 32,"
    " \"sparse_num_index_heads\": 2, \"sparse_topk_blocks\": 3, \"sparse_block_size\": 16,"
    " \"sparse_score_type\": \"max\", \"sparse_init_block\": 0, \"sparse_local_block\": 1,"
    " \"sparse_attention_freq\": [0, 1, 1, 0], \"sparse_disable_index_value\": [0, 1, 1, 0]}},"
    " \"vision_config\": {\"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 1,"
    " \"num_attention_heads\": 2, \"image_size\": 56, \"patch_size\": 14}, \"projector_hidden_size\": 128,"
    " \"image_token_index\": 200025, \"video_token_index\": 200026, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\"}";

/* quantization_config of make_m3_oracle.py main() */
static const char QUANT_CONFIG[] =
    "{\"quant_method\": \"mxfp8\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [1, 32],"
    " \"moe_quant_algo\": \"NVFP4\", \"moe_quant_format\": \"nvfp4-pack-quantized\", \"moe_group_size\": 16,"
    " \"ignored_layers\": [\"lm_head\", \"model.embed_tokens\", \"block_sparse_moe.gate\", \"index_q_proj\","
    " \"index_k_proj\"]}";

/* The target's tensors, in the reference checkpoints' order. */
static int plan(const m3_config *c, m3_rand_quant qm, rw_list *l, m3_err *err) {
    const int64_t H = c->hidden, D = c->head_dim, V = c->vocab;
    char nm[256], p[64];
    if (m3_rw_add_spec(l, "model.embed_tokens.weight", 2, V, H, 1.0f, RW_BF16, err)) return -1;
    for (int i = 0; i < c->n_layers; i++) {
        snprintf(p, sizeof p, "model.layers.%d", i);
#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
        if (m3_rw_add_spec(l, NM("%s.input_layernorm.weight", p), 1, H, 1, 0.2f, RW_BF16, err)) return -1;
        if (m3_rw_add_linear(l, qm, RW_MXFP8, NM("%s.self_attn.q_proj.weight", p), c->n_heads * D, H, 1.0f, err)) return -1;
        if (m3_rw_add_linear(l, qm, RW_MXFP8, NM("%s.self_attn.k_proj.weight", p), c->n_kv_heads * D, H, 1.0f, err)) return -1;
        if (m3_rw_add_linear(l, qm, RW_MXFP8, NM("%s.self_attn.v_proj.weight", p), c->n_kv_heads * D, H, 1.0f, err)) return -1;
        if (m3_rw_add_linear(l, qm, RW_MXFP8, NM("%s.self_attn.o_proj.weight", p), H, c->n_heads * D, 1.0f, err)) return -1;
        if (m3_rw_add_spec(l, NM("%s.self_attn.q_norm.weight", p), 1, D, 1, 0.2f, RW_BF16, err)) return -1;
        if (m3_rw_add_spec(l, NM("%s.self_attn.k_norm.weight", p), 1, D, 1, 0.2f, RW_BF16, err)) return -1;
        if (c->layer_sparse[i]) {
            const int64_t Di = c->index_dim;
            if (m3_rw_add_linear(l, M3_RQ_NONE, RW_BF16, NM("%s.self_attn.index_q_proj.weight", p), c->index_heads * Di, H, 1.0f, err)) return -1;
            if (m3_rw_add_linear(l, M3_RQ_NONE, RW_BF16, NM("%s.self_attn.index_k_proj.weight", p), Di, H, 1.0f, err)) return -1;
            if (m3_rw_add_spec(l, NM("%s.self_attn.index_q_norm.weight", p), 1, Di, 1, 0.2f, RW_BF16, err)) return -1;
            if (m3_rw_add_spec(l, NM("%s.self_attn.index_k_norm.weight", p), 1, Di, 1, 0.2f, RW_BF16, err)) return -1;
        }
        if (m3_rw_add_spec(l, NM("%s.post_attention_layernorm.weight", p), 1, H, 1, 0.2f, RW_BF16, err)) return -1;
        if (!c->layer_moe[i]) {
            if (m3_rw_add_mlp(l, qm, RW_MXFP8, NM("%s.mlp", p), "gate_proj", "up_proj", "down_proj", H, c->dense_inter, err))
                return -1;
            continue;
        }
        if (m3_rw_add_linear(l, M3_RQ_NONE, RW_BF16, NM("%s.block_sparse_moe.gate.weight", p), c->n_experts, H, 1.0f, err)) return -1;
        if (c->use_routing_bias &&
            m3_rw_add_spec(l, NM("%s.block_sparse_moe.e_score_correction_bias", p), 1, c->n_experts, 1, 0.3f, RW_F32, err))
            return -1;
        for (int e = 0; e < c->n_experts; e++) {
            char base[128];
            snprintf(base, sizeof base, "%s.block_sparse_moe.experts.%d", p, e);
            if (m3_rw_add_mlp(l, qm, RW_NVFP4, base, "w1", "w3", "w2", H, c->moe_inter, err)) return -1;
        }
        if (c->n_shared > 0 && m3_rw_add_mlp(l, qm, RW_MXFP8, NM("%s.block_sparse_moe.shared_experts", p), "gate_proj",
                                       "up_proj", "down_proj", H, c->shared_inter, err))
            return -1;
#undef NM
    }
    if (m3_rw_add_spec(l, "model.norm.weight", 1, H, 1, 0.2f, RW_BF16, err)) return -1;
    if (!c->tie_embeddings && m3_rw_add_linear(l, M3_RQ_NONE, RW_BF16, "lm_head.weight", V, H, 1.0f, err)) return -1;
    return 0;
}

/* Loads the config JSON (validated by m3_config_load first), adjusts quantization_config for
 * the quant mode, and returns the config.json text to write (malloc'd), with *cfg parsed from
 * exactly that text. */
static char *make_config(const char *path, m3_rand_quant qm, m3_config *cfg, size_t *len, m3_err *err) {
    json_t *root;
    char *orig = NULL;
    size_t orig_n = 0;
    if (path) {
        if (m3_config_load(cfg, path, err)) return NULL;
        m3_config_free(cfg);
        char file[4200];
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(file, sizeof file, "%s/config.json", path);
        else snprintf(file, sizeof file, "%s", path);
        FILE *f = fopen(file, "rb");
        if (!f) { m3_errf(err, "%s: cannot open: %s", file, strerror(errno)); return NULL; }
        m3_sbuf b = {0};
        char chunk[65536];
        size_t got;
        while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) m3_sbuf_add(&b, chunk, got);
        int rerr = ferror(f);
        fclose(f);
        if (b.oom || rerr || !b.p) { free(b.p); m3_errf(err, "%s: cannot read", file); return NULL; }
        orig = b.p;
        orig_n = b.n;
        json_error_t je;
        root = json_loadb(orig, orig_n, 0, &je);
        if (!root) { free(orig); m3_errf(err, "%s: bad JSON: %s (line %d)", file, je.text, je.line); return NULL; }
    } else {
        json_error_t je;
        root = json_loads(BUILTIN_CONFIG, 0, &je);
        if (!root) { m3_errf(err, "built-in config: bad JSON: %s", je.text); return NULL; }
    }
    json_t *tc = json_object_get(root, "text_config");
    if (!json_is_object(tc)) tc = NULL;
    int has_q = json_object_get(root, "quantization_config") != NULL ||
                (tc && json_object_get(tc, "quantization_config") != NULL);
    int changed = !path;
    if (qm == M3_RQ_NONE && has_q) {
        /* the tensors will be BF16: a quantization_config would send other loaders wrong */
        json_object_del(root, "quantization_config");
        if (tc) json_object_del(tc, "quantization_config");
        changed = 1;
    } else if (qm != M3_RQ_NONE && !has_q) {
        json_error_t je;
        json_t *q = json_loads(QUANT_CONFIG, 0, &je);
        if (!q || json_object_set_new(root, "quantization_config", q)) {
            json_decref(root);
            free(orig);
            m3_errf(err, "out of memory");
            return NULL;
        }
        changed = 1;
    }
    char *text;
    size_t n;
    if (changed) {
        m3_sbuf b = {0};
        m3_json_write(&b, root, 1);
        if (b.oom || !b.p) { json_decref(root); free(b.p); free(orig); m3_errf(err, "out of memory"); return NULL; }
        text = b.p;
        n = b.n;
        free(orig);
    } else {
        text = orig; /* copied byte for byte */
        n = orig_n;
    }
    json_decref(root);
    if (m3_config_parse(cfg, text, path ? path : "built-in config", err)) { free(text); return NULL; }
    *len = n;
    return text;
}

/* --tokenizer: config.json's text and *cfg rewritten so that vocab_size covers every id of
 * the tokenizer and bos / eos_token_id are its ]~!b[ and [e~[ (a model whose EOS is [e~[
 * stops at the end of its turn). */
static int set_token_ids(const m3_tok_files *tf, char **cfg_text, size_t *cfg_len, m3_config *cfg, m3_err *err) {
    json_error_t je;
    m3_sbuf b = {0};
    int rc = -1;
    json_t *croot = json_loadb(*cfg_text, *cfg_len, 0, &je);
    json_t *tc = json_object_get(croot, "text_config");
    if (!json_is_object(tc)) tc = croot;
    if (!tc) { m3_errf(err, "config: bad JSON: %s", je.text); goto out; }
    json_int_t nv = json_integer_value(json_object_get(tc, "vocab_size"));
    if (nv < tf->max_id + 1) nv = tf->max_id + 1;
    if (json_object_set_new(tc, "vocab_size", json_integer(nv)) ||
        json_object_set_new(tc, "bos_token_id", json_integer(tf->bos_id)) ||
        json_object_set_new(tc, "eos_token_id", json_integer(tf->eos_id))) {
        m3_errf(err, "out of memory");
        goto out;
    }
    m3_json_write(&b, croot, 1);
    if (b.oom || !b.p) { m3_errf(err, "out of memory"); goto out; }
    m3_config_free(cfg);
    if (m3_config_parse(cfg, b.p, "config with --tokenizer", err)) goto out;
    free(*cfg_text);
    *cfg_text = b.p;
    *cfg_len = b.n;
    b.p = NULL;
    rc = 0;
out:
    free(b.p);
    json_decref(croot);
    return rc;
}

static int is_shard_name(const char *s) {
    /* model-NNNNN-of-NNNNN.safetensors */
    if (strlen(s) != strlen("model-00001-of-00001.safetensors") || strncmp(s, "model-", 6) != 0) return 0;
    for (int i = 6; i < 11; i++) if (!isdigit((unsigned char)s[i])) return 0;
    if (strncmp(s + 11, "-of-", 4) != 0) return 0;
    for (int i = 15; i < 20; i++) if (!isdigit((unsigned char)s[i])) return 0;
    return strcmp(s + 20, ".safetensors") == 0;
}

/* Removes weight files of an earlier run that the new checkpoint does not overwrite, so a
 * reader never mixes the two (a stale index would win over a fresh model.safetensors). */
static void remove_stale(const char *dir, int nfiles) {
    char p[4200];
    if (nfiles == 0) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        unlink(p);
    } else {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        unlink(p);
    }
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!is_shard_name(de->d_name)) continue;
        if (nfiles > 0 && atoi(de->d_name + 15) == nfiles && atoi(de->d_name + 6) >= 1 && atoi(de->d_name + 6) <= nfiles)
            continue; /* will be overwritten */
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
}

/* Cuts l into shards of consecutive tensors of up to about shard_mb * 10^6 bytes (none when
 * shard_mb is 0: *nfiles = 0, one model.safetensors) and refuses a file that would not fit in
 * about 3/4 of physical memory (it is held whole until written). */
static int assign_shards(rw_list *l, uint64_t shard_mb, int *nfiles_out, uint64_t *total, int64_t *max_k,
                         size_t *n_entries, m3_err *err) {
    const uint64_t limit = shard_mb * 1000000ull;
    uint64_t cur = 0, biggest = 0, shard_bytes = 0;
    int nfiles = 0;
    for (size_t i = 0; i < l->n; i++) {
        rw_spec *s = &l->s[i];
        if (shard_mb && cur > 0 && cur + s->bytes > limit) { nfiles++; cur = 0; }
        s->shard = nfiles;
        cur += s->bytes;
        *total += s->bytes;
        if (s->K > *max_k) *max_k = s->K;
        *n_entries += s->fmt == RW_MXFP8 ? 2 : s->fmt == RW_NVFP4 ? 3 : 1;
    }
    nfiles = shard_mb ? nfiles + 1 : 0; /* 0: single model.safetensors */
    *nfiles_out = nfiles;
    for (int f = 0, k = 0; f < (nfiles ? nfiles : 1); f++) {
        shard_bytes = 0;
        for (; k < (int)l->n && (nfiles == 0 || l->s[k].shard == f); k++) shard_bytes += l->s[k].bytes;
        if (shard_bytes > biggest) biggest = shard_bytes;
    }
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    double phys = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
    if (phys > 0 && (double)biggest > 0.75 * phys)
        return m3_errf(err, "%s %.2f GB would have to be held in memory at once (%.1f GB of RAM); %s",
                       nfiles ? "a shard of" : "the single-file checkpoint of", (double)biggest / 1e9, phys / 1e9,
                       nfiles ? "use a smaller --shard-mb" : "use --shard-mb N");
    return 0;
}

/* Generates and writes every shard (or the one model.safetensors), one file's tensors in
 * memory at a time; with shards, wmap gets each entry's file. */
static int write_weights(const m3_rand_opts *o, const rw_list *l, int nfiles, const rw_zig *zig, m3_pool *pool,
                         float *scratch, int64_t max_k, rw_out *outs, json_t *wmap, m3_err *err) {
    const char *prefix = o->bare ? "" : "language_model.";
    size_t k = 0;
    for (int f = 0; f < (nfiles ? nfiles : 1); f++) {
        char fname[64], path[4200];
        if (nfiles) snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", f + 1, nfiles);
        else snprintf(fname, sizeof fname, "model.safetensors");
        snprintf(path, sizeof path, "%s/%s", o->out, fname);
        m3_st_writer *w = m3_stw_new();
        if (!w) return m3_errf(err, "out of memory");
        size_t first = k;
        int bad = 0;
        for (; k < l->n && (nfiles == 0 || l->s[k].shard == f); k++) {
            if (m3_rw_generate(&l->s[k], zig, o->seed, o->quant, pool, scratch, max_k, &outs[k], err) ||
                m3_rw_add_entries(w, &l->s[k], &outs[k], prefix, o->quant, wmap, fname, err)) {
                k++;
                bad = 1;
                break;
            }
        }
        if (!bad && m3_stw_write(w, path, err)) bad = 1;
        m3_stw_free(w);
        for (size_t j = first; j < k; j++) {
            free(outs[j].a);
            free(outs[j].b);
            memset(&outs[j], 0, sizeof outs[j]);
        }
        if (bad) return -1;
    }
    return 0;
}

/* writes OUT/name (name: a file name) */
static int write_named(const char *out, const char *name, const char *text, size_t n, m3_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", out, name);
    return m3_write_file(path, text, n, err);
}

int m3_rand_ckpt_write(const m3_rand_opts *o, m3_rand_report *rep, m3_err *err) {
    m3_rand_report r0;
    if (!rep) rep = &r0;
    memset(rep, 0, sizeof *rep);
    m3_config cfg;
    memset(&cfg, 0, sizeof cfg);
    m3_tok_files tf;
    memset(&tf, 0, sizeof tf);
    rw_list L = {0};
    m3_pool *pool = NULL;
    float *scratch = NULL;
    rw_out *outs = NULL;
    json_t *index = NULL, *wmap = NULL;
    rw_zig zig;
    size_t cfg_len = 0;
    int rc = -1, nfiles = 0;
    uint64_t total = 0;
    size_t n_entries = 0;
    int64_t max_k = 1;
    char *cfg_text = make_config(o->config, o->quant, &cfg, &cfg_len, err);
    if (!cfg_text) goto done;
    if (o->tokenizer &&
        (m3_tok_files_make(o->tokenizer, &tf, err) || set_token_ids(&tf, &cfg_text, &cfg_len, &cfg, err)))
        goto done;
    if (plan(&cfg, o->quant, &L, err)) goto done;
    if (assign_shards(&L, o->shard_mb, &nfiles, &total, &max_k, &n_entries, err)) goto done;

    if (m3_mkdir_p(o->out, err)) goto done;
    m3_rw_zig_init(&zig);
    pool = m3_pool_create(0);
    if (!pool) { m3_errf(err, "cannot start worker threads"); goto done; }
    scratch = malloc((size_t)m3_pool_size(pool) * (size_t)max_k * sizeof *scratch);
    outs = calloc(L.n, sizeof *outs);
    if (!scratch || !outs) { m3_errf(err, "out of memory"); goto done; }
    if (nfiles) {
        index = json_object();
        wmap = json_object();
        json_t *meta = json_object();
        if (!index || !wmap || !meta || json_object_set_new(meta, "total_size", json_integer((json_int_t)total)) ||
            json_object_set_new(index, "metadata", meta) || json_object_set(index, "weight_map", wmap)) {
            m3_errf(err, "out of memory");
            goto done;
        }
    }
    remove_stale(o->out, nfiles);
    if (write_weights(o, &L, nfiles, &zig, pool, scratch, max_k, outs, wmap, err)) goto done;
    if (nfiles) {
        char *txt = json_dumps(index, JSON_INDENT(2) | JSON_SORT_KEYS);
        if (!txt) { m3_errf(err, "out of memory"); goto done; }
        int w = write_named(o->out, "model.safetensors.index.json", txt, strlen(txt), err);
        free(txt);
        if (w) goto done;
    }
    if (write_named(o->out, "config.json", cfg_text, cfg_len, err)) goto done;
    if (tf.tokenizer_json && write_named(o->out, "tokenizer.json", tf.tokenizer_json, strlen(tf.tokenizer_json), err))
        goto done;
    if (tf.tokenizer_config_json && write_named(o->out, "tokenizer_config.json", tf.tokenizer_config_json,
                                                strlen(tf.tokenizer_config_json), err))
        goto done;
    if (o->with_dspark && m3_rw_write_dspark(o->out, &cfg, o->dspark_config, o->seed, o->bare, &zig, pool, rep, err))
        goto done;
    rep->n_entries = n_entries;
    rep->n_weights = L.n;
    rep->bytes = total;
    rep->n_files = nfiles;
    rep->threads = m3_pool_size(pool);
    rc = 0;
done:
    if (outs)
        for (size_t j = 0; j < L.n; j++) { free(outs[j].a); free(outs[j].b); }
    free(outs);
    free(scratch);
    if (pool) m3_pool_free(pool);
    json_decref(wmap);
    json_decref(index);
    free(L.s);
    free(cfg_text);
    m3_tok_files_free(&tf);
    m3_config_free(&cfg);
    return rc;
}
