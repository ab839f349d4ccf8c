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


@pytest.fixture
def fake_group(monkeypatch):
    """fake_group(name, world, core, stream=None, nodes=1): a symmem.torch GroupCommunicator of `world`
    ranks whose core is `core` (a recording stand-in for the C ABI), served for the group name
    `name` by every entry point; the CUDA kernels see `stream` as the current stream."""
    import types
    import weakref

    from symmem.torch import _route, groups

    def make(name, world, core, stream=None, nodes=1, rank=0):
        comm = object.__new__(groups.GroupCommunicator)
        comm.__dict__.update(device=-1, torch_device=torch.device("cpu"), group_name=name, key=name, purpose=None,
                             world=world, rank=rank, nodes=nodes, core=core, closed=False, workspaces={},
                             lenders={}, pool_slot=None, pool=None, final_failure=None,
                             _spans=weakref.WeakSet())
        state = types.SimpleNamespace(name=name, communicators={None: comm}, closed=False,
                                      communicator=lambda purpose=None: comm, unavailable_reason=lambda: None)
        comm.state = state
        real = groups.state_of
        monkeypatch.setattr(groups, "state_of", lambda group=None: state if group == name else real(group))
        monkeypatch.setattr(_route, "current_stream", lambda device: stream)
        return comm

    return make
