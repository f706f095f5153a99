// model/cuda/cuda_common.h: error-checking macros and the one stream every kernel and library call uses.
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(call)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "CUDA error (%s:%d): %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

// After a kernel launch: catches bad launch configurations at once (cheap, no sync).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                       \
  do {                                                                                           \
    int s_ = (int)(call);                                                                        \
    if (s_ != 0) {                                                                               \
      fprintf(stderr, "cuBLAS error (%s:%d): %s: status %d\n", __FILE__, __LINE__, #call, s_);   \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

#define CUDNN_CHECK(call)                                                                        \
  do {                                                                                           \
    int s_ = (int)(call);                                                                        \
    if (s_ != 0) {                                                                               \
      fprintf(stderr, "cuDNN error (%s:%d): %s: status %d\n", __FILE__, __LINE__, #call, s_);    \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

#ifdef __cplusplus
extern "C" {
#endif
// The stream of the CUDA backend (created by cuda_backend_init; the legacy default stream before).
cudaStream_t cuda_stream(void);
void cuda_set_stream(cudaStream_t s);
#ifdef __cplusplus
}
#endif
