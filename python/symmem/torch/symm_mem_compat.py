"""torch.ops.symm_mem's fused ops under symmem's namespace, with torch's schemas, so that a call site
switches by changing the namespace:

  symmem::fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *,
                                  bool return_A=True) -> (Tensor?, Tensor[])
  symmem::fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim,
                                      str group_name) -> Tensor

As torch's: A is this rank's shard along `gather_dim` (any rank >= 2, last dim k); the result is
``(all_gather(A, gather_dim) if return_A else None, [all_gather(A, gather_dim) @ B for B in Bs])``;
the reduce-scatter form returns this rank's part along `scatter_dim` of reduce_op ("sum", "avg")
over the group of ``A @ B``. Unlike torch's, A need not be a symmetric tensor. The first B runs
symmem's fused op (fused.py); further Bs multiply the gathered A that op hands back. float16 and
bfloat16, as the fused ops.
"""
import torch
import torch.distributed.distributed_c10d as c10d

from . import fused  # noqa: F401  (registers symmem::all_gather_matmul / matmul_reduce_scatter)

_lib = torch.library.Library("symmem", "FRAGMENT")
_TAGS = (torch.Tag.pt2_compliant_tag,)
_lib.define("fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *, bool return_A=True) "
            "-> (Tensor?, Tensor[])", tags=_TAGS)
_lib.define("fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor",
            tags=_TAGS)


def _dim(d, rank, op):
    """`d` as a dim of a `rank`-D A that is not its last (k)."""
    if not -rank <= d < rank or d % rank == rank - 1:
        raise ValueError(f"symmem.{op}: dim {d} of a {rank}-D A (the last dim, k, cannot be gathered or scattered)")
    return d % rank


def _fused_all_gather_matmul(A, Bs, gather_dim, group_name, *, return_A=True):
    if A.dim() < 2 or not Bs:
        raise ValueError(f"symmem.fused_all_gather_matmul: A must have 2 or more dims ({tuple(A.shape)}) and Bs "
                         "at least one matrix")
    dim = _dim(gather_dim, A.dim(), "fused_all_gather_matmul")
    # Gather dim first, the rest flattened to rows: A_gathered's rows are the ranks' shards in order.
    moved = A.movedim(dim, 0).contiguous()
    rows = moved.reshape(-1, A.shape[-1])
    c0, gathered = torch.ops.symmem.all_gather_matmul(rows, Bs[0], group_name, True)
    world = c10d._resolve_process_group(group_name).size()
    shape = (moved.shape[0] * world, *moved.shape[1:])
    a_gathered = gathered.view(shape)
    outputs = [c0.view(*shape[:-1], Bs[0].shape[1])]
    outputs += [(gathered @ B).view(*shape[:-1], B.shape[1]) for B in Bs[1:]]
    outputs = [c.movedim(0, dim) for c in outputs]
    return (a_gathered.movedim(0, dim) if return_A else None), outputs


def _fused_all_gather_matmul_fake(A, Bs, gather_dim, group_name, *, return_A=True):
    world = c10d._resolve_process_group(group_name).size()
    dim = _dim(gather_dim, A.dim(), "fused_all_gather_matmul")
    shape = list(A.shape)
    shape[dim] *= world
    a_gathered = A.new_empty(shape)
    return (a_gathered if return_A else None), [A.new_empty(shape[:-1] + [B.shape[1]]) for B in Bs]


def _fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    if reduce_op not in ("sum", "avg"):
        raise ValueError(f"symmem.fused_matmul_reduce_scatter: reduce_op {reduce_op!r} is not 'sum' or 'avg'")
    if A.dim() < 2:
        raise ValueError(f"symmem.fused_matmul_reduce_scatter: A must have 2 or more dims ({tuple(A.shape)})")
    dim = _dim(scatter_dim, A.dim(), "fused_matmul_reduce_scatter")
    world = c10d._resolve_process_group(group_name).size()
    moved = A.movedim(dim, 0).contiguous()
    if moved.shape[0] % world:
        raise ValueError(f"symmem.fused_matmul_reduce_scatter: dim {scatter_dim} of A ({A.shape[dim]}) must divide by "
                         f"the group size {world}")
    c = torch.ops.symmem.matmul_reduce_scatter(moved.reshape(-1, A.shape[-1]), B, group_name)
    if reduce_op == "avg":
        c = c / world
    return c.view(moved.shape[0] // world, *moved.shape[1:-1], B.shape[1]).movedim(0, dim)


def _fused_matmul_reduce_scatter_fake(A, B, reduce_op, scatter_dim, group_name):
    world = c10d._resolve_process_group(group_name).size()
    dim = _dim(scatter_dim, A.dim(), "fused_matmul_reduce_scatter")
    shape = list(A.shape[:-1]) + [B.shape[1]]
    shape[dim] //= world
    return A.new_empty(shape)


for _key in ("CUDA", "CPU"):
    _lib.impl("fused_all_gather_matmul", _fused_all_gather_matmul, _key)
    _lib.impl("fused_matmul_reduce_scatter", _fused_matmul_reduce_scatter, _key)
torch.library.register_fake("symmem::fused_all_gather_matmul", _fused_all_gather_matmul_fake, lib=_lib)
torch.library.register_fake("symmem::fused_matmul_reduce_scatter", _fused_matmul_reduce_scatter_fake, lib=_lib)
