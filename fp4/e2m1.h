// fp4/e2m1.h: the element and scale codecs of FP4 formats, as exact FP4_HD scalar rules.
//
// API (all static inline, callable from C and CUDA device code):
//   uint8_t e2m1_encode_rne(float x)             nearest-even E2M1 code of x, saturating to +-6
//   uint8_t e2m1_encode_sr(float x, uint32_t r8) stochastic rounding with 8 random bits r8 in [0,255]
//   float   e2m1_decode(uint8_t code)            value of a 4-bit code (high bits ignored)
//   uint32_t e2m1_rne_mag(uint32_t a), e2m1_sr_mag(uint32_t a, uint32_t r8)
//                                                the 3-bit magnitude code of |x| bits a (not NaN): the
//                                                producers' per-element core; the sign is e2m1_sign(x)
//   float   e8m0_decode(uint8_t b)               2^(b-127); 0xFF -> NaN
//   uint8_t e8m0_encode(int e)                   byte of 2^e, e clamped to [-127, 127]
//   uint8_t e4m3_encode_rne(float x)             OCP E4M3 (bias 7, max 448, no Inf), nearest-even
//   float   e4m3_decode(uint8_t b)               value of an E4M3 byte; 0x7F/0xFF -> NaN
//
// E2M1 codes: 0x0..0x7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign (0x8..0xF the negatives).
// Ties go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. |x| > 5
// (including Inf) saturates to 6. Equivalently (the definition the tests hold the bit-level code to):
// the magnitude code is the number of the thresholds 0.25 0.75 1.25 1.75 2.5 3.5 5 that |x| exceeds,
// counting "exceeds" as > for 0.25 1.25 2.5 5 and >= for 0.75 1.75 3.5. The sign is kept, so small negatives give 0x8
// (-0). NaN encodes to 0x0: E2M1 has no NaN, so block quantizers mark NaN in the block scale instead.
//
// Stochastic rounding: between the grid neighbours lo <= |x| < hi, round up iff
//   (|x| - lo) / (hi - lo) * 512 > 2*r8 + 1,
// i.e. against the uniform midpoint grid (r8 + 0.5)/256. Every step of that is exact (Sterbenz
// subtraction, power-of-two steps), so it is bit-identical on CPU and GPU. Resolution: the
// probability of rounding up is frac rounded to a multiple of 1/256, so the bias is at most 1/512 of
// the grid step (and zero when frac is a multiple of 1/256); unbiased in that sense wherever
// |x| < 6. |x| >= 6 saturates to 6.
//
// E4M3 (used by the FP8 embedding of MXFP4 and by NVFP4 block scales): |x| >= 448 and +-Inf
// saturate to +-448 (0x7E/0xFE); NaN gives 0x7F (with the input's sign bit); subnormals are exact
// multiples of 2^-9 and rounded to nearest even like normals.
#pragma once
#include <math.h>  // fabsf: a free |.| operand modifier on the GPU

#include "fp4/fp4_common.h"

// ---- E2M1 encoding as integer work on the float's bits (the producers run it per element, so it is
// written for few ALU instructions; tests/unit/test_fp4_mx.c proves it equal to the comparison-chain
// definition above over every float in [2^-10, 8] and 10M random patterns, and FP4_EXHAUSTIVE=1 over
// all 2^32).
//
// Magnitude code (0..7) of y = fp4_u2f(a) >= 0, a = |x| bits, not NaN; nearest-even, saturating.
//   y >= 1: the grid within a binade is the float's top mantissa bit, so rounding the mantissa to one
//           bit (nearest-even, on the bits: + 0x1FFFFF + the kept bit) leaves a >> 22 = 2 * (biased
//           exponent) + kept bit, which counts codes from 1.0 (= 254): code = (a >> 22) - 252.
//   y < 1:  the grid is uniform (step 0.5), and y + 2^22 (whose ulp is 0.5) rounds 2y to the nearest
//           even integer in one IEEE add: code = bits(y + 2^22) - bits(2^22).
// Both are computed without a branch: the first on max(y, 1) (then it gives 2 for y < 1, >= the second),
// the second overestimates for y >= 1 (rint(2y) >= code), so the minimum of the two and 7 is the code.
static inline FP4_HD uint32_t e2m1_rne_mag(uint32_t a) {
  uint32_t ac = a > 0x3F800000u ? a : 0x3F800000u;
  uint32_t big = ((ac + 0x1FFFFFu + ((ac >> 22) & 1u)) >> 22) - 252u;
  uint32_t small = fp4_f2u(FP4_ADD(fp4_u2f(a), 4194304.0f)) - 0x4A800000u;
  uint32_t m = small < big ? small : big;
  return m < 7u ? m : 7u;
}

// Stochastic magnitude code of y = fp4_u2f(a) >= 0 (not NaN) with 8 random bits r8: the rule of the
// header comment, round up iff frac * 512 > 2 r8 + 1, on the bits.
//   y >= 1: frac = (low 22 mantissa bits) / 2^22, so up iff M22 > (r8 << 14) + 0x2000, i.e. iff
//           a + 0x3FDFFF - (r8 << 14) carries into bit 22; then code = (that >> 22) - 252 as above.
//   y < 1:  y + 1 lies in [1, 2] where the grid {1, 1.5, 2} mirrors {0, 0.5, 1} with the same frac, so
//           the rule above runs on bits(y + 1) / 2 (exponent - 1: codes from 0.5 = 252). The add rounds;
//           its exact error sign (y > (y + 1) - 1, Sterbenz-exact) is a sticky bit that restores the
//           strict comparison (thresholds are multiples of 2^-23, so only the tie case needs it).
// y >= 6 (and Inf) gives >= 7 before the clamp: saturation to 6.
static inline FP4_HD uint32_t e2m1_sr_mag(uint32_t a, uint32_t r8) {
  float y = fp4_u2f(a), y1 = FP4_ADD(y, 1.0f);
  uint32_t small = a < 0x3F800000u;
  uint32_t sticky = small && y > FP4_SUB(y1, 1.0f);
  uint32_t b = small ? fp4_f2u(y1) - 0x800000u : a;
  uint32_t m = ((b + 0x3FDFFFu - (r8 << 14) + sticky) >> 22) - 252u;
  return m < 7u ? m : 7u;
}

static inline FP4_HD uint32_t e2m1_sign(float x) { return (fp4_f2u(x) >> 28) & 0x8u; }

static inline FP4_HD uint8_t e2m1_encode_rne(float x) {
  uint32_t a = fp4_f2u(x) & 0x7fffffffu;
  return (uint8_t)(e2m1_sign(x) | (a > 0x7f800000u ? 0u : e2m1_rne_mag(a)));  // NaN -> +-0
}

static inline FP4_HD uint8_t e2m1_encode_sr(float x, uint32_t r8) {
  uint32_t a = fp4_f2u(x) & 0x7fffffffu;
  if (a > 0x7f800000u) return 0;
  return (uint8_t)(e2m1_sign(x) | e2m1_sr_mag(a, r8 & 0xffu));
}

static inline FP4_HD float e2m1_decode(uint8_t code) {
  uint32_t m = code & 7u, e = m >> 1, f = m & 1u;
  // e == 0: 0 or 0.5; else (1 + f/2) * 2^(e-1)
  float v = e == 0 ? (f ? 0.5f : 0.0f) : fp4_u2f(((e - 1 + 127) << 23) | (f << 22));
  return (code & 8u) ? -v : v;
}

static inline FP4_HD float e8m0_decode(uint8_t b) {
  if (b == 0xFF) return fp4_u2f(0x7fc00000u);
  return fp4_exp2i((int)b - 127);
}

static inline FP4_HD uint8_t e8m0_encode(int e) { return (uint8_t)(fp4_imin(fp4_imax(e, -127), 127) + 127); }

static inline FP4_HD uint8_t e4m3_encode_rne(float x) {
  uint32_t u = fp4_f2u(x), s = (u >> 24) & 0x80u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return (uint8_t)(s | 0x7Fu);
  float a = fp4_u2f(u);
  if (a >= 448.0f) return (uint8_t)(s | 0x7Eu);
  if (a < 0.015625f) {          // below 2^-6: subnormal, a multiple of 2^-9 after rounding; 8 -> 0x08 = 2^-6
    float q = fp4_ldexp(a, 9);  // exact, in [0, 8)
    uint32_t n = (uint32_t)q;
    float fr = FP4_SUB(q, (float)n);
    n += (fr > 0.5f) || (fr == 0.5f && (n & 1u));
    return (uint8_t)(s | n);
  }
  uint32_t e = (u >> 23) - 127 + 7, man = u & 0x7fffffu;  // e in [1, 15]
  uint32_t m = man >> 20, rem = man & 0xfffffu;
  uint32_t code = (e << 3) + m;
  code += (rem > 0x80000u) || (rem == 0x80000u && (m & 1u));  // a carry moves into the exponent
  return (uint8_t)(s | code);                                 // a < 448 keeps code <= 0x7E
}

static inline FP4_HD float e4m3_decode(uint8_t b) {
  uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float v;
  if ((b & 0x7Fu) == 0x7Fu) v = fp4_u2f(0x7fc00000u);
  else if (e == 0) v = fp4_ldexp((float)m, -9);
  else v = fp4_u2f(((e - 7 + 127) << 23) | (m << 20));
  return (b & 0x80u) ? -v : v;
}
