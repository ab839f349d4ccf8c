"""One PTX instruction per function, named as include/symmem/device.cuh and src/device/ptx.cuh name
them (semantics and scope): the only inline assembly of symmem.triton.

Why assembly: Triton's atomics default to gpu scope and its loads have no acquire form; flags that
another GPU writes need system scope, and polling must load, never read-modify-write (a copy
engine's or the host's write to a flag is not an atomic that an RMW is atomic with).

Inline assembly runs in every thread that holds an element of its operands (a scalar: every
thread of the program), so each function here is either harmless when repeated (loads, fences,
stores of one value) or predicated by a mask (`on`: nonzero lanes only). Values read here may
differ from thread to thread (each thread loads at its own moment): sync.py decides nothing on
them before a reduction has made them uniform. Under TRITON_INTERPRET=1, symmem.triton uses
interpreted.py's twins instead (the interpreter runs no assembly).
"""
import triton
import triton.language as tl


# The lanes of a program, one per thread: a reduction over them has no replicated elements, so its
# result is the same in every thread (what a branch on it needs).
@triton.jit
def thread_lanes():
    return tl.arange(0, tl.extra.cuda.num_threads())


# Load that synchronises-with a release store of another GPU (or the CPU) to the same flag; 0 in
# lanes where `on` is 0 (their address is not read).
@triton.jit
def ld_acquire_sys(p, on):
    return tl.inline_asm_elementwise(
        "{ .reg .pred on; setp.ne.u32 on, $2, 0; mov.u32 $0, 0; @on ld.acquire.sys.global.u32 $0, [$1]; }",
        "=r,l,r", [p, tl.cast(on, tl.uint32)], dtype=tl.uint32, is_pure=False, pack=1)


@triton.jit
def ld_acquire_sys_u64(p, on):
    return tl.inline_asm_elementwise(
        "{ .reg .pred on; setp.ne.u32 on, $2, 0; mov.u64 $0, 0; @on ld.acquire.sys.global.u64 $0, [$1]; }",
        "=l,l,r", [p, tl.cast(on, tl.uint32)], dtype=tl.uint64, is_pure=False, pack=1)


# Store that publishes every write this thread has observed (cumulativity) before the flag; only
# in lanes where `on` is nonzero.
@triton.jit
def st_release_sys(p, v, on):
    tl.inline_asm_elementwise(
        "{ .reg .pred on; setp.ne.u32 on, $3, 0; @on st.release.sys.global.u32 [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r,r", [p, tl.cast(v, tl.uint32), tl.cast(on, tl.uint32)], dtype=tl.uint32, is_pure=False, pack=1)


@triton.jit
def st_release_sys_u64(p, v, on):
    tl.inline_asm_elementwise(
        "{ .reg .pred on; setp.ne.u32 on, $3, 0; @on st.release.sys.global.u64 [$1], $2; mov.u32 $0, 0; }",
        "=r,l,l,r", [p, tl.cast(v, tl.uint64), tl.cast(on, tl.uint32)], dtype=tl.uint32, is_pure=False, pack=1)


# Volatile access to host-mapped memory (the abort word, the failure record), never cached.
# Volatile orders nothing by itself: fence_acq_rel_sys around it does.
@triton.jit
def ld_volatile_u32(p):
    return tl.inline_asm_elementwise("ld.volatile.global.u32 $0, [$1];", "=r,l", [p], dtype=tl.uint32,
                                     is_pure=False, pack=1)


# The same, only in lanes where `on` is nonzero (0 elsewhere): a host word read by one thread.
@triton.jit
def ld_volatile_u32_on(p, on):
    return tl.inline_asm_elementwise(
        "{ .reg .pred on; setp.ne.u32 on, $2, 0; mov.u32 $0, 0; @on ld.volatile.global.u32 $0, [$1]; }",
        "=r,l,r", [p, tl.cast(on, tl.uint32)], dtype=tl.uint32, is_pure=False, pack=1)


@triton.jit
def st_volatile_u32(p, v):
    tl.inline_asm_elementwise("st.volatile.global.u32 [$1], $2; mov.u32 $0, 0;", "=r,l,r", [p, tl.cast(v, tl.uint32)],
                              dtype=tl.uint32, is_pure=False, pack=1)


# Orders this thread's earlier accesses against later ones at system scope.
@triton.jit
def fence_acq_rel_sys():
    tl.inline_asm_elementwise("fence.acq_rel.sys; mov.u32 $0, 0;", "=r", [], dtype=tl.uint32, is_pure=False,
                              pack=1)


# After acquiring a flag that guards data TMA will load: orders the generic-proxy acquire before
# the async proxy's reads (cp.async.bulk.tensor). Without it TMA may read stale data.
@triton.jit
def fence_proxy_async_global():
    tl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=tl.uint32,
                              is_pure=False, pack=1)


# Nanoseconds since an arbitrary origin, shared by all SMs of the GPU (coarse: ~1 us ticks), in every
# lane of `lanes` (a vector, so that a reduction can make it uniform: each thread reads its own).
@triton.jit
def global_timer_ns(lanes):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [lanes], dtype=tl.uint64, is_pure=False,
                                     pack=1)
