/* Weight quantizers: f32 [N, K] row-major matrices to the checkpoint formats the engine
 * reads (spec section 1), bit for bit like mxfp8() / nvfp4() in
 * ../shared/tools/make_m3_oracle.py, which wrote the reference checkpoints.
 *
 * MXFP8: per 32 consecutive values of a row, amax = max |x| (at least 2^-120),
 *   e = floor(log2(amax)) - 8, code = e4m3(x / 2^e) (round to nearest even, saturating at
 *   448), scale byte = e + 127 (E8M0). Dequant: e4m3(code) * 2^(scale - 127).
 *   One deliberate difference: a block with amax < 2^-119 (all zeros, in practice) gets
 *   e = -127 (scale byte 0) where the oracle's formula gives byte -1 -> 255, the E8M0 NaN
 *   encoding. The codes are the same (zero for a zero block); only the bogus scale differs.
 * NVFP4: gs = 448 * 6 / max(amax_tensor, 1e-12) (a divisor, stored as f32); per 16 values
 *   s = e4m3(amax_block / 6 * gs); code = nearest E2M1 of clamp(x * gs / max(s, 2^-9), -6, 6),
 *   exact ties to the even code; bit 3 = sign, and -0 is stored as code 0. Two codes per byte,
 *   element 2i in the low nibble. Dequant: e2m1(code) * e4m3(s) / gs.
 * The intermediate arithmetic is in double, as the oracle's was; e4m3 inputs go through f32
 * first (torch converts double -> f32 -> float8), so results match it exactly.
 *
 * Functions are pure and thread-safe; they do not allocate. Rows are independent, so a
 * caller may quantize a matrix a block of rows at a time (for NVFP4 with the global scale
 * of the whole tensor, see m3_quant_nvfp4_global). */
#ifndef M3_QUANTIZE_H
#define M3_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

/* x [N, K] -> codes F8_E4M3 [N, K], scales U8 (E8M0) [N, K/32]. K must be a multiple of
 * 32; N >= 0. Returns 0, or -1 with err on a bad shape or a non-finite input value. */
int m3_quant_mxfp8(const float *x, int64_t N, int64_t K, uint8_t *codes, uint8_t *scales, m3_err *err);

/* Global NVFP4 scale (divisor) for a tensor of n values: 448 * 6 / max(amax, 1e-12).
 * Returned in double: the codes are computed with this exact value, the checkpoint stores
 * (float) of it. Returns -1 (and no err) if a value is not finite. */
double m3_quant_nvfp4_global(const float *x, size_t n);

/* x [N, K] -> packed U8 [N, K/2], scales F8_E4M3 [N, K/16], with a given global scale gs
 * (from m3_quant_nvfp4_global over the whole tensor). K must be a multiple of 16. */
int m3_quant_nvfp4_rows(const float *x, int64_t N, int64_t K, double gs, uint8_t *packed, uint8_t *scales,
                        m3_err *err);

/* Whole-tensor NVFP4: computes the global scale over x and quantizes; *global_scale gets
 * the f32 divisor to store as weight_global_scale (ModelOpt's weight_scale_2 is 1/that). */
int m3_quant_nvfp4(const float *x, int64_t N, int64_t K, uint8_t *packed, uint8_t *scales, float *global_scale,
                   m3_err *err);

/* Nearest E2M1 code to v (|v| saturated at 6), exact ties to the even code, -0 -> 0; the
 * comparison runs in double (the f32 m3_f32_to_e2m1 would round v first). */
uint8_t m3_quant_e2m1(double v);

/* Dequantizers (reference, for tests and tools): out f32 [N, K]. The NVFP4 one divides
 * by the stored f32 global scale, as a checkpoint reader does. */
void m3_quant_mxfp8_dequant(const uint8_t *codes, const uint8_t *scales, int64_t N, int64_t K, float *out);
void m3_quant_nvfp4_dequant(const uint8_t *packed, const uint8_t *scales, float global_scale, int64_t N, int64_t K,
                            float *out);

#endif
