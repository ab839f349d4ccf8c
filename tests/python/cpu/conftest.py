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


class _RecordingCore:
    """Stands in for the C ABI of a core communicator: records what the CUDA kernels pass to it
    (`calls`: (name, *arguments) in order). Heap buffers are at 4096 x the call's number."""

    def __init__(self):
        self.calls = []

    def allocate(self, nbytes):
        self.calls.append(("allocate", nbytes))
        return 4096 * len(self.calls)

    def all_reduce(self, *args):
        self.calls.append(("all_reduce",) + args)

    def all_gather(self, *args):
        self.calls.append(("all_gather",) + args)

    def reduce_scatter(self, *args):
        self.calls.append(("reduce_scatter",) + args)

    def all_gather_matmul(self, *args):
        self.calls.append(("all_gather_matmul",) + args)

    def matmul_reduce_scatter(self, *args):
        self.calls.append(("matmul_reduce_scatter",) + args)

    @staticmethod
    def matmul_reduce_scatter_workspace_bytes(m, n):
        return 2 * m * n * 4


@pytest.fixture
def fake_group(monkeypatch):
    """fake_group(name, world, stream=None, nodes=1): a symmem.torch GroupCommunicator of `world`
    ranks whose core records the calls (`comm.core.calls`) instead of making them, served for the
    group name `name` by every entry point; the CUDA kernels see `stream` as the current stream."""
    import types
    import weakref

    from symmem.torch import _route, groups

    def make(name, world, stream=None, nodes=1, rank=0):
        comm = object.__new__(groups.GroupCommunicator)
        comm.__dict__.update(device=-1, torch_device=torch.device("cpu"), group_name=name, key=name, purpose=None,
                             world=world, rank=rank, nodes=nodes, core=_RecordingCore(), closed=False, workspaces={},
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
