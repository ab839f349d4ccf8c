"""Probe: where the host time of an eager symmem.triton launch goes (the Triton one-shot took about
70 us per eager call on 2 x H200 against 10 for symmem's drop-in). One rank, one GPU:

    torchrun --nproc-per-node 1 tools/triton_launch_profile.py

Prints host microseconds per call of: the example's wrapper (one_shot_all_reduce), symmem.triton.launch
alone, and Triton's own JIT launch of the same kernel with the same arguments (no symmem call around
it); then the wrapper's cProfile, top functions by cumulative time.
"""
import cProfile
import io
import pstats
import time

import torch
import torch.distributed as dist
import triton.language as tl

from symmem.bench._torchrun import init_nccl


def per_call_us(fn, calls):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e6 / calls


def main():
    init_nccl()
    import symmem.torch as st
    import symmem.triton as smt
    from symmem.torch.device import sync_context
    from symmem.triton.examples.one_shot_all_reduce import one_shot_all_reduce, one_shot_all_reduce_kernel
    group = dist.group.WORLD
    n = 32 * 8192
    x = st.empty(n, dtype=torch.bfloat16, group=group)
    x.normal_()
    y = torch.empty_like(x)
    block, programs = 8192, 24

    def wrapper():
        one_shot_all_reduce(x, group, out=y)

    def launch():
        smt.launch(one_shot_all_reduce_kernel, programs, x, y, n, comm=group, name="one_shot_all_reduce",
                   shape=(n, "bfloat16"), BLOCK=block, ACC=tl.float32, num_warps=16)

    sync = sync_context(group)

    def triton_alone():  # the same kernel and arguments, no symmem call around it (world 1: no peer waits)
        one_shot_all_reduce_kernel[(programs,)](x, y, n, 0, sync, 1, 0, WORLD=1, BLOCK=block, ACC=tl.float32,
                                                num_warps=16)

    for fn in (wrapper, launch):
        fn()
    torch.cuda.synchronize()
    for name, fn in (("wrapper", wrapper), ("launch", launch), ("wrapper", wrapper), ("launch", launch)):
        print(f"{name:>14}: {per_call_us(fn, 2000):7.1f} us per call (host)", flush=True)
    print("the same kernel through Triton alone follows; its epochs differ from the communicator's, so the "
          "communicator is not used after it", flush=True)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        wrapper()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(30)
    print(text.getvalue(), flush=True)
    triton_alone()
    torch.cuda.synchronize()
    print(f"{'triton alone':>14}: {per_call_us(triton_alone, 2000):7.1f} us per call (host)", flush=True)
    st.close_all()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
