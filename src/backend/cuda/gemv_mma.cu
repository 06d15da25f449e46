/* Tensor-core GEMV for MXFP8 and NVFP4 weights at decode batch sizes (up to 8 tokens).
 *
 * Why: decoding E2M1 / E4M3 and doing the multiply-adds on the CUDA cores costs more
 * instructions per weight byte than the SMs can issue at HBM speed (the SIMT kernel in
 * gemv.cu reaches 12-35% of the copy bandwidth on these formats). Here the weights are
 * decoded to f16 fragments and multiplied with mma.sync m16n8k16 (f32 accumulation):
 *   - the weights are exact in f16: E4M3 values through the hardware converter; NVFP4
 *     values times their E4M3 block scale (at most 6 x 448, 6 significant bits) through a
 *     per-lane byte -> f16x2 table in shared memory (one conflict-free load per byte);
 *     MXFP8's E8M0 scale (outside f16's range in general) multiplies the f32 partial sum of
 *     each 32-value group; NVFP4's f32 global scale multiplies the final sum;
 *   - x is split into x_hi = f16(x) and x_lo = f16(x - x_hi) and both are multiplied
 *     (two MMAs), so the products carry ~22 bits of x: results agree with the f32 CPU
 *     kernel to ~1e-6 relative (bench/bench_cuda_linear.c checks it).
 * Layout: a CTA owns 16 output rows (one MMA M tile) and a K range; its 8 warps take
 * "units" of K: NVFP4 a unit is 128 values (each lane of a quad loads 16 bytes of row g and
 * of row g + 8), MXFP8 a unit is one 32-value scale group (8 bytes per lane). Inside a
 * unit, logical MMA k index (2t, 2t+1, 2t+8, 2t+9) of lane t of a quad maps to 4
 * consecutive physical values of that lane's bytes; x fragments use the same map. Warps
 * reduce through shared memory; K splits (small N) go through a partial buffer summed in
 * a fixed order (deterministic). */
#include "common.cuh"

#define MW 8 /* warps per CTA */

static __device__ __forceinline__ void mma16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
    __half2 r = __hmul2(*(__half2 *)&a, *(__half2 *)&b);
    return *(uint32_t *)&r;
}
static __device__ __forceinline__ uint32_t e4m3x2_h2(uint32_t two) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* E2M1 code (4 bits) -> f16 bits of its value: 0, 0.5, then 2^(e-1)(1 + m/2) */
static __device__ __forceinline__ uint32_t e2m1_f16bits(uint32_t c) {
    uint32_t m = c & 7, mag = m == 0 ? 0u : m == 1 ? 0x3800u : ((((m >> 1) + 14u) << 10) | ((m & 1u) << 9));
    return mag | ((c & 8u) << 12);
}

typedef struct mma_args {
    m3_linear W;                /* plain launch */
    const m3_mlp_w *tab;        /* MoE: device expert table (else NULL) */
    const int32_t *pick;        /* MoE: expert of each slot */
    int topk;                   /* MoE: slots per token */
    int moe_part;               /* MoE: 0 gate+up (blockIdx.y picks), 2 down */
    const uint16_t *xh, *xl;    /* activations split into f16 hi / lo, rows of xstride values */
    int xstride;
    int T;                      /* tokens (plain) */
    float *y;                   /* output */
    float *part;                /* K-split partials [ksplit][T][N] */
    int ksplit;
} mma_args;

#define UB 2 /* NVFP4 units (MXFP8: 2 UB) whose loads are in flight together per lane */

/* F: M3_WF_MXFP8 or M3_WF_NVFP4; MOE: 0 plain (token columns 0..T-1), 1 expert slots (one token each) */
template <int F, int MOE>
__global__ void __launch_bounds__(MW * 32, 4) k_gemv_mma(mma_args a) {
    extern __shared__ __align__(16) uint8_t smem[];
    uint32_t *lut = (uint32_t *)smem;                 /* NVFP4: [256][32] f16x2 per lane */
    float *red = (float *)(smem + (F == M3_WF_NVFP4 ? 32768 : 0)); /* [MW][32][4] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;

    const m3_linear *W;
    int slot = 0, tok0 = 0;
    if (MOE) {
        slot = blockIdx.z;
        const m3_mlp_w *m = &a.tab[a.pick[slot]];
        W = a.moe_part == 2 ? &m->down : blockIdx.y ? &m->up : &m->gate;
        tok0 = a.moe_part == 2 ? slot : slot / a.topk;
    } else {
        W = &a.W;
    }
    const int N = W->N, K = W->K, n0 = blockIdx.x * 16;
    const int ks = MOE ? 0 : blockIdx.y, nsplit = MOE ? 1 : a.ksplit;
    const int UV = F == M3_WF_NVFP4 ? 128 : 32; /* values per unit */
    const int units = K / UV;
    const int c0 = (int)((long)units * ks / nsplit), c1 = (int)((long)units * (ks + 1) / nsplit);
    /* this warp's contiguous share of the CTA's units */
    const int per = (c1 - c0 + MW - 1) / MW, ub = c0 + warp * per, ue = min(c1, ub + per);
    const int ntok = MOE ? 1 : a.T;

    if (F == M3_WF_NVFP4) {
        for (int i = threadIdx.x; i < 256 * 32; i += blockDim.x) {
            uint32_t b = (uint32_t)(i >> 5);
            lut[i] = e2m1_f16bits(b & 15) | (e2m1_f16bits(b >> 4) << 16);
        }
        __syncthreads();
    }
    const int ra = n0 + g < N ? n0 + g : N - 1, rb = n0 + g + 8 < N ? n0 + g + 8 : N - 1;
    const uint8_t *wa = W->w + (size_t)ra * W->row_bytes, *wb = W->w + (size_t)rb * W->row_bytes;
    const uint8_t *sa = W->scale + (size_t)ra * W->scale_row, *sb = W->scale + (size_t)rb * W->scale_row;
    /* B fragments: token column g (zero when g is not a token) */
    const bool bcol = g < ntok;
    const uint16_t *xhg = a.xh + (size_t)(tok0 + (bcol ? g : 0)) * a.xstride, *xlg = a.xl + (size_t)(tok0 + (bcol ? g : 0)) * a.xstride;
    float acc[4] = {0, 0, 0, 0};

    /* Weight pieces for UB units (NVFP4; 2 UB for MXFP8) are loaded into registers before
     * any is used, so that each lane keeps several 16 / 8-byte loads in flight. */
    const uint32_t *my = lut + lane;
    if (F == M3_WF_NVFP4) {
        for (int u0 = ub; u0 < ue; u0 += UB) {
            uint4 qa[UB], qb[UB];
            uint32_t s2a[UB], s2b[UB];
#pragma unroll
            for (int j = 0; j < UB; j++) {
                int u = u0 + j < ue ? u0 + j : ue - 1;
                int v0 = u * UV + 32 * tig;
                qa[j] = __ldg((const uint4 *)(wa + v0 / 2));
                qb[j] = __ldg((const uint4 *)(wb + v0 / 2));
                s2a[j] = __ldg((const uint16_t *)(sa + v0 / 16));
                s2b[j] = __ldg((const uint16_t *)(sb + v0 / 16));
            }
#pragma unroll
            for (int j = 0; j < UB; j++) {
                if (u0 + j >= ue) break;
                const int v0 = (u0 + j) * UV + 32 * tig;
                uint32_t sca[2], scb[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    sca[h] = e4m3x2_h2(((s2a[j] >> (8 * h)) & 0xff) * 0x101u);
                    scb[h] = e4m3x2_h2(((s2b[j] >> (8 * h)) & 0xff) * 0x101u);
                }
                uint32_t wa4[4] = {qa[j].x, qa[j].y, qa[j].z, qa[j].w}, wb4[4] = {qb[j].x, qb[j].y, qb[j].z, qb[j].w};
#pragma unroll
                for (int s = 0; s < 8; s++) {
                    uint32_t wA = wa4[s >> 1], wB = wb4[s >> 1];
                    const int sh = (s & 1) * 16;
                    uint32_t a0 = hmul2(my[((wA >> sh) & 0xff) << 5], sca[s >> 2]);
                    uint32_t a2 = hmul2(my[((wA >> (sh + 8)) & 0xff) << 5], sca[s >> 2]);
                    uint32_t a1 = hmul2(my[((wB >> sh) & 0xff) << 5], scb[s >> 2]);
                    uint32_t a3 = hmul2(my[((wB >> (sh + 8)) & 0xff) << 5], scb[s >> 2]);
                    uint2 xh = make_uint2(0, 0), xl = xh;
                    if (bcol) { xh = __ldg((const uint2 *)(xhg + v0 + 4 * s)); xl = __ldg((const uint2 *)(xlg + v0 + 4 * s)); }
                    mma16816(acc, a0, a1, a2, a3, xh.x, xh.y);
                    mma16816(acc, a0, a1, a2, a3, xl.x, xl.y);
                }
            }
        }
    } else { /* MXFP8: a unit is one 32-value group; 8 bytes per lane per row */
        for (int u0 = ub; u0 < ue; u0 += 2 * UB) {
            uint2 qa[2 * UB], qb[2 * UB];
            uint32_t ea[2 * UB], eb[2 * UB];
#pragma unroll
            for (int j = 0; j < 2 * UB; j++) {
                int u = u0 + j < ue ? u0 + j : ue - 1;
                int v0 = u * UV + 8 * tig;
                qa[j] = __ldg((const uint2 *)(wa + v0));
                qb[j] = __ldg((const uint2 *)(wb + v0));
                ea[j] = __ldg(sa + u);
                eb[j] = __ldg(sb + u);
            }
#pragma unroll
            for (int j = 0; j < 2 * UB; j++) {
                if (u0 + j >= ue) break;
                const int v0 = (u0 + j) * UV + 8 * tig;
                uint4 xh = make_uint4(0, 0, 0, 0), xl = xh;
                if (bcol) { xh = __ldg((const uint4 *)(xhg + v0)); xl = __ldg((const uint4 *)(xlg + v0)); }
                float t[4] = {0, 0, 0, 0};
                uint32_t a0 = e4m3x2_h2(qa[j].x & 0xffff), a2 = e4m3x2_h2(qa[j].x >> 16);
                uint32_t a1 = e4m3x2_h2(qb[j].x & 0xffff), a3 = e4m3x2_h2(qb[j].x >> 16);
                mma16816(t, a0, a1, a2, a3, xh.x, xh.y);
                mma16816(t, a0, a1, a2, a3, xl.x, xl.y);
                a0 = e4m3x2_h2(qa[j].y & 0xffff); a2 = e4m3x2_h2(qa[j].y >> 16);
                a1 = e4m3x2_h2(qb[j].y & 0xffff); a3 = e4m3x2_h2(qb[j].y >> 16);
                mma16816(t, a0, a1, a2, a3, xh.z, xh.w);
                mma16816(t, a0, a1, a2, a3, xl.z, xl.w);
                float fa = e8m0_f32(ea[j]), fb = e8m0_f32(eb[j]);
                acc[0] += t[0] * fa; acc[1] += t[1] * fa;
                acc[2] += t[2] * fb; acc[3] += t[3] * fb;
            }
        }
    }
    /* reduce the warps: acc[0..1] = row g, tokens 2tig, 2tig+1; acc[2..3] = row g + 8 */
#pragma unroll
    for (int i = 0; i < 4; i++) red[(warp * 32 + lane) * 4 + i] = acc[i];
    __syncthreads();
    if (warp == 0) {
        float r[4] = {0, 0, 0, 0};
        for (int w = 0; w < MW; w++)
#pragma unroll
            for (int i = 0; i < 4; i++) r[i] += red[(w * 32 + lane) * 4 + i];
        const float gm = F == M3_WF_NVFP4 ? W->gmul : 1.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = n0 + g + (i >= 2 ? 8 : 0), t = 2 * tig + (i & 1);
            if (row >= N || t >= ntok) continue;
            float v = r[i] * gm;
            if (MOE) {
                /* gate+up: out [slot][2][N]; down: out [slot][N] */
                size_t o = a.moe_part == 2 ? (size_t)slot * N + row : ((size_t)slot * 2 + blockIdx.y) * N + row;
                a.y[o] = v;
            } else if (nsplit == 1) {
                a.y[(size_t)t * N + row] = v;
            } else {
                a.part[((size_t)ks * a.T + t) * N + row] = v;
            }
        }
    }
}

__global__ void k_sum_parts(const float *part, int ksplit, size_t n, float *y) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0;
        for (int k = 0; k < ksplit; k++) s += part[(size_t)k * n + i];
        y[i] = s;
    }
}

/* x (f32) -> x_hi = f16(x), x_lo = f16(x - x_hi) */
__global__ void k_split_x(const float *x, size_t n, uint16_t *xh, uint16_t *xl) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        __half h = __float2half_rn(v);
        __half l = __float2half_rn(v - __half2float(h));
        xh[i] = *(uint16_t *)&h;
        xl[i] = *(uint16_t *)&l;
    }
}

/* splits rows x[n] into scratch SC_XSPLIT; NULL on failure */
static uint16_t *split_x(m3_cuda *c, const float *x, size_t n) {
    uint16_t *xs = (uint16_t *)m3_cu_scratch(c, SC_XSPLIT, sizeof(uint16_t) * 2 * n + 64);
    if (!xs) return NULL;
    unsigned g = cdiv(n, 256);
    k_split_x<<<g < 4096 ? g : 4096, 256, 0, c->st>>>(x, n, xs, xs + n);
    return CK_LAUNCH(c, "split x") ? NULL : xs;
}

static size_t mma_smem(int F) { return (F == M3_WF_NVFP4 ? 32768 : 0) + sizeof(float) * MW * 32 * 4; }

/* the formats and shapes the MMA path takes (else the SIMT kernel runs) */
int m3_cu_mma_ok(const m3_linear *W) {
    if (W->fmt == M3_WF_NVFP4) return W->K % 128 == 0 && W->row_bytes == (size_t)W->K / 2 && W->scale_row == (size_t)W->K / 16 &&
                                      ((uintptr_t)W->w & 15) == 0 && ((uintptr_t)W->scale & 3) == 0;
    if (W->fmt == M3_WF_MXFP8) return W->K % 128 == 0 && W->row_bytes == (size_t)W->K && W->scale_row == (size_t)W->K / 32 &&
                                      ((uintptr_t)W->w & 7) == 0 && ((uintptr_t)W->scale & 3) == 0;
    return 0;
}

template <int F, int MOE>
static void launch(m3_cuda *c, dim3 grid, const mma_args &a) {
    size_t smem = mma_smem(F);
    static int attr_set = 0; /* per instantiation */
    if (!attr_set) {
        cudaFuncSetAttribute(k_gemv_mma<F, MOE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attr_set = 1;
    }
    k_gemv_mma<F, MOE><<<grid, MW * 32, smem, c->st>>>(a);
}

/* y[T, N] = x[T, K] W^T for T <= 8 on the tensor cores; -1 when the shape is not supported */
int m3_cu_gemv_mma(m3_cuda *c, const m3_linear *W, const float *x, int T, float *y) {
    if (T < 1 || T > 8 || !m3_cu_mma_ok(W)) return -1;
    mma_args a;
    memset(&a, 0, sizeof a);
    uint16_t *xs = split_x(c, x, (size_t)T * W->K);
    if (!xs) return 0;
    a.W = *W;
    a.xh = xs;
    a.xl = xs + (size_t)T * W->K;
    a.xstride = W->K;
    a.T = T;
    a.y = y;
    int groups = (W->N + 15) / 16, UV = W->fmt == M3_WF_NVFP4 ? 128 : 32, units = W->K / UV;
    /* enough CTAs for ~3 per SM; split K (fixed-order sum afterwards) when the rows are few */
    int ks = (3 * c->sm_count + groups - 1) / groups;
    if (ks > units / 4) ks = units / 4;
    if (ks > 16) ks = 16;
    if (ks < 1) ks = 1;
    a.ksplit = ks;
    if (ks > 1) {
        a.part = (float *)m3_cu_scratch(c, SC_TMP, sizeof(float) * (size_t)ks * T * W->N);
        if (!a.part) return 0;
    }
    dim3 grid(groups, ks);
    if (W->fmt == M3_WF_NVFP4) launch<M3_WF_NVFP4, 0>(c, grid, a);
    else launch<M3_WF_MXFP8, 0>(c, grid, a);
    if (CK_LAUNCH(c, "gemv_mma")) return 0;
    if (ks > 1) {
        size_t n = (size_t)T * W->N;
        k_sum_parts<<<cdiv(n, 256) < 4096 ? cdiv(n, 256) : 4096, 256, 0, c->st>>>(a.part, ks, n, y);
        CK_LAUNCH(c, "gemv_mma sum");
    }
    return 0;
}

/* MoE experts of S = T*topk slots: gu[S][2][F] = (gate, up) rows of each slot's expert,
 * or (part 2) ye[S][H] = down rows against h[S][F]. -1 when the format is not supported. */
int m3_cu_moe_mma(m3_cuda *c, const m3_mlp_w *host_e0, const m3_mlp_w *tab, const int32_t *pick, int topk, int S, int part,
                  const float *x, int xstride, float *out) {
    const m3_linear *W = part == 2 ? &host_e0->down : &host_e0->gate;
    if (!m3_cu_mma_ok(W) || (part != 2 && (!m3_cu_mma_ok(&host_e0->up) || host_e0->up.fmt != W->fmt))) return -1;
    mma_args a;
    memset(&a, 0, sizeof a);
    int rows = part == 2 ? S : S / topk; /* x rows: tokens (gate/up) or slots (down) */
    uint16_t *xs = split_x(c, x, (size_t)rows * xstride);
    if (!xs) return 0;
    a.tab = tab;
    a.pick = pick;
    a.topk = topk;
    a.moe_part = part;
    a.xh = xs;
    a.xl = xs + (size_t)rows * xstride;
    a.xstride = xstride;
    a.T = 1;
    a.y = out;
    a.ksplit = 1;
    dim3 grid((W->N + 15) / 16, part == 2 ? 1 : 2, S);
    if (W->fmt == M3_WF_NVFP4) launch<M3_WF_NVFP4, 1>(c, grid, a);
    else launch<M3_WF_MXFP8, 1>(c, grid, a);
    CK_LAUNCH(c, "moe_mma");
    return 0;
}
