// run/tensorboard.c: TensorBoard event files (run/tensorboard.h): TFRecord framing with masked
// CRC32C around hand-encoded Event and Summary protocol buffers.
#include "run/tensorboard.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

uint32_t crc32c(uint32_t crc, const void *data, size_t n) {
  const uint8_t *p = data;
  crc = ~crc;
  // Bit by bit: event records are a few hundred bytes per logging interval, so no table is needed.
  while (n--) {
    crc ^= *p++;
    for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1)));
  }
  return ~crc;
}

uint32_t tb_mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// ---- protocol buffer encoding: a growable byte buffer -------------------------------------------

typedef struct {
  uint8_t *p;
  size_t n, cap;
} Bytes;

static void put(Bytes *b, const void *src, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    uint8_t *q = realloc(b->p, b->cap);
    if (!q) die("tensorboard: out of memory (%zu bytes)", b->cap);
    b->p = q;
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}

static void put_varint(Bytes *b, uint64_t v) {
  uint8_t tmp[10];
  int n = 0;
  do {
    tmp[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    v >>= 7;
  } while (v);
  put(b, tmp, n);
}

static void put_le(Bytes *b, uint64_t v, int bytes) {
  uint8_t tmp[8];
  for (int i = 0; i < bytes; i++) tmp[i] = (uint8_t)(v >> (8 * i));
  put(b, tmp, bytes);
}

// A field's key: (field number << 3) | wire type (0 varint, 1 64-bit, 2 length-delimited, 5 32-bit).
static void put_key(Bytes *b, int field, int wire) { put_varint(b, (uint64_t)(field << 3 | wire)); }

static void put_bytes_field(Bytes *b, int field, const void *p, size_t n) {
  put_key(b, field, 2);
  put_varint(b, n);
  put(b, p, n);
}

static void put_double_field(Bytes *b, int field, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  put_key(b, field, 1);
  put_le(b, u, 8);
}

static void put_float_field(Bytes *b, int field, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  put_key(b, field, 5);
  put_le(b, u, 4);
}

// ---- the writer -------------------------------------------------------------------------------

struct TbWriter {
  FILE *f;
  char path[2048];
  Bytes summary;  // the pending Summary: its encoded Value fields
  Bytes event, record;
};

// One TFRecord around data.
static void write_record(TbWriter *w, const Bytes *data) {
  Bytes *r = &w->record;
  r->n = 0;
  put_le(r, data->n, 8);
  put_le(r, tb_mask_crc(crc32c(0, r->p, 8)), 4);
  put(r, data->p, data->n);
  put_le(r, tb_mask_crc(crc32c(0, data->p, data->n)), 4);
  xfwrite(r->p, 1, r->n, w->f, w->path);
}

void tb_scalar(TbWriter *w, const char *tag, float value) {
  Bytes v = {0};
  put_bytes_field(&v, 1, tag, strlen(tag));   // Value.tag
  put_float_field(&v, 2, value);              // Value.simple_value
  put_bytes_field(&w->summary, 1, v.p, v.n);  // Summary.value
  free(v.p);
}

void tb_event(TbWriter *w, int64_t step, double wall_time) {
  if (!w->summary.n) return;
  Bytes *e = &w->event;
  e->n = 0;
  put_double_field(e, 1, wall_time);  // Event.wall_time
  put_key(e, 2, 0);                   // Event.step
  put_varint(e, (uint64_t)step);
  put_bytes_field(e, 5, w->summary.p, w->summary.n);  // Event.summary
  write_record(w, e);
  w->summary.n = 0;
}

void tb_flush(TbWriter *w, int sync) {
  if (fflush(w->f) || (sync && fsync(fileno(w->f))))
    die("logging.tensorboard: writing %s: %s (a full disk?); the checkpoints are not affected", w->path,
        strerror(errno));
}

void tb_close(TbWriter *w) {
  if (!w) return;
  tb_flush(w, 1);
  fclose(w->f);
  free(w->summary.p), free(w->event.p), free(w->record.p);
  free(w);
}

const char *tb_path(const TbWriter *w) { return w->path; }

// ---- cutting an earlier file at a step --------------------------------------------------------

static uint64_t get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

// A varint at *p (before end); -1 when it runs past end or 10 bytes.
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int s = 0; s < 64 && *p < end; s += 7) {
    uint8_t c = *(*p)++;
    *v |= (uint64_t)(c & 0x7f) << s;
    if (!(c & 0x80)) return 0;
  }
  return -1;
}

// Event.step and whether it has a summary; -1 when the bytes are not an Event.
static int parse_event(const uint8_t *p, size_t n, int64_t *step, int *has_summary) {
  const uint8_t *end = p + n;
  *step = 0, *has_summary = 0;
  while (p < end) {
    uint64_t key, v;
    if (get_varint(&p, end, &key)) return -1;
    switch (key & 7) {
      case 0:
        if (get_varint(&p, end, &v)) return -1;
        if (key >> 3 == 2) *step = (int64_t)v;
        break;
      case 1:
        p += 8;
        break;
      case 5:
        p += 4;
        break;
      case 2:
        if (get_varint(&p, end, &v) || v > (uint64_t)(end - p)) return -1;
        if (key >> 3 == 5) *has_summary = 1;
        p += v;
        break;
      default:
        return -1;
    }
    if (p > end) return -1;
  }
  return 0;
}

int tb_cut_file(const char *path, int64_t max_step, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) return set_err(err, errlen, "%s: %s", path, strerror(errno));
  Bytes all = {0};
  uint8_t chunk[65536];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) put(&all, chunk, got);
  fclose(f);
  size_t keep = 0;  // bytes of the records kept
  int scalars = 0;
  for (size_t off = 0; off + 12 <= all.n;) {
    const uint8_t *r = all.p + off;
    uint64_t len = get_le(r, 8);
    if ((uint32_t)get_le(r + 8, 4) != tb_mask_crc(crc32c(0, r, 8)) || len > all.n - off - 16) break;
    if ((uint32_t)get_le(r + 12 + len, 4) != tb_mask_crc(crc32c(0, r + 12, len))) break;
    int64_t step;
    int has_summary;
    if (parse_event(r + 12, len, &step, &has_summary) || (has_summary && step > max_step)) break;
    scalars += has_summary;
    off += 16 + len;
    keep = off;
  }
  free(all.p);
  if (!scalars) {
    if (unlink(path)) return set_err(err, errlen, "%s: cannot remove it: %s", path, strerror(errno));
  } else if (keep < all.n && truncate(path, (off_t)keep)) {
    return set_err(err, errlen, "%s: cannot truncate it to step %lld: %s", path, (long long)max_step, strerror(errno));
  }
  return scalars;
}

TbWriter *tb_open(const char *dir, int64_t from_step, char *err, size_t errlen) {
  char e[1024];
  if (make_dirs(dir, e, sizeof e)) return set_err(err, errlen, "logging.tensorboard: %s", e), NULL;
  DIR *d = opendir(dir);
  if (!d) return set_err(err, errlen, "logging.tensorboard: %s: %s", dir, strerror(errno)), NULL;
  static const char prefix[] = "events.out.tfevents.";
  struct dirent *de;
  int failed = 0;
  while (!failed && (de = readdir(d))) {
    if (strncmp(de->d_name, prefix, sizeof prefix - 1)) continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    failed = tb_cut_file(path, from_step, e, sizeof e) < 0;
  }
  closedir(d);
  if (failed) return set_err(err, errlen, "logging.tensorboard: %s", e), NULL;

  TbWriter *w = xcalloc(1, sizeof *w);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  for (char *c = host; *c; c++)
    if (*c == '/') *c = '_';
  for (int n = 0; !w->f; n++) {  // n: the next free name in the unlikely case of a clash
    snprintf(w->path, sizeof w->path, "%s/%s%010lld.%s.%d.%d", dir, prefix, (long long)time(NULL), host, (int)getpid(),
             n);
    w->f = fopen(w->path, "wbx");
    if (!w->f && (errno != EEXIST || n > 1000)) {
      set_err(err, errlen, "logging.tensorboard: cannot create %s: %s", w->path, strerror(errno));
      free(w);
      return NULL;
    }
  }
  Bytes *v = &w->event;  // the first record: the file version
  put_double_field(v, 1, (double)time(NULL));
  put_bytes_field(v, 3, "brain.Event:2", 13);
  write_record(w, v);
  tb_flush(w, 0);
  return w;
}
