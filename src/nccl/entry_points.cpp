// libsymmem_nccl.so's C boundary: every function nccl.h declares, and its pncclX profiling twin as
// an alias of the same entry point. Each line forwards to the real NCCL (real_nccl.hpp) or calls
// the shim (shim.hpp); no exception crosses (guarded). The library exports these names only
// (src/nccl/exports.map).
#include <nccl.h>

#include <string>

#include "nccl/error_map.hpp"
#include "nccl/shim.hpp"

#define SYMMEM_NCCL_API extern "C" __attribute__((visibility("default")))

// nccl.h marks ncclResetDebugInit deprecated; it is still part of the API the shim exports.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

using symmem::nccl::Collective;
using symmem::nccl::guarded;
using symmem::nccl::NcclCall;
using symmem::nccl::real_nccl;

namespace {

// Calls NCCL's own code makes to its exported functions (real_nccl.hpp: preloaded, the shim
// receives them too) are forwarded unchanged, so that the shim's work (a rendezvous, a group of its
// own, symmem's errors) happens once, for the program's call. Such a call is one that arrives while
// this thread is inside an entry point (the shim never calls its own entry points; NCCL's code
// tail-calls, so a return address alone can miss it, and the plugins NCCL calls have addresses of
// their own), or whose return address lies in the real library (NCCL's own threads).
thread_local int entry_depth = 0;
struct InsideEntryPoint {
  InsideEntryPoint() { ++entry_depth; }
  ~InsideEntryPoint() { --entry_depth; }
  InsideEntryPoint(const InsideEntryPoint&) = delete;
  InsideEntryPoint& operator=(const InsideEntryPoint&) = delete;
};

// Whether `caller` (a return address) lies in the real library; false when none loaded. Outside
// guarded(), so it never throws.
bool inside_real_library(const void* caller) noexcept {
  try {
    const symmem::nccl::RealNccl* real = symmem::nccl::RealNccl::get();
    return real && real->called_from_real(caller);
  } catch (...) {
    return false;
  }
}

}  // namespace

// The real `name` called with the arguments given, under guarded().
#define SYMMEM_NCCL_CALL_REAL(name, ...) \
  guarded([&] { return symmem::nccl::forwarded(symmem::nccl::require_real(real_nccl().name, #name)(__VA_ARGS__)); })

// Forwards `name` with the arguments given.
#define SYMMEM_NCCL_FORWARD(name, ...)        \
  const InsideEntryPoint inside_entry_point; \
  return SYMMEM_NCCL_CALL_REAL(name, __VA_ARGS__)

// Forwards a call on a stream, noted first when the program made it inside a group (shim.hpp).
#define SYMMEM_NCCL_FORWARD_ON_STREAM(name, comm, stream, ...)                   \
  if (entry_depth == 0) symmem::nccl::note_forwarded_in_group((comm), (stream)); \
  SYMMEM_NCCL_FORWARD(name, __VA_ARGS__)

// First in every entry point that does more than forward: forwards the call when `made_by_nccl`.
#define SYMMEM_NCCL_FORWARD_IF(made_by_nccl, name, ...) \
  const bool made_by_nccl_ = (made_by_nccl);            \
  const InsideEntryPoint inside_entry_point;            \
  if (made_by_nccl_) return SYMMEM_NCCL_CALL_REAL(name, __VA_ARGS__)
// A call NCCL's own code made, by either sign above.
#define SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(name, ...) \
  SYMMEM_NCCL_FORWARD_IF(entry_depth > 0 || inside_real_library(__builtin_return_address(0)), name, __VA_ARGS__)
// Abort and revoke judge by the return address alone: NCCL never calls them on its own, and one
// made on a thread already inside an entry point (a signal handler) must still release the waits.
#define SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL_CODE(name, ...) \
  SYMMEM_NCCL_FORWARD_IF(inside_real_library(__builtin_return_address(0)), name, __VA_ARGS__)

// Identifies this library to the loader of the real NCCL (real_nccl.cpp), which must never load
// the shim as the real library.
SYMMEM_NCCL_API int symmem_nccl_shim_identity() { return 1; }

SYMMEM_NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) { SYMMEM_NCCL_FORWARD(ncclMemAlloc, ptr, size); }
SYMMEM_NCCL_API ncclResult_t ncclMemFree(void* ptr) { SYMMEM_NCCL_FORWARD(ncclMemFree, ptr); }
SYMMEM_NCCL_API ncclResult_t ncclGetVersion(int* version) { SYMMEM_NCCL_FORWARD(ncclGetVersion, version); }
SYMMEM_NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { SYMMEM_NCCL_FORWARD(ncclGetUniqueId, id); }

SYMMEM_NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                                    ncclConfig_t* config) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommInitRankConfig, comm, nranks, id, rank, config);
  return guarded([&] { return symmem::nccl::init_rank(comm, nranks, id, rank, config, true); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommInitRank, comm, nranks, id, rank);
  return guarded([&] { return symmem::nccl::init_rank(comm, nranks, id, rank, nullptr, false); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommInitAll, comms, ndev, devlist);
  return guarded([&] { return symmem::nccl::init_all(comms, ndev, devlist); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int nids,
                                                      ncclUniqueId* ids, ncclConfig_t* config) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommInitRankScalable, comm, nranks, rank, nids, ids, config);
  return guarded([&] { return symmem::nccl::init_rank_scalable(comm, nranks, rank, nids, ids, config); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                           ncclConfig_t* config) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommSplit, comm, color, key, newcomm, config);
  return guarded([&] { return symmem::nccl::split(comm, color, key, newcomm, config); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* exclude, int count, ncclComm_t* newcomm,
                                            ncclConfig_t* config, int flags) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommShrink, comm, exclude, count, newcomm, config, flags);
  return guarded([&] { return symmem::nccl::shrink(comm, exclude, count, newcomm, config, flags); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommFinalize, comm);
  return guarded([&] { return symmem::nccl::comm_finalize(comm); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommDestroy, comm);
  return guarded([&] { return symmem::nccl::comm_destroy(comm); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL_CODE(ncclCommAbort, comm);
  return guarded([&] { return symmem::nccl::comm_abort(comm); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL_CODE(ncclCommRevoke, comm, flags);
  return guarded([&] { return symmem::nccl::comm_revoke(comm, flags); });
}

SYMMEM_NCCL_API const char* ncclGetErrorString(ncclResult_t result) {
  const symmem::nccl::RealNccl* real = symmem::nccl::RealNccl::get();
  return real ? real->ncclGetErrorString(result) : "symmem NCCL shim: no real NCCL could be loaded";
}
SYMMEM_NCCL_API const char* ncclGetLastError(ncclComm_t comm) { return symmem::nccl::get_last_error(comm); }
SYMMEM_NCCL_API void ncclResetDebugInit() {
  const symmem::nccl::RealNccl* real = symmem::nccl::RealNccl::get();
  if (real && real->ncclResetDebugInit) real->ncclResetDebugInit();
}
SYMMEM_NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommGetAsyncError, comm, error);
  return guarded([&] { return symmem::nccl::get_async_error(comm, error); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  SYMMEM_NCCL_FORWARD(ncclCommCount, comm, count);
}
SYMMEM_NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  SYMMEM_NCCL_FORWARD(ncclCommCuDevice, comm, device);
}
SYMMEM_NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  SYMMEM_NCCL_FORWARD(ncclCommUserRank, comm, rank);
}
// Local registration: not collective in NCCL (PyTorch's allocator hooks register segments on each
// rank on its own), so it cannot agree on symmetric buffers: forwarded.
SYMMEM_NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  SYMMEM_NCCL_FORWARD(ncclCommRegister, comm, buff, size, handle);
}
SYMMEM_NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  SYMMEM_NCCL_FORWARD(ncclCommDeregister, comm, handle);
}
SYMMEM_NCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                                    int flags) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommWindowRegister, comm, buff, size, win, flags);
  return guarded([&] { return symmem::nccl::window_register(comm, buff, size, win, flags); });
}
SYMMEM_NCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclCommWindowDeregister, comm, win);
  return guarded([&] { return symmem::nccl::window_deregister(comm, win); });
}
SYMMEM_NCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  SYMMEM_NCCL_FORWARD(ncclRedOpCreatePreMulSum, op, scalar, type, residence, comm);
}
SYMMEM_NCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  SYMMEM_NCCL_FORWARD(ncclRedOpDestroy, op, comm);
}

// Collectives: broadcast and reduce are forwarded (symmem has no faster path for them); the others
// are routed per call.
SYMMEM_NCCL_API ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_ON_STREAM(ncclReduce, comm, stream, send, recv, count, type, op, root, comm, stream);
}
SYMMEM_NCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_ON_STREAM(ncclBcast, comm, stream, buff, count, type, root, comm, stream);
}
SYMMEM_NCCL_API ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                           ncclComm_t comm, cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_ON_STREAM(ncclBroadcast, comm, stream, send, recv, count, type, root, comm, stream);
}
SYMMEM_NCCL_API ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclAllReduce, send, recv, count, type, op, comm, stream);
  return guarded([&] {
    NcclCall call{Collective::kAllReduce, count, type, op};
    return symmem::nccl::collective(call, send, recv, comm, stream);
  });
}
SYMMEM_NCCL_API ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclReduceScatter, send, recv, recvcount, type, op, comm, stream);
  return guarded([&] {
    NcclCall call{Collective::kReduceScatter, recvcount, type, op};
    return symmem::nccl::collective(call, send, recv, comm, stream);
  });
}
SYMMEM_NCCL_API ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                                           ncclComm_t comm, cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclAllGather, send, recv, sendcount, type, comm, stream);
  return guarded([&] {
    NcclCall call{Collective::kAllGather, sendcount, type};
    return symmem::nccl::collective(call, send, recv, comm, stream);
  });
}
SYMMEM_NCCL_API ncclResult_t ncclAlltoAll(const void* send, void* recv, size_t count, ncclDataType_t type,
                                          ncclComm_t comm, cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclAlltoAll, send, recv, count, type, comm, stream);
  return guarded([&] {
    NcclCall call{Collective::kAlltoAll, count, type};
    return symmem::nccl::collective(call, send, recv, comm, stream);
  });
}
SYMMEM_NCCL_API ncclResult_t ncclGather(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                        ncclComm_t comm, cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_ON_STREAM(ncclGather, comm, stream, send, recv, count, type, root, comm, stream);
}
SYMMEM_NCCL_API ncclResult_t ncclScatter(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                         ncclComm_t comm, cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_ON_STREAM(ncclScatter, comm, stream, send, recv, count, type, root, comm, stream);
}
SYMMEM_NCCL_API ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                                      cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_ON_STREAM(ncclSend, comm, stream, send, count, type, peer, comm, stream);
}
SYMMEM_NCCL_API ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                                      cudaStream_t stream) {
  SYMMEM_NCCL_FORWARD_ON_STREAM(ncclRecv, comm, stream, recv, count, type, peer, comm, stream);
}
SYMMEM_NCCL_API ncclResult_t ncclGroupStart() {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclGroupStart);
  return guarded([&] { return symmem::nccl::group_start(); });
}
SYMMEM_NCCL_API ncclResult_t ncclGroupEnd() {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclGroupEnd);
  return guarded([&] { return symmem::nccl::group_end(); });
}
SYMMEM_NCCL_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* info) {
  SYMMEM_NCCL_FORWARD_CALLS_FROM_NCCL(ncclGroupSimulateEnd, info);
  return guarded([&] { return symmem::nccl::group_simulate_end(info); });
}

// The profiling twins: the same entry points under the pncclX names nccl.h declares.
#define SYMMEM_NCCL_ALIAS(name) SYMMEM_NCCL_API __attribute__((alias(#name))) decltype(name) p##name;
SYMMEM_NCCL_FUNCTIONS(SYMMEM_NCCL_ALIAS)
