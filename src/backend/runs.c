/* Runs of a step's tokens (runs.h). */
#include "runs.h"

int m3_batch_runs(const m3_batch *b, int max, int32_t *lead, int32_t *len, int *longest) {
    int n = 0, most = 0;
    for (int t = 0; t < b->T; t++) {
        if (n && b->seq[t] == b->seq[t - 1] && b->pos[t] == b->pos[t - 1] + 1 && len[n - 1] < max) {
            len[n - 1]++;
        } else {
            lead[n] = t;
            len[n++] = 1;
        }
        if (len[n - 1] > most) most = len[n - 1];
    }
    *longest = most;
    return n;
}
