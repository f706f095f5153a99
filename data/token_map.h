// data/token_map.h: a token stream read in place from a memory-mapped file of fixed-width integers (the
// .bin of a Megatron-LM indexed dataset, data/megatron.h; a shard of a packed-binary dataset,
// data/packed.h). The loader reads windows through token_map_read.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
  char *bin_path;
  const uint8_t *map;  // the .bin, memory-mapped
  size_t map_bytes;
  int width, is_signed;  // bytes per token, and whether the dtype is signed
  uint64_t n_tokens;
  uint64_t n_docs;      // documents (D - 1)
  uint64_t *doc_start;  // token offset of each document's first token, n_docs + 1 entries
  uint32_t vocab_size;  // the model's: a token at or above it stops the run, naming the file
} TokenMap;

// Maps path as n tokens of `width` bytes (1, 2, 4 or 8; is_signed for int types): its size must be a
// multiple of width, and equal expect_tokens * width unless expect_tokens is UINT64_MAX. 0, or -1 with
// err naming the file (what names it in messages: `what`, e.g. "megatron dataset").
int token_map_open(TokenMap *d, const char *path, int width, int is_signed, uint64_t expect_tokens, uint32_t vocab_size,
                   const char *what, char *err, size_t errlen);
// n tokens from token offset i (dies naming the file on a token outside [0, vocab_size)).
void token_map_read(const TokenMap *d, uint64_t i, uint32_t *out, int n);
void token_map_close(TokenMap *d);
