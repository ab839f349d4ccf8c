"""The set-up every symmem benchmark does under torchrun."""
import os

import torch
import torch.distributed as dist


def init_nccl():
    """This process's GPU (LOCAL_RANK) and an NCCL world group, with NVLink multicast off."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
