// The user-call area (a workspace of its own purpose, workspaces.hpp): the flags and epochs of
// users' kernels (include/symmem/device.cuh, python/symmem/triton), apart from the library's own,
// so that a faulty user kernel cannot corrupt a library collective's barriers (nor a library
// kernel a user's).
//
// A heap range allocated with the workspaces when the communicator is created (fixed size, never
// resized, released only with the heap: a CUDA graph that captured a user kernel keeps referencing
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
#include "heap/heap_area.hpp"
#include "symmem/user_call.hpp"

namespace symmem::detail {

constexpr size_t kUserFlagCount = size_t(kUserPhases) * kUserMaxBlocks * kMaxWorld;
constexpr size_t kUserFlagBytes = kUserFlagCount * sizeof(uint64_t);
constexpr size_t kUserEpochsOffset = kUserFlagBytes;
constexpr size_t kUserAreaBytes = kUserEpochsOffset + kUserMaxBlocks * sizeof(uint32_t);

// The UserSync of every user call of a communicator, but its signature: the area's flags and
// epochs, and the library's failure record, claim word, abort word, deadline and ranks (`library`,
// the communicator's synchronisation template).
UserSync user_sync_template(const HeapArea& area, const SyncArgs& library);

}  // namespace symmem::detail
