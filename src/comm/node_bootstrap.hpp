// The bootstrap of a node's ranks inside a job's bootstrap: rank and world are the local ones,
// and every exchange is an exchange of the whole job of which this node keeps its own part. So
// the heap, the host board and the descriptor exchange of a communicator that spans nodes stay
// node-local without any extra rendezvous; every node makes the same calls in the same order
// (the collective calls of the job), so the job's rounds stay aligned.
#pragma once

#include <memory>

#include "plan/node_layout.hpp"
#include "symmem/bootstrap.hpp"

namespace symmem::detail {

class NodeBootstrap final : public Bootstrap {
 public:
  NodeBootstrap(std::shared_ptr<Bootstrap> job, const NodeLayout& layout);
  int rank() const override { return layout_.local_rank; }
  int world() const override { return layout_.local_world; }
  void all_gather(const void* mine, void* all, size_t bytes) override;
  void barrier() override { job_->barrier(); }

 private:
  std::shared_ptr<Bootstrap> job_;
  NodeLayout layout_;
};

}  // namespace symmem::detail
