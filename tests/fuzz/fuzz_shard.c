// tests/fuzz/fuzz_shard.c: the shard reader on arbitrary files. shard_read must return verified
// tokens or -1 with a message (and no tokens), never crash, leak or read out of bounds.
#include <stdint.h>
#include <stdlib.h>

#include "data/shard.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write_file("shard.bin", data, size);
  char err[1024] = "";
  ShardInfo info;
  int head = shard_read_info(path, &info, err, sizeof err);
  uint32_t *tokens = (uint32_t *)1;
  int rc = shard_read(path, &tokens, &info, err, sizeof err);
  if (rc) {
    if (tokens || !err[0]) abort();  // never unverified tokens; always a reason
    return 0;
  }
  if (head) abort();  // a shard that reads must have a valid header
  for (uint64_t i = 0; i < info.n_tokens; i++)
    if (tokens[i] >= info.vocab_size) abort();
  free(tokens);
  return 0;
}
