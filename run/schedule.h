// run/schedule.h: the learning rate as a function of the optimizer step.
#pragma once
#include <stdint.h>

#include "run/config.h"

// The learning rate for optimizer step `step`, counted from 0 for the first update. Uses c->lr,
// schedule, warmup_steps, total_steps, min_lr_ratio, decay_start, decay_steps. With
// lr_min = lr * min_lr_ratio and W = warmup_steps:
//   warmup (all schedules), step < W:  lr * (step + 1) / W   (step 0 is not lr 0; step W-1 is lr)
//   "constant":                        lr
//   "cosine":  p = (step - W) / (total_steps - W), clamped to [0, 1]:
//                                      lr_min + (lr - lr_min) * (1 + cos(pi p)) / 2
//              (lr at step W, lr_min from step total_steps on; p = 1 when total_steps <= W)
//   "wsd" (warmup-stable-decay, linear decay):
//              step < decay_start:     lr
//              p = (step - decay_start) / decay_steps, clamped to [0, 1] (1 when decay_steps <= 0):
//                                      lr - (lr - lr_min) * p
//              (lr at step decay_start, lr_min from step decay_start + decay_steps on)
// Linear is the common WSD decay shape (1-sqrt is the other one in use). An unknown
// schedule name dies naming it (the config loader rejects one first).
float lr_at(const TrainConfig *c, int64_t step);
