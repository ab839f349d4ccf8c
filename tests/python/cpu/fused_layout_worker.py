"""Rank 0 of a fake process group of WORLD ranks (no data moves; shapes and strides are real):
torch.ops.symm_mem's fused ops on meta tensors (torch's own Meta kernels, whose layout is its CUDA
kernels') against symmem's fake kernels (FakeTensorMode) and its CPU kernels, case by case.
Prints one line per mismatch, then "checked N cases".

    python fused_layout_worker.py WORLD
"""
import sys

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.distributed.fake_pg import FakeStore

world = int(sys.argv[1])
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
import torch.distributed._symmetric_memory  # noqa: E402,F401  registers torch.ops.symm_mem

import symmem.torch  # noqa: E402,F401  registers torch.ops.symmem

group = dist.group.WORLD.group_name
bad, checked = [], 0


def layout(t):
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype)


def compare(what, theirs, *ours):
    global checked
    checked += 1
    for name, mine in zip(("fake", "cpu"), ours):
        if mine != theirs:
            bad.append(f"{what} {name}: symmem {mine}, torch {theirs}")


def gather_operands(device, shard, dtype, b_shapes, b_transposed):
    """A_shard and Bs (row-major, or W.t() of row-major W) on `device`."""
    a = torch.ones(shard, device=device, dtype=dtype)
    bs = [torch.ones(n, k, device=device, dtype=dtype).t() if b_transposed else
          torch.ones(k, n, device=device, dtype=dtype) for k, n in b_shapes]
    return a, bs


# (shard shape, gathered dim): 2-D to 4-D, every dim, negative dims; gathered k (the last dim)
# with B of world x k rows.
for a_shape in ((64, 32), (8, 16, 32), (2, 8, 4, 16)):
    for dim in range(-len(a_shape), len(a_shape)):
        for dtype in (torch.bfloat16, torch.float32):
            for b_transposed in (False, True):
                for return_a in (True, False):
                    shard = list(a_shape)
                    k = shard[-1] * (world if dim % len(a_shape) == len(a_shape) - 1 else 1)
                    b_shapes = [(k, 16), (k, 24), (k, 8)]
                    what = f"fused_all_gather_matmul shard {shard} dim {dim} {dtype} b_t {b_transposed} A {return_a}"
                    a, bs = gather_operands("meta", shard, dtype, b_shapes, b_transposed)
                    # torch's CUDA kernel rejects negative dims (its Meta kernel only -1): compare
                    # with torch at the same dim counted from the front.
                    ta, touts = torch.ops.symm_mem.fused_all_gather_matmul(a, bs, dim % len(a_shape), group,
                                                                            return_A=return_a)
                    with FakeTensorMode():
                        a, bs = gather_operands("cpu", shard, dtype, b_shapes, b_transposed)
                        fa, fouts = torch.ops.symmem.fused_all_gather_matmul(a, bs, dim, group, return_A=return_a)
                    a, bs = gather_operands("cpu", shard, dtype, b_shapes, b_transposed)
                    ca, couts = torch.ops.symmem.fused_all_gather_matmul(a, bs, dim, group, return_A=return_a)
                    compare(what + " A", layout(ta), layout(fa), layout(ca))
                    compare(what + " len", len(touts), len(fouts), len(couts))
                    for i, (t, f, c) in enumerate(zip(touts, fouts, couts)):
                        compare(what + f" out {i}", layout(t), layout(f), layout(c))

for a_shape in ((64, 32), (8, 64, 32), (4, 8, 16, 32)):
    for dim in range(-len(a_shape), len(a_shape)):
        for dtype in (torch.float16, torch.float32):
            for b_transposed in (False, True):
                for reduce_op in ("sum", "avg"):
                    n = 8 * world
                    if dim % len(a_shape) < len(a_shape) - 1 and a_shape[dim] % world:
                        continue
                    what = f"fused_matmul_reduce_scatter A {a_shape} dim {dim} {dtype} b_t {b_transposed} {reduce_op}"

                    def operands(device):
                        a = torch.ones(a_shape, device=device, dtype=dtype)
                        k = a_shape[-1]
                        b = (torch.ones(n, k, device=device, dtype=dtype).t() if b_transposed else
                             torch.ones(k, n, device=device, dtype=dtype))
                        return a, b
                    t = torch.ops.symm_mem.fused_matmul_reduce_scatter(*operands("meta"), reduce_op,
                                                                       dim % len(a_shape), group)
                    with FakeTensorMode():
                        f = torch.ops.symmem.fused_matmul_reduce_scatter(*operands("cpu"), reduce_op, dim, group)
                    c = torch.ops.symmem.fused_matmul_reduce_scatter(*operands("cpu"), reduce_op, dim, group)
                    compare(what, layout(t), layout(f), layout(c))

for line in bad:
    print(line)
print(f"checked {checked} cases")
dist.destroy_process_group()
