/* Quantizer tests: hand-computed MXFP8 / NVFP4 codes (ties, saturation, E4M3 subnormals,
 * zero blocks, signs, nibble order), bad shapes, a sweep of the E4M3 fast path against
 * m3_f32_to_e4m3, dequantization error bounds on random data, and golden rows taken from
 * ../shared/testdata (m3-tiny bf16 weights -> m3-tiny-q bytes, written by the oracle's
 * torch code) that pin the details a reimplementation gets wrong: ties to the lower
 * magnitude, and the global scale computed as (1 / amax) * 2688. Also the activations' NVFP4
 * rule (m3_cpu_act_quant_nvfp4, --moe-act-quant nvfp4): hand-computed rows and a random sweep.
 *
 *   gcc -std=c11 -O2 -Wall -Wextra -D_GNU_SOURCE -Isrc tests/test_quantize.c src/weights/quantize.c \
 *       src/backend/cpu/act_quant.c src/kv/kv.c src/base/pool.c src/base/num.c src/base/err.c -lm -lpthread \
 *       -o /tmp/tq && /tmp/tq
 *   (or the ctest `quantize`, linked with the whole library)
 * Exit status 0 when everything passes; each failure prints one line. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/num.h"
#include "kv/kv.h"
#include "weights/quantize.h"

static int failures, checks;

#define CHECK(cond, ...)                                                 \
    do {                                                                 \
        checks++;                                                        \
        if (!(cond)) {                                                   \
            failures++;                                                  \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                  \
            printf(__VA_ARGS__);                                         \
            printf("\n");                                                \
        }                                                                \
    } while (0)

static float bits_f(uint32_t u) { return m3_f32_from_bits(u); }

/* ------------------------------------------------------------------ MXFP8 */

static void test_mxfp8_hand(void) {
    /* amax 1.0 -> e = floor(log2 1) - 8 = -8, scale byte 119; code = e4m3(x * 256) */
    float x[64] = {0};
    uint8_t want[64] = {0};
    struct { float x; uint8_t code; const char *why; } c[] = {
        {1.0f, 0x78, "256 = 2^8: exponent 15, mantissa 0"},
        {0.5f, 0x70, "128"},
        {-1.0f, 0xf8, "negative"},
        {1.0625f, 0x78, "272: tie between 256 (m=0) and 288 (m=1) -> even 256"},
        {1.1875f, 0x7a, "304: tie between 288 (m=1) and 320 (m=2) -> even 320"},
        {1.09375f, 0x79, "280: nearer 288"},
        {0x1p-17f, 0x01, "2^-9 after scaling: smallest subnormal"},
        {3 * 0x1p-17f, 0x03, "3 * 2^-9: subnormal"},
        {2.5f * 0x1p-17f, 0x02, "2.5 * 2^-9: subnormal tie -> even 2"},
        {3.5f * 0x1p-17f, 0x04, "3.5 * 2^-9: subnormal tie -> even 4"},
        {0.5f * 0x1p-17f, 0x00, "0.5 * 2^-9: tie between 0 and 1 -> 0"},
        {0.75f * 0x1p-17f, 0x01, "0.75 * 2^-9 -> 1"},
        {7.5f * 0x1p-17f, 0x08, "7.5 * 2^-9 rounds up to 8 * 2^-9 = 2^-6, the smallest normal (code 0x08)"},
        {-2 * 0x1p-17f, 0x82, "negative subnormal"},
        {-0.0f, 0x80, "negative zero keeps its sign"},
        {0.0f, 0x00, "zero"},
        {0.01171875f, 0x44, "3 = 1.5 * 2^1: exponent field 8, mantissa 4"},
    };
    int n = (int)(sizeof c / sizeof c[0]);
    for (int i = 0; i < n; i++) { x[i] = c[i].x; want[i] = c[i].code; }
    /* second block: saturation. amax 1.9 -> e = -8 still; 1.9 * 256 = 486.4 > 448 */
    float sat[] = {1.9f, -1.9f, 1.75f, 1.8125f, 1.6875f, 1.625f};
    uint8_t satc[] = {0x7e, 0xfe, 0x7e, 0x7e, 0x7e, 0x7d}; /* 464: tie 448/480 -> 448; 432: tie 416/448 -> even 448 */
    for (int i = 0; i < 6; i++) { x[32 + i] = sat[i]; want[32 + i] = satc[i]; }
    uint8_t q[64], s[2];
    m3_err err;
    CHECK(m3_quant_mxfp8(x, 1, 64, q, s, &err) == 0, "mxfp8 failed: %s", err.msg);
    CHECK(s[0] == 119, "block 0 scale byte %u, want 119 (2^-8)", s[0]);
    CHECK(s[1] == 119, "block 1 scale byte %u, want 119", s[1]);
    for (int i = 0; i < n; i++) CHECK(q[i] == want[i], "mxfp8 code of %a: 0x%02x, want 0x%02x (%s)", (double)c[i].x, q[i], want[i], c[i].why);
    for (int i = 0; i < 6; i++) CHECK(q[32 + i] == want[32 + i], "mxfp8 saturation code of %g: 0x%02x, want 0x%02x", (double)sat[i], q[32 + i], want[32 + i]);
    for (int i = n; i < 32; i++) CHECK(q[i] == 0, "padding zero at %d -> 0x%02x", i, q[i]);
    /* decoded: 416 / 256 = 1.625; saturated ones decode to 448 / 256 = 1.75 */
    float d[64];
    m3_quant_mxfp8_dequant(q, s, 1, 64, d);
    CHECK(d[37] == 1.625f && d[32] == 1.75f && d[33] == -1.75f, "saturated/decoded values %g %g %g", (double)d[37], (double)d[32], (double)d[33]);
}

static void test_mxfp8_scales(void) {
    /* scale byte = floor(log2(amax)) - 8 + 127, blocks of 32 along K, one row per N */
    struct { float amax; int byte; } c[] = {
        {1.0f, 119}, {1.999f, 119}, {2.0f, 120}, {0.125f, 116}, {448.0f, 127}, {3.0e38f, 246},
        {0x1p-119f, 0}, {0.0f, 0} /* zero block: byte 0 (the oracle's formula would give 255, E8M0 NaN) */,
    };
    int n = (int)(sizeof c / sizeof c[0]);
    float *x = calloc((size_t)n * 32, sizeof *x);
    uint8_t *q = malloc((size_t)n * 32), *s = malloc((size_t)n);
    for (int i = 0; i < n; i++)
        if (c[i].amax > 0) { x[i * 32 + 5] = -c[i].amax; x[i * 32 + 6] = c[i].amax / 3; }
    m3_err err;
    CHECK(m3_quant_mxfp8(x, n, 32, q, s, &err) == 0, "mxfp8 failed: %s", err.msg);
    for (int i = 0; i < n; i++) {
        CHECK(s[i] == c[i].byte, "amax %g: scale byte %u, want %d", (double)c[i].amax, s[i], c[i].byte);
        if (c[i].amax > 0)
            CHECK((q[i * 32 + 5] & 0x80) && (q[i * 32 + 5] & 0x78) >= 0x78 - 8, "amax %g: code 0x%02x should be negative, top binade", (double)c[i].amax, q[i * 32 + 5]);
    }
    for (int k = 0; k < 32; k++) CHECK(q[(n - 1) * 32 + k] == 0, "zero block code %d = 0x%02x", k, q[(n - 1) * 32 + k]);
    free(x); free(q); free(s);
}

/* The E4M3 conversion inside the quantizer is a bit-twiddling fast path; with a block whose
 * amax is in [256, 512) the scale is 2^0 and the codes are e4m3(x) themselves. */
static void test_e4m3_sweep(void) {
    float x[32];
    uint8_t q[32], s[1];
    m3_err err;
    long bad = 0, n = 0;
    for (uint64_t u = 0; u + 32 * 15 < 0x44000000u; u += 31 * 16) { /* |x| < 512 */
        x[0] = 256.0f;
        for (int i = 1; i < 32; i++) x[i] = bits_f((uint32_t)(u + (uint64_t)i * 15) | (i & 1 ? 0x80000000u : 0));
        if (m3_quant_mxfp8(x, 1, 32, q, s, &err) || s[0] != 127) { bad++; break; }
        for (int i = 0; i < 32; i++, n++)
            if (q[i] != m3_f32_to_e4m3(x[i])) {
                if (bad++ < 5) printf("  e4m3(%a): quantizer 0x%02x, m3_f32_to_e4m3 0x%02x\n", (double)x[i], q[i], m3_f32_to_e4m3(x[i]));
            }
    }
    CHECK(bad == 0, "E4M3 fast path disagrees with m3_f32_to_e4m3 on %ld of %ld values", bad, n);
}

static void test_mxfp8_random(void) {
    enum { N = 64, K = 256 };
    static float x[N * K], d[N * K];
    static uint8_t q[N * K], s[N * K / 32];
    uint64_t r = 42;
    for (int i = 0; i < N * K; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        double u = ((double)(r >> 11) + 0.5) * 0x1p-53;
        int ex = (int)((r >> 3) % 40) - 30; /* wide dynamic range, across blocks and within */
        x[i] = (float)((u * 2 - 1) * ldexp(1.0, ex));
    }
    m3_err err;
    CHECK(m3_quant_mxfp8(x, N, K, q, s, &err) == 0, "mxfp8 failed: %s", err.msg);
    m3_quant_mxfp8_dequant(q, s, N, K, d);
    int bad = 0;
    for (int i = 0; i < N * K; i++) {
        double sc = ldexp(1.0, s[i / 32] - 127), a = fabs((double)x[i]), err_ = fabs((double)x[i] - d[i]);
        double bound = a > 448 * sc ? a - 448 * sc : fmax(a / 16, sc * 0x1p-10); /* half a step; saturation exact */
        if (!(err_ <= bound * (1 + 1e-12)) || (d[i] != 0 && signbit(d[i]) != signbit(x[i]))) {
            if (bad++ < 5) printf("  mxfp8 x=%a deq=%a scale 2^%d err %g > %g\n", (double)x[i], (double)d[i], s[i / 32] - 127, err_, bound);
        }
    }
    CHECK(bad == 0, "MXFP8 dequantization outside the rounding bound for %d values", bad);
}

/* ------------------------------------------------------------------ NVFP4 */

static const double E2M1V[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

static void test_e2m1(void) {
    struct { double v; uint8_t code; } c[] = {
        {0, 0}, {-0.0, 0}, {0.1, 0}, {0.25, 0}, {0.2500001, 1}, {0.5, 1}, {0.75, 1}, {0.7500001, 2},
        {1.0, 2}, {1.25, 2}, {1.2500001, 3}, {1.5, 3}, {1.75, 3}, {1.75000001, 4}, {2.0, 4}, {2.5, 4},
        {2.50001, 5}, {3.0, 5}, {3.5, 5}, {3.5000001, 6}, {4.0, 6}, {5.0, 6}, {5.0000001, 7}, {6.0, 7},
        {7.0, 7}, {1e30, 7}, {INFINITY, 7}, {-0.1, 0}, {-0.25, 0}, {-0.26, 9}, {-0.75, 9}, {-1.75, 11},
        {-3.5, 13}, {-5.0, 14}, {-6.0, 15}, {-100.0, 15}, {-INFINITY, 15}, {0x1p-1074, 0}, {0.7499999999999999, 1},
        {NAN, 7},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        CHECK(m3_quant_e2m1(c[i].v) == c[i].code, "e2m1(%.17g) = %u, want %u (exact ties go to the lower magnitude)",
              c[i].v, m3_quant_e2m1(c[i].v), c[i].code);
    /* nearest with lower-magnitude ties, against a brute-force argmin over a dense sweep */
    int bad = 0;
    for (int i = -70000; i <= 70000; i++) {
        double v = i / 10000.0, m = fmin(fabs(v), 6.0);
        int best = 0;
        for (int k = 1; k < 8; k++) if (fabs(m - E2M1V[k]) < fabs(m - E2M1V[best])) best = k;
        uint8_t want = (uint8_t)(best && v < 0 ? best | 8 : best);
        if (m3_quant_e2m1(v) != want && bad++ < 5) printf("  e2m1(%.17g) = %u, want %u\n", v, m3_quant_e2m1(v), want);
    }
    CHECK(bad == 0, "e2m1 sweep: %d mismatches", bad);
}

static void test_nvfp4_hand(void) {
    /* tensor amax 6 -> gs = (1/6) * 2688 = 448 exactly (in double). */
    enum { K = 80 };
    float x[K] = {0};
    /* block 0: amax 6 -> s = e4m3(6/6 * 448) = 448 (0x7e), y = x * 448 / 448 = x */
    const float b0[16] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f,
                          -0.25f, -0.75f, -1.75f, -5.0f, -6.0f, 0.3f, -0.0f, 2.9f};
    const uint8_t c0[16] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 11, 14, 15, 1, 0, 5};
    /* block 1: amax 3 -> s = e4m3(3/6 * 448 = 224) = 0x76, y = 2x */
    const float b1[16] = {0.375f, -0.125f, 3.0f, -3.0f, 0.875f, 1.25f, 0.1f, 0.2f,
                          0.625f, 1.75f, 2.5f, -0.375f, 0, 0, 0, 0};
    const uint8_t c1[16] = {1, 0, 7, 15, 3, 4, 0, 1, 2, 5, 6, 9, 0, 0, 0, 0};
    /* block 2: zeros -> scale 0, codes 0 */
    /* block 3: amax 1e-5 -> s = e4m3(7.5e-4) = 0 (below half of 2^-9); the codes are still
     * taken against max(s, 2^-9), as the oracle does: y = x * 448 * 512 */
    const float b3[16] = {1e-5f, -5e-6f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    const uint8_t c3[16] = {4, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    /* block 4: a subnormal E4M3 scale: amax such that amax / 6 * 448 = 3 * 2^-9 */
    const float b4amax = (float)(3 * 0x1p-9 * 6 / 448);
    for (int i = 0; i < 16; i++) { x[i] = b0[i]; x[16 + i] = b1[i]; x[48 + i] = b3[i]; }
    x[64] = b4amax;
    x[65] = -b4amax / 2;
    uint8_t p[K / 2], s[K / 16];
    float g = 0;
    m3_err err;
    CHECK(m3_quant_nvfp4(x, 1, K, p, s, &g, &err) == 0, "nvfp4 failed: %s", err.msg);
    CHECK(g == 448.0f, "global scale %g, want 448", (double)g);
    CHECK(s[0] == 0x7e && s[1] == 0x76 && s[2] == 0 && s[3] == 0 && s[4] == 0x03,
          "block scales %02x %02x %02x %02x %02x, want 7e 76 00 00 03", s[0], s[1], s[2], s[3], s[4]);
    for (int i = 0; i < 16; i++) {
        uint8_t got0 = (p[i / 2] >> (4 * (i & 1))) & 15, got1 = (p[8 + i / 2] >> (4 * (i & 1))) & 15;
        uint8_t got2 = (p[16 + i / 2] >> (4 * (i & 1))) & 15, got3 = (p[24 + i / 2] >> (4 * (i & 1))) & 15;
        CHECK(got0 == c0[i], "block 0 element %d (x=%g): code %u, want %u", i, (double)b0[i], got0, c0[i]);
        CHECK(got1 == c1[i], "block 1 element %d (x=%g, y=2x): code %u, want %u", i, (double)b1[i], got1, c1[i]);
        CHECK(got2 == 0, "zero block element %d: code %u", i, got2);
        CHECK(got3 == c3[i], "block 3 element %d (x=%g): code %u, want %u", i, (double)b3[i], got3, c3[i]);
    }
    /* nibble order: element 2i low, 2i+1 high: x[0]=0.25 (0), x[1]=0.75 (1) -> 0x10;
     * x[6]=5 (6), x[7]=6 (7) -> 0x76; x[10]=-1.75 (11), x[11]=-5 (14) -> 0xeb */
    CHECK(p[0] == 0x10 && p[3] == 0x76 && p[5] == 0xeb, "packed bytes %02x %02x %02x, want 10 76 eb", p[0], p[3], p[5]);
    CHECK(p[32] == 0xd7, "subnormal-scale block codes %02x, want 0xd7 (y = 6 -> 7, y = -3 -> 13)", p[32]);
    float d[K];
    m3_quant_nvfp4_dequant(p, s, g, 1, K, d);
    CHECK(d[7] == 6.0f && d[12] == -6.0f && d[1] == 0.5f && d[16] == 0.25f && d[18] == 3.0f && d[48] == 0.0f,
          "decoded %g %g %g %g %g %g", (double)d[7], (double)d[12], (double)d[1], (double)d[16], (double)d[18], (double)d[48]);
    /* -0.25 codes as 0, never as 8 (negative zero) */
    CHECK(((p[4] & 15) == 0), "-0.25 -> code %u, want 0", p[4] & 15);
}

static void test_nvfp4_random(void) {
    enum { N = 48, K = 192 };
    static float x[N * K], d[N * K];
    static uint8_t p[N * K / 2], s[N * K / 16], p2[N * K / 2], s2[N * K / 16];
    uint64_t r = 7;
    for (int i = 0; i < N * K; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        double u = ((double)(r >> 11) + 0.5) * 0x1p-53;
        int ex = (int)((r >> 3) % 12) - 8;
        x[i] = (float)((u * 2 - 1) * ldexp(1.0, ex));
        if (i % 97 == 0) x[i] = m3_bf16_to_f32(m3_f32_to_bf16(x[i] * 0.5f)); /* a few bf16 values */
    }
    float g;
    m3_err err;
    CHECK(m3_quant_nvfp4(x, N, K, p, s, &g, &err) == 0, "nvfp4 failed: %s", err.msg);
    double gs = m3_quant_nvfp4_global(x, (size_t)N * K);
    CHECK((float)gs == g, "global scale %g vs %g", (double)g, gs);
    /* rows are independent: quantizing in two parts with the same gs gives the same bytes */
    CHECK(m3_quant_nvfp4_rows(x, 20, K, gs, p2, s2, &err) == 0 &&
              m3_quant_nvfp4_rows(x + 20 * K, N - 20, K, gs, p2 + 20 * K / 2, s2 + 20 * K / 16, &err) == 0,
          "nvfp4_rows failed: %s", err.msg);
    CHECK(memcmp(p, p2, sizeof p) == 0 && memcmp(s, s2, sizeof s) == 0, "row-chunked NVFP4 differs from whole");
    m3_quant_nvfp4_dequant(p, s, g, N, K, d);
    int bad = 0;
    for (int i = 0; i < N * K; i++) {
        /* each code is the nearest E2M1 value to y = clamp(x * gs / s); ties to the lower */
        double sf = fmax(m3_e4m3_to_f32(s[i / 16]), 0x1p-9);
        double y = (double)x[i] * gs / sf, m = fmin(fabs(y), 6.0);
        uint8_t code = (p[i / 2] >> (4 * (i & 1))) & 15;
        double qv = E2M1V[code & 7];
        int ok = (code == 0 || (code >= 8) == (y < 0));
        for (int k = 0; k < 8; k++)
            if (fabs(m - E2M1V[k]) < fabs(m - qv) || (fabs(m - E2M1V[k]) == fabs(m - qv) && E2M1V[k] < qv)) ok = 0;
        /* the block scale: e4m3 of amax / 6 * gs, so the block's largest |y| is near 6 */
        double expect = (double)m3_e4m3_to_f32(s[i / 16]) * qv / (double)g * (code >= 8 ? -1 : 1);
        if (fabs(d[i] - expect) > 1e-6 * fabs(expect)) ok = 0;
        if (!ok && bad++ < 5) printf("  nvfp4 x=%a y=%.17g code %u deq %g\n", (double)x[i], y, code, (double)d[i]);
    }
    CHECK(bad == 0, "NVFP4 codes not nearest / dequant wrong for %d values", bad);
    /* block scales: e4m3(amax_block / 6 * gs) */
    for (int b = 0; b < N * K / 16; b++) {
        float amax = 0;
        for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[b * 16 + i]));
        uint8_t want = m3_f32_to_e4m3((float)((double)amax / 6.0 * gs));
        if (s[b] != want) { CHECK(0, "block %d scale 0x%02x, want 0x%02x", b, s[b], want); break; }
    }
}

/* ------------------------------------------------------------------ errors */

static void test_errors(void) {
    float x[64] = {0};
    uint8_t q[64], s[4];
    float g;
    m3_err err;
    err.msg[0] = 0;
    CHECK(m3_quant_mxfp8(x, 1, 48, q, s, &err) == -1 && strstr(err.msg, "32"), "MXFP8 K=48 accepted or no message: '%s'", err.msg);
    CHECK(m3_quant_mxfp8(x, 1, 0, q, s, &err) == -1, "MXFP8 K=0 accepted");
    CHECK(m3_quant_mxfp8(x, -1, 32, q, s, &err) == -1, "MXFP8 N=-1 accepted");
    CHECK(m3_quant_mxfp8(x, 0, 32, q, s, &err) == 0, "MXFP8 N=0 rejected");
    CHECK(m3_quant_nvfp4(x, 1, 24, q, s, &g, &err) == -1 && strstr(err.msg, "16"), "NVFP4 K=24 accepted or no message: '%s'", err.msg);
    CHECK(m3_quant_nvfp4_rows(x, 1, 8, 1.0, q, s, &err) == -1, "NVFP4 K=8 accepted");
    CHECK(m3_quant_nvfp4_rows(x, 1, 16, 0.0, q, s, &err) == -1, "NVFP4 gs=0 accepted");
    CHECK(m3_quant_nvfp4_rows(x, 1, 16, NAN, q, s, &err) == -1, "NVFP4 gs=NaN accepted");
    x[3] = NAN;
    CHECK(m3_quant_mxfp8(x, 1, 32, q, s, &err) == -1, "MXFP8 NaN input accepted");
    CHECK(m3_quant_nvfp4(x, 1, 32, q, s, &g, &err) == -1, "NVFP4 NaN input accepted");
    x[3] = INFINITY;
    CHECK(m3_quant_mxfp8(x, 1, 32, q, s, &err) == -1, "MXFP8 inf input accepted");
    CHECK(m3_quant_nvfp4_global(x, 32) < 0, "nvfp4_global of inf not flagged");
    /* all-zero tensor: gs = 2688e12, scales 0, codes 0 */
    memset(x, 0, sizeof x);
    CHECK(m3_quant_nvfp4(x, 2, 32, q, s, &g, &err) == 0 && g == (float)((1.0 / 1e-12) * 2688.0) && s[0] == 0 && q[0] == 0,
          "zero tensor: gs %g scale %u code %u", (double)g, s[0], q[0]);
}

/* ------------------------------------------------------------------ golden rows from the oracle */

/* model.layers.3.block_sparse_moe.experts.0.w1 row 40 (tensor [64, 128]) */
static const uint16_t NV1_X[128] = {0x3eb2,0x3ea0,0x3dd7,0x3dd9,0x3e25,0xbf03,0x3cfc,0xbefd,0xbef7,0x3e15,0xbe1f,0x3dcf,0x3e66,0xbdf6,0x3e70,0xbbb7,0x3f04,0xbdae,0x3e74,0x3ee2,0x3df0,0xbf0c,0x3e6e,0x3dbf,0xbea1,0x3dc0,0x3dcb,0xbe12,0x3ef5,0xbee3,0x3cab,0xbe5b,0x3e29,0x3e93,0xbe50,0x3e4d,0x3ec8,0xbe89,0xbcc0,0xbe67,0x3dfc,0x3c92,0xbd03,0x3d02,0x3e09,0xbf09,0xbe5c,0x3e91,0x3e85,0x3ec3,0xbe07,0xbe50,0xbec3,0xbdbf,0xbe43,0xbddb,0x3dd6,0xbe63,0xbf09,0x3e84,0xbf24,0x3c00,0x3e43,0x3e0c,0xbecd,0x3e36,0xbe26,0x3ea2,0x3da5,0xbe9e,0xbaa0,0xbdef,0xbea6,0x3e75,0xbdc3,0xbea4,0xbe85,0xbebb,0xbcbd,0xbd2d,0x3e50,0x3e92,0x3dbc,0xbd16,0x3da6,0xbe05,0x3d58,0x3d45,0x3ebf,0x3e33,0xbe00,0x3df4,0x3eaa,0xbef4,0x3c2e,0x3e35,0x3ee2,0x3e8d,0xbce5,0x3ec9,0xbdd5,0x3e97,0x3e57,0x3cee,0x3e5a,0x3e95,0xbe64,0xbd8e,0x3d86,0xbd18,0xbda0,0xbe5b,0x3e43,0x3e96,0x3ec9,0xbe53,0x3e5f,0xbb8e,0x3efd,0xbd9c,0xbd95,0x3f02,0xbea3,0x3c74,0x3c3b,0xbe13,0xbdca,0xbe1c};
static const uint32_t NV1_AMAX = 0x3f9c0000; /* tensor max |x| */
static const uint32_t NV1_GS = 0x4509d89e;
static const uint8_t NV1_PACKED[64] = {0x66,0x22,0xf4,0xf1,0x3f,0x2c,0xb5,0x05,0xa7,0x65,0xf2,0x24,0x2d,0xb2,0xe7,0xc0,0x54,0x4c,0xd6,0xd9,0x03,0x19,0xf3,0x5c,0x54,0xca,0xad,0xab,0xc2,0x4e,0x0f,0x33,0x5f,0x6c,0xe2,0xc0,0x6e,0xeb,0xfe,0x99,0x65,0x92,0xb2,0x11,0x46,0x3b,0xf6,0x40,0x67,0x79,0x6b,0x15,0x65,0xad,0x92,0xda,0x54,0xc6,0x05,0xa7,0x7a,0x0e,0xb0,0xba};
static const uint8_t NV1_SCALE[8] = {0x74,0x75,0x74,0x77,0x71,0x73,0x72,0x74};
/* model.layers.2.block_sparse_moe.experts.3.w2 row 48 (tensor [128, 64]) */
static const uint16_t NV2_X[64] = {0x3df4,0x3dc4,0x3df0,0x3ce8,0xbe24,0xbe35,0xbe1b,0xbd9c,0x3df6,0x3ddc,0xbe0c,0x3d06,0xbde8,0x3b48,0x3e87,0xbdd2,0xbd6c,0xbd0e,0x3e3d,0xbc72,0xbe1f,0xbe20,0xbe15,0xbcee,0xbc9f,0xbd7f,0xbcbc,0xbcf0,0x3d5f,0x3ecc,0x3d7e,0x3d98,0xbe0d,0x3bb0,0xbd4f,0xbe45,0x3dbd,0x3cd1,0x3e3c,0x3d9a,0xbe6a,0xbdd9,0x3c50,0xbc30,0x3e43,0x3c8d,0xbd8d,0x3a0f,0xbdc5,0x3b99,0x3e98,0xbdbe,0x3dd2,0xbe76,0x3c8f,0x3d04,0x3dad,0xbe2c,0xbe2a,0xbdb9,0xbded,0x3cbd,0xbd7b,0x3d77};
static const uint32_t NV2_AMAX = 0x3eea0000; /* tensor max |x| */
static const uint32_t NV2_GS = 0x45b7cb7d;
static const uint8_t NV2_PACKED[32] = {0x45,0x15,0xee,0xcd,0x45,0x2d,0x0d,0xc7,0x9a,0x05,0xcc,0x9c,0xa9,0x99,0x72,0x22,0x0e,0xfb,0x14,0x46,0xdf,0x91,0x17,0x0c,0x0c,0xc7,0xe4,0x11,0xd3,0xcd,0x1c,0x2b};
static const uint8_t NV2_SCALE[4] = {0x78,0x7c,0x76,0x79};
/* model.layers.0.self_attn.q_proj row 5 (tensor [128, 128]) */
static const uint16_t MX_X[128] = {0x3bb4,0x3e0e,0x3d20,0x3ced,0xbdd0,0x3ce7,0x3d9e,0x39d4,0x3de2,0x3df6,0xbe09,0x3dda,0xbb20,0x3dd5,0xbd00,0xbb85,0x3c8a,0xbcb8,0xbda8,0x3e0e,0xbc4a,0xbd76,0xbd41,0x3ca1,0xbafc,0xbe12,0x3dfa,0xbd7f,0x3dcb,0xbe0c,0x3d59,0x3ab6,0x3d5e,0x3d16,0xbc91,0x3ce2,0xbc84,0xbd50,0xbd62,0x3d03,0xba51,0x3c66,0x3dd3,0x3dea,0x3d87,0xbcb0,0xbd22,0x3da5,0xbcb1,0x3da3,0xbc82,0xbcee,0xbd47,0xbe2a,0xbbe1,0x3d91,0xbd5c,0x3d33,0xbdf2,0xbd2c,0xbd93,0xbd97,0x3d43,0xbcdb,0x3ade,0x3dd1,0xbd3f,0xbe01,0xbc21,0xbdb0,0x3d55,0x3e00,0xbd4d,0xbd60,0x3d03,0xbbdc,0x3e1e,0x3c3b,0x3d93,0x3d77,0x3add,0xbdab,0x3cfc,0xbdf3,0xbd4d,0x3e28,0xbe2b,0x3df7,0x3d6d,0x3d71,0x3c86,0x3d3d,0xbe21,0x3e22,0x3d17,0xbd24,0xbe1d,0x3d05,0x3d71,0xbddb,0x3dbc,0x3c2e,0x3df9,0x3d81,0x3d16,0x3c91,0xbe38,0x3d4e,0xbdf1,0x3c06,0x3d47,0xbd45,0x3dc5,0x3cf3,0xbe84,0xbd8e,0x3cc6,0x3e6d,0xbc15,0xbd10,0xbbd2,0x3ca1,0x39a5,0x3d94,0x3e1a,0xbbba,0xbda6,0x3d94};
static const uint8_t MX_CODES[128] = {0x53,0x79,0x6a,0x67,0xf5,0x66,0x72,0x35,0x76,0x77,0xf9,0x76,0xca,0x75,0xe8,0xd0,0x61,0xe4,0xf2,0x79,0xdd,0xef,0xec,0x62,0xc8,0xf9,0x78,0xf0,0x75,0xf9,0x6e,0x43,0x6e,0x69,0xe1,0x66,0xe0,0xed,0xee,0x68,0xbd,0x5e,0x75,0x77,0x70,0xe3,0xea,0x72,0xe3,0x72,0xe0,0xe7,0xec,0xfb,0xd6,0x71,0xee,0x6b,0xf7,0xeb,0xf1,0xf1,0x6c,0xe6,0x46,0x75,0xec,0xf8,0xda,0xf3,0x6d,0x78,0xed,0xee,0x68,0xd6,0x7a,0x5c,0x71,0x6f,0x46,0xf3,0x68,0xf7,0xed,0x7a,0xfb,0x77,0x6f,0x6f,0x60,0x6c,0xfa,0x7a,0x69,0xea,0xf2,0x60,0x67,0xee,0x6c,0x53,0x70,0x68,0x61,0x59,0xf4,0x65,0xef,0x50,0x64,0xe4,0x6c,0x5f,0xf8,0xe9,0x5c,0x77,0xd1,0xe1,0xcd,0x5a,0x2a,0x69,0x72,0xcc,0xea,0x69};
static const uint8_t MX_SCALE[4] = {0x74,0x74,0x74,0x75};

static void golden_nvfp4(const char *what, const uint16_t *xb, int K, uint32_t amax_bits, uint32_t gs_bits,
                         const uint8_t *want_p, const uint8_t *want_s) {
    float x[128];
    uint8_t p[64], s[8];
    m3_err err;
    for (int k = 0; k < K; k++) x[k] = m3_bf16_to_f32(xb[k]);
    double gs = m3_quant_nvfp4_gs(bits_f(amax_bits));
    CHECK(m3_f32_bits((float)gs) == gs_bits, "%s: global scale %a, oracle %a", what, gs, (double)bits_f(gs_bits));
    CHECK(m3_quant_nvfp4_rows(x, 1, K, gs, p, s, &err) == 0, "%s: %s", what, err.msg);
    CHECK(memcmp(s, want_s, (size_t)K / 16) == 0, "%s: block scales differ from the oracle's", what);
    for (int i = 0; i < K / 2; i++)
        CHECK(p[i] == want_p[i], "%s: packed byte %d = 0x%02x, oracle 0x%02x (x = %g, %g)", what, i, p[i], want_p[i],
              (double)x[2 * i], (double)x[2 * i + 1]);
}

static void test_golden(void) {
    golden_nvfp4("m3-tiny layers.3.experts.0.w1 row 40 (ties)", NV1_X, 128, NV1_AMAX, NV1_GS, NV1_PACKED, NV1_SCALE);
    golden_nvfp4("m3-tiny layers.2.experts.3.w2 row 48 (global-scale rounding)", NV2_X, 64, NV2_AMAX, NV2_GS, NV2_PACKED, NV2_SCALE);
    float x[128];
    uint8_t q[128], s[4];
    m3_err err;
    for (int k = 0; k < 128; k++) x[k] = m3_bf16_to_f32(MX_X[k]);
    CHECK(m3_quant_mxfp8(x, 1, 128, q, s, &err) == 0, "mxfp8: %s", err.msg);
    CHECK(memcmp(q, MX_CODES, 128) == 0 && memcmp(s, MX_SCALE, 4) == 0, "m3-tiny layers.0.q_proj row 5: MXFP8 differs from the oracle");
}

/* ------------------------------------------------------------------ activations (--moe-act-quant) */

/* m3_cpu_act_quant_nvfp4: per token gs = 2688 / amax, the KV cache's NVFP4 rule on x * gs (ties
 * to the even code, unlike the weights'), divided by gs again */
static void test_act_hand(void) {
    /* amax 6: gs = 448, y = 448 x, the block scale e4m3(2688 / 6) = 448, so y / s = x and the output
     * is x's nearest E2M1 value, ties to the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 2.5 -> 2,
     * 5 -> 4; 1.75 -> 2, 3.5 -> 4) */
    float x[32] = {6, -0.25f, 0.75f, 1.25f, 2.5f, 5, 1.75f, 3.5f, -0.3f, 0.1f, -6, 4.2f, -1.6f, 2.9f, 0, -0.74f};
    const float want[16] = {6, 0, 1, 1, 2, 4, 2, 4, -0.5f, 0, -6, 4, -1.5f, 3, 0, -0.5f}; /* zeros come out +0 */
    /* a second block of amax 0.75: y amax 336, s = e4m3(56) = 56, y / s = x * 8 */
    for (int i = 0; i < 16; i++) x[16 + i] = (float)(i % 7) * 0.125f * (i & 1 ? -1 : 1); /* 0 .. 0.75 */
    float out[32];
    m3_cpu_act_quant_nvfp4(x, 1, 32, out);
    for (int i = 0; i < 16; i++)
        CHECK(memcmp(&out[i], &want[i], 4) == 0, "act amax 6: x %g -> %g, want %g", (double)x[i], (double)out[i], (double)want[i]);
    for (int i = 16; i < 32; i++) { /* x * 8 in {0, 1, ..., 6}: E2M1 has 0..4 and 6, 5 ties to 4 */
        float y8 = fabsf(x[i]) * 8, q = y8 == 5 ? 4 : y8;
        float w = (q * 56.0f / 448.0f) * (x[i] < 0 ? -1 : 1);
        CHECK(out[i] == w, "act block 2: x %g -> %g, want %g", (double)x[i], (double)out[i], (double)w);
    }
    /* amax 1: gs = 2688; 0.1 x 2688 = 268.8, / 448 = 0.6 -> 0.5, out = 0.5 x 448 / 2688 in f32 */
    float a[16] = {1, 0.1f}, ao[16];
    m3_cpu_act_quant_nvfp4(a, 1, 16, ao);
    CHECK(ao[0] == 1.0f && ao[1] == 0.5f * 448.0f / 2688.0f && ao[2] == 0, "act amax 1: %g %g %g", (double)ao[0], (double)ao[1], (double)ao[2]);
    /* rows of zeros, with a NaN or an infinity, or of an amax so small that gs = 2688 / amax overflows
     * (1e-36, normal floats; zeros among them), come back as they are, bit for bit; a row between
     * them is quantized as on its own */
    float z[96] = {0}, zo[96], one[16];
    for (int i = 0; i < 16; i++) z[16 + i] = z[32 + i] = z[80 + i] = (float)i;
    z[20] = NAN;
    z[40] = INFINITY;
    for (int i = 0; i < 16; i++) z[48 + i] = (i % 3 ? 1e-36f : 0) * (i & 1 ? -1 : 1);
    z[64] = 1e-36f * 0.75f; /* a row of amax 7.5e-37: still overflows */
    m3_cpu_act_quant_nvfp4(z, 6, 16, zo);
    m3_cpu_act_quant_nvfp4(z + 80, 1, 16, one);
    int same = 1;
    for (int i = 0; i < 80; i++) same &= memcmp(&z[i], &zo[i], 4) == 0;
    CHECK(same, "act: zero / NaN / infinite / tiny rows changed");
    CHECK(memcmp(zo + 80, one, sizeof one) == 0 && zo[80 + 15] == 15 && zo[80 + 5] == 5, "act: a row beside kept ones differs from it alone");
    /* in place */
    float ip[16] = {6, 0.75f};
    m3_cpu_act_quant_nvfp4(ip, 1, 16, ip);
    CHECK(ip[0] == 6 && ip[1] == 1, "act in place: %g %g", (double)ip[0], (double)ip[1]);
}

static void test_act_random(void) {
    enum { T = 64, H = 256 };
    static float x[T * H], o[T * H];
    uint64_t r = 0x243f6a8885a308d3ull;
    for (int i = 0; i < T * H; i++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        double u = ((double)(r >> 11) + 0.5) * 0x1p-53;
        x[i] = (float)((u * 2 - 1) * ldexp(1.0, (int)((r >> 3) % 10) - 5 + (i / H) % 7));
    }
    m3_cpu_act_quant_nvfp4(x, T, H, o);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        const float *xr = x + t * H, *orow = o + t * H;
        float amax = 0;
        int at = 0;
        for (int i = 0; i < H; i++)
            if (fabsf(xr[i]) > amax) { amax = fabsf(xr[i]); at = i; }
        const float gs = 2688.0f / amax;
        /* the row's largest value comes back within an f32 rounding or two */
        if (fabsf(orow[at] - xr[at]) > 2.5e-7f * amax && bad++ < 5) printf("  act row %d amax %g -> %g\n", t, (double)xr[at], (double)orow[at]);
        for (int b = 0; b < H / 16; b++) {
            float m = 0;
            for (int i = 0; i < 16; i++) m = fmaxf(m, fabsf(xr[16 * b + i] * gs));
            const float s = m3_e4m3_to_f32(m3_f32_to_e4m3(m / 6.0f));
            for (int i = 0; i < 16; i++) {
                const int k = 16 * b + i;
                const double y = (double)(xr[k] * gs) / s, got = (double)orow[k] * gs / s; /* the E2M1 value taken */
                int ok = s == 0 ? orow[k] == 0 : 1;
                if (s != 0) { /* got is a nearest E2M1 value of y (within the f32 roundings of / gs, x gs) */
                    double best = 1e30;
                    for (int c = 0; c < 8; c++) best = fmin(best, fabs(fmin(fabs(y), 6.0) - E2M1V[c]));
                    double g = fabs(got), near = 1e30;
                    for (int c = 0; c < 8; c++) near = fmin(near, fabs(g - E2M1V[c]));
                    ok = near < 1e-5 && fabs(fabs(fmin(fabs(y), 6.0) - g) - best) < 1e-5 && (got == 0 || (got < 0) == (y < 0));
                }
                if (!ok && bad++ < 5) printf("  act x %a y %.9g -> %a\n", (double)xr[k], y, (double)orow[k]);
            }
        }
    }
    CHECK(bad == 0, "act quant: %d values off the rule", bad);
}

/* the branchless E2M1 choice against the rule as first written: the KV cache's NVFP4 rounding
 * (m3_kv_round_nvfp4: m3_f32_to_e2m1 per value) of x * gs, decoded, divided by gs; bit for bit over
 * random rows and rows whose values sit on every E2M1 midpoint (amax 6: y / s = x) */
static void test_act_vs_kv_rule(void) {
    enum { T = 48, H = 512 };
    static float x[T * H], o[T * H];
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    uint64_t r = 0x13198a2e03707344ull;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++) {
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;
            const double u = ((double)(r >> 11) + 0.5) * 0x1p-53;
            float v = (float)((u * 2 - 1) * ldexp(1.0, (int)(r % 16) - 8));
            if (t % 3 == 0) v = i % 16 == 0 ? 6.0f : mid[r % 7] * (r & 64 ? -1.f : 1.f); /* midpoints */
            if (t % 3 == 1 && i % 5 == 0) v = 0;
            x[t * H + i] = v;
        }
    m3_cpu_act_quant_nvfp4(x, T, H, o);
    long bad = 0;
    for (int t = 0; t < T; t++) {
        const float *xr = x + t * H;
        float amax = 0;
        for (int i = 0; i < H; i++) amax = fmaxf(amax, fabsf(xr[i]));
        const float gs = 2688.0f / amax;
        for (int b = 0; b < H / 16; b++) {
            float y[16];
            uint8_t codes[8], sc;
            for (int i = 0; i < 16; i++) y[i] = xr[16 * b + i] * gs;
            m3_kv_round_nvfp4(y, 16, codes, &sc);
            for (int i = 0; i < 16; i++) {
                const uint8_t c = (uint8_t)(codes[i / 2] >> (4 * (i & 1)) & 15);
                const float want = m3_e2m1_values[c] * m3_e4m3_to_f32(sc) / gs, got = o[t * H + 16 * b + i];
                if (memcmp(&want, &got, 4) && bad++ < 5) printf("  act vs kv rule: x %a -> %a, want %a\n", (double)xr[16 * b + i], (double)got, (double)want);
            }
        }
    }
    CHECK(bad == 0, "act quant differs from the KV rule's rounding at %ld values", bad);
}

int main(void) {
    test_act_vs_kv_rule();
    test_act_hand();
    test_act_random();
    test_mxfp8_hand();
    test_mxfp8_scales();
    test_e4m3_sweep();
    test_mxfp8_random();
    test_e2m1();
    test_nvfp4_hand();
    test_nvfp4_random();
    test_errors();
    test_golden();
    if (failures) {
        printf("test_quantize: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("test_quantize: all %d checks passed\n", checks);
    return 0;
}
