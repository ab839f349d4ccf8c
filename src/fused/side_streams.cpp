#include "fused/side_streams.hpp"

#include <algorithm>

#include "common/check.hpp"

namespace symmem::detail {

void SideStreams::fork_control() {
  if (!branch_) return;
  SYMMEM_CUDA_CHECK(cudaEventRecord(ce_.fork_event(), caller_));
  SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(control(), ce_.fork_event(), 0));
  forked_.assign(1, 0);
}

std::vector<cudaStream_t> SideStreams::fork_lanes(int wanted) {
  if (!branch_) return {caller_};
  const int lanes = std::max(1, std::min(wanted, ce_.streams()));
  std::vector<cudaStream_t> streams{control()};
  if (lanes > 1) SYMMEM_CUDA_CHECK(cudaEventRecord(ce_.fork_event(), control()));
  for (int s = 1; s < lanes; ++s) {
    SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(ce_.side_stream(s), ce_.fork_event(), 0));
    forked_.push_back(s);
    streams.push_back(ce_.side_stream(s));
  }
  return streams;
}

void SideStreams::join(int side, cudaStream_t into) {
  SYMMEM_CUDA_CHECK(cudaEventRecord(ce_.join_event(side), ce_.side_stream(side)));
  SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(into, ce_.join_event(side), 0));
}

void SideStreams::join_lanes() {
  for (size_t i = 1; i < forked_.size(); ++i) join(forked_[i], control());
  forked_.resize(std::min<size_t>(forked_.size(), 1));
}

void SideStreams::join_control() {
  if (forked_.empty()) return;
  join(0, caller_);
  forked_.clear();
}

void SideStreams::unwind() noexcept {
  for (size_t i = 1; i < forked_.size(); ++i) {
    SYMMEM_CUDA_CHECK_NOTHROW(cudaEventRecord(ce_.join_event(forked_[i]), ce_.side_stream(forked_[i])));
    SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamWaitEvent(control(), ce_.join_event(forked_[i]), 0));
  }
  if (!forked_.empty()) {
    SYMMEM_CUDA_CHECK_NOTHROW(cudaEventRecord(ce_.join_event(0), control()));
    SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamWaitEvent(caller_, ce_.join_event(0), 0));
  }
  forked_.clear();
}

}  // namespace symmem::detail
