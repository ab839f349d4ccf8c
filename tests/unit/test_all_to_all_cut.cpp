// The balanced cut of the variable all-to-all's SM traffic (plan/all_to_all_cut.hpp) and the choice
// of lines or SM per pair (plan/all_to_all_layout.hpp): every byte of every SM piece moved by
// exactly one block, spans within one vector of each other, lines and SM together covering every
// row exactly once, over worlds 1-8 and random and pathological matrices (one-hot, zero rows, a
// single nonzero pair, nothing at all).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "plan/all_to_all_cut.hpp"
#include "plan/all_to_all_layout.hpp"
#include "plan/block_rules.hpp"
#include "test.hpp"

using namespace symmem::detail;
namespace test = symmem::test;

namespace {

// One segment of a block's span: piece i, vectors [first, first + count) within it.
struct Segment {
  int piece;
  uint64_t first, count;
};

std::vector<Segment> segments_of(const std::vector<uint64_t>& prefix, uint64_t begin, uint64_t end) {
  std::vector<Segment> out;
  for_each_segment(prefix.data(), int(prefix.size()) - 1, begin, end, [&](int i, uint64_t first, uint64_t count) {
    out.push_back({i, first, count});
  });
  return out;
}

// Cuts `sizes` (vectors per piece, some empty) over `blocks` blocks and checks: spans tile the
// total in order and differ by at most one vector; the segments of every block lie inside its span,
// in order, nonempty; every vector of every piece is moved exactly once.
void check_cut(const std::vector<uint64_t>& sizes, int blocks, const std::string& what) {
  std::vector<uint64_t> prefix(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) prefix[i + 1] = prefix[i] + sizes[i];
  const uint64_t total = prefix.back();
  const uint64_t small = total / uint64_t(blocks), large = small + (total % uint64_t(blocks) ? 1 : 0);
  std::vector<std::vector<uint8_t>> moved(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) moved[i].assign(sizes[i], 0);
  for (int b = 0; b < blocks; ++b) {
    const uint64_t begin = cut_begin(total, blocks, b), end = cut_begin(total, blocks, b + 1);
    if (b == 0 && begin != 0) throw test::Failure(what + ": the first span starts at " + std::to_string(begin));
    if (end - begin != small && end - begin != large)
      throw test::Failure(what + ": block " + std::to_string(b) + " of " + std::to_string(blocks) + " moves " +
                          std::to_string(end - begin) + " vectors, not " + std::to_string(small) + " or " +
                          std::to_string(large));
    uint64_t at = begin;  // the concatenation's vector the next segment must start at
    for (const Segment& s : segments_of(prefix, begin, end)) {
      if (s.count == 0) throw test::Failure(what + ": an empty segment");
      if (prefix[s.piece] + s.first != at)
        throw test::Failure(what + ": block " + std::to_string(b) + " skips or repeats a vector");
      if (s.first + s.count > sizes[s.piece]) throw test::Failure(what + ": a segment runs past its piece");
      for (uint64_t v = s.first; v < s.first + s.count; ++v) moved[s.piece][v]++;
      at += s.count;
    }
    if (at != end) throw test::Failure(what + ": block " + std::to_string(b) + "'s segments end short of its span");
  }
  if (cut_begin(total, blocks, blocks) != total) throw test::Failure(what + ": the spans do not reach the total");
  for (size_t i = 0; i < sizes.size(); ++i)
    for (uint64_t v = 0; v < sizes[i]; ++v)
      if (moved[i][v] != 1)
        throw test::Failure(what + ": vector " + std::to_string(v) + " of piece " + std::to_string(i) + " moved " +
                            std::to_string(int(moved[i][v])) + " times");
}

const int kBlockCounts[] = {1, 2, 3, 5, 7, 8, 31, 32, 33, 64, 160};

}  // namespace

TEST(all_to_all_cut_spans_tile_the_total_within_one_vector) {
  for (uint64_t total : {uint64_t(0), uint64_t(1), uint64_t(5), uint64_t(511), uint64_t(512), uint64_t(513),
                         uint64_t(1000003), (uint64_t(1) << 40) + 3})
    for (int blocks : kBlockCounts) {
      uint64_t previous = 0;
      for (int b = 0; b <= blocks; ++b) {
        const uint64_t at = cut_begin(total, blocks, b);
        EXPECT(at >= previous);
        if (b > 0) EXPECT(at - previous == total / blocks || at - previous == total / blocks + 1);
        previous = at;
      }
      EXPECT_EQ(cut_begin(total, blocks, 0), uint64_t(0));
      EXPECT_EQ(cut_begin(total, blocks, blocks), total);
    }
}

TEST(all_to_all_cut_moves_every_vector_of_every_piece_once) {
  std::mt19937_64 rng(11);
  const std::vector<std::vector<uint64_t>> fixed = {
      {0},                       // nothing at all
      {7},                       // one piece
      {0, 0, 9, 0},              // one nonempty piece among empty ones
      {1, 1, 1, 1, 1, 1, 1, 1},  // fewer vectors than most block counts
      {100000, 3, 0, 1},         // one piece carries almost everything
      {0, 0, 0, 0, 0, 0, 0, 0},  // all empty
      {4096, 4096, 4096, 4096},  // uniform, whole units
      {4097, 4095, 1, 8191},     // tails
  };
  for (const auto& sizes : fixed)
    for (int blocks : kBlockCounts) check_cut(sizes, blocks, "fixed pieces, " + std::to_string(blocks) + " blocks");
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint64_t> sizes(1 + rng() % 64);
    for (auto& s : sizes) s = rng() % 3 == 0 ? 0 : rng() % (trial % 2 ? 50 : 70000);
    check_cut(sizes, kBlockCounts[rng() % std::size(kBlockCounts)], "random pieces, trial " + std::to_string(trial));
  }
}

namespace {

struct Matrix {
  int world = 1, experts = 1;
  int64_t align = 0;
  std::vector<uint32_t> splits, input_rows, output_rows;
  SplitMatrix view() const { return {splits.data(), input_rows.data(), output_rows.data(), world, experts, align}; }
};

enum class Skew { kRandom, kZipf, kOneHot, kZeroRows, kSinglePair, kNothing, kUniform };
const char* skew_name(Skew s) {
  static const char* names[] = {"random", "zipf", "one-hot", "zero rows", "single pair", "nothing", "uniform"};
  return names[int(s)];
}

Matrix draw(std::mt19937_64& rng, int world, int experts, Skew skew) {
  Matrix m;
  m.world = world;
  m.experts = experts;
  m.align = experts > 1 ? 4 : 0;
  const int n = world * experts;
  m.splits.assign(size_t(world) * n, 0);
  const int hot = int(rng() % n), hot_sender = int(rng() % world);
  for (int s = 0; s < world; ++s)
    for (int j = 0; j < n; ++j) {
      uint32_t v = 0;
      switch (skew) {
        case Skew::kRandom: v = rng() % 3 == 0 ? 0 : uint32_t(rng() % 300); break;
        case Skew::kZipf: v = uint32_t(300 / std::pow(1.0 + (j - s * experts + n) % n, 1.1)); break;
        case Skew::kOneHot: v = j == hot ? 200 : 0; break;  // every sender to one destination
        case Skew::kZeroRows: v = s % 2 == 1 ? 0 : uint32_t(rng() % 50); break;
        case Skew::kSinglePair: v = s == hot_sender && j == hot ? 77 : 0; break;
        case Skew::kNothing: v = 0; break;
        case Skew::kUniform: v = 24; break;
      }
      m.splits[size_t(s) * n + j] = v;
    }
  m.input_rows.resize(world);
  m.output_rows.resize(world);
  for (int r = 0; r < world; ++r) {
    m.input_rows[r] = uint32_t(sent_rows(m.view(), r));
    m.output_rows[r] = uint32_t(needed_output_rows(m.view(), r));
  }
  return m;
}

// The widest vector that divides a row (the plan's rule with aligned base addresses).
uint64_t vector_for(uint64_t row_bytes) {
  for (uint64_t v : {16, 8, 4, 2})
    if (row_bytes % v == 0) return v;
  return 1;
}

// What rank `me` moves by SM in the kernel's order, and (through lines) what it does not: for each
// rank's pieces in turn, the cut over `blocks` blocks must move every SM byte once, and lines plus
// SM must deliver every row of every receiver exactly once.
void check_matrix_cut(const Matrix& m, uint64_t row_bytes, uint64_t threshold, int blocks, const std::string& what) {
  const SplitMatrix v = m.view();
  const int n = m.world * m.experts;
  const uint64_t vec = vector_for(row_bytes);
  for (bool push : {true, false}) {
    // delivered[q][byte]: how often byte `byte` of rank q's output was written, by SM or lines.
    std::vector<std::vector<uint8_t>> delivered(m.world);
    for (int q = 0; q < m.world; ++q) {
      delivered[q].assign(needed_output_rows(v, q) * row_bytes, 0);
      for (int k = 0; k < n; ++k) {  // the lines, which the receiver writes
        const AllToAllPiece p = receive_piece(v, q, k, row_bytes);
        if (pair_by_lines(v, p.peer, q, row_bytes, threshold))
          for (uint64_t b = 0; b < p.bytes; ++b) delivered[q][p.dst_byte + b]++;
      }
    }
    for (int me = 0; me < m.world; ++me) {
      std::vector<AllToAllPiece> pieces(n);
      std::vector<uint64_t> sizes(n);
      std::vector<bool> seen(n, false);
      for (int i = 0; i < n; ++i) {
        const int k = push ? send_piece_in_turn(v, me, i) : receive_piece_in_turn(v, me, i);
        if (k < 0 || k >= n || seen[k]) throw test::Failure(what + ": the rotated order is not a permutation");
        seen[k] = true;
        pieces[i] = push ? send_piece(v, me, k, row_bytes) : receive_piece(v, me, k, row_bytes);
        const int sender = push ? me : pieces[i].peer, receiver = push ? pieces[i].peer : me;
        const bool lines = pair_by_lines(v, sender, receiver, row_bytes, threshold);
        if (lines && m.experts != 1) throw test::Failure(what + ": lines for a 2-D call");
        if (pieces[i].bytes % vec != 0) throw test::Failure(what + ": a piece is not whole vectors");
        sizes[i] = lines ? 0 : pieces[i].bytes / vec;
      }
      // This rank itself comes last: the rotation starts at the next rank.
      if (pieces[n - 1].peer != me) throw test::Failure(what + ": this rank's own piece is not last");
      std::vector<uint64_t> prefix(n + 1, 0);
      for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + sizes[i];
      check_cut(sizes, blocks, what + ", rank " + std::to_string(me) + (push ? " push" : " pull"));
      for (int b = 0; b < blocks; ++b)
        for (const Segment& s :
             segments_of(prefix, cut_begin(prefix[n], blocks, b), cut_begin(prefix[n], blocks, b + 1))) {
          const AllToAllPiece& p = pieces[s.piece];
          const int receiver = push ? p.peer : me;
          for (uint64_t x = s.first * vec; x < (s.first + s.count) * vec; ++x) delivered[receiver][p.dst_byte + x]++;
        }
    }
    // Every row some sender sends is delivered once; padding (2-D) never.
    for (int q = 0; q < m.world; ++q) {
      std::vector<uint8_t> expected(delivered[q].size(), 0);
      for (int k = 0; k < n; ++k) {
        const AllToAllPiece p = receive_piece(v, q, k, row_bytes);
        for (uint64_t b = 0; b < p.bytes; ++b) expected[p.dst_byte + b] = 1;
      }
      if (delivered[q] != expected)
        throw test::Failure(what + (push ? ", push" : ", pull") + ": rank " + std::to_string(q) +
                            "'s output is not written exactly once where rows land");
    }
  }
}

}  // namespace

TEST(all_to_all_balanced_cut_over_split_matrices) {
  std::mt19937_64 rng(5);
  const Skew skews[] = {Skew::kRandom,     Skew::kZipf,    Skew::kOneHot, Skew::kZeroRows,
                        Skew::kSinglePair, Skew::kNothing, Skew::kUniform};
  for (int world = 1; world <= 8; ++world)
    for (int experts : {1, 3})
      for (Skew skew : skews)
        for (uint64_t row_bytes : {uint64_t(1), uint64_t(6), uint64_t(16), uint64_t(48)}) {
          const Matrix m = draw(rng, world, experts, skew);
          const uint64_t rule = experts == 1 ? low_latency_rule_pair_bytes(world) : 0;
          for (uint64_t threshold : {uint64_t(0), rule, uint64_t(64) * row_bytes})
            for (int blocks : {1, 3, 32}) {
              const std::string what = "world " + std::to_string(world) + ", experts " + std::to_string(experts) +
                                       ", " + skew_name(skew) + ", row " + std::to_string(row_bytes) +
                                       " B, lines up to " + std::to_string(threshold) + " B, " +
                                       std::to_string(blocks) + " blocks";
              check_matrix_cut(m, row_bytes, experts == 1 ? threshold : 0, blocks, what);
            }
        }
}

TEST(all_to_all_pairs_choose_lines_or_sm) {
  Matrix m;
  m.world = 3;
  // rank 0: 0 to itself, 4 rows to 1, 5 to 2; rank 1: 100 to 0; rank 2: nothing.
  m.splits = {0, 4, 5, 100, 3, 0, 0, 0, 0};
  m.input_rows = {9, 103, 0};
  m.output_rows = {100, 7, 5};
  const SplitMatrix v = m.view();
  // 16-byte rows, lines up to 64 bytes: 4 rows go (64 bytes), 5 do not.
  EXPECT(pair_by_lines(v, 0, 1, 16, 64));
  EXPECT(!pair_by_lines(v, 0, 2, 16, 64));
  EXPECT(!pair_by_lines(v, 1, 1, 16, 1 << 20));  // never to itself
  EXPECT(!pair_by_lines(v, 2, 0, 16, 1 << 20));  // nothing to send
  EXPECT(!pair_by_lines(v, 0, 1, 16, 0));        // threshold 0: every pair by SM
  EXPECT(moves_by_sm_between_ranks(v, 16, 64));
  EXPECT(moves_by_sm_between_ranks(v, 16, 1599));  // 100 rows of 16 bytes
  EXPECT(!moves_by_sm_between_ranks(v, 16, 1600));
  // A sender whose splits exceed its input sends nothing as lines (the call fails everywhere).
  m.input_rows[0] = 8;
  EXPECT(!sender_fits(m.view(), 0));
  EXPECT(!pair_by_lines(m.view(), 0, 1, 16, 64));
  m.input_rows[0] = 9;
  m.splits[2] = kInvalidSplit;
  EXPECT(!sender_fits(m.view(), 0));
  EXPECT(!pair_by_lines(m.view(), 0, 1, 16, 64));
  // Only copies to themselves: no barrier.
  m.splits = {5, 0, 0, 0, 6, 0, 0, 0, 7};
  m.input_rows = {5, 6, 7};
  EXPECT(!moves_by_sm_between_ranks(m.view(), 16, 0));
  // 2-D: never lines.
  Matrix two;
  two.world = 2;
  two.experts = 2;
  two.align = 1;
  two.splits = {1, 1, 1, 1, 1, 1, 1, 1};
  two.input_rows = {4, 4};
  two.output_rows = {4, 4};
  EXPECT(!pair_by_lines(two.view(), 0, 1, 16, 1 << 20));
  EXPECT(moves_by_sm_between_ranks(two.view(), 16, 1 << 20));
}
