#include "workspace/user_call_area.hpp"

#include <cstddef>

namespace symmem::detail {

// Kernels built against the public headers write the host board's failure record through
// FailureRecord and its codes; they must be the library's DeviceStatus and StatusCode.
static_assert(sizeof(FailureRecord) == sizeof(DeviceStatus), "FailureRecord must match DeviceStatus");
static_assert(offsetof(FailureRecord, code) == offsetof(DeviceStatus, code), "FailureRecord::code");
static_assert(offsetof(FailureRecord, op) == offsetof(DeviceStatus, op), "FailureRecord::op");
static_assert(offsetof(FailureRecord, rank) == offsetof(DeviceStatus, rank), "FailureRecord::rank");
static_assert(offsetof(FailureRecord, peer) == offsetof(DeviceStatus, peer), "FailureRecord::peer");
static_assert(offsetof(FailureRecord, block) == offsetof(DeviceStatus, block), "FailureRecord::block");
static_assert(offsetof(FailureRecord, phase) == offsetof(DeviceStatus, phase), "FailureRecord::phase");
static_assert(offsetof(FailureRecord, signature) == offsetof(DeviceStatus, signature), "FailureRecord::signature");
static_assert(offsetof(FailureRecord, peer_signature) == offsetof(DeviceStatus, peer_signature),
              "FailureRecord::peer_signature");
static_assert(uint32_t(kFailureTimeout) == uint32_t(kStatusTimeout) &&
                  uint32_t(kFailureMismatch) == uint32_t(kStatusMismatch) &&
                  uint32_t(kFailureAborted) == uint32_t(kStatusAborted),
              "FailureCode must match StatusCode");
static_assert(kUserCallOp == kOpUser, "kUserCallOp must match OpCode kOpUser");
static_assert(kUserMaxBlocks <= kMaxBlocks, "a user kernel's blocks index the per-block words of a communicator");

UserSync user_sync_template(const HeapArea& area, const SyncArgs& library) {
  UserSync s{};
  s.flags = static_cast<uint64_t*>(area.ptr());
  for (int r = 0; r < library.world; ++r) s.peer_flags[r] = static_cast<uint64_t*>(area.peer_ptr(r));
  s.epochs = reinterpret_cast<uint32_t*>(static_cast<char*>(area.ptr()) + kUserEpochsOffset);
  s.failure_claim = library.failure_claim;
  s.failure = reinterpret_cast<FailureRecord*>(library.failure);
  s.abort = library.abort;
  s.timeout_ns = library.timeout_ns;
  s.rank = library.rank;
  s.world = library.world;
  s.signature = 0;
  return s;
}

}  // namespace symmem::detail
