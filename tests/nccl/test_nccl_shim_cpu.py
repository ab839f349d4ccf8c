"""libsymmem_nccl.so on a machine without a GPU: its exports against nccl.h, and forwarding to the
real libnccl.so.2 both preloaded in front of it and loaded by path instead of it.

ctest runs it (tests/CMakeLists.txt) with SYMMEM_NCCL_SHIM (the library), SYMMEM_NCCL_PROBE
(tests/nccl/shim_probe.cpp, built against libnccl.so.2), NCCL_HEADER (the nccl.h it was built against)
and NCCL_REAL (the real libnccl.so.2) in the environment. Every check runs in a fresh process, so
that no NCCL is loaded before the one the check is about.
"""
import ctypes
import os
import re
import subprocess
import sys
import tempfile

import pytest

SHIM = os.environ.get("SYMMEM_NCCL_SHIM", "")
PROBE = os.environ.get("SYMMEM_NCCL_PROBE", "")
HEADER = os.environ.get("NCCL_HEADER", "")
REAL = os.environ.get("NCCL_REAL", "")

pytestmark = pytest.mark.skipif(not (SHIM and PROBE and HEADER and REAL),
                                reason="run by ctest, which names the shim, the probe, nccl.h and libnccl.so.2")


def header_functions(path):
    """Every function nccl.h declares (its pncclX twins included), read from the header itself."""
    text = open(path).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    names = re.findall(r"(?:ncclResult_t|const\s+char\s*\*|\bvoid)\s+(p?nccl[A-Za-z0-9_]+)\s*\(", text)
    return sorted(set(names))


def run(code, env=None):
    """Runs `code` in a fresh Python; returns its stdout (fails the test on a non-zero exit)."""
    full_env = dict(os.environ)
    full_env.pop("LD_PRELOAD", None)
    full_env.update(env or {})
    done = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


def real_version():
    v = ctypes.c_int()
    assert ctypes.CDLL(REAL).ncclGetVersion(ctypes.byref(v)) == 0
    return v.value


def test_header_parses_to_the_known_api():
    names = header_functions(HEADER)
    for name in ("ncclAllReduce", "pncclAllReduce", "ncclGetErrorString", "ncclResetDebugInit",
                 "ncclCommWindowRegister", "ncclGroupSimulateEnd", "ncclCommInitRankConfig"):
        assert name in names, name
    assert len([n for n in names if n.startswith("nccl")]) >= 40


def test_every_function_of_nccl_h_is_exported():
    names = header_functions(HEADER)
    # Resolved in a fresh process, the shim loaded by path alone; each twin is its function's alias.
    code = f"""
import ctypes
lib = ctypes.CDLL({SHIM!r}, mode=ctypes.RTLD_LOCAL)
missing = [n for n in {names!r} if not hasattr(lib, n)]
assert not missing, "not exported: " + ", ".join(missing)
def address(name): return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
twins = [n for n in {names!r} if n.startswith("p") and address(n) != address(n[1:])]
assert not twins, "not aliases of their functions: " + ", ".join(twins)
print(len({names!r}))
"""
    assert int(run(code)) == len(names)


def test_nothing_else_is_exported():
    # The dynamic symbol table, read from the ELF file itself: nccl.h's names and the shim's
    # identity, nothing of symmem, CUDA or the C++ runtime.
    done = subprocess.run(["nm", "-D", "--defined-only", SHIM], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("nm is not available")
    exported = {line.split()[-1] for line in done.stdout.splitlines() if line.strip()}
    exported = {n.split("@")[0] for n in exported}
    allowed = set(header_functions(HEADER)) | {"symmem_nccl_shim_identity"}
    assert exported <= allowed, sorted(exported - allowed)


def test_preloaded_in_front_of_the_real_library_it_forwards():
    env = dict(os.environ, LD_PRELOAD=SHIM, LD_LIBRARY_PATH=os.path.dirname(REAL))
    env.pop("SYMMEM_NCCL_LIBRARY", None)
    done = subprocess.run([PROBE, "preload"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "forwarded to the real NCCL" in done.stdout


@pytest.mark.parametrize("named", [True, False], ids=["SYMMEM_NCCL_LIBRARY", "search_path"])
def test_loaded_by_path_instead_of_the_real_library_it_forwards(named):
    # vLLM's PyNccl and SGLang load the library by path with ctypes; no libnccl.so.2 is loaded
    # before. The shim opens the real one itself and answers with its version and unique ids.
    env = {"SYMMEM_NCCL_LIBRARY": REAL} if named else {"LD_LIBRARY_PATH": os.path.dirname(REAL)}
    if not named:
        env["SYMMEM_NCCL_LIBRARY"] = ""
    code = f"""
import ctypes
maps = lambda: open("/proc/self/maps").read()
assert "libnccl.so" not in maps(), "a libnccl was loaded before the shim"
lib = ctypes.CDLL({SHIM!r}, mode=ctypes.RTLD_LOCAL)
v = ctypes.c_int()
assert lib.ncclGetVersion(ctypes.byref(v)) == 0, ctypes.string_at(lib.ncclGetLastError(None))
lib.ncclGetErrorString.restype = ctypes.c_char_p
assert lib.ncclGetErrorString(6) == b"remote process exited or there was a network error", lib.ncclGetErrorString(6)
uid = (ctypes.c_char * 128)()
assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
assert any(uid.raw), "an empty unique id"
assert "libnccl.so" in maps(), "the shim did not load the real NCCL"
print(v.value)
"""
    assert int(run(code, env)) == real_version()


def test_installed_under_nccls_name_it_never_forwards_to_itself():
    # The shim answering to libnccl.so.2 (a symlink ahead of the real one on the search path) with
    # no real NCCL named: it refuses with a message instead of calling itself; naming the real one
    # (SYMMEM_NCCL_LIBRARY) makes it work.
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(SHIM, os.path.join(tmp, "libnccl.so.2"))
        env = dict(os.environ, LD_LIBRARY_PATH=tmp)
        env.pop("LD_PRELOAD", None)
        env.pop("SYMMEM_NCCL_LIBRARY", None)
        done = subprocess.run([PROBE, "refused"], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "itself" in done.stdout
        env["SYMMEM_NCCL_LIBRARY"] = REAL
        done = subprocess.run([PROBE, "works"], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert int(done.stdout) == real_version()


def test_pure_forwarding_mode_answers_as_the_real_library():
    # SYMMEM_NCCL=off must leave every call to NCCL (the A/B baseline of one binary): the same
    # answers as the real library.
    env = dict(os.environ, LD_PRELOAD=SHIM, LD_LIBRARY_PATH=os.path.dirname(REAL), SYMMEM_NCCL="off")
    env.pop("SYMMEM_NCCL_LIBRARY", None)
    done = subprocess.run([PROBE, "preload"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_setting_it_cannot_read_never_keeps_the_real_init_from_running():
    # A rank whose shim fails before the real ncclCommInitRank would leave its peers waiting inside
    # NCCL. With SYMMEM_NCCL it does not understand, the shim warns and forwards: the init answers
    # exactly as with SYMMEM_NCCL=off (here, without a GPU, the real library's own error).
    code = f"""
import ctypes
lib = ctypes.CDLL({SHIM!r}, mode=ctypes.RTLD_LOCAL)
lib.ncclGetLastError.restype = ctypes.c_char_p
uid = (ctypes.c_char * 128)()
assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
comm = ctypes.c_void_p()
rc = lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)
print(rc, (lib.ncclGetLastError(None) or b"").decode(errors="replace").replace(chr(10), " "))
"""
    outcome = {}
    for mode in ("off", "bogus"):
        env = {"SYMMEM_NCCL_LIBRARY": REAL, "SYMMEM_NCCL": mode}
        full_env = dict(os.environ, **env)
        full_env.pop("LD_PRELOAD", None)
        done = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        outcome[mode] = (done.stdout.split(" ", 1)[0], done.stdout, done.stderr)
    assert "symmem" not in outcome["bogus"][1], outcome["bogus"]  # the real library's answer, not the shim's
    assert outcome["bogus"][0] == outcome["off"][0], outcome
    assert "none of auto, all, off" in outcome["bogus"][2], outcome["bogus"]  # said once, as a warning
