// The C ABI (include/symmem/symmem_c.h): communicators, heap buffers and collectives for
// language bindings. Each entry point is a thin guard around the C++ API.
#include "symmem/symmem_c.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "capi/c_api_guard.hpp"
#include "capi/c_api_comm.hpp"
#include "capi/callback_bootstrap.hpp"
#include "collectives/entry_points.hpp"
#include "comm/refusal.hpp"
#include "common/exit_safe_thread_local.hpp"
#include "plan/algorithms.hpp"
#include "symmem/symmem.hpp"

namespace symmem::detail {

namespace {
struct LastErrorTag;
std::string& last_error() { return exit_safe_thread_local<std::string, LastErrorTag>(); }

// An operand of the collectives: symmetric when it is a whole heap buffer (the same start and size
// on every rank whenever the ranks allocated alike, whatever views they take of it); anything else,
// views into the heap included, is local: a view's offset may depend on the rank (rank r's shard
// starts at the base on rank 0 only), and ranks that disagreed on an operand's kind or offset would
// all fail kMismatch. In-place calls still run in place: the core recognises the input at this
// rank's slot. The call decides the kind with its one lookup (collectives/operands.hpp).
CallOperand operand_at(const void* ptr) { return CallOperand::at_address(ptr); }

// An operand that must be symmetric (all_gather_matmul's gathered_a, matmul_reduce_scatter's workspace): the heap buffer holding
// [ptr, ptr + bytes) at ptr's offset in it. A view whose offset differs by rank is caught on the
// device (the offset is in the call's signature: kMismatch), never used.
Operand symmetric_operand_at(Communicator& comm, const void* ptr, size_t bytes) {
  Buffer* buffer = comm.find(ptr, bytes ? bytes : 1);
  if (!buffer)
    throw Error(ErrorCode::kInvalidArgument, "the operand at " + std::to_string(reinterpret_cast<uintptr_t>(ptr)) +
                                                 " (" + std::to_string(bytes) +
                                                 " bytes) is not inside one heap buffer of this communicator");
  return Operand(buffer, static_cast<size_t>(static_cast<const char*>(ptr) - static_cast<const char*>(buffer->ptr())));
}

DataType dtype_of(int dtype) {
  if (dtype < 0 || dtype > static_cast<int>(DataType::kUInt8))
    throw Error(ErrorCode::kInvalidArgument, "dtype " + std::to_string(dtype) + " is not a symmem::DataType");
  return static_cast<DataType>(dtype);
}

ReduceOp op_of(int op) {
  if (op < 0 || op > static_cast<int>(ReduceOp::kAvg))
    throw Error(ErrorCode::kInvalidArgument, "reduce op " + std::to_string(op) + " is not a symmem::ReduceOp");
  return static_cast<ReduceOp>(op);
}

CollectiveOptions options_of(int algo, int blocks, int max_blocks) {
  if (algo < 0 || std::string(algo_name(static_cast<Algo>(algo))) == "?")
    throw Error(ErrorCode::kInvalidArgument, "algo " + std::to_string(algo) + " is not a symmem::Algo");
  CollectiveOptions o;
  o.algo = static_cast<Algo>(algo);
  o.blocks = blocks;
  o.max_blocks = max_blocks;
  return o;
}

Communicator& comm_of(symmem_comm* comm) {
  if (!comm || !comm->comm) throw Error(ErrorCode::kInvalidArgument, "no communicator (NULL or destroyed)");
  return *comm->comm;
}

cudaStream_t stream_of(void* stream) { return static_cast<cudaStream_t>(stream); }

// The C ABI's own checks of one rank's operands (an operand that must lie in the heap): one that
// fails refuses the call, as the library's checks of a rank's operands do, so that the peers raise
// it too instead of waiting in the call (Communicator::refuse_call). Enum values are checked plainly:
// every rank passes the same ones.
template <typename Checks>
auto checked(Communicator& comm, const char* op, void* stream, Checks&& checks) -> decltype(checks()) {
  try {
    return checks();
  } catch (const Error& e) {
    comm.refuse_call(op, e.code(), e.what(), stream_of(stream));
  }
}

}  // namespace

void set_last_error(const std::string& message) { last_error() = message; }

}  // namespace symmem::detail

using symmem::detail::c_api_guard;
using symmem::detail::checked;
using symmem::detail::comm_of;
using symmem::detail::dtype_of;
using symmem::detail::symmetric_operand_at;
using symmem::detail::op_of;
using symmem::detail::operand_at;
using symmem::detail::options_of;
using symmem::detail::stream_of;

extern "C" {

const char* symmem_version(void) { return "0.1.0"; }
const char* symmem_last_error(void) { return symmem::detail::last_error().c_str(); }
const char* symmem_error_code_name(int code) {
  if (code == 0) return "ok";
  // error_code_id is NULL past the last enumerator: no bound is copied here.
  if (code < 1 || !symmem::error_code_id(static_cast<symmem::ErrorCode>(code - 1))) return "unknown";
  return symmem::error_code_name(static_cast<symmem::ErrorCode>(code - 1));
}

const char* symmem_error_code_id(int code) {  // error_code_id is NULL past the last enumerator
  return code < 1 ? nullptr : symmem::error_code_id(static_cast<symmem::ErrorCode>(code - 1));
}

// The enum's own name functions answer "?" past the last enumerator: no bound is copied here.
const char* symmem_dtype_name(int dtype) {
  const char* name = dtype < 0 ? "?" : symmem::dtype_name(static_cast<symmem::DataType>(dtype));
  return std::strcmp(name, "?") == 0 ? nullptr : name;
}

const char* symmem_reduce_op_name(int op) {
  const char* name = op < 0 ? "?" : symmem::reduce_op_name(static_cast<symmem::ReduceOp>(op));
  return std::strcmp(name, "?") == 0 ? nullptr : name;
}

const char* symmem_collective_name(int collective) {
  using symmem::detail::Collective;
  return collective >= 0 && collective < symmem::detail::kCollectiveCount
             ? symmem::detail::collective_name(static_cast<Collective>(collective))
             : nullptr;
}

int symmem_comm_create(int rank, int world, int device, symmem_all_gather_fn all_gather, symmem_barrier_fn barrier,
                       void* context, int64_t timeout_ms, size_t workspace_bytes, symmem_comm** out) {
  return c_api_guard([&] {
    if (!out || !all_gather || !barrier)
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument, "symmem_comm_create: NULL callback or result");
    if (world < 1 || rank < 0 || rank >= world)
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument, "symmem_comm_create: rank " + std::to_string(rank) +
                                                                   " of world " + std::to_string(world));
    auto bootstrap =
        std::make_shared<symmem::detail::CallbackBootstrap>(rank, world, all_gather, barrier, context);
    symmem::CommConfig config;
    config.timeout_ms = timeout_ms;
    config.workspace_bytes = workspace_bytes;
    auto handle = std::make_unique<symmem_comm>();
    handle->comm = symmem::Communicator::create(bootstrap, device, config);
    *out = handle.release();
  });
}

int symmem_comm_create_from_env(int device, symmem_comm** out) {
  return c_api_guard([&] {
    if (!out) throw symmem::Error(symmem::ErrorCode::kInvalidArgument, "symmem_comm_create_from_env: NULL result");
    auto handle = std::make_unique<symmem_comm>();
    handle->comm = symmem::Communicator::create(symmem::make_store_bootstrap(symmem::JobInfo::from_env()), device);
    *out = handle.release();
  });
}

void symmem_comm_destroy(symmem_comm* comm) {
  symmem::detail::release_pool_slots_of(comm);
  delete comm;  // the Communicator's destructor never throws
}

int symmem_comm_close(symmem_comm* comm) {
  return c_api_guard([&] { comm_of(comm).close(); });
}

int symmem_comm_rank(const symmem_comm* comm) { return comm && comm->comm ? comm->comm->rank() : -1; }
int symmem_comm_world(const symmem_comm* comm) { return comm && comm->comm ? comm->comm->world() : -1; }
int symmem_comm_nodes(const symmem_comm* comm) { return comm && comm->comm ? comm->comm->nodes() : -1; }
int symmem_comm_device(const symmem_comm* comm) { return comm && comm->comm ? comm->comm->device() : -1; }
int symmem_comm_aborted(const symmem_comm* comm) { return comm && comm->comm ? comm->comm->aborted() : 1; }

int symmem_comm_live_graphs(const symmem_comm* comm) {
  return comm && comm->comm ? comm->comm->live_graphs() : 0;
}

int symmem_comm_check(symmem_comm* comm) {
  return c_api_guard([&] { comm_of(comm).check(); });
}

int symmem_comm_barrier(symmem_comm* comm, void* stream) {
  return c_api_guard([&] { comm_of(comm).barrier(stream_of(stream)); });
}

int symmem_comm_allocate(symmem_comm* comm, size_t bytes, void** ptr) {
  return c_api_guard([&] {
    if (!ptr) throw symmem::Error(symmem::ErrorCode::kInvalidArgument, "symmem_comm_allocate: NULL result");
    *ptr = comm_of(comm).allocate(bytes)->ptr();
  });
}

int symmem_comm_buffer_of(symmem_comm* comm, const void* ptr, size_t bytes, void** base, size_t* size) {
  return c_api_guard([&] {
    if (!base || !size) throw symmem::Error(symmem::ErrorCode::kInvalidArgument, "symmem_comm_buffer_of: NULL result");
    symmem::Buffer* buffer = comm_of(comm).find(ptr, bytes ? bytes : 1);
    *base = buffer ? buffer->ptr() : nullptr;
    *size = buffer ? buffer->size() : 0;
  });
}

int symmem_all_gather(symmem_comm* comm, void* out, const void* in, size_t count, int dtype, void* stream, int algo,
                      int blocks, int max_blocks) {
  return c_api_guard([&] {
    symmem::Communicator& c = comm_of(comm);
    const symmem::DataType type = dtype_of(dtype);
    symmem::detail::all_gather_entry(operand_at(out), operand_at(in), count, type, c, stream_of(stream),
                                     options_of(algo, blocks, max_blocks));
  });
}

int symmem_all_gather_matmul(symmem_comm* comm, void* c, void* gathered_a, const void* a_shard, const void* b,
                             int64_t m, int64_t n, int64_t k, int dtype, void* stream, int b_layout) {
  return c_api_guard([&] {
    symmem::Communicator& cm = comm_of(comm);
    const symmem::DataType type = dtype_of(dtype);
    const size_t a_bytes = size_t(std::max<int64_t>(m, 0)) * size_t(std::max<int64_t>(k, 0)) * dtype_size(type);
    const symmem::Operand gathered = checked(cm, "all_gather_matmul", stream,
                                             [&] { return symmetric_operand_at(cm, gathered_a, a_bytes); });
    symmem::all_gather_matmul(c, gathered, a_shard, b, m, n, k, type, cm, stream_of(stream),
                              static_cast<symmem::MatrixLayout>(b_layout));
  });
}

int symmem_matmul_reduce_scatter(symmem_comm* comm, void* c_shard, void* workspace, const void* a, const void* b,
                                 int64_t m, int64_t n, int64_t k, int dtype, void* stream, int b_layout) {
  return c_api_guard([&] {
    symmem::Communicator& cm = comm_of(comm);
    const symmem::DataType type = dtype_of(dtype);
    const symmem::Operand space = checked(cm, "matmul_reduce_scatter", stream, [&] {
      return symmetric_operand_at(cm, workspace, symmem::matmul_reduce_scatter_workspace_bytes(m, n));
    });
    symmem::matmul_reduce_scatter(c_shard, space, a, b, m, n, k, type, cm, stream_of(stream),
                                  static_cast<symmem::MatrixLayout>(b_layout));
  });
}

size_t symmem_matmul_reduce_scatter_workspace_bytes(int64_t m, int64_t n) {
  return symmem::matmul_reduce_scatter_workspace_bytes(m, n);
}

int symmem_all_reduce(symmem_comm* comm, void* out, const void* in, size_t count, int dtype, int op, void* stream,
                      int algo, int blocks, int max_blocks) {
  return c_api_guard([&] {
    symmem::Communicator& c = comm_of(comm);
    const symmem::DataType type = dtype_of(dtype);
    symmem::detail::reduction_entry(symmem::detail::Collective::kAllReduce, operand_at(out), operand_at(in), count,
                                    type, op_of(op), c, stream_of(stream), options_of(algo, blocks, max_blocks));
  });
}

int symmem_reduce_scatter(symmem_comm* comm, void* out, const void* in, size_t count, int dtype, int op,
                          void* stream, int algo, int blocks, int max_blocks) {
  return c_api_guard([&] {
    symmem::Communicator& c = comm_of(comm);
    const symmem::DataType type = dtype_of(dtype);
    symmem::detail::reduction_entry(symmem::detail::Collective::kReduceScatter, operand_at(out), operand_at(in),
                                    count, type, op_of(op), c, stream_of(stream), options_of(algo, blocks, max_blocks));
  });
}

int symmem_describe(symmem_comm* comm, int collective, void* out, const void* in, size_t count, int dtype, int algo,
                    int blocks, int max_blocks, char* text, size_t text_bytes) {
  return c_api_guard([&] {
    symmem::Communicator& c = comm_of(comm);
    const symmem::DataType type = dtype_of(dtype);
    const symmem::CollectiveOptions options = options_of(algo, blocks, max_blocks);
    using symmem::detail::Collective;
    const auto which = static_cast<Collective>(collective);
    if (collective < 0 || collective >= symmem::detail::kCollectiveCount || which == Collective::kAllToAll)
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument,
                          "symmem_describe: collective " + std::to_string(collective) +
                              " is none of all_gather, all_reduce, reduce_scatter (symmem_describe_all_to_all "
                              "describes all_to_all)");
    const std::string plan =
        which == Collective::kAllGather
            ? symmem::detail::describe_all_gather_entry(operand_at(out), operand_at(in), count, type, c, options)
            : symmem::detail::describe_reduction_entry(which, operand_at(out), operand_at(in), count, type, c, options);
    if (text && text_bytes) {
      const size_t n = std::min(plan.size(), text_bytes - 1);
      std::memcpy(text, plan.data(), n);
      text[n] = '\0';
    }
  });
}

int symmem_all_to_all(symmem_comm* comm, void* out, const void* in, size_t bytes_per_pair, void* stream, int algo,
                      int blocks, int max_blocks) {
  return c_api_guard([&] {
    symmem::Communicator& c = comm_of(comm);
    symmem::detail::all_to_all_entry(operand_at(out), operand_at(in), bytes_per_pair, c, stream_of(stream),
                                     options_of(algo, blocks, max_blocks));
  });
}

int symmem_all_to_all_v(symmem_comm* comm, void* out, size_t out_rows, const void* in, size_t in_rows,
                        const int64_t* in_splits, const int64_t* out_splits, size_t row_bytes, void* stream, int algo,
                        int blocks, int max_blocks) {
  return c_api_guard([&] {
    symmem::Communicator& c = comm_of(comm);
    symmem::detail::all_to_all_v_entry(operand_at(out), out_rows, operand_at(in), in_rows, in_splits, out_splits,
                                       row_bytes, c, stream_of(stream), options_of(algo, blocks, max_blocks));
  });
}

int symmem_all_to_all_vdev(symmem_comm* comm, void* out, size_t out_rows, const void* in, size_t in_rows,
                           const int64_t* in_splits, int64_t* out_splits_offsets, size_t row_bytes, int experts,
                           int64_t major_align, void* stream, int algo, int blocks, int max_blocks) {
  return c_api_guard([&] {
    symmem::Communicator& c = comm_of(comm);
    if (major_align == 0 && experts != 1)
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument,
                          "symmem_all_to_all_vdev: major_align 0 (the plain form) takes one expert, got " +
                              std::to_string(experts));
    symmem::detail::all_to_all_vdev_entry(operand_at(out), out_rows, operand_at(in), in_rows, in_splits,
                                          out_splits_offsets, row_bytes, experts, major_align, major_align != 0, c,
                                          stream_of(stream), options_of(algo, blocks, max_blocks));
  });
}

int symmem_describe_all_to_all(symmem_comm* comm, int form, void* out, size_t out_rows, const void* in,
                               size_t in_rows, size_t row_bytes, int experts, int64_t major_align, int algo,
                               int blocks, int max_blocks, char* text, size_t text_bytes) {
  return c_api_guard([&] {
    symmem::Communicator& c = comm_of(comm);
    const symmem::CollectiveOptions options = options_of(algo, blocks, max_blocks);
    std::string plan;
    if (form == 0) {
      plan = symmem::detail::describe_all_to_all_entry(operand_at(out), operand_at(in), out_rows, c, options);
    } else if (form == 1 || form == 2) {
      plan = symmem::detail::describe_all_to_all_v_entry(operand_at(out), out_rows, operand_at(in), in_rows, row_bytes,
                                                         form == 2, experts, major_align, c, options);
    } else {
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument,
                          "symmem_describe_all_to_all: form " + std::to_string(form) + " is not 0, 1 or 2");
    }
    if (text && text_bytes) {
      const size_t n = std::min(plan.size(), text_bytes - 1);
      std::memcpy(text, plan.data(), n);
      text[n] = '\0';
    }
  });
}

int symmem_refuse_call(symmem_comm* comm, const char* op, int error_code, const char* message, void* stream) {
  return c_api_guard([&] {
    symmem::Communicator& c = comm_of(comm);
    const auto code = static_cast<symmem::ErrorCode>(error_code);
    if (error_code < 0 || !symmem::error_code_id(code))
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument,
                          "symmem_refuse_call: " + std::to_string(error_code) + " is not a symmem::ErrorCode");
    c.refuse_call(op ? op : "collective", code, message ? message : "", stream_of(stream));
  });
}

int symmem_refusal_message(const char* op, int rank, int error_code, const char* cause, char* text,
                           size_t text_bytes) {
  return c_api_guard([&] {
    const auto code = static_cast<symmem::ErrorCode>(error_code);
    if (error_code < 0 || !symmem::error_code_id(code))
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument,
                          "symmem_refusal_message: " + std::to_string(error_code) + " is not a symmem::ErrorCode");
    const std::string message =
        symmem::detail::refusal_message(op ? op : "collective", rank, code, cause ? cause : "");
    if (text && text_bytes) {
      const size_t n = std::min(message.size(), text_bytes - 1);
      std::memcpy(text, message.data(), n);
      text[n] = '\0';
    }
  });
}

int symmem_parse_algo(const char* name, int* algo) {
  return c_api_guard([&] {
    symmem::Algo a;
    if (!name || !algo || !symmem::parse_algo(name, &a))
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument,
                          std::string("'") + (name ? name : "(null)") + "' names no algorithm");
    *algo = static_cast<int>(a);
  });
}

}  // extern "C"
