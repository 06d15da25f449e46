/* Gemma RMSNorm on the GPU (out = x rsqrt(mean(x^2) + eps) (1 + w), the sum of squares in
 * double), with the residual add before it (add_rmsnorm) and the MoE combine before that
 * (m3_cu_combine_add_rmsnorm); each writes the f16 split of its output for the GEMV after it.
 * CPU reference: src/backend/cpu/norm.c (m3_cpu_rmsnorm); add_rmsnorm = m3_cpu_add (elem.c) then
 * m3_cpu_rmsnorm. */
#include "common.cuh"

/* block-wide sum of a double (common.cuh) */
static __device__ double block_sum(double v) {
    __shared__ double part[32];
    return block_sum_d(v, part);
}

/* one block per row; sum of squares in double as the CPU does; with xs, also the f16 split
 * of the output (hi [rows*dim], then lo) */
__global__ void k_rmsnorm(const float *x, const float *w, int dim, float eps, float *out, uint16_t *xs, size_t n, int rb) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss);
    float r = (float)(1.0 / sqrt(ss / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = (xr[i] * r) * (1.0f + w[i]);
        o[i] = v;
        if (xs) {
            const size_t k = (size_t)blockIdx.x * dim + i;
            split_store(v, xs + k, xs + n + k, rb);
        }
    }
}

/* h += o, then the RMSNorm of h into out (+ its split), in one pass: as m3_cu_add then m3_cu_rmsnorm */
__global__ void k_add_rmsnorm(float *h, const float *o, const float *w, int dim, float eps, float *out, uint16_t *xs, size_t n,
                              int rb) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    float *hr = h + (size_t)blockIdx.x * dim;
    const float *orow = o + (size_t)blockIdx.x * dim;
    float *dst = out + (size_t)blockIdx.x * dim;
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = hr[i] + orow[i];
        hr[i] = v;
        ss += (double)v * v;
    }
    ss = block_sum(ss);
    float r = (float)(1.0 / sqrt(ss / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = (hr[i] * r) * (1.0f + w[i]);
        dst[i] = v;
        if (xs) {
            const size_t k = (size_t)blockIdx.x * dim + i;
            split_store(v, xs + k, xs + n + k, rb);
        }
    }
}

/* The two kernels above with every load of a row issued before the first use (a single CTA
 * per row is latency bound: a strided loop waits on L2 once per element it reads). For dim
 * = 4 V blockDim (6144 = 4 x 3 x 512). ADD: h += o first, as k_add_rmsnorm. Same double sum. */
template <int V, bool ADD>
__global__ void __launch_bounds__(512) k_rmsnorm_rowregs(float *h, const float *o, const float *w, int dim, float eps, float *out,
                                              uint16_t *xs, size_t n, int rb) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    const size_t row = (size_t)blockIdx.x * dim;
    float4 v[V], wv[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        v[j] = ((const float4 *)(h + row))[i];
        wv[j] = __ldg((const float4 *)w + i);
        if (ADD) {
            const float4 b = ((const float4 *)(o + row))[i];
            v[j].x += b.x; v[j].y += b.y; v[j].z += b.z; v[j].w += b.w;
        }
    }
    double ss = 0;
#pragma unroll
    for (int j = 0; j < V; j++) {
        if (ADD) ((float4 *)(h + row))[threadIdx.x + j * blockDim.x] = v[j];
        ss += (double)v[j].x * v[j].x;
        ss += (double)v[j].y * v[j].y;
        ss += (double)v[j].z * v[j].z;
        ss += (double)v[j].w * v[j].w;
    }
    ss = block_sum(ss);
    const float r = (float)(1.0 / sqrt(ss / dim + eps));
#pragma unroll
    for (int j = 0; j < V; j++) norm_store4(v[j], wv[j], r, out, xs, n, row, threadIdx.x + j * blockDim.x, rb);
}

/* The same over a cluster of CL CTAs per row, a float4 per thread (6144: 8 CTAs of 192 threads):
 * each CTA sums the squares of its slice (in double), the cluster adds the CL partials in rank
 * order through distributed shared memory, and each CTA scales its slice. A row's loads are
 * spread over CL SMs, so the one round trip they cost is short (a single CTA per row: 5.3 us
 * for 6144 values on the H200, most of it in its SM's load and store queues).
 * MODE 0: out = norm(h); 1: h += o first; 2: o = the MoE combine of the row (written to
 * cb.out: cb.wt-weighted sum of the K slot rows cb.ye in slot order, then + cb.sh, as
 * k_moe_combine), then as 1 */
template <int MODE>
__global__ void __launch_bounds__(1024) k_rmsnorm_cluster(float *h, const float *o, const float *w, int dim, float eps, float *out,
                                               uint16_t *xs, size_t n, norm_combine cb, int rb) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    __shared__ double part[32], csum;
    const uint32_t rank = cluster_rank(), ncl = cluster_size();
    const int t = blockIdx.x / ncl;
    const size_t row = (size_t)t * dim;
    const int i = rank * blockDim.x + threadIdx.x; /* this thread's float4 of the row */
    float4 v = ((const float4 *)(h + row))[i];
    const float4 wv = __ldg((const float4 *)w + i);
    if (MODE) {
        float4 b;
        if (MODE == 2) {
            b = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int k = 0; k < cb.K; k++) {
                const float wk = cb.wt[(size_t)t * cb.K + k];
                const float4 y = ((const float4 *)(cb.ye + ((size_t)t * cb.K + k) * dim))[i];
                b.x += wk * y.x; b.y += wk * y.y; b.z += wk * y.z; b.w += wk * y.w;
            }
            if (cb.sh) {
                const float4 y = ((const float4 *)(cb.sh + row))[i];
                b.x += y.x; b.y += y.y; b.z += y.z; b.w += y.w;
            }
            ((float4 *)(cb.out + row))[i] = b;
        } else
            b = ((const float4 *)(o + row))[i];
        v.x += b.x; v.y += b.y; v.z += b.z; v.w += b.w;
        ((float4 *)(h + row))[i] = v;
    }
    double ss = (double)v.x * v.x;
    ss += (double)v.y * v.y;
    ss += (double)v.z * v.z;
    ss += (double)v.w * v.w;
    ss = block_sum_d(ss, part);
    if (threadIdx.x == 0) csum = ss;
    cluster_sync(); /* every CTA's partial is written */
    double tot = 0;
    for (uint32_t r = 0; r < ncl; r++) tot += cluster_ld_f64(&csum, r);
    cluster_sync(); /* ... and read by every CTA before any exits */
    norm_store4(v, wv, (float)(1.0 / sqrt(tot / dim + eps)), out, xs, n, row, i, rb);
}

/* k_rmsnorm_cluster's cluster size for these rows (CL the largest of 8, 4, 2, 1 that splits dim into
 * slices of whole warps of float4), 0 when it does not take them. M3_NORM_CLUSTER=0: never. */
static int norm_c_size(const float *h, const float *o, const float *w, int dim, const float *out, const norm_combine *cb) {
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_NORM_CLUSTER", 1) != 0;
    if (!on || ((uintptr_t)h | (uintptr_t)o | (uintptr_t)w | (uintptr_t)out) & 15) return 0;
    if (cb && ((uintptr_t)cb->ye | (uintptr_t)cb->sh | (uintptr_t)cb->out) & 15) return 0;
    int cl = 8;
    while (cl > 1 && dim % (128 * cl)) cl /= 2;
    return dim % (128 * cl) || dim / (4 * cl) > 1024 ? 0 : cl;
}

/* launches the cluster kernel when it takes these rows (returns 1), else 0. cb: the MoE combine
 * first (mode 2; o unused) */
static int norm_c(m3_cuda *c, int rows, float *h, const float *o, const float *w, int dim, float eps, float *out, uint16_t *xs,
                  size_t n, const norm_combine *cb = NULL) {
    const int cl = norm_c_size(h, o, w, dim, out, cb);
    if (!cl) return 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)rows * cl);
    cfg.blockDim = dim3((unsigned)(dim / (4 * cl)));
    cfg.stream = c->st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)cl;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    norm_combine none;
    memset(&none, 0, sizeof none);
    const int rb = c->gemm_bf16;
    const cudaError_t e = cb  ? cudaLaunchKernelEx(&cfg, k_rmsnorm_cluster<2>, h, o, w, dim, eps, out, xs, n, *cb, rb)
                          : o ? cudaLaunchKernelEx(&cfg, k_rmsnorm_cluster<1>, h, o, w, dim, eps, out, xs, n, none, rb)
                              : cudaLaunchKernelEx(&cfg, k_rmsnorm_cluster<0>, h, o, w, dim, eps, out, xs, n, none, rb);
    return !CK(c, e);
}

/* *xs: the split buffer for the norm's output when a GEMV may read it (dim a multiple of 128, at
 * most m3_cu_xsplit_rows() rows), else NULL; -1 when the claim failed (recorded) */
static int norm_split(m3_cuda *c, const float *out, int rows, int dim, uint16_t **xs) {
    *xs = NULL;
    if (dim % 128 || rows > m3_cu_xsplit_rows()) return 0;
    *xs = m3_cu_xsplit_claim(c, out, (size_t)rows * dim);
    return *xs ? 0 : -1;
}

/* The MoE combine of rows [0, rows) into cb->out, then h += it and out = RMSNorm(h) (w, eps) with
 * its split (up to m3_cu_xsplit_rows() rows), in one launch; returns 0 when the shapes do not fit norm_c (nothing launched) */
int m3_cu_combine_add_rmsnorm(m3_cuda *c, const norm_combine *cb, float *h, const float *w, int rows, int dim, float eps,
                              float *out) {
    if (rows <= 0 || dim % 128 || !norm_c_size(h, NULL, w, dim, out, cb)) return 0;
    m3_cu_prof_begin(c, OP_NORM);
    const size_t n = (size_t)rows * dim;
    m3_cu_xsplit_touch(c, cb->out, sizeof(float) * n);
    m3_cu_xsplit_touch(c, h, sizeof(float) * n);
    m3_cu_xsplit_touch(c, out, sizeof(float) * n);
    uint16_t *xs;
    const int ok = norm_split(c, out, rows, dim, &xs) == 0 && norm_c(c, rows, h, NULL, w, dim, eps, out, xs, n, cb);
    m3_cu_prof_end(c, OP_NORM);
    return ok || c->failed;
}

/* launches the register kernel when dim fits one (returns 1), else 0 */
static int norm_v(m3_cuda *c, int rows, float *h, const float *o, const float *w, int dim, float eps, float *out, uint16_t *xs,
                  size_t n) {
    if (dim % 4 || ((uintptr_t)h | (uintptr_t)o | (uintptr_t)w | (uintptr_t)out) & 15) return 0;
    const int threads = dim >= 2048 ? 512 : 128, per = dim / 4;
    if (per % threads) return 0;
    const int V = per / threads;
#define NV(VV) \
    (o ? k_rmsnorm_rowregs<VV, true><<<rows, threads, 0, c->st>>>(h, o, w, dim, eps, out, xs, n, c->gemm_bf16) \
       : k_rmsnorm_rowregs<VV, false><<<rows, threads, 0, c->st>>>(h, o, w, dim, eps, out, xs, n, c->gemm_bf16))
    switch (V) {
    case 1: NV(1); break;
    case 2: NV(2); break;
    case 3: NV(3); break;
    case 4: NV(4); break;
    default: return 0;
    }
#undef NV
    return 1;
}

void m3_cu_add_rmsnorm(void *ctx, float *h, const float *o, const float *w, int rows, int dim, float eps, float *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_NORM);
    if (rows <= 0) { m3_cu_prof_end(c, OP_NORM); return; }
    const size_t n = (size_t)rows * dim;
    m3_cu_xsplit_touch(c, h, sizeof(float) * n);
    m3_cu_xsplit_touch(c, out, sizeof(float) * n);
    uint16_t *xs;
    if (norm_split(c, out, rows, dim, &xs)) { m3_cu_prof_end(c, OP_NORM); return; }
    if (!norm_c(c, rows, h, o, w, dim, eps, out, xs, n) && !norm_v(c, rows, h, o, w, dim, eps, out, xs, n))
        k_add_rmsnorm<<<rows, dim >= 1024 ? 512 : 128, 0, c->st>>>(h, o, w, dim, eps, out, xs, n, c->gemm_bf16);
    CK_LAUNCH(c, "add + rmsnorm");
    m3_cu_prof_end(c, OP_NORM);
}

void m3_cu_rmsnorm(void *ctx, const float *x, const float *w, int rows, int dim, float eps, float *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_NORM);
    if (rows <= 0) { m3_cu_prof_end(c, OP_NORM); return; }
    const size_t n = (size_t)rows * dim;
    m3_cu_xsplit_touch(c, out, sizeof(float) * n);
    uint16_t *xs; /* a GEMV's input, most likely */
    if (norm_split(c, out, rows, dim, &xs)) { m3_cu_prof_end(c, OP_NORM); return; }
    if (!norm_c(c, rows, (float *)x, NULL, w, dim, eps, out, xs, n) &&
        !norm_v(c, rows, (float *)x, NULL, w, dim, eps, out, xs, n)) /* x is only read (no o) */
        k_rmsnorm<<<rows, dim >= 1024 ? 512 : 128, 0, c->st>>>(x, w, dim, eps, out, xs, n, c->gemm_bf16);
    CK_LAUNCH(c, "rmsnorm");
    m3_cu_prof_end(c, OP_NORM);
}
