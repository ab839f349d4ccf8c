#!/usr/bin/env bash
# nccl-tests on plain NCCL and through libsymmem_nccl.so (LD_PRELOAD in front of the same
# libnccl.so.2), interleaved, on this machine's GPUs, from prebuilt binaries (builds nothing):
#
#   scripts/nccl_tests_run.sh [RANKS]          # RANKS: GPUs to use (default: every GPU)
#
# Each (launch mode, collective, type) runs twice back to back, plain NCCL and the shim, in
# alternating order, with -b 1K -e 256M -f 4, every reduction nccl-tests has (-o all: sum, max, min
# and floating avg are served; prod, integer avg and pre-multiplied sums are forwarded) and the data
# check on. Launch modes:
# "processes" (one process per GPU, through tools/nccl_tests' minimal MPI) and "threads" (one
# process, one thread per GPU: -t RANKS). About 3 minutes at 2 GPUs.
#
# Environment (all optional):
#   NCCL_TESTS_BIN  the binaries (default build-nccl-tests/bin, from scripts/nccl_tests_build.sh)
#   SHIM            libsymmem_nccl.so (default build/libsymmem_nccl.so)
#   NCCL_LIB_DIR    the real libnccl.so.2's folder (default: torch's nvidia-nccl wheel, else
#                   /usr/local/cuda/lib64); both runs load this one
#   OUT             results (default nccl_tests_out): logs/, routes/, nccl_tests.csv, summary.txt
#   MODES           default "processes threads"
#   COLLECTIVES     default "all_reduce reduce_scatter all_gather alltoall"
#   TYPES           default "bfloat16 half float"
#   SWEEP           default "-b 1K -e 256M -f 4 -n 20 -w 5 -c 1"
#   EXTRA           more nccl-tests flags for every run: "-R 2" (symmetric windows: zero copy),
#                   "-G 1" (CUDA graphs)
#   SHIM_MODE       SYMMEM_NCCL for the shim's runs (default auto; "all" serves everything symmem
#                   implements: the input of tools/nccl_cutover.py)
#   REPEATS         runs of each pair (default 1): the comparison takes the medians and holds
#                   forwarded rows to plain NCCL's spread against itself (rows carry `rep`)
# Exit status: 1 when any row has #wrong > 0, a run failed, a row lacks its twin of the other library
# in some repetition, or the shim never routed a call of a row (tools/nccl_tests_report.py compare).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
# shellcheck source=scripts/nccl_tests_processes.sh
source scripts/nccl_tests_processes.sh
trap 'kill "${NCCL_TESTS_PIDS[@]}" 2> /dev/null' EXIT
trap 'exit 143' INT TERM
NCCL_TESTS_BIN=$(cd "${NCCL_TESTS_BIN:-build-nccl-tests/bin}" && pwd) || {
  echo "no nccl-tests binaries: run scripts/nccl_tests_build.sh first, or set NCCL_TESTS_BIN" >&2; exit 2; }
SHIM=$(realpath "${SHIM:-build/libsymmem_nccl.so}")
[ -f "$SHIM" ] || { echo "no shim at $SHIM (set SHIM)" >&2; exit 2; }
GPUS=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU') || GPUS=0
RANKS=${1:-$GPUS}
# One rank only where the shim is told to serve it (SYMMEM_TEST_NCCL_ONE_RANK: its serving path
# against the real NCCL on a one-GPU machine); otherwise there is nothing to compare.
MIN_RANKS=2
[ "${SYMMEM_TEST_NCCL_ONE_RANK:-0}" != 0 ] && MIN_RANKS=1
if [ "$RANKS" -lt "$MIN_RANKS" ] || [ "$RANKS" -gt "$GPUS" ]; then
  echo "SKIPPED: nccl-tests need $MIN_RANKS or more GPUs ($RANKS asked, $GPUS here)"; exit 77
fi
if [ -z "${NCCL_LIB_DIR:-}" ]; then
  NCCL_LIB_DIR=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" \
    2> /dev/null) || NCCL_LIB_DIR=/usr/local/cuda/lib64
fi
[ -f "$NCCL_LIB_DIR/libnccl.so.2" ] || { echo "no libnccl.so.2 in $NCCL_LIB_DIR (set NCCL_LIB_DIR)" >&2; exit 2; }
OUT=${OUT:-$PWD/nccl_tests_out}
mkdir -p "$OUT/logs" "$OUT/routes"
CSV="$OUT/nccl_tests.csv"
rm -f "$CSV"
MODES=${MODES:-processes threads}
COLLECTIVES=${COLLECTIVES:-all_reduce reduce_scatter all_gather alltoall}
TYPES=${TYPES:-bfloat16 half float}
SWEEP=${SWEEP:--b 1K -e 256M -f 4 -n 20 -w 5 -c 1}
EXTRA=${EXTRA:-}
SHIM_MODE=${SHIM_MODE:-auto}
REPEATS=${REPEATS:-1}
BUFFERS=staged
[[ " $EXTRA " == *" -R 2 "* ]] && BUFFERS=window  # nccl-tests registers symmetric windows

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The shim's deadline inside each run's limit (300 s): a missing rank is named, not killed silently.
export SYMMEM_NCCL_TIMEOUT_MS=${SYMMEM_NCCL_TIMEOUT_MS:-60000}
unset NCCL_TESTS_SPLIT NCCL_TESTS_SPLIT_MASK LD_PRELOAD
export LD_LIBRARY_PATH="$NCCL_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
COMMIT=$(cat "$(dirname "$SHIM")/COMMIT" 2> /dev/null || git rev-parse --short HEAD 2> /dev/null || echo unknown)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
{
  echo "date $DATE"
  echo "commit $COMMIT"
  echo "gpu $GPU x $RANKS"
  echo "nccl $NCCL_LIB_DIR/libnccl.so.2"
  echo "nccl-tests $(head -1 "$NCCL_TESTS_BIN/COMMIT" 2> /dev/null || head -1 "$NCCL_TESTS_BIN/../COMMIT" 2> /dev/null || echo unknown)"
  echo "shim $SHIM (SYMMEM_NCCL=$SHIM_MODE)"
  echo "sweep $SWEEP $EXTRA (repeats $REPEATS)"
} > "$OUT/run.txt"
cat "$OUT/run.txt"

# run_one MODE LIBRARY COLLECTIVE TYPE REP: one nccl-tests run, parsed into the CSV.
run_one() {
  local mode=$1 library=$2 collective=$3 type=$4 rep=$5
  local tag="${mode}_${collective}_${type}_${library}"
  [ "$REPEATS" -gt 1 ] && tag="${tag}_rep$rep"
  local log="$OUT/logs/$tag.log"
  local ops="-o all"
  case $collective in all_gather | alltoall) ops="" ;; esac
  local env_args=()
  if [ "$library" = symmem_nccl ]; then
    rm -rf "$OUT/routes/$tag" && mkdir -p "$OUT/routes/$tag"
    env_args=(LD_PRELOAD="$SHIM" SYMMEM_NCCL="$SHIM_MODE" SYMMEM_NCCL_ROUTE_LOG="$OUT/routes/$tag/route")
  fi
  # shellcheck disable=SC2086  # SWEEP, EXTRA and ops are lists of flags
  if [ "$mode" = threads ]; then
    env "${env_args[@]}" timeout --kill-after=10 300 "$NCCL_TESTS_BIN/${collective}_perf" -t "$RANKS" -g 1 \
      -d "$type" $ops $SWEEP $EXTRA > "$log" 2>&1 || { echo "$tag: failed (see $log)"; FAILED_RUNS=$((FAILED_RUNS + 1)); }
  else
    nccl_tests_processes "$RANKS" "$log" 300 env "${env_args[@]}" "$NCCL_TESTS_BIN/${collective}_perf" -t 1 -g 1 \
      -d "$type" $ops $SWEEP $EXTRA || { echo "$tag: rank(s)$NCCL_TESTS_FAILED_RANKS failed (see $log)"; FAILED_RUNS=$((FAILED_RUNS + 1)); }
  fi
  local routes=()
  [ "$library" = symmem_nccl ] && routes=(--routes "$OUT/routes/$tag")
  python3 "$REPO/tools/nccl_tests_report.py" parse "$log" --csv "$CSV" --library "$library" --mode "$mode" \
    --ranks "$RANKS" "${routes[@]}" --meta "date=$DATE" "commit=$COMMIT" "gpu=$GPU" "shim_mode=$SHIM_MODE" \
    "workspace_mb=${SYMMEM_NCCL_WORKSPACE_MB:-64}" "buffers=$BUFFERS" "flags=$EXTRA" "rep=$rep" \
    || echo "$tag: no result rows (see $log)"
}

FAILED_RUNS=0
for rep in $(seq 1 "$REPEATS"); do
  i=$rep  # each repetition flips every pair's order, whatever the number of pairs
  for mode in $MODES; do
    for collective in $COLLECTIVES; do
      for type in $TYPES; do
        # ABBA: the order alternates, so that drift in clocks and power does not favour one library.
        if [ $((i % 2)) -eq 0 ]; then order="nccl symmem_nccl"; else order="symmem_nccl nccl"; fi
        for library in $order; do run_one "$mode" "$library" "$collective" "$type" "$rep"; done
        i=$((i + 1))
      done
    done
  done
done
python3 "$REPO/tools/nccl_tests_report.py" compare "$CSV" --out "$OUT/summary.txt"
rc=$?
echo "nccl-tests runs that failed: $FAILED_RUNS" | tee -a "$OUT/summary.txt"
[ "$rc" = 0 ] && [ "$FAILED_RUNS" = 0 ]
