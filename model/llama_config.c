// model/llama_config.c: presets and counting. See llama_config.h.
#include "model/llama_config.h"

#include <string.h>

int llama_preset(const char *name, LlamaConfig *c) {
  memset(c, 0, sizeof *c);
  c->norm_eps = 1e-5f;
  c->rope_theta = 500000.0f;
  c->rope_factor = 8.0f;
  c->rope_low_freq_factor = 1.0f;
  c->rope_high_freq_factor = 4.0f;
  c->rope_original_max_pos = 8192;
  if (!strcmp(name, "tiny")) {  // trains on 2 CPU cores in well under a minute
    c->vocab_size = 512;
    c->dim = 64;
    c->n_layers = 2;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->ffn_dim = 192;
    c->max_seq_len = 64;
    c->rope_theta = 10000.0f;
  } else if (!strcmp(name, "small")) {  // ~135M parameters in the blocks, Llama-3 tokenizer
    c->vocab_size = 128256;
    c->dim = 1024;
    c->n_layers = 12;
    c->n_heads = 16;
    c->n_kv_heads = 4;
    c->ffn_dim = 2816;
    c->max_seq_len = 2048;
  } else if (!strcmp(name, "llama3_8b")) {
    c->vocab_size = 128256;
    c->dim = 4096;
    c->n_layers = 32;
    c->n_heads = 32;
    c->n_kv_heads = 8;
    c->ffn_dim = 14336;
    c->max_seq_len = 8192;
    c->rope_scaling = 1;
  } else {
    return -1;
  }
  return 0;
}

const char *llama_preset_names(void) { return "tiny, small, llama3_8b"; }

int64_t llama_num_embedding_params(const LlamaConfig *c) { return (int64_t)c->vocab_size * c->dim; }

int64_t llama_num_params(const LlamaConfig *c) {
  int64_t D = c->dim, hd = llama_head_dim(c), q = (int64_t)c->n_heads * hd, kv = (int64_t)c->n_kv_heads * hd;
  int64_t block = 2 * D + D * q + 2 * D * kv + q * D + 3 * D * (int64_t)c->ffn_dim;
  return 2 * llama_num_embedding_params(c) + c->n_layers * block + D;
}

double llama_flops_per_token(const LlamaConfig *c, int seq_len) {
  double n = (double)(llama_num_params(c) - llama_num_embedding_params(c));
  return 6.0 * n + 12.0 * c->n_layers * c->n_heads * llama_head_dim(c) * (double)seq_len;
}
