// Plain structs shared by host and device code: the failure record kernels write, the
// synchronisation arguments every SM collective receives, and the barrier-flag layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "symmem/types.hpp"  // kMaxWorld

#ifdef __CUDACC__
#define SYMMEM_HOST_DEVICE __host__ __device__
#else
#define SYMMEM_HOST_DEVICE
#endif

namespace symmem::detail {

constexpr int kMaxBlocks = 160;        // SM collectives launch at most this many blocks
constexpr int kThreadsPerBlock = 512;  // of every SM collective but the bulk push
constexpr int kBarrierPhases = 4;      // distinct barriers one kernel may use (start, middle, end, ...)

// A rank's failure record. Each rank has one in its page of the communicator's host board
// (src/board/host_board.hpp: host memory shared by every local rank and mapped into every GPU), so
// any rank's host can read why any other rank failed. The first device wait of this rank that
// fails fills it; it is never cleared (the communicator is unusable afterwards).
struct DeviceStatus {
  uint32_t code;            // StatusCode
  uint32_t op;              // OpCode of the kernel (or copy-engine call) that failed
  int32_t rank;             // who waited
  int32_t peer;             // for whom
  int32_t block;            // -1: not a kernel block (copy engine)
  int32_t phase;            // which barrier or flag
  uint32_t signature;       // the signature of this rank's call
  uint32_t peer_signature;  // mismatch: the signature the peer's flag carried
};

enum StatusCode : uint32_t {
  kStatusOk = 0,
  kStatusTimeout = 1,   // a peer's flag did not come before the deadline
  kStatusMismatch = 2,  // a peer's flag came from a different call (signature differs)
  kStatusAborted = 3,   // another rank failed first (the abort word was set)
  kStatusNetwork = 4,   // NCCL between nodes reported an error (a remote rank died, the network failed)
  kStatusCapacity = 5,  // an all-to-all or MoE call does not fit its buffers (src/plan/capacity_failure.hpp)
  kStatusRefused = 6,   // this rank refused a call whose arguments failed its checks (src/comm/refusal.hpp):
                        // block holds the ErrorCode, the host board page the message
};

// Whether a record says why calls failed (a root cause), not only that this rank saw another's
// failure (kStatusAborted) or nothing (kStatusOk).
SYMMEM_HOST_DEVICE constexpr bool is_failure_cause(uint32_t code) {
  return code == kStatusTimeout || code == kStatusMismatch || code == kStatusNetwork || code == kStatusCapacity ||
         code == kStatusRefused;
}

enum OpCode : uint32_t {
  kOpNone = 0,
  kOpBarrier = 1,
  kOpAllGather = 2,
  kOpAllReduce = 3,
  kOpReduceScatter = 4,
  kOpCopyEngine = 5,
  kOpBetweenNodes = 6,         // the NCCL step of a hierarchical all-gather (peer: a job rank)
  kOpAllGatherMatmul = 7,      // the GEMM of all_gather_matmul waiting for a shard (peer: its rank)
  kOpMatmulReduceScatter = 8,  // matmul_reduce_scatter (its waits are the copy-engine handshakes)
  kOpAllToAll = 9,
  kOpMoeDispatch = 10,
  kOpMoeCombine = 11,
  // The calls of users' kernels, numbered apart from the library's collectives:
  kOpUser = 16,             // a user kernel (include/symmem/user_call.hpp): its description is in the call log
  kOpAllGatherPieces = 17,  // all_gather_pieces (its waits are the copy-engine handshakes and the consumer's)
};

inline const char* op_code_name(uint32_t op) {
  switch (op) {
    case kOpBarrier: return "barrier";
    case kOpAllGather: return "all_gather";
    case kOpAllReduce: return "all_reduce";
    case kOpReduceScatter: return "reduce_scatter";
    case kOpCopyEngine: return "all_gather(copy_engine)";
    case kOpBetweenNodes: return "all_gather(hierarchical, between nodes)";
    case kOpAllGatherMatmul: return "all_gather_matmul";
    case kOpMatmulReduceScatter: return "matmul_reduce_scatter";
    case kOpAllToAll: return "all_to_all";
    case kOpMoeDispatch: return "moe_dispatch";
    case kOpMoeCombine: return "moe_combine";
    case kOpUser: return "user kernel";
    case kOpAllGatherPieces: return "all_gather_pieces";
    default: return "collective";
  }
}

// Barrier flags of one rank: flags[phase][block][peer], a 64-bit word written by `peer` as
// (epoch << 32 | signature) when its block `block` reaches barrier `phase`. They live in the data
// area of the communicator's control buffer (not in a Buffer's 32-bit signal pad).
constexpr size_t kSignalFlagCount = size_t(kBarrierPhases) * kMaxBlocks * kMaxWorld;
SYMMEM_HOST_DEVICE constexpr size_t signal_slot(int phase, int block, int peer) {
  return (size_t(phase) * kMaxBlocks + block) * kMaxWorld + peer;
}
SYMMEM_HOST_DEVICE constexpr uint64_t barrier_flag(uint32_t epoch, uint32_t signature) {
  return (uint64_t(epoch) << 32) | signature;
}

// Two-shot slicing: rank r reduces elements [r * slice, min((r + 1) * slice, count)); slices are
// whole 16-byte vectors so that every slice start stays aligned. The planner sizes the two-shot
// algorithms with it, the kernels cut their work with it.
SYMMEM_HOST_DEVICE inline size_t two_shot_slice(size_t count, int world, size_t elem_bytes) {
  const size_t elems_per_vector = 16 / elem_bytes;
  const size_t vectors = (count + elems_per_vector - 1) / elems_per_vector;
  return (vectors + world - 1) / world * elems_per_vector;
}

// The low-latency lines (device/low_latency.cuh): every rank's receive area, each holding a slot
// of `slot_words` 4-byte words per sender in each parity half.
struct LowLatencyLines {
  uint64_t* peers[kMaxWorld];
  size_t slot_words;
};

struct SyncArgs {
  uint64_t* pad;                   // this rank's barrier flags (written by peers)
  uint64_t* peer_pads[kMaxWorld];  // every rank's barrier flags, mapped here
  uint32_t* epochs;                // this rank's per-block epoch counters (local device memory)
  uint32_t* call_counter;          // {calls of parity-alternating kernels so far, blocks counted in
                                   // this call (finished; the variable all-to-all: read the headers)}
  uint32_t* failure_claim;         // 0 until a wait of this rank fails (local device memory): the
                                   // first to claim it writes the record
  DeviceStatus* failure;           // this rank's failure record (device pointer, host board)
  uint32_t* abort;                 // the communicator's abort word (host board): nonzero once any
                                   // rank failed; every wait of every rank polls it
  uint64_t timeout_ns;
  int rank;
  int world;
  uint32_t op;
  // This call's signature (nonzero): a hash of everything every rank must agree on (op, count,
  // type, reduce op, algorithm, blocks, symmetric offsets, ...). Carried in every flag the ranks
  // exchange, so a peer that called something else is detected on the device.
  uint32_t signature;
};

}  // namespace symmem::detail
