// model/cuda/swiglu.cu: the SwiGLU gate silu(gate) * up on the GPU, elementwise in fp32 (twin of
// swiglu.c). See ops_cuda.h. Vectors of 8 BF16 (16-byte accesses) when every pointer allows,
// then the n % 8 tail (or everything, for misaligned pointers) one element at a time.
#include "common/common.h"
#include "model/cuda/ops_cuda.h"

template <int VEC>
__device__ __forceinline__ void swiglu_fwd_at(bf16 *out, const bf16 *gate, const bf16 *up, size_t i) {
  float g[VEC], u[VEC];
  load_vec<VEC>(g, gate + i);
  load_vec<VEC>(u, up + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) g[k] = swiglu_value(g[k], u[k]);
  store_vec<VEC>(out + i, g);
}

template <int VEC>
__device__ __forceinline__ void swiglu_bwd_at(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                                              const bf16 *up, size_t i) {
  float d[VEC], g[VEC], u[VEC], dg[VEC], du[VEC];
  load_vec<VEC>(d, dout + i);
  load_vec<VEC>(g, gate + i);
  load_vec<VEC>(u, up + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) {
    float sig = 1.0f / (1.0f + expf(-g[k]));
    dg[k] = d[k] * u[k] * sig * (1.0f + g[k] * (1.0f - sig));  // d silu/dg = sig + g sig (1 - sig)
    du[k] = d[k] * (g[k] * sig);
  }
  store_vec<VEC>(dgate + i, dg);
  store_vec<VEC>(dup + i, du);
}

// Elements [0, 8 * nvec) as vectors, then [8 * nvec, n) one by one; grid-stride loops.
__global__ void swiglu_forward_kernel(bf16 *out, const bf16 *gate, const bf16 *up, size_t nvec, size_t n) {
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t v = tid; v < nvec; v += stride) swiglu_fwd_at<8>(out, gate, up, 8 * v);
  for (size_t i = 8 * nvec + tid; i < n; i += stride) swiglu_fwd_at<1>(out, gate, up, i);
}

__global__ void swiglu_backward_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up,
                                       size_t nvec, size_t n) {
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t v = tid; v < nvec; v += stride) swiglu_bwd_at<8>(dgate, dup, dout, gate, up, 8 * v);
  for (size_t i = 8 * nvec + tid; i < n; i += stride) swiglu_bwd_at<1>(dgate, dup, dout, gate, up, i);
}

void swiglu_forward_cuda(bf16 *out, const bf16 *gate, const bf16 *up, size_t n) {
  if (!n) return;
  size_t nvec = aligned16(out) && aligned16(gate) && aligned16(up) ? n / 8 : 0;
  const int threads = 256;
  swiglu_forward_kernel<<<cuda_grid(nvec ? nvec : n, threads), threads, 0, cuda_stream()>>>(out, gate, up, nvec, n);
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward_cuda(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up, size_t n) {
  if (!n) return;
  size_t nvec = aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) && aligned16(up) ? n / 8 : 0;
  const int threads = 256;
  swiglu_backward_kernel<<<cuda_grid(nvec ? nvec : n, threads), threads, 0, cuda_stream()>>>(dgate, dup, dout, gate,
                                                                                            up, nvec, n);
  CUDA_CHECK_LAUNCH();
}
