// run/checkpoint.c: see checkpoint.h; the byte layout is in docs/checkpoint_format.md.
// I/O goes through file descriptors (open/pread/write/fsync/rename) so that every failure can be
// reported with its errno and the temp file cleaned up, instead of dying inside stdio helpers.
#include "run/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the checkpoint format is little-endian and its structs are written as they lie in memory"
#endif

#define CKPT_MAGIC "LLAMACKP"  // 8 bytes, no terminator in the file
#define CKPT_VERSION 1u
#define CKPT_ALIGN 64                    // every section's data starts at a multiple of this
#define CKPT_CHUNK ((uint64_t)64 << 20)  // hashing unit and largest single read/write
#define CKPT_MAX_SECTIONS 65536          // bounds the table a (corrupt) header can ask us to read

typedef struct {
  char magic[8];
  uint32_t version;
  uint32_t n_sections;
  int64_t step;
  uint64_t file_bytes;   // the exact file size: catches truncation before any data is read
  uint64_t chunk_bytes;  // chunk size the section checksums were computed with
  uint64_t reserved[2];  // zero
  uint64_t checksum;     // hash64 of header (this field zero) + section table, seed 0
} CkptHeader;

typedef struct {
  char name[CKPT_NAME_MAX + 1];  // NUL-padded
  uint64_t offset;               // from the start of the file, a multiple of CKPT_ALIGN
  uint64_t bytes;
  uint64_t checksum;  // see section checksums below
  uint64_t reserved;  // zero
} CkptEntry;

_Static_assert(sizeof(CkptHeader) == 64, "the header is 64 bytes");
_Static_assert(sizeof(CkptEntry) == 96, "a section table entry is 96 bytes");

static char *path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = xmalloc(n);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static uint64_t align_up(uint64_t x) { return (x + CKPT_ALIGN - 1) / CKPT_ALIGN * CKPT_ALIGN; }

// ---------------------------------------------------------------------------------------------
// Section checksums. A section is cut into chunk_bytes pieces; piece c hashes to
// hash64(piece, len, c), and the section's checksum is hash64 of that array of piece hashes,
// seeded with the section's length. Pieces let a many-GB section be hashed on all cores and be
// verified while streaming it through one chunk of memory; the result is the same either way.

static uint64_t n_chunks(uint64_t bytes, uint64_t chunk) { return (bytes + chunk - 1) / chunk; }

// Checksums of secs[0..n) into out[]. Every chunk of every section is one job of a static
// OpenMP loop (each job's result is independent of the thread that runs it: deterministic).
static void checksum_sections(const CkptSection *secs, int n, uint64_t chunk, uint64_t *out) {
  uint64_t *first = xmalloc(((size_t)n + 1) * sizeof(uint64_t));
  uint64_t total = 0;
  for (int i = 0; i < n; i++) {
    first[i] = total;
    total += n_chunks(secs[i].bytes, chunk);
  }
  first[n] = total;
  uint64_t *h = xmalloc((total ? total : 1) * sizeof(uint64_t));
  int *owner = xmalloc((total ? total : 1) * sizeof(int));
  for (int i = 0; i < n; i++)
    for (uint64_t j = first[i]; j < first[i + 1]; j++) owner[j] = i;
#pragma omp parallel for schedule(static) if (total > 1)
  for (uint64_t j = 0; j < total; j++) {
    const CkptSection *s = &secs[owner[j]];
    uint64_t c = j - first[owner[j]], lo = c * chunk, len = s->bytes - lo < chunk ? s->bytes - lo : chunk;
    h[j] = hash64((const char *)s->data + lo, len, c);
  }
  for (int i = 0; i < n; i++)
    out[i] = hash64(h + first[i], (first[i + 1] - first[i]) * sizeof(uint64_t), secs[i].bytes);
  free(owner);
  free(h);
  free(first);
}

// ---------------------------------------------------------------------------------------------
// Low-level I/O. read_at loops over partial transfers and EINTR and moves at most one chunk per call
// (Linux caps a single read near 2 GiB), as common.h's write_all_fd does for writes. On failure it
// returns -1 with errno set; an unexpected end of file leaves errno 0.

static int read_at(int fd, void *buf, uint64_t n, uint64_t off) {
  char *p = buf;
  while (n) {
    ssize_t r = pread(fd, p, n < CKPT_CHUNK ? n : CKPT_CHUNK, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return -1;
    }
    p += r, off += (uint64_t)r, n -= (uint64_t)r;
  }
  return 0;
}

static const char *io_error(int e) { return e ? strerror(e) : "unexpected end of file"; }

// ---------------------------------------------------------------------------------------------
// Reading.

typedef struct {
  int fd;
  CkptHeader h;
  CkptEntry *e;  // h.n_sections entries
} CkptFile;

static void ckpt_close(CkptFile *f) {
  if (f->fd >= 0) close(f->fd);
  free(f->e);
  f->fd = -1, f->e = NULL;
}

// Reads and checks the header and table of the open file f->fd (size bytes on disk) into f.
static int read_header(CkptFile *f, const char *path, uint64_t size, char *err, size_t errlen) {
  CkptHeader *h = &f->h;
  if (size < sizeof *h)
    return set_err(err, errlen, "'%s' is not a checkpoint: %llu bytes is less than the 64-byte header", path,
                   (unsigned long long)size);
  if (read_at(f->fd, h, sizeof *h, 0))
    return set_err(err, errlen, "cannot read the header of checkpoint '%s': %s", path, io_error(errno));
  if (memcmp(h->magic, CKPT_MAGIC, 8)) return set_err(err, errlen, "'%s' is not a checkpoint (bad magic)", path);
  if (h->version != CKPT_VERSION)
    return set_err(err, errlen, "checkpoint '%s' has format version %u; this build reads version %u", path, h->version,
                   CKPT_VERSION);
  if (h->n_sections > CKPT_MAX_SECTIONS)
    return set_err(err, errlen, "checkpoint '%s' has a corrupt header (%u sections)", path, h->n_sections);
  uint64_t head = sizeof *h + (uint64_t)h->n_sections * sizeof(CkptEntry);
  if (size < head)
    return set_err(err, errlen, "checkpoint '%s' is truncated: %llu bytes, less than its header and table (%llu)", path,
                   (unsigned long long)size, (unsigned long long)head);
  // The header checksum covers the header (with the checksum field zeroed) and the whole table.
  unsigned char *buf = xmalloc(head);
  if (read_at(f->fd, buf, head, 0)) {
    int e = errno;
    free(buf);
    return set_err(err, errlen, "cannot read the section table of checkpoint '%s': %s", path, io_error(e));
  }
  memset(buf + offsetof(CkptHeader, checksum), 0, sizeof(uint64_t));
  uint64_t sum = hash64(buf, head, 0);
  f->e = xmalloc((h->n_sections ? h->n_sections : 1) * sizeof(CkptEntry));
  memcpy(f->e, buf + sizeof *h, (size_t)h->n_sections * sizeof(CkptEntry));
  free(buf);
  if (sum != h->checksum)
    return set_err(err, errlen, "checkpoint '%s' has a header checksum mismatch (corrupt header or section table)",
                   path);
  if (size != h->file_bytes)
    return set_err(err, errlen, "checkpoint '%s' is %s: %llu bytes on disk, its header says %llu", path,
                   size < h->file_bytes ? "truncated" : "too long", (unsigned long long)size,
                   (unsigned long long)h->file_bytes);
  // A valid checksum makes the checks below redundant for files this code wrote; they keep a
  // hand-made or buggy file from sending reads out of bounds.
  uint64_t c = h->chunk_bytes;
  if (c < 4096 || c > ((uint64_t)1 << 40) || (c & (c - 1)))
    return set_err(err, errlen, "checkpoint '%s' has a bad chunk size %llu", path, (unsigned long long)c);
  for (uint32_t i = 0; i < h->n_sections; i++) {
    const CkptEntry *e = &f->e[i];
    if (!memchr(e->name, 0, sizeof e->name) || !e->name[0] || e->offset % CKPT_ALIGN || e->offset < head ||
        e->offset > h->file_bytes || e->bytes > h->file_bytes - e->offset)
      return set_err(err, errlen, "checkpoint '%s': section table entry %u is malformed", path, i);
  }
  return 0;
}

// Opens path and checks everything its header and table promise, without reading section data.
static int ckpt_open(const char *path, CkptFile *f, char *err, size_t errlen) {
  f->e = NULL;
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) return set_err(err, errlen, "cannot open checkpoint '%s': %s", path, strerror(errno));
  struct stat st;
  int rc = fstat(f->fd, &st) ? set_err(err, errlen, "cannot stat checkpoint '%s': %s", path, strerror(errno))
                             : read_header(f, path, (uint64_t)st.st_size, err, errlen);
  if (rc) ckpt_close(f);
  return rc;
}

static const CkptEntry *find_entry(const CkptFile *f, const char *name) {
  for (uint32_t i = 0; i < f->h.n_sections; i++)
    if (!strncmp(f->e[i].name, name, sizeof f->e[i].name)) return &f->e[i];
  return NULL;
}

// "no section 'x' (it has: a, b, c)": the list helps when a run and a checkpoint disagree.
static int missing_section(const CkptFile *f, const char *path, const char *name, char *err, size_t errlen) {
  char have[512] = "";
  size_t used = 0;
  for (uint32_t i = 0; i < f->h.n_sections && used + 1 < sizeof have; i++) {
    int k = snprintf(have + used, sizeof have - used, "%s'%s'", i ? ", " : "", f->e[i].name);
    if (k < 0) break;
    used += (size_t)k;
  }
  return set_err(err, errlen, "checkpoint '%s' has no section '%s' (it has: %s)", path, name,
                 f->h.n_sections ? have : "none");
}

// Reads one section's data into dst and checks its checksum.
static int read_entry(const CkptFile *f, const char *path, const CkptEntry *e, void *dst, char *err, size_t errlen) {
  if (read_at(f->fd, dst, e->bytes, e->offset))
    return set_err(err, errlen, "cannot read section '%s' of checkpoint '%s': %s", e->name, path, io_error(errno));
  CkptSection s = {e->name, dst, e->bytes};
  uint64_t sum;
  checksum_sections(&s, 1, f->h.chunk_bytes, &sum);
  if (sum != e->checksum)
    return set_err(err, errlen, "checkpoint '%s': section '%s' fails its checksum (corrupt data)", path, e->name);
  return 0;
}

int ckpt_verify(const char *path, int64_t *step, char *err, size_t errlen) {
  CkptFile f;
  if (ckpt_open(path, &f, err, errlen)) return -1;
  // Stream each section through one chunk-sized buffer, hashing piece by piece.
  uint64_t chunk = f.h.chunk_bytes, largest = 0;
  for (uint32_t i = 0; i < f.h.n_sections; i++)
    if (f.e[i].bytes > largest) largest = f.e[i].bytes;
  char *buf = xmalloc(largest < chunk ? largest : chunk);
  int rc = 0;
  for (uint32_t i = 0; i < f.h.n_sections && !rc; i++) {
    const CkptEntry *e = &f.e[i];
    uint64_t nc = n_chunks(e->bytes, chunk);
    uint64_t *h = xmalloc((nc ? nc : 1) * sizeof(uint64_t));
    for (uint64_t c = 0; c < nc && !rc; c++) {
      uint64_t lo = c * chunk, len = e->bytes - lo < chunk ? e->bytes - lo : chunk;
      if (read_at(f.fd, buf, len, e->offset + lo))
        rc = set_err(err, errlen, "cannot read section '%s' of checkpoint '%s': %s", e->name, path, io_error(errno));
      else h[c] = hash64(buf, len, c);
    }
    if (!rc && hash64(h, nc * sizeof(uint64_t), e->bytes) != e->checksum)
      rc = set_err(err, errlen, "checkpoint '%s': section '%s' fails its checksum (corrupt data)", path, e->name);
    free(h);
  }
  free(buf);
  if (!rc && step) *step = f.h.step;
  ckpt_close(&f);
  return rc;
}

int ckpt_load(const char *path, CkptSection *secs, int n, int64_t *step, char *err, size_t errlen) {
  CkptFile f;
  if (ckpt_open(path, &f, err, errlen)) return -1;
  int rc = 0;
  // Check every name and size before reading anything, so a mismatch leaves the buffers alone.
  for (int i = 0; i < n && !rc; i++) {
    const CkptEntry *e = find_entry(&f, secs[i].name);
    if (!e) rc = missing_section(&f, path, secs[i].name, err, errlen);
    else if (e->bytes != secs[i].bytes)
      rc = set_err(err, errlen, "checkpoint '%s': section '%s': checkpoint has %llu bytes, this run expects %zu", path,
                   secs[i].name, (unsigned long long)e->bytes, secs[i].bytes);
  }
  for (int i = 0; i < n && !rc; i++) rc = read_entry(&f, path, find_entry(&f, secs[i].name), secs[i].data, err, errlen);
  if (!rc && step) *step = f.h.step;
  ckpt_close(&f);
  return rc;
}

int ckpt_read_section(const char *path, const char *name, void **data, size_t *bytes, char *err, size_t errlen) {
  CkptFile f;
  if (ckpt_open(path, &f, err, errlen)) return -1;
  const CkptEntry *e = find_entry(&f, name);
  int rc = e ? 0 : missing_section(&f, path, name, err, errlen);
  if (!rc) {
    void *buf = xmalloc(e->bytes ? e->bytes : 1);
    rc = read_entry(&f, path, e, buf, err, errlen);
    if (rc) free(buf);
    else *data = buf, *bytes = e->bytes;
  }
  ckpt_close(&f);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Directory scanning. Finished checkpoints are named ckpt_<8 or more digits>.bin; a save in
// progress writes ckpt_<digits>.bin.tmp.

typedef struct {
  int64_t step;  // from the file name
  char *path;
} CkptName;

static int parse_ckpt_name(const char *name, int64_t *step) {
  if (strncmp(name, "ckpt_", 5)) return 0;
  const char *d = name + 5;
  size_t nd = strspn(d, "0123456789");
  if (nd < 8 || nd > 18 || strcmp(d + nd, ".bin")) return 0;
  *step = strtoll(d, NULL, 10);
  return 1;
}

static int is_temp_name(const char *name) {
  size_t n = strlen(name);
  return !strncmp(name, "ckpt_", 5) && n > 8 && !strcmp(name + n - 8, ".bin.tmp");
}

static int newest_first(const void *a, const void *b) {
  int64_t x = ((const CkptName *)a)->step, y = ((const CkptName *)b)->step;
  return (x < y) - (x > y);
}

// Lists dir's finished checkpoints, newest step first. Returns the count, or -1 with errno set.
static int list_ckpts(const char *dir, CkptName **out) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0, cap = 16;
  CkptName *v = xmalloc((size_t)cap * sizeof *v);
  struct dirent *de;
  while ((de = readdir(d))) {
    int64_t step;
    if (!parse_ckpt_name(de->d_name, &step)) continue;
    if (n == cap) {
      CkptName *w = xmalloc((size_t)cap * 2 * sizeof *v);
      memcpy(w, v, (size_t)n * sizeof *v);
      free(v);
      v = w, cap *= 2;
    }
    v[n].step = step;
    v[n++].path = path_join(dir, de->d_name);
  }
  closedir(d);
  qsort(v, (size_t)n, sizeof *v, newest_first);
  *out = v;
  return n;
}

// A file's step must be the one in its name: a copied or renamed file is not what it claims.
static int step_matches_name(const CkptName *c, int64_t step, char *err, size_t errlen) {
  if (step == c->step) return 1;
  set_err(err, errlen, "checkpoint '%s' holds step %lld, not the step in its name", c->path, (long long)step);
  return 0;
}

static void free_names(CkptName *v, int n) {
  for (int i = 0; i < n; i++) free(v[i].path);
  free(v);
}

int ckpt_latest(const char *dir, char *path, size_t pathlen, int64_t *step) {
  CkptName *v;
  int n = list_ckpts(dir, &v);
  if (n < 0) {
    if (errno == ENOENT) return 1;  // no directory yet: nothing to resume from
    fprintf(stderr, "error: cannot list checkpoint directory '%s': %s\n", dir, strerror(errno));
    return -1;
  }
  int rc = 1;
  for (int i = 0; i < n && rc == 1; i++) {
    char err[1024];
    int64_t s = -1;
    int ok = ckpt_verify(v[i].path, &s, err, sizeof err) == 0 && step_matches_name(&v[i], s, err, sizeof err);
    if (!ok) {
      fprintf(stderr, "warning: skipping invalid checkpoint: %s\n", err);
    } else if (strlen(v[i].path) >= pathlen) {
      fprintf(stderr, "error: checkpoint path '%s' does not fit in %zu bytes\n", v[i].path, pathlen);
      rc = -1;
    } else {
      strcpy(path, v[i].path);
      *step = s;
      rc = 0;
    }
  }
  free_names(v, n);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Writing.

// A crash during an earlier save leaves a temp file as big as a checkpoint: remove it first.
static void remove_stale_temps(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!is_temp_name(de->d_name)) continue;
    char *p = path_join(dir, de->d_name);
    if (unlink(p)) fprintf(stderr, "warning: cannot remove stale checkpoint temp file '%s': %s\n", p, strerror(errno));
    free(p);
  }
  closedir(d);
}

// Deletes the complete checkpoints of dir other than keep_step's that are not kept: without `listed`,
// the newest keep-1 of them are kept (ckpt_save's pruning); with it, those newer than keep_step and
// those listed() names. "Complete" is the cheap check (header, table, file size, step matches name);
// files that fail it are left alone, with a warning, and do not count.
static void prune(const char *dir, int64_t keep_step, int keep, int (*listed)(int64_t, void *), void *ctx) {
  CkptName *v;
  int n = list_ckpts(dir, &v);
  if (n < 0) {
    fprintf(stderr, "warning: cannot list '%s' to prune old checkpoints: %s\n", dir, strerror(errno));
    return;
  }
  int kept = 1;
  for (int i = 0; i < n; i++) {
    if (v[i].step == keep_step || (listed && (v[i].step > keep_step || listed(v[i].step, ctx)))) continue;
    char err[1024];
    CkptFile f;
    int ok = ckpt_open(v[i].path, &f, err, sizeof err) == 0;
    if (ok) {
      ok = step_matches_name(&v[i], f.h.step, err, sizeof err);
      ckpt_close(&f);
    }
    if (!ok) fprintf(stderr, "warning: checkpoint pruning leaves an invalid file alone: %s\n", err);
    else if (!listed && kept < keep) kept++;
    else if (unlink(v[i].path))
      fprintf(stderr, "warning: cannot delete old checkpoint '%s': %s\n", v[i].path, strerror(errno));
  }
  free_names(v, n);
}

void ckpt_prune_unlisted(const char *dir, int64_t keep_step, int (*listed)(int64_t step, void *ctx), void *ctx) {
  prune(dir, keep_step, 0, listed, ctx);
}

// Test hook: TRAIN_CKPT_SLOW_MS=ms stretches every save by about ms milliseconds, spread between
// its sections, so that a crash test can kill the process while a temp file is half written.
static long slow_write_ms(void) {
  const char *s = getenv("TRAIN_CKPT_SLOW_MS");
  return s ? strtol(s, NULL, 10) : 0;
}

// Test hook: TRAIN_CKPT_PAUSE=FILE holds every save after the first section of its temp file (a
// partial checkpoint on disk) until FILE exists, saying so on stderr, so that a test can kill or
// signal a process while a write is pending at an event rather than after a time.
static void pause_for_test(const char *tmp) {
  const char *go = getenv("TRAIN_CKPT_PAUSE");
  if (!go || !*go || access(go, F_OK) == 0) return;
  fprintf(stderr, "test hook: checkpoint write paused in '%s' until '%s' exists\n", tmp, go);
  while (access(go, F_OK)) nanosleep(&(struct timespec){0, 10000000L}, NULL);
}

// The file's file_checksum (run/manifest.h) from its bytes in memory, as write_temp lays them out (head
// bytes of buf, then each section at its offset after zero padding): the FILE_CHECKSUM_CHUNK chunks hashed
// in parallel, then listed in order as ChunkHasher does. No byte is read back from the file.
static uint64_t layout_checksum(const unsigned char *buf, uint64_t head, const CkptSection *secs, const CkptEntry *e,
                                int n, uint64_t file_bytes) {
  static const unsigned char zeros[CKPT_ALIGN];
  const uint64_t C = FILE_CHECKSUM_CHUNK, nc = (file_bytes + C - 1) / C;
  uint64_t *h = xmalloc((nc ? nc : 1) * sizeof(uint64_t));
#pragma omp parallel for schedule(dynamic, 1) if (nc > 1)
  for (uint64_t c = 0; c < nc; c++) {
    const uint64_t lo = c * C, hi = lo + C < file_bytes ? lo + C : file_bytes;
    Hash64Stream st = hash64_begin(lo);
    uint64_t at = 0;                // the file offset of the piece below
    for (int i = -1; i < n; i++) {  // -1: header and table, then per section its padding and its bytes
      for (int part = 0; part < 2; part++) {
        const unsigned char *p = i < 0 ? buf : part ? (const unsigned char *)secs[i].data : zeros;
        const uint64_t len = i < 0 ? (part ? 0 : head) : part ? e[i].bytes : e[i].offset - at;
        const uint64_t a = at > lo ? at : lo, b = at + len < hi ? at + len : hi;
        for (uint64_t x = a; x < b;) {  // padding is shorter than zeros; the loop only bounds the pointer
          const uint64_t take = p == zeros && b - x > sizeof zeros ? sizeof zeros : b - x;
          hash64_update(&st, p == zeros ? zeros : p + (x - at), take);
          x += take;
        }
        at += len;
      }
    }
    h[c] = hash64_final(&st);
  }
  uint64_t list[512];
  size_t nh = 0;
  for (uint64_t c = 0; c < nc; c++) chunk_hashes_push(list, &nh, h[c]);
  free(h);
  return hash64(list, nh * sizeof(uint64_t), file_bytes);
}

// Writes header+table (head bytes of buf) and the sections at their table offsets into a new file
// at tmp, then fsyncs it: without the fsync a crash after the rename could leave the final name
// pointing at blocks never written. On failure the file is removed.
static int write_temp(const char *tmp, const unsigned char *buf, uint64_t head, const CkptSection *secs,
                      const CkptEntry *e, int n, char *err, size_t errlen) {
  static const char zeros[CKPT_ALIGN];
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return set_err(err, errlen, "cannot create checkpoint temp file '%s': %s", tmp, strerror(errno));
  int bad = write_all_fd(fd, buf, head);
  uint64_t pos = head;
  long slow_ms = slow_write_ms();
  for (int i = 0; i < n && !bad; i++) {
    bad = write_all_fd(fd, zeros, e[i].offset - pos) || write_all_fd(fd, secs[i].data, e[i].bytes);
    pos = e[i].offset + e[i].bytes;
    if (i == 0 && !bad) pause_for_test(tmp);
    if (slow_ms > 0) nanosleep(&(struct timespec){slow_ms / n / 1000, slow_ms / n % 1000 * 1000000L}, NULL);
  }
  if (!bad) bad = fsync(fd);
  int rc = 0;
  if (bad) rc = set_err(err, errlen, "cannot write checkpoint temp file '%s': %s", tmp, strerror(errno));
  if (close(fd) && !rc) rc = set_err(err, errlen, "cannot close checkpoint temp file '%s': %s", tmp, strerror(errno));
  if (rc) unlink(tmp);
  return rc;
}

int ckpt_save(const char *dir, int64_t step, const CkptSection *secs, int n, int keep, char *err, size_t errlen) {
  return ckpt_save_sum(dir, step, secs, n, keep, NULL, NULL, err, errlen);
}

int ckpt_save_sum(const char *dir, int64_t step, const CkptSection *secs, int n, int keep, uint64_t *file_sum,
                  uint64_t *file_bytes, char *err, size_t errlen) {
  if (step < 0) return set_err(err, errlen, "checkpoint step must be >= 0, got %lld", (long long)step);
  if (n < 0 || n > CKPT_MAX_SECTIONS)
    return set_err(err, errlen, "checkpoint section count %d is out of range [0, %d]", n, CKPT_MAX_SECTIONS);
  for (int i = 0; i < n; i++) {
    const char *name = secs[i].name;
    if (!name || !name[0] || strlen(name) > CKPT_NAME_MAX)
      return set_err(err, errlen, "checkpoint section %d: name '%s' must be 1 to %d bytes", i, name ? name : "(null)",
                     CKPT_NAME_MAX);
    if (!secs[i].data && secs[i].bytes)
      return set_err(err, errlen, "checkpoint section '%s' has %zu bytes but no data", name, secs[i].bytes);
    for (int j = 0; j < i; j++)
      if (!strcmp(secs[j].name, name)) return set_err(err, errlen, "checkpoint section name '%s' appears twice", name);
  }
  if (!dir[0]) return set_err(err, errlen, "checkpoint directory is an empty string");
  if (make_dirs(dir, err, errlen)) return -1;
  remove_stale_temps(dir);

  // Header and table in one buffer: that is exactly what the header checksum covers.
  uint64_t head = sizeof(CkptHeader) + (uint64_t)n * sizeof(CkptEntry);
  unsigned char *buf = xcalloc(head, 1);
  CkptHeader h = {.version = CKPT_VERSION, .n_sections = (uint32_t)n, .step = step, .chunk_bytes = CKPT_CHUNK};
  memcpy(h.magic, CKPT_MAGIC, 8);
  CkptEntry *e = xcalloc(n ? (size_t)n : 1, sizeof *e);
  uint64_t *sums = xmalloc((n ? (size_t)n : 1) * sizeof(uint64_t));
  checksum_sections(secs, n, CKPT_CHUNK, sums);
  uint64_t pos = head;
  for (int i = 0; i < n; i++) {
    strcpy(e[i].name, secs[i].name);
    e[i].offset = align_up(pos);
    e[i].bytes = secs[i].bytes;
    e[i].checksum = sums[i];
    pos = e[i].offset + e[i].bytes;
  }
  h.file_bytes = pos;
  memcpy(buf, &h, sizeof h);
  memcpy(buf + sizeof h, e, (size_t)n * sizeof *e);
  h.checksum = hash64(buf, head, 0);
  memcpy(buf + offsetof(CkptHeader, checksum), &h.checksum, sizeof h.checksum);

  char name[64];
  snprintf(name, sizeof name, "ckpt_%08lld.bin", (long long)step);
  char *final = path_join(dir, name);
  snprintf(name, sizeof name, "ckpt_%08lld.bin.tmp", (long long)step);
  char *tmp = path_join(dir, name);

  if (file_sum) *file_sum = layout_checksum(buf, head, secs, e, n, h.file_bytes);
  int rc = write_temp(tmp, buf, head, secs, e, n, err, errlen);
  if (!rc && file_bytes) *file_bytes = h.file_bytes;
  if (!rc && rename(tmp, final)) {
    rc = set_err(err, errlen, "cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
    unlink(tmp);
  }
  if (!rc && fsync_dir(dir))
    rc = set_err(err, errlen, "checkpoint '%s' was written but syncing its directory failed: %s", final,
                 strerror(errno));
  if (!rc && keep > 0) prune(dir, step, keep, NULL, NULL);
  free(tmp);
  free(final);
  free(sums);
  free(e);
  free(buf);
  return rc;
}

int ckpt_probe_dir(const char *dir, char *err, size_t errlen) {
  if (!dir[0]) return set_err(err, errlen, "checkpoint directory is an empty string");
  if (make_dirs(dir, err, errlen)) return -1;
  // Named like a save's temp file, so one left by a crash is removed by the next save.
  char *probe = path_join(dir, "ckpt_probe.bin.tmp");
  int rc = 0, fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = set_err(err, errlen, "checkpoint directory '%s' is not writable: cannot create '%s': %s", dir, probe,
                 strerror(errno));
  } else {
    static const char bytes[CKPT_ALIGN];
    if (write_all_fd(fd, bytes, sizeof bytes) || fsync(fd))
      rc = set_err(err, errlen, "checkpoint directory '%s' is not writable: cannot write '%s': %s", dir, probe,
                   strerror(errno));
    close(fd);
    unlink(probe);
  }
  free(probe);
  return rc;
}

int ckpt_section_size(const char *path, const char *name, size_t *bytes, char *err, size_t errlen) {
  CkptFile f;
  if (ckpt_open(path, &f, err, errlen)) return -1;
  const CkptEntry *e = find_entry(&f, name);
  if (e) *bytes = e->bytes;
  ckpt_close(&f);
  return e ? 0 : 1;
}
