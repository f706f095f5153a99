// tests/gpu/gpu_test_fp4_gemm.cu: the FP4 GEMM back ends (fp4/gemm_fp4.h) on MXFP4 operands built on the
// host by the CPU reference quantizers, for the three uses of a linear layer at several shapes, then
// the FP8 path's TFLOP/s at the Llama-3 8B shapes beside gemm_bf16's.
//
// Every check compares against an fp64 GEMM of the dequantized MXFP4 values (q * 2^e, alpha = 1/36).
// Tolerances are relative L2 norms of the error over the reference:
// - reference path, fp32 out: BF16 operands are exactly q * 2^e, products are exact in fp32, only the
//   fp32 accumulation rounds: the probe saw 2.7e-8 at K = 4096; 1e-6 fails on any wrong value/layout.
// - FP8 path, fp32 out: E4M3 products are exact; Hopper's FP8 MMA accumulates with reduced precision
//   before each fp32 promotion (probe: 2.4e-6 at K = 4096); 1e-5.
// - BF16 out: one rounding to BF16 (unit roundoff 2^-9 = 2e-3); 1e-2.
// Embedding exactness (E4M3 * scale == q * 2^e for every element) is asserted on the host first: the
// data keep the block spread within a 128-group under 2^14 (fp8_embed.h), so the FP8 path's operands
// are the MXFP4 values bit for bit and its only error is accumulation.
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fp4/fp8_embed.h"
#include "fp4/gemm_cutlass.h"
#include "fp4/gemm_fp4.h"
#include "fp4/mxfp4.h"
#include "fp4/nvfp4.h"
#include "common/cuda_common.h"
#include "common/gemm.h"
#include "tests/test.h"
#include "tests/gpu/gpu_util.h"

static const double TOL_REF = 1e-6, TOL_FP8 = 1e-5, TOL_BF16 = 1e-2;
// Hopper's FP8 MMA adds products in a reduced-precision accumulator (about 14 mantissa bits, as
// DeepSeek-V3's report measured); cuBLASLt promotes to fp32 only at each 128-wide scale block. On
// plain data that is invisible (the H200 gave fp8 == reference bit for bit), but with 1000x spread
// between blocks and x50 outlier tokens large partial sums swallow small products: the H200 showed
// 5e-5 to 1.9e-4 relative L2 against fp64 there (docs/formats.md §3's probe: a worst element of 2e-4). So the
// outlier layers allow 2^-11 (4.9e-4), the accumulator's precision with margin, and no more.
static const double TOL_FP8_SPREAD = 4.8828125e-4;
static double g_tol_fp8 = 1e-5;           // TOL_FP8, or TOL_FP8_SPREAD inside an outlier layer
static const float ALPHA = 1.0f / 36.0f;  // mx_unit(MX_SCALE_UP)^2

static void *upload(const void *h, size_t bytes) {
  void *d;
  CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 16));
  if (bytes) CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}

static void sync_stream(void) { CUDA_CHECK(cudaStreamSynchronize(cuda_stream())); }

// An MXFP4 operand [rows, K] (K-contiguous): packed codes and E8M0 scales from the CPU quantizer, its
// exact values, its FP8 embedding (VEC128 or BLK128x128, scale_mul 1), and device copies.
typedef struct {
  int rows, K, blk;
  int tile_act;  // an activation/gradient in 128x128 tiles: the embedding may round (fp8_embed.h)
  long inexact;  // embedded values that differ from q * 2^e
  uint8_t *codes, *scales, *fp8;
  float *scale;
  double *val;
  uint8_t *d_codes, *d_scales, *d_fp8;
  float *d_scale;
} Operand;

static void operand_finish(Operand *o) {
  int rows = o->rows, K = o->K;
  size_t n = (size_t)rows * K, ns = o->blk ? mx_blk128_scale_count(rows, K) : mx_vec128_scale_count(rows, K);
  float *f = (float *)xmalloc(n * 4);
  mx_dequantize(o->codes, o->scales, rows, K, MX_SCALE_DOWN, f);  // q * 2^e (unit 1)
  o->val = (double *)xmalloc(n * 8);
  for (size_t i = 0; i < n; i++) o->val[i] = f[i];
  o->fp8 = (uint8_t *)xmalloc(n);
  o->scale = (float *)xmalloc(ns * 4);
  if (o->blk) mx_embed_blk128(o->codes, o->scales, rows, K, 1.0f, o->fp8, o->scale);
  else mx_embed_vec128(o->codes, o->scales, rows, K, 1.0f, o->fp8, o->scale);
  long inexact = 0;
  int l4 = mx_blk128_l4(K);
  for (int r = 0; r < rows; r++)
    for (int k = 0; k < K; k++) {
      float s = o->blk ? o->scale[(size_t)(r / 128) * l4 + k / 128] : o->scale[(size_t)(k / 128) * rows + r];
      if (e4m3_decode(o->fp8[(size_t)r * K + k]) * s != f[(size_t)r * K + k]) inexact++;
    }
  // Exact always for VEC128 and for the weights' tiles; a tiled activation or gradient whose 32-blocks
  // spread over more than 14 binades rounds its smallest blocks (counted and printed, then bounded by
  // the fp8-vs-fp64 tolerance in run_use).
  o->inexact = inexact;
  if (o->tile_act && inexact)
    printf("  (operand %dx%d in 128x128 tiles: %ld of %zu values rounded by the embedding)\n", rows, K, inexact, n);
  CHECK(inexact == 0 || o->tile_act, "operand %dx%d %s: %ld of %zu embedded values differ from q*2^e", rows, K,
        o->blk ? "BLK128x128" : "VEC128", inexact, n);
  free(f);
  o->d_codes = (uint8_t *)upload(o->codes, n / 2);
  o->d_scales = (uint8_t *)upload(o->scales, n / 32);
  o->d_fp8 = (uint8_t *)upload(o->fp8, n);
  o->d_scale = (float *)upload(o->scale, ns * 4);
}

static Operand operand_alloc(int rows, int K, int blk) {
  Operand o;
  memset(&o, 0, sizeof o);
  o.rows = rows;
  o.K = K;
  o.blk = blk;
  o.codes = (uint8_t *)xmalloc((size_t)rows * K / 2);
  o.scales = (uint8_t *)xmalloc((size_t)rows * K / 32);
  return o;
}

static void operand_free(Operand *o) {
  free(o->codes), free(o->scales), free(o->fp8), free(o->scale), free(o->val);
  CUDA_FREE_ALL(o->d_codes, o->d_scales, o->d_fp8, o->d_scale);
}

static Fp8Operand fp8_of(const Operand *o) {
  Fp8Operand f = {o->d_fp8, o->d_scale, o->blk};
  return f;
}
static Fp4Operand packed_of(const Operand *o) {
  Fp4Operand p = {o->d_codes, o->d_scales};
  return p;
}

// Writes the initial out (prev, as floats) to the device buffer in the out type.
static void set_out(void *d, const float *prev, size_t n, int fp32) {
  sync_stream();
  if (fp32) {
    CUDA_CHECK(cudaMemcpy(d, prev, n * 4, cudaMemcpyHostToDevice));
    return;
  }
  __nv_bfloat16 *t = (__nv_bfloat16 *)xmalloc(n * 2);
  for (size_t i = 0; i < n; i++) t[i] = __float2bfloat16(prev[i]);
  CUDA_CHECK(cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice));
  free(t);
}

// How two results differ: the share of outputs whose bits differ and the largest relative difference
// among them (|a - b| / max(|a|, |b|)); what docs/gemm_cutlass.md asks for if CUTLASS's bits are ever
// not cuBLASLt's.
typedef struct {
  double frac, max_rel;
} BitDiff;
static BitDiff bit_diff(const float *a, const float *b, size_t n) {
  BitDiff d = {0, 0};
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (!memcmp(&a[i], &b[i], 4)) continue;
    k++;
    const double m = fmax(fabs((double)a[i]), fabs((double)b[i]));
    const double r = m > 0 ? fabs((double)a[i] - b[i]) / m : 1.0;
    d.max_rel = r > d.max_rel || isnan(r) ? r : d.max_rel;
  }
  d.frac = n ? (double)k / n : 0;
  return d;
}

// One GEMM out[M,N] = ALPHA * A . B^T + beta * out through every back end, against fp64.
static void run_use(const char *name, const Operand *A, const Operand *B, int out_fp32, float beta, Rng *rng) {
  int M = A->rows, N = B->rows, K = A->K;
  CHECK(B->K == K, "%s: operand K mismatch %d vs %d", name, K, B->K);
  size_t n = (size_t)M * N;
  double *ref = (double *)xmalloc(n * 8);
  double ss = 0;
  for (int m = 0; m < M; m++)
    for (int j = 0; j < N; j++) {
      const double *a = A->val + (size_t)m * K, *b = B->val + (size_t)j * K;
      double acc = 0;
      for (int k = 0; k < K; k++) acc += a[k] * b[k];
      ref[(size_t)m * N + j] = (double)ALPHA * acc;
      ss += ref[(size_t)m * N + j] * ref[(size_t)m * N + j];
    }
  // An initial out of the result's scale (exact in the out type), for the accumulating form.
  float *prev = (float *)xcalloc(n, 4);
  float rms = (float)sqrt(ss / n);
  if (beta != 0.0f)
    for (size_t i = 0; i < n; i++) {
      prev[i] = __bfloat162float(__float2bfloat16(rms * rng_normal(rng)));
      ref[i] += (double)beta * prev[i];
    }
  double tol_fp8 = out_fp32 ? g_tol_fp8 : TOL_BF16, tol_ref = out_fp32 ? TOL_REF : TOL_BF16;
  void *d_out;
  CUDA_CHECK(cudaMalloc(&d_out, n * (out_fp32 ? 4 : 2)));
  float *got_fp8 = (float *)xmalloc(n * 4), *got_ref = (float *)xmalloc(n * 4), *got = (float *)xmalloc(n * 4);

  // One back end: out starts as prev, the launch runs, the result comes back into dst; and a result's
  // error against the fp64 GEMM, printed and checked.
  auto run = [&](float *dst, auto launch) {
    set_out(d_out, prev, n, out_fp32);
    launch();
    download_floats(dst, d_out, n, out_fp32);
  };
  auto vs_fp64 = [&](const char *path, const float *g, double tol) {
    double e = rel_err_d(g, ref, n);
    printf("%s %.2e  ", path, e);
    CHECK(e < tol, "%s: %s vs fp64: rel L2 %.3e >= %.1e", name, path, e, tol);
  };
  int ok = fp4_gemm_fp8_supported(out_fp32, A->blk, B->blk, M, N, K);
  printf("  %-22s M=%4d N=%4d K=%4d %s%s%s beta=%g: ", name, M, N, K, out_fp32 ? "fp32" : "bf16",
         A->blk ? " A:BLK128x128" : "", B->blk ? " B:BLK128x128" : " B:VEC128", beta);
  auto fp8 = [&] { fp4_gemm_fp8(d_out, out_fp32, fp8_of(A), fp8_of(B), M, N, K, ALPHA, beta); };
  if (ok) {
    run(got_fp8, fp8);
    vs_fp64("fp8", got_fp8, tol_fp8);
    run(got, fp8);  // same inputs, same plan: bit-identical
    CHECK(memcmp(got, got_fp8, n * 4) == 0, "%s: two fp8 calls on the same inputs differ", name);
  } else {
    printf("fp8 refused by cuBLASLt  ");
    // The only refusal allowed is a partial last 128-group: that is the documented constraint.
    CHECK(K % 128 != 0, "%s: cuBLASLt refused the fp8 GEMM at K = %d, a multiple of 128", name, K);
  }

  // CUTLASS's blockwise-scaled kernel (fp4/gemm_cutlass.cu), every configuration: against fp64, twice
  // bit-identical, and against cuBLASLt's bits where cuBLASLt takes the shape (a partial last 128-group:
  // fp64 alone): the same two-level sums in the same order and the same epilogue arithmetic, so the
  // same bits are expected; the share of outputs that differ and by how much is printed either way.
  const char *no_cutlass = fp4_gemm_cutlass_unsupported(out_fp32, fp8_of(A), fp8_of(B), M, N, K);
  if (!no_cutlass) {
    float *got_cut = (float *)xmalloc(n * 4), *oracle = ok ? got_fp8 : NULL;  // cuBLASLt's bits
    for (int ci = 0; ci < fp4_gemm_cutlass_configs(0, NULL); ci++) {
      auto cut = [&] { fp4_gemm_cutlass_cfg(d_out, NULL, out_fp32, fp8_of(A), fp8_of(B), M, N, K, ALPHA, beta, ci); };
      char path[40];
      snprintf(path, sizeof path, "cutlass%d", ci);
      run(got_cut, cut);
      vs_fp64(path, got_cut, tol_fp8);
      run(got, cut);
      CHECK(memcmp(got, got_cut, n * 4) == 0, "%s: two %s (%s) calls on the same inputs differ", name, path,
            fp4_gemm_cutlass_cfg_name(ci));
      if (oracle) {
        const BitDiff d = bit_diff(got_cut, oracle, n);
        printf("%s-vs-fp8 %.1e of outputs (max rel %.1e)  ", path, d.frac, d.max_rel);
        CHECK(d.frac == 0, "%s: %s (%s) differs from cuBLASLt's bits in %.3e of the outputs, by up to %.3e relative",
              name, path, fp4_gemm_cutlass_cfg_name(ci), d.frac, d.max_rel);
      }
    }
    free(got_cut);
  } else if (fp4_gemm_cutlass_available()) {
    printf("cutlass: %s  ", no_cutlass);
  }

  // The accumulating BF16 form (a Dgrad with dx_accumulate): which epilogue arithmetic gives cuBLASLt's
  // bits? cuBLASLt's own fp32 accumulators (fp32 out, alpha 1, beta 0: the two-level sums), then on the
  // host: (0) alpha * acc rounded in fp32, then + beta * out (the fp32 out's form); (1) one fused
  // multiply-add, fma(alpha, acc, beta * out); (2) the exact sum rounded once (double); (3) alpha * acc
  // rounded to BF16 first (all of cuBLASLt's bits since 3126cc1, found with our former own kernel's
  // accumulators). All four reported (the finding behind CUTLASS's epilogue here); (3) asserted.
  if (ok && !out_fp32 && beta != 0.0f && fp4_gemm_fp8_supported(1, A->blk, B->blk, M, N, K)) {
    float *acc = (float *)xmalloc(n * 4);
    void *d_acc;
    CUDA_CHECK(cudaMalloc(&d_acc, n * 4));
    fp4_gemm_fp8(d_acc, 1, fp8_of(A), fp8_of(B), M, N, K, 1.0f, 0.0f);
    download_floats(acc, d_acc, n, 1);
    CUDA_CHECK(cudaFree(d_acc));
    size_t match[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
      const float a = acc[i], o = prev[i];
      float t0 = ALPHA * a;
      t0 = t0 + beta * o;
      const float f[4] = {t0, fmaf(ALPHA, a, beta * o), (float)((double)ALPHA * a + (double)beta * o),
                          __bfloat162float(__float2bfloat16(ALPHA * a)) + beta * o};
      for (int j = 0; j < 4; j++) match[j] += __bfloat162float(__float2bfloat16(f[j])) == got_fp8[i];
    }
    printf("bf16 beta epilogue vs cuBLASLt: fp32 first %zu, fma %zu, exact %zu, bf16 first %zu of %zu  ", match[0],
           match[1], match[2], match[3], n);
    CHECK(match[3] == n,
          "%s: cuBLASLt's accumulating BF16 epilogue is not alpha * acc rounded to BF16 first (%zu of %zu)", name,
          match[3], n);
    free(acc);
  }

  // The tuned choice (fp4/gemm_fp8_select.cu): whichever kernel it keeps, the first call (which times
  // both on scratch copies) and the next give cuBLASLt's bits, an accumulating out added to once.
  if (ok) {
    fp4_gemm_fp8_choices_reset();  // this shape tunes again here
    int kernel = 0;
    for (int call = 0; call < 2; call++) {
      run(got, [&] {
        kernel = fp4_gemm_fp8_on(FP8_KERNEL_TUNED, d_out, NULL, out_fp32, fp8_of(A), fp8_of(B), M, N, K, ALPHA, beta);
      });
      CHECK(memcmp(got, got_fp8, n * 4) == 0, "%s: tuned call %d (%s) differs from cuBLASLt: rel %.3e", name, call,
            kernel == 2 ? "cutlass" : "cuBLASLt", rel_err(got, got_fp8, n));
    }
    const Fp8Choice *c = fp4_gemm_fp8_choice_at(fp4_gemm_fp8_choice_count() - 1);
    CHECK(c && c->calls == 2 && c->kernel == kernel && (kernel == 0 || kernel == 2) && c->key[3] == M &&
              c->key[4] == N && c->key[5] == K,
          "%s: the choice recorded (%d calls, kernel %d)", name, c ? (int)c->calls : -1, c ? c->kernel : -1);
    if (c) printf("tuned: %s  ", c->kernel == 2 ? "cutlass" : "cuBLASLt");
  }

  // beta's matrix read from another buffer (fp4_gemm_fp8_src: the residual stream added in the o and down
  // projections' epilogue, beta 1), on every kernel: out starts as garbage, which no kernel may read; the
  // in-place form's bits; src untouched. With beta 1 also the unfused path's bits: the GEMM alone (beta 0,
  // rounded to BF16), then src + it in fp32 rounded once, as model/cuda/residual.cu adds (here on the host).
  if (ok && !out_fp32 && beta != 0.0f) {
    __nv_bfloat16 *d_src;
    CUDA_CHECK(cudaMalloc(&d_src, n * 2));
    set_out(d_src, prev, n, 0);
    float *src_after = (float *)xmalloc(n * 4);
    auto run_src = [&](const char *path, auto launch) {
      sync_stream();
      CUDA_CHECK(cudaMemset(d_out, 0x7f, n * 2));  // 0x7f7f: 3.4e38 in BF16, loud if read
      launch();
      download_floats(got, d_out, n, 0);
      CHECK(memcmp(got, got_fp8, n * 4) == 0, "%s: %s with a separate src differs from the in-place form: rel %.3e",
            name, path, rel_err(got, got_fp8, n));
      download_floats(src_after, d_src, n, 0);
      CHECK(memcmp(src_after, prev, n * 4) == 0, "%s: %s wrote into src", name, path);
    };
    run_src("fp8 src", [&] { fp4_gemm_fp8_src(d_out, d_src, 0, fp8_of(A), fp8_of(B), M, N, K, ALPHA, beta); });
    if (!no_cutlass)
      for (int ci = 0; ci < fp4_gemm_cutlass_configs(0, NULL); ci++)
        run_src(fp4_gemm_cutlass_cfg_name(ci),
                [&] { fp4_gemm_cutlass_cfg(d_out, d_src, 0, fp8_of(A), fp8_of(B), M, N, K, ALPHA, beta, ci); });
    fp4_gemm_fp8_choices_reset();
    for (int call = 0; call < 2; call++)
      run_src("tuned src",
              [&] { fp4_gemm_fp8_on(FP8_KERNEL_TUNED, d_out, d_src, 0, fp8_of(A), fp8_of(B), M, N, K, ALPHA, beta); });
    if (beta == 1.0f) {
      run(got, [&] { fp4_gemm_fp8(d_out, 0, fp8_of(A), fp8_of(B), M, N, K, ALPHA, 0.0f); });
      size_t same = 0;
      for (size_t i = 0; i < n; i++) {
        const float r = __bfloat162float(__float2bfloat16(prev[i] + got[i]));
        same += !memcmp(&r, &got_fp8[i], 4);
      }
      printf("residual in the epilogue = GEMM then add: %zu of %zu  ", same, n);
      CHECK(same == n, "%s: the GEMM with src added in its epilogue differs from the GEMM then the add in %zu of %zu",
            name, n - same, n);
    }
    free(src_after);
    CUDA_CHECK(cudaFree(d_src));
  }

  run(got_ref, [&] { fp4_gemm_reference_fp8(d_out, out_fp32, fp8_of(A), fp8_of(B), M, N, K, ALPHA, beta); });
  vs_fp64("ref", got_ref, tol_ref);
  run(got, [&] {
    fp4_gemm_reference_packed(d_out, out_fp32, FMT_MXFP4, packed_of(A), packed_of(B), M, N, K, ALPHA, beta, NULL);
  });
  // Both reference forms feed gemm_bf16 the same BF16 operands where the embedding is exact: same bits.
  if (!A->inexact && !B->inexact)
    CHECK(memcmp(got, got_ref, n * 4) == 0,
          "%s: reference from packed MXFP4 differs from reference from fp8 (rel %.3e)", name, rel_err(got, got_ref, n));
  else
    CHECK(rel_err(got, got_ref, n) < tol_fp8, "%s: reference from packed vs from the rounded embedding: rel %.3e", name,
          rel_err(got, got_ref, n));

  if (ok) {
    double d = rel_err(got_fp8, got_ref, n);
    printf("fp8-vs-ref %.2e", d);
    CHECK(d < tol_fp8, "%s: fp8 vs reference: rel L2 %.3e >= %.1e", name, d, tol_fp8);
  }
  if (fp4_gemm_native_available()) {
    run(got,
        [&] { fp4_gemm_native(d_out, out_fp32, FMT_MXFP4, packed_of(A), packed_of(B), M, N, K, ALPHA, beta, NULL); });
    vs_fp64("  native", got, tol_fp8);
  }
  printf("\n");
  CUDA_CHECK(cudaFree(d_out));
  free(ref), free(prev), free(got_fp8), free(got_ref), free(got);
}

// The data of one layer. kind 0: plain normals. kind 1: outliers: token rows x50, a few channel
// columns x1000, and dY with a 1000x spread between 32x32 patches (10^(3u), u uniform).
static void make_layer(int T, int in, int out, int kind, Rng *rng, float *x, float *w, float *dy) {
  for (size_t i = 0; i < (size_t)T * in; i++) x[i] = rng_normal(rng);
  for (size_t i = 0; i < (size_t)out * in; i++) w[i] = 0.02f * rng_normal(rng);
  for (size_t i = 0; i < (size_t)T * out; i++) dy[i] = 1e-3f * rng_normal(rng);
  if (kind != 1) return;
  for (int t = 0; t < T; t += 37)
    for (int c = 0; c < in; c++) x[(size_t)t * in + c] *= 50.0f;
  for (int c = 5; c < in; c += 97)
    for (int t = 0; t < T; t++) x[(size_t)t * in + c] *= 1000.0f;
  for (int tb = 0; tb < T / 32; tb++)
    for (int ob = 0; ob < out / 32; ob++) {
      float f = powf(10.0f, 3.0f * rng_uniform(rng));
      for (int t = tb * 32; t < tb * 32 + 32; t++)
        for (int o = ob * 32; o < ob * 32 + 32; o++) dy[(size_t)t * out + o] *= f;
    }
}

// Fprop, Dgrad and Wgrad of one linear layer (X [T,in], W [out,in], dY [T,out]).
static void test_layer(int T, int in, int out, int kind, Rng *rng) {
  char title[96];
  snprintf(title, sizeof title, "layer T=%d in=%d out=%d %s", T, in, out, kind ? "(outliers, 1000x spread)" : "");
  g_tol_fp8 = kind ? TOL_FP8_SPREAD : TOL_FP8;
  TEST_SECTION(title);
  float *x = (float *)xmalloc((size_t)T * in * 4), *w = (float *)xmalloc((size_t)out * in * 4),
        *dy = (float *)xmalloc((size_t)T * out * 4);
  make_layer(T, in, out, kind, rng, x, w, dy);
  PhiloxStream ps = philox_stream(42, 1, 0, 0, 0);
  Operand X = operand_alloc(T, in, 0), Wq = operand_alloc(out, in, 1), Wt = operand_alloc(in, out, 1);
  Operand DY = operand_alloc(T, out, 0), DYt = operand_alloc(out, T, 0), Xt = operand_alloc(in, T, 0);
  // The Wgrad 2D forms (Recipe.wgrad_2d): dY^T (our A, cuBLASLt's B) or x^T in 128x128 tiles.
  Operand DYt2 = operand_alloc(out, T, 1), Xt2 = operand_alloc(in, T, 1);
  DYt2.tile_act = Xt2.tile_act = 1;
  mx_quantize_rows(x, T, in, MX_SCALE_UP, MX_RNE, ps, X.codes, X.scales);
  mx_quantize_weight(w, out, in, MX_SCALE_UP, 1, Wq.codes, Wq.scales, Wt.codes, Wt.scales);
  mx_quantize_rows(dy, T, out, MX_SCALE_UP, MX_SR, ps, DY.codes, DY.scales);  // row-gradient SR
  mx_quantize_cols(dy, T, out, 1, MX_SCALE_UP, DYt.codes, DYt.scales);        // H32, blocks along T
  mx_quantize_cols(x, T, in, 1, MX_SCALE_UP, Xt.codes, Xt.scales);
  mx_quantize_cols(dy, T, out, 1, MX_SCALE_UP, DYt2.codes, DYt2.scales);
  mx_quantize_cols(x, T, in, 1, MX_SCALE_UP, Xt2.codes, Xt2.scales);
  Operand *all[8] = {&X, &Wq, &Wt, &DY, &DYt, &Xt, &DYt2, &Xt2};
  for (int i = 0; i < 8; i++) operand_finish(all[i]);
  run_use("fprop Y=X.W^T", &X, &Wq, 1, 0.0f, rng);
  run_use("fprop Y=X.W^T", &X, &Wq, 0, 0.0f, rng);
  run_use("fprop Y=R+X.W^T", &X, &Wq, 0, 1.0f, rng);  // the o / down projection with the residual R
  run_use("dgrad dX=dY.W", &DY, &Wt, 1, 0.0f, rng);
  run_use("dgrad dX=dY.W", &DY, &Wt, 0, 0.0f, rng);
  run_use("dgrad dX+=dY.W", &DY, &Wt, 0, 1.0f, rng);  // dx_accumulate: q, k, v share dx
  run_use("wgrad dW+=dY^T.X", &DYt, &Xt, 1, 1.0f, rng);
  run_use("wgrad dW=dY^T.X", &DYt, &Xt, 1, 0.0f, rng);
  run_use("wgrad dW+=dY^T.X 2D dY", &DYt2, &Xt, 1, 1.0f, rng);
  run_use("wgrad dW+=dY^T.X 2D X", &DYt, &Xt2, 1, 1.0f, rng);
  for (int i = 0; i < 8; i++) operand_free(all[i]);
  free(x), free(w), free(dy);
}

// The dequantizers, bit for bit against host conversions, including special scales: E8M0 0 (2^-127),
// 254 (2^127: large codes overflow to Inf in BF16, as in fp32), 0xFF (NaN block).
static int same_bf16(__nv_bfloat16 a, float want) {
  __nv_bfloat16 w = __float2bfloat16(want);
  uint16_t ua, uw;
  memcpy(&ua, &a, 2);
  memcpy(&uw, &w, 2);
  if (isnan(want)) return (ua & 0x7fff) > 0x7f80;
  return ua == uw;
}

static void test_dequant(Rng *rng) {
  TEST_SECTION("dequantizers (bit-exact)");
  const int rows = 130, K = 256;
  size_t n = (size_t)rows * K;
  uint8_t *codes = (uint8_t *)xmalloc(n / 2), *e8 = (uint8_t *)xmalloc(n / 32);
  for (size_t i = 0; i < n / 2; i++) codes[i] = (uint8_t)(rng_u64(rng) & 0xff);
  for (size_t i = 0; i < n / 32; i++) e8[i] = (uint8_t)(100 + rng_u64(rng) % 50);
  e8[0] = 0, e8[1] = 254, e8[2] = 0xFF, e8[3] = 1;
  uint8_t *d_codes = (uint8_t *)upload(codes, n / 2), *d_e8 = (uint8_t *)upload(e8, n / 32);
  __nv_bfloat16 *d_out, *h = (__nv_bfloat16 *)xmalloc(n * 2);
  CUDA_CHECK(cudaMalloc(&d_out, n * 2));
  fp4_dequant_mx_bf16(d_codes, d_e8, rows, K, d_out);
  sync_stream();
  CUDA_CHECK(cudaMemcpy(h, d_out, n * 2, cudaMemcpyDeviceToHost));
  long bad = 0;
  for (int r = 0; r < rows; r++)
    for (int k = 0; k < K; k++) {
      uint8_t b = codes[((size_t)r * K + k) / 2], c = (k & 1) ? b >> 4 : b & 15;
      if (!same_bf16(h[(size_t)r * K + k], mx_decode(c, e8[(size_t)r * (K / 32) + k / 32], MX_SCALE_DOWN))) bad++;
    }
  CHECK(bad == 0, "fp4_dequant_mx_bf16: %ld of %zu values differ from mx_decode", bad, n);

  // FP8: random non-NaN E4M3 bytes with power-of-two scales in both layouts (2^-60..2^60).
  uint8_t *q = (uint8_t *)xmalloc(n);
  for (size_t i = 0; i < n; i++) {
    q[i] = (uint8_t)(rng_u64(rng) & 0xff);
    if ((q[i] & 0x7f) == 0x7f) q[i] = 0x7e;
  }
  uint8_t *d_q = (uint8_t *)upload(q, n);
  for (int blk = 0; blk < 2; blk++) {
    size_t ns = blk ? mx_blk128_scale_count(rows, K) : mx_vec128_scale_count(rows, K);
    float *s = (float *)xmalloc(ns * 4);
    for (size_t i = 0; i < ns; i++) s[i] = fp4_exp2i((int)(rng_u64(rng) % 121) - 60);
    float *d_s = (float *)upload(s, ns * 4);
    fp4_dequant_fp8_bf16(d_q, d_s, blk, rows, K, d_out);
    sync_stream();
    CUDA_CHECK(cudaMemcpy(h, d_out, n * 2, cudaMemcpyDeviceToHost));
    bad = 0;
    int l4 = mx_blk128_l4(K);
    for (int r = 0; r < rows; r++)
      for (int k = 0; k < K; k++) {
        float sc = blk ? s[(size_t)(r / 128) * l4 + k / 128] : s[(size_t)(k / 128) * rows + r];
        float want = e4m3_decode(q[(size_t)r * K + k]) * sc;
        if (!same_bf16(h[(size_t)r * K + k], want) || __bfloat162float(__float2bfloat16(want)) != want) bad++;
      }
    CHECK(bad == 0, "fp4_dequant_fp8_bf16 (%s): %ld of %zu values differ from e4m3 * scale or are inexact",
          blk ? "BLK128x128" : "VEC128", bad, n);
    CUDA_CHECK(cudaFree(d_s));
    free(s);
  }
  CUDA_FREE_ALL(d_q, d_out, d_codes, d_e8);
  free(q), free(h), free(codes), free(e8);
}

// The native path's scale preparation (runs on any GPU): the swizzled layout is a permutation of the
// padded grid; E8M0 -> UE4M3 re-basing against the operand max; E4M3 bytes copied.
static uint8_t ue4m3_pow2(int d) {  // independent of e2m1.h: the E4M3 byte of 2^d
  if (d >= -6 && d <= 8) return (uint8_t)((d + 7) << 3);
  if (d >= -9 && d <= -7) return (uint8_t)(1u << (d + 9));
  return 0;
}

static void test_swizzle(Rng *rng) {
  TEST_SECTION("native FP4 scale preparation (swizzle, E8M0 -> UE4M3)");
  const int rows = 200, cols = 22;  // 16-blocks: K = 352; 2 row tiles, 6 column tiles (padded)
  size_t bytes = fp4_swizzled_scale_bytes(rows, cols);
  CHECK(bytes == (size_t)256 * 24, "swizzled bytes %zu, want %d", bytes, 256 * 24);
  char *hit = (char *)xcalloc(bytes, 1);
  long dup = 0;
  for (int r = 0; r < 256; r++)
    for (int c = 0; c < 24; c++) {
      size_t o = fp4_swizzled_offset(r, c, cols);
      if (o >= bytes || hit[o]++) dup++;
    }
  CHECK(dup == 0, "fp4_swizzled_offset is not a permutation of the padded grid (%ld collisions)", dup);
  CHECK(fp4_swizzled_offset(1, 0, cols) == 16 && fp4_swizzled_offset(32, 0, cols) == 4 &&
            fp4_swizzled_offset(0, 4, cols) == 512 && fp4_swizzled_offset(128, 0, cols) == 6 * 512,
        "swizzle offsets: row 1 -> %zu (16), row 32 -> %zu (4), col 4 -> %zu (512), row 128 -> %zu (3072)",
        fp4_swizzled_offset(1, 0, cols), fp4_swizzled_offset(32, 0, cols), fp4_swizzled_offset(0, 4, cols),
        fp4_swizzled_offset(128, 0, cols));

  size_t ne = (size_t)rows * cols / 2;
  uint8_t *e8 = (uint8_t *)xmalloc(ne), *e4 = (uint8_t *)xmalloc((size_t)rows * cols);
  for (size_t i = 0; i < ne; i++) e8[i] = (uint8_t)(110 + rng_u64(rng) % 30);
  e8[7] = 0xFF;       // NaN block: ignored by the max, NaN out
  e8[8] = 150;        // the max
  e8[9] = 150 - 17;   // 2^-9: the smallest kept
  e8[10] = 150 - 18;  // 2^-10: flushed to 0
  for (size_t i = 0; i < (size_t)rows * cols; i++) e4[i] = (uint8_t)(rng_u64(rng) % 0x7f);
  uint8_t *d_e8 = (uint8_t *)upload(e8, ne), *d_e4 = (uint8_t *)upload(e4, (size_t)rows * cols), *d_out;
  int *d_max;
  CUDA_CHECK(cudaMalloc(&d_out, bytes));
  CUDA_CHECK(cudaMalloc(&d_max, sizeof(int)));
  uint8_t *h = (uint8_t *)xmalloc(bytes);
  fp4_scale_max_e8m0(d_e8, ne, d_max);
  fp4_swizzle_scales(d_e8, rows, cols, 1, d_max, d_out);
  sync_stream();
  int max_b = 0;
  CUDA_CHECK(cudaMemcpy(&max_b, d_max, sizeof max_b, cudaMemcpyDeviceToHost));
  CHECK(max_b == 150, "fp4_scale_max_e8m0 = %d, want 150 (0xFF ignored)", max_b);
  CUDA_CHECK(cudaMemcpy(h, d_out, bytes, cudaMemcpyDeviceToHost));
  long bad = 0;
  for (int r = 0; r < 256; r++)
    for (int c = 0; c < 24; c++) {
      uint8_t want = 0;
      if (r < rows && c < cols) {
        uint8_t b = e8[(size_t)r * (cols / 2) + c / 2];
        want = b == 0xFF ? 0x7F : ue4m3_pow2((int)b - 150 + 8);
      }
      if (h[fp4_swizzled_offset(r, c, cols)] != want) bad++;
    }
  CHECK(bad == 0, "E8M0 swizzle: %ld of %zu bytes wrong", bad, bytes);
  uint8_t at14 = h[fp4_swizzled_offset(0, 14, cols)], at16 = h[fp4_swizzled_offset(0, 16, cols)],
          at18 = h[fp4_swizzled_offset(0, 18, cols)], at20 = h[fp4_swizzled_offset(0, 20, cols)];
  CHECK(at14 == 0x7F && at16 == 0x78 && at18 == 0x01 && at20 == 0x00,
        "NaN -> 0x%02x (0x7F), max 2^8 -> 0x%02x (0x78), 2^-9 -> 0x%02x (0x01), 2^-10 -> 0x%02x (0x00)", at14, at16,
        at18, at20);
  fp4_swizzle_scales(d_e4, rows, cols, 0, NULL, d_out);
  sync_stream();
  CUDA_CHECK(cudaMemcpy(h, d_out, bytes, cudaMemcpyDeviceToHost));
  bad = 0;
  for (int r = 0; r < 256; r++)
    for (int c = 0; c < 24; c++)
      if (h[fp4_swizzled_offset(r, c, cols)] != (r < rows && c < cols ? e4[(size_t)r * cols + c] : 0)) bad++;
  CHECK(bad == 0, "E4M3 swizzle: %ld of %zu bytes wrong", bad, bytes);
  CUDA_FREE_ALL(d_e8, d_e4, d_out, d_max);
  free(hit), free(e8), free(e4), free(h);
}

// NVFP4 through the reference path: unscaled q * e4m3(bs) operands, the tensor scales in alpha.
static void test_nvfp4_reference(Rng *rng) {
  TEST_SECTION("NVFP4 reference path");
  const int M = 96, N = 160, K = 256;
  float *a = (float *)xmalloc((size_t)M * K * 4), *b = (float *)xmalloc((size_t)N * K * 4);
  for (size_t i = 0; i < (size_t)M * K; i++) a[i] = rng_normal(rng) * (i % 301 == 0 ? 40.0f : 1.0f);
  for (size_t i = 0; i < (size_t)N * K; i++) b[i] = 0.02f * rng_normal(rng);
  float amax_a = nvfp4_amax(a, (size_t)M * K), amax_b = nvfp4_amax(b, (size_t)N * K);
  uint8_t *ca = (uint8_t *)xmalloc((size_t)M * K / 2), *sa = (uint8_t *)xmalloc((size_t)M * K / 16);
  uint8_t *cb = (uint8_t *)xmalloc((size_t)N * K / 2), *sb = (uint8_t *)xmalloc((size_t)N * K / 16);
  nvfp4_quantize_rows(a, M, K, amax_a, NV_RNE, philox_stream(1, 0, 0, 0, 0), ca, sa);
  nvfp4_quantize_weight(b, N, K, amax_b, cb, sb, NULL, NULL);
  float *da = (float *)xmalloc((size_t)M * K * 4), *db = (float *)xmalloc((size_t)N * K * 4);
  nvfp4_dequantize(ca, sa, M, K, amax_a, da);
  nvfp4_dequantize(cb, sb, N, K, amax_b, db);
  double *ref = (double *)xmalloc((size_t)M * N * 8);
  for (int m = 0; m < M; m++)
    for (int j = 0; j < N; j++) {
      double acc = 0;
      for (int k = 0; k < K; k++) acc += (double)da[(size_t)m * K + k] * db[(size_t)j * K + k];
      ref[(size_t)m * N + j] = acc;
    }
  uint8_t *d_ca = (uint8_t *)upload(ca, (size_t)M * K / 2), *d_sa = (uint8_t *)upload(sa, (size_t)M * K / 16);
  uint8_t *d_cb = (uint8_t *)upload(cb, (size_t)N * K / 2), *d_sb = (uint8_t *)upload(sb, (size_t)N * K / 16);
  float *d_out, *got = (float *)xmalloc((size_t)M * N * 4);
  CUDA_CHECK(cudaMalloc(&d_out, (size_t)M * N * 4));
  Fp4Operand A = {d_ca, d_sa}, B = {d_cb, d_sb};
  fp4_gemm_reference_packed(d_out, 1, FMT_NVFP4, A, B, M, N, K, nv_gemm_alpha(amax_a, amax_b), 0.0f, NULL);
  download_floats(got, d_out, (size_t)M * N, 1);
  // Each dequantized element carries one fp32 rounding (the / s_enc) and alpha three: ~2e-7 on top
  // of the fp32 accumulation; 1e-6 still fails on any wrong scale or layout.
  double e = rel_err_d(got, ref, (size_t)M * N);
  printf("  NVFP4 reference M=%d N=%d K=%d: rel L2 %.2e\n", M, N, K, e);
  CHECK(e < TOL_REF, "NVFP4 reference vs fp64: rel L2 %.3e >= %.1e", e, TOL_REF);
  // The tensor scales on the device (as the engine keeps them): device-pointer-mode GEMM, no sync.
  float h_alpha = nv_gemm_alpha(amax_a, amax_b), *d_alpha = (float *)upload(&h_alpha, 4);
  fp4_gemm_reference_packed(d_out, 1, FMT_NVFP4, A, B, M, N, K, 1.0f, 0.0f, d_alpha);
  download_floats(got, d_out, (size_t)M * N, 1);
  e = rel_err_d(got, ref, (size_t)M * N);
  printf("  NVFP4 reference, alpha on the device: rel L2 %.2e\n", e);
  CHECK(e < TOL_REF, "NVFP4 reference (device alpha) vs fp64: rel L2 %.3e >= %.1e", e, TOL_REF);
  if (fp4_gemm_native_available()) {
    fp4_gemm_native(d_out, 1, FMT_NVFP4, A, B, M, N, K, 1.0f, 0.0f, d_alpha);
    download_floats(got, d_out, (size_t)M * N, 1);
    double en = rel_err_d(got, ref, (size_t)M * N);
    printf("  NVFP4 native: rel L2 %.2e\n", en);
    CHECK(en < TOL_FP8, "NVFP4 native vs fp64: rel L2 %.3e >= %.1e", en, TOL_FP8);
  }
  CUDA_FREE_ALL(d_alpha, d_ca, d_sa, d_cb, d_sb, d_out);
  free(a), free(b), free(ca), free(sa), free(cb), free(sb), free(da), free(db), free(ref), free(got);
}

// TFLOP/s of the FP8 path vs gemm_bf16's ceiling at T = 8192 (docs/formats.md §3 expects ~1.6-1.8x).
static void bench(void) {
  TEST_SECTION("FP8-embedded MXFP4 GEMM vs BF16, T = 8192 (TFLOP/s, best of the heuristic's top candidates)");
  const int T = 8192;
  struct {
    const char *name;
    int out, in;
  } sh[] = {{"q/o", 4096, 4096}, {"kv", 1024, 4096}, {"gate/up", 14336, 4096}, {"down", 4096, 14336}};
  printf("  %-8s %-6s %6s %6s %6s | %8s %8s %6s\n", "shape", "use", "M", "N", "K", "fp8", "bf16", "ratio");
  for (int s = 0; s < 4; s++) {
    int out = sh[s].out, in = sh[s].in;
    // use: (M, N, K, B blk), bf16 twin (out_fp32, a_t, b_t)
    struct {
      const char *use;
      int M, N, K, blk, f32, at, bt;
    } u[3] = {{"fprop", T, out, in, 1, 0, 0, 1}, {"dgrad", T, in, out, 1, 0, 0, 1}, {"wgrad", out, in, T, 0, 1, 1, 0}};
    for (int i = 0; i < 3; i++) {
      double f = fp4_gemm_fp8_tflops(u[i].M, u[i].N, u[i].K, 0, u[i].blk, u[i].f32);
      double b = gemm_ceiling_tflops(u[i].f32, u[i].at, u[i].bt, u[i].M, u[i].N, u[i].K);
      printf("  %-8s %-6s %6d %6d %6d | %8.0f %8.0f %5.2fx\n", sh[s].name, u[i].use, u[i].M, u[i].N, u[i].K, f, b,
             f / b);
      CHECK(f > 0 && b > 0, "%s %s: rates %.1f / %.1f", sh[s].name, u[i].use, f, b);
    }
    // Wgrad with one operand in 128x128 tiles (fp8_embed.h: exact while a tile's 32-blocks stay within
    // 14 binades): X^T as cuBLASLt's A (BLK x VEC, the probe's pair) or dY^T as its B.
    for (int which = 0; which < 2; which++) {
      int ab = which, bb = !which;
      if (!fp4_gemm_fp8_supported(1, ab, bb, out, in, T)) {
        printf("  %-8s %-6s %6d %6d %6d | %8s  (no cuBLASLt algorithm for a 2D %s)\n", sh[s].name, "wgrad", out, in, T,
               "-", ab ? "A" : "B");
        continue;
      }
      double f = fp4_gemm_fp8_tflops(out, in, T, ab, bb, 1);
      printf("  %-8s %-6s %6d %6d %6d | %8.0f  (2D %s: %s tiles)\n", sh[s].name, "wgrad", out, in, T, f, ab ? "A" : "B",
             ab ? "dY^T" : "X^T");
      CHECK(f > 0, "%s wgrad 2D %s: rate %.1f", sh[s].name, ab ? "A" : "B", f);
    }
  }
}

// The GPU's clocks settle under a GEMM load before a rate is taken (the first shape of a table
// measured ~20% slow otherwise): ~0.3 s of cuBLASLt's 8B q fprop.
static void warm_clocks(void) {
  const Fp8Operand A = fp4_bench_operand(8192, 4096, 0, 5), B = fp4_bench_operand(4096, 4096, 1, 6);
  void *o;
  CUDA_CHECK(cudaMalloc(&o, (size_t)8192 * 4096 * 2));
  for (int i = 0; i < 2000; i++) fp4_gemm_fp8(o, 0, A, B, 8192, 4096, 4096, 1.0f, 0.0f);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaFree(o));
  fp4_bench_operand_free(A), fp4_bench_operand_free(B);
}

// One of the 21 training GEMMs of a block at T = 8192 tokens (below): its linear, its use, its shape
// and scale modes, and the seeds of its benchmark operands.
typedef struct {
  const char *name, *use;
  int M, N, K, ablk, bblk, f32, seed_a, seed_b;
} BlockGemm;

static int block_gemms(int dim, int kv, int ffn, BlockGemm *g) {
  const int T = 8192;
  struct {
    const char *name;
    int out, in;
  } sh[] = {{"q", dim, dim},    {"k", kv, dim},   {"v", kv, dim},    {"o", dim, dim},
            {"gate", ffn, dim}, {"up", ffn, dim}, {"down", dim, ffn}};
  static const char *uses[3] = {"fprop", "dgrad", "wgrad"};
  int n = 0;
  for (int s = 0; s < 7; s++)
    for (int u = 0; u < 3; u++) {
      const int out = sh[s].out, in = sh[s].in;
      g[n++] = (BlockGemm){sh[s].name, uses[u], u == 2 ? out : T, u == 0 ? out : in, u == 0 ? in : u == 1 ? out : T,
                           u == 2,     u != 2,  u == 2,           11 + s * 3 + u,    101 + s * 3 + u};
    }
  return n;
}

// ms per call of call(): 3 calls to plan, tune and warm up, then the mean of 10 between two events.
template <typename F>
static double time_ms_events(cudaEvent_t e0, cudaEvent_t e1, F call) {
  for (int i = 0; i < 3; i++) call();
  const int reps = 10;
  CUDA_CHECK(cudaEventRecord(e0, cuda_stream()));
  for (int i = 0; i < reps; i++) call();
  CUDA_CHECK(cudaEventRecord(e1, cuda_stream()));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float t;
  CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
  return t / reps;
}

// The 21 training GEMMs of a block at T = 8192 tokens (fprop, dgrad, wgrad of q, k, v, o, gate, up,
// down) of the Llama-3 8B shapes (dim 4096, KV 1024, FFN 14336), in the engine's scale modes (B in
// 128x128 tiles for fprop and dgrad; dY^T, the A of the wgrad, in tiles as Recipe.wgrad_2d's default),
// on CUTLASS's kernel (fp4/gemm_cutlass.h), every configuration beside cuBLASLt's best block-scaled
// algorithm; the best configuration's result against cuBLASLt's bits. For the
// per-shape choice of issue 30: where CUTLASS measures faster, the tuner (fp4_gemm_fp8_on) takes it.
static void bench_cutlass(const char *model, int dim, int kv, int ffn) {
  char title[112];
  snprintf(title, sizeof title, "CUTLASS blockwise FP8 GEMM vs cuBLASLt block-scaled, %s block, T = 8192 (TFLOP/s)",
           model);
  TEST_SECTION(title);
  const int ncfg = fp4_gemm_cutlass_configs(0, NULL);
  BlockGemm gs[21];
  const int ngemm = block_gemms(dim, kv, ffn, gs);
  printf("  %-5s %-6s %6s %6s %6s | %8s", "shape", "use", "M", "N", "K", "cuBLASLt");
  for (int i = 0; i < ncfg; i++) printf(" %7d", i);
  printf(" | %6s %-14s | %s\n", "best", "(config)", "outputs differing from cuBLASLt");
  for (int i = 0; i < ncfg; i++) printf("  config %d: %s\n", i, fp4_gemm_cutlass_cfg_name(i));
  double sum_lt = 0, sum_cut = 0;  // time of the 21: cuBLASLt, CUTLASS's best configuration per shape
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  warm_clocks();
  for (int k = 0; k < ngemm; k++) {
    const BlockGemm &g = gs[k];
    const int M = g.M, N = g.N, K = g.K, f32 = g.f32;
    const Fp8Operand A = fp4_bench_operand(M, K, g.ablk, g.seed_a), B = fp4_bench_operand(N, K, g.bblk, g.seed_b);
    void *o1, *o2;
    const size_t on = (size_t)M * N * (f32 ? 4 : 2), n = (size_t)M * N;
    CUDA_CHECK(cudaMalloc(&o1, on));
    CUDA_CHECK(cudaMalloc(&o2, on));
    const float alpha = 1.0f / 4096.0f, beta = 0.0f;  // the wgrad form without accumulation: comparable bytes
    double ms[17];
    for (int w = 0; w <= ncfg && w < 17; w++)  // cuBLASLt, then every configuration
      ms[w] = time_ms_events(e0, e1, [&] {
        if (w == 0) fp4_gemm_fp8(o1, f32, A, B, M, N, K, alpha, beta);
        else fp4_gemm_cutlass_cfg(o2, NULL, f32, A, B, M, N, K, alpha, beta, w - 1);
      });
    int best = 1;
    for (int w = 2; w <= ncfg && w < 17; w++) best = ms[w] < ms[best] ? w : best;
    fp4_gemm_cutlass_cfg(o2, NULL, f32, A, B, M, N, K, alpha, beta, best - 1);  // its result, to compare
    float *g1 = (float *)xmalloc(n * 4), *g2 = (float *)xmalloc(n * 4);
    download_floats(g1, o1, n, f32);
    download_floats(g2, o2, n, f32);
    const BitDiff d = bit_diff(g2, g1, n);
    const double fl = 2.0 * M * N * K;
    sum_lt += ms[0], sum_cut += ms[best];
    printf("  %-5s %-6s %6d %6d %6d | %8.0f", g.name, g.use, M, N, K, fl / ms[0] / 1e9);
    for (int w = 1; w <= ncfg && w < 17; w++) printf(" %7.0f", fl / ms[w] / 1e9);
    printf(" | %5.2fx %-14s | %.1e (max rel %.1e)\n", ms[0] / ms[best], fp4_gemm_cutlass_cfg_name(best - 1), d.frac,
           d.max_rel);
    CHECK(d.frac == 0, "%s %s: CUTLASS %s differs from cuBLASLt's bits in %.3e of the outputs (max rel %.3e)", g.name,
          g.use, fp4_gemm_cutlass_cfg_name(best - 1), d.frac, d.max_rel);
    free(g1), free(g2);
    CUDA_FREE_ALL(o1, o2);
    fp4_bench_operand_free(A), fp4_bench_operand_free(B);
  }
  printf("  the 21 GEMMs: cuBLASLt %.3f ms, CUTLASS (best configuration per shape) %.3f ms (%.2fx)\n", sum_lt, sum_cut,
         sum_lt / sum_cut);
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
}

int main(int argc, char **argv) {
  int dev;
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  printf("device %s (cc %d.%d); native FP4 path %s; CUTLASS GEMM %s\n", prop.name, prop.major, prop.minor,
         fp4_gemm_native_available() ? "available: tested below" : "unavailable here (needs cc 10.0): not tested",
         fp4_gemm_cutlass_available() ? "available: tested below"
                                      : "unavailable (needs cc 9.0 and a build with CUTLASS): not tested");
  Rng rng;
  rng_seed(&rng, 2024);
  test_dequant(&rng);
  test_swizzle(&rng);
  test_layer(128, 128, 128, 0, &rng);
  test_layer(256, 384, 512, 1, &rng);
  test_layer(96, 160, 256, 1, &rng);  // K = 160 (Fprop) and K = 96 (Wgrad): partial 128-groups
  // every K partial (Fprop 1056, Dgrad 352, Wgrad 224): cuBLASLt refuses them all; CUTLASS against fp64
  test_layer(224, 1056, 352, 0, &rng);
  test_nvfp4_reference(&rng);
  if (!(argc > 1 && strcmp(argv[1], "--no-bench") == 0)) {
    bench();
    if (fp4_gemm_cutlass_available()) bench_cutlass("Llama-3 8B", 4096, 1024, 14336);
  }
  fp4_gemm_shutdown();
  TEST_END();
}
