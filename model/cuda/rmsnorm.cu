// model/cuda/rmsnorm.cu: RMSNorm on the GPU (twin of rmsnorm.c). See ops_cuda.h.
//
// Each thread owns up to MAXV vectors of 8 columns of a row, held in registers between the row's
// sum and its output, so x (and dout) are read from memory once. The forward runs one CTA per
// row. The backward runs one wave of CTAs (as many as fit on the GPU at once), each over a
// contiguous range of rows; its dw is a deterministic two-stage sum: each CTA writes its rows'
// partial sums to a scratch [parts, D], then one kernel adds the parts in a fixed order into dw.
// (The number of parts depends on the GPU model, so dw's rounding does too; on one machine it is
// bit-reproducible.)
#include "common/common.h"
#include "model/cuda/ops_cuda.h"

// Threads per CTA (a multiple of 32, at most 1024) and vectors per thread (1, 2 or 4) for a row
// of D = 8 * nv columns, aiming at `per_thread` vectors per thread.
static void row_shape(int D, int per_thread, const char *who, int *threads, int *maxv) {
  if (D <= 0 || D % 8) die("%s (cuda): D = %d must be a positive multiple of 8 (rows of 16-byte BF16 vectors)", who, D);
  int nv = D / 8, t = ((nv + per_thread - 1) / per_thread + 31) / 32 * 32;
  t = t > 1024 ? 1024 : t;
  int v = (nv + t - 1) / t;
  if (v > 4) die("%s (cuda): D = %d is too large (at most 32768)", who, D);
  *threads = t;
  *maxv = v <= 1 ? 1 : v <= 2 ? 2 : 4;
}

template <int MAXV>
__global__ void rmsnorm_forward_kernel(bf16 *out, float *rstd, const bf16 *x, const float *w, int D, float eps) {
  const int nv = D / 8;
  const size_t row = blockIdx.x;
  const bf16 *xr = x + row * D;
  float xv[MAXV][8];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    int v = threadIdx.x + k * blockDim.x;
    if (v < nv) {
      load_vec<8>(xv[k], xr + 8 * v);
#pragma unroll
      for (int j = 0; j < 8; j++) ss += xv[k][j] * xv[k][j];
    }
  }
  ss = block_sum(ss);
  const float r = 1.0f / sqrtf(ss / D + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  if (!out) return;  // rstd only (a fused producer makes the output)
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    int v = threadIdx.x + k * blockDim.x;
    if (v < nv) {
      float wv[8], o[8];
      load_vec<8>(wv, w + 8 * v);
#pragma unroll
      for (int j = 0; j < 8; j++) o[j] = rmsnorm_value(xv[k][j], r, wv[j]);
      store_vec<8>(out + row * D + 8 * v, o);
    }
  }
}

void rmsnorm_forward_cuda(bf16 *out, float *rstd, const bf16 *x, const float *w, int N, int D, float eps) {
  int threads, maxv;
  row_shape(D, 4, "rmsnorm", &threads, &maxv);
  if (N <= 0) die("rmsnorm (cuda): N = %d must be positive", N);
  if ((out && !aligned16(out)) || !aligned16(x) || !aligned16(w))
    die("rmsnorm (cuda): out %p, x %p, w %p must be 16-byte aligned", (void *)out, (const void *)x, (const void *)w);
  cudaStream_t s = cuda_stream();
  if (maxv == 1) rmsnorm_forward_kernel<1><<<N, threads, 0, s>>>(out, rstd, x, w, D, eps);
  else if (maxv == 2) rmsnorm_forward_kernel<2><<<N, threads, 0, s>>>(out, rstd, x, w, D, eps);
  else rmsnorm_forward_kernel<4><<<N, threads, 0, s>>>(out, rstd, x, w, D, eps);
  CUDA_CHECK_LAUNCH();
}

// With xhat = x r and g = dout * w: dx += r (g - xhat mean(g xhat)); partial[cta, :] = the CTA's
// sum over its rows [r0, r1) of dout * xhat.
template <int MAXV>
__global__ void rmsnorm_backward_kernel(bf16 *dx, float *partial, const bf16 *dout, const bf16 *x, const float *w,
                                        const float *rstd, int N, int D) {
  const int nv = D / 8;
  const int r0 = (int)((long long)blockIdx.x * N / gridDim.x), r1 = (int)((long long)(blockIdx.x + 1) * N / gridDim.x);
  float acc[MAXV][8];
#pragma unroll
  for (int k = 0; k < MAXV; k++)
#pragma unroll
    for (int j = 0; j < 8; j++) acc[k][j] = 0.0f;
  for (int row = r0; row < r1; row++) {
    const size_t off = (size_t)row * D;
    const float r = rstd[row];
    float xv[MAXV][8], gv[MAXV][8], d[MAXV][8];  // x * r, dout * w, and dx (loaded early: more bytes in flight)
    float dot = 0;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
      int v = threadIdx.x + k * blockDim.x;
      if (v < nv) {
        float dy[8], wv[8];
        load_vec<8>(xv[k], x + off + 8 * v);
        load_vec<8>(dy, dout + off + 8 * v);
        load_vec<8>(d[k], dx + off + 8 * v);
        load_vec<8>(wv, w + 8 * v);
#pragma unroll
        for (int j = 0; j < 8; j++) {
          xv[k][j] *= r;
          gv[k][j] = dy[j] * wv[j];
          dot += gv[k][j] * xv[k][j];
          acc[k][j] += dy[j] * xv[k][j];
        }
      }
    }
    const float m = block_sum(dot) / D;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
      int v = threadIdx.x + k * blockDim.x;
      if (v < nv) {
#pragma unroll
        for (int j = 0; j < 8; j++) d[k][j] += r * (gv[k][j] - xv[k][j] * m);
        store_vec<8>(dx + off + 8 * v, d[k]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    int v = threadIdx.x + k * blockDim.x;
    if (v < nv) store_vec<8>(partial + (size_t)blockIdx.x * D + 8 * v, acc[k]);
  }
}

// dw[c] (+)= sum over parts p, in a fixed order, of partial[p, c]. A 32 x 32 CTA per 32 columns:
// thread (x, y) sums parts y, y + 32, ... of column x, then row y = 0 adds the 32 sums in order.
__global__ void rmsnorm_dw_kernel(float *dw, const float *partial, int parts, int D, int overwrite) {
  __shared__ float sum[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0;
  if (c < D)
    for (int p = threadIdx.y; p < parts; p += 32) s += partial[(size_t)p * D + c];
  sum[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < D) {
    float t = 0;
    for (int y = 0; y < 32; y++) t += sum[y][threadIdx.x];
    dw[c] = overwrite ? t : dw[c] + t;
  }
}

// CTAs of the backward kernel that fit on the device at once (one wave), at most N.
template <int MAXV>
static int backward_parts(int threads, int N) {
  static int cached_threads = -1, cached;
  if (threads != cached_threads) {
    int per_sm;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rmsnorm_backward_kernel<MAXV>, threads, 0));
    cached_threads = threads, cached = cuda_sm_count() * (per_sm > 0 ? per_sm : 1);
  }
  return cached < N ? cached : N;
}

template <int MAXV>
static int backward_launch(CudaBackend *b, bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const float *w,
                           const float *rstd, int N, int D, int threads, int overwrite) {
  const int parts = backward_parts<MAXV>(threads, N);
  float *partial =
      (float *)cuda_scratch(b, &b->rms_partial, (size_t)parts * D * sizeof(float), "rmsnorm backward partial sums");
  cudaStream_t s = cuda_stream();
  rmsnorm_backward_kernel<MAXV><<<parts, threads, 0, s>>>(dx, partial, dout, x, w, rstd, N, D);
  CUDA_CHECK_LAUNCH();
  rmsnorm_dw_kernel<<<(D + 31) / 32, dim3(32, 32), 0, s>>>(dw, partial, parts, D, overwrite);
  CUDA_CHECK_LAUNCH();
  return parts;
}

int rmsnorm_backward_cuda(CudaBackend *b, bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const float *w,
                          const float *rstd, int N, int D, int dw_overwrite) {
  int threads, maxv;
  row_shape(D, 2, "rmsnorm backward", &threads, &maxv);
  if (N <= 0) die("rmsnorm backward (cuda): N = %d must be positive", N);
  if (!aligned16(dx) || !aligned16(dout) || !aligned16(x) || !aligned16(w))
    die("rmsnorm backward (cuda): dx %p, dout %p, x %p, w %p must be 16-byte aligned", (void *)dx, (const void *)dout,
        (const void *)x, (const void *)w);
  if (maxv == 1) return backward_launch<1>(b, dx, dw, dout, x, w, rstd, N, D, threads, dw_overwrite);
  if (maxv == 2) return backward_launch<2>(b, dx, dw, dout, x, w, rstd, N, D, threads, dw_overwrite);
  return backward_launch<4>(b, dx, dw, dout, x, w, rstd, N, D, threads, dw_overwrite);
}
