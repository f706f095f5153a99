// run/metrics.h: the run's metrics log, written by rank 0: the JSONL file (logging.file) and the
// TensorBoard event files (logging.tensorboard, run/tensorboard.h). A record is one JSONL line,
//   {"step": 120, "loss": 2.2530, "lr": 0.003, ...}          metrics of a step
//   {"step": 6, "event": "skipped", "loss": "nan", ...}      an event at a step
//   {"event": "header", ...}                                 no step: what the run is (MFU conventions, config)
// and, when it has a step and numbers, one TensorBoard Event of that step whose scalars are those
// numbers, tagged by their key (an event's as EVENT/KEY: "spike/loss"). Each number is formatted
// once and TensorBoard gets that text's value in float32, so the two logs agree exactly.
// docs/logging.md lists every record and key.
#pragma once
#include <stdint.h>

typedef struct MetricsLog MetricsLog;

// For training. step 0: a fresh run, the JSONL is started anew and earlier event files in the
// folder are cut to nothing; step > 0: a resume, the JSONL is appended to after a
// {"step": S, "event": "resumed"} line, and earlier event files are cut at step S so that no step
// appears in two of them (a killed run logged steps past its last checkpoint). "" or NULL: not
// written. Returns NULL when neither is named. Dies with a message naming the path on failure.
MetricsLog *metrics_open(const char *jsonl, const char *tb_dir, int64_t step);
// For --eval-only: appends to the JSONL only.
MetricsLog *metrics_open_append(const char *jsonl);

// One record: begin (step < 0: none; event NULL: a metrics record), then its fields, then end.
// Every call accepts m == NULL and does nothing.
void metrics_begin(MetricsLog *m, int64_t step, const char *event);
void metrics_num(MetricsLog *m, const char *key, const char *fmt, double v);  // printf fmt of a double
void metrics_text(MetricsLog *m, const char *key, const char *s);             // a JSON string; not a scalar
void metrics_end(MetricsLog *m);

void metrics_flush(MetricsLog *m);  // to the OS: once per step, so a crash loses at most that step
void metrics_sync(MetricsLog *m);   // and to the disk: at checkpoints
void metrics_close(MetricsLog *m);
