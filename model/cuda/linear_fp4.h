// model/cuda/linear_fp4.h: the recipe-aware FP4 linear layer of the CUDA backend (fp4/recipe.h). Every
// block's q, k, v, o, gate, up and down run Fprop, Dgrad and Wgrad on FP4 operands as the recipe
// says; the head, and blocks the recipe keeps in BF16, stay on the BF16 path of ops_cuda.cu.
//
// One linear y = x W^T (x [N, in] BF16, W [out, in] fp32 master with a BF16 shadow, dY [N, out]):
//   MXFP4  Fprop  x: 1x32 blocks along in, RNE.  W: 32x32 tiles with the 0.87 rule (weight_2d), else
//                 1x32 along in. GEMM Y = x W^T.
//          Dgrad  dY: 1x32 blocks along out, SR when sr_dgrad. W^T: the same codes as W (2D tiles),
//                 or 1x32 along out (1D). GEMM dX = dY (W^T)^T.
//          Wgrad  dY and x: H32, fixed-sign or plain H16 along tokens (recipe.hadamard), then 1x32
//                 blocks along tokens (dY: SR when sr_wgrad), stored transposed [out, N] and [in, N].
//                 dW += dY^T x.
//   NVFP4  the same with 1x16 blocks, E4M3 block scales and an fp32 tensor scale per operand (the
//          tensor amaxes stay on the device and reach the GEMM's alpha there), 16x16 weight tiles,
//          R16 only.
//   NVFP4_CTA  1x16 blocks with E4M3 scales under fp32 outer factors per 256-row stripe of each
//          operand (fp4/nvfp4_cta.h); the GEMM runs on the unscaled operands and an epilogue applies
//          alpha_i beta_j to each output element (fp4_gemm_cta). 2D16 weights with one common factor.
// Each contraction of each block runs in the format recipe_format names (precision.blocks and
// precision.fprop/dgrad/wgrad): W is quantized in the Fprop format and W^T in the Dgrad format
// (one producer when they agree), dY's row copy in the Dgrad format and its column copy in the Wgrad
// format, x's row copy in the Fprop format and its column copy in the Wgrad format. A contraction
// in BF16 inside an FP4 block runs in ops_cuda.cu (linear_fp4_runs says which).
// The dY row copy (Dgrad) and column copy (Wgrad) come from one producer call (mx_quantize_dual_cuda)
// in the paper's recipe. x's Wgrad column copy is made in the forward and kept quantized until the
// backward when input saving is on (below), else recomputed in the backward from the saved BF16 x.
//
// GEMM back ends (recipe.gemm): GEMM_FP8_EMBED runs MXFP4 on Hopper's FP8 tensor cores through the
// exact FP8 embedding (fp8_embed.h), alpha = mx_unit^2; GEMM_REFERENCE dequantizes exactly to BF16
// and runs a BF16 GEMM (the only exact path on Hopper for both NVFP4 forms, whose E2M1 x E4M3 values
// have no FP8 embedding); GEMM_FP4_NATIVE is Blackwell's cuBLASLt FP4 (compiled, untested here; the
// CTA-local form on it is refused at run time). In a mixed route the MXFP4 contractions keep the FP8
// path and the NVFP4 ones take the reference.
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
//
// The state (recipe, operand scratch, weight cache, saved inputs) is a LinearFp4 instance owned by
// the backend (CudaBackend.lin). What depends on the format is a LinearFormat (below): its block,
// its producers and its GEMM scale, one implementation file per format (linear_mxfp4.cu,
// linear_nvfp4.cu, linear_nvfp4_cta.cu), looked up per block and contraction from the table
// set_recipe fills. This file's code never asks which format it runs.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "fp4/recipe.h"
#include "model/cuda/ops_cuda.h"
#include "model/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// A new instance for backend b (its memory and profiler), under the BF16 recipe.
LinearFp4 *linear_fp4_create(CudaBackend *b);
// Selects the recipe (copied; NULL or format FMT_BF16 = every linear in BF16, the default) for a model
// of n_layers blocks, with the SR seed. Dies on a recipe this backend cannot run (naming the field).
// Drops the quantized-weight cache (after a sync), so it may be called between steps.
void linear_fp4_set_recipe(LinearFp4 *L, const Recipe *r, int n_layers, uint64_t seed);
// Records where the run is, for the SR random bits. step must be in [0, 2^32), micro >= 0.
void linear_fp4_set_step(LinearFp4 *L, int64_t step, int micro);
// 1 when contraction c of linear `id` runs in FP4 under the current recipe (never for the head); the
// others run in BF16, in ops_cuda.cu.
int linear_fp4_runs(const LinearFp4 *L, LinearId id, Contraction c);
// Frees the quantized-weight cache (the parameter buffer is released or rebound).
void linear_fp4_release_weights(LinearFp4 *L);
// Weight quantizations so far (each refreshes one weight's W and W^T copies). For tests.
long linear_fp4_weight_quantizations(const LinearFp4 *L);
// k/v reuse q's quantization of x, up reuses gate's (on by default). Off: every linear quantizes its
// own x (for the test that the sharing changes no bit).
void linear_fp4_set_share_x(LinearFp4 *L, int on);
// Saved tensors kept quantized (off by default; Ops.set_input_saving turns it on for a model that
// keeps its activations): the forward of q, gate and down also writes x's Wgrad column copy (the
// MXFP4 dual producer makes it with the Fprop copy from one read of x) into a buffer per (layer,
// group) kept until the backward, whose Wgrad then reads it instead of requantizing x. The same bits
// either way (the copy is RNE). saves_input: 1 when linear id's backward needs no BF16 x (active,
// saving on, and not o, whose input the attention backward needs in BF16 anyway); saved_bytes:
// device memory the saved copies hold.
void linear_fp4_set_save_inputs(LinearFp4 *L, int on);
int linear_fp4_saves_input(const LinearFp4 *L, LinearId id);
size_t linear_fp4_saved_bytes(const LinearFp4 *L);
// The Wgrad operand copies in 128x128 tiles (Recipe.wgrad_2d) made so far by the dual producer: their
// 32-blocks, and the nonzero ones outside the FP8 embedding's exact range (more than 14 binades below
// the tile's largest: rounded by at most 2^-17 of the tile maximum). Synchronizes to read the count.
void linear_fp4_tile_stats(const LinearFp4 *L, unsigned long long *rounded, unsigned long long *blocks);

// Format-aware fusion (model/cuda/quant_fused.h), for formats with fused producers (MXFP4) whose
// Wgrad copies the dual producer makes (H32 or none) with saved inputs on: fusable(leader) says
// whether the op that makes linear leader's input x (an RMSNorm for q and gate, SwiGLU for down) may
// run inside the producer of x's FP4 copies. The fused_* calls then make leader's Fprop copy and its
// saved Wgrad copy straight from the op's inputs, and leader's forward (and its followers', which
// share x) finds x quantized under x_token, the pointer of the BF16 buffer that is never written.
// They return 0 and do nothing when not fusable (the caller makes x in BF16 as usual). Recipe.fusion
// FUSION_OFF turns every fusion off (the tests compare both ways).
int linear_fp4_fusable(const LinearFp4 *L, LinearId leader);
// The residual add in the Fprop GEMM's epilogue (Ops.matmul_residual_fwd): 1 when linear id's Fprop
// runs on the FP8 path with fusion on, whose epilogue adds a residual stream R with the bits of the GEMM
// followed by residual_fwd (R + bf16(GEMM) in fp32, rounded once; fp4_gemm_fp8_src). Then
// linear_fp4_forward may take res.
int linear_fp4_fuses_residual(const LinearFp4 *L, LinearId id);
// SwiGLU and down's input producer in up's GEMM epilogue (Ops.matmul_swiglu_fwd, model/cuda/swiglu_epilogue.h):
// 1 where up's Fprop and down's fused SwiGLU producer both run MXFP4 on the FP8 path, CUTLASS is built and
// the GPU is Hopper, N and F are multiples of 128, and fusion is on. Then linear_fp4_forward_swiglu runs both.
int linear_fp4_fuses_swiglu(const LinearFp4 *L, LinearId up, LinearId down, int N, int F);
long linear_fp4_fused_calls(const LinearFp4 *L);  // fused producers run so far (for tests)

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_bf16.h>

#include "fp4/mxfp4.h"
#include "fp4/philox.h"

// The linear entries behind ops_cuda.cu's matmul_fwd / matmul_bwd for an active id (same
// arguments as the table's, typed), plus the weight's BF16 shadow w16 and the current weights
// version (a cached quantization older than it is redone). dx or dw may be NULL, and must be where
// linear_fp4_runs says the contraction runs in BF16. dw_overwrite: dW = ... instead of dW += ...
// (Ops.set_grad_overwrite). res (NULL: none): out = res + x W^T, the add in the GEMM's epilogue, only where
// linear_fp4_fuses_residual says so.
void linear_fp4_forward(LinearFp4 *L, LinearId id, bf16 *out, const bf16 *x, const float *w, const bf16 *w16,
                        uint64_t wversion, int N, int in, int out_dim, const bf16 *res);
void linear_fp4_backward(LinearFp4 *L, LinearId id, bf16 *dx, float *dw, const bf16 *dout, const bf16 *x,
                         const float *w, const bf16 *w16, uint64_t wversion, int N, int in, int out_dim,
                         int dx_accumulate, int dw_overwrite);
// rstd: rmsnorm_forward_cuda's (made first, with out = NULL); w: the norm weight (fp32).
int linear_fp4_fused_rmsnorm(LinearFp4 *L, LinearId leader, const void *x_token, const bf16 *res, const float *rstd,
                             const float *w, int N, int D);
int linear_fp4_fused_swiglu(LinearFp4 *L, LinearId leader, const void *x_token, const bf16 *gate, const bf16 *up, int N,
                            int F);
// linear_fp4_forward(up_id, up, x, ..., N, in, F), then linear_fp4_fused_swiglu(down, x_token, gate, up, N, F), in
// one kernel; where linear_fp4_fuses_swiglu says so.
void linear_fp4_forward_swiglu(LinearFp4 *L, LinearId up_id, LinearId down, bf16 *up, const void *x_token,
                               const bf16 *x, const float *w, const bf16 *w16, uint64_t wversion, const bf16 *gate,
                               int N, int in, int F);

// ---- internal: shared by linear_fp4.cu and the format files ----------------------------------

// One quantized matrix [rows, K] in device memory, in one of two forms:
//   packed (fp8 = 0): codes [rows, K/2] and scale bytes sb (one per block of the format), and for
//                     CTA-local NVFP4 the outer factors (fp32, one per 256 rows; NULL otherwise);
//   FP8 embedding (fp8 = 1, MXFP4 only): E4M3 [rows, K] and float scales sf, VEC128 or BLK128x128.
typedef struct {
  uint8_t *q, *sb;
  float *sf, *outer;
  int fp8, blk128;
} QOp;

typedef struct LinearFormat LinearFormat;

// A weight's quantized copies, cached per fp32 master pointer.
typedef struct {
  const float *w;  // the key: the fp32 master pointer the graph passes
  int in, out_dim;
  const LinearFormat *fw, *fwt;  // the formats of W (the Fprop's) and W^T (the Dgrad's); NULL: BF16
  uint8_t *mem;                  // one allocation: W, W^T, and the tensor amax (formats that have one)
  QOp wq, wtq;                   // W [out, in] for Fprop, W^T [in, out] for Dgrad
  float *amax;                   // the tensor amax of W (device; NVFP4)
  uint64_t version;              // weights version of the quantization (0: never)
} QWeight;

// The last quantization of an x, per use, for the linears that share it (linear_fp4.cu).
typedef struct {
  const void *x;
  const LinearFormat *f;  // the format of that quantization
  int N, in, layer;
  LinearKind kind;  // the kind of the linear that last quantized x (or reused it)
  int fused;        // made by a fused producer for `kind` itself (linear_fp4_fused_*): nothing to quantize
  int slot;         // the scratch role holding the row copy: S_X_ROW, or S_X_ROW2 (from up's GEMM epilogue)
} XQuant;

// x's Wgrad copy kept from the forward (saved tensors kept quantized, linear_fp4.cu).
typedef struct {
  int layer, N, in, fp8, blk;
  const LinearFormat *f;  // the Wgrad's format
  LinearKind group;
  uint8_t *mem;
  QOp col;      // x^T [in, N], the Wgrad operand
  float *amax;  // the tensor amax of the rotated x (device; NVFP4)
  int valid;    // written by the forward of the current micro-batch
} SavedX;

// scratch per operand role; S_X_ROW2: down's x row copy made in up's GEMM epilogue, while that GEMM still reads S_X_ROW
enum { S_X_ROW, S_DY_ROW, S_DY_COL, S_X_COL, S_PACKED_TMP, S_CTA_AMAX, S_CTA_ACC, S_X_ROW2, S_N };
enum { XQ_ROW, XQ_COL, XQ_N };
// Device scalars (tensor amaxes and the GEMM alpha of formats that scale per tensor), 64 bytes apart.
enum { D_AMAX_X, D_AMAX_DY, D_AMAX_DY_COL, D_AMAX_X_COL, D_ALPHA, D_N };

struct LinearFp4 {
  CudaBackend *b;                  // memory and profiler
  Recipe recipe;                   // format FMT_BF16 and no spans: everything BF16
  const LinearFormat *fmt[FMT_N];  // per FP4Format, the formats the recipe uses (NULL: unused, BF16)
  int any;                         // some linear runs in FP4
  int nlayers;
  uint64_t seed;
  uint32_t step, micro;
  unsigned long long *rounded;  // device counter of the tiled Wgrad copies (linear_fp4_tile_stats)
  unsigned long long tile_blocks;
  CudaScratch scratch[S_N];
  float *dev;  // D_N device scalars
  QWeight *wc;
  int nwc, capwc;
  long wquant;
  XQuant xq[XQ_N];
  int share_x;
  SavedX *saved;
  int nsaved, capsaved;
  int save_inputs;
  size_t saved_bytes;
  long fused_calls;
};

// One FP4 format as the linear layer runs it: data, producers and the GEMM scale. amax arguments are
// device floats for formats with a tensor scale (the producer writes the amax there first; the
// others ignore them); CTA-local NVFP4 writes its outer factors into the QOp's outer. A row copy of
// x [rows, K] is [rows, K] with blocks along K; a column copy is [K, rows] with blocks along rows
// (the Wgrad operands), with the recipe's Hadamard.
struct LinearFormat {
  FP4Format format;
  const char *name, *tag;  // "mxfp4" for messages, "mx" for profile entries
  int block;               // elements per scale
  int reads;               // reads of the source per quantized copy (a tensor amax is a pass of its own)
  int fp8_embed;           // may run through the FP8 embedding (Recipe.gemm GEMM_FP8_EMBED)
  int outer;               // operands carry outer factors (QOp.outer)
  // W [O, I] -> wq (W, Fprop) and wtq (W^T, Dgrad), either NULL; both from one producer (one read
  // of W) where the format's 2D tiles share their codes. amax: W's tensor amax (device).
  void (*weight)(LinearFp4 *L, const bf16 *w16, int O, int I, const QOp *wq, const QOp *wtq, float *amax);
  void (*rows)(LinearFp4 *L, const bf16 *x, int rows, int K, int sr, PhiloxStream s, const QOp &dst, float *amax);
  void (*cols)(LinearFp4 *L, const bf16 *x, int rows, int K, int sr, PhiloxStream s, const QOp &dst, float *amax);
  // Whether one producer makes both copies from one read of x under the recipe, for a column copy
  // with stochastic rounding (sr_col) or without; dual makes them (the row copy skipped when row is
  // NULL), returning 0 and doing nothing where has_dual says no.
  int (*has_dual)(const LinearFp4 *L, int sr_col);
  int (*dual)(LinearFp4 *L, const bf16 *x, int rows, int K, int sr_row, PhiloxStream s_row, const QOp *row, int sr_col,
              const QOp &col);
  // The dual producer (RNE columns) with RMSNorm / SwiGLU computed inside it (quant_fused.h); NULL
  // where the format has none.
  void (*dual_rmsnorm)(LinearFp4 *L, const bf16 *x, const float *rstd, const float *w, int rows, int K, const QOp &row,
                       const QOp &col);
  void (*dual_swiglu)(LinearFp4 *L, const bf16 *gate, const bf16 *up, int rows, int K, const QOp &row, const QOp &col);
  // The GEMM's alpha for operands a and b: a host value, or 1 with *alpha_dev set to a device
  // alpha computed from their tensor amaxes.
  float (*alpha)(LinearFp4 *L, const float *amax_a, const float *amax_b, const float **alpha_dev);
};
extern const LinearFormat linear_mxfp4, linear_nvfp4, linear_nvfp4_cta;  // linear_mxfp4.cu, ...
// The operand hybrid's dY producer (linear_nvfp4_cta.cu): the Dgrad row copy in format fd and the Wgrad
// column copy in format fw from one read of x, where fd is CTA-local NVFP4 and fw MXFP4 with an RNE
// column copy; 0 and nothing done otherwise. linear_fp4.cu runs it unless precision.fusion is off.
int linear_hybrid_dual(LinearFp4 *L, const LinearFormat *fd, const LinearFormat *fw, const bf16 *x, int rows, int K,
                       int sr_row, PhiloxStream s_row, const QOp &row, int sr_col, const QOp &col);

// linear_fp4.cu's helpers for the format files.
int linear_fp8_path(const LinearFp4 *L,
                    const LinearFormat *f);  // f's operands FP8-embedded (f's and the recipe's choice)
QOp linear_scratch_op(LinearFp4 *L, const LinearFormat *f, int role, int fp8, int blk128, int rows, int K);
// Device words for CTA-local NVFP4's chunk amaxes of a carrier [rows, K] (nvfp4_cta_scratch_words),
// then cta_stripes(rows) spare words (a weight's factors when only W^T is made).
uint32_t *linear_cta_scratch(LinearFp4 *L, int rows, int K);
MxOut linear_mx_out(const QOp &o);
// MXFP4's scale rounding and column Hadamard from the recipe: linear_mxfp4.cu's producers and the
// operand hybrid's (linear_nvfp4_cta.cu), whose bytes must equal them.
static inline MxScale linear_mx_mode(const LinearFp4 *L) {
  return L->recipe.scale_round_up ? MX_SCALE_UP : MX_SCALE_DOWN;
}
static inline int linear_mx_hadamard(const LinearFp4 *L) {
  return L->recipe.hadamard == 16 && L->recipe.hadamard_plain ? MX_HADAMARD_H16_PLAIN : L->recipe.hadamard;
}
MxOut linear_col_out(LinearFp4 *L, const QOp &o, int rows, int K);  // a column copy (counts tiled ones)
float *linear_dev_scalar(LinearFp4 *L, int i);
#endif
