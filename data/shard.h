// data/shard.h: the token shard file format (docs/shard_format.md): a 64-byte little-endian header,
// then the token payload, raw or zstd-compressed. A shard is the concatenated token stream of many
// documents, each written by the caller as BOS, tokens..., EOS; the writer adds nothing.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_MAGIC "TOKSHARD"  // 8 bytes, no terminator in the file
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES 64
// The token checksum is hash64 chained over chunks of this many uncompressed payload bytes, so the
// writer and reader can stream. Part of the format: changing it changes every checksum.
#define SHARD_CHUNK_BYTES (1u << 20)
#define SHARD_COMPRESS_NONE 0
#define SHARD_COMPRESS_ZSTD 1

// Llama-3 document delimiters, as written by the data preparation code.
#define SHARD_BOS_ID 128000  // <|begin_of_text|>
#define SHARD_EOS_ID 128001  // <|end_of_text|>

typedef struct ShardWriter ShardWriter;

// Opens path.tmp for writing; zstd_level 0 writes raw tokens, otherwise a zstd level
// (ZSTD_minCLevel()..ZSTD_maxCLevel()). Token width is 2 bytes when vocab_size <= 65536, else 4.
ShardWriter *shard_writer_open(const char *path, uint32_t vocab_size, int zstd_level);
// Appends n tokens; dies if one is >= vocab_size (naming the path and the token's index).
void shard_writer_append(ShardWriter *w, const uint32_t *tokens, size_t n);
// Finishes the payload, writes the header, fsyncs and renames path.tmp to path. Returns the number
// of tokens written and frees w. Dies on any I/O error, naming the path.
uint64_t shard_writer_close(ShardWriter *w);

typedef struct {
  uint32_t version, vocab_size, token_bytes, compression;
  uint64_t n_tokens, payload_bytes, checksum;
} ShardInfo;

// Reads and validates the header (magic, version, header checksum, field consistency, file size).
// Returns 0, or -1 with a message naming the path in err.
int shard_read_info(const char *path, ShardInfo *info, char *err, size_t errlen);
// Reads a whole shard into a malloc'd array (*tokens, free() it), verifying the header, the payload
// size, the token checksum and that every id is < vocab_size. Returns 0, or -1 with a message in err
// and *tokens == NULL: never unverified tokens.
int shard_read(const char *path, uint32_t **tokens, ShardInfo *info, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
