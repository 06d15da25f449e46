#include "quantize.h"

#include <math.h>
#include <string.h>

#include "../base/num.h"

/* f32 -> E4M3, round to nearest even, saturating at 448: the same codes as m3_f32_to_e4m3
 * (tests/test_quantize.c compares them over a sweep of bit patterns), in integer steps. */
static inline uint8_t e4m3_fast(float f) {
    uint32_t u = m3_f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7f;                   /* NaN */
    if (u >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* >= 448 (and inf) saturate */
    if (u < 0x3c800000u) {                              /* below 2^-6: multiples of 2^-9 */
        float r = m3_f32_from_bits(u) * 512.0f;          /* exact, < 8 */
        float m = (r + 0x1p23f) - 0x1p23f;               /* round to nearest even integer */
        return (uint8_t)(sign | (uint8_t)m);             /* m == 8 is code 0x08 = 2^-6: right */
    }
    u += 0x7ffffu + ((u >> 20) & 1u);                   /* round off 20 mantissa bits, RNE */
    return (uint8_t)(sign | ((((u >> 23) - 120u) << 3) | ((u >> 20) & 7u)));
}

int m3_quant_mxfp8(const float *x, int64_t N, int64_t K, uint8_t *codes, uint8_t *scales, m3_err *err) {
    if (N < 0 || K <= 0 || K % 32)
        return m3_errf(err, "MXFP8: bad shape [%lld, %lld]: K must be a positive multiple of 32", (long long)N,
                       (long long)K);
    const int64_t nb = K / 32;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + n * K + b * 32;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) {
                float a = fabsf(v[i]);
                if (!isfinite(a))
                    return m3_errf(err, "MXFP8: value %g at [%lld, %lld] is not finite", (double)v[i], (long long)n,
                                   (long long)(b * 32 + i));
                if (a > amax) amax = a;
            }
            double am = amax < 0x1p-120 ? 0x1p-120 : (double)amax;
            int ex;
            frexp(am, &ex);       /* am = m * 2^ex, m in [0.5, 1): floor(log2(am)) = ex - 1 */
            int e = ex - 1 - 8;
            if (e < -127) e = -127; /* the oracle would write byte 255 (E8M0 NaN) here */
            uint8_t *q = codes + n * K + b * 32;
            /* x / 2^e is exact in f32 (2^-e is a normal f32 for e in [-127, 119]; a result
             * below the f32 normal range is far below E4M3's smallest step and rounds to 0
             * either way) */
            const float inv = m3_f32_from_bits((uint32_t)(127 - e) << 23);
            for (int i = 0; i < 32; i++) q[i] = e4m3_fast(v[i] * inv);
            scales[n * nb + b] = (uint8_t)(e + 127);
        }
    }
    return 0;
}

double m3_quant_nvfp4_gs(float amax) {
    if (!isfinite(amax)) return -1.0;
    double am = (double)amax < 1e-12 ? 1e-12 : (double)amax;
    /* the oracle's `448.0 * 6.0 / tensor` runs as reciprocal(tensor) * 2688 in torch: two
     * roundings, and the codes depend on them (exact ties in y), so do the same */
    return (1.0 / am) * 2688.0;
}

double m3_quant_nvfp4_global(const float *x, size_t n) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (!isfinite(a)) return -1.0;
        if (a > amax) amax = a;
    }
    return m3_quant_nvfp4_gs(amax);
}

/* The oracle takes argmin |mag - value| in double, first index on a tie. Between the two
 * values next to mag both differences are exact (Sterbenz: each pair lies within a factor of
 * two of mag), so that is exactly "mag <= midpoint -> the lower one". The midpoints 0.25,
 * 0.75, 1.25, 1.75, 2.5, 3.5, 5 all have at most 2 mantissa bits, so the exponent and top two
 * mantissa bits of (bits(mag) - 1) name a bucket (lo, hi] that lies between two midpoints;
 * subtracting one ulp sends a value sitting on a midpoint to the bucket below it. One table
 * lookup, no branches (the inputs are random). NaN lands in the top bucket: code 7. */
static const uint8_t E2M1_BUCKET[19] = {0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7};

static inline uint8_t e2m1_code(double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    int64_t mag = (int64_t)(u & 0x7fffffffffffffffull);
    int64_t idx = ((mag - 1) >> 50) - (int64_t)(0x3fd0000000000000ull >> 50) + 1; /* 0.25: bucket 0 ends */
    idx = idx < 0 ? 0 : idx > 18 ? 18 : idx;
    uint8_t c = E2M1_BUCKET[idx];
    return (uint8_t)(c | ((c != 0) & (v < 0)) << 3);
}

uint8_t m3_quant_e2m1(double v) { return e2m1_code(v); }

int m3_quant_nvfp4_rows(const float *x, int64_t N, int64_t K, double gs, uint8_t *packed, uint8_t *scales,
                        m3_err *err) {
    if (N < 0 || K <= 0 || K % 16)
        return m3_errf(err, "NVFP4: bad shape [%lld, %lld]: K must be a positive multiple of 16", (long long)N,
                       (long long)K);
    if (!(gs > 0) || !isfinite(gs)) return m3_errf(err, "NVFP4: global scale %g must be positive and finite", gs);
    const int64_t nb = K / 16;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + n * K + b * 16;
            float amax = 0.0f;
            for (int i = 0; i < 16; i++) {
                float a = fabsf(v[i]);
                if (!isfinite(a))
                    return m3_errf(err, "NVFP4: value %g at [%lld, %lld] is not finite", (double)v[i], (long long)n,
                                   (long long)(b * 16 + i));
                if (a > amax) amax = a;
            }
            uint8_t s = e4m3_fast((float)((double)amax / 6.0 * gs));
            double sf = (double)m3_e4m3_to_f32(s);
            if (sf < 0x1p-9) sf = 0x1p-9;
            scales[n * nb + b] = s;
            uint8_t *p = packed + n * (K / 2) + b * 8;
            double y[16];
            for (int i = 0; i < 16; i++) y[i] = (double)v[i] * gs / sf; /* (x * gs) / s, as the oracle */
            for (int i = 0; i < 8; i++) p[i] = (uint8_t)(e2m1_code(y[2 * i]) | (e2m1_code(y[2 * i + 1]) << 4));
        }
    }
    return 0;
}

int m3_quant_nvfp4(const float *x, int64_t N, int64_t K, uint8_t *packed, uint8_t *scales, float *global_scale,
                   m3_err *err) {
    if (N < 0 || K <= 0 || K % 16)
        return m3_errf(err, "NVFP4: bad shape [%lld, %lld]: K must be a positive multiple of 16", (long long)N,
                       (long long)K);
    double gs = m3_quant_nvfp4_global(x, (size_t)(N * K));
    if (gs < 0) return m3_errf(err, "NVFP4: the tensor holds a value that is not finite");
    if (m3_quant_nvfp4_rows(x, N, K, gs, packed, scales, err)) return -1;
    *global_scale = (float)gs;
    return 0;
}

void m3_quant_mxfp8_dequant(const uint8_t *codes, const uint8_t *scales, int64_t N, int64_t K, float *out) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            out[n * K + k] = m3_e4m3_to_f32(codes[n * K + k]) * m3_e8m0_to_f32(scales[n * (K / 32) + k / 32]);
}

void m3_quant_nvfp4_dequant(const uint8_t *packed, const uint8_t *scales, float global_scale, int64_t N, int64_t K,
                            float *out) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            uint8_t byte = packed[n * (K / 2) + k / 2];
            uint8_t code = (k & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
            double s = (double)m3_e4m3_to_f32(scales[n * (K / 16) + k / 16]);
            out[n * K + k] = (float)((double)m3_e2m1_values[code] * s / (double)global_scale);
        }
}
