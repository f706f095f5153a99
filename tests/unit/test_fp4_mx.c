// tests/unit/test_fp4_mx.c: the FP4 library's scalar codecs, Philox, fixed-sign Hadamard, MXFP4 quantizers
// and the FP8 embedding, on the CPU (the GPU test compares the CUDA producers to these byte for byte).
#include <math.h>
#include <stdlib.h>

#include "common/common.h"
#include "fp4/e2m1.h"
#include "fp4/fp8_embed.h"
#include "fp4/hadamard.h"
#include "fp4/mxfp4.h"
#include "fp4/philox.h"
#include "tests/mx_near.h"
#include "tests/test.h"

static uint8_t code_at(const uint8_t *codes, size_t i) { return (i & 1) ? codes[i / 2] >> 4 : codes[i / 2] & 15; }

static void test_e2m1(void) {
  TEST_SECTION("E2M1 table, ties, saturation, SR");
  const float table[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  int ok = 1;
  for (int c = 0; c < 16; c++) {
    float v = e2m1_decode((uint8_t)c), want = (c & 8) ? -table[c & 7] : table[c & 7];
    ok &= v == want && (signbit(v) != 0) == ((c & 8) != 0);
    ok &= e2m1_encode_rne(v) == c && e2m1_encode_sr(v, 0) == c && e2m1_encode_sr(v, 255) == c;
  }
  CHECK(ok, "decode of all 16 codes, and encode(decode(c)) == c");
  const float tie[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}, to[7] = {0, 1, 1, 2, 2, 4, 4};
  for (int i = 0; i < 7; i++) {
    CHECK(e2m1_decode(e2m1_encode_rne(tie[i])) == to[i], "tie %g -> %g", tie[i], e2m1_decode(e2m1_encode_rne(tie[i])));
    CHECK(e2m1_decode(e2m1_encode_rne(-tie[i])) == -to[i], "tie %g", -tie[i]);
    // just off the tie goes to the nearer neighbour
    CHECK(e2m1_decode(e2m1_encode_rne(nextafterf(tie[i], 10))) > to[i] || to[i] > tie[i], "above tie %g", tie[i]);
  }
  CHECK(e2m1_encode_rne(7.0f) == 7 && e2m1_encode_rne(1e30f) == 7 && e2m1_encode_rne(INFINITY) == 7, "saturate +6");
  CHECK(e2m1_encode_rne(-7.0f) == 15 && e2m1_encode_rne(-INFINITY) == 15, "saturate -6");
  CHECK(e2m1_encode_rne(NAN) == 0 && e2m1_encode_sr(NAN, 3) == 0, "NaN -> code 0");
  CHECK(e2m1_encode_rne(-0.1f) == 8, "small negatives keep the sign (-0)");
  CHECK(e2m1_encode_sr(6.5f, 0) == 7 && e2m1_encode_sr(-100.0f, 255) == 15, "SR saturates");

  // SR: the mean of many draws equals the input (up to the 8-bit resolution bound, 1/512 of a step).
  const float xs[6] = {0.3f, 1.1f, 1.8f, 2.7f, 4.9f, -3.3f}, step[6] = {0.5f, 0.5f, 0.5f, 1, 2, 1};
  PhiloxStream s = philox_stream(42, 7, 0, 3, 1);
  const int n = 1 << 16;
  for (int t = 0; t < 6; t++) {
    double sum = 0;
    uint32_t w[4];
    for (int i = 0; i < n; i++) {
      if (i % 16 == 0) philox_group16(s, (uint64_t)t * n / 16 + i / 16, w);
      sum += e2m1_decode(e2m1_encode_sr(xs[t], philox_byte(w, i % 16)));
    }
    double mean = sum / n, sigma = step[t] * 0.5 / sqrt(n);  // Bernoulli std <= step/2
    CHECK(fabs(mean - xs[t]) <= 5 * sigma + step[t] / 512, "SR mean %.6f vs %g (5 sigma %.2e)", mean, xs[t], 5 * sigma);
  }
}

static void test_scales(void) {
  TEST_SECTION("E8M0 and E4M3 bytes");
  int ok = 1;
  for (int b = 0; b < 255; b++) ok &= e8m0_decode((uint8_t)b) == ldexpf(1.0f, b - 127) && e8m0_encode(b - 127) == b;
  CHECK(ok, "E8M0: 255 finite bytes decode to 2^(b-127) and re-encode");
  CHECK(isnan(e8m0_decode(0xFF)), "E8M0 0xFF is NaN");
  CHECK(e8m0_encode(-200) == 0 && e8m0_encode(200) == 254, "E8M0 clamps to [-127, 127]");
  ok = 1;
  int nan = 0;
  for (int b = 0; b < 256; b++) {
    int e = (b >> 3) & 15, m = b & 7;
    float want = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + m / 8.0f, e - 7);
    if (b & 0x80) want = -want;
    float v = e4m3_decode((uint8_t)b);
    if ((b & 0x7F) == 0x7F) {
      nan += isnan(v) != 0;
      continue;
    }
    ok &= v == want && e4m3_encode_rne(v) == b;
  }
  CHECK(ok, "E4M3: 254 finite bytes decode by formula and re-encode");
  CHECK(nan == 2, "E4M3 0x7F and 0xFF are NaN");
  CHECK(e4m3_decode(0x7E) == 448 && e4m3_encode_rne(500) == 0x7E && e4m3_encode_rne(INFINITY) == 0x7E &&
            e4m3_encode_rne(-1e9f) == 0xFE && e4m3_encode_rne(NAN) == 0x7F,
        "E4M3 saturation to 448 and NaN");
  CHECK(e4m3_encode_rne(1.0625f) == 0x38 && e4m3_encode_rne(1.1875f) == 0x3A, "E4M3 normal ties to even");
  CHECK(e4m3_encode_rne(ldexpf(1, -10)) == 0 && e4m3_encode_rne(ldexpf(3, -10)) == 2 &&
            e4m3_encode_rne(ldexpf(15, -10)) == 8,
        "E4M3 subnormal ties to even (and the carry into 2^-6)");
}

static void test_philox(void) {
  TEST_SECTION("Philox4x32-10");
  uint32_t o[4];
  const uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
  philox4x32_10(c0, k0, o);
  CHECK(o[0] == 0x6627e8d5u && o[1] == 0xe169c58du && o[2] == 0xbc57ac4cu && o[3] == 0x9b00dbd8u, "KAT zero");
  const uint32_t c1[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, k1[2] = {0xa4093822u, 0x299f31d0u};
  philox4x32_10(c1, k1, o);
  CHECK(o[0] == 0xd16cfe09u && o[1] == 0x94fdccebu && o[2] == 0x5001e420u && o[3] == 0x24126ea1u, "KAT pi");
  PhiloxStream s = philox_stream(0x123456789abcdefull, 5, 2, 9, 4);
  CHECK(s.key[0] == 0x89abcdefu && s.key[1] == 0x01234567u && s.step == 5 && s.micro == 2 && s.tag == ((9u << 16) | 4),
        "stream layout (key = seed, counter = (group, micro, step, layer<<16|tensor))");
  philox_group16(s, 77, o);
  uint32_t ctr[4] = {77, 2, 5, (9u << 16) | 4}, o2[4];
  philox4x32_10(ctr, s.key, o2);
  CHECK(o[0] == o2[0] && o[3] == o2[3] && philox_byte(o, 5) == ((o[1] >> 8) & 255), "group16 and byte mapping");
}

static void test_hadamard(void) {
  TEST_SECTION("fixed-sign Hadamard");
  const int sg[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  int ok = 1;
  for (int i = 0; i < 16; i++) ok &= (((FP4_HADAMARD_SIGNS >> i) & 1) ? 1 : -1) == sg[i];
  CHECK(ok && FP4_HADAMARD_SIGNS == 0x2817, "sign literal 0x2817 = + + + - + - - - - - - + - + - -");
  // H32 of basis vector e_j: entries s_(j%16) (-1)^popcount(i&j) / sqrt(32), exactly.
  static double R[32][32];
  ok = 1;
  for (int j = 0; j < 32; j++) {
    float v[32] = {0};
    v[j] = 1;
    fp4_h32(v);
    for (int i = 0; i < 32; i++) {
      float want = (float)(sg[j % 16] * ((__builtin_popcount(i & j) & 1) ? -1 : 1)) * FP4_INV_SQRT32;
      ok &= v[i] == want;
      R[i][j] = v[i];
    }
  }
  CHECK(ok, "H32 of every basis vector is +-fl(1/sqrt 32) with the expected signs");
  double worst = 0;
  for (int i = 0; i < 32; i++)
    for (int j = 0; j < 32; j++) {
      double d = 0;
      for (int k = 0; k < 32; k++) d += R[i][k] * R[j][k];
      worst = fmax(worst, fabs(d - (i == j)));
    }
  CHECK(worst < 1e-6, "R R^T = I (worst deviation %.2e)", worst);
  ok = 1;
  for (int j = 0; j < 16; j++) {
    float v[16] = {0};
    v[j] = 1;
    fp4_h16(v);
    for (int i = 0; i < 16; i++) ok &= v[i] == 0.25f * sg[j] * ((__builtin_popcount(i & j) & 1) ? -1 : 1);
  }
  CHECK(ok, "H16 of every basis vector is +-1/4 with the expected signs");
  Rng rng;
  rng_seed(&rng, 3);
  float a[32], b[32];
  double ab = 0, RaRb = 0, scale = 0;
  for (int i = 0; i < 32; i++) a[i] = rng_normal(&rng), b[i] = rng_normal(&rng), ab += (double)a[i] * b[i];
  for (int i = 0; i < 32; i++) scale += fabs((double)a[i] * b[i]);
  fp4_h32(a);
  fp4_h32(b);
  for (int i = 0; i < 32; i++) RaRb += (double)a[i] * b[i];
  CHECK(fabs(RaRb - ab) <= 1e-5 * scale, "(Ra).(Rb) = %.7f vs a.b = %.7f", RaRb, ab);
  // The matrix helpers: _cols on X equals _rows on X^T.
  float x[64 * 3], xt[3 * 64];
  for (int i = 0; i < 64 * 3; i++) x[i] = rng_normal(&rng);
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < 3; c++) xt[c * 64 + r] = x[r * 3 + c];
  fp4_hadamard_cols(x, 64, 3, 32);
  fp4_hadamard_rows(xt, 3, 64, 32);
  ok = 1;
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < 3; c++) ok &= x[r * 3 + c] == xt[c * 64 + r];
  CHECK(ok, "hadamard_cols(X) == hadamard_rows(X^T)^T");
}

static void test_mx_blocks(void) {
  TEST_SECTION("MXFP4 blocks: scales, rounding, specials");
  float x[4 * 32] = {0};
  uint8_t c[4 * 16], s[4];
  PhiloxStream ps = philox_stream(1, 0, 0, 0, 0);
  for (int i = 0; i < 32; i++) x[i] = 3.0f * (i - 16) / 16.0f;  // amax 3 (x[0] = -3)
  x[32 + 5] = 4.0f;                                             // amax exactly a power of two
  x[32 + 6] = 1.0f;
  x[64 + 1] = nanf("");
  x[96 + 2] = INFINITY;
  x[96 + 3] = 2.0f;
  mx_quantize_rows(x, 4, 32, MX_SCALE_UP, MX_RNE, ps, c, s);
  CHECK(s[0] == 127 + 2, "round-up: amax 3 -> 2^2 (byte %d)", s[0]);
  CHECK(code_at(c, 0) == 0xE, "-3 -> 6*(-3)/4 = -4.5 -> -4 (code 0xE), got %x", code_at(c, 0));
  CHECK(s[1] == 127 + 2 && code_at(c, 32 + 5) == 7 && code_at(c, 32 + 6) == 3 && code_at(c, 33) == 0,
        "amax 4 = 2^2 exactly: 4 -> 6, 1 -> 1.5, 0 -> 0");
  CHECK(s[2] == 0xFF && code_at(c, 64 + 1) == 0 && code_at(c, 64) == 0, "NaN block: scale 0xFF, zero codes");
  CHECK(s[3] == 254 && code_at(c, 96 + 2) == 7 && code_at(c, 96 + 3) == 0, "Inf block: scale 2^127, Inf -> 6");
  float d[4 * 32];
  mx_dequantize(c, s, 4, 32, MX_SCALE_UP, d);
  CHECK(d[32 + 5] == 4.0f && d[32 + 6] == 1.0f && isnan(d[64 + 7]), "dequant q*2^e/6: 6*4/6 = 4, 1.5*4/6 = 1, NaN");
  CHECK(d[0] == -4 * 4 / 6.0f, "dequant -4*4/6 = %g", d[0]);

  // Round-down (OCP): amax 3 -> 2^(1-2) = 0.5, 3/0.5 = 6; amax 4 -> 2^0; amax 7 -> 2^0 and 7 clips to 6.
  float y[3 * 32] = {0};
  y[0] = 3, y[1] = 1.1f, y[32] = 4, y[64] = 7, y[65] = -5;
  mx_quantize_rows(y, 3, 32, MX_SCALE_DOWN, MX_RNE, ps, c, s);
  CHECK(s[0] == 126 && s[1] == 127 && s[2] == 127, "round-down scales %d %d %d", s[0], s[1], s[2]);
  CHECK(code_at(c, 0) == 7 && code_at(c, 1) == 4 && code_at(c, 64) == 7 && code_at(c, 65) == 0xE,
        "round-down codes: 3/0.5=6, 1.1/0.5=2.2->2, 7 clips to 6, -5 -> -4 (tie)");
  mx_dequantize(c, s, 3, 32, MX_SCALE_DOWN, d);
  CHECK(d[0] == 3 && d[64] == 6 && d[65] == -4, "round-down dequant q*2^e");

  // Zero and subnormal blocks.
  float z[2 * 32] = {0};
  z[32] = ldexpf(1, -140);
  mx_quantize_rows(z, 2, 32, MX_SCALE_UP, MX_RNE, ps, c, s);
  CHECK(s[0] == 0 && c[0] == 0 && s[1] == 0, "zero block and 2^-140 amax clamp to e = -127");

  // Random blocks: |dequant - x| <= 2^e/6 (half the largest E2M1 step, 2, in units of 2^e/6).
  Rng rng;
  rng_seed(&rng, 11);
  enum { R = 7, K = 96 };
  float *v = xmalloc(R * K * 4), *dv = xmalloc(R * K * 4);
  uint8_t *cq = xmalloc(R * K / 2), *sq = xmalloc(R * K / 32);
  for (int i = 0; i < R * K; i++) v[i] = rng_normal(&rng) * ldexpf(1, (i / 32) % 9 - 4);
  mx_quantize_rows(v, R, K, MX_SCALE_UP, MX_RNE, ps, cq, sq);
  mx_dequantize(cq, sq, R, K, MX_SCALE_UP, dv);
  int ok = 1;
  for (int i = 0; i < R * K; i++) ok &= fabsf(dv[i] - v[i]) <= ldexpf(1, sq[i / 32] - 127) / 6 * 1.0001f;
  CHECK(ok, "round-up error bound");
  // SR row copy: reproducible by seed and counter, different for another step, and unbiased overall.
  uint8_t *c2 = xmalloc(R * K / 2), *c3 = xmalloc(R * K / 2), *s2 = xmalloc(R * K / 32);
  mx_quantize_rows(v, R, K, MX_SCALE_UP, MX_SR, philox_stream(42, 3, 0, 1, 2), cq, sq);
  mx_quantize_rows(v, R, K, MX_SCALE_UP, MX_SR, philox_stream(42, 3, 0, 1, 2), c2, s2);
  mx_quantize_rows(v, R, K, MX_SCALE_UP, MX_SR, philox_stream(42, 4, 0, 1, 2), c3, s2);
  int same = memcmp(cq, c2, R * K / 2) == 0, diff = 0;
  for (int i = 0; i < R * K; i++) diff += code_at(cq, i) != code_at(c3, i);
  CHECK(same, "SR is reproducible by (seed, step, layer, tensor)");
  CHECK(diff > R * K / 10, "SR differs for another step (%d of %d codes)", diff, R * K);
  CHECK(memcmp(sq, s2, R * K / 32) == 0, "SR never changes the scales");
  free(v), free(dv), free(cq), free(sq), free(c2), free(c3), free(s2);
}

static void test_weights_and_cols(void) {
  TEST_SECTION("weights 32x32 tiles (0.87 rule, W and W^T), column copies");
  enum { N = 64, K = 96 };
  float *w = xmalloc(N * K * 4), *wt = xmalloc(N * K * 4);
  Rng rng;
  rng_seed(&rng, 5);
  for (int i = 0; i < N * K; i++) w[i] = 0.02f * rng_normal(&rng);
  // Tile (0,0): amax 0.8 -> 2^0 by round-up; 0.8 < 0.87 -> 2^-1 with the rule. Tile (0,1): amax 0.9.
  for (int i = 0; i < 32; i++)
    for (int j = 0; j < 64; j++) w[i * K + j] = 0.1f;
  w[3 * K + 4] = 0.8f, w[3 * K + 5] = -0.7f, w[5 * K + 40] = 0.9f;
  uint8_t *c = xmalloc(N * K / 2), *s = xmalloc(N * K / 32), *ct = xmalloc(N * K / 2), *st = xmalloc(N * K / 32);
  mx_quantize_weight(w, N, K, MX_SCALE_UP, 0, c, s, NULL, NULL);
  CHECK(s[0] == 127 && s[1] == 127, "no rule: tile scales 2^0 (%d, %d)", s[0], s[1]);
  mx_quantize_weight(w, N, K, MX_SCALE_UP, 1, c, s, ct, st);
  CHECK(s[0] == 126 && s[1] == 127 && s[31 * (K / 32)] == 126, "0.87 rule: 0.8 -> 2^-1, 0.9 -> 2^0, shared by 32 rows");
  CHECK(code_at(c, 3 * K + 4) == 7 && code_at(c, 3 * K + 5) == 15, "0.87 rule clips 6*0.8*2 = 9.6 and -8.4 to +-6");
  int ok = 1;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++)
      ok &= code_at(c, (size_t)n * K + k) == code_at(ct, (size_t)k * N + n) &&
            s[n * (K / 32) + k / 32] == st[k * (N / 32) + n / 32];
  CHECK(ok, "W and W^T carry identical codes and scales");
  // Column copy == row copy of the transpose (after the H32 along rows when asked).
  for (int i = 0; i < N * K; i++) w[i] = rng_normal(&rng);
  for (int h = 0; h < 2; h++) {
    float *x = xmalloc(N * K * 4);
    memcpy(x, w, N * K * 4);
    if (h) fp4_hadamard_cols(x, N, K, 32);
    for (int n = 0; n < N; n++)
      for (int k = 0; k < K; k++) wt[k * N + n] = x[n * K + k];
    mx_quantize_rows(wt, K, N, MX_SCALE_UP, MX_RNE, philox_stream(0, 0, 0, 0, 0), c, s);
    mx_quantize_cols(w, N, K, h, MX_SCALE_UP, ct, st);
    CHECK(memcmp(c, ct, N * K / 2) == 0 && memcmp(s, st, N * K / 32) == 0, "column copy (hadamard %d)", h);
    free(x);
  }
  free(w), free(wt), free(c), free(s), free(ct), free(st);
}

static void test_embed(void) {
  TEST_SECTION("FP8 embedding");
  enum { R = 5, K = 288 };  // 2 full 128-groups and a partial one
  Rng rng;
  rng_seed(&rng, 9);
  float *x = xmalloc(R * K * 4);
  for (int i = 0; i < R * K; i++) x[i] = rng_normal(&rng) * ldexpf(1, (int)(rng_u64(&rng) % 15) - 7);  // spread <= 14
  uint8_t *c = xmalloc(R * K / 2), *s = xmalloc(R * K / 32), *f = xmalloc(R * K);
  float *sc = xmalloc(mx_vec128_scale_count(R, K) * 4);
  mx_quantize_rows(x, R, K, MX_SCALE_UP, MX_RNE, philox_stream(0, 0, 0, 0, 0), c, s);
  mx_embed_vec128(c, s, R, K, 1.0f, f, sc);
  int exact = 1;
  for (int r = 0; r < R; r++)
    for (int k = 0; k < K; k++) {
      size_t i = (size_t)r * K + k;
      float q2e = ldexpf(e2m1_decode(code_at(c, i)), s[i / 32] - 127);
      exact &= e4m3_decode(f[i]) * sc[(k / 128) * R + r] == q2e;
    }
  CHECK(exact, "VEC128: E4M3 * scale == q * 2^e bit for bit when the spread is <= 14");
  int same = 1;
  for (int code = 0; code < 16; code++)
    for (int d = -40; d <= 6; d++)  // mx_embed_value's bit construction == the general RNE encoder
      same &= mx_embed_value((uint8_t)code, (uint8_t)(127 + d - 6 + 3), 3) ==
              e4m3_encode_rne(ldexpf(e2m1_decode((uint8_t)code), d));
  CHECK(same, "mx_embed_value == e4m3_encode_rne(q * 2^d) for all 16 codes, d in [-40, 6]");
  mx_embed_vec128(c, s, R, K, 1.0f / 6, f, sc);
  int Et = 0;
  for (int b = 0; b < 4; b++) Et = s[b] - 127 > Et || b == 0 ? s[b] - 127 : Et;
  CHECK(sc[0] == (float)(ldexp(1, Et - 6) / 6), "scale_mul 1/6 gives the probe's fl(2^(Et-6)/6)");
  // Spread > 14: block 1 is 2^-20 of block 0. Error within 2^(Et-16) in q*2^e units.
  float y[128] = {0};
  for (int i = 0; i < 32; i++) y[i] = 1.0f, y[32 + i] = ldexpf(1.0f + i / 40.0f, -20), y[64 + i] = ldexpf(1, -9);
  uint8_t cy[64], sy[4], fy[128];
  float scy;
  mx_quantize_rows(y, 1, 128, MX_SCALE_UP, MX_RNE, philox_stream(0, 0, 0, 0, 0), cy, sy);
  mx_embed_vec128(cy, sy, 1, 128, 1.0f, fy, &scy);
  double worst = 0;
  int inexact = 0;
  for (int i = 0; i < 128; i++) {
    double want = ldexp(e2m1_decode(code_at(cy, i)), sy[i / 32] - 127), got = e4m3_decode(fy[i]) * (double)scy;
    inexact += want != got;
    worst = fmax(worst, fabs(want - got));
  }
  CHECK(inexact > 0 && worst <= ldexp(1, 0 - 16), "spread 20: %d inexact, worst error %.3g <= 2^(Et-16)", inexact,
        worst);
  CHECK(worst < ldexp(1, -17) * 6, "and below 2^-17 of the group max (6 * 2^Et)");
  // BLK128x128 for weights: 160 x 256 (one partial row tile), padding scales zero.
  enum { N = 160, KW = 256 };
  float *w = xmalloc(N * KW * 4);
  for (int i = 0; i < N * KW; i++) w[i] = 0.02f * rng_normal(&rng) * ((i / KW) % 37 == 0 ? 50 : 1);
  uint8_t *cw = xmalloc(N * KW / 2), *swq = xmalloc(N * KW / 32), *fw = xmalloc(N * KW);
  float *sw = xmalloc(mx_blk128_scale_count(N, KW) * 4);
  mx_quantize_weight(w, N, KW, MX_SCALE_UP, 1, cw, swq, NULL, NULL);
  mx_embed_blk128(cw, swq, N, KW, 1.0f, fw, sw);
  int L4 = mx_blk128_l4(KW);
  exact = 1;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < KW; k++) {
      size_t i = (size_t)n * KW + k;
      exact &=
          e4m3_decode(fw[i]) * sw[(n / 128) * L4 + k / 128] == ldexpf(e2m1_decode(code_at(cw, i)), swq[i / 32] - 127);
    }
  CHECK(mx_blk128_scale_count(N, KW) == 8 && L4 == 4, "BLK128x128 scale count (2 tiles x L4 4)");
  CHECK(exact, "BLK128x128: E4M3 * scale == q * 2^e for weights");
  CHECK(sw[2] == 0 && sw[3] == 0 && sw[6] == 0, "BLK128x128 padding scales are 0");
  // NaN block embeds as E4M3 NaN and does not set the group exponent.
  y[40] = nanf("");
  mx_quantize_rows(y, 1, 128, MX_SCALE_UP, MX_RNE, philox_stream(0, 0, 0, 0, 0), cy, sy);
  mx_embed_vec128(cy, sy, 1, 128, 1.0f, fy, &scy);
  CHECK(fy[33] == 0x7F && scy == ldexpf(1, 0 - 6), "NaN block -> 0x7F, scale from the finite blocks");
  free(x), free(c), free(s), free(f), free(sc), free(w), free(cw), free(swq), free(fw), free(sw);
}

// ---- The bit-level codecs against their definitions -------------------------------------------------
// The producers' E2M1 rounding (e2m1.h) and FP8 embedding tables (fp8_embed.h) are integer tricks on
// float bits. These are the plain definitions they replace, written as comparisons, and the checks
// that the two agree: in CI on every float in [2^-10, 8] (every threshold of the E2M1 grid with all
// its neighbours; below 2^-10 all codes are 0 and SR never rounds up) plus 10M random bit patterns
// (2 s); with FP4_EXHAUSTIVE=1 in the environment over all 2^32 patterns (~20 s, opt-in).
static uint8_t spec_rne(float x) {
  uint32_t s = (fp4_f2u(x) >> 28) & 0x8u;
  float a = fabsf(x);  // NaN compares false everywhere -> magnitude 0
  uint32_t m = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return (uint8_t)(s | m);
}

// Round up iff (|x| - lo) / (hi - lo) * 512 > 2 r8 + 1, every step exact (see e2m1.h).
static uint8_t spec_sr(float x, uint32_t r8) {
  uint32_t s = (fp4_f2u(x) >> 28) & 0x8u;
  float a = fabsf(x);
  if (!(a < 6.0f)) return (uint8_t)(isnan(a) ? 0u : (s | 7u));
  uint32_t lo = (a >= 0.5f) + (a >= 1.0f) + (a >= 1.5f) + (a >= 2.0f) + (a >= 3.0f) + (a >= 4.0f);
  float step = lo < 4 ? 0.5f : (lo < 6 ? 1.0f : 2.0f);
  uint32_t up = (a - e2m1_decode((uint8_t)lo)) / step * 512.0f > (float)(2u * r8 + 1u);
  return (uint8_t)(s | (lo + up));
}

static void test_codec_bits(void) {
  TEST_SECTION("bit-level E2M1 RNE/SR == comparison definitions");
  const int full = getenv("FP4_EXHAUSTIVE") && atoi(getenv("FP4_EXHAUSTIVE"));
  const uint64_t lo = full ? 0 : 0x3A800000u, hi = full ? 0xFFFFFFFFu : 0x41000000u;  // [2^-10, 8]
  long bad_rne = 0, bad_sr = 0, n = 0;
  for (uint64_t u = lo; u <= hi; u++, n++) {
    float x = fp4_u2f((uint32_t)u);
    uint32_t r = (uint32_t)((u * 0x9E3779B97F4A7C15ull) >> 56);  // a different r8 per pattern
    bad_rne += e2m1_encode_rne(x) != spec_rne(x) || e2m1_encode_rne(-x) != spec_rne(-x);
    bad_sr += e2m1_encode_sr(x, r) != spec_sr(x, r);
  }
  CHECK(bad_rne == 0 && bad_sr == 0, "%s: %ld RNE and %ld SR mismatches in %ld patterns",
        full ? "all 2^32" : "[2^-10, 8]", bad_rne, bad_sr, n);
  Rng rng;
  rng_seed(&rng, 5);
  bad_rne = bad_sr = 0;
  for (int i = 0; i < 10000000; i++) {
    uint64_t w = rng_u64(&rng);
    float x = fp4_u2f((uint32_t)w);
    uint32_t r = (uint32_t)(w >> 32) & 255u;
    bad_rne += e2m1_encode_rne(x) != spec_rne(x);
    bad_sr += e2m1_encode_sr(x, r) != spec_sr(x, r);
  }
  CHECK(bad_rne == 0 && bad_sr == 0, "10M random patterns: %ld RNE, %ld SR mismatches", bad_rne, bad_sr);
  // SR for all 256 r8 at every threshold a grid step can have (multiples of 2^-11 in [0, 8)) +-3 ulps.
  bad_sr = 0;
  for (uint32_t r = 0; r < 256; r++)
    for (int k = 0; k < 8 * 2048; k++)
      for (int d = -3; d <= 3; d++) {
        if (k == 0 && d < 0) continue;
        float x = fp4_u2f(fp4_f2u((float)k / 2048.0f) + (uint32_t)d);
        bad_sr += e2m1_encode_sr(x, r) != spec_sr(x, r) || e2m1_encode_sr(-x, r) != spec_sr(-x, r);
      }
  CHECK(bad_sr == 0, "SR at every threshold for every r8: %ld mismatches", bad_sr);
}

// mx_quantize_block32 (|z| prescale, magnitude + sign) against the per-element definition.
static void test_block_equivalence(void) {
  TEST_SECTION("mx_quantize_block32 == per-element definition");
  Rng rng;
  rng_seed(&rng, 77);
  long bad = 0, blocks = 0;
  for (int t = 0; t < 40000; t++) {
    float v[32];
    int ex = (int)(rng_u64(&rng) % 300) - 150;  // block magnitudes 2^-150 .. 2^150 (subnormal to Inf)
    for (int i = 0; i < 32; i++) {
      uint64_t w = rng_u64(&rng);
      v[i] = ldexpf(rng_normal(&rng), ex);
      if (w % 17 == 0) v[i] = ldexpf((float)(w >> 40 & 15) * 0.25f, ex);  // grid points and ties
      if (w % 97 == 0) v[i] = -0.0f;
    }
    if (t % 1000 == 1) v[t % 32] = INFINITY;
    MxScale mode = t & 1 ? MX_SCALE_DOWN : MX_SCALE_UP;
    int sr = (t >> 1) & 1;
    uint32_t rnd[8], pk[4];
    for (int i = 0; i < 8; i++) rnd[i] = (uint32_t)rng_u64(&rng);
    uint8_t b = mx_quantize_block32(v, mode, sr, rnd, pk);
    uint32_t am = 0;
    for (int i = 0; i < 32; i++) am = mx_abs_bits(v[i]) > am ? mx_abs_bits(v[i]) : am;
    int e = mx_scale_exp(fp4_u2f(am), mode);
    for (int i = 0; i < 32; i++) {
      float x = mx_prescale(v[i], e, mode);
      uint8_t want = sr ? spec_sr(x, (rnd[i / 4] >> (8 * (i % 4))) & 255u) : spec_rne(x);
      bad += mx_code_of(pk, i) != want;
    }
    bad += b != e8m0_encode(e);
    blocks++;
  }
  CHECK(bad == 0, "%ld mismatches over %ld random blocks (RNE/SR, up/down, 2^-150..2^150, Inf)", bad, blocks);
}

static void test_embed_lut(void) {
  TEST_SECTION("FP8 embedding tables == mx_embed_value");
  long bad = 0, n = 0;
  for (int b = 0; b < 256; b++)
    for (int Et = -127; Et <= 127; Et++) {
      if (b != 0xFF && (int)b - 127 > Et) continue;  // Et is the group max: never below a block's e
      MxEmbedLut L = mx_embed_lut((uint8_t)b, Et);
      for (uint32_t k = 0; k < 16 + 64; k++) {  // all 16 codes in every byte, then mixed selectors
        uint32_t sel = k < 16 ? k * 0x1111u : (k * 0x9E37u) & 0xFFFFu, w = mx_embed_lookup4(L, sel);
        for (int j = 0; j < 4; j++, n++)
          bad += ((w >> (8 * j)) & 255u) != mx_embed_value((uint8_t)((sel >> (4 * j)) & 15u), (uint8_t)b, Et);
      }
    }
  CHECK(bad == 0, "%ld mismatches in %ld (scale byte, group exponent, code) lookups", bad, n);
}

// ---- MXFP4 against the exact rule (issue 32 point 3) --------------------------------------------------
// q = Q_E2M1(6 z / s_b) (UP) or Q_E2M1(z / s_b) (DOWN) of the exact quotient, in double: |z| 2^-e * 6 is
// exact there (24 + 2 significant bits, exponents far inside double's range); RNE counts the thresholds
// (docs/formats.md §1), SR compares (y - lo) / step * 512 with 2 r + 1 (y - lo is exact: y < 0.5 has
// lo = 0, and y >= 0.5 has its last bit at 2^-26 or above).
static uint8_t exact_code(float z, int e, MxScale mode, int sr, uint32_t r) {
  const double y = fabs((double)z) * ldexp(mode == MX_SCALE_UP ? 6.0 : 1.0, -e);
  static const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  uint32_t m;
  if (!sr) {
    m = (y > 0.25) + (y >= 0.75) + (y > 1.25) + (y >= 1.75) + (y > 2.5) + (y >= 3.5) + (y > 5.0);
  } else if (y >= 6.0) {
    m = 7;
  } else {
    m = 0;
    while (m < 6 && y >= grid[m + 1]) m++;
    m += (y - grid[m]) / (grid[m + 1] - grid[m]) * 512.0 > 2.0 * r + 1.0;
  }
  return (uint8_t)((signbit(z) ? 8u : 0u) | m);
}

// The block exponent from the amax by frexp: UP ceil(log2 a), DOWN floor(log2 a) - 2, clamped.
static int exact_exp(float amax, MxScale mode) {
  if (!(amax > 0.0f)) return -127;
  if (isinf(amax)) return 127;
  int k;
  double m = frexp(amax, &k);  // amax = m 2^k, m in [0.5, 1)
  int e = mode == MX_SCALE_UP ? (m == 0.5 ? k - 1 : k) : k - 1 - 2;
  return e < -127 ? -127 : e > 127 ? 127 : e;
}

// The rule before the fix: 6 z 2^-e rounded to nearest as a float, then the E2M1 rounding of that.
static float rounded_prescale(float z, int e) { return fp4_ldexp(z, -e) * 6.0f; }

// Quantizes the block v under (mode, sr, all random bytes = r) and counts the codes that differ from
// exact_code (bad) and, for UP, those the rounded prescale would have got wrong (old).
static void check_block(const float *v, MxScale mode, int sr, uint32_t r, long *bad, long *old) {
  uint32_t rnd[8], pk[4], am = 0;
  for (int i = 0; i < 8; i++) rnd[i] = r * 0x01010101u;
  uint8_t b = mx_quantize_block32(v, mode, sr, rnd, pk);
  for (int i = 0; i < 32; i++) am = mx_abs_bits(v[i]) > am ? mx_abs_bits(v[i]) : am;
  int e = exact_exp(fp4_u2f(am), mode);
  *bad += b != e8m0_encode(e);
  for (int i = 0; i < 32; i++) {
    uint8_t want = exact_code(v[i], e, mode, sr, r);
    *bad += mx_code_of(pk, i) != want;
    if (mode == MX_SCALE_UP && old) {
      float y = rounded_prescale(fabsf(v[i]), e);
      uint32_t m = sr ? e2m1_sr_mag(fp4_f2u(y), r) : e2m1_rne_mag(fp4_f2u(y));
      *old += (m | (signbit(v[i]) ? 8u : 0u)) != want;
    }
  }
}

static void test_exact_quotient(void) {
  TEST_SECTION("MXFP4 codes == Q_E2M1(6 z / s_b) of the exact quotient, float inputs");
  // The example: z = 0x3d955555 at e = -2 (amax 0.25): 6 z 2^2 = 1.74999994 -> code 3, where the
  // product rounded to a float is the tie 1.75 (code 4). Through the row, weight and column quantizers.
  const float z = fp4_u2f(0x3d955555u);
  CHECK(rounded_prescale(z, -2) == 1.75f && e2m1_rne_mag(fp4_f2u(1.75f)) == 4, "the rounded product is the tie 1.75");
  CHECK(exact_code(z, -2, MX_SCALE_UP, 0, 0) == 3, "the exact rule gives code 3");
  float v[32 * 32] = {0};
  uint8_t c[32 * 16], s[32];
  v[0] = 0.25f, v[1] = z, v[2] = -z;
  mx_quantize_rows(v, 1, 32, MX_SCALE_UP, MX_RNE, philox_stream(0, 0, 0, 0, 0), c, s);
  CHECK(s[0] == 127 - 2 && code_at(c, 1) == 3 && code_at(c, 2) == 0xB, "rows: scale %d, codes %x %x, want 125, 3, B",
        s[0], code_at(c, 1), code_at(c, 2));
  memset(v, 0, sizeof v);
  v[0] = 0.25f, v[5 * 32 + 7] = z, v[7] = 0.25f;  // tile (weights) and column 7 (cols) both have amax 0.25
  mx_quantize_weight(v, 32, 32, MX_SCALE_UP, 0, c, s, NULL, NULL);
  CHECK(s[5] == 125 && code_at(c, 5 * 32 + 7) == 3, "weight tile: code %x, want 3", code_at(c, 5 * 32 + 7));
  mx_quantize_cols(v, 32, 32, 0, MX_SCALE_UP, c, s);
  CHECK(s[7] == 125 && code_at(c, 7 * 32 + 5) == 3, "column copy: code %x, want 3", code_at(c, 7 * 32 + 5));

  // Targeted: the floats next to every threshold of the rules, every exponent e (tests/mx_near.h),
  // each block under RNE and SR (every random byte the threshold's r).
  long bad = 0, old = 0, n = 0;
  for (int e = -127; e <= 127; e++)
    for (int k = 0; k < MX_NEAR_KINDS; k++)
      for (int sr = 0; sr < 2; sr++) {
        float b[32];
        uint32_t rnd[8];
        mx_near_block(e, k, b, rnd);
        check_block(b, MX_SCALE_UP, sr, rnd[0] & 255u, &bad, &old);
        n += 32;
      }
  CHECK(bad == 0, "near every threshold, every e in [-127, 127]: %ld of %ld codes differ from the exact rule", bad, n);
  CHECK(old > 0, "the search reaches the cases the rounded product got wrong (%ld of them)", old);
  printf("  near the thresholds: %ld codes checked, %ld of them wrong under the rounded product\n", n, old);

  // 10M random float elements: half the blocks normal draws at a random scale 2^-140 .. 2^120 (as
  // activations and gradients are), half random bits over a spread of 0-2 binades (0-24 in every fourth
  // block), with subnormals, zeros and +-Inf; each block through both scale modes, RNE and SR (one
  // random byte per block).
  Rng rng;
  rng_seed(&rng, 32);
  bad = old = 0;
  long old_rne = 0;
  const long nblk = 10000000 / 32;
  for (long t = 0; t < nblk; t++) {
    float b[32];
    const int top = (int)(rng_u64(&rng) % 290) - 150, spread = (int)(rng_u64(&rng) % (t % 4 == 1 ? 25 : 3));
    for (int i = 0; i < 32; i++) {
      const uint64_t w = rng_u64(&rng);
      const int ex = top - (int)((w >> 32) % (uint64_t)(spread + 1)), be = ex + 127 > 254 ? 254 : ex + 127;
      float x = be < 1 ? fp4_u2f((uint32_t)(w & 0x7fffffu)) : fp4_u2f((uint32_t)be << 23 | (uint32_t)(w & 0x7fffffu));
      if (t % 2 == 0) x = ldexpf(rng_normal(&rng), top < 120 ? top : 120);
      if (w >> 58 == 0) x = 0.0f;
      b[i] = (w >> 57) & 1 ? -x : x;
    }
    if (t % 997 == 0) b[t % 32] = t % 2 ? INFINITY : -INFINITY;
    const uint32_t r = (uint32_t)rng_u64(&rng) & 255u;
    long o = 0;
    check_block(b, MX_SCALE_UP, 0, 0, &bad, &o);
    old_rne += o;
    check_block(b, MX_SCALE_UP, 1, r, &bad, &old);
    check_block(b, MX_SCALE_DOWN, 0, 0, &bad, NULL);
    check_block(b, MX_SCALE_DOWN, 1, r, &bad, NULL);
  }
  CHECK(bad == 0, "%ld random float elements x (up, down) x (RNE, SR): %ld codes or scales differ", nblk * 32, bad);
  printf("  10M random floats: the rounded product departed from the exact rule %ld times (RNE) and %ld (SR)\n",
         old_rne, old);
  CHECK(old_rne + old > 0, "the random set holds cases the rounded product got wrong (%ld)", old_rne + old);

  // BF16 inputs keep their bytes: for every BF16 value (NaN excepted) and every e, the prescale is the
  // rounded product bit for bit; where it is not (6 z 2^-e subnormal, the rounded product below
  // 6 * 2^-126), the RNE code and the SR codes for all 256 bytes are equal.
  long diff_bits = 0, diff_codes = 0, cases = 0;
  for (uint32_t h = 0; h < 0x10000u; h++) {
    const float x = fp4_u2f(h << 16);
    if (isnan(x)) continue;
    for (int e = -127; e <= 127; e++, cases++) {
      const float a = mx_prescale(fabsf(x), e, MX_SCALE_UP), o2 = rounded_prescale(fabsf(x), e);
      if (fp4_f2u(a) == fp4_f2u(o2)) continue;
      diff_bits++;
      diff_codes += !(o2 < 6 * 1.17549435e-38f) || e2m1_rne_mag(fp4_f2u(a)) != e2m1_rne_mag(fp4_f2u(o2));
      for (uint32_t r = 0; r < 256; r++) diff_codes += e2m1_sr_mag(fp4_f2u(a), r) != e2m1_sr_mag(fp4_f2u(o2), r);
    }
  }
  printf("  BF16 x every e: %ld of %ld prescales differ in bits (all below 6 * 2^-126), %ld codes\n", diff_bits, cases,
         diff_codes);
  CHECK(diff_codes == 0, "BF16 x every e: %ld prescales differ in bits (all tiny), %ld codes differ, of %ld", diff_bits,
        diff_codes, cases);
}

// mx_decode over every code and scale byte: q * 2^e / 6 rounded once for UP (no overflow at e = 126,
// 127), q * 2^e for DOWN. The double quotient rounds to the float that the exact one does: q / 6 is
// k/12, k/6, k/4 or k/3 (k small), whose bits beyond a float's are never a midpoint pattern.
static void test_decode_range(void) {
  TEST_SECTION("MXFP4 decode: every code and scale byte, e = 126 and 127 included");
  float x[32] = {0}, d[32];
  x[0] = -6.107e37f;
  uint8_t c[16], s;
  mx_quantize_rows(x, 1, 32, MX_SCALE_UP, MX_RNE, philox_stream(0, 0, 0, 0, 0), c, &s);
  mx_dequantize(c, &s, 1, 32, MX_SCALE_UP, d);
  CHECK(s == 127 + 126 && code_at(c, 0) == 0xE, "-6.107e37: e = 126, code 0xE (byte %d, code %x)", s, code_at(c, 0));
  CHECK(isfinite(d[0]) && d[0] == (float)(-4 * ldexp(1, 126) / 6), "decodes to %g, want -5.67e37", d[0]);
  long bad = 0, inf = 0;
  for (int b = 0; b < 255; b++)
    for (int code = 0; code < 16; code++) {
      const double q = e2m1_decode((uint8_t)code), p = ldexp(q, b - 127);
      const float up = mx_decode((uint8_t)code, (uint8_t)b, MX_SCALE_UP);
      const float dn = mx_decode((uint8_t)code, (uint8_t)b, MX_SCALE_DOWN);
      inf += isinf(up);
      bad += fp4_f2u(up) != fp4_f2u((float)(p / 6)) || (fabs(p) < 3.4e38 && fp4_f2u(dn) != fp4_f2u((float)p));
    }
  CHECK(bad == 0 && inf == 0,
        "UP: every (code, byte) is the once-rounded q 2^e / 6 (%ld differ, %ld infinite); DOWN q 2^e", bad, inf);
  CHECK(mx_decode(7, 254, MX_SCALE_UP) == 0x1p127f && mx_decode(0xF, 253, MX_SCALE_UP) == -0x1p126f,
        "6 * 2^127 / 6 = 2^127, -6 * 2^126 / 6 = -2^126");
}

int main(void) {
  test_e2m1();
  test_scales();
  test_philox();
  test_hadamard();
  test_mx_blocks();
  test_weights_and_cols();
  test_embed();
  test_codec_bits();
  test_block_equivalence();
  test_embed_lut();
  test_exact_quotient();
  test_decode_range();
  TEST_END();
}
