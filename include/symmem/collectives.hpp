// The collectives. Each is asynchronous on `stream`, capturable in a CUDA graph (once any staging
// buffer it needs exists: run the call once before capture, or keep buffers in the heap), and
// must be called by every rank with the same count, type and algorithm options.
//
// Buffers may live in the symmetric heap (Communicator::allocate) or be any device memory of
// this rank's GPU; the latter are staged through a heap buffer (one extra local copy).
// Errors: kInvalidArgument for bad input (nothing launched), kTimeout when a device wait of an
// earlier call expired (the communicator is then unusable: kAborted afterwards).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "symmem/communicator.hpp"
#include "symmem/types.hpp"

namespace symmem {

// out[r * count .. (r + 1) * count) = rank r's in[0 .. count). In place when
// in == out + rank * count elements. Algorithms: kPull, kPush, kCopyEngine (zero SMs).
void all_gather(void* out, const void* in, size_t count, DataType type, Communicator& comm, cudaStream_t stream,
                const CollectiveOptions& options = {});

// out[i] = op over ranks of in[i], for i < count; identical bits on every rank. In place when
// in == out. Algorithms: kOneShot, kTwoShot, kLowLatency. uint8 is not reducible.
void all_reduce(void* out, const void* in, size_t count, DataType type, ReduceOp op, Communicator& comm,
                cudaStream_t stream, const CollectiveOptions& options = {});

// out[i] = op over ranks of in[rank * count + i], for i < count (count per rank).
void reduce_scatter(void* out, const void* in, size_t count, DataType type, ReduceOp op, Communicator& comm,
                    cudaStream_t stream, const CollectiveOptions& options = {});

// The plan the call would run, e.g. "all_gather pull blocks=16 vector=16", or throws the error
// the call would raise. No work is launched.
std::string describe_all_gather(const void* out, const void* in, size_t count, DataType type, Communicator& comm,
                                const CollectiveOptions& options = {});
std::string describe_all_reduce(const void* out, const void* in, size_t count, DataType type, Communicator& comm,
                                const CollectiveOptions& options = {});
std::string describe_reduce_scatter(const void* out, const void* in, size_t count, DataType type, Communicator& comm,
                                    const CollectiveOptions& options = {});

}  // namespace symmem
