#include "comm/copy_engine_streams.hpp"

#include <algorithm>

#include "common/check.hpp"
#include "common/device_guard.hpp"

namespace symmem::detail {
namespace {

// SYMMEM_CE_PIECE_KB = 0 means no cutting; smaller pieces than a page are never useful.
constexpr size_t kNoCutting = size_t(1) << 40;
constexpr size_t kSmallestPieceSetting = 4096;

}  // namespace

CopyEngineStreams::CopyEngineStreams(int device, int streams, bool batch, size_t piece_bytes)
    : streams_count_(std::clamp(streams, 1, kMaxStreams)),
      piece_bytes_(piece_bytes == 0 ? kNoCutting : std::max(piece_bytes, kSmallestPieceSetting)),
      batch_(batch) {
  DeviceGuard guard(device);
  try {
    // Highest priority for the side streams: their copies and waits are short and the GEMMs they
    // overlap should not delay them (the own slot's copy, a kernel, gets the lowest: own_stream).
    int least = 0, greatest = 0;
    SYMMEM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    for (int i = 0; i < streams_count_; ++i)
      SYMMEM_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[i], cudaStreamNonBlocking, greatest));
    SYMMEM_CUDA_CHECK(cudaStreamCreateWithPriority(&own_stream_, cudaStreamNonBlocking, least));
    SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&own_join_, cudaEventDisableTiming));
    SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (int i = 0; i < streams_count_; ++i)
      SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&joins_[i], cudaEventDisableTiming));
  } catch (...) {
    destroy();
    throw;
  }
}

CopyEngineStreams::~CopyEngineStreams() { destroy(); }

void CopyEngineStreams::destroy() noexcept {
  for (int i = 0; i < kMaxStreams; ++i) {
    if (streams_[i]) SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamDestroy(streams_[i]));
    if (joins_[i]) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(joins_[i]));
    streams_[i] = nullptr;
    joins_[i] = nullptr;
  }
  if (fork_) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(fork_));
  fork_ = nullptr;
  if (own_stream_) SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamDestroy(own_stream_));
  if (own_join_) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(own_join_));
  own_stream_ = nullptr;
  own_join_ = nullptr;
}

}  // namespace symmem::detail
