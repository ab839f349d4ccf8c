// EpContext: creation (agreed config, buffers fixed for the context's lifetime), dispatch and
// combine (validate -> sign -> launch; kernels/moe_args.hpp describes the kernels), close.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "board/call_signature.hpp"
#include "collectives/validate.hpp"
#include "comm/communicator_state.hpp"
#include "comm/refusal.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/hash.hpp"
#include "kernels/moe_args.hpp"
#include "plan/block_rules.hpp"
#include "plan/ep_geometry.hpp"
#include "plan/moe_combine_path.hpp"
#include "symmem/ep.hpp"

namespace symmem {

// The reduced combine's rule knows how many route lines a sender's slot holds.
static_assert(detail::kEpLinesSlotWords == detail::Workspaces::kLowLatencySlotBytes / 4);

const char* ep_layout_name(EpLayout layout) {
  return layout == EpLayout::kExpertMajor ? "expert_major" : layout == EpLayout::kRankMajor ? "rank_major" : "?";
}

const char* ep_payload_name(EpPayload payload) {
  return payload == EpPayload::kBFloat16 ? "bfloat16" : payload == EpPayload::kFloat8E4M3 ? "float8_e4m3" : "?";
}

EpMemory ep_memory(const EpConfig& config, int world) {
  return detail::ep_memory_of(detail::ep_geometry(config, world));
}

namespace {

// The combine SYMMEM_MOE_COMBINE forces, as the communicators agreed on it (kAuto: none).
detail::MoeCombinePath forced_combine(const detail::CommunicatorState& st) {
  return detail::MoeCombinePath(st.settings.moe_combine_path);
}
// A context's geometry on a communicator: the same on every rank (the same config, the agreed
// SYMMEM_MOE_COMBINE), and the blocks its kernels take there (the agreed sm_count bounds them).
detail::EpGeometry geometry_on(const detail::CommunicatorState& st, const EpConfig& config) {
  return detail::ep_geometry(config, st.world, forced_combine(st));
}
int blocks_on(const detail::CommunicatorState& st, const detail::EpGeometry& g) {
  return detail::clamp_blocks(g.max_blocks, st.sm_count, g.max_blocks);
}

}  // namespace

int ep_blocks(Communicator& comm, const EpConfig& config) {
  const detail::CommunicatorState& st = detail::state_of(comm);
  return blocks_on(st, geometry_on(st, config));
}

struct EpContext::State {
  Communicator* comm = nullptr;
  detail::CommunicatorState* st = nullptr;
  EpConfig config;
  detail::EpGeometry g;
  Buffer* dispatch = nullptr;
  Buffer* combine = nullptr;
  void* scratch_memory = nullptr;
  detail::EpScratch scratch{};
  int blocks = 1;
  uint64_t shape_hash = 0;  // the geometry every rank agreed on (the signatures cover it)
  std::string dispatch_text, combine_text;
  detail::MoeCombinePath combine_path = detail::MoeCombinePath::kRegisters;  // plan/moe_combine_path.hpp
  // Rows of the last dispatch's tokens that combine writes (and reads weights for): its host
  // count (capped at T), or T with a count on the device. 0 before the first dispatch.
  size_t dispatched_rows = 0;
  bool closed = false;

  ~State() {
    if (scratch_memory) SYMMEM_CUDA_CHECK_NOTHROW(cudaFree(scratch_memory));
  }
  detail::EpBuffers buffers() const {
    detail::EpBuffers b{};
    b.dispatch = static_cast<char*>(dispatch->ptr());
    b.combine = static_cast<char*>(combine->ptr());
    for (int r = 0; r < st->world; ++r) {
      b.dispatch_peers[r] = static_cast<char*>(dispatch->peer_ptr(r));
      b.combine_peers[r] = static_cast<char*>(combine->peer_ptr(r));
    }
    return b;
  }
  void require_open(const char* op) const {
    if (closed) throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": the EpContext was closed");
  }
};

namespace {

// Every field of the config equal on every rank, or an error naming the first that differs.
void agree_on_config(const EpConfig& mine, detail::CommunicatorState& st) {
  std::vector<EpConfig> all(st.world);
  st.bootstrap->all_gather(&mine, all.data(), sizeof(EpConfig));
  for (int r = 0; r < st.world; ++r) {
    const EpConfig& o = all[r];
    auto differ = [&](const char* field, long theirs, long ours) {
      throw Error(ErrorCode::kInvalidArgument, std::string("EpContext::create: ") + field +
                                                   " differs across ranks: rank " + std::to_string(st.job_rank(r)) +
                                                   " has " + std::to_string(theirs) + ", rank " +
                                                   std::to_string(st.layout.rank) + " has " + std::to_string(ours));
    };
    if (o.num_experts != mine.num_experts) differ("num_experts", o.num_experts, mine.num_experts);
    if (o.topk != mine.topk) differ("topk", o.topk, mine.topk);
    if (o.hidden != mine.hidden) differ("hidden", o.hidden, mine.hidden);
    if (o.max_tokens_per_rank != mine.max_tokens_per_rank)
      differ("max_tokens_per_rank", o.max_tokens_per_rank, mine.max_tokens_per_rank);
    if (o.payload != mine.payload) differ("payload", long(o.payload), long(mine.payload));
    if (o.layout != mine.layout) differ("layout", long(o.layout), long(mine.layout));
    if (o.max_tokens_per_expert != mine.max_tokens_per_expert)
      differ("max_tokens_per_expert", o.max_tokens_per_expert, mine.max_tokens_per_expert);
    if (o.max_received_rows != mine.max_received_rows)
      differ("max_received_rows", o.max_received_rows, mine.max_received_rows);
    if (o.max_blocks != mine.max_blocks) differ("max_blocks", o.max_blocks, mine.max_blocks);
  }
}

uint64_t shape_hash_of(const detail::EpGeometry& g) {
  detail::Fnv1a h;
  h.value(g.world).value(g.experts).value(g.topk).value(g.hidden).value(g.max_tokens).value(g.expert_major);
  h.value(g.fp8).value(g.rows_per_expert).value(g.rows).value(g.combine_reduced);
  return h.digest() | 1u;
}

// The descriptor of a dispatch or combine (board/call_signature.hpp): the op, the blocks and the
// context's geometry; its description is the context's.
detail::CallDescriptor descriptor_of(uint32_t op, int blocks, uint64_t shape_hash, const std::string& text) {
  detail::CallDescriptor c;
  c.op = op;
  c.type = DataType::kUInt8;
  c.blocks = blocks;
  c.shape_hash = shape_hash;
  c.description = [&text] { return text; };
  return c;
}

// `reduced`: the call is a combine reduced on the experts' side (said after blocks=, which a
// truncated description must keep).
std::string describe_call(const char* op, const EpConfig& c, const detail::EpGeometry& g, int blocks,
                          bool reduced = false) {
  std::string s = std::string(op) + "(" + ep_layout_name(c.layout) + ", " + ep_payload_name(c.payload) +
                  ", experts=" + std::to_string(g.experts) + ", topk=" + std::to_string(g.topk) +
                  ", hidden=" + std::to_string(g.hidden) + ", max_tokens=" + std::to_string(g.max_tokens);
  s += g.expert_major ? ", rows_per_expert=" + std::to_string(g.rows_per_expert) : ", rows=" + std::to_string(g.rows);
  s += ", blocks=" + std::to_string(blocks);
  if (reduced) s += ", reduced";
  return s + ")";
}

void require_aligned(const void* p, size_t alignment, const char* what, const char* op) {
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": " + what + " must be " + std::to_string(alignment) + "-byte aligned");
}

}  // namespace

EpContext::EpContext(std::unique_ptr<State> state) : state_(std::move(state)) {}
EpContext::~EpContext() = default;

std::unique_ptr<EpContext> EpContext::create(Communicator& comm, const EpConfig& config) {
  detail::CommunicatorState& st = detail::state_of(comm);
  st.ensure_usable("EpContext::create");
  st.require_one_node("EpContext::create");
  detail::DeviceGuard guard(st.device);
  agree_on_config(config, st);  // first: a config that differs must fail on every rank alike
  auto state = std::make_unique<State>();
  State& s = *state;
  s.comm = &comm;
  s.st = &st;
  s.config = config;
  s.g = geometry_on(st, config);
  s.blocks = blocks_on(st, s.g);
  s.dispatch = comm.allocate(std::max<size_t>(s.g.dispatch_bytes, 256));
  s.combine = comm.allocate(std::max<size_t>(s.g.combine_heap_bytes, 256));
  const detail::EpScratchOffsets o = detail::ep_scratch_offsets(s.g);
  SYMMEM_CUDA_CHECK(cudaMalloc(&s.scratch_memory, o.total));
  SYMMEM_CUDA_CHECK(cudaMemset(s.scratch_memory, 0, o.total));
  // cudaMemset runs on the legacy stream, which orders nothing with the callers' non-blocking
  // streams: the first dispatch must not overtake it.
  SYMMEM_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  char* base = static_cast<char*>(s.scratch_memory);
  s.scratch.tile_base = reinterpret_cast<int32_t*>(base + o.tile_base);
  s.scratch.warp_base = reinterpret_cast<int32_t*>(base + o.warp_base);
  s.scratch.send_base = reinterpret_cast<int32_t*>(base + o.send_base);
  s.scratch.route_rank = reinterpret_cast<int32_t*>(base + o.route_rank);
  s.scratch.route_row = reinterpret_cast<int32_t*>(base + o.route_row);
  s.scratch.weights = reinterpret_cast<float*>(base + o.weights);
  s.scratch.expert_num_tokens = reinterpret_cast<int32_t*>(base + o.expert_num_tokens);
  s.scratch.num_rows = reinterpret_cast<int32_t*>(base + o.num_rows);
  s.scratch.num_tokens = reinterpret_cast<int32_t*>(base + o.num_tokens);
  s.scratch.go = reinterpret_cast<uint32_t*>(base + o.go);
  s.scratch.counts = reinterpret_cast<uint32_t*>(base + o.counts);
  s.shape_hash = shape_hash_of(s.g);
  s.dispatch_text = describe_call("moe_dispatch", config, s.g, s.blocks);
  s.combine_text = describe_call("moe_combine", config, s.g, s.blocks, s.g.combine_reduced);
  s.combine_path = s.g.combine_reduced ? detail::MoeCombinePath::kReduced
                   : detail::moe_combine_uses_bulk(s.g, s.g.expert_major ? s.g.topk : st.world, forced_combine(st))
                       ? detail::MoeCombinePath::kBulk
                       : detail::MoeCombinePath::kRegisters;
  return std::unique_ptr<EpContext>(new EpContext(std::move(state)));
}

const EpConfig& EpContext::config() const { return state_->config; }

EpMemory EpContext::memory() const { return detail::ep_memory_of(state_->g); }

EpReceived EpContext::received() const {
  const State& s = *state_;
  s.require_open("EpContext::received");
  char* d = static_cast<char*>(s.dispatch->ptr());
  EpReceived r{};
  r.x = d + s.g.x_offset;
  r.x_scales = s.g.fp8 ? reinterpret_cast<float*>(d + s.g.scales_offset) : nullptr;
  r.topk_idx = s.g.expert_major ? nullptr : reinterpret_cast<int32_t*>(d + s.g.topk_idx_offset);
  r.topk_weights = s.g.expert_major ? nullptr : reinterpret_cast<float*>(d + s.g.topk_weights_offset);
  r.expert_num_tokens = s.scratch.expert_num_tokens;
  r.num_rows = s.scratch.num_rows;
  r.combine_input = s.combine->ptr();
  r.local_experts = s.g.local_experts;
  r.rows = static_cast<size_t>(s.g.expert_major ? s.g.rows_per_expert : s.g.rows);
  r.row_bytes = s.g.payload_bytes;
  return r;
}

int EpContext::blocks() const { return state_->blocks; }

std::string EpContext::describe() const { return state_->dispatch_text + "; " + state_->combine_text; }

namespace {

// Every argument check of a dispatch (nothing is enqueued): returns the rows of its tensors the
// kernels may read, up to T with a device count, else the host count (capped at T: a larger count
// fails on every rank as kCapacity, and the kernels read T rows at most). A rank with no tokens
// (host count 0) may pass null tensors.
size_t checked_dispatch_rows(const EpContext::State& s, const EpDispatchArgs& args) {
  const char* op = "moe_dispatch";
  if (!args.num_tokens_device && args.num_tokens < 0)
    throw Error(ErrorCode::kInvalidArgument,
                "moe_dispatch: num_tokens is negative (" + std::to_string(args.num_tokens) + ")");
  const size_t rows = args.num_tokens_device ? size_t(s.g.max_tokens)
                                             : std::min<size_t>(size_t(args.num_tokens), size_t(s.g.max_tokens));
  if (rows > 0 && (!args.x || !args.topk_idx || !args.topk_weights))
    throw Error(ErrorCode::kInvalidArgument, "moe_dispatch: x, topk_idx and topk_weights are required for " +
                                                 std::to_string(rows) + " tokens" +
                                                 (args.num_tokens_device ? " (T rows with a count on the device)" : "") +
                                                 " (null only with num_tokens 0)");
  if (s.g.fp8 && rows > 0 && !args.x_scales)
    throw Error(ErrorCode::kInvalidArgument,
                "moe_dispatch: a float8 payload needs x_scales (float32, hidden / 128 per row)");
  const size_t k = size_t(s.g.topk);
  const size_t id_bytes = args.topk_idx_int64 ? 8 : 4;
  require_aligned(args.x, 16, "x", op);
  require_aligned(args.topk_idx, id_bytes, "topk_idx", op);
  require_aligned(args.topk_weights, 4, "topk_weights", op);
  require_aligned(args.num_tokens_device, 4, "num_tokens_device", op);
  detail::require_device_pointer(args.x, rows * s.g.payload_bytes, "x", op, *s.comm);
  detail::require_device_pointer(args.topk_idx, rows * k * id_bytes, "topk_idx", op, *s.comm);
  detail::require_device_pointer(args.topk_weights, rows * k * 4, "topk_weights", op, *s.comm);
  if (s.g.fp8) {
    require_aligned(args.x_scales, 4, "x_scales", op);
    detail::require_device_pointer(args.x_scales, rows * s.g.scale_bytes, "x_scales", op, *s.comm);
  }
  if (args.num_tokens_device)
    detail::require_device_pointer(args.num_tokens_device, 4, "num_tokens_device", op, *s.comm);
  return rows;
}

// Every argument check of a combine, against the last dispatch (State::dispatched_rows): out holds
// its rows ([rows, H] bfloat16; null when it had no token), weights given hold [rows, K].
void check_combine(const EpContext::State& s, const EpCombineArgs& args) {
  const char* op = "moe_combine";
  const size_t rows = s.dispatched_rows;
  if (rows > 0 && !args.out)
    throw Error(ErrorCode::kInvalidArgument, "moe_combine: out is required: the last dispatch had " +
                                                 std::to_string(rows) + " tokens (null only after one of 0)");
  require_aligned(args.out, 16, "out", op);
  detail::require_device_pointer(args.out, rows * size_t(s.g.hidden) * 2, "out", op, *s.comm);
  if (args.expert_out) {
    require_aligned(args.expert_out, 16, "expert_out", op);
    detail::require_device_pointer(args.expert_out, s.g.combine_bytes, "expert_out", op, *s.comm);
  }
  if (args.topk_weights) {
    require_aligned(args.topk_weights, 4, "topk_weights", op);
    detail::require_device_pointer(args.topk_weights, rows * size_t(s.g.topk) * 4, "topk_weights", op, *s.comm);
  }
}

}  // namespace

void EpContext::dispatch(const EpDispatchArgs& args, cudaStream_t stream) {
  State& s = *state_;
  const char* op = "moe_dispatch";
  s.require_open(op);
  detail::CommunicatorState& st = *s.st;
  st.ensure_usable(op);
  detail::DeviceGuard guard(st.device);
  const size_t rows = detail::checked_or_refused(st, detail::kOpMoeDispatch, op, stream,
                                                 [&] { return checked_dispatch_rows(s, args); });

  detail::EnqueueScope enqueue(st, stream);
  const uint32_t signature =
      st.sign_call(descriptor_of(detail::kOpMoeDispatch, s.blocks, s.shape_hash, s.dispatch_text));
  if (st.debug) std::fprintf(stderr, "symmem rank %d: %s\n", st.layout.rank, s.dispatch_text.c_str());
  detail::MoeDispatchArgs a{};
  a.g = s.g;
  a.x = args.x;
  a.x_scales = args.x_scales;
  a.topk_idx = args.topk_idx;
  a.topk_idx_int64 = args.topk_idx_int64;
  a.topk_weights = args.topk_weights;
  a.num_tokens = args.num_tokens;
  a.num_tokens_device = args.num_tokens_device;
  a.scratch = s.scratch;
  a.buffers = s.buffers();
  a.lines = st.workspaces->low_latency_lines();
  a.sync = st.sync_args(detail::kOpMoeDispatch, signature);
  detail::launch_moe_dispatch_count(a, stream);
  detail::launch_moe_dispatch_push(a, s.blocks, stream);
  s.dispatched_rows = rows;
}

void EpContext::combine(const EpCombineArgs& args, cudaStream_t stream) {
  State& s = *state_;
  const char* op = "moe_combine";
  s.require_open(op);
  detail::CommunicatorState& st = *s.st;
  st.ensure_usable(op);
  detail::DeviceGuard guard(st.device);
  detail::checked_or_refused(st, detail::kOpMoeCombine, op, stream, [&] { check_combine(s, args); });

  detail::EnqueueScope enqueue(st, stream);
  const uint32_t signature = st.sign_call(descriptor_of(detail::kOpMoeCombine, s.blocks, s.shape_hash, s.combine_text));
  if (st.debug) std::fprintf(stderr, "symmem rank %d: %s\n", st.layout.rank, s.combine_text.c_str());
  const detail::EpBuffers buffers = s.buffers();
  if (args.expert_out) {
    detail::MoeStageArgs stage{};
    stage.g = s.g;
    stage.scratch = s.scratch;
    stage.expert_out = args.expert_out;
    stage.combine = buffers.combine;
    detail::launch_moe_combine_stage(stage, s.blocks, stream);
  }
  detail::MoeCombineArgs a{};
  a.g = s.g;
  a.scratch = s.scratch;
  a.buffers = buffers;
  a.out = args.out;
  a.weights = args.topk_weights;
  a.weights_applied = args.weights_applied;
  a.lines = st.workspaces->low_latency_lines();
  a.sync = st.sync_args(detail::kOpMoeCombine, signature);
  if (s.combine_path == detail::MoeCombinePath::kReduced)
    detail::launch_moe_combine_reduced(a, s.blocks, stream);
  else
    detail::launch_moe_combine(a, s.blocks, s.combine_path == detail::MoeCombinePath::kBulk, stream);
}

void EpContext::close(bool memory_lent) {
  State& s = *state_;
  if (s.closed) return;
  detail::CommunicatorState& st = *s.st;
  detail::DeviceGuard guard(st.device);
  // Free only when no rank has a graph that may still replay a call on these buffers, nor objects
  // over them; the ranks must agree (freeing is collective).
  const int32_t mine = !memory_lent && s.comm->live_graphs() == 0 && !s.comm->aborted() ? 1 : 0;
  std::vector<int32_t> all(st.world);
  st.bootstrap->all_gather(&mine, all.data(), sizeof(mine));
  const bool free_now = std::all_of(all.begin(), all.end(), [](int32_t v) { return v == 1; });
  s.closed = true;
  if (free_now) {
    s.comm->free(s.dispatch);
    s.comm->free(s.combine);
  }
  s.dispatch = s.combine = nullptr;
}

}  // namespace symmem
