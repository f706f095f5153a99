// common/cuda_common.h: error-checking macros, the one stream every kernel and library call uses, and
// the launch size of grid-stride kernels.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    if (e_ != cudaSuccess) {                                                                              \
      fprintf(stderr, "CUDA error (%s:%d): %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                                            \
    }                                                                                                     \
  } while (0)

// After a kernel launch: catches bad launch configurations at once (cheap, no sync).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// cudaFree of each pointer given, checked.
#define CUDA_FREE_ALL(...)                                                                       \
  do {                                                                                           \
    const void *p_[] = {__VA_ARGS__};                                                            \
    for (size_t i_ = 0; i_ < sizeof p_ / sizeof *p_; i_++) CUDA_CHECK(cudaFree((void *)p_[i_])); \
  } while (0)

// A library call returning a status where 0 is success (cuBLAS, cuDNN): dies naming the library,
// the call and the status.
#define LIB_STATUS_CHECK(lib, call)                                                             \
  do {                                                                                          \
    int s_ = (int)(call);                                                                       \
    if (s_ != 0) {                                                                              \
      fprintf(stderr, "%s error (%s:%d): %s: status %d\n", lib, __FILE__, __LINE__, #call, s_); \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)
#define CUBLAS_CHECK(call) LIB_STATUS_CHECK("cuBLAS", call)
#define CUDNN_CHECK(call) LIB_STATUS_CHECK("cuDNN", call)

#ifdef __cplusplus
extern "C" {
#endif
// The stream of the CUDA backend (created by cuda_backend_init; the legacy default stream before).
cudaStream_t cuda_stream(void);
void cuda_set_stream(cudaStream_t s);
// Blocks for a grid-stride kernel over `work` items with `threads` per block: enough for each item
// to get a thread, at most what fills the device (2048 threads per multiprocessor), at least 1.
int cuda_grid(size_t work, int threads);
// Multiprocessors of the current device (read once).
int cuda_sm_count(void);
// The current device's compute capability as major * 10 + minor, 0 without a usable device (the
// error is cleared): for kernels that run on one architecture only.
int cuda_device_cc(void);
// The device's copy rate in TB/s (bytes read + written per second): the median of 9 timed 256 MiB
// device-to-device copies on cuda_stream() after a warm-up (synchronizes; 0 when 512 MiB of scratch
// does not fit). The ceiling of memory-bound kernels, measured on the GPU at hand (4.28 on the H200).
double cuda_copy_tbps(void);
// n BF16 values uniform in [-1, 1) from cuda_hash24 (benchmark operands: tensor-core power, hence
// clocks, depends on the data), queued on cuda_stream().
void cuda_fill_uniform_bf16(void *p, size_t n, uint32_t seed);
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
// 24 well-mixed bits of (i, seed): the benchmark fills' hash (a multiply-xorshift finalizer).
__device__ __forceinline__ uint32_t cuda_hash24(size_t i, uint32_t seed) {
  uint32_t h = (uint32_t)i * 0x9e3779b9u ^ (uint32_t)(i >> 32) * 0x85ebca6bu ^ seed;
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h >> 8;
}
#endif
