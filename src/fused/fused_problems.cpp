#include "fused/fused_problems.hpp"

#include <cuda_runtime_api.h>

#include <cstdlib>

#include "collectives/operands.hpp"
#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "fused/flagged_gemm.hpp"

namespace symmem::detail {

std::string fused_shape_problem(const char* op, int64_t m, int64_t n, int64_t k, DataType type, int world) {
  const std::string name = op;
  if (type != DataType::kFloat16 && type != DataType::kBFloat16)
    return name + ": type " + dtype_name(type) + " is not supported (float16, bfloat16)";
  if (m <= 0 || n <= 0 || k <= 0)
    return name + ": m, n and k must be positive (m=" + std::to_string(m) + ", n=" + std::to_string(n) +
           ", k=" + std::to_string(k) + ")";
  if (m % world != 0)
    return name + ": m=" + std::to_string(m) + " is not a multiple of the " + std::to_string(world) +
           " ranks (every shard has m / world rows)";
  if (k % 8 != 0 || n % 8 != 0)
    return name + ": k=" + std::to_string(k) + " and n=" + std::to_string(n) +
           " must be multiples of 8 (16-byte rows for the tensor-memory loads)";
  constexpr int64_t kMaxExtent = int64_t(1) << 30;
  if (m > kMaxExtent || n > kMaxExtent || k > kMaxExtent) return name + ": extents above 2^30 are not supported";
  return {};
}

std::string fused_b_layout_problem(const char* op, MatrixLayout b_layout) {
  switch (b_layout) {
    case MatrixLayout::kRowMajor:
    case MatrixLayout::kColumnMajor: return {};
  }
  return std::string(op) + ": b_layout " + std::to_string(static_cast<int>(b_layout)) +
         " is neither row-major (0) nor column-major (1)";
}

std::string fused_build_problem(const char* op, CommunicatorState& st) {
  const std::string name = op;
  if (st.layout.spans_nodes())
    return name + ": the communicator spans " + std::to_string(st.layout.nodes) +
           " nodes; the fused GEMM runs inside one node";
  int major = 0;
  SYMMEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, st.device));
  if (major != 9) return name + ": the fused GEMM needs an sm_90 GPU (Hopper)";
  std::string why;
  if (!flagged_gemm_built(&why)) return name + ": " + why;
  return {};
}

std::string fused_unsupported(const char* op, Communicator& comm, const Operand& operand, const char* what,
                              size_t bytes, int64_t m, int64_t n, int64_t k, DataType type) {
  CommunicatorState& st = state_of(comm);
  DeviceGuard guard(st.device);
  std::string why = fused_build_problem(op, st);
  if (why.empty()) why = fused_shape_problem(op, m, n, k, type, st.world);
  if (why.empty() && !operand.symmetric()) why = std::string(op) + ": " + what + " must be a symmetric operand";
  if (why.empty()) {
    try {
      resolve(operand, bytes, what, op, st);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  return why;
}

void require_16_byte_aligned(const char* op, std::initializer_list<std::pair<const void*, const char*>> operands) {
  for (const auto& [ptr, what] : operands) {
    if (address_alignment(ptr) < 16)
      throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + what + " must be 16-byte aligned");
  }
}

bool single_hardware_queue() {
  const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return v && std::atoi(v) == 1;
}

bool captured_branches_may_share_a_queue(const CommunicatorState& st) {
  return single_hardware_queue() || st.ranks_on_gpu > 1;
}

}  // namespace symmem::detail
