"""GPU tests of symmem.torch: one process per GPU under torchrun (tests/python/gpu/run.sh).
Every rank runs every test in the same order; NCCL (torch.distributed) is the reference."""
import os

import pytest

torch = pytest.importorskip("torch", reason="needs torch")
import torch.distributed as dist  # noqa: E402

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def pytest_configure(config):
    if "RANK" not in os.environ:
        pytest.exit("symmem GPU tests run under torchrun: tests/python/gpu/run.sh", returncode=4)


@pytest.fixture(scope="session")
def group():
    if not dist.is_initialized():
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    import symmem.torch  # noqa: F401
    return dist.group.WORLD
