// run/manifest.c: sharded checkpoints, the manifest and the moments' resharding (see run/manifest.h).
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "run/checkpoint.h"
#include "run/manifest.h"

// The file's bytes through common.h's ChunkHasher (the definition a writer hashing as it writes uses).
int file_checksum(const char *path, uint64_t *checksum, uint64_t *bytes, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) return set_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
  unsigned char *buf = xmalloc(FILE_CHECKSUM_CHUNK);
  ChunkHasher *h = xmalloc(sizeof *h);
  chunk_hasher_init(h, FILE_CHECKSUM_CHUNK);
  size_t k;
  while ((k = fread(buf, 1, FILE_CHECKSUM_CHUNK, f)) > 0) chunk_hasher_update(h, buf, k);
  int bad = ferror(f);
  fclose(f);
  free(buf);
  if (!bad) chunk_hasher_final(h, checksum, bytes);
  free(h);
  if (bad) return set_err(err, errlen, "cannot read '%s': %s", path, strerror(errno));
  return 0;
}

static int cmp_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

// Steps of dir/manifest_*.txt, newest first; returns the count (*steps malloc'd).
static int list_manifests(const char *dir, int64_t **steps) {
  int n = 0, cap = 16;
  *steps = xmalloc(cap * sizeof(int64_t));
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    long long s;
    char tail[8];
    if (sscanf(e->d_name, "manifest_%lld.%7s", &s, tail) != 2 || strcmp(tail, "txt")) continue;
    if (n == cap) *steps = realloc(*steps, (cap *= 2) * sizeof(int64_t));
    if (!*steps) die("out of memory listing '%s'", dir);
    (*steps)[n++] = s;
  }
  closedir(d);
  qsort(*steps, n, sizeof(int64_t), cmp_desc);
  return n;
}

static void manifest_path(char *out, size_t len, const char *dir, int64_t step) {
  snprintf(out, len, "%s/manifest_%08lld.txt", dir, (long long)step);
}

int manifest_exists(const char *dir, int64_t step) {
  char p[4096];
  manifest_path(p, sizeof p, dir, step);
  return access(p, F_OK) == 0;
}

int manifest_write(const char *dir, const Manifest *m, int keep, char *err, size_t errlen) {
  char path[4096], tmp[4200];
  manifest_path(path, sizeof path, dir, m->step);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return set_err(err, errlen, "cannot create '%s': %s", tmp, strerror(errno));
  size_t dl = strlen(dir);
  fprintf(f, "# sharded checkpoint: shard RANK FILE LO HI BYTES CHECKSUM (run/manifest.h)\n");
  fprintf(f, "step %lld\nworld %d\nn_params %zu\n", (long long)m->step, m->world, m->n);
  for (int r = 0; r < m->world; r++) {
    const ShardFile *s = &m->files[r];
    const char *rel = strncmp(s->path, dir, dl) || s->path[dl] != '/' ? s->path : s->path + dl + 1;
    fprintf(f, "shard %d %s %zu %zu %llu %016llx\n", r, rel, s->lo, s->hi, (unsigned long long)s->bytes,
            (unsigned long long)s->checksum);
  }
  int bad = fflush(f) || fsync(fileno(f));
  if (fclose(f) || bad || rename(tmp, path)) {
    unlink(tmp);
    return set_err(err, errlen, "cannot write '%s': %s", path, strerror(errno));
  }
  if (keep <= 0) return 0;
  int64_t *steps;
  int n = list_manifests(dir, &steps);
  for (int i = keep; i < n; i++) {
    manifest_path(path, sizeof path, dir, steps[i]);
    unlink(path);
  }
  free(steps);
  return 0;
}

int manifest_read(const char *dir, int64_t step, Manifest *m, char *err, size_t errlen) {
  char path[4096], line[4096];
  manifest_path(path, sizeof path, dir, step);
  FILE *f = fopen(path, "r");
  if (!f) return set_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
  *m = (Manifest){.step = -1};
  int lineno = 0, seen = 0, rc = 0;
  long long v;
  while (!rc && fgets(line, sizeof line, f)) {
    lineno++;
    char file[1024];
    int r;
    size_t lo, hi;
    unsigned long long bytes, sum;
    if (line[0] == '#') continue;
    if (sscanf(line, "step %lld", &v) == 1) m->step = v;
    else if (sscanf(line, "world %lld", &v) == 1 && v >= 1 && v < 1 << 20 && !m->files) {
      m->world = (int)v;
      m->files = xcalloc((size_t)v, sizeof(ShardFile));
    } else if (sscanf(line, "n_params %zu", &m->n) == 1) {
    } else if (sscanf(line, "shard %d %1023s %zu %zu %llu %llx", &r, file, &lo, &hi, &bytes, &sum) == 6 && m->files &&
               r >= 0 && r < m->world) {
      ShardFile *s = &m->files[r];
      snprintf(s->path, sizeof s->path, "%s/%s", dir, file);
      s->lo = lo, s->hi = hi, s->bytes = bytes, s->checksum = sum;
      seen++;
    } else {
      rc = set_err(err, errlen, "%s:%d: cannot parse '%.80s'", path, lineno, line);
    }
  }
  fclose(f);
  if (!rc && (m->step != step || !m->files || seen != m->world))
    rc = set_err(err, errlen, "%s: incomplete (step %lld, world %d, %d shard lines)", path, (long long)m->step,
                 m->world, seen);
  for (int r = 0; !rc && r < m->world; r++)  // the shards must tile [0, n) in rank order
    if (m->files[r].lo != (r ? m->files[r - 1].hi : 0) || m->files[r].hi < m->files[r].lo ||
        (r == m->world - 1 && m->files[r].hi != m->n))
      rc = set_err(err, errlen, "%s: shard %d range [%zu, %zu) does not continue the previous ones", path, r,
                   m->files[r].lo, m->files[r].hi);
  if (rc) manifest_free(m);
  return rc;
}

int manifest_latest(const char *dir, Manifest *m, char *err, size_t errlen) {
  int64_t *steps;
  int n = list_manifests(dir, &steps), found = 1;
  for (int i = 0; i < n && found == 1; i++) {
    char why[1024];
    int bad = manifest_read(dir, steps[i], m, why, sizeof why);
    for (int r = 0; !bad && r < m->world; r++) {
      uint64_t sum, bytes;
      const ShardFile *s = &m->files[r];
      if (file_checksum(s->path, &sum, &bytes, why, sizeof why)) bad = 1;
      else if (bytes != s->bytes || sum != s->checksum)
        bad = set_err(why, sizeof why, "'%s' has %llu bytes and checksum %016llx, the manifest says %llu and %016llx",
                      s->path, (unsigned long long)bytes, (unsigned long long)sum, (unsigned long long)s->bytes,
                      (unsigned long long)s->checksum);
    }
    if (!bad) found = 0;
    else {
      fprintf(stderr, "warning: skipping sharded checkpoint of step %lld: %s\n", (long long)steps[i], why);
      manifest_free(m);
    }
  }
  free(steps);
  (void)err, (void)errlen;
  return found;
}

void manifest_free(Manifest *m) {
  free(m->files);
  m->files = NULL;
}

int manifest_load_moments(const ShardFile *src, int nsrc, size_t lo, size_t hi, float *m_out, float *v_out, char *err,
                          size_t errlen) {
  static const char *names[2] = {"adam_m", "adam_v"};
  float *out[2] = {m_out, v_out};
  for (int i = 0; i < nsrc; i++) {
    size_t a = src[i].lo > lo ? src[i].lo : lo, b = src[i].hi < hi ? src[i].hi : hi;
    if (a >= b) continue;                      // this file holds none of our range
    if (src[i].lo == lo && src[i].hi == hi) {  // same world size: straight into place
      CkptSection secs[2] = {{"adam_m", m_out, (hi - lo) * sizeof(float)},
                             {"adam_v", v_out, (hi - lo) * sizeof(float)}};
      if (ckpt_load(src[i].path, secs, 2, NULL, err, errlen)) return -1;
      continue;
    }
    for (int k = 0; k < 2; k++) {
      void *buf;
      size_t bytes;
      if (ckpt_read_section(src[i].path, names[k], &buf, &bytes, err, errlen)) return -1;
      if (bytes != (src[i].hi - src[i].lo) * sizeof(float)) {
        free(buf);
        return set_err(err, errlen, "'%s': section %s has %zu bytes, its shard [%zu, %zu) needs %zu", src[i].path,
                       names[k], bytes, src[i].lo, src[i].hi, (src[i].hi - src[i].lo) * sizeof(float));
      }
      memcpy(out[k] + (a - lo), (float *)buf + (a - src[i].lo), (b - a) * sizeof(float));
      free(buf);
    }
  }
  return 0;
}
