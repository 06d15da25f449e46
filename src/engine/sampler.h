/* Token sampling: greedy, temperature, top-k, top-p, with a per-request seeded RNG so a
 * request's output is reproducible. */
#ifndef M3_SAMPLER_H
#define M3_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct m3_sampling {
    float temperature;   /* 0 = greedy */
    int top_k;           /* 0 = off */
    float top_p;         /* 1 = off */
    uint64_t seed;
} m3_sampling;

typedef struct m3_rng { uint64_t s[4]; } m3_rng;

void m3_rng_seed(m3_rng *r, uint64_t seed);
/* uniform in [0, 1) with 53 random bits */
double m3_rng_uniform(m3_rng *r);

/* Picks a token from logits[V]. scratch must hold 2*V floats/ints (see m3_sample_scratch_bytes). */
int m3_sample(const m3_sampling *p, const float *logits, int V, m3_rng *r, void *scratch);
size_t m3_sample_scratch_bytes(int V);
/* index of the largest value; ties go to the lowest index */
int m3_argmax(const float *x, int n);

#endif
