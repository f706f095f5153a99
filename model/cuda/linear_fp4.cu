// model/cuda/linear_fp4.cu: the FP4 linear layer (see linear_fp4.h): recipe state, quantized operand
// buffers, the per-weight cache of quantized W / W^T, the sharing and saving of x's copies, and the
// three GEMMs of a linear. What differs between formats is the LinearFormat each block and
// contraction runs (linear_mxfp4.cu, linear_nvfp4.cu, linear_nvfp4_cta.cu); the quantizers and GEMMs
// are the fp4/ library's.
#include <string.h>

#include "common/common.h"
#include "fp4/fp8_embed.h"
#include "fp4/gemm_cutlass.h"
#include "fp4/gemm_fp4.h"
#include "fp4/mxfp4.h"
#include "fp4/nvfp4_cta.h"
#include "model/cuda/linear_fp4.h"
#include "model/cuda/swiglu_epilogue.h"
#include "model/cuda/ops_cuda.h"

// ---- recipe state -------------------------------------------------------------------------------

enum { USE_DY_ROW = 0, USE_DY_COL = 1, USE_X_COL = 2 };  // the tensor id's low bits (linear_fp4.h)
static void forget_x(LinearFp4 *L);                      // below: the remembered quantizations of x are stale
static void free_saved(LinearFp4 *L);

LinearFp4 *linear_fp4_create(CudaBackend *b) {
  LinearFp4 *L = (LinearFp4 *)xcalloc(1, sizeof *L);
  L->b = b;
  L->recipe.format = FMT_BF16;
  L->share_x = 1;
  return L;
}

static PhiloxStream stream_for(const LinearFp4 *L, LinearId id, int use) {
  return philox_stream(L->seed, L->step, L->micro, (uint32_t)id.layer, (uint32_t)(4 * id.kind + use));
}

int linear_fp8_path(const LinearFp4 *L, const LinearFormat *f) {
  return f && f->fp8_embed && L->recipe.gemm == GEMM_FP8_EMBED;
}
// Whether the Wgrad column copy of dY (or of x) in format f is embedded per 128x128 tile (Recipe.wgrad_2d).
static int dy_col_blk(const LinearFp4 *L, const LinearFormat *f) {
  return linear_fp8_path(L, f) && L->recipe.wgrad_2d == WGRAD_2D_DY;
}
static int x_col_blk(const LinearFp4 *L, const LinearFormat *f) {
  return linear_fp8_path(L, f) && L->recipe.wgrad_2d == WGRAD_2D_X;
}

// The format contraction c of linear id runs in (NULL: BF16).
static const LinearFormat *format_of(const LinearFp4 *L, LinearId id, Contraction c) {
  if (!L->any || id.kind == LIN_HEAD || id.layer < 0) return NULL;
  if (id.layer >= L->nlayers)
    die("linear_fp4: layer %d (%s) is outside the %d blocks the recipe was set for (cuda_set_recipe)", id.layer,
        linear_kind_name(id.kind), L->nlayers);
  return L->fmt[recipe_format(&L->recipe, id.layer, L->nlayers, c)];
}

int linear_fp4_runs(const LinearFp4 *L, LinearId id, Contraction c) { return format_of(L, id, c) != NULL; }

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
  // The one place a format is chosen: the table of the formats the recipe uses, by FP4Format.
  static const LinearFormat *const all[] = {&linear_mxfp4, &linear_nvfp4, &linear_nvfp4_cta};
  const LinearFormat *fmt[FMT_N] = {};
  int any = 0, outer = 0;
  for (size_t k = 0; k < sizeof all / sizeof all[0] && n_layers > 0; k++)
    if (recipe_uses(r, n_layers, all[k]->format)) fmt[all[k]->format] = all[k], any = 1, outer |= all[k]->outer;
  if (any) {
    char err[256];
    if (recipe_check(r, err, sizeof err) || recipe_check_layers(r, n_layers, err, sizeof err))
      die("cuda_set_recipe: %s", err);  // fp4/recipe.c: the one validation
    if (r->gemm == GEMM_FP4_NATIVE && !fp4_gemm_native_available())
      die("cuda_set_recipe: precision.fp4_gemm fp4 needs a compute capability 10.x GPU with the sm_100a code built "
          "in; use fp8 (MXFP4 on Hopper) or reference");
    if (r->gemm == GEMM_FP4_NATIVE && outer)
      die("cuda_set_recipe: precision.fp4_gemm fp4 with CTA-local NVFP4: the native path (FP4 GEMM, then the outer "
          "factors' epilogue) is compiled for sm_100a but has never run on a Blackwell GPU; use reference");
    if (r->fp8_kernel == FP8_KERNEL_CUTLASS && !fp4_gemm_cutlass_available())
      die("cuda_set_recipe: precision.fp4_gemm fp8_cutlass needs a compute capability 9.0 GPU and a build with "
          "CUTLASS (scripts/deps.sh fetches it); use fp8");
  }
  linear_fp4_release_weights(L);  // quantized under the previous recipe
  L->recipe = *r, L->nlayers = n_layers, L->seed = seed, L->any = any;
  memcpy(L->fmt, fmt, sizeof fmt);
  forget_x(L);
}

// ---- quantized operands -------------------------------------------------------------------------

static size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }

// The bytes of a quantized [rows, K] in format f: codes (or E4M3), scales, and outer factors.
static size_t qop_bytes(const LinearFormat *f, int fp8, int blk128, int rows, int K) {
  if (fp8) {
    size_t ns = blk128 ? mx_blk128_scale_count(rows, K) : mx_vec128_scale_count(rows, K);
    return round256((size_t)rows * K) + round256(ns * sizeof(float));
  }
  return round256((size_t)rows * K / 2) + round256((size_t)rows * (K / f->block)) +
         (f->outer ? round256((size_t)cta_stripes(rows) * sizeof(float)) : 0);
}

static QOp qop_at(const LinearFormat *f, uint8_t *base, int fp8, int blk128, int rows, int K) {
  QOp o = {};
  o.fp8 = fp8, o.blk128 = blk128, o.q = base;
  uint8_t *tail = base + round256(fp8 ? (size_t)rows * K : (size_t)rows * K / 2);
  if (fp8) o.sf = (float *)tail;
  else o.sb = tail;
  if (!fp8 && f->outer) o.outer = (float *)(tail + round256((size_t)rows * (K / f->block)));
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
static const char *SCRATCH_WHAT[S_N] = {"FP4 x (Fprop)",
                                        "FP4 dY (Dgrad)",
                                        "FP4 dY^T (Wgrad)",
                                        "FP4 x^T (Wgrad)",
                                        "FP4 packed column staging",
                                        "CTA-local chunk amaxes",
                                        "CTA-local GEMM accumulator",
                                        "FP4 x (Fprop), down's from up's GEMM epilogue"};

QOp linear_scratch_op(LinearFp4 *L, const LinearFormat *f, int role, int fp8, int blk128, int rows, int K) {
  void *p = cuda_scratch(L->b, &L->scratch[role], qop_bytes(f, fp8, blk128, rows, K), SCRATCH_WHAT[role]);
  return qop_at(f, (uint8_t *)p, fp8, blk128, rows, K);
}

uint32_t *linear_cta_scratch(LinearFp4 *L, int rows, int K) {
  size_t bytes = (nvfp4_cta_scratch_words(rows, K) + cta_stripes(rows)) * sizeof(uint32_t);
  return (uint32_t *)cuda_scratch(L->b, &L->scratch[S_CTA_AMAX], bytes, SCRATCH_WHAT[S_CTA_AMAX]);
}

// Device scalars (read by later kernels on the same stream only, so they are reused call after call).
float *linear_dev_scalar(LinearFp4 *L, int i) {
  if (!L->dev) L->dev = (float *)cuda_malloc_tracked(L->b, D_N * 16 * sizeof(float), "FP4 linear device scalars");
  return L->dev + 16 * i;  // 64 bytes apart
}

// ---- profiling helpers --------------------------------------------------------------------------

static void book_mem(LinearFp4 *L, const LinearFormat *f, int mk, const char *what, const char *kind, double bytes) {
  char name[40];
  snprintf(name, sizeof name, "%s %s%s%s", f->tag, what, kind ? " " : "", kind ? kind : "");
  cuda_prof_end(L->b, mk, name, PROF_MEM, bytes, 0, NULL);
}

// Bytes a quantized copy of rows x K elements in format f occupies (what a producer writes).
static double qbytes(const LinearFormat *f, int fp8, int rows, int K) {
  if (fp8) return (double)rows * K + 4.0 * rows * K / 128;
  return (double)rows * K / 2 + (double)rows * K / f->block;
}

// Bytes `copies` quantized copies of a rows x K BF16 source in format f read and write.
static double quant_bytes(const LinearFormat *f, int fp8, int rows, int K, int copies) {
  return (2.0 * f->reads * rows * K + qbytes(f, fp8, rows, K)) * copies;
}

// ---- the GEMM -----------------------------------------------------------------------------------

// out[M,N] = alpha (* *alpha_dev) A . B^T + beta src, on the recipe's back end; src NULL: out itself,
// else (FP8 path only) another matrix of out's type and shape. use: "fwd", "dgrad", "wgrad" for the
// profile entry's name.
static void fp4_gemm(LinearFp4 *L, const LinearFormat *f, const char *use, LinearKind kind, void *out, int out_fp32,
                     const QOp &A, const QOp &B, int M, int N, int K, float alpha, float beta, const float *alpha_dev,
                     const void *src = NULL) {
  if (src && !A.fp8) die("linear_fp4: %s %s: a separate addend is an FP8-path epilogue", use, linear_kind_name(kind));
  char name[40];
  int mk = cuda_prof_begin(L->b);
  GemmShape s = {out_fp32, 0, 1, M, N, K, GEMM_ENGINE_BF16};
  const char *engine;
  if (A.fp8) {
    Fp8Operand a = {A.q, A.sf, A.blk128}, b = {B.q, B.sf, B.blk128};
    const int kernel = fp4_gemm_fp8_on(L->recipe.fp8_kernel, out, src, out_fp32, a, b, M, N, K, alpha, beta);
    engine = kernel == 2 ? "cutlass" : "fp8", s.engine = B.blk128   ? GEMM_ENGINE_FP8_BLK
                                                         : A.blk128 ? GEMM_ENGINE_FP8_ABLK
                                                                    : GEMM_ENGINE_FP8_VEC;
  } else if (A.outer) {  // CTA-local: the GEMM on unscaled operands, then alpha_i beta_j (alpha is 1)
    Fp4Operand a = {A.q, A.sb}, b = {B.q, B.sb};
    const int native = L->recipe.gemm == GEMM_FP4_NATIVE;
    float *acc =
        (float *)cuda_scratch(L->b, &L->scratch[S_CTA_ACC], (size_t)M * N * sizeof(float), SCRATCH_WHAT[S_CTA_ACC]);
    fp4_gemm_cta(out, out_fp32, native, a, A.outer, b, B.outer, M, N, K, beta != 0.0f, acc);
    engine = native ? "fp4" : "ref";
    if (native) s.engine = GEMM_ENGINE_NONE;
  } else {
    Fp4Operand a = {A.q, A.sb}, b = {B.q, B.sb};
    if (L->recipe.gemm == GEMM_FP4_NATIVE) {
      fp4_gemm_native(out, out_fp32, f->format, a, b, M, N, K, alpha, beta, alpha_dev);
      engine = "fp4", s.engine = GEMM_ENGINE_NONE;
    } else {
      fp4_gemm_reference_packed(out, out_fp32, f->format, a, b, M, N, K, alpha, beta, alpha_dev);
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

// The quantized W (in the Fprop's format) and W^T (in the Dgrad's) of weight w, requantized when
// older than wversion; a contraction in BF16 gets no copy.
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
    const LinearFormat *fw = format_of(L, id, CONTR_FPROP), *fwt = format_of(L, id, CONTR_DGRAD);
    const int fp8 = linear_fp8_path(L, fw), fp8t = linear_fp8_path(L, fwt);
    const int blk = fp8 && L->recipe.weight_2d, blkt = fp8t && L->recipe.weight_2d;  // 1D weights come out VEC128
    size_t bw = fw ? qop_bytes(fw, fp8, blk, out_dim, in) : 0, bwt = fwt ? qop_bytes(fwt, fp8t, blkt, in, out_dim) : 0;
    uint8_t *mem = (uint8_t *)cuda_malloc_tracked(L->b, bw + bwt + 256, "a quantized FP4 weight (W and W^T)");
    e = &L->wc[L->nwc++];
    memset(e, 0, sizeof *e);
    e->w = w, e->in = in, e->out_dim = out_dim, e->mem = mem, e->fw = fw, e->fwt = fwt;
    if (fw) e->wq = qop_at(fw, mem, fp8, blk, out_dim, in);
    if (fwt) e->wtq = qop_at(fwt, mem + bw, fp8t, blkt, in, out_dim);
    e->amax = (float *)(mem + bw + bwt);
  }
  if (e->version != wversion) {
    const int O = e->out_dim, I = e->in;
    // One producer for both copies where the formats agree; else each its own (two reads of W).
    const LinearFormat *parts[2] = {e->fw ? e->fw : e->fwt, e->fw && e->fwt != e->fw ? e->fwt : NULL};
    for (int k = 0; k < 2 && parts[k]; k++) {
      const LinearFormat *f = parts[k];
      const QOp *wq = e->fw == f ? &e->wq : NULL, *wtq = e->fwt == f ? &e->wtq : NULL;
      int mk = cuda_prof_begin(L->b);
      f->weight(L, w16, O, I, wq, wtq, e->amax);
      book_mem(L, f, mk, "quant w", NULL,
               2.0 * f->reads * O * I + ((wq != NULL) + (wtq != NULL)) * qbytes(f, linear_fp8_path(L, f), O, I));
    }
    L->wquant++;
    e->version = wversion;
  }
  return e;
}

static void check_shape(const LinearFormat *f, LinearId id, int N, int in, int out_dim) {
  if (N <= 0 || in <= 0 || out_dim <= 0 || N % 32 || in % 32 || out_dim % 32)
    die("linear_fp4: layer %d %s runs in %s: N=%d tokens, in=%d, out=%d must be positive multiples of 32 (FP4 blocks "
        "along every GEMM's K)",
        id.layer, linear_kind_name(id.kind), f->name, N, in, out_dim);
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

// 1 when the scratch of this use still holds x's quantization in format f for this follower; records
// the call.
static int x_shared(const LinearFp4 *L, int use, LinearId id, const LinearFormat *f, const bf16 *x, int N, int in) {
  const XQuant *r = &L->xq[use];
  return L->share_x && r->x == x && r->f == f && r->N == N && r->in == in && r->layer == id.layer &&
         shares_x_with(id.kind, r->kind);
}
static int reuse_x(LinearFp4 *L, int use, LinearId id, const LinearFormat *f, const bf16 *x, int N, int in) {
  const int hit = x_shared(L, use, id, f, x, N, in);
  L->xq[use] = (XQuant){x, f, N, in, id.layer, id.kind, 0};
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

// The saved copy of (layer, group of kind) for an x of [N, in] in format f (the Wgrad's): found, or
// made when create.
static SavedX *saved_slot(LinearFp4 *L, LinearId id, const LinearFormat *f, int N, int in, int create) {
  const LinearKind g = group_of(id.kind);
  const int fp8 = linear_fp8_path(L, f), blk = x_col_blk(L, f);
  for (int i = 0; i < L->nsaved; i++) {
    SavedX *e = &L->saved[i];
    if (e->layer != id.layer || e->group != g) continue;
    if (e->N == N && e->in == in && e->f == f && e->fp8 == fp8 && e->blk == blk) return e;
    if (!create) return NULL;
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // another shape: reallocate
    L->saved_bytes -= qop_bytes(e->f, e->fp8, e->blk, e->in, e->N) + 256;
    cuda_free_tracked(L->b, e->mem);
    *e = L->saved[--L->nsaved];
    break;
  }
  if (!create) return NULL;
  L->saved = (SavedX *)grow_array(L->saved, L->nsaved, &L->capsaved, sizeof *L->saved);
  SavedX *e = &L->saved[L->nsaved++];
  size_t bytes = qop_bytes(f, fp8, blk, in, N) + 256;
  memset(e, 0, sizeof *e);
  e->layer = id.layer, e->group = g, e->N = N, e->in = in, e->fp8 = fp8, e->blk = blk, e->f = f;
  e->mem = (uint8_t *)cuda_malloc_tracked(L->b, bytes, "a saved FP4 copy of a linear's input (Wgrad operand)");
  e->col = qop_at(f, e->mem, fp8, blk, in, N);
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
  // The copy is made by an FP4 forward and is the operand of an FP4 Wgrad: both contractions must be FP4.
  if (!L->save_inputs || id.kind == LIN_O || id.kind == LIN_HEAD || id.layer < 0 || id.layer >= L->nlayers) return 0;
  return linear_fp4_runs(L, id, CONTR_FPROP) && linear_fp4_runs(L, id, CONTR_WGRAD);
}

size_t linear_fp4_saved_bytes(const LinearFp4 *L) { return L->saved_bytes; }

static void forget_x(LinearFp4 *L) {
  memset(L->xq, 0, sizeof L->xq);
  forget_saved(L);
}

// ---- format-aware fusion (model/cuda/quant_fused.h) ------------------------------------------------

// Fusion on: precision.fusion is not off.
static int fusing(const LinearFp4 *L) { return L->recipe.fusion != FUSION_OFF; }
// The newer fusions (the residual epilogue, the SwiGLU epilogue) run under
// precision.fusion: on, and under auto once a GPU session has passed their tests (gpu_test_fp4_gemm,
// gpu_test_swiglu_epilogue, gpu_test_fp4_linear) and `gpu_check.sh fusion` measured the step
// faster with them: then its *_IN_AUTO becomes 1 (docs/formats.md §4 has the measurements).
// FP4_FUSIONS (environment, for measuring each alone: `gpu_check.sh fusion`) narrows `on` to a comma list of
// residual, swiglu_epilogue; unset: both.
#define RESIDUAL_EPILOGUE_IN_AUTO 0
#define SWIGLU_EPILOGUE_IN_AUTO 0
enum { NEW_RESIDUAL = 1, NEW_SWIGLU_EPILOGUE = 2 };
static int new_fusions_on(void) {
  static int mask = -1;
  if (mask < 0) {
    const char *e = getenv("FP4_FUSIONS");
    if (!e) return mask = 3;
    mask = 0;
    const char *names[2] = {"residual", "swiglu_epilogue"};
    for (const char *p = e; *p;) {
      const size_t n = strcspn(p, ",");
      int known = 0;
      for (int i = 0; i < 2; i++)
        if (n == strlen(names[i]) && !strncmp(p, names[i], n)) mask |= 1 << i, known = 1;
      if (!known && n) die("FP4_FUSIONS=%s: '%.*s' is not one of residual, swiglu_epilogue", e, (int)n, p);
      p += n + (p[n] == ',');
    }
  }
  return mask;
}
static int fusing_new(const LinearFp4 *L, int in_auto, int which) {
  return fusing(L) && ((L->recipe.fusion == FUSION_ON && (new_fusions_on() & which)) || in_auto);
}
long linear_fp4_fused_calls(const LinearFp4 *L) { return L->fused_calls; }

// The fused producers make x's Fprop and Wgrad copies in one format: the block's two contractions
// must agree on one that has them.
int linear_fp4_fusable(const LinearFp4 *L, LinearId leader) {
  if (!fusing(L) || !L->share_x || !keeps_x(leader.kind) || !linear_fp4_saves_input(L, leader)) return 0;
  const LinearFormat *f = format_of(L, leader, CONTR_FPROP);
  return f == format_of(L, leader, CONTR_WGRAD) && f->dual_rmsnorm && f->has_dual(L, 0);
}

// Where the fused producer writes: leader's Fprop copy (the x scratch its forward and followers read)
// and its saved Wgrad copy; then records x as quantized for leader itself.
// slot: the scratch role of the Fprop copy (S_X_ROW; S_X_ROW2 where a GEMM reading S_X_ROW makes it).
static const LinearFormat *fused_outputs(LinearFp4 *L, LinearId leader, int N, int in, QOp *xq, SavedX **sv,
                                         int slot = S_X_ROW) {
  if (N <= 0 || in <= 0 || N % 32 || in % 32)
    die("linear_fp4: layer %d %s: fused input of N=%d x in=%d: need positive multiples of 32", leader.layer,
        linear_kind_name(leader.kind), N, in);
  const LinearFormat *f = format_of(L, leader, CONTR_FPROP);
  *xq = linear_scratch_op(L, f, slot, linear_fp8_path(L, f), 0, N, in);
  *sv = saved_slot(L, leader, f, N, in, 1);
  return f;
}
static void fused_done(LinearFp4 *L, LinearId leader, const LinearFormat *f, const void *x_token, int N, int in,
                       SavedX *sv, int slot = S_X_ROW) {
  sv->valid = 1, L->fused_calls++;
  L->xq[XQ_ROW] = (XQuant){x_token, f, N, in, leader.layer, leader.kind, 1, slot};
}

int linear_fp4_fused_rmsnorm(LinearFp4 *L, LinearId leader, const void *x_token, const bf16 *res, const float *rstd,
                             const float *w, int N, int D) {
  if (!linear_fp4_fusable(L, leader)) return 0;
  QOp xq;
  SavedX *sv;
  const LinearFormat *f = fused_outputs(L, leader, N, D, &xq, &sv);
  int mk = cuda_prof_begin(L->b);
  f->dual_rmsnorm(L, res, rstd, w, N, D, xq, sv->col);
  book_mem(L, f, mk, "quant x fwd+wgrad", "(rmsnorm fused)",
           2.0 * N * D + 4.0 * N + 4.0 * D + 2 * qbytes(f, linear_fp8_path(L, f), N, D));
  fused_done(L, leader, f, x_token, N, D, sv);
  return 1;
}

int linear_fp4_fused_swiglu(LinearFp4 *L, LinearId leader, const void *x_token, const bf16 *gate, const bf16 *up, int N,
                            int F) {
  if (!linear_fp4_fusable(L, leader)) return 0;
  QOp xq;
  SavedX *sv;
  const LinearFormat *f = fused_outputs(L, leader, N, F, &xq, &sv);
  int mk = cuda_prof_begin(L->b);
  f->dual_swiglu(L, gate, up, N, F, xq, sv->col);
  book_mem(L, f, mk, "quant x fwd+wgrad", "(swiglu fused)", 4.0 * N * F + 2 * qbytes(f, linear_fp8_path(L, f), N, F));
  fused_done(L, leader, f, x_token, N, F, sv);
  return 1;
}

int linear_fp4_fuses_swiglu(const LinearFp4 *L, LinearId up, LinearId down, int N, int F) {
  if (up.kind != LIN_UP || down.kind != LIN_DOWN || up.layer != down.layer || N % 128 || F % 128) return 0;
  if (!fusing_new(L, SWIGLU_EPILOGUE_IN_AUTO, NEW_SWIGLU_EPILOGUE) || !linear_fp4_fusable(L, down) ||
      !fp4_gemm_cutlass_available())
    return 0;
  const LinearFormat *f = linear_fp4_runs(L, up, CONTR_FPROP) ? format_of(L, up, CONTR_FPROP) : NULL;
  return f == &linear_mxfp4 && format_of(L, down, CONTR_FPROP) == &linear_mxfp4 && linear_fp8_path(L, f);
}

void linear_fp4_forward_swiglu(LinearFp4 *L, LinearId id, LinearId down, bf16 *up, const void *x_token, const bf16 *x,
                               const float *w, const bf16 *w16, uint64_t wversion, const bf16 *gate, int N, int in,
                               int F) {
  if (!linear_fp4_fuses_swiglu(L, id, down, N, F))
    die("linear_fp4_forward_swiglu: layer %d: no SwiGLU epilogue here (ask linear_fp4_fuses_swiglu)", id.layer);
  const LinearFormat *f = format_of(L, id, CONTR_FPROP);
  check_shape(f, id, N, in, F);
  if (!x_shared(L, XQ_ROW, id, f, x, N, in)) {  // x not quantized by gate just before: the two ops apart
    linear_fp4_forward(L, id, up, x, w, w16, wversion, N, in, F, NULL);
    if (!linear_fp4_fused_swiglu(L, down, x_token, gate, up, N, F))
      die("linear_fp4_forward_swiglu: layer %d: down's fused producer refused", id.layer);
    return;
  }
  reuse_x(L, XQ_ROW, id, f, x, N, in);  // up's use of gate's copy, recorded
  const QWeight *qw = weight_of(L, id, w, w16, wversion, in, F);
  const QOp xq = linear_scratch_op(L, f, S_X_ROW, 1, 0, N, in);
  QOp hq;
  SavedX *sv;
  fused_outputs(L, down, N, F, &hq, &sv, S_X_ROW2);  // down's copies: the row copy beside up's input, not on it
  const Fp8Operand a = {xq.q, xq.sf, xq.blk128}, b = {qw->wq.q, qw->wq.sf, qw->wq.blk128};
  const MxOut row = linear_mx_out(hq), col = linear_col_out(L, sv->col, N, F);
  const char *why = swiglu_epilogue_unsupported(a, b, N, F, in, row, col);
  if (why) die("linear_fp4_forward_swiglu: layer %d: %s", id.layer, why);
  const float *alpha_dev = NULL;
  const float alpha = f->alpha(L, NULL, qw->amax, &alpha_dev);
  int mk = cuda_prof_begin(L->b);
  up_gemm_swiglu_mx_cuda(up, gate, a, b, N, F, in, alpha, linear_mx_mode(L), row, L->recipe.hadamard == 32, col);
  if (mk >= 0) {
    GemmShape s = {0, 0, 1, N, F, in, GEMM_ENGINE_FP8_BLK};
    // the GEMM's operands and up, gate read, down's two copies (E4M3 and a float per 128) written
    const double bytes = (double)(N + F) * in + 4.0 * N * F + 2.0 * (N * (double)F + N * (double)F / 32.0);
    cuda_prof_end(L->b, mk, "cutlass gemm fwd+swiglu up", PROF_GEMM, bytes, 2.0 * N * (double)F * in, &s);
  }
  fused_done(L, down, format_of(L, down, CONTR_FPROP), x_token, N, F, sv, S_X_ROW2);
}

// The residual add in the Fprop GEMM's epilogue: the FP8 path's kernels add beta * src to alpha * acc
// rounded to BF16 first (fp4_gemm_fp8_src), so with beta 1 the bits are those of the GEMM then the add.
int linear_fp4_fuses_residual(const LinearFp4 *L, LinearId id) {
  const LinearFormat *f = linear_fp4_runs(L, id, CONTR_FPROP) ? format_of(L, id, CONTR_FPROP) : NULL;
  return fusing_new(L, RESIDUAL_EPILOGUE_IN_AUTO, NEW_RESIDUAL) && f && linear_fp8_path(L, f);
}

// ---- the linear entries -------------------------------------------------------------------------

void linear_fp4_forward(LinearFp4 *L, LinearId id, bf16 *out, const bf16 *x, const float *w, const bf16 *w16,
                        uint64_t wversion, int N, int in, int out_dim, const bf16 *res) {
  const LinearFormat *f = format_of(L, id, CONTR_FPROP), *fw = format_of(L, id, CONTR_WGRAD);
  if (!f)
    die("linear_fp4_forward: layer %d %s runs its Fprop in BF16 (ops_cuda.cu routes it by linear_fp4_runs)", id.layer,
        linear_kind_name(id.kind));
  check_shape(f, id, N, in, out_dim);
  const QWeight *qw = weight_of(L, id, w, w16, wversion, in, out_dim);
  const int fp8 = linear_fp8_path(L, f);
  const XQuant *fq = &L->xq[XQ_ROW];  // a fused producer made x's copies for this very linear
  const int fused = fq->fused && fq->x == x && fq->f == f && fq->N == N && fq->in == in && fq->layer == id.layer &&
                    fq->kind == id.kind;
  QOp xq = linear_scratch_op(L, f, fused ? fq->slot : S_X_ROW, fp8, 0, N, in);
  const int shared = reuse_x(L, XQ_ROW, id, f, x, N, in) || fused;
  // The group leader keeps x's Wgrad copy (in the Wgrad's format) for the backward (saved quantized,
  // see SavedX).
  SavedX *sv = L->save_inputs && keeps_x(id.kind) && fw ? saved_slot(L, id, fw, N, in, 1) : NULL;
  float *amax_x = linear_dev_scalar(L, D_AMAX_X);  // a follower's stays its leader's
  PhiloxStream none = {};
  int mk = fused || (shared && !sv) ? -1 : cuda_prof_begin(L->b);  // a mark only where a producer runs
  if (fused) {                                                     // both copies made (linear_fp4_fused_*)
  } else if (sv && !shared && fw == f &&
             f->dual(L, x, N, in, 0, none, &xq, 0, sv->col)) {  // rows and columns, one read
    book_mem(L, f, mk, "quant x fwd+wgrad", NULL, 2.0 * N * in + 2 * qbytes(f, fp8, N, in));
  } else {
    if (!shared) {
      f->rows(L, x, N, in, 0, none, xq, amax_x);
      book_mem(L, f, mk, "quant x fwd", NULL, quant_bytes(f, fp8, N, in, 1));
    }
    if (sv) {
      if (!shared) mk = cuda_prof_begin(L->b);  // the rows' mark was ended above
      fw->cols(L, x, N, in, 0, stream_for(L, id, USE_X_COL), sv->col, sv->amax);
      book_mem(L, fw, mk, "quant x wgrad (fwd)", NULL, quant_bytes(fw, linear_fp8_path(L, fw), N, in, 1));
    }
  }
  if (sv) sv->valid = 1;
  const float *alpha_dev = NULL;
  float alpha = f->alpha(L, amax_x, qw->amax, &alpha_dev);
  if (res && !linear_fp4_fuses_residual(L, id))
    die("linear_fp4_forward: layer %d %s: no residual epilogue here (ask linear_fp4_fuses_residual)", id.layer,
        linear_kind_name(id.kind));
  fp4_gemm(L, f, res ? "fwd+res" : "fwd", id.kind, out, 0, xq, qw->wq, N, out_dim, in, alpha, res ? 1.0f : 0.0f,
           alpha_dev, res);
}

void linear_fp4_backward(LinearFp4 *L, LinearId id, bf16 *dx, float *dw, const bf16 *dout, const bf16 *x,
                         const float *w, const bf16 *w16, uint64_t wversion, int N, int in, int out_dim,
                         int dx_accumulate, int dw_overwrite) {
  if (!dx && !dw) return;
  const LinearFormat *fd = dx ? format_of(L, id, CONTR_DGRAD) : NULL, *fw = dw ? format_of(L, id, CONTR_WGRAD) : NULL;
  if ((dx && !fd) || (dw && !fw))
    die("linear_fp4_backward: layer %d %s runs its %s in BF16 (ops_cuda.cu routes it by linear_fp4_runs)", id.layer,
        linear_kind_name(id.kind), dx && !fd ? "Dgrad" : "Wgrad");
  check_shape(fd ? fd : fw, id, N, in, out_dim);
  const int fp8d = linear_fp8_path(L, fd), fp8w = linear_fp8_path(L, fw);
  const QWeight *qw = dx ? weight_of(L, id, w, w16, wversion, in, out_dim) : NULL;
  QOp dyr = {}, dyc = {}, xc = {};
  if (dx) dyr = linear_scratch_op(L, fd, S_DY_ROW, fp8d, 0, N, out_dim);
  if (dw) dyc = linear_scratch_op(L, fw, S_DY_COL, fp8w, dy_col_blk(L, fw), out_dim, N);
  const PhiloxStream s_row = stream_for(L, id, USE_DY_ROW), s_col = stream_for(L, id, USE_DY_COL);
  const int sr_row = L->recipe.sr_dgrad, sr_col = L->recipe.sr_wgrad;
  float *amax_dy = linear_dev_scalar(L, D_AMAX_DY), *amax_dyc = linear_dev_scalar(L, D_AMAX_DY_COL);

  // dY: the Dgrad row copy and the Wgrad column copy, from one read where one format makes both, or
  // where the operand hybrid's producer makes the pair (its scales folded by a second pass)
  int mk = cuda_prof_begin(L->b);
  if (dx && dw && fd == fw && fd->dual(L, dout, N, out_dim, sr_row, s_row, &dyr, sr_col, dyc)) {
    book_mem(L, fd, mk, "quant dy dual", NULL, 2.0 * N * out_dim + 2 * qbytes(fd, fp8d, N, out_dim));
  } else if (dx && dw && fusing(L) &&
             linear_hybrid_dual(L, fd, fw, dout, N, out_dim, sr_row, s_row, dyr, sr_col, dyc)) {
    L->fused_calls++;
    book_mem(L, fd, mk, "quant dy hybrid dual", NULL,
             2.0 * N * out_dim + qbytes(fd, fp8d, N, out_dim) + qbytes(fw, fp8w, N, out_dim) + 2.0 * N * out_dim / 16);
  } else {
    if (dx) {
      fd->rows(L, dout, N, out_dim, sr_row, s_row, dyr, amax_dy);
      book_mem(L, fd, mk, "quant dy", "dgrad", quant_bytes(fd, fp8d, N, out_dim, 1));
    }
    if (dw) {
      if (dx) mk = cuda_prof_begin(L->b);  // the rows' mark was ended above
      fw->cols(L, dout, N, out_dim, sr_col, s_col, dyc, amax_dyc);
      book_mem(L, fw, mk, "quant dy", "wgrad", quant_bytes(fw, fp8w, N, out_dim, 1));
    }
  }

  // Dgrad: dX (+)= dY W = dY (W^T)^T
  if (dx) {
    const float *alpha_dev = NULL;
    float alpha = fd->alpha(L, amax_dy, qw->amax, &alpha_dev);
    fp4_gemm(L, fd, "dgrad", id.kind, dx, 0, dyr, qw->wtq, N, in, out_dim, alpha, dx_accumulate ? 1.0f : 0.0f,
             alpha_dev);
  }

  // Wgrad: dW (+)= (R dY)^T (R x), with x's column copy saved by the forward, else recomputed from
  // the saved BF16 x
  if (dw) {
    SavedX *sv = L->save_inputs ? saved_slot(L, id, fw, N, in, 0) : NULL;
    float *amax_xc = linear_dev_scalar(L, D_AMAX_X_COL);
    if (sv && sv->valid) {
      xc = sv->col, amax_xc = sv->amax;
    } else {
      if (!x)
        die("linear_fp4: layer %d %s: no saved FP4 copy of x from this micro-batch's forward and no BF16 x for "
            "the Wgrad",
            id.layer, linear_kind_name(id.kind));
      // only here: with saved copies it is never allocated
      xc = linear_scratch_op(L, fw, S_X_COL, fp8w, x_col_blk(L, fw), in, N);
      if (!reuse_x(L, XQ_COL, id, fw, x, N, in)) {
        mk = cuda_prof_begin(L->b);
        fw->cols(L, x, N, in, 0, stream_for(L, id, USE_X_COL), xc, amax_xc);
        book_mem(L, fw, mk, "quant x wgrad", NULL, 2.0 * fw->reads * N * in + qbytes(fw, fp8w, in, N));
      }
    }
    const float *alpha_dev = NULL;
    float alpha = fw->alpha(L, amax_dyc, amax_xc, &alpha_dev);
    fp4_gemm(L, fw, "wgrad", id.kind, dw, 1, dyc, xc, out_dim, in, N, alpha, dw_overwrite ? 0.0f : 1.0f, alpha_dev);
  }
}
