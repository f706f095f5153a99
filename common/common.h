// common/common.h: error handling, checked allocation and file I/O, timing. Every module includes this.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// die(): print "file:line: message" and exit(1). Use for unrecoverable errors.
#define die(...) die_at(__FILE__, __LINE__, __VA_ARGS__)
void die_at(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));

void *xmalloc_at(const char *file, int line, size_t n);
void *xcalloc_at(const char *file, int line, size_t n, size_t size);
#define xmalloc(n) xmalloc_at(__FILE__, __LINE__, (n))
#define xcalloc(n, s) xcalloc_at(__FILE__, __LINE__, (n), (s))
// A growable array of elem-byte entries holding n of *cap: returns it with room for one more (the
// capacity doubles, from 32), contents kept. Dies when memory runs out.
void *grow_array_at(const char *file, int line, void *arr, int n, int *cap, size_t elem);
#define grow_array(arr, n, cap, elem) grow_array_at(__FILE__, __LINE__, (arr), (n), (cap), (elem))

// Checked stdio: on failure they die naming the path (or "stream") and strerror(errno).
FILE *xfopen_at(const char *file, int line, const char *path, const char *mode);
void xfread_at(const char *file, int line, void *p, size_t size, size_t n, FILE *f, const char *what);
void xfwrite_at(const char *file, int line, const void *p, size_t size, size_t n, FILE *f, const char *what);
#define xfopen(path, mode) xfopen_at(__FILE__, __LINE__, (path), (mode))
#define xfread(p, s, n, f, what) xfread_at(__FILE__, __LINE__, (p), (s), (n), (f), (what))
#define xfwrite(p, s, n, f, what) xfwrite_at(__FILE__, __LINE__, (p), (s), (n), (f), (what))

// Reads a whole file into a malloc'd buffer (NUL-terminated for convenience); dies naming the path.
char *read_file(const char *path, size_t *len);

double now_seconds(void);  // monotonic wall clock

// Small deterministic RNG (splitmix64 seeding + xoshiro256**), used for init and data shuffling.
typedef struct {
  uint64_t s[4];
} Rng;
void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_u64(Rng *r);
float rng_uniform(Rng *r);  // [0, 1)
float rng_normal(Rng *r);   // N(0, 1), Box-Muller

// 64-bit checksum of a buffer (four multiply-rotate lanes over 8-byte words, then an avalanche).
// Used by shards and checkpoints; fast enough for multi-GB buffers (~several GB/s).
uint64_t hash64(const void *data, size_t len, uint64_t seed);
// The same hash over data that arrives in pieces: begin, update with the pieces in order, final gives
// hash64 of their concatenation (any split).
typedef struct {
  uint64_t lane[4], len;
  unsigned char tail[32];  // bytes of the next 32-byte block so far
  int ntail;
} Hash64Stream;
Hash64Stream hash64_begin(uint64_t seed);
void hash64_update(Hash64Stream *s, const void *data, size_t len);
uint64_t hash64_final(const Hash64Stream *s);
// run/manifest.h's file_checksum of bytes as they stream by (a writer feeding every byte it writes, in
// order), so nobody reads the file back: hash64 of the hash64s of consecutive chunk_bytes-byte chunks,
// each seeded with its offset, the list folded into its first entry when it reaches 512.
// chunk_bytes: FILE_CHECKSUM_CHUNK (file_checksum's), smaller only in tests.
#define FILE_CHECKSUM_CHUNK (64ull << 20)
typedef struct {
  Hash64Stream cur;  // the chunk being hashed
  uint64_t hashes[512], total, chunk_bytes, in_chunk;
  size_t nh;
} ChunkHasher;
void chunk_hasher_init(ChunkHasher *h, uint64_t chunk_bytes);
void chunk_hasher_update(ChunkHasher *h, const void *data, size_t len);
void chunk_hasher_final(ChunkHasher *h, uint64_t *checksum, uint64_t *bytes);
// The list's rule, for a writer that hashes the chunks itself (in parallel): appends one chunk's hash
// (hash64 of its bytes seeded with its offset) to hashes[0..*nh), 512 entries, folding it when full.
// The checksum is then hash64(hashes, *nh * 8, total bytes).
void chunk_hashes_push(uint64_t *hashes, size_t *nh, uint64_t chunk_hash);

// Formats a one-line error into err (when err is not NULL) and returns -1: `return set_err(...)`.
int set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// mkdir -p: creates dir and its missing parents. Returns 0, or -1 with a message naming the path.
int make_dirs(const char *dir, char *err, size_t errlen);

// Durable writes (run/checkpoint.c's saves and common/gemm_plans.c's record use them).
// write_all_fd: n bytes to fd, looping over partial writes and EINTR, at most 64 MiB per call (Linux
// caps one write near 2 GiB). 0, or -1 with errno set (ENOSPC for a write of zero bytes).
int write_all_fd(int fd, const void *buf, uint64_t n);
// fsync of a directory: makes a rename in it durable. File systems that cannot sync a directory
// answer EINVAL; that counts as done. 0, or -1 with errno set.
int fsync_dir(const char *dir);
// A small whole file written atomically: path.tmp, fsync, rename over path, fsync of its folder (which
// must exist). A crash leaves the old file or the new one, never a torn one. 0, or -1 with err
// naming the path.
int write_file_atomic(const char *path, const void *data, size_t bytes, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
