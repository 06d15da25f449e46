/* Tensor-core GEMV on the GPU for MXFP8 and NVFP4 weights at decode batch sizes (up to 8 tokens).
 * CPU reference: src/backend/cpu/linear.c (m3_cpu_linear; the decoders: formats.c).
 *
 *
 * Why: decoding E2M1 / E4M3 and doing the multiply-adds on the CUDA cores costs more
 * instructions per weight byte than the SMs can issue at HBM speed (the SIMT kernel in
 * linear.cu reaches 12-35% of the copy bandwidth on these formats). Here the weights are
 * decoded to f16 fragments and multiplied with mma.sync m16n8k16 (f32 accumulation):
 *   - the weights are exact in f16: E4M3 values through the hardware converter; NVFP4
 *     values times their E4M3 block scale (at most 6 x 448, 6 significant bits): tiled
 *     weights (the device layout) by shifts and masks of bit-permuted words (nv_pair,
 *     common.cuh; values x 2^-14, put back in the final scale), row-major ones through a
 *     per-lane byte -> f16x2 table in shared memory (one conflict-free load per byte);
 *     MXFP8's E8M0 scale (outside f16's range in general) multiplies the f32 partial sum of
 *     each 32-value group; NVFP4's f32 global scale multiplies the final sum;
 *   - x is split into x_hi = f16(x) and x_lo = f16(x - x_hi) and both are multiplied
 *     (two MMAs), so the products carry ~22 bits of x: results agree with the f32 CPU
 *     kernel to ~1e-6 relative (bench/bench_cuda_linear.c checks it).
 * Work: a warp computes one item, 16 output rows (one MMA M tile) over a slice of K, in
 * "units": NVFP4 a unit is 128 values (each lane of a quad loads 16 bytes of row g and of
 * row g + 8), MXFP8 one 32-value scale group (8 bytes per lane). Inside a unit, logical MMA
 * k index (2t, 2t+1, 2t+8, 2t+9) of lane t of a quad maps to 4 consecutive physical values
 * of that lane's bytes; x fragments use the same map. CTAs are persistent (as many as fit,
 * each builds the NVFP4 table once) and take items in turn; the K slices per tile are
 * chosen so that the items fill the resident warps in whole rounds. A tile split over K is
 * summed by the warp that completes it, in slice order (deterministic, no second launch).
 * Up to 4 tokens, x_hi and x_lo ride in the MMA's N columns (token t: columns 2t, 2t+1),
 * one MMA per k16; 5-8 tokens take two MMAs. One launch may hold several matrices with the
 * same input (q, k, v and the indexer's projections) or every slot's expert (MoE). Plain
 * MXFP8 matrices at 5-8 tokens go through k_gemv_mma_mxfp8_xshared instead: the CTA's warps share each stage's x. */
#include "linear_mma.cuh"
#include "ptx.cuh"

static __device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
    __half2 r = __hmul2(*(__half2 *)&a, *(__half2 *)&b);
    return *(uint32_t *)&r;
}

static __device__ __forceinline__ uint32_t lds_u32(uint32_t a) {
    uint32_t v;
    asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}


/* weight loads: read-only path, no L1 allocation (streamed once), and with l2h the L2 fetching
 * 256-byte blocks (a row's next units arrive with the first) */
static __device__ __forceinline__ uint4 ldw4(const void *p, int l2h) {
    uint4 v;
    if (l2h)
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else
        v = __ldg((const uint4 *)p);
    return v;
}
static __device__ __forceinline__ uint2 ldw2(const void *p, int l2h) {
    uint2 v;
    if (l2h)
        asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    else
        v = __ldg((const uint2 *)p);
    return v;
}

/* Hopper's bulk L2 prefetch (TMA unit): bytes at p (16-byte aligned, a multiple of 16) start
 * moving from HBM to L2 without registers or shared memory */
static __device__ __forceinline__ void l2_prefetch(const void *p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

/* Units [u0, u1) of the 16 rows from n0 (clipped to [.., c1)): lanes 0-15 prefetch a row's
 * values, lanes 16-31 its scales (rounded out to 16 bytes: allocations are 256-byte granular) */
template <int F>
static __device__ __forceinline__ void gv_prefetch(const m3_linear *W, int n0, int u0, int u1, int c1, int lane) {
    if (u1 > c1) u1 = c1;
    if (u0 >= u1) return;
    const int r = n0 + (lane & 15) < W->N ? n0 + (lane & 15) : W->N - 1;
    const int vb = F == M3_WF_NVFP4 ? 64 : 32, sb = F == M3_WF_NVFP4 ? 8 : 1; /* bytes per unit: values, scales */
    if (W->tiled) { /* the slice is one run of values and one of scales */
        if (lane == 0) l2_prefetch(W->w + (size_t)(n0 >> 4) * 16 * W->row_bytes + (size_t)u0 * 16 * vb, (uint32_t)(u1 - u0) * 16 * vb);
        if (lane == 1) { /* (MXFP8 scales go by 4 units: wt_soff) */
            const uint8_t *ts = W->scale + (size_t)(n0 >> 4) * 16 * W->scale_row;
            const int s0 = F == M3_WF_NVFP4 ? u0 : u0 & ~3, s1 = F == M3_WF_NVFP4 ? u1 : (u1 + 3) & ~3;
            const uintptr_t a = (uintptr_t)(ts + (size_t)s0 * 16 * sb) & ~(uintptr_t)15;
            const uintptr_t e = ((uintptr_t)(ts + (size_t)s1 * 16 * sb) + 15) & ~(uintptr_t)15;
            l2_prefetch((const void *)a, (uint32_t)(e - a));
        }
        return;
    }
    if (lane < 16) {
        l2_prefetch(W->w + (size_t)r * W->row_bytes + (size_t)u0 * vb, (uint32_t)(u1 - u0) * vb);
    } else {
        const uintptr_t a = (uintptr_t)(W->scale + (size_t)r * W->scale_row + (size_t)u0 * sb) & ~(uintptr_t)15;
        const uintptr_t e = ((uintptr_t)(W->scale + (size_t)r * W->scale_row + (size_t)u1 * sb) + 15) & ~(uintptr_t)15;
        l2_prefetch((const void *)a, (uint32_t)(e - a));
    }
}

/* The MMAs of one NVFP4 unit (128 values of rows g and g + 8): qa / qb this lane's 16 bytes
 * of each row, s2a / s2b its two E4M3 block scales; B fragments from xp (and xq, non-HL) at
 * value v0 (use: this lane's column holds a token; one guard for the unit's loads).
 * BITS (tiled weights): codes to f16 by nv_pair, values x 2^-14 (the caller's final scale
 * puts 2^14 back; times the E4M3 scale they stay exact in f16, subnormals included). Else
 * through the per-lane table: a byte permute and an address add per byte (lut[byte][lane],
 * 128 bytes per byte value). */
template <int HL, int BITS>
static __device__ __forceinline__ void nvfp4_unit(uint4 qa, uint4 qb, uint32_t s2a, uint32_t s2b, const uint32_t *my,
                                                  const uint16_t *xp, const uint16_t *xq, int v0, bool use, float acc[4]) {
    uint32_t sca[2], scb[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        sca[h] = e4m3x2_h2(__byte_perm(s2a, 0, 0x4400 | h * 0x11u));
        scb[h] = e4m3x2_h2(__byte_perm(s2b, 0, 0x4400 | h * 0x11u));
    }
    /* the unit's B fragments: 32 consecutive f16 of x from v0 (MMA s uses xb[2s], xb[2s + 1]) */
    uint32_t xb[16], xlb[HL ? 1 : 16];
#pragma unroll
    for (int i = 0; i < 16; i++) { xb[i] = 0; if (!HL) xlb[i] = 0; }
    if (use) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 v = __ldg((const uint4 *)(xp + v0) + i);
            xb[4 * i] = v.x; xb[4 * i + 1] = v.y; xb[4 * i + 2] = v.z; xb[4 * i + 3] = v.w;
            if (!HL) {
                const uint4 l = __ldg((const uint4 *)(xq + v0) + i);
                xlb[4 * i] = l.x; xlb[4 * i + 1] = l.y; xlb[4 * i + 2] = l.z; xlb[4 * i + 3] = l.w;
            }
        }
    }
    const uint32_t wa4[4] = {qa.x, qa.y, qa.z, qa.w}, wb4[4] = {qb.x, qb.y, qb.z, qb.w};
    const uint32_t lb = BITS ? 0u : (uint32_t)__cvta_generic_to_shared(my); /* this lane's column of the table */
#define NV_LUT(w, k) lds_u32(lb + (__byte_perm((w), 0, 0x4440u | (k)) << 7))
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const uint32_t wA = wa4[s >> 1], wB = wb4[s >> 1];
        uint32_t a0, a1, a2, a3;
        if (BITS) {
            a0 = hmul2((s & 1) ? nv_pair<2>(wA) : nv_pair<0>(wA), sca[s >> 2]);
            a2 = hmul2((s & 1) ? nv_pair<3>(wA) : nv_pair<1>(wA), sca[s >> 2]);
            a1 = hmul2((s & 1) ? nv_pair<2>(wB) : nv_pair<0>(wB), scb[s >> 2]);
            a3 = hmul2((s & 1) ? nv_pair<3>(wB) : nv_pair<1>(wB), scb[s >> 2]);
        } else {
            const int k0 = (s & 1) * 2;
            a0 = hmul2(NV_LUT(wA, k0), sca[s >> 2]);
            a2 = hmul2(NV_LUT(wA, k0 + 1), sca[s >> 2]);
            a1 = hmul2(NV_LUT(wB, k0), scb[s >> 2]);
            a3 = hmul2(NV_LUT(wB, k0 + 1), scb[s >> 2]);
        }
        mma16816(acc, a0, a1, a2, a3, xb[2 * s], xb[2 * s + 1]);
        if (!HL) mma16816(acc, a0, a1, a2, a3, xlb[2 * s], xlb[2 * s + 1]);
    }
#undef NV_LUT
}

/* The MMAs of one MXFP8 unit (a 32-value scale group of rows g and g + 8): qa / qb this lane's
 * 8 bytes of each row, ea / eb their E8M0 scales (applied to the f32 partial sums); b the unit's
 * x fragment (x_hi, or the HL pairs), bl x_lo's (non-HL) */
template <int HL>
static __device__ __forceinline__ void mxfp8_unit_x(uint2 qa, uint2 qb, float fa, float fb, uint4 b, uint4 bl, float acc[4]) {
    float t[4] = {0, 0, 0, 0};
    uint32_t a0 = e4m3x2_h2(qa.x & 0xffff), a2 = e4m3x2_h2(qa.x >> 16);
    uint32_t a1 = e4m3x2_h2(qb.x & 0xffff), a3 = e4m3x2_h2(qb.x >> 16);
    mma16816(t, a0, a1, a2, a3, b.x, b.y);
    if (!HL) mma16816(t, a0, a1, a2, a3, bl.x, bl.y);
    a0 = e4m3x2_h2(qa.y & 0xffff);
    a2 = e4m3x2_h2(qa.y >> 16);
    a1 = e4m3x2_h2(qb.y & 0xffff);
    a3 = e4m3x2_h2(qb.y >> 16);
    mma16816(t, a0, a1, a2, a3, b.z, b.w);
    if (!HL) mma16816(t, a0, a1, a2, a3, bl.z, bl.w);
    acc[0] += t[0] * fa;
    acc[1] += t[1] * fa;
    acc[2] += t[2] * fb;
    acc[3] += t[3] * fb;
}
/* the same loading the x fragments at value v0 (use: this lane's column holds a token) */
template <int HL>
static __device__ __forceinline__ void mxfp8_unit(uint2 qa, uint2 qb, uint32_t ea, uint32_t eb, const uint16_t *xp,
                                                  const uint16_t *xq, int v0, bool use, float acc[4]) {
    uint4 b = make_uint4(0, 0, 0, 0), bl = b;
    if (use) {
        b = __ldg((const uint4 *)(xp + v0));
        if (!HL) bl = __ldg((const uint4 *)(xq + v0));
    }
    mxfp8_unit_x<HL>(qa, qb, e8m0_f32(ea), e8m0_f32(eb), b, bl, acc);
}

/* The K range [c0, c1) (in units) of 16 rows from n0 against the B column of this lane (x row
 * xrow, -1 for none): HL (T <= 4): column g is token g/2, x_hi for even g and x_lo for odd g,
 * one MMA per k16; otherwise column g is token g and x_hi, x_lo go through two MMAs. */
template <int F, int HL, int UB>
static __device__ __forceinline__ void gv_tile(const m3_linear *W, const uint16_t *xh, const uint16_t *xl, int xstride,
                                               int xrow, int n0, int c0, int c1, const uint32_t *my, int g, int tig,
                                               float acc[4], int l2h) {
    const int N = W->N;
    const int UBY = F == M3_WF_NVFP4 ? 64 : 32, SBY = F == M3_WF_NVFP4 ? 8 : 1; /* bytes per unit of a row */
    const uint8_t *wa, *wb, *sa, *sb;
    int us, ss; /* bytes from one unit of a row to its next */
    if (W->tiled) { /* the tile's units are contiguous [16 rows][UBY] blocks (common.cuh) */
        const uint8_t *tv = W->w + (size_t)(n0 >> 4) * 16 * W->row_bytes, *ts = W->scale + (size_t)(n0 >> 4) * 16 * W->scale_row;
        wa = tv + g * UBY;
        wb = tv + (g + 8) * UBY;
        sa = ts + g * (F == M3_WF_NVFP4 ? SBY : 4); /* MXFP8: scales by 4 units (wt_soff) */
        sb = ts + (g + 8) * (F == M3_WF_NVFP4 ? SBY : 4);
        us = 16 * UBY;
        ss = 16 * SBY;
    } else {
        const int ra = n0 + g < N ? n0 + g : N - 1, rb = n0 + g + 8 < N ? n0 + g + 8 : N - 1;
        wa = W->w + (size_t)ra * W->row_bytes;
        wb = W->w + (size_t)rb * W->row_bytes;
        sa = W->scale + (size_t)ra * W->scale_row;
        sb = W->scale + (size_t)rb * W->scale_row;
        us = UBY;
        ss = SBY;
    }
    const bool use = xrow >= 0; /* this lane's B column holds x row xrow (else row 0's: never stored) */
    const uint16_t *xp = (HL && (g & 1) ? xl : xh) + (size_t)(use ? xrow : 0) * xstride;
    const uint16_t *xq = xl + (size_t)(use ? xrow : 0) * xstride; /* non-HL: the lo half */
    acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    if (F == M3_WF_NVFP4) {
        const int UV = 128;
        for (int u0 = c0; u0 < c1; u0 += UB) {
            uint4 qa[UB], qb[UB];
            uint32_t s2a[UB], s2b[UB];
#pragma unroll
            for (int j = 0; j < UB; j++) {
                const int u = u0 + j < c1 ? u0 + j : c1 - 1;
                qa[j] = ldw4(wa + (size_t)u * us + 16 * tig, l2h);
                qb[j] = ldw4(wb + (size_t)u * us + 16 * tig, l2h);
                s2a[j] = __ldg((const uint16_t *)(sa + (size_t)u * ss + 2 * tig));
                s2b[j] = __ldg((const uint16_t *)(sb + (size_t)u * ss + 2 * tig));
            }
#pragma unroll
            for (int j = 0; j < UB; j++) {
                if (u0 + j >= c1) break;
                if (W->tiled)
                    nvfp4_unit<HL, 1>(qa[j], qb[j], s2a[j], s2b[j], my, xp, xq, (u0 + j) * UV + 32 * tig, use, acc);
                else
                    nvfp4_unit<HL, 0>(qa[j], qb[j], s2a[j], s2b[j], my, xp, xq, (u0 + j) * UV + 32 * tig, use, acc);
            }
        }
    } else { /* MXFP8: a unit is one 32-value scale group; 8 bytes per lane per row */
        const int UV = 32;
        for (int u0 = c0; u0 < c1; u0 += 2 * UB) {
            uint2 qa[2 * UB], qb[2 * UB];
            uint32_t ea[2 * UB], eb[2 * UB];
#pragma unroll
            for (int j = 0; j < 2 * UB; j++) {
                const int u = u0 + j < c1 ? u0 + j : c1 - 1;
                qa[j] = ldw2(wa + (size_t)u * us + 8 * tig, l2h);
                qb[j] = ldw2(wb + (size_t)u * us + 8 * tig, l2h);
                const size_t so = W->tiled ? (size_t)(u >> 2) * 64 + (u & 3) : (size_t)u * ss;
                ea[j] = __ldg(sa + so);
                eb[j] = __ldg(sb + so);
            }
#pragma unroll
            for (int j = 0; j < 2 * UB; j++) {
                if (u0 + j >= c1) break;
                mxfp8_unit<HL>(qa[j], qb[j], ea[j], eb[j], xp, xq, (u0 + j) * UV + 8 * tig, use, acc);
            }
        }
    }
}

/* ------------------------------------------------------------------ pipelined weights
 * The same tile with the weights streamed through a per-warp ring of GP_NS shared-memory
 * stages by cp.async (no registers hold bytes in flight: each warp keeps GP_NS - 1 stages
 * requested while it computes). Tiled weights only: a stage (SU units of the 16 rows: 2 KB of
 * values + their scales) is one contiguous piece of the tile, copied as it lies; the fragment
 * reads from it are free of bank conflicts in that order. */
#define GP_NS 3 /* 4: 2.323 against 2.257 ms (8 layers): the smaller ring leaves L1 room for x */
#define GV_PIPE_CTAS 3 /* resident CTAs per SM the pipelined kernels are built for (registers) */
template <int F> struct gp {
    enum {
        SU = F == M3_WF_NVFP4 ? 2 : 4,        /* units per stage */
        SCB = F == M3_WF_NVFP4 ? 256 : 64,    /* scale bytes per stage */
        STAGE = 2048 + SCB,                   /* bytes per stage */
        WARP = GP_NS * STAGE                  /* ring bytes per warp */
    };
};
/* cp_async16, cp_commit, cp_wait: ptx.cuh */


/* The MMAs of one tiled NVFP4 unit from the ring: qa / qb this lane's 16 bytes of rows g and
 * g + 8, sa / sb their two E4M3 block scales as f16x2 (block 2 tig, 2 tig + 1), xb (and xlb,
 * non-HL) the unit's B fragments (MMA s uses xb[2s], xb[2s + 1]). */
template <int HL>
static __device__ __forceinline__ void nvfp4_unit_t(uint4 qa, uint4 qb, uint32_t sa, uint32_t sb, const uint32_t *xb,
                                                    const uint32_t *xlb, float acc[4]) {
    const uint32_t wa4[4] = {qa.x, qa.y, qa.z, qa.w}, wb4[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const uint32_t wA = wa4[s >> 1], wB = wb4[s >> 1];
        uint32_t a0, a1, a2, a3;
        if (s < 4) {
            a0 = hmul2_bc<0>((s & 1) ? nv_pair<2>(wA) : nv_pair<0>(wA), sa);
            a2 = hmul2_bc<0>((s & 1) ? nv_pair<3>(wA) : nv_pair<1>(wA), sa);
            a1 = hmul2_bc<0>((s & 1) ? nv_pair<2>(wB) : nv_pair<0>(wB), sb);
            a3 = hmul2_bc<0>((s & 1) ? nv_pair<3>(wB) : nv_pair<1>(wB), sb);
        } else {
            a0 = hmul2_bc<1>((s & 1) ? nv_pair<2>(wA) : nv_pair<0>(wA), sa);
            a2 = hmul2_bc<1>((s & 1) ? nv_pair<3>(wA) : nv_pair<1>(wA), sa);
            a1 = hmul2_bc<1>((s & 1) ? nv_pair<2>(wB) : nv_pair<0>(wB), sb);
            a3 = hmul2_bc<1>((s & 1) ? nv_pair<3>(wB) : nv_pair<1>(wB), sb);
        }
        mma16816(acc, a0, a1, a2, a3, xb[2 * s], xb[2 * s + 1]);
        if (!HL) mma16816(acc, a0, a1, a2, a3, xlb[2 * s], xlb[2 * s + 1]);
    }
}

/* Where an item's stages lie in the tiled weights: the first stage's values and scales (lane 0's
 * piece; lane l reads 16 l bytes further) and the stage count of K range [c0, c1) of 16 rows from n0 */
struct gv_run {
    const uint8_t *v, *s;
    int nst;
};
template <int F>
static __device__ __forceinline__ gv_run gv_run_of(const m3_linear *W, int n0, int c0, int c1) {
    constexpr int UBY = F == M3_WF_NVFP4 ? 64 : 32, SBY = F == M3_WF_NVFP4 ? 8 : 1;
    gv_run r;
    r.v = W->w + (size_t)(n0 >> 4) * 16 * W->row_bytes + (size_t)c0 * 16 * UBY;
    r.s = W->scale + (size_t)(n0 >> 4) * 16 * W->scale_row + (size_t)c0 * 16 * SBY;
    r.nst = (c1 - c0) / gp<F>::SU;
    return r;
}

/* The tile's K range [c0, c1) (multiples of SU units) through the ring. Everything the loop
 * needs is computed once: the slice's value and scale runs (this lane's 16-byte pieces), the
 * ring slots, and this lane's x pointers. A lane without a token (xrow < 0) loads no x and
 * multiplies zeros: its loads stay predicated off, because a 16-byte load costs an L1
 * wavefront per quarter warp with an active lane (one token: one quarter instead of four;
 * loading anyway made verify(8) 4.52 -> 4.78 ms).
 * The ring runs on from item to item: rd is the slot the item's first stage is read from (the
 * slot after the last one read), and when primed its first GP_NS - 1 stages were requested by
 * the item before, one commit group each. nx: the warp's next item (nst 0: none); when this
 * item has at least GP_NS - 1 stages, the next item's first GP_NS - 1 stages are requested in
 * place of this item's past-the-end ones, and it returns true (the next item is primed).
 * Without that a warp has nothing in flight at each item's start for a memory latency; the
 * other warps of the SM cover most of it (measured: ~1% of a step at 8 tokens). */
template <int F, int HL>
static __device__ __forceinline__ bool gv_tile_p(const gv_run cur, const gv_run nx, bool primed, int &rd, const uint16_t *xh,
                                                 const uint16_t *xl, int xstride, int xrow, int c0, int g, int tig,
                                                 float acc[4], uint8_t *ring) {
    constexpr int SU = gp<F>::SU, STAGE = gp<F>::STAGE, SCB = gp<F>::SCB;
    constexpr int UV = F == M3_WF_NVFP4 ? 128 : 32;
    constexpr int XL = F == M3_WF_NVFP4 ? 32 : 8; /* x values per lane per unit */
    const int lane = 4 * g + tig, nst = cur.nst;
    const uint8_t *vsrc = cur.v + lane * 16, *ssrc = cur.s + lane * 16;
    const bool scl = lane < SCB / 16;
    const uint32_t rdst = (uint32_t)__cvta_generic_to_shared(ring) + lane * 16; /* this lane's pieces of slot 0 */
    const bool use = xrow >= 0;
    const size_t xo = (size_t)(use ? xrow : 0) * xstride + (size_t)c0 * UV + XL * tig;
    const uint16_t *xp = (HL && (g & 1) ? xl : xh) + xo, *xq = xl + xo;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    int wr = rd; /* the slot refilled next */
#pragma unroll
    for (int st = 0; st < GP_NS - 1; st++) {
        if (!primed) {
            if (st < nst) {
#pragma unroll
                for (int i = 0; i < 4; i++) cp_async16(rdst + wr * STAGE + i * 512, vsrc + (size_t)st * 2048 + i * 512);
                if (scl) cp_async16(rdst + wr * STAGE + 2048, ssrc + (size_t)st * SCB);
            }
            cp_commit();
        }
        wr = wr == GP_NS - 1 ? 0 : wr + 1;
    }
    const bool ahead = nx.nst > 0 && nst >= GP_NS - 1; /* the next item's first stages follow this one's */
    for (int st = 0; st < nst; st++) {
        cp_wait<GP_NS - 2>(); /* stage st has landed (for this lane's copies) */
        __syncwarp();         /* ... and every lane's; the slot refilled below was read last round */
        const int ns = st + GP_NS - 1, nn = ns - nst; /* the stage requested now: this item's, or the next's nn */
        if (ns < nst) {
#pragma unroll
            for (int i = 0; i < 4; i++) cp_async16(rdst + wr * STAGE + i * 512, vsrc + (size_t)ns * 2048 + i * 512);
            if (scl) cp_async16(rdst + wr * STAGE + 2048, ssrc + (size_t)ns * SCB);
        } else if (ahead && nn < nx.nst) {
            const uint8_t *nv = nx.v + lane * 16, *nsc = nx.s + lane * 16;
#pragma unroll
            for (int i = 0; i < 4; i++) cp_async16(rdst + wr * STAGE + i * 512, nv + (size_t)nn * 2048 + i * 512);
            if (scl) cp_async16(rdst + wr * STAGE + 2048, nsc + (size_t)nn * SCB);
        }
        cp_commit();
        const uint8_t *sb = ring + rd * STAGE;
        if (F == M3_WF_NVFP4) {
#pragma unroll
            for (int ul = 0; ul < 2; ul++) {
                uint32_t xb[16], xlb[HL ? 1 : 16];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint4 v = use ? __ldg((const uint4 *)(xp + ul * 128) + i) : make_uint4(0, 0, 0, 0);
                    xb[4 * i] = v.x; xb[4 * i + 1] = v.y; xb[4 * i + 2] = v.z; xb[4 * i + 3] = v.w;
                    if (!HL) {
                        const uint4 l = use ? __ldg((const uint4 *)(xq + ul * 128) + i) : make_uint4(0, 0, 0, 0);
                        xlb[4 * i] = l.x; xlb[4 * i + 1] = l.y; xlb[4 * i + 2] = l.z; xlb[4 * i + 3] = l.w;
                    }
                }
                const uint8_t *vb = sb + ul * 1024 + 16 * tig;
                const uint4 qa = *(const uint4 *)(vb + g * 64), qb = *(const uint4 *)(vb + (g + 8) * 64);
                const uint32_t s2a = *(const uint16_t *)(sb + 2048 + ul * 128 + g * 8 + 2 * tig);
                const uint32_t s2b = *(const uint16_t *)(sb + 2048 + ul * 128 + (g + 8) * 8 + 2 * tig);
                nvfp4_unit_t<HL>(qa, qb, e4m3x2_h2(s2a), e4m3x2_h2(s2b), xb, xlb, acc);
            }
        } else {
            /* x fragments are requested XG units at a time before their MMAs (5-8 tokens: two, as the
             * stage's four at once spilled registers; hoisting them gained verify(8) 4.75 -> 4.65 ms) */
            constexpr int XG = HL ? 4 : 2;
            const uint32_t ea4 = *(const uint32_t *)(sb + 2048 + 4 * g), eb4 = *(const uint32_t *)(sb + 2048 + 4 * (g + 8));
            float fa[4], fb[4];
            fa[0] = e8_of<0>(ea4); fa[1] = e8_of<1>(ea4); fa[2] = e8_of<2>(ea4); fa[3] = e8_of<3>(ea4);
            fb[0] = e8_of<0>(eb4); fb[1] = e8_of<1>(eb4); fb[2] = e8_of<2>(eb4); fb[3] = e8_of<3>(eb4);
#pragma unroll
            for (int h = 0; h < 4; h += XG) {
                uint4 xv[XG], xw[XG];
#pragma unroll
                for (int i = 0; i < XG; i++) {
                    xv[i] = use ? __ldg((const uint4 *)(xp + (h + i) * 32)) : make_uint4(0, 0, 0, 0);
                    xw[i] = HL || !use ? make_uint4(0, 0, 0, 0) : __ldg((const uint4 *)(xq + (h + i) * 32));
                }
#pragma unroll
                for (int i = 0; i < XG; i++) {
                    const uint8_t *vb = sb + (h + i) * 512 + 8 * tig;
                    const uint2 qa = *(const uint2 *)(vb + g * 32), qb = *(const uint2 *)(vb + (g + 8) * 32);
                    mxfp8_unit_x<HL>(qa, qb, fa[h + i], fb[h + i], xv[i], xw[i], acc);
                }
            }
        }
        rd = rd == GP_NS - 1 ? 0 : rd + 1;
        wr = wr == GP_NS - 1 ? 0 : wr + 1;
        xp += SU * UV;
        xq += SU * UV;
    }
    __syncwarp(); /* the next item's stages overwrite these buffers */
    return ahead;
}

/* What work item `it` computes: its job, matrix, 16-row tile and K slice, and the matrix it reads
 * (W NULL: a group past this step's distinct experts, modes 3 and 4, which computes nothing) */
struct gv_item {
    const gv_job *J;
    const m3_linear *W;
    const int *grp; /* modes 3, 4: expert, count, slots[8] */
    int kslice, t2, tile, mat;
};
static __device__ __forceinline__ gv_item gv_item_of(const gv_args &a, int it) {
    gv_item r;
    int jj = 0;
    while (jj + 1 < a.nj && it >= a.j[jj + 1].item0) jj++;
    r.J = &a.j[jj];
    const int local = it - r.J->item0, ks = r.J->ks;
    r.kslice = local % ks;
    r.t2 = local / ks;
    r.tile = r.t2 % r.J->tiles;
    r.mat = r.t2 / r.J->tiles;
    r.W = &r.J->W;
    r.grp = NULL;
    if (a.moe >= 3) {
        const int gi = a.moe == 3 ? r.mat >> 1 : r.mat;
        if (gi >= a.groups[0]) {
            r.W = NULL;
            return r;
        }
        r.grp = a.groups + 1 + gi * 10;
        const m3_mlp_w *m = &a.tab[r.grp[0]];
        r.W = a.moe == 4 ? &m->down : (r.mat & 1) ? &m->up : &m->gate;
    } else if (a.moe) {
        const m3_mlp_w *m = &a.tab[a.pick[a.moe == 1 ? r.mat >> 1 : r.mat]];
        r.W = a.moe == 2 ? &m->down : (r.mat & 1) ? &m->up : &m->gate;
    }
    return r;
}

/* K slice kslice of ks of W's units (whole stages of SU units through the ring): [c0, c1) */
template <int F, int UB>
static __device__ __forceinline__ void gv_slice(const m3_linear *W, int kslice, int ks, int *c0, int *c1) {
    const int UV = F == M3_WF_NVFP4 ? 128 : 32, SU = UB == 0 ? gp<F>::SU : 1, units = W->K / UV / SU;
    *c0 = SU * (units * kslice / ks); /* (int: units <= K / 32 and ks <= 32; a 64-bit division is a call) */
    *c1 = SU * (units * (kslice + 1) / ks);
}

/* Persistent CTAs; each warp takes items it, it + (warps in the grid), ... A tile split over
 * K writes its partial sums; the warp that completes a tile (arrival counter) adds the
 * partials in slice order, so the result does not depend on which warp finishes last. */
template <int F, int HL, int UB> /* UB 0: weights through the cp.async ring (gv_tile_p) */
__global__ void __launch_bounds__(WPB * 32, UB == 0 ? GV_PIPE_CTAS : !HL ? 2 : 3)
    k_gemv_mma(const __grid_constant__ gv_args a) {
    pdl_trigger(); /* the next GEMV may start fetching its weights */
    extern __shared__ __align__(16) uint8_t smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    if (F == M3_WF_NVFP4 && UB != 0) { /* per-lane byte -> f16x2 table (lane-interleaved: conflict-free), for
                                        * row-major weights (tiled ones are bit-permuted: nv_pair) */
        uint32_t *lut = (uint32_t *)smem;
        for (int i = threadIdx.x; i < 256 * 32; i += blockDim.x) {
            const uint32_t b = (uint32_t)(i >> 5);
            lut[i] = e2m1_f16bits(b & 15) | (e2m1_f16bits(b >> 4) << 16);
        }
        __syncthreads();
    }
    /* Launched early (PDL) while the kernel before still runs: what does not depend on it is done
     * above (the table) and here (a plain matrix's first slice requested into L2); then wait. */
    if (a.moe == 0 && a.pf_first) {
        const int it = blockIdx.x * WPB + warp;
        if (it < a.items) { /* (a plain matrix: the item's decoding reads only the launch's arguments) */
            const gv_item I = gv_item_of(a, it);
            int c0, c1;
            gv_slice<F, UB>(I.W, I.kslice, I.J->ks, &c0, &c1);
            if (I.W->tiled) gv_prefetch<F>(I.W, I.tile * 16, c0, c1, c1, lane);
        }
    }
    pdl_wait();
    const uint32_t *my = (const uint32_t *)smem + lane;
    const int nw = gridDim.x * WPB;
    /* cta_red: the CTA's warps go round by round together (a round: items base .. base + WPB - 1,
     * whole tiles' K slices), their partial sums added in shared memory */
    const bool cred = HL && a.cta_red; /* 1-4 tokens (5-8: registers are short) */
    __shared__ float cred_buf[WPB][8 * 16];
    int ring_rd = 0;     /* the ring slot of the next item's first stage (gv_tile_p) */
    bool primed = false; /* ... and whether its first stages were requested by the item before */
    for (int base = blockIdx.x * WPB; base < a.items; base += nw) {
        const int it0 = base + warp;
        bool live = it0 < a.items;
        if (!live && !cred) break;
        const int it = live ? it0 : base; /* a past-the-end warp of a cta_red round decodes a real item, idles */
        const gv_item I = gv_item_of(a, it);
        const gv_job *J = I.J;
        const int ks = J->ks, kslice = I.kslice, t2 = I.t2, tile = I.tile, mat = I.mat;
        const m3_linear *W = I.W ? I.W : &J->W;
        const uint16_t *xh = J->xh, *xl = J->xl;
        float *y = J->y;
        int ntok = J->T, xrow = -1;
        const int lcol = HL ? g >> 1 : g; /* this lane's B column: token (or group member) */
        const int *grp = I.grp;           /* modes 3, 4: expert, count, slots[8] */
        if (!I.W) { /* fewer distinct experts this step than the bound */
            if (!cred) continue;
            live = false;
        }
        if (!live) {
        } else if (a.moe >= 3) {
            ntok = grp[1];
            xrow = lcol < ntok ? (a.moe == 3 ? grp[2 + lcol] / a.topk : grp[2 + lcol]) : -1;
        } else if (a.moe) {
            const int slot = a.moe == 1 ? mat >> 1 : mat;
            y += (size_t)mat * W->N;
            ntok = 1;
            xrow = lcol < 1 ? (a.moe == 1 ? slot / a.topk : slot) : -1;
        } else {
            xrow = lcol < ntok ? lcol : -1;
        }
        int c0, c1;
        gv_slice<F, UB>(W, kslice, ks, &c0, &c1);
        const int n0 = tile * 16, N = W->N;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (!live) {
        } else if (UB == 0) {
            gv_run nx = {NULL, NULL, 0}; /* this warp's next item, when it computes (its first stages requested early) */
            if (a.xitem && it0 + nw < a.items) {
                const gv_item In = gv_item_of(a, it0 + nw);
                if (In.W) {
                    int n_c0, n_c1;
                    gv_slice<F, UB>(In.W, In.kslice, In.J->ks, &n_c0, &n_c1);
                    nx = gv_run_of<F>(In.W, In.tile * 16, n_c0, n_c1);
                }
            }
            primed = gv_tile_p<F, HL>(gv_run_of<F>(W, n0, c0, c1), nx, primed, ring_rd, xh, xl, J->xstride, xrow, c0, g, tig,
                                      acc, smem + warp * gp<F>::WARP);
        } else
            gv_tile<F, HL, UB ? UB : 1>(W, xh, xl, J->xstride, xrow, n0, c0, c1, my, g, tig, acc, a.l2h);

        /* this lane's results: (row offset, token, value) */
        constexpr int NV = HL ? 2 : 4;
        int rr[4], tt[4];
        float vv[4];
        if (HL) {
            rr[0] = g; tt[0] = tig; vv[0] = acc[0] + acc[1];
            rr[1] = g + 8; tt[1] = tig; vv[1] = acc[2] + acc[3];
        } else {
            rr[0] = g; tt[0] = 2 * tig; vv[0] = acc[0];
            rr[1] = g; tt[1] = 2 * tig + 1; vv[1] = acc[1];
            rr[2] = g + 8; tt[2] = 2 * tig; vv[2] = acc[2];
            rr[3] = g + 8; tt[3] = 2 * tig + 1; vv[3] = acc[3];
        }
        const float gm = F == M3_WF_NVFP4 ? W->gmul * (W->tiled ? 16384.0f : 1.0f) : 1.0f; /* nv_pair: x 2^-14 */
        /* output row of column col: token col (plain), the slot's row (MoE), the member's slot (grouped) */
#define GV_OUT(col) (grp ? y + (size_t)(a.moe == 3 ? 2 * grp[2 + (col)] + (mat & 1) : grp[2 + (col)]) * N \
                         : y + (size_t)(col) * N)
        if (ks == 1) {
#pragma unroll
            for (int i = 0; i < NV; i++)
                if (n0 + rr[i] < N && tt[i] < ntok) GV_OUT(tt[i])[n0 + rr[i]] = vv[i] * gm;
            continue;
        }
        if (cred) { /* the tile's slices are warps warp - kslice .. + ks - 1: the first adds them in slice order */
            if (live)
#pragma unroll
                for (int i = 0; i < NV; i++)
                    if (tt[i] < ntok) cred_buf[warp][tt[i] * 16 + rr[i]] = vv[i];
            __syncthreads();
            if (live && kslice == 0)
#pragma unroll
                for (int i = 0; i < NV; i++) {
                    if (tt[i] >= ntok || n0 + rr[i] >= N) continue;
                    float s = 0;
                    for (int k = 0; k < ks; k++) s += cred_buf[warp + k][tt[i] * 16 + rr[i]];
                    GV_OUT(tt[i])[n0 + rr[i]] = s * gm;
                }
            __syncthreads(); /* the buffer is written again next round */
            continue;
        }
        const int TT = a.moe >= 3 ? 8 : a.moe ? 1 : J->T;
        float *p = J->part + (size_t)t2 * ks * 16 * TT;
#pragma unroll
        for (int i = 0; i < NV; i++)
            if (tt[i] < ntok) p[((size_t)kslice * TT + tt[i]) * 16 + rr[i]] = vv[i];
        /* The arrival releases every lane's partials (ordered before lane 0's release by the warp
         * barrier). No acquire there: an acquire fence invalidates the SM's L1, where the other
         * warps keep x; only the warp that completes the tile acquires. */
        __syncwarp();
        int prev = 0;
        if (lane == 0) prev = atom_add_release(&a.ctr[J->ctr0 + t2], 1);
        prev = __shfl_sync(0xffffffffu, prev, 0);
        if (prev != ks - 1) continue;
        fence_acq_rel(); /* acquire: every other slice's partials are visible now */
#pragma unroll
        for (int i = 0; i < NV; i++) {
            if (tt[i] >= ntok || n0 + rr[i] >= N) continue;
            float s = 0;
            for (int k = 0; k < ks; k++) s += __ldcg(p + ((size_t)k * TT + tt[i]) * 16 + rr[i]);
            GV_OUT(tt[i])[n0 + rr[i]] = s * gm;
        }
        if (lane == 0) a.ctr[J->ctr0 + t2] = 0; /* ready for the next launch (stream order) */
#undef GV_OUT
    }
}

/* x (f32) -> x_hi = f16(x), x_lo = f16(x - x_hi) */
__global__ void k_split_x_f16(const float *x, size_t n, uint16_t *xh, uint16_t *xl, int rb) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        split_store(x[i], xh + i, xl + i, rb);
    }
}

/* ------------------------------------------------------------------ split cache
 * The f16 hi / lo split of an activation buffer is kept while nothing writes the buffer, so
 * the projections sharing an input (q, k, v, index q / k; experts and shared expert) split
 * it once; RMSNorm and SwiGLU write the split themselves (m3_cu_xsplit_claim). Every op that
 * writes memory calls m3_cu_xsplit_touch on what it writes. */

int m3_cu_xsplit_rows(void) {
    static int rows = -1;
    if (rows < 0) rows = m3_cu_env_int("M3_XSPLIT_ROWS", 4 * MOE_GROUP_T);
    return rows;
}

void m3_cu_xsplit_reset(m3_cuda *c) {
    for (int i = 0; i < 2; i++) c->xs[i].src = c->xs_other[i].src = NULL;
}

void m3_cu_xsplit_touch(m3_cuda *c, const void *p, size_t bytes) {
    const char *a = (const char *)p, *b = a + bytes;
    for (int i = 0; i < 2; i++) {
        const char *s = (const char *)c->xs[i].src, *e = s + sizeof(float) * c->xs[i].n;
        if (s && a < e && s < b) c->xs[i].src = NULL;
    }
}

/* a split buffer for the n values at x, to be written by the caller's kernel (hi at the
 * returned pointer, lo n values further); NULL on failure */
uint16_t *m3_cu_xsplit_claim(m3_cuda *c, const float *x, size_t n) {
    m3_cu_xsplit_touch(c, x, sizeof(float) * n);
    int i = c->xs[0].src == NULL ? 0 : c->xs[1].src == NULL ? 1 : c->xs_next;
    c->xs_next = !i;
    uint16_t *b = (uint16_t *)m3_cu_scratch(c, i ? SC_XSPLIT2 : SC_XSPLIT, sizeof(uint16_t) * 2 * n + 64);
    if (!b) return NULL;
    c->xs[i].src = x;
    c->xs[i].n = n;
    c->xs[i].buf = b;
    c->xs_next = !i;
    return b;
}

/* hi / lo halves of the n values at x (split now unless a cached split covers them) */
int m3_cu_xsplit_get(m3_cuda *c, const float *x, size_t n, const uint16_t **xh, const uint16_t **xl) {
    for (int i = 0; i < 2; i++) {
        const float *s = c->xs[i].src;
        if (s && x >= s && x + n <= s + c->xs[i].n) {
            *xh = c->xs[i].buf + (x - s);
            *xl = c->xs[i].buf + c->xs[i].n + (x - s);
            return 0;
        }
    }
    uint16_t *b = m3_cu_xsplit_claim(c, x, n);
    if (!b) return -1;
    unsigned gsz = cdiv(n, 256);
    k_split_x_f16<<<gsz < 4096 ? gsz : 4096, 256, 0, c->st>>>(x, n, b, b + n, c->gemm_bf16);
    if (CK_LAUNCH(c, "split x")) return -1;
    *xh = b;
    *xl = b + n;
    return 0;
}

/* ------------------------------------------------------------------ x shared by a CTA (5-8 tokens)
 * At 5-8 tokens each warp's x fragments (x_hi and x_lo of every token) are twice its weight
 * bytes, and with every warp on its own K slice they come from L2 (L1 hit rate ~50%): the
 * MXFP8 GEMV at 8 tokens took 1.5x its 1-token time. Here the 8 warps of a CTA compute 8
 * tiles of the same K slice, and each stage's x (128 values of 8 tokens, hi and lo: 4 KB) is
 * copied once per CTA into a ring beside the warps' weight rings (one cp.async per thread),
 * then read from shared memory. The warps go stage by stage together (a CTA barrier per
 * stage: the copies have landed, and the slot refilled next was read by everyone). Plain
 * (non-MoE) MXFP8 matrices; work items are (group of 8 tiles over all jobs, K slice). */
#define GX_ROW 288                 /* bytes per x row (token, hi / lo) of a stage: 256 + a pad that keeps the */
#define GX_SLOT (16 * GX_ROW)      /* quarter warps of a 16-byte read on distinct banks; slot: 8 tokens x 2 */
static size_t gvx_smem() { return (size_t)WPB * gp<M3_WF_MXFP8>::WARP + (size_t)GP_NS * GX_SLOT; }

__global__ void __launch_bounds__(WPB * 32, GV_PIPE_CTAS) k_gemv_mma_mxfp8_xshared(const __grid_constant__ gv_args a) {
    pdl_trigger();
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int F = M3_WF_MXFP8, SU = gp<F>::SU, STAGE = gp<F>::STAGE;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    uint8_t *ring = smem + warp * gp<F>::WARP, *xr = smem + WPB * gp<F>::WARP;
    const uint32_t rdst = (uint32_t)__cvta_generic_to_shared(ring) + lane * 16;
    /* this thread's x piece of a stage: row (token, hi / lo), 16 bytes of its 256 */
    const int xrow = threadIdx.x >> 4, xt = xrow >> 1, xpc = threadIdx.x & 15;
    const uint32_t xdst = (uint32_t)__cvta_generic_to_shared(xr) + xrow * GX_ROW + xpc * 16;
    const gv_job *J0 = &a.j[0];
    const int T = J0->T, ks = J0->ks, K = J0->W.K, units = K / 32 / SU;
    const bool xcopy = xt < T;
    const uint16_t *xsrc = (xrow & 1 ? J0->xl : J0->xh) + (size_t)(xcopy ? xt : 0) * J0->xstride + xpc * 8;
    const bool use = g < T; /* this lane's B column: token g */
    int ntiles = 0;
    for (int j = 0; j < a.nj; j++) ntiles += a.j[j].tiles;
    pdl_wait();
    for (int it = blockIdx.x; it < a.items; it += gridDim.x) {
        const int kslice = it % ks, gt = (it / ks) * WPB + warp; /* this warp's tile over all jobs */
        const bool valid = gt < ntiles;
        int jj = 0;
        while (jj + 1 < a.nj && gt >= a.j[jj + 1].item0) jj++;
        const gv_job *J = &a.j[jj];
        const int tile = valid ? gt - J->item0 : 0;
        const int c0 = SU * (int)((long)units * kslice / ks), c1 = SU * (int)((long)units * (kslice + 1) / ks);
        const int nst = (c1 - c0) / SU, n0 = tile * 16;
        const uint8_t *vsrc = J->W.w + (size_t)(n0 >> 4) * 16 * J->W.row_bytes + (size_t)c0 * 16 * 32 + lane * 16;
        const uint8_t *ssrc = J->W.scale + (size_t)(n0 >> 4) * 16 * J->W.scale_row + (size_t)c0 * 16 + lane * 16;
        const bool scl = lane < gp<F>::SCB / 16;
        const uint16_t *xs = xsrc + (size_t)c0 * 32;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        __syncthreads(); /* the previous item's stages are read by every warp */
#pragma unroll
        for (int st = 0; st < GP_NS - 1; st++) {
            if (st < nst) {
                if (valid) {
#pragma unroll
                    for (int i = 0; i < 4; i++) cp_async16(rdst + st * STAGE + i * 512, vsrc + (size_t)st * 2048 + i * 512);
                    if (scl) cp_async16(rdst + st * STAGE + 2048, ssrc + (size_t)st * 64);
                }
                if (xcopy) cp_async16(xdst + st * GX_SLOT, xs + (size_t)st * 128);
            }
            cp_commit();
        }
        int rd = 0, wr = GP_NS - 1;
        for (int st = 0; st < nst; st++) {
            cp_wait<GP_NS - 2>(); /* this thread's copies of stage st have landed */
            __syncthreads();      /* ... and every thread's; the slot refilled below was read by all */
            if (st + GP_NS - 1 < nst) {
                const size_t nx = (size_t)(st + GP_NS - 1);
                if (valid) {
#pragma unroll
                    for (int i = 0; i < 4; i++) cp_async16(rdst + wr * STAGE + i * 512, vsrc + nx * 2048 + i * 512);
                    if (scl) cp_async16(rdst + wr * STAGE + 2048, ssrc + nx * 64);
                }
                if (xcopy) cp_async16(xdst + wr * GX_SLOT, xs + nx * 128);
            }
            cp_commit();
            if (valid) {
                const uint8_t *sb = ring + rd * STAGE, *xb = xr + rd * GX_SLOT + (2 * g) * GX_ROW + 16 * tig;
                const uint32_t ea4 = *(const uint32_t *)(sb + 2048 + 4 * g), eb4 = *(const uint32_t *)(sb + 2048 + 4 * (g + 8));
                float fa[4], fb[4];
                fa[0] = e8_of<0>(ea4); fa[1] = e8_of<1>(ea4); fa[2] = e8_of<2>(ea4); fa[3] = e8_of<3>(ea4);
                fb[0] = e8_of<0>(eb4); fb[1] = e8_of<1>(eb4); fb[2] = e8_of<2>(eb4); fb[3] = e8_of<3>(eb4);
#pragma unroll
                for (int ul = 0; ul < 4; ul++) {
                    const uint4 xv = use ? *(const uint4 *)(xb + ul * 64) : make_uint4(0, 0, 0, 0);
                    const uint4 xw = use ? *(const uint4 *)(xb + GX_ROW + ul * 64) : make_uint4(0, 0, 0, 0);
                    const uint8_t *vb = sb + ul * 512 + 8 * tig;
                    const uint2 qa = *(const uint2 *)(vb + g * 32), qb = *(const uint2 *)(vb + (g + 8) * 32);
                    mxfp8_unit_x<0>(qa, qb, fa[ul], fb[ul], xv, xw, acc);
                }
            }
            rd = rd == GP_NS - 1 ? 0 : rd + 1;
            wr = wr == GP_NS - 1 ? 0 : wr + 1;
        }
        if (!valid) continue;
        /* this lane's results: rows g, g + 8 of tokens 2 tig, 2 tig + 1 (as k_gemv_mma, non-HL) */
        const int N = J->W.N, rr[4] = {g, g, g + 8, g + 8}, tt[4] = {2 * tig, 2 * tig + 1, 2 * tig, 2 * tig + 1};
        if (ks == 1) {
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (n0 + rr[i] < N && tt[i] < T) J->y[(size_t)tt[i] * N + n0 + rr[i]] = acc[i];
            continue;
        }
        float *p = J->part + (size_t)tile * ks * 16 * T;
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (tt[i] < T) p[((size_t)kslice * T + tt[i]) * 16 + rr[i]] = acc[i];
        __syncwarp(); /* as k_gemv_mma: release on arrival, acquire only in the warp that completes the tile */
        int prev = 0;
        if (lane == 0) prev = atom_add_release(&a.ctr[J->ctr0 + tile], 1);
        prev = __shfl_sync(0xffffffffu, prev, 0);
        if (prev != ks - 1) continue;
        fence_acq_rel();
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (tt[i] >= T || n0 + rr[i] >= N) continue;
            float s = 0;
            for (int k = 0; k < ks; k++) s += __ldcg(p + ((size_t)k * T + tt[i]) * 16 + rr[i]);
            J->y[(size_t)tt[i] * N + n0 + rr[i]] = s;
        }
        if (lane == 0) a.ctr[J->ctr0 + tile] = 0;
    }
}

/* ------------------------------------------------------------------ launch planning */

/* the formats and shapes the MMA path takes (else the SIMT kernel runs) */
int m3_cu_mma_ok(const m3_linear *W) {
    if (W->fmt == M3_WF_NVFP4) return W->K % 128 == 0 && W->row_bytes == (size_t)W->K / 2 && W->scale_row == (size_t)W->K / 16 &&
                                      ((uintptr_t)W->w & 15) == 0 && ((uintptr_t)W->scale & 3) == 0;
    if (W->fmt == M3_WF_MXFP8) return W->K % 128 == 0 && W->row_bytes == (size_t)W->K && W->scale_row == (size_t)W->K / 32 &&
                                      ((uintptr_t)W->w & 7) == 0 && ((uintptr_t)W->scale & 3) == 0;
    return 0;
}

/* M3_GV_L2H=0 turns the L2 256-byte fetch hint of the weight loads off (default on) */
static int gv_l2h(void) {
    static int h = -1;
    if (h < 0) h = m3_cu_env_int("M3_GV_L2H", 1) != 0;
    return h;
}

typedef void (*gv_fn)(gv_args);
template <int F, int HL, int UB>
static gv_fn gv_kernel(int dev, int *blocks_per_sm, size_t *smem) {
    /* the shared-memory limit is an attribute of the kernel in each device's context (tensor
     * parallel ranks: one per GPU, on threads of their own) */
    static int nb[64];
    static unsigned long long set; /* devices whose context has the attribute */
    const size_t sm = (F == M3_WF_NVFP4 && UB != 0 ? 32768 : 0) + (UB == 0 ? (size_t)WPB * gp<F>::WARP : 0);
    const unsigned long long bit = 1ull << (dev & 63);
    if (!(__atomic_load_n(&set, __ATOMIC_ACQUIRE) & bit)) {
        if (sm > 48 * 1024) cudaFuncSetAttribute(k_gemv_mma<F, HL, UB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv_mma<F, HL, UB>, WPB * 32, sm) != cudaSuccess || n < 1) n = 1;
        nb[dev & 63] = n;
        __atomic_fetch_or(&set, bit, __ATOMIC_RELEASE);
    }
    *blocks_per_sm = nb[dev & 63];
    *smem = sm;
    return (gv_fn)k_gemv_mma<F, HL, UB>;
}

/* M3_GV_PIPE=0: weights through registers (gv_tile) instead of the cp.async ring */
static int gv_pipe(void) {
    static int p = -1;
    if (p < 0) p = m3_cu_env_int("M3_GV_PIPE", 1) != 0;
    return p;
}

static int gv_piped(const m3_linear *W) { return gv_pipe() && W->tiled && W->K % (W->fmt == M3_WF_NVFP4 ? 256 : 128) == 0; }

static gv_fn gv_pick(int dev, int F, int HL, const m3_linear *W, int *nb, size_t *smem) {
    if (gv_piped(W)) {
        if (F == M3_WF_NVFP4) return HL ? gv_kernel<M3_WF_NVFP4, 1, 0>(dev, nb, smem) : gv_kernel<M3_WF_NVFP4, 0, 0>(dev, nb, smem);
        return HL ? gv_kernel<M3_WF_MXFP8, 1, 0>(dev, nb, smem) : gv_kernel<M3_WF_MXFP8, 0, 0>(dev, nb, smem);
    }
    if (F == M3_WF_NVFP4) {
        return HL ? gv_kernel<M3_WF_NVFP4, 1, 2>(dev, nb, smem) : gv_kernel<M3_WF_NVFP4, 0, 2>(dev, nb, smem);
    }
    return HL ? gv_kernel<M3_WF_MXFP8, 1, 2>(dev, nb, smem) : gv_kernel<M3_WF_MXFP8, 0, 2>(dev, nb, smem);
}

/* k_gemv_mma_mxfp8_xshared with its shared-memory attribute set in this device's context; CTAs per SM in *nb */
static gv_fn gvx_kernel(int dev, int *nb_out, size_t *smem) {
    static int nb[64];
    static unsigned long long set;
    const size_t sm = gvx_smem();
    const unsigned long long bit = 1ull << (dev & 63);
    if (!(__atomic_load_n(&set, __ATOMIC_ACQUIRE) & bit)) {
        cudaFuncSetAttribute(k_gemv_mma_mxfp8_xshared, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv_mma_mxfp8_xshared, WPB * 32, sm) != cudaSuccess || n < 1) n = 1;
        nb[dev & 63] = n;
        __atomic_fetch_or(&set, bit, __ATOMIC_RELEASE);
    }
    *nb_out = nb[dev & 63];
    *smem = sm;
    return (gv_fn)k_gemv_mma_mxfp8_xshared;
}

/* A warp of the pipelined kernel requests its next item's first stages during the item before
 * (gv_tile_p): H100, 16 layers at 8K, the verify of 8 at batch 1 10.89 -> 10.85 ms, decode batch 8
 * 10.88 -> 10.77 ms (docs/PERF.md, session 35); outputs equal to the bit. M3_GV_XITEM=0: each item
 * fills its ring alone */
static int gv_xitem(void) {
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_GV_XITEM", 1) != 0;
    return on;
}

/* M3_GV_XSHARE=0: 5-8 tokens on MXFP8 through k_gemv_mma (each warp loading its own x) */
static int gvx_on(void) {
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_GV_XSHARE", 1) != 0;
    return on;
}

/* K slices per tile: the fewest rounds of resident warps times the units each item reads
 * (+2 units of overhead per item, + rcost for a split summed through global memory: ks not
 * in cred_ok, a bit per ks), items of at least ~512 bytes per row */
static int gv_ks(long tiles, int units, int F, long rw, int su, unsigned cred_ok = 0, double rcost = 0) {
    const int minu = (F == M3_WF_NVFP4 ? 8 : 16) / su;
    int maxks = units / minu;
    if (maxks > 32) maxks = 32;
    if (maxks < 1) maxks = 1;
    int best = 1;
    double bc = 1e300;
    for (int ks = 1; ks <= maxks; ks++) {
        const long rounds = (tiles * ks + rw - 1) / rw;
        const double cost = (double)rounds * ((double)units / ks + (su > 1 ? 3.0 : 2.0) + /* + filling the pipeline */
                                              (ks > 1 && !(cred_ok >> ks & 1) ? rcost : 0.0));
        if (cost < bc - 1e-9) { bc = cost; best = ks; }
    }
    return best;
}

/* fills the jobs' tiles / ks / item0 / ctr0 / part and launches; mats[j] = matrices of job j */
int m3_cu_gv_launch(m3_cuda *c, gv_args *a, int F, int HL, const int *mats) {
    int nb;
    size_t smem;
    /* plain MXFP8 at 5-8 tokens: the CTA's warps share each stage's x (k_gemv_mma_mxfp8_xshared) */
    const int xshare = F == M3_WF_MXFP8 && !HL && a->moe == 0 && gv_piped(&a->j[0].W) && gvx_on();
    gv_fn fn = xshare ? gvx_kernel(c->dev, &nb, &smem) : gv_pick(c->dev, F, HL, &a->j[0].W, &nb, &smem);
    const int SU = gv_piped(&a->j[0].W) ? (F == M3_WF_NVFP4 ? 2 : 4) : 1;
    const long rw = (long)c->sm_count * nb * WPB;
    long tiles = 0;
    for (int j = 0; j < a->nj; j++) {
        a->j[j].tiles = (a->j[j].W.N + 15) / 16;
        tiles += (long)mats[j] * a->j[j].tiles;
    }
    const int UV = F == M3_WF_NVFP4 ? 128 : 32;
    /* K splits whose slices the CTA can add in shared memory (k_gemv_mma, cta_red): ks divides WPB and
     * every job's items fill whole CTAs. M3_GV_CTARED=0: never; M3_GV_REDCOST: the cost model's
     * stages for a split added through global memory (arrival counters, a round trip or two) */
    static int cred_env = -1, rcost_env = -1;
    if (cred_env < 0) cred_env = m3_cu_env_int("M3_GV_CTARED", 1) != 0;
    if (rcost_env < 0) rcost_env = m3_cu_env_int("M3_GV_REDCOST", 4);
    unsigned cred_ok = 0;
    for (int ks = 2; ks <= WPB && cred_env && HL && !xshare && gv_piped(&a->j[0].W); ks *= 2) {
        int ok = WPB % ks == 0;
        for (int j = 0; j < a->nj && ok; j++) ok = (long)mats[j] * a->j[j].tiles * ks % WPB == 0;
        if (ok) cred_ok |= 1u << ks;
    }
    /* k_gemv_mma_mxfp8_xshared: a work item is a group of WPB tiles (one per warp) and a K slice, rw counts CTAs */
    const int ks = xshare ? gv_ks((tiles + WPB - 1) / WPB, a->j[0].W.K / UV / SU, F, rw / WPB, SU)
                          : gv_ks(tiles, a->j[0].W.K / UV / SU, F, rw, SU, cred_ok, cred_ok ? rcost_env : 0);
    a->cta_red = ks > 1 && (cred_ok >> ks & 1);
    size_t part = 0;
    long items = 0, ctr = 0;
    for (int j = 0; j < a->nj; j++) {
        gv_job *J = &a->j[j];
        J->ks = ks;
        J->item0 = (int)(xshare ? ctr : items); /* k_gemv_mma_mxfp8_xshared: the job's first tile over all jobs */
        J->ctr0 = (int)ctr;
        items += (long)mats[j] * J->tiles * ks;
        ctr += (long)mats[j] * J->tiles;
        part += (size_t)mats[j] * J->tiles * ks * 16 * J->T;
    }
    if (xshare) items = (ctr + WPB - 1) / WPB * ks;
    if (ctr > c->ctr_n) { m3_cu_failf(c, "CUDA backend: %ld GEMV tiles in one launch (limit %ld)", ctr, (long)c->ctr_n); return -1; }
    if (ks > 1 && !a->cta_red) {
        float *pb = (float *)m3_cu_scratch(c, SC_TMP, sizeof(float) * part + 256);
        if (!pb) return -1;
        for (int j = 0; j < a->nj; j++) {
            a->j[j].part = pb;
            pb += (size_t)mats[j] * a->j[j].tiles * ks * 16 * a->j[j].T;
        }
    }
    a->items = (int)items;
    a->xitem = gv_xitem();
    a->ctr = c->ctr;
    a->l2h = gv_l2h();
    long grid = xshare ? items : (items + WPB - 1) / WPB;
    if (grid > (long)c->sm_count * nb) grid = (long)c->sm_count * nb;
    const int pdl = m3_cu_pdl_on();
    a->pf_first = pdl;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(WPB * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return CK(c, cudaLaunchKernelEx(&cfg, fn, *a)) ? -1 : 0;
}

/* y_i[T, N_i] = x[T, K] W_i^T for n matrices sharing x (same format and K), T <= 8, on the
 * tensor cores in one launch; -1 when a format / shape is not one this path takes */
int m3_cu_gemv_mma_n(m3_cuda *c, int n, const m3_linear *const *W, const float *x, int T, float *const *y) {
    if (T < 1 || T > 8 || n < 1 || n > GV_MAXJ) return -1;
    for (int i = 0; i < n; i++)
        if (!m3_cu_mma_ok(W[i]) || W[i]->fmt != W[0]->fmt || W[i]->K != W[0]->K || W[i]->tiled != W[0]->tiled) return -1;
    gv_args a;
    memset(&a, 0, sizeof a);
    const uint16_t *xh, *xl;
    if (m3_cu_xsplit_get(c, x, (size_t)T * W[0]->K, &xh, &xl)) return 0;
    int mats[GV_MAXJ];
    for (int i = 0; i < n; i++) {
        a.j[i].W = *W[i];
        a.j[i].xh = xh;
        a.j[i].xl = xl;
        a.j[i].xstride = W[i]->K;
        a.j[i].y = y[i];
        a.j[i].T = T;
        mats[i] = 1;
        m3_cu_xsplit_touch(c, y[i], sizeof(float) * (size_t)T * W[i]->N);
    }
    a.nj = n;
    m3_cu_gv_launch(c, &a, W[0]->fmt, T <= 4, mats);
    return 0;
}

int m3_cu_gemv_mma(m3_cuda *c, const m3_linear *W, const float *x, int T, float *y) {
    return m3_cu_gemv_mma_n(c, 1, &W, x, T, &y);
}
