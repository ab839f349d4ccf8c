// Operands at the API boundary: their kind decided once, validated, resolved to this rank's
// address, and (for symmetric ones) to the offset that is the same on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "device/device_types.hpp"
#include "symmem/collectives.hpp"

namespace symmem::detail {

struct CommunicatorState;

struct Resolved {
  bool symmetric = false;
  Buffer* buffer = nullptr;  // symmetric only
  size_t offset = 0;         // symmetric: byte offset inside buffer (equal on every rank)
  uint64_t heap_offset = 0;  // symmetric: offset from the heap base (equal on every rank); local: 0
  void* local = nullptr;     // this rank's address

  // Rank r's copy of the operand's byte `at`, as mapped here (symmetric only).
  void* peer(int r, size_t at = 0) const { return static_cast<char*>(buffer->peer_ptr(r)) + offset + at; }
};

// An operand as a collective call received it, whose kind the API it came through decides: a C++
// Operand says it by its type; the C ABI passes an address, symmetric when it is a whole heap
// buffer of the communicator (include/symmem/symmem_c.h: a view's offset may depend on the rank),
// which resolve() decides with the one lookup of the heap's buffers the operand costs.
class CallOperand {
 public:
  CallOperand(const Operand& operand) : operand_(operand) {}  // NOLINT: the C++ API's operands convert
  static CallOperand at_address(const void* ptr) {
    CallOperand c{Operand(ptr)};
    c.by_address_ = true;
    return c;
  }
  const Operand& operand() const { return operand_; }
  bool by_address() const { return by_address_; }
  void* ptr() const { return operand_.ptr(); }  // this rank's address

 private:
  Operand operand_;
  bool by_address_ = false;
};

// Checks the operand covers `bytes` (symmetric: inside its buffer of this communicator; local:
// device memory of the communicator's GPU) and resolves it. `what` is "input" or "output".
Resolved resolve(const CallOperand& operand, size_t bytes, const char* what, const char* op, CommunicatorState& state);

// The same operand viewed `delta` bytes further on (in place: the rank's slot of the output).
Resolved shifted(const Resolved& r, size_t delta);

// Largest power of two <= 16 dividing the address (the widest vector a kernel may use on it).
int address_alignment(const void* p);

// The widest vector this rank may use: the plan's (agreed), narrowed by the local pointers the
// kernel touches directly and by this chunk's sizes. Ranks may differ here; the protocol (grid,
// barriers) does not.
int launch_vector(int planned, std::initializer_list<const void*> local_pointers,
                  std::initializer_list<uint64_t> sizes);

// The fields every planning request shares, from values equal on every rank: the world, the
// agreed settings, the options, the operand kinds, the symmetric operands' heap offsets and the
// workspaces' capacities.
template <typename Request, typename State>
void fill_agreed_request(Request& r, const State& st, const CollectiveOptions& options, const Resolved& in,
                         const Resolved& out) {
  r.world = st.world;
  r.sm_count = st.sm_count;
  r.options = options;
  r.forced = st.settings.forced_algo;
  r.forced_blocks = st.settings.forced_blocks;
  r.in_symmetric = in.symmetric;
  r.out_symmetric = out.symmetric;
  r.in_address = in.heap_offset;
  r.out_address = out.heap_offset;
  r.workspace = st.workspaces->limits();
}

}  // namespace symmem::detail
