// run/config.h: the training configuration, loaded from YAML (libyaml) with command-line
// overrides. Every key, its type, default and range lives in one table in config.c; the README's
// config reference is generated from the same table (./train --help-config).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fp4/recipe.h"
#include "model/llama_config.h"

#define CFG_PATH 1024
#define CFG_NAME 64

typedef struct {
  // model: "preset" fills every field; individual keys then override the preset.
  char model_preset[CFG_NAME];
  LlamaConfig model;
  int ignore_index;  // target id that contributes no loss (default -1)
  // document masking (model/llama.h's LlamaDocs; docs/data.md "Document masking")
  char doc_mask[CFG_NAME];       // "none" or "block_causal": attention stays within a document
  char doc_positions[CFG_NAME];  // "continue" or "restart": RoPE positions restart at each document
  int bos_id;                    // the token that starts a document (Llama-3: 128000)

  // optim
  float lr, beta1, beta2, eps, weight_decay, grad_clip;  // grad_clip <= 0 disables clipping
  int decay_norms;                                       // weight decay on the RMSNorm weights too (TorchTitan)

  // schedule: "constant" (linear warmup then constant), "cosine", or "wsd" (warmup-stable-decay)
  char schedule[CFG_NAME];
  int warmup_steps;
  int total_steps;     // training length in optimizer steps
  float min_lr_ratio;  // cosine / wsd floor as a fraction of lr
  int decay_start;     // wsd: first step of the decay phase
  int decay_steps;     // wsd: length of the decay phase

  // batch
  int micro_batch;   // sequences per micro-batch per rank
  int global_batch;  // sequences per optimizer step, all ranks; must divide by micro_batch * world
  int seq_len;

  // data
  char train_data[CFG_PATH];  // "synthetic", or shard paths/globs separated by commas
  char val_data[CFG_PATH];    // same form; empty disables validation

  // precision
  char recipe[CFG_NAME];  // "bf16", "mxfp4" (the paper's), "nvfp4" (TE-style), "nvfp4_cta" (CTA-local)
  // Each element of a recipe on its own; "auto" takes the recipe's default (model/recipe.c).
  char sr[CFG_NAME];              // stochastic rounding of dY: auto|none|dgrad|dgrad_wgrad
  char hadamard[CFG_NAME];        // Hadamard on the Wgrad operands: auto|none|h16|h32|h16_plain
  char weight_2d[CFG_NAME];       // 2D weight scale tiles: auto|on|off
  char wgrad_2d[CFG_NAME];        // FP8 path: Wgrad operand in 128x128 tiles: auto|off|dy|x
  char fusion[CFG_NAME];          // format-aware fusion: auto|on|off (the same bits either way)
  char scale_rounding[CFG_NAME];  // MXFP4 block exponent: auto|up (paper, encode-centric)|down (OCP)
  char fp4_gemm[CFG_NAME];        // GEMM back end: auto|reference (dequantize + BF16)|fp8 (Hopper)|fp4 (Blackwell)
  int bf16_first_blocks;          // per-block override: the first N blocks stay in BF16
  int bf16_last_blocks;           // the last N blocks stay in BF16 (the paper's NVFP4 variant: 4)
  char fprop[CFG_NAME], dgrad[CFG_NAME], wgrad[CFG_NAME];  // one contraction's format in every FP4 block, or auto
  char blocks[CFG_PATH];                                   // per-block formats: "FORMAT:A-B,..." (1-based)

  // checkpoint
  char ckpt_dir[CFG_PATH];   // empty disables checkpointing
  int ckpt_interval;         // steps between checkpoints (0: only at the end)
  int ckpt_keep;             // how many to keep
  int resume;                // 1: resume from the latest checkpoint in ckpt_dir if there is one
  int ckpt_async;            // 1: copy the state, write the file in a background thread (run/ckpt_async.h)
  char init_from[CFG_PATH];  // parameters to start from instead of the random init (scripts/hf/import_hf.py)

  // logging
  int log_interval;            // steps between log lines
  char log_file[CFG_PATH];     // JSONL metrics, empty disables
  char tensorboard[CFG_PATH];  // logging.tensorboard: folder of TensorBoard event files, empty disables
  int nvtx;                    // logging.nvtx: NVTX ranges around each block and op (CUDA backend)

  // eval
  int eval_interval;              // steps between validation passes (0 disables)
  int eval_batches;               // micro-batches per validation pass
  char eval_tasks[CFG_PATH];      // "hellaswag:10,arc_challenge:25,winogrande:5" (lm-evaluation-harness scoring)
  char eval_dir[CFG_PATH];        // where the task files are
  int eval_limit;                 // documents per task, 0: all
  char eval_samples[CFG_PATH];    // folder for per-document results, "" for none
  char tokenizer_path[CFG_PATH];  // data.tokenizer

  uint64_t seed;

  // reliability
  int max_bad_steps;   // consecutive non-finite (skipped) steps after which the run stops
  float spike_factor;  // a loss above spike_factor x the running mean is logged as a spike; 0: off
  int spike_window;    // steps in that running mean

  // parallel
  char backend[CFG_NAME];      // "auto", "cpu", "cuda"
  int threads;                 // CPU backend OpenMP threads (0: all)
  int data_parallel;           // expected world size (1 for single process)
  int deterministic;           // GPU: same bits in every process (the CPU backend always is)
  char gemm_plans[CFG_PATH];   // the record of GEMM choices (common/gemm_plans.h); "": checkpoint.dir's
  char recompute[CFG_NAME];    // activation recomputation: "none", "ffn", "full" (model/llama.h)
  char rendezvous[CFG_PATH];   // "env" (MASTER_ADDR/MASTER_PORT) or "file:/shared/path" (parallel/comm.h)
  float timeout_s;             // a collective or rendezvous waiting longer than this stops the run
  char grad_reduce[CFG_NAME];  // gradient reduction on the wire: "fp32" or "bf16" (parallel/comm.h)
  int shard_master;            // CUDA, world > 1: fp32 master weights sharded like the AdamW state (parallel/zero.h)
  int overlap_reduce;          // reduce gradients during the last micro-batch's backward (parallel/zero.h)
  float bucket_mb;             // MB of fp32 gradients per overlapped reduction; 0: every range on its own
  int dgrad_transposed;        // CUDA: keep BF16 W^T copies for a faster dgrad GEMM (model/cuda/ops_cuda.h)
} TrainConfig;

// Fills *c with the defaults of every key (model keys from the "tiny" preset); clears the key lines.
void config_defaults(TrainConfig *c);

// Each function below returns 0 on success, or -1 with a one-line message in err (never dies, so
// tests and fuzzers can drive it). The message names the source, line and key, for example
//   "configs/tiny.yaml:7: optim.lr: expected a number, got 'fast'".
// Loads a YAML file over *c (unknown keys, wrong types, out-of-range values are errors), then
// runs config_validate. On failure *c is left unchanged.
int config_load(TrainConfig *c, const char *path, char *err, size_t errlen);
// Same, from a YAML string in memory; 'name' stands for the path in messages.
int config_load_string(TrainConfig *c, const char *yaml, size_t len, const char *name, char *err, size_t errlen);
// Applies one "section.key=value" override (from --set). Messages name "--set section.key".
// "model.preset=X" re-applies the preset over every model key. It checks the value alone; run
// config_validate after the last override.
int config_set(TrainConfig *c, const char *assignment, char *err, size_t errlen);
// Cross-field checks (heads divide width, kv heads divide heads, the global batch divides by
// micro_batch * data_parallel, seq_len <= max_seq_len, warmup <= total, ...). 'where' names the
// source for the message; a key's line from the last config_load is added when known (not for
// defaults, preset-filled or --set keys), as in "t.yaml:3: batch.global_batch: 6 is not ...".
int config_validate(const TrainConfig *c, const char *where, char *err, size_t errlen);

// Writes every key with its value as YAML (the run's effective config; loadable again).
void config_write_yaml(const TrainConfig *c, FILE *f);
// Writes the key reference: key, type, default, range, one-line description (for --help-config).
void config_print_reference(FILE *f);
// The precision.* keys as fp4/recipe.h's spec (for recipe_resolve).
RecipeSpec config_recipe_spec(const TrainConfig *c);
