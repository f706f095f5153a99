// data/shard.c: writer and reader of token shards; see shard.h and docs/shard_format.md.
#include "data/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "common/common.h"

// ---------------------------------------------------------------------------------------------
// Little-endian packing, explicit so the files are the same on any host.

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static uint32_t token_bytes_for(uint32_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// Header layout (offsets in bytes): 0 magic[8], 8 version, 12 vocab_size, 16 token_bytes,
// 20 compression, 24 n_tokens, 32 payload_bytes, 40 checksum, 48 reserved (0), 56 header checksum.
static void header_pack(unsigned char h[SHARD_HEADER_BYTES], const ShardInfo *in) {
  memset(h, 0, SHARD_HEADER_BYTES);
  memcpy(h, SHARD_MAGIC, 8);
  put_u32(h + 8, in->version);
  put_u32(h + 12, in->vocab_size);
  put_u32(h + 16, in->token_bytes);
  put_u32(h + 20, in->compression);
  put_u64(h + 24, in->n_tokens);
  put_u64(h + 32, in->payload_bytes);
  put_u64(h + 40, in->checksum);
  put_u64(h + 56, hash64(h, 56, 0));
}

// ---------------------------------------------------------------------------------------------
// Writer: tokens are packed into a chunk buffer; each full chunk is hashed (chained) and either
// written raw or fed to one streaming zstd frame, so memory stays at a few MB for any shard size.

struct ShardWriter {
  char *path, *tmp_path;
  FILE *f;
  uint32_t vocab_size, token_bytes;
  ZSTD_CCtx *cctx;  // NULL when writing raw
  unsigned char *chunk;
  size_t chunk_len;
  unsigned char *zout;
  size_t zout_cap;
  uint64_t n_tokens, payload_bytes, checksum;
};

static void writer_emit(ShardWriter *w, const void *p, size_t n) {
  xfwrite(p, 1, n, w->f, w->tmp_path);
  w->payload_bytes += n;
}

// Compresses in (possibly empty) with mode, writing every produced byte; loops until zstd reports
// the input consumed (continue) or the frame finished (end).
static void writer_compress(ShardWriter *w, const void *src, size_t n, ZSTD_EndDirective mode) {
  ZSTD_inBuffer in = {src, n, 0};
  for (;;) {
    ZSTD_outBuffer out = {w->zout, w->zout_cap, 0};
    size_t left = ZSTD_compressStream2(w->cctx, &out, &in, mode);
    if (ZSTD_isError(left)) die("shard %s: zstd compression failed: %s", w->path, ZSTD_getErrorName(left));
    writer_emit(w, w->zout, out.pos);
    if (mode == ZSTD_e_end ? left == 0 : in.pos == in.size) break;
  }
}

static void writer_flush_chunk(ShardWriter *w) {
  if (w->chunk_len == 0) return;
  w->checksum = hash64(w->chunk, w->chunk_len, w->checksum);
  if (w->cctx) writer_compress(w, w->chunk, w->chunk_len, ZSTD_e_continue);
  else writer_emit(w, w->chunk, w->chunk_len);
  w->chunk_len = 0;
}

ShardWriter *shard_writer_open(const char *path, uint32_t vocab_size, int zstd_level) {
  if (vocab_size == 0) die("shard %s: vocab_size must be > 0", path);
  if (zstd_level != 0 && (zstd_level < ZSTD_minCLevel() || zstd_level > ZSTD_maxCLevel()))
    die("shard %s: zstd level %d outside [%d, %d] (0 = uncompressed)", path, zstd_level, ZSTD_minCLevel(),
        ZSTD_maxCLevel());
  ShardWriter *w = xcalloc(1, sizeof(*w));
  size_t plen = strlen(path);
  w->path = xmalloc(plen + 1);
  memcpy(w->path, path, plen + 1);
  w->tmp_path = xmalloc(plen + 5);
  snprintf(w->tmp_path, plen + 5, "%s.tmp", path);
  w->f = xfopen(w->tmp_path, "wb");
  w->vocab_size = vocab_size;
  w->token_bytes = token_bytes_for(vocab_size);
  w->chunk = xmalloc(SHARD_CHUNK_BYTES);
  if (zstd_level != 0) {
    w->cctx = ZSTD_createCCtx();
    if (!w->cctx) die("shard %s: cannot create a zstd context", path);
    size_t r = ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, zstd_level);
    if (ZSTD_isError(r)) die("shard %s: zstd level %d: %s", path, zstd_level, ZSTD_getErrorName(r));
    w->zout_cap = ZSTD_CStreamOutSize();
    w->zout = xmalloc(w->zout_cap);
  }
  // Placeholder header; the real one is written on close, once the counts are known.
  unsigned char zero[SHARD_HEADER_BYTES] = {0};
  xfwrite(zero, 1, sizeof(zero), w->f, w->tmp_path);
  return w;
}

void shard_writer_append(ShardWriter *w, const uint32_t *tokens, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t t = tokens[i];
    if (t >= w->vocab_size)
      die("shard %s: token id %u at index %llu is >= vocab_size %u", w->path, t, (unsigned long long)(w->n_tokens + i),
          w->vocab_size);
    unsigned char *p = w->chunk + w->chunk_len;
    if (w->token_bytes == 2) p[0] = (unsigned char)t, p[1] = (unsigned char)(t >> 8);
    else put_u32(p, t);
    w->chunk_len += w->token_bytes;
    if (w->chunk_len == SHARD_CHUNK_BYTES) writer_flush_chunk(w);  // chunk size is a multiple of 4
  }
  w->n_tokens += n;
}

// fsync the directory holding path, so the rename itself survives a crash.
static void fsync_parent_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash) snprintf(dir, sizeof(dir), ".");
  else if (slash == path) snprintf(dir, sizeof(dir), "/");
  else snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) die("shard %s: cannot open directory '%s' to fsync it: %s", path, dir, strerror(errno));
  if (fsync(fd) != 0 && errno != EINVAL)
    die("shard %s: fsync of directory '%s' failed: %s", path, dir, strerror(errno));
  close(fd);
}

uint64_t shard_writer_close(ShardWriter *w) {
  writer_flush_chunk(w);
  if (w->cctx) writer_compress(w, NULL, 0, ZSTD_e_end);
  ShardInfo info = {
      SHARD_VERSION, w->vocab_size,    w->token_bytes, w->cctx ? SHARD_COMPRESS_ZSTD : SHARD_COMPRESS_NONE,
      w->n_tokens,   w->payload_bytes, w->checksum};
  unsigned char h[SHARD_HEADER_BYTES];
  header_pack(h, &info);
  if (fseek(w->f, 0, SEEK_SET) != 0) die("shard %s: cannot seek: %s", w->tmp_path, strerror(errno));
  xfwrite(h, 1, sizeof(h), w->f, w->tmp_path);
  if (fflush(w->f) != 0) die("shard %s: flush failed: %s", w->tmp_path, strerror(errno));
  if (fsync(fileno(w->f)) != 0) die("shard %s: fsync failed: %s", w->tmp_path, strerror(errno));
  if (fclose(w->f) != 0) die("shard %s: close failed: %s", w->tmp_path, strerror(errno));
  if (rename(w->tmp_path, w->path) != 0)
    die("shard %s: cannot rename '%s' to it: %s", w->path, w->tmp_path, strerror(errno));
  fsync_parent_dir(w->path);
  uint64_t n = w->n_tokens;
  ZSTD_freeCCtx(w->cctx);
  free(w->zout);
  free(w->chunk);
  free(w->tmp_path);
  free(w->path);
  free(w);
  return n;
}

// ---------------------------------------------------------------------------------------------
// Reader. Every failure returns -1 with "shard PATH: what is wrong" in err.

static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...) {
  if (!err || errlen == 0) return -1;
  int k = snprintf(err, errlen, "shard %s: ", path);
  if (k >= 0 && (size_t)k < errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
    va_end(ap);
  }
  return -1;
}

// Opens path and validates its header into *info; on success returns the stream positioned at the
// payload, else NULL with err set.
static FILE *open_checked(const char *path, ShardInfo *info, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fail(err, errlen, path, "cannot open: %s", strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    fail(err, errlen, path, "cannot stat: %s", strerror(errno));
    goto bad;
  }
  uint64_t file_bytes = (uint64_t)st.st_size;
  if (file_bytes == 0) {
    fail(err, errlen, path, "file is empty (0 bytes), expected a %d-byte header", SHARD_HEADER_BYTES);
    goto bad;
  }
  if (file_bytes < SHARD_HEADER_BYTES) {
    fail(err, errlen, path, "truncated header: file has %llu bytes, the header needs %d",
         (unsigned long long)file_bytes, SHARD_HEADER_BYTES);
    goto bad;
  }
  unsigned char h[SHARD_HEADER_BYTES];
  if (fread(h, 1, sizeof(h), f) != sizeof(h)) {
    fail(err, errlen, path, "cannot read the header: %s", ferror(f) ? strerror(errno) : "unexpected end of file");
    goto bad;
  }
  if (memcmp(h, SHARD_MAGIC, 8) != 0) {
    fail(err, errlen, path, "bad magic (not a token shard; expected \"%s\")", SHARD_MAGIC);
    goto bad;
  }
  ShardInfo in = {get_u32(h + 8),  get_u32(h + 12), get_u32(h + 16), get_u32(h + 20),
                  get_u64(h + 24), get_u64(h + 32), get_u64(h + 40)};
  if (in.version != SHARD_VERSION) {
    fail(err, errlen, path, "unsupported format version %u (this reader knows version %d)", in.version, SHARD_VERSION);
    goto bad;
  }
  uint64_t want = get_u64(h + 56), got = hash64(h, 56, 0);
  if (want != got) {
    fail(err, errlen, path, "header checksum mismatch (stored %016llx, computed %016llx): the header is corrupt",
         (unsigned long long)want, (unsigned long long)got);
    goto bad;
  }
  // A valid checksum only proves the writer wrote these fields; check that they make sense too.
  if (get_u64(h + 48) != 0) {
    fail(err, errlen, path, "reserved header field is not zero");
    goto bad;
  }
  if (in.vocab_size == 0 || in.token_bytes != token_bytes_for(in.vocab_size)) {
    fail(err, errlen, path, "token_bytes %u does not match vocab_size %u", in.token_bytes, in.vocab_size);
    goto bad;
  }
  if (in.compression != SHARD_COMPRESS_NONE && in.compression != SHARD_COMPRESS_ZSTD) {
    fail(err, errlen, path, "unknown compression %u (0 none, 1 zstd)", in.compression);
    goto bad;
  }
  if (in.n_tokens > UINT64_MAX / 4 ||
      (in.compression == SHARD_COMPRESS_NONE && in.payload_bytes != in.n_tokens * in.token_bytes)) {
    fail(err, errlen, path, "payload_bytes %llu inconsistent with %llu tokens of %u bytes",
         (unsigned long long)in.payload_bytes, (unsigned long long)in.n_tokens, in.token_bytes);
    goto bad;
  }
  uint64_t found = file_bytes - SHARD_HEADER_BYTES;
  if (found < in.payload_bytes) {
    fail(err, errlen, path, "truncated: expected %llu payload bytes, found %llu", (unsigned long long)in.payload_bytes,
         (unsigned long long)found);
    goto bad;
  }
  if (found > in.payload_bytes) {
    fail(err, errlen, path, "%llu unexpected bytes after the %llu payload bytes",
         (unsigned long long)(found - in.payload_bytes), (unsigned long long)in.payload_bytes);
    goto bad;
  }
  *info = in;
  return f;
bad:
  fclose(f);
  return NULL;
}

int shard_read_info(const char *path, ShardInfo *info, char *err, size_t errlen) {
  FILE *f = open_checked(path, info, err, errlen);
  if (!f) return -1;
  fclose(f);
  return 0;
}

// Streams the uncompressed payload out of a file: raw bytes, or one zstd frame decoded piecewise.
typedef struct {
  FILE *f;
  const char *path;
  uint64_t file_left;  // payload bytes not yet read from the file
  ZSTD_DCtx *dctx;     // NULL for raw payloads
  unsigned char *inbuf;
  size_t in_cap;
  ZSTD_inBuffer in;
  size_t last_ret;  // last ZSTD_decompressStream result; 0 means a frame just ended cleanly
} PayloadSource;

static int source_refill(PayloadSource *s, char *err, size_t errlen) {
  size_t k = s->file_left < s->in_cap ? (size_t)s->file_left : s->in_cap;
  if (fread(s->inbuf, 1, k, s->f) != k)
    return fail(err, errlen, s->path, "read error in the payload: %s",
                ferror(s->f) ? strerror(errno) : "unexpected end of file");
  s->file_left -= k;
  s->in = (ZSTD_inBuffer){s->inbuf, k, 0};
  return 0;
}

// Fills dst with exactly n uncompressed payload bytes.
static int source_read(PayloadSource *s, unsigned char *dst, size_t n, char *err, size_t errlen) {
  if (!s->dctx) {
    if (fread(dst, 1, n, s->f) != n)
      return fail(err, errlen, s->path, "read error in the payload: %s",
                  ferror(s->f) ? strerror(errno) : "unexpected end of file");
    return 0;
  }
  ZSTD_outBuffer out = {dst, n, 0};
  while (out.pos < out.size) {
    if (s->in.pos == s->in.size) {
      if (s->file_left == 0)
        return fail(err, errlen, s->path,
                    "zstd payload ends early: the frame is truncated or holds fewer tokens than the header says");
      if (source_refill(s, err, errlen)) return -1;
    }
    size_t r = ZSTD_decompressStream(s->dctx, &out, &s->in);
    if (ZSTD_isError(r)) return fail(err, errlen, s->path, "zstd error: %s", ZSTD_getErrorName(r));
    s->last_ret = r;
  }
  return 0;
}

// After all expected bytes: the zstd stream must end exactly here, with no extra data.
static int source_finish(PayloadSource *s, char *err, size_t errlen) {
  if (!s->dctx) return 0;
  for (;;) {
    if (s->in.pos == s->in.size && s->file_left > 0 && source_refill(s, err, errlen)) return -1;
    if (s->in.pos == s->in.size) {
      if (s->last_ret == 0) return 0;
      return fail(err, errlen, s->path, "zstd error: the frame is incomplete (truncated payload)");
    }
    unsigned char extra;
    ZSTD_outBuffer out = {&extra, 1, 0};
    size_t r = ZSTD_decompressStream(s->dctx, &out, &s->in);
    if (ZSTD_isError(r)) return fail(err, errlen, s->path, "zstd error: %s", ZSTD_getErrorName(r));
    if (out.pos) return fail(err, errlen, s->path, "zstd payload decompresses to more tokens than the header says");
    s->last_ret = r;
  }
}

int shard_read(const char *path, uint32_t **tokens, ShardInfo *info, char *err, size_t errlen) {
  *tokens = NULL;
  ShardInfo in;
  FILE *f = open_checked(path, &in, err, errlen);
  if (!f) return -1;
  if (in.n_tokens > SIZE_MAX / sizeof(uint32_t)) {
    fclose(f);
    return fail(err, errlen, path, "%llu tokens do not fit in memory", (unsigned long long)in.n_tokens);
  }
  uint32_t *tok = xmalloc((size_t)in.n_tokens * sizeof(uint32_t));
  unsigned char *chunk = xmalloc(SHARD_CHUNK_BYTES);
  PayloadSource src = {.f = f, .path = path, .file_left = in.payload_bytes, .last_ret = 1};
  if (in.compression == SHARD_COMPRESS_ZSTD) {
    src.dctx = ZSTD_createDCtx();
    if (!src.dctx) die("shard %s: cannot create a zstd context", path);
    src.in_cap = ZSTD_DStreamInSize();
    src.inbuf = xmalloc(src.in_cap);
  }
  int rc = 0;
  uint64_t total = in.n_tokens * in.token_bytes, done = 0, checksum = 0;
  size_t t = 0;
  while (rc == 0 && done < total) {
    size_t len = total - done < SHARD_CHUNK_BYTES ? (size_t)(total - done) : SHARD_CHUNK_BYTES;
    rc = source_read(&src, chunk, len, err, errlen);
    if (rc) break;
    checksum = hash64(chunk, len, checksum);
    if (in.token_bytes == 2)
      for (size_t i = 0; i < len; i += 2) tok[t++] = (uint32_t)chunk[i] | (uint32_t)chunk[i + 1] << 8;
    else
      for (size_t i = 0; i < len; i += 4) tok[t++] = get_u32(chunk + i);
    done += len;
  }
  if (rc == 0) rc = source_finish(&src, err, errlen);
  if (rc == 0 && checksum != in.checksum)
    rc = fail(err, errlen, path, "token checksum mismatch (stored %016llx, computed %016llx): the payload is corrupt",
              (unsigned long long)in.checksum, (unsigned long long)checksum);
  // Range check last: a corrupt payload is reported as corruption, not as a bad token.
  for (size_t i = 0; rc == 0 && i < in.n_tokens; i++)
    if (tok[i] >= in.vocab_size)
      rc = fail(err, errlen, path, "token id %u at index %zu is >= vocab_size %u", tok[i], i, in.vocab_size);
  ZSTD_freeDCtx(src.dctx);
  free(src.inbuf);
  free(chunk);
  fclose(f);
  if (rc) {
    free(tok);
    return -1;
  }
  *tokens = tok;
  if (info) *info = in;
  return 0;
}
