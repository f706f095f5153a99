// common/gemm_plans.c: see gemm_plans.h. The file (docs/determinism.md) is text, one entry a line:
//   fp4train gemm_plans 1
//   GPU NAME<TAB>CC<TAB>CUBLASLT VERSION<TAB>12 KEY INTS<TAB>8 VALUE WORDS IN HEX
//   end N CHECKSUM
// where N counts the entries and CHECKSUM is hash64 (common.h) of every byte before the end line.
#include "common/gemm_plans.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/common.h"

#define HEADER "fp4train gemm_plans 1\n"

static int same_dev(const GemmPlanDevice *a, const GemmPlanDevice *b) {
  return a->cc == b->cc && a->lib == b->lib && !strcmp(a->gpu, b->gpu);
}

static GemmPlanEntry *find(const GemmPlans *r, const GemmPlanDevice *dev, const int *key) {
  for (int i = 0; i < r->n; i++)
    if (same_dev(&r->e[i].dev, dev) && !memcmp(r->e[i].key, key, sizeof r->e[i].key)) return &r->e[i];
  return NULL;
}

const uint64_t *gemm_plans_find(const GemmPlans *r, const GemmPlanDevice *dev, const int *key) {
  const GemmPlanEntry *e = find(r, dev, key);
  return e ? e->value : NULL;
}

int gemm_plans_count(const GemmPlans *r, const GemmPlanDevice *dev) {
  int n = 0;
  for (int i = 0; i < r->n; i++) n += same_dev(&r->e[i].dev, dev);
  return n;
}

int gemm_plans_put(GemmPlans *r, const GemmPlanDevice *dev, const int *key, const uint64_t *value, char *err,
                   size_t errlen) {
  if (!dev->gpu[0] || strpbrk(dev->gpu, "\t\n\r"))
    return set_err(err, errlen, "gemm_plans: device name '%s' is empty or holds a tab or newline", dev->gpu);
  GemmPlanEntry *e = find(r, dev, key);
  if (!e) {
    r->e = grow_array(r->e, r->n, &r->cap, sizeof *r->e);
    e = &r->e[r->n++];
    e->dev = *dev;
    memcpy(e->key, key, sizeof e->key);
  }
  memcpy(e->value, value, sizeof e->value);
  return 0;
}

void gemm_plans_free(GemmPlans *r) {
  if (r->lock_depth > 0) close(r->lock_fd);  // closing the file releases its flock
  free(r->e);
  r->e = NULL;
  r->n = r->cap = r->lock_depth = 0;
}

// ---- reading ------------------------------------------------------------------------------------

// Why a file is refused, and what to do about it.
#define REFUSE(...)                                                                                            \
  (snprintf(why, sizeof why, __VA_ARGS__),                                                                     \
   set_err(err, errlen,                                                                                        \
           "gemm_plans '%s': %s; it is not used: move it away to time the GEMMs afresh (a run then no longer " \
           "repeats, bit for bit, the processes that recorded it)",                                            \
           path, why))

// Exactly n integers separated by single spaces, the whole of s (base 10 or 16; signed ones fit an int).
static int parse_words(const char *s, int n, int base, uint64_t *out, int is_signed) {
  for (int i = 0; i < n; i++) {
    if (i && *s++ != ' ') return -1;
    if (*s == ' ' || *s == '+' || !*s || (!is_signed && *s == '-')) return -1;
    char *end;
    errno = 0;
    if (is_signed) {
      long long v = strtoll(s, &end, base);
      if (v < INT32_MIN || v > INT32_MAX) return -1;
      out[i] = (uint64_t)v;
    } else out[i] = strtoull(s, &end, base);
    if (errno || end == s) return -1;
    s = end;
  }
  return *s ? -1 : 0;
}

// One entry line (NUL-terminated, without its newline) into *e; a message in why on failure.
static int parse_entry(char *line, GemmPlanEntry *e, char *why, size_t n) {
  char *field[5];
  int tabs = 0;
  for (const char *c = line; *c; c++) tabs += *c == '\t';
  if (tabs != 4) return snprintf(why, n, "expected 5 tab-separated fields, got %d", tabs + 1), -1;
  field[0] = line;
  for (int k = 1; k < 5; k++) {
    char *tab = strchr(field[k - 1], '\t');
    *tab = 0;
    field[k] = tab + 1;
  }
  if (!field[0][0] || strlen(field[0]) >= sizeof e->dev.gpu) return snprintf(why, n, "bad device name"), -1;
  snprintf(e->dev.gpu, sizeof e->dev.gpu, "%s", field[0]);
  uint64_t w[GEMM_PLAN_KEY_INTS];
  if (parse_words(field[1], 1, 10, w, 1) || (int64_t)w[0] < 0)
    return snprintf(why, n, "bad compute capability '%s'", field[1]), -1;
  e->dev.cc = (int)w[0];
  if (parse_words(field[2], 1, 10, &e->dev.lib, 0)) return snprintf(why, n, "bad library version '%s'", field[2]), -1;
  if (parse_words(field[3], GEMM_PLAN_KEY_INTS, 10, w, 1))
    return snprintf(why, n, "the key is not %d integers", (int)GEMM_PLAN_KEY_INTS), -1;
  for (int i = 0; i < GEMM_PLAN_KEY_INTS; i++) e->key[i] = (int)(int64_t)w[i];
  if (parse_words(field[4], GEMM_PLAN_VALUE_WORDS, 16, e->value, 0))
    return snprintf(why, n, "the value is not %d hexadecimal words", (int)GEMM_PLAN_VALUE_WORDS), -1;
  return 0;
}

// The whole file into a malloc'd NUL-terminated buffer; 1 when it does not exist, -1 on an error.
static int slurp(const char *path, char **out, size_t *len, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (errno == ENOENT) return 1;
    return set_err(err, errlen, "gemm_plans '%s': cannot open: %s", path, strerror(errno));
  }
  size_t cap = 4096, n = 0;
  char *buf = xmalloc(cap);
  for (;;) {
    n += fread(buf + n, 1, cap - 1 - n, f);
    if (n < cap - 1) break;
    buf = realloc(buf, cap *= 2);
    if (!buf) die("gemm_plans '%s': out of memory", path);
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return set_err(err, errlen, "gemm_plans '%s': cannot read: %s", path, strerror(errno));
  }
  buf[n] = 0;
  *out = buf, *len = n;
  return 0;
}

int gemm_plans_load(GemmPlans *r, const char *path, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  if (strlen(path) >= sizeof r->path) return set_err(err, errlen, "gemm_plans: path '%s' is too long", path);
  snprintf(r->path, sizeof r->path, "%s", path);
  char *buf = NULL, why[256];
  size_t len = 0;
  int got = slurp(path, &buf, &len, err, errlen);
  if (got) return got > 0 ? 0 : -1;
  int rc = 0;
  // The end line: the last line, closing the file with its newline.
  size_t end = len && buf[len - 1] == '\n' ? len - 1 : len;
  while (end > 0 && buf[end - 1] != '\n') end--;
  unsigned long long count = 0, sum = 0;
  int used = 0;
  if (len == 0 || buf[len - 1] != '\n' || strlen(buf) != len ||
      sscanf(buf + end, "end %llu %16llx%n", &count, &sum, &used) != 2 || buf + end + used != buf + len - 1)
    rc = REFUSE("truncated or not a gemm_plans file (its last line is not 'end COUNT CHECKSUM')");
  else if (strncmp(buf, HEADER, strlen(HEADER)))
    rc = REFUSE("its first line is not '%.*s' (another format or version)", (int)strlen(HEADER) - 1, HEADER);
  else if (hash64(buf, end, 0) != sum)
    rc = REFUSE("checksum mismatch (the file was changed or damaged after it was written)");
  int line_no = 1;
  for (char *p = buf + strlen(HEADER); !rc && p < buf + end; line_no++) {
    char *nl = strchr(p, '\n');
    *nl = 0;
    GemmPlanEntry e;
    char what[160];
    if (parse_entry(p, &e, what, sizeof what)) rc = REFUSE("line %d: %s", line_no + 1, what);
    else if (find(r, &e.dev, e.key)) rc = REFUSE("line %d repeats an earlier entry", line_no + 1);
    else if (gemm_plans_put(r, &e.dev, e.key, e.value, what, sizeof what))
      rc = REFUSE("line %d: %s", line_no + 1, what);
    p = nl + 1;
  }
  if (!rc && (unsigned long long)r->n != count)
    rc = REFUSE("the end line counts %llu entries, the file holds %d", count, r->n);
  free(buf);
  if (rc) gemm_plans_free(r);
  return rc;
}

// ---- writing ------------------------------------------------------------------------------------

// mkdir -p of the folder of path (nothing for a bare file name or one in /).
static int make_parent(const char *path, char *err, size_t errlen) {
  char dir[2048];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return 0;
  *slash = 0;
  return make_dirs(dir, err, errlen);
}

int gemm_plans_save(const GemmPlans *r, char *err, size_t errlen) {
  if (!r->path[0]) return 0;
  size_t cap = 256 + (size_t)r->n * (GEMM_PLAN_GPU_MAX + 400), o = 0;
  char *buf = xmalloc(cap);
  o += (size_t)snprintf(buf + o, cap - o, "%s", HEADER);
  for (int i = 0; i < r->n; i++) {
    const GemmPlanEntry *e = &r->e[i];
    o += (size_t)snprintf(buf + o, cap - o, "%s\t%d\t%" PRIu64 "\t", e->dev.gpu, e->dev.cc, e->dev.lib);
    for (int j = 0; j < GEMM_PLAN_KEY_INTS; j++)
      o += (size_t)snprintf(buf + o, cap - o, "%s%d", j ? " " : "", e->key[j]);
    o += (size_t)snprintf(buf + o, cap - o, "\t");
    for (int j = 0; j < GEMM_PLAN_VALUE_WORDS; j++)
      o += (size_t)snprintf(buf + o, cap - o, "%s%016" PRIx64, j ? " " : "", e->value[j]);
    o += (size_t)snprintf(buf + o, cap - o, "\n");
  }
  o += (size_t)snprintf(buf + o, cap - o, "end %d %016" PRIx64 "\n", r->n, hash64(buf, o, 0));
  int rc = make_parent(r->path, err, errlen) || write_file_atomic(r->path, buf, o, err, errlen) ? -1 : 0;
  free(buf);
  return rc;
}

// ---- sharing ------------------------------------------------------------------------------------

int gemm_plans_lock(GemmPlans *r, char *err, size_t errlen) {
  if (!r->path[0]) return 0;
  if (r->lock_depth == 0) {
    // A lock file beside the record, never removed: the record itself is replaced by rename at
    // every save, so a lock on it would be on a file that is no longer the record.
    char lock[sizeof r->path + 8];
    snprintf(lock, sizeof lock, "%s.lock", r->path);
    if (make_parent(r->path, err, errlen)) return -1;
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return set_err(err, errlen, "gemm_plans: cannot open the lock file '%s': %s", lock, strerror(errno));
    int rc;
    while ((rc = flock(fd, LOCK_EX)) && errno == EINTR) {
    }
    if (rc) {
      set_err(err, errlen, "gemm_plans: cannot lock '%s': %s", lock, strerror(errno));
      close(fd);
      return -1;
    }
    r->lock_fd = fd;
  }
  r->lock_depth++;
  GemmPlans disk;  // what other processes have saved since r was read
  if (gemm_plans_load(&disk, r->path, err, errlen)) {
    gemm_plans_unlock(r);
    return -1;
  }
  for (int i = 0; i < disk.n; i++)
    if (!find(r, &disk.e[i].dev, disk.e[i].key))
      gemm_plans_put(r, &disk.e[i].dev, disk.e[i].key, disk.e[i].value, NULL, 0);
  gemm_plans_free(&disk);
  return 0;
}

void gemm_plans_unlock(GemmPlans *r) {
  if (r->lock_depth > 0 && --r->lock_depth == 0) close(r->lock_fd);
}

// ---- the choice ---------------------------------------------------------------------------------

int gemm_plans_choice(int deterministic, const char *gemm_plans, const char *ckpt_dir, int world, int rank, int bench,
                      char *path, size_t n) {
  path[0] = 0;
  if (!deterministic) return GEMM_TIMED;
  int len;
  if (gemm_plans[0]) len = snprintf(path, n, "%s", gemm_plans);
  else if (ckpt_dir[0] && !bench) len = snprintf(path, n, "%s/gemm_plans", ckpt_dir);
  else return bench ? GEMM_TIMED : GEMM_HEURISTIC;
  if (world > 1 && len >= 0 && (size_t)len < n) len += snprintf(path + len, n - (size_t)len, ".rank_%d", rank);
  if (len < 0 || (size_t)len >= n) return path[0] = 0, -1;
  return GEMM_RECORDED;
}

const char *gemm_choice_name(GemmChoice c) {
  return c == GEMM_TIMED ? "timed" : c == GEMM_RECORDED ? "recorded" : c == GEMM_HEURISTIC ? "heuristic" : "?";
}
