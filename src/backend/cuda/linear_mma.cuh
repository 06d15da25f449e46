/* The tensor-core GEMV's launch arguments (linear_mma.cu), shared with the MoE expert launches
 * (moe.cu) that run on the same kernel.
 * CPU reference: src/backend/cpu/linear.c (m3_cpu_linear). */
#ifndef M3_CUDA_LINEAR_MMA_CUH
#define M3_CUDA_LINEAR_MMA_CUH

#include "common.cuh"

#define WPB 8     /* warps per CTA */
#define GV_MAXJ 6 /* matrices sharing one input in one launch (q, k, v, index q, index k) */

/* One family of GEMVs in a launch. Plain: the matrix W; MoE: the expert table of gv_args
 * (mats = slots x {gate, up} or slots, all of W's shape). Work items are (mat, 16-row tile,
 * K slice), numbered from item0; a warp computes one item at a time. */
typedef struct gv_job {
    m3_linear W;
    const uint16_t *xh, *xl; /* activations split into f16 hi / lo, rows of xstride values */
    int xstride;
    float *y;                /* y[t][N] (MoE: y[mat][N]) */
    int T;                   /* tokens (MoE: 1 per slot) */
    int tiles, ks;           /* row tiles per mat, K slices per tile */
    int item0, ctr0;         /* first item (k_gemv_mma_mxfp8_xshared: first tile over all jobs); first arrival counter
                              * (one per (mat, tile)) */
    float *part;             /* ks > 1: partial sums [mat * tiles + tile][ks][T][16] */
} gv_job;

typedef struct gv_args {
    gv_job j[GV_MAXJ];
    int nj, items;
    int moe;                 /* 0 plain; 1 MoE gate + up (mat = 2 slot + which); 2 MoE down (mat = slot);
                              * grouped by expert (every expert read once for all its tokens): 3 gate + up
                              * (mat = 2 group + which), 4 down (mat = group) */
    const int *groups;       /* modes 3, 4: [0] groups this step, then per group: expert, count, 8 slots */
    const m3_mlp_w *tab;     /* MoE: device expert table */
    const int32_t *pick;     /* MoE: expert of each slot */
    int topk;
    int l2h;                 /* weight loads with the L2 256-byte fetch hint */
    int pf_first;            /* launched early (PDL): a plain matrix's first slices into L2 before waiting */
    int xitem;               /* pipelined kernel: a warp's next item's first stages requested during its item */
    int *ctr;                /* arrival counters, zero between launches */
    int cta_red;             /* every tile's K slices in one CTA (ks divides WPB, jobs' items whole
                              * CTAs): partial sums added in shared memory, no arrival counters */
} gv_args;

/* fills the jobs' tiles / ks / item0 / ctr0 / part and launches; mats[j] = matrices of job j */
int m3_cu_gv_launch(m3_cuda *c, gv_args *a, int F, int HL, const int *mats);
/* hi / lo halves of the n values at x (split now unless a cached split covers them) */
int m3_cu_xsplit_get(m3_cuda *c, const float *x, size_t n, const uint16_t **xh, const uint16_t **xl);

#endif
