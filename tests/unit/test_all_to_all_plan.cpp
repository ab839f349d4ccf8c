// The all-to-all's layout arithmetic (every row's place, from the split matrix) against a
// brute-force placement of every row, over many worlds, expert counts, alignments, skews and
// capacities; the capacity verdict; and the plan.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "plan/all_to_all_layout.hpp"
#include "plan/all_to_all_plan.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

namespace {

struct Matrix {
  int world = 1, experts = 1;
  int64_t align = 0;
  std::vector<uint32_t> splits;  // [s][q * experts + e]
  std::vector<uint32_t> input_rows, output_rows;
  SplitMatrix view() const { return {splits.data(), input_rows.data(), output_rows.data(), world, experts, align}; }
};

enum class Skew { kUniform, kZipf, kOneHot, kEmptyRanks, kRandom };

// Rows of a matrix of the given skew; capacities exactly what is needed (slack added by callers).
Matrix draw(std::mt19937_64& rng, int world, int experts, int64_t align, Skew skew) {
  Matrix m;
  m.world = world;
  m.experts = experts;
  m.align = align;
  const int n = world * experts;
  m.splits.assign(size_t(world) * n, 0);
  const int hot = static_cast<int>(rng() % n);
  for (int s = 0; s < world; ++s) {
    const bool empty_rank = skew == Skew::kEmptyRanks && (s % 2 == 1);
    for (int j = 0; j < n; ++j) {
      uint32_t v = 0;
      switch (skew) {
        case Skew::kUniform: v = 7; break;
        case Skew::kZipf: v = static_cast<uint32_t>(200.0 / std::pow(double(1 + (j + s) % n), 1.1)); break;
        case Skew::kOneHot: v = j == hot ? 50 : 0; break;
        case Skew::kEmptyRanks: v = empty_rank ? 0 : static_cast<uint32_t>(rng() % 9); break;
        case Skew::kRandom: v = static_cast<uint32_t>(rng() % 4 == 0 ? 0 : rng() % 40); break;
      }
      m.splits[size_t(s) * n + j] = v;
    }
  }
  m.input_rows.assign(world, 0);
  m.output_rows.assign(world, 0);
  for (int s = 0; s < world; ++s) m.input_rows[s] = static_cast<uint32_t>(sent_rows(m.view(), s));
  for (int q = 0; q < world; ++q) m.output_rows[q] = static_cast<uint32_t>(needed_output_rows(m.view(), q));
  return m;
}

// The placement built row by row, the way the layout is defined: rank q's output holds, for each
// expert e, the rows of sender 0, 1, ... for (q, e), then padding up to the expert's extent.
// Returns, per receiver, (sender, sender's input row) or (-1, -1) for padding.
std::vector<std::vector<std::pair<int, int64_t>>> brute_force(const Matrix& m) {
  const int n = m.world * m.experts;
  std::vector<std::vector<std::pair<int, int64_t>>> out(m.world);
  for (int q = 0; q < m.world; ++q) {
    for (int e = 0; e < m.experts; ++e) {
      const size_t begin = out[q].size();
      for (int s = 0; s < m.world; ++s) {
        int64_t first = 0;
        for (int j = 0; j < q * m.experts + e; ++j) first += m.splits[size_t(s) * n + j];
        for (uint32_t i = 0; i < m.splits[size_t(s) * n + q * m.experts + e]; ++i) out[q].push_back({s, first + i});
      }
      size_t rows = out[q].size() - begin;
      if (m.align > 0) {
        size_t extent = (rows + m.align - 1) / m.align * m.align;
        extent = std::max<size_t>(extent, size_t(m.align));
        while (rows < extent) {
          out[q].push_back({-1, -1});
          ++rows;
        }
      }
    }
  }
  return out;
}

// Checks that the pieces every rank sends and receives move exactly the brute-force placement.
void check_layout(const Matrix& m, const std::string& what) {
  const SplitMatrix v = m.view();
  const auto expected = brute_force(m);
  const uint64_t row_bytes = 6;  // any width: offsets are rows times it
  for (int q = 0; q < m.world; ++q) {
    if (needed_output_rows(v, q) != expected[q].size())
      throw test::Failure(what + ": rank " + std::to_string(q) + " needs " + std::to_string(needed_output_rows(v, q)) +
                          " rows, brute force " + std::to_string(expected[q].size()));
    // Receive side: rebuild q's output from its pieces.
    std::vector<std::pair<int, int64_t>> got(expected[q].size(), {-1, -1});
    for (int k = 0; k < m.world * m.experts; ++k) {
      const AllToAllPiece p = receive_piece(v, q, k, row_bytes);
      EXPECT(p.src_byte % row_bytes == 0 && p.dst_byte % row_bytes == 0 && p.bytes % row_bytes == 0);
      for (uint64_t i = 0; i < p.bytes / row_bytes; ++i) {
        const uint64_t at = p.dst_byte / row_bytes + i;
        if (at >= got.size() || got[at].first != -1)
          throw test::Failure(what + ": receive piece " + std::to_string(k) + " of rank " + std::to_string(q) +
                              " writes row " + std::to_string(at) + " twice or out of bounds");
        got[at] = {p.peer, int64_t(p.src_byte / row_bytes + i)};
      }
      // torch's out_splits_offsets: row 0 the piece's rows, row 1 its first output row.
      EXPECT_EQ(out_splits_offsets(v, q, 0, k), int64_t(p.bytes / row_bytes));
      EXPECT_EQ(out_splits_offsets(v, q, 1, k), int64_t(p.dst_byte / row_bytes));
    }
    if (got != expected[q]) throw test::Failure(what + ": rank " + std::to_string(q) + " receives the wrong rows");
  }
  // Send side: every sender's pieces land exactly where the receivers' pieces say.
  std::map<std::pair<int, uint64_t>, std::pair<int, uint64_t>> sent;  // (q, dst row) -> (s, src row)
  for (int s = 0; s < m.world; ++s) {
    uint64_t covered = 0;
    for (int j = 0; j < m.world * m.experts; ++j) {
      const AllToAllPiece p = send_piece(v, s, j, row_bytes);
      EXPECT_EQ(p.src_byte / row_bytes, covered);  // the input is read front to back, once
      covered += p.bytes / row_bytes;
      for (uint64_t i = 0; i < p.bytes / row_bytes; ++i)
        sent[{p.peer, p.dst_byte / row_bytes + i}] = {s, p.src_byte / row_bytes + i};
    }
    EXPECT_EQ(covered, sent_rows(v, s));
  }
  for (int q = 0; q < m.world; ++q)
    for (size_t row = 0; row < expected[q].size(); ++row) {
      if (expected[q][row].first < 0) {
        EXPECT(sent.count({q, row}) == 0);
        continue;
      }
      const auto it = sent.find({q, row});
      if (it == sent.end() || it->second != std::make_pair(expected[q][row].first, uint64_t(expected[q][row].second)))
        throw test::Failure(what + ": rank " + std::to_string(q) + "'s row " + std::to_string(row) +
                            " is not sent where it is received");
    }
}

std::string name(int world, int experts, int64_t align, Skew skew) {
  static const char* skews[] = {"uniform", "zipf", "one-hot", "empty-ranks", "random"};
  return "world " + std::to_string(world) + ", experts " + std::to_string(experts) + ", align " +
         std::to_string(align) + ", " + skews[int(skew)];
}

}  // namespace

TEST(all_to_all_layout_places_every_row_once) {
  std::mt19937_64 rng(42);
  for (int world = 1; world <= 8; ++world)
    for (int experts : {1, 2, 3, 8})
      for (int64_t align : {int64_t(0), int64_t(1), int64_t(16)}) {
        if (experts > 1 && align == 0) continue;  // the 2-D form always aligns (torch: default 1)
        for (Skew skew : {Skew::kUniform, Skew::kZipf, Skew::kOneHot, Skew::kEmptyRanks, Skew::kRandom})
          for (int trial = 0; trial < 3; ++trial)
            check_layout(draw(rng, world, experts, align, skew), name(world, experts, align, skew));
      }
}

TEST(all_to_all_layout_matches_torch_2d_example) {
  // torch's docstring: ranks 0 and 1, two experts each; c0 has 5 rows, d0 7, major_align 16:
  // c1 starts at row 16 of rank 0's output.
  Matrix m;
  m.world = 2;
  m.experts = 2;
  m.align = 16;
  // rank 0 (c): 5 rows to (r0, e0), 3 to (r0, e1), 0, 2; rank 1 (d): 7, 1, 4, 0.
  m.splits = {5, 3, 0, 2, 7, 1, 4, 0};
  m.input_rows = {10, 12};
  m.output_rows = {100, 100};
  const SplitMatrix v = m.view();
  EXPECT_EQ(output_row(v, 0, 0, 0), uint64_t(0));
  EXPECT_EQ(output_row(v, 0, 0, 1), uint64_t(5));
  EXPECT_EQ(output_row(v, 0, 1, 0), uint64_t(16));
  EXPECT_EQ(output_row(v, 0, 1, 1), uint64_t(19));
  EXPECT_EQ(needed_output_rows(v, 0), uint64_t(32));
  // Rank 1's expert 1 receives nothing, yet takes major_align rows (CUTLASS rejects empty groups).
  EXPECT_EQ(expert_rows(v, 1, 1), uint64_t(2));
  EXPECT_EQ(needed_output_rows(v, 1), uint64_t(32));
  m.align = 1;
  EXPECT_EQ(expert_extent(0, 1), uint64_t(1));
  EXPECT_EQ(expert_extent(0, 0), uint64_t(0));
}

TEST(all_to_all_capacity_verdict_names_the_rank) {
  std::mt19937_64 rng(7);
  for (int world : {2, 3, 4, 8}) {
    for (Skew skew : {Skew::kUniform, Skew::kOneHot, Skew::kZipf}) {
      Matrix m = draw(rng, world, 1, 0, skew);
      EXPECT_EQ(layout_fault(m.view(), nullptr).kind, uint32_t(kFaultNone));
      // The fullest receiver one row short: it is named, with what it needs and holds.
      int fullest = 0;
      for (int q = 1; q < world; ++q)
        if (m.output_rows[q] > m.output_rows[fullest]) fullest = q;
      if (m.output_rows[fullest] == 0) continue;
      Matrix short_out = m;
      short_out.output_rows[fullest] -= 1;
      const LayoutFault f = layout_fault(short_out.view(), nullptr);
      EXPECT_EQ(f.kind, uint32_t(kFaultOutputTooSmall));
      EXPECT_EQ(f.rank, fullest);
      EXPECT_EQ(f.needed, uint64_t(m.output_rows[fullest]));
      EXPECT_EQ(f.capacity, uint64_t(m.output_rows[fullest] - 1));
      // At capacity exactly: fine.
      EXPECT_EQ(layout_fault(m.view(), nullptr).kind, uint32_t(kFaultNone));
      // A sender whose input holds fewer rows than its splits add up to comes first.
      Matrix short_in = short_out;
      short_in.input_rows[world - 1] = 0;
      if (sent_rows(short_in.view(), world - 1) > 0) {
        const LayoutFault g = layout_fault(short_in.view(), nullptr);
        EXPECT_EQ(g.kind, uint32_t(kFaultInputTooSmall));
        EXPECT_EQ(g.rank, world - 1);
      }
      // An invalid split anywhere is named first.
      Matrix bad = short_in;
      bad.splits[bad.splits.size() - 1] = kInvalidSplit;
      EXPECT_EQ(layout_fault(bad.view(), nullptr).kind, uint32_t(kFaultInvalidSplit));
      EXPECT_EQ(layout_fault(bad.view(), nullptr).rank, world - 1);
    }
  }
}

// An alignment so large that the experts' extents add up past 2^64 must not wrap around to a size
// that seems to fit: four experts aligned to 2^62 rows need 2^64 rows, not 0.
TEST(all_to_all_huge_alignment_never_fits) {
  Matrix m;
  m.world = 2;
  m.experts = 4;
  m.align = int64_t(1) << 62;
  m.splits.assign(size_t(m.world) * m.world * m.experts, 1);
  m.input_rows = {8, 8};
  m.output_rows = {100, 100};
  const LayoutFault f = layout_fault(m.view(), nullptr);
  EXPECT_EQ(f.kind, uint32_t(kFaultOutputTooSmall));
  EXPECT_EQ(f.rank, 0);
  EXPECT(f.needed > f.capacity);
  EXPECT(needed_output_rows(m.view(), 1) > uint64_t(0xFFFFFFFEu));
  // The largest alignment a header's capacity can still hold is kept exactly.
  EXPECT_EQ(expert_extent(3, 0xFFFFFFFEll), uint64_t(0xFFFFFFFEu));
}

TEST(all_to_all_declared_splits_must_match_the_senders) {
  Matrix m;
  m.world = 3;
  m.splits = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  m.input_rows = {6, 15, 24};
  m.output_rows = {12, 15, 18};
  std::vector<uint32_t> declared(9);
  for (int q = 0; q < 3; ++q)
    for (int s = 0; s < 3; ++s) declared[q * 3 + s] = m.splits[s * 3 + q];
  EXPECT_EQ(layout_fault(m.view(), declared.data()).kind, uint32_t(kFaultNone));
  declared[2 * 3 + 1] = 5;  // rank 2 expects 5 rows from rank 1, which sends 6
  const LayoutFault f = layout_fault(m.view(), declared.data());
  EXPECT_EQ(f.kind, uint32_t(kFaultDeclaredSplits));
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.other, 1);
  EXPECT_EQ(f.needed, uint64_t(6));
  EXPECT_EQ(f.capacity, uint64_t(5));
}

TEST(all_to_all_split_words_saturate) {
  EXPECT_EQ(split_word(0), 0u);
  EXPECT_EQ(split_word(12345), 12345u);
  EXPECT_EQ(split_word(-1), kInvalidSplit);
  EXPECT_EQ(split_word(int64_t(1) << 31), kInvalidSplit);
  EXPECT_EQ(split_word(int64_t(kLargestSplit)), kLargestSplit);
  EXPECT_EQ(capacity_word(uint64_t(1) << 40), 0xFFFFFFFEu);
}

namespace {
AllToAllRequest uniform_request(size_t pair_bytes, int world) {
  AllToAllRequest r;
  r.form = AllToAllForm::kUniform;
  r.pair_bytes = pair_bytes;
  r.world = world;
  r.in_symmetric = r.out_symmetric = true;
  r.low_latency_capacity = size_t(1) << 20;
  r.workspace.staging = size_t(64) << 20;
  return r;
}
}  // namespace

TEST(all_to_all_plan_uniform_by_size) {
  const TuningTable none;
  // Small: low latency while (world - 1) x pair bytes stays within 256 KiB.
  EXPECT(plan_all_to_all(uniform_request(1024, 8), none).algo == Algo::kLowLatency);
  EXPECT(plan_all_to_all(uniform_request(64 << 10, 8), none).algo != Algo::kLowLatency);
  EXPECT(plan_all_to_all(uniform_request(128 << 10, 2), none).algo == Algo::kLowLatency);
  // Large with symmetric operands: push, no staging.
  AllToAllPlan p = plan_all_to_all(uniform_request(8 << 20, 4), none);
  EXPECT(p.algo == Algo::kPush && p.kernel == KernelId::kAllToAllPush);
  EXPECT(!p.stage_input && !p.exchange);
  EXPECT_EQ(p.blocks, 128);  // 32 MiB moved: a block per 64 KiB, at most 128
  // The SM path runs a block per 64 KiB unit of what a rank moves, its own slice included (no block
  // without a unit): 4 blocks took 13.7 us for 1 MiB per rank on 2 x H200, 16 took 9.5.
  EXPECT_EQ(plan_all_to_all(uniform_request(512 << 10, 2), none).blocks, 16);
  EXPECT_EQ(plan_all_to_all(uniform_request(1 << 20, 2), none).blocks, 32);
  EXPECT_EQ(plan_all_to_all(uniform_request(512 << 10, 4), none).blocks, 32);
  EXPECT_EQ(plan_all_to_all(uniform_request(512 << 10, 8), none).blocks, 64);
  EXPECT_EQ(plan_all_to_all(uniform_request(300 << 10, 2), none).blocks, 10);
  EXPECT(plan_all_to_all(uniform_request(200 << 10, 2), none).algo == Algo::kLowLatency);
  AllToAllRequest floor = uniform_request(200 << 10, 2);
  floor.options.algo = Algo::kPush;
  EXPECT_EQ(plan_all_to_all(floor, none).blocks, 8);  // at least 8
  // Low latency, chosen or forced, gives every word its own thread (low_latency_blocks).
  AllToAllRequest small = uniform_request(64 << 10, 2);
  EXPECT(plan_all_to_all(small, none).algo == Algo::kLowLatency);
  EXPECT_EQ(plan_all_to_all(small, none).blocks, 32);
  small = uniform_request(512 << 10, 2);
  small.options.algo = Algo::kLowLatency;
  EXPECT_EQ(plan_all_to_all(small, none).blocks, 128);
  // A local output: pull; with a local input too, the input is staged in chunks of the workspace.
  AllToAllRequest r = uniform_request(64 << 20, 4);
  r.out_symmetric = false;
  r.in_symmetric = false;
  p = plan_all_to_all(r, none);
  EXPECT(p.algo == Algo::kPull && p.stage_input);
  EXPECT_EQ(p.chunk_pair_bytes, size_t(16) << 20);
  // No SMs: the copy engine.
  r = uniform_request(8 << 20, 4);
  r.options.max_blocks = 0;
  p = plan_all_to_all(r, none);
  EXPECT(p.algo == Algo::kCopyEngine && p.blocks == 0 && p.kernel == KernelId::kAllToAllCopyEngine);
  // In place, the SM paths stage (peers would read what this rank overwrites); low latency does
  // not (each thread sends its words before it overwrites them): a staging copy before it doubled
  // the time of a small in-place all-to-all.
  r = uniform_request(4096, 4);
  r.in_place = true;
  EXPECT(plan_all_to_all(r, none).algo == Algo::kLowLatency && !plan_all_to_all(r, none).stage_input);
  for (Algo algo : {Algo::kPush, Algo::kPull}) {
    r.options.algo = algo;
    EXPECT(plan_all_to_all(r, none).stage_input);
  }
  // A budget caps the blocks.
  r = uniform_request(256 << 20, 8);
  r.options.max_blocks = 6;
  EXPECT(plan_all_to_all(r, none).blocks <= 6);
}

// Whether a local input is in place is its rank's own (the signature leaves it out), so the chunks a
// call runs in must not depend on it: with a 4 MiB staging area at 8 ranks, an in-place rank ran a
// 768 KiB pair in chunks of 512 KiB, its out-of-place peers in one, and every such call failed with
// a mismatch.
TEST(all_to_all_plan_chunks_alike_in_place_or_not) {
  const TuningTable none;
  for (Algo algo : {Algo::kAuto, Algo::kLowLatency, Algo::kPush, Algo::kPull}) {
    for (size_t pair : {size_t(4096), size_t(768) << 10, size_t(1) << 20, size_t(24) << 20}) {
      for (bool symmetric_in : {true, false}) {
        AllToAllRequest r = uniform_request(pair, 8);
        r.workspace.staging = size_t(4) << 20;
        r.options.algo = algo;
        r.in_symmetric = symmetric_in;
        AllToAllPlan out_of_place;
        try {
          out_of_place = plan_all_to_all(r, none);
        } catch (const Error&) {
          continue;  // (a forced algorithm this size cannot take)
        }
        r.in_place = true;
        const AllToAllPlan in_place = plan_all_to_all(r, none);
        EXPECT(in_place.algo == out_of_place.algo);
        if (in_place.chunk_pair_bytes != out_of_place.chunk_pair_bytes)
          ::symmem::test::fail(__FILE__, __LINE__,
                               std::string(algo_name(algo)) + ", pair " + std::to_string(pair) + ": in place " +
                                   describe(in_place) + ", out of place " + describe(out_of_place));
      }
    }
  }
}

TEST(all_to_all_plan_forced_choices_and_errors) {
  const TuningTable none;
  AllToAllRequest r = uniform_request(4 << 20, 2);
  r.options.algo = Algo::kLowLatency;
  EXPECT_ERROR(plan_all_to_all(r, none), ErrorCode::kInvalidArgument, "low_latency moves up to");
  r.options.algo = Algo::kTwoShot;
  EXPECT_ERROR(plan_all_to_all(r, none), ErrorCode::kInvalidArgument, "not an all-to-all algorithm");
  r.options.algo = Algo::kPush;
  r.out_symmetric = false;
  EXPECT_ERROR(plan_all_to_all(r, none), ErrorCode::kInvalidArgument, "must be in the heap");
  // Variable forms: no copy engine, no zero-SM budget.
  AllToAllRequest v = uniform_request(0, 4);
  v.form = AllToAllForm::kDeviceSplits;
  v.row_bytes = 14336;
  v.options.algo = Algo::kCopyEngine;
  EXPECT_ERROR(plan_all_to_all(v, none), ErrorCode::kInvalidArgument, "copy_engine needs");
  v.options.algo = Algo::kAuto;
  v.options.max_blocks = 0;
  EXPECT_ERROR(plan_all_to_all(v, none), ErrorCode::kInvalidArgument, "max_blocks is 0");
  // SYMMEM_ALGO=copy_engine does not apply to the variable forms: they plan as if unset.
  v.options.max_blocks = -1;
  v.forced = Algo::kCopyEngine;
  EXPECT(plan_all_to_all(v, none).algo == Algo::kPush);
}

TEST(all_to_all_plan_variable_forms) {
  const TuningTable none;
  AllToAllRequest v = uniform_request(0, 8);
  v.form = AllToAllForm::kDeviceSplits;
  v.row_bytes = 7168 * 2;
  AllToAllPlan p = plan_all_to_all(v, none);
  EXPECT(p.exchange);
  EXPECT(p.algo == Algo::kPush);
  EXPECT_EQ(p.blocks, kAllToAllVariableBlocks);
  EXPECT_EQ(p.low_latency_pair_bytes, (size_t(256) << 10) / 7);
  EXPECT_EQ(p.vector_bytes, 16);
  // Forced push: the SM path always.
  v.options.algo = Algo::kPush;
  EXPECT_EQ(plan_all_to_all(v, none).low_latency_pair_bytes, size_t(0));
  // Forced low latency: every pair that fits its slot behind the header, the others by SM.
  v.options.algo = Algo::kLowLatency;
  EXPECT_EQ(plan_all_to_all(v, none).low_latency_pair_bytes, (size_t(1) << 20) - 4 * size_t(kMaxAllToAllHeaderWords));
  // The 2-D form with several experts never takes low latency.
  v.options.algo = Algo::kAuto;
  v.experts = 4;
  EXPECT_EQ(plan_all_to_all(v, none).low_latency_pair_bytes, size_t(0));
  v.experts = 1;
  EXPECT(plan_all_to_all(v, none).low_latency_pair_bytes > 0);
  // Chosen by the plan, lines go no further than a word per thread of the grid: at 2 ranks the
  // rule's 256 KiB per pair stops at 4 bytes x 32 blocks x kThreadsPerBlock, and a budget of 8
  // blocks at a quarter of that. Forced, every pair that fits the slot.
  v.world = 2;
  EXPECT_EQ(plan_all_to_all(v, none).low_latency_pair_bytes, size_t(4) * kAllToAllVariableBlocks * kThreadsPerBlock);
  v.options.max_blocks = 8;
  EXPECT_EQ(plan_all_to_all(v, none).low_latency_pair_bytes, size_t(4) * 8 * kThreadsPerBlock);
  v.options.max_blocks = -1;
  v.sm_count = 12;  // the GPU's (the ranks' smallest) bounds the grid, and with it the lines
  EXPECT_EQ(plan_all_to_all(v, none).blocks, 12);
  EXPECT_EQ(plan_all_to_all(v, none).low_latency_pair_bytes, size_t(4) * 12 * kThreadsPerBlock);
  v.sm_count = 132;
  v.options.algo = Algo::kLowLatency;
  EXPECT_EQ(plan_all_to_all(v, none).low_latency_pair_bytes, (size_t(1) << 20) - 4 * size_t(kMaxAllToAllHeaderWords));
  v.options.algo = Algo::kAuto;
  v.options.max_blocks = -1;
  v.world = 8;
  v.experts = 4;
  // A local output pulls; a local input is then staged.
  v.out_symmetric = false;
  v.in_symmetric = false;
  p = plan_all_to_all(v, none);
  EXPECT(p.algo == Algo::kPull && p.stage_input);
  // Odd rows narrow the vector.
  v.row_bytes = 6;
  v.experts = 1;
  EXPECT_EQ(plan_all_to_all(v, none).vector_bytes, 2);
}
