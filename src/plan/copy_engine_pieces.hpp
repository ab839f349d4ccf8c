// How the copy-engine all-gather cuts its copies into pieces and spreads them over its streams.
// Pure C++ (CPU-tested).
#pragma once

#include <cstddef>
#include <vector>

namespace symmem::detail {

// Copy-engine all-gather: the peer copies of one call, spread over `streams` streams. Pieces
// cover every peer's bytes exactly once, are at most piece_bytes (but not under 64 KiB), and
// are numerous enough that each stream gets a share.
struct CopyPiece {
  int peer;
  size_t offset;  // within the peer's bytes
  size_t bytes;
  int stream;
};
std::vector<CopyPiece> plan_copy_engine(int rank, int world, size_t bytes_per_rank, int streams, size_t piece_bytes);

}  // namespace symmem::detail
