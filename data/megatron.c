// data/megatron.c: see megatron.h.
#include "data/megatron.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"

static const char MAGIC[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
enum { HEADER_BYTES = 9 + 8 + 1 + 8 + 8 };

// PREFIX from a path naming the prefix, the .bin or the .idx.
static char *prefix_of(const char *path) {
  size_t n = strlen(path);
  char *p = xmalloc(n + 1);
  memcpy(p, path, n + 1);
  if (n > 4 && (!strcmp(p + n - 4, ".bin") || !strcmp(p + n - 4, ".idx"))) p[n - 4] = 0;
  return p;
}

static char *with_ext(const char *prefix, const char *ext) {
  size_t n = strlen(prefix);
  char *p = xmalloc(n + 5);
  memcpy(p, prefix, n);
  memcpy(p + n, ext, 5);
  return p;
}

int megatron_same_dataset(const char *a, const char *b) {
  char *pa = prefix_of(a), *pb = prefix_of(b);
  int same = !strcmp(pa, pb);
  free(pa), free(pb);
  return same;
}

int megatron_detect(const char *path) {
  char *prefix = prefix_of(path), *idx = with_ext(prefix, ".idx");
  struct stat st;
  int yes = !stat(idx, &st) && S_ISREG(st.st_mode);  // megatron_open then validates it, naming it
  free(prefix), free(idx);
  return yes;
}

static uint64_t u64_at(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static int64_t i64_at(const uint8_t *p) { return (int64_t)u64_at(p); }

static int32_t i32_at(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

// The whole index in memory (it is small next to the .bin: 12 bytes per sequence).
static uint8_t *read_index(const char *path, size_t *bytes, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) return set_err(err, errlen, "megatron index %s: cannot open it", path), NULL;
  struct stat st;
  if (fstat(fileno(f), &st)) return fclose(f), set_err(err, errlen, "megatron index %s: cannot stat it", path), NULL;
  uint8_t *buf = xmalloc((size_t)st.st_size + 1);
  size_t got = fread(buf, 1, (size_t)st.st_size, f);
  fclose(f);
  if (got != (size_t)st.st_size) return free(buf), set_err(err, errlen, "megatron index %s: read error", path), NULL;
  *bytes = got;
  return buf;
}

int megatron_open(const char *path, uint32_t vocab_size, TokenMap *d, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  char *prefix = prefix_of(path), *idx = with_ext(prefix, ".idx"), *bin = with_ext(prefix, ".bin");
  free(prefix);
  size_t n = 0;
  uint8_t *b = read_index(idx, &n, err, errlen);
  int rc = -1;
  if (!b) goto out;
  if (n < HEADER_BYTES || memcmp(b, MAGIC, 9)) {
    set_err(err, errlen,
            "megatron index %s: no MMIDIDX header (not an index written by Megatron-LM's preprocess_data.py)", idx);
    goto out;
  }
  uint64_t version = u64_at(b + 9);
  int code = b[17];
  uint64_t S = u64_at(b + 18), D = u64_at(b + 26);
  static const int widths[9] = {0, 1, 1, 2, 4, 8, 0, 0, 2};
  if (version != 1) {
    set_err(err, errlen, "megatron index %s: version %llu; this reader knows version 1", idx,
            (unsigned long long)version);
    goto out;
  }
  if (code < 1 || code > 8 || !widths[code]) {
    set_err(err, errlen, "megatron index %s: dtype code %d is not an integer token type (1-5 or 8)", idx, code);
    goto out;
  }
  d->width = widths[code], d->is_signed = code == 2 || code == 3 || code == 4 || code == 5;
  // Megatron stores uint16 when the tokenizer's vocabulary is below 65,500 (best_fitting_dtype): such a
  // dataset for a larger model vocabulary was made with another tokenizer
  if (code == 8 && vocab_size > 65536) {
    set_err(err, errlen,
            "megatron dataset %s: uint16 tokens (a vocabulary below 65,536) but the model's vocab_size is %u: "
            "tokenized with another tokenizer? re-run preprocess_data.py with this model's tokenizer",
            bin, vocab_size);
    goto out;
  }
  uint64_t want = HEADER_BYTES + 12 * S + 8 * D;
  if (S > (1ull << 40) || D > (1ull << 40) || (n != want && n != want + S)) {
    set_err(err, errlen, "megatron index %s: %zu bytes, expected %llu for %llu sequences and %llu document entries",
            idx, n, (unsigned long long)want, (unsigned long long)S, (unsigned long long)D);
    goto out;
  }
  const uint8_t *lens = b + HEADER_BYTES, *ptrs = lens + 4 * S, *docs = ptrs + 8 * S;
  uint64_t off = 0;
  for (uint64_t i = 0; i < S; i++) {
    int32_t len = i32_at(lens + 4 * i);
    int64_t p = i64_at(ptrs + 8 * i);
    if (len < 0 || p != (int64_t)off) {
      set_err(err, errlen, "megatron index %s: sequence %llu has length %d at byte %lld, expected byte %llu", idx,
              (unsigned long long)i, len, (long long)p, (unsigned long long)off);
      goto out;
    }
    off += (uint64_t)len * (uint64_t)d->width;
  }
  if (D < 1 || i64_at(docs) != 0 || i64_at(docs + 8 * (D - 1)) != (int64_t)S) {
    set_err(err, errlen, "megatron index %s: the document index must run from 0 to the %llu sequences", idx,
            (unsigned long long)S);
    goto out;
  }
  d->n_docs = D - 1;
  d->doc_start = xmalloc((size_t)D * sizeof *d->doc_start);
  uint64_t tok = 0, seq = 0;
  for (uint64_t j = 0; j < D; j++) {
    int64_t s = i64_at(docs + 8 * j);
    if (s < (int64_t)seq || s > (int64_t)S) {
      set_err(err, errlen, "megatron index %s: document %llu starts at sequence %lld, out of order", idx,
              (unsigned long long)j, (long long)s);
      goto out;
    }
    for (; seq < (uint64_t)s; seq++) tok += (uint64_t)i32_at(lens + 4 * seq);
    d->doc_start[j] = tok;
  }
  if (token_map_open(d, bin, d->width, d->is_signed, off / (uint64_t)d->width, vocab_size, "megatron dataset", err,
                     errlen))
    goto out;
  rc = 0;
out:
  if (rc) free(d->doc_start), d->doc_start = NULL;
  free(b), free(idx), free(bin);
  return rc;
}
