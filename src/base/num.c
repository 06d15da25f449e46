#include "num.h"

const float m3_e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

uint8_t m3_f32_to_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    double a = fabs((double)f);
    if (a >= 448.0) return sign | 0x7e;
    /* Candidates are k * 2^(e-3) for the binade of a; subnormal spacing is 2^-9. */
    int ex;
    frexp(a, &ex); /* a = m * 2^ex, m in [0.5,1) -> a in [2^(ex-1), 2^ex) */
    int e = ex - 1; /* a in [2^e, 2^(e+1)) */
    if (e < -6) e = -6;
    double step = ldexp(1.0, e - 3);
    double q = a / step; /* exact: power-of-two divide */
    double r = nearbyint(q); /* default rounding mode: nearest even */
    double v = r * step;
    if (v >= 448.0) return sign | 0x7e;
    if (v == 0.0) return sign;
    /* encode v */
    int vex;
    frexp(v, &vex);
    int ve = vex - 1;
    if (ve < -6) { /* subnormal */
        int m = (int)(v / ldexp(1.0, -9));
        return sign | (uint8_t)m;
    }
    int m = (int)(v / ldexp(1.0, ve - 3)) - 8;
    return sign | (uint8_t)(((ve + 7) << 3) | m);
}

uint8_t m3_f32_to_e2m1(float x) {
    uint8_t sign = signbit(x) ? 8 : 0;
    float a = fabsf(x);
    if (!(a <= 6.0f)) a = 6.0f; /* saturate (NaN too) */
    int best = 0;
    float bd = a;
    for (int i = 1; i < 8; i++) {
        float d = fabsf(a - m3_e2m1_values[i]);
        /* strictly closer wins; on an exact tie prefer the even code */
        if (d < bd || (d == bd && (i & 1) == 0)) { bd = d; best = i; }
    }
    return best ? (uint8_t)(sign | best) : 0;
}
