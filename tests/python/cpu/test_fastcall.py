"""symmem._fastcall, the per-call collectives without ctypes: it passes the C ABI exactly what ctypes
passes for the same Python values (checked against a stand-in library that records its arguments),
and the package uses it wherever the build made it."""
import ctypes
import importlib.util
import os
import shutil

import pytest

from symmem import _native, communicator, ep

# Arguments at the edges of each C type: pointers past 2**63 and NULL, a size_t past 2**32, ints
# at both ends and -1 (max_blocks' "no cap").
POINTER, NULL, SIZE = 0xFFFF_FFFF_FFFF_F000, None, 2**40 + 3
CALLS = {
    "all_reduce": (11, [POINTER, 0x7F00_0000_1000, NULL, SIZE, 2, 3, 0x5555_5555_0000, 2**31 - 1, -2**31, -1]),
    "reduce_scatter": (12, [0x1000, NULL, POINTER, 1, 0, 1, NULL, 4, 7, -1]),
    "all_gather": (13, [POINTER, 0x2000, 0x3000, SIZE, 5, 0x4000, -7, 0, 2**31 - 1]),
    "all_to_all": (14, [0x1000, POINTER, 0x2000, SIZE, POINTER, 3, -1, 64]),
    "ep_dispatch": (15, [POINTER, 0x1000, NULL, 0x2000, 1, 0x3000, 2**31 - 1, NULL, 0x4000]),
    "ep_combine": (16, [0x1000, POINTER, 0x2000, 0, NULL, POINTER]),
    "all_to_all_v": (18, [0x1000, POINTER, SIZE, 0x2000, 7, 0x3000, POINTER, 4096, NULL, 1, 2, -1]),
    "all_to_all_vdev": (17, [0x1000, POINTER, SIZE, 0x2000, 7, 0x3000, POINTER, 4096, 8, -2**63, NULL, 1, 2, -1]),
}


def _recording():
    path = os.environ.get("SYMMEM_RECORDING_CAPI")
    if not path:
        pytest.skip("SYMMEM_RECORDING_CAPI is unset: run through ctest (the build makes the stand-in library)")
    return ctypes.CDLL(path)


def _private_fastcall(tmp_path, library):
    """A copy of the package's _fastcall bound to `library` (a copy: the package's own stays bound)."""
    source = os.path.join(os.path.dirname(os.path.realpath(_native.library_path())), "_fastcall.abi3.so")
    copy = tmp_path / "_fastcall.abi3.so"
    shutil.copy(source, copy)
    spec = importlib.util.spec_from_file_location("recording._fastcall", copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.bind(library._handle)
    return module


def _received(library):
    count = ctypes.c_int.in_dll(library, "recorded_count").value
    return list((ctypes.c_uint64 * 16).in_dll(library, "recorded_args")[:count])


def test_the_package_calls_through_fastcall_where_the_build_made_it():
    if not os.environ.get("SYMMEM_FASTCALL_BUILT"):
        pytest.skip("this build has no symmem._fastcall (no Python headers): ctypes makes every call")
    assert _native.fastcall is not None, "the build made _fastcall.abi3.so but the package did not load it"
    for name in CALLS:
        module = ep if name.startswith("ep_") else communicator
        assert getattr(module, f"_{name}") is getattr(_native.fastcall, name)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_fastcall_passes_what_ctypes_passes(name, tmp_path):
    library = _recording()
    fast = _private_fastcall(tmp_path, library)
    code, args = CALLS[name]
    through_ctypes = getattr(library, f"symmem_{name}")
    through_ctypes.restype, through_ctypes.argtypes = _native._SIGNATURES[f"symmem_{name}"]
    assert through_ctypes(*args) == code
    expected = _received(library)
    assert len(expected) == len(args)
    assert getattr(fast, name)(*args) == code
    assert _received(library) == expected


class _Index:
    """An integer-like object (numpy's ints are such)."""

    def __init__(self, value):
        self.value, self.read = value, 0

    def __index__(self):
        self.read += 1
        return self.value


def test_fastcall_takes_integer_like_objects_where_ctypes_does(tmp_path):
    """As ctypes: sizes and ints may be integer-like; addresses must be ints (or None)."""
    library = _recording()
    fast = _private_fastcall(tmp_path, library)
    through_ctypes = library.symmem_all_to_all
    through_ctypes.restype, through_ctypes.argtypes = _native._SIGNATURES["symmem_all_to_all"]
    args = (0x1000, 0x2000, None, _Index(SIZE), 0, _Index(-1), 3, _Index(4))
    assert through_ctypes(*args) == fast.all_to_all(*args) == 14
    assert _received(library) == [0x1000, 0x2000, 0, SIZE, 0, 2**64 - 1, 3, 4]
    with pytest.raises(ctypes.ArgumentError):
        through_ctypes(_Index(0x1000), 0, 0, 0, 0, 0, 0, 0)
    with pytest.raises(TypeError, match="an address must be an int"):
        fast.all_to_all(_Index(0x1000), 0, 0, 0, 0, 0, 0, 0)


def test_fastcall_refuses_what_it_cannot_pass(tmp_path):
    library = _recording()
    fast = _private_fastcall(tmp_path, library)
    with pytest.raises(TypeError, match="takes 10 arguments"):
        fast.all_reduce(0, 0, 0, 0, 0, 0, 0, 0, 0)
    with pytest.raises(OverflowError):  # a negative count (ctypes would wrap it)
        fast.all_gather(0, 0, 0, -1, 0, 0, 0, 0, 0)
    # The first argument it cannot take ends the call: no later conversion runs, nothing is called.
    later = _Index(2)
    with pytest.raises(TypeError):
        fast.all_to_all(0, "not a pointer", 0, 0, 0, later, 0, 0)
    assert later.read == 0
    ctypes.c_int.in_dll(library, "recorded_count").value = 0
    with pytest.raises(TypeError):
        fast.all_reduce(0, 0, 0, 0, later, 0, 0, 0, 0, 1.5)
    assert _received(library) == [], "the C function ran after a refused argument"


def test_the_library_reports_errors_through_fastcall_as_through_ctypes():
    if _native.fastcall is None:
        pytest.skip("this build has no symmem._fastcall")
    for name, (_, args) in CALLS.items():
        args = [None] + [0] * (len(args) - 1)  # no communicator, no EP context
        rc = getattr(_native.fastcall, name)(*args)
        fast_message = _native.lib.symmem_last_error()
        assert rc == getattr(_native.lib, f"symmem_{name}")(*args) != 0
        assert fast_message == _native.lib.symmem_last_error()
        assert (b"no EP context" if name.startswith("ep_") else b"no communicator") in fast_message


def test_all_to_all_v_passes_its_splits_as_int64_arrays(monkeypatch):
    # The splits travel by address (array.array's buffer, alive for the call): what the C ABI reads
    # there must be the caller's values, in order, as int64.
    seen = {}

    def stand_in(handle, out, out_rows, inp, in_rows, in_address, out_address, row_bytes, stream, algo, blocks,
                 max_blocks):
        seen["in"] = list((ctypes.c_int64 * 3).from_address(in_address))
        seen["out"] = list((ctypes.c_int64 * 3).from_address(out_address))
        seen["rest"] = (handle, out, out_rows, inp, in_rows, row_bytes, stream, algo, blocks, max_blocks)
        return 0

    monkeypatch.setattr(communicator, "_all_to_all_v", stand_in)
    comm = object.__new__(communicator.Communicator)
    comm._handle = 0x1234
    monkeypatch.setattr(communicator.Communicator, "world", property(lambda self: 3))
    comm.all_to_all_v(0x1000, 9, 0x2000, 6, [1, 2**40, 3], (4, 0, 5), 16, 0x99, 1, 2, -1)
    assert seen["in"] == [1, 2**40, 3] and seen["out"] == [4, 0, 5]
    assert seen["rest"] == (0x1234, 0x1000, 9, 0x2000, 6, 16, 0x99, 1, 2, -1)


def test_all_to_all_v_refuses_a_split_outside_int64_on_every_rank(monkeypatch):
    # Refused through the agreed refusal (every rank raises), never an OverflowError on this rank
    # alone while its peers wait in the call for it.
    refused = []

    def refuse(self, op, code, message, stream):
        refused.append((op, code, stream))
        return RuntimeError(message)

    monkeypatch.setattr(communicator, "_all_to_all_v", lambda *a: pytest.fail("the call was made"))
    monkeypatch.setattr(communicator.Communicator, "refuse", refuse)
    monkeypatch.setattr(communicator.Communicator, "world", property(lambda self: 2))
    comm = object.__new__(communicator.Communicator)
    comm._handle = 0x1234
    with pytest.raises(RuntimeError, match="outside int64"):
        comm.all_to_all_v(0x1000, 4, 0x2000, 4, [2**63, 0], [1, 1], 16, 0x99)
    assert refused == [("all_to_all_v", _native.ErrorCode.kInvalidArgument, 0x99)]
