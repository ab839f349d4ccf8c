"""One rank of the FSDP killed-rank test (test_fsdp_gpu.py::test_killed_rank_mid_step_raises_naming_it):
    python fsdp_kill_worker.py RANK PORT RESULT_FILE
Two ranks train a small FSDP2 model on symmem's comms (no NCCL: gloo for the rendezvous only);
rank 1 kills itself with SIGKILL in the middle of the forward pass of its third step; rank 0 writes
the code and message of the error it raises into RESULT_FILE."""
import faulthandler
import os
import signal
import sys

import torch
import torch.distributed as dist

rank, port, result_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
faulthandler.dump_traceback_later(45, exit=False)  # where it stands, should it ever hang
torch.cuda.set_device(rank)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
import symmem  # noqa: E402
import symmem.torch.fsdp as sfsdp  # noqa: E402
from symmem.bench.llama import Decoder, loss_of  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

outcome = ("no error", "")
try:
    mesh = init_device_mesh("cuda", (2,))
    torch.manual_seed(0)
    model = Decoder(vocab=101, dim=64, layers=3, heads=4, hidden=96).cuda().to(torch.bfloat16)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sfsdp.enable(model)
    step = [0]

    def die_mid_forward(module, args):
        if rank == 1 and step[0] == 2:
            torch.cuda.synchronize()
            os.kill(os.getpid(), signal.SIGKILL)
    model.layers[1].register_forward_pre_hook(die_mid_forward)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step[0] in range(50):
        tokens = torch.randint(0, 101, (2, 33), device="cuda")
        loss = loss_of(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
    print(f"rank {rank}: loop ended", flush=True)
except symmem.SymmemError as e:
    outcome = (e.code, str(e))
except Exception as e:  # noqa: BLE001 (the test reports whatever it was)
    outcome = ("other", f"{type(e).__name__}: {e}")
with open(result_file, "w") as f:
    f.write(outcome[0] + "\n" + outcome[1])
os._exit(0)  # no teardown: the peer is gone
