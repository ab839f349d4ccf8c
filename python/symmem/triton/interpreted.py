"""ptx.py's functions for Triton's interpreter (TRITON_INTERPRET=1), which runs no assembly: the
same names and arguments, so that sync.py's logic runs unchanged on the CPU, each rank a process
over shared memory (tests/python/cpu/test_triton_interpreter.py).

The interpreter runs a grid's programs one after another in one thread, with numpy loads and
stores straight to memory (x86 keeps each process's stores in order), so: loads poll
(`volatile`), stores publish, fences are empty, and the clock is the host's. Its atomics are
read-modify-writes of numpy arrays, atomic within the process only: helpers never poll with them,
and every flag has a single writer.
"""
import time

import triton
import triton.language as tl

LANES = 8  # the interpreter has no threads; one lane per possible peer


def _host_clock_ns():
    return time.monotonic_ns()


@triton.jit
def thread_lanes():
    return tl.arange(0, LANES)


@triton.jit
def ld_acquire_sys(p, on):
    return tl.load(p, mask=on != 0, other=0, volatile=True)


@triton.jit
def ld_acquire_sys_u64(p, on):
    return tl.load(p, mask=on != 0, other=0, volatile=True)


@triton.jit
def st_release_sys(p, v, on):
    tl.store(p, tl.cast(v, tl.uint32), mask=on != 0)


@triton.jit
def st_release_sys_u64(p, v, on):
    tl.store(p, tl.cast(v, tl.uint64), mask=on != 0)


@triton.jit
def ld_volatile_u32(p):
    return tl.load(p, volatile=True)


@triton.jit
def ld_volatile_u32_on(p, on):
    return tl.load(p, mask=on != 0, other=0, volatile=True)


@triton.jit
def st_volatile_u32(p, v):
    tl.store(p, tl.cast(v, tl.uint32))


@triton.jit
def fence_acq_rel_sys():
    pass


@triton.jit
def fence_proxy_async_global():
    pass


@triton.jit
def global_timer_ns(lanes):
    return tl.cast(lanes, tl.uint64) * 0 + _host_clock_ns()
