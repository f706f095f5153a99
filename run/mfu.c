// run/mfu.c: the two MFU conventions (run/mfu.h).
#include "run/mfu.h"

#include <stdio.h>

Mfu mfu_model(const LlamaConfig *c, int seq_len, const Recipe *r) {
  Mfu m = {.flops_per_token = llama_flops_per_token(c, seq_len)};
  const double D = c->dim, Q = (double)c->n_heads * llama_head_dim(c), K = (double)c->n_kv_heads * llama_head_dim(c);
  const double block_linear = 2 * Q * D + 2 * K * D + 3.0 * c->ffn_dim * D;  // wq, wo, wk, wv, gate, up, down
  for (int l = 0; r && l < c->n_layers; l++)
    for (int k = 0; k < CONTR_N; k++) {
      FP4Format f = recipe_format(r, l, c->n_layers, (Contraction)k);
      if (f == FMT_BF16) continue;
      if (r->gemm == GEMM_FP4_NATIVE) m.fp4_flops += 2 * block_linear;
      else if (r->gemm == GEMM_FP8_EMBED && f == FMT_MXFP4) m.fp8_flops += 2 * block_linear;
      // else: dequantized to BF16 GEMMs (the reference back end, NVFP4 on Hopper)
    }
  m.bf16_flops = m.flops_per_token - m.fp8_flops - m.fp4_flops;
  return m;
}

double mfu_paper(const Mfu *m, double tok_s) { return tok_s * m->flops_per_token / PEAK_BF16_FLOPS; }

double mfu_own_peak(const Mfu *m, double tok_s) {
  if (m->fp4_flops > 0) return 0;
  return tok_s * (m->bf16_flops / PEAK_BF16_FLOPS + m->fp8_flops / PEAK_FP8_FLOPS);
}

void mfu_describe(const Mfu *m, char *buf, size_t len) {
  int n = snprintf(buf, len,
                   "mfu = the paper's: 6(N - N_emb) + 12 L H d_head S = %.4g GFLOP/token x tok/s/GPU / %.0f TFLOP/s "
                   "(BF16 peak, every route); mfu_own_peak = the same FLOPs at their own tensor cores' peak: ",
                   m->flops_per_token / 1e9, PEAK_BF16_FLOPS / 1e12);
  if (n < 0 || (size_t)n >= len) return;
  if (m->fp4_flops > 0)
    snprintf(buf + n, len - n, "not computed (%.4g GFLOP/token on FP4 tensor cores, whose peak is not known here)",
             m->fp4_flops / 1e9);
  else if (m->fp8_flops > 0)
    snprintf(buf + n, len - n, "%.4g GFLOP/token on FP8 at %.0f TFLOP/s, %.4g on BF16 at %.0f", m->fp8_flops / 1e9,
             PEAK_FP8_FLOPS / 1e12, m->bf16_flops / 1e9, PEAK_BF16_FLOPS / 1e12);
  else snprintf(buf + n, len - n, "all on BF16 at %.0f TFLOP/s (equal to mfu)", PEAK_BF16_FLOPS / 1e12);
}
