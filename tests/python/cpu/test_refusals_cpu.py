"""Refusals (docs/design.md, "Refusals"): a check of one rank's tensors that fails makes every rank
raise the same error at once, instead of the peers waiting in the call until their deadline.

The CUDA kernels refuse through the core (checked here against a recording core: which checks
refuse, which stay plain errors of the calling rank); the CPU (gloo) kernels of the all-to-all
agree on their checks over torch.distributed before anything moves (checked on two processes)."""
import datetime
import time
import types

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from test_moe_cpu import _run  # noqa: E402  the gloo harness: one process per rank, a bounded join


class _RefusingCore:
    """A core whose refuse_call records the call and returns the error the core would (the message
    from the C ABI), and which records the collectives it is asked to run."""

    def __init__(self, rank=0):
        self.calls = []
        self.rank = rank

    def refuse(self, op, code, message, stream):
        from symmem import _native
        from symmem.errors import SymmemError
        self.calls.append(("refuse", op, stream))
        return SymmemError(code, _native.refusal_message(op, self.rank, code, message))

    def __getattr__(self, name):  # all_reduce, all_gather, ...: recorded, not run
        return lambda *args, **kwargs: self.calls.append((name,) + args)


@pytest.fixture
def refusing_group(fake_group, monkeypatch):
    comm = fake_group("fake-refusals", 2, stream=7)
    comm.core = _RefusingCore()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=7))
    return comm


def _refused(comm, op, call, error_type, cause):
    """`call` raises `error_type` (the op's documented type) that is also a SymmemError
    kInvalidArgument naming this rank and `cause`, after one refusal of `op` on the call's stream."""
    from symmem.errors import SymmemError
    before = len(comm.core.calls)
    with pytest.raises(error_type, match=f"symmem.{op}: rank 0 refused the call: .*{cause}") as raised:
        call()
    assert isinstance(raised.value, SymmemError) and raised.value.code == "kInvalidArgument"
    assert comm.core.calls[before:] == [("refuse", f"symmem.{op}", 7)], comm.core.calls[before:]


def test_route_checks_of_one_ranks_tensors_refuse_the_call(refusing_group):
    comm = refusing_group
    from symmem.torch import ops
    x = torch.zeros(4, 6)
    name = comm.group_name
    # Layouts (the eager fast path's slow branch, and the out= forms) and shapes of one rank's tensors.
    _refused(comm, "all_reduce", lambda: ops._all_reduce_inplace_cuda(x.t(), "sum", name), ValueError,
             "input must be contiguous")
    _refused(comm, "all_reduce", lambda: ops._all_reduce_out_cuda(x, "sum", name, out=torch.zeros(6, 4).t()),
             ValueError, "out must be contiguous")
    _refused(comm, "all_reduce", lambda: ops._all_reduce_out_cuda(x, "sum", name, out=torch.zeros(5)),
             ValueError, "output has 5 elements")
    _refused(comm, "all_reduce", lambda: ops._all_reduce_out_cuda(x, "sum", name, out=torch.zeros(24).half()),
             TypeError, "output dtype torch.float16 differs")
    _refused(comm, "all_gather_into_tensor",
             lambda: ops._all_gather_out_cuda(x[:, ::2], name, out=torch.zeros(8, 3)), ValueError,
             "input must be contiguous")
    _refused(comm, "all_gather_into_tensor", lambda: ops._all_gather_out_cuda(x, name, out=torch.zeros(7, 6)),
             ValueError, "output has 42 elements")
    _refused(comm, "all_gather", lambda: ops._all_gather_list_cuda(x.t(), name, [torch.zeros(6, 4)] * 2),
             ValueError, "input must be contiguous")
    _refused(comm, "reduce_scatter_tensor",
             lambda: ops._reduce_scatter_out_cuda(x, "sum", name, out=torch.zeros(4, 6)[:, ::2]), ValueError,
             "out must be contiguous")
    _refused(comm, "reduce_scatter_tensor", lambda: ops._reduce_scatter_out_cuda(x, "sum", name, out=torch.zeros(5)),
             ValueError, "input has 24 elements, output 5")
    # The all-to-all: a 0-dim input is refused too (it raised an unpacking error on this rank alone).
    from symmem.torch import all_to_all
    _refused(comm, "all_to_all_single", lambda: all_to_all._all_to_all_single_cuda(torch.tensor(1.0), None, None, name),
             ValueError, "same row shape")


def test_fused_checks_of_one_ranks_tensors_refuse_the_call(refusing_group):
    comm = refusing_group
    from symmem.torch import fused
    half = torch.float16
    b = torch.zeros(16, 8, dtype=half)
    _refused(comm, "all_gather_matmul",
             lambda: fused._all_gather_matmul_cuda(torch.zeros(16, 4, dtype=half).t(), b, comm.group_name),
             ValueError, "a_shard must be contiguous")
    _refused(comm, "matmul_reduce_scatter",
             lambda: fused._matmul_reduce_scatter_cuda(torch.zeros(16, 4, dtype=half).t(), b, comm.group_name),
             ValueError, "a must be contiguous")


def test_agreed_arguments_stay_plain_errors_and_valid_calls_refuse_nothing(refusing_group):
    # What every rank passes alike (dtype, reduce op, the fused ops' shape) every rank raises alike:
    # the communicator stays usable, nothing is refused.
    comm = refusing_group
    from symmem.errors import SymmemError
    from symmem.torch import fused, ops
    x = torch.zeros(4, 6)
    half = torch.float16
    for call, error_type in (
            (lambda: ops._all_reduce_inplace_cuda(x.double(), "sum", comm.group_name), TypeError),
            (lambda: ops._all_reduce_inplace_cuda(x, "prod", comm.group_name), ValueError),
            (lambda: ops._all_reduce_inplace_cuda(x.int(), "avg", comm.group_name), TypeError),
            (lambda: ops._reduce_scatter_out_cuda(x.double(), "sum", comm.group_name, out=torch.zeros(12)), TypeError),
            (lambda: fused._all_gather_matmul_cuda(torch.zeros(4, 8, dtype=half), torch.zeros(16, 8, dtype=half),
                                                   comm.group_name), ValueError),
            (lambda: fused._matmul_reduce_scatter_cuda(torch.zeros(3, 16, dtype=half), torch.zeros(16, 8, dtype=half),
                                                       comm.group_name), ValueError)):
        with pytest.raises(error_type) as raised:
            call()
        assert not isinstance(raised.value, SymmemError), raised.value
    assert comm.core.calls == []
    ops._all_reduce_inplace_cuda(x, "sum", comm.group_name)
    ops._all_gather_out_cuda(x, comm.group_name, out=torch.zeros(8, 6))
    assert [c[0] for c in comm.core.calls] == ["all_reduce", "all_gather"]


# The CPU (gloo) all-to-all kernels: every rank learns every rank's verdict before anything moves.

_TIMEOUT_S = 20  # the test group's gloo timeout: a rank left waiting would raise after it, not at once


def _a2a_cpu_refusals(rank, world, group_name):
    from symmem.errors import SymmemError
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=_TIMEOUT_S))
    name = group.group_name
    bad = world - 1
    base = torch.arange(2 * world * 8, dtype=torch.float32).view(2 * world, 8)
    x = base + 100 * rank  # 2 rows for each rank
    oso = torch.full((2, world), -7, dtype=torch.int64)

    def raises_on_every_rank(call, code, text, refused_here):
        out_before = oso.clone()
        start = time.monotonic()
        with pytest.raises(SymmemError) as raised:
            call()
        took = time.monotonic() - start
        message = str(raised.value)
        assert took < _TIMEOUT_S / 4, f"rank {rank} raised after {took:.1f} s: {message}"
        assert raised.value.code == code, message
        assert text in message, message
        assert isinstance(raised.value, ValueError) == refused_here, (rank, type(raised.value))
        assert torch.equal(oso, out_before), "a refused call wrote its outputs"
        # Every rank raised the same message: nothing of the call is left in flight on the group.
        messages = [None] * world
        dist.all_gather_object(messages, message, group=group)
        assert messages == [message] * world, messages

    # all_to_all_single: the last rank's input_split_sizes add up to more rows than its input.
    ins = [2] * world if rank != bad else [4] * world
    raises_on_every_rank(lambda: torch.ops.symmem.all_to_all_single(x, [2] * world, ins, name), "kInvalidArgument",
                         f"symmem.all_to_all_single: rank {bad} refused the call: ", rank == bad)
    # all_to_all_vdev: the last rank's in_splits are wrong (more rows than its input; a dtype).
    splits = torch.tensor([1] * world)
    raises_on_every_rank(lambda: torch.ops.symmem.all_to_all_vdev(
        x, torch.zeros(4 * world, 8), splits if rank != bad else torch.tensor([3] * world), oso, name),
        "kInvalidArgument", f"symmem.all_to_all_vdev: rank {bad} refused the call: ", rank == bad)
    raises_on_every_rank(lambda: torch.ops.symmem.all_to_all_vdev_2d(
        x, torch.zeros(4 * world, 8), splits if rank != bad else torch.tensor([1] * (world + 1)),
        torch.full((2, world), -7, dtype=torch.int64) if rank != bad else torch.zeros(2, world + 1, dtype=torch.int64),
        name), "kInvalidArgument", f"symmem.all_to_all_vdev_2d: rank {bad} refused the call: ", rank == bad)
    # all_to_all_vdev: rank 0's output cannot hold what the others send it (a capacity verdict, as
    # the core's: SymmemError kCapacity naming it on every rank, and no row moves).
    out = torch.full((4 * world, 8), -1.0) if rank != 0 else torch.full((2, 8), -1.0)
    sends = torch.tensor([2] * world)
    raises_on_every_rank(lambda: torch.ops.symmem.all_to_all_vdev(x, out, sends, oso, name), "kCapacity",
                         f"rank 0 would receive {2 * world} rows, its output holds 2", False)
    assert (out == -1).all(), "a call refused for capacity moved rows"
    # The group still works: a valid call afterwards moves every rank's rows.
    got = torch.ops.symmem.all_to_all_single(x, [2] * world, [2] * world, name)
    assert torch.equal(got, torch.cat([base[2 * rank:2 * rank + 2] + 100 * s for s in range(world)]))
    dist.destroy_process_group(group)


@pytest.mark.parametrize("world", [2])
def test_cpu_all_to_all_checks_fail_on_every_rank_at_once(world):
    _run(world, _a2a_cpu_refusals)
