// train.c: the command line, the training loop, logging and evaluation; main() reads top to bottom
// (parse_cli, open_run, print_run, train, close_run). It computes nothing itself:
// the model (model/llama.c), optimizer (parallel/zero.c, model/cpu/adamw.c), data (data/loader.c) and
// checkpoints (run/resume.c over the container in run/checkpoint.c) do the work.
//
//   ./train CONFIG.yaml [--set key=value ...] [--resume] [--max-steps N] [--print-config]
//   ./train tokenize ...            (data preparation, see data/prepare.c)
//   ./train --help-config           (every config key with its default and range)
//
// Signals: SIGTERM/SIGINT save a checkpoint at the next step boundary and exit 0; SIGUSR1 saves one
// at the next step boundary and keeps training. Test hooks (environment variables, for the test
// suite only): TRAIN_INJECT_NAN_AT=step[,count[,grad]] makes the loss NaN for `count` (default 1)
// steps from `step` (1-based, as printed), or with ",grad" one gradient element instead, so that
// both non-finite checks can be exercised; TRAIN_CKPT_SLOW_MS stretches checkpoint writes so a
// crash test can kill a save half-way, and TRAIN_CKPT_PAUSE=FILE holds every save after its first
// section until FILE exists (run/checkpoint.h).
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"   // die, xmalloc, xfopen, now_seconds
#include "data/evals.h"      // the downstream task files
#include "data/loader.h"     // loader_open, loader_next: [B, T] micro-batches
#include "data/prepare.h"    // tokenize_main (./train tokenize)
#include "data/tokenizer.h"  // the Llama-3 tokenizer, for the tasks
#include "fp4/recipe.h"      // recipe_resolve, recipe_describe
#include "model/adamw.h"     // the AdamW hyperparameters
#include "model/llama.h"     // llama_create_ex, llama_init, llama_forward_backward
#include "model/ops.h"       // backend_open and the operations table
#include "parallel/comm.h"   // comm_env, comm_init, comm_allreduce_sum_f64, comm_barrier
#include "parallel/zero.h"   // zero_create, zero_begin_micro, zero_note_tokens, zero_reduce_grads
#include "run/bench.h"       // bench_main (--bench)
#include "run/bench_attention.h"
#include "run/checkpoint.h"  // ckpt_probe_dir
#include "run/config.h"      // TrainConfig: config_load, config_set, config_validate
#include "run/dgrad_diag.h"  // dgrad_diagnostic (--dgrad-diagnostic)
#include "run/mc_eval.h"     // mc_task_*: multiple-choice scoring with the model
#include "run/metrics.h"     // MetricsLog: the JSONL log and TensorBoard event files
#include "run/mfu.h"         // the two MFU conventions
#include "run/run.h"         // Run: resume, init_from, save_checkpoint, optimizer_step
#include "run/schedule.h"    // lr_at

static volatile sig_atomic_t stop_signal;   // SIGTERM/SIGINT: save at the next step boundary and exit
static volatile sig_atomic_t save_request;  // SIGUSR1: save at the next step boundary, keep going
static void on_signal(int sig) {
  if (sig == SIGUSR1) save_request = 1;
  else stop_signal = sig;
}

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
          "  --dry-run                 print the model size, FLOPs per token and the route's contract, and exit\n"
          "  --compare-dump DIR        write params, one batch, its logits, loss, gradients and 10 AdamW\n"
          "                            steps to DIR for scripts/hf/hf_compare.py, and exit\n"
          "  --eval-only               validation loss and eval.tasks of the (resumed) model, then exit\n"
          "  --bench [--layers a,b] [--bench-steps N]\n"
          "                            time training steps at depths a and b (default 2,4), extrapolate\n"
          "                            to the config's depth: tokens/s/GPU, MFU, memory, per-kernel table\n"
          "  --bench-save [--layers N] [--bench-steps N]\n"
          "                            time a checkpoint save at depth N (default: the config's, at most 4):\n"
          "                            the stall, the background write, steps during it; extrapolated per rank\n"
          "  --bench-attention [--bench-steps N]\n"
          "                            time attention fwd+bwd at the config's shapes, plain causal beside\n"
          "                            document-masked (model.doc_mask) on web-like document lengths, and\n"
          "                            plain causal back to back (the GPU busy throughout, as in a step)\n"
          "  --dgrad-diagnostic N [--dgrad-draws K] [--dgrad-tokens M]\n"
          "                            the paper's Dgrad diagnostic on N micro-batches of the (resumed or\n"
          "                            init_from) model: MXFP4 vs CTA-local NVFP4 error energy per block\n"
          "                            and component, K SR draws averaged (4), on the first M tokens of\n"
          "                            each micro-batch in whole sequences (2048; 0: all); needs\n"
          "                            precision.recipe bf16\n"
          "signals: SIGTERM/SIGINT save a checkpoint and exit; SIGUSR1 saves one and keeps training\n");
}

// Clips by the global gradient norm and applies AdamW (norms decayed with optim.decay_norms), ZeRO-1 style over the
// ranks (parallel/zero.h). Returns -1 without touching the weights when the gradient is not finite.
static int optimizer_step(Run *r, float lr, float *norm_out) {
  const TrainConfig *c = &r->cfg;
  ZeroHyper h = {c->beta1, c->beta2, c->eps, c->weight_decay, c->grad_clip, c->decay_norms};
  return zero_step(r->zero, &h, lr, r->step + 1, norm_out);
}

static float eval_loss(Run *r) {
  loader_reset(r->val);
  double sum = 0;
  for (int i = 0; i < r->cfg.eval_batches; i++) {
    loader_next(r->val, r->inputs, r->targets);
    sum += llama_forward(r->model, r->inputs, r->targets, r->cfg.ignore_index);
  }
  comm_allreduce_sum_f64(r->comm, &sum, 1);  // each rank read its own eval.batches micro-batches
  return (float)(sum / ((double)r->cfg.eval_batches * r->world));
}

static void write_floats(const char *dir, const char *name, const float *p, size_t n) {
  char path[2048];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = xfopen(path, "wb");
  xfwrite(p, sizeof(float), n, f, path);
  fclose(f);
}

// --compare-dump DIR: what an outside oracle (scripts/hf/hf_compare.py runs HF transformers) needs to
// check this engine: the initial parameters and their layout, one micro-batch, its logits, loss
// and every gradient, then the losses of 10 AdamW steps on that same batch.
static void compare_dump(Run *r, const char *dir) {
  char err[512], path[2048];
  if (make_dirs(dir, err, sizeof err)) die("--compare-dump: %s", err);
  const TrainConfig *c = &r->cfg;
  const LlamaConfig *mc = &c->model;
  const Ops *op = r->ops;
  size_t n = llama_param_count(r->model), N = (size_t)c->micro_batch * c->seq_len;
  float *host = xmalloc((n > N * mc->vocab_size ? n : N * mc->vocab_size) * sizeof(float));
  op->download(op->ctx, host, llama_params(r->model), n * sizeof(float));
  write_floats(dir, "params.bin", host, n);

  snprintf(path, sizeof path, "%s/model.json", dir);
  FILE *f = xfopen(path, "w");
  fprintf(f,
          "{\"vocab_size\": %d, \"dim\": %d, \"n_layers\": %d, \"n_heads\": %d, \"n_kv_heads\": %d, \"ffn_dim\": %d,\n",
          mc->vocab_size, mc->dim, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->ffn_dim);
  fprintf(
      f,
      " \"max_seq_len\": %d, \"norm_eps\": %.9g, \"rope_theta\": %.9g, \"rope_scaling\": %d, \"rope_factor\": %.9g,\n",
      mc->max_seq_len, mc->norm_eps, mc->rope_theta, mc->rope_scaling, mc->rope_factor);
  fprintf(f, " \"rope_low_freq_factor\": %.9g, \"rope_high_freq_factor\": %.9g, \"rope_original_max_pos\": %d,\n",
          mc->rope_low_freq_factor, mc->rope_high_freq_factor, mc->rope_original_max_pos);
  fprintf(f, " \"B\": %d, \"T\": %d, \"ignore_index\": %d, \"backend\": \"%s\",\n", c->micro_batch, c->seq_len,
          c->ignore_index, op->name);
  fprintf(
      f,
      " \"lr\": %.9g, \"beta1\": %.9g, \"beta2\": %.9g, \"eps\": %.9g, \"weight_decay\": %.9g, \"grad_clip\": %.9g,\n",
      c->lr, c->beta1, c->beta2, c->eps, c->weight_decay, c->grad_clip);
  fprintf(f, " \"tensors\": [\n");
  for (int i = 0; i < llama_num_tensors(r->model); i++) {
    const ParamTensor *t = llama_tensor(r->model, i);
    fprintf(f, "  {\"name\": \"%s\", \"offset\": %zu, \"numel\": %zu, \"decay\": %d, \"shape\": [", t->name, t->offset,
            t->numel, t->decay);
    for (int d = 0; d < t->ndim; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    fprintf(f, "]}%s\n", i + 1 < llama_num_tensors(r->model) ? "," : "");
  }
  fprintf(f, " ]}\n");
  fclose(f);

  loader_next(r->train, r->inputs, r->targets);
  snprintf(path, sizeof path, "%s/batch.bin", dir);
  f = xfopen(path, "wb");
  xfwrite(r->inputs, sizeof(int), N, f, path);
  xfwrite(r->targets, sizeof(int), N, f, path);
  fclose(f);

  llama_logits(r->model, r->inputs, host);
  write_floats(dir, "logits.bin", host, N * mc->vocab_size);
  llama_zero_grad(r->model);
  float loss0 = llama_forward(r->model, r->inputs, r->targets, c->ignore_index);
  llama_backward(r->model, 1.0f);
  op->download(op->ctx, host, llama_grads(r->model), n * sizeof(float));
  write_floats(dir, "grads.bin", host, n);

  enum { STEPS = 10 };
  float losses[STEPS], lrs[STEPS], norms[STEPS];
  for (int s = 0; s < STEPS; s++) {  // AdamW on the same batch: the loss must fall the same way
    op->set_step(op->ctx, r->step, 0);
    llama_zero_grad(r->model);
    losses[s] = llama_forward_backward(r->model, r->inputs, r->targets, c->ignore_index, 1.0f);
    lrs[s] = lr_at(c, r->step);
    if (optimizer_step(r, lrs[s], &norms[s])) die("--compare-dump: non-finite gradient at step %d", s);
    r->step++;
  }
  snprintf(path, sizeof path, "%s/summary.json", dir);
  f = xfopen(path, "w");
  fprintf(f, "{\"loss\": %.9g,\n \"step_losses\": [", loss0);
  for (int s = 0; s < STEPS; s++) fprintf(f, "%s%.9g", s ? ", " : "", losses[s]);
  fprintf(f, "],\n \"lrs\": [");
  for (int s = 0; s < STEPS; s++) fprintf(f, "%s%.9g", s ? ", " : "", lrs[s]);
  fprintf(f, "],\n \"grad_norms\": [");
  for (int s = 0; s < STEPS; s++) fprintf(f, "%s%.9g", s ? ", " : "", norms[s]);
  fprintf(f, "]}\n");
  fclose(f);
  free(host);
  printf("compare dump written to %s (loss %.6f, after %d AdamW steps %.6f)\n", dir, loss0, STEPS, losses[STEPS - 1]);
}

// The recipe's details as the checkpoint's "recipe" section keeps them.
static RecipeMeta recipe_meta(const Recipe *r) {
  return (RecipeMeta){r->sr_dgrad,       r->sr_wgrad,   r->hadamard, r->weight_2d,
                      r->scale_round_up, r->bf16_first, r->bf16_last};
}

// TRAIN_INJECT_NAN_AT=step[,count[,grad]] (a test hook, see the top of this file): the steps
// [first, last] get a NaN loss, or a NaN gradient element when grad is set. Unset: an empty range.
typedef struct {
  int64_t first, last;
  int grad;
} NanInjection;

static NanInjection parse_nan_injection(void) {
  NanInjection inj = {1, 0, 0};
  const char *s = getenv("TRAIN_INJECT_NAN_AT");
  if (!s || !*s) return inj;
  char *end;
  long long at = strtoll(s, &end, 10), count = 1;
  if (*end == ',') count = strtoll(end + 1, &end, 10);
  if (!strcmp(end, ",grad")) inj.grad = 1, end += 5;
  if (*end || at < 1 || count < 1)
    die("TRAIN_INJECT_NAN_AT: expected step[,count[,grad]] with step and count >= 1, got '%s'", s);
  inj.first = at, inj.last = at + count - 1;
  printf("test hook: NaN %s injected at steps %lld..%lld\n", inj.grad ? "gradient" : "loss", at, at + count - 1);
  return inj;
}

// The running mean of the last `window` finite losses, for the spike check. Fixed-order sum.
typedef struct {
  double *loss;
  int window, n, next;
} LossWindow;

static double window_mean(const LossWindow *w) {
  double sum = 0;
  for (int i = 0; i < w->n; i++) sum += w->loss[i];
  return sum / w->n;
}

static void window_push(LossWindow *w, double loss) {
  w->loss[w->next] = loss;
  w->next = (w->next + 1) % w->window;
  if (w->n < w->window) w->n++;
}

// A skipped step: said on stdout and in the JSONL log (non-finite values as strings, which JSON
// allows); at reliability.max_bad_steps in a row the run stops, naming the checkpoint to go back to.
static void report_bad_step(Run *r, MetricsLog *log, double loss, float norm, int bad_steps) {
  printf("step %6lld: loss %g, grad norm %g: not finite, skipping the update (%d in a row, limit %d)\n",
         (long long)r->step, loss, norm, bad_steps, r->cfg.max_bad_steps);
  char l[32], g[32];
  snprintf(l, sizeof l, "%g", loss), snprintf(g, sizeof g, "%g", norm);
  metrics_begin(log, r->step, "skipped");
  metrics_text(log, "loss", l);
  metrics_text(log, "grad_norm", g);
  metrics_num(log, "in_a_row", "%.0f", bad_steps);  // TensorBoard's "skipped/in_a_row"
  metrics_end(log);
  metrics_flush(log);
  if (bad_steps < r->cfg.max_bad_steps) return;
  checkpoint_wait(r);  // a write in the background ends first: the message names the newest checkpoint
  fflush(stdout);
  die("%d consecutive non-finite steps (reliability.max_bad_steps), the last at step %lld: stopping; none of them "
      "updated the weights; %s%s",
      bad_steps, (long long)r->step,
      r->last_ckpt[0] ? "resume from the last good checkpoint, " : "no checkpoint of this run was written",
      r->last_ckpt);
}

// Logs (stdout and JSONL) a loss above factor x the mean of the last window's losses; logged, not
// acted on: a spike is worth a look, not a stop. The check starts once the window is full.
static void check_spike(LossWindow *w, float factor, int64_t step, double loss, MetricsLog *log) {
  if (w->n == w->window && loss > factor * window_mean(w)) {
    double mean = window_mean(w);
    printf("step %6lld: loss spike %.4f > %g x running mean %.4f of the last %d steps\n", (long long)step, loss, factor,
           mean, w->window);
    metrics_begin(log, step, "spike");
    metrics_num(log, "loss", "%.9g", loss);
    metrics_num(log, "running_mean", "%.9g", mean);
    metrics_num(log, "factor", "%g", factor);
    metrics_end(log);
  }
  window_push(w, loss);
}

// Resolves the precision recipe for this backend and hands it to the linear layers.
static Recipe apply_recipe(const TrainConfig *c, const Ops *ops, int n_layers) {
  Recipe r;
  char err[512], desc[1024];
  int cc = ops->device_cc ? ops->device_cc(ops->ctx) : 0;
  RecipeSpec spec = config_recipe_spec(c);
  if (recipe_resolve(&r, &spec, cc, err, sizeof err)) die("%s", err);
  recipe_describe(&r, desc, sizeof desc);
  if (!ops->set_recipe) die("the %s backend takes no precision recipe", ops->name);
  ops->set_recipe(ops->ctx, &r, n_layers, c->seed);
  printf("recipe %s\n", desc);
  return r;
}

// eval.tasks: parsed and tokenized once at startup, so a bad file stops the run before training.
static void open_tasks(Run *r) {
  const TrainConfig *c = &r->cfg;
  if (!c->eval_tasks[0]) return;
  char err[512];
  if (c->model.vocab_size < TOKENIZER_BOS + 2)
    die("eval.tasks: model.vocab_size %d cannot hold the Llama-3 tokenizer's ids (128256)", c->model.vocab_size);
  r->tok = tokenizer_load(c->tokenizer_path, NULL, err, sizeof err);
  if (!r->tok) die("data.tokenizer: %s", err);
  if (c->eval_samples[0] && make_dirs(c->eval_samples, err, sizeof err)) die("eval.samples: %s", err);
  const EvalTaskInfo *task[EVAL_MAX_TASKS];
  int shots[EVAL_MAX_TASKS];
  int n = eval_tasks_parse(c->eval_tasks, task, shots, err, sizeof err);  // run/config.c checked it
  if (n < 0) die("eval.tasks: %s", err);
  for (int i = 0; i < n; i++) {
    char path[2 * CFG_PATH];
    snprintf(path, sizeof path, "%s/%s", c->eval_dir, task[i]->file);
    double t0 = now_seconds();
    r->tasks[r->n_tasks] =
        mc_task_open(r->tok, task[i]->name, path, shots[i], c->eval_limit, c->seed, TOKENIZER_BOS, err, sizeof err);
    if (!r->tasks[r->n_tasks]) die("eval.tasks: %s", err);
    printf("eval task %s %d-shot: %d documents, %d requests (%.1fs to prepare)\n", task[i]->name, shots[i],
           r->tasks[r->n_tasks]->rq.n_docs, r->tasks[r->n_tasks]->rq.n_req, now_seconds() - t0);
    r->n_tasks++;
  }
}

// Scores every task and logs accuracy (and length-normalized accuracy) beside the training loss;
// MMLU adds its categories and subjects to the log. With more than one task, a table of each task's
// paper metric and their mean.
// One number of an eval record, keyed "eval/<task>[_<group>]/<metric>" (group: an MMLU category or subject).
static void eval_num(MetricsLog *log, const char *task, const char *group, const char *metric, const char *fmt,
                     double v) {
  char key[192];
  snprintf(key, sizeof key, "eval/%.40s%s%.64s/%.16s", task, group ? "_" : "", group ? group : "", metric);
  metrics_num(log, key, fmt, v);
}

static void run_tasks(Run *r, MetricsLog *log) {
  char err[512];
  EvalResult res[8];
  double secs[8];
  for (int i = 0; i < r->n_tasks; i++) {
    EvalResult *e = &res[i];
    double t0 = now_seconds();
    if (mc_task_run(r->tasks[i], r->model, r->cfg.micro_batch, r->cfg.seq_len, e, err, sizeof err))
      die("eval at step %lld: %s", (long long)r->step, err);
    secs[i] = now_seconds() - t0;
    printf("step %6lld | %s %d-shot: acc %.4f", (long long)r->step, e->name, r->tasks[i]->k_shot, e->acc);
    if (e->has_norm) printf(", acc_norm %.4f", e->acc_norm);
    printf(" (%d docs, %d requests in %d rows, %.1fs)\n", e->n, r->tasks[i]->rq.n_req, r->tasks[i]->rows, secs[i]);
    for (int c = 0; e->n_subjects && c < EVAL_MMLU_CATEGORIES; c++)
      if (e->category[c].n)
        printf("step %6lld |   %s %-16s acc %.4f (%d docs)\n", (long long)r->step, e->name, e->category[c].name,
               e->category[c].acc, e->category[c].n);
    metrics_begin(log, r->step, NULL);
    eval_num(log, e->name, NULL, "acc", "%.6f", e->acc);
    if (e->has_norm) eval_num(log, e->name, NULL, "acc_norm", "%.6f", e->acc_norm);
    eval_num(log, e->name, NULL, "n", "%.0f", e->n);
    for (int c = 0; e->n_subjects && c < EVAL_MMLU_CATEGORIES; c++)
      if (e->category[c].n) eval_num(log, e->name, e->category[c].name, "acc", "%.6f", e->category[c].acc);
    for (int k = 0; k < e->n_subjects; k++)
      eval_num(log, e->name, e->subject[k].name, "acc", "%.6f", e->subject[k].acc);
    metrics_end(log);
    if (r->cfg.eval_samples[0]) {
      char path[2 * CFG_PATH];
      if (snprintf(path, sizeof path, "%s/%s.jsonl", r->cfg.eval_samples, e->name) >= (int)sizeof path)
        die("eval.samples: the path is too long");
      if (mc_task_write_samples(r->tasks[i], path, err, sizeof err)) die("eval.samples: %s", err);
    }
  }
  if (r->n_tasks > 1) {
    printf("%-14s %6s %-9s %8s %7s %8s\n", "task", "shots", "metric", "value", "docs", "seconds");
    double sum = 0;
    for (int i = 0; i < r->n_tasks; i++) {
      sum += eval_paper_metric(&res[i]);
      printf("%-14s %6d %-9s %8.4f %7d %8.1f\n", res[i].name, r->tasks[i]->k_shot,
             res[i].paper_norm ? "acc_norm" : "acc", eval_paper_metric(&res[i]), res[i].n, secs[i]);
    }
    printf("%-14s %6s %-9s %8.4f\n", "mean", "", "", sum / r->n_tasks);
    metrics_begin(log, r->step, NULL);
    metrics_num(log, "eval/mean", "%.6f", sum / r->n_tasks);
    metrics_end(log);
  }
  fflush(stdout);
}

// The validation loss (when a validation split is set) and the downstream tasks, logged as above.
static void evaluate(Run *r, MetricsLog *log) {
  if (r->val) {
    float vl = eval_loss(r);
    printf("step %6lld | val loss %.4f\n", (long long)r->step, vl);
    metrics_begin(log, r->step, NULL);
    metrics_num(log, "val_loss", "%.9g", vl);
    metrics_end(log);
  }
  run_tasks(r, log);
}

static void format_eta(double s, char *buf, size_t len) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)s;
  if (t >= 3600) snprintf(buf, len, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
}

// The command line beyond the config: what to do with it.
typedef struct {
  int print_config, dry_run, eval_only, bench_steps, bench_attention, bench_save;
  int diag_batches, diag_draws;         // --dgrad-diagnostic N, --dgrad-draws K
  int diag_tokens;                      // --dgrad-tokens M
  const char *dump_dir, *bench_layers;  // --compare-dump DIR; --bench / --layers A,B
  int64_t max_steps;                    // --max-steps (-1: the schedule's total_steps)
} Cli;

// Loads the config with its --set overrides and validates it. Returns -1 to go on, else the exit
// status (after --print-config or an error).
static int parse_cli(int argc, char **argv, TrainConfig *cfg, Cli *cli) {
  char err[1024];
  *cli = (Cli){.bench_steps = 10, .max_steps = -1, .diag_draws = 4, .diag_tokens = 2048};
  config_defaults(cfg);
  const char *cfg_path = argv[1];
  if (config_load(cfg, cfg_path, err, sizeof err)) {
    fprintf(stderr, "error: %s\n", err);
    return 1;
  }
  int force_resume = 0;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--set") && i + 1 < argc) {
      if (config_set(cfg, argv[++i], err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
      }
    } else if (!strcmp(argv[i], "--resume")) force_resume = 1;
    else if (!strcmp(argv[i], "--print-config")) cli->print_config = 1;
    else if (!strcmp(argv[i], "--dry-run")) cli->dry_run = 1;
    else if (!strcmp(argv[i], "--compare-dump") && i + 1 < argc) cli->dump_dir = argv[++i];
    else if (!strcmp(argv[i], "--eval-only")) cli->eval_only = 1;
    else if (!strcmp(argv[i], "--bench")) cli->bench_layers = "2,4";
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc) cli->bench_layers = argv[++i];
    else if (!strcmp(argv[i], "--bench-steps") && i + 1 < argc) cli->bench_steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--bench-attention")) cli->bench_attention = 1;
    else if (!strcmp(argv[i], "--bench-save")) cli->bench_save = 1;
    else if (!strcmp(argv[i], "--dgrad-diagnostic") && i + 1 < argc) cli->diag_batches = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--dgrad-draws") && i + 1 < argc) cli->diag_draws = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--dgrad-tokens") && i + 1 < argc) cli->diag_tokens = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--max-steps") && i + 1 < argc) {
      char *end;
      cli->max_steps = strtoll(argv[++i], &end, 10);
      if (*end || cli->max_steps < 0) {
        fprintf(stderr, "error: --max-steps: expected a non-negative integer, got '%s'\n", argv[i]);
        return 1;
      }
    } else {
      fprintf(stderr, "error: unknown or incomplete option '%s'\n", argv[i]);
      usage(stderr);
      return 1;
    }
  }
  if (force_resume) cfg->resume = 1;
  if (config_validate(cfg, cfg_path, err, sizeof err)) {
    fprintf(stderr, "error: %s\n", err);
    return 1;
  }
  if (cfg->resume && !cfg->ckpt_dir[0] && !cli->print_config && !cli->dry_run) {
    fprintf(stderr, "error: checkpoint.resume needs checkpoint.dir\n");
    return 1;
  }
  if (cli->bench_steps <= 0) cli->bench_steps = 10;
  return -1;
}

// --dry-run: sizes only. Nothing is allocated, so this works for the 8B config on a laptop.
static void print_sizes(const TrainConfig *cfg) {
  const LlamaConfig *c = &cfg->model;
  int64_t np = llama_num_params(c);
  printf("model: %s, %lld parameters (%lld embedding), %.2f GFLOP/token at seq %d\n",
         cfg->model_preset[0] ? cfg->model_preset : "custom", (long long)np, (long long)llama_num_embedding_params(c),
         llama_flops_per_token(c, cfg->seq_len) / 1e9, cfg->seq_len);
  printf("training state (fp32 params, grads, AdamW m and v): %.1f GB\n", np * 16.0 / 1e9);
  Recipe r;
  char err[512], contract[2048];
  RecipeSpec spec = config_recipe_spec(cfg);
  if (recipe_resolve(&r, &spec, 0, err, sizeof err)) die("%s", err);  // config_validate passed: cannot happen
  recipe_contract(&r, c->n_layers, contract, sizeof contract);
  printf("route %s: %s\n", cfg->recipe, contract);
}

// The backend's options from the config; bench: --bench (no record unless parallel.gemm_plans names
// one). plans (n bytes) holds the record's path, which the options point at.
static BackendOptions backend_options(const TrainConfig *cfg, int rank, int world, int local_rank, int bench,
                                      char *plans, size_t n) {
  int choice = gemm_plans_choice(cfg->deterministic, cfg->gemm_plans, cfg->ckpt_dir, world, rank, bench, plans, n);
  if (choice < 0)
    die("parallel.gemm_plans: the record's path (from '%s') is too long",
        cfg->gemm_plans[0] ? cfg->gemm_plans : cfg->ckpt_dir);
  return (BackendOptions){cfg->deterministic, cfg->dgrad_transposed, local_rank, cfg->nvtx, (GemmChoice)choice, plans};
}

// Everything a run needs before its first step: the rank (parallel/comm.h), the backend, the recipe,
// the model, ZeRO-1, the data, the downstream tasks, then the resume or checkpoint.init_from.
static void open_run(Run *run, const Cli *cli) {
  TrainConfig *cfg = &run->cfg;
  char err[1024];
  // Data parallelism: the environment says which rank this process is; the config says how many
  // ranks the global batch was planned for. They must agree.
  CommEnv env;
  if (comm_env(&env, err, sizeof err)) die("%s", err);
  if (cfg->data_parallel != env.world)
    die("parallel.data_parallel is %d but the launcher started %d process%s (WORLD_SIZE / SLURM_NTASKS): set "
        "parallel.data_parallel=%d, or launch %d",
        cfg->data_parallel, env.world, env.world == 1 ? "" : "es", env.world, cfg->data_parallel);
  if (env.world > 1 && (cli->dump_dir || cli->eval_only))
    die("--compare-dump and --eval-only run in one process (WORLD_SIZE 1)");
  run->rank = env.rank, run->world = env.world;
  char probe[2048];  // ranks of one job share checkpoint.dir: each checks its own sub-directory
  if (env.world > 1) snprintf(probe, sizeof probe, "%s/rank_%d", cfg->ckpt_dir, env.rank);
  else snprintf(probe, sizeof probe, "%s", cfg->ckpt_dir);
  if (cfg->ckpt_dir[0] && !cli->dump_dir && ckpt_probe_dir(probe, err, sizeof err)) die("checkpoint.dir: %s", err);
  if (cfg->threads > 0) omp_set_num_threads(cfg->threads);
  char plans[CFG_PATH + 64];
  BackendOptions bo = backend_options(cfg, env.rank, env.world, env.local_rank, 0, plans, sizeof plans);
  run->ops = backend_open(cfg->backend, &bo);
  run->comm = comm_init(&env, cfg->rendezvous, cfg->timeout_s, !run->ops->host_memory);
  const int world = run->world, B = cfg->micro_batch, T = cfg->seq_len;
  const LlamaConfig *mc = &cfg->model;

  // The recipe first: which BF16 activations the model keeps depends on it (model/llama.h).
  Recipe recipe = apply_recipe(cfg, run->ops, mc->n_layers);
  run->model = llama_create_ex(mc, B, T, run->ops, llama_recompute_parse(cfg->recompute));
  llama_init(run->model, cfg->seed);
  llama_set_docs(run->model, &(LlamaDocs){.block_causal = !strcmp(cfg->doc_mask, "block_causal"),
                                          .restart_positions = !strcmp(cfg->doc_positions, "restart"),
                                          .bos_id = cfg->bos_id});
  run->recipe = recipe_meta(&recipe);
  recipe_route_key(&recipe, run->route, sizeof run->route);
  run->saved_step = -1;
  size_t n = llama_param_count(run->model);
  ZeroOptions zopt = {.shard_master = cfg->shard_master,
                      .overlap = cfg->overlap_reduce,
                      .dtype = !strcmp(cfg->grad_reduce, "bf16") ? COMM_BF16 : COMM_FP32,
                      .bucket = (size_t)(cfg->bucket_mb * 1e6 / sizeof(float))};
  run->zero = zero_create(run->model, run->ops, run->comm, &zopt);
  // The staging buffer of checkpoints (pinned on a GPU), before resume fills it; a process that never
  // saves (--eval-only, --dgrad-diagnostic, --compare-dump) pins none: the resume reads into memory of its own.
  if (!cli->eval_only && !cli->diag_batches && !cli->dump_dir) checkpoint_open(run);
  else run->pending_step = -1;
  run->inputs = xmalloc((size_t)B * T * sizeof(int));
  run->targets = xmalloc((size_t)B * T * sizeof(int));
  run->train = loader_open(cfg->train_data, B, T, run->rank, world, cfg->seed, 1, mc->vocab_size, err, sizeof err);
  if (!run->train) die("data.train: %s", err);
  if (cfg->val_data[0] && (cfg->eval_interval > 0 || cli->eval_only)) {
    run->val = loader_open(cfg->val_data, B, T, run->rank, world, cfg->seed, 0, mc->vocab_size, err, sizeof err);
    if (!run->val) die("data.val: %s", err);
  }
  run->meta = (RunMeta){.version = META_VERSION,
                        .model = *mc,
                        .micro_batch = B,
                        .global_batch = cfg->global_batch,
                        .seq_len = T,
                        .world = world,
                        .seed = cfg->seed,
                        .n_params = n};
  snprintf(run->meta.recipe, sizeof run->meta.recipe, "%s", cfg->recipe);
  open_tasks(run);
  // A resume wins over checkpoint.init_from: the checkpoint already holds the trained parameters.
  int resumed = cfg->resume && resume(run);
  if (!resumed && cfg->init_from[0]) init_from(run);
}

// What runs where: the lines a run starts with.
static void print_run(const Run *run) {
  const TrainConfig *cfg = &run->cfg;
  const LlamaConfig *mc = &cfg->model;
  const int world = run->world, B = cfg->micro_batch, T = cfg->seq_len, accum = cfg->global_batch / (B * world);
  size_t n = llama_param_count(run->model);
  printf("model: %s, %lld parameters (%.2f GFLOP/token at seq %d)\n",
         cfg->model_preset[0] ? cfg->model_preset : "custom", (long long)llama_num_params(mc),
         llama_flops_per_token(mc, T) / 1e9, T);
  if (on_host(run))
    printf("backend cpu (%d threads), recipe %s (FP4 formats emulated in fp32)", omp_get_max_threads(), cfg->recipe);
  else printf("backend %s, recipe %s", run->ops->name, cfg->recipe);
  printf(", batch %d x %d x %d accum = %d seqs of %d tokens\n", B, world, accum, cfg->global_batch, T);
  if (world > 1)
    printf(
        "data parallel: %d ranks over %s, ZeRO-1 (AdamW state %.2f GB of %.2f GB per rank), gradients reduced "
        "in %s, %s\n",
        world, comm_on_device(run->comm) ? "NCCL" : "TCP", 8.0 * (run->zero->hi - run->zero->lo) / 1e9, 8.0 * n / 1e9,
        cfg->grad_reduce, cfg->overlap_reduce ? "overlapping the last backward" : "after the backward");
  if (world > 1)
    printf("master weights: %s\n", run->zero->sharded
                                       ? "fp32 sharded (each rank keeps its shard and the RMSNorm weights; "
                                         "parameters all-gathered in BF16)"
                                   : on_host(run) ? "fp32 whole on every rank (the CPU backend computes with them)"
                                                  : "fp32 whole on every rank (parallel.shard_master: false)");
  if (run->zero->sharded)
    printf("master weights: %.2f GB of fp32 parameters given back per rank (%.2f GB kept)\n", run->zero->released / 1e9,
           4.0 * n / 1e9 - run->zero->released / 1e9);
  printf("activations: %.1f MB (recompute %s)\n", llama_activation_bytes(run->model) / 1e6, cfg->recompute);
  const int n_src = loader_n_sources(run->train);
  if (loader_synthetic_entropy(run->train) > 0)
    printf("data: synthetic Markov corpus, entropy floor %.4f nats/token\n", loader_synthetic_entropy(run->train));
  else if (n_src == 1)
    printf("data: %s (%llu tokens/epoch)\n", cfg->train_data, (unsigned long long)loader_tokens_per_epoch(run->train));
  else printf("data: a blend of %d sources (logged as tokens/NAME)\n", n_src);
  for (int i = 0; n_src > 1 && i < n_src; i++) {
    LoaderSourceInfo s = loader_source_info(run->train, i);
    printf("  %-12s weight %.4f, %llu tokens/epoch%s: %s\n", s.name, s.weight, (unsigned long long)s.tokens_per_epoch,
           s.tokens_per_epoch ? "" : " (synthetic: no epochs)", s.paths);
  }
  fflush(stdout);
}

// One log line (stdout, and the metrics log on rank 0): loss, lr, norm, throughput, MFU, memory, ETA.
// seconds: since the last line; avg_step_s: over this process's steps so far. mfu: NULL on the CPU.
static void log_step(const Run *run, MetricsLog *log, const Mfu *mfu, double loss, float lr, float norm, double seconds,
                     double avg_step_s) {
  const TrainConfig *cfg = &run->cfg;
  const int world = run->world;
  const double tps = (double)cfg->global_batch * cfg->seq_len * cfg->log_interval / seconds;
  double mem_gb = 0, dev_gb = 0;  // GPU memory: our tracked peak, and the device's use now
  if (run->ops->mem_peak) mem_gb = run->ops->mem_peak(run->ops->ctx) / 1e9;
  if (run->ops->device_used) dev_gb = run->ops->device_used(run->ops->ctx) / 1e9;
  char eta[32];
  format_eta(avg_step_s * (cfg->total_steps - run->step), eta, sizeof eta);
  printf("step %6lld/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s", (long long)run->step, cfg->total_steps,
         loss, lr, norm, tps);
  if (world > 1) printf(" (%.0f/GPU)", tps / world);
  // MFU by the two conventions of run/mfu.h (the banner and the log's header name them); GPU runs only
  double mfu_bf16 = mfu ? mfu_paper(mfu, tps / world) : 0, mfu_own = mfu ? mfu_own_peak(mfu, tps / world) : 0;
  if (mfu_bf16 > 0) printf(" | MFU %.1f%%", 100 * mfu_bf16);
  if (mfu_own > 0 && mfu->bf16_flops < mfu->flops_per_token) printf(" (own peak %.1f%%)", 100 * mfu_own);
  if (dev_gb > 0) printf(" | mem %.1f GB", dev_gb);
  printf(" | eta %s\n", eta);
  fflush(stdout);
  metrics_begin(log, run->step, NULL);
  metrics_num(log, "loss", "%.9g", loss);
  metrics_num(log, "lr", "%.9g", lr);
  metrics_num(log, "grad_norm", "%.9g", norm);
  metrics_num(log, "tokens", "%.0f", (double)run->meta.tokens_seen);
  for (int i = 0; loader_n_sources(run->train) > 1 && i < loader_n_sources(run->train); i++) {
    LoaderSourceInfo s = loader_source_info(run->train, i);  // drawn by all ranks, skipped steps included
    char key[64];
    snprintf(key, sizeof key, "tokens/%s", s.name);
    metrics_num(log, key, "%.0f", (double)s.tokens);
  }
  metrics_num(log, "tok_per_s", "%.1f", tps);
  metrics_num(log, "tok_per_s_gpu", "%.1f", tps / world);
  if (mfu_bf16 > 0) metrics_num(log, "mfu", "%.4f", mfu_bf16);
  if (mfu_own > 0) metrics_num(log, "mfu_own_peak", "%.4f", mfu_own);
  if (dev_gb > 0) metrics_num(log, "mem_peak_gb", "%.2f", mem_gb), metrics_num(log, "dev_mem_gb", "%.2f", dev_gb);
  metrics_end(log);
}

// The training loop: accumulate micro-batches, reduce, agree across ranks, step (or skip a bad
// step), log, evaluate, checkpoint, and stop or save on a signal.
static void train(Run *run, MetricsLog *log, const Mfu *mfu, int64_t max_steps) {
  const TrainConfig *cfg = &run->cfg;
  const int world = run->world, B = cfg->micro_batch, T = cfg->seq_len, accum = cfg->global_batch / (B * world);
  const NanInjection inject = parse_nan_injection();
  LossWindow spikes = {xmalloc((size_t)cfg->spike_window * sizeof(double)), cfg->spike_window, 0, 0};
  double t_start = now_seconds(), t_last = t_start;
  int64_t first_step = run->step;
  int bad_steps = 0;
  while (run->step < cfg->total_steps && (max_steps < 0 || run->step < max_steps)) {
    llama_zero_grad(run->model);
    double loss = 0;
    for (int a = 0; a < accum; a++) {
      zero_begin_micro(run->zero, a, accum);  // the last one reduces its gradients during its backward
      run->ops->set_step(run->ops->ctx, run->step, a);
      loader_next(run->train, run->inputs, run->targets);
      zero_note_tokens(run->zero, run->inputs, B * T);  // the embedding rows to reduce
      loss += llama_forward_backward(run->model, run->inputs, run->targets, cfg->ignore_index, 1.0f / accum) / accum;
    }
    // Every rank, every step, whatever its loss: the reduction's collectives must pair up.
    zero_reduce_grads(run->zero);
    // After the reduction, so that it lands in rank 0's shard (element 0) on every transport.
    if (run->step + 1 >= inject.first && run->step + 1 <= inject.last) {  // test hook
      float nan = NAN;
      if (inject.grad) run->ops->upload(run->ops->ctx, llama_grads(run->model), &nan, sizeof nan);
      else loss = NAN;
    }
    // The ranks agree on the step's loss (the mean over ranks), on whether any of them was asked to
    // stop or save, so that all of them skip, save and exit at the same step, and on how many have
    // finished writing a pending checkpoint in the background.
    double agree[4] = {loss, stop_signal != 0, save_request != 0, checkpoint_poll_begin(run)};
    comm_allreduce_sum_f64(run->comm, agree, 4);
    loss = agree[0] / world;
    int stop_now = agree[1] > 0, save_now = agree[2] > 0;
    float lr = lr_at(cfg, run->step), norm = NAN;
    // Never let one bad batch poison the weights: a non-finite loss or gradient skips the update.
    int good = isfinite(loss) && optimizer_step(run, lr, &norm) == 0;
    run->step++;
    if (!good) {
      bad_steps++;
      report_bad_step(run, log, loss, norm, bad_steps);  // dies at reliability.max_bad_steps
    } else {
      bad_steps = 0;
      run->meta.tokens_seen += (int64_t)cfg->global_batch * T;
      if (cfg->spike_factor > 0) check_spike(&spikes, cfg->spike_factor, run->step, loss, log);
      double now = now_seconds();
      if (run->step % cfg->log_interval == 0 || run->step == cfg->total_steps) {
        log_step(run, log, mfu, loss, lr, norm, now - t_last, (now - t_start) / (run->step - first_step));
        t_last = now;
      }
      if (cfg->eval_interval > 0 && run->step % cfg->eval_interval == 0) evaluate(run, log);
    }
    int last = run->step == cfg->total_steps || run->step == max_steps;
    int save = (cfg->ckpt_interval > 0 && run->step % cfg->ckpt_interval == 0) || last;
    // The logs reach the disk before a checkpoint that a resume would continue after them.
    if (save || save_now || stop_now) metrics_sync(log);
    else metrics_flush(log);
    checkpoint_poll_end(run, agree[3]);  // reports a background write once every rank's is done
    if (save) save_checkpoint(run);
    if (save_now) {
      save_request = 0;
      printf("received SIGUSR1%s: saving a checkpoint and continuing\n", world > 1 ? " (on some rank)" : "");
      if (run->saved_step != run->step) save_checkpoint(run);
    }
    if (stop_now) {
      if (stop_signal) printf("received signal %d: saving and exiting\n", (int)stop_signal);
      else printf("another rank received a stop signal: saving and exiting\n");
      if (run->saved_step != run->step) save_checkpoint(run);
      break;
    }
  }
  checkpoint_wait(run);  // a stop or the end waits until the last checkpoint is written
  free(spikes.loss);
}

// Rank 0's metrics log (run/metrics.h; NULL on other ranks or when logging names no file), opened
// with its header record: the MFU conventions of the figures (printed too, on a GPU), the backend
// and the effective config as YAML (what scripts/wandb_follow.py gives W&B as the run's config).
static MetricsLog *open_log(const Run *run, Mfu *mfu) {
  const TrainConfig *cfg = &run->cfg;
  char err[512], desc[1024], conv[1200];
  Recipe r;
  RecipeSpec spec = config_recipe_spec(cfg);
  int cc = run->ops->device_cc ? run->ops->device_cc(run->ops->ctx) : 0;
  if (recipe_resolve(&r, &spec, cc, err, sizeof err)) die("%s", err);  // apply_recipe resolved it already
  *mfu = mfu_model(&cfg->model, cfg->seq_len, &r);
  mfu_describe(mfu, desc, sizeof desc);
  if (!on_host(run)) printf("MFU: %s\n", desc);
  snprintf(conv, sizeof conv, "%s%s", on_host(run) ? "not computed on the CPU backend; on a GPU: " : "", desc);
  MetricsLog *log = run->rank == 0 ? metrics_open(cfg->log_file, cfg->tensorboard, run->step) : NULL;
  if (!log) return NULL;
  char *yaml = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&yaml, &len);
  if (!f) die("open_memstream: out of memory");
  config_write_yaml(cfg, f);
  fclose(f);
  metrics_begin(log, -1, "header");
  metrics_text(log, "backend", run->ops->name);
  metrics_text(log, "mfu_conventions", conv);
  metrics_num(log, "flops_per_token", "%.9g", mfu->flops_per_token);
  metrics_text(log, "config", yaml);
  metrics_end(log);
  metrics_flush(log);
  free(yaml);
  return log;
}

static void close_run(Run *run) {
  // Nobody tears down its communicator (or closes its sockets, which peers take for a death) while
  // another rank may still be in a collective.
  comm_barrier(run->comm);
  for (int i = 0; i < run->n_tasks; i++) mc_task_free(run->tasks[i]);
  if (run->tok) tokenizer_free(run->tok);
  loader_close(run->train);
  if (run->val) loader_close(run->val);
  zero_free(run->zero);
  llama_free(run->model);
  comm_free(run->comm);
  checkpoint_close(run);
  free(run->inputs);
  free(run->targets);
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "tokenize")) return tokenize_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "--help-config")) {
    config_print_reference(stdout);
    return 0;
  }
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2;
  }

  Run run = {0};
  TrainConfig *cfg = &run.cfg;
  Cli cli;
  int rc = parse_cli(argc, argv, cfg, &cli);
  if (rc >= 0) return rc;
  if (cli.print_config) {
    config_write_yaml(cfg, stdout);
    return 0;
  }
  if (cli.dry_run) {
    print_sizes(cfg);
    return 0;
  }
  if (cli.bench_layers || cli.bench_attention || cli.bench_save) {  // synthetic tokens, one process, no data
    cfg->data_parallel = 1;
    if (cfg->threads > 0) omp_set_num_threads(cfg->threads);
    char plans[CFG_PATH + 64];
    BackendOptions bo = backend_options(cfg, 0, 1, 0, 1, plans, sizeof plans);
    const Ops *ops = backend_open(cfg->backend, &bo);
    const Recipe recipe = apply_recipe(cfg, ops, cfg->model.n_layers);
    if (cli.bench_attention) return bench_attention_main(cfg, ops, cli.bench_steps);
    if (cli.bench_save)  // one depth: --layers N, else the config's up to 4
      return bench_save_main(cfg, ops, &recipe,
                             cli.bench_layers          ? atoi(cli.bench_layers)
                             : cfg->model.n_layers < 4 ? cfg->model.n_layers
                                                       : 4,
                             cli.bench_steps);
    return bench_main(cfg, ops, &recipe, cli.bench_layers, cli.bench_steps);
  }

  open_run(&run, &cli);
  if (cli.eval_only) {  // validation loss and downstream tasks of the initial or resumed model, then exit
    MetricsLog *elog = metrics_open_append(cfg->log_file);
    evaluate(&run, elog);
    metrics_close(elog);
    return 0;
  }
  if (cli.diag_batches)
    return dgrad_diagnostic(&run, cli.diag_batches, cli.diag_draws, cli.diag_tokens, cfg->seed ^ 0xd9a4u, stdout);
  if (cli.dump_dir) {  // after resume, so a checkpoint's parameters can be dumped too
    compare_dump(&run, cli.dump_dir);
    return 0;
  }

  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  signal(SIGUSR1, on_signal);
  signal(SIGXFSZ, SIG_IGN);  // a file-size limit then fails the write (EFBIG), which we report
  print_run(&run);
  Mfu mfu;
  MetricsLog *log = open_log(&run, &mfu);  // one for the job, written by rank 0
  train(&run, log, on_host(&run) ? NULL : &mfu, cli.max_steps);
  if (run.ops->end_report) run.ops->end_report(run.ops->ctx, run.rank);
  close_run(&run);
  metrics_begin(log, run.step, "end");  // a follower (scripts/wandb_follow.py) may stop here
  metrics_end(log);
  metrics_close(log);
  return 0;
}
