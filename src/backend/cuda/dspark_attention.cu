/* DSpark draft attention on the GPU (ops.h: dspark_attention; issue 27's first piece): slot i
 * of n (position pos + i), query head h (KV head h / (nh / nkv)): softmax(q k^T / sqrt(D)) v
 * over the context positions [max(lo, pos + i - window + 1), len) - ring slot p % cap of kr /
 * vr [cap][nkv * D] - and over every block key kb / vb [n][nkv * D] (non-causal in the block).
 * One CTA per (slot, head): the query and the scores in shared memory, a warp per key for the
 * dot products, the softmax sum in double, then a thread per channel over every key.
 * CPU reference: src/backend/cpu/attention.c (m3_cpu_dspark_attention, dsa_items). */
#include "common.cuh"

#define DSA_THREADS 256

__global__ void __launch_bounds__(DSA_THREADS) k_dspark_attention(const float *q, const float *kb, const float *vb, int n, int nh,
                                                                  int nkv, int D, const float *kr, const float *vr, int cap,
                                                                  int lo0, int len, int pos, int window, float scale,
                                                                  float *out) {
    extern __shared__ float sm[]; /* [D] query, [context + n] scores */
    __shared__ float fpart[32];
    __shared__ double dpart[32];
    const int i = blockIdx.x / nh, h = blockIdx.x % nh, g = h / (nh / nkv);
    const size_t kw = (size_t)nkv * D;
    float *qs = sm, *sc = sm + D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[((size_t)i * nh + h) * D + d];
    long lo = (long)pos + i - window + 1;
    if (lo < lo0) lo = lo0;
    const int nc = lo < len ? (int)(len - lo) : 0, ns = nc + n;
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    for (int j = warp; j < ns; j += nw) {
        const float *k = j < nc ? kr + (size_t)((lo + j) % cap) * kw + (size_t)g * D : kb + (size_t)(j - nc) * kw + (size_t)g * D;
        float s = 0;
        for (int d = lane; d < D; d += 32) s += qs[d] * k[d];
        s = warp_sum(s);
        if (lane == 0) sc[j] = s * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < ns; j += blockDim.x) mx = fmaxf(mx, sc[j]);
    mx = block_max_f(mx, fpart);
    double sum = 0;
    for (int j = threadIdx.x; j < ns; j += blockDim.x) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    const float inv = (float)(1.0 / block_sum_d(sum, dpart)); /* its barriers also publish sc */
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0;
        for (int j = 0; j < nc; j++) o += sc[j] * inv * vr[(size_t)((lo + j) % cap) * kw + (size_t)g * D + d];
        for (int b = 0; b < n; b++) o += sc[nc + b] * inv * vb[(size_t)b * kw + (size_t)g * D + d];
        out[((size_t)i * nh + h) * D + d] = o;
    }
}

void m3_cu_dspark_attention(void *ctx, const float *q, const float *kb, const float *vb, int n, int nh, int nkv, int D,
                            const float *kr, const float *vr, int cap, int lo, int len, int pos, int window, float *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (n <= 0 || c->failed) return;
    if (nkv <= 0 || nh % nkv) { m3_cu_failf(c, "dspark attention: %d query heads over %d KV heads", nh, nkv); return; }
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)n * nh * D);
    const int ctxk = len > lo ? len - lo : 0;
    const size_t smem = sizeof(float) * ((size_t)D + (size_t)ctxk + (size_t)n); /* every slot reads <= ctxk context keys */
    if (smem > c->smem_optin) {
        m3_cu_failf(c, "dspark attention: a window of %d keys needs %zu bytes of shared memory", window, smem);
        return;
    }
    if (smem > 48 * 1024) cudaFuncSetAttribute(k_dspark_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    k_dspark_attention<<<n * nh, DSA_THREADS, smem, c->st>>>(q, kb, vb, n, nh, nkv, D, kr, vr, cap, lo, len, pos, window,
                                                            1.0f / sqrtf((float)D), out);
    CK_LAUNCH(c, "dspark attention");
}
