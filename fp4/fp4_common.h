// fp4/fp4_common.h: the FP4_HD macro and exact float helpers shared by the CPU reference (.c) and
// the CUDA kernels (.cu) of the FP4 library.
//
// Bit-exactness between CPU and GPU rests on one rule: every scalar step is written once here (or in
// e2m1.h, philox.h, hadamard.h, mxfp4.h) as a static inline FP4_HD function, using only operations
// that IEEE-754 defines exactly (correctly rounded +,-,*,/ in fp32, comparisons, integer bit work).
// No log2f/exp2f (libm and CUDA differ); no FMA contraction (device code uses __fmul_rn/__fadd_rn via
// FP4_MUL/FP4_ADD, and the build passes -fmad=false to all CUDA code and -ffp-contract=off to C and
// C++). Subnormals are kept (no FTZ on either side).
//
//   fp4_f2u / fp4_u2f            float <-> bits
//   fp4_exp2i(n)                 exact 2^n, n in [-149, 127]
//   fp4_ldexp(x, n)              x * 2^n in one correctly rounded multiply, n in [-149, 127]
//   fp4_fma(a, b, c)             a * b + c rounded once (fmaf on the host, __fmaf_rn on the GPU)
//   fp4_floor_log2 / fp4_ceil_log2(a)   exact, from the exponent bits; a > 0 finite
#pragma once
#include <math.h>  // fmaf
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FP4_HD __host__ __device__  // used as "static inline FP4_HD"
#else
#define FP4_HD
#endif
#if defined(__CUDA_ARCH__)
#define FP4_UNROLL _Pragma("unroll")  // fixed-size loops stay in registers on the GPU
#else
#define FP4_UNROLL
#endif

#if defined(__CUDA_ARCH__)
#define FP4_MUL(a, b) __fmul_rn((a), (b))
#define FP4_ADD(a, b) __fadd_rn((a), (b))
#define FP4_SUB(a, b) __fsub_rn((a), (b))
#define FP4_DIV(a, b) __fdiv_rn((a), (b))
#else
#define FP4_MUL(a, b) ((a) * (b))
#define FP4_ADD(a, b) ((a) + (b))
#define FP4_SUB(a, b) ((a) - (b))
#define FP4_DIV(a, b) ((a) / (b))
#endif

static inline FP4_HD uint32_t fp4_f2u(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
#endif
}

static inline FP4_HD float fp4_u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  memcpy(&x, &u, 4);
  return x;
#endif
}

static inline FP4_HD int fp4_clz(uint32_t u) {  // u != 0
#if defined(__CUDA_ARCH__)
  return __clz(u);
#else
  return __builtin_clz(u);
#endif
}

static inline FP4_HD int fp4_isnan(float x) { return (fp4_f2u(x) & 0x7fffffffu) > 0x7f800000u; }

// Exact 2^n for n in [-149, 127] (subnormal below -126).
static inline FP4_HD float fp4_exp2i(int n) {
  return n >= -126 ? fp4_u2f((uint32_t)(n + 127) << 23) : fp4_u2f(1u << (n + 149));
}

// x * 2^n: exact unless the result is subnormal (then correctly rounded, the same on both sides).
static inline FP4_HD float fp4_ldexp(float x, int n) { return FP4_MUL(x, fp4_exp2i(n)); }

// a * b + c with one rounding: the C library's fmaf is correctly rounded, as the GPU's FFMA.
static inline FP4_HD float fp4_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return fmaf(a, b, c);
#endif
}

// floor(log2 a) and ceil(log2 a) of a positive finite float, exactly.
static inline FP4_HD int fp4_floor_log2(float a) {
  uint32_t u = fp4_f2u(a) & 0x7fffffffu;
  int be = (int)(u >> 23);
  return be ? be - 127 : (31 - fp4_clz(u)) - 149;
}
static inline FP4_HD int fp4_ceil_log2(float a) {
  uint32_t u = fp4_f2u(a) & 0x7fffffffu;
  int be = (int)(u >> 23);
  if (be) return be - 127 + ((u & 0x7fffffu) != 0);
  return (31 - fp4_clz(u)) - 149 + ((u & (u - 1)) != 0);
}

static inline FP4_HD int fp4_imin(int a, int b) { return a < b ? a : b; }
static inline FP4_HD int fp4_imax(int a, int b) { return a > b ? a : b; }
