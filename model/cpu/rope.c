// model/cpu/rope.c: rotary position embedding with HF's rotate_half pairing (element i rotates with
// element i + hd/2) and the Llama-3.1 frequency rescaling (CPU reference). See ops.h. A token's
// position is its place in the row, or pos[n] when given (positions that restart at each document,
// model.doc_positions: restart): only the row of the cos/sin tables changes.
#include "common/common.h"
#include "model/ops.h"

#include <math.h>
#include <stdlib.h>

void rope_inv_freq(float *inv_freq, int hd, const LlamaConfig *c) {
  if (hd % 2) die("rope: head_dim %d must be even", hd);
  const double pi = 3.14159265358979323846;
  for (int i = 0; i < hd / 2; i++) {
    double f = 1.0 / pow((double)c->rope_theta, (2.0 * i) / hd);
    if (c->rope_scaling) {
      // transformers' _compute_llama3_parameters: keep high frequencies, divide low ones by
      // factor, interpolate in between.
      double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
      double orig = c->rope_original_max_pos;
      double low_wavelen = orig / lo, high_wavelen = orig / hi, wavelen = 2 * pi / f;
      double f_l = wavelen > low_wavelen ? f / factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        double smooth = (orig / wavelen - lo) / (hi - lo);
        f_l = (1 - smooth) * f_l / factor + smooth * f_l;
      }
      f = f_l;
    }
    inv_freq[i] = (float)f;
  }
}

void rope_tables(float *cos_t, float *sin_t, int T, int hd, const LlamaConfig *c) {
  int half = hd / 2;
  float *inv_freq = xmalloc((size_t)half * sizeof(float));
  rope_inv_freq(inv_freq, hd, c);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      // inv_freq is fp32 as in HF, but the angle stays exact (double): HF rounds t * inv_freq to
      // fp32, an error of up to 2.4e-4 rad at position 8191 that we do not reproduce.
      double angle = (double)t * inv_freq[i];
      cos_t[(size_t)t * half + i] = (float)cos(angle);
      sin_t[(size_t)t * half + i] = (float)sin(angle);
    }
  free(inv_freq);
}

// Rotates every head of every token by +angle (sign = 1) or -angle (sign = -1).
static void rotate(float *x, const float *cos_t, const float *sin_t, const int *pos, int B, int T, int n_heads, int hd,
                   float sign) {
  int half = hd / 2;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < B * T; n++) {
    const int t = pos ? pos[n] : n % T;
    const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
    for (int h = 0; h < n_heads; h++) {
      float *v = x + ((size_t)n * n_heads + h) * hd;
      for (int i = 0; i < half; i++) {
        float x1 = v[i], x2 = v[i + half], sn = sign * s[i];
        v[i] = x1 * c[i] - x2 * sn;  // HF: x * cos + rotate_half(x) * sin, rotate_half = (-x2, x1)
        v[i + half] = x2 * c[i] + x1 * sn;
      }
    }
  }
}

void rope_forward(float *x, const float *cos_t, const float *sin_t, const int *pos, int B, int T, int n_heads, int hd) {
  rotate(x, cos_t, sin_t, pos, B, T, n_heads, hd, 1.0f);
}

// The rotation is orthogonal, so its transpose is the rotation by -angle.
void rope_backward(float *dx, const float *cos_t, const float *sin_t, const int *pos, int B, int T, int n_heads,
                   int hd) {
  rotate(dx, cos_t, sin_t, pos, B, T, n_heads, hd, -1.0f);
}
