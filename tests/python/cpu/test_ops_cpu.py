"""The torch.library ops on CPU tensors (their CPU kernels run torch.distributed on a one-rank gloo
group): schemas, fake kernels and mutation declarations checked by opcheck, torch.compile tracing,
and the errors for bad input."""
import logging
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32]


def _rand(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck_every_op(group_name, dtype):
    ops = torch.ops.symmem
    x = _rand((6, 5), dtype)
    cases = [
        (ops.all_reduce.default, (x, "sum", group_name), {}),
        (ops.all_reduce_.default, (x.clone(), "max", group_name), {}),
        (ops.all_reduce_out.default, (x, "min", group_name), {"out": torch.empty_like(x)}),
        (ops.all_gather_into_tensor.default, (x, group_name), {}),
        (ops.all_gather_into_tensor_out.default, (x, group_name), {"out": torch.empty_like(x)}),
        (ops.all_gather.default, (x, group_name, [torch.empty_like(x)]), {}),
        (ops.reduce_scatter_tensor.default, (x, "sum", group_name), {}),
        (ops.reduce_scatter_tensor_out.default, (x, "sum", group_name), {"out": torch.empty_like(x)}),
    ]
    if dtype.is_floating_point:
        cases.append((ops.all_reduce.default, (x, "avg", group_name), {}))
    for op, args, kwargs in cases:
        torch.library.opcheck(op, args, kwargs)


def test_gathers_take_any_dtype(group_name):
    x = torch.arange(10, dtype=torch.uint8)
    torch.library.opcheck(torch.ops.symmem.all_gather_into_tensor.default, (x, group_name))
    assert torch.equal(torch.ops.symmem.all_gather_into_tensor(x, group_name), x)


def test_results_on_one_rank(group_name):
    x = _rand((4, 3), torch.float32)
    assert torch.equal(torch.ops.symmem.all_reduce(x, "sum", group_name), x)
    assert torch.equal(torch.ops.symmem.all_reduce(x, "avg", group_name), x)
    y = x.clone()
    assert torch.ops.symmem.all_reduce_(y, "sum", group_name) is None
    assert torch.equal(y, x)
    out = torch.full((4, 3), float("nan"))
    torch.ops.symmem.all_reduce_out(x, "sum", group_name, out=out)
    assert torch.equal(out, x)
    assert torch.equal(torch.ops.symmem.reduce_scatter_tensor(x, "sum", group_name), x)


def test_compile_fullgraph(group_name):
    def step(x, y):
        a = torch.ops.symmem.all_reduce(x * 2, "sum", group_name)
        g = torch.ops.symmem.all_gather_into_tensor(a + 1, group_name)
        torch.ops.symmem.all_reduce_(y, "max", group_name)
        r = torch.ops.symmem.reduce_scatter_tensor(g, "avg", group_name)
        return r + y.sum()

    x, y = _rand((8, 4), torch.float32, 1), _rand((3,), torch.float32, 2)
    expected = step(x, y.clone())
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(x, y.clone())
    assert torch.equal(got, expected)


def test_bad_input_errors(group_name):
    ops = torch.ops.symmem
    x = _rand((6, 4), torch.float32)
    with pytest.raises(ValueError, match="must be contiguous"):
        ops.all_reduce(x.t(), "sum", group_name)
    with pytest.raises(ValueError, match="must be contiguous"):
        ops.all_gather_into_tensor(x[:, ::2], group_name)
    with pytest.raises(TypeError, match="not reducible"):
        ops.all_reduce(x.double(), "sum", group_name)
    with pytest.raises(TypeError, match="avg"):
        ops.all_reduce(x.int(), "avg", group_name)
    with pytest.raises(ValueError, match="reduce_op 'prod'"):
        ops.all_reduce(x, "prod", group_name)
    with pytest.raises(ValueError, match="elements"):
        ops.all_reduce_out(x, "sum", group_name, out=torch.empty(5))
    with pytest.raises(TypeError, match="dtype"):
        ops.all_gather_into_tensor_out(x, group_name, out=torch.empty(6, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="output tensors"):
        ops.all_gather(x, group_name, [torch.empty_like(x), torch.empty_like(x)])


class _Records(logging.Handler):
    """The records of one logger, without pytest's logging plugin (ctest runs with -p no:logging)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_drop_in_functions_fall_back_for_cpu_tensors_and_say_why_once(group_name):
    import symmem.torch as st
    from symmem.torch import functional
    functional._said.clear()  # (another test may have said it already)
    x = _rand((5,), torch.float32)
    y = x.clone()
    logger, records = logging.getLogger("symmem"), _Records()
    logger.addHandler(records)
    try:
        st.all_reduce(y)
        st.all_reduce(y)
    finally:
        logger.removeHandler(records)
    reasons = [r.getMessage() for r in records.records if "falls back to torch.distributed" in r.getMessage()]
    assert len(reasons) == 1 and "cpu tensors" in reasons[0]
    assert torch.equal(y, x)
    out = torch.empty(5)
    work = st.all_gather_into_tensor(out, x, async_op=True)
    work.wait()
    assert torch.equal(out, x)
    lst = [torch.empty(5)]
    st.all_gather(lst, x)
    assert torch.equal(lst[0], x)


class _FakeState:
    """A live GroupState of `group` holding `comm` (the drop-ins' cache reads these fields)."""

    def __init__(self, comm, group):
        self.communicators = {None: comm}
        self.closed = False
        self.group_ref = lambda: group

    @property
    def group(self):
        return self.group_ref()


def test_drop_in_all_reduce_goes_straight_to_the_c_call_when_it_can(group_name, monkeypatch):
    # Eager drop-in calls skip the dispatcher and the route's layers, only for what the op itself
    # would serve as it is; everything else takes the full checks (and the op, or the fallback).
    import torch.distributed as dist
    from symmem import _native
    from symmem.torch import _route, functional, groups

    calls = []

    class FakeCore:
        def all_reduce(self, out, inp, count, dtype, op, stream):
            calls.append((out, inp, count, dtype, op))

    class FakeComm:
        group_name = "fake-world"
        nodes = 1
        closed = False
        device = -1  # a CPU tensor's get_device()
        core = FakeCore()

    comm = FakeComm()
    world = dist.group.WORLD
    state = _FakeState(comm, world)
    monkeypatch.setitem(groups._by_id, id(world), state)
    monkeypatch.setattr(_route, "current_stream", lambda device: 0)
    # Enough of a plain CUDA tensor for the test: a real torch.Tensor whose is_cuda says True.
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    bf16, i32 = _rand((4,), torch.bfloat16), torch.ones(4, dtype=torch.int32)
    codes, types = _native.REDUCE_OPS, _native.DTYPES
    assert functional.all_reduce(bf16) is None
    assert calls == [(bf16.data_ptr(), bf16.data_ptr(), 4, types["bfloat16"], codes["sum"])]
    functional.all_reduce(bf16, op=dist.ReduceOp.AVG)
    functional.all_reduce(i32, op=dist.ReduceOp.MAX)
    assert [c[3:] for c in calls[1:]] == [(types["bfloat16"], codes["avg"]), (types["int32"], codes["max"])]
    calls.clear()

    def served(t, op, group=None):
        """What the fast path does with this call: its communicator, or None (the full checks decide)."""
        c = functional._eager_communicator(t, group)
        if c is None or not _route.all_reduce_in_place(c, t, functional._OP_CODE_BY_ID.get(id(op))):
            return None
        return c

    assert served(i32, dist.ReduceOp.AVG) is None  # avg of integers: the op refuses it
    assert served(torch.ones(2, dtype=torch.float64), dist.ReduceOp.SUM) is None  # not reducible
    assert served(bf16, dist.ReduceOp.PRODUCT) is None
    assert served(torch.ones(4, 2, dtype=torch.bfloat16).t(), dist.ReduceOp.SUM) is None  # not contiguous
    assert calls == []
    assert served(bf16, dist.ReduceOp.SUM, world) is comm
    calls.clear()
    # A FakeTensor or a dispatch mode must see the op (its fake kernel), never the C call.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(bf16)
    assert served(fake, dist.ReduceOp.SUM) is None
    with Watch():
        assert served(bf16, dist.ReduceOp.SUM) is None
    # A communicator spanning nodes runs no reductions, nor does a closed one, or one on another
    # device: the fast path is never taken.
    for attribute, value in (("nodes", 2), ("closed", True), ("device", 0)):
        saved = getattr(comm, attribute)
        setattr(comm, attribute, value)
        assert served(bf16, dist.ReduceOp.SUM) is None
        setattr(comm, attribute, saved)
    assert calls == []
    # A closed state, or one of another group object (torch reuses the ids and names of destroyed
    # groups), is never served from the cache.
    state.closed = True
    assert served(bf16, dist.ReduceOp.SUM) is None
    state.closed = False
    state.group_ref = lambda: object()
    assert served(bf16, dist.ReduceOp.SUM) is None
    assert calls == []
    # What the fast path declines, the drop-in hands to the full checks (never dropped, never the C
    # call): each of these reaches _state, the full path's first step.
    state.group_ref = lambda: world
    full = []
    monkeypatch.setattr(functional, "_state", lambda function, group: full.append(function))
    declined = [(torch.ones(4, 2, dtype=torch.bfloat16).t(), dist.ReduceOp.SUM),
                (bf16, dist.ReduceOp.PRODUCT), (i32, dist.ReduceOp.AVG),
                (torch.ones(2, dtype=torch.float64), dist.ReduceOp.SUM)]
    for t, op in declined:
        assert functional.all_reduce(t, op=op) is None
    assert full == ["all_reduce"] * len(declined) and calls == []
    functional.all_reduce(bf16)
    assert len(full) == len(declined) and len(calls) == 1


def test_every_drop_in_and_op_refuses_a_destroyed_group(group_name, monkeypatch):
    # ProcessGroupNCCL refuses a collective on a destroyed group (DistBackendError: its
    # communicators are destroyed with it); symmem must too, on every path. On 0bbf9f1 the drop-in
    # all_reduce served a destroyed group from its cache and returned the sum, the other drop-ins
    # fell back to gloo, which runs collectives on a destroyed group, and the ops raised a
    # RuntimeError that is no DistBackendError; before every entry point resolved its group with
    # groups.state_of, the CPU kernels of the fused and all-to-all ops still did.
    import torch.distributed as dist
    import symmem
    import symmem.torch as st
    from symmem.torch import _route, all_to_all, groups, moe

    class FakeComm:
        group_name = "fake-sub"
        nodes = 1

    sub = dist.new_group([0])
    name = sub.group_name
    monkeypatch.setitem(groups._by_id, id(sub), _FakeState(FakeComm(), sub))  # a communicator was made
    served = []
    monkeypatch.setattr(_route, "all_reduce_in_place", lambda c, t, code: served.append(code) is None)
    x = _rand((4,), torch.float32, 3)
    y = x.clone()
    with monkeypatch.context() as m:  # a tensor the fast path takes (it reads is_cuda)
        m.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
        st.all_reduce(y, group=sub)
    assert served == [_route.REDUCE_OPS["sum"]]
    st.all_reduce(y, group=sub)  # CPU: gloo, through the fallback
    assert torch.equal(y, x)
    dist.destroy_process_group(sub)

    out, outs = torch.zeros(4), [torch.zeros(4)]
    a, b = _rand((4, 8), torch.float16, 4), _rand((8, 8), torch.float16, 5)
    splits, splits_offsets = torch.ones(1, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.int64)
    ops = torch.ops.symmem

    def faked(op, *args):
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode() as mode:
            op(*[mode.from_tensor(t) if isinstance(t, torch.Tensor) else
                 [mode.from_tensor(u) for u in t] if isinstance(t, list) else t for t in args])
    calls = {
        "all_reduce (fast path)": None,
        "all_reduce": lambda: st.all_reduce(y, group=sub),
        "all_reduce async": lambda: st.all_reduce(y, group=sub, async_op=True),
        "all_reduce by name": lambda: st.all_reduce(y, group=name),
        "all_gather_into_tensor": lambda: st.all_gather_into_tensor(out, y, group=sub),
        "all_gather (list)": lambda: st.all_gather(outs, y, group=sub),
        "reduce_scatter_tensor": lambda: st.reduce_scatter_tensor(out, y, group=sub),
        "op all_reduce": lambda: ops.all_reduce(y, "sum", name),
        "op all_reduce_": lambda: ops.all_reduce_(y, "sum", name),
        "op all_reduce_out": lambda: ops.all_reduce_out(y, "sum", name, out=out),
        "op all_gather_into_tensor": lambda: ops.all_gather_into_tensor(y, name),
        "op all_gather_into_tensor_out": lambda: ops.all_gather_into_tensor_out(y, name, out=out),
        "op all_gather": lambda: ops.all_gather(y, name, outs),
        "op reduce_scatter_tensor": lambda: ops.reduce_scatter_tensor(y, "sum", name),
        "op reduce_scatter_tensor_out": lambda: ops.reduce_scatter_tensor_out(y, "sum", name, out=out),
        "op all_gather_matmul": lambda: ops.all_gather_matmul(a, b, name),
        "op matmul_reduce_scatter": lambda: ops.matmul_reduce_scatter(a, b, name),
        "op fused_all_gather_matmul": lambda: ops.fused_all_gather_matmul(a, [b], 0, name),
        "op fused_matmul_reduce_scatter": lambda: ops.fused_matmul_reduce_scatter(a, b, "sum", 0, name),
        "op all_to_all_single": lambda: ops.all_to_all_single(y, None, None, name),
        "op all_to_all_vdev": lambda: ops.all_to_all_vdev(y, out, splits, splits_offsets, name),
        "all_gather_matmul": lambda: st.all_gather_matmul(a, b, group=sub),
        "matmul_reduce_scatter": lambda: st.matmul_reduce_scatter(a, b, group=sub),
        "all_to_all_single": lambda: all_to_all.all_to_all_single(out, y, group=sub),
        "GroupCommunicator": lambda: st.GroupCommunicator(sub),
        "empty": lambda: st.empty(4, group=sub),
        "TPAllReduce": lambda: st.TPAllReduce(sub),
        "ExpertParallel": lambda: moe.ExpertParallel(sub, num_experts=2, topk=1, hidden=8, max_tokens_per_rank=4),
        # The all-to-all and fused ops' CPU and fake kernels, and calls by name.
        "op all_to_all_single_out": lambda: ops.all_to_all_single_out(y, None, None, name, out=out),
        "op all_to_all_vdev_2d": lambda: ops.all_to_all_vdev_2d(y, out, splits, splits_offsets, name, 1),
        "all_to_all_single by name": lambda: all_to_all.all_to_all_single(out, y, group=name),
        "all_gather_matmul by name": lambda: st.all_gather_matmul(a, b, group=name),
        "fake all_gather_matmul": lambda: faked(ops.all_gather_matmul, a, b, name),
        "fake matmul_reduce_scatter": lambda: faked(ops.matmul_reduce_scatter, a, b, name),
        "fake fused_all_gather_matmul": lambda: faked(ops.fused_all_gather_matmul, a, [b], 0, name),
        "fake fused_matmul_reduce_scatter": lambda: faked(ops.fused_matmul_reduce_scatter, a, b, "sum", 0, name),
    }
    problems = []
    for what, call in calls.items():
        with monkeypatch.context() as m:
            if call is None:
                m.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
                call = calls["all_reduce"]
            try:
                call()
            except Exception as e:  # noqa: BLE001
                if not (isinstance(e, dist.DistBackendError) and isinstance(e, symmem.SymmemError)
                        and e.code == "kInvalidArgument" and "destroyed" in str(e) and repr(name) in str(e)):
                    problems.append(f"{what}: {type(e).__name__}: {e}")
            else:
                problems.append(f"{what}: ran")
    assert not problems, "not refused as a destroyed group:\n" + "\n".join(problems)
    assert served == [_route.REDUCE_OPS["sum"]] and torch.equal(y, x) and not out.any() and not outs[0].any() and not splits_offsets.any()


def test_a_failure_to_build_is_remembered_with_the_group_not_its_name(group_name, monkeypatch):
    # A communicator that could not be built keeps symmem off for that group only: the group made
    # again under the same name starts afresh (seen failing before: the reason was cached by name).
    import torch.distributed as dist
    import symmem
    from symmem.torch import groups

    built = []

    def refuse(cls, state, group, purpose):
        built.append(state)
        raise symmem.SymmemError("kInvalidArgument", "workspace too small")

    monkeypatch.setattr(groups.GroupCommunicator, "_build", classmethod(refuse))
    sub = dist.new_group([0])
    state = groups.state_of(sub)
    assert "workspace too small" in state.unavailable_reason()
    assert "workspace too small" in state.unavailable_reason() and len(built) == 1  # remembered
    with pytest.raises(symmem.SymmemError, match="workspace too small"):
        groups.GroupCommunicator(sub)
    dist.destroy_process_group(sub)
    del sub
    again = dist.new_group([0])
    class Built:
        def _retire(self):
            pass

        def _releasable(self):
            return False

    built_again = Built()
    monkeypatch.setattr(groups.GroupCommunicator, "_build", classmethod(lambda cls, s, g, p: built_again))
    fresh = groups.state_of(again)
    assert fresh is not state and state.closed
    assert fresh.unavailable_reason() is None and groups.GroupCommunicator(again) is built_again
    dist.destroy_process_group(again)
    groups.release_unused()
    assert fresh.closed and built_again in groups._retired  # (kept: it says it is still in use)
    groups._retired.remove(built_again)


def test_a_destroyed_or_closed_group_retires_its_state_and_its_communicators(group_name, monkeypatch):
    import torch.distributed as dist
    from symmem.torch import groups

    class Core:
        live_graphs = 0

        def __init__(self):
            self.destroyed = False

        def check(self):
            pass

        def destroy(self):
            self.destroyed = True

    def build(cls, state, group, purpose):
        comm = object.__new__(cls)
        comm.__dict__.update(state=state, purpose=purpose, key=f"{state.name}#{purpose}", group_name=state.name,
                             device=0, closed=False, workspaces={"w": (1, 2)}, lenders={"fsdp": object()},
                             pool_slot=None, pool=None, core=Core(), nodes=1)
        import weakref
        comm._spans = weakref.WeakSet()
        return comm

    monkeypatch.setattr(groups.GroupCommunicator, "_build", classmethod(build))
    monkeypatch.setattr(groups.GroupCommunicator, "_release", lambda self: self.core.destroy())
    sub = dist.new_group([0])
    own, fsdp = groups.GroupCommunicator(sub), groups.GroupCommunicator(sub, "fsdp_all_gather")
    assert groups.GroupCommunicator(sub) is own and groups.cached_state(sub) is own.state
    own.close()  # closes the whole group's state
    assert own.closed and fsdp.closed and not own.lenders and not own.workspaces
    assert own.core.destroyed and fsdp.core.destroyed and groups.cached_state(sub) is None
    again = groups.GroupCommunicator(sub)
    assert again is not own and not again.closed
    # Destroying the group retires its state at once (its Python object dies) ...
    dist.destroy_process_group(sub)
    del sub
    assert again.closed and again.core.destroyed
    # ... and a group torch.distributed no longer knows, though its object lives, at the next lookup.
    kept = dist.new_group([0])
    held = groups.GroupCommunicator(kept)
    dist.destroy_process_group(kept)
    groups.release_unused()
    assert held.closed and held.core.destroyed
    del kept


def test_memory_stays_mapped_while_anything_may_use_it(group_name, monkeypatch):
    from symmem.torch import groups

    class Core:
        live_graphs = 0

    comm = object.__new__(groups.GroupCommunicator)
    import weakref
    comm.__dict__.update(core=Core(), pool_slot=None, _spans=weakref.WeakSet())

    class Span:
        pass

    span = Span()
    comm._spans.add(span)
    assert not comm._releasable()  # a tensor over its heap is alive
    del span
    assert comm._releasable()
    comm.core.live_graphs = 1
    assert not comm._releasable()  # a CUDA graph that captured one of its calls exists
    comm.core.live_graphs = 0
    from symmem import _native
    monkeypatch.setattr(_native.lib, "symmem_pool_live_segments", lambda slot: 2)
    comm.pool_slot = 3
    assert not comm._releasable()  # its pool's segments are in use


FAKE_SHAPES = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch._subclasses.fake_tensor import FakeTensorMode
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    import symmem.torch
    ops, g = torch.ops.symmem, dist.group.WORLD.group_name
    with FakeTensorMode():
        x = torch.empty(6, 5, dtype=torch.bfloat16, device="cuda")
        assert ops.all_gather_into_tensor(x, g).shape == (24, 5)
        assert ops.all_gather_into_tensor(torch.empty((), device="cuda"), g).shape == (4,)
        assert ops.all_reduce(x, "sum", g).shape == (6, 5)
        assert ops.reduce_scatter_tensor(torch.empty(8, 3, device="cuda"), "avg", g).shape == (2, 3)
        out = torch.empty(24, 5, dtype=torch.bfloat16, device="cuda")
        ops.all_gather_into_tensor_out(x, g, out=out)
        try:
            ops.reduce_scatter_tensor(x, "sum", g)
            raise SystemExit("indivisible reduce-scatter was accepted")
        except ValueError as e:
            assert "must divide by the group size 4" in str(e), e
    print("ok")
""")


def test_fake_shapes_for_a_group_of_four():
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", FAKE_SHAPES], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("ok")


def test_cuda_kernels_pass_the_right_arguments_to_the_core(group_name, fake_group):
    # The CUDA kernels' Python side, run on CPU tensors against a recording core (world 4): the
    # pointers, counts (elements; bytes for gathers), enum values and the in-place forms.
    from symmem import _native
    from symmem.torch import _route, ops

    comm = fake_group("fake", 4, stream=1234)
    x = _rand((8, 3), torch.bfloat16)
    y = ops._all_reduce_cuda(x, "max", "fake")
    assert comm.core.calls[-1] == ("all_reduce", y.data_ptr(), x.data_ptr(), 24, _native.DTYPES["bfloat16"],
                                   _native.REDUCE_OPS["max"], 1234, 0, 0, -1)
    ops._all_reduce_inplace_cuda(x, "sum", "fake")
    assert comm.core.calls[-1][1] == comm.core.calls[-1][2] == x.data_ptr()
    g = ops._all_gather_cuda(x, "fake")
    assert g.shape == (32, 3)
    assert comm.core.calls[-1] == ("all_gather", g.data_ptr(), x.data_ptr(), 48, _native.DTYPES["uint8"], 1234, 0, 0,
                                   -1)
    r = ops._reduce_scatter_cuda(x, "sum", "fake")
    assert r.shape == (2, 3)
    assert comm.core.calls[-1] == ("reduce_scatter", r.data_ptr(), x.data_ptr(), 6, _native.DTYPES["bfloat16"],
                                   _native.REDUCE_OPS["sum"], 1234, 0, 0, -1)
    # avg: the core's own reduction (its kernels divide the sum); nothing runs after it.
    z = torch.full((4,), 8.0)
    ops._all_reduce_inplace_cuda(z, "avg", "fake")
    assert comm.core.calls[-1][5] == _native.REDUCE_OPS["avg"] and torch.equal(z, torch.full((4,), 8.0))
    # List gather straight into adjacent outputs; otherwise through one buffer and copies.
    flat = torch.empty(4 * 24, dtype=torch.bfloat16)
    ops._all_gather_list_cuda(x, "fake", list(flat.view(4, 8, 3).unbind(0)))
    assert comm.core.calls[-1][1] == flat.data_ptr()
    separate = [torch.empty(8, 3, dtype=torch.bfloat16) for _ in range(4)]
    ops._all_gather_list_cuda(x, "fake", separate)
    assert comm.core.calls[-1][1] not in [t.data_ptr() for t in separate]
    class OtherDevice:
        device, group_name = 0, "g"

    with pytest.raises(ValueError, match="input is on cpu"):
        _route.check_operand(x, "input", "all_reduce", OtherDevice())


def test_tp_all_reduce_returns_its_output_under_compile(group_name):
    # all_reduce_out returns nothing (so that it can be functionalised); TPAllReduce must still
    # return the output tensor when traced.
    from symmem.torch import TPAllReduce

    class Comm:
        closed = False

    Comm.group_name = group_name
    tp = TPAllReduce.__new__(TPAllReduce)
    tp._comm, tp.should_use = Comm(), lambda t: True  # (a CPU tensor stands in for a CUDA one)
    x = _rand((16,), torch.float32, 3)
    torch._dynamo.reset()
    got = torch.compile(lambda t: tp.all_reduce(t) * 1, fullgraph=True, backend="aot_eager")(x)
    assert isinstance(got, torch.Tensor) and torch.equal(got, x)


def test_creation_outcome_is_agreed_by_every_rank():
    import threading
    from symmem.torch.groups import _agree_on_outcome
    store = torch.distributed.HashStore()
    results = {}

    def rank(r, mine):
        results[r] = _agree_on_outcome(store, r, 3, mine, 5000)

    threads = [threading.Thread(target=rank, args=(r, "ok" if r != 1 else "rank 1: out of memory"))
               for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: "rank 1: out of memory", 1: "rank 1: out of memory", 2: "rank 1: out of memory"}
    # A rank that never reports is a failure for the others, named.
    lonely = torch.distributed.HashStore()
    assert "ranks [1]" in _agree_on_outcome(lonely, 0, 2, "ok", 200)


def test_fsdp_enable_installs_the_comms_on_every_fsdp_module(group_name):
    # FSDP2 on a CPU mesh of one rank: enable() wiring and the comms' CPU fallbacks (the GPU tests
    # compare training against NCCL).
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import symmem.torch.fsdp as sfsdp
    from symmem.bench.llama import Decoder, loss_of
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = Decoder(vocab=11, dim=8, layers=2, heads=2, hidden=12)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert sfsdp.enable(model) == 3
    comms = {id(m._get_fsdp_state()._fsdp_param_group._all_gather_comm) for m in [model, *model.layers]}
    assert len(comms) == 1  # one comm per shard group, shared by its modules
    ag = model._get_fsdp_state()._fsdp_param_group._all_gather_comm
    assert isinstance(ag, sfsdp.SymmemAllGather)
    buffer = ag.allocate((6,), dtype=torch.bfloat16, device=torch.device("cpu"))
    assert buffer.shape == (6,) and buffer.dtype == torch.bfloat16
    loss = loss_of(model, torch.randint(0, 11, (2, 5)))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_fsdp_buffers_are_lent_again_only_when_no_view_is_alive():
    from symmem.torch import fsdp

    class Core:
        made = 0

        def allocate(self, nbytes):
            Core.made += 1
            return Core.made

    class Comm:
        core = Core()

    class CpuLender(fsdp._Lender):
        stream = 1

        def _stream(self):
            return self.stream

        def _tensor_over(self, ptr, nbytes):
            return torch.empty(nbytes, dtype=torch.uint8)

    lender = CpuLender(Comm())
    a = lender.lend((4, 2), torch.bfloat16)
    shard = a.view(-1)[4:]  # FSDP keeps views (the input slot, the sharded gradients)
    b = lender.lend((4, 2), torch.bfloat16)
    assert lender.buffers == 2 and a.data_ptr() != b.data_ptr()
    del a
    c = lender.lend((8,), torch.bfloat16)  # a's buffer still has a live view: not lent again
    assert lender.buffers == 3
    del shard
    d = lender.lend((2, 4), torch.bfloat16)  # now it is idle: lent again, nothing made
    assert lender.buffers == 3 and d.shape == (2, 4)
    e = lender.lend((3,), torch.float32)  # another size: its own buffer
    assert lender.buffers == 4 and e.dtype == torch.float32
    del b, c, d
    # An idle buffer is lent again only on the stream that asked for it (as the caching allocator
    # does): FSDP frees a buffer once its allocating stream, not every stream, is past its uses.
    lender.stream = 2
    f = lender.lend((4, 2), torch.bfloat16)
    assert lender.buffers == 5
    lender.stream = 1
    g = lender.lend((4, 2), torch.bfloat16)
    assert lender.buffers == 5
    del e, f, g


def test_fsdp_lender_lends_a_zero_element_buffer():
    # FSDP may ask for an empty buffer (a rank whose shard is empty): a view of shape (0, ...) of the
    # smallest buffer (one element), never an error on that rank alone.
    from symmem.torch import fsdp

    class Core:
        def allocate(self, nbytes):
            return 1

    class Comm:
        core = Core()

    class CpuLender(fsdp._Lender):
        def _stream(self):
            return 1

        def _tensor_over(self, ptr, nbytes):
            return torch.empty(nbytes, dtype=torch.uint8)

    lender = CpuLender(Comm())
    views = []
    for size, dtype in (((0,), torch.bfloat16), ((0, 4), torch.float32), ((3, 0, 2), torch.float16)):
        views.append(lender.lend(size, dtype))
        assert views[-1].shape == size and views[-1].dtype == dtype and views[-1].numel() == 0
    # An empty view holds its buffer as any view does: one element of 2 bytes takes a third 2-byte buffer.
    one = lender.lend((1,), torch.bfloat16)
    assert one.shape == (1,) and lender.buffers == 4
    del views
    assert lender.lend((1,), torch.float16).data_ptr() != one.data_ptr() and lender.buffers == 4  # idle again


def test_fsdp_reduce_scatter_lends_its_input_not_its_output():
    # FSDP asks for the input (peers read it: lent) and then for the output (1/world of it), which
    # becomes the sharded gradients: that one must come from the caching allocator.
    from symmem.torch import fsdp

    rs = fsdp.SymmemReduceScatter.__new__(fsdp.SymmemReduceScatter)
    rs._input_numel = None
    comm = type("C", (), {"world": 2})()
    assert rs._lends((8,), comm)  # the first request: an input
    assert not rs._lends((4,), comm)  # its output
    assert rs._lends((6, 2), comm) and not rs._lends((6,), comm)
    assert rs._lends((5,), comm) and rs._lends((7,), comm)  # no pair: both lent (inputs)
