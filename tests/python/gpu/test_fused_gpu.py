"""symmem::all_gather_matmul on every rank's GPU, against torch.distributed (NCCL) + torch.matmul:
C within the rounding of the output type of a float32 reference on random data, and bit-exact on
small integers (exact in float32 in any order); the gathered A bit-exact; shards that are not whole
tiles, partial tiles in n and k, tiny shapes; back-to-back calls of changing shape; CUDA graph
replay after the inputs change in place; an input produced on another stream; one rank delayed by
a sleep kernel (its shards arrive late); a killed rank raising on the survivor."""
import os

import pytest
import torch
import torch.distributed as dist

import symmem.torch as st
from fused_cases import DTYPES, SHAPES, check_close
from fused_cases import random_tensor as _random
from fused_cases import shared_random as _shared_random


def _reference(a_shard, b):
    a = torch.empty(dist.get_world_size() * a_shard.shape[0], a_shard.shape[1], dtype=a_shard.dtype, device="cuda")
    dist.all_gather_into_tensor(a, a_shard)
    return a, a.float() @ b.float()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_nccl_and_matmul(group, shape, dtype):
    rows, n, k = shape
    a_shard = _random((rows, k), dtype, ("a", shape, dtype))
    b = _shared_random((k, n), dtype, ("b", shape, dtype))
    c, gathered = st.all_gather_matmul(a_shard, b, return_a=True)
    a, ref = _reference(a_shard, b)
    assert torch.equal(gathered, a), "the gathered A differs from NCCL's all-gather"
    check_close(c, ref, dtype, k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_integers_are_exact(group, dtype):
    rows, n, k = 384, 520, 1032
    a_shard = _random((rows, k), dtype, ("ai", dtype), integers=True)
    b = _shared_random((k, n), dtype, ("bi", dtype), integers=True)
    c, _ = st.all_gather_matmul(a_shard, b)
    _, ref = _reference(a_shard, b)
    assert torch.equal(c, ref.to(dtype)), f"{(c != ref.to(dtype)).sum().item()} elements differ"


def test_back_to_back_calls_of_changing_shape(group):
    dtype = torch.bfloat16
    cases = []
    for i, (rows, n, k) in enumerate([(256, 512, 1024), (200, 264, 520), (128, 1024, 256)]):
        a_shard = _random((rows, k), dtype, ("bb", i), integers=True)
        b = _shared_random((k, n), dtype, ("bbb", i), integers=True)
        cases.append((a_shard, b, _reference(a_shard, b)[1].to(dtype)))
    wrong = torch.zeros((), dtype=torch.int64, device="cuda")
    for call in range(600):
        a_shard, b, expected = cases[(call * 7 + call // 5) % len(cases)]
        c, _ = st.all_gather_matmul(a_shard, b)
        wrong += (c != expected).sum()
    assert wrong.item() == 0


def test_back_to_back_calls_that_fill_every_sm(group):
    """Enough tiles that the persistent GEMM holds every SM while it waits: anything it waits for
    that needs an SM (a copy within the GPU is a kernel) must be ahead of it in stream order, or
    the calls deadlock until the deadline (seen with the own shard's copy beside the GEMM). 4096
    rows per rank at every world size (own shard of two pieces), both tile widths (n = 4096 takes
    256, n = 6656 takes 192), and the shards alternate so that a stale slot shows as wrong data."""
    dtype = torch.float16
    rows, k = 4096, 2048
    cases = []
    for i, n in enumerate((4096, 6656, 4096, 6656)):
        a_shard = _random((rows, k), dtype, ("full", i), integers=True)
        b = _shared_random((k, n), dtype, ("fullb", n), integers=True)
        cases.append((a_shard, b, _reference(a_shard, b)[1].to(dtype)))
    wrong = torch.zeros((), dtype=torch.int64, device="cuda")
    for call in range(40):
        a_shard, b, expected = cases[call % len(cases)]
        c, _ = st.all_gather_matmul(a_shard, b)
        wrong += (c != expected).sum()
    torch.cuda.synchronize()
    st.GroupCommunicator().core.check()  # a deadline reached raises here, naming the wait
    assert wrong.item() == 0


def test_graph_replay_follows_inputs_changed_in_place(group):
    dtype = torch.float16
    rows, n, k = 256, 768, 512
    a_shard = _random((rows, k), dtype, ("g1",), integers=True)
    b = _shared_random((k, n), dtype, ("g2",), integers=True)
    st.all_gather_matmul(a_shard, b)  # eager first: the workspace exists before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c, _ = st.all_gather_matmul(a_shard, b)
    for replay in range(5):
        a_shard.copy_(_random((rows, k), dtype, ("g3", replay), integers=True))
        b.copy_(_shared_random((k, n), dtype, ("g4", replay), integers=True))
        c.fill_(float("nan"))
        graph.replay()
        expected = _reference(a_shard, b)[1].to(dtype)
        assert torch.equal(c, expected), f"replay {replay}: {(c != expected).sum().item()} elements differ"
    st.GroupCommunicator().core.check()


def test_input_produced_on_another_stream(group):
    dtype = torch.bfloat16
    rows, n, k = 512, 512, 2048
    b = _shared_random((k, n), dtype, ("s1",), integers=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # the producer is still running when the op is enqueued
        a_shard = _random((rows, k), dtype, ("s2",), integers=True)
    torch.cuda.current_stream().wait_stream(side)
    c, _ = st.all_gather_matmul(a_shard, b)
    a_shard.record_stream(torch.cuda.current_stream())
    assert torch.equal(c, _reference(a_shard, b)[1].to(dtype))


def test_a_delayed_rank_delivers_late_and_right(group):
    dtype = torch.float16
    rows, n, k = 1024, 1024, 1024
    b = _shared_random((k, n), dtype, ("d1",), integers=True)
    wrong = []  # checked after every rank's last call: a failed check must not leave peers waiting
    for slow in range(dist.get_world_size()):
        a_shard = _random((rows, k), dtype, ("d2", slow), integers=True)
        if dist.get_rank() == slow:
            torch.cuda._sleep(200_000_000)  # ~0.1 s: the other ranks' GEMMs wait for its shard
        c, _ = st.all_gather_matmul(a_shard, b)
        if not torch.equal(c, _reference(a_shard, b)[1].to(dtype)):
            wrong.append(slow)
    assert not wrong, f"wrong while these ranks were delayed: {wrong}"


def test_input_written_into_the_workspace_is_used_in_place(group):
    """a_shard in this rank's slot of the gather workspace (all_gather_matmul_input): no own copy,
    the same results; the slot rewritten between back-to-back calls, in stream order; then a shape
    large enough that the workspace grows, after which the first view is stale (it lies in the old
    workspace, which stays mapped) and is used again: still right, through the copy."""
    dtype = torch.float16
    rows, n, k = 512, 768, 1024
    world = dist.get_world_size()
    comm = st.GroupCommunicator()
    b = _shared_random((k, n), dtype, ("inplace-b",), integers=True)
    x = st.all_gather_matmul_input(rows, k, dtype)
    assert x.shape == (rows, k) and x.dtype == dtype and x.is_cuda
    workspace, capacity = comm.workspaces["all_gather_matmul:gather"]
    assert workspace <= x.data_ptr() < workspace + capacity  # in the slot: no copy before the GEMM
    wrong = torch.zeros((), dtype=torch.int64, device="cuda")
    for call in range(30):
        shard = _random((rows, k), dtype, ("inplace", call % 3), integers=True)
        x.copy_(shard)
        c, gathered = st.all_gather_matmul(x, b, return_a=True)
        a, ref = _reference(shard, b)
        wrong += (gathered != a).sum() + (c != ref.to(dtype)).sum()
        if call == 10:  # a shape whose gather does not fit: the workspace grows and x becomes stale
            big_rows = capacity // (k * 2 * world) + 512
            big = st.all_gather_matmul_input(big_rows, k, dtype)
            grown, grown_capacity = comm.workspaces["all_gather_matmul:gather"]
            assert grown_capacity > capacity and not grown <= x.data_ptr() < grown + grown_capacity, \
                "the workspace did not grow: x is not stale and the case tests nothing"
            big.copy_(_random((big_rows, k), dtype, "inplace-big", integers=True))
            c2, _ = st.all_gather_matmul(big, b)
            wrong += (c2 != _reference(big.clone(), b)[1].to(dtype)).sum()
            del big, c2
    assert wrong.item() == 0


def test_killed_rank_during_all_gather_matmul_raises_naming_it(group, tmp_path):
    from conftest import run_killed_rank_job
    run_killed_rank_job(group, os.path.join(os.path.dirname(__file__), "fused_kill_worker.py"), tmp_path)
