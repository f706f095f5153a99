// model/cpu/swiglu.c: the SwiGLU gate, silu(gate) * up (CPU reference). See ops.h.
#include "model/ops.h"

#include <math.h>

void swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];  // torch's silu: x / (1 + exp(-x))
  }
}

void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    float g = gate[i], sig = 1.0f / (1.0f + expf(-g)), silu = g * sig;
    // d silu/dg = sig + g sig (1 - sig)
    dgate[i] = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] = dout[i] * silu;
  }
}
