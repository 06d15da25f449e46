/* KV / index-K insert on the GPU with the spec's rounding (kv.cuh: write_row), and the fused
 * per-head norm + RoPE + insert (head_norm_rope_store).
 * CPU reference: src/backend/cpu/kv_store.c (m3_cpu_kv_store; m3_kv_store in src/kv/kv.c rounds);
 * the fused op: src/backend/cpu/rope.c (m3_cpu_head_norm_rope) then cpu_kv_store. */
#include <math.h>

#include "kv.cuh"

/* a block per (token, row): rows 0 .. 2 nkv - 1 the K then V heads, row 2 nkv the index key */
__global__ void k_kv_store(kvdesc d, const int32_t *pos, const int32_t *seq, const float *k, const float *v, const float *ik) {
    const int t = blockIdx.x, r = blockIdx.y, p = pos[t], slot = p % d.page;
    uint8_t *pg = page_of(d, seq[t], p);
    if (r < 2 * d.nkv) {
        int part = r / d.nkv, h = r % d.nkv;
        const float *src = (part ? v : k) + ((size_t)t * d.nkv + h) * d.D;
        write_row(pg + part * d.kvpart + ((size_t)h * d.page + slot) * d.rb, d.dt, src, d.D, threadIdx.x, blockDim.x);
    } else if (ik)
        write_row(pg + 2 * d.kvpart + (size_t)slot * d.irb, d.idt, ik + (size_t)t * d.Di, d.Di, threadIdx.x, blockDim.x);
}

void m3_cu_kv_store(void *ctx, m3_kv *kv, int layer, const m3_batch *b, const float *k, const float *v, const float *ik) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_KV);
    if (c->failed) { m3_cu_prof_end(c, OP_KV); return; }
    if (b != c->step_b) { m3_cu_failf(c, "CUDA backend: kv_store outside its step"); { m3_cu_prof_end(c, OP_KV); return; } }
    k_kv_store<<<dim3(b->T, 2 * kv->nkv + (ik ? 1 : 0)), 64, 0, c->st>>>(desc(c, kv, layer), c->d_pos, c->d_seq, k, v, ik);
    CK_LAUNCH(c, "kv_store");
    m3_cu_prof_end(c, OP_KV);
}

/* ------------------------------------------------------------------ norm + RoPE + KV insert
 * head_norm_rope_n and kv_store in one launch: a warp per (tensor, token, head) of q, k, index
 * q, index k, then a warp per (token, head) of v. A warp holds its head in registers (one load
 * round trip), normalizes it (double sum in the order of head_norm_rope_warp, rope.cu), rotates
 * it through its shared-memory row, writes it back, and writes k, index k and v rows into
 * their cache slots. Same arithmetic as the two ops it replaces. */
#define RS_MAXD 256 /* head dims up to this */
#define RS_WARPS 4
typedef struct { m3_rope_job j[4]; int n, first[6]; const float *v; } rope_store_jobs;

/* BF16: every cache row is bf16 (KV and index K): the write is that conversion alone, and the
 * kernel's code a fraction of the general one's (each decode kernel runs once an SM a layer, its
 * instructions arriving cold: session 27's ncu) */
template <bool BF16>
__global__ void __launch_bounds__(RS_WARPS * 32) k_head_norm_rope_kv_store(const __grid_constant__ rope_store_jobs a, float eps, int rot,
                                                               float theta, kvdesc d, const int32_t *pos, const int32_t *seq) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    __shared__ float rows[RS_WARPS][RS_MAXD];
    const int gw = blockIdx.x * RS_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (gw >= a.first[a.n + 1]) return;
    int i = 0;
    while (gw >= a.first[i + 1]) i++;
    const int local = gw - a.first[i];
    float *sv = rows[threadIdx.x / 32];
    const bool isv = i == a.n; /* a v row: stored as it is */
    const int heads = isv ? d.nkv : a.j[i].heads, dim = isv ? d.D : a.j[i].dim, t = local / heads, h = local % heads;
    float *x = isv ? (float *)a.v + (size_t)local * dim : a.j[i].x + (size_t)local * dim;
    float r[RS_MAXD / 32];
#pragma unroll
    for (int k = 0; k < RS_MAXD / 32; k++)
        if (lane + 32 * k < dim) r[k] = x[lane + 32 * k];
    const int p = pos[t];
    if (!isv) {
        const float *w = a.j[i].w;
        double ss = 0;
#pragma unroll
        for (int k = 0; k < RS_MAXD / 32; k++)
            if (lane + 32 * k < dim) ss += (double)r[k] * r[k];
#pragma unroll
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float rs = (float)(1.0 / sqrt(ss / dim + eps));
#pragma unroll
        for (int k = 0; k < RS_MAXD / 32; k++)
            if (lane + 32 * k < dim) sv[lane + 32 * k] = (r[k] * rs) * (1.0f + w[lane + 32 * k]);
        __syncwarp();
        rope_rotate(sv, rot, theta, (float)p, lane);
        __syncwarp();
        for (int k = lane; k < dim; k += 32) x[k] = sv[k];
    } else {
#pragma unroll
        for (int k = 0; k < RS_MAXD / 32; k++)
            if (lane + 32 * k < dim) sv[lane + 32 * k] = r[k];
        __syncwarp();
    }
    /* k (job 1), index k (job 3) and v rows go to the cache */
    if (i == 1 || i == 3 || isv) {
        uint8_t *pg = page_of(d, seq[t], p);
        const int slot = p % d.page;
        uint8_t *dst = i == 3 ? pg + 2 * d.kvpart + (size_t)slot * d.irb : pg + (isv ? d.kvpart : 0) + ((size_t)h * d.page + slot) * d.rb;
        const int n = i == 3 ? d.Di : d.D;
        if (BF16)
            for (int k = lane; k < n; k += 32) ((uint16_t *)dst)[k] = f32_bf16(sv[k]);
        else write_row(dst, i == 3 ? d.idt : d.dt, sv, n, lane, 32);
    }
}

void m3_cu_head_norm_rope_store(void *ctx, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim, double theta,
                                m3_kv *kv, int layer, const m3_batch *b, const float *v) {
    m3_cuda *c = (m3_cuda *)ctx;
    int fits = (n == 2 || n == 4) && kv->D <= RS_MAXD && kv->Di <= RS_MAXD && rotary_dim <= kv->D && b == c->step_b &&
               jobs[1].heads == kv->nkv && jobs[1].dim == kv->D && (n == 2 || (jobs[3].heads == 1 && jobs[3].dim == kv->Di));
    for (int i = 0; i < n && fits; i++) fits = jobs[i].dim <= RS_MAXD && rotary_dim <= jobs[i].dim;
    static int on = -1;
    if (on < 0) on = m3_cu_env_int("M3_ROPE_STORE", 1) != 0;
    if (!fits || !on) { /* the two ops */
        m3_cu_head_norm_rope_n(ctx, n, jobs, T, eps, rotary_dim, theta, b->pos);
        m3_cu_kv_store(ctx, kv, layer, b, jobs[1].x, v, n == 4 ? jobs[3].x : NULL);
        return;
    }
    m3_cu_prof_begin(c, OP_ROPE);
    if (c->failed) { m3_cu_prof_end(c, OP_ROPE); return; }
    rope_store_jobs a;
    memset(&a, 0, sizeof a);
    a.n = n;
    a.v = v;
    a.first[0] = 0;
    for (int i = 0; i < n; i++) {
        a.j[i] = jobs[i];
        a.first[i + 1] = a.first[i] + T * jobs[i].heads;
        m3_cu_xsplit_touch(c, jobs[i].x, sizeof(float) * (size_t)T * jobs[i].heads * jobs[i].dim);
    }
    a.first[n + 1] = a.first[n] + T * kv->nkv;
    kvdesc d = desc(c, kv, layer);
    static int bf16a = -1; /* M3_ROPE_BF16A=0: the general kernel for bf16 caches too */
    if (bf16a < 0) bf16a = m3_cu_env_int("M3_ROPE_BF16A", 1) != 0;
    if (bf16a && d.dt == M3_KV_BF16 && (n == 2 || d.idt == M3_KV_BF16))
        k_head_norm_rope_kv_store<true><<<cdiv(a.first[n + 1], RS_WARPS), RS_WARPS * 32, 0, c->st>>>(a, eps, rotary_dim, (float)theta, d,
                                                                                       c->d_pos, c->d_seq);
    else
        k_head_norm_rope_kv_store<false><<<cdiv(a.first[n + 1], RS_WARPS), RS_WARPS * 32, 0, c->st>>>(a, eps, rotary_dim, (float)theta, d,
                                                                                        c->d_pos, c->d_seq);
    CK_LAUNCH(c, "head_norm_rope + kv_store");
    m3_cu_prof_end(c, OP_ROPE);
}
