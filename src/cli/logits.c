/* m3 logits: one prefill (in chunks of --ubatch tokens) and optional greedy decode steps,
 * written to a safetensors file for comparison with a reference.
 * Images: --image FILE (repeatable) or --pixel-values FILE.safetensors; the ids then carry one
 * image placeholder (the config's image_token_index) per image, in order, which is expanded to
 * start, image tokens x (grid_h * grid_w / merge^2), end (a run already expanded to that count
 * is kept as is); start / end ids: --image-start-id / --image-end-id, else the checkpoint's
 * tokenizer, else none. --dump-vision adds pixel_values, image_grid_thw, vision_tower_out,
 * image_embeds and the expanded input_ids to the output.
 * Teacher forcing (oracle_check --teacher-forced): --teacher-forced FILE.safetensors
 * [--teacher-prefix P] feeds every layer l the tensor P"hidden.l" of FILE ([T, hidden], a
 * reference's residual stream entering layer l) in place of the previous layer's output, so the
 * dumped hidden.l+1 (implied --dump-hidden) is layer l's output on the reference's input.
 * --near-ties ULPS (CPU, --precision bf16) adds near_ties.layerN / near_ties_attn.layerN [T]
 * (m3_cpu_ties: GEMM input elements within ULPS f32 ulps of a bf16 rounding midpoint, per
 * token, in all of layer N's GEMMs / in its q-k-v input) and near_ties.lm_head. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/cpu/cpu.h"
#include "../backend/cuda/cuda.h"
#include "cli.h"
#include "tp.h"

typedef struct {
    int T, ni, topk_out, n_layers;
    int t0;               /* offset of the current chunk */
    int32_t **blocks;     /* per layer [ni][T][topk_out] or NULL */
    float **hidden;       /* per layer index [T][H] or NULL */
    int H;
    const m3_st *teacher; /* --teacher-forced: the reference's residual streams, or NULL */
    const char *tprefix;
    m3_cpu_ties *ties;    /* --near-ties: the recorder, its counts gathered per layer below */
    int32_t **tie_all, **tie_first; /* [n_layers + 1] (the last: lm_head) of [T] */
    int failed;           /* a tap could not do its work: the message below */
    char msg[200];
} dump_state;

/* the recorder's counts since the last call -> slot k (layer, or n_layers: lm_head), cleared */
static void ties_take(dump_state *d, int k) {
    m3_cpu_ties *r = d->ties;
    if (!r) return;
    if (k >= 0) {
        if (!d->tie_all[k]) d->tie_all[k] = calloc((size_t)d->T, sizeof(int32_t));
        if (!d->tie_first[k]) d->tie_first[k] = calloc((size_t)d->T, sizeof(int32_t));
        if (!d->tie_all[k] || !d->tie_first[k]) {
            d->failed = 1;
            snprintf(d->msg, sizeof d->msg, "out of memory for near-tie counts");
        } else {
            for (int t = 0; t < r->T && d->t0 + t < d->T; t++) { /* (a last chunk has fewer rows) */
                d->tie_all[k][d->t0 + t] += r->all[t];
                d->tie_first[k][d->t0 + t] += r->first[t];
            }
        }
    }
    memset(r->all, 0, sizeof(int32_t) * (size_t)r->T);
    memset(r->first, 0, sizeof(int32_t) * (size_t)r->T);
    r->calls = 0;
}

/* teacher forcing: layer l starts from the reference's hidden.l */
static int tap_stream(void *arg, int layer, float *h, int T, int H) {
    dump_state *d = arg;
    char nm[160];
    snprintf(nm, sizeof nm, "%shidden.%d", d->tprefix, layer);
    const m3_tensor *r = m3_st_find(d->teacher, nm);
    if (!r || r->dtype != M3_DT_F32 || r->ndim != 2 || r->shape[0] != d->T || r->shape[1] != H) {
        if (!d->failed)
            snprintf(d->msg, sizeof d->msg, "--teacher-forced: no f32 tensor %s of shape [%d, %d] in the reference", nm, d->T, H);
        d->failed = 1;
        return 0;
    }
    memcpy(h, (const float *)r->data + (size_t)d->t0 * H, sizeof(float) * (size_t)T * H);
    return 1;
}

static void tap_index(void *arg, int layer, const int32_t *sel, int T, int ni, int topk) {
    dump_state *d = arg;
    if (!d->blocks) return;
    if (!d->blocks[layer]) {
        d->blocks[layer] = malloc(sizeof(int32_t) * (size_t)d->ni * d->T * d->topk_out);
        if (!d->blocks[layer]) return;
        for (size_t i = 0; i < (size_t)d->ni * d->T * d->topk_out; i++) d->blocks[layer][i] = -1;
    }
    for (int t = 0; t < T; t++)
        for (int g = 0; g < ni; g++)
            for (int k = 0; k < d->topk_out && k < topk; k++)
                d->blocks[layer][((size_t)g * d->T + d->t0 + t) * d->topk_out + k] = sel[((size_t)t * ni + g) * topk + k];
}

static void tap_hidden(void *arg, int layer, const float *h, int T, int H) {
    dump_state *d = arg;
    ties_take(d, layer - 1); /* hidden.l closes layer l - 1 (hidden.0: nothing before) */
    if (!d->hidden) return;
    if (!d->hidden[layer]) d->hidden[layer] = calloc((size_t)d->T * H, sizeof(float));
    if (d->hidden[layer]) memcpy(d->hidden[layer] + (size_t)d->t0 * H, h, sizeof(float) * (size_t)T * H);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* one step on the model, or on the ranks of a tensor-parallel group (-tp N) */
static int forward(m3_model *m, m3_cli_tp *tp, m3_kv *kv, const m3_batch *b, const int32_t *ids,
                   const m3_embed_override *ov, const int *rows, int n, float *logits, const m3_taps *taps, m3_err *err) {
    if (tp->g) return m3_group_forward_ex(tp->g, b, ids, ov, rows, n, logits, taps, err);
    return m3_forward_ex(m, kv, b, ids, ov, rows, n, logits, taps, err);
}

int m3_cmd_logits(int argc, char **argv) {
    const char *dir = NULL, *ids_s = NULL, *out = NULL, *kvd = "f32", *ikd = NULL, *backend = NULL, *precision = NULL;
    long decode = 0, threads = 0, ubatch = 512, tp_size = 1;
    m3_moe_split moe = M3_MOE_EXPERTS;
    const char *teacher_file = NULL, *tprefix = "";
    long near_ties = -1;
    int dump_index = 0, dump_hidden = 0, dump_vision = 0, lm_only = 0, n_images = 0;
    long start_id = -1, end_id = -1;
    const char *images[64], *pixel_file = NULL;
    m3_err err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { dir = v; i++; }
        else if (!strcmp(a, "--ids")) { ids_s = v; i++; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) { out = v; i++; }
        else if (!strcmp(a, "--kv-cache-dtype")) { kvd = v; i++; }
        else if (!strcmp(a, "--backend")) { backend = v; i++; }
        else if (!strcmp(a, "--precision")) { precision = v ? v : ""; i++; }
        else if (!strcmp(a, "--moe-act-quant")) { if (m3_cli_set_moe_act_quant(v, "logits")) return 2; i++; }
        else if (!strcmp(a, "--index-cache-dtype")) { ikd = v; i++; }
        else if (!strcmp(a, "--decode")) { r = m3_cli_int(a, v, 0, 1 << 20, &decode, &err); i++; }
        else if (!strcmp(a, "--threads")) { r = m3_cli_int(a, v, 0, 1024, &threads, &err); i++; }
        else if (!strcmp(a, "--ubatch")) { r = m3_cli_int(a, v, 1, 1 << 20, &ubatch, &err); i++; }
        else if (!strcmp(a, "-tp") || !strcmp(a, "--tensor-parallel-size")) { r = m3_cli_int(a, v, 1, 64, &tp_size, &err); i++; }
        else if (!strcmp(a, "--moe-split")) {
            if (v && m3_moe_split_parse(v, &moe)) { fprintf(stderr, "m3 logits: --moe-split: '%s' is not experts or width\n", v); return 2; }
            i++;
        }
        else if (!strcmp(a, "--dump-index")) dump_index = 1;
        else if (!strcmp(a, "--teacher-forced")) { teacher_file = v; dump_hidden = 1; i++; }
        else if (!strcmp(a, "--teacher-prefix")) { tprefix = v ? v : ""; i++; }
        else if (!strcmp(a, "--near-ties")) { r = m3_cli_int(a, v, 0, 32767, &near_ties, &err); i++; }
        else if (!strcmp(a, "--dump-hidden")) dump_hidden = 1;
        else if (!strcmp(a, "--dump-vision")) dump_vision = 1;
        else if (!strcmp(a, "--language-model-only")) lm_only = 1;
        else if (!strcmp(a, "--pixel-values")) { pixel_file = v; i++; }
        else if (!strcmp(a, "--image")) {
            if (n_images == 64) { fprintf(stderr, "m3 logits: at most 64 --image options\n"); return 2; }
            if (v) images[n_images++] = v;
            i++;
        }
        else if (!strcmp(a, "--image-start-id")) { r = m3_cli_int(a, v, 0, INT32_MAX, &start_id, &err); i++; }
        else if (!strcmp(a, "--image-end-id")) { r = m3_cli_int(a, v, 0, INT32_MAX, &end_id, &err); i++; }
        else { fprintf(stderr, "m3 logits: unknown option '%s'\n", a); return 2; }
        if (r) { fprintf(stderr, "m3 logits: %s\n", err.msg); return 2; }
        if (i >= argc) { fprintf(stderr, "m3 logits: %s needs a value\n", a); return 2; }
    }
    if (!dir || !ids_s || !out) {
        fprintf(stderr, "m3 logits: usage: m3 logits -m DIR --ids 1,2,3 [--decode N] [--kv-cache-dtype f32|bf16|fp8|nvfp4] [--backend cpu|cuda|auto] [--precision exact|bf16] [--moe-act-quant none|nvfp4] [--dump-index] [--dump-hidden] [--teacher-forced REF.safetensors [--teacher-prefix P]] [--near-ties ULPS] [--image FILE ... | --pixel-values FILE] [--image-start-id N --image-end-id N] [--dump-vision] [--language-model-only] [-tp N [--moe-split experts|width]] -o OUT.safetensors\n");
        return 2;
    }
    if (n_images && pixel_file) { fprintf(stderr, "m3 logits: give --image or --pixel-values, not both\n"); return 2; }
    if (dump_vision && !n_images && !pixel_file) { fprintf(stderr, "m3 logits: --dump-vision needs --image or --pixel-values\n"); return 2; }
    m3_kv_dtype kdt, idt;
    if (m3_kv_dtype_parse(kvd, &kdt)) { fprintf(stderr, "m3 logits: --kv-cache-dtype: unknown dtype '%s' (f32, bf16, fp8, nvfp4)\n", kvd); return 2; }
    if (!ikd) idt = kdt;
    else if (m3_kv_dtype_parse(ikd, &idt)) { fprintf(stderr, "m3 logits: --index-cache-dtype: unknown dtype '%s' (f32, bf16, fp8, nvfp4)\n", ikd); return 2; }
    if (teacher_file && (tp_size > 1 || n_images || pixel_file)) {
        fprintf(stderr, "m3 logits: --teacher-forced runs text prompts on one device (no -tp, no images)\n");
        return 2;
    }
    if (precision && m3_cli_set_precision(precision, "logits")) return 2;
    if (near_ties >= 0 && (!precision || strcmp(precision, "bf16"))) {
        fprintf(stderr, "m3 logits: --near-ties counts bf16 rounding near-ties: it needs --precision bf16\n");
        return 2;
    }
    int32_t *ids;
    int T;
    if (m3_cli_parse_ids(ids_s, &ids, &T, &err)) { fprintf(stderr, "m3 logits: %s\n", err.msg); return 2; }
    m3_st *teacher = NULL;
    if (teacher_file && !(teacher = m3_st_open(teacher_file, &err))) {
        fprintf(stderr, "m3 logits: --teacher-forced: %s\n", err.msg);
        free(ids);
        return 2;
    }

    m3_ops ops;
    m3_model m;
    m3_cli_tp tp = {0};
    if (tp_size > 1) { /* -tp N: m holds the host weights, the group's ranks compute */
        if (n_images || pixel_file) { fprintf(stderr, "m3 logits: images with --tensor-parallel-size are not supported yet\n"); free(ids); return 2; }
        memset(&ops, 0, sizeof ops);
        if (m3_cli_tp_load(&tp, &m, backend, dir, (int)threads, (int)tp_size, moe, "logits", ids, T)) { free(ids); return 1; }
    } else if (m3_cli_load_on(&m, &ops, backend, dir, (int)threads, "logits", ids, T)) { free(ids); return 1; }
    if (near_ties >= 0 && strcmp(ops.name, "cpu")) {
        fprintf(stderr, "m3 logits: --near-ties is recorded by the CPU backend only (this is %s)\n", ops.name);
        m3_model_free(&m);
        m3_cli_ops_free(&ops);
        m3_st_close(teacher);
        free(ids);
        return 2;
    }
    m3_cli_images im = {0};
    if ((n_images || pixel_file) &&
        m3_cli_images_prepare(&im, &m, &ops, dir, images, n_images, pixel_file, lm_only, (int32_t)start_id, (int32_t)end_id,
                              (int)threads, &ids, &T, "logits")) {
        free(ids);
        m3_model_free(&m);
        m3_cli_ops_free(&ops);
        return 1;
    }
    const m3_config *c = &m.cfg;
    const int V = c->vocab, N = (int)decode;
    int rc = 1;
    int page = m3_kv_page_tokens(c);
    int total = T + (N > 0 ? N : 0);
    m3_kv kv, *kvp = &kv; /* -tp N: rank 0's pool holds the page table every rank uses */
    m3_kv_mem mem = m3_model_kv_mem(&m);
    if (tp.g ? m3_group_kv_create(tp.g, kdt, idt, page, (total + page - 1) / page, &err)
             : m3_kv_create_in(&kv, c, kdt, idt, page, (total + page - 1) / page, &mem, &err)) {
        fprintf(stderr, "m3 logits: %s\n", err.msg);
        goto early;
    }
    if (tp.g) kvp = m3_group_kv(tp.g, 0);
    m3_kv_seq seq = {0};
    m3_kv_seq *seqs[1] = {&seq};
    int nb_total = (T + c->block_size - 1) / (c->block_size ? c->block_size : 1);
    dump_state ds = {.T = T, .ni = c->index_heads, .topk_out = c->topk_blocks < nb_total ? c->topk_blocks : nb_total,
                     .n_layers = c->n_layers, .H = c->hidden};
    if (dump_index && c->n_sparse_layers) ds.blocks = calloc((size_t)c->n_layers, sizeof *ds.blocks);
    if (dump_hidden) ds.hidden = calloc((size_t)c->n_layers + 1, sizeof *ds.hidden);
    m3_taps taps = {.arg = &ds, .hidden = dump_hidden ? tap_hidden : NULL, .index = dump_index ? tap_index : NULL,
                    .stream = teacher ? tap_stream : NULL};
    ds.teacher = teacher;
    ds.tprefix = tprefix;
    m3_cpu_ties ties = {(int)near_ties, (int)(T < ubatch ? T : ubatch), NULL, NULL, 0};

    float *logits = malloc(sizeof(float) * (size_t)T * V);
    float *glog = N ? malloc(sizeof(float) * (size_t)N * V) : NULL;
    int32_t *gtok = N ? malloc(sizeof(int32_t) * (size_t)N) : NULL;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(ubatch > 1 ? ubatch : 1));
    int32_t *sq = calloc((size_t)ubatch, sizeof(int32_t));
    int *rows = malloc(sizeof(int) * (size_t)ubatch);
    int32_t *irows = malloc(sizeof(int32_t) * (size_t)ubatch);
    if (!logits || (N && (!glog || !gtok)) || !pos || !sq || !rows || !irows) { fprintf(stderr, "m3 logits: out of memory\n"); goto done; }
    if (near_ties >= 0) {
        ties.first = calloc((size_t)ties.T, sizeof(int32_t));
        ties.all = calloc((size_t)ties.T, sizeof(int32_t));
        ds.tie_all = calloc((size_t)c->n_layers + 1, sizeof *ds.tie_all);
        ds.tie_first = calloc((size_t)c->n_layers + 1, sizeof *ds.tie_first);
        ds.hidden = ds.hidden ? ds.hidden : calloc((size_t)c->n_layers + 1, sizeof *ds.hidden); /* its tap closes layers */
        taps.hidden = tap_hidden;
        if (!ties.first || !ties.all || !ds.tie_all || !ds.tie_first || !ds.hidden) {
            fprintf(stderr, "m3 logits: out of memory\n");
            goto done;
        }
        ds.ties = &ties;
        m3_cpu_record_ties(&ops, &ties);
    }
    for (int t0 = 0; t0 < T; t0 += (int)ubatch) {
        int n = T - t0 < ubatch ? T - t0 : (int)ubatch;
        for (int i = 0; i < n; i++) { pos[i] = t0 + i; rows[i] = i; }
        m3_batch b = {n, pos, sq, seqs};
        ds.t0 = t0;
        /* image rows of this chunk take the image embeddings */
        m3_embed_override ov = {0, irows, NULL};
        for (int i = 0; i < im.n_rows; i++)
            if (im.rows[i] >= t0 && im.rows[i] < t0 + n) {
                if (!ov.n) ov.emb = im.embeds + (size_t)i * c->hidden;
                irows[ov.n++] = im.rows[i] - t0;
            }
        ties_take(&ds, -1); /* nothing before this chunk's embeddings counts */
        if (forward(&m, &tp, kvp, &b, ids + t0, &ov, rows, n, logits + (size_t)t0 * V, &taps, &err)) {
            fprintf(stderr, "m3 logits: %s\n", err.msg);
            goto done;
        }
        ties_take(&ds, c->n_layers); /* after the final norm's tap: lm_head's GEMM */
        if (ds.failed) { fprintf(stderr, "m3 logits: %s\n", ds.msg); goto done; }
    }
    if (ds.ties) m3_cpu_record_ties(&ops, NULL); /* decode steps: not recorded */
    if (N) {
        memcpy(glog, logits + (size_t)(T - 1) * V, sizeof(float) * V);
        for (int i = 0; i < N; i++) {
            gtok[i] = argmax(glog + (size_t)i * V, V);
            if (i + 1 == N) break;
            int32_t p = T + i, s0 = 0, r0 = 0;
            m3_batch b = {1, &p, &s0, seqs};
            if (forward(&m, &tp, kvp, &b, &gtok[i], NULL, &r0, 1, glog + (size_t)(i + 1) * V, NULL, &err)) {
                fprintf(stderr, "m3 logits: %s\n", err.msg);
                goto done;
            }
        }
    }
    {
        m3_st_writer *w = m3_stw_new();
        int64_t sh[3] = {T, V};
        int ok = w && !m3_stw_add(w, "logits", M3_DT_F32, 2, sh, logits, &err);
        if (ok && N) {
            int64_t s1[1] = {N}, s2[2] = {N, V};
            ok = !m3_stw_add(w, "greedy_tokens", M3_DT_I32, 1, s1, gtok, &err) &&
                 !m3_stw_add(w, "greedy_logits", M3_DT_F32, 2, s2, glog, &err);
        }
        for (int l = 0; ok && ds.blocks && l < c->n_layers; l++) {
            if (!ds.blocks[l]) continue;
            char nm[64];
            snprintf(nm, sizeof nm, "index_blocks.layer%d", l);
            int64_t s3[3] = {ds.ni, T, ds.topk_out};
            ok = !m3_stw_add(w, nm, M3_DT_I32, 3, s3, ds.blocks[l], &err);
        }
        for (int l = 0; ok && ds.hidden && l <= c->n_layers; l++) {
            if (!ds.hidden[l]) continue;
            char nm[64];
            snprintf(nm, sizeof nm, "hidden.%d", l);
            int64_t s2[2] = {T, c->hidden};
            ok = !m3_stw_add(w, nm, M3_DT_F32, 2, s2, ds.hidden[l], &err);
        }
        for (int l = 0; ok && ds.tie_all && l <= c->n_layers; l++) {
            if (!ds.tie_all[l]) continue;
            char nm[64], nf[64];
            if (l < c->n_layers) snprintf(nm, sizeof nm, "near_ties.layer%d", l);
            else snprintf(nm, sizeof nm, "near_ties.lm_head");
            snprintf(nf, sizeof nf, "near_ties_attn.layer%d", l);
            int64_t s1[1] = {T};
            ok = !m3_stw_add(w, nm, M3_DT_I32, 1, s1, ds.tie_all[l], &err) &&
                 (l == c->n_layers || !m3_stw_add(w, nf, M3_DT_I32, 1, s1, ds.tie_first[l], &err));
        }
        if (ok && dump_vision) {
            const m3_vision_config *vc = &im.vis.cfg;
            int64_t sp[2] = {im.px.n_patches, im.px.patch_dim}, sg[2] = {im.px.n_images, 3};
            int64_t st[2] = {im.px.n_patches, vc->hidden}, se[2] = {im.n_tokens, c->hidden}, si[1] = {T};
            ok = !m3_stw_add(w, "pixel_values", M3_DT_F32, 2, sp, im.px.data, &err) &&
                 !m3_stw_add(w, "image_grid_thw", M3_DT_I32, 2, sg, im.px.grid, &err) &&
                 !m3_stw_add(w, "vision_tower_out", M3_DT_F32, 2, st, im.tower_out, &err) &&
                 !m3_stw_add(w, "image_embeds", M3_DT_F32, 2, se, im.embeds, &err) &&
                 !m3_stw_add(w, "input_ids", M3_DT_I32, 1, si, ids, &err);
        }
        if (ok) ok = !m3_stw_write(w, out, &err);
        if (!w) snprintf(err.msg, sizeof err.msg, "out of memory");
        m3_stw_free(w);
        if (!ok) { fprintf(stderr, "m3 logits: %s\n", err.msg); goto done; }
    }
    rc = 0;
done:
    if (ds.blocks) for (int l = 0; l < c->n_layers; l++) free(ds.blocks[l]);
    if (ds.hidden) for (int l = 0; l <= c->n_layers; l++) free(ds.hidden[l]);
    free(ds.blocks); free(ds.hidden);
    if (ds.tie_all) for (int l = 0; l <= c->n_layers; l++) free(ds.tie_all[l]);
    if (ds.tie_first) for (int l = 0; l <= c->n_layers; l++) free(ds.tie_first[l]);
    free(ds.tie_all); free(ds.tie_first); free(ties.first); free(ties.all);
    if (ds.ties) m3_cpu_record_ties(&ops, NULL);
    free(logits); free(glog); free(gtok); free(pos); free(sq); free(rows); free(irows);
    m3_kv_seq_release(kvp, &seq);
    if (!tp.g) m3_kv_destroy(&kv);
early:
    m3_st_close(teacher);
    free(ids);
    m3_cli_images_free(&im);
    m3_cli_tp_free(&tp);
    m3_model_free(&m);
    m3_cli_ops_free(&ops);
    return rc;
}
