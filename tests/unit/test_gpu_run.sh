#!/usr/bin/env bash
# CI check of scripts/gpu_run.sh without a GPU (DRY_RUN=1: each step's commands, not run): every
# step it lists is one it runs, and what the benchmarks keep lands in bench/results' layout
# (<kind>x<lane GPUs>/<what>_<ranks>.csv: the lane's GPU count names the folder), and every script
# it may start is executable (a step that runs one without the bit fails at once with 126).
set -euo pipefail
root=${1:?usage: test_gpu_run.sh REPO_ROOT}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"
# Executable in the commit too (a clean clone takes the mode from git, not from this tree).
for script in scripts/*.sh $(grep -ohE 'tests/[A-Za-z0-9_/.-]+\.sh' scripts/gpu_run.sh scripts/gpu_nccl_shim.sh | sort -u); do
  mode=$(git ls-files -s -- "$script" | cut -d' ' -f1)
  if [ ! -x "$script" ] || { [ -n "$mode" ] && [ "$mode" != 100755 ]; }; then
    echo "FAIL: $script is not executable (chmod +x; git update-index --chmod=+x)"; exit 1
  fi
done
steps=$(scripts/gpu_run.sh --list | awk '{print $1}' | tr '\n' ' ')
[ "$(wc -w <<< "$steps")" -gt 30 ] || { echo "FAIL: --list lists too few steps: $steps"; exit 1; }
out=$(DRY_RUN=1 OUT="$work/out" GPU_RUN_WORK="$work/w" GPU_KIND="NVIDIA H100 80GB HBM3" GPU_COUNT=4 \
  scripts/gpu_run.sh check "0,1:$steps" -- "0:shared_gpu_tests & 1:host_cost" 2>&1)
if grep -q "unknown step" <<< "$out"; then
  echo "FAIL: a listed step is not run:"; grep "unknown step" <<< "$out"; exit 1
fi
bad=$(grep -- '->' <<< "$out" | grep -vE -- '-> h100x([0-9])/[a-z0-9_]+_\1\.csv$' || true)
[ -z "$bad" ] || { echo "FAIL: results outside the layout:"; echo "$bad"; exit 1; }
for expected in "h100x2/all_gather_2.csv" "h100x2/all_reduce_vllm_graph_2.csv" "h100x2/moe_2.csv" \
                "h100x1/host_cost_1.csv"; do
  grep -q -- "-> $expected" <<< "$out" || { echo "FAIL: no step keeps $expected"; exit 1; }
done
echo "1 passed, 0 failed ($(grep -c -- '->' <<< "$out") results kept, $(wc -w <<< "$steps") steps)"
