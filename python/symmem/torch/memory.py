"""Symmetric tensors: torch tensors over symmem heap memory, so collectives on them run zero-copy.

``empty`` allocates one heap buffer per call; ``mem_pool`` gives a torch.cuda.MemPool whose
segments are heap buffers, so that code (FSDP2's all-gather outputs, a model's activations) can
allocate symmetric tensors under ``torch.cuda.use_mem_pool``. Both are collective: every rank makes
the same allocations in the same order.

Lifetimes follow the core's rules: heap memory is never unmapped before the communicator closes.
A tensor from ``empty`` keeps its memory alive as long as the communicator is open; a segment the
pool frees is retired, not reused or unmapped, so a CUDA graph or a peer that still references it
never reads freed memory. Closing the communicator invalidates every such tensor.
"""
import math

import torch
from torch.cuda.memory import CUDAPluggableAllocator, MemPool

from .. import _native
from ._groups import Communicator

_pools = {}  # group name -> (slot, MemPool)


class _HeapSpan:
    """Exposes a span of heap memory through __cuda_array_interface__; the tensor made from it keeps
    this object (and through it the communicator) alive."""

    def __init__(self, comm, ptr, nbytes):
        self._comm = comm
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


def empty(*size, dtype=torch.float32, group=None):
    """Collective: an uninitialised tensor of `size` in symmetric heap memory of `group`'s
    communicator (default: the world group), on the communicator's device."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    comm = Communicator(group)
    element = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(size) * element
    ptr = comm.core.allocate(max(nbytes, 16))
    raw = torch.as_tensor(_HeapSpan(comm, ptr, max(nbytes, element)), device=comm.torch_device)
    return raw[:nbytes].view(dtype).view(size)


def is_symmetric(tensor, group=None):
    """True when `tensor` lies in symmetric heap memory of `group`'s communicator (made by
    ``empty`` or the pool): collectives on it run zero-copy."""
    if not tensor.is_cuda:
        return False
    comm = Communicator(group)
    nbytes = tensor.numel() * tensor.element_size()
    return comm.core.buffer_of(tensor.data_ptr(), max(nbytes, 1)) is not None


def mem_pool(group=None):
    """The torch.cuda.MemPool of `group`'s communicator (one per group, made on first use):
    ``with torch.cuda.use_mem_pool(symmem.torch.mem_pool(group)): t = torch.empty(...)``
    allocates symmetric tensors. Allocation inside the pool is collective."""
    comm = Communicator(group)
    entry = _pools.get(comm.group_name)
    if entry is None:
        used = {slot for slot, _ in _pools.values()}
        free = [k for k in range(_native.POOL_SLOTS) if k not in used]
        if not free:
            raise RuntimeError(f"symmem: at most {_native.POOL_SLOTS} memory pools (one per group) per process")
        slot = free[0]
        _native.check(_native.lib.symmem_pool_bind(slot, comm.core.handle))
        allocator = CUDAPluggableAllocator(_native.library_path(), f"symmem_pool_alloc_{slot}",
                                           f"symmem_pool_free_{slot}")
        entry = (slot, MemPool(allocator.allocator()))
        _pools[comm.group_name] = entry
    return entry[1]


def _forget(comm):
    """Unbinds the pool of a communicator that is closing."""
    entry = _pools.pop(comm.group_name, None)
    if entry is not None:
        _native.lib.symmem_pool_bind(entry[0], None)
