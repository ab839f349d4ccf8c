// Expert parallelism inside one NVLink node: MoE token dispatch and combine for top-k routing.
//
//   EpContext::create(comm, config)   collective; buffers fixed for the context's lifetime
//   ctx->dispatch(args, stream)       tokens to the ranks holding their experts
//     ... expert GEMMs read ctx->received(), write expert outputs into received().combine_input ...
//   ctx->combine(args, stream)        expert outputs back, summed in fp32 in a fixed order
//
// Two layouts (vLLM's activation formats):
//   kExpertMajor ("BatchedExperts", DeepEP low latency, pplx): one row per (token, expert) pair,
//     in [local expert][slot], each local expert holding max_tokens_per_expert rows; rows of expert
//     e come from rank 0, 1, ..., each rank's in token order. Combine applies the top-k weights
//     (unless the caller applied them on the input) and sums the k rows of a token in top-k order.
//   kRankMajor ("Standard", DeepEP normal): one row per (token, destination rank), at most one per
//     rank whatever the number of its experts there, in [row], rows from rank 0, 1, ..., each in
//     token order; with each row its top-k indices rewritten to local expert ids (-1 elsewhere) and
//     its weights. The experts reduce a row over its local experts (weights applied); combine sums
//     a token's rows from its ranks in rank order.
// Payloads: bfloat16 rows, or float8 e4m3 rows with one float32 scale per 128 columns (the caller
// quantizes; dispatch moves the bits unchanged). Expert outputs (combine input) are bfloat16.
//
// Guarantees. No host synchronisation anywhere: token counts may live on the device (graphs are
// captured at the maximum batch and replayed with any smaller one); received counts are written
// to device memory. Every rank exchanges its per-expert counts first (one low-latency round trip),
// so every rank holds the whole count matrix: an expert (or rank) that would overflow its rows
// makes every rank raise kCapacity naming it, and no token moves in that call. Combine is
// deterministic: the same bits on every run and every rank for the same inputs. Dispatch and
// combine use at most max_blocks SMs (blocks()). Every wait has the communicator's deadline; a rank
// that never comes is named (kTimeout), a rank in another call (a combine against a dispatch,
// another context's shape) raises kMismatch.
//
// Ordering rules (docs/moe.md): a context's calls run in the same order on every rank; any number
// of combines may follow a dispatch, back to back (a combine ends on a rank only once no peer reads
// its combine area any more, so the next combine's staging copy, or new outputs written into
// combine_input right after it on the stream, are safe). The expert computation that reads
// received() and writes combine_input runs on the calls' stream, or ordered after the dispatch and
// before the combine.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "symmem/communicator.hpp"

namespace symmem {

enum class EpLayout { kExpertMajor, kRankMajor };
enum class EpPayload { kBFloat16, kFloat8E4M3 };

const char* ep_layout_name(EpLayout layout);     // "expert_major", "rank_major"
const char* ep_payload_name(EpPayload payload);  // "bfloat16", "float8_e4m3"

// Every field must be equal on every rank (checked at creation, naming the field).
struct EpConfig {
  int num_experts = 0;          // E, over all ranks; a multiple of the world size; at most 512
  int topk = 0;                 // K, 1 to 16
  int hidden = 0;               // H, a multiple of 128
  int max_tokens_per_rank = 0;  // T: tokens a rank may dispatch per call
  EpPayload payload = EpPayload::kBFloat16;
  EpLayout layout = EpLayout::kExpertMajor;
  // kExpertMajor: rows each local expert holds; 0 = world * T (every token of every rank).
  int max_tokens_per_expert = 0;
  // kRankMajor: rows a rank holds; 0 = world * T.
  int max_received_rows = 0;
  // SMs (thread blocks) dispatch and combine may use, 1 to 160; -1: the library's choice, 64 where
  // the combine is reduced on the experts' side, else 32 (docs/moe.md says why, with the figures).
  // A caller who shares the GPU with other work sets its budget here.
  int max_blocks = -1;
};

// What a context allocates, before it does: symmetric heap bytes per rank (receive rows and
// combine input, in the communicator's heap) and local device bytes (routing scratch). ep_memory
// counts the combine the planner picks; SYMMEM_MOE_COMBINE=reduced adds its partial rows to an
// expert-major context (docs/moe.md), EpContext::memory() counts what was allocated.
struct EpMemory {
  size_t heap_bytes = 0;
  size_t local_bytes = 0;
};
// Throws kInvalidArgument naming the first field of `config` that is out of range.
EpMemory ep_memory(const EpConfig& config, int world);
// The blocks (SMs) a context of `config` on `comm` would take (its blocks()), before it is made:
// local, allocates nothing; throws as ep_memory does.
int ep_blocks(Communicator& comm, const EpConfig& config);

// A rank with no tokens (num_tokens 0, an idle data-parallel rank) still makes every call: its
// tensors may then be null (torch's empty tensors), and combine's out too.
struct EpDispatchArgs {
  const void* x = nullptr;              // [num_tokens, H] bfloat16, or float8 e4m3 (payload)
  const float* x_scales = nullptr;      // float8: [num_tokens, H / 128] float32
  const void* topk_idx = nullptr;       // [num_tokens, K] global expert ids; -1 (any negative): none
  bool topk_idx_int64 = true;           // int64 (vLLM, DeepEP) or int32
  const float* topk_weights = nullptr;  // [num_tokens, K] float32
  // Tokens this call dispatches: num_tokens_device (a device int32) when set, else num_tokens.
  // Rows up to T must be readable either way. A count above T fails as kCapacity on every rank.
  int num_tokens = 0;
  const int32_t* num_tokens_device = nullptr;
};

struct EpCombineArgs {
  // Expert outputs: null to read the context's combine_input (zero copy); else device memory laid
  // out like it (bfloat16, same rows), whose valid rows are copied in first.
  const void* expert_out = nullptr;
  void* out = nullptr;  // [num_tokens, H] bfloat16 (rows of this rank's dispatched tokens; T with a device count)
  // kExpertMajor: the weights were applied before the experts (vLLM's apply_router_weight_on_input):
  // combine sums without them. Ignored for kRankMajor (the experts applied them).
  bool weights_applied = false;
  // kExpertMajor: weights to apply, [num_tokens, K] float32 as the dispatch's; null: those of the
  // dispatch (the context kept a copy).
  const float* topk_weights = nullptr;
};

// Where the received tokens are (device pointers into the context's buffers; fixed for its lifetime).
struct EpReceived {
  void* x;                     // kExpertMajor: [E_local, rows_per_expert, H]; kRankMajor: [rows, H]
  float* x_scales;             // float8: the same rows x [H / 128]; else null
  int32_t* topk_idx;           // kRankMajor: [rows, K] local expert ids, -1 elsewhere (and in unused rows)
  float* topk_weights;         // kRankMajor: [rows, K]
  int32_t* expert_num_tokens;  // [E_local]: rows received per local expert (kRankMajor: (row, k) pairs)
  int32_t* num_rows;           // [1]: rows received in all (kExpertMajor: sum over experts)
  void* combine_input;         // bfloat16, rows as x: where the experts' outputs go
  int local_experts;
  size_t rows;       // kExpertMajor: per local expert; kRankMajor: in all
  size_t row_bytes;  // payload bytes of one row
};

class EpContext {
 public:
  // Collective over the communicator's ranks (one node). The heap buffers come from the
  // communicator's heap (CommConfig::heap_reserve_bytes must leave room: ep_memory says how much).
  static std::unique_ptr<EpContext> create(Communicator& comm, const EpConfig& config);
  // Local: its heap buffers stay with the communicator until close() or the communicator's close.
  ~EpContext();
  EpContext(const EpContext&) = delete;
  EpContext& operator=(const EpContext&) = delete;

  const EpConfig& config() const;
  EpMemory memory() const;
  EpReceived received() const;

  // Asynchronous on `stream`, capturable. Arguments that fail a check on this rank (null, misaligned
  // or host pointers, out or weights shorter than the last dispatch's tokens) refuse the call: every
  // rank raises kInvalidArgument naming this rank and the cause, and the communicator is unusable
  // after (Communicator::refuse_call; nothing of the call moves).
  void dispatch(const EpDispatchArgs& args, cudaStream_t stream);
  void combine(const EpCombineArgs& args, cudaStream_t stream);
  // The blocks (SMs) dispatch and combine take: max_blocks, or the library's choice, within the GPU's SMs.
  int blocks() const;
  // The kernels these calls launch, for logs: "moe_dispatch(expert_major, bfloat16, ..., blocks=64);
  // moe_combine(expert_major, ..., blocks=64, reduced)".
  std::string describe() const;

  // Collective: releases the heap buffers (after the device is idle) unless a CUDA graph that
  // captured a call of the communicator still exists, or some rank passes `memory_lent` (it still
  // holds objects over the context's memory, e.g. the tensors a binding made of received()), in
  // which case every rank keeps them, mapped and unused, until the communicator closes. The
  // context is unusable afterwards (its calls raise kInvalidArgument); its local scratch
  // (expert_num_tokens, num_rows) lives until the context is destroyed.
  void close(bool memory_lent = false);

  struct State;

 private:
  explicit EpContext(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace symmem
