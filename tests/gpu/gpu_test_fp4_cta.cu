// tests/gpu/gpu_test_fp4_cta.cu: the CUDA CTA-local NVFP4 producers and epilogue (fp4/nvfp4_cta.cu)
// against the CPU reference (fp4/nvfp4_cta.c), BYTE FOR BYTE: packed codes, folded E4M3 scales and the
// fp32 outer factors' bits, for row copies (RNE and SR), column copies (no rotation, fixed-sign and
// plain H16) and 2D16 weights (from fp32 and BF16), on shapes with partial chunks and stripes and on
// edge-case inputs (zeros, constant blocks, outliers, huge / tiny / subnormal magnitudes, NaN and Inf);
// then the epilogue against nvfp4_cta_apply_outer (same fp32 products, BF16 rounding and accumulation).
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "fp4/hadamard.h"
#include "fp4/nvfp4_cta.h"
#include "tests/gpu/gpu_util.h"
#include "tests/test.h"

typedef __nv_bfloat16 bf16;
static Rng rng;

enum { IN_HUGE = IN_SHARED_KINDS, IN_TINY, IN_SPECIAL, IN_NKINDS };
static const char *in_name[IN_NKINDS] = {"normal", "outliers", "zeros", "const", "huge", "tiny", "nan/inf"};

static float *make_input(int kind, int rows, int K) {
  const size_t n = (size_t)rows * K;
  float *x = (float *)xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    const size_t blk = i / 16;
    float v = shared_input(kind, rng_normal(&rng), i, blk, K, &rng);
    if (kind == IN_HUGE) v *= blk % 7 == 0 ? 1e30f : blk % 7 == 1 ? 1e-30f : 1.0f;
    if (kind == IN_TINY) v *= i % 5 ? 1e-39f : 1e-36f;
    if (kind == IN_SPECIAL && blk % 11 == 3 && i % 16 == 5) v = NAN;
    if (kind == IN_SPECIAL && blk % 13 == 4 && i % 16 == 2) v = -INFINITY;
    x[i] = bf16r(v);
  }
  return x;
}

static void *dalloc(size_t bytes) {
  void *p;
  CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
  CUDA_CHECK(cudaMemset(p, 0xAB, bytes ? bytes : 1));  // garbage: every output byte must be written
  return p;
}

static void *upload(const void *h, size_t bytes) {
  void *d = dalloc(bytes);
  CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}

static bf16 *upload_bf16(const float *x, size_t n) {
  bf16 *h = (bf16 *)xmalloc(n * sizeof(bf16) + 1);
  for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(x[i]);
  bf16 *d = (bf16 *)upload(h, n * sizeof(bf16));
  free(h);
  return d;
}

static void download(void *h, const void *d, size_t bytes) {
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

// The device copy (codes, scales, outer) of a carrier [crows, ccols], against the host reference's.
static int same(const char *what, const uint8_t *dc, const uint8_t *ds, const float *dout, const uint8_t *hc,
                const uint8_t *hs, const float *hout, int crows, int ccols) {
  size_t nc = (size_t)crows * ccols / 2, ns = (size_t)crows * ccols / 16, no = (size_t)cta_stripes(crows);
  uint8_t *c = (uint8_t *)xmalloc(nc + 1), *s = (uint8_t *)xmalloc(ns + 1);
  float *o = (float *)xmalloc(no * sizeof(float));
  download(c, dc, nc), download(s, ds, ns), download(o, dout, no * sizeof(float));
  int bad = 0;
  for (size_t i = 0; i < nc && bad < 3; i++)
    if (c[i] != hc[i])
      printf("  %s: code byte %zu (row %zu): 0x%02x, want 0x%02x\n", what, i, i / (ccols / 2), c[i], hc[i]), bad++;
  for (size_t i = 0; i < ns && bad < 6; i++)
    if (s[i] != hs[i])
      printf("  %s: scale %zu (row %zu): 0x%02x, want 0x%02x\n", what, i, i / (ccols / 16), s[i], hs[i]), bad++;
  for (size_t i = 0; i < no && bad < 9; i++)
    if (fp4_f2u(o[i]) != fp4_f2u(hout[i])) printf("  %s: outer[%zu] %.9g, want %.9g\n", what, i, o[i], hout[i]), bad++;
  free(c), free(s), free(o);
  return bad == 0;
}

typedef struct {
  uint8_t *c, *s;
  float *o;
} Dev;

static Dev dev_out(int crows, int ccols) {
  return (Dev){(uint8_t *)dalloc((size_t)crows * ccols / 2), (uint8_t *)dalloc((size_t)crows * ccols / 16),
               (float *)dalloc((size_t)cta_stripes(crows) * sizeof(float))};
}
static void dev_free(Dev *d) { cudaFree(d->c), cudaFree(d->s), cudaFree(d->o); }

static void check_case(int kind, int rows, int K) {
  char what[128];
  float *x = make_input(kind, rows, K);
  bf16 *dx = upload_bf16(x, (size_t)rows * K);
  uint32_t *scratch = (uint32_t *)dalloc((nvfp4_cta_scratch_words(rows, K) > nvfp4_cta_scratch_words(K, rows)
                                              ? nvfp4_cta_scratch_words(rows, K)
                                              : nvfp4_cta_scratch_words(K, rows)) *
                                         4);
  uint8_t *hc = (uint8_t *)xmalloc((size_t)rows * K / 2 + 1), *hs = (uint8_t *)xmalloc((size_t)rows * K / 16 + 1);
  float *ho = (float *)xmalloc(((size_t)cta_stripes(rows > K ? rows : K) + 1) * sizeof(float));
  // rows, RNE and SR
  for (int sr = 0; sr < 2; sr++) {
    PhiloxStream s = philox_stream(42, 7, 3, 5, 2);
    nvfp4_cta_quantize_rows(x, rows, K, sr ? NV_SR : NV_RNE, s, hc, hs, ho);
    Dev d = dev_out(rows, K);
    nvfp4_cta_quantize_rows_cuda(dx, rows, K, sr ? NV_SR : NV_RNE, s, d.c, d.s, d.o, scratch);
    snprintf(what, sizeof what, "%s %dx%d rows %s", in_name[kind], rows, K, sr ? "SR" : "RNE");
    CHECK(same(what, d.c, d.s, d.o, hc, hs, ho, rows, K), "%s: GPU bytes differ from the CPU reference", what);
    dev_free(&d);
  }
  // columns, each rotation (rows % 16 == 0)
  if (rows % 16 == 0)
    for (int rot = 0; rot < 3; rot++) {
      PhiloxStream s = philox_stream(42, 7, 3, 5, 3);
      nvfp4_cta_quantize_cols(x, rows, K, rot, NV_RNE, s, hc, hs, ho);
      Dev d = dev_out(K, rows);
      nvfp4_cta_quantize_cols_cuda(dx, rows, K, rot, NV_RNE, s, d.c, d.s, d.o, scratch);
      snprintf(what, sizeof what, "%s %dx%d cols rot %d", in_name[kind], rows, K, rot);
      CHECK(same(what, d.c, d.s, d.o, hc, hs, ho, K, rows), "%s: GPU bytes differ from the CPU reference", what);
      dev_free(&d);
    }
  // weights W [rows, K] (multiples of 16), from fp32 and from BF16, both orientations
  if (rows % 16 == 0) {
    uint8_t *hct = (uint8_t *)xmalloc((size_t)rows * K / 2 + 1), *hst = (uint8_t *)xmalloc((size_t)rows * K / 16 + 1);
    float *hot = (float *)xmalloc(((size_t)cta_stripes(K) + 1) * sizeof(float));
    nvfp4_cta_quantize_weight(x, rows, K, hc, hs, ho, hct, hst, hot);
    float *dw32 = (float *)upload(x, (size_t)rows * K * sizeof(float));
    for (int src = 0; src < 2; src++) {
      Dev d = dev_out(rows, K), t = dev_out(K, rows);
      if (src) nvfp4_cta_quantize_weight_bf16_cuda(dx, rows, K, d.c, d.s, d.o, t.c, t.s, t.o, scratch);
      else nvfp4_cta_quantize_weight_cuda(dw32, rows, K, d.c, d.s, d.o, t.c, t.s, t.o, scratch);
      snprintf(what, sizeof what, "%s %dx%d weight (%s) W", in_name[kind], rows, K, src ? "bf16" : "fp32");
      CHECK(same(what, d.c, d.s, d.o, hc, hs, ho, rows, K), "%s differs from the CPU reference", what);
      snprintf(what, sizeof what, "%s %dx%d weight (%s) W^T", in_name[kind], rows, K, src ? "bf16" : "fp32");
      CHECK(same(what, t.c, t.s, t.o, hct, hst, hot, K, rows), "%s differs from the CPU reference", what);
      dev_free(&d), dev_free(&t);
    }
    cudaFree(dw32);
    free(hct), free(hst), free(hot);
  }
  cudaFree(dx), cudaFree(scratch);
  free(x), free(hc), free(hs), free(ho);
}

// The epilogue on fp32 accumulators: BF16 out, fp32 out, fp32 accumulated, against the reference.
static void test_epilogue(void) {
  const int M = 300, N = 520;
  float *acc = (float *)xmalloc((size_t)M * N * sizeof(float)), a[2], b[3], *ref = (float *)xmalloc((size_t)M * N * 4);
  for (size_t i = 0; i < (size_t)M * N; i++) acc[i] = rng_normal(&rng) * 100.0f;
  a[0] = 0.0123f, a[1] = 3.5e-5f, b[0] = 7.0f, b[1] = 1e-20f, b[2] = 0.5f;
  memcpy(ref, acc, (size_t)M * N * sizeof(float));
  nvfp4_cta_apply_outer(ref, M, N, a, b);
  float *dacc = (float *)upload(acc, (size_t)M * N * 4), *da = (float *)upload(a, sizeof a),
        *db = (float *)upload(b, sizeof b);
  float *dout = (float *)dalloc((size_t)M * N * 4), *got = (float *)xmalloc((size_t)M * N * 4);
  bf16 *dh = (bf16 *)dalloc((size_t)M * N * 2), *gh = (bf16 *)xmalloc((size_t)M * N * 2);
  nvfp4_cta_apply_outer_cuda(dacc, M, N, da, db, NULL, dout, 0);
  download(got, dout, (size_t)M * N * 4);
  CHECK(!memcmp(got, ref, (size_t)M * N * 4), "epilogue fp32: bits differ from nvfp4_cta_apply_outer");
  nvfp4_cta_apply_outer_cuda(dacc, M, N, da, db, NULL, dout, 1);
  download(got, dout, (size_t)M * N * 4);
  int acc_ok = 1, bf_ok = 1;
  for (size_t i = 0; i < (size_t)M * N; i++) acc_ok &= fp4_f2u(got[i]) == fp4_f2u(ref[i] + ref[i]);
  CHECK(acc_ok, "epilogue fp32 accumulate: out + acc * (alpha beta)");
  nvfp4_cta_apply_outer_cuda(dacc, M, N, da, db, dh, NULL, 0);
  download(gh, dh, (size_t)M * N * 2);
  for (size_t i = 0; i < (size_t)M * N; i++)
    bf_ok &= __bfloat162float(gh[i]) == __bfloat162float(__float2bfloat16(ref[i]));
  CHECK(bf_ok, "epilogue BF16: the RNE rounding of the fp32 result");
  cudaFree(dacc), cudaFree(da), cudaFree(db), cudaFree(dout), cudaFree(dh);
  free(acc), free(ref), free(got), free(gh);
}

int main(void) {
  rng_seed(&rng, 2026);
  const int shapes[][2] = {{16, 16}, {128, 128}, {256, 4096}, {272, 208}, {300, 160}, {513, 96}, {1024, 1024}};
  TEST_SECTION("CTA-local NVFP4 producers: GPU bytes == CPU bytes");
  for (int k = 0; k < IN_NKINDS; k++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) check_case(k, shapes[s][0], shapes[s][1]);
  TEST_SECTION("the outer-factor epilogue");
  test_epilogue();
  TEST_END();
}
