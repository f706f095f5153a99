// run/bench.c: see bench.h. Method (the same as ../shared/peers/torch_llama_peer.py, so the two are
// comparable): time a training step (forward, backward, global-norm clip, AdamW) at depths a and b,
// take the per-layer time (t_b - t_a) / (b - a), extrapolate t_L = t_a + (L - a) * per_layer, and
// report tokens/s and MFU by the paper's formula at L layers. The optimizer is stepped every
// micro-batch, as the peer does; a second figure amortizes it over gradient accumulation
// (global_batch / micro_batch micro-batches per optimizer step).
#include "run/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/adamw.h"
#include "run/ckpt_async.h"
#include "model/llama.h"
#include "run/bench_attention.h"
#include "fp4/recipe.h"

typedef struct {
  int layers;
  double step_s;        // forward + backward + optimizer
  double fwdbwd_s;      // forward + backward only
  double opt_s;         // optimizer only (grad norm + AdamW over all tensors)
  double mem_gb;        // peak device memory of this depth
  double act_gb;        // activations kept for the backward at this depth: the model's arena
                        // (llama_activation_bytes) plus the backend's saved quantized inputs
  double act_plain_gb;  // the same with every BF16 input kept, as the BF16 recipe keeps them
  float loss;
} Timing;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void optimizer(const Ops *op, Llama *m, float *am, float *av, const TrainConfig *c, int64_t t) {
  float *g = llama_grads(m), *p = llama_params(m);
  float norm = (float)sqrt(op->grad_sumsq(op->ctx, g, llama_param_count(m)));
  float scale = clip_scale(norm, c->grad_clip);
  for (int i = 0; i < llama_num_tensors(m); i++) {
    const ParamTensor *pt = llama_tensor(m, i);
    op->adamw(op->ctx, p + pt->offset, g + pt->offset, am + pt->offset, av + pt->offset, pt->numel, c->lr, c->beta1,
              c->beta2, c->eps, pt->decay || c->decay_norms ? c->weight_decay : 0.0f, scale, t);
  }
}

// One depth of one block kind: every block of the model runs `recipe` (uniform: no spans, no BF16
// ends), set before the model, whose activation layout depends on it (model/llama.h).
static Timing time_depth(TrainConfig *cfg, const Ops *op, const Recipe *recipe, int layers, int steps, int profile) {
  LlamaConfig mc = cfg->model;
  mc.n_layers = layers;
  const int B = cfg->micro_batch, T = cfg->seq_len, N = B * T;
  if (op->set_recipe) op->set_recipe(op->ctx, recipe, layers, cfg->seed);
  Llama *m = llama_create_ex(&mc, B, T, op, llama_recompute_parse(cfg->recompute));
  llama_init(m, cfg->seed);
  size_t n = llama_param_count(m);
  float *am = op->alloc(op->ctx, n * sizeof(float)), *av = op->alloc(op->ctx, n * sizeof(float));
  op->zero(op->ctx, am, n * sizeof(float));
  op->zero(op->ctx, av, n * sizeof(float));
  int *inputs = xmalloc(N * sizeof(int)), *targets = xmalloc(N * sizeof(int));
  Rng r;
  rng_seed(&r, cfg->seed);
  for (int i = 0; i < N; i++) inputs[i] = (int)(rng_u64(&r) % mc.vocab_size);
  LlamaDocs docs = {!strcmp(cfg->doc_mask, "block_causal"), !strcmp(cfg->doc_positions, "restart"), cfg->bos_id};
  llama_set_docs(m, &docs);
  if (docs.block_causal || docs.restart_positions)  // documents need BOS tokens: web-like lengths
    bench_web_documents(inputs, N, mc.vocab_size, cfg->bos_id, WEB_DOC_MEAN, WEB_DOC_SIGMA, cfg->seed);
  for (int i = 0; i < N; i++) targets[i] = i + 1 < N ? inputs[i + 1] : inputs[0];

  Timing tm = {.layers = layers,
               .act_gb = llama_activation_bytes(m) / 1e9,
               .act_plain_gb = llama_activation_bytes_plain(m) / 1e9};
  int64_t t = 0;
  for (int w = 0; w < 2; w++) {  // warm-up: GEMM autotuning, cuDNN graph builds, allocations
    llama_zero_grad(m);
    llama_forward_backward(m, inputs, targets, cfg->ignore_index, 1.0f);
    optimizer(op, m, am, av, cfg, ++t);
  }
  // Each quantity is the median of `steps` individually synced repetitions, robust to the odd slow
  // step (clock changes, host hiccups) that a mean over a handful of steps is not.
  double *ts = xmalloc(steps * sizeof(double));
  for (int phase = 0; phase < 3; phase++) {
    for (int s = 0; s < steps; s++) {
      op->sync(op->ctx);
      double t0 = now_seconds();
      if (phase < 2) {
        op->set_step(op->ctx, t, 0);
        llama_zero_grad(m);
        float loss = llama_forward_backward(m, inputs, targets, cfg->ignore_index, 1.0f);
        if (phase == 0) tm.loss = loss;
      }
      if (phase != 1) optimizer(op, m, am, av, cfg, ++t);
      op->sync(op->ctx);
      ts[s] = now_seconds() - t0;
    }
    double med = median(ts, steps);
    if (phase == 0) tm.step_s = med;
    else if (phase == 1) tm.fwdbwd_s = med;
    else tm.opt_s = med;
  }
  free(ts);
  if (op->mem_peak) tm.mem_gb = op->mem_peak(op->ctx) / 1e9;
  if (op->fp4_saved_bytes) tm.act_gb += op->fp4_saved_bytes(op->ctx) / 1e9;  // the FP4 copies the forwards kept
  if (profile && op->profile) {  // one more profiled step: where the time goes, each kernel against its ceiling
    op->profile(op->ctx, 1);
    llama_zero_grad(m);
    llama_forward_backward(m, inputs, targets, cfg->ignore_index, 1.0f);
    optimizer(op, m, am, av, cfg, ++t);
    op->sync(op->ctx);
    op->profile(op->ctx, 0);
    printf("\nwhere the time goes: one step at %d layers, B=%d, T=%d\n", layers, B, T);
    op->profile_report(op->ctx, stdout, 1);
  }
  free(inputs);
  free(targets);
  op->release(op->ctx, am);
  op->release(op->ctx, av);
  llama_free(m);
  if (op->mem_reset_peak) op->mem_reset_peak(op->ctx);
  return tm;
}

// The block kinds of the full model: a route that mixes formats by depth (precision.blocks, BF16 ends)
// has a per-layer cost per kind, so each kind is timed alone at the two depths, as a uniform model of
// that kind, and the extrapolation adds each kind's per-layer cost times its number of blocks. The
// depth-0 part (embedding, head, their optimizer) is the first kind's, the kind of most blocks.
typedef struct {
  Recipe r;   // uniform: every block in this kind
  int count;  // blocks of the full model in this kind
} BlockKind;

// Each kind alone is a route of its own, checked as the back end will check it (dies naming the kind).
static int block_kinds(const Recipe *full, int L, BlockKind *kinds) {
  int n = 0;
  for (int l = 0; l < L; l++) {
    FP4Format f = recipe_block_format(full, l, L);
    int k = 0;
    while (k < n && kinds[k].r.format != f) k++;
    if (k == n) {
      kinds[n].r = *full;
      kinds[n].r.format = f;
      kinds[n].r.nspans = 0;
      kinds[n].r.bf16_first = kinds[n].r.bf16_last = 0;
      if (f == FMT_BF16)  // a BF16 block has no contraction in another format
        for (int c = 0; c < CONTR_N; c++) kinds[n].r.contraction[c] = 0;
      // The route's FP8 embedding serves its MXFP4 blocks; a kind without MXFP4 runs its NVFP4 forms
      // through BF16 in the route too (model/cuda/linear_fp4.cu), so alone it is the reference GEMM.
      if (kinds[n].r.gemm == GEMM_FP8_EMBED && !recipe_uses(&kinds[n].r, 1, FMT_MXFP4))
        kinds[n].r.gemm = GEMM_REFERENCE, kinds[n].r.wgrad_2d = WGRAD_2D_OFF,
        kinds[n].r.fp8_kernel = FP8_KERNEL_CUBLASLT;
      char err[256];
      if (recipe_check(&kinds[n].r, err, sizeof err))
        die("--bench: the %s blocks alone: %s", recipe_format_name(f), err);
      kinds[n++].count = 0;
    }
    kinds[k].count++;
  }
  for (int i = 1; i < n; i++)  // most blocks first
    for (int j = i; j > 0 && kinds[j].count > kinds[j - 1].count; j--) {
      BlockKind t = kinds[j];
      kinds[j] = kinds[j - 1], kinds[j - 1] = t;
    }
  return n;
}

int bench_main(TrainConfig *cfg, const Ops *op, const Recipe *recipe, const char *layers, int steps) {
  int la, lb;
  if (sscanf(layers, "%d,%d", &la, &lb) != 2 || la < 1 || lb <= la)
    die("--layers: expected two increasing depths like 2,4, got '%s'", layers);
  const int L = cfg->model.n_layers, B = cfg->micro_batch, T = cfg->seq_len;
  const double tokens = (double)B * T, flops = llama_flops_per_token(&cfg->model, T);
  const int accum = cfg->global_batch / cfg->micro_batch;
  printf(
      "bench: %s backend, recipe %s, model %s at depths %d and %d -> %d layers, micro-batch %d x %d tokens, %d steps "
      "each\n",
      op->name, cfg->recipe, cfg->model_preset, la, lb, L, B, T, steps);
  const Recipe full = *recipe;
  char err[256];
  if (recipe_check_layers(&full, L, err, sizeof err)) die("%s", err);
  BlockKind kinds[FMT_N];
  const int nk = block_kinds(&full, L, kinds);
  if (nk > 1) {
    printf("bench: the route mixes formats by depth:");
    for (int k = 0; k < nk; k++)
      printf("%s %d blocks %s", k ? "," : "", kinds[k].count, recipe_format_name(kinds[k].r.format));
    printf(" of %d; each kind is timed alone at both depths and weighted by its blocks\n", L);
  }
  if (op->library_report) op->library_report(op->ctx, stdout);
  fflush(stdout);
  // per kind: the two depths; the extrapolation sums the kinds' per-layer parts
  Timing ta[FMT_N] = {{0}}, tb[FMT_N] = {{0}};
  for (int k = 0; k < nk; k++) {
    ta[k] = time_depth(cfg, op, &kinds[k].r, la, steps, 0);
    tb[k] = time_depth(cfg, op, &kinds[k].r, lb, steps, k == 0);
  }
  const Timing a = ta[0], b = tb[0];
  double per[4] = {0};  // sum over kinds of count x per-layer: step, fwd+bwd, optimizer, memory
  for (int k = 0; k < nk; k++) {
    const double c = (double)kinds[k].count / (lb - la);
    per[0] += c * (tb[k].step_s - ta[k].step_s), per[1] += c * (tb[k].fwdbwd_s - ta[k].fwdbwd_s);
    per[2] += c * (tb[k].opt_s - ta[k].opt_s), per[3] += c * (tb[k].mem_gb - ta[k].mem_gb);
  }
  // depth 0 from the first kind, then every block of the full model
  double t_full = a.step_s - la * (b.step_s - a.step_s) / (lb - la) + per[0];
  double fb_full = a.fwdbwd_s - la * (b.fwdbwd_s - a.fwdbwd_s) / (lb - la) + per[1];
  double opt_full = a.opt_s - la * (b.opt_s - a.opt_s) / (lb - la) + per[2];
  double per_layer = per[0] / L, pl_fb = per[1] / L, pl_opt = per[2] / L, mem_layer = per[3] / L;
  double t_amort = fb_full + opt_full / accum;
  double tps = tokens / t_full, tps_amort = tokens / t_amort;
  printf(
      "\n| blocks | depth | step ms | fwd+bwd ms | optimizer ms | peak mem GB | loss "
      "|\n|---|---|---|---|---|---|---|\n");
  for (int k = 0; k < nk; k++)
    for (int d = 0; d < 2; d++) {
      const Timing *t = d ? &tb[k] : &ta[k];
      printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.4f |\n", recipe_format_name(kinds[k].r.format), t->layers,
             t->step_s * 1e3, t->fwdbwd_s * 1e3, t->opt_s * 1e3, t->mem_gb, t->loss);
    }
  printf("\nper layer%s: %.2f ms per step (%.2f fwd+bwd, %.2f optimizer), %.2f GB peak memory\n",
         nk > 1 ? " (the route's blocks averaged)" : "", per_layer * 1e3, pl_fb * 1e3, pl_opt * 1e3, mem_layer);
  double act_layer = (b.act_gb - a.act_gb) / (lb - la), plain_layer = (b.act_plain_gb - a.act_plain_gb) / (lb - la);
  printf("activations per layer%s%s (recompute %s): %.1f MB (%.1f MB in all at depth %d)\n", nk > 1 ? " of " : "",
         nk > 1 ? recipe_format_name(kinds[0].r.format) : "", cfg->recompute, act_layer * 1e3, a.act_gb * 1e3, la);
  printf(
      "activation memory per token per layer: %.1f KB with recipe %s, %.1f KB with every input kept in BF16 "
      "(%.1f%%)\n",
      act_layer * 1e9 / tokens / 1e3, cfg->recipe, plain_layer * 1e9 / tokens / 1e3,
      plain_layer > 0 ? 100.0 * act_layer / plain_layer : 0.0);
  const double mem0 = a.mem_gb - la * (b.mem_gb - a.mem_gb) / (lb - la);
  printf("extrapolated to %d layers: %.0f ms per step, %.1f GB peak memory (%.2f GB at depth 0)\n", L, t_full * 1e3,
         mem0 + per[3], mem0);
  printf("BENCH %s %s optimizer every step:     %8.0f tok/s/GPU  MFU %5.1f%%\n", op->name, cfg->recipe, tps,
         100 * tps * flops / PEAK_BF16_FLOPS);
  printf("BENCH %s %s optimizer amortized /%-4d: %8.0f tok/s/GPU  MFU %5.1f%%\n", op->name, cfg->recipe, accum,
         tps_amort, 100 * tps_amort * flops / PEAK_BF16_FLOPS);
  return 0;
}

// ---- --bench-save: what a checkpoint save costs (bench.h) ---------------------------------------

// One training step (forward, backward, AdamW), synced: its seconds.
static double timed_step(const Ops *op, Llama *m, const int *in, const int *tg, float *am, float *av,
                         const TrainConfig *cfg, int64_t t) {
  op->sync(op->ctx);
  double t0 = now_seconds();
  op->set_step(op->ctx, t, 0);
  llama_zero_grad(m);
  llama_forward_backward(m, in, tg, cfg->ignore_index, 1.0f);
  optimizer(op, m, am, av, cfg, t);
  op->sync(op->ctx);
  return now_seconds() - t0;
}

int bench_save_main(TrainConfig *cfg, const Ops *op, const Recipe *recipe, int layers, int steps) {
  enum { SAVES = 3 };
  const int L = cfg->model.n_layers, B = cfg->micro_batch, T = cfg->seq_len, N = B * T;
  if (layers < 1 || layers > L)
    die("--bench-save: --layers must be one depth from 1 to model.n_layers (%d), got %d", L, layers);
  const Recipe full = *recipe;
  char err[1024];
  BlockKind kinds[FMT_N];
  block_kinds(&full, L, kinds);  // the route's most common block kind, in every block: the bytes are the same
  if (op->set_recipe) op->set_recipe(op->ctx, &kinds[0].r, layers, cfg->seed);
  LlamaConfig mc = cfg->model;
  mc.n_layers = layers;
  Llama *m = llama_create_ex(&mc, B, T, op, llama_recompute_parse(cfg->recompute));
  llama_init(m, cfg->seed);
  const size_t n = llama_param_count(m), nb = n * sizeof(float);
  float *am = op->alloc(op->ctx, nb), *av = op->alloc(op->ctx, nb);
  op->zero(op->ctx, am, nb);
  op->zero(op->ctx, av, nb);
  int *in = xmalloc(N * sizeof(int)), *tg = xmalloc(N * sizeof(int));
  Rng r;
  rng_seed(&r, cfg->seed);
  for (int i = 0; i < N; i++) in[i] = (int)(rng_u64(&r) % mc.vocab_size);
  for (int i = 0; i < N; i++) tg[i] = i + 1 < N ? in[i + 1] : in[0];

  // The staging buffer of a one-process run (run/resume.c's checkpoint_open): params, m, v, a meta.
  char meta[64] = "bench-save";
  size_t sizes[4] = {sizeof meta, nb, nb, nb}, stage_bytes = ckpt_stage_bytes(sizes, 4);
  int pinned;
  void *stage = ckpt_stage_alloc(op->host_alloc, op->ctx, stage_bytes, &pinned);
  char dir[CFG_PATH + 16];
  if (cfg->ckpt_dir[0]) snprintf(dir, sizeof dir, "%s/bench_save", cfg->ckpt_dir);
  else if (!mkdtemp(strcpy(dir, "/tmp/bench_save_XXXXXX"))) die("--bench-save: cannot create a directory in /tmp");
  if (make_dirs(dir, err, sizeof err)) die("--bench-save: %s", err);
  const double gb = 3.0 * nb / 1e9;
  printf(
      "bench-save: %s backend, model %s at depth %d of %d (%zu parameters), a save of params and AdamW m, v "
      "= %.3g GB from %s memory into %s host memory, written to %s\n",
      op->name, cfg->model_preset, layers, L, n, gb, op->host_memory ? "host" : "device",
      pinned ? "pinned" : "pageable", dir);
  fflush(stdout);

  CkptWriter *w = ckpt_writer_open(stage, stage_bytes);
  int64_t t = 0;
  for (int i = 0; i < 2; i++) timed_step(op, m, in, tg, am, av, cfg, ++t);  // warm-up
  double *alone = xmalloc(steps * sizeof(double));
  for (int i = 0; i < steps; i++) alone[i] = timed_step(op, m, in, tg, am, av, cfg, ++t);
  const double step_alone = median(alone, steps);
  double stall[SAVES], write[SAVES], during_ms[SAVES];
  int cap = 0;
  double *dur = NULL;
  printf(
      "\n| save | stall s | copy GB/s | background write s | write GB/s | steps during the write | their median "
      "ms (alone %.1f) |\n|---|---|---|---|---|---|---|\n",
      step_alone * 1e3);
  for (int s = 0; s < SAVES; s++) {
    CkptSource src[4] = {{"meta", meta, sizeof meta, NULL, NULL},
                         {"params", llama_params(m), nb, op->download, op->ctx},
                         {"adam_m", am, nb, op->download, op->ctx},
                         {"adam_v", av, nb, op->download, op->ctx}};
    op->sync(op->ctx);
    double t0 = now_seconds();
    if (ckpt_writer_submit(w, dir, s + 1, src, 4, 1, 0, NULL, err, sizeof err)) die("--bench-save: %s", err);
    stall[s] = now_seconds() - t0;
    int k = 0;  // training goes on while the thread writes
    while (ckpt_writer_busy(w)) {
      dur = grow_array(dur, k, &cap, sizeof *dur);
      dur[k++] = timed_step(op, m, in, tg, am, av, cfg, ++t);
    }
    CkptResult res;
    if (ckpt_writer_wait(w, &res) != 1) die("--bench-save: the save of step %d was not pending", s + 1);
    if (res.failed) die("--bench-save: %s", res.err);
    write[s] = res.write_s, during_ms[s] = k ? 1e3 * median(dur, k) : 0;
    remove(res.path);  // one file on the disk at a time
    printf("| %d | %.3g | %.3g | %.3g | %.3g | %d | %.1f |\n", s + 1, stall[s], gb / stall[s], write[s], gb / write[s],
           k, during_ms[s]);
    fflush(stdout);
  }
  ckpt_writer_close(w);
  remove(dir);  // empty now (ours alone: a checkpoint.dir is left)
  const double copy_rate = gb / median(stall, SAVES), write_rate = gb / median(write, SAVES);
  if (!op->host_memory) {  // the same copy into pageable memory, for comparison (touched once first)
    float *pageable = xmalloc(nb);
    op->download(op->ctx, pageable, llama_params(m), nb);
    double t0 = now_seconds();
    op->download(op->ctx, pageable, llama_params(m), nb);
    double dt = now_seconds() - t0;
    printf("\nthe params' download into pageable memory: %.3g GB/s (%s: %.3g GB/s)\n", nb / 1e9 / dt,
           pinned ? "pinned" : "the staging buffer", copy_rate);
    free(pageable);
  }
  // A run of `ranks` data-parallel ranks: rank 0's file holds all the params and its shard of m and
  // v, another rank's only its shard. The stall scales with those bytes at the measured copy rate
  // (with sharded fp32 masters rank 0 first all-gathers the params on the device, not timed here).
  const double full_gb = (double)llama_num_params(&cfg->model) * sizeof(float) / 1e9;
  printf(
      "\nextrapolated to %d layers (%.3g GB of fp32 params) at %.3g GB/s copies and %.3g GB/s writes:\n"
      "| ranks | rank 0 GB | its stall s | its write s | other ranks GB | their stall s | their write s |\n"
      "|---|---|---|---|---|---|---|\n",
      L, full_gb, copy_rate, write_rate);
  double stall8 = 0;
  for (int ranks = 1; ranks <= 8; ranks *= 2) {
    double r0 = full_gb + 2 * full_gb / ranks, other = 2 * full_gb / ranks;
    if (ranks == 8) stall8 = r0 / copy_rate;
    printf("| %d | %.3g | %.3g | %.3g |", ranks, r0, r0 / copy_rate, r0 / write_rate);
    if (ranks == 1) printf(" - | - | - |\n");
    else printf(" %.3g | %.3g | %.3g |\n", other, other / copy_rate, other / write_rate);
  }
  printf(
      "BENCHSAVE %s stall %.3g s for %.3g GB (%.3g GB/s, %s), background write %.3g s; at %d layers on 8 ranks "
      "rank 0 stalls %.3g s (target < 1 s)\n",
      op->name, median(stall, SAVES), gb, copy_rate, pinned ? "pinned" : "pageable", median(write, SAVES), L, stall8);
  ckpt_stage_free(op->host_free, op->ctx, stage, pinned);
  free(dur);
  free(alone);
  free(in);
  free(tg);
  op->release(op->ctx, am);
  op->release(op->ctx, av);
  llama_free(m);
  return 0;
}
