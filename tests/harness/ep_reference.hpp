// The host reference of MoE dispatch (include/symmem/ep.hpp), straight from the definition: where
// every (token, k) pair or (token, rank) row lands, the received counts and the verdict. Shared by
// the CPU tests (against the tiled slot formula of plan/ep_layout.hpp) and the GPU tests (against
// what the kernels did). Host only.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/all_to_all_layout.hpp"
#include "plan/ep_layout.hpp"

namespace symmem::test {

// One rank's routing: `tokens` tokens, ids [T][K] (entries of tokens >= `tokens` ignored).
struct EpRouting {
  int tokens = 0;
  std::vector<int64_t> ids;
};

struct EpPlace {
  int rank = -1;     // receiving rank, -1: not sent
  int64_t row = -1;  // row in its receive area (kExpertMajor: e_local * rows_per_expert + slot)
};

struct EpSource {  // what a received row holds
  int rank;
  int token;
  int k;  // kExpertMajor: the top-k entry; kRankMajor: -1
};

struct EpExpected {
  detail::LayoutFault fault;  // kind kFaultNone when the call fits
  // Per sender: kExpertMajor [t * K + k]; kRankMajor [t * world + q].
  std::vector<std::vector<EpPlace>> route;
  // Per receiver, in row order: kExpertMajor [e_local] rows; kRankMajor one list.
  std::vector<std::vector<std::vector<EpSource>>> rows;
  std::vector<std::vector<int32_t>> expert_num_tokens;  // [q][e_local]
  std::vector<int32_t> num_rows;                        // [q]
};

inline EpExpected ep_expected(const detail::EpGeometry& g, const std::vector<EpRouting>& routing) {
  using detail::LayoutFault;
  const int W = g.world, K = g.topk, L = g.local_experts;
  EpExpected x;
  // Senders first, in rank order: token counts, then ids out of range.
  for (int s = 0; s < W && x.fault.kind == detail::kFaultNone; ++s) {
    if (routing[s].tokens > g.max_tokens) {
      x.fault = {detail::kFaultTokens, s, -1, uint64_t(routing[s].tokens), uint64_t(g.max_tokens)};
      break;
    }
    for (int t = 0; t < routing[s].tokens && x.fault.kind == detail::kFaultNone; ++t)
      for (int k = 0; k < K; ++k) {
        const int64_t e = routing[s].ids[size_t(t) * K + k];
        if (e >= g.experts) {
          // The first the count kernel meets is not defined across warps: report the rank only.
          x.fault = {detail::kFaultExpertId, s, -1, uint64_t(e), uint64_t(g.experts)};
          break;
        }
      }
  }
  x.route.resize(W);
  x.rows.assign(W, std::vector<std::vector<EpSource>>(g.expert_major ? L : 1));
  x.expert_num_tokens.assign(W, std::vector<int32_t>(L, 0));
  x.num_rows.assign(W, 0);
  for (int s = 0; s < W; ++s) x.route[s].assign(size_t(g.max_tokens) * (g.expert_major ? K : W), EpPlace{});
  if (x.fault.kind != detail::kFaultNone) return x;
  for (int q = 0; q < W; ++q) {
    for (int s = 0; s < W; ++s) {
      for (int t = 0; t < routing[s].tokens; ++t) {
        bool goes = false;
        for (int k = 0; k < K; ++k) {
          const int64_t e = routing[s].ids[size_t(t) * K + k];
          if (!detail::ep_routed(e, g.experts) || e / L != q) continue;
          goes = true;
          x.expert_num_tokens[q][e % L] += 1;
          if (g.expert_major) {
            auto& list = x.rows[q][e % L];
            x.route[s][size_t(t) * K + k] = {q, int64_t(e % L) * g.rows_per_expert + int64_t(list.size())};
            list.push_back({s, t, k});
          }
        }
        if (!g.expert_major && goes) {
          auto& list = x.rows[q][0];
          x.route[s][size_t(t) * W + q] = {q, int64_t(list.size())};
          list.push_back({s, t, -1});
        }
      }
    }
    for (const auto& list : x.rows[q]) x.num_rows[q] += int32_t(list.size());
  }
  // Receivers: the first expert (or rank) whose rows do not fit.
  if (g.expert_major) {
    for (int e = 0; e < g.experts; ++e) {
      const size_t n = x.rows[e / L][e % L].size();
      if (n > size_t(g.rows_per_expert)) {
        x.fault = {detail::kFaultExpertFull, e / L, e, n, uint64_t(g.rows_per_expert)};
        return x;
      }
    }
  } else {
    for (int q = 0; q < W; ++q)
      if (x.rows[q][0].size() > size_t(g.rows)) {
        x.fault = {detail::kFaultOutputTooSmall, q, -1, x.rows[q][0].size(), uint64_t(g.rows)};
        return x;
      }
  }
  return x;
}

}  // namespace symmem::test
