"""MoE token dispatch and combine: symmem against the references, in one run on the same GPUs, at
DeepSeek-V3's shape (hidden 7168, top-8 of 256 experts) for decode (1 and 128 tokens per rank) and
prefill (4096), eager and replayed from CUDA graphs, interleaved.

    torchrun --nproc-per-node 2 -m symmem.bench.moe --out results
    torchrun --nproc-per-node 2 -m symmem.bench.moe --shapes decode_128 --blocks 32,24,48,132   # SM budgets

Rows (impl), each timed as dispatch and as combine separately:
  symmem_expert_major   symmem.torch.moe.ExpertParallel, layout expert_major (vLLM BatchedExperts;
                        decode only: its receive area holds world x T rows per local expert)
  symmem_rank_major     the same, layout rank_major (vLLM Standard)
  nccl_host_sync        Megatron's all-to-all dispatcher: tokens sorted by expert, the per-rank
                        counts exchanged and copied to the host (a synchronisation), then
                        torch.distributed.all_to_all_single of rows (and scales); combine the same
                        back, then the weighted sum
  vllm_ag_rs            vLLM's default all2all backend (allgather_reducescatter): all_gather of the
                        tokens, ids and weights; combine = reduce_scatter of the weighted outputs
  torch_vdev_2d         torch.ops.symm_mem.all_to_all_vdev_2d after sorting the (token, expert) pairs
                        by expert (TorchTitan's path; NVSHMEM), combine all_to_all_vdev_2d_offset,
                        unsort, weighted sum; bf16 only; skipped, with the reason in the .txt,
                        where torch's NVSHMEM backend fails
Payloads: bf16, and fp8 e4m3 with one float32 scale per 128 columns (dispatch; combine is bf16).
Routing: every rank draws top-8 distinct experts per token uniformly (fixed seed per rank).

Timing. Eager: `calls` back-to-back calls between two CUDA events. Graph: one graph of 10 calls
replayed `replays` times. All (impl, op, mode) configurations take turns (ABAB...), `reps` samples
each; the slowest rank's time of each sample; the CSV holds the median and the spread.

Bandwidth, as DeepEP defines it (docs/legacy.md, "normal kernels"): the bytes this rank receives
(every (token, expert) pair for expert-major, every (token, rank) pair for rank-major and for the
reference rows, the local ones included; fp8 rows with their scales; combine in bf16) divided by
the time; reported per rank (rank 0's bytes over the slowest rank's time). The CSV columns
dispatch_bytes and combine_bytes give the numerators, so other definitions can be computed.

Checks: after timing, every row's combined output (experts: out = x * (1 + local expert), weighted
by the router) is compared with a float32 reference of the same routing: `wrong` counts elements
beyond 2^-5 of the reference's magnitude (the bf16 roundings of partial rows stay far below; a
misplaced or missing row does not). nccl_host_sync cannot be captured in a graph (its counts
visit the host): its graph rows are absent, and the .txt says so.
"""
import argparse
import csv
import datetime
import os
import statistics

import torch
import torch.distributed as dist

from ..timing import capture, replay_us, time_us
from ._results import pyplot, write_results
from ._torchrun import init_nccl
from .torch import _commit

HIDDEN, TOPK, EXPERTS = 7168, 8, 256
SHAPES = {"decode_1": 1, "decode_128": 128, "prefill_4096": 4096}
FIELDS = ["date", "commit", "gpu", "world", "shape", "tokens", "payload", "impl", "op", "mode", "time_us",
          "time_min_us", "time_max_us", "dispatch_bytes", "combine_bytes", "gbps", "blocks", "wrong"]
GRAPH_CALLS = 10


class Routing:
    """One rank's tokens and routing: x (payload), scales, ids [T, K] int64, weights [T, K]."""

    def __init__(self, tokens, payload, world, rank, experts=EXPERTS, hidden=HIDDEN, topk=TOPK):
        from symmem.torch.moe import quantize_fp8
        g = torch.Generator(device="cuda").manual_seed(1000 + rank)
        self.tokens, self.payload = tokens, payload
        self.ids = torch.argsort(torch.rand(tokens, experts, generator=g, device="cuda"), dim=1)[:, :topk].contiguous()
        self.weights = torch.rand(tokens, topk, generator=g, device="cuda").softmax(dim=1).float().contiguous()
        x = torch.randn(tokens, hidden, generator=g, device="cuda")
        if payload == "float8_e4m3":
            self.x, self.scales = quantize_fp8(x)
            self.x_float = self._dequant()
        else:
            self.x, self.scales = x.to(torch.bfloat16), None
            self.x_float = self.x.float()
        self.local = experts // world

    def _dequant(self):
        from symmem.torch.moe import dequantize_fp8
        return dequantize_fp8(self.x, self.scales)

    def expected(self):
        """y[t] = sum_k w[t, k] * x[t] * (1 + local expert of k), in float32."""
        factor = (1 + self.ids % self.local).float()  # [T, K]
        return (self.weights * factor).sum(dim=1, keepdim=True) * self.x_float

    def pairs_per_rank(self, world):
        """(token, destination rank) pairs this rank sends each rank: its rank-major rows."""
        ranks = self.ids // self.local
        present = torch.zeros(self.tokens, world, dtype=torch.bool, device="cuda")
        present.scatter_(1, ranks, True)
        return present


def _wrong(got, want):
    got = got.float()
    tol = 2.0 ** -5 * want.abs().clamp(min=1.0)  # bf16 roundings of partial rows; a wrong row is off by O(1)
    return int(((got - want).abs() > tol).sum())


class Impl:
    """An implementation: dispatch(), combine() (after a dispatch), output() (the last combine),
    blocks, dispatch_bytes / combine_bytes received by this rank."""

    blocks = -1


class Symmem(Impl):
    def __init__(self, r, group, layout, blocks=-1):
        from symmem.torch.moe import ExpertParallel
        self.r = r
        world = group.size()
        self.ep = ExpertParallel(group, num_experts=EXPERTS, topk=TOPK, hidden=HIDDEN, max_tokens_per_rank=r.tokens,
                                 payload=r.payload, layout=layout, max_blocks=blocks)
        self.blocks = self.ep.blocks  # what the kernels take (max_blocks -1: the library's choice)
        self.out = torch.empty(r.tokens, HIDDEN, dtype=torch.bfloat16, device="cuda")
        self.layout = layout
        self.world = world
        self.dispatch()
        torch.cuda.synchronize()
        rec = self.received = self.ep.dispatch(r.x, r.ids, r.weights, x_scales=r.scales)
        torch.cuda.synchronize()
        # Fake experts, once: combine_input = x * (1 + local expert) (rank-major: weighted and summed).
        if layout == "expert_major":
            for e in range(self.ep.local_experts):
                n = int(rec.expert_num_tokens[e])
                self.ep.combine_input[e, :n] = (self._rows(rec, e, n) * (1 + e)).to(torch.bfloat16)
            rows = int(rec.expert_num_tokens.sum())
        else:
            n = int(rec.num_rows[0])
            x = self._rows(rec, None, n)
            ids, w = rec.topk_idx[:n].long(), rec.topk_weights[:n]
            factor = torch.where(ids >= 0, w * (1 + ids.clamp(min=0)).float(), torch.zeros_like(w)).sum(dim=1)
            self.ep.combine_input[:n] = (x * factor.unsqueeze(1)).to(torch.bfloat16)
            rows = n
        row_bytes = HIDDEN * (1 if r.payload == "float8_e4m3" else 2) + (HIDDEN // 128 * 4 if r.scales is not None else 0)
        self.dispatch_bytes, self.combine_bytes = rows * row_bytes, rows * HIDDEN * 2

    def _rows(self, rec, e, n):
        from symmem.torch.moe import dequantize_fp8
        x = rec.x[e, :n] if e is not None else rec.x[:n]
        if self.r.payload == "float8_e4m3":
            s = rec.x_scales[e, :n] if e is not None else rec.x_scales[:n]
            return dequantize_fp8(x, s)
        return x.float()

    def dispatch(self):
        self.ep.dispatch(self.r.x, self.r.ids, self.r.weights, x_scales=self.r.scales)

    def combine(self):
        self.ep.combine(out=self.out)

    def output(self):
        return self.out

    def close(self):
        self.received = None  # tensors over the context's memory: dropped, so that close() frees it
        self.ep.close()


class NcclHostSync(Impl):
    """Rows per (token, destination rank), as symmem's rank-major; counts through the host."""

    def __init__(self, r, group):
        self.r, self.group, self.world = r, group, group.size()
        present = r.pairs_per_rank(self.world)  # [T, W]
        pairs = present.t().nonzero()  # rank-major order: destination rank, then token
        self.dest, self.token_of = pairs[:, 0], pairs[:, 1]
        self.send = present.sum(dim=0)
        self.out = torch.empty(r.tokens, HIDDEN, dtype=torch.bfloat16, device="cuda")
        self.dispatch()
        torch.cuda.synchronize()
        received = int(sum(self.recv_counts))
        scale_bytes = HIDDEN // 128 * 4 if r.scales is not None else 0
        self.dispatch_bytes = received * (HIDDEN * (1 if r.scales is not None else 2) + scale_bytes)
        self.combine_bytes = received * HIDDEN * 2
        # The experts' partial rows (the receiver's local experts of each row, weighted), computed
        # where the routing is and moved to the receivers once, outside timing: combine then moves
        # the same bytes back as a real expert computation would produce them.
        local = r.local
        partial = torch.zeros((len(self.token_of), HIDDEN), device="cuda")
        for k in range(TOPK):
            e = r.ids[self.token_of, k]
            factor = torch.where(e // local == self.dest, r.weights[self.token_of, k] * (1 + e % local).float(),
                                 torch.zeros(len(e), device="cuda"))
            partial += factor.unsqueeze(1) * r.x_float[self.token_of]
        partial = partial.to(torch.bfloat16)
        self.partials = partial.new_empty((received, HIDDEN))
        dist.all_to_all_single(self.partials, partial, self.recv_counts, self.send_counts, group=self.group)

    def dispatch(self):
        counts = torch.empty_like(self.send)
        dist.all_to_all_single(counts, self.send, group=self.group)
        self.send_counts, self.recv_counts = self.send.tolist(), counts.tolist()  # the host synchronisation
        rows = self.r.x[self.token_of]
        as_bytes = rows.dtype == torch.float8_e4m3fn
        received = rows.new_empty((sum(self.recv_counts), HIDDEN))
        dist.all_to_all_single(received.view(torch.uint8) if as_bytes else received,
                               rows.view(torch.uint8) if as_bytes else rows, self.recv_counts, self.send_counts,
                               group=self.group)
        if self.r.scales is not None:
            s = self.r.scales[self.token_of]
            received_scales = s.new_empty((sum(self.recv_counts), s.shape[1]))
            dist.all_to_all_single(received_scales, s, self.recv_counts, self.send_counts, group=self.group)

    def combine(self):
        back = self.partials.new_empty((sum(self.send_counts), HIDDEN))
        dist.all_to_all_single(back, self.partials, self.send_counts, self.recv_counts, group=self.group)
        acc = torch.zeros((self.r.tokens, HIDDEN), device="cuda")
        acc.index_add_(0, self.token_of, back.float())
        self.out.copy_(acc)

    def output(self):
        return self.out

    def close(self):
        pass


class VllmAllGatherReduceScatter(Impl):
    def __init__(self, r, group):
        self.r, self.group, self.world = r, group, group.size()
        self.rank = group.rank()
        t = r.tokens
        self.gx = torch.empty((self.world * t, HIDDEN), dtype=torch.uint8 if r.scales is not None else torch.bfloat16,
                              device="cuda")
        self.gids = torch.empty((self.world * t, TOPK), dtype=torch.int64, device="cuda")
        self.gw = torch.empty((self.world * t, TOPK), dtype=torch.float32, device="cuda")
        self.gs = torch.empty((self.world * t, HIDDEN // 128), device="cuda") if r.scales is not None else None
        self.out = torch.empty(t, HIDDEN, dtype=torch.bfloat16, device="cuda")
        self.dispatch()
        torch.cuda.synchronize()
        local = r.local
        mine = (self.gids // local) == self.rank
        factor = torch.where(mine, self.gw * (1 + self.gids % local).float(), torch.zeros_like(self.gw)).sum(dim=1)
        x = self.gx.view(torch.float8_e4m3fn) if r.scales is not None else self.gx
        if r.scales is not None:
            from symmem.torch.moe import dequantize_fp8
            xf = dequantize_fp8(x, self.gs)
        else:
            xf = x.float()
        self.partials = (xf * factor.unsqueeze(1)).to(torch.bfloat16)
        self.dispatch_bytes = self.world * t * (HIDDEN * (1 if r.scales is not None else 2))
        self.combine_bytes = self.world * t * HIDDEN * 2

    def dispatch(self):
        r = self.r
        dist.all_gather_into_tensor(self.gx, r.x.view(torch.uint8) if r.scales is not None else r.x, group=self.group)
        dist.all_gather_into_tensor(self.gids, r.ids, group=self.group)
        dist.all_gather_into_tensor(self.gw, r.weights, group=self.group)
        if self.gs is not None:
            dist.all_gather_into_tensor(self.gs, r.scales, group=self.group)

    def combine(self):
        dist.reduce_scatter_tensor(self.out, self.partials, group=self.group)

    def output(self):
        return self.out

    def close(self):
        pass


class TorchVdev2d(Impl):
    """TorchTitan's path: pairs sorted by expert (rank-major), torch.ops.symm_mem.all_to_all_vdev_2d
    into an expert-major output; combine all_to_all_vdev_2d_offset back, unsort, weighted sum."""

    def __init__(self, r, group):
        import torch.distributed._symmetric_memory as symm_mem
        symm_mem.set_backend("NVSHMEM")  # before any symm_mem allocation of this process
        self.r, self.group_name = r, group.group_name
        world, t = group.size(), r.tokens
        flat = r.ids.reshape(-1)
        self.order = torch.argsort(flat, stable=True)
        self.token_of = self.order // TOPK
        counts = torch.bincount(flat, minlength=EXPERTS)
        dtype = torch.uint8 if r.scales is not None else torch.bfloat16  # fp8 rows as bytes
        self.inp = symm_mem.empty((t * TOPK, HIDDEN), dtype=dtype, device="cuda")
        self.out = symm_mem.empty((world * t * TOPK + r.local, HIDDEN), dtype=dtype, device="cuda")
        self.expert_out = symm_mem.empty((world * t * TOPK + r.local, HIDDEN), dtype=torch.bfloat16, device="cuda")
        self.back = symm_mem.empty((t * TOPK, HIDDEN), dtype=torch.bfloat16, device="cuda")
        self.in_splits = symm_mem.empty(EXPERTS, dtype=torch.int64, device="cuda")
        self.oso = symm_mem.empty((2, EXPERTS), dtype=torch.int64, device="cuda")
        self.oso_back = symm_mem.empty((2, EXPERTS), dtype=torch.int64, device="cuda")
        for buf in (self.inp, self.out, self.expert_out, self.back, self.in_splits, self.oso, self.oso_back):
            symm_mem.rendezvous(buf, self.group_name)
        self.in_splits.copy_(counts)
        self.out_tokens = torch.empty(t, HIDDEN, dtype=torch.bfloat16, device="cuda")
        self.dispatch()
        torch.cuda.synchronize()
        # Fake experts on what arrived (expert-major, offsets from the call): x (1 + local expert).
        splits, offsets = self.oso[0].tolist(), self.oso[1].tolist()
        received = self.out.view(torch.float8_e4m3fn).float() if r.scales is not None else self.out.float()
        self.expert_out.zero_()
        for k, (n, at) in enumerate(zip(splits, offsets)):
            e = k // world  # expert-major: k = e * world + source
            self.expert_out[at:at + n] = (received[at:at + n] * (1 + e)).to(torch.bfloat16)
        rows = sum(splits)
        self.dispatch_bytes = rows * HIDDEN * (1 if r.scales is not None else 2)
        self.combine_bytes = rows * HIDDEN * 2

    def dispatch(self):
        r = self.r
        rows = r.x[self.token_of]
        self.inp.copy_(rows.view(torch.uint8) if r.scales is not None else rows)
        torch.ops.symm_mem.all_to_all_vdev_2d(self.inp, self.out, self.in_splits, self.oso, self.group_name, 1)

    def combine(self):
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(self.expert_out, self.back, self.oso, self.oso_back,
                                                     self.group_name)
        unsorted = torch.empty_like(self.back)
        unsorted[self.order] = self.back
        w = self.r.weights.unsqueeze(-1)
        self.out_tokens.copy_((unsorted.view(self.r.tokens, TOPK, HIDDEN).float() * w).sum(dim=1))

    def output(self):
        return self.out_tokens

    def close(self):
        pass


def _time(fn, mode, calls, replays, graphs, key):
    """Microseconds per call of fn (eager: `calls` calls; graph: replays of a graph of 10)."""
    if mode == "graph":
        g = graphs.get(key)
        if g is None:
            g = capture(fn, GRAPH_CALLS)
            graphs[key] = g
            g.replay()  # the first replay uploads the graph
        return replay_us(g, replays, GRAPH_CALLS)
    return time_us(fn, calls)


def _slowest(us):
    t = torch.tensor([us], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="moe_results")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--payloads", default="bfloat16,float8_e4m3")
    p.add_argument("--impls", default="symmem_expert_major,symmem_rank_major,nccl_host_sync,vllm_ag_rs,torch_vdev_2d")
    p.add_argument("--modes", default="eager,graph")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--replays", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--blocks", default="-1",
                   help="symmem's SM budget (max_blocks; -1, the default: the library's choice), a list "
                        "(--blocks=-1,32,64: with '=' when it starts with -1): rows beyond the first are named "
                        "IMPL_bN (IMPL_auto for -1); the CSV's blocks column says what the kernels took")
    p.add_argument("--stem", default=None, help="the figure's file name with --replot (default moe)")
    p.add_argument("--replot", nargs="+", metavar="CSV",
                   help="no measurement: the figure of these CSVs (e.g. runs of two commits) as OUT/STEM.png")
    args = p.parse_args()
    if args.replot:
        _plot([r for path in args.replot for r in csv.DictReader(open(path))],
              os.path.join(args.out, f"{args.stem or 'moe'}.png"))
        return
    budgets = [int(b) for b in args.blocks.split(",")]
    init_nccl()
    import symmem.torch as st  # noqa: F401  (registers the ops)
    group = dist.group.WORLD
    world, rank = group.size(), group.rank()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": _commit(),
            "gpu": torch.cuda.get_device_name(), "world": world}
    rows, notes = [], []
    for shape in args.shapes.split(","):
        tokens = SHAPES[shape]
        for payload in args.payloads.split(","):
            r = Routing(tokens, payload, world, rank)
            impls = {}
            for name in args.impls.split(","):
                if name == "symmem_expert_major" and tokens > 128:
                    continue  # its receive area: world x T rows per local expert (decode)
                if name in ("symmem_expert_major", "symmem_rank_major"):  # symmem that cannot run: fatal
                    for i, b in enumerate(budgets):
                        label = name if i == 0 else f"{name}_auto" if b == -1 else f"{name}_b{b}"
                        impls[label] = Symmem(r, group, name[len("symmem_"):], b)
                    continue
                try:
                    if name == "nccl_host_sync":
                        impls[name] = NcclHostSync(r, group)
                    elif name == "vllm_ag_rs":
                        impls[name] = VllmAllGatherReduceScatter(r, group)
                    elif name == "torch_vdev_2d":
                        if payload != "bfloat16":
                            notes.append(f"{shape} {payload} torch_vdev_2d: bf16 only (torch's path moves no scales)")
                            continue
                        impls[name] = TorchVdev2d(r, group)
                except Exception as e:  # noqa: BLE001 (a reference that cannot run is reported, not fatal)
                    notes.append(f"{shape} {payload} {name}: skipped: {type(e).__name__}: {e}")
            samples = {}
            graphs = {}
            configs = [(n, op, mode) for n in impls for op in ("dispatch", "combine")
                       for mode in args.modes.split(",")]
            if "nccl_host_sync" in impls and "graph" in args.modes.split(","):
                notes.append(f"{shape} {payload} nccl_host_sync: no graph rows (its split counts visit the host)")
                configs = [c for c in configs if not (c[0] == "nccl_host_sync" and c[2] == "graph")]
            for _ in range(args.reps):
                for n, op, mode in configs:
                    impl = impls[n]
                    if op == "combine":
                        impl.dispatch()  # combine follows a dispatch
                    fn = impl.dispatch if op == "dispatch" else impl.combine
                    dist.barrier()
                    us = _slowest(_time(fn, mode, args.calls, args.replays, graphs, (n, op, mode)))
                    samples.setdefault((n, op, mode), []).append(us)
            expected = r.expected()
            for n, impl in impls.items():
                impl.dispatch()
                impl.combine()
                torch.cuda.synchronize()
                wrong = torch.tensor([_wrong(impl.output()[:tokens], expected)], device="cuda")
                dist.all_reduce(wrong)
                for op in ("dispatch", "combine"):
                    for mode in args.modes.split(","):
                        if (n, op, mode) not in samples:
                            continue
                        s = samples[(n, op, mode)]
                        med = statistics.median(s)
                        nbytes = impl.dispatch_bytes if op == "dispatch" else impl.combine_bytes
                        rows.append({**meta, "shape": shape, "tokens": tokens, "payload": payload, "impl": n, "op": op,
                                     "mode": mode, "time_us": med, "time_min_us": min(s), "time_max_us": max(s),
                                     "dispatch_bytes": impl.dispatch_bytes, "combine_bytes": impl.combine_bytes,
                                     "gbps": nbytes / med / 1e3, "blocks": impl.blocks, "wrong": int(wrong.item())})
                impl.close()
            del graphs
    text = "\n".join(
        [f"# symmem MoE bench: world {world}, {meta['gpu']}, hidden {HIDDEN}, top-{TOPK} of {EXPERTS}"] +
        [f"{r['shape']:>13} {r['payload']:>12} {r['impl']:>20} {r['op']:>8} {r['mode']:>5} "
         f"{r['time_us']:9.1f} us {r['gbps']:8.1f} GB/s wrong={r['wrong']}" for r in rows] + [f"# {n}" for n in notes])
    if rank == 0:
        print(text)
        write_results(args.out, f"moe_{world}", FIELDS, rows, text, _plot)
    dist.barrier()
    dist.destroy_process_group()


def _plot(rows, path):
    """Time per call, one bar group per (shape, payload, op, mode), one bar per implementation (per
    implementation and commit when the rows come from several commits; repeated runs: the median of
    their medians)."""
    plt = pyplot()
    if plt is None:
        return
    several = len({r["commit"] for r in rows}) > 1
    times = {}  # (bar, key) -> [time_us of each run]
    for r in rows:
        bar = f"{r['impl']} @ {r['commit']}" if several else r["impl"]
        times.setdefault((bar, (r["shape"], r["payload"], r["op"], r["mode"])), []).append(float(r["time_us"]))
    keys = sorted({k for _, k in times})
    bars = sorted({b for b, _ in times})
    fig, ax = plt.subplots(figsize=(max(8, len(keys) * 0.6 * max(1, len(bars) / 3)), 4))
    width = 0.8 / max(1, len(bars))
    for i, bar in enumerate(bars):
        ys = [statistics.median(times[(bar, k)]) if (bar, k) in times else 0 for k in keys]
        ax.bar([j + i * width for j in range(len(keys))], ys, width, label=bar)
    ax.set_xticks([j + 0.4 for j in range(len(keys))])
    ax.set_xticklabels(["\n".join(k) for k in keys], fontsize=6)
    ax.set_ylabel("us per call (slowest rank)")
    ax.set_yscale("log")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
