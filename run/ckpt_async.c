// run/ckpt_async.c: see ckpt_async.h. One mutex and one condition variable guard the writer's
// state; the thread sleeps on the condition until a job arrives, writes it without holding the
// lock (the stage belongs to it until it reports the job done), and signals the end.
#include "run/ckpt_async.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "run/checkpoint.h"

#define STAGE_ALIGN 64

typedef enum {
  W_IDLE,     // nothing pending: a submit may start
  W_WRITING,  // the thread owns the job and the stage
  W_DONE,     // written (or failed); the result waits for ckpt_writer_wait
} WriterState;

struct CkptWriter {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;  // signalled on every change of state or stop
  WriterState state;
  int stop;
  unsigned char *stage;
  size_t stage_bytes;
  // The job: filled by submit while idle, read by the thread while writing.
  char dir[4096];
  int64_t step;
  int keep, file_checksum, n;
  char names[CKPT_ASYNC_MAX_SECTIONS][CKPT_NAME_MAX + 1];
  CkptSection secs[CKPT_ASYNC_MAX_SECTIONS];
  CkptResult res;
};

static size_t align_up(size_t x) { return (x + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN; }

void *ckpt_stage_alloc(void *(*alloc)(void *ctx, size_t bytes), void *ctx, size_t stage_bytes, int *pinned) {
  void *p = alloc ? alloc(ctx, stage_bytes) : NULL;
  *pinned = p != NULL;
  return p ? p : memset(xmalloc(stage_bytes), 0, stage_bytes);
}

void ckpt_stage_free(void (*free_pinned)(void *ctx, void *p), void *ctx, void *stage, int pinned) {
  if (pinned) free_pinned(ctx, stage);
  else free(stage);
}

size_t ckpt_stage_bytes(const size_t *bytes, int n) {
  size_t total = 0;
  for (int i = 0; i < n; i++) total += align_up(bytes[i]);
  return total;
}

// The write itself, on the writer's thread: what the synchronous path does on the caller's.
static void write_job(CkptWriter *w) {
  CkptResult *r = &w->res;
  double t0 = now_seconds();
  // with file_checksum, hashed from memory (ckpt_save_sum): the file is not read back
  r->failed = ckpt_save_sum(w->dir, w->step, w->secs, w->n, w->keep, w->file_checksum ? &r->checksum : NULL, &r->bytes,
                            r->err, sizeof r->err) != 0;
  r->write_s = now_seconds() - t0;
}

static void *writer_main(void *arg) {
  CkptWriter *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (w->state != W_WRITING && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
    if (w->state != W_WRITING) break;  // stop, with nothing left to write
    pthread_mutex_unlock(&w->mu);
    write_job(w);
    pthread_mutex_lock(&w->mu);
    w->state = W_DONE;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

CkptWriter *ckpt_writer_open(void *stage, size_t stage_bytes) {
  CkptWriter *w = xcalloc(1, sizeof *w);
  w->stage = stage;
  w->stage_bytes = stage_bytes;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  // The thread starts with every signal blocked, so that SIGTERM, SIGINT and SIGUSR1 reach the
  // caller's thread (train.c's handlers), never the one inside a write.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int e = pthread_create(&w->thread, NULL, writer_main, w);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (e) die("checkpoint.async: cannot start the checkpoint writer thread: %s", strerror(e));
  return w;
}

static WriterState state_of(CkptWriter *w) {
  pthread_mutex_lock(&w->mu);
  WriterState s = w->state;
  pthread_mutex_unlock(&w->mu);
  return s;
}

int ckpt_writer_submit(CkptWriter *w, const char *dir, int64_t step, const CkptSource *src, int n, int keep,
                       int file_checksum, double *stall_s, char *err, size_t errlen) {
  if (state_of(w) != W_IDLE)
    return set_err(err, errlen,
                   "checkpoint at step %lld: the save of step %lld is still pending (two saves never overlap: "
                   "collect it with ckpt_writer_wait first)",
                   (long long)step, (long long)w->step);
  if (n < 0 || n > CKPT_ASYNC_MAX_SECTIONS)
    return set_err(err, errlen, "checkpoint at step %lld: %d sections, the writer takes 0 to %d", (long long)step, n,
                   CKPT_ASYNC_MAX_SECTIONS);
  size_t sizes[CKPT_ASYNC_MAX_SECTIONS];
  for (int i = 0; i < n; i++) sizes[i] = src[i].bytes;
  if (ckpt_stage_bytes(sizes, n) > w->stage_bytes)
    return set_err(err, errlen, "checkpoint at step %lld: its sections need %zu bytes of staging, the writer has %zu",
                   (long long)step, ckpt_stage_bytes(sizes, n), w->stage_bytes);
  for (int i = 0; i < n; i++)
    if (!src[i].name || !src[i].name[0] || strlen(src[i].name) > CKPT_NAME_MAX)
      return set_err(err, errlen, "checkpoint section %d: name '%s' must be 1 to %d bytes", i,
                     src[i].name ? src[i].name : "(null)", CKPT_NAME_MAX);
  if (strlen(dir) >= sizeof w->dir) return set_err(err, errlen, "checkpoint directory '%s' is too long", dir);
  // Idle: the thread does not touch the job or the stage until the state says so.
  double t0 = now_seconds();
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    unsigned char *dst = w->stage + off;
    if (src[i].bytes && src[i].copy) src[i].copy(src[i].copy_ctx, dst, src[i].src, src[i].bytes);
    else if (src[i].bytes) memcpy(dst, src[i].src, src[i].bytes);
    snprintf(w->names[i], sizeof w->names[i], "%s", src[i].name);
    w->secs[i] = (CkptSection){w->names[i], dst, src[i].bytes};
    off += align_up(src[i].bytes);
  }
  snprintf(w->dir, sizeof w->dir, "%s", dir);
  w->step = step, w->keep = keep, w->file_checksum = file_checksum, w->n = n;
  w->res = (CkptResult){.step = step, .stall_s = now_seconds() - t0};
  snprintf(w->res.path, sizeof w->res.path, "%s/ckpt_%08lld.bin", dir, (long long)step);
  if (stall_s) *stall_s = w->res.stall_s;
  pthread_mutex_lock(&w->mu);
  w->state = W_WRITING;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  return 0;
}

int ckpt_writer_busy(CkptWriter *w) { return state_of(w) == W_WRITING; }

int ckpt_writer_wait(CkptWriter *w, CkptResult *res) {
  pthread_mutex_lock(&w->mu);
  while (w->state == W_WRITING) pthread_cond_wait(&w->cv, &w->mu);
  int had = w->state == W_DONE;
  if (had) {
    *res = w->res;
    w->state = W_IDLE;
  }
  pthread_mutex_unlock(&w->mu);
  return had;
}

int ckpt_writer_closing(CkptWriter *w) {
  pthread_mutex_lock(&w->mu);
  const int stop = w->stop;
  pthread_mutex_unlock(&w->mu);
  return stop;
}

void ckpt_writer_close(CkptWriter *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);  // the thread finishes a write in progress first
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  free(w);
}
