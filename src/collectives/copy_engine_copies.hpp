// A set of copies on the copy engines (zero SMs), spread over the communicator's side streams and
// joined back: the copy step of the copy-engine and hierarchical all-gathers, between a ready and
// a done handshake (board/handshake.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace symmem::detail {

class CopyEngineStreams;

struct EngineCopy {
  void* dst;
  const void* src;
  size_t bytes;
  int stream;  // side stream index (modulo the side streams) when the copies are not batched
};

// Enqueues `copies` (one cudaMemcpyBatchAsync when `batchable` and there are several; batching
// cannot be captured): the first stream's share on `stream` itself, the other shares forked onto
// side streams, `own` (may be null) on a side stream beside them; every side stream used is
// joined back into `stream` before this returns.
void enqueue_copies(CopyEngineStreams& ce, const std::vector<EngineCopy>& copies, const EngineCopy* own, bool batchable,
                    cudaStream_t stream);

}  // namespace symmem::detail
