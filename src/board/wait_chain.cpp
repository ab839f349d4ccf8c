#include "board/wait_chain.hpp"

#include <algorithm>

namespace symmem::detail {

namespace {
bool waited(const DeviceStatus& s) { return s.code == kStatusTimeout || s.code == kStatusAborted; }
}  // namespace

WaitChain follow_waits(int first, int world, const std::function<DeviceStatus(int)>& record) {
  WaitChain chain;
  std::vector<DeviceStatus> records;
  chain.ranks.push_back(first);
  records.push_back(record(first));
  while (waited(records.back())) {
    const int next = records.back().peer;
    if (next < 0 || next >= world) {
      // A wait that named no one (the copy engine's, released by an abort) waited for some rank
      // of the call, maybe any on the path: the waits may close here.
      if (chain.ranks.size() > 1) chain.cycle_start = 0;
      break;
    }
    const auto seen = std::find(chain.ranks.begin(), chain.ranks.end(), next);
    if (seen != chain.ranks.end()) {
      chain.cycle_start = static_cast<int>(seen - chain.ranks.begin());
      break;
    }
    chain.ranks.push_back(next);
    records.push_back(record(next));
  }
  if (chain.cycle_start < 0) return chain;
  const size_t start = static_cast<size_t>(chain.cycle_start);
  for (size_t i = start + 1; i < records.size(); ++i) {
    if (records[i].signature != records[start].signature) {
      chain.mismatch = true;
      chain.mismatch_rank = chain.ranks[start];
      chain.mismatch_peer = chain.ranks[i];
      break;
    }
  }
  return chain;
}

}  // namespace symmem::detail
