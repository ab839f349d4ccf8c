#include "nccl/group_streams.hpp"

#include <algorithm>

#include "common/check.hpp"

namespace symmem::nccl {

std::vector<StreamJoin> plan_stream_joins(const std::vector<GroupStreamUse>& uses) {
  std::vector<StreamJoin> joins;
  for (const GroupStreamUse& u : uses) {
    if (!u.served) continue;
    const bool known = std::any_of(joins.begin(), joins.end(), [&](const StreamJoin& j) { return j.comm == u.comm; });
    if (!known) joins.push_back({u.comm, u.stream, {}});
  }
  for (StreamJoin& j : joins)
    for (const GroupStreamUse& u : uses)
      if (u.comm == j.comm && u.stream != j.leader &&
          std::find(j.others.begin(), j.others.end(), u.stream) == j.others.end())
        j.others.push_back(u.stream);
  joins.erase(std::remove_if(joins.begin(), joins.end(), [](const StreamJoin& j) { return j.others.empty(); }),
              joins.end());
  return joins;
}

cudaStream_t served_stream(const std::vector<StreamJoin>& joins, const void* comm, cudaStream_t own) {
  for (const StreamJoin& j : joins)
    if (j.comm == comm) return j.leader;
  return own;
}

void stream_waits_for(cudaStream_t waiter, cudaStream_t done) {
  cudaEvent_t event = nullptr;
  SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(event, done);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(waiter, event, 0) : recorded;
  SYMMEM_CUDA_CHECK(cudaEventDestroy(event));  // (released once the wait is satisfied)
  SYMMEM_CUDA_CHECK(waited);
}

}  // namespace symmem::nccl
