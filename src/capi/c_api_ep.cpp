// The C ABI of MoE dispatch / combine (include/symmem/symmem_c.h, symmem/ep.hpp): thin guards
// around EpContext.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "capi/c_api_comm.hpp"
#include "capi/c_api_guard.hpp"
#include "symmem/ep.hpp"
#include "symmem/symmem_c.h"

struct symmem_ep {
  std::unique_ptr<symmem::EpContext> context;
};

namespace {

using symmem::Error;
using symmem::ErrorCode;

symmem::EpConfig config_of(int num_experts, int topk, int hidden, int max_tokens_per_rank, int payload, int layout,
                           int max_tokens_per_expert, int max_received_rows, int max_blocks) {
  if (payload < 0 || payload > static_cast<int>(symmem::EpPayload::kFloat8E4M3))
    throw Error(ErrorCode::kInvalidArgument, "payload " + std::to_string(payload) + " is not a symmem::EpPayload");
  if (layout < 0 || layout > static_cast<int>(symmem::EpLayout::kRankMajor))
    throw Error(ErrorCode::kInvalidArgument, "layout " + std::to_string(layout) + " is not a symmem::EpLayout");
  symmem::EpConfig c;
  c.num_experts = num_experts;
  c.topk = topk;
  c.hidden = hidden;
  c.max_tokens_per_rank = max_tokens_per_rank;
  c.payload = static_cast<symmem::EpPayload>(payload);
  c.layout = static_cast<symmem::EpLayout>(layout);
  c.max_tokens_per_expert = max_tokens_per_expert;
  c.max_received_rows = max_received_rows;
  c.max_blocks = max_blocks;
  return c;
}

symmem::EpContext& context_of(symmem_ep* ep) {
  if (!ep || !ep->context) throw Error(ErrorCode::kInvalidArgument, "no EP context (NULL or destroyed)");
  return *ep->context;
}

}  // namespace

using symmem::detail::c_api_guard;

extern "C" {

int symmem_ep_memory(int num_experts, int topk, int hidden, int max_tokens_per_rank, int payload, int layout,
                     int max_tokens_per_expert, int max_received_rows, int max_blocks, int world, size_t* heap_bytes,
                     size_t* local_bytes) {
  return c_api_guard([&] {
    if (!heap_bytes || !local_bytes) throw Error(ErrorCode::kInvalidArgument, "symmem_ep_memory: NULL result");
    const symmem::EpMemory m =
        symmem::ep_memory(config_of(num_experts, topk, hidden, max_tokens_per_rank, payload, layout,
                                    max_tokens_per_expert, max_received_rows, max_blocks),
                          world);
    *heap_bytes = m.heap_bytes;
    *local_bytes = m.local_bytes;
  });
}

int symmem_ep_blocks_for(symmem_comm* comm, int num_experts, int topk, int hidden, int max_tokens_per_rank,
                         int payload, int layout, int max_tokens_per_expert, int max_received_rows, int max_blocks,
                         int* blocks) {
  return c_api_guard([&] {
    if (!blocks) throw Error(ErrorCode::kInvalidArgument, "symmem_ep_blocks_for: NULL result");
    if (!comm || !comm->comm) throw Error(ErrorCode::kInvalidArgument, "no communicator (NULL or destroyed)");
    *blocks = symmem::ep_blocks(*comm->comm, config_of(num_experts, topk, hidden, max_tokens_per_rank, payload, layout,
                                                       max_tokens_per_expert, max_received_rows, max_blocks));
  });
}

int symmem_ep_create(symmem_comm* comm, int num_experts, int topk, int hidden, int max_tokens_per_rank, int payload,
                     int layout, int max_tokens_per_expert, int max_received_rows, int max_blocks, symmem_ep** out) {
  return c_api_guard([&] {
    if (!out) throw Error(ErrorCode::kInvalidArgument, "symmem_ep_create: NULL result");
    if (!comm || !comm->comm) throw Error(ErrorCode::kInvalidArgument, "no communicator (NULL or destroyed)");
    auto handle = std::make_unique<symmem_ep>();
    handle->context =
        symmem::EpContext::create(*comm->comm, config_of(num_experts, topk, hidden, max_tokens_per_rank, payload,
                                                         layout, max_tokens_per_expert, max_received_rows, max_blocks));
    *out = handle.release();
  });
}

void symmem_ep_destroy(symmem_ep* ep) { delete ep; }

int symmem_ep_close(symmem_ep* ep) {
  return c_api_guard([&] { context_of(ep).close(); });
}

int symmem_ep_close_lent(symmem_ep* ep, int memory_lent) {
  return c_api_guard([&] { context_of(ep).close(memory_lent != 0); });
}

int symmem_ep_received(symmem_ep* ep, void** x, void** x_scales, void** topk_idx, void** topk_weights,
                       void** expert_num_tokens, void** num_rows, void** combine_input, size_t* rows) {
  return c_api_guard([&] {
    const symmem::EpReceived r = context_of(ep).received();
    if (x) *x = r.x;
    if (x_scales) *x_scales = r.x_scales;
    if (topk_idx) *topk_idx = r.topk_idx;
    if (topk_weights) *topk_weights = r.topk_weights;
    if (expert_num_tokens) *expert_num_tokens = r.expert_num_tokens;
    if (num_rows) *num_rows = r.num_rows;
    if (combine_input) *combine_input = r.combine_input;
    if (rows) *rows = r.rows;
  });
}

int symmem_ep_dispatch(symmem_ep* ep, const void* x, const void* x_scales, const void* topk_idx, int topk_idx_int64,
                       const void* topk_weights, int num_tokens, const void* num_tokens_device, void* stream) {
  return c_api_guard([&] {
    symmem::EpDispatchArgs a;
    a.x = x;
    a.x_scales = static_cast<const float*>(x_scales);
    a.topk_idx = topk_idx;
    a.topk_idx_int64 = topk_idx_int64 != 0;
    a.topk_weights = static_cast<const float*>(topk_weights);
    a.num_tokens = num_tokens;
    a.num_tokens_device = static_cast<const int32_t*>(num_tokens_device);
    context_of(ep).dispatch(a, static_cast<cudaStream_t>(stream));
  });
}

int symmem_ep_combine(symmem_ep* ep, const void* expert_out, void* out, int weights_applied, const void* topk_weights,
                      void* stream) {
  return c_api_guard([&] {
    symmem::EpCombineArgs a;
    a.expert_out = expert_out;
    a.out = out;
    a.weights_applied = weights_applied != 0;
    a.topk_weights = static_cast<const float*>(topk_weights);
    context_of(ep).combine(a, static_cast<cudaStream_t>(stream));
  });
}

int symmem_ep_blocks(symmem_ep* ep, int* blocks) {
  return c_api_guard([&] {
    if (!blocks) throw Error(ErrorCode::kInvalidArgument, "symmem_ep_blocks: NULL result");
    *blocks = context_of(ep).blocks();
  });
}

int symmem_ep_describe(symmem_ep* ep, char* text, size_t text_bytes) {
  return c_api_guard([&] {
    const std::string d = context_of(ep).describe();
    if (text && text_bytes) {
      const size_t n = std::min(d.size(), text_bytes - 1);
      std::memcpy(text, d.data(), n);
      text[n] = '\0';
    }
  });
}

}  // extern "C"
