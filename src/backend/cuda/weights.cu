/* Weights on the GPU: the upload of a checkpoint's (or a benchmark's) matrices in their stored
 * formats into one device arena (sized by a counting pass), MXFP8 / NVFP4 matrices stored
 * tiled (common.cuh, wt_voff; k_tile_weights), and their release.
 * CPU reference: none (the CPU reads the mapped checkpoint in place); the tiled layout is
 * checked by tests/gpu/test_tile_layout.cu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

static void *up(m3_cuda *c, const void *src, size_t n) {
    if (!src || !n) return NULL;
    void *p = m3_cu_alloc(c, n);
    if (!p || c->wa_mode == 1) return p;
    if (CK(c, cudaMemcpy(p, src, n, cudaMemcpyHostToDevice))) return NULL; /* the arena goes as a whole */
    return p;
}

/* rows of width bytes, stride bytes apart on the host, packed densely on the GPU. A strided
 * view is a column slice of a larger matrix (a tensor-parallel rank's share, src/parallel/shard.h):
 * only its columns travel. A matrix stored whole (stride == width) is one plain copy. */
static void *up_rows(m3_cuda *c, const uint8_t *src, size_t stride, size_t width, int rows) {
    if (stride == width) return up(c, src, width * (size_t)rows);
    if (!src || !width || rows <= 0) return NULL;
    void *p = m3_cu_alloc(c, width * (size_t)rows);
    if (!p || c->wa_mode == 1) return p;
    if (CK(c, cudaMemcpy2D(p, width, src, stride, width, (size_t)rows, cudaMemcpyHostToDevice))) return NULL;
    return p;
}

/* M3_CUDA_TILE=0 keeps device weights row-major (for comparisons) */
int m3_cu_tileable(const m3_linear *W) {
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_CUDA_TILE", 1) != 0;
    return on && (W->fmt == M3_WF_MXFP8 || W->fmt == M3_WF_NVFP4) && W->N % 16 == 0 && W->K % 128 == 0 && W->scale;
}

/* dense [rows][width] bytes at src -> the tiled layout at dst (values: 16-byte pieces, NVFP4
 * codes also bit-permuted; scales: bytes) */
__global__ void k_tile_weights(const uint8_t *src, uint8_t *dst, int fmt, size_t width, int rows, int scales) {
    const size_t piece = scales ? 1 : 16, n = (size_t)rows * width / piece;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t b = i * piece;
        const int r = (int)(b / width);
        const size_t col = b % width;
        if (scales) dst[wt_soff(fmt, width, r, col)] = src[b];
        else {
            uint4 v = *(const uint4 *)(src + b);
            if (fmt == M3_WF_NVFP4) { /* codes bit-permuted within each word (common.cuh) */
                v.x = wt_nv_perm(v.x);
                v.y = wt_nv_perm(v.y);
                v.z = wt_nv_perm(v.z);
                v.w = wt_nv_perm(v.w);
            }
            *(uint4 *)(dst + wt_voff(fmt, width, r, col)) = v;
        }
    }
}

/* up_rows into the tiled layout: through a dense staging copy in scratch (outside the arena) */
static void *up_rows_tiled(m3_cuda *c, const uint8_t *src, size_t stride, size_t width, int rows, int fmt, int scales) {
    void *p = m3_cu_alloc(c, width * (size_t)rows);
    if (!p || c->wa_mode == 1) return p;
    const int mode = c->wa_mode;
    c->wa_mode = 0; /* staging is scratch, not weights */
    uint8_t *tmp = (uint8_t *)m3_cu_scratch(c, SC_DEQ, width * (size_t)rows);
    c->wa_mode = mode;
    if (!tmp) return NULL;
    /* on the backend's stream, so the tiling kernel runs after the copy has landed (a plain
     * cudaMemcpy2D from pageable memory may return before its DMA is done, and the backend's
     * stream does not wait for the legacy stream) */
    if (CK(c, cudaMemcpy2DAsync(tmp, width, src, stride, width, (size_t)rows, cudaMemcpyHostToDevice, c->st))) return NULL;
    const size_t n = width * (size_t)rows / (scales ? 1 : 16);
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 8) g = 65535u * 8;
    k_tile_weights<<<g, 256, 0, c->st>>>(tmp, (uint8_t *)p, fmt, width, rows, scales);
    if (CK_LAUNCH(c, "tile weights") || CK(c, cudaStreamSynchronize(c->st))) return NULL;
    return p;
}

/* Whether an MXFP8 matrix's E8M0 scales are all codes 1..254: the tiled GEMV builds 2^(e-127)
 * with a shift (common.cuh, e8_of), so a matrix holding a 0 (2^-127) or 255 (NaN) stays
 * row-major, where every code is decoded in full. *maxc: the largest code (0 for no scales). */
static int mx_scales_plain(const m3_linear *h, int *maxc) {
    *maxc = 0;
    if (h->fmt != M3_WF_MXFP8 || !h->scale) return 1;
    const size_t sr = m3_linear_dense_scale_row(h);
    const int rows = sr == h->scale_row ? 1 : h->N; /* one run, or row by row (a column slice) */
    const size_t len = sr == h->scale_row ? sr * (size_t)h->N : sr;
    int plain = 1, mx = 0;
    for (int r = 0; r < rows; r++) {
        const uint8_t *p = h->scale + (size_t)r * h->scale_row;
        for (size_t j = 0; j < len; j++) {
            plain &= p[j] != 0x00 && p[j] != 0xff;
            mx = p[j] > mx ? p[j] : mx;
        }
    }
    *maxc = mx;
    return plain;
}

/* tile: store MXFP8 / NVFP4 matrices in the tiled layout (every linear but the embedding,
 * whose rows k_embed reads) */
static int up_linear_t(m3_cuda *c, const m3_linear *h, m3_linear *d, int tile) {
    *d = *h;
    d->w = NULL;
    d->scale = NULL;
    d->tiled = 0;
    d->scale_max = 0;
    if (!h->w) return 0; /* no weights here (an expert of another rank under expert parallelism) */
    size_t rb = m3_linear_dense_row_bytes(h), sr = m3_linear_dense_scale_row(h);
    d->row_bytes = rb;
    d->scale_row = sr;
    /* (asked of h: d's pointers are cleared above; not in the sizing pass: tiled or row-major, a
     * matrix takes the same bytes) */
    int maxc = 0;
    if (tile && m3_cu_tileable(h) && c->wa_mode != 1 && !mx_scales_plain(h, &maxc)) {
        static int told;
        if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "CUDA backend: an MXFP8 matrix (%d x %d) has E8M0 scales of 0 or 255: kept row-major "
                            "(the slower GEMV)\n", h->N, h->K);
        tile = 0;
    }
    if (tile && m3_cu_tileable(h)) {
        d->w = (const uint8_t *)up_rows_tiled(c, h->w, h->row_bytes, rb, h->N, h->fmt, 0);
        d->scale = d->w ? (const uint8_t *)up_rows_tiled(c, h->scale, h->scale_row, sr, h->N, h->fmt, 1) : NULL;
        d->tiled = 1;
        d->scale_max = h->fmt == M3_WF_MXFP8 ? maxc : 0;
        return d->w && d->scale ? 0 : -1;
    }
    d->w = (const uint8_t *)up_rows(c, h->w, h->row_bytes, rb, h->N);
    if (!d->w) return -1;
    if (h->scale) {
        d->scale = (const uint8_t *)up_rows(c, h->scale, h->scale_row, sr, h->N);
        if (!d->scale) return -1;
    }
    return 0;
}
static int up_linear(m3_cuda *c, const m3_linear *h, m3_linear *d) { return up_linear_t(c, h, d, 1); }

/* one linear outside any arena (benchmarks): released with ops->release on w and scale */
extern "C" int m3_cuda_upload_linear(m3_ops *ops, const m3_linear *h, m3_linear *d, m3_err *err) {
    m3_cuda *c = (m3_cuda *)ops->ctx;
    if (up_linear(c, h, d) || CK(c, cudaDeviceSynchronize()) || c->failed) {
        m3_errf(err, "uploading a linear: %s", c->failed ? c->errmsg : "out of memory");
        c->failed = 0;
        return -1;
    }
    return 0;
}
/* an MLP's three matrices tiled together or not at all: the MoE kernels take the experts either
 * all on the tensor cores (tiled or not) or all row-major on the SIMT path; a tiled gate / up with
 * a row-major down (a K the tiles do not divide) would leave them only the host-grouped path */
static int up_mlp(m3_cuda *c, const m3_mlp_w *h, m3_mlp_w *d) {
    const int tile = m3_cu_tileable(&h->gate) && m3_cu_tileable(&h->up) && m3_cu_tileable(&h->down);
    return up_linear_t(c, &h->gate, &d->gate, tile) || up_linear_t(c, &h->up, &d->up, tile) ||
           up_linear_t(c, &h->down, &d->down, tile);
}
static float *up_vec(m3_cuda *c, const float *v, int n, int *bad) {
    if (!v) return NULL;
    float *p = (float *)up(c, v, sizeof(float) * (size_t)n);
    if (!p) *bad = 1;
    return p;
}

/* the device expert table of a MoE layer: experts[] (m3_mlp_w with device pointers) copied to the GPU */
static int make_expert_table(m3_cuda *c, m3_layer_w *L, int E) {
    if (!L->moe || !L->experts) return 0;
    L->backend = up(c, L->experts, sizeof(m3_mlp_w) * (size_t)E);
    return L->backend ? 0 : -1;
}

/* the host side of device weights (layer and expert tables) */
static void free_host_tables(m3_weights *w) {
    for (int l = 0; w->layers && l < w->n_layers; l++) free(w->layers[l].experts);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

void m3_cu_weights_release(void *ctx, m3_weights *w) {
    (void)ctx;
    if (w->dev_arena) { /* every tensor in one allocation */
        cudaDeviceSynchronize();
        cudaFree(w->dev_arena);
        free_host_tables(w);
        return;
    }
    if (!w->layers) { memset(w, 0, sizeof *w); return; }
    cudaDeviceSynchronize();
#define FREE_LIN(l) do { cudaFree((void *)(l).w); cudaFree((void *)(l).scale); } while (0)
#define FREE_MLP(m) do { FREE_LIN((m).gate); FREE_LIN((m).up); FREE_LIN((m).down); } while (0)
    for (int l = 0; l < w->n_layers; l++) {
        m3_layer_w *L = &w->layers[l];
        cudaFree(L->in_norm); cudaFree(L->post_norm); cudaFree(L->q_norm); cudaFree(L->k_norm);
        cudaFree(L->iq_norm); cudaFree(L->ik_norm); cudaFree(L->route_bias); cudaFree(L->backend);
        FREE_LIN(L->q); FREE_LIN(L->k); FREE_LIN(L->v); FREE_LIN(L->o); FREE_LIN(L->iq); FREE_LIN(L->ik);
        FREE_MLP(L->mlp); FREE_LIN(L->router); FREE_MLP(L->shared);
        if (L->experts) {
            for (int e = 0; e < w->n_experts; e++) FREE_MLP(L->experts[e]);
            free(L->experts);
        }
    }
    FREE_LIN(w->embed);
    if (w->lm_head.w != w->embed.w) FREE_LIN(w->lm_head);
    cudaFree(w->final_norm);
    for (int i = 0; i < M3_WEIGHTS_AUX; i++) { FREE_LIN(w->aux[i]); cudaFree(w->aux_vec[i]); }
    free(w->layers);
    memset(w, 0, sizeof *w);
#undef FREE_LIN
#undef FREE_MLP
}

/* one pass of the upload: allocations through m3_cu_alloc (counted, or carved from the arena) */
static int upload_pass(m3_cuda *c, const m3_weights *h, m3_weights *d, m3_err *err) {
    memset(d, 0, sizeof *d);
    d->layers = (m3_layer_w *)calloc((size_t)h->n_layers, sizeof *d->layers);
    if (!d->layers) return m3_errf(err, "out of memory");
    d->n_layers = h->n_layers;
    d->hidden = h->hidden;
    d->head_dim = h->head_dim;
    d->index_dim = h->index_dim;
    d->n_experts = h->n_experts;
    memcpy(d->prefix, h->prefix, sizeof d->prefix);
    d->n_tensors_used = h->n_tensors_used;
    memcpy(d->bytes_by_fmt, h->bytes_by_fmt, sizeof d->bytes_by_fmt);
    memcpy(d->count_by_fmt, h->count_by_fmt, sizeof d->count_by_fmt);
    int bad = 0;
    for (int l = 0; l < h->n_layers && !bad; l++) {
        const m3_layer_w *H = &h->layers[l];
        m3_layer_w *L = &d->layers[l];
        L->sparse = H->sparse;
        L->moe = H->moe;
        L->has_shared = H->has_shared;
        L->in_norm = up_vec(c, H->in_norm, h->hidden, &bad);
        L->post_norm = up_vec(c, H->post_norm, h->hidden, &bad);
        bad |= up_linear(c, &H->q, &L->q) || up_linear(c, &H->k, &L->k) || up_linear(c, &H->v, &L->v) ||
               up_linear(c, &H->o, &L->o);
        L->q_norm = up_vec(c, H->q_norm, h->head_dim, &bad);
        L->k_norm = up_vec(c, H->k_norm, h->head_dim, &bad);
        if (H->sparse) {
            bad |= up_linear(c, &H->iq, &L->iq) || up_linear(c, &H->ik, &L->ik);
            L->iq_norm = up_vec(c, H->iq_norm, h->index_dim, &bad);
            L->ik_norm = up_vec(c, H->ik_norm, h->index_dim, &bad);
        }
        if (!H->moe) bad |= up_mlp(c, &H->mlp, &L->mlp);
        else {
            int E = h->n_experts;
            bad |= up_linear(c, &H->router, &L->router);
            L->route_bias = up_vec(c, H->route_bias, E, &bad);
            L->experts = (m3_mlp_w *)calloc((size_t)E, sizeof *L->experts);
            if (!L->experts) bad = 1;
            for (int e = 0; e < E && !bad; e++) bad |= up_mlp(c, &H->experts[e], &L->experts[e]);
            if (!bad) bad |= make_expert_table(c, L, E);
            if (H->has_shared && !bad) bad |= up_mlp(c, &H->shared, &L->shared);
        }
    }
    if (!bad) bad |= up_linear_t(c, &h->embed, &d->embed, 0); /* rows read by k_embed */
    if (!bad) {
        if (h->lm_head.w == h->embed.w && h->lm_head.N == h->embed.N) d->lm_head = d->embed; /* tied (a TP rank's rows of it are its own) */
        else bad |= up_linear(c, &h->lm_head, &d->lm_head);
    }
    if (!bad) d->final_norm = up_vec(c, h->final_norm, h->hidden, &bad);
    for (int i = 0; i < M3_WEIGHTS_AUX && !bad; i++) { /* a companion model's (the DSpark draft's) */
        bad |= up_linear(c, &h->aux[i], &d->aux[i]);
        d->aux_vec[i] = up_vec(c, h->aux_vec[i], h->aux_vec_n[i], &bad);
        d->aux_vec_n[i] = h->aux_vec_n[i];
    }
    if (bad || c->failed) {
        if (!c->failed) m3_cu_failf(c, "out of memory");
        m3_errf(err, "uploading the weights to the GPU: %s", c->errmsg);
        c->failed = 0; /* the backend itself stays usable */
        return -1;
    }
    return 0;
}

/* Weights go into one device allocation sized by a first pass that only counts: cudaMalloc
 * rounds every allocation up to 2 MiB, which tensor by tensor (an NVFP4 expert's 1.2 MB scale
 * table, its 9.4 MB matrices) wasted 14% of the 250 GB checkpoint's device memory. */
int m3_cu_arena_build(m3_cuda *c, m3_weights *d, m3_err *err, int (*pass)(m3_cuda *, const void *, m3_weights *, m3_err *),
                      const void *arg) {
    c->wa_mode = 1;
    c->wa_used = 0;
    int rc = pass(c, arg, d, err);
    size_t need = c->wa_used;
    c->wa_mode = 0;
    free_host_tables(d);
    if (rc) return -1;
    uint8_t *base = (uint8_t *)m3_cu_alloc(c, need);
    if (!base) {
        m3_errf(err, "the weights need %.2f GiB on the GPU: %s", need / 1073741824.0, c->errmsg);
        c->failed = 0;
        return -1;
    }
    c->wa_mode = 2;
    c->wa_base = base;
    c->wa_size = need;
    c->wa_used = 0;
    rc = pass(c, arg, d, err);
    c->wa_mode = 0;
    c->wa_base = NULL;
    /* every copy landed (the plain cudaMemcpy uploads run on the legacy stream, which the
     * backend's non-blocking stream does not wait for) */
    if (!rc && CK(c, cudaDeviceSynchronize())) rc = m3_errf(err, "uploading the weights to the GPU: %s", c->errmsg);
    if (rc) {
        cudaDeviceSynchronize();
        cudaFree(base);
        free_host_tables(d);
        c->failed = 0;
        return -1;
    }
    d->dev_arena = base;
    return 0;
}

static int upload_pass_v(m3_cuda *c, const void *h, m3_weights *d, m3_err *err) {
    return upload_pass(c, (const m3_weights *)h, d, err);
}
int m3_cu_weights_upload(void *ctx, const m3_weights *h, m3_weights *d, m3_err *err) {
    return m3_cu_arena_build((m3_cuda *)ctx, d, err, upload_pass_v, h);
}
