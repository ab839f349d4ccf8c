"""The all-to-all and MoE ops on CPU tensors: schemas, fake kernels and mutations checked by
opcheck for every dtype, torch.compile tracing, results at one rank, and at 2-4 ranks (gloo, one
process per rank) against references written from the documented layouts; memory stated before
allocation; the kCapacity error code."""
import math
import os
import pathlib
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from moe_layout import layout_reference  # noqa: E402  (the GPU tests' reference)

A2A_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.uint8, torch.int8]


def _data(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", A2A_DTYPES)
def test_all_to_all_ops_pass_opcheck(group_name, dtype):
    ops = torch.ops.symmem
    x = _data((6, 3, 2), dtype, 1)
    cases = [
        (ops.all_to_all_single.default, (x, None, None, group_name), {}),
        (ops.all_to_all_single.default, (x, [4], [4], group_name), {}),
        (ops.all_to_all_single_out.default, (x, None, None, group_name), {"out": torch.empty_like(x)}),
        (ops.all_to_all_vdev.default,
         (x, torch.empty((9, 3, 2), dtype=dtype), torch.tensor([5]), torch.empty((2, 1), dtype=torch.int64),
          group_name), {}),
        (ops.all_to_all_vdev_2d.default,
         (x, torch.empty((24, 3, 2), dtype=dtype), torch.tensor([2, 0, 3]), torch.empty((2, 3), dtype=torch.int64),
          group_name, 8), {}),
    ]
    for op, args, kwargs in cases:
        torch.library.opcheck(op, args, kwargs)


def test_all_to_all_results_on_one_rank(group_name):
    x = _data((6, 4), torch.float32, 2)
    assert torch.equal(torch.ops.symmem.all_to_all_single(x, None, None, group_name), x)
    assert torch.equal(torch.ops.symmem.all_to_all_single(x, [2], [2], group_name), x[:2])
    out = torch.full((9, 4), float("nan"))
    oso = torch.full((2, 1), -7, dtype=torch.int64)
    torch.ops.symmem.all_to_all_vdev(x, out, torch.tensor([5]), oso, group_name)
    assert torch.equal(out[:5], x[:5]) and torch.isnan(out[5:]).all()
    assert oso.tolist() == [[5], [0]]
    # 2-D with torch's alignment: an empty expert still takes major_align rows.
    out = torch.full((24, 4), float("nan"))
    oso = torch.empty((2, 3), dtype=torch.int64)
    torch.ops.symmem.all_to_all_vdev_2d(x, out, torch.tensor([2, 0, 3]), oso, group_name, 8)
    assert oso.tolist() == [[2, 0, 3], [0, 8, 16]]
    assert torch.equal(out[0:2], x[0:2]) and torch.equal(out[16:19], x[2:5])
    assert torch.isnan(out[2:16]).all() and torch.isnan(out[19:]).all()
    # Default alignment (None) is torch's 1: an empty expert takes one row.
    torch.ops.symmem.all_to_all_vdev_2d(x, out, torch.tensor([2, 0, 3]), oso, group_name)
    assert oso.tolist() == [[2, 0, 3], [0, 2, 3]]


def test_all_to_all_errors_name_the_problem(group_name):
    x = torch.zeros(6, 4)
    with pytest.raises(ValueError, match="adds up to 7 rows"):
        torch.ops.symmem.all_to_all_single(x, [7], [7], group_name)
    with pytest.raises(TypeError, match="int64"):
        torch.ops.symmem.all_to_all_vdev(x, torch.zeros(6, 4), torch.tensor([1], dtype=torch.int32),
                                         torch.zeros(2, 1, dtype=torch.int64), group_name)
    with pytest.raises(ValueError, match="same row shape"):
        torch.ops.symmem.all_to_all_vdev(x, torch.zeros(6, 5), torch.tensor([1]), torch.zeros(2, 1, dtype=torch.int64),
                                         group_name)
    with pytest.raises(ValueError, match="major_align must be positive"):
        torch.ops.symmem.all_to_all_vdev_2d(x, torch.zeros(6, 4), torch.tensor([1]),
                                            torch.zeros(2, 1, dtype=torch.int64), group_name, 0)


def test_the_cuda_kernels_refuse_a_check_of_one_ranks_tensors_not_an_agreed_argument(fake_group, monkeypatch):
    # A refusal makes the communicator unusable on every rank: right for a tensor of this rank's
    # that fails a check (the peers would wait until their deadline), needless for major_align,
    # the op's argument, which every rank passes alike and so raises alike (refused before).
    import types

    from symmem.errors import SymmemError
    from symmem.torch import all_to_all

    class Core:
        def __init__(self):
            self.calls = []

        def refuse(self, op, code, message, stream):
            self.calls.append(("refuse", op, stream))
            return SymmemError(code, f"{op}: rank 0 refused the call: {message}")

    comm = fake_group("fake-a2a-refusal", 2, stream=7)
    comm.core = Core()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=7))
    x, out = torch.zeros(6, 4), torch.zeros(8, 4)
    oso = torch.zeros(2, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="major_align must be positive"):
        all_to_all._all_to_all_vdev_2d_cuda(x, out, torch.tensor([1, 2, 1, 2]), oso, comm.group_name, 0)
    assert comm.core.calls == []
    with pytest.raises(ValueError, match="rank 0 refused the call: .*not a multiple of the group size") as raised:
        all_to_all._all_to_all_vdev_2d_cuda(x, out, torch.tensor([1, 2, 1]), oso, comm.group_name, 1)
    assert isinstance(raised.value, SymmemError)
    assert comm.core.calls == [("refuse", "symmem.all_to_all_vdev_2d", 7)]
    # Output splits of a negative total: refused too (new_empty raised before the checks ran).
    with pytest.raises(ValueError, match="rank 0 refused the call: .*output_split_sizes has a negative entry"):
        all_to_all._all_to_all_single_cuda(x, [-3, 1], [3, 3], comm.group_name)
    assert comm.core.calls[1:] == [("refuse", "symmem.all_to_all_single", 7)]


def test_ops_compile_fullgraph(group_name):
    from symmem.torch.moe import ExpertParallel
    ep = ExpertParallel(num_experts=4, topk=2, hidden=128, max_tokens_per_rank=8)

    def step(x, ids, w):
        y = torch.ops.symmem.all_to_all_single(x * 2, None, None, group_name)
        out = torch.empty(8, 128)
        oso = torch.empty(2, 1, dtype=torch.int64)
        torch.ops.symmem.all_to_all_vdev(y, out, torch.tensor([3]), oso, group_name)
        r = _received(ep)
        torch.ops.symmem.moe_dispatch(y.to(torch.bfloat16), None, ids, w, None, ep.id, **r)
        combined = torch.empty(8, 128, dtype=torch.bfloat16)
        torch.ops.symmem.moe_combine(r["recv_x"], None, ep.id, False, **_combined(ep, r), out=combined)
        return out[:3].sum() + r["expert_num_tokens"].sum() + combined[:4].float().sum()

    x = _data((4, 128), torch.float32, 3)
    ids = torch.tensor([[0, 1], [2, -1], [3, 1], [1, 0]])
    w = torch.rand(4, 2)
    expected = step(x, ids, w)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(x, ids, w)
    assert torch.equal(got, expected)
    ep.close()


def _received(ep, fresh=False):
    """moe_dispatch's keyword arguments: the context's receive area and counts (or fresh tensors of
    their shapes, which the op fills as it would the area)."""
    from symmem.torch.moe import RECEIVED
    area = ep._impl.outputs
    return {n: (torch.zeros_like(t) if fresh else t) for n, t in zip(RECEIVED, area)}


def _combined(ep, received=None, fresh=False):
    """moe_combine's keyword arguments but out: combine_input (or a copy) and the counts."""
    received = received or _received(ep)
    ci = ep.combine_input.clone() if fresh else ep.combine_input
    return {"combine_input": ci, "expert_num_tokens": received["expert_num_tokens"],
            "num_rows": received["num_rows"]}


@pytest.mark.parametrize("layout", ["expert_major", "rank_major"])
@pytest.mark.parametrize("payload", ["bfloat16", "float8_e4m3"])
def test_moe_ops_pass_opcheck(group_name, layout, payload):
    from symmem.torch.moe import ExpertParallel, quantize_fp8
    ep = ExpertParallel(num_experts=4, topk=2, hidden=256, max_tokens_per_rank=8, layout=layout, payload=payload)
    x = _data((6, 256), torch.float32, 4)
    xs = None
    if payload == "float8_e4m3":
        x, xs = quantize_fp8(x)
    else:
        x = x.to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, -1], [3, 0], [1, 2], [-1, -1], [0, 3]])
    w = torch.rand(6, 2)
    # opcheck's schema test multiplies outputs, which float8 CPU tensors cannot do.
    utils = ("test_faketensor", "test_aot_dispatch_dynamic") if payload == "float8_e4m3" else \
        ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    # opcheck hands the op copies of the receive area: the op fills them as the area.
    for fresh in (False, True):
        torch.library.opcheck(torch.ops.symmem.moe_dispatch.default, (x, xs, ids, w, None, ep.id),
                              _received(ep, fresh), test_utils=utils)
    # With a count on the device the tensors hold the context's 8 rows (the count says how many go).
    def padded(t):
        return torch.cat([t, t[:2]]) if t is not None else None
    torch.library.opcheck(torch.ops.symmem.moe_dispatch.default,
                          (padded(x), padded(xs), padded(ids).to(torch.int32), padded(w),
                           torch.tensor([3], dtype=torch.int32), ep.id),
                          _received(ep), test_utils=utils)
    ep.dispatch(x, ids, w, x_scales=xs)
    expert_out = torch.rand(ep.received_shapes()[0]).to(torch.bfloat16)
    for fresh in (False, True):
        torch.library.opcheck(torch.ops.symmem.moe_combine.default, (None, None, ep.id, False),
                              {**_combined(ep, fresh=fresh), "out": torch.empty(8, 256, dtype=torch.bfloat16)})
        torch.library.opcheck(torch.ops.symmem.moe_combine.default, (expert_out, w, ep.id, True),
                              {**_combined(ep, fresh=fresh), "out": torch.empty(8, 256, dtype=torch.bfloat16)})
    ep.close()


def test_fp8_quantization_round_trips_within_its_precision():
    from symmem.torch.moe import dequantize_fp8, quantize_fp8
    x = _data((5, 384), torch.float32, 5) * 3
    q, s = quantize_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (5, 3)
    err = (dequantize_fp8(q, s) - x).abs() / x.abs().clamp(min=1e-3)
    assert float(err.median()) < 0.07


def test_memory_is_stated_before_allocation():
    import symmem.ep as core_ep
    heap, local = core_ep.memory(8, 256, 8, 7168, 128, "float8_e4m3", "expert_major")
    rows = 32 * 8 * 128
    assert heap == rows * (7168 + 56 * 4) + rows * 7168 * 2  # fp8 rows and scales, bf16 combine rows
    assert local > 0
    with pytest.raises(Exception, match="not a multiple of the world size"):
        core_ep.memory(8, 255, 8, 7168, 128)


def test_capacity_error_code_comes_from_the_c_abi():
    from symmem import _native
    assert _native.ERROR_CODES[9] == "kCapacity"
    assert _native.lib.symmem_error_code_name(10) == b"capacity exceeded"


# Several ranks (gloo, one process each) -------------------------------------------------------

def _run(world, fn, *args):
    path = os.path.join(tempfile.mkdtemp(prefix="symmem-moe-"), "store")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, world, path, fn, args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    for r, p in enumerate(procs):
        if p.is_alive():
            p.kill()
            raise AssertionError(f"rank {r} of {world} did not finish")
        assert p.exitcode == 0, f"rank {r} of {world} exited with {p.exitcode}"


def _worker(rank, world, path, fn, args):
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    import symmem.torch  # noqa: F401
    fn(rank, world, dist.group.WORLD.group_name, *args)
    dist.barrier()  # no rank tears the group down while a peer still talks to it
    dist.destroy_process_group()
    # The case passed. End here: torch's gloo threads can abort the interpreter's own teardown
    # ("terminate called without an active exception", no Python frame), which is not the case's.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _matrix(world, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 5, (world, n), generator=g)


def _rows_of(rank, count, width, seed):
    """Rank `rank`'s input: row r holds (rank, r, column) in a way any rank can recompute."""
    r = torch.arange(count).view(-1, 1).float()
    c = torch.arange(width).view(1, -1).float()
    return rank * 1000.0 + r + c / 64.0 + seed


def _check_vdev(rank, world, group_name, experts, align, seed):
    n = world * experts
    m = _matrix(world, n, seed)
    sent = int(m[rank].sum())
    x = _rows_of(rank, sent + 2, 8, seed)
    rows = [int(m[:, rank * experts + e].sum()) for e in range(experts)]
    extent = [r if align == 0 else max(math.ceil(r / align) * align, align) for r in rows]
    out = torch.full((sum(extent) + 3, 8), float("nan"))
    oso = torch.empty((2, n), dtype=torch.int64)
    if align == 0:
        torch.ops.symmem.all_to_all_vdev(x, out, m[rank].clone(), oso, group_name)
    else:
        torch.ops.symmem.all_to_all_vdev_2d(x, out, m[rank].clone(), oso, group_name, align)
    # The definition: expert e's extent starts after the earlier ones; senders in rank order.
    start = 0
    for e in range(experts):
        at = start
        for s in range(world):
            j = rank * experts + e
            count = int(m[s, j])
            first = int(m[s, :j].sum())
            assert oso[0, e * world + s] == count and oso[1, e * world + s] == at
            assert torch.equal(out[at:at + count], _rows_of(s, first + count, 8, seed)[first:first + count])
            at += count
        assert torch.isnan(out[at:start + extent[e]]).all()
        start += extent[e]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_all_to_all_vdev_on_several_ranks_matches_the_definition(world):
    _run(world, _vdev_cases)


def _vdev_cases(rank, world, group_name):
    for experts, align in ((1, 0), (2, 1), (3, 4)):
        _check_vdev(rank, world, group_name, experts, align, seed=7 * experts + align)
    # all_to_all_single with splits, as torch.distributed's.
    ins = [(rank + q) % 3 for q in range(world)]
    outs = [(s + rank) % 3 for s in range(world)]
    x = _rows_of(rank, sum(ins), 4, 0)
    got = torch.ops.symmem.all_to_all_single(x, outs, ins, group_name)
    at = 0
    for s in range(world):
        first = sum((s + q) % 3 for q in range(rank))
        assert torch.equal(got[at:at + outs[s]], _rows_of(s, first + outs[s], 4, 0)[first:first + outs[s]])
        at += outs[s]


@pytest.mark.parametrize("world", [2, 3])
def test_layout_reference_takes_inputs_of_different_lengths(world):
    """The GPU tests' reference (tests/python/moe_layout.py) on gloo ranks whose inputs differ in
    length, as their splits make them on GPUs: gathering them unpadded aborts gloo here and hung
    NCCL there (2 x H100, test_all_to_all_vdev_matches_the_layout)."""
    _run(world, _layout_case)


def _layout_case(rank, world, group_name):
    for experts, align in ((1, 0), (2, 1), (2, 4)):
        n = world * experts
        in_splits = torch.tensor([(3 * rank + 5 * j) % 7 for j in range(n)], dtype=torch.int64)
        x = _rows_of(rank, 7 * n + 1 + rank, 8, experts)  # a length of its own on every rank
        out = torch.full((world * n * 7 + n * 4, 8), float("nan"))
        oso = torch.full((2, n), -1, dtype=torch.int64)
        if align == 0:
            torch.ops.symmem.all_to_all_vdev(x, out, in_splits, oso, group_name)
        else:
            torch.ops.symmem.all_to_all_vdev_2d(x, out, in_splits, oso, group_name, align)
        chunks, splits, offsets, needed = layout_reference(x, in_splits, experts, align)
        assert oso.tolist() == [splits, offsets]
        for at, rows in chunks:
            assert torch.equal(out[at:at + rows.shape[0]], rows)
        assert torch.isnan(out[needed:]).all()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("layout", ["expert_major", "rank_major"])
def test_moe_reference_on_several_ranks(world, layout):
    _run(world, _moe_case, layout)


def _moe_case(rank, world, group_name, layout):
    from symmem.torch.moe import ExpertParallel
    E, K, H, T = 4 * world, 2, 128, 6
    ep = ExpertParallel(num_experts=E, topk=K, hidden=H, max_tokens_per_rank=T, layout=layout)
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, E, (T, K), generator=g)
    ids[:, 1] = torch.where(ids[:, 1] == ids[:, 0], -1, ids[:, 1])
    w = torch.rand(T, K, generator=g)
    x = (torch.arange(T * H).view(T, H) % 17 - 8).float().div(8).add(rank).to(torch.bfloat16)
    r = ep.dispatch(x, ids, w)
    # Fake experts: expert output = input row x (1 + local expert); rank-major reduces with weights.
    local = E // world
    if layout == "expert_major":
        for e in range(local):
            n = int(r.expert_num_tokens[e])
            ep.combine_input[e, :n] = (r.x[e, :n].float() * (1 + e)).to(torch.bfloat16)
    else:
        n = int(r.num_rows[0])
        acc = torch.zeros(n, H)
        for k in range(K):
            e = r.topk_idx[:n, k]
            sel = e >= 0
            acc[sel] += r.topk_weights[:n, k][sel].unsqueeze(1) * (r.x[:n][sel].float() * (1 + e[sel]).unsqueeze(1))
        ep.combine_input[:n] = acc.to(torch.bfloat16)
    y = ep.combine()
    expected = torch.zeros(T, H)
    for t in range(T):
        for k in range(K):
            e = int(ids[t, k])
            if e >= 0:
                expected[t] += w[t, k] * x[t].float() * (1 + e % local)
    assert torch.allclose(y[:T].float(), expected, rtol=2e-2, atol=2e-2)
    ep.close()


# Closing a context --------------------------------------------------------------------------------

@pytest.mark.parametrize("world", [2])
def test_a_closed_context_refuses_every_call_on_every_rank(world):
    _run(world, _closed_case)


def _closed_case(rank, world, group_name):
    from symmem.errors import SymmemError
    from symmem.torch.moe import RECEIVED, ExpertParallel
    E, K, H, T = 2 * world, 1, 128, 4
    ep = ExpertParallel(num_experts=E, topk=K, hidden=H, max_tokens_per_rank=T)
    x = torch.ones(T, H, dtype=torch.bfloat16)
    ids = torch.zeros(T, K, dtype=torch.int64)
    r = ep.dispatch(x, ids, torch.ones(T, K))
    ep.close()
    ep.close()  # a second close does nothing
    for call in (lambda: ep.dispatch(x, ids, torch.ones(T, K)), lambda: ep.combine(), lambda: ep.combine_input):
        with pytest.raises(SymmemError, match="was closed") as raised:
            call()
        assert raised.value.code == "kInvalidArgument"
    with pytest.raises(SymmemError, match="no open ExpertParallel context"):  # the op, by the context's id
        torch.ops.symmem.moe_dispatch(x, None, ids, torch.ones(T, K), None, ep.id, **dict(zip(RECEIVED, r)))
    assert int(r.expert_num_tokens[0]) == (world * T if rank == 0 else 0)  # what it lent stays readable


class _Span:
    """Stands for the span of a tensor over a context's memory (memory.lent_tensor)."""


def _device_context(fake_group, name, live_graphs=0):
    """A symmem.torch.moe._DeviceContext over a recording core context (no GPU), lending one tensor
    of its own (its outputs): (context, calls of its core context)."""
    import weakref

    from symmem.torch import moe

    comm = fake_group(name, 2)
    comm.core.live_graphs = live_graphs
    calls = []

    class CoreContext:
        def close(self, memory_lent=False):
            calls.append(("close", memory_lent))

        def destroy(self):
            calls.append(("destroy",))

    context = object.__new__(moe._DeviceContext)
    own = _Span()
    context.__dict__.update(comm=comm, ctx=CoreContext(), lent=weakref.WeakSet([own]), outputs=(own,),
                            combine_input=None)
    return context, calls


def test_a_context_closed_with_nothing_lent_releases_everything_at_once(fake_group):
    context, calls = _device_context(fake_group, "ep-nothing-lent")
    context.close()  # its own tensors are no loan
    assert calls == [("close", False), ("destroy",)]
    assert not context.comm._held


def test_a_context_closed_while_its_tensors_live_keeps_their_memory_until_they_are_gone(fake_group):
    context, calls = _device_context(fake_group, "ep-lent")
    kept = _Span()
    context.lent.add(kept)  # a tensor the caller still holds
    context.close()
    # Every rank keeps the heap buffers (the core agrees on it); the counts' memory stays here.
    assert calls == [("close", True)]
    comm = context.comm
    comm._release_held()
    assert calls == [("close", True)]  # still lent: nothing freed
    del kept
    comm._release_held()  # (symmem's release points: release_unused, the next context, ...)
    assert calls == [("close", True), ("destroy",)] and not comm._held


def test_a_context_closed_while_a_graph_lives_keeps_its_counts_until_the_graph_is_gone(fake_group):
    context, calls = _device_context(fake_group, "ep-graph", live_graphs=1)
    context.close()
    assert calls == [("close", False)]  # the core keeps its heap buffers for the graph
    comm = context.comm
    comm._release_held()
    assert calls == [("close", False)]
    comm.core.live_graphs = 0
    comm._release_held()
    assert calls == [("close", False), ("destroy",)]


def test_a_released_communicator_frees_what_it_held(fake_group):
    context, calls = _device_context(fake_group, "ep-released")
    kept = _Span()
    context.lent.add(kept)
    context.close()
    context.comm._release_held(everything=True)  # its release (only once no tensor over its memory lives)
    assert calls == [("close", True), ("destroy",)]

def test_closing_or_creating_a_context_during_graph_capture_is_refused(group_name, fake_group, monkeypatch):
    # Both are collective and touch device memory: close() frees the heap buffers (a device
    # synchronisation, then a barrier) and the counts (cudaFree), creation allocates; inside a
    # capture that invalidated the capture and left the ranks part way through the collective.
    # They are refused before anything happens, and work once the capture is over.
    from symmem.torch import groups, moe
    context, calls = _device_context(fake_group, "ep-capture")
    ep = object.__new__(moe.ExpertParallel)
    ep.__dict__.update(cpu=False, closed=False, id=-1, _impl=context)
    monkeypatch.setitem(moe._contexts, ep.id, ep)
    monkeypatch.setattr(moe, "capturing", lambda: True)
    with pytest.raises(RuntimeError, match="cannot run during CUDA graph capture"):
        ep.close()
    assert calls == [] and not ep.closed and moe._contexts.get(ep.id) is ep
    built = []
    monkeypatch.setattr(groups.GroupState, "communicator", lambda state, purpose=None: built.append(state))
    monkeypatch.setattr(moe.dist, "get_backend", lambda group: "nccl")
    with pytest.raises(RuntimeError, match="cannot run during CUDA graph capture"):
        moe.ExpertParallel(num_experts=4, topk=1, hidden=128, max_tokens_per_rank=4)
    assert not built
    monkeypatch.setattr(moe, "capturing", lambda: False)
    ep.close()
    assert calls == [("close", False), ("destroy",)] and ep.closed and ep.id not in moe._contexts


def test_a_context_of_a_destroyed_group_refuses_its_calls(group_name):
    # As every other entry point (groups.resolve): a DistBackendError naming the destroyed group.
    # Before, dispatch and combine kept running on it (here gloo's collectives, on a GPU the
    # communicator, which lives on while the context's tensors do). close() still works.
    import symmem
    from symmem.torch.moe import ExpertParallel
    sub = dist.new_group([0])
    ep = ExpertParallel(sub, num_experts=2, topk=1, hidden=128, max_tokens_per_rank=4)
    x, ids, w = torch.ones(4, 128, dtype=torch.bfloat16), torch.zeros(4, 1, dtype=torch.int64), torch.ones(4, 1)
    ep.dispatch(x, ids, w)
    ep.combine()
    dist.destroy_process_group(sub)
    for call in (lambda: ep.dispatch(x, ids, w), lambda: ep.combine()):
        with pytest.raises(dist.DistBackendError, match="destroyed") as raised:
            call()
        assert isinstance(raised.value, symmem.SymmemError) and raised.value.code == "kInvalidArgument"
    ep.close()


def test_a_device_context_refuses_calls_once_its_communicator_is_closed(group_name, fake_group):
    # close_all, or the group made again, closes the communicator: nothing runs on it any more.
    import symmem
    from symmem.torch import moe
    context, calls = _device_context(fake_group, "ep-closed-communicator")
    ep = object.__new__(moe.ExpertParallel)
    ep.__dict__.update(cpu=False, closed=False, id=-3, _impl=context, group=dist.group.WORLD, payload="bfloat16",
                       hidden=128, topk=1, max_tokens_per_rank=4, device=torch.device("cpu"), num_experts=2,
                       local_experts=1, layout="expert_major", expert_major=True, rows=8)
    context.ep = ep
    context.ctx.dispatch = lambda *args: calls.append(("dispatch",))
    xs, scales, meta = ep.received_shapes()
    context.outputs = moe.Dispatched(torch.zeros(xs, dtype=torch.bfloat16), torch.zeros(scales),
                                     torch.zeros(meta, dtype=torch.int32), torch.zeros(meta),
                                     torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    received = dict(zip(moe.RECEIVED, context.outputs))
    x, ids, w = torch.ones(4, 128, dtype=torch.bfloat16), torch.zeros(4, 1, dtype=torch.int64), torch.ones(4, 1)
    moe._contexts[ep.id] = ep
    try:
        torch.ops.symmem.moe_dispatch(x, None, ids, w, None, ep.id, **received)
        assert calls == [("dispatch",)]
        context.comm.closed = True
        with pytest.raises(symmem.SymmemError, match="was closed") as raised:
            torch.ops.symmem.moe_dispatch(x, None, ids, w, None, ep.id, **received)
        assert raised.value.code == "kAborted" and calls == [("dispatch",)]
    finally:
        del moe._contexts[ep.id]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("layout", ["expert_major", "rank_major"])
@pytest.mark.parametrize("payload", ["bfloat16", "float8_e4m3"])
def test_moe_reference_with_an_idle_rank(world, layout, payload):
    """A rank with no tokens (x [0, H], as an idle data-parallel rank passes) still dispatches and
    combines (out [0, H]); the others route tokens to its experts and receive its (no) rows."""
    _run(world, _moe_idle_case, layout, payload)


def _moe_idle_case(rank, world, group_name, layout, payload):
    from symmem.torch.moe import ExpertParallel, dequantize_fp8, quantize_fp8
    E, K, H, T = 4 * world, 2, 128, 6
    idle = world - 1
    fp8 = payload == "float8_e4m3"
    ep = ExpertParallel(num_experts=E, topk=K, hidden=H, max_tokens_per_rank=T, layout=layout, payload=payload)

    def tokens_of(s):
        """Rank s's tokens (every rank can recompute every rank's): none on the idle rank."""
        g = torch.Generator().manual_seed(s)
        n = 0 if s == idle else T
        ids = torch.randint(0, E, (n, K), generator=g)
        ids[:, 1] = torch.where(ids[:, 1] == ids[:, 0], -1, ids[:, 1])
        w = torch.rand(n, K, generator=g)
        x = (torch.arange(n * H).view(n, H) % 17 - 8).float().div(8).add(s)
        if fp8:
            q, scales = quantize_fp8(x)
            return ids, w, q, scales, dequantize_fp8(q, scales)
        xb = x.to(torch.bfloat16)
        return ids, w, xb, None, xb.float()

    ids, w, x, scales, exact = tokens_of(rank)
    r = ep.dispatch(x, ids, w, x_scales=scales)
    local = E // world
    # What this rank received: every pair routed to its experts, from every rank (the idle one none).
    pairs = [0] * local
    for s in range(world):
        for e in tokens_of(s)[0].flatten().tolist():
            if e >= 0 and e // local == rank:
                pairs[e % local] += 1
    assert r.expert_num_tokens.tolist() == pairs

    def rows(x_rows, scale_rows):
        return dequantize_fp8(x_rows, scale_rows) if fp8 else x_rows.float()

    # Fake experts: expert output = input row x (1 + local expert); rank-major reduces with weights.
    if layout == "expert_major":
        for e in range(local):
            n = int(r.expert_num_tokens[e])
            got = rows(r.x[e, :n], r.x_scales[e, :n] if fp8 else None)
            ep.combine_input[e, :n] = (got * (1 + e)).to(torch.bfloat16)
    else:
        n = int(r.num_rows[0])
        got = rows(r.x[:n], r.x_scales[:n] if fp8 else None)
        acc = torch.zeros(n, H)
        for k in range(K):
            e = r.topk_idx[:n, k]
            sel = e >= 0
            acc[sel] += r.topk_weights[:n, k][sel].unsqueeze(1) * (got[sel] * (1 + e[sel]).unsqueeze(1))
        ep.combine_input[:n] = acc.to(torch.bfloat16)
    y = ep.combine(out=torch.empty(ids.shape[0], H, dtype=torch.bfloat16))
    assert tuple(y.shape) == (ids.shape[0], H)
    expected = torch.zeros(ids.shape[0], H)
    for t in range(ids.shape[0]):
        for k in range(K):
            e = int(ids[t, k])
            if e >= 0:
                expected[t] += w[t, k] * exact[t] * (1 + e % local)
    assert torch.allclose(y.float(), expected, rtol=2e-2, atol=2e-2)
    ep.close()


@pytest.mark.parametrize("world", [2, 3])
def test_moe_argument_refused_on_one_rank_raises_on_every_rank(world):
    """combine's topk_weights wrong on one rank only ([1, K] after a dispatch of T tokens; a
    transposed, non-contiguous view): every rank raises the same error naming that rank and the
    cause (the refusing rank its ValueError, the others SymmemError kInvalidArgument), at once."""
    _run(world, _moe_refusal_case)


def _moe_refusal_case(rank, world, group_name):
    from symmem import errors
    from symmem.torch.moe import ExpertParallel
    E, K, H, T = 2 * world, 2, 128, 4
    ep = ExpertParallel(num_experts=E, topk=K, hidden=H, max_tokens_per_rank=T)
    bad = world - 1
    ids = torch.tensor([[(rank + t) % E, -1] for t in range(T)])
    w = torch.rand(T, K)
    x = torch.ones(T, H, dtype=torch.bfloat16)
    wrong = {"short": torch.rand(1, K), "transposed": torch.rand(K, T).t()}
    for case, cause in (("short", "topk_weights must be [4, 2]"), ("transposed", "topk_weights must be contiguous")):
        ep.dispatch(x, ids, w)
        weights = wrong[case] if rank == bad else w
        with pytest.raises(errors.SymmemError) as raised:
            ep.combine(out=torch.empty(T, H, dtype=torch.bfloat16), topk_weights=weights)
        message = str(raised.value)
        assert raised.value.code == "kInvalidArgument", message
        assert f"symmem.moe_combine: rank {bad} refused the call: " in message and cause in message, message
        assert isinstance(raised.value, ValueError) == (rank == bad), case
    ep.close()


def test_the_blocks_of_a_context_on_a_library_before_symmem_ep_blocks_come_from_its_description(monkeypatch):
    """A/B runs load libraries of older commits (scripts/gpu_run.sh, ab_runs): symmem.ep binds
    symmem_ep_blocks only where it exists, and EpContext.blocks() then reads the description."""
    import symmem.ep as core_ep

    class OlderLibrary:  # has every entry point blocks() might use but symmem_ep_blocks
        pass

    monkeypatch.setattr(core_ep, "lib", OlderLibrary())
    context = core_ep.EpContext.__new__(core_ep.EpContext)
    context.describe = lambda: ("moe_dispatch(expert_major, bfloat16, experts=16, topk=8, hidden=512, max_tokens=160, "
                                "rows_per_expert=320, blocks=24); moe_combine(expert_major, bfloat16, experts=16, "
                                "topk=8, hidden=512, max_tokens=160, rows_per_expert=320, blocks=24, reduced)")
    assert context.blocks() == 24


def test_blocks_for_says_none_on_a_cpu_group(group_name):
    """A CPU (gloo) group's contexts run no kernels: blocks_for says None, as ExpertParallel.blocks."""
    from symmem.torch.moe import ExpertParallel, blocks_for
    config = dict(num_experts=4, topk=2, hidden=128, max_tokens_per_rank=8)
    assert blocks_for(**config) is None
    ep = ExpertParallel(**config)
    assert ep.blocks is None and ep.max_blocks == -1
    ep.close()
