// The node layout every rank of a job agrees on when a communicator is created (the layout itself
// is plain C++: plan/node_layout.hpp).
#pragma once

#include <string>

#include "plan/node_layout.hpp"
#include "symmem/bootstrap.hpp"

namespace symmem::detail {

// Collective over the job's bootstrap: every rank's host identity and node size wish are exchanged,
// so every rank decides from the same values. The wish is `node_size` if positive; else, when the
// bootstrap covers the whole job (WORLD_SIZE ranks), SYMMEM_NODE_SIZE, else LOCAL_WORLD_SIZE; else 0
// (group by host). Throws kInvalidArgument when the ranks wish different sizes and
// kUnsupported when a node would hold ranks of different hosts.
NodeLayout agree_on_layout(int node_size, Bootstrap& job);

// This machine's identity for layout_by_host: host name and kernel boot id, so that two hosts with
// one name (containers) are still told apart.
std::string local_host_identity();

}  // namespace symmem::detail
