#!/usr/bin/env bash
# libsymmem_nccl.so on GPUs, from prebuilt binaries (builds nothing), every step under a time limit:
#
#   scripts/gpu_nccl_shim.sh RANKS [BUNDLE]   # from the repository root, RANKS = 2 or 4
#
# RANKS = 1 (a one-GPU machine) runs the same steps on communicators of one rank, which the shim
# then serves (SYMMEM_TEST_NCCL_ONE_RANK=1): its serving path against the real NCCL under unchanged
# nccl-tests, PyTorch and the PyNccl client; not the kill step, which needs two GPUs.
#
# Needs, beside this working tree (the scripts and tests/nccl/*.py): a BUNDLE made by
# scripts/bundle.sh (libsymmem_nccl.so, nccl-tests/, the shared-GPU shim test and its stand-in
# NCCL), or else SHIM (default build/libsymmem_nccl.so) and NCCL_TESTS_BIN (default
# build-nccl-tests/bin); and python3 with torch (its nvidia-nccl wheel is the real NCCL of every step).
# Steps, in this order (OUT, default ./gpu_nccl_shim_out, gets one log or folder each, and
# summary.txt; ONLY="name ..." runs only the steps named, e.g. ONLY="nccl_tests pynccl torch_nccl
# torch_shim_auto"); the exit status is 1 when any step failed or was skipped for the budget:
#   0 shared_gpu           symmem_shared_gpu_shim_tests on GPU 0 (ranks as threads, stand-in NCCL)
#   1 pynccl               tests/nccl/pynccl_client.py: vLLM's PyNccl shape, T x 8192 bf16, eager and
#                          graphs, plain vs shim; then again with SYMMEM_NCCL_WORKSPACE_MB=256;
#                          pynccl_windows: in registered symmetric windows, both libraries (as
#                          vLLM's VLLM_USE_NCCL_SYMM_MEM registers them; the shim zero copy)
#   2 torch                tests/nccl/torch_steps.py plain, shim (auto), shim (all) + the comparisons
#                          (which also fail when the shim's route logs show it served too little);
#                          plain against the one-process reference (--reference)
#   3 kill                 tests/nccl/torch_kill.py: a killed rank, the survivors raise in time and end
#                          cleanly; kill_watchdog_first: again, the survivors pausing so that PyTorch's
#                          watchdog sees the failure first (--pause-s); kill_watchdog_abort: and aborts
#                          the communicators through the shim before it ends the process (--abort)
#   4 nccl_tests           scripts/nccl_tests_run.sh RANKS: all_reduce, all_gather, reduce_scatter,
#                          alltoall x bf16/fp16/fp32, processes and threads, plain vs shim interleaved
#                          (OUT/nccl_tests/summary.txt: #wrong 0 everywhere, busbw side by side)
#   5 nccl_tests_windows   the same for all_reduce and all_gather with symmetric windows (-R 2:
#                          zero copy), processes only
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RANKS=${1:?usage: scripts/gpu_nccl_shim.sh RANKS [BUNDLE]}
BUNDLE=${2:-}
if [ -n "$BUNDLE" ]; then
  BUNDLE=$(cd "$BUNDLE" && pwd)
  SHIM=${SHIM:-$BUNDLE/libsymmem_nccl.so}
  NCCL_TESTS_BIN=${NCCL_TESTS_BIN:-$BUNDLE/nccl-tests}
fi
SHIM=$(realpath "${SHIM:-build/libsymmem_nccl.so}")
export SHIM NCCL_TESTS_BIN=${NCCL_TESTS_BIN:-$PWD/build-nccl-tests/bin}
OUT=${OUT:-$PWD/gpu_nccl_shim_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The shim's deadline (10 minutes by default, PyTorch's) well inside each step's limit (120 s and
# more): a rank that never comes ends in the shim's error naming it, not in a step killed without one.
export SYMMEM_NCCL_TIMEOUT_MS=${SYMMEM_NCCL_TIMEOUT_MS:-60000}
unset LD_PRELOAD
[ "$RANKS" = 1 ] && export SYMMEM_TEST_NCCL_ONE_RANK=1
START=$(date +%s)
BUDGET=${BUDGET_S:-900}

# step NAME LIMIT_S LOG COMMAND...: COMMAND under `timeout`, never past the budget; its exit code
# and duration go to summary.txt.
step() {
  local name=$1 limit=$2 log=$3
  shift 3
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
    return
  fi
  local left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -le 10 ]; then
    echo "$name: skipped (budget spent)" | tee -a "$OUT/summary.txt"
    FAILED=1
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || FAILED=1
  echo "$name: rc=$rc in $(($(date +%s) - t0)) s (limit $limit s)" | tee -a "$OUT/summary.txt"
}
FAILED=0

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  echo "commit $(cat "$(dirname "$SHIM")/COMMIT" 2> /dev/null || git rev-parse --short HEAD)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
} > "$OUT/gpu.txt" 2>&1

SHARED_TESTS=${BUNDLE:-build/tests}/symmem_shared_gpu_shim_tests
FAKE_NCCL=${BUNDLE:-build/tests}/libsymmem_fake_nccl.so
if [ -x "$SHARED_TESTS" ]; then
  step shared_gpu 300 "$OUT/shared_gpu.log" env SYMMEM_NCCL_LIBRARY="$(realpath "$FAKE_NCCL")" \
    LD_LIBRARY_PATH="$(dirname "$SHIM")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$SHARED_TESTS"
fi

TORCHRUN=(python3 -m torch.distributed.run --nproc-per-node "$RANKS")
step pynccl 120 "$OUT/pynccl.log" "${TORCHRUN[@]}" tests/nccl/pynccl_client.py --shim "$SHIM" --csv "$OUT/pynccl.csv"
step pynccl_workspace_256 120 "$OUT/pynccl_workspace_256.log" env SYMMEM_NCCL_WORKSPACE_MB=256 \
  "${TORCHRUN[@]}" tests/nccl/pynccl_client.py --shim "$SHIM" --csv "$OUT/pynccl_workspace_256.csv"
step pynccl_windows 120 "$OUT/pynccl_windows.log" "${TORCHRUN[@]}" tests/nccl/pynccl_client.py --shim "$SHIM" \
  --windows --csv "$OUT/pynccl_windows.csv"

step torch_nccl 150 "$OUT/torch_nccl.log" "${TORCHRUN[@]}" tests/nccl/torch_steps.py --out "$OUT/torch_nccl"
# The one-process reference that the shared-GPU run (scripts/nccl_torch_shared_gpu.sh) is held to,
# itself held to plain NCCL here.
step torch_reference 90 "$OUT/torch_reference.log" python3 tests/nccl/torch_steps.py --reference "$RANKS" \
  --out "$OUT/torch_reference"
step torch_compare_reference 60 "$OUT/torch_compare_reference.txt" python3 tests/nccl/torch_steps.py \
  --compare "$OUT/torch_reference" "$OUT/torch_nccl" --ranks "$RANKS"
for mode in auto all; do
  rm -f "$OUT"/torch_routes_"$mode".*.csv  # a reused OUT: the check must read this run's logs alone
  step "torch_shim_$mode" 150 "$OUT/torch_shim_$mode.log" env LD_PRELOAD="$SHIM" SYMMEM_NCCL=$mode \
    SYMMEM_NCCL_ROUTE_LOG="$OUT/torch_routes_$mode" "${TORCHRUN[@]}" tests/nccl/torch_steps.py --out "$OUT/torch_shim_$mode"
  step "torch_compare_$mode" 60 "$OUT/torch_compare_$mode.txt" python3 tests/nccl/torch_steps.py \
    --compare "$OUT/torch_nccl" "$OUT/torch_shim_$mode" --ranks "$RANKS" --routes "$OUT/torch_routes_$mode" --mode "$mode"
done

if [ "$RANKS" -ge 2 ]; then
  step kill 180 "$OUT/kill.log" python3 tests/nccl/torch_kill.py --shim "$SHIM" --world 2
  step kill_watchdog_first 180 "$OUT/kill_watchdog_first.log" python3 tests/nccl/torch_kill.py --shim "$SHIM" \
    --world 2 --timeout-ms 5000 --pause-s 3
  step kill_watchdog_abort 180 "$OUT/kill_watchdog_abort.log" python3 tests/nccl/torch_kill.py --shim "$SHIM" \
    --world 2 --timeout-ms 5000 --pause-s 3 --abort
fi

# The sweeps last: the longest steps, after the checks a short budget must not skip.
step nccl_tests 420 "$OUT/nccl_tests.log" env OUT="$OUT/nccl_tests" scripts/nccl_tests_run.sh "$RANKS"
step nccl_tests_windows 150 "$OUT/nccl_tests_windows.log" env OUT="$OUT/nccl_tests_windows" MODES=processes \
  COLLECTIVES="all_reduce all_gather" EXTRA="-R 2" scripts/nccl_tests_run.sh "$RANKS"
cat "$OUT/summary.txt"
exit "$FAILED"
