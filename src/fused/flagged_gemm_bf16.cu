// The persistent flag-waiting GEMM for bfloat16, B row-major (flagged_gemm.cuh).
#include "fused/flagged_gemm.cuh"

namespace symmem::detail::flagged_gemm {

extern const Instantiation kBf16;
const Instantiation kBf16 =
    shipped_instantiation<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::RowMajor>();

}  // namespace symmem::detail::flagged_gemm
