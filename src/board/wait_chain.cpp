#include "board/wait_chain.hpp"

#include <algorithm>

namespace symmem::detail {

namespace {

bool waited(const DeviceStatus& s) {
  // The step between nodes names a remote rank, outside this path: its record is a cause.
  return (s.code == kStatusTimeout || s.code == kStatusAborted) && s.op != kOpBetweenNodes;
}

bool is_cause(const DeviceStatus& s) {
  return s.code == kStatusMismatch || s.code == kStatusCapacity || s.code == kStatusNetwork || s.code == kStatusRefused ||
         (s.op == kOpBetweenNodes && s.code == kStatusTimeout);
}

}  // namespace

WaitChain follow_waits(int first, int world, const std::function<DeviceStatus(int)>& record) {
  WaitChain chain;
  chain.ranks.push_back(first);
  chain.records.push_back(record(first));
  while (waited(chain.records.back())) {
    const int next = chain.records.back().peer;
    if (next < 0 || next >= world) {
      // A wait that named no one waited for some rank of the call, maybe any on the path.
      if (chain.ranks.size() > 1) chain.cycle_start = 0;
      break;
    }
    const auto seen = std::find(chain.ranks.begin(), chain.ranks.end(), next);
    if (seen != chain.ranks.end()) {
      chain.cycle_start = static_cast<int>(seen - chain.ranks.begin());
      break;
    }
    chain.ranks.push_back(next);
    chain.records.push_back(record(next));
  }
  if (chain.cycle_start < 0) return chain;
  const size_t start = static_cast<size_t>(chain.cycle_start);
  for (size_t i = start + 1; i < chain.records.size(); ++i) {
    if (chain.records[i].signature != chain.records[start].signature) {
      chain.mismatch = true;
      chain.mismatch_rank = chain.ranks[start];
      chain.mismatch_peer = chain.ranks[i];
      break;
    }
  }
  return chain;
}

FailureVerdict judge_failure(int who, int world, const std::function<DeviceStatus(int)>& record) {
  // (A record that is no timeout, or one of the step between nodes, is a path of itself alone.)
  const WaitChain chain = follow_waits(who, world, record);
  FailureVerdict v;
  v.who = who;
  v.record = chain.records.front();
  const DeviceStatus& s = v.record;
  if (s.code != kStatusTimeout || s.op == kOpBetweenNodes || s.peer < 0 || s.peer >= world) return v;
  auto record_of = [&](int rank) {
    const size_t i = static_cast<size_t>(std::find(chain.ranks.begin(), chain.ranks.end(), rank) - chain.ranks.begin());
    return chain.records[i];
  };
  if (chain.mismatch) {
    v.who = chain.mismatch_rank;
    v.record = record_of(v.who);
    v.record.code = kStatusMismatch;
    v.record.peer = chain.mismatch_peer;
    v.record.peer_signature = record_of(chain.mismatch_peer).signature;
    return v;
  }
  if (chain.cycle_start >= 0) return v;
  const DeviceStatus& end = chain.records.back();
  if (chain.ranks.size() > 1 && is_cause(end)) {
    v.who = chain.ranks.back();
    v.record = end;
  } else if (chain.ranks.size() > 2 && end.code == kStatusOk) {
    v.waited_through.assign(chain.ranks.begin() + 2, chain.ranks.end());
  }
  return v;
}

}  // namespace symmem::detail
