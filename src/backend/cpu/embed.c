/* Embedding rows on the CPU: out[t] = row ids[t] of E, decoded (formats.c). */
#include "cpu.h"

void m3_cpu_embed(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out) {
    (void)ctx;
    for (int t = 0; t < T; t++) m3_cpu_decode_rows(E, ids[t], ids[t] + 1, 0, E->K, out + (size_t)t * E->K);
}
