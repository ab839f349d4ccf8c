// The persistent flag-waiting GEMM for float16, B row-major (flagged_gemm.cuh).
#include "fused/flagged_gemm.cuh"

namespace symmem::detail::flagged_gemm {

extern const Instantiation kFp16;
const Instantiation kFp16 = shipped_instantiation<cutlass::half_t, cutlass::half_t, cutlass::layout::RowMajor>();

}  // namespace symmem::detail::flagged_gemm
