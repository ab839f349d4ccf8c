// The CUTLASS instantiation behind flagged_gemm.hpp, included by one .cu per (input type, output
// type, B layout) (the translation units compile in parallel). Shipped: cooperative
// warp-specialised kernels, 128 x 256 or 128 x 192 tiles (K step 64), clusters of 2 along M, TMA
// epilogue. A and C are row-major; B row-major ([k x n], N contiguous: the wgmma reads it
// MN-major) or column-major (K contiguous, torch's W.t(): the K-major operand wgmma reads
// natively), the layout a template argument, so each layout is its own kernel and B is never
// copied.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <string>
#include <type_traits>

#include "common/check.hpp"
#include "fused/flag_waiting_scheduler.cuh"
#include "fused/flagged_gemm.hpp"

namespace symmem::detail::flagged_gemm {

using namespace cute;

// A cooperative warp-specialised configuration: 128-row tiles TileN wide (K step 64), clusters of
// ClusterM x ClusterN tiles.
template <int TileN, int ClusterM, int ClusterN>
struct Cooperative {
  using TileShape = Shape<Int<kFlaggedGemmTileRows>, Int<TileN>, _64>;
  using ClusterShape = Shape<Int<ClusterM>, Int<ClusterN>, _1>;
  using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};

// The shipped tile configurations (flagged_gemm_tile_n picks one per shape): 128 x 256 and 128 x
// 192, clusters of 2 along M (the B tile is multicast to both CTAs). On one H200 (N = 6656, K =
// 16384, fp16, raster along N as shipped, bench/results/h200x1/fused_gemm_tiles_1.csv) 128 x 192
// takes 5 / 3 / 3 % less time than 128 x 256 at M = 4096 / 8192 / 16384 (fewer idle SMs in the
// last wave).
using Cooperative128x256Cluster2x1 = Cooperative<256, 2, 1>;
using Cooperative128x192Cluster2x1 = Cooperative<192, 2, 1>;

// Element: A and B; ElementOut: C (Element, or float for matmul_reduce_scatter's partial sums);
// LayoutB: cutlass::layout::RowMajor or ColumnMajor.
template <class Element, class Config = Cooperative128x256Cluster2x1, class ElementOut = Element,
          class LayoutB = cutlass::layout::RowMajor>
struct Kernel {
  using Layout = cutlass::layout::RowMajor;  // of A and C
  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;
  static constexpr int kAlignmentOut = 128 / cutlass::sizeof_bits<ElementOut>::value;
  using TileShape = typename Config::TileShape;
  using ClusterShape = typename Config::ClusterShape;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Layout, kAlignmentOut, ElementOut, Layout,
      kAlignmentOut, typename Config::EpilogueSchedule>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, Layout, kAlignment, Element, LayoutB, kAlignment,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Config::MainloopSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int>, Mainloop, Epilogue,
                                                          symmem::detail::FlagWaitingScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  // The scheduler makes only warp 0 (the mainloop producer) wait for rows of A.
  static_assert(!GemmKernel::IsMainloopAuxiliaryLoadNeeded, "a second warp would load A without waiting");
  // What the scheduler's announcements count on (flag_waiting_scheduler.cuh): one TMA store group
  // committed per epilogue subtile, subtiles that tile the tile.
  using EpilogueTile = typename Epilogue::EpilogueTile;
  static constexpr int kStoreGroupsPerTile =
      (size<0>(TileShape{}) / size<0>(EpilogueTile{})) * (size<1>(TileShape{}) / size<1>(EpilogueTile{}));
  static_assert(size<0>(TileShape{}) % size<0>(EpilogueTile{}) == 0 &&
                    size<1>(TileShape{}) % size<1>(EpilogueTile{}) == 0,
                "epilogue subtiles must tile the tile");
  // The scheduler's barrier of the consumer threads when it announces finished tiles.
  static_assert(GemmKernel::NumMMAThreads == FlagWaitingTileScheduler::kConsumerThreads &&
                    GemmKernel::NumLoadWarpGroups == FlagWaitingTileScheduler::kLoadWarpGroups,
                "the scheduler's announcement assumes the cooperative kernel's warp groups");
};
static_assert(size<0>(Cooperative128x256Cluster2x1::TileShape{}) == kFlaggedGemmTileRows);

template <class Element, class Config = Cooperative128x256Cluster2x1, class ElementOut = Element,
          class LayoutB = cutlass::layout::RowMajor>
typename Kernel<Element, Config, ElementOut, LayoutB>::Gemm::Arguments arguments_of(const FlaggedGemm& g) {
  using K = Kernel<Element, Config, ElementOut, LayoutB>;
  using GemmKernel = typename K::GemmKernel;
  typename K::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {g.m, g.n, g.k};
  args.mainloop.ptr_A = static_cast<const Element*>(g.a);
  args.mainloop.dA = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, make_shape(g.m, g.k, 1));
  args.mainloop.ptr_B = static_cast<const Element*>(g.b);
  // Packed in its layout: (n, k) strides (1, n) row-major, (k, 1) column-major.
  args.mainloop.dB = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, make_shape(g.n, g.k, 1));
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.ptr_D = static_cast<ElementOut*>(g.c);
  args.epilogue.dD = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, make_shape(g.m, g.n, 1));
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = g.sm_count;
  // Band after band: every N tile of an M band before the next one, so that tiles are taken in the
  // order their rows arrive (the scheduler rotates the bands).
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.raster_order = g.raster_along_m ? Raster::AlongM : Raster::AlongN;
  args.scheduler.max_swizzle_size = g.swizzle;
  args.scheduler.chunks = g.chunks;
  args.scheduler.chunks.store_groups = K::kStoreGroupsPerTile;
  return args;
}

// Empty when the kernel can run `g`, else why (nothing is launched).
template <class Element, class Config = Cooperative128x256Cluster2x1, class ElementOut = Element,
          class LayoutB = cutlass::layout::RowMajor>
std::string problem(const FlaggedGemm& g) {
  using Gemm = typename Kernel<Element, Config, ElementOut, LayoutB>::Gemm;
  const auto args = arguments_of<Element, Config, ElementOut, LayoutB>(g);
  const cutlass::Status status = Gemm::can_implement(args);
  if (status != cutlass::Status::kSuccess)
    return std::string("the GEMM cannot run this shape: ") + cutlassGetStatusString(status);
  if (Gemm::get_workspace_size(args) != 0) return "the persistent GEMM unexpectedly needs a workspace";
  return {};
}

template <class Element, class Config = Cooperative128x256Cluster2x1, class ElementOut = Element,
          class LayoutB = cutlass::layout::RowMajor>
void run(const FlaggedGemm& g, cudaStream_t stream) {
  using Gemm = typename Kernel<Element, Config, ElementOut, LayoutB>::Gemm;
  Gemm gemm;
  cutlass::Status status = gemm.initialize(arguments_of<Element, Config, ElementOut, LayoutB>(g), nullptr, stream);
  if (status != cutlass::Status::kSuccess)
    throw Error(ErrorCode::kCudaError, std::string("fused GEMM initialisation failed: ") +
                                           cutlassGetStatusString(status));
  status = gemm.run(stream);
  SYMMEM_CUDA_CHECK(cudaGetLastError());
  if (status != cutlass::Status::kSuccess)
    throw Error(ErrorCode::kCudaError, std::string("fused GEMM launch failed: ") + cutlassGetStatusString(status));
}

// The shipped configuration's width for g (g.tile_n, else flagged_gemm_tile_n's choice), or 0 when
// g.tile_n is neither 192 nor 256. problem and run both go through it: they agree by construction.
inline int shipped_width(const FlaggedGemm& g) {
  const int width = g.tile_n ? g.tile_n : flagged_gemm_tile_n(g.m, g.n, g.sm_count);
  return width == 192 || width == 256 ? width : 0;
}

// Whether `g` asks for the B layout an instantiation was built for (the dispatch picks by it; a
// kernel given the other layout would read B transposed).
template <class LayoutB>
bool b_layout_is(const FlaggedGemm& g) {
  return g.b_column_major == std::is_same_v<LayoutB, cutlass::layout::ColumnMajor>;
}

template <class Element, class ElementOut = Element, class LayoutB = cutlass::layout::RowMajor>
std::string problem_of_shipped(const FlaggedGemm& g) {
  if (!b_layout_is<LayoutB>(g)) return "the GEMM was dispatched to the kernel of the other B layout";
  switch (shipped_width(g)) {
    case 192: return problem<Element, Cooperative128x192Cluster2x1, ElementOut, LayoutB>(g);
    case 256: return problem<Element, Cooperative128x256Cluster2x1, ElementOut, LayoutB>(g);
    default: return "tile_n must be 192 or 256, got " + std::to_string(g.tile_n);
  }
}

template <class Element, class ElementOut = Element, class LayoutB = cutlass::layout::RowMajor>
void run_shipped(const FlaggedGemm& g, cudaStream_t stream) {
  if (!b_layout_is<LayoutB>(g))
    throw Error(ErrorCode::kInternal, "fused GEMM: dispatched to the kernel of the other B layout");
  switch (shipped_width(g)) {
    case 192: return run<Element, Cooperative128x192Cluster2x1, ElementOut, LayoutB>(g, stream);
    case 256: return run<Element, Cooperative128x256Cluster2x1, ElementOut, LayoutB>(g, stream);
    default:
      throw Error(ErrorCode::kInvalidArgument, "fused GEMM: tile_n must be 192 or 256, got " + std::to_string(g.tile_n));
  }
}

// The Instantiation (flagged_gemm.hpp) of one translation unit.
template <class Element, class ElementOut = Element, class LayoutB = cutlass::layout::RowMajor>
constexpr Instantiation shipped_instantiation() {
  return {&run_shipped<Element, ElementOut, LayoutB>, &problem_of_shipped<Element, ElementOut, LayoutB>};
}

}  // namespace symmem::detail::flagged_gemm
