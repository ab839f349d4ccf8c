#include "comm/call_order.hpp"

#include "common/check.hpp"
#include "common/device_guard.hpp"

namespace symmem::detail {

CallOrder::CallOrder(int device) {
  DeviceGuard guard(device);
  SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&eager_.end, cudaEventDisableTiming));
  SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&captured_.end, cudaEventDisableTiming));
}

CallOrder::~CallOrder() {
  for (Chain* c : {&eager_, &captured_})
    if (c->end) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(c->end));
}

CallOrder::Chain& CallOrder::chain_of(unsigned long long capture_id) {
  if (capture_id == 0) return eager_;
  if (captured_.capture != capture_id) {
    // A new capture starts a chain of its own: nothing of another capture may be waited for in it.
    cudaEvent_t end = captured_.end;
    captured_ = Chain{};
    captured_.end = end;
    captured_.capture = capture_id;
  }
  return captured_;
}

void CallOrder::before_call(cudaStream_t stream, unsigned long long capture_id) {
  Chain& c = chain_of(capture_id);
  if (c.any && stream != c.last) {
    // The previous call's end, or (not recorded: one stream until now) what its stream holds now.
    if (!c.ended) SYMMEM_CUDA_CHECK(cudaEventRecord(c.end, c.last));
    SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(stream, c.end, 0));
    record_ends_ = kCallsRecordingEnds;
    ++joins_;
  }
  c.last = stream;
  c.any = true;
  c.ended = false;
}

void CallOrder::after_call(cudaStream_t stream, unsigned long long capture_id) noexcept {
  if (record_ends_ == 0) return;
  --record_ends_;
  Chain& c = capture_id == 0 ? eager_ : captured_;
  if (c.last != stream || (capture_id != 0 && c.capture != capture_id)) return;
  if (cudaEventRecord(c.end, stream) == cudaSuccess) {
    c.ended = true;
    ++ends_recorded_;
  } else {
    (void)cudaGetLastError();  // the next change records on the stream instead (c.ended stays false)
  }
}

}  // namespace symmem::detail
