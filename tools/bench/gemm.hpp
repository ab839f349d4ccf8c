// A cuBLASLt GEMM for the benchmarks: row-major C [m x n] = A [m x k] B [k x n] (torch's layout),
// fp16 or bf16 in and out, fp32 accumulation, on buffers it owns (A and B filled with small
// integers). run_rows() computes a block of C's rows alone, as a fused all-gather + GEMM does for
// each shard that arrives.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <map>
#include <string>

#include "symmem/types.hpp"

namespace symmem::bench {

class Gemm {
 public:
  Gemm(int m, int n, int k, DataType type, cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  void run(cudaStream_t stream) { run_rows(0, m_, stream); }
  // Rows [first, first + rows) of C from the same rows of A. GEMMs that may run at the same time
  // (on different streams) need different `workspace` slots (0 or 1): cuBLASLt kernels keep state
  // in the workspace (stream-K tile counters), and two that share one corrupt each other's work.
  void run_rows(int first, int rows, cudaStream_t stream, int workspace = 0);
  int m() const { return m_; }
  // cuBLASLt's choice for `rows` rows: "algo=.. tile=.. stages=.. cluster=.. ..." (cublasLt.h enum values).
  std::string algo_description(int rows);
  const void* a() const { return a_; }
  const void* b() const { return b_; }
  void* c() const { return c_; }
  size_t c_bytes() const { return size_t(m_) * n_ * elem_; }

 private:
  // cuBLASLt is column-major: row-major C = A B is column-major C^T (n x rows) = B^T (n x k) A^T.
  struct Shape {
    cublasLtMatrixLayout_t a = nullptr, c = nullptr;
    cublasLtMatmulHeuristicResult_t heuristic{};
  };
  Shape& shape(int rows);

  static constexpr size_t kWorkspace = size_t(64) << 20;
  int m_, n_, k_;
  size_t elem_;
  cudaDataType_t type_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t b_layout_ = nullptr;
  std::map<int, Shape> shapes_;
  void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;
  void* workspaces_[2] = {};
};

}  // namespace symmem::bench
