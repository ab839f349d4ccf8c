// The balanced cut of the all-to-all's SM traffic. Pure arithmetic, host and device: the CPU tests
// check it (tests/unit/test_all_to_all_cut.cpp), the variable forms' kernel runs it
// (src/kernels/all_to_all_variable.cu).
//
// A rank's pieces (what it moves by SM, one contiguous run of vectors each, in the kernel's
// rotated order) are laid end to end; prefix[i] counts the vectors before piece i, prefix[n] the
// total S. Block b of B moves the vectors [cut_begin(S, B, b), cut_begin(S, B, b + 1)) of that
// concatenation, crossing piece boundaries as it goes. Every vector is moved by exactly one block,
// and spans differ by at most one vector, whatever the split matrix: one pair carrying most of the
// bytes is shared by as many blocks as its bytes need, and an empty piece costs nothing.
#pragma once

#include <cstdint>

#include "device/device_types.hpp"

namespace symmem::detail {

// First vector of part `part` of `parts` over `total` vectors: the first total % parts parts hold
// one vector more than the others.
SYMMEM_HOST_DEVICE inline uint64_t cut_begin(uint64_t total, int parts, int part) {
  const uint64_t base = total / uint64_t(parts), extra = total % uint64_t(parts);
  const uint64_t p = uint64_t(part);
  return base * p + (p < extra ? p : extra);
}

// The piece that holds vector v < prefix[n]: the last i < n with prefix[i] <= v (an empty piece,
// prefix[i] == prefix[i + 1], never holds one).
SYMMEM_HOST_DEVICE inline int piece_holding(const uint64_t* prefix, int n, uint64_t v) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (prefix[mid] <= v)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Calls segment(i, first, count) for every nonempty run of vectors [first, first + count) of piece
// i (offsets within the piece) that lies in [begin, end) of the concatenation, in order.
template <typename Segment>
SYMMEM_HOST_DEVICE inline void for_each_segment(const uint64_t* prefix, int n, uint64_t begin, uint64_t end,
                                                Segment&& segment) {
  if (begin >= end) return;
  for (int i = piece_holding(prefix, n, begin); i < n && begin < end; ++i) {
    const uint64_t stop = prefix[i + 1] < end ? prefix[i + 1] : end;
    if (stop > begin) {
      segment(i, begin - prefix[i], stop - begin);
      begin = stop;
    }
  }
}

}  // namespace symmem::detail
