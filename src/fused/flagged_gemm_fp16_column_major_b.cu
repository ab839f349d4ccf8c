// The persistent flag-waiting GEMM for float16, B column-major (torch's W.t(); flagged_gemm.cuh).
#include "fused/flagged_gemm.cuh"

namespace symmem::detail::flagged_gemm {

extern const Instantiation kFp16ColumnMajorB;
const Instantiation kFp16ColumnMajorB =
    shipped_instantiation<cutlass::half_t, cutlass::half_t, cutlass::layout::ColumnMajor>();

}  // namespace symmem::detail::flagged_gemm
