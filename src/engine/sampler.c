/* Sampling pipeline (see sampler.h for the order and the semantics).
 *
 * Speed at V = 200064: no sort of the row. One vectorized pass computes e_i = exp((l_i - max) / T),
 * the kept mass per block of ids and the tokens above two cut levels; top-k / top-p gather only
 * the tokens above a level that surely holds their set and select in linear time (keep()). */
#include "sampler.h"
#include "../base/hash.h"
#include "../base/fault.h"
#include "../base/pool.h"

/* counted by the fault-injection hook (fault.h) as engine allocations */
#define s_malloc(n) m3_fault_malloc(M3_FAULT_ENGINE, n)
#define s_calloc(k, n) m3_fault_calloc(M3_FAULT_ENGINE, k, n)
#define s_realloc(p, n) m3_fault_realloc(M3_FAULT_ENGINE, p, n)

#include "../base/rows.h" /* vectorized row passes */

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- RNG ---------------- */

void m3_rng_seed(m3_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = m3_splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next(m3_rng *r) { /* xoshiro256** */
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return res;
}

double m3_rng_uniform(m3_rng *r) { return (next(r) >> 11) * 0x1.0p-53; }

double m3_rng_normal(m3_rng *r) {
    const double u = m3_rng_uniform(r), v = m3_rng_uniform(r);
    return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

int m3_argmax(const float *x, int n) { return m3_row_argmax(x, n); } /* first index wins ties */

/* ---------------- workspace ---------------- */

/* A candidate as one integer key, e's bits above ~id (m3_row_keys_above builds them). e >= 0, so
 * a larger key ranks first: a larger e, then a lower id (the order every step below uses). */
typedef uint64_t cand;

static float ck_e(cand c) {
    const uint32_t u = (uint32_t)(c >> 32);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static int32_t ck_id(cand c) { return (int32_t)~(uint32_t)c; }

#define NBLK(V) (((V) + M3_ROW_MASS_BLOCK - 1) / M3_ROW_MASS_BLOCK)

struct m3_sample_ws {
    int V;
    float *w;    /* working logits */
    float *e;    /* exp((w - max) / T) */
    cand *c;     /* candidates */
    m3_row_blk *blk; /* per block of M3_ROW_MASS_BLOCK ids: the kept mass, the levels' counts / masses */
    m3_pool *pool;   /* the row's passes split over its threads (NULL: the caller's thread) */
    void *own;   /* non-NULL when the workspace owns the memory */
};

/* c has 8 spare keys: m3_row_keys_above stores 8 at a time */
static size_t ws_bytes(int V) { return ((size_t)V + 8) * sizeof(cand) + 2 * sizeof(float) * (size_t)V + sizeof(m3_row_blk) * (size_t)NBLK(V); }

static void ws_over(m3_sample_ws *ws, int V, void *mem) {
    ws->V = V;
    ws->c = mem; /* 8-byte members first: cand, then (after 2 V floats) the block sums */
    ws->w = (float *)(ws->c + V + 8);
    ws->e = ws->w + V;
    ws->blk = (m3_row_blk *)(ws->e + V);
    ws->pool = NULL;
    ws->own = NULL;
}

m3_sample_ws *m3_sample_ws_create(int V, m3_err *err) {
    if (V <= 0) { m3_errf(err, "sampler workspace: vocabulary size %d, expected > 0", V); return NULL; }
    m3_sample_ws *ws = s_malloc(sizeof *ws);
    void *mem = s_malloc(ws_bytes(V));
    if (!ws || !mem) {
        free(ws); free(mem);
        m3_errf(err, "sampler workspace: out of memory for V=%d", V);
        return NULL;
    }
    ws_over(ws, V, mem);
    ws->own = mem;
    return ws;
}

void m3_sample_ws_free(m3_sample_ws *ws) {
    if (!ws) return;
    free(ws->own);
    free(ws);
}

size_t m3_sample_scratch_bytes(int V) { return ws_bytes(V); }

/* ---------------- selection over candidate keys ---------------- */

static void swapc(cand *a, cand *b) { cand t = *a; *a = *b; *b = t; }

/* min-heap by key over c[0..n) (the worst at the root): c[r] moved down to its place */
static void sift_down(cand *c, int n, int r) {
    for (;;) {
        const int l = 2 * r + 1;
        int m = r;
        if (l < n && c[l] < c[m]) m = l;
        if (l + 1 < n && c[l + 1] < c[m]) m = l + 1;
        if (m == r) return;
        swapc(&c[r], &c[m]);
        r = m;
    }
}

/* sorts c[0..n) best first: insertion for a few, heapsort beyond (no quadratic case) */
static void sort_best_first(cand *c, int n) {
    if (n <= 24) {
        for (int i = 1; i < n; i++) {
            cand x = c[i];
            int j = i;
            while (j > 0 && c[j - 1] < x) { c[j] = c[j - 1]; j--; }
            c[j] = x;
        }
        return;
    }
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(c, n, i);
    for (int end = n - 1; end > 0; end--) { /* the worst to the back */
        swapc(&c[0], &c[end]);
        sift_down(c, end, 0);
    }
}

/* Partitions c[lo..hi) (hi - lo >= 3) around the median of its first, middle and last keys:
 * returns p with c[lo..p) better than c[p], better than c[p+1..hi); *upper gets the mass of
 * c[lo..p). Keys are distinct (the id is in them). */
static int partition(cand *c, int lo, int hi, double *upper) {
    const int mid = lo + (hi - lo) / 2, last = hi - 1;
    if (c[mid] < c[lo]) swapc(&c[mid], &c[lo]);
    if (c[last] < c[lo]) swapc(&c[last], &c[lo]);
    if (c[last] < c[mid]) swapc(&c[last], &c[mid]);
    swapc(&c[mid], &c[last]); /* the median to the back */
    const cand piv = c[last];
    double mu = 0;
    int i = lo;
    for (int j = lo; j < last; j++) { /* branch-free: every key swapped, i advanced past the better ones */
        const cand x = c[j];
        const int up = x > piv;
        c[j] = c[i];
        c[i] = x;
        mu += up ? (double)ck_e(x) : 0.0;
        i += up;
    }
    swapc(&c[i], &c[last]);
    *upper = mu;
    return i;
}

/* partitions allowed before the rest of a range is sorted instead (keeps the worst case n log n) */
static _Atomic int part_budget_cap = -1; /* tests: m3_sampler_test_part_budget */

static int part_budget(int n) {
    const int cap = part_budget_cap;
    if (cap >= 0) return cap;
    int b = 16;
    while (n > 1) { n >>= 1; b += 2; }
    return b;
}

void m3_sampler_test_part_budget(int cap) { part_budget_cap = cap; }

/* c[0..k) := the k best of c[0..n), in no particular order (0 < k < n) */
static void select_best(cand *c, int n, int k) {
    int lo = 0, hi = n, budget = part_budget(n);
    while (hi - lo > 24 && budget-- > 0) { /* c[0..lo) better than c[lo..hi), better than c[hi..n); lo <= k <= hi */
        double mu;
        const int p = partition(c, lo, hi, &mu);
        if (p == k || p + 1 == k) return;
        if (p > k) hi = p;
        else lo = p + 1;
    }
    sort_best_first(c + lo, hi - lo);
}

/* The smallest prefix of c[0..n) in rank order whose mass reaches lim (at least one token) is
 * moved to c[0..j), in no particular order; returns j, its mass in *mass. */
static int select_mass(cand *c, int n, double lim, double *mass) {
    int lo = 0, hi = n, budget = part_budget(n);
    double acc = 0; /* mass of c[0..lo): all kept, and short of lim */
    while (hi - lo > 24 && budget-- > 0) {
        double mu;
        const int p = partition(c, lo, hi, &mu);
        if (p > lo && acc + mu >= lim) { hi = p; continue; } /* it ends inside c[lo..p) */
        acc += mu + (double)ck_e(c[p]);
        if (acc >= lim) { *mass = acc; return p + 1; }
        lo = p + 1;
    }
    sort_best_first(c + lo, hi - lo);
    int j = lo;
    while (j < hi && (j == 0 || acc < lim)) acc += (double)ck_e(c[j++]);
    *mass = acc;
    return j;
}

/* log_softmax of x[0..V) (base/rows.c m3_row_logprobs): the chosen token's logprob and rank, and the top k. */
static void logprobs_of(const float *x, int V, int chosen, int k, m3_sample_out *out) {
    m3_row_lp lp;
    m3_row_logprobs(x, V, chosen, k, &lp);
    m3_sample_from_row_lp(&lp, k, out);
}

void m3_sample_from_row_lp(const m3_row_lp *lp, int k, m3_sample_out *out) {
    out->logprob = lp->logprob;
    out->rank = lp->rank;
    out->n_top = lp->n_top < k ? lp->n_top : k < 0 ? 0 : k;
    for (int j = 0; j < out->n_top; j++) {
        out->top_ids[j] = lp->top_ids[j];
        out->top_logprobs[j] = lp->top_lp[j];
    }
}

void m3_logprobs_row(const float *logits, int n, int32_t token, int k, m3_sample_out *out) {
    memset(out, 0, sizeof *out);
    out->token = token;
    if (k > M3_SAMPLE_MAX_TOP_LOGPROBS) k = M3_SAMPLE_MAX_TOP_LOGPROBS;
    if (k < 0) k = 0;
    logprobs_of(logits, n, token, k, out); /* a token that is not a text id: -inf, rank n + 1 */
}

/* ---------------- the sampling core ---------------- */

typedef struct {
    int greedy;
    int n_kept;        /* kept = ws->c[0..n_kept), in no particular order; id-order path: -1 */
    float minp_thr;
    double total;      /* mass of the kept tokens */
} pick_info;

/* kept by min-p (and not masked): e > 0 and e >= thr */
static int kept_e(float x, float thr) { return x > 0 && x >= thr; }

/* c := the keys of the kept tokens whose e is also >= lvl; returns how many */
static int gather(const float *e, int V, float thr, float lvl, cand *c) {
    const float t = lvl > thr ? lvl : thr;
    return t > 0 ? m3_row_keys_above(e, V, t, 1, c) : m3_row_keys_above(e, V, 0.0f, 0, c);
}

/* ---------------- a row's passes over several threads ---------------- */

/* below this many ids a row is not split (the threads' start costs more than they save);
 * tests lower it (m3_sampler_test_split_min) */
static _Atomic int split_min = 32768;

void m3_sampler_test_split_min(int n) { split_min = n; }
/* blocks a thread takes at a time: 32 (8,192 ids), or 1 in a row of few blocks */
static size_t split_grain(int V) { return NBLK(V) >= 4 * 32 ? 32 : 1; }

typedef struct {
    const float *w;
    float *e, *out;
    m3_row_blk *blk;
    int V, want;
    float m, s, thr, lv[2];
    double inv;
} row_job;

static void exp_range(void *ctx, size_t b0, size_t b1, int worker) {
    (void)worker;
    const row_job *j = ctx;
    const int i0 = (int)b0 * M3_ROW_MASS_BLOCK, i1 = (int)b1 * M3_ROW_MASS_BLOCK < j->V ? (int)b1 * M3_ROW_MASS_BLOCK : j->V;
    m3_row_exp_stats(j->w + i0, j->e + i0, i1 - i0, j->m, j->s, j->thr, j->lv, j->want, j->blk + b0);
}

/* m3_row_exp_stats over the row into ws->e and ws->blk, split over ws->pool by whole blocks:
 * every block's figures are those of one pass */
static void exp_pass(m3_sample_ws *ws, const float *w, int V, float m, float s, float thr, const float lv[2], int want) {
    if (!ws->pool || V < split_min) { m3_row_exp_stats(w, ws->e, V, m, s, thr, lv, want, ws->blk); return; }
    row_job j = {.w = w, .e = ws->e, .blk = ws->blk, .V = V, .want = want, .m = m, .s = s, .thr = thr, .lv = {lv[0], lv[1]}};
    m3_pool_for(ws->pool, (size_t)NBLK(V), split_grain(V), exp_range, &j);
}

static void scale_range(void *ctx, size_t b0, size_t b1, int worker) {
    (void)worker;
    const row_job *j = ctx;
    const int i0 = (int)b0 * M3_ROW_MASS_BLOCK, i1 = (int)b1 * M3_ROW_MASS_BLOCK < j->V ? (int)b1 * M3_ROW_MASS_BLOCK : j->V;
    m3_row_scale_kept(j->e + i0, i1 - i0, j->thr, j->inv, j->out + i0);
}

/* out = the kept e scaled by inv (m3_row_scale_kept), split over ws->pool */
static void scale_pass(m3_sample_ws *ws, int V, float thr, double inv, float *out) {
    if (!ws->pool || V < split_min) { m3_row_scale_kept(ws->e, V, thr, inv, out); return; }
    row_job j = {.e = ws->e, .out = out, .V = V, .thr = thr, .inv = inv};
    m3_pool_for(ws->pool, (size_t)NBLK(V), split_grain(V), scale_range, &j);
}

void m3_sample_ws_set_pool(m3_sample_ws *ws, m3_pool *pool) {
    if (ws) ws->pool = pool;
}

/* Levels of the candidate cut, powers of 2 of the largest e (1): the tokens at or above the first
 * level that holds enough of them (top-k) or enough mass (top-p) are the candidates; the rest
 * are never gathered. Without either, every kept token is. */
static const int CUT_EXP[2] = {-8, -20};

/* Steps 3-4 up to the draw, on the working logits w (already biased / penalized: ws->w, or the
 * logits themselves when steps 1-2 change nothing): the kept
 * tokens and their weights (ws->e; with top-k / top-p, ws->c[0..n_kept)) and their total mass.
 * Greedy: returns the argmax; otherwise -1 (the caller draws with draw()).
 *
 * Speed at V = 200064: one vectorized pass computes e_i = exp((w_i - max) / T), the kept mass per
 * block of ids, and how many tokens (and how much mass) lie above two cut levels. With top-k or
 * top-p, only the tokens above the highest level that surely holds the top-k set (enough tokens)
 * or the top-p set (enough mass) are gathered; a quickselect then finds the k best and the
 * smallest top-p prefix without sorting them. Without top-k / top-p the draw skips whole blocks
 * by their mass and walks one block in id order. */
static int keep(const m3_sampling *p, const float *w, m3_sample_ws *ws, int V, pick_info *pi) {
    memset(pi, 0, sizeof *pi);
    pi->n_kept = -1;
    if (!(p->temperature >= 1e-5f)) { pi->greedy = 1; return m3_argmax(w, V); }
    const int am = m3_argmax(w, V);
    const float m = w[am];
    /* every logit -inf (the caller reports it), or a +inf one (all the probability): no draw */
    if (!isfinite(m)) { pi->greedy = 1; return am; }
    const float invT = 1.0f / p->temperature;
    const float thr = p->min_p > 0 ? (p->min_p > 1 ? 1.0f : p->min_p) : 0.0f; /* e_max == 1 */
    pi->minp_thr = thr;
    const int use_k = p->top_k > 0 && p->top_k < V;
    const int use_p = p->top_p > 0 && p->top_p < 1;
    float *e = ws->e;
    float lv[2];
    for (int j = 0; j < 2; j++) lv[j] = ldexpf(1.0f, CUT_EXP[j]) > thr ? ldexpf(1.0f, CUT_EXP[j]) : thr;
    /* e = exp((w - max) / T) (-inf -> 0), the kept mass per block (e < thr adds 0: thr 0 keeps
     * only e > 0, and 0 adds nothing), and above the levels the counts (top-k) or masses (top-p);
     * then their sums over the row, block by block in id order (the same for any split) */
    exp_pass(ws, w, V, m, invT, thr, lv, use_p && !use_k ? 2 : use_k ? 1 : 0);
    int cnt[2] = {0, 0};
    double lmass[2] = {0, 0}, zm = 0; /* zm: mass passing min-p */
    for (int b = 0; b < NBLK(V); b++) {
        const m3_row_blk *B = &ws->blk[b];
        zm += B->kept;
        for (int j = 0; j < 2; j++) { cnt[j] += B->lcnt[j]; lmass[j] += B->lmass[j]; }
    }
    if (!use_k && !use_p) { /* min-p at most: draw in id order */
        pi->total = zm;
        return -1;
    }
    /* the cut: the highest level above which the top-k set surely lies (at least k tokens), or,
     * without top-k, the top-p set (the mass there reaches top_p of the whole, with a margin for
     * the float sums within a block); 0: every kept token */
    const int need_n = use_k ? p->top_k : 1;
    const double need_m = use_p && !use_k ? (double)p->top_p * zm : 0;
#define ENOUGH(k, ms) ((k) >= need_n && (ms) >= need_m * (1 + 1e-4))
    float cut = 0;
    if (ENOUGH(cnt[0], lmass[0])) {
        cut = lv[0];
    } else if (ENOUGH(cnt[1], lmass[1])) {
        /* between the two levels: while the cut would gather many, halve the gap (in powers of 2)
         * with one more pass over e */
        int hi = CUT_EXP[0], lo = CUT_EXP[1], ncut = cnt[1];
        cut = lv[1];
        while (lo + 1 < hi && ncut > 2048) {
            const int mid = (hi + lo) / 2;
            const float t = ldexpf(1.0f, mid) > thr ? ldexpf(1.0f, mid) : thr;
            int k;
            const double ms = m3_row_mass_ge(e, V, t, &k);
            if (ENOUGH(k, ms)) { lo = mid; cut = t; ncut = k; }
            else hi = mid;
        }
    }
#undef ENOUGH
    cand *c = ws->c;
    int n = gather(e, V, thr, cut, c);
    if (use_k && n < p->top_k && cut > 0) n = gather(e, V, thr, cut = 0, c); /* the count was exact: never */
    if (use_k && n > p->top_k) {
        select_best(c, n, p->top_k);
        n = p->top_k;
    }
    double z = use_k ? 0 : zm; /* top-p renormalizes over what min-p and top-k left */
    if (use_k) for (int j = 0; j < n; j++) z += (double)ck_e(c[j]);
    double total = z;
    if (use_p) {
        const double lim = (double)p->top_p * z;
        int j = select_mass(c, n, lim, &total);
        if (total < lim && cut > 0 && !use_k) { /* the estimate's margin fell short (never seen): every kept token
                                                  * (with top-k the whole top-k set is at hand: only rounding) */
            n = gather(e, V, thr, 0, c);
            j = select_mass(c, n, lim, &total);
        }
        n = j;
    }
    pi->n_kept = n;
    pi->total = total;
    return -1;
}

/* One draw from what keep() left, with the uniform u in [0, 1). */
static int draw(const m3_sample_ws *ws, int V, const pick_info *pi, double u01) {
    const float *e = ws->e;
    double u = u01 * pi->total, acc = 0;
    if (pi->n_kept < 0) { /* id order: whole blocks by their mass, then one block id by id */
        const int nb = NBLK(V);
        int b = 0;
        while (b < nb && !(u < acc + ws->blk[b].kept)) acc += ws->blk[b++].kept;
        if (b == nb) { /* u rounded up to the total: the last kept token */
            int i = V - 1;
            while (i > 0 && !kept_e(e[i], pi->minp_thr)) i--;
            return i;
        }
        const int end = (b + 1) * M3_ROW_MASS_BLOCK < V ? (b + 1) * M3_ROW_MASS_BLOCK : V;
        int last = -1;
        for (int i = b * M3_ROW_MASS_BLOCK; i < end; i++) {
            if (!kept_e(e[i], pi->minp_thr)) continue;
            acc += e[i];
            last = i;
            if (u < acc) return i;
        }
        return last; /* the block's own sum came out a little larger than this walk's */
    }
    const cand *c = ws->c;
    for (int j = 0; j < pi->n_kept; j++) { acc += (double)ck_e(c[j]); if (u < acc) return ck_id(c[j]); }
    return ck_id(c[pi->n_kept - 1]);
}

/* Steps 3-4 on the working logits w (already biased / penalized). Returns the token. */
static int pick(const m3_sampling *p, const float *w, m3_sample_ws *ws, int V, m3_rng *r, pick_info *pi) {
    int g = keep(p, w, ws, V, pi);
    if (pi->greedy) return g;
    return draw(ws, V, pi, m3_rng_uniform(r));
}

int m3_sample(const m3_sampling *p, const float *logits, int V, m3_rng *r, void *scratch) {
    m3_sample_ws ws;
    ws_over(&ws, V, scratch);
    memcpy(ws.w, logits, sizeof(float) * (size_t)V);
    pick_info pi;
    return pick(p, ws.w, &ws, V, r, &pi);
}

/* ---------------- per-request state ---------------- */

typedef struct { int32_t id, gen; int prompt; } seen_t;

struct m3_sampler {
    m3_sampling p;
    int V;             /* the logits row's length */
    int n;             /* ids that can come out: [0, n) (p.n_text, else V) */
    m3_rng rng;
    m3_logit_bias *bias;
    int32_t *allowed, *banned, *mt_ids;
    int32_t *bw, *bw_off; /* the bad words (copied) */
    int32_t *hist;     /* the last hist_cap tokens generated (a ring: token i at i % hist_cap), for the bad words */
    int hist_cap;
    seen_t *seen;      /* distinct ids seen, in first-seen order */
    int n_seen, cap_seen;
    const uint32_t *mask; /* m3_sampler_set_mask (borrowed), NULL: none */
    int32_t *slot;     /* open addressing: index into seen, -1 empty */
    int n_slot;        /* power of two, > 2 * n_seen */
    int n_generated;
    int in_think;      /* the reasoning budget: inside a reasoning section, with think_count tokens in it */
    int think_count;
};

static uint32_t hash_id(int32_t id) { return (uint32_t)id * 0x9e3779b1u; }

static int grow(m3_sampler *s) {
    int ns = s->n_slot ? s->n_slot * 2 : 64;
    int32_t *sl = s_malloc(sizeof(int32_t) * (size_t)ns);
    if (!sl) return -1;
    for (int i = 0; i < ns; i++) sl[i] = -1;
    for (int k = 0; k < s->n_seen; k++) {
        uint32_t h = hash_id(s->seen[k].id) & (uint32_t)(ns - 1);
        while (sl[h] >= 0) h = (h + 1) & (uint32_t)(ns - 1);
        sl[h] = k;
    }
    free(s->slot);
    s->slot = sl;
    s->n_slot = ns;
    return 0;
}

static seen_t *seen_get(m3_sampler *s, int32_t id) {
    if (2 * (s->n_seen + 1) > s->n_slot && grow(s)) return NULL;
    if (s->n_seen == s->cap_seen) {
        int nc = s->cap_seen ? s->cap_seen * 2 : 32;
        seen_t *ns = s_realloc(s->seen, sizeof *ns * (size_t)nc);
        if (!ns) return NULL;
        s->seen = ns;
        s->cap_seen = nc;
    }
    uint32_t h = hash_id(id) & (uint32_t)(s->n_slot - 1);
    while (s->slot[h] >= 0) {
        if (s->seen[s->slot[h]].id == id) return &s->seen[s->slot[h]];
        h = (h + 1) & (uint32_t)(s->n_slot - 1);
    }
    s->slot[h] = s->n_seen;
    seen_t *e = &s->seen[s->n_seen++];
    e->id = id; e->gen = 0; e->prompt = 0;
    return e;
}

static int32_t *dup_ids(const int32_t *a, int n, int V, const char *what, m3_err *err, int *bad) {
    if (n <= 0) return NULL;
    if (!a) { *bad = 1; m3_errf(err, "sampling: %s: %d ids but no array", what, n); return NULL; }
    for (int i = 0; i < n; i++)
        if (a[i] < 0 || a[i] >= V) {
            *bad = 1;
            m3_errf(err, "sampling: %s: token id %d is outside the vocabulary [0, %d)", what, (int)a[i], V);
            return NULL;
        }
    int32_t *c = s_malloc(sizeof(int32_t) * (size_t)n);
    if (!c) { *bad = 1; m3_errf(err, "sampling: out of memory"); return NULL; }
    memcpy(c, a, sizeof(int32_t) * (size_t)n);
    return c;
}

m3_sampler *m3_sampler_create(const m3_sampling *p, int V, const int32_t *prompt, int n_prompt, m3_err *err) {
    if (V <= 0) { m3_errf(err, "sampling: vocabulary size %d, expected > 0", V); return NULL; }
    if (!(p->temperature >= 0) || isinf(p->temperature)) { m3_errf(err, "sampling: temperature %g, expected a finite value >= 0", p->temperature); return NULL; }
    if (!(p->top_p <= 1 && p->top_p >= 0)) { m3_errf(err, "sampling: top_p %g, expected in [0, 1]", p->top_p); return NULL; }
    if (!(p->min_p <= 1 && p->min_p >= 0)) { m3_errf(err, "sampling: min_p %g, expected in [0, 1]", p->min_p); return NULL; }
    if (!(p->repetition_penalty >= 0) || isinf(p->repetition_penalty)) { m3_errf(err, "sampling: repetition_penalty %g, expected a finite value > 0", p->repetition_penalty); return NULL; }
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty)) { m3_errf(err, "sampling: presence/frequency penalty not finite"); return NULL; }
    if (p->top_logprobs < 0 || p->top_logprobs > M3_SAMPLE_MAX_TOP_LOGPROBS) { m3_errf(err, "sampling: top_logprobs %d, expected in [0, %d]", p->top_logprobs, M3_SAMPLE_MAX_TOP_LOGPROBS); return NULL; }
    if (p->logprobs_mode != M3_LOGPROBS_RAW && p->logprobs_mode != M3_LOGPROBS_PROCESSED) { m3_errf(err, "sampling: unknown logprobs_mode %d", p->logprobs_mode); return NULL; }
    if (n_prompt > 0 && !prompt) { m3_errf(err, "sampling: %d prompt ids but no array", n_prompt); return NULL; }
    if (p->n_text < 0) { m3_errf(err, "sampling: n_text %d, expected >= 0", p->n_text); return NULL; }
    m3_sampler *s = s_calloc(1, sizeof *s);
    if (!s) { m3_errf(err, "sampling: out of memory"); return NULL; }
    s->p = *p;
    s->V = V;
    s->n = p->n_text > 0 && p->n_text < V ? p->n_text : V;
    int bad = 0;
    s->allowed = dup_ids(p->allowed_ids, p->n_allowed, V, "allowed ids", err, &bad);
    if (!bad) s->banned = dup_ids(p->banned_ids, p->n_banned, V, "banned ids", err, &bad);
    if (!bad) s->mt_ids = dup_ids(p->min_tokens_ids, p->n_min_tokens_ids, V, "min_tokens ids", err, &bad);
    if (!bad && p->n_logit_bias > 0) {
        if (!p->logit_bias) { bad = 1; m3_errf(err, "sampling: logit_bias: %d entries but no array", p->n_logit_bias); }
        for (int i = 0; !bad && i < p->n_logit_bias; i++) {
            if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= V) {
                bad = 1;
                m3_errf(err, "sampling: logit_bias: token id %d is outside the vocabulary [0, %d)", (int)p->logit_bias[i].token, V);
            } else if (isnan(p->logit_bias[i].bias)) {
                bad = 1;
                m3_errf(err, "sampling: logit_bias: token %d has a NaN bias", (int)p->logit_bias[i].token);
            }
        }
        if (!bad && !(s->bias = s_malloc(sizeof *s->bias * (size_t)p->n_logit_bias))) { bad = 1; m3_errf(err, "sampling: out of memory"); }
        if (!bad) memcpy(s->bias, p->logit_bias, sizeof *s->bias * (size_t)p->n_logit_bias);
    }
    for (int i = 0; !bad && i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= V) { bad = 1; m3_errf(err, "sampling: prompt id %d at %d is outside the vocabulary [0, %d)", (int)prompt[i], i, V); break; }
        seen_t *e = seen_get(s, prompt[i]);
        if (!e) { bad = 1; m3_errf(err, "sampling: out of memory"); break; }
        e->prompt = 1;
    }
    if (!bad && p->think_on) { /* the reasoning budget: its ids, and whether the prompt ends inside reasoning */
        if (p->think_budget < 0) { bad = 1; m3_errf(err, "sampling: think_budget %d, expected >= 0", p->think_budget); }
        else if (p->think_end_id < 0 || p->think_end_id >= s->n || p->think_start_id < 0 || p->think_start_id >= s->n ||
                 p->think_start_id == p->think_end_id) {
            bad = 1;
            m3_errf(err, "sampling: reasoning tags %d / %d must be two ids in [0, %d)", (int)p->think_start_id, (int)p->think_end_id, s->n);
        } else if (p->think_from < 0 || (p->think_from > 0 && p->think_from >= n_prompt)) {
            bad = 1;
            m3_errf(err, "sampling: think_from %d is outside the prompt's %d ids", p->think_from, n_prompt);
        } else {
            int i = n_prompt - 1;
            while (i >= p->think_from && prompt[i] != p->think_start_id && prompt[i] != p->think_end_id) i--;
            s->in_think = i >= p->think_from && prompt[i] == p->think_start_id;
            s->think_count = s->in_think ? n_prompt - 1 - i : 0;
        }
    }
    if (!bad && p->n_bad_words > 0) { /* the bad words: offsets ascending from 0, sequences of ids in [0, V) */
        const int nb = p->n_bad_words;
        if (!p->bad_words || !p->bad_word_off || p->bad_word_off[0] != 0) { bad = 1; m3_errf(err, "sampling: bad words: %d sequences but no arrays", nb); }
        int longest = 1;
        for (int i = 0; !bad && i < nb; i++) {
            const int L = p->bad_word_off[i + 1] - p->bad_word_off[i];
            if (L < 1) { bad = 1; m3_errf(err, "sampling: bad word %d has %d tokens", i, L); }
            for (int j = 0; !bad && j < L; j++) {
                const int32_t id = p->bad_words[p->bad_word_off[i] + j];
                if (id < 0 || id >= V) { bad = 1; m3_errf(err, "sampling: bad word %d: token id %d is outside the vocabulary [0, %d)", i, (int)id, V); }
            }
            if (L > longest) longest = L;
        }
        const size_t nt = bad ? 0 : (size_t)p->bad_word_off[nb];
        s->hist_cap = longest - 1 > 0 ? longest - 1 : 1;
        if (!bad && (!(s->bw = s_malloc(sizeof *s->bw * nt)) || !(s->bw_off = s_malloc(sizeof *s->bw_off * (size_t)(nb + 1))) ||
                     !(s->hist = s_calloc((size_t)s->hist_cap, sizeof *s->hist)))) { bad = 1; m3_errf(err, "sampling: out of memory"); }
        if (!bad) {
            memcpy(s->bw, p->bad_words, sizeof *s->bw * nt);
            memcpy(s->bw_off, p->bad_word_off, sizeof *s->bw_off * (size_t)(nb + 1));
        }
    }
    if (bad) { m3_sampler_free(s); return NULL; }
    s->p.bad_words = s->bw; s->p.bad_word_off = s->bw_off;
    if (s->p.n_bad_words < 0) s->p.n_bad_words = 0;
    s->p.logit_bias = s->bias; s->p.allowed_ids = s->allowed; s->p.banned_ids = s->banned; s->p.min_tokens_ids = s->mt_ids;
    if (s->p.n_allowed < 0) s->p.n_allowed = 0;
    if (s->p.n_banned < 0) s->p.n_banned = 0;
    if (s->p.n_logit_bias < 0) s->p.n_logit_bias = 0;
    if (s->p.n_min_tokens_ids < 0) s->p.n_min_tokens_ids = 0;
    m3_rng_seed(&s->rng, p->seed);
    return s;
}

void m3_sampler_free(m3_sampler *s) {
    if (!s) return;
    free(s->bias); free(s->allowed); free(s->banned); free(s->mt_ids); free(s->bw); free(s->bw_off); free(s->hist);
    free(s->seen); free(s->slot);
    free(s);
}

/* the reasoning budget after a token: inside a section (*in), with *cnt tokens in it */
static void think_step(const m3_sampling *p, int32_t tok, int *in, int *cnt) {
    if (tok == p->think_start_id || tok == p->think_end_id) {
        *in = tok == p->think_start_id;
        *cnt = 0;
    } else *cnt += *in;
}

int m3_sampler_accept(m3_sampler *s, int32_t token, m3_err *err) {
    if (token < 0 || token >= s->V) return m3_errf(err, "sampling: accepted token %d is outside the vocabulary [0, %d)", (int)token, s->V);
    seen_t *e = seen_get(s, token);
    if (!e) return m3_errf(err, "sampling: out of memory");
    e->gen++;
    if (s->hist) s->hist[s->n_generated % s->hist_cap] = token;
    s->n_generated++;
    if (s->p.think_on) think_step(&s->p, token, &s->in_think, &s->think_count);
    return 0;
}

int m3_sampler_n_generated(const m3_sampler *s) { return s->n_generated; }

void m3_sampler_set_mask(m3_sampler *s, const uint32_t *mask) { s->mask = mask; }

/* w = x where the mask's bit is set, else -inf; whole words of the mask at a time (a grammar's
 * masks are mostly all-clear or all-set words) */
static void mask_row(const float *x, const uint32_t *mask, int V, float *w) {
    const int nw = V / 32;
    for (int k = 0; k < nw; k++) {
        const uint32_t m = mask[k];
        float *o = w + 32 * k;
        const float *in = x + 32 * k;
        if (m == 0xffffffffu) memcpy(o, in, 32 * sizeof(float));
        else if (m == 0) for (int j = 0; j < 32; j++) o[j] = -INFINITY;
        else for (int j = 0; j < 32; j++) o[j] = (m >> j) & 1 ? in[j] : -INFINITY;
    }
    for (int i = nw * 32; i < V; i++) w[i] = (mask[i >> 5] >> (i & 31)) & 1 ? x[i] : -INFINITY;
}

/* step 0: the reasoning budget is spent, the next token closes the reasoning (unless a grammar's
 * mask constraining the row forbids that token: the grammar decides) */
static int think_forced(const m3_sampler *s) {
    const int32_t c = s->p.think_end_id;
    return s->p.think_on && s->in_think && s->think_count >= s->p.think_budget &&
           (!s->mask || (s->mask[c >> 5] >> (c & 31) & 1));
}

/* step 0 may come at one of the rows of a verification of path[0..k) (k + 1 rows: row i is read
 * only when path[0..i) were accepted, so the state follows the path; NULL: any k tokens) */
static int think_near(const m3_sampler *s, const int32_t *path, int k) {
    if (!s->p.think_on) return 0;
    if (!path) {
        const long left = s->in_think ? (long)s->p.think_budget - s->think_count : (long)s->p.think_budget + 1;
        return left <= k;
    }
    int in = s->in_think, cnt = s->think_count;
    for (int i = 0;; i++) {
        if (in && cnt >= s->p.think_budget) return 1;
        if (i == k) return 0;
        think_step(&s->p, path[i], &in, &cnt);
    }
}

/* Steps 0-2: the working logits. */
static void prepare(const m3_sampler *s, const float *logits, float *w) {
    const m3_sampling *p = &s->p;
    const int V = s->V;
    if (think_forced(s)) {
        for (int i = 0; i < V; i++) w[i] = -INFINITY;
        w[p->think_end_id] = 0;
        return;
    }
    if (p->n_allowed > 0) {
        for (int i = 0; i < V; i++) w[i] = -INFINITY;
        for (int j = 0; j < p->n_allowed; j++) {
            const int32_t id = p->allowed_ids[j];
            if (!s->mask || (s->mask[id >> 5] >> (id & 31)) & 1) w[id] = logits[id];
        }
    } else if (s->mask) {
        mask_row(logits, s->mask, V, w);
    } else {
        memcpy(w, logits, sizeof(float) * (size_t)V);
    }
    for (int j = 0; j < p->n_banned; j++) w[p->banned_ids[j]] = -INFINITY;
    if (s->n_generated < p->min_tokens)
        for (int j = 0; j < p->n_min_tokens_ids; j++) w[p->min_tokens_ids[j]] = -INFINITY;
    for (int b = 0; b < p->n_bad_words; b++) { /* a bad word's last token, where the others were just generated */
        const int32_t *t = p->bad_words + p->bad_word_off[b];
        const int L = p->bad_word_off[b + 1] - p->bad_word_off[b];
        int match = L - 1 <= s->n_generated;
        for (int j = 0; match && j < L - 1; j++) match = s->hist[(s->n_generated - (L - 1) + j) % s->hist_cap] == t[j];
        if (match) w[t[L - 1]] = -INFINITY;
    }
    for (int j = 0; j < p->n_logit_bias; j++) w[p->logit_bias[j].token] += p->logit_bias[j].bias;
    float rp = p->repetition_penalty;
    int use_r = rp > 0 && rp != 1, use_f = p->frequency_penalty != 0, use_pr = p->presence_penalty != 0;
    if (!use_r && !use_f && !use_pr) return;
    for (int k = 0; k < s->n_seen; k++) {
        const seen_t *e = &s->seen[k];
        float x = w[e->id];
        if (use_r) x = x > 0 ? x / rp : x * rp; /* prompt or generated: every seen id */
        if (e->gen > 0) x -= p->frequency_penalty * (float)e->gen + p->presence_penalty;
        w[e->id] = x;
    }
}

static void report(const m3_sampler *s, const float *logits, m3_sample_ws *ws, const pick_info *ppi, int tok,
                   m3_sample_out *out);

/* steps 0-2 change nothing in the rows of a verification of path[0..k): no allowed / banned ids, no
 * min_tokens still holding ids back, no logit_bias, no penalty, no reasoning budget running out */
static int plain_rows(const m3_sampler *s, const int32_t *path, int k) {
    const m3_sampling *p = &s->p;
    return !s->mask && !think_near(s, path, k) && p->n_allowed <= 0 && p->n_banned <= 0 && p->n_bad_words <= 0 &&
           !(s->n_generated < p->min_tokens && p->n_min_tokens_ids > 0) &&
           p->n_logit_bias <= 0 && !(p->repetition_penalty > 0 && p->repetition_penalty != 1) &&
           p->frequency_penalty == 0 && p->presence_penalty == 0;
}

/* ... in the row about to be drawn */
static int plain_logits(const m3_sampler *s) { return plain_rows(s, NULL, 0); }

/* The row steps 3-4 read: the logits as passed when steps 1-2 change nothing and the caller
 * needs no working copy (no copy made), else steps 1-2 into the working copy ws->w. NULL (err
 * set) when the workspace is short or every token is masked. */
static const float *work_row(const m3_sampler *s, const float *logits, m3_sample_ws *ws, int need_copy, m3_err *err) {
    const int V = s->V;
    if (!ws || ws->V < V) { m3_errf(err, "sampling: workspace for V=%d, need %d", ws ? ws->V : 0, V); return NULL; }
    const float *w = logits;
    if (need_copy || !plain_logits(s)) {
        prepare(s, logits, ws->w);
        w = ws->w;
    }
    int any = 0;
    for (int i = 0; i < s->n && !any; i++) any = w[i] > -INFINITY;
    if (!any) { m3_errf(err, "sampling: every token is masked (allowed / banned ids, the token mask, bad words, logit_bias, min_tokens)"); return NULL; }
    return w;
}

/* greedy processed logprobs are those of the working copy (report() reads ws->w) */
static int report_needs_copy(const m3_sampler *s) {
    return m3_sampler_is_greedy(s) && (s->p.logprobs || s->p.top_logprobs) && s->p.logprobs_mode == M3_LOGPROBS_PROCESSED;
}

/* The argmax of x over the ids [0, n) whose mask bit is set (the lowest id on ties), -1 when
 * none: whole mask words at a time, so a grammar's usual masks (few allowed ids) cost little. */
static int masked_argmax(const float *x, const uint32_t *mask, int n) {
    int best = -1;
    float bv = -INFINITY;
    const int nw = (n + 31) / 32;
    for (int k = 0; k < nw; k++) {
        uint32_t m = mask[k];
        if (k == nw - 1 && (n & 31)) m &= (1u << (n & 31)) - 1;
        while (m) {
            const int i = 32 * k + __builtin_ctz(m);
            m &= m - 1;
            if (best < 0 || x[i] > bv) { best = i; bv = x[i]; }
        }
    }
    return best;
}

int m3_sampler_sample(m3_sampler *s, const float *logits, m3_sample_ws *ws, m3_sample_out *out, m3_err *err) {
    if (s->mask && m3_sampler_is_greedy(s) && !s->p.logprobs && !s->p.top_logprobs) {
        /* greedy under a token mask, nothing else changing the row: the masked argmax, no working
         * copy (banned ids: the general path, as when the argmax is one of them) */
        const uint32_t *mk = s->mask;
        s->mask = NULL;
        int plain = plain_logits(s) && s->p.n_banned <= 0;
        s->mask = mk;
        if (plain) {
            const int tok = masked_argmax(logits, mk, s->n);
            if (tok >= 0 && logits[tok] > -INFINITY) {
                memset(out, 0, sizeof *out);
                out->token = tok;
                return 0;
            }
        }
    }
    const float *w = work_row(s, logits, ws, report_needs_copy(s), err);
    if (!w) return -1;
    pick_info pi;
    const int tok = pick(&s->p, w, ws, s->n, &s->rng, &pi);
    report(s, logits, ws, &pi, tok, out);
    return 0;
}

/* out for token tok drawn from the state keep() left in ws / pi (logprobs per the mode). */
static void report(const m3_sampler *s, const float *logits, m3_sample_ws *ws, const pick_info *ppi, int tok,
                   m3_sample_out *out) {
    const int V = s->n; /* the sampled ids */
    const pick_info pi = *ppi;
    memset(out, 0, sizeof *out);
    out->token = tok;
    int k = s->p.top_logprobs;
    if (!s->p.logprobs && k == 0) return;
    if (s->p.logprobs_mode == M3_LOGPROBS_RAW) { logprobs_of(logits, V, tok, k, out); return; }
    if (pi.greedy) { logprobs_of(ws->w, V, tok, k, out); return; }
    /* processed, sampled: log(e_i / total) over the kept tokens, -inf elsewhere */
    double lt = log(pi.total);
    const float *e = ws->e;
    out->logprob = (float)(log((double)e[tok]) - lt);
    if (pi.n_kept >= 0) { /* kept = c[0..n_kept), in no particular order */
        int rank = 1;
        m3_row_top t = {0, k, {{0, 0}}};
        for (int j = 0; j < pi.n_kept; j++) {
            const float x = ck_e(ws->c[j]);
            rank += x > e[tok];
            if (k > 0) m3_row_top_push(&t, x, ck_id(ws->c[j]));
        }
        out->rank = rank;
        out->n_top = t.n;
        for (int j = 0; j < t.n; j++) {
            out->top_ids[j] = t.v[j].id;
            out->top_logprobs[j] = (float)(log((double)t.v[j].v) - lt);
        }
    } else { /* every kept token: e > 0 and e >= min-p's threshold; those above e[tok] are kept */
        m3_row_top t = {0, k, {{0, 0}}};
        m3_row_top_scan(&t, e, V, pi.minp_thr > 0 ? pi.minp_thr : 0.0f, pi.minp_thr > 0);
        out->rank = 1 + m3_row_count_gt(e, V, e[tok]);
        out->n_top = t.n;
        for (int j = 0; j < t.n; j++) {
            out->top_ids[j] = t.v[j].id;
            out->top_logprobs[j] = (float)(log((double)t.v[j].v) - lt);
        }
    }
}

/* ---------------- speculative decoding support ---------------- */

int m3_sampler_is_greedy(const m3_sampler *s) { return !(s->p.temperature >= 1e-5f); }

int m3_sampler_vocab(const m3_sampler *s) { return s->V; }
int m3_sampler_plain_params(const m3_sampler *s, const int32_t *path, int k, float *temperature, int *top_k, float *top_p,
                            float *min_p, int *n) {
    if (!plain_rows(s, path, k)) return 0;
    *temperature = s->p.temperature;
    *top_k = s->p.top_k;
    *top_p = s->p.top_p;
    *min_p = s->p.min_p;
    *n = s->n;
    return 1;
}

int m3_sampler_draw_ids(const m3_sampler *s, const int32_t *path, int k, float *temperature, int *top_k, float *top_p,
                        float *min_p, int *n) {
    if (m3_sampler_is_greedy(s) || s->p.logprobs || s->p.top_logprobs) return 0;
    return m3_sampler_plain_params(s, path, k, temperature, top_k, top_p, min_p, n);
}

int m3_sampler_plain_greedy(const m3_sampler *s, const int32_t *path, int k) {
    return m3_sampler_is_greedy(s) && plain_rows(s, path, k) ? s->n : 0;
}
int m3_sampler_greedy_ids(const m3_sampler *s, const int32_t *path, int k) {
    return !s->p.logprobs && !s->p.top_logprobs ? m3_sampler_plain_greedy(s, path, k) : 0;
}

double m3_sampler_uniform(m3_sampler *s) { return m3_rng_uniform(&s->rng); }

void m3_sampler_peek_uniforms(const m3_sampler *s, int n, double *u) {
    m3_rng r = s->rng;
    for (int i = 0; i < n; i++) u[i] = m3_rng_uniform(&r);
}

void m3_sampler_skip_uniforms(m3_sampler *s, int n) {
    for (int i = 0; i < n; i++) (void)m3_rng_uniform(&s->rng);
}

int m3_sampler_probs(m3_sampler *s, const float *logits, m3_sample_ws *ws, float *prob, m3_err *err) {
    const int V = s->V, n = s->n;
    const float *w = work_row(s, logits, ws, 0, err);
    if (!w) return -1;
    pick_info pi;
    int g = keep(&s->p, w, ws, n, &pi);
    if (pi.greedy) {
        memset(prob, 0, sizeof(float) * (size_t)V);
        prob[g] = 1.0f;
        return 0;
    }
    const double inv = 1.0 / pi.total;
    if (pi.n_kept < 0) {
        scale_pass(ws, n, pi.minp_thr, inv, prob);
        if (n < V) memset(prob + n, 0, sizeof(float) * (size_t)(V - n)); /* ids without text */
    } else {
        memset(prob, 0, sizeof(float) * (size_t)V);
        for (int j = 0; j < pi.n_kept; j++) prob[ck_id(ws->c[j])] = (float)(ck_e(ws->c[j]) * inv);
    }
    return 0;
}

int m3_sampler_describe(m3_sampler *s, const float *logits, m3_sample_ws *ws, int32_t token, m3_sample_out *out,
                        m3_err *err) {
    if (token < 0 || token >= s->V) return m3_errf(err, "sampling: token %d is outside the vocabulary [0, %d)", (int)token, s->V);
    pick_info pi;
    memset(&pi, 0, sizeof pi);
    pi.greedy = m3_sampler_is_greedy(s);
    if (s->p.logprobs || s->p.top_logprobs) { /* else report() gives the token alone */
        const float *w = work_row(s, logits, ws, report_needs_copy(s), err);
        if (!w) return -1;
        if (s->p.logprobs_mode == M3_LOGPROBS_PROCESSED && !pi.greedy) keep(&s->p, w, ws, s->n, &pi);
    }
    report(s, logits, ws, &pi, token, out);
    return 0;
}

/* ---------------- stop conditions ---------------- */

/* Stop strings are matched incrementally, one Knuth-Morris-Pratt automaton per string: each
 * new byte of output advances every string's state (the longest prefix of it that ends the
 * text so far) in amortized constant time, so a scan costs the new text times the number of
 * strings, whatever their length; the longest state is what must be held back. */
struct m3_stop {
    char **str;
    size_t *len;
    int32_t **fail;    /* [n][len + 1]: the longest proper border of str[i][0..q) */
    size_t *state;     /* [n] after `pos` bytes of text */
    size_t pos;        /* bytes the states have read; (size_t)-1 when stale */
    int n;
    size_t maxlen;
    int32_t *ids;
    int n_ids;
};

m3_stop *m3_stop_create(const char *const *strs, int n_strs, const int32_t *ids, int n_ids, m3_err *err) {
    m3_stop *s = s_calloc(1, sizeof *s);
    if (!s) { m3_errf(err, "stop: out of memory"); return NULL; }
    if (n_strs > 0) {
        s->str = s_calloc((size_t)n_strs, sizeof *s->str);
        s->len = s_calloc((size_t)n_strs, sizeof *s->len);
        s->fail = s_calloc((size_t)n_strs, sizeof *s->fail);
        s->state = s_calloc((size_t)n_strs, sizeof *s->state);
        if (!s->str || !s->len || !s->fail || !s->state) { m3_stop_free(s); m3_errf(err, "stop: out of memory"); return NULL; }
        for (int i = 0; i < n_strs; i++) {
            if (!strs[i] || !strs[i][0]) { m3_stop_free(s); m3_errf(err, "stop: stop string %d is empty", i); return NULL; }
            size_t L = strlen(strs[i]);
            if (L > INT32_MAX - 1) { m3_stop_free(s); m3_errf(err, "stop: stop string %d is too long", i); return NULL; }
            s->len[i] = L;
            s->str[i] = s_malloc(L + 1);
            s->fail[i] = s_malloc(sizeof(int32_t) * (L + 1));
            s->n = i + 1;
            if (!s->str[i] || !s->fail[i]) { m3_stop_free(s); m3_errf(err, "stop: out of memory"); return NULL; }
            memcpy(s->str[i], strs[i], L + 1);
            int32_t *f = s->fail[i];
            const char *p = s->str[i];
            f[0] = f[1] = 0;
            for (size_t q = 1, k = 0; q < L; q++) {
                while (k > 0 && p[q] != p[k]) k = (size_t)f[k];
                if (p[q] == p[k]) k++;
                f[q + 1] = (int32_t)k;
            }
            if (L > s->maxlen) s->maxlen = L;
        }
    }
    if (n_ids > 0) {
        s->ids = s_malloc(sizeof(int32_t) * (size_t)n_ids);
        if (!s->ids) { m3_stop_free(s); m3_errf(err, "stop: out of memory"); return NULL; }
        memcpy(s->ids, ids, sizeof(int32_t) * (size_t)n_ids);
        s->n_ids = n_ids;
    }
    return s;
}

void m3_stop_free(m3_stop *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) { free(s->str[i]); free(s->fail[i]); }
    free(s->str); free(s->len); free(s->fail); free(s->state); free(s->ids);
    free(s);
}

int m3_stop_is_token(const m3_stop *s, int32_t token) {
    for (int i = 0; i < s->n_ids; i++) if (s->ids[i] == token) return 1;
    return 0;
}

/* string i's automaton after one more byte c, from state q (a full match goes on from its border) */
static size_t stop_step(const m3_stop *s, int i, size_t q, char c) {
    const char *p = s->str[i];
    const int32_t *f = s->fail[i];
    if (q == s->len[i]) q = (size_t)f[q];
    while (q > 0 && p[q] != c) q = (size_t)f[q];
    return p[q] == c ? q + 1 : q;
}

int m3_stop_scan(m3_stop *s, const char *text, size_t len, size_t checked, m3_stop_match *m) {
    m->which = -1;
    m->start = m->end = 0;
    m->safe = len;
    if (s->n == 0) return 0;
    if (checked > len) checked = len;
    if (checked != s->pos || checked == 0) { /* another text, or a fresh one: read text[0..checked) again */
        for (int i = 0; i < s->n; i++) s->state[i] = 0;
        for (size_t p = 0; p < checked; p++)
            for (int i = 0; i < s->n; i++) s->state[i] = stop_step(s, i, s->state[i], text[p]);
    }
    size_t best = (size_t)-1, p = checked;
    for (; p < len; p++) {
        /* a match found starts at `best`: one ending later can start no earlier than p - maxlen + 1 */
        if (m->which >= 0 && p + 1 > best + s->maxlen) break;
        for (int i = 0; i < s->n; i++) {
            size_t q = stop_step(s, i, s->state[i], text[p]);
            s->state[i] = q;
            if (q == s->len[i]) {
                size_t st = p + 1 - q;
                if (st < best || (st == best && i < m->which)) { best = st; m->which = i; m->start = st; m->end = p + 1; }
            }
        }
    }
    if (m->which >= 0) {
        s->pos = (size_t)-1; /* the states stopped inside the text */
        m->safe = m->start;
        return 1;
    }
    s->pos = len;
    size_t hold = 0;
    for (int i = 0; i < s->n; i++) hold = s->state[i] > hold ? s->state[i] : hold;
    m->safe = len - hold;
    return 0;
}
