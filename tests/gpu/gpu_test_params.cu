// tests/gpu/gpu_test_params.cu: the CUDA backend's sharded parameter buffer (Ops.alloc_params,
// shard_params, params_bf16; model/cuda/param_memory.cu), what ZeRO-1 master-weight sharding stands on:
// - the buffer and its BF16 shadow before sharding (upload + params_changed: shadow = bf16(fp32));
// - shard_params gives back exactly the chunks that hold no kept float, and the memory count drops;
// - afterwards an upload of the whole model writes the shadow everywhere and fp32 only where kept,
//   a partial upload and params_changed refresh only kept ranges, AdamW on a kept range writes fp32
//   and shadow exactly as the CPU reference, and the embedding reads a table whose fp32 memory is
//   gone (from the shadow), equal to bf16 of the values;
// - releasing the buffer returns the memory count to where it was.
// Chunks are 32 MiB (8M floats, param_memory.cu), so the layout below spans 6 of them.
#include <cuda_bf16.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/adamw.h"
#include "model/ops.h"
#include "model/cuda/ops_cuda.h"
#include "tests/gpu/gpu_ops_util.h"
#include "tests/test.h"

static const size_t CHUNK = (size_t)8 << 20;  // floats per chunk

static void fill(float *h, size_t n, Rng *r) {
  for (size_t i = 0; i < n; i++) h[i] = (float)(rng_normal(r) * 0.02);
}

// The shadow [a, b) equals bf16(want[a..b)) bit for bit; returns 1 if so.
static int shadow_is(const float *p, const float *want, size_t a, size_t b) {
  size_t n = b - a;
  float *got = (float *)xmalloc(n * sizeof(float));
  download_floats(got, (const char *)cuda_param_bf16(CB, p) + a * sizeof(__nv_bfloat16), n, 0);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += got[i] != bf16r(want[a + i]);
  free(got);
  if (bad) printf("  shadow [%zu, %zu): %zu of %zu values differ\n", a, b, bad, n);
  return bad == 0;
}

static int fp32_is(const float *p, const float *want, size_t a, size_t b) {
  size_t n = b - a;
  float *got = (float *)xmalloc(n * sizeof(float));
  G->download(G->ctx, got, p + a, n * sizeof(float));
  int same = !memcmp(got, want + a, n * sizeof(float));
  free(got);
  return same;
}

int main(void) {
  GPU_OPS_TEST_BEGIN(7);
  CHECK(G->alloc_params && G->shard_params && G->params_bf16 && G->params_bf16_changed,
        "the CUDA table has the sharding entries");
  const size_t n = 5 * CHUNK + 1000;  // 6 chunks, the last one mostly slack
  float *h = (float *)xmalloc(n * sizeof(float)), *h2 = (float *)xmalloc(n * sizeof(float));
  fill(h, n, &rng);
  fill(h2, n, &rng);

  TEST_SECTION("whole buffer: upload, params_changed, shadow = bf16(fp32)");
  size_t base = cuda_mem_used(CB);
  float *p = (float *)G->alloc_params(G->ctx, n * sizeof(float));
  CHECK(cuda_mem_used(CB) - base == 6 * CHUNK * sizeof(float), "alloc_params maps 6 chunks: %zu bytes",
        cuda_mem_used(CB) - base);
  G->bind_params(G->ctx, p, n);
  G->upload(G->ctx, p, h, n * sizeof(float));
  G->params_changed(G->ctx);
  CHECK(shadow_is(p, h, 0, n), "shadow of the whole buffer = bf16(fp32)");
  CHECK(fp32_is(p, h, 0, n), "fp32 values read back");
  CHECK(G->params_bf16(G->ctx) == cuda_param_bf16(CB, p), "params_bf16 is the shadow");

  TEST_SECTION("shard_params: chunks without a kept float are given back");
  // Kept: a "shard" [2.5, 3.5) chunks, a norm-like range in chunk 0 and the buffer's tail.
  size_t lo = 5 * CHUNK / 2, hi = 7 * CHUNK / 2;
  size_t off[3] = {lo, 100, n - 50}, len[3] = {hi - lo, 100, 50};
  size_t before = cuda_mem_used(CB);
  size_t released = G->shard_params(G->ctx, off, len, 3);
  CHECK(released == 2 * CHUNK * sizeof(float), "chunks 1 and 4 given back: %zu bytes (want %zu)", released,
        2 * CHUNK * sizeof(float));
  CHECK(before - cuda_mem_used(CB) == released, "the memory count drops by what was given back");
  CHECK(shadow_is(p, h, 0, n), "the shadow is untouched by sharding");
  CHECK(fp32_is(p, h, lo, hi) && fp32_is(p, h, 100, 200) && fp32_is(p, h, n - 50, n), "kept fp32 values survive");

  TEST_SECTION("uploads into the sharded buffer");
  G->upload(G->ctx, p, h2, n * sizeof(float));  // a resume or init_from: the whole model
  CHECK(shadow_is(p, h2, 0, n), "whole upload: shadow = bf16(new values) everywhere, released chunks included");
  CHECK(fp32_is(p, h2, lo, hi) && fp32_is(p, h2, 100, 200) && fp32_is(p, h2, n - 50, n),
        "whole upload: fp32 = new values where kept");
  float *h3 = (float *)xmalloc(n * sizeof(float));
  memcpy(h3, h2, n * sizeof(float));
  fill(h3 + lo + 10, 990, &rng);
  G->upload(G->ctx, p + lo + 10, h3 + lo + 10, 990 * sizeof(float));
  CHECK(fp32_is(p, h3, lo, hi) && shadow_is(p, h3, lo, hi), "partial upload inside the shard: fp32 and shadow");
  G->params_changed(G->ctx);
  CHECK(shadow_is(p, h3, 0, n), "params_changed refreshes the kept ranges and leaves the rest of the shadow");

  TEST_SECTION("AdamW on the shard writes fp32 and the shadow as the CPU does");
  size_t k = hi - lo;
  float *g = (float *)xmalloc(k * sizeof(float)), *zeros = (float *)xcalloc(k, sizeof(float));
  fill(g, k, &rng);
  float *dg = (float *)G->alloc(G->ctx, k * sizeof(float)), *dm = (float *)G->alloc(G->ctx, k * sizeof(float)),
        *dv = (float *)G->alloc(G->ctx, k * sizeof(float));
  G->upload(G->ctx, dg, g, k * sizeof(float));
  G->zero(G->ctx, dm, k * sizeof(float));
  G->zero(G->ctx, dv, k * sizeof(float));
  G->adamw(G->ctx, p + lo, dg, dm, dv, k, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1);
  float *cm = (float *)xcalloc(k, sizeof(float)), *cv = (float *)xcalloc(k, sizeof(float));
  adamw_update(h3 + lo, g, cm, cv, k, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1);
  CHECK(fp32_is(p, h3, lo, hi), "AdamW fp32 = CPU reference, bit for bit");
  CHECK(shadow_is(p, h3, lo, hi), "AdamW's BF16 copy = bf16(new fp32)");
  CHECK(shadow_is(p, h3, 0, lo) && shadow_is(p, h3, hi, n), "the rest of the shadow untouched");

  TEST_SECTION("embedding from a table whose fp32 memory was given back");
  const int V = 1000, D = 256, N = 64;
  const float *table = p + CHUNK + 64;  // inside released chunk 1
  int tok[64];
  for (int i = 0; i < N; i++) tok[i] = (int)(rng_u64(&rng) % V);
  int *dtok = (int *)G->alloc(G->ctx, sizeof tok);
  G->upload(G->ctx, dtok, tok, sizeof tok);
  void *out = G->alloc(G->ctx, (size_t)N * D * 2);
  G->embed_fwd(G->ctx, out, dtok, table, N, D, V);
  G->sync(G->ctx);
  float *got = (float *)xmalloc((size_t)N * D * sizeof(float));
  download_floats(got, out, (size_t)N * D, 0);
  size_t bad = 0;
  for (int i = 0; i < N; i++)
    for (int d = 0; d < D; d++) bad += got[(size_t)i * D + d] != bf16r(h3[CHUNK + 64 + (size_t)tok[i] * D + d]);
  CHECK(bad == 0, "embed fwd from the shadow = bf16(table): %zu of %d values differ", bad, N * D);

  TEST_SECTION("release");
  void *bufs[] = {dg, dm, dv, dtok, out};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) G->release(G->ctx, bufs[i]);
  G->release(G->ctx, p);
  CHECK(cuda_mem_used(CB) == base, "memory count back to %zu (is %zu)", base, cuda_mem_used(CB));
  free(h), free(h2), free(h3), free(g), free(zeros), free(cm), free(cv), free(got);
  TEST_END();
}
