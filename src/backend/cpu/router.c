/* The MoE router's routing on the CPU: sigmoid scores, the bias-corrected choice, the top-k
 * (lowest expert id on ties: an ascending scan with a strict >) and the weights
 * s / sum(s) * scale, in pick order. */
#include <math.h>

#include "cpu.h"

/* logits [T][E] -> pick, wt [T][K]; s: 2E floats of scratch */
void m3_cpu_route(const float *logits, const float *bias, int T, int E, int K, float scale, float *s, int *pick, float *wt) {
    float *choice = s + E;
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) {
            s[e] = 1.0f / (1.0f + expf(-logits[(size_t)t * E + e]));
            choice[e] = s[e] + (bias ? bias[e] : 0.0f);
        }
        float sum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (choice[e] != -INFINITY && (best < 0 || choice[e] > choice[best])) best = e;
            pick[t * K + k] = best;
            choice[best] = -INFINITY;
            sum += s[best];
        }
        for (int k = 0; k < K; k++) wt[t * K + k] = s[pick[t * K + k]] / sum * scale;
    }
}
