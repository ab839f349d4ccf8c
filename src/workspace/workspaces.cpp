#include "workspace/workspaces.hpp"

#include <string>

#include "common/check.hpp"
#include "device/device_types.hpp"
#include "workspace/user_call_area.hpp"

namespace symmem::detail {

Workspaces::Workspaces(Heap& heap, Bootstrap& bootstrap, FdExchange& exchange, int rank, int world, size_t budget)
    : world_(world) {
  if (budget < kMinBudget)
    throw Error(ErrorCode::kInvalidArgument, "workspace budget of " + std::to_string(budget) +
                                                 " bytes is below the minimum of " + std::to_string(kMinBudget) +
                                                 " (CommConfig::workspace_bytes / SYMMEM_WORKSPACE_MB)");
  // Four equal areas, each a whole number of 2 MiB (the heap's granularity on Hopper).
  constexpr size_t kUnit = size_t(2) << 20;
  area_bytes_ = budget / 4 / kUnit * kUnit;
  if (area_bytes_ == 0) area_bytes_ = kUnit;
  auto allocate = [&](size_t bytes) { return HeapArea(heap, rank, heap.allocate(bytes, bootstrap, exchange), bytes); };
  // The control area and the user-call area share one heap range (a granule holds both).
  constexpr size_t kControlBytes = kSignalFlagCount * sizeof(uint64_t) + kFusedFlagWords * sizeof(uint32_t);
  const size_t control = heap.allocate(kControlBytes + kUserAreaBytes, bootstrap, exchange);
  control_ = HeapArea(heap, rank, control, kControlBytes);
  user_calls_ = HeapArea(heap, rank, control + kControlBytes, kUserAreaBytes);
  staging_in_ = allocate(area_bytes_);
  staging_out_ = allocate(area_bytes_);
  push_slots_ = allocate(area_bytes_);
  receive_area_ = allocate(area_bytes_);
  // Two parity halves of kMaxWorld sender slots, 8 bytes per 4-byte word.
  low_latency_ = allocate(2 * kMaxWorld * (kLowLatencySlotBytes / 4) * sizeof(uint64_t));
}

LowLatencyLines Workspaces::low_latency_lines() const {
  LowLatencyLines lines{};
  for (int r = 0; r < world_; ++r) lines.peers[r] = static_cast<uint64_t*>(low_latency_.peer_ptr(r));
  lines.slot_words = kLowLatencySlotBytes / 4;
  return lines;
}

uint32_t* Workspaces::fused_flags() const {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(control_.ptr()) + kSignalFlagCount * sizeof(uint64_t));
}

}  // namespace symmem::detail
