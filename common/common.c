// common/common.c: see common/common.h.
#define _POSIX_C_SOURCE 200809L
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void die_at(const char *file, int line, const char *fmt, ...) {
  fflush(stdout);
  fprintf(stderr, "error (%s:%d): ", file, line);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}

void *xmalloc_at(const char *file, int line, size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) die_at(file, line, "out of memory allocating %zu bytes", n);
  return p;
}

void *xcalloc_at(const char *file, int line, size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) die_at(file, line, "out of memory allocating %zu x %zu bytes", n, size);
  return p;
}

void *grow_array_at(const char *file, int line, void *arr, int n, int *cap, size_t elem) {
  if (n < *cap) return arr;
  int grown = *cap ? 2 * *cap : 32;
  void *p = realloc(arr, (size_t)grown * elem);
  if (!p) die_at(file, line, "out of memory growing an array to %d entries of %zu bytes", grown, elem);
  *cap = grown;
  return p;
}

FILE *xfopen_at(const char *file, int line, const char *path, const char *mode) {
  FILE *f = fopen(path, mode);
  if (!f) die_at(file, line, "cannot open '%s' (mode %s): %s", path, mode, strerror(errno));
  return f;
}

void xfread_at(const char *file, int line, void *p, size_t size, size_t n, FILE *f, const char *what) {
  if (fread(p, size, n, f) != n)
    die_at(file, line, "short read of %s (%s)", what, ferror(f) ? strerror(errno) : "unexpected end of file");
}

void xfwrite_at(const char *file, int line, const void *p, size_t size, size_t n, FILE *f, const char *what) {
  if (fwrite(p, size, n, f) != n) die_at(file, line, "short write of %s: %s", what, strerror(errno));
}

char *read_file(const char *path, size_t *len) {
  FILE *f = xfopen(path, "rb");
  if (fseek(f, 0, SEEK_END) != 0) die("cannot seek '%s': %s", path, strerror(errno));
  long n = ftell(f);
  if (n < 0) die("cannot size '%s': %s", path, strerror(errno));
  rewind(f);
  char *buf = xmalloc((size_t)n + 1);
  if (n) xfread(buf, 1, (size_t)n, f, path);
  buf[n] = 0;
  fclose(f);
  if (len) *len = (size_t)n;
  return buf;
}

double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void rng_seed(Rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_u64(Rng *r) {
  uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

float rng_uniform(Rng *r) { return (rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

float rng_normal(Rng *r) {
  float u1 = rng_uniform(r), u2 = rng_uniform(r);
  if (u1 < 1e-12f) u1 = 1e-12f;
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

static const uint64_t H1 = 0x9E3779B185EBCA87ull, H2 = 0xC2B2AE3D27D4EB4Full, H3 = 0x165667B19E3779F9ull;

static uint64_t lane(uint64_t acc, uint64_t w) {
  acc += w * H2;
  acc = rotl(acc, 31);
  return acc * H1;
}

// One 32-byte block into the four lanes.
static void block32(uint64_t *v, const unsigned char *p) {
  uint64_t w;
  for (int k = 0; k < 4; k++) {
    memcpy(&w, p + 8 * k, 8);
    v[k] = lane(v[k], w);
  }
}

// The lanes' sum with the length, then the last len % 32 bytes p[0 .. rest) and the avalanche.
static uint64_t finish(const uint64_t *v, uint64_t len, const unsigned char *p, size_t rest) {
  uint64_t h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18) + len, w;
  size_t i = 0;
  for (; i + 8 <= rest; i += 8) {
    memcpy(&w, p + i, 8);
    h = rotl(h ^ lane(0, w), 27) * H1 + H3;
  }
  for (; i < rest; i++) h = rotl(h ^ (p[i] * H3), 11) * H1;
  h ^= h >> 33;
  h *= H2;
  h ^= h >> 29;
  h *= H3;
  h ^= h >> 32;
  return h;
}

uint64_t hash64(const void *data, size_t len, uint64_t seed) {
  const unsigned char *p = data;
  uint64_t v[4] = {seed + H1 + H2, seed + H2, seed, seed - H1};
  size_t i = 0;
  for (; i + 32 <= len; i += 32) block32(v, p + i);
  return finish(v, len, p + i, len - i);
}

Hash64Stream hash64_begin(uint64_t seed) {
  Hash64Stream s = {{seed + H1 + H2, seed + H2, seed, seed - H1}, 0, {0}, 0};
  return s;
}

void hash64_update(Hash64Stream *s, const void *data, size_t len) {
  const unsigned char *p = data;
  s->len += len;
  if (s->ntail) {  // complete the pending block first
    size_t take = 32 - (size_t)s->ntail < len ? 32 - (size_t)s->ntail : len;
    memcpy(s->tail + s->ntail, p, take);
    s->ntail += (int)take, p += take, len -= take;
    if (s->ntail < 32) return;
    block32(s->lane, s->tail);
    s->ntail = 0;
  }
  for (; len >= 32; p += 32, len -= 32) block32(s->lane, p);
  memcpy(s->tail, p, len);
  s->ntail = (int)len;
}

uint64_t hash64_final(const Hash64Stream *s) { return finish(s->lane, s->len, s->tail, (size_t)s->ntail); }

void chunk_hasher_init(ChunkHasher *h, uint64_t chunk_bytes) {
  memset(h, 0, sizeof *h);
  h->chunk_bytes = chunk_bytes, h->cur = hash64_begin(0);
}

void chunk_hashes_push(uint64_t *hashes, size_t *nh, uint64_t chunk_hash) {
  if (*nh == 512) hashes[0] = hash64(hashes, 512 * sizeof(uint64_t), 1), *nh = 1;  // the fold
  hashes[(*nh)++] = chunk_hash;
}

static void push_chunk(ChunkHasher *h) {
  chunk_hashes_push(h->hashes, &h->nh, hash64_final(&h->cur));
  h->cur = hash64_begin(h->total), h->in_chunk = 0;  // the next chunk is seeded with its offset
}

void chunk_hasher_update(ChunkHasher *h, const void *data, size_t len) {
  const unsigned char *p = data;
  while (len) {
    const uint64_t room = h->chunk_bytes - h->in_chunk;
    const size_t take = len < room ? len : (size_t)room;
    hash64_update(&h->cur, p, take);
    h->in_chunk += take, h->total += take, p += take, len -= take;
    if (h->in_chunk == h->chunk_bytes) push_chunk(h);
  }
}

void chunk_hasher_final(ChunkHasher *h, uint64_t *checksum, uint64_t *bytes) {
  if (h->in_chunk) push_chunk(h);
  *checksum = hash64(h->hashes, h->nh * sizeof(uint64_t), h->total);
  *bytes = h->total;
}

int make_dirs(const char *dir, char *err, size_t errlen) {
  size_t n = strlen(dir);
  char *p = xmalloc(n + 1);
  memcpy(p, dir, n + 1);
  int rc = 0;
  for (size_t i = 1; i <= n && !rc; i++) {
    if (p[i] != '/' && p[i]) continue;
    char c = p[i];
    p[i] = 0;  // p is now one prefix of the path
    struct stat st;
    if (mkdir(p, 0755) && errno != EEXIST) {
      snprintf(err, errlen, "cannot create directory '%s': %s", p, strerror(errno));
      rc = -1;
    } else if (stat(p, &st) || !S_ISDIR(st.st_mode)) {
      snprintf(err, errlen, "cannot create directory '%s': '%s' is not a directory", dir, p);
      rc = -1;
    }
    p[i] = c;
  }
  free(p);
  return rc;
}

int write_all_fd(int fd, const void *buf, uint64_t n) {
  const uint64_t chunk = (uint64_t)64 << 20;
  const char *p = buf;
  while (n) {
    ssize_t r = write(fd, p, n < chunk ? n : chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = ENOSPC;
      return -1;
    }
    p += r, n -= (uint64_t)r;
  }
  return 0;
}

int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  if (rc && errno == EINVAL) rc = 0;
  int e = errno;
  close(fd);
  errno = e;
  return rc;
}

int write_file_atomic(const char *path, const void *data, size_t bytes, char *err, size_t errlen) {
  const size_t n = strlen(path);
  char *tmp = xmalloc(n + 5), *dir = xmalloc(n + 2);
  snprintf(tmp, n + 5, "%s.tmp", path);
  const char *slash = strrchr(path, '/');  // the directory whose entry the rename changes
  if (!slash) snprintf(dir, n + 2, ".");
  else snprintf(dir, n + 2, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  int rc = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = set_err(err, errlen, "cannot create '%s': %s", tmp, strerror(errno));
  } else {
    if (write_all_fd(fd, data, bytes) || fsync(fd))
      rc = set_err(err, errlen, "cannot write '%s': %s", tmp, strerror(errno));
    if (close(fd) && !rc) rc = set_err(err, errlen, "cannot close '%s': %s", tmp, strerror(errno));
    if (rc) unlink(tmp);
  }
  if (!rc && rename(tmp, path)) {
    rc = set_err(err, errlen, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    unlink(tmp);
  }
  if (!rc && fsync_dir(dir))
    rc = set_err(err, errlen, "'%s' was written but syncing its directory failed: %s", path, strerror(errno));
  free(dir);
  free(tmp);
  return rc;
}

int set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}
