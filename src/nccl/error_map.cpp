#include "nccl/error_map.hpp"

namespace symmem::nccl {

ncclResult_t to_nccl_result(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kCapacity: return ncclInvalidArgument;
    case ErrorCode::kUnsupported: return ncclInvalidUsage;
    case ErrorCode::kCudaError: return ncclUnhandledCudaError;
    case ErrorCode::kSystemError: return ncclSystemError;
    case ErrorCode::kBootstrap:
    case ErrorCode::kTimeout:
    case ErrorCode::kMismatch:
    case ErrorCode::kAborted: return ncclRemoteError;
    case ErrorCode::kInternal: return ncclInternalError;
  }
  return ncclInternalError;
}

namespace {
std::string& slot() {
  thread_local std::string message;
  return message;
}
}  // namespace

void set_last_error(const std::string& message) { slot() = message; }
void clear_last_error() { slot().clear(); }
const std::string& last_error() { return slot(); }

}  // namespace symmem::nccl
