// run/run.h: the state of one training run, shared by train.c (the loop) and run/resume.c (checkpoint
// save, resume and init_from for it).
#pragma once
#include <stdint.h>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "parallel/comm.h"
#include "run/ckpt_async.h"
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
  // Checkpoint staging (run/resume.c's checkpoint_open): host room for what this rank saves (the
  // params on rank 0, its m and v; with checkpoint.async the small sections too), pinned when the
  // backend can. NULL without checkpoint.dir, and on the CPU without checkpoint.async.
  float *host_stage;
  size_t stage_bytes;
  int stage_pinned;       // from Ops.host_alloc (else malloc)
  CkptWriter *writer;     // checkpoint.async: the background writer, from the first save on
  int64_t pending_step;   // the save being written in the background (-1: none)
  int pending_collected;  // its file is written (the result is in `pending`); world > 1: the manifest waits
  double pending_stall;   // seconds the save held training up (the gather and the copies)
  CkptResult pending;
  Tokenizer *tok;  // eval.tasks: the tokenizer and the parsed, tokenized tasks
  McTask *tasks[EVAL_MAX_TASKS];
  int n_tasks;
  RunMeta meta;
  RecipeMeta recipe;
  char route[256];       // recipe_route_key: the spans and per-contraction formats, saved as the "route" section
  int64_t step;          // optimizer steps completed
  int64_t saved_step;    // step of the newest checkpoint of this run, saved or being written (-1: none yet)
  char last_ckpt[4200];  // the newest complete one's path (a manifest when sharded), for messages when
                         // something goes wrong
} Run;

int on_host(const Run *r);     // the backend computes in host memory (no staging needed)
void checkpoint_open(Run *r);  // the staging buffer; after zero_create, before resume and init_from
void save_checkpoint(Run *r);  // this rank's part of a checkpoint at r->step (a manifest when sharded)
// checkpoint.async: at every step boundary, reports a background write that is done, with world > 1
// once every rank's is (then the manifest). In two halves around the step's one all-reduce of its
// agreement (train.c), which carries their flags: poll_begin collects this rank's write if it is done
// (stopping the run if it failed) and returns 1 when it has been collected; poll_end takes the agreed
// number of ranks that returned 1 and finishes the save once all have. Every rank calls both at the
// same points.
int checkpoint_poll_begin(Run *r);
void checkpoint_poll_end(Run *r, double collected_ranks);
void checkpoint_wait(Run *r);   // waits for a pending background write and reports it (collective when world > 1)
void checkpoint_close(Run *r);  // stops the writer, frees the staging buffer
int resume(Run *r);             // loads the newest complete checkpoint; 1 if one was loaded
void init_from(Run *r);         // checkpoint.init_from: parameters from another file, when not resuming
