/* NVFP4 quantization of activations per token, on the GPU (the MoE's FC1 input under
 * --moe-act-quant nvfp4): one CTA a row, a thread per 16 values (up to 4 groups a thread), the
 * row read once into registers; its amax by a block reduction, then each group quantized and
 * written back, each operation rounded once in f32 as the CPU's (longer rows: read twice); with
 * xs, the f16 split of the result too (split_store: what the tensor-core GEMVs read, so a decode
 * step's experts need no split pass of their own).
 * CPU reference (and the rule): src/backend/cpu/act_quant.c (m3_cpu_act_quant_nvfp4). */
#include "common.cuh"

/* the row's gs from every thread's partial max |x| and NaN flag; 0 when the row is kept as it is
 * (zeros, a value that is not finite, or gs overflowing) */
static __device__ float row_gs(float a, int nan) {
    __shared__ float wmax[16];
    nan = __syncthreads_or(nan);
    for (int d = 16; d; d >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, d));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = a;
    __syncthreads();
    float amax = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) amax = fmaxf(amax, wmax[w]);
    const float gs = __fdiv_rn(2688.0f, amax);
    return nan || !(amax > 0) || isinf(amax) || isinf(gs) ? 0.f : gs;
}

/* 16 values quantized at gs (> 0) and back: the KV rule on v * gs, divided by gs */
static __device__ __forceinline__ void group16(const float *v, float gs, float *r) {
    float y[16], m = 0;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        y[i] = __fmul_rn(v[i], gs);
        m = fmaxf(m, fabsf(y[i]));
    }
    const float s = e4m3_f32(f32_e4m3(__fdiv_rn(m, 6.0f)));
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const float q = s != 0 ? e2m1_f32(f32_e2m1(__fdiv_rn(y[i], s))) : 0.f;
        r[i] = __fdiv_rn(__fmul_rn(q, s), gs);
    }
}

/* 16 results at o (and their split at xs + k, n values a half; 16-byte stores) */
static __device__ __forceinline__ void store16(const float *r, float *o, uint16_t *xs, size_t n, size_t k, int rb) {
#pragma unroll
    for (int q = 0; q < 4; q++) ((float4 *)o)[q] = make_float4(r[4 * q], r[4 * q + 1], r[4 * q + 2], r[4 * q + 3]);
    if (!xs) return;
    __align__(16) uint16_t hi[16], lo[16];
#pragma unroll
    for (int i = 0; i < 16; i++) split_store(r[i], hi + i, lo + i, rb);
#pragma unroll
    for (int q = 0; q < 2; q++) {
        ((uint4 *)(xs + k))[q] = ((const uint4 *)hi)[q];
        ((uint4 *)(xs + n + k))[q] = ((const uint4 *)lo)[q];
    }
}

template <int G>
__global__ void __launch_bounds__(512) k_act_quant_nvfp4(const float *x, int H, float *out, uint16_t *xs, size_t n, int rb) {
    const float *xr = x + (size_t)blockIdx.x * H;
    float *o = out + (size_t)blockIdx.x * H;
    const int ng = H / 16;
    float v[G][16];
    float a = 0;
    int nan = 0;
#pragma unroll
    for (int j = 0; j < G; j++) {
        const int g = threadIdx.x + j * blockDim.x;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float4 f = g < ng ? ((const float4 *)(xr + 16 * g))[q] : make_float4(0.f, 0.f, 0.f, 0.f);
            v[j][4 * q] = f.x, v[j][4 * q + 1] = f.y, v[j][4 * q + 2] = f.z, v[j][4 * q + 3] = f.w;
        }
#pragma unroll
        for (int i = 0; i < 16; i++) {
            a = fmaxf(a, fabsf(v[j][i])); /* fmaxf drops NaN: flagged apart */
            nan |= v[j][i] != v[j][i];
        }
    }
    const float gs = row_gs(a, nan);
#pragma unroll
    for (int j = 0; j < G; j++) {
        const int g = threadIdx.x + j * blockDim.x;
        if (g >= ng) break;
        float r[16];
        if (gs == 0) {
#pragma unroll
            for (int i = 0; i < 16; i++) r[i] = v[j][i];
        } else {
            group16(v[j], gs, r);
        }
        store16(r, o + 16 * g, xs, n, (size_t)blockIdx.x * H + 16 * g, rb);
    }
}

/* rows of more than 4 x 512 groups: the same rule, the row read twice (amax, then the groups) */
__global__ void __launch_bounds__(512) k_act_quant_nvfp4_wide(const float *x, int H, float *out, uint16_t *xs, size_t n,
                                                              int rb) {
    const float *xr = x + (size_t)blockIdx.x * H;
    float *o = out + (size_t)blockIdx.x * H;
    float a = 0;
    int nan = 0;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        a = fmaxf(a, fabsf(xr[i]));
        nan |= xr[i] != xr[i];
    }
    const float gs = row_gs(a, nan);
    for (int g = threadIdx.x; g < H / 16; g += blockDim.x) {
        float v[16], r[16];
#pragma unroll
        for (int i = 0; i < 16; i++) v[i] = xr[16 * g + i];
        if (gs == 0) {
#pragma unroll
            for (int i = 0; i < 16; i++) r[i] = v[i];
        } else {
            group16(v, gs, r);
        }
        store16(r, o + 16 * g, xs, n, (size_t)blockIdx.x * H + 16 * g, rb);
    }
}

int m3_cu_act_quant_nvfp4(m3_cuda *c, const float *x, int T, int H, float *out, uint16_t *xs) {
    if (T <= 0) return 0;
    const int ng = H / 16, nt = ng < 512 ? (ng + 31) / 32 * 32 : 512, G = (ng + nt - 1) / nt;
    if (H <= 0 || H % 16 || ((uintptr_t)x | (uintptr_t)out | (uintptr_t)xs) % 16) {
        m3_cu_failf(c, "act quant: rows of %d values (a multiple of 16 needed) or misaligned", H);
        return -1;
    }
    const size_t n = (size_t)T * H;
    const int rb = c->gemm_bf16;
    switch (G) {
    case 1: k_act_quant_nvfp4<1><<<T, nt, 0, c->st>>>(x, H, out, xs, n, rb); break;
    case 2: k_act_quant_nvfp4<2><<<T, nt, 0, c->st>>>(x, H, out, xs, n, rb); break;
    case 3: k_act_quant_nvfp4<3><<<T, nt, 0, c->st>>>(x, H, out, xs, n, rb); break;
    case 4: k_act_quant_nvfp4<4><<<T, nt, 0, c->st>>>(x, H, out, xs, n, rb); break;
    default: k_act_quant_nvfp4_wide<<<T, 512, 0, c->st>>>(x, H, out, xs, n, rb); break;
    }
    return CK_LAUNCH(c, "act quant (nvfp4)") ? -1 : 0;
}
