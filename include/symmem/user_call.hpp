// User kernels on the symmetric heap are calls of their communicator, as the library's collectives
// are: every rank launches the same kernel, in the same order, on the communicator's one ordered
// sequence of calls. begin_user_call() is the host half of such a call: it refuses an aborted or
// closed communicator, orders the call after the communicator's previous one whatever its stream
// (as every collective does), holds the communicator for a CUDA graph that captures the call (its
// memory stays mapped while the graph lives), logs `description` in the host board under the
// call's signature, and returns the UserSync the kernel takes by value (include/symmem/device.cuh
// has the device half: barriers, signals and waits with the communicator's deadline and abort
// word). Launch the kernel right after it, on the same stream, then (optionally) end_user_call().
//
// The signature is a hash of the description and the block count, so ranks that launched
// different kernels, or the same kernel on different shapes, fail with kMismatch naming both calls
// (the description should therefore hold everything the ranks must agree on: the kernel's name,
// its shapes and dtypes, its grid). A peer that never launches makes every rank's wait fail with
// kTimeout naming it. Either error is raised on every rank at its next check() or call.
//
// User kernels have flags and epochs of their own (a user-call area allocated when the
// communicator is created, used by no library kernel): a faulty user kernel cannot corrupt a
// library collective's barriers. The rules are in docs/kernels.md.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "symmem/communicator.hpp"

namespace symmem {

constexpr int kUserPhases = 4;       // distinct barriers one user kernel may use (each once per call)
constexpr int kUserMaxBlocks = 160;  // blocks (Triton programs) of a user kernel that uses epochs

// A rank's failure record as kernels write it: the layout of the host board's record (checked
// against it when the library is built). The first failed wait of a rank fills it; check() reads it.
struct FailureRecord {
  uint32_t code;            // FailureCode
  uint32_t op;              // which kind of call failed (a user kernel: kUserCallOp)
  int32_t rank;             // the local rank that waited
  int32_t peer;             // the local rank it waited for
  int32_t block;            // the block (Triton program) that waited
  int32_t phase;            // which barrier, or the number the kernel gave its signal wait
  uint32_t signature;       // the signature of this rank's call
  uint32_t peer_signature;  // a mismatch: the signature the peer's flag carried
};

enum FailureCode : uint32_t {
  kFailureNone = 0,
  kFailureTimeout = 1,   // the peer's flag did not come before the deadline
  kFailureMismatch = 2,  // the peer's flag came from a different call
  kFailureAborted = 3,   // another rank (or a watchdog) failed first: the abort word is set
};

constexpr uint32_t kUserCallOp = 16;  // FailureRecord::op of a user kernel

// What a user kernel needs to synchronise with its peers, for one call. Trivially copyable: pass
// it to the kernel by value. Its ranks are the node's local ranks (Buffer::DeviceHandle's).
struct UserSync {
  uint64_t* flags;                    // this rank's barrier flags, [phase][block][peer] (written by peers)
  uint64_t* peer_flags[kMaxWorld];    // every rank's barrier flags, as mapped here
  uint32_t* epochs;                   // this rank's per-block call numbers (device memory)
  uint32_t* failure_claim;            // elects the one failed wait of this rank that writes the record
  FailureRecord* failure;             // this rank's failure record (host memory, mapped)
  uint32_t* abort;                    // the communicator's abort word (host memory, mapped)
  uint64_t timeout_ns;                // every wait's deadline, from when it started
  int32_t rank;
  int32_t world;
  uint32_t signature;                 // this call's (nonzero)
};

// The host half of a user kernel call (see the top of this file). `blocks` is the grid the kernel
// will be launched with (1 to kUserMaxBlocks); `stream` the stream it will be launched on, next,
// by this thread. Throws kAborted once the communicator failed, kUnsupported on a communicator
// that spans nodes, kInvalidArgument for an empty description or a grid out of range.
UserSync begin_user_call(Communicator& comm, const std::string& description, int blocks, cudaStream_t stream);

// Optional, right after launching the kernel of the last begin_user_call on the same `stream`:
// records the call's end, so that the communicator's next call on another stream waits for this
// kernel only, not also for work queued behind it on `stream`. Without it the order is still
// kept (that next call then waits for all `stream` holds at that moment). Never throws but for a
// capture invalidated by an earlier error; nothing to do on a closed communicator.
void end_user_call(Communicator& comm, cudaStream_t stream);

// The signature begin_user_call gives a description and block count (the same on every rank).
uint32_t user_call_signature(const std::string& description, int blocks);

}  // namespace symmem
