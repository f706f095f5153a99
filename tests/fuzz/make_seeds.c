// tests/fuzz/make_seeds.c: writes the binary seed corpora of the shard and checkpoint fuzz targets
// into DIR/shard and DIR/checkpoint, with the engine's own writers, so the seeds always follow the
// current formats. tests/system/test_fuzz.sh runs it before fuzzing.   usage: make_seeds DIR
#include <stdio.h>
#include <stdlib.h>

#include "data/shard.h"
#include "run/checkpoint.h"

static void shard(const char *dir, const char *name, uint32_t vocab, int zstd, uint32_t n) {
  char path[1024];
  snprintf(path, sizeof path, "%s/shard/%s", dir, name);
  uint32_t tokens[300];
  for (uint32_t i = 0; i < n; i++) tokens[i] = (i * 7919u + 3) % vocab;
  ShardWriter *w = shard_writer_open(path, vocab, zstd);
  shard_writer_append(w, tokens, n);
  shard_writer_close(w);
}

static void ckpt(const char *dir, const char *sub, CkptSection *secs, int n) {
  char path[1024], err[1024];
  snprintf(path, sizeof path, "%s/checkpoint/%s", dir, sub);
  if (ckpt_save(path, 1, secs, n, 0, err, sizeof err)) {
    fprintf(stderr, "make_seeds: %s\n", err);
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_seeds DIR\n");
    return 1;
  }
  const char *dir = argv[1];
  shard(dir, "raw16.bin", 512, 0, 300);
  shard(dir, "zstd16.bin", 512, 3, 300);
  shard(dir, "raw32.bin", 128256, 0, 100);
  shard(dir, "zstd32.bin", 128256, 1, 100);
  shard(dir, "empty.bin", 512, 0, 0);
  // docs/checkpoint_format.md's example (a: 5 bytes, b: 3 bytes), one with no sections, one bigger.
  char a[5] = "hello", b[3] = "abc", big[300];
  for (int i = 0; i < 300; i++) big[i] = (char)(i * 31);
  CkptSection ab[] = {{"a", a, sizeof a}, {"b", b, sizeof b}};
  CkptSection none[1];
  CkptSection more[] = {{"meta", big, 168}, {"a", a, sizeof a}, {"params", big, sizeof big}, {"b", b, sizeof b}};
  ckpt(dir, "ab", ab, 2);
  ckpt(dir, "none", none, 0);
  ckpt(dir, "more", more, 4);
  return 0;
}
