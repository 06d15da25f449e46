/* Stream-K: a GEMM's work split evenly over a fixed number of CTAs (the few-token GEMM's
 * linears, gemm_ft.cu, when their output tiles are too few to fill the GPU in whole waves).
 * The U output tiles of KB K blocks each are laid end to end (W = U * KB units) and cut into G
 * equal ranges: CTA i takes units [m3_sk_start(i), m3_sk_start(i + 1)). A range may cross tiles;
 * for each tile it touches the CTA writes one partial sum, numbered from the tile's first CTA
 * (m3_sk_owner of its first unit), and the partials are added in that order: the result is
 * deterministic for a given G. Plain C, shared by the CUDA kernels and the unit tests. */
#ifndef M3_BACKEND_STREAMK_H
#define M3_BACKEND_STREAMK_H

#ifdef __CUDACC__
#define M3_SK_FN static __host__ __device__ __forceinline__
#else
#define M3_SK_FN static inline
#endif

/* the first unit of CTA i's range (i = G: W, the end) */
M3_SK_FN long long m3_sk_start(long long W, int G, int i) { return W * i / G; }

/* the CTA whose range holds unit x (0 <= x < W): the largest i with m3_sk_start(i) <= x */
M3_SK_FN int m3_sk_owner(long long W, int G, long long x) { return (int)(((x + 1) * G - 1) / W); }

/* the most partial sums a tile gets (the partial buffers a caller needs) */
M3_SK_FN int m3_sk_max_parts(int U, int KB, int G) {
    const long long W = (long long)U * KB;
    int most = 0;
    for (int u = 0; u < U; u++) {
        const int n = m3_sk_owner(W, G, (long long)u * KB + KB - 1) - m3_sk_owner(W, G, (long long)u * KB) + 1;
        if (n > most) most = n;
    }
    return most;
}

#endif
