// The persistent GEMM for bfloat16 inputs and float32 output (matmul_reduce_scatter's partial
// sums), B row-major (flagged_gemm.cuh).
#include "fused/flagged_gemm.cuh"

namespace symmem::detail::flagged_gemm {

extern const Instantiation kBf16FloatOut;
const Instantiation kBf16FloatOut = shipped_instantiation<cutlass::bfloat16_t, float, cutlass::layout::RowMajor>();

}  // namespace symmem::detail::flagged_gemm
