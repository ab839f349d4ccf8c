// Call signatures and the plans behind them: every rank must plan the same algorithm, and ranks
// that would not are told apart by the signature their flags carry.
#include <string>
#include <vector>

#include "board/call_signature.hpp"
#include "device/device_types.hpp"
#include "kernels/kernel_args.hpp"
#include "plan/plan.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

namespace {

CallDescriptor gather(size_t count, DataType type) {
  CallDescriptor c;
  c.op = kOpAllGather;
  c.type = type;
  c.count = count;
  c.algo = Algo::kPull;
  c.blocks = 16;
  return c;
}

// What a rank's call looks like to the planner and the signature: the operand kinds and symmetric
// offsets it passed, and its options (all that may differ between ranks that call "the same").
struct RankCall {
  bool in_symmetric;
  bool out_symmetric;
  uint64_t in_offset;
  uint64_t out_offset;
  CollectiveOptions options;
};

AllGatherPlan plan_for(const RankCall& c, size_t bytes) {
  AllGatherRequest r;
  r.bytes_per_rank = bytes;
  r.world = 2;
  r.in_symmetric = c.in_symmetric;
  r.out_symmetric = c.out_symmetric;
  r.in_address = c.in_symmetric ? c.in_offset : 0;
  r.out_address = c.out_symmetric ? c.out_offset : 0;
  r.options = c.options;
  return plan_all_gather(r, TuningTable{});
}

uint32_t signature_for(const RankCall& c, const AllGatherPlan& plan, size_t count) {
  return signature_of(make_call_descriptor(kOpAllGather, DataType::kUInt8, ReduceOp::kSum, count, plan.algo, plan.blocks,
                                           false, c.in_symmetric, c.in_symmetric ? c.in_offset : 0, c.out_symmetric,
                                           c.out_symmetric ? c.out_offset : 0));
}

bool same_plan(const AllGatherPlan& a, const AllGatherPlan& b) {
  return a.algo == b.algo && a.blocks == b.blocks && a.vector_bytes == b.vector_bytes &&
         a.stage_input == b.stage_input && a.stage_output == b.stage_output &&
         a.copy_engine_push == b.copy_engine_push && a.kernel == b.kernel && a.local_warps == b.local_warps &&
         a.chunk_elements == b.chunk_elements;
}

}  // namespace

TEST(signatures_tell_apart_calls_that_must_not_meet) {
  const uint32_t base = signature_of(gather(100000, DataType::kFloat16));
  EXPECT(base != 0);
  EXPECT(signature_of(gather(100002, DataType::kFloat16)) != base);
  EXPECT(signature_of(gather(100000, DataType::kBFloat16)) != base);  // same bytes, other type
  CallDescriptor c = gather(100000, DataType::kFloat16);
  c.op = kOpAllReduce;
  EXPECT(signature_of(c) != base);
  c = gather(100000, DataType::kFloat16);
  c.blocks = 8;
  EXPECT(signature_of(c) != base);
  c = gather(100000, DataType::kFloat16);
  c.out_symmetric = true;
  c.out_heap_offset = 256;
  const uint32_t at256 = signature_of(c);
  c.out_heap_offset = 0;
  EXPECT(signature_of(c) != at256);  // rank-dependent symmetric offsets
  c = gather(100000, DataType::kFloat16);
  c.op = kOpAllReduce;
  c.reduce = ReduceOp::kMax;
  const uint32_t max = signature_of(c);
  c.reduce = ReduceOp::kSum;
  EXPECT(signature_of(c) != max);
  const uint32_t sum = signature_of(c);
  c.reduce = ReduceOp::kAvg;  // a rank averaging beside a peer summing is a mismatch
  EXPECT(signature_of(c) != sum && signature_of(c) != max);
  EXPECT_EQ(signature_of(gather(100000, DataType::kFloat16)), base);  // deterministic
}

TEST(descriptions_name_the_call) {
  const std::string d = describe_call(gather(100002, DataType::kFloat16));
  EXPECT(d.find("all_gather") != std::string::npos);
  EXPECT(d.find("100002") != std::string::npos);
  EXPECT(d.find("float16") != std::string::npos);
  EXPECT(d.find("pull") != std::string::npos);
}

TEST(user_calls_and_piece_gathers_are_signed_by_what_their_ranks_agree_on) {
  // A user kernel: its description and grid, nothing else; described as its launcher wrote it.
  const uint32_t user = signature_of(make_user_call_descriptor("triton:k(4096, bfloat16)", 8));
  EXPECT(user != 0);
  EXPECT_EQ(signature_of(make_user_call_descriptor("triton:k(4096, bfloat16)", 8)), user);
  EXPECT(signature_of(make_user_call_descriptor("triton:k(4097, bfloat16)", 8)) != user);
  EXPECT(signature_of(make_user_call_descriptor("triton:k(4096, bfloat16)", 9)) != user);
  EXPECT(describe_call(make_user_call_descriptor("triton:k(4096, bfloat16)", 8)) == "triton:k(4096, bfloat16) blocks=8");
  // all_gather_pieces: rows, row bytes, tile rows and the symmetric offset.
  const uint32_t pieces = signature_of(make_gather_pieces_descriptor(4096, 2048, 128, 1 << 20));
  EXPECT(signature_of(make_gather_pieces_descriptor(4096, 2048, 64, 1 << 20)) != pieces);
  EXPECT(signature_of(make_gather_pieces_descriptor(8192, 1024, 128, 1 << 20)) != pieces);  // same bytes
  EXPECT(signature_of(make_gather_pieces_descriptor(4096, 2048, 128, 2 << 20)) != pieces);
  EXPECT(describe_call(make_gather_pieces_descriptor(4096, 2048, 128, 1 << 20)) ==
         "all_gather_pieces(rows=4096, row_bytes=2048, tile_rows=128, gathered=symmetric@1048576)");
}

TEST(ranks_with_equal_signatures_run_equal_plans) {
  // Every combination two ranks could pass for one logical call (operand kinds, symmetric
  // offsets, options): whenever their signatures agree, so must their plans; where plans differ,
  // the signatures differ and the device check catches it. This fails if anything a plan depends
  // on is left out of the signature.
  std::vector<RankCall> calls;
  for (int kinds = 0; kinds < 4; ++kinds)
    for (uint64_t in_offset : {uint64_t(0), uint64_t(4096), uint64_t(4100), uint64_t(4097)})
      for (uint64_t out_offset : {uint64_t(0), uint64_t(8192), uint64_t(8194)})
        for (Algo algo : {Algo::kAuto, Algo::kPull, Algo::kPush, Algo::kCopyEngine})
          for (int max_blocks : {-1, 8}) {
            CollectiveOptions o;
            o.algo = algo;
            o.max_blocks = max_blocks;
            calls.push_back({(kinds & 1) != 0, (kinds & 2) != 0, in_offset, out_offset, o});
          }
  long compared = 0;
  for (size_t bytes : {size_t(4096), size_t(65536 + 2), size_t(32) << 20}) {
    std::vector<AllGatherPlan> plans;
    std::vector<uint32_t> signatures;
    for (const RankCall& c : calls) {
      plans.push_back(plan_for(c, bytes));
      signatures.push_back(signature_for(c, plans.back(), bytes));
    }
    for (size_t a = 0; a < calls.size(); ++a)
      for (size_t b = a + 1; b < calls.size(); ++b) {
        if (signatures[a] != signatures[b]) continue;
        ++compared;
        EXPECT(same_plan(plans[a], plans[b]));
      }
  }
  EXPECT(compared > 100);  // the property was exercised, not vacuous
}

TEST(chunks_cover_the_call_exactly_once) {
  for (size_t count : {size_t(1), size_t(7), size_t(4096), size_t(1000003)})
    for (size_t limit : {size_t(1), size_t(8), size_t(4096), size_t(1) << 30}) {
      const auto chunks = plan_chunks(count, limit);
      size_t next = 0;
      for (const auto& c : chunks) {
        EXPECT_EQ(c.begin, next);
        EXPECT(c.count >= 1 && c.count <= limit);
        next += c.count;
      }
      EXPECT_EQ(next, count);
    }
}

TEST(chunks_fit_their_workspaces) {
  const WorkspaceLimits limits{size_t(64) << 20, size_t(32) << 20};
  for (int world : {2, 3, 4, 8})
    for (size_t elem : {size_t(1), size_t(2), size_t(4)}) {
      AllGatherPlan ag;
      ag.algo = Algo::kPush;
      ag.stage_output = true;
      size_t n = all_gather_chunk_elements(ag, elem, world, limits);
      EXPECT(n * elem * world <= limits.staging && (n * elem) % 16 == 0);
      ag.stage_output = false;
      ag.stage_input = true;
      n = all_gather_chunk_elements(ag, elem, world, limits);
      EXPECT(n * elem <= limits.staging && (n * elem) % 16 == 0);
      ag.stage_input = false;
      EXPECT_EQ(all_gather_chunk_elements(ag, elem, world, limits), ~size_t(0));

      ReducePlan rp;
      rp.algo = Algo::kTwoShotPush;
      rp.kernel = KernelId::kAllReduceTwoShotPush;
      n = reduce_chunk_elements(rp, false, elem, world, limits);
      EXPECT(two_shot_slice(n, world, elem) * elem * world <= limits.staging);
      rp.algo = Algo::kOneShotPush;
      rp.kernel = KernelId::kReducePushed;
      rp.receive_area = true;
      n = reduce_chunk_elements(rp, false, elem, world, limits);
      EXPECT((n * elem + 255) / 256 * 256 * world <= limits.receive_half);
      rp = ReducePlan{};
      rp.stage_input = true;
      n = reduce_chunk_elements(rp, true, elem, world, limits);
      EXPECT(n * elem * world <= limits.staging);
    }
}

namespace {

bool same_plan(const ReducePlan& a, const ReducePlan& b) {
  return a.algo == b.algo && a.blocks == b.blocks && a.vector == b.vector && a.stage_input == b.stage_input &&
         a.gather_via_staging == b.gather_via_staging && a.kernel == b.kernel &&
         a.chunk_elements == b.chunk_elements && a.reads_peer_inputs == b.reads_peer_inputs &&
         a.receive_area == b.receive_area;
}

}  // namespace

TEST(ranks_with_equal_signatures_run_equal_reduction_plans) {
  // The same property for all-reduce and reduce-scatter: every plan input that may differ across
  // ranks (operand kinds, symmetric offsets, in place, options) is either in the signature or
  // leaves the plan unchanged.
  long compared = 0;
  for (bool reduce_scatter : {false, true})
    for (size_t count : {size_t(1000), size_t(262144), size_t(33554432 + 8)}) {
      std::vector<ReducePlan> plans;
      std::vector<uint32_t> signatures;
      for (int kinds = 0; kinds < 4; ++kinds)
        for (uint64_t in_offset : {uint64_t(0), uint64_t(4096), uint64_t(4098)})
          for (uint64_t out_offset : {uint64_t(0), uint64_t(8192), uint64_t(8196)})
            for (bool in_place : {false, true})
              for (Algo algo : {Algo::kAuto, Algo::kOneShot, Algo::kTwoShot, Algo::kTwoShotPush, Algo::kLowLatency}) {
                ReduceRequest r;
                r.reduce_scatter = reduce_scatter;
                r.count = count;
                r.elem_bytes = 2;
                r.world = 2;
                r.low_latency_capacity = size_t(1) << 20;
                r.in_symmetric = (kinds & 1) != 0;
                r.out_symmetric = in_place ? r.in_symmetric : (kinds & 2) != 0;
                r.in_address = r.in_symmetric ? in_offset : 0;
                r.out_address = r.out_symmetric ? (in_place ? r.in_address : out_offset) : 0;
                r.in_place = in_place;
                r.options.algo = algo;
                ReducePlan p;
                try {
                  p = plan_reduce(r, TuningTable{});
                } catch (const symmem::Error&) {
                  continue;  // not plannable: raised identically on every rank with these inputs
                }
                plans.push_back(p);
                signatures.push_back(signature_of(make_call_descriptor(
                    reduce_scatter ? kOpReduceScatter : kOpAllReduce, DataType::kBFloat16, ReduceOp::kSum, count,
                    p.algo, p.blocks, in_place, r.in_symmetric, r.in_address, r.out_symmetric,
                    in_place ? 0 : r.out_address)));
              }
      for (size_t a = 0; a < plans.size(); ++a)
        for (size_t b = a + 1; b < plans.size(); ++b) {
          if (signatures[a] != signatures[b]) continue;
          ++compared;
          EXPECT(same_plan(plans[a], plans[b]));
        }
    }
  EXPECT(compared > 100);
}
