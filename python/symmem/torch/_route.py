"""One route per collective from every entry point (the ops, the drop-ins, FSDP's comms and
TPAllReduce) down to the C ABI: the arguments are checked here, once, and nowhere else.

Every function runs on ``torch.cuda.current_stream()`` of the communicator's device. Calls of one
communicator run in host order whatever their streams (the core joins a stream change). Errors
are the ones the ops document: TypeError for a dtype, ValueError for a shape, device or layout,
SymmemError from the core.
"""
import torch

from .. import _native

# torch dtype -> symmem::DataType value, from the names the C ABI gives (reductions; gathers move bytes).
REDUCIBLE = {getattr(torch, name): value for name, value in _native.DTYPES.items()
             if name != "uint8" and isinstance(getattr(torch, name, None), torch.dtype)}
BYTES = _native.DTYPES["uint8"]
# reduce_op -> (symmem::ReduceOp value, divide by the world after): avg is a sum and one division.
REDUCE_OPS = {name: (value, False) for name, value in _native.REDUCE_OPS.items()}
REDUCE_OPS["avg"] = (_native.REDUCE_OPS["sum"], True)
current_stream = torch._C._cuda_getCurrentRawStream


def reduce_code(reduce_op, dtype, op):
    """(symmem::ReduceOp, divide) of a reduction, or the TypeError/ValueError that says why not."""
    entry = REDUCE_OPS.get(reduce_op)
    if entry is None:
        raise ValueError(f"symmem.{op}: reduce_op {reduce_op!r} is not one of {sorted(REDUCE_OPS)}")
    if entry[1] and not dtype.is_floating_point:
        raise TypeError(f"symmem.{op}: reduce_op 'avg' needs a floating dtype, got {dtype}")
    return entry


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
    entry = REDUCE_OPS.get(reduce_op)
    # The eager hot path (vLLM-style and drop-in calls): each property read once, the common case
    # decided in one expression; anything unusual takes the checks that say what is wrong.
    if (dtype is None or entry is None or comm.closed or not inp.is_contiguous() or inp.get_device() != comm.device
            or (entry[1] and not inp.is_floating_point())):
        _refuse_closed(comm)
        dtype = dtype_code(inp.dtype, "all_reduce")
        entry = reduce_code(reduce_op, inp.dtype, "all_reduce")
        check_operand(inp, "input", "all_reduce", comm)
    ptr = inp.data_ptr()
    if out is inp:
        out_ptr = ptr
    else:
        check_operand(out, "out", "all_reduce", comm)
        check_same_dtype(out, inp, "all_reduce")
        if out.numel() != inp.numel():
            raise ValueError(f"symmem.all_reduce: output has {out.numel()} elements, {inp.numel()} expected")
        out_ptr = out.data_ptr()
    comm.core.all_reduce(out_ptr, ptr, inp.numel(), dtype, entry[0], current_stream(comm.device), algo, 0, max_blocks)
    if entry[1]:
        out.div_(comm.world)


def all_gather(comm, out, inp, algo=0, max_blocks=-1, op="all_gather_into_tensor"):
    """out = the ranks' inputs back to back in rank order (bytes: any dtype). In place when inp is this
    rank's slot of out."""
    _refuse_closed(comm)
    check_operand(inp, "input", op, comm)
    check_operand(out, "out", op, comm)
    check_same_dtype(out, inp, op)
    if out.numel() != inp.numel() * comm.world:
        raise ValueError(f"symmem.{op}: output has {out.numel()} elements, {inp.numel() * comm.world} expected "
                         f"(input {inp.numel()} x {comm.world} ranks)")
    comm.core.all_gather(out.data_ptr(), inp.data_ptr(), inp.numel() * inp.element_size(), BYTES,
                         current_stream(comm.device), algo, 0, max_blocks)


def reduce_scatter(comm, out, inp, reduce_op, algo=0, max_blocks=-1):
    """out = this rank's slice (1/world of inp, in rank order) of reduce_op over the group of inp."""
    _refuse_closed(comm)
    dtype = dtype_code(inp.dtype, "reduce_scatter_tensor")
    code, divide = reduce_code(reduce_op, inp.dtype, "reduce_scatter_tensor")
    check_operand(inp, "input", "reduce_scatter_tensor", comm)
    check_operand(out, "out", "reduce_scatter_tensor", comm)
    check_same_dtype(out, inp, "reduce_scatter_tensor")
    if inp.numel() != out.numel() * comm.world:
        raise ValueError(f"symmem.reduce_scatter_tensor: input has {inp.numel()} elements, output {out.numel()}: "
                         f"the input must hold world ({comm.world}) x output")
    comm.core.reduce_scatter(out.data_ptr(), inp.data_ptr(), out.numel(), dtype, code, current_stream(comm.device),
                             algo, 0, max_blocks)
    if divide:
        out.div_(comm.world)


def describe(comm, collective, out, inp):
    """The plan the core would run for these tensors (nothing runs)."""
    gather = collective == "all_gather"
    count = inp.numel() * inp.element_size() if gather else (out.numel() if collective == "reduce_scatter"
                                                           else inp.numel())
    dtype = BYTES if gather else dtype_code(inp.dtype, collective)
    return comm.core.describe(collective, out.data_ptr(), inp.data_ptr(), count, dtype)
