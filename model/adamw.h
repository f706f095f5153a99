// model/adamw.h: the AdamW update (PyTorch semantics), the global gradient norm and the clip factor.
// All CPU, fp32 state. Every function is deterministic for a given thread count and, because sums
// use fixed-size chunks added in a fixed order, also across thread counts.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Sum of squares of g[0..n) in double: fixed 64K-element chunks summed in order. Exposed so the
// caller can add the sums of several buffers (or ranks) before taking one square root.
double grad_sumsq(const float *g, size_t n);

// sqrt(grad_sumsq(g, n)): the L2 norm of the whole gradient (PyTorch's clip_grad_norm_ total norm).
float grad_global_norm(const float *g, size_t n);

// The factor that clip_grad_norm_ multiplies gradients by: 1 when clip <= 0 (disabled) or
// norm <= clip, else clip / (norm + 1e-6). A NaN norm gives NaN and an infinite one 0, as in
// PyTorch: the caller should check isfinite(norm) and skip or stop instead.
float clip_scale(float norm, float clip);

// One AdamW step over n elements, exactly torch.optim.AdamW (decoupled weight decay, bias correction):
//   g' = g * grad_scale                 (grad_scale folds clipping and any loss scaling)
//   p *= 1 - lr * weight_decay
//   m  = beta1 m + (1 - beta1) g'       (computed as torch's lerp: m + (1 - beta1)(g' - m))
//   v  = beta2 v + (1 - beta2) g'^2
//   p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// t is the 1-based step count (1 on the first update). Pass weight_decay = 0 for tensors that
// are not decayed (norms, by the caller's policy).
void adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float grad_scale, int64_t t);

#ifdef __cplusplus
}
#endif
