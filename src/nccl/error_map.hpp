// symmem's failures as NCCL's results, and the message ncclGetLastError returns for them. No
// exception crosses the C boundary: every entry point of the shim runs its body in guarded().
#pragma once

#include <nccl.h>

#include <exception>
#include <new>
#include <string>

#include "symmem/error.hpp"

namespace symmem::nccl {

// kTimeout, kMismatch, kAborted, kBootstrap (a peer died, stalled, called something else, or
// failed first): ncclRemoteError; kInvalidArgument, kCapacity: ncclInvalidArgument; kUnsupported:
// ncclInvalidUsage; kCudaError: ncclUnhandledCudaError; kSystemError: ncclSystemError; kInternal:
// ncclInternalError.
ncclResult_t to_nccl_result(ErrorCode code);

// This thread's last failure in the shim (symmem's message: it names the rank and the cause), and
// the process's (any thread's: PyTorch's watchdog asks ncclGetLastError(NULL) from its own thread
// about a failure the program's thread or its own ncclCommGetAsyncError found). Cleared when a call
// forwarded to the real NCCL fails, so that ncclGetLastError returns whichever library failed last.
void set_last_error(const std::string& message);
void clear_last_error();
const std::string& last_error();
const char* process_last_error();  // nullptr when none; else this thread's copy (handed_out)
void set_process_last_error(const std::string& message);  // the process's only
// `text` copied into this thread's fixed buffer (truncated to 1023 characters), as NCCL keeps its
// message: the pointer stays valid for the thread's life, the text until its next call.
const char* handed_out(const char* text);

// Runs `body` (returning ncclResult_t); an exception becomes its NCCL result and the last error.
template <typename Body>
ncclResult_t guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const Error& e) {
    set_last_error(e.what());
    return to_nccl_result(e.code());
  } catch (const std::bad_alloc&) {
    set_last_error("symmem NCCL shim: out of host memory");
    return ncclSystemError;
  } catch (const std::exception& e) {
    set_last_error(std::string("symmem NCCL shim: ") + e.what());
    return ncclInternalError;
  } catch (...) {
    set_last_error("symmem NCCL shim: unknown exception");
    return ncclInternalError;
  }
}

}  // namespace symmem::nccl
