"""torch.ops.symm_mem's fused ops under symmem's namespace, with torch's schemas, so that a call site
switches by changing the namespace:

  symmem::fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *,
                                  bool return_A=True) -> (Tensor?, Tensor[])
  symmem::fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim,
                                      str group_name) -> Tensor

As torch's: A is this rank's shard along `gather_dim` (last dim k); the result is
``(all_gather(A, gather_dim) if return_A else None, [all_gather(A, gather_dim) @ B for B in Bs])``;
the reduce-scatter form returns this rank's part along `scatter_dim` of reduce_op ("sum", "avg")
over the group of ``A @ B``. Unlike torch's, A need not be a symmetric tensor. Outputs are
contiguous. float16 / bfloat16 with the gathered (scattered) dim not the last run symmem's fused
ops (fused.py: the first B, further Bs multiply the gathered A it hands back); any other case runs
symmem's all-gather (reduce-scatter) and torch.matmul, with the same results.
"""
import torch
import torch.distributed.distributed_c10d as c10d

from . import fused

_lib = torch.library.Library("symmem", "FRAGMENT")
_TAGS = (torch.Tag.pt2_compliant_tag,)
_lib.define("fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *, bool return_A=True) "
            "-> (Tensor?, Tensor[])", tags=_TAGS)
_lib.define("fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor",
            tags=_TAGS)


def _world(group_name):
    return c10d._resolve_process_group(group_name).size()


def _dim(d, rank, op):
    if not -rank <= d < rank:
        raise ValueError(f"symmem.{op}: dim {d} of a {rank}-D A")
    return d % rank


def _fused(A, dim):
    """Whether symmem's fused kernel takes this A (else the all-gather or reduce-scatter and a matmul)."""
    return A.dtype in fused._TYPES and dim != A.dim() - 1


def _gathered_shape(A, dim, world):
    shape = list(A.shape)
    shape[dim] *= world
    return shape


def _fused_all_gather_matmul(A, Bs, gather_dim, group_name, *, return_A=True):
    if A.dim() < 2 or not Bs:
        raise ValueError(f"symmem.fused_all_gather_matmul: A must have 2 or more dims ({tuple(A.shape)}) and Bs "
                         "at least one matrix")
    dim = _dim(gather_dim, A.dim(), "fused_all_gather_matmul")
    world = _world(group_name)
    moved = A.movedim(dim, 0).contiguous()  # the gathered dim first: the ranks' shards are row blocks
    if _fused(A, dim):
        rows = moved.reshape(-1, A.shape[-1])
        c0, gathered = torch.ops.symmem.all_gather_matmul(rows, Bs[0], group_name, return_A or len(Bs) > 1)
        first = [c0]
    else:
        gathered = torch.ops.symmem.all_gather_into_tensor(moved, group_name)
        first = []
    a_moved = None if gathered is None else gathered.view(moved.shape[0] * world, *moved.shape[1:])
    a_gathered = None if a_moved is None else a_moved.movedim(0, dim).contiguous()
    products = first + [a_gathered @ B for B in Bs[len(first):]]
    shape = _gathered_shape(A, dim, world)
    outputs = []
    for B, c in zip(Bs, products):
        if len(outputs) < len(first):  # the fused op's rows: the gathered dim first
            c = c.view(moved.shape[0] * world, *moved.shape[1:-1], B.shape[1]).movedim(0, dim)
        outputs.append(c.contiguous().view(*shape[:-1], B.shape[1]))
    return (a_gathered if return_A else None), outputs


def _fused_all_gather_matmul_fake(A, Bs, gather_dim, group_name, *, return_A=True):
    dim = _dim(gather_dim, A.dim(), "fused_all_gather_matmul")
    shape = _gathered_shape(A, dim, _world(group_name))
    return (A.new_empty(shape) if return_A else None), [A.new_empty(shape[:-1] + [B.shape[1]]) for B in Bs]


def _fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    if reduce_op not in ("sum", "avg"):
        raise ValueError(f"symmem.fused_matmul_reduce_scatter: reduce_op {reduce_op!r} is not 'sum' or 'avg'")
    if A.dim() < 2:
        raise ValueError(f"symmem.fused_matmul_reduce_scatter: A must have 2 or more dims ({tuple(A.shape)})")
    world = _world(group_name)
    dim = _dim(scatter_dim, A.dim(), "fused_matmul_reduce_scatter")
    out_shape = list(A.shape[:-1]) + [B.shape[1]]
    if out_shape[dim] % world:
        raise ValueError(f"symmem.fused_matmul_reduce_scatter: dim {scatter_dim} of A @ B ({out_shape[dim]}) must "
                         f"divide by the group size {world}")
    if _fused(A, dim):
        moved = A.movedim(dim, 0).contiguous()
        c = torch.ops.symmem.matmul_reduce_scatter(moved.reshape(-1, A.shape[-1]), B, group_name)
        c = c.view(moved.shape[0] // world, *moved.shape[1:-1], B.shape[1]).movedim(0, dim)
        if reduce_op == "avg":
            c = c / world
    else:
        partial = (A @ B).movedim(dim, 0).contiguous()
        c = torch.ops.symmem.reduce_scatter_tensor(partial, reduce_op, group_name).movedim(0, dim)
    out_shape[dim] //= world
    return c.contiguous().view(out_shape)


def _fused_matmul_reduce_scatter_fake(A, B, reduce_op, scatter_dim, group_name):
    world = _world(group_name)
    dim = _dim(scatter_dim, A.dim(), "fused_matmul_reduce_scatter")
    shape = list(A.shape[:-1]) + [B.shape[1]]
    shape[dim] //= world
    return A.new_empty(shape)


for _key in ("CUDA", "CPU"):
    _lib.impl("fused_all_gather_matmul", _fused_all_gather_matmul, _key)
    _lib.impl("fused_matmul_reduce_scatter", _fused_matmul_reduce_scatter, _key)
torch.library.register_fake("symmem::fused_all_gather_matmul", _fused_all_gather_matmul_fake, lib=_lib)
torch.library.register_fake("symmem::fused_matmul_reduce_scatter", _fused_matmul_reduce_scatter_fake, lib=_lib)
