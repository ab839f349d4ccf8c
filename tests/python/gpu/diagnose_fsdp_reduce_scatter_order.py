"""Why FSDP2 with symmem's reduce-scatter and FSDP2 with NCCL's end training apart at 3+ ranks:
rounding in another order, or a race. Under torchrun, one process per GPU:

    NCCL_NVLS_ENABLE=0 PYTHONPATH=python:tests/python/gpu:tests/python \\
        torchrun --nproc-per-node 4 tests/python/gpu/diagnose_fsdp_reduce_scatter_order.py [--skew]

Trains test_fsdp_gpu.py's model twice (NCCL's reduce-scatter; symmem's, with `--skew` delayed as in
the skewed-streams test), recording every reduce-scatter's input and output, and prints on rank 0:

- symmem's calls against symmem's order (fp32 sums in rank order, rounded once): all bit-exact
  unless a call read a buffer another call still wrote (a race);
- NCCL's calls against that order (elements that differ: its ring rounds each partial sum) and
  against the rounding bound of any order;
- the first step's gradients (the same inputs in both runs): elements that differ, and among them
  those whose sign differs or that are zero in one run only, which AdamW's first step (lr x g / |g|)
  turns into a step of lr = 0.01 in one run and not the other;
- the parameters after training: elements that differ and by how much (multiples of lr).

Rounding: symmem's calls all exact, NCCL's within the bound, parameter differences near lr on few
elements. A race: some symmem call not exact.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_fsdp_gpu as fsdp_test  # noqa: E402
from reduction_checks import ANY, SYMMEM, gathered, scattered_parts  # noqa: E402
from symmem import testing  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skew", action="store_true", help="delay rank 0's reduce-scatters and rank 1's all-gathers")
    args = parser.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    import symmem.torch.fsdp as sfsdp
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
    group, rank, world = dist.group.WORLD, dist.get_rank(), dist.get_world_size()

    nccl_calls, symmem_calls, nccl_grads, symmem_grads = [], [], [], []
    DefaultReduceScatter.__call__ = fsdp_test._recording(DefaultReduceScatter.__call__, nccl_calls)
    nccl = fsdp_test._train(group, prefetch="explicit", first_grads=nccl_grads)
    call = sfsdp.SymmemReduceScatter.__call__
    if args.skew:
        sfsdp.SymmemAllGather.__call__ = fsdp_test._delay(sfsdp.SymmemAllGather.__call__, rank=1)
        call = fsdp_test._delay(call, rank=0)
    sfsdp.SymmemReduceScatter.__call__ = fsdp_test._recording(call, symmem_calls)
    ours = fsdp_test._train(group, symmem_ag="auto", symmem_rs=True, prefetch="explicit", first_grads=symmem_grads)

    def count(*values):
        t = torch.tensor(values, dtype=torch.float64, device="cuda")
        dist.all_reduce(t)
        return [int(v) for v in t.tolist()]

    lines = []
    for name, calls in (("symmem", symmem_calls), ("NCCL", nccl_calls)):
        inexact = outside = elements = 0
        for inp, out, op, g in calls:
            parts = scattered_parts(gathered(inp, g), g)
            inexact += int(testing.wrong_elements(out, parts, SYMMEM, op).sum())
            outside += int(testing.wrong_elements(out, parts, ANY, op).sum())
            elements += out.numel()
        inexact, outside, elements = count(inexact, outside, elements)
        lines.append(f"{name}: {len(calls)} reduce-scatters per rank, {elements} elements over the ranks: "
                     f"{inexact} differ from symmem's order, {outside} outside the bound of any order")
    same_inputs = sum(torch.equal(a[0], b[0]) for a, b in zip(nccl_calls, symmem_calls))
    lines.append(f"calls with bit-identical inputs in both runs (the first step's at least): {same_inputs}")
    differ = flipped = total = 0
    for a, b in zip(nccl_grads, symmem_grads):
        d = a != b
        differ += int(d.sum())
        flipped += int((d & ((torch.sign(a) != torch.sign(b)) | (a == 0) | (b == 0))).sum())
        total += a.numel()
    differ, flipped, total = count(differ, flipped, total)
    lines.append(f"first-step gradients: {differ} of {total} elements differ, {flipped} of them in sign or zero "
                 "in one run only")
    (_, p_nccl, _), (_, p_ours, _) = nccl, ours
    moved = [(p - q).abs() for p, q in zip(p_ours, p_nccl)]
    differ, = count(sum(int((m > 0).sum()) for m in moved))
    largest = torch.tensor([max(float(m.max()) for m in moved)], device="cuda")
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    lines.append(f"parameters after {fsdp_test.STEPS} steps: {differ} elements differ, largest by "
                 f"{largest.item():.4g} (lr = 0.01)")
    if rank == 0:
        print(f"world {world}{', skewed streams' if args.skew else ''}:\n  " + "\n  ".join(lines), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
