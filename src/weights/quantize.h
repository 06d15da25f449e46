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
 * NVFP4: gs = 2688 * (1 / max(amax_tensor, 1e-12)) (a divisor, stored as f32; computed
 *   with the two roundings torch's `448.0 * 6.0 / tensor` does); per 16 values
 *   s = e4m3(amax_block / 6 * gs); code = nearest E2M1 of clamp(x * gs / max(s, 2^-9), -6, 6),
 *   where an exact tie keeps the LOWER magnitude (torch argmin's first index: 0.25 -> 0,
 *   0.75 -> 0.5, 1.25 -> 1, 1.75 -> 1.5, 2.5 -> 2, 3.5 -> 3, 5 -> 4). That is what the oracle
 *   really does (the script's comment says "even", which holds for only four of the seven
 *   midpoints); it reproduces ../shared/testdata/m3-tiny-q byte for byte from m3-tiny, and
 *   ties are common there (about 1 value in 700: bf16 inputs over power-of-two-ish scales).
 *   Bit 3 = sign, -0 is stored as code 0. Two codes per byte, element 2i in the low nibble.
 *   Dequant: e2m1(code) * e4m3(s) / gs.
 *   (The KV-cache NVFP4 rule of spec section 3 is a different one: ties to the even code,
 *   m3_f32_to_e2m1.)
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

/* Global NVFP4 scale (divisor) for a tensor whose max |x| is amax: 2688 * (1 / max(amax,
 * 1e-12)), in double (see m3_quant_nvfp4_global); -1 if amax is not finite. */
double m3_quant_nvfp4_gs(float amax);

/* Global NVFP4 scale (divisor) for a tensor of n values: 2688 * (1 / max(amax, 1e-12)).
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

/* Nearest E2M1 code to v (|v| saturated at 6; NaN -> code 7), an exact tie to the lower magnitude,
 * -0 -> 0; the comparison runs in double, like the oracle's. */
uint8_t m3_quant_e2m1(double v);

/* Dequantizers (reference, for tests and tools): out f32 [N, K]. The NVFP4 one divides
 * by the stored f32 global scale, as a checkpoint reader does. */
void m3_quant_mxfp8_dequant(const uint8_t *codes, const uint8_t *scales, int64_t N, int64_t K, float *out);
void m3_quant_nvfp4_dequant(const uint8_t *packed, const uint8_t *scales, float global_scale, int64_t N, int64_t K,
                            float *out);

#endif
