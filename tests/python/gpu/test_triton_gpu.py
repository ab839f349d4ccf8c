"""symmem.triton's examples across real GPUs, one process per GPU (tests/python/gpu/run.sh 2 -k triton):
the one-shot all-reduce bit-exact against the fp32 sum in rank order (from NCCL's gather of the
inputs) and against symmem's CUDA one-shot, NCCL's all-reduce within the rounding bound of its
order; the
all-gather, pull and push, bit-exact against NCCL's; the examples' torch ops; CUDA graph replays
after the inputs change in place; a killed rank named in time (triton_kill_worker.py).

Outputs are poisoned before every call (NaN, or a value no input holds), so a call that writes
nothing, or misses a tile, fails. Every tensor is read on the stream that ran the kernel. Ranks
note what is wrong and fail together after their last collective (_fail_together), so that no rank
leaves a test while its peers still wait in one. The kernels reach peers through the heap of one
node: a group that spans nodes (SYMMEM_NODE_SIZE) is skipped, as symmem.triton.launch refuses it."""
import os
import zlib

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("triton", reason="symmem.triton needs Triton")

import symmem.torch as st  # noqa: E402
from reduction_checks import ANY, SYMMEM, gathered, problems  # noqa: E402
from symmem import _native  # noqa: E402
from symmem.triton.examples import all_gather, one_shot_all_reduce  # noqa: E402  (and torch.ops.symmem_triton.*)

SUMMED = [torch.float32, torch.float16, torch.bfloat16, torch.int32]
# Blocks are 8 KiB of elements (2048 fp32, 4096 fp16): 3, 4099, 65541 and 2**20 + 3 end in a
# partial block, 2**16 fills whole ones (and is a second Triton specialisation: n % 16 == 0).
SIZES = [3, 4099, 1 << 16, 65541, (1 << 20) + 3]
ONE_SHOT = _native.algo_code("one_shot")
BYTE_POISON = 255  # what no uint8 input holds (_random draws 0..254)


def _random(n, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    high = BYTE_POISON if dtype == torch.uint8 else 1 << 20
    return torch.randint(0 if dtype == torch.uint8 else -high, high, (n,), generator=g, device="cuda", dtype=dtype)


def _seed(case):
    # Reproducible across runs (str hashes are salted per process), different on every rank.
    return zlib.crc32(repr((case, dist.get_rank())).encode()) & 0x7FFFFFFF


def _poisoned(n, dtype, out=None, second=False):
    """`out` (or a new tensor of n elements) filled with poison: NaN (second: inf), 255 for bytes (no
    input byte is 255), -7 for int32 (second: -9). Two outputs poisoned differently that a call
    should both have written still differ if neither was."""
    out = torch.empty(n, dtype=dtype, device="cuda") if out is None else out
    if dtype.is_floating_point:
        return out.fill_(float("inf") if second else float("nan"))
    return out.fill_(BYTE_POISON if dtype == torch.uint8 else -9 if second else -7)


def _same_bits(a, b):
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(as_int), b.view(as_int))


def _communicator(group):
    comm = st.GroupCommunicator(group)
    if comm.nodes > 1:
        pytest.skip(f"symmem.triton's kernels reach the ranks of one node through its heap; this group spans "
                    f"{comm.nodes} nodes")
    return comm


_heaps = {}


def _heap(comm, purpose, numel, dtype):
    """A symmetric tensor made once per communicator, purpose, size and dtype (heap memory returns
    only when the communicator is released: buffers are made once and reused). Every rank asks for
    the same ones in the same order, so the collective allocations match."""
    key = (id(comm), purpose, numel, dtype)  # the tensor keeps comm alive: its id is not reused
    if key not in _heaps:
        _heaps[key] = st.empty(numel, dtype=dtype, group=comm.group)
    return _heaps[key]


def _sum_problems(got, x, what):
    """What is wrong with `got` as the sum over ranks of x: it must be symmem's order (the fp32 sum
    in rank order, rounded once) bit for bit, and NCCL's sum (another order, rounded at every step)
    within the rounding bound of any order (reduction_checks, symmem.testing). Collective."""
    parts = gathered(x)
    nccl = x.clone()
    dist.all_reduce(nccl)
    return problems(got, parts, SYMMEM, what=f"{what}: symmem's order") + problems(nccl, parts, ANY,
                                                                                 what=f"{what}: NCCL")


def _fail_together(problems):
    """Fails on every rank when any rank found a problem, each listing its own; collective, so that
    the ranks stay in step for the next test."""
    count = torch.tensor([len(problems)], device="cuda")
    dist.all_reduce(count)
    assert count.item() == 0, f"{count.item()} problems over the ranks; rank {dist.get_rank()}'s: {problems[:8]}"


def _cuda_one_shot(comm, x):
    """symmem's CUDA one-shot all-reduce of x (the algorithm forced: the torch ops let the planner
    choose) into a fresh tensor, poisoned unlike the Triton call's output."""
    out = _poisoned(x.numel(), x.dtype, second=True)
    dtype = _native.DTYPES[str(x.dtype).replace("torch.", "")]
    plan = comm.core.describe("all_reduce", out.data_ptr(), x.data_ptr(), x.numel(), dtype, ONE_SHOT)
    assert plan.split()[0] == "one_shot", plan
    comm.core.all_reduce(out.data_ptr(), x.data_ptr(), x.numel(), dtype, _native.REDUCE_OPS["sum"],
                         torch.cuda.current_stream().cuda_stream, ONE_SHOT)
    return out


@pytest.mark.parametrize("dtype", SUMMED, ids=str)
def test_one_shot_all_reduce_against_nccl(group, dtype):
    comm = _communicator(group)
    heap = _heap(comm, "all_reduce", max(SIZES), dtype)
    problems = []
    for n in SIZES:
        for programs in (None, 3):  # the wrapper's grid (up to 24), and 3 programs looping over blocks
            x = heap[:n]
            x.copy_(_random(n, dtype, _seed(("one_shot", n, programs, str(dtype)))))
            out = one_shot_all_reduce(x, comm, out=_poisoned(n, dtype), programs=programs)
            problems += _sum_problems(out, x, f"n={n} programs={programs}")
    comm.check()
    _fail_together(problems)


@pytest.mark.parametrize("dtype", SUMMED, ids=str)
def test_one_shot_all_reduce_is_symmems_cuda_one_shot(group, dtype):
    # The whole buffer (n = max(SIZES)) runs the CUDA one-shot zero-copy; views of it, staged.
    comm = _communicator(group)
    heap = _heap(comm, "all_reduce", max(SIZES), dtype)
    problems = []
    for n in SIZES:
        x = heap[:n]
        x.copy_(_random(n, dtype, _seed(("versus_cuda", n, str(dtype)))))
        ours = one_shot_all_reduce(x, comm, out=_poisoned(n, dtype))
        theirs = _cuda_one_shot(comm, x)
        if not _same_bits(ours, theirs):  # (poisoned unlike each other: two untouched outputs differ too)
            problems.append(f"n={n}: differs from the CUDA one-shot at {(ours != theirs).sum().item()} elements")
    comm.check()
    _fail_together(problems)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8], ids=str)
@pytest.mark.parametrize("mode", ["pull", "push"])
def test_all_gather_bit_exact(group, mode, dtype):
    # Pull reads peers' inputs (symmetric) into an ordinary output; push stores an ordinary input
    # into every peer's output (symmetric).
    comm = _communicator(group)
    world = dist.get_world_size()
    heap = _heap(comm, f"all_gather_{mode}", max(SIZES) * (1 if mode == "pull" else world), dtype)
    problems = []
    for programs in (1, 4, 16):
        for n in SIZES:
            x = heap[:n] if mode == "pull" else torch.empty(n, dtype=dtype, device="cuda")
            x.copy_(_random(n, dtype, _seed(("all_gather", mode, programs, n, str(dtype)))))
            out = _poisoned(world * n, dtype, None if mode == "pull" else heap[:world * n])
            all_gather(x, comm, out=out, programs=programs, mode=mode)
            expected = torch.empty(world * n, dtype=dtype, device="cuda")
            dist.all_gather_into_tensor(expected, x)
            if not _same_bits(out, expected):
                wrong = (out.view(world, n) != expected.view(world, n)).sum(1).tolist()
                problems.append(f"programs={programs} n={n}: elements wrong per source rank {wrong}")
    comm.check()
    _fail_together(problems)


def test_torch_ops(group):
    # torch.ops.symmem_triton.* take the group's name and find its communicator.
    comm = _communicator(group)
    g, world, n = group.group_name, dist.get_world_size(), 5003
    x = _heap(comm, "ops_in", n, torch.bfloat16)
    x.copy_(_random(n, torch.bfloat16, _seed("ops")))
    problems = _sum_problems(torch.ops.symmem_triton.one_shot_all_reduce(x, g), x, "one_shot_all_reduce op")
    expected = torch.empty(world * n, dtype=torch.bfloat16, device="cuda")
    dist.all_gather_into_tensor(expected, x)
    if not _same_bits(torch.ops.symmem_triton.all_gather(x, g, 4), expected):
        problems.append("all_gather op (pull) differs from NCCL")
    out = _poisoned(world * n, torch.bfloat16, _heap(comm, "ops_out", world * n, torch.bfloat16))
    torch.ops.symmem_triton.all_gather_into(out, x.clone(), g, 4, "push")
    if not _same_bits(out, expected):
        problems.append("all_gather_into op (push) differs from NCCL")
    comm.check()
    _fail_together(problems)


def test_graph_replays_after_inputs_change(group):
    # Two calls in one graph (the kernels advance their epochs on the device at every replay), 200
    # replays with new inputs written in place before each, then an eager call after them.
    comm = _communicator(group)
    (na, da), (nb, db) = (100003, torch.bfloat16), (4099, torch.float32)
    a, b = _heap(comm, "graph_a", na, da), _heap(comm, "graph_b", nb, db)
    out_a, out_b = _poisoned(na, da), _poisoned(nb, db)
    for t in (a, b):
        t.copy_(_random(t.numel(), t.dtype, _seed(("graph_warm", t.numel()))))
    # Eager first: Triton compiles and the communicator makes its sync context outside capture.
    one_shot_all_reduce(a, comm, out=out_a)
    one_shot_all_reduce(b, comm, out=out_b)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        one_shot_all_reduce(a, comm, out=out_a)
        one_shot_all_reduce(b, comm, out=out_b)
    problems = []
    for i in range(200):
        # In place, on the stream that replays: each replay's barrier 1 let no peer read a or b past
        # the replay's end on this rank.
        a.copy_(_random(na, da, _seed(("graph", i, "a"))))
        b.copy_(_random(nb, db, _seed(("graph", i, "b"))))
        _poisoned(na, da, out_a)
        _poisoned(nb, db, out_b)
        graph.replay()
        problems += _sum_problems(out_a, a, f"replay {i} bf16") + _sum_problems(out_b, b, f"replay {i} fp32")
    a.copy_(_random(na, da, _seed("after_graph")))
    problems += _sum_problems(one_shot_all_reduce(a, comm, out=_poisoned(na, da)), a, "the eager call after")
    torch.cuda.synchronize()
    del graph
    comm.check()
    _fail_together(problems)


def test_killed_rank_is_named_in_time(group, tmp_path):
    # triton_kill_worker.py: two ranks loop over the Triton one-shot; rank 1 kills itself after 200
    # calls. run_killed_rank_job checks that rank 0 raised kTimeout or kAborted naming rank 1; the
    # worker also writes how long rank 0 took from its last good call to the raise.
    from conftest import run_killed_rank_job
    seconds_file = tmp_path / "seconds.txt"
    run_killed_rank_job(group, os.path.join(os.path.dirname(__file__), "triton_kill_worker.py"), tmp_path,
                        extra_args=[str(seconds_file)])
    if dist.get_rank() == 0:
        assert seconds_file.exists(), "the survivor wrote no time"
        seconds, timeout_ms = seconds_file.read_text().split()
        assert float(seconds) < int(timeout_ms) / 1000 + 3.0, \
            f"rank 0 raised {float(seconds):.1f} s after its last good call (timeout {timeout_ms} ms)"
