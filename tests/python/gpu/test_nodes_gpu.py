"""symmem.torch across nodes, simulated on one host: every rank its own node
(SYMMEM_NODE_SIZE=1 tests/python/gpu/run.sh 2 -k simulated_nodes; the conftest gives each rank its
own NCCL_HOSTID). User code is unchanged: all_gather_into_tensor, the list form and FSDP2's
all-gather object run symmem's hierarchical all-gather; the reductions fall back to
torch.distributed, saying why. torch.distributed (NCCL, under the same simulation) is the reference."""
import os
import re

import pytest

torch = pytest.importorskip("torch", reason="needs torch")
import torch.distributed as dist  # noqa: E402

import symmem.torch as st  # noqa: E402
from symmem.torch import fsdp, functional, memory  # noqa: E402

ops = torch.ops.symmem

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.uint8]
SIZES = [1, 3, 4097, 1 << 20, (5 << 20) + 3]


@pytest.fixture(scope="module")
def nodes_group(group):
    if int(os.environ.get("SYMMEM_NODE_SIZE", "0") or 0) <= 0:
        pytest.skip("needs simulated nodes: SYMMEM_NODE_SIZE=1 tests/python/gpu/run.sh 2 -k simulated_nodes")
    comm = st.GroupCommunicator(group)
    assert comm.nodes == dist.get_world_size() // int(os.environ["SYMMEM_NODE_SIZE"])
    assert comm.nodes > 1
    return group


def _data(n, dtype, salt):
    g = torch.Generator(device="cuda").manual_seed(1000 * dist.get_rank() + salt)
    if dtype.is_floating_point:
        return (torch.rand(n, device="cuda", generator=g) * 200 - 100).to(dtype)
    return torch.randint(0, 250, (n,), device="cuda", generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_simulated_nodes_all_gather_into_tensor_is_bit_exact(nodes_group, dtype):
    world, rank = dist.get_world_size(), dist.get_rank()
    for i, n in enumerate(SIZES):
        x = _data(n, dtype, i)
        expected = torch.empty(world * n, dtype=dtype, device="cuda")
        dist.all_gather_into_tensor(expected, x)
        out = torch.full((world * n,), 7, dtype=dtype, device="cuda")
        said = set(functional._said)
        st.all_gather_into_tensor(out, x)
        assert functional._said == said, "fell back to torch.distributed"  # served by symmem
        assert torch.equal(out, expected)
        # In place, as FSDP2 calls it, and into a symmetric tensor.
        s = memory.empty(world * n, dtype=dtype, group=nodes_group)
        s[rank * n:(rank + 1) * n].copy_(x)
        ops.all_gather_into_tensor_out(s[rank * n:(rank + 1) * n], nodes_group.group_name, out=s)
        assert torch.equal(s, expected)


def test_simulated_nodes_list_all_gather(nodes_group):
    world = dist.get_world_size()
    x = _data(777, torch.float16, 9)
    expected = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(expected, x)
    got = [torch.empty_like(x) for _ in range(world)]
    st.all_gather(got, x)
    for r in range(world):
        assert torch.equal(got[r], expected[r])


def test_simulated_nodes_fsdp_all_gather_object(nodes_group):
    world, rank = dist.get_world_size(), dist.get_rank()
    gather = fsdp.SymmemAllGather(nodes_group)  # its default, the copy engine, is hierarchical here
    for i, n in enumerate([4096, (3 << 20) + 5]):
        x = _data(n, torch.bfloat16, 20 + i)
        expected = torch.empty(world * n, dtype=torch.bfloat16, device="cuda")
        dist.all_gather_into_tensor(expected, x)
        out = gather.allocate((world * n,), dtype=torch.bfloat16, device=torch.device("cuda"))
        out[rank * n:(rank + 1) * n].copy_(x)
        gather(out, out[rank * n:(rank + 1) * n], nodes_group)
        torch.cuda.current_stream().synchronize()
        assert torch.equal(out, expected)
    assert gather.calls == 2


def test_simulated_nodes_reductions_fall_back_saying_why(nodes_group, caplog):
    x = _data(1000, torch.float32, 30)
    expected = x.clone()
    dist.all_reduce(expected)
    functional._said.clear()  # (said once per reason: an earlier test may have said it)
    with caplog.at_level("WARNING", logger="symmem"):
        st.all_reduce(x)
    assert any(re.search("falls back to torch.distributed: .* spans [0-9]+ nodes", r.getMessage()) for r in caplog.records)
    assert torch.equal(x, expected)
