// The persistent GEMM for float16 inputs and float32 output (matmul_reduce_scatter's partial
// sums), B row-major (flagged_gemm.cuh).
#include "fused/flagged_gemm.cuh"

namespace symmem::detail::flagged_gemm {

extern const Instantiation kFp16FloatOut;
const Instantiation kFp16FloatOut = shipped_instantiation<cutlass::half_t, float, cutlass::layout::RowMajor>();

}  // namespace symmem::detail::flagged_gemm
