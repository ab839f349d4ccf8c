// Load and size: thousands of interleaved calls of every collective and algorithm, with sizes,
// types, placements and offsets changing every call and CUDA-graph replays in between, while
// another stream floods the GPU; and reductions of 256 MiB, whose local operands exceed the
// workspace and run in chunks. Every result is compared on the device with NCCL on the same
// inputs (no host synchronisation per call); reductions of real-valued random data are also
// checked against a float64 reference and for identical bits on every rank.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
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

// Where a call's operands live: heap buffers (symmetric) or plain device memory (local), at a
// byte offset; in place or not.
struct Placement {
  bool local = false;
  size_t in_offset = 0;
  size_t out_offset = 0;
  bool in_place = false;
};

struct Buffers {
  Buffer* heap_in;
  Buffer* heap_out;
  void* local_in;
  void* local_out;
};

// The operands of `c` (collective, type, count already set) at `p`. In place: all-gather's input
// is this rank's slot of the output, reduce-scatter's output this rank's slice of the input.
void place(Call& c, const Placement& p, const Buffers& b, int rank) {
  const size_t bytes = c.count * dtype_size(c.type);
  auto in_at = [&](size_t offset) {
    return p.local ? OperandArg(static_cast<char*>(b.local_in) + offset) : sym(b.heap_in, offset);
  };
  auto out_at = [&](size_t offset) {
    return p.local ? OperandArg(static_cast<char*>(b.local_out) + offset) : sym(b.heap_out, offset);
  };
  if (!p.in_place) {
    c.in = in_at(p.in_offset);
    c.out = out_at(p.out_offset);
    return;
  }
  switch (c.collective) {
    case Collective::kAllGather:
      c.out = out_at(p.out_offset);
      c.in = out_at(p.out_offset + rank * bytes);
      break;
    case Collective::kAllReduce:
      c.in = in_at(p.in_offset);
      c.out = c.in;
      break;
    case Collective::kReduceScatter:
      c.in = in_at(p.in_offset);
      c.out = in_at(p.in_offset + rank * bytes);
      break;
  }
}

std::string describe_placement(const Placement& p) {
  return std::string(p.local ? "local" : "heap") + (p.in_place ? " in place" : "") + " offsets " +
         std::to_string(p.in_offset) + "/" + std::to_string(p.out_offset);
}

}  // namespace

// 2400 calls: all_gather (pull, push, copy_engine, low_latency), all_reduce (every algorithm),
// reduce_scatter (two_shot, two_shot_push, low_latency), with the size, type, placement (heap or local, in place or not) and
// offset (odd for bytes, unaligned for the rest) drawn afresh each call from a generator every
// rank seeds alike; every tenth call replays one of seven CUDA graphs captured beforehand, with
// its inputs changed in place. Another stream keeps the GPU busy with 256 MiB copies and a
// kernel on a quarter of the SMs. Each output is compared with NCCL's on the device.
TEST(interleaved_collectives_under_load) {
  Fixture& fx = Fixture::get();
  if (fx.world() < 2) SKIP("needs two ranks");
  const int world = fx.world();
  constexpr int kCalls = 2400;
  constexpr size_t kMaxBytes = 2 * kMiB;  // per rank, input of all-gather and all-reduce
  constexpr size_t kSlack = 4096;
  const size_t capacity = kMaxBytes * world + kSlack;
  auto comm = fresh_communicator(10000);  // its own: a failure here cannot take fx.comm down
  DeviceBuffer local_in(capacity), local_out(capacity);
  const Buffers buffers{comm->allocate(capacity), comm->allocate(capacity), local_in.ptr, local_out.ptr};
  NcclOracle oracle(capacity, capacity);
  Counters wrong(kCalls);
  std::vector<std::string> names(kCalls);

  // The graphs: fixed calls captured once, replayed between the eager calls.
  struct Graph {
    Call call;
    Placement where;
    std::unique_ptr<CapturedGraph> graph;
  };
  std::vector<Graph> graphs;
  auto add_graph = [&](Collective coll, Algo algo, DataType type, size_t count, const Placement& where) {
    Graph g;
    g.call.collective = coll;
    g.call.algo = algo;
    g.call.type = type;
    g.call.count = count;
    g.where = where;
    place(g.call, where, buffers, fx.rank());
    graphs.push_back(std::move(g));
  };
  add_graph(Collective::kAllGather, Algo::kPull, DataType::kUInt8, 100003, {true, 1, 3, false});
  add_graph(Collective::kAllGather, Algo::kCopyEngine, DataType::kBFloat16, 262144, {false, 0, 0, false});
  add_graph(Collective::kAllReduce, Algo::kTwoShot, DataType::kBFloat16, 65537, {false, 0, 0, false});
  add_graph(Collective::kAllReduce, Algo::kLowLatency, DataType::kFloat32, 3001, {true, 4, 8, false});
  add_graph(Collective::kReduceScatter, Algo::kTwoShotPush, DataType::kBFloat16, 40001, {true, 2, 6, false});
  add_graph(Collective::kAllGather, Algo::kLowLatency, DataType::kUInt8, 30001, {true, 3, 5, false});
  add_graph(Collective::kReduceScatter, Algo::kLowLatency, DataType::kFloat16, 20001, {false, 2, 4, false});

  Flood flood(256 * kMiB, 2, std::max(1, fx.sm_count / 4), 2);
  std::mt19937_64 rng(20240611);  // the same sequence on every rank
  const Algo gather_algos[] = {Algo::kPull, Algo::kPush, Algo::kCopyEngine, Algo::kLowLatency};
  const Algo scatter_algos[] = {Algo::kTwoShot, Algo::kTwoShotPush, Algo::kLowLatency};
  const Algo reduce_algos[] = {Algo::kOneShot,     Algo::kOneShotPush, Algo::kTwoShot,
                               Algo::kTwoShotPush, Algo::kLowLatency,  Algo::kLowLatencyTwoShot};
  const DataType gather_types[] = {DataType::kUInt8, DataType::kBFloat16, DataType::kFloat32};
  const DataType reduce_types[] = {DataType::kBFloat16, DataType::kFloat16, DataType::kFloat32};
  int replays = 0, fallbacks = 0, local_calls = 0, in_place_calls = 0;
  std::string error;
  try {
    for (auto& g : graphs) {
      if (!plannable(g.call, *comm)) throw Error(ErrorCode::kInvalidArgument, "cannot plan " + describe(g.call));
      if (kWarmUpBeforeCapture) launch(g.call, *comm, fx.stream);
      g.graph = std::make_unique<CapturedGraph>(fx.stream, [&] { launch(g.call, *comm, fx.stream); });
    }
    for (int i = 0; i < kCalls; ++i) {
      flood.top_up();
      const uint64_t seed = mix_seed(fx.rank(), 7000000 + i);
      if (i % 10 == 9) {
        Graph& g = graphs[(i / 10) % graphs.size()];
        names[i] = "graph replay of " + describe(g.call) + " (" + describe_placement(g.where) + ")";
        prepare(g.call, seed, oracle, fx.stream, world);
        g.graph->launch(fx.stream);
        check_against_nccl(g.call, oracle, wrong.at(i), fx);
        ++replays;
        continue;
      }
      Call c;
      const int kind = static_cast<int>(rng() % 3);
      c.collective = kind == 0   ? Collective::kAllGather
                     : kind == 1 ? Collective::kAllReduce
                                 : Collective::kReduceScatter;
      if (c.collective == Collective::kAllGather) {
        c.algo = gather_algos[rng() % 4];
        c.type = gather_types[rng() % 3];
      } else {
        c.algo = c.collective == Collective::kAllReduce ? reduce_algos[rng() % 6] : scatter_algos[rng() % 3];
        c.type = reduce_types[rng() % 3];
      }
      const size_t elem = dtype_size(c.type);
      // Sizes of every scale, odd ones included: a third up to 4 KiB, a third up to 256 KiB, the
      // rest up to kMaxBytes (per rank; reduce-scatter's input is world times that).
      const size_t scale = rng() % 3 == 0 ? 4096 : rng() % 2 ? 262144 : kMaxBytes;
      const size_t max_count = scale / elem / (c.collective == Collective::kReduceScatter ? world : 1);
      c.count = 1 + rng() % max_count;
      Placement p;
      p.local = rng() % 2;
      p.in_place = rng() % 4 == 0;
      // Offsets: odd bytes for uint8, whole elements (rarely 16-byte aligned) otherwise. Equal
      // on every rank, so symmetric offsets agree.
      p.in_offset = elem * (rng() % 16) + (elem == 1 ? 1 : 0);
      p.out_offset = elem * (rng() % 16) + (elem == 1 ? 1 : 0);
      c.op = c.collective != Collective::kAllGather && rng() % 8 == 0 ? ReduceOp::kMax : ReduceOp::kSum;
      place(c, p, buffers, fx.rank());
      if (!plannable(c, *comm)) {
        // e.g. low latency past its capacity, two_shot_push all-reduce into local memory.
        ++fallbacks;
        c.algo = Algo::kAuto;
        if (!plannable(c, *comm)) throw Error(ErrorCode::kInvalidArgument, "cannot plan " + describe(c));
      }
      names[i] = describe(c) + " (" + describe_placement(p) + ")";
      local_calls += p.local;
      in_place_calls += p.in_place;
      prepare(c, seed, oracle, fx.stream, world);
      launch(c, *comm, fx.stream);
      check_against_nccl(c, oracle, wrong.at(i), fx);
    }
    comm->synchronize(fx.stream);
  } catch (const Error& e) {
    error = e.what();
  }
  long bad = 0;
  if (!error.empty()) {
    ++bad;
    std::printf("[ CASE ] interleaved_collectives_under_load: rank %d: %s\n", fx.rank(), error.c_str());
  } else {
    const auto w = wrong.read(fx.stream);
    for (int i = 0; i < kCalls; ++i)
      if (w[i] && ++bad <= 10)
        std::printf("[ CASE ] call %d, %s: rank %d: %llu bytes differ from NCCL\n", i, names[i].c_str(), fx.rank(),
                    w[i]);
    if (bad) std::printf("rank %d: %ld of %d calls wrong\n", fx.rank(), bad, kCalls);
  }
  if (fx.rank() == 0)
    std::printf("note: %d calls (%d graph replays, %d local, %d in place, %d fell back to auto), %d flood batches\n",
                kCalls, replays, local_calls, in_place_calls, fallbacks, flood.batches());
  graphs.clear();
  release_communicator(comm);
  EXPECT_EQ(fx.sum(bad), 0L);
  EXPECT_EQ(replays, kCalls / 10);
  EXPECT(fallbacks < kCalls / 4);  // most calls ran the algorithm drawn
}

// all_reduce and reduce_scatter of 256 MiB per rank (reduce-scatter: a 256 MiB input), bf16 and
// fp32, heap and local operands (local ones exceed the 64 MiB staging area of the default
// workspace and run in chunks), counts a few elements short of a power of two (a tail in the last
// chunk), every algorithm that can take the size. Two inputs each: exact values compared with
// NCCL bit for bit, and real-valued random data compared with a float64 reference (and all-reduce
// results compared across ranks: identical bits everywhere).
TEST(reductions_up_to_256_mib) {
  Fixture& fx = Fixture::get();
  if (fx.world() < 2) SKIP("needs two ranks");
  const int world = fx.world();
  constexpr size_t kBytes = 256 * kMiB;
  Buffer* heap_in = fx.comm->allocate(kBytes);
  Buffer* heap_out = fx.comm->allocate(kBytes);
  DeviceBuffer local_in(kBytes), local_out(kBytes);
  NcclOracle oracle(kBytes, kBytes);
  struct Case {
    Call call;
    std::string name;
  };
  std::vector<Case> cases;
  for (DataType type : {DataType::kBFloat16, DataType::kFloat32}) {
    const size_t elements = kBytes / dtype_size(type);
    for (bool local : {false, true}) {
      for (Collective coll : {Collective::kAllReduce, Collective::kReduceScatter}) {
        std::vector<Algo> algos = {Algo::kAuto, Algo::kTwoShot, Algo::kTwoShotPush};
        if (coll == Collective::kAllReduce) {
          algos.push_back(Algo::kOneShot);
          algos.push_back(Algo::kOneShotPush);
        }
        for (Algo algo : algos) {
          Call c;
          c.collective = coll;
          c.algo = algo;
          c.type = type;
          c.count = (coll == Collective::kAllReduce ? elements : elements / world) - 3;
          c.in = local ? OperandArg(local_in.ptr) : sym(heap_in);
          c.out = local ? OperandArg(local_out.ptr) : sym(heap_out);
          cases.push_back({c, describe(c) + (local ? " (local)" : " (heap)")});
        }
      }
    }
    // Local operands of an all-reduce the planner plans, in place and not, at the sizes where its
    // plan changes at 2 ranks with the default workspace (plan.cpp: the one-shot push while a
    // 16 MiB receive slot holds the message, then the one-shot pull, in one piece up to the 64 MiB
    // staging area and in chunks beyond; the case above is 256 MiB out of place).
    for (size_t bytes : {8 * kMiB + 6, 16 * kMiB, 16 * kMiB + 16, 64 * kMiB + 2, 64 * kMiB + 64}) {
      for (bool in_place : {false, true}) {
        Call c;
        c.collective = Collective::kAllReduce;
        c.algo = Algo::kAuto;
        c.type = type;
        c.count = bytes / dtype_size(type);
        c.in = OperandArg(local_in.ptr);
        c.out = in_place ? c.in : OperandArg(local_out.ptr);
        cases.push_back({c, describe(c) + (in_place ? " (local, in place)" : " (local)")});
      }
    }
  }
  Counters exact_wrong(cases.size()), real_wrong(cases.size());
  long bad = 0, ran = 0, differing = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Call& c = cases[i].call;
    if (!fx.all(plannable(c, *fx.comm))) continue;  // two_shot_push all-reduce into local memory
    ++ran;
    std::string error;
    uint64_t digest = 0;
    try {
      prepare(c, mix_seed(fx.rank(), 8000000 + i), oracle, fx.stream, world);
      launch(c, *fx.comm, fx.stream);
      check_against_nccl(c, oracle, exact_wrong.at(i), fx);
      // Real-valued random data: a float64 reference computed on the device from every rank's seed.
      RankSeeds seeds{};
      seeds.world = world;
      for (int r = 0; r < world; ++r) seeds.seed[r] = mix_seed(r, 9000000 + i);
      const size_t in_count = c.collective == Collective::kReduceScatter ? c.count * world : c.count;
      TEST_CUDA(cudaMemsetAsync(address_of(c.out), 0xFF, output_bytes(c, world), fx.stream));
      fill_uniform(address_of(c.in), in_count, c.type, seeds.seed[fx.rank()], fx.stream);
      launch(c, *fx.comm, fx.stream);
      const size_t first = c.collective == Collective::kReduceScatter ? fx.rank() * c.count : 0;
      count_far_from_uniform_sum(address_of(c.out), c.count, first, c.type, seeds, real_wrong.at(i), fx.stream);
      fx.comm->synchronize(fx.stream);
      if (c.collective == Collective::kAllReduce)
        digest = device_digest(address_of(c.out), output_bytes(c, world), fx.stream);
    } catch (const Error& e) {
      error = e.what();
    }
    if (!error.empty()) {
      ++bad;
      std::printf("[ CASE ] %s: rank %d: %s\n", cases[i].name.c_str(), fx.rank(), error.c_str());
    }
    if (c.collective == Collective::kAllReduce && !fx.same_everywhere(digest)) {
      ++differing;
      if (fx.rank() == 0) std::printf("[ CASE ] %s: the ranks' results differ in their bits\n", cases[i].name.c_str());
    }
  }
  const auto exact = exact_wrong.read(fx.stream);
  const auto real = real_wrong.read(fx.stream);
  for (size_t i = 0; i < cases.size(); ++i)
    if (exact[i] || real[i]) {
      ++bad;
      std::printf(
          "[ CASE ] %s: rank %d: %llu bytes differ from NCCL (exact inputs); %llu elements off the float64 "
          "reference (random inputs)\n",
          cases[i].name.c_str(), fx.rank(), exact[i], real[i]);
    }
  fx.comm->free(heap_out);
  fx.comm->free(heap_in);
  EXPECT_EQ(fx.sum(bad), 0L);
  EXPECT_EQ(differing, 0L);
  // Per type: heap 5 + 3, local 4 + 3 (two_shot_push all-reduce needs a heap output), 10 planned.
  EXPECT_EQ(ran, 2L * (8 + 7 + 10));
}
