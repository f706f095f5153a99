// tests/fuzz/fuzz_tokenizer.c: tokenizer_encode on arbitrary bytes with the real Llama-3 model
// (FUZZ_TOKENIZER_MODEL, default ../shared/data/tokenizer/tokenizer.model). Every id must be a
// mergeable token, and for valid UTF-8 input decode(encode(x)) must give x back.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"

static Tokenizer *tok;

// Length of the valid UTF-8 sequence at s (shortest form, no surrogates, <= U+10FFFF), or 0.
static size_t utf8_char(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (!len || len > n) return 0;
  uint32_t cp = len == 1 ? c : c & (0x7f >> len);
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

static int valid_utf8(const unsigned char *s, size_t n) {
  for (size_t i = 0, k; i < n; i += k)
    if (!(k = utf8_char(s + i, n - i))) return 0;
  return 1;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *path = getenv("FUZZ_TOKENIZER_MODEL");
  if (!path) path = "../shared/data/tokenizer/tokenizer.model";
  char err[1024];
  tok = tokenizer_load(path, NULL, err, sizeof err);
  if (!tok) {
    fprintf(stderr, "fuzz_tokenizer: %s\n", err);
    exit(2);
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint32_t *ids;
  size_t n = tokenizer_encode(tok, (const char *)data, size, &ids);
  for (size_t i = 0; i < n; i++)
    if (ids[i] >= TOKENIZER_N_RANKS) abort();  // encoding never yields a special token
  char *out;
  size_t len;
  if (tokenizer_decode(tok, ids, n, &out, &len)) abort();
  if (valid_utf8(data, size) && (len != size || memcmp(out, data, size))) abort();
  free(out);
  free(ids);
  return 0;
}
