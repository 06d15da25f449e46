/* The paged KV / index-K cache as the kernels see it: a layer's descriptor (kvdesc, built per
 * launch by desc), the page of a position, and rows read and written in the cache dtype (f32,
 * bf16, FP8 E4M3, NVFP4 codes + E4M3 scales per 16) with the spec's rounding.
 * Page layout (src/kv/kv.h): layer L's page p at base[L] + p * page_bytes[L]:
 *   K [nkv][page][D], V [nkv][page][D], then (sparse layers) index-K [page][Di].
 * Used by kv_store.cu, indexer.cu and attention.cu.
 * CPU reference: src/kv/kv.c (m3_kv_store, m3_kv_load). */
#ifndef M3_CUDA_KV_CUH
#define M3_CUDA_KV_CUH

#include "common.cuh"

typedef struct kvdesc {
    uint8_t *base;
    size_t page_bytes, kvpart, rb, irb;
    int page, nkv, D, Di, dt, idt;
    const int32_t *ptab;
    int stride;
} kvdesc;


static inline kvdesc desc(m3_cuda *c, const m3_kv *kv, int layer) {
    kvdesc d;
    d.base = kv->base[layer];
    d.page_bytes = kv->page_bytes[layer];
    d.rb = m3_kv_row_bytes(kv->dt, kv->D);
    d.irb = m3_kv_row_bytes(kv->idt, kv->Di);
    d.kvpart = (size_t)kv->nkv * kv->page * d.rb;
    d.page = kv->page;
    d.nkv = kv->nkv;
    d.D = kv->D;
    d.Di = kv->Di;
    d.dt = kv->dt;
    d.idt = kv->idt;
    d.ptab = c->d_ptab;
    d.stride = c->ptab_stride;
    return d;
}

static __device__ __forceinline__ uint8_t *page_of(const kvdesc &d, int seq, int pos) {
    int pg = d.ptab[(size_t)seq * d.stride + pos / d.page];
    return d.base + (size_t)pg * d.page_bytes;
}

/* element i of a stored row */
static __device__ __forceinline__ float read_el(const uint8_t *row, int dt, int dim, int i) {
    switch (dt) {
    case M3_KV_F32: return ((const float *)row)[i];
    case M3_KV_BF16: return bf16_f32(((const uint16_t *)row)[i]);
    case M3_KV_FP8: return e4m3_f32(row[i]);
    default: return e2m1_f32(e2m1_at(row, i)) * e4m3_f32(row[dim / 2 + i / 16]);
    }
}

/* values [e, e + 8) of a stored row (e % 8 == 0); vector loads where the row is aligned
 * for them (NVFP4 rows of 16 values are 18 bytes long), element loads otherwise */
static __device__ __forceinline__ void read8(const uint8_t *row, int dt, int dim, int e, float *o) {
    const uintptr_t al = (uintptr_t)row & 15;
    if ((dt == M3_KV_F32 && al) || (dt == M3_KV_BF16 && al) || (dt == M3_KV_FP8 && (al & 7))) {
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = read_el(row, dt, dim, e + i);
    } else if (dt == M3_KV_F32) {
        float4 a = *(const float4 *)(row + 4 * e), b = *(const float4 *)(row + 4 * e + 16);
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    } else if (dt == M3_KV_BF16) {
        uint4 q = *(const uint4 *)(row + 2 * e);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) { o[2 * i] = __uint_as_float(u[i] << 16); o[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u); }
    } else if (dt == M3_KV_FP8) {
        uint2 q = *(const uint2 *)(row + e);
        float2 f0 = e4m3x2_f32(q.x & 0xffff), f1 = e4m3x2_f32(q.x >> 16), f2 = e4m3x2_f32(q.y & 0xffff), f3 = e4m3x2_f32(q.y >> 16);
        o[0] = f0.x; o[1] = f0.y; o[2] = f1.x; o[3] = f1.y; o[4] = f2.x; o[5] = f2.y; o[6] = f3.x; o[7] = f3.y;
    } else {
        const uint8_t *cp = row + e / 2;
        uint32_t q = ((uintptr_t)cp & 3) == 0 ? *(const uint32_t *)cp
                                                : (uint32_t)cp[0] | ((uint32_t)cp[1] << 8) | ((uint32_t)cp[2] << 16) | ((uint32_t)cp[3] << 24);
        float s = nvfp4_scale(row[dim / 2 + e / 16]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = e2m1x2_f32((q >> (8 * i)) & 0xff);
            o[2 * i] = f.x * s;
            o[2 * i + 1] = f.y * s;
        }
    }
}

/* values [e, e + 16) of a stored row (e % 16 == 0): NVFP4 as one 8-byte word of codes and
 * one scale, FP8 as one 16-byte word, where aligned; else two read8 */
static __device__ __forceinline__ void read16(const uint8_t *row, int dt, int dim, int e, float *o) {
    if (dt == M3_KV_NVFP4 && (((uintptr_t)row + e / 2) & 7) == 0) {
        uint2 q = *(const uint2 *)(row + e / 2);
        float s = nvfp4_scale(row[dim / 2 + e / 16]);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float2 f = e2m1x2_f32(((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xff);
            o[2 * i] = f.x * s;
            o[2 * i + 1] = f.y * s;
        }
    } else if (dt == M3_KV_FP8 && (((uintptr_t)row + e) & 15) == 0) {
        uint4 q = *(const uint4 *)(row + e);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 a = e4m3x2_f32(u[i] & 0xffff), b = e4m3x2_f32(u[i] >> 16);
            o[4 * i] = a.x; o[4 * i + 1] = a.y; o[4 * i + 2] = b.x; o[4 * i + 3] = b.y;
        }
    } else {
        read8(row, dt, dim, e, o);
        read8(row, dt, dim, e + 8, o + 8);
    }
}

/* threads tid = 0 .. nt - 1 (a block, or a warp) write one row of dim values (NVFP4: one
 * thread per 16-value group) */
static __device__ void write_row(uint8_t *dst, int dt, const float *src, int dim, int tid, int nt) {
    switch (dt) {
    case M3_KV_F32:
        for (int i = tid; i < dim; i += nt) ((float *)dst)[i] = src[i];
        break;
    case M3_KV_BF16:
        for (int i = tid; i < dim; i += nt) ((uint16_t *)dst)[i] = f32_bf16(src[i]);
        break;
    case M3_KV_FP8:
        for (int i = tid; i < dim; i += nt) dst[i] = f32_e4m3(src[i]);
        break;
    default:
        for (int g = tid; g < dim / 16; g += nt) {
            const float *v = src + 16 * g;
            float amax = 0;
            for (int i = 0; i < 16; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
            uint8_t sc = f32_e4m3(amax / 6.0f);
            float s = e4m3_f32(sc);
            dst[dim / 2 + g] = sc;
            for (int i = 0; i < 16; i += 2) {
                uint32_t lo = s == 0 ? 0 : f32_e2m1(v[i] / s), hi = s == 0 ? 0 : f32_e2m1(v[i + 1] / s);
                dst[(16 * g + i) / 2] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
}

#endif
