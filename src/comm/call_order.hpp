// Calls of one communicator run in host order, whatever streams they are enqueued on.
//
// One communicator takes one call at a time: its calls share epochs, flags and workspaces, so two
// calls running at once on two unordered streams corrupt each other (and every rank must run them
// in the same order). torch.distributed promises that a group's collectives issued from any
// streams run in host order; ProcessGroupNCCL keeps it by running them on one internal stream.
//
// symmem keeps it at no cost on one stream. A call on a stream other than the previous call's
// makes its stream wait for the previous call's end: an event recorded after that call. Calls
// record their end only after a stream change (for the next kCallsRecordingEnds calls), so one
// stream records nothing; at the first change the previous stream's end is unknown and the event
// is recorded there at that moment (it then also covers work queued after the previous call, once).
//
// Eager calls and captured calls are two chains: an eager call is ordered after the previous eager
// call (never after a captured one, which runs at replays), and a captured call after the previous
// call of the same capture (the record and the wait become a graph edge). A graph's replays are
// ordered by the stream they are launched on, as with NCCL.
//
// A stream passed to a call must stay alive until the communicator's next call on another stream
// (torch's streams live as long as the process).
#pragma once

#include <cuda_runtime_api.h>

namespace symmem::detail {

class CallOrder {
 public:
  static constexpr int kCallsRecordingEnds = 64;

  explicit CallOrder(int device);
  ~CallOrder();
  CallOrder(const CallOrder&) = delete;
  CallOrder& operator=(const CallOrder&) = delete;

  // Before a call enqueues anything on `stream` (the communicator's device current). `capture_id`
  // is the id of the active capture `stream` is in, 0 for an eager call.
  void before_call(cudaStream_t stream, unsigned long long capture_id);
  // After the call's last enqueue on `stream`; never throws (it runs in a destructor).
  void after_call(cudaStream_t stream, unsigned long long capture_id) noexcept;

  // Stream changes joined so far, and calls that recorded their end: for tests.
  unsigned long joins() const { return joins_; }
  unsigned long ends_recorded() const { return ends_recorded_; }

 private:
  // The calls of one ordering domain: the eager calls, or the calls of one capture.
  struct Chain {
    cudaEvent_t end = nullptr;       // the end of the last call, when `ended`
    cudaStream_t last = nullptr;     // the last call's stream
    unsigned long long capture = 0;  // the capture the chain belongs to (0: eager)
    bool any = false;
    bool ended = false;
  };
  Chain& chain_of(unsigned long long capture_id);

  Chain eager_;
  Chain captured_;
  int record_ends_ = 0;  // calls left that record their end (after a stream change)
  unsigned long joins_ = 0;
  unsigned long ends_recorded_ = 0;
};

}  // namespace symmem::detail
