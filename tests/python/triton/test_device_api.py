"""The host side of the device API without a GPU: the C ABI's structs and signatures as
python/symmem/device.py declares them, and the sync-context layout symmem.triton reads."""
import ctypes

import pytest

import symmem
from symmem import _native, device


def test_structs_match_the_c_abi():
    # The same sizes are static_asserts of src/capi/c_api_device.cpp.
    assert ctypes.sizeof(device._DeviceHandle) == 192
    assert ctypes.sizeof(device._SyncContext) == 152
    assert ctypes.sizeof(device._GatheredPieces) == 40


def test_user_call_signatures_are_deterministic_and_tell_calls_apart():
    a = device.user_call_signature("triton:one_shot_all_reduce(4096, bfloat16)", 8)
    assert a == device.user_call_signature("triton:one_shot_all_reduce(4096, bfloat16)", 8)
    assert a != 0
    others = {device.user_call_signature("triton:one_shot_all_reduce(4097, bfloat16)", 8),
              device.user_call_signature("triton:one_shot_all_reduce(4096, float16)", 8),
              device.user_call_signature("triton:one_shot_all_reduce(4096, bfloat16)", 9)}
    assert a not in others and len(others) == 3


def test_device_api_entry_points_refuse_a_missing_communicator():
    out = device._SyncContext(struct_size=ctypes.sizeof(device._SyncContext))
    rc = _native.lib.symmem_comm_sync_context(None, ctypes.byref(out))
    with pytest.raises(symmem.SymmemError, match="no communicator"):
        _native.check(rc)
    signature = ctypes.c_uint32()
    rc = _native.lib.symmem_comm_begin_user_call(None, b"triton:x()", 1, None, ctypes.byref(signature))
    assert _native.ERROR_CODES[rc - 1] == "kInvalidArgument"
    assert _native.lib.symmem_comm_local_rank(None) == -1
    assert _native.lib.symmem_comm_local_world(None) == -1


def test_sync_words_follow_the_heap_stride():
    ctx = device.SyncContext(flags=0x7000_0000_0000 + 2 * 0x1000_0000, peer_flags=(0x7000_0000_0000,
                             0x7000_1000_0000, 0x7000_2000_0000, 0x7000_3000_0000), epochs=0x7100, failure_claim=0x7200,
                             failure=0x7300, abort_word=0x7400, timeout_ns=5 * 10**9, heap_stride=0x1000_0000, rank=2,
                             world=4, phases=4, max_blocks=160, user_op=16)
    words = device.sync_words(ctx)
    assert len(words) == device.SYNC_WORDS and words[0] == device.SYNC_MAGIC
    assert words[device.SYNC_FLAGS] == ctx.flags and words[device.SYNC_HEAP_STRIDE] == ctx.heap_stride
    assert words[device.SYNC_RANK] == 2 and words[device.SYNC_WORLD] == 4 and words[device.SYNC_USER_OP] == 16
    bent = device.SyncContext(**{**ctx.__dict__, "peer_flags": (0x7000_0000_0000, 0x7000_1000_0000, ctx.flags,
                                                                0x7000_4000_0000)})
    with pytest.raises(AssertionError, match="rank 3"):
        device.sync_words(bent)


def test_import_symmem_triton_needs_no_gpu_and_no_torch():
    import os
    import subprocess
    import sys
    pytest.importorskip("triton")
    code = ("import sys, symmem.triton as smt; assert 'torch' not in sys.modules, 'imported torch'; "
            "assert callable(smt.launch) and smt.barrier is not None; print('ok')")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_examples_ops_are_tagged_pt2_compliant():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    import symmem.triton.examples  # noqa: F401  registers torch.ops.symmem_triton.*
    import symmem.triton.examples.all_gather_matmul  # noqa: F401
    for name in ("one_shot_all_reduce", "all_gather", "all_gather_into", "all_gather_matmul"):
        assert torch.Tag.pt2_compliant_tag in getattr(torch.ops.symmem_triton, name).default.tags, name


def test_user_calls_end_through_the_c_abi():
    # symmem_comm_end_user_call exists and refuses a missing communicator (symmem.triton.launch calls
    # it after every launch: the call's end, as a library call records it after its last enqueue).
    rc = _native.lib.symmem_comm_end_user_call(None, None)
    assert _native.ERROR_CODES[rc - 1] == "kInvalidArgument"
