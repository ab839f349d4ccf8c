// What libsymmem_nccl.so's entry points do beyond forwarding (entry_points.cpp holds the extern "C"
// functions of nccl.h, each a line that calls here or forwards). Every function returns NCCL's
// result and never throws (error_map.hpp's guarded).
//
//   communicators (shim_comms.cpp): init, split, shrink make the real communicator first and a
//     pair beside it (comm_pair.hpp); finalize, destroy, abort, revoke close both.
//   calls (shim_calls.cpp): collectives routed per call (serve_plan.hpp), groups (group_queue.hpp),
//     windows, and the errors ncclCommGetAsyncError / ncclGetLastError report.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "nccl/real_nccl.hpp"
#include "nccl/serve_plan.hpp"
#include "symmem/error.hpp"

namespace symmem::nccl {

// The real library, or throws kSystemError saying why none loaded.
const RealNccl& real_nccl();
// A forwarded call's result: a failure of the real NCCL makes ncclGetLastError its again.
ncclResult_t forwarded(ncclResult_t result);
// The real function `fn`, or throws kUnsupported (ncclInvalidUsage) when the real library, an older
// NCCL, lacks it.
template <typename F>
F require_real(F fn, const char* name) {
  if (!fn)
    throw Error(ErrorCode::kUnsupported, std::string("symmem NCCL shim: ") + real_nccl().path + " has no " + name);
  return fn;
}

ncclResult_t init_rank(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, ncclConfig_t* config,
                       bool with_config);
ncclResult_t init_all(ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t init_rank_scalable(ncclComm_t* comm, int nranks, int rank, int nids, ncclUniqueId* ids,
                                ncclConfig_t* config);
ncclResult_t split(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t shrink(ncclComm_t comm, int* exclude, int count, ncclComm_t* newcomm, ncclConfig_t* config, int flags);
ncclResult_t comm_finalize(ncclComm_t comm);
ncclResult_t comm_destroy(ncclComm_t comm);
ncclResult_t comm_abort(ncclComm_t comm);
ncclResult_t comm_revoke(ncclComm_t comm, int flags);

// A call that always goes to the real NCCL, on `stream`: noted when a group is open, so that the
// group's served calls of that communicator join its stream (group_streams.hpp). Never throws.
void note_forwarded_in_group(ncclComm_t comm, cudaStream_t stream) noexcept;

// A collective that could be served (forwarded: the real function of call.op with the program's
// arguments).
ncclResult_t collective(NcclCall call, const void* send, void* recv, ncclComm_t comm, cudaStream_t stream);
ncclResult_t group_start();
ncclResult_t group_end();
ncclResult_t group_simulate_end(ncclSimInfo_t* info);
ncclResult_t window_register(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int flags);
ncclResult_t window_deregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t get_async_error(ncclComm_t comm, ncclResult_t* error);
const char* get_last_error(ncclComm_t comm);

}  // namespace symmem::nccl
