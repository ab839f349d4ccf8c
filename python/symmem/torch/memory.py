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

Lifetimes follow the core's rules: heap memory is never unmapped before the communicator closes.
A tensor from ``empty`` stays valid while the communicator is open (its memory returns at close,
not when the tensor dies); a segment the pool frees is retired, not reused or unmapped, so a CUDA
graph or a peer that still references it never reads freed memory. Closing the communicator
invalidates every such tensor: delete them first.
"""
import math
import warnings
import weakref

import torch
from torch.cuda.memory import CUDAPluggableAllocator, MemPool

from .. import _native
from ..errors import SymmemError
from ._groups import Communicator, existing

_pools = {}  # group name -> (slot, MemPool)
_live_spans = weakref.WeakSet()  # heap memory that tensors from empty() still reference
_next_slot = 0


class _HeapSpan:
    """Exposes a span of heap memory through __cuda_array_interface__; the tensor made from it keeps
    this object (and through it the communicator) alive."""

    def __init__(self, comm, ptr, nbytes):
        self._comm = comm
        _live_spans.add(self)
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


def empty(*size, dtype=torch.float32, group=None):
    """Collective: an uninitialised tensor of `size` in symmetric heap memory of `group`'s
    communicator (default: the world group), on the communicator's device."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    if any(int(d) < 0 for d in size):
        raise ValueError(f"symmem.torch.empty: negative size {tuple(size)}")
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("symmem.torch.empty: allocation is collective and cannot run during CUDA graph capture")
    comm = Communicator(group)
    element = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(size) * element
    # Exactly nbytes, so that the tensor is the whole buffer (a symmetric operand).
    ptr = comm.core.allocate(max(nbytes, element))
    raw = torch.as_tensor(_HeapSpan(comm, ptr, max(nbytes, element)), device=comm.torch_device)
    return raw[:nbytes].view(dtype).view(size)


def is_symmetric(tensor, group=None):
    """True when collectives of `group` run zero-copy on `tensor`: it is a whole heap buffer of the
    group's communicator (a tensor from ``empty``, not a view of one). Local: makes nothing."""
    comm = existing(group)
    if comm is None or not tensor.is_cuda or not tensor.is_contiguous():
        return False
    nbytes = tensor.numel() * tensor.element_size()
    found = comm.core.buffer_of(tensor.data_ptr(), max(nbytes, 1))
    return found is not None and found == (tensor.data_ptr(), nbytes)


def in_heap(tensor, group=None):
    """True when `tensor`'s memory lies in the heap of `group`'s communicator (``empty`` or the
    pool), whether or not collectives on it run zero-copy. Local: makes nothing."""
    comm = existing(group)
    if comm is None or not tensor.is_cuda:
        return False
    return comm.core.buffer_of(tensor.data_ptr(), max(tensor.numel() * tensor.element_size(), 1)) is not None


def mem_pool(group=None):
    """The torch.cuda.MemPool of `group`'s communicator (one per group, made on first use):
    ``with torch.cuda.use_mem_pool(symmem.torch.mem_pool(group)): t = torch.empty(...)``
    allocates symmetric tensors. Allocation inside the pool is collective."""
    comm = Communicator(group)
    entry = _pools.get(comm.key)
    if entry is None:
        # A slot is never reused in a process: a MemPool the user still holds after its
        # communicator closed must not start allocating on another communicator.
        global _next_slot
        if _next_slot >= _native.POOL_SLOTS:
            raise SymmemError("kUnsupported", f"symmem: at most {_native.POOL_SLOTS} memory pools per process")
        slot, _next_slot = _next_slot, _next_slot + 1
        _native.check(_native.lib.symmem_pool_bind(slot, comm.core.handle))
        allocator = CUDAPluggableAllocator(_native.library_path(), f"symmem_pool_alloc_{slot}",
                                           f"symmem_pool_free_{slot}")
        entry = (slot, MemPool(allocator.allocator()))
        _pools[comm.key] = entry
    return entry[1]


def _forget(comm):
    """Unbinds the pool of a communicator that is closing, and says when tensors from empty()
    still reference its memory (they become invalid)."""
    alive = sum(1 for span in list(_live_spans) if span._comm is comm)
    if alive:
        warnings.warn(f"symmem: closing the communicator of group {comm.group_name!r} while {alive} tensors from "
                      "symmem.torch.empty are alive; they become invalid", stacklevel=3)
    entry = _pools.pop(comm.key, None)
    if entry is not None:
        _native.lib.symmem_pool_bind(entry[0], None)
