// run/bench.h: `./train --bench CONFIG`: training-step throughput at the config's real shapes with
// fewer layers, extrapolated to the config's depth (the full 8B state does not fit one GPU).
#pragma once
#include "run/config.h"
#include "model/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// layers: two depths "a,b" (e.g. "2,4"); steps: timed steps per depth. Prints a table; returns 0.
int bench_main(TrainConfig *cfg, const Ops *ops, const char *layers, int steps);

#ifdef __cplusplus
}
#endif
