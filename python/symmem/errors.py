"""The one exception type of symmem, mirroring symmem::Error (a code and a message).

With torch in the process, SymmemError is a ``torch.distributed.DistBackendError`` (the type
``torch.distributed`` raises for a failed collective), so that code written for NCCL's errors
catches symmem's: when torch was imported before symmem, the class derives from it directly;
otherwise ``import symmem.torch`` (the only way symmem meets torch) makes it so
(``symmem.torch.errors``). ``import symmem`` itself never imports torch.
"""
import sys


def _base():
    torch_distributed = sys.modules.get("torch.distributed")
    backend_error = getattr(torch_distributed, "DistBackendError", None)
    return backend_error if backend_error is not None else RuntimeError


class SymmemError(_base()):
    """A failure of the symmem core. ``code`` is a ``symmem.ErrorCode`` (a str enum:
    ``e.code == "kTimeout"`` holds): kInvalidArgument, kUnsupported, kCudaError, kSystemError,
    kBootstrap, kTimeout, kMismatch, kAborted, kInternal, kCapacity. The message names the rank, the
    collective and the cause (e.g. the peer that never came).

    The code is kept as given: the errors symmem raises get theirs from the C ABI (symmem._native
    makes them), so that this module, which the loader imports, imports nothing of symmem."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code

    def __reduce__(self):  # picklable (multiprocessing, torch.distributed object collectives)
        return (type(self), (self.code, str(self)))
