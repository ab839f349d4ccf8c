"""symmem: GPU collectives on symmetric memory (one NVLink node of 2-8 Hopper GPUs).

``import symmem`` needs neither torch nor a GPU. ``symmem.torch`` (imported on first use) holds the
PyTorch surface: ops registered with torch.library, torch.distributed-style functions, symmetric
tensors and a MemPool, and TPAllReduce for vLLM-style tensor parallelism (docs/torch.md).
"""
import importlib

from . import errors
from ._native import ErrorCode
from .communicator import Communicator, Exchange

__all__ = ["Communicator", "ErrorCode", "Exchange", "SymmemError", "library_version"]


def library_version():
    from ._native import lib
    return lib.symmem_version().decode()


def __getattr__(name):
    if name == "SymmemError":  # looked up each time: symmem.torch may have made it a DistBackendError
        return errors.SymmemError
    if name in ("torch", "bench", "triton"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'symmem' has no attribute {name!r}")
