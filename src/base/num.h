/* Scalar number codecs: bf16, f16, FP8 E4M3, E8M0 scales, FP4 E2M1.
 * These are the reference definitions; SIMD kernels must agree with them bit for bit. */
#ifndef M3_NUM_H
#define M3_NUM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float m3_f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t m3_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float m3_bf16_to_f32(uint16_t h) { return m3_f32_from_bits((uint32_t)h << 16); }

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t m3_f32_to_bf16(float f) {
    uint32_t u = m3_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* f rounded to bf16 (nearest even), as f32 */
static inline float m3_bf16_round(float f) { return m3_bf16_to_f32(m3_f32_to_bf16(f)); }

static inline float m3_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return s ? -v : v;
    }
    if (e == 31) return m3_f32_from_bits(s | 0x7f800000u | (m << 13));
    return m3_f32_from_bits(s | ((e + 112) << 23) | (m << 13));
}

/* FP8 E4M3 (OCP "fn" variant: no infinities, 0x7f/0xff are NaN, max 448): subnormals
 * m * 2^-9, normals (8 + m) * 2^(e - 10); a table of all 256 (src/base/num.c). */
extern const float m3_e4m3_values[256];
static inline float m3_e4m3_to_f32(uint8_t b) { return m3_e4m3_values[b]; }

/* f32 -> E4M3, round to nearest even, saturating to +-448 (NaN -> NaN). */
uint8_t m3_f32_to_e4m3(float f);

/* E8M0 (MX shared scale): 2^(b-127); 255 is NaN. */
static inline float m3_e8m0_to_f32(uint8_t b) {
    return b == 255 ? NAN : ldexpf(1.0f, (int)b - 127);
}

/* FP4 E2M1 code (bit 3 sign, bits 0-2 magnitude index) to value. */
extern const float m3_e2m1_values[16];

/* Nearest E2M1 code to x (|x| saturated at 6), exact ties to the even code. */
uint8_t m3_f32_to_e2m1(float x);

#endif
