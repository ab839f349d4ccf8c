"""GPU tests of symmem.torch: one process per GPU under torchrun (tests/python/gpu/run.sh).
Every rank runs every test in the same order; NCCL (torch.distributed) is the reference, and
reduction_checks.py holds the reductions' oracles. Every test is bounded (tests/python/deadline.py:
240 s unless marked ``deadline(seconds)``): a rank past its bound dumps its stacks and exits, and
torchrun stops the others."""
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/python: deadline.py
import deadline  # noqa: E402

torch = pytest.importorskip("torch", reason="needs torch")
import torch.distributed as dist  # noqa: E402

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
# Inductor's FX graph cache keys a compiled graph on the group's name, not its size
# (docs/limitations.md): runs at several world sizes on one machine keep one cache each.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                      f"/tmp/torchinductor_symmem_tests_world{os.environ.get('WORLD_SIZE', '1')}")


def shared_gpu():
    """Every rank on GPU 0 (run.sh with SYMMEM_TEST_SHARED_GPU=1; NCCL is then a stand-in that moves
    data through the host, and the ranks' kernels take turns on the GPU)."""
    return os.environ.get("SYMMEM_TEST_SHARED_GPU") == "1"


def pytest_configure(config):
    if "RANK" not in os.environ:
        pytest.exit("symmem GPU tests run under torchrun: tests/python/gpu/run.sh", returncode=4)
    config.pluginmanager.register(deadline.Deadlines(dump_on_sigterm=True), "symmem-deadlines")
    config.addinivalue_line("markers", "own_job: runs in run.sh's second torchrun job, apart from the "
                                       "others (torch's symmetric-memory backend is chosen once per process, "
                                       "before its first use)")


def pytest_sessionfinish(session, exitstatus):
    """run.sh's second job selects only the own_job tests: none selected (a -k that excludes
    them) is not a failure there."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and os.environ.get("SYMMEM_TESTS_NONE_SELECTED_OK") == "1":
        session.exitstatus = pytest.ExitCode.OK


@pytest.fixture(scope="session")
def group():
    if not dist.is_initialized():
        # Simulated nodes (tests/python/gpu/run.sh with SYMMEM_NODE_SIZE): each group of ranks
        # gets its own NCCL host id before NCCL starts, so NCCL too moves data between them over
        # its network transport, as symmem-run --simulate-nodes does.
        node_size = int(os.environ.get("SYMMEM_NODE_SIZE", "0") or 0)
        if node_size > 0:
            os.environ["NCCL_HOSTID"] = f"symmem-simulated-node-{int(os.environ['RANK']) // node_size}"
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        local = 0 if shared_gpu() else int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        # A bounded NCCL: collectives that differ across ranks (a test's bug) raise after 5 minutes
        # instead of hanging the job (NCCL checks no counts; torch's default waits 10 minutes).
        dist.init_process_group("nccl", device_id=torch.device("cuda", local), timeout=timedelta(minutes=5))
    import symmem.torch  # noqa: F401
    return dist.group.WORLD


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_killed_rank_job(group, worker, tmp_path, extra_args=()):
    """Runs `worker` (RANK PORT RESULT_FILE) as a job of its own, two fresh processes on GPUs 0 and
    1 (torchrun would stop our ranks as soon as one of them died): rank 1 kills itself, rank 0
    must raise a SymmemError naming it, in bounded time. Rank 0 of the test runs it; the others
    wait. Skipped, on every rank alike, on a machine with fewer than two GPUs."""
    if shared_gpu():
        pytest.skip("a killed-rank job runs its two processes on GPUs of their own, with NCCL: not in the "
                    "shared-GPU mode (SYMMEM_TEST_SHARED_GPU)")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"a killed-rank job needs two GPUs (one per process); this machine has "
                    f"{torch.cuda.device_count()}")
    try:  # every rank meets at the barrier, also when rank 0's checks fail (else the next test's
        # collectives would pair with this barrier)
        if dist.get_rank() == 0:
            env = dict(os.environ, SYMMEM_TIMEOUT_MS="3000", NCCL_NVLS_ENABLE="0")
            # torchrun's variables would make the workers' rendezvous join torchrun's store
            # (TORCHELASTIC_USE_AGENT_STORE) instead of hosting their own.
            for k in list(env):
                if k.startswith("TORCHELASTIC_") or k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                          "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK",
                                                          "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_NAME"):
                    env.pop(k)
            port, result = _free_port(), tmp_path / "survivor.txt"
            logs = [open(tmp_path / f"rank{r}.log", "w") for r in range(2)]
            start = time.monotonic()
            procs = [subprocess.Popen([sys.executable, worker, str(r), str(port), str(result), *extra_args], env=env,
                                      stdout=logs[r], stderr=subprocess.STDOUT) for r in range(2)]
            try:
                procs[0].wait(timeout=100)
            except subprocess.TimeoutExpired:
                pass
            elapsed = time.monotonic() - start
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            output = "".join(f"--- rank {r}:\n" + (tmp_path / f"rank{r}.log").read_text()[-3000:] for r in range(2))
            print(output)
            assert procs[0].returncode == 0, f"the survivor did not finish:\n{output}"
            assert procs[1].returncode == -signal.SIGKILL, output
            assert result.exists(), f"the survivor wrote no result:\n{output}"
            code, message = result.read_text().split("\n", 1)
            assert code in ("kTimeout", "kAborted"), (code, message)
            assert "rank 1" in message, message
            assert elapsed < 90, f"the survivor took {elapsed:.0f} s to raise"
            print(f"survivor raised {code} after {elapsed:.1f} s: {message[:300]}")
    finally:
        dist.barrier()
