"""The one exception type of symmem, mirroring symmem::Error (code + message)."""


class SymmemError(RuntimeError):
    """A failure of the symmem core. ``code`` is the C++ ErrorCode name: kInvalidArgument,
    kUnsupported, kCudaError, kSystemError, kBootstrap, kTimeout, kMismatch, kAborted, kInternal.
    The message names the rank, the collective and the cause (e.g. the peer that never came)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
