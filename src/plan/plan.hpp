// Planning: which algorithm (a row of the table, algorithms.hpp) and so which kernel, how many
// blocks, which vector width, what must be staged, and how a call is cut into chunks. Pure C++
// with no CUDA, so CPU tests check it; every rank computes the same plan from the same inputs.
// Launch code runs the plan: it narrows the vector width for its local pointers
// (narrowed_kernel) and dispatches on the kernel, and decides nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "plan/algorithms.hpp"
#include "plan/tuning_table.hpp"
#include "symmem/types.hpp"

namespace symmem::detail {

// Largest power of two <= 16 dividing every value (sizes and addresses): the widest vector that
// keeps every access aligned.
int common_vector_bytes(std::initializer_list<uint64_t> values);

// The workspace capacities that bound one chunk of a call (equal on every rank). Unbounded unless
// given.
struct WorkspaceLimits {
  static constexpr size_t kUnbounded = ~size_t(0);
  size_t staging = kUnbounded;       // staging_in, staging_out and push_slots: bytes each
  size_t receive_half = kUnbounded;  // one parity half of the receive area, bytes
};

struct AllGatherRequest {
  size_t bytes_per_rank = 0;
  size_t elem_bytes = 1;
  int world = 1;
  int sm_count = 132;
  CollectiveOptions options;
  Algo forced = Algo::kAuto;  // SYMMEM_ALGO, applied only when options.algo is kAuto
  int forced_blocks = 0;      // SYMMEM_BLOCKS
  bool in_symmetric = false;  // the caller passed symmetric operands (agreed: part of the signature)
  bool out_symmetric = false;
  // Alignment inputs, equal on every rank: a symmetric operand's heap offset; 0 for a local one
  // (a local pointer's alignment is this rank's own affair, settled at launch without changing
  // the protocol: it may narrow the vector width or turn bulk push into plain push).
  uint64_t in_address = 0;
  uint64_t out_address = 0;
  bool copy_engine_push = false;    // SYMMEM_CE_DIRECTION=push (used when the output is symmetric)
  bool push_bulk = true;            // SYMMEM_PUSH_BULK: push with Hopper bulk copies where aligned
  size_t low_latency_capacity = 0;  // largest message per rank the low-latency areas hold, bytes
  int nodes = 1;                    // nodes the communicator spans (world is the ranks of one node)
  WorkspaceLimits workspace;
};

struct AllGatherPlan {
  Algo algo = Algo::kPull;  // kPull, kPush, kCopyEngine, kLowLatency or kHierarchical
  KernelId kernel = KernelId::kAllGatherPull;
  int blocks = 0;  // 0 for the copy engine
  int vector_bytes = 16;
  bool stage_input = false;            // copy the input into the heap first (pull, copy engine, hierarchical)
  bool stage_output = false;           // push into the heap, then copy out (push, hierarchical)
  bool copy_engine_push = false;       // copy engine writes into the peers' outputs (else reads inputs)
  int local_warps = 0;                 // pull, out of place: warps of each block that copy the own slot
  size_t chunk_elements = ~size_t(0);  // per rank and chunk (all_gather_chunk_elements)
};

// The kernel that runs `plan` where this rank's local pointers allow `vector_bytes` only (at most
// plan.vector_bytes): the plan's, or the kernel of the same protocol that takes that width (push
// rather than bulk push below 16 bytes). A local pointer is this rank's own affair: the protocol,
// the grid and the signature stay the plan's.
KernelId narrowed_kernel(const AllGatherPlan& plan, int vector_bytes);

// Pull out of place: warps of each 16-warp block that copy this rank's own slot while the others
// read NVLink. A local load returns several times sooner than a peer's, so a few warps keep the
// local copy (1/world of the traffic) apace, and the rest keep all their loads in flight on NVLink.
// Measured on 2 x H200: 4 or 6 warps lift 16 blocks from 291 to 331-333 GB/s at 512 MiB per rank,
// 2 warps fall behind (the local copy becomes the bottleneck); with more peers the own slot is a
// smaller share, so fewer warps suffice.
int pull_local_warps(int world);

// Throws kInvalidArgument for a request no algorithm can serve (e.g. an SM algorithm with
// max_blocks = 0).
AllGatherPlan plan_all_gather(const AllGatherRequest& request, const TuningTable& table);

struct ReduceRequest {
  bool reduce_scatter = false;  // else all-reduce
  size_t count = 0;             // all-reduce: elements; reduce-scatter: elements per rank
  size_t elem_bytes = 2;
  int world = 1;
  int sm_count = 132;
  CollectiveOptions options;
  Algo forced = Algo::kAuto;
  int forced_blocks = 0;
  bool in_symmetric = false;  // agreed, as for AllGatherRequest
  bool out_symmetric = false;
  uint64_t in_address = 0;  // agreed alignment inputs, as for AllGatherRequest
  uint64_t out_address = 0;
  size_t low_latency_capacity = 0;  // largest message the low-latency areas hold, bytes
  bool in_place = false;
  WorkspaceLimits workspace;
};

struct ReducePlan {
  Algo algo = Algo::kTwoShot;  // all-reduce: an all-reduce algorithm; reduce-scatter: kPull, kPush
                               // or kLowLatency
  KernelId kernel = KernelId::kAllReduceTwoShot;
  int blocks = 0;
  bool vector = true;                  // 16-byte vectors (all addresses aligned)
  bool stage_input = false;            // input must be copied into the heap first (also one-shot in
                                       // place: ranks would overwrite inputs their peers still read)
  bool gather_via_staging = false;     // two-shot with an output outside the heap: the reduced slices
                                       // are gathered from every rank's staging_out
  bool reads_peer_inputs = true;       // false: reads only this rank's input (low latency, push)
  bool receive_area = false;           // peers store their inputs into this rank's parity-alternating
                                       // receive area (one-shot push, reduce-scatter push)
  size_t chunk_elements = ~size_t(0);  // per chunk (per rank for reduce-scatter; reduce_chunk_elements)
  size_t piece_elements = 0;           // pipelined: elements per slot (pipelined_piece_elements)
};

ReducePlan plan_reduce(const ReduceRequest& request, const TuningTable& table);

// Most elements (per rank for all-gather and reduce-scatter) that one chunk of the call may cover
// so that everything it stages or receives fits its workspace; a multiple of 16 bytes' worth of
// elements, at least one vector. SIZE_MAX when the plan needs no workspace. The planners fill
// chunk_elements with these.
size_t all_gather_chunk_elements(const AllGatherPlan& plan, size_t elem_bytes, int world,
                                 const WorkspaceLimits& limits);
size_t reduce_chunk_elements(const ReducePlan& plan, bool reduce_scatter, size_t elem_bytes, int world,
                             const WorkspaceLimits& limits);

// The pipelined reductions' piece: the elements one block moves per peer and round. Each of the
// four slot areas (`limits.staging` bytes) holds blocks x world slots; the piece is the largest
// whole number of 16-byte vectors that fits, or less when a slice (two-shot slice of an all-reduce,
// per-rank count of a reduce-scatter) spreads over the blocks in one round. At least one vector.
size_t pipelined_piece_elements(size_t count, bool reduce_scatter, size_t elem_bytes, int world, int blocks,
                                const WorkspaceLimits& limits);

// [0, count) cut into consecutive chunks of at most `limit` elements (one chunk when it fits).
struct ElementChunk {
  size_t begin;
  size_t count;
};
std::vector<ElementChunk> plan_chunks(size_t count, size_t limit);

// A string like "all_gather pull blocks=16 vector=16" for SYMMEM_DEBUG logs.
std::string describe(const AllGatherPlan& plan);
std::string describe(const ReducePlan& plan);

}  // namespace symmem::detail
