"""The examples' torch ops at world 1 on a real process group (gloo, one process): the fake kernels'
outputs against the real ones (shape, dtype, strides) and the schemas' mutation marks, checked
directly: opcheck runs an op on clones of its arguments, which are not heap tensors, and the ops
refuse them, as they must (seen on an H100: every opcheck utility failed that way). Results equal
the input (a sum and a gather over one rank). Run by scripts/gpu_run.sh's triton_ops_tests step."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

import symmem.torch as st  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
import symmem.triton.examples  # noqa: E402,F401  registers torch.ops.symmem_triton.*
import symmem.triton.examples.all_gather_matmul  # noqa: E402,F401


@pytest.fixture(scope="module")
def group_name():
    if not dist.is_initialized():
        path = os.path.join(tempfile.mkdtemp(prefix="symmem-ops-"), "store")
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    torch.cuda.set_device(0)
    return dist.group.WORLD.group_name


def fake_matches_real(op, args):
    """The op's fake kernel, on fakes of `args`, gives outputs shaped as the real op gives them."""
    real = op(*args)
    with FakeTensorMode() as mode:
        fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    flat_real = [t for t in (real if isinstance(real, (tuple, list)) else [real]) if t is not None]
    flat_fake = [t for t in (fake if isinstance(fake, (tuple, list)) else [fake]) if t is not None]
    assert len(flat_real) == len(flat_fake)
    for r, f in zip(flat_real, flat_fake):
        assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), (op, r.shape, f.shape)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_shot_all_reduce_op(group_name, dtype):
    x = st.empty(5000, dtype=dtype)
    x.copy_(torch.randn(5000, device="cuda").to(dtype))
    y = torch.ops.symmem_triton.one_shot_all_reduce(x, group_name)
    assert torch.equal(y, x)
    fake_matches_real(torch.ops.symmem_triton.one_shot_all_reduce, (x, group_name))


def test_all_gather_op(group_name):
    x = st.empty(4097, dtype=torch.float16)
    x.copy_(torch.randn(4097, device="cuda").to(torch.float16))
    y = torch.ops.symmem_triton.all_gather(x, group_name, 4)
    assert torch.equal(y, x)
    fake_matches_real(torch.ops.symmem_triton.all_gather, (x, group_name, 4))


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_all_gather_into_op(group_name, mode):
    x = st.empty(4097, dtype=torch.float16)
    out = st.empty(4097, dtype=torch.float16)
    x.copy_(torch.randn(4097, device="cuda").to(torch.float16))
    out.fill_(float("nan"))
    torch.ops.symmem_triton.all_gather_into(out, x, group_name, 4, mode)
    assert torch.equal(out, x)
    fake_matches_real(torch.ops.symmem_triton.all_gather_into, (out, x, group_name, 4, mode))


def test_a_tensor_outside_the_heap_is_refused(group_name):
    x = torch.ones(64, device="cuda")
    with pytest.raises(ValueError, match="symmetric tensor"):
        torch.ops.symmem_triton.one_shot_all_reduce(x, group_name)


def test_all_gather_matmul_op(group_name):
    gathered = st.empty(256, 512, dtype=torch.float16)
    a_shard = torch.randn(256, 512, device="cuda").half()  # world 1: the shard is the whole matrix
    b = torch.randn(512, 384, device="cuda").half()
    c = torch.ops.symmem_triton.all_gather_matmul(a_shard, b, gathered, group_name)
    reference = a_shard.float() @ b.float()
    assert torch.equal(gathered, a_shard)
    assert ((c.float() - reference).abs().max() / reference.abs().max()).item() < 1e-2
    fake_matches_real(torch.ops.symmem_triton.all_gather_matmul, (a_shard, b, gathered, group_name))


def test_world1_vs_mm_writes_a_row_per_shape(tmp_path):
    # `python -m symmem.triton.examples.all_gather_matmul --world1-vs-mm` raised UnboundLocalError at
    # its first configuration while a local variable of the function was named dtype_name, as the
    # helper it calls (on fed6b18).
    from symmem.triton.examples import all_gather_matmul as example
    csv = tmp_path / "world1.csv"
    rows = example.world1_vs_mm(str(csv), "test", [(256, 256, 128)], torch.float16, reps=1)
    lines = csv.read_text().splitlines()
    assert len(rows) == 1 and len(lines) == 2 and lines[1].split(",")[3:7] == ["float16", "256", "256", "128"]
    assert rows[0][3][3] < 1e-2  # the chosen configuration's largest error relative to torch.mm's result


def test_schemas_mark_what_the_ops_write():
    ops = torch.ops.symmem_triton
    writes = {name: [a.name for a in getattr(ops, name).default._schema.arguments
                     if a.alias_info is not None and a.alias_info.is_write]
              for name in ("one_shot_all_reduce", "all_gather", "all_gather_into", "all_gather_matmul")}
    assert writes["one_shot_all_reduce"] == [] and writes["all_gather"] == []
    assert writes["all_gather_into"] == ["out"]
    assert len(writes["all_gather_matmul"]) == 1  # the gathered workspace it fills
