// Calls of one communicator run in host order, whatever streams they are enqueued on.
//
// One communicator takes one call at a time: its calls share epochs, flags and workspaces, so two
// calls running at once on two unordered streams corrupt each other (and every rank must run them
// in the same order). torch.distributed promises that a group's collectives issued from any
// streams run in host order; ProcessGroupNCCL keeps it by running them on one internal stream.
// symmem keeps it at no cost on one stream: a call on a stream other than the previous call's
// first makes its stream wait for what the previous stream holds so far (an event recorded there
// now, host order being enqueue order). The single-stream path is one comparison.
//
// Under CUDA graph capture the join is made when both streams belong to the same capture (a graph
// edge). A capturing call after an eager one, or an eager call while the previous stream is still
// capturing, cannot be joined (a capture may not wait for an eager event, nor an eager stream for a
// captured one): a graph's calls are ordered by the stream it is launched on, as with NCCL.
//
// A stream passed to a call must stay alive until the communicator's next call on another stream
// (torch's streams live as long as the process).
#pragma once

#include <cuda_runtime_api.h>

namespace symmem::detail {

class CallOrder {
 public:
  explicit CallOrder(int device);
  ~CallOrder();
  CallOrder(const CallOrder&) = delete;
  CallOrder& operator=(const CallOrder&) = delete;

  // Before a call enqueues anything on `stream` (the communicator's device current). `capture_id`
  // is the id of the capture `stream` is in, 0 when it is not capturing.
  void before_call(cudaStream_t stream, unsigned long long capture_id);

  // Streams the join was made for, and skipped (capture boundaries): for tests.
  unsigned long joins() const { return joins_; }
  unsigned long skipped() const { return skipped_; }

 private:
  cudaEvent_t event_ = nullptr;
  cudaStream_t last_ = nullptr;
  bool any_call_ = false;
  unsigned long joins_ = 0;
  unsigned long skipped_ = 0;
};

}  // namespace symmem::detail
