// fp4/e2m1.h: the element and scale codecs of FP4 formats, as exact FP4_HD scalar rules.
//
// API (all static inline, callable from C and CUDA device code):
//   uint8_t e2m1_encode_rne(float x)             nearest-even E2M1 code of x, saturating to +-6
//   uint8_t e2m1_encode_sr(float x, uint32_t r8) stochastic rounding with 8 random bits r8 in [0,255]
//   float   e2m1_decode(uint8_t code)            value of a 4-bit code (high bits ignored)
//   float   e8m0_decode(uint8_t b)               2^(b-127); 0xFF -> NaN
//   uint8_t e8m0_encode(int e)                   byte of 2^e, e clamped to [-127, 127]
//   uint8_t e4m3_encode_rne(float x)             OCP E4M3 (bias 7, max 448, no Inf), nearest-even
//   float   e4m3_decode(uint8_t b)               value of an E4M3 byte; 0x7F/0xFF -> NaN
//
// E2M1 codes: 0x0..0x7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign (0x8..0xF the negatives).
// Ties go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. |x| > 5
// (including Inf) saturates to 6. The sign is kept, so small negatives give 0x8 (-0). NaN encodes
// to 0x0: E2M1 has no NaN, so block quantizers mark NaN in the block scale instead.
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
#include "fp4/fp4_common.h"

static inline FP4_HD uint8_t e2m1_encode_rne(float x) {
  uint32_t s = (fp4_f2u(x) >> 28) & 0x8u;
  float a = fp4_u2f(fp4_f2u(x) & 0x7fffffffu);
  // Strict/non-strict comparisons put each tie on the even side; NaN compares false -> 0.
  uint32_t m = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f) + (uint32_t)(a > 1.25f) + (uint32_t)(a >= 1.75f) +
               (uint32_t)(a > 2.5f) + (uint32_t)(a >= 3.5f) + (uint32_t)(a > 5.0f);
  return (uint8_t)(s | m);
}

static inline FP4_HD float e2m1_decode(uint8_t code) {
  uint32_t m = code & 7u, e = m >> 1, f = m & 1u;
  // e == 0: 0 or 0.5; else (1 + f/2) * 2^(e-1)
  float v = e == 0 ? (f ? 0.5f : 0.0f) : fp4_u2f(((e - 1 + 127) << 23) | (f << 22));
  return (code & 8u) ? -v : v;
}

static inline FP4_HD uint8_t e2m1_encode_sr(float x, uint32_t r8) {
  uint32_t s = (fp4_f2u(x) >> 28) & 0x8u;
  float a = fp4_u2f(fp4_f2u(x) & 0x7fffffffu);
  if (!(a < 6.0f)) return (uint8_t)(fp4_isnan(a) ? 0u : (s | 7u));
  uint32_t lo = (uint32_t)(a >= 0.5f) + (uint32_t)(a >= 1.0f) + (uint32_t)(a >= 1.5f) + (uint32_t)(a >= 2.0f) +
                (uint32_t)(a >= 3.0f) + (uint32_t)(a >= 4.0f);
  float vlo = e2m1_decode((uint8_t)lo);
  float inv_step = lo < 4 ? 2.0f : (lo < 6 ? 1.0f : 0.5f);        // 1 / (hi - lo)
  float f512 = FP4_MUL(FP4_MUL(FP4_SUB(a, vlo), inv_step), 512.0f); // exact
  uint32_t up = f512 > (float)(2u * (r8 & 0xffu) + 1u);
  return (uint8_t)(s | (lo + up));
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
  if (a < 0.015625f) {  // below 2^-6: subnormal, a multiple of 2^-9 after rounding; 8 -> 0x08 = 2^-6
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
  return (uint8_t)(s | code);                                  // a < 448 keeps code <= 0x7E
}

static inline FP4_HD float e4m3_decode(uint8_t b) {
  uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float v;
  if ((b & 0x7Fu) == 0x7Fu) v = fp4_u2f(0x7fc00000u);
  else if (e == 0) v = fp4_ldexp((float)m, -9);
  else v = fp4_u2f(((e - 7 + 127) << 23) | (m << 20));
  return (b & 0x80u) ? -v : v;
}
