// The table of algorithms: the one place that says what each algorithm of each collective is, what
// it needs from its operands and workspaces, and which kernel runs it. The planner (plan.hpp)
// picks a row and returns its kernel; launch code dispatches on that kernel and decides nothing
// again. Adding an algorithm is a row here, its kernel and its tests (docs/algorithms.md, "Adding
// an algorithm"). Pure C++: no CUDA, no kernel header.
#pragma once

#include <cstdint>
#include <string>

#include "symmem/types.hpp"

namespace symmem::detail {

// The collectives, numbered once: the C ABI (symmem_collective_name, symmem_describe) and the
// Python package (symmem._native.COLLECTIVES) read this numbering, never copy it.
enum class Collective : uint8_t { kAllGather, kAllReduce, kReduceScatter, kAllToAll };
constexpr int kCollectiveCount = 4;  // one past the last Collective
// "all_gather", "all_reduce", "reduce_scatter", "all_to_all"; "?" for no collective
const char* collective_name(Collective collective);

// What runs a plan: an SM kernel (src/kernels/), or the copy engines driven by stream memory
// operations (no kernel). Each is named for what it does; one kernel may serve several rows.
enum class KernelId : uint8_t {
  kAllGatherPull,               // every rank reads every peer's input into its own output
  kAllGatherPush,               // every rank stores its input into every peer's output
  kAllGatherPushBulk,           // the push protocol with Hopper bulk copies (16-byte aligned only)
  kAllGatherLowLatency,         // data and flag in one store (device/low_latency.cuh)
  kAllGatherCopyEngine,         // no kernel: handshakes and copies on the copy engines
  kAllGatherHierarchical,       // no kernel: NCCL between nodes, the copy engines inside each
  kReduceFromEveryRank,         // each rank reads its range of every rank's input and reduces it
  kReducePushed,                // each rank stores range p of its input into rank p's receive area,
                                // then reduces what it received; one barrier
  kAllReduceTwoShot,            // each rank reduces a slice of every input, then every rank gets
                                // every reduced slice
  kAllReduceTwoShotPush,        // two-shot whose NVLink traffic is stores only
  kAllReduceLowLatency,         // low-latency lines; every rank reduces the whole message
  kAllReduceLowLatencyTwoShot,  // low-latency lines; each rank reduces a slice and sends it back
  kReduceScatterLowLatency,     // low-latency lines; each rank receives and reduces its slice
  kReducePipelined,             // two-shot in rounds through fixed slots (all-reduce and
                                // reduce-scatter), every NVLink transfer a store
  kAllToAllPull,                // every rank reads its rows from every peer's input (variable forms:
                                // small pairs come as low-latency lines with the split exchange)
  kAllToAllPush,                // every rank stores its rows into every peer's output (the same)
  kAllToAllLowLatency,          // uniform: every pair's bytes as low-latency lines
  kAllToAllCopyEngine,          // no kernel: the copy-engine all-gather's handshakes and copies, a
                                // slice per peer
};
const char* kernel_name(KernelId kernel);  // e.g. "all_gather_push_bulk"

// Who touches an operand. A peer cannot reach a local (non-heap) operand: the planner stages it
// through a workspace, or refuses the algorithm.
enum class Access : uint8_t {
  kOwn,                 // this rank only
  kPeers,               // peers read (input) or write or read (output) it: staged when local
  kPeersIfSymmetric,    // output: peers store results into it when it is symmetric; a local one
                        // gathers them from the peers' staging_out instead (all-reduce two-shot)
  kPeersSymmetricOnly,  // output: peers store results into it; it must be symmetric
};

// The workspace areas an algorithm may use (workspace/workspaces.hpp): a bit set.
enum WorkspaceArea : uint32_t {
  kAreaBarrierFlags = 1u << 0,
  kAreaStagingIn = 1u << 1,
  kAreaStagingOut = 1u << 2,
  kAreaPushSlots = 1u << 3,
  kAreaReceive = 1u << 4,
  kAreaLowLatency = 1u << 5,
  kAreaBoardHandshakes = 1u << 6,  // the host board's copy-engine words (board/host_board.hpp)
};

struct Algorithm {
  Collective collective;
  Algo algo;                   // its public enumerator: what a plan and a signature hold
  const char* name;            // what SYMMEM_ALGO, the tuning table and describe() say (algo_name)
  Algo alias;                  // an older enumerator this collective still accepts for it, or kAuto
  bool uses_sms;               // false: it runs with an SM budget of 0
  bool across_nodes;           // the algorithm of communicators spanning nodes: chosen for them,
                               // never by SYMMEM_ALGO or the tuning table
  bool low_latency;            // its message must fit the low-latency lines
  bool reduces_a_slice;        // a reduction in which each rank reduces 1/world of the message
  bool in_place_stages_input;  // in place, peers would read what this rank overwrites: stage
  Access input;
  Access output;
  uint32_t areas;  // WorkspaceArea bits
  KernelId kernel;
  KernelId aligned_kernel;  // the kernel of the same protocol that runs where every address
                            // allows 16-byte vectors (== kernel when there is no other)
};

// Every row, in the order docs/algorithms.md lists them.
const Algorithm* algorithms_begin();
const Algorithm* algorithms_end();

// The row of `collective` that `algo` names (its enumerator or its alias), or null.
const Algorithm* find_algorithm(Collective collective, Algo algo);
// "pull, push, copy_engine, low_latency": what `collective` accepts from a caller (error
// messages), the across-nodes algorithm left out.
std::string algorithm_names(Collective collective);

}  // namespace symmem::detail
