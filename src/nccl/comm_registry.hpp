// Which real NCCL communicators have a pair (comm_pair.hpp). The program holds the real
// ncclComm_t: every function the shim does not wrap (the real library's device API, a newer
// function) gets a communicator it knows. Communicators of one rank, or made with SYMMEM_NCCL=off,
// have no pair.
//
// Aborted pairs are retired, not released: releasing synchronises the device, which could wait on
// another communicator's hung kernels in the middle of a watchdog's aborts. The next
// ncclCommDestroy releases them (the program is healthy again by then), else the process's exit.
#pragma once

#include <nccl.h>

#include <memory>

#include "nccl/comm_pair.hpp"

namespace symmem::nccl {

void add_pair(ncclComm_t comm, std::shared_ptr<CommPair> pair);
std::shared_ptr<CommPair> find_pair(ncclComm_t comm);
std::shared_ptr<CommPair> take_pair(ncclComm_t comm);  // removed from the registry
void retire_pair(std::shared_ptr<CommPair> pair);
void release_retired_pairs() noexcept;

}  // namespace symmem::nccl
