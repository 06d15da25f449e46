/* The tensor-core GEMM (src/backend/cuda/gemm_tc.cu) against a double-precision reference and
 * against the backend's current linear op, for BF16 / MXFP8 / NVFP4 weights in the device layout
 * (m3_cuda_upload_linear) and prefill-sized T.
 *
 * Check: y = x W^T with x rounded to bf16 and W decoded exactly, summed in double, on a sample
 * of tokens (first, last, random) x rows (all, or 4096 with the last); relative L2 over the
 * sample must be < 1e-4 (only the f32 summation order differs), else a FAIL line and exit 1.
 * Ragged shapes (T = 1, 9, 20, 64, 77, 130, 200, 300: every token tile; N = 520 / 528, and 904 / 912 in 8 row
 * tiles; MXFP8 2064 x 4096 at 64 tokens: gemm_ft's stream-K split) are checked in full first.
 * The same check for the backend's linear op in bf16 precision (op16: the few-token GEMM,
 * gemm_ft.cu, at 9-64 tokens for MXFP8 / NVFP4, this GEMM above, the GEMV below 9 tokens).
 * Time: CUDA events, median of REPS after warm-up, of the GEMM alone (x staged once, as a
 * caller sharing x over q / k / v would; over ks K slices, as the backend picks them, their sum
 * included), of staging x, and of ops.linear (the existing path). The ragged checks run 2 K
 * slices where K allows.
 *
 * usage: bench_cuda_gemm [--quick | --ragged] [N K]
 *   --quick: T up to 1024, no lm_head; --ragged: only the small ragged shapes (for
 *   compute-sanitizer); N K: that shape only, every format, T = 64 .. 4096. ops.linear runs in
 *   exact precision (the GEMV up to 64 tokens, dequantized SGEMM above). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/gemm_tc.h"
#include "base/num.h"
#include "bench_weights.h"

#define PEAK 989e12 /* dense BF16, H100 / H200 SXM datasheet */


/* row n of the host matrix, decoded exactly */
static void decode_row(const m3_linear *L, int n, double *out) {
    const uint8_t *row = L->w + (size_t)n * L->row_bytes, *sc = L->scale ? L->scale + (size_t)n * L->scale_row : NULL;
    for (int k = 0; k < L->K; k++) {
        if (L->fmt == M3_WF_BF16) {
            uint16_t h;
            memcpy(&h, row + 2 * (size_t)k, 2);
            out[k] = m3_bf16_to_f32(h);
        } else if (L->fmt == M3_WF_MXFP8) {
            out[k] = (double)m3_e4m3_to_f32(row[k]) * (double)m3_e8m0_to_f32(sc[k / 32]);
        } else {
            const int code = (row[k / 2] >> (4 * (k & 1))) & 15;
            out[k] = (double)m3_e2m1_values[code] * (double)m3_e4m3_to_f32(sc[k / 16]) * (double)L->gmul;
        }
    }
}

static int cmp_f(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return x < y ? -1 : x > y; }

typedef struct ctx {
    m3_ops g;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    int ks;      /* K slices of the case being run (m3_cu_gemm_tc_ksplit, or forced for the ragged checks) */
    float *part; /* their partial sums */
} ctx;

/* median ms of reps runs of what (0: gemm on staged x, 1: staging x, 2: ops.linear exact, 3: ops.linear bf16) */
static float time_it(ctx *c, int what, const m3_linear *D, const float *dx, void *xs, int T, float *dy, int reps) {
    float ms[64];
    m3_err err;
    if (reps > 64) reps = 64;
    for (int r = -2; r < reps; r++) {
        cudaEventRecord(c->e0, c->st);
        if (what == 0) m3_cu_gemm_tc_staged_split(c->st, D, xs, T, dy, c->ks, c->part, &err);
        else if (what == 1) m3_cu_gemm_tc_stage_x(c->st, dx, T, D->K, xs, &err);
        else {
            m3_cuda_set_precision(&c->g, what == 3);
            c->g.linear(c->g.ctx, D, dx, T, dy);
        }
        cudaEventRecord(c->e1, c->st);
        cudaEventSynchronize(c->e1);
        if (r >= 0) cudaEventElapsedTime(&ms[r], c->e0, c->e1);
    }
    qsort(ms, reps, sizeof(float), cmp_f);
    return ms[reps / 2];
}

/* one case: returns 1 on failure */
static int run_case(ctx *c, m3_wfmt f, int N, int K, const int *Ts, int nT, int full_check, int with_old) {
    m3_err err;
    uint8_t *w, *s;
    m3_linear L, D;
    make(&L, f, N, K, &w, &s);
    if (m3_cuda_upload_linear(&c->g, &L, &D, &err)) { printf("upload: %s FAIL\n", err.msg); return 1; }
    int fails = 0;
    if (!m3_cu_gemm_tc_ok(&D, Ts[0])) {
        printf("%-6s %7d %6d: not taken by the GEMM (%s) %s\n", m3_wfmt_name(f), N, K, D.tiled ? "tiled" : "row-major",
               f != M3_WF_BF16 && N % 16 == 0 ? "FAIL" : "(expected)");
        fails += f != M3_WF_BF16 && N % 16 == 0;
        goto done;
    }
    if (!m3_cu_gemm_tc_scales_exact(&L)) printf("(MXFP8 scales outside the exact range)\n");
    double *wr = malloc(sizeof(double) * K), *xd = NULL;
    for (int ti = 0; ti < nT; ti++) {
        const int T = Ts[ti];
        float *x = malloc(sizeof(float) * (size_t)T * K);
        for (size_t i = 0; i < (size_t)T * K; i++) x[i] = urand();
        float *dx = c->g.alloc(c->g.ctx, sizeof(float) * (size_t)T * K), *dy = c->g.alloc(c->g.ctx, sizeof(float) * (size_t)T * N);
        const size_t xb = m3_cu_gemm_tc_xbytes(T, K);
        void *xs = c->g.alloc(c->g.ctx, xb);
        if (!dx || !dy || !xs) { printf("%s %d x %d T %d: out of device memory FAIL\n", m3_wfmt_name(f), N, K, T); fails++; break; }
        c->g.upload(c->g.ctx, dx, x, sizeof(float) * (size_t)T * K);
        cudaMemset(dy, 0xff, sizeof(float) * (size_t)T * N); /* NaN: unwritten outputs show */
        cudaDeviceSynchronize();
        /* K slices as the backend picks them; the ragged checks force 2 where K allows */
        c->ks = full_check ? (K / 128 >= 2 ? 2 : 1) : m3_cu_gemm_tc_ksplit(&D, T);
        c->part = c->ks > 1 ? c->g.alloc(c->g.ctx, sizeof(float) * (size_t)c->ks * T * N) : NULL;
        int rc = c->ks > 1 && !c->part ? (m3_errf(&err, "out of device memory"), -1)
                 : m3_cu_gemm_tc_stage_x(c->st, dx, T, K, xs, &err) ||
                       m3_cu_gemm_tc_staged_split(c->st, &D, xs, T, dy, c->ks, c->part, &err);
        cudaError_t ce = cudaStreamSynchronize(c->st);
        if (rc || ce != cudaSuccess) {
            printf("%s %d x %d T %d: %s FAIL\n", m3_wfmt_name(f), N, K, T, rc ? err.msg : cudaGetErrorString(ce));
            fails++;
            c->g.release(c->g.ctx, dx); c->g.release(c->g.ctx, dy); c->g.release(c->g.ctx, xs); free(x);
            if (c->part) c->g.release(c->g.ctx, c->part);
            c->part = NULL;
            break;
        }
        /* sample: tokens, rows */
        int ntok = full_check || T <= 8 ? T : 8, nrow = full_check || N <= 4096 ? N : 4096;
        int *toks = malloc(sizeof(int) * ntok), *rows = malloc(sizeof(int) * nrow);
        for (int i = 0; i < ntok; i++) toks[i] = ntok == T ? i : i == 0 ? 0 : i == 1 ? T - 1 : (int)(rnd() % T);
        for (int i = 0; i < nrow; i++) rows[i] = nrow == N ? i : i == 0 ? N - 1 : (int)(rnd() % N);
        float *yg = malloc(sizeof(float) * (size_t)N * ntok), *yo = malloc(sizeof(float) * (size_t)N * ntok);
        for (int i = 0; i < ntok; i++) c->g.download(c->g.ctx, yg + (size_t)i * N, dy + (size_t)toks[i] * N, sizeof(float) * N);
        /* the backend's op in bf16 precision on the same input */
        cudaMemset(dy, 0xff, sizeof(float) * (size_t)T * N);
        m3_cuda_set_precision(&c->g, 1);
        c->g.linear(c->g.ctx, &D, dx, T, dy);
        m3_cuda_set_precision(&c->g, 0);
        for (int i = 0; i < ntok; i++) c->g.download(c->g.ctx, yo + (size_t)i * N, dy + (size_t)toks[i] * N, sizeof(float) * N);
        xd = realloc(xd, sizeof(double) * (size_t)ntok * K);
        for (int i = 0; i < ntok; i++)
            for (int k = 0; k < K; k++) xd[(size_t)i * K + k] = m3_bf16_round(x[(size_t)toks[i] * K + k]);
        double num = 0, den = 0, mx = 0, onum = 0;
        int bad = 0, obad = 0;
        for (int r = 0; r < nrow; r++) {
            decode_row(&L, rows[r], wr);
            for (int i = 0; i < ntok; i++) {
                const double *xr = xd + (size_t)i * K;
                double ref = 0;
                for (int k = 0; k < K; k++) ref += xr[k] * wr[k];
                const double got = yg[(size_t)i * N + rows[r]], d = got - ref, od = yo[(size_t)i * N + rows[r]] - ref;
                if (!(d == d)) bad++;
                if (!(od == od)) obad++;
                onum += od * od;
                num += d * d;
                den += ref * ref;
                if (fabs(d) > mx) mx = fabs(d);
            }
        }
        const double rel = bad ? INFINITY : sqrt(num / (den > 0 ? den : 1));
        const double orel = obad ? INFINITY : sqrt(onum / (den > 0 ? den : 1));
        const int ok = rel < 1e-4 && orel < 1e-4;
        fails += !ok;
        /* timing */
        const int reps = T >= 1024 ? 10 : 20;
        const float t_gemm = time_it(c, 0, &D, dx, xs, T, dy, reps), t_stage = time_it(c, 1, &D, dx, xs, T, dy, reps);
        const float t_old = with_old ? time_it(c, 2, &D, dx, xs, T, dy, T >= 1024 ? 5 : 10) : 0;
        const float t_op = time_it(c, 3, &D, dx, xs, T, dy, reps);
        m3_cuda_set_precision(&c->g, 0);
        const double flop = 2.0 * T * (double)N * K;
        printf("%-6s %7d %6d %5d %9.2e %9.2e%s %9.1f %7.1f %7.1f %5.1f%% %10.1f %6.1fx %2d %9.1f %9.2e%s %s\n", m3_wfmt_name(f), N,
               K, T, rel, mx, bad ? "(NaN)" : "", t_gemm * 1e3, t_stage * 1e3, flop / (t_gemm * 1e-3) / 1e12,
               100 * flop / (t_gemm * 1e-3) / PEAK, with_old ? t_old * 1e3 : 0.0, with_old ? t_old / (t_gemm + t_stage) : 0.0, c->ks,
               t_op * 1e3, orel, obad ? "(NaN)" : "", ok ? "" : "FAIL");
        fflush(stdout);
        free(toks); free(rows); free(yg); free(yo); free(x);
        c->g.release(c->g.ctx, dx); c->g.release(c->g.ctx, dy); c->g.release(c->g.ctx, xs);
        if (c->part) c->g.release(c->g.ctx, c->part);
        c->part = NULL;
    }
    free(wr);
    free(xd);
done:
    c->g.release(c->g.ctx, (void *)D.w);
    if (D.scale) c->g.release(c->g.ctx, (void *)D.scale);
    free(w);
    free(s);
    return fails;
}

int main(int argc, char **argv) {
    m3_err err;
    ctx c;
    memset(&c, 0, sizeof c);
    int quick = 0, ragged = 0, argi = 1;
    if (argc > 1 && !strcmp(argv[1], "--quick")) { quick = 1; argi++; }
    else if (argc > 1 && !strcmp(argv[1], "--ragged")) { ragged = 1; argi++; }
    if (m3_cuda_ops_init(&c.g, 0, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    c.st = (cudaStream_t)m3_cuda_stream(&c.g);
    cudaEventCreate(&c.e0);
    cudaEventCreate(&c.e1);
    printf("device: %s; peak taken as %.0f TFLOP/s dense BF16\n", m3_cuda_device_name(&c.g), PEAK / 1e12);
    printf("%-6s %7s %6s %5s %9s %9s %9s %7s %7s %6s %10s %7s %2s %9s %9s\n", "format", "N", "K", "T", "rel_l2", "max_abs", "gemm_us",
           "xstg_us", "TFLOP/s", "peak", "linear_us", "speedup", "ks", "op16_us", "op16_rel");
    const m3_wfmt fm[3] = {M3_WF_BF16, M3_WF_MXFP8, M3_WF_NVFP4};
    int fails = 0;
    if (argc - argi == 2) {
        const int N = atoi(argv[argi]), K = atoi(argv[argi + 1]);
        const int Ts[4] = {64, 256, 1024, 4096};
        for (int fi = 0; fi < 3; fi++) fails += run_case(&c, fm[fi], N, K, Ts, quick ? 3 : 4, 0, 1);
    } else {
        /* ragged: full check, no comparison timing */
        /* tiles of 16, 128, 128, 64, 16, 32, 128, 128 tokens (M3_GEMM_TC_BN=192: 130, 200, 300, 330 and 400
         * in tiles of 192, the last one holding 3, 1, 2, 3 and 1 staged pieces of 64; M3_GEMM_TC_BN=256,
         * NVFP4: 200, 300, 330 and 400 in tiles of 256, the last one holding 4, 1, 2 and 3) */
        const int Tr[10] = {1, 77, 130, 64, 9, 20, 200, 300, 330, 400};
        fails += run_case(&c, M3_WF_BF16, 520, 384, Tr, 10, 1, 0);
        fails += run_case(&c, M3_WF_MXFP8, 528, 640, Tr, 10, 1, 0);
        fails += run_case(&c, M3_WF_NVFP4, 528, 640, Tr, 10, 1, 0);
        fails += run_case(&c, M3_WF_BF16, 200, 256, Tr, 3, 1, 0);
        /* 8 row tiles (one raster group), the last of 16 rows (904: 8 rows) */
        fails += run_case(&c, M3_WF_BF16, 904, 384, Tr, 10, 1, 0);
        fails += run_case(&c, M3_WF_NVFP4, 912, 640, Tr, 10, 1, 0);
        /* 64 tokens over 17 row chunks (the last of 16 rows): K slices would leave 10% of an H200's
         * 264 places empty, so gemm_ft splits the work stream-K (ranges crossing tiles, 2-3 partial sums) */
        fails += run_case(&c, M3_WF_MXFP8, 2064, 4096, Tr + 3, 1, 1, 0);
        /* 20 K blocks (2 slices of 10): the rings of M3_GEMM_TC_HS=1 (5-8 x halves, 2 weight slots)
         * wrap 2-4 times in a slice */
        fails += run_case(&c, M3_WF_MXFP8, 528, 2560, Tr + 6, 4, 1, 0);
        fails += run_case(&c, M3_WF_NVFP4, 528, 2560, Tr + 6, 4, 1, 0);
        if (ragged) goto out;
        /* the M3.1-Flash shapes */
        const int shapes[][2] = {{8192, 6144}, {6144, 8192}, {512, 6144}, {3072, 6144}, {6144, 3072}, {12288, 6144}};
        const int Ts[6] = {16, 32, 64, 256, 1024, 4096};
        for (int si = 0; si < 6; si++)
            for (int fi = 0; fi < 3; fi++) fails += run_case(&c, fm[fi], shapes[si][0], shapes[si][1], Ts, quick ? 5 : 6, 0, 1);
        if (!quick) { /* lm_head (BF16) */
            const int Tl[3] = {64, 256, 1024};
            fails += run_case(&c, M3_WF_BF16, 200064, 6144, Tl, 3, 0, 1);
        }
    }
out:
    err.msg[0] = 0;
    if (c.g.check && c.g.check(c.g.ctx, &err)) { printf("CUDA error: %s\n", err.msg); fails++; }
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { printf("CUDA error: %s\n", cudaGetErrorString(e)); fails++; }
    m3_cuda_ops_free(&c.g);
    printf("%s\n", fails ? "FAIL" : "all GEMM checks passed");
    return fails ? 1 : 0;
}
