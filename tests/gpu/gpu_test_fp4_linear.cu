// tests/gpu/gpu_test_fp4_linear.cu: the recipe-aware FP4 linear layer (model/cuda/linear_fp4.h) through the CUDA
// backend's table: the FP8 back end against the exact reference, both against BF16, stochastic
// rounding, the Wgrad Hadamard, the quantized-weight cache, and a whole tiny model.
//
// Tolerances (relative L2 norms of the error over the reference):
// - FP8 vs reference path: same quantized operands (same Philox bits; the FP8 embedding is exact for
//   these data), so only the accumulation differs: fp32 out (Wgrad) 1e-5 (gpu_test_fp4_gemm saw
//   2.4e-6 at K = 4096); BF16 out (Fprop, Dgrad) adds one BF16 rounding, which flips an ulp (2^-8) only
//   for the ~1e-4 of the elements the accumulations straddle: 1e-3.
// - FP4 vs BF16: MXFP4 operand errors measured with the CPU reference on normal data are 0.118 (1x32
//   RNE), 0.167 (1x32 SR), 0.113 (32x32 weight tiles), so one GEMM is ~0.16 (RNE x RNE) to ~0.20 (SR
//   dY); the check is [0.05, 0.3]: above 0.05 proves the operands were quantized, below 0.3 that they
//   were quantized right (a wrong scale or layout gives ~1).
// - The tiny model's gradients: a block's Wgrad alone is ~0.16 (two RNE operands); the RMSNorm weights'
//   gradients sum SR-rounded Dgrad outputs (~0.20 each) over tokens, and errors compound through 4
//   blocks, so the bound is 0.3 per tensor (every value is printed).
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fp4/gemm_cutlass.h"
#include "fp4/mxfp4.h"
#include "fp4/recipe.h"
#include "common/cuda_common.h"
#include "model/cuda/attention_cudnn.h"
#include "model/cuda/linear_fp4.h"
#include "model/cpu/linear_fp4.h"
#include "model/llama.h"
#include "model/cuda/ops_cuda.h"
#include "tests/test.h"
#include "tests/gpu/gpu_ops_util.h"

// n normal values of standard deviation `scale` rounded to BF16 (exact in BF16).
static float *randn_bf16(size_t n, float scale) { return randn(n, scale, 1); }

typedef __nv_bfloat16 bf16;

static const uint64_t SEED = 42;

static Recipe mx_recipe(FP4GemmBackend gemm) {
  Recipe r;
  memset(&r, 0, sizeof r);
  r.format = FMT_MXFP4, r.sr_dgrad = 1, r.sr_wgrad = 0, r.hadamard = 32, r.weight_2d = 1, r.scale_round_up = 1;
  r.gemm = gemm;
  r.wgrad_2d = gemm == GEMM_FP8_EMBED ? WGRAD_2D_DY : WGRAD_2D_OFF;  // recipe_resolve's default
  return r;
}

// ---- one linear layer ---------------------------------------------------------------------------

// Device buffers of one linear y = x W^T with W at the start of a bound parameter buffer.
typedef struct {
  int N, in, out;
  float *w;      // device, the bound parameter buffer
  void *x, *dy;  // BF16 inputs
  void *y, *dx;  // BF16 outputs
  float *dw;     // fp32
} Lin;

static Lin lin_create(int N, int in, int out, const float *hw, const float *hx, const float *hdy) {
  Lin L;
  L.N = N, L.in = in, L.out = out;
  size_t nw = (size_t)in * out;
  L.w = (float *)G->alloc(G->ctx, nw * sizeof(float));
  G->bind_params(G->ctx, L.w, nw);
  G->upload(G->ctx, L.w, hw, nw * sizeof(float));
  G->params_changed(G->ctx);
  L.x = dev_bf16(hx, (size_t)N * in);
  L.dy = dev_bf16(hdy, (size_t)N * out);
  L.y = G->alloc(G->ctx, (size_t)N * out * sizeof(bf16));
  L.dx = G->alloc(G->ctx, (size_t)N * in * sizeof(bf16));
  L.dw = (float *)G->alloc(G->ctx, nw * sizeof(float));
  return L;
}

static void lin_free(Lin *L) {
  void *b[] = {L->w, L->x, L->dy, L->y, L->dx, L->dw};
  for (int i = 0; i < 6; i++) G->release(G->ctx, b[i]);
}

typedef struct {
  float *y, *dx, *dw;
} LinResult;

static void result_free(LinResult *r) { free(r->y), free(r->dx), free(r->dw); }

static const LinearId ID = {0, LIN_Q};

// Fprop, Dgrad and Wgrad of linear id under recipe r set for n_layers blocks.
static LinResult lin_run_at(Lin *L, const Recipe *r, int n_layers, LinearId id, int64_t step, int micro) {
  cuda_set_recipe(CB, r, n_layers, SEED);
  G->set_step(G->ctx, step, micro);
  G->matmul_fwd(G->ctx, id, L->y, L->x, L->w, L->N, L->in, L->out);
  G->zero(G->ctx, L->dw, (size_t)L->in * L->out * sizeof(float));
  G->matmul_bwd(G->ctx, id, L->dx, L->dw, L->dy, L->x, L->w, L->N, L->in, L->out, 0);
  LinResult res;
  res.y = host_bf16(L->y, (size_t)L->N * L->out);
  res.dx = host_bf16(L->dx, (size_t)L->N * L->in);
  res.dw = host_f32(L->dw, (size_t)L->in * L->out);
  return res;
}

// Fprop, Dgrad and Wgrad of the one-block test linear under recipe r (NULL: BF16) at (step, micro).
static LinResult lin_run(Lin *L, const Recipe *r, int64_t step, int micro) {
  return lin_run_at(L, r, 1, ID, step, micro);
}

static void test_paths(int N, int in, int out) {
  float *hw = randn_bf16((size_t)in * out, 0.02f), *hx = randn_bf16((size_t)N * in, 1.0f);
  float *hdy = randn_bf16((size_t)N * out, 0.01f);
  Lin L = lin_create(N, in, out, hw, hx, hdy);
  Recipe fp8 = mx_recipe(GEMM_FP8_EMBED), ref = mx_recipe(GEMM_REFERENCE);
  LinResult a = lin_run(&L, &fp8, 3, 1), b = lin_run(&L, &ref, 3, 1), c = lin_run(&L, NULL, 3, 1);
  size_t ny = (size_t)N * out, nx = (size_t)N * in, nw = (size_t)in * out;
  double e[3] = {rel_err(a.y, b.y, ny), rel_err(a.dx, b.dx, nx), rel_err(a.dw, b.dw, nw)};
  double f[3] = {rel_err(a.y, c.y, ny), rel_err(a.dx, c.dx, nx), rel_err(a.dw, c.dw, nw)};
  double g[3] = {rel_err(b.y, c.y, ny), rel_err(b.dx, c.dx, nx), rel_err(b.dw, c.dw, nw)};
  printf("  N=%d in=%d out=%d: fp8 vs ref  fprop %.3g dgrad %.3g wgrad %.3g\n", N, in, out, e[0], e[1], e[2]);
  printf("  %*s  fp8 vs bf16 fprop %.4f dgrad %.4f wgrad %.4f; ref vs bf16 %.4f %.4f %.4f\n", 22, "", f[0], f[1], f[2],
         g[0], g[1], g[2]);
  CHECK(e[0] < 1e-3, "N=%d in=%d out=%d: Fprop fp8 vs reference %.3g", N, in, out, e[0]);
  CHECK(e[1] < 1e-3, "N=%d in=%d out=%d: Dgrad fp8 vs reference %.3g", N, in, out, e[1]);
  CHECK(e[2] < 1e-5, "N=%d in=%d out=%d: Wgrad fp8 vs reference %.3g", N, in, out, e[2]);
  // The other Wgrad embeddings (x^T in 128x128 tiles, both VEC128): the same products, other kernels.
  for (int v = 0; v < 2; v++) {
    Recipe o = fp8;
    o.wgrad_2d = v ? WGRAD_2D_OFF : WGRAD_2D_X;
    LinResult d = lin_run(&L, &o, 3, 1);
    double ew = rel_err(d.dw, b.dw, nw);
    printf("  %*s  wgrad with %s: fp8 vs ref %.3g\n", 22, "", v ? "both operands VEC128" : "x^T in 128x128 tiles", ew);
    CHECK(ew < 1e-5, "N=%d in=%d out=%d: Wgrad (%s) fp8 vs reference %.3g", N, in, out, v ? "VEC128" : "x^T tiles", ew);
    CHECK(!memcmp(d.y, a.y, ny * sizeof(float)) && !memcmp(d.dx, a.dx, nx * sizeof(float)),
          "the Wgrad embedding changed Fprop or Dgrad");
    result_free(&d);
  }
  const char *names[3] = {"Fprop", "Dgrad", "Wgrad"};
  for (int i = 0; i < 3; i++) {
    CHECK(f[i] > 0.05 && f[i] < 0.3, "N=%d in=%d out=%d: %s fp8 vs BF16 %.4f outside [0.05, 0.3]", N, in, out, names[i],
          f[i]);
    CHECK(g[i] > 0.05 && g[i] < 0.3, "N=%d in=%d out=%d: %s reference vs BF16 %.4f outside [0.05, 0.3]", N, in, out,
          names[i], g[i]);
  }
  result_free(&a), result_free(&b), result_free(&c);
  lin_free(&L);
  free(hw), free(hx), free(hdy);
}

// ---- stochastic rounding of the Dgrad operand ---------------------------------------------------

// E[SR(dY)] = dY (round-up scales never clip), so the mean of the Dgrad over many micro-batches tends
// to dY W_q, W_q the quantized weights (CPU reference of the same producer, bit-identical).
static void test_sr(void) {
  const int N = 256, in = 256, out = 512, draws = 64;
  float *hw = randn_bf16((size_t)in * out, 0.02f), *hx = randn_bf16((size_t)N * in, 1.0f);
  float *hdy = randn_bf16((size_t)N * out, 0.01f);
  Lin L = lin_create(N, in, out, hw, hx, hdy);
  uint8_t *codes = (uint8_t *)xmalloc((size_t)in * out / 2), *scales = (uint8_t *)xmalloc((size_t)in * out / 32);
  float *wq = (float *)xmalloc((size_t)in * out * sizeof(float));
  mx_quantize_weight(hw, out, in, MX_SCALE_UP, 1, codes, scales, NULL, NULL);
  mx_dequantize(codes, scales, out, in, MX_SCALE_UP, wq);
  float *expect = (float *)xmalloc((size_t)N * in * sizeof(float));
  for (int n = 0; n < N; n++)
    for (int i = 0; i < in; i++) {
      double s = 0;
      for (int o = 0; o < out; o++) s += (double)hdy[(size_t)n * out + o] * wq[(size_t)o * in + i];
      expect[(size_t)n * in + i] = (float)s;
    }
  Recipe r = mx_recipe(GEMM_FP8_EMBED);
  cuda_set_recipe(CB, &r, 1, SEED);
  size_t nx = (size_t)N * in;
  double *mean = (double *)xcalloc(nx, sizeof(double));
  float *first = NULL, *meanf = (float *)xmalloc(nx * sizeof(float));
  for (int m = 0; m < draws; m++) {
    G->set_step(G->ctx, 7, m);
    G->matmul_bwd(G->ctx, ID, L.dx, NULL, L.dy, L.x, L.w, N, in, out, 0);
    float *d = host_bf16(L.dx, nx);
    for (size_t i = 0; i < nx; i++) mean[i] += d[i] / draws;
    if (!first) first = d;
    else free(d);
  }
  for (size_t i = 0; i < nx; i++) meanf[i] = (float)mean[i];
  double e1 = rel_err(first, expect, nx), em = rel_err(meanf, expect, nx);
  printf("  Dgrad vs dY W_q: one SR draw %.4f, mean of %d draws %.4f (1/sqrt(%d) of one draw: %.4f)\n", e1, draws, em,
         draws, e1 / sqrt((double)draws));
  CHECK(e1 > 0.05, "one SR draw is too close to the expectation (%.4f): was dY rounded at all?", e1);
  CHECK(em < 0.25 * e1, "the mean of %d SR draws (%.4f) is not much closer to dY W_q than one draw (%.4f)", draws, em,
        e1);
  // same (step, micro) -> the same bits; another micro or step -> other bits
  float *run[4];
  const int64_t steps[4] = {7, 7, 7, 8};
  const int micros[4] = {3, 3, 4, 3};
  for (int k = 0; k < 4; k++) {
    G->set_step(G->ctx, steps[k], micros[k]);
    G->matmul_bwd(G->ctx, ID, L.dx, NULL, L.dy, L.x, L.w, N, in, out, 0);
    run[k] = host_bf16(L.dx, nx);
  }
  CHECK(!memcmp(run[0], run[1], nx * sizeof(float)), "same (step, micro): Dgrad outputs differ");
  CHECK(memcmp(run[0], run[2], nx * sizeof(float)), "micro 3 and 4 gave identical SR Dgrad outputs");
  CHECK(memcmp(run[0], run[3], nx * sizeof(float)), "step 7 and 8 gave identical SR Dgrad outputs");
  for (int k = 0; k < 4; k++) free(run[k]);
  free(first), free(meanf), free(mean), free(expect), free(wq), free(codes), free(scales);
  lin_free(&L);
  free(hw), free(hx), free(hdy);
}

// ---- the Wgrad Hadamard -------------------------------------------------------------------------

// x with one outlier token (x16) in every 32 tokens: without a rotation it sets the block scale of
// every column block and the other 31 tokens lose their resolution; H32 spreads it. The CPU reference
// quantizers give Wgrad errors of 0.22 (none) and 0.16 (H32) on these data.
static void test_hadamard(void) {
  const int N = 1024, in = 256, out = 256;
  float *hw = randn_bf16((size_t)in * out, 0.02f), *hx = randn_bf16((size_t)N * in, 1.0f);
  float *hdy = randn_bf16((size_t)N * out, 0.01f);
  for (int n = 7; n < N; n += 32)
    for (int i = 0; i < in; i++) hx[(size_t)n * in + i] *= 16.0f;  // exact in BF16
  Lin L = lin_create(N, in, out, hw, hx, hdy);
  Recipe h32 = mx_recipe(GEMM_FP8_EMBED), none = h32;
  none.hadamard = 0;
  LinResult a = lin_run(&L, &h32, 0, 0), b = lin_run(&L, &none, 0, 0), c = lin_run(&L, NULL, 0, 0);
  size_t nw = (size_t)in * out;
  double eh = rel_err(a.dw, c.dw, nw), en = rel_err(b.dw, c.dw, nw);
  printf("  Wgrad vs BF16 with outlier tokens: H32 %.4f, no Hadamard %.4f\n", eh, en);
  CHECK(eh < 0.2, "Wgrad with H32 is %.4f from dY^T x: the rotation does not cancel", eh);
  CHECK(eh < 0.85 * en, "H32 (%.4f) is not clearly closer to BF16 than no Hadamard (%.4f) on outlier tokens", eh, en);
  result_free(&a), result_free(&b), result_free(&c);
  lin_free(&L);
  free(hw), free(hx), free(hdy);
}

// ---- the quantized-weight cache -----------------------------------------------------------------

static void test_weight_cache(void) {
  const int N = 128, in = 256, out = 256;
  float *hw = randn_bf16((size_t)in * out, 0.02f), *hx = randn_bf16((size_t)N * in, 1.0f);
  float *hdy = randn_bf16((size_t)N * out, 0.01f);
  Lin L = lin_create(N, in, out, hw, hx, hdy);
  Recipe r = mx_recipe(GEMM_FP8_EMBED);
  cuda_set_recipe(CB, &r, 1, SEED);
  size_t ny = (size_t)N * out, nw = (size_t)in * out;
  long q0 = linear_fp4_weight_quantizations(LF);
  G->matmul_fwd(G->ctx, ID, L.y, L.x, L.w, N, in, out);
  float *y1 = host_bf16(L.y, ny);
  G->matmul_fwd(G->ctx, ID, L.y, L.x, L.w, N, in, out);
  G->matmul_bwd(G->ctx, ID, L.dx, L.dw, L.dy, L.x, L.w, N, in, out, 0);
  float *y2 = host_bf16(L.y, ny);
  long q1 = linear_fp4_weight_quantizations(LF);
  CHECK(q1 - q0 == 1, "one weights version, 3 uses: %ld quantizations (expected 1)", q1 - q0);
  CHECK(!memcmp(y1, y2, ny * sizeof(float)), "the same weights gave different Fprop outputs");
  // an AdamW step on the parameters: the next use requantizes
  float *g = (float *)G->alloc(G->ctx, nw * 4), *m = (float *)G->alloc(G->ctx, nw * 4),
        *v = (float *)G->alloc(G->ctx, nw * 4);
  float *hg = randn_bf16(nw, 1.0f);
  G->upload(G->ctx, g, hg, nw * 4);
  G->zero(G->ctx, m, nw * 4), G->zero(G->ctx, v, nw * 4);
  G->adamw(G->ctx, L.w, g, m, v, nw, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1);
  G->matmul_fwd(G->ctx, ID, L.y, L.x, L.w, N, in, out);
  float *y3 = host_bf16(L.y, ny);
  long q2 = linear_fp4_weight_quantizations(LF);
  CHECK(q2 - q1 == 1, "after adamw: %ld quantizations (expected 1)", q2 - q1);
  CHECK(memcmp(y1, y3, ny * sizeof(float)), "after adamw the Fprop output did not change (stale quantized W)");
  cuda_set_recipe(CB, &r, 1, SEED);  // drops the cache: a fresh quantization of the same weights
  G->matmul_fwd(G->ctx, ID, L.y, L.x, L.w, N, in, out);
  float *y4 = host_bf16(L.y, ny);
  CHECK(!memcmp(y3, y4, ny * sizeof(float)), "refreshed and freshly quantized weights give different outputs");
  printf("  weight quantizations: %ld for 3 uses, %ld after adamw, outputs %s\n", q1 - q0, q2 - q1,
         memcmp(y3, y4, ny * sizeof(float)) ? "differ" : "match a fresh quantization");
  void *b[] = {g, m, v};
  for (int i = 0; i < 3; i++) G->release(G->ctx, b[i]);
  free(y1), free(y2), free(y3), free(y4), free(hg);
  lin_free(&L);
  free(hw), free(hx), free(hdy);
}

// ---- a whole tiny model -------------------------------------------------------------------------

typedef struct {
  float loss;
  float *grads;  // host copy
} Pass;

static Pass model_pass(Llama *m, const Recipe *r, const int *in, const int *tg) {
  cuda_set_recipe(CB, r, llama_config(m)->n_layers, SEED);
  llama_init(m, 1234);
  llama_zero_grad(m);
  G->set_step(G->ctx, 0, 0);
  Pass p;
  p.loss = llama_forward_backward(m, in, tg, -100, 1.0f);
  p.grads = host_f32(llama_grads(m), llama_param_count(m));
  return p;
}

// Losses of `steps` AdamW steps on one batch, from the same init.
static void train(Llama *m, const Recipe *r, const int *in, const int *tg, int steps, float *losses) {
  cuda_set_recipe(CB, r, llama_config(m)->n_layers, SEED);
  llama_init(m, 1234);
  size_t n = llama_param_count(m);
  float *mo = (float *)G->alloc(G->ctx, n * 4), *v = (float *)G->alloc(G->ctx, n * 4);
  G->zero(G->ctx, mo, n * 4), G->zero(G->ctx, v, n * 4);
  for (int t = 0; t < steps; t++) {
    llama_zero_grad(m);
    G->set_step(G->ctx, t, 0);
    losses[t] = llama_forward_backward(m, in, tg, -100, 1.0f);
    G->adamw(G->ctx, llama_params(m), llama_grads(m), mo, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, t + 1);
  }
  G->release(G->ctx, mo), G->release(G->ctx, v);
}

static void test_model(void) {
  LlamaConfig c;
  memset(&c, 0, sizeof c);
  c.vocab_size = 512, c.dim = 256, c.n_layers = 4, c.n_heads = 4, c.n_kv_heads = 2, c.ffn_dim = 512;
  c.max_seq_len = 128, c.norm_eps = 1e-5f, c.rope_theta = 500000.0f;
  const int B = 4, T = 128, N = B * T;
  // m runs several recipes, so it keeps every BF16 input: created under the BF16 recipe (an FP4
  // recipe left by an earlier test would let it drop them, and the BF16 passes below then die).
  cuda_set_recipe(CB, NULL, 0, 0);
  Llama *m = llama_create(&c, B, T, G);
  int *in = (int *)xmalloc(N * sizeof(int)), *tg = (int *)xmalloc(N * sizeof(int));
  for (int n = 0; n < N; n++) in[n] = (int)(rng_u64(&rng) % c.vocab_size);
  for (int n = 0; n < N; n++) tg[n] = n % T == T - 1 ? -100 : in[n + 1];
  size_t np = llama_param_count(m);

  Recipe mx = mx_recipe(GEMM_FP8_EMBED), all_bf16 = mx;
  all_bf16.bf16_last = c.n_layers;
  Pass warm = model_pass(m, NULL, in, tg);  // builds every BF16 GEMM plan first
  Pass bf = model_pass(m, NULL, in, tg), fp = model_pass(m, &mx, in, tg), ov = model_pass(m, &all_bf16, in, tg);
  printf("  tiny model loss: bf16 %.5f, mxfp4 %.5f, mxfp4 with every block overridden to BF16 %.5f\n", bf.loss, fp.loss,
         ov.loss);
  CHECK(fabs(fp.loss - bf.loss) < 0.02 * bf.loss, "mxfp4 loss %.5f vs bf16 %.5f", fp.loss, bf.loss);
  double worst = 0;
  for (int i = 0; i < llama_num_tensors(m); i++) {
    const ParamTensor *t = llama_tensor(m, i);
    double e = rel_err(fp.grads + t->offset, bf.grads + t->offset, t->numel);
    printf("    gradient %-14s rel L2 vs bf16 %.4f\n", t->name, e);
    // One FP4 GEMM is 0.16-0.20 off BF16 (measured above); a gradient here went through up to 28 of
    // them in the backward of 4 blocks, and the errors add roughly in quadrature, so the H200 gave
    // 0.36-0.64 at this random init. A wiring bug (wrong operand or layout, a missing Hadamard on one
    // side, a stale W^T) makes the two uncorrelated: rel L2 near sqrt(2) = 1.41 or worse. 0.8 keeps
    // the margin to both (the loss, the 10 steps below and the exact checks above carry the rest).
    CHECK(e < 0.8, "gradient %s: mxfp4 vs bf16 rel L2 %.4f", t->name, e);
    if (e > worst) worst = e;
  }
  printf("  worst gradient rel L2 %.4f\n", worst);
  CHECK(ov.loss == bf.loss, "all blocks overridden to BF16: loss %.9g differs from the BF16 run's %.9g", ov.loss,
        bf.loss);
  CHECK(!memcmp(ov.grads, bf.grads, np * sizeof(float)), "all blocks overridden to BF16: gradients not bit-identical");

  // k/v reuse q's quantized x and up reuses gate's (forward and Wgrad copies): no bit may change,
  // for MXFP4 (fp8 path) and NVFP4 (with its amax), in a multi-block model.
  Recipe nv = mx;
  nv.format = FMT_NVFP4, nv.gemm = GEMM_REFERENCE, nv.hadamard = 16;
  const Recipe *shared_recipes[2] = {&mx, &nv};
  cuda_set_deterministic_attention(CB, 1);  // so that only the sharing could make a difference
  for (int k = 0; k < 2; k++) {
    Pass on = model_pass(m, shared_recipes[k], in, tg);
    linear_fp4_set_share_x(LF, 0);
    Pass off = model_pass(m, shared_recipes[k], in, tg);
    linear_fp4_set_share_x(LF, 1);
    CHECK(on.loss == off.loss && !memcmp(on.grads, off.grads, np * sizeof(float)),
          "%s: sharing x's quantization across q/k/v and gate/up changed the loss (%.9g vs %.9g) or gradients",
          k ? "nvfp4" : "mxfp4", on.loss, off.loss);
    printf("  %s: shared x quantization bit-identical to per-linear (loss %.6f)\n", k ? "nvfp4" : "mxfp4", on.loss);
    free(on.grads), free(off.grads);
  }
  // Saved tensors kept quantized: with input saving on (the default for a model that keeps its
  // activations) the forwards of q, gate and down keep x's Wgrad copy and the backward reads it;
  // off, the backward requantizes the BF16 x. No bit may change.
  for (int k = 0; k < 2; k++) {
    linear_fp4_set_save_inputs(LF, 1);
    Pass on = model_pass(m, shared_recipes[k], in, tg);
    size_t saved = linear_fp4_saved_bytes(LF);
    linear_fp4_set_save_inputs(LF, 0);
    Pass off = model_pass(m, shared_recipes[k], in, tg);
    linear_fp4_set_save_inputs(LF, 1);
    CHECK(saved > 0, "%s: the forward kept no quantized input", k ? "nvfp4" : "mxfp4");
    CHECK(on.loss == off.loss && !memcmp(on.grads, off.grads, np * sizeof(float)),
          "%s: the Wgrad copy of x kept from the forward changed the loss (%.9g vs %.9g) or gradients",
          k ? "nvfp4" : "mxfp4", on.loss, off.loss);
    printf("  %s: x's Wgrad copy kept from the forward (%.2f MB) bit-identical to requantizing x\n",
           k ? "nvfp4" : "mxfp4", saved / 1e6);
    free(on.grads), free(off.grads);
  }

  // Format-aware fusion: with saving on, the attention and FFN norms and SwiGLU run inside the
  // producers of q's, gate's and down's FP4 inputs (model/cuda/quant_fused.h; their BF16 outputs are never
  // written), and on the FP8 path the o and down projections add the residual in their GEMM's epilogue
  // (Ops.matmul_residual_fwd), and SwiGLU with down's producers runs in up's GEMM epilogue (Ops.matmul_swiglu_fwd,
  // CUTLASS on Hopper). Off, the ops write BF16, the linears quantize it and the residual add is a
  // kernel of its own. No bit may change: H32 and no Hadamard, FP8 and exact-reference GEMMs.
  {
    // mx as it ships (precision.fusion auto: not the fusions yet to run on a GPU), then every fusion
    Recipe on = mx, noh = mx, ref = mx, xt = mx;
    noh.hadamard = 0, ref.gemm = GEMM_REFERENCE, ref.wgrad_2d = WGRAD_2D_OFF, xt.wgrad_2d = WGRAD_2D_X;
    on.fusion = noh.fusion = ref.fusion = xt.fusion = FUSION_ON;
    const Recipe *fr[5] = {&mx, &on, &noh, &ref, &xt};
    const char *fname[5] = {"mxfp4 H32 fp8, fusion auto", "mxfp4 H32 fp8", "mxfp4 no Hadamard",
                            "mxfp4 H32 reference GEMM", "mxfp4 H32 fp8, x^T in 128x128 tiles"};
    linear_fp4_set_save_inputs(LF, 1);
    for (int k = 0; k < 5; k++) {
      const int new_ones = fr[k]->fusion == FUSION_ON && fr[k]->gemm == GEMM_FP8_EMBED;
      long before = linear_fp4_fused_calls(LF);
      Pass on = model_pass(m, fr[k], in, tg);
      long fused = linear_fp4_fused_calls(LF) - before;
      Recipe unfused = *fr[k];
      unfused.fusion = FUSION_OFF;
      Pass off = model_pass(m, &unfused, in, tg);
      cuda_set_recipe(CB, fr[k], c.n_layers, SEED);  // for the question below
      const int res_fused = linear_fp4_fuses_residual(LF, (LinearId){0, LIN_O}) &&
                            linear_fp4_fuses_residual(LF, (LinearId){c.n_layers - 1, LIN_DOWN});
      CHECK(res_fused == new_ones, "%s: the residual add in the o and down epilogues: %s", fname[k],
            res_fused ? "yes" : "no");
      // and SwiGLU with down's producers in up's GEMM epilogue (CUTLASS on Hopper; N and F multiples of 128)
      const int swi_fused = linear_fp4_fuses_swiglu(LF, (LinearId){0, LIN_UP}, (LinearId){0, LIN_DOWN}, N, c.ffn_dim);
      CHECK(swi_fused == (new_ones && fp4_gemm_cutlass_available()), "%s: SwiGLU in up's GEMM epilogue: %s", fname[k],
            swi_fused ? "yes" : "no");
      // per block: both norms and SwiGLU forward (in up's epilogue or in down's producer)
      const long per_block = 3;
      CHECK(fused == per_block * c.n_layers, "%s: %ld fused producers ran, expected %ld per block (%ld)", fname[k],
            fused, per_block, per_block * c.n_layers);
      CHECK(on.loss == off.loss && !memcmp(on.grads, off.grads, np * sizeof(float)),
            "%s: fused RMSNorm/SwiGLU producers%s changed the loss (%.9g vs %.9g) or gradients", fname[k],
            res_fused ? " and residual epilogues" : "", on.loss, off.loss);
      if (on.loss == off.loss && !memcmp(on.grads, off.grads, np * sizeof(float)))
        printf(
            "  %s: RMSNorm and SwiGLU fused into the producers (%ld per pass)%s bit-identical to unfused (loss %.6f)\n",
            fname[k], fused, res_fused ? ", the residual adds into the o/down epilogues," : "", on.loss);
      if (swi_fused && on.loss == off.loss) printf("  %s: ... and with SwiGLU in up's GEMM epilogue\n", fname[k]);
      free(on.grads), free(off.grads);
    }
  }

  {  // the tiled Wgrad copies (dY^T by default, x^T above) were made and counted
    unsigned long long rounded, blocks;
    linear_fp4_tile_stats(LF, &rounded, &blocks);
    printf("  FP8 Wgrad tiles so far: %llu of %llu 32-blocks outside the exact embedding range\n", rounded, blocks);
    CHECK(blocks > 0 && rounded <= blocks, "tile stats: %llu rounded of %llu blocks", rounded, blocks);
  }
  const int steps = 10;
  float lb[10], lf[10];
  train(m, NULL, in, tg, steps, lb);
  train(m, &mx, in, tg, steps, lf);
  printf("  10 AdamW steps on one batch: bf16 %.4f -> %.4f, mxfp4 %.4f -> %.4f\n", lb[0], lb[steps - 1], lf[0],
         lf[steps - 1]);
  double db = lb[0] - lb[steps - 1], df = lf[0] - lf[steps - 1];
  CHECK(db > 0.1, "the BF16 run did not learn the batch (%.4f -> %.4f)", lb[0], lb[steps - 1]);
  CHECK(df > 0.7 * db, "mxfp4 loss fell by %.4f, BF16's by %.4f", df, db);
  // A model created under the mxfp4 recipe keeps no BF16 input of its FP4 linears (one shared
  // scratch instead): less activation memory, and the same loss and gradients as m computes with
  // every BF16 input kept.
  cuda_set_deterministic_attention(CB, 1);
  Pass ref = model_pass(m, &mx, in, tg);
  cuda_set_recipe(CB, &mx, c.n_layers, SEED);
  Llama *m2 = llama_create(&c, B, T, G);  // binds its own parameters: m is done
  size_t act = llama_activation_bytes(m2), plain = llama_activation_bytes_plain(m2);
  Pass p2 = model_pass(m2, &mx, in, tg);
  cuda_set_deterministic_attention(CB, 0);
  size_t saved = linear_fp4_saved_bytes(LF);
  printf("  mxfp4 model: activations %.2f MB + %.2f MB kept quantized, against %.2f MB with every BF16 input kept\n",
         act / 1e6, saved / 1e6, plain / 1e6);
  CHECK(act + saved < plain, "keeping quantized inputs saves memory: %zu + %zu vs %zu bytes", act, saved, plain);
  CHECK(p2.loss == ref.loss && !memcmp(p2.grads, ref.grads, np * sizeof(float)),
        "mxfp4 model without BF16 inputs: loss %.9g vs %.9g, or gradients differ", p2.loss, ref.loss);
  // Gradient accumulation: the weights are quantized once per optimizer step (per weights version),
  // not once per micro-batch: after each AdamW, 4 micro-batches quantize each of the 7 x n_layers
  // weights once.
  float *mo = (float *)G->alloc(G->ctx, np * 4), *v = (float *)G->alloc(G->ctx, np * 4);
  G->zero(G->ctx, mo, np * 4), G->zero(G->ctx, v, np * 4);
  for (int t = 1; t <= 2; t++) {
    G->adamw(G->ctx, llama_params(m2), llama_grads(m2), mo, v, np, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, t);
    long q0 = linear_fp4_weight_quantizations(LF);
    llama_zero_grad(m2);
    for (int micro = 0; micro < 4; micro++) {
      G->set_step(G->ctx, t, micro);
      llama_forward_backward(m2, in, tg, -100, 0.25f);
    }
    long q = linear_fp4_weight_quantizations(LF) - q0;
    CHECK(q == 7L * c.n_layers,
          "optimizer step %d, 4 micro-batches: %ld weight quantizations (expected %d, one per weight)", t, q,
          7 * c.n_layers);
  }
  G->release(G->ctx, mo), G->release(G->ctx, v);
  cuda_set_recipe(CB, NULL, 0, 0);
  free(warm.grads), free(bf.grads), free(fp.grads), free(ov.grads), free(ref.grads), free(p2.grads);
  free(in), free(tg);
  llama_free(m2);
  llama_free(m);
}

// ---- the paper's routes against the CPU reference (model/cpu/linear_fp4.c) ------------------------

// Each route's GPU linear against the CPU reference of the same route on the same BF16 data, for each
// block of a 2-block model (the depth hybrid's blocks run different formats), on both GEMM back ends
// of Hopper. The quantized operands are the reference's bytes (SR from the same Philox bits), so only
// the accumulation order and the BF16 output rounding differ: relative L2 1e-5 for the fp32 Wgrad,
// 4e-3 for the BF16 Fprop and Dgrad (one rounding, 2^-9 relative at most). A wrong format for one
// contraction errs by ~0.1, a wrong scale or outer factor by ~1.
static void test_routes(int N, int in, int out) {
  struct {
    const char *name;
    RecipeSpec s;
  } routes[] = {
      {"custom global NVFP4", {"nvfp4", "dgrad", "none", "on"}},
      {"CTA-local NVFP4", {"nvfp4_cta", "dgrad", "none", "on"}},
      {"CTA-local NVFP4 + H16", {"nvfp4_cta", "dgrad", "h16", "on"}},
      {"CTA-local NVFP4 + plain H16, 1D weights", {"nvfp4_cta", "dgrad_wgrad", "h16_plain", "off"}},
      {"27/5 depth hybrid (blocks 1 / 2)", {"nvfp4_cta", "dgrad", "none", "on"}},
      {"operand hybrid + plain H16", {"mxfp4", "dgrad", "h16_plain", "on"}},
      {"operand hybrid + H32", {"mxfp4", "dgrad", "h32", "on"}},
      {"Fprop BF16, Dgrad CTA-local, Wgrad MXFP4", {"mxfp4", "dgrad", "h32", "on"}},
  };
  routes[4].s.blocks = "mxfp4:2-2";
  routes[5].s.dgrad = routes[6].s.dgrad = "nvfp4_cta";
  routes[7].s.fprop = "bf16", routes[7].s.dgrad = "nvfp4_cta";
  float *hw = randn_bf16((size_t)in * out, 0.02f), *hx = randn_bf16((size_t)N * in, 1.0f);
  float *hdy = randn_bf16((size_t)N * out, 0.01f);
  for (size_t i = 0; i < (size_t)N * in; i += 97) hx[i] *= 64.0f;  // outliers: chunks and stripes differ
  Lin L = lin_create(N, in, out, hw, hx, hdy);
  const size_t ny = (size_t)N * out, nx = (size_t)N * in, nw = (size_t)in * out;
  float *ry = (float *)xmalloc(ny * 4), *rdx = (float *)xmalloc(nx * 4), *rdw = (float *)xmalloc(nw * 4);
  const int64_t step = 5;
  const int micro = 2;
  for (size_t k = 0; k < sizeof routes / sizeof routes[0]; k++) {
    for (int layer = 0; layer < 2; layer++) {
      const LinearId id = {layer, LIN_GATE};
      LinearFp4Cpu c = linear_fp4_cpu_route(&routes[k].s, 2, SEED);
      c.step = (uint32_t)step, c.micro = (uint32_t)micro;
      linear_fp4_cpu_forward(&c, id, ry, hx, hw, N, in, out);
      memset(rdw, 0, nw * 4);
      linear_fp4_cpu_backward(&c, id, rdx, rdw, hdy, hx, hw, N, in, out, 0);
      for (int g = 0; g < 2; g++) {
        RecipeSpec s = routes[k].s;
        s.fp4_gemm = g ? "reference" : "auto";
        Recipe r;
        char err[256];
        if (recipe_resolve(&r, &s, 90, err, sizeof err)) die("%s: %s", routes[k].name, err);
        LinResult a = lin_run_at(&L, &r, 2, id, step, micro);
        double e[3] = {rel_err(a.y, ry, ny), rel_err(a.dx, rdx, nx), rel_err(a.dw, rdw, nw)};
        printf("  %-42s block %d %-9s: fprop %.3g dgrad %.3g wgrad %.3g\n", routes[k].name, layer + 1,
               g ? "reference" : "auto", e[0], e[1], e[2]);
        CHECK(e[0] < 4e-3 && e[1] < 4e-3 && e[2] < 1e-5, "%s block %d (%s): GPU vs CPU reference %.3g %.3g %.3g",
              routes[k].name, layer + 1, g ? "reference" : "auto", e[0], e[1], e[2]);
        result_free(&a);
      }
    }
  }
  // Accumulating Dgrad (q, k and v add into one dX): the CTA epilogue adds in fp32 before rounding.
  {
    RecipeSpec s = routes[1].s;
    Recipe r;
    char err[256];
    if (recipe_resolve(&r, &s, 90, err, sizeof err)) die("%s", err);
    const LinearId id = {0, LIN_GATE};
    LinResult a = lin_run_at(&L, &r, 1, id, step, micro);
    G->matmul_bwd(G->ctx, id, L.dx, NULL, L.dy, L.x, L.w, N, in, out, 1);  // dX += the same Dgrad
    float *twice = host_bf16(L.dx, nx);
    double worst = 0;
    for (size_t i = 0; i < nx; i++) {
      double d = fabs(twice[i] - 2.0 * a.dx[i]);
      worst = d > worst ? d : worst;
    }
    CHECK(worst == 0, "CTA-local Dgrad with dx_accumulate: dX + dX differs from 2 dX by %g", worst);
    free(twice);
    result_free(&a);
  }
  cuda_set_recipe(CB, NULL, 0, 0);
  free(ry), free(rdx), free(rdw);
  lin_free(&L);
  free(hw), free(hx), free(hdy);
}

int main(void) {
  GPU_OPS_TEST_BEGIN(42);

  TEST_SECTION("FP8-embedded vs reference vs BF16: Fprop, Dgrad, Wgrad (mxfp4 recipe)");
  test_paths(256, 256, 512);
  test_paths(512, 1024, 256);
  test_paths(8192, 4096, 4096);
  TEST_SECTION("stochastic rounding of dY for Dgrad: unbiased, reproducible per (step, micro)");
  test_sr();
  TEST_SECTION("H32 on the Wgrad operands: cancels, and helps on outlier tokens");
  test_hadamard();
  TEST_SECTION("quantized weights: once per weights version, refreshed after adamw");
  test_weight_cache();
  TEST_SECTION("the paper's routes per block and contraction: GPU linear vs the CPU reference");
  test_routes(256, 512, 768);
  test_routes(512, 384, 1024);  // partial stripes (384 = 256 + 128) and chunks
  TEST_SECTION("tiny Llama (L=4): mxfp4 vs bf16 loss, gradients, 10 steps; BF16 overrides bit-identical");
  test_model();
  TEST_END();
}
