// All-to-all and MoE dispatch / combine between ranks sharing ONE GPU (threads of this process,
// SYMMEM_TEST_SHARED_GPU=1; tests/gpu/shared_gpu_ranks.hpp), at worlds 2, 3, 4 and 8. Run:
// symmem_shared_gpu_moe_tests [filter].
//
// What it checks, exactly, against host references built from plan/all_to_all_layout.hpp and a
// keyed hash of every input byte (moe_test_kernels.hpp): every form of the all-to-all (uniform,
// host splits, device splits, 2-D expert-major with alignment), every algorithm, heap and local
// operands, in place, under uniform, skewed (Zipf), one-hot-at-capacity, empty-rank, single-pair and
// zero-row routing, small (pairs as lines) and large (pairs by SM, one pair over many blocks, or a
// single block for everything); outputs poisoned before each call, rows past what a rank needs must
// stay poisoned. Back-to-back calls of one signature whose routing changes, with no host
// synchronisation between them. Overflow:
// every rank raises kCapacity naming the rank, and no rank's output changed. 1000 graph replays
// whose routing changes every replay on the device, checked on the device, no host
// synchronisation. A rank that never comes is named in time; a mismatched call raises kMismatch.
// What it cannot: NVLink's memory ordering and timing (all traffic stays in one L2).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "comm/agreed_settings.hpp"
#include "device_memory.hpp"
#include "ep_reference.hpp"
#include "kernels/all_to_all_args.hpp"
#include "moe_test_kernels.hpp"
#include "plan/all_to_all_layout.hpp"
#include "plan/ep_geometry.hpp"
#include "shared_gpu_ranks.hpp"
#include "symmem/symmem.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr uint8_t kPoison = 0xA5;

std::vector<uint8_t> download(const void* p, size_t bytes, cudaStream_t stream) {
  std::vector<uint8_t> host(bytes);
  if (bytes) TEST_CUDA(cudaMemcpyAsync(host.data(), p, bytes, cudaMemcpyDeviceToHost, stream));
  TEST_CUDA(cudaStreamSynchronize(stream));
  return host;
}

template <typename T>
void upload(void* p, const std::vector<T>& host, cudaStream_t stream) {
  if (!host.empty())
    TEST_CUDA(cudaMemcpyAsync(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  TEST_CUDA(cudaStreamSynchronize(stream));
}

// Where a case's operands live.
enum class Kinds { kHeap, kLocal, kHeapInLocalOut, kLocalInHeapOut, kInPlaceHeap, kInPlaceLocal };
const char* kinds_name(Kinds k) {
  static const char* names[] = {
      "heap", "local", "heap in, local out", "local in, heap out", "in place (heap)", "in place (local)"};
  return names[int(k)];
}
bool in_place(Kinds k) { return k == Kinds::kInPlaceHeap || k == Kinds::kInPlaceLocal; }

// A rank's operand memory: two heap buffers and two local allocations of `bytes` each.
struct Memory {
  Buffer* heap_in = nullptr;
  Buffer* heap_out = nullptr;
  std::unique_ptr<DeviceBuffer> local_in, local_out;
  Memory(Communicator& comm, size_t bytes)
      : heap_in(comm.allocate(bytes)),
        heap_out(comm.allocate(bytes)),
        local_in(std::make_unique<DeviceBuffer>(bytes)),
        local_out(std::make_unique<DeviceBuffer>(bytes)) {}
  Operand out(Kinds k) const {
    const bool heap = k == Kinds::kHeap || k == Kinds::kLocalInHeapOut || k == Kinds::kInPlaceHeap;
    return heap ? Operand(*heap_out) : Operand(local_out->ptr);
  }
  Operand in(Kinds k) const {
    if (in_place(k)) return out(k);
    const bool heap = k == Kinds::kHeap || k == Kinds::kHeapInLocalOut;
    return heap ? Operand(*heap_in) : Operand(local_in->ptr);
  }
};

std::string describe_options(const CollectiveOptions& o) { return std::string(algo_name(o.algo)); }

// Collects the first few failures of the cases of one rank.
struct Findings {
  std::string text;
  int count = 0;
  void add(const std::string& what) {
    if (count++ < 6) text += "\n  " + what;
  }
  void raise(const SharedRank& r) const {
    if (count) throw Failure("rank " + std::to_string(r.rank) + ": " + std::to_string(count) + " cases wrong" + text);
  }
};

// --- uniform ----------------------------------------------------------------------------------

TEST(shared_gpu_all_to_all_uniform_matches_reference) {
  const size_t pairs[] = {1, 3, 64, 1000, 4100, 65536, 300001, kMiB + 16};
  const Algo algos[] = {Algo::kAuto, Algo::kLowLatency, Algo::kPush, Algo::kPull, Algo::kCopyEngine};
  const Kinds kinds[] = {Kinds::kHeap,           Kinds::kLocal,       Kinds::kHeapInLocalOut,
                         Kinds::kLocalInHeapOut, Kinds::kInPlaceHeap, Kinds::kInPlaceLocal};
  for (int world : shared_gpu_worlds()) {
    const int budget = max_blocks_for_calls();
    run_shared_ranks(world, [&](SharedRank& r) {
      const size_t span = (kMiB + 16) * world;
      Memory mem(*r.comm, span);
      wait_for_every_rank(r);
      Findings findings;
      uint64_t id = 0;
      for (size_t pair : pairs)
        for (Algo algo : algos)
          for (Kinds k : kinds) {
            ++id;
            const CollectiveOptions o{algo, 0, budget};
            const Operand out = mem.out(k), in = mem.in(k);
            const std::string what = "pair " + std::to_string(pair) + " " + describe_options(o) + " " + kinds_name(k);
            try {
              describe_all_to_all(out, in, pair, *r.comm, o);
            } catch (const Error&) {
              continue;  // not plannable (e.g. push into a local output): alike on every rank
            }
            const size_t total = pair * world;
            const uint64_t seed = mix64(id * 977 + world);
            if (!in_place(k)) TEST_CUDA(cudaMemsetAsync(out.ptr(), kPoison, total, r.stream));
            fill_rows(in.ptr(), 1, total, seed, r.rank, r.stream);
            all_to_all(out, in, pair, *r.comm, r.stream, o);
            r.comm->synchronize(r.stream);
            const std::vector<uint8_t> got = download(out.ptr(), total, r.stream);
            size_t wrong = 0;
            for (int s = 0; s < world; ++s)
              for (size_t i = 0; i < pair; ++i)
                wrong += got[s * pair + i] != row_byte(seed, s, 0, size_t(r.rank) * pair + i);
            if (wrong) findings.add(what + ": " + std::to_string(wrong) + " bytes wrong");
          }
      findings.raise(r);
    });
  }
}

// --- variable forms ---------------------------------------------------------------------------

enum class Skew { kUniform, kZipf, kOneHotAtCapacity, kEmptyRanks, kSinglePair, kZeroRows };
const char* skew_name(Skew s) {
  static const char* names[] = {"uniform", "zipf", "one-hot at capacity", "empty ranks", "single pair", "zero rows"};
  return names[int(s)];
}

enum class Form { kHostSplits, kDeviceSplits, kTwoD };

struct VariableCase {
  Form form;
  int experts;
  int64_t align;
  size_t row_bytes;
  Skew skew;
  size_t slack;  // extra rows in every input and output (0: exactly at capacity)
  Algo algo;
  Kinds kinds;
  std::string describe() const {
    static const char* forms[] = {"all_to_all_v", "all_to_all_vdev", "all_to_all_vdev_2d"};
    return std::string(forms[int(form)]) + " experts=" + std::to_string(experts) + " align=" + std::to_string(align) +
           " row_bytes=" + std::to_string(row_bytes) + " " + skew_name(skew) + " slack=" + std::to_string(slack) + " " +
           algo_name(algo) + " " + kinds_name(kinds);
  }
};

// The split matrix of a case, the same on every rank (drawn from the case's seed).
struct Routing {
  int world = 1, experts = 1;
  int64_t align = 0;
  std::vector<uint32_t> splits, input_rows, output_rows;
  detail::SplitMatrix view() const {
    return {splits.data(), input_rows.data(), output_rows.data(), world, experts, align};
  }
};

Routing route(int world, int experts, int64_t align, Skew skew, uint32_t max_entry, size_t slack, uint64_t seed) {
  Routing m;
  m.world = world;
  m.experts = experts;
  m.align = align;
  const int n = world * experts;
  m.splits.assign(size_t(world) * n, 0);
  std::mt19937_64 rng(seed);
  const int hot = static_cast<int>(rng() % n);
  for (int s = 0; s < world; ++s)
    for (int j = 0; j < n; ++j) {
      uint32_t v = 0;
      switch (skew) {
        case Skew::kUniform: v = max_entry / 2 + 1; break;
        case Skew::kZipf: v = static_cast<uint32_t>(max_entry / std::pow(double(1 + (j + 3 * s) % n), 1.1)); break;
        case Skew::kOneHotAtCapacity: v = j == hot ? max_entry : 0; break;
        case Skew::kEmptyRanks:
          v = (s % 2 == 1 || (j / experts) % 2 == 1) ? 0 : uint32_t(rng() % (max_entry + 1));
          break;
        case Skew::kSinglePair: v = s == hot % world && j == hot ? max_entry : 0; break;  // one pair, maybe to itself
        case Skew::kZeroRows: v = s % 2 == 1 ? 0 : uint32_t(rng() % (max_entry + 1)); break;
      }
      m.splits[size_t(s) * n + j] = v;
    }
  m.input_rows.assign(world, 0);
  m.output_rows.assign(world, 0);
  for (int r = 0; r < world; ++r) {
    m.input_rows[r] = static_cast<uint32_t>(detail::sent_rows(m.view(), r) + slack);
    m.output_rows[r] = static_cast<uint32_t>(detail::needed_output_rows(m.view(), r) + slack);
  }
  return m;
}

// Compares rank `me`'s output (out_rows rows) with what the routing sends it; rows nobody writes
// (2-D padding, slack) must still hold what they held before the call: the poison, or `before`
// where that is not the poison (in place: the input's rows).
size_t wrong_bytes(const Routing& m, int me, const std::vector<uint8_t>& got, size_t row_bytes, uint64_t seed,
                   const std::vector<uint8_t>* before = nullptr) {
  const detail::SplitMatrix v = m.view();
  std::vector<uint8_t> expected = before ? *before : std::vector<uint8_t>(got.size(), kPoison);
  for (int k = 0; k < m.world * m.experts; ++k) {
    const detail::AllToAllPiece p = detail::receive_piece(v, me, k, row_bytes);
    for (uint64_t b = 0; b < p.bytes; ++b) {
      const uint64_t src = p.src_byte + b;
      expected[p.dst_byte + b] = row_byte(seed, p.peer, src / row_bytes, src % row_bytes);
    }
  }
  size_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != expected[i];
  return wrong;
}

// Runs case c with routing m on one rank, on operands `out` and `in` (null where the rank has no
// rows: an idle rank); returns "" or what was wrong.
std::string run_routed_case(const VariableCase& c, const Routing& m, SharedRank& r, const Operand& out,
                            const Operand& in, void* splits_in, void* splits_out, int budget, uint64_t seed,
                            int blocks = 0) {
  const int n = r.world * c.experts;
  const size_t in_rows = m.input_rows[r.rank], out_rows = m.output_rows[r.rank];
  const CollectiveOptions o{c.algo, blocks, budget};
  if (out_rows) TEST_CUDA(cudaMemsetAsync(out.ptr(), kPoison, out_rows * c.row_bytes, r.stream));
  TEST_CUDA(cudaMemsetAsync(splits_out, 0xFF, 2 * n * sizeof(int64_t), r.stream));
  fill_rows(in.ptr(), in_rows, c.row_bytes, seed, r.rank, r.stream);
  const bool in_place = in.ptr() != nullptr && in.ptr() == out.ptr();
  const std::vector<uint8_t> before =
      in_place ? download(out.ptr(), out_rows * c.row_bytes, r.stream) : std::vector<uint8_t>();
  std::vector<int64_t> mine(n), expect_from(r.world);
  for (int j = 0; j < n; ++j) mine[j] = m.splits[size_t(r.rank) * n + j];
  for (int s = 0; s < r.world; ++s) expect_from[s] = m.splits[size_t(s) * n + r.rank];
  switch (c.form) {
    case Form::kHostSplits:
      all_to_all_v(out, out_rows, in, in_rows, mine.data(), expect_from.data(), c.row_bytes, *r.comm, r.stream, o);
      break;
    case Form::kDeviceSplits:
      upload(splits_in, mine, r.stream);
      all_to_all_vdev(out, out_rows, in, in_rows, static_cast<const int64_t*>(splits_in),
                      static_cast<int64_t*>(splits_out), c.row_bytes, *r.comm, r.stream, o);
      break;
    case Form::kTwoD:
      upload(splits_in, mine, r.stream);
      all_to_all_vdev_2d(out, out_rows, in, in_rows, static_cast<const int64_t*>(splits_in),
                         static_cast<int64_t*>(splits_out), c.row_bytes, c.experts, c.align, *r.comm, r.stream, o);
      break;
  }
  r.comm->synchronize(r.stream);
  std::string wrong;
  const size_t bad = wrong_bytes(m, r.rank, download(out.ptr(), out_rows * c.row_bytes, r.stream), c.row_bytes, seed,
                                 in_place ? &before : nullptr);
  if (bad) wrong += std::to_string(bad) + " output bytes wrong";
  if (c.form != Form::kHostSplits) {
    std::vector<int64_t> so(2 * n);
    const std::vector<uint8_t> raw = download(splits_out, so.size() * sizeof(int64_t), r.stream);
    std::memcpy(so.data(), raw.data(), raw.size());
    int bad_offsets = 0;
    for (int row = 0; row < 2; ++row)
      for (int k = 0; k < n; ++k)
        bad_offsets += so[row * n + k] != detail::out_splits_offsets(m.view(), r.rank, row, k);
    if (bad_offsets) wrong += (wrong.empty() ? "" : ", ") + std::to_string(bad_offsets) + " out_splits_offsets wrong";
  }
  return wrong;
}

// Runs one case on one rank; returns "" or what was wrong.
// (max_entry: the largest split; 0: small enough for the test buffers at any skew)
std::string run_variable_case(const VariableCase& c, SharedRank& r, const Memory& mem, void* splits_in,
                              void* splits_out, size_t span, int budget, uint64_t id, uint32_t max_entry = 0,
                              int blocks = 0) {
  if (max_entry == 0)
    max_entry = static_cast<uint32_t>(
        std::max<size_t>(1, span / c.row_bytes / (size_t(2) * r.world * r.world * c.experts + 8)));
  const Routing m = route(r.world, c.experts, c.align, c.skew, max_entry, c.slack, mix64(id));
  if (m.output_rows[r.rank] * c.row_bytes > span || m.input_rows[r.rank] * c.row_bytes > span)
    return "case too large for the test buffers";
  return run_routed_case(c, m, r, mem.out(c.kinds), mem.in(c.kinds), splits_in, splits_out, budget,
                         mix64(id ^ 0x5151), blocks);
}

std::vector<VariableCase> variable_cases() {
  std::vector<VariableCase> cases;
  const Kinds kinds[] = {Kinds::kHeap, Kinds::kLocal, Kinds::kHeapInLocalOut, Kinds::kLocalInHeapOut};
  const Skew skews[] = {Skew::kUniform, Skew::kZipf, Skew::kOneHotAtCapacity, Skew::kEmptyRanks};
  for (Skew skew : skews)
    for (size_t row_bytes : {size_t(1), size_t(6), size_t(16), size_t(1040), size_t(14336)})
      for (Kinds k : kinds) {
        const size_t slack = row_bytes == 6 ? 3 : 0;
        for (Algo algo : {Algo::kAuto, Algo::kPush, Algo::kPull, Algo::kLowLatency}) {
          cases.push_back({Form::kDeviceSplits, 1, 0, row_bytes, skew, slack, algo, k});
          if (row_bytes == 16 || row_bytes == 1040)
            cases.push_back({Form::kHostSplits, 1, 0, row_bytes, skew, slack, algo, k});
        }
        for (Algo algo : {Algo::kAuto, Algo::kPull}) {
          cases.push_back({Form::kTwoD, 3, 1, row_bytes, skew, slack, algo, k});
          cases.push_back({Form::kTwoD, 4, 16, row_bytes, skew, slack, algo, k});
        }
      }
  return cases;
}

TEST(shared_gpu_all_to_all_v_and_vdev_match_reference) {
  const std::vector<VariableCase> cases = variable_cases();
  for (int world : shared_gpu_worlds()) {
    const int budget = max_blocks_for_calls();
    run_shared_ranks(world, [&](SharedRank& r) {
      const size_t span = kMiB;
      Memory mem(*r.comm, span);
      DeviceBuffer splits_in(8 * 64 * sizeof(int64_t)), splits_out(2 * 8 * 64 * sizeof(int64_t));
      wait_for_every_rank(r);
      Findings findings;
      uint64_t id = uint64_t(world) << 32;
      size_t ran = 0;
      for (const VariableCase& c : cases) {
        ++id;
        const CollectiveOptions o{c.algo, 0, budget};
        try {  // plannable? alike on every rank (the plan reads only agreed values)
          describe_all_to_all_v(mem.out(c.kinds), 1, mem.in(c.kinds), 1, c.row_bytes, c.form != Form::kHostSplits,
                                c.experts, c.form == Form::kTwoD ? c.align : 0, *r.comm, o);
        } catch (const Error&) {
          continue;
        }
        ++ran;
        const std::string wrong = run_variable_case(c, r, mem, splits_in.ptr, splits_out.ptr, span, budget, id);
        if (!wrong.empty()) findings.add(c.describe() + ": " + wrong);
      }
      if (ran < cases.size() / 2)
        findings.add("only " + std::to_string(ran) + " of " + std::to_string(cases.size()) + " cases were plannable");
      findings.raise(r);
    });
  }
}

// Skewed matrices large enough that the balanced cut spreads one pair over many blocks, that one
// call sends some pairs as lines and others by SM, and that a single block moves everything (blocks
// = 1): every form, zipf, one-hot, a single pair, zero rows and uniform, rows of 6, 256 and 14336
// bytes (2-, 16- and 16-byte vectors), and the 2-D form at 1024 destinations and at the most whose
// layout fits 48 KiB of shared memory; exact against the layout's reference.
TEST(shared_gpu_all_to_all_skewed_matches_reference) {
  struct Skewed {
    VariableCase c;
    int blocks;
  };
  std::vector<Skewed> cases;
  const Skew skews[] = {Skew::kZipf, Skew::kOneHotAtCapacity, Skew::kSinglePair, Skew::kZeroRows, Skew::kUniform};
  for (Skew skew : skews)
    for (size_t row_bytes : {size_t(6), size_t(256), size_t(14336)})
      for (Algo algo : {Algo::kAuto, Algo::kPush, Algo::kPull, Algo::kLowLatency})
        for (int blocks : {0, 3, 1}) {
          if (blocks == 1 && algo != Algo::kPush) continue;
          const Kinds kinds = algo == Algo::kPull && blocks == 0 ? Kinds::kLocal : Kinds::kHeap;
          cases.push_back({{Form::kDeviceSplits, 1, 0, row_bytes, skew, 0, algo, kinds}, blocks});
          if (blocks == 0) cases.push_back({{Form::kHostSplits, 1, 0, row_bytes, skew, 0, algo, kinds}, blocks});
          if (algo != Algo::kLowLatency)
            cases.push_back({{Form::kTwoD, 2, 8, row_bytes, skew, 0, algo, kinds}, blocks});
        }
  for (int world : shared_gpu_worlds()) {
    const int budget = max_blocks_for_calls();
    // The 2-D form at the most destinations a call takes (its layout needs more than the default
    // 48 KiB of shared memory, and every scan several turns).
    std::vector<Skewed> world_cases = cases;
    const int most_experts = detail::kMaxAllToAllSplits / world;
    for (Skew skew : {Skew::kZipf, Skew::kOneHotAtCapacity, Skew::kEmptyRanks})
      for (Algo algo : {Algo::kAuto, Algo::kPull})
        world_cases.push_back({{Form::kTwoD, most_experts, 4, 16, skew, 0, algo, Kinds::kHeap}, 0});
    // And the most experts whose layout alone fits the default 48 KiB: with the kernel's static
    // shared memory it does not (world 8: 109 experts), so the kernel needs the raised limit too.
    int under_default = most_experts;
    while (under_default > 1 && detail::all_to_all_variable_shared_bytes(world, world * under_default) > (48u << 10))
      --under_default;
    if (under_default != most_experts)
      for (Algo algo : {Algo::kAuto, Algo::kPull})
        world_cases.push_back({{Form::kTwoD, under_default, 4, 16, Skew::kZipf, 0, algo, Kinds::kHeap}, 0});
    run_shared_ranks(world, [&](SharedRank& r) {
      const size_t span = size_t(2) << 20;
      Memory mem(*r.comm, span);
      const size_t most = detail::kMaxAllToAllSplits;
      DeviceBuffer splits_in(most * sizeof(int64_t)), splits_out(2 * most * sizeof(int64_t));
      wait_for_every_rank(r);
      Findings findings;
      uint64_t id = (uint64_t(world) << 32) | 0x5000;
      for (const Skewed& k : world_cases) {
        ++id;
        const VariableCase& c = k.c;
        // The largest split that fits the buffers whatever the skew (one-hot: every rank's rows to
        // one destination; 2-D: padding).
        const uint32_t max_entry = static_cast<uint32_t>(span / c.row_bytes / (size_t(world) * c.experts + 2));
        const CollectiveOptions o{c.algo, k.blocks, budget};
        try {
          describe_all_to_all_v(mem.out(c.kinds), 1, mem.in(c.kinds), 1, c.row_bytes, c.form != Form::kHostSplits,
                                c.experts, c.form == Form::kTwoD ? c.align : 0, *r.comm, o);
        } catch (const Error& e) {
          findings.add(c.describe() + ": not plannable: " + e.what());
          continue;
        }
        const std::string wrong =
            run_variable_case(c, r, mem, splits_in.ptr, splits_out.ptr, span, budget, id, max_entry, k.blocks);
        if (!wrong.empty()) findings.add(c.describe() + " blocks=" + std::to_string(k.blocks) + ": " + wrong);
      }
      findings.raise(r);
    });
  }
}

// Back-to-back calls of one signature (same form, rows and buffers) whose routing changes every
// call, with no host synchronisation between them: each call must take its own headers and lines
// (the previous call's are cleared within it), small pairs and large ones alike. Each output is
// copied aside on the stream and checked at the end.
TEST(shared_gpu_all_to_all_back_to_back_calls_follow_their_routing) {
  constexpr int kCalls = 10;
  const Skew skews[] = {Skew::kZipf, Skew::kOneHotAtCapacity, Skew::kSinglePair, Skew::kUniform, Skew::kZeroRows};
  for (int world : shared_gpu_worlds()) {
    const int budget = max_blocks_for_calls();
    run_shared_ranks(world, [&](SharedRank& r) {
      const size_t row_bytes = 64, span = size_t(1) << 20, rows = span / row_bytes;
      Buffer* in = r.comm->allocate(span);
      Buffer* out = r.comm->allocate(span);
      std::vector<std::unique_ptr<DeviceBuffer>> kept;
      std::vector<Routing> routes;
      const int window = shared_gpu_window(world, 4);
      wait_for_every_rank(r);
      for (int call = 0; call < kCalls; ++call) {
        // Alternately tiny (every pair as lines) and large (most pairs by SM) splits.
        const uint32_t max_entry = call % 2 ? uint32_t(rows / (world + 2)) : uint32_t(3 + call);
        routes.push_back(route(world, 1, 0, skews[call % std::size(skews)], max_entry, 0, mix64(0xB2B + call)));
        const Routing& m = routes.back();
        std::vector<int64_t> mine(world), expect_from(world);
        for (int q = 0; q < world; ++q) mine[q] = m.splits[size_t(r.rank) * world + q];
        for (int s = 0; s < world; ++s) expect_from[s] = m.splits[size_t(s) * world + r.rank];
        TEST_CUDA(cudaMemsetAsync(out->ptr(), kPoison, span, r.stream));
        fill_rows(in->ptr(), m.input_rows[r.rank], row_bytes, mix64(call), r.rank, r.stream);
        // Capacities as large as the buffers on every call: only the splits change.
        all_to_all_v(Operand(*out), rows, Operand(*in), rows, mine.data(), expect_from.data(), row_bytes, *r.comm,
                     r.stream, {Algo::kAuto, 0, budget});
        kept.push_back(std::make_unique<DeviceBuffer>(span));
        TEST_CUDA(cudaMemcpyAsync(kept.back()->ptr, out->ptr(), span, cudaMemcpyDeviceToDevice, r.stream));
        if ((call + 1) % window == 0) TEST_CUDA(cudaStreamSynchronize(r.stream));
      }
      r.comm->synchronize(r.stream);
      Findings findings;
      for (int call = 0; call < kCalls; ++call) {
        const Routing& m = routes[call];
        std::vector<uint8_t> got = download(kept[call]->ptr, span, r.stream);
        got.resize(m.output_rows[r.rank] * row_bytes);  // past what the call fills: poison, not checked here
        const size_t bad = wrong_bytes(m, r.rank, got, row_bytes, mix64(call));
        if (bad)
          findings.add("call " + std::to_string(call) + " (" + skew_name(skews[call % std::size(skews)]) +
                       "): " + std::to_string(bad) + " bytes wrong");
      }
      findings.raise(r);
    });
  }
}

// A rank with no rows (an idle data-parallel rank) in every variable form: its input is null with
// 0 rows, and so is its output when it receives nothing (the 2-D form still needs its experts'
// minimum extent, torch's rule); the other ranks send to it, or not. Heap operands take 0 rows
// too. In place as well (the idle rank's null output is its input: it signs the same call as its
// peers). And the uniform form with 0 bytes per pair and null operands on every rank.
TEST(shared_gpu_all_to_all_takes_a_rank_with_no_rows) {
  for (int world : shared_gpu_worlds()) {
    const int budget = max_blocks_for_calls();
    run_shared_ranks(world, [&](SharedRank& r) {
      const size_t span = kMiB;
      Memory mem(*r.comm, span);
      DeviceBuffer splits_in(8 * 64 * sizeof(int64_t)), splits_out(2 * 8 * 64 * sizeof(int64_t));
      wait_for_every_rank(r);
      const Operand none(static_cast<void*>(nullptr));
      all_to_all(none, none, 0, *r.comm, r.stream);
      Findings findings;
      const int idle = world - 1;
      uint64_t id = uint64_t(world) << 36;
      size_t ran = 0;
      for (Form form : {Form::kHostSplits, Form::kDeviceSplits, Form::kTwoD})
        for (bool receives : {false, true})
          for (Algo algo : {Algo::kAuto, Algo::kPush, Algo::kPull, Algo::kLowLatency})
            for (Kinds kinds : {Kinds::kLocal, Kinds::kHeapInLocalOut, Kinds::kHeap})
              for (bool in_place : {false, true}) {
              if (in_place && kinds == Kinds::kHeapInLocalOut) continue;
              ++id;
              const bool two_d = form == Form::kTwoD;
              const VariableCase c{form, two_d ? 3 : 1, two_d ? 2 : 0, 48, Skew::kZipf, 0, algo, kinds};
              const Operand given_in = in_place ? mem.out(kinds) : mem.in(kinds);
              try {  // plannable? alike on every rank
                describe_all_to_all_v(mem.out(kinds), 1, given_in, 1, c.row_bytes, form != Form::kHostSplits,
                                      c.experts, c.align, *r.comm, {algo, 0, budget});
              } catch (const Error&) {
                continue;
              }
              ++ran;
              Routing m = route(world, c.experts, c.align, Skew::kZipf, 20, 0, mix64(id));
              const int n = world * c.experts;
              for (int j = 0; j < n; ++j) m.splits[size_t(idle) * n + j] = 0;
              if (!receives)
                for (int s = 0; s < world; ++s)
                  for (int e = 0; e < c.experts; ++e) m.splits[size_t(s) * n + idle * c.experts + e] = 0;
              for (int q = 0; q < world; ++q) {
                m.input_rows[q] = static_cast<uint32_t>(detail::sent_rows(m.view(), q));
                m.output_rows[q] = static_cast<uint32_t>(detail::needed_output_rows(m.view(), q));
              }
              const bool me_idle = r.rank == idle;
              const Operand out =
                  me_idle && m.output_rows[idle] == 0 && !mem.out(kinds).symmetric() ? none : mem.out(kinds);
              // In place, the idle rank passes its output (null when it receives nothing) as its input.
              const Operand in = in_place ? out : me_idle && !given_in.symmetric() ? none : given_in;
              const std::string wrong =
                  run_routed_case(c, m, r, out, in, splits_in.ptr, splits_out.ptr, budget, mix64(id ^ 0x1D7E));
              if (!wrong.empty())
                findings.add(c.describe() + (in_place ? ", in place" : "") +
                             (receives ? ", the idle rank receives: " : ": ") + wrong);
            }
      if (ran < 12) findings.add("only " + std::to_string(ran) + " cases were plannable");
      findings.raise(r);
    });
  }
}

// --- overflow ---------------------------------------------------------------------------------

// Every rank's outcome of a call that must fail: the error text (or "no error"), and whether
// this rank's output and splits still hold the poison.
struct Outcome {
  std::string error = "no error";
  ErrorCode code = ErrorCode::kInternal;
  bool untouched = false;
  double seconds = 0;
};

// Runs `call` on r's stream and synchronises: what it raised (if anything) and how long it took.
Outcome outcome_of(SharedRank& r, const std::function<void()>& call) {
  Outcome outcome;
  const auto start = std::chrono::steady_clock::now();
  try {
    call();
    r.comm->synchronize(r.stream);
  } catch (const Error& e) {
    outcome.error = e.what();
    outcome.code = e.code();
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  TEST_CUDA(cudaStreamSynchronize(r.stream));
  return outcome;
}

// Every rank raised kCapacity naming `named` with `expect` in its message, in time, and its
// buffers were left as they were (`buffers` says which).
void expect_capacity_everywhere(const std::vector<Outcome>& outcomes, const std::string& what, int named,
                                const char* expect, const char* buffers) {
  for (size_t q = 0; q < outcomes.size(); ++q) {
    const Outcome& o = outcomes[q];
    const std::string where = what + ", world " + std::to_string(outcomes.size()) + ", rank " + std::to_string(q);
    if (o.code != ErrorCode::kCapacity || o.error.find(expect) == std::string::npos ||
        o.error.find("rank " + std::to_string(named)) == std::string::npos)
      throw Failure(where + ": expected kCapacity naming rank " + std::to_string(named) + " (" + expect +
                    "), got: " + o.error);
    if (!o.untouched) throw Failure(where + ": " + buffers + " changed in a refused call");
    if (o.seconds > 4) throw Failure(where + ": the error took " + std::to_string(o.seconds) + " s");
  }
}

// The communicator's deadline in the mismatch tests.
constexpr int64_t kMismatchTimeoutMs = 5000;

// Every rank raised kMismatch, or kAborted (released by another's mismatch), and one at least kMismatch,
// each within half the communicator's deadline: a mismatch found at once, not a wait that ran out.
void expect_mismatch_everywhere(const std::vector<Outcome>& outcomes, const std::string& what) {
  int mismatches = 0;
  for (size_t q = 0; q < outcomes.size(); ++q) {
    const Outcome& o = outcomes[q];
    const std::string where = what + ", world " + std::to_string(outcomes.size()) + ", rank " + std::to_string(q);
    if (o.code == ErrorCode::kMismatch) ++mismatches;
    if (o.code != ErrorCode::kMismatch && o.code != ErrorCode::kAborted)
      throw Failure(where + ": expected kMismatch, got: " + o.error);
    if (o.seconds > 0.5 * kMismatchTimeoutMs / 1000)
      throw Failure(where + ": the error took " + std::to_string(o.seconds) + " s: " + o.error);
  }
  if (mismatches == 0)
    throw Failure(what + ", world " + std::to_string(outcomes.size()) + ": no rank raised kMismatch");
}

// Runs `call` on a rank whose peer `missing` never comes: "error" when it raised kTimeout or
// kAborted naming the missing rank within three deadlines, else what happened.
std::string outcome_without(int missing, int64_t timeout_ms, SharedRank& r, const std::function<void()>& call) {
  const Outcome o = outcome_of(r, call);
  const bool named = o.error.find("rank " + std::to_string(missing)) != std::string::npos;
  std::string outcome = o.error == "no error" ? o.error
                        : (o.code == ErrorCode::kTimeout || o.code == ErrorCode::kAborted) && named
                            ? "error"
                            : "unexpected error: " + o.error;
  if (o.seconds > 3.0 * timeout_ms / 1000) outcome += " after " + std::to_string(o.seconds) + " s";
  return outcome;
}

TEST(shared_gpu_all_to_all_overflow_raises_on_every_rank) {
  struct Overflow {
    const char* name;
    Form form;
    int shrink_out_rank;  // this rank's output one row short (-1: none)
    int shrink_in_rank;   // this rank's input one row short (-1: none)
    int lie_rank;         // all_to_all_v: this rank expects one row fewer from rank 0 (-1: none)
    const char* expect;   // in every rank's message
  };
  for (int world : shared_gpu_worlds()) {
    const int last = world - 1;
    const Overflow cases[] = {
        {"vdev output one row short", Form::kDeviceSplits, last, -1, -1, "would receive"},
        {"2-D output one row short", Form::kTwoD, last, -1, -1, "would receive"},
        {"vdev input one row short", Form::kDeviceSplits, -1, 0, -1, "splits add up to"},
        {"all_to_all_v output splits disagree", Form::kHostSplits, -1, -1, last, "output splits expect"},
    };
    for (const Overflow& c : cases) {
      std::mutex mutex;
      std::vector<Outcome> outcomes(world);
      run_shared_ranks(
          world,
          [&](SharedRank& r) {
            const size_t row_bytes = 64;
            const int experts = c.form == Form::kTwoD ? 2 : 1;
            const Routing m = route(world, experts, c.form == Form::kTwoD ? 8 : 0, Skew::kZipf, 40, 0, 99);
            const int n = world * experts;
            size_t in_rows = m.input_rows[r.rank], out_rows = m.output_rows[r.rank];
            if (r.rank == c.shrink_out_rank) out_rows -= 1;
            if (r.rank == c.shrink_in_rank) in_rows -= 1;
            // Heap allocation is collective (every rank asks for the same bytes): buffers for the
            // largest rank; the overflow comes from the rows each rank declares, not from the buffers.
            const size_t most_in = *std::max_element(m.input_rows.begin(), m.input_rows.end());
            const size_t most_out = *std::max_element(m.output_rows.begin(), m.output_rows.end());
            Buffer* in = r.comm->allocate(std::max<size_t>(1, most_in) * row_bytes);
            Buffer* out = r.comm->allocate(std::max<size_t>(1, most_out) * row_bytes);
            DeviceBuffer splits_in(n * sizeof(int64_t)), splits_out(2 * n * sizeof(int64_t));
            std::vector<int64_t> mine(n), expect_from(world);
            for (int j = 0; j < n; ++j) mine[j] = m.splits[size_t(r.rank) * n + j];
            for (int s = 0; s < world; ++s) expect_from[s] = m.splits[size_t(s) * n + r.rank];
            if (r.rank == c.lie_rank) expect_from[0] -= 1;
            upload(splits_in.ptr, mine, r.stream);
            TEST_CUDA(cudaMemsetAsync(out->ptr(), kPoison, m.output_rows[r.rank] * row_bytes, r.stream));
            TEST_CUDA(cudaMemsetAsync(splits_out.ptr, kPoison, 2 * n * sizeof(int64_t), r.stream));
            fill_rows(in->ptr(), m.input_rows[r.rank], row_bytes, 5, r.rank, r.stream);
            TEST_CUDA(cudaStreamSynchronize(r.stream));
            wait_for_every_rank(r);
            Outcome outcome = outcome_of(r, [&] {
              const Operand o(*out), i(*in);
              switch (c.form) {
                case Form::kHostSplits:
                  all_to_all_v(o, out_rows, i, in_rows, mine.data(), expect_from.data(), row_bytes, *r.comm, r.stream,
                               {Algo::kAuto, 0, max_blocks_for_calls()});
                  break;
                case Form::kDeviceSplits:
                  all_to_all_vdev(o, out_rows, i, in_rows, static_cast<const int64_t*>(splits_in.ptr),
                                  static_cast<int64_t*>(splits_out.ptr), row_bytes, *r.comm, r.stream,
                                  {Algo::kAuto, 0, max_blocks_for_calls()});
                  break;
                case Form::kTwoD:
                  all_to_all_vdev_2d(o, out_rows, i, in_rows, static_cast<const int64_t*>(splits_in.ptr),
                                     static_cast<int64_t*>(splits_out.ptr), row_bytes, experts, 8, *r.comm, r.stream,
                                     {Algo::kAuto, 0, max_blocks_for_calls()});
                  break;
              }
            });
            const std::vector<uint8_t> got = download(out->ptr(), m.output_rows[r.rank] * row_bytes, r.stream);
            const std::vector<uint8_t> so = download(splits_out.ptr, 2 * n * sizeof(int64_t), r.stream);
            outcome.untouched = std::all_of(got.begin(), got.end(), [](uint8_t b) { return b == kPoison; }) &&
                                std::all_of(so.begin(), so.end(), [](uint8_t b) { return b == kPoison; });
            {
              std::lock_guard<std::mutex> lock(mutex);
              outcomes[r.rank] = outcome;
            }
            wait_for_every_rank(r);
            r.comm.reset();  // unusable now: released without the collective close
          },
          5000);
      const int named = c.shrink_out_rank >= 0  ? c.shrink_out_rank
                        : c.shrink_in_rank >= 0 ? c.shrink_in_rank
                                                : c.lie_rank;
      expect_capacity_everywhere(outcomes, c.name, named, c.expect, "a rank's output or out_splits_offsets");
    }
  }
}

// --- graphs -----------------------------------------------------------------------------------

// A captured all_to_all_vdev (and 2-D) whose routing and data change every replay on the device:
// the graph fills the splits and rows from a device counter, runs the call, checks this rank's
// output and out_splits_offsets on the device against the layout, and advances the counter.
// 1000 replays; nothing of the call needs the host between them. The harness synchronises each
// rank every few replays (replay_captured: the ranks' pending launches together at most
// kSharedLaunchBudget): the ranks share one CUDA context, whose launch queue a rank far ahead fills
// with work that waits for a rank behind, which then cannot launch (at 8 ranks on one H100 without
// a window, ranks 7 and 6 waited for rank 0 until the deadline, in this test and in the MoE one;
// with 50 replays a window, at 4 and 8 ranks).
TEST(shared_gpu_all_to_all_vdev_graph_replays_follow_device_routing) {
  constexpr int kReplays = 1000;
  for (int world : shared_gpu_worlds()) {
    const int budget = max_blocks_for_calls();
    for (const auto& [experts, align] : {std::pair<int, int64_t>{1, 0}, std::pair<int, int64_t>{2, 4}}) {
      run_shared_ranks(world, [&](SharedRank& r) {
        const uint64_t row_bytes = 48;
        const uint32_t max_entry = 24;
        const int n = world * experts;
        // Worst case: every sender sends max_entry rows to every destination, padded.
        const uint64_t in_rows = uint64_t(n) * max_entry;
        const uint64_t out_rows = uint64_t(world) * max_entry * experts + uint64_t(experts) * (align + 1);
        Buffer* in = r.comm->allocate(in_rows * row_bytes);
        Buffer* out = r.comm->allocate(out_rows * row_bytes);
        DeviceBuffer splits_in(n * sizeof(int64_t)), splits_out(2 * n * sizeof(int64_t)), replay(sizeof(uint64_t));
        Counters wrong(1, r.stream);
        TEST_CUDA(cudaMemsetAsync(replay.ptr, 0, sizeof(uint64_t), r.stream));
        TEST_CUDA(cudaStreamSynchronize(r.stream));
        wait_for_every_rank(r);
        const RoutedCall call{0xA11CE, r.rank,    world,     experts,
                              align,   row_bytes, max_entry, static_cast<const uint64_t*>(replay.ptr)};
        const CollectiveOptions o{Algo::kAuto, 0, budget};
        auto one_call = [&] {
          TEST_CUDA(cudaMemsetAsync(out->ptr(), kPoison, out_rows * row_bytes, r.stream));
          fill_routed_input(call, static_cast<int64_t*>(splits_in.ptr), in->ptr(), r.stream);
          if (align == 0)
            all_to_all_vdev(Operand(*out), out_rows, Operand(*in), in_rows, static_cast<const int64_t*>(splits_in.ptr),
                            static_cast<int64_t*>(splits_out.ptr), row_bytes, *r.comm, r.stream, o);
          else
            all_to_all_vdev_2d(Operand(*out), out_rows, Operand(*in), in_rows,
                               static_cast<const int64_t*>(splits_in.ptr), static_cast<int64_t*>(splits_out.ptr),
                               row_bytes, experts, align, *r.comm, r.stream, o);
          check_routed_output(call, out->ptr(), out_rows, static_cast<const int64_t*>(splits_out.ptr), kPoison,
                              wrong.at(0), r.stream);
          advance_replay(static_cast<uint64_t*>(replay.ptr), r.stream);
        };
        one_call();  // eager first: the same check
        replay_captured(r, one_call, kReplays);
        const unsigned long long bad = wrong.read(r.stream)[0];
        uint64_t replays = 0;
        const std::vector<uint8_t> counter = download(replay.ptr, sizeof(uint64_t), r.stream);
        std::memcpy(&replays, counter.data(), sizeof(replays));
        if (bad)
          throw Failure("experts " + std::to_string(experts) + ": " + std::to_string(bad) +
                        " wrong bytes or offsets over " + std::to_string(kReplays) + " replays");
        if (replays != uint64_t(kReplays) + 1)
          throw Failure("the replay counter reached " + std::to_string(replays) + ", expected " +
                        std::to_string(kReplays + 1));
      });
    }
  }
}

// --- failures ---------------------------------------------------------------------------------

TEST(shared_gpu_all_to_all_missing_rank_is_named_in_time) {
  constexpr int64_t kTimeoutMs = 3000;
  for (int world : shared_gpu_worlds()) {
    for (bool device_splits : {true, false}) {
      std::mutex mutex;
      std::vector<std::string> outcomes(world);
      run_shared_ranks(
          world,
          [&](SharedRank& r) {
            const int missing = world - 1;
            Buffer* in = r.comm->allocate(64 * world);
            Buffer* out = r.comm->allocate(64 * world);
            DeviceBuffer splits_in(world * sizeof(int64_t)), splits_out(2 * world * sizeof(int64_t));
            const std::vector<int64_t> ones(world, 1);
            upload(splits_in.ptr, ones, r.stream);
            wait_for_every_rank(r);
            std::string outcome = "absent";
            if (r.rank != missing) {
              outcome = outcome_without(missing, kTimeoutMs, r, [&] {
                const CollectiveOptions o{Algo::kAuto, 0, max_blocks_for_calls()};
                if (device_splits)
                  all_to_all_vdev(Operand(*out), world, Operand(*in), world, static_cast<const int64_t*>(splits_in.ptr),
                                  static_cast<int64_t*>(splits_out.ptr), 64, *r.comm, r.stream, o);
                else
                  all_to_all(Operand(*out), Operand(*in), 64, *r.comm, r.stream, o);
              });
            }
            TEST_CUDA(cudaStreamSynchronize(r.stream));
            wait_for_every_rank(r);
            r.comm.reset();
            std::lock_guard<std::mutex> lock(mutex);
            outcomes[r.rank] = outcome;
          },
          kTimeoutMs);
      for (int q = 0; q + 1 < world; ++q)
        if (outcomes[q] != "error")
          throw Failure(std::string(device_splits ? "all_to_all_vdev" : "all_to_all") + ", world " +
                        std::to_string(world) + ", rank " + std::to_string(q) + " (rank " + std::to_string(world - 1) +
                        " absent): " + outcomes[q]);
    }
  }
}

TEST(shared_gpu_all_to_all_mismatched_call_fails_everywhere) {
  for (int world : shared_gpu_worlds()) {
    std::mutex mutex;
    std::vector<Outcome> outcomes(world);
    run_shared_ranks(
        world,
        [&](SharedRank& r) {
          Buffer* in = r.comm->allocate(4096 * world);
          Buffer* out = r.comm->allocate(4096 * world);
          DeviceBuffer splits_in(world * sizeof(int64_t)), splits_out(2 * world * sizeof(int64_t));
          const std::vector<int64_t> ones(world, 1);
          upload(splits_in.ptr, ones, r.stream);
          wait_for_every_rank(r);
          // The last rank's rows are wider: another signature on its lines.
          const size_t row_bytes = r.rank == world - 1 ? 80 : 64;
          Outcome outcome = outcome_of(r, [&] {
            all_to_all_vdev(Operand(*out), world, Operand(*in), world, static_cast<const int64_t*>(splits_in.ptr),
                            static_cast<int64_t*>(splits_out.ptr), row_bytes, *r.comm, r.stream,
                            {Algo::kAuto, 0, max_blocks_for_calls()});
          });
          wait_for_every_rank(r);
          r.comm.reset();
          std::lock_guard<std::mutex> lock(mutex);
          outcomes[r.rank] = outcome;
        },
        kMismatchTimeoutMs);
    expect_mismatch_everywhere(outcomes, "all_to_all_vdev with another row width on the last rank");
  }
}

// --- MoE dispatch / combine ----------------------------------------------------------------

// A context's max_blocks: EpConfig's default (the planner's share of the GPU holds it to what the
// ranks sharing the GPU may use), or SYMMEM_SHARED_GPU_BLOCKS.
int ep_max_blocks() { return max_blocks_for_calls() > 0 ? max_blocks_for_calls() : EpConfig{}.max_blocks; }

// A context's geometry as the library makes it: SYMMEM_MOE_COMBINE, which the communicators agree
// on (read by the library's own reader), decides whether an expert-major combine reduces on the
// experts' side (and so the order of its sums, expected_combine).
detail::EpGeometry moe_geometry(const EpConfig& config, int world) {
  const detail::AgreedSettings settings = detail::read_agreed_settings(CommConfig{}, detail::TuningTable{});
  return detail::ep_geometry(config, world, detail::MoeCombinePath(settings.moe_combine_path));
}

// A small context: `experts_per_rank` experts on every rank.
EpConfig small_config(int world, int experts_per_rank, int topk, int hidden, int tokens, EpLayout layout) {
  EpConfig c;
  c.num_experts = experts_per_rank * world;
  c.topk = topk;
  c.hidden = hidden;
  c.max_tokens_per_rank = tokens;
  c.layout = layout;
  c.max_blocks = ep_max_blocks();
  return c;
}

float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even (finite values)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// The fake expert output for column c of a received row, known to the sender too: a small
// multiple of 1/8 from (sender, token, entry or rank, column), exact in bfloat16.
uint16_t expert_output(uint64_t seed, int s, int t, int which, int c) {
  const uint64_t h = mix64(seed ^ mix64(uint64_t(s) << 40 ^ uint64_t(t) << 20 ^ uint64_t(which) << 12) ^ uint64_t(c));
  return float_to_bf16(float(int(h % 65) - 32) / 8.f);
}

// Rank `rank`'s router weight i (token i / K, entry i % K) in a case of `seed`, known to every rank.
float moe_weight(uint64_t seed, int rank, size_t i) {
  return float(1 + mix64(seed ^ (uint64_t(rank) << 32) ^ i) % 997) / 512.f;
}

// The fake experts' outputs of `rank`, laid out like its combine area: every received row's
// expert_output from its source, 0xFFFF elsewhere.
std::vector<uint16_t> fake_expert_outputs(const detail::EpGeometry& g, const EpExpected& x, int rank, uint64_t seed) {
  std::vector<uint16_t> outputs(g.combine_bytes / 2, 0xFFFF);
  const int groups = g.expert_major ? g.local_experts : 1;
  for (int e = 0; e < groups; ++e) {
    const auto& list = x.rows[rank][e];
    for (size_t i = 0; i < list.size(); ++i) {
      const size_t row = size_t(e) * (g.expert_major ? g.rows_per_expert : 0) + i;
      for (int col = 0; col < g.hidden; ++col)
        outputs[row * g.hidden + col] =
            expert_output(seed, list[i].rank, list[i].token, g.expert_major ? list[i].k : rank, col);
    }
  }
  return outputs;
}

// What combine writes on `rank` ([T, H] bfloat16) for the fake experts of `seed`: float32 in top-k
// (rank) order, rounded once; reduced on the experts' side (g.combine_reduced), the partial of each
// rank holding routes (its routes in top-k order, from 0, rounded to bfloat16) added in rank order
// from 0, rounded again. Rows past the rank's tokens keep the poison 0xFFFF.
std::vector<uint16_t> expected_combine(const detail::EpGeometry& g, const std::vector<EpRouting>& routing,
                                       const EpExpected& x, int rank, uint64_t seed, uint64_t weight_seed,
                                       bool weights_applied) {
  const int K = g.topk, H = g.hidden;
  const EpRouting& mine = routing[rank];
  std::vector<uint16_t> expected(size_t(g.max_tokens) * H, 0xFFFF);
  for (int t = 0; t < mine.tokens; ++t)
    for (int col = 0; col < H; ++col) {
      float acc = 0.f;
      if (g.combine_reduced) {
        for (int q = 0; q < g.world; ++q) {
          float partial = 0.f;
          bool routed = false;
          for (int k = 0; k < K; ++k) {
            const int64_t e = mine.ids[size_t(t) * K + k];
            if (e < 0 || e / g.local_experts != q) continue;
            const float w = weights_applied ? 1.f : moe_weight(weight_seed, rank, size_t(t) * K + k);
            partial = std::fmaf(w, bf16_to_float(expert_output(seed, rank, t, k, col)), partial);
            routed = true;
          }
          if (routed) acc = std::fmaf(1.f, bf16_to_float(float_to_bf16(partial)), acc);
        }
      } else if (g.expert_major) {
        for (int k = 0; k < K; ++k) {
          if (mine.ids[size_t(t) * K + k] < 0) continue;
          const float w = weights_applied ? 1.f : moe_weight(weight_seed, rank, size_t(t) * K + k);
          acc = std::fmaf(w, bf16_to_float(expert_output(seed, rank, t, k, col)), acc);
        }
      } else {
        for (int q = 0; q < g.world; ++q)
          if (x.route[rank][size_t(t) * g.world + q].rank >= 0)
            acc = std::fmaf(1.f, bf16_to_float(expert_output(seed, rank, t, q, col)), acc);
      }
      expected[size_t(t) * H + col] = float_to_bf16(acc);
    }
  return expected;
}

// Elements of a downloaded bfloat16 output that differ from `expected`.
size_t wrong_elements(const std::vector<uint8_t>& got, const std::vector<uint16_t>& expected) {
  size_t wrong = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    uint16_t v;
    std::memcpy(&v, &got[i * 2], 2);
    wrong += v != expected[i];
  }
  return wrong;
}

// kIdleRank: the last rank has no tokens and passes null tensors and a null out (with a host count;
// with a device count, its tensors and a count of 0); the others route to its experts too.
enum class MoeSkew { kRandom, kZipf, kOneHotAtCapacity, kEmptyRanks, kMasked, kFullBatch, kIdleRank };
const char* moe_skew_name(MoeSkew s) {
  static const char* names[] = {"random", "zipf", "one-hot at capacity", "empty ranks", "masked", "full batch",
                                "idle rank"};
  return names[int(s)];
}

std::vector<EpRouting> moe_routing(const detail::EpGeometry& g, MoeSkew skew, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<EpRouting> routing(g.world);
  for (int s = 0; s < g.world; ++s) {
    EpRouting& r = routing[s];
    const bool full = skew == MoeSkew::kOneHotAtCapacity || skew == MoeSkew::kFullBatch;
    r.tokens = full                                         ? g.max_tokens
               : skew == MoeSkew::kEmptyRanks && s % 2 == 1 ? 0
               : skew == MoeSkew::kIdleRank                 ? (s == g.world - 1 ? 0 : 1 + int(rng() % g.max_tokens))
                                                            : int(rng() % (g.max_tokens + 1));
    r.ids.assign(size_t(g.max_tokens) * g.topk, -1);
    for (int t = 0; t < g.max_tokens; ++t)
      for (int k = 0; k < g.topk; ++k) {
        int64_t e = int64_t(rng() % g.experts);
        if (skew == MoeSkew::kZipf)
          e = std::min<int64_t>(g.experts - 1,
                                int64_t(std::pow(double(g.experts), std::pow(double(rng() % 1000) / 1000, 2))) - 1);
        if (skew == MoeSkew::kOneHotAtCapacity) e = k == 0 ? 0 : -1;
        if (skew == MoeSkew::kMasked && rng() % 3 == 0) e = -1;
        for (int k2 = 0; k2 < k; ++k2)
          if (r.ids[size_t(t) * g.topk + k2] == e) e = -1;
        r.ids[size_t(t) * g.topk + k] = e;
      }
  }
  return routing;
}

struct MoeCase {
  EpLayout layout;
  EpPayload payload;
  MoeSkew skew;
  int experts_per_rank, topk, tokens;
  bool device_count, int32_ids, staged_outputs, weights_applied;
  int hidden = 256;
  int max_blocks = 0;  // 0: the context's default
  std::string describe() const {
    return std::string(ep_layout_name(layout)) + " " + ep_payload_name(payload) + " " + moe_skew_name(skew) +
           " experts/rank=" + std::to_string(experts_per_rank) + " topk=" + std::to_string(topk) +
           " tokens=" + std::to_string(tokens) + (device_count ? " device-count" : "") +
           (int32_ids ? " int32-ids" : "") + (staged_outputs ? " staged-outputs" : "") +
           (weights_applied ? " weights-applied" : "") + " hidden=" + std::to_string(hidden) +
           (max_blocks ? " max_blocks=" + std::to_string(max_blocks) : "");
  }
};

std::vector<MoeCase> moe_cases() {
  std::vector<MoeCase> cases;
  int i = 0;
  for (EpLayout layout : {EpLayout::kExpertMajor, EpLayout::kRankMajor})
    for (EpPayload payload : {EpPayload::kBFloat16, EpPayload::kFloat8E4M3})
      for (MoeSkew skew :
           {MoeSkew::kRandom, MoeSkew::kZipf, MoeSkew::kOneHotAtCapacity, MoeSkew::kEmptyRanks, MoeSkew::kMasked}) {
        ++i;
        const int tokens = skew == MoeSkew::kOneHotAtCapacity ? 37 : (i % 3 == 0 ? 1 : i % 3 == 1 ? 70 : 33);
        cases.push_back({layout, payload, skew, i % 2 ? 2 : 3, i % 4 == 0 ? 1 : (i % 4 == 1 ? 4 : 2), tokens,
                         i % 2 == 0, i % 3 == 0, i % 2 == 1, layout == EpLayout::kExpertMajor && i % 5 == 0});
      }
  // Every combine specialisation (2, 4, 8 and 16 sources), hidden sizes that are not a multiple of
  // 256 columns, rows the bulk path cuts into several chunks (kernels/moe_combine.cu: 1024 columns
  // at 16 sources, 1408 at 11, 2048 at 8), and enough units that every block's ring of bulk stages
  // wraps more than once (up to 600 tokens, 300 on average, x up to 2 chunks over at most 24 blocks).
  cases.push_back({EpLayout::kExpertMajor, EpPayload::kBFloat16, MoeSkew::kRandom, 3, 16, 33, false, false, false,
                   false, 2304});
  cases.push_back({EpLayout::kExpertMajor, EpPayload::kFloat8E4M3, MoeSkew::kMasked, 2, 8, 21, true, true, true,
                   true, 384});
  cases.push_back({EpLayout::kExpertMajor, EpPayload::kBFloat16, MoeSkew::kZipf, 4, 11, 17, false, true, true,
                   false, 2816});
  cases.push_back({EpLayout::kRankMajor, EpPayload::kBFloat16, MoeSkew::kRandom, 2, 4, 600, false, false, false,
                   false, 2816});
  cases.push_back({EpLayout::kRankMajor, EpPayload::kBFloat16, MoeSkew::kRandom, 2, 6, 29, true, false, false,
                   false, 2304});
  // The dispatch's bulk path (kernels/moe_dispatch_push.cu takes_bulk: whole rows of 1 to 7 KiB, a
  // warp per token): one block of 16 warps and 70 tokens on every rank (full batch), so that each
  // warp's two stages take turns four or five times; a row exactly the stage's size, a 2 KiB one,
  // and one of 7296 bytes, 128 over the stage (the register path with whole rows).
  cases.push_back({EpLayout::kRankMajor, EpPayload::kFloat8E4M3, MoeSkew::kFullBatch, 2, 4, 70, false, false, false,
                   false, 7168, 1});
  cases.push_back({EpLayout::kExpertMajor, EpPayload::kBFloat16, MoeSkew::kFullBatch, 2, 3, 70, true, true, true,
                   false, 1024, 1});
  cases.push_back({EpLayout::kRankMajor, EpPayload::kFloat8E4M3, MoeSkew::kFullBatch, 3, 5, 70, false, false, false,
                   false, 7296, 1});
  return cases;
}

// A rank with no tokens, in both layouts and payloads, with a host count (null tensors, a null
// out) and with a device count (its tensors, a count of 0); the outputs staged or read in place.
std::vector<MoeCase> moe_idle_rank_cases() {
  std::vector<MoeCase> cases;
  for (EpLayout layout : {EpLayout::kExpertMajor, EpLayout::kRankMajor})
    for (EpPayload payload : {EpPayload::kBFloat16, EpPayload::kFloat8E4M3})
      for (bool device_count : {false, true})
        cases.push_back({layout, payload, MoeSkew::kIdleRank, 2, 3, 24, device_count, payload == EpPayload::kBFloat16,
                         device_count, false});
  return cases;
}

// One rank's device memory for a MoE case: inputs up to T tokens, the output, a staging copy of
// the expert outputs.
struct MoeMemory {
  std::unique_ptr<DeviceBuffer> x, scales, ids, weights, count, out, out_again, expert_out;
};

// Runs one case on rank r with a fresh context; returns "" or what was wrong.
std::string run_moe_case(const MoeCase& c, SharedRank& r, uint64_t seed) {
  EpConfig config;
  config.num_experts = c.experts_per_rank * r.world;
  config.topk = c.topk;
  config.hidden = c.hidden;
  config.max_tokens_per_rank = c.tokens;
  config.payload = c.payload;
  config.layout = c.layout;
  config.max_blocks = c.max_blocks > 0 ? c.max_blocks : ep_max_blocks();
  // One-hot at capacity: every token of every rank to expert 0 (rank 0), which holds exactly that.
  if (c.skew == MoeSkew::kOneHotAtCapacity) {
    if (c.layout == EpLayout::kExpertMajor)
      config.max_tokens_per_expert = r.world * c.tokens;
    else
      config.max_received_rows = r.world * c.tokens;
  }
  const detail::EpGeometry g = moe_geometry(config, r.world);
  const std::vector<EpRouting> routing = moe_routing(g, c.skew, seed);
  const EpExpected x = ep_expected(g, routing);
  if (x.fault.kind != detail::kFaultNone) return "the case itself overflows";
  const EpRouting& mine = routing[r.rank];
  const int T = c.tokens, K = c.topk, H = config.hidden;

  wait_for_every_rank(r);
  std::unique_ptr<EpContext> ctx = EpContext::create(*r.comm, config);
  // The references follow the path this test expects: the library must have taken it.
  if (g.combine_reduced != (ctx->describe().find(", reduced)") != std::string::npos))
    return "the context took another combine than expected: " + ctx->describe();
  MoeMemory m;
  m.x = std::make_unique<DeviceBuffer>(size_t(T) * g.payload_bytes);
  m.scales = std::make_unique<DeviceBuffer>(size_t(T) * std::max<size_t>(g.scale_bytes, 4));
  m.ids = std::make_unique<DeviceBuffer>(size_t(T) * K * 8);
  m.weights = std::make_unique<DeviceBuffer>(size_t(T) * K * 4);
  m.count = std::make_unique<DeviceBuffer>(4);
  m.out = std::make_unique<DeviceBuffer>(size_t(T) * H * 2);
  m.out_again = std::make_unique<DeviceBuffer>(size_t(T) * H * 2);
  m.expert_out = std::make_unique<DeviceBuffer>(g.combine_bytes);
  const EpReceived rec = ctx->received();
  wait_for_every_rank(r);

  // Inputs: payload bits and scales from the keyed hash, ids, weights, the count.
  fill_rows(m.x->ptr, T, g.payload_bytes, seed, r.rank, r.stream);
  if (g.fp8) fill_rows(m.scales->ptr, T, g.scale_bytes, seed ^ 0x5CA1E, r.rank, r.stream);
  std::vector<float> weights(size_t(T) * K);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = moe_weight(seed, r.rank, i);
  upload(m.weights->ptr, weights, r.stream);
  if (c.int32_ids) {
    std::vector<int32_t> ids(mine.ids.begin(), mine.ids.end());
    upload(m.ids->ptr, ids, r.stream);
  } else {
    upload(m.ids->ptr, mine.ids, r.stream);
  }
  upload(m.count->ptr, std::vector<int32_t>{mine.tokens}, r.stream);
  TEST_CUDA(cudaMemsetAsync(rec.x, kPoison, g.dispatch_bytes, r.stream));
  TEST_CUDA(cudaMemsetAsync(m.out->ptr, 0xFF, size_t(T) * H * 2, r.stream));
  TEST_CUDA(cudaMemsetAsync(m.out_again->ptr, 0xFF, size_t(T) * H * 2, r.stream));

  // An idle rank with a host count passes what torch's empty tensors give: null pointers.
  const bool null_tensors = c.skew == MoeSkew::kIdleRank && mine.tokens == 0 && !c.device_count;
  EpDispatchArgs d;
  d.x = null_tensors ? nullptr : m.x->ptr;
  d.x_scales = g.fp8 && !null_tensors ? static_cast<const float*>(m.scales->ptr) : nullptr;
  d.topk_idx = null_tensors ? nullptr : m.ids->ptr;
  d.topk_idx_int64 = !c.int32_ids;
  d.topk_weights = null_tensors ? nullptr : static_cast<const float*>(m.weights->ptr);
  d.num_tokens = c.device_count ? 0 : mine.tokens;
  d.num_tokens_device = c.device_count ? static_cast<const int32_t*>(m.count->ptr) : nullptr;
  ctx->dispatch(d, r.stream);
  r.comm->synchronize(r.stream);

  // What arrived: every received row's payload, scales, ids, weights; the counts.
  std::string wrong;
  auto note = [&](const std::string& w) { wrong += (wrong.empty() ? "" : "; ") + w; };
  const std::vector<uint8_t> area = download(rec.x, g.dispatch_bytes, r.stream);
  std::vector<int32_t> counts(g.local_experts + 1);
  {
    const std::vector<uint8_t> a = download(rec.expert_num_tokens, g.local_experts * 4, r.stream);
    std::memcpy(counts.data(), a.data(), a.size());
    const std::vector<uint8_t> b = download(rec.num_rows, 4, r.stream);
    std::memcpy(&counts[g.local_experts], b.data(), 4);
  }
  for (int e = 0; e < g.local_experts; ++e)
    if (counts[e] != x.expert_num_tokens[r.rank][e]) note("expert_num_tokens[" + std::to_string(e) + "] wrong");
  if (counts[g.local_experts] != x.num_rows[r.rank]) note("num_rows wrong");
  size_t bad_rows = 0, bad_meta = 0;
  const int groups = g.expert_major ? g.local_experts : 1;
  for (int e = 0; e < groups; ++e) {
    const auto& list = x.rows[r.rank][e];
    for (size_t i = 0; i < list.size(); ++i) {
      const EpSource& src = list[i];
      const size_t row = size_t(e) * (g.expert_major ? g.rows_per_expert : 0) + i;
      bool ok = true;
      for (size_t b = 0; b < g.payload_bytes; ++b)
        ok &= area[g.x_offset + row * g.payload_bytes + b] == row_byte(seed, src.rank, src.token, b);
      for (size_t b = 0; b < g.scale_bytes; ++b)
        ok &= area[g.scales_offset + row * g.scale_bytes + b] == row_byte(seed ^ 0x5CA1E, src.rank, src.token, b);
      bad_rows += !ok;
      if (!g.expert_major) {
        for (int k = 0; k < K; ++k) {
          int32_t id, expected_id;
          float w;
          std::memcpy(&id, &area[g.topk_idx_offset + (row * K + k) * 4], 4);
          std::memcpy(&w, &area[g.topk_weights_offset + (row * K + k) * 4], 4);
          const int64_t e2 = routing[src.rank].ids[size_t(src.token) * K + k];
          expected_id = e2 >= 0 && e2 / g.local_experts == r.rank ? int32_t(e2 % g.local_experts) : -1;
          const float expected_w = moe_weight(seed, src.rank, size_t(src.token) * K + k);
          bad_meta += id != expected_id || w != expected_w;
        }
      }
    }
  }
  if (!g.expert_major)  // rows past the received ones: ids -1
    for (size_t row = x.rows[r.rank][0].size(); row < size_t(g.rows); ++row)
      for (int k = 0; k < K; ++k) {
        int32_t id;
        std::memcpy(&id, &area[g.topk_idx_offset + (row * K + k) * 4], 4);
        bad_meta += id != -1;
      }
  if (bad_rows) note(std::to_string(bad_rows) + " received rows wrong");
  if (bad_meta) note(std::to_string(bad_meta) + " received ids or weights wrong");

  // Fake experts: every received row's output from its source, written into the combine input
  // (zero copy) or a separate buffer (staged by combine).
  const std::vector<uint16_t> outputs = fake_expert_outputs(g, x, r.rank, seed);
  upload(c.staged_outputs ? m.expert_out->ptr : rec.combine_input, outputs, r.stream);
  wait_for_every_rank(r);  // (the outputs are uploaded synchronously; the combine's lines order the rest)

  EpCombineArgs cb;
  cb.expert_out = c.staged_outputs ? m.expert_out->ptr : nullptr;
  cb.out = null_tensors ? nullptr : m.out->ptr;
  cb.weights_applied = c.weights_applied;
  ctx->combine(cb, r.stream);
  // Again, on the same expert outputs: another dispatch first (the calls alternate), then combine.
  ctx->dispatch(d, r.stream);
  if (!c.staged_outputs) upload(rec.combine_input, outputs, r.stream);
  r.comm->synchronize(r.stream);
  wait_for_every_rank(r);
  cb.out = null_tensors ? nullptr : m.out_again->ptr;
  ctx->combine(cb, r.stream);
  r.comm->synchronize(r.stream);

  // The expected combine: float32 in top-k (rank) order, rounded once.
  const std::vector<uint8_t> got = download(m.out->ptr, size_t(T) * H * 2, r.stream);
  const std::vector<uint8_t> again = download(m.out_again->ptr, size_t(T) * H * 2, r.stream);
  const size_t bad_out = wrong_elements(got, expected_combine(g, routing, x, r.rank, seed, seed, c.weights_applied));
  if (bad_out) note(std::to_string(bad_out) + " combined elements wrong");
  if (got != again) note("the second combine of the same outputs differs (not bit-identical)");
  wait_for_every_rank(r);
  ctx->close();
  return wrong;
}

void run_moe_cases(const std::vector<MoeCase>& cases) {
  for (int world : shared_gpu_worlds()) {
    run_shared_ranks(world, [&](SharedRank& r) {
      Findings findings;
      uint64_t id = uint64_t(world) << 40;
      for (const MoeCase& c : cases) {
        const std::string wrong = run_moe_case(c, r, mix64(++id));
        if (!wrong.empty()) findings.add(c.describe() + ": " + wrong);
      }
      findings.raise(r);
    });
  }
}

TEST(shared_gpu_moe_dispatch_combine_match_reference) { run_moe_cases(moe_cases()); }

// An idle rank (0 tokens) dispatches and combines with its peers: on 0bbf9f1 it raised alone
// ("x, topk_idx and topk_weights are required") and its peers waited until the deadline.
TEST(shared_gpu_moe_with_an_idle_rank_matches_reference) { run_moe_cases(moe_idle_rank_cases()); }

// A dispatch that does not fit: every rank raises kCapacity naming the expert or rank (or the
// rank with too many tokens, or the bad id), and no rank's receive area changed.
TEST(shared_gpu_moe_overflow_raises_on_every_rank) {
  struct Overflow {
    const char* name;
    EpLayout layout;
    int capacity_short;  // rows fewer than one-hot routing needs (0: none)
    bool too_many_tokens;
    bool bad_id;
    const char* expect;
  };
  const Overflow cases[] = {
      {"expert-major: expert 0 one row short", EpLayout::kExpertMajor, 1, false, false,
       "expert 0 of rank 0 would receive"},
      {"rank-major: rank 0 one row short", EpLayout::kRankMajor, 1, false, false, "rank 0 would receive"},
      {"device token count above T", EpLayout::kExpertMajor, 0, true, false, "tokens, but its context holds"},
      {"expert id out of range", EpLayout::kRankMajor, 0, false, true, "routed a token to expert"},
  };
  for (int world : shared_gpu_worlds()) {
    for (const Overflow& c : cases) {
      std::mutex mutex;
      std::vector<Outcome> outcomes(world);
      run_shared_ranks(
          world,
          [&](SharedRank& r) {
            const int T = 24, K = 2, H = 256;
            EpConfig config = small_config(world, 2, K, H, T, c.layout);
            if (c.capacity_short) {
              if (c.layout == EpLayout::kExpertMajor)
                config.max_tokens_per_expert = world * T - c.capacity_short;
              else
                config.max_received_rows = world * T - c.capacity_short;
            }
            std::unique_ptr<EpContext> ctx = EpContext::create(*r.comm, config);
            const detail::EpGeometry g = moe_geometry(config, world);
            DeviceBuffer x(size_t(T) * H * 2), ids(size_t(T) * K * 8), weights(size_t(T) * K * 4), count(4);
            std::vector<int64_t> routing(size_t(T) * K, -1);
            for (int t = 0; t < T; ++t) routing[size_t(t) * K] = 0;  // one-hot: expert 0
            if (c.bad_id && r.rank == world - 1) routing[5] = 2 * world + 3;
            upload(ids.ptr, routing, r.stream);
            upload(weights.ptr, std::vector<float>(size_t(T) * K, 0.5f), r.stream);
            const int tokens = c.too_many_tokens && r.rank == world - 1 ? T + 5 : T;
            upload(count.ptr, std::vector<int32_t>{tokens}, r.stream);
            fill_rows(x.ptr, T, H * 2, 3, r.rank, r.stream);
            const EpReceived rec = ctx->received();
            TEST_CUDA(cudaMemsetAsync(rec.x, kPoison, g.dispatch_bytes, r.stream));
            TEST_CUDA(cudaStreamSynchronize(r.stream));
            wait_for_every_rank(r);
            Outcome outcome = outcome_of(r, [&] {
              EpDispatchArgs d;
              d.x = x.ptr;
              d.topk_idx = ids.ptr;
              d.topk_weights = static_cast<const float*>(weights.ptr);
              d.num_tokens_device = static_cast<const int32_t*>(count.ptr);
              ctx->dispatch(d, r.stream);
            });
            const std::vector<uint8_t> area = download(rec.x, g.dispatch_bytes, r.stream);
            outcome.untouched = std::all_of(area.begin(), area.end(), [](uint8_t b) { return b == kPoison; });
            {
              std::lock_guard<std::mutex> lock(mutex);
              outcomes[r.rank] = outcome;
            }
            wait_for_every_rank(r);
            ctx.reset();
            r.comm.reset();
          },
          5000);
      expect_capacity_everywhere(outcomes, c.name, c.capacity_short ? 0 : world - 1, c.expect, "a receive area");
    }
  }
}

// 1000 replays of a captured step (routing from a device counter, dispatch, fake experts, combine,
// a device check of the combined output, counter += 1), the host synchronising only every few
// replays (as above);
// both layouts, both payload widths of the rows (bf16 x; the fp8 path is the same kernels).
TEST(shared_gpu_moe_graph_replays_follow_device_routing) {
  constexpr int kReplays = 1000;
  for (int world : shared_gpu_worlds()) {
    for (EpLayout layout : {EpLayout::kExpertMajor, EpLayout::kRankMajor}) {
      run_shared_ranks(world, [&](SharedRank& r) {
        const int T = 40, K = 3, H = 256;
        const EpConfig config = small_config(world, 4, K, H, T, layout);
        std::unique_ptr<EpContext> ctx = EpContext::create(*r.comm, config);
        DeviceBuffer x(size_t(T) * H * 2), ids(size_t(T) * K * 8), weights(size_t(T) * K * 4), count(4),
            out(size_t(T) * H * 2), replay(8);
        Counters wrong(1, r.stream);
        TEST_CUDA(cudaMemsetAsync(replay.ptr, 0, 8, r.stream));
        TEST_CUDA(cudaStreamSynchronize(r.stream));
        wait_for_every_rank(r);
        const EpReceived rec = ctx->received();
        const MoeRoutedCall call{0xE9,
                                 r.rank,
                                 world,
                                 config.num_experts,
                                 K,
                                 H,
                                 T,
                                 layout == EpLayout::kExpertMajor,
                                 static_cast<const uint64_t*>(replay.ptr),
                                 moe_geometry(config, world).combine_reduced};
        const MoeReceivedView view{rec.x,
                                   rec.topk_idx,
                                   rec.topk_weights,
                                   rec.expert_num_tokens,
                                   rec.num_rows,
                                   static_cast<long long>(rec.rows)};
        auto step = [&] {
          fill_moe_routed_input(call, static_cast<int64_t*>(ids.ptr), static_cast<float*>(weights.ptr),
                                static_cast<int32_t*>(count.ptr), x.ptr, r.stream);
          TEST_CUDA(cudaMemsetAsync(out.ptr, 0xFF, size_t(T) * H * 2, r.stream));
          EpDispatchArgs d;
          d.x = x.ptr;
          d.topk_idx = ids.ptr;
          d.topk_weights = static_cast<const float*>(weights.ptr);
          d.num_tokens_device = static_cast<const int32_t*>(count.ptr);
          ctx->dispatch(d, r.stream);
          run_fake_experts(call, view, rec.combine_input, r.stream);
          EpCombineArgs cb;
          cb.out = out.ptr;
          ctx->combine(cb, r.stream);
          check_moe_combine(call, out.ptr, static_cast<const int64_t*>(ids.ptr), static_cast<const float*>(weights.ptr),
                            static_cast<const int32_t*>(count.ptr), x.ptr, 0xFFFF, wrong.at(0), r.stream);
          advance_replay(static_cast<uint64_t*>(replay.ptr), r.stream);
        };
        step();  // eager first: the same check
        replay_captured(r, step, kReplays);
        const unsigned long long bad = wrong.read(r.stream)[0];
        if (bad)
          throw Failure(std::string(ep_layout_name(layout)) + ": " + std::to_string(bad) +
                        " wrong combined elements over " + std::to_string(kReplays) + " replays");
        wait_for_every_rank(r);
        ctx->close();
      });
    }
  }
}

// --- back-to-back combines -------------------------------------------------------------------

// Combines of different expert outputs (A, B, A) after one dispatch, back to back, each exact, with
// one rank far ahead: rank 0 dispatches one token and every other rank a full batch routed to rank
// 0's experts, so rank 0 leaves each combine long before the others have pulled their rows from its
// combine area, and overwrites that area at once: the next combine's staging copy, or (zero copy)
// the caller's next outputs written into combine_input on the stream. Only the combine's exit guard
// keeps those writes out of what a peer still reads (kernels/moe_combine.cu); the library built with
// SYMMEM_MUTANT_NO_COMBINE_EXIT_GUARD fails these cases. What makes the race show on one GPU:
//   - the readers start late (a delay kernel before their first combine): rank 0 waits at the entry
//     and writes the moment they have entered;
//   - the rows a reader sums last are those rank 0 overwrites first: every reader's last token goes
//     to expert 0 alone, which holds nothing else, and the staging copy starts every expert's rows at
//     once (expert-major); the zero-copy form writes the last tokens' rows before the rest (any
//     layout);
//   - 4 blocks, so that the readers' pulls take long.
// Eager rounds of [dispatch, combine A, combine B, combine A], then a graph of the same round
// replayed, its outputs checked on the device every replay.
struct LopsidedCase {
  EpLayout layout;
  bool staged;  // expert outputs passed to combine (staged), else written into combine_input
  std::string describe(int world) const {
    return std::string(ep_layout_name(layout)) + (staged ? " staged" : " zero-copy") + ", world " +
           std::to_string(world);
  }
};

// Rank 0: one token to its experts 1 and 2; every other rank: T tokens to the same, but its last
// token to expert 0 only.
std::vector<EpRouting> lopsided_routing(const detail::EpGeometry& g) {
  std::vector<EpRouting> routing(g.world);
  for (int s = 0; s < g.world; ++s) {
    EpRouting& r = routing[s];
    r.tokens = s == 0 ? 1 : g.max_tokens;
    r.ids.assign(size_t(g.max_tokens) * g.topk, -1);
    for (int t = 0; t < r.tokens; ++t) {
      const bool last = s > 0 && t == r.tokens - 1;
      r.ids[size_t(t) * g.topk] = last ? 0 : 1;
      if (!last) r.ids[size_t(t) * g.topk + 1] = 2;
    }
  }
  return routing;
}

TEST(shared_gpu_moe_back_to_back_combines_with_a_rank_ahead) {
  constexpr int kRounds = 3, kReplays = 20, kCombines = 3, kReaderDelayUs = 1000;
  const int T = 1024, K = 2, H = 2048;
  for (int world : shared_gpu_worlds()) {
    for (const LopsidedCase c :
         {LopsidedCase{EpLayout::kExpertMajor, true}, LopsidedCase{EpLayout::kExpertMajor, false},
          LopsidedCase{EpLayout::kRankMajor, true}, LopsidedCase{EpLayout::kRankMajor, false}}) {
      run_shared_ranks(world, [&](SharedRank& r) {
        EpConfig config = small_config(world, 3, K, H, T, c.layout);
        config.max_blocks = 4;
        const int rows = (world - 1) * T + 1;  // what rank 0's experts 1 and 2 (rank-major: rank 0) receive
        if (c.layout == EpLayout::kExpertMajor)
          config.max_tokens_per_expert = rows;
        else
          config.max_received_rows = rows;
        const detail::EpGeometry g = moe_geometry(config, world);
        const std::vector<EpRouting> routing = lopsided_routing(g);
        const EpExpected x = ep_expected(g, routing);
        if (x.fault.kind != detail::kFaultNone) throw Failure("the case itself overflows");
        const EpRouting& mine = routing[r.rank];
        const uint64_t seed = mix64(0xB2B ^ uint64_t(world) << 8 ^ uint64_t(c.layout) << 4 ^ uint64_t(c.staged));
        const uint64_t seeds[2] = {seed, mix64(seed + 1)};  // A and B
        const size_t out_bytes = size_t(T) * H * 2;

        std::unique_ptr<EpContext> ctx = EpContext::create(*r.comm, config);
        DeviceBuffer xin(size_t(T) * g.payload_bytes), ids(size_t(T) * K * 8), weights(size_t(T) * K * 4);
        DeviceBuffer outputs_a(g.combine_bytes), outputs_b(g.combine_bytes);
        std::vector<std::unique_ptr<DeviceBuffer>> out, expected;
        for (int i = 0; i < kCombines; ++i) out.push_back(std::make_unique<DeviceBuffer>(out_bytes));
        for (int i = 0; i < 2; ++i) expected.push_back(std::make_unique<DeviceBuffer>(out_bytes));
        Counters wrong(1, r.stream);
        const EpReceived rec = ctx->received();

        fill_rows(xin.ptr, T, g.payload_bytes, seed, r.rank, r.stream);
        upload(ids.ptr, mine.ids, r.stream);
        std::vector<float> w(size_t(T) * K);
        for (size_t i = 0; i < w.size(); ++i) w[i] = moe_weight(seed, r.rank, i);
        upload(weights.ptr, w, r.stream);
        DeviceBuffer* sources[2] = {&outputs_a, &outputs_b};
        std::vector<uint16_t> want[2];
        for (int i = 0; i < 2; ++i) {
          upload(sources[i]->ptr, fake_expert_outputs(g, x, r.rank, seeds[i]), r.stream);
          want[i] = expected_combine(g, routing, x, r.rank, seeds[i], seed, false);
          upload(expected[i]->ptr, want[i], r.stream);
        }
        // Rows of this rank's combine area that some reader's last token reads: the zero-copy form
        // writes them first.
        std::vector<int64_t> hot_rows;
        for (int s = 1; s < world; ++s) {
          const int t = routing[s].tokens - 1;
          const int places = g.expert_major ? K : world;
          for (int j = 0; j < places; ++j) {
            const EpPlace& p = x.route[s][size_t(t) * places + j];
            if (p.rank == r.rank) hot_rows.push_back(p.row);
          }
        }
        const size_t row_bytes = size_t(H) * 2;
        auto write_outputs = [&](const DeviceBuffer& from) {
          for (int64_t row : hot_rows)
            TEST_CUDA(cudaMemcpyAsync(static_cast<char*>(rec.combine_input) + row * row_bytes,
                                      static_cast<const char*>(from.ptr) + row * row_bytes, row_bytes,
                                      cudaMemcpyDeviceToDevice, r.stream));
          TEST_CUDA(cudaMemcpyAsync(rec.combine_input, from.ptr, g.combine_bytes, cudaMemcpyDeviceToDevice, r.stream));
        };
        EpDispatchArgs d;
        d.x = xin.ptr;
        d.topk_idx = ids.ptr;
        d.topk_weights = static_cast<const float*>(weights.ptr);
        d.num_tokens = mine.tokens;
        // One round: dispatch, then combines of A, B, A into out[0..2], back to back.
        auto round = [&] {
          for (int i = 0; i < kCombines; ++i) TEST_CUDA(cudaMemsetAsync(out[i]->ptr, 0xFF, out_bytes, r.stream));
          ctx->dispatch(d, r.stream);
          for (int i = 0; i < kCombines; ++i) {
            const DeviceBuffer& from = *sources[i % 2];
            if (!c.staged) write_outputs(from);
            if (i == 0 && r.rank != 0) launch_delay(kReaderDelayUs, r.stream);
            EpCombineArgs cb;
            cb.expert_out = c.staged ? from.ptr : nullptr;
            cb.out = out[i]->ptr;
            ctx->combine(cb, r.stream);
          }
        };
        TEST_CUDA(cudaStreamSynchronize(r.stream));
        wait_for_every_rank(r);

        std::string wrongs;
        for (int n = 0; n < kRounds; ++n) {
          round();
          r.comm->synchronize(r.stream);
          for (int i = 0; i < kCombines; ++i) {
            const size_t bad = wrong_elements(download(out[i]->ptr, out_bytes, r.stream), want[i % 2]);
            if (bad && wrongs.size() < 400)
              wrongs += " round " + std::to_string(n) + " combine " + std::to_string(i) + " (" + "AB"[i % 2] +
                        "): " + std::to_string(bad) + " elements wrong;";
          }
          wait_for_every_rank(r);
        }
        replay_captured(
            r,
            [&] {
              round();
              for (int i = 0; i < kCombines; ++i)
                count_differences(out[i]->ptr, expected[i % 2]->ptr, out_bytes, wrong.at(0), r.stream);
            },
            kReplays);
        const unsigned long long bad_bytes = wrong.read(r.stream)[0];
        if (bad_bytes) wrongs += " graph: " + std::to_string(bad_bytes) + " output bytes wrong over the replays;";
        wait_for_every_rank(r);
        ctx->close();
        if (!wrongs.empty()) throw Failure(c.describe(world) + ", rank " + std::to_string(r.rank) + ":" + wrongs);
      });
    }
  }
}

TEST(shared_gpu_moe_missing_rank_is_named_in_time) {
  constexpr int64_t kTimeoutMs = 3000;
  for (int world : shared_gpu_worlds()) {
    std::mutex mutex;
    std::vector<std::string> outcomes(world);
    run_shared_ranks(
        world,
        [&](SharedRank& r) {
          const int T = 8, K = 2, H = 256;
          std::unique_ptr<EpContext> ctx =
              EpContext::create(*r.comm, small_config(world, 2, K, H, T, EpLayout::kExpertMajor));
          DeviceBuffer x(size_t(T) * H * 2), ids(size_t(T) * K * 8), weights(size_t(T) * K * 4);
          upload(ids.ptr, std::vector<int64_t>(size_t(T) * K, 1), r.stream);
          upload(weights.ptr, std::vector<float>(size_t(T) * K, 1.f), r.stream);
          wait_for_every_rank(r);
          const int missing = world - 1;
          std::string outcome = "absent";
          if (r.rank != missing) {
            outcome = outcome_without(missing, kTimeoutMs, r, [&] {
              EpDispatchArgs d;
              d.x = x.ptr;
              d.topk_idx = ids.ptr;
              d.topk_weights = static_cast<const float*>(weights.ptr);
              d.num_tokens = T;
              ctx->dispatch(d, r.stream);
            });
          }
          TEST_CUDA(cudaStreamSynchronize(r.stream));
          wait_for_every_rank(r);
          ctx.reset();
          r.comm.reset();
          std::lock_guard<std::mutex> lock(mutex);
          outcomes[r.rank] = outcome;
        },
        kTimeoutMs);
    for (int q = 0; q + 1 < world; ++q)
      if (outcomes[q] != "error")
        throw Failure("moe_dispatch, world " + std::to_string(world) + ", rank " + std::to_string(q) + " (rank " +
                      std::to_string(world - 1) + " absent): " + outcomes[q]);
  }
}

// The last rank calls combine (or dispatches on a context of another shape) while the others
// dispatch: kMismatch, on the device, everywhere, at once (within half the communicator's
// deadline). Also after a round of dispatch and combine, where the combine has
// routes to wait for (the reduced combine's route lines).
TEST(shared_gpu_moe_mismatched_calls_fail_everywhere) {
  for (int world : shared_gpu_worlds()) {
    for (bool after_a_round : {false, true})
    for (bool other_shape : {false, true}) {
      std::mutex mutex;
      std::vector<Outcome> outcomes(world);
      run_shared_ranks(
          world,
          [&](SharedRank& r) {
            const int T = 8, K = 2;
            auto make = [&](int hidden) {
              return EpContext::create(*r.comm, small_config(world, 2, K, hidden, T, EpLayout::kExpertMajor));
            };
            std::unique_ptr<EpContext> a = make(256), b = make(512);
            DeviceBuffer x(size_t(T) * 512 * 2), ids(size_t(T) * K * 8), weights(size_t(T) * K * 4),
                out(size_t(T) * 512 * 2);
            std::vector<int64_t> routing(size_t(T) * K);
            for (size_t p = 0; p < routing.size(); ++p) routing[p] = int64_t(p % K);  // experts 0, 1: a round fits
            upload(ids.ptr, routing, r.stream);
            upload(weights.ptr, std::vector<float>(size_t(T) * K, 1.f), r.stream);
            EpDispatchArgs d;
            d.x = x.ptr;
            d.topk_idx = ids.ptr;
            d.topk_weights = static_cast<const float*>(weights.ptr);
            d.num_tokens = T;
            if (after_a_round) {
              EpCombineArgs cb;
              cb.out = out.ptr;
              a->dispatch(d, r.stream);
              a->combine(cb, r.stream);
              TEST_CUDA(cudaStreamSynchronize(r.stream));
            }
            wait_for_every_rank(r);
            Outcome outcome = outcome_of(r, [&] {
              if (r.rank != world - 1) {
                a->dispatch(d, r.stream);
              } else if (other_shape) {
                b->dispatch(d, r.stream);
              } else {
                EpCombineArgs cb;
                cb.out = out.ptr;
                a->combine(cb, r.stream);
              }
            });
            wait_for_every_rank(r);
            a.reset();
            b.reset();
            r.comm.reset();
            std::lock_guard<std::mutex> lock(mutex);
            outcomes[r.rank] = outcome;
          },
          kMismatchTimeoutMs);
      expect_mismatch_everywhere(outcomes, std::string(other_shape ? "another shape" : "combine against dispatch") +
                                               (after_a_round ? ", after a round" : ""));
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return shared_gpu_main(argc, argv); }
