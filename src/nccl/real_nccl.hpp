// The real NCCL behind libsymmem_nccl.so: which libnccl.so.2 it forwards to, and that library's
// every function of nccl.h, resolved once. What the shim does not serve goes there untouched.
//
// Which library, the first that loads:
//   1. SYMMEM_NCCL_LIBRARY, when set (a path or a name);
//   2. a libnccl.so.2 the process has loaded already (preloaded in front of it, the shim shares
//      the one torch or the program links: an NCCL communicator belongs to one library);
//   3. the nvidia-nccl wheel's, beside this library in site-packages (nvidia/nccl/lib);
//   4. libnccl.so.2 from the loader's search path.
// A candidate that is the shim itself (installed or linked under NCCL's name) is skipped, so a
// forwarded call never comes back here.
//
// Calls from inside the real library: preloaded, the shim also interposes the real library's own
// calls of its exported functions (libnccl.so.2 reaches ncclBroadcast, ncclCommGetAsyncError,
// ncclCommWindowDeregister, ncclCommInitAll, ncclCommDestroy... through its PLT). Every entry point
// that does more than forward recognises such calls (called_from_real(), and a per-thread depth:
// entry_points.cpp) and forwards them unchanged.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>

namespace symmem::nccl {

// Every function nccl.h declares (its pncclX profiling twins are aliases of the same entry
// points). tests/unit/nccl_exports_test.py checks the built library against the header itself.
#define SYMMEM_NCCL_FUNCTIONS(X)  \
  X(ncclMemAlloc)                 \
  X(ncclMemFree)                  \
  X(ncclGetVersion)               \
  X(ncclGetUniqueId)              \
  X(ncclCommInitRankConfig)       \
  X(ncclCommInitRank)             \
  X(ncclCommInitAll)              \
  X(ncclCommFinalize)             \
  X(ncclCommDestroy)              \
  X(ncclCommAbort)                \
  X(ncclCommRevoke)               \
  X(ncclCommSplit)                \
  X(ncclCommShrink)               \
  X(ncclCommInitRankScalable)     \
  X(ncclGetErrorString)           \
  X(ncclGetLastError)             \
  X(ncclResetDebugInit)           \
  X(ncclCommGetAsyncError)        \
  X(ncclCommCount)                \
  X(ncclCommCuDevice)             \
  X(ncclCommUserRank)             \
  X(ncclCommRegister)             \
  X(ncclCommDeregister)           \
  X(ncclCommWindowRegister)       \
  X(ncclCommWindowDeregister)     \
  X(ncclRedOpCreatePreMulSum)     \
  X(ncclRedOpDestroy)             \
  X(ncclReduce)                   \
  X(ncclBcast)                    \
  X(ncclBroadcast)                \
  X(ncclAllReduce)                \
  X(ncclReduceScatter)            \
  X(ncclAllGather)                \
  X(ncclAlltoAll)                 \
  X(ncclGather)                   \
  X(ncclScatter)                  \
  X(ncclSend)                     \
  X(ncclRecv)                     \
  X(ncclGroupStart)               \
  X(ncclGroupEnd)                 \
  X(ncclGroupSimulateEnd)

// nccl.h marks ncclResetDebugInit deprecated; the shim still exports and forwards it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct RealNccl {
#define SYMMEM_NCCL_MEMBER(name) decltype(&::name) name = nullptr;
  SYMMEM_NCCL_FUNCTIONS(SYMMEM_NCCL_MEMBER)
#undef SYMMEM_NCCL_MEMBER

  std::string path;      // the library loaded (as dladdr names it)
  int version = 0;       // its ncclGetVersion, e.g. 22809
  // Its loaded segments' span, [code_begin, code_end): where NCCL's own code lies.
  uintptr_t code_begin = 0, code_end = 0;

  // The library, loaded on first use (thread-safe); nullptr when no candidate loads, and then
  // load_failure() says what each candidate answered. A failure is final for the process.
  static const RealNccl* get();
  static const std::string& load_failure();

  // True when `code` (a return address) lies inside the real library: the call came from NCCL's
  // own code, not from the program. Two comparisons: every entry point asks it.
  bool called_from_real(const void* code) const {
    const auto at = reinterpret_cast<uintptr_t>(code);
    return at >= code_begin && at < code_end;
  }
};
#pragma GCC diagnostic pop

}  // namespace symmem::nccl
