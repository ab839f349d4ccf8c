// How many CUDA graphs hold calls of a communicator: a graph that captured a call references the
// communicator's heap and workspaces at every replay, so none of it may be unmapped while such a
// graph (or an executable instantiated from it) exists.
//
// The first call captured into a graph attaches a CUDA user object to it; CUDA destroys the object
// once the graph and every executable made from it are gone and their launches have finished. The
// count lives apart from the communicator, since CUDA may destroy the object after it, and the
// object's destructor only decrements it (CUDA runs it on an internal thread, where no CUDA call
// is allowed).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>

namespace symmem::detail {

class GraphReferences {
 public:
  GraphReferences() : live_(std::make_shared<std::atomic<int>>(0)) {}

  // For a call enqueued on `stream` while it captures `graph` (capture `capture_id`): holds this
  // communicator for that graph, once per capture.
  void hold(cudaGraph_t graph, unsigned long long capture_id);
  // Graphs that captured a call and still exist (or still run).
  int live() const { return live_->load(std::memory_order_acquire); }

 private:
  std::shared_ptr<std::atomic<int>> live_;
  unsigned long long last_capture_ = 0;
};

}  // namespace symmem::detail
