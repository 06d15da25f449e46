/* Bulk copies into shared memory, completing on an mbarrier: plain (1-D) ones, and tensor maps (the
 * descriptors of the bulk tensor copies, TMA: the driver's encoder reached through the runtime, no
 * link to libcuda) with the copy of a 4-D box. Used by gemm_tc.cu (weights) and attention_wg.cu (K /
 * V pages). */
#ifndef M3_CUDA_TMAP_CUH
#define M3_CUDA_TMAP_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>

/* cuTensorMapEncodeTiled; NULL where the driver has none */
PFN_cuTensorMapEncodeTiled_v12000 m3_cu_encode_tiled(void);

/* bytes global -> shared (both 16-aligned, a multiple of 16), completing on bar */
static __device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src), "r"(bytes),
                 "r"(bar)
                 : "memory");
}
/* the box of map at (c0 innermost, c1, c2, c3) -> shared dst (1024-aligned for the 128-byte swizzle),
 * its bytes completing on the mbarrier bar; map: a __grid_constant__ parameter's address */
static __device__ __forceinline__ void tma_4d(uint32_t dst, const void *map, int c0, int c1, int c2, int c3, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

#endif
