// How a call that does not fit its buffers is recorded and reported. The exchange kernels of the
// all-to-all and of MoE dispatch find a LayoutFault from the matrix every rank received (the same
// on every rank) and record it as kStatusCapacity in the rank's failure record, whose fields carry:
//   peer            the rank at fault (LayoutFault::rank)
//   block           the kind in the low 8 bits, other + 1 above them (0: no other rank or expert)
//   phase           the capacity, saturated to INT32_MAX
//   peer_signature  the rows needed, saturated to UINT32_MAX
// No row moves in such a call, on any rank; the communicator is unusable afterwards (every rank's
// next call, check() or synchronize() raises kCapacity with the same message).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "device/device_types.hpp"
#include "plan/all_to_all_layout.hpp"

namespace symmem::detail {

struct EncodedFault {
  int32_t peer;
  int32_t block;
  int32_t phase;
  uint32_t peer_signature;
};

SYMMEM_HOST_DEVICE inline EncodedFault encode_fault(const LayoutFault& f) {
  const int32_t capacity = f.capacity > 0x7FFFFFFFull ? 0x7FFFFFFF : static_cast<int32_t>(f.capacity);
  const uint32_t needed = f.needed > 0xFFFFFFFFull ? 0xFFFFFFFFu : static_cast<uint32_t>(f.needed);
  return {f.rank, static_cast<int32_t>((f.kind & 0xFFu) | (uint32_t(f.other + 1) << 8)), capacity, needed};
}

inline LayoutFault decode_fault(const DeviceStatus& s) {
  LayoutFault f;
  f.kind = static_cast<uint32_t>(s.block) & 0xFFu;
  f.other = static_cast<int>(static_cast<uint32_t>(s.block) >> 8) - 1;
  f.rank = s.peer;
  f.capacity = static_cast<uint64_t>(s.phase);
  f.needed = s.peer_signature;
  return f;
}

// "rank 3 would receive 70000 rows, its output holds 65536 (in all_to_all_vdev(...)); no rank moved
// any row of this call". `rank_name` turns a local rank into its name in the job.
std::string describe_capacity_failure(const LayoutFault& fault, const std::string& call,
                                      const std::function<std::string(int)>& rank_name);

}  // namespace symmem::detail
