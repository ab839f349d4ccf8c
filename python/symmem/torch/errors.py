"""With torch in the process, symmem's errors are torch.distributed.DistBackendError (the type a
failed NCCL collective raises), so code written for NCCL catches them. ``import symmem`` needs no
torch, so this module, imported by ``symmem.torch``, makes ``symmem.SymmemError`` a subclass of both
when torch was imported after symmem; errors raised from then on are of that class."""
import torch
import torch.distributed as dist

from .. import errors

if not issubclass(errors.SymmemError, dist.DistBackendError):
    base = errors.SymmemError

    class SymmemError(base, dist.DistBackendError):
        __doc__ = base.__doc__

    SymmemError.__module__ = "symmem.errors"
    # Errors made before this import keep pickling: their class is found under a name of its own.
    base.__qualname__ = base.__name__ = "SymmemErrorWithoutTorch"
    errors.SymmemErrorWithoutTorch = base
    errors.SymmemError = SymmemError
SymmemError = errors.SymmemError


class RefusedValueError(SymmemError, ValueError):
    """A call this rank refused because a tensor argument failed a check (a shape, a device, a
    layout): the ValueError the op documents, and the SymmemError (kInvalidArgument, the same
    message) that every other rank of the group raises for it."""


class RefusedTypeError(SymmemError, TypeError):
    """As RefusedValueError, for a check of a dtype (the TypeError the op documents)."""


for _cls in (RefusedValueError, RefusedTypeError):
    _cls.__module__ = __name__


def refused(comm, op, cause):
    """The error to raise when this rank's torch-level check of a collective call of `comm` (a
    GroupCommunicator) failed with `cause` (a TypeError or ValueError): the call is refused on the
    current stream (Communicator.refuse in the core), so that every rank raises it, naming this
    rank and the cause, instead of the peers waiting in the call until their deadline. A cause that
    is a SymmemError already (refused, or from the core) is returned as it is."""
    if isinstance(cause, SymmemError):
        return cause
    stream = torch.cuda.current_stream(comm.device).cuda_stream
    error = comm.core.refuse(op, "kInvalidArgument", str(cause), stream)
    cls = RefusedTypeError if isinstance(cause, TypeError) else RefusedValueError
    return cls(error.code, str(error))


def refusal(op, rank, cause):
    """The error every rank raises when rank `rank` refused a call of `op` for `cause` (a TypeError
    or ValueError), for a path that agrees on it over torch.distributed (the CPU reference): the
    cause's own type on the refusing rank, a SymmemError elsewhere, with the core's message."""
    from .. import _native
    message = _native.refusal_message(op, rank, "kInvalidArgument", cause)
    if isinstance(cause, BaseException):
        cls = RefusedTypeError if isinstance(cause, TypeError) else RefusedValueError
        return cls(_native.ErrorCode.kInvalidArgument, message)
    return SymmemError(_native.ErrorCode.kInvalidArgument, message)


def agree_on_checks(ranks, op, check):
    """A refusal over torch.distributed, for the paths without the core (the CPU kernels): every
    rank runs `check`, learns every rank's outcome (one all_gather_object), and raises the first
    refusing rank's error (refusal: the refusing rank its own TypeError / ValueError). `ranks`: the
    group, this rank and the world (.group, .rank, .world: a GroupState, an ExpertParallel)."""
    mine = None
    try:
        check()
    except (TypeError, ValueError) as cause:
        mine = cause
    outcomes = [None] * ranks.world
    dist.all_gather_object(outcomes, None if mine is None else str(mine), group=ranks.group)
    for rank, why in enumerate(outcomes):
        if why is not None:
            mine_first = rank == ranks.rank
            raise refusal(f"symmem.{op}", rank, mine if mine_first else why) from (mine if mine_first else None)
