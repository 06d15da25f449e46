/* The MoE router's routing step on the GPU (route_token: a warp per token), shared by router.cu's
 * k_route_topk and the router GEMV that routes in its last CTA (linear.cu, k_gemv_simt_splitk).
 * CPU reference: src/backend/cpu/router.c (m3_cpu_route). */
#ifndef M3_CUDA_ROUTER_CUH
#define M3_CUDA_ROUTER_CUH

#include "common.cuh"

/* One warp per token: sigmoid scores, bias-corrected choice, top-K (lowest index on ties,
 * as the CPU's ascending scan with a strict >), weights s / sum(s) * scale; the K picks are
 * then sorted by expert id so the weighted sum adds experts in ascending order (the CPU's).
 * sm: 2E floats + K ints of this warp's own. Logits are read through L2 (another CTA of the
 * router may have written them, k_gemv_simt_splitk). */
static __device__ __forceinline__ void route_token(const float *logits, const float *bias, int E, int K, float scale,
                                                   int32_t *pick, float *wt, float *sm, int lane) {
    float *s = sm, *ch = sm + E;
    int *pk = (int *)(ch + E);
    for (int e = lane; e < E; e += 32) {
        float sv = 1.0f / (1.0f + expf(-__ldcg(logits + e)));
        s[e] = sv;
        ch[e] = sv + (bias ? bias[e] : 0.0f);
    }
    __syncwarp();
    /* as the indexer's top-k (indexer.cu): each lane's best remaining expert, the warp's by two
     * redux.sync reductions (order-preserving key of the score; lowest id on ties); each lane
     * owns the experts = lane mod 32. The sum runs in pick order, as the CPU's. */
    const uint32_t none = fkey(-INFINITY);
    float sum = 0;
    for (int k = 0; k < K; k++) {
        uint32_t bk = none;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32) {
            const float v = ch[e];
            const uint32_t key = isnan(v) ? none : fkey(v == 0.0f ? 0.0f : v);
            if (key > bk) { bk = key; bi = e; }
        }
        const uint32_t mk = __reduce_max_sync(0xffffffffu, bk);
        const int best = mk == none ? 0 /* every choice -inf (NaN logits): keep a valid id */
                                    : (int)__reduce_min_sync(0xffffffffu, bk == mk ? (uint32_t)bi : 0x7fffffffu);
        if ((best & 31) == lane) ch[best] = -INFINITY;
        if (lane == 0) pk[k] = best;
        sum += s[best];
    }
    __syncwarp();
    for (int k = lane; k < K; k += 32) { /* ascending expert ids, by rank */
        const int v = pk[k];
        int r = 0;
        for (int j = 0; j < K; j++) r += pk[j] < v || (pk[j] == v && j < k);
        pick[r] = v;
        wt[r] = s[v] / sum * scale;
    }
}

/* the MoE routing step of the router's launch (k_gemv_simt_splitk): with ctr set, the CTA that finishes
 * last routes every token (route_token). kparts > 1: K is split over that many CTAs per row
 * group, each writing its sums to part [kparts][8][N], which the last CTA adds in order. */
typedef struct route_args {
    int *ctr;
    const float *bias;
    int E, K;
    float scale;
    int32_t *pick;
    float *wt;
    float *part;
    int kparts;
} route_args;

/* the SIMT GEMV (linear.cu): y[T, N] = x[T, K] W^T, T <= 8, on x, or with rb (precision bf16) on
 * bf16(x), rounded as the kernel stages x (else first, m3_cu_gemm_input); with ra, routes too where
 * it can (returns whether it did); m3_cu_simt_ok: whether W's shape takes its vector kernels */
int m3_cu_gemv_simt(m3_cuda *c, const m3_linear *W, const float *x, int T, float *y, const route_args *ra = NULL, int rb = 0);
int m3_cu_simt_ok(const m3_linear *W);

#endif
