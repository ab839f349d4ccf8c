#include "comm/graph_references.hpp"

#include "common/check.hpp"

namespace symmem::detail {

namespace {

using Count = std::shared_ptr<std::atomic<int>>;

void release(void* count) {
  auto* held = static_cast<Count*>(count);
  (*held)->fetch_sub(1, std::memory_order_acq_rel);
  delete held;
}

}  // namespace

void GraphReferences::hold(cudaGraph_t graph, unsigned long long capture_id) {
  if (capture_id == last_capture_) return;
  auto* held = new Count(live_);
  cudaUserObject_t object = nullptr;
  const cudaError_t err = cudaUserObjectCreate(&object, held, release, 1, cudaUserObjectNoDestructorSync);
  if (err != cudaSuccess) {
    delete held;
    SYMMEM_CUDA_CHECK(err);
  }
  live_->fetch_add(1, std::memory_order_acq_rel);
  // The graph takes over the one reference: the object dies with the graph.
  const cudaError_t moved = cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove);
  if (moved != cudaSuccess) {
    SYMMEM_CUDA_CHECK_NOTHROW(cudaUserObjectRelease(object, 1));  // runs release(): the count is back
    SYMMEM_CUDA_CHECK(moved);
  }
  last_capture_ = capture_id;
}

}  // namespace symmem::detail
