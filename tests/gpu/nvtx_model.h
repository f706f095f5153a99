// tests/gpu/nvtx_model.h: the 2-layer model and the batch that both NVTX tests run (gpu_test_nvtx.cu
// and gpu_test_nvtx_ranges.cu, separate binaries since NVTX's tool injection is process-wide).
#pragma once
#include <string.h>

#include "common/common.h"
#include "fp4/recipe.h"
#include "model/cuda/ops_cuda.h"
#include "model/llama.h"
#include "model/ops.h"

enum { NVTX_B = 2, NVTX_T = 64, NVTX_N = NVTX_B * NVTX_T, NVTX_VOCAB = 512 };

// A fresh model under `recipe` ("mxfp4", or "mxfp4:on" with a precision.fusion value; set on the backend
// first: the activation layout depends on it), initialized from seed 1234, at step 3 with zeroed gradients.
static Llama *nvtx_model(const Ops *ops, const char *recipe) {
  LlamaConfig c;
  memset(&c, 0, sizeof c);
  c.vocab_size = NVTX_VOCAB, c.dim = 128, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.ffn_dim = 384;
  c.max_seq_len = NVTX_T, c.norm_eps = 1e-5f, c.rope_theta = 500000.0f;
  Recipe r;
  RecipeSpec spec;
  memset(&spec, 0, sizeof spec);
  char name[32];
  const char *colon = strchr(recipe, ':');
  snprintf(name, sizeof name, "%.*s", colon ? (int)(colon - recipe) : (int)strlen(recipe), recipe);
  spec.recipe = name, spec.fusion = colon ? colon + 1 : NULL;
  char err[256];
  if (recipe_resolve(&r, &spec, cuda_device_cc(), err, sizeof err)) die("%s", err);
  ops->set_recipe(ops->ctx, &r, c.n_layers, 7);
  Llama *m = llama_create(&c, NVTX_B, NVTX_T, ops);
  llama_init(m, 1234);
  ops->set_step(ops->ctx, 3, 0);
  llama_zero_grad(m);
  return m;
}

// The batch: NVTX_N random inputs and targets, seed 99.
static void nvtx_batch(int *in, int *tg) {
  Rng rng;
  rng_seed(&rng, 99);
  for (int n = 0; n < NVTX_N; n++) in[n] = (int)(rng_u64(&rng) % NVTX_VOCAB), tg[n] = (int)(rng_u64(&rng) % NVTX_VOCAB);
}
