// tests/mx_near.h: MXFP4 test blocks of float values next to the thresholds of the E2M1 rules, shared by
// tests/unit/test_fp4_mx.c (the reference against the exact rule), tests/unit/test_quant_dev.cpp and
// tests/gpu/gpu_test_fp4_mx.cu (the producers' device forms against the reference).
//
// A threshold T is where a code changes for the exact y = 6 z / 2^e (docs/formats.md §1): RNE's 7 ties,
// SR's lo + (2 r + 1) / 512 of the step above every grid point lo for every random byte r, and the grid
// points themselves. Block (e, k) has v[0] = 2^e, which makes e its round-up scale exponent, then the 9
// floats within 4 ulps of fl(T 2^e / 6) (both signs): the values whose product 6 z 2^-e rounded to a
// float can land on T while the exact one does not.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp4/fp4_common.h"

enum { MX_NEAR_KINDS = 7 + 7 * 256 + 7 };  // k: RNE ties, SR thresholds (7 steps x 256 bytes), grid points

// Threshold k and the random byte that makes it one (0 for the RNE ties, any for the grid points).
static inline double mx_near_threshold(int k, uint32_t *r) {
  static const double ties[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0}, grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  if (k < 7) return *r = 0, ties[k];
  if (k < 7 + 7 * 256) {
    const int lo = (k - 7) % 7;
    *r = (uint32_t)(k - 7) / 7;
    return grid[lo] + (grid[lo + 1] - grid[lo]) * (2 * *r + 1) / 512.0;
  }
  *r = (uint32_t)k * 37u % 256u;
  return grid[k - (7 + 7 * 256) + 1];
}

// Block (e, k), e in [-127, 127]: v[32] as above (the rest 0) and rnd[8] with every byte r.
static inline void mx_near_block(int e, int k, float *v, uint32_t *rnd) {
  uint32_t r;
  const double T = mx_near_threshold(k, &r);
  memset(v, 0, 32 * sizeof(float));
  v[0] = fp4_exp2i(e);
  const uint32_t u = fp4_f2u((float)ldexp(T / 6.0, e));
  for (int d = -4; d <= 4; d++) v[5 + d] = fp4_u2f(u + (uint32_t)d), v[20 + d] = -v[5 + d];
  for (int i = 0; i < 8; i++) rnd[i] = r * 0x01010101u;
}
