// The copy-engine side streams one fused call forks from the caller's stream and joins back. The
// side streams are the communicator's (CopyEngineStreams): side stream 0 carries the handshakes, the
// others are extra copy lanes forked from it. unwind() is the error path: it joins whatever is
// still forked (lanes into side stream 0, that into the caller's), so a capture can still end and
// nothing of this call runs after the caller's stream moves on.
//
// Without branches (`branch` false) every step of the call runs on the caller's stream in the
// order it is enqueued: control() and every lane are the caller's stream, and forks and joins do
// nothing. For captures whose branches may not run concurrently (all_gather_matmul.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "comm/copy_engine_streams.hpp"

namespace symmem::detail {

class SideStreams {
 public:
  SideStreams(CopyEngineStreams& ce, cudaStream_t caller, bool branch = true)
      : ce_(ce), caller_(caller), branch_(branch) {}

  cudaStream_t control() const { return branch_ ? ce_.side_stream(0) : caller_; }
  // Side stream 0 waits for what the caller's stream has enqueued so far.
  void fork_control();
  // Up to `wanted` lanes (side stream 0 and the next ones, as many as exist) that wait for what
  // side stream 0 has enqueued so far; returns them, side stream 0 first.
  std::vector<cudaStream_t> fork_lanes(int wanted);
  // Every lane but side stream 0 into side stream 0.
  void join_lanes();
  // Side stream 0 into the caller's stream (the lanes must be joined first).
  void join_control();
  // The error path: joins everything still forked; never throws.
  void unwind() noexcept;

 private:
  void join(int side, cudaStream_t into);

  CopyEngineStreams& ce_;
  cudaStream_t caller_;
  bool branch_;
  std::vector<int> forked_;  // side streams forked and not joined back yet (0 first)
};

}  // namespace symmem::detail
