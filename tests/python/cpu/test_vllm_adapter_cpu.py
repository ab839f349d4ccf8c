"""symmem.vllm on CPU (the reference ExpertParallel of a gloo group, no vLLM needed): the modular
kernel's prepare / finalize contract for both activation formats, fp8 and bf16, the experts'
outputs combined as vLLM's would be; install() wrapping a vLLM-shaped factory only when asked."""
import sys
import types

import pytest

torch = pytest.importorskip("torch")


def _layer(E=8, K=2, H=256):
    g = torch.Generator().manual_seed(3)
    T = 6
    ids = torch.argsort(torch.rand(T, E, generator=g), dim=1)[:, :K].contiguous()
    ids[2, 1] = -1
    w = torch.rand(T, K, generator=g)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    return x, ids, w


@pytest.mark.parametrize("layout", ["expert_major", "rank_major"])
@pytest.mark.parametrize("payload", ["bfloat16", "float8_e4m3"])
def test_prepare_finalize_contract(group_name, layout, payload):
    from symmem.torch.moe import ExpertParallel, dequantize_fp8, quantize_fp8
    from symmem.vllm import SymmemPrepareAndFinalize
    from symmem.vllm._vllm import ActivationFormat
    E, K, H = 8, 2, 256
    ep = ExpertParallel(num_experts=E, topk=K, hidden=H, max_tokens_per_rank=8, layout=layout, payload=payload)
    pf = SymmemPrepareAndFinalize(ep)
    assert pf.activation_format == (ActivationFormat.BatchedExperts if layout == "expert_major"
                                    else ActivationFormat.Standard)
    assert pf.topk_indices_dtype() == torch.int64 and pf.num_dispatchers() == 1 and pf.output_is_reduced()
    assert pf.max_num_tokens_per_rank() == 8 and not pf.supports_async()  # no dual-batch overlap (below)
    quant = types.SimpleNamespace(block_shape=[128, 128], quant_dtype=torch.float8_e4m3fn)
    x, ids, w = _layer(E, K, H)
    hook, receiver = pf.prepare_async(x, w, ids, E, None, False, quant)
    hook()
    a1q, a1q_scale, meta, topk_ids, topk_weights = receiver()
    assert meta.expert_num_tokens_cpu is None  # no host synchronisation
    assert (a1q_scale is not None) == (payload == "float8_e4m3")
    deq = (lambda q, s: dequantize_fp8(q.reshape(-1, H), s.reshape(-1, H // 128)).reshape(q.shape)) \
        if payload == "float8_e4m3" else (lambda q, s: q.float())
    # Fake experts: expert e's output is its input x (1 + e), as vLLM's experts would produce it.
    if layout == "expert_major":
        assert topk_ids is None and a1q.shape == (E, 8, H)
        out = torch.zeros(a1q.shape, dtype=torch.bfloat16)
        for e in range(E):
            n = int(meta.expert_num_tokens[e])
            out[e, :n] = (deq(a1q[e, :n], a1q_scale[e, :n] if a1q_scale is not None else None) * (1 + e)).to(
                torch.bfloat16)
        fused = out
    else:
        rows = a1q.shape[0]
        assert topk_ids.shape == (rows, K) and topk_ids.dtype == torch.int64
        assert ((topk_ids >= 0) & (topk_ids < E)).all()  # global ids, valid everywhere
        xs = deq(a1q, a1q_scale)
        fused = torch.stack([(xs * (1 + topk_ids[:, k]).unsqueeze(1)).to(torch.bfloat16) for k in range(K)], dim=1)
    output = torch.empty(6, H, dtype=torch.bfloat16)
    pf.finalize(output, fused, w if layout == "expert_major" else topk_weights, ids if layout == "expert_major"
                else topk_ids, False, None)
    xf = x.float() if payload == "bfloat16" else dequantize_fp8(*quantize_fp8(x))
    factor = torch.where(ids >= 0, w * (1 + ids.clamp(min=0)).float(), torch.zeros_like(w)).sum(dim=1)
    assert torch.allclose(output.float(), xf * factor.unsqueeze(1), rtol=3e-2, atol=3e-2)
    ep.close()


def test_install_wraps_the_factory_only_when_asked(group_name, monkeypatch):
    import symmem.vllm as sv
    calls = []

    def original(moe, quant_config, routing_tables=None):
        calls.append("vllm")
        return "vllm's"

    module = types.ModuleType("vllm.model_executor.layers.fused_moe.all2all_utils")
    module.maybe_make_prepare_finalize = original
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.fused_moe"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.delenv("SYMMEM_VLLM_EP", raising=False)
    assert sv.install() == [] and module.maybe_make_prepare_finalize is original
    monkeypatch.setenv("SYMMEM_VLLM_EP", "expert_major")
    assert sv.install() == [module.__name__]
    assert sv.install() == []  # once
    moe = types.SimpleNamespace(num_experts=4, experts_per_token=2, hidden_dim=128, max_num_tokens=8,
                                moe_parallel_config=types.SimpleNamespace(use_ep=True,
                                                                          use_all2all_kernels_internode=False))
    import torch.distributed as dist
    manager = sv.SymmemAll2AllManager(device_group=dist.group.WORLD)
    monkeypatch.setattr(sv, "_manager", manager)
    pf = module.maybe_make_prepare_finalize(moe, None)
    assert isinstance(pf, sv.SymmemPrepareAndFinalize) and pf.ep.layout == "expert_major"
    assert module.maybe_make_prepare_finalize(moe, None).ep is pf.ep  # one context per configuration
    across = types.SimpleNamespace(**vars(moe))
    across.moe_parallel_config = types.SimpleNamespace(use_ep=True, use_all2all_kernels_internode=True)
    assert module.maybe_make_prepare_finalize(across, None) == "vllm's" and calls == ["vllm"]
    manager.destroy()


def test_no_dual_batch_overlap_one_receive_area_per_context(group_name):
    """A context has one receive area: a second micro-batch's dispatch overwrites the first's
    before the first is received and combined (vLLM's dual-batch overlap keeps two micro-batches
    in flight). So the adapter does not support async prepare / finalize, and vLLM refuses DBO
    with it (its modular kernel asserts `not dbo_enabled()` for such a prepare / finalize)."""
    from symmem.torch.moe import ExpertParallel
    from symmem.vllm import SymmemPrepareAndFinalize
    E, K, H, T = 4, 2, 128, 4
    ep = ExpertParallel(num_experts=E, topk=K, hidden=H, max_tokens_per_rank=8, layout="expert_major")
    pf = SymmemPrepareAndFinalize(ep)
    a, b = torch.randn(T, H).to(torch.bfloat16), torch.randn(T, H).to(torch.bfloat16)
    ida, idb = torch.tensor([[0, 1], [2, 3], [3, 1], [1, 0]]), torch.tensor([[3, 2], [0, 1], [1, 1], [2, 0]])
    w = torch.rand(T, K)
    # The order DBO would run: micro-batch 0's prepare, micro-batch 1's prepare, then 0's receive.
    # The area then holds 1's rows, not 0's: 0's receive refuses rather than hand them out.
    _, receive0 = pf.prepare_async(a, w, ida, E, None, False, None)
    pf.prepare_async(b, w, idb, E, None, False, None)
    assert ep._impl.outputs.expert_num_tokens.tolist() == [int((idb == e).sum()) for e in range(E)]
    with pytest.raises(RuntimeError, match="a second dispatch before this micro-batch's receive"):
        receive0()
    assert not pf.supports_async()
    # The synchronous path vLLM takes instead: prepare, experts, finalize, one batch at a time.
    x0, _, meta, _, _ = pf.prepare(a, w, ida, E, None, False, None)
    assert meta.expert_num_tokens.tolist() == [int((ida == e).sum()) for e in range(E)]
    out = torch.zeros(T, H, dtype=torch.bfloat16)
    pf.finalize(out, x0.clone(), w, ida, False, None)  # identity experts
    assert torch.allclose(out.float(), sum(w[:, k:k + 1] * a.float() for k in range(K)), atol=0.05)
    ep.close()


def test_set_num_sms_caps_the_blocks_of_contexts_made_afterwards(group_name, monkeypatch):
    import torch.distributed as dist

    import symmem.vllm as sv
    import symmem.vllm.all2all as manager_module
    # The library's choice for a context that leaves it (-1): what symmem.torch.moe.blocks_for says
    # on a GPU group (a CPU group runs no kernels and says None).
    monkeypatch.setattr(manager_module, "blocks_for", lambda group, **config: 32)
    manager = sv.SymmemAll2AllManager(device_group=dist.group.WORLD)
    kwargs = {"num_experts": 4, "topk": 2, "hidden": 128, "max_tokens_per_rank": 8, "layout": "expert_major",
              "max_blocks": 24}
    assert manager.get_handle(kwargs).max_blocks == 24
    manager.set_num_sms(8)  # as DeepEP's managers: it lowers the cap, it never raises it
    first = manager.get_handle(kwargs)
    assert first.max_blocks == 24  # a context's block cap is fixed when it is made
    capped = manager.get_handle(dict(kwargs, hidden=256))
    assert capped.max_blocks == 8 and manager.max_sms_used() == 24
    library_choice = {k: v for k, v in kwargs.items() if k != "max_blocks"}  # -1: the choice, lowered
    assert manager.get_handle(dict(library_choice, hidden=512)).max_blocks == 8
    manager.set_num_sms(64)
    assert manager.get_handle(dict(kwargs, hidden=384)).max_blocks == 24
    assert manager.get_handle(dict(library_choice, hidden=640)).max_blocks == 32  # never raised to n
    manager.destroy()
    assert manager.max_sms_used() == 0


def test_every_layer_defaults_to_the_libraries_block_budget(monkeypatch):
    """One SM budget by default everywhere a context is made (ep.hpp's EpConfig::max_blocks):
    symmem.ep, ExpertParallel, the bench and the vLLM plugin's SYMMEM_VLLM_EP_MAX_BLOCKS."""
    import inspect
    import pathlib
    import re
    import symmem.ep as ep
    from symmem.bench import moe as bench
    from symmem.torch.moe import ExpertParallel
    import symmem.vllm as plugin
    header = (pathlib.Path(__file__).resolve().parents[3] / "include/symmem/ep.hpp").read_text()
    native = int(re.search(r"int max_blocks = (-?\d+);", header).group(1))
    defaults = {
        "symmem.ep.memory": inspect.signature(ep.memory).parameters["max_blocks"].default,
        "symmem.ep.EpContext": inspect.signature(ep.EpContext).parameters["max_blocks"].default,
        "ExpertParallel": inspect.signature(ExpertParallel).parameters["max_blocks"].default,
        "bench.Symmem": inspect.signature(bench.Symmem).parameters["blocks"].default,
    }
    monkeypatch.delenv("SYMMEM_VLLM_EP_MAX_BLOCKS", raising=False)
    assert all(v == native for v in defaults.values()), (native, defaults)
    moe = types.SimpleNamespace(num_experts=8, experts_per_token=2, hidden_dim=256, max_num_tokens=4)
    assert plugin.context_kwargs(moe, None, "rank_major")["max_blocks"] == native
