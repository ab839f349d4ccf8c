// The gather half of all_gather_matmul, for a consumer of your own (a Triton or CUDA GEMM): the
// peers' shards of a symmetric matrix arrive piece by piece on the copy engines (zero SMs), each
// piece announced by a flag in this rank's memory, while the consumer, enqueued on the caller's
// stream, computes on the rows already there. docs/kernels.md, "Consuming copy-engine pieces".
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "symmem/collectives.hpp"

namespace symmem {

// What the consumer waits on. Shard s holds rows [s * shard_rows, (s + 1) * shard_rows) of the
// gathered matrix; its piece j rows [j * piece_rows, min((j + 1) * piece_rows, shard_rows)) of the
// shard. flags[s * pieces + j] (device memory of this rank) becomes 1 once that piece is in
// `gathered`, for every s but this rank's own: its shard is there before the consumer starts.
// A consumer reads a flag with an acquire at system scope and, before TMA loads of the rows,
// fence.proxy.async.global; it waits with a deadline (symmem::dev::wait_signals) and never
// writes the flags.
struct GatheredPieces {
  const uint32_t* flags;
  int pieces;      // per shard, at most 8
  int piece_rows;  // a multiple of tile_rows (but the last piece of a shard)
  int shard_rows;
  int rank;        // local
  int world;       // local
};

// gathered [m x row_bytes] is a symmetric operand (a heap Buffer and offset, equal on every
// rank), m a multiple of the node's ranks; `shard` is this rank's m / world rows (any device
// memory; when it is this rank's slot of `gathered` it is not copied). Pieces are whole multiples
// of `tile_rows` rows (the consumer's tile height), about 8 MiB each.
//
// Enqueues on `stream`: this rank's shard into its slot, the copies of the peers' shards on side
// streams, then consume(pieces) (which must enqueue its work on `stream`, and nothing that waits
// for another rank but through the flags), then joins the side streams and resets the flags.
// A collective call of `comm` (signed: m, row_bytes, tile_rows and gathered's offset), capturable
// in CUDA graphs; a dead peer is kTimeout naming it (the copy-engine watchdog's handshakes, the
// consumer's bounded waits), never a hang. One node. Exceptions of `consume` propagate after the
// side streams are joined; the communicator is then unusable (its handshakes may be half done).
void all_gather_pieces(Operand gathered, const void* shard, int64_t m, size_t row_bytes, int tile_rows,
                       Communicator& comm, cudaStream_t stream,
                       const std::function<void(const GatheredPieces&)>& consume);

}  // namespace symmem
