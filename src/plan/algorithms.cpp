#include "plan/algorithms.hpp"

#include <algorithm>
#include <cctype>
#include <iterator>

namespace symmem::detail {
namespace {

using A = Access;
using K = KernelId;
constexpr Collective kGather = Collective::kAllGather;
constexpr Collective kReduce = Collective::kAllReduce;
constexpr Collective kScatter = Collective::kReduceScatter;
constexpr Collective kToAll = Collective::kAllToAll;
constexpr uint32_t kFlags = kAreaBarrierFlags;
// The pipelined reductions' slots (kernels/reduce_pipelined.cu).
constexpr uint32_t kAreaPipelined = kAreaPushSlots | kAreaReceive | kAreaStagingOut | kAreaStagingIn;

// clang-format off
constexpr Algorithm kAlgorithms[] = {
  // collective  algo                     name                    alias
  //   SMs    nodes  ll     slice  in-place  input      output                   areas
  //   kernel                           aligned kernel
  {kGather,  Algo::kPull,              "pull",                 Algo::kAuto,
     true,  false, false, false, false,    A::kPeers, A::kOwn,                 kFlags | kAreaStagingIn,
     K::kAllGatherPull,                K::kAllGatherPull},
  {kGather,  Algo::kPush,              "push",                 Algo::kAuto,
     true,  false, false, false, false,    A::kOwn,   A::kPeers,               kFlags | kAreaStagingOut,
     K::kAllGatherPush,                K::kAllGatherPushBulk},
  {kGather,  Algo::kCopyEngine,        "copy_engine",          Algo::kAuto,
     false, false, false, false, false,    A::kPeers, A::kOwn,                 kAreaBoardHandshakes | kAreaStagingIn,
     K::kAllGatherCopyEngine,          K::kAllGatherCopyEngine},
  {kGather,  Algo::kLowLatency,        "low_latency",          Algo::kAuto,
     true,  false, true,  false, false,    A::kOwn,   A::kOwn,                 kAreaLowLatency,
     K::kAllGatherLowLatency,          K::kAllGatherLowLatency},
  {kGather,  Algo::kHierarchical,      "hierarchical",         Algo::kAuto,
     false, true,  false, false, false,    A::kPeers, A::kPeers,               kAreaBoardHandshakes | kAreaStagingIn | kAreaStagingOut,
     K::kAllGatherHierarchical,        K::kAllGatherHierarchical},
  {kReduce,  Algo::kOneShot,           "one_shot",             Algo::kAuto,
     true,  false, false, false, true,     A::kPeers, A::kOwn,                 kFlags | kAreaStagingIn,
     K::kReduceFromEveryRank,          K::kReduceFromEveryRank},
  {kReduce,  Algo::kOneShotPush,       "one_shot_push",        Algo::kAuto,
     true,  false, false, false, false,    A::kOwn,   A::kOwn,                 kFlags | kAreaReceive,
     K::kReducePushed,                 K::kReducePushed},
  {kReduce,  Algo::kTwoShot,           "two_shot",             Algo::kAuto,
     true,  false, false, true,  false,    A::kPeers, A::kPeersIfSymmetric,    kFlags | kAreaStagingIn | kAreaStagingOut,
     K::kAllReduceTwoShot,             K::kAllReduceTwoShot},
  {kReduce,  Algo::kTwoShotPush,       "two_shot_push",        Algo::kAuto,
     true,  false, false, true,  false,    A::kOwn,   A::kPeersSymmetricOnly,  kFlags | kAreaPushSlots,
     K::kAllReduceTwoShotPush,         K::kAllReduceTwoShotPush},
  {kReduce,  Algo::kLowLatency,        "low_latency",          Algo::kAuto,
     true,  false, true,  false, false,    A::kOwn,   A::kOwn,                 kAreaLowLatency | kAreaStagingIn,
     K::kAllReduceLowLatency,          K::kAllReduceLowLatency},
  {kReduce,  Algo::kLowLatencyTwoShot, "low_latency_two_shot", Algo::kAuto,
     true,  false, true,  true,  false,    A::kOwn,   A::kOwn,                 kAreaLowLatency | kAreaStagingIn,
     K::kAllReduceLowLatencyTwoShot,   K::kAllReduceLowLatencyTwoShot},
  {kReduce,  Algo::kPipelined,         "pipelined",            Algo::kAuto,
     true,  false, false, true,  false,    A::kOwn,   A::kOwn,                 kFlags | kAreaPipelined,
     K::kReducePipelined,              K::kReducePipelined},
  // Reduce-scatter's pull and push were named two_shot and two_shot_push: they are the first halves
  // of those all-reduces, and run the one-shot kernels over one slice per rank.
  {kScatter, Algo::kPull,              "pull",                 Algo::kTwoShot,
     true,  false, false, false, false,    A::kPeers, A::kOwn,                 kFlags | kAreaStagingIn,
     K::kReduceFromEveryRank,          K::kReduceFromEveryRank},
  {kScatter, Algo::kPush,              "push",                 Algo::kTwoShotPush,
     true,  false, false, false, false,    A::kOwn,   A::kOwn,                 kFlags | kAreaReceive,
     K::kReducePushed,                 K::kReducePushed},
  {kScatter, Algo::kLowLatency,        "low_latency",          Algo::kAuto,
     true,  false, true,  false, false,    A::kOwn,   A::kOwn,                 kAreaLowLatency,
     K::kReduceScatterLowLatency,      K::kReduceScatterLowLatency},
  {kScatter, Algo::kPipelined,         "pipelined",            Algo::kAuto,
     true,  false, false, true,  false,    A::kOwn,   A::kOwn,                 kFlags | kAreaPipelined,
     K::kReducePipelined,              K::kReducePipelined},
  // All-to-all (docs/moe.md). Its variable forms (splits exchanged on the device) run push or pull,
  // and their kernel takes the low-latency lines itself when the exchanged splits are small; the
  // uniform form runs every row. In place, peers would read (pull) or overwrite (push) what this
  // rank still sends: the input is staged. Low latency needs no staging in place: the thread that
  // sends a word of every slice is the one that later writes that word of every slice it receives.
  {kToAll,   Algo::kPull,              "pull",                 Algo::kAuto,
     true,  false, false, false, true,     A::kPeers, A::kOwn,                 kFlags | kAreaStagingIn | kAreaLowLatency,
     K::kAllToAllPull,                 K::kAllToAllPull},
  {kToAll,   Algo::kPush,              "push",                 Algo::kAuto,
     true,  false, false, false, true,     A::kOwn,   A::kPeersSymmetricOnly,  kFlags | kAreaStagingIn | kAreaLowLatency,
     K::kAllToAllPush,                 K::kAllToAllPush},
  {kToAll,   Algo::kCopyEngine,        "copy_engine",          Algo::kAuto,
     false, false, false, false, true,     A::kPeers, A::kOwn,                 kAreaBoardHandshakes | kAreaStagingIn,
     K::kAllToAllCopyEngine,           K::kAllToAllCopyEngine},
  {kToAll,   Algo::kLowLatency,        "low_latency",          Algo::kAuto,
     true,  false, true,  false, false,    A::kOwn,   A::kOwn,                 kAreaLowLatency | kAreaStagingIn,
     K::kAllToAllLowLatency,           K::kAllToAllLowLatency},
};
// clang-format on

}  // namespace

const char* collective_name(Collective collective) {
  switch (collective) {
    case Collective::kAllGather: return "all_gather";
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllToAll: return "all_to_all";
  }
  return "?";
}

const char* kernel_name(KernelId kernel) {
  switch (kernel) {
    case K::kAllGatherPull: return "all_gather_pull";
    case K::kAllGatherPush: return "all_gather_push";
    case K::kAllGatherPushBulk: return "all_gather_push_bulk";
    case K::kAllGatherLowLatency: return "all_gather_low_latency";
    case K::kAllGatherCopyEngine: return "all_gather_copy_engine";
    case K::kAllGatherHierarchical: return "all_gather_hierarchical";
    case K::kReduceFromEveryRank: return "reduce_from_every_rank";
    case K::kReducePushed: return "reduce_pushed";
    case K::kAllReduceTwoShot: return "all_reduce_two_shot";
    case K::kAllReduceTwoShotPush: return "all_reduce_two_shot_push";
    case K::kAllReduceLowLatency: return "all_reduce_low_latency";
    case K::kAllReduceLowLatencyTwoShot: return "all_reduce_low_latency_two_shot";
    case K::kReduceScatterLowLatency: return "reduce_scatter_low_latency";
    case K::kReducePipelined: return "reduce_pipelined";
    case K::kAllToAllPull: return "all_to_all_pull";
    case K::kAllToAllPush: return "all_to_all_push";
    case K::kAllToAllLowLatency: return "all_to_all_low_latency";
    case K::kAllToAllCopyEngine: return "all_to_all_copy_engine";
  }
  return "?";
}

const Algorithm* algorithms_begin() { return std::begin(kAlgorithms); }
const Algorithm* algorithms_end() { return std::end(kAlgorithms); }

const Algorithm* find_algorithm(Collective collective, Algo algo) {
  // Every call plans through here a few times: an index by (collective, enumerator), built once.
  constexpr int kSlots = 32;
  struct Index {
    const Algorithm* rows[kCollectiveCount][kSlots] = {};
    Index() {
      for (const Algorithm& a : kAlgorithms)
        for (Algo name : {a.algo, a.alias})
          if (name != Algo::kAuto && int(name) < kSlots) rows[int(a.collective)][int(name)] = &a;
    }
  };
  static const Index index;
  const int slot = static_cast<int>(algo);
  return slot > 0 && slot < kSlots ? index.rows[int(collective)][slot] : nullptr;
}

std::string algorithm_names(Collective collective) {
  std::string names;
  for (const Algorithm& a : kAlgorithms) {
    if (a.collective != collective || a.across_nodes) continue;
    if (!names.empty()) names += ", ";
    names += algo_name(a.algo);
  }
  return names;
}

}  // namespace symmem::detail

namespace symmem {

// The public names (symmem/types.hpp) come from the table: every enumerator but kAuto keys a row.
const char* algo_name(Algo algo) {
  if (algo == Algo::kAuto) return "auto";
  for (const detail::Algorithm* a = detail::algorithms_begin(); a != detail::algorithms_end(); ++a)
    if (a->algo == algo) return a->name;
  return "?";
}

bool parse_algo(const std::string& name, Algo* algo) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "auto") {
    *algo = Algo::kAuto;
    return true;
  }
  for (const detail::Algorithm* a = detail::algorithms_begin(); a != detail::algorithms_end(); ++a) {
    if (n == a->name) {
      *algo = a->algo;
      return true;
    }
  }
  return false;
}

}  // namespace symmem
