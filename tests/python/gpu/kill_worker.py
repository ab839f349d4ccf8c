"""One rank of the killed-rank test (test_torch_gpu.py::test_killed_rank_raises_naming_it):
    python kill_worker.py RANK PORT RESULT_FILE
Two ranks loop over all-reduces on symmem.torch; rank 1 kills itself with SIGKILL after 200
calls; rank 0 writes the code and message of the error it raises into RESULT_FILE."""
import faulthandler
import os
import signal
import sys

import torch
import torch.distributed as dist

rank, port, result_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
faulthandler.dump_traceback_later(45, exit=False)  # where it stands, should it ever hang
print(f"rank {rank}: start", flush=True)
torch.cuda.set_device(rank)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
import symmem  # noqa: E402
import symmem.torch as st  # noqa: E402

x = torch.ones(1 << 16, device="cuda")
g = dist.group.WORLD.group_name
outcome = ("no error", "")
try:
    comm = st.Communicator()
    print(f"rank {rank}: communicator ready", flush=True)
    for i in range(100_000):
        if rank == 1 and i == 200:
            torch.cuda.synchronize()
            os.kill(os.getpid(), signal.SIGKILL)
        torch.ops.symmem.all_reduce(x, "sum", g)
        if i % 50 == 0:
            torch.cuda.synchronize()
            comm.check()
    print(f"rank {rank}: loop ended", flush=True)
except symmem.SymmemError as e:
    outcome = (e.code, str(e))
except Exception as e:  # noqa: BLE001 (the test reports whatever it was)
    outcome = ("other", f"{type(e).__name__}: {e}")
with open(result_file, "w") as f:
    f.write(outcome[0] + "\n" + outcome[1])
os._exit(0)  # no teardown: the peer is gone
