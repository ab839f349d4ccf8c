"""symmem::matmul_reduce_scatter on every rank's GPU, against torch.matmul + torch.distributed (NCCL)
reducing float32 products: within the rounding of the output type on random data; bit-exact on
small integers (float32 sums of them are exact in any order); the same bits on every repeat; shards
that are not whole tiles, partial tiles in n and k, tiny shapes; back-to-back calls of changing
shape interleaved with all_gather_matmul (their counters and flags share a pad); enough tiles to
fill every SM; CUDA graph replay after the inputs change in place; an input produced on another
stream; one rank delayed by a sleep kernel (its partial sums arrive late); a killed rank raising on
the survivor."""
import os

import pytest
import torch
import torch.distributed as dist

import symmem.torch as st
from fused_cases import DTYPES, SHAPES, check_close
from fused_cases import random_tensor as _random


def _inputs(rows, n, k, dtype, case, integers=False):
    world = dist.get_world_size()
    return _random((rows * world, k), dtype, ("a", case), integers), _random((k, n), dtype, ("b", case), integers)


def _reference(a, b):
    """This rank's rows of the float32 sum over ranks of a @ b."""
    world = dist.get_world_size()
    out = torch.empty(a.shape[0] // world, b.shape[1], device="cuda", dtype=torch.float32)
    dist.reduce_scatter_tensor(out, a.float() @ b.float())
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_nccl_and_matmul(group, shape, dtype):
    rows, n, k = shape
    a, b = _inputs(rows, n, k, dtype, (shape, dtype))
    c = st.matmul_reduce_scatter(a, b)
    assert c.shape == (rows, n) and c.dtype == dtype
    check_close(c, _reference(a, b), dtype, k * dist.get_world_size())
    again = st.matmul_reduce_scatter(a, b)
    assert torch.equal(again, c), "two calls on the same inputs differ: the sum is not deterministic"


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_integers_are_exact(group, dtype):
    rows, n, k = 384, 520, 1032
    a, b = _inputs(rows, n, k, dtype, ("ints", dtype), integers=True)
    c = st.matmul_reduce_scatter(a, b)
    expected = _reference(a, b).to(dtype)
    assert torch.equal(c, expected), f"{(c != expected).sum().item()} elements differ"


def test_back_to_back_calls_of_changing_shape_beside_all_gather_matmul(group):
    dtype = torch.bfloat16
    cases = []
    for i, (rows, n, k) in enumerate([(256, 512, 1024), (200, 264, 520), (128, 1024, 256)]):
        a, b = _inputs(rows, n, k, dtype, ("bb", i), integers=True)
        cases.append((a, b, _reference(a, b).to(dtype)))
    gather_a = _random((64, 256), dtype, "ga", integers=True)
    gather_b = _random((256, 128), dtype, "gb", integers=True)
    gathered = torch.empty(64 * dist.get_world_size(), 256, device="cuda", dtype=dtype)
    dist.all_gather_into_tensor(gathered, gather_a)
    gather_b_all = gather_b.clone()
    dist.broadcast(gather_b_all, 0)
    gather_expected = (gathered.float() @ gather_b_all.float()).to(dtype)
    wrong = torch.zeros((), dtype=torch.int64, device="cuda")
    for call in range(600):
        a, b, expected = cases[(call * 7 + call // 5) % len(cases)]
        wrong += (st.matmul_reduce_scatter(a, b) != expected).sum()
        if call % 3 == 0:
            wrong += (st.all_gather_matmul(gather_a, gather_b_all)[0] != gather_expected).sum()
    assert wrong.item() == 0


def test_back_to_back_calls_that_fill_every_sm(group):
    """4096 rows of C per rank at every world size, both tile widths (n = 4096 takes 256, n = 6656
    takes 192): the GEMM holds every SM while the copies wait for its counters."""
    dtype = torch.float16
    rows, k = 4096, 2048
    cases = []
    for i, n in enumerate((4096, 6656)):
        a, b = _inputs(rows, n, k, dtype, ("full", i), integers=True)
        cases.append((a, b, _reference(a, b).to(dtype)))
    wrong = torch.zeros((), dtype=torch.int64, device="cuda")
    for call in range(20):
        a, b, expected = cases[call % len(cases)]
        wrong += (st.matmul_reduce_scatter(a, b) != expected).sum()
    torch.cuda.synchronize()
    st.GroupCommunicator().core.check()
    assert wrong.item() == 0


def test_graph_replay_follows_inputs_changed_in_place(group):
    dtype = torch.float16
    rows, n, k = 256, 768, 512
    a, b = _inputs(rows, n, k, dtype, "g", integers=True)
    st.matmul_reduce_scatter(a, b)  # eager first: the workspace exists before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = st.matmul_reduce_scatter(a, b)
    wrong = {}  # checked after every rank's last replay: a failed check must not leave peers waiting
    for replay in range(5):
        new_a, new_b = _inputs(rows, n, k, dtype, ("g", replay), integers=True)
        a.copy_(new_a)
        b.copy_(new_b)
        c.fill_(float("nan"))
        graph.replay()
        expected = _reference(a, b).to(dtype)
        if not torch.equal(c, expected):
            wrong[replay] = (c != expected).sum().item()
    assert not wrong, f"elements that differ, per replay: {wrong}"
    st.GroupCommunicator().core.check()


def test_input_produced_on_another_stream(group):
    dtype = torch.bfloat16
    rows, n, k = 512, 512, 2048
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # the producer is still running when the op is enqueued
        a, b = _inputs(rows, n, k, dtype, "s", integers=True)
    torch.cuda.current_stream().wait_stream(side)
    c = st.matmul_reduce_scatter(a, b)
    a.record_stream(torch.cuda.current_stream())
    b.record_stream(torch.cuda.current_stream())
    assert torch.equal(c, _reference(a, b).to(dtype))


def test_a_delayed_rank_delivers_late_and_right(group):
    dtype = torch.float16
    rows, n, k = 1024, 1024, 1024
    wrong = []  # checked after every rank's last call: a failed check must not leave peers waiting
    for slow in range(dist.get_world_size()):
        a, b = _inputs(rows, n, k, dtype, ("d", slow), integers=True)
        if dist.get_rank() == slow:
            torch.cuda._sleep(200_000_000)  # ~0.1 s: the other ranks wait for its partial sums
        c = st.matmul_reduce_scatter(a, b)
        if not torch.equal(c, _reference(a, b).to(dtype)):
            wrong.append(slow)
    assert not wrong, f"wrong while these ranks were delayed: {wrong}"


def test_killed_rank_during_matmul_reduce_scatter_raises_naming_it(group, tmp_path):
    from conftest import run_killed_rank_job
    worker = os.path.join(os.path.dirname(__file__), "fused_kill_worker.py")
    run_killed_rank_job(group, worker, tmp_path, extra_args=["matmul_reduce_scatter"])


def test_calls_on_two_streams_ordered_by_events(group):
    """Consecutive calls must be ordered (every fused call shares the communicator's counters and
    side streams): here by events between two streams, as torch code does across streams."""
    dtype = torch.bfloat16
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    cases = [_inputs(256, 512, 1024, dtype, ("streams", i), integers=True) for i in range(2)]
    expected = [_reference(a, b).to(dtype) for a, b in cases]
    torch.cuda.synchronize()
    wrong = torch.zeros((), dtype=torch.int64, device="cuda")
    for call in range(50):  # no host wait in the loop: the calls queue up, ordered only by events
        stream = first if call % 2 == 0 else second
        stream.wait_stream(second if call % 2 == 0 else first)
        with torch.cuda.stream(stream):
            a, b = cases[call % 2]
            c = st.matmul_reduce_scatter(a, b)
            wrong += (c != expected[call % 2]).sum()
        for t in (a, b, c, wrong, expected[call % 2]):
            t.record_stream(stream)
    torch.cuda.synchronize()
    assert wrong.item() == 0


def test_ranks_calling_different_shapes_all_raise(group):
    """n differs between ranks: the call's signature differs, so the ready handshake fails on every
    rank (kMismatch where it is seen, kAborted where the other rank's record came first), at the
    next check(), instead of summing partial products of different shapes. Its own group: the
    communicator is unusable afterwards."""
    import symmem
    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 2:
        pytest.skip("needs two ranks: a mismatch is between ranks")
    sub = dist.new_group(list(range(world)))
    n = 512 if rank == 0 else 520
    a = _random((256 * world, 512), torch.float16, "mismatch")
    b = _random((512, n), torch.float16, ("mismatch", n))
    with pytest.raises(symmem.SymmemError) as raised:
        st.matmul_reduce_scatter(a, b, group=sub)
        torch.cuda.synchronize()
        st.GroupCommunicator(sub).core.check()
    assert raised.value.code in ("kMismatch", "kAborted"), (raised.value.code, str(raised.value))
    dist.barrier()


def test_back_to_back_with_copy_engine_all_gathers(group):
    """The piece waits share the copy-engine watchdog's wait word, the board's handshake words and
    the side streams with the copy-engine all-gather: 300 rounds of both, alternating shapes, with no
    host wait between calls."""
    from symmem import _native
    core = st.GroupCommunicator().core
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = torch.bfloat16
    cases = []
    for i, (rows, n, k) in enumerate([(256, 512, 1024), (200, 264, 520)]):
        a, b = _inputs(rows, n, k, dtype, ("ce", i), integers=True)
        cases.append((a, b, _reference(a, b).to(dtype)))
    gathers = []
    for i, count in enumerate((4096, 1 << 20)):
        x = _random((count,), dtype, ("ceg", i), integers=True)
        expected = torch.empty(world * count, dtype=dtype, device="cuda")
        dist.all_gather_into_tensor(expected, x)
        gathers.append((x, torch.empty_like(expected), expected))
    algo = _native.algo_code("copy_engine")
    stream = torch.cuda.current_stream().cuda_stream
    wrong = torch.zeros((), dtype=torch.int64, device="cuda")
    for call in range(300):
        a, b, expected = cases[call % 2]
        wrong += (st.matmul_reduce_scatter(a, b) != expected).sum()
        x, out, gathered = gathers[(call // 2) % 2]
        out.fill_(float("nan"))
        core.all_gather(out.data_ptr(), x.data_ptr(), x.numel(), _native.DTYPES["bfloat16"], stream, algo=algo)
        wrong += (out != gathered).sum()
    torch.cuda.synchronize()
    core.check()
    assert wrong.item() == 0, f"rank {rank}: {wrong.item()} wrong elements"


def test_one_graph_of_several_fused_calls(group):
    """Two matmul_reduce_scatter calls of different shapes and an all_gather_matmul in one CUDA
    graph (their counters, flags and handshakes follow one another inside it), replayed after eager
    calls with the inputs changed in place."""
    dtype = torch.float16
    world = dist.get_world_size()
    a1, b1 = _inputs(256, 768, 512, dtype, "graph1", integers=True)
    a2, b2 = _inputs(200, 264, 520, dtype, "graph2", integers=True)
    x = _random((128, 256), dtype, "graphx", integers=True)
    w = _random((256, 384), dtype, "graphw", integers=True)
    dist.broadcast(w, 0)
    for _ in range(2):  # eager first: the workspaces exist before capture
        st.matmul_reduce_scatter(a1, b1), st.matmul_reduce_scatter(a2, b2), st.all_gather_matmul(x, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c1 = st.matmul_reduce_scatter(a1, b1)
        g, _ = st.all_gather_matmul(x, w)
        c2 = st.matmul_reduce_scatter(a2, b2)
    for replay in range(5):
        for t, new in ((a1, _inputs(256, 768, 512, dtype, ("graph1", replay), integers=True)[0]),
                       (a2, _inputs(200, 264, 520, dtype, ("graph2", replay), integers=True)[0]),
                       (x, _random((128, 256), dtype, ("graphx", replay), integers=True))):
            t.copy_(new)
        for out in (c1, c2, g):
            out.fill_(float("nan"))
        graph.replay()
        gathered = torch.empty(world * 128, 256, dtype=dtype, device="cuda")
        dist.all_gather_into_tensor(gathered, x)
        assert torch.equal(c1, _reference(a1, b1).to(dtype)), f"replay {replay}: first reduce-scatter"
        assert torch.equal(c2, _reference(a2, b2).to(dtype)), f"replay {replay}: second reduce-scatter"
        assert torch.equal(g, (gathered.float() @ w.float()).to(dtype)), f"replay {replay}: all-gather matmul"
    st.GroupCommunicator().core.check()
