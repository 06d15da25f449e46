#include "quantize.h"

#include <math.h>

#include "../base/num.h"

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
            for (int i = 0; i < 32; i++) q[i] = m3_f32_to_e4m3((float)ldexp((double)v[i], -e));
            scales[n * nb + b] = (uint8_t)(e + 127);
        }
    }
    return 0;
}

double m3_quant_nvfp4_global(const float *x, size_t n) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (!isfinite(a)) return -1.0;
        if (a > amax) amax = a;
    }
    double am = (double)amax < 1e-12 ? 1e-12 : (double)amax;
    return 448.0 * 6.0 / am;
}

static const double E2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

uint8_t m3_quant_e2m1(double v) {
    double y = v;
    if (!(y >= -6.0)) y = isnan(y) ? 6.0 : -6.0;
    if (y > 6.0) y = 6.0;
    double mag = fabs(y);
    int best = 0;
    double bd = mag; /* |mag - 0| */
    for (int i = 1; i < 8; i++) {
        double d = fabs(mag - E2M1[i]);
        /* strictly closer wins; an exact tie goes to the even code */
        if (d < bd || (d == bd && (i & 1) == 0)) { bd = d; best = i; }
    }
    return (uint8_t)(best && y < 0 ? best | 8 : best);
}

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
            uint8_t s = m3_f32_to_e4m3((float)((double)amax / 6.0 * gs));
            double sf = (double)m3_e4m3_to_f32(s);
            if (sf < 0x1p-9) sf = 0x1p-9;
            scales[n * nb + b] = s;
            uint8_t *p = packed + n * (K / 2) + b * 8;
            for (int i = 0; i < 16; i += 2) {
                uint8_t lo = m3_quant_e2m1((double)v[i] * gs / sf);
                uint8_t hi = m3_quant_e2m1((double)v[i + 1] * gs / sf);
                p[i / 2] = (uint8_t)(lo | (hi << 4));
            }
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
