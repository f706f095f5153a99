// run/manifest.h: sharded checkpoints of a data-parallel run (ZeRO-1, parallel/zero.h).
// With world > 1 every rank saves its own checkpoint file (run/checkpoint.h) in
// CKPT_DIR/rank_<r>/: rank 0's holds the full parameters, each holds the rank's shard of AdamW m
// and v. Once all are durable, rank 0 writes CKPT_DIR/manifest_<step, 8 digits>.txt (temp file,
// then rename), naming the world size, step and every rank's file with its shard range, size and
// checksum. A step without a manifest is incomplete and ignored. The moments concatenated in rank
// order are the full m and v, whatever the world size, so a run can resume on another world size
// by cutting its own range out of them (manifest_load_moments).
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char path[4096];  // relative to the checkpoint dir in the manifest, full here
  size_t lo, hi;    // the shard of m and v the file holds
  uint64_t bytes, checksum;
} ShardFile;

typedef struct {
  int64_t step;
  int world;
  size_t n;
  ShardFile *files;  // world entries, in rank order
} Manifest;

// Checksum of a whole file: hash64 of the hash64s of its 64 MiB chunks (bounded memory; common.h's
// ChunkHasher, which a writer can also feed as it writes: run/checkpoint.h's ckpt_save_sum).
int file_checksum(const char *path, uint64_t *checksum, uint64_t *bytes, char *err, size_t errlen);
// Writes dir/manifest_<step>.txt atomically, then deletes all but the newest keep manifests
// (keep <= 0 keeps all). m->files[r].path must lie under dir.
int manifest_write(const char *dir, const Manifest *m, int keep, char *err, size_t errlen);
// The newest manifest in dir whose files all exist with the recorded size and checksum (newer
// broken ones are skipped with a warning). 0: found (free with manifest_free), 1: none, -1 error.
int manifest_latest(const char *dir, Manifest *m, char *err, size_t errlen);
// 1 if dir/manifest_<step>.txt exists (not verified), else 0.
int manifest_exists(const char *dir, int64_t step);
// Reads dir/manifest_<step>.txt without verifying the files (the rank that picked it did).
int manifest_read(const char *dir, int64_t step, Manifest *m, char *err, size_t errlen);
void manifest_free(Manifest *m);
// Fills m_out and v_out (host, hi - lo floats) with the range [lo, hi) of the moments stored in
// the sections "adam_m" and "adam_v" of src[0..nsrc), whose ranges must tile [0, n). A file whose
// range is exactly [lo, hi) is read in place; others through a temporary copy of their section.
int manifest_load_moments(const ShardFile *src, int nsrc, size_t lo, size_t hi, float *m_out, float *v_out, char *err,
                          size_t errlen);

#ifdef __cplusplus
}
#endif
