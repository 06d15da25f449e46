/* Sampling draws on the CPU (ops.h draw_rows: sampled output rows, the draft's chain): each row
 * becomes the distribution its parameters make of it, and one draw is taken from it. This file is
 * the rule's reference; cuda/draw.cu computes the same, its double sums in another order.
 *
 * The top-k and top-p cuts are values of e, found by radix selection over their bits (e >= 0
 * orders as its bits do): four passes of 8, 8, 8 and 6 bits, each a histogram of the kept values
 * whose higher bits match the cut found so far, weighed by count (top-k) or by mass in units of
 * 2^-40 (top-p: integer sums, the same in any order). Ties at a cut are then settled as the
 * sampler does (engine/sampler.h: ranked by value, then the lower id): top-k keeps exactly k,
 * top-p a tie while the mass ranked above it is short of the target. */
#include <math.h>
#include <string.h>

#include "../../base/rows.h"
#include "cpu.h"

static uint32_t key_of(float e) {
    uint32_t k;
    memcpy(&k, &e, sizeof k);
    return k;
}

/* e's weight in a mass cut: e * 2^40 rounded down (e <= 1) */
static uint64_t mass_of(float e) { return (uint64_t)ldexp((double)e, 40); }

static int kept0(float e, float thr) { return e > 0 && e >= thr; }

/* The largest key t >= lo such that the kept values with keys >= t weigh at least target (by
 * count or by mass); the caller knows that those at or above lo do. *above: the weight of
 * those with keys > t. */
static uint32_t cut_of(const float *e, int n, float thr, uint32_t lo, int by_mass, uint64_t target, uint64_t *above_out) {
    static const int SH[4] = {22, 14, 6, 0}, NB[4] = {256, 256, 256, 64};
    uint64_t h[256], above = 0;
    uint32_t pre = 0; /* the chosen key's bits above SH[p - 1] */
    for (int p = 0; p < 4; p++) {
        memset(h, 0, sizeof h);
        for (int i = 0; i < n; i++) {
            if (!kept0(e[i], thr)) continue;
            const uint32_t k = key_of(e[i]);
            if (k < lo || (p && k >> SH[p - 1] != pre)) continue;
            h[(k >> SH[p]) & (uint32_t)(NB[p] - 1)] += by_mass ? mass_of(e[i]) : 1;
        }
        int b = NB[p] - 1;
        for (; b > 0 && above + h[b] < target; b--) above += h[b];
        pre = p ? pre << (SH[p - 1] - SH[p]) | (uint32_t)b : (uint32_t)b;
    }
    *above_out = above;
    return pre;
}

/* The kept values at key t past the first m of them (in id order) are dropped (e = 0). */
static void trim_ties(float *e, int n, float thr, uint32_t t, uint64_t m) {
    for (int i = 0; i < n; i++)
        if (kept0(e[i], thr) && key_of(e[i]) == t) {
            if (m) m--;
            else e[i] = 0;
        }
}

static void draw_row(float *x, int V, const m3_draw_param *p, int32_t *out) {
    const int n = p->n < 1 ? 1 : p->n > V ? V : p->n;
    const int a = m3_row_argmax(x, n);
    const float m = x[a];
    if (!(p->temperature >= 1e-5f) || !isfinite(m)) {
        memset(x, 0, sizeof(float) * (size_t)V);
        x[a] = 1.0f;
        *out = a;
        return;
    }
    const float s = 1.0f / p->temperature, thr = p->min_p > 0 ? (p->min_p > 1 ? 1.0f : p->min_p) : 0.0f;
    int cnt = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf((x[i] - m) * s);
        cnt += kept0(x[i], thr);
    }
    if (n < V) memset(x + n, 0, sizeof(float) * (size_t)(V - n));
    /* the cuts, then the ties at each: top-k keeps exactly k (the lower ids first), top-p a tie
     * while the mass ranked above it (larger values, then lower ids) is short of the target */
    uint32_t cut = 0;
    uint64_t above;
    if (p->top_k > 0 && p->top_k < n && cnt > p->top_k) {
        cut = cut_of(x, n, thr, 0, 0, (uint64_t)p->top_k, &above);
        trim_ties(x, n, thr, cut, (uint64_t)p->top_k - above);
    }
    if (p->top_p > 0 && p->top_p < 1) {
        uint64_t z = 0;
        for (int i = 0; i < n; i++)
            if (kept0(x[i], thr) && key_of(x[i]) >= cut) z += mass_of(x[i]);
        uint64_t target = (uint64_t)((double)p->top_p * (double)z);
        if (target < 1) target = 1;
        cut = cut_of(x, n, thr, cut, 1, target, &above);
        uint32_t tb = cut;
        float tv;
        memcpy(&tv, &tb, sizeof tv);
        const uint64_t w = mass_of(tv); /* each tie's weight: above + j * w < target keeps tie j */
        trim_ties(x, n, thr, cut, w ? (target - above + w - 1) / w : (uint64_t)n);
    }
    double total = 0;
    for (int i = 0; i < n; i++)
        if (kept0(x[i], thr) && key_of(x[i]) >= cut) total += x[i];
    const double u = p->u * total, inv = 1.0 / total;
    double acc = 0;
    int pick = -1, last = a;
    for (int i = 0; i < n; i++) {
        if (kept0(x[i], thr) && key_of(x[i]) >= cut) {
            acc += x[i];
            last = i;
            if (pick < 0 && u < acc) pick = i;
            x[i] = (float)(x[i] * inv);
        } else {
            x[i] = 0;
        }
    }
    *out = pick >= 0 ? pick : last;
}

void m3_cpu_draw_rows(void *ctx, float *x, int rows, int V, size_t ld, const m3_draw_param *par, int32_t *out) {
    (void)ctx;
    for (int r = 0; r < rows; r++) draw_row(x + (size_t)r * ld, V, &par[r], &out[r]);
}
