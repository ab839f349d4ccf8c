#include "comm/node_bootstrap.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

namespace symmem::detail {

NodeBootstrap::NodeBootstrap(std::shared_ptr<Bootstrap> job, const NodeLayout& layout)
    : job_(std::move(job)), layout_(layout) {}

void NodeBootstrap::all_gather(const void* mine, void* all, size_t bytes) {
  std::vector<uint8_t> everyone(bytes * layout_.world);
  job_->all_gather(mine, everyone.data(), bytes);
  const size_t first = static_cast<size_t>(layout_.global_rank(layout_.node, 0)) * bytes;
  std::memcpy(all, everyone.data() + first, bytes * layout_.local_world);
}

}  // namespace symmem::detail
