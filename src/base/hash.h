/* 64-bit mixing: SplitMix64's finalizer (a bijection with full avalanche) and its generator.
 * For hash keys and seeding, not for cryptography (keys an attacker picks use SipHash:
 * src/engine/images.c). */
#ifndef M3_BASE_HASH_H
#define M3_BASE_HASH_H

#include <stdint.h>

static inline uint64_t m3_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* the next value of the SplitMix64 sequence whose state is *s */
static inline uint64_t m3_splitmix64(uint64_t *s) { return m3_mix64(*s += 0x9e3779b97f4a7c15ull); }

/* h folded with n words, FNV-1a style a word at a time (keys of things a cache looks up by the
 * values they were made from: recorded graphs, src/model/dspark.c) */
static inline uint64_t m3_fold64(uint64_t h, const uint64_t *v, int n) {
    for (int i = 0; i < n; i++) h = (h ^ v[i]) * 1099511628211ull;
    return h;
}

#endif
