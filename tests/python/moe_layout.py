"""The documented layout of all_to_all_vdev and its 2-D form (symmem/all_to_all.hpp), computed
from every rank's splits and rows gathered with torch.distributed: what the GPU tests compare
symmem's output with (tests/python/gpu/test_moe_gpu.py), checked on gloo ranks by the CPU tests.

The inputs differ in length across ranks (their splits do), and all_gather_into_tensor needs one
count on every rank: NCCL given different counts hangs without an error (the 2 x H100 runs of
a4c57fe and c3037a8 hung in test_all_to_all_vdev_matches_the_layout[1-0]), gloo aborts. So the
lengths are gathered first and every input is padded to the longest."""
import torch
import torch.distributed as dist


def gather_rows(x):
    """[world, longest, ...]: every rank's rows of x (dim 0), zero-padded to the longest input."""
    world = dist.get_world_size()
    lengths = torch.empty(world, dtype=torch.int64, device=x.device)
    dist.all_gather_into_tensor(lengths, torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device))
    longest = int(lengths.max())
    padded = x.new_zeros((longest, *x.shape[1:]))
    padded[:x.shape[0]] = x
    rows = x.new_empty((world, longest, *x.shape[1:]))
    dist.all_gather_into_tensor(rows.view(-1, *x.shape[1:]), padded)
    return rows


def layout_reference(x, in_splits, experts, align):
    """What this rank must receive: every rank's rows for it, expert-major, torch's alignment.
    Returns (chunks [(row, rows)], splits, offsets, rows needed)."""
    world, me = dist.get_world_size(), dist.get_rank()
    n = world * experts
    matrix = torch.empty((world, n), dtype=torch.int64, device=x.device)
    dist.all_gather_into_tensor(matrix.view(-1), in_splits)
    rows = gather_rows(x)
    m = matrix.tolist()
    chunks, splits, offsets, at = [], [0] * n, [0] * n, 0
    for e in range(experts):
        start = at
        for s in range(world):
            j = me * experts + e
            first = sum(m[s][:j])
            count = m[s][j]
            chunks.append((at, rows[s, first:first + count]))
            splits[e * world + s], offsets[e * world + s] = count, at
            at += count
        extent = at - start
        if align:
            extent = max((extent + align - 1) // align * align, align)
        at = start + extent
    return chunks, splits, offsets, at
