// The SM share of ranks sharing one GPU (tests only, src/plan/shared_gpu.hpp): every rank's grid and
// the successor it launches early must be resident together, on every GPU, at every world size.
#include "plan/plan.hpp"
#include "plan/shared_gpu.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

TEST(ranks_sharing_a_gpu_fit_their_kernels_and_early_successors) {
  for (int sms = 2; sms <= 200; ++sms) {
    EXPECT_EQ(shared_gpu_sm_share(sms, 1), sms);  // alone on its GPU: every SM
    for (int ranks = 2; ranks <= kMaxWorld; ++ranks) {
      const int share = shared_gpu_sm_share(sms, ranks);
      EXPECT(share >= 1);
      // Two grids per rank (its kernel and the next, resident early), a block at most an SM each.
      if (sms >= 2 * ranks) EXPECT(2 * ranks * share <= sms);
    }
  }
  // One H100 (132 SMs) shared by 4 ranks: the older share sm / (ranks + 1) = 26 blocks let
  // 4 x 2 x 26 = 208 blocks ask for 132 SMs.
  EXPECT_EQ(shared_gpu_sm_share(132, 4), 16);
  EXPECT_EQ(shared_gpu_sm_share(132, 8), 8);
}

TEST(automatic_plans_stay_within_the_share) {
  // The planner clamps every grid, asked for or chosen, to the SM count it is given.
  for (int ranks = 2; ranks <= kMaxWorld; ++ranks) {
    const int share = shared_gpu_sm_share(132, ranks);
    for (size_t bytes : {size_t(4), size_t(256) << 10, size_t(1) << 20, size_t(8) << 20}) {
      AllGatherRequest g;
      g.world = ranks;
      g.sm_count = share;
      g.bytes_per_rank = bytes;
      g.in_symmetric = g.out_symmetric = true;
      g.low_latency_capacity = size_t(1) << 20;
      EXPECT(plan_all_gather(g, TuningTable{}).blocks <= share);
      g.options.blocks = 160;
      EXPECT(plan_all_gather(g, TuningTable{}).blocks <= share);
      ReduceRequest r;
      r.world = ranks;
      r.sm_count = share;
      r.count = bytes / 2;
      r.in_symmetric = r.out_symmetric = true;
      r.low_latency_capacity = size_t(1) << 20;
      for (Algo algo : {Algo::kAuto, Algo::kLowLatency, Algo::kTwoShot, Algo::kOneShot}) {
        r.options.algo = algo;
        try {
          EXPECT(plan_reduce(r, TuningTable{}).blocks <= share);
        } catch (const Error&) {
        }
      }
    }
  }
}
