// NCCL's rule for the streams of a group: the calls of one communicator in one group start only
// once every stream they were issued on has reached the group, and every one of those streams
// waits for the whole group (NCCL's user guide, "Mixing Multiple Streams within the same
// ncclGroupStart/End() group"). NCCL keeps it for what it launches; the shim keeps it for a
// communicator whose served calls share a group with calls on other streams: its served calls run
// on one stream (the first served call's, the leader) after the leader waited for the others, and
// the others then wait for the leader. A group of one stream per communicator (PyTorch, nccl-tests)
// needs nothing. The plan is pure C++, tested on the CPU.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

namespace symmem::nccl {

// One call of a group: its communicator (a CommPair), its stream, and whether symmem serves it.
struct GroupStreamUse {
  const void* comm = nullptr;
  cudaStream_t stream = nullptr;
  bool served = false;
};

// A communicator whose calls in the group used several streams, one of its calls served.
struct StreamJoin {
  const void* comm = nullptr;
  cudaStream_t leader = nullptr;       // the first served call's stream: every served call runs on it
  std::vector<cudaStream_t> others;    // the group's other streams of that communicator, in first use
};

// The joins a group needs, in the order of the communicators' first served calls.
std::vector<StreamJoin> plan_stream_joins(const std::vector<GroupStreamUse>& uses);

// The stream a served call of `comm` launches on: the leader of its join, else its own.
cudaStream_t served_stream(const std::vector<StreamJoin>& joins, const void* comm, cudaStream_t own);

// `waiter` waits for everything enqueued on `done` so far (an event, recorded and released). On the
// current device, which must be the streams'.
void stream_waits_for(cudaStream_t waiter, cudaStream_t done);

}  // namespace symmem::nccl
