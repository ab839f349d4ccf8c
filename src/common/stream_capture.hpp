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

}  // namespace symmem::detail
