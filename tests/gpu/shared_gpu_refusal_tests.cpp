// Refusals between ranks sharing ONE GPU (threads of this process, tests/gpu/shared_gpu_ranks.hpp):
// one rank passes a bad argument (memory outside the device, a null, misaligned or out-of-buffer
// pointer, an input larger than the staging area) to a call its peers make correctly. Every rank
// must raise the same error (kInvalidArgument, the same message, naming the refusing rank and the
// cause) well within a second, though the deadline is 20 s, and the communicator must be unusable
// afterwards on every rank (kAborted with that message). Before refusals (0bbf9f1) the refusing
// rank raised alone and its peers timed out after the deadline, naming it without the cause: each
// case here then fails on its time and on the peers' code and message.
//
// Every fixed-size call (all_gather, all_reduce, reduce_scatter at several algorithms, the uniform
// all-to-all, the fused ops, MoE combine) and every variable one (all_to_all_v, all_to_all_vdev,
// all_to_all_vdev_2d, MoE dispatch), eager; and a refusal while the refusing rank captures a CUDA
// graph (its peers capture the call, then learn of the refusal at their next check, and replays
// of their graph end at once). Run: symmem_shared_gpu_tests shared_gpu_refused
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device_memory.hpp"
#include "shared_gpu_ranks.hpp"
#include "symmem/fused.hpp"
#include "symmem/symmem.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

constexpr int64_t kDeadlineMs = 20000;  // a timeout would take this long: far beyond kInTime
constexpr double kInTime = 1.0;         // seconds every rank may take to raise
constexpr size_t kBytes = size_t(1) << 20;
constexpr size_t kWorkspace = size_t(64) << 20;  // four areas of 16 MiB (staging_in among them)

// A rank with the operands every case may use; the refusing rank's bad arguments come from these.
struct RefusalRank : SharedRank {
  Buffer* heap_in = nullptr;
  Buffer* heap_out = nullptr;
  DeviceBuffer local_in{kBytes}, local_out{kBytes};
  DeviceBuffer splits{64 * sizeof(int64_t)}, splits_out{2 * 64 * sizeof(int64_t)};
  std::vector<char> host = std::vector<char>(kBytes);
  std::unique_ptr<DeviceBuffer> large;  // the refusing rank's input larger than the staging area
  std::unique_ptr<EpContext> ep;
  void set_up() override {
    heap_in = comm->allocate(kBytes);
    heap_out = comm->allocate(kBytes * 8);
    TEST_CUDA(cudaMemsetAsync(splits.ptr, 0, splits.bytes, stream));
    TEST_CUDA(cudaMemsetAsync(local_in.ptr, 0, local_in.bytes, stream));
    TEST_CUDA(cudaStreamSynchronize(stream));
  }
};

struct RefusalCase {
  std::string name;
  std::string cause;  // in every rank's message
  // Set-up of the case (allocations: before any rank launches), then the call; `bad` on the
  // refusing rank. `before`: calls every rank makes correctly first (may be empty).
  std::function<void(RefusalRank&, bool bad)> set_up;
  std::function<void(RefusalRank&)> before;
  std::function<void(RefusalRank&, bool bad)> call;
  bool captured = false;  // the call is captured into a CUDA graph on every rank
};

Operand null_operand() { return Operand(static_cast<void*>(nullptr)); }

// An EP context every rank creates alike (2 experts per rank, top-2, hidden 128, 8 tokens).
void make_ep(RefusalRank& r, bool) {
  EpConfig c;
  c.num_experts = 2 * r.world;
  c.topk = 2;
  c.hidden = 128;
  c.max_tokens_per_rank = 8;
  c.max_blocks = max_blocks_for_calls() > 0 ? max_blocks_for_calls() : EpConfig{}.max_blocks;
  r.ep = EpContext::create(*r.comm, c);
  // Routing: token t of rank s to experts (s + t) and (s + t + 1) mod E; weights 1. Inputs from
  // local_in (zeroed): x at 0, ids at 64 KiB, weights at 128 KiB.
  std::vector<int64_t> ids(16);
  std::vector<float> weights(16, 1.f);
  for (int t = 0; t < 8; ++t)
    for (int k = 0; k < 2; ++k) ids[t * 2 + k] = (r.rank + t + k) % c.num_experts;
  char* base = static_cast<char*>(r.local_in.ptr);
  TEST_CUDA(cudaMemcpyAsync(base + (64 << 10), ids.data(), ids.size() * 8, cudaMemcpyHostToDevice, r.stream));
  TEST_CUDA(cudaMemcpyAsync(base + (128 << 10), weights.data(), weights.size() * 4, cudaMemcpyHostToDevice, r.stream));
  TEST_CUDA(cudaStreamSynchronize(r.stream));
}

EpDispatchArgs dispatch_args(RefusalRank& r, bool misaligned_x) {
  char* base = static_cast<char*>(r.local_in.ptr);
  EpDispatchArgs d;
  d.x = base + (misaligned_x ? 2 : 0);
  d.topk_idx = base + (64 << 10);
  d.topk_weights = reinterpret_cast<const float*>(base + (128 << 10));
  d.num_tokens = 8;
  return d;
}

std::vector<RefusalCase> refusal_cases(int world) {
  const int m = 8 * world;  // the fused ops' rows: 8 per rank, n = k = 8
  std::vector<RefusalCase> cases;
  auto none = [](RefusalRank&, bool) {};
  // all_gather: the input in host memory; a null output.
  for (Algo algo : {Algo::kPull, Algo::kLowLatency, Algo::kCopyEngine})
    cases.push_back({std::string("all_gather ") + algo_name(algo) + ", input in host memory", "host memory", none,
                     nullptr, [algo](RefusalRank& r, bool bad) {
                       const Operand in = bad ? Operand(r.host.data()) : Operand(r.local_in.ptr);
                       all_gather(Operand(r.local_out.ptr), in, 1024, DataType::kFloat32, *r.comm, r.stream,
                                  {algo, 0, max_blocks_for_calls()});
                     }});
  cases.push_back({"all_gather pull, null output", "output is null", none, nullptr, [](RefusalRank& r, bool bad) {
                     all_gather(bad ? null_operand() : Operand(r.local_out.ptr), Operand(r.local_in.ptr), 1024,
                                DataType::kFloat32, *r.comm, r.stream, {Algo::kPull, 0, max_blocks_for_calls()});
                   }});
  // all_reduce: a null input, an output in host memory, a symmetric input outside its buffer.
  for (Algo algo : {Algo::kOneShot, Algo::kTwoShotPush, Algo::kLowLatency})
    cases.push_back({std::string("all_reduce ") + algo_name(algo) + ", null input", "input is null", none, nullptr,
                     [algo](RefusalRank& r, bool bad) {
                       all_reduce(Operand(*r.heap_out), bad ? null_operand() : Operand(*r.heap_in), 4096,
                                  DataType::kFloat32, ReduceOp::kSum, *r.comm, r.stream,
                                  {algo, 0, max_blocks_for_calls()});
                     }});
  cases.push_back(
      {"all_reduce one_shot, output in host memory", "host memory", none, nullptr, [](RefusalRank& r, bool bad) {
         all_reduce(bad ? Operand(r.host.data()) : Operand(r.local_out.ptr), Operand(*r.heap_in), 4096,
                    DataType::kFloat32, ReduceOp::kSum, *r.comm, r.stream, {Algo::kOneShot, 0, max_blocks_for_calls()});
       }});
  cases.push_back({"all_reduce low_latency, input past the end of its buffer", "bytes at offset", none, nullptr,
                   [](RefusalRank& r, bool bad) {
                     all_reduce(Operand(*r.heap_out), Operand(*r.heap_in, bad ? kBytes - 64 : 0), 4096,
                                DataType::kFloat32, ReduceOp::kSum, *r.comm, r.stream,
                                {Algo::kLowLatency, 0, max_blocks_for_calls()});
                   }});
  // reduce_scatter: an output in host memory, a null input.
  for (Algo algo : {Algo::kPull, Algo::kLowLatency})
    cases.push_back({std::string("reduce_scatter ") + algo_name(algo) + ", output in host memory", "host memory", none,
                     nullptr, [algo](RefusalRank& r, bool bad) {
                       reduce_scatter(bad ? Operand(r.host.data()) : Operand(r.local_out.ptr), Operand(*r.heap_in),
                                      1024, DataType::kBFloat16, ReduceOp::kSum, *r.comm, r.stream,
                                      {algo, 0, max_blocks_for_calls()});
                     }});
  cases.push_back(
      {"reduce_scatter low_latency, null input", "input is null", none, nullptr, [](RefusalRank& r, bool bad) {
         reduce_scatter(Operand(*r.heap_out), bad ? null_operand() : Operand(*r.heap_in), 1024, DataType::kBFloat16,
                        ReduceOp::kSum, *r.comm, r.stream, {Algo::kLowLatency, 0, max_blocks_for_calls()});
       }});
  // The uniform all-to-all at every algorithm: the input in host memory.
  for (Algo algo : {Algo::kPush, Algo::kPull, Algo::kLowLatency, Algo::kCopyEngine})
    cases.push_back({std::string("all_to_all ") + algo_name(algo) + ", input in host memory", "host memory", none,
                     nullptr, [algo](RefusalRank& r, bool bad) {
                       all_to_all(Operand(*r.heap_out), bad ? Operand(r.host.data()) : Operand(r.local_in.ptr), 4096,
                                  *r.comm, r.stream, {algo, 0, max_blocks_for_calls()});
                     }});
  // all_to_all_v: the refusing rank's local input (staged: the output is local, so pull reads the
  // staged copies) is larger than the staging area; the case.
  auto oversize_set_up = [](RefusalRank& r, bool bad) {
    if (bad) r.large = std::make_unique<DeviceBuffer>(kWorkspace / 4 + (1 << 20));
  };
  auto oversize_call = [](RefusalRank& r, bool bad) {
    const size_t row_bytes = 1024;
    const size_t in_rows = bad ? r.large->bytes / row_bytes : 64;
    std::vector<int64_t> splits(r.world, 2), expected(r.world, 2);
    all_to_all_v(Operand(r.local_out.ptr), 64, Operand(bad ? r.large->ptr : r.local_in.ptr), in_rows, splits.data(),
                 expected.data(), row_bytes, *r.comm, r.stream, {Algo::kAuto, 0, max_blocks_for_calls()});
  };
  cases.push_back({"all_to_all_v, a local input larger than the staging area", "must be staged", oversize_set_up,
                   nullptr, oversize_call});
  cases.push_back({"all_to_all_vdev, null in_splits", "in_splits is null", none, nullptr, [](RefusalRank& r, bool bad) {
                     all_to_all_vdev(Operand(*r.heap_out), 64, Operand(r.local_in.ptr), 64,
                                     bad ? nullptr : static_cast<const int64_t*>(r.splits.ptr),
                                     static_cast<int64_t*>(r.splits_out.ptr), 16, *r.comm, r.stream,
                                     {Algo::kAuto, 0, max_blocks_for_calls()});
                   }});
  cases.push_back({"all_to_all_vdev_2d, out_splits_offsets in host memory", "host memory", none, nullptr,
                   [](RefusalRank& r, bool bad) {
                     all_to_all_vdev_2d(
                         Operand(*r.heap_out), 256, Operand(r.local_in.ptr), 64,
                         static_cast<const int64_t*>(r.splits.ptr),
                         bad ? reinterpret_cast<int64_t*>(r.host.data()) : static_cast<int64_t*>(r.splits_out.ptr), 16,
                         2, 4, *r.comm, r.stream, {Algo::kAuto, 0, max_blocks_for_calls()});
                   }});
  // MoE: a misaligned x in dispatch; a misaligned out in the combine after a correct dispatch.
  cases.push_back({"moe_dispatch, misaligned x", "x must be 16-byte aligned", make_ep, nullptr,
                   [](RefusalRank& r, bool bad) { r.ep->dispatch(dispatch_args(r, bad), r.stream); }});
  cases.push_back({"moe_combine, misaligned out", "out must be 16-byte aligned", make_ep,
                   [](RefusalRank& r) { r.ep->dispatch(dispatch_args(r, false), r.stream); },
                   [](RefusalRank& r, bool bad) {
                     EpCombineArgs c;
                     c.out = static_cast<char*>(r.local_out.ptr) + (bad ? 2 : 0);
                     r.ep->combine(c, r.stream);
                   }});
  // The fused ops (where this build and GPU have the fused GEMM): a misaligned operand.
  cases.push_back({"all_gather_matmul, misaligned b", "16-byte aligned", none, nullptr, [m](RefusalRank& r, bool bad) {
                     all_gather_matmul(r.local_out.ptr, *r.heap_out, r.local_in.ptr,
                                       static_cast<char*>(r.local_in.ptr) + (64 << 10) + (bad ? 2 : 0), m, 8, 8,
                                       DataType::kBFloat16, *r.comm, r.stream);
                   }});
  cases.push_back(
      {"matmul_reduce_scatter, misaligned a", "16-byte aligned", none, nullptr, [m](RefusalRank& r, bool bad) {
         matmul_reduce_scatter(r.local_out.ptr, *r.heap_out, static_cast<char*>(r.local_in.ptr) + (bad ? 2 : 0),
                               static_cast<char*>(r.local_in.ptr) + (64 << 10), m, 8, 8, DataType::kBFloat16, *r.comm,
                               r.stream);
       }});
  // Refused while capturing: the capturing rank raises; its peers capture their call.
  RefusalCase captured_reduce{"all_reduce low_latency, null input, under capture", "input is null", none, nullptr,
                              [](RefusalRank& r, bool bad) {
                                all_reduce(Operand(*r.heap_out), bad ? null_operand() : Operand(*r.heap_in), 4096,
                                           DataType::kFloat32, ReduceOp::kSum, *r.comm, r.stream,
                                           {Algo::kLowLatency, 0, max_blocks_for_calls()});
                              }};
  captured_reduce.captured = true;
  cases.push_back(captured_reduce);
  RefusalCase captured_v{"all_to_all_v, a local input larger than the staging area, under capture", "must be staged",
                         oversize_set_up, nullptr, oversize_call};
  captured_v.captured = true;
  cases.push_back(captured_v);
  return cases;
}

// Why a case cannot run on this build or GPU (the fused GEMM), alike on every rank; "" otherwise.
std::string unsupported(const RefusalCase& c, RefusalRank& r) {
  const int m = 8 * r.world;
  if (c.name.rfind("all_gather_matmul", 0) == 0)
    return all_gather_matmul_unsupported(*r.heap_out, m, 8, 8, DataType::kBFloat16, *r.comm);
  if (c.name.rfind("matmul_reduce_scatter", 0) == 0)
    return matmul_reduce_scatter_unsupported(*r.heap_out, m, 8, 8, DataType::kBFloat16, *r.comm);
  return "";
}

struct Seen {
  std::string error = "no error";  // the first error: at the call, or at the check after it
  ErrorCode code = ErrorCode::kInternal;
  double seconds = 0;
  std::string after = "no error";  // check() once the error was raised
  ErrorCode after_code = ErrorCode::kInternal;
  std::string replay;  // captured cases: what a replay of the peer's graph did
};

// The case on one rank: the call (captured or not), then synchronize or check; what it raised.
Seen run_case(const RefusalCase& c, RefusalRank& r, int bad_rank) {
  const bool bad = r.rank == bad_rank;
  Seen seen;
  std::unique_ptr<CapturedGraph> graph;
  auto attempt = [&](const std::function<void()>& step) {
    if (seen.error != "no error") return;
    try {
      step();
    } catch (const Error& e) {
      seen.error = e.what();
      seen.code = e.code();
    }
  };
  const auto start = std::chrono::steady_clock::now();
  if (c.captured) {
    // The peers capture their call (or raise at it, if the refusal came first); they learn of it
    // at their next check, once the refusing rank has made its call.
    attempt([&] { graph = std::make_unique<CapturedGraph>(r.stream, [&] { c.call(r, bad); }); });
    wait_for_every_rank(r);
    attempt([&] { r.comm->check(); });
  } else {
    attempt([&] {
      c.call(r, bad);
      r.comm->synchronize(r.stream);
    });
  }
  seen.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (graph) {  // a peer's graph of the refused call: its replay ends at once
    const auto replay = std::chrono::steady_clock::now();
    graph->launch(r.stream);
    TEST_CUDA(cudaStreamSynchronize(r.stream));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - replay).count();
    if (took > kInTime) seen.replay = "the replay took " + std::to_string(took) + " s";
  }
  try {
    r.comm->check();
  } catch (const Error& e) {
    seen.after = e.what();
    seen.after_code = e.code();
  }
  return seen;
}

void expect_refused_everywhere(const RefusalCase& c, const std::vector<Seen>& seen, int bad_rank) {
  const std::string where = c.name + ", world " + std::to_string(seen.size()) + ", rank ";
  const std::string named = "rank " + std::to_string(bad_rank) + " refused the call: ";
  for (size_t q = 0; q < seen.size(); ++q) {
    const Seen& s = seen[q];
    if (s.code != ErrorCode::kInvalidArgument || s.error.find(named) == std::string::npos ||
        s.error.find(c.cause) == std::string::npos)
      throw Failure(where + std::to_string(q) + ": expected kInvalidArgument naming " + named + "... " + c.cause +
                    ", got: " + s.error);
    if (s.error != seen[bad_rank].error)
      throw Failure(where + std::to_string(q) + " raised \"" + s.error + "\", the refusing rank \"" +
                    seen[bad_rank].error + "\"");
    if (s.seconds > kInTime)
      throw Failure(where + std::to_string(q) + ": the error took " + std::to_string(s.seconds) + " s");
    if (s.after_code != ErrorCode::kAborted || s.after.find(named) == std::string::npos)
      throw Failure(where + std::to_string(q) +
                    ": afterwards check() should raise kAborted with the refusal, got: " + s.after);
    if (!s.replay.empty()) throw Failure(where + std::to_string(q) + ": " + s.replay);
  }
}

void run_refusal_case(const RefusalCase& c, int world) {
  const int bad_rank = world - 1;
  std::mutex mutex;
  std::vector<Seen> seen(world);
  std::string skipped;
  run_shared_ranks<RefusalRank>(
      world,
      [&](RefusalRank& r) {
        const std::string why = unsupported(c, r);
        if (!why.empty()) {
          std::lock_guard<std::mutex> lock(mutex);
          skipped = why;
          return;
        }
        c.set_up(r, r.rank == bad_rank);
        wait_for_every_rank(r);  // everything allocated before any rank launches
        if (c.before) {
          c.before(r);
          r.comm->synchronize(r.stream);
          wait_for_every_rank(r);
        }
        const Seen mine = run_case(c, r, bad_rank);
        {
          std::lock_guard<std::mutex> lock(mutex);
          seen[r.rank] = mine;
        }
        // Unusable now: released without the collective close, all together.
        TEST_CUDA(cudaStreamSynchronize(r.stream));
        wait_for_every_rank(r);
        r.ep.reset();
        r.comm.reset();
      },
      kDeadlineMs, kWorkspace);
  if (!skipped.empty()) {
    std::printf("  %s: skipped (%s)\n", c.name.c_str(), skipped.c_str());
    return;
  }
  expect_refused_everywhere(c, seen, bad_rank);
}

// The cases whose name begins with one of `prefixes` (captured or not, as `captured` says), at
// every world.
void run_refusal_cases(std::initializer_list<const char*> prefixes, bool captured = false) {
  for (int world : shared_gpu_worlds())
    for (const RefusalCase& c : refusal_cases(world))
      for (const char* prefix : prefixes)
        if (c.captured == captured && c.name.rfind(prefix, 0) == 0) run_refusal_case(c, world);
}

}  // namespace

TEST(shared_gpu_refused_all_gather_fails_every_rank_at_once) { run_refusal_cases({"all_gather "}); }
TEST(shared_gpu_refused_all_reduce_fails_every_rank_at_once) { run_refusal_cases({"all_reduce "}); }
TEST(shared_gpu_refused_reduce_scatter_fails_every_rank_at_once) { run_refusal_cases({"reduce_scatter "}); }
TEST(shared_gpu_refused_uniform_all_to_all_fails_every_rank_at_once) { run_refusal_cases({"all_to_all "}); }
TEST(shared_gpu_refused_variable_all_to_all_fails_every_rank_at_once) {
  run_refusal_cases({"all_to_all_v,", "all_to_all_vdev,", "all_to_all_vdev_2d,"});
}
TEST(shared_gpu_refused_moe_dispatch_and_combine_fail_every_rank_at_once) {
  run_refusal_cases({"moe_dispatch", "moe_combine"});
}
TEST(shared_gpu_refused_fused_ops_fail_every_rank_at_once) {
  run_refusal_cases({"all_gather_matmul", "matmul_reduce_scatter"});
}
TEST(shared_gpu_refused_under_capture_fails_every_rank_at_once) {
  run_refusal_cases({"all_reduce ", "all_to_all_v,"}, true);
}
