// model/cpu/adamw.c: see adamw.h.
#include "model/adamw.h"

#include <math.h>
#include <stdlib.h>

#include "common/common.h"

// The norm's chunk size is fixed (not derived from the thread count) so that the partial sums, and
// the order they are added in, are the same however many threads run: bit-identical norms.
#define NORM_CHUNK ((size_t)1 << 16)

double grad_sumsq(const float *g, size_t n) {
  size_t nchunks = (n + NORM_CHUNK - 1) / NORM_CHUNK;
  if (nchunks == 0) return 0.0;
  double *partial = xmalloc(nchunks * sizeof(double));
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (size_t c = 0; c < nchunks; c++) {
    size_t lo = c * NORM_CHUNK, hi = lo + NORM_CHUNK < n ? lo + NORM_CHUNK : n;
    double s = 0.0;
    for (size_t i = lo; i < hi; i++) s += (double)g[i] * g[i];
    partial[c] = s;
  }
  double total = 0.0;
  for (size_t c = 0; c < nchunks; c++) total += partial[c];
  free(partial);
  return total;
}

float grad_global_norm(const float *g, size_t n) { return (float)sqrt(grad_sumsq(g, n)); }

float clip_scale(float norm, float clip) {
  if (clip <= 0.0f || norm <= clip) return 1.0f;
  return clip / (norm + 1e-6f);
}

void adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float grad_scale, int64_t t) {
  if (t < 1) die("adamw_update: step t must start at 1, got %lld", (long long)t);
  // The scalars are formed the way torch.optim.AdamW forms them: bias corrections in double
  // (Python floats), then step_size = lr / bc1 and denom = sqrt(v) / sqrt(bc2) + eps.
  double bc1 = 1.0 - pow((double)beta1, (double)t), bc2 = 1.0 - pow((double)beta2, (double)t);
  float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  float decay = 1.0f - lr * weight_decay;
  float one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2;
  // Elementwise with a static schedule: each element's arithmetic is independent of the threads.
#pragma omp parallel for schedule(static) if (n > 32768)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * grad_scale;
    float mi = m[i] + one_minus_b1 * (gi - m[i]);  // torch's lerp_(g, 1 - beta1)
    float vi = beta2 * v[i] + one_minus_b2 * gi * gi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}
