// The user-call area (a workspace of its own purpose): the flags and epochs of users' kernels (include/symmem/device.cuh,
// python/symmem/triton), apart from the library's own, so that a faulty user kernel cannot corrupt
// a library collective's barriers (nor a library kernel a user's).
//
// One heap buffer, allocated when the communicator is created (fixed size, never resized, released
// only when the communicator closes: a CUDA graph that captured a user kernel keeps referencing
// valid memory), laid out as
//   [ barrier flags: uint64 [kUserPhases][kUserMaxBlocks][kMaxWorld] | epochs: uint32 [kUserMaxBlocks] ]
// Flags: rank p's block b stores {epoch << 32 | signature} into slot [phase][b][p] of every peer
// when it reaches barrier `phase`; each rank polls only its own copy. Epochs: this rank's per-block
// call numbers, read and advanced by the kernel itself (graph replays count), never by a peer.
// Both start at zero (the heap zeroes what it maps). The failure record, its claim word and the
// abort word are the communicator's: a failed user wait is reported as a library wait is.
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"
#include "symmem/communicator.hpp"
#include "symmem/user_call.hpp"

namespace symmem::detail {

constexpr size_t kUserFlagCount = size_t(kUserPhases) * kUserMaxBlocks * kMaxWorld;
constexpr size_t kUserFlagBytes = kUserFlagCount * sizeof(uint64_t);
constexpr size_t kUserEpochsOffset = kUserFlagBytes;
constexpr size_t kUserAreaBytes = kUserEpochsOffset + kUserMaxBlocks * sizeof(uint32_t);

class UserCallArea {
 public:
  // Collective (allocates a heap buffer). `library` is the communicator's synchronisation template:
  // the failure record, claim word, abort word, deadline and ranks are shared with it.
  // `heap_stride`: the heap's per-rank reserve (rank r's copy of every heap address lies at
  // base + r * heap_stride in every process, heap/heap.hpp).
  UserCallArea(Communicator& comm, const SyncArgs& library, size_t heap_stride);
  // The buffer belongs to the communicator (released by close()); nothing to do here.

  bool owns(const Buffer* buffer) const { return buffer == buffer_; }
  // The UserSync of one call.
  UserSync sync(uint32_t signature) const {
    UserSync s = template_;
    s.signature = signature;
    return s;
  }
  // Byte distance between two ranks' copies of any heap address (the heap's per-rank reserve).
  size_t heap_stride() const { return heap_stride_; }

 private:
  Buffer* buffer_ = nullptr;
  UserSync template_{};
  size_t heap_stride_ = 0;
};

}  // namespace symmem::detail
