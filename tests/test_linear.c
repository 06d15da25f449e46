/* CPU linear kernels against a double-precision reference built from the scalar decoders,
 * for every weight format, odd shapes, every E4M3 code, extreme E8M0 scales and every E2M1
 * code; and batch invariance: a token's outputs are bitwise the same whatever T is, the same
 * bits from the one- and two-token kernels as from the many-token (tiled) one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/num.h"

static int fails = 0;

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static float frnd(void) { return (rnd() >> 8) * (1.0f / 16777216.0f) * 2 - 1; }

/* exact weight value from the format definition (spec section 1) */
static double wval(const m3_linear *W, int n, int k) {
    const uint8_t *row = W->w + (size_t)n * W->row_bytes;
    switch (W->fmt) {
    case M3_WF_F32: { float f; memcpy(&f, row + 4 * (size_t)k, 4); return f; }
    case M3_WF_BF16: { uint16_t h; memcpy(&h, row + 2 * (size_t)k, 2); return m3_bf16_to_f32(h); }
    case M3_WF_F16: { uint16_t h; memcpy(&h, row + 2 * (size_t)k, 2); return m3_f16_to_f32(h); }
    case M3_WF_MXFP8: return (double)m3_e4m3_to_f32(row[k]) * ldexp(1.0, W->scale[(size_t)n * W->scale_row + k / 32] - 127);
    case M3_WF_NVFP4: {
        uint8_t code = (k & 1) ? row[k / 2] >> 4 : row[k / 2] & 15;
        return (double)m3_e2m1_values[code] * m3_e4m3_to_f32(W->scale[(size_t)n * W->scale_row + k / 16]) * W->gmul;
    }
    default: return 0;
    }
}

static void check(m3_cpu *c, m3_wfmt fmt, int N, int K, const char *what) {
    size_t eb = fmt == M3_WF_F32 ? 4 : fmt == M3_WF_NVFP4 ? 0 : fmt == M3_WF_MXFP8 ? 1 : 2;
    m3_linear W = {fmt, N, K, NULL, 0, NULL, 0, 1.0f, 0, 0};
    W.row_bytes = fmt == M3_WF_NVFP4 ? (size_t)K / 2 : eb * K;
    W.scale_row = fmt == M3_WF_MXFP8 ? (size_t)K / 32 : fmt == M3_WF_NVFP4 ? (size_t)K / 16 : 0;
    uint8_t *w = malloc(W.row_bytes * N), *sc = W.scale_row ? malloc(W.scale_row * N) : NULL;
    for (size_t i = 0; i < W.row_bytes * N; i++) w[i] = (uint8_t)rnd();
    if (fmt == M3_WF_MXFP8) {
        for (size_t i = 0; i < (size_t)N * K; i++) if ((w[i] & 0x7f) == 0x7f) w[i] ^= 1; /* no NaN codes */
        for (int i = 0; i < 256 && i < N * K; i++) w[i] = (uint8_t)(i == 0x7f || i == 0xff ? 0x7e : i); /* every code */
        for (size_t i = 0; i < W.scale_row * N; i++) sc[i] = (uint8_t)(100 + rnd() % 40);
        sc[0] = 60; /* small (2^-67), products stay clear of f32 subnormals */
        if (W.scale_row > 2) { /* huge scales around the x256 table limit, with values that keep sums finite */
            sc[1] = 250;
            for (int k = 32; k < 64; k++) w[k] &= 0x87;  /* subnormal codes */
            sc[2] = 246;
            for (int k = 64; k < 96; k++) w[k] &= 0xBF;  /* |value| < 2 */
        }
    }
    if (fmt == M3_WF_NVFP4) {
        for (size_t i = 0; i < W.scale_row * N; i++) { sc[i] = (uint8_t)(rnd() & 0x7f); if (sc[i] == 0x7f) sc[i] = 0x7e; }
        W.gmul = 1.0f / 1234.5f;
    }
    if (fmt == M3_WF_F32) for (size_t i = 0; i < (size_t)N * K; i++) { float f = frnd(); memcpy(w + 4 * i, &f, 4); }
    if (fmt == M3_WF_BF16 || fmt == M3_WF_F16)
        for (size_t i = 0; i < (size_t)N * K; i++) {
            float f = frnd();
            uint16_t h = fmt == M3_WF_BF16 ? m3_f32_to_bf16(f) : (uint16_t)(0x3000 + (rnd() & 0x0fff)) ^ (uint16_t)((rnd() & 1) << 15);
            memcpy(w + 2 * i, &h, 2);
        }
    W.w = w;
    W.scale = sc;
    const int TMAX = 199; /* over two blocks of the tiled kernel (TBT 96) */
    float *x = malloc(sizeof(float) * TMAX * K), *y = malloc(sizeof(float) * TMAX * N), *y1 = malloc(sizeof(float) * N);
    for (int i = 0; i < TMAX * K; i++) x[i] = frnd();
    m3_cpu_linear(c, &W, x, TMAX, y);
    /* correctness: relative error against the double reference */
    double worst = 0;
    for (int t = 0; t < TMAX; t++)
        for (int n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) { double p = wval(&W, n, k) * x[(size_t)t * K + k]; ref += p; mag += fabs(p); }
            double e = fabs(y[(size_t)t * N + n] - ref) / (mag > 0 ? mag : 1);
            if (e > worst || e != e) worst = e;
        }
    int bad = !(worst < 1e-6);
    if (bad) { fails++; printf("FAIL %s: error %.3g vs double reference\n", what, worst); }
    /* batch invariance: every T gives the same bits as T = 199 for each token: the one- and
     * two-token kernel below TILED_MIN (16, NVFP4 48), the tiled kernel from there (tiles of 3
     * tokens and leftovers of 1 and 2, one block of TBT = 96 and more) */
    int Ts[] = {1, 2, 3, 9, 16, 17, 47, 48, 50, 97};
    int diff = 0;
    for (int i = 0; i < (int)(sizeof Ts / sizeof *Ts); i++) {
        float *yt = malloc(sizeof(float) * Ts[i] * N);
        for (int t0 = 0; t0 + Ts[i] <= TMAX; t0 += 7 * Ts[i]) {
            m3_cpu_linear(c, &W, x + (size_t)t0 * K, Ts[i], yt);
            diff += memcmp(yt, y + (size_t)t0 * N, sizeof(float) * Ts[i] * N) != 0;
        }
        free(yt);
    }
    /* precision bf16 (m3_cpu_set_precision): the same bits as the exact kernel on x rounded to bf16
     * first, and not the exact result (x here is never all bf16 values) */
    float *xr = malloc(sizeof(float) * TMAX * K), *yb = malloc(sizeof(float) * TMAX * N), *yr = malloc(sizeof(float) * TMAX * N);
    for (int i = 0; i < TMAX * K; i++) xr[i] = m3_bf16_round(x[i]);
    c->gemm_bf16 = 1;
    m3_cpu_linear(c, &W, x, TMAX, yb);
    c->gemm_bf16 = 0;
    m3_cpu_linear(c, &W, xr, TMAX, yr);
    if (memcmp(yb, yr, sizeof(float) * TMAX * N) || !memcmp(yb, y, sizeof(float) * TMAX * N)) {
        fails++;
        printf("FAIL %s: precision bf16 is not the exact kernel on bf16-rounded x\n", what);
    }
    free(xr); free(yb); free(yr);
    if (diff) { fails++; printf("FAIL %s: %d batches differ bitwise from the T=199 results\n", what, diff); }
    else if (!bad) printf("ok   %-28s max rel error %.2g, batch invariant\n", what, worst);
    free(w); free(sc); free(x); free(y); free(y1);
}

/* NVFP4 scales at the edges: the E4M3 NaN codes 0x7F / 0xFF and a global multiplier whose
 * 256-fold overflows (2^120): every T gives each token the same bits (the vector scale conversions equal
 * the table's e4m3 * gmul), rows with a NaN scale NaN, the others as the table says */
static void check_nvfp4_edges(m3_cpu *c, int N, int K, float gmul, const char *what) {
    m3_linear W = {M3_WF_NVFP4, N, K, NULL, (size_t)K / 2, NULL, (size_t)K / 16, gmul, 0, 0};
    uint8_t *w = malloc(W.row_bytes * N), *sc = malloc(W.scale_row * N);
    for (size_t i = 0; i < W.row_bytes * N; i++) w[i] = (uint8_t)rnd();
    for (size_t i = 0; i < W.scale_row * N; i++) sc[i] = (uint8_t)(1 + rnd() % 15); /* < 2^-5: sums stay finite */
    sc[W.scale_row * 1 + 3] = 0x7F; /* row 1: a NaN block; row 2: a negative NaN block */
    if (N > 2) sc[W.scale_row * 2 + K / 16 - 1] = 0xFF;
    W.w = w;
    W.scale = sc;
    const int TMAX = 101;
    float *x = malloc(sizeof(float) * TMAX * K), *y = malloc(sizeof(float) * TMAX * N), *yt = malloc(sizeof(float) * TMAX * N);
    for (int i = 0; i < TMAX * K; i++) x[i] = frnd();
    m3_cpu_linear(c, &W, x, TMAX, y);
    int diff = 0, nan_ok = 1;
    const int Ts[] = {1, 2, 16, 48, 97};
    for (int i = 0; i < 5; i++) {
        m3_cpu_linear(c, &W, x, Ts[i], yt);
        diff += memcmp(yt, y, sizeof(float) * Ts[i] * N) != 0;
    }
    for (int t = 0; t < TMAX; t++)
        for (int n = 0; n < N; n++) {
            float v = y[(size_t)t * N + n];
            nan_ok &= (n == 1 || (n == 2 && N > 2)) ? v != v : v == v;
        }
    if (diff || !nan_ok) { fails++; printf("FAIL %s: %d batches differ bitwise; NaN rows %s\n", what, diff, nan_ok ? "right" : "wrong"); }
    else printf("ok   %-28s NaN scales, gmul %g: batch invariant\n", what, gmul);
    free(w); free(sc); free(x); free(y); free(yt);
}

int main(void) {
    m3_cpu c = {.pool = m3_pool_create(2), .nthreads = 2};
    printf("kernels: %s\n", m3_cpu_simd_name());
    check(&c, M3_WF_F32, 13, 40, "f32 13x40");
    check(&c, M3_WF_BF16, 33, 264, "bf16 33x264 (tail chunk)");
    check(&c, M3_WF_BF16, 7, 20, "bf16 7x20 (K % 8 != 0)");
    check(&c, M3_WF_F16, 9, 96, "f16 9x96");
    check(&c, M3_WF_BF16, 12, 512, "bf16 12x512");
    check(&c, M3_WF_F32, 5, 48, "f32 5x48");
    check(&c, M3_WF_MXFP8, 17, 288, "mxfp8 17x288 (all codes)");
    check(&c, M3_WF_MXFP8, 5, 32, "mxfp8 5x32");
    check(&c, M3_WF_NVFP4, 11, 320, "nvfp4 11x320");
    check(&c, M3_WF_NVFP4, 6, 48, "nvfp4 6x48 (K % 32 != 0)");
    check(&c, M3_WF_NVFP4, 64, 1024, "nvfp4 64x1024");
    check(&c, M3_WF_NVFP4, 9, 96, "nvfp4 9x96 (64 + 32 tail)");
    check(&c, M3_WF_NVFP4, 3, 2080, "nvfp4 3x2080 (chunk tail)");
    check(&c, M3_WF_NVFP4, 3, 2112, "nvfp4 3x2112 (64-column tail)");
    check(&c, M3_WF_MXFP8, 4, 2080, "mxfp8 4x2080 (chunk tail)");
    check_nvfp4_edges(&c, 5, 64, ldexpf(1.0f, 120), "nvfp4 5x64 edge scales");
    check_nvfp4_edges(&c, 9, 640, ldexpf(1.0f, 120), "nvfp4 9x640 edge scales");
    check_nvfp4_edges(&c, 3, 96, 1.0f / 3.0f, "nvfp4 3x96 NaN scales");
    m3_pool_free(c.pool);
    printf("%s\n", fails ? "linear tests FAILED" : "linear tests passed");
    return fails != 0;
}
