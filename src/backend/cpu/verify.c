/* DSpark's verification of sampled requests on the CPU (ops.h verify_rows): the drafts'
 * acceptance tests against the target's drawn rows, and at the first rejection a draw from the
 * residual max(p - q, 0). This file is the rule's reference; cuda/verify.cu computes the same
 * integers, so both backends pick the same ids from the same rows. */
#include <math.h>

#include "cpu.h"

/* w * 2^40 rounded down (0 <= w <= 1): the residual's weights as integers, summed in any order */
static uint64_t units(float w) { return w > 0 ? (uint64_t)ldexp((double)w, 40) : 0; }

/* the residual's weight of id i: max(p - q, 0) (q NULL: one-hot at d); fallback: p without d */
static uint64_t weight(const float *p, const float *q, int32_t d, int fallback, int i) {
    if (fallback) return i == d ? 0 : units(p[i]);
    return units(p[i] - (q ? q[i] : i == d ? 1.0f : 0.0f));
}

/* floor(u * total) clamped below total (total > 0) */
static uint64_t point(double u, uint64_t total) {
    uint64_t x = (uint64_t)(u * (double)total);
    return x < total ? x : total - 1;
}

static int32_t residual(const float *p, const float *q, int32_t d, int V, double u) {
    for (int fb = 0; fb < 2; fb++) {
        uint64_t total = 0;
        for (int i = 0; i < V; i++) total += weight(p, q, d, fb, i);
        if (!total) continue;
        const uint64_t x = point(u, total);
        uint64_t acc = 0;
        for (int i = 0; i < V; i++) {
            acc += weight(p, q, d, fb, i);
            if (acc > x) return i;
        }
    }
    return d; /* p one-hot at d: never rejected (u < 1) */
}

void m3_cpu_verify_rows(void *ctx, const float *x, int V, size_t ld, int n, const m3_verify_group *g, int32_t *out) {
    (void)ctx;
    for (int j = 0; j < n; j++) {
        const m3_verify_group *G = &g[j];
        for (int i = 0; i < G->k; i++) {
            const float *p = x + (size_t)(G->row0 + i) * ld, *q = G->q ? G->q + (size_t)i * V : NULL;
            const int32_t d = G->d[i];
            const double pd = p[d], qd = q ? q[d] : 1.0;
            if (pd > 0 && G->u[i] * qd < pd) {
                out[G->row0 + i] = d;
                continue;
            }
            out[G->row0 + i] = residual(p, q, d, V, G->u[i + 1]);
            break;
        }
    }
}
