// model/cuda/embedding.cu: token embedding lookup on the GPU (twin of embedding.c). See ops_cuda.h.
//
// Both directions read the N token ids back to the host (N <= a few 10^4 ints, one sync): the
// forward to die with the offending position on a bad id, as the CPU does; the backward to group
// the positions by token. The backward gives each distinct token one CTA that adds that token's
// rows to its table row in position order: no atomics, so the sums are deterministic (and equal
// to the CPU's, which adds in the same order).
#include <stdlib.h>

#include "common/common.h"
#include "model/cuda/ops_cuda.h"

// Host staging in the backend (CudaBackend.embed), grow-only.
static int *host_ints(CudaBackend *b, size_t n) {
  if (n > b->embed.host_cap) {
    free(b->embed.host);
    b->embed.host = (int *)xmalloc(n * sizeof(int));
    b->embed.host_cap = n;
  }
  return b->embed.host;
}

// out[n, :] = bf16(table[tokens[n], :]); one thread per VEC columns of one row. T: float, or bf16
// for the parameters' BF16 shadow (whose values are already bf16(table)).
template <int VEC, typename T>
__global__ void embedding_forward_kernel(bf16 *out, const int *tokens, const T *table, int N, int D) {
  const int per_row = D / VEC;
  const size_t items = (size_t)N * per_row;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < items; i += (size_t)gridDim.x * blockDim.x) {
    size_t n = i / per_row;
    int c = (int)(i - n * per_row) * VEC;
    float f[VEC];
    load_vec<VEC>(f, table + (size_t)tokens[n] * D + c);
    store_vec<VEC>(out + n * D + c, f);
  }
}

template <typename T>
static void embedding_forward_any(CudaBackend *b, bf16 *out, const int *tokens, const T *table, int N, int D, int V) {
  if (N <= 0 || D <= 0) die("embedding (cuda): N=%d, D=%d must be positive", N, D);
  int *tok = host_ints(b, N);
  cuda_download(b, tok, tokens, (size_t)N * sizeof(int));
  for (int n = 0; n < N; n++)
    if (tok[n] < 0 || tok[n] >= V) die("embedding: token id %d at position %d is outside [0, %d)", tok[n], n, V);
  const int threads = 256;
  if (D % 8 == 0 && aligned16(out) && aligned16(table)) {
    embedding_forward_kernel<8, T>
        <<<cuda_grid((size_t)N * D / 8, threads), threads, 0, cuda_stream()>>>(out, tokens, table, N, D);
  } else {
    embedding_forward_kernel<1, T>
        <<<cuda_grid((size_t)N * D, threads), threads, 0, cuda_stream()>>>(out, tokens, table, N, D);
  }
  CUDA_CHECK_LAUNCH();
}

void embedding_forward_cuda(CudaBackend *b, bf16 *out, const int *tokens, const float *table, int N, int D, int V) {
  embedding_forward_any(b, out, tokens, table, N, D, V);
}

void embedding_forward_bf16_cuda(CudaBackend *b, bf16 *out, const int *tokens, const bf16 *table, int N, int D, int V) {
  embedding_forward_any(b, out, tokens, table, N, D, V);
}

// CTA (b, y) owns table row token[b], columns [c, c + VEC) per thread: dtable[token[b], c..] +=
// dout[pos, c..] for the positions pos[start[b] .. start[b+1]) in increasing order. A frequent
// token makes a long chain of adds, so rows are loaded U at a time (independent loads in flight)
// and then added in order.
template <int VEC>
__global__ void embedding_backward_kernel(float *dtable, const bf16 *dout, const int *token, const int *start,
                                          const int *pos, int D) {
  enum { U = 8 };
  const int b = blockIdx.x, p0 = start[b], p1 = start[b + 1];
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
  if (c >= D) return;
  float *row = dtable + (size_t)token[b] * D + c;
  float acc[VEC];
  load_vec<VEC>(acc, row);
  for (int p = p0; p < p1; p += U) {
    float f[U][VEC];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (p + u < p1) load_vec<VEC>(f[u], dout + (size_t)pos[p + u] * D + c);
#pragma unroll
    for (int u = 0; u < U; u++)
      if (p + u < p1) {
#pragma unroll
        for (int k = 0; k < VEC; k++) acc[k] += f[u][k];
      }
  }
  store_vec<VEC>(row, acc);
}

int embedding_backward_cuda(CudaBackend *b, float *dtable, const bf16 *dout, const int *tokens, int N, int D) {
  if (N <= 0 || D <= 0) die("embedding backward (cuda): N=%d, D=%d must be positive", N, D);
  // The grouping, built on the host by a counting sort on the token id (stable, so each token's
  // positions stay increasing). Uploaded as one int array: pos[N], start[nb + 1], token[nb], with
  // bucket b holding pos[start[b] .. start[b+1]), all of token[b].
  int *tok = host_ints(b, 4 * (size_t)N + 1), *up = tok + N;
  cuda_download(b, tok, tokens, (size_t)N * sizeof(int));
  int vmax = 0;
  for (int n = 0; n < N; n++) {
    if (tok[n] < 0) die("embedding backward: token id %d at position %d is negative", tok[n], n);
    vmax = tok[n] > vmax ? tok[n] : vmax;
  }
  int *end = (int *)xcalloc((size_t)vmax + 1, sizeof(int));  // per token: count, then its slots' end
  for (int n = 0; n < N; n++) end[tok[n]]++;
  for (int t = 1; t <= vmax; t++) end[t] += end[t - 1];
  int *pos = up, *start = up + N, *token = tok + 0;         // token[] reuses tok[] once it is consumed
  for (int n = N - 1; n >= 0; n--) pos[--end[tok[n]]] = n;  // backwards, so end[t] ends at t's start
  int nb = 0;
  for (int t = 0; t <= vmax; t++) {
    int s = end[t], e = t < vmax ? end[t + 1] : N;
    if (e > s) start[nb] = s, token[nb++] = t;
  }
  start[nb] = N;
  for (int k = 0; k < nb; k++) start[nb + 1 + k] = token[k];
  free(end);
  size_t count = (size_t)N + 2 * (size_t)nb + 1;
  int *dev = (int *)cuda_scratch(b, &b->embed.buckets, (3 * (size_t)N + 1) * sizeof(int), "embedding backward buckets");
  cuda_upload(b, dev, up, count * sizeof(int));
  const int *d_pos = dev, *d_start = dev + N, *d_token = dev + N + nb + 1;

  // 64 threads of one column vector each per CTA; grid.y covers the row's columns.
  const int vec = D % 8 == 0 && aligned16(dtable) && aligned16(dout) ? 8 : 1, cols = D / vec;
  const int threads = cols < 64 ? (cols + 31) / 32 * 32 : 64;
  dim3 grid(nb, (cols + threads - 1) / threads);
  if (vec == 8)
    embedding_backward_kernel<8><<<grid, threads, 0, cuda_stream()>>>(dtable, dout, d_token, d_start, d_pos, D);
  else embedding_backward_kernel<1><<<grid, threads, 0, cuda_stream()>>>(dtable, dout, d_token, d_start, d_pos, D);
  CUDA_CHECK_LAUNCH();
  return nb;
}
