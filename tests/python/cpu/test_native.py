"""The package and its C ABI without torch and without a GPU."""
import ctypes
import os
import subprocess
import sys

import pytest

import symmem
from symmem import _native


def test_import_needs_no_torch():
    code = "import sys, symmem; assert 'torch' not in sys.modules, 'import symmem imported torch'; print('ok')"
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_library_exports_only_the_c_abi():
    assert symmem.library_version() == "0.1.0"
    assert _native.lib.symmem_comm_rank(None) == -1


def test_errors_carry_the_code_and_message():
    with pytest.raises(symmem.SymmemError) as info:
        _native.check(_native.lib.symmem_comm_check(None))
    assert info.value.code == "kInvalidArgument"
    assert "no communicator" in str(info.value)
    with pytest.raises(symmem.SymmemError, match="names no algorithm"):
        _native.algo_code("fastest")
    assert _native.algo_code("auto") == 0
    assert _native.algo_code("copy_engine") == 3


def test_bad_pool_slot_is_an_error_not_a_crash():
    with pytest.raises(symmem.SymmemError, match="slot 99"):
        _native.check(_native.lib.symmem_pool_bind(99, None))
    # An unbound slot fails the allocation (NULL), with the reason kept for the caller.
    assert _native.lib.symmem_pool_alloc_3(1 << 20, 0, None) is None
    assert b"no communicator" in _native.lib.symmem_last_error()


class _RecordingExchange(symmem.Exchange):
    def __init__(self):
        self.calls = 0

    def all_gather(self, mine):
        self.calls += 1
        return [mine]


def test_communicator_creation_fails_cleanly_without_a_gpu():
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU driver is present: creation would succeed (the GPU tests cover it)")
    with pytest.raises(symmem.SymmemError) as info:
        symmem.Communicator(0, 1, 0, _RecordingExchange())
    assert info.value.code in ("kCudaError", "kUnsupported")


def test_exchange_errors_reach_the_caller_as_the_cause():
    # The callback path alone: a failing exchange returns nonzero to C, and the Python exception
    # is kept for the SymmemError the C call raises.
    comm = symmem.Communicator.__new__(symmem.Communicator)
    comm._handle = None
    comm._exchange_error = None

    class Broken(symmem.Exchange):
        def all_gather(self, mine):
            raise TimeoutError("store unreachable")

    comm._exchange = Broken()
    buf = ctypes.create_string_buffer(8)
    assert comm._all_gather_callback(None, ctypes.addressof(buf), ctypes.addressof(buf), 8) == 1
    assert isinstance(comm._exchange_error, TimeoutError)

    comm._exchange = _RecordingExchange()
    assert comm._all_gather_callback(None, ctypes.addressof(buf), ctypes.addressof(buf), 8) == 0


def test_interrupts_in_exchange_callbacks_are_not_turned_into_errors():
    comm = symmem.Communicator.__new__(symmem.Communicator)
    comm._exchange_error = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        comm._call(5)
    comm._exchange_error = TimeoutError("store")
    with pytest.raises(symmem.SymmemError) as info:
        comm._call(5)
    assert isinstance(info.value.__cause__, TimeoutError)


def test_refusal_message_and_arguments_come_from_the_c_abi():
    message = _native.refusal_message("symmem.all_to_all_single", 2, "kInvalidArgument",
                                      "symmem.all_to_all_single: input_split_sizes has 3 entries for a group of 4")
    assert message.startswith("symmem.all_to_all_single: rank 2 refused the call: input_split_sizes has 3 entries")
    assert "every rank raises this error" in message
    # A refusal needs a communicator and an ErrorCode: wrong ones are errors, never a crash.
    assert _native.lib.symmem_refuse_call(None, b"op", 0, b"why", None) == 1 + _native.ERROR_CODES.index("kInvalidArgument")
    assert b"no communicator" in _native.lib.symmem_last_error()
    text = ctypes.create_string_buffer(64)
    assert _native.lib.symmem_refusal_message(b"op", 0, 99, b"why", text, len(text)) == 1
    assert b"not a symmem::ErrorCode" in _native.lib.symmem_last_error()


def test_collective_numbering_comes_from_the_c_abi():
    lib = _native.lib
    names = [lib.symmem_collective_name(v).decode() for v in range(len(_native.COLLECTIVES))]
    assert list(_native.COLLECTIVES) == names and list(_native.COLLECTIVES.values()) == list(range(len(names)))
    assert lib.symmem_collective_name(len(names)) is None and lib.symmem_collective_name(-1) is None
    assert {"all_gather", "all_reduce", "reduce_scatter", "all_to_all"} <= set(_native.COLLECTIVES)
