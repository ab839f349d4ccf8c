#include "comm/call_order.hpp"

#include "common/check.hpp"
#include "common/device_guard.hpp"

namespace symmem::detail {

namespace {

// The id of the capture `stream` is in, 0 when none, or ~0 when it cannot be told (the legacy
// default stream queried while another stream captures in global mode): never joined then. The
// failed query's error is cleared, so that no later check (torch's included) reports it.
unsigned long long capture_id_of(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  const cudaError_t err = cudaStreamGetCaptureInfo(stream, &status, &id);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return ~0ull;
  }
  return status == cudaStreamCaptureStatusNone ? 0 : id;
}

}  // namespace

CallOrder::CallOrder(int device) {
  DeviceGuard guard(device);
  SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

CallOrder::~CallOrder() {
  if (event_) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(event_));
}

void CallOrder::before_call(cudaStream_t stream, unsigned long long capture_id) {
  if (any_call_ && stream == last_) return;
  if (any_call_) {
    // Both eager, or both in one capture (then the record and the wait become a graph edge).
    const unsigned long long previous = capture_id_of(last_);
    if (previous != ~0ull && previous == capture_id) {
      SYMMEM_CUDA_CHECK(cudaEventRecord(event_, last_));
      SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
      ++joins_;
    } else {
      ++skipped_;
    }
  }
  last_ = stream;
  any_call_ = true;
}

}  // namespace symmem::detail
