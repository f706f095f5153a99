// tests/gpu/gpu_test_fp4_nv.cu: the CUDA NVFP4 producers (fp4/nvfp4.cu) against the CPU reference
// (fp4/nvfp4.c), BYTE FOR BYTE: tensor amaxes (fp32 bits), packed codes, E4M3 scales, W / W^T tiles,
// and the BF16 unscaled dequantization, on many shapes and on edge-case inputs (zeros, constant
// blocks, huge/tiny/subnormal values, amax exactly a power of two, every E2M1 tie, NaN/Inf, a tiny
// tensor amax, a stale amax that saturates). Exact equality is the right tolerance: both sides run
// the same FP4_HD scalar rules with correctly rounded fp32 operations (fp4/fp4_common.h), and every
// reduction is a max. Then a bandwidth table of the producers at Llama-3 8B shapes vs the copy rate
// measured on the GPU at hand (4.28 TB/s on the H200).
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fp4/hadamard.h"
#include "fp4/nvfp4.h"
#include "common/cuda_common.h"
#include "tests/test.h"
#include "tests/gpu/gpu_util.h"

typedef __nv_bfloat16 bf16;
static Rng rng;

// ---- inputs ---------------------------------------------------------------------------------------
enum { IN_HUGE = IN_SHARED_KINDS, IN_TINY, IN_POW2, IN_TIES, IN_SPECIAL, IN_NKINDS };
static const char *in_name[IN_NKINDS] = {"normal", "outliers", "zeros", "const",  "huge",
                                         "tiny",   "pow2",     "ties",  "nan/inf"};

// rows x K BF16-representable values; 16-blocks along K get a per-block flavour.
static float *make_input(int kind, int rows, int K) {
  const size_t n = (size_t)rows * K;
  float *x = (float *)xmalloc(n * sizeof(float));
  const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (size_t i = 0; i < n; i++) {
    float v = rng_normal(&rng);
    const size_t blk = i / 16;
    v = shared_input(kind, v, i, blk, K, &rng);
    switch (kind) {
      // Huge values make the other blocks' scales round to 0 or to E4M3 subnormals.
      case IN_HUGE:
        v *= blk % 5 == 0 ? 1e30f : (blk % 5 == 1 ? 1e-30f : (blk % 5 == 2 ? 1e-38f : 1.0f));
        break;
      // A tiny tensor (amax ~ 1e-38, so 2688 / amax overflows and s_enc clamps), with subnormals.
      case IN_TINY:
        v = i % 7 == 0 ? 0.0f : v * (blk % 2 ? 1e-38f : 1e-40f);
        break;
      case IN_POW2:
        v = (i % 53 == 0) ? ldexpf(1.0f, 20) : v * 1000.0f;
        break;
      // The tensor amax 2688 (s_enc = 1) and blocks of amax 6 (scale 1.0): every E2M1 tie lands exactly.
      case IN_TIES:
        if (i == 0) v = 2688.0f;
        else if (i % 16 == 15) v = 6.0f;
        else v = ties[(i + blk) % 7] * (((i / 3) & 1) ? -1.0f : 1.0f);
        break;
      case IN_SPECIAL:
        if (blk % 11 == 3 && i % 16 == 5) v = NAN;
        else if (blk % 13 == 4 && i % 16 == 2) v = INFINITY;
        else if (blk % 13 == 7 && i % 16 == 9) v = -INFINITY;
        break;
    }
    x[i] = bf16r(v);
  }
  return x;
}

// ---- device helpers -------------------------------------------------------------------------------
static void *dalloc(size_t bytes) { return dev_alloc(bytes, -1); }

static bf16 *upload_bf16(const float *x, size_t n) {
  bf16 *h = (bf16 *)xmalloc(n * sizeof(bf16) + 1), *d = (bf16 *)dalloc(n * sizeof(bf16));
  for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(x[i]);  // exact: x is BF16-representable
  CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(bf16), cudaMemcpyHostToDevice));
  free(h);
  return d;
}

static void *upload(const void *h, size_t bytes) {
  void *d = dalloc(bytes);
  CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}

static void download(void *h, const void *d, size_t bytes) {
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static float download_float(const float *d) {
  float v;
  download(&v, d, sizeof(float));
  return v;
}

// Byte-for-byte comparison; on a mismatch prints the first few with their row/column in a
// [rows, per_row] byte array.
static int same_bytes(const char *what, const uint8_t *got, const uint8_t *want, size_t n, size_t per_row) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      if (bad < 4)
        printf("  %s: byte %zu (row %zu, byte %zu): gpu 0x%02x cpu 0x%02x\n", what, i, i / per_row, i % per_row, got[i],
               want[i]);
      bad++;
    }
  if (bad) printf("  %s: %zu of %zu bytes differ\n", what, bad, n);
  return bad == 0;
}

static int same_float_bits(float a, float b) { return fp4_f2u(a) == fp4_f2u(b); }

// ---- one correctness case -------------------------------------------------------------------------
// x [rows, K] of the given kind through every producer the shape allows. stale: hand the quantizers
// amax / 8 instead of the true amax (saturation path).
static void check_case(int kind, int rows, int K, int stale) {
  const size_t n = (size_t)rows * K;
  float *x = make_input(kind, rows, K);
  bf16 *dx = upload_bf16(x, n);
  float *damax = (float *)dalloc(sizeof(float)), *dgiven = (float *)dalloc(sizeof(float));
  const PhiloxStream s = philox_stream(0x1234567890abcdefull, 77, 3, 5, 2);
  char tag[96];
  snprintf(tag, sizeof tag, "%s %dx%d%s", in_name[kind], rows, K, stale ? " stale-amax" : "");

  // Tensor amax.
  nvfp4_amax_cuda(damax, dx, n);
  const float amax = nvfp4_amax(x, n), gamax = download_float(damax);
  CHECK(same_float_bits(gamax, amax), "%s: amax gpu %.9g cpu %.9g", tag, gamax, amax);
  const float given = stale ? amax / 8 : amax;
  CUDA_CHECK(cudaMemcpy(dgiven, &given, sizeof(float), cudaMemcpyHostToDevice));

  uint8_t *c_cpu = (uint8_t *)xmalloc(n / 2 + 1), *s_cpu = (uint8_t *)xmalloc(n / 16 + 1);
  uint8_t *c_gpu = (uint8_t *)xmalloc(n / 2 + 1), *s_gpu = (uint8_t *)xmalloc(n / 16 + 1);
  uint8_t *dc = (uint8_t *)dalloc(n / 2), *ds = (uint8_t *)dalloc(n / 16);

  // Row copies, RNE and SR, then the BF16 dequantization of the SR copy.
  if (K % 16 == 0) {
    for (int sr = 0; sr < 2; sr++) {
      NvRound rnd = sr ? NV_SR : NV_RNE;
      nvfp4_quantize_rows(x, rows, K, given, rnd, s, c_cpu, s_cpu);
      nvfp4_quantize_rows_cuda(dx, rows, K, dgiven, rnd, s, dc, ds);
      download(c_gpu, dc, n / 2);
      download(s_gpu, ds, n / 16);
      CHECK(same_bytes("row codes", c_gpu, c_cpu, n / 2, K / 2), "%s: row copy codes (sr = %d)", tag, sr);
      CHECK(same_bytes("row scales", s_gpu, s_cpu, n / 16, K / 16), "%s: row copy scales (sr = %d)", tag, sr);
    }
    uint16_t *y_cpu = (uint16_t *)xmalloc(n * 2), *y_gpu = (uint16_t *)xmalloc(n * 2);
    bf16 *dy = (bf16 *)dalloc(n * 2);
    nvfp4_dequantize_unscaled_bf16(c_cpu, s_cpu, rows, K, y_cpu);
    nvfp4_dequant_bf16_unscaled(dc, ds, rows, K, dy);
    download(y_gpu, dy, n * 2);
    CHECK(same_bytes("dequant bf16", (uint8_t *)y_gpu, (uint8_t *)y_cpu, n * 2, (size_t)K * 2), "%s: dequant", tag);
    free(y_cpu), free(y_gpu);
    CUDA_CHECK(cudaFree(dy));
  }

  // Column copies (the Wgrad producer): R16 + RNE, R16 + SR, no rotation, plain H16 + RNE and + SR.
  if (rows % 16 == 0) {
    for (int p = 0; p < 2; p++) {
      const int rot = p ? FP4_ROT_H16_PLAIN : FP4_ROT_H16;
      nvfp4_amax_hadamard_cuda(damax, dx, rows, K, rot);
      const float amax_r = nvfp4_amax_hadamard(x, rows, K, rot), gamax_r = download_float(damax);
      CHECK(same_float_bits(gamax_r, amax_r), "%s: hadamard (rot %d) amax gpu %.9g cpu %.9g", tag, rot, gamax_r,
            amax_r);
    }
    const float amax_h = nvfp4_amax_hadamard(x, rows, K, FP4_ROT_H16);
    const float amax_p = nvfp4_amax_hadamard(x, rows, K, FP4_ROT_H16_PLAIN);
    for (int v = 0; v < 5; v++) {
      const int had = v < 2 ? FP4_ROT_H16 : v == 2 ? FP4_ROT_NONE : FP4_ROT_H16_PLAIN;
      const NvRound rnd = v == 1 || v == 4 ? NV_SR : NV_RNE;
      const float a = had == FP4_ROT_H16 ? amax_h : had == FP4_ROT_H16_PLAIN ? amax_p : amax;
      const float given_v = stale ? a / 8 : a;
      CUDA_CHECK(cudaMemcpy(dgiven, &given_v, sizeof(float), cudaMemcpyHostToDevice));
      nvfp4_quantize_cols(x, rows, K, had, given_v, rnd, s, c_cpu, s_cpu);
      nvfp4_quantize_cols_cuda(dx, rows, K, had, dgiven, rnd, s, dc, ds);
      download(c_gpu, dc, n / 2);
      download(s_gpu, ds, n / 16);
      CHECK(same_bytes("col codes", c_gpu, c_cpu, n / 2, rows / 2), "%s: col copy codes (hadamard %d, sr %d)", tag, had,
            rnd == NV_SR);
      CHECK(same_bytes("col scales", s_gpu, s_cpu, n / 16, rows / 16), "%s: col copy scales (hadamard %d, sr %d)", tag,
            had, rnd == NV_SR);
    }
  }

  // Weights: 16x16 tiles, from fp32 (values not rounded to BF16) and from BF16.
  if (rows % 16 == 0 && K % 16 == 0) {
    float *w = (float *)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) w[i] = x[i] * (1.0f + 1e-3f * rng_uniform(&rng));  // not BF16-exact
    if (kind == IN_TIES) memcpy(w, x, n * sizeof(float));                             // keep the exact ties
    float *dw = (float *)upload(w, n * sizeof(float));
    uint8_t *ct_cpu = (uint8_t *)xmalloc(n / 2), *st_cpu = (uint8_t *)xmalloc(n / 16);
    uint8_t *ct_gpu = (uint8_t *)xmalloc(n / 2), *st_gpu = (uint8_t *)xmalloc(n / 16);
    uint8_t *dct = (uint8_t *)dalloc(n / 2), *dst = (uint8_t *)dalloc(n / 16);
    for (int from_bf16 = 0; from_bf16 < 2; from_bf16++) {
      const float *src = from_bf16 ? x : w;
      if (from_bf16) nvfp4_amax_cuda(damax, dx, n);
      else nvfp4_amax_f32_cuda(damax, dw, n);
      const float wamax = nvfp4_amax(src, n), gw = download_float(damax);
      CHECK(same_float_bits(gw, wamax), "%s: weight amax (bf16 %d) gpu %.9g cpu %.9g", tag, from_bf16, gw, wamax);
      const float wgiven = stale ? wamax / 8 : wamax;
      CUDA_CHECK(cudaMemcpy(dgiven, &wgiven, sizeof(float), cudaMemcpyHostToDevice));
      nvfp4_quantize_weight(src, rows, K, wgiven, c_cpu, s_cpu, ct_cpu, st_cpu);
      if (from_bf16) nvfp4_quantize_weight_bf16_cuda(dx, rows, K, dgiven, dc, ds, dct, dst);
      else nvfp4_quantize_weight_cuda(dw, rows, K, dgiven, dc, ds, dct, dst);
      download(c_gpu, dc, n / 2);
      download(s_gpu, ds, n / 16);
      download(ct_gpu, dct, n / 2);
      download(st_gpu, dst, n / 16);
      CHECK(same_bytes("W codes", c_gpu, c_cpu, n / 2, K / 2), "%s: W codes (bf16 %d)", tag, from_bf16);
      CHECK(same_bytes("W scales", s_gpu, s_cpu, n / 16, K / 16), "%s: W scales (bf16 %d)", tag, from_bf16);
      CHECK(same_bytes("W^T codes", ct_gpu, ct_cpu, n / 2, rows / 2), "%s: W^T codes (bf16 %d)", tag, from_bf16);
      CHECK(same_bytes("W^T scales", st_gpu, st_cpu, n / 16, rows / 16), "%s: W^T scales (bf16 %d)", tag, from_bf16);
    }
    free(w), free(ct_cpu), free(st_cpu), free(ct_gpu), free(st_gpu);
    CUDA_FREE_ALL(dw, dct, dst);
  }

  free(x), free(c_cpu), free(s_cpu), free(c_gpu), free(s_gpu);
  CUDA_FREE_ALL(dx, dc, ds, damax, dgiven);
}

static void test_alpha(void) {
  TEST_SECTION("GEMM alpha on the device");
  const float a[2] = {10.0f, 2688.0f};
  float *da = (float *)upload(a, sizeof a), *dalpha = (float *)dalloc(sizeof(float));
  nvfp4_gemm_alpha_cuda(dalpha, da, da + 1);
  const float got = download_float(dalpha), want = nv_gemm_alpha(a[0], a[1]);
  CHECK(same_float_bits(got, want), "alpha gpu %.9g cpu %.9g", got, want);
  CUDA_CHECK(cudaFree(da));
  CUDA_CHECK(cudaFree(dalpha));
}

// ---- benchmark ------------------------------------------------------------------------------------
// Uniform values in [-scale, scale) from a hash of the index (benchmark data, made on the device).
template <typename T>
__global__ void fill_kernel(T *x, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    x[i] = (T)(((float)(h >> 8) * (1.0f / 16777216.0f) - 0.5f) * 2.0f * scale);
  }
}

static cudaEvent_t ev0, ev1;

// Mean milliseconds of fn over `iters` runs after 2 warm-ups.
template <typename F>
static double time_ms(F fn, int iters) {
  for (int i = 0; i < 2; i++) fn();
  CUDA_CHECK(cudaEventRecord(ev0, cuda_stream()));
  for (int i = 0; i < iters; i++) fn();
  CUDA_CHECK(cudaEventRecord(ev1, cuda_stream()));
  CUDA_CHECK(cudaEventSynchronize(ev1));
  float ms;
  CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
  return ms / iters;
}

static void row(const char *name, int T, int C, double ms, double bytes) {
  const double tbs = bytes / (ms * 1e-3) / 1e12;
  printf("| %-34s | %5d x %-5d | %8.1f | %6.0f | %5.1f%% |\n", name, T, C, ms * 1e3, tbs * 1e3,
         100.0 * tbs * 1e3 / copy_gbs_here());
}

static void bench(void) {
  copy_gbs_here();  // its line before the table
  printf(
      "\nNVFP4 producers at Llama-3 8B shapes (bytes = reads + writes; ceiling: the copy rate measured here).\n"
      "\"effective\": the two-kernel producer (amax pass, then quantize) timed together, over the bytes\n"
      "of one read of x and the writes (the amax pass reads x a second time).\n");
  printf("| %-34s | %-13s | %8s | %6s | %6s |\n", "producer", "shape", "us", "GB/s", "% ceil");
  printf("|------------------------------------|---------------|----------|--------|--------|\n");
  const int Ts[2] = {8192, 16384}, Cs[2] = {4096, 14336};
  const size_t nmax = (size_t)16384 * 14336;
  bf16 *x = (bf16 *)dalloc(nmax * 2), *y = (bf16 *)dalloc(nmax * 2);
  float *wf = (float *)dalloc((size_t)14336 * 4096 * 4);
  uint8_t *c = (uint8_t *)dalloc(nmax / 2), *s = (uint8_t *)dalloc(nmax / 16);
  uint8_t *ct = (uint8_t *)dalloc(nmax / 2), *st = (uint8_t *)dalloc(nmax / 16);
  float *amax = (float *)dalloc(sizeof(float));
  fill_kernel<bf16><<<1024, 256, 0, cuda_stream()>>>(x, nmax, 1, 4.0f);
  CUDA_CHECK_LAUNCH();
  fill_kernel<float><<<1024, 256, 0, cuda_stream()>>>(wf, (size_t)14336 * 4096, 2, 0.02f);
  CUDA_CHECK_LAUNCH();
  const PhiloxStream ps = philox_stream(42, 1, 0, 0, 0);
  const int it = 10;
  for (int ti = 0; ti < 2; ti++)
    for (int ci = 0; ci < 2; ci++) {
      const int T = Ts[ti], C = Cs[ci];
      const double n = (double)T * C, q = n / 2 + n / 16;  // packed codes + scales
      nvfp4_amax_cuda(amax, x, (size_t)T * C);
      double ms_amax = time_ms([&] { nvfp4_amax_cuda(amax, x, (size_t)T * C); }, it);
      row("amax (bf16)", T, C, ms_amax, 2 * n);
      double ms_rne = time_ms([&] { nvfp4_quantize_rows_cuda(x, T, C, amax, NV_RNE, ps, c, s); }, it);
      row("rows 1x16 RNE (given amax)", T, C, ms_rne, 2 * n + q);
      double ms_sr = time_ms([&] { nvfp4_quantize_rows_cuda(x, T, C, amax, NV_SR, ps, c, s); }, it);
      row("rows 1x16 SR (given amax)", T, C, ms_sr, 2 * n + q);
      row("amax + rows SR (effective)", T, C, ms_amax + ms_sr, 2 * n + q);
      double ms_hamax = time_ms([&] { nvfp4_amax_hadamard_cuda(amax, x, T, C, FP4_ROT_H16); }, it);
      row("amax of R16 x (cols)", T, C, ms_hamax, 2 * n);
      double ms_col = time_ms([&] { nvfp4_quantize_cols_cuda(x, T, C, FP4_ROT_H16, amax, NV_RNE, ps, c, s); }, it);
      row("cols R16 + 16x1 RNE, transposed", T, C, ms_col, 2 * n + q);
      double ms_colsr = time_ms([&] { nvfp4_quantize_cols_cuda(x, T, C, FP4_ROT_H16, amax, NV_SR, ps, c, s); }, it);
      row("cols R16 + 16x1 SR, transposed", T, C, ms_colsr, 2 * n + q);
      row("R16 amax + cols SR (effective)", T, C, ms_hamax + ms_colsr, 2 * n + q);
      double ms_dq = time_ms([&] { nvfp4_dequant_bf16_unscaled(c, s, T, C, y); }, it);
      row("dequant -> BF16 (unscaled)", T, C, ms_dq, q + 2 * n);
    }
  // Weights: W [N, K] fp32 master -> W and W^T.
  const int WN[3] = {4096, 14336, 4096}, WK[3] = {4096, 4096, 14336};
  for (int i = 0; i < 3; i++) {
    const double n = (double)WN[i] * WK[i];
    nvfp4_amax_f32_cuda(amax, wf, (size_t)n);
    double ms = time_ms([&] { nvfp4_quantize_weight_cuda(wf, WN[i], WK[i], amax, c, s, ct, st); }, it);
    row("weight 16x16 fp32 -> W, W^T", WN[i], WK[i], ms, 4 * n + 2 * (n / 2 + n / 16));
    double ms_a = time_ms([&] { nvfp4_amax_f32_cuda(amax, wf, (size_t)n); }, it);
    row("amax (fp32 weight)", WN[i], WK[i], ms_a, 4 * n);
  }
  CUDA_FREE_ALL(x, y, wf, c, s, ct, st, amax);
}

int main(int argc, char **argv) {
  rng_seed(&rng, 2024);
  CUDA_CHECK(cudaEventCreate(&ev0));
  CUDA_CHECK(cudaEventCreate(&ev1));
  TEST_SECTION("random shapes, every input kind: GPU == CPU byte for byte");
  // rows 1..300; K multiples of 16 incl. non-powers of two; column-copy-only K (not multiples of 16).
  const int shapes[][2] = {{1, 16},     {1, 4096},  {2, 48},    {3, 32},    {7, 96},   {15, 160},
                           {16, 16},    {16, 20},   {16, 37},   {17, 64},   {32, 96},  {48, 160},
                           {64, 40},    {64, 4096}, {100, 112}, {128, 256}, {144, 80}, {255, 32},
                           {256, 1024}, {288, 336}, {300, 208}, {320, 130}};
  const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
  for (int i = 0; i < nshapes; i++) check_case(IN_NORMAL, shapes[i][0], shapes[i][1], 0);
  TEST_SECTION("edge-case inputs");
  for (int kind = 0; kind < IN_NKINDS; kind++) {
    check_case(kind, 64, 160, 0);
    check_case(kind, 48, 96, 0);
    check_case(kind, 300, 48, 0);
  }
  TEST_SECTION("stale amax (saturation at 448 and +-6)");
  check_case(IN_NORMAL, 64, 96, 1);
  check_case(IN_OUTLIERS, 128, 160, 1);
  test_alpha();
  if (argc > 1 && !strcmp(argv[1], "--no-bench")) printf("(benchmark skipped)\n");
  else bench();
  CUDA_CHECK(cudaEventDestroy(ev0));
  CUDA_CHECK(cudaEventDestroy(ev1));
  TEST_END();
}
