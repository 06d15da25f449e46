/* session 38: does compute-sanitizer racecheck see the ordering of k_gemm_tc's stage ring? One
 * producer warp fills 2 shared-memory stages with cp.async.bulk (completing on a stage's full
 * mbarrier, expect_tx), one consumer warp waits on it, reads the stage with ld.shared, and hands it
 * back by arriving on the stage's empty mbarrier; the producer waits on that before the next copy
 * into it (gemm_tc.cu's pattern). argv[1] = 1: the consumer also issues fence.proxy.async.shared::cta
 * before its arrival. The sums are checked; racecheck's verdict is the experiment.
 * build: nvcc -gencode=arch=compute_90a,code=sm_90a -O2 -o pipe_race pipe_race.cu */
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cuda_runtime.h>

#define NB 64      /* blocks of the global array */
#define BYTES 1024 /* a block: 256 floats */

static __device__ __forceinline__ uint32_t su32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void mb_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void mb_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mb_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void mb_wait(uint32_t bar, uint32_t parity) {
    uint32_t ok = 0;
    while (!ok)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
}
static __device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar) : "memory");
}

__global__ void k_ring(const float *g, float *out, int fence) {
    __shared__ __align__(128) float st[2][BYTES / 4];
    __shared__ __align__(8) uint64_t full[2], empty[2];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; s++) { mb_init(su32(&full[s]), 1); mb_init(su32(&empty[s]), 1); }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (warp == 0) { /* producer */
        for (int b = 0; b < NB; b++) {
            const int s = b % 2;
            if (b >= 2) mb_wait(su32(&empty[s]), ((b / 2) & 1) ^ 1);
            if (lane == 0) {
                mb_expect_tx(su32(&full[s]), BYTES);
                bulk_g2s(su32(st[s]), g + (size_t)b * (BYTES / 4), BYTES, su32(&full[s]));
            }
            __syncwarp();
        }
        return;
    }
    float acc = 0; /* consumer */
    for (int b = 0; b < NB; b++) {
        const int s = b % 2;
        mb_wait(su32(&full[s]), (b / 2) & 1);
        for (int i = lane; i < BYTES / 4; i += 32) acc += st[s][i];
        if (fence) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp();
        if (lane == 0) mb_arrive(su32(&empty[s]));
    }
    for (int o = 16; o; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) *out = acc;
}

int main(int argc, char **argv) {
    const int fence = argc > 1 && atoi(argv[1]);
    const int n = NB * BYTES / 4;
    float *h = (float *)malloc(sizeof(float) * n), *g, *o, r = 0;
    double want = 0;
    for (int i = 0; i < n; i++) { h[i] = (float)(i % 7); want += h[i]; }
    cudaMalloc(&g, sizeof(float) * n);
    cudaMalloc(&o, sizeof(float));
    cudaMemcpy(g, h, sizeof(float) * n, cudaMemcpyHostToDevice);
    k_ring<<<1, 64>>>(g, o, fence);
    cudaError_t e = cudaMemcpy(&r, o, sizeof(float), cudaMemcpyDeviceToHost);
    printf("fence %d: sum %.0f, want %.0f: %s (%s)\n", fence, r, want, r == want ? "ok" : "WRONG", cudaGetErrorString(e));
    return r == want && e == cudaSuccess ? 0 : 1;
}
