// train.c: the command line, the training loop, logging, evaluation and checkpoint orchestration.
// It computes nothing itself: the model (model/llama.c), optimizer (model/adamw.c), data
// (data/loader.c) and checkpoint container (model/checkpoint.c) do the work.
//
//   ./train CONFIG.yaml [--set key=value ...] [--resume] [--max-steps N] [--print-config]
//   ./train tokenize ...            (data preparation, see data/prepare.c)
//   ./train --help-config           (every config key with its default and range)
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "model/adamw.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/ops.h"
#include "model/schedule.h"

// What a checkpoint must agree on with the run that loads it. Fixed-size POD, saved as "meta".
typedef struct {
  uint32_t version;
  LlamaConfig model;
  char recipe[CFG_NAME];
  int32_t micro_batch, global_batch, seq_len, world;
  uint64_t seed;
  uint64_t n_params;
  int64_t tokens_seen;
} RunMeta;
#define META_VERSION 1

static volatile sig_atomic_t stop_signal;  // SIGTERM/SIGINT: save at the next step boundary and exit
static void on_signal(int sig) { stop_signal = sig; }

static void usage(FILE *f) {
  fprintf(f,
          "usage: ./train CONFIG.yaml [options]     train (CPU backend without a GPU)\n"
          "       ./train tokenize --help           prepare token shards / tokenize text\n"
          "       ./train --help-config             list every config key\n"
          "options:\n"
          "  --set section.key=value   override a config key (repeatable)\n"
          "  --resume                  resume from the latest checkpoint in checkpoint.dir\n"
          "  --max-steps N             stop (and checkpoint) after optimizer step N, keeping the schedule\n"
          "  --print-config            print the effective config as YAML and exit\n"
          "  --dry-run                 print the model size and FLOPs per token and exit\n");
}

// Names the first field where a checkpoint's meta differs from this run's.
static int meta_mismatch(const RunMeta *a, const RunMeta *b, char *msg, size_t len) {
#define CMP(field, fmt)                                                                            \
  if (a->field != b->field) {                                                                      \
    snprintf(msg, len, #field ": checkpoint has " fmt ", this run has " fmt, a->field, b->field); \
    return 1;                                                                                      \
  }
  CMP(version, "%u") CMP(model.vocab_size, "%d") CMP(model.dim, "%d") CMP(model.n_layers, "%d")
  CMP(model.n_heads, "%d") CMP(model.n_kv_heads, "%d") CMP(model.ffn_dim, "%d")
  CMP(model.norm_eps, "%g") CMP(model.rope_theta, "%g") CMP(model.rope_scaling, "%d")
  CMP(model.rope_factor, "%g") CMP(model.rope_low_freq_factor, "%g")
  CMP(model.rope_high_freq_factor, "%g") CMP(model.rope_original_max_pos, "%d")
  CMP(micro_batch, "%d") CMP(global_batch, "%d") CMP(seq_len, "%d") CMP(world, "%d")
  CMP(seed, "%" PRIu64) CMP(n_params, "%" PRIu64)
#undef CMP
  if (strcmp(a->recipe, b->recipe)) {
    snprintf(msg, len, "precision.recipe: checkpoint has %s, this run has %s", a->recipe, b->recipe);
    return 1;
  }
  return 0;
}

typedef struct {
  TrainConfig cfg;
  Llama *model;
  float *adam_m, *adam_v;
  DataLoader *train, *val;
  int *inputs, *targets;
  RunMeta meta;
  int64_t step;  // optimizer steps completed
} Run;

static void save_checkpoint(Run *r) {
  if (!r->cfg.ckpt_dir[0]) return;
  size_t n = llama_param_count(r->model);
  LoaderState ls;
  loader_get_state(r->train, &ls);
  CkptSection secs[] = {
      {"meta", &r->meta, sizeof r->meta},
      {"params", llama_params(r->model), n * sizeof(float)},
      {"adam_m", r->adam_m, n * sizeof(float)},
      {"adam_v", r->adam_v, n * sizeof(float)},
      {"loader", &ls, sizeof ls},
  };
  char err[512];
  double t0 = now_seconds();
  if (ckpt_save(r->cfg.ckpt_dir, r->step, secs, 5, r->cfg.ckpt_keep, err, sizeof err))
    die("checkpoint at step %lld failed: %s", (long long)r->step, err);
  printf("saved checkpoint %s/ckpt_%08lld.bin (%.2fs)\n", r->cfg.ckpt_dir, (long long)r->step, now_seconds() - t0);
  fflush(stdout);
}

// Loads the newest valid checkpoint, after checking that it was written by a compatible run.
static void resume(Run *r) {
  char path[2048], err[512];
  int64_t step;
  int found = ckpt_latest(r->cfg.ckpt_dir, path, sizeof path, &step);
  if (found < 0) die("cannot scan checkpoint dir '%s'", r->cfg.ckpt_dir);
  if (found == 1) {
    printf("resume: no checkpoint in '%s', starting from scratch\n", r->cfg.ckpt_dir);
    return;
  }
  RunMeta old;
  CkptSection meta = {"meta", &old, sizeof old};
  if (ckpt_load(path, &meta, 1, &step, err, sizeof err)) die("%s", err);
  char why[512];
  RunMeta want = r->meta;
  want.tokens_seen = old.tokens_seen;
  if (meta_mismatch(&old, &want, why, sizeof why)) die("checkpoint %s does not match this run: %s", path, why);
  size_t n = llama_param_count(r->model);
  LoaderState ls;
  CkptSection secs[] = {
      {"params", llama_params(r->model), n * sizeof(float)},
      {"adam_m", r->adam_m, n * sizeof(float)},
      {"adam_v", r->adam_v, n * sizeof(float)},
      {"loader", &ls, sizeof ls},
  };
  if (ckpt_load(path, secs, 4, &step, err, sizeof err)) die("%s", err);
  if (loader_set_state(r->train, &ls, err, sizeof err)) die("checkpoint %s: %s", path, err);
  r->meta.tokens_seen = old.tokens_seen;
  r->step = step;
  printf("resumed from %s at step %lld\n", path, (long long)step);
}

static float eval_loss(Run *r) {
  loader_reset(r->val);
  double sum = 0;
  for (int i = 0; i < r->cfg.eval_batches; i++) {
    loader_next(r->val, r->inputs, r->targets);
    sum += llama_forward(r->model, r->inputs, r->targets, r->cfg.ignore_index);
  }
  return (float)(sum / r->cfg.eval_batches);
}

static void format_eta(double s, char *buf, size_t len) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)s;
  if (t >= 3600) snprintf(buf, len, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "tokenize")) return tokenize_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "--help-config")) { config_print_reference(stdout); return 0; }
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) { usage(argc < 2 ? stderr : stdout); return argc < 2; }

  Run run = {0};
  TrainConfig *cfg = &run.cfg;
  char err[1024];
  config_defaults(cfg);
  const char *cfg_path = argv[1];
  if (config_load(cfg, cfg_path, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); return 1; }
  int force_resume = 0, print_config = 0, dry_run = 0;
  int64_t max_steps = -1;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--set") && i + 1 < argc) {
      if (config_set(cfg, argv[++i], err, sizeof err)) { fprintf(stderr, "error: %s\n", err); return 1; }
    } else if (!strcmp(argv[i], "--resume")) force_resume = 1;
    else if (!strcmp(argv[i], "--print-config")) print_config = 1;
    else if (!strcmp(argv[i], "--dry-run")) dry_run = 1;
    else if (!strcmp(argv[i], "--max-steps") && i + 1 < argc) {
      char *end;
      max_steps = strtoll(argv[++i], &end, 10);
      if (*end || max_steps < 0) { fprintf(stderr, "error: --max-steps: expected a non-negative integer, got '%s'\n", argv[i]); return 1; }
    } else { fprintf(stderr, "error: unknown or incomplete option '%s'\n", argv[i]); usage(stderr); return 1; }
  }
  if (force_resume) cfg->resume = 1;
  if (config_validate(cfg, cfg_path, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); return 1; }
  if (print_config) { config_write_yaml(cfg, stdout); return 0; }
  if (dry_run) {  // sizes only: nothing is allocated, so this works for the 8B config on a laptop
    const LlamaConfig *c = &cfg->model;
    int64_t np = llama_num_params(c);
    printf("model: %s, %lld parameters (%lld embedding), %.2f GFLOP/token at seq %d\n",
           cfg->model_preset[0] ? cfg->model_preset : "custom", (long long)np,
           (long long)llama_num_embedding_params(c), llama_flops_per_token(c, cfg->seq_len) / 1e9, cfg->seq_len);
    printf("training state (fp32 params, grads, AdamW m and v): %.1f GB\n", np * 16.0 / 1e9);
    return 0;
  }
  if (cfg->resume && !cfg->ckpt_dir[0]) { fprintf(stderr, "error: checkpoint.resume needs checkpoint.dir\n"); return 1; }

  if (!strcmp(cfg->backend, "cuda")) die("parallel.backend: the CUDA backend is not built into this binary yet");
  if (cfg->data_parallel != 1) die("parallel.data_parallel: %d, but the CPU backend runs one process (set it to 1)", cfg->data_parallel);
  if (cfg->threads > 0) omp_set_num_threads(cfg->threads);
  const int world = cfg->data_parallel, B = cfg->micro_batch, T = cfg->seq_len;
  const int accum = cfg->global_batch / (B * world);
  const LlamaConfig *mc = &cfg->model;

  run.model = llama_create(mc, B, T, &ops_cpu);
  llama_init(run.model, cfg->seed);
  size_t n = llama_param_count(run.model);
  run.adam_m = xcalloc(n, sizeof(float));
  run.adam_v = xcalloc(n, sizeof(float));
  run.inputs = xmalloc((size_t)B * T * sizeof(int));
  run.targets = xmalloc((size_t)B * T * sizeof(int));
  run.train = loader_open(cfg->train_data, B, T, 0, world, cfg->seed, 1, mc->vocab_size, err, sizeof err);
  if (!run.train) die("data.train: %s", err);
  if (cfg->val_data[0] && cfg->eval_interval > 0) {
    run.val = loader_open(cfg->val_data, B, T, 0, world, cfg->seed, 0, mc->vocab_size, err, sizeof err);
    if (!run.val) die("data.val: %s", err);
  }
  run.meta = (RunMeta){.version = META_VERSION, .model = *mc, .micro_batch = B, .global_batch = cfg->global_batch,
                       .seq_len = T, .world = world, .seed = cfg->seed, .n_params = n};
  snprintf(run.meta.recipe, sizeof run.meta.recipe, "%s", cfg->recipe);
  if (cfg->resume) resume(&run);

  FILE *log = NULL;
  if (cfg->log_file[0]) log = xfopen(cfg->log_file, run.step > 0 ? "a" : "w");
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);

  const double tokens_per_step = (double)cfg->global_batch * T;
  printf("model: %s, %lld parameters (%.2f GFLOP/token at seq %d)\n", cfg->model_preset[0] ? cfg->model_preset : "custom",
         (long long)llama_num_params(mc), llama_flops_per_token(mc, T) / 1e9, T);
  printf("backend cpu (%d threads), recipe %s (fp32 on the CPU), batch %d x %d x %d accum = %d seqs of %d tokens\n",
         omp_get_max_threads(), cfg->recipe, B, world, accum, cfg->global_batch, T);
  if (loader_synthetic_entropy(run.train) > 0)
    printf("data: synthetic Markov corpus, entropy floor %.4f nats/token\n", loader_synthetic_entropy(run.train));
  else
    printf("data: %s (%llu tokens/epoch)\n", cfg->train_data, (unsigned long long)loader_tokens_per_epoch(run.train));
  fflush(stdout);

  double t_start = now_seconds(), t_last = t_start;
  int64_t first_step = run.step;
  int bad_steps = 0;
  while (run.step < cfg->total_steps && (max_steps < 0 || run.step < max_steps)) {
    llama_zero_grad(run.model);
    double loss = 0;
    for (int a = 0; a < accum; a++) {
      loader_next(run.train, run.inputs, run.targets);
      loss += llama_forward(run.model, run.inputs, run.targets, cfg->ignore_index) / accum;
      llama_backward(run.model, 1.0f / accum);
    }
    float *g = llama_grads(run.model), *p = llama_params(run.model);
    float norm = grad_global_norm(g, n), scale = clip_scale(norm, cfg->grad_clip);
    float lr = lr_at(cfg, run.step);
    if (!isfinite(norm) || !isfinite(loss)) {  // never let one bad batch poison the weights
      if (++bad_steps > 10) die("%d consecutive non-finite steps; stopping (last good checkpoint kept)", bad_steps);
      printf("step %6lld: non-finite loss %g / grad norm %g, skipping the update\n", (long long)run.step + 1, loss, norm);
      run.step++;
      continue;
    }
    bad_steps = 0;
    for (int i = 0; i < llama_num_tensors(run.model); i++) {
      const ParamTensor *t = llama_tensor(run.model, i);
      adamw_update(p + t->offset, g + t->offset, run.adam_m + t->offset, run.adam_v + t->offset, t->numel, lr,
                   cfg->beta1, cfg->beta2, cfg->eps, t->decay ? cfg->weight_decay : 0.0f, scale, run.step + 1);
    }
    run.step++;
    run.meta.tokens_seen += (int64_t)tokens_per_step;

    double now = now_seconds();
    if (run.step % cfg->log_interval == 0 || run.step == cfg->total_steps) {
      double dt = now - t_last, tps = tokens_per_step * cfg->log_interval / dt;
      double avg = (now - t_start) / (run.step - first_step);
      char eta[32];
      format_eta(avg * (cfg->total_steps - run.step), eta, sizeof eta);
      printf("step %6lld/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s | eta %s\n", (long long)run.step,
             cfg->total_steps, loss, lr, norm, tps, eta);
      fflush(stdout);
      if (log)
        fprintf(log, "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens\": %lld, \"tok_per_s\": %.1f}\n",
                (long long)run.step, loss, lr, norm, (long long)run.meta.tokens_seen, tps);
      t_last = now;
    }
    if (run.val && run.step % cfg->eval_interval == 0) {
      float vl = eval_loss(&run);
      printf("step %6lld | val loss %.4f\n", (long long)run.step, vl);
      if (log) fprintf(log, "{\"step\": %lld, \"val_loss\": %.9g}\n", (long long)run.step, vl);
    }
    if (log) fflush(log);
    int last = run.step == cfg->total_steps || run.step == max_steps;
    if ((cfg->ckpt_interval > 0 && run.step % cfg->ckpt_interval == 0) || last) save_checkpoint(&run);
    if (stop_signal) {
      printf("received signal %d: saving and exiting\n", (int)stop_signal);
      if (!last) save_checkpoint(&run);
      break;
    }
  }
  if (log) fclose(log);
  loader_close(run.train);
  if (run.val) loader_close(run.val);
  llama_free(run.model);
  free(run.adam_m); free(run.adam_v); free(run.inputs); free(run.targets);
  return 0;
}
