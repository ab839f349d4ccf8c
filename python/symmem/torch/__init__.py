"""symmem for PyTorch: collectives on torch tensors and process groups.

    import symmem.torch as st
    st.all_reduce(t, group=tp_group)                      # torch.distributed signature
    y = torch.ops.symmem.all_reduce(x, "sum", tp_group.group_name)   # the op, graph/compile safe
    buf = st.empty(4096, 8192, dtype=torch.bfloat16)        # symmetric: zero-copy collectives
    ar = st.TPAllReduce(tp_group); y = ar.all_reduce(x)     # vLLM-style
    c, _ = st.all_gather_matmul(a_shard, w, group=tp_group)  # fused all-gather + GEMM
    c_shard = st.matmul_reduce_scatter(a, w, group=tp_group)  # fused GEMM + reduce-scatter

See docs/torch.md. Every rank must be one process per GPU of one node, with its device set
(torch.cuda.set_device) before the first call on a group. A group is a ProcessGroup or its name
(None: the default group) everywhere.
"""
import warnings

from .errors import SymmemError  # first: symmem's errors become DistBackendErrors
from . import all_to_all, fused, moe, ops, symm_mem_compat  # noqa: F401  register torch.ops.symmem.*
from .fused import all_gather_matmul, all_gather_matmul_input, matmul_reduce_scatter
from .functional import all_gather, all_gather_into_tensor, all_reduce, reduce_scatter_tensor
from .groups import GroupCommunicator, close_all, release_unused
from .memory import empty, in_heap, is_symmetric, mem_pool
from .tp_all_reduce import TPAllReduce
from .work import Work

__all__ = ["GroupCommunicator", "SymmemError", "TPAllReduce", "Work", "all_gather", "all_gather_matmul",
           "all_gather_matmul_input", "all_gather_into_tensor", "all_reduce", "close_all", "empty", "in_heap",
           "is_symmetric", "matmul_reduce_scatter", "mem_pool", "ops", "reduce_scatter_tensor", "release_unused"]


def __getattr__(name):
    if name == "Communicator":  # the former name of GroupCommunicator (symmem.Communicator is the core's)
        warnings.warn("symmem.torch.Communicator is deprecated: it is symmem.torch.GroupCommunicator",
                      DeprecationWarning, stacklevel=2)
        return GroupCommunicator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
