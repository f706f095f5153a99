// data/token_map.c: see token_map.h.
#include "data/token_map.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"

int token_map_open(TokenMap *d, const char *path, int width, int is_signed, uint64_t expect_tokens, uint32_t vocab_size,
                   const char *what, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    if (fd >= 0) close(fd);
    snprintf(err, errlen, "%s %s: cannot open it", what, path);
    return -1;
  }
  uint64_t bytes = (uint64_t)st.st_size;
  if (bytes % (uint64_t)width || (expect_tokens != UINT64_MAX && bytes != expect_tokens * (uint64_t)width)) {
    close(fd);
    if (expect_tokens != UINT64_MAX)
      snprintf(err, errlen, "%s %s: %llu bytes, but %llu tokens of %d bytes were expected (truncated or another file)",
               what, path, (unsigned long long)bytes, (unsigned long long)expect_tokens, width);
    else
      snprintf(err, errlen, "%s %s: %llu bytes is not a whole number of %d-byte tokens", what, path,
               (unsigned long long)bytes, width);
    return -1;
  }
  const void *map = NULL;
  if (bytes) {
    void *m = mmap(NULL, (size_t)bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      close(fd);
      snprintf(err, errlen, "%s %s: mmap failed", what, path);
      return -1;
    }
    map = m;
  }
  close(fd);
  size_t n = strlen(path);
  d->bin_path = xmalloc(n + 1);
  memcpy(d->bin_path, path, n + 1);
  d->map = map, d->map_bytes = (size_t)bytes, d->width = width, d->is_signed = is_signed;
  d->n_tokens = bytes / (uint64_t)width, d->vocab_size = vocab_size;
  return 0;
}

static int32_t i32_at(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

void token_map_read(const TokenMap *d, uint64_t i, uint32_t *out, int n) {
  for (int k = 0; k < n; k++) {
    const uint8_t *p = d->map + (i + (uint64_t)k) * (uint64_t)d->width;
    int64_t v;
    switch (d->width) {
      case 1:
        v = d->is_signed ? (int8_t)p[0] : p[0];
        break;
      case 2:
        v = d->is_signed ? (int16_t)(p[0] | p[1] << 8) : (int64_t)(p[0] | p[1] << 8);
        break;
      case 4:
        v = d->is_signed ? i32_at(p) : (int64_t)(uint32_t)i32_at(p);
        break;
      default: {
        uint64_t u = 0;
        for (int b = 7; b >= 0; b--) u = u << 8 | p[b];
        v = (int64_t)u;
      }
    }
    if (v < 0 || v >= (int64_t)d->vocab_size)
      die("%s: token %lld at position %llu is outside the model's vocabulary [0, %u): tokenized with another "
          "tokenizer?",
          d->bin_path, (long long)v, (unsigned long long)(i + (uint64_t)k), d->vocab_size);
    out[k] = (uint32_t)v;
  }
}

void token_map_close(TokenMap *d) {
  if (d->map) munmap((void *)d->map, d->map_bytes);
  free(d->bin_path), free(d->doc_start);
  memset(d, 0, sizeof *d);
}
