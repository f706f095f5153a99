// data/prepare.h: data preparation, text corpora -> token shards (`./train tokenize`).
//
// Inputs (data/text_input.h): .txt (the whole file is one document); .jsonl, .jsonl.zst, .jsonl.gz
// and .json.gz (one JSON object per line; its "text" member, or --text-field's, is the document;
// blank lines are skipped; compressed files are stream-decompressed); .parquet (the "text" column,
// or --text-field's, read row group by row group; null rows count as empty documents).
// Each non-empty document becomes BOS, tokens..., EOS (empty documents are skipped and counted).
// Documents go, in input order, to PREFIX_train_NNNNNN.bin or to PREFIX_val_NNNNNN.bin:
//   --val-docs N      the first N non-empty documents are validation;
//   --val-fraction F  a document is validation iff the top 53 bits of hash64(its text,
//                     PREPARE_VAL_HASH_SEED), as a fraction of 2^53, are below F: the split
//                     depends only on content (not on order, thread count or batch size).
// Every shard except the last of each split holds exactly shard_tokens tokens, so documents may
// straddle two shards. All threads share the work through a pipeline without barriers (prepare.c):
// readers frame blocks of about 1 MB (one per input at a time, a few inputs at once), any thread
// parses and encodes them, a serial writer frames their documents in input order, and each shard's
// file is written by a task of its own. Output is identical for any thread count.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define PREPARE_VAL_HASH_SEED 0x5EEDull

typedef struct {
  const char *tokenizer_path;  // tokenizer.model
  const char *pattern_path;    // NULL: the built-in Llama-3 pattern
  const char *const *inputs;
  int n_inputs;
  const char *output_prefix;
  uint64_t shard_tokens;   // tokens per shard (default 100M)
  uint64_t val_docs;       // first N documents to validation (exclusive with val_fraction)
  double val_fraction;     // or a content-hash fraction in [0, 1]
  int zstd_level;          // 0 = raw shards
  int threads;             // 0 = OpenMP's default
  int quiet;               // no progress lines on stderr (and no summary from tokenize_main)
  const char *part_tag;    // --part: "p003" puts PREFIX_train_p003_000000.bin, ... (NULL: PREFIX_train_000000.bin)
  const char *text_field;  // JSON member / parquet column holding the text (NULL: "text")
} PrepareOptions;

typedef struct {
  uint64_t docs[2], tokens[2];  // [0] train, [1] validation; tokens include BOS/EOS
  int shards[2];
  uint64_t empty_docs, input_bytes;  // input_bytes: document text bytes tokenized
  double seconds;                    // from the tokenizer loaded to the last shard written
  int threads;
} PrepareStats;

// Tokenizes the inputs into shards. Returns 0, or -1 with a message in err naming the file (and
// line) for input errors: missing file, unsupported extension, bad JSON, a line without "text",
// corrupt or truncated compressed data, a parquet file without the text column or with a corrupt
// page, parquet input to a build without the parquet reader. Shard I/O errors die (see
// data/shard.h). After an input error the shards written so far stay on disk (each valid, the set
// incomplete): rerun after fixing the input.
int prepare_run(const PrepareOptions *opt, PrepareStats *stats, char *err, size_t errlen);

// The `./train tokenize` subcommand (argv[0] == "tokenize"); returns the process exit code.
//   tokenize --tokenizer PATH [--pattern PATH] --text STRING       ids of STRING on one line
//   tokenize --tokenizer PATH [--pattern PATH] --input F [--input F ...] --output PREFIX
//            [--shard-tokens N] [--val-docs N | --val-fraction F] [--zstd L] [--text-field NAME]
//            [--threads N] [--quiet]
int tokenize_main(int argc, char **argv);
