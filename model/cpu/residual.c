// model/cpu/residual.c: the residual add (CPU reference). See ops.h.
#include "model/ops.h"

void residual_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
