/* What linear.c (the op, its one- and two-token kernels) shares with linear_tiled.c (the
 * many-token kernel): the blocking that fixes the summation order, and the tiled entry. */
#ifndef M3_CPU_LINEAR_INT_H
#define M3_CPU_LINEAR_INT_H

#include "cpu.h"

#define R 4    /* rows per task unit */
#define KC 256 /* columns per chunk (multiple of 128): chunk boundaries are part of the summation order */
#define XS (KC + 16) /* the tiled kernel's row stride of a chunk's values (not a multiple of 4 KB: no L1 set conflicts) */
#define TBT 96 /* tokens per call of the tiled kernel at most */
#define PR 64  /* rows per call of the tiled kernel at most (a multiple of R) */
/* the tiled kernel from this many tokens: below, decoding a row for every pair of tokens costs
 * less than the tile's stores and reloads (bench_linear's crossovers on a 2-core Zen 4,
 * docs/PERF.md; NVFP4, the cheapest to decode, gains little even above) */
#define TILED_MIN(fmt) ((fmt) == M3_WF_NVFP4 ? 48 : 16)

/* rows [n0, n1) of W (n1 - n0 <= PR) for tokens [t0, t1) (t1 - t0 <= TBT) with the AVX-512
 * kernels' exact arithmetic (linear.c's row_dot512), each row's chunk decoded once for all
 * the tokens. xp: the T tokens' activations packed chunk by chunk, each token's KC columns
 * together (NVFP4: in NVFP4_PERM512 order), as m3_cpu_linear packs them. */
void m3_cpu_rows_tiled512(const m3_linear *W, int n0, int n1, const float *xp, int T, int t0, int t1, float *y);

#endif
