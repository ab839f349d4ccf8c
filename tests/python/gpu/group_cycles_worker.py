"""A job of its own (test_torch_layer_gpu.py): RANK WORLD DIR. Destroys and re-creates its world
group 20 times with symmetric tensors, a pool, FSDP's comms, the fused op's workspace, a CUDA graph
and an async Work alive during each cycle, and checks:

- the device memory and the thread count after the last cycle are what they were after the first
  (on 8ad5a53: 1514 MiB and 5 threads leaked in four cycles: the old communicators were dropped,
  never released);
- the pool of a re-created group is its own (on 8ad5a53: the destroyed group's, bound to a dead
  communicator);
- a graph that captured a call keeps its communicator's memory mapped after the group is gone (it
  replays), and the memory returns once the graph is deleted;
- a failure to build a communicator is not remembered past its group (on 8ad5a53 it kept symmem
  off for the group's name for the rest of the process).
"""
import gc
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.cuda.set_device(rank)
device = torch.device("cuda", rank)
MiB = 1 << 20


def used_bytes():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return total - free


def os_threads():
    return len(os.listdir("/proc/self/task"))


def init(cycle):
    store = dist.FileStore(os.path.join(folder, f"store-{cycle}"), world)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)


def say(*args):
    print(f"rank {rank}:", *args, flush=True)


def cycle(i):
    import symmem.torch as st
    from symmem.torch import fsdp
    init(i)
    group = dist.group.WORLD
    x = st.empty(8 * MiB // 2, dtype=torch.bfloat16)
    x.fill_(1)
    st.all_reduce(x)
    assert bool((x == world).all()), "all-reduce of a symmetric tensor"
    pool = st.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        pooled = torch.ones(1 * MiB, device=device)
    check(st.in_heap(pooled), f"cycle {i}: a pool tensor is not in this group's heap (the dead group's pool)")
    st.all_reduce(pooled)
    rs = fsdp.SymmemReduceScatter(group)
    lent = rs.allocate((world * 4096,), dtype=torch.bfloat16, device="cuda")
    assert st.in_heap(lent)
    lent.fill_(2)
    out = torch.empty(4096, dtype=torch.bfloat16, device=device)
    rs(out, lent, group, dist.ReduceOp.SUM)
    work = st.all_reduce(torch.ones(1000, device=device), async_op=True)
    work.wait()
    a = torch.ones(256, 512, dtype=torch.float16, device=device)
    b = torch.ones(512, 256, dtype=torch.float16, device=device)
    c, _ = st.all_gather_matmul(a, b)
    assert bool((c == 512).all()), "all_gather_matmul"
    torch.cuda.synchronize()
    assert bool((out == 2 * world).all()), "FSDP reduce-scatter"
    del x, pooled, pool, rs, lent, out, work, a, b, c
    dist.destroy_process_group()


def graph_outlives_its_group(i):
    """A graph captured in a cycle, replayed after the group is destroyed, then deleted."""
    import symmem.torch as st
    init(i)
    y = torch.ones(4 * MiB, device=device)
    st.all_reduce(y)
    comm = st.GroupCommunicator()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        st.all_reduce(y)
    assert comm.core.live_graphs == 1
    dist.destroy_process_group()
    st.release_unused()
    assert comm.closed and comm.core._handle is not None, "released while a graph references it"
    if world == 1:  # no peer is needed: the graph replays on mapped memory
        y.fill_(3)
        graph.replay()
        torch.cuda.synchronize()
        assert bool((y == 3).all())
    del graph
    torch.cuda.synchronize()
    for _ in range(500):  # CUDA destroys a graph's user objects asynchronously, soon after the graph
        st.release_unused()
        if comm.core._handle is None:
            break
        time.sleep(0.01)
    assert comm.core._handle is None, "not released once the graph was gone"


def failure_is_not_kept(i):
    import symmem.torch as st
    os.environ["SYMMEM_WORKSPACE_MB"] = "0"  # too small a workspace: creation fails on every rank
    init(i)
    try:
        st.GroupCommunicator()
        raise SystemExit("a communicator was built with a zero workspace")
    except st.SymmemError as e:
        say("creation failed as expected:", str(e)[:120])
    dist.destroy_process_group()
    del os.environ["SYMMEM_WORKSPACE_MB"]
    init(i + 1)
    st.GroupCommunicator()  # the same group name, made again: built
    dist.destroy_process_group()


failures = []


def check(condition, message):
    """Records a failed check and goes on, so that one run shows every scenario that fails."""
    if not condition:
        failures.append(message)
        say("FAILED:", message)


def attempt(what, fn, *args):
    try:
        fn(*args)
    except BaseException as e:  # noqa: B036 (reported, then the next scenario runs)
        check(False, f"{what} raised {type(e).__name__}: {e}")
        if dist.is_initialized():
            dist.destroy_process_group()


def main():
    cycle(0)  # warm-up: CUDA context, NCCL, cuBLAS, the caching allocator
    baseline_bytes, baseline_threads = used_bytes(), os_threads()
    say(f"after the first cycle: {baseline_bytes / MiB:.0f} MiB used, {baseline_threads} threads")
    for i in range(1, 21):
        attempt(f"cycle {i}", cycle, i)
    # (no symmem call since the last group died: what it held was released by itself)
    grown = used_bytes() - baseline_bytes
    threads = os_threads() - baseline_threads
    say(f"after 20 cycles: {grown / MiB:+.0f} MiB, {threads:+d} threads against the first cycle")
    check(grown <= 64 * MiB, f"{grown / MiB:.0f} MiB of device memory leaked over 20 cycles")
    check(threads <= 0, f"{threads} threads leaked ({threading.active_count()} Python threads)")
    attempt("a graph outliving its group", graph_outlives_its_group, 21)
    attempt("a failure to build, then the group made again", failure_is_not_kept, 22)
    if failures:
        say(f"{len(failures)} checks failed")
        sys.exit(1)
    say("cycles ok")


main()
