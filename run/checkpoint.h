// run/checkpoint.h: a checkpoint is one file of named, checksummed byte sections. The container is
// generic: the training loop decides what goes in (parameters, optimizer state, loader and RNG
// state, run metadata). The byte layout is specified in docs/checkpoint_format.md.
//
// Files are dir/ckpt_<step, 8+ digits>.bin. A save writes a temporary file in the same directory,
// syncs it and renames it into place, so a crash never leaves a half-written file under the final
// name. One process writes a given directory.
//
// Every function returns 0 on success or -1 with a one-line message in err naming the file (and
// the section or field) involved; none of them dies on bad input or I/O errors.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_NAME_MAX 63  // longest section name, in bytes

typedef struct {
  const char *name;  // 1..CKPT_NAME_MAX bytes, unique within a checkpoint
  void *data;        // save: read from here; load: filled here (may be NULL when bytes == 0)
  size_t bytes;
} CkptSection;

// Writes dir/ckpt_<step>.bin holding secs[0..n) in that order (mkdir -p dir first). Temp files
// left by an interrupted earlier save are removed first. After the new file is durable, prunes:
// the just-written checkpoint plus the newest keep-1 other complete ones (by step) stay, older
// complete ones are deleted; keep <= 0 keeps all. Files whose header does not verify are neither
// counted nor deleted (a warning names them). On failure the temp file is removed, existing
// checkpoints are untouched, and -1 is returned with the path and strerror in err.
int ckpt_save(const char *dir, int64_t step, const CkptSection *secs, int n, int keep, char *err, size_t errlen);
// ckpt_save that also gives the written file's file_checksum (run/manifest.h) and size, hashed in parallel
// from the bytes in memory (its 64 MiB chunks, listed as common.h's ChunkHasher lists them): a sharded
// save's manifest entry without reading the file back.
int ckpt_save_sum(const char *dir, int64_t step, const CkptSection *secs, int n, int keep, uint64_t *file_sum,
                  uint64_t *file_bytes, char *err, size_t errlen);
// A sharded run's pruning of one rank's directory, once the manifest of keep_step is written (which
// pruned the manifests): deletes the complete checkpoints older than keep_step whose step listed() says
// no manifest names. Newer ones (a step whose manifest a crash never wrote) are left alone and, unlike
// ckpt_save's count, never cost an older step that a kept manifest names its files.
void ckpt_prune_unlisted(const char *dir, int64_t keep_step, int (*listed)(int64_t step, void *ctx), void *ctx);

// Finds the newest checkpoint in dir (by step) that fully verifies (header, file size, every
// section's checksum, and a step that matches the file name); newer ones that fail are skipped
// with a warning on stderr naming them. Temp and other files are ignored. Returns 0 and fills
// path/step when found, 1 when there is none (or dir does not exist), -1 on an error (reason on
// stderr). Verifying reads every byte of the candidate file.
int ckpt_latest(const char *dir, char *path, size_t pathlen, int64_t *step);

// Loads the requested sections from path: each secs[i].name must exist in the file with exactly
// secs[i].bytes bytes, and its data is read into secs[i].data and checked against its checksum.
// Sections in the file that are not requested are allowed and skipped (not read, not verified),
// so a tool can load "params" alone. *step (if not NULL) gets the checkpoint's step. On a checksum
// error the destination buffer holds the bad bytes; the caller must not use it.
int ckpt_load(const char *path, CkptSection *secs, int n, int64_t *step, char *err, size_t errlen);

// Reads one section into a new malloc'd buffer (*data, caller frees; *bytes its size), verified.
// Meant for small metadata (e.g. a config section to compare before loading the big ones).
int ckpt_read_section(const char *path, const char *name, void **data, size_t *bytes, char *err, size_t errlen);

// Checks the header, file size and every section checksum of path, without keeping any data.
// *step (if not NULL) gets the step. This is what ckpt_latest runs on each candidate.
int ckpt_verify(const char *path, int64_t *step, char *err, size_t errlen);

// Checks, before a long run, that dir can hold checkpoints: mkdir -p, then create, write, fsync and
// remove a small probe file. Returns 0, or -1 with a message naming the path (a directory that is
// a file, no permission, no space) in err.
int ckpt_probe_dir(const char *dir, char *err, size_t errlen);

// Whether path has a section called name (the header and table are verified, no data is read):
// 0 and *bytes = its size when it has, 1 when it has not, -1 with err when the file is bad. Lets a
// reader accept checkpoints written before a section was added.
int ckpt_section_size(const char *path, const char *name, size_t *bytes, char *err, size_t errlen);

// Test hook: the environment variable TRAIN_CKPT_SLOW_MS=ms makes every ckpt_save take about ms
// milliseconds longer (sleeps between sections, while the temp file is open), so crash tests can
// kill a process in the middle of a save. TRAIN_CKPT_PAUSE=FILE holds every save after the first
// section of its temp file until FILE exists (a line on stderr says so), so that a test can act
// while a partial temp file is on disk. Both are unset in normal runs.

#ifdef __cplusplus
}
#endif
