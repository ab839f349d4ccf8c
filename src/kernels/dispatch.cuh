// Turns (DataType, ReduceOp) into template arguments: f(T{}, std::integral_constant<int, op>{}).
// The default of each switch is an error naming what has no kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/check.hpp"
#include "device/reduce.cuh"
#include "symmem/types.hpp"

namespace symmem::detail {

template <typename T, typename F>
void dispatch_op(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::kSum: return f(T{}, std::integral_constant<int, device::kSum>{});
    case ReduceOp::kMax: return f(T{}, std::integral_constant<int, device::kMax>{});
    case ReduceOp::kMin: return f(T{}, std::integral_constant<int, device::kMin>{});
    case ReduceOp::kAvg:
      if constexpr (!std::is_integral_v<T>) return f(T{}, std::integral_constant<int, device::kAvg>{});
      break;
  }
  SYMMEM_THROW(ErrorCode::kInvalidArgument, std::string("no reduction ") + reduce_op_name(op));
}

template <typename F>
void dispatch_reduce(DataType type, ReduceOp op, F&& f) {
  switch (type) {
    case DataType::kFloat32: return dispatch_op<float>(op, f);
    case DataType::kFloat16: return dispatch_op<__half>(op, f);
    case DataType::kBFloat16: return dispatch_op<__nv_bfloat16>(op, f);
    case DataType::kInt32: return dispatch_op<int32_t>(op, f);
    default: SYMMEM_THROW(ErrorCode::kInvalidArgument, std::string("reductions do not support ") + dtype_name(type));
  }
}

}  // namespace symmem::detail
