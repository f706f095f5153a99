// model/cpu/crossentropy.c: the output head fused with the cross-entropy loss (CPU reference). See ops.h.
// Tokens go through `chunk` rows at a time: logits of one chunk, their softmax, and (when asked)
// d(logits) -> dx and dW, before the next chunk reuses the same scratch.
#include "common/common.h"
#include "model/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// head_crossentropy, also writing each token's loss to nll when it is not NULL.
static float head_ce_rows(float *dx, float *dw, float *scratch, const float *x, const float *w, const int *targets,
                          int N, int D, int V, int chunk, int ignore_index, float dloss, float *nll) {
  if (chunk < 1) die("head_crossentropy: chunk must be >= 1, got %d", chunk);
  int count = 0;
  for (int n = 0; n < N; n++) {
    if (targets[n] == ignore_index) continue;
    if (targets[n] < 0 || targets[n] >= V)
      die("cross-entropy: target id %d at position %d is outside [0, %d) and is not ignore_index %d", targets[n], n, V,
          ignore_index);
    count++;
  }
  // The loss is a mean over counted targets, so each one's d(loss) is dloss / count.
  const float g = count ? dloss / count : 0.0f;
  double *row_loss = xmalloc((size_t)chunk * sizeof(double));
  float *wt = matmul_transpose_weight(w, D, V);  // once, not once per chunk
  double total = 0;
  for (int n0 = 0; n0 < N; n0 += chunk) {
    int nc = N - n0 < chunk ? N - n0 : chunk;
    const float *xc = x + (size_t)n0 * D;
    matmul_forward_wt(scratch, xc, wt, nc, D, V);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < nc; r++) {
      float *lg = scratch + (size_t)r * V;
      int tgt = targets[n0 + r];
      float mx = -INFINITY;
      for (int i = 0; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
      double sum = 0;
      for (int i = 0; i < V; i++) sum += expf(lg[i] - mx);
      float lse = mx + (float)log(sum);
      row_loss[r] = tgt == ignore_index ? 0.0 : (double)lse - lg[tgt];
      if (!dx) continue;
      // d(logits) = (softmax - onehot(target)) * g, written over the logits; 0 for ignored rows.
      float gr = tgt == ignore_index ? 0.0f : g;
      for (int i = 0; i < V; i++) lg[i] = expf(lg[i] - lse) * gr;
      if (tgt != ignore_index) lg[tgt] -= gr;
    }
    for (int r = 0; r < nc; r++) total += row_loss[r];  // in token order: same sum for any chunking
    if (nll)
      for (int r = 0; r < nc; r++) nll[n0 + r] = (float)row_loss[r];
    if (dx) matmul_backward(dx + (size_t)n0 * D, dw, scratch, xc, w, nc, D, V, 0);
  }
  free(row_loss);
  free(wt);
  return count ? (float)(total / count) : 0.0f;
}

float head_crossentropy(float *dx, float *dw, float *scratch, const float *x, const float *w, const int *targets, int N,
                        int D, int V, int chunk, int ignore_index, float dloss) {
  return head_ce_rows(dx, dw, scratch, x, w, targets, N, D, V, chunk, ignore_index, dloss, NULL);
}

// Only the asked rows go through the head, gathered (an evaluation asks for a few positions of each
// row). Each row's logits are computed on their own, in a fixed order, so gathering changes no bit.
void head_rows_nll(float *nll, float *scratch, const float *x, const float *w, const int *rows, const int *targets,
                   int n, int D, int V, int chunk) {
  if (n <= 0) return;
  float *xp = xmalloc((size_t)n * D * sizeof(float));
  for (int i = 0; i < n; i++) memcpy(xp + (size_t)i * D, x + (size_t)rows[i] * D, (size_t)D * sizeof(float));
  head_ce_rows(NULL, NULL, scratch, xp, w, targets, n, D, V, chunk, -1, 0.0f, nll);
  free(xp);
}
