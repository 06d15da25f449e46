/* The MoE router on the GPU: the router's logits (a GEMV that routes in its last CTA where it
 * can), then each token's top-k experts by sigmoid + bias (lowest id on ties) and their
 * weights, sorted by expert id (k_route_topk).
 * CPU reference: src/backend/cpu/router.c (m3_cpu_route). */
#include "router.cuh"

/* a warp (a block) per token */
__global__ void k_route_topk(const float *logits, const float *bias, int E, int K, float scale, int32_t *pick, float *wt) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    extern __shared__ float sm[];
    const int t = blockIdx.x;
    route_token(logits + (size_t)t * E, bias, E, K, scale, pick + (size_t)t * K, wt + (size_t)t * K, sm, threadIdx.x);
}

/* The routing of the MoE layer L for x [T, H]: the router's logits, then each token's K experts
 * (ascending ids) and weights, in the routing scratch (SC_ROUTE): *pick_out, *wt_out [T][K].
 * 0, or -1 on failure (recorded in c). */
int m3_cu_route(m3_cuda *c, const m3_layer_w *L, const float *x, int T, int E, int K, float routed_scale, int32_t **pick_out,
                float **wt_out) {
    enum { ROUTE_KPARTS = 4 }; /* the router GEMV's K split over CTAs (k_gemv_simt_splitk) */
    char *rb = (char *)m3_cu_scratch(c, SC_ROUTE, sizeof(float) * (size_t)T * E + 2 * sizeof(float) * (size_t)T * K +
                                                      sizeof(float) * ROUTE_KPARTS * 8 * (size_t)E + 64);
    if (!rb) return -1;
    float *logits = (float *)rb;
    int32_t *pick = (int32_t *)(logits + (size_t)T * E);
    float *wt = (float *)(pick + (size_t)T * K);
    /* the router's GEMV routes in its last CTA where it can (one launch less), else k_route_topk */
    static int kparts = -1;
    if (kparts < 0) kparts = m3_cu_env_int("M3_ROUTE_KPARTS", ROUTE_KPARTS);
    if (kparts < 1 || kparts > ROUTE_KPARTS) kparts = ROUTE_KPARTS;
    route_args ra = {ctr_aux(c, CTR_AUX_ROUTE), L->route_bias, E, K, routed_scale, pick, wt, wt + (size_t)T * K, kparts};
    int routed = 0;
    m3_cu_xsplit_touch(c, logits, sizeof(float) * (size_t)T * E);
    /* 1, 2, 4 or 8 tokens (a verify pass): k_gemv_simt_splitk, which reads x where it lies when it does not fit
     * shared memory (its rows must all exist: T a power of two); 8 tokens: 5.7 us of cuBLAS + 4 us of
     * reduce / add + 5.7 us of k_route_topk before */
    if ((T == 1 || T == 2 || T == 4 || T == 8) && !m3_cu_mma_ok(&L->router) && m3_cu_fuse_on() && m3_cu_simt_ok(&L->router)) {
        routed = m3_cu_gemv_simt(c, &L->router, x, T, logits, &ra, c->gemm_bf16); /* precision bf16: on bf16(x) */
    } else m3_cu_linear(c, &L->router, x, T, logits);
    if (c->failed) return -1; /* (no logits to route: its rounding or launch failed) */
    if (!routed) {
        k_route_topk<<<T, 32, sizeof(float) * 2 * (size_t)E + sizeof(int) * (size_t)K, c->st>>>(logits, L->route_bias, E, K,
                                                                                           routed_scale, pick, wt);
        if (CK_LAUNCH(c, "route")) return -1;
    }
    *pick_out = pick;
    *wt_out = wt;
    return 0;
}
