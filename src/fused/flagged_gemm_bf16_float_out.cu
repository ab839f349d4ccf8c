// The persistent GEMM for bfloat16 inputs and float32 output: matmul_reduce_scatter's partial sums
// (flagged_gemm.cuh).
#include "fused/flagged_gemm.cuh"

namespace symmem::detail::flagged_gemm {

void run_bf16_float_out(const FlaggedGemm& gemm, cudaStream_t stream) {
  run_shipped<cutlass::bfloat16_t, float>(gemm, stream);
}
std::string problem_bf16_float_out(const FlaggedGemm& gemm) {
  return problem_of_shipped<cutlass::bfloat16_t, float>(gemm);
}

}  // namespace symmem::detail::flagged_gemm
