/* Elementwise kernels on the GPU: the residual add, SwiGLU-OAI (with the f16 split of its
 * output for the down projection).
 * CPU reference: src/backend/cpu/elem.c (m3_cpu_add, m3_cpu_swiglu_oai). */
#include "common.cuh"

__global__ void k_add(float *y, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] += x[i];
}

void m3_cu_add(void *ctx, float *y, const float *x, size_t n) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_ADD);
    if (!n) { m3_cu_prof_end(c, OP_ADD); return; }
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 4) g = 65535u * 4;
    m3_cu_xsplit_touch(c, y, sizeof(float) * n);
    k_add<<<g, 256, 0, c->st>>>(y, x, n);
    CK_LAUNCH(c, "add");
    m3_cu_prof_end(c, OP_ADD);
}

/* with xs, also the f16 split of out (hi [n], then lo) */
__global__ void k_swiglu(const float *gate, const float *up, size_t n, float alpha, float limit, float *out, uint16_t *xs, int rb) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = swiglu_oai(gate[i], up[i], alpha, limit);
        out[i] = v;
        if (xs) split_store(v, xs + i, xs + n + i, rb);
    }
}

void m3_cu_swiglu(m3_cuda *c, const float *gate, const float *up, size_t n, float alpha, float limit, float *out, int split) {
    if (!n) return;
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 4) g = 65535u * 4;
    m3_cu_xsplit_touch(c, out, sizeof(float) * n);
    uint16_t *xs = split ? m3_cu_xsplit_claim(c, out, n) : NULL; /* the down projection's input */
    if (split && !xs) return;
    k_swiglu<<<g, 256, 0, c->st>>>(gate, up, n, alpha, limit, out, xs, c->gemm_bf16);
    CK_LAUNCH(c, "swiglu");
}
