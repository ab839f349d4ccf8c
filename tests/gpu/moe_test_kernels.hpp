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

}  // namespace symmem::test
