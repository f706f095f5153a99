// run/schedule.c: see schedule.h for the formulas.
#include "run/schedule.h"

#include <math.h>
#include <string.h>

#include "common/common.h"

// Fraction of the way from `start` to `start + len`, clamped to [0, 1]; an empty phase is done.
static double progress(int64_t step, int64_t start, int64_t len) {
  if (len <= 0) return 1.0;
  double p = (double)(step - start) / (double)len;
  return p < 0.0 ? 0.0 : p > 1.0 ? 1.0 : p;
}

float lr_at(const TrainConfig *c, int64_t step) {
  int cosine = !strcmp(c->schedule, "cosine"), wsd = !strcmp(c->schedule, "wsd");
  if (!cosine && !wsd && strcmp(c->schedule, "constant"))
    die("schedule.type '%s' is unknown (expected constant, cosine or wsd)", c->schedule);
  double lr = c->lr, lr_min = (double)c->lr * c->min_lr_ratio;
  if (step < c->warmup_steps) return (float)(lr * (double)(step + 1) / c->warmup_steps);
  if (cosine) {
    double p = progress(step, c->warmup_steps, (int64_t)c->total_steps - c->warmup_steps);
    return (float)(lr_min + (lr - lr_min) * 0.5 * (1.0 + cos(M_PI * p)));
  }
  if (!wsd || step < c->decay_start) return (float)lr;
  double p = progress(step, c->decay_start, c->decay_steps);
  return (float)(lr - (lr - lr_min) * p);
}
