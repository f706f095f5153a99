// fp4/gemm_cutlass.cuh: the CUTLASS pieces of fp4/gemm_cutlass.cu's GEMM that another epilogue reuses
// (model/cuda/swiglu_epilogue.cu): the promotion by fused multiply-add, the kernel type over an epilogue
// tree, the scale layouts, and the launch. Included only where CUTLASS's headers are (FP4_HAVE_CUTLASS),
// compiled with -DNDEBUG (the Makefile sets it for those files).
#pragma once
#ifndef NDEBUG
#error "CUTLASS's device asserts make ptxas serialize the wgmma pipeline (C7510): build with -DNDEBUG"
#endif
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "fp4/gemm_fp4.h"
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

namespace fp4_cutlass {

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

// One kernel, 128x128x128 tiles, a one-CTA cluster, the cooperative schedule (the one configuration
// kept: docs/gemm_cutlass.md), for A with VEC128 scales (per row, 128 along K) and B with BLK128x128 ones:
// the out type D, the epilogue's tree of nodes (EpilogueTree's by default), C: beta's matrix type (void for
// a tree that reads none: then the epilogue keeps no shared memory for it, and the mainloop gets that for
// its stages), and the layout of C and D (RowMajor; ColumnMajor for the Wgrad, computed transposed:
// gemm_cutlass.cu's run_pair). The promotion takes one scale per accumulator row and one per tile; the
// other pair (BLK128x128 A, VEC128 B: a scale per accumulator column) ran at 0.74x cuBLASLt on an H100.
using T128 = Shape<_128, _128, _128>;
using C11 = Shape<_1, _1, _1>;
template <class D, class Tree = EpilogueTree<D>, class C = D, class LayoutCD = cutlass::layout::RowMajor>
struct Kernel {
  using E4M3 = cutlass::float_e4m3_t;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, GMMA::Major::MN, GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using MainSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpiSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  static constexpr int ALIGN_D = 16 / sizeof(D);
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T128, C11, cutlass::epilogue::collective::EpilogueTileAuto,
      float, float, C, LayoutCD, ALIGN_D, D, LayoutCD, ALIGN_D, EpiSchedule, Tree>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4M3, cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, 16,
      E4M3, cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, 16, float, T128, C11,
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

// The stride of a packed [rows, cols] matrix in CUTLASS's (rows, cols, batch) form, row-major (cols
// contiguous) or column-major (rows contiguous), as the stride type says: what its make_cute_packed_stride
// gives (tools/util, not in the headers fetched).
template <class S>
S packed_stride(int rows, int cols) {
  S s{};
  if constexpr (is_static_v<decltype(get<1>(S{}))>) {
    static_assert(get<1>(S{}) == 1, "a static column stride must be the unit one");
    get<0>(s) = cols;
  } else {
    static_assert(is_static_v<decltype(get<0>(S{}))> && get<0>(S{}) == 1, "rows or cols must be the unit stride");
    get<1>(s) = rows;
  }
  get<2>(s) = (int64_t)rows * cols;
  return s;
}

// Launches kernel K: out = its tree over A . B^T (tree: the tree's arguments; C, beta's matrix, is src, or
// out where src is NULL).
template <class K>
void run_tree(void *out, const void *src, Fp8Operand A, Fp8Operand B, int M, int N, int K_,
              typename K::GemmKernel::CollectiveEpilogue::FusionCallbacks::Arguments const &tree, int raster,
              int swizzle) {
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
  if constexpr (std::is_void_v<typename GK::ElementC>) args.epilogue = {tree, nullptr, sC, (D *)out, sD};
  else args.epilogue = {tree, (const D *)(src ? src : out), sC, (D *)out, sD};
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

// The default tree: out = D(alpha * acc) + beta * C, C read only where beta != 0.
template <class K>
void run(void *out, const void *src, Fp8Operand A, Fp8Operand B, int M, int N, int K_, float alpha, float beta,
         int raster, int swizzle) {
  // the tree's arguments, children first: beta, C, (alpha, acc, multiply), then the node's own
  typename K::GemmKernel::CollectiveEpilogue::FusionCallbacks::Arguments tree{
      {{beta}, {nullptr}, {}}, {}, {{{alpha}, {nullptr}, {}}, {}, {}}, {}};
  run_tree<K>(out, src, A, B, M, N, K_, tree, raster, swizzle);
}

}  // namespace fp4_cutlass
