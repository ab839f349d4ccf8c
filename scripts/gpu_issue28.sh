#!/usr/bin/env bash
# Issue 28's checks on ONE GPU, from binaries built elsewhere (builds nothing):
#   scripts/gpu_issue28.sh BUNDLE          (a folder, or a tar.xz of one: the binaries are 90 MB,
#                                            11 MB compressed)
# BUNDLE (scripts/bundle.sh makes it: build-bundle/) holds symmem_shared_gpu_tests, symmem_gpu_tests,
# symmem-run, symmem-bench and COMMIT from this tree, and for the A/B the old bench as
# old-symmem-bench with OLD_COMMIT (OLD_BENCH=/work/old/build/symmem-bench OLD_COMMIT=8ad5a53).
# Optional: old_symmem_shared_gpu_tests (OLD_SHARED_GPU_TESTS=/work/old/build/tests/symmem_shared_gpu_tests)
# for the negative controls; NEGATIVE=0 skips them.
# Writes as it goes, into $OUT (default ./gpu-issue28-out):
#   gpu.txt, summary.txt                              the GPU, then one line per step with its rc
#   shared_gpu_world_{2,3,4,8}.log                    the shared-GPU suite, one world per run
#   shared_gpu_agmm_world_8_repeat_{1,2,3}.log        all_gather_matmul at 8 ranks, three more times
#   gpu_tests_1_rank.log                              the world-1 GPU tests (symmem-run -n 1)
#   host_cost_ab.csv, host_cost_ab/*.csv|*.txt        symmem-bench host_cost, old and new interleaved
#   negative/old_*.log                                the old shared-GPU tests at the failures issue 28 names
set -uo pipefail
B=${1:?usage: $0 BUNDLE (a folder, or a tar.xz of one: tar cJf build-bundle.tar.xz build-bundle)}
if [ -f "$B" ]; then  # a tarball: unpack it beside itself
  dir=$(mktemp -d)
  tar xJf "$B" -C "$dir" && B=$(find "$dir" -name COMMIT -printf '%h\n' | head -1)
fi
B=$(cd "$B" && pwd)
OUT=${OUT:-$PWD/gpu-issue28-out}
mkdir -p "$OUT/host_cost_ab" "$OUT/negative"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NEW_COMMIT=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
OLD_COMMIT=$(cat "$B/OLD_COMMIT" 2>/dev/null || echo unknown)
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
summary "issue 28 on $GPU, new $NEW_COMMIT, old $OLD_COMMIT, $(date -u +%Y-%m-%dT%H:%M:%SZ)"

# 1. The shared-GPU suite (ranks as threads of one process on this GPU), one world per run, so that
# a failure at one world leaves the others' results.
for w in 2 3 4 8; do
  start=$(date +%s)
  SYMMEM_SHARED_GPU_WORLDS=$w timeout 600 "$B/symmem_shared_gpu_tests" >"$OUT/shared_gpu_world_$w.log" 2>&1
  rc=$?
  summary "shared_gpu world $w rc=$rc ($(($(date +%s) - start)) s): $(tail -1 "$OUT/shared_gpu_world_$w.log")"
done

# 2. The world-1 GPU tests.
start=$(date +%s)
timeout 600 "$B/symmem-run" -n 1 --timeout 580 "$B/symmem_gpu_tests" >"$OUT/gpu_tests_1_rank.log" 2>&1
summary "gpu tests 1 rank rc=$? ($(($(date +%s) - start)) s): $(tail -1 "$OUT/gpu_tests_1_rank.log")"

# 3. Host cost per call at world 1, the old and the new binary interleaved (ABBA, so that clock and
# power drift cancel), 1 KiB and 64 KiB per rank; every row carries its binary's commit.
if [ -x "$B/old-symmem-bench" ]; then
  for rep in 1 2 3 4; do
    order="old new"
    [ $((rep % 2)) = 0 ] && order="new old"
    for size in 1K 64K; do
      for which in $order; do
        bin=$B/symmem-bench commit=$NEW_COMMIT
        [ "$which" = old ] && bin=$B/old-symmem-bench commit=$OLD_COMMIT
        name=host_cost_ab/${which}_${size}_$rep
        SYMMEM_COMMIT=$commit timeout 300 "$bin" host_cost --gpus 1 -b $size -n 200 --reps 7 \
          --csv "$OUT/$name.csv" --json /dev/null >"$OUT/$name.txt" 2>&1
        summary "host_cost $which $size rep $rep rc=$?"
      done
    done
  done
  # One CSV (the union of both binaries' columns, with the binary and the repetition), and the median
  # time_us per (size, row, binary) over the repetitions: the A/B in one table.
  python3 - "$OUT" >"$OUT/host_cost_ab_summary.txt" 2>&1 <<'EOF'
import csv, glob, os, statistics, sys
out = sys.argv[1]
rows, fields = [], ["binary", "rep"]
for path in sorted(glob.glob(os.path.join(out, "host_cost_ab", "*.csv"))):
    which, _, rep = os.path.basename(path)[:-4].split("_")
    for r in csv.DictReader(open(path)):
        fields += [f for f in r if f not in fields]
        rows.append(dict(r, binary=which, rep=rep))
with open(os.path.join(out, "host_cost_ab.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)
groups = {}
for r in rows:
    key = (int(r["bytes_per_rank"]), r["op"], r["impl"])
    groups.setdefault(key, {}).setdefault(r["binary"], []).append(float(r["time_us"]))
print(f"{'bytes':>7} {'row':48} {'old us':>8} {'new us':>8} {'new/old':>8}")
for (size, op, impl), by in sorted(groups.items()):
    old, new = by.get("old"), by.get("new")
    if old and new:
        o, n = statistics.median(old), statistics.median(new)
        print(f"{size:>7} {op + ' ' + impl:48} {o:8.3f} {n:8.3f} {n / o:8.3f}")
EOF
  summary "host_cost A/B summary: $OUT/host_cost_ab_summary.txt"
else
  summary "host_cost A/B skipped: no $B/old-symmem-bench (bundle with OLD_BENCH=... OLD_COMMIT=...)"
fi

# 4. all_gather_matmul at 8 ranks, three more times (issue 28: it failed 4 of 4 runs on one H100).
for i in 1 2 3; do
  SYMMEM_SHARED_GPU_WORLDS=8 timeout 300 "$B/symmem_shared_gpu_tests" all_gather_matmul \
    >"$OUT/shared_gpu_agmm_world_8_repeat_$i.log" 2>&1
  summary "shared_gpu all_gather_matmul world 8 repeat $i rc=$?: $(tail -1 "$OUT/shared_gpu_agmm_world_8_repeat_$i.log")"
done

# 5. Negative controls: the old suite at the two failures issue 28 names (each should FAIL).
#   old all_gather_matmul at 8 ranks: its graph replays time out (the GEMM queued ahead of the copies);
#   old random calls at 4 ranks with no budget of their own (max_blocks 999, so the old planner's
#   share of sm_count / 5 = 26 blocks rules): ranks' kernels and early successors overfill the GPU.
if [ "${NEGATIVE:-1}" != 0 ] && [ -x "$B/old_symmem_shared_gpu_tests" ]; then
  SYMMEM_SHARED_GPU_WORLDS=8 timeout 300 "$B/old_symmem_shared_gpu_tests" all_gather_matmul \
    >"$OUT/negative/old_agmm_world_8.log" 2>&1
  summary "negative control: old all_gather_matmul world 8 rc=$? (expected to fail): $(tail -1 "$OUT/negative/old_agmm_world_8.log")"
  SYMMEM_SHARED_GPU_WORLDS=4 SYMMEM_SHARED_GPU_BLOCKS=999 timeout 300 "$B/old_symmem_shared_gpu_tests" random \
    >"$OUT/negative/old_random_world_4_no_budget.log" 2>&1
  summary "negative control: old random calls world 4, no budget rc=$? (expected to fail): $(tail -1 "$OUT/negative/old_random_world_4_no_budget.log")"
else
  summary "negative controls skipped (NEGATIVE=0 or no $B/old_symmem_shared_gpu_tests)"
fi
summary "done $(date -u +%Y-%m-%dT%H:%M:%SZ)"
