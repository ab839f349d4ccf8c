"""CPU tests of torch.ops.symmem.fused_all_gather_matmul / fused_matmul_reduce_scatter (torch's
schemas, symm_mem_compat.py): their outputs' shapes and strides against torch.ops.symm_mem's own
(its Meta kernels on a fake process group of 2 and 4 ranks), real and fake kernels agreeing
(opcheck, torch.compile), and how B's layout is chosen (b_layout_of, b_operand, and the layout
handed to the core for a transposed B)."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="symmem.torch tests need torch (pip install torch==2.11.0)")

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused_layout_worker.py")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 4])
def test_layouts_match_torchs_fused_ops(world):
    """Every gather / scatter dim (negative too), 2-D to 4-D, float32 (the unfused path) and 16-bit
    (the fused one), B row-major and transposed, return_A both ways, three Bs: symmem's fake and
    CPU kernels give torch's shapes, strides and dtypes (e.g. strides (32, 256, 1) for the gathered
    A [8, 64, 32] at gather_dim 1, where contiguous outputs were returned before)."""
    proc = subprocess.run([sys.executable, _WORKER, str(world)], capture_output=True, text=True, timeout=540,
                          env=dict(os.environ))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("checked ") and int(lines[-1].split()[1]) > 300, out[-4000:]
    assert len(lines) == 1, "\n".join(lines[:40])


def test_output_strides_put_the_gathered_dim_outermost():
    from symmem.torch.symm_mem_compat import output_strides
    assert output_strides([8, 64, 32], 0) == (2048, 32, 1)
    assert output_strides([8, 64, 32], 1) == (32, 256, 1)  # torch's, from its AsyncTPTest
    assert output_strides([8, 64, 32], 2) == (2048, 32, 1)  # the last: contiguous
    assert output_strides([2, 3, 4, 5], 2) == (15, 5, 30, 1)
    assert output_strides([0, 4, 8], 1) == (8, 8, 1)  # extents of 0 count as 1, as torch's
    for dim in range(3):  # the layout torch.empty(moved).movedim(0, dim) has
        shape = [3, 5, 7]
        moved = [shape[dim]] + [s for i, s in enumerate(shape) if i != dim]
        expected = torch.empty(moved).movedim(0, dim).stride() if dim < 2 else torch.empty(shape).stride()
        assert output_strides(shape, dim) == expected


@pytest.mark.timeout(300)
@pytest.mark.parametrize("gather_dim", [0, 1, -2, 2])
@pytest.mark.parametrize("transposed", [False, True])
def test_real_and_fake_kernels_agree_on_one_rank(group_name, gather_dim, transposed):
    g = torch.Generator().manual_seed(gather_dim + 11)
    a = torch.randint(-3, 4, (4, 6, 16), generator=g).to(torch.bfloat16)
    ws = [torch.randint(-3, 4, (n, 16), generator=g).to(torch.bfloat16) for n in (8, 16)]
    bs = [w.t() if transposed else w.t().contiguous() for w in ws]
    op = torch.ops.symmem.fused_all_gather_matmul
    torch.library.opcheck(op.default, (a, bs, gather_dim, group_name), {"return_A": True})
    a_gathered, outputs = op(a, bs, gather_dim, group_name)
    dim = gather_dim % 3
    assert a_gathered.stride() == (torch.empty(a.shape).movedim(dim, 0).contiguous().movedim(0, dim).stride()
                                   if dim < 2 else a.stride())
    for b, c in zip(bs, outputs):
        assert torch.equal(c, (a.float() @ b.float()).to(torch.bfloat16))
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: op(t, bs, gather_dim, group_name)[1][0] + 1, fullgraph=True,
                             backend="aot_eager")
    assert torch.equal(compiled(a), outputs[0] + 1)
    rs = torch.ops.symmem.fused_matmul_reduce_scatter
    torch.library.opcheck(rs.default, (a, bs[0], "avg", gather_dim, group_name))


def test_b_layout_of():
    from symmem.torch.fused import b_layout_of

    def of(t):
        return b_layout_of(tuple(t.shape), t.stride())
    w = torch.empty(24, 16)
    assert of(w) == "row_major"
    assert of(w.t()) == "column_major"  # W.t(): x @ W.t()
    assert of(w[:, :8]) is None  # a slice: rows padded
    assert of(w[:8].t()) == "column_major"  # a block of whole rows of W: still packed
    assert of(w[:, :8].t()) is None
    assert of(torch.empty(16).expand(4, 16)) is None  # a broadcast
    assert of(torch.empty(1, 16)) == "row_major" and of(torch.empty(16, 1)) == "row_major"  # both: row-major
    assert of(torch.empty(16, 1).t()) == "row_major"
    assert of(torch.empty(0, 5)) == "row_major"
    assert of(torch.empty(24, 16)[::2]) is None  # every other row
    assert of(torch.empty_strided((8, 4), (1, 8))) == "column_major"
    assert of(torch.empty_strided((8, 4), (1, 9))) is None


def test_b_operand_copies_only_what_is_packed_neither_way():
    from symmem import _native
    from symmem.torch.fused import b_operand
    w = torch.arange(24 * 16, dtype=torch.float16).view(24, 16)
    b, layout = b_operand(w)
    assert b is w and layout == _native.MATRIX_LAYOUTS["row_major"]
    b, layout = b_operand(w.t())
    assert b.data_ptr() == w.data_ptr() and b.stride() == (1, 16)
    assert layout == _native.MATRIX_LAYOUTS["column_major"]
    sliced = w[:, :8]
    b, layout = b_operand(sliced)
    assert b.is_contiguous() and b.data_ptr() != w.data_ptr() and torch.equal(b, sliced)
    assert layout == _native.MATRIX_LAYOUTS["row_major"]


@pytest.mark.parametrize("op", ["all_gather_matmul", "matmul_reduce_scatter"])
def test_transposed_b_reaches_the_core_in_place_with_its_layout(fake_group, op):
    """B = W.t() goes to the GEMM as W's own memory with the column-major layout (no copy); a B
    packed neither way goes as a contiguous copy, row-major."""
    from symmem import _native
    from symmem.torch import fused
    comm = fake_group(f"fake-fused-layout-{op}", 4, stream=5)
    run = fused._all_gather_matmul_cuda if op == "all_gather_matmul" else fused._matmul_reduce_scatter_cuda
    a = torch.empty(8, 16, dtype=torch.bfloat16)
    w = torch.empty(24, 16, dtype=torch.bfloat16)
    run(a, w.t(), comm.group_name)
    call = comm.core.calls[-1]
    assert call[0] == op and call[4] == w.data_ptr() and call[-1] == _native.MATRIX_LAYOUTS["column_major"]
    run(a, w.t().contiguous(), comm.group_name)
    assert comm.core.calls[-1][-1] == _native.MATRIX_LAYOUTS["row_major"]
    wide = torch.empty(16, 48, dtype=torch.bfloat16)
    run(a, wide[:, :24], comm.group_name)  # a slice: copied
    call = comm.core.calls[-1]
    assert call[4] != wide.data_ptr() and call[-1] == _native.MATRIX_LAYOUTS["row_major"]
