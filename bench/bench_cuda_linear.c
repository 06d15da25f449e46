/* CUDA linear kernels against the CPU reference: for each weight format and shape, checks
 * y = x W^T on the GPU against m3_cpu_linear (relative L2), then times it and reports GB/s
 * of weight bytes against the measured device copy bandwidth.
 * usage: bench_cuda_linear [N K] (default: the M3.1-Flash projection shapes) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"
#include "base/num.h"
#include "bench_weights.h"


int main(int argc, char **argv) {
    m3_err err;
    m3_ops g, c;
    if (m3_cuda_ops_init(&g, 0, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    if (m3_cpu_ops_init(&c, 0, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    double bw = m3_cuda_copy_bandwidth(&g, (size_t)2 << 30);
    printf("device: %s; copy bandwidth %.0f GB/s; dense BF16 matrix rate %.0f TFLOP/s (cuBLAS, 8192^3)\n",
           m3_cuda_device_name(&g), bw / 1e9, m3_cuda_gemm_rate(&g, 8192) / 1e12);
    int shapes[][2] = {{8192, 6144}, {6144, 8192}, {512, 6144}, {3072, 6144}, {6144, 3072}, {200064, 6144}};
    int ns = 6;
    if (argc == 3) { shapes[0][0] = atoi(argv[1]); shapes[0][1] = atoi(argv[2]); ns = 1; }
    m3_wfmt fm[3] = {M3_WF_MXFP8, M3_WF_NVFP4, M3_WF_BF16};
    int Ts[5] = {1, 4, 6, 8, 64}; /* 6: 5-8 tokens with empty columns */
    int fails = 0;
    printf("%-6s %-6s %7s %6s %4s %10s %9s %8s %7s\n", "format", "layout", "N", "K", "T", "rel_l2", "us", "GB/s", "of_bw");
    for (int si = 0; si < ns; si++)
        for (int fi = 0; fi < 3; fi++) {
            int N = shapes[si][0], K = shapes[si][1];
            if (N == 200064 && fm[fi] != M3_WF_BF16) continue; /* lm_head is BF16 */
            uint8_t *w, *s;
            m3_linear L, D;
            make(&L, fm[fi], N, K, &w, &s);
            D = L;
            /* in the device layout the engine uses (MXFP8 / NVFP4: tiled) */
            if (m3_cuda_upload_linear(&g, &L, &D, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
            if (fm[fi] != M3_WF_BF16 && N % 16 == 0 && K % 128 == 0 && !D.tiled) { /* as a checkpoint's would be */
                printf("%s %d x %d: uploaded row-major, not tiled FAIL\n", m3_wfmt_name(fm[fi]), N, K);
                fails++;
            }
            void *dw = (void *)D.w, *ds = (void *)D.scale;
            for (int ti = 0; ti < 5; ti++) {
                int T = Ts[ti];
                float *x = malloc(sizeof(float) * (size_t)T * K), *yc = malloc(sizeof(float) * (size_t)T * N),
                      *yg = malloc(sizeof(float) * (size_t)T * N);
                for (size_t i = 0; i < (size_t)T * K; i++) x[i] = urand();
                float *dx = g.alloc(g.ctx, sizeof(float) * (size_t)T * K), *dy = g.alloc(g.ctx, sizeof(float) * (size_t)T * N);
                g.upload(g.ctx, dx, x, sizeof(float) * (size_t)T * K);
                c.linear(c.ctx, &L, x, T, yc);
                g.linear(g.ctx, &D, dx, T, dy);
                g.download(g.ctx, yg, dy, sizeof(float) * (size_t)T * N);
                double num = 0, den = 0;
                for (size_t i = 0; i < (size_t)T * N; i++) { double d = (double)yg[i] - yc[i]; num += d * d; den += (double)yc[i] * yc[i]; }
                double rel = sqrt(num / (den > 0 ? den : 1));
                int reps = 50;
                double t0 = m3_cuda_sync_time(&g);
                for (int r = 0; r < reps; r++) g.linear(g.ctx, &D, dx, T, dy);
                double dt = (m3_cuda_sync_time(&g) - t0) / reps;
                double bytes = (double)m3_linear_bytes(&L);
                int ok = rel < 1e-5;
                if (!ok) fails++;
                printf("%-6s %-6s %7d %6d %4d %10.2e %9.1f %8.0f %6.0f%% %s\n", m3_wfmt_name(fm[fi]), D.tiled ? "tiled" : "rows",
                       N, K, T, rel, dt * 1e6,
                       bytes / dt / 1e9, 100 * bytes / dt / bw, ok ? "" : "FAIL");
                fflush(stdout);
                g.release(g.ctx, dx); g.release(g.ctx, dy);
                free(x); free(yc); free(yg);
            }
            g.release(g.ctx, dw); g.release(g.ctx, ds);
            free(w); free(s);
        }
    /* MXFP8 with E8M0 scales of 0 (2^-127) and 255 (NaN): the device keeps such a matrix
     * row-major (the tiled GEMV builds 2^(e-127) by a shift); its rows without a special scale
     * must match the CPU, the row with the NaN scale must be NaN, and the zero-scale row the
     * CPU's tiny values */
    if (argc != 3) {
        const int N = 512, K = 6144;
        uint8_t *w, *s;
        m3_linear L, D;
        make(&L, M3_WF_MXFP8, N, K, &w, &s);
        s[3 * (K / 32) + 5] = 0;    /* row 3 */
        s[7 * (K / 32) + 100] = 255; /* row 7 */
        if (m3_cuda_upload_linear(&g, &L, &D, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        float *x = malloc(sizeof(float) * K), *yc = malloc(sizeof(float) * N), *yg = malloc(sizeof(float) * N);
        for (int i = 0; i < K; i++) x[i] = urand();
        float *dx = g.alloc(g.ctx, sizeof(float) * K), *dy = g.alloc(g.ctx, sizeof(float) * N);
        g.upload(g.ctx, dx, x, sizeof(float) * K);
        c.linear(c.ctx, &L, x, 1, yc);
        g.linear(g.ctx, &D, dx, 1, dy);
        g.download(g.ctx, yg, dy, sizeof(float) * N);
        double num = 0, den = 0;
        for (int i = 0; i < N; i++)
            if (i != 7) { double d = (double)yg[i] - yc[i]; num += d * d; den += (double)yc[i] * yc[i]; }
        const double rel = sqrt(num / (den > 0 ? den : 1));
        const int ok = !D.tiled && rel < 1e-5 && isnan(yg[7]) && isnan(yc[7]);
        if (!ok) fails++;
        printf("mxfp8 with E8M0 scales 0 and 255: %s, rel_l2 %.2e (NaN row: GPU %g, CPU %g) %s\n",
               D.tiled ? "tiled" : "row-major", rel, yg[7], yc[7], ok ? "" : "FAIL");
        g.release(g.ctx, dx); g.release(g.ctx, dy);
        g.release(g.ctx, (void *)D.w); g.release(g.ctx, (void *)D.scale);
        free(x); free(yc); free(yg); free(w); free(s);
    }
    /* the attention projections of one layer (q, k, v, index q, index k: MXFP8, one shared
     * input) in one linear_n launch against the five separate launches */
    if (argc != 3 && g.linear_n) {
        enum { NJ = 5 };
        const int rows[NJ] = {8192, 512, 512, 512, 128}, K = 6144;
        m3_linear L[NJ], D[NJ];
        uint8_t *w[NJ], *s[NJ];
        void *dw[NJ], *ds[NJ];
        double bytes = 0;
        for (int j = 0; j < NJ; j++) {
            make(&L[j], M3_WF_MXFP8, rows[j], K, &w[j], &s[j]);
            if (m3_cuda_upload_linear(&g, &L[j], &D[j], &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
            dw[j] = (void *)D[j].w;
            ds[j] = (void *)D[j].scale;
            bytes += (double)m3_linear_bytes(&L[j]);
        }
        printf("fused q+k+v+iq+ik (mxfp8, 9856 x 6144):\n%4s %10s %12s %9s %8s %12s\n", "T", "rel_l2", "fused_us", "GB/s", "of_bw",
               "separate_us");
        for (int ti = 0; ti < 4; ti++) {
            const int T = ti == 0 ? 1 : ti == 1 ? 4 : ti == 2 ? 6 : 8;
            float *x = malloc(sizeof(float) * (size_t)T * K), *dx = g.alloc(g.ctx, sizeof(float) * (size_t)T * K);
            float *yc[NJ], *dy[NJ];
            const m3_linear *Dp[NJ];
            for (size_t i = 0; i < (size_t)T * K; i++) x[i] = urand();
            g.upload(g.ctx, dx, x, sizeof(float) * (size_t)T * K);
            double num = 0, den = 0;
            for (int j = 0; j < NJ; j++) {
                yc[j] = malloc(sizeof(float) * (size_t)T * rows[j]);
                dy[j] = g.alloc(g.ctx, sizeof(float) * (size_t)T * rows[j]);
                Dp[j] = &D[j];
                c.linear(c.ctx, &L[j], x, T, yc[j]);
            }
            g.linear_n(&g, NJ, Dp, dx, T, dy);
            for (int j = 0; j < NJ; j++) {
                float *yg = malloc(sizeof(float) * (size_t)T * rows[j]);
                g.download(g.ctx, yg, dy[j], sizeof(float) * (size_t)T * rows[j]);
                for (size_t i = 0; i < (size_t)T * rows[j]; i++) {
                    double d = (double)yg[i] - yc[j][i];
                    num += d * d;
                    den += (double)yc[j][i] * yc[j][i];
                }
                free(yg);
            }
            double rel = sqrt(num / (den > 0 ? den : 1));
            const int reps = 50;
            double t0 = m3_cuda_sync_time(&g);
            for (int r = 0; r < reps; r++) g.linear_n(&g, NJ, Dp, dx, T, dy);
            double dt = (m3_cuda_sync_time(&g) - t0) / reps;
            t0 = m3_cuda_sync_time(&g);
            for (int r = 0; r < reps; r++)
                for (int j = 0; j < NJ; j++) g.linear(g.ctx, &D[j], dx, T, dy[j]);
            double ds2 = (m3_cuda_sync_time(&g) - t0) / reps;
            int ok = rel < 1e-5;
            if (!ok) fails++;
            printf("%4d %10.2e %12.1f %9.0f %7.0f%% %12.1f %s\n", T, rel, dt * 1e6, bytes / dt / 1e9, 100 * bytes / dt / bw, ds2 * 1e6,
                   ok ? "" : "FAIL");
            for (int j = 0; j < NJ; j++) { free(yc[j]); g.release(g.ctx, dy[j]); }
            free(x);
            g.release(g.ctx, dx);
        }
        for (int j = 0; j < NJ; j++) { g.release(g.ctx, dw[j]); g.release(g.ctx, ds[j]); free(w[j]); free(s[j]); }
    }
    /* one MoE layer at M3.1-Flash widths (16 of its 128 experts: the host copy stays small; 8
     * routed per token + the shared expert): the whole MoE op (router, top-8, expert GEMVs,
     * SwiGLU, combine, shared expert) against the CPU's, bytes counted over the distinct
     * experts the routing picked */
    if (argc != 3) {
        enum { E = 16, TOPK = 8, H = 6144, F = 3072 };
        m3_weights hw;
        memset(&hw, 0, sizeof hw);
        m3_layer_w *L = calloc(1, sizeof *L);
        L->moe = 1;
        L->has_shared = 1;
        uint8_t *bufs[3 * E + 5][2];
        int nb = 0;
        make(&L->router, M3_WF_BF16, E, H, &bufs[nb][0], &bufs[nb][1]); nb++;
        L->route_bias = calloc(E, sizeof(float));
        for (int e = 0; e < E; e++) L->route_bias[e] = 0.01f * (float)(e % 5);
        L->experts = calloc(E, sizeof *L->experts);
        for (int e = 0; e < E; e++) {
            make(&L->experts[e].gate, M3_WF_NVFP4, F, H, &bufs[nb][0], &bufs[nb][1]); nb++;
            make(&L->experts[e].up, M3_WF_NVFP4, F, H, &bufs[nb][0], &bufs[nb][1]); nb++;
            make(&L->experts[e].down, M3_WF_NVFP4, H, F, &bufs[nb][0], &bufs[nb][1]); nb++;
        }
        make(&L->shared.gate, M3_WF_MXFP8, F, H, &bufs[nb][0], &bufs[nb][1]); nb++;
        make(&L->shared.up, M3_WF_MXFP8, F, H, &bufs[nb][0], &bufs[nb][1]); nb++;
        make(&L->shared.down, M3_WF_MXFP8, H, F, &bufs[nb][0], &bufs[nb][1]); nb++;
        hw.layers = L;
        hw.n_layers = 1;
        hw.hidden = H;
        hw.n_experts = E;
        m3_weights dw;
        if (g.weights_upload(g.ctx, &hw, &dw, &err)) { printf("moe upload: %s\n", err.msg); fails++; }
        else {
            printf("MoE layer (E=%d of 128, top-%d, NVFP4 experts %dx%d, MXFP8 shared expert):\n%4s %10s %10s %8s %9s %8s\n", E,
                   TOPK, F, H, "T", "rel_l2", "us", "experts", "GB/s", "of_bw");
            const double eb = (double)(m3_linear_bytes(&L->experts[0].gate) + m3_linear_bytes(&L->experts[0].up) +
                                       m3_linear_bytes(&L->experts[0].down));
            const double fixed = (double)(m3_linear_bytes(&L->router) + m3_linear_bytes(&L->shared.gate) +
                                          m3_linear_bytes(&L->shared.up) + m3_linear_bytes(&L->shared.down));
            /* M3_BENCH_ACTQ=1: the routed experts' FC1 input quantized per token (both sides) */
            const char *aq = getenv("M3_BENCH_ACTQ");
            const m3_moe_p mp = {E, TOPK, 2.0f, 1.702f, 7.0f, aq && atoi(aq) ? M3_FC1_NVFP4 : M3_FC1_EXACT};
            if (mp.fc1_quant) printf("moe: routed experts' FC1 input in NVFP4 per token (M3_BENCH_ACTQ=1)\n");
            for (int ti = 0; ti < 4; ti++) { /* 1 token, a verify pass, a batch grouped in one launch, two launches */
                const int T = ti == 0 ? 1 : ti == 1 ? 8 : ti == 2 ? 64 : 100;
                float *x = malloc(sizeof(float) * (size_t)T * H), *yc = malloc(sizeof(float) * (size_t)T * H),
                      *yg = malloc(sizeof(float) * (size_t)T * H);
                for (size_t i = 0; i < (size_t)T * H; i++) x[i] = urand();
                float *dx = g.alloc(g.ctx, sizeof(float) * (size_t)T * H), *dy = g.alloc(g.ctx, sizeof(float) * (size_t)T * H);
                g.upload(g.ctx, dx, x, sizeof(float) * (size_t)T * H);
                c.moe(c.ctx, L, &mp, x, T, yc);
                m3_cuda_count_experts(&g, 1);
                m3_cuda_experts_used(&g, 1);
                g.moe(g.ctx, &dw.layers[0], &mp, dx, T, dy);
                m3_cuda_count_experts(&g, 0);
                long used = m3_cuda_experts_used(&g, 1);
                g.download(g.ctx, yg, dy, sizeof(float) * (size_t)T * H);
                double num = 0, den = 0;
                for (size_t i = 0; i < (size_t)T * H; i++) { double d = (double)yg[i] - yc[i]; num += d * d; den += (double)yc[i] * yc[i]; }
                double rel = sqrt(num / (den > 0 ? den : 1));
                const int reps = 50;
                double t0 = m3_cuda_sync_time(&g);
                for (int r = 0; r < reps; r++) g.moe(g.ctx, &dw.layers[0], &mp, dx, T, dy);
                double dt = (m3_cuda_sync_time(&g) - t0) / reps;
                double bytes = fixed + eb * (double)used;
                int ok = rel < 1e-5;
                if (!ok) fails++;
                printf("%4d %10.2e %10.1f %8ld %9.0f %7.0f%% %s\n", T, rel, dt * 1e6, used, bytes / dt / 1e9, 100 * bytes / dt / bw,
                       ok ? "" : "FAIL");
                g.release(g.ctx, dx); g.release(g.ctx, dy);
                free(x); free(yc); free(yg);
            }
            g.weights_release(g.ctx, &dw);
        }
        for (int i = 0; i < nb; i++) { free(bufs[i][0]); free(bufs[i][1]); }
        free(L->route_bias);
        free(L->experts);
        free(L);
    }
    err.msg[0] = 0;
    if (g.check && g.check(g.ctx, &err)) { printf("CUDA error: %s\n", err.msg); fails++; }
    m3_cuda_ops_free(&g);
    m3_cpu_ops_free(&c);
    printf("%s\n", fails ? "FAIL" : "all linear checks passed");
    return fails ? 1 : 0;
}
