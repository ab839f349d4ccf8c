"""torch.ops.symm_mem's fused ops under symmem's namespace, with torch's schemas, so that a call site
switches by changing the namespace:

  symmem::fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *,
                                  bool return_A=True) -> (Tensor?, Tensor[])
  symmem::fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim,
                                      str group_name) -> Tensor

As torch's: A is this rank's shard along `gather_dim` (last dim k); the result is
``(all_gather(A, gather_dim) if return_A else None, [all_gather(A, gather_dim) @ B for B in Bs])``;
the reduce-scatter form returns this rank's part along `scatter_dim` of reduce_op ("sum", "avg")
over the group of ``A @ B``. Unlike torch's, A need not be a symmetric tensor, and a negative dim
counts from the end.

Layout, as torch 2.11's CUDA kernels return it (and the fake kernels below, by the same function):
  - fused_all_gather_matmul, gather_dim d not the last: the gathered A and every product have the
    gathered dim outermost in memory (the ranks' blocks are row blocks of one matrix), the other
    dims in order: contiguous for d = 0, else the strides of ``empty(moved).movedim(0, d)``, e.g.
    (32, 256, 1) for a gathered A [8, 64, 32] at d = 1. Views of the one buffer the kernel wrote,
    no copy.
  - gather_dim the last (k is gathered: each B has world x k rows): contiguous.
  - fused_matmul_reduce_scatter: contiguous, whatever the dim.
A is copied once when A.movedim(dim, 0) is not contiguous (as torch's: restride it with
torch.distributed._symmetric_memory.restride_A_shard_for_fused_all_gather_matmul to avoid that).
B may have any strides: packed row-major or column-major (W.t() of a contiguous weight) it is read
where it lies, otherwise copied once (symmem.torch.fused.b_operand).

Which kernel: float16 / bfloat16 with the gathered (scattered) dim not the last, B of A's type, k
and n multiples of 8 run symmem's fused ops (fused.py: the first B; further Bs multiply the gathered
A it hands back); any other case runs symmem's all-gather (reduce-scatter) and torch.matmul, with
the same layout. "avg" on the fused path divides the sum, rounded once to the output type, by the
group size: exact for groups of 2, 4 or 8 ranks but for subnormal quotients, one more rounding
otherwise (and a float16 sum past
65504 is inf first), where the unfused path's kernels scale the float32 sum before their one
rounding: the two may differ in the last bit at other group sizes (docs/fused.md).
"""
import torch

from . import fused
from .groups import state_of

_lib = torch.library.Library("symmem", "FRAGMENT")
_TAGS = (torch.Tag.pt2_compliant_tag,)
_lib.define("fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *, bool return_A=True) "
            "-> (Tensor?, Tensor[])", tags=_TAGS)
_lib.define("fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor",
            tags=_TAGS)

_AG = "fused_all_gather_matmul"
_RS = "fused_matmul_reduce_scatter"


def _world(group_name):
    return state_of(group_name).world


def _dim(d, rank, op):
    if not -rank <= d < rank:
        raise ValueError(f"symmem.{op}: dim {d} of a {rank}-D A")
    return d % rank


def output_strides(shape, dim):
    """The strides torch's fused ops give an output of `shape` whose dim `dim` was gathered
    (scattered): `dim` outermost, the other dims in order; contiguous when `dim` is the last (or
    the first). As torch computes contiguous strides: extents of 0 count as 1."""
    last = len(shape) - 1
    order = list(range(len(shape))) if dim == last else [dim] + [d for d in range(len(shape)) if d != dim]
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _fused(rows, B):
    """Whether symmem's fused kernel takes A's rows (A moved to 2-D, the gathered or scattered dim
    first, not the last) and B; else the all-gather (reduce-scatter) and a matmul. The kernel's
    limits: 16-bit types, k and n multiples of 8, rows 16-byte aligned (a view may start anywhere)."""
    return (rows.dtype in fused._TYPES and B.dtype == rows.dtype and rows.shape[1] % 8 == 0 and B.shape[1] % 8 == 0
            and rows.data_ptr() % 16 == 0)


def _check_gather(A, Bs, gather_dim, group_name):
    """(dim, world, the gathered shape of A), or the error torch's op raises."""
    if A.dim() < 2:
        raise ValueError(f"symmem.{_AG}: A must have 2 or more dims ({tuple(A.shape)})")
    dim = _dim(gather_dim, A.dim(), _AG)
    world = _world(group_name)
    shape = list(A.shape)
    shape[dim] *= world
    for B in Bs:
        if B.dim() != 2 or B.shape[0] != shape[-1]:
            raise ValueError(f"symmem.{_AG}: every B must be a matrix of {shape[-1]} rows (the gathered A's last "
                             f"dim), got {tuple(B.shape)}")
    return dim, world, shape


def _gathered_outputs_layout(A, Bs, gather_dim, group_name):
    """[(shape, strides)] of the gathered A, then of each product."""
    dim, _, shape = _check_gather(A, Bs, gather_dim, group_name)
    shapes = [shape] + [shape[:-1] + [B.shape[1]] for B in Bs]
    return [(s, output_strides(s, dim)) for s in shapes]


def _fused_all_gather_matmul(A, Bs, gather_dim, group_name, *, return_A=True):
    dim, world, _ = _check_gather(A, Bs, gather_dim, group_name)
    if dim == A.dim() - 1:  # k is gathered: A's blocks sit side by side (torch's cat along the last dim)
        blocks = torch.ops.symmem.all_gather_into_tensor(A.contiguous(), group_name)
        a = torch.cat(blocks.chunk(world), dim=-1)
        return (a if return_A else None), [a @ B for B in Bs]
    moved = A.movedim(dim, 0).contiguous()  # the gathered dim first: the ranks' shards are row blocks
    rows = moved.view(-1, A.shape[-1])
    if Bs and _fused(rows, Bs[0]):
        c0, gathered = torch.ops.symmem.all_gather_matmul(rows, Bs[0], group_name, return_A or len(Bs) > 1)
        products = [c0]
    else:
        gathered = torch.ops.symmem.all_gather_into_tensor(rows, group_name)
        products = []
    products += [gathered @ B for B in Bs[len(products):]]
    leading = [moved.shape[0] * world, *moved.shape[1:-1]]

    def unmove(t):  # [gathered rows, cols] -> the gathered dim back in place: a view, strides as torch's
        return t.view(*leading, t.shape[-1]).movedim(0, dim)
    return (unmove(gathered) if return_A else None), [unmove(c) for c in products]


def _fused_all_gather_matmul_fake(A, Bs, gather_dim, group_name, *, return_A=True):
    layouts = _gathered_outputs_layout(A, Bs, gather_dim, group_name)
    outputs = [A.new_empty_strided(shape, strides) for shape, strides in layouts]
    return (outputs[0] if return_A else None), outputs[1:]


def _reduce_scatter_shape(A, B, reduce_op, scatter_dim, group_name):
    """(dim, world, the output's shape), or the error torch's op raises."""
    if reduce_op not in ("sum", "avg"):
        raise ValueError(f"symmem.{_RS}: reduce_op {reduce_op!r} is not 'sum' or 'avg'")
    if A.dim() < 2:
        raise ValueError(f"symmem.{_RS}: A must have 2 or more dims ({tuple(A.shape)})")
    if B.dim() != 2 or B.shape[0] != A.shape[-1]:
        raise ValueError(f"symmem.{_RS}: B must be a matrix of {A.shape[-1]} rows (A's last dim), got "
                         f"{tuple(B.shape)}")
    world = _world(group_name)
    dim = _dim(scatter_dim, A.dim(), _RS)
    shape = list(A.shape[:-1]) + [B.shape[1]]
    if shape[dim] % world:
        raise ValueError(f"symmem.{_RS}: dim {scatter_dim} of A @ B ({shape[dim]}) must divide by the group size "
                         f"{world}")
    shape[dim] //= world
    return dim, world, shape


def _fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    dim, world, _ = _reduce_scatter_shape(A, B, reduce_op, scatter_dim, group_name)
    if dim != A.dim() - 1:  # the scattered dim first: this rank's part is a block of rows
        moved = A.movedim(dim, 0).contiguous()
        rows = moved.view(-1, A.shape[-1])
        moved_shape = [moved.shape[0] // world, *moved.shape[1:-1], B.shape[1]]
        if _fused(rows, B):
            c = torch.ops.symmem.matmul_reduce_scatter(rows, B, group_name)
            if reduce_op == "avg":
                c.div_(world)
        else:
            c = torch.ops.symmem.reduce_scatter_tensor(rows @ B, reduce_op, group_name)
        c = c.view(moved_shape).movedim(0, dim)
    else:  # n is scattered
        partial = (A @ B).movedim(dim, 0).contiguous()
        c = torch.ops.symmem.reduce_scatter_tensor(partial, reduce_op, group_name).movedim(0, dim)
    # torch's kernel reduces into a fresh contiguous tensor whatever the dim: a copy of this rank's
    # part when the scattered dim is not the first.
    return c.contiguous()


def _fused_matmul_reduce_scatter_fake(A, B, reduce_op, scatter_dim, group_name):
    _, _, shape = _reduce_scatter_shape(A, B, reduce_op, scatter_dim, group_name)
    return A.new_empty(shape)


for _key in ("CUDA", "CPU"):
    _lib.impl("fused_all_gather_matmul", _fused_all_gather_matmul, _key)
    _lib.impl("fused_matmul_reduce_scatter", _fused_matmul_reduce_scatter, _key)
torch.library.register_fake("symmem::fused_all_gather_matmul", _fused_all_gather_matmul_fake, lib=_lib)
torch.library.register_fake("symmem::fused_matmul_reduce_scatter", _fused_matmul_reduce_scatter_fake, lib=_lib)
