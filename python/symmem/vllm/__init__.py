"""symmem's MoE dispatch / combine in vLLM (docs/vllm_moe.md).

    SYMMEM_VLLM_EP=expert_major vllm serve ...   # or rank_major; with the package installed

vLLM (0.22) has no registry of all2all backends (a Literal and if/elif chains), so `install()`, a
`vllm.general_plugins` entry point, wraps vLLM's maybe_make_prepare_finalize: when SYMMEM_VLLM_EP is
set, an MoE layer with expert parallelism inside one node gets a SymmemPrepareAndFinalize over an
ExpertParallel context of the EP group; otherwise vLLM's own choice stands. Nothing is patched
unless SYMMEM_VLLM_EP is set.
"""
import functools
import importlib
import logging
import os

from .all2all import SymmemAll2AllManager
from .prepare_finalize import SymmemPrepareAndFinalize

__all__ = ["SymmemAll2AllManager", "SymmemPrepareAndFinalize", "install", "context_kwargs"]

_log = logging.getLogger("symmem")
# Where vLLM builds a layer's prepare/finalize: 0.22's all2all_utils, later versions' factory.
_FACTORIES = ("vllm.model_executor.layers.fused_moe.all2all_utils",
              "vllm.model_executor.layers.fused_moe.prepare_finalize.factory")
_manager = None


def context_kwargs(moe, quant_config, layout):
    """ExpertParallel arguments for an MoE layer's config (FusedMoEConfig): experts, top-k, hidden
    size, the largest batch per rank, fp8 when the layer quantizes activations in blocks of 128."""
    block = getattr(quant_config, "block_shape", None) if quant_config is not None else None
    quant = str(getattr(quant_config, "quant_dtype", None) if quant_config is not None else None)
    fp8 = "float8" in quant and block is not None and list(block)[-1] == 128
    return {"num_experts": int(moe.num_experts), "topk": int(moe.experts_per_token), "hidden": int(moe.hidden_dim),
            "max_tokens_per_rank": int(moe.max_num_tokens), "payload": "float8_e4m3" if fp8 else "bfloat16",
            "layout": layout, "max_blocks": int(os.environ.get("SYMMEM_VLLM_EP_MAX_BLOCKS", "-1"))}


def _make(moe, quant_config, layout):
    global _manager
    if _manager is None:
        _manager = SymmemAll2AllManager()
    return SymmemPrepareAndFinalize(_manager.get_handle(context_kwargs(moe, quant_config, layout)))


def install():
    """The vllm.general_plugins entry point: wraps vLLM's prepare/finalize factory when
    SYMMEM_VLLM_EP is expert_major or rank_major; returns the names it wrapped."""
    layout = os.environ.get("SYMMEM_VLLM_EP", "")
    if layout not in ("expert_major", "rank_major"):
        return []
    wrapped = []
    for name in _FACTORIES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        original = getattr(module, "maybe_make_prepare_finalize", None)
        if original is None or getattr(original, "_symmem", False):
            continue

        @functools.wraps(original)
        def factory(moe, quant_config, *args, _original=original, **kwargs):
            ep = getattr(moe, "moe_parallel_config", None)
            inside_one_node = getattr(ep, "use_ep", True) and not getattr(ep, "use_all2all_kernels_internode", False)
            if not inside_one_node:
                return _original(moe, quant_config, *args, **kwargs)
            return _make(moe, quant_config, layout)

        factory._symmem = True
        module.maybe_make_prepare_finalize = factory
        wrapped.append(name)
    if not wrapped:
        _log.warning("symmem: SYMMEM_VLLM_EP is set but no vLLM prepare/finalize factory was found (%s)",
                     ", ".join(_FACTORIES))
    return wrapped
