/* Row argmax on the GPU (ops.h argmax_rows): the DSpark draft's greedy draws. A block per row:
 * the largest value (fmaxf ignores NaN), then the first index holding it; a NaN at index 0 or a
 * row of NaN gives 0, as m3_row_argmax's rule does.
 * CPU reference: src/backend/cpu/argmax.c (base/rows.c m3_row_argmax). */
#include "common.cuh"

#define AM_THREADS 512

__global__ void __launch_bounds__(AM_THREADS) k_argmax_rows(const float *x, int n, size_t ld, int32_t *out) {
    __shared__ float fpart[32];
    __shared__ int ipart[32];
    const float *r = x + (size_t)blockIdx.x * ld;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, r[i]);
    m = block_max_f(m, fpart);
    int b = n;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (r[i] == m) { b = i; break; } /* this thread's first: its indices ascend */
#pragma unroll
    for (int o = 16; o; o >>= 1) b = min(b, __shfl_xor_sync(0xffffffffu, b, o));
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    if (l == 0) ipart[w] = b;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)blockDim.x / 32; k++) b = min(b, ipart[k]);
        b = min(b, ipart[0]);
        out[blockIdx.x] = r[0] != r[0] || b >= n ? 0 : b;
    }
}

void m3_cu_argmax_rows(void *ctx, const float *x, int rows, int n, size_t ld, int32_t *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (rows <= 0 || n <= 0 || c->failed) return;
    m3_cu_xsplit_touch(c, out, sizeof(int32_t) * (size_t)rows);
    m3_cu_prof_begin(c, OP_ARGMAX);
    k_argmax_rows<<<rows, AM_THREADS, 0, c->st>>>(x, n, ld, out);
    CK_LAUNCH(c, "argmax rows");
    m3_cu_prof_end(c, OP_ARGMAX);
}
