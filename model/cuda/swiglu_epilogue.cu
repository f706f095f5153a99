// model/cuda/swiglu_epilogue.cu: model/cuda/swiglu_epilogue.h's kernel, fp4/gemm_cutlass.cuh's GEMM with an
// epilogue tree of three nodes:
//   u    = bf16(alpha * acc)                 CUTLASS's compute node with our MulRn (the plain GEMM's bits),
//   gate                                     CUTLASS's global-memory aux load (Sm90AuxLoad, no stages),
//   Sm90SwigluMx(u, gate) -> u               ours: stores h = bf16(swiglu_value(gate, u)) into its 128 x 128
//                                            tile in shared memory (mx_dual.cuh's swizzled layout), returns u
//                                            for D; after the tile's last subtile it runs the dual producer
//                                            on the tile with the epilogue's 256 consumer threads.
// The producer's barriers are the epilogue's named barrier (the kernel's producer warps never reach a
// __syncthreads). Without CUTLASS's headers the file is a stub that says so.
#include <cuda_bf16.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "fp4/gemm_cutlass.h"
#include "model/cuda/swiglu_epilogue.h"

#ifdef FP4_HAVE_CUTLASS
#include "fp4/gemm_cutlass.cuh"
#include "fp4/mx_dual.cuh"
#include "model/cuda/ops_cuda.h"

namespace {
using namespace fp4_cutlass;
using bf16c = cutlass::bfloat16_t;

struct SwigluMxArgs {
  MxOut row, col;
  MxScale mode;
  int hadamard;
};

// The node: visit() forms h per element where the accumulator fragment is; reduce() on the last subtile
// quantizes the whole tile. ROW, COL: mx_dual.cuh's output kinds (OUT_FP8, OUT_FP8 or OUT_FP8_BLK).
template <int ROW, int COL>
struct Sm90SwigluMx {
  struct SharedStorage {
    alignas(16) uint4 tile[TILE * 16];  // 128 x 128 BF16, mx_dual.cuh's swizzle
    int tile_e;                         // OUT_FP8_BLK: the tile's largest block exponent + 127
  };
  using Arguments = SwigluMxArgs;
  using Params = SwigluMxArgs;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const &, Arguments const &args, void *) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const &, Arguments const &) {
    return true;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const &, Arguments const &) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const &, Arguments const &, void *, cudaStream_t,
                                              cutlass::CudaHostAdapter * = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Sm90SwigluMx() {}
  CUTLASS_HOST_DEVICE Sm90SwigluMx(Params const &params, SharedStorage const &shared)
      : params_ptr(&params), smem(const_cast<SharedStorage *>(&shared)) {}
  Params const *params_ptr = nullptr;
  SharedStorage *smem = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(fusion::detail::ProducerLoadArgs<Args...> const &) {
    return fusion::detail::EmptyProducerLoadCallbacks{};
  }

  template <class CTensor>
  struct ConsumerStoreCallbacks : fusion::detail::EmptyConsumerStoreCallbacks {
    CTensor tC_c;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N): each fragment element's (row, column) in the problem
    Params const *p;
    SharedStorage *sm;
    int tid, tr, tc, M, N;

    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor &&c, Params const *p_, SharedStorage *sm_, int tid_, int tr_, int tc_,
                                          int M_, int N_)
        : tC_c(cute::forward<CTensor>(c)), p(p_), sm(sm_), tid(tid_), tr(tr_), tc(tc_), M(M_), N(N_) {}

    CUTLASS_DEVICE void begin() {
      // ordered before the producer's atomics by the barrier at the tile's last subtile
      if (COL == OUT_FP8_BLK && tid == 0) sm->tile_e = 0;
    }

    template <typename ElementAccumulator, typename ElementU, typename ElementG, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementU, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const &, int epi_v, int epi_m, int epi_n,
        cutlass::Array<ElementU, FragmentSize> const &frg_u, cutlass::Array<ElementG, FragmentSize> const &frg_g) {
      Tensor c = tC_c(_, _, _, epi_m, epi_n);
      __nv_bfloat16 *t = reinterpret_cast<__nv_bfloat16 *>(sm->tile);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i++) {
        const auto crd = c(epi_v * FragmentSize + i);
        const int r = (int)get<0>(crd) - tr * TILE, col = (int)get<1>(crd) - tc * TILE;
        // swiglu_value of the BF16 values, rounded as the fused producer's pack_bf16x2 rounds
        const float h = swiglu_value(static_cast<float>(frg_g[i]), static_cast<float>(frg_u[i]));
        t[(r * 16 + swz(r, col >> 3)) * 8 + (col & 7)] = __float2bfloat16_rn(h);
      }
      return frg_u;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor &&, SyncFn const &sync_fn, int, int, bool is_last_iteration, VTensor) {
      if (!is_last_iteration) return;
      sync_fn();  // the tile's every h stored
      uint4 raw[2][4];
      bool valid[2];
      CUTLASS_PRAGMA_UNROLL
      for (int it = 0; it < 2; it++) {
        const int id = tid + it * 256;
        valid[it] = (size_t)tr * TILE + (id >> 2) < (size_t)M && tc * 4 + (id & 3) < N / 32;
        mx_tile_get(sm->tile, id >> 2, id & 3, raw[it]);
      }
      const PhiloxStream none = {};
      mx_dual_tile<ROW, COL, false>(raw, valid, sm->tile, &sm->tile_e, tr, tc, M, N, p->mode, none, p->row, p->hadamard,
                                    p->col, tid, sync_fn, true);
      sync_fn();  // every read of the tile done before the next tile's epilogue writes it
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(fusion::detail::ConsumerStoreArgs<Args...> const &args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    Tensor coord = make_identity_tensor(make_shape(M, N, L));
    Tensor tC_c = fusion::detail::sm90_partition_for_epilogue<ReferenceSrc>(
        coord, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy, args.thread_idx);
    return ConsumerStoreCallbacks<decltype(tC_c)>(cute::move(tC_c), params_ptr, smem, args.thread_idx, (int)m, (int)n,
                                                  (int)M, (int)N);
  }
};

using StrideRow = cutlass::gemm::TagToStrideC_t<cutlass::layout::RowMajor>;  // [M, N] row-major, as the out
// gate: read by the consumer threads from global memory per subtile (CUTLASS's Sm90AuxLoad without stages).
// A second form, gate brought into shared memory by TMA from the epilogue's load warp, wrote wrong bytes on an
// H100 (2026-12-05) and was 0.95x of this one's time while both stayed 1.5x slower than GEMM + producer; removed.
using GateLoad = fusion::Sm90AuxLoad<0, cutlass::epilogue::collective::EpilogueTileAuto, bf16c,
                                     cutlass::layout::RowMajor, void, void, 8, false>;
template <int ROW, int COL>
using SwigluTree = fusion::Sm90EVT<
    Sm90SwigluMx<ROW, COL>,
    fusion::Sm90EVT<fusion::Sm90Compute<MulRn, bf16c, float, cutlass::FloatRoundStyle::round_to_nearest>, ScalarF,
                    fusion::Sm90AccFetch>,
    GateLoad>;

template <int COL>
void launch(__nv_bfloat16 *up, const __nv_bfloat16 *gate, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha,
            const SwigluMxArgs &sa) {
  using Kn = Kernel<bf16c, SwigluTree<OUT_FP8, COL>, void>;  // no C
  const StrideRow dg = packed_stride<StrideRow>(M, N);       // gate [M, N], as up
  // children first: (alpha, acc, multiply), the gate load, then the node's own
  typename Kn::GemmKernel::CollectiveEpilogue::FusionCallbacks::Arguments tree{
      {{{alpha}, {nullptr}, {}}, {}, {}}, {(const bf16c *)gate, bf16c(0.0f), dg}, sa};
  run_tree<Kn>(up, NULL, A, B, M, N, K, tree, 0, 1);  // raster along M, swizzle 1: see the header
}

}  // namespace
#endif  // FP4_HAVE_CUTLASS

extern "C" const char *swiglu_epilogue_unsupported(Fp8Operand A, Fp8Operand B, int M, int N, int K, MxOut row,
                                                   MxOut col) {
#ifndef FP4_HAVE_CUTLASS
  return "this build has no CUTLASS (scripts/deps.sh found no headers: .deps/cutlass/include or CUTLASS_HOME)";
#else
  const char *why = fp4_gemm_cutlass_unsupported(0, A, B, M, N, K);
  if (why) return why;
  if (M % TILE || N % TILE) return "needs M and N multiples of 128 (whole tiles of the producer)";
  if (!row.q || !row.fp8 || row.blk128 || !row.scale) return "the row copy must be FP8 with VEC128 scales";
  if (!col.q || !col.fp8 || !col.scale) return "the column copy must be FP8";
  if (((uintptr_t)row.q | (uintptr_t)col.q) % 16) return "the copies must be 16-byte aligned";
  return NULL;
#endif
}

extern "C" void up_gemm_swiglu_mx_cuda(__nv_bfloat16 *up, const __nv_bfloat16 *gate, Fp8Operand A, Fp8Operand B, int M,
                                       int N, int K, float alpha, MxScale mode, MxOut row, int hadamard, MxOut col) {
  const char *why = swiglu_epilogue_unsupported(A, B, M, N, K, row, col);
  if (why) die("up_gemm_swiglu_mx_cuda: M=%d, N=%d, K=%d: %s", M, N, K, why);
  if (!up || !gate || ((uintptr_t)up | (uintptr_t)gate) % 16)
    die("up_gemm_swiglu_mx_cuda: up and gate must be 16-byte aligned device pointers");
#ifdef FP4_HAVE_CUTLASS
  const SwigluMxArgs sa = {row, col, mode, hadamard};
  if (col.blk128) launch<OUT_FP8_BLK>(up, gate, A, B, M, N, K, alpha, sa);
  else launch<OUT_FP8>(up, gate, A, B, M, N, K, alpha, sa);
#else
  (void)mode, (void)hadamard, (void)alpha;
#endif
}
