// The persistent GEMM for float16 inputs and float32 output (matmul_reduce_scatter's partial
// sums), B column-major (torch's W.t(); flagged_gemm.cuh).
#include "fused/flagged_gemm.cuh"

namespace symmem::detail::flagged_gemm {

extern const Instantiation kFp16FloatOutColumnMajorB;
const Instantiation kFp16FloatOutColumnMajorB =
    shipped_instantiation<cutlass::half_t, float, cutlass::layout::ColumnMajor>();

}  // namespace symmem::detail::flagged_gemm
