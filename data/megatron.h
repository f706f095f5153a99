// data/megatron.h: Megatron-LM's indexed datasets, read in place (memory-mapped), as training data.
//
// A dataset is a pair PREFIX.bin / PREFIX.idx as Megatron-LM's tools/preprocess_data.py writes them
// (megatron/core/datasets/indexed_dataset.py, _IndexWriter). The .bin holds every sequence's tokens
// back to back; the .idx, little-endian:
//   9 bytes  "MMIDIDX\0\0"
//   u64      version (1)
//   u8       dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
//   u64      S, the number of sequences
//   u64      D, the number of entries of the document index
//   i32[S]   sequence lengths (tokens)
//   i64[S]   sequence byte offsets into the .bin
//   i64[D]   document index: the first sequence of each document, then S
//   i8[S]    sequence modes (multimodal datasets only)
// The engine reads the .bin as one token stream (the loader cuts windows of seq_len + 1 tokens from
// it, as from its own shards); the document boundaries are kept for document masking.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/token_map.h"

// 1 when path is (meant as) a Megatron dataset: PREFIX.idx, or PREFIX.bin or PREFIX beside a PREFIX.idx
// (megatron_open validates the index, so a bad one is reported as such, naming the file).
int megatron_detect(const char *path);
// 1 when paths a and b name the same dataset (PREFIX, PREFIX.bin or PREFIX.idx).
int megatron_same_dataset(const char *a, const char *b);
// Opens and validates PREFIX.{bin,idx} (path: the prefix, the .bin or the .idx): the header, the sizes
// against the counts, the offsets against the lengths and the .bin's size, the document index, and the
// dtype against the model's vocabulary. 0, or -1 with err naming the file.
int megatron_open(const char *path, uint32_t vocab_size, TokenMap *d, char *err, size_t errlen);
