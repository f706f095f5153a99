// fp4/hadamard.h: the fixed-sign Hadamard rotations of the FP4 recipes (docs/formats.md §2), as exact FP4_HD
// in-register transforms, plus CPU (hadamard.c) and CUDA (hadamard.cu) helpers that apply them to
// matrices in 16- or 32-blocks along a chosen dimension.
//
// Signs: D = diag(s_0..s_15), s_i = +1 where bit i of 0x2817 is set (LSB = index 0), else -1:
//   + + + - + - - - - - - + - + - -
// H32:  R32 = (1/sqrt 32) H32 D32 with D32 = diag(D, D) (the 16 signs on each half of 32), computed as
//       signs -> 16-point FWHT on each half -> one butterfly (u+v, u-v) combining the halves -> scale.
//       H is the Sylvester (natural-order) Hadamard matrix; R32 R32^T = I.
// H16:  R16 = (1/4) H16 D: signs -> 16-point FWHT -> scale by 1/4 (exact). Plain H16 (fp4_h16_plain):
//       (1/4) H16 without the signs.
// The butterflies are fixed-order fp32 adds and the scale one multiply by fl(1/sqrt(32)) (or 0.25),
// so CPU and GPU agree bit for bit.
//
// Matrix helpers (CPU, in place, fp32), block size n = 16 or 32:
//   fp4_hadamard_rows(x, rows, cols, n)  transforms each n-block of contiguous elements of each row
//   fp4_hadamard_cols(x, rows, cols, n)  transforms each n-block of rows of each column (the token
//                                        dimension of dY and X for Wgrad: x is [tokens, features])
#pragma once
#include "fp4/fp4_common.h"

#define FP4_HADAMARD_SIGNS 0x2817u
#define FP4_INV_SQRT32 0.17677669529663688f  // fl(1/sqrt(32))

static inline FP4_HD void fp4_fwht16(float *v) {
  FP4_UNROLL
  for (int h = 1; h < 16; h <<= 1) FP4_UNROLL
  for (int i = 0; i < 16; i++)
    if (!(i & h)) {
      float a = v[i], b = v[i + h];
      v[i] = FP4_ADD(a, b);
      v[i + h] = FP4_SUB(a, b);
    }
}

static inline FP4_HD void fp4_hadamard_signs16(float *v) {
  FP4_UNROLL
  for (int i = 0; i < 16; i++)
    if (!((FP4_HADAMARD_SIGNS >> i) & 1u)) v[i] = -v[i];
}

static inline FP4_HD void fp4_h16(float *v) {
  fp4_hadamard_signs16(v);
  fp4_fwht16(v);
  FP4_UNROLL
  for (int i = 0; i < 16; i++) v[i] = FP4_MUL(v[i], 0.25f);
}

// Plain H16: R16 = (1/4) H16, no sign flips (the paper's operand hybrid "plain H16" route).
static inline FP4_HD void fp4_h16_plain(float *v) {
  fp4_fwht16(v);
  FP4_UNROLL
  for (int i = 0; i < 16; i++) v[i] = FP4_MUL(v[i], 0.25f);
}

// The 16-point rotations by name, for producers that take either (fp4/nvfp4_cta.h).
enum { FP4_ROT_NONE = 0, FP4_ROT_H16 = 1, FP4_ROT_H16_PLAIN = 2 };
static inline FP4_HD void fp4_rotate16(float *v, int rot) {
  if (rot == FP4_ROT_H16) fp4_h16(v);
  else if (rot == FP4_ROT_H16_PLAIN) fp4_h16_plain(v);
}

static inline FP4_HD void fp4_h32(float *v) {
  fp4_hadamard_signs16(v);
  fp4_hadamard_signs16(v + 16);
  fp4_fwht16(v);
  fp4_fwht16(v + 16);
  FP4_UNROLL
  for (int i = 0; i < 16; i++) {
    float a = v[i], b = v[i + 16];
    v[i] = FP4_MUL(FP4_ADD(a, b), FP4_INV_SQRT32);
    v[i + 16] = FP4_MUL(FP4_SUB(a, b), FP4_INV_SQRT32);
  }
}

#ifdef __cplusplus
extern "C" {
#endif
void fp4_hadamard_rows(float *x, int rows, int cols, int n);
void fp4_hadamard_cols(float *x, int rows, int cols, int n);
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_runtime.h>
// In place on a device fp32 matrix, same semantics as the CPU helpers (down_columns = 0: the _rows
// variant, blocks along each row; 1: the _cols variant, blocks down each column). Async on cuda_stream().
void fp4_hadamard_cuda(float *x, int rows, int cols, int n, int down_columns);
#endif
