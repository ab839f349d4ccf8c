#include "collectives/copy_engine_copies.hpp"

#include <algorithm>
#include <iterator>

#include "comm/copy_engine_streams.hpp"
#include "common/check.hpp"

namespace symmem::detail {

void enqueue_copies(CopyEngineStreams& ce, const std::vector<EngineCopy>& copies, const EngineCopy* own, bool batchable,
                    cudaStream_t stream) {
  const bool batch = batchable && copies.size() > 1;
  // Share 0 of the peer copies (all of them when batched or on one stream) runs on the caller's
  // stream itself: a fork and a join on the path every byte takes cost microseconds per call
  // (2 x H200, 1 MiB per rank: 42.6 us with them, 38.1 without). The other shares fork onto side
  // streams 0 .. n - 2, and the own slot's local copy (a kernel, no peer involved) onto its own
  // stream beside them; inside one batch it delayed the NVLink copies (2 x H200, 64 MiB per rank:
  // 287 GB/s batched with it, 333 beside it). cudaMemcpyBatchAsync refuses the legacy default
  // stream: a batch for a default stream runs on side stream 0.
  const bool default_stream = stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
  const int n = batch ? 1 : ce.streams();
  auto share_of = [&](const EngineCopy& c) { return batch ? (default_stream ? 1 : 0) : c.stream % n; };
  auto stream_of = [&](int share) { return share == 0 ? stream : ce.side_stream(share - 1); };
  bool forked[CopyEngineStreams::kMaxStreams] = {};
  for (const EngineCopy& c : copies)
    if (const int share = share_of(c); share > 0) forked[share - 1] = true;
  const bool any_fork = own != nullptr || std::any_of(std::begin(forked), std::end(forked), [](bool f) { return f; });
  if (any_fork) SYMMEM_CUDA_CHECK(cudaEventRecord(ce.fork_event(), stream));
  for (int s = 0; s < ce.streams(); ++s)
    if (forked[s]) SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(ce.side_stream(s), ce.fork_event(), 0));
  if (own) {
    SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(ce.own_stream(), ce.fork_event(), 0));
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(own->dst, own->src, own->bytes, cudaMemcpyDeviceToDevice, ce.own_stream()));
  }
  if (batch) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    for (const EngineCopy& c : copies) {
      dsts.push_back(c.dst);
      srcs.push_back(c.src);
      sizes.push_back(c.bytes);
    }
    // The driver spreads the copies of one batch over the copy engines.
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
    SYMMEM_CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &attr_index, 1,
                                           stream_of(share_of(copies.front()))));
  } else {
    for (const EngineCopy& c : copies)
      SYMMEM_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream_of(share_of(c))));
  }
  for (int s = 0; s < ce.streams(); ++s) {
    if (!forked[s]) continue;
    SYMMEM_CUDA_CHECK(cudaEventRecord(ce.join_event(s), ce.side_stream(s)));
    SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(stream, ce.join_event(s), 0));
  }
  if (own) {
    SYMMEM_CUDA_CHECK(cudaEventRecord(ce.own_join_event(), ce.own_stream()));
    SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(stream, ce.own_join_event(), 0));
  }
}

}  // namespace symmem::detail
