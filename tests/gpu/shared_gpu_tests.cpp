// The multi-rank protocols on ONE GPU: W ranks as threads of this process, each with its own
// communicator on device 0 (SYMMEM_TEST_SHARED_GPU=1 lifts the one-rank-per-GPU rule). The calls
// pass no SM budget: ranks sharing a GPU plan with a share of its SMs small enough that every
// rank's kernel, and the next one each rank launches early (PDL), are resident at once
// (src/plan/shared_gpu.hpp). Run: symmem_shared_gpu_tests [filter] (worlds 2, 3, 4 and 8;
// SYMMEM_SHARED_GPU_WORLDS="2 4" picks others; SYMMEM_SHARED_GPU_BLOCKS=N passes max_blocks N).
//
// What it covers on a one-GPU machine: the plans, signatures, workspaces and parity halves of every
// SM algorithm and of the copy-engine handshakes, the low-latency line protocol, CUDA graph replays
// between eager calls, and the failure paths (a mismatched call, a rank that never comes), at
// world sizes up to 8, all through the public API. What it cannot: NVLink's memory ordering (all
// traffic stays in one L2), timing, and the copy engines themselves (copies within one GPU run as
// kernels). Results are checked on the device against exact references (pattern bytes, sums of
// small integers, exact in every type and order), with the output poisoned before every call.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/driver_api.hpp"
#include "device_memory.hpp"
#include "plan/algorithms.hpp"
#include "shared_gpu_ranks.hpp"
#include "symmem/fused.hpp"
#include "symmem/symmem.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

#define TEST_CU(expr)                                                                              \
  do {                                                                                             \
    CUresult r_ = (expr);                                                                          \
    if (r_ != CUDA_SUCCESS) ::symmem::test::fail(__FILE__, __LINE__, #expr " failed: " + std::to_string(r_)); \
  } while (0)
constexpr size_t kMaxRankBytes = 2 * kMiB;                  // largest message per rank
constexpr size_t kOperandBytes = 8 * kMaxRankBytes + 4096;  // a world of 8 such slots, plus offsets

// One simulated rank (tests/gpu/shared_gpu_ranks.hpp) with the operands every case uses: two heap
// buffers and two local allocations.
struct Rank : SharedRank {
  Buffer* heap_in = nullptr;
  Buffer* heap_out = nullptr;
  DeviceBuffer local_in{kOperandBytes};
  DeviceBuffer local_out{kOperandBytes};
  void set_up() override {
    heap_in = comm->allocate(kOperandBytes);
    heap_out = comm->allocate(kOperandBytes);
  }
};

void run_ranks(int world, const std::function<void(Rank&)>& body, int64_t timeout_ms = 20000,
               size_t workspace_bytes = size_t(64) << 20) {
  run_shared_ranks<Rank>(world, body, timeout_ms, workspace_bytes);
}

enum class Collective { kAllGather, kAllReduce, kReduceScatter };

// One call of the random sequence every rank draws identically.
struct Step {
  Collective collective = Collective::kAllGather;
  Algo algo = Algo::kAuto;
  DataType type = DataType::kUInt8;
  size_t count = 0;  // all-gather, reduce-scatter: per rank
  bool local = false;
  bool in_place = false;
  size_t in_offset = 0;
  size_t out_offset = 0;
  int blocks = 0;
  bool barrier_after = false;
};

std::string describe(const Step& s) {
  static const char* names[] = {"all_gather", "all_reduce", "reduce_scatter"};
  std::ostringstream o;
  o << names[int(s.collective)] << " " << algo_name(s.algo) << " " << dtype_name(s.type) << " count=" << s.count
    << (s.local ? " local" : " heap") << (s.in_place ? " in place" : "") << " offsets " << s.in_offset << "/"
    << s.out_offset << " blocks=" << s.blocks;
  return o.str();
}

// Forced block counts are drawn up to the most an SM collective launches (kernels/, 160).
constexpr int kDrawnBlocks = 160;

// kAuto and every algorithm of `c` that runs inside one node, from the table of algorithms: an
// algorithm added there is drawn here without an edit.
const std::vector<Algo>& algorithms_of(Collective c) {
  static const std::array<std::vector<Algo>, 3> lists = [] {
    std::array<std::vector<Algo>, 3> all;
    const detail::Collective table_name[] = {detail::Collective::kAllGather, detail::Collective::kAllReduce,
                                             detail::Collective::kReduceScatter};
    for (int i = 0; i < 3; ++i) {
      all[i].push_back(Algo::kAuto);
      for (const detail::Algorithm* a = detail::algorithms_begin(); a != detail::algorithms_end(); ++a)
        if (a->collective == table_name[i] && !a->across_nodes) all[i].push_back(a->algo);
    }
    return all;
  }();
  return lists[int(c)];
}

Step random_step(std::mt19937_64& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % uint64_t(n)); };
  Step s;
  s.collective = static_cast<Collective>(pick(3));
  static const DataType gather_types[] = {DataType::kUInt8, DataType::kFloat16, DataType::kFloat32};
  static const DataType reduce_types[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                                          DataType::kInt32};
  const std::vector<Algo>& algos = algorithms_of(s.collective);
  s.algo = algos[pick(int(algos.size()))];
  s.type = s.collective == Collective::kAllGather ? gather_types[pick(3)] : reduce_types[pick(4)];
  // Message bytes log-uniform in [1, kMaxRankBytes]: mostly small (the low-latency range).
  const double log_bytes = std::uniform_real_distribution<double>(0.0, std::log2(double(kMaxRankBytes)))(rng);
  const size_t elem = dtype_size(s.type);
  s.count = std::max<size_t>(1, static_cast<size_t>(std::exp2(log_bytes)) / elem);
  s.local = pick(3) == 0;
  s.in_place = pick(4) == 0;
  s.in_offset = pick(2) ? 0 : elem * pick(256 / int(elem));
  s.out_offset = pick(2) ? 0 : elem * pick(256 / int(elem));
  s.blocks = pick(3) == 0 ? 1 + pick(kDrawnBlocks) : 0;  // the planner clamps it to the share
  s.barrier_after = pick(16) == 0;
  return s;
}

struct Operands {
  Operand out;
  Operand in;
};

// The operands of `s` on `r`. In place: all-gather's input is this rank's slot of the output,
// reduce-scatter's output this rank's slice of the input, all-reduce's output its input.
Operands place(const Step& s, const Rank& r) {
  const size_t bytes = s.count * dtype_size(s.type);
  auto in_at = [&](size_t offset) {
    return s.local ? Operand(static_cast<char*>(r.local_in.ptr) + offset) : Operand(*r.heap_in, offset);
  };
  auto out_at = [&](size_t offset) {
    return s.local ? Operand(static_cast<char*>(r.local_out.ptr) + offset) : Operand(*r.heap_out, offset);
  };
  if (!s.in_place) return {out_at(s.out_offset), in_at(s.in_offset)};
  switch (s.collective) {
    case Collective::kAllGather: return {out_at(s.out_offset), out_at(s.out_offset + r.rank * bytes)};
    case Collective::kAllReduce: return {in_at(s.in_offset), in_at(s.in_offset)};
    case Collective::kReduceScatter: return {in_at(s.in_offset + r.rank * bytes), in_at(s.in_offset)};
  }
  throw Failure("place: unknown collective");
}

CollectiveOptions options_of(const Step& s, int max_blocks) {
  return CollectiveOptions{s.algo, s.blocks, max_blocks};
}

bool plannable(const Step& s, const Rank& r, int max_blocks) {
  const Operands ops = place(s, r);
  const CollectiveOptions o = options_of(s, max_blocks);
  try {
    switch (s.collective) {
      case Collective::kAllGather: describe_all_gather(ops.out, ops.in, s.count, s.type, *r.comm, o); break;
      case Collective::kAllReduce: describe_all_reduce(ops.out, ops.in, s.count, s.type, *r.comm, o); break;
      case Collective::kReduceScatter: describe_reduce_scatter(ops.out, ops.in, s.count, s.type, *r.comm, o); break;
    }
  } catch (const Error&) {
    return false;
  }
  return true;
}

// Poison the output, fill the input for (rank, iteration), run, count wrong output elements into
// *mismatches: all on the rank's stream, no host synchronisation.
void run_step(const Step& s, Rank& r, uint64_t iteration, int max_blocks, unsigned long long* mismatches) {
  const Operands ops = place(s, r);
  const size_t elem = dtype_size(s.type);
  const size_t bytes = s.count * elem;
  const int world = r.world;
  const uint64_t seed = pattern_seed(r.rank, iteration);
  void* out = ops.out.ptr();
  void* in = ops.in.ptr();
  const CollectiveOptions o = options_of(s, max_blocks);
  switch (s.collective) {
    case Collective::kAllGather:
      TEST_CUDA(cudaMemsetAsync(out, 0xA5, bytes * world, r.stream));
      fill_pattern(in, bytes, seed, r.stream);
      all_gather(ops.out, ops.in, s.count, s.type, *r.comm, r.stream, o);
      count_gather_mismatches(out, bytes, world, iteration, mismatches, r.stream);
      break;
    case Collective::kAllReduce:
      if (!s.in_place) TEST_CUDA(cudaMemsetAsync(out, 0xFF, bytes, r.stream));
      fill_small_integers(in, s.count, s.type, seed, r.stream);
      all_reduce(ops.out, ops.in, s.count, s.type, ReduceOp::kSum, *r.comm, r.stream, o);
      count_sum_mismatches(out, s.count, 0, s.type, world, iteration, mismatches, r.stream);
      break;
    case Collective::kReduceScatter:
      if (!s.in_place) TEST_CUDA(cudaMemsetAsync(out, 0xFF, bytes, r.stream));
      fill_small_integers(in, s.count * world, s.type, seed, r.stream);
      reduce_scatter(ops.out, ops.in, s.count, s.type, ReduceOp::kSum, *r.comm, r.stream, o);
      count_sum_mismatches(out, s.count, size_t(r.rank) * s.count, s.type, world, iteration, mismatches, r.stream);
      break;
  }
  if (s.barrier_after) r.comm->barrier(r.stream);
}

// The steps every rank runs (identical on every rank: drawn from the same seed, filtered by
// describe_*, whose answer depends only on what every rank shares).
// `copy_engine` false: no copy-engine call (its handshakes are stream waits, which beyond four
// ranks in one process may share a hardware queue with a peer's work: a test artefact, see the
// missing-rank test).
std::vector<Step> draw_steps(size_t n, uint64_t seed, const Rank& r, int max_blocks, bool copy_engine = true) {
  std::mt19937_64 rng(seed);
  std::vector<Step> steps;
  while (steps.size() < n) {
    Step s = random_step(rng);
    if (!copy_engine && s.algo == Algo::kCopyEngine) continue;
    if (!plannable(s, r, max_blocks)) {
      s.algo = Algo::kAuto;
      if (!plannable(s, r, max_blocks)) continue;
    }
    steps.push_back(s);
  }
  return steps;
}

void expect_no_mismatches(const std::vector<Step>& steps, const std::vector<unsigned long long>& counts,
                          const Rank& r, const std::string& what) {
  std::string report;
  int shown = 0;
  size_t bad = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (counts[i] == 0) continue;
    ++bad;
    if (shown++ < 5) report += "\n  call " + std::to_string(i) + " (" + describe(steps[i]) + "): " +
                                std::to_string(counts[i]) + " wrong";
  }
  if (bad)
    throw Failure(what + ": rank " + std::to_string(r.rank) + ": " + std::to_string(bad) + " of " +
                  std::to_string(steps.size()) + " calls wrong" + report);
}

// Runs `steps` on r, back to back, and fails naming the calls that went wrong. Synchronised every
// shared_gpu_window(world, 3) calls (a poisoning, the call, its check: three launches each): the
// ranks share one CUDA context, whose launch queue a rank far ahead can fill with work that waits
// for a rank behind it, which then cannot launch (seen at world 8 without the windows; separate
// processes have separate queues). A failure also names the calls it happened among.
void run_steps_checked(const std::vector<Step>& steps, Rank& r, int max_blocks, const std::string& what) {
  Counters counters(steps.size(), r.stream);
  const size_t window = size_t(shared_gpu_window(r.world, 3));
  for (size_t begin = 0; begin < steps.size(); begin += window) {
    const size_t end = std::min(steps.size(), begin + window);
    for (size_t i = begin; i < end; ++i) run_step(steps[i], r, i, max_blocks, counters.at(i));
    try {
      r.comm->synchronize(r.stream);
    } catch (const Error& e) {
      std::string calls;
      for (size_t i = begin; i < end; ++i) calls += "\n  call " + std::to_string(i) + ": " + describe(steps[i]);
      throw Failure(std::string(e.what()) + "\n among calls " + std::to_string(begin) + ".." +
                    std::to_string(end - 1) + calls);
    }
  }
  expect_no_mismatches(steps, counters.read(r.stream), r, what);
}

// Thousands of back-to-back calls per world: every collective and algorithm, sizes from 1 byte
// to 2 MiB per rank, every type, heap and local operands, in place or not, odd offsets, forced
// block counts, barriers in between, all checked exactly on the device.
TEST(shared_gpu_random_calls_match_references) {
  for (int world : shared_gpu_worlds()) {
    const int max_blocks = max_blocks_for_calls();
    const size_t calls = world >= 8 ? 600 : 1200;
    run_ranks(world, [&](Rank& r) {
      const std::vector<Step> steps = draw_steps(calls, 0x5EED0000ull + world, r, max_blocks);
      run_steps_checked(steps, r, max_blocks, "random calls");
    });
  }
}

// The pipelined reductions in several rounds: the smallest workspace (4 MiB: four 2 MiB areas, the
// heap's granule) and messages up to 16 MiB, half of the pipelined calls from 1 MiB, so that
// blocks go through up to 8 rounds and both slot parities, with forced block counts from 1 up, odd
// counts (short and empty last pieces, scalar tails), misaligned local operands (the scalar
// kernel), in place, and drawn between them other calls that use the same areas: two-shot push
// (push_slots), one-shot push (the receive area), two-shot and push all-gather (staging_out), pull
// all-gather and the low-latency all-reduce of a misaligned input (staging_in), back to back
// without synchronisation.
TEST(shared_gpu_pipelined_reductions_in_many_rounds) {
  constexpr size_t kWorkspace = 4 * kMiB;
  for (int world : shared_gpu_worlds()) {
    const int max_blocks = max_blocks_for_calls();
    const size_t calls = world >= 8 ? 150 : 300;
    run_ranks(
        world,
        [&](Rank& r) {
          std::mt19937_64 rng(0x919E0000ull + world);
          auto pick = [&](int n) { return static_cast<int>(rng() % uint64_t(n)); };
          static const DataType types[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                                           DataType::kInt32};
          static const Algo neighbours[] = {Algo::kTwoShotPush, Algo::kOneShotPush, Algo::kTwoShot,
                                            Algo::kLowLatency,  Algo::kAuto};
          std::vector<Step> steps;
          while (steps.size() < calls) {
            Step s;
            s.collective = pick(2) ? Collective::kAllReduce : Collective::kReduceScatter;
            const bool pipelined = pick(4) != 0;
            s.algo = pipelined ? Algo::kPipelined : neighbours[pick(5)];
            s.type = types[pick(4)];
            if (!pipelined && pick(3) == 0) {  // an all-gather through staging_in or staging_out
              s.collective = Collective::kAllGather;
              s.algo = pick(2) ? Algo::kPull : Algo::kPush;
              s.type = DataType::kFloat16;
            }
            const size_t elem = dtype_size(s.type);
            // All-reduce up to 16 MiB; reduce-scatter and all-gather up to 16 MiB over the world.
            const size_t most = (8 * kMaxRankBytes) / elem / (s.collective == Collective::kAllReduce ? 1 : world);
            const double low = pipelined && pick(2) ? std::log2(double(kMiB / elem)) : 0.0;
            const double log_count =
                std::uniform_real_distribution<double>(std::min(low, std::log2(double(most))), std::log2(double(most)))(rng);
            s.count = std::max<size_t>(1, std::min(most, static_cast<size_t>(std::exp2(log_count)) + pick(7)));
            s.local = pick(3) != 0;
            s.in_place = pick(4) == 0;
            s.in_offset = pick(3) ? 0 : elem * (1 + pick(7));
            s.out_offset = pick(3) ? 0 : elem * (1 + pick(7));
            const size_t in_elems = s.count * (s.collective == Collective::kReduceScatter ? world : 1);
            const size_t out_elems = s.count * (s.collective == Collective::kAllGather ? world : 1);
            if (s.in_offset + in_elems * elem > kOperandBytes || s.out_offset + out_elems * elem > kOperandBytes)
              continue;
            s.blocks = pick(2) ? 1 + pick(pick(2) ? 4 : 24) : 0;
            s.barrier_after = pick(16) == 0;
            if (!plannable(s, r, max_blocks)) continue;
            steps.push_back(s);
          }
          run_steps_checked(steps, r, max_blocks, "pipelined reductions");
        },
        60000, kWorkspace);
  }
}

// The largest grids automatic plans make, back to back with no synchronisation between them (so
// that each rank's next kernel is resident early, PDL), and no SM budget from the caller: every
// rank's blocks and early successors must fit the GPU together at every world size, whatever the
// planner asks for (two-shot and pull at 64 blocks, low latency at 128). With a share of
// sm_count / (W + 1) per rank, four ranks' 26-block two-shot all-reduces and their successors
// would need 208 SMs of 132 and wait for a rank that could not start.
TEST(shared_gpu_automatic_plans_need_no_block_budget) {
  constexpr size_t kMaxOperandElements = kMaxRankBytes / 4;  // float32, per rank slot
  for (int world : shared_gpu_worlds()) {
    run_ranks(world, [&](Rank& r) {
      std::vector<Step> steps;
      auto add = [&](Collective c, Algo algo, size_t count) {
        Step s;
        s.collective = c;
        s.algo = algo;
        s.type = DataType::kFloat32;
        s.count = count;
        steps.push_back(s);
      };
      for (int round = 0; round < 8; ++round) {
        add(Collective::kAllReduce, Algo::kAuto, kMaxOperandElements * 4);  // 8 MiB: two-shot, 64 blocks
        add(Collective::kAllReduce, Algo::kLowLatency, size_t(1) << 18);    // 1 MiB: 128 blocks asked
        add(Collective::kReduceScatter, Algo::kAuto, kMaxOperandElements);  // 2 MiB per rank
        add(Collective::kAllGather, Algo::kAuto, kMaxOperandElements);      // 2 MiB per rank
        add(Collective::kAllGather, Algo::kLowLatency, size_t(1) << 18);    // 128 blocks asked
        add(Collective::kAllReduce, Algo::kOneShot, kMaxOperandElements);
      }
      Counters counters(steps.size(), r.stream);
      for (size_t i = 0; i < steps.size(); ++i) run_step(steps[i], r, i, max_blocks_for_calls(), counters.at(i));
      r.comm->synchronize(r.stream);
      expect_no_mismatches(steps, counters.read(r.stream), r, "automatic plans");
    });
  }
}

// Graph replays between eager calls: a captured sequence (poison, fill, call, check in the graph)
// replayed 30 times, with eager calls of other algorithms before every replay, so that the call
// counter's parity, the epochs and the handshakes advance differently between replays.
TEST(shared_gpu_graph_replays_between_eager_calls) {
  for (int world : shared_gpu_worlds()) {
    const int max_blocks = max_blocks_for_calls();
    run_ranks(world, [&](Rank& r) {
      // Beyond four ranks: no copy-engine calls, and each replay's work finished before the next
      // (a host far ahead filled the one launch queue of the process: see shared_gpu_window). Seen on one
      // H100 at 8 ranks: a timeout, or a mismatch read from a peer stalled in an earlier call.
      const bool crowded = world > 4;
      const std::vector<Step> captured = draw_steps(8, 0x6AA9ull + world, r, max_blocks, !crowded);
      const std::vector<Step> eager = draw_steps(3 * 30, 0xEA6E6ull + world, r, max_blocks, !crowded);
      Counters graph_counters(captured.size(), r.stream);
      Counters eager_counters(eager.size(), r.stream);
      // Warm up eagerly (workspaces, first calls), then capture.
      for (size_t i = 0; i < 3; ++i) run_step(eager[i], r, 1000 + i, max_blocks, eager_counters.at(i));
      CapturedGraph graph(r.stream, [&] {
        for (size_t i = 0; i < captured.size(); ++i) run_step(captured[i], r, i, max_blocks, graph_counters.at(i));
      });
      for (int replay = 0; replay < 30; ++replay) {
        for (size_t j = 0; j < 3; ++j) {
          const size_t i = size_t(replay) * 3 + j;
          if (replay > 0) run_step(eager[i], r, 1000 + i, max_blocks, eager_counters.at(i));
        }
        graph.launch(r.stream);
        if (crowded || (replay + 1) % 5 == 0) r.comm->synchronize(r.stream);
      }
      r.comm->synchronize(r.stream);
      expect_no_mismatches(captured, graph_counters.read(r.stream), r, "captured calls");
      expect_no_mismatches(eager, eager_counters.read(r.stream), r, "eager calls between replays");
    });
  }
}

// max and min of floating types ignore NaN, as NCCL's (fmaxf / __hmax): the result is NaN only
// where every rank holds NaN, whatever rank holds it and whichever algorithm runs (a plain
// (a > b ? a : b) would make the result depend on which rank held the NaN). Inputs
// are small integers (exact in every type) with NaN at places that differ by rank, and everywhere
// at every 97th element; compared on the host with the bits of the reference's non-NaN results.
namespace {

float nan_test_value(int rank, size_t i, int world) {
  if (i % 97 == 0) return NAN;                                  // NaN on every rank
  if (i % size_t(world + 1) == size_t(rank)) return NAN;       // NaN on this rank only
  return float(int((i * 7919 + size_t(rank) * 104729) % 17) - 8);  // a small integer
}

uint16_t to_bits16(float x, DataType type) {
  if (type == DataType::kFloat16) {
    const __half h = __float2half(x);
    return *reinterpret_cast<const uint16_t*>(&h);
  }
  const __nv_bfloat16 b = __float2bfloat16(x);
  return *reinterpret_cast<const uint16_t*>(&b);
}

float from_bits16(uint16_t bits, DataType type) {
  if (type == DataType::kFloat16) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

// count values of `type` (float32, float16 or bfloat16), value i being value_of(i) rounded to it.
std::vector<uint8_t> encoded(size_t count, DataType type, const std::function<float(size_t)>& value_of) {
  std::vector<uint8_t> bytes(count * dtype_size(type));
  for (size_t i = 0; i < count; ++i) {
    const float v = value_of(i);
    if (type == DataType::kFloat32) {
      std::memcpy(&bytes[i * 4], &v, 4);
    } else {
      const uint16_t b = to_bits16(v, type);
      std::memcpy(&bytes[i * 2], &b, 2);
    }
  }
  return bytes;
}

bool is_nan_bits(uint16_t bits, DataType type) {
  return type == DataType::kFloat16 ? (bits & 0x7c00) == 0x7c00 && (bits & 0x03ff)
                                    : (bits & 0x7f80) == 0x7f80 && (bits & 0x007f);
}

}  // namespace

TEST(shared_gpu_max_min_ignore_nan_as_nccl) {
  const Algo algos[] = {Algo::kAuto, Algo::kOneShot, Algo::kTwoShot, Algo::kOneShotPush, Algo::kTwoShotPush,
                        Algo::kLowLatency, Algo::kLowLatencyTwoShot};
  const DataType types[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};
  constexpr size_t kCount = 40000;  // a vector body and a scalar tail
  for (int world : shared_gpu_worlds()) {
    run_ranks(world, [&](Rank& r) {
      for (DataType type : types) {
        const std::vector<uint8_t> input =
            encoded(kCount, type, [&](size_t i) { return nan_test_value(r.rank, i, world); });
        for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
          for (Algo algo : algos) {
            // Heap operands (symmetric): every algorithm takes them.
            TEST_CUDA(cudaMemcpyAsync(r.heap_in->ptr(), input.data(), input.size(), cudaMemcpyHostToDevice, r.stream));
            TEST_CUDA(cudaMemsetAsync(r.heap_out->ptr(), 0xEE, input.size(), r.stream));  // poison
            const CollectiveOptions o{algo, 0, max_blocks_for_calls()};
            all_reduce(Operand(r.heap_out, 0), Operand(r.heap_in, 0), kCount, type, op, *r.comm, r.stream, o);
            r.comm->synchronize(r.stream);
            std::vector<uint8_t> got(input.size());
            TEST_CUDA(cudaMemcpy(got.data(), r.heap_out->ptr(), got.size(), cudaMemcpyDeviceToHost));
            size_t wrong = 0;
            for (size_t i = 0; i < kCount; ++i) {
              bool any = false;
              float best = 0;
              for (int q = 0; q < world; ++q) {
                const float v = nan_test_value(q, i, world);
                if (std::isnan(v)) continue;
                best = !any ? v : op == ReduceOp::kMax ? std::max(best, v) : std::min(best, v);
                any = true;
              }
              if (type == DataType::kFloat32) {
                float g;
                std::memcpy(&g, &got[i * 4], 4);
                wrong += any ? !(g == best) : !std::isnan(g);
              } else {
                uint16_t g;
                std::memcpy(&g, &got[i * 2], 2);
                wrong += any ? g != to_bits16(best, type) : !is_nan_bits(g, type);
              }
            }
            if (wrong)
              throw Failure(std::string(op == ReduceOp::kMax ? "max " : "min ") + dtype_name(type) + " " +
                            algo_name(algo) + ": " + std::to_string(wrong) + " of " + std::to_string(kCount) +
                            " elements differ from NCCL's NaN rule");
          }
        }
      }
    });
  }
}

// An average is the kernels' float32 sum times 1 / world (a correctly rounded float32), rounded
// once to the type: compared bit for bit with that computation on the host (float32 sum in rank
// order, one product, one rounding), for every algorithm of the all-reduce and the reduce-scatter,
// in place too. Inputs up to 40000 in magnitude: float16 sums of 2 or more ranks overflow its
// range (65504) where the averages do not, so a sum rounded to float16 first would show as inf.
namespace {

float average_test_value(int rank, size_t i, DataType type) {
  const uint64_t h = (i * 0x9E3779B97F4A7C15ull) ^ (uint64_t(rank + 1) * 0xD1B54A32D192ED03ull);
  const float v = float(int64_t(h >> 40) % 80000 - 40000) + float(h & 0xFF) / 256.0f;
  return type == DataType::kFloat32 ? v : from_bits16(to_bits16(v, type), type);  // exact in the type
}

}  // namespace

TEST(shared_gpu_averages_scale_the_float32_sum_once) {
  const Algo all_reduce_algos[] = {Algo::kAuto,        Algo::kOneShot,    Algo::kTwoShot,
                                   Algo::kOneShotPush, Algo::kTwoShotPush, Algo::kLowLatency,
                                   Algo::kLowLatencyTwoShot};
  const Algo reduce_scatter_algos[] = {Algo::kAuto, Algo::kPull, Algo::kPush, Algo::kLowLatency};
  const DataType types[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};
  constexpr size_t kCount = 40000;  // all-reduce: a vector body and a scalar tail
  constexpr size_t kSlice = 5003;   // reduce-scatter: elements per rank (odd: a tail in every slice)
  for (int world : shared_gpu_worlds()) {
    run_ranks(world, [&](Rank& r) {
      for (DataType type : types) {
        const size_t elem = dtype_size(type);
        auto check = [&](const std::string& what, size_t count, size_t first, const void* out_device) {
          std::vector<uint8_t> got(count * elem);
          TEST_CUDA(cudaMemcpy(got.data(), out_device, got.size(), cudaMemcpyDeviceToHost));
          size_t wrong = 0, first_wrong = count;
          for (size_t i = 0; i < count; ++i) {
            float acc = average_test_value(0, first + i, type);
            for (int q = 1; q < world; ++q) acc += average_test_value(q, first + i, type);
            const float avg = acc * (1.0f / float(world));
            bool ok;
            if (type == DataType::kFloat32) {
              float g;
              std::memcpy(&g, &got[i * 4], 4);
              ok = std::memcmp(&g, &avg, 4) == 0;
            } else {
              uint16_t g;
              std::memcpy(&g, &got[i * 2], 2);
              ok = g == to_bits16(avg, type);
            }
            if (!ok && wrong++ == 0) first_wrong = i;
          }
          if (wrong)
            throw Failure("avg " + std::string(dtype_name(type)) + " " + what + ": " + std::to_string(wrong) + " of " +
                          std::to_string(count) + " elements differ from the float32 sum times 1 / world, first at " +
                          std::to_string(first_wrong));
        };
        auto upload = [&](size_t count) {
          const std::vector<uint8_t> input =
              encoded(count, type, [&](size_t i) { return average_test_value(r.rank, i, type); });
          TEST_CUDA(cudaMemcpyAsync(r.heap_in->ptr(), input.data(), input.size(), cudaMemcpyHostToDevice, r.stream));
          TEST_CUDA(cudaMemcpyAsync(r.local_in.ptr, input.data(), input.size(), cudaMemcpyHostToDevice, r.stream));
        };
        upload(kCount);
        for (Algo algo : all_reduce_algos) {
          TEST_CUDA(cudaMemsetAsync(r.heap_out->ptr(), 0xEE, kCount * elem, r.stream));  // poison
          const CollectiveOptions o{algo, 0, max_blocks_for_calls()};
          all_reduce(Operand(r.heap_out, 0), Operand(r.heap_in, 0), kCount, type, ReduceOp::kAvg, *r.comm, r.stream, o);
          r.comm->synchronize(r.stream);
          check(std::string("all_reduce ") + algo_name(algo) + " heap", kCount, 0, r.heap_out->ptr());
        }
        TEST_CUDA(cudaMemsetAsync(r.local_out.ptr, 0xEE, kCount * elem, r.stream));
        all_reduce(Operand(r.local_out.ptr), Operand(r.local_in.ptr), kCount, type, ReduceOp::kAvg, *r.comm, r.stream,
                   CollectiveOptions{Algo::kAuto, 0, max_blocks_for_calls()});
        r.comm->synchronize(r.stream);
        check("all_reduce auto local", kCount, 0, r.local_out.ptr);
        for (Algo algo : all_reduce_algos) {  // in place: the heap input
          upload(kCount);
          all_reduce(Operand(r.heap_in, 0), Operand(r.heap_in, 0), kCount, type, ReduceOp::kAvg, *r.comm, r.stream,
                     CollectiveOptions{algo, 0, max_blocks_for_calls()});
          r.comm->synchronize(r.stream);
          check(std::string("all_reduce ") + algo_name(algo) + " in place", kCount, 0, r.heap_in->ptr());
        }
        for (Algo algo : reduce_scatter_algos) {
          upload(kSlice * size_t(world));  // the in-place call below overwrites this rank's slice
          TEST_CUDA(cudaMemsetAsync(r.heap_out->ptr(), 0xEE, kSlice * elem, r.stream));
          const CollectiveOptions o{algo, 0, max_blocks_for_calls()};
          reduce_scatter(Operand(r.heap_out, 0), Operand(r.heap_in, 0), kSlice, type, ReduceOp::kAvg, *r.comm,
                         r.stream, o);
          r.comm->synchronize(r.stream);
          check(std::string("reduce_scatter ") + algo_name(algo), kSlice, size_t(r.rank) * kSlice, r.heap_out->ptr());
          // In place: this rank's slice of the input is the output.
          upload(kSlice * size_t(world));
          const size_t mine = size_t(r.rank) * kSlice * elem;
          reduce_scatter(Operand(r.heap_in, mine), Operand(r.heap_in, 0), kSlice, type, ReduceOp::kAvg, *r.comm,
                         r.stream, o);
          r.comm->synchronize(r.stream);
          check(std::string("reduce_scatter ") + algo_name(algo) + " in place", kSlice, size_t(r.rank) * kSlice,
                static_cast<char*>(r.heap_in->ptr()) + mine);
        }
      }
      // Integer averages are refused alike on every rank (symmem averages floating types only).
      EXPECT_ERROR(all_reduce(Operand(r.heap_out, 0), Operand(r.heap_in, 0), 64, DataType::kInt32, ReduceOp::kAvg,
                              *r.comm, r.stream),
                   ErrorCode::kInvalidArgument, "avg needs a floating type");
    });
  }
}

// A call that differs on one rank (its count) fails on every rank, with an error, in time.
TEST(shared_gpu_mismatched_call_fails_everywhere) {
  for (int world : shared_gpu_worlds()) {
    for (Algo algo : {Algo::kLowLatency, Algo::kOneShot, Algo::kTwoShotPush}) {
      std::mutex mutex;
      std::vector<std::string> outcomes(world);
      run_ranks(
          world,
          [&](Rank& r) {
            const size_t count = 4096 + (r.rank == world - 1 ? 8 : 0);
            const CollectiveOptions o{algo, 0, max_blocks_for_calls()};
            const auto start = std::chrono::steady_clock::now();
            std::string outcome = "no error";
            try {
              all_reduce(Operand(*r.heap_out), Operand(*r.heap_in), count, DataType::kFloat32, ReduceOp::kSum,
                         *r.comm, r.stream, o);
              r.comm->synchronize(r.stream);
            } catch (const Error& e) {
              outcome = e.code() == ErrorCode::kMismatch || e.code() == ErrorCode::kAborted ||
                                e.code() == ErrorCode::kTimeout
                            ? "error"
                            : std::string("unexpected error: ") + e.what();
            }
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            if (seconds > 15) outcome += " after " + std::to_string(seconds) + " s";
            {
              std::lock_guard<std::mutex> lock(mutex);
              outcomes[r.rank] = outcome;
            }
            // The communicator is unusable now: release it without the collective close, all
            // together (as in the missing-rank test below), holding no lock a peer needs to get here.
            TEST_CUDA(cudaStreamSynchronize(r.stream));
            wait_for_every_rank(r);
            r.comm.reset();
          },
          5000);
      for (int r = 0; r < world; ++r)
        if (outcomes[r] != "error")
          throw Failure(std::string("all_reduce ") + algo_name(algo) + ", world " + std::to_string(world) +
                        ", rank " + std::to_string(r) + ": " + outcomes[r]);
    }
  }
}

// A rank that never comes: every other rank's call fails with an error that names it (kTimeout
// where the wait was on it, kAborted where another rank's failure released the wait), in time.
TEST(shared_gpu_missing_rank_is_named_in_time) {
  struct Case {
    const char* name;
    std::function<void(Rank&)> call;
  };
  const Case cases[] = {
      {"all_gather low_latency",
       [](Rank& r) {
         const CollectiveOptions o{Algo::kLowLatency};
         all_gather(Operand(*r.heap_out), Operand(*r.heap_in), 1024, DataType::kFloat32, *r.comm, r.stream, o);
       }},
      {"reduce_scatter low_latency",
       [](Rank& r) {
         const CollectiveOptions o{Algo::kLowLatency};
         reduce_scatter(Operand(*r.heap_out), Operand(*r.heap_in), 1024, DataType::kBFloat16, ReduceOp::kSum, *r.comm,
                        r.stream, o);
       }},
      {"all_gather pull",
       [](Rank& r) {
         const CollectiveOptions o{Algo::kPull};
         all_gather(Operand(*r.heap_out), Operand(*r.heap_in), 4096, DataType::kFloat32, *r.comm, r.stream, o);
       }},
      {"all_gather copy_engine",
       [](Rank& r) {
         const CollectiveOptions o{Algo::kCopyEngine};
         all_gather(Operand(*r.heap_out), Operand(*r.heap_in), 4096, DataType::kFloat32, *r.comm, r.stream, o);
       }},
  };
  constexpr int64_t kTimeoutMs = 3000;
  for (int world : shared_gpu_worlds()) {
    for (const Case& c : cases) {
      // Beyond 4 ranks in one process the ranks' streams share hardware queues, and a rank's ready
      // write can queue behind another rank's stream wait for the absent rank (seen at 8: the
      // waits then name that rank). Separate processes have queues of their own. (At 4, on 4 x
      // H100 at c3037a8, a rank named a live rank whose copy-engine wait the abort had released:
      // that wait now names whom it waited for, and the message follows it to the absent rank.)
      if (world > 4 && std::string(c.name) == "all_gather copy_engine") continue;
      std::mutex mutex;
      std::vector<std::string> outcomes(world);
      run_ranks(
          world,
          [&](Rank& r) {
            const int missing = world - 1;
            std::string outcome = "absent";
            if (r.rank != missing) {
              const auto start = std::chrono::steady_clock::now();
              try {
                c.call(r);
                r.comm->synchronize(r.stream);
                outcome = "no error";
              } catch (const Error& e) {
                const std::string text = e.what();
                const bool named = text.find("rank " + std::to_string(missing)) != std::string::npos;
                outcome = (e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kAborted) && named
                              ? "error"
                              : "unexpected error: " + text;
              }
              const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
              if (seconds > 3.0 * kTimeoutMs / 1000) outcome += " after " + std::to_string(seconds) + " s";
            }
            // Every communicator of the group is unusable now: release it without the collective close,
            // all together (a rank releasing while a peer has yet to launch holds up the peer's launch
            // on the shared GPU: seen on one H100, a peer then named a live rank).
            TEST_CUDA(cudaStreamSynchronize(r.stream));
            wait_for_every_rank(r);
            r.comm.reset();
            std::lock_guard<std::mutex> lock(mutex);
            outcomes[r.rank] = outcome;
          },
          kTimeoutMs);
      for (int r = 0; r + 1 < world; ++r)
        if (outcomes[r] != "error")
          throw Failure(std::string(c.name) + ", world " + std::to_string(world) + ", rank " + std::to_string(r) +
                        " (rank " + std::to_string(world - 1) + " absent): " + outcomes[r]);
    }
  }
}

// The fused ops' shapes (rows per rank, n, k): whole 128 x 256 tiles; shards and n, k off the
// tile grid; tiny. Small integers keep every sum exact, so results compare bit by bit.
struct FusedShape {
  int rows, n, k;
};
constexpr FusedShape kFusedShapes[] = {{256, 512, 1024}, {200, 264, 520}, {8, 8, 8}};
constexpr DataType kFusedTypes[] = {DataType::kFloat16, DataType::kBFloat16};
constexpr int kFusedRepeats = 3;  // back to back, reusing flags and counters

std::string fused_case(const char* op, DataType type, const FusedShape& shape) {
  return std::string(op) + " " + dtype_name(type) + " rows=" + std::to_string(shape.rows) +
         " n=" + std::to_string(shape.n) + " k=" + std::to_string(shape.k);
}

// Runs `body` on every world, skipping (with the reason) when this build or GPU has no fused GEMM.
void for_fused_worlds(const char* what, const std::function<void(Rank&, std::string* unsupported)>& body) {
  for (int world : shared_gpu_worlds()) {
    std::mutex mutex;
    std::string unsupported;
    run_ranks(world, [&](Rank& r) {
      std::string why;
      body(r, &why);
      std::lock_guard<std::mutex> lock(mutex);
      if (!why.empty()) unsupported = why;
    });
    if (!unsupported.empty()) SKIP(std::string(what) + ": " + unsupported);
  }
}

// The most bytes `bytes(shape)` takes over kFusedShapes (16-bit elements).
size_t largest_over_shapes(const std::function<size_t(const FusedShape&)>& bytes) {
  size_t most = 0;
  for (const FusedShape& shape : kFusedShapes) most = std::max(most, bytes(shape));
  return most;
}

constexpr size_t kFusedCases = std::size(kFusedShapes) * std::size(kFusedTypes);

// Every buffer of one rank's fused cases, for the largest shape, allocated before the ranks' first
// wait and freed after their last (shared_gpu_ranks.hpp: an allocation or a free between the
// ranks' calls can hold up a peer's launches until its calls time out), and `slots` counters per
// case (shape, type).
struct FusedBuffers {
  Rank& r;
  Buffer* gathered;   // [rows * world x k]
  Buffer* workspace;  // matmul_reduce_scatter's
  DeviceBuffer a_shard, a, b, b_row, c, c_shard, c_shard_row;
  Counters wrong;
  const size_t slots;

  FusedBuffers(Rank& rank, size_t slots_per_case)
      : r(rank),
        gathered(r.comm->allocate(largest([](const FusedShape& s, int w) { return size_t(s.rows) * w * s.k; }))),
        workspace(r.comm->allocate(largest_over_shapes([&](const FusedShape& s) {
          return matmul_reduce_scatter_workspace_bytes(int64_t(s.rows) * r.world, s.n);
        }))),
        a_shard(largest([](const FusedShape& s, int) { return size_t(s.rows) * s.k; })),
        a(largest([](const FusedShape& s, int w) { return size_t(s.rows) * w * s.k; })),
        b(largest([](const FusedShape& s, int) { return size_t(s.k) * s.n; })),
        b_row(b.bytes),
        c(largest([](const FusedShape& s, int w) { return size_t(s.rows) * w * s.n; })),
        c_shard(largest([](const FusedShape& s, int) { return size_t(s.rows) * s.n; })),
        c_shard_row(c_shard.bytes),
        wrong(kFusedCases * slots_per_case, r.stream),
        slots(slots_per_case) {
    wait_for_every_rank(r);
  }
  // At the end of a test body, on every rank alike: the calls' check, then the frees (collective)
  // after every rank's last call. A rank that failed does not get here; the communicator releases
  // its buffers when it closes.
  void finish() {
    r.comm->synchronize(r.stream);
    wait_for_every_rank(r);
    r.comm->free(workspace);
    r.comm->free(gathered);
  }
  // The counters of case `index` (0 .. kFusedCases - 1), read back after the calls' own check: a
  // wait released at its deadline leaves the outputs undefined, and its error (raised here) is
  // the finding, not the wrong elements.
  std::vector<unsigned long long> read(size_t index) const {
    r.comm->synchronize(r.stream);
    const std::vector<unsigned long long> all = wrong.read(r.stream);
    return {all.begin() + index * slots, all.begin() + (index + 1) * slots};
  }
  unsigned long long* at(size_t index, size_t slot) const { return wrong.at(index * slots + slot); }

 private:
  size_t largest(size_t (*elements)(const FusedShape&, int world)) const {
    const int world = r.world;
    return 2 * largest_over_shapes([&](const FusedShape& s) { return elements(s, world); });
  }
};

// Runs `body` for every case (shape, type) of kFusedShapes x kFusedTypes on `buffers`, its
// counters at `case_index`, then buffers.finish(). When `unsupported` says why this build or GPU
// cannot run a case (alike on every rank), that goes into *why and nothing more runs.
void for_each_fused_case(FusedBuffers& buffers, std::string* why,
                         const std::function<std::string(const FusedShape&, DataType)>& unsupported,
                         const std::function<void(const FusedShape&, DataType, size_t case_index)>& body) {
  size_t case_index = 0;
  for (const FusedShape& shape : kFusedShapes)
    for (DataType type : kFusedTypes) {
      *why = unsupported(shape, type);
      if (!why->empty()) {
        buffers.finish();
        return;
      }
      body(shape, type, case_index++);
    }
  buffers.finish();
}

// all_gather_matmul between ranks on one GPU: the copies, handshakes, piece flags and the
// GEMM's waits; A local or in place (a_shard = this rank's slot), eager and replayed from a graph.
TEST(shared_gpu_all_gather_matmul_matches_exact_products) {
  for_fused_worlds("all_gather_matmul", [](Rank& r, std::string* unsupported) {
    FusedBuffers buffers(r, 2 * 2 * kFusedRepeats);
    uint64_t iteration = 0;
    for_each_fused_case(
        buffers, unsupported,
        [&](const FusedShape& shape, DataType type) {
          return all_gather_matmul_unsupported(*buffers.gathered, shape.rows * r.world, shape.n, shape.k, type,
                                               *r.comm);
        },
        [&](const FusedShape& shape, DataType type, size_t case_index) {
          const int m = shape.rows * r.world;
          const size_t elem = dtype_size(type);
          Buffer* gathered = buffers.gathered;
          char* own_slot = static_cast<char*>(gathered->ptr()) + size_t(r.rank) * shape.rows * shape.k * elem;
          const uint64_t b_seed = pattern_seed(99, 7);
          fill_small_integers(buffers.b.ptr, size_t(shape.k) * shape.n, type, b_seed, r.stream);
          size_t check = 0;
          std::string phase;  // what ran last, for an error's message
          try {
            for (bool in_place : {false, true}) {
              void* input = in_place ? static_cast<void*>(own_slot) : buffers.a_shard.ptr;
              auto one_call = [&](uint64_t it, size_t slot) {
                TEST_CUDA(cudaMemsetAsync(buffers.c.ptr, 0xFF, size_t(m) * shape.n * elem, r.stream));
                fill_small_integers(input, size_t(shape.rows) * shape.k, type, pattern_seed(r.rank, it), r.stream);
                all_gather_matmul(buffers.c.ptr, *gathered, input, buffers.b.ptr, m, shape.n, shape.k, type, *r.comm,
                                  r.stream);
                count_gathered_product_mismatches(buffers.c.ptr, m, shape.n, shape.k, shape.rows, type, it, b_seed,
                                                  buffers.at(case_index, slot), r.stream);
                for (int s = 0; s < r.world; ++s)
                  count_small_integer_mismatches(
                      static_cast<char*>(gathered->ptr()) + size_t(s) * shape.rows * shape.k * elem,
                      size_t(shape.rows) * shape.k, type, pattern_seed(s, it), buffers.at(case_index, slot), r.stream);
              };
              phase = std::string(in_place ? "in place, " : "") + "eager calls";
              for (int i = 0; i < kFusedRepeats; ++i) one_call(++iteration, check++);
              r.comm->synchronize(r.stream);
              // Captured once, replayed: the same inputs, a fresh poison each replay.
              phase = std::string(in_place ? "in place, " : "") + "graph replays";
              const uint64_t captured_iteration = ++iteration;
              const size_t graph_slot = check;
              check += kFusedRepeats;
              replay_captured(r, [&] { one_call(captured_iteration, graph_slot); }, kFusedRepeats);
            }
          } catch (const Error& e) {
            throw Failure(fused_case("all_gather_matmul", type, shape) + " (" + phase + "): " + e.what());
          }
          const std::vector<unsigned long long> counts = buffers.read(case_index);
          for (size_t i = 0; i < counts.size(); ++i)
            if (counts[i] != 0)
              throw Failure(fused_case("all_gather_matmul", type, shape) +
                            (i >= size_t(2 * kFusedRepeats) ? " in place" : "") +
                            (i % (2 * kFusedRepeats) >= size_t(kFusedRepeats) ? " (graph replays)" : "") + ": " +
                            std::to_string(counts[i]) + " wrong elements, rank " + std::to_string(r.rank));
        });
  });
}

// matmul_reduce_scatter between ranks on one GPU: the announcements, signals, pulls, handshakes
// and the sums in rank order; eager and replayed from a graph.
TEST(shared_gpu_matmul_reduce_scatter_matches_exact_sums) {
  for_fused_worlds("matmul_reduce_scatter", [](Rank& r, std::string* unsupported) {
    FusedBuffers buffers(r, 2 * kFusedRepeats);
    uint64_t iteration = 0;
    for_each_fused_case(
        buffers, unsupported,
        [&](const FusedShape& shape, DataType type) {
          return matmul_reduce_scatter_unsupported(*buffers.workspace, shape.rows * r.world, shape.n, shape.k, type,
                                                   *r.comm);
        },
        [&](const FusedShape& shape, DataType type, size_t case_index) {
          const int m = shape.rows * r.world;
          const size_t elem = dtype_size(type);
          Buffer* workspace = buffers.workspace;
          void *a = buffers.a.ptr, *b = buffers.b.ptr, *c_shard = buffers.c_shard.ptr;
          auto one_call = [&](uint64_t it, size_t slot) {
            TEST_CUDA(cudaMemsetAsync(c_shard, 0xFF, size_t(shape.rows) * shape.n * elem, r.stream));
            fill_small_integers(a, size_t(m) * shape.k, type, pattern_seed(r.rank, it), r.stream);
            fill_small_integers(b, size_t(shape.k) * shape.n, type, pattern_seed(r.rank, it + kSecondOperand),
                                r.stream);
            matmul_reduce_scatter(c_shard, *workspace, a, b, m, shape.n, shape.k, type, *r.comm, r.stream);
            count_summed_product_mismatches(c_shard, r.rank * shape.rows, shape.rows, shape.n, shape.k, r.world, type,
                                            it, buffers.at(case_index, slot), r.stream);
          };
          for (int i = 0; i < kFusedRepeats; ++i) one_call(++iteration, size_t(i));
          const uint64_t captured_iteration = ++iteration;
          replay_captured(r, [&] { one_call(captured_iteration, kFusedRepeats); }, kFusedRepeats);
          const std::vector<unsigned long long> counts = buffers.read(case_index);
          for (size_t i = 0; i < counts.size(); ++i)
            if (counts[i] != 0)
              throw Failure(fused_case("matmul_reduce_scatter", type, shape) +
                            (i >= size_t(kFusedRepeats) ? " (graph replays)" : "") + ": " + std::to_string(counts[i]) +
                            " wrong elements, rank " + std::to_string(r.rank));
        });
  });
}

// Both fused ops with b column-major (torch's W.t(), read in place by the GEMM's column-major-B
// kernels) between ranks on one GPU: the same exact results as with b row-major above, back to
// back. Each matmul_reduce_scatter call runs with the same B in both layouts, one after the other,
// so a wrong result says which layout (or both: the sequence) is at fault. The layout is this
// rank's own affair (the protocol does not see it).
TEST(shared_gpu_fused_ops_take_a_column_major_b) {
  for_fused_worlds("fused ops with a column-major b", [](Rank& r, std::string* unsupported) {
    // all_gather_matmul column-major; matmul_reduce_scatter column-major, row-major, and the bytes
    // of the two.
    FusedBuffers buffers(r, 4);
    uint64_t iteration = 1000;
    for_each_fused_case(
        buffers, unsupported,
        [&](const FusedShape& shape, DataType type) {
          return all_gather_matmul_unsupported(*buffers.gathered, shape.rows * r.world, shape.n, shape.k, type,
                                               *r.comm);
        },
        [&](const FusedShape& shape, DataType type, size_t case_index) {
          const int m = shape.rows * r.world;
          const size_t elem = dtype_size(type);
          Buffer *gathered = buffers.gathered, *workspace = buffers.workspace;
          const size_t c_shard_bytes = size_t(shape.rows) * shape.n * elem;
          void *b = buffers.b.ptr, *b_row = buffers.b_row.ptr, *c = buffers.c.ptr;
          void *c_shard = buffers.c_shard.ptr, *c_shard_row = buffers.c_shard_row.ptr;
          const char* op = "all_gather_matmul";
          try {
            const uint64_t b_seed = pattern_seed(99, 8);
            fill_small_integers_column_major(b, shape.k, shape.n, type, b_seed, r.stream);
            for (int i = 0; i < kFusedRepeats; ++i) {
              const uint64_t it = ++iteration;
              TEST_CUDA(cudaMemsetAsync(c, 0xFF, size_t(m) * shape.n * elem, r.stream));
              fill_small_integers(buffers.a_shard.ptr, size_t(shape.rows) * shape.k, type, pattern_seed(r.rank, it),
                                  r.stream);
              all_gather_matmul(c, *gathered, buffers.a_shard.ptr, b, m, shape.n, shape.k, type, *r.comm, r.stream,
                                MatrixLayout::kColumnMajor);
              count_gathered_product_mismatches(c, m, shape.n, shape.k, shape.rows, type, it, b_seed,
                                                buffers.at(case_index, 0), r.stream);
            }
            op = "matmul_reduce_scatter";
            for (int i = 0; i < kFusedRepeats; ++i) {
              const uint64_t it = ++iteration;
              const uint64_t seed = pattern_seed(r.rank, it + kSecondOperand);
              fill_small_integers(buffers.a.ptr, size_t(m) * shape.k, type, pattern_seed(r.rank, it), r.stream);
              fill_small_integers_column_major(b, shape.k, shape.n, type, seed, r.stream);
              fill_small_integers(b_row, size_t(shape.k) * shape.n, type, seed, r.stream);
              TEST_CUDA(cudaMemsetAsync(c_shard, 0xFF, c_shard_bytes, r.stream));
              TEST_CUDA(cudaMemsetAsync(c_shard_row, 0xFF, c_shard_bytes, r.stream));
              matmul_reduce_scatter(c_shard, *workspace, buffers.a.ptr, b, m, shape.n, shape.k, type, *r.comm, r.stream,
                                    MatrixLayout::kColumnMajor);
              matmul_reduce_scatter(c_shard_row, *workspace, buffers.a.ptr, b_row, m, shape.n, shape.k, type, *r.comm,
                                    r.stream, MatrixLayout::kRowMajor);
              count_summed_product_mismatches(c_shard, r.rank * shape.rows, shape.rows, shape.n, shape.k, r.world, type,
                                              it, buffers.at(case_index, 1), r.stream);
              count_summed_product_mismatches(c_shard_row, r.rank * shape.rows, shape.rows, shape.n, shape.k, r.world,
                                              type, it, buffers.at(case_index, 2), r.stream);
              count_differences(c_shard, c_shard_row, c_shard_bytes, buffers.at(case_index, 3), r.stream);
            }
          } catch (const Error& e) {
            throw Failure(fused_case(op, type, shape) + " (column-major b): " + e.what());
          }
          const std::vector<unsigned long long> counts = buffers.read(case_index);
          if (counts[0] != 0 || counts[1] != 0 || counts[2] != 0 || counts[3] != 0)
            throw Failure(fused_case(counts[0] != 0 ? "all_gather_matmul" : "matmul_reduce_scatter", type, shape) +
                          ", rank " + std::to_string(r.rank) + ", wrong elements over " +
                          std::to_string(kFusedRepeats) + " calls: all_gather_matmul column-major b " +
                          std::to_string(counts[0]) + "; matmul_reduce_scatter column-major b " +
                          std::to_string(counts[1]) + ", row-major b " + std::to_string(counts[2]) +
                          ", bytes differing between the two " + std::to_string(counts[3]));
        });
  });
}

// Memory of the program's own, as ncclMemAlloc makes it (cuMemCreate, exportable as a POSIX file
// descriptor): what Communicator::import maps into the heap. Through the library's driver loader, so
// that the binary starts (and skips) on a machine without the driver.
class CuMemAllocation {
 public:
  explicit CuMemAllocation(size_t bytes) {
    const auto& api = symmem::detail::DriverApi::get();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    TEST_CU(api.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    bytes_ = (bytes + granularity - 1) / granularity * granularity;
    TEST_CU(api.mem_create(&handle_, bytes_, &prop, 0));
    TEST_CU(api.mem_address_reserve(&address_, bytes_, granularity, 0, 0));
    TEST_CU(api.mem_map(address_, bytes_, 0, handle_, 0));
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    TEST_CU(api.mem_set_access(address_, bytes_, &access, 1));
  }
  ~CuMemAllocation() {
    const auto& api = symmem::detail::DriverApi::get();
    api.mem_unmap(address_, bytes_);
    api.mem_address_free(address_, bytes_);
    api.mem_release(handle_);
  }
  CuMemAllocation(const CuMemAllocation&) = delete;
  CuMemAllocation& operator=(const CuMemAllocation&) = delete;
  void* ptr() const { return reinterpret_cast<void*>(address_); }

 private:
  size_t bytes_ = 0;
  CUmemGenericAllocationHandle handle_{};
  CUdeviceptr address_ = 0;
};

// An imported buffer has no signal pad: its device handle says 0 words and null pads. Its handle
// used to point every peer's "pad" just past the buffer, into the rest of the program's allocation.
TEST(shared_gpu_an_imported_buffer_hands_out_no_signal_pad) {
  for (int world : shared_gpu_worlds()) {
    run_ranks(world, [](Rank& r) {
      CuMemAllocation memory(4 * kMiB);
      Buffer* imported = r.comm->import(memory.ptr(), kMiB);
      const Buffer::DeviceHandle h = imported->device_handle();
      std::string wrong;
      if (imported->signal_pad() != nullptr || imported->signal_pad_words() != 0 || h.signal_pad != nullptr ||
          h.signal_pad_words != 0)
        wrong = "a signal pad of " + std::to_string(h.signal_pad_words) + " words";
      for (int p = 0; p < r.world; ++p)
        if (h.peer_signal_pads[p] != nullptr) wrong += " peer " + std::to_string(p) + "'s pad set;";
      r.comm->release_import(imported);
      if (!wrong.empty()) throw Failure("rank " + std::to_string(r.rank) + ": the imported buffer has " + wrong);
    });
  }
}

// release_import is local (ncclCommWindowDeregister is): ranks release at their own points. Here the
// even ranks release the first import before the second import, the odd ones after it; the second
// must still lie at one offset on every rank and serve a zero-copy all-reduce. The range of a
// release went back to the free list at once, so the early ranks placed the second import where
// the first had been, the late ones elsewhere, and every call on it failed as a mismatch.
TEST(shared_gpu_imports_released_at_different_points_stay_aligned) {
  for (int world : shared_gpu_worlds()) {
    run_ranks(world, [](Rank& r) {
      const size_t count = 4096;
      CuMemAllocation first_memory(2 * kMiB), second_memory(2 * kMiB);
      Buffer* first = r.comm->import(first_memory.ptr(), 2 * kMiB);
      wait_for_every_rank(r);
      const bool early = r.rank % 2 == 0;
      if (early) r.comm->release_import(first);
      Buffer* second = r.comm->import(second_memory.ptr(), count * sizeof(float));
      if (!early) r.comm->release_import(first);
      wait_for_every_rank(r);  // (no rank's release waits for the device while a peer's call runs: one GPU)
      std::vector<float> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = float((i + r.rank) % 13);
      TEST_CUDA(cudaMemcpyAsync(second->ptr(), mine.data(), count * sizeof(float), cudaMemcpyHostToDevice, r.stream));
      all_reduce(second, second, count, DataType::kFloat32, ReduceOp::kSum, *r.comm, r.stream);
      std::vector<float> out(count);
      TEST_CUDA(cudaMemcpyAsync(out.data(), second->ptr(), count * sizeof(float), cudaMemcpyDeviceToHost, r.stream));
      TEST_CUDA(cudaStreamSynchronize(r.stream));
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < r.world; ++q) want += float((i + q) % 13);
        if (out[i] != want)
          throw Failure("rank " + std::to_string(r.rank) + ": element " + std::to_string(i) + " is " +
                        std::to_string(out[i]) + ", expected " + std::to_string(want));
      }
      wait_for_every_rank(r);
      r.comm->release_import(second);
      // A third import reuses what every rank released by now, alike on every rank.
      Buffer* third = r.comm->import(first_memory.ptr(), 2 * kMiB);
      r.comm->release_import(third);
    });
  }
}

}  // namespace

int main(int argc, char** argv) { return symmem::test::shared_gpu_main(argc, argv); }
