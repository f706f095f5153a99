// run/dgrad_diag.h: the paper's Dgrad diagnostic (./train CONFIG --dgrad-diagnostic N): MXFP4 against
// CTA-local NVFP4 Dgrads on the model's own backward tensors (see dgrad_diag.c).
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "model/cpu/linear_fp4.h"
#include "run/run.h"

// N micro-batches of r's training data through r's model (BF16: r's recipe must be bf16), each block's
// QKV, O and FFN Dgrad recomputed in both formats with `draws` SR draws averaged (Philox seeded by seed)
// on the first `tokens` tokens of each micro-batch, rounded up to whole sequences (0: all of it); prints
// a line per batch, then a table per block and component and a line "DGRAD_DIAG comparisons C,
// CTA-local lower in K, geometric mean E_MX/E_CTA G" (stdout flushed line by line; progress on stderr).
// Returns 0.
int dgrad_diagnostic(Run *r, int batches, int draws, int tokens, uint64_t seed, FILE *out);

// One linear's Dgrad in L's format: for k < draws, est += dX^_k / draws in that order, dX^_k being
// linear_fp4_cpu_backward's for dY [rows, out_dim] and W [out_dim, in] at L->step = step, L->micro = k
// (fresh SR bits per draw).
void dgrad_diag_estimate(const LinearFp4Cpu *L, uint32_t step, LinearId id, float *est, const float *dy, const float *w,
                         int rows, int in, int out_dim, int draws);
