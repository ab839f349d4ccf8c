#include "board/call_signature.hpp"

#include "common/hash.hpp"
#include "device/device_types.hpp"

namespace symmem::detail {

CallDescriptor make_call_descriptor(uint32_t op, DataType type, ReduceOp reduce, size_t count, Algo algo, int blocks,
                                    bool in_place, bool in_symmetric, uint64_t in_heap_offset, bool out_symmetric,
                                    uint64_t out_heap_offset) {
  CallDescriptor c;
  c.op = op;
  c.type = type;
  c.reduce = reduce;
  c.count = count;
  c.algo = algo;
  c.blocks = blocks;
  c.in_place = in_place;
  c.in_symmetric = in_symmetric;
  c.out_symmetric = out_symmetric;
  c.in_heap_offset = in_heap_offset;
  c.out_heap_offset = out_heap_offset;
  return c;
}

CallDescriptor make_user_call_descriptor(const std::string& description, int blocks) {
  CallDescriptor c;
  c.op = kOpUser;
  c.blocks = blocks;
  c.text = description;
  return c;
}

CallDescriptor make_gather_pieces_descriptor(int64_t m, size_t row_bytes, int tile_rows, uint64_t heap_offset) {
  CallDescriptor c = make_call_descriptor(kOpAllGatherPieces, DataType::kUInt8, ReduceOp::kSum, size_t(m) * row_bytes,
                                          Algo::kCopyEngine, 0, false, false, 0, true, heap_offset);
  c.n = tile_rows;
  c.k = static_cast<int64_t>(row_bytes);
  return c;
}

uint32_t signature_of(const CallDescriptor& c) {
  Fnv1a h;
  h.value(c.op).value(c.type).value(c.count).value(c.algo).value(c.blocks);
  h.value(c.in_place).value(c.in_symmetric).value(c.out_symmetric).value(c.in_heap_offset).value(c.out_heap_offset);
  if (c.op == kOpAllReduce || c.op == kOpReduceScatter) h.value(c.reduce);
  if (c.op == kOpAllGatherMatmul || c.op == kOpMatmulReduceScatter || c.op == kOpAllGatherPieces)
    h.value(c.n).value(c.k);
  if (c.shape_hash != 0) h.value(c.shape_hash);
  h.text(c.text);  // empty but for user kernels
  const uint64_t d = h.digest();
  const uint32_t folded = static_cast<uint32_t>(d ^ (d >> 32));
  return folded != 0 ? folded : 1u;
}

std::string describe_call(const CallDescriptor& c) {
  if (c.description) return c.description();
  auto operand = [](bool symmetric, uint64_t offset) {
    return symmetric ? "symmetric@" + std::to_string(offset) : std::string("local");
  };
  if (c.op == kOpUser) return c.text + " blocks=" + std::to_string(c.blocks);
  if (c.op == kOpAllGatherPieces)
    return std::string(op_code_name(c.op)) + "(rows=" + std::to_string(c.k ? c.count / size_t(c.k) : 0) +
           ", row_bytes=" + std::to_string(c.k) + ", tile_rows=" + std::to_string(c.n) +
           ", gathered=symmetric@" + std::to_string(c.out_heap_offset) + ")";
  std::string s = std::string(op_code_name(c.op)) + "(count=" + std::to_string(c.count) + ", " + dtype_name(c.type);
  if (c.op == kOpAllGatherMatmul || c.op == kOpMatmulReduceScatter)
    s += ", n=" + std::to_string(c.n) + ", k=" + std::to_string(c.k);
  if (c.op == kOpAllReduce || c.op == kOpReduceScatter) s += std::string(", ") + reduce_op_name(c.reduce);
  s += std::string(", ") + algo_name(c.algo) + ", blocks=" + std::to_string(c.blocks);
  if (c.in_place)
    s += ", in place, out=" + operand(c.out_symmetric, c.out_heap_offset);
  else
    s += ", in=" + operand(c.in_symmetric, c.in_heap_offset) + ", out=" + operand(c.out_symmetric, c.out_heap_offset);
  return s + ")";
}

}  // namespace symmem::detail
