// Built without -DSYMMEM_BUILD_GEMM_VARIANTS=ON: no other tile configurations.
#include "flagged_gemm_variants.hpp"

namespace symmem::bench {

std::vector<GemmVariant> flagged_gemm_variants() { return {}; }

}  // namespace symmem::bench
