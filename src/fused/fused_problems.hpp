// What the fused ops (all_gather_matmul, matmul_reduce_scatter) can run, checked before anything
// is resolved or launched: the reason they cannot, or "".
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "symmem/collectives.hpp"
#include "symmem/fused.hpp"
#include "symmem/types.hpp"

namespace symmem::detail {

struct CommunicatorState;

// The shape and type: float16 / bfloat16, positive extents, m a multiple of world, k and n
// multiples of 8 (16-byte rows for the tensor-memory loads), extents at most 2^30.
std::string fused_shape_problem(const char* op, int64_t m, int64_t n, int64_t k, DataType type, int world);
// b's layout: one of MatrixLayout's values (it arrives as an integer through the C ABI).
std::string fused_b_layout_problem(const char* op, MatrixLayout b_layout);
// The communicator and build: one node, an sm_90 GPU, the CUTLASS kernels built.
std::string fused_build_problem(const char* op, CommunicatorState& st);
// What the fused ops' *_unsupported functions say: the build and GPU, the shape and type, then
// `operand` (named `what`) symmetric and holding `bytes`; "" when all hold.
std::string fused_unsupported(const char* op, Communicator& comm, const Operand& operand, const char* what,
                              size_t bytes, int64_t m, int64_t n, int64_t k, DataType type);
// Throws kInvalidArgument naming the first of `operands` (address, name) not 16-byte aligned: the
// GEMM's tensor-memory loads and stores need it.
void require_16_byte_aligned(const char* op, std::initializer_list<std::pair<const void*, const char*>> operands);
// CUDA_DEVICE_MAX_CONNECTIONS=1 (as read now): every stream shares one hardware queue.
bool single_hardware_queue();
// True where the branches of a captured call may share a hardware queue, in an order the call
// cannot choose: one hardware queue, or several ranks of this process on one GPU (tests only).
bool captured_branches_may_share_a_queue(const CommunicatorState& st);

}  // namespace symmem::detail
