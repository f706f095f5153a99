// model/cpu/linear_fp4.h: the CPU backend's FP4 linear layer, the fp32 reference of every precision
// route (see linear_fp4.c). The state is what the CUDA layer keeps too: the recipe, the depth, the SR
// seed and where the run is.
#pragma once
#include <stdint.h>

#include "fp4/recipe.h"
#include "model/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  Recipe r;  // format FMT_BF16 without spans: every linear in fp32, unquantized
  int nlayers;
  uint64_t seed;
  uint32_t step, micro;
} LinearFp4Cpu;

// A layer under the route the config keys s spell (resolved for no GPU; dies naming the key), for n_layers
// blocks and the SR seed: for tools and tests that run linears outside a model.
LinearFp4Cpu linear_fp4_cpu_route(const RecipeSpec *s, int n_layers, uint64_t seed);
// The format contraction c of linear id runs in (FMT_BF16: the plain fp32 product; never the head).
FP4Format linear_fp4_cpu_format(const LinearFp4Cpu *L, LinearId id, Contraction c);
// As matmul_forward / matmul_backward (model/ops.h), each contraction in its format. dw is added to.
void linear_fp4_cpu_forward(const LinearFp4Cpu *L, LinearId id, float *out, const float *x, const float *w, int N,
                            int in, int out_dim);
void linear_fp4_cpu_backward(const LinearFp4Cpu *L, LinearId id, float *dx, float *dw, const float *dout,
                             const float *x, const float *w, int N, int in, int out_dim, int dx_accumulate);

#ifdef __cplusplus
}
#endif
