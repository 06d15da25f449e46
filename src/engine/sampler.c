#include "sampler.h"

#include <math.h>
#include <stdlib.h>

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void m3_rng_seed(m3_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next(m3_rng *r) { /* xoshiro256** */
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return res;
}

double m3_rng_uniform(m3_rng *r) { return (next(r) >> 11) * 0x1.0p-53; }

int m3_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

size_t m3_sample_scratch_bytes(int V) { return (size_t)V * (sizeof(float) + sizeof(int)); }

typedef struct { float p; int id; } cand;

static int cmp_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

int m3_sample(const m3_sampling *p, const float *logits, int V, m3_rng *r, void *scratch) {
    if (p->temperature <= 0) return m3_argmax(logits, V);
    cand *c = scratch; /* V entries of {float, int} fit in the scratch size */
    float mx = logits[m3_argmax(logits, V)];
    for (int i = 0; i < V; i++) { c[i].p = expf((logits[i] - mx) / p->temperature); c[i].id = i; }
    int n = V;
    qsort(c, (size_t)n, sizeof *c, cmp_desc);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double total = 0;
    for (int i = 0; i < n; i++) total += c[i].p;
    if (p->top_p > 0 && p->top_p < 1) {
        double keep = 0;
        int m = 0;
        while (m < n) { keep += c[m].p; m++; if (keep >= p->top_p * total) break; }
        n = m;
        total = keep;
    }
    double u = m3_rng_uniform(r) * total, acc = 0;
    for (int i = 0; i < n; i++) { acc += c[i].p; if (u < acc) return c[i].id; }
    return c[n - 1].id;
}
