#include "collectives/operands.hpp"

#include <algorithm>
#include <string>

#include "collectives/validate.hpp"
#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "plan/plan.hpp"

namespace symmem::detail {

Resolved resolve(const Operand& operand, size_t bytes, const char* what, const char* op, CommunicatorState& state) {
  Resolved r;
  if (!operand.symmetric()) {
    r.local = operand.ptr();
    require_device_pointer(r.local, bytes, what, op, *state.owner);
    return r;
  }
  Buffer* buffer = operand.buffer();
  bool ours = false;
  for (const auto& b : state.buffers) ours |= b.get() == buffer;
  if (!ours)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": the " + what + " buffer does not belong to this communicator");
  if (operand.offset() > buffer->size() || bytes > buffer->size() - operand.offset())
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": the " + what + " needs " + std::to_string(bytes) +
                                                 " bytes at offset " + std::to_string(operand.offset()) +
                                                 " of a buffer of " + std::to_string(buffer->size()) + " bytes");
  r.symmetric = true;
  r.buffer = buffer;
  r.offset = operand.offset();
  r.local = operand.ptr();
  r.heap_offset = static_cast<uint64_t>(static_cast<char*>(r.local) - state.heap->base(state.rank));
  return r;
}

Resolved shifted(const Resolved& r, size_t delta) {
  Resolved s = r;
  s.local = static_cast<char*>(r.local) + delta;
  if (s.symmetric) {
    s.offset += delta;
    s.heap_offset += delta;
  }
  return s;
}

int address_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int width = 16;
  while (width > 1 && a % width != 0) width /= 2;
  return width;
}

int launch_vector(int planned, std::initializer_list<const void*> local_pointers,
                  std::initializer_list<uint64_t> sizes) {
  int v = std::min(planned, common_vector_bytes(sizes));
  for (const void* p : local_pointers) v = std::min(v, address_alignment(p));
  return v;
}

}  // namespace symmem::detail
