// tests/gpu/gpu_test_gemm.cu: common/gemm.cu against CPU references at small odd shapes (every layout,
// both output types, accumulation, misaligned slices, plan reuse, determinism), then the TFLOP/s of
// the three linear-layer GEMMs at every Llama-3 8B shape (N = 8192 tokens) beside the ceiling.
//
// Tolerances are relative to the reference's norm:
// - BF16 out: the result is rounded once to BF16 (unit roundoff 2^-9 = 2e-3), so the relative
//   error norm is at most ~2e-3 whatever K; 1e-2 leaves a 5x margin and still fails on any wrong
//   layout, missing term or wrong scalar (those give errors of order 1e-1 to 1).
// - fp32 out: BF16 x BF16 products are exact in fp32, only the fp32 sums round, giving a relative
//   error of order sqrt(K) * 2^-24 (~2e-6 at K = 1032); tolerance 1e-5.
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "common/gemm.h"
#include "model/ops.h"
#include "tests/test.h"
#include "tests/gpu/gpu_util.h"

typedef __nv_bfloat16 bf16;

static const double TOL_BF16 = 1e-2, TOL_FP32 = 1e-5;

// n normal values of standard deviation `scale`, rounded to BF16: b holds the BF16 copy, f the
// same values as floats (the references' inputs).
static void random_bf16(float *f, bf16 *b, size_t n, Rng *r, float scale) {
  for (size_t i = 0; i < n; i++) {
    b[i] = __float2bfloat16(scale * rng_normal(r));
    f[i] = __bfloat162float(b[i]);
  }
}

// Device copy of a host buffer, placed `offset` bytes past a cudaMalloc'd (256-aligned) base so the
// tests can hand gemm_bf16 pointers that are only 16-byte aligned. *base gets what to cudaFree.
static void *to_device(const void *h, size_t bytes, size_t offset, void **base) {
  CUDA_CHECK(cudaMalloc(base, bytes + offset));
  char *d = (char *)*base + offset;
  CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());  // the copy is complete whatever stream cuda_stream() is
  return d;
}

// out[M,N] = alpha op(A) op(B) + beta c in double, with gemm.h's row-major layout conventions.
static void ref_gemm(double *out, const float *A, int a_t, const float *B, int b_t, int M, int N, int K, double alpha,
                     double beta, const float *c) {
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < K; k++) {
        double a = a_t ? A[(size_t)k * M + m] : A[(size_t)m * K + k];
        double b = b_t ? B[(size_t)n * K + k] : B[(size_t)k * N + n];
        s += a * b;
      }
      out[(size_t)m * N + n] = alpha * s + (beta != 0 ? beta * c[(size_t)m * N + n] : 0.0);
    }
}

// One gemm_bf16 call against the double reference from the same BF16 inputs and the same initial
// out (random and nonzero, of the product's size, so a dropped or spurious beta term shows).
// `offset` misaligns all three device pointers by that many bytes. Returns the relative error.
static double run_case(int out_fp32, int a_t, int b_t, int M, int N, int K, float alpha, float beta, size_t offset,
                       uint64_t seed) {
  Rng r;
  rng_seed(&r, seed);
  size_t na = (size_t)M * K, nb = (size_t)K * N, no = (size_t)M * N;
  float *A = (float *)xmalloc(na * 4), *B = (float *)xmalloc(nb * 4), *C = (float *)xmalloc(no * 4);
  float *got = (float *)xmalloc(no * 4);
  bf16 *Ab = (bf16 *)xmalloc(na * 2), *Bb = (bf16 *)xmalloc(nb * 2), *Cb = (bf16 *)xmalloc(no * 2);
  double *ref = (double *)xmalloc(no * sizeof(double));
  random_bf16(A, Ab, na, &r, 1.0f);
  random_bf16(B, Bb, nb, &r, 1.0f);
  random_bf16(C, Cb, no, &r, sqrtf((float)K));  // an fp32 out starts from these values too
  void *bA, *bB, *bO;
  void *dA = to_device(Ab, na * 2, offset, &bA), *dB = to_device(Bb, nb * 2, offset, &bB);
  void *dO = out_fp32 ? to_device(C, no * 4, offset, &bO) : to_device(Cb, no * 2, offset, &bO);
  gemm_bf16(dO, out_fp32, dA, a_t, dB, b_t, M, N, K, alpha, beta);
  download_floats(got, dO, no, out_fp32);
  ref_gemm(ref, A, a_t, B, b_t, M, N, K, alpha, beta, C);
  double err = rel_err_d(got, ref, no);
  CUDA_FREE_ALL(bA, bB, bO);
  free(A), free(B), free(C), free(got), free(Ab), free(Bb), free(Cb), free(ref);
  return err;
}

// CHECK that a relative error is within tol; the printf-style rest names the case.
#define CHECK_CASE(err, tol, ...)                                                             \
  do {                                                                                        \
    char what_[192];                                                                          \
    snprintf(what_, sizeof what_, __VA_ARGS__);                                               \
    double e_ = (err);                                                                        \
    CHECK(e_ <= (tol), "%s: relative error %.3g > tolerance %.0e", what_, e_, (double)(tol)); \
  } while (0)

typedef struct {
  int N, in, out;
} LinShape;

// The three uses, called exactly as the CUDA backend's linear layer will, against the double
// reference of the same math.
static void check_uses_double(LinShape s, uint64_t seed) {
  int N = s.N, in = s.in, out = s.out;
  double e;
  e = run_case(0, 0, 1, N, out, in, 1, 0, 0, seed);  // forward  Y = X W^T
  printf("  N=%d in=%d out=%d: fwd %.2e", N, in, out, e);
  CHECK_CASE(e, TOL_BF16, "forward N=%d in=%d out=%d", N, in, out);
  e = run_case(0, 0, 0, N, in, out, 1, 0, 0, seed + 1);  // dgrad    dX = dY W
  printf(", dgrad %.2e", e);
  CHECK_CASE(e, TOL_BF16, "dgrad N=%d in=%d out=%d", N, in, out);
  e = run_case(0, 0, 0, N, in, out, 1, 1, 0, seed + 2);  // dgrad    dX += dY W
  printf(", dgrad+= %.2e", e);
  CHECK_CASE(e, TOL_BF16, "dgrad accumulate N=%d in=%d out=%d", N, in, out);
  e = run_case(1, 1, 0, out, in, N, 1, 1, 0, seed + 3);  // wgrad    dW += dY^T X (fp32)
  printf(", wgrad+= %.2e", e);
  CHECK_CASE(e, TOL_FP32, "wgrad accumulate N=%d in=%d out=%d", N, in, out);
  e = run_case(1, 1, 0, out, in, N, 1, 0, 0, seed + 4);  // wgrad    dW = dY^T X (fp32)
  printf(", wgrad %.2e\n", e);
  CHECK_CASE(e, TOL_FP32, "wgrad overwrite N=%d in=%d out=%d", N, in, out);
}

// The same three uses against the engine's own CPU linear layer (model/cpu/matmul.c, fp32, on the
// same BF16-rounded values): checks that the argument mapping means what ops.h's matmul means.
static void check_uses_engine(LinShape s, uint64_t seed) {
  int N = s.N, in = s.in, out = s.out;
  Rng r;
  rng_seed(&r, seed);
  size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
  float *X = (float *)xmalloc(nx * 4), *W = (float *)xmalloc(nw * 4), *dY = (float *)xmalloc(ny * 4);
  float *dX0 = (float *)xmalloc(nx * 4), *dW0 = (float *)xmalloc(nw * 4);
  bf16 *Xb = (bf16 *)xmalloc(nx * 2), *Wb = (bf16 *)xmalloc(nw * 2), *dYb = (bf16 *)xmalloc(ny * 2);
  bf16 *dX0b = (bf16 *)xmalloc(nx * 2);
  random_bf16(X, Xb, nx, &r, 1.0f);
  random_bf16(W, Wb, nw, &r, 0.05f);
  random_bf16(dY, dYb, ny, &r, 1.0f);
  random_bf16(dX0, dX0b, nx, &r, 0.05f * sqrtf((float)out));
  for (size_t i = 0; i < nw; i++) dW0[i] = sqrtf((float)N) * rng_normal(&r);

  void *b[8];
  void *dXd = to_device(Xb, nx * 2, 0, &b[0]), *dWd = to_device(Wb, nw * 2, 0, &b[1]);
  void *dYd = to_device(dYb, ny * 2, 0, &b[2]), *dXa = to_device(dX0b, nx * 2, 0, &b[3]);
  void *dWg = to_device(dW0, nw * 4, 0, &b[4]);
  void *Yd, *dXo;
  CUDA_CHECK(cudaMalloc(&Yd, ny * 2));
  CUDA_CHECK(cudaMalloc(&dXo, nx * 2));
  gemm_bf16(Yd, 0, dXd, 0, dWd, 1, N, out, in, 1, 0);   // forward
  gemm_bf16(dXo, 0, dYd, 0, dWd, 0, N, in, out, 1, 0);  // dgrad, overwrite
  gemm_bf16(dXa, 0, dYd, 0, dWd, 0, N, in, out, 1, 1);  // dgrad, accumulate
  gemm_bf16(dWg, 1, dYd, 1, dXd, 0, out, in, N, 1, 1);  // wgrad, accumulate (fp32)

  float *got = (float *)xmalloc((nx > nw ? (nx > ny ? nx : ny) : (nw > ny ? nw : ny)) * 4);
  float *ref = (float *)xmalloc(ny * 4), *refx = (float *)xmalloc(nx * 4);
  matmul_forward(ref, X, W, N, in, out);
  download_floats(got, Yd, ny, 0);
  CHECK_CASE(rel_err(got, ref, ny), TOL_BF16, "engine forward N=%d in=%d out=%d", N, in, out);
  matmul_backward(refx, NULL, dY, X, W, N, in, out, 0);
  download_floats(got, dXo, nx, 0);
  CHECK_CASE(rel_err(got, refx, nx), TOL_BF16, "engine dgrad N=%d in=%d out=%d", N, in, out);
  memcpy(refx, dX0, nx * 4);
  matmul_backward(refx, NULL, dY, X, W, N, in, out, 1);
  download_floats(got, dXa, nx, 0);
  CHECK_CASE(rel_err(got, refx, nx), TOL_BF16, "engine dgrad accumulate N=%d in=%d out=%d", N, in, out);
  matmul_backward(NULL, dW0, dY, X, W, N, in, out, 0);  // dW0 += dY^T X
  download_floats(got, dWg, nw, 1);
  CHECK_CASE(rel_err(got, dW0, nw), TOL_FP32, "engine wgrad accumulate N=%d in=%d out=%d", N, in, out);

  for (int i = 0; i < 5; i++) CUDA_CHECK(cudaFree(b[i]));
  CUDA_CHECK(cudaFree(Yd));
  CUDA_CHECK(cudaFree(dXo));
  free(X), free(W), free(dY), free(dX0), free(dW0), free(Xb), free(Wb), free(dYb), free(dX0b);
  free(got), free(ref), free(refx);
}

// Two identical calls must give identical bits (cuBLASLt is deterministic for a fixed algorithm).
static void check_determinism(int out_fp32, int a_t, int b_t, int M, int N, int K) {
  size_t es = out_fp32 ? 4 : 2, na = (size_t)M * K, nb = (size_t)K * N, no = (size_t)M * N;
  Rng r;
  rng_seed(&r, 99);
  float *f = (float *)xmalloc((na > nb ? na : nb) * 4);
  bf16 *h = (bf16 *)xmalloc((na > nb ? na : nb) * 2);
  void *bA, *bB, *o1, *o2;
  random_bf16(f, h, na, &r, 1.0f);
  void *dA = to_device(h, na * 2, 0, &bA);
  random_bf16(f, h, nb, &r, 1.0f);
  void *dB = to_device(h, nb * 2, 0, &bB);
  CUDA_CHECK(cudaMalloc(&o1, no * es));
  CUDA_CHECK(cudaMalloc(&o2, no * es));
  gemm_bf16(o1, out_fp32, dA, a_t, dB, b_t, M, N, K, 1, 0);
  gemm_bf16(o2, out_fp32, dA, a_t, dB, b_t, M, N, K, 1, 0);
  char *h1 = (char *)xmalloc(no * es), *h2 = (char *)xmalloc(no * es);
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  CUDA_CHECK(cudaMemcpy(h1, o1, no * es, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(h2, o2, no * es, cudaMemcpyDeviceToHost));
  CHECK(memcmp(h1, h2, no * es) == 0, "two identical calls %s M=%d N=%d K=%d out_fp32=%d differ",
        a_t ? (b_t ? "A^T*B^T" : "A^T*B") : (b_t ? "A*B^T" : "A*B"), M, N, K, out_fp32);
  CUDA_FREE_ALL(bA, bB, o1, o2);
  free(f), free(h), free(h1), free(h2);
}

// ---- performance at the 8B shapes ----------------------------------------------------------------

static void *device_random(size_t n, uint32_t seed) {
  void *d;
  CUDA_CHECK(cudaMalloc(&d, n * 2));
  cuda_fill_uniform_bf16(d, n, seed);
  return d;
}

// Milliseconds per gemm_bf16 call in steady state: one call that plans and tunes the shape, then
// back-to-back calls (about 50 ms worth) as the training step issues them.
static double time_gemm(void *out, int out_fp32, const void *A, int a_t, const void *B, int b_t, int M, int N, int K,
                        float beta) {
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  float ms = 0;
  gemm_bf16(out, out_fp32, A, a_t, B, b_t, M, N, K, 1, beta);
  CUDA_CHECK(cudaEventRecord(e0, cuda_stream()));
  gemm_bf16(out, out_fp32, A, a_t, B, b_t, M, N, K, 1, beta);
  CUDA_CHECK(cudaEventRecord(e1, cuda_stream()));
  CUDA_CHECK(cudaEventSynchronize(e1));
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  int reps = (int)(50.0 / ms);
  reps = reps < 3 ? 3 : reps > 500 ? 500 : reps;
  CUDA_CHECK(cudaEventRecord(e0, cuda_stream()));
  for (int i = 0; i < reps; i++) gemm_bf16(out, out_fp32, A, a_t, B, b_t, M, N, K, 1, beta);
  CUDA_CHECK(cudaEventRecord(e1, cuda_stream()));
  CUDA_CHECK(cudaEventSynchronize(e1));
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return ms / reps;
}

static void bench_8b(void) {
  const int N = 8192;
  // The linear layers of Llama-3 8B: name, in, out, and how many of each one block holds (the head: none).
  struct {
    const char *name;
    int in, out, per_block;
  } lin[] = {{"q, o", 4096, 4096, 2},
             {"k, v", 4096, 1024, 2},
             {"gate, up", 4096, 14336, 2},
             {"down", 14336, 4096, 1},
             {"head", 4096, 128256, 0}};
  const int nlin = sizeof lin / sizeof lin[0];
  const size_t max_in = 14336, max_out = 128256, max_w = (size_t)128256 * 4096;
  void *X = device_random((size_t)N * max_in, 11), *W = device_random(max_w, 12);
  void *dY = device_random((size_t)N * max_out, 13);
  void *Y, *dX, *dW;
  CUDA_CHECK(cudaMalloc(&Y, (size_t)N * max_out * 2));
  CUDA_CHECK(cudaMalloc(&dX, (size_t)N * max_in * 2));
  CUDA_CHECK(cudaMalloc(&dW, max_w * 4));
  CUDA_CHECK(cudaMemsetAsync(dW, 0, max_w * 4, cuda_stream()));

  printf("  %-9s %-6s %6s %6s %6s %9s %9s %6s\n", "layer", "use", "M", "N", "K", "TFLOP/s", "ceiling", "ratio");
  double block_ms = 0, block_flop = 0, head_ms = 0, head_flop = 0;
  for (int l = 0; l < nlin; l++) {
    int in = lin[l].in, out = lin[l].out;
    double flop = 2.0 * N * in * out;
    for (int u = 0; u < 3; u++) {
      static const char *use_name[3] = {"fwd", "dgrad", "wgrad"};
      // Per use: out_fp32, a_t, b_t, M, N, K (gemm.h's table), A, B, out.
      int of = u == 2, at = u == 2, bt = u == 0;
      int M = u == 2 ? out : N, Nn = u == 0 ? out : in, K = u == 0 ? in : u == 1 ? out : N;
      const void *A = u == 2 ? dY : u == 1 ? dY : X;
      const void *B = u == 2 ? X : W;
      void *O = u == 0 ? Y : u == 1 ? dX : dW;
      float beta = u == 2 ? 1.0f : 0.0f;
      double ms = time_gemm(O, of, A, at, B, bt, M, Nn, K, beta);
      double rate = flop / (ms * 1e-3) / 1e12;
      double ceil_rate = gemm_ceiling_tflops(of, at, bt, M, Nn, K);
      printf("  %-9s %-6s %6d %6d %6d %9.1f %9.1f %5.0f%%\n", lin[l].name, use_name[u], M, Nn, K, rate, ceil_rate,
             100 * rate / ceil_rate);
      // docs/formats.md §3 measured 688-815 TFLOP/s at these shapes on this GPU: far less means a
      // non-tensor-core or badly tiled algorithm.
      CHECK(ceil_rate > 400, "%s %s: ceiling %.1f TFLOP/s is implausibly low", lin[l].name, use_name[u], ceil_rate);
      // The tuned algorithm, called as the model calls it, should be as fast as the best in isolation.
      CHECK(rate >= 0.85 * ceil_rate, "%s %s: %.1f TFLOP/s is below 85%% of the ceiling %.1f", lin[l].name, use_name[u],
            rate, ceil_rate);
      block_ms += lin[l].per_block * ms;
      block_flop += lin[l].per_block * flop;
      if (lin[l].per_block == 0) head_ms += ms, head_flop += flop;
    }
  }
  printf("  one block's 7 linear layers, fwd+dgrad+wgrad: %.2f ms, %.1f TFLOP/s\n", block_ms,
         block_flop / (block_ms * 1e-3) / 1e12);
  printf("  32 blocks + head per %d tokens: %.1f ms of GEMMs (%.1f TFLOP/s)\n", N, 32 * block_ms + head_ms,
         (32 * block_flop + head_flop) / ((32 * block_ms + head_ms) * 1e-3) / 1e12);
  CUDA_FREE_ALL(X, W, dY, Y, dX, dW);
}

int main(void) {
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);

  TEST_SECTION("the three linear-layer uses vs a double-precision reference");
  const LinShape shapes[] = {{96, 64, 40}, {8, 24, 16}, {200, 136, 56}, {264, 1032, 120}, {392, 328, 776}};
  for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) check_uses_double(shapes[i], 100 + 10 * i);

  TEST_SECTION("the three uses vs the engine's CPU linear layer (model/cpu/matmul.c)");
  check_uses_engine(shapes[0], 7);
  check_uses_engine(shapes[3], 8);

  TEST_SECTION("every layout and output type, alpha and beta, plan reuse");
  for (int c = 0; c < 8; c++) {
    int of = c >> 2, at = (c >> 1) & 1, bt = c & 1;
    double tol = of ? TOL_FP32 : TOL_BF16;
    double e1 = run_case(of, at, bt, 72, 48, 88, 0.5f, -1.25f, 0, 200 + c);
    double e2 = run_case(of, at, bt, 72, 48, 88, -2.0f, 0.0f, 0, 300 + c);
    double e3 = run_case(of, at, bt, 72, 48, 88, 3.0f, 0.0f, 0, 400 + c);  // the plan of e2, new alpha
    printf("  out_fp32=%d a_t=%d b_t=%d: %.2e %.2e %.2e\n", of, at, bt, e1, e2, e3);
    CHECK_CASE(e1, tol, "out_fp32=%d a_t=%d b_t=%d alpha 0.5 beta -1.25", of, at, bt);
    CHECK_CASE(e2, tol, "out_fp32=%d a_t=%d b_t=%d alpha -2 beta 0", of, at, bt);
    CHECK_CASE(e3, tol, "out_fp32=%d a_t=%d b_t=%d alpha 3 beta 0 (reused plan)", of, at, bt);
  }

  TEST_SECTION("pointers only 16-byte aligned (slices of larger buffers)");
  for (int u = 0; u < 3; u++) {
    double e = u == 0   ? run_case(0, 0, 1, 96, 40, 64, 1, 0, 16, 500)
               : u == 1 ? run_case(0, 0, 0, 96, 64, 40, 1, 1, 48, 501)
                        : run_case(1, 1, 0, 40, 64, 96, 1, 1, 16, 502);
    printf("  use %d, offset %d bytes: %.2e\n", u, u == 1 ? 48 : 16, e);
    CHECK_CASE(e, u == 2 ? TOL_FP32 : TOL_BF16, "misaligned use %d", u);
  }

  TEST_SECTION("determinism");
  check_determinism(0, 0, 1, 264, 120, 1032);
  check_determinism(1, 1, 0, 120, 1032, 264);

  TEST_SECTION("Llama-3 8B shapes, N = 8192 tokens (TFLOP/s = 2*M*N*K per call)");
  bench_8b();
  gemm_shape_report(stdout);
  gemm_shutdown();
  TEST_END();
}
