/* The shared-memory layout of the wgmma prefill attention's stages (src/backend/cuda/attention_wg.cu)
 * and the wgmma descriptors that read it. Plain C, shared by the CUDA backend and the unit tests
 * (test_units checks the placement against the PTX ISA's canonical 128-byte-swizzle layouts).
 *
 * A stage holds a chunk of M3_WG_CH = 64 keys: K, then V, each as D / 64 column slabs of [64 keys]
 * [128 bytes] (64 bf16 a row), 16-byte pieces swizzled within a row by the key's low 3 bits (the
 * 128-byte swizzle on address bits 4-6 ^ 7-9, slabs 1024-aligned). Read as:
 *   K, the B operand of S = Q K^T (N = keys, K = d), K-major: 8-key groups 1024 bytes apart (SBO),
 *     a k16 step 32 bytes further within the row, the next 64 columns a slab further;
 *   V, the B operand of O += P V (K = keys, N = d), MN-major (imm-trans-b): 8-key groups 1024 bytes
 *     apart (SBO), 64-column slabs M3_WG_SLAB apart (LBO), a k16 step 16 keys = 2048 bytes further. */
#ifndef M3_BACKEND_ATTN_WG_LAYOUT_H
#define M3_BACKEND_ATTN_WG_LAYOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define M3_WL_FN static __host__ __device__ __forceinline__
#else
#define M3_WL_FN static inline
#endif

#define M3_WG_CH 64                  /* keys per chunk */
#define M3_WG_SLAB (M3_WG_CH * 128)  /* bytes of one 64-column slab of a chunk's K (or V) */

/* byte offset, from the start of K (or V), of key j's 16-byte piece x (values 8x .. 8x + 7) */
M3_WL_FN uint32_t m3_wg_off(int j, int x) {
    return (uint32_t)((x >> 3) * M3_WG_SLAB + j * 128 + (((x & 7) ^ (j & 7)) << 4));
}
/* wgmma shared-memory descriptors, 128-byte swizzle (bits 62-63 = 1), start address a (an 18-bit
 * shared address, 16-byte units in bits 0-13): K-major (LBO field 1, unused; SBO 1024) and
 * MN-major (LBO lbo, SBO sbo bytes) */
M3_WL_FN uint64_t m3_wg_desc_k(uint32_t a) {
    return (uint64_t)(((a & 0x3ffffu) >> 4) | (1u << 16)) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
M3_WL_FN uint64_t m3_wg_desc_v(uint32_t a, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)(((a & 0x3ffffu) >> 4) | ((lbo >> 4) << 16)) | ((uint64_t)(sbo >> 4) << 32) | ((uint64_t)1 << 62);
}
/* the descriptors of k16 step kk of a chunk whose K (V) starts at shared address k (v) */
M3_WL_FN uint64_t m3_wg_desc_k_step(uint32_t k, int kk) { return m3_wg_desc_k(k + (uint32_t)(kk >> 2) * M3_WG_SLAB + (uint32_t)(kk & 3) * 32); }
M3_WL_FN uint64_t m3_wg_desc_v_step(uint32_t v, int kk) { return m3_wg_desc_v(v + (uint32_t)kk * 2048, M3_WG_SLAB, 1024); }

#endif
