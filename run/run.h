// run/run.h: the state of one training run, shared by train.c (the loop) and run/resume.c (checkpoint
// save, resume and init_from for it).
#pragma once
#include <stdint.h>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "parallel/comm.h"
#include "run/config.h"
#include "model/llama.h"
#include "run/mc_eval.h"
#include "model/ops.h"
#include "parallel/zero.h"

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

// What a file for checkpoint.init_from says about its parameters, saved as "init_meta" by
// scripts/hf/import_hf.py (ckpt_io.pack_init_meta): 60 bytes, no padding. A training checkpoint can
// serve as well: its "meta" holds the same LlamaConfig.
typedef struct {
  uint32_t version;
  LlamaConfig model;
} InitMeta;
#define INIT_META_VERSION 1

// The precision recipe's details, resolved ("auto" replaced by what it means), saved as the
// "recipe" section. The GEMM back end is left out: it changes speed, not the recipe. Checkpoints
// written before this section existed have none, and are only checked against precision.recipe.
typedef struct {
  int32_t sr_dgrad, sr_wgrad, hadamard, weight_2d, scale_round_up, bf16_first, bf16_last;
} RecipeMeta;

typedef struct {
  TrainConfig cfg;
  const Ops *ops;  // the backend instance (model/backend.c): the CPU table or the CUDA one
  Llama *model;
  Comm *comm;  // the data-parallel job (world 1: no other process, no sockets)
  int rank, world;
  Zero *zero;  // the optimizer: AdamW moments of this rank's shard (all of them when world is 1)
  DataLoader *train, *val;
  int *inputs, *targets;
  float *host_stage;  // device backends: host room for the params and the m, v shards of a checkpoint
  Tokenizer *tok;     // eval.tasks: the tokenizer and the parsed, tokenized tasks
  McTask *tasks[EVAL_MAX_TASKS];
  int n_tasks;
  RunMeta meta;
  RecipeMeta recipe;
  char route[256];       // recipe_route_key: the spans and per-contraction formats, saved as the "route" section
  int64_t step;          // optimizer steps completed
  int64_t saved_step;    // step of the newest checkpoint of this run (-1: none yet)
  char last_ckpt[4200];  // its path (a manifest when sharded), for messages when something goes wrong
} Run;

int on_host(const Run *r);     // the backend computes in host memory (no staging needed)
void save_checkpoint(Run *r);  // this rank's part of a checkpoint at r->step (a manifest when sharded)
int resume(Run *r);            // loads the newest complete checkpoint; 1 if one was loaded
void init_from(Run *r);        // checkpoint.init_from: parameters from another file, when not resuming
