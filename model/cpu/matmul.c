// model/cpu/matmul.c: the linear layer y = x W^T and its gradients (CPU reference). See ops.h.
//
// All three products are written as "axpy" loops whose innermost index runs over contiguous
// memory of the output, so the compiler vectorizes them without reassociating any sum: every
// output element is a plain left-to-right fp32 sum over the contraction index, whatever the
// tiling, thread count or vector width. Tiles of TOK rows share each weight row loaded into L1.
#include "common/common.h"
#include "model/ops.h"

#include <stdlib.h>
#include <string.h>

enum {
  TOK = 4,   // token rows processed together (each weight element is reused TOK times)
  OBLK = 64  // output columns per accumulator block (TOK * OBLK floats stay in L1)
};

float *matmul_transpose_weight(const float *w, int in, int out_dim) {
  float *wt = xmalloc((size_t)in * out_dim * sizeof(float));
#pragma omp parallel for schedule(static)
  for (int i = 0; i < in; i++)
    for (int o = 0; o < out_dim; o++) wt[(size_t)i * out_dim + o] = w[(size_t)o * in + i];
  return wt;
}

// y[N, O] = x[N, I] W^T with W [O, I]. W is transposed once per call into wt [I, O] so the inner
// loop walks a contiguous row of wt (O*I extra floats, small next to the N*O*I multiply-adds).
void matmul_forward(float *out, const float *x, const float *w, int N, int in, int out_dim) {
  float *wt = matmul_transpose_weight(w, in, out_dim);
  matmul_forward_wt(out, x, wt, N, in, out_dim);
  free(wt);
}

void matmul_forward_wt(float *out, const float *x, const float *wt, int N, int in, int out_dim) {
  const int I = in, O = out_dim;
#pragma omp parallel for schedule(static)
  for (int n0 = 0; n0 < N; n0 += TOK) {
    // Rows past N repeat row n0; their results are computed and dropped, so the tail runs the
    // same code as full tiles.
    const float *xr[TOK];
    for (int t = 0; t < TOK; t++) xr[t] = x + (size_t)(n0 + t < N ? n0 + t : n0) * I;
    for (int o0 = 0; o0 < O; o0 += OBLK) {
      int no = O - o0 < OBLK ? O - o0 : OBLK;
      float acc[TOK][OBLK];
      memset(acc, 0, sizeof acc);
      for (int i = 0; i < I; i++) {
        const float *wr = wt + (size_t)i * O + o0;
        for (int t = 0; t < TOK; t++) {
          float xv = xr[t][i];
#pragma omp simd
          for (int o = 0; o < no; o++) acc[t][o] += xv * wr[o];
        }
      }
      for (int t = 0; t < TOK && n0 + t < N; t++)
        memcpy(out + (size_t)(n0 + t) * O + o0, acc[t], (size_t)no * sizeof(float));
    }
  }
}

void matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int in,
                     int out_dim, int dx_accumulate) {
  const int I = in, O = out_dim;
  if (dx) {
    // dx[n, :] (+)= sum_o dout[n, o] W[o, :], rows of dx owned by threads, o added in order.
#pragma omp parallel for schedule(static)
    for (int n0 = 0; n0 < N; n0 += TOK) {
      int nt = N - n0 < TOK ? N - n0 : TOK;
      if (!dx_accumulate) memset(dx + (size_t)n0 * I, 0, (size_t)nt * I * sizeof(float));
      for (int o = 0; o < O; o++) {
        const float *wr = w + (size_t)o * I;
        for (int t = 0; t < nt; t++) {
          float g = dout[(size_t)(n0 + t) * O + o];
          float *d = dx + (size_t)(n0 + t) * I;
#pragma omp simd
          for (int i = 0; i < I; i++) d[i] += g * wr[i];
        }
      }
    }
  }
  if (dw) {
    // dW[o, :] += sum_n dout[n, o] x[n, :], rows of dW owned by threads, tokens added in order
    // (so a chunked caller that adds chunk after chunk gets bit-identical results).
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < O; o0 += TOK) {
      int no = O - o0 < TOK ? O - o0 : TOK;
      for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * I;
        for (int t = 0; t < no; t++) {
          float g = dout[(size_t)n * O + o0 + t];
          float *d = dw + (size_t)(o0 + t) * I;
#pragma omp simd
          for (int i = 0; i < I; i++) d[i] += g * xr[i];
        }
      }
    }
  }
}
