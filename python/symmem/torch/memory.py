"""Symmetric tensors: torch tensors over symmem heap memory.

``empty`` allocates one heap buffer per call and returns a tensor over all of it; collectives on
that whole tensor run zero-copy (peers read and write it in place). A view of it (a slice, a
shard) is staged like any other tensor, because its offset may differ across ranks (rank r's shard
starts at the base on rank 0 only) and ranks must agree on every operand.

``mem_pool`` gives a torch.cuda.MemPool whose segments are heap buffers, for code that allocates
under ``torch.cuda.use_mem_pool``. Its tensors are heap memory, but zero-copy only when a tensor
fills its whole segment; the caching allocator decides that, so treat pool tensors as staged.

Both are collective: every rank makes the same allocations in the same order; the pool's
allocations come from the caching allocator, so every rank's program must allocate alike under it.

Lifetimes (groups.py): heap memory is never unmapped while anything may use it. A tensor from
``empty`` keeps its communicator's memory mapped as long as it (or a view of it) lives, even after
the group is closed or destroyed; its memory returns when the communicator is released, not when
the tensor dies, so allocate symmetric buffers once and reuse them. A segment the pool frees is
retired (not reused or unmapped) until the communicator is released, because the caching allocator
frees on its own schedule, which may differ across ranks. A closed communicator's pool allocates
nothing more; its slot is reused only once the MemPool object is gone and its segments freed.
"""
import math
from typing import Optional

import torch
from torch.cuda.memory import CUDAPluggableAllocator, MemPool

from .. import _native, errors
from . import pools
from .groups import GroupCommunicator, capturing, release_unused, state_of


class _Span:
    """Exposes a span of device memory through __cuda_array_interface__; the tensor made from it keeps
    this object, and through it the communicator, alive, and the communicator counts it (and so does
    `lender`, a WeakSet, when given): its memory is released only once no span is left."""

    def __init__(self, comm, ptr, nbytes, lender=None):
        self._comm = comm
        spans = getattr(comm, "_spans", None)  # a core communicator counts nothing (its close() is its owner's)
        if spans is not None:
            spans.add(self)
        if lender is not None:
            lender.add(self)
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


def heap_tensor(comm, ptr: int, nbytes: int) -> torch.Tensor:
    """A uint8 CUDA tensor over [ptr, ptr + nbytes) of `comm`'s heap that keeps the memory mapped while
    it, or any view of it, lives. `comm` may also be a core communicator (symmem.communicator, as
    ranks built through the C ABI use): the tensor then keeps the object alive, and its memory lives
    until the communicator's close(), which its owner orders after the tensor's last use."""
    return lent_tensor(comm, ptr, nbytes)


def lent_tensor(comm, ptr: int, nbytes: int, lender=None) -> torch.Tensor:
    """heap_tensor for memory an object of `comm` lends (its heap buffers, or local memory it owns):
    `lender`, a WeakSet of the object's, counts the tensor's span too, so that the object, once
    closed, releases its memory only when no such tensor is left (groups.GroupCommunicator.hold)."""
    device = getattr(comm, "torch_device", None) or torch.device("cuda", comm.device)
    return torch.as_tensor(_Span(comm, ptr, nbytes, lender), device=device)


def _element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def empty(*size: int, dtype: Optional[torch.dtype] = None, device=None, group=None) -> torch.Tensor:
    """Collective: an uninitialised tensor of `size` in symmetric heap memory of `group`'s
    communicator (default: the world group; a ProcessGroup or its name), on the communicator's
    device. ``dtype`` defaults to torch's default dtype; ``device``, if given, must be that device."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    size = tuple(int(d) for d in size)
    if any(d < 0 for d in size):
        raise ValueError(f"symmem.torch.empty: negative size {size}")
    if capturing():
        raise RuntimeError("symmem.torch.empty: allocation is collective and cannot run during CUDA graph capture")
    dtype = torch.get_default_dtype() if dtype is None else dtype
    comm = GroupCommunicator(group)
    if device is not None:
        asked = torch.device(device)
        if asked.type != "cuda" or (asked.index is not None and asked.index != comm.device):
            raise ValueError(f"symmem.torch.empty: device {asked} is not the communicator's {comm.torch_device}")
    comm._ensure_open()
    element = _element_size(dtype)
    nbytes = math.prod(size) * element
    # Exactly nbytes, so that the tensor is the whole buffer (a symmetric operand).
    ptr = comm.core.allocate(max(nbytes, element))
    return heap_tensor(comm, ptr, max(nbytes, element))[:nbytes].view(dtype).view(size)


def _existing(group):
    """The open communicator of `group`, if one was made (never collective)."""
    try:
        state = state_of(group)
    except (ValueError, RuntimeError):
        return None
    comm = state.communicators.get(None)
    return None if comm is None or comm.closed else comm


def is_symmetric(tensor: torch.Tensor, group=None) -> bool:
    """True when collectives of `group` run zero-copy on `tensor`: it is a whole heap buffer of the
    group's communicator (a tensor from ``empty``, not a view of one). Local: makes nothing."""
    comm = _existing(group)
    if comm is None or not tensor.is_cuda or not tensor.is_contiguous():
        return False
    nbytes = tensor.numel() * tensor.element_size()
    found = comm.core.buffer_of(tensor.data_ptr(), max(nbytes, 1))
    return found is not None and found == (tensor.data_ptr(), nbytes)


def in_heap(tensor: torch.Tensor, group=None) -> bool:
    """True when `tensor`'s memory lies in the heap of `group`'s communicator (``empty`` or the
    pool), whether or not collectives on it run zero-copy. Local: makes nothing."""
    comm = _existing(group)
    if comm is None or not tensor.is_cuda:
        return False
    return comm.core.buffer_of(tensor.data_ptr(), max(tensor.numel() * tensor.element_size(), 1)) is not None


def mem_pool(group=None) -> MemPool:
    """The torch.cuda.MemPool of `group`'s communicator (one per communicator, made on first use):
    ``with torch.cuda.use_mem_pool(symmem.torch.mem_pool(group)): t = torch.empty(...)``
    allocates heap tensors. Allocation inside the pool is collective."""
    comm = GroupCommunicator(group)
    comm._ensure_open()
    if comm.pool is not None:
        return comm.pool

    def make_pool(slot):
        allocator = CUDAPluggableAllocator(_native.library_path(), f"symmem_pool_alloc_{slot}",
                                           f"symmem_pool_free_{slot}")
        return MemPool(allocator.allocator())

    try:
        return pools.bind(comm, make_pool)
    except errors.SymmemError:
        release_unused()  # a retired communicator's slot may be free by now
        return pools.bind(comm, make_pool)
