/* The GPU's NVFP4 activation quantizer (src/backend/cuda/act_quant.cu, --moe-act-quant nvfp4)
 * against the CPU's rule (src/backend/cpu/act_quant.c), bit for bit: rows of 16 .. 40000 values
 * (one to four 16-value groups a thread), random magnitudes over a wide range, values placed on
 * E2M1 rounding midpoints after scaling, rows of zeros, with a NaN, with an infinity, subnormal and
 * tiny rows (2688 / amax overflowing or not); rows past 2048 groups (read twice); in place too; the
 * f16 split it writes beside (hi and lo of each result, of its bf16 rounding at precision bf16);
 * then the refusals of a row length it cannot take and of a misaligned split.
 * Runs on a GPU (scripts/gpu.sh, section 3).  usage: act_quant_check */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/common.cuh"
extern "C" {
#include "backend/cpu/cpu.h"
}

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return ((double)(rs >> 11) + 0.5) * 0x1p-53;
}

static int same(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0; }

/* the split the GEMVs read (common.cuh split_store), on the host */
static void split_host(float v, int rb, uint16_t *hi, uint16_t *lo) {
    if (rb) v = __bfloat162float(__float2bfloat16_rn(v));
    const __half h = __float2half_rn(v), l = __float2half_rn(v - __half2float(h));
    memcpy(hi, &h, 2);
    memcpy(lo, &l, 2);
}

/* split: 0 none, 1 f16 split, 2 split at precision bf16 */
static int check(m3_ops *g, int T, int H, int inplace, int split) {
    m3_cuda *c = (m3_cuda *)g->ctx;
    const size_t n = (size_t)T * H;
    float *x = (float *)malloc(4 * n), *want = (float *)malloc(4 * n), *got = (float *)malloc(4 * n);
    uint16_t *gs = (uint16_t *)malloc(4 * n);
    for (int t = 0; t < T; t++) {
        float *r = x + (size_t)t * H;
        const int kind = t % 8, e0 = (int)(urand() * 40) - 20;
        for (int i = 0; i < H; i++) r[i] = (float)((urand() * 2 - 1) * ldexp(1.0, e0 + (int)(urand() * 12) - 6));
        if (kind == 1) memset(r, 0, 4 * (size_t)H);                       /* zeros: as they are */
        if (kind == 2) r[(int)(urand() * H)] = NAN;                        /* a NaN: as it is */
        if (kind == 3) r[(int)(urand() * H)] = -INFINITY;                  /* an infinity: as it is */
        if (kind == 4)                                                     /* subnormal values */
            for (int i = 0; i < H; i++) r[i] = (float)((urand() * 2 - 1) * 0x1p-130);
        if (kind == 6)                                       /* amax 1e-36 .. 1e-35: gs overflows or not */
            for (int i = 0; i < H; i++) r[i] = (float)((urand() * 2 - 1) * 1e-36 * (1 + (t % 5) * 2));
        if (kind == 5) { /* amax 6 (gs 448, block scales 448 where a 6 sits): midpoints of E2M1 */
            static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
            for (int i = 0; i < H; i++) r[i] = i % 16 == 0 ? 6.f : mid[(int)(urand() * 7)] * (urand() < 0.5 ? -1 : 1);
        }
    }
    m3_cpu_act_quant_nvfp4(x, T, H, want);
    float *dx = (float *)g->alloc(g->ctx, 4 * n), *dy = inplace ? dx : (float *)g->alloc(g->ctx, 4 * n);
    uint16_t *ds = split ? (uint16_t *)g->alloc(g->ctx, 4 * n) : NULL;
    g->upload(g->ctx, dx, x, 4 * n);
    const int rb0 = c->gemm_bf16;
    c->gemm_bf16 = split == 2;
    int rc = m3_cu_act_quant_nvfp4(c, dx, T, H, dy, ds);
    c->gemm_bf16 = rb0;
    g->download(g->ctx, got, dy, 4 * n);
    if (ds) g->download(g->ctx, gs, ds, 4 * n);
    m3_err err;
    err.msg[0] = 0;
    if (rc || (g->check && g->check(g->ctx, &err))) {
        printf("T %d H %d: failed: %s FAIL\n", T, H, err.msg);
        free(x); free(want); free(got); free(gs);
        return 1; /* the device buffers go with the context, which has failed */
    }
    long bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!same(got[i], want[i]) && bad++ < 4)
            printf("  T %d H %d [%zu]: x %a GPU %a CPU %a\n", T, H, i, (double)x[i], (double)got[i], (double)want[i]);
    long sbad = 0;
    for (size_t i = 0; split && i < n; i++) {
        uint16_t hi, lo;
        split_host(want[i], split == 2, &hi, &lo);
        if ((gs[i] != hi || gs[n + i] != lo) && sbad++ < 4)
            printf("  T %d H %d [%zu]: value %a split %04x %04x, expected %04x %04x\n", T, H, i, (double)want[i], gs[i],
                   gs[n + i], hi, lo);
    }
    printf("T %4d H %5d%s%s: %ld of %zu values differ from the CPU's%s %s\n", T, H, inplace ? " (in place)" : "",
           split == 1 ? " + split" : split == 2 ? " + bf16 split" : "", bad, n,
           split ? (sbad ? ", and split values differ" : ", their split right") : "", bad || sbad ? "FAIL" : "ok");
    g->release(g->ctx, dx);
    if (!inplace) g->release(g->ctx, dy);
    if (ds) g->release(g->ctx, ds);
    free(x); free(want); free(got); free(gs);
    return bad != 0 || sbad != 0;
}

int main(void) {
    m3_ops g;
    m3_err err;
    if (m3_cuda_ops_init(&g, 0, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    int fails = 0;
    const int Hs[] = {16, 48, 128, 6144, 8192, 8208, 16400, 32768, 40000}; /* 40000: read twice */
    for (int h = 0; h < (int)(sizeof Hs / sizeof *Hs); h++)
        for (int T = 1; T <= 37; T += 12) fails += check(&g, T, Hs[h], 0, (T / 12) % 3); /* no split, split, bf16 split */
    fails += check(&g, 16, 6144, 1, 1);
    fails += check(&g, 8, 6144, 1, 2);
    fails += check(&g, 5, 40000, 1, 1); /* the two-read kernel in place */
    /* a row it cannot take is refused, naming it (the context then holds the failure) */
    m3_cuda *c = (m3_cuda *)g.ctx;
    float *d = (float *)g.alloc(g.ctx, 4 * 40);
    const int r = m3_cu_act_quant_nvfp4(c, d, 1, 40, d, NULL);
    err.msg[0] = 0;
    const int said = g.check && g.check(g.ctx, &err) && strstr(err.msg, "40 values");
    printf("40 values a row: %s (%s)\n", r && said ? "refused" : "NOT refused FAIL", err.msg);
    fails += !(r && said);
    /* a split that is not 16-byte aligned is refused too, after the context recovers */
    m3_err rerr;
    const int rec = !g.recover || g.recover(g.ctx, &rerr) == 0;
    uint16_t *sp = (uint16_t *)g.alloc(g.ctx, 4 * 64 + 16);
    float *d2 = (float *)g.alloc(g.ctx, 4 * 32);
    const int r2 = rec && sp && d2 ? m3_cu_act_quant_nvfp4(c, d2, 1, 32, d2, sp + 1) : 0;
    err.msg[0] = 0;
    const int said2 = r2 && g.check && g.check(g.ctx, &err) && strstr(err.msg, "misaligned");
    printf("a misaligned split: %s (%s)\n", said2 ? "refused" : rec ? "NOT refused FAIL" : "no recovery FAIL", err.msg);
    fails += !said2;
    printf(fails ? "act quant: %d checks FAILED\n" : "all act quant checks passed\n", fails);
    return fails != 0;
}
