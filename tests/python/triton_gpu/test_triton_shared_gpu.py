"""symmem.triton on one GPU with 2, 3, 4 and 8 ranks as threads (shared_gpu.py): the examples bit-exact
against symmem's CUDA collectives, user kernels interleaved with library calls on one
communicator (on one stream and across streams), mismatched launches (kMismatch on every rank), a
rank that never launches (kTimeout naming it on every other rank within the timeout plus 2 s, the
CUDA context still usable), and 1000 CUDA graph replays. Run by scripts/gpu_run.sh's
triton_shared_gpu_tests step; worlds from SYMMEM_SHARED_GPU_WORLDS.

Grids: every Triton grid here is programs(world) <= the core's shared-GPU SM share (sm_count / (2
ranks), src/plan/shared_gpu.hpp), which the library's own plans use too. A rank holds at most two
grids at once (a library kernel and its early-launched successor; Triton kernels launch no
successor early), so every rank's blocks are resident together and no barrier waits for a block
that cannot start."""
import os
import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)
if os.environ.get("SYMMEM_TEST_SHARED_GPU") != "1":
    pytest.skip("needs SYMMEM_TEST_SHARED_GPU=1 (ranks sharing one GPU)", allow_module_level=True)

from shared_gpu import run_ranks  # noqa: E402

import symmem  # noqa: E402
from symmem import _native  # noqa: E402
from symmem.triton.examples import all_gather, one_shot_all_reduce  # noqa: E402
from symmem.triton.examples.all_gather_matmul import all_gather_matmul  # noqa: E402

WORLDS = [int(w) for w in os.environ.get("SYMMEM_SHARED_GPU_WORLDS", "2 3 4 8").split()]
SIZES = [3, 777, 65536 + 5, 1 << 20]  # (not 1: Triton would compile a kernel for n == 1 alone)
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ONE_SHOT = _native.algo_code("one_shot")
PULL = _native.algo_code("pull")


def programs(world):
    """A grid every rank's kernel can hold at once on the shared GPU: at most the core's own share
    (plan/shared_gpu.hpp: sm_count / (2 ranks), at least 1), and 8."""
    return max(1, min(8, torch.cuda.get_device_properties(0).multi_processor_count // (2 * world)))


def dtype_code(dtype):
    return _native.DTYPES[str(dtype).replace("torch.", "")]


def rank_input(rank, call, n, dtype):
    generator = torch.Generator(device="cuda").manual_seed(7919 * call + rank)
    return torch.randn(n, generator=generator, device="cuda").to(dtype)


def same_bits(a, b):
    return torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                       b.view(torch.int16 if b.element_size() == 2 else torch.int32))


def symmem_all_reduce(me, inp, algo=ONE_SHOT):
    out = torch.empty_like(inp)
    me.comm.all_reduce(out.data_ptr(), inp.data_ptr(), inp.numel(), dtype_code(inp.dtype), 0,
                       torch.cuda.current_stream().cuda_stream, algo)
    return out


def symmem_all_gather(me, inp):
    out = inp.new_empty(me.world * inp.numel())
    me.comm.all_gather(out.data_ptr(), inp.data_ptr(), inp.numel() * inp.element_size(), _native.DTYPES["uint8"],
                       torch.cuda.current_stream().cuda_stream, PULL)
    return out


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_shot_all_reduce_is_bit_exact(world, dtype):
    def body(me):
        inp = me.heap(max(SIZES), dtype)
        wrong = []
        for call, n in enumerate(SIZES):
            x = inp[:n]
            x.copy_(rank_input(me.rank, call, n, dtype))
            out = torch.full((n,), float("nan"), dtype=dtype, device="cuda")  # poisoned
            one_shot_all_reduce(x, me.comm, out=out, programs=programs(world))
            expected = symmem_all_reduce(me, x)
            # The sum in rank order 0..W-1 in fp32, computed by torch.
            reference = sum((rank_input(r, call, n, dtype).float() for r in range(1, world)),
                            rank_input(0, call, n, dtype).float()).to(dtype)
            torch.cuda.current_stream().synchronize()
            me.comm.check()
            if not (same_bits(out, expected) and same_bits(out, reference)):
                wrong.append(n)
        return wrong

    assert run_ranks(world, body) == [[]] * world


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("mode", ["pull", "push"])
def test_all_gather_is_bit_exact(world, mode):
    def body(me):
        n_max = max(SIZES)
        heap_in, heap_out = me.heap(n_max, torch.float16), me.heap(world * n_max, torch.float16)
        wrong = []
        for call, n in enumerate(SIZES):
            x = heap_in[:n] if mode == "pull" else torch.empty(n, dtype=torch.float16, device="cuda")
            x.copy_(rank_input(me.rank, call, n, torch.float16))
            out = (torch.empty(world * n, dtype=torch.float16, device="cuda") if mode == "pull"
                   else heap_out[:world * n])
            out.fill_(float("nan"))
            all_gather(x, me.comm, out=out, programs=programs(world), mode=mode)
            expected = symmem_all_gather(me, x)
            torch.cuda.current_stream().synchronize()
            me.comm.check()
            if not same_bits(out, expected):
                wrong.append(n)
        return wrong

    assert run_ranks(world, body) == [[]] * world


@pytest.mark.parametrize("world", WORLDS)
def test_user_kernels_interleave_with_library_calls(world):
    def body(me):
        n = 100003
        x, gathered = me.heap(n, torch.bfloat16), me.heap(world * n, torch.bfloat16)
        wrong = 0
        for call in range(20):
            # The first iteration settles the ranks after each call: a kernel launched for the first
            # time in the process (here the bf16 push all-gather at this world) is compiled and
            # loaded under the launcher's lock, which a peer needs for its own launch, and the load
            # waits for the GPU to idle, which a kernel waiting for that peer prevents.
            settle = me.settle if call == 0 else (lambda: None)
            x.copy_(rank_input(me.rank, call, n, torch.bfloat16))
            ours = one_shot_all_reduce(x, me.comm, programs=programs(world))
            settle()
            planned = symmem_all_reduce(me, x, algo=0)  # the planner's choice, on the library's flags
            one_shot = symmem_all_reduce(me, x)
            settle()
            all_gather(x, me.comm, out=gathered, programs=programs(world), mode="push")
            settle()
            reference = symmem_all_gather(me, x)
            me.comm.barrier(torch.cuda.current_stream().cuda_stream)
            torch.cuda.current_stream().synchronize()
            me.comm.check()
            close = torch.allclose(ours.float(), planned.float(), rtol=1e-2, atol=1e-2)
            wrong += int(not same_bits(gathered, reference)) + int(not same_bits(ours, one_shot)) + int(not close)
        return wrong

    assert run_ranks(world, body) == [0] * world


@pytest.mark.parametrize("world", WORLDS)
def test_user_kernels_and_library_calls_on_other_streams_stay_in_order(world):
    """A user kernel held back on its stream (a sleep ahead of it), then a library call of the same
    communicator on another stream that reads what the kernel wrote: the library call runs after
    the kernel (the communicator's calls run in host order, whatever their streams), and the next
    user call after the library call. The sum of identical copies times a power of two is exact."""
    n = 4099

    def body(me):
        x, gathered = me.heap(n, torch.bfloat16), me.heap(world * n, torch.bfloat16)
        other = torch.cuda.Stream()
        wrong = 0
        for call in range(4):
            x.copy_(rank_input(me.rank, call, n, torch.bfloat16))
            gathered.fill_(float("nan"))
            torch.cuda._sleep(20_000_000)  # ~10 ms: unordered, the library call would read the NaNs
            all_gather(x, me.comm, out=gathered, programs=programs(world), mode="push")
            with torch.cuda.stream(other):
                summed = symmem_all_reduce(me, gathered)
            other.synchronize()
            torch.cuda.current_stream().synchronize()
            me.comm.check()
            full = torch.cat([rank_input(r, call, n, torch.bfloat16) for r in range(world)])
            wrong += int(not same_bits(summed, full * world))
            me.wait_for_every_rank()  # nobody refills `gathered` while a peer's call still reads it
        return wrong

    assert run_ranks(world, body) == [0] * world


@pytest.mark.parametrize("world", WORLDS)
def test_mismatched_launches_raise_kmismatch_on_every_rank(world):
    def body(me):
        x = me.heap(2048, torch.float32)
        one_shot_all_reduce(x, me.comm, programs=1)  # compiled, and every rank agrees
        torch.cuda.current_stream().synchronize()
        me.wait_for_every_rank()
        n = 1024 if me.rank == 0 else 2048
        try:  # a rank may learn of the mismatch at its launch already (the launch checks the communicator)
            one_shot_all_reduce(x[:n], me.comm, programs=1)
            torch.cuda.current_stream().synchronize()
            me.comm.check()
        except symmem.SymmemError as e:
            return e.code, str(e)
        return None, "no error"

    for rank, (code, message) in enumerate(run_ranks(world, body)):
        assert code == "kMismatch", (rank, message)
        assert "triton:one_shot_all_reduce(1024" in message and "triton:one_shot_all_reduce(2048" in message, message


@pytest.mark.parametrize("world", WORLDS)
def test_a_rank_that_never_launches_is_named_in_time(world):
    timeout_ms = 2000

    def body(me):
        x = me.heap(65536, torch.float32)
        one_shot_all_reduce(x, me.comm, programs=programs(world))  # compiled before the clock runs
        torch.cuda.current_stream().synchronize()
        me.wait_for_every_rank()
        dead = world - 1
        start = time.monotonic()
        if me.rank != dead:
            one_shot_all_reduce(x, me.comm, programs=programs(world))
        torch.cuda.current_stream().synchronize()
        try:
            me.comm.check()
            outcome = (None, "no error")
        except symmem.SymmemError as e:
            outcome = (e.code, str(e))
        seconds = time.monotonic() - start
        usable = torch.ones(4, device="cuda").add_(1).sum().item() == 8.0  # the CUDA context is intact
        return outcome, seconds, usable

    results = run_ranks(world, body, timeout_ms=timeout_ms)
    for rank, ((code, message), seconds, usable) in enumerate(results):
        assert usable, rank
        if rank == world - 1:
            continue  # the dead rank launched nothing; its check may or may not have seen the abort yet
        assert code == "kTimeout", (rank, message)
        assert f"waiting for rank {world - 1}" in message, message
        assert seconds < timeout_ms / 1000 + 2.0, (rank, seconds)


@pytest.mark.parametrize("world", WORLDS)
def test_graph_replays(world):
    replays, n = 1000, 4099

    def body(me):
        x, gathered = me.heap(n, torch.bfloat16), me.heap(world * n, torch.bfloat16)
        x.copy_(rank_input(me.rank, 0, n, torch.bfloat16))
        out = one_shot_all_reduce(x, me.comm, programs=programs(world))  # compiles; makes the sync context
        me.settle()  # (a first launch: see the interleaving test)
        all_gather(x, me.comm, out=gathered, programs=programs(world), mode="push")
        me.settle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=me.stream, capture_error_mode="thread_local"):
            one_shot_all_reduce(x, me.comm, out=out, programs=programs(world))
            all_gather(x, me.comm, out=gathered, programs=programs(world), mode="push")
        wrong = 0
        for check in range(4):
            x.copy_(rank_input(me.rank, check + 1, n, torch.bfloat16))
            out.fill_(float("nan"))
            for _ in range(replays // 4):
                graph.replay()
            expected = symmem_all_reduce(me, x)
            expected_gather = symmem_all_gather(me, x)
            torch.cuda.current_stream().synchronize()
            me.comm.check()
            wrong += (not same_bits(out, expected)) + (not same_bits(gathered, expected_gather))
            me.wait_for_every_rank()  # inputs change only once every rank's replays are done
        del graph
        return wrong

    assert run_ranks(world, body) == [0] * world


@pytest.mark.parametrize("world", [w for w in WORLDS if w <= 4])
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "copied"])
def test_all_gather_matmul_on_copy_engine_pieces(world, in_place):
    # 384 rows per rank: tiles of 128 rows cross no shard, 320 would; both are covered by the worlds.
    rows, k, n = 320 if world == 4 else 384, 1024, 512

    def body(me):
        m = world * rows
        gathered = me.heap(m * k, torch.float16).view(m, k)
        b = (torch.randn(k, n, generator=torch.Generator(device="cuda").manual_seed(3), device="cuda") / 32).half()
        wrong = []
        for call in range(3):
            full = torch.cat([rank_input(r, call, rows * k, torch.float16).view(rows, k) for r in range(world)])
            gathered.fill_(float("nan"))
            if in_place:
                shard = gathered[me.rank * rows:(me.rank + 1) * rows]
                shard.copy_(full[me.rank * rows:(me.rank + 1) * rows])
            else:
                shard = full[me.rank * rows:(me.rank + 1) * rows].clone()
            me.wait_for_every_rank()  # no peer pulls a slot still poisoned for this call
            c = all_gather_matmul(shard, b, gathered, me.comm, programs=programs(world),
                                  config=(128, 128, 64, 3, 8, False))
            torch.cuda.current_stream().synchronize()
            me.comm.check()
            reference = full.float() @ b.float()
            error = ((c.float() - reference).abs().max() / reference.abs().max()).item()
            if not torch.equal(gathered, full) or error > 1e-2:
                wrong.append((call, error))
            me.wait_for_every_rank()
        return wrong

    assert run_ranks(world, body) == [[]] * world
