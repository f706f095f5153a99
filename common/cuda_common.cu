// common/cuda_common.cu: the stream and the launch-size helper of common/cuda_common.h.
#include "common/cuda_common.h"

#include <cuda_bf16.h>

static cudaStream_t g_stream;  // 0, the legacy default stream, until cuda_set_stream
static int g_sms;              // multiprocessors of the device, read at the first cuda_grid

cudaStream_t cuda_stream(void) { return g_stream; }
void cuda_set_stream(cudaStream_t s) { g_stream = s; }

int cuda_sm_count(void) {
  if (!g_sms) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
  }
  return g_sms;
}

int cuda_device_cc(void) {
  int dev, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

int cuda_grid(size_t work, int threads) {
  size_t blocks = (work + threads - 1) / threads, full = (size_t)cuda_sm_count() * (2048 / threads);
  if (blocks > full) blocks = full;
  return blocks < 1 ? 1 : (int)blocks;
}

double cuda_copy_tbps(void) {
  const size_t bytes = (size_t)256 << 20;
  void *a = NULL, *b = NULL;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaFree(a);
    return 0;
  }
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  CUDA_CHECK(cudaMemsetAsync(a, 0, bytes, cuda_stream()));
  CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));  // warm-up
  float ms[9];
  for (int i = 0; i < 9; i++) {
    CUDA_CHECK(cudaEventRecord(e0, cuda_stream()));
    CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
    CUDA_CHECK(cudaEventRecord(e1, cuda_stream()));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
      const float t = ms[j];
      ms[j] = ms[j - 1], ms[j - 1] = t;
    }
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  CUDA_FREE_ALL(a, b);
  return ms[4] > 0 ? 2.0 * bytes / (ms[4] * 1e-3) / 1e12 : 0;
}

static __global__ void fill_uniform_bf16_kernel(__nv_bfloat16 *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = __float2bfloat16((float)cuda_hash24(i, seed) * (2.0f / 16777216.0f) - 1.0f);
}

void cuda_fill_uniform_bf16(void *p, size_t n, uint32_t seed) {
  fill_uniform_bf16_kernel<<<1024, 256, 0, cuda_stream()>>>((__nv_bfloat16 *)p, n, seed);
  CUDA_CHECK_LAUNCH();
}
