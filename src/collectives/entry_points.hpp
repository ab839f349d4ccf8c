// The one entry point of each collective, which both APIs call: the C++ API (include/symmem/
// collectives.hpp), whose Operands say their kind by their type, and the C ABI (src/capi/), which
// passes addresses whose kind the call's one lookup decides (operands.hpp, CallOperand).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/operands.hpp"
#include "plan/algorithms.hpp"
#include "symmem/collectives.hpp"

namespace symmem::detail {

void all_gather_entry(const CallOperand& out, const CallOperand& in, size_t count, DataType type, Communicator& comm,
                      cudaStream_t stream, const CollectiveOptions& options);
std::string describe_all_gather_entry(const CallOperand& out, const CallOperand& in, size_t count, DataType type,
                                      Communicator& comm, const CollectiveOptions& options);

// `collective`: kAllReduce or kReduceScatter.
void reduction_entry(Collective collective, const CallOperand& out, const CallOperand& in, size_t count,
                     DataType type, ReduceOp op, Communicator& comm, cudaStream_t stream,
                     const CollectiveOptions& options);
std::string describe_reduction_entry(Collective collective, const CallOperand& out, const CallOperand& in,
                                     size_t count, DataType type, Communicator& comm,
                                     const CollectiveOptions& options);

void all_to_all_entry(const CallOperand& out, const CallOperand& in, size_t bytes_per_pair, Communicator& comm,
                      cudaStream_t stream, const CollectiveOptions& options);
void all_to_all_v_entry(const CallOperand& out, size_t out_rows, const CallOperand& in, size_t in_rows,
                        const int64_t* in_splits, const int64_t* out_splits, size_t row_bytes, Communicator& comm,
                        cudaStream_t stream, const CollectiveOptions& options);
// all_to_all_vdev (two_d false: one expert, major_align 0) and all_to_all_vdev_2d (major_align >= 1).
void all_to_all_vdev_entry(const CallOperand& out, size_t out_rows, const CallOperand& in, size_t in_rows,
                           const int64_t* in_splits, int64_t* out_splits_offsets, size_t row_bytes, int experts,
                           int64_t major_align, bool two_d, Communicator& comm, cudaStream_t stream,
                           const CollectiveOptions& options);
std::string describe_all_to_all_entry(const CallOperand& out, const CallOperand& in, size_t bytes_per_pair,
                                      Communicator& comm, const CollectiveOptions& options);
std::string describe_all_to_all_v_entry(const CallOperand& out, size_t out_rows, const CallOperand& in,
                                        size_t in_rows, size_t row_bytes, bool device_splits, int experts,
                                        int64_t major_align, Communicator& comm, const CollectiveOptions& options);

}  // namespace symmem::detail
