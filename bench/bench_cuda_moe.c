/* The MoE layer on the GPU under --precision bf16 (issue 25): the routed experts on the few-slot
 * kernels (src/backend/cuda/gemm_ft.cu, up to 512 tokens) and as grouped GEMMs on the wgmma
 * kernel (moe.cu, moe_tc), each against a CPU reference with the bf16 mode's roundings, and
 * timed next to the previous paths.
 *
 * Layer: M3.1-Flash shapes (hidden 6144, 128 routed NVFP4 experts of width 3072, top-8, sigmoid +
 * bias routing, routed scale 2, SwiGLU-OAI alpha 1.702 limit 7, an MXFP8 shared expert of width
 * 3072, a BF16 router). The experts' host copies are NSET distinct random sets (expert e uses set
 * e % NSET: the host side and the reference stay small); each expert is uploaded on its own, so
 * the device reads 128 distinct experts.
 *
 * Reference (double / f32 on the host): the router on bf16(x) (precision bf16 rounds every GEMM
 * input, the router's too, at any T), top-8 by sigmoid + bias (lowest id on ties),
 * then for each picked expert in ascending order: gate / up on bf16(x), SwiGLU-OAI in f32,
 * down on bf16(h), added with the routing weight; + the shared expert the same way. Tokens whose
 * 8th and 9th choices are closer than 1e-5 are skipped (f32 order could flip the choice).
 * Pass: relative L2 <= 1e-4 on every checked token row (f32 summation order only), after matching
 * the bf16 roundings of h that f32 order can flip (values within 3e-5 of a rounding midpoint:
 * each flip is taken when it brings the reference closer to the GPU; raw_l2 is the row before,
 * up to ~2e-4 at these shapes from one or two such flips).
 * Checked: a ragged case in full (16 experts of which 6 get no token, T = 64, 77, 130, 200, 400;
 * NVFP4, MXFP8 and BF16 experts; every tile, 256 rows for NVFP4, with T 880 too),
 * then a sample of tokens (first, last, random) at the real shapes for T = 64 .. 4096 (from 2048
 * also with the tile of 128 / 256 rows the op did not take, timed).
 * Time: the whole MoE op (router .. combine), mean of reps after a warm-up: the grouped GEMMs
 * (bf16), the bf16 mode without them (M3_MOE_TC=0), and the exact mode.
 *
 * usage: bench_cuda_moe [--quick | --ragged | --only T[,T...]]   (--quick: T up to 512; --ragged: the
 * small case; --only: the M3.1-Flash layer at these T, 2 rows checked, the op timed as set) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"
#include "base/num.h"

#define TOPK 8
#define NSET 4
#define ALPHA 1.702f
#define LIMIT 7.0f
#define RSCALE 2.0f

/* M3_BENCH_ACTQ=1: the routed experts' FC1 input quantized to NVFP4 per token (--moe-act-quant
 * nvfp4), in the op and the reference (src/backend/cpu/act_quant.c, then bf16 as every GEMM input) */
static int actq;
static float xq_row[1 << 16];

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static float urand(void) { return (float)(rnd() >> 8) / 16777216.0f * 2 - 1; }

/* random weights in the host layout (as bench_cuda_linear.c) */
static void make(m3_linear *L, m3_wfmt f, int N, int K) {
    memset(L, 0, sizeof *L);
    L->fmt = f; L->N = N; L->K = K; L->gmul = 1;
    size_t rb = f == M3_WF_BF16 ? 2 * (size_t)K : f == M3_WF_MXFP8 ? (size_t)K : (size_t)K / 2;
    size_t sb = f == M3_WF_MXFP8 ? (size_t)K / 32 : f == M3_WF_NVFP4 ? (size_t)K / 16 : 0;
    uint8_t *w = malloc(rb * N), *s = sb ? malloc(sb * N) : NULL;
    if (f == M3_WF_BF16) {
        uint16_t *h = (uint16_t *)w;
        for (size_t i = 0; i < (size_t)K * N; i++) h[i] = m3_f32_to_bf16(urand() * 0.05f);
    } else if (f == M3_WF_MXFP8) {
        for (size_t i = 0; i < rb * N; i++) w[i] = m3_f32_to_e4m3(urand() * 8);
    } else {
        for (size_t i = 0; i < rb * N; i++) w[i] = (uint8_t)rnd();
    }
    for (size_t i = 0; i < sb * N; i++)
        s[i] = f == M3_WF_MXFP8 ? (uint8_t)(120 + rnd() % 4) : m3_f32_to_e4m3(0.01f + 0.01f * (rnd() % 8));
    if (f == M3_WF_NVFP4) L->gmul = 0.5f;
    L->row_bytes = rb;
    L->scale_row = sb;
    L->w = w;
    L->scale = s;
}

/* the host matrix decoded exactly (f32 holds every value), row-major [N][K] */
static float *decode(const m3_linear *L) {
    float *o = malloc(sizeof(float) * (size_t)L->N * L->K);
    float e4[256];
    for (int i = 0; i < 256; i++) e4[i] = m3_e4m3_to_f32((uint8_t)i);
    for (int n = 0; n < L->N; n++) {
        const uint8_t *row = L->w + (size_t)n * L->row_bytes, *sc = L->scale ? L->scale + (size_t)n * L->scale_row : NULL;
        float *out = o + (size_t)n * L->K;
        for (int k = 0; k < L->K; k++) {
            if (L->fmt == M3_WF_BF16) {
                uint16_t h;
                memcpy(&h, row + 2 * (size_t)k, 2);
                out[k] = m3_bf16_to_f32(h);
            } else if (L->fmt == M3_WF_MXFP8) {
                out[k] = e4[row[k]] * m3_e8m0_to_f32(sc[k / 32]);
            } else {
                const int code = (row[k / 2] >> (4 * (k & 1))) & 15;
                out[k] = m3_e2m1_values[code] * e4[sc[k / 16]] * L->gmul;
            }
        }
    }
    return o;
}

/* sum_k a[k] b[k]: 16 f32 lanes (vectorizes), added in double */
static double dot(const float *a, const float *b, int K) {
    float acc[16] = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[k + j] * b[k + j];
    double s = 0;
    for (int j = 0; j < 16; j++) s += acc[j];
    for (; k < K; k++) s += (double)a[k] * b[k];
    return s;
}

typedef struct layer {
    int E, H, F, Fs, nsub; /* nsub > 0: experts 0..nsub-1 boosted by the bias (the others get no token) */
    m3_layer_w *L;
    m3_weights hw, dw;
    float *router, *set[NSET][3], *sh[3];
} layer;

static int build(m3_ops *g, layer *y, int E, int H, int F, int Fs, int nsub, m3_wfmt efmt, m3_err *err) {
    memset(y, 0, sizeof *y);
    y->E = E; y->H = H; y->F = F; y->Fs = Fs; y->nsub = nsub;
    m3_layer_w *L = y->L = calloc(1, sizeof *L);
    L->moe = 1;
    L->has_shared = 1;
    make(&L->router, M3_WF_BF16, E, H);
    L->route_bias = calloc(E, sizeof(float));
    for (int e = 0; e < E; e++) L->route_bias[e] = 0.01f * (float)(e % 5) + (e < nsub ? 4.0f : 0.0f);
    m3_mlp_w sets[NSET];
    for (int s = 0; s < NSET; s++) {
        make(&sets[s].gate, efmt, F, H);
        make(&sets[s].up, efmt, F, H);
        make(&sets[s].down, efmt, H, F);
        y->set[s][0] = decode(&sets[s].gate);
        y->set[s][1] = decode(&sets[s].up);
        y->set[s][2] = decode(&sets[s].down);
    }
    L->experts = calloc(E, sizeof *L->experts);
    for (int e = 0; e < E; e++) L->experts[e] = sets[e % NSET];
    make(&L->shared.gate, M3_WF_MXFP8, Fs, H);
    make(&L->shared.up, M3_WF_MXFP8, Fs, H);
    make(&L->shared.down, M3_WF_MXFP8, H, Fs);
    y->sh[0] = decode(&L->shared.gate);
    y->sh[1] = decode(&L->shared.up);
    y->sh[2] = decode(&L->shared.down);
    y->router = decode(&L->router);
    memset(&y->hw, 0, sizeof y->hw);
    y->hw.layers = L;
    y->hw.n_layers = 1;
    y->hw.hidden = H;
    y->hw.n_experts = E;
    return g->weights_upload(g->ctx, &y->hw, &y->dw, err);
}

static void layer_free(m3_ops *g, layer *y) {
    g->weights_release(g->ctx, &y->dw);
    m3_layer_w *L = y->L;
    for (int s = 0; s < NSET && s < y->E; s++) {
        m3_mlp_w *m = &L->experts[s];
        free((void *)m->gate.w); free((void *)m->gate.scale); free((void *)m->up.w); free((void *)m->up.scale);
        free((void *)m->down.w); free((void *)m->down.scale);
        for (int j = 0; j < 3; j++) free(y->set[s][j]);
    }
    m3_mlp_w *m = &L->shared;
    free((void *)m->gate.w); free((void *)m->gate.scale); free((void *)m->up.w); free((void *)m->up.scale);
    free((void *)m->down.w); free((void *)m->down.scale);
    for (int j = 0; j < 3; j++) free(y->sh[j]);
    free((void *)L->router.w);
    free(y->router);
    free(L->route_bias);
    free(L->experts);
    free(L);
}

/* h values whose rounding to bf16 f32 summation order can flip: within AMBIG (relative) of the
 * midpoint between two bf16 neighbours. Each is kept with the other neighbour: the check then
 * takes, one by one, the flips that bring the reference closer to the GPU's row (both roundings
 * are outcomes of f32 order alone), and reports the row before and after. */
#define AMBIG 3e-5
#define MAXC 8192
static struct { const float *down; int F, j; float d; } cand[MAXC];
static int ncand;

/* out[H] += w * down(SwiGLU(gate xb, up xb)) with h rounded to bf16 */
static void mlp_ref(const float *const m[3], int H, int F, const float *xb, float w, float *h, float *out) {
    for (int j = 0; j < F; j++) {
        float gt = (float)dot(m[0] + (size_t)j * H, xb, H), up = (float)dot(m[1] + (size_t)j * H, xb, H);
        gt = gt < LIMIT ? gt : LIMIT;
        up = up < -LIMIT ? -LIMIT : up > LIMIT ? LIMIT : up;
        const float hf = (up + 1.0f) * (gt / (1.0f + expf(-ALPHA * gt)));
        h[j] = m3_bf16_round(hf);
        uint32_t u;
        memcpy(&u, &hf, 4);
        const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u, mid = lo + 0x8000u;
        float flo, fhi, fmid;
        memcpy(&flo, &lo, 4); memcpy(&fhi, &hi, 4); memcpy(&fmid, &mid, 4);
        if (fabsf(hf - fmid) < AMBIG * fabsf(hf) && ncand < MAXC) {
            cand[ncand].down = m[2];
            cand[ncand].F = F;
            cand[ncand].j = j;
            cand[ncand].d = w * ((h[j] == flo ? fhi : flo) - h[j]);
            ncand++;
        }
    }
    for (int n = 0; n < H; n++) out[n] += w * (float)dot(m[2] + (size_t)n * F, h, F);
}

/* the reference row of token x (T: the call's tokens, for the router's rounding); 0 when the
 * routing is too close to call */
static int ref_token(const layer *y, const float *x, int T, float *out) {
    const int E = y->E, H = y->H;
    float *xb = malloc(sizeof(float) * H), *xr = malloc(sizeof(float) * H), *h = malloc(sizeof(float) * (y->F > y->Fs ? y->F : y->Fs));
    double *s = malloc(sizeof(double) * E), *ch = malloc(sizeof(double) * E);
    for (int k = 0; k < H; k++) { xb[k] = m3_bf16_round(x[k]); xr[k] = xb[k]; }
    if (actq) { /* the routed experts' input quantized per token (the router's stays bf16(x)) */
        m3_cpu_act_quant_nvfp4(x, 1, H, xq_row);
        for (int k = 0; k < H; k++) xq_row[k] = m3_bf16_round(xq_row[k]);
    }
    for (int e = 0; e < E; e++) {
        const float lg = (float)dot(y->router + (size_t)e * H, xr, H);
        s[e] = 1.0 / (1.0 + exp(-(double)lg));
        ch[e] = s[e] + y->L->route_bias[e];
    }
    int pick[TOPK + 1];
    for (int k = 0; k <= TOPK && k < E; k++) {
        int b = -1;
        for (int e = 0; e < E; e++) {
            int used = 0;
            for (int j = 0; j < k; j++) used |= pick[j] == e;
            if (!used && (b < 0 || ch[e] > ch[b])) b = e;
        }
        pick[k] = b;
    }
    int ok = E <= TOPK || ch[pick[TOPK - 1]] - ch[pick[TOPK]] > 1e-5;
    /* ascending expert order, weights s / sum * scale */
    for (int i = 0; i < TOPK; i++)
        for (int j = i + 1; j < TOPK; j++)
            if (pick[j] < pick[i]) { int t = pick[i]; pick[i] = pick[j]; pick[j] = t; }
    double sum = 0;
    for (int k = 0; k < TOPK; k++) sum += s[pick[k]];
    memset(out, 0, sizeof(float) * H);
    ncand = 0;
    for (int k = 0; k < TOPK; k++) {
        const float *const *m = (const float *const *)y->set[pick[k] % NSET];
        mlp_ref(m, H, y->F, actq ? xq_row : xb, (float)(s[pick[k]] / sum * RSCALE), h, out);
    }
    float *sh = calloc(H, sizeof(float));
    mlp_ref((const float *const *)y->sh, H, y->Fs, xb, 1.0f, h, sh);
    for (int n = 0; n < H; n++) out[n] += sh[n];
    free(sh); free(xb); free(xr); free(h); free(s); free(ch);
    return ok;
}

static m3_moe_p moe_p(const layer *y) {
    m3_moe_p p = {y->E, TOPK, RSCALE, ALPHA, LIMIT, actq ? M3_FC1_NVFP4 : M3_FC1_EXACT};
    return p;
}

static double run_moe(m3_ops *g, layer *y, const float *dx, int T, float *dy, int reps) {
    const m3_moe_p p = moe_p(y);
    g->moe(g->ctx, &y->dw.layers[0], &p, dx, T, dy); /* warm-up (scratch) */
    double t0 = m3_cuda_sync_time(g);
    for (int r = 0; r < reps; r++) g->moe(g->ctx, &y->dw.layers[0], &p, dx, T, dy);
    return (m3_cuda_sync_time(g) - t0) / reps;
}

/* check (ntok sampled rows, or all when ntok >= T) and time one T (timed 1: every path, 2: the op as
 * the environment has it); returns failures */
static int one(m3_ops *g, layer *y, int T, int ntok, int timed) {
    const int H = y->H;
    m3_err err;
    float *x = malloc(sizeof(float) * (size_t)T * H), *yg = malloc(sizeof(float) * H), *yr = malloc(sizeof(float) * H);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = urand();
    float *dx = g->alloc(g->ctx, sizeof(float) * (size_t)T * H), *dy = g->alloc(g->ctx, sizeof(float) * (size_t)T * H);
    if (!dx || !dy) { printf("T %d: out of device memory FAIL\n", T); return 1; }
    g->upload(g->ctx, dx, x, sizeof(float) * (size_t)T * H);
    m3_cuda_set_precision(g, 1);
    setenv("M3_MOE_TC", "1", 1);
    const m3_moe_p p = moe_p(y);
    g->moe(g->ctx, &y->dw.layers[0], &p, dx, T, dy);
    err.msg[0] = 0;
    int fails = 0;
    if (g->check && g->check(g->ctx, &err)) { printf("T %d: CUDA error %s FAIL\n", T, err.msg); return 1; }
    if (ntok > T) ntok = T;
    double worst = 0, worst_raw = 0;
    int checked = 0, skipped = 0;
    long flips = 0, ncands = 0;
    for (int i = 0; i < ntok; i++) {
        const int t = ntok == T ? i : i == 0 ? 0 : i == 1 ? T - 1 : (int)(rnd() % T);
        g->download(g->ctx, yg, dy + (size_t)t * H, sizeof(float) * H);
        if (!ref_token(y, x + (size_t)t * H, T, yr)) { skipped++; continue; }
        double num = 0, den = 0;
        for (int n = 0; n < H; n++) { const double d = (double)yg[n] - yr[n]; num += d * d; den += (double)yr[n] * yr[n]; }
        double raw = sqrt(num / (den > 0 ? den : 1));
        if (raw > worst_raw) worst_raw = raw;
        /* the bf16 roundings of h that f32 order may have flipped: take those that match the GPU */
        for (int ci = 0; ci < ncand; ci++) {
            double rd = 0, dd = 0;
            for (int n = 0; n < H; n++) {
                const double d = cand[ci].d * (double)cand[ci].down[(size_t)n * cand[ci].F + cand[ci].j];
                rd += ((double)yg[n] - yr[n]) * d;
                dd += d * d;
            }
            if (2 * rd > dd) {
                for (int n = 0; n < H; n++) yr[n] += cand[ci].d * cand[ci].down[(size_t)n * cand[ci].F + cand[ci].j];
                flips++;
            }
        }
        ncands += ncand;
        num = den = 0;
        for (int n = 0; n < H; n++) { const double d = (double)yg[n] - yr[n]; num += d * d; den += (double)yr[n] * yr[n]; }
        double rel = sqrt(num / (den > 0 ? den : 1));
        if (!(rel == rel)) rel = INFINITY;
        if (rel > worst) worst = rel;
        checked++;
        if (!(rel <= 1e-4)) {
            if (fails < 4) printf("  T %d token %d: rel_l2 %.2e FAIL\n", T, t, rel);
            fails++;
        }
    }
    const double E = y->E, flop = 2.0 * T * (TOPK * 3.0 * H * y->F + 3.0 * H * y->Fs + E * H);
    if (timed == 2) { /* checked, and the op timed as the caller's environment sets it */
        const double tn = run_moe(g, y, dx, T, dy, T >= 2048 ? 5 : 10);
        printf("%5d %6d/%-3d %9.2e %9.2e %6.1f %9.3f ms %7.1f TFLOP/s %s\n", T, checked, skipped, worst_raw, worst,
               (double)flips / (checked ? checked : 1), tn * 1e3, flop / tn / 1e12, fails ? "FAIL" : "");
    } else if (timed) {
        const int reps = T >= 2048 ? 5 : 10, oreps = T >= 2048 ? 2 : 5;
        const double tn = run_moe(g, y, dx, T, dy, reps);
        setenv("M3_MOE_FT", "0", 1); /* the grouped GEMMs on the wgmma kernel (the op's choice above 512 tokens) */
        const double tg = run_moe(g, y, dx, T, dy, reps);
        /* the next wider tile than the op's choice (moe.cu), or 64 when it chose 128, 128 when 256 */
        const long S = (long)T * TOPK;
        setenv("M3_MOE_TC_BN", S >= 256L * y->E ? "128" : S >= 64L * y->E ? "64" : S >= 32L * y->E ? "128" : S >= 16L * y->E ? "64" : "32", 1);
        const double tb = run_moe(g, y, dx, T, dy, reps);
        unsetenv("M3_MOE_TC_BN");
        setenv("M3_MOE_TC", "0", 1);
        const double to = run_moe(g, y, dx, T, dy, oreps);
        m3_cuda_set_precision(g, 0);
        const double te = run_moe(g, y, dx, T, dy, oreps);
        m3_cuda_set_precision(g, 1);
        setenv("M3_MOE_TC", "1", 1);
        unsetenv("M3_MOE_FT");
        printf("%5d %6d/%-3d %9.2e %9.2e %6.1f %9.3f %7.1f %9.3f %9.3f %9.3f %9.3f %6.2fx %s\n", T, checked, skipped, worst_raw,
               worst, (double)flips / (checked ? checked : 1), tn * 1e3, flop / tn / 1e12, tg * 1e3, tb * 1e3, to * 1e3, te * 1e3,
               to / tn, fails ? "FAIL" : "");
    } else {
        printf("%5d %6d/%-3d %9.2e %9.2e %6.1f %6.1f %s\n", T, checked, skipped, worst_raw, worst, (double)flips / (checked ? checked : 1),
               (double)ncands / (checked ? checked : 1), fails ? "FAIL" : "");
    }
    fflush(stdout);
    g->release(g->ctx, dx);
    g->release(g->ctx, dy);
    free(x); free(yg); free(yr);
    return fails;
}

int main(int argc, char **argv) {
    m3_err err;
    m3_ops g;
    int quick = argc > 1 && !strcmp(argv[1], "--quick"), ragged = argc > 1 && !strcmp(argv[1], "--ragged");
    const char *only = argc > 2 && !strcmp(argv[1], "--only") ? argv[2] : NULL;
    if (argc > 1 && !quick && !ragged && !only) {
        fprintf(stderr, "usage: bench_cuda_moe [--quick | --ragged | --only T[,T...]]\n");
        return 2;
    }
    if (m3_cuda_ops_init(&g, 0, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    printf("device: %s\n", m3_cuda_device_name(&g));
    const char *aq = getenv("M3_BENCH_ACTQ");
    actq = aq && atoi(aq) != 0;
    if (actq) printf("routed experts' FC1 input quantized to NVFP4 per token (M3_BENCH_ACTQ=1)\n");
    setenv("M3_MOE_TC_MIN", "1", 1); /* the grouped GEMMs at every T here (the op takes them from 32 tokens) */
    int fails = 0;
    layer y;
    /* ragged: 16 experts, 10 boosted by the bias (6 get no token), small widths, every row checked; NVFP4,
     * MXFP8 and BF16 experts; the few-slot kernels (gemm_ft.cu; not BF16), then the wgmma GEMMs at every
     * tile width (128: 64-row tails, or fat 192-row tiles where an expert's rows end in half a tile past
     * 128, as at T = 200; BF16 keeps the tails) */
    const m3_wfmt efs[3] = {M3_WF_NVFP4, M3_WF_MXFP8, M3_WF_BF16};
    if (only) { /* the M3.1-Flash layer at these T only: 2 rows checked, the op timed as the environment sets it */
        if (build(&g, &y, 128, 6144, 3072, 3072, 0, M3_WF_NVFP4, &err)) { printf("upload: %s FAIL\n", err.msg); return 1; }
        printf("MoE layer at M3.1-Flash shapes (E=128, top-8, NVFP4 experts): the op as set (M3_MOE_TC_BN=%s)\n%5s %10s %9s %9s %6s %9s\n",
               getenv("M3_MOE_TC_BN") ? getenv("M3_MOE_TC_BN") : "-", "T", "rows/skip", "raw_l2", "rel_l2", "flips", "op");
        for (const char *q = only; *q;) {
            char *end;
            const long T = strtol(q, &end, 10);
            if (end == q || T < 1 || T > 65536 || (*end && *end != ',')) { fprintf(stderr, "--only: bad token count list '%s'\n", only); return 2; }
            fails += one(&g, &y, (int)T, 2, 2);
            q = *end ? end + 1 : end;
        }
        layer_free(&g, &y);
    }
    for (int f = 0; f < 3 && !only; f++) {
        if (build(&g, &y, 16, 512, 384, 256, 10, efs[f], &err)) { printf("upload: %s FAIL\n", err.msg); return 1; }
        printf("ragged MoE layer (E=16, 6 without tokens, H 512, F 384, %s experts, shared 256): every row; rel_l2 before /\n"
               "after matching the h roundings f32 order can flip (flips taken / candidates per row)\n%5s %10s %9s %9s %6s %6s\n",
               m3_wfmt_name(efs[f]), "T", "rows/skip", "raw_l2", "rel_l2", "flips", "cands");
        /* a boosted expert gets ~0.8 T slots: at 256-row tiles T 130 / 200 end in rest tiles of 128 /
         * 192 rows, T 400 in a full tile and 64 or 128, T 880 in two and 192 (256 only: its reference
         * takes seconds) */
        const int Tr[7] = {9, 64, 77, 130, 200, 400, 880};
        /* few-slot kernels, the GEMMs' choice, every tile (256: NVFP4 only) */
        const char *bns[7] = {"ft", NULL, "16", "32", "64", "128", "256"};
        for (int b = efs[f] == M3_WF_BF16; b < (efs[f] == M3_WF_NVFP4 ? 7 : 6); b++) { /* (few-slot: MXFP8 / NVFP4 only) */
            setenv("M3_MOE_FT", b == 0 ? "1" : "0", 1);
            if (b > 1) setenv("M3_MOE_TC_BN", bns[b], 1);
            printf("%s\n", b == 0 ? "few-slot kernels (moe_ft)" : b == 1 ? "wgmma GEMMs, the op's tile" : "wgmma GEMMs, tile:");
            if (b > 1) printf("%s\n", bns[b]);
            for (int i = b == 0 ? 0 : 1; i < (b == 0 ? 5 : b == 6 ? 7 : 6); i++) fails += one(&g, &y, Tr[i], 1 << 30, 0);
        }
        unsetenv("M3_MOE_TC_BN");
        unsetenv("M3_MOE_FT");
        layer_free(&g, &y);
    }
    if (!ragged && !only) {
        if (build(&g, &y, 128, 6144, 3072, 3072, 0, M3_WF_NVFP4, &err)) { printf("upload: %s FAIL\n", err.msg); return 1; }
        printf("MoE layer at M3.1-Flash shapes (E=128, top-8, NVFP4 experts 3072x6144, MXFP8 shared 3072, BF16 router);\n"
               "ms of the whole op: op = its choice (the few-slot kernels up to 512 tokens, then the grouped GEMMs), gemm = the\n"
               "grouped wgmma GEMMs, other_bn = their other tile width, bf16_old = bf16 without either, exact = --precision exact;\n"
               "up to 512 tokens the GEMMs' results are checked too (the line after)\n"
               "%5s %10s %9s %9s %6s %9s %7s %9s %9s %9s %9s %7s\n",
               "T", "rows/skip", "raw_l2", "rel_l2", "flips", "op_ms", "TFLOP/s", "gemm", "other_bn", "bf16_old", "exact", "speedup");
        const int Ts[8] = {16, 32, 64, 128, 256, 512, 2048, 4096};
        for (int i = 0; i < (quick ? 6 : 8); i++) {
            fails += one(&g, &y, Ts[i], 6, 1);
            if (Ts[i] <= 512) {
                setenv("M3_MOE_FT", "0", 1);
                printf("  gemm: ");
                fails += one(&g, &y, Ts[i], 6, 0);
                unsetenv("M3_MOE_FT");
            } else { /* the tile of 128 / 256 rows the op did not choose (moe.cu: 256 from 256 slots an expert),
                      * checked and timed (at 2048 tokens, ~128 slots an expert, 256-row tiles are all rest tiles) */
                const int other = (long)Ts[i] * TOPK >= 256L * y.E ? 128 : 256;
                setenv("M3_MOE_TC_BN", other == 128 ? "128" : "256", 1);
                printf("  tiles of %d: ", other);
                fails += one(&g, &y, Ts[i], 6, 2);
                unsetenv("M3_MOE_TC_BN");
            }
        }
        layer_free(&g, &y);
    }
    err.msg[0] = 0;
    if (g.check && g.check(g.ctx, &err)) { printf("CUDA error: %s\n", err.msg); fails++; }
    m3_cuda_ops_free(&g);
    printf("%s\n", fails ? "FAIL" : "all MoE checks passed");
    return fails ? 1 : 0;
}
