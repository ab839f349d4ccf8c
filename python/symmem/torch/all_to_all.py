"""The all-to-all ops (symmem/all_to_all.hpp), registered with torch.library (schema + CUDA kernel +
CPU kernel + fake):

  symmem::all_to_all_single(Tensor input, SymInt[]? output_split_sizes, SymInt[]? input_split_sizes,
                            str group_name) -> Tensor
  symmem::all_to_all_single_out(Tensor input, SymInt[]? output_split_sizes, SymInt[]? input_split_sizes,
                                str group_name, *, Tensor(a!) out) -> ()
  symmem::all_to_all_vdev(Tensor input, Tensor(a!) out, Tensor in_splits, Tensor(b!) out_splits_offsets,
                          str group_name) -> ()
  symmem::all_to_all_vdev_2d(Tensor input, Tensor(a!) out, Tensor in_splits, Tensor(b!) out_splits_offsets,
                             str group_name, int? major_align=None) -> ()

all_to_all_single is torch.distributed.all_to_all_single's contract on dim 0 (splits on the host:
no host synchronisation, the counts are exchanged on the device). The vdev ops take
torch.ops.symm_mem.all_to_all_vdev(_2d)'s arguments in the same order, so a call site can switch
namespaces; unlike torch's they take any CUDA tensors (symmetric ones from symmem.torch.empty run
zero-copy, others are staged), need no NVSHMEM, bound every wait, and check capacity: a rank whose
`out` would overflow makes every rank raise SymmemError kCapacity naming it, and nothing moves.
Every dtype (rows are bytes). The CUDA kernels run on torch.cuda.current_stream() and are capturable
in CUDA graphs. The CPU kernels run torch.distributed on the group (gloo), so the ops run, and pass
opcheck, on any machine; they fail as the CUDA kernels do: a check of one rank's tensors that fails
raises on every rank (that rank its ValueError / TypeError), a rank whose `out` would overflow
makes every rank raise SymmemError kCapacity, and in either case nothing moves. The ops are tagged
``pt2_compliant_tag``; the CUDA kernels are thin: the arguments are checked and the core called by
``_route``, as for every symmem op.
"""
import torch
import torch.distributed as dist

from .. import _native, errors
from . import _route
from .errors import agree_on_checks, refused
from .groups import GroupCommunicator, group_name_of, state_of
from .ops import _returning_none

_lib = torch.library.Library("symmem", "FRAGMENT")
_TAGS = (torch.Tag.pt2_compliant_tag,)
for _schema in (
        "all_to_all_single(Tensor input, SymInt[]? output_split_sizes, SymInt[]? input_split_sizes, "
        "str group_name) -> Tensor",
        "all_to_all_single_out(Tensor input, SymInt[]? output_split_sizes, SymInt[]? input_split_sizes, "
        "str group_name, *, Tensor(a!) out) -> ()",
        "all_to_all_vdev(Tensor input, Tensor(a!) out, Tensor in_splits, Tensor(b!) out_splits_offsets, "
        "str group_name) -> ()",
        "all_to_all_vdev_2d(Tensor input, Tensor(a!) out, Tensor in_splits, Tensor(b!) out_splits_offsets, "
        "str group_name, int? major_align=None) -> ()"):
    _lib.define(_schema, tags=_TAGS)


def _output_shape(inp, output_split_sizes):
    if output_split_sizes is None:
        return tuple(inp.shape)
    return (sum(output_split_sizes), *inp.shape[1:])


def _new_output(inp, output_split_sizes):
    """all_to_all_single's output, for the checks to judge: splits of a negative total and a 0-dim
    input are this rank's errors, refused by the checks, not raised here by new_empty or an unpacking."""
    shape = _output_shape(inp, output_split_sizes)
    return inp.new_empty((max(shape[0], 0), *shape[1:]) if shape else ())


# CUDA kernels ----------------------------------------------------------------------------------
#
# A check of one rank's tensors that fails (a TypeError or ValueError of _route's) refuses the call
# on the group's communicator (errors.refused): every rank raises it, naming this rank and the
# cause, instead of the peers waiting in the call until their deadline.

def _all_to_all_single_out_cuda(inp, output_split_sizes, input_split_sizes, group_name, *, out):
    comm = GroupCommunicator(group_name)
    try:
        _route.all_to_all(comm, out, inp, output_split_sizes, input_split_sizes)
    except (TypeError, ValueError) as cause:
        raise refused(comm, "symmem.all_to_all_single", cause) from cause
    return out


def _all_to_all_single_cuda(inp, output_split_sizes, input_split_sizes, group_name):
    out = _new_output(inp, output_split_sizes)
    return _all_to_all_single_out_cuda(inp, output_split_sizes, input_split_sizes, group_name, out=out)


def _all_to_all_vdev_cuda(inp, out, in_splits, out_splits_offsets, group_name):
    comm = GroupCommunicator(group_name)
    try:
        _route.all_to_all_vdev(comm, out, inp, in_splits, out_splits_offsets, 1, 0, "all_to_all_vdev")
    except (TypeError, ValueError) as cause:
        raise refused(comm, "symmem.all_to_all_vdev", cause) from cause


def _all_to_all_vdev_2d_cuda(inp, out, in_splits, out_splits_offsets, group_name, major_align=None):
    op = "all_to_all_vdev_2d"
    comm = GroupCommunicator(group_name)
    # The op's own argument, the same on every rank: each raises it alike, and the communicator
    # stays usable (a refusal would end it for an error no peer waits on).
    align = _route.major_align_of(major_align, op)
    try:
        _route.all_to_all_vdev(comm, out, inp, in_splits, out_splits_offsets,
                               _route.experts_of(in_splits, comm.world, op), align, op)
    except (TypeError, ValueError) as cause:
        raise refused(comm, "symmem." + op, cause) from cause


# CPU kernels: torch.distributed on the group ---------------------------------------------------
#
# A rank whose check fails must not leave its peers in a gloo collective until the group's timeout:
# every rank runs its checks and learns every rank's outcome before anything moves
# (errors.agree_on_checks, as MoE's CPU reference), then raises the first refusing rank's error.


def _all_to_all_single_out_cpu(inp, output_split_sizes, input_split_sizes, group_name, *, out):
    op = "all_to_all_single"
    state = state_of(group_name)
    group, world = state.group, state.world
    checked = []

    def check():
        _route.check_rows(inp, out, op)
        checked.append(_route.splits(input_split_sizes, inp.shape[0], world, "input_split_sizes", op))
        checked.append(_route.splits(output_split_sizes, out.shape[0], world, "output_split_sizes", op))

    agree_on_checks(state, op, check)
    ins, outs = checked
    received = out.new_empty((sum(outs), *out.shape[1:]))
    dist.all_to_all_single(received, inp[:sum(ins)].contiguous(), outs, ins, group=group)
    out[:sum(outs)].copy_(received)
    return out


def _all_to_all_single_cpu(inp, output_split_sizes, input_split_sizes, group_name):
    out = _new_output(inp, output_split_sizes)
    return _all_to_all_single_out_cpu(inp, output_split_sizes, input_split_sizes, group_name, out=out)


def _extents(matrix, q, world, experts, major_align):
    """The rows each local expert of rank q takes in its output (torch's alignment rule)."""
    rows = [sum(matrix[s][q * experts + e] for s in range(world)) for e in range(experts)]
    return [r if major_align == 0 else max((r + major_align - 1) // major_align * major_align, major_align)
            for r in rows]


def _vdev_cpu(inp, out, in_splits, out_splits_offsets, group_name, experts, major_align, op):
    """The layout of symmem/all_to_all.hpp, on the host: every rank's splits are gathered, the data
    moves rank to rank in sender order, then lands expert-major (major_align 0: plain). `experts`:
    None for the 2-D form (from in_splits, a check of this rank's). The checks of every rank's
    tensors, then every rank's capacity, are agreed before any row moves."""
    state = state_of(group_name)
    group, world, me = state.group, state.world, state.rank
    checked = []

    def check():
        e = _route.experts_of(in_splits, world, op) if experts is None else experts
        _route.check_rows(inp, out, op)
        _route.check_split_tensors(in_splits, out_splits_offsets, world * e, op)
        splits = [int(v) for v in in_splits.reshape(-1).tolist()]
        if any(v < 0 for v in splits) or sum(splits) > inp.shape[0]:
            raise ValueError(f"symmem.{op}: rank {me}'s splits {splits} are negative or exceed its input "
                             f"({inp.shape[0]} rows)")
        checked.append((e, splits, out.shape[0]))

    agree_on_checks(state, op, check)
    # Every rank's (experts, splits, output rows): each rank reaches every rank's verdict alike.
    every = [None] * world
    dist.all_gather_object(every, checked[0], group=group)
    experts = every[0][0]
    for s, (e, _, _) in enumerate(every):
        if e != experts:
            raise errors.SymmemError(_native.ErrorCode.kMismatch,
                                     f"symmem.{op}: rank {s} passed {e} experts per rank, rank 0 {experts}")
    matrix = [splits for _, splits, _ in every]  # matrix[s][q * experts + e]
    for q, (_, _, capacity) in enumerate(every):
        need = sum(_extents(matrix, q, world, experts, major_align))
        if need > capacity:
            raise errors.SymmemError(_native.ErrorCode.kCapacity,
                                     f"symmem.{op}: rank {q} would receive {need} rows, its output holds "
                                     f"{capacity}; no rank moved any row of this call")
    n = world * experts
    mine = [matrix[s][me * experts + e] for s in range(world) for e in range(experts)]  # [s][e]
    per_rank_in = [sum(matrix[me][q * experts:(q + 1) * experts]) for q in range(world)]
    per_rank_out = [sum(matrix[s][me * experts:(me + 1) * experts]) for s in range(world)]
    received = out.new_empty((sum(per_rank_out), *out.shape[1:]))
    dist.all_to_all_single(received, inp[:sum(per_rank_in)].contiguous(), per_rank_out, per_rank_in, group=group)
    # Expert-major placement with torch's alignment rule.
    extent = _extents(matrix, me, world, experts, major_align)
    start = [sum(extent[:e]) for e in range(experts)]
    src = 0
    splits, offsets = [0] * n, [0] * n
    placed = [0] * experts
    for s in range(world):
        for e in range(experts):
            count = mine[s * experts + e]
            at = start[e] + placed[e]
            out[at:at + count].copy_(received[src:src + count])
            splits[e * world + s], offsets[e * world + s] = count, at
            placed[e] += count
            src += count
    out_splits_offsets.copy_(torch.tensor([splits, offsets], dtype=torch.int64))


def _all_to_all_vdev_cpu(inp, out, in_splits, out_splits_offsets, group_name):
    _vdev_cpu(inp, out, in_splits, out_splits_offsets, group_name, 1, 0, "all_to_all_vdev")


def _all_to_all_vdev_2d_cpu(inp, out, in_splits, out_splits_offsets, group_name, major_align=None):
    op = "all_to_all_vdev_2d"
    # major_align is the op's own argument, the same on every rank: each raises it alike.
    _vdev_cpu(inp, out, in_splits, out_splits_offsets, group_name, None, _route.major_align_of(major_align, op), op)


for _name, _cuda, _cpu in (
        ("all_to_all_single", _all_to_all_single_cuda, _all_to_all_single_cpu),
        ("all_to_all_single_out", _returning_none(_all_to_all_single_out_cuda),
         _returning_none(_all_to_all_single_out_cpu)),
        ("all_to_all_vdev", _all_to_all_vdev_cuda, _all_to_all_vdev_cpu),
        ("all_to_all_vdev_2d", _all_to_all_vdev_2d_cuda, _all_to_all_vdev_2d_cpu)):
    _lib.impl(_name, _cuda, "CUDA")
    _lib.impl(_name, _cpu, "CPU")


# Fake kernels ----------------------------------------------------------------------------------

@torch.library.register_fake("symmem::all_to_all_single", lib=_lib)
def _all_to_all_single_fake(inp, output_split_sizes, input_split_sizes, group_name):
    return inp.new_empty(_output_shape(inp, output_split_sizes))


@torch.library.register_fake("symmem::all_to_all_single_out", lib=_lib)
def _all_to_all_single_out_fake(inp, output_split_sizes, input_split_sizes, group_name, *, out):
    return None


@torch.library.register_fake("symmem::all_to_all_vdev", lib=_lib)
def _all_to_all_vdev_fake(inp, out, in_splits, out_splits_offsets, group_name):
    return None


@torch.library.register_fake("symmem::all_to_all_vdev_2d", lib=_lib)
def _all_to_all_vdev_2d_fake(inp, out, in_splits, out_splits_offsets, group_name, major_align=None):
    return None


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None):
    """torch.distributed.all_to_all_single's signature on symmem (dim 0; no host synchronisation)."""
    torch.ops.symmem.all_to_all_single_out(input, output_split_sizes, input_split_sizes, group_name_of(group),
                                           out=output)
    return output
