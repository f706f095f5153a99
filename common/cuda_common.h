// common/cuda_common.h: error-checking macros, the one stream every kernel and library call uses, and
// the launch size of grid-stride kernels.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>
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

#define CUBLAS_CHECK(call)                                                                     \
  do {                                                                                         \
    int s_ = (int)(call);                                                                      \
    if (s_ != 0) {                                                                             \
      fprintf(stderr, "cuBLAS error (%s:%d): %s: status %d\n", __FILE__, __LINE__, #call, s_); \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

#define CUDNN_CHECK(call)                                                                     \
  do {                                                                                        \
    int s_ = (int)(call);                                                                     \
    if (s_ != 0) {                                                                            \
      fprintf(stderr, "cuDNN error (%s:%d): %s: status %d\n", __FILE__, __LINE__, #call, s_); \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

#ifdef __cplusplus
extern "C" {
#endif
// The stream of the CUDA backend (created by cuda_backend_init; the legacy default stream before).
cudaStream_t cuda_stream(void);
void cuda_set_stream(cudaStream_t s);
// Blocks for a grid-stride kernel over `work` items with `threads` per block: enough for each item
// to get a thread, at most what fills the device (2048 threads per multiprocessor), at least 1.
int cuda_grid(size_t work, int threads);
#ifdef __cplusplus
}
#endif
