// Whether work enqueued on a stream now is being captured into a CUDA graph (then it runs at each
// replay, not now: the collectives choose what they may do on that basis).
#pragma once

#include <cuda_runtime_api.h>

#include "common/check.hpp"

namespace symmem::detail {

inline bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SYMMEM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

// For a scope, lets this thread make calls that another thread's global-mode capture forbids
// (synchronising the device, unmapping memory), so that a communicator's teardown never invalidates
// a capture under way elsewhere (torch may release a communicator at a garbage collection).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace symmem::detail
