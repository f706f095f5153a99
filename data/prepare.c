// data/prepare.c: see prepare.h. Four parts: the output (Split: the train and val token streams cut
// into shards, each shard written by a task of its own), the work on one block of input (Chunk:
// parse, cut into pieces, encode, write in order), the pipeline that runs that work on every thread,
// and the command line.
#include "data/prepare.h"

#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zstd.h>

#include "common/common.h"
#include "data/json.h"
#include "data/shard.h"
#include "data/text_input.h"
#include "data/tokenizer.h"

#define CHUNK_BYTES (1u << 20)         // input the reader frames at a time
#define PIECE_BYTES (64u << 10)        // text one encode task takes: whole documents, longer ones cut
#define SLOTS_PER_THREAD 4             // chunks in flight per thread
#define SHRINK_BYTES (16u << 20)       // a chunk's buffer grown past this (a huge line) is freed after use
#define MIN_BACKLOG_TOKENS (4u << 20)  // tokens waiting for their shard's writer, at the least

// ---------------------------------------------------------------------------------------------
// Split: one output token stream (train or val), cut into shards of exactly shard_tokens tokens.
// The ordered writer only appends tokens to the open shard's pending buffer; every so often they
// move, as a Segment, to the shard's ShardOut, whose task feeds them to shard.c's writer (packing,
// checksum, zstd, fwrite). One task per shard at a time keeps each shard's bytes those of one
// sequential writer; several shards' tasks run at once when compression is slower than tokenizing.

typedef struct Segment {
  struct Segment *next;
  size_t n;
  uint32_t tokens[];
} Segment;

typedef struct ShardOut {
  struct ShardOut *next;  // in the pipeline's list, in the order the shards were started
  char *path;
  uint32_t vocab_size;
  int zstd_level;
  ShardWriter *w;         // opened by its first task
  Segment *head, **tail;  // tokens not written yet
  int closed;             // every token of the shard has been queued
  int running;            // a task is writing it
  int listed;             // in the pipeline's list
} ShardOut;

typedef struct {
  const PrepareOptions *opt;
  const char *name;  // "train" or "val"
  uint32_t vocab_size;
  ShardOut *open;  // the shard being filled (NULL between shards)
  uint32_t *pend;  // its tokens not yet handed over
  size_t pend_n, pend_cap;
  int shards;         // shards started so far
  uint64_t in_shard;  // tokens in the open shard
  uint64_t tokens, docs;
} Split;

// A Segment or a closed shard the writer hands over, applied under the pipeline's lock.
typedef struct Handoff {
  struct Handoff *next;
  ShardOut *shard;
  Segment *seg;  // may be NULL
  int close;
} Handoff;

static void handoff(Split *s, int close, Handoff ***tail) {
  if (!s->open) return;
  Handoff *h = xcalloc(1, sizeof *h);
  h->shard = s->open, h->close = close;
  if (s->pend_n) {
    h->seg = xmalloc(sizeof(Segment) + s->pend_n * sizeof(uint32_t));
    h->seg->next = NULL, h->seg->n = s->pend_n;
    memcpy(h->seg->tokens, s->pend, s->pend_n * sizeof(uint32_t));
    s->pend_n = 0;
  }
  **tail = h, *tail = &h->next;
  if (close) s->open = NULL;
}

static void split_write(Split *s, const uint32_t *tokens, size_t n, Handoff ***handoffs) {
  while (n) {
    if (!s->open) {
      char path[4096];
      if (s->opt->part_tag)
        snprintf(path, sizeof path, "%s_%s_%s_%06d.bin", s->opt->output_prefix, s->name, s->opt->part_tag, s->shards++);
      else snprintf(path, sizeof path, "%s_%s_%06d.bin", s->opt->output_prefix, s->name, s->shards++);
      ShardOut *o = xcalloc(1, sizeof *o);
      o->path = xmalloc(strlen(path) + 1);
      strcpy(o->path, path);
      o->vocab_size = s->vocab_size, o->zstd_level = s->opt->zstd_level;
      o->tail = &o->head;
      s->open = o, s->in_shard = 0;
    }
    uint64_t room = s->opt->shard_tokens - s->in_shard;
    size_t k = n < room ? n : (size_t)room;
    if (s->pend_n + k > s->pend_cap) {
      s->pend_cap = 2 * (s->pend_n + k);
      uint32_t *bigger = realloc(s->pend, s->pend_cap * sizeof(uint32_t));
      if (!bigger) die("out of memory for %zu pending tokens", s->pend_cap);
      s->pend = bigger;
    }
    memcpy(s->pend + s->pend_n, tokens, k * sizeof(uint32_t));
    s->pend_n += k, tokens += k, n -= k, s->in_shard += k, s->tokens += k;
    if (s->in_shard == s->opt->shard_tokens) handoff(s, 1, handoffs);
  }
}

// Writes what a shard has queued, then, once it is closed and drained, finishes the file. Runs
// without the pipeline's lock; `segs` were detached from the shard under it.
static void shard_out_write(ShardOut *o, Segment *segs, int finish) {
  if (!o->w) o->w = shard_writer_open(o->path, o->vocab_size, o->zstd_level);
  while (segs) {
    Segment *next = segs->next;
    shard_writer_append(o->w, segs->tokens, segs->n);
    free(segs);
    segs = next;
  }
  if (finish) {
    shard_writer_close(o->w);
    o->w = NULL;
  }
}

// ---------------------------------------------------------------------------------------------
// Chunk: one block of input on its way through the pipeline. The reader fills the block; a parse
// task turns it into documents (JSON decoding, validation, the val hash) and cuts them into pieces
// of about PIECE_BYTES (whole documents, or stretches of a long one cut where the tokenizer allows);
// encode tasks take the pieces; the ordered writer frames each document BOS ... EOS into its split.

typedef struct {
  size_t off, len;  // its text: chunk->text (JSON lines) or the block's bytes
  size_t n_ids;     // its token count, when its piece holds whole documents
  int val;          // --val-fraction: its content hash falls below the fraction
} Doc;

typedef struct {
  size_t doc0, doc1;  // whole documents [doc0, doc1), or, when part, document doc0 ...
  int part, first, last;
  size_t off, len;  // ... from byte off, len bytes (first/last: the piece starts/ends it)
  uint32_t *ids;    // the piece's tokens (the buffer stays with the slot, reused)
  size_t n_ids, cap;
} Piece;

typedef enum { SLOT_FREE, SLOT_FILLING, SLOT_READ, SLOT_PARSING, SLOT_PARSED, SLOT_ENCODED, SLOT_WRITING } SlotState;

typedef struct {
  SlotState state;
  int input;          // index of its input file
  uint64_t seq;       // its place in that input: blocks are written in (input, seq) order
  uint64_t position;  // bytes of its input file consumed once it was read (progress, ETA)
  TextBlock block;
  char *text;  // decoded documents (JSON lines)
  size_t text_cap;
  Doc *docs;
  size_t n_docs, docs_cap;
  Piece *pieces;
  size_t n_pieces, pieces_cap, next_piece, pieces_done;
  long lines;      // lines in the block (JSON lines)
  uint64_t empty;  // empty documents skipped
  long err_line;   // > 0: parsing stopped at this line of the block, with err; the docs before it stand
  char err[300];
} Chunk;

static const char *doc_text(const Chunk *c, const Doc *d) {
  return (c->block.form == BLOCK_JSON_LINES ? c->text : c->block.bytes) + d->off;
}

static void add_doc(Chunk *c, size_t off, size_t len) {
  if (len == 0) {  // nothing to learn from BOS EOS
    c->empty++;
    return;
  }
  if (c->n_docs == c->docs_cap) {
    c->docs_cap = c->docs_cap ? 2 * c->docs_cap : 256;
    Doc *bigger = realloc(c->docs, c->docs_cap * sizeof(Doc));
    if (!bigger) die("out of memory for %zu documents", c->docs_cap);
    c->docs = bigger;
  }
  c->docs[c->n_docs++] = (Doc){.off = off, .len = len};
}

static Piece *add_piece(Chunk *c) {
  if (c->n_pieces == c->pieces_cap) {
    size_t cap = c->pieces_cap ? 2 * c->pieces_cap : 64;
    Piece *bigger = realloc(c->pieces, cap * sizeof(Piece));
    if (!bigger) die("out of memory for %zu pieces", cap);
    memset(bigger + c->pieces_cap, 0, (cap - c->pieces_cap) * sizeof(Piece));
    c->pieces = bigger, c->pieces_cap = cap;
  }
  return &c->pieces[c->n_pieces++];
}

// JSON lines: each line's text member decoded into c->text (decoded strings are never longer than
// their JSON). Stops at the first bad line, recording it.
static void parse_lines(Chunk *c, const char *field, const char *path) {
  const TextBlock *b = &c->block;
  if (c->text_cap < b->len) {
    free(c->text);
    c->text_cap = b->len;
    c->text = xmalloc(c->text_cap);
  }
  size_t used = 0;
  for (size_t pos = 0; pos < b->len;) {
    const char *line = b->bytes + pos, *nl = memchr(line, '\n', b->len - pos);
    size_t n = nl ? (size_t)(nl - line) : b->len - pos;
    pos += n + 1;
    c->lines++;
    if (n && line[n - 1] == '\r') n--;  // CRLF files
    size_t k = 0;
    while (k < n && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r' || line[k] == '\0')) k++;
    if (k == n) continue;  // blank line
    char jerr[200], *s;
    size_t len;
    int rc = json_get_string(line, n, field, &s, &len, jerr, sizeof jerr);
    if (rc <= 0) {
      c->err_line = c->lines;
      if (rc < 0) snprintf(c->err, sizeof c->err, "bad JSON: %s", jerr);
      else snprintf(c->err, sizeof c->err, "object has no \"%s\" member", field);
      return;
    }
    if (used + len > c->text_cap) die("%s: decoded JSON string longer than its line", path);  // cannot happen
    memcpy(c->text + used, s, len);
    free(s);
    add_doc(c, used, len);
    used += len;
  }
}

// Pieces of about PIECE_BYTES: runs of whole short documents, and long documents cut where
// tokenizer_split_point allows (a document it cannot cut stays one piece).
static void make_pieces(Chunk *c, const Tokenizer *tok) {
  for (size_t i = 0; i < c->n_docs;) {
    const Doc *d = &c->docs[i];
    if (d->len > PIECE_BYTES) {
      const char *text = doc_text(c, d);
      for (size_t a = 0; a < d->len;) {
        size_t b = d->len - a > 2 * PIECE_BYTES ? tokenizer_split_point(tok, text, d->len, a + PIECE_BYTES) : d->len;
        Piece *pc = add_piece(c);
        pc->part = 1, pc->doc0 = i, pc->off = a, pc->len = b - a, pc->first = a == 0, pc->last = b == d->len;
        a = b;
      }
      i++;
      continue;
    }
    size_t j = i, bytes = 0;
    while (j < c->n_docs && c->docs[j].len <= PIECE_BYTES && (j == i || bytes + c->docs[j].len <= PIECE_BYTES))
      bytes += c->docs[j++].len;
    Piece *pc = add_piece(c);
    pc->part = 0, pc->doc0 = i, pc->doc1 = j;
    i = j;
  }
}

static void piece_encode(Chunk *c, Piece *pc, const Tokenizer *tok, TokenizerScratch *sc) {
  pc->n_ids = 0;
  if (pc->part) {
    tokenizer_encode_append(tok, sc, doc_text(c, &c->docs[pc->doc0]) + pc->off, pc->len, &pc->ids, &pc->n_ids,
                            &pc->cap);
    return;
  }
  for (size_t i = pc->doc0; i < pc->doc1; i++) {
    Doc *d = &c->docs[i];
    d->n_ids = tokenizer_encode_append(tok, sc, doc_text(c, d), d->len, &pc->ids, &pc->n_ids, &pc->cap);
  }
}

// After the chunk is written: buffers that one huge document grew are given back.
static void chunk_recycle(Chunk *c) {
  if (c->block.cap > SHRINK_BYTES) text_block_free(&c->block);
  if (c->text_cap > SHRINK_BYTES) free(c->text), c->text = NULL, c->text_cap = 0;
  for (size_t i = 0; i < c->pieces_cap; i++)
    if (c->pieces[i].cap > SHRINK_BYTES / sizeof(uint32_t))
      free(c->pieces[i].ids), c->pieces[i].ids = NULL, c->pieces[i].cap = 0;
  c->state = SLOT_FREE;
}

static void chunk_free(Chunk *c) {
  text_block_free(&c->block);
  free(c->text), free(c->docs);
  for (size_t i = 0; i < c->pieces_cap; i++) free(c->pieces[i].ids);
  free(c->pieces);
}

// ---------------------------------------------------------------------------------------------
// The pipeline. Every thread runs worker(): under one lock it picks the most urgent task, runs it
// without the lock, and records the result. Serial are: reading one input (file reads, decompression,
// line framing: about 1/30 of the work for JSON lines; several inputs are read at once, up to
// 1 + threads/8, as one gzip stream inflates at only a few hundred MB/s), the writer (one at a time,
// in (input, block) order: copying each document's tokens into its split) and each shard's file.
// Parsing and encoding run on any thread. Blocks wait in a pool of slots, SLOTS_PER_THREAD per
// thread, at most half of them for inputs after the one being written, so that one always has room.
// There is no barrier anywhere, and the output is the same for any thread count.

enum { STAGE_READ, STAGE_PARSE, STAGE_ENCODE, STAGE_WRITE, STAGE_SHARDS, STAGE_WAIT, STAGES };
static const char *const STAGE_NAMES[STAGES] = {"read (serial per input)",        "parse", "encode", "write (serial)",
                                                "shard files (serial per shard)", "idle"};

typedef struct {    // one input file's reading
  TextInput *in;    // open from its first read to its end
  uint64_t blocks;  // blocks read so far
  uint64_t before;  // the sizes of the inputs before it (progress)
  int busy;         // a task is reading it
  int done;         // read to its end
  char *err;        // a read failed after `blocks` blocks
} Feed;

typedef struct {
  const PrepareOptions *opt;
  const Tokenizer *tok;
  const char *field;  // the JSON member or parquet column holding the text
  Split split[2];     // train, val
  Split *cur;         // the split of the document being written
  uint64_t doc_index, empty_docs, input_bytes;
  int cur_input;  // input of the chunk last written, and its lines before that chunk
  long line_base;
  double t0, last_report;
  double report_s;                // seconds between progress lines (TOKENIZE_REPORT_S, default 2)
  uint64_t file_bytes, position;  // the inputs' sizes on disk, and the bytes consumed by what is written

  pthread_mutex_t mu;
  pthread_cond_t cv;
  Chunk *slots;
  size_t n_slots;
  Feed *feeds;                      // one per input
  int next_open, n_open, max_open;  // the next input to open; inputs open; how many may be
  int w_input;                      // the writer's next block: (w_input, w_block)
  uint64_t w_block;
  int writing;                    // the writer (or the final flush) is running
  int stop, finished;             // stop: an error; finished: the splits were flushed
  ShardOut *shards;               // shards with tokens still to write, oldest first
  uint64_t backlog, backlog_max;  // tokens queued for the shard tasks, and the writer's limit on them
  char err[1024];
  double stage_s[STAGES];  // thread-seconds per kind of task (TOKENIZE_STAGES=1 prints them)
} Prep;

static void chunk_parse(Chunk *c, const Prep *p) {
  c->n_docs = c->n_pieces = c->next_piece = c->pieces_done = 0;
  c->lines = 0, c->empty = 0, c->err_line = 0;
  const TextBlock *b = &c->block;
  if (b->form == BLOCK_JSON_LINES) parse_lines(c, p->field, p->opt->inputs[c->input]);
  else if (b->form == BLOCK_DOCUMENT) add_doc(c, 0, b->len);
  else
    for (size_t i = 0; i < b->n_rows; i++) add_doc(c, i ? b->ends[i - 1] : 0, b->ends[i] - (i ? b->ends[i - 1] : 0));
  if (p->opt->val_fraction > 0)
    for (size_t i = 0; i < c->n_docs; i++) {
      Doc *d = &c->docs[i];
      d->val = (hash64(doc_text(c, d), d->len, PREPARE_VAL_HASH_SEED) >> 11) * 0x1p-53 < p->opt->val_fraction;
    }
  make_pieces(c, p->tok);
}

// "eta 1h02m" from the share of the inputs' bytes consumed by what is written.
static void eta_text(const Prep *p, double elapsed, char *buf, size_t len) {
  uint64_t done = p->position;
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

static void doc_begin(Prep *p, const Doc *d, Handoff ***h) {
  const PrepareOptions *o = p->opt;
  int val = o->val_fraction > 0 ? d->val : p->doc_index < o->val_docs;
  p->doc_index++;
  p->cur = &p->split[val];
  uint32_t bos = tokenizer_bos(p->tok);
  split_write(p->cur, &bos, 1, h);
}

static void doc_end(Prep *p, const Doc *d, Handoff ***h) {
  uint32_t eos = tokenizer_eos(p->tok);
  split_write(p->cur, &eos, 1, h);
  p->cur->docs++;
  p->input_bytes += d->len;
}

// The ordered writer: chunk c's documents into their splits. Returns -1 (p->err set) when the
// chunk's parse stopped at a bad line, after writing the documents before it.
static int chunk_write(Prep *p, Chunk *c, Handoff ***h) {
  if (c->input != p->cur_input) p->cur_input = c->input, p->line_base = 0;
  for (size_t k = 0; k < c->n_pieces; k++) {
    const Piece *pc = &c->pieces[k];
    if (pc->part) {
      const Doc *d = &c->docs[pc->doc0];
      if (pc->first) doc_begin(p, d, h);
      split_write(p->cur, pc->ids, pc->n_ids, h);
      if (pc->last) doc_end(p, d, h);
      continue;
    }
    const uint32_t *ids = pc->ids;
    for (size_t i = pc->doc0; i < pc->doc1; i++) {
      const Doc *d = &c->docs[i];
      doc_begin(p, d, h);
      split_write(p->cur, ids, d->n_ids, h);
      ids += d->n_ids;
      doc_end(p, d, h);
    }
  }
  p->empty_docs += c->empty;
  if (c->err_line)
    return set_err(p->err, sizeof p->err, "%s:%ld: %s", p->opt->inputs[c->input], p->line_base + c->err_line, c->err);
  p->line_base += c->lines;
  p->position = p->feeds[c->input].before + c->position;
  for (int k = 0; k < 2; k++) handoff(&p->split[k], 0, h);  // the shards' tasks get this chunk's tokens

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
  return 0;
}

// A reader: the next block of input i into c. Returns 1, 0 at the input's end, or -1 (f->err set).
static int read_feed(Prep *p, int i, Chunk *c) {
  Feed *f = &p->feeds[i];
  char err[1024];
  int got = -1;
  if (f->in || (f->in = text_input_open(p->opt->inputs[i], p->field, err, sizeof err)))
    got = text_input_read(f->in, &c->block, CHUNK_BYTES, err, sizeof err);
  if (got < 0) {
    f->err = xmalloc(strlen(err) + 1);
    strcpy(f->err, err);
  } else if (got > 0) {
    c->input = i, c->position = text_input_position(f->in);
  }
  if (got <= 0 && f->in) text_input_close(f->in), f->in = NULL;
  return got;
}

// Applies the writer's handoffs to the shards' queues (under the lock).
static void apply_handoffs(Prep *p, Handoff *h) {
  while (h) {
    Handoff *next = h->next;
    ShardOut *o = h->shard;
    if (!o->listed) {  // the list's new tail
      ShardOut **at = &p->shards;
      while (*at) at = &(*at)->next;
      *at = o, o->listed = 1;
    }
    if (h->seg) *o->tail = h->seg, o->tail = &h->seg->next, p->backlog += h->seg->n;
    if (h->close) o->closed = 1;
    free(h);
    h = next;
  }
}

static int before(const Chunk *a, const Chunk *b) {
  return a->input < b->input || (a->input == b->input && a->seq < b->seq);
}

// The writer's next block, once read; NULL before. Inputs read and written to their end are passed.
static Chunk *next_to_write(Prep *p) {
  while (p->w_input < p->opt->n_inputs && p->feeds[p->w_input].done && p->w_block == p->feeds[p->w_input].blocks)
    p->w_input++, p->w_block = 0;
  for (size_t i = 0; i < p->n_slots; i++) {
    Chunk *c = &p->slots[i];
    if (c->state >= SLOT_READ && c->input == p->w_input && c->seq == p->w_block) return c;
  }
  return NULL;
}

// The input a reader should take next (-1: none): the earliest open one that no task reads, else the
// next one when fewer than max_open are open. A free slot is needed, and one for an input after the
// writer's only while those hold under half the slots.
static int next_to_read(Prep *p, Chunk **slot) {
  const PrepareOptions *o = p->opt;
  int i = p->w_input;
  while (i < p->next_open && (p->feeds[i].busy || p->feeds[i].done || p->feeds[i].err)) i++;
  if (i == p->next_open && (p->next_open == o->n_inputs || p->n_open >= p->max_open)) return -1;
  size_t ahead = 0;  // slots held by later inputs
  *slot = NULL;
  for (size_t k = 0; k < p->n_slots; k++) {
    Chunk *c = &p->slots[k];
    if (c->state == SLOT_FREE) *slot = c;
    else ahead += c->input != p->w_input;
  }
  if (!*slot || (i != p->w_input && 2 * (ahead + 1) > p->n_slots)) return -1;
  return i;
}

// Runs `call` without the lock, adding its time to the thread's total for the stage.
#define UNLOCKED(stage, call)             \
  do {                                    \
    double t_ = now_seconds();            \
    pthread_mutex_unlock(&p->mu);         \
    call;                                 \
    pthread_mutex_lock(&p->mu);           \
    stage_s[stage] += now_seconds() - t_; \
  } while (0)

// One thread's loop; see the section's comment. Task order: the writer (it gates everything), the
// shards' tasks (they free memory), the reader, then encoding and parsing, oldest chunk first.
static void worker(Prep *p) {
  TokenizerScratch *sc = tokenizer_scratch_new(p->tok);
  double stage_s[STAGES] = {0};
  pthread_mutex_lock(&p->mu);
  for (;;) {
    Chunk *c = next_to_write(p);
    if (!p->stop && !p->writing && c && c->state == SLOT_ENCODED && p->backlog <= p->backlog_max) {
      p->writing = 1, c->state = SLOT_WRITING;
      Handoff *hs = NULL, **tail = &hs;
      int rc;
      UNLOCKED(STAGE_WRITE, rc = chunk_write(p, c, &tail));
      apply_handoffs(p, hs);
      chunk_recycle(c);
      p->w_block++, p->writing = 0;
      if (rc) p->stop = 1;
      pthread_cond_broadcast(&p->cv);
      continue;
    }
    const Feed *wf = p->w_input < p->opt->n_inputs ? &p->feeds[p->w_input] : NULL;
    if (!p->stop && !p->writing && wf && wf->err && p->w_block == wf->blocks)  // errors in input order
      p->stop = 1, snprintf(p->err, sizeof p->err, "%s", wf->err);
    if (!p->finished && !p->writing && (p->stop || !wf)) {  // the open shards are closed
      Handoff *hs = NULL, **tail = &hs;
      for (int k = 0; k < 2; k++) handoff(&p->split[k], 1, &tail);
      apply_handoffs(p, hs);
      p->finished = 1;
      pthread_cond_broadcast(&p->cv);
      continue;
    }
    ShardOut *o = p->shards;
    while (o && (o->running || (!o->head && !o->closed))) o = o->next;
    if (o) {
      Segment *segs = o->head;
      size_t n = 0;
      for (Segment *g = segs; g; g = g->next) n += g->n;
      int finish = o->closed;
      o->head = NULL, o->tail = &o->head, o->running = 1;
      UNLOCKED(STAGE_SHARDS, shard_out_write(o, segs, finish));
      o->running = 0, p->backlog -= n;
      if (finish) {
        ShardOut **at = &p->shards;
        while (*at != o) at = &(*at)->next;
        *at = o->next;
        free(o->path), free(o);
      }
      pthread_cond_broadcast(&p->cv);
      continue;
    }
    if (p->finished && !p->shards) break;
    int i = p->stop ? -1 : next_to_read(p, &c);
    if (i >= 0) {
      Feed *f = &p->feeds[i];
      if (i == p->next_open) p->next_open++, p->n_open++;
      f->busy = 1, c->state = SLOT_FILLING;
      int rc;
      UNLOCKED(STAGE_READ, rc = read_feed(p, i, c));
      f->busy = 0;
      if (rc > 0) c->seq = f->blocks++, c->state = SLOT_READ;
      else c->state = SLOT_FREE, f->done = rc == 0, p->n_open--;
      pthread_cond_broadcast(&p->cv);
      continue;
    }
    c = NULL;  // parse or encode the earliest block that has such work
    for (size_t k = 0; k < p->n_slots && !p->stop; k++) {
      Chunk *x = &p->slots[k];
      if ((x->state == SLOT_READ || (x->state == SLOT_PARSED && x->next_piece < x->n_pieces)) && (!c || before(x, c)))
        c = x;
    }
    if (!c) {
      double t = now_seconds();
      pthread_cond_wait(&p->cv, &p->mu);
      stage_s[STAGE_WAIT] += now_seconds() - t;
      continue;
    }
    if (c->state == SLOT_READ) {
      c->state = SLOT_PARSING;
      UNLOCKED(STAGE_PARSE, chunk_parse(c, p));
      c->state = c->n_pieces ? SLOT_PARSED : SLOT_ENCODED;
    } else {
      Piece *pc = &c->pieces[c->next_piece++];
      UNLOCKED(STAGE_ENCODE, piece_encode(c, pc, p->tok, sc));
      if (++c->pieces_done == c->n_pieces) c->state = SLOT_ENCODED;
    }
    pthread_cond_broadcast(&p->cv);
  }
  for (int k = 0; k < STAGES; k++) p->stage_s[k] += stage_s[k];
  pthread_mutex_unlock(&p->mu);
  tokenizer_scratch_free(sc);
}
#undef UNLOCKED

// Runs the pipeline on `threads` threads until the inputs are exhausted or an error stops it.
// Returns 0 or -1 (p->err set).
static int run_pipeline(Prep *p, int threads) {
  const PrepareOptions *o = p->opt;
  p->n_slots = (size_t)SLOTS_PER_THREAD * (size_t)threads + 2;
  p->slots = xcalloc(p->n_slots, sizeof(Chunk));
  p->feeds = xcalloc((size_t)o->n_inputs, sizeof(Feed));
  for (int i = 0; i < o->n_inputs; i++) {
    struct stat st;
    p->feeds[i].before = p->file_bytes;
    if (!stat(o->inputs[i], &st)) p->file_bytes += (uint64_t)st.st_size;
  }
  p->max_open = 1 + threads / 8;
  p->cur_input = -1;
  // Tokens may wait for their shards' tasks up to half a shard per thread: enough to keep several
  // shards compressing at once when zstd is slower than tokenizing (4 bytes a token held in memory).
  uint64_t shard = o->shard_tokens < (1ull << 40) ? o->shard_tokens : (1ull << 40);
  uint64_t half = (uint64_t)(threads > 1 ? threads / 2 : 1) * shard;
  p->backlog_max = half > MIN_BACKLOG_TOKENS ? half : MIN_BACKLOG_TOKENS;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
#pragma omp parallel num_threads(threads)
  worker(p);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  for (size_t i = 0; i < p->n_slots; i++) chunk_free(&p->slots[i]);
  free(p->slots);
  for (int i = 0; i < o->n_inputs; i++) {
    if (p->feeds[i].in) text_input_close(p->feeds[i].in);
    free(p->feeds[i].err);
  }
  free(p->feeds);
  for (int k = 0; k < 2; k++) free(p->split[k].pend);
  const char *show = getenv("TOKENIZE_STAGES");  // where the threads' time went, to find what serializes
  if (show && *show && strcmp(show, "0")) {
    double busy = 0;
    for (int k = 0; k < STAGE_WAIT; k++) busy += p->stage_s[k];
    for (int k = 0; k < STAGES; k++)
      fprintf(stderr, "tokenize stage %-31s %8.3f thread-s  %5.1f%% of the busy time\n", STAGE_NAMES[k], p->stage_s[k],
              k == STAGE_WAIT ? 0.0 : 100.0 * p->stage_s[k] / (busy > 0 ? busy : 1));
  }
  return p->stop ? -1 : 0;
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
  // Check every input before writing anything, so a typo in the last one costs nothing (a parquet
  // file's footer is read: its text column must be there).
  for (int i = 0; i < o->n_inputs; i++) {
    TextInput *in = text_input_open(o->inputs[i], o->text_field ? o->text_field : "text", err, errlen);
    if (!in) return -1;
    text_input_close(in);
  }
  return 0;
}

int prepare_run(const PrepareOptions *opt, PrepareStats *stats, char *err, size_t errlen) {
  memset(stats, 0, sizeof *stats);
  if (check_options(opt, err, errlen)) return -1;
  Prep *p = xcalloc(1, sizeof *p);
  p->opt = opt, p->field = opt->text_field ? opt->text_field : "text";
  const char *rs = getenv("TOKENIZE_REPORT_S");  // a test hook: 0 reports after every chunk
  p->report_s = rs && *rs ? atof(rs) : 2.0;
  Tokenizer *tok = tokenizer_load(opt->tokenizer_path, opt->pattern_path, err, errlen);
  if (!tok) {
    free(p);
    return -1;
  }
  p->tok = tok;
  p->t0 = p->last_report = now_seconds();  // rates leave out loading the tokenizer (~25 ms), a fixed cost
  for (int k = 0; k < 2; k++)
    p->split[k] = (Split){.opt = opt, .name = k ? "val" : "train", .vocab_size = (uint32_t)tokenizer_vocab_size(tok)};
  stats->threads = opt->threads > 0 ? opt->threads : omp_get_max_threads();

  int rc = run_pipeline(p, stats->threads);
  if (rc) set_err(err, errlen, "%s", p->err);
  if (rc == 0 && p->doc_index == 0) rc = set_err(err, errlen, "no non-empty documents in the inputs");
  for (int k = 0; k < 2; k++)
    stats->docs[k] = p->split[k].docs, stats->tokens[k] = p->split[k].tokens, stats->shards[k] = p->split[k].shards;
  stats->empty_docs = p->empty_docs;
  stats->input_bytes = p->input_bytes;
  stats->seconds = now_seconds() - p->t0;
  tokenizer_free(tok);
  free(p);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// The command line.

static void usage(FILE *f) {
  fprintf(f,
          "usage: train tokenize --tokenizer PATH [--pattern PATH] --text STRING\n"
          "       train tokenize --tokenizer PATH [--pattern PATH] --input F [--input F ...] --output PREFIX\n"
          "                      [--shard-tokens N] [--val-docs N | --val-fraction F] [--zstd L]\n"
          "                      [--text-field NAME] [--threads N] [--quiet]\n"
          "\n"
          "  --text STRING     print the token ids of STRING (no BOS/EOS) on one line\n"
          "  --input F         .txt (whole file = one document), .jsonl, .jsonl.zst, .jsonl.gz or .json.gz\n"
          "                    (\"text\" of each line; a .gz may hold several gzip members), or .parquet\n"
          "                    (the \"text\" column; null rows are skipped like empty documents)\n"
          "  --text-field NAME the JSON member or parquet column holding the text (default \"text\")\n"
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
    else if (!strcmp(a, "--text-field")) ok = *v != 0, opt.text_field = v;
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
