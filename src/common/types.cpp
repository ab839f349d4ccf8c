#include "symmem/types.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cctype>
#include <cstring>

namespace symmem {

size_t dtype_size(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt32: return 4;
    case DataType::kUInt8: return 1;
  }
  return 0;
}

const char* dtype_name(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt32: return "int32";
    case DataType::kUInt8: return "uint8";
  }
  return "?";
}

double element_to_double(const void* data, DataType type, size_t i) {
  const auto* p = static_cast<const uint8_t*>(data) + i * dtype_size(type);
  switch (type) {
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DataType::kFloat16: {
      __half h;
      std::memcpy(&h, p, 2);
      return __half2float(h);
    }
    case DataType::kBFloat16: {
      __nv_bfloat16 h;
      std::memcpy(&h, p, 2);
      return __bfloat162float(h);
    }
    case DataType::kInt32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DataType::kUInt8: return *p;
  }
  return 0;
}

static std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool parse_dtype(const std::string& name, DataType* type) {
  const std::string n = lower(name);
  if (n == "float32" || n == "fp32" || n == "float" || n == "f32")
    *type = DataType::kFloat32;
  else if (n == "float16" || n == "fp16" || n == "half" || n == "f16")
    *type = DataType::kFloat16;
  else if (n == "bfloat16" || n == "bf16")
    *type = DataType::kBFloat16;
  else if (n == "int32" || n == "int" || n == "i32")
    *type = DataType::kInt32;
  else if (n == "uint8" || n == "u8" || n == "byte")
    *type = DataType::kUInt8;
  else
    return false;
  return true;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kAvg: return "avg";
  }
  return "?";
}

bool parse_reduce_op(const std::string& name, ReduceOp* op) {
  const std::string n = lower(name);
  if (n == "sum")
    *op = ReduceOp::kSum;
  else if (n == "max")
    *op = ReduceOp::kMax;
  else if (n == "min")
    *op = ReduceOp::kMin;
  else if (n == "avg")
    *op = ReduceOp::kAvg;
  else
    return false;
  return true;
}

}  // namespace symmem
