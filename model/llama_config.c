// model/llama_config.c: presets and counting. See llama_config.h.
#include "model/llama_config.h"

#include <stdio.h>
#include <string.h>

// The presets as data: what differs between them; the rest is Llama-3's (below).
static const struct {
  const char *name;
  int vocab_size, dim, n_layers, n_heads, n_kv_heads, ffn_dim, max_seq_len, rope_scaling;
  float rope_theta;
} PRESETS[] = {
    {"tiny", 512, 64, 2, 4, 2, 192, 64, 0, 10000.0f},              // trains on 2 CPU cores in well under a minute
    {"small", 128256, 1024, 12, 16, 4, 2816, 2048, 0, 500000.0f},  // ~135M in the blocks, Llama-3 tokenizer
    {"llama3_8b", 128256, 4096, 32, 32, 8, 14336, 8192, 1, 500000.0f},
};

int llama_preset(const char *name, LlamaConfig *c) {
  memset(c, 0, sizeof *c);
  for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++) {
    if (strcmp(name, PRESETS[i].name)) continue;
    c->vocab_size = PRESETS[i].vocab_size, c->dim = PRESETS[i].dim, c->n_layers = PRESETS[i].n_layers;
    c->n_heads = PRESETS[i].n_heads, c->n_kv_heads = PRESETS[i].n_kv_heads, c->ffn_dim = PRESETS[i].ffn_dim;
    c->max_seq_len = PRESETS[i].max_seq_len, c->rope_scaling = PRESETS[i].rope_scaling;
    c->rope_theta = PRESETS[i].rope_theta;
    c->norm_eps = 1e-5f;
    c->rope_factor = 8.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_original_max_pos = 8192;
    return 0;
  }
  return -1;
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

int llama_recompute_parse(const char *name) {
  if (!strcmp(name, "none")) return LLAMA_RECOMPUTE_NONE;
  if (!strcmp(name, "ffn")) return LLAMA_RECOMPUTE_FFN;
  if (!strcmp(name, "full")) return LLAMA_RECOMPUTE_FULL;
  int n = 0, used = 0;
  if (sscanf(name, "selective_%d%n", &n, &used) == 1 && !name[used] && n >= 1 && n < (1 << 20))
    return LLAMA_RECOMPUTE_SELECTIVE(n);
  return -1;
}

const char *llama_recompute_name(int recompute) {
  static const char *names[] = {"none", "ffn", "full"};
  static _Thread_local char sel[32];
  if (recompute > LLAMA_RECOMPUTE_SELECTIVE_BASE) {
    snprintf(sel, sizeof sel, "selective_%d", recompute - LLAMA_RECOMPUTE_SELECTIVE_BASE);
    return sel;
  }
  return recompute >= 0 && recompute <= LLAMA_RECOMPUTE_FULL ? names[recompute] : "?";
}
