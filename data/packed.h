// data/packed.h: the paper's packed-binary datasets (its low_bits_training/datasets/packed_binary.py):
// raw token shards with no header, listed by a manifest, read in place (memory-mapped).
//
// The manifest is a JSON object {"format": "lbt_packed_tokens_manifest_v1", "dtype": "uint32",
// "shards": [{"path": "shard_000.bin", "token_count": N, "doc_count": D}, ...]}: "dtype" is a NumPy
// name (uint32 when absent; uint8, uint16, int32, uint32 and int64 are read), a shard's "path" is
// relative to the manifest's folder unless absolute, "token_count" (optional) must match the file, and
// "doc_count" is informational. A data spec names the manifest file or the folder holding it
// (manifest.json or packed_tokens_manifest.json).
#pragma once
#include <stdint.h>

#include "data/token_map.h"

// 1 when path is a manifest of that format, or a folder holding one.
int packed_detect(const char *path);
// Opens every shard of the manifest at (or in) path: *maps (malloc'd, *n of them, each to be closed
// with token_map_close and freed with the array). 0, or -1 with err naming the manifest or the shard.
int packed_open(const char *path, uint32_t vocab_size, TokenMap **maps, int *n, char *err, size_t errlen);
