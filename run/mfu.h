// run/mfu.h: model FLOPs utilization, by the two conventions the log reports (docs/logging.md).
//   mfu (the paper's, torchtitan's): FLOPs/token x tokens/s/GPU / PEAK_BF16_FLOPS, with FLOPs/token
//     = 6 (N - N_emb) + 12 L H d_head S (llama_flops_per_token) for every route: "BF16-equivalent",
//     so an FP4 route can pass 100%.
//   mfu_own_peak: the same FLOPs, each priced at the dense peak of the tensor cores its GEMM runs on:
//     tokens/s/GPU x sum over the parts of FLOPs_part / peak_part. The Fprop, Dgrad and Wgrad of a
//     linear layer are 2 FLOPs per weight and token each; those of an MXFP4 block on the FP8 back end
//     run on FP8 tensor cores, everything else (BF16 blocks, NVFP4 through BF16 GEMMs on Hopper, the
//     output head, attention, the norms) on BF16 ones. For a BF16 run both figures are equal.
// The peaks are the H200's (and H100 SXM's), the GPU these figures are measured on; the native FP4
// back end (Blackwell) has none here, so its own-peak MFU is not computed.
#pragma once
#include <stddef.h>

#include "fp4/recipe.h"
#include "model/llama_config.h"

// H200 SXM dense FP8 tensor-core peak, FLOP/s (the datasheet's 3,958 TFLOP/s with sparsity, halved);
// PEAK_BF16_FLOPS (model/llama_config.h) is its BF16 twin.
#define PEAK_FP8_FLOPS 1979e12

typedef struct {
  double flops_per_token;  // the paper's count
  double bf16_flops;       // of those, per token, on BF16 tensor cores (or CUDA cores: norms)
  double fp8_flops;        // on FP8 tensor cores (MXFP4 through the FP8 embedding)
  double fp4_flops;        // on FP4 tensor cores (no peak known here)
} Mfu;

// The split of one token's FLOPs for this model, sequence length and resolved recipe (NULL: BF16).
Mfu mfu_model(const LlamaConfig *c, int seq_len, const Recipe *r);
// The paper's MFU (a fraction) at tok_s tokens/s per GPU.
double mfu_paper(const Mfu *m, double tok_s);
// Against each part's own peak (a fraction); 0 when some FLOPs run at a peak not known here (FP4).
double mfu_own_peak(const Mfu *m, double tok_s);
// One line naming both conventions with this run's figures, for the banner and the JSONL header.
void mfu_describe(const Mfu *m, char *buf, size_t len);
