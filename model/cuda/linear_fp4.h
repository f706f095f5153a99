// model/cuda/linear_fp4.h: the recipe-aware FP4 linear layer of the CUDA backend (fp4/recipe.h). Every
// block's q, k, v, o, gate, up and down run Fprop, Dgrad and Wgrad on FP4 operands as the recipe
// says; the head, and blocks the recipe keeps in BF16, stay on the BF16 path of ops_cuda.cu.
//
// One linear y = x W^T (x [N, in] BF16, W [out, in] fp32 master with a BF16 shadow, dY [N, out]):
//   MXFP4  Fprop  x: 1x32 blocks along in, RNE.  W: 32x32 tiles with the 0.87 rule (weight_2d), else
//                 1x32 along in. GEMM Y = x W^T.
//          Dgrad  dY: 1x32 blocks along out, SR when sr_dgrad. W^T: the same codes as W (2D tiles),
//                 or 1x32 along out (1D). GEMM dX = dY (W^T)^T.
//          Wgrad  dY and x: fixed-sign H32/H16 along tokens (recipe.hadamard), then 1x32 blocks along
//                 tokens (dY: SR when sr_wgrad), stored transposed [out, N] and [in, N]. dW += dY^T x.
//   NVFP4  the same with 1x16 blocks, E4M3 block scales and an fp32 tensor scale per operand (the
//          tensor amaxes stay on the device and reach the GEMM's alpha there), 16x16 weight tiles,
//          R16 only.
// The dY row copy (Dgrad) and column copy (Wgrad) come from one producer call (mx_quantize_dual_cuda)
// in the paper's recipe. x's Wgrad column copy is made in the forward and kept quantized until the
// backward when input saving is on (below), else recomputed in the backward from the saved BF16 x.
//
// GEMM back ends (recipe.gemm): GEMM_FP8_EMBED runs MXFP4 on Hopper's FP8 tensor cores through the
// exact FP8 embedding (fp8_embed.h), alpha = mx_unit^2; GEMM_REFERENCE dequantizes exactly to BF16
// and runs a BF16 GEMM (NVFP4's only path on Hopper); GEMM_FP4_NATIVE is Blackwell's cuBLASLt FP4
// (compiled, untested here).
//
// Weights are quantized from the BF16 shadow (what the BF16 path multiplies with) once per weights
// version: ops_cuda.cu bumps the version on params_changed() and adamw(), so it is once per optimizer
// step, however many micro-batches run. The W and W^T copies live in a per-weight cache.
//
// Stochastic rounding draws Philox bits from philox_stream(seed, step, micro, layer, tensor), tensor =
// 4 * kind + use (use: 0 = dY row copy for Dgrad, 1 = dY column copy for Wgrad, 2 = x column copy),
// with (step, micro) from the table's set_step: the same (seed, step, micro) gives the same bits, so
// a resumed run reproduces the original.
//
// Requirements of an FP4 layer (checked, naming the layer): N, in and out multiples of 32; the FP8
// back end also needs cuBLASLt to take the K of each GEMM (multiples of 128 always work).
// No host syncs and no allocations after a shape's first call.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "fp4/recipe.h"
#include "model/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// Selects the recipe (copied; NULL or format FMT_BF16 = every linear in BF16, the default) for a model
// of n_layers blocks, with the SR seed. Dies on a recipe this backend cannot run (naming the field).
// Drops the quantized-weight cache (after a sync), so it may be called between steps.
void linear_fp4_set_recipe(const Recipe *r, int n_layers, uint64_t seed);
// Records where the run is, for the SR random bits. step must be in [0, 2^32), micro >= 0.
void linear_fp4_set_step(int64_t step, int micro);
// 1 when linear `id` runs in FP4 under the current recipe (never for the head).
int linear_fp4_active(LinearId id);
// Frees the quantized-weight cache (the parameter buffer is released or rebound).
void linear_fp4_release_weights(void);
// Weight quantizations so far (each refreshes one weight's W and W^T copies). For tests.
long linear_fp4_weight_quantizations(void);
// k/v reuse q's quantization of x, up reuses gate's (on by default). Off: every linear quantizes its
// own x (for the test that the sharing changes no bit).
void linear_fp4_set_share_x(int on);
// Saved tensors kept quantized (off by default; Ops.set_input_saving turns it on for a model that
// keeps its activations): the forward of q, gate and down also writes x's Wgrad column copy (the
// MXFP4 dual producer makes it with the Fprop copy from one read of x) into a buffer per (layer,
// group) kept until the backward, whose Wgrad then reads it instead of requantizing x. The same bits
// either way (the copy is RNE). saves_input: 1 when linear id's backward needs no BF16 x (active,
// saving on, and not o, whose input the attention backward needs in BF16 anyway); saved_bytes:
// device memory the saved copies hold.
void linear_fp4_set_save_inputs(int on);
int linear_fp4_saves_input(LinearId id);
size_t linear_fp4_saved_bytes(void);
// The Wgrad operand copies in 128x128 tiles (Recipe.wgrad_2d) made so far by the dual producer: their
// 32-blocks, and the nonzero ones outside the FP8 embedding's exact range (more than 14 binades below
// the tile's largest: rounded by at most 2^-17 of the tile maximum). Synchronizes to read the count.
void linear_fp4_tile_stats(unsigned long long *rounded, unsigned long long *blocks);

// Format-aware fusion (model/cuda/quant_fused.h), MXFP4 recipes whose Wgrad copies the dual producer makes
// (H32 or none) with saved inputs on: fusable(leader) says whether the op that makes linear leader's
// input x (an RMSNorm for q and gate, SwiGLU for down) may run inside the producer of x's FP4 copies.
// The fused_* calls then make leader's Fprop copy and its saved Wgrad copy straight from the op's
// inputs, and leader's forward (and its followers', which share x) finds x quantized under x_token, the
// pointer of the BF16 buffer that is never written. They return 0 and do nothing when not fusable (the
// caller makes x in BF16 as usual). set_fusion(0) turns it off (the tests compare both ways).
int linear_fp4_fusable(LinearId leader);
void linear_fp4_set_fusion(int on);
long linear_fp4_fused_calls(void);  // fused producers run so far (for tests)

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_bf16.h>
// The linear entries behind ops_cuda.cu's matmul_fwd / matmul_bwd for an active id (same
// arguments as the table's, typed), plus the weight's BF16 shadow w16 and the current weights
// version (a cached quantization older than it is redone). dx or dw may be NULL. dw_overwrite:
// dW = ... instead of dW += ... (Ops.set_grad_overwrite).
void linear_fp4_forward(LinearId id, __nv_bfloat16 *out, const __nv_bfloat16 *x, const float *w,
                        const __nv_bfloat16 *w16, uint64_t wversion, int N, int in, int out_dim);
void linear_fp4_backward(LinearId id, __nv_bfloat16 *dx, float *dw, const __nv_bfloat16 *dout,
                         const __nv_bfloat16 *x, const float *w, const __nv_bfloat16 *w16, uint64_t wversion, int N,
                         int in, int out_dim, int dx_accumulate, int dw_overwrite);
// rstd: rmsnorm_forward_cuda's (made first, with out = NULL); w: the norm weight (fp32).
int linear_fp4_fused_rmsnorm(LinearId leader, const void *x_token, const __nv_bfloat16 *res, const float *rstd,
                             const float *w, int N, int D);
int linear_fp4_fused_swiglu(LinearId leader, const void *x_token, const __nv_bfloat16 *gate, const __nv_bfloat16 *up,
                            int N, int F);
#endif
