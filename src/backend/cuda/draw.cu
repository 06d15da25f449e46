/* Sampling draws on the GPU (ops.h draw_rows: sampled output rows, the draft's chain): each row
 * becomes the distribution its parameters make of it and one draw is taken, by cpu/draw.c's rule
 * (its reference; the double sums here run in another order, so a uniform within rounding of a
 * boundary may pick the neighbour).
 *
 * A row is a cluster of DR_CL CTAs, each a slice of it, held in shared memory (read from the row
 * once, written back once as the distribution; a slice over DR_SLICE_MAX is worked on in the row
 * itself, every pass from L2). The cluster agrees on each
 * figure through distributed shared memory: every CTA leaves its part in its own shared memory,
 * one cluster barrier, then every CTA adds the parts of all in rank order (integers: counts and
 * masses in units of 2^-40; doubles: in rank order), so every CTA holds the same figure. The
 * cuts are cpu/draw.c's radix selection: four passes of 8, 8, 8 and 6 bits of e, each a
 * histogram (shared-memory atomics on integers, a warp's lanes of one bin through one lane)
 * summed over the cluster; histograms alternate between two buffers, so a pass needs one
 * barrier; the three finer passes read only the first pass's crossing bin, gathered into global
 * scratch (SC_DRAW: a slice's worth a CTA). Ties at a cut are settled in id order: each
 * thread counts those of a contiguous run of ids, a scan and the ranks before give each run its
 * first tie's index. The draw: each thread sums a contiguous run
 * of its slice's ids, an exclusive scan orders the runs, and the one thread whose stretch holds
 * u * total walks its run. */
#include "common.cuh"

#include <limits.h>

#define DR_CL 8     /* CTAs a row */
#define DR_T 512    /* threads a CTA */
#define DR_ROWS 32  /* rows a launch takes (their parameters by value) */
#define DR_SLICE_MAX (200 * 1024) /* bytes of a CTA's slice in shared memory (beside dr_smem's 13 KB) */
#define DR_AGG_MAX 8 /* a warp's values in at most this many histogram bins add through one lane a bin */

struct dr_args {
    m3_draw_param p[DR_ROWS];
};

/* the generic address of p's counterpart in the shared memory of the cluster's CTA `rank` */
template <class T> static __device__ __forceinline__ T *dr_peer(T *p, uint32_t rank) {
    uint64_t r;
    asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(r) : "l"((uint64_t)p), "r"(rank));
    return (T *)r;
}

static __device__ __forceinline__ bool dr_kept0(float e, float thr) { return e > 0 && e >= thr; }
static __device__ __forceinline__ unsigned long long dr_mass(float e) {
    return __double2ull_rz(ldexp((double)e, 40)); /* e * 2^40 rounded down (e <= 1) */
}

struct dr_best {
    float m;
    int i;
};
static __device__ __forceinline__ dr_best dr_pick(dr_best a, dr_best b) {
    return b.m > a.m || (b.m == a.m && b.i < a.i) ? b : a;
}

/* the CTA's shared state: what peers read is written once per launch (or per buffer, below) */
struct dr_smem {
    dr_best wbest[DR_T / 32];
    dr_best best;                        /* this slice's argmax over [0, n) (NaN never counts) */
    int nan0;                            /* rank 0: x[0] is NaN */
    unsigned long long cnt, mass, z;     /* kept count and mass; the mass at or above a top-k cut */
    unsigned long long ties[2];          /* this slice's ties at the top-k / top-p cut */
    unsigned long long hc[2][256], hm[2][256]; /* histograms (count, mass), alternating by pass */
    unsigned long long wsum[DR_T / 32];  /* scan scratch */
    double wd[DR_T / 32];
    double incl[DR_T];                   /* each thread's inclusive scan of the run sums */
    double tot;                          /* this slice's kept sum (the scan's total) */
    int last;                            /* this slice's last kept id, -1 */
    int ncand;                           /* dr_cut's candidates after its first pass */
    unsigned long long pabove;           /* the weight above it */
};

/* inclusive scan of v over the CTA's threads (fixed order: the same sums every launch) */
static __device__ double dr_scan_d(double v, dr_smem &s) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    if (lane == 31) s.wd[w] = v;
    __syncthreads();
    double before = 0;
    for (int k = 0; k < w; k++) before += s.wd[k];
    __syncthreads(); /* wd is written again by the next scan */
    return before + v;
}

/* inclusive suffix scan (bins t..255) of v over threads 0..255 (the others pass 0) */
static __device__ unsigned long long dr_suffix_u64(unsigned long long v, dr_smem &s) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_down_sync(0xffffffffu, v, o);
        if (lane + o < 32) v += y;
    }
    if (lane == 0) s.wsum[w] = v;
    __syncthreads();
    unsigned long long after = 0;
    for (int k = w + 1; k < DR_T / 32; k++) after += s.wsum[k];
    __syncthreads();
    return after + v;
}

/* The largest key t >= lo such that the kept values with keys >= t weigh at least target (by
 * count or mass) over the whole row (cpu/draw.c cut_of); ph counts the passes (buffers). The
 * first pass reads the slice; the values in its crossing bin are then gathered into cand (this
 * CTA's global scratch, as many floats as the slice), and the three finer passes read those
 * alone (a row's crossing bin holds a small part of it, unless the row is nearly uniform). */
static __device__ __forceinline__ uint32_t dr_cut(const float *w, int j0, int j1, float thr, uint32_t lo, bool by_mass,
                                  unsigned long long target, int &ph, unsigned long long &above_out, float *cand,
                                  dr_smem &s) {
    uint32_t pre = 0;
    unsigned long long above = 0;
    const int lane = (int)threadIdx.x & 31;
    int nsrc = j1 - j0; /* the values a pass reads: the slice, then the candidates */
    const float *src = w;
    for (int p = 0; p < 4; p++, ph++) {
        const int b = ph & 1, sh = p == 3 ? 0 : 22 - 8 * p, nb = p == 3 ? 64 : 256, up = 22 - 8 * (p - 1);
        if (threadIdx.x < 256) {
            s.hc[b][threadIdx.x] = 0;
            s.hm[b][threadIdx.x] = 0;
        }
        __syncthreads();
        /* a warp's 32 values at a time (the warp's iterations alike, so it may work together):
         * lanes of one bin add once, through their leader (a flat row puts most of a pass's
         * values into a few bins: one shared-memory atomic each would queue on those few) */
        for (int i0 = (int)threadIdx.x & ~31; i0 < nsrc; i0 += DR_T) {
            const int i = i0 + lane;
            const float e = i < nsrc ? src[i] : 0.0f;
            const uint32_t k = __float_as_uint(e);
            const bool in = i < nsrc && dr_kept0(e, thr) && k >= lo && (!p || k >> up == pre);
            if (!__any_sync(0xffffffffu, in)) continue; /* past the first pass most values are out */
            const int bin = in ? (int)((k >> sh) & (uint32_t)(nb - 1)) : -1;
            const unsigned same = __match_any_sync(0xffffffffu, bin);
            const bool lead = in && lane == __ffs(same) - 1;
            if (__popc(__ballot_sync(0xffffffffu, lead)) > DR_AGG_MAX) { /* many bins: each value its own atomic */
                if (in) {
                    if (by_mass) atomicAdd(&s.hm[b][bin], dr_mass(e));
                    else atomicAdd(&s.hc[b][bin], 1ull);
                }
                continue;
            }
            if (!by_mass) {
                if (lead) atomicAdd(&s.hc[b][bin], (unsigned long long)__popc(same));
                continue;
            }
            /* masses (below 2^41): each bin's sum over the warp in two 32-bit reductions of 21-bit halves */
            const unsigned long long ms = in ? dr_mass(e) : 0ull;
            unsigned todo = __ballot_sync(0xffffffffu, lead);
            while (todo) {
                const int l = __ffs(todo) - 1, bl = __shfl_sync(0xffffffffu, bin, l);
                const bool mine = bin == bl;
                const unsigned lo21 = __reduce_add_sync(0xffffffffu, mine ? (unsigned)(ms & 0x1fffffu) : 0u),
                               hi = __reduce_add_sync(0xffffffffu, mine ? (unsigned)(ms >> 21) : 0u);
                if (lane == l) atomicAdd(&s.hm[b][bl], (unsigned long long)lo21 + ((unsigned long long)hi << 21));
                todo &= todo - 1;
            }
        }
        cluster_sync(); /* every CTA's histogram is complete */
        unsigned long long w = 0;
        if ((int)threadIdx.x < nb)
            for (uint32_t q = 0; q < DR_CL; q++) w += by_mass ? *dr_peer(&s.hm[b][threadIdx.x], q) : *dr_peer(&s.hc[b][threadIdx.x], q);
        const unsigned long long suf = dr_suffix_u64(w, s); /* weight of bins >= this one */
        /* the crossing: the highest bin whose suffix reaches the target (bin 0 when none does);
         * suffixes fall with the bin, so those that reach it are bins 0..pick: a count */
        const int nq = __syncthreads_count((int)threadIdx.x < nb && above + suf >= target), pick = nq ? nq - 1 : 0;
        if ((int)threadIdx.x == pick) s.pabove = suf - w;
        __syncthreads();
        above += s.pabove;
        pre = p ? pre << (up - sh) | (uint32_t)pick : (uint32_t)pick;
        if (p == 0) { /* the first bin's values gathered (their order does not matter: integer sums) */
            if (threadIdx.x == 0) s.ncand = 0;
            __syncthreads();
            for (int i0 = (int)threadIdx.x & ~31; i0 < nsrc; i0 += DR_T) {
                const int i = i0 + lane;
                const float e = i < nsrc ? src[i] : 0.0f; /* src: the slice still */
                const uint32_t k = __float_as_uint(e);
                const bool in = i < nsrc && dr_kept0(e, thr) && k >= lo && k >> 22 == pre;
                const unsigned bal = __ballot_sync(0xffffffffu, in);
                if (!bal) continue;
                int at = 0;
                if (lane == 0) at = atomicAdd(&s.ncand, __popc(bal));
                at = __shfl_sync(0xffffffffu, at, 0);
                if (in) cand[at + __popc(bal & ((1u << lane) - 1u))] = e;
            }
            __syncthreads(); /* the candidates are written (global memory, this CTA's) and counted */
            nsrc = s.ncand;
            src = cand;
        }
        __syncthreads(); /* pabove (and ncand) are written again next pass */
    }
    above_out = above;
    return pre;
}

/* The kept values at key t past the first m of them, in id order over the row, are dropped
 * (e = 0): each thread counts the ties of its run [c0, c1), a scan orders the runs, the ranks
 * come in order; slot: this CTA's count for its peers (written once a launch). */
static __device__ void dr_trim(float *w, int j0, int c0, int c1, float thr, uint32_t t, unsigned long long m, int slot,
                               dr_smem &s) {
    __syncthreads(); /* every thread's e is in r (the runs cross the passes' layout) */
    int cnt = 0;
    for (int i = c0; i < c1; i++) cnt += dr_kept0(w[i - j0], thr) && __float_as_uint(w[i - j0]) == t;
    const double incl = dr_scan_d((double)cnt, s); /* exact: counts below 2^53 */
    if (threadIdx.x == DR_T - 1) s.ties[slot] = (unsigned long long)incl;
    cluster_sync();
    unsigned long long j = (unsigned long long)incl - (unsigned long long)cnt;
    for (uint32_t q = 0; q < cluster_rank(); q++) j += *dr_peer(&s.ties[slot], q);
    for (int i = c0; i < c1; i++)
        if (dr_kept0(w[i - j0], thr) && __float_as_uint(w[i - j0]) == t) {
            if (j >= m) w[i - j0] = 0.0f;
            j++;
        }
    __syncthreads(); /* the passes after read the dropped ones as 0 */
}

/* grid (DR_CL, rows), cluster (DR_CL): row blockIdx.y with a.p[blockIdx.y] (dp[blockIdx.y] when
 * dp: the parameters in device memory, draw_rows_dev). SL: the CTA's slice
 * is worked on in shared memory (dynamic, S floats), read from and written to the row once;
 * else in the row itself (every pass from L2). */
template <bool SL>
__global__ void __launch_bounds__(DR_T, 2) k_draw_rows(float *x, int V, size_t ld, const __grid_constant__ dr_args a,
                                                         const m3_draw_param *dp, int32_t *out, float *cands) {
    __shared__ dr_smem s;
    extern __shared__ float dr_slice[];
    const uint32_t rank = cluster_rank();
    const m3_draw_param P = dp ? dp[blockIdx.y] : a.p[blockIdx.y];
    float *r = x + (size_t)blockIdx.y * ld;
    const int n = P.n < 1 ? 1 : P.n > V ? V : P.n;
    const int S = (V + DR_CL - 1) / DR_CL, j0 = (int)rank * S < V ? (int)rank * S : V, j1 = j0 + S < V ? j0 + S : V;
    float *w = SL ? dr_slice : r + j0; /* the slice: value i at w[i - j0] */
    float *cand = cands + ((size_t)blockIdx.y * DR_CL + rank) * (size_t)S; /* dr_cut's candidates */

    /* 1. the argmax (argmax_rows' rule), the slice into shared memory */
    dr_best b = {-INFINITY, INT_MAX};
    for (int i = j0 + (int)threadIdx.x; i < j1; i += DR_T) {
        const float v = r[i];
        if (SL) w[i - j0] = v;
        if (i < n) b = dr_pick(b, dr_best{v, i}); /* NaN never wins */
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) b = dr_pick(b, dr_best{__shfl_xor_sync(0xffffffffu, b.m, o), __shfl_xor_sync(0xffffffffu, b.i, o)});
    if ((threadIdx.x & 31) == 0) s.wbest[threadIdx.x >> 5] = b;
    if (threadIdx.x == 0) s.nan0 = rank == 0 && r[0] != r[0];
    __syncthreads();
    if (threadIdx.x == 0) {
        dr_best c = s.wbest[0];
        for (int w = 1; w < DR_T / 32; w++) c = dr_pick(c, s.wbest[w]);
        s.best = c;
    }
    cluster_sync();
    dr_best g = *dr_peer(&s.best, 0);
    for (uint32_t q = 1; q < DR_CL; q++) g = dr_pick(g, *dr_peer(&s.best, q));
    const bool nan0 = *dr_peer(&s.nan0, 0) != 0;
    const int am = nan0 || g.i >= n ? 0 : g.i;
    const float m = nan0 || g.i >= n ? NAN : g.m;
    if (!(P.temperature >= 1e-5f) || !isfinite(m)) { /* one-hot at the argmax */
        for (int i = j0 + (int)threadIdx.x; i < j1; i += DR_T) r[i] = i == am ? 1.0f : 0.0f;
        if (rank == 0 && threadIdx.x == 0) out[blockIdx.y] = am;
        cluster_sync(); /* peers are done reading this CTA's shared memory */
        return;
    }

    /* 2. e, and the kept count and mass */
    const float sc = 1.0f / P.temperature, thr = P.min_p > 0 ? (P.min_p > 1 ? 1.0f : P.min_p) : 0.0f;
    if (threadIdx.x == 0) s.cnt = s.mass = s.z = 0;
    __syncthreads();
    unsigned long long cnt = 0, mass = 0;
    for (int i = j0 + (int)threadIdx.x; i < j1; i += DR_T) {
        const float e = i < n ? expf((w[i - j0] - m) * sc) : 0.0f;
        w[i - j0] = e;
        if (dr_kept0(e, thr)) {
            cnt++;
            mass += dr_mass(e); /* top-p's mass when no top-k cut comes first */
        }
    }
    cnt = warp_sum(cnt); /* one atomic a warp */
    mass = warp_sum(mass);
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&s.cnt, cnt);
        atomicAdd(&s.mass, mass);
    }
    cluster_sync();
    unsigned long long cnt_all = 0, mass_all = 0;
    for (uint32_t q = 0; q < DR_CL; q++) {
        cnt_all += *dr_peer(&s.cnt, q);
        mass_all += *dr_peer(&s.mass, q);
    }

    /* 3. the cuts, then the ties at each settled as the sampler settles them: top-k keeps exactly
     * k (the lower ids first), top-p a tie while the mass ranked above it is short of the target */
    const int run = (j1 - j0 + DR_T - 1) / DR_T; /* thread t's run of ids [c0, c1): the ties' and the draw's order */
    const int c0 = j0 + (int)threadIdx.x * run < j1 ? j0 + (int)threadIdx.x * run : j1, c1 = c0 + run < j1 ? c0 + run : j1;
    uint32_t cut = 0;
    int ph = 0;
    unsigned long long above = 0;
    const bool topk = P.top_k > 0 && P.top_k < n && cnt_all > (unsigned long long)P.top_k;
    if (topk) {
        cut = dr_cut(w, j0, j1, thr, 0, false, (unsigned long long)P.top_k, ph, above, cand, s);
        dr_trim(w, j0, c0, c1, thr, cut, (unsigned long long)P.top_k - above, 0, s);
    }
    if (P.top_p > 0 && P.top_p < 1) {
        unsigned long long z_all = mass_all; /* the kept mass: after a top-k cut, summed again */
        if (topk) {
            unsigned long long z = 0;
            for (int i = j0 + (int)threadIdx.x; i < j1; i += DR_T) {
                const float e = w[i - j0];
                if (dr_kept0(e, thr) && __float_as_uint(e) >= cut) z += dr_mass(e);
            }
            z = warp_sum(z);
            if ((threadIdx.x & 31) == 0) atomicAdd(&s.z, z);
            cluster_sync();
            z_all = 0;
            for (uint32_t q = 0; q < DR_CL; q++) z_all += *dr_peer(&s.z, q);
        }
        unsigned long long target = (unsigned long long)((double)P.top_p * (double)z_all);
        if (target < 1) target = 1;
        cut = dr_cut(w, j0, j1, thr, cut, true, target, ph, above, cand, s);
        const unsigned long long tw = dr_mass(__uint_as_float(cut)); /* each tie's: above + j tw < target keeps tie j */
        dr_trim(w, j0, c0, c1, thr, cut, tw ? (target - above + tw - 1) / tw : (unsigned long long)V, 1, s);
    }

    /* 4. the total and the draw: thread t sums the kept e of its run [c0, c1) of the slice */
    __syncthreads(); /* every thread's e is in r */
    double sum = 0;
    int last = -1;
    for (int i = c0; i < c1; i++) {
        const float e = w[i - j0];
        if (dr_kept0(e, thr) && __float_as_uint(e) >= cut) {
            sum += e;
            last = i;
        }
    }
    const double incl = dr_scan_d(sum, s);
    if (threadIdx.x == DR_T - 1) s.tot = incl;
    if (threadIdx.x == 0) s.last = -1;
    __syncthreads();
    int wlast = last; /* the warp's, then one atomic a warp */
#pragma unroll
    for (int o = 16; o; o >>= 1) wlast = max(wlast, __shfl_xor_sync(0xffffffffu, wlast, o));
    if ((threadIdx.x & 31) == 0 && wlast >= 0) atomicMax(&s.last, wlast);
    cluster_sync();
    double base = 0, total = 0;
    int glast = -1, lrank = -1;
    for (uint32_t q = 0; q < DR_CL; q++) {
        const double t = *dr_peer(&s.tot, q);
        const int l = *dr_peer(&s.last, q);
        if (q == rank) base = total;
        total += t;
        if (l >= 0) { glast = l; lrank = (int)q; }
    }
    /* thread t's stretch: [base + incl(t - 1), base + incl(t)), the previous thread's incl read
     * back (incl - sum may differ from it by rounding): the stretches tile [0, total) */
    s.incl[threadIdx.x] = incl;
    __syncthreads();
    const double lo = base + (threadIdx.x ? s.incl[threadIdx.x - 1] : 0.0), hi = base + incl;
    const double u = P.u * total;
    if (u >= lo && u < hi) {
        double acc = lo;
        int pick = last;
        for (int i = c0; i < c1; i++) {
            const float e = w[i - j0];
            if (!(dr_kept0(e, thr) && __float_as_uint(e) >= cut)) continue;
            acc += e;
            if (u < acc) { pick = i; break; }
        }
        out[blockIdx.y] = pick;
    } else if (!(u < total) && (int)rank == lrank && last == glast && last >= 0) {
        out[blockIdx.y] = glast; /* u rounded up to the total */
    }
    __syncthreads(); /* the walk has read its e */
    const double inv = 1.0 / total;
    for (int i = j0 + (int)threadIdx.x; i < j1; i += DR_T) {
        const float e = w[i - j0];
        r[i] = dr_kept0(e, thr) && __float_as_uint(e) >= cut ? (float)(e * inv) : 0.0f;
    }
    cluster_sync(); /* peers are done reading this CTA's shared memory */
}

/* par: the rows' parameters on the host (passed with the launch) or, dev, in device memory */
static void draw_rows(m3_cuda *c, float *x, int rows, int V, size_t ld, const m3_draw_param *par, int dev, int32_t *out) {
    if (rows <= 0 || V <= 0 || c->failed) return;
    m3_cu_xsplit_touch(c, x, sizeof(float) * ((size_t)(rows - 1) * ld + (size_t)V));
    m3_cu_xsplit_touch(c, out, sizeof(int32_t) * (size_t)rows);
    m3_cu_prof_begin(c, OP_ARGMAX);
    /* the slices in shared memory while they fit (200,064 values: 100 KB a CTA); M3_DRAW_SMEM=0: not */
    static int sl_env = -1;
    if (sl_env < 0) sl_env = m3_cu_env_int("M3_DRAW_SMEM", 1) != 0;
    const size_t slice = sizeof(float) * (size_t)((V + DR_CL - 1) / DR_CL);
    int sl = sl_env && slice <= DR_SLICE_MAX;
    static unsigned long long sl_set; /* devices whose context has the attribute (a process may drive several) */
    const unsigned long long bit = 1ull << (c->dev & 63);
    if (sl && !(__atomic_load_n(&sl_set, __ATOMIC_ACQUIRE) & bit)) {
        /* not while recording (no attribute calls inside a capture): the slices in global memory */
        sl = !c->capturing &&
             cudaFuncSetAttribute(k_draw_rows<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, DR_SLICE_MAX) == cudaSuccess;
        if (sl) __atomic_fetch_or(&sl_set, bit, __ATOMIC_RELEASE);
        else if (!c->capturing) cudaGetLastError();
    }
    /* the cuts' candidates: a slice's worth of floats for each CTA of a launch */
    const int lrows = rows < DR_ROWS ? rows : DR_ROWS;
    float *cands = (float *)m3_cu_scratch(c, SC_DRAW, sizeof(float) * (size_t)lrows * DR_CL * (size_t)((V + DR_CL - 1) / DR_CL));
    if (!cands) { m3_cu_prof_end(c, OP_ARGMAX); return; }
    for (int r0 = 0; r0 < rows; r0 += DR_ROWS) {
        const int m = rows - r0 < DR_ROWS ? rows - r0 : DR_ROWS;
        dr_args a;
        memset(&a, 0, sizeof a);
        if (!dev) memcpy(a.p, par + r0, sizeof(m3_draw_param) * (size_t)m);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(DR_CL, (unsigned)m);
        cfg.blockDim = dim3(DR_T);
        cfg.stream = c->st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = DR_CL;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        cfg.dynamicSmemBytes = sl ? slice : 0;
        if (CK(c, cudaLaunchKernelEx(&cfg, sl ? k_draw_rows<true> : k_draw_rows<false>, x + (size_t)r0 * ld, V, ld, a,
                                     dev ? par + r0 : NULL, out + r0, cands)))
            break;
    }
    CK_LAUNCH(c, "draw rows");
    m3_cu_prof_end(c, OP_ARGMAX);
}

void m3_cu_draw_rows(void *ctx, float *x, int rows, int V, size_t ld, const m3_draw_param *par, int32_t *out) {
    draw_rows((m3_cuda *)ctx, x, rows, V, ld, par, 0, out);
}

void m3_cu_draw_rows_dev(void *ctx, float *x, int rows, int V, size_t ld, const m3_draw_param *par, int32_t *out) {
    draw_rows((m3_cuda *)ctx, x, rows, V, ld, par, 1, out);
}
