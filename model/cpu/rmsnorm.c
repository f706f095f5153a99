// model/cpu/rmsnorm.c: RMSNorm, y = x * rsqrt(mean(x^2) + eps) * w (CPU reference). See ops.h.
#include "model/ops.h"

#include <math.h>

void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int D, float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float *xr = x + (size_t)n * D;
    float *o = out + (size_t)n * D;
    double ss = 0;  // the mean of squares in double: cheap, and keeps D = 4096 rows accurate
    for (int i = 0; i < D; i++) ss += (double)xr[i] * xr[i];
    float r = (float)(1.0 / sqrt(ss / D + eps));
    rstd[n] = r;
    for (int i = 0; i < D; i++) o[i] = w[i] * (xr[i] * r);  // HF's order: weight * (x * rstd)
  }
}

void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int N,
                      int D) {
  // With xhat = x r and g = dout * w: dx = r (g - xhat mean(g xhat)).
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float *xr = x + (size_t)n * D, *dy = dout + (size_t)n * D;
    float r = rstd[n];
    double dot = 0;
    for (int i = 0; i < D; i++) dot += (double)(dy[i] * w[i]) * (xr[i] * r);
    float m = (float)(dot / D);
    float *d = dx + (size_t)n * D;
    for (int i = 0; i < D; i++) d[i] += r * (dy[i] * w[i] - xr[i] * r * m);
  }
  // dw sums over tokens: each thread owns blocks of columns and adds the tokens in order.
  enum { COLS = 64 };
#pragma omp parallel for schedule(static)
  for (int i0 = 0; i0 < D; i0 += COLS) {
    int nc = D - i0 < COLS ? D - i0 : COLS;
    double acc[COLS] = {0};
    for (int n = 0; n < N; n++) {
      const float *dy = dout + (size_t)n * D + i0, *xr = x + (size_t)n * D + i0;
      for (int i = 0; i < nc; i++) acc[i] += dy[i] * (xr[i] * rstd[n]);
    }
    for (int i = 0; i < nc; i++) dw[i0 + i] += (float)acc[i];
  }
}
