/* y = x W^T for many tokens at once (AVX-512): each row's chunk decoded once, register tiles.
 *
 * linear.c's kernel decodes a row in registers for every pair of tokens; at prefill sizes
 * that decoding is most of its work. Here the chunk of KC columns of up to R rows is decoded
 * once into an L1 tile (values unscaled and in x's column order, plus a 16-lane scale vector
 * per 32-column step), and tiles of 2 rows x 3 tokens run over it for every token of the
 * block.
 *
 * The arithmetic of each (row, token) is row_dot512's exactly: the same steps (16 columns of
 * a plain format; 32 columns = one scale group pair, whose products are summed and then
 * scaled), step s of a chunk into accumulator chain s % 4 in order, the chains combined as
 * (A0 + A1) + (A2 + A3), reduced with the same intrinsic and added to the row's sum at each
 * chunk's end. The outputs are therefore bitwise the same as the one-token kernel's, and a
 * token's result still does not depend on the batch (tests/test_linear.c checks both; a NaN
 * made where two NaN sources meet, as inf * 0 beside a NaN, may take either one's sign, as
 * between the one- and two-token paths already). What differs is only the order in which the
 * independent chains advance: 0 and 1 first, then 2 and 3, so that three vectors per (row,
 * token) are live instead of four. */
#include <immintrin.h>
#include <string.h>

#include "formats.h"
#include "linear_int.h"

#define TT_MAX 3 /* tokens per register tile */
#define RR_MAX 2 /* rows per register tile */

typedef struct {
    float w[R][XS] __attribute__((aligned(64)));      /* the chunk's values, x's column order */
    float s[R][KC / 32][16] __attribute__((aligned(64))); /* quantized: each 32-column step's scales */
} tile512;

/* rows [n, n + nr), columns [k0, k0 + len) into t */
AVX512 static void decode_tile(const m3_linear *W, int n, int nr, int k0, int len, tile512 *t) {
    const __m512i lut_lo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)NVFP4_BF16_LO));
    const __m512i lut_hi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)NVFP4_BF16_HI));
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = W->w + (size_t)(n + r) * W->row_bytes;
        const uint8_t *sc = W->scale ? W->scale + (size_t)(n + r) * W->scale_row : NULL;
        float *w = t->w[r];
        if (k0 + KC < W->K) { /* the row's next chunk, into L2 by the time this panel gets to it */
            size_t a = (size_t)(k0 + KC) * W->row_bytes / (size_t)W->K, b = (size_t)(k0 + 2 * KC) * W->row_bytes / (size_t)W->K;
            for (size_t o = a & ~(size_t)63; o < b && o < W->row_bytes; o += 64) _mm_prefetch((const char *)row + o, _MM_HINT_T1);
        }
        switch (W->fmt) {
        case M3_WF_MXFP8:
            for (int c = 0; c < len; c += 32) {
                uint8_t e = sc[(k0 + c) / 32];
                __m512 v0, v1;
                e4m3x32_512(row + k0 + c, &v0, &v1);
                if (__builtin_expect(e > E8M0_X256_MAX, 0)) {
                    v0 = _mm512_mul_ps(v0, _mm512_set1_ps(256.0f));
                    v1 = _mm512_mul_ps(v1, _mm512_set1_ps(256.0f));
                }
                _mm512_store_ps(w + c, v0);
                _mm512_store_ps(w + c + 16, v1);
                _mm512_store_ps(t->s[r][c / 32], _mm512_set1_ps(m3_cpu_tab_e8m0_x256[e]));
            }
            break;
        case M3_WF_NVFP4: {
            /* the chunk's block scales times gmul: nvfp4_scales512's values */
            float Sc[KC / 16];
            for (int i = 0; i < len / 16; i += 16)
                if (len / 16 - i >= 16) nvfp4_scales16_512(sc + k0 / 16 + i, W->gmul, Sc + i);
                else { /* the last chunk's last scales: copied, so nothing past the row is read */
                    uint8_t b[16] = {0};
                    memcpy(b, sc + k0 / 16 + i, (size_t)(len / 16 - i));
                    nvfp4_scales16_512(b, W->gmul, Sc + i);
                }
            for (int c = 0; c < len; c += 64) {
                __m512 v[4], sa, sb;
                nvfp4x64_512(row + (k0 + c) / 2, lut_lo, lut_hi, v);
                nvfp4_scales64_512(Sc + c / 16, &sa, &sb);
                for (int q = 0; q < 4; q++) _mm512_store_ps(w + c + 16 * q, v[q]);
                _mm512_store_ps(t->s[r][c / 32], sa);
                _mm512_store_ps(t->s[r][c / 32 + 1], sb);
            }
            break;
        }
        default: /* F32, BF16, F16 */
            for (int c = 0; c < len; c += 16) _mm512_store_ps(w + c, ld16_plain(W->fmt, row, k0 + c));
            break;
        }
    }
}

/* One chunk of nst steps for rows r0.. (RR of them) of the tile and TT tokens at x (the
 * chunk's packed activations, XS apart): acc[r * TBT + t] += the chunk's sum. */
AVX512 static INLINE void tile_chunk(const tile512 *tl, int r0, const int RR, const float *x, const int TT,
                                     const int quant, int nst, float *acc) {
    __m512 p[RR_MAX][TT_MAX], a[2][RR_MAX][TT_MAX];
    for (int h = 0; h < 2; h++) { /* chains 2h and 2h + 1: steps 2h, 2h + 1, 2h + 4, 2h + 5, ... */
#pragma GCC unroll 2
        for (int q = 0; q < 2; q++)
#pragma GCC unroll 2
            for (int r = 0; r < RR; r++)
#pragma GCC unroll 3
                for (int t = 0; t < TT; t++) a[q][r][t] = _mm512_setzero_ps();
        for (int s0 = 2 * h; s0 < nst; s0 += 4)
#pragma GCC unroll 2
            for (int q = 0; q < 2; q++) {
                const int s = s0 + q;
                if (s >= nst) break;
                if (quant) { /* a scale group pair: products summed, then scaled (row_dot512's GROUP2) */
                    const int c = 32 * s;
                    __m512 w0[RR_MAX], w1[RR_MAX], sv[RR_MAX];
#pragma GCC unroll 2
                    for (int r = 0; r < RR; r++) {
                        w0[r] = _mm512_load_ps(tl->w[r0 + r] + c);
                        w1[r] = _mm512_load_ps(tl->w[r0 + r] + c + 16);
                        sv[r] = _mm512_load_ps(tl->s[r0 + r][s]);
                    }
#pragma GCC unroll 3
                    for (int t = 0; t < TT; t++) {
                        const __m512 x0 = _mm512_loadu_ps(x + t * XS + c), x1 = _mm512_loadu_ps(x + t * XS + c + 16);
#pragma GCC unroll 2
                        for (int r = 0; r < RR; r++) {
                            __m512 u = _mm512_fmadd_ps(w1[r], x1, _mm512_mul_ps(w0[r], x0));
                            a[q][r][t] = _mm512_fmadd_ps(u, sv[r], a[q][r][t]);
                        }
                    }
                } else { /* 16 plain columns (row_dot512's PLAIN16) */
                    const int c = 16 * s;
                    __m512 w[RR_MAX];
#pragma GCC unroll 2
                    for (int r = 0; r < RR; r++) w[r] = _mm512_load_ps(tl->w[r0 + r] + c);
#pragma GCC unroll 3
                    for (int t = 0; t < TT; t++) {
                        const __m512 xv = _mm512_loadu_ps(x + t * XS + c);
#pragma GCC unroll 2
                        for (int r = 0; r < RR; r++) a[q][r][t] = _mm512_fmadd_ps(w[r], xv, a[q][r][t]);
                    }
                }
            }
#pragma GCC unroll 2
        for (int r = 0; r < RR; r++)
#pragma GCC unroll 3
            for (int t = 0; t < TT; t++) {
                __m512 s2 = _mm512_add_ps(a[0][r][t], a[1][r][t]); /* A0 + A1, then A2 + A3 */
                p[r][t] = h ? _mm512_add_ps(p[r][t], s2) : s2;
            }
    }
#pragma GCC unroll 2
    for (int r = 0; r < RR; r++)
#pragma GCC unroll 3
        for (int t = 0; t < TT; t++) acc[(r0 + r) * TBT + t] += _mm512_reduce_add_ps(p[r][t]);
}

/* one chunk for the tile's nr rows and nt tokens at x (token stride XS): tiles of 2 rows x 3
 * tokens, then the leftover rows and tokens, each shape inlined with its constants */
AVX512 static INLINE void chunk_tiles(const tile512 *tl, int nr, const float *x, int nt, const int quant, int nst,
                                      float *acc) {
    int t = 0;
    for (; t + TT_MAX <= nt; t += TT_MAX) {
        int r = 0;
        for (; r + RR_MAX <= nr; r += RR_MAX) tile_chunk(tl, r, RR_MAX, x + (size_t)t * XS, TT_MAX, quant, nst, acc + t);
        if (r < nr) tile_chunk(tl, r, 1, x + (size_t)t * XS, TT_MAX, quant, nst, acc + t);
    }
    if (nt - t == 2)
        for (int r = 0; r < nr; r++) tile_chunk(tl, r, 1, x + (size_t)t * XS, 2, quant, nst, acc + t);
    else if (nt - t == 1)
        for (int r = 0; r < nr; r++) tile_chunk(tl, r, 1, x + (size_t)t * XS, 1, quant, nst, acc + t);
}

AVX512 __attribute__((noinline)) static void chunk_plain(const tile512 *tl, int nr, const float *x, int nt, int nst, float *acc) {
    chunk_tiles(tl, nr, x, nt, 0, nst, acc);
}
AVX512 __attribute__((noinline)) static void chunk_quant(const tile512 *tl, int nr, const float *x, int nt, int nst, float *acc) {
    chunk_tiles(tl, nr, x, nt, 1, nst, acc);
}

AVX512 void m3_cpu_rows_tiled512(const m3_linear *W, int n0, int n1, const float *xp, int T, int t0, int t1, float *y) {
    const int K = W->K, N = W->N, quant = W->fmt == M3_WF_MXFP8 || W->fmt == M3_WF_NVFP4;
    tile512 tl;
    float acc[PR * TBT]; /* the panel's sums, row by row, TBT apart */
    if (n1 - n0 <= 0 || n1 - n0 > PR || t1 - t0 > TBT) return; /* the caller's contract */
    memset(acc, 0, sizeof acc);
    /* chunk by chunk, so that the block's activations of one chunk stay in L2 for all the rows */
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int len = K - k0 < KC ? K - k0 : KC, nst = quant ? len / 32 : len / 16;
        const float *xc = xp + ((size_t)(k0 / KC) * T + t0) * XS;
        for (int n = n0; n < n1; n += R) {
            const int nr = n1 - n < R ? n1 - n : R;
            float *a = acc + (size_t)(n - n0) * TBT;
            decode_tile(W, n, nr, k0, len, &tl);
            if (quant) chunk_quant(&tl, nr, xc, t1 - t0, nst, a);
            else chunk_plain(&tl, nr, xc, t1 - t0, nst, a);
        }
    }
    for (int r = 0; r < n1 - n0; r++)
        for (int t = t0; t < t1; t++) y[(size_t)t * N + n0 + r] = acc[r * TBT + (t - t0)];
}
