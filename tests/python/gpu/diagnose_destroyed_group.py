"""What torch.distributed (NCCL) and symmem.torch do with a collective on a destroyed group: the
rule docs/torch.md states (both refuse it with a DistBackendError). Under torchrun:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=python \\
        torchrun --nproc-per-node 2 tests/python/gpu/diagnose_destroyed_group.py
"""
import os

import torch
import torch.distributed as dist


def outcome(call):
    try:
        call()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__module__}.{type(e).__name__} (DistBackendError: {isinstance(e, dist.DistBackendError)}): " \
               f"{str(e).splitlines()[0][:160]}"
    return "ran"


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    import symmem.torch as st
    sub = dist.new_group(list(range(dist.get_world_size())))
    x = torch.ones(1024, device="cuda")
    dist.all_reduce(x, group=sub)
    st.all_reduce(x, group=sub)
    torch.cuda.synchronize()
    dist.destroy_process_group(sub)
    results = {"symmem.torch.all_reduce": outcome(lambda: st.all_reduce(x, group=sub)),
               "torch.distributed.all_reduce (NCCL)": outcome(lambda: dist.all_reduce(x, group=sub))}
    if dist.get_rank() == 0:
        for name, result in results.items():
            print(f"{name} on a destroyed group: {result}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
