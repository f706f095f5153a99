// tests/gpu/gpu_test_fp4_mx.cu: the CUDA MXFP4 producers (fp4/mxfp4.cu, fp8_embed.cu, hadamard.cu) against
// the CPU reference, BYTE FOR BYTE: packed codes, E8M0 scales, E4M3 embeddings and their float scales,
// on many shapes and on edge-case inputs (zeros, constant blocks, huge/tiny/subnormal values, amax
// exactly a power of two, every E2M1 tie, NaN/Inf). Exact equality is the right tolerance: both sides
// run the same FP4_HD scalar rules with correctly rounded fp32 operations (see fp4/fp4_common.h).
// Then a bandwidth table of each fused producer at Llama-3 8B activation shapes vs the copy rate
// measured on the GPU at hand (4.28 TB/s on the H200).
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fp4/fp8_embed.h"
#include "fp4/hadamard.h"
#include "fp4/mxfp4.h"
#include "fp4/quant_dev.cuh"
#include "common/cuda_common.h"
#include "tests/mx_near.h"
#include "tests/test.h"
#include "tests/gpu/gpu_util.h"

typedef __nv_bfloat16 bf16;
static Rng rng;

// ---- inputs ---------------------------------------------------------------------------------------
enum { IN_RANGE = IN_SHARED_KINDS, IN_POW2, IN_TIES, IN_SPECIAL, IN_NKINDS };
static const char *in_name[IN_NKINDS] = {"normal",    "outliers", "zeros", "const",
                                         "huge/tiny", "pow2",     "ties",  "nan/inf"};

// rows x K values, BF16-representable. Blocks of 32 along K (and rows) get a per-block flavour.
static float *make_input(int kind, int rows, int K) {
  size_t n = (size_t)rows * K;
  float *x = (float *)xmalloc(n * 4);
  const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (size_t i = 0; i < n; i++) {
    float v = rng_normal(&rng);
    size_t blk = i / 32;
    v = shared_input(kind, v, i, blk, K, &rng);
    switch (kind) {
      case IN_RANGE:
        v = ldexpf(v, (int)(blk % 11) * 24 - 132);
        break;  // 2^-132 (BF16 subnormal) .. 2^108
      case IN_POW2:
        v = (i % 32 == 5) ? ldexpf(1.0f, (int)(blk % 13) - 6) : v * ldexpf(1.0f, (int)(blk % 13) - 8);
        break;
      case IN_TIES: {
        // Exact ties of the OCP scale (amax 4*2^k -> e = k) and the paper's (6 z / 2^e = tie).
        int k = (int)(blk % 7) - 3;
        float t = ties[rng_u64(&rng) % 7] * ((rng_u64(&rng) & 1) ? -1.0f : 1.0f);
        v = (i % 32 == 0) ? ldexpf(4.0f, k) : (blk & 1) ? ldexpf(t, k) : ldexpf(t / 6.0f, k + 2);
        break;
      }
      case IN_SPECIAL: {
        uint64_t r = rng_u64(&rng) % 97;
        v = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY : v;
        break;
      }
      default:
        break;
    }
    x[i] = bf16r(v);
  }
  return x;
}

static bf16 *upload_bf16(const float *x, size_t n) {
  bf16 *h = (bf16 *)xmalloc(n * 2), *d;
  for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(x[i]);
  CUDA_CHECK(cudaMalloc(&d, n * 2 + 16));
  CUDA_CHECK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
  free(h);
  return d;
}

static void *dalloc(size_t bytes) {
  void *p;
  CUDA_CHECK(cudaMalloc(&p, bytes + 16));
  CUDA_CHECK(cudaMemset(p, 0xAB, bytes + 16));  // poison: unwritten bytes show up as mismatches
  return p;
}

// Device bytes against the CPU reference's, with the first mismatch's row and column.
static int same_bytes(const char *what, const void *dev, const void *host, size_t n, int row_len) {
  return same_bytes_at(what, dev, 1, host, 0, n, row_len);
}

static MxOut packed_out(size_t rows, size_t K) {
  MxOut o = {(uint8_t *)dalloc(rows * K / 2), (uint8_t *)dalloc(rows * K / 32), NULL, 0, 1.0f};
  return o;
}
static MxOut fp8_out(size_t rows, size_t K, size_t nscale, float mul) {
  MxOut o = {(uint8_t *)dalloc(rows * K), NULL, (float *)dalloc(nscale * 4), 1, mul};
  return o;
}
static void free_out(MxOut o) {
  cudaFree(o.q);
  if (o.e8m0) cudaFree(o.e8m0);
  if (o.scale) cudaFree(o.scale);
}

// Compares a GPU packed or fp8 output with the CPU packed reference (embedding it when fp8).
static int check_out(const char *what, MxOut o, const uint8_t *codes, const uint8_t *scales, int rows, int K, int blk) {
  char name[160];
  int ok;
  if (!o.fp8) {
    snprintf(name, sizeof name, "%s codes", what);
    ok = same_bytes(name, o.q, codes, (size_t)rows * K / 2, K / 2);
    snprintf(name, sizeof name, "%s e8m0", what);
    ok &= same_bytes(name, o.e8m0, scales, (size_t)rows * K / 32, K / 32);
    return ok;
  }
  size_t ns = blk ? mx_blk128_scale_count(rows, K) : mx_vec128_scale_count(rows, K);
  uint8_t *f = (uint8_t *)xmalloc((size_t)rows * K);
  float *s = (float *)xmalloc(ns * 4);
  if (blk) mx_embed_blk128(codes, scales, rows, K, o.scale_mul, f, s);
  else mx_embed_vec128(codes, scales, rows, K, o.scale_mul, f, s);
  snprintf(name, sizeof name, "%s e4m3", what);
  ok = same_bytes(name, o.q, f, (size_t)rows * K, K);
  snprintf(name, sizeof name, "%s %s scales", what, blk ? "BLK128" : "VEC128");
  ok &= same_bytes(name, o.scale, s, ns * 4, 4 * (blk ? mx_blk128_l4(K) : rows));
  free(f), free(s);
  return ok;
}

// Nonzero 32-blocks of a column copy (codes [K, rows/2], scales [K, rows/32]) more than 14 binades
// below their 128x128 tile's largest: what the BLK128x128 producer's rounded counter must report.
static unsigned long long count_rounded(const uint8_t *codes, const uint8_t *scales, int K, int rows) {
  const int nb = rows / 32;
  unsigned long long n = 0;
  for (int t0 = 0; t0 < K; t0 += 128)
    for (int b0 = 0; b0 < nb; b0 += 4) {
      int Et = -127;
      for (int k = t0; k < K && k < t0 + 128; k++)
        for (int b = b0; b < nb && b < b0 + 4; b++)
          Et = Et > mx_embed_exp_of(scales[(size_t)k * nb + b]) ? Et : mx_embed_exp_of(scales[(size_t)k * nb + b]);
      for (int k = t0; k < K && k < t0 + 128; k++)
        for (int b = b0; b < nb && b < b0 + 4; b++) {
          uint8_t sb = scales[(size_t)k * nb + b];
          int nz = 0;
          for (int i = 0; i < 16; i++) nz |= codes[(size_t)k * (rows / 2) + b * 16 + i] & 0x77;
          n += sb != 0xFF && mx_embed_exp_of(sb) < Et - 14 && nz;
        }
    }
  return n;
}

// ---- bit-exactness --------------------------------------------------------------------------------
static void test_rows(int kind, int rows, int K) {
  float *x = make_input(kind, rows, K);
  bf16 *dx = upload_bf16(x, (size_t)rows * K);
  uint8_t *c = (uint8_t *)xmalloc((size_t)rows * K / 2), *s = (uint8_t *)xmalloc((size_t)rows * K / 32);
  PhiloxStream ps = philox_stream(42, 1234, 3, 7, 2);
  for (int mode = 0; mode < 2; mode++)
    for (int rnd = 0; rnd < 2; rnd++)
      for (int fp8 = 0; fp8 < 2; fp8++) {
        if (mode == MX_SCALE_DOWN && (rnd || fp8)) continue;
        mx_quantize_rows(x, rows, K, (MxScale)mode, (MxRound)rnd, ps, c, s);
        MxOut o = fp8 ? fp8_out(rows, K, mx_vec128_scale_count(rows, K), 1.0f) : packed_out(rows, K);
        mx_quantize_rows_cuda(dx, rows, K, (MxScale)mode, (MxRound)rnd, ps, o);
        CUDA_CHECK(cudaDeviceSynchronize());
        char what[128];
        snprintf(what, sizeof what, "rows %s %dx%d %s %s %s", in_name[kind], rows, K, mode ? "down" : "up",
                 rnd ? "SR" : "RNE", fp8 ? "fp8" : "packed");
        CHECK(check_out(what, o, c, s, rows, K, 0), "%s", what);
        free_out(o);
      }
  free(x), free(c), free(s);
  cudaFree(dx);
}

// The dual producer: row copy (SR) and H32 column copy, packed and fp8, against rows + cols references.
static void test_dual(int kind, int rows, int K) {
  size_t n = (size_t)rows * K;
  float *x = make_input(kind, rows, K);
  bf16 *dx = upload_bf16(x, n);
  uint8_t *rc = (uint8_t *)xmalloc(n / 2), *rs = (uint8_t *)xmalloc(n / 32), *cc = (uint8_t *)xmalloc(n / 2),
          *cs = (uint8_t *)xmalloc(n / 32);
  PhiloxStream ps = philox_stream(7, 99, 0, 31, 6);
  // variants 4, 5: the column copy in BLK128x128 (one exponent per 128x128 tile, a Wgrad 2D operand)
  for (int variant = 0; variant < 6; variant++) {
    int rnd = variant & 1, had = variant != 2 && variant != 5, fp8 = variant >= 2, blk = variant >= 4;
    mx_quantize_rows(x, rows, K, MX_SCALE_UP, (MxRound)rnd, ps, rc, rs);
    mx_quantize_cols(x, rows, K, had, MX_SCALE_UP, cc, cs);
    MxOut ro = fp8 ? fp8_out(rows, K, mx_vec128_scale_count(rows, K), 1.0f / 6) : packed_out(rows, K);
    MxOut co = !fp8  ? packed_out(K, rows)
               : blk ? fp8_out(K, rows, mx_blk128_scale_count(K, rows), 1.0f)
                     : fp8_out(K, rows, mx_vec128_scale_count(K, rows), 1.0f);
    co.blk128 = blk;
    unsigned long long *d_rounded = NULL, rounded = 0;
    if (blk) {
      d_rounded = (unsigned long long *)dalloc(8);
      CUDA_CHECK(cudaMemset(d_rounded, 0, 8));
      co.rounded = d_rounded;
    }
    mx_quantize_dual_cuda(dx, rows, K, MX_SCALE_UP, (MxRound)rnd, ps, ro, had, co);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (blk) {
      CUDA_CHECK(cudaMemcpy(&rounded, d_rounded, 8, cudaMemcpyDeviceToHost));
      unsigned long long want = count_rounded(cc, cs, K, rows);
      CHECK(rounded == want, "dual %s %dx%d H32=%d BLK128x128: %llu blocks counted outside the exact range, CPU %llu",
            in_name[kind], rows, K, had, rounded, want);
      if (want)
        printf("  dual %s %dx%d H32=%d BLK128x128: %llu blocks outside the exact range (counted alike)\n",
               in_name[kind], rows, K, had, want);
      cudaFree(d_rounded);
    }
    char what[128];
    snprintf(what, sizeof what, "dual %s %dx%d %s H32=%d %s: row", in_name[kind], rows, K, rnd ? "SR" : "RNE", had,
             fp8 ? "fp8" : "packed");
    CHECK(check_out(what, ro, rc, rs, rows, K, 0), "%s", what);
    snprintf(what, sizeof what, "dual %s %dx%d %s H32=%d %s: col", in_name[kind], rows, K, rnd ? "SR" : "RNE", had,
             !fp8  ? "packed"
             : blk ? "fp8 BLK128x128"
                   : "fp8");
    CHECK(check_out(what, co, cc, cs, K, rows, blk), "%s", what);
    free_out(ro), free_out(co);
  }
  // Column copy alone (the X operand of Wgrad).
  MxOut none = {NULL, NULL, NULL, 0, 1.0f}, co = packed_out(K, rows);
  mx_quantize_dual_cuda(dx, rows, K, MX_SCALE_UP, MX_RNE, ps, none, 1, co);
  CUDA_CHECK(cudaDeviceSynchronize());
  mx_quantize_cols(x, rows, K, 1, MX_SCALE_UP, cc, cs);
  CHECK(check_out("dual col only", co, cc, cs, K, rows, 0), "dual col only %dx%d", rows, K);
  free_out(co);
  co = fp8_out(K, rows, mx_blk128_scale_count(K, rows), 1.0f);
  co.blk128 = 1;
  mx_quantize_dual_cuda(dx, rows, K, MX_SCALE_UP, MX_RNE, ps, none, 1, co);
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(check_out("dual col only, fp8 BLK128x128", co, cc, cs, K, rows, 1), "dual col only BLK %dx%d", rows, K);
  free_out(co);
  free(x), free(rc), free(rs), free(cc), free(cs);
  cudaFree(dx);
}

static void test_weight(int kind, int N, int K) {
  size_t n = (size_t)N * K;
  float *w = make_input(kind, N, K);
  float *dw;
  CUDA_CHECK(cudaMalloc(&dw, n * 4));
  CUDA_CHECK(cudaMemcpy(dw, w, n * 4, cudaMemcpyHostToDevice));
  bf16 *dwb = upload_bf16(w, n);
  uint8_t *c = (uint8_t *)xmalloc(n / 2), *s = (uint8_t *)xmalloc(n / 32), *ct = (uint8_t *)xmalloc(n / 2),
          *st = (uint8_t *)xmalloc(n / 32);
  for (int variant = 0; variant < 4; variant++) {
    int rule = variant & 1, fp8 = variant >> 1;
    mx_quantize_weight(w, N, K, MX_SCALE_UP, rule, c, s, ct, st);
    for (int in_bf16 = 0; in_bf16 < 2; in_bf16++) {
      MxOut wo = fp8 ? fp8_out(N, K, mx_blk128_scale_count(N, K), 1.0f) : packed_out(N, K);
      MxOut wto = fp8 ? fp8_out(K, N, mx_blk128_scale_count(K, N), 1.0f) : packed_out(K, N);
      if (in_bf16) mx_quantize_weight_bf16_cuda(dwb, N, K, MX_SCALE_UP, rule, wo, wto);
      else mx_quantize_weight_cuda(dw, N, K, MX_SCALE_UP, rule, wo, wto);
      CUDA_CHECK(cudaDeviceSynchronize());
      char what[128];
      snprintf(what, sizeof what, "weight %s %dx%d rule087=%d %s %s: W", in_name[kind], N, K, rule,
               fp8 ? "fp8" : "packed", in_bf16 ? "bf16" : "fp32");
      CHECK(check_out(what, wo, c, s, N, K, 1), "%s", what);
      what[strlen(what) - 1] = 0;
      strcat(what, "W^T");
      CHECK(check_out(what, wto, ct, st, K, N, 1), "%s", what);
      free_out(wo), free_out(wto);
    }
    if (fp8) {  // the BF16 kernel with one output only (a hybrid's W or W^T)
      const MxOut none = {NULL, NULL, NULL, 0, 1.0f};
      for (int only_t = 0; only_t < 2; only_t++) {
        MxOut o = only_t ? fp8_out(K, N, mx_blk128_scale_count(K, N), 1.0f)
                         : fp8_out(N, K, mx_blk128_scale_count(N, K), 1.0f);
        mx_quantize_weight_bf16_cuda(dwb, N, K, MX_SCALE_UP, rule, only_t ? none : o, only_t ? o : none);
        CUDA_CHECK(cudaDeviceSynchronize());
        CHECK(only_t ? check_out("weight bf16 fp8, W^T only", o, ct, st, K, N, 1)
                     : check_out("weight bf16 fp8, W only", o, c, s, N, K, 1),
              "weight %s %dx%d rule087=%d bf16 fp8, %s only", in_name[kind], N, K, rule, only_t ? "W^T" : "W");
        free_out(o);
      }
    }
  }
  // The standalone embedding converters, from the CPU's packed codes.
  uint8_t *dc = (uint8_t *)dalloc(n / 2), *ds = (uint8_t *)dalloc(n / 32);
  CUDA_CHECK(cudaMemcpy(dc, c, n / 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(ds, s, n / 32, cudaMemcpyHostToDevice));
  for (int blk = 0; blk < 2; blk++) {
    MxOut o = fp8_out(N, K, blk ? mx_blk128_scale_count(N, K) : mx_vec128_scale_count(N, K), 1.0f / 6);
    if (blk) mx_embed_blk128_cuda(dc, ds, N, K, o.scale_mul, o.q, o.scale);
    else mx_embed_vec128_cuda(dc, ds, N, K, o.scale_mul, o.q, o.scale);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(check_out(blk ? "embed_blk128_cuda" : "embed_vec128_cuda", o, c, s, N, K, blk), "embed %dx%d", N, K);
    free_out(o);
  }
  cudaFree(dc), cudaFree(ds), cudaFree(dw), cudaFree(dwb);
  free(w), free(c), free(s), free(ct), free(st);
}

static void test_hadamard(int rows, int cols) {
  size_t n = (size_t)rows * cols;
  float *x = make_input(IN_NORMAL, rows, cols), *h = (float *)xmalloc(n * 4), *d;
  CUDA_CHECK(cudaMalloc(&d, n * 4));
  for (int nb = 16; nb <= 32; nb += 16)
    for (int down = 0; down < 2; down++) {
      CUDA_CHECK(cudaMemcpy(d, x, n * 4, cudaMemcpyHostToDevice));
      fp4_hadamard_cuda(d, rows, cols, nb, down);
      memcpy(h, x, n * 4);
      if (down) fp4_hadamard_cols(h, rows, cols, nb);
      else fp4_hadamard_rows(h, rows, cols, nb);
      CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(same_bytes("hadamard", d, h, n * 4, cols * 4), "H%d %s %dx%d bit-exact", nb,
            down ? "down columns" : "along rows", rows, cols);
    }
  cudaFree(d);
  free(x), free(h);
}

// ---- float inputs and the decode range (issue 32 point 3) -------------------------------------------
// The producers' inputs are BF16 except the rotated column copies (H32 of BF16 is a float) and the fp32
// weight producer, whose rules must give the codes of the exact 6 z / s_b as the reference does. Blocks
// of floats next to every threshold of RNE and SR at every e (tests/mx_near.h), then random float blocks: per block the
// device rules as the producers run them: 0 packed RNE, 1 packed SR, 2 the fp32 weight producer's RNE words, 3/4 the
// FP8 path's RNE/SR code accumulators.
static __global__ void block_rules_kernel(const float *v, const uint32_t *rnd, int nblk, MxScale mode, uint32_t *out,
                                          uint8_t *scales) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= nblk) return;
  float x[32], acc[8], c;
  uint32_t r[8], pk[4];
  for (int i = 0; i < 32; i++) x[i] = v[(size_t)b * 32 + i];
  for (int i = 0; i < 8; i++) r[i] = rnd[(size_t)b * 8 + i];
  uint32_t *o = out + (size_t)b * 20;
  scales[3 * b] = mx_block32_dev<false>(x, mode, r, pk);
  for (int w = 0; w < 4; w++) o[w] = pk[w];
  scales[3 * b + 1] = mx_block32_dev<true>(x, mode, r, pk);
  for (int w = 0; w < 4; w++) o[4 + w] = pk[w];
  mx_block32_scale(x, mode, &c);
  scales[3 * b + 2] = c != 0.0f;  // else the weight producer takes the reference rule, not these words
  if (c != 0.0f) mx_rne_words(x, c, pk);
  for (int w = 0; w < 4; w++) o[8 + w] = pk[w];
  for (int sr = 0; sr < 2; sr++) {
    if (sr) mx_block32_acc<true>(x, mode, r, acc);
    else mx_block32_acc<false>(x, mode, r, acc);
    for (int w = 0; w < 4; w++)
      o[12 + 4 * sr + w] = sr ? mx_acc_codes4<true>(acc[2 * w]) | mx_acc_codes4<true>(acc[2 * w + 1]) << 16
                              : mx_acc_codes4<false>(acc[2 * w]) | mx_acc_codes4<false>(acc[2 * w + 1]) << 16;
  }
}

static void test_float_blocks(void) {
  const int n_near = 255 * MX_NEAR_KINDS, n_rand = 1 << 15, nblk = n_near + n_rand;
  float *v = (float *)xmalloc((size_t)nblk * 32 * 4);
  uint32_t *rnd = (uint32_t *)xmalloc((size_t)nblk * 8 * 4);
  int b = 0;
  for (int e = -127; e <= 127; e++)
    for (int k = 0; k < MX_NEAR_KINDS; k++, b++) mx_near_block(e, k, v + (size_t)b * 32, rnd + (size_t)b * 8);
  for (; b < nblk; b++) {  // random float bits over a narrow spread, an Inf now and then
    const int top = (int)(rng_u64(&rng) % 280) - 150;
    for (int i = 0; i < 32; i++) {
      const uint64_t w = rng_u64(&rng);
      const int be = top + 127 - (int)((w >> 40) % 3);
      const float x = be < 1 ? fp4_u2f((uint32_t)(w & 0x7fffffu))
                             : fp4_u2f((uint32_t)(be > 254 ? 254 : be) << 23 | (w & 0x7fffffu));
      v[(size_t)b * 32 + i] = (w >> 63) ? -x : x;
    }
    if (b % 101 == 0) v[(size_t)b * 32 + b % 32] = INFINITY;
    for (int i = 0; i < 8; i++) rnd[(size_t)b * 8 + i] = (uint32_t)rng_u64(&rng);
  }
  float *dv;
  uint32_t *drnd, *dout;
  uint8_t *dsc;
  CUDA_CHECK(cudaMalloc(&dv, (size_t)nblk * 128));
  CUDA_CHECK(cudaMalloc(&drnd, (size_t)nblk * 32));
  CUDA_CHECK(cudaMalloc(&dout, (size_t)nblk * 80));
  CUDA_CHECK(cudaMalloc(&dsc, (size_t)nblk * 3));
  CUDA_CHECK(cudaMemcpy(dv, v, (size_t)nblk * 128, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(drnd, rnd, (size_t)nblk * 32, cudaMemcpyHostToDevice));
  uint32_t *out = (uint32_t *)xmalloc((size_t)nblk * 80);
  uint8_t *sc = (uint8_t *)xmalloc((size_t)nblk * 3);
  static const char *part[5] = {"packed RNE", "packed SR", "fp32 weight RNE words", "FP8 RNE codes", "FP8 SR codes"};
  for (int mode = 0; mode < 2; mode++) {
    block_rules_kernel<<<(nblk + 127) / 128, 128>>>(dv, drnd, nblk, (MxScale)mode, dout, dsc);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(out, dout, (size_t)nblk * 80, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(sc, dsc, (size_t)nblk * 3, cudaMemcpyDeviceToHost));
    long bad[5] = {0}, first = -1;
    for (b = 0; b < nblk; b++) {
      uint32_t want[2][4];
      const uint8_t s0 = mx_quantize_block32(v + (size_t)b * 32, (MxScale)mode, 0, rnd + (size_t)b * 8, want[0]);
      const uint8_t s1 = mx_quantize_block32(v + (size_t)b * 32, (MxScale)mode, 1, rnd + (size_t)b * 8, want[1]);
      const uint32_t *o = out + (size_t)b * 20;
      int d[5] = {sc[3 * b] != s0, sc[3 * b + 1] != s1, 0, 0, 0};
      for (int w = 0; w < 4; w++) {
        d[0] |= o[w] != want[0][w];
        d[1] |= o[4 + w] != want[1][w];
        d[2] |= sc[3 * b + 2] && o[8 + w] != want[0][w];
        if (s0 != 0xFF)
          d[3] |= o[12 + w] != (want[0][w] & 0x77777777u), d[4] |= o[16 + w] != (want[1][w] & 0x77777777u);
      }
      for (int p = 0; p < 5; p++) {
        bad[p] += d[p];
        if (d[p] && first < 0) first = b;
      }
    }
    if (first >= 0) printf("  first differing block %ld (%s)\n", first, first < n_near ? "near a threshold" : "random");
    for (int p = 0; p < 5; p++)
      CHECK(bad[p] == 0, "float blocks, %s, %s: %ld of %d blocks differ from mx_quantize_block32", mode ? "down" : "up",
            part[p], bad[p], nblk);
  }
  // The fp32 weight producer end to end on such floats: every row of a 32x32 tile is a near-threshold
  // block of the tile's exponent (v[0] = 2^e in each, so the tile's scale is e), thresholds mixed.
  enum { N = 256, K = 256 };
  float *w = (float *)xmalloc((size_t)N * K * 4), *dw;
  for (int n = 0; n < N; n++)
    for (int jb = 0; jb < K / 32; jb++) {
      const int t = (n / 32) * (K / 32) + jb, e = t * 37 % 255 - 127, k = (n * 131 + jb * 17) % MX_NEAR_KINDS;
      memcpy(w + (size_t)n * K + jb * 32, v + ((size_t)(e + 127) * MX_NEAR_KINDS + k) * 32, 128);
    }
  CUDA_CHECK(cudaMalloc(&dw, (size_t)N * K * 4));
  CUDA_CHECK(cudaMemcpy(dw, w, (size_t)N * K * 4, cudaMemcpyHostToDevice));
  uint8_t *c = (uint8_t *)xmalloc(N * K / 2), *s2 = (uint8_t *)xmalloc(N * K / 32), *ct = (uint8_t *)xmalloc(N * K / 2),
          *st = (uint8_t *)xmalloc(N * K / 32);
  for (int fp8 = 0; fp8 < 2; fp8++) {
    mx_quantize_weight(w, N, K, MX_SCALE_UP, 0, c, s2, ct, st);
    MxOut wo = fp8 ? fp8_out(N, K, mx_blk128_scale_count(N, K), 1.0f) : packed_out(N, K);
    MxOut wto = fp8 ? fp8_out(K, N, mx_blk128_scale_count(K, N), 1.0f) : packed_out(K, N);
    mx_quantize_weight_cuda(dw, N, K, MX_SCALE_UP, 0, wo, wto);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(check_out(fp8 ? "weight fp32 near thresholds fp8: W" : "weight fp32 near thresholds packed: W", wo, c, s2, N,
                    K, 1),
          "fp32 weights near the thresholds (%s): W", fp8 ? "fp8" : "packed");
    CHECK(check_out(fp8 ? "weight fp32 near thresholds fp8: W^T" : "weight fp32 near thresholds packed: W^T", wto, ct,
                    st, K, N, 1),
          "fp32 weights near the thresholds (%s): W^T", fp8 ? "fp8" : "packed");
    free_out(wo), free_out(wto);
  }
  cudaFree(dw), cudaFree(dv), cudaFree(drnd), cudaFree(dout), cudaFree(dsc);
  free(w), free(c), free(s2), free(ct), free(st), free(v), free(rnd), free(out), free(sc);
}

// mx_decode on the device for every code, scale byte and mode: the host's value bit for bit, and finite
// for every UP scale byte but 0xFF (e = 126 and 127 overflowed when q * 2^e was formed first).
static __global__ void decode_kernel(float *out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 2 * 256 * 16) out[i] = mx_decode((uint8_t)(i % 16), (uint8_t)((i / 16) % 256), (MxScale)(i / 4096));
}
static void test_decode(void) {
  float *d, h[2 * 256 * 16];
  CUDA_CHECK(cudaMalloc(&d, sizeof h));
  decode_kernel<<<32, 256>>>(d);
  CUDA_CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  long bad = 0, inf = 0;
  for (int i = 0; i < 2 * 256 * 16; i++) {
    const float want = mx_decode((uint8_t)(i % 16), (uint8_t)((i / 16) % 256), (MxScale)(i / 4096));
    bad += fp4_f2u(h[i]) != fp4_f2u(want);
    inf += i < 4096 && (i / 16) % 256 != 255 && isinf(h[i]);
  }
  CHECK(bad == 0 && inf == 0, "mx_decode on the device: %ld of 8192 differ from the host, %ld UP values infinite", bad,
        inf);
  CHECK(h[(126 + 127) * 16 + 0xE] == (float)(-4 * ldexp(1, 126) / 6), "code 0xE at e = 126 decodes to %g (-5.67e37)",
        h[(126 + 127) * 16 + 0xE]);
  cudaFree(d);
}

// ---- benchmark ------------------------------------------------------------------------------------
typedef void (*BenchFn)(void *);

typedef struct {
  const bf16 *x;
  const float *w;
  int rows, K;
  MxOut a, b;
  int sr, had;  // dual: SR row copy, H32 column copy
} BenchArgs;
static void b_rows(void *p) {
  BenchArgs *g = (BenchArgs *)p;
  mx_quantize_rows_cuda(g->x, g->rows, g->K, MX_SCALE_UP, MX_RNE, philox_stream(0, 0, 0, 0, 0), g->a);
}
static void b_dual(void *p) {
  BenchArgs *g = (BenchArgs *)p;
  mx_quantize_dual_cuda(g->x, g->rows, g->K, MX_SCALE_UP, g->sr ? MX_SR : MX_RNE, philox_stream(1, 2, 0, 3, 4), g->a,
                        g->had, g->b);
}
static void b_weight(void *p) {
  BenchArgs *g = (BenchArgs *)p;
  if (g->x) mx_quantize_weight_bf16_cuda(g->x, g->rows, g->K, MX_SCALE_UP, 1, g->a, g->b);  // the engine's: BF16 shadow
  else mx_quantize_weight_cuda(g->w, g->rows, g->K, MX_SCALE_UP, 1, g->a, g->b);
}

static void bench(void) {
  copy_gbs_here();  // its line before the table
  printf("\n%-44s %7s %6s %9s %8s %6s\n", "producer (one kernel)", "rows", "K", "time(us)", "GB/s", "%copy");
  const int toks[2] = {8192, 16384}, ks[2] = {4096, 14336};
  for (int ti = 0; ti < 2; ti++)
    for (int ki = 0; ki < 2; ki++) {
      int T = toks[ti], K = ks[ki];
      size_t n = (size_t)T * K;
      bf16 *x;
      CUDA_CHECK(cudaMalloc(&x, n * 2));
      CUDA_CHECK(cudaMemset(x, 0x3c, n * 2));  // bf16 0x3c3c ~ 0.0115: finite, non-zero
      BenchArgs g = {x, NULL, T, K, {0}, {0}, 1, 1};
      // The last four rows take the dual FP8 producer apart (each part alone, same kernel): where
      // its time goes.
      struct {
        const char *name;
        BenchFn fn;
        int fa, fb;  // output kinds: 0 none, 1 packed, 2 fp8, 3 fp8 BLK128x128 (columns)
        int sr, had;
        double bytes;
      } cases[10] = {{"MX 1x32 RNE -> packed + E8M0", b_rows, 1, 0, 0, 0, 2.0 * n + n / 2.0 + n / 32.0},
                     {"MX 1x32 RNE -> FP8 embed (E4M3 + VEC128)", b_rows, 2, 0, 0, 0, 2.0 * n + n + n / 32.0},
                     {"dY: SR rows + H32 cols, packed", b_dual, 1, 1, 1, 1, 2.0 * n + 2 * (n / 2.0 + n / 32.0)},
                     {"dY: SR rows + H32 cols, FP8 embed", b_dual, 2, 2, 1, 1, 2.0 * n + 2 * (n + n / 32.0)},
                     {"dY: SR rows + H32 cols BLK128x128, FP8", b_dual, 2, 3, 1, 1, 2.0 * n + 2 * n + n / 32.0},
                     {"  part: x RNE rows + H32 cols, FP8", b_dual, 2, 2, 0, 1, 2.0 * n + 2 * (n + n / 32.0)},
                     {"  part: SR rows only (tile kernel), FP8", b_dual, 2, 0, 1, 0, 2.0 * n + n + n / 32.0},
                     {"  part: H32 cols only, FP8", b_dual, 0, 2, 0, 1, 2.0 * n + n + n / 32.0},
                     {"  part: cols only, no Hadamard, FP8", b_dual, 0, 2, 0, 0, 2.0 * n + n + n / 32.0},
                     {NULL, NULL, 0, 0, 0, 0, 0}};
      for (int c = 0; cases[c].name; c++) {
        g.sr = cases[c].sr, g.had = cases[c].had;
        MxOut none = {NULL, NULL, NULL, 0, 1.0f};
        g.a = cases[c].fa == 0   ? none
              : cases[c].fa == 2 ? fp8_out(T, K, mx_vec128_scale_count(T, K), 1.0f)
                                 : packed_out(T, K);
        g.b = cases[c].fb == 0   ? none
              : cases[c].fb == 2 ? fp8_out(K, T, mx_vec128_scale_count(K, T), 1.0f)
              : cases[c].fb == 3 ? fp8_out(K, T, mx_blk128_scale_count(K, T), 1.0f)
                                 : packed_out(K, T);
        g.b.blk128 = cases[c].fb == 3;
        double ms = time_median_ms(cases[c].fn, &g), gbs = cases[c].bytes / (ms * 1e-3) / 1e9;
        printf("%-44s %7d %6d %9.1f %8.0f %5.1f%%\n", cases[c].name, T, K, ms * 1e3, gbs, gbs / copy_gbs_here() * 100);
        if (g.a.q) free_out(g.a);
        if (g.b.q) free_out(g.b);
      }
      cudaFree(x);
    }
  const int wN[3] = {4096, 14336, 4096}, wK[3] = {4096, 4096, 14336};
  for (int i = 0; i < 3; i++) {
    int N = wN[i], K = wK[i];
    size_t n = (size_t)N * K;
    float *w;
    bf16 *wb;
    CUDA_CHECK(cudaMalloc(&w, n * 4));
    CUDA_CHECK(cudaMemset(w, 0x3c, n * 4));
    CUDA_CHECK(cudaMalloc(&wb, n * 2));
    CUDA_CHECK(cudaMemset(wb, 0x3c, n * 2));
    for (int v = 0; v < 3; v++) {  // fp32 -> packed, fp32 -> FP8, BF16 shadow -> FP8 (what the engine runs)
      const int fp8 = v > 0, in16 = v == 2;
      BenchArgs g = {in16 ? wb : NULL, w, N, K, {0}, {0}, 0, 0};
      g.a = fp8 ? fp8_out(N, K, mx_blk128_scale_count(N, K), 1.0f) : packed_out(N, K);
      g.b = fp8 ? fp8_out(K, N, mx_blk128_scale_count(K, N), 1.0f) : packed_out(K, N);
      double bytes = (in16 ? 2.0 : 4.0) * n + (fp8 ? 2.0 * n : 2 * (n / 2.0 + n / 32.0));
      double ms = time_median_ms(b_weight, &g), gbs = bytes / (ms * 1e-3) / 1e9;
      printf("%-44s %7d %6d %9.1f %8.0f %5.1f%%\n",
             v == 0   ? "W fp32 -> W, W^T packed (0.87)"
             : v == 1 ? "W fp32 -> W, W^T FP8 BLK128x128 (0.87)"
                      : "W bf16 -> W, W^T FP8 BLK128x128 (0.87)",
             N, K, ms * 1e3, gbs, gbs / copy_gbs_here() * 100);
      free_out(g.a), free_out(g.b);
    }
    cudaFree(wb);
    cudaFree(w);
  }
}

int main(int argc, char **argv) {
  rng_seed(&rng, 2024);
  if (argc > 1 && !strcmp(argv[1], "--bench-only")) {  // for profilers (scripts/gpu/ncu_producers.sh)
    bench();
    return 0;
  }
  TEST_SECTION("row copies (RNE/SR, up/down, packed/fp8), all input kinds");
  const int rr[6] = {1, 7, 32, 100, 257, 300}, kk[7] = {32, 96, 128, 160, 416, 1024, 4096};
  for (int kind = 0; kind < IN_NKINDS; kind++)
    for (int i = 0; i < 6; i++) test_rows(kind, rr[i], kk[(kind + i) % 7]);
  test_rows(IN_NORMAL, 64, 14336);
  TEST_SECTION("dual producer (SR rows + H32 cols), all input kinds");
  const int dr[5] = {32, 96, 128, 160, 288}, dk[5] = {32, 96, 160, 256, 4096};
  for (int kind = 0; kind < IN_NKINDS; kind++)
    for (int i = 0; i < 5; i++) test_dual(kind, dr[i], dk[(kind + i) % 5]);
  test_dual(IN_OUTLIERS, 1024, 4096);
  TEST_SECTION("weights: W and W^T, 32x32 tiles, 0.87 rule, packed/BLK128x128");
  const int wn[4] = {32, 96, 160, 256}, wk[4] = {64, 128, 96, 416};
  for (int kind = 0; kind < IN_NKINDS; kind++)
    for (int i = 0; i < 4; i++) test_weight(kind, wn[i], wk[(kind + i) % 4]);
  test_weight(IN_NORMAL, 512, 4096);
  // More tiles than fit on the GPU at once (17 x 33 = 561), edge tiles partial both ways.
  test_weight(IN_NORMAL, 2080, 4128);
  TEST_SECTION("float inputs near every threshold (exact 6 z / s_b), decode at e = 126, 127");
  test_float_blocks();
  test_decode();
  TEST_SECTION("Hadamard kernels");
  test_hadamard(64, 96);
  test_hadamard(160, 4096);
  if (!(argc > 1 && !strcmp(argv[1], "--no-bench"))) bench();
  TEST_END();
}
