"""The slots of the C ABI's pool allocator (torch's CUDAPluggableAllocator takes named functions
with no context, so the library has a fixed number of slots, each bound to one communicator).

A communicator takes one slot for its life, with one MemPool over it that the communicator holds
(a MemPool the user drops is not a reason to take another slot: its tensors may still live). A
closing communicator's slot is unbound at once (its pool allocates nothing more) and its MemPool let
go; the slot is given back only once that MemPool object is gone and every segment it handed out
was freed, so a MemPool still held never allocates on another communicator, and while its segments
are in use the communicator's memory stays mapped (groups.py)."""
import weakref

from .. import _native, errors

_slots = [None] * _native.POOL_SLOTS  # slot -> [communicator or None, weakref of its MemPool]


def _free_slot():
    for slot, entry in enumerate(_slots):
        if entry is None:
            return slot
        comm, pool = entry
        if comm is None and pool() is None and _native.lib.symmem_pool_live_segments(slot) == 0:
            return slot
    return None


def bind(comm, make_pool):
    """Binds a free slot to `comm` and returns make_pool(slot), the MemPool over it, which `comm`
    keeps (comm.pool) until it closes."""
    slot = _free_slot()
    if slot is None:
        raise errors.SymmemError(_native.ErrorCode.kUnsupported,
                                 f"symmem: at most {_native.POOL_SLOTS} memory pools in use per process (a pool is "
                                 "in use while its MemPool object or any segment it gave lives)")
    _native.check(_native.lib.symmem_pool_bind(slot, comm.core.handle))
    pool = make_pool(slot)
    _slots[slot] = [comm, weakref.ref(pool)]
    comm.pool_slot, comm.pool = slot, pool
    return pool


def unbind(comm):
    """`comm` is closing: its pool allocates nothing more."""
    if comm.pool_slot is not None:
        _native.lib.symmem_pool_bind(comm.pool_slot, None)
        _slots[comm.pool_slot][0] = None
        comm.pool = None


def in_use(comm):
    """Whether segments of `comm`'s pool are still in use (its memory must stay mapped)."""
    return comm.pool_slot is not None and _native.lib.symmem_pool_live_segments(comm.pool_slot) > 0
