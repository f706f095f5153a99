// tests/unit/test_gemm_plans.c: the record of GEMM choices (common/gemm_plans.h): which choice and
// which file a process takes (parallel.deterministic, parallel.gemm_plans, checkpoint.dir, ranks,
// --bench); a record written and read back entry for entry, in the documented text form; an entry of
// another GPU, compute capability or cuBLASLt version is not used; a truncated, damaged, foreign or
// malformed file is refused with a message naming it; a save replaces the file whole (a stale temp
// file is ignored, a failed save leaves the old record as it was); two processes sharing a record
// through its lock lose none of each other's entries. Then the config's defaults
// (parallel.deterministic true, parallel.gemm_plans empty) and the CPU backend, which writes no record.
// Works in a fresh directory under /tmp, removed at the end.
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "common/gemm_plans.h"
#include "model/ops.h"
#include "run/config.h"
#include "tests/test.h"

static char root[64];

static void write_text(const char *path, const char *text) {
  FILE *f = xfopen(path, "wb");
  xfwrite(text, 1, strlen(text), f, path);
  fclose(f);
}

// A record file with the given entry lines, its end line and checksum made as gemm_plans_save makes
// them, so that only what the test puts in the lines can be wrong.
static void write_record(const char *path, const char *lines, int count) {
  char body[4096], end[64];
  snprintf(body, sizeof body, "fp4train gemm_plans 1\n%s", lines);
  snprintf(end, sizeof end, "end %d %016llx\n", count, (unsigned long long)hash64(body, strlen(body), 0));
  strcat(body, end);
  write_text(path, body);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static const GemmPlanDevice H200 = {"NVIDIA H200", 90, 130100};

static void test_choice(void) {
  TEST_SECTION("which choice and which record");
  char p[256];
  CHECK(gemm_plans_choice(0, "x/plans", "ck", 1, 0, 0, p, sizeof p) == GEMM_TIMED && !p[0],
        "deterministic false: timed in each process, no record (path '%s')", p);
  CHECK(gemm_plans_choice(1, "", "ck", 1, 0, 0, p, sizeof p) == GEMM_RECORDED && !strcmp(p, "ck/gemm_plans"),
        "deterministic with checkpoint.dir: recorded in ck/gemm_plans, got '%s'", p);
  CHECK(gemm_plans_choice(1, "x/plans", "ck", 1, 0, 0, p, sizeof p) == GEMM_RECORDED && !strcmp(p, "x/plans"),
        "parallel.gemm_plans wins over checkpoint.dir: got '%s'", p);
  CHECK(gemm_plans_choice(1, "", "ck", 4, 3, 0, p, sizeof p) == GEMM_RECORDED && !strcmp(p, "ck/gemm_plans.rank_3"),
        "rank 3 of 4 records on its own: got '%s'", p);
  CHECK(gemm_plans_choice(1, "x/plans", "", 2, 0, 0, p, sizeof p) == GEMM_RECORDED && !strcmp(p, "x/plans.rank_0"),
        "rank 0 of 2 with parallel.gemm_plans: got '%s'", p);
  CHECK(gemm_plans_choice(1, "", "", 1, 0, 0, p, sizeof p) == GEMM_HEURISTIC && !p[0],
        "deterministic without any record: heuristic #0 (path '%s')", p);
  CHECK(gemm_plans_choice(1, "", "ck", 1, 0, 1, p, sizeof p) == GEMM_TIMED && !p[0],
        "--bench leaves checkpoint.dir alone and times (path '%s')", p);
  CHECK(gemm_plans_choice(1, "x/plans", "ck", 1, 0, 1, p, sizeof p) == GEMM_RECORDED && !strcmp(p, "x/plans"),
        "--bench with parallel.gemm_plans records there: got '%s'", p);
  CHECK(gemm_plans_choice(1, "", "a_long_checkpoint_dir", 1, 0, 0, p, 16) == -1 && !p[0],
        "a path longer than the buffer is an error, not a truncated path");
  CHECK(!strcmp(gemm_choice_name(GEMM_RECORDED), "recorded") && !strcmp(gemm_choice_name(GEMM_HEURISTIC), "heuristic"),
        "names");
}

static void test_round_trip(void) {
  TEST_SECTION("write, read back, other devices");
  char err[2048] = "";
  GemmPlans r;
  CHECK(gemm_plans_load(&r, test_path(root, "sub/gemm_plans"), err, sizeof err) == 0 && r.n == 0,
        "a missing file is an empty record: %s", err);
  const int k1[GEMM_PLAN_KEY_INTS] = {1, 0, 0, 1, 8192, 4096, 14336, 1, 256};
  const int k2[GEMM_PLAN_KEY_INTS] = {6, 1, 0, 1, 8192, 14336, 4096, 0, -7, 0, 0, 2147483647};
  const uint64_t v1[GEMM_PLAN_VALUE_WORDS] = {0x0123456789abcdefull, 0, 42, UINT64_MAX, 1, 2, 3, 4};
  const uint64_t v2[GEMM_PLAN_VALUE_WORDS] = {1, 256, 1, 0, 1, 0, 0, 0};
  GemmPlanDevice h100 = {"NVIDIA H100 80GB HBM3", 90, 130100}, newer = H200;
  newer.lib = 130200;
  CHECK(!gemm_plans_put(&r, &H200, k1, v1, err, sizeof err) && !gemm_plans_put(&r, &H200, k2, v2, err, sizeof err) &&
            !gemm_plans_put(&r, &h100, k1, v2, err, sizeof err) && r.n == 3,
        "three entries: %s", err);
  CHECK(!gemm_plans_save(&r, err, sizeof err), "save (creating the folder): %s", err);
  CHECK(test_exists(test_path(root, "sub/gemm_plans")) && !test_exists(test_path(root, "sub/gemm_plans.tmp")),
        "the file is there, no temp file left");
  gemm_plans_free(&r);

  // The documented text form, line by line.
  size_t len;
  char *text = read_file(test_path(root, "sub/gemm_plans"), &len);
  const char *want =
      "fp4train gemm_plans 1\n"
      "NVIDIA H200\t90\t130100\t1 0 0 1 8192 4096 14336 1 256 0 0 0\t0123456789abcdef 0000000000000000 "
      "000000000000002a ffffffffffffffff 0000000000000001 0000000000000002 0000000000000003 0000000000000004\n"
      "NVIDIA H200\t90\t130100\t6 1 0 1 8192 14336 4096 0 -7 0 0 2147483647\t0000000000000001 0000000000000100 "
      "0000000000000001 0000000000000000 0000000000000001 0000000000000000 0000000000000000 0000000000000000\n";
  CHECK(!strncmp(text, want, strlen(want)), "the first lines are\n%s", text);
  char end[64];
  const char *last = text + len - 1;  // the last line: after the last newline but the final one
  while (last > text && last[-1] != '\n') last--;
  snprintf(end, sizeof end, "end 3 %016llx\n", (unsigned long long)hash64(text, (size_t)(last - text), 0));
  CHECK(!strcmp(last, end), "the end line counts the entries and checksums the bytes before it: '%s' vs '%s'", last,
        end);
  free(text);

  CHECK(gemm_plans_load(&r, test_path(root, "sub/gemm_plans"), err, sizeof err) == 0 && r.n == 3, "read back: %s", err);
  const uint64_t *g1 = gemm_plans_find(&r, &H200, k1), *g2 = gemm_plans_find(&r, &H200, k2);
  const uint64_t *g3 = gemm_plans_find(&r, &h100, k1);
  CHECK(g1 && !memcmp(g1, v1, sizeof v1) && g2 && !memcmp(g2, v2, sizeof v2) && g3 && !memcmp(g3, v2, sizeof v2),
        "every value as written");
  CHECK(gemm_plans_count(&r, &H200) == 2 && gemm_plans_count(&r, &h100) == 1 && gemm_plans_count(&r, &newer) == 0,
        "counts per device");
  GemmPlanDevice other_cc = H200;
  other_cc.cc = 100;
  int k3[GEMM_PLAN_KEY_INTS];
  memcpy(k3, k1, sizeof k3);
  k3[8] = 128;  // another alignment
  CHECK(!gemm_plans_find(&r, &newer, k1), "another cuBLASLt version does not match");
  CHECK(!gemm_plans_find(&r, &other_cc, k1), "another compute capability does not match");
  GemmPlanDevice h200nvl = {"NVIDIA H200 NVL", 90, 130100};
  CHECK(!gemm_plans_find(&r, &h200nvl, k1), "another GPU name does not match");
  CHECK(!gemm_plans_find(&r, &H200, k3), "another key does not match");

  // A new value replaces the old one; the entries of other devices stay.
  CHECK(!gemm_plans_put(&r, &H200, k1, v2, err, sizeof err) && r.n == 3 && !gemm_plans_save(&r, err, sizeof err),
        "replace and save: %s", err);
  gemm_plans_free(&r);
  CHECK(!gemm_plans_load(&r, test_path(root, "sub/gemm_plans"), err, sizeof err) && r.n == 3 &&
            !memcmp(gemm_plans_find(&r, &H200, k1), v2, sizeof v2) && gemm_plans_find(&r, &h100, k1),
        "the replaced value is read back, the other device's entry kept: %s", err);
  GemmPlanDevice tab = {"bad\tname", 90, 1};
  CHECK(gemm_plans_put(&r, &tab, k1, v1, err, sizeof err) == -1 && strstr(err, "tab") && r.n == 3,
        "a device name with a tab is refused: %s", err);
  gemm_plans_free(&r);
}

// Loads path, which must be refused with a message naming it and containing `what`.
static void refused(const char *path, const char *what, const char *desc) {
  char err[2048] = "";
  GemmPlans r;
  int rc = gemm_plans_load(&r, path, err, sizeof err);
  CHECK(rc == -1 && strstr(err, path) && strstr(err, what) && strstr(err, "move it away") && r.n == 0 && !r.e,
        "%s: rc %d, err '%s'", desc, rc, err);
}

static void test_refused(void) {
  TEST_SECTION("damaged and foreign files are refused");
  char err[2048];
  GemmPlans r;
  CHECK(!gemm_plans_load(&r, test_path(root, "good"), err, sizeof err), "empty");
  const int key[GEMM_PLAN_KEY_INTS] = {2, 0, 1, 0, 256, 512, 1024, 0, 256};
  const uint64_t v[GEMM_PLAN_VALUE_WORDS] = {7, 6, 5, 4, 3, 2, 1, 0};
  gemm_plans_put(&r, &H200, key, v, err, sizeof err);
  CHECK(!gemm_plans_save(&r, err, sizeof err), "save: %s", err);
  gemm_plans_free(&r);
  size_t len;
  char *text = read_file(test_path(root, "good"), &len);

  char cut[4096];
  snprintf(cut, sizeof cut, "%.*s", (int)(len / 2), text);  // a copy interrupted half-way
  write_text(test_path(root, "half"), cut);
  refused(test_path(root, "half"), "truncated", "a file cut in half");
  snprintf(cut, sizeof cut, "%.*s", (int)len - 1, text);  // the last newline missing
  write_text(test_path(root, "nonl"), cut);
  refused(test_path(root, "nonl"), "truncated", "a file without its last newline");
  write_text(test_path(root, "empty"), "");
  refused(test_path(root, "empty"), "truncated", "an empty file");
  snprintf(cut, sizeof cut, "%s", text);
  cut[strlen("fp4train gemm_plans 1\nNVIDIA H200\t90\t130100\t2 0 1 0 2")] ^= 1;  // a digit of the key
  write_text(test_path(root, "flipped"), cut);
  refused(test_path(root, "flipped"), "checksum mismatch", "one changed byte");
  write_record(test_path(root, "v2"), "", 0);
  char *v2 = read_file(test_path(root, "v2"), &len);
  v2[strlen("fp4train gemm_plans ")] = '2';
  write_text(test_path(root, "v2"), v2);
  free(v2);
  refused(test_path(root, "v2"), "another format or version", "another format version");
  free(text);

  // Well checksummed, but wrong inside.
  write_record(test_path(root, "fields"), "NVIDIA H200\t90\t130100\t1 2 3 4 5 6 7 8 9 10 11 12\n", 1);
  refused(test_path(root, "fields"), "line 2: expected 5 tab-separated fields, got 4", "a missing field");
  write_record(test_path(root, "keyshort"),
               "NVIDIA H200\t90\t130100\t1 2 3\t0000000000000000 0000000000000000 0000000000000000 0000000000000000 "
               "0000000000000000 0000000000000000 0000000000000000 0000000000000000\n",
               1);
  refused(test_path(root, "keyshort"), "line 2: the key is not 12 integers", "a short key");
  write_record(test_path(root, "valbad"),
               "NVIDIA H200\t90\t130100\t1 2 3 4 5 6 7 8 9 10 11 12\t0000000000000000 zz 0000000000000000 "
               "0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000\n",
               1);
  refused(test_path(root, "valbad"), "line 2: the value is not 8 hexadecimal words", "a value that is not hex");
  const char *entry =
      "NVIDIA H200\t90\t130100\t1 2 3 4 5 6 7 8 9 10 11 12\t0000000000000001 0000000000000000 0000000000000000 "
      "0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000\n";
  char two[2048];
  snprintf(two, sizeof two, "%s%s", entry, entry);
  write_record(test_path(root, "dup"), two, 2);
  refused(test_path(root, "dup"), "line 3 repeats an earlier entry", "a repeated entry");
  write_record(test_path(root, "count"), entry, 2);
  refused(test_path(root, "count"), "the end line counts 2 entries, the file holds 1", "a wrong count");
  write_record(test_path(root, "ok"), entry, 1);
  CHECK(!gemm_plans_load(&r, test_path(root, "ok"), err, sizeof err) && r.n == 1,
        "the same entry once, counted right: %s", err);
  gemm_plans_free(&r);
  mkdir(test_path(root, "adir"), 0755);
  CHECK(gemm_plans_load(&r, test_path(root, "adir"), err, sizeof err) == -1 && strstr(err, test_path(root, "adir")),
        "a directory is not a record: %s", err);
}

static void test_atomic(void) {
  TEST_SECTION("a save replaces the record whole");
  char err[2048];
  GemmPlans r;
  const int key[GEMM_PLAN_KEY_INTS] = {1, 1, 0, 0, 64, 64, 64, 0, 256};
  const uint64_t v[GEMM_PLAN_VALUE_WORDS] = {1, 2, 3, 4, 5, 6, 7, 8};
  CHECK(!gemm_plans_load(&r, test_path(root, "atomic"), err, sizeof err), "empty");
  gemm_plans_put(&r, &H200, key, v, err, sizeof err);
  CHECK(!gemm_plans_save(&r, err, sizeof err), "first save: %s", err);
  // A process killed half-way through a save leaves its temp file: it is never read, the next save
  // replaces it.
  write_text(test_path(root, "atomic.tmp"), "fp4train gemm_plans 1\nNVIDIA");
  GemmPlans back;
  CHECK(!gemm_plans_load(&back, test_path(root, "atomic"), err, sizeof err) && back.n == 1,
        "a stale temp file is not read: %s", err);
  gemm_plans_free(&back);
  int key2[GEMM_PLAN_KEY_INTS];
  memcpy(key2, key, sizeof key2);
  key2[4] = 128;
  gemm_plans_put(&r, &H200, key2, v, err, sizeof err);
  CHECK(!gemm_plans_save(&r, err, sizeof err) && !test_exists(test_path(root, "atomic.tmp")),
        "the next save renames over it: %s", err);
  CHECK(!gemm_plans_load(&back, test_path(root, "atomic"), err, sizeof err) && back.n == 2, "two entries now: %s", err);
  gemm_plans_free(&back);

  // A save that cannot be written (the file-size limit: EFBIG, as a full disk) fails naming the
  // temp file, removes it, and leaves the previous record whole.
  int key3[GEMM_PLAN_KEY_INTS];
  memcpy(key3, key, sizeof key3);
  for (int i = 0; i < 40; i++) key3[5] = 1000 + i, gemm_plans_put(&r, &H200, key3, v, err, sizeof err);
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = 1024;
  signal(SIGXFSZ, SIG_IGN);
  setrlimit(RLIMIT_FSIZE, &lim);
  int rc = gemm_plans_save(&r, err, sizeof err);
  setrlimit(RLIMIT_FSIZE, &old);
  CHECK(rc == -1 && strstr(err, "atomic.tmp") && !test_exists(test_path(root, "atomic.tmp")),
        "the failed save: rc %d, '%s'", rc, err);
  CHECK(!gemm_plans_load(&back, test_path(root, "atomic"), err, sizeof err) && back.n == 2,
        "the previous record is intact (%d entries): %s", back.n, err);
  gemm_plans_free(&back);
  // A path whose folder cannot be made.
  snprintf(r.path, sizeof r.path, "%s/no_dir", test_path(root, "atomic"));
  CHECK(gemm_plans_save(&r, err, sizeof err) == -1 && strstr(err, test_path(root, "atomic")),
        "a file where the folder should be: %s", err);
  gemm_plans_free(&r);
}

// In a child process (a new open file description of the lock file): whether the record's lock is
// free now.
static int lock_free_elsewhere(const char *path) {
  char lock[600];
  snprintf(lock, sizeof lock, "%s.lock", path);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(lock, O_RDWR);
    _exit(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : 1);
  }
  int status = 1;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void test_sharing(void) {
  TEST_SECTION("two processes sharing one record");
  char err[2048];
  const char *path = test_path(root, "shared/gemm_plans");
  const int k1[GEMM_PLAN_KEY_INTS] = {1, 0, 0, 1, 64, 64, 64, 0, 256},
            k2[GEMM_PLAN_KEY_INTS] = {1, 0, 0, 1, 64, 64, 128, 0, 256};
  const uint64_t v1[GEMM_PLAN_VALUE_WORDS] = {11}, v2[GEMM_PLAN_VALUE_WORDS] = {22}, v3[GEMM_PLAN_VALUE_WORDS] = {33};
  GemmPlans a, b;
  CHECK(!gemm_plans_load(&a, path, err, sizeof err) && !gemm_plans_load(&b, path, err, sizeof err), "both read: %s",
        err);
  // b chooses k1 and saves, under the lock
  CHECK(!gemm_plans_lock(&b, err, sizeof err) && b.lock_depth == 1, "b locks: %s", err);
  CHECK(!lock_free_elsewhere(path), "another process cannot take the lock while b holds it");
  gemm_plans_put(&b, &H200, k1, v1, err, sizeof err);
  CHECK(!gemm_plans_save(&b, err, sizeof err), "b saves: %s", err);
  gemm_plans_unlock(&b);
  CHECK(b.lock_depth == 0 && lock_free_elsewhere(path), "b's unlock frees the lock");
  // a, which read the record before, finds b's choice once it looks again under the lock
  CHECK(!gemm_plans_find(&a, &H200, k1), "a's copy does not have k1 yet");
  CHECK(!gemm_plans_lock(&a, err, sizeof err), "a locks: %s", err);
  const uint64_t *got = gemm_plans_find(&a, &H200, k1);
  CHECK(got && got[0] == 11, "a sees b's choice for k1 under the lock");
  CHECK(!gemm_plans_lock(&a, err, sizeof err) && a.lock_depth == 2, "a nested lock counts up: %s", err);
  gemm_plans_unlock(&a);
  CHECK(a.lock_depth == 1 && !lock_free_elsewhere(path), "the inner unlock keeps the lock");
  gemm_plans_put(&a, &H200, k2, v2, err, sizeof err);
  CHECK(!gemm_plans_save(&a, err, sizeof err), "a saves: %s", err);
  gemm_plans_unlock(&a);
  GemmPlans c;
  CHECK(!gemm_plans_load(&c, path, err, sizeof err) && c.n == 2 && gemm_plans_find(&c, &H200, k1) &&
            gemm_plans_find(&c, &H200, k2),
        "the file holds both processes' choices (%d entries)", c.n);
  gemm_plans_free(&c);
  // A value a process already has is its own: the merge does not replace it.
  CHECK(!gemm_plans_lock(&b, err, sizeof err), "%s", err);
  gemm_plans_put(&b, &H200, k1, v3, err, sizeof err);
  CHECK(!gemm_plans_save(&b, err, sizeof err), "%s", err);
  gemm_plans_unlock(&b);
  CHECK(!gemm_plans_lock(&a, err, sizeof err) && gemm_plans_find(&a, &H200, k1)[0] == 11,
        "a keeps the k1 it has been running with");
  gemm_plans_unlock(&a);
  // A record damaged under a running process: the lock reports it, naming the file, and is released.
  write_text(path, "fp4train gemm_plans 1\nend 0 0\n");
  CHECK(
      gemm_plans_lock(&a, err, sizeof err) == -1 && strstr(err, path) && a.lock_depth == 0 && lock_free_elsewhere(path),
      "a damaged record: %s", err);
  GemmPlans mem = {0};
  CHECK(!gemm_plans_lock(&mem, err, sizeof err) && mem.lock_depth == 0, "a record in memory has nothing to lock");
  gemm_plans_free(&a);
  gemm_plans_free(&b);
}

static void test_config_and_cpu(void) {
  TEST_SECTION("config defaults; the CPU backend writes no record");
  TrainConfig c;
  config_defaults(&c);
  CHECK(c.deterministic == 1, "parallel.deterministic defaults to true, got %d", c.deterministic);
  CHECK(c.gemm_plans[0] == 0, "parallel.gemm_plans defaults to empty, got '%s'", c.gemm_plans);
  char err[512];
  CHECK(!config_set(&c, "parallel.gemm_plans=runs/shared/gemm_plans", err, sizeof err) &&
            !strcmp(c.gemm_plans, "runs/shared/gemm_plans"),
        "--set parallel.gemm_plans: %s", err);
  CHECK(!config_set(&c, "parallel.deterministic=false", err, sizeof err) && c.deterministic == 0,
        "--set parallel.deterministic=false: %s", err);
  // What train.c hands a backend for a deterministic run with a record: the CPU backend (deterministic
  // by construction) neither reads nor writes it.
  const char *path = test_path(root, "cpu_plans");
  BackendOptions o = {1, 1, 0, 0, GEMM_RECORDED, path};
  const Ops *ops = backend_open("cpu", &o);
  CHECK(ops && !strcmp(ops->name, "cpu") && !test_exists(path), "the CPU backend opened, no record at %s", path);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/test_gemm_plans_%d", (int)getpid());
  mkdir(root, 0755);
  test_choice();
  test_round_trip();
  test_refused();
  test_atomic();
  test_sharing();
  test_config_and_cpu();
  nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  TEST_END();
}
