#include "oracle.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "api_compat.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

namespace symmem::test {

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kUInt8: return ncclUint8;
  }
  fail(__FILE__, __LINE__, "nccl_type: unknown type");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kAvg: return ncclAvg;
  }
  fail(__FILE__, __LINE__, "nccl_op: unknown op");
}

NcclOracle::NcclOracle(size_t max_in_bytes, size_t max_out_bytes) : in_(max_in_bytes), out_(max_out_bytes) {}

void NcclOracle::take_input(const void* in, size_t bytes, cudaStream_t stream) {
  if (bytes > in_.bytes) fail(__FILE__, __LINE__, "NcclOracle: input larger than its buffer");
  TEST_CUDA(cudaMemcpyAsync(in_.ptr, in, bytes, cudaMemcpyDeviceToDevice, stream));
}

void NcclOracle::all_gather(size_t count, DataType type, Fixture& fx) {
  if (count * dtype_size(type) * fx.world() > out_.bytes) fail(__FILE__, __LINE__, "NcclOracle: output too small");
  TEST_NCCL(ncclAllGather(in_.ptr, out_.ptr, count, nccl_type(type), fx.nccl, fx.stream));
}

void NcclOracle::all_reduce(size_t count, DataType type, ReduceOp op, Fixture& fx) {
  if (count * dtype_size(type) > out_.bytes) fail(__FILE__, __LINE__, "NcclOracle: output too small");
  TEST_NCCL(ncclAllReduce(in_.ptr, out_.ptr, count, nccl_type(type), nccl_op(op), fx.nccl, fx.stream));
}

void NcclOracle::reduce_scatter(size_t count, DataType type, ReduceOp op, Fixture& fx) {
  if (count * dtype_size(type) > out_.bytes) fail(__FILE__, __LINE__, "NcclOracle: output too small");
  TEST_NCCL(ncclReduceScatter(in_.ptr, out_.ptr, count, nccl_type(type), nccl_op(op), fx.nccl, fx.stream));
}

void NcclOracle::count_differences(const void* got, size_t bytes, unsigned long long* mismatches,
                                   cudaStream_t stream) const {
  test::count_differences(got, out_.ptr, bytes, mismatches, stream);
}

Flood::Flood(size_t copy_bytes, int copies, int busy_sms, int busy_ms)
    : bytes_(copy_bytes), copies_(copies), busy_sms_(busy_sms), busy_ms_(busy_ms) {
  TEST_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  TEST_CUDA(cudaMalloc(&src_, std::max<size_t>(bytes_, 1)));
  TEST_CUDA(cudaMalloc(&dst_, std::max<size_t>(bytes_, 1)));
  TEST_CUDA(cudaMalloc(&release_, sizeof(int)));
  TEST_CUDA(cudaMemset(release_, 0, sizeof(int)));
  TEST_CUDA(cudaMemset(src_, 0x3C, bytes_));
  TEST_CUDA(cudaDeviceSynchronize());
}

Flood::~Flood() {
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : in_flight_) cudaEventDestroy(e);
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  cudaFree(release_);
  cudaFree(dst_);
  cudaFree(src_);
  cudaStreamDestroy(stream_);
}

void Flood::top_up() {
  while (!in_flight_.empty() && cudaEventQuery(in_flight_.front()) == cudaSuccess) {
    spare_.push_back(in_flight_.front());
    in_flight_.pop_front();
  }
  while (in_flight_.size() < 2) {
    if (busy_sms_ > 0 && busy_ms_ > 0) launch_sm_hog(busy_sms_, release_, busy_ms_, stream_);
    for (int i = 0; i < copies_; ++i) TEST_CUDA(cudaMemcpyAsync(dst_, src_, bytes_, cudaMemcpyDeviceToDevice, stream_));
    cudaEvent_t done = nullptr;
    if (!spare_.empty()) {
      done = spare_.back();
      spare_.pop_back();
    } else {
      TEST_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    }
    TEST_CUDA(cudaEventRecord(done, stream_));
    in_flight_.push_back(done);
    ++batches_;
  }
}

std::unique_ptr<Communicator> fresh_communicator(int64_t timeout_ms, size_t workspace_bytes) {
  Fixture& fx = Fixture::get();
  return Communicator::create(fx.bootstrap, fx.job.local_rank, make_config(timeout_ms, workspace_bytes));
}

void release_communicator(std::unique_ptr<Communicator>& comm) {
  Fixture& fx = Fixture::get();
  cudaDeviceSynchronize();  // errors here are the test's to report, through the communicator
  cudaGetLastError();
  fx.bootstrap->barrier();  // every rank's device is done: every failure record is written
  if (fx.all(!comm->aborted())) {
    try {
      comm->close();
    } catch (const std::exception& e) {
      std::printf("rank %d: close: %s\n", fx.rank(), e.what());
    }
  }
  comm.reset();
}

Outcome run_and_synchronize(Communicator& comm, cudaStream_t stream, const std::function<void()>& call) {
  Outcome o;
  const auto start = std::chrono::steady_clock::now();
  try {
    call();
    comm.synchronize(stream);
  } catch (const Error& e) {
    o.threw = true;
    o.mismatch = is_mismatch(e);
    o.aborted = e.code() == ErrorCode::kAborted;
    o.message = e.what();
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

int occurrences(const std::string& text, const std::string& needle) {
  if (needle.empty()) return 0;
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

long expect_mismatch_everywhere(const std::string& what, const Outcome& mine, double limit_s,
                                const std::vector<std::string>& names) {
  Fixture& fx = Fixture::get();
  std::vector<std::string> problems;
  if (!mine.threw) problems.push_back("no error was raised (the call succeeded)");
  if (mine.threw && !mine.mismatch && !mine.aborted) problems.push_back("raised neither kMismatch nor kAborted");
  if (mine.seconds > limit_s)
    problems.push_back("took " + std::to_string(mine.seconds) + " s, more than " + std::to_string(limit_s) + " s");
  if (mine.mismatch) {
    bool other_rank = false;
    for (int r = 1; r < fx.world(); ++r)
      other_rank |= mine.message.find("rank " + std::to_string(r)) != std::string::npos;
    if (mine.message.find("rank 0") == std::string::npos || !other_rank)
      problems.push_back("the message does not name rank 0 and another rank");
    std::map<std::string, int> wanted;
    for (const std::string& n : names) ++wanted[n];
    for (const auto& [text, times] : wanted)
      if (occurrences(mine.message, text) < times)
        problems.push_back("the message does not contain '" + text + "'" +
                           (times > 1 ? " " + std::to_string(times) + " times" : std::string()));
  }
  for (const std::string& p : problems)
    std::printf("[ CASE ] %s: rank %d: %s; message: %s\n", what.c_str(), fx.rank(), p.c_str(),
                mine.threw ? mine.message.c_str() : "(none)");
  const long mismatches = fx.sum(mine.mismatch ? 1 : 0);
  long total = fx.sum(static_cast<long>(problems.size()));
  if (mismatches == 0) {
    if (fx.rank() == 0) std::printf("[ CASE ] %s: no rank raised kMismatch\n", what.c_str());
    ++total;
  }
  std::fflush(stdout);
  return total;
}

}  // namespace symmem::test
