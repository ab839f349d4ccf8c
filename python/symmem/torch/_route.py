"""One route per collective from every entry point (the ops, the drop-ins, FSDP's comms and
TPAllReduce) down to the C ABI: the arguments are checked here, once, and nowhere else.

Every function runs on ``torch.cuda.current_stream()`` of the communicator's device. Calls of one
communicator run in host order whatever their streams (the core joins a stream change). Errors
are the ones the ops document: TypeError for a dtype, ValueError for a shape, device or layout,
SymmemError from the core.

A check of what every rank passes alike (the dtype, the reduce op) raises its error on the calling
rank only: every rank reaches the same verdict. A check of one rank's own tensors (a layout, a
device, an output's size or dtype) that fails refuses the call instead (errors.refused,
docs/design.md "Refusals"): the peers would otherwise wait in the call until their deadline. The
refusing rank raises RefusedValueError / RefusedTypeError (the documented type, and a SymmemError),
every other rank SymmemError, with one message. The checks are those that ran before; a call that
passes them pays nothing more (a try block costs nothing until it raises).
"""
import torch

from .. import _native
from .errors import refused

# torch dtype -> symmem::DataType value, from the names the C ABI gives (reductions; gathers move bytes).
REDUCIBLE = {getattr(torch, name): value for name, value in _native.DTYPES.items()
             if name != "uint8" and isinstance(getattr(torch, name, None), torch.dtype)}
BYTES = _native.DTYPES["uint8"]
# reduce_op -> symmem::ReduceOp value ("avg": the kernels scale the float32 sum by 1/W before rounding).
REDUCE_OPS = dict(_native.REDUCE_OPS)
_AVG = REDUCE_OPS["avg"]
current_stream = torch._C._cuda_getCurrentRawStream


def reduce_code(reduce_op, dtype, op):
    """The symmem::ReduceOp of a reduction, or the TypeError/ValueError that says why not."""
    code = REDUCE_OPS.get(reduce_op)
    if code is None:
        raise ValueError(f"symmem.{op}: reduce_op {reduce_op!r} is not one of {sorted(REDUCE_OPS)}")
    if reduce_op == "avg" and not dtype.is_floating_point:
        raise TypeError(f"symmem.{op}: reduce_op 'avg' needs a floating dtype, got {dtype}")
    return code


def dtype_code(dtype, op):
    code = REDUCIBLE.get(dtype)
    if code is None:
        raise TypeError(f"symmem.{op}: dtype {dtype} is not reducible by symmem "
                        f"({', '.join(str(t).replace('torch.', '') for t in REDUCIBLE)})")
    return code


def check_contiguous(t, name, op):
    if not t.is_contiguous():
        raise ValueError(f"symmem.{op}: {name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
                         "call .contiguous() first")


def check_operand(t, name, op, comm):
    check_contiguous(t, name, op)
    if t.get_device() != comm.device:
        raise ValueError(f"symmem.{op}: {name} is on {t.device}, the communicator of group {comm.group_name!r} on "
                         f"cuda:{comm.device}")


def check_same_dtype(out, inp, op):
    if out.dtype != inp.dtype:
        raise TypeError(f"symmem.{op}: output dtype {out.dtype} differs from input dtype {inp.dtype}")


def _refuse_closed(comm):
    if comm.closed:
        comm._ensure_open()


def all_reduce(comm, out, inp, reduce_op, algo=0, max_blocks=-1):
    """out = reduce_op over the group of inp (out may be inp: in place)."""
    dtype = REDUCIBLE.get(inp.dtype)
    code = REDUCE_OPS.get(reduce_op)
    # The eager hot path (vLLM-style and drop-in calls): each property read once, the common case
    # decided in one expression; anything unusual takes the checks that say what is wrong.
    if (dtype is None or code is None or comm.closed or not inp.is_contiguous() or inp.get_device() != comm.device
            or (reduce_op == "avg" and not inp.is_floating_point())):
        _refuse_closed(comm)
        dtype = dtype_code(inp.dtype, "all_reduce")
        code = reduce_code(reduce_op, inp.dtype, "all_reduce")
        try:
            check_operand(inp, "input", "all_reduce", comm)
        except ValueError as cause:
            raise refused(comm, "symmem.all_reduce", cause) from cause
    ptr = inp.data_ptr()
    if out is inp:
        out_ptr = ptr
    else:
        try:
            check_operand(out, "out", "all_reduce", comm)
            check_same_dtype(out, inp, "all_reduce")
            if out.numel() != inp.numel():
                raise ValueError(f"symmem.all_reduce: output has {out.numel()} elements, {inp.numel()} expected")
        except (TypeError, ValueError) as cause:
            raise refused(comm, "symmem.all_reduce", cause) from cause
        out_ptr = out.data_ptr()
    comm.core.all_reduce(out_ptr, ptr, inp.numel(), dtype, code, current_stream(comm.device), algo, 0, max_blocks)


def all_reduce_in_place(comm, t, code):
    """The drop-ins' hot path: t = reduce op `code` (a REDUCE_OPS value, or None) over the group, in
    place, when the call needs none of all_reduce's refusals (a dtype and op symmem reduces, a
    contiguous tensor on the communicator's device, an open communicator of one node); else False,
    nothing done, and all_reduce's checks decide."""
    dtype = REDUCIBLE.get(t.dtype)
    if (dtype is None or code is None or comm.closed or comm.nodes > 1 or not t.is_contiguous()
            or t.get_device() != comm.device or (code == _AVG and not t.is_floating_point())):
        return False
    ptr = t.data_ptr()
    comm.core.all_reduce(ptr, ptr, t.numel(), dtype, code, current_stream(comm.device))
    return True


def all_gather(comm, out, inp, algo=0, max_blocks=-1, op="all_gather_into_tensor"):
    """out = the ranks' inputs back to back in rank order (bytes: any dtype). In place when inp is this
    rank's slot of out."""
    _refuse_closed(comm)
    try:
        check_operand(inp, "input", op, comm)
        check_operand(out, "out", op, comm)
        check_same_dtype(out, inp, op)
        if out.numel() != inp.numel() * comm.world:
            raise ValueError(f"symmem.{op}: output has {out.numel()} elements, {inp.numel() * comm.world} expected "
                             f"(input {inp.numel()} x {comm.world} ranks)")
    except (TypeError, ValueError) as cause:
        raise refused(comm, "symmem." + op, cause) from cause
    comm.core.all_gather(out.data_ptr(), inp.data_ptr(), inp.numel() * inp.element_size(), BYTES,
                         current_stream(comm.device), algo, 0, max_blocks)


def reduce_scatter(comm, out, inp, reduce_op, algo=0, max_blocks=-1):
    """out = this rank's slice (1/world of inp, in rank order) of reduce_op over the group of inp."""
    _refuse_closed(comm)
    dtype = dtype_code(inp.dtype, "reduce_scatter_tensor")
    code = reduce_code(reduce_op, inp.dtype, "reduce_scatter_tensor")
    try:
        check_operand(inp, "input", "reduce_scatter_tensor", comm)
        check_operand(out, "out", "reduce_scatter_tensor", comm)
        check_same_dtype(out, inp, "reduce_scatter_tensor")
        if inp.numel() != out.numel() * comm.world:
            raise ValueError(f"symmem.reduce_scatter_tensor: input has {inp.numel()} elements, output "
                             f"{out.numel()}: the input must hold world ({comm.world}) x output")
    except (TypeError, ValueError) as cause:
        raise refused(comm, "symmem.reduce_scatter_tensor", cause) from cause
    comm.core.reduce_scatter(out.data_ptr(), inp.data_ptr(), out.numel(), dtype, code, current_stream(comm.device),
                             algo, 0, max_blocks)


def describe(comm, collective, out, inp):
    """The plan the core would run for these tensors (nothing runs)."""
    gather = collective == "all_gather"
    count = inp.numel() * inp.element_size() if gather else (out.numel() if collective == "reduce_scatter"
                                                           else inp.numel())
    dtype = BYTES if gather else dtype_code(inp.dtype, collective)
    return comm.core.describe(collective, out.data_ptr(), inp.data_ptr(), count, dtype)


# All-to-all (symmem/all_to_all.hpp): dim-0 rows of any dtype, moved as bytes.

def row_bytes(t):
    """Bytes of one dim-0 row."""
    return t.element_size() * int(torch.Size(t.shape[1:]).numel())


def splits(sizes, rows, world, name, op):
    """The split sizes of a dim of `rows` rows (None: equal parts), checked."""
    if sizes is None:
        if rows % world:
            raise ValueError(f"symmem.{op}: dim 0 ({rows}) does not divide by the group size {world}; pass {name}")
        return [rows // world] * world
    sizes = [int(s) for s in sizes]
    if len(sizes) != world:
        raise ValueError(f"symmem.{op}: {name} has {len(sizes)} entries for a group of {world}")
    if any(s < 0 for s in sizes):
        raise ValueError(f"symmem.{op}: {name} has a negative entry: {sizes}")
    if sum(sizes) > rows:
        raise ValueError(f"symmem.{op}: {name} adds up to {sum(sizes)} rows, the tensor has {rows}")
    return sizes


def check_rows(inp, out, op):
    """The input and output of an all-to-all: contiguous, one dtype, the same row shape."""
    check_contiguous(inp, "input", op)
    check_contiguous(out, "out", op)
    if out.dtype != inp.dtype:
        raise TypeError(f"symmem.{op}: out is {out.dtype}, input {inp.dtype}")
    if inp.dim() == 0 or out.dim() == 0 or tuple(inp.shape[1:]) != tuple(out.shape[1:]):
        raise ValueError(f"symmem.{op}: input {tuple(inp.shape)} and out {tuple(out.shape)} must have the same "
                         "row shape (all but dim 0)")


def check_split_tensors(in_splits, out_splits_offsets, n, op):
    """all_to_all_vdev(_2d)'s int64 split tensors: n entries in, (2, n) out."""
    if in_splits.dtype != torch.int64 or out_splits_offsets.dtype != torch.int64:
        raise TypeError(f"symmem.{op}: in_splits and out_splits_offsets must be int64")
    if in_splits.numel() != n:
        raise ValueError(f"symmem.{op}: in_splits has {in_splits.numel()} entries, {n} expected")
    if tuple(out_splits_offsets.shape) != (2, n):
        raise ValueError(f"symmem.{op}: out_splits_offsets is {tuple(out_splits_offsets.shape)}, (2, {n}) expected")
    check_contiguous(in_splits, "in_splits", op)
    check_contiguous(out_splits_offsets, "out_splits_offsets", op)


def experts_of(in_splits, world, op):
    """The 2-D form's local experts per rank: in_splits holds world x experts entries."""
    if in_splits.numel() % world:
        raise ValueError(f"symmem.{op}: in_splits has {in_splits.numel()} entries, not a multiple of the group size "
                         f"{world}")
    return in_splits.numel() // world


def major_align_of(major_align, op):
    align = 1 if major_align is None else int(major_align)
    if align < 1:
        raise ValueError(f"symmem.{op}: major_align must be positive, got {major_align}")
    return align


def all_to_all(comm, out, inp, output_split_sizes=None, input_split_sizes=None, algo=0, max_blocks=-1,
               op="all_to_all_single"):
    """torch.distributed.all_to_all_single on dim 0: equal parts when no sizes are given (the uniform
    all-to-all), else the host splits (exchanged on the device: no host synchronisation)."""
    _refuse_closed(comm)
    check_rows(inp, out, op)
    check_operand(inp, "input", op, comm)
    check_operand(out, "out", op, comm)
    stream = current_stream(comm.device)
    if output_split_sizes is None and input_split_sizes is None and inp.shape[0] == out.shape[0]:
        if inp.shape[0] % comm.world:
            raise ValueError(f"symmem.{op}: dim 0 ({inp.shape[0]}) does not divide by the group size {comm.world}")
        comm.core.all_to_all(out.data_ptr(), inp.data_ptr(), inp.nbytes // comm.world, stream, algo, 0, max_blocks)
        return
    ins = splits(input_split_sizes, inp.shape[0], comm.world, "input_split_sizes", op)
    outs = splits(output_split_sizes, out.shape[0], comm.world, "output_split_sizes", op)
    comm.core.all_to_all_v(out.data_ptr(), out.shape[0], inp.data_ptr(), inp.shape[0], ins, outs, row_bytes(inp),
                           stream, algo, 0, max_blocks)


def all_to_all_vdev(comm, out, inp, in_splits, out_splits_offsets, experts, major_align, op, algo=0, max_blocks=-1):
    """torch.ops.symm_mem.all_to_all_vdev (major_align 0, one expert) and its 2-D form: the splits
    on the device, the received splits and offsets written on the device."""
    _refuse_closed(comm)
    check_rows(inp, out, op)
    check_split_tensors(in_splits, out_splits_offsets, comm.world * experts, op)
    for t, name in ((inp, "input"), (out, "out"), (in_splits, "in_splits"), (out_splits_offsets, "out_splits_offsets")):
        check_operand(t, name, op, comm)
    comm.core.all_to_all_vdev(out.data_ptr(), out.shape[0], inp.data_ptr(), inp.shape[0], in_splits.data_ptr(),
                              out_splits_offsets.data_ptr(), row_bytes(inp), current_stream(comm.device),
                              experts=experts, major_align=major_align, algo=algo, max_blocks=max_blocks)
