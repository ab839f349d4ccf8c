// Planning the all-to-all: which algorithm (a row of the table, algorithms.hpp) and so which
// kernel, how many blocks, what is staged, and for the variable-size forms the bytes per pair under
// which a pair travels as low-latency lines. Pure C++ with no CUDA: every input is equal on every
// rank (the signature covers them), so every rank plans the same call. Row counts of all_to_all_v /
// all_to_all_vdev are NOT inputs: they are known on every rank only on the device, after the split
// exchange (all_to_all_layout.hpp), where the kernel decides per pair between lines and SM and cuts
// the SM traffic into equal spans per block (all_to_all_cut.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "plan/plan.hpp"
#include "plan/tuning_table.hpp"
#include "symmem/types.hpp"

namespace symmem::detail {

enum class AllToAllForm {
  kUniform,       // every pair moves the same bytes, known on the host
  kHostSplits,    // all_to_all_v: row counts from each rank's host, exchanged on the device
  kDeviceSplits,  // all_to_all_vdev (and its 2-D, expert-major form): row counts in device memory
};

struct AllToAllRequest {
  AllToAllForm form = AllToAllForm::kUniform;
  size_t pair_bytes = 0;  // kUniform: bytes from each rank to each rank
  size_t row_bytes = 1;   // variable forms: bytes of one row
  int experts = 1;        // variable forms: local experts per rank (2-D form), else 1
  int world = 1;
  int sm_count = 132;
  CollectiveOptions options;
  Algo forced = Algo::kAuto;  // SYMMEM_ALGO, applied only when options.algo is kAuto
  int forced_blocks = 0;      // SYMMEM_BLOCKS
  bool in_symmetric = false;  // agreed (part of the signature)
  bool out_symmetric = false;
  bool in_place = false;
  uint64_t in_address = 0;  // a symmetric operand's heap offset; 0 for a local one
  uint64_t out_address = 0;
  size_t low_latency_capacity = 0;  // bytes one sender's low-latency slot holds
  WorkspaceLimits workspace;        // staging: bytes of the staging_in workspace
};

struct AllToAllPlan {
  Algo algo = Algo::kPush;  // kUniform: kLowLatency, kPush, kPull or kCopyEngine; else kPush or kPull
  KernelId kernel = KernelId::kAllToAllPush;
  int blocks = 0;         // 0 for the copy engine
  int vector_bytes = 16;  // agreed width; launch narrows it for local pointers
  bool exchange = false;  // variable forms: the kernel exchanges the splits before moving rows
  // Variable forms: a pair of at most this many bytes travels as low-latency lines, stored by the
  // sender with its header, the others by the kernel's SM path (the sender decides from its own
  // splits, every receiver the same from the sender's header: plan/all_to_all_layout.hpp's
  // pair_by_lines); 0: every pair by SM (always for the 2-D form with several experts: a pair's
  // rows land in several places).
  size_t low_latency_pair_bytes = 0;
  bool stage_input = false;     // the input is copied into staging_in first (pull from a local
                                // input; in place, where peers would read what this rank overwrites)
  size_t chunk_pair_bytes = 0;  // kUniform with a staged input: bytes per pair of one chunk (0: one chunk)
};

// Throws kInvalidArgument for a request no algorithm can serve, naming why.
AllToAllPlan plan_all_to_all(const AllToAllRequest& request, const TuningTable& table);

// "all_to_all pull blocks=32 vector=16 staged-input" for SYMMEM_DEBUG logs and describe_*.
std::string describe(const AllToAllPlan& plan);

// Blocks the variable forms use when nothing asks otherwise: their traffic is unknown on the
// host, and 32 blocks of kThreadsPerBlock keep NVLink busy (the pull all-gather's 16 reached
// 330 GB/s on 2 x H200), while leaving most SMs to compute.
constexpr int kAllToAllVariableBlocks = 32;

}  // namespace symmem::detail
