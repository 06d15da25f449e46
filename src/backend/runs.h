/* Runs of a step's tokens: consecutive tokens of one sequence at consecutive positions (a verify
 * pass, a prefill chunk; a decode token is a run of one), cut at max tokens. Kernels that read
 * the same cache rows for every token of a sequence (the GPU indexer) read them once per run. */
#ifndef M3_BACKEND_RUNS_H
#define M3_BACKEND_RUNS_H

#include <stdint.h>

#include "ops.h"

/* lead[i] / len[i]: the first token and the length of run i (arrays of b->T); returns the
 * number of runs, *longest the longest one's length (0 and 0 for an empty batch) */
int m3_batch_runs(const m3_batch *b, int max, int32_t *lead, int32_t *len, int *longest);

#endif
