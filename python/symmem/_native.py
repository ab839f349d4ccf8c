"""Loads libsymmem_capi.so (the C ABI, include/symmem/symmem_c.h) with ctypes.

ctypes keeps the package free of any Python or torch ABI: one library serves every Python 3 and
every torch 2.x built for CUDA 13. Pointers and streams cross as integers here and nowhere else.
The per-call collectives also have `fastcall` (symmem._fastcall, built beside the library for
CPython >= 3.10): the same C functions without ctypes' per-argument cost (2-3 us of a call).
"""
import ctypes
import enum
import importlib.machinery
import importlib.util
import logging
import os
import sys
from ctypes import c_char_p, c_int, c_int64, c_size_t, c_ssize_t, c_void_p

from . import _library, errors


def library_path():
    """SYMMEM_LIBRARY, else the library installed beside this file, else a source tree's build/."""
    return _library.locate("libsymmem_capi.so", "SYMMEM_LIBRARY", ImportError)


ALL_GATHER_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_size_t)
BARRIER_FN = ctypes.CFUNCTYPE(c_int, c_void_p)

_SIGNATURES = {
    "symmem_version": (c_char_p, []),
    "symmem_last_error": (c_char_p, []),
    "symmem_error_code_name": (c_char_p, [c_int]),
    "symmem_error_code_id": (c_char_p, [c_int]),
    "symmem_dtype_name": (c_char_p, [c_int]),
    "symmem_reduce_op_name": (c_char_p, [c_int]),
    "symmem_collective_name": (c_char_p, [c_int]),
    "symmem_comm_create": (c_int, [c_int, c_int, c_int, ALL_GATHER_FN, BARRIER_FN, c_void_p, c_int64, c_size_t,
                                   ctypes.POINTER(c_void_p)]),
    "symmem_comm_create_from_env": (c_int, [c_int, ctypes.POINTER(c_void_p)]),
    "symmem_comm_destroy": (None, [c_void_p]),
    "symmem_comm_close": (c_int, [c_void_p]),
    "symmem_comm_rank": (c_int, [c_void_p]),
    "symmem_comm_world": (c_int, [c_void_p]),
    "symmem_comm_nodes": (c_int, [c_void_p]),
    "symmem_comm_device": (c_int, [c_void_p]),
    "symmem_comm_check": (c_int, [c_void_p]),
    "symmem_comm_aborted": (c_int, [c_void_p]),
    "symmem_comm_barrier": (c_int, [c_void_p, c_void_p]),
    "symmem_comm_live_graphs": (c_int, [c_void_p]),
    "symmem_comm_allocate": (c_int, [c_void_p, c_size_t, ctypes.POINTER(c_void_p)]),
    "symmem_comm_buffer_of": (c_int, [c_void_p, c_void_p, c_size_t, ctypes.POINTER(c_void_p),
                                      ctypes.POINTER(c_size_t)]),
    "symmem_all_gather": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_int, c_int, c_int]),
    "symmem_all_reduce": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_int, c_int,
                                  c_int]),
    "symmem_reduce_scatter": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_int, c_int,
                                      c_int]),
    "symmem_all_gather_matmul": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_int64,
                                         c_int, c_void_p, c_int]),
    "symmem_matmul_reduce_scatter": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_int64, c_int64,
                                             c_int64, c_int, c_void_p, c_int]),
    "symmem_matmul_reduce_scatter_workspace_bytes": (c_size_t, [c_int64, c_int64]),
    "symmem_describe": (c_int, [c_void_p, c_int, c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_int,
                                c_char_p, c_size_t]),
    "symmem_parse_algo": (c_int, [c_char_p, ctypes.POINTER(c_int)]),
    "symmem_refuse_call": (c_int, [c_void_p, c_char_p, c_int, c_char_p, c_void_p]),
    "symmem_refusal_message": (c_int, [c_char_p, c_int, c_int, c_char_p, c_char_p, c_size_t]),
    "symmem_pool_bind": (c_int, [c_int, c_void_p]),
    "symmem_pool_live_segments": (ctypes.c_long, [c_int]),
    "symmem_all_to_all": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_void_p, c_int, c_int, c_int]),
    "symmem_all_to_all_v": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_void_p, c_size_t,
                                    c_void_p, c_int, c_int, c_int]),
    "symmem_all_to_all_vdev": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_void_p, c_size_t,
                                       c_int, c_int64, c_void_p, c_int, c_int, c_int]),
    "symmem_describe_all_to_all": (c_int, [c_void_p, c_int, c_void_p, c_size_t, c_void_p, c_size_t, c_size_t, c_int,
                                           c_int64, c_int, c_int, c_int, c_char_p, c_size_t]),
    "symmem_ep_memory": (c_int, [c_int] * 10 + [ctypes.POINTER(c_size_t), ctypes.POINTER(c_size_t)]),
    "symmem_ep_create": (c_int, [c_void_p] + [c_int] * 9 + [ctypes.POINTER(c_void_p)]),
    "symmem_ep_destroy": (None, [c_void_p]),
    "symmem_ep_close": (c_int, [c_void_p]),
    "symmem_ep_close_lent": (c_int, [c_void_p, c_int]),
    "symmem_ep_received": (c_int, [c_void_p] + [ctypes.POINTER(c_void_p)] * 7 + [ctypes.POINTER(c_size_t)]),
    "symmem_ep_dispatch": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_void_p, c_int, c_void_p,
                                   c_void_p]),
    "symmem_ep_combine": (c_int, [c_void_p, c_void_p, c_void_p, c_int, c_void_p, c_void_p]),
    "symmem_ep_blocks": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
    "symmem_ep_blocks_for": (c_int, [c_void_p] + [c_int] * 9 + [ctypes.POINTER(c_int)]),
    "symmem_ep_describe": (c_int, [c_void_p, c_char_p, c_size_t]),
    "symmem_comm_local_rank": (c_int, [c_void_p]),
    "symmem_comm_local_world": (c_int, [c_void_p]),
    "symmem_buffer_device_handle": (c_int, [c_void_p, c_void_p, c_void_p]),
    "symmem_comm_sync_context": (c_int, [c_void_p, c_void_p]),
    "symmem_comm_begin_user_call": (c_int, [c_void_p, c_char_p, c_int, c_void_p, ctypes.POINTER(ctypes.c_uint32)]),
    "symmem_comm_end_user_call": (c_int, [c_void_p, c_void_p]),
    "symmem_user_call_signature": (ctypes.c_uint32, [c_char_p, c_int]),
    "symmem_all_gather_pieces": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_size_t, c_int, c_void_p, c_void_p,
                                         c_void_p]),
}
POOL_SLOTS = 8
# Entry points a library of an older commit lacks, bound where present: A/B runs load one
# (scripts/gpu_run.sh, ab_runs); their callers say what they do without them.
_RECENT = ("symmem_ep_blocks", "symmem_ep_blocks_for")


def _load():
    lib = ctypes.CDLL(library_path())
    for name, (restype, argtypes) in _SIGNATURES.items():
        if name in _RECENT and not hasattr(lib, name):
            continue
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    for k in range(POOL_SLOTS):
        getattr(lib, f"symmem_pool_alloc_{k}").restype = c_void_p
        getattr(lib, f"symmem_pool_alloc_{k}").argtypes = [c_ssize_t, c_int, c_void_p]
    return lib


lib = _load()


def _load_fastcall():
    """symmem._fastcall from beside the library ctypes loaded, bound to that library; None where
    there is none (an older library, a build without it), where this interpreter cannot load a
    limited-API module (not CPython, before 3.10, free-threaded), or with SYMMEM_FASTCALL=0 (A/B
    runs against a library without it): ctypes then makes every call."""
    if (os.environ.get("SYMMEM_FASTCALL", "1") == "0" or sys.implementation.name != "cpython"
            or sys.version_info < (3, 10) or ".abi3.so" not in importlib.machinery.EXTENSION_SUFFIXES):
        return None
    path = os.path.join(os.path.dirname(os.path.realpath(library_path())), "_fastcall.abi3.so")
    if not os.path.exists(path):
        return None
    try:
        spec = importlib.util.spec_from_file_location("symmem._fastcall", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.bind(lib._handle)
        return module
    except Exception as e:  # noqa: BLE001 (import symmem must work: ctypes is the way without it)
        logging.getLogger("symmem").warning("symmem: %s does not load (%s); calls go through ctypes", path, e)
        return None


fastcall = _load_fastcall()


def per_call(name):
    """The function a binding calls for C ABI function symmem_<name> on every call:
    symmem._fastcall's where it loaded, else ctypes' (the same C function, the same codes)."""
    # (A _fastcall older than the package, without `name`, leaves that call to ctypes.)
    return getattr(fastcall, name, None) or getattr(lib, f"symmem_{name}")


def _names(name_of, first=0):
    """The names an enum's C ABI function gives, from `first` until it returns NULL."""
    names, value = [], first
    while True:
        name = name_of(value)
        if name is None:
            return names
        names.append(name.decode())
        value += 1


# symmem::ErrorCode, symmem::DataType, symmem::ReduceOp and the collectives as the library names and
# numbers them (a C ABI return code is 1 + an ErrorCode value): read from the C ABI, never copied by hand.
class _StrEnum(str, enum.Enum):  # enum.StrEnum before Python 3.11: a member is its name as a str
    def __str__(self):
        return self.value


ErrorCode = getattr(enum, "StrEnum", _StrEnum)("ErrorCode", [(n, n) for n in _names(lib.symmem_error_code_id, 1)],
                                               module=__name__)
ErrorCode.__doc__ = "symmem::ErrorCode: kInvalidArgument, kUnsupported, kTimeout, kMismatch, kAborted, ..."
ERROR_CODES = tuple(ErrorCode)
DTYPES = {name: value for value, name in enumerate(_names(lib.symmem_dtype_name))}
REDUCE_OPS = {name: value for value, name in enumerate(_names(lib.symmem_reduce_op_name))}
COLLECTIVES = {name: value for value, name in enumerate(_names(lib.symmem_collective_name))}  # as symmem_describe
MATRIX_LAYOUTS = {"row_major": 0, "column_major": 1}  # symmem::MatrixLayout: the fused ops' b_layout


def error(rc):
    """The SymmemError for a C ABI return code (call right after the failing call)."""
    code = ERROR_CODES[rc - 1] if 1 <= rc <= len(ERROR_CODES) else ErrorCode.kInternal
    return errors.SymmemError(code, lib.symmem_last_error().decode(errors="replace"))


def check(rc):
    if rc:
        raise error(rc)


def refusal_message(op, rank, code, cause):
    """The message every rank raises when rank `rank` refuses a call of `op` for `cause` (an
    ErrorCode, a str): the text symmem_refuse_call gives, for a binding that agrees on a refusal
    over a transport of its own."""
    text = ctypes.create_string_buffer(1024)
    check(lib.symmem_refusal_message(op.encode(), int(rank), ERROR_CODES.index(ErrorCode(code)),
                                     str(cause).encode(errors="replace"), text, len(text)))
    return text.value.decode(errors="replace")


def algo_code(name):
    """'auto', 'one_shot', 'copy_engine', ... as the C++ names them."""
    value = c_int()
    check(lib.symmem_parse_algo(name.encode(), ctypes.byref(value)))
    return value.value
