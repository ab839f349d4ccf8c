// Shared by all_reduce and reduce_scatter: validate, plan and stage a reduction, then fill the
// kernel arguments. The two collectives differ only in sizes, the plan and the kernel launched.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/kernel_args.hpp"
#include "plan/plan.hpp"
#include "symmem/communicator.hpp"

namespace symmem::detail {

struct PreparedReduction {
  ReducePlan plan;
  ReduceKernelArgs args{};
};

// `reduce_scatter`: in holds count * world elements, out count. Else both hold count.
// With stream == nullptr (describe), nothing is staged or launched.
PreparedReduction prepare_reduction(bool reduce_scatter, void* out, const void* in, size_t count, DataType type,
                                    ReduceOp op, Communicator& comm, cudaStream_t stream,
                                    const CollectiveOptions& options, bool launch);

}  // namespace symmem::detail
