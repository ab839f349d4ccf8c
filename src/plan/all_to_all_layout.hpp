// Where every row of an all-to-all goes, computed from the split matrix alone. Pure arithmetic,
// host and device: the CPU tests check these functions, and the variable forms' kernel
// (src/kernels/all_to_all_variable.cu) computes the same quantities, with parallel sums, from the
// matrix every rank received, so every rank derives the same offsets, the same capacity verdict
// and the same choice of lines or SM for every pair.
//
// The split matrix. M(s, j) = rows sender s sends to destination j, where j = q * experts + e:
// destination rank q, its local expert e (experts = 1 for the plain all-to-all). A sender's input
// holds its rows in destination order (j ascending), back to back. A receiver's output is
// expert-major: for e = 0, 1, ...: the rows of every sender s = 0, 1, ... for expert e, back to
// back; with alignment a > 0 each expert's extent is its rows rounded up to a multiple of a, and at
// least a (torch.ops.symm_mem.all_to_all_vdev_2d's rule: CUTLASS rejects empty groups). With
// experts = 1 and a = 0 this is the plain all-to-all(v): rank q's output holds sender 0's rows,
// then sender 1's, and so on.
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"

namespace symmem::detail {

// The largest split a header word carries; a larger (or negative) split is sent as
// kInvalidSplit and every rank rejects the call.
constexpr uint32_t kInvalidSplit = 0xFFFFFFFFu;
constexpr uint32_t kLargestSplit = 0x7FFFFFFFu;
// Destinations (rank x local expert) of one all-to-all: the header of each sender, and the pieces
// a rank sends or receives, are at most this many.
constexpr int kMaxAllToAllSplits = 1024;

// A split value as a header word: kInvalidSplit unless 0 <= v <= kLargestSplit.
SYMMEM_HOST_DEVICE inline uint32_t split_word(int64_t v) {
  return v >= 0 && v <= int64_t(kLargestSplit) ? static_cast<uint32_t>(v) : kInvalidSplit;
}
// A capacity in rows as a header word (saturated: a capacity beyond 2^32 - 2 is never binding).
SYMMEM_HOST_DEVICE inline uint32_t capacity_word(uint64_t v) { return v < 0xFFFFFFFFull ? uint32_t(v) : 0xFFFFFFFEu; }

// Header words of a variable call, the low-latency lines every rank sends every rank before any
// rows: its splits, its input rows, its output capacity, and for all_to_all_v (`declared`) the
// rows it expects from each sender. The lines of a pair follow the header in the sender's slot.
SYMMEM_HOST_DEVICE inline int all_to_all_header_words(int world, int experts, bool declared) {
  return world * experts + 2 + (declared ? world : 0);
}
constexpr int kMaxAllToAllHeaderWords = kMaxAllToAllSplits + 2 + kMaxWorld;

// The matrix as every rank holds it: matrix[s * destinations + j], plus each rank's input rows and
// output capacity (in rows).
struct SplitMatrix {
  const uint32_t* splits;
  const uint32_t* input_rows;
  const uint32_t* output_rows;
  int world;
  int experts;    // local experts per rank (1: plain all-to-all)
  int64_t align;  // 0: none (plain); >= 1: each expert's extent rounded up to it, at least it

  SYMMEM_HOST_DEVICE int destinations() const { return world * experts; }
  SYMMEM_HOST_DEVICE uint32_t at(int s, int j) const { return splits[size_t(s) * destinations() + j]; }
};

// Rows expert e of rank q receives from every sender.
SYMMEM_HOST_DEVICE inline uint64_t expert_rows(const SplitMatrix& m, int q, int e) {
  uint64_t rows = 0;
  for (int s = 0; s < m.world; ++s) rows += m.at(s, q * m.experts + e);
  return rows;
}

// Output rows an expert with `rows` rows occupies. An alignment past 2^32 rows counts as 2^32: the
// extent still exceeds every capacity a header carries (capacity_word), and the sums over up to
// kMaxAllToAllSplits experts cannot wrap around to a size that seems to fit.
SYMMEM_HOST_DEVICE inline uint64_t expert_extent(uint64_t rows, int64_t align) {
  if (align <= 0) return rows;
  constexpr uint64_t kBeyondEveryCapacity = uint64_t(1) << 32;
  const uint64_t a = static_cast<uint64_t>(align) < kBeyondEveryCapacity ? static_cast<uint64_t>(align)
                                                                         : kBeyondEveryCapacity;
  const uint64_t up = (rows + a - 1) / a * a;
  return up > a ? up : a;
}

// First output row of rank q's expert e.
SYMMEM_HOST_DEVICE inline uint64_t expert_start(const SplitMatrix& m, int q, int e) {
  uint64_t start = 0;
  for (int e2 = 0; e2 < e; ++e2) start += expert_extent(expert_rows(m, q, e2), m.align);
  return start;
}

// Output rows rank q needs (padding included).
SYMMEM_HOST_DEVICE inline uint64_t needed_output_rows(const SplitMatrix& m, int q) {
  return expert_start(m, q, m.experts);
}

// First row of rank q's output that sender s's rows for q's expert e fill.
SYMMEM_HOST_DEVICE inline uint64_t output_row(const SplitMatrix& m, int q, int e, int s) {
  uint64_t row = expert_start(m, q, e);
  for (int s2 = 0; s2 < s; ++s2) row += m.at(s2, q * m.experts + e);
  return row;
}

// First row of sender s's input that holds its rows for destination j.
SYMMEM_HOST_DEVICE inline uint64_t input_row(const SplitMatrix& m, int s, int j) {
  uint64_t row = 0;
  for (int j2 = 0; j2 < j; ++j2) row += m.at(s, j2);
  return row;
}

// Rows sender s sends in all (kInvalidSplit entries make it invalid: see layout_fault).
SYMMEM_HOST_DEVICE inline uint64_t sent_rows(const SplitMatrix& m, int s) { return input_row(m, s, m.destinations()); }

// Why a call cannot run, identical on every rank (it depends on the matrix alone). Recorded in
// the failure record as kStatusCapacity (src/plan/capacity_failure.hpp says how its fields encode it).
enum LayoutFaultKind : uint32_t {
  kFaultNone = 0,
  kFaultInvalidSplit = 1,    // rank `rank` passed a negative split, or one beyond kLargestSplit
  kFaultInputTooSmall = 2,   // rank `rank` sends `needed` rows, its input holds `capacity`
  kFaultOutputTooSmall = 3,  // rank `rank` would receive `needed` rows, its output holds `capacity`
  kFaultDeclaredSplits = 4,  // rank `rank` expects `capacity` rows from rank `other`, which sends `needed`
  kFaultTokens = 5,          // MoE: rank `rank` passed `needed` tokens, its context holds `capacity`
  kFaultExpertFull = 6,      // MoE: expert `other` of rank `rank` would receive `needed` rows, holds `capacity`
  kFaultExpertId = 7,        // MoE: rank `rank` routed a token to expert `needed`, outside [0, `capacity`)
};

struct LayoutFault {
  uint32_t kind = kFaultNone;
  int rank = -1;
  int other = -1;
  uint64_t needed = 0;
  uint64_t capacity = 0;
};

// The first fault of the call in a fixed order (senders, then receivers, each in rank order), or
// kind kFaultNone. `declared` (may be null): every receiver's expected rows per sender,
// declared[q * world + s] (all_to_all_v's host output splits), checked against the matrix.
SYMMEM_HOST_DEVICE inline LayoutFault layout_fault(const SplitMatrix& m, const uint32_t* declared) {
  LayoutFault f;
  for (int s = 0; s < m.world; ++s) {
    for (int j = 0; j < m.destinations(); ++j) {
      if (m.at(s, j) == kInvalidSplit) {
        f.kind = kFaultInvalidSplit;
        f.rank = s;
        f.other = j;
        return f;
      }
    }
    const uint64_t sent = sent_rows(m, s);
    if (sent > m.input_rows[s]) {
      f.kind = kFaultInputTooSmall;
      f.rank = s;
      f.needed = sent;
      f.capacity = m.input_rows[s];
      return f;
    }
  }
  for (int q = 0; q < m.world; ++q) {
    if (declared) {
      for (int s = 0; s < m.world; ++s) {
        if (m.experts == 1 && declared[q * m.world + s] != m.at(s, q)) {
          f.kind = kFaultDeclaredSplits;
          f.rank = q;
          f.other = s;
          f.needed = m.at(s, q);
          f.capacity = declared[q * m.world + s];
          return f;
        }
      }
    }
    const uint64_t needed = needed_output_rows(m, q);
    if (needed > m.output_rows[q]) {
      f.kind = kFaultOutputTooSmall;
      f.rank = q;
      f.needed = needed;
      f.capacity = m.output_rows[q];
      return f;
    }
  }
  return f;
}

// One contiguous run of rows between this rank and a peer, in bytes.
struct AllToAllPiece {
  int32_t peer;
  uint32_t destination;  // j = q * experts + e of the run
  uint64_t src_byte;     // in the sender's input
  uint64_t dst_byte;     // in the receiver's output
  uint64_t bytes;
};

// Piece k of what rank `me` sends (k = j, the destination): from its input to rank q's output.
SYMMEM_HOST_DEVICE inline AllToAllPiece send_piece(const SplitMatrix& m, int me, int j, uint64_t row_bytes) {
  const int q = j / m.experts, e = j % m.experts;
  return {q, uint32_t(j), input_row(m, me, j) * row_bytes, output_row(m, q, e, me) * row_bytes,
          uint64_t(m.at(me, j)) * row_bytes};
}

// Piece k of what rank `me` receives (k = e * world + s, expert-major as its output): from sender
// s's input into its own output.
SYMMEM_HOST_DEVICE inline AllToAllPiece receive_piece(const SplitMatrix& m, int me, int k, uint64_t row_bytes) {
  const int e = k / m.world, s = k % m.world;
  const int j = me * m.experts + e;
  return {s, uint32_t(j), input_row(m, s, j) * row_bytes, output_row(m, me, e, s) * row_bytes,
          uint64_t(m.at(s, j)) * row_bytes};
}

// Piece i of what rank `me` moves by SM, in the order its kernel lays them end to end (the balanced
// cut, all_to_all_cut.hpp): the next rank's first (rank + 1, + 2, ..., itself last), so that the
// same-index blocks of the ranks address different peers. Push moves the send pieces (returns j),
// pull the receive pieces, expert by expert (returns k = e * world + s).
SYMMEM_HOST_DEVICE inline int send_piece_in_turn(const SplitMatrix& m, int me, int i) {
  return ((me + 1) * m.experts + i) % m.destinations();
}
SYMMEM_HOST_DEVICE inline int receive_piece_in_turn(const SplitMatrix& m, int me, int i) {
  const int e = i / m.world, s = (me + 1 + i % m.world) % m.world;
  return e * m.world + s;
}

// Whether a sender's header (its `n` split words and its input rows) is one it can send from: no
// invalid split, and its splits add up to at most its input. A sender judges this from its own
// words before the exchange; every receiver judges the same from the header it received.
SYMMEM_HOST_DEVICE inline bool sender_fits_row(const uint32_t* splits, int n, uint32_t input_rows) {
  uint64_t rows = 0;
  for (int j = 0; j < n; ++j) {
    if (splits[j] == kInvalidSplit) return false;
    rows += splits[j];
  }
  return rows <= input_rows;
}
SYMMEM_HOST_DEVICE inline bool sender_fits(const SplitMatrix& m, int s) {
  return sender_fits_row(m.splits + size_t(s) * m.destinations(), m.destinations(), m.input_rows[s]);
}

// Whether a pair's rows travel as low-latency lines instead of by SM (one expert per rank only: a
// 2-D pair lands in several places): another rank, some rows, at most `threshold` bytes, from a
// sender that fits. Decided per pair, from what the sender knows alone, so that the sender stores
// its lines together with its header: small pairs cost one crossing, however large the others.
SYMMEM_HOST_DEVICE inline bool pair_by_lines(uint32_t rows, uint64_t row_bytes, uint64_t threshold, bool fits,
                                             bool self) {
  return !self && fits && rows > 0 && rows != kInvalidSplit && uint64_t(rows) * row_bytes <= threshold;
}
SYMMEM_HOST_DEVICE inline bool pair_by_lines(const SplitMatrix& m, int s, int q, uint64_t row_bytes,
                                             uint64_t threshold) {
  return m.experts == 1 && pair_by_lines(m.at(s, q), row_bytes, threshold, sender_fits(m, s), s == q);
}

// Whether any rows cross between ranks by SM (push or pull) in a call that fits: only then do the
// ranks pass the barrier at the kernel's end (lines and a rank's copy to itself need none).
SYMMEM_HOST_DEVICE inline bool moves_by_sm_between_ranks(const SplitMatrix& m, uint64_t row_bytes, uint64_t threshold) {
  for (int s = 0; s < m.world; ++s)
    for (int j = 0; j < m.destinations(); ++j) {
      const int q = j / m.experts;
      if (q != s && m.at(s, j) > 0 && !pair_by_lines(m, s, q, row_bytes, threshold)) return true;
    }
  return false;
}

// torch's out_splits_offsets for rank `me`: row 0 (index k = e * world + s) the rows from sender
// s for expert e, row 1 their first output row. Returns element k of row `row`.
SYMMEM_HOST_DEVICE inline int64_t out_splits_offsets(const SplitMatrix& m, int me, int row, int k) {
  const int e = k / m.world, s = k % m.world;
  return row == 0 ? int64_t(m.at(s, me * m.experts + e)) : int64_t(output_row(m, me, e, s));
}

}  // namespace symmem::detail
