// symmem::Error: the one exception type of the library. Every failure carries a code and a
// message that names where it happened (file:line), the rank and collective when known, and the
// cause (the CUDA error name, the peer that timed out, the values that did not match).
#pragma once

#include <stdexcept>
#include <string>

namespace symmem {

enum class ErrorCode {
  kInvalidArgument,  // bad input at the API boundary; nothing was launched or changed
  kUnsupported,      // valid request this build or machine cannot serve
  kCudaError,        // a CUDA runtime or driver call failed
  kSystemError,      // an OS call failed (socket, fd, file)
  kBootstrap,        // rendezvous failed: refused token, peer gone, store timeout
  kTimeout,          // a device or host wait passed its deadline (dead or stalled peer)
  kMismatch,         // ranks called different collectives (or the same with different arguments)
  kAborted,          // the communicator failed earlier and can no longer be used
  kInternal,         // a broken invariant of the library itself
};

const char* error_code_name(ErrorCode code);
// The enumerator's own name ("kTimeout"), for bindings that mirror the enum.
const char* error_code_id(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(std::string("symmem ") + error_code_name(code) + ": " + message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace symmem
