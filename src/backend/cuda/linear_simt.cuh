/* The SIMT GEMV's building blocks (linear.cu's k_gemv_simt*, moe.cu's per-slot expert kernels):
 * a warp's rows of any weight format read in 16-byte chunks and decoded in registers
 * (formats.cuh), against x staged in shared memory, block scales on the partial sums.
 * CPU reference: src/backend/cpu/linear.c (m3_cpu_linear). */
#ifndef M3_CUDA_LINEAR_SIMT_CUH
#define M3_CUDA_LINEAR_SIMT_CUH

#include "common.cuh"

#define GW 8  /* warps per CTA */
#define GR 4  /* rows per warp */

/* values per 16-byte chunk of a row */
template <int F> struct fmt_info;
template <> struct fmt_info<M3_WF_F32> { enum { VALS = 4 }; };
template <> struct fmt_info<M3_WF_BF16> { enum { VALS = 8 }; };
template <> struct fmt_info<M3_WF_F16> { enum { VALS = 8 }; };
template <> struct fmt_info<M3_WF_MXFP8> { enum { VALS = 16 }; };
template <> struct fmt_info<M3_WF_NVFP4> { enum { VALS = 32 }; };

/* acc[t] += dot(chunk q of values k..k+VALS, xs[t][kk..]) with scales; sc: the row's scales */
template <int F, int NT>
static __device__ __forceinline__ void chunk_fma(uint4 q, const uint8_t *sc, int k, float gmul, const float *xs, int xstride,
                                                 int kk, float *acc) {
    uint32_t u[4] = {q.x, q.y, q.z, q.w};
    if (F == M3_WF_F32) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float4 xv = *(const float4 *)(xs + t * xstride + kk);
            acc[t] += __uint_as_float(u[0]) * xv.x + __uint_as_float(u[1]) * xv.y + __uint_as_float(u[2]) * xv.z +
                      __uint_as_float(u[3]) * xv.w;
        }
    } else if (F == M3_WF_BF16 || F == M3_WF_F16) {
        float w[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (F == M3_WF_BF16) {
                w[2 * i] = __uint_as_float(u[i] << 16);
                w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
            } else {
                __half2_raw r;
                r.x = (unsigned short)(u[i] & 0xffff);
                r.y = (unsigned short)(u[i] >> 16);
                float2 f = __half22float2(__half2(r));
                w[2 * i] = f.x;
                w[2 * i + 1] = f.y;
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float *xp = xs + t * xstride + kk;
            float4 a = *(const float4 *)xp, b = *(const float4 *)(xp + 4);
            acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
        }
    } else if (F == M3_WF_MXFP8) {
        float w[16];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 lo = e4m3x2_f32(u[i] & 0xffff), hi = e4m3x2_f32(u[i] >> 16);
            w[4 * i] = lo.x; w[4 * i + 1] = lo.y; w[4 * i + 2] = hi.x; w[4 * i + 3] = hi.y;
        }
        float s = e8m0_f32(sc[k / 32]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float *xp = xs + t * xstride + kk;
            float p = 0;
#pragma unroll
            for (int j = 0; j < 16; j += 4) {
                float4 a = *(const float4 *)(xp + j);
                p += w[j] * a.x + w[j + 1] * a.y + w[j + 2] * a.z + w[j + 3] * a.w;
            }
            acc[t] += p * s;
        }
    } else { /* NVFP4: two groups of 16 values, 8 bytes each */
#pragma unroll
        for (int g = 0; g < 2; g++) {
            float w[16];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                uint32_t v = u[2 * g + i];
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    float2 f = e2m1x2_f32((v >> (8 * b)) & 0xff);
                    w[8 * i + 2 * b] = f.x;
                    w[8 * i + 2 * b + 1] = f.y;
                }
            }
            float s = (e4m3_f32(sc[k / 16 + g]) * gmul) * 16384.0f;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float *xp = xs + t * xstride + kk + 16 * g;
                float p = 0;
#pragma unroll
                for (int j = 0; j < 16; j += 4) {
                    float4 a = *(const float4 *)(xp + j);
                    p += w[j] * a.x + w[j + 1] * a.y + w[j + 2] * a.z + w[j + 3] * a.w;
                }
                acc[t] += p * s;
            }
        }
    }
}

/* A warp's share of one K tile: R rows (each its own data, scale and global multiplier),
 * values [kt0, kt0 + klen) against xs (tile-relative columns). */
template <int F, int NT, int R>
static __device__ __forceinline__ void warp_rows(const uint8_t *const *rw, const uint8_t *const *rs, const float *gm,
                                                 const bool *ok, int kt0, int klen, const float *xs, int xstride,
                                                 float (*acc)[NT]) {
    const int V = fmt_info<F>::VALS, lane = threadIdx.x & 31;
    const int nch = klen / V;
    const int bpv2 = F == M3_WF_F32 ? 8 : F == M3_WF_BF16 || F == M3_WF_F16 ? 4 : F == M3_WF_MXFP8 ? 2 : 1; /* 2x bytes/value */
#pragma unroll 2
    for (int ch = lane; ch < nch; ch += 32) {
        int kk = ch * V, k = kt0 + kk;
        size_t boff = (size_t)k * bpv2 / 2;
        uint4 q[R];
#pragma unroll
        for (int r = 0; r < R; r++) q[r] = ok[r] ? __ldg((const uint4 *)(rw[r] + boff)) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (ok[r]) chunk_fma<F, NT>(q[r], rs[r], k, gm[r], xs, xstride, kk, acc[r]);
    }
}

/* v, or with rb v rounded to bf16 (as m3_cu_gemm_input rounds a GEMM input under precision bf16) */
static __device__ __forceinline__ float round_bf16_if(float v, int rb) { return rb ? __bfloat162float(__float2bfloat16_rn(v)) : v; }

/* stage x[t0 .. t0+NT) columns [kt0, kt0+klen) into xs[NT][KT] (zeros for t >= T); rb: each value
 * rounded to bf16 as it lands (one launch less) */
template <int NT>
static __device__ __forceinline__ void stage_x(const float *x, int K, int T, int t0, int kt0, int klen, float *xs, int KT,
                                               int rb = 0) {
    for (int i = threadIdx.x; i < NT * (klen / 4); i += blockDim.x) {
        int t = i / (klen / 4), j = (i % (klen / 4)) * 4;
        float4 v = make_float4(0, 0, 0, 0);
        if (t0 + t < T) v = *(const float4 *)(x + (size_t)(t0 + t) * K + kt0 + j);
        v = make_float4(round_bf16_if(v.x, rb), round_bf16_if(v.y, rb), round_bf16_if(v.z, rb), round_bf16_if(v.w, rb));
        *(float4 *)(xs + t * KT + j) = v;
    }
}

/* a warp's GR rows from n0: row and scale pointers (rows past N read row 0 and are not
 * stored), multipliers, zeroed sums */
template <int NT>
static __device__ __forceinline__ void warp_rows_setup(const m3_linear &W, int n0, const uint8_t **rw, const uint8_t **rs, float *gm,
                                                       bool *ok, float (*acc)[NT]) {
#pragma unroll
    for (int r = 0; r < GR; r++) {
        const int n = n0 + r;
        ok[r] = n < W.N;
        rw[r] = W.w + (size_t)(ok[r] ? n : 0) * W.row_bytes;
        rs[r] = W.scale ? W.scale + (size_t)(ok[r] ? n : 0) * W.scale_row : NULL;
        gm[r] = W.gmul;
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0;
    }
}

/* a warp's GR x NT sums (lane 0 writes): y[t0 + t][n0 + r] for rows that exist and t0 + t < T */
template <int NT>
static __device__ __forceinline__ void rows_store(float (*acc)[NT], const bool *ok, int lane, int t0, int T, float *y, int N,
                                                  int n0) {
#pragma unroll
    for (int r = 0; r < GR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = warp_sum(acc[r][t]);
            if (lane == 0 && ok[r] && t0 + t < T) y[(size_t)(t0 + t) * N + n0 + r] = v;
        }
}

#endif
