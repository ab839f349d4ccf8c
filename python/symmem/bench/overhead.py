"""Where the host time of one symmem.torch call goes (microseconds per call, wall clock over
`--calls` back-to-back calls; a row that reaches the GPU's own time is GPU-bound):

    torchrun --nproc-per-node 2 -m symmem.bench.overhead
"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def _per_call(fn, calls):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / calls


class _NoCore:
    def all_reduce(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--elements", type=int, default=32 * 8192)
    args = parser.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    import symmem.torch as st
    from symmem import _native
    from symmem.torch import ops
    g = dist.group.WORLD.group_name
    comm = st.Communicator()
    core = comm.core
    h = core._handle
    x = st.empty(args.elements, dtype=torch.bfloat16)
    x.normal_()
    xl = torch.randn(args.elements, device="cuda").bfloat16()
    stream = torch._C._cuda_getCurrentRawStream(comm.device)
    lib = _native.lib
    rows = [
        ("ctypes, no arguments (symmem_comm_rank)", lambda: lib.symmem_comm_rank(h)),
        ("ctypes + C++ entry, count 0 (symmem_all_reduce)",
         lambda: lib.symmem_all_reduce(h, x.data_ptr(), x.data_ptr(), 0, 2, 0, stream, 0, 0, -1)),
        ("torch.empty_like", lambda: torch.empty_like(xl)),
        ("current raw stream", lambda: torch._C._cuda_getCurrentRawStream(comm.device)),
        ("C call, symmetric in place (core.all_reduce)",
         lambda: core.all_reduce(x.data_ptr(), x.data_ptr(), x.numel(), 2, 0, stream)),
        ("Python kernel, symmetric in place (ops._all_reduce_inplace_cuda)",
         lambda: ops._all_reduce_inplace_cuda(x, "sum", g)),
        ("drop-in, symmetric in place (symmem.torch.all_reduce)", lambda: st.all_reduce(x)),
        ("op through the dispatcher, in place (torch.ops.symmem.all_reduce_)",
         lambda: torch.ops.symmem.all_reduce_(x, "sum", g)),
        ("op through the dispatcher, out of place (torch.ops.symmem.all_reduce)",
         lambda: torch.ops.symmem.all_reduce(x, "sum", g)),
        ("TPAllReduce.all_reduce, caching-allocator tensor", lambda: tp.all_reduce(xl)),
    ]
    tp = st.TPAllReduce(dist.group.WORLD)
    results = [(name, _per_call(fn, args.calls)) for name, fn in rows]
    comm.core = _NoCore()
    results.append(("Python kernel without the C call", _per_call(lambda: ops._all_reduce_inplace_cuda(x, "sum", g),
                                                                   args.calls)))
    results.append(("dispatcher + Python kernel without the C call",
                    _per_call(lambda: torch.ops.symmem.all_reduce_(x, "sum", g), args.calls)))
    comm.core = core
    graph_time = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph_time[0].record()
    for _ in range(200):
        core.all_reduce(x.data_ptr(), x.data_ptr(), x.numel(), 2, 0, stream)
    graph_time[1].record()
    graph_time[1].synchronize()
    if dist.get_rank() == 0:
        for name, us in results:
            print(f"{us:8.2f} us  {name}")
        print(f"{graph_time[0].elapsed_time(graph_time[1]) * 1000 / 200:8.2f} us  GPU events around 200 C calls")
    dist.barrier()


if __name__ == "__main__":
    main()
