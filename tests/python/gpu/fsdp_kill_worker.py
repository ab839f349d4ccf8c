"""One rank of the FSDP killed-rank test (test_fsdp_gpu.py::test_killed_rank_mid_step_raises_naming_it):
    python fsdp_kill_worker.py RANK PORT RESULT_FILE
Two ranks train a small FSDP2 model on symmem's comms (no NCCL: gloo for the rendezvous only);
rank 1 kills itself with SIGKILL in the middle of the forward pass of its third step; rank 0 writes
the code and message of the error it raises into RESULT_FILE."""
import os
import signal

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from kill_job_rank import finish, start

rank, result_file = start()
import symmem.torch.fsdp as sfsdp  # noqa: E402
from symmem.bench.llama import Decoder, loss_of  # noqa: E402


def body():
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


finish(rank, result_file, body)
