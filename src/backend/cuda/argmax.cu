/* Row argmax on the GPU (ops.h argmax_rows): the DSpark draft's greedy draws. The largest value
 * (NaN never counts), then the first index holding it; a NaN at index 0 or a row of NaN gives 0,
 * as m3_row_argmax's rule does. Each row is split into chunks of AM_CHUNK values over many CTAs
 * (one CTA walking a 200,064-value row took ~140 us, latency-bound), each leaving its chunk's
 * (largest, first index) and whether it saw a non-finite value among the row's first nf (the
 * finite flags of argmax_rows_fin); a warp per row then picks the largest, the first on ties.
 * CPU reference: src/backend/cpu/argmax.c (base/rows.c m3_row_argmax). */
#include "common.cuh"

#include <limits.h>

#define AM_THREADS 256
#define AM_CHUNK 4096 /* values a CTA takes: 16 loads a thread in flight */

struct am_best { float m; int i; };
struct am_part { am_best b; int bad; };

/* b better than a: larger, or as large at a smaller index (m never NaN) */
__device__ __forceinline__ am_best am_pick(am_best a, am_best b) { return b.m > a.m || (b.m == a.m && b.i < a.i) ? b : a; }

__device__ __forceinline__ am_best am_warp(am_best a) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        am_best b = {__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
        a = am_pick(a, b);
    }
    return a;
}

/* grid (chunk, row): part[row * nch + chunk] = the chunk's (largest, first index) over [0, n),
 * (-inf, INT_MAX) when it holds only NaN, and bad = a non-finite value among [0, nf) */
__global__ void __launch_bounds__(AM_THREADS) k_argmax_part(const float *x, int n, int nf, size_t ld, int nch, am_part *part) {
    __shared__ am_best wp[AM_THREADS / 32];
    __shared__ int wbad[AM_THREADS / 32];
    const float *r = x + (size_t)blockIdx.y * ld;
    const int w = n > nf ? n : nf, i0 = blockIdx.x * AM_CHUNK, i1 = w - i0 < AM_CHUNK ? w : i0 + AM_CHUNK;
    am_best a = {-INFINITY, INT_MAX};
    int bad = 0;
    float v[AM_CHUNK / AM_THREADS];
#pragma unroll
    for (int u = 0; u < AM_CHUNK / AM_THREADS; u++) {
        const int i = i0 + u * AM_THREADS + (int)threadIdx.x;
        v[u] = i < i1 ? r[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < AM_CHUNK / AM_THREADS; u++) {
        const int i = i0 + u * AM_THREADS + (int)threadIdx.x;
        if (i < nf) bad |= (__float_as_uint(v[u]) & 0x7f800000u) == 0x7f800000u;
        if (i < n && (v[u] > a.m || (v[u] == a.m && i < a.i))) a = {v[u], i}; /* NaN never counts */
    }
    a = am_warp(a);
    bad = __any_sync(0xffffffffu, bad);
    if (threadIdx.x % 32 == 0) {
        wp[threadIdx.x / 32] = a;
        wbad[threadIdx.x / 32] = bad;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        a = threadIdx.x < AM_THREADS / 32 ? wp[threadIdx.x] : am_best{-INFINITY, INT_MAX};
        bad = threadIdx.x < AM_THREADS / 32 ? wbad[threadIdx.x] : 0;
        a = am_warp(a);
        bad = __any_sync(0xffffffffu, bad);
        if (threadIdx.x == 0) part[(size_t)blockIdx.y * nch + blockIdx.x] = {a, bad};
    }
}

/* a warp per row over its chunks */
__global__ void k_argmax_pick(const am_part *part, int nch, const float *x, int n, size_t ld, int32_t *out, int32_t *fin) {
    const int row = blockIdx.x;
    am_best a = {-INFINITY, INT_MAX};
    int bad = 0;
    for (int c = threadIdx.x; c < nch; c += 32) {
        const am_part p = part[(size_t)row * nch + c];
        a = am_pick(a, p.b);
        bad |= p.bad;
    }
    a = am_warp(a);
    bad = __any_sync(0xffffffffu, bad);
    if (threadIdx.x == 0) {
        const float r0 = x[(size_t)row * ld];
        out[row] = r0 != r0 || a.i >= n ? 0 : a.i;
        if (fin) fin[row] = !bad;
    }
}

static void argmax_rows(m3_cuda *c, const float *x, int rows, int n, int nf, size_t ld, int32_t *out, int32_t *fin) {
    if (rows <= 0 || n <= 0 || c->failed) return;
    m3_cu_xsplit_touch(c, out, sizeof(int32_t) * (size_t)rows);
    if (fin) m3_cu_xsplit_touch(c, fin, sizeof(int32_t) * (size_t)rows);
    m3_cu_prof_begin(c, OP_ARGMAX);
    const int nch = (int)cdiv((size_t)(n > nf ? n : nf), AM_CHUNK);
    am_part *part = (am_part *)m3_cu_scratch(c, SC_AMAX, sizeof(am_part) * (size_t)(rows < 65535 ? rows : 65535) * nch);
    for (int r0 = 0; part && r0 < rows; r0 += 65535) { /* the grid's y extent */
        const int m = rows - r0 < 65535 ? rows - r0 : 65535;
        k_argmax_part<<<dim3(nch, m), AM_THREADS, 0, c->st>>>(x + (size_t)r0 * ld, n, nf, ld, nch, part);
        k_argmax_pick<<<m, 32, 0, c->st>>>(part, nch, x + (size_t)r0 * ld, n, ld, out + r0, fin ? fin + r0 : NULL);
        CK_LAUNCH(c, "argmax rows");
    }
    m3_cu_prof_end(c, OP_ARGMAX);
}

void m3_cu_argmax_rows(void *ctx, const float *x, int rows, int n, size_t ld, int32_t *out) {
    argmax_rows((m3_cuda *)ctx, x, rows, n, 0, ld, out, NULL);
}

void m3_cu_argmax_rows_fin(void *ctx, const float *x, int rows, int n, int nf, size_t ld, int32_t *out, int32_t *fin) {
    argmax_rows((m3_cuda *)ctx, x, rows, n, nf < 0 ? 0 : nf, ld, out, fin);
}
