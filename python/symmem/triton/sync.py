"""symmem.triton's helpers: barriers, signals and waits for Triton kernels on the symmetric heap,
mirroring include/symmem/device.cuh by name (docs/kernels.md has the rules).

Every wait has the communicator's deadline and polls its abort word every 256 spins; a wait that
fails records why in this rank's failure record (timeout: the peer never came; mismatch: the peer
is in a different call; aborted: another rank failed first), sets the abort word so that every wait
of every rank leaves, and returns False; the kernel then skips its work and returns. The host's
``check()`` raises kTimeout / kMismatch naming the peer and both calls, on every rank. Nothing here
traps or spins without a bound.

Uniform decisions. A Triton program's scalars live in every thread, and Triton assumes they are
equal there; a flag loaded by each thread at its own moment is not. So every value read from memory
that another agent writes is read into a lanes vector (one element per thread, ptx.thread_lanes)
and reduced before anything branches on it: the reduction's result is the same in every thread.
A wait ends with a CTA barrier, so that what one thread acquired is visible to every thread of
the program (the acquire, then bar.sync: causality order).

Flags of another GPU are read with ld.acquire.sys and written with st.release.sys after a CTA
barrier (the release is cumulative over the whole program's writes). A kernel receives its
communicator's sync context (an int64 tensor, symmem.device.sync_words) and the call's signature
from symmem.triton.launch.
"""
import triton
import triton.language as tl

from .. import device as _layout

if triton.knobs.runtime.interpret:
    from .interpreted import (fence_acq_rel_sys, fence_proxy_async_global, global_timer_ns, ld_acquire_sys,
                              ld_acquire_sys_u64, ld_volatile_u32, ld_volatile_u32_on, st_release_sys,
                              st_release_sys_u64, st_volatile_u32, thread_lanes)
else:
    from .ptx import (fence_acq_rel_sys, fence_proxy_async_global, global_timer_ns, ld_acquire_sys,
                      ld_acquire_sys_u64, ld_volatile_u32, ld_volatile_u32_on, st_release_sys, st_release_sys_u64,
                      st_volatile_u32, thread_lanes)

# The sync context's words (symmem/device.py).
_ABORT: tl.constexpr = tl.constexpr(_layout.SYNC_ABORT)
_FAILURE: tl.constexpr = tl.constexpr(_layout.SYNC_FAILURE)
_CLAIM: tl.constexpr = tl.constexpr(_layout.SYNC_CLAIM)
_FLAGS: tl.constexpr = tl.constexpr(_layout.SYNC_FLAGS)
_EPOCHS: tl.constexpr = tl.constexpr(_layout.SYNC_EPOCHS)
_TIMEOUT_NS: tl.constexpr = tl.constexpr(_layout.SYNC_TIMEOUT_NS)
_HEAP_STRIDE: tl.constexpr = tl.constexpr(_layout.SYNC_HEAP_STRIDE)
_RANK: tl.constexpr = tl.constexpr(_layout.SYNC_RANK)
_USER_OP: tl.constexpr = tl.constexpr(_layout.SYNC_USER_OP)

PHASES: tl.constexpr = tl.constexpr(4)        # barriers per call, each phase used once (symmem::kUserPhases)
MAX_BLOCKS: tl.constexpr = tl.constexpr(160)  # programs of a kernel that uses epochs (symmem::kUserMaxBlocks)
MAX_WORLD: tl.constexpr = tl.constexpr(8)

# symmem::FailureCode
TIMEOUT: tl.constexpr = tl.constexpr(1)
MISMATCH: tl.constexpr = tl.constexpr(2)
ABORTED: tl.constexpr = tl.constexpr(3)

# How wait_signal compares the word with the value (symmem::dev::Cmp).
EQUAL: tl.constexpr = tl.constexpr(0)
AT_LEAST: tl.constexpr = tl.constexpr(1)  # word - value, as a signed 32-bit number, >= 0 (wraps)
NOT_EQUAL: tl.constexpr = tl.constexpr(2)

_SPINS_PER_CHECK: tl.constexpr = tl.constexpr(256)


@triton.jit
def _pointer(sync, index: tl.constexpr, dtype: tl.constexpr):
    return tl.load(sync + index).to(tl.pointer_type(dtype))


@triton.jit
def _any(condition):
    """True in every thread when `condition` (a lanes vector) holds in some lane."""
    return tl.max(condition.to(tl.int32), axis=0) != 0


# ---- Peers ----------------------------------------------------------------------------------------

@triton.jit
def heap_stride(sync):
    """Bytes between two ranks' copies of any heap address (one load of the sync context)."""
    return tl.load(sync + _HEAP_STRIDE)


@triton.jit
def peer(ptr, p, rank, heap_stride):
    """Peer p's copy of `ptr` (a pointer, or a block of pointers, into the heap), with no load: the
    heap maps rank p's memory at the same offset plus (p - rank) * heap_stride bytes. Pass
    heap_stride as a kernel argument (launch fills one named `heap_stride`): Triton then knows it is
    a multiple of 16 bytes and keeps the peer's loads vectorised, as it would not through an integer
    cast or a value loaded from memory."""
    ELEMENT: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    return ptr + (tl.cast(p, tl.int64) - tl.cast(rank, tl.int64)) * (heap_stride // ELEMENT)


@triton.jit
def peer_from_table(ptr, table, p, rank):
    """The same through a table of every rank's copy of one buffer (symmem.torch.device's ptr_table,
    PyTorch's buffer_ptrs_dev): two loads. The copies must lie a multiple of 16 bytes apart (any
    allocator's buffers do): the hint keeps the peer's loads 16-byte vectors."""
    ELEMENT: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    delta = tl.multiple_of((tl.load(table + p) - tl.load(table + rank)) // ELEMENT, 16 // ELEMENT)
    return ptr + delta


# ---- Failure --------------------------------------------------------------------------------------

@triton.jit
def _host_word(p, lanes):
    """A word of host-mapped memory (the abort word, the failure record) read by lane 0 alone (0 in
    the other lanes): a read of every thread crosses PCIe once per thread, and a grid of 64 programs
    of 512 threads waiting together flooded it for milliseconds a call (measured on H200)."""
    return ld_volatile_u32_on(p + lanes * 0, lanes == 0)


@triton.jit
def record_failure(sync, signature, code, peer, phase, peer_signature):
    """Records this rank's failure (symmem::dev::record_failure): the first failure of this rank
    wins. A timeout or mismatch also sets the abort word, after a system fence that publishes the
    record. The writer is elected on a claim word in device memory (one thread, broadcast); the
    record's code is written last."""
    lanes = thread_lanes()
    record = _pointer(sync, _FAILURE, tl.uint32)
    if tl.max(_host_word(record, lanes), axis=0) == 0:
        claim = _pointer(sync, _CLAIM, tl.uint32)
        if tl.atomic_cas(claim, 0, 1, sem="relaxed", scope="gpu") == 0:
            if tl.max(_host_word(record, lanes), axis=0) == 0:  # else a watchdog's, meanwhile
                st_volatile_u32(record + 1, tl.load(sync + _USER_OP))
                st_volatile_u32(record + 2, tl.load(sync + _RANK))
                st_volatile_u32(record + 3, peer)
                st_volatile_u32(record + 4, tl.program_id(0))
                st_volatile_u32(record + 5, phase)
                st_volatile_u32(record + 6, signature)
                st_volatile_u32(record + 7, peer_signature)
                fence_acq_rel_sys()
                st_volatile_u32(record, code)
                fence_acq_rel_sys()  # the record is visible before the abort word
                if code != ABORTED:
                    st_volatile_u32(_pointer(sync, _ABORT, tl.uint32), 1)
                    fence_acq_rel_sys()  # push it out now: the other ranks' waits poll it
        else:
            # Another wait of this rank is writing the record: leave once it is visible (or at the
            # deadline), so that no kernel ends before its rank's failure can be read.
            timeout = tl.load(sync + _TIMEOUT_NS).to(tl.uint64)
            start = global_timer_ns(lanes)
            pending = tl.full([], 1, tl.int1)
            while pending:
                seen = _any(_host_word(record, lanes) != 0)
                late = _any(global_timer_ns(lanes) - start > timeout)
                pending = (seen | late) == 0


@triton.jit
def keep_waiting(sync, signature, lanes, start, peer, phase):
    """The slow half of every wait (every 256 spins): False, after recording why, once the
    communicator is aborted or the deadline (counted from `start`, a lanes vector) has passed."""
    aborted = _any(_host_word(_pointer(sync, _ABORT, tl.uint32), lanes) != 0)
    late = _any(global_timer_ns(lanes) - start > tl.load(sync + _TIMEOUT_NS).to(tl.uint64))
    ok = tl.full([], 1, tl.int1)
    if aborted:
        record_failure(sync, signature, ABORTED, peer, phase, 0)
        ok = tl.full([], 0, tl.int1)
    elif late:
        record_failure(sync, signature, TIMEOUT, peer, phase, 0)
        ok = tl.full([], 0, tl.int1)
    return ok


@triton.jit
def _spin(sync, signature, lanes, start, spins, peer, phase):
    """One more spin of a wait's loop: (spins + 1, 2 once the wait failed, recorded, else 0); every
    256 spins the slow half (keep_waiting)."""
    spins += 1
    state = tl.full([], 0, tl.int32)
    if spins % _SPINS_PER_CHECK == 0:
        if keep_waiting(sync, signature, lanes, start, peer, phase) == 0:
            state = 2
    return spins, state


# ---- Signals --------------------------------------------------------------------------------------

@triton.jit
def signal(word_on_peer, value):
    """Sets a word of a peer's signal pad to `value` once every write of this program before it is
    visible to the peer (CTA barrier, then a release store at system scope)."""
    tl.debug_barrier()
    st_release_sys(word_on_peer, value, 1)


@triton.jit
def signal_add(word_on_peer, value):
    """Adds `value` to a word of a peer's signal pad (one thread), after every write of this program."""
    tl.debug_barrier()
    tl.atomic_add(word_on_peer, tl.cast(value, tl.uint32), sem="release", scope="sys")


@triton.jit
def _compare(word, value, CMP: tl.constexpr):
    if CMP == EQUAL:
        result = word == value
    elif CMP == AT_LEAST:
        result = (word - value).to(tl.int32, bitcast=True) >= 0
    else:
        result = word != value
    return result


@triton.jit
def wait_signals(sync, signature, words, count, value, CMP: tl.constexpr, peer, phase):
    """wait_signal for `count` consecutive words from `words` on, all written by `peer` (e.g. the
    piece flags of one shard): one lane per word and thread, every word polled at once. A word that
    came stays counted (a lane polls its next word only once every lane's came)."""
    signature = tl.cast(signature, tl.uint32)
    value = tl.cast(value, tl.uint32)
    lanes = thread_lanes()
    start = global_timer_ns(lanes)
    state = tl.full([], 0, tl.int32)  # 0 waiting, 1 every word came, 2 failed
    spins = tl.full([], 0, tl.int32)
    base = tl.full([], 0, tl.int32)  # the words before `base` came
    while state == 0:
        mine = base + lanes < count
        seen = ld_acquire_sys(words + tl.where(mine, base + lanes, 0), mine)
        if tl.min((_compare(seen, value, CMP) | (mine == 0)).to(tl.int32), axis=0) == 1:
            base += lanes.shape[0]
            if base >= count:
                state = 1
        else:
            spins, state = _spin(sync, signature, lanes, start, spins, peer, phase)
    tl.debug_barrier()  # what the threads acquired, every thread sees
    return state == 1


@triton.jit
def wait_signal(sync, signature, word, value, CMP: tl.constexpr, peer, phase):
    """Waits until `word` (this rank's memory, written by `peer`) compares true with `value`
    (EQUAL, AT_LEAST or NOT_EQUAL); then every thread of the program sees what the peer wrote
    before signalling. `phase` is any number the kernel gives this wait, for the error message.
    Returns False on timeout or abort (recorded)."""
    return wait_signals(sync, signature, word, 1, value, CMP, peer, phase)


@triton.jit
def put_signal(dst_on_peer, src, n, signal_on_peer, value, BLOCK: tl.constexpr):
    """Copies n elements from `src` to `dst_on_peer` (a peer's heap memory) with the whole program,
    then sets `signal_on_peer` to `value` once all of them are visible to the peer."""
    start = 0
    while start < n:  # (a while loop: the interpreter's range() takes no runtime bound)
        offsets = start + tl.arange(0, BLOCK)
        tl.store(dst_on_peer + offsets, tl.load(src + offsets, mask=offsets < n), mask=offsets < n)
        start += BLOCK
    signal(signal_on_peer, value)


# ---- Epochs and the barrier -----------------------------------------------------------------------

@triton.jit
def epoch_begin(sync):
    """This program's number for the call: one per program id, kept on the device so that CUDA graph
    replays advance it. Commit it with epoch_commit once the program is done."""
    epochs = _pointer(sync, _EPOCHS, tl.uint32)
    return tl.load(epochs + tl.program_id(0) % MAX_BLOCKS) + 1


@triton.jit
def epoch_commit(sync, epoch):
    epochs = _pointer(sync, _EPOCHS, tl.uint32)
    tl.store(epochs + tl.program_id(0) % MAX_BLOCKS, epoch)


@triton.jit
def barrier(sync, signature, epoch, PHASE: tl.constexpr, rank, WORLD: tl.constexpr):
    """Barrier among the same-index programs of every rank (symmem::dev::barrier). Program i of
    each rank tells program i of every peer that it reached PHASE (0 to PHASES - 1, each used once
    per call) of call `epoch`, then waits for the same from each of them. The program's writes
    before it are visible to the peers' program i after it. A peer may be one call ahead (it passed
    on this rank's flag of this call, so the calls matched); an equal epoch with another signature
    is a peer in a different call (mismatch). Returns False if a wait failed (recorded)."""
    tl.static_assert(PHASE < PHASES, "a user kernel has PHASES barrier phases")
    tl.static_assert(WORLD <= MAX_WORLD, "at most 8 ranks share a heap")
    signature = tl.cast(signature, tl.uint32)
    epoch = tl.cast(epoch, tl.uint32)
    lanes = thread_lanes()
    others = (lanes < WORLD) & (lanes != rank)  # lane p waits for peer p
    flags = _pointer(sync, _FLAGS, tl.uint64)
    stride = tl.load(sync + _HEAP_STRIDE) // 8  # in flags
    slots = flags + (PHASE * MAX_BLOCKS + tl.program_id(0) % MAX_BLOCKS) * MAX_WORLD
    flag = (tl.cast(epoch, tl.uint64) << 32) | tl.cast(signature, tl.uint64)
    tl.debug_barrier()  # the program's writes happen before the release below (cumulativity)
    st_release_sys_u64(slots + (lanes - rank).to(tl.int64) * stride + rank, flag, others)

    mine = slots + tl.where(others, lanes, 0)
    peers = tl.where(others, lanes, 0).to(tl.int64)
    start = global_timer_ns(lanes)
    state = tl.full([], 0, tl.int32)  # 0 waiting, 1 every peer came, 2 failed
    spins = tl.full([], 0, tl.int32)
    while state == 0:
        f = ld_acquire_sys_u64(mine, others)
        ahead = (f >> 32).to(tl.uint32) - epoch
        their_signature = (f & 0xFFFFFFFF).to(tl.uint32)
        # 0: a mismatch, 1: not yet, 2: came (or no peer); the least, with the lowest peer, decides.
        code = tl.where(ahead <= 1, tl.where((ahead == 1) | (their_signature == signature), 2, 0), 1)
        code = tl.where(others, code, 2)
        first = tl.min((code.to(tl.int64) << 40) | (peers << 32) | their_signature.to(tl.int64), axis=0)
        verdict = first >> 40
        first_peer = ((first >> 32) & 0xFF).to(tl.int32)
        if verdict == 2:
            state = 1
        elif verdict == 0:
            record_failure(sync, signature, MISMATCH, first_peer, PHASE, (first & 0xFFFFFFFF).to(tl.uint32))
            state = 2
        else:
            spins, state = _spin(sync, signature, lanes, start, spins, first_peer, PHASE)
    tl.debug_barrier()  # what each thread acquired, every thread sees
    return state == 1
