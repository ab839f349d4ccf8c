"""CPU tests of symmem::all_gather_matmul: schema, fake and CPU kernels (opcheck), argument errors,
and what the CUDA kernel's Python side hands to the core (a recording core, world 4)."""
import pytest

torch = pytest.importorskip("torch", reason="symmem.torch tests need torch (pip install torch==2.11.0)")


def _ints(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("return_a", [False, True])
def test_opcheck(group_name, dtype, return_a):
    a, b = _ints((32, 64), dtype, 1), _ints((64, 24), dtype, 2)
    torch.library.opcheck(torch.ops.symmem.all_gather_matmul.default, (a, b, group_name, return_a))


def test_result_and_gathered_a_on_one_rank(group_name):
    import symmem.torch as st
    a, b = _ints((40, 16), torch.bfloat16, 3), _ints((16, 8), torch.bfloat16, 4)
    c, gathered = st.all_gather_matmul(a, b, return_a=True)
    assert torch.equal(gathered, a)
    assert torch.equal(c, (a.float() @ b.float()).to(torch.bfloat16))  # small integers: exact
    c2, none = st.all_gather_matmul(a, b)
    assert none is None and torch.equal(c2, c)


@pytest.mark.parametrize("name", ["all_gather_matmul", "matmul_reduce_scatter"])
def test_bad_arguments(group_name, name):
    op = getattr(torch.ops.symmem, name)
    a = torch.ones(8, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="must be 2-D"):
        op(a.view(2, 4, 16), torch.ones(16, 8, dtype=torch.float16), group_name)
    with pytest.raises(ValueError, match="columns must equal b's rows"):
        op(a, torch.ones(8, 8, dtype=torch.float16), group_name)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        op(a.float(), torch.ones(16, 8), group_name)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        op(a, torch.ones(16, 8, dtype=torch.bfloat16), group_name)
    with pytest.raises(ValueError, match="a.* must be contiguous"):
        op(torch.ones(16, 8, dtype=torch.float16).t(), torch.ones(16, 8, dtype=torch.float16), group_name)
    b_t = torch.ones(8, 16, dtype=torch.float16).t()  # b = W.t(): taken as it lies (column-major)
    assert op(a, b_t, group_name) is not None


def test_compile_traces_the_op(group_name):
    import symmem.torch as st
    a, b = _ints((8, 16), torch.float16, 5), _ints((16, 8), torch.float16, 6)
    torch._dynamo.reset()
    got = torch.compile(lambda x, w: st.all_gather_matmul(x, w)[0] * 1, fullgraph=True, backend="aot_eager")(a, b)
    assert torch.equal(got, (a.float() @ b.float()).to(torch.float16))


def test_cuda_kernel_passes_the_right_arguments_and_grows_its_workspace(fake_group):
    from symmem import _native
    from symmem.torch import fused

    comm = fake_group("fake-fused", 4, stream=99)
    a, b = torch.empty(8, 16, dtype=torch.bfloat16), torch.empty(16, 24, dtype=torch.bfloat16)
    c, none = fused._all_gather_matmul_cuda(a, b, "fake-fused")
    assert c.shape == (32, 24) and none is None
    assert comm.core.calls[0] == ("allocate", 32 << 20)  # in steps of 32 MiB
    workspace = 4096
    assert comm.core.calls[1] == ("all_gather_matmul", c.data_ptr(), workspace, a.data_ptr(), b.data_ptr(), 32, 24,
                                  16, _native.DTYPES["bfloat16"], 99, _native.MATRIX_LAYOUTS["row_major"])
    # The same or a smaller shape reuses the workspace; a larger one grows it (collective, eager).
    fused._all_gather_matmul_cuda(a[:4].contiguous(), b, "fake-fused")
    assert [x[0] for x in comm.core.calls] == ["allocate", "all_gather_matmul", "all_gather_matmul"]
    assert comm.core.calls[-1][2] == workspace
    big = torch.empty(1 << 18, 16, dtype=torch.bfloat16)  # 32 MiB gathered over 4 ranks: still fits
    fused._all_gather_matmul_cuda(big, torch.empty(16, 8, dtype=torch.bfloat16), "fake-fused")
    assert comm.core.calls[-2][0] == "all_gather_matmul"
    bigger = torch.empty((1 << 18) + 1, 16, dtype=torch.bfloat16)
    fused._all_gather_matmul_cuda(bigger, torch.empty(16, 8, dtype=torch.bfloat16), "fake-fused")
    assert comm.core.calls[-2] == ("allocate", 64 << 20)


# matmul_reduce_scatter

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduce_scatter_opcheck(group_name, dtype):
    a, b = _ints((32, 64), dtype, 7), _ints((64, 24), dtype, 8)
    torch.library.opcheck(torch.ops.symmem.matmul_reduce_scatter.default, (a, b, group_name))


def test_reduce_scatter_result_on_one_rank(group_name):
    import symmem.torch as st
    a, b = _ints((40, 16), torch.bfloat16, 9), _ints((16, 8), torch.bfloat16, 10)
    assert torch.equal(st.matmul_reduce_scatter(a, b), (a.float() @ b.float()).to(torch.bfloat16))


def test_reduce_scatter_cuda_kernel_passes_the_right_arguments(fake_group):
    from symmem import _native
    from symmem.torch import fused

    comm = fake_group("fake-fused-rs", 4, stream=77)
    a, b = torch.empty(32, 16, dtype=torch.float16), torch.empty(16, 24, dtype=torch.float16)
    c = fused._matmul_reduce_scatter_cuda(a, b, "fake-fused-rs")
    assert c.shape == (8, 24)
    assert comm.core.calls[0] == ("allocate", 32 << 20)
    assert comm.core.calls[1] == ("matmul_reduce_scatter", c.data_ptr(), 4096, a.data_ptr(), b.data_ptr(), 32, 24,
                                  16, _native.DTYPES["float16"], 77, _native.MATRIX_LAYOUTS["row_major"])
    with pytest.raises(ValueError, match="not a multiple of the group's 4 ranks"):
        fused._matmul_reduce_scatter_cuda(torch.empty(30, 16, dtype=torch.float16), b, "fake-fused-rs")
    # Its workspace is its own: the gather workspace is never handed to it.
    assert comm.workspaces == {"matmul_reduce_scatter:partial_sums": (4096, 32 << 20)}


def test_empty_shapes_need_no_communication(fake_group):
    """m, n or k of 0 (an empty micro-batch): empty or zero results, nothing handed to the core."""
    from symmem.torch import fused

    comm = fake_group("fake-fused-empty", 2)
    half = torch.float16
    c, a = fused._all_gather_matmul_cuda(torch.empty(0, 16, dtype=half), torch.empty(16, 8, dtype=half),
                                          "fake-fused-empty", True)
    assert c.shape == (0, 8) and a.shape == (0, 16)
    c, _ = fused._all_gather_matmul_cuda(torch.empty(4, 0, dtype=half), torch.empty(0, 8, dtype=half),
                                         "fake-fused-empty")
    assert c.shape == (8, 8) and torch.equal(c, torch.zeros(8, 8, dtype=half))
    c = fused._matmul_reduce_scatter_cuda(torch.empty(0, 16, dtype=half), torch.empty(16, 8, dtype=half),
                                          "fake-fused-empty")
    assert c.shape == (0, 8)
    c = fused._matmul_reduce_scatter_cuda(torch.empty(6, 0, dtype=half), torch.empty(0, 8, dtype=half),
                                          "fake-fused-empty")
    assert c.shape == (3, 8) and torch.equal(c, torch.zeros(3, 8, dtype=half))
    assert comm.core.calls == []
