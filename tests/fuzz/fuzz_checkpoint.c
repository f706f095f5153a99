// tests/fuzz/fuzz_checkpoint.c: the checkpoint reader on arbitrary files: ckpt_verify, ckpt_load,
// ckpt_read_section, ckpt_section_size and ckpt_latest must return an error with a message (or
// verified data), never crash, leak or read out of bounds. The seeds are small valid checkpoints.
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_util.h"
#include "run/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *p = fuzz_write_file("ckpt_00000001.bin", data, size);
  char path[512], err[1024] = "";
  snprintf(path, sizeof path, "%s", p);
  int64_t step = -1;
  int verified = ckpt_verify(path, &step, err, sizeof err) == 0;
  // The sections of the seeds (docs/checkpoint_format.md's example): a (5 bytes), b (3 bytes).
  char a[5], b[3];
  CkptSection secs[2] = {{"a", a, sizeof a}, {"b", b, sizeof b}};
  // (A file can load and still fail ckpt_verify: sections not requested are not checked.)
  if (ckpt_load(path, secs, 2, NULL, err, sizeof err) && !err[0]) abort();
  void *buf = NULL;
  size_t bytes = 0;
  if (ckpt_read_section(path, "a", &buf, &bytes, err, sizeof err) == 0) {
    if (bytes && !buf) abort();
    free(buf);
  }
  ckpt_section_size(path, "b", &bytes, err, sizeof err);
  char found[1024];
  int64_t latest;
  int rc = ckpt_latest(fuzz_scratch(), found, sizeof found, &latest);
  if (rc == 0 && (!verified || latest != 1)) abort();  // only a verified file with step 1 is picked
  if (rc == 1 && verified && step == 1) abort();
  return 0;
}
