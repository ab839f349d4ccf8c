// The persistent flag-waiting GEMM for bfloat16, B column-major (torch's W.t(); flagged_gemm.cuh).
#include "fused/flagged_gemm.cuh"

namespace symmem::detail::flagged_gemm {

extern const Instantiation kBf16ColumnMajorB;
const Instantiation kBf16ColumnMajorB =
    shipped_instantiation<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::ColumnMajor>();

}  // namespace symmem::detail::flagged_gemm
