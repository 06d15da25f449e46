/* Per-head Gemma RMSNorm + partial NeoX RoPE on the GPU, for one tensor or several of the same
 * tokens in one launch (head_norm_rope_n).
 * CPU reference: src/backend/cpu/rope.c (m3_cpu_head_norm_rope). */
#include "common.cuh"

/* one warp per (token, head): RMSNorm over dim (double sum like the CPU), then NeoX RoPE on
 * the first rotary_dim channels; inv_freq and the angle in f32 as the reference does */
static __device__ __forceinline__ void head_norm_rope_warp(float *v, int t, int dim, const float *w, float eps, int rot,
                                                           float theta, const int32_t *pos, int lane);

__global__ void k_head_norm_rope(float *x, int T, int heads, int dim, const float *w, float eps, int rot, float theta,
                                 const int32_t *pos) {
    int gw = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (gw >= T * heads) return;
    head_norm_rope_warp(x + (size_t)gw * dim, gw / heads, dim, w, eps, rot, theta, pos, lane);
}

/* up to 4 tensors of the same tokens (q, k, index q, index k) in one launch: warps numbered
 * over the tensors' (token, head) pairs in turn */
typedef struct { m3_rope_job j[4]; int n, first[5]; } rope_jobs;
__global__ void k_head_norm_rope_n(const __grid_constant__ rope_jobs a, float eps, int rot, float theta, const int32_t *pos) {
    int gw = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (gw >= a.first[a.n]) return;
    int i = 0;
    while (gw >= a.first[i + 1]) i++;
    const m3_rope_job *J = &a.j[i];
    const int local = gw - a.first[i];
    head_norm_rope_warp(J->x + (size_t)local * J->dim, local / J->heads, J->dim, J->w, eps, rot, theta, pos, lane);
}

static __device__ __forceinline__ void head_norm_rope_warp(float *v, int t, int dim, const float *w, float eps, int rot,
                                                           float theta, const int32_t *pos, int lane) {
    double ss = 0;
    for (int i = lane; i < dim; i += 32) ss += (double)v[i] * v[i];
#pragma unroll
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float r = (float)(1.0 / sqrt(ss / dim + eps));
    for (int i = lane; i < dim; i += 32) v[i] = (v[i] * r) * (1.0f + w[i]);
    __syncwarp();
    rope_rotate(v, rot, theta, (float)pos[t], lane);
}

/* the step's positions on the device (begin_step), or a copy of other callers'; NULL on failure */
static const int32_t *dev_pos(m3_cuda *c, const int32_t *pos, int T) {
    if (c->step_b && pos == ((const m3_batch *)c->step_b)->pos && T == c->T) return c->d_pos;
    int32_t *d = (int32_t *)m3_cu_scratch(c, SC_TMP, sizeof(int32_t) * (size_t)T);
    if (!d || CK(c, cudaMemcpyAsync(d, pos, sizeof(int32_t) * (size_t)T, cudaMemcpyHostToDevice, c->st))) return NULL;
    CK(c, cudaStreamSynchronize(c->st));
    return d;
}

void m3_cu_head_norm_rope_n(void *ctx, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim, double theta,
                            const int32_t *pos) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (n < 1 || n > 4) {
        for (int i = 0; i < n; i++)
            m3_cu_head_norm_rope(ctx, jobs[i].x, T, jobs[i].heads, jobs[i].dim, jobs[i].w, eps, rotary_dim, theta, pos);
        return;
    }
    m3_cu_prof_begin(c, OP_ROPE);
    const int32_t *dp = dev_pos(c, pos, T);
    if (!dp) { m3_cu_prof_end(c, OP_ROPE); return; }
    rope_jobs a;
    memset(&a, 0, sizeof a);
    a.n = n;
    for (int i = 0; i < n; i++) {
        a.j[i] = jobs[i];
        a.first[i + 1] = a.first[i] + T * jobs[i].heads;
        m3_cu_xsplit_touch(c, jobs[i].x, sizeof(float) * (size_t)T * jobs[i].heads * jobs[i].dim);
    }
    k_head_norm_rope_n<<<cdiv(a.first[n], 4), 128, 0, c->st>>>(a, eps, rotary_dim, (float)theta, dp);
    CK_LAUNCH(c, "head_norm_rope (fused)");
    m3_cu_prof_end(c, OP_ROPE);
}

void m3_cu_head_norm_rope(void *ctx, float *x, int T, int heads, int dim, const float *w, float eps, int rotary_dim,
                          double theta, const int32_t *pos) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_ROPE);
    const int32_t *dp = dev_pos(c, pos, T);
    if (!dp) { m3_cu_prof_end(c, OP_ROPE); return; }
    int warps = T * heads;
    m3_cu_xsplit_touch(c, x, sizeof(float) * (size_t)warps * dim);
    k_head_norm_rope<<<cdiv(warps, 4), 128, 0, c->st>>>(x, T, heads, dim, w, eps, rotary_dim, (float)theta, dp);
    CK_LAUNCH(c, "head_norm_rope");
    m3_cu_prof_end(c, OP_ROPE);
}
