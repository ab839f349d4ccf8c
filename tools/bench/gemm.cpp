#include "gemm.hpp"

#include <stdexcept>
#include <string>

#include "bench_context.hpp"

namespace symmem::bench {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(status)));
}

}  // namespace

Gemm::Gemm(int m, int n, int k, DataType type, cudaStream_t stream)
    : m_(m), n_(n), k_(k), elem_(dtype_size(type)) {
  if (type != DataType::kFloat16 && type != DataType::kBFloat16)
    throw std::invalid_argument("the benchmark GEMM takes float16 or bfloat16");
  type_ = type == DataType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
  check(cublasLtCreate(&handle_), "cublasLtCreate");
  BENCH_CUDA_CHECK(cudaMalloc(&a_, size_t(m) * k * elem_));
  BENCH_CUDA_CHECK(cudaMalloc(&b_, size_t(k) * n * elem_));
  BENCH_CUDA_CHECK(cudaMalloc(&c_, size_t(m) * n * elem_));
  for (void*& w : workspaces_) BENCH_CUDA_CHECK(cudaMalloc(&w, kWorkspace));
  upload(a_, host_data(size_t(m) * k, type, 11, Fill::kIntegers), stream);
  upload(b_, host_data(size_t(k) * n, type, 12, Fill::kIntegers), stream);
  check(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  check(cublasLtMatrixLayoutCreate(&b_layout_, type_, n, k, n), "cublasLtMatrixLayoutCreate");
  shape(m);
}

Gemm::~Gemm() {
  for (auto& [rows, s] : shapes_) {
    cublasLtMatrixLayoutDestroy(s.a);
    cublasLtMatrixLayoutDestroy(s.c);
  }
  cublasLtMatrixLayoutDestroy(b_layout_);
  cublasLtMatmulDescDestroy(desc_);
  cublasLtDestroy(handle_);
  cudaFree(a_);
  cudaFree(b_);
  cudaFree(c_);
  for (void* w : workspaces_) cudaFree(w);
}

Gemm::Shape& Gemm::shape(int rows) {
  auto it = shapes_.find(rows);
  if (it != shapes_.end()) return it->second;
  Shape s;
  check(cublasLtMatrixLayoutCreate(&s.a, type_, k_, rows, k_), "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&s.c, type_, n_, rows, n_), "cublasLtMatrixLayoutCreate");
  cublasLtMatmulPreference_t pref;
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  size_t ws = kWorkspace;
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
        "cublasLtMatmulPreferenceSetAttribute");
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, desc_, b_layout_, s.a, s.c, s.c, pref, 1, &s.heuristic, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check(st, "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0) throw std::runtime_error("cuBLASLt found no algorithm for the GEMM");
  return shapes_.emplace(rows, s).first->second;
}

std::string Gemm::algo_description(int rows) {
  const cublasLtMatmulAlgo_t& algo = shape(rows).heuristic.algo;
  std::string out;
  for (auto [attribute, name] : {std::pair{CUBLASLT_ALGO_CONFIG_ID, "algo"}, {CUBLASLT_ALGO_CONFIG_TILE_ID, "tile"},
                                 {CUBLASLT_ALGO_CONFIG_STAGES_ID, "stages"},
                                 {CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, "cluster"},
                                 {CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, "inner"},
                                 {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, "splitk"},
                                 {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, "swizzle"},
                                 {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, "custom"}}) {
    uint64_t value = 0;  // the attributes are 16- or 32-bit (little-endian: a zeroed slot reads either)
    size_t size = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, nullptr, 0, &size) == CUBLAS_STATUS_SUCCESS &&
        size <= sizeof(value) &&
        cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, size, &size) == CUBLAS_STATUS_SUCCESS)
      out += std::string(out.empty() ? "" : " ") + name + "=" + std::to_string(value);
  }
  return out;
}

void Gemm::run_rows(int first, int rows, cudaStream_t stream, int workspace) {
  if (first < 0 || rows <= 0 || first + rows > m_) throw std::invalid_argument("Gemm::run_rows: rows out of range");
  if (workspace < 0 || workspace > 1) throw std::invalid_argument("Gemm::run_rows: workspace slot 0 or 1");
  Shape& s = shape(rows);
  const float alpha = 1.f, beta = 0.f;
  const char* a = static_cast<const char*>(a_) + size_t(first) * k_ * elem_;
  char* c = static_cast<char*>(c_) + size_t(first) * n_ * elem_;
  check(cublasLtMatmul(handle_, desc_, &alpha, b_, b_layout_, a, s.a, &beta, c, s.c, c, s.c, &s.heuristic.algo,
                       workspaces_[workspace], kWorkspace, stream),
        "cublasLtMatmul");
}

}  // namespace symmem::bench
