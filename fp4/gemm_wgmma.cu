// fp4/gemm_wgmma.cu: our own Hopper FP8 GEMM for the FP8-embedded MXFP4 operands (fp4/gemm_fp4.h's
// fp4_gemm_wgmma): out[M,N] = alpha * sum_k A[m,k] sa B[n,k] sb + beta * out, with the scale layouts
// the producers write (VEC128 per row and 128-block, BLK128x128 per tile; not both operands BLK).
//
// Design (after DeepGEMM's and CUTLASS's Hopper kernels; our code):
// - a persistent grid of one CTA per SM walks 128x128 output tiles in groups of 8 tile rows (L2 reuse
//   of the B columns), the same order in every CTA;
// - warpgroup 0 produces: one thread issues TMA loads of the A and B tiles (128 rows x 128 bytes of
//   K, 128-byte swizzle) into a ring of STAGES shared-memory stages, each guarded by a "full" mbarrier
//   (TMA bytes arrived) and an "empty" one (both consumers done reading);
// - warpgroups 1 and 2 consume 64 rows each: per 128-deep K block four wgmma m64n128k32 into a
//   block accumulator, then the two-level promotion acc += block * sa * sb in fp32 (the scales
//   change every 128 of K, so they cannot sit in the MMA; this is also where Hopper's reduced-
//   precision FP8 accumulation is cut off, as cuBLASLt does at the same granularity);
// - the epilogue writes alpha * acc (+ beta * out) from registers, rows and columns bounds-checked.
// TMA zero-fills what lies outside the operands (partial tiles, a partial last K block), so the loop
// needs no edge cases. The reduction order is fixed: bit-identical run to run.
//
// The kernel body exists for sm_90a only (wgmma, setmaxnreg); other targets compile an empty stub and
// fp4_gemm_wgmma_available() says no. tests/gpu/gpu_test_fp4_gemm.cu checks every configuration on an
// H200 against the fp64 GEMM and against cuBLASLt, whose bits it gives in every use
// (docs/gemm_wgmma.md has the measurements).
#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>

#include <type_traits>

#include "common/common.h"
#include "common/cuda_common.h"
#include "fp4/gemm_fp4.h"

namespace {

constexpr int BM = 128, BK = 128;
constexpr int THREADS = 384;      // producer warpgroup + two consumer warpgroups
constexpr int A_BYTES = BM * BK;  // one E4M3 byte per element
constexpr int SMEM_LIMIT = 227 * 1024;

// Per tile width BN (128 or 256): a stage holds the A tile, the B tile and the K block's VEC128 scales
// (A's 128 rows, B's BN columns); the tiles come first (1024-aligned for the 128-byte swizzle), then
// the scales, then the barriers, then (EPI) each consumer warp's staging buffer for the epilogue: 16
// rows x 64 fp32 columns, rows padded to 68 floats (16-byte aligned, fewer bank conflicts).
constexpr int EPI_LD = 68, EPI_WARP_FLOATS = 16 * EPI_LD, EPI_BYTES = 8 * EPI_WARP_FLOATS * 4;
template <int BN, bool EPI>
struct Shape {
  static constexpr int B_BYTES = BN * BK, TILE_BYTES = A_BYTES + B_BYTES;
  static constexpr int SCALE_BYTES = (BM + BN) * 4;
  static constexpr int EPI_SMEM = EPI ? EPI_BYTES : 0;
  static constexpr int STAGES = (SMEM_LIMIT - 1024 - 256 - EPI_SMEM) / (TILE_BYTES + SCALE_BYTES);
  static constexpr int BAR_BYTES = (2 * STAGES * 8 + 15) / 16 * 16;
  static constexpr int SMEM_BYTES = STAGES * (TILE_BYTES + SCALE_BYTES) + BAR_BYTES + EPI_SMEM + 1024;
};

struct Params {
  void *out;
  const float *sa, *sb;
  int M, N, K, kblocks, l4, tiles_m, tiles_n;  // l4: BLK128x128 scales per 128-row block (fp8_embed.h)
  float alpha, beta;
};

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_KERNEL_BODY 1
#endif

#ifdef WGMMA_KERNEL_BODY
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Arrives on the barrier at the same shared-memory offset in cluster CTA `rank` (this one included),
// at the default (release, CTA) semantics: what the arrival publishes is that this CTA's MMAs have
// finished reading a stage (wgmma.wait_group), which the peer's TMA may then overwrite.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(
          smem_u32(bar)),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank(void) {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster.
__device__ __forceinline__ void cluster_sync(void) {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed. A phase that never completes
// is a bug (a byte count or arrival count that does not match): trap after ~4 s of the global timer,
// so a test fails at once (an "unspecified launch failure") instead of hanging until its timeout. No
// printf: any call in the kernel makes ptxas serialize the wgmma pipeline (its warning C7510).
__device__ __forceinline__ uint64_t global_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
  uint64_t t0 = 0;
  for (uint32_t polls = 0;; polls++) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
    if (done) return;
    if (polls % 4096 == 0) {
      const uint64_t t = global_ns();
      if (!t0) t0 = t;
      else if (t - t0 > 4000000000ull) __trap();
    }
  }
}

// The consumers' wait: the poll loop inside one asm statement, as the compiler must not see a
// divergent loop between wgmma groups in flight (it would serialize them: ptxas C7518). A phase that
// never completes here still ends in a trap: the producer then waits for a stage nobody releases.
__device__ __forceinline__ void mbar_wait_spin(uint64_t *bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra "
      "WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// A 2D TMA load of the box at (x = K element, y = row) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int x, int y, uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_u32(dst)),
      "l"((uint64_t)map), "r"(x), "r"(y), "r"(smem_u32(bar))
      : "memory");
}
// The same box into shared memory at the same offset in every CTA of the cluster named in `mask`, each
// completing on its own barrier at bar's offset.
__device__ __forceinline__ void tma_load_2d_multicast(void *dst, const CUtensorMap *map, int x, int y, uint64_t *bar,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;" ::"r"(smem_u32(dst)),
      "l"((uint64_t)map), "r"(x), "r"(y), "r"(smem_u32(bar)), "h"(mask)
      : "memory");
}
// A contiguous copy of `bytes` (a multiple of 16, 16-byte aligned both sides) into shared memory,
// completing on bar: a K block's VEC128 scales of one tile.
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
      "l"((uint64_t)src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// The wgmma descriptor of a K-major tile whose rows are 128 bytes, 128-byte swizzled as TMA wrote it:
// start address, leading offset (unused for this layout: 1), stride 1024 bytes between 8-row groups,
// swizzle mode 1 (128B) in bits 62-63. Advancing 32 elements of K adds 32 bytes to the start.
__device__ __forceinline__ uint64_t smem_desc(const void *p) {
  uint64_t a = smem_u32(p);
  return ((a & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// d[64] (+)= A[64 rows, 32 of K] . B[128 rows, 32 of K]^T, E4M3 operands, fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n128k32(float *d, uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
      "%57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

// Named barriers (ids 1 and 2; 0 is __syncthreads) between the two consumer warpgroups, 256 threads:
// one warpgroup arrives, the other waits for it.
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }

// Pins a block accumulator's 64 registers at this point of the program: the compiler sees the wgmma
// asm as producing them at issue, so without this it may move their promotion before the wait that
// makes them valid (ptxas then waits there, serializing the MMAs) or interleave it anywhere else.
__device__ __forceinline__ void fence_regs(float *r) {
#pragma unroll
  for (int j = 0; j < 64; j++) asm volatile("" : "+f"(r[j])::"memory");
}

// The two-level promotion of one 64 x 128 block result: a += blk * (row scale * column scale), with
// the column scale one per tile half (B BLK128x128: sbh) or per column (VEC128: sb, this thread's
// columns cl + 8j + {0, 1} in shared memory). The order of the products is cuBLASLt's. One fused
// multiply-add per element (since 85eaa80; a multiply and an add before: twice the instructions).
// The engine's scales are powers of two (fp8_embed.h with scale_mul 1: 2^(E_t - 6)), so blk * s is
// exact and the fused form rounds once where the unfused one rounded once too: the same bits (an
// underflow below 2^-126 aside). With other scales the two can differ in the last bit; the tuner
// keeps our kernel only where its bits are cuBLASLt's.
template <bool B_BLK>
__device__ __forceinline__ void promote(float *a, const float *blk, float sa0, float sa1, float sbh, const float *sb) {
  auto add = [](float &acc, float x, float s) { acc = fmaf(x, s, acc); };
  if (B_BLK) {
    const float s0 = sa0 * sbh, s1 = sa1 * sbh;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      add(a[4 * j + 0], blk[4 * j + 0], s0), add(a[4 * j + 1], blk[4 * j + 1], s0);
      add(a[4 * j + 2], blk[4 * j + 2], s1), add(a[4 * j + 3], blk[4 * j + 3], s1);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const float2 b = *(const float2 *)(sb + 8 * j);
      add(a[4 * j + 0], blk[4 * j + 0], sa0 * b.x), add(a[4 * j + 1], blk[4 * j + 1], sa0 * b.y);
      add(a[4 * j + 2], blk[4 * j + 2], sa1 * b.x), add(a[4 * j + 3], blk[4 * j + 3], sa1 * b.y);
    }
  }
}

// The accumulating BF16 epilogue's first rounding: alpha * acc to BF16, then + beta * out in fp32 and
// rounded again. That is cuBLASLt's arithmetic: on the H200 (2026-12-02, 3126cc1) it gave cuBLASLt's
// bits on every element of the layer tests' accumulating Dgrads, where one fp32 rounding of alpha * acc
// (the fp32 out's form, which does match there) agreed on 74% and a fused multiply-add on 74% too.
__device__ __forceinline__ float bf16_first(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// A consumer warp is done with a stage (its MMAs completed, its scales read): one arrival on the
// stage's empty barrier in every CTA of the cluster.
template <int CM>
__device__ __forceinline__ void release_stage(uint64_t *empty, int lane) {
  __syncwarp();
  if (CM == 1) {
    if (lane == 0) mbar_arrive(empty);
  } else if (lane < CM) mbar_arrive_cluster(empty, lane);  // lane r arrives in CTA r, in parallel
}

// The promotion of one 64 x 128 block result (promote_real), or in an ablation (ABL 1-4) what stands
// in for it; alpha == 0 never happens in one, so the real promotion behind it only keeps the MMAs'
// results read.
template <int ABL, typename F>
__device__ __forceinline__ void ablate_or_promote(float *acc, float s0, float s1, float alpha, F promote_real) {
  if (ABL == 0 || ABL == 2) {
    promote_real();
  } else if (ABL == 1 || ABL == 4) {
    if (ABL == 4) {  // the promotion's instructions and register traffic on acc alone
#pragma unroll
      for (int j = 0; j < 64; j++) acc[j] = fmaf(acc[j], s0, s1);
    }
    if (alpha == 0.0f) promote_real();
  }
}

// Output tile t in the grouped order: GROUP_M tile rows at a time, column by column inside a group.
constexpr int GROUP_M = 8;
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int &tm, int &tn) {
  const int per_group = GROUP_M * tiles_n, g = t / per_group, first = g * GROUP_M;
  const int rows = min(tiles_m - first, GROUP_M), r = t % per_group;
  tm = first + r % rows, tn = r / rows;
}
#endif  // WGMMA_KERNEL_BODY

// A_BLK / B_BLK: that operand's scales are BLK128x128 (else VEC128, staged per K block in shared
// memory by the producer). BN: the tile's width, 128 or 256; a consumer warpgroup runs its 64 x BN
// share as BN / 128 halves in turn (one 64-register block accumulator: 64 x 256 at once would not fit
// beside the 128 fp32 accumulators), while the other warpgroup's MMAs keep the tensor cores busy.
// CM: CTAs per cluster (1 or 2), on CM consecutive tile rows of one tile column: each loads 1/CM of
// the B tile and multicasts it to all, so the B tile leaves L2 once per cluster (L2 bandwidth, not the
// tensor cores, bounds 128 x 256 tiles without it). A stage is then free only when the consumers of
// every CTA of the cluster have read it: the empty barriers count their arrivals across the cluster.
// PIPE (BN 128 only): two block accumulators in turn, so a warpgroup issues K block kb + 1's MMAs
// before it waits for kb's and promotes them; the tensor cores then never wait on its promotion
// (64 x 256 would need 256 registers for this).
// EPI: the epilogue goes through shared memory, a warp's 16 rows at a time, so that the stores to out
// are whole 256-byte row pieces (fp32; 128 bytes BF16) instead of 16-byte pieces of 8 rows; the
// arithmetic is the same, so are the bits.
// ORD (not PIPE): the two consumer warpgroups issue their MMA batches (a K block's, or its half's for
// BN 256) in strict turn, 0, 1, 0, 1, ..., passing a token through two named barriers, so that the
// tensor cores run one warpgroup's batch while the other waits for its own and promotes it (CUTLASS's
// "ping-pong" idea inside one tile). Without it both issue together, the tensor cores interleave the
// two batches, both finish together and both promote while the tensor cores idle.
// ABL (fp4_gemm_wgmma_ablate only): a part of the work left out, to see what bounds the rest: 1 no
// promotion, 2 no MMAs, 3 neither (the feed alone), 4 fused multiply-adds like the promotion's on
// the result accumulators alone, never reading the block sums the tensor cores write (is it the
// instructions, or waiting on the MMAs' registers?). Where the block sums are not promoted (1, 4)
// the real promotion stays behind a condition that is false at run time (alpha == 0): ptxas deletes
// a wgmma whose results nobody reads (it did so in the ablations before 2026-12-02's second run,
// whose "no promotion" was therefore "no MMAs" too). 5: the mainloop of a per-tensor-scaled GEMM
// instead (the MMAs accumulate into acc over all of K). Wrong results by design: never a configuration.
template <bool A_BLK, bool B_BLK, bool OUT_FP32, int BN, int CM, bool PIPE, bool EPI, bool ORD = false, int ABL = 0>
__global__ void __launch_bounds__(THREADS, 1)
    wgmma_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                      const Params p) {
#ifdef WGMMA_KERNEL_BODY
  using S = Shape<BN, EPI>;
  constexpr int STAGES = S::STAGES, NH = BN / 128, BNC = BN / CM;  // BNC: the B rows this CTA loads
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);  // 128B swizzle: 1024-aligned
  float *scales = (float *)(smem + STAGES * S::TILE_BYTES);                      // per stage: A's BM, B's BN
  uint64_t *full = (uint64_t *)(smem + STAGES * (S::TILE_BYTES + S::SCALE_BYTES)), *empty = full + STAGES;
  float *epi = (float *)(smem + STAGES * (S::TILE_BYTES + S::SCALE_BYTES) + S::BAR_BYTES);  // (EPI)
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const uint32_t rank = CM > 1 ? cluster_rank() : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; s++)
      mbar_init(&full[s], 1), mbar_init(&empty[s], 8 * CM);  // empty: one arrival per consumer warp of the cluster
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (CM > 1) cluster_sync();  // the peers' barriers exist before anything is multicast or arrived on
  else __syncthreads();
  // super tiles: CM tile rows x one tile column, one per cluster at a time, in grouped order
  const int super_m = (p.tiles_m + CM - 1) / CM, tiles = super_m * p.tiles_n;
  const int cluster = blockIdx.x / CM, clusters = gridDim.x / CM;

  if (wg == 0) {  // producer
    // registers: 40 producer / 232 consumer, except pipelined in a cluster, whose consumers need 240
    // (at 232 ptxas serializes their MMAs, C7512); its producer then makes do with 24
    if constexpr (PIPE && CM > 1) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    else asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int t = cluster; t < tiles; t += clusters) {
        int sm, tn;
        tile_coords(t, super_m, p.tiles_n, sm, tn);
        const int tm = sm * CM + rank;  // past tiles_m for the last rank of an odd count: zero-filled, not stored
        // the VEC128 scales of this tile's rows / columns that exist (M % 4 == 0 and N % 8 == 0: whole
        // 16-byte pieces); what lies past the edge stays stale and only reaches outputs never stored
        const uint32_t a_sc = A_BLK ? 0 : 4 * max(0, min(BM, p.M - tm * BM)),
                       b_sc = B_BLK ? 0 : 4 * min(BN, p.N - tn * BN);
        for (int kb = 0; kb < p.kblocks; kb++) {
          mbar_wait(&empty[stage], phase ^ 1);  // every consumer of the cluster released this stage
          uint8_t *st = smem + stage * S::TILE_BYTES;
          float *sc = scales + stage * (BM + BN);
          mbar_expect_tx(&full[stage], S::TILE_BYTES + a_sc + b_sc);  // TMA counts whole boxes, zero fill too
          tma_load_2d(st, &map_a, kb * BK, tm * BM, &full[stage]);
          if (CM == 1) tma_load_2d(st + A_BYTES, &map_b, kb * BK, tn * BN, &full[stage]);
          else
            tma_load_2d_multicast(st + A_BYTES + rank * BNC * BK, &map_b, kb * BK, tn * BN + rank * BNC, &full[stage],
                                  (uint16_t)((1u << CM) - 1));
          if (!A_BLK && a_sc) bulk_load(sc, p.sa + (size_t)kb * p.M + tm * BM, a_sc, &full[stage]);
          if (!B_BLK) bulk_load(sc + BM, p.sb + (size_t)kb * p.N + tn * BN, b_sc, &full[stage]);
          if (++stage == STAGES) stage = 0, phase ^= 1;
        }
      }
    }
  } else {
    if constexpr (PIPE && CM > 1) asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = wg - 1, warp = tid / 32, lane = tid % 32;  // consumer warpgroup 0/1: rows cw*64..
    const int rl = cw * 64 + warp * 16 + lane / 4;            // this thread's rows rl and rl + 8 of the tile
    const int cl = (lane % 4) * 2;                            // and columns cl + 8j + {0, 1} of each half
    int stage = 0, rstage = 0;  // the next stage to wait for, and (PIPE) the oldest one still held
    uint32_t phase = 0;
    float acc[NH * 64], blk[64], blk2[PIPE ? 2 : 1][64];
    bool ord_started = false;  // (ORD) this warpgroup has issued a batch
    for (int t = cluster; t < tiles; t += clusters) {
      int sm, tn;
      tile_coords(t, super_m, p.tiles_n, sm, tn);
      const int tm = sm * CM + rank;
#pragma unroll
      for (int i = 0; i < NH * 64; i++) acc[i] = 0.0f;
      if constexpr (ABL == 5) {
        // the mainloop of a per-tensor-scaled GEMM (no block sums: the MMAs accumulate into acc over all
        // of K, a stage released once the next K block's MMAs are issued): what our feed and MMA issue
        // reach without the two-level scheme (one m64n256k32 per 32 of K instead, A read once, measured
        // no faster at 3126cc1 and was dropped)
        int prev = -1;
        for (int kb = 0; kb < p.kblocks; kb++) {
          mbar_wait_spin(&full[stage], phase);
          const uint8_t *st = smem + stage * S::TILE_BYTES;
          const uint64_t da = smem_desc(st + cw * 64 * BK);
          fence_regs(acc);
          if (NH == 2) fence_regs(acc + 64);
          wgmma_fence();
#pragma unroll
          for (int h = 0; h < NH; h++) {
            const uint64_t db = smem_desc(st + A_BYTES + h * 128 * BK);
#pragma unroll
            for (int k = 0; k < BK / 32; k++) wgmma_m64n128k32(acc + 64 * h, da + 2 * k, db + 2 * k, 1);
          }
          wgmma_commit();
          fence_regs(acc);
          if (NH == 2) fence_regs(acc + 64);
          wgmma_wait1();
          if (prev >= 0) release_stage<CM>(&empty[prev], lane);
          prev = stage;
          if (++stage == STAGES) stage = 0, phase ^= 1;
        }
        wgmma_wait0();
        fence_regs(acc);
        if (NH == 2) fence_regs(acc + 64);
        if (prev >= 0) release_stage<CM>(&empty[prev], lane);
      } else if constexpr (PIPE) {
        static_assert(NH == 1, "the pipelined mainloop holds two 64 x 128 block accumulators");
        float sa0b[2], sa1b[2], sbb[2];
        // issues K block kb's MMAs into blk2[i] (after its stage's barrier), with its scales: the BLK
        // ones from global memory, A's VEC ones from the stage (so that a B_BLK stage can be released
        // as soon as its MMAs are done, before the promotion)
        auto issue = [&](int i, int kb) {
          const float sab = A_BLK && tm < p.tiles_m ? __ldg(p.sa + (size_t)tm * p.l4 + kb) : 1.0f;
          sbb[i] = B_BLK && tn * 128 < p.N ? __ldg(p.sb + (size_t)tn * p.l4 + kb) : 1.0f;
          mbar_wait_spin(&full[stage], phase);
          if (B_BLK) {  // (else finish reads them: it releases the stage after the promotion anyway)
            const float *sc = scales + stage * (BM + BN);
            sa0b[i] = A_BLK ? sab : sc[rl], sa1b[i] = A_BLK ? sab : sc[rl + 8];
          } else sa0b[i] = sab;
          const uint8_t *st = smem + stage * S::TILE_BYTES;
          const uint64_t da = smem_desc(st + cw * 64 * BK), db = smem_desc(st + A_BYTES);
          if (ABL != 2 && ABL != 3) {
            fence_regs(blk2[i]);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 32; k++) wgmma_m64n128k32(blk2[i], da + 2 * k, db + 2 * k, k > 0);
            wgmma_commit();
            fence_regs(blk2[i]);
          }
          if (++stage == STAGES) stage = 0, phase ^= 1;
        };
        // promotes blk2[i] (its MMAs complete) and releases its stage, the oldest held: before the
        // promotion unless it still has to read B's VEC scales from the stage
        auto finish = [&](int i) {
          fence_regs(blk2[i]);  // after the wait that completed its MMAs
          const float *sc = scales + rstage * (BM + BN);
          if (B_BLK) release_stage<CM>(&empty[rstage], lane);
          auto promote_real = [&] {
            if (B_BLK) promote<true>(acc, blk2[i], sa0b[i], sa1b[i], sbb[i], sc + BM + cl);
            else
              promote<false>(acc, blk2[i], A_BLK ? sa0b[i] : sc[rl], A_BLK ? sa0b[i] : sc[rl + 8], sbb[i],
                             sc + BM + cl);
          };
          ablate_or_promote<ABL>(acc, sa0b[i], sbb[i], p.alpha, promote_real);
          if (!B_BLK) release_stage<CM>(&empty[rstage], lane);
          if (++rstage == STAGES) rstage = 0;
        };
        // straight-line steady state (buffer 0 in flight at the loop head), so ptxas can see which
        // accumulator each wait completes; the odd or even tail after it
        issue(0, 0);
        int kb = 0;
        for (; kb + 2 < p.kblocks; kb += 2) {
          issue(1, kb + 1), wgmma_wait1(), finish(0);
          issue(0, kb + 2), wgmma_wait1(), finish(1);
        }
        if (kb + 1 < p.kblocks) issue(1, kb + 1), wgmma_wait1(), finish(0), wgmma_wait0(), finish(1);
        else wgmma_wait0(), finish(0);
      } else {
        for (int kb = 0; kb < p.kblocks; kb++) {
          // the BLK128x128 scales of this K block (global, in flight during the wait)
          float sab = 1.0f, sbb[NH];
          if (A_BLK) sab = tm < p.tiles_m ? __ldg(p.sa + (size_t)tm * p.l4 + kb) : 1.0f;
#pragma unroll
          for (int h = 0; h < NH; h++)  // a half wholly past N has no scale row: its outputs are not stored
            sbb[h] = B_BLK && (tn * NH + h) * 128 < p.N ? __ldg(p.sb + (size_t)(tn * NH + h) * p.l4 + kb) : 1.0f;
          mbar_wait_spin(&full[stage], phase);
          const uint8_t *st = smem + stage * S::TILE_BYTES;
          const float *sc = scales + stage * (BM + BN);
          const float sa0 = A_BLK ? sab : sc[rl], sa1 = A_BLK ? sab : sc[rl + 8];
          const uint64_t da = smem_desc(st + cw * 64 * BK);
#pragma unroll
          for (int h = 0; h < NH; h++) {
            const uint64_t db = smem_desc(st + A_BYTES + h * 128 * BK);
            if (ORD) {  // warpgroup 0 waits for 1's previous batch (none before its first), 1 for 0's
              if (cw == 1) named_sync(1);
              else if (ord_started) named_sync(2);
            }
            if (ABL != 2 && ABL != 3) {
              fence_regs(blk);
              wgmma_fence();
#pragma unroll
              for (int k = 0; k < BK / 32; k++) wgmma_m64n128k32(blk, da + 2 * k, db + 2 * k, k > 0);  // +32 bytes
              wgmma_commit();
              fence_regs(blk);
            }
            if (ORD) named_arrive(cw == 0 ? 1 : 2), ord_started = true;
            wgmma_wait0();
            fence_regs(blk);
            ablate_or_promote<ABL>(acc + 64 * h, sa0, sbb[h], p.alpha, [&] {
              promote<B_BLK>(acc + 64 * h, blk, sa0, sa1, sbb[h], sc + BM + h * 128 + cl);
            });
          }
          release_stage<CM>(&empty[stage], lane);
          if (++stage == STAGES) stage = 0, phase ^= 1;
        }
      }
      if constexpr (EPI) {
        // alpha * acc into this warp's buffer, 64 columns at a time; then row pieces of 4 columns,
        // (+ beta * out) and stored; N % 8 == 0, so a piece is wholly in or out
        float *ep = epi + (cw * 4 + warp) * EPI_WARP_FLOATS;
        const int r_w = tm * BM + cw * 64 + warp * 16;
#pragma unroll
        for (int h = 0; h < NH; h++) {
#pragma unroll
          for (int cc = 0; cc < 2; cc++) {
            __syncwarp();  // the previous chunk has been read
#pragma unroll
            for (int jj = 0; jj < 8; jj++) {
              const float *a = acc + 64 * h + 4 * (cc * 8 + jj);
              const int col = cl + 8 * jj;
              *(float2 *)(ep + (lane / 4) * EPI_LD + col) = make_float2(p.alpha * a[0], p.alpha * a[1]);
              *(float2 *)(ep + (lane / 4 + 8) * EPI_LD + col) = make_float2(p.alpha * a[2], p.alpha * a[3]);
            }
            __syncwarp();
            // (beta != 0) the old values of PF pieces first, all their loads in flight at once: loaded
            // one by one before each store, their latency made the accumulating K = 1024 dgrads run at
            // 307 TFLOP/s in the step against 800 without beta (024b935). PF: what fits beside acc.
            constexpr int PF = PIPE ? 1 : OUT_FP32 ? 2 : 4;  // (PIPE: its two block sums leave no room)
            using Pre = typename std::conditional<OUT_FP32, uint4, uint2>::type;
#pragma unroll
            for (int ig = 0; ig < 8; ig += PF) {
              Pre pre[PF];
              if (p.beta != 0.0f) {
#pragma unroll
                for (int it = ig; it < ig + PF; it++) {
                  const int q = it * 32 + lane, row = q >> 4, c4 = (q & 15) * 4;
                  const int r = r_w + row, c = tn * BN + h * 128 + cc * 64 + c4;
                  if (r >= p.M || c >= p.N) continue;
                  const size_t o = (size_t)r * p.N + c;
                  pre[it - ig] = *(const Pre *)((const uint8_t *)p.out + o * (OUT_FP32 ? 4 : 2));
                }
              }
#pragma unroll
              for (int it = ig; it < ig + PF; it++) {
                const int q = it * 32 + lane, row = q >> 4, c4 = (q & 15) * 4;
                const int r = r_w + row, c = tn * BN + h * 128 + cc * 64 + c4;
                if (r >= p.M || c >= p.N) continue;
                float4 v = *(const float4 *)(ep + row * EPI_LD + c4);
                const size_t o = (size_t)r * p.N + c;
                if (OUT_FP32) {
                  float4 *dst = (float4 *)((float *)p.out + o);
                  if (p.beta != 0.0f) {
                    const float4 old = *(const float4 *)&pre[it - ig];
                    v.x += p.beta * old.x, v.y += p.beta * old.y, v.z += p.beta * old.z, v.w += p.beta * old.w;
                  }
                  *dst = v;
                } else {
                  uint2 *dst = (uint2 *)((__nv_bfloat16 *)p.out + o);
                  if (p.beta != 0.0f) {  // alpha * acc rounded to BF16 first, as cuBLASLt does (bf16_first)
                    const uint2 u = make_uint2(pre[it - ig].x, pre[it - ig].y);
                    const float2 o0 = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x),
                                 o1 = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
                    v.x = bf16_first(v.x) + p.beta * o0.x, v.y = bf16_first(v.y) + p.beta * o0.y;
                    v.z = bf16_first(v.z) + p.beta * o1.x, v.w = bf16_first(v.w) + p.beta * o1.y;
                  }
                  const __nv_bfloat162 b0 = __floats2bfloat162_rn(v.x, v.y), b1 = __floats2bfloat162_rn(v.z, v.w);
                  uint2 u;
                  u.x = *(const uint32_t *)&b0, u.y = *(const uint32_t *)&b1;
                  *dst = u;
                }
              }
            }
          }
        }
      } else {
        // epilogue: alpha * acc (+ beta * out); N % 8 == 0, so a column pair is wholly in or out
        constexpr int JG = 2;  // column pairs whose old values are loaded together: what fits beside acc
#pragma unroll
        for (int h = 0; h < NH; h++) {
#pragma unroll
          for (int jg = 0; jg < 16; jg += JG) {  // JG column pairs at a time: their old values first
            uint2 pre[JG][2];                    // (beta != 0) all 2 JG loads in flight at once, as above
            if (p.beta != 0.0f) {
#pragma unroll
              for (int j = jg; j < jg + JG; j++) {
                const int c = tn * BN + h * 128 + cl + 8 * j;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                  const int r = tm * BM + rl + 8 * i;
                  if (c >= p.N || r >= p.M) continue;
                  const size_t o = (size_t)r * p.N + c;
                  if (OUT_FP32) pre[j - jg][i] = *(const uint2 *)((const float *)p.out + o);
                  else pre[j - jg][i].x = *(const uint32_t *)((const __nv_bfloat16 *)p.out + o);
                }
              }
            }
#pragma unroll
            for (int j = jg; j < jg + JG; j++) {
              const int c = tn * BN + h * 128 + cl + 8 * j;
              if (c >= p.N) continue;
#pragma unroll
              for (int i = 0; i < 2; i++) {
                const int r = tm * BM + rl + 8 * i;
                if (r >= p.M) continue;
                const float *a = acc + 64 * h + 4 * j + 2 * i;
                float v0 = p.alpha * a[0], v1 = p.alpha * a[1];
                const size_t o = (size_t)r * p.N + c;
                if (OUT_FP32) {
                  float2 *dst = (float2 *)((float *)p.out + o);
                  if (p.beta != 0.0f) {
                    const float2 old = *(const float2 *)&pre[j - jg][i];
                    v0 += p.beta * old.x, v1 += p.beta * old.y;
                  }
                  *dst = make_float2(v0, v1);
                } else {
                  __nv_bfloat162 *dst = (__nv_bfloat162 *)((__nv_bfloat16 *)p.out + o);
                  if (p.beta != 0.0f) {  // alpha * acc rounded to BF16 first, as cuBLASLt does (bf16_first)
                    const float2 old = __bfloat1622float2(*(const __nv_bfloat162 *)&pre[j - jg][i].x);
                    v0 = bf16_first(v0) + p.beta * old.x, v1 = bf16_first(v1) + p.beta * old.y;
                  }
                  *dst = __floats2bfloat162_rn(v0, v1);
                }
              }
            }
          }
        }
      }
    }
    // (ORD) warpgroup 1's last arrival on barrier 2 has no batch of 0 after it: 0 takes it here
    if (ORD && cw == 0 && ord_started) named_sync(2);
  }
  // No CTA leaves while a peer may still arrive on its barriers (every thread: the aligned barrier)
  if (CM > 1) cluster_sync();
#endif  // WGMMA_KERNEL_BODY
}

typedef CUresult (*EncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver, through the runtime (no -lcuda).
EncodeTiled encode_fn(void) {
  static EncodeTiled fn = NULL;
  if (!fn) {
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !p) die("fp4_gemm_wgmma: the driver has no cuTensorMapEncodeTiled");
    fn = (EncodeTiled)p;
  }
  return fn;
}

// The TMA map of an E4M3 operand [rows, K] (row stride K bytes): boxes of box_rows x 128 bytes,
// 128-byte swizzle, zero fill outside.
CUtensorMap tensor_map(const uint8_t *q, int rows, int K, int box_rows) {
  CUtensorMap m;
  cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)K};
  cuuint32_t box[2] = {(cuuint32_t)BK, (cuuint32_t)box_rows}, estr[2] = {1, 1};
  CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)q, dims, strides, box, estr,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) die("fp4_gemm_wgmma: cuTensorMapEncodeTiled failed (%d) for [%d, %d]", (int)r, rows, K);
  return m;
}

// Launches on a persistent grid: one CTA per SM, in clusters of CM that the GPU can hold at once
// (cudaOccupancyMaxActiveClusters: a GPC's SM count need not be a multiple of CM), at most one per
// super tile.
template <bool A_BLK, bool B_BLK, bool OUT_FP32, int BN, int CM, bool PIPE, bool EPI, bool ORD = false, int ABL = 0>
void launch(const CUtensorMap &ma, const CUtensorMap &mb, const Params &p) {
  auto k = wgmma_gemm_kernel<A_BLK, B_BLK, OUT_FP32, BN, CM, PIPE, EPI, ORD, ABL>;
  using S = Shape<BN, EPI>;
  static int max_clusters = 0;  // per instantiation
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CM, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = S::SMEM_BYTES, cfg.stream = cuda_stream();
  cfg.attrs = attr, cfg.numAttrs = 1;
  if (!max_clusters) {
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM_BYTES));
    cfg.gridDim = dim3(cuda_sm_count() / CM * CM);
    CUDA_CHECK(cudaOccupancyMaxActiveClusters(&max_clusters, k, &cfg));
    if (max_clusters < 1)
      die("fp4_gemm_wgmma: no cluster of %d CTAs with %d bytes of shared memory fits", CM, S::SMEM_BYTES);
  }
  const int super_tiles = (p.tiles_m + CM - 1) / CM * p.tiles_n;
  cfg.gridDim = dim3(CM * (super_tiles < max_clusters ? super_tiles : max_clusters));
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, ma, mb, p));
}

template <int BN, int CM, bool PIPE, bool EPI = false, bool ORD = false>
void launch_cfg(int out_fp32, int mode, const CUtensorMap &ma, const CUtensorMap &mb, const Params &p) {
  if (out_fp32) {
    if (mode == 1) launch<true, false, true, BN, CM, PIPE, EPI, ORD>(ma, mb, p);
    else if (mode == 2) launch<false, true, true, BN, CM, PIPE, EPI, ORD>(ma, mb, p);
    else launch<false, false, true, BN, CM, PIPE, EPI, ORD>(ma, mb, p);
  } else {
    if (mode == 1) launch<true, false, false, BN, CM, PIPE, EPI, ORD>(ma, mb, p);
    else if (mode == 2) launch<false, true, false, BN, CM, PIPE, EPI, ORD>(ma, mb, p);
    else launch<false, false, false, BN, CM, PIPE, EPI, ORD>(ma, mb, p);
  }
}

}  // namespace

extern "C" int fp4_gemm_wgmma_available(void) {
  static int avail = -1;
  if (avail < 0) avail = cuda_device_cc() == 90;
  return avail;
}

extern "C" const char *fp4_gemm_wgmma_unsupported(Fp8Operand A, Fp8Operand B, int M, int N, int K) {
  if (!fp4_gemm_wgmma_available()) return "needs an sm_90 GPU (Hopper) and this build's sm_90a code";
  if (A.blk128 && B.blk128) return "A and B both BLK128x128 is not a supported scale pair";
  if (M <= 0 || N <= 0 || K <= 0 || N % 8 || K % 16) return "needs N % 8 == 0 and K % 16 == 0 (TMA row strides)";
  if (!A.blk128 && M % 4) return "a VEC128 A needs M % 4 == 0 (its scales are copied in 16-byte pieces)";
  if (((uintptr_t)A.e4m3 | (uintptr_t)B.e4m3 | (uintptr_t)A.scale | (uintptr_t)B.scale) % 16)
    return "operands and scales must be 16-byte aligned";
  return NULL;
}

// The configurations this build has (each one instantiated for the three scale pairs and both
// outputs); the first TUNED of them have run on an H200 and are the ones the engine's tuner may pick:
// a configuration joins them once it has. Pruned at 2026-12-02 to those fastest of ours on some of
// the 21 GEMMs of an 8B block (998cef3: 256x1eo on 9, 256x1 on 7, 256x1e on 4, 256x2 on 1) and the
// pipelined 128 x 128 tile for the GEMMs with few 128 x 256 tiles; the others measured (128x1, 128x2,
// 128x1p, 128x2p, 128x1e, 128x2pe, the ordered 128x1o, 128x2o, 256x1o, 256x2o) were never fastest
// (docs/results/2026-12-02/gpu_test_fp4_gemm_998cef3.log), and cost build time.
static const Fp4WgmmaCfg g_configs[] = {
    {256, 1, 0, 0, 0}, {256, 2, 0, 0, 0}, {256, 1, 0, 1, 0}, {256, 1, 0, 1, 1}, {128, 1, 1, 1, 0}};
static const int TUNED = 5;

static int cfg_eq(Fp4WgmmaCfg a, Fp4WgmmaCfg b) {
  return a.bn == b.bn && a.cluster == b.cluster && a.pipelined == b.pipelined && a.epi_smem == b.epi_smem &&
         a.ordered == b.ordered;
}

// 1 + the configuration's index in g_configs, or 0 if this build does not have it.
static int cfg_index(Fp4WgmmaCfg c) {
  for (int i = 0; i < (int)(sizeof g_configs / sizeof g_configs[0]); i++)
    if (cfg_eq(c, g_configs[i])) return i + 1;
  return 0;
}

// The kernel's parameters for a 128 x bn tile.
static Params params_for(void *out, Fp8Operand A, Fp8Operand B, int M, int N, int K, int bn, float alpha, float beta) {
  const int kblocks = (K + BK - 1) / BK;
  Params p = {out,   A.scale, B.scale, M, N, K, kblocks, (kblocks + 3) / 4 * 4, (M + BM - 1) / BM, (N + bn - 1) / bn,
              alpha, beta};
  return p;
}

extern "C" void fp4_gemm_wgmma_cfg(void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K,
                                   float alpha, float beta, Fp4WgmmaCfg c) {
  const char *why = fp4_gemm_wgmma_unsupported(A, B, M, N, K);
  if (why) die("fp4_gemm_wgmma: M=%d, N=%d, K=%d: %s", M, N, K, why);
  if ((uintptr_t)out % 16) die("fp4_gemm_wgmma: out must be 16-byte aligned");
  const int ci = cfg_index(c);
  if (!ci) {
    char n[16];
    die("fp4_gemm_wgmma: configuration %s is not one this build has (fp4_gemm_wgmma_configs)",
        fp4_gemm_wgmma_cfg_name(c, n, sizeof n));
  }
  const CUtensorMap ma = tensor_map(A.e4m3, M, K, BM), mb = tensor_map(B.e4m3, N, K, c.bn / c.cluster);
  const Params p = params_for(out, A, B, M, N, K, c.bn, alpha, beta);
  const int mode = (A.blk128 ? 1 : 0) | (B.blk128 ? 2 : 0);
  switch (ci) {
    case 1:
      launch_cfg<256, 1, false>(out_fp32, mode, ma, mb, p);
      break;
    case 2:
      launch_cfg<256, 2, false>(out_fp32, mode, ma, mb, p);
      break;
    case 3:
      launch_cfg<256, 1, false, true>(out_fp32, mode, ma, mb, p);
      break;
    case 4:
      launch_cfg<256, 1, false, true, true>(out_fp32, mode, ma, mb, p);
      break;
    default:
      launch_cfg<128, 1, true, true>(out_fp32, mode, ma, mb, p);
      break;
  }
}

// 128 x 256 tiles with the staged epilogue: the fastest configuration on 11 of the 21 GEMMs of an 8B
// block on the H200 at e46efba (851-1061 TFLOP/s, 0.79x cuBLASLt over the 21 in the best of all;
// docs/gemm_wgmma.md), and within 12% of the fastest on the rest (256x1 or 256x2 on eight with a
// 14336 dimension, 128x1pe on the K = 1024 dgrads), unless that leaves SMs idle (fewer tiles than SMs),
// where the pipelined 128 x 128 tile spreads better. The tuned path (fp4_gemm_fp8_on) times them all.
extern "C" Fp4WgmmaCfg fp4_gemm_wgmma_default_cfg(int M, int N) {
  const long t256 = (long)((M + BM - 1) / BM) * ((N + 255) / 256);
  Fp4WgmmaCfg c = {256, 1, 0, 1};
  if (t256 < cuda_sm_count()) c = (Fp4WgmmaCfg){128, 1, 1, 1};
  return c;
}

extern "C" const char *fp4_gemm_wgmma_cfg_name(Fp4WgmmaCfg c, char *buf, int n) {
  snprintf(buf, n, "%dx%d%s%s%s", c.bn, c.cluster, c.pipelined ? "p" : "", c.epi_smem ? "e" : "", c.ordered ? "o" : "");
  return buf;
}

extern "C" const Fp4WgmmaCfg *fp4_gemm_wgmma_configs(int *n, int *tuned) {
  *n = (int)(sizeof g_configs / sizeof g_configs[0]);
  if (tuned) *tuned = TUNED;
  return g_configs;
}

// The configurations fp4_gemm_wgmma_ablate takes: 256x1e, 256x2, 128x1pe and 128x2pe.
static const Fp4WgmmaCfg g_ablate_cfgs[] = {{256, 1, 0, 1, 0}, {256, 2, 0, 0, 0}, {128, 1, 1, 1, 0}, {128, 2, 1, 1, 0}};

// g_ablate_cfgs[ai] with ablation X == ablate, VEC x BLK into BF16.
template <int X = 0>
void launch_ablate(int ai, int ablate, const CUtensorMap &ma, const CUtensorMap &mb, const Params &p) {
  if (ablate == X) {
    if (ai == 0) launch<false, true, false, 256, 1, false, true, false, X>(ma, mb, p);
    else if (ai == 1) launch<false, true, false, 256, 2, false, false, false, X>(ma, mb, p);
    else if (ai == 2) launch<false, true, false, 128, 1, true, true, false, X>(ma, mb, p);
    else launch<false, true, false, 128, 2, true, true, false, X>(ma, mb, p);
  } else if constexpr (X < 5) launch_ablate<X + 1>(ai, ablate, ma, mb, p);
}

extern "C" void fp4_gemm_wgmma_ablate(void *out, Fp8Operand A, Fp8Operand B, int M, int N, int K, Fp4WgmmaCfg c,
                                      int ablate) {
  const char *why = fp4_gemm_wgmma_unsupported(A, B, M, N, K);
  const int na = (int)(sizeof g_ablate_cfgs / sizeof g_ablate_cfgs[0]);
  int ai = 0;
  while (ai < na && !cfg_eq(c, g_ablate_cfgs[ai])) ai++;
  if (why || A.blk128 || !B.blk128 || ai == na || ablate < 0 || ablate > 5)
    die("fp4_gemm_wgmma_ablate: VEC x BLK into BF16, 256x1e, 256x2, 128x1pe or 128x2pe, ablate 0-5 only (%s)",
        why ? why : "");
  const CUtensorMap ma = tensor_map(A.e4m3, M, K, BM), mb = tensor_map(B.e4m3, N, K, c.bn / c.cluster);
  const Params p = params_for(out, A, B, M, N, K, c.bn, 1.0f, 0.0f);
  launch_ablate(ai, ablate, ma, mb, p);
}

extern "C" void fp4_gemm_wgmma(void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha,
                               float beta) {
  fp4_gemm_wgmma_cfg(out, out_fp32, A, B, M, N, K, alpha, beta, fp4_gemm_wgmma_default_cfg(M, N));
}
