// model/cuda/residual.cu: the residual add on the GPU, out = a + b in fp32, rounded once (twin of
// residual.c). See ops_cuda.h. out may alias a: each element is read and written by one thread.
#include "common/common.h"
#include "model/cuda/ops_cuda.h"

template <int VEC>
__device__ __forceinline__ void residual_at(bf16 *out, const bf16 *a, const bf16 *b, size_t i) {
  float x[VEC], y[VEC];
  load_vec<VEC>(x, a + i);
  load_vec<VEC>(y, b + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) x[k] += y[k];
  store_vec<VEC>(out + i, x);
}

// Elements [0, 8 * nvec) as 16-byte vectors, then [8 * nvec, n) one by one; grid-stride loops.
__global__ void residual_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t nvec, size_t n) {
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t v = tid; v < nvec; v += stride) residual_at<8>(out, a, b, 8 * v);
  for (size_t i = 8 * nvec + tid; i < n; i += stride) residual_at<1>(out, a, b, i);
}

void residual_forward_cuda(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
  if (!n) return;
  size_t nvec = aligned16(out) && aligned16(a) && aligned16(b) ? n / 8 : 0;
  const int threads = 256;
  residual_kernel<<<cuda_grid(nvec ? nvec : n, threads), threads, 0, cuda_stream()>>>(out, a, b, nvec, n);
  CUDA_CHECK_LAUNCH();
}
