/* The vision tower's ops on the GPU (ops.h: layer_norm, bias_act, rope_table, attention_full),
 * twins of src/backend/cpu/vision.c: LayerNorm statistics and GELU in double, softmax
 * sums in double; attention one block per (head, query) with the scores in shared memory.
 * CPU reference: src/backend/cpu/vision.c (m3_cpu_vision_ops: cpu_layer_norm, cpu_bias_act,
 * cpu_rope_table, cpu_attention_full). */
#include "common.cuh"

/* one block per row */
__global__ void k_layer_norm(const float *x, const float *w, const float *b, int dim, double eps, float *out) {
    __shared__ double part[32];
    const float *r = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    double s = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) s += r[i];
    const double mean = block_sum_d(s, part) / dim;
    double v = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) { double d = r[i] - mean; v += d * d; }
    const double inv = 1.0 / sqrt(block_sum_d(v, part) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = (float)((r[i] - mean) * inv) * w[i] + b[i];
}

static void cu_layer_norm(void *ctx, const float *x, const float *w, const float *b, int rows, int dim, double eps, float *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (rows <= 0 || c->failed) return;
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)rows * dim);
    k_layer_norm<<<rows, dim >= 1024 ? 512 : 128, 0, c->st>>>(x, w, b, dim, eps, out);
    CK_LAUNCH(c, "layer_norm");
}

__global__ void k_bias_act(float *y, const float *b, size_t rows, int n, int gelu) {
    const size_t total = rows * (size_t)n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float v = y[i];
        if (b) v += b[i % n];
        if (gelu) v = (float)(0.5 * v * (1.0 + erf(v * 0.70710678118654752440)));
        y[i] = v;
    }
}

static void cu_bias_act(void *ctx, float *y, const float *b, int rows, int n, int gelu) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (rows <= 0 || (!b && !gelu) || c->failed) return;
    m3_cu_xsplit_touch(c, y, sizeof(float) * (size_t)rows * n);
    unsigned g = cdiv((size_t)rows * n, 256);
    k_bias_act<<<g < 65535u * 4 ? g : 65535u * 4, 256, 0, c->st>>>(y, b, (size_t)rows, n, gelu);
    CK_LAUNCH(c, "bias_act");
}

/* one thread per (token, head, channel < half) */
__global__ void k_rope_table(float *x, int n, int heads, int hd, int half, const float *cs, const float *sn) {
    const size_t total = (size_t)n * heads * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int j = (int)(i % half);
        const size_t ph = i / half;
        const int p = (int)(ph / heads);
        float *v = x + ph * hd;
        const float c = cs[(size_t)p * half + j], s = sn[(size_t)p * half + j];
        const float a = v[j], bb = v[j + half];
        v[j] = a * c - bb * s;
        v[j + half] = bb * c + a * s;
    }
}

static void cu_rope_table(void *ctx, float *x, int n, int heads, int hd, int half, const float *cs, const float *sn) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (n <= 0 || half <= 0 || c->failed) return;
    m3_cu_xsplit_touch(c, x, sizeof(float) * (size_t)n * heads * hd);
    unsigned g = cdiv((size_t)n * heads * half, 256);
    k_rope_table<<<g < 65535u * 4 ? g : 65535u * 4, 256, 0, c->st>>>(x, n, heads, hd, half, cs, sn);
    CK_LAUNCH(c, "rope_table");
}

/* one block per (query, head): scores over every key in shared memory, softmax (sum in
 * double), then out[d] = sum_k p[k] v[k][d] with the threads over d and key slices */
__global__ void k_attention_full(const float *q, const float *k, const float *v, int n, int heads, int hd, float scale,
                                 float *out) {
    extern __shared__ float sm[]; /* [hd] query, [n] scores, [blockDim] partials */
    __shared__ double dpart[32];
    __shared__ float fpart[32];
    const int qi = blockIdx.x, h = blockIdx.y, Hv = heads * hd;
    float *qs = sm, *sc = sm + hd, *acc = sc + n;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[(size_t)qi * Hv + (size_t)h * hd + d];
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float *kr = k + (size_t)j * Hv + (size_t)h * hd;
        float s = 0;
        for (int d = 0; d < hd; d++) s += qs[d] * kr[d];
        s *= scale;
        sc[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max_f(mx, fpart);
    double sum = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    const float inv = (float)(1.0 / block_sum_d(sum, dpart)); /* its barriers also publish sc */
    if (2 * hd > (int)blockDim.x) { /* wide heads: a thread per channel, every key */
        for (int dd = threadIdx.x; dd < hd; dd += blockDim.x) {
            float o = 0;
            for (int j = 0; j < n; j++) o += sc[j] * inv * v[(size_t)j * Hv + (size_t)h * hd + dd];
            out[(size_t)qi * Hv + (size_t)h * hd + dd] = o;
        }
        return;
    }
    /* threads: d = t % hd over key slices t / hd (>= 2); partial sums added in slice order */
    const int slices = blockDim.x / hd;
    const int d = threadIdx.x % hd, sl = threadIdx.x / hd;
    float o = 0;
    if (sl < slices && threadIdx.x < slices * hd)
        for (int j = sl; j < n; j += slices) o += sc[j] * inv * v[(size_t)j * Hv + (size_t)h * hd + d];
    if (threadIdx.x < slices * hd) acc[threadIdx.x] = o;
    __syncthreads();
    for (int dd = threadIdx.x; dd < hd; dd += blockDim.x) {
        float s = 0;
        for (int t = 0; t < slices; t++) s += acc[t * hd + dd];
        out[(size_t)qi * Hv + (size_t)h * hd + dd] = s;
    }
}

static void cu_attention_full(void *ctx, const float *q, const float *k, const float *v, int n, int heads, int hd, float *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (n <= 0 || c->failed) return;
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)n * heads * hd);
    const int threads = 256;
    const size_t smem = sizeof(float) * ((size_t)hd + (size_t)n + threads);
    if (smem > c->smem_optin) {
        m3_cu_failf(c, "CUDA backend: vision attention over %d patches needs %zu bytes of shared memory", n, smem);
        return;
    }
    if (smem > 48 * 1024) cudaFuncSetAttribute(k_attention_full, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    k_attention_full<<<dim3(n, heads), threads, smem, c->st>>>(q, k, v, n, heads, hd, 1.0f / sqrtf((float)hd), out);
    CK_LAUNCH(c, "attention_full");
}

void m3_cu_vision_ops(m3_ops *ops) {
    ops->layer_norm = cu_layer_norm;
    ops->bias_act = cu_bias_act;
    ops->rope_table = cu_rope_table;
    ops->attention_full = cu_attention_full;
}
