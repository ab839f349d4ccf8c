// The collectives. Each is asynchronous on `stream`, capturable in a CUDA graph at any time (the
// workspaces exist from creation on), and must be called by every rank with the same arguments:
// the same collective, count, type, reduce op, options, operand kinds and symmetric offsets.
// Ranks that disagree are detected on the device and every rank raises kMismatch naming both calls
// (at the next check()/synchronize() or collective call). Check after CUDA graph replays too: a
// replay does not pass through the host (docs/design.md, "What the device check cannot see").
//
// Operands. A *symmetric* operand is a heap Buffer (Communicator::allocate) and a byte offset into
// it; peers read or write it in place (zero copy). A *local* operand is any device pointer of this
// rank's GPU (cudaMalloc, a caching allocator, or a heap address passed as a plain pointer): peers
// never touch it, and the collective stages it through its workspace when the algorithm needs peer
// access. Symmetry is never inferred from an address, so every rank plans the same algorithm from
// values that are equal everywhere (docs/design.md, "Ownership and lifetimes").
//
// Errors: kInvalidArgument for bad input (nothing launched); kTimeout / kMismatch / kAborted when a
// device wait of an earlier call failed on some rank (the communicator is then unusable). A check
// of this rank's own operands that fails (null, host or another device's memory, outside its
// buffer, overlapping) refuses the call: every rank raises it, naming this rank, and the
// communicator is unusable afterwards (Communicator::refuse_call); a check of what every rank
// passes alike (count, type, op, options) raises here only and leaves the communicator usable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "symmem/communicator.hpp"
#include "symmem/types.hpp"

namespace symmem {

class Operand {
 public:
  // Symmetric: `buffer` at `offset_bytes`, the same offset on every rank (checked with every call).
  Operand(Buffer& buffer, size_t offset_bytes = 0) : buffer_(&buffer), offset_(offset_bytes) {}
  Operand(Buffer* buffer, size_t offset_bytes = 0) : buffer_(buffer), offset_(offset_bytes) {}
  // Local: any device memory of this rank.
  Operand(void* local) : local_(local) {}
  Operand(const void* local) : local_(const_cast<void*>(local)) {}

  bool symmetric() const { return buffer_ != nullptr; }
  Buffer* buffer() const { return buffer_; }
  size_t offset() const { return offset_; }
  // This rank's address of the operand.
  void* ptr() const { return buffer_ ? static_cast<char*>(buffer_->ptr()) + offset_ : local_; }

 private:
  Buffer* buffer_ = nullptr;
  size_t offset_ = 0;
  void* local_ = nullptr;
};

// out[r * count .. (r + 1) * count) = rank r's in[0 .. count). In place when `in` is this rank's
// slot of `out` (same buffer at offset out + rank * count elements, or the same address).
// Algorithms: kPull, kPush, kCopyEngine (zero SMs), kLowLatency (up to 1 MiB per rank).
void all_gather(Operand out, Operand in, size_t count, DataType type, Communicator& comm, cudaStream_t stream,
                const CollectiveOptions& options = {});

// out[i] = op over ranks of in[i], for i < count; identical bits on every rank. In place when
// in and out are the same. Algorithms: kOneShot, kOneShotPush, kTwoShot, kTwoShotPush, kLowLatency,
// kLowLatencyTwoShot. uint8 is not reducible.
void all_reduce(Operand out, Operand in, size_t count, DataType type, ReduceOp op, Communicator& comm,
                cudaStream_t stream, const CollectiveOptions& options = {});

// out[i] = op over ranks of in[rank * count + i], for i < count (count per rank). In place when
// out is this rank's slice of in. Algorithms: kPull, kPush (kTwoShot, kTwoShotPush: their
// earlier names), kLowLatency (up to 1 MiB per rank).
void reduce_scatter(Operand out, Operand in, size_t count, DataType type, ReduceOp op, Communicator& comm,
                    cudaStream_t stream, const CollectiveOptions& options = {});

// The plan the call would run, e.g. "all_gather pull blocks=16 vector=16", or throws the error
// the call would raise. No work is launched and nothing is exchanged with other ranks.
std::string describe_all_gather(Operand out, Operand in, size_t count, DataType type, Communicator& comm,
                                const CollectiveOptions& options = {});
std::string describe_all_reduce(Operand out, Operand in, size_t count, DataType type, Communicator& comm,
                                const CollectiveOptions& options = {});
std::string describe_reduce_scatter(Operand out, Operand in, size_t count, DataType type, Communicator& comm,
                                    const CollectiveOptions& options = {});

}  // namespace symmem
