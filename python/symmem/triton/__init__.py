"""symmem.triton: Triton kernels on symmem's symmetric heap.

    import triton, triton.language as tl
    import symmem.triton as smt

    @triton.jit(do_not_specialize=["signature", "rank"])
    def scale_by_world(x_ptr, n, sync, signature, rank, WORLD: tl.constexpr, BLOCK: tl.constexpr):
        epoch = smt.epoch_begin(sync)
        ...
        if smt.barrier(sync, signature, epoch, 0, rank, WORLD):   # every rank reached here
            ...                                                  # read peers through smt.peer(...)
        smt.epoch_commit(sync, epoch)

    smt.launch(scale_by_world, grid, x, n, comm=comm, name="scale_by_world", shape=(n,), BLOCK=1024)

The helpers (sync.py) mirror include/symmem/device.cuh by name; every wait is bounded by the
communicator's deadline and abort word and returns False instead of hanging. launch() signs the
call (a user kernel is a call of its communicator). docs/kernels.md has the rules; examples/ holds
tested kernels with torch ops. Importing this module needs neither a GPU nor torch.
"""
from .sync import (ABORTED, AT_LEAST, EQUAL, MAX_BLOCKS, MAX_WORLD, MISMATCH, NOT_EQUAL, PHASES, TIMEOUT, barrier,
                   epoch_begin, epoch_commit, heap_stride, keep_waiting, peer, peer_from_table, put_signal,
                   record_failure, signal, signal_add, wait_signal, wait_signals)
from .launcher import description_of, launch
from .sync import (fence_acq_rel_sys, fence_proxy_async_global, global_timer_ns, ld_acquire_sys, ld_acquire_sys_u64,
                   ld_volatile_u32, st_release_sys, st_release_sys_u64, st_volatile_u32, thread_lanes)

__all__ = ["ABORTED", "AT_LEAST", "EQUAL", "MAX_BLOCKS", "MAX_WORLD", "MISMATCH", "NOT_EQUAL", "PHASES", "TIMEOUT",
           "barrier", "epoch_begin", "epoch_commit", "fence_acq_rel_sys", "fence_proxy_async_global",
           "global_timer_ns", "heap_stride", "keep_waiting", "launch", "ld_acquire_sys", "ld_acquire_sys_u64",
           "ld_volatile_u32", "peer", "peer_from_table", "put_signal", "record_failure", "signal", "signal_add",
           "st_release_sys", "st_release_sys_u64", "st_volatile_u32", "thread_lanes", "wait_signal",
           "wait_signals"]
