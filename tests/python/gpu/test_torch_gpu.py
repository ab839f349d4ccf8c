"""symmem.torch against torch.distributed (NCCL) on every rank's GPU: gathers bit-exact against
NCCL's; reductions bit-exact against symmem's documented order (fp32 sums in rank order, rounded
once: the same bits on every rank) and NCCL's on the same inputs within the rounding bound of any
order (reduction_checks, symmem.testing); odd sizes, views with offsets, in-place gathers,
symmetric tensors and the pool, CUDA graphs replayed after inputs change in place, torch.compile,
the drop-in functions, a destroyed group refused, TPAllReduce, and a killed rank raising on the
survivor. Shapes derive from the world size, so every test runs at 2, 3, 4 and 8 ranks."""
import os
import zlib

import pytest
import torch
import torch.distributed as dist

import symmem.torch as st
from reduction_checks import ANY, SYMMEM, check_reduce_scatter, check_reduction, fail_together, gathered, problems
from reduction_checks import scattered_parts
from symmem.torch import functional

ops = torch.ops.symmem
REDUCIBLE = [torch.bfloat16, torch.float16, torch.float32, torch.int32]
SIZES = [1, 7, 1000, 4099, 65537, (1 << 20) + 3]


def _random(n, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    return torch.randint(-(1 << 20), 1 << 20, (n,), generator=g, device="cuda", dtype=dtype)


def _seed(case):
    # Reproducible across runs (str hashes are salted per process), different on every rank.
    return zlib.crc32(repr((case, dist.get_rank())).encode()) & 0x7FFFFFFF


def _same_on_every_rank(t):
    """The bytes of t on every rank equal rank 0's."""
    every = gathered(t.contiguous().view(torch.uint8).view(-1))
    return all(torch.equal(every[0], c) for c in every)


NCCL_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _check_reduction(got, inp, reduce_op="sum"):
    """got is symmem's all-reduce of every rank's inp: bit for bit its documented order; and NCCL's
    all-reduce of the same inputs lies within the rounding bound of its own order (what a tolerance
    against NCCL may allow: at 3+ ranks the two orders differ in the last bits). Collective."""
    expected = inp.clone()
    dist.all_reduce(expected, op=NCCL_OPS[reduce_op])
    parts = gathered(inp)
    fail_together(problems(got, parts, SYMMEM, reduce_op, f"symmem {reduce_op} {inp.dtype}")
                  + problems(expected, parts, ANY, reduce_op, f"NCCL {reduce_op} {inp.dtype}"))


@pytest.mark.parametrize("dtype", REDUCIBLE)
@pytest.mark.parametrize("symmetric", [False, True], ids=["staged", "symmetric"])
def test_all_reduce_against_nccl(group, dtype, symmetric):
    g = group.group_name
    for n in SIZES:
        for reduce_op in ("sum", "avg", "max", "min"):
            if reduce_op == "avg" and not dtype.is_floating_point:
                continue
            x = _random(n, dtype, _seed(("ar", n, reduce_op, str(dtype))))
            if symmetric:
                s = st.empty(n, dtype=dtype, group=group)
                s.copy_(x)
                assert st.is_symmetric(s, group)
                x = s
            got = ops.all_reduce(x, reduce_op, g)
            _check_reduction(got, x, reduce_op)
            y = x.clone()
            ops.all_reduce_(y, reduce_op, g)
            assert torch.equal(y, got), "in-place and out-of-place differ"


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32, torch.int64])
def test_all_gather_bit_exact(group, dtype):
    g, world, rank = group.group_name, dist.get_world_size(), dist.get_rank()
    for n in SIZES:
        x = (_random(n, torch.float32, _seed(("ag", n))) * 100).to(dtype)
        expected = torch.empty(world * n, dtype=dtype, device="cuda")
        dist.all_gather_into_tensor(expected, x)
        assert torch.equal(ops.all_gather_into_tensor(x, g), expected)
        out = torch.full((world * n,), 3, dtype=dtype, device="cuda")
        ops.all_gather_into_tensor_out(x, g, out=out)
        assert torch.equal(out, expected)
        # In place, as FSDP2 calls it: the input is this rank's slot of the output.
        out = torch.full((world * n,), 5, dtype=dtype, device="cuda")
        out[rank * n:(rank + 1) * n].copy_(x)
        st.all_gather_into_tensor(out, out[rank * n:(rank + 1) * n])
        assert torch.equal(out, expected)
        # Symmetric output, in place.
        s = st.empty(world * n, dtype=dtype, group=group)
        s[rank * n:(rank + 1) * n].copy_(x)
        ops.all_gather_into_tensor_out(s[rank * n:(rank + 1) * n], g, out=s)
        assert torch.equal(s, expected)


def test_rank_dependent_views_of_a_symmetric_tensor_are_staged(group):
    # Rank r's shard of a symmetric tensor starts at the buffer's base on rank 0 only: were it a
    # symmetric operand, the ranks would disagree on its kind or offset (kMismatch on every rank).
    g, world, rank = group.group_name, dist.get_world_size(), dist.get_rank()
    if world < 2:
        pytest.skip("needs two ranks: with one, the shard is the whole symmetric tensor")
    n = 4096
    s = st.empty(world * n, dtype=torch.float32, group=group)
    assert st.is_symmetric(s, group) and not st.is_symmetric(s[rank * n:(rank + 1) * n], group)
    s.copy_(_random(world * n, torch.float32, _seed("shard")))
    shard = s[rank * n:(rank + 1) * n]
    got = ops.all_reduce(shard, "sum", g)
    _check_reduction(got, shard.clone())
    gathered = ops.all_gather_into_tensor(shard, g)
    expected = torch.empty(world * n, dtype=torch.float32, device="cuda")
    dist.all_gather_into_tensor(expected, shard.clone())
    assert torch.equal(gathered, expected)
    st.GroupCommunicator(group).check()


def test_views_with_offsets(group):
    g, world, rank = group.group_name, dist.get_world_size(), dist.get_rank()
    big = _random(10_000, torch.bfloat16, _seed("views"))
    x = big[13:13 + 3001]  # contiguous, storage offset 13 elements (26 bytes: unaligned)
    out_big = torch.zeros(world * 3001 + 29, dtype=torch.bfloat16, device="cuda")
    out = out_big[29:]
    ops.all_gather_into_tensor_out(x, g, out=out)
    expected = torch.empty(world * 3001, dtype=torch.bfloat16, device="cuda")
    dist.all_gather_into_tensor(expected, x.clone())
    assert torch.equal(out, expected) and torch.equal(out_big[:29], torch.zeros(29, dtype=torch.bfloat16,
                                                                                device="cuda"))
    got = ops.all_reduce(x, "sum", g)
    _check_reduction(got, x.clone())
    # Symmetric buffer at an offset, 2-D shapes: rows for 16 per rank after an offset of 2, at any
    # world size (a fixed 64 rows held 16 per rank for 2 and 3 ranks only).
    rows = 2 + 16 * world + 3
    s = st.empty(rows, 1000, dtype=torch.float32, group=group)
    s.copy_(_random(rows * 1000, torch.float32, _seed("sym2d")).view(rows, 1000))
    view = s[3:35]
    got = ops.all_reduce(view, "sum", g)
    _check_reduction(got.view(-1), view.reshape(-1).clone())
    inp = s[2:2 + 16 * world]
    rs = ops.reduce_scatter_tensor(inp, "sum", g)
    assert rs.shape == (16, 1000)
    check_reduce_scatter(rs, inp, "sum", SYMMEM, "reduce_scatter of a view")
    expected = torch.empty(16, 1000, dtype=torch.float32, device="cuda")
    dist.reduce_scatter_tensor(expected, inp.clone())
    check_reduce_scatter(expected, inp, "sum", ANY, "NCCL's reduce_scatter")
    assert rank >= 0


@pytest.mark.parametrize("dtype", REDUCIBLE)
def test_reduce_scatter_against_nccl(group, dtype):
    g, world = group.group_name, dist.get_world_size()
    for n in SIZES:
        x = _random(world * n, dtype, _seed(("rs", n, str(dtype))))
        got = ops.reduce_scatter_tensor(x, "sum", g)
        expected = torch.empty(n, dtype=dtype, device="cuda")
        dist.reduce_scatter_tensor(expected, x.clone())
        parts = scattered_parts(gathered(x))
        fail_together(problems(got, parts, SYMMEM, "sum", f"symmem n={n}")
                      + problems(expected, parts, ANY, "sum", f"NCCL n={n}"))
        out = torch.empty(n, dtype=dtype, device="cuda")
        st.reduce_scatter_tensor(out, x)
        assert torch.equal(out, got)


def test_list_all_gather(group):
    world = dist.get_world_size()
    x = _random(777, torch.float16, _seed("list"))
    expected = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(expected, x)
    separate = [torch.empty_like(x) for _ in range(world)]
    st.all_gather(separate, x)
    flat = torch.empty(world * 777, dtype=torch.float16, device="cuda")
    adjacent = list(flat.chunk(world))
    st.all_gather(adjacent, x)
    for r in range(world):
        assert torch.equal(separate[r], expected[r]) and torch.equal(adjacent[r], expected[r])


def test_non_contiguous_input_is_a_clear_error(group):
    # A refusal leaves the communicator unusable on every rank (docs/torch.md): each call gets a
    # group of its own, and the group's next call raises the refusal again instead of running.
    world = dist.get_world_size()
    x = torch.ones(64, 64, device="cuda")
    calls = (lambda g: ops.all_reduce(x.t(), "sum", g.group_name),
             lambda g: st.all_gather_into_tensor(torch.empty(world * 64 * 32, device="cuda"), x[:, ::2], group=g))
    for call in calls:
        own = dist.new_group(list(range(world)))
        with pytest.raises(ValueError, match="must be contiguous"):
            call(own)
        with pytest.raises(st.SymmemError, match="must be contiguous"):
            st.all_reduce(torch.ones(1024, device="cuda"), group=own)
            torch.cuda.synchronize()


def test_cuda_graph_replays_after_inputs_change(group):
    g, world = group.group_name, dist.get_world_size()
    tp = st.TPAllReduce(group, max_size=8 << 20)
    x_local = torch.empty(4096 * 8, dtype=torch.bfloat16, device="cuda")
    x_sym = st.empty(8192, dtype=torch.float32, group=group)
    a = torch.empty(3000, dtype=torch.float16, device="cuda")
    r = torch.empty(world * 2048, dtype=torch.float32, device="cuda")
    for t in (x_local, x_sym, a, r):
        t.copy_(_random(t.numel(), t.dtype, _seed(("warm", t.numel()))))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # an eager call before capture, as a real model warms up
        tp.all_reduce(x_local)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_local = tp.all_reduce(x_local)
        y_sym = ops.all_reduce(x_sym, "sum", g)
        y_gather = ops.all_gather_into_tensor(a, g)
        y_scatter = ops.reduce_scatter_tensor(r, "avg", g)
    for i in range(20):
        for t in (x_local, x_sym, a, r):
            t.copy_(_random(t.numel(), t.dtype, _seed(("replay", i, t.numel()))))
        graph.replay()
        _check_reduction(y_local, x_local)
        _check_reduction(y_sym, x_sym)
        expected = torch.empty(world * 3000, dtype=torch.float16, device="cuda")
        dist.all_gather_into_tensor(expected, a)
        assert torch.equal(y_gather, expected), f"replay {i}: all-gather differs"
        check_reduce_scatter(y_scatter, r, "avg", SYMMEM, f"replay {i}: reduce-scatter avg")
    st.GroupCommunicator(group).check()


def test_torch_compile_inductor(group):
    g = group.group_name

    def layer(x, w):
        h = ops.all_reduce(x @ w, "sum", g)
        full = ops.all_gather_into_tensor(torch.relu(h), g)
        return ops.reduce_scatter_tensor(full * 0.5, "sum", g)

    x = _random(64 * 128, torch.float32, _seed("cx")).view(64, 128)
    w = _random(128 * 96, torch.float32, _seed("cw")).view(128, 96) / 16
    eager = layer(x, w)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    got = compiled(x, w)
    # (A tolerance for the GEMM, which Inductor may run as another kernel than eager's: the
    # collectives are symmem's, in its order, in both.)
    assert torch.allclose(got, eager, rtol=1e-4, atol=1e-4)
    assert _same_on_every_rank(ops.all_reduce(x, "sum", g))


def test_mem_pool_tensors_are_symmetric(group):
    g = group.group_name
    pool = st.mem_pool(group)
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(1 << 20, dtype=torch.bfloat16, device="cuda")
        b = torch.empty(4097, dtype=torch.float32, device="cuda")
    # Pool tensors are heap memory; they run zero-copy only when they fill a whole segment.
    assert st.in_heap(a, group) and st.in_heap(b, group)
    assert not st.in_heap(torch.empty(10, device="cuda"), group)
    assert not st.is_symmetric(b, group)
    a.copy_(_random(a.numel(), a.dtype, _seed("pool")))
    b.copy_(_random(b.numel(), b.dtype, _seed("poolb")))
    _check_reduction(ops.all_reduce(a, "sum", g), a)
    _check_reduction(ops.all_reduce(b, "max", g), b, "max")
    del a, b


def test_drop_ins_async_and_fallback(group, caplog):
    x = _random(5000, torch.float32, _seed("dropin"))
    y = x.clone()
    work = st.all_reduce(y, async_op=True)
    assert isinstance(work, dist.Work)
    work.wait()
    _check_reduction(y, x)
    # float64 falls back to NCCL: its sum in its own order. (Compared with symmem's float32 sum as
    # before, rtol 1e-5 of each element held at 2 ranks only: at 4 a sum that cancels has an error
    # of the float32 roundings of its magnitudes, far above 1e-5 of itself.)
    z = x.double()
    functional._said.clear()  # (an earlier test may have said it already)
    with caplog.at_level("WARNING", logger="symmem"):
        st.all_reduce(z)
    assert any("falls back to torch.distributed" in r.getMessage() for r in caplog.records)
    check_reduction(z, x.double(), "sum", ANY, "the float64 fallback")


def test_empty_tensors_are_no_ops_as_in_torch_distributed(group):
    # torch.distributed takes tensors of no elements (a rank with no tokens, an empty bucket) and
    # returns at once. So must the drop-ins, served by symmem (no fallback said), eager and async;
    # and each collective's next call must still agree on every rank and be right.
    from symmem.torch.all_to_all import all_to_all_single
    world = dist.get_world_size()
    functional._said.clear()  # a fallback says its reason here (say_once)
    for dtype in (torch.bfloat16, torch.float32):
        def none(*shape):
            return torch.empty(shape or (0,), dtype=dtype, device="cuda")
        empty = none()
        for async_op in (False, True):
            done = [st.all_reduce(empty, async_op=async_op),
                    st.all_gather_into_tensor(none(), empty, async_op=async_op),
                    st.all_gather([none() for _ in range(world)], empty, async_op=async_op),
                    st.reduce_scatter_tensor(none(), none(), async_op=async_op)]
            for work in done:
                assert (work is None) != async_op
                if async_op:
                    work.wait()
        all_to_all_single(none(0, 4), none(0, 4))
        all_to_all_single(none(0, 4), none(0, 4), [0] * world, [0] * world)
        assert not functional._said, f"an empty call fell back to torch.distributed: {functional._said}"
        # The next call of each collective, against NCCL.
        seed = _seed(("after empty", str(dtype)))
        x = _random(world * 4099, dtype, seed)
        y = x.clone()
        st.all_reduce(y)
        _check_reduction(y, x)
        out = none(world * 4099)
        st.reduce_scatter_tensor(out[:4099], x)
        check_reduce_scatter(out[:4099], x, what=f"reduce_scatter after empty calls, {dtype}")
        wrong = []
        st.all_gather_into_tensor(out, x[:4099])
        want = none(world * 4099)
        dist.all_gather_into_tensor(want, x[:4099])
        if not torch.equal(out, want):
            wrong.append(f"all_gather_into_tensor after empty calls, {dtype}")
        splits = [(seed + q) % 5 for q in range(world)]  # rows this rank sends to each rank
        rows = _random(sum(splits) * 4, dtype, seed + 1).view(-1, 4)
        receive = torch.tensor(splits, device="cuda")
        every = torch.empty(world * world, dtype=receive.dtype, device="cuda")
        dist.all_gather_into_tensor(every, receive)
        incoming = every.view(world, world)[:, dist.get_rank()].tolist()
        got, want = none(sum(incoming), 4), none(sum(incoming), 4)
        all_to_all_single(got, rows, incoming, splits)
        dist.all_to_all_single(want, rows, incoming, splits)
        if not torch.equal(got, want):
            wrong.append(f"all_to_all_single after empty calls, {dtype}")
        fail_together(wrong)
    st.GroupCommunicator(group).check()


def test_a_destroyed_group_is_refused_by_every_drop_in_and_op(group):
    # torch.distributed's NCCL refuses a collective on a destroyed group (DistBackendError); on
    # 0bbf9f1 st.all_reduce served it from its cache and returned the sum.
    world = dist.get_world_size()
    sub = dist.new_group(list(range(world)))
    name = sub.group_name
    x = _random(4096, torch.bfloat16, _seed("destroyed"))
    y = x.clone()
    st.all_reduce(y, group=sub)  # the group's communicator exists; the drop-in's cache holds it
    _check_reduction(y, x)
    torch.cuda.synchronize()
    dist.destroy_process_group(sub)
    before = y.clone()
    out = torch.zeros(world * 4096, dtype=torch.bfloat16, device="cuda")
    outs = [torch.zeros_like(y) for _ in range(world)]
    calls = {
        "all_reduce": lambda: st.all_reduce(y, group=sub),
        "all_reduce async": lambda: st.all_reduce(y, group=sub, async_op=True),
        "all_reduce by name": lambda: st.all_reduce(y, group=name),
        "all_gather_into_tensor": lambda: st.all_gather_into_tensor(out, y, group=sub),
        "all_gather (list)": lambda: st.all_gather(outs, y, group=sub),
        "reduce_scatter_tensor": lambda: st.reduce_scatter_tensor(y[:4096 // world], y[:4096 // world * world],
                                                                  group=sub),
        "op all_reduce_": lambda: ops.all_reduce_(y, "sum", name),
        "op all_gather_into_tensor": lambda: ops.all_gather_into_tensor(y, name),
        "op reduce_scatter_tensor": lambda: ops.reduce_scatter_tensor(out, "sum", name),
        "TPAllReduce": lambda: st.TPAllReduce(sub),
        "empty": lambda: st.empty(16, group=sub),
    }
    found = []
    for what, call in calls.items():
        try:
            call()
        except dist.DistBackendError as e:
            if "destroyed" not in str(e):
                found.append(f"{what}: {e}")
        except Exception as e:  # noqa: BLE001
            found.append(f"{what}: {type(e).__name__}: {e}")
        else:
            found.append(f"{what}: ran")
    torch.cuda.synchronize()
    if not torch.equal(y, before) or out.any() or any(o.any() for o in outs):
        found.append("a refused call wrote its output")
    fail_together(found)


def test_tp_all_reduce_interface(group):
    tp = st.TPAllReduce(group, max_size=1 << 20)
    assert not tp.disabled
    small = _random(4096, torch.bfloat16, _seed("tp"))
    assert tp.should_use(small) and tp.should_custom_ar(small)
    assert not tp.should_use(torch.empty(1 << 20, dtype=torch.bfloat16, device="cuda"))  # 2 MiB > max_size
    assert not tp.should_use(small.cpu()) and not tp.should_use(small.double())
    with tp.capture():
        out = tp.all_reduce(small)
    _check_reduction(out, small)


def test_killed_rank_raises_naming_it(group, tmp_path):
    # kill_worker.py: two ranks loop over all-reduces; rank 1 kills itself after 200 calls.
    from conftest import run_killed_rank_job
    run_killed_rank_job(group, os.path.join(os.path.dirname(__file__), "kill_worker.py"), tmp_path)
