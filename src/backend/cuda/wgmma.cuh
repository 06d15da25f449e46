/* PTX wrappers of Hopper's asynchronous pipeline that the warp-specialized kernels share
 * (gemm_tc.cu, attention_wg.cu): mbarriers (a stage's full / empty handshakes), the warpgroup
 * MMA's fence / commit / wait, setmaxnreg's register moves between warpgroups, and the pins that
 * keep registers an in-flight wgmma reads or writes in place. */
#ifndef M3_CUDA_WGMMA_CUH
#define M3_CUDA_WGMMA_CUH

#include <stdint.h>

static __device__ __forceinline__ void mb_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void mb_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mb_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ uint32_t mb_try(uint32_t bar, uint32_t parity) {
    uint32_t ok;
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n"
                 "}\n"
                 : "=r"(ok)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return ok;
}
static __device__ __forceinline__ void mb_wait(uint32_t bar, uint32_t parity) {
    while (!mb_try(bar, parity)) {
    }
}
/* bar's arrival (one of its count; .noinc) when this thread's cp.async copies issued so far land */
static __device__ __forceinline__ void mb_arrive_cp(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
/* orders this thread's view of shared memory written by the generic proxy (st.shared, cp.async:
 * another thread's, acquired through an mbarrier) before its async-proxy accesses (wgmma operands) */
static __device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int R> static __device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R> static __device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int N> static __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keeps the compiler from moving / reusing registers an in-flight wgmma reads or writes */
template <int N> static __device__ __forceinline__ void pin_u32(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}
template <int N> static __device__ __forceinline__ void pin_f32(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

#endif
