/* DSpark draft attention on the GPU (ops.h: dspark_attention): slot i of n (position pos + i),
 * query head h (KV head h / (nh / nkv)): softmax(q k^T / sqrt(D)) v over the context positions
 * [max(lo, pos + i - window + 1), len) - ring slot p % cap of kr / vr [cap][nkv * D] - and over
 * every block key kb / vb [n][nkv * D] (non-causal in the block).
 * Split over the keys (k_dsa_split + k_dsa_combine): a CTA takes one slot, the query heads of one
 * KV head (up to 16, which share its keys: each key and value row is read once for all of
 * them) and DSA_KEYS (64) of the slot's keys, and leaves that chunk's maximum, exp-sum and
 * unnormalized output; the combine rescales the chunks (sums in double). The first version (one
 * CTA per slot and head over every key: each KV row read by all 16 heads of its group) took
 * 1.4 ms a layer at 8 slots over a full 4096-key window; it stays for shapes the split does
 * not take (head_dim not dividing 256, more than 16 heads a group not in 16s). At the M3.1-Flash
 * draft's shapes (D 128, 16 heads a KV head) and from 512 context keys, k_dsa_flash takes every
 * slot (up to 8) in one CTA per run of chunks, on the tensor cores (k_dsa_chunk: one CTA a chunk,
 * more slots, M3_DSA_FLASH=0).
 * CPU reference: src/backend/cpu/attention.c (m3_cpu_dspark_attention, dsa_items). */
#include "backend/dsa_runs.h"
#include "common.cuh"
#include "ptx.cuh"

#define DSA_THREADS 256
#define DSA_BATCH 32 /* requests one launch takes (dspark.h M3_DSPARK_BATCH_MAX) */

__global__ void __launch_bounds__(DSA_THREADS) k_dspark_attention(const float *q, const float *kb, const float *vb, int n, int nh,
                                                                  int nkv, int D, const float *kr, const float *vr, int cap,
                                                                  int lo0, int len, int pos, int window, float scale,
                                                                  float *out) {
    extern __shared__ float sm[]; /* [D] query, [context + n] scores */
    __shared__ float fpart[32];
    __shared__ double dpart[32];
    const int i = blockIdx.x / nh, h = blockIdx.x % nh, g = h / (nh / nkv);
    const size_t kw = (size_t)nkv * D;
    float *qs = sm, *sc = sm + D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[((size_t)i * nh + h) * D + d];
    long lo = (long)pos + i - window + 1;
    if (lo < lo0) lo = lo0;
    const int nc = lo < len ? (int)(len - lo) : 0, ns = nc + n;
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    for (int j = warp; j < ns; j += nw) {
        const float *k = j < nc ? kr + (size_t)((lo + j) % cap) * kw + (size_t)g * D : kb + (size_t)(j - nc) * kw + (size_t)g * D;
        float s = 0;
        for (int d = lane; d < D; d += 32) s += qs[d] * k[d];
        s = warp_sum(s);
        if (lane == 0) sc[j] = s * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < ns; j += blockDim.x) mx = fmaxf(mx, sc[j]);
    mx = block_max_f(mx, fpart);
    double sum = 0;
    for (int j = threadIdx.x; j < ns; j += blockDim.x) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    const float inv = (float)(1.0 / block_sum_d(sum, dpart)); /* its barriers also publish sc */
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0;
        for (int j = 0; j < nc; j++) o += sc[j] * inv * vr[(size_t)((lo + j) % cap) * kw + (size_t)g * D + d];
        for (int b = 0; b < n; b++) o += sc[nc + b] * inv * vb[(size_t)b * kw + (size_t)g * D + d];
        out[((size_t)i * nh + h) * D + d] = o;
    }
}

#define DSA_KEYS 64 /* keys a split CTA takes */
#define DSA_HG 16   /* query heads a split CTA takes at most */
#define DSA_U 8     /* value rows a thread loads ahead */

/* grid (slot, KV head x head groups, key chunk); part [n][nh][nsplit][D + 2]: the chunk's
 * unnormalized output, its maximum score and its exp-sum (empty chunk: -inf, 0). The chunk's
 * key j is context position lo_i + j (ring slot % cap) while j < nc_i, then block key j - nc_i;
 * its rows' offsets are worked out once into shared memory. */
__global__ void __launch_bounds__(DSA_THREADS) k_dsa_split(const float *q, const float *kb, const float *vb, int n, int nh,
                                                           int nkv, int D, int HG, const float *kr, const float *vr, int cap,
                                                           int lo0, int len, int pos, int window, float scale, int nsplit,
                                                           float *part) {
    extern __shared__ float sm[]; /* [HG][D] queries, [HG][DSA_KEYS] scores */
    __shared__ const float *krow[DSA_KEYS], *vrow[DSA_KEYS];
    const int i = blockIdx.x, G = nh / nkv, hgroups = G / HG, g = blockIdx.y / hgroups;
    const int h0 = g * G + (blockIdx.y % hgroups) * HG, z = blockIdx.z;
    const size_t kw = (size_t)nkv * D;
    float *qs = sm, *sc = sm + (size_t)HG * D;
    long lo = (long)pos + i - window + 1;
    if (lo < lo0) lo = lo0;
    const int nc = lo < len ? (int)(len - lo) : 0, ns = nc + n;
    const int j0 = z * DSA_KEYS, cnt = ns - j0 < DSA_KEYS ? ns - j0 : DSA_KEYS;
    const size_t hstride = (size_t)nsplit * (D + 2);
    float *pp = part + ((size_t)i * nh + h0) * hstride + (size_t)z * (D + 2); /* head h0 + hh: + hh * hstride */
    if (cnt <= 0) { /* this slot has fewer keys than slot 0 */
        for (int x = threadIdx.x; x < HG * (D + 2); x += blockDim.x) {
            const int hh = x / (D + 2), d = x % (D + 2);
            pp[hh * hstride + d] = d == D ? -INFINITY : 0.0f;
        }
        return;
    }
    for (int x = threadIdx.x; x < HG * D; x += blockDim.x) qs[x] = q[((size_t)i * nh + h0 + x / D) * D + x % D];
    for (int j = threadIdx.x; j < cnt; j += blockDim.x) {
        const int jj = j0 + j;
        const size_t off = jj < nc ? (size_t)((lo + jj) % cap) * kw : 0;
        krow[j] = (jj < nc ? kr + off : kb + (size_t)(jj - nc) * kw) + (size_t)g * D;
        vrow[j] = (jj < nc ? vr + off : vb + (size_t)(jj - nc) * kw) + (size_t)g * D;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    for (int j = warp; j < cnt; j += nw) { /* a warp per key: its row once, every head's dot product */
        const float *k = krow[j];
        float acc[DSA_HG];
#pragma unroll
        for (int hh = 0; hh < DSA_HG; hh++) acc[hh] = 0;
        for (int d = lane; d < D; d += 32) {
            const float kv = k[d];
#pragma unroll
            for (int hh = 0; hh < DSA_HG; hh++)
                if (hh < HG) acc[hh] += qs[hh * D + d] * kv;
        }
#pragma unroll
        for (int hh = 0; hh < DSA_HG; hh++)
            if (hh < HG) {
                const float v = warp_sum(acc[hh]);
                if (lane == 0) sc[hh * DSA_KEYS + j] = v * scale;
            }
    }
    __syncthreads();
    for (int hh = warp; hh < HG; hh += nw) { /* a warp per head: the chunk's maximum and exp-sum */
        float mx = -INFINITY;
        for (int j = lane; j < cnt; j += 32) mx = fmaxf(mx, sc[hh * DSA_KEYS + j]);
        mx = warp_max(mx);
        float sum = 0;
        for (int j = lane; j < cnt; j += 32) {
            const float e = expf(sc[hh * DSA_KEYS + j] - mx);
            sc[hh * DSA_KEYS + j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            pp[hh * hstride + D] = mx;
            pp[hh * hstride + D + 1] = sum;
        }
    }
    __syncthreads();
    /* the output: thread (set, channel d) over heads set, set + sets, ...; each value row once,
     * DSA_U rows loaded ahead (the loads' latency, not the arithmetic, bounds this loop) */
    const int sets = blockDim.x / D, d = threadIdx.x % D, set = threadIdx.x / D;
    if (set >= sets) return;
    float o[DSA_HG];
#pragma unroll
    for (int k = 0; k < DSA_HG; k++) o[k] = 0;
    for (int j = 0; j < cnt; j += DSA_U) {
        float v[DSA_U];
#pragma unroll
        for (int u = 0; u < DSA_U; u++) v[u] = j + u < cnt ? vrow[j + u][d] : 0.0f;
#pragma unroll
        for (int u = 0; u < DSA_U; u++) {
            if (j + u >= cnt) break;
#pragma unroll
            for (int k = 0; k < DSA_HG; k++) {
                const int hh = set + k * sets;
                if (hh < HG) o[k] += sc[hh * DSA_KEYS + j + u] * v[u];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < DSA_HG; k++) {
        const int hh = set + k * sets;
        if (hh < HG) pp[hh * hstride + d] = o[k];
    }
}

/* Every slot in one CTA per (key chunk, KV head), for D = 128 and 16 query heads a KV head (the
 * M3.1-Flash draft): the chunk's DSA_KEYS key and value rows are staged in shared memory once
 * (k_dsa_split reads them again for each of the n slots, and waits on each key's loads in turn:
 * 345 us a layer at 8 slots over a 4096-key window), then a warp per slot: its 16 query heads are
 * the 16 rows of an m16n8k8 A operand, S = Q K^T as 8 key tiles of 8 and O = P V as 16 channel
 * tiles, each f32 product as three TF32 MMAs (tf32_split: ~f32 accuracy); the same part rows as
 * k_dsa_split for k_dsa_combine. Slot i sees context key j (position lo0 + j) when lo0 + j >= its
 * own window start, and every block key. (H200, 8 slots over a 4096-key window: 103 us a layer
 * with f32 arithmetic on the CUDA cores, 79 us here; 8 requests in one call 473 -> 340 us.) */
#define DSA2_D 128
#define DSA2_G 16
#define DSA2_KP (DSA2_D + 4) /* K rows padded: B fragments' 32 loads hit 32 banks */
#define DSA2_VP (DSA2_D + 8) /* V rows padded: the same */
/* the requests of one launch (blockIdx.z): request r's rows start at row r * n of q, kb, vb and
 * the output; its context keys are lo0 .. lo0 + nc0 (lo0: slot 0's first visible position),
 * nsplit[r] of the launch's chunks are its own (the rest are written empty) */
struct dsa_reqs {
    const float *kr[DSA_BATCH], *vr[DSA_BATCH];
    long lo0[DSA_BATCH];
    int cap[DSA_BATCH], nc0[DSA_BATCH], lo[DSA_BATCH], pos[DSA_BATCH], nsplit[DSA_BATCH];
};

/* a chunk past its request's keys: its slots' part rows for this KV head's query heads empty
 * (maximum -inf, sum 0: k_dsa_combine reads nothing else of them) */
static __device__ __forceinline__ void dsa_empty_chunk(float *part, int n, int nh, int g, size_t hstride, int z) {
    for (int x = threadIdx.x; x < n * DSA2_G; x += DSA_THREADS) {
        float *pp = part + ((size_t)(x / DSA2_G) * nh + (size_t)g * DSA2_G + x % DSA2_G) * hstride + (size_t)z * (DSA2_D + 2);
        pp[DSA2_D] = -INFINITY;
        pp[DSA2_D + 1] = 0.f;
    }
}

/* the chunk's DSA_KEYS key rows from j0 into ks [KEYS][DSA2_KP] and value rows into vs [KEYS][DSA2_VP]
 * (zeros past the ns keys): key j is context position lo0 + j (ring slot % cap) while j < nc0,
 * then block key j - nc0; KV head g's D values of each */
static __device__ __forceinline__ void dsa_stage_rows(const float *kr, const float *vr, const float *kb, const float *vb, long lo0,
                                                      int cap, int nc0, int ns, int j0, int g, size_t kw, float *ks, float *vs) {
    for (int x = threadIdx.x; x < DSA_KEYS * (DSA2_D / 4); x += DSA_THREADS) {
        const int j = x / (DSA2_D / 4), c4 = (x % (DSA2_D / 4)) * 4, jj = j0 + j;
        float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
        if (jj < ns) {
            const size_t off = (jj < nc0 ? (size_t)((lo0 + jj) % cap) * kw : 0) + (size_t)g * DSA2_D + c4;
            const float *kp = jj < nc0 ? kr + off : kb + (size_t)(jj - nc0) * kw + (size_t)g * DSA2_D + c4;
            const float *vp = jj < nc0 ? vr + off : vb + (size_t)(jj - nc0) * kw + (size_t)g * DSA2_D + c4;
            kv = *(const float4 *)kp;
            vv = *(const float4 *)vp;
        }
        *(float4 *)(ks + j * DSA2_KP + c4) = kv;
        *(float4 *)(vs + j * DSA2_VP + c4) = vv;
    }
}

/* a TF32 split of x (three MMAs make an f32 product): rounding conversions, or TRUNC truncation */
template <bool TRUNC> static __device__ __forceinline__ void dsa_split(float x, uint32_t *big, uint32_t *small) {
    if (TRUNC) tf32_split_trunc(x, big, small);
    else tf32_split(x, big, small);
}

/* S = Q K^T of one chunk for a warp's 16 query heads (the 16 rows of an m16n8k8 A operand, head
 * row h at qi + h * D) against the chunk's DSA_KEYS key rows ks [KEYS][KP]: s[nt] the tile of
 * keys nt * 8 .. (lane (gq, t): rows gq, gq + 8, keys 2t, 2t + 1) */
template <bool TRUNC>
static __device__ __forceinline__ void dsa_scores(const float *qi, const float *ks, int gq, int t, float (*s)[4]) {
#pragma unroll
    for (int nt = 0; nt < DSA_KEYS / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll 2
    for (int kk = 0; kk < DSA2_D / 8; kk++) { /* 8 dimensions a step */
        const int c = kk * 8 + t;
        uint32_t ab[4], as[4];
        dsa_split<TRUNC>(__ldg(qi + gq * DSA2_D + c), &ab[0], &as[0]);
        dsa_split<TRUNC>(__ldg(qi + (gq + 8) * DSA2_D + c), &ab[1], &as[1]);
        dsa_split<TRUNC>(__ldg(qi + gq * DSA2_D + c + 4), &ab[2], &as[2]);
        dsa_split<TRUNC>(__ldg(qi + (gq + 8) * DSA2_D + c + 4), &ab[3], &as[3]);
#pragma unroll
        for (int nt = 0; nt < DSA_KEYS / 8; nt++) {
            const float *kp = ks + (nt * 8 + gq) * DSA2_KP + c; /* B: key nt * 8 + gq, dimensions c, c + 4 */
            uint32_t b0, b0s, b1, b1s;
            dsa_split<TRUNC>(kp[0], &b0, &b0s);
            dsa_split<TRUNC>(kp[4], &b1, &b1s);
            mma_tf32(s[nt], as, b0, b1);
            mma_tf32(s[nt], ab, b0s, b1s);
            mma_tf32(s[nt], ab, b0, b1);
        }
    }
}

/* the chunk's scores masked and scaled (key j0 + j is visible while below ns and a block key or a
 * context position lo0 + j0 + j >= lw) and each head row's maximum over the quad (mx0: row gq,
 * mx1: row gq + 8) */
static __device__ __forceinline__ void dsa_mask_max(float (*s)[4], int j0, int t, int ns, int nc0, long lo0, long lw, float scale,
                                                    float *mx0, float *mx1) {
    float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < DSA_KEYS / 8; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int jj = j0 + nt * 8 + 2 * t + e;
            const bool valid = jj < ns && (jj >= nc0 || lo0 + jj >= lw);
            s[nt][e] = valid ? s[nt][e] * scale : -INFINITY;
            s[nt][2 + e] = valid ? s[nt][2 + e] * scale : -INFINITY;
            m0 = fmaxf(m0, s[nt][e]);
            m1 = fmaxf(m1, s[nt][2 + e]);
        }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
        m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
        m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, o));
    }
    *mx0 = m0;
    *mx1 = m1;
}

/* P's key tile kt (S's tile kt after the exp) as an A operand: lane (gq, t) needs keys t and t + 4
 * of rows gq, gq + 8, which lanes t / 2 and t / 2 + 2 of its quad hold at element t % 2 */
template <bool TRUNC>
static __device__ __forceinline__ void dsa_p_frag(float (*s)[4], int kt, int lane, uint32_t *ab, uint32_t *as) {
    const int t = lane & 3, src0 = (lane & ~3) | (t >> 1), src1 = src0 + 2;
    const bool odd = t & 1;
    const float x00 = __shfl_sync(0xffffffffu, s[kt][0], src0), x01 = __shfl_sync(0xffffffffu, s[kt][1], src0);
    const float x10 = __shfl_sync(0xffffffffu, s[kt][2], src0), x11 = __shfl_sync(0xffffffffu, s[kt][3], src0);
    const float y00 = __shfl_sync(0xffffffffu, s[kt][0], src1), y01 = __shfl_sync(0xffffffffu, s[kt][1], src1);
    const float y10 = __shfl_sync(0xffffffffu, s[kt][2], src1), y11 = __shfl_sync(0xffffffffu, s[kt][3], src1);
    dsa_split<TRUNC>(odd ? x01 : x00, &ab[0], &as[0]); /* P[gq][kt * 8 + t] */
    dsa_split<TRUNC>(odd ? x11 : x10, &ab[1], &as[1]); /* P[gq + 8][kt * 8 + t] */
    dsa_split<TRUNC>(odd ? y01 : y00, &ab[2], &as[2]); /* P[gq][kt * 8 + t + 4] */
    dsa_split<TRUNC>(odd ? y11 : y10, &ab[3], &as[3]); /* P[gq + 8][kt * 8 + t + 4] */
}

/* the slot's part rows of chunk (or run) z for the warp's two head rows (gq, gq + 8): the quad's
 * sums of this lane's exp-sums added up, the maximum and sum written after the D channels;
 * returns row gq's part row (row gq + 8's: 8 * hstride further) */
static __device__ __forceinline__ float *dsa_part_head(float *part, int i, int nh, int g, int gq, int t, size_t hstride, int z,
                                                       float m0, float l0, float m1, float l1) {
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o);
    }
    float *pp0 = part + ((size_t)i * nh + (size_t)g * DSA2_G + gq) * hstride + (size_t)z * (DSA2_D + 2);
    if (t == 0) {
        pp0[DSA2_D] = m0;
        pp0[DSA2_D + 1] = l0;
        pp0[8 * hstride + DSA2_D] = m1;
        pp0[8 * hstride + DSA2_D + 1] = l1;
    }
    return pp0;
}

/* (two CTAs an SM: 128 registers, 68.6 KB of shared memory each) */
__global__ void __launch_bounds__(DSA_THREADS, 2) k_dsa_chunk(const float *q, const float *kb, const float *vb, int n, int nh,
                                                               int nkv, const __grid_constant__ dsa_reqs R, int window,
                                                               float scale, int nsplit, float *part) {
    extern __shared__ __align__(16) float sm[];
    float *ks = sm, *vs = ks + DSA_KEYS * DSA2_KP; /* [KEYS][KP], [KEYS][VP] */
    const int z = blockIdx.x, g = blockIdx.y, rq = blockIdx.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gq = lane >> 2, t = lane & 3;
    const size_t kw = (size_t)nkv * DSA2_D;
    const float *kr = R.kr[rq], *vr = R.vr[rq];
    const long lo0 = R.lo0[rq];
    const int cap = R.cap[rq], nc0 = R.nc0[rq], lo = R.lo[rq], pos = R.pos[rq];
    q += (size_t)rq * n * nh * DSA2_D;
    kb += (size_t)rq * n * kw;
    vb += (size_t)rq * n * kw;
    part += (size_t)rq * n * nh * nsplit * (DSA2_D + 2);
    const int j0 = z * DSA_KEYS, ns = nc0 + n;
    const size_t hstride = (size_t)nsplit * (DSA2_D + 2);
    if (z >= R.nsplit[rq]) { /* past this request's keys */
        dsa_empty_chunk(part, n, nh, g, hstride, z);
        return;
    }
    dsa_stage_rows(kr, vr, kb, vb, lo0, cap, nc0, ns, j0, g, kw, ks, vs);
    __syncthreads();
    for (int i = warp; i < n; i += DSA_THREADS / 32) {
        long lw = (long)pos + i - window + 1; /* slot i's first context position */
        if (lw < lo) lw = lo;
        const float *qi = q + ((size_t)i * nh + (size_t)g * DSA2_G) * DSA2_D; /* head row h at qi + h * D */
        float s[DSA_KEYS / 8][4];
        dsa_scores<false>(qi, ks, gq, t, s);
        /* mask and scale; each row's (head's) maximum and exp-sum over the quad */
        float mx0, mx1;
        dsa_mask_max(s, j0, t, ns, nc0, lo0, lw, scale, &mx0, &mx1);
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < DSA_KEYS / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                s[nt][e] = mx0 == -INFINITY ? 0.f : expf(s[nt][e] - mx0);
                s[nt][2 + e] = mx1 == -INFINITY ? 0.f : expf(s[nt][2 + e] - mx1);
                sum0 += s[nt][e];
                sum1 += s[nt][2 + e];
            }
        float *pp0 = dsa_part_head(part, i, nh, g, gq, t, hstride, z, mx0, sum0, mx1, sum1);
        float *pp1 = pp0 + 8 * hstride; /* head gq + 8 */
        /* O = P V in two halves of 64 channels (registers: 32 sums at a time) */
#pragma unroll 1
        for (int half = 0; half < 2; half++) {
            float o[DSA2_D / 16][4];
#pragma unroll
            for (int nt = 0; nt < DSA2_D / 16; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
#pragma unroll
            for (int kt = 0; kt < DSA_KEYS / 8; kt++) {
                uint32_t ab[4], as[4];
                dsa_p_frag<false>(s, kt, lane, ab, as);
                /* B: keys kt * 8 + t, + 4 of channel half * 64 + nt * 8 + gq */
                const float *vp = vs + (kt * 8 + t) * DSA2_VP + half * (DSA2_D / 2) + gq;
#pragma unroll
                for (int nt = 0; nt < DSA2_D / 16; nt++) {
                    uint32_t b0, b0s, b1, b1s;
                    tf32_split(vp[nt * 8], &b0, &b0s);
                    tf32_split(vp[4 * DSA2_VP + nt * 8], &b1, &b1s);
                    mma_tf32(o[nt], as, b0, b1);
                    mma_tf32(o[nt], ab, b0s, b1s);
                    mma_tf32(o[nt], ab, b0, b1);
                }
            }
#pragma unroll
            for (int nt = 0; nt < DSA2_D / 16; nt++) {
                const int ch = half * (DSA2_D / 2) + nt * 8 + 2 * t;
                *(float2 *)(pp0 + ch) = make_float2(o[nt][0], o[nt][1]);
                *(float2 *)(pp1 + ch) = make_float2(o[nt][2], o[nt][3]);
            }
        }
    }
}

/* k_dsa_chunk's arithmetic over a run of key chunks per CTA (issue 27, session 26): k_dsa_chunk
 * left one part row of D + 2 floats per (slot, head, 64 keys) for k_dsa_combine (8 requests of 8
 * slots over 4096 keys: 138 MB written and read again a layer, more than the 134 MB of keys and
 * values) and staged each chunk with the loads in its own critical path (H200: 350 us a layer
 * at 8 requests, 52 us at one). Here nsplit CTAs a (request, KV head) take contiguous runs of
 * chunks, DSA_STAGES of them in flight by cp.async while a warp per slot (n <= 8) works on the
 * one before: S = Q K^T as in k_dsa_chunk, then an online softmax (the running maximum and sum
 * per head row; O rescaled by exp(m_old - m_new) when the maximum moves) and O += P V over all
 * 128 channels, in registers until the run ends; one part row per CTA. Runs of `per` chunks,
 * the fewest that fit every request's runs in one wave (one CTA an SM: the two 68.6 KB buffers,
 * 255 registers): requests with few keys take few CTAs (k_dsa_chunk gave each request as many
 * chunks as the longest one's, most of them empty). TRUNC: the TF32 splits by truncation
 * (tf32_split_trunc: ncu found the kernel issue-bound, and cvt.rna.tf32 is a dozen SASS
 * instructions on sm_90: 5,200 -> 3,552 in the kernel, 8 requests 209 -> 174 us). */
#define DSA3_STAGES 2
template <bool TRUNC>
__global__ void __launch_bounds__(DSA_THREADS, 1) k_dsa_flash(const float *q, const float *kb, const float *vb, int n, int nh,
                                                              int nkv, const __grid_constant__ dsa_reqs R,
                                                              const m3_dspark_attn_req *tab, int window, float scale,
                                                              int nsplit, int per, float *part) {
    extern __shared__ __align__(16) float sm[]; /* DSA3_STAGES x ([KEYS][KP] keys, [KEYS][VP] values) */
    const int z = blockIdx.x, g = blockIdx.y, rq = blockIdx.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gq = lane >> 2, t = lane & 3;
    const size_t kw = (size_t)nkv * DSA2_D;
    const float *kr, *vr;
    long lo0;
    int cap, nc0, lo, pos;
    if (tab) { /* the pass's table (device memory): what dsa_chunks works out on the host */
        const m3_dspark_attn_req e = tab[rq];
        kr = e.kr;
        vr = e.vr;
        cap = e.cap;
        lo = e.lo;
        pos = e.pos;
        lo0 = (long)pos - window + 1;
        if (lo0 < lo) lo0 = lo;
        nc0 = lo0 < e.len ? (int)(e.len - lo0) : 0;
    } else {
        kr = R.kr[rq];
        vr = R.vr[rq];
        lo0 = R.lo0[rq];
        cap = R.cap[rq];
        nc0 = R.nc0[rq];
        lo = R.lo[rq];
        pos = R.pos[rq];
    }
    q += (size_t)rq * n * nh * DSA2_D;
    kb += (size_t)rq * n * kw;
    vb += (size_t)rq * n * kw;
    part += (size_t)rq * n * nh * nsplit * (DSA2_D + 2);
    const int ns = nc0 + n, nchunk = (ns + DSA_KEYS - 1) / DSA_KEYS;
    const int cb = z * per, ce = cb + per < nchunk ? cb + per : nchunk; /* this CTA's chunks [cb, ce) */
    const size_t hstride = (size_t)nsplit * (DSA2_D + 2);
    if (cb >= ce) {
        dsa_empty_chunk(part, n, nh, g, hstride, z);
        return;
    }
    const int stage_floats = DSA_KEYS * (DSA2_KP + DSA2_VP);
    /* chunk c's keys and values into stage s: 16-byte copies; rows past the keys zeroed (a zero
     * value row keeps 0 * garbage out of O; their scores are masked) */
    auto stage = [&](int c, int s) {
        float *ks = sm + (size_t)s * stage_floats, *vs = ks + DSA_KEYS * DSA2_KP;
        const int j0 = c * DSA_KEYS;
        for (int x = threadIdx.x; x < DSA_KEYS * (DSA2_D / 4); x += DSA_THREADS) {
            const int j = x / (DSA2_D / 4), c4 = (x % (DSA2_D / 4)) * 4, jj = j0 + j;
            float *kd = ks + j * DSA2_KP + c4, *vd = vs + j * DSA2_VP + c4;
            if (jj < ns) {
                const size_t col = (size_t)g * DSA2_D + c4;
                const float *kp = jj < nc0 ? kr + (size_t)((lo0 + jj) % cap) * kw + col : kb + (size_t)(jj - nc0) * kw + col;
                const float *vp = jj < nc0 ? vr + (size_t)((lo0 + jj) % cap) * kw + col : vb + (size_t)(jj - nc0) * kw + col;
                cp_async16(smem_u32(kd), kp);
                cp_async16(smem_u32(vd), vp);
            } else {
                *(float4 *)kd = make_float4(0.f, 0.f, 0.f, 0.f);
                *(float4 *)vd = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
    };
#pragma unroll
    for (int s = 0; s < DSA3_STAGES - 1; s++) {
        if (cb + s < ce) stage(cb + s, s);
        cp_commit();
    }
    const int i = warp; /* this warp's slot (none past n) */
    long lw = (long)pos + i - window + 1; /* slot i's first context position */
    if (lw < lo) lw = lo;
    const float *qi = q + ((size_t)i * nh + (size_t)g * DSA2_G) * DSA2_D; /* head row h at qi + h * D */
    float o[DSA2_D / 8][4];
#pragma unroll
    for (int nt = 0; nt < DSA2_D / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f; /* head rows gq, gq + 8: maximum, this lane's sum */
    for (int c = cb; c < ce; c++) {
        const int s = (c - cb) % DSA3_STAGES;
        if (c + DSA3_STAGES - 1 < ce) stage(c + DSA3_STAGES - 1, (c + DSA3_STAGES - 1 - cb) % DSA3_STAGES);
        cp_commit();
        cp_wait<DSA3_STAGES - 1>(); /* chunk c's copies (this thread's) */
        __syncthreads();            /* ... and every thread's, and the zeroed rows */
        if (i < n) {
            const float *ks = sm + (size_t)s * stage_floats, *vs = ks + DSA_KEYS * DSA2_KP;
            const int j0 = c * DSA_KEYS;
            float sc[DSA_KEYS / 8][4];
            dsa_scores<TRUNC>(qi, ks, gq, t, sc);
            /* mask and scale; the chunk's maximum per head row over the quad, the running one */
            float mx0, mx1;
            dsa_mask_max(sc, j0, t, ns, nc0, lo0, lw, scale, &mx0, &mx1);
            const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
            /* O and the sums so far in units of the new maximum (nothing yet while it is -inf) */
            const float a0 = m0 == -INFINITY ? 0.f : expf(m0 - n0), a1 = m1 == -INFINITY ? 0.f : expf(m1 - n1);
            m0 = n0;
            m1 = n1;
            l0 *= a0;
            l1 *= a1;
#pragma unroll
            for (int nt = 0; nt < DSA_KEYS / 8; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    sc[nt][e] = n0 == -INFINITY ? 0.f : expf(sc[nt][e] - n0);
                    sc[nt][2 + e] = n1 == -INFINITY ? 0.f : expf(sc[nt][2 + e] - n1);
                    l0 += sc[nt][e];
                    l1 += sc[nt][2 + e];
                }
            /* P as A fragments, then O = a O + P V four channel tiles at a time: each chunk's products
             * summed in fresh accumulators and added to O once (the tensor cores' f32 sums over a
             * whole run of chunks drifted: 7.8e-6 against the CPU at 8 requests, 1.3e-6 a chunk at a
             * time) */
            uint32_t pb[DSA_KEYS / 8][4], ps[DSA_KEYS / 8][4];
#pragma unroll
            for (int kt = 0; kt < DSA_KEYS / 8; kt++) dsa_p_frag<TRUNC>(sc, kt, lane, pb[kt], ps[kt]);
#pragma unroll
            for (int n4 = 0; n4 < DSA2_D / 32; n4++) {
                float acc[4][4];
#pragma unroll
                for (int u = 0; u < 4; u++) acc[u][0] = acc[u][1] = acc[u][2] = acc[u][3] = 0.f;
#pragma unroll
                for (int kt = 0; kt < DSA_KEYS / 8; kt++) {
                    const float *vp = vs + (kt * 8 + t) * DSA2_VP + n4 * 32 + gq; /* B: keys kt * 8 + t, + 4 */
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        uint32_t b0, b0s, b1, b1s;
                        dsa_split<TRUNC>(vp[u * 8], &b0, &b0s);
                        dsa_split<TRUNC>(vp[4 * DSA2_VP + u * 8], &b1, &b1s);
                        mma_tf32(acc[u], ps[kt], b0, b1);
                        mma_tf32(acc[u], pb[kt], b0s, b1s);
                        mma_tf32(acc[u], pb[kt], b0, b1);
                    }
                }
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float *on = o[n4 * 4 + u];
                    on[0] = fmaf(on[0], a0, acc[u][0]);
                    on[1] = fmaf(on[1], a0, acc[u][1]);
                    on[2] = fmaf(on[2], a1, acc[u][2]);
                    on[3] = fmaf(on[3], a1, acc[u][3]);
                }
            }
        }
        __syncthreads(); /* stage s is read: the next round's copies may land in it */
    }
    cp_wait<0>();
    if (i >= n) return;
    float *pp0 = dsa_part_head(part, i, nh, g, gq, t, hstride, z, m0, l0, m1, l1);
    float *pp1 = pp0 + 8 * hstride; /* head gq + 8 */
#pragma unroll
    for (int nt = 0; nt < DSA2_D / 8; nt++) {
        const int ch = nt * 8 + 2 * t;
        *(float2 *)(pp0 + ch) = make_float2(o[nt][0], o[nt][1]);
        *(float2 *)(pp1 + ch) = make_float2(o[nt][2], o[nt][3]);
    }
}

/* one CTA per (slot, head): the chunks rescaled to their common maximum M. The chunks' weights
 * exp(m_z - M) are worked out once, DSA_WT at a time, into shared memory (zeros past the last
 * chunk), then each warp sums a contiguous eighth of the tile's chunks, a lane per 32nd channel
 * (D <= 256), four chunks' loads at a time, and the eight warps' sums are added in shared memory
 * (a layer of 8 slots over 4096 keys: 65 chunks of 130 floats per head; a thread per channel
 * over every chunk was a chain of 9 rounds of loads, 20.6 us at ncu's clocks). Empty chunks
 * (maximum -inf) weigh 0 and their rows are not read. */
#define DSA_COMBINE_THREADS 256
#define DSA_WT 256
__global__ void __launch_bounds__(DSA_COMBINE_THREADS) k_dsa_combine(const float *part, int nsplit, int D, float *out) {
    __shared__ __align__(16) double wz[DSA_WT + 8]; /* zeros past the tile's chunks */
    __shared__ double red[DSA_COMBINE_THREADS / 32][256];
    __shared__ float fpart[32];
    __shared__ double dpart[32];
    const float *p = part + (size_t)blockIdx.x * nsplit * (D + 2);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nw = DSA_COMBINE_THREADS / 32;
    float mx = -INFINITY;
    for (int z = tid; z < nsplit; z += DSA_COMBINE_THREADS) mx = fmaxf(mx, p[(size_t)z * (D + 2) + D]);
    const float M = block_max_f(mx, fpart);
    double l = 0, o[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (int z0 = 0; z0 < nsplit; z0 += DSA_WT) {
        const int nz = nsplit - z0 < DSA_WT ? nsplit - z0 : DSA_WT;
        __syncthreads(); /* the previous tile's weights are read */
        for (int z = tid; z < DSA_WT + 8; z += DSA_COMBINE_THREADS) {
            const float m = z < nz ? p[(size_t)(z0 + z) * (D + 2) + D] : -INFINITY;
            const double w = m > -INFINITY ? exp((double)m - M) : 0.0;
            wz[z] = w;
            if (w != 0.0) l += (double)p[(size_t)(z0 + z) * (D + 2) + D + 1] * w;
        }
        __syncthreads();
        const int per = (nz + nw - 1) / nw, zb = warp * per, ze = zb + per < nz ? zb + per : nz;
        for (int z = zb; z < ze; z += 4)
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const double w = z + u < ze ? wz[z + u] : 0.0;
                if (w == 0.0) continue;
                const float *pz = p + (size_t)(z0 + z + u) * (D + 2);
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (lane + 32 * k < D) o[k] += (double)pz[lane + 32 * k] * w;
            }
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (lane + 32 * k < D) red[warp][lane + 32 * k] = o[k];
    const double L = block_sum_d(l, dpart); /* its barriers also publish red */
    for (int d = tid; d < D; d += DSA_COMBINE_THREADS) {
        double s = 0;
#pragma unroll
        for (int w = 0; w < nw; w++) s += red[w][d];
        out[(size_t)blockIdx.x * D + d] = (float)(s / L);
    }
}

/* k_dsa_combine over rows (slot, head) of nsplit chunks each */
static void dsa_combine(m3_cuda *c, const float *part, int rows, int nsplit, int D, float *out) {
    if (D > 256) {
        m3_cu_failf(c, "dspark attention: head_dim %d is more than the combine takes (256)", D);
        return;
    }
    k_dsa_combine<<<rows, DSA_COMBINE_THREADS, 0, c->st>>>(part, nsplit, D, out);
}

/* k_dsa_chunk's fixed shapes: the MMA tiles hold 16 heads of 128 channels, 64 keys a chunk */
static_assert(DSA_KEYS == 64 && DSA_THREADS % 32 == 0, "k_dsa_chunk: 8 key tiles of 8 a chunk, whole warps");
static bool chunk_shapes(int n, int nh, int nkv, int D) {
    return n > 0 && nkv > 0 && nh % nkv == 0 && D == DSA2_D && nh / nkv == DSA2_G;
}

static bool flash_on() {
    static int flash = -1; /* M3_DSA_FLASH=0: k_dsa_chunk, a CTA per chunk (comparisons) */
    if (flash < 0) flash = m3_cu_env_int("M3_DSA_FLASH", 1) != 0;
    return flash;
}

/* k_dsa_chunk (k_dsa_flash) and k_dsa_combine over nreq (<= DSA_BATCH) requests of n slots each;
 * with dtab (k_dsa_flash only), the requests rq also in device memory (a pass's table): the kernel
 * reads them there and the launch's shape is that of full windows, whatever their positions */
static void dsa_chunks(m3_cuda *c, int nreq, const m3_dspark_attn_req *rq, const float *q, const float *kb, const float *vb,
                       int n, int nh, int nkv, int window, float *out, const m3_dspark_attn_req *dtab = NULL) {
    dsa_reqs R;
    int nsplit = 1;
    for (int r = 0; r < nreq; r++) {
        long lo0 = (long)rq[r].pos - window + 1; /* slot 0 reads the most context keys */
        if (lo0 < rq[r].lo) lo0 = rq[r].lo;
        const int nc0 = lo0 < rq[r].len ? (int)(rq[r].len - lo0) : 0;
        R.kr[r] = rq[r].kr;
        R.vr[r] = rq[r].vr;
        R.lo0[r] = lo0;
        R.cap[r] = rq[r].cap;
        R.nc0[r] = nc0;
        R.lo[r] = rq[r].lo;
        R.pos[r] = rq[r].pos;
        /* (a table's launch: a slot-0 window of window - 1 context keys, the most there can be) */
        R.nsplit[r] = (int)cdiv((size_t)(dtab ? window - 1 : nc0) + n, DSA_KEYS);
        if (R.nsplit[r] > nsplit) nsplit = R.nsplit[r];
    }
    const size_t stage = sizeof(float) * (size_t)DSA_KEYS * (DSA2_KP + DSA2_VP);
    const int fl = (dtab || flash_on()) && n <= DSA_THREADS / 32 && DSA3_STAGES * stage <= c->smem_optin;
    if (dtab && !fl) {
        m3_cu_failf(c, "dspark attention: a pass's table with %d slots", n);
        return;
    }
    int per = 1;
    if (fl) nsplit = m3_dsa_runs(c->sm_count, nkv, nreq, R.nsplit, &per);
    float *part = (float *)m3_cu_scratch(c, SC_DSA, sizeof(float) * (size_t)nreq * n * nh * nsplit * (DSA2_D + 2));
    if (!part) return;
    const size_t smem = fl ? DSA3_STAGES * stage : stage;
    static int trunc_env = -1; /* M3_DSA_TRUNC=0: the TF32 splits by rounding conversions (comparisons) */
    if (trunc_env < 0) trunc_env = m3_cu_env_int("M3_DSA_TRUNC", 1) != 0;
    const int tr = trunc_env;
    static unsigned long long set[3]; /* devices whose context has the kernel's shared-memory attribute */
    const unsigned long long bit = 1ull << (c->dev & 63);
    const int ki = fl ? 1 + tr : 0;
    if (!(__atomic_load_n(&set[ki], __ATOMIC_ACQUIRE) & bit)) {
        if (CK(c, ki == 2   ? cudaFuncSetAttribute(k_dsa_flash<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                  : ki == 1 ? cudaFuncSetAttribute(k_dsa_flash<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                            : cudaFuncSetAttribute(k_dsa_chunk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)))
            return;
        __atomic_fetch_or(&set[ki], bit, __ATOMIC_RELEASE);
    }
    if (fl)
        (tr ? k_dsa_flash<true> : k_dsa_flash<false>)<<<dim3(nsplit, nkv, nreq), DSA_THREADS, smem, c->st>>>(
            q, kb, vb, n, nh, nkv, R, dtab, window, 1.0f / sqrtf((float)DSA2_D), nsplit, per, part);
    else
        k_dsa_chunk<<<dim3(nsplit, nkv, nreq), DSA_THREADS, smem, c->st>>>(
            q, kb, vb, n, nh, nkv, R, window, 1.0f / sqrtf((float)DSA2_D), nsplit, part);
    dsa_combine(c, part, nreq * n * nh, nsplit, DSA2_D, out);
    CK_LAUNCH(c, "dspark attention");
}

static void dspark_attention(m3_cuda *c, const float *q, const float *kb, const float *vb, int n, int nh, int nkv, int D,
                             const float *kr, const float *vr, int cap, int lo, int len, int pos, int window, float *out) {
    if (nkv <= 0 || nh % nkv) { m3_cu_failf(c, "dspark attention: %d query heads over %d KV heads", nh, nkv); return; }
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)n * nh * D);
    static int split = -1; /* M3_DSA_SPLIT=0: the first kernel (comparisons) */
    if (split < 0) split = m3_cu_env_int("M3_DSA_SPLIT", 1) != 0;
    const int G = nh / nkv, HG = G <= DSA_HG ? G : DSA_HG;
    static int chunked = -1; /* M3_DSA_CHUNK=0: k_dsa_split at the M3.1-Flash shapes too (comparisons) */
    if (chunked < 0) chunked = m3_cu_env_int("M3_DSA_CHUNK", 1) != 0;
    long lo0 = (long)pos - window + 1; /* slot 0 reads the most context keys */
    if (lo0 < lo) lo0 = lo;
    const int nc0 = lo0 < len ? (int)(len - lo0) : 0;
    /* from 512 context keys (8 slots: 4096 keys 349 -> 102 us a layer; 100 keys 37 against 51 us) */
    if (split && chunked && nc0 >= 512 && chunk_shapes(n, nh, nkv, D)) {
        const m3_dspark_attn_req r = {kr, vr, cap, lo, len, pos};
        dsa_chunks(c, 1, &r, q, kb, vb, n, nh, nkv, window, out);
        return;
    }
    if (split && D <= DSA_THREADS && DSA_THREADS % D == 0 && G % HG == 0) {
        const int nsplit = (int)cdiv((size_t)nc0 + n, DSA_KEYS);
        float *part = (float *)m3_cu_scratch(c, SC_DSA, sizeof(float) * (size_t)n * nh * nsplit * (D + 2));
        if (!part) return;
        const size_t smem = sizeof(float) * (size_t)HG * (D + DSA_KEYS);
        k_dsa_split<<<dim3(n, nkv * (G / HG), nsplit), DSA_THREADS, smem, c->st>>>(
            q, kb, vb, n, nh, nkv, D, HG, kr, vr, cap, lo, len, pos, window, 1.0f / sqrtf((float)D), nsplit, part);
        dsa_combine(c, part, n * nh, nsplit, D, out);
        CK_LAUNCH(c, "dspark attention");
        return;
    }
    const int ctxk = len > lo ? len - lo : 0;
    const size_t smem = sizeof(float) * ((size_t)D + (size_t)ctxk + (size_t)n); /* every slot reads <= ctxk context keys */
    if (smem > c->smem_optin) {
        m3_cu_failf(c, "dspark attention: a window of %d keys needs %zu bytes of shared memory", window, smem);
        return;
    }
    if (smem > 48 * 1024) cudaFuncSetAttribute(k_dspark_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    k_dspark_attention<<<n * nh, DSA_THREADS, smem, c->st>>>(q, kb, vb, n, nh, nkv, D, kr, vr, cap, lo, len, pos, window,
                                                            1.0f / sqrtf((float)D), out);
    CK_LAUNCH(c, "dspark attention");
}

void m3_cu_dspark_attention(void *ctx, const float *q, const float *kb, const float *vb, int n, int nh, int nkv, int D,
                            const float *kr, const float *vr, int cap, int lo, int len, int pos, int window, float *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (n <= 0 || c->failed) return;
    m3_cu_prof_begin(c, OP_DSA);
    dspark_attention(c, q, kb, vb, n, nh, nkv, D, kr, vr, cap, lo, len, pos, window, out);
    m3_cu_prof_end(c, OP_DSA);
}

void m3_cu_dspark_attention_n(void *ctx, int nreq, const m3_dspark_attn_req *rq, const float *q, const float *kb,
                              const float *vb, int n, int nh, int nkv, int D, int window, float *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (n <= 0 || nreq <= 0 || c->failed) return;
    if (nkv <= 0 || nh % nkv) { m3_cu_failf(c, "dspark attention: %d query heads over %d KV heads", nh, nkv); return; }
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)nreq * n * nh * D);
    m3_cu_prof_begin(c, OP_DSA);
    if (c->dsa_tab_on && nreq == c->dsa_tab_nreq && n == c->dsa_tab_n && window == c->dsa_tab_window &&
        chunk_shapes(n, nh, nkv, D)) { /* a pass with its table: this call's layer's requests, read there */
        for (int l = 0; l < c->dsa_tab_nl; l++)
            if (!memcmp(c->dsa_tab + (size_t)l * nreq, rq, sizeof *rq * (size_t)nreq)) {
                dsa_chunks(c, nreq, rq, q, kb, vb, n, nh, nkv, window, out, c->d_dsa_tab + (size_t)l * nreq);
                m3_cu_prof_end(c, OP_DSA);
                return;
            }
    }
    if (c->capturing) { /* a recording would keep this call's positions */
        m3_cu_failf(c, "dspark attention: requests not in the pass's table while recording");
        m3_cu_prof_end(c, OP_DSA);
        return;
    }
    static int batched = -1; /* M3_DSA_BATCH=0: a launch per request (comparisons) */
    if (batched < 0) batched = m3_cu_env_int("M3_DSA_BATCH", 1) != 0;
    const size_t rows = (size_t)n * nh * D, krows = (size_t)n * nkv * D;
    if (batched && nreq > 1 && chunk_shapes(n, nh, nkv, D)) { /* every request's chunks in one launch */
        for (int r0 = 0; r0 < nreq; r0 += DSA_BATCH) {
            const int m = nreq - r0 < DSA_BATCH ? nreq - r0 : DSA_BATCH;
            dsa_chunks(c, m, rq + r0, q + r0 * rows, kb + r0 * krows, vb + r0 * krows, n, nh, nkv, window, out + r0 * rows);
        }
    } else {
        for (int r = 0; r < nreq; r++)
            dspark_attention(c, q + r * rows, kb + r * krows, vb + r * krows, n, nh, nkv, D, rq[r].kr, rq[r].vr, rq[r].cap,
                             rq[r].lo, rq[r].len, rq[r].pos, window, out + r * rows);
    }
    m3_cu_prof_end(c, OP_DSA);
}

int m3_cu_dspark_attention_table(void *ctx, int nl, int nreq, const m3_dspark_attn_req *rq, int n, int nh, int nkv, int D,
                                 int window) {
    m3_cuda *c = (m3_cuda *)ctx;
    c->dsa_tab_on = 0;
    const size_t stage = sizeof(float) * (size_t)DSA_KEYS * (DSA2_KP + DSA2_VP);
    /* only for passes a graph may record: the table's launches are sized for full windows, which
     * costs passes of several requests over short contexts their parallelism (8 requests over
     * 200 keys: runs of 17 chunks where 4 CTAs a request would each take one), and takes
     * k_dsa_flash whatever M3_DSA_FLASH says */
    if (c->failed || nl < 1 || nreq < 1 || nreq > DSA_BATCH || n > DSA_THREADS / 32 || (long)nreq * n > GRAPH_T_MAX ||
        window < 1 || !flash_on() || !chunk_shapes(n, nh, nkv, D) || DSA3_STAGES * stage > c->smem_optin)
        return 0;
    const size_t cnt = (size_t)nl * nreq, bytes = sizeof *rq * cnt;
    m3_dspark_attn_req *h = (m3_dspark_attn_req *)realloc(c->dsa_tab, bytes);
    if (!h) return 0;
    c->dsa_tab = h;
    m3_dspark_attn_req *d = (m3_dspark_attn_req *)m3_cu_scratch(c, SC_DSA_TAB, bytes);
    if (!d) return 0;
    memcpy(h, rq, bytes);
    /* from pageable memory: the call returns once the host's bytes are taken */
    if (CK(c, cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, c->st))) return 0;
    c->d_dsa_tab = d;
    c->dsa_tab_nl = nl;
    c->dsa_tab_nreq = nreq;
    c->dsa_tab_n = n;
    c->dsa_tab_window = window;
    c->dsa_tab_on = 1;
    return 1;
}
