// tests/unit/test_fp4_nv.c: the NVFP4 CPU reference (fp4/nvfp4.c): the scale formulas on hand-computed
// cases, E4M3 rounding of block scales, the edge cases (zero tensor, tiny blocks, saturation,
// NaN/Inf), SR unbiasedness, the 16x16 weight tiles (W and W^T share codes), the column/Hadamard
// copy, and the exactness of the BF16 "unscaled" dequantization the Hopper GEMM path relies on.
#include <math.h>
#include <stdlib.h>

#include "common/common.h"
#include "fp4/hadamard.h"
#include "fp4/nvfp4.h"
#include "tests/test.h"

static uint8_t nib(const uint8_t *codes, size_t i) { return (uint8_t)((codes[i / 2] >> (4 * (i & 1))) & 15); }

static void fill_normal(float *x, size_t n, uint64_t seed, float scale) {
  Rng r;
  rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(&r);
}

static const PhiloxStream S0 = {{0, 0}, 0, 0, 0};

static void test_tensor_scale(void) {
  TEST_SECTION("tensor scale s_enc = 6*448/amax");
  CHECK(nv_encode_scale(2688.0f) == 1.0f, "got %g", nv_encode_scale(2688.0f));
  CHECK(nv_encode_scale(448.0f) == 6.0f, "got %g", nv_encode_scale(448.0f));
  CHECK(nv_encode_scale(10.0f) == 268.8f, "got %.9g", nv_encode_scale(10.0f));
  CHECK(nv_encode_scale(0.0f) == 1.0f, "zero tensor: %g", nv_encode_scale(0.0f));
  CHECK(nv_encode_scale(NAN) == 1.0f, "NaN amax: %g", nv_encode_scale(NAN));
  CHECK(nv_encode_scale(INFINITY) == 1.0f, "Inf amax: %g", nv_encode_scale(INFINITY));
  CHECK(nv_encode_scale(1e-38f) == NV_FLT_MAX, "tiny amax must clamp to FLT_MAX: %g", nv_encode_scale(1e-38f));
  float x[6] = {1.0f, -7.5f, NAN, -INFINITY, 3.0f, 0.0f};
  CHECK(nvfp4_amax(x, 6) == 7.5f, "amax skips NaN/Inf: %g", nvfp4_amax(x, 6));
  CHECK(nvfp4_amax(x + 2, 2) == 0.0f, "only non-finite -> 0: %g", nvfp4_amax(x + 2, 2));
}

static void test_block_scale(void) {
  TEST_SECTION("block scale e4m3(amax_b / 6 * s_enc), RNE");
  // s_enc = 1 (amax 2688): amax_b = 6 -> 1.0 = 0x38; 13 -> 2.1667 -> 2.25 (0x41); 2688 -> 448 (0x7E).
  CHECK(nv_block_scale(fp4_f2u(6.0f), 1.0f) == 0x38, "got 0x%02x", nv_block_scale(fp4_f2u(6.0f), 1.0f));
  CHECK(nv_block_scale(fp4_f2u(13.0f), 1.0f) == 0x41, "got 0x%02x", nv_block_scale(fp4_f2u(13.0f), 1.0f));
  CHECK(nv_block_scale(fp4_f2u(2688.0f), 1.0f) == 0x7E, "got 0x%02x", nv_block_scale(fp4_f2u(2688.0f), 1.0f));
  // Exact E4M3 ties go to the even mantissa: 1.0625 -> 1.0 (0x38), 1.1875 -> 1.25 (0x3A).
  CHECK(nv_block_scale(fp4_f2u(6.375f), 1.0f) == 0x38, "tie 1.0625: 0x%02x", nv_block_scale(fp4_f2u(6.375f), 1.0f));
  CHECK(nv_block_scale(fp4_f2u(7.125f), 1.0f) == 0x3A, "tie 1.1875: 0x%02x", nv_block_scale(fp4_f2u(7.125f), 1.0f));
  // Subnormal E4M3: 3 * 2^-9 -> 0x03; below 2^-10 -> 0 (a "tiny" block).
  CHECK(nv_block_scale(fp4_f2u(ldexpf(18.0f, -9)), 1.0f) == 0x03, "subnormal scale");
  CHECK(nv_block_scale(fp4_f2u(ldexpf(5.9f, -10)), 1.0f) == 0x00, "below half the smallest subnormal");
  // Saturation: anything >= 448 (e.g. a stale, too small tensor amax) -> 448.
  CHECK(nv_block_scale(fp4_f2u(100.0f), nv_encode_scale(1.0f)) == 0x7E, "saturation at 448");
  CHECK(nv_block_scale(NV_NONFINITE_BITS, 1.0f) == NV_SCALE_NAN, "Inf block -> NaN scale");
  CHECK(nv_block_scale(0x7fc00000u, 1.0f) == NV_SCALE_NAN, "NaN block -> NaN scale");
  // The block with the tensor amax always maps to 448: amax 10 -> s_enc 268.8, 10/6*268.8 ~ 448.
  CHECK(nv_block_scale(fp4_f2u(10.0f), nv_encode_scale(10.0f)) == 0x7E, "tensor-amax block -> 448");
  // Every E4M3 byte that nv_block_scale can produce decodes to itself (the rounding is idempotent).
  int bad = 0;
  for (int b = 0; b < 0x7F; b++) {
    float v = e4m3_decode((uint8_t)b);
    if (nv_block_scale(fp4_f2u(FP4_MUL(v, 6.0f)), 1.0f) != b) bad++;
  }
  CHECK(bad == 0, "%d E4M3 values not reproduced", bad);
}

static void test_rows_hand(void) {
  TEST_SECTION("row copy: hand-computed block");
  // One 16-block, amax 13, tensor amax 2688 (s_enc 1): scale 2.25, elements times fl(1/2.25).
  float x[32] = {13.0f, 4.0f, -1.2f, 0.5f, 0.0f, -13.0f, 2.0f, 3.0f, 6.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.1f};
  // Second block: tiny (1e-6 vs tensor amax 1 -> scale 0), but the tensor amax is given as 2688 here,
  // so use a genuinely small block relative to that.
  for (int i = 16; i < 32; i++) x[i] = 1e-4f;
  uint8_t codes[16], scales[2];
  nvfp4_quantize_rows(x, 1, 32, 2688.0f, NV_RNE, S0, codes, scales);
  CHECK(scales[0] == 0x41, "block scale 0x%02x, want 0x41 (2.25)", scales[0]);
  // 13/2.25 = 5.78 -> 6 (7); 4/2.25 = 1.78 -> 2 (4); -1.2/2.25 = -0.533 -> -0.5 (0x9); 0.5/2.25 = 0.22 -> 0;
  // -13 -> -6 (0xF); 2/2.25 = 0.89 -> 1 (2); 3/2.25 = 1.33 -> 1.5 (3); 6/2.25 = 2.67 -> 3 (5); 0.1 -> 0.
  const uint8_t want[16] = {7, 4, 9, 0, 0, 0xF, 2, 3, 5, 0, 0, 0, 0, 0, 0, 0};
  int bad = 0;
  for (int i = 0; i < 16; i++) bad += nib(codes, i) != want[i];
  CHECK(bad == 0, "%d codes differ (first byte 0x%02x)", bad, codes[0]);
  CHECK(codes[0] == 0x47, "element 0 in the low nibble: byte 0 = 0x%02x, want 0x47", codes[0]);
  CHECK(scales[1] == 0x00, "tiny block scale 0x%02x (1e-4/6 < 2^-10)", scales[1]);
  bad = 0;
  for (int i = 8; i < 16; i++) bad += codes[i] != 0;
  CHECK(bad == 0, "tiny block codes must be 0");
  float y[32];
  nvfp4_dequantize(codes, scales, 1, 32, 2688.0f, y);
  CHECK(y[0] == 13.5f && y[5] == -13.5f && y[2] == -1.125f && y[8] == 6.75f, "dequant %g %g %g %g", y[0], y[5], y[2],
        y[8]);
  CHECK(y[20] == 0.0f, "tiny block dequantizes to 0: %g", y[20]);

  // Non-unit s_enc: tensor amax 10 -> s_enc 268.8; the 10 maps to code 6 at scale 448.
  float z[16] = {10.0f, 5.0f, -2.5f, 1.0f};
  nvfp4_quantize_rows(z, 1, 16, nvfp4_amax(z, 16), NV_RNE, S0, codes, scales);
  CHECK(scales[0] == 0x7E, "scale 0x%02x", scales[0]);
  CHECK(nib(codes, 0) == 7 && nib(codes, 1) == 5 && nib(codes, 2) == 0xB && nib(codes, 3) == 1,
        "codes %x %x %x %x (want 7 5 b 1: 6, 3, -1.5, 0.5)", nib(codes, 0), nib(codes, 1), nib(codes, 2),
        nib(codes, 3));
  nvfp4_dequantize(codes, scales, 1, 16, 10.0f, y);
  CHECK_NEAR(y[0], 10.0f, 1e-5);
  CHECK_NEAR(y[1], 5.0f, 1e-5);

  // Saturation with a stale (too small) amax: scale 448, large values clamp to +-6 * 448 / s_enc.
  float u[16] = {100.0f, -50.0f, 0.5f};
  nvfp4_quantize_rows(u, 1, 16, 1.0f, NV_RNE, S0, codes, scales);
  CHECK(scales[0] == 0x7E && nib(codes, 0) == 7 && nib(codes, 1) == 0xF && nib(codes, 2) == 5,
        "saturation: scale 0x%02x codes %x %x %x", scales[0], nib(codes, 0), nib(codes, 1), nib(codes, 2));

  // Tiny tensor: 2688 / 1e-38 overflows, s_enc = FLT_MAX; a block of ~3e-41 gets scale 2^-9 (0x01),
  // whose reciprocal s_enc / 2^-9 overflows too and is clamped, so 0 stays code 0 (not 0 * Inf = NaN).
  float t[32] = {1e-38f, 0.0f, 5e-39f};
  t[16] = 3e-41f, t[17] = 0.0f, t[18] = -3e-41f;
  nvfp4_quantize_rows(t, 1, 32, nvfp4_amax(t, 32), NV_RNE, S0, codes, scales);
  CHECK(nv_encode_scale(nvfp4_amax(t, 32)) == NV_FLT_MAX, "tiny tensor s_enc");
  CHECK(nv_elem_inv(0x01, NV_FLT_MAX) == NV_FLT_MAX, "reciprocal clamp");
  CHECK(scales[1] == 0x01 && nib(codes, 16) == 0 && nib(codes, 17) == 0 && nib(codes, 18) == 8,
        "tiny block: scale 0x%02x codes %x %x %x (want 01: 0 0 8)", scales[1], nib(codes, 16), nib(codes, 17),
        nib(codes, 18));
  // The amax block: 1e-38 / 6 is subnormal (1.67e-39), times FLT_MAX = 0.567 -> scale 0.5625 (0x31); the
  // clamped reciprocal gives 1e-38 * FLT_MAX = 3.4 -> code 3.0 (5). Degenerate, but defined and exact.
  CHECK(scales[0] == 0x31 && nib(codes, 0) == 5, "tiny tensor's amax block: scale 0x%02x code %x", scales[0],
        nib(codes, 0));

  // Zero tensor: amax 0 -> s_enc 1, scale 0, codes 0, values 0.
  float zero[16] = {0};
  nvfp4_quantize_rows(zero, 1, 16, nvfp4_amax(zero, 16), NV_RNE, S0, codes, scales);
  nvfp4_dequantize(codes, scales, 1, 16, 0.0f, y);
  CHECK(scales[0] == 0 && codes[0] == 0 && codes[7] == 0 && y[0] == 0.0f, "zero tensor");
}

static void test_nonfinite(void) {
  TEST_SECTION("NaN / Inf policy");
  float x[48];
  fill_normal(x, 48, 7, 1.0f);
  x[3] = NAN;
  x[16 + 9] = -INFINITY;
  float amax = nvfp4_amax(x, 48);
  CHECK(isfinite(amax) && amax > 0, "amax %g", amax);
  uint8_t codes[24], scales[3], ref_c[8], ref_s[1];
  nvfp4_quantize_rows(x, 1, 48, amax, NV_SR, S0, codes, scales);
  CHECK(scales[0] == NV_SCALE_NAN && scales[1] == NV_SCALE_NAN, "scales 0x%02x 0x%02x", scales[0], scales[1]);
  int nz = 0;
  for (int i = 0; i < 16; i++) nz += codes[i] != 0;
  CHECK(nz == 0, "codes of non-finite blocks are 0 (%d nonzero)", nz);
  // The finite third block is unaffected: same bytes as quantizing it alone with the same amax.
  nvfp4_quantize_rows(x + 32, 1, 16, amax, NV_RNE, S0, ref_c, ref_s);
  nvfp4_quantize_rows(x, 1, 48, amax, NV_RNE, S0, codes, scales);
  CHECK(scales[2] == ref_s[0] && memcmp(codes + 16, ref_c, 8) == 0, "finite block changed");
  float y[48];
  nvfp4_dequantize(codes, scales, 1, 48, amax, y);
  int nan_ok = 1;
  for (int i = 0; i < 32; i++) nan_ok &= isnan(y[i]);
  CHECK(nan_ok, "non-finite blocks dequantize to NaN");
  CHECK(isfinite(y[40]), "finite block stays finite");
  uint16_t yb[48];
  nvfp4_dequantize_unscaled_bf16(codes, scales, 1, 48, yb);
  CHECK(yb[0] == 0x7FC0 && yb[31] == 0x7FC0, "canonical BF16 NaN: 0x%04x", yb[0]);
}

static void test_dequant_exact(void) {
  TEST_SECTION("q * e4m3 scale is exact in BF16");
  int inexact = 0, nan_bad = 0;
  for (int b = 0; b < 256; b++)
    for (int c = 0; c < 16; c++) {
      float v = nv_decode_unscaled((uint8_t)c, (uint8_t)b);
      if ((b & 0x7F) == 0x7F) {
        nan_bad += !isnan(v) || nv_decode_unscaled_bf16((uint8_t)c, (uint8_t)b) != 0x7FC0;
        continue;
      }
      double exact = (double)e2m1_decode((uint8_t)c) * (double)e4m3_decode((uint8_t)b);
      uint16_t bf = nv_decode_unscaled_bf16((uint8_t)c, (uint8_t)b);
      float back = fp4_u2f((uint32_t)bf << 16);
      inexact += (double)v != exact || (double)back != exact;
    }
  CHECK(inexact == 0, "%d of 16 x 254 products not exact in BF16", inexact);
  CHECK(nan_bad == 0, "%d NaN-scale products wrong", nan_bad);
  // The full value: (q * bs) / s_enc, one rounding.
  const float s_enc = nv_encode_scale(3.7f);
  CHECK(nv_decode(7, 0x41, s_enc) == (float)(13.5 / (double)s_enc), "nv_decode rounding");
  // GEMM alpha: unscaled products times alpha reproduce the scaled values' product.
  float alpha = nv_gemm_alpha(10.0f, 2688.0f);
  CHECK_NEAR(alpha, 1.0 / 268.8, 1e-9);
}

static void test_sr(void) {
  TEST_SECTION("stochastic rounding: unbiased, neighbours only");
  enum { R = 16, K = 256, DRAWS = 256 };
  const size_t n = (size_t)R * K;
  float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float));
  double *acc = xcalloc(n, sizeof(double));
  uint8_t *codes = xmalloc(n / 2), *scales = xmalloc(n / 16), *rc = xmalloc(n / 2), *rs = xmalloc(n / 16);
  fill_normal(x, n, 11, 0.01f);
  const float amax = nvfp4_amax(x, n);
  nvfp4_quantize_rows(x, R, K, amax, NV_RNE, S0, rc, rs);
  int nonneighbour = 0, scale_diff = 0;
  for (int d = 0; d < DRAWS; d++) {
    PhiloxStream s = philox_stream(1234, (uint32_t)d, 0, 3, 1);
    nvfp4_quantize_rows(x, R, K, amax, NV_SR, s, codes, scales);
    scale_diff += memcmp(scales, rs, n / 16) != 0;  // scales never depend on the random bits
    nvfp4_dequantize(codes, scales, R, K, amax, y);
    for (size_t i = 0; i < n; i++) {
      acc[i] += y[i];
      // SR picks one of the two grid neighbours: |code value - RNE value| is at most one step.
      int a = nib(codes, i) & 7, b = nib(rc, i) & 7;
      nonneighbour += (x[i] != 0 && abs(a - b) > 1);
    }
  }
  CHECK(scale_diff == 0, "SR changed %d scale arrays", scale_diff);
  CHECK(nonneighbour == 0, "%d codes not a neighbour of the RNE code", nonneighbour);
  double err_sr = 0, err_rne = 0, bias = 0, xs = 0;
  nvfp4_dequantize(rc, rs, R, K, amax, y);
  const float s_enc = nv_encode_scale(amax);
  for (size_t i = 0; i < n; i++) {
    // SR is unbiased where nothing saturates: skip elements that scale to 6 or more (a block amax
    // whose E4M3 scale rounded down), which both roundings clip.
    if (!(fabsf(x[i]) * nv_elem_inv(rs[i / 16], s_enc) < 6.0f)) continue;
    double m = acc[i] / DRAWS;
    err_sr += (m - x[i]) * (m - x[i]);
    err_rne += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
    bias += m - x[i];
    xs += fabs(x[i]);
  }
  // The mean of 256 SR draws has variance <= step^2 / 1024, the RNE error ~ step^2 / 12 (per element):
  // expect a ratio near 1/85; a biased rounding would stay near the RNE error.
  CHECK(err_sr < err_rne / 20, "SR mean-square error %.3g vs RNE %.3g", err_sr, err_rne);
  CHECK(fabs(bias) / xs < 2e-3, "SR signed bias %.3g relative to sum|x| %.3g", bias, xs);
  // Fixed bits: the same stream gives the same bytes; another step gives different ones.
  uint8_t *c2 = xmalloc(n / 2);
  nvfp4_quantize_rows(x, R, K, amax, NV_SR, philox_stream(1234, 5, 0, 3, 1), codes, scales);
  nvfp4_quantize_rows(x, R, K, amax, NV_SR, philox_stream(1234, 5, 0, 3, 1), c2, scales);
  CHECK(memcmp(codes, c2, n / 2) == 0, "SR not deterministic");
  nvfp4_quantize_rows(x, R, K, amax, NV_SR, philox_stream(1234, 6, 0, 3, 1), c2, scales);
  CHECK(memcmp(codes, c2, n / 2) != 0, "SR bits do not change with the step");
  free(x), free(y), free(acc), free(codes), free(scales), free(rc), free(rs), free(c2);
}

static void test_weight_tiles(void) {
  TEST_SECTION("16x16 weight tiles: W and W^T share codes");
  enum { N = 48, K = 80 };
  float w[N * K];
  fill_normal(w, N * K, 21, 0.02f);
  w[5 * K + 70] = 0.3f;  // an outlier: its tile gets a larger scale than its neighbours
  const float amax = nvfp4_amax(w, N * K);
  uint8_t c[N * K / 2], s[N * K / 16], ct[N * K / 2], st[N * K / 16];
  nvfp4_quantize_weight(w, N, K, amax, c, s, ct, st);
  int code_bad = 0, scale_bad = 0, tile_bad = 0;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      code_bad += nib(c, (size_t)n * K + k) != nib(ct, (size_t)k * N + n);
      scale_bad += s[n * (K / 16) + k / 16] != st[k * (N / 16) + n / 16];
      tile_bad += s[n * (K / 16) + k / 16] != s[(n / 16 * 16) * (K / 16) + k / 16];  // one scale per tile
    }
  CHECK(code_bad == 0, "%d W / W^T codes differ", code_bad);
  CHECK(scale_bad == 0, "%d W / W^T scales differ", scale_bad);
  CHECK(tile_bad == 0, "%d rows of a tile with different scales", tile_bad);
  // The outlier's tile (rows 0..15, cols 64..79) is scaled by the tile amax 0.3 = the tensor amax.
  CHECK(s[5 * (K / 16) + 4] == 0x7E && s[0 * (K / 16) + 4] == 0x7E, "outlier tile scale 0x%02x", s[5 * (K / 16) + 4]);
  uint32_t am = 0;
  for (int i = 16; i < 32; i++)
    for (int j = 0; j < 16; j++) am = nv_abs_bits(w[i * K + j]) > am ? nv_abs_bits(w[i * K + j]) : am;
  CHECK(s[16 * (K / 16)] == nv_block_scale(am, nv_encode_scale(amax)), "tile (1,0) scale from its 16x16 amax");
  // Rows of a tile that hold the tile amax quantize like a 1x16 row copy; others may use a coarser scale.
  float y[N * K];
  nvfp4_dequantize(c, s, N, K, amax, y);
  double e2 = 0, x2 = 0;
  for (int i = 0; i < N * K; i++) e2 += (y[i] - w[i]) * (y[i] - w[i]), x2 += w[i] * w[i];
  CHECK(sqrt(e2 / x2) < 0.2, "weight relative RMS error %.3f", sqrt(e2 / x2));
}

static void test_cols(void) {
  TEST_SECTION("column copy (+R16) = row copy of (R16 X)^T");
  enum { T = 64, C = 48 };
  float x[T * C], hx[T * C], ht[C * T];
  fill_normal(x, T * C, 31, 1.0f);
  for (int i = 0; i < C; i++) x[7 * C + i] *= 20.0f;  // an outlier token, spread by the rotation
  memcpy(hx, x, sizeof(x));
  fp4_hadamard_cols(hx, T, C, 16);
  for (int t = 0; t < T; t++)
    for (int c = 0; c < C; c++) ht[c * T + t] = hx[t * C + c];
  const float amax_h = nvfp4_amax_hadamard(x, T, C, FP4_ROT_H16);
  CHECK(amax_h == nvfp4_amax(hx, T * C), "amax_hadamard %g vs amax(R16 x) %g", amax_h, nvfp4_amax(hx, T * C));
  CHECK(amax_h < nvfp4_amax(x, T * C), "R16 spreads the outlier: %g vs %g", amax_h, nvfp4_amax(x, T * C));
  uint8_t c1[T * C / 2], s1[T * C / 16], c2[T * C / 2], s2[T * C / 16];
  for (int sr = 0; sr < 2; sr++) {
    PhiloxStream s = philox_stream(99, 1, 2, 3, 4);
    nvfp4_quantize_cols(x, T, C, FP4_ROT_H16, amax_h, sr ? NV_SR : NV_RNE, s, c1, s1);
    nvfp4_quantize_rows(ht, C, T, amax_h, sr ? NV_SR : NV_RNE, s, c2, s2);
    CHECK(memcmp(c1, c2, sizeof(c1)) == 0 && memcmp(s1, s2, sizeof(s1)) == 0, "sr = %d: bytes differ", sr);
  }
  // The plain H16 (no sign flips): the row copy of (H16 X / 4)^T.
  memcpy(hx, x, sizeof(x));
  for (int t0 = 0; t0 < T; t0 += 16)
    for (int c = 0; c < C; c++) {
      float v[16];
      for (int i = 0; i < 16; i++) v[i] = hx[(t0 + i) * C + c];
      fp4_h16_plain(v);
      for (int i = 0; i < 16; i++) hx[(t0 + i) * C + c] = v[i];
    }
  for (int t = 0; t < T; t++)
    for (int c = 0; c < C; c++) ht[c * T + t] = hx[t * C + c];
  const float amax_p = nvfp4_amax_hadamard(x, T, C, FP4_ROT_H16_PLAIN);
  CHECK(amax_p == nvfp4_amax(hx, T * C), "amax_hadamard (plain) %g vs amax(H16 x / 4) %g", amax_p,
        nvfp4_amax(hx, T * C));
  CHECK(amax_p != amax_h, "the plain and the fixed-sign rotations differ on this data (%g, %g)", amax_p, amax_h);
  for (int sr = 0; sr < 2; sr++) {
    PhiloxStream s = philox_stream(99, 1, 2, 3, 5);
    nvfp4_quantize_cols(x, T, C, FP4_ROT_H16_PLAIN, amax_p, sr ? NV_SR : NV_RNE, s, c1, s1);
    nvfp4_quantize_rows(ht, C, T, amax_p, sr ? NV_SR : NV_RNE, s, c2, s2);
    CHECK(memcmp(c1, c2, sizeof(c1)) == 0 && memcmp(s1, s2, sizeof(s1)) == 0, "plain H16, sr = %d: bytes differ", sr);
  }
  // Without the rotation: the plain transpose.
  for (int t = 0; t < T; t++)
    for (int c = 0; c < C; c++) ht[c * T + t] = x[t * C + c];
  const float amax = nvfp4_amax(x, T * C);
  nvfp4_quantize_cols(x, T, C, FP4_ROT_NONE, amax, NV_RNE, S0, c1, s1);
  nvfp4_quantize_rows(ht, C, T, amax, NV_RNE, S0, c2, s2);
  CHECK(memcmp(c1, c2, sizeof(c1)) == 0 && memcmp(s1, s2, sizeof(s1)) == 0, "hadamard = 0: bytes differ");
}

static void test_error(void) {
  TEST_SECTION("quantization error on Gaussian data");
  enum { R = 32, K = 512 };
  float *x = xmalloc(R * K * sizeof(float)), *y = xmalloc(R * K * sizeof(float));
  uint8_t *c = xmalloc(R * K / 2), *s = xmalloc(R * K / 16);
  fill_normal(x, R * K, 41, 3.0f);
  nvfp4_quantize_rows(x, R, K, nvfp4_amax(x, R * K), NV_RNE, S0, c, s);
  nvfp4_dequantize(c, s, R, K, nvfp4_amax(x, R * K), y);
  double e2 = 0, x2 = 0;
  for (int i = 0; i < R * K; i++) e2 += (y[i] - x[i]) * (y[i] - x[i]), x2 += x[i] * x[i];
  // E2M1 with a per-16 scale: relative RMS error ~0.08-0.1 for Gaussian blocks.
  CHECK(sqrt(e2 / x2) > 0.03 && sqrt(e2 / x2) < 0.13, "relative RMS error %.4f", sqrt(e2 / x2));
  free(x), free(y), free(c), free(s);
}

// nv_encode rounds |x| * inv and takes the sign from x (the producers' form); the definition is the
// E2M1 code of x * inv. They agree because IEEE rounding is sign-symmetric; checked here over random
// x and inv of every magnitude, including inv = FLT_MAX (saturation) and -0.
static void test_encode_form(void) {
  TEST_SECTION("nv_encode == E2M1(x * inv)");
  Rng r;
  rng_seed(&r, 31);
  long bad = 0;
  for (int i = 0; i < 2000000; i++) {
    uint64_t w = rng_u64(&r);
    float x = ldexpf(rng_normal(&r), (int)(w % 80) - 40), inv = ldexpf(1.0f + rng_uniform(&r), (int)(w >> 8) % 60 - 30);
    if (w % 1001 == 0) inv = NV_FLT_MAX;
    if (w % 997 == 0) x = -0.0f;
    uint32_t r8 = (uint32_t)(w >> 32) & 255u;
    bad += nv_encode(x, inv, 0, 0) != e2m1_encode_rne(x * inv);
    bad += nv_encode(x, inv, 1, r8) != e2m1_encode_sr(x * inv, r8);
  }
  CHECK(bad == 0, "%ld mismatches in 4M encodes", bad);
}

int main(void) {
  test_tensor_scale();
  test_block_scale();
  test_rows_hand();
  test_nonfinite();
  test_dequant_exact();
  test_sr();
  test_weight_tiles();
  test_cols();
  test_error();
  test_encode_form();
  TEST_END();
}
