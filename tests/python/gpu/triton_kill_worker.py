"""One rank of the Triton killed-rank test (test_triton_gpu.py::test_killed_rank_is_named_in_time):
    python triton_kill_worker.py RANK PORT RESULT_FILE SECONDS_FILE
Two ranks loop over symmem.triton's one-shot all-reduce, each call synchronised and checked; rank 1
kills itself with SIGKILL after 200 calls; rank 0 writes the code and message of the error it
raises into RESULT_FILE, and into SECONDS_FILE the seconds from the end of its last good call (rank
1 was alive to finish it) to the raise, and SYMMEM_TIMEOUT_MS."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import triton.language as tl

from kill_job_rank import finish, start

seconds_file = sys.argv[4]
rank, result_file = start()
import symmem.torch as st  # noqa: E402
from symmem.torch.device import handle, sync_context  # noqa: E402
from symmem.triton.examples.one_shot_all_reduce import one_shot_all_reduce, one_shot_all_reduce_kernel  # noqa: E402

N, PROGRAMS, WARPS, BLOCK = 1 << 16, 8, 16, 2048
KILLED_AFTER = 200


def compile_first(x, out, comm):
    """Triton compiles a kernel at its first launch: a rank still compiling while its peer's first
    kernel waits (SYMMEM_TIMEOUT_MS is 3 s here) would be named before anyone died. So both ranks
    compile without launching, with the arguments one_shot_all_reduce passes (fp32 sums in fp32; the
    launch then finds the kernel made), and meet."""
    h = handle(x, comm)
    one_shot_all_reduce_kernel.warmup(x, out, x.numel(), grid=(PROGRAMS,), heap_stride=h.heap_stride,
                                      sync=sync_context(comm), signature=1, rank=h.rank, WORLD=h.world,
                                      BLOCK=BLOCK, ACC=tl.float32, num_warps=WARPS)
    dist.barrier()


def body():
    comm = st.GroupCommunicator()
    x = st.empty(N, dtype=torch.float32)
    x.fill_(rank + 1.0)  # the sum, 1 + 2 = 3, is neither rank's input doubled
    out = torch.empty_like(x)
    compile_first(x, out, comm)
    print(f"rank {rank}: communicator ready, kernel compiled", flush=True)
    last_good = time.monotonic()
    try:
        for i in range(100_000):
            if rank == 1 and i == KILLED_AFTER:
                torch.cuda.synchronize()
                os.kill(os.getpid(), signal.SIGKILL)
            out.fill_(float("nan"))
            one_shot_all_reduce(x, comm, out=out, programs=PROGRAMS, num_warps=WARPS, block=BLOCK)
            torch.cuda.synchronize()
            comm.check()
            if i % 50 == 0 and not bool((out == 3.0).all()):
                raise AssertionError(f"call {i}: the sum is {out[:4].tolist()}..., not 3")
            last_good = time.monotonic()
    finally:
        if rank == 0:
            with open(seconds_file, "w") as f:
                f.write(f"{time.monotonic() - last_good:.3f} {os.environ.get('SYMMEM_TIMEOUT_MS', '30000')}")


finish(rank, result_file, body)
