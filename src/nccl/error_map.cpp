#include "nccl/error_map.hpp"

#include <array>
#include <cstdio>
#include <mutex>

#include "common/exit_safe_thread_local.hpp"

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
struct LastErrorTag;
std::string& slot() { return detail::exit_safe_thread_local<std::string, LastErrorTag>(); }

// The process's copy: other threads rewrite it (the watchdog's polls), so callers get it copied
// into their own buffer under the lock.
std::mutex process_mutex;
char process_slot[1024];
}  // namespace

void set_process_last_error(const std::string& message) {
  std::lock_guard<std::mutex> lock(process_mutex);
  std::snprintf(process_slot, sizeof(process_slot), "%s", message.c_str());
}
void set_last_error(const std::string& message) {
  slot() = message;
  set_process_last_error(message);
}
void clear_last_error() {
  slot().clear();
  std::lock_guard<std::mutex> lock(process_mutex);
  process_slot[0] = '\0';
}
const std::string& last_error() { return slot(); }
const char* handed_out(const char* text) {
  struct HandedOutTag;
  std::array<char, 1024>& buffer = detail::exit_safe_thread_local<std::array<char, 1024>, HandedOutTag>();
  std::snprintf(buffer.data(), buffer.size(), "%s", text);
  return buffer.data();
}
const char* process_last_error() {
  std::lock_guard<std::mutex> lock(process_mutex);
  return process_slot[0] ? handed_out(process_slot) : nullptr;
}

}  // namespace symmem::nccl
