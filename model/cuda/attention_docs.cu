// model/cuda/attention_docs.cu: the ragged offsets and lengths cuDNN's THD attention reads, from the
// document boundaries of a micro-batch (attention_cudnn.h; model/ops.h's DocMask). Twin of
// doc_mask_ragged (model/doc_mask.c), held to it byte for byte by tests/gpu/gpu_test_attention.cu.
#include "common/common.h"
#include "common/cuda_common.h"
#include "model/cuda/attention_cudnn.h"

__global__ void docs_ragged_kernel(const int *cu, int n_docs, int nb, int64_t q_row, int64_t kv_row, int64_t lse_row,
                                   int64_t *off_q, int64_t *off_kv, int64_t *off_lse, int32_t *len) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= nb; i += gridDim.x * blockDim.x) {
    const int64_t first = cu[i < n_docs ? i : n_docs];  // padding entries: empty, at the end
    off_q[i] = first * q_row;
    off_kv[i] = first * kv_row;
    off_lse[i] = first * lse_row;
    if (i < nb) len[i] = i < n_docs ? cu[i + 1] - cu[i] : 0;
  }
}

void attention_docs_ragged_cuda(const int *cu, int n_docs, int nb, int64_t q_row, int64_t kv_row, int64_t lse_row,
                                int64_t *off_q, int64_t *off_kv, int64_t *off_lse, int32_t *len) {
  if (n_docs < 1 || nb < n_docs) die("attention (documents): %d documents for a graph batch of %d", n_docs, nb);
  const int threads = 256, grid = cuda_grid((size_t)nb + 1, threads);
  docs_ragged_kernel<<<grid, threads, 0, cuda_stream()>>>(cu, n_docs, nb, q_row, kv_row, lse_row, off_q, off_kv,
                                                          off_lse, len);
  CUDA_CHECK_LAUNCH();
}
