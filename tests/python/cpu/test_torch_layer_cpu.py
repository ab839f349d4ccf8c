"""The torch layer's structure and conventions, on CPU: one route per collective and no import
circle, enums read from the C ABI, torch.distributed's error type, vLLM's and torch's argument
orders and names, ranks outside a group, the symm_mem-compatible fused ops."""
import ast
import importlib
import inspect
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

PACKAGE = pathlib.Path(__import__("symmem").__file__).resolve().parent  # the package under test


def _imports_of(path, package):
    """The symmem modules `path` imports, at any depth of the file (function-level imports too)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if module.endswith(".__init__"):
        module = module[: -len(".__init__")]
        here = module
    else:
        here = module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = here
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            target = (base + ("." + node.module if node.module else "")) if node.level else (node.module or "")
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in package else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return module, {m for m in found if m in package and m != module}


def test_no_import_circle_in_the_torch_layer():
    files = sorted((PACKAGE / "torch").glob("*.py"))
    package = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in PACKAGE.rglob("*.py")}
    package = {m[: -len(".__init__")] if m.endswith(".__init__") else m for m in package}
    graph = dict(_imports_of(p, package) for p in files)
    graph.pop("symmem.torch", None)  # the package's __init__ imports its modules: not a layer
    for edges in graph.values():
        edges.discard("symmem.torch")
    seen, stack = set(), []

    def visit(node):
        if node in stack:
            cycle = stack[stack.index(node):] + [node]
            pytest.fail("import circle: " + " -> ".join(cycle))
        if node in seen or node not in graph:
            return
        stack.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        stack.pop()
        seen.add(node)

    for node in sorted(graph):
        visit(node)


def test_every_op_is_tagged_pt2_compliant(group_name):
    names = ["all_reduce", "all_reduce_", "all_reduce_out", "all_gather_into_tensor", "all_gather_into_tensor_out",
             "all_gather", "reduce_scatter_tensor", "reduce_scatter_tensor_out", "all_gather_matmul",
             "matmul_reduce_scatter", "fused_all_gather_matmul", "fused_matmul_reduce_scatter"]
    for name in names:
        assert torch.Tag.pt2_compliant_tag in getattr(torch.ops.symmem, name).default.tags, name


def test_codes_and_enums_come_from_the_c_abi():
    import symmem
    from symmem import _native
    from symmem.torch import _route
    lib = _native.lib
    ids = [lib.symmem_error_code_id(rc).decode() for rc in range(1, len(symmem.ErrorCode) + 1)]
    assert [c.value for c in symmem.ErrorCode] == ids and lib.symmem_error_code_id(len(ids) + 1) is None
    assert symmem.ErrorCode.kTimeout == "kTimeout"
    assert [lib.symmem_dtype_name(v).decode() for v in sorted(_native.DTYPES.values())] == list(_native.DTYPES)
    assert set(_route.REDUCIBLE) == {torch.float32, torch.float16, torch.bfloat16, torch.int32}
    assert set(_route.REDUCE_OPS) == {"sum", "max", "min", "avg"}
    with pytest.raises(symmem.SymmemError) as info:
        _native.check(lib.symmem_comm_check(None))
    assert info.value.code is symmem.ErrorCode.kInvalidArgument


ERROR_TYPE = textwrap.dedent("""
    import sys
    order = sys.argv[1]
    if order == "torch first":
        import torch.distributed as dist
        import symmem
    else:
        import symmem
        assert "torch" not in sys.modules
        try:
            symmem._native.check(symmem._native.lib.symmem_comm_check(None))
        except symmem.SymmemError as e:
            before = e  # made before symmem.torch: still picklable after it
        import symmem.torch
        import torch.distributed as dist
        import pickle
        assert pickle.loads(pickle.dumps(before)).code == "kInvalidArgument"
    from symmem import _native
    assert issubclass(symmem.SymmemError, dist.DistBackendError), symmem.SymmemError.__mro__
    error = None
    try:
        _native.check(_native.lib.symmem_comm_check(None))
    except dist.DistBackendError as e:
        error = e
    assert isinstance(error, symmem.SymmemError) and error.code == "kInvalidArgument", error
    e = error
    import pickle
    copy = pickle.loads(pickle.dumps(e))
    assert type(copy) is type(e) and copy.code is symmem.ErrorCode.kInvalidArgument and str(copy) == str(e)
    # A refused call's error on the refusing rank: the op's documented type and the peers' SymmemError.
    from symmem.torch.errors import RefusedTypeError, RefusedValueError
    for cls, documented in ((RefusedValueError, ValueError), (RefusedTypeError, TypeError)):
        refused = cls("kInvalidArgument", "symmem.op: rank 1 refused the call: why")
        assert isinstance(refused, documented) and isinstance(refused, symmem.SymmemError)
        assert isinstance(refused, dist.DistBackendError) and refused.code == "kInvalidArgument"
        copy = pickle.loads(pickle.dumps(refused))
        assert type(copy) is cls and str(copy) == str(refused)
    print("ok")
""")


@pytest.mark.parametrize("order", ["torch first", "symmem first"])
def test_symmem_error_is_a_dist_backend_error(order):
    out = subprocess.run([sys.executable, "-c", ERROR_TYPE, order], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_signatures_users_already_know():
    import symmem.torch as st
    assert list(inspect.signature(st.TPAllReduce).parameters) == ["group", "device", "max_size"]
    empty = inspect.signature(st.empty)
    assert [p.kind for p in empty.parameters.values()][0] is inspect.Parameter.VAR_POSITIONAL
    assert {k: v.default for k, v in list(empty.parameters.items())[1:]} == {"dtype": None, "device": None,
                                                                            "group": None}
    assert (PACKAGE / "py.typed").exists()
    for fn in (st.all_reduce, st.all_gather_into_tensor, st.all_gather, st.reduce_scatter_tensor):
        assert list(inspect.signature(fn).parameters)[-2:] == ["group", "async_op"]


def test_group_communicator_is_named_apart_from_the_core_one_and_its_former_name_still_works():
    import symmem
    import symmem.torch as st
    assert st.GroupCommunicator is not symmem.Communicator and "GroupCommunicator" in st.__all__
    with pytest.warns(DeprecationWarning, match="symmem.torch.GroupCommunicator"):
        assert st.Communicator is st.GroupCommunicator
    with pytest.warns(DeprecationWarning):
        from symmem.torch import Communicator
    assert Communicator is st.GroupCommunicator and "Communicator" not in st.__all__
    with pytest.raises(AttributeError, match="no attribute 'Comunicator'"):
        st.Comunicator


class _Comm:
    closed = False
    device = 0
    torch_device = "cuda:0"
    group_name = "two-nodes"

    def __init__(self, nodes):
        self.nodes = nodes


def test_tp_all_reduce_is_disabled_across_nodes_and_returns_none(group_name, monkeypatch):
    # A vLLM integration must fall back before the forward pass, not get kUnsupported in it (seen
    # failing before: disabled stayed False for a group spanning nodes).
    import torch.distributed as dist
    from symmem.torch import groups, tp_all_reduce
    monkeypatch.setattr(groups.GroupState, "communicator", lambda state, purpose=None: _Comm(nodes=2))
    tp = tp_all_reduce.TPAllReduce(dist.group.WORLD)
    assert tp.disabled and "spans 2 nodes" in tp.reason
    x = torch.ones(8)
    assert not tp.should_custom_ar(x) and not tp.should_use_symm_mem(x)
    assert tp.custom_all_reduce(x) is None and tp.all_reduce(x) is None
    monkeypatch.setattr(groups.GroupState, "communicator", lambda state, purpose=None: _Comm(nodes=1))
    tp = tp_all_reduce.TPAllReduce(group_name, None, 1 << 20)  # a group's name, vLLM's argument order
    assert not tp.disabled and tp.max_size == 1 << 20
    assert tp.custom_all_reduce(x) is None  # a CPU tensor: not served, None (vLLM then uses its other paths)


def test_tp_all_reduce_stops_serving_a_destroyed_group(group_name, monkeypatch):
    # Every entry point refuses a destroyed group; a TPAllReduce made before kept serving it (on
    # the group's communicator, retired only at symmem's next release point) until then.
    import torch.distributed as dist
    from symmem.torch import _route, groups, tp_all_reduce
    sub = dist.new_group([0])
    monkeypatch.setattr(groups.GroupState, "communicator", lambda state, purpose=None: _Comm(nodes=1))
    tp = tp_all_reduce.TPAllReduce(sub)
    served = []
    monkeypatch.setattr(_route, "all_reduce", lambda comm, out, inp, op: served.append(op))
    x = torch.ones(8)
    with monkeypatch.context() as m:  # a tensor it takes (it reads is_cuda and the device)
        m.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
        m.setattr(torch.Tensor, "get_device", lambda t: 0)
        assert tp.all_reduce(x) is not None and served == ["sum"]
        dist.destroy_process_group(sub)
        assert not tp.should_custom_ar(x) and tp.all_reduce(x) is None and served == ["sum"]
    assert tp.disabled and "destroyed" in tp.reason


OUTSIDE_GROUP = textwrap.dedent("""
    import os, sys, warnings
    import torch, torch.distributed as dist
    rank, path = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    import symmem.torch as st
    only0 = dist.new_group([0])
    x = torch.full((4,), float(rank + 1))
    out = torch.zeros(8)
    if rank == 1:  # CPU tensors that say they are CUDA tensors: the drop-ins' decisions read is_cuda
        torch.Tensor.is_cuda = property(lambda t: True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = [st.all_reduce(x, group=only0), st.all_gather_into_tensor(out[:4], x, group=only0),
                   st.all_gather([torch.zeros(4)], x, group=only0),
                   st.reduce_scatter_tensor(torch.zeros(4), x, group=only0, async_op=True)]
    if rank == 1:  # not a member: nothing happened, None returned
        assert results == [None, None, None, None], results
        del torch.Tensor.is_cuda
        assert torch.equal(x, torch.full((4,), 2.0)) and not out.any()
    else:  # the member: served (by torch.distributed, for CPU tensors)
        results[3].wait()
        assert torch.equal(out[:4], x)
    dist.barrier()
    dist.destroy_process_group()
    print("ok")
""")


def test_drop_ins_do_nothing_on_ranks_outside_the_group(tmp_path):
    # torch.distributed returns None on a rank outside the group; the drop-ins raised AttributeError.
    env = dict(os.environ)
    path = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, "-c", OUTSIDE_GROUP, str(r), path], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for r in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0 and out.strip().endswith("ok"), out


@pytest.mark.parametrize("gather_dim", [0, 1, -2, 2])
def test_symm_mem_compatible_fused_all_gather_matmul(group_name, gather_dim):
    g = torch.Generator().manual_seed(gather_dim + 5)
    a = torch.randint(-3, 4, (4, 6, 16), generator=g).to(torch.bfloat16)
    bs = [torch.randint(-3, 4, (16, n), generator=g).to(torch.bfloat16) for n in (8, 5)]  # (the last dim: at one
    # rank the gathered k is the shard's; tests/python/cpu's two-rank case gathers it for real)
    op = torch.ops.symmem.fused_all_gather_matmul
    a_gathered, outputs = op(a, bs, gather_dim, group_name)
    assert torch.equal(a_gathered, a)  # one rank: the gather is the shard
    for b, c in zip(bs, outputs):
        assert torch.equal(c, (a.float() @ b.float()).to(torch.bfloat16))
    none, outputs = op(a, bs, gather_dim, group_name, return_A=False)
    assert none is None and len(outputs) == 2
    torch.library.opcheck(op.default, (a, bs, gather_dim, group_name), {"return_A": True})
    # Real and fake outputs agree in shape and strides (torch's layout: the gathered dim outermost,
    # tests/python/cpu/test_fused_compat_cpu.py), which torch.compile relies on.
    a_gathered, outputs = op(a, bs, gather_dim, group_name)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: op(t, bs, gather_dim, group_name)[1][0] + 1, fullgraph=True,
                             backend="aot_eager")
    assert torch.equal(compiled(a), outputs[0] + 1)


def test_symm_mem_compatible_fused_matmul_reduce_scatter(group_name):
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-3, 4, (8, 3, 16), generator=g).to(torch.float16)
    b = torch.randint(-3, 4, (16, 4), generator=g).to(torch.float16)
    op = torch.ops.symmem.fused_matmul_reduce_scatter
    for dim in (0, 1, 2):
        for reduce_op in ("sum", "avg"):
            got = op(a, b, reduce_op, dim, group_name)
            assert got.is_contiguous() and torch.equal(got, (a.float() @ b.float()).to(torch.float16))
    torch.library.opcheck(op.default, (a, b, "sum", 0, group_name))
    with pytest.raises(ValueError, match="reduce_op"):
        op(a, b, "max", 0, group_name)
    importlib.import_module("torch.distributed._symmetric_memory")  # registers torch.ops.symm_mem
    # torch.s own op, same schema (arguments and results), so that a call site switches namespaces.
    ours = torch.ops.symmem.fused_matmul_reduce_scatter.default._schema
    theirs = torch.ops.symm_mem.fused_matmul_reduce_scatter.default._schema
    assert [a.name for a in ours.arguments] == [a.name for a in theirs.arguments]
    ours = torch.ops.symmem.fused_all_gather_matmul.default._schema
    theirs = torch.ops.symm_mem.fused_all_gather_matmul.default._schema
    assert [(a.name, str(a.type)) for a in ours.arguments] == [(a.name, str(a.type)) for a in theirs.arguments]
    assert [str(r.type) for r in ours.returns] == [str(r.type) for r in theirs.returns]


COMPAT_TWO_RANKS = textwrap.dedent("""
    import sys
    import torch, torch.distributed as dist
    rank, path = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    import symmem.torch  # noqa: F401
    g = dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(100 + rank)
    for dtype in (torch.bfloat16, torch.float32):
        shard = torch.randint(-3, 4, (4, 6, 16), generator=gen).to(dtype)
        b = torch.randint(-3, 4, (16, 8), generator=torch.Generator().manual_seed(7)).to(dtype)
        shards = [torch.empty_like(shard) for _ in range(2)]
        dist.all_gather(shards, shard)
        wide = torch.randint(-3, 4, (32, 8), generator=torch.Generator().manual_seed(8)).to(dtype)
        for dim in (0, 1, 2):  # 2: the last dim, k, gathered (B takes world x k rows)
            w = wide if dim == 2 else b
            a_gathered, (c,) = torch.ops.symmem.fused_all_gather_matmul(shard, [w], dim, g)
            assert torch.equal(a_gathered, torch.cat(shards, dim)), (dtype, dim)
            assert torch.equal(c, (torch.cat(shards, dim).float() @ w.float()).to(dtype)), (dtype, dim)
        full = torch.randint(-3, 4, (4, 6, 16), generator=gen).to(dtype)
        fulls = [torch.empty_like(full) for _ in range(2)]
        dist.all_gather(fulls, full)
        total = sum(f.float() @ b.float() for f in fulls)
        for dim in (0, 1):
            for op, scale in (("sum", 1), ("avg", 2)):
                got = torch.ops.symmem.fused_matmul_reduce_scatter(full, b, op, dim, g)
                want = (total / scale).chunk(2, dim)[rank].to(dtype)
                assert torch.equal(got, want), (dtype, dim, op)
    dist.barrier()
    dist.destroy_process_group()  # (gloo's threads end before the interpreter does)
    print("ok")
""")


def test_symm_mem_compatible_fused_ops_on_two_ranks(tmp_path):
    # Two gloo ranks (the ops' CPU kernels): the ranks' blocks land in rank order along the gathered
    # or scattered dim, and avg divides by the group size.
    path = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, "-c", COMPAT_TWO_RANKS, str(r), path], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=dict(os.environ)) for r in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0 and out.strip().endswith("ok"), out
