/* The keys of a token tile, shared by the prefill attention kernels that read each chunk of K / V
 * once for several neighbouring tokens (attention_tile.cu on mma.sync, attention_wg.cu on wgmma).
 *
 * A tile is TT consecutive tokens of the step (one KV group); its runs are the stretches of them
 * that belong to one sequence. On dense layers a run's keys are [0, its last position], cut in
 * chunks of CH keys. On sparse layers each token selected topk distinct blocks (the indexer's
 * top-k); the tile's keys are the union of its tokens' blocks as (run << 24 | block), walked in
 * ascending order, each block cut in cpb = ceil(B / CH) chunks. A token's chunks are then its own
 * blocks in ascending order, whatever its neighbours chose. */
#ifndef M3_CUDA_ATTN_KEYS_CUH
#define M3_CUDA_ATTN_KEYS_CUH

#include <limits.h>
#include <stdint.h>

#define TILE_NOKEY INT_MAX /* an empty selection slot: sorts last */

/* the tables, in shared memory (tile_keys_at carves them) */
struct tile_keys {
    int *trun, *tpos;       /* per token of the tile: its run (-1: none) and position */
    int *rseq, *rmax, *rch; /* per run: sequence, last position; dense: its chunks */
    int *nch;               /* [0]: the tile's chunks; [1]: sparse, its distinct keys */
    int *skey;              /* [TT][topk]: each token's keys, ascending (TILE_NOKEY last) */
    int *ukey;              /* [TT topk]: the tile's distinct keys, ascending */
    int *raw, *first;       /* [TT topk] each: scratch of the sort */
    int *umask;             /* NULL, or [TT topk]: per distinct key, the tokens (bit w) that chose it */
};

/* ints the tables take */
static inline __host__ __device__ size_t tile_keys_ints(int tt, int topk, bool umask) {
    return 5 * (size_t)tt + 4 + (4 + (umask ? 1 : 0)) * (size_t)tt * topk;
}
/* the tables at p (16-byte aligned: the key arrays start 16-byte aligned for tt a multiple of 4) */
static __host__ __device__ __forceinline__ tile_keys tile_keys_at(int *p, int tt, int topk, bool umask) {
    tile_keys k;
    k.trun = p;
    k.tpos = p + tt;
    k.rseq = p + 2 * tt;
    k.rmax = p + 3 * tt;
    k.rch = p + 4 * tt;
    k.nch = p + 5 * tt;
    k.skey = k.nch + 4;
    k.ukey = k.skey + tt * topk;
    k.raw = k.ukey + tt * topk;
    k.first = k.raw + tt * topk;
    k.umask = umask ? k.first + tt * topk : NULL;
    return k;
}

/* Fills the tables of the tile of tokens [t0, t0 + TT) (those below T), group g: every thread of
 * the CTA (tid of nt) calls it; it ends with the tables visible to all. sel: NULL on dense layers,
 * else [T][nkv][topk] block ids (-1: none), as pos and seq of the launch's tokens. topk <= 64 (the sort is
 * quadratic in the tile's TT x topk slots). */
template <int TT>
static __device__ void tile_keys_build(const tile_keys &k, const int32_t *pos, const int32_t *seq, const int32_t *sel, int t0, int T,
                                       int g, int nkv, int topk, int ch, int cpb, int tid, int nt) {
    if (tid == 0) {
        int nr = 0;
        for (int w = 0; w < TT; w++) {
            k.trun[w] = -1;
            k.tpos[w] = -1;
            if (t0 + w >= T) continue;
            const int s = seq[t0 + w], p = pos[t0 + w];
            if (nr == 0 || k.rseq[nr - 1] != s) { k.rseq[nr] = s; k.rmax[nr] = p; nr++; }
            else k.rmax[nr - 1] = max(k.rmax[nr - 1], p);
            k.trun[w] = nr - 1;
            k.tpos[w] = p;
        }
        int tot = 0;
        for (int r = 0; r < nr; r++) { k.rch[r] = k.rmax[r] / ch + 1; tot += k.rch[r]; }
        k.nch[0] = tot; /* dense; sparse below */
        k.nch[1] = 0; /* sparse: counted below */
    }
    __syncthreads();
    if (!sel) return;
    const int n = TT * topk;
    for (int i = tid; i < n; i += nt) {
        const int w = i / topk, r = k.trun[w];
        const int b = r >= 0 ? sel[((size_t)(t0 + w) * nkv + g) * topk + i % topk] : -1;
        k.raw[i] = b >= 0 ? (r << 24 | b) : TILE_NOKEY;
    }
    __syncthreads();
    for (int i = tid; i < n; i += nt) {
        const int key = k.raw[i], w = i / topk;
        int rk = 0, f = key != TILE_NOKEY;
        for (int j = w * topk; j < w * topk + topk; j++) rk += k.raw[j] < key || (k.raw[j] == key && j < i);
        k.skey[w * topk + rk] = key;
        for (int j = 0; j < i && f; j++) f = k.raw[j] != key;
        k.first[i] = f; /* the key's first slot in the tile */
        if (f) atomicAdd(&k.nch[1], 1);
    }
    __syncthreads();
    for (int i = tid; i < n; i += nt)
        if (k.first[i]) {
            int rk = 0;
            for (int j = 0; j < n; j++) rk += k.first[j] && k.raw[j] < k.raw[i];
            k.ukey[rk] = k.raw[i];
            if (k.umask) k.umask[rk] = 0;
        }
    if (tid == 0) k.nch[0] = k.nch[1] * cpb;
    __syncthreads();
    if (!k.umask) return;
    const int nu = k.nch[1];
    for (int i = tid; i < n; i += nt) {
        const int key = k.raw[i];
        if (key == TILE_NOKEY) continue;
        int lo = 0, hi = nu - 1; /* ukey is ascending and holds key */
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (k.ukey[mid] < key) lo = mid + 1; else hi = mid;
        }
        atomicOr(&k.umask[lo], 1 << (i / topk));
    }
    __syncthreads();
}

/* chunk i of the tile: its run r, keys [a, e) (e <= a: none left before the run's last position)
 * and, sparse, its key (0 dense) */
static __host__ __device__ __forceinline__ void tile_chunk(const tile_keys &k, bool sparse, int i, int B, int ch, int cpb, int *r, int *a, int *e,
                                                  int *key) {
    if (sparse) {
        const int kk = k.ukey[i / cpb], blk = kk & 0xffffff;
        *r = kk >> 24;
        *key = kk;
        *a = blk * B + (i % cpb) * ch;
        *e = min(min(*a + ch, blk * B + B), k.rmax[*r] + 1);
    } else {
        int r0 = 0;
        while (i >= k.rch[r0]) i -= k.rch[r0++];
        *r = r0;
        *key = 0;
        *a = i * ch;
        *e = min(*a + ch, k.rmax[r0] + 1);
    }
}

/* The tile's chunks in order, walked without dividing (attention_wg.cu: the chunk index's divisions
 * by cpb, and a dense tile's search of its runs, cost a consumer's every chunk): sparse, distinct key
 * u and chunk sub of its cpb; dense, run u and chunk sub of its rch[u]. Chunk i of the walk is
 * tile_chunk's chunk i (tests/gpu/test_attn_keys.cu). */
struct tile_walk {
    int u, sub;
};
static __host__ __device__ __forceinline__ void tile_walk_next(const tile_keys &k, bool sparse, int cpb, tile_walk &w) {
    if (++w.sub == (sparse ? cpb : k.rch[w.u])) {
        w.sub = 0;
        w.u++;
    }
}
/* the walk's chunk: run r, keys [a, e) (e <= a: none), and the tokens (bit t) whose selection holds its
 * block (-1: dense, every token of the run) */
static __host__ __device__ __forceinline__ void tile_walk_at(const tile_keys &k, bool sparse, const tile_walk &w, int B, int ch, int *r, int *a,
                                                    int *e, int *um) {
    if (sparse) {
        const int kk = k.ukey[w.u], blk = kk & 0xffffff;
        *r = kk >> 24;
        *a = blk * B + w.sub * ch;
        *e = min(min(*a + ch, blk * B + B), k.rmax[*r] + 1);
        *um = k.umask ? k.umask[w.u] : -1;
    } else {
        *r = w.u;
        *a = w.sub * ch;
        *e = min(*a + ch, k.rmax[w.u] + 1);
        *um = -1;
    }
}

#endif
