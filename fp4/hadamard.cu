// fp4/hadamard.cu: the fixed-sign H16/H32 on device fp32 matrices, in place (see hadamard.h). The fused
// FP4 producers call fp4_h32 in registers instead; this standalone form serves tests and any caller
// that wants the rotated values themselves. One thread per n-block; for blocks down columns,
// consecutive threads take consecutive columns, so every strided access is coalesced across the warp.
#include "common/common.h"
#include "fp4/hadamard.h"
#include "common/cuda_common.h"

template <int n>
__global__ void hadamard_kernel(float *x, int rows, int cols, int down_columns) {
  size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t nblocks = (size_t)rows * cols / n;
  if (t >= nblocks) return;
  size_t base, stride;
  if (down_columns) {  // t -> (row block, column)
    base = (t / cols) * n * cols + t % cols;
    stride = cols;
  } else {
    base = t * n;
    stride = 1;
  }
  float v[n];
#pragma unroll
  for (int i = 0; i < n; i++) v[i] = x[base + i * stride];
  if (n == 32) fp4_h32(v);
  else fp4_h16(v);
#pragma unroll
  for (int i = 0; i < n; i++) x[base + i * stride] = v[i];
}

void fp4_hadamard_cuda(float *x, int rows, int cols, int n, int down_columns) {
  if (n != 16 && n != 32) die("fp4_hadamard_cuda: block size n = %d must be 16 or 32", n);
  int along = down_columns ? rows : cols;
  if (rows <= 0 || cols <= 0 || along % n)
    die("fp4_hadamard_cuda: rows = %d, cols = %d: the transformed dimension must be a multiple of %d", rows, cols, n);
  size_t nblocks = (size_t)rows * cols / n;
  unsigned grid = (unsigned)((nblocks + 255) / 256);
  if (n == 32) hadamard_kernel<32><<<grid, 256, 0, cuda_stream()>>>(x, rows, cols, down_columns);
  else hadamard_kernel<16><<<grid, 256, 0, cuda_stream()>>>(x, rows, cols, down_columns);
  CUDA_CHECK_LAUNCH();
}
