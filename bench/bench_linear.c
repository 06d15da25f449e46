/* Microbenchmark of y = x W^T on the CPU backend for each weight format: GB/s of weight
 * read at T = 1 (decode) and GFLOP/s at larger T (prefill).
 * usage: bench_linear [N K] [threads] [T,T,...] (default T = 1,4,64,256; T <= 256) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "base/clock.h"

int main(int argc, char **argv) {
    int N = argc > 2 ? atoi(argv[1]) : 8192, K = argc > 2 ? atoi(argv[2]) : 4096;
    int threads = argc > 3 ? atoi(argv[3]) : 0;
    m3_cpu c = {.pool = m3_pool_create(threads)};
    c.nthreads = m3_pool_size(c.pool);
    /* several matrices so one pass does not sit in cache */
    const int copies = 8;
    size_t vals = (size_t)N * K;
    uint8_t *w = malloc(vals * 2 * copies), *s = malloc(vals / 16 * copies);
    srand(1);
    /* E4M3 / E2M1 codes without NaN; as bf16 the same bytes read as normal numbers of
     * modest size (random bits would include subnormals, which some CPUs slow down on) */
    for (size_t i = 0; i < vals * 2 * copies; i++) w[i] = (uint8_t)(rand() & 0x77);
    for (size_t i = 1; i < vals * 2 * copies; i += 2) w[i] = (uint8_t)(0x3c + (rand() & 1)) | (uint8_t)(rand() & 0x80);
    for (size_t i = 0; i < vals / 16 * copies; i++) s[i] = (uint8_t)(0x30 + (rand() & 7)); /* modest scales */
    float *x = malloc(sizeof(float) * (size_t)K * 256), *y = malloc(sizeof(float) * (size_t)N * 256);
    for (size_t i = 0; i < (size_t)K * 256; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    printf("N=%d K=%d threads=%d kernels=%s\n", N, K, c.nthreads, m3_cpu_simd_name());
    m3_wfmt fmts[] = {M3_WF_BF16, M3_WF_MXFP8, M3_WF_NVFP4};
    for (int fi = 0; fi < 3; fi++) {
        m3_linear L[8];
        for (int i = 0; i < copies; i++) {
            m3_linear l = {fmts[fi], N, K, NULL, 0, NULL, 0, 1.0f / 448.0f, 0, 0};
            l.row_bytes = fmts[fi] == M3_WF_BF16 ? (size_t)K * 2 : fmts[fi] == M3_WF_MXFP8 ? (size_t)K : (size_t)K / 2;
            l.scale_row = fmts[fi] == M3_WF_BF16 ? 0 : fmts[fi] == M3_WF_MXFP8 ? (size_t)K / 32 : (size_t)K / 16;
            l.w = w + (size_t)i * vals * 2;
            l.scale = s + (size_t)i * vals / 16;
            L[i] = l;
        }
        int Ts[64] = {1, 4, 64, 256}, nT = 4;
        if (argc > 4) {
            nT = 0;
            for (const char *q = argv[4]; *q && nT < 64; q += strcspn(q, ",") + (q[strcspn(q, ",")] == ',')) {
                int T = atoi(q);
                if (T >= 1 && T <= 256) Ts[nT++] = T;
            }
        }
        for (int ti = 0; ti < nT; ti++) {
            int T = Ts[ti], reps = T <= 2 ? 40 : T <= 16 ? 16 : 2;
            m3_cpu_linear(&c, &L[0], x, T, y);
            double t0 = m3_now();
            for (int r = 0; r < reps; r++) m3_cpu_linear(&c, &L[r % copies], x, T, y);
            double dt = (m3_now() - t0) / reps;
            double bytes = (double)m3_linear_bytes(&L[0]);
            printf("  %-6s T=%-4d %8.3f ms  %6.1f GB/s of weights  %7.1f GFLOP/s\n", m3_wfmt_name(fmts[fi]), T, dt * 1e3,
                   bytes / dt / 1e9, 2.0 * N * K * T / dt / 1e9);
        }
    }
    m3_pool_free(c.pool);
    return 0;
}
