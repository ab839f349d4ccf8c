// Ownership and lifetimes (docs/design.md): every byte a collective uses has one owner and a
// reuse rule. Each test reproduces a way the tree of 6cf5c42 broke a rule, and fails there:
//   scratch_is_not_shared_between_collectives      one scratch served two purposes at once;
//   graph_replay_after_larger_eager_calls          a captured graph kept pointing at a scratch
//                                                  buffer that a larger call had freed;
//   rank_dependent_placement                       symmetry inferred from addresses made ranks
//                                                  plan different algorithms;
//   rank_dependent_symmetric_offsets_are_a_mismatch  ranks that disagree must all fail.
// Every answer is compared with NCCL on the same inputs (bit-exact: reductions use inputs whose
// sums are exact in any order).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "api_compat.hpp"
#include "calls.hpp"
#include "fixture.hpp"
#include "oracle.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

}  // namespace

// Scenario 1. In the old tree a push all-gather into plain device memory staged its output in the
// communicator's single scratch buffer, and the next call, a two-shot push all-reduce, used the
// same scratch for the slices the peers store before its first barrier. A peer that was done
// first stored into this rank's scratch while this rank was still copying its all-gather out
// (slowed by another stream's copies): the all-gather output was wrong (3 of 20 on rank 1 on
// 2 x H200). Rank 0 runs clean; every other rank floods its GPU with batches of four 1 GiB copies.
TEST(scratch_is_not_shared_between_collectives) {
  Fixture& fx = Fixture::get();
  if (fx.world() < 2) SKIP("needs two ranks");
  const int world = fx.world();
  constexpr int kIterations = 40;
  constexpr size_t kGatherBytes = 32 * kMiB;         // per rank, plain cudaMalloc in and out
  constexpr size_t kReduceCount = size_t(64) << 20;  // bf16 elements, heap in and out
  DeviceBuffer gather_in(kGatherBytes), gather_out(kGatherBytes * world);
  NcclOracle oracle(kGatherBytes, kGatherBytes * world);
  Buffer* reduce_in = fx.comm->allocate(kReduceCount * 2);
  Buffer* reduce_out = fx.comm->allocate(kReduceCount * 2);
  Counters gather_wrong(kIterations), reduce_wrong(kIterations);
  std::unique_ptr<Flood> flood;
  if (fx.rank() != 0) flood = std::make_unique<Flood>(size_t(1) << 30, 4);
  CollectiveOptions push, two_shot_push;
  push.algo = Algo::kPush;
  two_shot_push.algo = Algo::kTwoShotPush;
  std::string error;
  try {
    for (int i = 0; i < kIterations; ++i) {
      const uint64_t iteration = 3000000 + i;
      TEST_CUDA(cudaMemsetAsync(gather_out.ptr, 0xA5, kGatherBytes * world, fx.stream));
      fill_pattern(gather_in.ptr, kGatherBytes, pattern_seed(fx.rank(), iteration), fx.stream);
      oracle.take_input(gather_in.ptr, kGatherBytes, fx.stream);
      oracle.all_gather(kGatherBytes, DataType::kUInt8, fx);
      fill_small_integers(reduce_in->ptr(), kReduceCount, DataType::kBFloat16, pattern_seed(fx.rank(), iteration),
                          fx.stream);
      TEST_CUDA(cudaMemsetAsync(reduce_out->ptr(), 0xFF, kReduceCount * 2, fx.stream));
      if (flood) flood->top_up();
      // Back to back, as a training step would issue them: no check and no sync in between.
      all_gather(gather_out.ptr, gather_in.ptr, kGatherBytes, DataType::kUInt8, *fx.comm, fx.stream, push);
      all_reduce(sym(reduce_out), sym(reduce_in), kReduceCount, DataType::kBFloat16, ReduceOp::kSum, *fx.comm,
                 fx.stream, two_shot_push);
      oracle.count_differences(gather_out.ptr, kGatherBytes * world, gather_wrong.at(i), fx.stream);
      count_sum_mismatches(reduce_out->ptr(), kReduceCount, 0, DataType::kBFloat16, world, iteration,
                           reduce_wrong.at(i), fx.stream);
    }
    fx.comm->synchronize(fx.stream);
  } catch (const Error& e) {
    error = e.what();
  }
  long bad = 0;
  if (!error.empty()) {
    ++bad;
    std::printf("[ CASE ] scratch_is_not_shared_between_collectives: rank %d: %s\n", fx.rank(), error.c_str());
  } else {
    const auto gathers = gather_wrong.read(fx.stream);
    const auto reductions = reduce_wrong.read(fx.stream);
    for (int i = 0; i < kIterations; ++i) {
      if (gathers[i] == 0 && reductions[i] == 0) continue;
      ++bad;
      std::printf(
          "[ CASE ] scratch_is_not_shared_between_collectives: rank %d iteration %d: all_gather(push, "
          "local) differs from NCCL in %llu bytes; all_reduce(two_shot_push) %llu wrong elements\n",
          fx.rank(), i, gathers[i], reductions[i]);
    }
    if (bad) std::printf("rank %d: %ld of %d iterations wrong\n", fx.rank(), bad, kIterations);
  }
  flood.reset();
  fx.comm->free(reduce_out);
  fx.comm->free(reduce_in);
  EXPECT_EQ(fx.sum(bad), 0L);
}

namespace {

// The buffers of one replay case: heap buffers of the case's own communicator and plain device
// memory shared by the cases, each big enough for the largest call.
struct Arena {
  Buffer* heap_in = nullptr;
  Buffer* heap_out = nullptr;
  void* local_in = nullptr;
  void* local_out = nullptr;
};

Call make_call(Collective coll, Algo algo, size_t count, bool local, const Arena& a) {
  Call c;
  c.collective = coll;
  c.algo = algo;
  c.type = DataType::kBFloat16;
  c.count = count;
  c.out = local ? OperandArg(a.local_out) : sym(a.heap_out);
  c.in = local ? OperandArg(a.local_in) : sym(a.heap_in);
  return c;
}

bool low_latency(Algo a) { return a == Algo::kLowLatency || a == Algo::kLowLatencyTwoShot; }

// Elements (per rank for all-gather and reduce-scatter) of the captured call.
size_t small_count(Collective coll, Algo algo) {
  if (low_latency(algo)) return 8192;  // 16 KiB: eager calls up to 64 x that stay low latency
  return coll == Collective::kAllReduce ? size_t(1) << 20 : size_t(512) << 10;
}

constexpr int kEagerFactors[] = {8, 16, 32, 64};
constexpr int kReplays = 20;

enum class CaseResult { kPassed, kFailed, kNotPlannable };

// Scenario 2 for one (collective, algorithm, placement), on a communicator of its own (in the
// old tree, an earlier test's larger calls would already have grown the scratch buffer, hiding
// the bug): capture the call at a small size; run it eagerly at every larger size; allocate a
// fresh 2 MiB heap buffer filled with a pattern; replay the graph with inputs changed in place.
// Each replay must match NCCL and leave the fresh buffer untouched; so must the eager calls.
CaseResult replay_after_larger_eager_calls(Collective coll, Algo algo, bool local, void* local_in, void* local_out,
                                           NcclOracle& oracle) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  const std::string name =
      std::string(collective_name(coll)) + "(" + algo_name(algo) + ", " + (local ? "local" : "heap") + " operands)";
  const size_t small = small_count(coll, algo);
  const size_t largest = small * kEagerFactors[3];
  auto comm = fresh_communicator(10000);
  Arena a;
  a.local_in = local_in;
  a.local_out = local_out;
  const Call biggest = make_call(coll, algo, largest, local, a);
  a.heap_in = comm->allocate(input_bytes(biggest, world));
  a.heap_out = comm->allocate(output_bytes(biggest, world));
  const Call captured = make_call(coll, algo, small, local, a);
  if (!fx.all(plannable(captured, *comm))) {
    release_communicator(comm);
    return CaseResult::kNotPlannable;
  }
  // Decided before any launch, so that the ranks stay in step even if a launch throws.
  bool eager_runs[4];
  int eager_calls = 0;
  for (int f = 0; f < 4; ++f) {
    eager_runs[f] = fx.all(plannable(make_call(coll, algo, small * kEagerFactors[f], local, a), *comm));
    eager_calls += eager_runs[f];
  }
  Counters eager_wrong(4), replay_wrong(kReplays), canary_wrong(kReplays);
  std::unique_ptr<CapturedGraph> graph;
  std::string error;
  try {
    if (kWarmUpBeforeCapture) launch(captured, *comm, fx.stream);
    graph = std::make_unique<CapturedGraph>(fx.stream, [&] { launch(captured, *comm, fx.stream); });
    for (int f = 0; f < 4; ++f) {
      if (!eager_runs[f]) continue;
      const Call eager = make_call(coll, algo, small * kEagerFactors[f], local, a);
      prepare(eager, mix_seed(fx.rank(), 4000000 + f), oracle, fx.stream, world);
      launch(eager, *comm, fx.stream);
      check_against_nccl(eager, oracle, eager_wrong.at(f), fx);
    }
    comm->synchronize(fx.stream);
  } catch (const Error& e) {
    error = e.what();
  }
  if (fx.all(error.empty())) {
    // Allocated after the larger calls: in the old tree it took the place of the freed scratch.
    constexpr size_t kCanaryBytes = 2 * kMiB;
    const uint64_t canary_seed = mix_seed(fx.rank(), 0xC4A7A7);
    Buffer* canary = comm->allocate(kCanaryBytes);
    try {
      fill_pattern(canary->ptr(), kCanaryBytes, canary_seed, fx.stream);
      for (int r = 0; r < kReplays; ++r) {
        prepare(captured, mix_seed(fx.rank(), 5000000 + r), oracle, fx.stream, world);
        graph->launch(fx.stream);
        check_against_nccl(captured, oracle, replay_wrong.at(r), fx);
        count_pattern_mismatches(canary->ptr(), kCanaryBytes, canary_seed, canary_wrong.at(r), fx.stream);
      }
      comm->synchronize(fx.stream);
    } catch (const Error& e) {
      error = e.what();
    }
  } else if (error.empty()) {
    error = "another rank failed before the replays";
  }
  long bad = 0;
  if (!error.empty()) {
    ++bad;
    std::printf("[ CASE ] %s: rank %d: %s\n", name.c_str(), fx.rank(), error.c_str());
  } else {
    if (eager_calls == 0) {
      ++bad;
      std::printf("[ CASE ] %s: no larger size could be planned\n", name.c_str());
    }
    const auto eager = eager_wrong.read(fx.stream);
    for (int f = 0; f < 4; ++f)
      if (eager[f]) {
        ++bad;
        std::printf("[ CASE ] %s: rank %d: eager call of %zu elements differs from NCCL in %llu bytes\n", name.c_str(),
                    fx.rank(), small * kEagerFactors[f], eager[f]);
      }
    const auto replays = replay_wrong.read(fx.stream);
    const auto canaries = canary_wrong.read(fx.stream);
    for (int r = 0; r < kReplays; ++r)
      if (replays[r] || canaries[r]) {
        ++bad;
        std::printf(
            "[ CASE ] %s: rank %d replay %d: output differs from NCCL in %llu bytes; the fresh heap "
            "buffer has %llu bytes overwritten\n",
            name.c_str(), fx.rank(), r, replays[r], canaries[r]);
      }
  }
  graph.reset();
  release_communicator(comm);  // closes the communicator: frees the canary and the operands
  return fx.sum(bad) == 0 ? CaseResult::kPassed : CaseResult::kFailed;
}

struct ReplayCase {
  Collective coll;
  Algo algo;
  bool local;
};

// Runs the cases; returns failed cases (agreed over ranks) and counts those that ran.
long run_replay_cases(const std::vector<ReplayCase>& cases, int* ran) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  // Plain device memory for the largest call of any collective: all-reduce 64 Mi bf16 (128 MiB);
  // all-gather output and reduce-scatter input 32 Mi bf16 per rank.
  const size_t bytes = std::max<size_t>(128 * kMiB, 64 * kMiB * world);
  DeviceBuffer local_in(bytes), local_out(bytes);
  NcclOracle oracle(bytes, bytes);
  long failed = 0;
  *ran = 0;
  for (const ReplayCase& c : cases) {
    const CaseResult r = replay_after_larger_eager_calls(c.coll, c.algo, c.local, local_in.ptr, local_out.ptr, oracle);
    if (r == CaseResult::kFailed) ++failed;
    if (r != CaseResult::kNotPlannable) ++*ran;
  }
  return failed;
}

}  // namespace

// Scenario 2: a graph replayed after larger eager calls. In the old tree the captured call referenced the scratch
// buffer; a larger eager call freed it and allocated a bigger one; the fresh 2 MiB buffer landed
// where the old scratch was, and every replay wrote into it.
TEST(graph_replay_after_larger_eager_calls) {
  Fixture& fx = Fixture::get();
  if (fx.world() < 2) SKIP("needs two ranks");
  const std::vector<ReplayCase> cases = {
      {Collective::kAllReduce, Algo::kTwoShotPush, false},      // 1 Mi bf16, heap in and out
      {Collective::kAllGather, Algo::kPush, true},              // staged output
      {Collective::kAllGather, Algo::kPull, true},              // staged input
      {Collective::kReduceScatter, Algo::kTwoShot, true},       // staged input
      {Collective::kReduceScatter, Algo::kTwoShotPush, false},  // receive area
  };
  int ran = 0;
  const long failed = run_replay_cases(cases, &ran);
  EXPECT_EQ(failed, 0L);
  EXPECT_EQ(ran, static_cast<int>(cases.size()));
}

// Scenario 2 for every algorithm of every collective, heap and local operands: graphs captured
// at a small size, replayed after eager calls at every larger size.
TEST(graph_replays_of_every_algorithm_after_larger_eager_calls) {
  Fixture& fx = Fixture::get();
  if (fx.world() < 2) SKIP("needs two ranks");
  std::vector<ReplayCase> cases;
  for (bool local : {false, true}) {
    for (Algo a : {Algo::kPull, Algo::kPush, Algo::kCopyEngine}) cases.push_back({Collective::kAllGather, a, local});
    for (Algo a : {Algo::kOneShot, Algo::kOneShotPush, Algo::kTwoShot, Algo::kTwoShotPush, Algo::kLowLatency,
                   Algo::kLowLatencyTwoShot})
      cases.push_back({Collective::kAllReduce, a, local});
    for (Algo a : {Algo::kTwoShot, Algo::kTwoShotPush}) cases.push_back({Collective::kReduceScatter, a, local});
  }
  int ran = 0;
  const long failed = run_replay_cases(cases, &ran);
  EXPECT_EQ(failed, 0L);
  // Only all-reduce two_shot_push with a local output cannot be planned (it stores into every
  // rank's output, which must be in the heap).
  EXPECT(ran >= static_cast<int>(cases.size()) - 1);
}

// Scenario 3. The old tree treated any pointer into the heap as symmetric. When rank 0 passed a
// heap address as a plain pointer and rank 1 plain cudaMalloc memory, the ranks planned different
// algorithms (one staged, one not) and read or wrote each other's memory at wrong places. Now a
// raw pointer is always a local operand: every rank plans the same, whatever the placement. The
// placements differ across ranks: rank 0 (or 1) at offset 0 of a heap buffer, the other ranks at
// 4096 + 17 bytes (all-gather; odd, so that the scalar kernels run) or 4096 + 3 elements
// (reductions; not 16-byte aligned) into cudaMalloc memory. Every algorithm; checked against NCCL;
// an unrelated heap buffer of every rank must stay untouched.
TEST(rank_dependent_placement) {
  Fixture& fx = Fixture::get();
  if (fx.world() < 2) SKIP("needs two ranks");
  const int world = fx.world();
  constexpr size_t kGatherCount = 64 << 10;  // uint8: 64 KiB per rank
  constexpr size_t kReduceCount = 16381;     // odd; fp32: 64 KiB
  constexpr size_t kSlack = 8192;
  const size_t max_in = kReduceCount * 4 * world, max_out = std::max(kGatherCount * world, kReduceCount * 4);
  auto comm = fresh_communicator(5000);
  Buffer* heap_in = comm->allocate(max_in + kSlack);
  Buffer* heap_out = comm->allocate(max_out + kSlack);
  Buffer* canary = comm->allocate(kMiB);
  DeviceBuffer local_in(max_in + kSlack), local_out(max_out + kSlack);
  NcclOracle oracle(max_in, max_out);
  const uint64_t canary_seed = mix_seed(fx.rank(), 0xCA4A);
  fill_pattern(canary->ptr(), kMiB, canary_seed, fx.stream);

  struct Case {
    Call call;
    std::string name;
  };
  std::vector<Case> cases;
  for (int heap_parity : {0, 1}) {
    const bool on_heap = fx.rank() % 2 == heap_parity;
    auto place = [&](Collective coll, Algo algo, DataType type, size_t count) {
      const size_t elem = dtype_size(type);
      const size_t offset = on_heap ? 0 : 4096 + (coll == Collective::kAllGather ? 17 : 3 * elem);
      Call c;
      c.collective = coll;
      c.algo = algo;
      c.type = type;
      c.count = count;
      c.in = OperandArg(static_cast<char*>(on_heap ? heap_in->ptr() : local_in.ptr) + offset);
      c.out = OperandArg(static_cast<char*>(on_heap ? heap_out->ptr() : local_out.ptr) + offset);
      cases.push_back({c, describe(c) + (heap_parity ? ", odd ranks on the heap" : ", even ranks on the heap")});
    };
    for (Algo a : {Algo::kAuto, Algo::kPull, Algo::kPush, Algo::kCopyEngine})
      place(Collective::kAllGather, a, DataType::kUInt8, kGatherCount);
    for (DataType t : {DataType::kBFloat16, DataType::kFloat32}) {
      for (Algo a : {Algo::kAuto, Algo::kOneShot, Algo::kOneShotPush, Algo::kTwoShot, Algo::kTwoShotPush,
                     Algo::kLowLatency, Algo::kLowLatencyTwoShot})
        place(Collective::kAllReduce, a, t, kReduceCount);
      for (Algo a : {Algo::kAuto, Algo::kTwoShot, Algo::kTwoShotPush})
        place(Collective::kReduceScatter, a, t, kReduceCount);
    }
  }
  Counters wrong(cases.size()), canary_wrong(cases.size());
  long bad = 0, ran = 0;
  std::string error;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Call& c = cases[i].call;
    const long planned = fx.sum(plannable(c, *comm) ? 1 : 0);
    if (planned == 0) continue;  // e.g. two_shot_push all-reduce with a local output, on every rank
    if (planned != world) {
      ++bad;
      std::printf("[ CASE ] %s: rank %d: ranks disagree on whether the call can run (%ld of %d)\n",
                  cases[i].name.c_str(), fx.rank(), planned, world);
      continue;
    }
    ++ran;
    try {
      prepare(c, mix_seed(fx.rank(), 6000000 + i), oracle, fx.stream, world);
      launch(c, *comm, fx.stream);
      check_against_nccl(c, oracle, wrong.at(i), fx);
      count_pattern_mismatches(canary->ptr(), kMiB, canary_seed, canary_wrong.at(i), fx.stream);
    } catch (const Error& e) {
      if (error.empty()) error = cases[i].name + ": " + e.what();
    }
  }
  try {
    comm->synchronize(fx.stream);
  } catch (const Error& e) {
    if (error.empty()) error = std::string("synchronize: ") + e.what();
  }
  if (!error.empty()) {
    ++bad;
    std::printf("[ CASE ] rank_dependent_placement: rank %d: %s\n", fx.rank(), error.c_str());
  } else {
    const auto w = wrong.read(fx.stream);
    const auto k = canary_wrong.read(fx.stream);
    for (size_t i = 0; i < cases.size(); ++i)
      if (w[i] || k[i]) {
        ++bad;
        std::printf(
            "[ CASE ] %s: rank %d: %llu bytes differ from NCCL; %llu bytes of an unrelated heap buffer "
            "overwritten\n",
            cases[i].name.c_str(), fx.rank(), w[i], k[i]);
      }
  }
  release_communicator(comm);
  EXPECT_EQ(fx.sum(bad), 0L);
  // Per placement: 4 all-gathers, 2 x (6 all-reduces without two_shot_push, 3 reduce-scatters).
  EXPECT_EQ(ran, 2L * (4 + 2 * (6 + 3)));
}

// Scenario 3, symmetric half: a heap buffer at an offset that differs across ranks (rank 0 at 0,
// the others at 256) is a different call on each rank. Every rank must raise kMismatch (kAborted
// where another rank's failure came first) naming both calls, within the deadline plus a few
// seconds: never a wrong answer, never a hang. In the old tree the ranks silently read and wrote
// each other's buffers at the wrong offsets.
TEST(rank_dependent_symmetric_offsets_are_a_mismatch) {
  Fixture& fx = Fixture::get();
  if (fx.world() < 2) SKIP("needs two ranks");
  const int world = fx.world();
  constexpr int64_t kTimeoutMs = 3000;
  constexpr size_t kCount = 16384;  // bf16, 32 KiB: small enough for low latency
  const size_t offset = fx.rank() == 0 ? 0 : 256;
  struct Case {
    Collective coll;
    Algo algo;
  };
  const Case cases[] = {
      {Collective::kAllGather, Algo::kPull},
      {Collective::kAllGather, Algo::kPush},
      {Collective::kAllGather, Algo::kCopyEngine},
      {Collective::kAllReduce, Algo::kOneShot},
      {Collective::kAllReduce, Algo::kTwoShot},
      {Collective::kAllReduce, Algo::kTwoShotPush},
      {Collective::kAllReduce, Algo::kLowLatency},
      {Collective::kReduceScatter, Algo::kTwoShot},
      {Collective::kReduceScatter, Algo::kTwoShotPush},
  };
  long problems = 0;
  for (const Case& k : cases) {
    auto comm = fresh_communicator(kTimeoutMs, 16 * kMiB);
    Call c;
    c.collective = k.coll;
    c.algo = k.algo;
    c.type = DataType::kBFloat16;
    c.count = kCount;
    Buffer* in = comm->allocate(input_bytes(c, world) + 256);
    Buffer* out = comm->allocate(output_bytes(c, world));
    c.in = sym(in, offset);  // the only difference between the ranks
    c.out = sym(out);
    fill_exact(address_of(c.in), input_bytes(c, world) / 2, DataType::kBFloat16, mix_seed(fx.rank(), 7), fx.stream);
    TEST_CUDA(cudaStreamSynchronize(fx.stream));
    fx.bootstrap->barrier();
    const Outcome o = run_and_synchronize(*comm, fx.stream, [&] { launch(c, *comm, fx.stream); });
    const std::string op = std::string(collective_name(k.coll)) + "(";
    problems += expect_mismatch_everywhere(describe(c) + " with symmetric input offsets 0 and 256", o,
                                           kTimeoutMs / 1000.0 + 5, {op, op});
    comm.reset();  // local release: the communicator has failed
  }
  EXPECT_EQ(problems, 0L);
}
