#include "collectives/operands.hpp"

#include <algorithm>
#include <string>

#include "collectives/validate.hpp"
#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "plan/plan.hpp"

namespace symmem::detail {

namespace {

Resolved symmetric_operand(Buffer* buffer, size_t offset, CommunicatorState& state) {
  Resolved r;
  r.symmetric = true;
  r.buffer = buffer;
  r.offset = offset;
  r.local = static_cast<char*>(buffer->ptr()) + offset;
  r.heap_offset = static_cast<uint64_t>(static_cast<char*>(r.local) - state.heap->base(state.rank));
  return r;
}

// The C ABI's rule: symmetric when [ptr, ptr + bytes) is exactly a heap buffer; local otherwise (a
// view into the heap is device memory already: no query).
Resolved resolve_address(void* ptr, size_t bytes, const char* what, const char* op, CommunicatorState& state) {
  Buffer* holder = state.owner->find(ptr, bytes ? bytes : 1);
  if (holder && holder->ptr() == ptr && holder->size() == bytes) return symmetric_operand(holder, 0, state);
  if (!holder) require_device_memory(ptr, bytes, what, op, *state.owner);
  Resolved r;
  r.local = ptr;
  return r;
}

}  // namespace

Resolved resolve(const CallOperand& call_operand, size_t bytes, const char* what, const char* op,
                 CommunicatorState& state) {
  if (call_operand.by_address()) return resolve_address(call_operand.ptr(), bytes, what, op, state);
  const Operand& operand = call_operand.operand();
  if (!operand.symmetric()) {
    Resolved r;
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
  return symmetric_operand(buffer, operand.offset(), state);
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
