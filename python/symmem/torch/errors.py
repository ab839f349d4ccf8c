"""With torch in the process, symmem's errors are torch.distributed.DistBackendError (the type a
failed NCCL collective raises), so code written for NCCL catches them. ``import symmem`` needs no
torch, so this module, imported by ``symmem.torch``, makes ``symmem.SymmemError`` a subclass of both
when torch was imported after symmem; errors raised from then on are of that class."""
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
