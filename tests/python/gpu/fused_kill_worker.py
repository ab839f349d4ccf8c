"""One rank of the killed-rank tests of the fused ops
(test_fused_gpu.py::test_killed_rank_during_all_gather_matmul_raises_naming_it,
test_matmul_reduce_scatter_gpu.py::test_killed_rank_during_matmul_reduce_scatter_raises_naming_it):
    python fused_kill_worker.py RANK PORT RESULT_FILE [all_gather_matmul | matmul_reduce_scatter]
Two ranks loop over the op; rank 1 kills itself with SIGKILL after 50 calls; rank 0 writes the
code and message of the error it raises into RESULT_FILE."""
import os
import signal
import sys

import torch
import torch.distributed as dist

from kill_job_rank import finish, start

op = sys.argv[4] if len(sys.argv) > 4 else "all_gather_matmul"
rank, result_file = start()
import symmem.torch as st  # noqa: E402


def body():
    a = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    comm = st.GroupCommunicator()
    print(f"rank {rank}: communicator ready", flush=True)
    for i in range(100_000):
        if rank == 1 and i == 50:
            torch.cuda.synchronize()
            os.kill(os.getpid(), signal.SIGKILL)
        if op == "all_gather_matmul":
            st.all_gather_matmul(a, b)
        else:
            st.matmul_reduce_scatter(a, b)
        if i % 10 == 0:
            torch.cuda.synchronize()
            comm.check()


finish(rank, result_file, body)
