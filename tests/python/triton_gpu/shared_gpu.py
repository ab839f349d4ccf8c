"""Ranks as threads of one process sharing GPU 0, each with its own symmem communicator built
through the C ABI with an in-process exchange (no torch.distributed), as tests/gpu/shared_gpu_tests.cpp
does in C++. Needs SYMMEM_TEST_SHARED_GPU=1 (ranks may share a GPU; each plans with a share of its
SMs), CUDA_DEVICE_MAX_CONNECTIONS=32 (every rank's stream its own hardware queue) and
CUDA_MODULE_LOADING=EAGER (torch's default, lazy loading, loads a kernel at its first launch, which
may wait for the context while peers' kernels spin for that very rank), all set before CUDA starts
(scripts/gpu_run.sh sets them; the C++ suite sets them itself). A rank's tensors come from
memory reserved before its first barrier (a cudaMalloc may wait for the GPU to idle), and a body
settles its ranks after the calls that may launch a Triton kernel for the first time (Rank.settle).

What it covers: the protocols of symmem.triton's helpers and examples at 2 to 8 ranks, their
results against symmem's CUDA collectives, failures (mismatch, a rank that never comes) and CUDA
graph replays. What it cannot: NVLink's memory ordering (all traffic stays in one L2) and timing.
"""
import threading
import traceback

import torch

import symmem
from symmem.torch.memory import heap_tensor

WORKSPACE_BYTES = 64 << 20
RESERVED_LARGE_BYTES = 256 << 20
RESERVED_SMALL_MIB = 32


class _Group:
    def __init__(self, world):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=300)
        self.slots = [None] * world
        # Teardown: never aborted. Once every rank is there (no rank waits on `barrier` any more),
        # `barrier` is reset, so that close() can be collective even after a rank failed.
        self.teardown = threading.Barrier(world, action=self.barrier.reset, timeout=300)


class _Exchange(symmem.Exchange):
    def __init__(self, group, rank):
        self.group, self.rank = group, rank

    def all_gather(self, mine):
        self.group.slots[self.rank] = bytes(mine)
        self.group.barrier.wait()
        out = list(self.group.slots)
        self.group.barrier.wait()
        return out

    def barrier(self):
        self.group.barrier.wait()


class Rank:
    """One simulated rank: its communicator (symmem.communicator.Communicator), its stream."""

    def __init__(self, group, rank, timeout_ms):
        self.group, self.rank, self.world = group, rank, group.world
        self.comm = symmem.Communicator(rank, group.world, 0, _Exchange(group, rank), timeout_ms=timeout_ms,
                                        workspace_bytes=WORKSPACE_BYTES)
        self.stream = torch.cuda.Stream()
        self._reserve_memory()

    def _reserve_memory(self):
        """Fills torch's caching allocator for this rank's stream, so that the body's tensors come
        from the cache: a cudaMalloc may wait for the shared GPU to idle, which a peer's kernel
        waiting for this rank never lets it do. (Before the ranks' first barrier; run_ranks empties
        the cache once every rank has left.)"""
        with torch.cuda.stream(self.stream):
            large = torch.empty(RESERVED_LARGE_BYTES, dtype=torch.uint8, device="cuda")
            # Tensors of at most 1 MiB come from the allocator's small pool, of 2 MiB segments.
            small = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(RESERVED_SMALL_MIB)]
        del large, small
        self.stream.synchronize()

    def settle(self):
        """Waits for this rank's stream, then for every rank: afterwards no rank's kernel waits. A
        body settles after each call whose kernel may be launched for the first time in the process
        (a Triton kernel compiled and its module loaded, which waits for the shared GPU to idle)."""
        self.stream.synchronize()
        self.wait_for_every_rank()

    def heap(self, numel, dtype):
        """Collective: a symmetric tensor of `numel` elements (a whole heap buffer)."""
        nbytes = max(numel, 1) * torch.empty((), dtype=dtype).element_size()
        return heap_tensor(self.comm, self.comm.allocate(nbytes), nbytes).view(dtype)[:numel]

    def wait_for_every_rank(self):
        self.group.barrier.wait()


def run_ranks(world, body, timeout_ms=20000):
    """Runs body(rank) for `world` ranks, each on its own thread, stream and communicator (closed
    after, also when a rank failed: a communicator left open would keep its kernels, memory and
    watchdog into the next test); returns their results in rank order, or raises with every failed
    rank's traceback."""
    group = _Group(world)
    results, errors = [None] * world, [None] * world

    def fail(r):
        errors[r] = errors[r] or traceback.format_exc()
        group.barrier.abort()  # peers waiting in wait_for_every_rank or an exchange leave

    def main(r):
        torch.cuda.set_device(0)
        me = None
        try:
            me = Rank(group, r, timeout_ms)
            me.wait_for_every_rank()  # nobody launches before every rank is set up
            with torch.cuda.stream(me.stream):
                results[r] = body(me)
            me.stream.synchronize()
        except BaseException:  # noqa: B036 (reported below)
            fail(r)
        try:
            if me is not None:
                me.stream.synchronize()  # bounded: every wait has the communicator's deadline
        except BaseException:  # noqa: B036
            fail(r)
        # Nobody tears down while a peer's kernel may still wait (every rank comes here); close()
        # synchronises the device first, so no peer still reads this rank's memory.
        try:
            group.teardown.wait()
            if me is not None:
                me.comm.close()
        except BaseException:  # noqa: B036
            fail(r)

    threads = [threading.Thread(target=main, args=(r,), name=f"rank{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.empty_cache()  # the ranks' reserved memory (their streams are gone): nothing runs now
    failed = [f"rank {r}:\n{e}" for r, e in enumerate(errors) if e]
    if failed:
        raise AssertionError(f"world {world}: " + "\n".join(failed))
    return results
