// Plan pins: what the planner chooses (algorithm, blocks, vector width, staging, the kernel that
// runs, the chunk size) over a large grid of requests, held against tests/unit/plan_pins.txt, which
// was computed by the planner of 455ecfe, before the table of algorithms. A refactor of the
// planner must leave every line as it was; a change of choice is a deliberate edit of the pins.
// Edits since: a push cut into chunks under 32 MiB gives way to the pull in one piece on symmetric
// operands (plan.cpp, kChunkedPushLosesBelowBytes; 28 plans, all with the 2 MiB areas, every one
// push -> pull, none staged).
// A structured block with the small areas, appended after the draws, holds the rule for local
// operands (a chunked one-shot push gives way to the one-shot pull at 2 ranks, plan.cpp). Where
// the two-shot would stage local operands at 2 ranks, the one-shot push or pull runs instead
// (plan.cpp; 83 plans, every one an all-reduce at 2 ranks with local input and output, two_shot ->
// one_shot or one_shot_push). Local operands at 2 ranks from 8 MiB (all-reduce) and 16 MiB of
// input (reduce-scatter), or where the plan would run in chunks, take the pipelined reductions
// (plan.cpp; 155 plans, every one at 2 ranks with local input and output, no algorithm named).
// The names renamed since are mapped back below (pinned_algo_name, pinned_kernel_name).
//
// The grid: sizes from 1 byte to 1 GiB (odd ones too), worlds 1, 2, 3, 4 and 8, every element
// size, every algorithm asked for (reduction ones for all-gather too), blocks and SM budgets,
// SYMMEM_ALGO and SYMMEM_BLOCKS, symmetric or local operands at aligned and odd heap offsets, in
// place, copy-engine direction, bulk push, one node or two, 132 or 16 SMs, a fixed tuning table
// and none; a structured sweep and 24576 pseudo-random draws. Each line of the pins file is the
// FNV-1a hash of 16 consecutive cases' results (a small file); on a mismatch the test prints the
// cases and their results. SYMMEM_PLAN_PINS_PRINT=FILE writes every case and result in full (run
// it on the pinned commit and on yours and diff the two), SYMMEM_PLAN_PINS_WRITE=1 rewrites the
// pins file.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/hash.hpp"
#include "plan/plan.hpp"
#include "plan/tuning_table.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

namespace {

constexpr size_t kGroup = 16;
constexpr size_t kLowLatencyCapacity = size_t(1) << 20;

// A frozen table in the shape of the shipped ones (the shipped tables will be re-tuned; the pins
// must not move with them): every algorithm of every collective appears, with and without blocks.
const TuningTable& pinned_table() {
  static const TuningTable table = parse_tuning_table(R"({"gpu": "pins", "command": "", "date": "", "entries": [
    {"op": "all_gather", "world": 2, "max_bytes": 262144, "algo": "low_latency", "blocks": 0},
    {"op": "all_gather", "world": 2, "max_bytes": 1048576, "algo": "push", "blocks": 16},
    {"op": "all_gather", "world": 2, "max_bytes": 67108864, "algo": "push", "blocks": 128},
    {"op": "all_gather", "world": 2, "max_bytes": 4611686018427387904, "algo": "copy_engine", "blocks": 0},
    {"op": "all_gather", "world": 4, "max_bytes": 65536, "algo": "low_latency", "blocks": 0},
    {"op": "all_gather", "world": 4, "max_bytes": 1048576, "algo": "push", "blocks": 64},
    {"op": "all_gather", "world": 4, "max_bytes": 33554432, "algo": "pull", "blocks": 32},
    {"op": "all_gather", "world": 4, "max_bytes": 4611686018427387904, "algo": "copy_engine", "blocks": 0},
    {"op": "all_reduce", "world": 2, "max_bytes": 4096, "algo": "low_latency", "blocks": 8},
    {"op": "all_reduce", "world": 2, "max_bytes": 524288, "algo": "low_latency", "blocks": 128},
    {"op": "all_reduce", "world": 2, "max_bytes": 1048576, "algo": "low_latency_two_shot", "blocks": 0},
    {"op": "all_reduce", "world": 2, "max_bytes": 4194304, "algo": "one_shot_push", "blocks": 132},
    {"op": "all_reduce", "world": 2, "max_bytes": 16777216, "algo": "one_shot", "blocks": 64},
    {"op": "all_reduce", "world": 2, "max_bytes": 4611686018427387904, "algo": "two_shot_push", "blocks": 128},
    {"op": "all_reduce", "world": 4, "max_bytes": 65536, "algo": "low_latency", "blocks": 0},
    {"op": "all_reduce", "world": 4, "max_bytes": 8388608, "algo": "two_shot", "blocks": 96},
    {"op": "all_reduce", "world": 4, "max_bytes": 4611686018427387904, "algo": "two_shot_push", "blocks": 0},
    {"op": "reduce_scatter", "world": 2, "max_bytes": 131072, "algo": "low_latency", "blocks": 0},
    {"op": "reduce_scatter", "world": 2, "max_bytes": 8388608, "algo": "two_shot_push", "blocks": 64},
    {"op": "reduce_scatter", "world": 2, "max_bytes": 4611686018427387904, "algo": "two_shot", "blocks": 128},
    {"op": "reduce_scatter", "world": 4, "max_bytes": 65536, "algo": "low_latency", "blocks": 16},
    {"op": "reduce_scatter", "world": 4, "max_bytes": 4611686018427387904, "algo": "two_shot_push", "blocks": 0}
  ]})");
  return table;
}

// splitmix64: the same draws on every platform (std's distributions are implementation-defined).
class Draw {
 public:
  explicit Draw(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  template <typename T, size_t N>
  T pick(const T (&values)[N]) {
    return values[below(N)];
  }

 private:
  uint64_t state_;
};

// Reduce-scatter's algorithms were named two_shot and two_shot_push at 455ecfe (they are now
// pull and push, the old names parse as aliases); the pins keep the old names.
const char* pinned_algo_name(Algo algo, bool reduce_scatter) {
  if (reduce_scatter && algo == Algo::kPull) return "two_shot";
  if (reduce_scatter && algo == Algo::kPush) return "two_shot_push";
  return algo_name(algo);
}

// The kernel the plan names. At 455ecfe launch code chose it (all_gather.cpp's run_chunk: bulk
// push where the plan allowed it; all_reduce.cpp's launch_chunk), under these names.
std::string pinned_kernel_name(KernelId kernel) {
  if (kernel == KernelId::kAllGatherCopyEngine) return "copy_engine";
  if (kernel == KernelId::kAllGatherHierarchical) return "hierarchical";
  return kernel_name(kernel);
}

std::string chunk_text(size_t elements) { return elements == ~size_t(0) ? "-" : std::to_string(elements); }

struct AllGatherCase {
  AllGatherRequest request;
  size_t elem = 1;
  bool table = true;
  WorkspaceLimits limits;
};

struct ReduceCase {
  ReduceRequest request;
  bool table = true;
  WorkspaceLimits limits;
};

std::string options_text(const CollectiveOptions& o, Algo forced, int forced_blocks) {
  std::ostringstream s;
  s << algo_name(o.algo) << "/" << o.blocks << "/" << o.max_blocks << " forced=" << algo_name(forced) << "/"
    << forced_blocks;
  return s.str();
}

std::string describe_case(const AllGatherCase& c) {
  const AllGatherRequest& r = c.request;
  std::ostringstream s;
  s << "all_gather bytes=" << r.bytes_per_rank << " elem=" << c.elem << " world=" << r.world << " nodes=" << r.nodes
    << " sm=" << r.sm_count << " " << options_text(r.options, r.forced, r.forced_blocks)
    << " in=" << (r.in_symmetric ? "S@" : "L@") << r.in_address << " out=" << (r.out_symmetric ? "S@" : "L@")
    << r.out_address << " ce_push=" << r.copy_engine_push << " bulk=" << r.push_bulk << " table=" << c.table
    << " staging=" << c.limits.staging;
  return s.str();
}

std::string describe_case(const ReduceCase& c) {
  const ReduceRequest& r = c.request;
  std::ostringstream s;
  s << (r.reduce_scatter ? "reduce_scatter" : "all_reduce") << " count=" << r.count << " elem=" << r.elem_bytes
    << " world=" << r.world << " sm=" << r.sm_count << " " << options_text(r.options, r.forced, r.forced_blocks)
    << " in=" << (r.in_symmetric ? "S@" : "L@") << r.in_address << " out=" << (r.out_symmetric ? "S@" : "L@")
    << r.out_address << " in_place=" << r.in_place << " table=" << c.table << " staging=" << c.limits.staging
    << " receive_half=" << c.limits.receive_half;
  return s.str();
}

// What the planner chose for the case, as one line; errors by code (messages may be reworded).
std::string result_of(const AllGatherCase& c) {
  try {
    AllGatherRequest request = c.request;
    request.elem_bytes = c.elem;
    request.workspace = c.limits;
    const AllGatherPlan p = plan_all_gather(request, c.table ? pinned_table() : TuningTable{});
    std::ostringstream s;
    s << pinned_algo_name(p.algo, false) << " blocks=" << p.blocks << " vector=" << p.vector_bytes
      << " stage=" << p.stage_input << p.stage_output << " ce_push=" << p.copy_engine_push
      << " bulk=" << (p.kernel == KernelId::kAllGatherPushBulk) << " local_warps=" << p.local_warps
      << " kernel=" << pinned_kernel_name(p.kernel) << " chunk=" << chunk_text(p.chunk_elements);
    return s.str();
  } catch (const Error& e) {
    return "error " + std::to_string(static_cast<int>(e.code()));
  }
}

std::string result_of(const ReduceCase& c) {
  const ReduceRequest& r = c.request;
  try {
    ReduceRequest request = r;
    request.workspace = c.limits;
    const ReducePlan p = plan_reduce(request, c.table ? pinned_table() : TuningTable{});
    std::ostringstream s;
    s << pinned_algo_name(p.algo, r.reduce_scatter) << " blocks=" << p.blocks << " vector=" << p.vector
      << " stage=" << p.stage_input << " scratch=" << p.gather_via_staging << " reads_peers=" << p.reads_peer_inputs
      << " receive=" << p.receive_area << " kernel=" << pinned_kernel_name(p.kernel)
      << " chunk=" << chunk_text(p.chunk_elements);
    return s.str();
  } catch (const Error& e) {
    return "error " + std::to_string(static_cast<int>(e.code()));
  }
}

constexpr int kWorlds[] = {1, 2, 3, 4, 8};
constexpr size_t kElems[] = {1, 2, 4};
constexpr int kSmCounts[] = {132, 16};
constexpr int kBlockChoices[] = {0, 0, 0, 1, 7, 64, 500};
constexpr int kMaxBlockChoices[] = {-1, -1, -1, 0, 4, 8, 32, 200};
constexpr uint64_t kAddresses[] = {0, 0, 4096, 2097152, 4, 6, 1, 8};
const WorkspaceLimits kLimits[] = {{size_t(64) << 20, size_t(32) << 20}, {size_t(2) << 20, size_t(1) << 20}};

// Bytes from 1 to 1 GiB: powers of two, their neighbours, and log-uniform draws.
size_t draw_bytes(Draw& d) {
  switch (d.below(4)) {
    case 0: return size_t(1) << d.below(31);
    case 1: return (size_t(1) << d.below(31)) + d.below(3) * 4 + 1;
    case 2: return (size_t(1) << (d.below(30) + 1)) - d.below(16);
    default: {
      const size_t top = size_t(1) << (d.below(30) + 1);
      return top / 2 + d.below(top / 2);
    }
  }
}

// The fields both requests draw, in one order: world, SMs, options, SYMMEM_ALGO and SYMMEM_BLOCKS,
// operand kinds and their heap offsets.
template <typename Request, typename PickAlgo, typename PickForced>
void draw_shared(Draw& d, Request& r, PickAlgo pick_algo, PickForced pick_forced) {
  r.world = d.pick(kWorlds);
  r.sm_count = d.pick(kSmCounts);
  r.options.algo = pick_algo();
  r.options.blocks = d.pick(kBlockChoices);
  r.options.max_blocks = d.pick(kMaxBlockChoices);
  r.forced = pick_forced();
  r.forced_blocks = d.below(6) == 0 ? 24 : 0;
  r.in_symmetric = d.below(2);
  r.out_symmetric = d.below(2);
  r.in_address = r.in_symmetric ? d.pick(kAddresses) : 0;
  r.out_address = r.out_symmetric ? d.pick(kAddresses) : 0;
}

AllGatherCase draw_all_gather(Draw& d) {
  constexpr Algo algos[] = {Algo::kAuto,       Algo::kAuto,       Algo::kAuto,         Algo::kPull,   Algo::kPush,
                            Algo::kCopyEngine, Algo::kLowLatency, Algo::kHierarchical, Algo::kOneShot};
  constexpr Algo forced[] = {Algo::kAuto, Algo::kAuto,       Algo::kAuto,       Algo::kPull,
                             Algo::kPush, Algo::kCopyEngine, Algo::kLowLatency, Algo::kTwoShot};
  AllGatherCase c;
  AllGatherRequest& r = c.request;
  c.elem = d.pick(kElems);
  r.bytes_per_rank = std::max<size_t>(1, draw_bytes(d) / c.elem) * c.elem;
  draw_shared(
      d, r, [&] { return d.pick(algos); }, [&] { return d.pick(forced); });
  r.copy_engine_push = d.below(4) == 0;
  r.push_bulk = d.below(4) != 0;
  r.low_latency_capacity = kLowLatencyCapacity;
  r.nodes = d.below(6) == 0 ? 2 : 1;
  c.table = d.below(3) != 0;
  c.limits = kLimits[d.below(2)];
  return c;
}

ReduceCase draw_reduce(Draw& d) {
  constexpr Algo all_reduce_algos[] = {
      Algo::kAuto,    Algo::kAuto,        Algo::kAuto,       Algo::kOneShot,           Algo::kOneShotPush,
      Algo::kTwoShot, Algo::kTwoShotPush, Algo::kLowLatency, Algo::kLowLatencyTwoShot, Algo::kCopyEngine};
  // (reduce-scatter's pull and push are its new names: the planner of 455ecfe refused them)
  constexpr Algo reduce_scatter_algos[] = {
      Algo::kAuto,        Algo::kAuto,       Algo::kAuto,    Algo::kTwoShot,
      Algo::kTwoShotPush, Algo::kLowLatency, Algo::kOneShot, Algo::kLowLatencyTwoShot};
  constexpr Algo forced[] = {Algo::kAuto,       Algo::kAuto,        Algo::kAuto,       Algo::kOneShot,
                             Algo::kTwoShot,    Algo::kTwoShotPush, Algo::kLowLatency, Algo::kLowLatencyTwoShot,
                             Algo::kOneShotPush};
  constexpr size_t reduce_elems[] = {2, 4};
  ReduceCase c;
  ReduceRequest& r = c.request;
  r.reduce_scatter = d.below(2);
  r.elem_bytes = d.pick(reduce_elems);
  r.count = std::max<size_t>(1, draw_bytes(d) / r.elem_bytes);
  draw_shared(
      d, r, [&] { return r.reduce_scatter ? d.pick(reduce_scatter_algos) : d.pick(all_reduce_algos); },
      [&] { return d.pick(forced); });
  r.low_latency_capacity = kLowLatencyCapacity;
  r.in_place = d.below(4) == 0;
  c.table = d.below(3) != 0;
  c.limits = kLimits[d.below(2)];
  return c;
}

// Every case of the grid, described and with its result, in a fixed order.
struct Pin {
  std::string what;
  std::string result;
};

// A reduction of the structured blocks: 2^shift bytes (at least one element), operand kinds as
// bits (1: symmetric input, 2: symmetric output).
ReduceCase structured_reduce(bool table, const WorkspaceLimits& limits, bool reduce_scatter, size_t elem, int shift,
                             int world, int operands, bool in_place) {
  ReduceCase q;
  q.table = table;
  q.limits = limits;
  q.request.reduce_scatter = reduce_scatter;
  q.request.elem_bytes = elem;
  q.request.count = std::max<size_t>(1, (size_t(1) << shift) / elem);
  q.request.world = world;
  q.request.in_symmetric = operands & 1;
  q.request.out_symmetric = operands & 2;
  q.request.in_place = in_place;
  q.request.low_latency_capacity = kLowLatencyCapacity;
  return q;
}

std::vector<Pin> all_pins() {
  std::vector<Pin> pins;
  auto add = [&](const auto& c) { pins.push_back({describe_case(c), result_of(c)}); };
  // Structured: every power-of-two size, world, element size and operand kind, automatic plans.
  for (bool table : {true, false}) {
    for (int world : kWorlds) {
      for (int shift = 0; shift <= 30; ++shift) {
        for (int operands = 0; operands < 4; ++operands) {
          for (size_t elem : kElems) {
            AllGatherCase g;
            g.elem = elem;
            g.table = table;
            g.limits = kLimits[0];
            g.request.bytes_per_rank = std::max<size_t>(elem, size_t(1) << shift);
            g.request.world = world;
            g.request.in_symmetric = operands & 1;
            g.request.out_symmetric = operands & 2;
            g.request.low_latency_capacity = kLowLatencyCapacity;
            add(g);
            if (elem == 1) continue;
            for (bool rs : {false, true}) add(structured_reduce(table, kLimits[0], rs, elem, shift, world, operands, false));
          }
        }
      }
    }
  }
  Draw d(0x5EED28);
  for (int i = 0; i < 12288; ++i) add(draw_all_gather(d));
  for (int i = 0; i < 12288; ++i) add(draw_reduce(d));
  // Structured, small areas (libsymmem_nccl.so's 16 MiB budget): the reductions where a push runs
  // in chunks, every operand kind (added after the draws, so the groups before stay as they were).
  for (bool table : {true, false}) {
    for (int world : kWorlds) {
      for (int shift = 16; shift <= 24; ++shift) {
        for (int operands = 0; operands < 4; ++operands) {
          for (size_t elem : {size_t(2), size_t(4)}) {
            for (bool rs : {false, true}) {
              for (bool in_place : {false, true})
                add(structured_reduce(table, kLimits[1], rs, elem, shift, world, operands, in_place));
            }
          }
        }
      }
    }
  }
  return pins;
}

std::string group_hash(const std::vector<Pin>& pins, size_t group) {
  Fnv1a h;
  for (size_t i = group * kGroup; i < pins.size() && i < (group + 1) * kGroup; ++i) h.text(pins[i].result).text("\n");
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(h.digest()));
  return text;
}

std::string pins_path() { return std::string(SYMMEM_SOURCE_DIR) + "/tests/unit/plan_pins.txt"; }

}  // namespace

TEST(plans_are_pinned) {
  const std::vector<Pin> pins = all_pins();
  const size_t groups = (pins.size() + kGroup - 1) / kGroup;
  if (const char* print = std::getenv("SYMMEM_PLAN_PINS_PRINT")) {
    std::ofstream out(print);
    for (const Pin& p : pins) out << p.what << " -> " << p.result << "\n";
  }
  if (std::getenv("SYMMEM_PLAN_PINS_WRITE")) {
    std::ofstream out(pins_path());
    out << "# " << pins.size() << " plans in groups of " << kGroup
        << " (tests/unit/test_plan_pins.cpp): the FNV-1a hash of each group's results\n";
    for (size_t g = 0; g < groups; ++g) out << group_hash(pins, g) << "\n";
    return;
  }
  std::ifstream in(pins_path());
  EXPECT(in.good());
  std::vector<std::string> expected;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') expected.push_back(line);
  EXPECT_EQ(expected.size(), groups);
  std::string report;
  size_t changed = 0;
  for (size_t g = 0; g < groups; ++g) {
    if (group_hash(pins, g) == expected[g]) continue;
    if (++changed > 3) continue;
    report += "\ngroup " + std::to_string(g) + " changed; its cases now plan:";
    for (size_t i = g * kGroup; i < pins.size() && i < (g + 1) * kGroup; ++i)
      report += "\n  " + pins[i].what + " -> " + pins[i].result;
  }
  if (changed)
    ::symmem::test::fail(__FILE__, __LINE__,
                         std::to_string(changed) + " of " + std::to_string(groups) +
                             " groups of plans changed (SYMMEM_PLAN_PINS_PRINT=FILE on the pinned commit and on "
                             "this one, then diff):" +
                             report);
}
