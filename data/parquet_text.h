// data/parquet_text.h: the text column of a parquet file (FineWeb, DCLM and the like), read a few
// MB of rows at a time. A C API over Apache Arrow's C++ parquet reader, built by `make` as a shared
// library of its own (build/libparquet_text.so, from data/parquet_text.cc) when scripts/deps.sh has
// unpacked Arrow's libraries (from the pyarrow wheel, into .deps/arrow); the Makefile then defines
// HAVE_PARQUET and PARQUET_TEXT_SO, its path. data/text_input.c loads it with dlopen when a .parquet
// input is opened, so ./train does not map Arrow's 60 MB of libraries for anything else.
//
// The column must hold strings (parquet BYTE_ARRAY, not repeated: Arrow's string, large_string or
// binary). Rows are read in file order, row group after row group, page by page, so memory stays at
// about a page plus the block asked for, whatever the file's size. A null row reads as an empty text.
// Every error names the file (and the column): a missing column, a column of another type, a file
// that is not parquet or is corrupt or truncated.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/text_input.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ParquetText ParquetText;

// Opens path and finds the string column `column` (a top-level field). NULL with err on failure.
ParquetText *parquet_text_open(const char *path, const char *column, char *err, size_t errlen);
// Replaces b's rows with the next ones: rows are appended until their texts reach target bytes (at
// least one row). b->form is left to the caller. Returns 1, 0 after the last row, or -1 with err.
int parquet_text_read(ParquetText *p, TextBlock *b, size_t target, char *err, size_t errlen);
// File bytes consumed, estimated as the file size times the share of the rows read.
uint64_t parquet_text_position(const ParquetText *p);
void parquet_text_close(ParquetText *p);

#ifdef __cplusplus
}
#endif
