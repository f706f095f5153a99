// run/bench_attention.h: `./train CONFIG --bench-attention [--bench-steps N]`: the cost of document
// masking (model.doc_mask: block_causal). Attention forward and backward at the config's shapes
// (B = batch.micro_batch, T = batch.seq_len, the model's heads and head dim), plain causal and
// document-masked on web-like document lengths, timed in one call on one backend instance.
#pragma once
#include <stdint.h>

#include "model/ops.h"
#include "run/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// Web-like document lengths: log-normal, mean 1,000 tokens, sigma 1 (median ~600, a long tail).
#define WEB_DOC_MEAN 1000.0
#define WEB_DOC_SIGMA 1.0

// tokens [N]: a stream of packed documents, each bos_id then filler ids in [0, vocab) other than
// bos_id, with log-normal lengths (mean_len, sigma; at least 2 tokens), starting part-way into a
// document as a training window does. Deterministic in seed.
void bench_web_documents(int *tokens, int N, int vocab, int bos_id, double mean_len, double sigma, uint64_t seed);

// Prints a table and a "BENCH attention" line per variant; returns 0.
int bench_attention_main(const TrainConfig *cfg, const Ops *ops, int steps);

#ifdef __cplusplus
}
#endif
