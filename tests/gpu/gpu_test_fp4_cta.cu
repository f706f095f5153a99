// tests/gpu/gpu_test_fp4_cta.cu: the CUDA CTA-local NVFP4 producers and epilogue (fp4/nvfp4_cta.cu)
// against the CPU reference (fp4/nvfp4_cta.c), BYTE FOR BYTE: packed codes, folded E4M3 scales and the
// fp32 outer factors' bits, for row copies (RNE and SR), column copies (no rotation, fixed-sign and
// plain H16) and 2D16 weights (from fp32 and BF16), on shapes with partial chunks and stripes and on
// edge-case inputs (zeros, constant blocks, outliers, huge / tiny / subnormal magnitudes, NaN and Inf,
// whole zero chunks); then the epilogue against nvfp4_cta_apply_outer (same fp32 products, BF16 rounding
// and accumulation); then the operand hybrid's one-read dY producer (fp4/cta_mx_dual.cu) against the two
// producers it replaces, byte for byte, and the hybrid linear's Dgrad and Wgrad with it on and off.
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "fp4/cta_mx_dual.h"
#include "fp4/fp8_embed.h"
#include "fp4/hadamard.h"
#include "fp4/mxfp4.h"
#include "fp4/nvfp4_cta.h"
#include "fp4/recipe.h"
#include "tests/gpu/gpu_ops_util.h"
#include "tests/test.h"

typedef __nv_bfloat16 bf16;

enum { IN_HUGE = IN_SHARED_KINDS, IN_TINY, IN_SPECIAL, IN_CHUNKS, IN_NKINDS };
static const char *in_name[IN_NKINDS] = {"normal", "outliers", "zeros", "const", "huge", "tiny", "nan/inf", "chunks"};

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
    // whole 128 x 128 chunks of zeros beside chunks with a rare outlier (x 1e4)
    if (kind == IN_CHUNKS) v = ((i / K) / 128 + (i % K) / 128) % 3 == 1 ? 0.0f : i % 997 == 13 ? v * 1e4f : v;
    x[i] = bf16r(v);
  }
  return x;
}

static void *dalloc(size_t bytes) { return dev_alloc(bytes, 0xAB); }  // garbage: every output byte must be written

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

// ---- the operand hybrid's dY producer (fp4/cta_mx_dual.cu) ---------------------------------------

// n bytes of two device buffers equal (a mismatch printed, naming the part).
static int same_bytes(const char *what, const char *part, const void *da, const void *db, size_t n) {
  char w[512];
  snprintf(w, sizeof w, "%s: %s (expected: the separate producers')", what, part);
  return same_bytes_at(w, da, 1, db, 1, n, 0);
}

// An MXFP4 column copy [K, rows] of a rows x K source: packed (kind 0), FP8 VEC128 (1) or BLK128x128 (2),
// every byte garbage, with a zeroed tile counter for kind 2.
typedef struct {
  MxOut o;
  size_t nq, ns;  // bytes of q and of e8m0 / scale
} ColBuf;

static ColBuf col_buf(int kind, int rows, int K) {
  ColBuf c;
  memset(&c, 0, sizeof c);
  c.o.fp8 = kind > 0, c.o.blk128 = kind == 2, c.o.scale_mul = 1.0f;
  c.nq = kind ? (size_t)K * rows : (size_t)K * rows / 2;
  c.ns = kind == 0   ? (size_t)K * rows / 32
         : kind == 1 ? mx_vec128_scale_count(K, rows) * sizeof(float)
                     : mx_blk128_scale_count(K, rows) * sizeof(float);
  c.o.q = (uint8_t *)dalloc(c.nq);
  if (kind) c.o.scale = (float *)dalloc(c.ns);
  else c.o.e8m0 = (uint8_t *)dalloc(c.ns);
  if (kind == 2) {
    c.o.rounded = (unsigned long long *)dalloc(8);
    CUDA_CHECK(cudaMemset(c.o.rounded, 0, 8));
  }
  return c;
}
static void col_free(ColBuf *c) { cudaFree(c->o.q), cudaFree(c->o.scale), cudaFree(c->o.e8m0), cudaFree(c->o.rounded); }
static const void *col_scales(const ColBuf *c) { return c->o.fp8 ? (const void *)c->o.scale : c->o.e8m0; }

// The column copy as the linear makes it without the hybrid producer (model/cuda/linear_mxfp4.cu's
// cols): the MXFP4 dual producer's column copy for H32 or none; mx_quantize_cols_cuda, then the FP8
// embedding, for H16 and plain H16.
static void separate_cols(const bf16 *dx, int rows, int K, MxScale mode, int had, const ColBuf *c) {
  const PhiloxStream none = {};
  if (had == 0 || had == 32) {
    mx_quantize_dual_cuda(dx, rows, K, mode, MX_RNE, none, MxOut{}, had == 32, c->o);
    return;
  }
  if (!c->o.fp8) {
    mx_quantize_cols_cuda(dx, rows, K, mode, had, MX_RNE, none, c->o.q, c->o.e8m0);
    return;
  }
  uint8_t *q = (uint8_t *)dalloc((size_t)K * rows / 2), *e = (uint8_t *)dalloc((size_t)K * rows / 32);
  mx_quantize_cols_cuda(dx, rows, K, mode, had, MX_RNE, none, q, e);
  if (c->o.blk128) mx_embed_blk128_cuda(q, e, K, rows, 1.0f, c->o.q, c->o.scale);
  else mx_embed_vec128_cuda(q, e, K, rows, 1.0f, c->o.q, c->o.scale);
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  cudaFree(q), cudaFree(e);
}

// Every rounding of the row copy (RNE, SR under two streams), column rotation (none, H32, fixed-sign H16,
// plain H16), column output and scale rounding: the hybrid producer's row copy (codes, folded scales,
// outer factors) and column copy (codes or E4M3 bytes, scales, the tile counter) against the separate
// producers'. Every output and the chunk scratch start as garbage.
static void check_hybrid(int kind, int rows, int K) {
  float *x = make_input(kind, rows, K);
  bf16 *dx = upload_bf16(x, (size_t)rows * K);
  const size_t words = nvfp4_cta_scratch_words(rows, K);
  const PhiloxStream streams[3] = {
      {}, philox_stream(42, 7, 3, 5, 0), philox_stream(0x9E3779B97F4A7C15ull, 123456, 1, 31, 4)};
  const int hads[4] = {0, 32, 16, MX_HADAMARD_H16_PLAIN};
  const char *had_name[4] = {"none", "H32", "H16", "plain H16"}, *col_name[3] = {"packed", "fp8 vec128", "fp8 blk128"};
  for (int v = 0; v < 3; v++) {
    const NvRound rnd = v ? NV_SR : NV_RNE;
    uint32_t *ref_scratch = (uint32_t *)dalloc(words * 4);
    Dev ref = dev_out(rows, K);
    nvfp4_cta_quantize_rows_cuda(dx, rows, K, rnd, streams[v], ref.c, ref.s, ref.o, ref_scratch);
    {  // the separate row producer itself against the C reference on these shapes
      uint8_t *hc = (uint8_t *)xmalloc((size_t)rows * K / 2), *hs = (uint8_t *)xmalloc((size_t)rows * K / 16);
      float *ho = (float *)xmalloc((size_t)cta_stripes(rows) * sizeof(float));
      char what[128];
      nvfp4_cta_quantize_rows(x, rows, K, rnd, streams[v], hc, hs, ho);
      snprintf(what, sizeof what, "%s %dx%d rows %s (hybrid shapes)", in_name[kind], rows, K, v ? "SR" : "RNE");
      CHECK(same(what, ref.c, ref.s, ref.o, hc, hs, ho, rows, K), "%s: GPU bytes differ from the CPU reference", what);
      free(hc), free(hs), free(ho);
    }
    for (int h = 0; h < 4; h++)
      for (int ck = 0; ck < 3; ck++)
        for (int m = 0; m < 2; m++) {
          const MxScale mode = m ? MX_SCALE_DOWN : MX_SCALE_UP;
          char what[160];
          snprintf(what, sizeof what, "%s %dx%d hybrid rows %s%s, cols %s %s%s", in_name[kind], rows, K,
                   v ? "SR " : "RNE", v ? (v == 1 ? "a" : "b") : "", had_name[h], col_name[ck], m ? " down" : "");
          ColBuf cref = col_buf(ck, rows, K), cf = col_buf(ck, rows, K);
          separate_cols(dx, rows, K, mode, hads[h], &cref);
          Dev d = dev_out(rows, K);
          uint32_t *scratch = (uint32_t *)dalloc(words * 4);
          cta_mx_dual_cuda(dx, rows, K, rnd, streams[v], d.c, d.s, d.o, scratch, mode, hads[h], cf.o);
          int ok = same_bytes(what, "row codes", d.c, ref.c, (size_t)rows * K / 2) &&
                   same_bytes(what, "row scales", d.s, ref.s, (size_t)rows * K / 16) &&
                   same_bytes(what, "row outer factors", d.o, ref.o, (size_t)cta_stripes(rows) * sizeof(float)) &&
                   same_bytes(what, "column codes", cf.o.q, cref.o.q, cf.nq) &&
                   same_bytes(what, "column scales", col_scales(&cf), col_scales(&cref), cf.ns);
          if (ok && ck == 2 && (hads[h] == 0 || hads[h] == 32)) {  // the dual producer counts tiled blocks too
            unsigned long long a, b;
            download(&a, cf.o.rounded, 8), download(&b, cref.o.rounded, 8);
            if (a != b) printf("  %s: %llu blocks outside the FP8 tile range, the dual producer %llu\n", what, a, b);
            ok = a == b;
          }
          CHECK(ok, "%s: the hybrid producer's bytes differ from the separate producers'", what);
          dev_free(&d), col_free(&cref), col_free(&cf);
          cudaFree(scratch);
        }
    dev_free(&ref);
    cudaFree(ref_scratch);
  }
  cudaFree(dx);
  free(x);
}

// The hybrid linear (Fprop and Wgrad MXFP4, Dgrad CTA-local) through the backend: Dgrad and Wgrad with the
// hybrid producer (one fused producer run per backward) and with the separate producers (precision.fusion off:
// none), bit for bit, for both routes' Hadamards, the FP8 embedding with each Wgrad tiling and the exact
// reference GEMM, two (step, micro) points of the SR stream; and no hybrid producer where the column copy
// takes SR (precision.sr dgrad_wgrad).
static void check_hybrid_linear(int N, int in, int out, int fp8) {
  const uint64_t seed = 42;  // the SR stream's
  float *hw = randn((size_t)in * out, 0.02f, 1), *hx = randn((size_t)N * in, 1.0f, 1);
  float *hdy = randn((size_t)N * out, 0.01f, 1);
  for (size_t i = 0; i < (size_t)N * out; i++) {  // a zero chunk and outliers in dY
    const size_t r = i / out, c = i % out;
    if (r < 128 && c >= 128 && c < 256) hdy[i] = 0.0f;
    if (i % 613 == 5) hdy[i] *= 512.0f;
  }
  float *w = (float *)G->alloc(G->ctx, (size_t)in * out * sizeof(float));
  G->bind_params(G->ctx, w, (size_t)in * out);
  G->upload(G->ctx, w, hw, (size_t)in * out * sizeof(float));
  G->params_changed(G->ctx);
  void *x = dev_bf16(hx, (size_t)N * in), *dy = dev_bf16(hdy, (size_t)N * out);
  void *y = G->alloc(G->ctx, (size_t)N * out * 2), *dxo = G->alloc(G->ctx, (size_t)N * in * 2);
  float *dw = (float *)G->alloc(G->ctx, (size_t)in * out * sizeof(float));
  const LinearId id = {0, LIN_GATE};
  const char *hads[2] = {"h32", "h16_plain"}, *gemms[4] = {"reference", "auto", "auto", "auto"},
             *tiles[4] = {"off", "dy", "x", "off"};
  for (int h = 0; h < 2; h++)
    for (int g = 0; g < (fp8 ? 4 : 1); g++)
      for (int sr = 0; sr < 2; sr++) {
        if (sr && g) continue;  // the SR column copy: one back end suffices
        RecipeSpec spec;
        memset(&spec, 0, sizeof spec);
        spec.recipe = "mxfp4", spec.dgrad = "nvfp4_cta", spec.sr = sr ? "dgrad_wgrad" : "dgrad";
        spec.hadamard = hads[h], spec.weight_2d = "on", spec.scale_rounding = "up";
        spec.fp4_gemm = gemms[g], spec.wgrad_2d = g ? tiles[g] : NULL;
        Recipe r;
        char err[256], what[160];
        if (recipe_resolve(&r, &spec, 90, err, sizeof err)) die("check_hybrid_linear: %s", err);
        snprintf(what, sizeof what, "N=%d in=%d out=%d %s, %s%s%s, sr %s", N, in, out, hads[h], gemms[g],
                 g ? " wgrad_2d " : "", g ? tiles[g] : "", spec.sr);
        for (int p = 0; p < 2; p++) {
          float *dxs[2], *dws[2];
          long ran[2];
          for (int on = 1; on >= 0; on--) {
            r.fusion = on ? FUSION_AUTO : FUSION_OFF;  // the hybrid producer runs under auto
            cuda_set_recipe(CB, &r, 1, seed);
            G->set_step(G->ctx, p ? 1234567 : 3, p ? 0 : 1);
            G->matmul_fwd(G->ctx, id, y, x, w, N, in, out);
            G->zero(G->ctx, dw, (size_t)in * out * sizeof(float));
            const long before = linear_fp4_fused_calls(LF);
            G->matmul_bwd(G->ctx, id, dxo, dw, dy, x, w, N, in, out, 0);
            ran[on] = linear_fp4_fused_calls(LF) - before;
            dxs[on] = host_bf16(dxo, (size_t)N * in), dws[on] = host_f32(dw, (size_t)in * out);
          }
          CHECK(ran[1] == (sr ? 0 : 1) && ran[0] == 0, "%s: %ld hybrid producers ran (fusion on), %ld (off)", what,
                ran[1], ran[0]);
          CHECK(!memcmp(dxs[1], dxs[0], (size_t)N * in * sizeof(float)), "%s: Dgrad differs with the hybrid producer",
                what);
          CHECK(!memcmp(dws[1], dws[0], (size_t)in * out * sizeof(float)), "%s: Wgrad differs with the hybrid producer",
                what);
          printf("  %s, step point %d: Dgrad and Wgrad %s with the hybrid producer (%ld run)\n", what, p,
                 !memcmp(dxs[1], dxs[0], (size_t)N * in * 4) && !memcmp(dws[1], dws[0], (size_t)in * out * 4)
                     ? "bit-identical"
                     : "DIFFERENT",
                 ran[1]);
          for (int k = 0; k < 2; k++) free(dxs[k]), free(dws[k]);
        }
      }
  cuda_set_recipe(CB, NULL, 0, 0);
  void *bufs[] = {w, x, dy, y, dxo, dw};
  for (int i = 0; i < 6; i++) G->release(G->ctx, bufs[i]);
  free(hw), free(hx), free(hdy);
}

int main(void) {
  rng_seed(&rng, 2026);
  const int shapes[][2] = {{16, 16}, {128, 128}, {256, 4096}, {272, 208}, {300, 160}, {513, 96}, {1024, 1024}};
  TEST_SECTION("CTA-local NVFP4 producers: GPU bytes == CPU bytes");
  for (int k = 0; k < IN_NKINDS; k++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) check_case(k, shapes[s][0], shapes[s][1]);
  TEST_SECTION("the outer-factor epilogue");
  test_epilogue();
  TEST_SECTION("the operand hybrid's dY producer: one read, the two separate producers' bytes");
  const int hshapes[][2] = {{32, 32}, {128, 128}, {160, 96}, {288, 224}, {800, 160}, {512, 1024}};
  for (int k = 0; k < IN_NKINDS; k++)
    for (size_t s = 0; s < sizeof hshapes / sizeof *hshapes; s++) check_hybrid(k, hshapes[s][0], hshapes[s][1]);
  TEST_SECTION("the hybrid linear: Dgrad and Wgrad bit-identical with the hybrid producer on and off");
  CHECK(open_backend(), "a CUDA backend instance on device 0");
  if (G) {
    check_hybrid_linear(512, 384, 384, 1);  // FP8 back end: tokens and in multiples of 128
    check_hybrid_linear(288, 256, 160, 0);  // partial tiles and stripes of dY (reference GEMM)
  }
  TEST_END();
}
