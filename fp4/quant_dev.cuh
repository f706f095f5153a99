// fp4/quant_dev.cuh: device forms of the MXFP4 / NVFP4 block rules (mx_quantize_block32 of mxfp4.h,
// nv_quantize_block16 of nvfp4.h) for the producers, bit for bit equal to them but written for the
// GPU's pipes. On Hopper the integer/logic pipe (LOP3, SHF, IADD3, IMNMX, ISETP, LEA, PRMT) issues
// 16 lanes per cycle per scheduler, the FMA pipes (FADD, FMUL, FFMA, IMAD) 32: the producers were
// bound by the integer pipe, so the per-element work here moves to exact float arithmetic:
//   - E2M1 RNE as three magic adds and saturating FMAs (fp4_rne_acc below), accumulated straight into
//     the packed word as a float (exact: small integers);
//   - the MXFP4 prescale by c = 6 * 2^-e (or 2^-e) folded into the rounding: RNE's magic adds are
//     FMAs with |z| * c, SR takes |z| * c rounded up, and both give the codes of the exact 6 z / 2^e,
//     as the reference's rounding to odd does (proof at mx_acc4);
//   - the block amax as a NaN-propagating float max of |x| (one FMNMX per element instead of a mask
//     and an integer max);
//   - E2M1 SR (e2m1_sr_mag's rule) as saturating FMAs and adds rounded toward +Inf, the random threshold
//     one byte permute (fp4_sr_acc below), accumulated into the packed word by Horner steps;
//   - the sign bits of 8 elements gathered by sign-replicating byte permutes (fp4_sign_word: 7 ALU
//     instructions per word instead of 16), merged with the codes by one select.
// FP4_HD like the rules they mirror, so a host build holds them to the references: tests/unit/test_quant_dev.cpp
// (in CI; exhaustive over every non-negative float with QUANT_DEV_EXHAUSTIVE=1).
#pragma once
#include "fp4/fp8_embed.h"
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

// fl(a * b + c) rounded once toward +Inf (PTX fma.rp.f32 / add.rp.f32; subnormals kept, no FTZ).
// Host: a * b is exact in double (24 x 24 bits, no overflow or underflow there), p + c is TwoSum'd into
// s + err = p + c exactly (double sums of floats never overflow), and f = RN_float(s) is moved up one float
// iff f < s or (f == s and err > 0). That is the smallest float >= p + c: if f < s, the next float f+ is
// > s (else RN(s) would be f+), so f+ >= succ_double(s) >= p + c (|err| is at most half the gap from s
// to its double neighbour on err's side), while f <= pred_double(s) < p + c; if f > s, then likewise
// f >= p + c > pred(f); if f == s the sign of err decides (|err| is far below a float ulp). Exact zeros:
// x + (-x) is +0 both ways (RN double, RU float), -0 + -0 stays -0. Inf operands give s = +-Inf, returned
// as is (a NaN err is never looked at); a finite s beyond FLT_MAX converts to FLT_MAX or Inf and moves up
// as above (to +Inf, or from -Inf to -FLT_MAX), which is what the GPU rounds toward +Inf.
static inline FP4_HD float fp4_fma_ru(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_ru(a, b, c);
#else  // branch-free (an Inf s gives a NaN err and f == s: no move)
  const double p = (double)a * (double)b, s = p + (double)c;
  const double bb = s - p, err = (p - (s - bb)) + ((double)c - bb);
  const float f = (float)s;
  const uint32_t u = fp4_f2u(f);
  const uint32_t next = (u & 0x7fffffffu) == 0 ? 1u : u >> 31 ? u - 1 : u + 1;  // +-0 -> 2^-149; -Inf -> -FLT_MAX
  return fp4_u2f(((double)f < s || ((double)f == s && err > 0.0)) ? next : u);
#endif
}
static inline FP4_HD float fp4_add_ru(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_ru(a, b);
#else
  return fp4_fma_ru(a, 1.0f, b);  // a * 1 is exact: the same single rounding of a + b
#endif
}
// fl(a * b) rounded toward +Inf (PTX mul.rp.f32); a * b >= 0 here (a + 0 adds nothing to a product >= 0).
static inline FP4_HD float fp4_mul_ru(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_ru(a, b);
#else
  return fp4_fma_ru(a, b, 0.0f);
#endif
}

// PTX prmt.b32 (default mode): byte n of the result is byte (nibble n of sel) & 7 of {b, a} (a = bytes
// 0-3, b = bytes 4-7), or, when that nibble's bit 3 is set, the sign bit of that byte replicated over 8
// bits. The host form is that definition, byte by byte.
static inline FP4_HD uint32_t fp4_prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t x = ((uint64_t)b << 32) | a;
  uint32_t d = 0;
  for (int n = 0; n < 4; n++) {
    const uint32_t s = (sel >> (4 * n)) & 15u, byte = (uint32_t)(x >> (8 * (s & 7u))) & 0xffu;
    d |= (s & 8u ? (byte & 0x80u ? 0xffu : 0u) : byte) << (8 * n);
  }
  return d;
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
// exactly docs/formats.md §1's ties, > / >= per threshold), and every y >= 5.x up to +Inf saturates to 7
// with no clamp.
// fp4_rne_acc adds code * w to acc (w = 16^j puts it in nibble j; acc holds 2^23 + earlier nibbles, so
// every intermediate is an integer below 2^24: exact). Checked equal to e2m1_rne_mag on every y in
// [0, +Inf] (all 2^31 bit patterns): QUANT_DEV_EXHAUSTIVE=1 build/tests/test_quant_dev.
static inline FP4_HD float fp4_rne_acc3(float t0, float t1, float t2, float w, float acc) {
  const float s0 = fp4_fma_sat(t0, 0.5f, -2097152.0f);
  const float s1 = fp4_fma_sat(t1, 0.5f, -4194305.0f);
  const float s2 = fp4_fma_sat(t2, 0.5f, -8388610.0f);
  return fp4_fma(s0, 4.0f * w, fp4_fma(s1, 2.0f * w, fp4_fma(s2, w, acc)));
}
static inline FP4_HD float fp4_rne_acc(float y, float w, float acc) {
  return fp4_rne_acc3(FP4_ADD(y, 4194304.0f), FP4_ADD(y, 8388608.0f), FP4_ADD(y, 16777216.0f), w, acc);
}
static inline FP4_HD uint32_t fp4_rne_code(float y) { return fp4_f2u(fp4_rne_acc(y, 1.0f, 8388608.0f)) - 0x4B000000u; }

// The sign bits of x[0..7] at bit 3 of nibbles 0..7 (the other bits are garbage): per byte k the signs of
// x[2k] (bit 3) and x[2k+1] (bit 7). Four sign-replicating permutes give [s0 s2 . .], [s4 s6 . .], [s1 s3
// . .], [s5 s7 . .] as 0x00 / 0xFF bytes, two more gather g = [s0 s2 s4 s6] and h = [s1 s3 s5 s7], and
// one select takes the low nibble of each byte from g and the high one from h: 7 ALU instructions per 8
// elements instead of a shift and a merge each (-0 and negative NaN count as negative, as e2m1_sign).
static inline FP4_HD uint32_t fp4_sign_word(const float *x) {
  const uint32_t g = fp4_prmt(fp4_prmt(fp4_f2u(x[0]), fp4_f2u(x[2]), 0xFBFBu),
                              fp4_prmt(fp4_f2u(x[4]), fp4_f2u(x[6]), 0xFBFBu), 0x5410u);
  const uint32_t h = fp4_prmt(fp4_prmt(fp4_f2u(x[1]), fp4_f2u(x[3]), 0xFBFBu),
                              fp4_prmt(fp4_f2u(x[5]), fp4_f2u(x[7]), 0xFBFBu), 0x5410u);
  return (g & 0x0F0F0F0Fu) | (h & 0xF0F0F0F0u);
}

// Two float accumulators of 4 nibbles each (acc = 2^23 + sum, or 2^23 + 8 + sum for SR) -> the packed
// 32-bit word: the low halves of their bits side by side (one permute), then the sign bits (3 of every
// nibble, where the magnitude codes 0..7 have a 0, and SR's + 8 a 1) from sgn (fp4_sign_word).
static inline FP4_HD uint32_t fp4_pack_acc(float lo, float hi, uint32_t sgn) {
  return (fp4_prmt(fp4_f2u(lo), fp4_f2u(hi), 0x5410u) & 0x77777777u) | (sgn & 0x88888888u);
}

// ---- E2M1 stochastic rounding on the FMA pipe -------------------------------------------------------
// e2m1_sr_mag's rule: between grid neighbours lo <= y < hi, round up iff frac * 512 > 2 r + 1, with
// frac = (y - lo) / (hi - lo); y >= 6 gives 7. In code space the grid is the integers: with
//   g(y) = min(2y, y + 2, y/2 + 4, 7) = 4 s0 + 2 s1 + s2,  s0 = sat(y/2), s1 = sat(y/2 - 1), s2 = sat(y/2 - 2)
// (g is continuous, piecewise linear with the grid steps 1/2, 1, 2 as slopes 2, 1, 1/2, and code n at
// g = n), and d = (2 r + 1) / 512 in (0, 1), the code is floor(g) + [frac(g) > d] = ceil(g - d) for y < 6,
// and ceil(7 - d) = 7 above. Every piece is exact on the FMA pipe:
//   - s0, s1, s2: one fma.rn.sat each. y/2 - 1 is exact for y in [2, 4] (the only y where s1 is not
//     clamped: below, the rounded value is <= 0; above, >= 1), y/2 - 2 likewise for y in [4, 6]; y/2 is
//     exact unless y is subnormal, where every sum below stays under 0 either way. +Inf gives 1, 1, 1.
//   - p = -(128 + d): a byte permute of the random byte r into the float bits 0xC300rr80 (mantissa
//     (256 r + 128) / 2^23 at exponent 7), fp4_sr_dither.
//   - t = 4 s0 + p, t += 2 s1, t += s2, each rounded toward +Inf (fl_ru). For y <= 2, s1 = s2 = 0 and
//     only the first step can round; for 2 < y <= 4, s0 = 1 and s2 = 0 and only the second (4 + p is
//     exact: a multiple of 2^-9 in [-125, -124]); for y > 4 only the third (6 + p likewise). So t is
//     fl_ru(g - 128 - d) (t in (-129, -121]), and ceil(fl_ru(x)) = ceil(x) whenever the integer ceil(x) is
//     a float (fl_ru(x) is the least float >= x: >= x, and <= ceil(x)). Hence ceil(t) = code - 128.
//   - acc' + t rounded toward +Inf, with acc' an integer in [2^23 + 128 + 8, 2^24 - 8]: the sum lies in
//     [2^23, 2^24) where the float grid is the integers, so the result is acc' + ceil(t) = acc' - 128 +
//     code. That is the "magic add" that rounds to an integer, and it doubles as the accumulation:
// Packing: a float A = M + N with M = 2^23 + 8 holds 4 nibbles N (nibble 3 first); the next nibble j is
// added as fp4_sr_acc(y_j, p_j, 16 A - 15 M + 128) (one exact FMA: 16 A - 15 M + 128 = M + 128 + 16 N, an
// integer below 2^24; -15 M + 128 = -125829112 is a multiple of 8 below 2^27, so a float). M - 2^23 = 8
// keeps acc' + t >= 2^23 when N = 0 and t > -129. Checked equal to e2m1_sr_mag for every y in [0, +Inf]
// (all non-negative non-NaN bit patterns) times all 256 random bytes, at the first nibble and after
// 0xFFF: QUANT_DEV_EXHAUSTIVE=1 build/tests/test_quant_dev (about 6 core-hours).
// Per element: 3 sat-FMAs, 4 directed adds/FMAs (FMA pipe), a PRMT, and 3/4 of a Horner FFMA.
#define FP4_SR_M 8388616.0f          // 2^23 + 8
#define FP4_SR_ACC0 8388744.0f       // M + 128: acc' for the first nibble (N = 0)
#define FP4_SR_HORNER -125829112.0f  // -15 M + 128
// -(128 + (2 r + 1) / 512) with r = byte j of w: bytes 0x80, r, 0x00, 0xC3. (The constant is operand a so
// that the selector, not the constant, is the immediate: the constant then stays in one register.)
static inline FP4_HD float fp4_sr_dither(uint32_t w, int j) {
  return fp4_u2f(fp4_prmt(0xC3000080u, w, 0x3100u | ((uint32_t)(4 + j) << 4)));
}
static inline FP4_HD float fp4_sr_acc3(float s0, float s1, float s2, float p, float acc) {
  const float t = fp4_add_ru(fp4_fma_ru(s1, 2.0f, fp4_fma_ru(s0, 4.0f, p)), s2);
  return fp4_add_ru(t, acc);
}
static inline FP4_HD float fp4_sr_acc(float y, float p, float acc) {
  return fp4_sr_acc3(fp4_fma_sat(y, 0.5f, 0.0f), fp4_fma_sat(y, 0.5f, -1.0f), fp4_fma_sat(y, 0.5f, -2.0f), p, acc);
}
// The SR codes of 4 elements (scaled magnitudes y[0..3], random bytes 0..3 of w) as M + 16-bit nibbles.
static inline FP4_HD float fp4_sr_nibbles4(const float *y, uint32_t w) {
  float a = fp4_sr_acc(y[3], fp4_sr_dither(w, 3), FP4_SR_ACC0);
  FP4_UNROLL
  for (int j = 2; j >= 0; j--) a = fp4_sr_acc(y[j], fp4_sr_dither(w, j), fp4_fma(a, 16.0f, FP4_SR_HORNER));
  return a;
}
// The SR codes of 8 values v[0..7] under the multiplier c, random bytes from rnd[0..1], as one packed word
// (fp4_pack_acc: the + 8 of M lands on the sign bit of nibble 0, which the signs overwrite).
static inline FP4_HD uint32_t fp4_sr_word(const float *v, float c, const uint32_t *rnd) {
  float y[8];
  FP4_UNROLL
  for (int j = 0; j < 8; j++) y[j] = FP4_MUL(fabsf(v[j]), c);
  return fp4_pack_acc(fp4_sr_nibbles4(y, rnd[0]), fp4_sr_nibbles4(y + 4, rnd[1]), fp4_sign_word(v));
}

// The per-block multiplier c with |z| * c == the exact quotient mx_prescale rounds (6 |z| / 2^e or
// |z| / 2^e) for every z of a block whose amax gave e: c = 2^-e (MX_SCALE_DOWN) or 6 * 2^-e = 1.5 *
// 2^(2-e), a normal float for e >= -125 (MX_SCALE_UP). The producers never round |z| * c on its own:
// RNE adds it to its magic constants in one FMA each, SR rounds it toward +Inf (mx_acc4), and both
// then give the codes of the exact quotient, as the reference does (where |z| 2^-e would be subnormal,
// every result is below 6 * 2^-126 and every rule gives code 0 on both sides). Returns 0 for UP with
// e < -125 (c would overflow): the caller then runs the reference rule (a uniform branch, never taken
// in practice).
static inline FP4_HD float mx_block_mul(int e, MxScale mode) {
  if (mode == MX_SCALE_DOWN) return fp4_exp2i(-e);
  return e >= -125 ? fp4_u2f(((uint32_t)(129 - e) << 23) | 0x400000u) : 0.0f;
}

// The RNE codes of 8 values v[0..8) under the multiplier c as one packed word (element j in nibble j),
// of the rounded products fl(|v| c): NVFP4's element rule (nv_encode).
static inline FP4_HD uint32_t fp4_rne_word(const float *v, float c) {
  float lo = 8388608.0f, hi = 8388608.0f;
  FP4_UNROLL
  for (int j = 0; j < 4; j++) {
    lo = fp4_rne_acc(FP4_MUL(fabsf(v[j]), c), (float)(1 << (4 * j)), lo);
    hi = fp4_rne_acc(FP4_MUL(fabsf(v[j + 4]), c), (float)(1 << (4 * j)), hi);
  }
  return fp4_pack_acc(lo, hi, fp4_sign_word(v));
}

// The running max of |x| over BF16 pairs (two lanes per word), NaN-propagating: fold word w into m (start
// from 0). On the GPU one max.NaN.xorsign.abs.bf16x2 (0.5 instructions per element, no unpacking); the
// signs of m are garbage, mx_bf16_amax drops them. NaN halves become 0x7FFF (any value > 0x7F80 reads as
// NaN below).
static inline FP4_HD uint32_t fp4_absmax_bf16x2(uint32_t m, uint32_t w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860
  uint32_t d;
  asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(m), "r"(w));
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 2; h++) {
    const uint32_t a = (m >> (16 * h)) & 0x7FFFu, b = (w >> (16 * h)) & 0x7FFFu;
    d |= (a > 0x7F80u || b > 0x7F80u ? 0x7FFFu : a > b ? a : b) << (16 * h);
  }
  return d;
#endif
}
// The block amax of 32 BF16 values held as 16 pair words, as a float (NaN if any is NaN): equal to the
// fp4_absmax fold of their floats.
static inline FP4_HD float mx_bf16_amax(const uint32_t *w) {
  uint32_t m = 0;
  FP4_UNROLL
  for (int i = 0; i < 16; i++) m = fp4_absmax_bf16x2(m, w[i]);
  const uint32_t lo = m & 0x7FFFu, hi = (m >> 16) & 0x7FFFu;
  return fp4_u2f((lo > hi ? lo : hi) << 16);
}

// mx_quantize_block32's block scale: returns the E8M0 byte (0xFF for a NaN block) and sets *c to the
// multiplier of mx_block_mul, or to 0 when the block's codes are all 0 (NaN) or need the reference
// rule (MX_SCALE_UP with e < -125: then the E8M0 byte is not 0xFF). _of: from the block amax m.
static inline FP4_HD uint8_t mx_block32_scale_of(float m, MxScale mode, float *c) {
  const uint32_t am = fp4_f2u(m), be = am >> 23;
  if (be - 3u < 251u) {  // amax in [2^-124, 2^127) (every real block): mx_scale_exp straight from the bits
    const int e = mode == MX_SCALE_UP ? (int)be - 127 + ((am & 0x7FFFFFu) != 0) : (int)be - 129;
    *c = mx_block_mul(e, mode);
    return (uint8_t)(e + 127);
  }
  if (am > MX_NAN_BITS) {
    *c = 0.0f;
    return 0xFF;
  }
  const int e = mx_scale_exp(fp4_u2f(am), mode);
  *c = mx_block_mul(e, mode);
  return e8m0_encode(e);
}
static inline FP4_HD uint8_t mx_block32_scale(const float *v, MxScale mode, float *c) {
  float m = 0.0f;
  FP4_UNROLL
  for (int i = 0; i < 32; i++) m = fp4_absmax(m, v[i]);
  return mx_block32_scale_of(m, mode, c);
}

// The magnitude codes of v[0..3] under the multiplier c as a float accumulator: the codes in the low 16
// bits of its float bits, element j in nibble j (RNE: 2^23 + the nibbles, bit 3 of each nibble clear;
// SR: M + the nibbles, bit 3 of nibble 0 set by M's + 8, see fp4_sr_acc; rnd: the 4 random bytes).
// The codes are those of the exact y = |v| c (docs/formats.md §1), for any float v:
//   RNE: fp4_rne_acc's three magic adds fl(y + 2^k) as fma(|v|, c, 2^k), each one rounding of the exact
//        sum, which is all the argument at fp4_rne_acc3 asks of them (y need not be a float);
//   SR:  y rounded toward +Inf. A code moves up exactly where y exceeds a threshold T (the SR grid
//        lo + (2 r + 1) / 512 of a step, or a grid point), and T is a float: y > T iff fl_ru(y) > T (the
//        least float >= y is <= T whenever y <= T). So fp4_sr_acc of fl_ru(y) is the exact rule.
// For BF16 v the products are exact, so both are the codes of fl(|v| c) (tests/unit/test_quant_dev.cpp).
template <bool SR>
static inline FP4_HD float mx_acc4(const float *v, float c, uint32_t rnd) {
  if (SR) {
    float y[4];
    FP4_UNROLL
    for (int j = 0; j < 4; j++) y[j] = fp4_mul_ru(fabsf(v[j]), c);
    return fp4_sr_nibbles4(y, rnd);
  }
  float a = 8388608.0f;
  FP4_UNROLL
  for (int j = 0; j < 4; j++) {
    const float ax = fabsf(v[j]);
    a = fp4_rne_acc3(fp4_fma(ax, c, 4194304.0f), fp4_fma(ax, c, 8388608.0f), fp4_fma(ax, c, 16777216.0f),
                     (float)(1 << (4 * j)), a);
  }
  return a;
}

// The RNE codes of 32 values under the block multiplier c (mx_block_mul) as 4 packed words.
static inline FP4_HD void mx_rne_words(const float *v, float c, uint32_t *pk) {
  FP4_UNROLL
  for (int w = 0; w < 4; w++)
    pk[w] =
        fp4_pack_acc(mx_acc4<false>(v + 8 * w, c, 0u), mx_acc4<false>(v + 8 * w + 4, c, 0u), fp4_sign_word(v + 8 * w));
}

// mx_acc4 for BF16 values x (any float whose significand fits in 8 bits), with SR's prescale folded into
// the rounding's first operations (one multiply less per element; RNE is mx_acc4's): y = |x| c is exact
// (at most 8 + 2 significant bits, c = 2^k or 1.5 * 2^k) unless it is subnormal, so SR's sat(y/2 - k) are
// sat(fma(|x|, c/2, -k)) (ch = c/2 exact: a power of two or 1.5 * 2^k >= 1.5 * 2^-126). Where y is
// subnormal, SR's halves may differ in the last bit of a subnormal, which moves no SR result (checked on
// every BF16 magnitude, scale and random byte: tests/unit/test_quant_dev.cpp).
template <bool SR>
static inline FP4_HD float mx_acc4_bf16(const float *x, float c, float ch, uint32_t rnd) {
  if (SR) {
    float a = FP4_SR_ACC0;
    FP4_UNROLL
    for (int j = 3; j >= 0; j--) {
      const float ax = fabsf(x[j]);
      if (j < 3) a = fp4_fma(a, 16.0f, FP4_SR_HORNER);
      a = fp4_sr_acc3(fp4_fma_sat(ax, ch, 0.0f), fp4_fma_sat(ax, ch, -1.0f), fp4_fma_sat(ax, ch, -2.0f),
                      fp4_sr_dither(rnd, j), a);
    }
    return a;
  }
  return mx_acc4<false>(x, c, 0u);
}

// mx_quantize_block32's magnitude codes, bit for bit, as 8 accumulators (acc[k]: v[4k..4k+3], as
// mx_acc4). The signs are not in them: the packed words take them from fp4_sign_word, the FP8
// embedding from fp4_sign_bytes4. Returns the E8M0 byte (a NaN block's accumulators hold codes 0).
template <bool SR>
static inline FP4_HD uint8_t mx_block32_acc(const float *v, MxScale mode, const uint32_t *rnd, float *acc) {
  float c;
  const uint8_t b = mx_block32_scale(v, mode, &c);
  if (c == 0.0f && b != 0xFF) {  // UP, e < -125 (amax <= 2^-126): the reference rule, its codes moved into acc
    uint32_t pk[4];
    mx_quantize_block32(v, mode, SR, rnd, pk);
    FP4_UNROLL
    for (int k = 0; k < 8; k++) acc[k] = fp4_u2f(0x4B000000u | ((pk[k >> 1] >> (16 * (k & 1))) & 0x7777u));
    return b;
  }
  FP4_UNROLL
  for (int k = 0; k < 8; k++) acc[k] = mx_acc4<SR>(v + 4 * k, c, SR ? rnd[k] : 0u);
  return b;
}

// The 4 magnitude codes of accumulator a as a byte-permute selector (nibble j = code j, bit 3 clear).
template <bool SR>
static inline FP4_HD uint32_t mx_acc_codes4(float a) {
  return SR ? fp4_f2u(a) & 0x7777u : fp4_f2u(a) & 0xFFFFu;  // RNE: bits 3 already clear
}

// mx_quantize_block32, bit for bit: 32 values -> 4 packed words pk, returns the E8M0 byte.
template <bool SR>
static inline FP4_HD uint8_t mx_block32_dev(const float *v, MxScale mode, const uint32_t *rnd, uint32_t *pk) {
  float acc[8];
  const uint8_t b = mx_block32_acc<SR>(v, mode, rnd, acc);
  FP4_UNROLL
  for (int w = 0; w < 4; w++)
    pk[w] = b == 0xFF ? 0u : fp4_pack_acc(acc[2 * w], acc[2 * w + 1], fp4_sign_word(v + 8 * w));
  return b;
}

// The sign bytes of x[0..3]: byte j = 0xFF where x[j]'s sign bit is set (-0 and negative NaN included,
// as e2m1_sign), else 0x00. Three sign-replicating byte permutes.
static inline FP4_HD uint32_t fp4_sign_bytes4(const float *x) {
  const uint32_t a = fp4_prmt(fp4_f2u(x[0]), fp4_f2u(x[1]), 0x00FBu);  // bytes 0, 1
  const uint32_t b = fp4_prmt(fp4_f2u(x[2]), fp4_f2u(x[3]), 0xFB00u);  // bytes 2, 3
  return fp4_prmt(a, b, 0x7610u);
}
// The same for 4 BF16 values held as two words of pairs (element 2i in the low half): one permute.
static inline FP4_HD uint32_t fp4_sign_bytes4_bf16(uint32_t w0, uint32_t w1) { return fp4_prmt(w0, w1, 0xFDB9u); }

// mx_embed_lookup4 with the codes and the signs apart (mx_acc_codes4, fp4_sign_bytes4): the E4M3 bytes of
// 4 elements of a block with table L, one permute and one logic op. Equal to mx_embed_value of each
// element's signed code (tests/unit/test_quant_dev.cpp).
static inline FP4_HD uint32_t mx_embed_word4(MxEmbedLut L, uint32_t codes, uint32_t signs) {
  return fp4_prmt(L.lo, L.hi, codes) | (signs & L.sign);
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
      if (SR) {
        pk[w] = fp4_sr_word(v + 8 * w, inv, rnd + 2 * w);
      } else {
        pk[w] = fp4_rne_word(v + 8 * w, inv);
      }
    }
  }
  out[0] = pk[0], out[1] = pk[1];
  return bs;
}
