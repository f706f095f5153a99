// model/cpu/embedding.c: token embedding lookup (CPU reference). See ops.h.
#include "common/common.h"
#include "model/ops.h"

#include <string.h>

void embedding_forward(float *out, const int *tokens, const float *table, int N, int D, int V) {
  for (int n = 0; n < N; n++)  // validate first, so a bad id dies naming where it is
    if (tokens[n] < 0 || tokens[n] >= V)
      die("embedding: token id %d at position %d is outside [0, %d)", tokens[n], n, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) memcpy(out + (size_t)n * D, table + (size_t)tokens[n] * D, (size_t)D * sizeof(float));
}

void embedding_backward(float *dtable, const float *dout, const int *tokens, int N, int D) {
  // A token may repeat, so rows of dtable are not owned by one token: split the columns between
  // threads instead (blocks of 64), and add the tokens in order.
  enum { COLS = 64 };
#pragma omp parallel for schedule(static)
  for (int d0 = 0; d0 < D; d0 += COLS) {
    int nc = D - d0 < COLS ? D - d0 : COLS;
    for (int n = 0; n < N; n++) {
      float *dst = dtable + (size_t)tokens[n] * D + d0;
      const float *src = dout + (size_t)n * D + d0;
      for (int i = 0; i < nc; i++) dst[i] += src[i];
    }
  }
}
