"""What every rank of a killed-rank job does around its own body (kill_worker.py,
fsdp_kill_worker.py; the job is run by conftest.run_killed_rank_job):
    python WORKER RANK PORT RESULT_FILE"""
import faulthandler
import os
import sys

import torch
import torch.distributed as dist


def start():
    """(rank, result file): this rank's GPU and a gloo world group of 2 for the job (gloo: no
    NCCL, which would hang on the dead peer; symmem uses the group's store only)."""
    rank, port, result_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    faulthandler.dump_traceback_later(45, exit=False)  # where it stands, should it ever hang
    print(f"rank {rank}: start", flush=True)
    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    return rank, result_file


def finish(rank, result_file, body):
    """Runs body(), writes the code and message of the error it raised ("no error" if none) into
    result_file, and exits without teardown (the peer is gone)."""
    import symmem
    outcome = ("no error", "")
    try:
        body()
        print(f"rank {rank}: loop ended", flush=True)
    except symmem.SymmemError as e:
        outcome = (e.code, str(e))
    except Exception as e:  # noqa: BLE001 (the test reports whatever it was)
        outcome = ("other", f"{type(e).__name__}: {e}")
    with open(result_file, "w") as f:
        f.write(outcome[0] + "\n" + outcome[1])
    os._exit(0)
