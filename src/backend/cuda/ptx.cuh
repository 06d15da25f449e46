/* PTX wrappers the tensor-core kernels share (linear_mma.cu, gemm_tc.cu, gemm_ft.cu, attention.cu,
 * indexer.cu, dspark_attention.cu): shared-memory loads by 32-bit shared address, the cp.async
 * ring's copies, the bf16 m16n8k16 MMA and the TF32 m16n8k8 one with their operand helpers. A
 * generic pointer into shared memory (what a base aligned through an integer is) makes generic
 * loads, which wait on the long (L1TEX) scoreboard: ncu measured half of gemm_tc's warp stall
 * cycles there before these. */
#ifndef M3_CUDA_PTX_CUH
#define M3_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, bypassing L1 (cp.async.cg); committed / awaited in groups */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
/* the same, or 16 zero bytes where !full (src is not read then) */
static __device__ __forceinline__ void cp_async16_z(uint32_t dst, const void *src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(full ? 16 : 0) : "memory");
}
static __device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> static __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

static __device__ __forceinline__ uint4 lds128(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
static __device__ __forceinline__ uint2 lds64(uint32_t a) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
}
static __device__ __forceinline__ uint32_t lds32(uint32_t a) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
    return v;
}
static __device__ __forceinline__ uint32_t lds16(uint32_t a) {
    uint32_t v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=r"(v) : "r"(a));
    return v;
}
static __device__ __forceinline__ uint32_t lds8(uint32_t a) {
    uint32_t v;
    asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(v) : "r"(a));
    return v;
}

/* D += A B on the tensor cores: m16n8k16, bf16 operands, f32 accumulators (the PTX ISA's
 * fragment layouts: a[4] rows gr / gr + 8, b0 / b1 k pairs of column gr, gr = lane / 4) */
static __device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* a 16 x 16 bf16 tile of shared memory as an m16n8k16 A fragment: lane l gives the address
 * of row (l % 16), columns 8 * (l / 16) .. + 8 */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t *a, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
}
/* two f32 -> bf16x2 (round to nearest; x0 in the low half) */
static __device__ __forceinline__ uint32_t bf2(float x0, float x1) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    return *(uint32_t *)&h;
}
/* x rounded to bf16 (nearest even), as f32 */
static __device__ __forceinline__ float bf16_round(float x) { return __uint_as_float(bf2(x, 0.f) << 16); }
/* (x0, x1) -> three bf16x2 parts whose sum is (x0, x1) to ~2^-24 relative: products with
 * bf16-exact values are then exact in f32, and an f32 dot product needs three MMAs */
static __device__ __forceinline__ void split3(float x0, float x1, uint32_t *p0, uint32_t *p1, uint32_t *p2) {
    const uint32_t h = bf2(x0, x1);
    const float r0 = x0 - __uint_as_float(h << 16), r1 = x1 - __uint_as_float(h & 0xffff0000u);
    const uint32_t m = bf2(r0, r1);
    *p0 = h;
    *p1 = m;
    *p2 = bf2(r0 - __uint_as_float(m << 16), r1 - __uint_as_float(m & 0xffff0000u));
}

/* x rounded to TF32 (nearest, ties away: cvt.rna), as the f32 bit pattern the MMA reads */
static __device__ __forceinline__ uint32_t tf32_of(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
/* x = big + small to ~2^-22 relative, both TF32: an f32 product as three TF32 MMAs (big x big,
 * big x small, small x big; the small x small term is below f32's rounding) */
static __device__ __forceinline__ void tf32_split(float x, uint32_t *big, uint32_t *small) {
    *big = tf32_of(x);
    *small = tf32_of(x - __uint_as_float(*big));
}
/* the same by truncation: big is x with its low 13 mantissa bits cleared, small the exact rest
 * (passed as f32 bits: an MMA reads a TF32 operand's top 19 bits), two integer / float
 * instructions instead of two conversions and a subtraction; the products' error grows from
 * 2^-22 to 2^-20 of their size */
static __device__ __forceinline__ void tf32_split_trunc(float x, uint32_t *big, uint32_t *small) {
    *big = __float_as_uint(x) & 0xffffe000u;
    *small = __float_as_uint(x - __uint_as_float(*big));
}
/* D += A B: m16n8k8, TF32 operands, f32 accumulators (lane l, g = l / 4, t = l % 4: a0 / a1 rows
 * g / g + 8 at column t, a2 / a3 the same at column t + 4; b0 / b1 rows t / t + 4 of column g;
 * c0, c1 row g columns 2t, 2t + 1, c2, c3 the same of row g + 8) */
static __device__ __forceinline__ void mma_tf32(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
