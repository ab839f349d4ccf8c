// The streams and events of the copy-engine paths, one set per communicator: side streams that
// copies and handshakes fork onto from the caller's stream, the events that fork and join them,
// and a stream for the own slot's local copy. Used by the copy-engine and hierarchical all-gathers
// (collectives/copy_engine_copies.hpp) and the fused ops (fused/side_streams.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace symmem::detail {

class CopyEngineStreams {
 public:
  static constexpr int kMaxStreams = 16;

  // Creates `streams` side streams (clamped to 1 .. kMaxStreams) and their events on `device`.
  // `piece_bytes`: the largest copy piece (SYMMEM_CE_PIECE_KB; 0: no cutting); `batch`: copies of
  // one call go out in one cudaMemcpyBatchAsync where that can be (SYMMEM_CE_BATCH).
  CopyEngineStreams(int device, int streams, bool batch, size_t piece_bytes);
  ~CopyEngineStreams();  // destroys streams and events; never throws
  CopyEngineStreams(const CopyEngineStreams&) = delete;
  CopyEngineStreams& operator=(const CopyEngineStreams&) = delete;

  int streams() const { return streams_count_; }
  size_t piece_bytes() const { return piece_bytes_; }
  bool batch() const { return batch_; }
  cudaStream_t side_stream(int i) const { return streams_[i]; }
  cudaEvent_t fork_event() const { return fork_; }
  cudaEvent_t join_event(int i) const { return joins_[i]; }
  // The own slot's local copy (a kernel): a stream of default priority, so that it does not
  // take SMs ahead of the caller's kernels as the highest-priority side streams would.
  cudaStream_t own_stream() const { return own_stream_; }
  cudaEvent_t own_join_event() const { return own_join_; }

 private:
  void destroy() noexcept;

  int streams_count_ = 4;
  size_t piece_bytes_ = 0;
  bool batch_ = true;
  cudaStream_t streams_[kMaxStreams] = {};
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t joins_[kMaxStreams] = {};
  cudaStream_t own_stream_ = nullptr;
  cudaEvent_t own_join_ = nullptr;
};

}  // namespace symmem::detail
