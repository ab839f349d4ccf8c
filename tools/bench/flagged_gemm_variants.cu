// Tile configurations of the fused op's persistent GEMM, each forced (the shipped two, and
// clusters along N), for symmem-bench chunked_gemm (-DSYMMEM_BUILD_GEMM_VARIANTS=ON; float16 only). The rows
// of M they wait for are their tile height (chunks.tile_rows is set per variant).
#include "flagged_gemm_variants.hpp"

#include "fused/flagged_gemm.cuh"

namespace symmem::bench {
namespace {

using namespace cute;
namespace fg = symmem::detail::flagged_gemm;

struct Cooperative128x256Cluster1x2 {
  using TileShape = Shape<_128, _256, _64>;
  using ClusterShape = Shape<_1, _2, _1>;
  using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct Cooperative128x192Cluster1x2 {
  using TileShape = Shape<_128, _192, _64>;
  using ClusterShape = Shape<_1, _2, _1>;
  using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};

template <class Config>
GemmVariant variant(const char* name) {
  return {name, static_cast<int>(size<0>(typename Config::TileShape{})),
          [](const detail::FlaggedGemm& g) { return fg::problem<cutlass::half_t, Config>(g); },
          [](const detail::FlaggedGemm& g, cudaStream_t s) { fg::run<cutlass::half_t, Config>(g, s); }};
}

}  // namespace

std::vector<GemmVariant> flagged_gemm_variants() {
  return {variant<fg::Cooperative128x256Cluster2x1>("coop_128x256_c2x1"),
          variant<fg::Cooperative128x192Cluster2x1>("coop_128x192_c2x1"),
          variant<Cooperative128x256Cluster1x2>("coop_128x256_c1x2"),
          variant<Cooperative128x192Cluster1x2>("coop_128x192_c1x2")};
}

}  // namespace symmem::bench
