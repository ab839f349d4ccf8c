#!/usr/bin/env bash
# nccl-tests' own data checks on libsymmem_nccl.so's served path with ONE GPU, from prebuilt
# binaries (builds nothing): RANKS processes on GPU 0 (NCCL_TESTS_DEVICE=0, SYMMEM_TEST_SHARED_GPU=1),
# the shim preloaded in front of the stand-in NCCL (tests/nccl/fake_nccl.cpp: the real one refuses
# two ranks on one GPU), SYMMEM_NCCL=all. The stand-in moves no data, so every row must be served by
# symmem and exact: nccl-tests' #wrong 0, out of place and in place. Processes sharing a GPU take
# turns on it, so the times say nothing; the rows are checks, not measurements
# (tools/nccl_tests_report.py served).
#
#   scripts/nccl_tests_shared_gpu.sh [WORLDS]      # default "2 3 4 8"
#
# Environment (all optional): NCCL_TESTS_BIN (default build-nccl-tests/bin), SHIM (default
# build/libsymmem_nccl.so), FAKE_NCCL (default build/tests/libsymmem_fake_nccl.so), NCCL_LIB_DIR
# (a libnccl.so.2 for the loader: the binaries link it; default torch's nvidia-nccl wheel), OUT
# (default nccl_tests_shared_gpu_out), SWEEP (default "-b 1K -e 4M -f 8 -n 5 -w 2 -c 1"), SHIM_MODE
# (default all; off, every call forwarded to the stand-in, must fail: the negative control).
# Exit status: 1 when a row is wrong or forwarded, a run failed, or a rank's shim warned.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
WORLDS=${1:-2 3 4 8}
NCCL_TESTS_BIN=$(cd "${NCCL_TESTS_BIN:-build-nccl-tests/bin}" && pwd) || {
  echo "no nccl-tests binaries: run scripts/nccl_tests_build.sh first, or set NCCL_TESTS_BIN" >&2; exit 2; }
# shellcheck source=scripts/shared_gpu_shim_inputs.sh
source scripts/shared_gpu_shim_inputs.sh
shared_gpu_shim_inputs "nccl-tests"
if [ -z "${NCCL_LIB_DIR:-}" ]; then
  NCCL_LIB_DIR=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" \
    2> /dev/null) || NCCL_LIB_DIR=/usr/local/cuda/lib64
fi
OUT=${OUT:-$PWD/nccl_tests_shared_gpu_out}
SWEEP=${SWEEP:--b 1K -e 4M -f 8 -n 5 -w 2 -c 1}
rm -rf "$OUT/logs" "$OUT/routes" "$OUT/meet" "$OUT/failures.txt"
mkdir -p "$OUT/logs" "$OUT/routes" "$OUT/meet"
CSV="$OUT/nccl_tests_shared_gpu.csv"
rm -f "$CSV"
# shellcheck source=scripts/nccl_tests_processes.sh
source scripts/nccl_tests_processes.sh
# The ranks of the run under way die with this script (a limit on it must not leave them on the GPU).
trap 'kill "${NCCL_TESTS_PIDS[@]}" 2> /dev/null; rm -rf "$OUT/meet"' EXIT
trap 'exit 143' INT TERM
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH="$NCCL_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
COMMIT=$(cat "$(dirname "$SHIM")/COMMIT" 2> /dev/null || git rev-parse --short HEAD 2> /dev/null || echo unknown)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# collective type op [nccl-tests flags]: the served types and reductions, plain buffers and
# windows (-R 2), calls captured in CUDA graphs (-G), buffers off their alignment by one element
# (-u 1). (nccl-tests checks one call outside any group: its -m groups would go unchecked.)
CASES='
all_reduce bfloat16 sum
all_reduce float max
all_reduce half min
all_reduce int32 sum
reduce_scatter bfloat16 sum
reduce_scatter float min
reduce_scatter half max
all_gather bfloat16 none
all_gather int8 none
alltoall float none
alltoall bfloat16 none
all_reduce float avg
reduce_scatter bfloat16 avg
all_reduce half avg
reduce_scatter half avg -R 2
all_gather int64 none
all_reduce bfloat16 sum -R 2
all_gather float none -R 2
reduce_scatter half sum -R 2
all_reduce bfloat16 sum -G 1
reduce_scatter float max -G 1
all_reduce half sum -u 1
alltoall bfloat16 none -u 1
'

failed_runs=0
for world in $WORLDS; do
  while read -r collective type op extra; do
    [ -n "$collective" ] || continue
    tag="${world}_ranks_${collective}_${type}_${op}$(tr -d ' ' <<< "$extra")"
    log="$OUT/logs/$tag.log"
    rm -rf "$OUT/routes/$tag" && mkdir -p "$OUT/routes/$tag"
    ops=""
    [ "$op" != none ] && ops="-o $op"
    buffers=staged
    [[ " $extra " == *" -R 2 "* ]] && buffers=window
    # shellcheck disable=SC2086  # SWEEP, ops and extra are lists of flags
    nccl_tests_processes "$world" "$log" 90 env LD_PRELOAD="$SHIM" SYMMEM_NCCL="${SHIM_MODE:-all}" \
      SYMMEM_NCCL_LIBRARY="$FAKE_NCCL" SYMMEM_TEST_SHARED_GPU=1 SYMMEM_NCCL_TIMEOUT_MS=30000 \
      SYMMEM_NCCL_ROUTE_LOG="$OUT/routes/$tag/route" NCCL_TESTS_DEVICE=0 SYMMEM_FAKE_NCCL_MEETING_DIR="$OUT/meet" \
      "$NCCL_TESTS_BIN/${collective}_perf" -t 1 -g 1 -d "$type" $ops $SWEEP $extra || {
      echo "$tag: rank(s)$NCCL_TESTS_FAILED_RANKS failed (see logs/$tag.log)" | tee -a "$OUT/failures.txt"
      failed_runs=$((failed_runs + 1))
    }
    # The shim's own warnings (said once per message: a setting it could not read, a communicator
    # it could not make its side of) mean something went to NCCL; the rows' routes judge the rest.
    if grep -q 'symmem warning: NCCL shim' "$log"; then
      echo "$tag: the shim warned (see logs/$tag.log)" | tee -a "$OUT/failures.txt"
      failed_runs=$((failed_runs + 1))
    fi
    python3 "$REPO/tools/nccl_tests_report.py" parse "$log" --csv "$CSV" --library symmem_nccl --mode processes \
      --ranks "$world" --routes "$OUT/routes/$tag" --meta "date=$DATE" "commit=$COMMIT" "gpu=$GPU x 1" \
      "shim_mode=${SHIM_MODE:-all}" "workspace_mb=${SYMMEM_NCCL_WORKSPACE_MB:-64}" "buffers=$buffers" "flags=$extra" \
      > /dev/null || { echo "$tag: no result rows (see logs/$tag.log)" | tee -a "$OUT/failures.txt"; failed_runs=$((failed_runs + 1)); }
  done <<< "$CASES"
done
python3 "$REPO/tools/nccl_tests_report.py" served "$CSV" --out "$OUT/summary.txt" > /dev/null
rc=$?
tail -1 "$OUT/summary.txt"
echo "runs that failed: $failed_runs" | tee -a "$OUT/summary.txt"
[ "$rc" -eq 0 ] && [ "$failed_runs" -eq 0 ]
