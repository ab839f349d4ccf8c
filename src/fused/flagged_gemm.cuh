// The CUTLASS instantiation behind flagged_gemm.hpp, included by one .cu per element type (two
// translation units compile in parallel). Cooperative warp-specialised kernel, 128 x 256 x 64
// tiles, clusters of 2 along M (the B tile is multicast to both CTAs), TMA epilogue.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <string>

#include "common/check.hpp"
#include "fused/flag_waiting_scheduler.cuh"
#include "fused/flagged_gemm.hpp"

namespace symmem::detail::flagged_gemm {

using namespace cute;

template <class Element>
struct Kernel {
  using Layout = cutlass::layout::RowMajor;
  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;
  using TileShape = Shape<_128, _256, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Layout, kAlignment, Element, Layout,
      kAlignment, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, Layout, kAlignment, Element, Layout, kAlignment,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int>, Mainloop, Epilogue,
                                                          symmem::detail::FlagWaitingScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  static_assert(size<0>(TileShape{}) == kFlaggedGemmTileRows);
  // The scheduler makes only warp 0 (the mainloop producer) wait for rows of A.
  static_assert(!GemmKernel::IsMainloopAuxiliaryLoadNeeded, "a second warp would load A without waiting");
};

template <class Element>
typename Kernel<Element>::Gemm::Arguments arguments_of(const FlaggedGemm& g) {
  using GemmKernel = typename Kernel<Element>::GemmKernel;
  typename Kernel<Element>::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {g.m, g.n, g.k};
  args.mainloop.ptr_A = static_cast<const Element*>(g.a);
  args.mainloop.dA = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, make_shape(g.m, g.k, 1));
  args.mainloop.ptr_B = static_cast<const Element*>(g.b);
  args.mainloop.dB = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, make_shape(g.n, g.k, 1));
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.ptr_D = static_cast<Element*>(g.c);
  args.epilogue.dD = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, make_shape(g.m, g.n, 1));
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = g.sm_count;
  // Band after band: every N tile of an M band before the next one, so that tiles are taken in the
  // order their rows arrive (the scheduler rotates the bands).
  args.scheduler.raster_order = decltype(args.scheduler.raster_order)::AlongN;
  args.scheduler.max_swizzle_size = 1;
  args.scheduler.chunks = g.chunks;
  return args;
}

// Empty when the kernel can run `g`, else why (nothing is launched).
template <class Element>
std::string problem(const FlaggedGemm& g) {
  using Gemm = typename Kernel<Element>::Gemm;
  const auto args = arguments_of<Element>(g);
  const cutlass::Status status = Gemm::can_implement(args);
  if (status != cutlass::Status::kSuccess)
    return std::string("the GEMM cannot run this shape: ") + cutlassGetStatusString(status);
  if (Gemm::get_workspace_size(args) != 0) return "the persistent GEMM unexpectedly needs a workspace";
  return {};
}

template <class Element>
void run(const FlaggedGemm& g, cudaStream_t stream) {
  using Gemm = typename Kernel<Element>::Gemm;
  Gemm gemm;
  cutlass::Status status = gemm.initialize(arguments_of<Element>(g), nullptr, stream);
  if (status != cutlass::Status::kSuccess)
    throw Error(ErrorCode::kCudaError, std::string("all_gather_matmul: GEMM initialisation failed: ") +
                                           cutlassGetStatusString(status));
  status = gemm.run(stream);
  SYMMEM_CUDA_CHECK(cudaGetLastError());
  if (status != cutlass::Status::kSuccess)
    throw Error(ErrorCode::kCudaError,
                std::string("all_gather_matmul: GEMM launch failed: ") + cutlassGetStatusString(status));
}

}  // namespace symmem::detail::flagged_gemm
