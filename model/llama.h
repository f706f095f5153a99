// model/llama.h: the Llama-3 model: parameters, activations, forward and backward, computed as
// Hugging Face transformers' LlamaForCausalLM does (untied head, GQA, RoPE with optional Llama-3.1
// scaling, SwiGLU, RMSNorm). The math runs through a backend's Ops table (model/ops.h); with
// the CPU backend everything lives in host memory in fp32.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "model/llama_config.h"
#include "model/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// One named tensor of the parameter (and, same layout, gradient) buffer. Per-layer kinds are
// stacked over layers, like llm.c: wq is [L, H*hd, D], layer l at offset + l * numel / L.
// offset and numel count floats. decay is 0 for RMSNorm weights, 1 for everything else.
typedef struct {
  const char *name;
  int ndim;
  int64_t shape[4];
  size_t offset, numel;
  int decay;
} ParamTensor;

typedef struct Llama Llama;

// A model for micro-batches of B sequences of T tokens (T <= c->max_seq_len). Dies with a message
// naming the offending field if the config is inconsistent. ops must outlive the model.
Llama *llama_create(const LlamaConfig *c, int B, int T, const Ops *ops);

// llama_create with a recompute mode (llama_create means LLAMA_RECOMPUTE_NONE). Dies on an
// unknown mode.
Llama *llama_create_ex(const LlamaConfig *c, int B, int T, const Ops *ops, int recompute);
// Bytes of the activation arena (saved activations and scratch) for this model's B, T and mode. With
// recompute none, a block whose linears' backend keeps a quantized copy of their input for the
// backward (Ops.linear_saves_input; the FP4 recipes on the CUDA backend, fixed when the model is
// created, so set the recipe first) does not keep that BF16 input: _plain is the arena with every
// BF16 input kept (what the BF16 recipe uses); the quantized copies are the backend's memory.
size_t llama_activation_bytes(const Llama *m);
size_t llama_activation_bytes_plain(const Llama *m);
void llama_free(Llama *m);
const LlamaConfig *llama_config(const Llama *m);

// HF's init: normal(0, 0.02) for embeddings and linear weights, 1 for RMSNorm weights.
// Deterministic in seed, independent of the thread count.
void llama_init(Llama *m, uint64_t seed);

// The fp32 parameters and gradients, in backend memory (host memory for the CPU backend), laid out as
// the tensor table says: tok_embedding [V, D]; attn_norm [L, D]; wq [L, H*hd, D];
// wk, wv [L, KV*hd, D]; wo [L, D, H*hd]; ffn_norm [L, D]; w_gate, w_up [L, F, D];
// w_down [L, D, F]; final_norm [D]; head [V, D]. Weights are [out, in] as in PyTorch, so a HF
// checkpoint maps onto them by plain copies.
float *llama_params(Llama *m);
float *llama_grads(Llama *m);
size_t llama_param_count(const Llama *m);
int llama_num_tensors(const Llama *m);
const ParamTensor *llama_tensor(const Llama *m, int i);
const ParamTensor *llama_find_tensor(const Llama *m, const char *name);  // NULL if no such tensor

// Document masking (model.doc_mask, model.doc_positions, model.bos_id; docs/data.md "Document
// masking"). Off by default: one document per row, plain causal attention, positions 0..T-1. With
// block_causal, attention does not cross a document boundary: a document starts at every bos_id
// token of a row and at the row's first token. With restart_positions, RoPE positions restart at 0
// at each document's first token (the tokens before a row's first BOS keep their row positions).
// Every forward from then on (training, evaluation, llama_logits) derives the documents from its
// input ids, once per micro-batch (model/doc_mask.h). Dies on a bos_id outside the vocabulary.
typedef struct {
  int block_causal;       // model.doc_mask: block_causal (1) or none (0)
  int restart_positions;  // model.doc_positions: restart (1) or continue (0)
  int bos_id;             // model.bos_id: the token that starts a document
} LlamaDocs;
void llama_set_docs(Llama *m, const LlamaDocs *d);

// Runs the micro-batch inputs [B*T] (host memory) through the model and returns the mean
// cross-entropy over targets [B*T] that are not ignore_index (0 if none are). Positions restart
// at 0 for every sequence. Saves what llama_backward needs; on its own it is the eval pass.
float llama_forward(Llama *m, const int *inputs, const int *targets, int ignore_index);

// Gradients of the last llama_forward, scaled by dloss = d(objective)/d(mean loss), e.g.
// 1/grad_accum_steps, ADDED to llama_grads(). The head's logits are recomputed chunk by chunk.
void llama_backward(Llama *m, float dloss);
// A training micro-batch in one call: llama_forward then llama_backward, but with the head's logits
// computed once (the fused head produces the loss and its gradient together). Returns the loss.
float llama_forward_backward(Llama *m, const int *inputs, const int *targets, int ignore_index, float dloss);
void llama_zero_grad(Llama *m);

// Gradient-ready notifications, for communication that overlaps the backward (parallel/zero.h): during
// every llama_backward / llama_forward_backward, fn(ctx, offset, len) is called once for each range
// [offset, offset + len) of llama_grads() (floats) as soon as the ops that produce its last
// contribution of this backward have been issued: the head and final norm first, then each block's
// nine slices from the last block down, the embedding last. The ranges tile the whole buffer
// exactly once per backward. On an asynchronous backend the work is queued, not finished: fn must
// order itself after it (e.g. by an event on the compute stream). fn NULL turns it off.
typedef void (*LlamaGradHook)(void *ctx, size_t offset, size_t len);
void llama_set_grad_hook(Llama *m, LlamaGradHook fn, void *ctx);

// Parameter-ready waits, for an all-gather of updated parameters that overlaps the next forward
// (parallel/zero.c): every forward calls fn(ctx, group) before it first reads group's parameters:
// group 0 the embedding, 1 + l block l, n_layers + 1 the final norm and the head. On an
// asynchronous backend fn orders the work queued next after the parameters' arrival (a GPU-side
// wait). fn NULL turns it off. llama_param_group fills the ranges [off[i], off[i] + len[i]) of
// llama_params() (floats) that group holds, at most LLAMA_GROUP_RANGES, and returns their count.
// A view of each block linear's Dgrad for diagnostics (run/dgrad_diag.c): before the backward runs
// linear id's matmul_bwd, fn(ctx, id, dout, w, N, in, out_dim) sees its output gradient dout [N, out_dim]
// (backend memory, Ops.act_bytes per element) and its fp32 weight w [out_dim, in]. fn NULL turns it off.
typedef void (*LlamaLinearTap)(void *ctx, LinearId id, const void *dout, const float *w, int N, int in, int out_dim);
void llama_set_linear_tap(Llama *m, LlamaLinearTap fn, void *ctx);

typedef void (*LlamaParamWait)(void *ctx, int group);
void llama_set_param_wait(Llama *m, LlamaParamWait fn, void *ctx);
enum { LLAMA_GROUP_RANGES = 9 };
int llama_param_group(const Llama *m, int group, size_t *off, size_t *len);

// Chosen tokens' losses, for evaluations: one forward of inputs [B*T], then nll[i] = -log p(targets[i] |
// inputs up to flat position pos[i]) for i < n, as host floats. A position may be asked for several
// times (one context, several one-token continuations); only the n asked positions go through the
// head, and no [B*T, V] logits leave the device. Dies on a position or target out of range.
void llama_token_nll(Llama *m, const int *inputs, int n, const int *pos, const int *targets, float *nll);

// The logits of inputs [B*T] as host floats, out [B*T, V] (for comparisons with HF).
void llama_logits(Llama *m, const int *inputs, float *out);

#ifdef __cplusplus
}
#endif
