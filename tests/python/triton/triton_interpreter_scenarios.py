"""What each interpreted rank runs (triton_interpreter_ranks.py starts them with TRITON_INTERPRET=1).
Each scenario returns plain data for the parent to check: results, failure records, times."""
import time

import torch
import triton
import triton.language as tl

import symmem.triton as smt
from triton_interpreter_ranks import STRIDE

SIGNATURE = 0x5EED1234


@triton.jit
def exchange_kernel(sync, signature, rank, data, out, WORLD: tl.constexpr):
    """Program i writes a value of (rank, call, i) into its slot, barriers, reads every rank's slot i,
    barriers again (nobody overwrites a slot a peer still reads)."""
    pid = tl.program_id(0)
    epoch = smt.epoch_begin(sync)
    tl.store(data + pid, rank * 1000 + epoch * 10 + pid)
    ok = smt.barrier(sync, signature, epoch, 0, rank, WORLD)
    if ok:
        stride = smt.heap_stride(sync)
        for p in tl.static_range(WORLD):
            tl.store(out + pid * WORLD + p, tl.load(smt.peer(data + pid, p, rank, stride)))
        ok = smt.barrier(sync, signature, epoch, 1, rank, WORLD)
    tl.store(out + 64 + pid, ok.to(tl.int64))
    smt.epoch_commit(sync, epoch)


@triton.jit
def one_barrier_kernel(sync, signature, rank, oks, WORLD: tl.constexpr):
    epoch = smt.epoch_begin(sync)
    ok = smt.barrier(sync, signature, epoch, 0, rank, WORLD)
    tl.store(oks + epoch, ok.to(tl.int32))
    smt.epoch_commit(sync, epoch)


@triton.jit
def signal_kernel(sync, signature, rank, data, pad, out, n, SENDER: tl.constexpr, RECEIVER: tl.constexpr,
                  BLOCK: tl.constexpr):
    """SENDER puts `data` into RECEIVER's copy and signals pad word 0 with the epoch; RECEIVER waits
    for it, copies what arrived to `out`, then waits on pad word 1, which nobody signals (phase 9)."""
    epoch = smt.epoch_begin(sync)
    stride = smt.heap_stride(sync)
    if rank == SENDER:
        smt.put_signal(smt.peer(data, RECEIVER, rank, stride), data, n, smt.peer(pad, RECEIVER, rank, stride), epoch,
                       BLOCK)
    if rank == RECEIVER:
        ok = smt.wait_signal(sync, signature, pad, epoch, smt.AT_LEAST, SENDER, 7)
        offsets = tl.arange(0, BLOCK)
        tl.store(out + offsets, tl.load(data + offsets, mask=offsets < n), mask=offsets < n)
        tl.store(out + BLOCK, ok.to(tl.int64))
        never = smt.wait_signal(sync, signature, pad + 1, 1, smt.EQUAL, SENDER, 9)
        tl.store(out + BLOCK + 1, never.to(tl.int64))
    smt.epoch_commit(sync, epoch)


def _exchange(me, calls, signature, programs=2):
    data = me.tensor(me.data(), 8, torch.int64)
    out = torch.full((128,), -1, dtype=torch.int64)
    sync = me.sync()
    results = []
    for _ in range(calls):
        exchange_kernel[(programs,)](sync, signature, me.rank, data, out, WORLD=me.world)
        results.append(out.tolist())
    return results


def barrier_epochs(me, calls):
    return {"results": _exchange(me, calls, SIGNATURE), "record": me.record(), "aborted": me.aborted()}


def mismatch(me):
    signature = SIGNATURE + (1 if me.rank == 1 else 0)
    return {"results": _exchange(me, 1, signature), "record": me.record(), "aborted": me.aborted()}


def never_comes(me):
    start = time.monotonic()
    results = _exchange(me, 1, SIGNATURE)
    return {"results": results, "record": me.record(), "aborted": me.aborted(), "seconds": time.monotonic() - start}


def one_ahead(me):
    """World 2. Rank 0 arrives (its flag of call 1 is in rank 1's slot) but reads nothing until rank 1,
    released by that flag, has stored its flag of call 2; rank 0's call 1 must accept a peer one
    call ahead."""
    sync = me.sync()
    oks = torch.full((8,), -1, dtype=torch.int32)
    if me.rank == 0:
        me.flag(1, 0, 0, 0).value = (1 << 32) | SIGNATURE  # rank 0's arrival at call 1, as barrier() stores it
        deadline = time.monotonic() + 60
        while me.flag(0, 0, 0, 1).value >> 32 != 2:  # rank 1 reached its call 2
            if time.monotonic() > deadline:
                raise TimeoutError("rank 1 never reached its second call")
            time.sleep(0.01)
        seen = me.flag(0, 0, 0, 1).value >> 32
    else:
        seen = None
    for _ in range(2):
        one_barrier_kernel[(1,)](sync, SIGNATURE, me.rank, oks, WORLD=me.world)
    return {"oks": oks.tolist(), "seen_before_call_1": seen, "record": me.record()}


def signals(me, n):
    sync = me.sync()
    data = me.tensor(me.data(), 64, torch.float32)
    pad = me.tensor(me.data() + 4096, 4, torch.int32)
    if me.rank == 0:
        data[:n] = torch.arange(n, dtype=torch.float32) + 0.5
        # The receiver's copy is poisoned by its only writer, before the put: poisoned by the
        # receiver itself, it could land after the put (received all -1.0 in a CI run).
        me.tensor(me.data(1), 64, torch.float32).fill_(-1.0)
    out = torch.full((66,), -2.0, dtype=torch.float32)
    start = time.monotonic()
    signal_kernel[(1,)](sync, SIGNATURE, me.rank, data, pad, out, n, SENDER=0, RECEIVER=1, BLOCK=64)
    return {"out": out.tolist(), "record": me.record(), "seconds": time.monotonic() - start}


def _inputs(rank, call, n, dtype):
    generator = torch.Generator().manual_seed(1000 * call + rank)
    if dtype == torch.int32:
        return torch.randint(-1000, 1000, (n,), generator=generator, dtype=torch.int32)
    return torch.randn(n, generator=generator).to(dtype)


def example_all_reduce(me, dtype_name, n, programs, calls):
    """symmem.triton.examples' one-shot all-reduce, `calls` times on new inputs, against the sum in
    rank order with the same accumulation (exact)."""
    from symmem.triton.examples._common import ACCUMULATE
    from symmem.triton.examples.one_shot_all_reduce import one_shot_all_reduce_kernel
    dtype = getattr(torch, dtype_name)
    sync = me.sync()
    inp = me.tensor(me.data(), n, dtype)
    wrong = []
    for call in range(calls):
        inp.copy_(_inputs(me.rank, call, n, dtype))
        out = torch.full((n,), 7, dtype=dtype)
        one_shot_all_reduce_kernel[(programs,)](inp, out, n, STRIDE, sync, SIGNATURE, me.rank,
                                                WORLD=me.world, BLOCK=64, ACC=ACCUMULATE[dtype_name])
        accumulate = torch.int32 if dtype == torch.int32 else torch.float32
        expected = _inputs(0, call, n, dtype).to(accumulate)
        for r in range(1, me.world):
            expected = expected + _inputs(r, call, n, dtype).to(accumulate)
        wrong.append(int((out != expected.to(dtype)).sum()))
    return {"wrong": wrong, "record": me.record()}


def example_all_gather(me, mode, n, programs, calls, through_table=False):
    from symmem.triton.examples.all_gather import all_gather_kernel
    sync = me.sync()
    heap_in = me.tensor(me.data(), n, torch.float32)
    heap_out = me.tensor(me.data() + 64 * 1024, me.world * n, torch.float32)
    table = torch.tensor([me.data(r) for r in range(me.world)], dtype=torch.int64)  # every rank's heap_in
    wrong = []
    for call in range(calls):
        mine = _inputs(me.rank, call, n, torch.float32)
        if mode == "pull":
            heap_in.copy_(mine)
            inp, out = heap_in, torch.full((me.world * n,), 7.0)
        else:
            inp, out = mine, heap_out
            out.fill_(7.0)  # poison: peers push after the entry barrier
        all_gather_kernel[(programs,)](inp, out, n, STRIDE, table, sync, SIGNATURE, me.rank, WORLD=me.world,
                                       BLOCK=32, PUSH=mode == "push", TABLE=through_table)
        expected = torch.cat([_inputs(r, call, n, torch.float32) for r in range(me.world)])
        wrong.append(int((out != expected).sum()))
    return {"wrong": wrong, "record": me.record()}


def _doc_module(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("doc_snippet", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def doc_push_all_gather(me, path, n, calls):
    """The README's kernel: x (any tensor) into slot `rank` of every rank's out (symmetric)."""
    kernel = _doc_module(path).push_all_gather
    sync = me.sync()
    out = me.tensor(me.data(), me.world * n, torch.float32)
    wrong = []
    for call in range(calls):
        x = _inputs(me.rank, call, n, torch.float32)
        out.fill_(7.0)
        kernel[(1,)](x, out, n, STRIDE, sync, SIGNATURE, me.rank, WORLD=me.world, BLOCK=64)
        expected = torch.cat([_inputs(r, call, n, torch.float32) for r in range(me.world)])
        wrong.append(int((out != expected).sum()))
    return {"wrong": wrong, "record": me.record()}


def doc_ring_shift(me, path, n, calls):
    """docs/kernels.md's kernel: y on rank r+1 = x on rank r, with put-with-signal."""
    kernel = _doc_module(path).ring_shift
    sync = me.sync()
    y = me.tensor(me.data(), n, torch.float32)
    pad = me.tensor(me.data() + 64 * 1024, 16, torch.int32)
    wrong = []
    for call in range(calls):
        x = _inputs(me.rank, call, n, torch.float32)
        kernel[(1,)](x, y, pad, n, STRIDE, sync, SIGNATURE, me.rank, WORLD=me.world, BLOCK=64)
        expected = _inputs((me.rank + me.world - 1) % me.world, call, n, torch.float32)
        wrong.append(int((y != expected).sum()))
    return {"wrong": wrong, "record": me.record()}


def fused_pieces(me, shard_rows, piece_rows, arrive):
    """The fused example's kernel as rank 0 of two, under the interpreter: shard 1's pieces are
    written into `gathered` by a thread standing in for the copy engine, each followed by its flag
    (`arrive` of the pieces arrive; the rest never do). Returns the result's error against the
    product of what arrived, and the failure record."""
    import threading
    from triton.tools.tensor_descriptor import TensorDescriptor
    from symmem.triton.examples.all_gather_matmul import all_gather_matmul_kernel
    m, n, k = 2 * shard_rows, 32, 32
    pieces = -(-shard_rows // piece_rows)
    sync = me.sync()
    generator = torch.Generator().manual_seed(5)
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator)
    gathered = torch.zeros(m, k)
    gathered[:shard_rows] = a[:shard_rows]  # the own shard, there before the kernel
    flags = me.tensor(me.data(), 2 * pieces, torch.int32)
    flags.zero_()
    c = torch.full((m, n), float("nan"))

    def copy_engine():
        for j in range(arrive):
            time.sleep(0.05)
            rows = slice(shard_rows + j * piece_rows, shard_rows + min((j + 1) * piece_rows, shard_rows))
            gathered[rows] = a[rows]
            flags[pieces + j] = 1

    engine = threading.Thread(target=copy_engine)
    engine.start()
    all_gather_matmul_kernel[(2,)](TensorDescriptor.from_tensor(gathered, [16, 16]),
                                   TensorDescriptor.from_tensor(b, [16, 16]), TensorDescriptor.from_tensor(c, [16, 16]),
                                   flags, m, n, k, shard_rows, piece_rows, pieces, sync, SIGNATURE, 0, BM=16, BN=16,
                                   BK=16, GROUP_M=2, STAGES=1, EPILOGUE_SUBTILE=False)
    engine.join()
    arrived = shard_rows + min(arrive * piece_rows, shard_rows)
    error = (c[:arrived] - a[:arrived] @ b).abs().max().item()
    return {"error": error, "record": me.record()}
