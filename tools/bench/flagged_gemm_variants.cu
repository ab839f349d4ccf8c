// Tile configurations of the fused op's persistent GEMM, each forced (the shipped two, and
// clusters along N), for symmem-bench chunked_gemm (-DSYMMEM_BUILD_GEMM_VARIANTS=ON; float16
// only). All have the shipped tile height (fg::Cooperative), so they wait for rows as it does.
#include "flagged_gemm_variants.hpp"

#include "fused/flagged_gemm.cuh"

namespace symmem::bench {
namespace {

using namespace cute;
namespace fg = symmem::detail::flagged_gemm;

template <class Config>
GemmVariant variant(const char* name) {
  return {name,
          [](const detail::FlaggedGemm& g) { return fg::problem<cutlass::half_t, Config>(g); },
          [](const detail::FlaggedGemm& g, cudaStream_t s) { fg::run<cutlass::half_t, Config>(g, s); }};
}

}  // namespace

std::vector<GemmVariant> flagged_gemm_variants() {
  return {variant<fg::Cooperative128x256Cluster2x1>("coop_128x256_c2x1"),
          variant<fg::Cooperative128x192Cluster2x1>("coop_128x192_c2x1"),
          variant<fg::Cooperative<256, 1, 2>>("coop_128x256_c1x2"),
          variant<fg::Cooperative<192, 1, 2>>("coop_128x192_c1x2")};
}

}  // namespace symmem::bench
