/* Random weights of any config, built on the GPU in the real checkpoint's formats (for
 * `m3 bench --random-weights`: real shapes without a 250 GB download). Values are drawn
 * from a counter hash so a seed gives the same weights on every run; magnitudes keep
 * activations finite (row sums of squares ~ 1).
 * CPU reference: none (benchmarks only; the formats written are read by formats.cuh). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

static __device__ __forceinline__ uint32_t hash32(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}
/* uniform in (-1, 1) */
static __device__ __forceinline__ float urand(uint64_t seed, size_t i) {
    return (float)((int32_t)hash32(seed * 0x9e3779b97f4a7c15ull + i)) * (1.0f / 2147483648.0f);
}

/* MXFP8 values: E4M3 of u * 2^4 with scale 2^-4 / sqrt(K)-ish via E8M0 */
__global__ void k_rand_fp8(uint8_t *w, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] = f32_e4m3(urand(seed, i) * 16.0f);
}
__global__ void k_fill_u8(uint8_t *w, size_t n, uint8_t v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) w[i] = v;
}
/* NVFP4 codes: uniform random nibbles (every code is valid) */
__global__ void k_rand_u8(uint8_t *w, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] = (uint8_t)hash32(seed * 0x9e3779b97f4a7c15ull + i);
}
__global__ void k_rand_bf16(uint16_t *w, size_t n, uint64_t seed, float amp) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] = f32_bf16(urand(seed, i) * amp);
}

static unsigned grid_for(size_t n) {
    size_t g = (n + 255) / 256;
    return (unsigned)(g > 65535 * 16 ? 65535 * 16 : g);
}

/* a [N, K] linear in fmt with random values; 0 or -1 (sticky error set) */
static int rand_linear(m3_cuda *c, m3_linear *L, m3_wfmt fmt, int N, int K, uint64_t seed) {
    memset(L, 0, sizeof *L);
    L->fmt = fmt;
    L->N = N;
    L->K = K;
    L->gmul = 1.0f;
    float amp = 1.0f / sqrtf((float)K) * 1.7f; /* uniform(-a, a): variance a^2 / 3 ~ 1 / K */
    if (fmt == M3_WF_BF16) {
        L->row_bytes = 2 * (size_t)K;
        uint16_t *w = (uint16_t *)m3_cu_alloc(c, L->row_bytes * N);
        if (!w) return -1;
        if (c->wa_mode != 1)
            k_rand_bf16<<<grid_for((size_t)N * K), 256, 0, c->st>>>(w, (size_t)N * K, seed, amp);
        L->w = (const uint8_t *)w;
    } else if (fmt == M3_WF_MXFP8) {
        L->row_bytes = (size_t)K;
        L->scale_row = (size_t)K / 32;
        uint8_t *w = (uint8_t *)m3_cu_alloc(c, L->row_bytes * N), *s = (uint8_t *)m3_cu_alloc(c, L->scale_row * N);
        if (!w || !s) return -1;
        /* values are u * 16: scale 2^-4 * amp rounded to a power of two */
        int e = 127 - 4 + (int)floorf(log2f(amp) + 0.5f);
        if (c->wa_mode != 1) {
            k_rand_fp8<<<grid_for((size_t)N * K), 256, 0, c->st>>>(w, (size_t)N * K, seed);
            k_fill_u8<<<grid_for(L->scale_row * N), 256, 0, c->st>>>(s, L->scale_row * N, (uint8_t)e);
        }
        L->w = w;
        L->scale = s;
        L->scale_max = m3_cu_tileable(L) ? e : 0; /* (tiled below) */
    } else { /* NVFP4: codes in [-6, 6] with mean square ~ 8.6; scale E4M3 * gmul */
        L->row_bytes = (size_t)K / 2;
        L->scale_row = (size_t)K / 16;
        uint8_t *w = (uint8_t *)m3_cu_alloc(c, L->row_bytes * N), *s = (uint8_t *)m3_cu_alloc(c, L->scale_row * N);
        if (!w || !s) return -1;
        if (c->wa_mode != 1) {
            k_rand_u8<<<grid_for(L->row_bytes * N), 256, 0, c->st>>>(w, L->row_bytes * N, seed);
            k_fill_u8<<<grid_for(L->scale_row * N), 256, 0, c->st>>>(s, L->scale_row * N, 0x38); /* E4M3 1.0 */
        }
        L->gmul = amp / 1.7f / 2.9f;
        L->w = w;
        L->scale = s;
    }
    /* uniform scales and random values: any order of the bytes is the tiled layout of some matrix */
    L->tiled = m3_cu_tileable(L);
    return c->wa_mode != 1 && CK_LAUNCH(c, "random weights") ? -1 : 0;
}

static float *zeros(m3_cuda *c, int n, int *bad) {
    float *p = (float *)m3_cu_alloc(c, sizeof(float) * (size_t)n);
    if (!p || (c->wa_mode != 1 && CK(c, cudaMemsetAsync(p, 0, sizeof(float) * (size_t)n, c->st)))) { *bad = 1; return NULL; }
    return p;
}

/* the three matrices tiled together or not at all, as a checkpoint's (weights.cu, up_mlp) */
static int rand_mlp_like(m3_cuda *c, m3_mlp_w *m, const m3_mlp_w *S, uint64_t seed) {
    if (rand_linear(c, &m->gate, S->gate.fmt, S->gate.N, S->gate.K, seed) ||
        rand_linear(c, &m->up, S->up.fmt, S->up.N, S->up.K, seed + 1) ||
        rand_linear(c, &m->down, S->down.fmt, S->down.N, S->down.K, seed + 2))
        return -1;
    m->gate.tiled = m->up.tiled = m->down.tiled = m->gate.tiled && m->up.tiled && m->down.tiled;
    if (!m->gate.tiled) m->gate.scale_max = m->up.scale_max = m->down.scale_max = 0;
    return 0;
}

typedef struct { const m3_config *cf; const m3_weights *shape; uint64_t seed; } rand_args;

/* one pass of random weights (m3_cu_arena_build runs it to count, then to build) */
static int random_pass(m3_cuda *c, const void *arg, m3_weights *w, m3_err *err) {
    const rand_args *a = (const rand_args *)arg;
    const m3_config *cf = a->cf;
    const m3_weights *shape = a->shape;
    const uint64_t seed = a->seed;
    memset(w, 0, sizeof *w);
    const int n_layers = shape->n_layers, H = shape->hidden, D = shape->head_dim, E = shape->n_experts;
    w->layers = (m3_layer_w *)calloc((size_t)n_layers, sizeof *w->layers);
    if (!w->layers) return m3_errf(err, "out of memory");
    w->n_layers = n_layers;
    w->hidden = H;
    w->head_dim = D;
    w->index_dim = shape->index_dim;
    w->n_experts = E;
    int bad = 0;
    uint64_t s = seed * 1000003ull;
#define RL(dst, src) rand_linear(c, &(dst), (src).fmt, (src).N, (src).K, s++)
    for (int l = 0; l < n_layers && !bad; l++) {
        const m3_layer_w *S = &shape->layers[l];
        m3_layer_w *L = &w->layers[l];
        L->sparse = S->sparse;
        L->moe = S->moe;
        L->in_norm = zeros(c, H, &bad);
        L->post_norm = zeros(c, H, &bad);
        L->q_norm = zeros(c, D, &bad);
        L->k_norm = zeros(c, D, &bad);
        bad |= RL(L->q, S->q) || RL(L->k, S->k) || RL(L->v, S->v) || RL(L->o, S->o);
        if (L->sparse && !bad) {
            bad |= RL(L->iq, S->iq) || RL(L->ik, S->ik);
            L->iq_norm = zeros(c, shape->index_dim, &bad);
            L->ik_norm = zeros(c, shape->index_dim, &bad);
        }
        if (!L->moe) {
            if (!bad) bad |= rand_mlp_like(c, &L->mlp, &S->mlp, s);
            s += 3;
        } else if (!bad) {
            bad |= RL(L->router, S->router);
            if (cf->use_routing_bias) L->route_bias = zeros(c, E, &bad);
            L->experts = (m3_mlp_w *)calloc((size_t)E, sizeof *L->experts);
            if (!L->experts) bad = 1;
            for (int e = 0; e < E && !bad; e++, s += 3)
                if (S->experts[e].gate.w) bad |= rand_mlp_like(c, &L->experts[e], &S->experts[e], s); /* else another rank's */
            if (!bad) {
                L->backend = m3_cu_alloc(c, sizeof(m3_mlp_w) * (size_t)E);
                if (!L->backend ||
                    (c->wa_mode != 1 && CK(c, cudaMemcpy(L->backend, L->experts, sizeof(m3_mlp_w) * (size_t)E, cudaMemcpyHostToDevice))))
                    bad = 1;
            }
            if (S->has_shared && !bad) {
                L->has_shared = 1;
                bad |= rand_mlp_like(c, &L->shared, &S->shared, s);
                s += 3;
            }
        }
    }
    if (!bad) bad |= RL(w->embed, shape->embed);
    if (!bad) bad |= RL(w->lm_head, shape->lm_head);
    for (int i = 0; i < M3_WEIGHTS_AUX && !bad; i++) { /* a companion model's (the DSpark draft's) */
        if (shape->aux[i].w) bad |= RL(w->aux[i], shape->aux[i]);
        if (shape->aux_vec_n[i] > 0) w->aux_vec[i] = zeros(c, shape->aux_vec_n[i], &bad);
        w->aux_vec_n[i] = shape->aux_vec_n[i];
    }
#undef RL
    if (!bad) w->final_norm = zeros(c, H, &bad);
    if (!bad && c->wa_mode != 1) bad |= CK(c, cudaStreamSynchronize(c->st));
    if (bad || c->failed) {
        m3_errf(err, "random weights: %s", c->failed ? c->errmsg : "out of memory");
        c->failed = 0;
        return -1;
    }
    return 0;
}

/* random device weights in the shapes and formats of `shape` (whole, or a tensor-parallel
 * rank's view: experts without weights there stay absent); seeds drawn in layer order */
extern "C" int m3_cuda_random_weights_like(m3_ops *ops, const m3_config *cf, const m3_weights *shape, uint64_t seed,
                                           m3_weights *w, m3_err *err) {
    rand_args a = {cf, shape, seed};
    return m3_cu_arena_build((m3_cuda *)ops->ctx, w, err, random_pass, &a);
}

extern "C" int m3_cuda_random_weights(m3_ops *ops, const m3_config *cf, int n_layers, uint64_t seed, m3_weights *w,
                                      m3_err *err) {
    m3_weights shape;
    if (m3_weights_shapes(&shape, cf, n_layers, err)) return -1;
    int rc = m3_cuda_random_weights_like(ops, cf, &shape, seed, w, err);
    m3_weights_free(&shape);
    return rc;
}
