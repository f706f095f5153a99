// run/metrics.c: the metrics log (run/metrics.h): JSONL lines and TensorBoard events from the same
// formatted numbers.
#include "run/metrics.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "run/tensorboard.h"

struct MetricsLog {
  FILE *jsonl;
  char jsonl_path[1024];
  TbWriter *tb;
  int64_t step;    // of the record being written; < 0: none
  char event[64];  // of the record being written; "" for metrics
  int fields;      // of the record being written, so far
  int tb_scalars;  // scalars of the record given to tb
  double t0;       // wall clock (s since the epoch) at the monotonic clock's zero: event wall times
};

static double wall_offset(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9 - now_seconds();
}

MetricsLog *metrics_open(const char *jsonl, const char *tb_dir, int64_t step) {
  int want_jsonl = jsonl && *jsonl, want_tb = tb_dir && *tb_dir;
  if (!want_jsonl && !want_tb) return NULL;
  MetricsLog *m = xcalloc(1, sizeof *m);
  m->step = -1;
  m->t0 = wall_offset();
  if (want_jsonl) {
    snprintf(m->jsonl_path, sizeof m->jsonl_path, "%s", jsonl);
    m->jsonl = xfopen(jsonl, step > 0 ? "a" : "w");
    // A resumed run appends: mark where, so a reader knows that lines for the steps after the
    // checkpoint may appear twice (the later ones win; on the CPU backend they are identical).
    if (step > 0) fprintf(m->jsonl, "{\"step\": %lld, \"event\": \"resumed\"}\n", (long long)step);
  }
  if (want_tb) {
    char err[2048];
    m->tb = tb_open(tb_dir, step, err, sizeof err);
    if (!m->tb) die("%s", err);
  }
  return m;
}

MetricsLog *metrics_open_append(const char *jsonl) {
  if (!jsonl || !*jsonl) return NULL;
  MetricsLog *m = xcalloc(1, sizeof *m);
  m->step = -1;
  snprintf(m->jsonl_path, sizeof m->jsonl_path, "%s", jsonl);
  m->jsonl = xfopen(jsonl, "a");
  return m;
}

void metrics_begin(MetricsLog *m, int64_t step, const char *event) {
  if (!m) return;
  m->step = step, m->fields = 0, m->tb_scalars = 0;
  snprintf(m->event, sizeof m->event, "%s", event ? event : "");
  if (!m->jsonl) return;
  fputc('{', m->jsonl);
  if (step >= 0) fprintf(m->jsonl, "\"step\": %lld", (long long)step), m->fields++;
  if (event) fprintf(m->jsonl, "%s\"event\": \"%s\"", m->fields++ ? ", " : "", event);
}

// What goes before a field: ", " unless it is the record's first.
static const char *sep(MetricsLog *m) { return m->fields++ ? ", " : ""; }

void metrics_num(MetricsLog *m, const char *key, const char *fmt, double v) {
  if (!m) return;
  char num[64];
  snprintf(num, sizeof num, fmt, v);
  if (m->jsonl) fprintf(m->jsonl, "%s\"%s\": %s", sep(m), key, num);
  if (m->tb && m->step >= 0) {
    char tag[256];
    snprintf(tag, sizeof tag, "%s%s%s", m->event, m->event[0] ? "/" : "", key);
    tb_scalar(m->tb, tag, strtof(num, NULL));  // the number as the JSONL has it, in float32
    m->tb_scalars++;
  }
}

void metrics_text(MetricsLog *m, const char *key, const char *s) {
  if (!m || !m->jsonl) return;
  fprintf(m->jsonl, "%s\"%s\": \"", sep(m), key);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\') fprintf(m->jsonl, "\\%c", *c);
    else if (*c == '\n') fputs("\\n", m->jsonl);
    else if (*c < 0x20) fprintf(m->jsonl, "\\u%04x", *c);
    else fputc(*c, m->jsonl);
  }
  fputc('"', m->jsonl);
}

void metrics_end(MetricsLog *m) {
  if (!m) return;
  if (m->jsonl) fputs("}\n", m->jsonl);
  if (m->tb && m->tb_scalars) tb_event(m->tb, m->step, m->t0 + now_seconds());
  m->step = -1, m->event[0] = 0;
}

static void flush(MetricsLog *m, int sync) {
  if (!m) return;
  if (m->jsonl && (fflush(m->jsonl) || (sync && fsync(fileno(m->jsonl)))))
    die("logging.file: writing %s: %s (a full disk?)", m->jsonl_path, strerror(errno));
  if (m->tb) tb_flush(m->tb, sync);
}

void metrics_flush(MetricsLog *m) { flush(m, 0); }
void metrics_sync(MetricsLog *m) { flush(m, 1); }

void metrics_close(MetricsLog *m) {
  if (!m) return;
  flush(m, 1);
  if (m->jsonl) fclose(m->jsonl);
  tb_close(m->tb);
  free(m);
}
