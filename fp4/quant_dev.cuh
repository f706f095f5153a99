// fp4/quant_dev.cuh: device forms of the MXFP4 / NVFP4 block rules (mx_quantize_block32 of mxfp4.h,
// nv_quantize_block16 of nvfp4.h) for the producers, bit for bit equal to them but written for the
// GPU's pipes. On Hopper the integer/logic pipe (LOP3, SHF, IADD3, IMNMX, ISETP, LEA, PRMT) issues
// 16 lanes per cycle per scheduler, the FMA pipes (FADD, FMUL, FFMA, IMAD) 32: the producers were
// bound by the integer pipe, so the per-element work here moves to exact float arithmetic:
//   - E2M1 RNE as three magic adds and saturating FMAs (fp4_rne_acc below), accumulated straight into
//     the packed word as a float (exact: small integers);
//   - MXFP4 prescale (MX_SCALE_UP) as one multiply by fl(6 * 2^-e) instead of two (proof at
//     mx_block32_dev);
//   - the block amax as a NaN-propagating float max of |x| (one FMNMX per element instead of a mask
//     and an integer max).
// SR keeps e2m1_sr_mag's integer rule. FP4_HD like the rules they mirror, so a host build can hold them
// to the references (the checks are exhaustive over the float bit patterns that matter).
#pragma once
#include "fp4/mxfp4.h"
#include "fp4/nvfp4.h"

// ---- exact float helpers (FMA pipe on the GPU) ------------------------------------------------------
// sat(a * b + c) rounded once (PTX fma.rn.sat: clamps to [0, 1], NaN -> 0).
static inline FP4_HD float fp4_fma_sat(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  float d;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
#else
  float d = fmaf(a, b, c);
  return d > 0.0f ? (d < 1.0f ? d : 1.0f) : 0.0f;
#endif
}
static inline FP4_HD float fp4_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return fmaf(a, b, c);
#endif
}

// Running max of |x| bits as a float max that propagates NaN: for non-NaN inputs the larger |x| (whose
// bits are the integer max of the |x| bits, as mx_abs_bits / nv_abs_bits), and a NaN result (canonical
// 0x7FFFFFFF on the GPU, > 0x7F800000 either way) as soon as any input is NaN.
static inline FP4_HD float fp4_absmax(float m, float x) {
#if defined(__CUDA_ARCH__)
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(m), "f"(fabsf(x)));
  return d;
#else
  uint32_t a = fp4_f2u(m) & 0x7fffffffu, b = fp4_f2u(x) & 0x7fffffffu;
  return fp4_u2f(a > b ? a : b);
#endif
}

// ---- E2M1 round-to-nearest-even on the FMA pipe ------------------------------------------------------
// The magnitude code of y >= 0 (not NaN) is the number of thresholds 0.25 0.75 1.25 1.75 2.5 3.5 5 that y
// exceeds (e2m1.h). Split by grid step, each part is one magic add (IEEE RNE at a fixed ulp) and one
// saturating FMA, all exact:
//   t0 = y + 2^22 = 2^22 + RNE(2y)/2      s0 = sat(t0/2 - 2^21)     = min(RNE(2y), 4) / 4     (0.25 .. 1.75)
//   t1 = y + 2^23 = 2^23 + RNE(y)         s1 = sat(t1/2 - 2^22 - 1) = clamp(RNE(y) - 2, 0, 2) / 2  (2.5 3.5)
//   t2 = y + 2^24 = 2^24 + 2 RNE(y/2)     s2 = sat(t2/2 - 2^23 - 2) = clamp(RNE(y/2) - 2, 0, 1)    (5)
// code = 4 s0 + 2 s1 + s2 (ties: RNE(0.5) = 0, RNE(1.5) = 2, RNE(2.5) = 2, RNE(3.5) = 4, RNE(2.5) = 2 give
// exactly the brief's > / >= per threshold), and every y >= 5.x up to +Inf saturates to 7 with no clamp.
// fp4_rne_acc adds code * w to acc (w = 16^j puts it in nibble j; acc holds 2^23 + earlier nibbles, so
// every intermediate is an integer below 2^24: exact). Checked equal to e2m1_rne_mag on every y in
// [0, +Inf] (all 2^31 bit patterns) by an exhaustive host program.
static inline FP4_HD float fp4_rne_acc(float y, float w, float acc) {
  const float t0 = FP4_ADD(y, 4194304.0f), t1 = FP4_ADD(y, 8388608.0f), t2 = FP4_ADD(y, 16777216.0f);
  const float s0 = fp4_fma_sat(t0, 0.5f, -2097152.0f);
  const float s1 = fp4_fma_sat(t1, 0.5f, -4194305.0f);
  const float s2 = fp4_fma_sat(t2, 0.5f, -8388610.0f);
  return fp4_fma(s0, 4.0f * w, fp4_fma(s1, 2.0f * w, fp4_fma(s2, w, acc)));
}
static inline FP4_HD uint32_t fp4_rne_code(float y) { return fp4_f2u(fp4_rne_acc(y, 1.0f, 8388608.0f)) - 0x4B000000u; }

// Two float accumulators of 4 nibbles each (acc = 2^23 + sum) -> the packed 32-bit word, plus signs.
static inline FP4_HD uint32_t fp4_pack_acc(float lo, float hi, uint32_t sgn) {
  return fp4_f2u(lo) + (fp4_f2u(hi) << 16) - 0x4B000000u + sgn;  // (0x4B000000 << 16) wraps to 0
}

// Sign bit of x in bit 3 of nibble j: e2m1_sign(x) << (4 * j).
static inline FP4_HD uint32_t fp4_sign_nibble(float x, int j) { return (fp4_f2u(x) >> 31) << (4 * j + 3); }

// 8 random bits of element i from the Philox words w (philox_byte(w, i)).
static inline FP4_HD uint32_t fp4_rbyte(const uint32_t *w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xffu; }

// The per-block multiplier c with y = fl(|z| * c) == mx_prescale(|z|, e, mode) for every z of a block
// whose amax gave e. MX_SCALE_DOWN: c = 2^-e, the reference's one multiply. MX_SCALE_UP: the reference
// computes fl(fl(|z| 2^-e) * 6); for e >= -125, c = 6 * 2^-e = 1.5 * 2^(2-e) is a normal float, and
// either |z| 2^-e is exact (a normal result), so both are the one rounding of |z| * 6 * 2^-e, or it is
// subnormal, so both results are below 6 * 2^-126 and every rounding rule gives code 0 (RNE: below
// 0.25; SR: y + 1 rounds to 1, so e2m1_sr_mag's carry never happens). Returns 0 for UP with e < -125
// (c would overflow): the caller then runs the reference rule (a uniform branch, never taken in
// practice).
static inline FP4_HD float mx_block_mul(int e, MxScale mode) {
  if (mode == MX_SCALE_DOWN) return fp4_exp2i(-e);
  return e >= -125 ? fp4_u2f(((uint32_t)(129 - e) << 23) | 0x400000u) : 0.0f;
}

// The RNE codes of 32 values under the block multiplier c (mx_block_mul) as 4 packed words.
static inline FP4_HD void mx_rne_words(const float *v, float c, uint32_t *pk) {
FP4_UNROLL
  for (int w = 0; w < 4; w++) {
    float lo = 8388608.0f, hi = 8388608.0f;
    uint32_t sgn = 0;
FP4_UNROLL
    for (int j = 0; j < 4; j++) {
      const int i = 8 * w + j;
      lo = fp4_rne_acc(FP4_MUL(fabsf(v[i]), c), (float)(1 << (4 * j)), lo);
      hi = fp4_rne_acc(FP4_MUL(fabsf(v[i + 4]), c), (float)(1 << (4 * j)), hi);
      sgn |= fp4_sign_nibble(v[i], j) | fp4_sign_nibble(v[i + 4], j + 4);
    }
    pk[w] = fp4_pack_acc(lo, hi, sgn);
  }
}

// mx_quantize_block32, bit for bit: 32 values -> 4 packed words pk, returns the E8M0 byte.
template <bool SR>
static inline FP4_HD uint8_t mx_block32_dev(const float *v, MxScale mode, const uint32_t *rnd, uint32_t *pk) {
  float m = 0.0f;
FP4_UNROLL
  for (int i = 0; i < 32; i++) m = fp4_absmax(m, v[i]);
  const uint32_t am = fp4_f2u(m);
  if (am > MX_NAN_BITS) {
    pk[0] = pk[1] = pk[2] = pk[3] = 0;
    return 0xFF;
  }
  const int e = mx_scale_exp(fp4_u2f(am), mode);
  const float c = mx_block_mul(e, mode);
  if (c == 0.0f) return mx_quantize_block32(v, mode, SR, rnd, pk);  // UP, e < -125: amax <= 2^-126
  if (SR) {
FP4_UNROLL
    for (int w = 0; w < 4; w++) {
      uint32_t mag = 0, sgn = 0;
FP4_UNROLL
      for (int j = 0; j < 8; j++) {
        const int i = 8 * w + j;
        mag += e2m1_sr_mag(fp4_f2u(FP4_MUL(fabsf(v[i]), c)), fp4_rbyte(rnd, i)) << (4 * j);
        sgn |= fp4_sign_nibble(v[i], j);
      }
      pk[w] = mag | sgn;
    }
  }
  if (!SR) mx_rne_words(v, c, pk);
  return e8m0_encode(e);
}

// nv_quantize_block16 + pack16, bit for bit: 16 values -> 2 packed words (element 2i in the low nibble
// of byte i), returns the E4M3 block scale. inv != 0 is nv_encode's nonzero case; y = fl(|x| * inv) is
// nv_encode's product (finite x, so never NaN; Inf -> code 7 as there).
template <bool SR>
static inline FP4_HD uint8_t nv_block16_dev(const float *v, float s_enc, const uint32_t *rnd, uint32_t *out) {
  float m = 0.0f;
FP4_UNROLL
  for (int i = 0; i < 16; i++) m = fp4_absmax(m, v[i]);
  const uint8_t bs = nv_block_scale(fp4_f2u(m), s_enc);
  const float inv = nv_elem_inv(bs, s_enc);
  uint32_t pk[2] = {0, 0};  // bs == 0 or NaN: every code 0
  if (inv != 0.0f) {
FP4_UNROLL
    for (int w = 0; w < 2; w++) {
      uint32_t sgn = 0;
      if (SR) {
        uint32_t mag = 0;
FP4_UNROLL
        for (int j = 0; j < 8; j++) {
          const int i = 8 * w + j;
          mag += e2m1_sr_mag(fp4_f2u(FP4_MUL(fabsf(v[i]), inv)), fp4_rbyte(rnd, i)) << (4 * j);
          sgn |= fp4_sign_nibble(v[i], j);
        }
        pk[w] = mag | sgn;
      } else {
        float lo = 8388608.0f, hi = 8388608.0f;
FP4_UNROLL
        for (int j = 0; j < 4; j++) {
          const int i = 8 * w + j;
          lo = fp4_rne_acc(FP4_MUL(fabsf(v[i]), inv), (float)(1 << (4 * j)), lo);
          hi = fp4_rne_acc(FP4_MUL(fabsf(v[i + 4]), inv), (float)(1 << (4 * j)), hi);
          sgn |= fp4_sign_nibble(v[i], j) | fp4_sign_nibble(v[i + 4], j + 4);
        }
        pk[w] = fp4_pack_acc(lo, hi, sgn);
      }
    }
  }
  out[0] = pk[0], out[1] = pk[1];
  return bs;
}
