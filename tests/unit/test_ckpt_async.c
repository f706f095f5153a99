// tests/unit/test_ckpt_async.c: the background checkpoint writer (run/ckpt_async.h). A save's file
// holds the sections as they were at the submit, whatever the caller does to them afterwards; a
// second submit is refused while the first is pending and ckpt_writer_wait returns only once the
// file is complete; a failed write is reported with its path and leaves the writer usable; the copy
// hook (a device download) is called once per section; the whole-file checksum for a manifest is
// file_checksum's; closing lets a pending write finish. The pauses use checkpoint.c's test hook
// TRAIN_CKPT_PAUSE (a write holds after its first section until a file exists), so every wait is for
// an event. Works in a fresh directory under /tmp, removed at the end.
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "common/common.h"
#include "run/checkpoint.h"
#include "run/ckpt_async.h"
#include "run/manifest.h"
#include "tests/test.h"

static char root[64];
enum { NP = 100000 };  // floats in the "params" section: 400 KB, several writes

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }

// Polls (1 ms) until path exists; gives up after 60 s so that a broken writer fails the test, not hangs it.
static int wait_exists(const char *path) {
  for (int i = 0; i < 60000 && !test_exists(path); i++) nanosleep(&(struct timespec){0, 1000000L}, NULL);
  return test_exists(path);
}

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) ? -1 : (long)st.st_size;
}

// Polls (1 ms) until path holds some bytes (a write held after its first section has them; the file
// appears empty first); gives up after 60 s.
static int wait_written(const char *path) {
  for (int i = 0; i < 60000 && file_size(path) <= 0; i++) nanosleep(&(struct timespec){0, 1000000L}, NULL);
  return file_size(path) > 0;
}

// A stand-in for a device download: memcpy, counting calls and bytes in the context.
typedef struct {
  int calls;
  size_t bytes;
} CopyCount;
static void counting_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  CopyCount *c = ctx;
  c->calls++, c->bytes += bytes;
  memcpy(dst, src, bytes);
}

static void fill(float *p, float base) {
  for (int i = 0; i < NP; i++) p[i] = base + (float)i * 1e-3f;
}

// The releaser of a held write while the main thread is inside ckpt_writer_close: waits until close has
// been called (polling, 1 ms; 60 s at most), and only then releases the write by creating `go` (the
// pause hook holds it until then), so close is called with the write pending. It never touches the
// writer after that: close may free it as soon as the write is done.
typedef struct {
  CkptWriter *w;
  const char *go;
  int saw_close;
} Releaser;
static void *release_when_closing(void *p) {
  Releaser *r = p;
  for (int i = 0; i < 60000 && !(r->saw_close = ckpt_writer_closing(r->w)); i++)
    nanosleep(&(struct timespec){0, 1000000L}, NULL);
  fclose(xfopen(r->go, "w"));
  return NULL;
}

// 1 when path's "params" equal base's fill and its "meta" is meta; prints why not.
static int holds(const char *path, float base, const char *meta) {
  static float p[NP];
  char m[16] = "", err[1024];
  CkptSection s[] = {{"params", p, sizeof p}, {"meta", m, strlen(meta) + 1}};
  if (ckpt_load(path, s, 2, NULL, err, sizeof err)) {
    printf("  load: %s\n", err);
    return 0;
  }
  for (int i = 0; i < NP; i++)
    if (p[i] != base + (float)i * 1e-3f) {
      printf("  params[%d] = %g, want %g\n", i, p[i], base + (float)i * 1e-3f);
      return 0;
    }
  return !strcmp(m, meta);
}

static void test_stage_bytes(void) {
  TEST_SECTION("ckpt_stage_bytes: every section at a 64-byte boundary");
  size_t b[] = {1, 64, 65, 0, 200};
  CHECK(ckpt_stage_bytes(b, 5) == 64 + 64 + 128 + 0 + 256, "got %zu", ckpt_stage_bytes(b, 5));
  CHECK(ckpt_stage_bytes(b, 0) == 0, "no sections take no room");
}

static void test_complete(float *src, void *stage, size_t stage_bytes) {
  TEST_SECTION("a save completes: the file loads with the sections' bytes, the copy hook ran once");
  char dir[512];
  snprintf(dir, sizeof dir, "%s", test_path(root, "basic"));
  CkptWriter *w = ckpt_writer_open(stage, stage_bytes);
  CopyCount cc = {0};
  fill(src, 5);
  CkptSource s[] = {{"meta", "five", 5, NULL, NULL}, {"params", src, NP * sizeof(float), counting_copy, &cc}};
  char err[1024] = "";
  double stall = -1;
  CkptResult res;
  CHECK(ckpt_writer_wait(w, &res) == 0, "nothing to collect before a submit");
  int rc = ckpt_writer_submit(w, dir, 5, s, 2, 0, 1, &stall, err, sizeof err);
  CHECK(rc == 0, "submit: %s", err);
  CHECK(cc.calls == 1 && cc.bytes == NP * sizeof(float), "the copy hook ran %d times for %zu bytes", cc.calls,
        cc.bytes);
  CHECK(stall >= 0, "stall %g", stall);
  CHECK(ckpt_writer_wait(w, &res) == 1, "the save is collected");
  CHECK(!res.failed && res.step == 5, "failed %d (%s), step %lld", res.failed, res.err, (long long)res.step);
  CHECK(!strcmp(res.path, test_path(root, "basic/ckpt_00000005.bin")), "path %s", res.path);
  CHECK(holds(res.path, 5, "five"), "the file holds the submitted sections");
  CHECK(res.write_s >= 0 && res.stall_s >= 0, "times %g %g", res.write_s, res.stall_s);
  uint64_t sum = 0, bytes = 0;
  CHECK(file_checksum(res.path, &sum, &bytes, err, sizeof err) == 0 && sum == res.checksum && bytes == res.bytes &&
            (long)bytes == file_size(res.path),
        "the result's whole-file checksum is file_checksum's (%s)", err);
  CHECK(ckpt_writer_wait(w, &res) == 0, "a result is collected once");
  // Pruning (keep 2) runs on the writer's thread too.
  for (int step = 6; step <= 7; step++) {
    fill(src, (float)step);
    rc = ckpt_writer_submit(w, dir, step, s, 2, 2, 0, NULL, err, sizeof err);
    CHECK(rc == 0 && ckpt_writer_wait(w, &res) == 1 && !res.failed, "save %d: %s %s", step, err, res.err);
  }
  CHECK(!test_exists(test_path(root, "basic/ckpt_00000005.bin")) &&
            holds(test_path(root, "basic/ckpt_00000007.bin"), 7, "five"),
        "keep 2 pruned step 5 and kept 6 and 7");
  ckpt_writer_close(w);
}

static void test_snapshot_and_overlap(float *src, void *stage, size_t stage_bytes) {
  TEST_SECTION("the file holds the state at the submit; a second save waits for the first");
  char dir[512], go[512], tmp[600], final[600];
  snprintf(dir, sizeof dir, "%s", test_path(root, "snap"));
  snprintf(go, sizeof go, "%s", test_path(root, "snap_go"));
  snprintf(tmp, sizeof tmp, "%s/ckpt_00000002.bin.tmp", dir);
  snprintf(final, sizeof final, "%s/ckpt_00000002.bin", dir);
  setenv("TRAIN_CKPT_PAUSE", go, 1);
  CkptWriter *w = ckpt_writer_open(stage, stage_bytes);
  char meta[8] = "two";
  CkptSource s[] = {{"meta", meta, 4, NULL, NULL}, {"params", src, NP * sizeof(float), NULL, NULL}};
  char err[1024] = "";
  fill(src, 2);
  CHECK(ckpt_writer_submit(w, dir, 2, s, 2, 0, 0, NULL, err, sizeof err) == 0, "submit: %s", err);
  CHECK(wait_written(tmp), "the write started (its temp file has its first bytes)");
  // The write holds after its first section: the state changes under it, as training goes on.
  fill(src, 99);
  strcpy(meta, "bad");
  CHECK(ckpt_writer_busy(w) == 1, "the writer is busy while the write is held");
  CHECK(!test_exists(final) && file_size(tmp) > 0 && file_size(tmp) < (long)(NP * sizeof(float)),
        "only a partial temp file is on disk (%ld bytes)", file_size(tmp));
  int rc = ckpt_writer_submit(w, dir, 3, s, 2, 0, 0, NULL, err, sizeof err);
  CHECK(rc == -1 && strstr(err, "step 2 is still pending"), "a second submit is refused: %s", err);
  FILE *f = xfopen(go, "w");  // release the write
  fclose(f);
  CkptResult res;
  CHECK(ckpt_writer_wait(w, &res) == 1 && !res.failed && res.step == 2, "the first save completes: %s", res.err);
  CHECK(test_exists(final) && !test_exists(tmp), "when wait returns the file is in place, no temp file left");
  CHECK(holds(final, 2, "two"), "the file holds the state at the submit, not the later changes");
  CHECK(ckpt_writer_busy(w) == 0, "idle after the wait");
  rc = ckpt_writer_submit(w, dir, 3, s, 2, 0, 0, NULL, err, sizeof err);
  CHECK(rc == 0 && ckpt_writer_wait(w, &res) == 1 && !res.failed, "then the second save runs: %s %s", err, res.err);
  CHECK(holds(res.path, 99, "bad"), "and holds the state at its own submit");
  ckpt_writer_close(w);

  // Closing with a save pending lets the write finish (train.c waits first; this is the backstop).
  remove(go);
  w = ckpt_writer_open(stage, stage_bytes);
  fill(src, 4);
  snprintf(tmp, sizeof tmp, "%s/ckpt_00000004.bin.tmp", dir);
  CHECK(ckpt_writer_submit(w, dir, 4, s, 2, 0, 0, NULL, err, sizeof err) == 0, "submit: %s", err);
  CHECK(wait_exists(tmp), "the write of step 4 started");
  // released only once close is waiting for it (close would wait forever without the releaser)
  char final4[512];
  snprintf(final4, sizeof final4, "%s", test_path(root, "snap/ckpt_00000004.bin"));
  Releaser rel = {w, go, 0};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, release_when_closing, &rel) == 0, "the releaser thread starts");
  ckpt_writer_close(w);
  const int done = holds(final4, 4, "bad");  // looked at as close returns, before anything else runs here
  pthread_join(th, NULL);
  CHECK(rel.saw_close, "the releaser saw close called while the write of step 4 was held");
  CHECK(done, "close waited for the pending write: the file is complete when it returns");
  unsetenv("TRAIN_CKPT_PAUSE");
}

static void test_failures(float *src, void *stage, size_t stage_bytes) {
  TEST_SECTION("a failed write is reported with its path; refused submits leave nothing pending");
  char afile[512], dir[512], err[1024] = "";
  snprintf(afile, sizeof afile, "%s", test_path(root, "afile"));
  snprintf(dir, sizeof dir, "%s", test_path(root, "fail"));
  FILE *f = xfopen(afile, "w");
  fclose(f);
  CkptWriter *w = ckpt_writer_open(stage, stage_bytes);
  fill(src, 1);
  CkptSource s[] = {{"meta", "one", 4, NULL, NULL}, {"params", src, NP * sizeof(float), NULL, NULL}};
  CkptResult res;
  CHECK(ckpt_writer_submit(w, afile, 1, s, 2, 0, 0, NULL, err, sizeof err) == 0, "submit: %s", err);
  CHECK(ckpt_writer_wait(w, &res) == 1 && res.failed && strstr(res.err, afile), "the failure names the path: %s",
        res.err);
  CHECK(ckpt_writer_submit(w, dir, 1, s, 2, 0, 0, NULL, err, sizeof err) == 0 && ckpt_writer_wait(w, &res) == 1 &&
            !res.failed && holds(res.path, 1, "one"),
        "the writer goes on after a failure: %s %s", err, res.err);

  CkptWriter *small = ckpt_writer_open(stage, 1000);
  int rc = ckpt_writer_submit(small, dir, 2, s, 2, 0, 0, NULL, err, sizeof err);
  CHECK(rc == -1 && strstr(err, "staging"), "sections larger than the stage are refused: %s", err);
  CHECK(ckpt_writer_wait(small, &res) == 0, "... and nothing is pending");
  ckpt_writer_close(small);
  CkptSource bad[] = {{"", "x", 2, NULL, NULL}};
  rc = ckpt_writer_submit(w, dir, 2, bad, 1, 0, 0, NULL, err, sizeof err);
  CHECK(rc == -1 && strstr(err, "name") && ckpt_writer_wait(w, &res) == 0, "an empty section name is refused: %s", err);
  CkptSource many[CKPT_ASYNC_MAX_SECTIONS + 1];
  for (int i = 0; i <= CKPT_ASYNC_MAX_SECTIONS; i++) many[i] = (CkptSource){"x", "x", 2, NULL, NULL};
  rc = ckpt_writer_submit(w, dir, 2, many, CKPT_ASYNC_MAX_SECTIONS + 1, 0, 0, NULL, err, sizeof err);
  CHECK(rc == -1 && strstr(err, "sections"), "too many sections are refused: %s", err);
  ckpt_writer_close(w);
}

static void test_two_writers(float *src, void *stage, size_t stage_bytes) {
  TEST_SECTION("two writers share nothing: both write their own file at the same time");
  float *src2 = xmalloc(NP * sizeof(float));
  void *stage2 = xmalloc(stage_bytes);
  CkptWriter *a = ckpt_writer_open(stage, stage_bytes), *b = ckpt_writer_open(stage2, stage_bytes);
  fill(src, 10), fill(src2, 20);
  CkptSource sa[] = {{"meta", "a", 2, NULL, NULL}, {"params", src, NP * sizeof(float), NULL, NULL}};
  CkptSource sb[] = {{"meta", "b", 2, NULL, NULL}, {"params", src2, NP * sizeof(float), NULL, NULL}};
  char err[1024] = "", dir_a[512], dir_b[512];
  snprintf(dir_a, sizeof dir_a, "%s", test_path(root, "wa"));
  snprintf(dir_b, sizeof dir_b, "%s", test_path(root, "wb"));
  CHECK(ckpt_writer_submit(a, dir_a, 10, sa, 2, 0, 0, NULL, err, sizeof err) == 0, "a: %s", err);
  CHECK(ckpt_writer_submit(b, dir_b, 20, sb, 2, 0, 0, NULL, err, sizeof err) == 0, "b: %s", err);
  CkptResult ra, rb;
  CHECK(ckpt_writer_wait(b, &rb) == 1 && ckpt_writer_wait(a, &ra) == 1 && !ra.failed && !rb.failed, "%s %s", ra.err,
        rb.err);
  CHECK(holds(ra.path, 10, "a") && holds(rb.path, 20, "b"), "each file holds its own writer's sections");
  ckpt_writer_close(a);
  ckpt_writer_close(b);
  free(stage2);
  free(src2);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/test_ckpt_async_XXXXXX");
  if (!mkdtemp(root)) die("cannot create a temp directory: %s", strerror(errno));
  unsetenv("TRAIN_CKPT_PAUSE");
  unsetenv("TRAIN_CKPT_SLOW_MS");
  float *src = xmalloc(NP * sizeof(float));
  size_t sizes[] = {16, NP * sizeof(float)}, stage_bytes = ckpt_stage_bytes(sizes, 2);
  void *stage = xmalloc(stage_bytes);
  test_stage_bytes();
  test_complete(src, stage, stage_bytes);
  test_snapshot_and_overlap(src, stage, stage_bytes);
  test_failures(src, stage, stage_bytes);
  test_two_writers(src, stage, stage_bytes);
  free(stage);
  free(src);
  nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  TEST_END();
}
