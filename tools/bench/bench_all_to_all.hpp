// symmem-bench all_to_all: bytes per rank from -b to -e, splits uniform, zipf (s = 1.1, each
// rank's nearest neighbours first) or onehot (every rank sends everything to rank 0, which holds
// exactly that); NCCL's send/receive all-to-all (torch's all_to_all_single) on the same heap
// buffers, symmem's all_to_all (uniform), all_to_all_v (host splits) and all_to_all_vdev (device
// splits) for every algorithm; outputs checked against the expected placement, nothing written
// past it. Rows are 256 bytes for the variable forms. The row's op is all_to_all,
// all_to_all_zipf or all_to_all_onehot; busbw as nccl-tests' alltoall: algbw (bytes per rank /
// time) x (world - 1) / world.
#pragma once

#include <vector>

#include "bench_context.hpp"

namespace symmem::bench {

std::vector<Row> run_all_to_all(BenchContext& ctx);

}  // namespace symmem::bench
