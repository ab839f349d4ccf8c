#include "device_memory.hpp"

#include <algorithm>

namespace symmem::test {

DeviceBuffer::DeviceBuffer(size_t n) : bytes(n) { TEST_CUDA(cudaMalloc(&ptr, std::max<size_t>(n, 1))); }
DeviceBuffer::~DeviceBuffer() { cudaFree(ptr); }

Counters::Counters(size_t n) : buffer_(n * sizeof(unsigned long long)), n_(n) {
  TEST_CUDA(cudaMemset(buffer_.ptr, 0, n * sizeof(unsigned long long)));
  TEST_CUDA(cudaDeviceSynchronize());
}

Counters::Counters(size_t n, cudaStream_t stream) : buffer_(n * sizeof(unsigned long long)), n_(n) {
  TEST_CUDA(cudaMemsetAsync(buffer_.ptr, 0, n * sizeof(unsigned long long), stream));
}

std::vector<unsigned long long> Counters::read(cudaStream_t stream) const {
  std::vector<unsigned long long> host(n_);
  TEST_CUDA(cudaMemcpyAsync(host.data(), buffer_.ptr, n_ * sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream));
  TEST_CUDA(cudaStreamSynchronize(stream));
  return host;
}

CapturedGraph::CapturedGraph(cudaStream_t stream, const std::function<void()>& record) {
  TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    record();
  } catch (...) {
    // End the capture, so that the stream is usable again, and let the error through.
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  TEST_CUDA(cudaStreamEndCapture(stream, &graph_));
  TEST_CUDA(cudaGraphInstantiate(&exec_, graph_, 0));
}

CapturedGraph::~CapturedGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
}

void CapturedGraph::launch(cudaStream_t stream) { TEST_CUDA(cudaGraphLaunch(exec_, stream)); }

size_t CapturedGraph::nodes() const {
  size_t count = 0;
  TEST_CUDA(cudaGraphGetNodes(graph_, nullptr, &count));
  return count;
}

}  // namespace symmem::test
