// tests/gpu/gpu_ops_util.h: host-side helpers of the GPU tests that drive the CUDA backend through its
// Ops table (gpu_test_ops, gpu_test_fp4_linear). Device buffers go through the table, so its
// allocator is exercised too. The including file calls open_backend() before using them.
#pragma once
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/cuda/linear_fp4.h"
#include "model/cuda/ops_cuda.h"
#include "model/ops.h"
#include "tests/gpu/gpu_util.h"

static const Ops *G;     // the CUDA table under test
static CudaBackend *CB;  // its instance
static LinearFp4 *LF;    // the instance's FP4 linear layers
static Rng rng;

// A new CUDA backend instance on device 0 into G, CB and LF; 0 (with the reason printed) when there is
// no usable GPU.
static int open_backend(void) {
  char err[256];
  G = cuda_backend_init(0, err, sizeof err);
  if (!G) {
    printf("cuda_backend_init: %s\n", err);
    return 0;
  }
  CB = cuda_backend_of(G), LF = cuda_linear_fp4(CB);
  return 1;
}

// The start of main(): a backend instance (the test fails and ends without one), the rng seeded.
#define GPU_OPS_TEST_BEGIN(seed)                                  \
  do {                                                            \
    CHECK(open_backend(), "a CUDA backend instance on device 0"); \
    if (!G) TEST_END();                                           \
    rng_seed(&rng, seed);                                         \
  } while (0)

// n normal values of standard deviation `scale`, BF16-rounded when `round` (activations).
static float *randn(size_t n, float scale, int round) {
  float *x = (float *)xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = round ? bf16r(scale * rng_normal(&rng)) : scale * rng_normal(&rng);
  return x;
}

static void *dev_bf16(const float *h, size_t n) {
  __nv_bfloat16 *tmp = (__nv_bfloat16 *)xmalloc(n * sizeof(__nv_bfloat16));
  for (size_t i = 0; i < n; i++) tmp[i] = __float2bfloat16(h[i]);
  void *d = G->alloc(G->ctx, n * sizeof(__nv_bfloat16));
  G->upload(G->ctx, d, tmp, n * sizeof(__nv_bfloat16));
  free(tmp);
  return d;
}

static float *dev_f32(const float *h, size_t n) {
  float *d = (float *)G->alloc(G->ctx, n * sizeof(float));
  G->upload(G->ctx, d, h, n * sizeof(float));
  return d;
}

static int *dev_int(const int *h, size_t n) {
  int *d = (int *)G->alloc(G->ctx, n * sizeof(int));
  G->upload(G->ctx, d, h, n * sizeof(int));
  return d;
}

static float *host_bf16(const void *d, size_t n) {
  float *h = (float *)xmalloc(n * sizeof(float));
  G->acts_to_f32(G->ctx, h, d, n);
  return h;
}

static float *host_f32(const float *d, size_t n) {
  float *h = (float *)xmalloc(n * sizeof(float));
  G->download(G->ctx, h, d, n * sizeof(float));
  return h;
}
