// Tile configurations of the fused op's GEMM other than the shipped one (float16), when built
// with -DSYMMEM_BUILD_GEMM_VARIANTS=ON; empty otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "fused/flagged_gemm.hpp"

namespace symmem::bench {

struct GemmVariant {
  std::string name;
  std::function<std::string(const detail::FlaggedGemm&)> problem;
  std::function<void(const detail::FlaggedGemm&, cudaStream_t)> run;
};

std::vector<GemmVariant> flagged_gemm_variants();

}  // namespace symmem::bench
