"""CPU tests of the Python package: a gloo process group of one rank, so that the ops' CPU kernels
(torch.distributed on the group) run and opcheck can compare them with the fake kernels."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="symmem.torch tests need torch (pip install torch==2.11.0)")
import torch.distributed as dist  # noqa: E402


@pytest.fixture(scope="session")
def group_name():
    if not dist.is_initialized():
        path = os.path.join(tempfile.mkdtemp(prefix="symmem-test-"), "store")
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    import symmem.torch  # noqa: F401  registers the ops
    return dist.group.WORLD.group_name
