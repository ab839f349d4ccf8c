"""One rank of the killed-rank test (test_torch_gpu.py::test_killed_rank_raises_naming_it):
    python kill_worker.py RANK PORT RESULT_FILE
Two ranks loop over all-reduces on symmem.torch; rank 1 kills itself with SIGKILL after 200
calls; rank 0 writes the code and message of the error it raises into RESULT_FILE."""
import os
import signal

import torch
import torch.distributed as dist

from kill_job_rank import finish, start

rank, result_file = start()
import symmem.torch as st  # noqa: E402


def body():
    x = torch.ones(1 << 16, device="cuda")
    g = dist.group.WORLD.group_name
    comm = st.GroupCommunicator()
    print(f"rank {rank}: communicator ready", flush=True)
    for i in range(100_000):
        if rank == 1 and i == 200:
            torch.cuda.synchronize()
            os.kill(os.getpid(), signal.SIGKILL)
        torch.ops.symmem.all_reduce(x, "sum", g)
        if i % 50 == 0:
            torch.cuda.synchronize()
            comm.check()


finish(rank, result_file, body)
