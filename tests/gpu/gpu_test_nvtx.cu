// tests/gpu/gpu_test_nvtx.cu: logging.nvtx's ranges (model/cuda/nvtx.cu) change nothing but the
// timeline: two CUDA backend instances, one with the ranges, run the same 2-layer model (BF16, and
// MXFP4 with stochastic rounding) from the same init, and give the same bits: loss, every gradient,
// the logits and the scored tokens' log-likelihoods. The wrapped table keeps the plain one's entries
// behind its wrappers, sets range_push/range_pop (NULL without the ranges), leaves NULL entries NULL,
// and wrapping twice changes nothing. Both instances are deterministic (cuBLASLt's heuristic GEMM
// algorithms, cuDNN's deterministic attention backward), so any difference is the wrappers'.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/gemm_plans.h"
#include "fp4/recipe.h"
#include "model/cuda/ops_cuda.h"
#include "model/llama.h"
#include "model/ops.h"
#include "tests/gpu/gpu_util.h"
#include "tests/gpu/nvtx_model.h"
#include "tests/test.h"

// The model's loss, gradients, logits and four tokens' log-likelihoods on one batch.
typedef struct {
  float loss, *grads, *logits, nll[4];
  size_t np;
} Result;

static Result run(const Ops *ops, const char *recipe, const int *in, const int *tg) {
  Llama *m = nvtx_model(ops, recipe);
  Result res;
  res.loss = llama_forward_backward(m, in, tg, -1, 1.0f);
  res.np = llama_param_count(m);
  res.grads = (float *)xmalloc(res.np * sizeof(float));
  ops->download(ops->ctx, res.grads, llama_grads(m), res.np * sizeof(float));
  res.logits = (float *)xmalloc((size_t)NVTX_N * NVTX_VOCAB * sizeof(float));
  llama_logits(m, in, res.logits);
  const int pos[4] = {0, 17, 64, 127}, want[4] = {tg[0], tg[17], tg[64], 5};
  llama_token_nll(m, in, 4, pos, want, res.nll);
  llama_free(m);
  return res;
}

int main(void) {
  char err[256];
  // deterministic, W^T copies, device 0, nvtx, cuBLASLt's heuristic GEMMs (the same in both instances)
  const BackendOptions no_ranges = {1, 1, 0, 0, GEMM_HEURISTIC, NULL}, with_ranges = {1, 1, 0, 1, GEMM_HEURISTIC, NULL};
  const Ops *plain = cuda_backend_open(&no_ranges, err, sizeof err);
  CHECK(plain != NULL, "a CUDA backend: %s", err);
  if (!plain) TEST_END();
  const Ops *ranged = cuda_backend_open(&with_ranges, err, sizeof err);
  CHECK(ranged != NULL, "a second CUDA backend, with NVTX ranges: %s", err);
  if (!ranged) TEST_END();

  TEST_SECTION("the wrapped table");
  CudaBackend *rb = cuda_backend_of(ranged);
  CHECK(!plain->range_push && !plain->range_pop, "no ranges: range_push and range_pop are NULL");
  CHECK(ranged->range_push && ranged->range_pop, "with ranges: range_push and range_pop are set");
  CHECK(ranged->rmsnorm_fwd != plain->rmsnorm_fwd && rb->nvtx_inner.rmsnorm_fwd == plain->rmsnorm_fwd &&
            ranged->matmul_bwd != plain->matmul_bwd && rb->nvtx_inner.matmul_bwd == plain->matmul_bwd,
        "the ops are wrapped, the plain entries kept behind them");
  CHECK(ranged->mem_peak == plain->mem_peak && ranged->set_recipe == plain->set_recipe,
        "entries that queue no GPU work are not wrapped");
  CHECK((ranged->rmsnorm_fwd_into == NULL) == (plain->rmsnorm_fwd_into == NULL), "a NULL entry stays NULL");
  Ops before = *ranged;
  cuda_nvtx_wrap(rb);
  CHECK(!memcmp(&before, ranged, sizeof before), "wrapping twice changes nothing");

  int in[NVTX_N], tg[NVTX_N];
  nvtx_batch(in, tg);
  const char *recipes[] = {"bf16", "mxfp4"};
  for (int k = 0; k < 2; k++) {
    char what[64];
    snprintf(what, sizeof what, "%s: the same bits with and without ranges", recipes[k]);
    TEST_SECTION(what);
    Result a = run(plain, recipes[k], in, tg), b = run(ranged, recipes[k], in, tg);
    CHECK(a.loss == b.loss && isfinite(a.loss), "loss %.9g vs %.9g", a.loss, b.loss);
    CHECK(a.np == b.np && !memcmp(a.grads, b.grads, a.np * sizeof(float)), "every gradient (%zu floats)", a.np);
    CHECK(!memcmp(a.logits, b.logits, (size_t)NVTX_N * NVTX_VOCAB * sizeof(float)), "the logits");
    CHECK(!memcmp(a.nll, b.nll, sizeof a.nll), "the scored tokens' log-likelihoods");
    free(a.grads), free(a.logits), free(b.grads), free(b.logits);
  }
  TEST_END();
}
