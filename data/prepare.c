// data/prepare.c: see prepare.h. Three parts: reading documents from the inputs (Source), writing
// the train/val token streams into fixed-size shards (Split), and the batch loop that tokenizes
// documents in parallel and writes them in input order.
#include "data/prepare.h"

#include <errno.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include "common/common.h"
#include "data/json.h"
#include "data/shard.h"
#include "data/tokenizer.h"

#define BATCH_BYTES (32u << 20)  // tokenize this much text per parallel batch
#define BATCH_DOCS 4096
#define READ_CHUNK (1u << 20)

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

// ---------------------------------------------------------------------------------------------
// Source: the documents of one input file, in order.

typedef enum { INPUT_TXT, INPUT_JSONL, INPUT_JSONL_ZST, INPUT_JSONL_GZ } InputKind;

typedef struct {
  const char *path;
  InputKind kind;
  FILE *f;
  int done;             // no more documents
  long lineno;          // line of the last line read (.jsonl)
  ZSTD_DCtx *zstd;      // .jsonl.zst: streaming decompressor
  size_t zstd_pending;  // last ZSTD_decompressStream result: 0 iff the last frame is complete
  z_stream *gz;         // .jsonl.gz / .json.gz: zlib's inflate (gzip members, one after another)
  int gz_member_open;   // inside a gzip member (its end not reached yet)
  char *in;             // compressed bytes read from the file
  size_t in_len, in_pos;
  char *buf;  // decoded bytes not yet split into lines
  size_t buf_len, buf_pos;
  char *line;  // the current line
  size_t line_len, line_cap;
} Source;

static int input_kind(const char *path, InputKind *kind, char *err, size_t errlen) {
  if (ends_with(path, ".jsonl.zst")) *kind = INPUT_JSONL_ZST;
  else if (ends_with(path, ".jsonl.gz") || ends_with(path, ".json.gz")) *kind = INPUT_JSONL_GZ;  // Dolma: .json.gz
  else if (ends_with(path, ".jsonl")) *kind = INPUT_JSONL;
  else if (ends_with(path, ".txt")) *kind = INPUT_TXT;
  else
    return set_err(err, errlen, "%s: unsupported input (expected .txt, .jsonl, .jsonl.zst, .jsonl.gz or .json.gz)",
                   path);
  return 0;
}

static int source_open(Source *s, const char *path, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  s->path = path;
  if (input_kind(path, &s->kind, err, errlen)) return -1;
  if (!(s->f = fopen(path, "rb"))) return set_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
  s->buf = xmalloc(READ_CHUNK);
  if (s->kind == INPUT_JSONL_ZST) {
    s->in = xmalloc(READ_CHUNK);
    if (!(s->zstd = ZSTD_createDCtx())) die("out of memory creating a zstd context");
  }
  if (s->kind == INPUT_JSONL_GZ) {
    s->in = xmalloc(READ_CHUNK);
    s->gz = xcalloc(1, sizeof *s->gz);
    if (inflateInit2(s->gz, 15 + 16) != Z_OK) die("out of memory creating a zlib inflate state");  // gzip only
  }
  return 0;
}

static void source_close(Source *s) {
  if (s->f) fclose(s->f);
  if (s->zstd) ZSTD_freeDCtx(s->zstd);
  if (s->gz) inflateEnd(s->gz), free(s->gz);
  free(s->in), free(s->buf), free(s->line);
  memset(s, 0, sizeof *s);
}

// Compressed bytes for a decompressor: 1 when s->in has unread bytes, 0 at the end of the file, -1 on a
// read error or when the file ends inside a frame (open: the decompressor is inside one).
static int fill_in(Source *s, int open, const char *codec, char *err, size_t errlen) {
  if (s->in_pos < s->in_len) return 1;
  s->in_len = fread(s->in, 1, READ_CHUNK, s->f), s->in_pos = 0;
  if (s->in_len) return 1;
  if (ferror(s->f)) return set_err(err, errlen, "%s: read error: %s", s->path, strerror(errno));
  if (open) return set_err(err, errlen, "%s: truncated %s stream", s->path, codec);
  return 0;
}

// gzip: inflate until some output appears or the file ends; a file may hold several gzip members
// one after another (as concatenated .gz files do), each started afresh.
static long gz_refill(Source *s, char *err, size_t errlen) {
  for (;;) {
    int more = fill_in(s, s->gz_member_open, "gzip", err, errlen);
    if (more <= 0) return more;
    if (!s->gz_member_open) {
      if (inflateReset(s->gz) != Z_OK) die("zlib inflateReset failed");
      s->gz_member_open = 1;
    }
    s->gz->next_in = (Bytef *)s->in + s->in_pos, s->gz->avail_in = (uInt)(s->in_len - s->in_pos);
    s->gz->next_out = (Bytef *)s->buf, s->gz->avail_out = READ_CHUNK;
    int r = inflate(s->gz, Z_NO_FLUSH);
    if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR)
      return set_err(err, errlen, "%s: corrupt gzip data near compressed byte %ld: %s", s->path,
                     ftell(s->f) - (long)s->gz->avail_in, s->gz->msg ? s->gz->msg : "inflate failed");
    s->in_pos = s->in_len - s->gz->avail_in;
    if (r == Z_STREAM_END) s->gz_member_open = 0;
    size_t got = READ_CHUNK - s->gz->avail_out;
    if (got) return (long)(s->buf_len = got);
  }
}

// Refills s->buf with decoded bytes. Returns the count (0 at the end of the input) or -1.
static long source_refill(Source *s, char *err, size_t errlen) {
  s->buf_pos = s->buf_len = 0;
  if (s->kind == INPUT_JSONL) {
    size_t got = fread(s->buf, 1, READ_CHUNK, s->f);
    if (!got && ferror(s->f)) return set_err(err, errlen, "%s: read error: %s", s->path, strerror(errno));
    return (long)(s->buf_len = got);
  }
  if (s->kind == INPUT_JSONL_GZ) return gz_refill(s, err, errlen);
  for (;;) {  // zstd: decompress until some output appears or the file ends
    int more = fill_in(s, s->zstd_pending != 0, "zstd", err, errlen);
    if (more <= 0) return more;
    ZSTD_inBuffer in = {s->in, s->in_len, s->in_pos};
    ZSTD_outBuffer out = {s->buf, READ_CHUNK, 0};
    size_t r = ZSTD_decompressStream(s->zstd, &out, &in);
    if (ZSTD_isError(r))
      return set_err(err, errlen, "%s: corrupt zstd data near compressed byte %ld: %s", s->path,
                     ftell(s->f) - (long)(s->in_len - in.pos), ZSTD_getErrorName(r));
    s->in_pos = in.pos, s->zstd_pending = r;
    if (out.pos) return (long)(s->buf_len = out.pos);
  }
}

// Reads the next line (without its '\n') into s->line. Returns 1, 0 at the end, or -1.
static int source_line(Source *s, char *err, size_t errlen) {
  s->line_len = 0;
  int any = 0;
  for (;;) {
    if (s->buf_pos == s->buf_len) {
      long got = source_refill(s, err, errlen);
      if (got < 0) return -1;
      if (got == 0) break;
    }
    const char *start = s->buf + s->buf_pos;
    size_t avail = s->buf_len - s->buf_pos;
    const char *nl = memchr(start, '\n', avail);
    size_t take = nl ? (size_t)(nl - start) : avail;
    if (s->line_len + take + 1 > s->line_cap) {
      s->line_cap = 2 * (s->line_len + take + 1);
      char *bigger = xmalloc(s->line_cap);
      if (s->line_len) memcpy(bigger, s->line, s->line_len);
      free(s->line);
      s->line = bigger;
    }
    memcpy(s->line + s->line_len, start, take);
    s->line_len += take;
    s->buf_pos += take + (nl != NULL);
    any = 1;
    if (nl) break;
  }
  if (!any) return 0;
  s->lineno++;
  if (s->line_len && s->line[s->line_len - 1] == '\r') s->line_len--;  // CRLF files
  return 1;
}

// Next document of the input as a malloc'd text. Returns 1, 0 when the input is exhausted, or -1.
static int source_next(Source *s, char **text, size_t *len, char *err, size_t errlen) {
  if (s->done) return 0;
  if (s->kind == INPUT_TXT) {
    s->done = 1;
    *text = read_file(s->path, len);
    return 1;
  }
  for (;;) {
    int rc = source_line(s, err, errlen);
    if (rc <= 0) {
      s->done = 1;
      return rc;
    }
    size_t k = 0;
    while (k < s->line_len && strchr(" \t\r", s->line[k])) k++;
    if (k == s->line_len) continue;  // blank line
    char jerr[200];
    rc = json_get_string(s->line, s->line_len, "text", text, len, jerr, sizeof jerr);
    if (rc < 0) return set_err(err, errlen, "%s:%ld: bad JSON: %s", s->path, s->lineno, jerr);
    if (rc == 0) return set_err(err, errlen, "%s:%ld: object has no \"text\" member", s->path, s->lineno);
    return 1;
  }
}

// ---------------------------------------------------------------------------------------------
// Split: one output token stream (train or val), cut into shards of exactly shard_tokens tokens.

typedef struct {
  const PrepareOptions *opt;
  const char *name;  // "train" or "val"
  uint32_t vocab_size;
  ShardWriter *w;
  int shards;         // shards opened so far
  uint64_t in_shard;  // tokens in the open shard
  uint64_t tokens, docs;
} Split;

static void split_write(Split *s, const uint32_t *tokens, size_t n) {
  while (n) {
    if (!s->w) {
      char path[4096];
      if (s->opt->part_tag)
        snprintf(path, sizeof path, "%s_%s_%s_%06d.bin", s->opt->output_prefix, s->name, s->opt->part_tag, s->shards++);
      else snprintf(path, sizeof path, "%s_%s_%06d.bin", s->opt->output_prefix, s->name, s->shards++);
      s->w = shard_writer_open(path, s->vocab_size, s->opt->zstd_level);
      s->in_shard = 0;
    }
    uint64_t room = s->opt->shard_tokens - s->in_shard;
    size_t k = n < room ? n : (size_t)room;
    shard_writer_append(s->w, tokens, k);
    tokens += k, n -= k, s->in_shard += k, s->tokens += k;
    if (s->in_shard == s->opt->shard_tokens) {
      shard_writer_close(s->w);
      s->w = NULL;
    }
  }
}

static void split_finish(Split *s) {
  if (s->w) shard_writer_close(s->w);
  s->w = NULL;
}

// ---------------------------------------------------------------------------------------------
// The batch pipeline. Three batches are in flight: while batch k is tokenized (one OpenMP task per
// document), one task reads batch k+1 and another writes batch k-1. Reading and writing are each a
// single task, so documents keep their input order and the output does not depend on the thread
// count; the pipeline only hides the serial decompress/parse/compress time behind tokenization.

typedef struct {
  char *text;
  size_t len;
  int val;  // goes to the validation split
  uint32_t *ids;
  size_t n_ids;
} Doc;

typedef struct {
  Doc docs[BATCH_DOCS];
  size_t n, bytes;
} Batch;

typedef struct {
  const PrepareOptions *opt;
  const Tokenizer *tok;
  Split split[2];  // train, val
  Source src;      // the input being read
  int next_input;  // index of the next input to open
  uint64_t doc_index, empty_docs, input_bytes;
  double t0, last_report;
  double report_s;                  // seconds between progress lines (TOKENIZE_REPORT_S, default 2)
  uint64_t file_bytes, done_bytes;  // the inputs' sizes on disk, and those of the inputs read to the end
  uint64_t read_bytes;              // file bytes read so far (written by the reader, read by the writer)
} Prep;

// Fills b with the next documents (empty when the inputs are exhausted). Returns 0 or -1.
static int read_batch(Prep *p, Batch *b, char *err, size_t errlen) {
  const PrepareOptions *o = p->opt;
  b->n = b->bytes = 0;
  while (b->n < BATCH_DOCS && b->bytes < BATCH_BYTES) {
    if (!p->src.f) {
      if (p->next_input == o->n_inputs) break;
      if (source_open(&p->src, o->inputs[p->next_input++], err, errlen)) return -1;
    }
    char *text;
    size_t len;
    int got = source_next(&p->src, &text, &len, err, errlen);
    if (got < 0) return -1;
    if (got == 0) {
      struct stat st;
      if (!stat(p->src.path, &st)) p->done_bytes += (uint64_t)st.st_size;
      source_close(&p->src);
      __atomic_store_n(&p->read_bytes, p->done_bytes, __ATOMIC_RELAXED);
      continue;
    }
    if (len == 0) {  // nothing to learn from BOS EOS
      p->empty_docs++;
      free(text);
      continue;
    }
    int val = o->val_fraction > 0 ? (hash64(text, len, PREPARE_VAL_HASH_SEED) >> 11) * 0x1p-53 < o->val_fraction
                                  : p->doc_index < o->val_docs;
    p->doc_index++;
    b->docs[b->n++] = (Doc){.text = text, .len = len, .val = val};
    b->bytes += len;
  }
  long pos = p->src.f ? ftell(p->src.f) : 0;
  __atomic_store_n(&p->read_bytes, p->done_bytes + (uint64_t)(pos > 0 ? pos : 0), __ATOMIC_RELAXED);
  return 0;
}

// "eta 1h02m" from the share of the inputs' bytes read so far.
static void eta_text(const Prep *p, double elapsed, char *buf, size_t len) {
  uint64_t done = __atomic_load_n(&p->read_bytes, __ATOMIC_RELAXED);
  if (!p->file_bytes || !done || done >= p->file_bytes) {
    snprintf(buf, len, "%.0f%% of the input", done >= p->file_bytes ? 100.0 : 0.0);
    return;
  }
  double left = elapsed * (double)(p->file_bytes - done) / (double)done;
  long s = (long)(left + 0.5);
  const int gb = p->file_bytes >= 1000000000ull;
  snprintf(buf, len, "%.1f%% of %.1f %s of input, eta %ldh%02ldm%02lds", 100.0 * done / p->file_bytes,
           p->file_bytes / (gb ? 1e9 : 1e6), gb ? "GB" : "MB", s / 3600, s / 60 % 60, s % 60);
}

static void write_batch(Prep *p, Batch *b) {
  uint32_t bos = tokenizer_bos(p->tok), eos = tokenizer_eos(p->tok);
  for (size_t i = 0; i < b->n; i++) {
    Doc *d = &b->docs[i];
    Split *s = &p->split[d->val];
    split_write(s, &bos, 1);
    split_write(s, d->ids, d->n_ids);
    split_write(s, &eos, 1);
    s->docs++;
    p->input_bytes += d->len;
    free(d->text), free(d->ids);
  }
  b->n = b->bytes = 0;

  double now = now_seconds();
  if (!p->opt->quiet && now - p->last_report >= p->report_s) {
    p->last_report = now;
    uint64_t tokens = p->split[0].tokens + p->split[1].tokens;
    char eta[96];
    eta_text(p, now - p->t0, eta, sizeof eta);
    fprintf(stderr, "tokenize: %llu docs, %.2fM tokens, %.1f MB, %.2f MB/s, %.0f tokens/s, %s\n",
            (unsigned long long)(p->split[0].docs + p->split[1].docs), tokens / 1e6, p->input_bytes / 1e6,
            p->input_bytes / 1e6 / (now - p->t0), tokens / (now - p->t0), eta);
  }
}

static void free_batch(Batch *b) {  // after an error: documents read but never written
  for (size_t i = 0; i < b->n; i++) free(b->docs[i].text), free(b->docs[i].ids);
  b->n = 0;
}

// Runs the pipeline until the inputs are exhausted. Returns 0 or -1 (a read error).
static int run_pipeline(Prep *p, int threads, char *err, size_t errlen) {
  Batch *batch = xcalloc(3, sizeof(Batch));
  int rc = read_batch(p, &batch[0], err, errlen);
  for (int k = 0; rc == 0; k++) {
    Batch *cur = &batch[k % 3], *next = &batch[(k + 1) % 3], *prev = &batch[(k + 2) % 3];
    if (cur->n == 0 && prev->n == 0) break;  // everything read has been written
    const Tokenizer *tok = p->tok;
#pragma omp parallel num_threads(threads)
#pragma omp single
    {
#pragma omp task
      write_batch(p, prev);
#pragma omp task
      rc = read_batch(p, next, err, errlen);
      for (size_t i = 0; i < cur->n; i++) {
        Doc *d = &cur->docs[i];
#pragma omp task
        d->n_ids = tokenizer_encode(tok, d->text, d->len, &d->ids);
      }
    }  // the region's end waits for all three kinds of task
  }
  for (int k = 0; k < 3; k++) free_batch(&batch[k]);
  free(batch);
  return rc;
}

static int check_options(const PrepareOptions *o, char *err, size_t errlen) {
  if (!o->tokenizer_path) return set_err(err, errlen, "no tokenizer given");
  if (!o->output_prefix) return set_err(err, errlen, "no output prefix given");
  const char *slash = strrchr(o->output_prefix, '/');
  if (slash && slash != o->output_prefix) {  // create the output directory, like the checkpoint writer does
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - o->output_prefix), o->output_prefix);
    if (make_dirs(dir, err, errlen)) return -1;
  }
  if (o->n_inputs <= 0) return set_err(err, errlen, "no inputs given");
  if (o->shard_tokens == 0) return set_err(err, errlen, "shard_tokens must be positive");
  if (!(o->val_fraction >= 0 && o->val_fraction <= 1))
    return set_err(err, errlen, "val_fraction %g is not in [0, 1]", o->val_fraction);
  if (o->val_fraction > 0 && o->val_docs > 0) return set_err(err, errlen, "give val_docs or val_fraction, not both");
  if (o->zstd_level < 0 || o->zstd_level > ZSTD_maxCLevel())
    return set_err(err, errlen, "zstd level %d is not in 0..%d", o->zstd_level, ZSTD_maxCLevel());
  // Check every input before writing anything, so a typo in the last one costs nothing.
  for (int i = 0; i < o->n_inputs; i++) {
    InputKind kind;
    if (input_kind(o->inputs[i], &kind, err, errlen)) return -1;
    FILE *f = fopen(o->inputs[i], "rb");
    if (!f) return set_err(err, errlen, "cannot open '%s': %s", o->inputs[i], strerror(errno));
    fclose(f);
  }
  return 0;
}

int prepare_run(const PrepareOptions *opt, PrepareStats *stats, char *err, size_t errlen) {
  memset(stats, 0, sizeof *stats);
  if (check_options(opt, err, errlen)) return -1;
  Prep p = {.opt = opt, .t0 = now_seconds()};
  p.last_report = p.t0;
  const char *rs = getenv("TOKENIZE_REPORT_S");  // a test hook: 0 reports after every batch
  p.report_s = rs && *rs ? atof(rs) : 2.0;
  for (int i = 0; i < opt->n_inputs; i++) {
    struct stat st;
    if (!stat(opt->inputs[i], &st)) p.file_bytes += (uint64_t)st.st_size;
  }
  Tokenizer *tok = tokenizer_load(opt->tokenizer_path, opt->pattern_path, err, errlen);
  if (!tok) return -1;
  p.tok = tok;
  for (int k = 0; k < 2; k++)
    p.split[k] = (Split){.opt = opt, .name = k ? "val" : "train", .vocab_size = (uint32_t)tokenizer_vocab_size(tok)};
  stats->threads = opt->threads > 0 ? opt->threads : omp_get_max_threads();

  int rc = run_pipeline(&p, stats->threads, err, errlen);
  source_close(&p.src);
  if (rc == 0 && p.doc_index == 0) rc = set_err(err, errlen, "no non-empty documents in the inputs");
  for (int k = 0; k < 2; k++) {
    split_finish(&p.split[k]);
    stats->docs[k] = p.split[k].docs, stats->tokens[k] = p.split[k].tokens, stats->shards[k] = p.split[k].shards;
  }
  stats->empty_docs = p.empty_docs;
  stats->input_bytes = p.input_bytes;
  stats->seconds = now_seconds() - p.t0;
  tokenizer_free(tok);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// The command line.

static void usage(FILE *f) {
  fprintf(f,
          "usage: train tokenize --tokenizer PATH [--pattern PATH] --text STRING\n"
          "       train tokenize --tokenizer PATH [--pattern PATH] --input F [--input F ...] --output PREFIX\n"
          "                      [--shard-tokens N] [--val-docs N | --val-fraction F] [--zstd L]\n"
          "                      [--threads N] [--quiet]\n"
          "\n"
          "  --text STRING     print the token ids of STRING (no BOS/EOS) on one line\n"
          "  --input F         .txt (whole file = one document), .jsonl, .jsonl.zst, .jsonl.gz or .json.gz\n"
          "                    (\"text\" of each line; a .gz may hold several gzip members)\n"
          "  --output PREFIX   writes PREFIX_train_000000.bin, ... and PREFIX_val_000000.bin, ...\n"
          "  --part I/N        the I-th (from 0) of N contiguous groups of the --input files, for one of N\n"
          "                    processes or nodes: writes PREFIX_train_pIII_000000.bin, ...; the parts' shards\n"
          "                    in name order hold one process's tokens (with --val-fraction, not --val-docs)\n"
          "  --shard-tokens N  tokens per shard, suffixes K/M/G allowed (default 100M); documents\n"
          "                    may straddle shards, each framed as BOS tokens... EOS\n"
          "  --val-docs N      the first N non-empty documents go to validation (default 0)\n"
          "  --val-fraction F  or: documents whose content hash falls below F go to validation\n"
          "  --zstd L          zstd level of the shards, 0 = raw (default 3)\n"
          "  --threads N       tokenizer threads (default: OpenMP's default)\n"
          "  --pattern PATH    pretokenizer regex (default: the built-in Llama-3 pattern)\n"
          "  --quiet           no progress lines and no summary\n");
}

// Parses a non-negative integer with an optional K/M/G (x1000) suffix; -1 if malformed.
static int parse_count(const char *s, uint64_t *v) {
  char *end;
  errno = 0;
  if (!*s || *s == '-') return -1;
  unsigned long long x = strtoull(s, &end, 10);
  if (errno || end == s) return -1;
  uint64_t mult = *end == 'K' ? 1000ull : *end == 'M' ? 1000000ull : *end == 'G' ? 1000000000ull : 1;
  if (mult > 1) end++;
  if (*end || x > UINT64_MAX / mult) return -1;
  *v = x * mult;
  return 0;
}

static int parse_int(const char *s, int lo, int hi, int *v) {
  uint64_t x;
  if (parse_count(s, &x) || x < (uint64_t)lo || x > (uint64_t)hi) return -1;
  *v = (int)x;
  return 0;
}

static int parse_fraction(const char *s, double *v) {
  char *end;
  double x = strtod(s, &end);
  if (end == s || *end || !(x >= 0 && x <= 1)) return -1;
  *v = x;
  return 0;
}

static int print_ids(const char *tokenizer_path, const char *pattern_path, const char *text) {
  char err[512];
  Tokenizer *tok = tokenizer_load(tokenizer_path, pattern_path, err, sizeof err);
  if (!tok) {
    fprintf(stderr, "tokenize: %s\n", err);
    return 1;
  }
  uint32_t *ids;
  size_t n = tokenizer_encode(tok, text, strlen(text), &ids);
  for (size_t i = 0; i < n; i++) printf(i ? " %u" : "%u", ids[i]);
  printf("\n");
  free(ids);
  tokenizer_free(tok);
  return 0;
}

int tokenize_main(int argc, char **argv) {
  PrepareOptions opt = {.shard_tokens = 100000000, .zstd_level = 3};
  const char **inputs = xcalloc((size_t)argc, sizeof(char *));
  const char *text = NULL;
  int n_inputs = 0, rc = 1, have_val_docs = 0, part = -1, nparts = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      rc = 0;
      goto done;
    }
    if (!strcmp(a, "--quiet")) {
      opt.quiet = 1;
      continue;
    }
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "tokenize: unexpected argument '%s' (see --help)\n", a);
      goto done;
    }
    if (!v) {
      fprintf(stderr, "tokenize: %s needs a value (see --help)\n", a);
      goto done;
    }
    i++;
    int ok = 1;
    if (!strcmp(a, "--tokenizer")) opt.tokenizer_path = v;
    else if (!strcmp(a, "--pattern")) opt.pattern_path = v;
    else if (!strcmp(a, "--text")) text = v;
    else if (!strcmp(a, "--input")) inputs[n_inputs++] = v;
    else if (!strcmp(a, "--output")) opt.output_prefix = v;
    else if (!strcmp(a, "--shard-tokens")) ok = !parse_count(v, &opt.shard_tokens) && opt.shard_tokens > 0;
    else if (!strcmp(a, "--val-docs")) ok = !parse_count(v, &opt.val_docs), have_val_docs = 1;
    else if (!strcmp(a, "--val-fraction")) ok = !parse_fraction(v, &opt.val_fraction);
    else if (!strcmp(a, "--zstd")) ok = !parse_int(v, 0, ZSTD_maxCLevel(), &opt.zstd_level);
    else if (!strcmp(a, "--threads")) ok = !parse_int(v, 1, 4096, &opt.threads);
    else if (!strcmp(a, "--part")) {
      int used = 0;
      ok = sscanf(v, "%d/%d%n", &part, &nparts, &used) == 2 && !v[used] && nparts >= 1 && part >= 0 && part < nparts;
    } else {
      fprintf(stderr, "tokenize: unknown flag '%s' (see --help)\n", a);
      goto done;
    }
    if (!ok) {
      fprintf(stderr, "tokenize: bad value '%s' for %s (see --help)\n", v, a);
      goto done;
    }
  }
  if (!opt.tokenizer_path) {
    fprintf(stderr, "tokenize: --tokenizer PATH is required (see --help)\n");
    goto done;
  }
  if (text) {
    if (n_inputs || opt.output_prefix) fprintf(stderr, "tokenize: --text cannot be combined with --input/--output\n");
    else rc = print_ids(opt.tokenizer_path, opt.pattern_path, text);
    goto done;
  }
  if (!n_inputs || !opt.output_prefix) {
    fprintf(stderr, "tokenize: give --text STRING, or --input F ... and --output PREFIX (see --help)\n");
    goto done;
  }
  if (have_val_docs && opt.val_fraction > 0) {
    fprintf(stderr, "tokenize: --val-docs and --val-fraction are exclusive\n");
    goto done;
  }
  // --part i/n: this process takes the i-th of n contiguous groups of the inputs (in the order given)
  // and tags its shards, so the parts' shards, read in name order, hold one process's token stream.
  char tag[16];
  if (nparts) {
    if (have_val_docs) {
      fprintf(stderr,
              "tokenize: --part splits by input file: --val-docs counts documents from the corpus's start, "
              "which only one part sees; use --val-fraction (a split by each document's content)\n");
      goto done;
    }
    if (n_inputs < nparts) {
      fprintf(stderr, "tokenize: --part %d/%d: only %d input file(s) to split into %d parts\n", part, nparts, n_inputs,
              nparts);
      goto done;
    }
    int first = (int)((int64_t)part * n_inputs / nparts), last = (int)((int64_t)(part + 1) * n_inputs / nparts);
    memmove(inputs, inputs + first, (size_t)(last - first) * sizeof *inputs);
    n_inputs = last - first;
    snprintf(tag, sizeof tag, "p%03d", part);
    opt.part_tag = tag;
  }
  opt.inputs = inputs, opt.n_inputs = n_inputs;

  PrepareStats st;
  char err[1024];
  if (prepare_run(&opt, &st, err, sizeof err)) {
    fprintf(stderr, "tokenize: %s\n", err);
    goto done;
  }
  uint64_t tokens = st.tokens[0] + st.tokens[1];
  if (!opt.quiet) {
    printf(
        "tokenize: train %llu docs, %llu tokens, %d shards; val %llu docs, %llu tokens, %d shards; "
        "%llu empty docs skipped\n",
        (unsigned long long)st.docs[0], (unsigned long long)st.tokens[0], st.shards[0], (unsigned long long)st.docs[1],
        (unsigned long long)st.tokens[1], st.shards[1], (unsigned long long)st.empty_docs);
    printf("tokenize: %.1f MB of text in %.2f s: %.2f MB/s, %.0f tokens/s, %d threads\n", st.input_bytes / 1e6,
           st.seconds, st.input_bytes / 1e6 / st.seconds, tokens / st.seconds, st.threads);
  }
  rc = 0;
done:
  free(inputs);
  return rc;
}
