// run/dgrad_diag.h: the paper's Dgrad diagnostic (./train CONFIG --dgrad-diagnostic N): MXFP4 against
// CTA-local NVFP4 Dgrads on the model's own backward tensors (see dgrad_diag.c).
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "run/run.h"

// N micro-batches of r's training data through r's model (BF16: r's recipe must be bf16), each block's
// QKV, O and FFN Dgrad recomputed in both formats with `draws` SR draws averaged (Philox seeded by seed);
// prints a table per block and component, then a line "DGRAD_DIAG comparisons C, CTA-local lower in K,
// geometric mean E_MX/E_CTA G". Returns 0.
int dgrad_diagnostic(Run *r, int batches, int draws, uint64_t seed, FILE *out);
