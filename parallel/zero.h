// parallel/zero.h: ZeRO-1 data parallelism. The AdamW moments m and v exist only for the rank's shard
// of the flat parameter buffer (comm_shard_range), and so, on the CUDA backend (parallel.shard_master,
// the default), do the fp32 master weights: every rank computes with the whole BF16 copy of the
// parameters (the GEMMs, the embedding and the FP4 quantizers read it), and the only fp32 values the
// kernels read are the RMSNorm weights (0.03% of Llama-3 8B), which every rank keeps whole. The
// parameter buffer keeps its addresses; the memory outside what a rank keeps is given back
// (Ops.shard_params). The CPU backend computes with the fp32 values, so there they stay whole on
// every rank. The fp32 gradient buffer is whole everywhere (micro-batches accumulate into it).
//
// One optimizer step:
//   1. reduce the gradients: each rank gets the SUM over ranks of its shard (parallel.grad_reduce:
//      fp32, or BF16 on the wire, parallel/comm.h). With parallel.overlap_reduce, during the LAST
//      micro-batch's backward the model's gradient hook (llama_set_grad_hook) hands each range to
//      the transport as soon as its last contribution is queued; ranges are coalesced into buckets
//      of parallel.bucket_mb, and on NCCL each bucket's reduction runs on the transport's stream
//      while the backward continues. Otherwise the whole buffer is reduced after the backward. The
//      sums are the same bits either way (each element is the same sum of the same values);
//   2. global norm = sqrt(sum over ranks of the shard's sum of squares) / world, because each rank's
//      gradient is already the mean over its micro-batches (dloss = 1/accum), and the global
//      gradient is the mean over ranks; the 1/world is folded into AdamW's grad_scale with the
//      clip factor, so no extra pass over the gradients is made;
//   3. AdamW on the shard, split at tensor boundaries so each piece gets its tensor's decay flag
//      (on the CUDA backend it writes the shard's BF16 copy in the same pass);
//   4. all-gather the updated parameters: with sharded masters the RMSNorm weights in fp32, then the
//      BF16 copy (2 bytes a parameter) in stages, group by group in the next forward's order, which
//      the forward waits for on the GPU group by group (llama_set_param_wait), so the gather overlaps
//      it; otherwise the fp32 parameters, then ops->params_changed(). Either way every rank ends
//      with the same BF16 weights, bit for bit (bf16 of the same fp32).
// With world 1 this is exactly the single-process optimizer (same sums, same bits).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "parallel/comm.h"
#include "model/llama.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  float beta1, beta2, eps, weight_decay, grad_clip;
  int decay_norms;  // weight_decay also on the tensors without ParamTensor.decay (the RMSNorm weights)
} ZeroHyper;

typedef struct {
  int shard_master;  // shard the fp32 master weights where the backend can (parallel.shard_master)
  int overlap;       // reduce during the last micro-batch's backward (parallel.overlap_reduce)
  CommDtype dtype;   // wire type of the gradients (parallel.grad_reduce)
  size_t bucket;     // floats per bucket; 0: every range on its own (parallel.bucket_mb)
} ZeroOptions;

typedef struct {
  const Ops *ops;
  Comm *comm;
  Llama *model;
  ZeroOptions opt;
  size_t n;                // parameters in all
  size_t lo, hi;           // this rank's shard [lo, hi) of the flat buffer
  float *m, *v;            // AdamW moments of the shard (backend memory, hi - lo floats each)
  int sharded;             // the fp32 master weights exist only for [lo, hi) and the norms
  CommRange *fp32_ranges;  // the tensors kept whole in fp32 on every rank (the RMSNorm weights)
  int nfp32;
  size_t released;  // bytes of fp32 parameters given back by the sharding
  // The overlapped reduction of one step: the open bucket and how much the backward handed over.
  CommRange *bucket;
  int nbucket, capbucket;
  size_t bucket_len, handed;
  int state;  // ZERO_IDLE, ZERO_HOOKED (the last micro-batch runs), ZERO_REDUCED
  // The embedding rows the step's tokens touch on this rank (zero_note_tokens), one bit per row:
  // the overlapped reduction moves only the rows some rank touched (the others are zero everywhere).
  uint64_t *rows;
  uint32_t *row_list;  // the touched rows in order (host scratch for comm_reduce_rows)
  size_t nrows_words;
  int micros, notes;                       // micro-batches begun this step, and how many noted their tokens
  size_t embed_off, embed_len, embed_dim;  // the embedding table in the flat buffer (floats)
} Zero;

enum { ZERO_IDLE, ZERO_HOOKED, ZERO_REDUCED };

// Allocates and zeroes the shard's moments, and shards the fp32 master weights when opt asks for it,
// world > 1, the collectives run on device memory and the backend can (Ops.shard_params): call it
// after the parameters are initialized (later uploads of whole parameters, resume or init_from,
// still work). opt NULL: fp32 gradients, no overlap, masters whole.
Zero *zero_create(Llama *model, const Ops *ops, Comm *comm, const ZeroOptions *opt);
void zero_free(Zero *z);

// Before micro-batch `micro` (0-based) of `accum` of a step: on the last one, with overlap and
// world > 1, installs the gradient hook that starts the reduction during its backward.
void zero_begin_micro(Zero *z, int micro, int accum);
// The input tokens [N] (host) of the micro-batch about to run: the embedding rows it touches. Only
// those rows' gradients are non-zero (the embedding backward is a scatter into a zeroed table), so
// the overlapped reduction of the embedding moves the rows that some rank's tokens touched this
// step, instead of the whole [V, D] table (bit-identical sums: the rest is zero on every rank).
// Without it the whole table is reduced. A no-op unless the reduction overlaps the backward of a
// run with world > 1.
void zero_note_tokens(Zero *z, const int *tokens, int N);
// After the step's last backward, on every rank whatever its loss: finishes the reduction (waits
// for the overlapped one, or reduces the whole buffer). Afterwards this rank's shard of
// llama_grads() holds the sum over ranks. A no-op with world 1.
void zero_reduce_grads(Zero *z);

// One step at 1-based AdamW step t (reduces first if zero_reduce_grads was not called). *norm_out
// gets the global gradient norm (identical on every rank). Returns -1, with the parameters
// untouched on every rank, when that norm is not finite.
int zero_step(Zero *z, const ZeroHyper *h, float lr, int64_t t, float *norm_out);

// All the fp32 parameters, in backend memory, for a checkpoint: llama_params() when this rank holds
// them; with sharded masters, the ranks' shards all-gathered into the gradient buffer, whose
// contents are dead between optimizer steps (the next step's first backward overwrites them).
// Collective: every rank calls it, between steps only.
const float *zero_full_params(Zero *z);

#ifdef __cplusplus
}
#endif
