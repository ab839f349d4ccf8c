"""What the examples' host wrappers share: the communicator behind a group argument, and the
element types the kernels accumulate in."""
import torch
import triton.language as tl

# The examples' torch ops are tagged as symmem.torch's are: safe under torch.compile.
TAGS = (torch.Tag.pt2_compliant_tag,)

# symmem's reduction rule (src/device/reduce.cuh): 16-bit floats accumulate in fp32, int32 in int32.
ACCUMULATE = {"float32": tl.float32, "float16": tl.float32, "bfloat16": tl.float32, "int32": tl.int32}


def dtype_name(tensor):
    return str(tensor.dtype).replace("torch.", "")


def group_communicator(group_name):
    """The symmem.torch communicator of a process group's name (the torch ops take names)."""
    from ...torch.groups import GroupCommunicator
    return GroupCommunicator(group_name)


def require_heap(comm, tensor, what, op):
    """Peers reach `tensor` through the heap stride: it must lie in the heap of `comm`'s
    communicator (a symmetric tensor, at the same offset on every rank), or peers would write
    into whatever lies at that distance from an ordinary allocation."""
    from ...torch.device import core_of
    nbytes = max(tensor.numel() * tensor.element_size(), 1)
    if not tensor.is_contiguous() or core_of(comm).buffer_of(tensor.data_ptr(), nbytes) is None:
        raise ValueError(f"{op}: {what} must be a contiguous symmetric tensor of the communicator's heap "
                         "(symmem.torch.empty), the same offset on every rank")


def tile_elements(num_warps, bytes_per_thread, element_size):
    """A 1-D tile of `bytes_per_thread` bytes for each of num_warps * 32 threads, in elements (at
    least 128)."""
    return max(num_warps * 32 * bytes_per_thread // element_size, 128)
