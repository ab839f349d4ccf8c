// Test data and device checks for the all-to-all and MoE tests: every byte of every rank's input
// is a keyed hash of (seed, rank, row, byte), so any rank can compute what any other rank sent
// without having its data (exact host references), and a device check can too (graph replays
// checked without a host synchronisation). Routing for replays comes from a counter on the
// device, so a captured graph changes its splits every replay.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"

namespace symmem::test {

SYMMEM_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Byte `byte` of input row `row` of rank `rank` (rows of the all-to-all, or a token's payload).
SYMMEM_HOST_DEVICE inline uint8_t row_byte(uint64_t seed, int rank, uint64_t row, uint64_t byte) {
  const uint64_t h = mix64(seed ^ mix64(uint64_t(rank) << 48 ^ row) ^ ((byte >> 3) * 0xD6E8FEB86659FD93ull));
  return static_cast<uint8_t>(h >> ((byte & 7) * 8));
}

// The split of sender s to destination j in replay `replay` of a routed graph: 0 to max_entry rows,
// a quarter of them empty, and every few replays one destination takes everything (a hot expert).
SYMMEM_HOST_DEVICE inline uint32_t routed_split(uint64_t seed, uint64_t replay, int s, int j, int destinations,
                                                uint32_t max_entry) {
  const uint64_t h = mix64(seed ^ mix64(replay * 131 + uint64_t(s) * 7919 + uint64_t(j)));
  if (replay % 5 == 4) return j == int(mix64(seed ^ replay) % uint64_t(destinations)) ? max_entry : 0;
  return (h & 3) == 0 ? 0 : static_cast<uint32_t>((h >> 8) % (max_entry + 1));
}

// in[row * row_bytes + b] = row_byte(seed, rank, row, b) for rows < rows (on `stream`).
void fill_rows(void* in, uint64_t rows, uint64_t row_bytes, uint64_t seed, int rank, cudaStream_t stream);

struct RoutedCall {
  uint64_t seed;
  int rank, world, experts;
  int64_t align;  // 0: the plain all_to_all_vdev
  uint64_t row_bytes;
  uint32_t max_entry;
  const uint64_t* replay;  // device counter: the replay number
};
// This rank's splits of the current replay into in_splits (world * experts int64) and its input
// rows (seed mixed with the replay) into `in`.
void fill_routed_input(const RoutedCall& call, int64_t* in_splits, void* in, cudaStream_t stream);
// *wrong += every output byte and out_splits_offsets entry of this rank that differs from what the
// current replay's routing sends it (the layout of plan/all_to_all_layout.hpp); rows past the
// needed ones must still hold `poison`.
void check_routed_output(const RoutedCall& call, const void* out, uint64_t out_rows, const int64_t* out_splits_offsets,
                         uint8_t poison, unsigned long long* wrong, cudaStream_t stream);
// ++*replay (one thread).
void advance_replay(uint64_t* replay, cudaStream_t stream);

// MoE routing that changes every replay of a captured graph (a device counter), with fake experts
// whose outputs a device check can predict bit for bit: the expert computation on a received row x
// for local expert e is bf16(x * (1 + e)) per column (kRankMajor: the row's local experts summed in
// float32 in top-k order with their weights, rounded once), and combine's result for a token is what
// include/symmem/ep.hpp promises (float32 in top-k / rank order, rounded once).
struct MoeRoutedCall {
  uint64_t seed;
  int rank, world, experts, topk, hidden, max_tokens;
  bool expert_major;
  const uint64_t* replay;
  bool combine_reduced;  // expert-major reduced on the experts' side: the rank-major order of sums
};
// This replay's routing of this rank: *num_tokens in [0, T], distinct ids per token (some -1),
// weights in (0, 1), x rows of small multiples of 1/8 (bf16), all on the device.
void fill_moe_routed_input(const MoeRoutedCall& call, int64_t* ids, float* weights, int32_t* num_tokens, void* x,
                           cudaStream_t stream);
// What the received rows' experts output, into combine_input (rows as the receive area).
struct MoeReceivedView {
  const void* x;
  const int32_t* topk_idx;
  const float* topk_weights;
  const int32_t* expert_num_tokens;
  const int32_t* num_rows;
  long long rows;  // per local expert (kExpertMajor) or in all
};
void run_fake_experts(const MoeRoutedCall& call, const MoeReceivedView& received, void* combine_input,
                      cudaStream_t stream);
// *wrong += output elements of this rank's tokens that differ from the predicted combine, plus
// rows past *num_tokens that are not `poison` (bf16 bits).
void check_moe_combine(const MoeRoutedCall& call, const void* out, const int64_t* ids, const float* weights,
                       const int32_t* num_tokens, const void* x, uint16_t poison, unsigned long long* wrong,
                       cudaStream_t stream);

}  // namespace symmem::test
