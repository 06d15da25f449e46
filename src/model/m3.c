#include "m3.h"
#include "../base/clock.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../parallel/comm.h"

int m3_model_load(m3_model *m, const char *dir, m3_ops *ops, m3_progress_fn progress, void *arg, m3_err *err) {
    memset(m, 0, sizeof *m);
    double t0 = m3_now();
    m->ops = ops;
    if (m3_config_load(&m->cfg, dir, err)) return -1;
    m->st = m3_st_open(dir, err);
    if (!m->st) { m3_config_free(&m->cfg); return -1; }
    if (m3_weights_bind(&m->w, &m->cfg, m->st, err)) {
        m3_err_prefix(err, "%s", dir);
        m3_st_close(m->st);
        m3_config_free(&m->cfg);
        return -1;
    }
    if (!ops) {
        /* host weights only: the ranks of a TP group take their views of them */
    } else if (ops->weights_upload) { /* the backend keeps its own copy: upload reads every byte once */
        m->dw = calloc(1, sizeof *m->dw);
        if (!m->dw || ops->weights_upload(ops->ctx, &m->w, m->dw, err)) {
            if (!m->dw) m3_errf(err, "out of memory");
            free(m->dw);
            m->dw = NULL;
            m3_weights_free(&m->w);
            m3_st_close(m->st);
            m3_config_free(&m->cfg);
            return -1;
        }
    } else {
        m3_weights_prefault(m->st, progress, arg);
    }
    m->load_seconds = m3_now() - t0;
    return 0;
}

void m3_model_free(m3_model *m) {
    if (m->ws && m->ops) m->ops->release(m->ops->ctx, m->ws);
    if (m->dw && m->ops && m->ops->weights_release) m->ops->weights_release(m->ops->ctx, m->dw);
    free(m->dw);
    if (m->is_view) { /* a TP rank: cfg, st and the tensors are the full model's */
        m3_shard_weights_free(&m->w);
        memset(m, 0, sizeof *m);
        return;
    }
    m3_weights_free(&m->w);
    m3_st_close(m->st);
    m3_config_free(&m->cfg);
    memset(m, 0, sizeof *m);
}

/* activation buffers of one step, in backend memory (NBUF of them, one workspace) */
#define NBUF 17
_Static_assert(sizeof(m3_row_lp) % 4 == 0, "the workspace counts m3_row_lp in floats");
typedef struct {
    float *h, *a, *q, *k, *v, *att, *o, *iq, *ik, *fin, *lg;
    float *lpx, *lpl; /* prompt logprob rows: a tile's normed rows [M3_LP_TILE][H] and logits [M3_LP_TILE][V] */
    m3_row_lp *lpo;   /* their answers [n_lp] */
    int32_t *sel;
    int32_t *gid; /* greedy output rows: ids [n_out], then finite flags [n_out] */
    float *lga; /* tensor parallel: every rank's logits, gathered [rank][row][vocab_stride] */
} bufs;

int m3_forward(m3_model *m, m3_kv *kv, const m3_batch *b, const int32_t *ids, const int *out_rows, int n_out,
               float *logits, const m3_taps *taps, m3_err *err) {
    return m3_forward_ex(m, kv, b, ids, NULL, out_rows, n_out, logits, taps, err);
}

int m3_forward_ex(m3_model *m, m3_kv *kv, const m3_batch *b, const int32_t *ids, const m3_embed_override *ov,
                  const int *out_rows, int n_out, float *logits, const m3_taps *taps, m3_err *err) {
    const m3_config *c = &m->cfg;
    const m3_weights *W = m3_model_weights(m);
    m3_ops *op = m->ops;
    void *X = op->ctx;
    /* tensor parallel: this rank's heads, KV heads, index heads and vocabulary rows */
    const m3_shard *sh = m->comm ? &m->shard : NULL;
    const int T = b->T, H = c->hidden, D = c->head_dim;
    const int nh = sh ? sh->n_heads : c->n_heads, nkv = sh ? sh->n_kv_heads : c->n_kv_heads;
    const int ni = sh ? sh->index_heads : c->index_heads, Di = c->index_dim, V = c->vocab;
    const int Vl = sh ? sh->vocab_stride : V; /* logits per row this rank computes (at most) */
    const float eps = (float)c->rms_eps;
    const m3_moe_p mp = {c->n_experts, c->top_k, (float)c->routed_scale, (float)c->swiglu_alpha, (float)c->swiglu_limit,
                         c->fc1_quant ? M3_FC1_NVFP4 : M3_FC1_EXACT};
    if (T <= 0) return 0;
    for (int t = 0; t < T; t++) {
        if (ids[t] < 0 || ids[t] >= V) return m3_errf(err, "token id %d at index %d is out of range (vocab %d)", ids[t], t, V);
        if (b->pos[t] < 0) return m3_errf(err, "negative position %d at index %d", b->pos[t], t);
    }
    if (ov && ov->n)
        for (int i = 0; i < ov->n; i++)
            if (ov->rows[i] < 0 || ov->rows[i] >= T)
                return m3_errf(err, "embedding override row %d is outside the batch (%d tokens)", ov->rows[i], T);
    if (taps && taps->n_lp < 0) return m3_errf(err, "prompt logprob rows: %d", taps->n_lp);
    if (taps && taps->n_lp > 0) { /* prompt logprob rows: where the logits are, batch rows in order */
        if (!op->logprob_rows || sh || !taps->lp_rows || !taps->lp_tok || !taps->lp_n || !taps->lp_out)
            return m3_errf(err, "prompt logprob rows: %s", sh ? "not under tensor parallelism (their logits come back whole)"
                                                          : !op->logprob_rows ? "the backend has no logprob_rows op"
                                                                               : "rows, tokens or answers missing");
        if (taps->lp_k < 0 || taps->lp_k > M3_ROW_TOP_MAX)
            return m3_errf(err, "prompt logprob rows: top %d (at most %d)", taps->lp_k, M3_ROW_TOP_MAX);
        for (int i = 0; i < taps->n_lp; i++) {
            if (taps->lp_rows[i] < 0 || taps->lp_rows[i] >= T || (i && taps->lp_rows[i] <= taps->lp_rows[i - 1]))
                return m3_errf(err, "prompt logprob row %d: batch row %d of %d (ascending, in the batch)", i, taps->lp_rows[i], T);
            if (taps->lp_n[i] < 1 || taps->lp_n[i] > V)
                return m3_errf(err, "prompt logprob row %d: %d text ids of a vocabulary of %d", i, taps->lp_n[i], V);
        }
    }
    for (int g = 0; taps && g < taps->n_verify; g++) { /* verified groups: drawn output rows, drafts in the vocabulary */
        const m3_verify_group *G = &taps->verify[g];
        if (G->k < 0 || G->k > M3_VERIFY_K_MAX || G->row0 < 0 || G->row0 + G->k >= n_out || !taps->greedy_n)
            return m3_errf(err, "verified group %d: rows %d..%d of %d output rows", g, G->row0, G->row0 + G->k, n_out);
        for (int i = 0; i <= G->k; i++)
            if (taps->greedy_n[G->row0 + i] >= 0 || !(G->u[i] >= 0 && G->u[i] < 1) || (i < G->k && (G->d[i] < 0 || G->d[i] >= V)))
                return m3_errf(err, "verified group %d, row %d: not a drawn row, uniform %g or draft %d (vocab %d)", g, i, G->u[i],
                               i < G->k ? G->d[i] : 0, V);
    }
    if (!sh) {
        for (int t = 0; t < T; t++)
            if (m3_kv_seq_reserve(kv, b->seqs[b->seq[t]], b->pos[t] + 1, err)) return -1;
    } else { /* the ranks share the sequences' page tables: the group reserved them */
        for (int t = 0; t < T; t++)
            if ((long)b->seqs[b->seq[t]]->n_pages * kv->page < (long)b->pos[t] + 1)
                return m3_errf(err, "rank %d: position %d has no KV page (the group reserves pages before a step)",
                               sh->rank, b->pos[t]);
    }

    int topk = c->topk_blocks;
    size_t TT = (size_t)T;
    /* activations live in one workspace kept across steps (grown when a step needs more) */
    const int n_lp = taps ? taps->n_lp : 0, lp_tile = n_lp < M3_LP_TILE ? n_lp : M3_LP_TILE;
    size_t n_o = (size_t)(n_out ? n_out : 1), sz[NBUF] = {
        TT * H, TT * H, TT * nh * D, TT * nkv * D, TT * nkv * D, TT * nh * D, TT * H, n_o * H, n_o * Vl,
        c->n_sparse_layers ? TT * ni * Di : 0, c->n_sparse_layers ? TT * Di : 0, c->n_sparse_layers ? TT * ni * topk : 0,
        sh ? n_o * Vl * sh->size : 0, sh ? 0 : 2 * n_o, (size_t)lp_tile * H, (size_t)lp_tile * V,
        (size_t)n_lp * sizeof(m3_row_lp) / 4};
    size_t need = 0;
    for (int i = 0; i < NBUF; i++) need += (sz[i] * 4 + 63) & ~(size_t)63;
    int ok = 1;
    if (need > m->ws_bytes) {
        op->release(X, m->ws);
        m->ws = op->alloc(X, need);
        m->ws_bytes = m->ws ? need : 0;
        ok = m->ws != NULL;
    }
    bufs B = {0};
    if (ok) {
        char *p = m->ws;
        void **slot[NBUF] = {(void **)&B.h,   (void **)&B.a,   (void **)&B.q,   (void **)&B.k,   (void **)&B.v,
                             (void **)&B.att, (void **)&B.o,   (void **)&B.fin, (void **)&B.lg,  (void **)&B.iq,
                             (void **)&B.ik,  (void **)&B.sel, (void **)&B.lga, (void **)&B.gid, (void **)&B.lpx,
                             (void **)&B.lpl, (void **)&B.lpo};
        for (int i = 0; i < NBUF; i++) {
            *slot[i] = sz[i] ? p : NULL;
            p += (sz[i] * 4 + 63) & ~(size_t)63;
        }
    }
    float *host = NULL;
    int32_t *hsel = NULL;
    if (ok && taps && (taps->hidden || (taps->capture && !taps->capture_dev) || taps->stream)) ok = (host = malloc(TT * H * 4)) != NULL;
    if (ok && taps && taps->index && c->n_sparse_layers) ok = (hsel = malloc(TT * ni * topk * 4)) != NULL;
    float *hlg = NULL; /* tensor parallel: the gathered logits on the host, before reordering */
    if (ok && sh && n_out > 0 && logits) ok = (hlg = malloc(n_o * Vl * sh->size * 4)) != NULL;
    int rc = 0, cfail = 0;
    if (!ok) { rc = m3_errf(err, "out of memory for activations of %d tokens", T); goto out; }
    if (op->begin_step && op->begin_step(X, kv, b, ids, err)) { rc = -1; goto out; }
    /* A backend may replay a recorded graph of the step's ops (CUDA graphs for decode steps):
     * graph_begin returns 1 when it launched a replay, 0 to have the ops issued (and maybe
     * recorded: graph_end then closes the recording and launches it). Not with taps, except a
     * capture into backend memory (m3_taps.capture_dev), which records like the other ops. */
    const int dev_capture_only = taps && taps->capture_dev && !taps->hidden && !taps->index && !taps->stream;
    const int no_hooks = taps && !taps->hidden && !taps->index && !taps->stream && !taps->capture; /* greedy rows alone */
    int graphable = (!taps || no_hooks || dev_capture_only) && !(ov && ov->n) && !n_lp && op->graph_begin && op->graph_end &&
                    (!m->comm || m->comm->capturable);
    /* TP: with whole experts on other ranks the MoE op synchronizes with the host (it groups the
     * tokens of the experts held here), which a recording cannot hold: no graph then */
    if (sh && sh->size > 1 && sh->moe == M3_MOE_EXPERTS && c->n_moe_layers) graphable = 0;
    uint64_t gkey = 1469598103934665603ull ^ (uint64_t)T * 1099511628211ull ^ (uint64_t)n_out << 32;
    for (int i = 0; i < n_out; i++) gkey = (gkey ^ (uint64_t)out_rows[i]) * 1099511628211ull;
    /* a recording holds the activation buffers' addresses: the workspace grows (a new address)
     * when a step needs more, and a replay recorded before must not write to the old one (a
     * decode graph replayed after a larger batch grew the workspace wrote to freed device
     * memory: the server's forward failures under load, issue 22) */
    gkey = (gkey ^ (uint64_t)(uintptr_t)m->ws) * 1099511628211ull;
    gkey = (gkey ^ (uint64_t)mp.fc1_quant) * 1099511628211ull; /* a switch of the MoE's arithmetic */
    if (dev_capture_only) gkey = (gkey ^ taps->graph_key ^ 0x6361707475726521ull) * 1099511628211ull;
issue:
    if (graphable && op->graph_begin(X, kv, gkey)) goto issued;

#define TAP_HIDDEN(layer, buf)                                                   \
    if (taps && taps->hidden) {                                                  \
        op->download(X, host, buf, TT * H * 4);                                  \
        taps->hidden(taps->arg, layer, host, T, H);                              \
    }
/* tensor parallel: every rank's partial sums added up, on every rank (no-op at TP1) */
#define ALL_REDUCE(buf, n)                                                       \
    if (m->comm && !cfail && m3_comm_all_reduce_sum(m->comm, buf, n, err)) cfail = 1;

    op->embed(X, &W->embed, ids, T, B.h);
    for (int i = 0; ov && i < ov->n; i++) /* image rows: their vectors replace the token embeddings */
        op->upload(X, B.h + (size_t)ov->rows[i] * H, ov->emb + (size_t)i * H, sizeof(float) * H);
    TAP_HIDDEN(0, B.h);
    op->rmsnorm(X, B.h, W->layers[0].in_norm, T, H, eps, B.a); /* later layers' input norms come with a residual add */

    for (int l = 0; l < c->n_layers; l++) {
        const m3_layer_w *L = &W->layers[l];
        const float *next_norm = l + 1 < c->n_layers ? W->layers[l + 1].in_norm : NULL;
        if (taps && taps->stream) { /* teacher forcing: the layer's input replaced, its input norm redone */
            op->download(X, host, B.h, TT * H * 4);
            if (taps->stream(taps->arg, l, host, T, H)) {
                op->upload(X, B.h, host, TT * H * 4);
                op->rmsnorm(X, B.h, L->in_norm, T, H, eps, B.a);
            }
        }
        /* attention: q, k, v (+ the indexer's q and k) from the normed input; per-head norm and
         * RoPE, k, v (+ index-K) into the cache; block selection (sparse layers); attention over
         * the cache; the output projection */
        const m3_linear *Ws[5] = {&L->q, &L->k, &L->v, &L->iq, &L->ik};
        float *Ys[5] = {B.q, B.k, B.v, B.iq, B.ik};
        op->linear_n(op, L->sparse ? 5 : 3, Ws, B.a, T, Ys);
        const m3_rope_job rj[4] = {{B.q, nh, D, L->q_norm}, {B.k, nkv, D, L->k_norm}, {B.iq, ni, Di, L->iq_norm},
                                   {B.ik, 1, Di, L->ik_norm}};
        op->head_norm_rope_store(op, L->sparse ? 4 : 2, rj, T, eps, c->rotary_dim, c->rope_theta, kv, l, b, B.v);
        if (L->sparse) {
            op->index_select(X, kv, l, b, B.iq, ni, c->block_size, topk, c->local_blocks, c->init_blocks, B.sel);
            if (taps && taps->index) {
                op->download(X, hsel, B.sel, TT * ni * topk * 4);
                taps->index(taps->arg, l, hsel, T, ni, topk);
            }
        }
        op->attention(X, kv, l, b, B.q, nh, L->sparse ? B.sel : NULL, c->block_size, topk, B.att);
        op->linear(X, &L->o, B.att, T, B.o);
        ALL_REDUCE(B.o, TT * H);
        op->add_rmsnorm(op, B.h, B.o, L->post_norm, T, H, eps, B.a); /* the residual, the post-attention norm */
        /* feed-forward (routed + shared experts, or the dense MLP), the residual and the next
         * layer's input norm; under tensor parallelism the partial sums are added up between */
        if (L->moe && next_norm && !m->comm) {
            op->moe_add_rmsnorm(op, L, &mp, B.a, T, B.o, B.h, next_norm, eps, B.a);
        } else {
            if (L->moe)
                op->moe(X, L, &mp, B.a, T, B.o);
            else
                op->mlp(X, &L->mlp, B.a, T, (float)c->swiglu_alpha, (float)c->swiglu_limit, B.o);
            ALL_REDUCE(B.o, TT * H);
            if (next_norm) op->add_rmsnorm(op, B.h, B.o, next_norm, T, H, eps, B.a);
            else op->add(X, B.h, B.o, TT * H);
        }
        if (taps && taps->capture && taps->capture_layers && taps->capture_layers[l]) { /* narrow capture (DSpark) */
            if (taps->capture_dev) taps->capture(taps->arg, l, B.h, T, H);
            else {
                op->download(X, host, B.h, TT * H * 4);
                taps->capture(taps->arg, l, host, T, H);
            }
        }
        if (next_norm) { TAP_HIDDEN(l + 1, B.h); }
    }
    if (taps && taps->hidden) {
        op->rmsnorm(X, B.h, W->final_norm, T, H, eps, B.a);
        TAP_HIDDEN(c->n_layers, B.a);
    }
    if (n_out > 0) {
        for (int i = 0, j; i < n_out; i = j) { /* runs of consecutive rows in one call (a verify pass: all T) */
            for (j = i + 1; j < n_out && out_rows[j] == out_rows[j - 1] + 1; j++) {}
            op->rmsnorm(X, B.h + (size_t)out_rows[i] * H, W->final_norm, j - i, H, eps, B.fin + (size_t)i * H);
        }
        op->linear(X, &W->lm_head, B.fin, n_out, B.lg);
        if (sh && !cfail && m3_comm_all_gather(m->comm, B.lg, (size_t)n_out * Vl, B.lga, err)) cfail = 1;
    }
    for (int i0 = 0; i0 < n_lp; i0 += lp_tile) { /* prompt logprob rows: a tile of logits at a time */
        const int nt = n_lp - i0 < lp_tile ? n_lp - i0 : lp_tile;
        for (int i = i0, j; i < i0 + nt; i = j) {
            for (j = i + 1; j < i0 + nt && taps->lp_rows[j] == taps->lp_rows[j - 1] + 1; j++) {}
            op->rmsnorm(X, B.h + (size_t)taps->lp_rows[i] * H, W->final_norm, j - i, H, eps, B.lpx + (size_t)(i - i0) * H);
        }
        op->linear(X, &W->lm_head, B.lpx, nt, B.lpl);
        for (int i = i0, j; i < i0 + nt; i = j) { /* runs of rows of one text width */
            for (j = i + 1; j < i0 + nt && taps->lp_n[j] == taps->lp_n[i]; j++) {}
            op->logprob_rows(X, B.lpl + (size_t)(i - i0) * V, j - i, taps->lp_n[i], V, (size_t)V, taps->lp_tok + i,
                             taps->lp_k, B.lpo + i);
        }
    }
    if (n_lp > 0) op->download(X, taps->lp_out, B.lpo, sizeof(m3_row_lp) * (size_t)n_lp);
    if (graphable && op->graph_end(X)) { /* recording failed: issue directly (collectives included) */
        graphable = 0;
        cfail = 0;
        goto issue;
    }
issued:
    for (int t = 0; t < T && !sh; t++) { /* (TP: the group advances the shared sequences) */
        int s = b->seq[t];
        if (b->seqs[s]->len < b->pos[t] + 1) b->seqs[s]->len = b->pos[t] + 1;
    }
    /* greedy rows: their argmax and finite flag where the logits are, only those come back; drawn
     * rows (greedy_n < 0): their finite flag and a draw */
    int draws = 0;
    for (int i = 0; taps && taps->greedy_n && i < n_out; i++) draws |= taps->greedy_n[i] < 0;
    const int greedy = n_out > 0 && logits && !sh && taps && taps->greedy_n && taps->greedy_ids && taps->greedy_fin &&
                       op->argmax_rows_fin && B.gid && (!draws || (taps->draw_par && op->draw_rows)) &&
                       (taps->n_verify <= 0 || (draws && op->verify_rows));
    if (taps && taps->greedy_done) *taps->greedy_done = greedy;
    if (greedy) {
        const int32_t *gn = taps->greedy_n;
#define ROW_KIND(g) ((g) > 0 ? 1 : (g) < 0 ? 2 : 0)
        for (int i = 0; i < n_out;) { /* runs of rows of one kind: the argmaxes and draws first */
            int j = i + 1;
            while (j < n_out && ROW_KIND(gn[j]) == ROW_KIND(gn[i]) && (gn[i] <= 0 || gn[j] == gn[i])) j++;
            if (gn[i] != 0) /* a drawn row's argmax is overwritten by its draw; its flag stays */
                op->argmax_rows_fin(X, B.lg + (size_t)i * V, j - i, gn[i] > 0 && gn[i] < V ? gn[i] : V, V, (size_t)V, B.gid + i,
                                    B.gid + n_out + i);
            if (gn[i] < 0) op->draw_rows(X, B.lg + (size_t)i * V, j - i, V, (size_t)V, taps->draw_par + i, B.gid + i);
            i = j;
        }
        if (taps->n_verify > 0) op->verify_rows(X, B.lg, V, (size_t)V, taps->n_verify, taps->verify, B.gid);
        for (int i = 0; i < n_out;) { /* then the rows that come back whole */
            int j = i + 1;
            while (j < n_out && (gn[j] == 0) == (gn[i] == 0)) j++;
            if (gn[i] == 0) op->download(X, logits + (size_t)i * V, B.lg + (size_t)i * V, (size_t)(j - i) * V * 4);
            i = j;
        }
#undef ROW_KIND
        op->download(X, taps->greedy_ids, B.gid, sizeof(int32_t) * (size_t)n_out);
        op->download(X, taps->greedy_fin, B.gid + n_out, sizeof(int32_t) * (size_t)n_out);
    } else if (n_out > 0 && logits && !sh) {
        op->download(X, logits, B.lg, (size_t)n_out * V * 4); /* NULL: stay in backend memory */
    }
    if (n_out > 0 && logits && sh) { /* rank r's block holds rows of its n_vocab logits: into [row][V] */
        op->download(X, hlg, B.lga, (size_t)sh->size * n_out * Vl * 4);
        for (int r = 0; r < sh->size; r++) {
            int v0, nv;
            m3_shard_vocab_range(V, sh->size, r, &v0, &nv);
            for (int i = 0; i < n_out; i++)
                memcpy(logits + (size_t)i * V + v0, hlg + ((size_t)r * n_out * Vl + (size_t)i * nv), sizeof(float) * nv);
        }
    }
#undef TAP_HIDDEN
#undef ALL_REDUCE
    if (op->check && op->check(X, cfail ? NULL : err)) rc = -1;
    if (cfail) rc = -1;
out:
    free(host);
    free(hsel);
    free(hlg);
    return rc;
}

int m3_run_tokens(m3_model *m, m3_kv *kv, m3_kv_seq *seq, const int32_t *ids, int n, int pos0, int ubatch,
                  float *logits, m3_err *err) {
    if (ubatch < 1) ubatch = 1;
    int cap = n < ubatch ? n : ubatch;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(cap > 0 ? cap : 1));
    int32_t *sq = calloc((size_t)(cap > 0 ? cap : 1), sizeof(int32_t));
    m3_kv_seq *seqs[1] = {seq};
    int rc = 0;
    if (!pos || !sq) rc = m3_errf(err, "out of memory");
    for (int p0 = 0; !rc && p0 < n; p0 += ubatch) {
        int cnt = n - p0 < ubatch ? n - p0 : ubatch, last = cnt - 1;
        for (int i = 0; i < cnt; i++) pos[i] = pos0 + p0 + i;
        m3_batch b = {cnt, pos, sq, seqs};
        int want = logits && p0 + cnt == n;
        rc = m3_forward(m, kv, &b, ids + p0, &last, want, want ? logits : NULL, NULL, err);
    }
    free(pos);
    free(sq);
    return rc;
}
