// Planning: algorithm choice, block counts, staging, vector widths and copy-engine pieces.
#include <algorithm>
#include <vector>

#include "kernels/kernel_args.hpp"
#include "plan/copy_engine_pieces.hpp"
#include "plan/plan.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

TEST(vector_width_is_the_largest_common_power_of_two) {
  EXPECT_EQ(common_vector_bytes({1024, 4096, 0}), 16);
  EXPECT_EQ(common_vector_bytes({12, 4096, 0}), 4);
  EXPECT_EQ(common_vector_bytes({1024, 4098, 0}), 2);
  EXPECT_EQ(common_vector_bytes({3, 0, 0}), 1);
  EXPECT_EQ(common_vector_bytes({8, 8, 24}), 8);
}

TEST(all_gather_max_blocks_zero_means_copy_engine) {
  AllGatherRequest r;
  r.bytes_per_rank = 1 << 20;
  r.world = 4;
  r.in_symmetric = r.out_symmetric = true;
  r.options.max_blocks = 0;
  const AllGatherPlan p = plan_all_gather(r, TuningTable{});
  EXPECT(p.algo == Algo::kCopyEngine);
  EXPECT_EQ(p.blocks, 0);
  r.options.algo = Algo::kPull;
  EXPECT_ERROR(plan_all_gather(r, TuningTable{}), ErrorCode::kInvalidArgument, "max_blocks is 0");
}

TEST(all_gather_blocks_respect_budget_and_sm_count) {
  AllGatherRequest r;
  r.world = 4;
  r.in_symmetric = r.out_symmetric = true;
  r.sm_count = 132;
  for (size_t bytes : {size_t(1), size_t(4096), size_t(1) << 20, size_t(256) << 20}) {
    r.bytes_per_rank = bytes;
    r.options = {};
    AllGatherPlan p = plan_all_gather(r, TuningTable{});
    EXPECT(p.blocks >= 1 && p.blocks <= 132);
    r.options.max_blocks = 8;
    p = plan_all_gather(r, TuningTable{});
    EXPECT(p.blocks >= 1 && p.blocks <= 8);
    r.options.blocks = 500;
    r.options.max_blocks = -1;
    p = plan_all_gather(r, TuningTable{});
    EXPECT(p.blocks <= kMaxBlocks && p.blocks <= 132);
  }
}

TEST(all_gather_stages_only_what_the_algorithm_needs) {
  AllGatherRequest r;
  r.world = 2;
  r.bytes_per_rank = 1 << 20;
  r.options.algo = Algo::kPull;
  r.in_symmetric = false;
  r.out_symmetric = true;
  AllGatherPlan p = plan_all_gather(r, TuningTable{});
  EXPECT(p.algo == Algo::kPull && p.stage_input && !p.stage_output);
  r.options.algo = Algo::kPush;
  r.in_symmetric = true;
  r.out_symmetric = false;
  p = plan_all_gather(r, TuningTable{});
  EXPECT(p.algo == Algo::kPush && p.stage_output && !p.stage_input);
  // Auto avoids staging when one side is in the heap.
  r.options.algo = Algo::kAuto;
  p = plan_all_gather(r, TuningTable{});
  EXPECT(p.algo == Algo::kPull && !p.stage_input && !p.stage_output);
  r.in_symmetric = false;
  r.out_symmetric = true;
  p = plan_all_gather(r, TuningTable{});
  EXPECT(p.algo == Algo::kPush && !p.stage_input && !p.stage_output);
}

TEST(all_gather_rejects_reduction_algorithms) {
  AllGatherRequest r;
  r.world = 2;
  r.bytes_per_rank = 64;
  r.options.algo = Algo::kTwoShot;
  EXPECT_ERROR(plan_all_gather(r, TuningTable{}), ErrorCode::kInvalidArgument, "not an all-gather algorithm");
}

TEST(all_gather_forced_algorithm_applies_to_auto_only) {
  AllGatherRequest r;
  r.world = 4;
  r.bytes_per_rank = 1 << 20;
  r.in_symmetric = r.out_symmetric = true;
  r.forced = Algo::kCopyEngine;
  EXPECT(plan_all_gather(r, TuningTable{}).algo == Algo::kCopyEngine);
  r.options.algo = Algo::kPull;
  EXPECT(plan_all_gather(r, TuningTable{}).algo == Algo::kPull);
  r.options.algo = Algo::kAuto;
  r.forced = Algo::kOneShot;  // an all-reduce name does not bind all-gather
  EXPECT(plan_all_gather(r, TuningTable{}).algo != Algo::kOneShot);
}

TEST(all_gather_follows_the_tuning_table) {
  TuningTable t;
  t.entries.push_back({"all_gather", 4, 65536, Algo::kPush, 6});
  t.entries.push_back({"all_gather", 4, size_t(1) << 40, Algo::kPull, 40});
  AllGatherRequest r;
  r.world = 4;
  r.in_symmetric = r.out_symmetric = true;
  r.bytes_per_rank = 1000;
  AllGatherPlan p = plan_all_gather(r, t);
  EXPECT(p.algo == Algo::kPush && p.blocks == 6);
  r.bytes_per_rank = 1 << 20;
  p = plan_all_gather(r, t);
  EXPECT(p.algo == Algo::kPull && p.blocks == 40);
  r.options.max_blocks = 16;  // the caller's SM budget wins over the table
  EXPECT(plan_all_gather(r, t).blocks == 16);
  r.world = 2;  // no row for two ranks: built-in rule
  EXPECT(plan_all_gather(r, t).blocks >= 1);
}

TEST(pull_leaves_most_warps_to_nvlink_and_a_few_to_the_own_slot) {
  EXPECT_EQ(pull_local_warps(1), 0);
  EXPECT_EQ(pull_local_warps(2), 6);  // measured on 2 x H200
  for (int world = 2; world <= 8; ++world) {
    const int w = pull_local_warps(world);
    EXPECT(w >= 2 && w <= 6);                                // the local copy keeps pace, NVLink keeps >= 10 warps
    EXPECT(world == 2 || w <= pull_local_warps(world - 1));  // a smaller share with more peers
  }
  AllGatherRequest r;
  r.world = 4;
  r.in_symmetric = r.out_symmetric = true;
  r.bytes_per_rank = 1 << 20;
  r.options.algo = Algo::kPull;
  EXPECT_EQ(plan_all_gather(r, TuningTable{}).local_warps, pull_local_warps(4));
  r.options.algo = Algo::kPush;
  EXPECT_EQ(plan_all_gather(r, TuningTable{}).local_warps, 0);
}

TEST(a_binding_sm_budget_turns_a_large_push_into_pull) {
  TuningTable t;
  t.entries.push_back({"all_gather", 2, size_t(1) << 40, Algo::kPush, 128});
  AllGatherRequest r;
  r.world = 2;
  r.in_symmetric = r.out_symmetric = true;
  r.bytes_per_rank = 64 << 20;
  EXPECT(plan_all_gather(r, t).algo == Algo::kPush);  // no budget: the table
  r.options.max_blocks = 16;
  AllGatherPlan p = plan_all_gather(r, t);
  EXPECT(p.algo == Algo::kPull && p.blocks == 16);
  r.options.max_blocks = 200;  // a budget that does not bind changes nothing
  EXPECT(plan_all_gather(r, t).algo == Algo::kPush);
  r.options.max_blocks = 16;
  r.bytes_per_rank = 1 << 20;  // small messages: push keeps its lower latency
  EXPECT(plan_all_gather(r, t).algo == Algo::kPush);
  r.bytes_per_rank = 64 << 20;
  r.in_symmetric = false;  // pull would need a staging copy of the input: stay with push
  EXPECT(plan_all_gather(r, t).algo == Algo::kPush);
  r.in_symmetric = true;
  r.options.algo = Algo::kPush;  // the caller's choice stands
  EXPECT(plan_all_gather(r, t).algo == Algo::kPush);
}

TEST(bulk_push_needs_sixteen_byte_alignment) {
  AllGatherRequest r;
  r.world = 4;
  r.in_symmetric = r.out_symmetric = true;
  r.options.algo = Algo::kPush;
  r.bytes_per_rank = 4096;
  AllGatherPlan p = plan_all_gather(r, TuningTable{});
  EXPECT(p.kernel == KernelId::kAllGatherPushBulk);
  // A rank whose local pointers allow less runs the push kernel of the same protocol.
  EXPECT(narrowed_kernel(p, 16) == KernelId::kAllGatherPushBulk);
  EXPECT(narrowed_kernel(p, 8) == KernelId::kAllGatherPush);
  r.bytes_per_rank = 4098;
  EXPECT(plan_all_gather(r, TuningTable{}).kernel == KernelId::kAllGatherPush);
  r.push_bulk = false;
  r.bytes_per_rank = 4096;
  EXPECT(plan_all_gather(r, TuningTable{}).kernel == KernelId::kAllGatherPush);
  // Pull has no other kernel.
  r.options.algo = Algo::kPull;
  p = plan_all_gather(r, TuningTable{});
  EXPECT(p.kernel == KernelId::kAllGatherPull && narrowed_kernel(p, 1) == KernelId::kAllGatherPull);
}

TEST(reduce_plan_falls_back_from_low_latency_when_it_cannot_hold_the_message) {
  ReduceRequest r;
  r.world = 4;
  r.elem_bytes = 2;
  r.in_symmetric = r.out_symmetric = true;
  r.low_latency_capacity = 1 << 20;
  r.count = 16;
  EXPECT(plan_reduce(r, TuningTable{}).algo == Algo::kLowLatency);
  r.count = (2 << 20) / 2;
  EXPECT(plan_reduce(r, TuningTable{}).algo != Algo::kLowLatency);
  r.options.algo = Algo::kLowLatency;
  EXPECT_ERROR(plan_reduce(r, TuningTable{}), ErrorCode::kInvalidArgument, "low_latency takes messages up to");
}

TEST(reduce_plan_vector_path_needs_alignment) {
  ReduceRequest r;
  r.world = 4;
  r.elem_bytes = 4;
  r.in_symmetric = r.out_symmetric = true;
  r.count = 4097;
  r.in_address = 4096;
  r.out_address = 8192;
  r.options.algo = Algo::kTwoShot;
  EXPECT(plan_reduce(r, TuningTable{}).vector);
  r.out_address = 8196;
  EXPECT(!plan_reduce(r, TuningTable{}).vector);
  // Reduce-scatter slices start at rank * count elements: 4097 floats break alignment.
  r.reduce_scatter = true;
  r.out_address = 8192;
  EXPECT(!plan_reduce(r, TuningTable{}).vector);
  r.count = 4096;
  EXPECT(plan_reduce(r, TuningTable{}).vector);
}

TEST(reduce_plan_staging_and_gather_path) {
  ReduceRequest r;
  r.world = 4;
  r.elem_bytes = 2;
  r.count = 1 << 20;
  r.options.algo = Algo::kTwoShot;
  r.in_symmetric = false;
  r.out_symmetric = false;
  ReducePlan p = plan_reduce(r, TuningTable{});
  EXPECT(p.stage_input && p.gather_via_staging);
  r.in_symmetric = r.out_symmetric = true;
  p = plan_reduce(r, TuningTable{});
  EXPECT(!p.stage_input && !p.gather_via_staging);
  r.options.algo = Algo::kLowLatency;
  r.count = 100;
  r.low_latency_capacity = 1 << 20;
  r.in_symmetric = false;
  EXPECT(!plan_reduce(r, TuningTable{}).stage_input);  // low latency reads only its own input
}

TEST(reduce_scatter_accepts_pull_push_and_low_latency_and_the_old_names) {
  ReduceRequest r;
  r.reduce_scatter = true;
  r.world = 2;
  r.count = 100;
  for (Algo refused : {Algo::kOneShot, Algo::kOneShotPush, Algo::kLowLatencyTwoShot, Algo::kCopyEngine}) {
    r.options.algo = refused;
    EXPECT_ERROR(plan_reduce(r, TuningTable{}), ErrorCode::kInvalidArgument, "not a reduce-scatter algorithm");
  }
  r.options.algo = Algo::kAuto;
  EXPECT(plan_reduce(r, TuningTable{}).algo == Algo::kPull);
  EXPECT(plan_reduce(r, TuningTable{}).kernel == KernelId::kReduceFromEveryRank);
  EXPECT(!plan_reduce(r, TuningTable{}).receive_area);
  // Push receives the peers' slices: it needs neither a heap input nor a heap output.
  r.options.algo = Algo::kPush;
  const ReducePlan push = plan_reduce(r, TuningTable{});
  EXPECT(push.algo == Algo::kPush);
  EXPECT(push.kernel == KernelId::kReducePushed);
  EXPECT(push.receive_area);
  EXPECT(!push.stage_input);
  // two_shot and two_shot_push, their earlier names, name them still.
  r.options.algo = Algo::kTwoShotPush;
  EXPECT(plan_reduce(r, TuningTable{}).algo == Algo::kPush);
  r.options.algo = Algo::kTwoShot;
  EXPECT(plan_reduce(r, TuningTable{}).algo == Algo::kPull);
  // SYMMEM_ALGO=two_shot_push reaches reduce-scatter too; all-reduce-only names do not.
  r.options.algo = Algo::kAuto;
  r.forced = Algo::kTwoShotPush;
  EXPECT(plan_reduce(r, TuningTable{}).algo == Algo::kPush);
  r.forced = Algo::kLowLatencyTwoShot;  // an all-reduce-only name
  EXPECT(plan_reduce(r, TuningTable{}).algo == Algo::kPull);
}

TEST(low_latency_reduce_scatter_takes_any_alignment_up_to_a_slot_per_rank) {
  ReduceRequest r;
  r.reduce_scatter = true;
  r.world = 4;
  r.elem_bytes = 2;
  r.low_latency_capacity = 1 << 20;
  r.options.algo = Algo::kLowLatency;
  r.count = 101;  // odd fp16 slices: rank r's slice starts 2-byte aligned
  r.in_address = 2;
  ReducePlan p = plan_reduce(r, TuningTable{});
  EXPECT(p.algo == Algo::kLowLatency);
  EXPECT(!p.stage_input && !p.reads_peer_inputs && !p.receive_area && !p.gather_via_staging);
  EXPECT_EQ(reduce_chunk_elements(p, true, 2, 4, WorkspaceLimits{4096, 4096}), ~size_t(0));  // one chunk
  r.count = (1 << 20) / 2;  // exactly one slot per rank
  EXPECT(plan_reduce(r, TuningTable{}).algo == Algo::kLowLatency);
  r.count += 1;
  EXPECT_ERROR(plan_reduce(r, TuningTable{}), ErrorCode::kInvalidArgument, "low_latency takes up to 1048576 bytes per rank");
  // Chosen by SYMMEM_ALGO or the table, a message that does not fit goes pull instead.
  r.options.algo = Algo::kAuto;
  r.forced = Algo::kLowLatency;
  EXPECT(plan_reduce(r, TuningTable{}).algo == Algo::kPull);
  TuningTable t;
  t.entries.push_back({"reduce_scatter", 4, size_t(1) << 40, Algo::kLowLatency, 16});
  r.forced = Algo::kAuto;
  EXPECT(plan_reduce(r, t).algo == Algo::kPull);
  r.count = 1000;
  p = plan_reduce(r, t);
  EXPECT(p.algo == Algo::kLowLatency && p.blocks == 16);
}

TEST(low_latency_all_gather_stages_nothing_and_holds_a_slot_per_rank) {
  AllGatherRequest r;
  r.world = 4;
  r.low_latency_capacity = 1 << 20;
  r.options.algo = Algo::kLowLatency;
  for (bool symmetric : {false, true}) {
    r.in_symmetric = r.out_symmetric = symmetric;
    r.bytes_per_rank = 3;  // any size and alignment
    r.in_address = r.out_address = 1;
    AllGatherPlan p = plan_all_gather(r, TuningTable{});
    EXPECT(p.algo == Algo::kLowLatency);
    EXPECT(!p.stage_input && !p.stage_output && p.kernel == KernelId::kAllGatherLowLatency);
    EXPECT_EQ(p.blocks, 4);
    EXPECT_EQ(all_gather_chunk_elements(p, 1, 4, WorkspaceLimits{4096, 4096}), ~size_t(0));  // one chunk
  }
  r.bytes_per_rank = 256 << 10;  // 65536 words: a thread each, within the 128-block cap
  EXPECT_EQ(plan_all_gather(r, TuningTable{}).blocks, 128);
  r.options.blocks = 9;
  EXPECT_EQ(plan_all_gather(r, TuningTable{}).blocks, 9);
  r.options.blocks = 0;
  r.bytes_per_rank = (1 << 20) + 1;
  EXPECT_ERROR(plan_all_gather(r, TuningTable{}), ErrorCode::kInvalidArgument, "low_latency takes up to");
  // Chosen by SYMMEM_ALGO or the table, a message that does not fit falls back to push or pull.
  r.options.algo = Algo::kAuto;
  r.forced = Algo::kLowLatency;
  EXPECT(plan_all_gather(r, TuningTable{}).algo != Algo::kLowLatency);
  TuningTable t;
  t.entries.push_back({"all_gather", 4, size_t(1) << 40, Algo::kLowLatency, 12});
  r.forced = Algo::kAuto;
  EXPECT(plan_all_gather(r, t).algo != Algo::kLowLatency);
  r.bytes_per_rank = 4096;
  const AllGatherPlan p = plan_all_gather(r, t);
  EXPECT(p.algo == Algo::kLowLatency && p.blocks == 12);
  // No SMs to spend: the copy engine, whatever the table or SYMMEM_ALGO says.
  r.options.max_blocks = 0;
  EXPECT(plan_all_gather(r, t).algo == Algo::kCopyEngine);
  r.forced = Algo::kLowLatency;
  EXPECT(plan_all_gather(r, t).algo == Algo::kCopyEngine);
}

TEST(a_low_latency_choice_that_cannot_hold_the_message_plans_as_if_absent) {
  // SYMMEM_ALGO=low_latency and a table row: a message past the areas gets the table's choice
  // with the table's blocks, not a fixed fallback (review finding: it got pull with 32 blocks).
  TuningTable t;
  t.entries.push_back({"all_gather", 2, size_t(8) << 20, Algo::kPush, 96});
  t.entries.push_back({"all_gather", 2, size_t(1) << 40, Algo::kCopyEngine, 0});
  t.entries.push_back({"reduce_scatter", 2, size_t(1) << 40, Algo::kTwoShotPush, 64});
  AllGatherRequest g;
  g.world = 2;
  g.in_symmetric = g.out_symmetric = true;
  g.low_latency_capacity = 1 << 20;
  g.forced = Algo::kLowLatency;
  g.bytes_per_rank = 4 << 20;
  AllGatherPlan p = plan_all_gather(g, t);
  EXPECT(p.algo == Algo::kPush && p.blocks == 96);
  g.bytes_per_rank = 256 << 20;
  EXPECT(plan_all_gather(g, t).algo == Algo::kCopyEngine);
  g.bytes_per_rank = 4096;  // fits: SYMMEM_ALGO applies
  EXPECT(plan_all_gather(g, t).algo == Algo::kLowLatency);
  // A table row of low latency that cannot hold the message: the built-in rule, without the
  // row's block count.
  TuningTable ll;
  ll.entries.push_back({"all_gather", 2, size_t(1) << 40, Algo::kLowLatency, 4});
  g.forced = Algo::kAuto;
  g.bytes_per_rank = 64 << 20;
  p = plan_all_gather(g, ll);
  EXPECT(p.algo == Algo::kPull && p.blocks > 4);
  ReduceRequest r;
  r.reduce_scatter = true;
  r.world = 2;
  r.elem_bytes = 4;
  r.low_latency_capacity = 1 << 20;
  r.forced = Algo::kLowLatency;
  r.count = 1 << 20;  // 4 MiB per rank
  ReducePlan q = plan_reduce(r, t);
  EXPECT(q.algo == Algo::kPush && q.blocks == 64);
}

TEST(low_latency_gives_every_word_a_thread_within_bounds) {
  ReduceRequest r;
  r.world = 4;
  r.elem_bytes = 2;
  r.low_latency_capacity = 1 << 20;
  r.options.algo = Algo::kLowLatency;
  r.count = 512;  // 1 KiB: 256 words, fewer than one block's threads
  EXPECT_EQ(plan_reduce(r, TuningTable{}).blocks, 4);
  r.count = 64 << 10;  // 128 KiB: 32768 words
  EXPECT_EQ(plan_reduce(r, TuningTable{}).blocks, 64);
  r.options.algo = Algo::kLowLatencyTwoShot;
  r.count = 256 << 10;  // 512 KiB over 4 ranks: 32768 words per slice
  EXPECT_EQ(plan_reduce(r, TuningTable{}).blocks, 64);
  r.options.blocks = 7;  // the caller's count wins
  EXPECT_EQ(plan_reduce(r, TuningTable{}).blocks, 7);
}

TEST(one_shot_push_reads_only_its_own_input_and_uses_the_receive_area) {
  ReduceRequest r;
  r.world = 4;
  r.count = 4096;
  r.options.algo = Algo::kOneShotPush;
  r.in_symmetric = false;
  r.out_symmetric = false;
  r.in_place = true;
  const ReducePlan p = plan_reduce(r, TuningTable{});
  EXPECT(p.algo == Algo::kOneShotPush);
  EXPECT(p.receive_area);
  EXPECT(!p.stage_input);
  EXPECT(!p.gather_via_staging);
  Algo parsed;
  EXPECT(parse_algo("one_shot_push", &parsed) && parsed == Algo::kOneShotPush);
}

TEST(two_shot_slices_cover_the_message_once_with_aligned_starts) {
  for (size_t elem : {size_t(2), size_t(4)}) {
    for (int world = 1; world <= 8; ++world) {
      for (size_t count : {size_t(1), size_t(3), size_t(7), size_t(8), size_t(4097), size_t(1000003)}) {
        const size_t slice = two_shot_slice(count, world, elem);
        EXPECT(slice * elem % 16 == 0);
        size_t covered = 0;
        for (int r = 0; r < world; ++r) {
          const size_t begin = std::min(count, r * slice);
          const size_t end = std::min(count, (r + 1) * slice);
          EXPECT_EQ(begin, covered);
          covered = end;
        }
        EXPECT_EQ(covered, count);
      }
    }
  }
}

TEST(copy_engine_pieces_cover_every_peer_exactly_once) {
  for (int world = 1; world <= 8; ++world) {
    for (int rank = 0; rank < world; ++rank) {
      for (size_t bytes : {size_t(1), size_t(1000), size_t(1) << 20, size_t(37) << 20, size_t(256) << 20}) {
        for (int streams : {1, 3, 4, 8}) {
          for (size_t piece : {size_t(64) << 10, size_t(4) << 20}) {
            const auto pieces = plan_copy_engine(rank, world, bytes, streams, piece);
            std::vector<size_t> covered(world, 0);
            for (const auto& p : pieces) {
              EXPECT(p.peer != rank && p.peer >= 0 && p.peer < world);
              EXPECT(p.stream >= 0 && p.stream < streams);
              EXPECT_EQ(p.offset, covered[p.peer]);  // pieces of a peer are contiguous, in order
              covered[p.peer] += p.bytes;
              EXPECT(p.bytes > 0);
            }
            for (int peer = 0; peer < world; ++peer) EXPECT_EQ(covered[peer], peer == rank ? 0 : bytes);
          }
        }
      }
    }
  }
}

TEST(plans_are_the_same_on_every_rank) {
  // Nothing rank-specific enters a plan, so ranks that see the same call agree.
  AllGatherRequest r;
  r.world = 8;
  r.bytes_per_rank = 12345 * 16;
  r.in_symmetric = r.out_symmetric = true;
  const AllGatherPlan first = plan_all_gather(r, TuningTable{});
  for (int i = 0; i < 8; ++i) {
    const AllGatherPlan p = plan_all_gather(r, TuningTable{});
    EXPECT(p.algo == first.algo && p.blocks == first.blocks && p.vector_bytes == first.vector_bytes);
  }
}

TEST(low_latency_two_shot_holds_slices_up_to_half_a_slot) {
  ReduceRequest r;
  r.world = 4;
  r.elem_bytes = 2;
  r.in_symmetric = r.out_symmetric = true;
  r.low_latency_capacity = 1 << 20;
  r.options.algo = Algo::kLowLatencyTwoShot;
  r.count = (2 << 20) / 2;  // 2 MiB over 4 ranks: 512 KiB slices, exactly half a slot
  EXPECT(plan_reduce(r, TuningTable{}).algo == Algo::kLowLatencyTwoShot);
  EXPECT(!plan_reduce(r, TuningTable{}).stage_input);  // reads only its own input
  r.count += 64;
  EXPECT_ERROR(plan_reduce(r, TuningTable{}), ErrorCode::kInvalidArgument, "low_latency_two_shot takes slices");
  r.options.algo = Algo::kAuto;
  TuningTable t;
  t.entries.push_back({"all_reduce", 4, size_t(1) << 40, Algo::kLowLatencyTwoShot, 32});
  EXPECT(plan_reduce(r, t).algo == Algo::kTwoShot);  // the table's choice does not fit: fall back
  // One rank: every algorithm runs (the GPU tests run at one rank too); it failed there once.
  r.world = 1;
  r.count = 1000;
  r.options.algo = Algo::kLowLatencyTwoShot;
  EXPECT(plan_reduce(r, TuningTable{}).algo == Algo::kLowLatencyTwoShot);
}

TEST(all_gather_across_nodes_plans_the_hierarchical_all_gather) {
  AllGatherRequest r;
  r.bytes_per_rank = 1 << 20;
  r.world = 2;  // GPUs of this node
  r.nodes = 2;
  r.in_symmetric = r.out_symmetric = true;
  r.forced = Algo::kPull;  // SYMMEM_ALGO names a single-node algorithm: it does not apply
  TuningTable table;
  EXPECT(plan_all_gather(r, table).algo == Algo::kHierarchical);
  // The copy engine (zero SMs) and an SM budget of zero are requests it serves.
  r.options.algo = Algo::kCopyEngine;
  EXPECT(plan_all_gather(r, table).algo == Algo::kHierarchical);
  r.options.algo = Algo::kAuto;
  r.options.max_blocks = 0;
  const AllGatherPlan p = plan_all_gather(r, table);
  EXPECT(p.algo == Algo::kHierarchical && p.blocks == 0 && !p.stage_input && !p.stage_output);
  for (Algo sm : {Algo::kPull, Algo::kPush, Algo::kLowLatency}) {
    r.options.algo = sm;
    EXPECT_ERROR(plan_all_gather(r, table), ErrorCode::kInvalidArgument, "runs inside one node");
  }
  // Local operands are staged when local peers must read them; with one GPU per node nothing is.
  r.options.algo = Algo::kAuto;
  r.in_symmetric = r.out_symmetric = false;
  const AllGatherPlan staged = plan_all_gather(r, table);
  EXPECT(staged.stage_input && staged.stage_output);
  // The staged output holds every rank of the job: chunks shrink with the job's world.
  WorkspaceLimits limits;
  limits.staging = size_t(64) << 20;
  EXPECT_EQ(all_gather_chunk_elements(staged, 1, 4, limits), size_t(16) << 20);
  r.world = 1;
  const AllGatherPlan alone = plan_all_gather(r, table);
  EXPECT(!alone.stage_input && !alone.stage_output);
  // On one node it runs only when asked for by name.
  r.nodes = 1;
  r.world = 2;
  EXPECT(plan_all_gather(r, table).algo != Algo::kHierarchical);
  r.options.algo = Algo::kHierarchical;
  EXPECT(plan_all_gather(r, table).algo == Algo::kHierarchical);
}

TEST(small_all_gathers_and_reduce_scatters_take_low_latency_by_rule_and_table) {
  // Built-in rule (no table row): low latency while (world - 1) x bytes per rank <= 256 KiB.
  AllGatherRequest g;
  g.low_latency_capacity = 1 << 20;
  g.in_symmetric = g.out_symmetric = true;
  ReduceRequest s;
  s.reduce_scatter = true;
  s.elem_bytes = 2;
  s.low_latency_capacity = 1 << 20;
  s.in_symmetric = s.out_symmetric = true;
  for (int world : {2, 4, 8}) {
    g.world = s.world = world;
    const size_t bound = (size_t(256) << 10) / size_t(world - 1);
    g.bytes_per_rank = bound;
    EXPECT(plan_all_gather(g, TuningTable{}).algo == Algo::kLowLatency);
    g.bytes_per_rank = bound + 1;
    EXPECT(plan_all_gather(g, TuningTable{}).algo == Algo::kPush);
    s.count = bound / 2;
    EXPECT(plan_reduce(s, TuningTable{}).algo == Algo::kLowLatency);
    s.count = bound / 2 + 1;
    EXPECT(plan_reduce(s, TuningTable{}).algo != Algo::kLowLatency);
  }
  // A table row with blocks 0 leaves the block count to the rule: a thread per word.
  TuningTable t;
  t.entries.push_back({"all_gather", 2, 262144, Algo::kLowLatency, 0});
  t.entries.push_back({"reduce_scatter", 2, 262144, Algo::kLowLatency, 0});
  g.world = s.world = 2;
  g.bytes_per_rank = 64 << 10;
  AllGatherPlan gp = plan_all_gather(g, t);
  EXPECT(gp.algo == Algo::kLowLatency);
  EXPECT_EQ(gp.blocks, 32);
  s.count = 32 << 10;
  ReducePlan sp = plan_reduce(s, t);
  EXPECT(sp.algo == Algo::kLowLatency);
  EXPECT_EQ(sp.blocks, 32);
  // An SM budget below a thread per word turns the choice (not a caller's request) to the SM
  // algorithms, which slow less with fewer blocks.
  g.options.max_blocks = s.options.max_blocks = 8;
  EXPECT(plan_all_gather(g, t).algo == Algo::kPush);
  EXPECT(plan_reduce(s, t).algo == Algo::kPush);
  g.options.max_blocks = s.options.max_blocks = 32;
  EXPECT(plan_all_gather(g, t).algo == Algo::kLowLatency);
  EXPECT(plan_reduce(s, t).algo == Algo::kLowLatency);
  g.options.max_blocks = s.options.max_blocks = 8;
  g.options.algo = s.options.algo = Algo::kLowLatency;
  EXPECT(plan_all_gather(g, t).algo == Algo::kLowLatency);
  EXPECT_EQ(plan_all_gather(g, t).blocks, 8);
  EXPECT(plan_reduce(s, t).algo == Algo::kLowLatency);
}

TEST(local_operands_at_two_ranks_take_the_one_shot_or_the_pipelined_where_the_two_shot_would_stage_them) {
  // The shipped H200 table's shape: the one-shot push to 4 MiB, then the two-shot push, which needs
  // a symmetric output (local ones ran the staged two-shot). The default workspace: 64 MiB staging,
  // 32 MiB per receive parity (16 MiB slots at 2 ranks).
  TuningTable t;
  t.entries.push_back({"all_reduce", 2, size_t(4) << 20, Algo::kOneShotPush, 132});
  t.entries.push_back({"all_reduce", 2, size_t(1) << 40, Algo::kTwoShotPush, 128});
  t.entries.push_back({"all_reduce", 4, size_t(1) << 40, Algo::kTwoShotPush, 128});
  t.entries.push_back({"reduce_scatter", 2, size_t(1) << 40, Algo::kPush, 128});
  ReduceRequest local;
  local.elem_bytes = 2;
  local.world = 2;
  local.low_latency_capacity = 1 << 20;
  local.workspace = WorkspaceLimits{size_t(64) << 20, size_t(32) << 20};
  auto plan_of = [&](size_t bytes, const ReduceRequest* base = nullptr) {
    ReduceRequest r = base ? *base : local;
    r.count = bytes / r.elem_bytes;
    return plan_reduce(r, t);
  };
  // From 8 MiB the pipelined all-reduce: nothing staged, one kernel whatever the size, its own
  // block count (the table's were measured for another algorithm), float32 alike, in place too.
  ReduceRequest fp32 = local;
  fp32.elem_bytes = 4;
  ReduceRequest in_place = local;
  in_place.in_place = true;
  for (const ReduceRequest* base : {&local, &fp32, &in_place})
    for (size_t bytes : {size_t(8) << 20, (size_t(16) << 20) + 16, size_t(64) << 20, size_t(1) << 30}) {
      const ReducePlan p = plan_of(bytes, base);
      EXPECT(p.algo == Algo::kPipelined && p.kernel == KernelId::kReducePipelined && !p.stage_input &&
             p.chunk_elements >= bytes / base->elem_bytes && p.blocks == 128);
    }
  // The caller's blocks, and a named algorithm, stand.
  ReduceRequest named = local;
  named.count = size_t(16) << 20;
  named.options.blocks = 20;
  EXPECT(plan_reduce(named, t).algo == Algo::kPipelined && plan_reduce(named, t).blocks == 20);
  named.options.algo = Algo::kOneShot;
  EXPECT(plan_reduce(named, t).algo == Algo::kOneShot);
  // Below 8 MiB: where the one-shot push's slot holds the message, it stages nothing.
  for (size_t bytes : {size_t(4) << 20, (size_t(8) << 20) - 16}) {
    const ReducePlan p = plan_of(bytes);
    EXPECT(p.algo == Algo::kOneShotPush && !p.stage_input && p.chunk_elements >= bytes / 2);
  }
  EXPECT(plan_of(size_t(6) << 20, &in_place).algo == Algo::kOneShotPush);
  // A small workspace (4 MiB staging, 1 MiB receive slots): the one-shot pull in one piece up to
  // the staging area, the pipelined all-reduce where it would run in chunks.
  ReduceRequest small = local;
  small.workspace = WorkspaceLimits{size_t(4) << 20, size_t(2) << 20};
  const ReducePlan small_pull = plan_of(size_t(4) << 20, &small);
  EXPECT(small_pull.algo == Algo::kOneShot && small_pull.chunk_elements >= (size_t(4) << 20) / 2);
  EXPECT(plan_of((size_t(4) << 20) + 16, &small).algo == Algo::kPipelined);
  // Not measured, or not staged: symmetric or mixed operands, 4 ranks, reduce-scatter, a named
  // algorithm keep their plans.
  ReduceRequest other = local;
  other.in_symmetric = other.out_symmetric = true;
  EXPECT(plan_of(size_t(32) << 20, &other).algo == Algo::kTwoShotPush);
  other.out_symmetric = false;
  EXPECT(plan_of(size_t(32) << 20, &other).algo == Algo::kTwoShot);
  other.in_symmetric = false;
  other.out_symmetric = true;
  EXPECT(plan_of(size_t(32) << 20, &other).algo == Algo::kTwoShotPush);
  other = local;
  other.world = 4;
  EXPECT(plan_of(size_t(32) << 20, &other).algo == Algo::kTwoShot);
  other = local;
  other.reduce_scatter = true;  // (32 MiB per rank: the pipelined reduce-scatter)
  EXPECT(plan_of(size_t(32) << 20, &other).algo == Algo::kPipelined);
  EXPECT(plan_of(size_t(2) << 20, &other).algo == Algo::kPush);
  other = local;
  other.options.algo = Algo::kTwoShot;
  EXPECT(plan_of(size_t(32) << 20, &other).algo == Algo::kTwoShot);
  other = local;
  other.forced = Algo::kTwoShot;  // SYMMEM_ALGO
  EXPECT(plan_of(size_t(32) << 20, &other).algo == Algo::kTwoShot);
  // Without a table the built-in rule's two-shot stages local operands alike.
  ReduceRequest untabled = local;
  untabled.count = size_t(1) << 20;  // 2 MiB
  EXPECT(plan_reduce(untabled, TuningTable{}).algo == Algo::kOneShotPush);
  untabled.world = 4;
  EXPECT(plan_reduce(untabled, TuningTable{}).algo == Algo::kTwoShot);
}

TEST(a_push_cut_into_small_chunks_gives_way_to_pull_in_one_piece) {
  // The table's push all-reduce on symmetric operands with a 16 MiB budget (4 MiB areas): 16 MiB
  // would run in 4 chunks; the two-shot pull reads the symmetric input and writes the symmetric
  // output where they are, in one piece.
  TuningTable t;
  t.entries.push_back({"all_reduce", 2, size_t(1) << 40, Algo::kTwoShotPush, 128});
  t.entries.push_back({"reduce_scatter", 2, size_t(1) << 40, Algo::kPush, 64});
  ReduceRequest r;
  r.elem_bytes = 2;
  r.world = 2;
  r.count = size_t(8) << 20;  // 16 MiB of bf16
  r.in_symmetric = r.out_symmetric = true;
  r.low_latency_capacity = 1 << 20;
  r.workspace = WorkspaceLimits{size_t(4) << 20, size_t(2) << 20};
  ReducePlan p = plan_reduce(r, t);
  EXPECT(p.algo == Algo::kTwoShot && p.chunk_elements >= r.count && !p.stage_input && !p.gather_via_staging);
  // Chunks of 32 MiB or more keep the table's push (the default 256 MiB budget: 64 MiB areas).
  r.workspace = WorkspaceLimits{size_t(64) << 20, size_t(32) << 20};
  r.count = size_t(128) << 20;  // 256 MiB: 4 chunks of 64 MiB
  EXPECT(plan_reduce(r, t).algo == Algo::kTwoShotPush);
  // A local input: the pull would stage it in chunks; the push stays. At 2 ranks the one-shot push
  // of local operands (input and output) gives way to the one-shot pull where that stages them in
  // one piece; mixed operands, other worlds and reduce-scatter keep the push (not measured, or lost).
  r.workspace = WorkspaceLimits{size_t(4) << 20, size_t(2) << 20};
  r.count = size_t(8) << 20;
  r.in_symmetric = false;
  EXPECT(plan_reduce(r, t).algo == Algo::kTwoShotPush);
  {
    TuningTable one_shot;
    one_shot.entries.push_back({"all_reduce", 2, size_t(1) << 40, Algo::kOneShotPush, 132});
    ReduceRequest staged = r;
    staged.out_symmetric = false;
    staged.count = size_t(2) << 20;  // 4 MiB: 4 chunks of the 1 MiB receive slots; one staging area
    const ReducePlan whole = plan_reduce(staged, one_shot);
    EXPECT(whole.algo == Algo::kOneShot && whole.stage_input && whole.chunk_elements >= staged.count);
    // With the pull's own block count (the built-in rule's, as if named), not the table's push's.
    ReduceRequest named = staged;
    named.options.algo = Algo::kOneShot;
    EXPECT_EQ(whole.blocks, plan_reduce(named, one_shot).blocks);
    EXPECT(whole.blocks != 132);
    {
      ReduceRequest asked = staged;
      asked.options.blocks = 20;  // the caller's count
      EXPECT_EQ(plan_reduce(asked, one_shot).blocks, 20);
      asked.options.blocks = 0;
      asked.options.max_blocks = 8;  // and its SM budget
      const ReducePlan budget = plan_reduce(asked, one_shot);
      EXPECT(budget.algo == Algo::kOneShot && budget.blocks <= 8);
      // The one-shot push named by the caller or SYMMEM_ALGO stands.
      asked.options.max_blocks = -1;
      asked.options.algo = Algo::kOneShotPush;
      EXPECT(plan_reduce(asked, one_shot).algo == Algo::kOneShotPush);
      asked.options.algo = Algo::kAuto;
      asked.forced = Algo::kOneShotPush;
      EXPECT(plan_reduce(asked, one_shot).algo == Algo::kOneShotPush);
    }
    staged.in_place = true;  // (one-shot in place stages its input anyway)
    const ReducePlan in_place = plan_reduce(staged, one_shot);
    EXPECT(in_place.algo == Algo::kOneShot && in_place.stage_input && in_place.chunk_elements >= staged.count);
    staged.in_place = false;
    staged.count = (size_t(1) << 19) + 8;  // 1 MiB + 16 bytes: two receive slots
    EXPECT(plan_reduce(staged, one_shot).algo == Algo::kOneShot);
    staged.count = (size_t(1) << 19);  // one receive slot: one piece, the push stays
    EXPECT(plan_reduce(staged, one_shot).algo == Algo::kOneShotPush);
    {
      ReduceRequest fp32 = staged;  // exactly one staging area of float32
      fp32.elem_bytes = 4;
      fp32.count = size_t(1) << 20;
      EXPECT(plan_reduce(fp32, one_shot).algo == Algo::kOneShot);
      fp32.count += 4;  // 16 bytes more: the pull would stage it in two chunks, so the pipelined
      EXPECT(plan_reduce(fp32, one_shot).algo == Algo::kPipelined);
    }
    staged.count = size_t(2) << 20;
    for (bool symmetric_input : {true, false}) {  // mixed operands: not measured, the push stays
      ReduceRequest mixed = staged;
      mixed.in_symmetric = symmetric_input;
      mixed.out_symmetric = !symmetric_input;
      EXPECT(plan_reduce(mixed, one_shot).algo == Algo::kOneShotPush);
    }
    staged.count = size_t(4) << 20;  // 8 MiB: the pipelined all-reduce
    EXPECT(plan_reduce(staged, one_shot).algo == Algo::kPipelined);
    staged.count = size_t(2) << 20;
    staged.world = 3;  // not measured at other worlds: the push stays
    one_shot.entries.push_back({"all_reduce", 3, size_t(1) << 40, Algo::kOneShotPush, 132});
    EXPECT(plan_reduce(staged, one_shot).algo == Algo::kOneShotPush);
    staged.world = 2;
    staged.reduce_scatter = true;  // the staged pull lost to the push in chunks
    staged.count = size_t(1) << 19;  // 1 MiB per rank: one receive slot, the push
    TuningTable scatter;
    scatter.entries.push_back({"reduce_scatter", 2, size_t(1) << 40, Algo::kPush, 128});
    EXPECT(plan_reduce(staged, scatter).algo == Algo::kPush);
    staged.count = size_t(1) << 20;  // 2 MiB per rank: the push in 2 chunks gives way to the pipelined
    EXPECT(plan_reduce(staged, scatter).algo == Algo::kPipelined);
    staged.workspace = WorkspaceLimits{size_t(64) << 20, size_t(32) << 20};
    staged.count = (size_t(4) << 20) - 8;  // just under 16 MiB of input: one slot, the push
    EXPECT(plan_reduce(staged, scatter).algo == Algo::kPush);
    staged.count = size_t(4) << 20;  // 16 MiB of input: the pipelined reduce-scatter
    EXPECT(plan_reduce(staged, scatter).algo == Algo::kPipelined);
  }
  // A choice by name, or by SYMMEM_ALGO, stands.
  r.in_symmetric = true;
  r.options.algo = Algo::kTwoShotPush;
  EXPECT(plan_reduce(r, t).algo == Algo::kTwoShotPush);
  r.options.algo = Algo::kAuto;
  r.forced = Algo::kTwoShotPush;
  EXPECT(plan_reduce(r, t).algo == Algo::kTwoShotPush);
  // SYMMEM_ALGO naming no reduction (an all-gather's copy_engine), or a low-latency one this
  // message is too large for, leaves the choice to the table, and the rule.
  r.forced = Algo::kCopyEngine;
  EXPECT(plan_reduce(r, t).algo == Algo::kTwoShot);
  r.forced = Algo::kLowLatency;
  EXPECT(plan_reduce(r, t).algo == Algo::kTwoShot);
  r.forced = Algo::kAuto;
  // Only pushes give way: the table's one-shot in place stages its input in chunks, and stays.
  {
    TuningTable one_shot;
    one_shot.entries.push_back({"all_reduce", 2, size_t(1) << 40, Algo::kOneShot, 64});
    ReduceRequest in_place = r;
    in_place.in_place = true;
    const ReducePlan staged = plan_reduce(in_place, one_shot);
    EXPECT(staged.algo == Algo::kOneShot && staged.stage_input && staged.chunk_elements < in_place.count);
  }
  // Reduce-scatter: the push's receive slots (1 MiB per sender here) against the pull of the
  // symmetric input in one piece.
  r.reduce_scatter = true;
  r.count = size_t(2) << 20;  // 4 MiB per rank
  p = plan_reduce(r, t);
  EXPECT(p.algo == Algo::kPull && p.chunk_elements >= r.count);
  // Its push named by the earlier alias (SYMMEM_ALGO=two_shot_push) stands.
  r.forced = Algo::kTwoShotPush;
  EXPECT(plan_reduce(r, t).algo == Algo::kPush);
  r.forced = Algo::kAuto;
  // The default workspace's receive slots (8 MiB per sender at 4 ranks: chunks of 32 MiB of the
  // input) keep the push.
  r.world = 4;
  r.workspace = WorkspaceLimits{size_t(64) << 20, size_t(32) << 20};
  r.count = size_t(8) << 20;  // 16 MiB per rank: 2 chunks
  t.entries.push_back({"reduce_scatter", 4, size_t(1) << 40, Algo::kPush, 64});
  EXPECT(plan_reduce(r, t).algo == Algo::kPush);
  r.world = 2;
  r.workspace = WorkspaceLimits{size_t(4) << 20, size_t(2) << 20};
  // In one chunk, the table's push stays.
  r.count = size_t(256) << 10;
  EXPECT(plan_reduce(r, t).algo == Algo::kPush);
}


// The pipelined reductions take local operands as they are (nothing staged, one kernel for any
// size), and their piece fits blocks x 2 parities x world slots in each slot area, spread over
// the blocks when a slice is small, whole 16-byte vectors, equal on every rank.
TEST(pipelined_reductions_stage_nothing_and_fit_their_slots) {
  for (bool rs : {false, true}) {
    ReduceRequest r;
    r.reduce_scatter = rs;
    r.world = 4;
    r.elem_bytes = 2;
    r.count = size_t(64) << 20;  // 128 MiB (per rank for reduce-scatter)
    r.options.algo = Algo::kPipelined;
    r.options.blocks = 16;
    r.workspace = WorkspaceLimits{size_t(4) << 20, size_t(2) << 20};
    const ReducePlan p = plan_reduce(r, TuningTable{});
    EXPECT(p.algo == Algo::kPipelined);
    EXPECT(p.kernel == KernelId::kReducePipelined);
    EXPECT(!p.stage_input && !p.gather_via_staging && !p.receive_area && !p.reads_peer_inputs);
    EXPECT_EQ(p.chunk_elements, ~size_t(0));
    EXPECT_EQ(p.blocks, 16);
    // 4 MiB / (16 blocks x 4 ranks) = 64 KiB per slot.
    EXPECT_EQ(p.piece_elements, size_t(32) << 10);
    r.in_place = true;
    EXPECT(!plan_reduce(r, TuningTable{}).stage_input);
  }
  const WorkspaceLimits limits{size_t(4) << 20, size_t(2) << 20};
  // A small slice spreads over the blocks: 1000 bf16 elements at world 2 -> slices of 504,
  // 504 / 16 blocks = 31.5 elements -> 64 bytes (4 vectors) per piece.
  EXPECT_EQ(pipelined_piece_elements(1000, false, 2, 2, 16, limits), size_t(32));
  // At least one vector, whatever the message.
  EXPECT_EQ(pipelined_piece_elements(1, true, 4, 8, 160, limits), size_t(4));
  // Whole vectors that fit: 4 MiB / (7 x 3) = 199728.76 bytes -> 199728.
  EXPECT_EQ(pipelined_piece_elements(size_t(1) << 30, false, 4, 3, 7, limits), size_t(199728 / 4));
  for (size_t count : {size_t(1), size_t(999), size_t(1) << 20, size_t(1) << 28})
    for (int world : {2, 3, 8})
      for (int blocks : {1, 5, 64, 160}) {
        const size_t piece = pipelined_piece_elements(count, false, 2, world, blocks, limits);
        EXPECT(piece * 2 % 16 == 0 && piece > 0);
        EXPECT(piece * 2 * size_t(blocks) * size_t(world) <= limits.staging || piece * 2 == 16);
      }
}
