/* SwiGLU-OAI on the GPU, one gate / up pair: the activation of every MLP and expert (elem.cu,
 * moe.cu, the GEMM epilogues of gemm_ft.cu and gemm_tc.cu), one formula so that every path rounds
 * alike.
 * CPU reference: src/backend/cpu/elem.c (the spec's MLP). */
#ifndef M3_CUDA_SWIGLU_CUH
#define M3_CUDA_SWIGLU_CUH

/* the gate clamped above at limit, up to [-limit, limit]; (up + 1) * gate * sigmoid(alpha * gate) */
static __device__ __forceinline__ float swiglu_oai(float gt, float up, float alpha, float limit) {
    const float g = gt < limit ? gt : limit;
    const float u = up < -limit ? -limit : up > limit ? limit : up;
    return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
}

#endif
