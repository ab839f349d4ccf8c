// Shared by all_reduce and reduce_scatter: validate and plan a reduction from values equal on every
// rank, then run it chunk by chunk (staging local operands, filling the kernel arguments).
#pragma once

#include <cuda_runtime_api.h>

#include "board/call_signature.hpp"
#include "collectives/operands.hpp"
#include "plan/plan.hpp"
#include "symmem/collectives.hpp"

namespace symmem::detail {

struct CommunicatorState;
struct RefusalSite;

struct PreparedReduction {
  ReducePlan plan;
  bool reduce_scatter = false;
  size_t count = 0;  // all-reduce: elements; reduce-scatter: elements per rank
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  bool in_place = false;
  Resolved in;
  Resolved out;
  CallDescriptor call;
};

// `reduce_scatter`: in holds count * world elements, out count. Else both hold count. Launches
// nothing. `site`: where this rank's operand checks refuse the call (null: a describe_* query).
PreparedReduction prepare_reduction(bool reduce_scatter, const Operand& out, const Operand& in, size_t count,
                                    DataType type, ReduceOp op, CommunicatorState& state,
                                    const CollectiveOptions& options, const RefusalSite* site);

// Launches the prepared reduction on `stream`, in as many chunks as its workspaces need.
void run_reduction(const PreparedReduction& p, CommunicatorState& state, cudaStream_t stream);

}  // namespace symmem::detail
