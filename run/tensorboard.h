// run/tensorboard.h: TensorBoard event files, written by the engine itself (no TensorFlow, no Python).
// An event file is a sequence of TFRecords, each
//   uint64 length | uint32 masked CRC32C of those 8 bytes | data | uint32 masked CRC32C of the data
// (little-endian; masked = rotate right by 15, add 0xa282ead8), whose data is one Event protocol
// buffer, encoded here by hand with TensorFlow's field numbers (event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record holds file_version "brain.Event:2"; every later one the scalars of one step.
// docs/logging.md has the layout with an example's bytes.
#pragma once
#include <stddef.h>
#include <stdint.h>

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), continuing crc (0 to start):
// crc32c(crc32c(0, a), b) is the CRC of a followed by b. crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c(uint32_t crc, const void *data, size_t n);
// The TFRecord mask of a CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t tb_mask_crc(uint32_t crc);

typedef struct TbWriter TbWriter;

// Starts a new event file events.out.tfevents.<unix time>.<hostname>.<pid>.<n> in dir (made when
// missing) for a run whose steps come after from_step (0: a fresh run; else the step it resumed
// at). Earlier event files in dir are first cut at from_step (tb_cut_file), so that across the
// files no step appears twice. NULL with a message naming the folder or file on failure.
TbWriter *tb_open(const char *dir, int64_t from_step, char *err, size_t errlen);
const char *tb_path(const TbWriter *w);  // the file it writes
// Adds a scalar to the pending event (one Summary.Value).
void tb_scalar(TbWriter *w, const char *tag, float value);
// Writes the pending scalars as one Event of this step (nothing when none are pending); buffered.
void tb_event(TbWriter *w, int64_t step, double wall_time);
// Hands the written records to the OS; with sync also fsyncs the file. Dies naming the file on an
// I/O error (a full disk), as a failed checkpoint save does.
void tb_flush(TbWriter *w, int sync);
void tb_close(TbWriter *w);

// Keeps the records of an existing event file up to the last one whose step is <= max_step and
// truncates the rest (and anything after a torn or corrupt record, a killed writer's last one).
// A file left with no scalars is removed. Returns the scalar events kept, or -1 with a message.
int tb_cut_file(const char *path, int64_t max_step, char *err, size_t errlen);
