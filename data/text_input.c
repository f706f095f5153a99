// data/text_input.c: see text_input.h. Decompression (zstd, gzip) and line framing for JSON lines,
// whole-file reads for .txt, and the parquet reader of data/parquet_text.h, loaded with dlopen when
// it was built.
#include "data/text_input.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include "common/common.h"
#include "data/parquet_text.h"

#define READ_STEP (1u << 20)  // compressed bytes read at a time, and the least room a read gets

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

int input_kind(const char *path, InputKind *kind, char *err, size_t errlen) {
  if (ends_with(path, ".jsonl.zst")) *kind = INPUT_JSONL_ZST;
  else if (ends_with(path, ".jsonl.gz") || ends_with(path, ".json.gz")) *kind = INPUT_JSONL_GZ;  // Dolma: .json.gz
  else if (ends_with(path, ".jsonl")) *kind = INPUT_JSONL;
  else if (ends_with(path, ".txt")) *kind = INPUT_TXT;
  else if (ends_with(path, ".parquet")) *kind = INPUT_PARQUET;
  else
    return set_err(err, errlen,
                   "%s: unsupported input (expected .txt, .jsonl, .jsonl.zst, .jsonl.gz, .json.gz or .parquet)", path);
  return 0;
}

// The parquet reader's functions, from build/libparquet_text.so (see parquet_text.h).
typedef struct {
  void *lib;
  ParquetText *(*open)(const char *path, const char *column, char *err, size_t errlen);
  int (*read)(ParquetText *p, TextBlock *b, size_t target, char *err, size_t errlen);
  uint64_t (*position)(const ParquetText *p);
  void (*close)(ParquetText *p);
} ParquetApi;

// Loads the parquet reader (RTLD_NODELETE: opening the next file does not load it again).
static int parquet_load(ParquetApi *api, const char *path, char *err, size_t errlen) {
#ifdef HAVE_PARQUET
  if (!(api->lib = dlopen(PARQUET_TEXT_SO, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)))
    return set_err(err, errlen, "%s: cannot load the parquet reader: %s (rebuild it with make)", path, dlerror());
  *(void **)&api->open = dlsym(api->lib, "parquet_text_open");
  *(void **)&api->read = dlsym(api->lib, "parquet_text_read");
  *(void **)&api->position = dlsym(api->lib, "parquet_text_position");
  *(void **)&api->close = dlsym(api->lib, "parquet_text_close");
  if (!api->open || !api->read || !api->position || !api->close)
    return set_err(err, errlen, "%s: %s lacks a parquet_text_ function (rebuild it with make)", path, PARQUET_TEXT_SO);
  return 0;
#else
  return set_err(err, errlen,
                 "%s: this ./train was built without the parquet reader (Apache Arrow's C++ libraries, which `make` "
                 "unpacks from the pyarrow wheel into .deps/arrow where pip can download it; `make` says why it did "
                 "not in a note: line, see docs/build.md)",
                 path);
#endif
}

struct TextInput {
  char *path;
  InputKind kind;
  FILE *f;
  int eof;              // the decoded stream has ended (.txt: the file was read)
  ZSTD_DCtx *zstd;      // .jsonl.zst: streaming decompressor
  size_t zstd_pending;  // last ZSTD_decompressStream result: 0 iff the last frame is complete
  z_stream *gz;         // .jsonl.gz / .json.gz: zlib's inflate (gzip members, one after another)
  int gz_member_open;   // inside a gzip member (its end not reached yet)
  char *in;             // compressed bytes read from the file
  size_t in_len, in_pos;
  char *carry;  // the start of a line that the previous block cut off
  size_t carry_len, carry_cap;
  ParquetApi parquet;
  ParquetText *pq;
};

TextInput *text_input_open(const char *path, const char *field, char *err, size_t errlen) {
  InputKind kind;
  if (input_kind(path, &kind, err, errlen)) return NULL;
  TextInput *in = xcalloc(1, sizeof *in);
  in->kind = kind;
  in->path = xmalloc(strlen(path) + 1);
  strcpy(in->path, path);
  if (kind == INPUT_PARQUET) {
    if (parquet_load(&in->parquet, path, err, errlen) || !(in->pq = in->parquet.open(path, field, err, errlen))) {
      text_input_close(in);
      return NULL;
    }
    return in;
  }
  if (!(in->f = fopen(path, "rb"))) {
    set_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    text_input_close(in);
    return NULL;
  }
  if (kind == INPUT_JSONL_ZST) {
    in->in = xmalloc(READ_STEP);
    if (!(in->zstd = ZSTD_createDCtx())) die("out of memory creating a zstd context");
  }
  if (kind == INPUT_JSONL_GZ) {
    in->in = xmalloc(READ_STEP);
    in->gz = xcalloc(1, sizeof *in->gz);
    if (inflateInit2(in->gz, 15 + 16) != Z_OK) die("out of memory creating a zlib inflate state");  // gzip only
  }
  return in;
}

void text_input_close(TextInput *in) {
  if (!in) return;
  if (in->f) fclose(in->f);
  if (in->zstd) ZSTD_freeDCtx(in->zstd);
  if (in->gz) inflateEnd(in->gz), free(in->gz);
  if (in->pq) in->parquet.close(in->pq);
  if (in->parquet.lib) dlclose(in->parquet.lib);
  free(in->in), free(in->carry), free(in->path);
  free(in);
}

void text_block_free(TextBlock *b) {
  free(b->bytes), free(b->ends);
  memset(b, 0, sizeof *b);
}

uint64_t text_input_position(const TextInput *in) {
  if (in->pq) return in->parquet.position(in->pq);
  long pos = in->f ? ftell(in->f) : 0;
  return pos > 0 ? (uint64_t)pos : 0;
}

// Compressed bytes for a decompressor: 1 when in->in has unread bytes, 0 at the end of the file, -1 on
// a read error or when the file ends inside a frame (open: the decompressor is inside one).
static int fill_in(TextInput *in, int open, const char *codec, char *err, size_t errlen) {
  if (in->in_pos < in->in_len) return 1;
  in->in_len = fread(in->in, 1, READ_STEP, in->f), in->in_pos = 0;
  if (in->in_len) return 1;
  if (ferror(in->f)) return set_err(err, errlen, "%s: read error: %s", in->path, strerror(errno));
  if (open) return set_err(err, errlen, "%s: truncated %s stream", in->path, codec);
  return 0;
}

// gzip: inflate into dst until some output appears or the file ends; a file may hold several gzip
// members one after another (as concatenated .gz files do), each started afresh.
static long gz_decode(TextInput *in, char *dst, size_t room, char *err, size_t errlen) {
  for (;;) {
    int more = fill_in(in, in->gz_member_open, "gzip", err, errlen);
    if (more <= 0) return more;
    if (!in->gz_member_open) {
      if (inflateReset(in->gz) != Z_OK) die("zlib inflateReset failed");
      in->gz_member_open = 1;
    }
    uInt out_room = room > (1u << 30) ? (1u << 30) : (uInt)room;
    in->gz->next_in = (Bytef *)in->in + in->in_pos, in->gz->avail_in = (uInt)(in->in_len - in->in_pos);
    in->gz->next_out = (Bytef *)dst, in->gz->avail_out = out_room;
    int r = inflate(in->gz, Z_NO_FLUSH);
    if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR)
      return set_err(err, errlen, "%s: corrupt gzip data near compressed byte %ld: %s", in->path,
                     ftell(in->f) - (long)in->gz->avail_in, in->gz->msg ? in->gz->msg : "inflate failed");
    in->in_pos = in->in_len - in->gz->avail_in;
    if (r == Z_STREAM_END) in->gz_member_open = 0;
    size_t got = out_room - in->gz->avail_out;
    if (got) return (long)got;
  }
}

// zstd: decompress into dst until some output appears or the file ends.
static long zstd_decode(TextInput *in, char *dst, size_t room, char *err, size_t errlen) {
  for (;;) {
    int more = fill_in(in, in->zstd_pending != 0, "zstd", err, errlen);
    if (more <= 0) return more;
    ZSTD_inBuffer src = {in->in, in->in_len, in->in_pos};
    ZSTD_outBuffer out = {dst, room, 0};
    size_t r = ZSTD_decompressStream(in->zstd, &out, &src);
    if (ZSTD_isError(r))
      return set_err(err, errlen, "%s: corrupt zstd data near compressed byte %ld: %s", in->path,
                     ftell(in->f) - (long)(in->in_len - src.pos), ZSTD_getErrorName(r));
    in->in_pos = src.pos, in->zstd_pending = r;
    if (out.pos) return (long)out.pos;
  }
}

// Decoded bytes into dst (room > 0): the count, 0 at the end of the input, or -1.
static long decode(TextInput *in, char *dst, size_t room, char *err, size_t errlen) {
  if (in->kind == INPUT_JSONL_ZST) return zstd_decode(in, dst, room, err, errlen);
  if (in->kind == INPUT_JSONL_GZ) return gz_decode(in, dst, room, err, errlen);
  size_t got = fread(dst, 1, room, in->f);
  if (!got && ferror(in->f)) return set_err(err, errlen, "%s: read error: %s", in->path, strerror(errno));
  return (long)got;
}

static void reserve(TextBlock *b, size_t need) {
  if (b->cap >= need) return;
  size_t cap = 2 * b->cap > need ? 2 * b->cap : need;
  char *bigger = realloc(b->bytes, cap);
  if (!bigger) die("out of memory for a %zu-byte text block", cap);
  b->bytes = bigger, b->cap = cap;
}

// JSON lines: the line cut off by the previous block, then decoded bytes until at least target bytes
// and a '\n' are there; what follows the last '\n' waits for the next block.
static int read_lines(TextInput *in, TextBlock *b, size_t target, char *err, size_t errlen) {
  reserve(b, in->carry_len + target + READ_STEP);
  if (in->carry_len) memcpy(b->bytes, in->carry, in->carry_len);
  b->len = in->carry_len, in->carry_len = 0;
  const char *last_nl = NULL;
  while (!in->eof && (b->len < target || !last_nl)) {
    if (b->cap - b->len < READ_STEP) {  // a line longer than the block so far
      size_t at = last_nl ? (size_t)(last_nl - b->bytes) : 0;
      reserve(b, b->len + READ_STEP);
      if (last_nl) last_nl = b->bytes + at;
    }
    size_t room = b->len + READ_STEP < target ? target - b->len : READ_STEP;  // short of target, or a line's end
    long got = decode(in, b->bytes + b->len, room, err, errlen);
    if (got < 0) return -1;
    if (got == 0) in->eof = 1;
    const char *nl = got > 0 ? memrchr(b->bytes + b->len, '\n', (size_t)got) : NULL;
    if (nl) last_nl = nl;
    b->len += (size_t)got;
  }
  if (!in->eof) {  // keep the unfinished line for the next block
    size_t keep = b->len - (size_t)(last_nl + 1 - b->bytes);
    if (in->carry_cap < keep) {
      free(in->carry);
      in->carry_cap = 2 * keep;
      in->carry = xmalloc(in->carry_cap);
    }
    memcpy(in->carry, last_nl + 1, keep);
    in->carry_len = keep, b->len -= keep;
  }
  return b->len > 0;
}

// .txt: the whole file.
static int read_whole(TextInput *in, TextBlock *b, char *err, size_t errlen) {
  if (in->eof) return 0;
  in->eof = 1;
  struct stat st;
  if (fstat(fileno(in->f), &st) != 0) return set_err(err, errlen, "%s: cannot stat: %s", in->path, strerror(errno));
  reserve(b, (size_t)st.st_size + 1);
  b->len = 0;
  for (size_t got; (got = fread(b->bytes + b->len, 1, b->cap - b->len, in->f)) > 0;) {
    b->len += got;
    if (b->len == b->cap) reserve(b, 2 * b->cap);  // the file grew
  }
  if (ferror(in->f)) return set_err(err, errlen, "%s: read error: %s", in->path, strerror(errno));
  return 1;  // an empty file is one empty document
}

int text_input_read(TextInput *in, TextBlock *b, size_t target, char *err, size_t errlen) {
  b->len = 0, b->n_rows = 0;
  switch (in->kind) {
    case INPUT_TXT:
      b->form = BLOCK_DOCUMENT;
      return read_whole(in, b, err, errlen);
    case INPUT_PARQUET:
      b->form = BLOCK_ROWS;
      return in->parquet.read(in->pq, b, target, err, errlen);
    default:
      b->form = BLOCK_JSON_LINES;
      return read_lines(in, b, target, err, errlen);
  }
}
