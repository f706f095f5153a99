// model/cuda/linear_fp4.cu: the FP4 linear layer (see linear_fp4.h): recipe state, quantized operand
// buffers, the per-weight cache of quantized W / W^T, the sharing and saving of x's copies, and the
// three GEMMs of a linear. What differs between formats is the LinearFormat the recipe chose
// (linear_mxfp4.cu, linear_nvfp4.cu); the quantizers and GEMMs are the fp4/ library's.
#include <string.h>

#include "common/common.h"
#include "fp4/fp8_embed.h"
#include "fp4/gemm_fp4.h"
#include "fp4/mxfp4.h"
#include "model/cuda/linear_fp4.h"
#include "model/cuda/ops_cuda.h"

// ---- recipe state -------------------------------------------------------------------------------

enum { USE_DY_ROW = 0, USE_DY_COL = 1, USE_X_COL = 2 };  // the tensor id's low bits (linear_fp4.h)
static void forget_x(LinearFp4 *L);                      // below: the remembered quantizations of x are stale
static void free_saved(LinearFp4 *L);

LinearFp4 *linear_fp4_create(CudaBackend *b) {
  LinearFp4 *L = (LinearFp4 *)xcalloc(1, sizeof *L);
  L->b = b;
  L->recipe.format = FMT_BF16;
  L->share_x = 1, L->fusion = 1;
  return L;
}

static PhiloxStream stream_for(const LinearFp4 *L, LinearId id, int use) {
  return philox_stream(L->seed, L->step, L->micro, (uint32_t)id.layer, (uint32_t)(4 * id.kind + use));
}

int linear_fp8_path(const LinearFp4 *L) { return L->f && L->f->fp8_embed && L->recipe.gemm == GEMM_FP8_EMBED; }
// Whether the Wgrad column copy of dY (or of x) is embedded per 128x128 tile (Recipe.wgrad_2d).
static int dy_col_blk(const LinearFp4 *L) { return linear_fp8_path(L) && L->recipe.wgrad_2d == WGRAD_2D_DY; }
static int x_col_blk(const LinearFp4 *L) { return linear_fp8_path(L) && L->recipe.wgrad_2d == WGRAD_2D_X; }

int linear_fp4_active(const LinearFp4 *L, LinearId id) {
  if (!L->f || id.kind == LIN_HEAD || id.layer < 0) return 0;
  if (id.layer >= L->nlayers)
    die("linear_fp4: layer %d (%s) is outside the %d blocks the recipe was set for (cuda_set_recipe)", id.layer,
        linear_kind_name(id.kind), L->nlayers);
  return recipe_block_format(&L->recipe, id.layer, L->nlayers) != FMT_BF16;
}

void linear_fp4_set_step(LinearFp4 *L, int64_t step, int micro) {
  if (step < 0 || step > (int64_t)UINT32_MAX || micro < 0)
    die("set_step(step=%lld, micro=%d): step must be in [0, 2^32) and micro >= 0 (the Philox counter words)",
        (long long)step, micro);
  L->step = (uint32_t)step, L->micro = (uint32_t)micro;
  forget_x(L);  // a new micro-batch: new x, whatever the pointers
}

void linear_fp4_set_recipe(LinearFp4 *L, const Recipe *r, int n_layers, uint64_t seed) {
  Recipe bf16 = {};
  bf16.format = FMT_BF16;
  if (!r) r = &bf16;
  const LinearFormat *f = NULL;
  if (n_layers > 0 && (!recipe_uniform(r, n_layers) || recipe_uses(r, n_layers, FMT_NVFP4_CTA) || r->hadamard_plain))
    die("cuda_set_recipe: this route (precision.blocks, precision.fprop/dgrad/wgrad, recipe nvfp4_cta or hadamard "
        "h16_plain) runs on the CPU backend only so far: the CUDA backend runs one MXFP4 or NVFP4 format in every FP4 "
        "block and contraction; use parallel.backend: cpu");
  if (r->format != FMT_BF16) {
    if (n_layers <= 0) die("cuda_set_recipe: n_layers = %d must be positive", n_layers);
    char err[256];
    if (recipe_check(r, err, sizeof err)) die("cuda_set_recipe: %s", err);  // fp4/recipe.c: the one validation
    if (r->gemm == GEMM_FP4_NATIVE && !fp4_gemm_native_available())
      die("cuda_set_recipe: precision.fp4_gemm fp4 needs a compute capability 10.x GPU with the sm_100a code built "
          "in; use fp8 (MXFP4 on Hopper) or reference");
    if (r->fp8_kernel == FP8_KERNEL_OWN && !fp4_gemm_wgmma_available())
      die("cuda_set_recipe: precision.fp4_gemm fp8_own needs a compute capability 9.0 GPU (Hopper); use fp8");
    f = r->format == FMT_MXFP4 ? &linear_mxfp4 : &linear_nvfp4;  // the one place a format is chosen
  }
  linear_fp4_release_weights(L);  // quantized under the previous recipe
  L->recipe = *r, L->f = f, L->nlayers = n_layers, L->seed = seed;
  forget_x(L);
}

// ---- quantized operands -------------------------------------------------------------------------

static size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }

static size_t qop_bytes(const LinearFp4 *L, int fp8, int blk128, int rows, int K) {
  if (fp8) {
    size_t ns = blk128 ? mx_blk128_scale_count(rows, K) : mx_vec128_scale_count(rows, K);
    return round256((size_t)rows * K) + round256(ns * sizeof(float));
  }
  return round256((size_t)rows * K / 2) + round256((size_t)rows * (K / L->f->block));
}

static QOp qop_at(uint8_t *base, int fp8, int blk128, int rows, int K) {
  QOp o = {};
  o.fp8 = fp8, o.blk128 = blk128, o.q = base;
  uint8_t *tail = base + round256(fp8 ? (size_t)rows * K : (size_t)rows * K / 2);
  if (fp8) o.sf = (float *)tail;
  else o.sb = tail;
  return o;
}

MxOut linear_mx_out(const QOp &o) {
  MxOut m = {};
  m.q = o.q, m.e8m0 = o.sb, m.scale = o.sf, m.fp8 = o.fp8, m.scale_mul = 1.0f;  // exact powers of two
  m.blk128 = o.fp8 && o.blk128;
  return m;
}

// A column copy o of a rows x K source ([K, rows]) for the dual producer; a tiled one is counted
// (linear_fp4_tile_stats).
MxOut linear_col_out(LinearFp4 *L, const QOp &o, int rows, int K) {
  MxOut m = linear_mx_out(o);
  if (m.blk128) {
    if (!L->rounded) {
      L->rounded = (unsigned long long *)cuda_malloc_tracked(L->b, 256, "FP8 tile embedding counter");
      CUDA_CHECK(cudaMemsetAsync(L->rounded, 0, 8, cuda_stream()));
    }
    m.rounded = L->rounded, L->tile_blocks += (unsigned long long)(rows / 32) * K;
  }
  return m;
}

void linear_fp4_tile_stats(const LinearFp4 *L, unsigned long long *rounded, unsigned long long *blocks) {
  *rounded = 0, *blocks = L->tile_blocks;
  if (L->rounded) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    CUDA_CHECK(cudaMemcpy(rounded, L->rounded, 8, cudaMemcpyDeviceToHost));
  }
}

// Grow-only scratch per operand role (activations and gradients are requantized every call).
static const char *SCRATCH_WHAT[S_N] = {"FP4 x (Fprop)", "FP4 dY (Dgrad)", "FP4 dY^T (Wgrad)", "FP4 x^T (Wgrad)",
                                        "FP4 packed column staging"};

QOp linear_scratch_op(LinearFp4 *L, int role, int fp8, int blk128, int rows, int K) {
  void *p = cuda_scratch(L->b, &L->scratch[role], qop_bytes(L, fp8, blk128, rows, K), SCRATCH_WHAT[role]);
  return qop_at((uint8_t *)p, fp8, blk128, rows, K);
}

// Device scalars (read by later kernels on the same stream only, so they are reused call after call).
float *linear_dev_scalar(LinearFp4 *L, int i) {
  if (!L->dev) L->dev = (float *)cuda_malloc_tracked(L->b, D_N * 16 * sizeof(float), "FP4 linear device scalars");
  return L->dev + 16 * i;  // 64 bytes apart
}

// ---- profiling helpers --------------------------------------------------------------------------

static void book_mem(LinearFp4 *L, int mk, const char *what, const char *kind, double bytes) {
  char name[40];
  snprintf(name, sizeof name, "%s %s%s%s", L->f->tag, what, kind ? " " : "", kind ? kind : "");
  cuda_prof_end(L->b, mk, name, PROF_MEM, bytes, 0, NULL);
}

// Bytes a quantized copy of rows x K elements occupies (what a producer writes).
static double qbytes(const LinearFp4 *L, int fp8, int rows, int K) {
  if (fp8) return (double)rows * K + 4.0 * rows * K / 128;
  return (double)rows * K / 2 + (double)rows * K / L->f->block;
}

// Bytes `copies` quantized copies of a rows x K BF16 source read and write.
static double quant_bytes(const LinearFp4 *L, int fp8, int rows, int K, int copies) {
  return (2.0 * L->f->reads * rows * K + qbytes(L, fp8, rows, K)) * copies;
}

// ---- the GEMM -----------------------------------------------------------------------------------

// out[M,N] = alpha (* *alpha_dev) A . B^T + beta out, on the recipe's back end. use: "fwd", "dgrad",
// "wgrad" for the profile entry's name.
static void fp4_gemm(LinearFp4 *L, const char *use, LinearKind kind, void *out, int out_fp32, const QOp &A,
                     const QOp &B, int M, int N, int K, float alpha, float beta, const float *alpha_dev) {
  char name[40];
  int mk = cuda_prof_begin(L->b);
  GemmShape s = {out_fp32, 0, 1, M, N, K, GEMM_ENGINE_BF16};
  const char *engine;
  if (A.fp8) {
    Fp8Operand a = {A.q, A.sf, A.blk128}, b = {B.q, B.sf, B.blk128};
    const int own = fp4_gemm_fp8_on(L->recipe.fp8_kernel, out, out_fp32, a, b, M, N, K, alpha, beta);
    engine = own ? "own" : "fp8", s.engine = B.blk128   ? GEMM_ENGINE_FP8_BLK
                                             : A.blk128 ? GEMM_ENGINE_FP8_ABLK
                                                        : GEMM_ENGINE_FP8_VEC;
  } else {
    Fp4Operand a = {A.q, A.sb}, b = {B.q, B.sb};
    if (L->recipe.gemm == GEMM_FP4_NATIVE) {
      fp4_gemm_native(out, out_fp32, L->f->format, a, b, M, N, K, alpha, beta, alpha_dev);
      engine = "fp4", s.engine = GEMM_ENGINE_NONE;
    } else {
      fp4_gemm_reference_packed(out, out_fp32, L->f->format, a, b, M, N, K, alpha, beta, alpha_dev);
      engine = "ref";  // dequantize + BF16 GEMM: the BF16 ceiling
    }
  }
  if (mk < 0) return;
  snprintf(name, sizeof name, "%s gemm %s %s", engine, use, linear_kind_name(kind));
  double in_bytes = A.fp8 ? (double)(M + N) * K : (double)(M + N) * K / 2;
  double out_bytes = (out_fp32 ? 4.0 : 2.0) * M * N * (beta != 0 ? 2 : 1);
  cuda_prof_end(L->b, mk, name, PROF_GEMM, in_bytes + out_bytes, 2.0 * M * N * K, &s);
}

// ---- the weight cache ---------------------------------------------------------------------------

void linear_fp4_release_weights(LinearFp4 *L) {
  if (L->nwc) CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // queued GEMMs may still read them
  for (int i = 0; i < L->nwc; i++) cuda_free_tracked(L->b, L->wc[i].mem);
  L->nwc = 0;
  free_saved(L);  // the saved inputs belong to the model too
}

long linear_fp4_weight_quantizations(const LinearFp4 *L) { return L->wquant; }

// The quantized W and W^T of weight w, requantized when older than wversion.
static const QWeight *weight_of(LinearFp4 *L, LinearId id, const float *w, const bf16 *w16, uint64_t wversion, int in,
                                int out_dim) {
  QWeight *e = NULL;
  for (int i = 0; i < L->nwc && !e; i++)
    if (L->wc[i].w == w) e = &L->wc[i];
  if (e && (e->in != in || e->out_dim != out_dim))
    die("linear_fp4: layer %d %s: weight %p used as [out=%d, in=%d], but was [out=%d, in=%d] before", id.layer,
        linear_kind_name(id.kind), (const void *)w, out_dim, in, e->out_dim, e->in);
  if (!e) {  // first use of this weight: allocate its copies
    L->wc = (QWeight *)grow_array(L->wc, L->nwc, &L->capwc, sizeof *L->wc);
    const int fp8 = linear_fp8_path(L), blk = fp8 && L->recipe.weight_2d;  // 1D weights come out VEC128
    size_t bw = qop_bytes(L, fp8, blk, out_dim, in), bwt = qop_bytes(L, fp8, blk, in, out_dim);
    uint8_t *mem = (uint8_t *)cuda_malloc_tracked(L->b, bw + bwt + 256, "a quantized FP4 weight (W and W^T)");
    e = &L->wc[L->nwc++];
    memset(e, 0, sizeof *e);
    e->w = w, e->in = in, e->out_dim = out_dim, e->mem = mem;
    e->wq = qop_at(mem, fp8, blk, out_dim, in);
    e->wtq = qop_at(mem + bw, fp8, blk, in, out_dim);
    e->amax = (float *)(mem + bw + bwt);
  }
  if (e->version != wversion) {
    const int O = e->out_dim, I = e->in;
    int mk = cuda_prof_begin(L->b);
    L->f->weight(L, e, w16);
    L->wquant++;
    book_mem(L, mk, "quant w", NULL, 2.0 * L->f->reads * O * I + 2 * qbytes(L, linear_fp8_path(L), O, I));
    e->version = wversion;
  }
  return e;
}

static void check_shape(const LinearFp4 *L, LinearId id, int N, int in, int out_dim) {
  if (N <= 0 || in <= 0 || out_dim <= 0 || N % 32 || in % 32 || out_dim % 32)
    die("linear_fp4: layer %d %s runs in %s: N=%d tokens, in=%d, out=%d must be positive multiples of 32 (FP4 blocks "
        "along every GEMM's K)",
        id.layer, linear_kind_name(id.kind), L->f->name, N, in, out_dim);
}

// ---- one quantization of x for the linears that share it -------------------------------------------

// The graph runs k and v right after q on the same x (rmsnorm(res)), and up right after gate; their
// backwards' Wgrad copies of x come in the same order. A quantization of x is a pure function of x
// (round to nearest, no random bits), so each of these followers reuses what its leader wrote into
// the scratch instead of quantizing x again. The last quantization is remembered per use (forward
// row copy, Wgrad column copy) and matched on the follower's leader, layer, pointer and shape.
void linear_fp4_set_share_x(LinearFp4 *L, int on) { L->share_x = on != 0; }

static int shares_x_with(LinearKind follower, LinearKind prev) {
  return ((follower == LIN_K || follower == LIN_V) && (prev == LIN_Q || prev == LIN_K)) ||
         (follower == LIN_UP && prev == LIN_GATE);
}

// 1 when the scratch of this use still holds x's quantization for this follower; records the call.
static int reuse_x(LinearFp4 *L, int use, LinearId id, const bf16 *x, int N, int in) {
  XQuant *r = &L->xq[use];
  int hit =
      L->share_x && r->x == x && r->N == N && r->in == in && r->layer == id.layer && shares_x_with(id.kind, r->kind);
  *r = (XQuant){x, N, in, id.layer, id.kind, 0};
  return hit;
}

// ---- x's Wgrad copies kept from the forward (saved tensors kept quantized) -------------------------

// With saving on (linear_fp4_set_save_inputs), the forward of the linear that leads a group sharing
// x (q for q/k/v, gate for gate/up, and down) also writes x's Wgrad column copy, into a buffer of its
// own per (layer, group) that lives until the backward: the dual producer makes the Fprop row copy
// and this copy from one read of x. The backward's Wgrad then reads it instead of requantizing the
// saved BF16 x, so the model need not keep that BF16 x at all (model/llama.h). The copy is RNE, a
// pure function of x, so the bits are those the backward would have made.
static LinearKind group_of(LinearKind k) { return k == LIN_K || k == LIN_V ? LIN_Q : k == LIN_UP ? LIN_GATE : k; }

// The linears whose forward keeps x's copy: the leaders of the groups whose BF16 x the model can
// drop. o's input (the attention output) stays in BF16 for the attention backward anyway, so
// keeping a copy for o would only add memory.
static int keeps_x(LinearKind k) { return k == LIN_Q || k == LIN_GATE || k == LIN_DOWN; }

static void forget_saved(LinearFp4 *L) {
  for (int i = 0; i < L->nsaved; i++) L->saved[i].valid = 0;
}

static void free_saved(LinearFp4 *L) {
  if (L->nsaved) CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  for (int i = 0; i < L->nsaved; i++) cuda_free_tracked(L->b, L->saved[i].mem);
  L->nsaved = 0, L->saved_bytes = 0;
}

// The saved copy of (layer, group of kind) for an x of [N, in]: found, or made when create.
static SavedX *saved_slot(LinearFp4 *L, LinearId id, int N, int in, int create) {
  const LinearKind g = group_of(id.kind);
  const int fp8 = linear_fp8_path(L), blk = x_col_blk(L);
  for (int i = 0; i < L->nsaved; i++) {
    SavedX *e = &L->saved[i];
    if (e->layer != id.layer || e->group != g) continue;
    if (e->N == N && e->in == in && e->fp8 == fp8 && e->blk == blk) return e;
    if (!create) return NULL;
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // another shape: reallocate
    L->saved_bytes -= qop_bytes(L, e->fp8, e->blk, e->in, e->N) + 256;
    cuda_free_tracked(L->b, e->mem);
    *e = L->saved[--L->nsaved];
    break;
  }
  if (!create) return NULL;
  L->saved = (SavedX *)grow_array(L->saved, L->nsaved, &L->capsaved, sizeof *L->saved);
  SavedX *e = &L->saved[L->nsaved++];
  size_t bytes = qop_bytes(L, fp8, blk, in, N) + 256;
  memset(e, 0, sizeof *e);
  e->layer = id.layer, e->group = g, e->N = N, e->in = in, e->fp8 = fp8, e->blk = blk;
  e->mem = (uint8_t *)cuda_malloc_tracked(L->b, bytes, "a saved FP4 copy of a linear's input (Wgrad operand)");
  e->col = qop_at(e->mem, fp8, blk, in, N);
  e->amax = (float *)(e->mem + bytes - 256);
  L->saved_bytes += bytes;
  return e;
}

void linear_fp4_set_save_inputs(LinearFp4 *L, int on) {
  if (!on) free_saved(L);
  L->save_inputs = on != 0;
}

int linear_fp4_saves_input(const LinearFp4 *L, LinearId id) {
  // A block outside the recipe's depth: the recipe was set for another model (it is set again for
  // this one later), so this model keeps its BF16 inputs.
  if (!L->save_inputs || id.kind == LIN_O || id.kind == LIN_HEAD || id.layer < 0 || id.layer >= L->nlayers) return 0;
  return linear_fp4_active(L, id);
}

size_t linear_fp4_saved_bytes(const LinearFp4 *L) { return L->saved_bytes; }

static void forget_x(LinearFp4 *L) {
  memset(L->xq, 0, sizeof L->xq);
  forget_saved(L);
}

// ---- format-aware fusion (model/cuda/quant_fused.h) ------------------------------------------------

void linear_fp4_set_fusion(LinearFp4 *L, int on) { L->fusion = on != 0; }
long linear_fp4_fused_calls(const LinearFp4 *L) { return L->fused_calls; }

int linear_fp4_fusable(const LinearFp4 *L, LinearId leader) {
  return L->fusion && L->share_x && L->f && L->f->dual_rmsnorm && L->f->has_dual(L, 0) && keeps_x(leader.kind) &&
         linear_fp4_saves_input(L, leader);
}

// Where the fused producer writes: leader's Fprop copy (the x scratch its forward and followers read)
// and its saved Wgrad copy; then records x as quantized for leader itself.
static void fused_outputs(LinearFp4 *L, LinearId leader, int N, int in, QOp *xq, SavedX **sv) {
  if (N <= 0 || in <= 0 || N % 32 || in % 32)
    die("linear_fp4: layer %d %s: fused input of N=%d x in=%d: need positive multiples of 32", leader.layer,
        linear_kind_name(leader.kind), N, in);
  *xq = linear_scratch_op(L, S_X_ROW, linear_fp8_path(L), 0, N, in);
  *sv = saved_slot(L, leader, N, in, 1);
}
static void fused_done(LinearFp4 *L, LinearId leader, const void *x_token, int N, int in, SavedX *sv) {
  sv->valid = 1, L->fused_calls++;
  L->xq[XQ_ROW] = (XQuant){x_token, N, in, leader.layer, leader.kind, 1};
}

int linear_fp4_fused_rmsnorm(LinearFp4 *L, LinearId leader, const void *x_token, const bf16 *res, const float *rstd,
                             const float *w, int N, int D) {
  if (!linear_fp4_fusable(L, leader)) return 0;
  QOp xq;
  SavedX *sv;
  fused_outputs(L, leader, N, D, &xq, &sv);
  int mk = cuda_prof_begin(L->b);
  L->f->dual_rmsnorm(L, res, rstd, w, N, D, xq, sv->col);
  book_mem(L, mk, "quant x fwd+wgrad", "(rmsnorm fused)",
           2.0 * N * D + 4.0 * N + 4.0 * D + 2 * qbytes(L, linear_fp8_path(L), N, D));
  fused_done(L, leader, x_token, N, D, sv);
  return 1;
}

int linear_fp4_fused_swiglu(LinearFp4 *L, LinearId leader, const void *x_token, const bf16 *gate, const bf16 *up, int N,
                            int F) {
  if (!linear_fp4_fusable(L, leader)) return 0;
  QOp xq;
  SavedX *sv;
  fused_outputs(L, leader, N, F, &xq, &sv);
  int mk = cuda_prof_begin(L->b);
  L->f->dual_swiglu(L, gate, up, N, F, xq, sv->col);
  book_mem(L, mk, "quant x fwd+wgrad", "(swiglu fused)", 4.0 * N * F + 2 * qbytes(L, linear_fp8_path(L), N, F));
  fused_done(L, leader, x_token, N, F, sv);
  return 1;
}

// ---- the linear entries -------------------------------------------------------------------------

void linear_fp4_forward(LinearFp4 *L, LinearId id, bf16 *out, const bf16 *x, const float *w, const bf16 *w16,
                        uint64_t wversion, int N, int in, int out_dim) {
  check_shape(L, id, N, in, out_dim);
  const LinearFormat *f = L->f;
  const QWeight *qw = weight_of(L, id, w, w16, wversion, in, out_dim);
  const int fp8 = linear_fp8_path(L);
  QOp xq = linear_scratch_op(L, S_X_ROW, fp8, 0, N, in);
  const XQuant *fq = &L->xq[XQ_ROW];  // a fused producer made x's copies for this very linear
  const int fused =
      fq->fused && fq->x == x && fq->N == N && fq->in == in && fq->layer == id.layer && fq->kind == id.kind;
  const int shared = reuse_x(L, XQ_ROW, id, x, N, in) || fused;
  // The group leader keeps x's Wgrad copy for the backward (saved quantized, see SavedX).
  SavedX *sv = L->save_inputs && keeps_x(id.kind) ? saved_slot(L, id, N, in, 1) : NULL;
  float *amax_x = linear_dev_scalar(L, D_AMAX_X);  // a follower's stays its leader's
  PhiloxStream none = {};
  int mk = cuda_prof_begin(L->b);
  if (fused) {  // both copies made (linear_fp4_fused_*)
  } else if (sv && !shared && f->dual(L, x, N, in, 0, none, &xq, 0, sv->col)) {  // one read: rows and columns
    book_mem(L, mk, "quant x fwd+wgrad", NULL, 2.0 * N * in + 2 * qbytes(L, fp8, N, in));
  } else {
    if (!shared) f->rows(L, x, N, in, 0, none, xq, amax_x);
    if (sv) f->cols(L, x, N, in, 0, stream_for(L, id, USE_X_COL), sv->col, sv->amax);
    const int copies = !shared + (sv != NULL);
    if (copies) book_mem(L, mk, sv ? "quant x fwd+wgrad" : "quant x fwd", NULL, quant_bytes(L, fp8, N, in, copies));
  }
  if (sv) sv->valid = 1;
  const float *alpha_dev = NULL;
  float alpha = f->alpha(L, amax_x, qw->amax, &alpha_dev);
  fp4_gemm(L, "fwd", id.kind, out, 0, xq, qw->wq, N, out_dim, in, alpha, 0.0f, alpha_dev);
}

void linear_fp4_backward(LinearFp4 *L, LinearId id, bf16 *dx, float *dw, const bf16 *dout, const bf16 *x,
                         const float *w, const bf16 *w16, uint64_t wversion, int N, int in, int out_dim,
                         int dx_accumulate, int dw_overwrite) {
  if (!dx && !dw) return;
  check_shape(L, id, N, in, out_dim);
  const LinearFormat *f = L->f;
  const int fp8 = linear_fp8_path(L);
  const QWeight *qw = dx ? weight_of(L, id, w, w16, wversion, in, out_dim) : NULL;
  QOp dyr = {}, dyc = {}, xc = {};
  if (dx) dyr = linear_scratch_op(L, S_DY_ROW, fp8, 0, N, out_dim);
  if (dw) dyc = linear_scratch_op(L, S_DY_COL, fp8, dy_col_blk(L), out_dim, N);
  const PhiloxStream s_row = stream_for(L, id, USE_DY_ROW), s_col = stream_for(L, id, USE_DY_COL);
  const int sr_row = L->recipe.sr_dgrad, sr_col = L->recipe.sr_wgrad;
  float *amax_dy = linear_dev_scalar(L, D_AMAX_DY), *amax_dyc = linear_dev_scalar(L, D_AMAX_DY_COL);

  // dY: the Dgrad row copy and the Wgrad column copy
  int mk = cuda_prof_begin(L->b);
  if (dx && dw && f->dual(L, dout, N, out_dim, sr_row, s_row, &dyr, sr_col, dyc)) {
    book_mem(L, mk, "quant dy dual", NULL, 2.0 * N * out_dim + 2 * qbytes(L, fp8, N, out_dim));
  } else {
    if (dx) f->rows(L, dout, N, out_dim, sr_row, s_row, dyr, amax_dy);
    if (dw) f->cols(L, dout, N, out_dim, sr_col, s_col, dyc, amax_dyc);
    book_mem(L, mk, "quant dy", NULL, quant_bytes(L, fp8, N, out_dim, (dx != NULL) + (dw != NULL)));
  }

  // Dgrad: dX (+)= dY W = dY (W^T)^T
  if (dx) {
    const float *alpha_dev = NULL;
    float alpha = f->alpha(L, amax_dy, qw->amax, &alpha_dev);
    fp4_gemm(L, "dgrad", id.kind, dx, 0, dyr, qw->wtq, N, in, out_dim, alpha, dx_accumulate ? 1.0f : 0.0f, alpha_dev);
  }

  // Wgrad: dW (+)= (R dY)^T (R x), with x's column copy saved by the forward, else recomputed from
  // the saved BF16 x
  if (dw) {
    SavedX *sv = L->save_inputs ? saved_slot(L, id, N, in, 0) : NULL;
    float *amax_xc = linear_dev_scalar(L, D_AMAX_X_COL);
    if (sv && sv->valid) {
      xc = sv->col, amax_xc = sv->amax;
    } else {
      if (!x)
        die("linear_fp4: layer %d %s: no saved FP4 copy of x from this micro-batch's forward and no BF16 x for "
            "the Wgrad",
            id.layer, linear_kind_name(id.kind));
      xc = linear_scratch_op(L, S_X_COL, fp8, x_col_blk(L), in,
                             N);  // only here: with saved copies it is never allocated
      if (!reuse_x(L, XQ_COL, id, x, N, in)) {
        mk = cuda_prof_begin(L->b);
        f->cols(L, x, N, in, 0, stream_for(L, id, USE_X_COL), xc, amax_xc);
        book_mem(L, mk, "quant x wgrad", NULL, 2.0 * f->reads * N * in + qbytes(L, fp8, in, N));
      }
    }
    const float *alpha_dev = NULL;
    float alpha = f->alpha(L, amax_dyc, amax_xc, &alpha_dev);
    fp4_gemm(L, "wgrad", id.kind, dw, 1, dyc, xc, out_dim, in, N, alpha, dw_overwrite ? 0.0f : 1.0f, alpha_dev);
  }
}
