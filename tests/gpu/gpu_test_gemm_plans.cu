// tests/gpu/gpu_test_gemm_plans.cu: the recorded GEMM choices (common/lt_tune.h's lt_set_choice over
// common/gemm_plans.h). A first "process" (the cuBLASLt context and plans from scratch) records the
// algorithm it timed; a second one, after gemm_shutdown, reads it back, runs the recorded algorithm
// without timing and gets the same bits; a recorded value cuBLASLt refuses is replaced by what ran;
// heuristic #0 and plain timing write no record; a damaged record is refused naming its file.
#include <cuda_bf16.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "common/gemm.h"
#include "common/gemm_plans.h"
#include "common/lt_tune.h"
#include "tests/gpu/gpu_util.h"
#include "tests/test.h"

// A shape with several heuristic candidates, so that the timed choice is a real choice.
enum { M = 2048, N = 1536, K = 1024 };

static float bf16_value(uint16_t bits) {
  uint32_t u = (uint32_t)bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static const LtPlan *bf16_plan(void) {
  for (int i = 0; i < lt_plan_count(); i++)
    if (lt_plan_at(i)->key[0] == LT_BF16) return lt_plan_at(i);
  return NULL;
}

// One Fprop-like GEMM out = A B^T into host (M*N BF16 bits), on the current choice.
static void run_gemm(const void *A, const void *B, void *out, uint16_t *host) {
  gemm_bf16(out, 0, A, 0, B, 1, M, N, K, 1.0f, 0.0f);
  CUDA_CHECK(cudaMemcpyAsync(host, out, (size_t)M * N * 2, cudaMemcpyDeviceToHost, cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

static int record_size(const char *path) {
  GemmPlans r;
  char err[2048];
  if (gemm_plans_load(&r, path, err, sizeof err)) return -1;
  int n = r.n;
  gemm_plans_free(&r);
  return n;
}

// The record at path holds, for this device, exactly the algorithm plan p runs.
static int record_holds(const char *path, const LtPlan *p) {
  GemmPlans r;
  char err[2048];
  if (gemm_plans_load(&r, path, err, sizeof err)) return 0;
  const uint64_t *v = gemm_plans_find(&r, &lt_context()->device, p->key);
  int ok = v && !memcmp(v, p->algo.data, sizeof p->algo.data);
  gemm_plans_free(&r);
  return ok;
}

int main(void) {
  char dir[64], path[128], err[2048];
  snprintf(dir, sizeof dir, "/tmp/gpu_test_gemm_plans_%d", (int)getpid());
  snprintf(path, sizeof path, "%s/gemm_plans", dir);
  void *A, *B, *out;
  CUDA_CHECK(cudaMalloc(&A, (size_t)M * K * 2));
  CUDA_CHECK(cudaMalloc(&B, (size_t)N * K * 2));
  CUDA_CHECK(cudaMalloc(&out, (size_t)M * N * 2));
  cuda_fill_uniform_bf16(A, (size_t)M * K, 11);
  cuda_fill_uniform_bf16(B, (size_t)N * K, 12);
  uint16_t *first = (uint16_t *)xmalloc((size_t)M * N * 2), *again = (uint16_t *)xmalloc((size_t)M * N * 2);

  TEST_SECTION("a first process times and records");
  CHECK(!lt_set_choice(GEMM_RECORDED, path, err, sizeof err), "a missing record is an empty one: %s", err);
  run_gemm(A, B, out, first);
  const LtPlan *p = bf16_plan();
  CHECK(p && (!p->untuned || strcmp(p->untuned, "recorded")), "the first plan was chosen, not read back");
  printf("  first: candidate %d of %d, %s\n", p ? p->chosen : -1, p ? p->n_candidates : 0,
         p && p->untuned ? p->untuned : "timed");
  CHECK(p && record_holds(path, p), "the record holds the algorithm the plan runs");
  int n1 = record_size(path);
  CHECK(n1 >= 1, "%d entries recorded", n1);
  struct stat st;
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  CHECK(stat(tmp, &st) != 0, "no temp file is left");

  TEST_SECTION("a second process reads the choice back: no timing, the same bits");
  uint64_t algo1[GEMM_PLAN_VALUE_WORDS];
  memcpy(algo1, p->algo.data, sizeof algo1);
  gemm_shutdown();  // the plans and the context go: what a new process starts from
  CHECK(!lt_set_choice(GEMM_RECORDED, path, err, sizeof err), "read back: %s", err);
  run_gemm(A, B, out, again);
  p = bf16_plan();
  CHECK(p && p->untuned && !strcmp(p->untuned, "recorded") && p->ms == 0, "the plan took the recorded algorithm");
  CHECK(p && !memcmp(p->algo.data, algo1, sizeof algo1), "the same algorithm as the first process");
  CHECK(!memcmp(first, again, (size_t)M * N * 2), "bit-identical results");
  CHECK(record_size(path) == n1, "nothing was added (%d entries)", record_size(path));

  TEST_SECTION("a recorded algorithm cuBLASLt refuses is replaced by what runs");
  GemmPlans r;
  CHECK(!gemm_plans_load(&r, path, err, sizeof err), "%s", err);
  uint64_t bad[GEMM_PLAN_VALUE_WORDS];  // algorithm id -1 and every field out of range: no valid algorithm
  memset(bad, 0xFF, sizeof bad);
  gemm_plans_put(&r, &lt_context()->device, p->key, bad, err, sizeof err);
  CHECK(!gemm_plans_save(&r, err, sizeof err), "%s", err);
  gemm_plans_free(&r);
  gemm_shutdown();
  CHECK(!lt_set_choice(GEMM_RECORDED, path, err, sizeof err), "%s", err);
  run_gemm(A, B, out, again);
  p = bf16_plan();
  CHECK(p && !(p->untuned && !strcmp(p->untuned, "recorded")), "the invalid recorded algorithm was refused");
  CHECK(p && memcmp(p->algo.data, bad, sizeof p->algo.data), "what runs is not the refused algorithm");
  CHECK(p && record_holds(path, p), "the record holds the algorithm that ran");
  double e = 0, s = 0;
  for (size_t i = 0; i < (size_t)M * N; i++) {
    float a = bf16_value(first[i]), b = bf16_value(again[i]);
    e += (double)(a - b) * (a - b), s += (double)a * a;
  }
  CHECK(sqrt(e / s) < 1e-2, "the result is still right (relative difference %.2e)", sqrt(e / s));

  TEST_SECTION("heuristic #0 and plain timing write no record");
  gemm_shutdown();
  char other[160];
  snprintf(other, sizeof other, "%s/not_written", dir);
  CHECK(!lt_set_choice(GEMM_HEURISTIC, other, err, sizeof err), "%s", err);
  run_gemm(A, B, out, again);
  p = bf16_plan();
  CHECK(p && p->chosen == 0 && p->n_candidates == 1 && p->untuned && strstr(p->untuned, "heuristic #0"),
        "heuristic #0 (%s)", p && p->untuned ? p->untuned : "timed");
  gemm_shutdown();
  CHECK(!lt_set_choice(GEMM_TIMED, other, err, sizeof err), "%s", err);
  run_gemm(A, B, out, again);
  CHECK(stat(other, &st) != 0, "no file at %s", other);

  TEST_SECTION("a damaged record is refused, naming it");
  gemm_shutdown();
  FILE *f = xfopen(path, "r+b");
  fseek(f, 30, SEEK_SET);
  fputc('#', f);
  fclose(f);
  CHECK(lt_set_choice(GEMM_RECORDED, path, err, sizeof err) == -1 && strstr(err, path), "refused: %s", err);

  gemm_shutdown();
  unlink(path);
  rmdir(dir);
  CUDA_FREE_ALL(A, B, out);
  free(first);
  free(again);
  TEST_END();
}
