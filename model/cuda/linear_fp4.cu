// model/cuda/linear_fp4.cu: the FP4 linear layer (see linear_fp4.h): recipe state, quantized operand
// buffers, the per-weight cache of quantized W / W^T, and the three GEMMs of a linear for MXFP4
// and NVFP4. The quantizers and GEMMs are the fp4/ library's; this file decides which runs where.
#include <string.h>

#include "common/common.h"
#include "fp4/fp8_embed.h"
#include "fp4/gemm_fp4.h"
#include "fp4/hadamard.h"
#include "fp4/mxfp4.h"
#include "fp4/nvfp4.h"
#include "model/cuda/linear_fp4.h"
#include "model/cuda/ops_cuda.h"
#include "model/cuda/quant_fused.h"

// ---- recipe state -------------------------------------------------------------------------------

static Recipe g_recipe;   // format FMT_BF16: everything BF16
static int g_nlayers;
static uint64_t g_seed;
static uint32_t g_step, g_micro;

enum { USE_DY_ROW = 0, USE_DY_COL = 1, USE_X_COL = 2 };
static void forget_x(void);  // below: the remembered quantizations of x are stale  // the tensor id's low bits (linear_fp4.h)

static PhiloxStream stream_for(LinearId id, int use) {
  return philox_stream(g_seed, g_step, g_micro, (uint32_t)id.layer, (uint32_t)(4 * id.kind + use));
}

static MxScale mx_mode(void) { return g_recipe.scale_round_up ? MX_SCALE_UP : MX_SCALE_DOWN; }
static int fp8_path(void) { return g_recipe.format == FMT_MXFP4 && g_recipe.gemm == GEMM_FP8_EMBED; }
// Whether the Wgrad column copy of dY (or of x) is embedded per 128x128 tile (Recipe.wgrad_2d).
static int dy_col_blk(void) { return fp8_path() && g_recipe.wgrad_2d == WGRAD_2D_DY; }
static int x_col_blk(void) { return fp8_path() && g_recipe.wgrad_2d == WGRAD_2D_X; }

int linear_fp4_active(LinearId id) {
  if (g_recipe.format == FMT_BF16 || id.kind == LIN_HEAD || id.layer < 0) return 0;
  if (id.layer >= g_nlayers)
    die("linear_fp4: layer %d (%s) is outside the %d blocks the recipe was set for (cuda_set_recipe)", id.layer,
        linear_kind_name(id.kind), g_nlayers);
  return recipe_block_format(&g_recipe, id.layer, g_nlayers) != FMT_BF16;
}

void linear_fp4_set_step(int64_t step, int micro) {
  if (step < 0 || step > (int64_t)UINT32_MAX || micro < 0)
    die("set_step(step=%lld, micro=%d): step must be in [0, 2^32) and micro >= 0 (the Philox counter words)",
        (long long)step, micro);
  g_step = (uint32_t)step, g_micro = (uint32_t)micro;
  forget_x();  // a new micro-batch: new x, whatever the pointers
}

void linear_fp4_set_recipe(const Recipe *r, int n_layers, uint64_t seed) {
  Recipe bf16 = {};
  bf16.format = FMT_BF16;
  if (!r) r = &bf16;
  if (r->format != FMT_BF16) {
    if (n_layers <= 0) die("cuda_set_recipe: n_layers = %d must be positive", n_layers);
    char err[256];
    if (recipe_check(r, err, sizeof err)) die("cuda_set_recipe: %s", err);  // fp4/recipe.c: the one validation
    if (r->gemm == GEMM_FP4_NATIVE && !fp4_gemm_native_available())
      die("cuda_set_recipe: precision.fp4_gemm fp4 needs a compute capability 10.x GPU with the sm_100a code built "
          "in; use fp8 (MXFP4 on Hopper) or reference");
  }
  linear_fp4_release_weights();  // quantized under the previous recipe
  g_recipe = *r, g_nlayers = n_layers, g_seed = seed;
  forget_x();
}

// ---- quantized operands -------------------------------------------------------------------------

// One quantized matrix [rows, K] in device memory, in one of two forms:
//   packed (fp8 = 0): codes [rows, K/2] and scale bytes sb (E8M0 [rows, K/32] or E4M3 [rows, K/16]);
//   FP8 embedding (fp8 = 1, MXFP4 only): E4M3 [rows, K] and float scales sf, VEC128 or BLK128x128.
typedef struct {
  uint8_t *q, *sb;
  float *sf;
  int fp8, blk128;
} QOp;

static size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }

static size_t qop_bytes(int fp8, int blk128, int rows, int K) {
  if (fp8) {
    size_t ns = blk128 ? mx_blk128_scale_count(rows, K) : mx_vec128_scale_count(rows, K);
    return round256((size_t)rows * K) + round256(ns * sizeof(float));
  }
  int block = g_recipe.format == FMT_NVFP4 ? 16 : 32;
  return round256((size_t)rows * K / 2) + round256((size_t)rows * (K / block));
}

static QOp qop_at(uint8_t *base, int fp8, int blk128, int rows, int K) {
  QOp o = {};
  o.fp8 = fp8, o.blk128 = blk128, o.q = base;
  uint8_t *tail = base + round256(fp8 ? (size_t)rows * K : (size_t)rows * K / 2);
  if (fp8) o.sf = (float *)tail;
  else o.sb = tail;
  return o;
}

static MxOut mx_out(const QOp &o) {
  MxOut m = {};
  m.q = o.q, m.e8m0 = o.sb, m.scale = o.sf, m.fp8 = o.fp8, m.scale_mul = 1.0f;  // exact powers of two
  m.blk128 = o.fp8 && o.blk128;
  return m;
}

// A column copy o of a rows x K source ([K, rows]) for the dual producer; a tiled one is counted
// (linear_fp4_tile_stats).
static unsigned long long *g_rounded;  // device
static unsigned long long g_tile_blocks;
static MxOut col_out(const QOp &o, int rows, int K) {
  MxOut m = mx_out(o);
  if (m.blk128) {
    if (!g_rounded) {
      g_rounded = (unsigned long long *)cuda_malloc_tracked(256, "FP8 tile embedding counter");
      CUDA_CHECK(cudaMemsetAsync(g_rounded, 0, 8, cuda_stream()));
    }
    m.rounded = g_rounded, g_tile_blocks += (unsigned long long)(rows / 32) * K;
  }
  return m;
}

void linear_fp4_tile_stats(unsigned long long *rounded, unsigned long long *blocks) {
  *rounded = 0, *blocks = g_tile_blocks;
  if (g_rounded) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    CUDA_CHECK(cudaMemcpy(rounded, g_rounded, 8, cudaMemcpyDeviceToHost));
  }
}

// Grow-only scratch per operand role (activations and gradients are requantized every call).
enum { S_X_ROW, S_DY_ROW, S_DY_COL, S_X_COL, S_PACKED_TMP, S_N };
static CudaScratch g_scratch[S_N];
static const char *g_scratch_what[S_N] = {"FP4 x (Fprop)", "FP4 dY (Dgrad)", "FP4 dY^T (Wgrad)", "FP4 x^T (Wgrad)",
                                          "FP4 packed column staging"};

static QOp scratch_op(int role, int fp8, int blk128, int rows, int K) {
  return qop_at((uint8_t *)cuda_scratch(&g_scratch[role], qop_bytes(fp8, blk128, rows, K), g_scratch_what[role]), fp8,
                blk128, rows, K);
}

// Device scalars of the NVFP4 path: tensor amaxes and the GEMM alpha (read by later kernels on the
// same stream only, so they are reused call after call).
enum { D_AMAX_X, D_AMAX_DY, D_AMAX_DY_COL, D_AMAX_X_COL, D_ALPHA, D_N };
static float *g_dev;
static float *dev_scalar(int i) {
  if (!g_dev) g_dev = (float *)cuda_malloc_tracked(D_N * 16 * sizeof(float), "FP4 linear device scalars");
  return g_dev + 16 * i;  // 64 bytes apart
}

// ---- profiling helpers --------------------------------------------------------------------------

static const char *fmt_tag(void) { return g_recipe.format == FMT_NVFP4 ? "nv" : "mx"; }

static void book_mem(int mk, const char *what, const char *kind, double bytes) {
  char name[40];
  snprintf(name, sizeof name, "%s %s%s%s", fmt_tag(), what, kind ? " " : "", kind ? kind : "");
  cuda_prof_end(mk, name, PROF_MEM, bytes, 0, NULL);
}

// Bytes a quantized copy of rows x K elements occupies (what a producer writes).
static double qbytes(int fp8, int rows, int K) {
  if (fp8) return (double)rows * K + 4.0 * rows * K / 128;
  return (double)rows * K / 2 + (double)rows * K / (g_recipe.format == FMT_NVFP4 ? 16 : 32);
}

// ---- the GEMM -----------------------------------------------------------------------------------

// out[M,N] = alpha (* *alpha_dev) A . B^T + beta out, on the recipe's back end. use: "fwd", "dgrad",
// "wgrad" for the profile entry's name.
static void fp4_gemm(const char *use, LinearKind kind, void *out, int out_fp32, const QOp &A, const QOp &B, int M,
                     int N, int K, float alpha, float beta, const float *alpha_dev) {
  char name[40];
  int mk = cuda_prof_begin();
  GemmShape s = {out_fp32, 0, 1, M, N, K, GEMM_ENGINE_BF16};
  const char *engine;
  if (A.fp8) {
    Fp8Operand a = {A.q, A.sf, A.blk128}, b = {B.q, B.sf, B.blk128};
    fp4_gemm_fp8(out, out_fp32, a, b, M, N, K, alpha, beta);
    engine = "fp8", s.engine = B.blk128 ? GEMM_ENGINE_FP8_BLK : A.blk128 ? GEMM_ENGINE_FP8_ABLK : GEMM_ENGINE_FP8_VEC;
  } else {
    Fp4Operand a = {A.q, A.sb}, b = {B.q, B.sb};
    if (g_recipe.gemm == GEMM_FP4_NATIVE) {
      fp4_gemm_native(out, out_fp32, g_recipe.format, a, b, M, N, K, alpha, beta, alpha_dev);
      engine = "fp4", s.engine = GEMM_ENGINE_NONE;
    } else {
      fp4_gemm_reference_packed(out, out_fp32, g_recipe.format, a, b, M, N, K, alpha, beta, alpha_dev);
      engine = "ref";  // dequantize + BF16 GEMM: the BF16 ceiling
    }
  }
  if (mk < 0) return;
  snprintf(name, sizeof name, "%s gemm %s %s", engine, use, linear_kind_name(kind));
  double in_bytes = A.fp8 ? (double)(M + N) * K : (double)(M + N) * K / 2;
  double out_bytes = (out_fp32 ? 4.0 : 2.0) * M * N * (beta != 0 ? 2 : 1);
  cuda_prof_end(mk, name, PROF_GEMM, in_bytes + out_bytes, 2.0 * M * N * K, &s);
}

// ---- the weight cache ---------------------------------------------------------------------------

typedef struct {
  const float *w;     // the key: the fp32 master pointer the graph passes
  int in, out_dim;
  uint8_t *mem;       // one allocation: W, W^T, and (NVFP4) the amax
  QOp wq, wtq;        // W [out, in] for Fprop, W^T [in, out] for Dgrad
  float *amax;        // NVFP4 tensor amax of W (device)
  uint64_t version;   // weights version of the quantization (0: never)
} QWeight;

static QWeight *g_wc;
static int g_nwc, g_capwc;
static long g_wquant;

static void free_saved(void);

void linear_fp4_release_weights(void) {
  if (g_nwc) CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // queued GEMMs may still read them
  for (int i = 0; i < g_nwc; i++) cuda_free_tracked(g_wc[i].mem);
  g_nwc = 0;
  free_saved();  // the saved inputs belong to the model too
}

long linear_fp4_weight_quantizations(void) { return g_wquant; }

static void quantize_weight(QWeight *e, const bf16 *w16) {
  const int O = e->out_dim, I = e->in, fp8 = fp8_path();
  int mk = cuda_prof_begin();
  if (g_recipe.format == FMT_MXFP4) {
    if (g_recipe.weight_2d) {  // 32x32 tiles, the 0.87 rule; W and W^T with the same codes
      mx_quantize_weight_bf16_cuda(w16, O, I, mx_mode(), 1, mx_out(e->wq), mx_out(e->wtq));
    } else {  // 1x32 along in (row copy) and, for W^T, along out (column copy)
      PhiloxStream none = {};
      mx_quantize_dual_cuda(w16, O, I, mx_mode(), MX_RNE, none, mx_out(e->wq), 0, mx_out(e->wtq));
    }
  } else {
    nvfp4_amax_cuda(e->amax, w16, (size_t)O * I);
    if (g_recipe.weight_2d) {  // 16x16 tiles
      nvfp4_quantize_weight_bf16_cuda(w16, O, I, e->amax, e->wq.q, e->wq.sb, e->wtq.q, e->wtq.sb);
    } else {
      PhiloxStream none = {};
      nvfp4_quantize_rows_cuda(w16, O, I, e->amax, NV_RNE, none, e->wq.q, e->wq.sb);
      nvfp4_quantize_cols_cuda(w16, O, I, 0, e->amax, NV_RNE, none, e->wtq.q, e->wtq.sb);
    }
  }
  g_wquant++;
  book_mem(mk, "quant w", NULL, 2.0 * O * I + 2 * qbytes(fp8, O, I) + (g_recipe.format == FMT_NVFP4 ? 2.0 * O * I : 0));
}

// The quantized W and W^T of weight w, requantized when older than wversion.
static const QWeight *weight_of(LinearId id, const float *w, const bf16 *w16, uint64_t wversion, int in, int out_dim) {
  QWeight *e = NULL;
  for (int i = 0; i < g_nwc && !e; i++)
    if (g_wc[i].w == w) e = &g_wc[i];
  if (e && (e->in != in || e->out_dim != out_dim))
    die("linear_fp4: layer %d %s: weight %p used as [out=%d, in=%d], but was [out=%d, in=%d] before", id.layer,
        linear_kind_name(id.kind), (const void *)w, out_dim, in, e->out_dim, e->in);
  if (!e) {  // first use of this weight: allocate its copies
    g_wc = (QWeight *)grow_array(g_wc, g_nwc, &g_capwc, sizeof *g_wc);
    const int fp8 = fp8_path(), blk = fp8 && g_recipe.weight_2d;  // 1D weights come out VEC128
    size_t bw = qop_bytes(fp8, blk, out_dim, in), bwt = qop_bytes(fp8, blk, in, out_dim);
    uint8_t *mem = (uint8_t *)cuda_malloc_tracked(bw + bwt + 256, "a quantized FP4 weight (W and W^T)");
    e = &g_wc[g_nwc++];
    memset(e, 0, sizeof *e);
    e->w = w, e->in = in, e->out_dim = out_dim, e->mem = mem;
    e->wq = qop_at(mem, fp8, blk, out_dim, in);
    e->wtq = qop_at(mem + bw, fp8, blk, in, out_dim);
    e->amax = (float *)(mem + bw + bwt);
  }
  if (e->version != wversion) {
    quantize_weight(e, w16);
    e->version = wversion;
  }
  return e;
}

// ---- activations and gradients ------------------------------------------------------------------

static void check_shape(LinearId id, int N, int in, int out_dim) {
  if (N <= 0 || in <= 0 || out_dim <= 0 || N % 32 || in % 32 || out_dim % 32)
    die("linear_fp4: layer %d %s runs in %s: N=%d tokens, in=%d, out=%d must be positive multiples of 32 (FP4 blocks "
        "along every GEMM's K)", id.layer, linear_kind_name(id.kind), g_recipe.format == FMT_NVFP4 ? "nvfp4" : "mxfp4",
        N, in, out_dim);
}

// MXFP4 column copy of x [rows, K] into dst ([K, rows]) through mx_quantize_cols_cuda, then the FP8
// embedding when dst is FP8.
static void mx_cols_generic(const bf16 *x, int rows, int K, int hadamard, int sr, PhiloxStream s, const QOp &dst) {
  QOp packed = dst.fp8 ? scratch_op(S_PACKED_TMP, 0, 0, K, rows) : dst;
  mx_quantize_cols_cuda(x, rows, K, mx_mode(), hadamard, sr ? MX_SR : MX_RNE, s, packed.q, packed.sb);
  if (dst.fp8 && dst.blk128) mx_embed_blk128_cuda(packed.q, packed.sb, K, rows, 1.0f, dst.q, dst.sf);
  else if (dst.fp8) mx_embed_vec128_cuda(packed.q, packed.sb, K, rows, 1.0f, dst.q, dst.sf);
}

// Column copy (Wgrad operand) of x [rows, K] -> dst [K, rows], MXFP4 or NVFP4, with the recipe's
// Hadamard; sr for dY when sr_wgrad. amax_slot: NVFP4's tensor amax (of the rotated values).
static void quantize_cols(const bf16 *x, int rows, int K, int sr, PhiloxStream s, const QOp &dst, float *amax) {
  const int had = g_recipe.hadamard;
  if (g_recipe.format == FMT_MXFP4) {
    if ((had == 0 || had == 32) && !sr)
      mx_quantize_dual_cuda(x, rows, K, mx_mode(), MX_RNE, s, mx_out(QOp{}), had == 32, col_out(dst, rows, K));
    else
      mx_cols_generic(x, rows, K, had, sr, s, dst);
  } else {
    if (had) nvfp4_amax_hadamard_cuda(amax, x, rows, K);
    else nvfp4_amax_cuda(amax, x, (size_t)rows * K);
    nvfp4_quantize_cols_cuda(x, rows, K, had != 0, amax, sr ? NV_SR : NV_RNE, s, dst.q, dst.sb);
  }
}

// ---- one quantization of x for the linears that share it -------------------------------------------

// The graph runs k and v right after q on the same x (rmsnorm(res)), and up right after gate; their
// backwards' Wgrad copies of x come in the same order. A quantization of x is a pure function of x
// (round to nearest, no random bits), so each of these followers reuses what its leader wrote into
// the scratch instead of quantizing x again. The last quantization is remembered per use (forward
// row copy, Wgrad column copy) and matched on the follower's leader, layer, pointer and shape.
typedef struct {
  const void *x;
  int N, in, layer;
  LinearKind kind;  // the kind of the linear that last quantized x (or reused it)
  int fused;        // made by a fused producer for `kind` itself (linear_fp4_fused_*): nothing to quantize
} XQuant;
enum { XQ_ROW, XQ_COL, XQ_N };
static XQuant g_xq[XQ_N];
static int g_share_x = 1;

void linear_fp4_set_share_x(int on) { g_share_x = on != 0; }

static int shares_x_with(LinearKind follower, LinearKind prev) {
  return ((follower == LIN_K || follower == LIN_V) && (prev == LIN_Q || prev == LIN_K)) ||
         (follower == LIN_UP && prev == LIN_GATE);
}

// 1 when the scratch of this use still holds x's quantization for this follower; records the call.
static int reuse_x(int use, LinearId id, const bf16 *x, int N, int in) {
  XQuant *r = &g_xq[use];
  int hit = g_share_x && r->x == x && r->N == N && r->in == in && r->layer == id.layer && shares_x_with(id.kind, r->kind);
  *r = (XQuant){x, N, in, id.layer, id.kind, 0};
  return hit;
}

// ---- x's Wgrad copies kept from the forward (saved tensors kept quantized) -------------------------

// With saving on (linear_fp4_set_save_inputs), the forward of the linear that leads a group sharing
// x (q for q/k/v, gate for gate/up, and down) also writes x's Wgrad column copy, into a buffer of its
// own per (layer, group) that lives until the backward: the MXFP4 dual producer makes the Fprop row
// copy and this copy from one read of x. The backward's Wgrad then reads it instead of requantizing
// the saved BF16 x, so the model need not keep that BF16 x at all (model/llama.h). The copy is RNE,
// a pure function of x, so the bits are those the backward would have made.
typedef struct {
  int layer, N, in, fp8, blk;
  LinearKind group;
  uint8_t *mem;
  QOp col;      // x^T [in, N], the Wgrad operand
  float *amax;  // NVFP4: the tensor amax of the rotated x (device)
  int valid;    // written by the forward of the current micro-batch
} SavedX;
static SavedX *g_saved;
static int g_nsaved, g_capsaved;
static int g_save_inputs;
static size_t g_saved_bytes;

static LinearKind group_of(LinearKind k) {
  return k == LIN_K || k == LIN_V ? LIN_Q : k == LIN_UP ? LIN_GATE : k;
}

// The linears whose forward keeps x's copy: the leaders of the groups whose BF16 x the model can
// drop. o's input (the attention output) stays in BF16 for the attention backward anyway, so
// keeping a copy for o would only add memory.
static int keeps_x(LinearKind k) { return k == LIN_Q || k == LIN_GATE || k == LIN_DOWN; }

static void forget_saved(void) {
  for (int i = 0; i < g_nsaved; i++) g_saved[i].valid = 0;
}

static void free_saved(void) {
  if (g_nsaved) CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  for (int i = 0; i < g_nsaved; i++) cuda_free_tracked(g_saved[i].mem);
  g_nsaved = 0, g_saved_bytes = 0;
}

// The saved copy of (layer, group of kind) for an x of [N, in]: found, or made when create.
static SavedX *saved_slot(LinearId id, int N, int in, int create) {
  const LinearKind g = group_of(id.kind);
  const int fp8 = fp8_path(), blk = x_col_blk();
  for (int i = 0; i < g_nsaved; i++) {
    SavedX *e = &g_saved[i];
    if (e->layer != id.layer || e->group != g) continue;
    if (e->N == N && e->in == in && e->fp8 == fp8 && e->blk == blk) return e;
    if (!create) return NULL;
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // another shape: reallocate
    g_saved_bytes -= qop_bytes(e->fp8, e->blk, e->in, e->N) + 256;
    cuda_free_tracked(e->mem);
    *e = g_saved[--g_nsaved];
    break;
  }
  if (!create) return NULL;
  g_saved = (SavedX *)grow_array(g_saved, g_nsaved, &g_capsaved, sizeof *g_saved);
  SavedX *e = &g_saved[g_nsaved++];
  size_t bytes = qop_bytes(fp8, blk, in, N) + 256;
  memset(e, 0, sizeof *e);
  e->layer = id.layer, e->group = g, e->N = N, e->in = in, e->fp8 = fp8, e->blk = blk;
  e->mem = (uint8_t *)cuda_malloc_tracked(bytes, "a saved FP4 copy of a linear's input (Wgrad operand)");
  e->col = qop_at(e->mem, fp8, blk, in, N);
  e->amax = (float *)(e->mem + bytes - 256);
  g_saved_bytes += bytes;
  return e;
}

void linear_fp4_set_save_inputs(int on) {
  if (!on) free_saved();
  g_save_inputs = on != 0;
}

int linear_fp4_saves_input(LinearId id) {
  // A block outside the recipe's depth: the recipe was set for another model (it is set again for
  // this one later), so this model keeps its BF16 inputs.
  if (!g_save_inputs || id.kind == LIN_O || id.kind == LIN_HEAD || id.layer < 0 || id.layer >= g_nlayers) return 0;
  return linear_fp4_active(id);
}

size_t linear_fp4_saved_bytes(void) { return g_saved_bytes; }

static void forget_x(void) {
  memset(g_xq, 0, sizeof g_xq);
  forget_saved();
}

// ---- format-aware fusion (model/cuda/quant_fused.h) ------------------------------------------------------

static int g_fusion = 1;
static long g_fused_calls;
void linear_fp4_set_fusion(int on) { g_fusion = on != 0; }
long linear_fp4_fused_calls(void) { return g_fused_calls; }

int linear_fp4_fusable(LinearId leader) {
  const int had = g_recipe.hadamard;
  return g_fusion && g_share_x && g_recipe.format == FMT_MXFP4 && (had == 0 || had == 32) && keeps_x(leader.kind) &&
         linear_fp4_saves_input(leader);
}

// Where the fused producer writes: leader's Fprop copy (the x scratch its forward and followers read)
// and its saved Wgrad copy; then records x as quantized for leader itself.
static void fused_outputs(LinearId leader, int N, int in, QOp *xq, SavedX **sv) {
  if (N <= 0 || in <= 0 || N % 32 || in % 32)
    die("linear_fp4: layer %d %s: fused input of N=%d x in=%d: need positive multiples of 32", leader.layer,
        linear_kind_name(leader.kind), N, in);
  *xq = scratch_op(S_X_ROW, fp8_path(), 0, N, in);
  *sv = saved_slot(leader, N, in, 1);
}
static void fused_done(LinearId leader, const void *x_token, int N, int in, SavedX *sv) {
  sv->valid = 1, g_fused_calls++;
  g_xq[XQ_ROW] = (XQuant){x_token, N, in, leader.layer, leader.kind, 1};
}

int linear_fp4_fused_rmsnorm(LinearId leader, const void *x_token, const bf16 *res, const float *rstd, const float *w,
                             int N, int D) {
  if (!linear_fp4_fusable(leader)) return 0;
  QOp xq;
  SavedX *sv;
  fused_outputs(leader, N, D, &xq, &sv);
  int mk = cuda_prof_begin();
  mx_quantize_dual_rmsnorm_cuda(res, rstd, w, N, D, mx_mode(), mx_out(xq), g_recipe.hadamard == 32, col_out(sv->col, N, D));
  book_mem(mk, "quant x fwd+wgrad", "(rmsnorm fused)", 2.0 * N * D + 4.0 * N + 4.0 * D + 2 * qbytes(fp8_path(), N, D));
  fused_done(leader, x_token, N, D, sv);
  return 1;
}

int linear_fp4_fused_swiglu(LinearId leader, const void *x_token, const bf16 *gate, const bf16 *up, int N, int F) {
  if (!linear_fp4_fusable(leader)) return 0;
  QOp xq;
  SavedX *sv;
  fused_outputs(leader, N, F, &xq, &sv);
  int mk = cuda_prof_begin();
  mx_quantize_dual_swiglu_cuda(gate, up, N, F, mx_mode(), mx_out(xq), g_recipe.hadamard == 32, col_out(sv->col, N, F));
  book_mem(mk, "quant x fwd+wgrad", "(swiglu fused)", 4.0 * N * F + 2 * qbytes(fp8_path(), N, F));
  fused_done(leader, x_token, N, F, sv);
  return 1;
}

// ---- the linear entries -------------------------------------------------------------------------

void linear_fp4_forward(LinearId id, bf16 *out, const bf16 *x, const float *w, const bf16 *w16, uint64_t wversion,
                        int N, int in, int out_dim) {
  check_shape(id, N, in, out_dim);
  const QWeight *qw = weight_of(id, w, w16, wversion, in, out_dim);
  const int fp8 = fp8_path();
  QOp xq = scratch_op(S_X_ROW, fp8, 0, N, in);
  const XQuant *f = &g_xq[XQ_ROW];  // a fused producer made x's copies for this very linear
  const int fused = f->fused && f->x == x && f->N == N && f->in == in && f->layer == id.layer && f->kind == id.kind;
  const int shared = reuse_x(XQ_ROW, id, x, N, in) || fused;
  // The group leader keeps x's Wgrad copy for the backward (saved quantized, see SavedX).
  SavedX *sv = g_save_inputs && keeps_x(id.kind) ? saved_slot(id, N, in, 1) : NULL;
  int mk = cuda_prof_begin();
  if (g_recipe.format == FMT_MXFP4) {
    PhiloxStream none = {};
    const int had = g_recipe.hadamard;
    if (fused) {  // both copies made (linear_fp4_fused_*)
    } else if (sv && !shared && (had == 0 || had == 32)) {  // one read of x: Fprop rows and Wgrad columns
      mx_quantize_dual_cuda(x, N, in, mx_mode(), MX_RNE, none, mx_out(xq), had == 32, col_out(sv->col, N, in));
      book_mem(mk, "quant x fwd+wgrad", NULL, 2.0 * N * in + 2 * qbytes(fp8, N, in));
    } else {
      if (!shared) mx_quantize_rows_cuda(x, N, in, mx_mode(), MX_RNE, none, mx_out(xq));
      if (sv) quantize_cols(x, N, in, 0, stream_for(id, USE_X_COL), sv->col, NULL);
      if (!shared || sv) book_mem(mk, sv ? "quant x fwd+wgrad" : "quant x fwd", NULL, 2.0 * N * in * (!shared + (sv != 0)) +
                                  qbytes(fp8, N, in) * (!shared + (sv != 0)));
    }
    if (sv) sv->valid = 1;
    float u = mx_unit(mx_mode());
    fp4_gemm("fwd", id.kind, out, 0, xq, qw->wq, N, out_dim, in, u * u, 0.0f, NULL);
  } else {
    PhiloxStream none = {};
    if (!shared) {  // (the leader's amax stays in D_AMAX_X too)
      nvfp4_amax_cuda(dev_scalar(D_AMAX_X), x, (size_t)N * in);
      nvfp4_quantize_rows_cuda(x, N, in, dev_scalar(D_AMAX_X), NV_RNE, none, xq.q, xq.sb);
    }
    if (sv) quantize_cols(x, N, in, 0, stream_for(id, USE_X_COL), sv->col, sv->amax), sv->valid = 1;
    nvfp4_gemm_alpha_cuda(dev_scalar(D_ALPHA), dev_scalar(D_AMAX_X), qw->amax);
    if (!shared || sv) book_mem(mk, sv ? "quant x fwd+wgrad" : "quant x fwd", NULL, 4.0 * N * in * (!shared + (sv != 0)) +
                                qbytes(0, N, in) * (!shared + (sv != 0)));
    fp4_gemm("fwd", id.kind, out, 0, xq, qw->wq, N, out_dim, in, 1.0f, 0.0f, dev_scalar(D_ALPHA));
  }
}

void linear_fp4_backward(LinearId id, bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const float *w,
                         const bf16 *w16, uint64_t wversion, int N, int in, int out_dim, int dx_accumulate,
                         int dw_overwrite) {
  if (!dx && !dw) return;
  check_shape(id, N, in, out_dim);
  const int fp8 = fp8_path(), nv = g_recipe.format == FMT_NVFP4, had = g_recipe.hadamard;
  const QWeight *qw = dx ? weight_of(id, w, w16, wversion, in, out_dim) : NULL;
  QOp dyr = {}, dyc = {}, xc = {};
  if (dx) dyr = scratch_op(S_DY_ROW, fp8, 0, N, out_dim);
  if (dw) dyc = scratch_op(S_DY_COL, fp8, dy_col_blk(), out_dim, N);
  const PhiloxStream s_row = stream_for(id, USE_DY_ROW), s_col = stream_for(id, USE_DY_COL);
  const int sr_row = g_recipe.sr_dgrad, sr_col = g_recipe.sr_wgrad;

  // dY: the Dgrad row copy and the Wgrad column copy
  int mk = cuda_prof_begin();
  if (!nv) {
    int fused = (had == 0 || had == 32) && !sr_col;  // the dual producer's column copy is RNE, H32 or none
    if (dx && dw && fused) {
      mx_quantize_dual_cuda(dout, N, out_dim, mx_mode(), sr_row ? MX_SR : MX_RNE, s_row, mx_out(dyr), had == 32,
                            col_out(dyc, N, out_dim));
      book_mem(mk, "quant dy dual", NULL, 2.0 * N * out_dim + 2 * qbytes(fp8, N, out_dim));
    } else {
      if (dx) mx_quantize_rows_cuda(dout, N, out_dim, mx_mode(), sr_row ? MX_SR : MX_RNE, s_row, mx_out(dyr));
      if (dw) quantize_cols(dout, N, out_dim, sr_col, s_col, dyc, NULL);
      book_mem(mk, "quant dy", NULL, 2.0 * N * out_dim * ((dx != 0) + (dw != 0)) + qbytes(fp8, N, out_dim) *
               ((dx != 0) + (dw != 0)));
    }
  } else {
    if (dx) {
      nvfp4_amax_cuda(dev_scalar(D_AMAX_DY), dout, (size_t)N * out_dim);
      nvfp4_quantize_rows_cuda(dout, N, out_dim, dev_scalar(D_AMAX_DY), sr_row ? NV_SR : NV_RNE, s_row, dyr.q, dyr.sb);
    }
    if (dw) quantize_cols(dout, N, out_dim, sr_col, s_col, dyc, dev_scalar(D_AMAX_DY_COL));
    book_mem(mk, "quant dy", NULL, 4.0 * N * out_dim * ((dx != 0) + (dw != 0)) + qbytes(0, N, out_dim) *
             ((dx != 0) + (dw != 0)));
  }

  // Dgrad: dX (+)= dY W = dY (W^T)^T
  if (dx) {
    const float *alpha_dev = NULL;
    float alpha = 1.0f;
    if (nv) {
      nvfp4_gemm_alpha_cuda(dev_scalar(D_ALPHA), dev_scalar(D_AMAX_DY), qw->amax);
      alpha_dev = dev_scalar(D_ALPHA);
    } else {
      alpha = mx_unit(mx_mode()) * mx_unit(mx_mode());
    }
    fp4_gemm("dgrad", id.kind, dx, 0, dyr, qw->wtq, N, in, out_dim, alpha, dx_accumulate ? 1.0f : 0.0f, alpha_dev);
  }

  // Wgrad: dW (+)= (R dY)^T (R x), with x's column copy saved by the forward, else recomputed from
  // the saved BF16 x
  if (dw) {
    SavedX *sv = g_save_inputs ? saved_slot(id, N, in, 0) : NULL;
    const float *amax_xc = dev_scalar(D_AMAX_X_COL);
    if (sv && sv->valid) {
      xc = sv->col, amax_xc = sv->amax;
    } else {
      if (!x)
        die("linear_fp4: layer %d %s: no saved FP4 copy of x from this micro-batch's forward and no BF16 x for "
            "the Wgrad", id.layer, linear_kind_name(id.kind));
      xc = scratch_op(S_X_COL, fp8, x_col_blk(), in, N);  // only here: with saved copies it is never allocated
      if (!reuse_x(XQ_COL, id, x, N, in)) {
        mk = cuda_prof_begin();
        quantize_cols(x, N, in, 0, stream_for(id, USE_X_COL), xc, dev_scalar(D_AMAX_X_COL));
        book_mem(mk, "quant x wgrad", NULL, (nv ? 4.0 : 2.0) * N * in + qbytes(fp8, in, N));
      }
    }
    const float *alpha_dev = NULL;
    float alpha = 1.0f;
    if (nv) {
      nvfp4_gemm_alpha_cuda(dev_scalar(D_ALPHA), dev_scalar(D_AMAX_DY_COL), amax_xc);
      alpha_dev = dev_scalar(D_ALPHA);
    } else {
      alpha = mx_unit(mx_mode()) * mx_unit(mx_mode());
    }
    fp4_gemm("wgrad", id.kind, dw, 1, dyc, xc, out_dim, in, N, alpha, dw_overwrite ? 0.0f : 1.0f, alpha_dev);
  }
}
