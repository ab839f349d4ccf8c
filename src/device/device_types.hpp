// Plain structs shared by host and device code: the status word kernels write on a timeout, the
// synchronisation arguments every SM collective receives, and the signal-pad layout.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define SYMMEM_HOST_DEVICE __host__ __device__
#else
#define SYMMEM_HOST_DEVICE
#endif

namespace symmem::detail {

constexpr int kMaxWorld = 8;       // ranks of one NVLink domain
constexpr int kMaxBlocks = 160;    // SM collectives launch at most this many blocks
constexpr int kBarrierPhases = 4;  // distinct barriers one kernel may use (start, middle, end, ...)

// Written by the first device wait that passes its deadline; read by the host, which raises
// symmem::Error and marks the communicator unusable. Lives in mapped pinned host memory.
struct DeviceStatus {
  uint32_t code;  // 0: fine; 1: timeout
  uint32_t op;    // OpCode of the kernel that timed out
  int32_t rank;   // who waited
  int32_t peer;   // for whom
  int32_t block;
  int32_t phase;  // which barrier or flag
};

enum OpCode : uint32_t {
  kOpNone = 0,
  kOpBarrier = 1,
  kOpAllGather = 2,
  kOpAllReduce = 3,
  kOpReduceScatter = 4,
  kOpCopyEngine = 5,
};

inline const char* op_code_name(uint32_t op) {
  switch (op) {
    case kOpBarrier: return "barrier";
    case kOpAllGather: return "all_gather";
    case kOpAllReduce: return "all_reduce";
    case kOpReduceScatter: return "reduce_scatter";
    case kOpCopyEngine: return "all_gather(copy_engine)";
    default: return "collective";
  }
}

// Signal pad of one rank: flags[phase][block][peer], each written by `peer` with the epoch of
// `block` when it reaches barrier `phase`.
constexpr size_t kSignalFlagCount = size_t(kBarrierPhases) * kMaxBlocks * kMaxWorld;
SYMMEM_HOST_DEVICE constexpr size_t signal_slot(int phase, int block, int peer) {
  return (size_t(phase) * kMaxBlocks + block) * kMaxWorld + peer;
}

struct SyncArgs {
  uint32_t* pad;                   // this rank's signal pad (flags written by peers)
  uint32_t* peer_pads[kMaxWorld];  // every rank's pad, mapped here
  uint32_t* epochs;                // this rank's per-block epoch counters (local device memory)
  uint32_t* call_counter;          // {calls of parity-alternating kernels so far, blocks finished}
  DeviceStatus* status;            // device pointer to the mapped status word
  uint64_t timeout_ns;
  int rank;
  int world;
  uint32_t op;
};

}  // namespace symmem::detail
