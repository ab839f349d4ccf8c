// A call's signature: a 32-bit hash of everything every rank must agree on for a collective to be
// correct (op, count, type, reduce op, the planned algorithm and blocks, operand kinds, symmetric
// offsets, in place). It travels in every flag the ranks exchange (barrier flags, low-latency
// lines, copy-engine handshake words), so a rank whose peer called something else sees a foreign
// signature where it expected its own and fails on the device, on every rank, at no extra round
// trip. The description is logged in the host board under the signature so that the error names
// both calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "symmem/types.hpp"

namespace symmem::detail {

struct CallDescriptor {
  uint32_t op = 0;  // OpCode
  DataType type = DataType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;  // reductions only
  size_t count = 0;
  Algo algo = Algo::kAuto;  // as planned
  int blocks = 0;           // as planned
  bool in_place = false;
  bool in_symmetric = false;
  bool out_symmetric = false;
  uint64_t in_heap_offset = 0;   // symmetric and out of place only
  uint64_t out_heap_offset = 0;  // symmetric only
  // Matmuls: the GEMM's n and k (count holds m * k, the elements of the gathered A).
  int64_t n = 0, k = 0;
  // Calls whose agreement goes beyond the fields above (the all-to-all's forms, MoE's contexts): a
  // hash of the rest, which the signature covers (0: nothing more), and the call's own
  // description, which describe_call returns instead of composing one (called only when the call
  // is logged, not at every call).
  uint64_t shape_hash = 0;
  std::function<std::string()> description;
  // A user kernel (kOpUser): what the ranks must agree on, as its launcher wrote it (its name,
  // shapes, dtypes; include/symmem/user_call.hpp). Signed and logged with `blocks`, nothing else.
  std::string text;
};

// The descriptor of a planned call. Pass 0 as the offset of the operand that in place derives
// from the other (it differs by rank: rank * bytes).
CallDescriptor make_call_descriptor(uint32_t op, DataType type, ReduceOp reduce, size_t count, Algo algo, int blocks,
                                    bool in_place, bool in_symmetric, uint64_t in_heap_offset, bool out_symmetric,
                                    uint64_t out_heap_offset);

// A user kernel launched with `blocks` blocks (include/symmem/user_call.hpp).
CallDescriptor make_user_call_descriptor(const std::string& description, int blocks);
// all_gather_pieces (include/symmem/all_gather_pieces.hpp): m rows of row_bytes gathered into the
// symmetric operand at `heap_offset`, in pieces of whole tile_rows.
CallDescriptor make_gather_pieces_descriptor(int64_t m, size_t row_bytes, int tile_rows, uint64_t heap_offset);

// Nonzero (0 marks an empty flag).
uint32_t signature_of(const CallDescriptor& call);
// e.g. "all_gather(count=100000, float16, pull, blocks=16, in=local, out=symmetric@4096)"
std::string describe_call(const CallDescriptor& call);

}  // namespace symmem::detail
