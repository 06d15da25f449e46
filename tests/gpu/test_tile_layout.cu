/* The tiled device layout of MXFP8 / NVFP4 weights (backend/cuda/common.cuh), checked on the
 * host (no GPU needed): wt_voff / wt_soff put every byte of a matrix at its own place inside
 * it; unit u of row g of a 16-row tile sits where the tensor-core GEMV reads it (tile base +
 * u * 16 * UB + g * UB), so a cp.async stage of SU units is one contiguous run; the scales
 * follow the same order. NVFP4 codes are also bit-permuted in each word, and the GEMV's
 * shift-and-mask conversion of the permuted words gives every code's value; the MXFP8 scales'
 * shift-and-mask decode (e8_of) gives every code 1..254. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/common.cuh"
#include "base/num.h"

static int fails;
#define CHECK(c, ...) do { if (!(c)) { if (fails++ < 10) { printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } } while (0)

/* one part (values, or scales) of an N-row matrix of `width` bytes per row stored in pieces of
 * `piece` bytes per unit: every byte lands once inside it, unit u of row g of tile t at
 * t * 16 * width + u * 16 * piece + g * piece; MXFP8 scales (piece 1) go by 4 units (a GEMV
 * stage): scale u of row g at t * 16 * width + (u / 4) * 64 + g * 4 + u % 4, so a stage's
 * scales are one 64-byte run and a row's 4 of them one word */
static void check_part(int fmt, int N, size_t width, int piece, int scales) {
    unsigned char *seen = (unsigned char *)calloc((size_t)N * width, 1);
    for (int n = 0; n < N; n++)
        for (size_t b = 0; b < width; b++) {
            const size_t o = scales ? wt_soff(fmt, width, n, b) : wt_voff(fmt, width, n, b);
            CHECK(o < (size_t)N * width && !seen[o], "fmt %d, %d rows of %zu %s bytes: byte (%d, %zu) -> %zu (taken or out of range)",
                  fmt, N, width, scales ? "scale" : "value", n, b, o);
            if (o < (size_t)N * width) seen[o] = 1;
            const size_t t = (size_t)n / 16, g = (size_t)n % 16, u = b / piece, j = b % piece;
            const size_t want = scales && fmt == M3_WF_MXFP8 ? t * 16 * width + (u / 4) * 64 + g * 4 + u % 4
                                                             : t * 16 * width + u * 16 * piece + g * piece + j;
            CHECK(o == want, "fmt %d: %s byte (%d, %zu) at %zu, not %zu", fmt, scales ? "scale" : "value", n, b, o, want);
        }
    free(seen);
}

static void check_shape(int fmt, int N, int K) {
    const size_t rb = fmt == M3_WF_NVFP4 ? (size_t)K / 2 : (size_t)K, sr = fmt == M3_WF_NVFP4 ? (size_t)K / 16 : (size_t)K / 32;
    const int ub = wt_ub(fmt);
    check_part(fmt, N, rb, ub, 0);
    check_part(fmt, N, sr, wt_sb(fmt), 1);
    /* a cp.async stage (linear_mma.cu: 2 KB of values = 2 NVFP4 or 4 MXFP8 units of the 16 rows)
     * is contiguous and 16-byte aligned */
    const int su = fmt == M3_WF_NVFP4 ? 2 : 4;
    for (int t = 0; t < N / 16; t++)
        for (int u = 0; u + su <= (int)(rb / ub); u += su) {
            const size_t first = wt_voff(fmt, rb, 16 * t, (size_t)u * ub);
            CHECK(first % 16 == 0 && wt_voff(fmt, rb, 16 * t + 15, (size_t)(u + su) * ub - 1) == first + 2047,
                  "fmt %d %dx%d: stage (%d, %d) is not one 2 KB run", fmt, N, K, t, u);
        }
}

/* E2M1 code -> value; f16 bits -> value (normal and subnormal) */
static double e2m1_value(uint32_t c) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8 ? -1 : 1) * mag[c & 7];
}
static double f16_value(uint32_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
    return h & 0x8000 ? -v : v;
}

/* NVFP4 codes bit-permuted in each word of the tiled layout: wt_nv_code undoes wt_nv_perm, and
 * nv_pair turns codes 2p, 2p + 1 into the f16 pair of their values x 2^-14 (the GEMV's
 * conversion), for every code in every position */
static void check_nv_perm(void) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int it = 0; it < 200000; it++) {
        uint32_t plain;
        if (it < 16 * 8) { /* code it / 8 at position it % 8, the others 0 */
            plain = (uint32_t)(it / 8) << (4 * (it % 8));
        } else {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            plain = (uint32_t)x;
        }
        const uint32_t w = wt_nv_perm(plain);
        uint32_t pairs[4] = {nv_pair<0>(w), nv_pair<1>(w), nv_pair<2>(w), nv_pair<3>(w)};
        for (int j = 0; j < 8; j++) {
            const uint32_t c = (plain >> (4 * j)) & 15u;
            CHECK(wt_nv_code(w, j) == c, "word %08x: code %d read back as %u, not %u", plain, j, wt_nv_code(w, j), c);
            const uint32_t h = (pairs[j >> 1] >> (16 * (j & 1))) & 0xffffu;
            CHECK(f16_value(h) == ldexp(e2m1_value(c), -14) && (h & 0x8000u) == ((c & 8u) << 12),
                  "word %08x: code %d (%u) -> f16 %04x = %g, not %g x 2^-14", plain, j, c, h, f16_value(h), e2m1_value(c));
        }
    }
}

/* e8_of (the tiled MXFP8 GEMV's scale decode, a shift and a mask a byte) against the full
 * E8M0 decode for every code it is used with (1..254) in every byte of the word */
static void check_e8_of(void) {
    for (int e = 1; e <= 254; e++)
        for (int pos = 0; pos < 4; pos++) {
            const uint32_t w = ((uint32_t)e << (8 * pos)) | (0x7f7f7f7fu & ~(0xffu << (8 * pos))); /* others: 127 */
            const float f[4] = {e8_of<0>(w), e8_of<1>(w), e8_of<2>(w), e8_of<3>(w)};
            for (int j = 0; j < 4; j++) {
                const float want = m3_e8m0_to_f32((uint8_t)(w >> (8 * j)));
                CHECK(f[j] == want, "e8_of(%08x) byte %d: %g, not %g", w, j, f[j], want);
            }
        }
}

int main(void) {
    check_nv_perm();
    check_e8_of();
    const int shapes[][2] = {{16, 128}, {48, 256}, {512, 6144}, {3072, 6144}, {6144, 3072}, {128, 1024}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        check_shape(M3_WF_MXFP8, shapes[i][0], shapes[i][1]);
        check_shape(M3_WF_NVFP4, shapes[i][0], shapes[i][1]);
    }
    printf(fails ? "%d tiled-layout checks failed\n" : "tiled layout checks passed\n", fails);
    return fails ? 1 : 0;
}
