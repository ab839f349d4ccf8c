"""All-gather bandwidth against the SM budget: symmem.triton's example kernel against symmem's CUDA
pull kernel, NCCL, and the same Triton kernel reaching peers through PyTorch's symmetric memory
(rendezvous tables) instead of symmem's heap; the Iris plot (GB/s against SM count per fp16 shape).

    torchrun --nproc-per-node 2 -m symmem.bench.kernels --out results

Rows (impl), each with `sms` SMs (blocks, programs or CTAs):
  symmem_cuda_pull         symmem's all_gather, Algo pull, blocks = sms (symmetric input, local output)
  symmem_triton_pull       symmem.triton.examples.all_gather(mode="pull", programs=sms)
  symmem_triton_push       the same, mode="push" (symmetric output)
  torch_symm_mem_triton    the Triton pull kernel on a torch symm_mem buffer, peers from rendezvous()'s
                           buffer_ptrs_dev (skipped, and said so, where torch's symmetric memory does not run)
  nccl                     all_gather_into_tensor on a group whose NCCL communicator has
                           min_ctas = max_ctas = sms (one group per SM count)
Shapes are fp16 per rank (Iris's): 2048x4096, 8192x8192, 16384x16384. Each sample is `calls`
back-to-back calls between two events; the configurations of one shape take turns (ABAB...),
`reps` samples each; the CSV holds the median with its spread. busbw = bytes per rank x (world - 1)
/ time; algbw = bytes per rank x world / time. After timing every output is compared bit for bit
with symmem's CUDA result (`wrong`: elements that differ).
"""
import argparse
import datetime
import os
import statistics

import torch
import torch.distributed as dist

from ..timing import capture, replay_us, time_us
from ._results import pyplot, write_results
from ._torchrun import init_nccl
from .torch import _commit

SHAPES = [(2048, 4096), (8192, 8192), (16384, 16384)]
SMS = [4, 8, 16, 24, 32, 48, 64, 96, 132]
FIELDS = ["shape", "bytes_per_rank", "impl", "sms", "time_us", "time_min_us", "time_max_us", "algbw_gbs", "busbw_gbs",
          "wrong", "world", "gpu", "commit", "date"]


def _nccl_group(sms, cache):
    """A group of every rank whose NCCL communicator uses exactly `sms` CTAs."""
    if sms not in cache:
        options = dist.ProcessGroupNCCL.Options()
        options.config.min_ctas = sms
        options.config.max_ctas = sms
        cache[sms] = dist.new_group(backend="nccl", pg_options=options)
    return cache[sms]


def _torch_symm_mem(numel, dtype, group):
    """(buffer, its buffer_ptrs_dev as a Triton pointer) from PyTorch's symmetric memory, or (None, why)."""
    try:
        import torch.distributed._symmetric_memory as symm_mem
        buffer = symm_mem.empty(numel, dtype=dtype, device="cuda")
        handle = symm_mem.rendezvous(buffer, group.group_name)
        from symmem.triton.examples.all_gather_matmul import _Address
        return buffer, (handle, _Address(handle.buffer_ptrs_dev, torch.int64))
    except Exception as e:  # not every build runs it (NVSHMEM, driver, multicast settings)
        return None, f"{type(e).__name__}: {str(e)[:160]}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench-kernels")
    parser.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES))
    parser.add_argument("--sms", default=",".join(str(s) for s in SMS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--triton-bytes-per-thread", type=int, default=None,
                        help="the Triton kernels' tile: bytes per thread (default: the example's)")
    parser.add_argument("--triton-warps", type=int, default=16)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--graph", action="store_true",
                        help="time replays of a CUDA graph of `calls` calls (the kernels' GPU time, without the "
                             "host's launch cost, which bounds small eager Triton calls)")
    parser.add_argument("--impls", default="symmem_cuda_pull,symmem_triton_pull,symmem_triton_push,"
                                            "torch_symm_mem_triton,nccl")
    args = parser.parse_args()
    init_nccl()
    import symmem.torch as st
    from symmem import _native
    from symmem.triton.examples import all_gather

    world, rank = dist.get_world_size(), dist.get_rank()
    group = dist.group.WORLD
    comm = st.GroupCommunicator(group)
    device_sms = torch.cuda.get_device_properties(0).multi_processor_count
    sms_list = [min(int(s), device_sms) for s in args.sms.split(",")]
    impls = args.impls.split(",")
    stream = torch.cuda.current_stream()
    pull, uint8 = _native.algo_code("pull"), _native.DTYPES["uint8"]
    nccl_groups, notes, rows = {}, [], []
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    commit, gpu = _commit(), torch.cuda.get_device_name()
    tile = {"num_warps": args.triton_warps}
    if args.triton_bytes_per_thread:
        tile["bytes_per_thread"] = args.triton_bytes_per_thread
    if rank == 0:
        notes.append("timed from CUDA graphs" if args.graph else
                     "timed eager (small Triton calls: the host's launch cost)")
        notes.append(f"Triton tiles: {args.triton_warps} warps, "
                     f"{args.triton_bytes_per_thread or 'the default'} bytes per thread")

    for shape in args.shapes.split(","):
        r, c = (int(x) for x in shape.split("x"))
        numel = r * c
        nbytes = numel * 2
        heap_in = st.empty(numel, dtype=torch.float16, group=group)
        heap_out = st.empty(world * numel, dtype=torch.float16, group=group)
        local_out = torch.empty(world * numel, dtype=torch.float16, device="cuda")
        heap_in.copy_(torch.randn(numel, device="cuda").half() + rank)
        torch_buffer, torch_table = (None, "not asked") if "torch_symm_mem_triton" not in impls else \
            _torch_symm_mem(numel, torch.float16, group)
        if torch_buffer is not None:
            torch_buffer.copy_(heap_in)
        elif "torch_symm_mem_triton" in impls and rank == 0:
            notes.append(f"torch_symm_mem_triton skipped at {shape}: {torch_table}")
        reference = torch.empty_like(local_out)
        comm.core.all_gather(reference.data_ptr(), heap_in.data_ptr(), nbytes, uint8, stream.cuda_stream, pull)

        cases = {}
        for sms in sms_list:
            if "symmem_cuda_pull" in impls:
                cases[("symmem_cuda_pull", sms)] = (lambda s=sms: comm.core.all_gather(  # (the capture's stream)
                    local_out.data_ptr(), heap_in.data_ptr(), nbytes, uint8, torch.cuda.current_stream().cuda_stream,
                    pull, s), local_out)
            if "symmem_triton_pull" in impls:
                cases[("symmem_triton_pull", sms)] = (
                    lambda s=sms: all_gather(heap_in, comm, out=local_out, programs=s, mode="pull", **tile), local_out)
            if "symmem_triton_push" in impls:
                cases[("symmem_triton_push", sms)] = (
                    lambda s=sms: all_gather(heap_in, comm, out=heap_out, programs=s, mode="push", **tile), heap_out)
            if torch_buffer is not None:
                cases[("torch_symm_mem_triton", sms)] = (
                    lambda s=sms: all_gather(torch_buffer, comm, out=local_out, programs=s, mode="pull",
                                             table=torch_table[1], **tile), local_out)
            if "nccl" in impls:
                nccl_group = _nccl_group(sms, nccl_groups)
                cases[("nccl", sms)] = (lambda g=nccl_group: dist.all_gather_into_tensor(local_out, heap_in, group=g),
                                        local_out)
        samples = {key: [] for key in cases}
        for key, (fn, _) in cases.items():  # warm up: compile, build communicators
            fn()
        torch.cuda.synchronize()
        graphs = {key: capture(fn, args.calls) for key, (fn, _) in cases.items()} if args.graph else {}
        for key in graphs:
            graphs[key].replay()  # its first replay uploads it
        torch.cuda.synchronize()
        for _ in range(args.reps):
            for key, (fn, _) in cases.items():  # ABAB: drift hits every configuration alike
                dist.barrier(group)
                torch.cuda.synchronize()
                samples[key].append(replay_us(graphs[key], 2, args.calls) if args.graph else time_us(fn, args.calls))
        comm.check()
        for (impl, sms), (fn, out) in cases.items():
            out.fill_(float("nan"))
            if args.graph:
                graphs[(impl, sms)].replay()  # what was timed: the captured calls
            else:
                fn()
            torch.cuda.synchronize()
            wrong = int((out.view(torch.int16) != reference.view(torch.int16)).sum().item())
            times = torch.tensor(samples[(impl, sms)], device="cuda")
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank's sample
            us = statistics.median(times.tolist())
            rows.append({"shape": shape, "bytes_per_rank": nbytes, "impl": impl, "sms": sms, "time_us": us,
                         "time_min_us": min(times.tolist()), "time_max_us": max(times.tolist()),
                         "algbw_gbs": nbytes * world / us / 1e3, "busbw_gbs": nbytes * (world - 1) / us / 1e3,
                         "wrong": wrong, "world": world, "gpu": gpu, "commit": commit, "date": date})
        # Every graph goes before the teardown: a graph that outlives destroy_process_group (a loop
        # variable keeping the last NCCL graph alive) was seen to hang the process after its results.
        graphs.clear()
        del heap_in, heap_out, torch_buffer, graphs
    if rank == 0:
        text = [f"all-gather against the SM budget: world {world}, {gpu}, commit {commit}, {date}"] + notes
        text += [f"{r['shape']:>12} {r['impl']:>22} sms={r['sms']:>3} {r['time_us']:10.1f} us "
                 f"busbw {r['busbw_gbs']:7.1f} GB/s wrong {r['wrong']}" for r in rows]
        print("\n".join(text), flush=True)
        write_results(args.out, f"kernels_{world}", FIELDS, rows, "\n".join(text), _plot)
    dist.barrier()
    st.close_all()
    dist.destroy_process_group()


def _plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for impl in dict.fromkeys(r["impl"] for r in rows):
            points = sorted((r["sms"], r["busbw_gbs"]) for r in rows if r["shape"] == shape and r["impl"] == impl)
            if points:
                ax.plot(*zip(*points), marker="o", label=impl)
        ax.set_title(f"fp16 {shape} per rank")
        ax.set_xlabel("SMs (blocks / programs / CTAs)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    world, gpu = rows[0]["world"], rows[0]["gpu"]
    fig.suptitle(f"all-gather vs SM budget, {world} x {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    main()
