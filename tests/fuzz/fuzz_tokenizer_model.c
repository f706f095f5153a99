// tests/fuzz/fuzz_tokenizer_model.c: tokenizer_load on arbitrary model files. It must return a
// tokenizer or NULL with a message naming the file, never crash, leak or die.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write_file("tokenizer.model", data, size);
  char err[1024] = "";
  Tokenizer *t = tokenizer_load(path, NULL, err, sizeof err);
  if (!t) {
    if (!strstr(err, "tokenizer.model")) abort();  // the message names the file
    return 0;
  }
  uint32_t *ids;
  tokenizer_encode(t, "hello world", 11, &ids);
  free(ids);
  tokenizer_free(t);
  return 0;
}
