"""vLLM's modular-kernel prepare / finalize on symmem's MoE dispatch and combine.

SymmemPrepareAndFinalize(ep) wraps a symmem.torch.moe.ExpertParallel:
  expert_major -> activation format BatchedExperts ([E_local, rows, H], as DeepEP low latency): the
                  experts' unweighted outputs go straight to combine, which applies the weights
                  (vLLM's TopKWeightAndReduceDelegate) and sums in top-k order;
  rank_major   -> Standard ([rows, H], as DeepEP high throughput): ids come back as global expert
                  ids with non-local entries pointing at an expert of another rank (vLLM's
                  expert_map turns them into -1) and weight 0; finalize reduces each row over its
                  local experts (TopKWeightAndReduceContiguous) and combine sums the ranks' rows.
Both return tensors of a fixed, capacity-sized shape and device counts (expert_num_tokens_cpu is
None): no host synchronisation, CUDA-graph capturable at vLLM's padded batch sizes. One batch at a
time: supports_async() is False, so vLLM runs no dual-batch overlap over it (supports_async says
why). fp8: the context's payload decides (DeepSeek's block-128 quantization before dispatch, scales
moved with the rows); otherwise bf16 rows move and the experts quantize as they would without EP.
"""
import torch

from ..torch.moe import quantize_fp8
from ._vllm import (ActivationFormat, ExpertTokensMetadata, PrepareAndFinalizeBase, TopKWeightAndReduceContiguous,
                    TopKWeightAndReduceDelegate)


class SymmemPrepareAndFinalize(PrepareAndFinalizeBase):
    def __init__(self, ep):
        try:
            super().__init__()
        except TypeError:  # versions whose base takes (moe_config, quant_config)
            self.moe_config = self.quant_config = None
        self.ep = ep
        self.rank_expert_offset = ep.rank * ep.local_experts

    @property
    def activation_format(self):
        return ActivationFormat.BatchedExperts if self.ep.expert_major else ActivationFormat.Standard

    def topk_indices_dtype(self):
        return torch.int64

    def max_num_tokens_per_rank(self):
        return self.ep.max_tokens_per_rank

    def num_dispatchers(self):
        return self.ep.world

    def output_is_reduced(self):
        return True

    def supports_async(self):
        # False: no dual-batch overlap. vLLM's DBO keeps two micro-batches in flight (micro-batch
        # 1's prepare runs before micro-batch 0's receive and finalize), but a context has one
        # receive area and one routing of its last dispatch: micro-batch 0 would read micro-batch
        # 1's rows and combine with its routes. With False vLLM runs prepare / finalize in order
        # and refuses DBO (its modular kernel asserts `not dbo_enabled()`), a clear error instead
        # of wrong results. Overlap would need a context per micro-batch (docs/vllm.md).
        return False

    def _quantize(self, a1, quant_config, defer_input_quant):
        if self.ep.payload != "float8_e4m3":
            return a1.to(torch.bfloat16).contiguous(), None
        block = getattr(quant_config, "block_shape", None) if quant_config is not None else None
        if defer_input_quant or (block is not None and list(block)[-1] != 128):
            raise NotImplementedError("symmem's fp8 dispatch quantizes in blocks of 128 columns before dispatch; "
                                      f"this layer asks for block shape {block} (defer_input_quant="
                                      f"{defer_input_quant}): create the context with payload='bfloat16'")
        return quantize_fp8(a1)

    def prepare_async(self, a1, topk_weights, topk_ids, num_experts, expert_map, apply_router_weight_on_input,
                      quant_config, defer_input_quant=False):
        if apply_router_weight_on_input:
            if topk_ids.size(1) != 1:
                raise NotImplementedError("apply_router_weight_on_input needs topk 1 (as DeepEP's)")
            a1 = a1 * topk_weights.to(a1.dtype)
        x, scales = self._quantize(a1, quant_config, defer_input_quant)
        received = self.ep.dispatch(x, topk_ids.to(torch.int64).contiguous(),
                                    topk_weights.to(torch.float32).contiguous(), x_scales=scales)
        # The dispatch is ordered on this stream before anything the experts enqueue: the hook has
        # nothing to wait for.
        mine = self.ep.dispatches
        return (lambda: None), (lambda: self._receive(received, mine))

    def _receive(self, r, dispatch):
        if dispatch != self.ep.dispatches:
            # Another prepare ran before this one's receive (two micro-batches in flight): the receive
            # area now holds the other's rows. Every rank runs the same order, so every rank raises.
            raise RuntimeError("symmem MoE: a second dispatch before this micro-batch's receive; a context "
                               "holds one batch at a time (no dual-batch overlap: docs/vllm.md)")
        meta = ExpertTokensMetadata(expert_num_tokens=r.expert_num_tokens, expert_num_tokens_cpu=None)
        scales = r.x_scales if self.ep.payload == "float8_e4m3" else None
        if self.ep.expert_major:
            return r.x, scales, meta, None, None
        ids = r.topk_idx.long()
        elsewhere = self.ep.num_experts - 1 if self.rank_expert_offset == 0 else 0
        global_ids = torch.where(ids < 0, torch.full_like(ids, elsewhere), ids + self.rank_expert_offset)
        weights = torch.where(ids < 0, torch.zeros_like(r.topk_weights), r.topk_weights)
        return r.x, scales, meta, global_ids, weights

    def prepare(self, a1, topk_weights, topk_ids, num_experts, expert_map, apply_router_weight_on_input, quant_config,
                defer_input_quant=False):
        hook, receiver = self.prepare_async(a1, topk_weights, topk_ids, num_experts, expert_map,
                                            apply_router_weight_on_input, quant_config, defer_input_quant)
        hook()
        return receiver()

    def finalize(self, output, fused_expert_output, topk_weights, topk_ids, apply_router_weight_on_input,
                 weight_and_reduce_impl):
        ep = self.ep
        if ep.expert_major:
            # [E_local, rows, H], unweighted: combine weights (unless applied on the input) and sums.
            expert_out = fused_expert_output.to(torch.bfloat16).contiguous()
            ep.combine(expert_out=expert_out, out=output, weights_applied=apply_router_weight_on_input,
                       topk_weights=topk_weights.to(torch.float32).contiguous())
            return
        # Standard: (rows, topk, H) unweighted -> each row reduced over its local experts, weighted.
        reduced = self._reduce(fused_expert_output, topk_weights, topk_ids, apply_router_weight_on_input,
                               weight_and_reduce_impl)
        ep.combine(expert_out=reduced.to(torch.bfloat16).contiguous(), out=output)

    def _reduce(self, fused_expert_output, topk_weights, topk_ids, apply_router_weight_on_input, impl):
        if fused_expert_output.dim() == 2:  # the experts reduced already
            return fused_expert_output
        if impl is not None and (TopKWeightAndReduceDelegate is None or
                                 not isinstance(impl, TopKWeightAndReduceDelegate)):
            return impl.apply(None, fused_expert_output, topk_weights, topk_ids, apply_router_weight_on_input)
        if TopKWeightAndReduceContiguous is not None:
            return TopKWeightAndReduceContiguous().apply(None, fused_expert_output, topk_weights, topk_ids,
                                                         apply_router_weight_on_input)
        w = torch.ones_like(topk_weights) if apply_router_weight_on_input else topk_weights
        return (fused_expert_output.float() * w.unsqueeze(-1)).sum(dim=1)

    def finalize_async(self, output, fused_expert_output, topk_weights, topk_ids, apply_router_weight_on_input,
                       weight_and_reduce_impl):
        self.finalize(output, fused_expert_output, topk_weights, topk_ids, apply_router_weight_on_input,
                      weight_and_reduce_impl)
        return (lambda: None), (lambda: None)
