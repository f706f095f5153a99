// run/ckpt_async.h: asynchronous checkpoint saves (checkpoint.async). A save is cut in two:
// ckpt_writer_submit copies every section into the writer's staging buffer (the stall: the caller
// waits only for these copies, device-to-host downloads into pinned memory on a GPU), then one
// background thread writes the file with ckpt_save (checksums, temp file, fsync, rename, prune)
// while the caller goes on changing the state the copies were taken from. The file therefore holds
// the state at the moment of the submit, never a mix with later changes.
//
// One save at a time: a submit is refused while the previous save is pending (written, or written
// and not yet collected with ckpt_writer_wait), so two writes never overlap and no result is lost.
// A kill during the write leaves what ckpt_save leaves: the temp file (ignored at load, removed by
// the next save) and the previous checkpoints intact. Every function is called from one thread,
// the writer's owner; the writer keeps no state outside its CkptWriter.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_ASYNC_MAX_SECTIONS 16

// Copies bytes from src (memory of some kind) to host memory dst: a backend's Ops.download for
// device memory has this signature.
typedef void (*CkptCopyFn)(void *ctx, void *dst, const void *src, size_t bytes);

// One section of a save, where its bytes are now.
typedef struct {
  const char *name;  // as CkptSection.name (run/checkpoint.h)
  const void *src;
  size_t bytes;
  CkptCopyFn copy;  // how to copy them to host memory; NULL: memcpy (src is host memory)
  void *copy_ctx;
} CkptSource;

// What became of a save.
typedef struct {
  int64_t step;
  int failed;                // 1: err says why; the earlier checkpoints are intact
  char err[1024];            // ckpt_save's message
  char path[4200];           // dir/ckpt_<step, 8 digits>.bin
  double stall_s, write_s;   // the copies in ckpt_writer_submit; the background write
  uint64_t checksum, bytes;  // the file's size; with file_checksum its run/manifest.h file_checksum, hashed from memory
} CkptResult;

typedef struct CkptWriter CkptWriter;

// The staging room that sections of these sizes take (each starts at a 64-byte boundary): size the
// buffer given to ckpt_writer_open with it.
size_t ckpt_stage_bytes(const size_t *bytes, int n);

// Staging memory of stage_bytes: pinned by alloc(ctx, bytes) where alloc is given and succeeds (a
// backend's Ops.host_alloc), else pageable memory touched now, since a first save would otherwise pay
// every page fault inside its stall. *pinned says which; free it with ckpt_stage_free.
void *ckpt_stage_alloc(void *(*alloc)(void *ctx, size_t bytes), void *ctx, size_t stage_bytes, int *pinned);
void ckpt_stage_free(void (*free_pinned)(void *ctx, void *p), void *ctx, void *stage, int pinned);

// Starts the writer's thread. stage (stage_bytes of host memory, owned by the caller and kept until
// ckpt_writer_close) receives the copies; pinned memory makes a device's downloads fastest.
CkptWriter *ckpt_writer_open(void *stage, size_t stage_bytes);

// Copies src[0..n) into the stage (in order, on the calling thread), then hands the write of
// dir/ckpt_<step>.bin to the thread (ckpt_save with keep; with file_checksum, also the checksum of
// the whole file for a manifest, hashed from memory, not read back) and returns. *stall_s (if not NULL) gets the
// copies' time. Returns 0, or -1 with err when a save is still pending, when there are more than
// CKPT_ASYNC_MAX_SECTIONS sections or when they do not fit the stage (nothing is submitted then).
int ckpt_writer_submit(CkptWriter *w, const char *dir, int64_t step, const CkptSource *src, int n, int keep,
                       int file_checksum, double *stall_s, char *err, size_t errlen);

// 1 while a submitted save is being written, 0 once it is done (or when none was submitted);
// never blocks.
int ckpt_writer_busy(CkptWriter *w);

// Waits until the submitted save is written, then hands over its result: returns 1 and fills *res,
// or 0 when there is no save to collect. After it the next submit may start.
int ckpt_writer_wait(CkptWriter *w, CkptResult *res);

// Lets a pending write finish (its result is dropped: collect it first), stops the thread and frees
// the writer (not the stage).
void ckpt_writer_close(CkptWriter *w);
// 1 once ckpt_writer_close has been called on w (which is then waiting for the thread); never blocks.
// For a test that must see close waiting while a write is held.
int ckpt_writer_closing(CkptWriter *w);

#ifdef __cplusplus
}
#endif
