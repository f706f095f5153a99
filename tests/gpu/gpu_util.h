// tests/gpu/gpu_util.h: host-side helpers shared by the GPU tests: relative errors and reading device
// buffers back. (tests/gpu/gpu_ops_util.h adds those that go through the CUDA backend's Ops table.)
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"
#include "common/cuda_common.h"

static inline float bf16r(float x) { return __bfloat162float(__float2bfloat16(x)); }

// The input kinds both FP4 producer tests start from (each adds its own after IN_SHARED_KINDS), for
// value i (normal draw v) of block blk in a rows x K matrix: heavy rows among tiny blocks, zero
// blocks and scattered zeros, constant blocks across 9 binades (alternating signs). Other kinds: v.
enum { IN_NORMAL, IN_OUTLIERS, IN_ZEROS, IN_CONST, IN_SHARED_KINDS };
static inline float shared_input(int kind, float v, size_t i, size_t blk, int K, Rng *r) {
  if (kind == IN_OUTLIERS) return v * ((i / K) % 17 == 0 ? 40.0f : (blk % 7 == 0 ? 1e-3f : 1.0f));
  if (kind == IN_ZEROS) return blk % 3 == 0 ? 0.0f : v * (rng_uniform(r) < 0.5f ? 0.0f : 1.0f);
  if (kind == IN_CONST) return ldexpf(1.0f + (blk % 5) / 4.0f, (int)(blk % 9) - 4) * ((blk & 1) ? -1.0f : 1.0f);
  return v;
}

// ||got - ref|| / ||ref|| (||got - ref|| when ref is all zeros); NaN, so every check fails, when got
// holds a NaN.
static double rel_err_d(const float *got, const double *ref, size_t n) {
  double e = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - ref[i];
    e += d * d, r += ref[i] * ref[i];
  }
  return sqrt(e / (r > 0 ? r : 1));
}

static double rel_err(const float *got, const float *ref, size_t n) {
  double e = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - ref[i];
    e += d * d, r += (double)ref[i] * ref[i];
  }
  return sqrt(e / (r > 0 ? r : 1));
}

// n values of a device buffer (fp32, or BF16) as host floats, once cuda_stream()'s work is done.
static void download_floats(float *h, const void *d, size_t n, int fp32) {
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  if (fp32) {
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return;
  }
  __nv_bfloat16 *t = (__nv_bfloat16 *)xmalloc(n * sizeof(__nv_bfloat16));
  CUDA_CHECK(cudaMemcpy(t, d, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) h[i] = __bfloat162float(t[i]);
  free(t);
}

// A device buffer of `bytes` (at least 16), every byte `fill` (0-255; -1: left as cudaMalloc leaves it).
static void *dev_alloc(size_t bytes, int fill) {
  void *p;
  CUDA_CHECK(cudaMalloc(&p, bytes > 16 ? bytes : 16));
  if (fill >= 0) CUDA_CHECK(cudaMemset(p, fill, bytes > 16 ? bytes : 16));
  return p;
}

// n bytes of a and b equal, each a device (a_dev, b_dev: 1) or host buffer, once cuda_stream()'s work is
// done; when what is given, a mismatch prints how many bytes differ and the first (with its row and column
// when row_len > 0).
static int same_bytes_at(const char *what, const void *a, int a_dev, const void *b, int b_dev, size_t n, int row_len) {
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  uint8_t *ha = (uint8_t *)xmalloc(n ? n : 1), *hb = (uint8_t *)xmalloc(n ? n : 1);
  CUDA_CHECK(cudaMemcpy(ha, a, n, a_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost));
  CUDA_CHECK(cudaMemcpy(hb, b, n, b_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (ha[i] != hb[i]) first = bad++ ? first : i;
  if (bad && what && row_len > 0)
    printf("  %s: %zu of %zu bytes differ; first at byte %zu (row %zu, col %zu): %02x, expected %02x\n", what, bad, n,
           first, first / row_len, first % row_len, ha[first], hb[first]);
  else if (bad && what)
    printf("  %s: %zu of %zu bytes differ; first at byte %zu: %02x, expected %02x\n", what, bad, n, first, ha[first],
           hb[first]);
  free(ha), free(hb);
  return bad == 0;
}

// The copy rate of this GPU in GB/s (cuda_copy_tbps, measured at the first call): the producers' ceiling
// in the bandwidth tables. Dies when it cannot be measured, so no table shows a made-up percentage.
static double copy_gbs_here(void) {
  static double gbs = 0;
  if (gbs == 0) {
    gbs = cuda_copy_tbps() * 1e3;
    if (gbs <= 0) die("copy_gbs_here: no device memory to measure the copy rate");
    printf("copy rate measured here: %.0f GB/s (read + write, 256 MiB device-to-device)\n", gbs);
  }
  return gbs;
}

// Median of 15 timed runs (after 3 warm-up runs) of fn(arg) on cuda_stream(), in milliseconds: the
// producer benchmarks' timer.
static double time_median_ms(void (*fn)(void *), void *arg) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++) fn(arg);
  float ms[15];
  for (int i = 0; i < 15; i++) {
    CUDA_CHECK(cudaEventRecord(a, cuda_stream()));
    fn(arg);
    CUDA_CHECK(cudaEventRecord(b, cuda_stream()));
    CUDA_CHECK(cudaEventSynchronize(b));
    CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
  }
  for (int i = 0; i < 15; i++)
    for (int j = i + 1; j < 15; j++)
      if (ms[j] < ms[i]) {
        float t = ms[i];
        ms[i] = ms[j], ms[j] = t;
      }
  cudaEventDestroy(a), cudaEventDestroy(b);
  return ms[7];
}
