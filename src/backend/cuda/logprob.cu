/* Prompt logprobs on the GPU (ops.h logprob_rows): each row's log-softmax at one token, its rank
 * and its 20 most likely ids, so that only those leave the device (a 200,064-value row is 800 KB,
 * its answer 176 bytes). Each row is cut into slices over several CTAs (enough CTAs to fill the
 * GPU however few the rows); a CTA leaves its slice's largest value, its sum of exp(x - largest),
 * how many values beat the token's, whether a value is not finite, and its 20 best (value, id);
 * a CTA per row then joins the slices. Ties rank a lower id first, as m3_row_logprobs' do.
 * CPU reference: src/backend/cpu/logprob.c (base/rows.c m3_row_logprobs). */
#include "common.cuh"

#include <limits.h>

#define LP_T 256     /* threads of a slice's CTA */
#define LP_K M3_ROW_TOP_MAX
#define LP_ROWS 256  /* rows a launch takes (their tokens by value: 1 KB) */
#define LP_SMAX 64   /* slices a row at most (the join's threads) */

struct lp_args { int32_t tok[LP_ROWS]; };
struct lp_part {
    float m, s; /* largest value of [0, n) in the slice; sum of exp(x - m) */
    int cnt, bad;
    float tv[LP_K];
    int ti[LP_K]; /* best first; INT_MAX: empty */
};

/* (m, s) of the union of two sets: s scaled to the larger m (an empty set: m -inf, s 0) */
__device__ __forceinline__ void lp_join(float &m, float &s, float m2, float s2) {
    if (m2 > m) {
        s = (m > -INFINITY ? s * expf(m - m2) : 0.0f) + s2;
        m = m2;
    } else if (m2 > -INFINITY) {
        s += s2 * expf(m2 - m);
    }
}

/* (v, i) ranks before (w, j): larger, or as large at a lower id */
__device__ __forceinline__ bool lp_better(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

/* the block's best of each thread's (v, i); every thread gets it */
template <int NT>
__device__ __forceinline__ void lp_block_best(float &v, int &i, float *sv, int *si) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        const int j = __shfl_xor_sync(0xffffffffu, i, o);
        if (lp_better(w, j, v, i)) { v = w; i = j; }
    }
    if (NT > 32) {
        if (threadIdx.x % 32 == 0) { sv[threadIdx.x / 32] = v; si[threadIdx.x / 32] = i; }
        __syncthreads();
        v = sv[0];
        i = si[0];
        for (int w = 1; w < NT / 32; w++)
            if (lp_better(sv[w], si[w], v, i)) { v = sv[w]; i = si[w]; }
        __syncthreads();
    }
}

/* grid (slice, row): part[row * S + slice] over the values [slice * slen, +slen) of the row */
__global__ void __launch_bounds__(LP_T) k_logprob_rows_part(const float *x, int n, int V, size_t ld, int S, int slen, int k,
                                                  const __grid_constant__ lp_args a, lp_part *part) {
    __shared__ float sv[LP_K][LP_T];
    __shared__ int si[LP_K][LP_T];
    __shared__ float wm[LP_T / 32], ws[LP_T / 32];
    __shared__ int wc[LP_T / 32], wb[LP_T / 32];
    __shared__ float rv[LP_T / 32];
    __shared__ int ri[LP_T / 32];
    const int row = blockIdx.y, tok = a.tok[row];
    const float *r = x + (size_t)row * ld;
    const bool has_t = tok >= 0 && tok < n;
    const float xt = has_t ? r[tok] : 0.0f;
    const int i0 = blockIdx.x * slen, i1 = V - i0 < slen ? V : i0 + slen;
    float m = -INFINITY, s = 0.0f, tv[LP_K];
    int cnt = 0, bad = 0, ti[LP_K];
#pragma unroll
    for (int j = 0; j < LP_K; j++) { tv[j] = -INFINITY; ti[j] = INT_MAX; }
#pragma unroll 4
    for (int i = i0 + (int)threadIdx.x; i < i1; i += LP_T) {
        const float v = r[i];
        bad |= (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
        if (i >= n) continue;
        if (v > m) {
            s = (m > -INFINITY ? s * expf(m - v) : 0.0f) + 1.0f;
            m = v;
        } else if (v > -INFINITY) {
            s += expf(v - m);
        }
        cnt += has_t && v > xt;
        if (v > tv[LP_K - 1]) { /* ids arrive in order: an equal value later ranks after */
            float cv = v;
            int ci = i;
#pragma unroll
            for (int j = 0; j < LP_K; j++) {
                const bool sw = cv > tv[j];
                const float t = tv[j];
                const int u = ti[j];
                tv[j] = sw ? cv : t;
                ti[j] = sw ? ci : u;
                cv = sw ? t : cv;
                ci = sw ? u : ci;
            }
        }
    }
    /* the slice's stats */
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        lp_join(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
        cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
    }
    bad = __any_sync(0xffffffffu, bad);
    if (threadIdx.x % 32 == 0) {
        wm[threadIdx.x / 32] = m;
        ws[threadIdx.x / 32] = s;
        wc[threadIdx.x / 32] = cnt;
        wb[threadIdx.x / 32] = bad;
    }
#pragma unroll
    for (int j = 0; j < LP_K; j++) { sv[j][threadIdx.x] = tv[j]; si[j][threadIdx.x] = ti[j]; }
    __syncthreads();
    lp_part *p = part + (size_t)row * S + blockIdx.x;
    if (threadIdx.x == 0) {
        float M = wm[0], Sm = ws[0];
        int C = wc[0], B = wb[0];
        for (int w = 1; w < LP_T / 32; w++) {
            lp_join(M, Sm, wm[w], ws[w]);
            C += wc[w];
            B |= wb[w];
        }
        p->m = M;
        p->s = Sm;
        p->cnt = C;
        p->bad = B;
    }
    /* the slice's k best: k rounds, each taking the best head of the threads' sorted lists */
    int h = 0;
    for (int q = 0; q < k; q++) {
        float v = h < LP_K ? sv[h][threadIdx.x] : -INFINITY;
        int i = h < LP_K ? si[h][threadIdx.x] : INT_MAX;
        lp_block_best<LP_T>(v, i, rv, ri);
        if (threadIdx.x == 0) { p->tv[q] = v; p->ti[q] = i; }
        if (i != INT_MAX && h < LP_K && si[h][threadIdx.x] == i) h++; /* ids are unique: the winner's head */
    }
}

/* a CTA of LP_SMAX threads per row joins its S slices */
__global__ void __launch_bounds__(LP_SMAX) k_logprob_rows_join(const lp_part *part, int S, int n, int k, const __grid_constant__ lp_args a,
                                                     const float *x, size_t ld, m3_row_lp *out) {
    __shared__ float rv[LP_SMAX / 32];
    __shared__ int ri[LP_SMAX / 32];
    __shared__ float jm[LP_SMAX], js[LP_SMAX];
    __shared__ int jc[LP_SMAX], jb[LP_SMAX];
    const int row = blockIdx.x, t = threadIdx.x;
    const lp_part *p = part + (size_t)row * S;
    jm[t] = t < S ? p[t].m : -INFINITY;
    js[t] = t < S ? p[t].s : 0.0f;
    jc[t] = t < S ? p[t].cnt : 0;
    jb[t] = t < S ? p[t].bad : 0;
    __syncthreads();
    m3_row_lp *o = out + row;
    /* the top k over the slices' sorted lists (the log-sum-exp first, in double, by thread 0) */
    __shared__ double lse_s;
    if (t == 0) {
        float M = -INFINITY;
        for (int j = 0; j < S; j++) M = jm[j] > M ? jm[j] : M;
        double sum = 0;
        for (int j = 0; j < S; j++)
            if (jm[j] > -INFINITY) sum += (double)js[j] * exp((double)jm[j] - (double)M);
        int C = 0, B = 0;
        for (int j = 0; j < S; j++) { C += jc[j]; B |= jb[j]; }
        const double lse = (double)M + log(sum);
        lse_s = lse;
        const int tok = a.tok[row];
        if (tok >= 0 && tok < n) {
            o->logprob = (float)((double)x[(size_t)row * ld + tok] - lse);
            o->rank = 1 + C;
        } else {
            o->logprob = -INFINITY;
            o->rank = n + 1;
        }
        o->fin = !B;
    }
    __syncthreads();
    const double lse = lse_s;
    int h = 0, got = 0;
    for (int q = 0; q < k; q++) {
        float v = t < S && h < k ? p[t].tv[h] : -INFINITY;
        int i = t < S && h < k ? p[t].ti[h] : INT_MAX;
        const int mine = i;
        lp_block_best<LP_SMAX>(v, i, rv, ri);
        if (i == INT_MAX) break; /* fewer than k values */
        if (t == 0) {
            o->top_ids[q] = i;
            o->top_lp[q] = (float)((double)v - lse);
        }
        got++;
        if (mine == i) h++;
    }
    if (t == 0) o->n_top = got;
}

static void logprob_rows(m3_cuda *c, const float *x, int rows, int n, int V, size_t ld, const int32_t *tok, int k,
                         m3_row_lp *out) {
    if (rows <= 0 || V <= 0 || c->failed) return;
    if (k > LP_K) k = LP_K;
    if (k < 0) k = 0;
    if (n > V) n = V;
    m3_cu_xsplit_touch(c, out, sizeof(m3_row_lp) * (size_t)rows);
    m3_cu_prof_begin(c, OP_LOGPROB);
    const int lrows = rows < LP_ROWS ? rows : LP_ROWS;
    /* slices: about two CTAs an SM for the launch's rows, each at least LP_T * 8 values */
    int S = (2 * c->sm_count + lrows - 1) / lrows;
    const int smax = (V + LP_T * 8 - 1) / (LP_T * 8);
    S = S > smax ? smax : S;
    S = S > LP_SMAX ? LP_SMAX : S < 1 ? 1 : S;
    int slen = (V + S - 1) / S;
    slen = (slen + LP_T - 1) / LP_T * LP_T;
    S = (V + slen - 1) / slen;
    lp_part *part = (lp_part *)m3_cu_scratch(c, SC_LOGP, sizeof(lp_part) * (size_t)lrows * (size_t)S);
    if (!part) { m3_cu_prof_end(c, OP_LOGPROB); return; }
    for (int r0 = 0; r0 < rows; r0 += LP_ROWS) {
        const int m = rows - r0 < LP_ROWS ? rows - r0 : LP_ROWS;
        lp_args a;
        memset(&a, 0, sizeof a);
        memcpy(a.tok, tok + r0, sizeof(int32_t) * (size_t)m);
        k_logprob_rows_part<<<dim3((unsigned)S, (unsigned)m), LP_T, 0, c->st>>>(x + (size_t)r0 * ld, n, V, ld, S, slen, k, a, part);
        k_logprob_rows_join<<<m, LP_SMAX, 0, c->st>>>(part, S, n, k, a, x + (size_t)r0 * ld, ld, out + r0);
        CK_LAUNCH(c, "logprob rows");
        if (c->failed) break;
    }
    m3_cu_prof_end(c, OP_LOGPROB);
}

void m3_cu_logprob_rows(void *ctx, const float *x, int rows, int n, int V, size_t ld, const int32_t *tok, int k,
                        m3_row_lp *out) {
    logprob_rows((m3_cuda *)ctx, x, rows, n, V, ld, tok, k, out);
}
