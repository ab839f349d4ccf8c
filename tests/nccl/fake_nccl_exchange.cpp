// The stand-in NCCL's data path (SYMMEM_FAKE_NCCL_MOVE_DATA=1): ranks that share one GPU, in one
// process or several, move their collectives' data through files of the meeting folder, so that a
// program's NCCL calls give right answers with the real NCCL absent (it refuses two ranks on one
// GPU). It is a reference, not a transport: each call waits for its stream, copies its part to the
// host, writes it as a file named by the communicator, the call's number and the rank, and reads
// the parts it needs; reductions are computed in float64 (integers exactly) in rank order and
// rounded once. Calls inside CUDA graph capture are refused (nothing here can be replayed). A
// pre-multiplied sum applies the reducing rank's scalar to every part: ranks must pass the same
// (PyTorch's do).
#include "fake_nccl.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

namespace fake_nccl {
namespace {

using Bytes = std::vector<unsigned char>;

size_t element_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

double load_float(ncclDataType_t type, const unsigned char* at) {
  switch (type) {
    case ncclFloat16: { __half v; std::memcpy(&v, at, 2); return __half2float(v); }
    case ncclBfloat16: { __nv_bfloat16 v; std::memcpy(&v, at, 2); return __bfloat162float(v); }
    case ncclFloat32: { float v; std::memcpy(&v, at, 4); return v; }
    case ncclFloat64: { double v; std::memcpy(&v, at, 8); return v; }
    case ncclFloat8e4m3: return __half2float(__half(__nv_cvt_fp8_to_halfraw(*at, __NV_E4M3)));
    case ncclFloat8e5m2: return __half2float(__half(__nv_cvt_fp8_to_halfraw(*at, __NV_E5M2)));
    default: return 0;
  }
}

void store_float(ncclDataType_t type, double value, unsigned char* at) {
  switch (type) {
    case ncclFloat16: { const __half v = __double2half(value); std::memcpy(at, &v, 2); break; }
    case ncclBfloat16: { const __nv_bfloat16 v = __double2bfloat16(value); std::memcpy(at, &v, 2); break; }
    case ncclFloat32: { const float v = static_cast<float>(value); std::memcpy(at, &v, 4); break; }
    case ncclFloat64: std::memcpy(at, &value, 8); break;
    case ncclFloat8e4m3: *at = __nv_cvt_double_to_fp8(value, __NV_SATFINITE, __NV_E4M3); break;
    case ncclFloat8e5m2: *at = __nv_cvt_double_to_fp8(value, __NV_SATFINITE, __NV_E5M2); break;
    default: break;
  }
}

// Integers as NCCL reduces them: in their own width, sums and products wrapping (computed unsigned:
// signed overflow is undefined in C++), an average divided after the sum, a pre-multiplied sum's
// scalar of the same type.
template <typename T>
void reduce_integers(const std::vector<const unsigned char*>& parts, size_t count, ncclRedOp_t op,
                     const unsigned char* scalar, unsigned char* out) {
  using U = std::make_unsigned_t<T>;
  T scale{};
  if (scalar) std::memcpy(&scale, scalar, sizeof(T));
  for (size_t i = 0; i < count; ++i) {
    T acc{};
    for (size_t r = 0; r < parts.size(); ++r) {
      T v;
      std::memcpy(&v, parts[r] + i * sizeof(T), sizeof(T));
      if (scalar) v = static_cast<T>(static_cast<U>(static_cast<U>(v) * static_cast<U>(scale)));
      if (r == 0) acc = v;
      else if (op == ncclProd) acc = static_cast<T>(static_cast<U>(static_cast<U>(acc) * static_cast<U>(v)));
      else if (op == ncclMax) acc = v > acc ? v : acc;
      else if (op == ncclMin) acc = v < acc ? v : acc;
      else acc = static_cast<T>(static_cast<U>(static_cast<U>(acc) + static_cast<U>(v)));
    }
    if (op == ncclAvg) {
      if constexpr (std::is_signed_v<T>) acc = static_cast<T>(static_cast<int64_t>(acc) / static_cast<int64_t>(parts.size()));
      else acc = static_cast<T>(static_cast<uint64_t>(acc) / static_cast<uint64_t>(parts.size()));
    }
    std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

// `scalar`: a pre-multiplied sum's scalar (bytes of `type`), or null.
void reduce(const std::vector<const unsigned char*>& parts, size_t count, ncclDataType_t type, ncclRedOp_t op,
            const unsigned char* scalar, unsigned char* out) {
  switch (type) {
    case ncclInt8: return reduce_integers<int8_t>(parts, count, op, scalar, out);
    case ncclUint8: return reduce_integers<uint8_t>(parts, count, op, scalar, out);
    case ncclInt32: return reduce_integers<int32_t>(parts, count, op, scalar, out);
    case ncclUint32: return reduce_integers<uint32_t>(parts, count, op, scalar, out);
    case ncclInt64: return reduce_integers<int64_t>(parts, count, op, scalar, out);
    case ncclUint64: return reduce_integers<uint64_t>(parts, count, op, scalar, out);
    default: break;
  }
  const size_t es = element_size(type);
  const double scale = scalar ? load_float(type, scalar) : 1;
  for (size_t i = 0; i < count; ++i) {
    double acc = 0;
    for (size_t r = 0; r < parts.size(); ++r) {
      double v = load_float(type, parts[r] + i * es);
      if (scalar) v *= scale;
      if (r == 0) acc = v;
      else if (op == ncclProd) acc *= v;
      else if (op == ncclMax) acc = std::fmax(acc, v);  // NaN only where every rank holds NaN, as NCCL's
      else if (op == ncclMin) acc = std::fmin(acc, v);  // fmaxf / __hmax
      else acc += v;
    }
    if (op == ncclAvg) acc /= static_cast<double>(parts.size());
    store_float(type, acc, out + i * es);
  }
}

ncclResult_t fail(ncclResult_t code, const std::string& why) {
  last_error() = "fake NCCL: " + why;
  return code;
}

// A call that failed on one rank leaves its peers' call numbers apart from its own: every later
// call on that communicator fails too, naming the first failure (as NCCL's async error stays).
ncclResult_t fail_comm(ncclComm_t comm, ncclResult_t code, const std::string& why) {
  if (comm->failure.empty()) {
    comm->failure = why;
    comm->failure_code.store(code);
  }
  return fail(code, why);
}

bool cuda_ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  last_error() = std::string("fake NCCL: ") + what + ": " + (name ? name : "CUDA error");
  return false;
}

bool to_host(const void* device, size_t bytes, Bytes* host, cudaStream_t stream) {
  host->resize(bytes);
  if (bytes == 0) return true;
  const auto s = reinterpret_cast<CUstream>(stream);
  return cuda_ok(cuMemcpyDtoHAsync(host->data(), reinterpret_cast<CUdeviceptr>(device), bytes, s), "copy to host") &&
         cuda_ok(cuStreamSynchronize(s), "stream synchronize");
}

bool to_device(const Bytes& host, void* device, cudaStream_t stream) {
  if (host.empty()) return true;
  const auto s = reinterpret_cast<CUstream>(stream);
  return cuda_ok(cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(device), host.data(), host.size(), s),
                 "copy to device") &&
         cuda_ok(cuStreamSynchronize(s), "stream synchronize");
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// What a part's file says of its call, checked by every reader: ranks that made different calls
// (kind, type, op, root, count, world, or call number) fail instead of reading garbage.
struct Header {
  int32_t kind, type, op, root, nranks, pad = 0;  // (no byte of the file left unwritten)
  uint64_t count;
  int64_t number;
  bool operator==(const Header& o) const {
    return kind == o.kind && type == o.type && op == o.op && root == o.root && nranks == o.nranks &&
           count == o.count && number == o.number;
  }
};
static_assert(sizeof(Header) == 40, "a part's header is read back as written");
std::string describe(const Header& h) {
  if (h.kind == -1)
    return "message " + std::to_string(h.number) + " between the pair (type " + std::to_string(h.type) + ", count " +
           std::to_string(h.count) + ")";
  return "call " + std::to_string(h.number) + " (kind " + std::to_string(h.kind) + ", type " + std::to_string(h.type) +
         ", op " + std::to_string(h.op) + ", root " + std::to_string(h.root) + ", count " + std::to_string(h.count) +
         ", " + std::to_string(h.nranks) + " ranks)";
}
// The header of `c` as call `number` (a send's and a receive's alike: kind and op left out).
Header header_of(const Call& c, long number) {
  const bool p2p = c.kind == Call::kSend || c.kind == Call::kRecv;
  const bool reduces = c.kind == Call::kAllReduce || c.kind == Call::kReduceScatter || c.kind == Call::kReduce;
  return {p2p ? -1 : static_cast<int32_t>(c.kind), static_cast<int32_t>(c.type),
          reduces ? static_cast<int32_t>(c.op >= ncclNumOps ? ncclNumOps : c.op) : -1, p2p ? -1 : c.root,
          c.comm->nranks, 0, c.count, number};
}

bool write_file(const std::string& path, const Header* header, const unsigned char* data, size_t bytes) {
  return write_whole_file(path, header, header ? sizeof(Header) : 0, data, bytes);
}

bool wait_for(const std::string& path) {
  return wait_for_file(path, std::chrono::steady_clock::now() + meeting_timeout());
}

// `bytes` of the data of `path` from `offset`, after checking that its header is `expected`; false
// (with the reason in last_error) when it is not, or when the file is shorter.
bool read_file(const std::string& path, const Header& expected, size_t offset, size_t bytes, unsigned char* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    last_error() = "fake NCCL: cannot open " + path;
    return false;
  }
  Header theirs{};
  bool read = std::fread(&theirs, sizeof(Header), 1, f) == 1;
  if (read && !(theirs == expected)) {
    last_error() = "fake NCCL: ranks made different calls: a peer's " + describe(theirs) + ", this rank's " +
                   describe(expected);
    read = false;
  } else if (!read) {
    last_error() = "fake NCCL: " + path + " has no header";
  } else {
    read = std::fseek(f, static_cast<long>(sizeof(Header) + offset), SEEK_SET) == 0 &&
           (bytes == 0 || std::fread(out, 1, bytes, f) == bytes);
    if (!read) last_error() = "fake NCCL: " + path + " is shorter than the call (" + describe(expected) + ")";
  }
  std::fclose(f);
  return read;
}

// Removes this rank's files that every reader has marked read.
void sweep(ncclComm_t comm) {
  auto& unread = comm->unread;
  for (auto it = unread.begin(); it != unread.end();) {
    bool all = true;
    for (const auto& mark : it->second) all = all && exists(mark);
    if (!all) { ++it; continue; }
    for (const auto& mark : it->second) ::unlink(mark.c_str());
    ::unlink(it->first.c_str());
    it = unread.erase(it);
  }
}

std::string part_file(ncclComm_t comm, long call, int rank) {
  return meeting_path(comm->id, "c" + std::to_string(call) + "-r" + std::to_string(rank));
}
std::string mark_of(const std::string& file, int reader) { return file + ".read-" + std::to_string(reader); }

// A call between its two phases: its number on the communicator (or per peer), this rank's part.
struct Pending {
  const Call* call;
  long number = 0;
  Bytes mine;
};

// Whether this rank's data goes into the result (of a rooted call: the root's, or everyone's), and
// whether it writes it for its peers (everyone's but a reducing or gathering root's).
bool contributes(const Call& c) {
  return (c.kind != Call::kBroadcast && c.kind != Call::kScatter) || c.comm->rank == c.root;
}
bool writes_part(const Call& c) {
  return contributes(c) && !((c.kind == Call::kReduce || c.kind == Call::kGather) && c.comm->rank == c.root);
}
std::vector<int> readers(const Call& c) {
  std::vector<int> who;
  const bool rooted_in = c.kind == Call::kReduce || c.kind == Call::kGather;
  for (int r = 0; r < c.comm->nranks; ++r)
    if (r != c.comm->rank && (!rooted_in || r == c.root)) who.push_back(r);
  return who;
}

// Elements a rank contributes, and elements it receives.
size_t part_elements(const Call& c) {
  const size_t world = static_cast<size_t>(c.comm->nranks);
  switch (c.kind) {
    case Call::kReduceScatter: case Call::kAlltoAll: case Call::kScatter: return c.count * world;
    default: return c.count;
  }
}

// Whether `c` is being captured into a CUDA graph (the legacy stream never is, and asking about it
// would break another thread's global-mode capture).
ncclResult_t refuse_capture(const Call& c) {
  if (c.stream == nullptr) return ncclSuccess;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (!cuda_ok(cuStreamIsCapturing(reinterpret_cast<CUstream>(c.stream), &capture), "stream capture query"))
    return ncclUnhandledCudaError;
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE)
    return fail(ncclInvalidUsage, "SYMMEM_FAKE_NCCL_MOVE_DATA moves data on the host: a call cannot be captured");
  return ncclSuccess;
}

std::string p2p_file(ncclComm_t comm, int from, int to, long number) {
  return meeting_path(comm->id, "p" + std::to_string(from) + "to" + std::to_string(to) + "-" + std::to_string(number));
}

ncclResult_t publish(Pending* p) {
  const Call& c = *p->call;
  ncclComm_t comm = c.comm;
  const size_t es = element_size(c.type);
  sweep(comm);
  if (c.kind == Call::kRecv) {
    p->number = comm->received[c.root]++;
    return ncclSuccess;
  }
  const bool sends = c.kind == Call::kSend;
  const size_t elements = sends ? c.count : part_elements(c);
  if (sends || contributes(c)) {
    if (!to_host(c.send, elements * es, &p->mine, c.stream)) return fail_comm(comm, ncclUnhandledCudaError, last_error());
  }
  p->number = sends ? comm->sent[c.root]++ : comm->collectives++;
  if (!sends && !writes_part(c)) return ncclSuccess;
  const std::string file = sends ? p2p_file(comm, comm->rank, c.root, p->number) : part_file(comm, p->number, comm->rank);
  const Header header = header_of(c, p->number);
  if (!write_file(file, &header, p->mine.data(), p->mine.size()))
    return fail_comm(comm, ncclSystemError, "cannot write " + file);
  if (sends) return ncclSuccess;  // the receiver removes it
  std::vector<std::string> marks;
  for (int r : readers(c)) marks.push_back(mark_of(file, r));
  comm->unread.emplace_back(file, std::move(marks));
  return ncclSuccess;
}

// `elements` of rank `rank`'s part from element `at` (this rank's own from memory).
ncclResult_t part_of(const Pending& p, int rank, size_t at, size_t elements, unsigned char* out) {
  const Call& c = *p.call;
  const size_t es = element_size(c.type);
  if (rank == c.comm->rank) {
    std::memcpy(out, p.mine.data() + at * es, elements * es);
    return ncclSuccess;
  }
  const std::string file = part_file(c.comm, p.number, rank);
  if (!wait_for(file))
    return fail_comm(c.comm, ncclRemoteError, "rank " + std::to_string(rank) + " of " + std::to_string(c.comm->nranks) +
                                                  " never came to collective " + std::to_string(p.number) +
                                                  " within the deadline");
  if (!read_file(file, header_of(c, p.number), at * es, elements * es, out))
    return fail_comm(c.comm, ncclInvalidUsage, last_error());
  const std::string mark = mark_of(file, c.comm->rank);
  return write_file(mark, nullptr, nullptr, 0) ? ncclSuccess : fail_comm(c.comm, ncclSystemError, "cannot write " + mark);
}

ncclResult_t complete(const Pending& p) {
  const Call& c = *p.call;
  ncclComm_t comm = c.comm;
  const int me = comm->rank, world = comm->nranks;
  const size_t es = element_size(c.type), n = c.count;
  Bytes out;
  ncclResult_t r = ncclSuccess;
  auto gather_parts = [&](size_t at, Bytes* all) {  // every rank's n elements from `at`, in rank order
    all->resize(static_cast<size_t>(world) * n * es);
    for (int q = 0; q < world && r == ncclSuccess; ++q) r = part_of(p, q, at, n, all->data() + q * n * es);
  };
  auto reduced = [&](size_t at) {
    Bytes all;
    gather_parts(at, &all);
    if (r != ncclSuccess) return;
    Bytes scalar;
    if (c.pre_mul_sum) {
      scalar = c.pre_mul_sum->host_value;
      if (c.pre_mul_sum->device_scalar && !to_host(c.pre_mul_sum->device_scalar, es, &scalar, c.stream)) {
        r = fail_comm(comm, ncclUnhandledCudaError, last_error());
        return;
      }
    }
    std::vector<const unsigned char*> parts;
    for (int q = 0; q < world; ++q) parts.push_back(all.data() + q * n * es);
    out.resize(n * es);
    reduce(parts, n, c.type, c.op, c.pre_mul_sum ? scalar.data() : nullptr, out.data());
  };
  switch (c.kind) {
    case Call::kAllReduce: reduced(0); break;
    case Call::kReduceScatter: reduced(static_cast<size_t>(me) * n); break;
    case Call::kReduce: if (me == c.root) reduced(0); break;
    case Call::kAllGather: gather_parts(0, &out); break;
    case Call::kGather: if (me == c.root) gather_parts(0, &out); break;
    case Call::kAlltoAll: gather_parts(static_cast<size_t>(me) * n, &out); break;
    case Call::kBroadcast:
      out.resize(n * es);
      r = part_of(p, c.root, 0, n, out.data());
      break;
    case Call::kScatter:
      out.resize(n * es);
      r = part_of(p, c.root, static_cast<size_t>(me) * n, n, out.data());
      break;
    case Call::kRecv: {
      const std::string file = p2p_file(comm, c.root, me, p.number);
      if (!wait_for(file))
        return fail_comm(comm, ncclRemoteError, "rank " + std::to_string(c.root) + " never sent message " +
                                                    std::to_string(p.number) + " to rank " + std::to_string(me));
      out.resize(n * es);
      if (!read_file(file, header_of(c, p.number), 0, n * es, out.data()))
        return fail_comm(comm, ncclInvalidUsage, last_error());
      ::unlink(file.c_str());
      break;
    }
    case Call::kSend: break;
  }
  if (r != ncclSuccess) return r;
  return to_device(out, c.recv, c.stream) ? ncclSuccess : fail_comm(comm, ncclUnhandledCudaError, last_error());
}

std::mutex pre_mul_sums_mutex;
std::map<int, PreMulSum> pre_mul_sums;
int next_pre_mul_sum = ncclNumOps;

}  // namespace

bool write_whole_file(const std::string& path, const void* head, size_t head_bytes, const void* data, size_t bytes) {
  const std::string partial = path + ".partial";
  FILE* f = std::fopen(partial.c_str(), "wb");
  if (!f) return false;
  const bool written = (head_bytes == 0 || std::fwrite(head, 1, head_bytes, f) == head_bytes) &&
                       (bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes);
  return std::fclose(f) == 0 && written && std::rename(partial.c_str(), path.c_str()) == 0;
}

bool wait_for_file(const std::string& path, std::chrono::steady_clock::time_point deadline) {
  for (int polls = 0; !exists(path); ++polls) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 1000 ? 20 : 1000));
  }
  return true;
}

std::string& last_error() {
  thread_local std::string text = "no error";
  return text;
}

ncclRedOp_t add_pre_mul_sum(const void* scalar, ncclDataType_t type, bool on_device) {
  PreMulSum sum{{}, on_device ? scalar : nullptr, type};
  if (!on_device) {
    const auto* bytes = static_cast<const unsigned char*>(scalar);
    sum.host_value.assign(bytes, bytes + element_size(type));
  }
  std::lock_guard<std::mutex> lock(pre_mul_sums_mutex);
  pre_mul_sums[next_pre_mul_sum] = sum;
  return static_cast<ncclRedOp_t>(next_pre_mul_sum++);
}

std::optional<PreMulSum> find_pre_mul_sum(ncclRedOp_t op) {
  std::lock_guard<std::mutex> lock(pre_mul_sums_mutex);
  const auto it = pre_mul_sums.find(op);
  return it == pre_mul_sums.end() ? std::nullopt : std::optional<PreMulSum>(it->second);
}

void remove_pre_mul_sum(ncclRedOp_t op) {
  std::lock_guard<std::mutex> lock(pre_mul_sums_mutex);
  pre_mul_sums.erase(op);
}

ncclResult_t run_group(const std::vector<Call>& calls) {
  std::vector<Pending> pending(calls.size());
  // Everything that can refuse the group on this rank alone, before any call is numbered.
  for (size_t i = 0; i < calls.size(); ++i) {
    const Call& c = calls[i];
    pending[i].call = &c;
    if (!c.comm) return fail(ncclInvalidArgument, "a call on a null communicator");
    if (!c.comm->failure.empty())
      return fail(static_cast<ncclResult_t>(c.comm->failure_code.load()),
                  "an earlier call on this communicator failed: " + c.comm->failure);
    if (element_size(c.type) == 0)
      return fail(ncclInvalidArgument, "data type " + std::to_string(c.type) + " is not one of NCCL's");
    if (c.op >= ncclNumOps && !c.pre_mul_sum)
      return fail(ncclInvalidArgument, "unknown reduction op " + std::to_string(c.op));
    if (const ncclResult_t r = refuse_capture(c); r != ncclSuccess) return r;
  }
  // Once numbering began, a failure leaves every communicator of the group failed: calls after
  // the failing one were never numbered here, so their numbers differ from the peers'.
  auto fail_group = [&](ncclResult_t r) {
    static const std::string prefix = "fake NCCL: ";
    std::string why = last_error();
    if (why.compare(0, prefix.size(), prefix) == 0) why.erase(0, prefix.size());
    for (const Call& c : calls) fail_comm(c.comm, r, why);
    return r;
  };
  // Sends first: a receive may wait on a peer's send queued after its own receive.
  for (int sends_pass = 1; sends_pass >= 0; --sends_pass)
    for (auto& p : pending)
      if ((p.call->kind == Call::kSend) == (sends_pass == 1))
        if (const ncclResult_t r = publish(&p); r != ncclSuccess) return fail_group(r);
  for (const auto& p : pending)
    if (const ncclResult_t r = complete(p); r != ncclSuccess) return fail_group(r);
  return ncclSuccess;
}

void forget(ncclComm_t comm) { sweep(comm); }

}  // namespace fake_nccl
