// The persistent flag-waiting GEMM for bfloat16 (flagged_gemm.cuh).
#include "fused/flagged_gemm.cuh"

namespace symmem::detail::flagged_gemm {

void run_bf16(const FlaggedGemm& gemm, cudaStream_t stream) { run_shipped<cutlass::bfloat16_t>(gemm, stream); }
std::string problem_bf16(const FlaggedGemm& gemm) { return problem_of_shipped<cutlass::bfloat16_t>(gemm); }

}  // namespace symmem::detail::flagged_gemm
