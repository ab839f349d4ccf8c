#include "common/check.hpp"

#include <cstdio>
#include <mutex>
#include <set>

#include "common/env.hpp"

namespace symmem {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kCudaError: return "CUDA error";
    case ErrorCode::kSystemError: return "system error";
    case ErrorCode::kBootstrap: return "bootstrap error";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kAborted: return "communicator aborted";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kCapacity: return "capacity exceeded";
  }
  return "unknown error";
}

const char* error_code_id(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "kInvalidArgument";
    case ErrorCode::kUnsupported: return "kUnsupported";
    case ErrorCode::kCudaError: return "kCudaError";
    case ErrorCode::kSystemError: return "kSystemError";
    case ErrorCode::kBootstrap: return "kBootstrap";
    case ErrorCode::kTimeout: return "kTimeout";
    case ErrorCode::kMismatch: return "kMismatch";
    case ErrorCode::kAborted: return "kAborted";
    case ErrorCode::kInternal: return "kInternal";
    case ErrorCode::kCapacity: return "kCapacity";
  }
  return nullptr;
}

namespace detail {

std::string where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

void throw_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  throw Error(ErrorCode::kCudaError, std::string(expr) + " returned " + cudaGetErrorName(err) + " (" +
                                         cudaGetErrorString(err) + ") at " + where(file, line));
}

void throw_errno(int err, const char* expr, const char* file, int line) {
  throw Error(ErrorCode::kSystemError, std::string(expr) + ": " + std::strerror(err) + " at " + where(file, line));
}

void log_warning(const std::string& message) {
  if (env::debug()) std::fprintf(stderr, "symmem warning: %s\n", message.c_str());
}

void warn_once(const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string>* said = new std::set<std::string>();  // never destroyed: calls at exit
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!said->insert(message).second) return log_warning(message);
  }
  std::fprintf(stderr, "symmem warning: %s\n", message.c_str());
}

}  // namespace detail
}  // namespace symmem
