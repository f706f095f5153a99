// model/llama_config.h: the Llama-3 architecture hyperparameters, presets, parameter count and the
// paper's FLOPs-per-token formula.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int vocab_size;
  int dim;  // d_model
  int n_layers;
  int n_heads;      // query heads
  int n_kv_heads;   // key/value heads (GQA); n_heads % n_kv_heads == 0
  int ffn_dim;      // SwiGLU hidden size
  int max_seq_len;  // largest sequence the RoPE tables cover
  float norm_eps;   // RMSNorm epsilon
  float rope_theta;
  // Llama-3.1 RoPE frequency scaling (HF rope_type "llama3"); off when rope_scaling == 0.
  int rope_scaling;
  float rope_factor;
  float rope_low_freq_factor;
  float rope_high_freq_factor;
  int rope_original_max_pos;
} LlamaConfig;

static inline int llama_head_dim(const LlamaConfig *c) { return c->dim / c->n_heads; }

// Fills *c from a preset name: "tiny" (CPU tests/demo), "small" (~150M non-embedding, replication),
// "llama3_8b" (Llama-3.1-8B). Returns 0 on success, -1 if the name is unknown.
// Activation recomputation (parallel.recompute): trade backward compute for activation memory.
// none: the forward saves every block's activations. ffn: each block keeps its attention half's
// activations but not the FFN's (rmsnorm, gate, up, swiglu: about 3F + D values per token); the
// backward recomputes them, one block at a time, into one set of scratch buffers. full: only each
// block's input is kept; the backward reruns the whole block forward before its backward.
// selective_N (the paper's "selective-N", TorchTitan's layer-wise checkpointing): blocks 1..L counted
// from 1, every block whose number is a multiple of N is recomputed as in full, the others keep
// everything (N = 1 is full; N > L keeps every block, as none).
// The math is the same in every mode: the ops are deterministic, so losses and gradients are
// bit-identical (the CPU backend's tests check it).
typedef enum { LLAMA_RECOMPUTE_NONE, LLAMA_RECOMPUTE_FFN, LLAMA_RECOMPUTE_FULL } LlamaRecompute;
// The mode of selective_N: LLAMA_RECOMPUTE_SELECTIVE(N), N >= 1.
#define LLAMA_RECOMPUTE_SELECTIVE_BASE 1000
#define LLAMA_RECOMPUTE_SELECTIVE(n) (LLAMA_RECOMPUTE_SELECTIVE_BASE + (n))
// "none", "ffn", "full", "selective_N" -> the mode, or -1 for anything else.
int llama_recompute_parse(const char *name);
const char *llama_recompute_name(int recompute);

int llama_preset(const char *name, LlamaConfig *c);
const char *llama_preset_names(void);  // "tiny, small, llama3_8b" for error messages

int64_t llama_num_params(const LlamaConfig *c);            // all parameters (embedding, blocks, norm, head)
int64_t llama_num_embedding_params(const LlamaConfig *c);  // the input embedding only (paper's N_emb)
// The paper's (torchtitan's) convention: 6*(N - N_emb) + 12*L*H*d_head*S.
double llama_flops_per_token(const LlamaConfig *c, int seq_len);
// The MFU denominator of the paper's formula: H200 (and H100 SXM) dense BF16 peak, FLOP/s.
#define PEAK_BF16_FLOPS 989e12

#ifdef __cplusplus
}
#endif
