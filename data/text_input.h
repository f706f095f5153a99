// data/text_input.h: the text inputs of `./train tokenize`, read in blocks for the tokenize pipeline.
//
// One reader at a time per input; what it does is only framing, so that everything per document
// (JSON parsing, validation, encoding) can run in parallel on the blocks it returns:
//   .jsonl, .jsonl.zst, .jsonl.gz, .json.gz   whole lines (decompressed), about `target` bytes at a
//                                            time, cut after a '\n' (a longer line is read whole)
//   .txt                                     the whole file: one document
//   .parquet                                 the strings of the next rows of the text column, back
//                                            to back with each row's end (data/parquet_text.h)
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { INPUT_TXT, INPUT_JSONL, INPUT_JSONL_ZST, INPUT_JSONL_GZ, INPUT_PARQUET } InputKind;

// The kind named by the path's extension. Returns 0, or -1 with err naming the file.
int input_kind(const char *path, InputKind *kind, char *err, size_t errlen);

typedef enum { BLOCK_JSON_LINES, BLOCK_DOCUMENT, BLOCK_ROWS } BlockForm;

typedef struct {
  BlockForm form;
  char *bytes;  // whole JSON lines, one document, or rows' texts back to back
  size_t len, cap;
  size_t *ends;  // BLOCK_ROWS: row i is bytes[ends[i - 1] .. ends[i]) (from 0 for i = 0); a null row is empty
  size_t n_rows, rows_cap;
} TextBlock;

typedef struct TextInput TextInput;

// Opens path; field names the JSON member (JSON lines) or the column (parquet) holding the text.
// Returns NULL with err naming the file when it cannot be opened or (parquet) has no such string
// column.
TextInput *text_input_open(const char *path, const char *field, char *err, size_t errlen);
// Replaces b's content with the next block of about target bytes (b's buffers are reused and grown).
// Returns 1, 0 at the end of the input, or -1 with err naming the file (read error, corrupt or
// truncated compressed data, corrupt parquet).
int text_input_read(TextInput *in, TextBlock *b, size_t target, char *err, size_t errlen);
// Bytes of the file consumed so far (for progress; parquet: estimated from the rows read).
uint64_t text_input_position(const TextInput *in);
void text_input_close(TextInput *in);
void text_block_free(TextBlock *b);
