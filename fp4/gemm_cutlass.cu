// fp4/gemm_cutlass.cu: fp4/gemm_cutlass.h's GEMM, an instantiation of CUTLASS's Hopper FP8 GEMM
// with blockwise scaling (the collective of its example 67: TMA-fed, warp-specialized, persistent;
// per 128-deep K block the wgmma sums go to a block accumulator that is promoted into the fp32 result
// as acc += block * (sa * sb)), on our operands as they are:
// - A [M,K] and B [N,K] E4M3, K contiguous (CUTLASS's RowMajor A, ColumnMajor B);
// - VEC128 scales scale[(k/128) * rows + r]: granularity 1 along the rows, 128 along K, rows
//   contiguous (CUTLASS's "MN-major" scale layout, stride rows);
// - BLK128x128 scales scale[(r/128) * L4 + k/128]: granularity 128 x 128, K contiguous ("K-major"),
//   the row-block stride L4 = mx_blk128_l4(K) (ceil(K/128) padded to 4) given to the layout by hand,
//   as CUTLASS's own helper would take ceil(K/128);
// - the epilogue is our tree of CUTLASS's epilogue nodes: alpha * acc rounded to the out type, then
//   + beta * out in fp32 and rounded again (cuBLASLt's arithmetic, found on the H200: docs/gemm_wgmma.md);
//   with beta == 0 out is not read (CUTLASS's beta * C node skips the load then).
// The tile scheduler is CUTLASS's persistent one (every output tile by one CTA over all of K: no
// split-K, no stream-K, no atomics), so the reduction order is fixed and results are bit-identical run
// to run. The promotion is an explicit fused multiply-add (below, replacing CUTLASS's accumulator
// helper), as in our former own kernel (docs/gemm_wgmma.md).
//
// The kernels are Hopper-only: CUTLASS compiles their bodies for sm_90a and a stub for other targets
// (its ENABLE_SM90_KERNEL_LEVEL guard), and fp4_gemm_cutlass_available() asks for a cc 9.0 device.
// Without CUTLASS's headers (FP4_HAVE_CUTLASS unset: scripts/deps.sh did not find them) the file is
// the stub alone.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "fp4/gemm_cutlass.h"

#ifdef FP4_HAVE_CUTLASS
#ifndef NDEBUG  // the Makefile sets it for this file
#error "fp4/gemm_cutlass.cu needs -DNDEBUG: CUTLASS's device asserts make ptxas serialize the wgmma pipeline (C7510)"
#endif
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/fp8_accumulation.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

// The promotion with an explicit fused multiply-add, acc = fmaf(block, sa * sb, acc), as our former
// own kernel did: CUTLASS writes it `acc += block * s`, which the build's -fmad=false (an FMA only where
// the code calls one) would split into a multiply and an add, more instructions and energy per flop
// in the mainloop (our former own kernel gained 11-26% from the fused form, docs/gemm_wgmma.md). With the
// engine's power-of-two scales block * s is exact and both forms round once, at the add: the same
// bits. A specialization of CUTLASS's accumulator helper (fp8_accumulation.hpp) for fp32 register
// accumulators, with the interface its blockwise collective calls: the block accumulator (operator()),
// and after each K block scale / scale_if_needed with one scale, a tensor of them, or two tensors.
namespace cutlass::gemm::collective {
template <size_t N, class LayoutAccum>
struct GmmaFP8Accumulation<cute::ArrayEngine<float, N>, LayoutAccum> {
  using TensorAccum = cute::Tensor<cute::ArrayEngine<float, N>, LayoutAccum>;
  TensorAccum &acc_;
  TensorAccum block_;
  uint32_t interval_, per_iteration_, count_ = 0, reset_ = 0;  // MMAs per promotion, per K tile, so far

  CUTLASS_DEVICE GmmaFP8Accumulation(TensorAccum &acc, uint32_t interval, uint32_t per_iteration)
      : acc_(acc), interval_(interval), per_iteration_(per_iteration) {
    block_ = cute::make_fragment_like(acc);
  }
  CUTLASS_DEVICE TensorAccum &operator()() { return block_; }
  CUTLASS_DEVICE bool prepare_if_needed() { return reset_; }

  template <class S>
  CUTLASS_DEVICE void scale(S const &s) {  // a scale, or a tensor of them shaped as the accumulator
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(acc_); i++) {
      if constexpr (cute::is_tensor<S>::value) acc_(i) = fmaf(block_(i), s(i), acc_(i));
      else acc_(i) = fmaf(block_(i), s, acc_(i));
    }
  }
  template <class SA, class SB>
  CUTLASS_DEVICE void scale(SA const &sa, SB const &sb) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(acc_); i++) acc_(i) = fmaf(block_(i), sa(i) * sb(i), acc_(i));
  }
  // Promotion every interval_ MMAs (the collective calls these when a scale block spans K tiles).
  template <class... S>
  CUTLASS_DEVICE void scale_if_needed(S const &...s) {
    count_ += per_iteration_;
    reset_ = __shfl_sync(0xffffffff, count_ == interval_, 0);
    if (reset_) scale(s...), count_ = 0;
  }
  template <class... S>
  CUTLASS_DEVICE void scale_residue_if_needed(S const &...s) {
    if (__shfl_sync(0xffffffff, count_ > 0, 0)) scale(s...);
  }
};
}  // namespace cutlass::gemm::collective

namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// alpha * acc in fp32, __fmul_rn: never contracted into the add that follows, whatever the flags.
template <class T>
struct MulRn {
  CUTLASS_DEVICE T operator()(T const &a, T const &b) const {
    T r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < (int)T::kElements; i++) r[i] = __fmul_rn(a[i], b[i]);
    return r;
  }
};

// out = bf16-or-fp32( float(D(alpha * acc)) + beta * C ): the inner node rounds alpha * acc to the
// out type D; the outer is CUTLASS's beta * C + X node, which skips reading C when beta is 0.
using ScalarF = fusion::Sm90ScalarBroadcast<float, Stride<_0, _0, int64_t>>;
template <class D>
using EpilogueTree = fusion::Sm90EVT<
    fusion::Sm90Compute<cutlass::homogeneous_multiply_add, D, float, cutlass::FloatRoundStyle::round_to_nearest>,
    ScalarF, fusion::Sm90SrcFetch<D>,
    fusion::Sm90EVT<fusion::Sm90Compute<MulRn, D, float, cutlass::FloatRoundStyle::round_to_nearest>, ScalarF,
                    fusion::Sm90AccFetch>>;

// One kernel: the scale pair (A_BLK: A in BLK128x128, else B), the out type, tile, cluster, schedule.
template <bool A_BLK, class D, class Tile, class Cluster, bool PINGPONG>
struct Kernel {
  using E4M3 = cutlass::float_e4m3_t;
  static constexpr auto MAJOR_A = A_BLK ? GMMA::Major::K : GMMA::Major::MN;
  static constexpr auto MAJOR_B = A_BLK ? GMMA::Major::MN : GMMA::Major::K;
  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<A_BLK ? 128 : 1, A_BLK ? 1 : 128, 128, MAJOR_A, MAJOR_B>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using MainSchedule = std::conditional_t<PINGPONG, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise,
                                          cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>;
  using EpiSchedule = std::conditional_t<PINGPONG, cutlass::epilogue::TmaWarpSpecialized,
                                         cutlass::epilogue::TmaWarpSpecializedCooperative>;
  static constexpr int ALIGN_D = 16 / sizeof(D);
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, D, cutlass::layout::RowMajor, ALIGN_D, D,
      cutlass::layout::RowMajor, ALIGN_D, EpiSchedule, EpilogueTree<D>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4M3, cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, 16,
      E4M3, cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, 16, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

// A scale layout in CUTLASS's form: rows x K in blocks of g rows (1 or 128) and 128 of K; K-major
// (BLK128x128: row-block stride l4) or rows-major (VEC128: K-block stride rows).
template <class Layout>
Layout scale_layout(int rows, int K, int blk) {
  const int kb = (K + 127) / 128;
  const int rb = blk ? (rows + 127) / 128 : rows;
  const int l4 = (kb + 3) / 4 * 4;                                      // mx_blk128_l4
  if constexpr (is_static_v<decltype(get<0, 1>(Layout{}.stride()))>) {  // rows contiguous (VEC128)
    return make_layout(make_shape(make_shape(get<0, 0>(Layout{}.shape()), rb), make_shape(_128{}, kb), 1),
                       make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, rb), rb * kb));
  } else {  // K contiguous (BLK128x128)
    return make_layout(make_shape(make_shape(get<0, 0>(Layout{}.shape()), rb), make_shape(_128{}, kb), 1),
                       make_stride(make_stride(_0{}, l4), make_stride(_0{}, _1{}), rb * l4));
  }
}

// The stride of a [rows, cols] row-major operand (cols contiguous) in CUTLASS's (rows, cols, batch)
// form: what its make_cute_packed_stride gives (tools/util, not in the headers fetched).
template <class S>
S packed_stride(int rows, int cols) {
  static_assert(is_static_v<decltype(get<1>(S{}))> && get<1>(S{}) == 1, "cols must be the unit stride");
  S s{};
  get<0>(s) = cols;
  get<2>(s) = (int64_t)rows * cols;
  return s;
}

template <class K>
void run(void *out, const void *src, Fp8Operand A, Fp8Operand B, int M, int N, int K_, float alpha, float beta,
         int raster, int swizzle) {
  using Gemm = typename K::Gemm;
  using GK = typename K::GemmKernel;
  using D = typename GK::ElementD;
  const auto sA = packed_stride<typename GK::StrideA>(M, K_), sB = packed_stride<typename GK::StrideB>(N, K_);
  const auto sC = packed_stride<typename GK::StrideC>(M, N), sD = packed_stride<typename GK::StrideD>(M, N);
  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = make_shape(M, N, K_, 1);
  args.mainloop = {(const cutlass::float_e4m3_t *)A.e4m3,
                   sA,
                   (const cutlass::float_e4m3_t *)B.e4m3,
                   sB,
                   A.scale,
                   scale_layout<typename K::LayoutSFA>(M, K_, A.blk128),
                   B.scale,
                   scale_layout<typename K::LayoutSFB>(N, K_, B.blk128)};
  // the tree's arguments, children first: beta, C, (alpha, acc, multiply), then the node's own
  typename GK::CollectiveEpilogue::FusionCallbacks::Arguments tree{
      {{beta}, {nullptr}, {}}, {}, {{{alpha}, {nullptr}, {}}, {}, {}}, {}};
  args.epilogue = {tree, (const D *)(src ? src : out), sC, (D *)out, sD};  // C: beta's matrix
  args.hw_info.device_id = 0;
  CUDA_CHECK(cudaGetDevice(&args.hw_info.device_id));
  args.hw_info.sm_count = cuda_sm_count();
  args.scheduler.raster_order =
      raster ? GK::TileScheduler::RasterOrderOptions::AlongN : GK::TileScheduler::RasterOrderOptions::AlongM;
  args.scheduler.max_swizzle_size = swizzle;
  Gemm gemm;
  const cutlass::Status ok = gemm.can_implement(args);
  if (ok != cutlass::Status::kSuccess)
    die("fp4_gemm_cutlass: CUTLASS cannot implement M=%d N=%d K=%d: %s", M, N, K_, cutlassGetStatusString(ok));
  if (Gemm::get_workspace_size(args) != 0)  // the persistent scheduler needs none; a change would show here
    die("fp4_gemm_cutlass: the kernel asks for %zu bytes of workspace (none expected)", Gemm::get_workspace_size(args));
  cutlass::Status st = gemm.initialize(args, nullptr, cuda_stream());
  if (st == cutlass::Status::kSuccess) st = gemm.run(cuda_stream());
  if (st != cutlass::Status::kSuccess) die("fp4_gemm_cutlass: launch failed: %s", cutlassGetStatusString(st));
  CUDA_CHECK_LAUNCH();
}

// The kernel: 128x128x128 tiles, one-CTA clusters, the cooperative schedule, instantiated for the two
// scale-pair/out combinations the linear uses. (Two-CTA clusters along M or N and the ping-pong schedule
// with 64-row tiles were built too and won no shape of an 8B block against cuBLASLt on an H100, where
// this one won one: docs/gemm_cutlass.md; removed on 2026-12-05.)
using T128 = Shape<_128, _128, _128>;
using C11 = Shape<_1, _1, _1>;

template <class TileBf16, class TileF32, class Cluster, bool PP>
void run_pair(void *out, const void *src, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha,
              float beta, int raster, int swizzle) {
  if (out_fp32) run<Kernel<true, float, TileF32, Cluster, PP>>(out, src, A, B, M, N, K, alpha, beta, raster, swizzle);
  else
    run<Kernel<false, cutlass::bfloat16_t, TileBf16, Cluster, PP>>(out, src, A, B, M, N, K, alpha, beta, raster,
                                                                   swizzle);
}

struct Cfg {
  int raster, swizzle;  // raster 0: along M, 1: along N
  const char *name;
};
// The search space: both raster orders and a swizzle of 1 or 4 tiles (CUTLASS's tile scheduler groups
// the raster into strips of that many tiles for L2 reuse).
const Cfg CFGS[] = {
    {0, 1, "128x128c1/M1"},
    {1, 1, "128x128c1/N1"},
    {0, 4, "128x128c1/M4"},
    {1, 4, "128x128c1/N4"},
};
constexpr int NCFG = sizeof CFGS / sizeof CFGS[0];
// The first TUNED of them have run on hardware and may be chosen by the tuner: all four, each with
// cuBLASLt's bits on every shape of tests/gpu/gpu_test_fp4_gemm.cu on an H100 (2026-12-05, 1426fc8);
// the tuner still keeps one only where its result has cuBLASLt's bits on that very call, and only where
// it is faster. FP4_CUTLASS_TUNED=N in the environment overrides the count (0: cuBLASLt everywhere).
constexpr int TUNED = 4;
int tuned_count(void) {
  static int t = -1;
  if (t < 0) {
    const char *e = getenv("FP4_CUTLASS_TUNED");
    t = e ? atoi(e) : TUNED;
    t = t < 0 ? 0 : t > NCFG ? NCFG : t;
  }
  return t;
}

}  // namespace
#endif  // FP4_HAVE_CUTLASS

extern "C" int fp4_gemm_cutlass_available(void) {
#ifdef FP4_HAVE_CUTLASS
  static int avail = -1;
  if (avail < 0) avail = cuda_device_cc() == 90;
  return avail;
#else
  return 0;
#endif
}

extern "C" const char *fp4_gemm_cutlass_unsupported(int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K) {
#ifndef FP4_HAVE_CUTLASS
  return "this build has no CUTLASS (scripts/deps.sh found no headers: .deps/cutlass/include or CUTLASS_HOME)";
#endif
  if (!fp4_gemm_cutlass_available()) return "needs an sm_90 GPU (Hopper) and this build's sm_90a code";
  if (!out_fp32 && (A.blk128 || !B.blk128)) return "BF16 out is built for VEC128 A x BLK128x128 B only";
  if (out_fp32 && (!A.blk128 || B.blk128)) return "fp32 out is built for BLK128x128 A x VEC128 B only";
  if (M <= 0 || N <= 0 || K <= 0 || K % 16) return "needs K % 16 == 0 (TMA row strides)";
  if (N % (out_fp32 ? 4 : 8)) return "needs out rows of whole 16 bytes (N % 8 in BF16, N % 4 in fp32)";
  if (!A.blk128 && M % 4) return "a VEC128 A needs M % 4 == 0 (its scales come by TMA)";
  if (!B.blk128 && N % 4) return "a VEC128 B needs N % 4 == 0 (its scales come by TMA)";
  if (((uintptr_t)A.e4m3 | (uintptr_t)B.e4m3 | (uintptr_t)A.scale | (uintptr_t)B.scale) % 16)
    return "operands and scales must be 16-byte aligned";
  return NULL;
}

extern "C" int fp4_gemm_cutlass_configs(int *tuned) {
#ifdef FP4_HAVE_CUTLASS
  if (tuned) *tuned = tuned_count();
  return NCFG;
#else
  if (tuned) *tuned = 0;
  return 0;
#endif
}

extern "C" const char *fp4_gemm_cutlass_cfg_name(int cfg) {
#ifdef FP4_HAVE_CUTLASS
  if (cfg >= 0 && cfg < NCFG) return CFGS[cfg].name;
#endif
  return "none";
}

extern "C" void fp4_gemm_cutlass_cfg(void *out, const void *src, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N,
                                     int K, float alpha, float beta, int cfg) {
  const char *why = fp4_gemm_cutlass_unsupported(out_fp32, A, B, M, N, K);
  if (why) die("fp4_gemm_cutlass: M=%d, N=%d, K=%d: %s", M, N, K, why);
  if (((uintptr_t)out | (uintptr_t)src) % 16) die("fp4_gemm_cutlass: out and src must be 16-byte aligned");
#ifdef FP4_HAVE_CUTLASS
  if (cfg < 0 || cfg >= NCFG) die("fp4_gemm_cutlass: configuration %d is not one of the %d this build has", cfg, NCFG);
  const Cfg c = CFGS[cfg];
  run_pair<T128, T128, C11, false>(out, src, out_fp32, A, B, M, N, K, alpha, beta, c.raster, c.swizzle);
#endif
}
