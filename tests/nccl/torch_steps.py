"""Unchanged PyTorch training and decoding on plain NCCL and through libsymmem_nccl.so.

scripts/gpu_nccl_shim.sh (its step "torch") runs this under torchrun, once plainly and with the
shim preloaded (LD_PRELOAD), then compares them:

  torchrun --nproc-per-node 2 tests/nccl/torch_steps.py --out OUT/nccl       # each rank: OUT/nccl.rank<r>.pt
  python3 tests/nccl/torch_steps.py --compare OUT/nccl OUT/shim --ranks 2 [--routes PREFIX --mode all]

On one GPU (scripts/nccl_torch_shared_gpu.sh), every rank runs on GPU 0 (SYMMEM_TEST_SHARED_GPU=1)
with the shim in front of the stand-in NCCL, which moves no data: plain NCCL cannot run there, so
the other side of the comparison is --reference WORLD, the same parts computed in one process
without any collective (data parallelism: each rank's batch through one model, the mean of their
losses; tensor parallelism: the whole block), written as WORLD rank files:

  python3 tests/nccl/torch_steps.py --reference 4 --out OUT/reference

With --routes (the shim run's SYMMEM_NCCL_ROUTE_LOG prefix) the comparison also fails when the shim
served too little for it to mean anything: under SYMMEM_NCCL=all, no call of some collective the
steps made; under auto, nothing at all (a shim that forwards everything would otherwise pass,
comparing NCCL with itself).

What runs (fp32, deterministic algorithms, the same seeds in both runs):
  ddp      an MLP under DistributedDataParallel (bucketed gradient all-reduces), 6 SGD steps;
  fsdp2    a stack of MLP blocks under fully_shard (parameter all-gathers, gradient reduce-scatters
           with ReduceOp.AVG), 6 SGD steps;
  tp       a decoder block (attention and MLP) under parallelize_module with ColwiseParallel /
           RowwiseParallel (all-reduces of the row-parallel outputs), 6 SGD steps;
  decode   the TP block's one-token decode step captured in a CUDA graph and replayed on new inputs;
  groups   process groups split from the default one (ncclCommSplit; ranks outside a group split
           with NCCL_SPLIT_NOCOLOR): all the ranks, the lower half, the upper half, each all-reducing
           integer-valued floats, exact whatever the order (checked against the closed form).
The block's sizes divide by 1, 2, 3, 4 and 8 ranks (heads, hidden width).
Each records its losses, its full parameters (gathered) or outputs, and its step times.

The comparison holds each part to the bound of the reduction order: the two libraries may add
the ranks' contributions in different orders, which changes a sum by at most a few units in the
last place (fp32: 2^-23 relative per addition, (world - 1) additions). Over 6 SGD steps at these
learning rates that stays below REL_BOUND of each value's scale; anything larger is a wrong result,
not rounding. The reference differs from a distributed run in the same way only: its per-rank
forwards are the same products, and its gradients sum the ranks' in another order. Step times are
printed side by side (steps 2 on: the first makes communicators); these models are small and a
step's time varies between runs by more than the libraries differ: SYMMEM_TEST_TORCH_STEPS (default
6) runs more steps, for runs that compare times (the bound above is for 6).
"""
import argparse
import csv
import dataclasses
import glob
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before CUDA starts

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

STEPS = int(os.environ.get("SYMMEM_TEST_TORCH_STEPS", "6"))  # more: steadier step times
REL_BOUND = 1e-5
PARTS = ("ddp", "fsdp2", "tp", "groups")


def mlp(width, hidden):
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))


class Attention(nn.Module):
    """Causal attention whose heads follow the local width (tensor parallel: a share of the heads)."""

    def __init__(self, dim, head_dim):
        super().__init__()
        self.head_dim = head_dim
        self.q, self.k, self.v = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False), nn.Linear(
            dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (self.q(x), self.k(x), self.v(x)))
        scores = q @ k.transpose(-1, -2) / self.head_dim**0.5
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        y = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class DecoderBlock(nn.Module):
    def __init__(self, dim=768, head_dim=32, hidden=1536):  # 24 heads
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, head_dim)
        self.w1, self.w2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.w2(F.gelu(self.w1(self.norm2(x))))


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a part trains, for the distributed run and the one-process reference alike."""
    model_seed: int  # the seed its weights are made from (every rank the same)
    make: object     # () -> the model, on the CPU
    batch_seed: int  # of rank 0's batches; data parallel: rank r's from batch_seed + r
    batch: tuple     # one input's (and target's) shape
    lr: float

    def model(self):
        torch.manual_seed(self.model_seed)
        return self.make().cuda()


SETUPS = {
    "ddp": Setup(0, lambda: mlp(512, 1024), 100, (32, 512), 0.05),
    "fsdp2": Setup(1, lambda: nn.Sequential(*[mlp(512, 1024) for _ in range(4)]), 200, (32, 512), 0.05),
    "tp": Setup(2, DecoderBlock, 300, (4, 64, 768), 0.02),  # tensor parallel: every rank the same batch
}
DECODE_SHAPE = (8, 1, 768)  # one token for 8 sequences
DECODE_STEPS = 5


def shared_gpu():
    """Every rank on GPU 0 (SYMMEM_TEST_SHARED_GPU=1: the shim in front of the stand-in NCCL)."""
    return os.environ.get("SYMMEM_TEST_SHARED_GPU") == "1"


def batches(seed, shape):
    """STEPS (input, target) pairs from a generator seeded with `seed`, and the generator."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(*shape, device="cuda", generator=g), torch.randn(*shape, device="cuda", generator=g))
            for _ in range(STEPS)], g


def timed_steps(model, make_batch, lr, foreach=None):
    opt = torch.optim.SGD(model.parameters(), lr=lr, foreach=foreach)
    losses, times = [], []
    for step in range(STEPS):
        x, target = make_batch(step)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
    return losses, times


def full_params(model):
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()  # DTensor: gathered (a collective, through the library under test)
        out[name] = t.float().cpu().clone()
    return out


def run_ddp(rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    setup = SETUPS["ddp"]
    model = DDP(setup.model(), device_ids=[torch.cuda.current_device()])
    data, _ = batches(setup.batch_seed + rank, setup.batch)
    losses, times = timed_steps(model, lambda s: data[s], lr=setup.lr)
    return {"losses": losses, "times": times, "params": full_params(model.module)}


def run_fsdp2(rank):
    from torch.distributed.fsdp import fully_shard

    setup = SETUPS["fsdp2"]
    model = setup.model()
    for block in model:
        fully_shard(block)
    fully_shard(model)
    data, _ = batches(setup.batch_seed + rank, setup.batch)
    losses, times = timed_steps(model, lambda s: data[s], lr=setup.lr)
    return {"losses": losses, "times": times, "params": full_params(model)}


def run_tp(world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cuda", (world,))
    setup = SETUPS["tp"]
    block = setup.model()
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "w1": ColwiseParallel(), "w2": RowwiseParallel()}
    # Every rank made the same weights (the seed): on the shared GPU each keeps its own shard
    # instead of receiving it from rank 0 (a scatter, which the stand-in NCCL does not move).
    parallelize_module(block, mesh, plan, src_data_rank=None if shared_gpu() else 0)
    data, g = batches(setup.batch_seed, setup.batch)
    # foreach=False: the norms' parameters stay plain tensors beside the DTensors, and torch's
    # multi-tensor kernels refuse that mix.
    losses, times = timed_steps(block, lambda s: data[s], lr=setup.lr, foreach=False)
    result = {"losses": losses, "times": times, "params": full_params(block)}

    # Decode: captured once, replayed on new inputs.
    block.eval()
    static_x = torch.zeros(*DECODE_SHAPE, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):  # warm-up outside the capture (the shim makes nothing inside one)
            block(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y = block(static_x)
    outputs, eager, replay_times = [], [], []
    with torch.no_grad():
        for _ in range(DECODE_STEPS):
            x = torch.randn(*DECODE_SHAPE, device="cuda", generator=g)
            static_x.copy_(x)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            replay_times.append((time.perf_counter() - t0) * 1e3)
            outputs.append(static_y.detach().float().cpu().clone())
            eager.append(block(x).float().cpu())
    result["decode_outputs"] = outputs
    result["decode_times"] = replay_times
    # The replay computes what the same block computes eagerly.
    result["decode_replay_vs_eager"] = max(relative_gap(a, b) for a, b in zip(outputs, eager))
    return result


GROUP_COUNTS = (1000, 1 << 20)  # staged under and over the built-in rule's staging area


def group_ranks(world):
    half = max(1, world // 2)
    return {"all": list(range(world)), "lower": list(range(half)), "upper": list(range(half, world)) or [0]}


def group_sum(count, ranks):
    """The all-reduce of the groups part over `ranks`, in closed form."""
    return torch.arange(count, dtype=torch.float32) % 1024 * sum(r + 1 for r in ranks)


def run_groups(rank, world):
    """{group name: all-reduced tensor} for the groups this rank is in; every rank makes every group."""
    groups = group_ranks(world)
    made = {name: dist.new_group(ranks) for name, ranks in groups.items()}  # collective: every rank
    out = {}
    for name, ranks in groups.items():
        if rank not in ranks:
            continue
        for count in GROUP_COUNTS:
            x = torch.arange(count, device="cuda", dtype=torch.float32) % 1024 * (rank + 1)
            dist.all_reduce(x, group=made[name])
            out[f"{name}_{count}"] = (x.cpu(), torch.equal(x.cpu(), group_sum(count, ranks)))
    for name, ranks in groups.items():
        if rank in ranks:
            dist.destroy_process_group(made[name])
    return out


def run(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = 0 if shared_gpu() else int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank)
    torch.use_deterministic_algorithms(True)
    from datetime import timedelta

    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank), timeout=timedelta(seconds=300))
    result = {"world": world, "preloaded": os.environ.get("LD_PRELOAD", ""),
              "shim_mode": os.environ.get("SYMMEM_NCCL", "")}
    for part, fn in (("ddp", lambda: run_ddp(rank)), ("fsdp2", lambda: run_fsdp2(rank)), ("tp", lambda: run_tp(world)),
                     ("groups", lambda: run_groups(rank, world))):
        if part not in args.parts:
            continue
        result[part] = fn()
        dist.barrier()
    torch.save(result, f"{args.out}.rank{rank}.pt")
    dist.destroy_process_group()
    if rank == 0:
        print(f"wrote {args.out}.rank*.pt")


def reference_data_parallel(model, rank_batches, lr):
    """What data parallelism over len(rank_batches) ranks computes, in one process: each rank's
    batch through the one model (the same products as that rank's), the step taken on the gradient
    of the mean of their losses (the mean of their gradients). Per rank: its losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = [[] for _ in rank_batches]
    for step in range(STEPS):
        per_rank = [F.mse_loss(model(data[step][0]), data[step][1]) for data in rank_batches]
        (sum(per_rank) / len(per_rank)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for r, loss in enumerate(per_rank):
            losses[r].append(loss.item())
    return losses


def reference(args):
    """The parts of `run` at world args.reference, without collectives: one file per rank."""
    world = args.reference
    torch.cuda.set_device(0)
    torch.use_deterministic_algorithms(True)
    result = [{"world": world, "preloaded": "", "shim_mode": "reference"} for _ in range(world)]
    for part in ("ddp", "fsdp2"):
        if part not in args.parts:
            continue
        setup = SETUPS[part]
        model = setup.model()
        losses = reference_data_parallel(model, [batches(setup.batch_seed + r, setup.batch)[0] for r in range(world)],
                                         lr=setup.lr)
        params = full_params(model)
        for r in range(world):
            result[r][part] = {"losses": losses[r], "times": [0.0] * STEPS, "params": params}

    if "tp" in args.parts:
        setup = SETUPS["tp"]
        block = setup.model()
        data, g = batches(setup.batch_seed, setup.batch)
        losses, _ = timed_steps(block, lambda s: data[s], lr=setup.lr, foreach=False)
        tp = {"losses": losses, "times": [0.0] * STEPS, "params": full_params(block)}
        block.eval()
        with torch.no_grad():
            tp["decode_outputs"] = [block(torch.randn(*DECODE_SHAPE, device="cuda", generator=g)).float().cpu()
                                    for _ in range(DECODE_STEPS)]
        tp["decode_times"] = [0.0] * DECODE_STEPS
        tp["decode_replay_vs_eager"] = 0.0
        for r in range(world):
            result[r]["tp"] = tp
    for r in range(world):
        if "groups" in args.parts:
            result[r]["groups"] = {f"{name}_{count}": (group_sum(count, ranks), True) for name, ranks in
                                   group_ranks(world).items() if r in ranks for count in GROUP_COUNTS}
        torch.save(result[r], f"{args.out}.rank{r}.pt")
    print(f"wrote {args.out}.rank*.pt (reference, world {world})")


def relative_gap(a, b):
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-30)
    return (a - b).abs().max().item() / scale


def compare(args):
    failures = 0
    for rank in range(args.ranks):
        a = torch.load(f"{args.compare[0]}.rank{rank}.pt", weights_only=False)
        b = torch.load(f"{args.compare[1]}.rank{rank}.pt", weights_only=False)
        parts_a, parts_b = ([p for p in PARTS if p in r] for r in (a, b))
        if parts_a != parts_b or set(a.get("groups", {})) != set(b.get("groups", {})):
            print(f"rank {rank}: THE RUNS DIFFER IN WHAT THEY HOLD: {parts_a} and groups {sorted(a.get('groups', {}))} "
                  f"against {parts_b} and groups {sorted(b.get('groups', {}))}")
            failures += 1
            continue
        if rank == 0:
            print(f"# parts compared: {', '.join(parts_a)}")
            print(f"# {args.compare[0]} (LD_PRELOAD={a['preloaded'] or '-'}) vs {args.compare[1]} "
                  f"(LD_PRELOAD={b['preloaded'] or '-'}, SYMMEM_NCCL={b['shim_mode'] or 'auto'}), world {a['world']}")
            print(f"{'part':7} {'loss gap':>10} {'param gap':>10} {'ms/step A':>10} {'ms/step B':>10} verdict")
        for part in (p for p in ("ddp", "fsdp2", "tp") if p in b):
            pa, pb = a[part], b[part]
            loss_gap = max(abs(x - y) / max(abs(x), abs(y), 1e-30) for x, y in zip(pa["losses"], pb["losses"]))
            param_gap = max(relative_gap(pa["params"][n], pb["params"][n]) for n in pa["params"])
            ok = loss_gap <= REL_BOUND and param_gap <= REL_BOUND
            failures += not ok
            if rank == 0:
                ta, tb = statistics.median(pa["times"][1:]), statistics.median(pb["times"][1:])
                print(f"{part:7} {loss_gap:>10.2e} {param_gap:>10.2e} {ta:>10.3f} {tb:>10.3f} "
                      f"{'ok' if ok else 'OUTSIDE THE BOUND'}")
        if "tp" in b:
            da, db = a["tp"], b["tp"]
            decode_gap = max(relative_gap(x, y) for x, y in zip(da["decode_outputs"], db["decode_outputs"]))
            replay_gap = max(da["decode_replay_vs_eager"], db["decode_replay_vs_eager"])
            ok = decode_gap <= REL_BOUND and replay_gap <= REL_BOUND
            failures += not ok
            if rank == 0:
                ta, tb = statistics.median(da["decode_times"]), statistics.median(db["decode_times"])
                print(f"{'decode':7} {'-':>10} {decode_gap:>10.2e} {ta:>10.3f} {tb:>10.3f} "
                      f"{'ok' if ok else 'OUTSIDE THE BOUND'} (graph replay vs eager: "
                      f"{da['decode_replay_vs_eager']:.1e}, {db['decode_replay_vs_eager']:.1e})")
        for key, (got, exact) in sorted(b.get("groups", {}).items()):
            theirs, theirs_exact = a["groups"][key]
            same = torch.equal(got, theirs)
            failures += not (exact and same and theirs_exact)
            if rank == 0 or not (exact and same):
                print(f"rank {rank} group all-reduce {key}: {'exact' if exact else 'WRONG'}, "
                      f"{'equal to' if same else 'DIFFERENT FROM'} A's")
    print(f"parts outside the bound ({REL_BOUND:g} of each value's scale), over all ranks: {failures}")
    if args.routes and not served_enough(args.routes, args.mode, args.none_forwarded):
        failures += 1
    return 1 if failures else 0


def served_enough(prefix, mode, none_forwarded=False):
    """Whether the shim's route logs (every rank's) show it served what `mode` must serve (with
    none_forwarded: every call it logged)."""
    served, forwarded = {}, {}
    for path in glob.glob(f"{prefix}.*.csv"):
        for r in csv.DictReader(open(path)):
            tally = served if r["route"] == "symmem" else forwarded
            tally[r["collective"]] = tally.get(r["collective"], 0) + 1
    print(f"call shapes served: {served or 'none'}; forwarded: {forwarded or 'none'}")
    # Under all, every collective the steps called (FSDP2 reduce-scatters only from two ranks on).
    needed = sorted(set(served) | set(forwarded)) if mode == "all" else ()
    missing = [c for c in needed if not served.get(c)]
    if none_forwarded and forwarded:
        print(f"FORWARDED: {forwarded} (every call must be served)")
        return False
    if missing or not served:
        print(f"SERVED TOO LITTLE under SYMMEM_NCCL={mode}: " + (", ".join(missing) or "nothing") + " never served")
        return False
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="prefix of this run's result files (one per rank)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two runs' prefixes")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--routes", help="with --compare: the shim run's SYMMEM_NCCL_ROUTE_LOG prefix")
    p.add_argument("--mode", default="auto", choices=("auto", "all"), help="with --routes: the shim run's SYMMEM_NCCL")
    p.add_argument("--reference", type=int, metavar="WORLD",
                   help="with --out: the parts at WORLD ranks computed in one process, without collectives")
    p.add_argument("--parts", default=",".join(PARTS), help="with --out: the parts to run (comma-separated)")
    p.add_argument("--none-forwarded", action="store_true",
                   help="with --routes: fail on any call the shim forwarded (ranks on one GPU behind the stand-in)")
    args = p.parse_args()
    args.parts = args.parts.split(",")
    if not args.parts or any(part not in PARTS for part in args.parts):
        p.error(f"--parts takes some of {', '.join(PARTS)}")
    if args.compare:
        sys.exit(compare(args))
    if not args.out:
        p.error("--out or --compare")
    if args.reference is not None and args.reference < 1:
        p.error("--reference takes a world size of 1 or more")
    reference(args) if args.reference is not None else run(args)


if __name__ == "__main__":
    main()
