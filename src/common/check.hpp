// Thin throwing check macros: the only place CUDA and OS error codes become symmem::Error.
// The *_NOTHROW variants are for teardown paths and destructors, which must never throw.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include <cuda_runtime_api.h>

#include "symmem/error.hpp"

namespace symmem::detail {

std::string where(const char* file, int line);
[[noreturn]] void throw_cuda(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_errno(int err, const char* expr, const char* file, int line);
void log_warning(const std::string& message);  // stderr, only when SYMMEM_DEBUG is set
// stderr whatever SYMMEM_DEBUG says, the first time each message comes: what the user must fix and
// would not otherwise see (a setting the NCCL shim cannot read, so that it forwards).
void warn_once(const std::string& message);

}  // namespace symmem::detail

#define SYMMEM_CUDA_CHECK(expr)                                                                           \
  do {                                                                                                    \
    cudaError_t symmem_err_ = (expr);                                                                     \
    if (symmem_err_ != cudaSuccess) ::symmem::detail::throw_cuda(symmem_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// Checks the launch configuration of the kernel just launched.
#define SYMMEM_CUDA_CHECK_NOTHROW(expr)                                                                \
  do {                                                                                                 \
    cudaError_t symmem_err_ = (expr);                                                                  \
    if (symmem_err_ != cudaSuccess)                                                                    \
      ::symmem::detail::log_warning(std::string(#expr) + " failed: " + cudaGetErrorName(symmem_err_)); \
  } while (0)

#define SYMMEM_SYS_CHECK(expr)                                                       \
  do {                                                                               \
    if ((expr) < 0) ::symmem::detail::throw_errno(errno, #expr, __FILE__, __LINE__); \
  } while (0)

#define SYMMEM_THROW(code, msg) \
  throw ::symmem::Error((code), std::string(msg) + " (" + ::symmem::detail::where(__FILE__, __LINE__) + ")")

#define SYMMEM_REQUIRE(cond, msg)                                          \
  do {                                                                     \
    if (!(cond)) SYMMEM_THROW(::symmem::ErrorCode::kInvalidArgument, msg); \
  } while (0)
