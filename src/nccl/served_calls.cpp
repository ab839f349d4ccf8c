#include "nccl/served_calls.hpp"

#include "symmem/all_to_all.hpp"
#include "symmem/collectives.hpp"

namespace symmem::nccl {
namespace {

// The operand at p: symmetric inside a mapped window, else local.
Operand operand_at(const void* p, size_t bytes, BufferKind kind, const Windows& windows) {
  if (kind == BufferKind::kWindow) {
    if (const Window* w = windows.find(p, bytes))
      return Operand(w->buffer, static_cast<size_t>(static_cast<const char*>(p) - w->begin));
  }
  return Operand(p);
}

}  // namespace

void run_served_call(Communicator& comm, const NcclCall& call, const void* send, void* recv, cudaStream_t stream,
                     const Windows& windows) {
  const SymmemCall form = *symmem_form(call);
  const Operand in = operand_at(send, send_bytes(call), call.buffers, windows);
  const Operand out = operand_at(recv, recv_bytes(call), call.buffers, windows);
  switch (call.op) {
    case Collective::kAllReduce: all_reduce(out, in, form.count, form.type, form.op, comm, stream); break;
    case Collective::kAllGather: all_gather(out, in, form.count, form.type, comm, stream); break;
    case Collective::kReduceScatter: reduce_scatter(out, in, form.count, form.type, form.op, comm, stream); break;
    case Collective::kAlltoAll: all_to_all(out, in, form.count * dtype_size(form.type), comm, stream); break;
    default: throw Error(ErrorCode::kInternal, std::string("the NCCL shim routed ") + collective_name(call.op) +
                                                   " to symmem, which does not implement it");
  }
}

}  // namespace symmem::nccl
