"""Probe: the Triton one-shot all-reduce's GPU time call by call, for several grids, alone and right
after another collective on the same stream (symmem's drop-in, torch's two_shot, NCCL). Written to
tell a grid that is slow from one that is slow only after a given neighbour (the torch bench's
`--triton-grids` rows of 32 and more programs took 0.6-1.4 ms at some sizes in session 19).

    torchrun --nproc-per-node 2 tools/triton_grid_probe.py --grids 24:16,64:16,32:32 --tokens 32,96

Each line: rank, tokens, grid, neighbour, then p50 / p90 / max of the one-shot's own events (us).
"""
import argparse
import statistics

import torch
import torch.distributed as dist

from symmem.bench._torchrun import init_nccl


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grids", default="24:16,64:16,32:32")
    p.add_argument("--tokens", default="32,96,256")
    p.add_argument("--calls", type=int, default=100)
    args = p.parse_args()
    init_nccl()
    import torch.distributed._symmetric_memory as symm_mem

    import symmem.torch as st
    from symmem.triton.examples.one_shot_all_reduce import one_shot_all_reduce
    group = dist.group.WORLD
    rank = group.rank()
    grids = [tuple(int(v) for v in g.split(":")) for g in args.grids.split(",")]
    for tokens in (int(t) for t in args.tokens.split(",")):
        n = tokens * 8192
        xt = st.empty(n, dtype=torch.bfloat16, group=group)
        xt.normal_()
        yt = torch.empty_like(xt)
        s = st.empty(n, dtype=torch.bfloat16, group=group)
        s.normal_()
        b2 = symm_mem.empty(n, dtype=torch.bfloat16, device="cuda")
        symm_mem.rendezvous(b2, group.group_name)
        b2.normal_()
        x = torch.randn(n, device="cuda").to(torch.bfloat16)
        neighbours = {"alone": None,
                      "symmem": lambda: st.all_reduce(s, group=group),
                      "torch_two_shot": lambda: torch.ops.symm_mem.two_shot_all_reduce_(b2, "sum", group.group_name),
                      "nccl": lambda: dist.all_reduce(x, group=group)}
        for programs, nbytes in grids:
            def call():
                one_shot_all_reduce(xt, group, out=yt, max_programs=programs, bytes_per_thread=nbytes)
            call()
            torch.cuda.synchronize()
            for name, neighbour in neighbours.items():
                if neighbour is not None:
                    neighbour()
                dist.barrier()
                torch.cuda.synchronize()
                events = []
                for _ in range(args.calls):
                    if neighbour is not None:
                        neighbour()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    call()
                    e1.record()
                    events.append((e0, e1))
                torch.cuda.synchronize()
                us = sorted(a.elapsed_time(b) * 1000 for a, b in events)
                print(f"rank {rank} tokens {tokens} grid {programs}:{nbytes} after {name:>14}: "
                      f"p50 {statistics.median(us):8.2f}  p90 {us[int(0.9 * len(us))]:8.2f}  max {us[-1]:8.2f} us",
                      flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
