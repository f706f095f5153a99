// tests/unit/test_checkpoint.c: the checkpoint container: round trip (empty and >64 MiB sections), the
// documented byte layout, keep-last-K pruning, ckpt_latest skipping damaged files, load errors,
// and saves that fail (bad directory, permissions, short writes, rename) leaving the previous
// checkpoint loadable. Works in a fresh directory under /tmp, removed at the end.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "run/checkpoint.h"
#include "run/manifest.h"
#include "tests/test.h"

static char root[64];

// Files in dir whose name contains `part`.
static int count(const char *dir, const char *part) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *de;
  while (d && (de = readdir(d))) n += strstr(de->d_name, part) != NULL;
  if (d) closedir(d);
  return n;
}

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) ? -1 : (long)st.st_size;
}

static void flip_byte(const char *path, long offset) {
  int fd = open(path, O_RDWR);
  unsigned char b;
  if (fd < 0 || pread(fd, &b, 1, offset) != 1) die("cannot read '%s'", path);
  b ^= 0x10;
  if (pwrite(fd, &b, 1, offset) != 1) die("cannot write '%s'", path);
  close(fd);
}

static void write_text(const char *path, const char *text) {
  FILE *f = xfopen(path, "wb");
  xfwrite(text, 1, strlen(text), f, path);
  fclose(f);
}

static void copy_file(const char *from, const char *to) {
  size_t n;
  char *data = read_file(from, &n);
  FILE *f = xfopen(to, "wb");
  xfwrite(data, 1, n, f, to);
  fclose(f);
  free(data);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }

// Small save with one "params" section holding `step` in every float, so loads can tell files apart.
static float small_params[1000];
static int save_small(const char *dir, int64_t step, int keep, char *err, size_t errlen) {
  for (int i = 0; i < 1000; i++) small_params[i] = (float)step + i * 1e-3f;
  CkptSection s[] = {{"meta", "small", 6}, {"params", small_params, sizeof small_params}};
  return ckpt_save(dir, step, s, 2, keep, err, errlen);
}

// Loads dir's latest checkpoint and checks it is `step` with the matching contents.
static int latest_is(const char *dir, int64_t want) {
  char path[1024], err[1024];
  int64_t step = -1, step2 = -2;
  if (ckpt_latest(dir, path, sizeof path, &step) != 0 || step != want) return 0;
  float p[1000];
  CkptSection s = {"params", p, sizeof p};
  if (ckpt_load(path, &s, 1, &step2, err, sizeof err)) {
    printf("  load failed: %s\n", err);
    return 0;
  }
  return step2 == want && p[0] == (float)want && p[999] == (float)want + 999 * 1e-3f;
}

static void test_round_trip(void) {
  TEST_SECTION("round trip: small, empty, >64 MiB and odd-sized sections; subsets; determinism");
  char dir[512];
  strcpy(dir, test_path(root, "rt"));
  size_t big_n = ((size_t)64 << 20) + 4099;  // past one 64 MiB chunk, ragged end
  unsigned char *big = xmalloc(big_n), *big2 = xmalloc(big_n);
  for (size_t i = 0; i < big_n; i++) big[i] = (unsigned char)((i * 2654435761u) >> 13 ^ i >> 20);
  float params[1000];
  Rng r;
  rng_seed(&r, 7);
  for (int i = 0; i < 1000; i++) params[i] = rng_normal(&r);
  const char meta[] = "preset=tiny seed=42";
  unsigned char tail[3] = {1, 2, 3};
  CkptSection secs[] = {
      {"meta", (void *)meta, sizeof meta}, {"empty", NULL, 0}, {"params", params, sizeof params}, {"big", big, big_n},
      {"tail", tail, sizeof tail},
  };
  char err[1024] = "";
  int rc = ckpt_save(dir, 7, secs, 5, 3, err, sizeof err);
  CHECK(rc == 0, "save: %s", err);
  CHECK(test_exists(test_path(root, "rt/ckpt_00000007.bin")), "file name has 8 digits");
  CHECK(count(dir, ".tmp") == 0, "temp file left behind");

  char meta2[sizeof meta];
  float params2[1000];
  unsigned char tail2[3] = {0};
  memset(big2, 0, big_n);
  // A different order from the save's, to show lookup is by name.
  CkptSection load[] = {{"tail", tail2, 3},
                        {"big", big2, big_n},
                        {"params", params2, sizeof params2},
                        {"empty", NULL, 0},
                        {"meta", meta2, sizeof meta2}};
  int64_t step = -1;
  rc = ckpt_load(test_path(root, "rt/ckpt_00000007.bin"), load, 5, &step, err, sizeof err);
  CHECK(rc == 0, "load: %s", err);
  CHECK(step == 7, "step %lld", (long long)step);
  CHECK(!memcmp(big, big2, big_n), "big section differs after the round trip");
  CHECK(!memcmp(params, params2, sizeof params) && !memcmp(meta, meta2, sizeof meta) && !memcmp(tail, tail2, 3),
        "small sections differ after the round trip");

  // Extra sections in the file are allowed: load "params" alone.
  memset(params2, 0, sizeof params2);
  CkptSection only = {"params", params2, sizeof params2};
  rc = ckpt_load(test_path(root, "rt/ckpt_00000007.bin"), &only, 1, NULL, err, sizeof err);
  CHECK(rc == 0 && !memcmp(params, params2, sizeof params), "subset load: %s", err);

  void *data = NULL;
  size_t bytes = 0;
  rc = ckpt_read_section(test_path(root, "rt/ckpt_00000007.bin"), "meta", &data, &bytes, err, sizeof err);
  CHECK(rc == 0 && bytes == sizeof meta && data && !strcmp(data, meta), "read_section meta: %s", err);
  free(data);
  rc = ckpt_read_section(test_path(root, "rt/ckpt_00000007.bin"), "empty", &data, &bytes, err, sizeof err);
  CHECK(rc == 0 && bytes == 0, "read_section of the empty section: %s", err);
  free(data);
  int64_t vstep = -1;
  CHECK(ckpt_verify(test_path(root, "rt/ckpt_00000007.bin"), &vstep, err, sizeof err) == 0 && vstep == 7, "verify: %s",
        err);

  // The same inputs give the same bytes (no timestamps or padding garbage): small sections only.
  CkptSection small[] = {secs[0], secs[1], secs[2], secs[4]};
  CHECK(ckpt_save(test_path(root, "det1"), 3, small, 4, 0, err, sizeof err) == 0, "%s", err);
  CHECK(ckpt_save(test_path(root, "det2"), 3, small, 4, 0, err, sizeof err) == 0, "%s", err);
  size_t n1, n2;
  char *f1 = read_file(test_path(root, "det1/ckpt_00000003.bin"), &n1),
       *f2 = read_file(test_path(root, "det2/ckpt_00000003.bin"), &n2);
  CHECK(n1 == n2 && !memcmp(f1, f2, n1), "two identical saves differ");
  free(f1), free(f2), free(big), free(big2);

  // A checkpoint with no sections is valid too.
  CHECK(ckpt_save(test_path(root, "none"), 0, NULL, 0, 1, err, sizeof err) == 0, "%s", err);
  CHECK(ckpt_load(test_path(root, "none/ckpt_00000000.bin"), NULL, 0, &step, err, sizeof err) == 0 && step == 0, "%s",
        err);
}

static uint64_t u64_at(const unsigned char *p) {
  uint64_t x;
  memcpy(&x, p, 8);
  return x;
}

static void test_layout(void) {
  TEST_SECTION("byte layout as docs/checkpoint_format.md describes it");
  char a[5] = "abcde", b[3] = "xyz", err[1024];
  CkptSection s[] = {{"a", a, 5}, {"b", b, 3}};
  CHECK(ckpt_save(test_path(root, "layout"), 1234, s, 2, 0, err, sizeof err) == 0, "%s", err);
  size_t n;
  unsigned char *f = (unsigned char *)read_file(test_path(root, "layout/ckpt_00001234.bin"), &n);
  uint32_t version, nsec;
  memcpy(&version, f + 8, 4);
  memcpy(&nsec, f + 12, 4);
  CHECK(!memcmp(f, "LLAMACKP", 8) && version == 1 && nsec == 2, "magic/version/count");
  CHECK((int64_t)u64_at(f + 16) == 1234 && u64_at(f + 24) == n && u64_at(f + 32) == ((uint64_t)64 << 20),
        "step %lld, file_bytes %llu (file %zu), chunk %llu", (long long)u64_at(f + 16),
        (unsigned long long)u64_at(f + 24), n, (unsigned long long)u64_at(f + 32));
  // Header 64 + table 2 x 96 = 256: "a" at 256, "b" at the next multiple of 64, file ends after b.
  CHECK(!strcmp((char *)f + 64, "a") && u64_at(f + 64 + 64) == 256 && u64_at(f + 64 + 72) == 5, "entry a");
  CHECK(!strcmp((char *)f + 160, "b") && u64_at(f + 160 + 64) == 320 && u64_at(f + 160 + 72) == 3, "entry b");
  CHECK(n == 323 && !memcmp(f + 256, "abcde", 5) && !memcmp(f + 320, "xyz", 3), "file is %zu bytes", n);
  // Section checksum: hash64 over the array of chunk hashes (one chunk here), seeded with the length.
  uint64_t chunk0 = hash64(a, 5, 0);
  CHECK(u64_at(f + 64 + 80) == hash64(&chunk0, 8, 5), "section checksum formula");
  // Header checksum: hash64 of header + table with the checksum field (bytes 56..63) zeroed.
  uint64_t want = u64_at(f + 56);
  memset(f + 56, 0, 8);
  CHECK(hash64(f, 256, 0) == want, "header checksum formula");
  free(f);
}

static void test_load_errors(void) {
  TEST_SECTION("load errors name the file and the section");
  char dir[512], path[512];
  strcpy(dir, test_path(root, "errs")), strcpy(path, test_path(root, "errs/ckpt_00000005.bin"));
  char err[1024] = "";
  CHECK(save_small(dir, 5, 0, err, sizeof err) == 0, "%s", err);

  char meta[6] = "XXXXX";
  float p[1001];
  CkptSection wrong[] = {{"meta", meta, 6}, {"params", p, sizeof p}};
  CHECK(ckpt_load(path, wrong, 2, NULL, err, sizeof err) == -1, "wrong size loaded");
  CHECK(strstr(err, "section 'params': checkpoint has 4000 bytes, this run expects 4004") && strstr(err, path),
        "message: %s", err);
  CHECK(!strcmp(meta, "XXXXX"), "a refused load wrote into the buffers");

  float m[1000];
  CkptSection missing = {"adam_m", m, sizeof m};
  CHECK(ckpt_load(path, &missing, 1, NULL, err, sizeof err) == -1, "missing section loaded");
  CHECK(strstr(err, "no section 'adam_m'") && strstr(err, "'meta', 'params'"), "message: %s", err);
  void *data;
  size_t bytes;
  CHECK(ckpt_read_section(path, "rng", &data, &bytes, err, sizeof err) == -1 && strstr(err, "no section 'rng'"),
        "message: %s", err);

  write_text(test_path(root, "errs/notackpt.bin"),
             "not a checkpoint, just some text that is longer than a checkpoint header");
  CHECK(
      ckpt_load(test_path(root, "errs/notackpt.bin"), NULL, 0, NULL, err, sizeof err) == -1 && strstr(err, "bad magic"),
      "message: %s", err);
  write_text(test_path(root, "errs/short.bin"), "LLAMACKP");
  CHECK(ckpt_load(test_path(root, "errs/short.bin"), NULL, 0, NULL, err, sizeof err) == -1 &&
            strstr(err, "64-byte header"),
        "message: %s", err);
  copy_file(path, test_path(root, "errs/v2.bin"));
  flip_byte(test_path(root, "errs/v2.bin"), 9);  // version 1 -> 0x1001
  CHECK(ckpt_load(test_path(root, "errs/v2.bin"), NULL, 0, NULL, err, sizeof err) == -1 &&
            strstr(err, "format version 4097"),
        "message: %s", err);
  CHECK(ckpt_load(test_path(root, "errs/nope.bin"), NULL, 0, NULL, err, sizeof err) == -1 &&
            strstr(err, "No such file or directory") && strstr(err, "nope.bin"),
        "message: %s", err);

  TEST_SECTION("save argument errors write nothing");
  float x = 1;
  char longname[65];
  memset(longname, 'n', 64);
  longname[64] = 0;
  CkptSection dup[] = {{"w", &x, 4}, {"w", &x, 4}}, empty[] = {{"", &x, 4}}, toolong[] = {{longname, &x, 4}},
              nodata[] = {{"w", NULL, 4}};
  CHECK(ckpt_save(dir, 6, dup, 2, 0, err, sizeof err) == -1 && strstr(err, "'w' appears twice"), "message: %s", err);
  CHECK(ckpt_save(dir, 6, empty, 1, 0, err, sizeof err) == -1 && strstr(err, "1 to 63 bytes"), "message: %s", err);
  CHECK(ckpt_save(dir, 6, toolong, 1, 0, err, sizeof err) == -1 && strstr(err, "1 to 63 bytes"), "message: %s", err);
  CHECK(ckpt_save(dir, 6, nodata, 1, 0, err, sizeof err) == -1 && strstr(err, "no data"), "message: %s", err);
  CHECK(ckpt_save(dir, -1, dup, 1, 0, err, sizeof err) == -1 && strstr(err, ">= 0"), "message: %s", err);
  longname[63] = 0;  // exactly 63 bytes is allowed
  CHECK(ckpt_save(test_path(root, "longname"), 1, toolong, 1, 0, err, sizeof err) == 0, "63-byte name: %s", err);
  CHECK(!test_exists(test_path(root, "errs/ckpt_00000006.bin")) && count(dir, ".tmp") == 0,
        "a refused save wrote a file");
}

static void test_pruning(void) {
  TEST_SECTION("keep-last-K pruning");
  char dir[512];
  strcpy(dir, test_path(root, "prune"));
  char err[1024] = "";
  for (int s = 1; s <= 5; s++) CHECK(save_small(dir, s, 2, err, sizeof err) == 0, "save %d: %s", s, err);
  CHECK(count(dir, "ckpt_") == 2 && test_exists(test_path(root, "prune/ckpt_00000004.bin")) &&
            test_exists(test_path(root, "prune/ckpt_00000005.bin")),
        "keep 2 of 5: %d files", count(dir, "ckpt_"));
  // keep <= 0 keeps everything.
  CHECK(save_small(dir, 6, 0, err, sizeof err) == 0 && save_small(dir, 7, -1, err, sizeof err) == 0, "%s", err);
  CHECK(count(dir, "ckpt_") == 4, "keep 0: %d files", count(dir, "ckpt_"));
  // The one just written always stays, even when it is not the newest step (a run redone from an
  // older checkpoint): keep 2 = step 3 plus the newest other (7).
  CHECK(save_small(dir, 3, 2, err, sizeof err) == 0, "%s", err);
  CHECK(count(dir, "ckpt_") == 2 && test_exists(test_path(root, "prune/ckpt_00000003.bin")) &&
            test_exists(test_path(root, "prune/ckpt_00000007.bin")),
        "just-written kept: %d files", count(dir, "ckpt_"));
  // keep 1 leaves only the new one; steps past 8 digits sort by number, not by name.
  CHECK(save_small(dir, 123456789, 1, err, sizeof err) == 0, "%s", err);
  CHECK(count(dir, "ckpt_") == 1 && test_exists(test_path(root, "prune/ckpt_123456789.bin")), "keep 1");
  CHECK(save_small(dir, 99999999, 2, err, sizeof err) == 0 && latest_is(dir, 123456789), "9-digit step is newest");
}

// A sharded run's rank directory: steps 3, 5, 7 and 10 on disk, manifests of 5 and 7 kept, 10's never
// written (a crash between the rank file and the manifest), 7 just saved.
static int listed_5_7(int64_t step, void *ctx) {
  (void)ctx;
  return step == 5 || step == 7;
}
static void test_prune_unlisted(void) {
  TEST_SECTION("a sharded rank directory keeps what the manifests name");
  char dir[512], err[1024] = "";
  strcpy(dir, test_path(root, "prune_unlisted"));
  const int steps[4] = {3, 5, 10, 7};
  for (int i = 0; i < 4; i++) CHECK(save_small(dir, steps[i], 0, err, sizeof err) == 0, "save %d: %s", steps[i], err);
  ckpt_prune_unlisted(dir, 7, listed_5_7, NULL);
  CHECK(count(dir, "ckpt_") == 3 && !test_exists(test_path(root, "prune_unlisted/ckpt_00000003.bin")) &&
            test_exists(test_path(root, "prune_unlisted/ckpt_00000005.bin")) &&
            test_exists(test_path(root, "prune_unlisted/ckpt_00000007.bin")) &&
            test_exists(test_path(root, "prune_unlisted/ckpt_00000010.bin")),
        "3 (no manifest, older) deleted; 5 (named), 7 (just saved), 10 (newer, no manifest) kept: %d files",
        count(dir, "ckpt_"));
  // ckpt_prune's count (keep 2) would have kept 7 and 10 and deleted 5, whose manifest is kept
}

static void test_latest(void) {
  TEST_SECTION("ckpt_latest skips truncated, bit-flipped, misnamed and temp files");
  char dir[512];
  strcpy(dir, test_path(root, "lat"));
  char err[1024] = "", path[1024];
  int64_t step;
  CHECK(ckpt_latest(dir, path, sizeof path, &step) == 1, "no directory: none");
  mkdir(dir, 0755);
  CHECK(ckpt_latest(dir, path, sizeof path, &step) == 1, "empty directory: none");
  for (int s = 10; s <= 40; s += 10) CHECK(save_small(dir, s, 0, err, sizeof err) == 0, "save %d: %s", s, err);
  CHECK(latest_is(dir, 40), "newest of four");
  CHECK(ckpt_latest(dir, path, 5, &step) == -1, "a path buffer too small is an error");

  char c40[512], c30[512], c20[512];
  strcpy(c40, test_path(root, "lat/ckpt_00000040.bin"));
  strcpy(c30, test_path(root, "lat/ckpt_00000030.bin"));
  strcpy(c20, test_path(root, "lat/ckpt_00000020.bin"));
  CHECK(truncate(c40, file_size(c40) - 1) == 0, "truncate");
  printf("  (the warnings below are expected)\n");
  CHECK(latest_is(dir, 30), "truncated newest is skipped");
  CHECK(ckpt_load(c40, NULL, 0, NULL, err, sizeof err) == -1 && strstr(err, "truncated"), "message: %s", err);

  flip_byte(c30, file_size(c30) - 1);  // last byte of "params"
  CHECK(latest_is(dir, 20), "bit-flipped newest is skipped");
  float p[1000];
  CkptSection s = {"params", p, sizeof p};
  CHECK(ckpt_load(c30, &s, 1, NULL, err, sizeof err) == -1 && strstr(err, "section 'params' fails its checksum"),
        "message: %s", err);
  CHECK(ckpt_verify(c30, NULL, err, sizeof err) == -1, "verify passes a flipped file");

  flip_byte(c20, 16);  // the step field: caught by the header checksum
  CHECK(latest_is(dir, 10), "corrupt header is skipped");
  CHECK(ckpt_load(c20, NULL, 0, NULL, err, sizeof err) == -1 && strstr(err, "header checksum"), "message: %s", err);

  copy_file(test_path(root, "lat/ckpt_00000010.bin"),
            test_path(root, "lat/ckpt_00000015.bin"));  // name says 15, holds 10
  write_text(test_path(root, "lat/ckpt_00000050.bin.tmp"), "half a checkpoint");
  write_text(test_path(root, "lat/notes.txt"), "not a checkpoint");
  write_text(test_path(root, "lat/ckpt_00000060.bin.bak"), "not a checkpoint");
  CHECK(latest_is(dir, 10), "misnamed, temp and other files are ignored");

  // The next save removes the stale temp file, and pruning counts only complete files:
  // 30 (its header is intact) is kept with 45; 10 is deleted; 15, 20 and 40 are left alone.
  CHECK(save_small(dir, 45, 2, err, sizeof err) == 0, "%s", err);
  CHECK(count(dir, ".tmp") == 0, "stale temp file still there");
  CHECK(latest_is(dir, 45), "new save is latest");
  CHECK(!test_exists(test_path(root, "lat/ckpt_00000010.bin")) && test_exists(c30) && test_exists(c20) &&
            test_exists(c40) && test_exists(test_path(root, "lat/ckpt_00000015.bin")),
        "pruning around invalid files");

  write_text(test_path(root, "afile"), "x");
  CHECK(ckpt_latest(test_path(root, "afile"), path, sizeof path, &step) == -1, "a file as directory is an error");
}

// Saves into `dir` (which holds step 1) must fail, leave no temp file and keep step 1 loadable.
static void check_failed_save(const char *dir, int rc, const char *err, const char *want, const char *what) {
  CHECK(rc == -1, "%s: save succeeded", what);
  CHECK(strstr(err, want) != NULL, "%s: message: %s", what, err);
  CHECK(count(dir, ".tmp") == 0, "%s: temp file left behind", what);
  CHECK(latest_is(dir, 1), "%s: previous checkpoint no longer loads", what);
}

static void test_failed_saves(void) {
  TEST_SECTION("failed saves: message names path and error; previous checkpoint intact");
  char err[1024] = "";
  // A directory whose parent is a regular file: mkdir -p cannot work, root or not.
  write_text(test_path(root, "plainfile"), "x");
  CHECK(save_small(test_path(root, "plainfile/ckpts"), 1, 0, err, sizeof err) == -1, "saved under a regular file");
  CHECK(strstr(err, "plainfile") && strstr(err, "not a directory"), "message: %s", err);

  // A read-only directory, where permissions bind (not as root: root writes anyway).
  char ro[512];
  strcpy(ro, test_path(root, "ro"));
  CHECK(save_small(ro, 1, 0, err, sizeof err) == 0, "%s", err);
  chmod(ro, 0500);
  int fd = open(test_path(root, "ro/probe"), O_WRONLY | O_CREAT, 0644);
  if (fd >= 0) {
    close(fd);
    unlink(test_path(root, "ro/probe"));
    printf("  (running with permission override, e.g. root: read-only directory case skipped)\n");
  } else {
    int rc = save_small(ro, 2, 0, err, sizeof err);
    check_failed_save(ro, rc, err, "Permission denied", "read-only directory");
    CHECK(strstr(err, "ckpt_00000002.bin.tmp") != NULL, "message names the temp file: %s", err);
  }
  chmod(ro, 0700);

  // A short write: the file-size limit makes write() fail part way (EFBIG), like a full disk.
  char full[512];
  strcpy(full, test_path(root, "full"));
  CHECK(save_small(full, 1, 0, err, sizeof err) == 0, "%s", err);
  size_t nbig = 4 << 20;
  char *big = xcalloc(nbig, 1);
  CkptSection s = {"params", big, nbig};
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = 1 << 20;
  signal(SIGXFSZ, SIG_IGN);  // otherwise exceeding the limit kills the process
  setrlimit(RLIMIT_FSIZE, &lim);
  int rc = ckpt_save(full, 2, &s, 1, 0, err, sizeof err);
  setrlimit(RLIMIT_FSIZE, &old);
  check_failed_save(full, rc, err, "File too large", "short write");
  CHECK(strstr(err, "ckpt_00000002.bin.tmp") != NULL, "message names the temp file: %s", err);
  free(big);

  // The final name is taken by a non-empty directory: the rename fails after a complete write.
  char rn[512];
  strcpy(rn, test_path(root, "rename"));
  CHECK(save_small(rn, 1, 0, err, sizeof err) == 0, "%s", err);
  mkdir(test_path(root, "rename/ckpt_00000002.bin"), 0755);
  write_text(test_path(root, "rename/ckpt_00000002.bin/x"), "x");
  printf("  (a warning about ckpt_00000002.bin below is expected)\n");
  rc = save_small(rn, 2, 0, err, sizeof err);
  check_failed_save(rn, rc, err, "cannot rename", "rename onto a directory");
  CHECK(strstr(err, "ckpt_00000002.bin'") != NULL, "message names the final path: %s", err);
}

// hash64 in pieces (Hash64Stream) = hash64 of the whole, whatever the split; the chunked hash of a
// stream (ChunkHasher, which file_checksum also reads files through) = the formula written out here,
// folding included (small chunks here: a file would need 32 GiB to fold); and on a checkpoint of three
// 64 MiB chunks, what ckpt_save_sum hashed from memory = what file_checksum reads back.
static void test_streamed_checksums(void) {
  TEST_SECTION("checksums of streamed bytes: hash64 in pieces, the chunked file checksum, ckpt_save_sum");
  enum { N = 5000 };
  unsigned char *d = xmalloc(N);
  Rng r;
  rng_seed(&r, 3);
  for (int i = 0; i < N; i++) d[i] = (unsigned char)rng_u64(&r);
  int bad = 0;
  for (size_t len = 0; len <= 300; len += 7)
    for (int split = 0; split < 40; split++) {  // pieces of 0..39 bytes, then the rest
      Hash64Stream s = hash64_begin(len * 31);
      size_t at = 0;
      for (size_t k = 0; at < len; k++) {
        size_t piece = (split + k * 13) % 40;
        if (piece > len - at) piece = len - at;
        hash64_update(&s, d + at, piece);
        at += piece;
        if (k > 400) piece = len - at, hash64_update(&s, d + at, piece), at = len;  // splits of 0 bytes only
      }
      bad += hash64_final(&s) != hash64(d, len, len * 31);
    }
  CHECK(bad == 0, "hash64 in pieces differs from hash64 of the whole in %d of %d cases", bad, 43 * 40);

  // The formula by hand (run/manifest.c's loop over a file, with chunk c): each chunk's hash64 seeded
  // with its offset, folded into the first entry at 512, then hash64 of the list seeded with the size.
  const uint64_t chunks[3] = {64, 96, 1};
  for (int ci = 0; ci < 3; ci++) {
    const uint64_t c = chunks[ci];
    uint64_t want, hashes[512], total = 0;
    size_t nh = 0;
    for (uint64_t off = 0; off < N; off += c) {
      const size_t k = N - off < c ? N - off : c;
      if (nh == 512) hashes[0] = hash64(hashes, sizeof hashes, 1), nh = 1;
      hashes[nh++] = hash64(d + off, k, total);
      total += k;
    }
    want = hash64(hashes, nh * sizeof(uint64_t), total);
    ChunkHasher *h = xmalloc(sizeof *h);
    chunk_hasher_init(h, c);
    for (size_t at = 0, k = 1; at < N; at += k, k = k * 3 % 97 + 1)
      chunk_hasher_update(h, d + at, N - at < k ? N - at : k);
    uint64_t got, bytes;
    chunk_hasher_final(h, &got, &bytes);
    CHECK(got == want && bytes == N, "chunk hasher with %llu-byte chunks (%s): %016llx vs the formula's %016llx",
          (unsigned long long)c, N / c >= 512 ? "folded" : "not folded", (unsigned long long)got,
          (unsigned long long)want);
    free(h);
  }
  free(d);

  // A checkpoint over three 64 MiB chunks: the hash written along = file_checksum reading it back.
  const size_t big_n = ((size_t)128 << 20) + 12345;
  unsigned char *big = xmalloc(big_n);
  for (size_t i = 0; i < big_n; i++) big[i] = (unsigned char)((i * 2654435761u) >> 11 ^ i >> 21);
  const char meta[] = "streamed";
  CkptSection secs[] = {{"meta", (void *)meta, sizeof meta}, {"big", big, big_n}};
  char dir[512], err[1024] = "";
  strcpy(dir, test_path(root, "sum"));
  uint64_t sum = 0, bytes = 0, sum2 = 1, bytes2 = 0;
  CHECK(ckpt_save_sum(dir, 3, secs, 2, 0, &sum, &bytes, err, sizeof err) == 0, "ckpt_save_sum: %s", err);
  CHECK(file_checksum(test_path(root, "sum/ckpt_00000003.bin"), &sum2, &bytes2, err, sizeof err) == 0, "%s", err);
  CHECK(sum == sum2 && bytes == bytes2 && bytes > (128u << 20),
        "the checksum hashed from memory = file_checksum of the file (%016llx vs %016llx, %llu vs %llu bytes)",
        (unsigned long long)sum, (unsigned long long)sum2, (unsigned long long)bytes, (unsigned long long)bytes2);
  free(big);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/test_ckpt_XXXXXX");
  if (!mkdtemp(root)) die("cannot create a temp directory: %s", strerror(errno));
  test_round_trip();
  test_layout();
  test_load_errors();
  test_pruning();
  test_prune_unlisted();
  test_latest();
  test_failed_saves();
  test_streamed_checksums();
  nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  TEST_END();
}
