// A call routed to symmem, run on its symmem communicator through symmem's public collectives:
// plain device buffers as local operands (staged through the workspace), buffers inside registered
// windows as symmetric ones (zero copy, at their offset in the window).
#pragma once

#include <cuda_runtime_api.h>

#include "nccl/serve_plan.hpp"
#include "nccl/windows.hpp"
#include "symmem/communicator.hpp"

namespace symmem::nccl {

// Throws symmem::Error. `call` must have a symmem form (symmem_form).
void run_served_call(Communicator& comm, const NcclCall& call, const void* send, void* recv, cudaStream_t stream,
                     const Windows& windows);

}  // namespace symmem::nccl
