"""The symmem ops, registered with torch.library (schema + CUDA kernel + CPU kernel + fake):

  symmem::all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor
  symmem::all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> ()
  symmem::all_reduce_out(Tensor input, str reduce_op, str group_name, *, Tensor(a!) out) -> ()
  symmem::all_gather_into_tensor(Tensor input, str group_name) -> Tensor
  symmem::all_gather_into_tensor_out(Tensor input, str group_name, *, Tensor(a!) out) -> ()
  symmem::all_gather(Tensor input, str group_name, Tensor(a!)[] outputs) -> ()
  symmem::reduce_scatter_tensor(Tensor input, str reduce_op, str group_name) -> Tensor
  symmem::reduce_scatter_tensor_out(Tensor input, str reduce_op, str group_name, *, Tensor(a!) out) -> ()

reduce_op: "sum", "avg" (floating types), "max", "min". Reductions take float32, float16,
bfloat16 and int32; gathers move bytes and take every dtype. Gathers stack along dim 0 and the
reduce-scatter splits along dim 0 (as torch.distributed's tensor forms do). The CUDA kernels run on
torch.cuda.current_stream() and are capturable in CUDA graphs; tensors in symmetric heap memory
(symmem.torch.empty / mem_pool) run zero-copy, others are staged. The all-gather is in place when
the input is this rank's slot of the output. The CPU kernels call torch.distributed on the group
(e.g. gloo), so that the ops are usable, and checkable with opcheck, on any machine.

The kernels are registered with Library.impl rather than torch.library.custom_op: the dispatcher
then calls them directly, which keeps Python work per call to a few attribute reads and one C call.
"""
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .. import _native
from ._groups import _by_name, communicator_of

_lib = torch.library.Library("symmem", "DEF")
for _schema in (
        "all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor",
        "all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> ()",
        "all_reduce_out(Tensor input, str reduce_op, str group_name, *, Tensor(a!) out) -> ()",
        "all_gather_into_tensor(Tensor input, str group_name) -> Tensor",
        "all_gather_into_tensor_out(Tensor input, str group_name, *, Tensor(a!) out) -> ()",
        "all_gather(Tensor input, str group_name, Tensor(a!)[] outputs) -> ()",
        "reduce_scatter_tensor(Tensor input, str reduce_op, str group_name) -> Tensor",
        "reduce_scatter_tensor_out(Tensor input, str reduce_op, str group_name, *, Tensor(a!) out) -> ()"):
    _lib.define(_schema)

_REDUCIBLE = {torch.float32: _native.DTYPES["float32"], torch.float16: _native.DTYPES["float16"],
              torch.bfloat16: _native.DTYPES["bfloat16"], torch.int32: _native.DTYPES["int32"]}
_UINT8 = _native.DTYPES["uint8"]
# reduce_op -> (core op, divide by world after): avg is a sum and one division.
_REDUCE_OPS = {"sum": (0, False), "avg": (0, True), "max": (1, False), "min": (2, False)}
_stream_of = torch._C._cuda_getCurrentRawStream


def _dtype_code(dtype, op, gather):
    if gather:
        return _UINT8
    code = _REDUCIBLE.get(dtype)
    if code is None:
        raise TypeError(f"symmem.{op}: dtype {dtype} is not reducible by symmem (float32, float16, bfloat16, int32)")
    return code


def _reduce_code(reduce_op, dtype, op):
    entry = _REDUCE_OPS.get(reduce_op)
    if entry is None:
        raise ValueError(f"symmem.{op}: reduce_op {reduce_op!r} is not one of {sorted(_REDUCE_OPS)}")
    if entry[1] and not dtype.is_floating_point:
        raise TypeError(f"symmem.{op}: reduce_op 'avg' needs a floating dtype, got {dtype}")
    return entry


def _check_contiguous(t, name, op):
    if not t.is_contiguous():
        raise ValueError(f"symmem.{op}: {name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
                         "call .contiguous() first")


def _check_operand(t, name, op, comm):
    _check_contiguous(t, name, op)
    if t.get_device() != comm.device:
        raise ValueError(f"symmem.{op}: {name} is on {t.device}, the communicator of group {comm.group_name!r} on "
                         f"cuda:{comm.device}")


def _check_sizes(op, inp, out, expected_out_numel):
    if out.dtype != inp.dtype:
        raise TypeError(f"symmem.{op}: output dtype {out.dtype} differs from input dtype {inp.dtype}")
    if out.numel() != expected_out_numel:
        raise ValueError(f"symmem.{op}: output has {out.numel()} elements, {expected_out_numel} expected "
                         f"(input {inp.numel()})")


# CUDA kernels ----------------------------------------------------------------------------------

def _reduction_call(name, inp, out, reduce_op, group_name):
    """The communicator and C enum values of a reduction, after its argument checks."""
    comm = communicator_of(group_name)
    dtype = _dtype_code(inp.dtype, name, False)
    op, divide = _reduce_code(reduce_op, inp.dtype, name)
    _check_operand(inp, "input", name, comm)
    _check_operand(out, "out", name, comm)
    return comm, dtype, op, divide


def _all_reduce_out_cuda(inp, reduce_op, group_name, *, out):
    comm, dtype, op, divide = _reduction_call("all_reduce", inp, out, reduce_op, group_name)
    _check_sizes("all_reduce", inp, out, inp.numel())
    comm.core.all_reduce(out.data_ptr(), inp.data_ptr(), inp.numel(), dtype, op, _stream_of(comm.device))
    if divide:
        out.div_(comm.world)
    return out


def _all_reduce_cuda(inp, reduce_op, group_name):
    return _all_reduce_out_cuda(inp, reduce_op, group_name, out=torch.empty_like(inp, memory_format=torch.contiguous_format))


def _all_reduce_inplace_cuda(inp, reduce_op, group_name):
    all_reduce_in_place(_by_name.get(group_name) or communicator_of(group_name), inp, reduce_op)


def all_reduce_in_place(comm, inp, reduce_op):
    """The hot path of vLLM-style and torch.distributed-style calls (the op's kernel and the eager
    drop-in): one set of checks, one C call."""
    dtype = _REDUCIBLE.get(inp.dtype)
    if dtype is None:
        _dtype_code(inp.dtype, "all_reduce", False)
    op, divide = _reduce_code(reduce_op, inp.dtype, "all_reduce")
    if not inp.is_contiguous() or inp.get_device() != comm.device:
        _check_operand(inp, "input", "all_reduce", comm)
    ptr = inp.data_ptr()
    comm.core.all_reduce(ptr, ptr, inp.numel(), dtype, op, _stream_of(comm.device))
    if divide:
        inp.div_(comm.world)


def _all_gather_out_cuda(inp, group_name, *, out):
    comm = communicator_of(group_name)
    _check_operand(inp, "input", "all_gather_into_tensor", comm)
    _check_operand(out, "out", "all_gather_into_tensor", comm)
    _check_sizes("all_gather_into_tensor", inp, out, inp.numel() * comm.world)
    comm.core.all_gather(out.data_ptr(), inp.data_ptr(), inp.numel() * inp.element_size(), _UINT8,
                         _stream_of(comm.device))
    return out


def _gathered_shape(inp, world):
    return (world,) if inp.dim() == 0 else (inp.shape[0] * world, *inp.shape[1:])


def _all_gather_cuda(inp, group_name):
    comm = communicator_of(group_name)
    out = inp.new_empty(_gathered_shape(inp, comm.world))
    return _all_gather_out_cuda(inp, group_name, out=out)


def _adjacent(outputs):
    """One flat view over the outputs when they are contiguous and back to back in one storage."""
    first = outputs[0]
    n = first.numel()
    base = first.data_ptr()
    step = n * first.element_size()
    for r, t in enumerate(outputs):
        if not t.is_contiguous() or t.data_ptr() != base + r * step or t.untyped_storage().data_ptr() != \
                first.untyped_storage().data_ptr():
            return None
    return first.as_strided((n * len(outputs),), (1,), first.storage_offset())


def _check_list(inp, outputs, world, op):
    if len(outputs) != world:
        raise ValueError(f"symmem.{op}: {len(outputs)} output tensors for a group of {world}")
    for r, t in enumerate(outputs):
        if t.dtype != inp.dtype or t.numel() != inp.numel():
            raise ValueError(f"symmem.{op}: outputs[{r}] is {t.dtype} with {t.numel()} elements, the input "
                             f"{inp.dtype} with {inp.numel()}")


def _all_gather_list_cuda(inp, group_name, outputs):
    comm = communicator_of(group_name)
    _check_list(inp, outputs, comm.world, "all_gather")
    flat = _adjacent(outputs)
    if flat is not None and flat.get_device() == comm.device:
        _all_gather_out_cuda(inp, group_name, out=flat)
        return
    gathered = _all_gather_out_cuda(inp, group_name, out=inp.new_empty((comm.world * inp.numel(),)))
    for r, t in enumerate(outputs):
        t.copy_(gathered[r * inp.numel():(r + 1) * inp.numel()].view(t.shape))


def _reduce_scatter_out_cuda(inp, reduce_op, group_name, *, out):
    comm, dtype, op, divide = _reduction_call("reduce_scatter_tensor", inp, out, reduce_op, group_name)
    if inp.numel() != out.numel() * comm.world:
        raise ValueError(f"symmem.reduce_scatter_tensor: input has {inp.numel()} elements, output {out.numel()}: "
                         f"the input must hold world ({comm.world}) x output")
    if out.dtype != inp.dtype:
        raise TypeError(f"symmem.reduce_scatter_tensor: output dtype {out.dtype} differs from input {inp.dtype}")
    comm.core.reduce_scatter(out.data_ptr(), inp.data_ptr(), out.numel(), dtype, op, _stream_of(comm.device))
    if divide:
        out.div_(comm.world)
    return out


def _scattered_shape(inp, world, op="reduce_scatter_tensor"):
    if inp.dim() == 0 or inp.shape[0] % world:
        raise ValueError(f"symmem.{op}: dim 0 of the input ({tuple(inp.shape)}) must divide by the group size {world}")
    return (inp.shape[0] // world, *inp.shape[1:])


def _reduce_scatter_cuda(inp, reduce_op, group_name):
    comm = communicator_of(group_name)
    out = inp.new_empty(_scattered_shape(inp, comm.world))
    return _reduce_scatter_out_cuda(inp, reduce_op, group_name, out=out)


# CPU kernels: torch.distributed on the group ---------------------------------------------------

_DIST_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _dist_op(reduce_op, dtype, op):
    _reduce_code(reduce_op, dtype, op)
    return _DIST_OPS[reduce_op]


def _dist_all_reduce(t, reduce_op, group):
    if reduce_op == "avg":  # gloo has no AVG
        dist.all_reduce(t, dist.ReduceOp.SUM, group=group)
        t.div_(group.size())
    else:
        dist.all_reduce(t, _dist_op(reduce_op, t.dtype, "all_reduce"), group=group)


def _all_reduce_out_cpu(inp, reduce_op, group_name, *, out):
    _dtype_code(inp.dtype, "all_reduce", False)
    _reduce_code(reduce_op, inp.dtype, "all_reduce")
    _check_contiguous(inp, "input", "all_reduce")
    _check_contiguous(out, "out", "all_reduce")
    _check_sizes("all_reduce", inp, out, inp.numel())
    if out.data_ptr() != inp.data_ptr():
        out.copy_(inp.view(out.shape))
    _dist_all_reduce(out, reduce_op, c10d._resolve_process_group(group_name))
    return out


def _all_reduce_cpu(inp, reduce_op, group_name):
    return _all_reduce_out_cpu(inp, reduce_op, group_name, out=inp.clone(memory_format=torch.contiguous_format))


def _all_reduce_inplace_cpu(inp, reduce_op, group_name):
    _all_reduce_out_cpu(inp, reduce_op, group_name, out=inp)


def _all_gather_out_cpu(inp, group_name, *, out):
    group = c10d._resolve_process_group(group_name)
    _check_contiguous(inp, "input", "all_gather_into_tensor")
    _check_contiguous(out, "out", "all_gather_into_tensor")
    _check_sizes("all_gather_into_tensor", inp, out, inp.numel() * group.size())
    parts = list(out.view(-1).chunk(group.size()))
    dist.all_gather(parts, inp.reshape(-1).clone(), group=group)
    return out


def _all_gather_cpu(inp, group_name):
    group = c10d._resolve_process_group(group_name)
    return _all_gather_out_cpu(inp, group_name, out=inp.new_empty(_gathered_shape(inp, group.size())))


def _all_gather_list_cpu(inp, group_name, outputs):
    group = c10d._resolve_process_group(group_name)
    _check_contiguous(inp, "input", "all_gather")
    _check_list(inp, outputs, group.size(), "all_gather")
    dist.all_gather(list(outputs), inp, group=group)


def _reduce_scatter_out_cpu(inp, reduce_op, group_name, *, out):
    group = c10d._resolve_process_group(group_name)
    _dtype_code(inp.dtype, "reduce_scatter_tensor", False)
    _reduce_code(reduce_op, inp.dtype, "reduce_scatter_tensor")
    _check_contiguous(inp, "input", "reduce_scatter_tensor")
    _check_contiguous(out, "out", "reduce_scatter_tensor")
    if inp.numel() != out.numel() * group.size():
        raise ValueError(f"symmem.reduce_scatter_tensor: input has {inp.numel()} elements, output {out.numel()}")
    total = inp.reshape(-1).clone()
    _dist_all_reduce(total, reduce_op, group)  # gloo has no reduce_scatter
    out.copy_(total.view(group.size(), -1)[group.rank()].view(out.shape))
    return out


def _reduce_scatter_cpu(inp, reduce_op, group_name):
    group = c10d._resolve_process_group(group_name)
    out = inp.new_empty(_scattered_shape(inp, group.size()))
    return _reduce_scatter_out_cpu(inp, reduce_op, group_name, out=out)


def _returning_none(kernel):
    """The kernel of a mutating op (its schema returns nothing, so torch.compile can functionalise it)."""
    def mutate(*args, **kwargs):
        kernel(*args, **kwargs)
    return mutate


for _name, _cuda, _cpu in (
        ("all_reduce", _all_reduce_cuda, _all_reduce_cpu),
        ("all_reduce_", _all_reduce_inplace_cuda, _all_reduce_inplace_cpu),
        ("all_reduce_out", _returning_none(_all_reduce_out_cuda), _returning_none(_all_reduce_out_cpu)),
        ("all_gather_into_tensor", _all_gather_cuda, _all_gather_cpu),
        ("all_gather_into_tensor_out", _returning_none(_all_gather_out_cuda), _returning_none(_all_gather_out_cpu)),
        ("all_gather", _all_gather_list_cuda, _all_gather_list_cpu),
        ("reduce_scatter_tensor", _reduce_scatter_cuda, _reduce_scatter_cpu),
        ("reduce_scatter_tensor_out", _returning_none(_reduce_scatter_out_cuda),
         _returning_none(_reduce_scatter_out_cpu))):
    _lib.impl(_name, _cuda, "CUDA")
    _lib.impl(_name, _cpu, "CPU")


# Fake kernels: shapes only (FakeTensor, meta, torch.compile) -----------------------------------

def _group_size(group_name):
    return c10d._resolve_process_group(group_name).size()


def _register_fake(name):
    return torch.library.register_fake(f"symmem::{name}", lib=_lib)


@_register_fake("all_reduce")
def _all_reduce_fake(inp, reduce_op, group_name):
    return torch.empty_like(inp, memory_format=torch.contiguous_format)


@_register_fake("all_reduce_")
def _all_reduce_inplace_fake(inp, reduce_op, group_name):
    return None


@_register_fake("all_reduce_out")
def _all_reduce_out_fake(inp, reduce_op, group_name, *, out):
    return None


@_register_fake("all_gather_into_tensor")
def _all_gather_fake(inp, group_name):
    return inp.new_empty(_gathered_shape(inp, _group_size(group_name)))


@_register_fake("all_gather_into_tensor_out")
def _all_gather_out_fake(inp, group_name, *, out):
    return None


@_register_fake("all_gather")
def _all_gather_list_fake(inp, group_name, outputs):
    return None


@_register_fake("reduce_scatter_tensor")
def _reduce_scatter_fake(inp, reduce_op, group_name):
    return inp.new_empty(_scattered_shape(inp, _group_size(group_name)))


@_register_fake("reduce_scatter_tensor_out")
def _reduce_scatter_out_fake(inp, reduce_op, group_name, *, out):
    return None
