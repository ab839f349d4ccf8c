"""The fused ops of tensor parallelism as torch ops (symmem/fused.hpp):

  symmem::all_gather_matmul(Tensor a_shard, Tensor b, str group_name, bool return_a=False) -> (Tensor, Tensor?)
  symmem::matmul_reduce_scatter(Tensor a, Tensor b, str group_name) -> Tensor

C = all_gather(a_shard) @ b, with a_shard [m / world, k] and b [k, n] (float16 or bfloat16, on the
group's device; a_shard contiguous); returns (C [m, n], A [m, k] when return_a else None). b is
read where it lies when it is packed row-major (contiguous) or column-major (W.t() of a contiguous
weight W [n, k], the layout of every x @ W.t()): the GEMM has a kernel for each. A b packed neither
way (a slice of a larger matrix, a broadcast) is first copied into a contiguous tensor: one pass
over its k x n elements on the caller's stream (b_operand). The
shards arrive by copy engine (zero SMs) into a symmetric workspace of the group's communicator
while one persistent GEMM computes the own shard first and every other tile as its rows land
(docs/fused.md). Runs on torch.cuda.current_stream(), capturable in CUDA graphs once the
workspace is large enough (the first call of the largest shape must be eager: growing it is
collective). The CPU kernel gathers with torch.distributed and multiplies, so that the op runs,
and passes opcheck, on any machine.

matmul_reduce_scatter: C_shard [m / world, n] = this rank's rows of the sum over the group of
a [m, k] @ b [k, n] (the row-parallel layer: each rank holds a k-slice; b as above). float32 partial sums,
added in rank order and rounded once; each rank pulls the peers' partial products of its rows by
copy engine while the GEMMs compute the rest. Its symmetric workspace (2 m n float32) grows
as the gather workspace does. The CPU kernel reduce-scatters float32 products with
torch.distributed.

``all_gather_matmul(a_shard, b, group=None, return_a=False)`` and
``matmul_reduce_scatter(a, b, group=None)`` are the Python entry points.
"""
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from .. import _native
from . import _route
from ._route import check_contiguous, check_operand
from .errors import refused
from .groups import GroupCommunicator, group_name_of, state_of
from .memory import heap_tensor

_lib = torch.library.Library("symmem", "FRAGMENT")
_TAGS = (torch.Tag.pt2_compliant_tag,)
_lib.define("all_gather_matmul(Tensor a_shard, Tensor b, str group_name, bool return_a=False) -> (Tensor, Tensor?)",
            tags=_TAGS)
_lib.define("matmul_reduce_scatter(Tensor a, Tensor b, str group_name) -> Tensor", tags=_TAGS)

_TYPES = {torch.float16: _native.DTYPES["float16"], torch.bfloat16: _native.DTYPES["bfloat16"]}


def b_layout_of(shape, strides):
    """The packed layout of a [k, n] matrix with these strides: "row_major" (element (i, j) at
    i * n + j: a contiguous tensor), "column_major" (at i + j * k: W.t() of a contiguous W [n, k]),
    or None (neither: a slice, a broadcast, padded rows). A dim of extent 1 may have any stride (as
    for torch's is_contiguous); a matrix packed both ways (k or n of 1) counts as row-major."""
    (k, n), (row_stride, col_stride) = shape, strides
    if (n <= 1 or col_stride == 1) and (k <= 1 or row_stride == n):
        return "row_major"
    if (k <= 1 or row_stride == 1) and (n <= 1 or col_stride == k):
        return "column_major"
    return None


def b_operand(b):
    """(b as the GEMM reads it, its _native.MATRIX_LAYOUTS value): a packed b as it lies; any other
    b, or one not 16-byte aligned (the GEMM's tensor-memory loads need it), copied into a
    contiguous one (k x n elements read and written once, on the current stream)."""
    layout = b_layout_of(tuple(b.shape), b.stride())
    if layout is None or b.data_ptr() % 16:
        b, layout = torch.empty_like(b, memory_format=torch.contiguous_format).copy_(b), "row_major"
    return b, _native.MATRIX_LAYOUTS[layout]


def _check_b_device(b, layout, op, comm):
    """b on the communicator's device (check_operand on its storage, contiguous in either layout)."""
    check_operand(b if layout == _native.MATRIX_LAYOUTS["row_major"] else b.t(), "b", op, comm)


def _check_pair(a, b, op, a_name):
    """a [rows, k] and b [k, n] (any strides: b_operand), 2-D, of one type float16 or bfloat16: the
    values the plan reads, which every rank passes alike (plain errors of the calling rank). a's
    layout is this rank's own: the CPU and fake kernels check it (_check), the CUDA kernels refuse
    it with the other checks of their operands."""
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"symmem.{op}: {a_name} and b must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"symmem.{op}: {a_name} is {tuple(a.shape)} and b {tuple(b.shape)}: {a_name}'s columns "
                         "must equal b's rows")
    if a.dtype != b.dtype or a.dtype not in _TYPES:
        raise TypeError(f"symmem.{op}: {a_name} ({a.dtype}) and b ({b.dtype}) must both be float16 or bfloat16")


def _check(a_shard, b, world, layout=True):
    _check_pair(a_shard, b, "all_gather_matmul", "a_shard")
    if layout:
        check_contiguous(a_shard, "a_shard", "all_gather_matmul")
    return a_shard.shape[0] * world, b.shape[1], a_shard.shape[1]


def _check_reduce_scatter(a, b, world, layout=True):
    _check_pair(a, b, "matmul_reduce_scatter", "a")
    if layout:
        check_contiguous(a, "a", "matmul_reduce_scatter")
    if a.shape[0] % world:
        raise ValueError(f"symmem.matmul_reduce_scatter: a has {a.shape[0]} rows, not a multiple of the group's "
                         f"{world} ranks (each rank receives rows / world of them)")
    return a.shape[0], b.shape[1], a.shape[1]


def _workspace(comm, nbytes, purpose="gather", op="all_gather_matmul"):
    """The communicator's workspace for `purpose` of at least nbytes (heap memory, symmetric; grows
    collectively, never freed while the communicator lives: GroupCommunicator.workspace)."""
    return comm.workspace(f"{op}:{purpose}", nbytes)


def _own_operands(comm, op, a, a_name, b):
    """This rank's own operands, checked: a failed check refuses the call (every rank raises, naming
    this one). Returns B and its layout."""
    try:
        check_operand(a, a_name, op, comm)
        b, b_layout = b_operand(b)
        _check_b_device(b, b_layout, op, comm)
    except ValueError as cause:
        raise refused(comm, "symmem." + op, cause) from cause
    return b, b_layout


def _all_gather_matmul_cuda(a_shard, b, group_name, return_a=False):
    comm = GroupCommunicator(group_name)
    comm._ensure_open()
    m, n, k = _check(a_shard, b, comm.world, layout=False)
    if m == 0 or n == 0 or k == 0:  # nothing to move or multiply (the same on every rank)
        a = a_shard.new_empty((m, k)) if return_a else None
        return a_shard.new_zeros((m, n)), a
    b, b_layout = _own_operands(comm, "all_gather_matmul", a_shard, "a_shard", b)
    c = a_shard.new_empty((m, n))
    a_bytes = m * k * a_shard.element_size()
    gathered = _workspace(comm, a_bytes)
    comm.core.all_gather_matmul(c.data_ptr(), gathered, a_shard.data_ptr(), b.data_ptr(), m, n, k,
                                _TYPES[a_shard.dtype], _route.current_stream(comm.device), b_layout)
    a = None
    if return_a:
        # The workspace is overwritten by the next call: hand out a copy.
        a = a_shard.new_empty((m, k))
        a.view(-1).view(torch.uint8).copy_(heap_tensor(comm, gathered, a_bytes))
    return c, a


def _all_gather_matmul_cpu(a_shard, b, group_name, return_a=False):
    group = state_of(group_name).group
    m, n, k = _check(a_shard, b, group.size())
    a = a_shard.new_empty((m, k))
    dist.all_gather(list(a.chunk(group.size())), a_shard, group=group)
    c = (a.float() @ b.float()).to(a_shard.dtype)
    return c, (a if return_a else None)


def _all_gather_matmul_fake(a_shard, b, group_name, return_a=False):
    world = state_of(group_name).world
    m, n, k = _check(a_shard, b, world)
    return a_shard.new_empty((m, n)), (a_shard.new_empty((m, k)) if return_a else None)


_lib.impl("all_gather_matmul", _all_gather_matmul_cuda, "CUDA")
_lib.impl("all_gather_matmul", _all_gather_matmul_cpu, "CPU")
torch.library.register_fake("symmem::all_gather_matmul", _all_gather_matmul_fake, lib=_lib)


def all_gather_matmul_input(rows: int, k: int, dtype: torch.dtype = torch.bfloat16, group=None) -> torch.Tensor:
    """A [rows, k] tensor over this rank's slot of `group`'s gather workspace. An a_shard written
    there (e.g. as the out= of the op that produces it) is not copied by the next all_gather_matmul
    of rows x world rows: the peers pull it and the GEMM reads it where it is, which saves the own
    shard's copy (an SM pass over rows x k elements before the GEMM, docs/fused.md).

    Collective (every rank, same arguments: it may grow the workspace). Valid until the workspace
    grows for a larger shape; a stale one still works, through the copy. After an all_gather_matmul
    the slot may be rewritten for the next call in stream order (the call ends only once no peer
    reads it); the call itself must not run concurrently with a write to it."""
    if rows < 0 or k < 0:
        raise ValueError(f"symmem.all_gather_matmul_input: negative shape ({rows}, {k})")
    if dtype not in _TYPES:
        raise TypeError(f"symmem.all_gather_matmul_input: dtype {dtype} is not float16 or bfloat16")
    comm = GroupCommunicator(group)
    comm._ensure_open()
    element = torch.empty((), dtype=dtype).element_size()
    slot_bytes = rows * k * element
    workspace = _workspace(comm, max(1, slot_bytes * comm.world))
    return heap_tensor(comm, workspace + comm.rank * slot_bytes, slot_bytes).view(dtype).view(rows, k)


def _matmul_reduce_scatter_cuda(a, b, group_name):
    comm = GroupCommunicator(group_name)
    comm._ensure_open()
    m, n, k = _check_reduce_scatter(a, b, comm.world, layout=False)
    if m == 0 or n == 0 or k == 0:  # nothing to move or multiply (the same on every rank)
        return a.new_zeros((m // comm.world, n))
    b, b_layout = _own_operands(comm, "matmul_reduce_scatter", a, "a", b)
    c_shard = a.new_empty((m // comm.world, n))
    workspace = _workspace(comm, comm.core.matmul_reduce_scatter_workspace_bytes(m, n), "partial_sums",
                           "matmul_reduce_scatter")
    comm.core.matmul_reduce_scatter(c_shard.data_ptr(), workspace, a.data_ptr(), b.data_ptr(), m, n, k,
                                    _TYPES[a.dtype], _route.current_stream(comm.device), b_layout)
    return c_shard


def _matmul_reduce_scatter_cpu(a, b, group_name):
    group = state_of(group_name).group
    m, n, _ = _check_reduce_scatter(a, b, group.size())
    partial = a.float() @ b.float()
    c_shard = partial.new_empty((m // group.size(), n))
    dist.reduce_scatter_tensor(c_shard, partial, group=group)
    return c_shard.to(a.dtype)


def _matmul_reduce_scatter_fake(a, b, group_name):
    world = state_of(group_name).world
    m, n, _ = _check_reduce_scatter(a, b, world)
    return a.new_empty((m // world, n))


_lib.impl("matmul_reduce_scatter", _matmul_reduce_scatter_cuda, "CUDA")
_lib.impl("matmul_reduce_scatter", _matmul_reduce_scatter_cpu, "CPU")
torch.library.register_fake("symmem::matmul_reduce_scatter", _matmul_reduce_scatter_fake, lib=_lib)


def all_gather_matmul(a_shard: torch.Tensor, b: torch.Tensor, group=None,
                      return_a: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(C, A or None): C = all_gather(a_shard) @ b over `group` (default: the world group)."""
    return torch.ops.symmem.all_gather_matmul(a_shard, b, group_name_of(group), return_a)


def matmul_reduce_scatter(a: torch.Tensor, b: torch.Tensor, group=None) -> torch.Tensor:
    """C_shard = this rank's rows of the sum over `group` (default: the world group) of a @ b."""
    return torch.ops.symmem.matmul_reduce_scatter(a, b, group_name_of(group))
