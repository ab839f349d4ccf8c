// all_to_all, all_to_all_v, all_to_all_vdev(_2d): validate -> plan (from values equal on every
// rank) -> sign -> stage what peers must read -> launch the plan's kernel (the variable forms'
// kernel exchanges the splits first; the uniform form's copy engine is the copy-engine
// all-gather's, a slice per peer). kernels/all_to_all_args.hpp describes the kernels.
#include <algorithm>
#include <cstdio>
#include <string>

#include "board/call_signature.hpp"
#include "collectives/all_gather_paths.hpp"
#include "collectives/entry_points.hpp"
#include "collectives/operands.hpp"
#include "collectives/validate.hpp"
#include "comm/communicator_state.hpp"
#include "comm/refusal.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/hash.hpp"
#include "kernels/all_to_all_args.hpp"
#include "plan/all_to_all_plan.hpp"
#include "plan/plan.hpp"
#include "symmem/all_to_all.hpp"

namespace symmem {
namespace {

using detail::AllToAllForm;
using detail::AllToAllPlan;
using detail::CallOperand;
using detail::CommunicatorState;
using detail::Resolved;

// One call, resolved and planned: everything the launch needs and the signature covers.
struct Prepared {
  AllToAllForm form = AllToAllForm::kUniform;
  const char* name = "all_to_all";
  size_t pair_bytes = 0;  // uniform
  size_t row_bytes = 1;   // variable forms
  size_t in_rows = 0, out_rows = 0;
  int experts = 1;
  int64_t align = 0;
  size_t in_bytes = 0, out_bytes = 0;
  bool in_place = false;
  Resolved in, out;
  AllToAllPlan plan;
};

// The 2-D form is the one with an alignment (>= 1).
const char* name_of(AllToAllForm form, int64_t align) {
  switch (form) {
    case AllToAllForm::kUniform: return "all_to_all";
    case AllToAllForm::kHostSplits: return "all_to_all_v";
    case AllToAllForm::kDeviceSplits: return align > 0 ? "all_to_all_vdev_2d" : "all_to_all_vdev";
  }
  return "all_to_all";
}

void resolve_operands(Prepared& p, const CallOperand& out, const CallOperand& in, CommunicatorState& st) {
  p.out = detail::resolve(out, p.out_bytes, "output", p.name, st);
  p.in_place = in.ptr() == out.ptr() && in.ptr() != nullptr;
  p.in = detail::resolve(in, p.in_bytes, "input", p.name, st);
  detail::require_no_partial_overlap(p.out.local, p.out_bytes, p.in.local, p.in_bytes, p.in_place, p.name);
}

// The plan, from values equal on every rank; then whether this rank's input fits the staging area
// it needs (its own affair: refused at `site`).
void plan(Prepared& p, CommunicatorState& st, const CollectiveOptions& options, const detail::RefusalSite* site) {
  detail::AllToAllRequest r;
  r.form = p.form;
  r.pair_bytes = p.pair_bytes;
  r.row_bytes = p.row_bytes;
  r.experts = p.experts;
  detail::fill_agreed_request(r, st, options, p.in, p.out);
  r.in_place = p.in_place;
  r.low_latency_capacity = detail::Workspaces::kLowLatencySlotBytes;
  p.plan = detail::plan_all_to_all(r, *st.tuning);
  // The variable forms cannot cut a staged input into chunks (the rows are counted on the device).
  detail::own_arguments(site, [&] {
    if (p.form != AllToAllForm::kUniform && p.plan.stage_input && p.in_bytes > st.workspaces->staging_capacity())
      throw Error(
          ErrorCode::kInvalidArgument,
          std::string(p.name) + ": the input (" + std::to_string(p.in_rows) + " rows, " +
              std::to_string(p.in_bytes) + " bytes) must be staged" +
              (p.in_place ? " (in place)" : " (it is not in the heap and the algorithm reads it from the peers)") +
              " but the staging workspace holds " + std::to_string(st.workspaces->staging_capacity()) +
              " bytes (CommConfig::workspace_bytes / SYMMEM_WORKSPACE_MB); pass a heap buffer (symmem.torch.empty) "
              "or raise the budget");
  });
}

// `site`: where this rank's own checks (its operands, its staged input) refuse the call (null: a
// describe_* query).
Prepared prepare_uniform(const CallOperand& out, const CallOperand& in, size_t bytes_per_pair, CommunicatorState& st,
                         const CollectiveOptions& options, const detail::RefusalSite* site) {
  Prepared p;
  p.pair_bytes = bytes_per_pair;
  p.in_bytes = p.out_bytes = bytes_per_pair * static_cast<size_t>(st.world);
  detail::own_arguments(site, [&] { resolve_operands(p, out, in, st); });
  plan(p, st, options, site);
  return p;
}

// `align`: 0 for the plain forms; the 2-D form's major_align (>= 1) otherwise.
Prepared prepare_variable(AllToAllForm form, const CallOperand& out, size_t out_rows, const CallOperand& in,
                          size_t in_rows, size_t row_bytes, int experts, int64_t align, CommunicatorState& st,
                          const CollectiveOptions& options, const detail::RefusalSite* site) {
  Prepared p;
  p.form = form;
  p.experts = experts;
  p.name = name_of(form, align);
  if (row_bytes == 0) throw Error(ErrorCode::kInvalidArgument, std::string(p.name) + ": row_bytes is 0");
  if (experts < 1 || size_t(experts) * st.world > size_t(detail::kMaxAllToAllSplits))
    throw Error(ErrorCode::kInvalidArgument, std::string(p.name) + ": " + std::to_string(experts) +
                                                 " experts per rank over " + std::to_string(st.world) +
                                                 " ranks; world x experts may not exceed " +
                                                 std::to_string(detail::kMaxAllToAllSplits));
  if (align < 0) throw Error(ErrorCode::kInvalidArgument, std::string(p.name) + ": major_align must be positive");
  p.align = align;
  p.row_bytes = row_bytes;
  p.in_rows = in_rows;
  p.out_rows = out_rows;
  p.in_bytes = in_rows * row_bytes;
  p.out_bytes = out_rows * row_bytes;
  detail::own_arguments(site, [&] { resolve_operands(p, out, in, st); });
  plan(p, st, options, site);
  return p;
}

// "all_to_all_vdev(row_bytes=48, push, blocks=8, in=symmetric@..., out=...)": how mismatch and
// capacity messages name the call.
std::string describe_call(const Prepared& p) {
  auto operand = [](const Resolved& r) {
    return r.symmetric ? "symmetric@" + std::to_string(r.heap_offset) : std::string("local");
  };
  std::string s = std::string(p.name) + "(";
  if (p.form == AllToAllForm::kUniform)
    s += "bytes_per_pair=" + std::to_string(p.pair_bytes);
  else
    s += "row_bytes=" + std::to_string(p.row_bytes) +
         (p.align > 0 ? ", experts=" + std::to_string(p.experts) + ", major_align=" + std::to_string(p.align) : "");
  s += std::string(", ") + algo_name(p.plan.algo) + ", blocks=" + std::to_string(p.plan.blocks);
  s += p.in_place ? ", in place" : ", in=" + operand(p.in);
  return s + ", out=" + operand(p.out) + ")";
}

// What every rank must agree on, for the signature: form, widths, plan, operand kinds and
// symmetric offsets. Row counts and capacities are not in it: they differ by rank by design and
// travel in the split exchange.
// Whether a local input is in place or staged concerns its rank alone (peers read a local input
// only from its staging area, under every algorithm that reads peers' inputs): signed for heap
// inputs only, so that a rank with no rows passing null operands agrees with peers that pass
// buffers, in place or not.
detail::CallDescriptor descriptor_of(const Prepared& p) {
  const bool uniform = p.form == AllToAllForm::kUniform;
  const bool signed_in_place = p.in_place && p.in.symmetric;
  detail::CallDescriptor c = detail::make_call_descriptor(
      detail::kOpAllToAll, DataType::kUInt8, ReduceOp::kSum, uniform ? p.pair_bytes : p.row_bytes, p.plan.algo,
      p.plan.blocks, signed_in_place, p.in.symmetric, p.in_place ? 0 : p.in.heap_offset, p.out.symmetric,
      p.out.heap_offset);
  detail::Fnv1a h;
  h.value(p.form).value(p.experts).value(p.align).value(p.plan.kernel).value(p.plan.low_latency_pair_bytes);
  h.value(p.in.symmetric && p.plan.stage_input).value(p.plan.chunk_pair_bytes);
  c.shape_hash = h.digest() | 1u;
  c.description = [&p] { return describe_call(p); };
  return c;
}

// Signs and logs the call inside its EnqueueScope; the device is current.
uint32_t sign(const Prepared& p, CommunicatorState& st) {
  const uint32_t signature = st.sign_call(descriptor_of(p));
  if (st.debug)
    std::fprintf(stderr, "symmem rank %d: %s: %s\n", st.layout.rank, p.name, detail::describe(p.plan).c_str());
  return signature;
}

// One chunk of a uniform call: rank r's slice for q lies at in + q * in_stride (staged: the
// staging area), lands at out + r * out_stride; `bytes` per pair.
struct UniformChunk {
  const char* in;
  const void* in_peers[kMaxWorld];
  char* out;
  void* out_peers[kMaxWorld];
  size_t in_stride, out_stride, bytes;
};

void run_uniform_chunk(const Prepared& p, CommunicatorState& st, uint32_t signature, const UniformChunk& c,
                       cudaStream_t stream) {
  const int world = st.world;
  if (p.plan.kernel == detail::KernelId::kAllToAllCopyEngine) {
    // The copy-engine all-gather's handshakes and copies, pulling every peer's slice for this rank.
    detail::CopyEngineCall call{};
    call.out = c.out;
    call.slot_stride = c.out_stride;
    call.in = c.in;
    call.in_slice_stride = c.in_stride;
    call.bytes = c.bytes;
    for (int r = 0; r < world; ++r) call.in_peers[r] = c.in_peers[r];
    call.copy_own = true;
    call.signature = signature;
    detail::all_gather_copy_engine(st, call, stream);
    return;
  }
  detail::AllToAllMoveArgs a{};
  a.in = c.in;
  a.out = c.out;
  for (int r = 0; r < world; ++r) {
    a.in_peers[r] = c.in_peers[r];
    a.out_peers[r] = c.out_peers[r];
  }
  a.pair_bytes = c.bytes;
  a.in_stride = c.in_stride;
  a.out_stride = c.out_stride;
  a.lines = st.workspaces->low_latency_lines();
  a.sync = st.sync_args(detail::kOpAllToAll, signature);
  // Push touches its own input directly, pull its own output; strides and sizes bound the width.
  switch (p.plan.kernel) {
    case detail::KernelId::kAllToAllLowLatency: detail::launch_all_to_all_low_latency(a, p.plan.blocks, stream); break;
    case detail::KernelId::kAllToAllPush:
      detail::launch_all_to_all_push(
          detail::launch_vector(p.plan.vector_bytes, {c.in}, {c.bytes, c.in_stride, c.out_stride}), a, p.plan.blocks,
          stream);
      break;
    case detail::KernelId::kAllToAllPull:
      detail::launch_all_to_all_pull(
          detail::launch_vector(p.plan.vector_bytes, {c.out}, {c.bytes, c.in_stride, c.out_stride}), a, p.plan.blocks,
          stream);
      break;
    default:
      SYMMEM_THROW(ErrorCode::kInternal,
                   std::string("all_to_all: no launch for kernel ") + detail::kernel_name(p.plan.kernel));
  }
}

}  // namespace

std::string detail::describe_all_to_all_entry(const CallOperand& out, const CallOperand& in, size_t bytes_per_pair,
                                              Communicator& comm, const CollectiveOptions& options) {
  CommunicatorState& st = detail::state_of(comm);
  detail::DeviceGuard guard(st.device);
  return detail::describe(prepare_uniform(out, in, bytes_per_pair, st, options, nullptr).plan);
}

std::string detail::describe_all_to_all_v_entry(const CallOperand& out, size_t out_rows, const CallOperand& in,
                                                size_t in_rows, size_t row_bytes, bool device_splits, int experts,
                                                int64_t major_align, Communicator& comm,
                                                const CollectiveOptions& options) {
  CommunicatorState& st = detail::state_of(comm);
  detail::DeviceGuard guard(st.device);
  const AllToAllForm form = device_splits ? AllToAllForm::kDeviceSplits : AllToAllForm::kHostSplits;
  if (!device_splits && (experts != 1 || major_align != 0))
    throw Error(ErrorCode::kInvalidArgument, "describe_all_to_all_v: host splits have one expert and no alignment");
  return detail::describe(
      prepare_variable(form, out, out_rows, in, in_rows, row_bytes, experts, major_align, st, options, nullptr).plan);
}

void detail::all_to_all_entry(const CallOperand& out, const CallOperand& in, size_t bytes_per_pair,
                              Communicator& comm, cudaStream_t stream, const CollectiveOptions& options) {
  CommunicatorState& st = detail::state_of(comm);
  st.ensure_usable("all_to_all");
  st.require_one_node("all_to_all");
  if (bytes_per_pair == 0) return;
  detail::DeviceGuard guard(st.device);
  const detail::RefusalSite site{st, detail::kOpAllToAll, "all_to_all", stream};
  const Prepared p = prepare_uniform(out, in, bytes_per_pair, st, options, &site);
  detail::EnqueueScope enqueue(st, stream);
  const uint32_t signature = sign(p, st);
  const int world = st.world;
  const detail::HeapArea* staging = st.workspaces->staging_in();
  const size_t chunk = p.plan.chunk_pair_bytes ? p.plan.chunk_pair_bytes : bytes_per_pair;
  for (size_t begin = 0; begin < bytes_per_pair; begin += chunk) {
    const size_t bytes = std::min(chunk, bytes_per_pair - begin);
    UniformChunk c{};
    c.bytes = bytes;
    c.out = static_cast<char*>(p.out.local) + begin;
    c.out_stride = bytes_per_pair;
    for (int r = 0; r < world; ++r) c.out_peers[r] = p.out.symmetric ? p.out.peer(r, begin) : nullptr;
    if (p.plan.stage_input) {
      // This chunk of every slice, packed: slice q at q * bytes.
      SYMMEM_CUDA_CHECK(cudaMemcpy2DAsync(staging->ptr(), bytes, static_cast<const char*>(p.in.local) + begin,
                                          bytes_per_pair, bytes, world, cudaMemcpyDeviceToDevice, stream));
      c.in = static_cast<const char*>(staging->ptr());
      c.in_stride = bytes;
      for (int r = 0; r < world; ++r) c.in_peers[r] = staging->peer_ptr(r);
    } else {
      c.in = static_cast<const char*>(p.in.local) + begin;
      c.in_stride = bytes_per_pair;
      for (int r = 0; r < world; ++r) c.in_peers[r] = p.in.symmetric ? p.in.peer(r, begin) : nullptr;
    }
    run_uniform_chunk(p, st, signature, c, stream);
  }
}

namespace {

// The plan's kernel: the split exchange, then the rows (none when the exchange finds that the call
// does not fit; small pairs as low-latency lines, the others by SM).
void run_variable(const Prepared& p, CommunicatorState& st, const int64_t* device_in_splits,
                  const int64_t* host_in_splits, const int64_t* host_out_splits, int64_t* out_splits_offsets,
                  cudaStream_t stream) {
  const int world = st.world;
  detail::EnqueueScope enqueue(st, stream);
  const uint32_t signature = sign(p, st);
  const detail::HeapArea* staging = st.workspaces->staging_in();
  const char* in = static_cast<const char*>(p.in.local);
  if (p.plan.stage_input && p.in_bytes > 0) {
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(staging->ptr(), in, p.in_bytes, cudaMemcpyDeviceToDevice, stream));
    in = static_cast<const char*>(staging->ptr());
  }
  detail::AllToAllVariableArgs a{};
  a.in_splits = device_in_splits;
  if (host_in_splits)
    for (int r = 0; r < world; ++r) a.host_in_splits[r] = host_in_splits[r];
  a.declared = host_out_splits != nullptr;
  if (host_out_splits)
    for (int r = 0; r < world; ++r) a.host_out_splits[r] = host_out_splits[r];
  a.experts = p.experts;
  a.align = p.align;
  a.input_rows = p.in_rows;
  a.output_rows = p.out_rows;
  a.row_bytes = p.row_bytes;
  a.low_latency_pair_bytes = p.plan.low_latency_pair_bytes;
  a.out_splits_offsets = out_splits_offsets;
  a.in = in;
  a.out = p.out.local;
  for (int r = 0; r < world; ++r) {
    a.in_peers[r] = p.plan.stage_input ? staging->peer_ptr(r) : p.in.symmetric ? p.in.peer(r) : nullptr;
    a.out_peers[r] = p.out.symmetric ? p.out.peer(r) : nullptr;
  }
  a.lines = st.workspaces->low_latency_lines();
  a.sync = st.sync_args(detail::kOpAllToAll, signature);
  switch (p.plan.kernel) {
    case detail::KernelId::kAllToAllPush:
      detail::launch_all_to_all_variable_push(detail::launch_vector(p.plan.vector_bytes, {in}, {}), a, p.plan.blocks,
                                              stream);
      break;
    case detail::KernelId::kAllToAllPull:
      detail::launch_all_to_all_variable_pull(detail::launch_vector(p.plan.vector_bytes, {p.out.local}, {}), a,
                                              p.plan.blocks, stream);
      break;
    default:
      SYMMEM_THROW(ErrorCode::kInternal,
                   std::string(p.name) + ": no launch for kernel " + detail::kernel_name(p.plan.kernel));
  }
}

void require_splits(const void* splits, const char* what, const char* op) {
  if (!splits) throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + what + " is null");
}

}  // namespace

void detail::all_to_all_v_entry(const CallOperand& out, size_t out_rows, const CallOperand& in, size_t in_rows,
                                const int64_t* in_splits, const int64_t* out_splits, size_t row_bytes,
                                Communicator& comm, cudaStream_t stream, const CollectiveOptions& options) {
  CommunicatorState& st = detail::state_of(comm);
  const char* op = "all_to_all_v";
  st.ensure_usable(op);
  st.require_one_node(op);
  detail::DeviceGuard guard(st.device);
  const detail::RefusalSite site{st, detail::kOpAllToAll, op, stream};
  detail::own_arguments(&site, [&] {
    require_splits(in_splits, "in_splits", op);
    require_splits(out_splits, "out_splits", op);
  });
  const Prepared p =
      prepare_variable(AllToAllForm::kHostSplits, out, out_rows, in, in_rows, row_bytes, 1, 0, st, options, &site);
  run_variable(p, st, nullptr, in_splits, out_splits, nullptr, stream);
}

void detail::all_to_all_vdev_entry(const CallOperand& out, size_t out_rows, const CallOperand& in, size_t in_rows,
                                   const int64_t* in_splits, int64_t* out_splits_offsets, size_t row_bytes,
                                   int experts, int64_t major_align, bool two_d, Communicator& comm,
                                   cudaStream_t stream, const CollectiveOptions& options) {
  CommunicatorState& st = detail::state_of(comm);
  const char* op = two_d ? "all_to_all_vdev_2d" : "all_to_all_vdev";
  st.ensure_usable(op);
  st.require_one_node(op);
  detail::DeviceGuard guard(st.device);
  if (two_d && major_align < 1)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": major_align must be positive (torch's default is 1), got " +
                    std::to_string(major_align));
  const detail::RefusalSite site{st, detail::kOpAllToAll, op, stream};
  detail::own_arguments(&site, [&] {
    require_splits(in_splits, "in_splits", op);
    require_splits(out_splits_offsets, "out_splits_offsets", op);
    const size_t splits = size_t(std::max(experts, 1)) * st.world;
    detail::require_device_pointer(in_splits, splits * sizeof(int64_t), "in_splits", op, comm);
    detail::require_device_pointer(out_splits_offsets, 2 * splits * sizeof(int64_t), "out_splits_offsets", op, comm);
  });
  const Prepared p = prepare_variable(AllToAllForm::kDeviceSplits, out, out_rows, in, in_rows, row_bytes, experts,
                                      major_align, st, options, &site);
  run_variable(p, st, in_splits, nullptr, nullptr, out_splits_offsets, stream);
}

void all_to_all(Operand out, Operand in, size_t bytes_per_pair, Communicator& comm, cudaStream_t stream,
                const CollectiveOptions& options) {
  detail::all_to_all_entry(out, in, bytes_per_pair, comm, stream, options);
}

void all_to_all_v(Operand out, size_t out_rows, Operand in, size_t in_rows, const int64_t* in_splits,
                  const int64_t* out_splits, size_t row_bytes, Communicator& comm, cudaStream_t stream,
                  const CollectiveOptions& options) {
  detail::all_to_all_v_entry(out, out_rows, in, in_rows, in_splits, out_splits, row_bytes, comm, stream, options);
}

void all_to_all_vdev(Operand out, size_t out_rows, Operand in, size_t in_rows, const int64_t* in_splits,
                     int64_t* out_splits_offsets, size_t row_bytes, Communicator& comm, cudaStream_t stream,
                     const CollectiveOptions& options) {
  detail::all_to_all_vdev_entry(out, out_rows, in, in_rows, in_splits, out_splits_offsets, row_bytes, 1, 0, false,
                                comm, stream, options);
}

void all_to_all_vdev_2d(Operand out, size_t out_rows, Operand in, size_t in_rows, const int64_t* in_splits,
                        int64_t* out_splits_offsets, size_t row_bytes, int experts, int64_t major_align,
                        Communicator& comm, cudaStream_t stream, const CollectiveOptions& options) {
  detail::all_to_all_vdev_entry(out, out_rows, in, in_rows, in_splits, out_splits_offsets, row_bytes, experts,
                                major_align, true, comm, stream, options);
}

std::string describe_all_to_all(Operand out, Operand in, size_t bytes_per_pair, Communicator& comm,
                                const CollectiveOptions& options) {
  return detail::describe_all_to_all_entry(out, in, bytes_per_pair, comm, options);
}

std::string describe_all_to_all_v(Operand out, size_t out_rows, Operand in, size_t in_rows, size_t row_bytes,
                                  bool device_splits, int experts, int64_t major_align, Communicator& comm,
                                  const CollectiveOptions& options) {
  return detail::describe_all_to_all_v_entry(out, out_rows, in, in_rows, row_bytes, device_splits, experts,
                                             major_align, comm, options);
}

}  // namespace symmem
