"""symmem.triton compiled to sm_90 PTX without a GPU, and checked: every cross-GPU flag access at
system scope with acquire/release semantics, every polling loop reading the deadline (and the
abort word when it polls a flag), no trap, and the PTX instructions the same as the CUDA device
API's. A kernel with an unbounded spin is caught by the same check (it can fail)."""
import os
import pathlib
import re

import pytest

triton = pytest.importorskip("triton", reason="symmem.triton needs Triton (pip install triton==3.6.0)")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("PTX is compiled only without TRITON_INTERPRET", allow_module_level=True)

import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import symmem.triton as smt  # noqa: E402
from ptx_cfg import polling_loop_problems, reaches_without  # noqa: E402
from symmem.triton import ptx as ptx_module  # noqa: E402
from symmem.triton.examples.all_gather import all_gather_kernel  # noqa: E402
from symmem.triton.examples.all_gather_matmul import all_gather_matmul_kernel  # noqa: E402
from symmem.triton.examples.one_shot_all_reduce import one_shot_all_reduce_kernel  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]
ALIGNED = [["tt.divisibility", 16]]


TMA_LOAD = r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global"
FUSED_SIGNATURE = {"a_desc": "tensordesc<fp16[128, 64]>", "b_desc": "tensordesc<fp16[64, 256]>",
                   "c_desc": "tensordesc<fp16[128, 128]>", "flags": "*i32", "M": "i32", "N": "i32", "K": "i32",
                   "shard_rows": "i32", "piece_rows": "i32", "pieces": "i32", "sync": "*i64", "signature": "i32",
                   "rank": "i32", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "GROUP_M": "constexpr",
                   "STAGES": "constexpr", "EPILOGUE_SUBTILE": "constexpr"}


def compile_ptx(fn, signature, constexprs, aligned=(), num_warps=4):
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs={(i,): ALIGNED for i in aligned})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["ptx"]


@triton.jit
def every_helper(sync, signature, rank, data, pad, n, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    epoch = smt.epoch_begin(sync)
    stride = smt.heap_stride(sync)
    ok = smt.barrier(sync, signature, epoch, 0, rank, WORLD)
    if ok:
        peer = (rank + 1) % WORLD
        smt.put_signal(smt.peer(data, peer, rank, stride), data, n, smt.peer(pad, peer, rank, stride), epoch, BLOCK)
        smt.signal_add(smt.peer(pad + 1, peer, rank, stride), 1)
        ok = smt.wait_signal(sync, signature, pad, epoch, smt.AT_LEAST, (rank + WORLD - 1) % WORLD, 1)
    if ok:
        ok = smt.barrier(sync, signature, epoch, 3, rank, WORLD)
    smt.epoch_commit(sync, epoch)


@triton.jit
def unbounded_spin(flag, out):
    """What the check must reject: a poll with no deadline and no abort word."""
    lanes = smt.thread_lanes()
    waiting = tl.full([], 1, tl.int1)
    while waiting:
        waiting = tl.max(smt.ld_acquire_sys(flag + lanes * 0, lanes >= 0), axis=0) == 0
    tl.store(out, 1)


HELPER_SIGNATURE = {"sync": "*i64", "signature": "i32", "rank": "i32", "data": "*fp32", "pad": "*u32", "n": "i32",
                    "WORLD": "constexpr", "BLOCK": "constexpr"}
EXAMPLE_SIGNATURE = {"inp": "*bf16", "out": "*bf16", "n": "i32", "heap_stride": "i64", "sync": "*i64",
                     "signature": "i32", "rank": "i32", "WORLD": "constexpr", "BLOCK": "constexpr"}

GATHER_SIGNATURE = {"inp": "*bf16", "out": "*bf16", "n": "i32", "heap_stride": "i64", "table": "*i64", "sync": "*i64",
                    "signature": "i32", "rank": "i32", "WORLD": "constexpr", "BLOCK": "constexpr", "PUSH": "constexpr",
                    "TABLE": "constexpr"}


def kernels():
    """(name, PTX) of the helpers and of every example, at worlds 2 and 8."""
    out = []
    for world in (2, 8):
        out.append((f"every_helper_w{world}", compile_ptx(every_helper, HELPER_SIGNATURE,
                                                          {"WORLD": world, "BLOCK": 256})))
        out.append((f"one_shot_all_reduce_w{world}", compile_ptx(
            one_shot_all_reduce_kernel, {**EXAMPLE_SIGNATURE, "ACC": "constexpr"},
            {"WORLD": world, "BLOCK": 4096, "ACC": tl.float32}, aligned=(0, 1, 2, 3, 4), num_warps=16)))
        for push in (False, True):
            for table in (False, True):
                out.append((f"all_gather_{'push' if push else 'pull'}{'_table' if table else ''}_w{world}",
                            compile_ptx(all_gather_kernel, GATHER_SIGNATURE,
                                        {"WORLD": world, "BLOCK": 4096, "PUSH": push, "TABLE": table},
                                        aligned=(0, 1, 2, 3, 4, 5), num_warps=16)))
    for stages in (3, 4):
        out.append((f"all_gather_matmul_stages{stages}", compile_ptx(
            all_gather_matmul_kernel, FUSED_SIGNATURE,
            {"BM": 128, "BN": 256, "BK": 64, "GROUP_M": 8, "STAGES": stages, "EPILOGUE_SUBTILE": True},
            aligned=(4, 5, 6, 7, 10), num_warps=8)))
    return out


KERNELS = kernels()
FUSED = [k for k in KERNELS if k[0].startswith("all_gather_matmul")]


@pytest.mark.parametrize("name, ptx", KERNELS, ids=[k[0] for k in KERNELS])
def test_every_polling_loop_has_a_deadline_and_polls_the_abort_word(name, ptx):
    assert polling_loop_problems(ptx) == []


def test_the_loop_check_rejects_an_unbounded_spin():
    ptx = compile_ptx(unbounded_spin, {"flag": "*u32", "out": "*i32"}, {})
    assert any("never reads %globaltimer" in p for p in polling_loop_problems(ptx))


@pytest.mark.parametrize("name, ptx", KERNELS, ids=[k[0] for k in KERNELS])
def test_cross_gpu_flags_are_acquired_and_released_at_system_scope(name, ptx):
    accesses = re.findall(r"\b(?:ld|st|atom|red)\.[a-z0-9_.:]+", ptx)
    acquires = [a for a in accesses if ".acquire" in a]
    releases = [a for a in accesses if ".release" in a]
    assert acquires and all(".sys" in a for a in acquires), acquires
    assert all(".sys" in a for a in releases), releases
    assert releases or name.startswith("all_gather_matmul"), "no flag is released"  # (it only waits)
    # The one narrower access: the failure claim, a word of this rank's own device memory.
    narrower = {a for a in accesses if re.search(r"\.(gpu|cta)\b", a)}
    assert narrower <= {"atom.global.relaxed.gpu.cas.b32"}, narrower
    # Flags are never polled by read-modify-writes (a copy engine's write to a flag is no atomic).
    assert not [a for a in accesses if a.startswith("atom") and ".acquire" in a]


@pytest.mark.parametrize("name, ptx", KERNELS, ids=[k[0] for k in KERNELS])
def test_host_words_are_read_by_one_thread(name, ptx):
    # The abort word and the failure record live in host memory: a wait's check read by every thread
    # put a PCIe read per thread on the bus, and 64 waiting programs of 512 threads then took
    # milliseconds per call. Every such read is predicated (lane 0 alone).
    reads = re.findall(r"(@!?%?\w+\s+)?ld\.volatile\.global[.\w]*\s+[^;]*;", ptx)
    assert reads, "no host word is read"
    assert all(predicate for predicate in reads), "a host word is read by every thread"
    # The predicate is lane 0's: the one predicated host read is _host_word's, and it passes lanes == 0.
    sync_source = (ROOT / "python/symmem/triton/sync.py").read_text()
    assert sync_source.count("ld_volatile_u32_on(") == 1, "ld_volatile_u32_on is called outside _host_word"
    assert "return ld_volatile_u32_on(p + lanes * 0, lanes == 0)" in sync_source


@pytest.mark.parametrize("name, ptx", KERNELS, ids=[k[0] for k in KERNELS])
def test_no_trap(name, ptx):
    assert not re.search(r"\btrap\b|\bbrkpt\b", ptx)


@pytest.mark.parametrize("name, ptx", KERNELS, ids=[k[0] for k in KERNELS])
def test_data_after_a_barrier_is_read_after_a_cta_barrier(name, ptx):
    # What one thread acquired is visible to the others only after bar.sync: no path from a flag
    # acquire reaches a data load without one (ld.global that is not a flag, param or host word).
    data_load = r"\bld\.global\.(?!acquire|volatile)(?:v\d\.)?[bfsu]\d+"
    assert reaches_without(ptx, r"ld\.acquire\.sys", data_load, r"\bbar\.sync\b") == []


def instructions(text):
    return set(re.findall(r"(?:ld|st|red)\.(?:acquire|release|volatile)[a-z0-9.]*|fence\.[a-z_.]+|%globaltimer",
                          text))


def test_triton_ptx_mirrors_the_cuda_device_api():
    # One set of instructions behind every flag: symmem.triton's assembly, the public CUDA header's,
    # which the library's own kernels re-export (src/device/ptx.cuh).
    triton_side = instructions(pathlib.Path(ptx_module.__file__).read_text())
    cuda_side = instructions((ROOT / "include/symmem/device_ptx.cuh").read_text())
    assert triton_side and triton_side <= cuda_side, triton_side - cuda_side
    assert '#include "symmem/device_ptx.cuh"' in (ROOT / "src/device/ptx.cuh").read_text()
    assert not instructions((ROOT / "src/device/ptx.cuh").read_text()) & cuda_side, "defined twice"
