/* NVFP4 quantization of activations per token, on the GPU (the MoE's FC1 input under
 * --moe-act-quant nvfp4): one CTA a row, the row's amax by a block reduction, then a thread per
 * 16 values, each operation rounded once in f32 as the CPU's.
 * CPU reference (and the rule): src/backend/cpu/act_quant.c (m3_cpu_act_quant_nvfp4). */
#include "common.cuh"

__global__ void __launch_bounds__(256) k_act_quant_nvfp4(const float *x, int H, float *out) {
    const float *xr = x + (size_t)blockIdx.x * H;
    float *o = out + (size_t)blockIdx.x * H;
    __shared__ float wmax[8];
    float a = 0;
    int nan = 0;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        a = fmaxf(a, fabsf(xr[i])); /* fmaxf drops NaN: flagged apart */
        nan |= xr[i] != xr[i];
    }
    nan = __syncthreads_or(nan);
    for (int d = 16; d; d >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, d));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = a;
    __syncthreads();
    float amax = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) amax = fmaxf(amax, wmax[w]);
    if (nan || !(amax > 0) || isinf(amax)) { /* copied as it is */
        for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = xr[i];
        return;
    }
    const float gs = __fdiv_rn(2688.0f, amax);
    for (int g = threadIdx.x; g < H / 16; g += blockDim.x) {
        float y[16];
        const float4 *src = (const float4 *)(xr + 16 * g);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float4 v = src[j];
            y[4 * j] = __fmul_rn(v.x, gs), y[4 * j + 1] = __fmul_rn(v.y, gs);
            y[4 * j + 2] = __fmul_rn(v.z, gs), y[4 * j + 3] = __fmul_rn(v.w, gs);
        }
        float m = 0;
#pragma unroll
        for (int i = 0; i < 16; i++) m = fmaxf(m, fabsf(y[i]));
        const float s = e4m3_f32(f32_e4m3(__fdiv_rn(m, 6.0f)));
        float4 *dst = (float4 *)(o + 16 * g);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float r[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float q = s != 0 ? e2m1_f32(f32_e2m1(__fdiv_rn(y[4 * j + k], s))) : 0.f;
                r[k] = __fdiv_rn(__fmul_rn(q, s), gs);
            }
            dst[j] = make_float4(r[0], r[1], r[2], r[3]);
        }
    }
}

int m3_cu_act_quant_nvfp4(m3_cuda *c, const float *x, int T, int H, float *out) {
    if (T <= 0) return 0;
    if (H % 16 || ((uintptr_t)x | (uintptr_t)out) % 16) {
        m3_cu_failf(c, "act quant: rows of %d values (not a multiple of 16) or misaligned", H);
        return -1;
    }
    k_act_quant_nvfp4<<<T, 256, 0, c->st>>>(x, H, out);
    return CK_LAUNCH(c, "act quant (nvfp4)") ? -1 : 0;
}
