/* DSpark's verification of sampled requests on the GPU (ops.h verify_rows), by cpu/verify.c's
 * rule (its reference): the same integers, so the same ids from the same rows.
 *
 * A group is one CTA. Warp 0 tests the k drafts at once (a lane a draft) and finds the first
 * rejection; only then is the rejected slot's residual max(p - q, 0) drawn: the row in tiles of
 * VR_TILE ids, each warp summing whole tiles (coalesced: lane l reads ids l, l + 32, ...), the
 * tile sums scanned over the CTA to find the tile holding floor(u * total), and one warp walks
 * that tile in id order. Weights are integers (units of 2^-40), so every sum is exact. */
#include "common.cuh"

#define VR_T 1024     /* threads a CTA */
#define VR_TILE 256   /* ids a tile: 8 loads a lane */
#define VR_GROUPS 16  /* groups a launch (by value: 16 x 408 bytes) */

struct vr_args {
    m3_verify_group g[VR_GROUPS];
};

static __device__ __forceinline__ unsigned long long vr_units(float w) {
    return w > 0 ? __double2ull_rz(ldexp((double)w, 40)) : 0ull; /* w * 2^40 rounded down */
}

/* the residual's weight of id i (cpu/verify.c weight) */
static __device__ __forceinline__ unsigned long long vr_weight(const float *p, const float *q, int d, bool fb, int i) {
    if (fb) return i == d ? 0ull : vr_units(p[i]);
    return vr_units(__fsub_rn(p[i], q ? q[i] : i == d ? 1.0f : 0.0f));
}

/* grid (groups), block VR_T; dynamic shared memory: the tile sums [ceil(V / VR_TILE)] */
__global__ void __launch_bounds__(VR_T) k_verify_rows(const float *x, int V, size_t ld, const __grid_constant__ vr_args a,
                                                      int32_t *out) {
    extern __shared__ unsigned long long vr_tsum[];
    __shared__ int rej;
    __shared__ unsigned long long wtot[VR_T / 32], wscan[VR_T / 32];
    __shared__ int tile_at;
    __shared__ unsigned long long before_at;
    const m3_verify_group &G = a.g[blockIdx.x];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    /* 1. the drafts' tests: lane i takes d_i; the first rejection */
    if (w == 0) {
        bool acc = true;
        if (lane < G.k) {
            const int d = G.d[lane];
            const double pd = x[(size_t)(G.row0 + lane) * ld + d], qd = G.q ? G.q[(size_t)lane * V + d] : 1.0;
            acc = pd > 0 && G.u[lane] * qd < pd;
        }
        const unsigned rejected = __ballot_sync(0xffffffffu, !acc);
        const int r = rejected ? __ffs(rejected) - 1 : G.k;
        if (lane < r) out[G.row0 + lane] = G.d[lane];
        if (lane == 0) rej = r;
    }
    __syncthreads();
    const int r = rej;
    if (r >= G.k) return; /* every draft accepted: the bonus stays */
    const float *p = x + (size_t)(G.row0 + r) * ld, *q = G.q ? G.q + (size_t)r * V : nullptr;
    const int d = G.d[r], nt = (V + VR_TILE - 1) / VR_TILE;
    for (int fb = 0; fb < 2; fb++) {
        /* 2. every tile's weight, and the total */
        unsigned long long mine = 0;
        for (int t = w; t < nt; t += VR_T / 32) {
            unsigned long long s = 0;
#pragma unroll
            for (int j = 0; j < VR_TILE / 32; j++) {
                const int i = t * VR_TILE + j * 32 + lane;
                if (i < V) s += vr_weight(p, q, d, fb, i);
            }
            s = warp_sum(s);
            if (lane == 0) vr_tsum[t] = s;
            mine += s;
        }
        if (lane == 0) wtot[w] = mine;
        __syncthreads();
        unsigned long long total = 0;
        for (int k = 0; k < VR_T / 32; k++) total += wtot[k];
        if (!total) {
            __syncthreads(); /* wtot and vr_tsum are written again */
            continue;
        }
        unsigned long long xp = (unsigned long long)(G.u[r + 1] * (double)total);
        if (xp >= total) xp = total - 1;
        /* 3. the tile holding xp: thread t's run of tiles [t c, t c + c), an inclusive scan */
        const int c = (nt + VR_T - 1) / VR_T, t0 = (int)threadIdx.x * c < nt ? (int)threadIdx.x * c : nt,
                  t1 = t0 + c < nt ? t0 + c : nt;
        unsigned long long run = 0;
        for (int t = t0; t < t1; t++) run += vr_tsum[t];
        unsigned long long incl = run;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        if (lane == 31) wscan[w] = incl;
        __syncthreads();
        for (int k = 0; k < w; k++) incl += wscan[k];
        unsigned long long lo = incl - run;
        if (lo <= xp && xp < incl)
            for (int t = t0; t < t1; t++) {
                if (xp < lo + vr_tsum[t]) {
                    tile_at = t;
                    before_at = lo;
                    break;
                }
                lo += vr_tsum[t];
            }
        __syncthreads();
        /* 4. warp 0 walks the tile in id order */
        if (w == 0) {
            unsigned long long acc = before_at;
            const int t = tile_at;
            for (int j = 0; j < VR_TILE / 32; j++) {
                const int i = t * VR_TILE + j * 32 + lane;
                const unsigned long long wi = i < V ? vr_weight(p, q, d, fb, i) : 0ull;
                unsigned long long in = wi;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const unsigned long long y = __shfl_up_sync(0xffffffffu, in, o);
                    if (lane >= o) in += y;
                }
                const unsigned hit = __ballot_sync(0xffffffffu, acc + in > xp);
                if (hit) {
                    if (lane == __ffs(hit) - 1) out[G.row0 + r] = i;
                    break;
                }
                acc += __shfl_sync(0xffffffffu, in, 31);
            }
        }
        return;
    }
    if (threadIdx.x == 0) out[G.row0 + r] = d; /* p one-hot at d: never rejected (u < 1) */
}

void m3_cu_verify_rows(void *ctx, const float *x, int V, size_t ld, int n, const m3_verify_group *g, int32_t *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (n <= 0 || V <= 0 || c->failed) return;
    const size_t smem = sizeof(unsigned long long) * (size_t)((V + VR_TILE - 1) / VR_TILE);
    if (smem > c->smem_optin) {
        m3_cu_failf(c, "verify rows: a vocabulary of %d ids needs %zu bytes of shared memory (%zu)", V, smem, c->smem_optin);
        return;
    }
    if (smem > 48 * 1024 && CK(c, cudaFuncSetAttribute(k_verify_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)))
        return;
    int end = 0; /* out's rows written: up to the last group's */
    for (int j = 0; j < n; j++) end = g[j].row0 + g[j].k + 1 > end ? g[j].row0 + g[j].k + 1 : end;
    m3_cu_xsplit_touch(c, out, sizeof(int32_t) * (size_t)end);
    m3_cu_prof_begin(c, OP_ARGMAX);
    for (int g0 = 0; g0 < n; g0 += VR_GROUPS) {
        const int m = n - g0 < VR_GROUPS ? n - g0 : VR_GROUPS;
        vr_args a;
        memset(&a, 0, sizeof a);
        memcpy(a.g, g + g0, sizeof(m3_verify_group) * (size_t)m);
        k_verify_rows<<<m, VR_T, smem, c->st>>>(x, V, ld, a, out);
    }
    CK_LAUNCH(c, "verify rows");
    m3_cu_prof_end(c, OP_ARGMAX);
}
