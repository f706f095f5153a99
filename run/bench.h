// run/bench.h: `./train --bench CONFIG`: training-step throughput at the config's real shapes with
// fewer layers, extrapolated to the config's depth (the full 8B state does not fit one GPU); and
// `--bench-save`, the cost of a checkpoint save at those shapes.
#pragma once
#include "fp4/recipe.h"
#include "model/ops.h"
#include "run/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// recipe: the config's, resolved for this backend (train.c's apply_recipe). layers: two depths "a,b"
// (e.g. "2,4"); steps: timed steps per depth. Prints a table; returns 0.
int bench_main(TrainConfig *cfg, const Ops *ops, const Recipe *recipe, const char *layers, int steps);

// `./train CONFIG --bench-save [--layers N]`: what a checkpoint save costs at the config's shapes with
// N layers (default: the config's depth, at most 4): the stall (params and AdamW m, v copied into the
// staging buffer, pinned on a GPU; run/ckpt_async.h) and the background write, three times, with
// training steps running during each write (their time against steps alone), then both figures
// extrapolated to the config's depth for a rank of 1, 2, 4 and 8 data-parallel ranks. The files go
// to checkpoint.dir/bench_save, else a new directory in /tmp, one at a time, removed after.
int bench_save_main(TrainConfig *cfg, const Ops *ops, const Recipe *recipe, int layers, int steps);

#ifdef __cplusplus
}
#endif
