// Device memory, counters and graphs for the GPU tests, without NCCL (the shared-GPU tests use
// them too): TEST_CUDA, memory that frees itself, per-call mismatch counters read back at the end,
// and a captured CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "test.hpp"

namespace symmem::test {

#define TEST_CUDA(expr)                                                                                                \
  do {                                                                                                                 \
    cudaError_t e_ = (expr);                                                                                           \
    if (e_ != cudaSuccess) ::symmem::test::fail(__FILE__, __LINE__, std::string(#expr) + ": " + cudaGetErrorName(e_)); \
  } while (0)

// Device memory that frees itself.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Device counters, one per case or call, read back at the end without a host sync per call.
class Counters {
 public:
  explicit Counters(size_t n);  // zeroed, and the device synchronised
  // Zeroed on `stream` only: for ranks sharing a GPU, where a device-wide synchronisation would
  // wait for a peer's kernel that waits for this rank.
  Counters(size_t n, cudaStream_t stream);
  unsigned long long* at(size_t i) const { return static_cast<unsigned long long*>(buffer_.ptr) + i; }
  std::vector<unsigned long long> read(cudaStream_t stream) const;  // synchronises the stream

 private:
  DeviceBuffer buffer_;
  size_t n_;
};

// A CUDA graph of what `record` enqueues on `stream` (captured thread-locally), instantiated and
// destroyed with its owner. If `record` throws, the capture is ended and the exception passes on.
class CapturedGraph {
 public:
  CapturedGraph(cudaStream_t stream, const std::function<void()>& record);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch(cudaStream_t stream);
  // The graph's nodes: what one replay puts in the launch queue.
  size_t nodes() const;

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace symmem::test
