// fp4/cta_mx_dual.h: the operand hybrid's dY producer (docs/formats.md §5): from one read of dY [rows, K]
// (BF16), the CTA-local NVFP4 row copy that Dgrad reads (fp4/nvfp4_cta.h, RNE or SR) and the MXFP4
// column copy that Wgrad reads (fp4/mxfp4.h, RNE, rotated along the rows first). The bytes are those of
// the two producers run apart: nvfp4_cta_quantize_rows_cuda for the row copy, and for the column copy
// mx_quantize_dual_cuda's (H32 or none) or mx_quantize_cols_cuda's followed by the FP8 embedding (H16,
// plain H16) (tests/gpu/gpu_test_fp4_cta.cu compares them byte for byte).
//
// One CTA per 128 x 128 tile, which is both a CTA-local chunk and the MXFP4 dual producer's tile: the
// tile is read once into registers and shared memory, its chunk amax reduced in the CTA, the row
// 16-blocks quantized with the chunk's scale S_c, and the column 32-blocks quantized from shared memory
// (fp4/mx_dual.cuh's column phase). The stripes' outer factors need every chunk of a stripe, so a small
// second pass (nvfp4_cta_rows_finish_cuda) computes them and folds the scales; it reads no BF16.
#pragma once
#include "fp4/mxfp4.h"
#include "fp4/nvfp4_cta.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>

// x [rows, K] on the device, rows and K positive multiples of 32, x and codes 16-byte aligned. Row copy:
// codes [rows, K/2], scales [rows, K/16], outer [cta_stripes(rows)], SR bits from s as the row producer
// draws them; scratch: nvfp4_cta_scratch_words(rows, K) words. Column copy: col (packed, or the FP8
// embedding VEC128 or BLK128x128 with col.blk128, as mx_quantize_dual_cuda's column copy), scale
// rounding mode, hadamard 0, 16, 32 or MX_HADAMARD_H16_PLAIN along the rows; col.rounded (BLK128x128)
// counts as mx_quantize_dual_cuda counts. Asynchronous on cuda_stream().
void cta_mx_dual_cuda(const __nv_bfloat16 *x, int rows, int K, NvRound row_rnd, PhiloxStream s, uint8_t *codes,
                      uint8_t *scales, float *outer, uint32_t *scratch, MxScale mode, int hadamard, MxOut col);
#endif
