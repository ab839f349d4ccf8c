#include "plan/copy_engine_pieces.hpp"

#include <algorithm>

namespace symmem::detail {

std::vector<CopyPiece> plan_copy_engine(int rank, int world, size_t bytes, int streams, size_t piece_bytes) {
  std::vector<CopyPiece> pieces;
  if (world <= 1 || bytes == 0 || streams <= 0) return pieces;
  const int peers = world - 1;
  // Each peer's copy is cut into pieces of at most piece_bytes, and into enough pieces that every
  // stream has work; pieces go out in waves (every peer's first piece, then every second piece),
  // next peer first, handed to the streams round-robin.
  constexpr size_t kSmallestPiece = size_t(64) << 10;
  const size_t by_size = (bytes + piece_bytes - 1) / std::max<size_t>(1, piece_bytes);
  const size_t by_streams = static_cast<size_t>((streams + peers - 1) / peers);
  const size_t most = std::max<size_t>(1, bytes / kSmallestPiece);
  const size_t cuts = std::max<size_t>(1, std::min(std::max(by_size, by_streams), most));
  const size_t piece = (bytes + cuts - 1) / cuts;
  int next_stream = 0;
  for (size_t c = 0; c < cuts; ++c) {
    for (int k = 1; k <= peers; ++k) {
      const int peer = (rank + k) % world;
      const size_t offset = c * piece;
      if (offset >= bytes) continue;
      pieces.push_back({peer, offset, std::min(piece, bytes - offset), next_stream});
      next_stream = (next_stream + 1) % streams;
    }
  }
  return pieces;
}

}  // namespace symmem::detail
