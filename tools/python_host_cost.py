"""Host cost of the layers of a symmem.torch call that need no GPU, per call on this CPU: the
dispatcher calling a Python kernel, symmem's in-place all-reduce kernel against a stand-in core,
a trivial ctypes call, and a few tensor attribute reads. (On a GPU machine,
`torchrun --nproc-per-node 2 -m symmem.bench.overhead` measures the whole path.)

    PYTHONPATH=python python3 tools/python_host_cost.py
"""
import os, tempfile, time, torch, torch.distributed as dist
path = os.path.join(tempfile.mkdtemp(), "s")
dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
import symmem.torch as st
from symmem.torch import ops, _groups
from symmem import _native
class Core:
    _handle = None
    def all_reduce(self, *a): pass
class C:
    device, world, group_name = -1, 2, "fake"
    core = Core()
_groups._by_name["fake"] = C()
ops._stream_of = lambda d: 0
x = torch.randn(1024)
lib = torch.library.Library("proftest", "DEF")
lib.define("noop_(Tensor(a!) x, str op, str g) -> ()")
lib.impl("noop_", lambda x, op, g: None, "CPU")
def t(name, fn, n=100000):
    for _ in range(1000): fn()
    s = time.perf_counter()
    for _ in range(n): fn()
    print(f"{(time.perf_counter()-s)/n*1e6:7.3f} us  {name}")
t("python kernel body (in place, recording core)", lambda: ops._all_reduce_inplace_cuda(x, "sum", "fake"))
t("dispatcher -> no-op Python kernel", lambda: torch.ops.proftest.noop_(x, "sum", "fake"))
op = torch.ops.proftest.noop_.default
t("dispatcher (OpOverload) -> no-op Python kernel", lambda: op(x, "sum", "fake"))
t("ctypes symmem_comm_rank(NULL)", lambda: _native.lib.symmem_comm_rank(None))
t("x.data_ptr()", lambda: x.data_ptr())
t("x.is_contiguous()", lambda: x.is_contiguous())
t("x.get_device()", lambda: x.get_device())
t("torch.empty_like(x)", lambda: torch.empty_like(x))
# The drop-in's eager fast-path test (no dispatcher after it), here on a CPU tensor so that it stops
# at the device check: the group lookup and is_cuda, the part that does not need a GPU.
_groups._by_name[dist.group.WORLD.group_name] = C()
import symmem.torch.functional as functional
t("drop-in all_reduce fast-path test (group lookup, is_cuda)", lambda: functional._served_in_place(x, dist.ReduceOp.SUM, None))
