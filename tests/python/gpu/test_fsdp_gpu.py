"""FSDP2 with symmem's comms (symmem.torch.fsdp) against stock FSDP2 (NCCL): the same model, the
same initialisation, data and optimizer steps on every configuration. The all-gather moves bytes,
so with NCCL's reduce-scatter the losses and parameters must be bit-identical; with symmem's
reduce-scatter they must agree within bf16 rounding (stated below)."""
import pytest

torch = pytest.importorskip("torch", reason="needs torch")
import torch.distributed as dist  # noqa: E402

fsdp_api = pytest.importorskip("torch.distributed.fsdp", reason="needs FSDP2")
if not hasattr(fsdp_api.FSDPModule, "set_custom_all_gather"):
    pytest.skip("needs FSDPModule.set_custom_all_gather (torch >= 2.11)", allow_module_level=True)

STEPS = 4
# vocab 101: the embedding and the head shard unevenly over 2 ranks (FSDP pads dim 0).
DIMS = dict(vocab=101, dim=64, layers=3, heads=4, hidden=96)
# symmem's reduce-scatter sums in fp32 and rounds once, as NCCL does for 2 ranks; the tolerance
# covers one bf16 rounding step per optimizer step of difference (2^-8 relative, 4 steps).
RS_RTOL = 4 * 2.0 ** -8


@pytest.fixture(autouse=True)
def _two_ranks(group):
    if dist.get_world_size() < 2:
        pytest.skip("needs two ranks: with one, FSDP2 shards nothing and calls no collective")


def _train(group, *, symmem_ag=None, symmem_rs=False, prefetch="implicit", mixed=False, async_unshard=False,
           compiled=False, steps=STEPS, max_blocks=None):
    from torch.distributed.fsdp import fully_shard

    import symmem.torch.fsdp as sfsdp
    from symmem.bench.llama import Decoder, loss_of
    torch.manual_seed(0)
    model = Decoder(**DIMS).cuda().to(torch.bfloat16)
    if mixed:  # frozen fp32 norms beside bf16 weights: FSDP all-gathers mixed dtypes as bytes
        for m in model.modules():
            if isinstance(m, torch.nn.RMSNorm):
                m.float().requires_grad_(False)
    for layer in model.layers:
        fully_shard(layer)
        if compiled:
            layer.compile()  # per block, as torchtitan does; FSDP's hooks stay outside the graphs
    fully_shard(model)
    comms = []
    if symmem_ag or symmem_rs:
        assert sfsdp.enable(model, all_gather=symmem_ag, reduce_scatter=symmem_rs,
                            max_blocks=max_blocks) == len(model.layers) + 1
        comms = [model.layers[0]._get_fsdp_state()._fsdp_param_group._all_gather_comm]
    if prefetch == "explicit":
        layers = list(model.layers)
        for i, layer in enumerate(layers[:-1]):
            layer.set_modules_to_forward_prefetch([layers[i + 1]])
        for i, layer in enumerate(layers[1:], start=1):
            layer.set_modules_to_backward_prefetch([layers[i - 1]])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator(device="cuda").manual_seed(1234 + dist.get_rank())
    losses, buffers, grads = [], [], None
    for _ in range(steps):
        tokens = torch.randint(0, DIMS["vocab"], (2, 33), device="cuda", generator=g)
        if async_unshard:
            model.layers[0].unshard(async_op=True)
        loss = loss_of(model, tokens)
        loss.backward()
        if grads is None:  # the first step's sharded gradients: AdamW would hide a wrong scale
            grads = [p.grad.to_local().float().clone() for p in model.parameters() if p.grad is not None]
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().float())
        buffers.append(comms[0].buffers if comms and symmem_ag else 0)
    torch.cuda.synchronize()
    params = [p.detach().to_local().float().clone() for p in model.parameters()]
    if comms:  # symmem served the calls (a silent fallback would make every comparison trivial)
        state = model.layers[0]._get_fsdp_state()._fsdp_param_group
        if symmem_ag:
            assert state._all_gather_comm.calls > 0
        if symmem_rs:
            assert state._reduce_scatter_comm.calls > 0
    _train.last_grads = grads
    return torch.stack(losses), params, buffers


@pytest.mark.parametrize("prefetch", ["implicit", "explicit"])
@pytest.mark.parametrize("algo", ["copy_engine", "auto"])
def test_symmem_all_gather_is_bit_identical_to_nccl(group, prefetch, algo):
    ref_losses, ref_params, _ = _train(group, prefetch=prefetch)
    losses, params, buffers = _train(group, symmem_ag=algo, prefetch=prefetch)
    assert torch.equal(losses, ref_losses), (losses, ref_losses)
    for p, q in zip(params, ref_params):
        assert torch.equal(p, q)
    # Steady state: every step after the first reuses the buffers the first one made.
    assert buffers[1] == buffers[-1] > 0, buffers


def test_mixed_dtypes_and_async_unshard_are_bit_identical_to_nccl(group):
    ref_losses, ref_params, _ = _train(group, mixed=True, async_unshard=True)
    losses, params, _ = _train(group, symmem_ag="copy_engine", mixed=True, async_unshard=True)
    assert torch.equal(losses, ref_losses), (losses, ref_losses)
    for p, q in zip(params, ref_params):
        assert torch.equal(p, q)


def test_symmem_reduce_scatter_agrees_with_nccl(group):
    ref_losses, ref_params, _ = _train(group)
    ref_grads = _train.last_grads
    losses, params, _ = _train(group, symmem_ag="copy_engine", symmem_rs=True)
    # The gradients themselves (avg: sum and one division), within one bf16 rounding.
    for g, r in zip(_train.last_grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=2.0 ** -7, atol=2.0 ** -20)
    torch.testing.assert_close(losses, ref_losses, rtol=RS_RTOL, atol=0)
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p, q, rtol=RS_RTOL, atol=2.0 ** -12)


def _delay(call, rank, cycles=4_000_000):
    """`call` of a comm, run late on `rank` (a GPU sleep on its stream first, about 2 ms): the two
    ranks then reach their all-gathers and reduce-scatters in different orders on the device."""
    def late(self, *args, **kwargs):
        if dist.get_rank() == rank:
            torch.cuda._sleep(cycles)
        return call(self, *args, **kwargs)
    return late


@pytest.mark.parametrize("algo,max_blocks", [("auto", None), ("pull", 8)])
def test_sm_all_gather_beside_symmem_reduce_scatter_on_skewed_streams(group, monkeypatch, algo, max_blocks):
    # FSDP runs the all-gathers and reduce-scatters on two unordered streams. Rank 0 runs its
    # reduce-scatters late and rank 1 its all-gathers, so their device orders differ: on one
    # shared communicator that is a mismatch (seen with SYMMEM_TEST_SHARED_FSDP_COMMUNICATOR=1,
    # which puts the all-gathers back on the group's communicator); on their own, it trains as NCCL.
    import os

    import symmem.torch.fsdp as sfsdp
    ref_losses, ref_params, _ = _train(group, prefetch="explicit")
    if os.environ.get("SYMMEM_TEST_SHARED_FSDP_COMMUNICATOR") == "1":
        monkeypatch.setattr(sfsdp.SymmemAllGather, "_purpose", None)
    monkeypatch.setattr(sfsdp.SymmemAllGather, "__call__", _delay(sfsdp.SymmemAllGather.__call__, rank=1))
    monkeypatch.setattr(sfsdp.SymmemReduceScatter, "__call__", _delay(sfsdp.SymmemReduceScatter.__call__, rank=0))
    losses, params, _ = _train(group, symmem_ag=algo, symmem_rs=True, prefetch="explicit", max_blocks=max_blocks)
    torch.testing.assert_close(losses, ref_losses, rtol=RS_RTOL, atol=0)
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p, q, rtol=RS_RTOL, atol=2.0 ** -12)
    sfsdp.check(group)


def test_compiled_blocks_are_bit_identical_to_nccl(group):
    ref_losses, ref_params, _ = _train(group, compiled=True)
    losses, params, _ = _train(group, symmem_ag="copy_engine", compiled=True)
    assert torch.equal(losses, ref_losses), (losses, ref_losses)
    for p, q in zip(params, ref_params):
        assert torch.equal(p, q)


def test_killed_rank_mid_step_raises_naming_it(group, tmp_path):
    # fsdp_kill_worker.py: FSDP2 on symmem's comms; rank 1 dies in the forward pass of step 3.
    import os

    from conftest import run_killed_rank_job
    run_killed_rank_job(group, os.path.join(os.path.dirname(__file__), "fsdp_kill_worker.py"), tmp_path)
