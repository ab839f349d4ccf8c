// The table of algorithms (src/plan/algorithms.cpp): every public name keys a row, names parse back,
// the old names still work, and every plan names the kernel of its row.
#include <set>
#include <string>

#include "plan/algorithms.hpp"
#include "plan/all_to_all_plan.hpp"
#include "plan/plan.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

namespace {

constexpr Algo kEveryAlgo[] = {
    Algo::kPull,    Algo::kPush,        Algo::kCopyEngine, Algo::kOneShot,           Algo::kOneShotPush,
    Algo::kTwoShot, Algo::kTwoShotPush, Algo::kLowLatency, Algo::kLowLatencyTwoShot, Algo::kHierarchical,
    Algo::kPipelined};

}  // namespace

TEST(every_algorithm_has_a_row_and_a_name_that_parses_back) {
  for (Algo a : kEveryAlgo) {
    const std::string name = algo_name(a);
    EXPECT(name != "?");
    Algo parsed = Algo::kAuto;
    EXPECT(parse_algo(name, &parsed));
    EXPECT(parsed == a);
  }
  Algo parsed = Algo::kPull;
  EXPECT(parse_algo("AUTO", &parsed) && parsed == Algo::kAuto);
  EXPECT(!parse_algo("three_shot", &parsed));
  EXPECT_EQ(std::string(algo_name(static_cast<Algo>(99))), std::string("?"));
}

TEST(rows_are_consistent) {
  std::set<std::string> kernels;
  for (const Algorithm* a = algorithms_begin(); a != algorithms_end(); ++a) {
    // One name per enumerator, whichever collective's row it is.
    EXPECT_EQ(std::string(a->name), std::string(algo_name(a->algo)));
    // A collective's rows answer to distinct enumerators and aliases.
    EXPECT(find_algorithm(a->collective, a->algo) == a);
    if (a->alias != Algo::kAuto) EXPECT(find_algorithm(a->collective, a->alias) == a);
    // SM-free rows run no SM kernel; low-latency rows use the lines; every kernel has a name.
    EXPECT(a->uses_sms || a->kernel == KernelId::kAllGatherCopyEngine ||
           a->kernel == KernelId::kAllGatherHierarchical || a->kernel == KernelId::kAllToAllCopyEngine);
    EXPECT(!a->low_latency || (a->areas & kAreaLowLatency) != 0);
    EXPECT(std::string(kernel_name(a->kernel)) != "?");
    EXPECT(std::string(kernel_name(a->aligned_kernel)) != "?");
    kernels.insert(kernel_name(a->kernel));
  }
  // Every collective of the numbering (the C ABI's and Python's) has a name and rows.
  for (int c = 0; c < kCollectiveCount; ++c) {
    EXPECT(std::string(collective_name(static_cast<Collective>(c))) != "?");
    EXPECT(!algorithm_names(static_cast<Collective>(c)).empty());
  }
  EXPECT_EQ(std::string(collective_name(static_cast<Collective>(kCollectiveCount))), std::string("?"));
  EXPECT_EQ(algorithm_names(Collective::kAllGather), std::string("pull, push, copy_engine, low_latency"));
  EXPECT_EQ(algorithm_names(Collective::kReduceScatter), std::string("pull, push, low_latency, pipelined"));
  EXPECT_EQ(algorithm_names(Collective::kAllToAll), std::string("pull, push, copy_engine, low_latency"));
  EXPECT_EQ(std::string(collective_name(Collective::kAllToAll)), std::string("all_to_all"));
}

TEST(reduce_scatter_keeps_its_old_names) {
  EXPECT(find_algorithm(Collective::kReduceScatter, Algo::kTwoShot)->algo == Algo::kPull);
  EXPECT(find_algorithm(Collective::kReduceScatter, Algo::kTwoShotPush)->algo == Algo::kPush);
  // ... and the kernels they ran: the one-shot kernels over one slice per rank.
  EXPECT(find_algorithm(Collective::kReduceScatter, Algo::kPull)->kernel == KernelId::kReduceFromEveryRank);
  EXPECT(find_algorithm(Collective::kReduceScatter, Algo::kPush)->kernel == KernelId::kReducePushed);
  EXPECT(find_algorithm(Collective::kAllReduce, Algo::kPull) == nullptr);
  EXPECT(find_algorithm(Collective::kAllGather, Algo::kTwoShot) == nullptr);
}

TEST(every_plan_names_the_kernel_of_its_row) {
  for (int world : {1, 2, 4, 8})
    for (size_t bytes : {size_t(4), size_t(4096), size_t(1) << 20, size_t(64) << 20}) {
      for (Algo a : kEveryAlgo) {
        AllGatherRequest g;
        g.world = world;
        g.bytes_per_rank = bytes;
        g.in_symmetric = g.out_symmetric = true;
        g.low_latency_capacity = size_t(1) << 20;
        g.options.algo = a;
        try {
          const AllGatherPlan p = plan_all_gather(g, TuningTable{});
          const Algorithm* row = find_algorithm(Collective::kAllGather, p.algo);
          EXPECT(row != nullptr);
          EXPECT(p.kernel == row->kernel || p.kernel == row->aligned_kernel);
        } catch (const Error&) {
        }
        for (AllToAllForm form : {AllToAllForm::kUniform, AllToAllForm::kDeviceSplits}) {
          AllToAllRequest t;
          t.form = form;
          t.world = world;
          t.pair_bytes = bytes;
          t.row_bytes = 64;
          t.in_symmetric = t.out_symmetric = true;
          t.low_latency_capacity = size_t(1) << 20;
          t.options.algo = a;
          try {
            const AllToAllPlan p = plan_all_to_all(t, TuningTable{});
            const Algorithm* row = find_algorithm(Collective::kAllToAll, p.algo);
            EXPECT(row != nullptr && row->algo == p.algo);
            EXPECT(p.kernel == row->kernel);
          } catch (const Error&) {
          }
        }
        for (bool rs : {false, true}) {
          ReduceRequest r;
          r.reduce_scatter = rs;
          r.world = world;
          r.count = bytes / 2;
          r.in_symmetric = r.out_symmetric = true;
          r.low_latency_capacity = size_t(1) << 20;
          r.options.algo = a;
          try {
            const ReducePlan p = plan_reduce(r, TuningTable{});
            const Algorithm* row = find_algorithm(rs ? Collective::kReduceScatter : Collective::kAllReduce, p.algo);
            EXPECT(row != nullptr && row->algo == p.algo);
            EXPECT(p.kernel == row->kernel);
          } catch (const Error&) {
          }
        }
      }
    }
}
