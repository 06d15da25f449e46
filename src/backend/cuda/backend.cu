/* CUDA backend: context, memory, per-step metadata, graphs, profiling, the op table (weights:
 * weights.cu). CPU reference: src/backend/cpu/ops.c (m3_cpu_ops_init). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.cuh"
#include "../../base/clock.h"
extern "C" {
#include "../runs.h"
}

extern "C" int m3_cuda_built(void) { return 1; }

extern "C" int m3_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
    return n;
}

int m3_cu_fail(m3_cuda *c, cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    if (!c->failed) {
        const char *f = strrchr(file, '/');
        snprintf(c->errmsg, sizeof c->errmsg, "CUDA: %s: %s (%s:%d)", what, cudaGetErrorString(e), f ? f + 1 : file, line);
        c->failed = 1;
    }
    return 1;
}

void m3_cu_failf(m3_cuda *c, const char *fmt, ...) {
    if (c->failed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    c->failed = 1;
}

void *m3_cu_alloc(m3_cuda *c, size_t bytes) {
    void *p = NULL;
    size_t n = bytes ? (bytes + 255) & ~(size_t)255 : 256;
    if (c->wa_mode == 1) { /* sizing pass: a placeholder address, never dereferenced */
        c->wa_used += n;
        return (void *)(uintptr_t)256;
    }
    if (c->wa_mode == 2) {
        if (c->wa_used + n > c->wa_size) {
            m3_cu_failf(c, "CUDA: weight arena overflow (%zu + %zu of %zu bytes)", c->wa_used, n, c->wa_size);
            return NULL;
        }
        p = c->wa_base + c->wa_used;
        c->wa_used += n;
        return p;
    }
    if (cudaMalloc(&p, n) != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        m3_cu_failf(c, "CUDA: out of device memory allocating %.1f MiB (%.1f MiB free of %.1f MiB)", n / 1048576.0,
                    fr / 1048576.0, tot / 1048576.0);
        return NULL;
    }
    c->allocated += n;
    if (c->allocated > c->peak) c->peak = c->allocated;
    return p;
}

void *m3_cu_scratch(m3_cuda *c, int slot, size_t bytes) {
    if (c->side) slot += SC_COUNT; /* the side stream's own slots */
    if (bytes <= c->sc_bytes[slot]) return c->sc[slot];
    if (c->capturing) { /* no allocation while recording: the recording is dropped, the step re-issued */
        c->scratch_grew = 1;
        m3_cu_failf(c, "CUDA backend: scratch growth while recording a graph");
        return NULL;
    }
    m3_cu_graphs_clear(c); /* recorded graphs hold the old buffers */
    if (c->sc[slot]) {
        cudaStreamSynchronize(c->st); /* the old buffer may still be in use by queued work */
        cudaFree(c->sc[slot]);
        c->allocated -= c->sc_bytes[slot];
        c->sc[slot] = NULL;
        c->sc_bytes[slot] = 0;
    }
    size_t n = bytes + bytes / 4 + 4096; /* headroom so slowly growing steps do not reallocate each time */
    n = (n + 255) & ~(size_t)255;
    void *p = m3_cu_alloc(c, n);
    if (!p) return NULL;
    c->sc[slot] = p;
    c->sc_bytes[slot] = n;
    return p;
}

/* ------------------------------------------------------------------ memory ops */

static void *cu_alloc(void *ctx, size_t bytes) {
    m3_cuda *c = (m3_cuda *)ctx;
    void *p = m3_cu_alloc(c, bytes);
    if (p && CK(c, cudaMemsetAsync(p, 0, bytes, c->st))) { cudaFree(p); return NULL; }
    if (p) CK(c, cudaStreamSynchronize(c->st));
    return p;
}
static void cu_release(void *ctx, void *p) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (!p) return;
    cudaStreamSynchronize(c->st);
    cudaFree(p);
}
static void cu_upload(void *ctx, void *dst, const void *src, size_t n) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_xsplit_touch(c, dst, n);
    CK(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->st));
    CK(c, cudaStreamSynchronize(c->st)); /* src may be pageable and reused by the caller */
}
static void cu_download(void *ctx, void *dst, const void *src, size_t n) {
    m3_cuda *c = (m3_cuda *)ctx;
    CK(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->st));
    CK(c, cudaStreamSynchronize(c->st));
}

static void *cu_host_alloc(void *ctx, size_t n) {
    (void)ctx;
    void *p = NULL;
    if (cudaMallocHost(&p, n) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the caller falls back to pageable memory */
        return NULL;
    }
    return p;
}
static void cu_host_free(void *ctx, void *p) {
    (void)ctx;
    if (p) cudaFreeHost(p);
}

static void cu_copy(void *ctx, void *dst, const void *src, size_t n) { /* device to device, in stream order */
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_xsplit_touch(c, dst, n);
    m3_cu_prof_begin(c, OP_COPY);
    CK(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->st));
    m3_cu_prof_end(c, OP_COPY);
}

/* one 2D copy (the DSpark capture: a layer's rows into the draft's feature rows), in stream order */
static void cu_copy_rows(const m3_ops *o, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t rows) {
    m3_cuda *c = (m3_cuda *)o->ctx;
    if (!rows || !width) return;
    m3_cu_xsplit_touch(c, dst, dpitch * (rows - 1) + width);
    m3_cu_prof_begin(c, OP_COPY);
    CK(c, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, c->st));
    m3_cu_prof_end(c, OP_COPY);
}

/* n copies in one launch (a CTA row per copy); more than COPY_N_MAX go in several */
#define COPY_N_MAX 64
struct copy_tab {
    char *dst[COPY_N_MAX];
    const char *src[COPY_N_MAX];
    size_t bytes[COPY_N_MAX];
};

__global__ void k_copy_n(const __grid_constant__ copy_tab t) {
    char *d = t.dst[blockIdx.y];
    const char *s = t.src[blockIdx.y];
    const size_t n = t.bytes[blockIdx.y], step = (size_t)gridDim.x * blockDim.x, i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (!(((uintptr_t)d | (uintptr_t)s | n) & 15)) {
        for (size_t i = i0; i < n / 16; i += step) ((uint4 *)d)[i] = ((const uint4 *)s)[i];
    } else {
        for (size_t i = i0; i < n; i += step) d[i] = s[i];
    }
}

static void cu_copy_n(const m3_ops *o, int n, void *const *dst, const void *const *src, const size_t *bytes) {
    m3_cuda *c = (m3_cuda *)o->ctx;
    m3_cu_prof_begin(c, OP_COPY);
    for (int i0 = 0; i0 < n && !c->failed; i0 += COPY_N_MAX) {
        copy_tab t;
        int m = 0;
        size_t most = 0;
        for (int i = i0; i < n && i < i0 + COPY_N_MAX; i++) {
            if (!bytes[i]) continue;
            m3_cu_xsplit_touch(c, dst[i], bytes[i]);
            t.dst[m] = (char *)dst[i];
            t.src[m] = (const char *)src[i];
            t.bytes[m] = bytes[i];
            if (bytes[i] > most) most = bytes[i];
            m++;
        }
        if (!m) continue;
        size_t g = (most + 16 * 256 - 1) / (16 * 256);
        if (g > 256) g = 256;
        k_copy_n<<<dim3((unsigned)g, (unsigned)m), 256, 0, c->st>>>(t);
        CK_LAUNCH(c, "copy_n");
    }
    m3_cu_prof_end(c, OP_COPY);
}

static void cu_mem_info(void *ctx, size_t *free_b, size_t *total_b) {
    m3_cuda *c = (m3_cuda *)ctx;
    size_t f = 0, t = 0;
    int cur = -1;
    cudaGetDevice(&cur);
    if (cur != c->dev) cudaSetDevice(c->dev); /* the driver reports the calling thread's device */
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) cudaGetLastError();
    if (cur >= 0 && cur != c->dev) cudaSetDevice(cur);
    *free_b = f;
    *total_b = t;
}

/* A failed step: the error of the stream's work so far. A sticky one (illegal address, a
 * kernel fault) is returned again by every call: the device is lost. Otherwise (a failed launch
 * configuration, a failed allocation, a check of our own) the error state is cleared, the
 * recordings dropped (one may be half made), and the next step runs afresh. */
static int cu_recover(void *ctx, m3_err *err) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (c->side) m3_cu_side_end(c); /* (never left open: moe_impl closes and joins it) */
    c->side_pending = 0;
    cudaStreamSynchronize(c->st_side);
    cudaError_t e = cudaStreamSynchronize(c->st);
    cudaGetLastError(); /* a non-sticky error is cleared by reading it */
    if (e != cudaSuccess) e = cudaStreamSynchronize(c->st);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        cudaError_t again = cudaGetLastError();
        if (again == cudaSuccess) again = cudaDeviceSynchronize();
        if (again != cudaSuccess)
            return m3_errf(err, "CUDA device %d is unusable: %s (%s)", c->dev, cudaGetErrorName(again),
                           cudaGetErrorString(again));
    }
    if (c->capturing) { /* a recording cut short by the failure */
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(c->st, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        c->capturing = 0;
    }
    m3_cu_graphs_clear(c);
    m3_cu_xsplit_reset(c);
    c->failed = 0;
    c->errmsg[0] = 0;
    return 0;
}

static int cu_check(void *ctx, m3_err *err) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (!c->failed) CK(c, cudaGetLastError());
    if (c->failed) return m3_errf(err, "%s", c->errmsg);
    return 0;
}

int m3_cu_env_int(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : dflt;
}

int m3_cu_pdl_on(void) {
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_CUDA_PDL", 0) != 0; /* measured no faster on the H200 (docs/PERF.md) */
    return on;
}

/* M3_CUDA_FUSE=0: every op as its own kernels (no fused add + norm, norm + RoPE, router + routing,
 * indexer scores + top-k), for comparisons */
int m3_cu_fuse_on(void) {
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_CUDA_FUSE", 1) != 0;
    return on;
}


/* ------------------------------------------------------------------ per-step metadata */

/* pinned staging of at least n int32 (the previous step's copies are complete: see begin_step) */
static int32_t *stage(m3_cuda *c, size_t n) {
    if (n <= c->h_meta_cap) return c->h_meta;
    if (c->h_meta) cudaFreeHost(c->h_meta);
    c->h_meta = NULL;
    c->h_meta_cap = 0;
    size_t cap = n + n / 2 + 1024;
    if (CK(c, cudaMallocHost((void **)&c->h_meta, cap * sizeof(int32_t)))) return NULL;
    c->h_meta_cap = cap;
    return c->h_meta;
}

/* Shapes the kernels' launch parameters depend on are rounded up to buckets (page-table
 * stride to 64 pages, the longest position to 8192 tokens) so that a recorded decode graph
 * stays valid while sequences grow; kernels read the true positions from device memory. */
static int cu_begin_step(void *ctx, const m3_kv *kv, const m3_batch *b, const int32_t *ids, m3_err *err) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (c->failed) return m3_errf(err, "%s", c->errmsg);
    m3_cu_xsplit_reset(c);
    int T = b->T, ns = 0, stride = 1, maxp = 0;
    for (int t = 0; t < T; t++) {
        if (b->seq[t] + 1 > ns) ns = b->seq[t] + 1;
        if (b->pos[t] > maxp) maxp = b->pos[t];
    }
    for (int s = 0; s < ns; s++)
        if (b->seqs[s] && b->seqs[s]->n_pages > stride) stride = b->seqs[s]->n_pages;
    stride = (stride + 63) & ~63;
    size_t n = 5 * (size_t)T + (size_t)ns * stride;
    /* the pinned buffer is reused: the previous step's uploads must have landed */
    if (CK(c, cudaStreamSynchronize(c->st))) return m3_errf(err, "%s", c->errmsg);
    int32_t *h = stage(c, n);
    int32_t *d = (int32_t *)m3_cu_scratch(c, SC_META, n * sizeof(int32_t));
    if (!h || !d) return m3_errf(err, "%s", c->errmsg);
    memcpy(h, b->pos, sizeof(int32_t) * (size_t)T);
    memcpy(h + T, b->seq, sizeof(int32_t) * (size_t)T);
    memcpy(h + 2 * T, ids, sizeof(int32_t) * (size_t)T);
    int mr = 0;
    const int nr = m3_batch_runs(b, RUN_MAX, h + 3 * T, h + 4 * T, &mr); /* the indexer's runs */
    int32_t *pt = h + 5 * T;
    for (int s = 0; s < ns; s++) {
        const m3_kv_seq *q = b->seqs[s];
        int np = q ? q->n_pages : 0;
        for (int i = 0; i < stride; i++) pt[(size_t)s * stride + i] = i < np ? q->pages[i] : -1;
    }
    if (CK(c, cudaMemcpyAsync(d, h, n * sizeof(int32_t), cudaMemcpyHostToDevice, c->st))) return m3_errf(err, "%s", c->errmsg);
    c->step_b = b;
    c->T = T;
    c->dsa_tab_on = 0; /* a draft pass sets its table after this */
    c->n_seqs = ns;
    c->ptab_stride = stride;
    c->max_pos = ((maxp + 1 + 8191) & ~8191) - 1;
    c->d_pos = d;
    c->d_seq = d + T;
    c->d_ids = d + 2 * T;
    c->d_lead = d + 3 * T;
    c->d_rlen = d + 4 * T;
    c->d_ptab = d + 5 * T;
    c->n_runs = nr;
    c->max_run = mr;
    c->step_kv = kv;
    return 0;
}

/* ------------------------------------------------------------------ the side stream */

static void side_swap(m3_cuda *c) { /* the side's counters and x-split cache for the main's, or back */
    int *t = c->ctr;
    c->ctr = c->ctr_other;
    c->ctr_other = t;
    for (int i = 0; i < 2; i++) {
        const auto x = c->xs[i];
        c->xs[i] = c->xs_other[i];
        c->xs_other[i] = x;
    }
    const int n = c->xs_next;
    c->xs_next = c->xs_next_other;
    c->xs_next_other = n;
}

int m3_cu_side_begin(m3_cuda *c) {
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_CUDA_SIDE", 1) != 0;
    if (!on || c->side || c->side_pending || c->prof || c->failed) return 0;
    if (CK(c, cudaEventRecord(c->ev_fork, c->st_main)) || CK(c, cudaStreamWaitEvent(c->st_side, c->ev_fork, 0))) return 0;
    c->side = 1;
    c->st = c->st_side;
    side_swap(c);
    /* the main stream's writes since the last side section touched only its own cache: the side's
     * splits may be stale (the same buffers hold each layer's values) */
    for (int i = 0; i < 2; i++) c->xs[i].src = NULL;
    return 1;
}

void m3_cu_side_end(m3_cuda *c) {
    if (!c->side) return;
    side_swap(c);
    c->side = 0;
    c->st = c->st_main;
    /* recorded even after a failure: a recording's side branch must join the main stream */
    if (cudaEventRecord(c->ev_join, c->st_side) != cudaSuccess) m3_cu_failf(c, "CUDA: the side stream's join failed");
    c->side_pending = 1;
}

void m3_cu_side_join(m3_cuda *c) {
    if (!c->side_pending) return;
    c->side_pending = 0;
    if (cudaStreamWaitEvent(c->st_main, c->ev_join, 0) != cudaSuccess) m3_cu_failf(c, "CUDA: the side stream's join failed");
}

/* ------------------------------------------------------------------ graphs */

void m3_cu_graphs_clear(m3_cuda *c) {
    for (int i = 0; i < c->n_graphs; i++) cudaGraphExecDestroy(c->graphs[i].exec);
    c->n_graphs = 0;
}

static uint64_t full_key(m3_cuda *c, const m3_kv *kv, uint64_t key) {
    uint64_t k = key;
    /* the pool's device pages (a new pool may reuse the address of an old m3_kv struct); none in a
     * draft pass (its cache is its own ring: the caller's key holds what it bakes in) */
    for (int l = 0; kv && l < kv->n_layers; l++) k = (k ^ (uint64_t)(uintptr_t)kv->base[l]) * 1099511628211ull;
    if (kv) k = (k ^ (uint64_t)kv->page_bytes[0] ^ ((uint64_t)kv->dt << 40) ^ ((uint64_t)kv->idt << 48)) * 1099511628211ull;
    k = (k ^ (uint64_t)c->ptab_stride) * 1099511628211ull;
    k = (k ^ (uint64_t)c->max_pos) * 1099511628211ull;
    k = (k ^ ((uint64_t)c->n_runs << 8 | (uint64_t)c->max_run)) * 1099511628211ull; /* the indexer's grid and top-k */
    k = (k ^ (uint64_t)(uintptr_t)c->d_pos) * 1099511628211ull;
    return k;
}

static int cu_graph_begin(void *ctx, const m3_kv *kv, uint64_t key) {
    m3_cuda *c = (m3_cuda *)ctx;
    c->capturing = 0;
    m3_cu_xsplit_reset(c);
    if (!c->graphs_on || c->failed || c->prof || c->count_experts || c->T > GRAPH_T_MAX) return 0;
    uint64_t k = full_key(c, kv, key);
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == k) {
            c->graphs[i].used = ++c->graph_clock;
            if (CK(c, cudaGraphLaunch(c->graphs[i].exec, c->st))) return 0;
            c->graph_replays++;
            return 1;
        }
    if (m3_graph_refused(&c->graph_fails, k)) return 0; /* its recordings failed: it runs directly */
    /* the first step of a shape runs directly (scratch buffers reach their size), the second is recorded */
    for (int i = 0; i < 64; i++)
        if (c->seen[i] == k) {
            if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
                cudaGetLastError();
                c->graphs_on = 0;
                return 0;
            }
            c->capturing = 1;
            c->capture_key = k;
            c->scratch_grew = 0;
            return 0;
        }
    c->seen[c->n_seen++ % 64] = k;
    return 0;
}

static int cu_graph_end(void *ctx) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_xsplit_reset(c); /* a failed recording re-issues the step from the start */
    if (!c->capturing) return 0;
    c->capturing = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->st, &g);
    cudaGraphExec_t ex = NULL;
    if (e == cudaSuccess && (c->failed || c->scratch_grew || m3_fault_hit(M3_FAULT_GRAPH))) e = cudaErrorStreamCaptureInvalidated;
    if (e == cudaSuccess) e = cudaGraphInstantiate(&ex, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        c->failed = 0; /* a failed recording is not a failed step: the ops run again directly (and grow
                        * what the recording could not), the key is recorded again at its next step,
                        * refused after M3_GRAPH_TRIES failures; recording stops only after several
                        * keys are refused (graph_refuse.h) */
        if (m3_graph_fail(&c->graph_fails, c->capture_key)) c->graphs_on = 0;
        return -1;
    }
    int slot = c->n_graphs;
    if (slot == (int)(sizeof c->graphs / sizeof c->graphs[0])) { /* evict the least recently used */
        slot = 0;
        for (int i = 1; i < c->n_graphs; i++)
            if (c->graphs[i].used < c->graphs[slot].used) slot = i;
        cudaGraphExecDestroy(c->graphs[slot].exec);
    } else {
        c->n_graphs++;
    }
    c->graphs[slot].key = c->capture_key;
    c->graphs[slot].exec = ex;
    c->graphs[slot].used = ++c->graph_clock;
    if (CK(c, cudaGraphLaunch(ex, c->st))) return -1;
    return 0;
}

/* ------------------------------------------------------------------ table */

/* the fused ops of the table (ops.h) take the table; their kernels take the context */
static void fused_add_rmsnorm(const m3_ops *o, float *h, const float *x, const float *w, int rows, int dim, float eps,
                              float *out) {
    m3_cu_add_rmsnorm(o->ctx, h, x, w, rows, dim, eps, out);
}
static void fused_head_norm_rope_n(const m3_ops *o, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim,
                                   double theta, const int32_t *pos) {
    m3_cu_head_norm_rope_n(o->ctx, n, jobs, T, eps, rotary_dim, theta, pos);
}
static void fused_head_norm_rope_store(const m3_ops *o, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim,
                                       double theta, m3_kv *kv, int layer, const m3_batch *b, const float *v) {
    m3_cu_head_norm_rope_store(o->ctx, n, jobs, T, eps, rotary_dim, theta, kv, layer, b, v);
}
static void fused_moe_add_rmsnorm(const m3_ops *o, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T,
                                  float *out, float *h, const float *w, float eps, float *normed) {
    m3_cu_moe_add_rmsnorm(o->ctx, L, p, x, T, out, h, w, eps, normed);
}
static void fused_linear_n(const m3_ops *o, int n, const m3_linear *const *W, const float *x, int T, float *const *y) {
    m3_cu_linear_n(o->ctx, n, W, x, T, y);
}

/* every resource of c that exists (an init that failed part way made only some), then c */
static void cu_ctx_free(m3_cuda *c) {
    if (c->st) cudaStreamSynchronize(c->st);
    if (c->st_side) cudaStreamSynchronize(c->st_side);
    m3_cu_graphs_clear(c);
    for (int i = 0; i < 2 * SC_COUNT; i++)
        if (c->sc[i]) cudaFree(c->sc[i]);
    if (c->ctr) cudaFree(c->ctr);
    if (c->ctr_other) cudaFree(c->ctr_other);
    if (c->ev_join) cudaEventDestroy(c->ev_join);
    if (c->ev_fork) cudaEventDestroy(c->ev_fork);
    if (c->st_side) cudaStreamDestroy(c->st_side);
    if (c->h_meta) cudaFreeHost(c->h_meta);
    free(c->h_pick);
    free(c->h_pick_seen);
    free(c->dsa_tab);
    if (c->blas) cublasDestroy(c->blas);
    if (c->blas_ws) cudaFree(c->blas_ws);
    if (c->st) cudaStreamDestroy(c->st);
    cudaGetLastError(); /* (a failed init's error is the one reported) */
    free(c);
}

extern "C" int m3_cuda_ops_init(m3_ops *ops, int dev, m3_err *err) {
    memset(ops, 0, sizeof *ops);
    int n = m3_cuda_device_count();
    if (n <= 0) return m3_errf(err, "no CUDA device (driver missing or no GPU)");
    if (dev < 0 || dev >= n) return m3_errf(err, "CUDA device %d does not exist (%d found)", dev, n);
    m3_cuda *c = (m3_cuda *)calloc(1, sizeof *c);
    if (!c) return m3_errf(err, "out of memory");
    c->dev = dev;
    cudaDeviceProp p;
    if (cudaSetDevice(dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        free(c);
        cudaGetLastError();
        return m3_errf(err, "cannot open CUDA device %d", dev);
    }
    if (p.major < 9) {
        free(c);
        return m3_errf(err, "CUDA device %d (%s) has compute capability %d.%d; this build needs Hopper (9.0)", dev, p.name,
                       p.major, p.minor);
    }
    c->sm_count = p.multiProcessorCount;
    c->smem_optin = p.sharedMemPerBlockOptin;
    c->smem_per_sm = p.sharedMemPerMultiprocessor;
    snprintf(c->name, sizeof c->name, "%s, %d SMs, %.1f GiB", p.name, p.multiProcessorCount,
             p.totalGlobalMem / 1073741824.0);
    if (cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking) != cudaSuccess) {
        c->st = NULL;
        cu_ctx_free(c);
        return m3_errf(err, "cannot create a CUDA stream");
    }
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        cu_ctx_free(c);
        return m3_errf(err, "cannot initialize cuBLAS");
    }
    c->ctr_n = 1 << 20; /* tensor-core GEMV arrival counters: zeroed once, each launch leaves them zero */
    if (cudaMalloc((void **)&c->ctr, sizeof(int) * (size_t)(c->ctr_n + CTR_AUX)) != cudaSuccess ||
        cudaMemset(c->ctr, 0, sizeof(int) * (size_t)(c->ctr_n + CTR_AUX)) != cudaSuccess) {
        cu_ctx_free(c);
        return m3_errf(err, "CUDA device %d: out of memory", dev);
    }
    c->st_main = c->st;
    /* the side stream (m3_cu_side_begin) and its GEMV counters */
    if (cudaStreamCreateWithFlags(&c->st_side, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->ev_fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->ev_join, cudaEventDisableTiming) != cudaSuccess ||
        cudaMalloc((void **)&c->ctr_other, sizeof(int) * (size_t)(c->ctr_n + CTR_AUX)) != cudaSuccess ||
        cudaMemset(c->ctr_other, 0, sizeof(int) * (size_t)(c->ctr_n + CTR_AUX)) != cudaSuccess) {
        cu_ctx_free(c);
        return m3_errf(err, "CUDA device %d: cannot create the side stream (out of memory?)", dev);
    }
    cublasSetStream(c->blas, c->st);
    cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH); /* f32 GEMMs stay f32: no TF32 */
    /* cuBLAS's workspace, ours: a GEMM recorded in a decode graph must not allocate */
    c->blas_ws_bytes = (size_t)32 << 20;
    if (cudaMalloc(&c->blas_ws, c->blas_ws_bytes) != cudaSuccess ||
        cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes) != CUBLAS_STATUS_SUCCESS) {
        cu_ctx_free(c);
        return m3_errf(err, "CUDA device %d: out of memory (cuBLAS workspace)", dev);
    }
    ops->name = "cuda";
    ops->ctx = c;
    ops->device_memory = 1;
    ops->alloc = cu_alloc;
    ops->release = cu_release;
    ops->upload = cu_upload;
    ops->download = cu_download;
    ops->copy = cu_copy;
    ops->copy_rows = cu_copy_rows;
    ops->copy_n = cu_copy_n;
    ops->weights_upload = m3_cu_weights_upload;
    ops->weights_release = m3_cu_weights_release;
    ops->begin_step = cu_begin_step;
    ops->graph_begin = cu_graph_begin;
    ops->graph_end = cu_graph_end;
    c->graphs_on = getenv("M3_CUDA_GRAPHS") ? atoi(getenv("M3_CUDA_GRAPHS")) != 0 : 1;
    ops->check = cu_check;
    ops->mem_info = cu_mem_info;
    ops->recover = cu_recover;
    ops->embed = m3_cu_embed;
    ops->embed_dev = m3_cu_embed_dev;
    ops->rmsnorm = m3_cu_rmsnorm;
    ops->add = m3_cu_add;
    if (m3_cu_fuse_on()) { /* M3_CUDA_FUSE=0: the plain compositions (../compose.c), the ops one by one */
        ops->add_rmsnorm = fused_add_rmsnorm;
        ops->head_norm_rope_n = fused_head_norm_rope_n;
        ops->head_norm_rope_store = fused_head_norm_rope_store;
        ops->moe_add_rmsnorm = fused_moe_add_rmsnorm;
    }
    ops->linear = m3_cu_linear;
    ops->linear_n = fused_linear_n;
    ops->head_norm_rope = m3_cu_head_norm_rope;
    ops->kv_store = m3_cu_kv_store;
    ops->index_select = m3_cu_index_select;
    ops->attention = m3_cu_attention;
    ops->dspark_attention = m3_cu_dspark_attention;
    ops->dspark_attention_n = m3_cu_dspark_attention_n;
    ops->dspark_attention_table = m3_cu_dspark_attention_table;
    ops->argmax_rows = m3_cu_argmax_rows;
    ops->argmax_rows_fin = m3_cu_argmax_rows_fin;
    ops->logprob_rows = m3_cu_logprob_rows;
    ops->host_alloc = cu_host_alloc;
    ops->host_free = cu_host_free;
    ops->draw_rows = m3_cu_draw_rows;
    ops->draw_rows_dev = m3_cu_draw_rows_dev;
    ops->verify_rows = m3_cu_verify_rows;
    ops->mlp = m3_cu_mlp;
    ops->moe = m3_cu_moe;
    m3_cu_vision_ops(ops);
    if (m3_ops_complete(ops, err)) {
        m3_cuda_ops_free(ops);
        return -1;
    }
    return 0;
}

extern "C" void m3_cuda_ops_free(m3_ops *ops) {
    m3_cuda *c = (m3_cuda *)ops->ctx;
    if (c) cu_ctx_free(c);
    memset(ops, 0, sizeof *ops);
}

extern "C" const char *m3_cuda_device_name(const m3_ops *ops) { return ((m3_cuda *)ops->ctx)->name; }

/* for NCCL collectives in the ops' order (tensor parallelism, src/parallel/comm_nccl.cu) */
extern "C" void *m3_cuda_stream(const m3_ops *ops) { return (void *)((m3_cuda *)ops->ctx)->st; }

extern "C" void m3_cuda_mem_info(const m3_ops *ops, size_t *free_b, size_t *total_b, size_t *peak_b) {
    m3_cuda *c = (m3_cuda *)ops->ctx;
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    if (free_b) *free_b = f;
    if (total_b) *total_b = t;
    if (peak_b) *peak_b = c->peak;
}

extern "C" double m3_cuda_sync_time(m3_ops *ops) {
    m3_cuda *c = (m3_cuda *)ops->ctx;
    CK(c, cudaStreamSynchronize(c->st));
    return m3_now();
}

extern "C" long m3_cuda_graph_replays(const m3_ops *ops) { return ((const m3_cuda *)ops->ctx)->graph_replays; }
extern "C" int m3_cuda_graphs_refused(const m3_ops *ops, int *on) {
    const m3_cuda *c = (const m3_cuda *)ops->ctx;
    if (on) *on = c->graphs_on;
    return c->graph_fails.refused;
}

extern "C" double m3_cuda_copy_bandwidth(m3_ops *ops, size_t bytes) {
    m3_cuda *c = (m3_cuda *)ops->ctx;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot); /* on a nearly full GPU (the model at TP2) copy what fits */
    while (bytes > ((size_t)64 << 20) && 2 * bytes + ((size_t)512 << 20) > fr) bytes /= 2;
    void *a = m3_cu_alloc(c, bytes), *b = m3_cu_alloc(c, bytes);
    double bw = 0;
    if (a && b) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->st); /* warm up */
        float best = 1e30f;
        for (int i = 0; i < 10; i++) {
            cudaEventRecord(e0, c->st);
            cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->st);
            cudaEventRecord(e1, c->st);
            cudaEventSynchronize(e1);
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (ms < best) best = ms;
        }
        bw = 2.0 * (double)bytes / (best * 1e-3);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    cudaFree(a);
    cudaFree(b);
    if (a) c->allocated -= (bytes + 255) & ~(size_t)255;
    if (b) c->allocated -= (bytes + 255) & ~(size_t)255;
    return bw;
}

__global__ void k_fill_random_bf16(uint16_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = f32_bf16(((float)(h & 0xffff) / 65536.0f - 0.5f));
    }
}

extern "C" double m3_cuda_gemm_rate(m3_ops *ops, int n) {
    m3_cuda *c = (m3_cuda *)ops->ctx;
    const int was_failed = c->failed;
    const size_t e = (size_t)n * n;
    uint16_t *a = (uint16_t *)m3_cu_alloc(c, 2 * e), *b = (uint16_t *)m3_cu_alloc(c, 2 * e);
    uint16_t *d = (uint16_t *)m3_cu_alloc(c, 2 * e);
    double rate = 0;
    if (a && b && d) {
        k_fill_random_bf16<<<1024, 256, 0, c->st>>>(a, e, 1u);
        k_fill_random_bf16<<<1024, 256, 0, c->st>>>(b, e, 2u);
        const float one = 1.0f, zero = 0.0f;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        float best = 1e30f;
        for (int i = 0; i < 11; i++) { /* the first one warms up */
            cudaEventRecord(e0, c->st);
            cublasStatus_t st = cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                                              &zero, d, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            cudaEventRecord(e1, c->st);
            cudaEventSynchronize(e1);
            if (st != CUBLAS_STATUS_SUCCESS) { best = 1e30f; break; }
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (i && ms < best) best = ms;
        }
        if (best < 1e29f) rate = 2.0 * (double)n * n * n / (best * 1e-3);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    const size_t each = (2 * e + 255) & ~(size_t)255;
    if (a) c->allocated -= each;
    if (b) c->allocated -= each;
    if (d) c->allocated -= each;
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
    if (!was_failed) c->failed = 0; /* an allocation failure here only means no ceiling figure */
    cudaGetLastError();
    return rate;
}

extern "C" void m3_cuda_count_experts(m3_ops *ops, int on) { ((m3_cuda *)ops->ctx)->count_experts = on; }
extern "C" void m3_cuda_set_precision(m3_ops *ops, int bf16) { ((m3_cuda *)ops->ctx)->gemm_bf16 = bf16 != 0; }
extern "C" long m3_cuda_experts_used(m3_ops *ops, int reset) {
    m3_cuda *c = (m3_cuda *)ops->ctx;
    long n = c->experts_used;
    if (reset) c->experts_used = 0;
    return n;
}

/* ------------------------------------------------------------------ profiling */

/* adds the recorded event pairs to the per-op totals */
static void prof_fold(m3_cuda *c) {
    cudaStreamSynchronize(c->st);
    for (int i = 0; i < c->prof_n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, c->prof_ev[i].a, c->prof_ev[i].b);
        c->prof_ms[c->prof_ev[i].op] += ms;
        c->prof_calls[c->prof_ev[i].op]++;
    }
    c->prof_n = 0;
}

void m3_cu_prof_begin(m3_cuda *c, int op) {
    if (!c->prof || c->prof_depth++) return;
    if (c->prof_n == c->prof_cap) {
        int nc = c->prof_cap ? 2 * c->prof_cap : 4096;
        void *p = realloc(c->prof_ev, sizeof *c->prof_ev * (size_t)nc);
        if (!p) return;
        c->prof_ev = (decltype(c->prof_ev))p;
        for (int i = c->prof_cap; i < nc; i++) {
            cudaEventCreate(&c->prof_ev[i].a);
            cudaEventCreate(&c->prof_ev[i].b);
        }
        c->prof_cap = nc;
    }
    c->prof_ev[c->prof_n].op = op;
    cudaEventRecord(c->prof_ev[c->prof_n].a, c->st);
}
void m3_cu_prof_end(m3_cuda *c, int op) {
    (void)op;
    if (!c->prof || --c->prof_depth) return;
    if (c->prof_n < c->prof_cap) cudaEventRecord(c->prof_ev[c->prof_n++].b, c->st);
    if (c->prof_n == c->prof_cap) prof_fold(c); /* before growing further */
}
extern "C" void m3_cuda_profile(m3_ops *ops, int on) {
    m3_cuda *c = (m3_cuda *)ops->ctx;
    c->prof = on;
    c->prof_depth = 0;
    c->prof_n = 0;
    memset(c->prof_ms, 0, sizeof c->prof_ms);
    memset(c->prof_calls, 0, sizeof c->prof_calls);
}
extern "C" void m3_cuda_profile_report(m3_ops *ops, int steps, void *file) {
    m3_cuda *c = (m3_cuda *)ops->ctx;
    FILE *f = (FILE *)file;
    prof_fold(c);
    static const char *names[OP_COUNT] = {"embed", "rmsnorm", "add", "linear", "norm+rope", "kv_store", "indexer", "attention", "mlp", "moe",
                                             "dspark attention", "copy", "argmax / draws", "prompt logprobs"};
    double tot = 0;
    for (int i = 0; i < OP_COUNT; i++) tot += c->prof_ms[i];
    fprintf(f, "  per step (GPU time, %d steps):", steps);
    for (int i = 0; i < OP_COUNT; i++)
        if (c->prof_calls[i]) fprintf(f, " %s %.3f ms (%.0f%%)", names[i], c->prof_ms[i] / steps, 100 * c->prof_ms[i] / (tot > 0 ? tot : 1));
    fprintf(f, "\n");
    c->prof = 0;
}
