#!/usr/bin/env bash
# Unchanged PyTorch (DDP, FSDP2, tensor parallelism, a decode step from a CUDA graph, groups split
# from the default one) and a client in the shape of vLLM's PyNccl (tests/nccl/pynccl_client.py
# --shim-only: the shim loaded by path, eager calls and graph replays, exact; then with --windows)
# through libsymmem_nccl.so at several ranks with ONE GPU, from prebuilt binaries (builds nothing): WORLD
# processes under torchrun, every rank on GPU 0 (SYMMEM_TEST_SHARED_GPU=1), the shim preloaded in
# front of the stand-in NCCL (tests/nccl/fake_nccl.cpp: the real one refuses two ranks on one GPU),
# SYMMEM_NCCL=all. The stand-in moves no data, so every result must come from symmem: each rank's
# losses, parameters, decode outputs and group sums are held against tests/nccl/torch_steps.py's
# one-process reference (--reference WORLD) within the bound of the reduction order, and the shim's
# route logs (the four collectives on communicators with a symmem side) must show no call forwarded
# (one-rank groups are served too: SYMMEM_TEST_NCCL_ONE_RANK). Not covered here: what PyTorch
# broadcasts or scatters (DDP's first synchronisation of the weights, TP's sharding from rank 0)
# goes to the stand-in and moves nothing, so every rank makes its weights itself (the seed).
# Processes sharing a GPU take turns on it: the step times say nothing.
#
#   scripts/nccl_torch_shared_gpu.sh [WORLDS]      # default "2 3 4 8"
#
# Environment (all optional): SHIM (default build/libsymmem_nccl.so), FAKE_NCCL (default
# build/tests/libsymmem_fake_nccl.so), OUT (default nccl_torch_shared_gpu_out: per world its
# logs and comparison; summary.txt, ending with "passed" or "FAILED: ..."), LIMIT_S (each
# command's limit, default 150), KEEP_PT=1 (keep the result files, megabytes per rank), SHIM_MODE
# (default all; without it, a last run at 2 ranks with SYMMEM_NCCL=off, every call forwarded to the
# stand-in, whose group sums the comparison must find wrong: the negative control).
# Exit status: 1 when a world's run or comparison failed, the client failed, or the negative
# control was inconclusive.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
WORLDS=${1:-2 3 4 8}
# shellcheck source=scripts/shared_gpu_shim_inputs.sh
source scripts/shared_gpu_shim_inputs.sh
shared_gpu_shim_inputs "PyTorch through the shim"
OUT=${OUT:-$PWD/nccl_torch_shared_gpu_out}
mkdir -p "$OUT"
rm -rf "$OUT/meet" "$OUT/summary.txt" "$OUT/negative_control"
for world in $WORLDS; do rm -rf "${OUT:?}/$world"; done
mkdir -p "$OUT/meet"
# The command under way dies with this script: a limit on it must not leave ranks on the GPU
# (timeout passes the signal on to torchrun, which stops its ranks).
CHILD=""
trap '[ -n "$CHILD" ] && kill -TERM "$CHILD" 2> /dev/null; wait; rm -rf "$OUT/meet"' EXIT
trap 'exit 143' INT TERM
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset LD_PRELOAD
LIMIT_S=${LIMIT_S:-150}

# limited LOG COMMAND...: COMMAND under `timeout LIMIT_S`, its output in LOG; its exit status
# (124 or 137: timed out). The 45 s grace outlasts torchrun's own wait for its ranks to stop.
limited() {
  local log=$1
  shift
  timeout --kill-after=45 "$LIMIT_S" "$@" > "$log" 2>&1 &
  CHILD=$!
  wait "$CHILD"
  local rc=$?
  CHILD=""
  return "$rc"
}

# Why a command of `steps` failed, from its exit status.
failure() {
  case $1 in
    124 | 137) echo "timed out after $LIMIT_S s" ;;
    *) echo "exit $1" ;;
  esac
}

# The shim in front of the stand-in, every rank on GPU 0; one-rank groups served too (the
# stand-in's answer for them, no data moved, would be right by accident).
SHIM_ENV=(SYMMEM_NCCL_LIBRARY="$FAKE_NCCL" SYMMEM_TEST_SHARED_GPU=1 SYMMEM_TEST_NCCL_ONE_RANK=1
  SYMMEM_NCCL_TIMEOUT_MS=60000 SYMMEM_FAKE_NCCL_MEETING_DIR="$OUT/meet")

# steps DIR WORLD MODE PARTS CHECK: the reference, the run through the shim (torchrun; --tee 3:
# every rank's output in the log) and their comparison, all said in DIR/compare.txt; exit status
# 0 when they agree, and with CHECK = routes also the shim forwarded no call it logged (CHECK =
# data: the data alone), 1 when they do not, 2 when a run failed. The result files (megabytes of
# parameters per rank) are removed unless KEEP_PT=1.
steps() {
  local dir=$1 world=$2 mode=$3 parts=$4 check=$5 rc
  local flags=()
  [ "$check" = routes ] && flags=(--routes "$dir/route" --mode all --none-forwarded)
  mkdir -p "$dir"
  limited "$dir/reference.log" python3 tests/nccl/torch_steps.py --reference "$world" --parts "$parts" \
    --out "$dir/reference"
  rc=$?
  if [ "$rc" = 0 ]; then
    limited "$dir/shim.log" env "${SHIM_ENV[@]}" SYMMEM_NCCL="$mode" LD_PRELOAD="$SHIM" \
      SYMMEM_NCCL_ROUTE_LOG="$dir/route" \
      python3 -m torch.distributed.run --nproc-per-node "$world" --tee 3 tests/nccl/torch_steps.py --parts "$parts" \
      --out "$dir/shim"
    rc=$?
    if [ "$rc" = 0 ]; then
      python3 tests/nccl/torch_steps.py --compare "$dir/reference" "$dir/shim" --ranks "$world" "${flags[@]}" \
        > "$dir/compare.txt" 2>&1
      rc=$?
    else
      echo "the run through the shim failed: $(failure "$rc") (see shim.log)" > "$dir/compare.txt"
      rc=2
    fi
  else
    echo "the reference failed: $(failure "$rc") (see reference.log)" > "$dir/compare.txt"
    rc=2
  fi
  [ "${KEEP_PT:-0}" = 1 ] || rm -f "$dir"/*.pt
  return "$rc"
}

failed=()
for world in $WORLDS; do
  dir="$OUT/$world"
  start=$(date +%s)
  steps "$dir" "$world" "${SHIM_MODE:-all}" ddp,fsdp2,tp,groups routes
  rc=$?
  echo "world $world: rc=$rc in $(($(date +%s) - start)) s, $(tail -n 2 "$dir/compare.txt" | tr '\n' ' ')" |
    tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || failed+=("world $world")
  # vLLM's PyNccl shape: the shim loaded by path (ctypes), eager calls and graph replays, exact.
  start=$(date +%s)
  limited "$dir/pynccl.txt" env "${SHIM_ENV[@]}" SYMMEM_NCCL="${SHIM_MODE:-all}" python3 -m torch.distributed.run \
    --nproc-per-node "$world" --tee 3 tests/nccl/pynccl_client.py --shim "$SHIM" --shim-only --reps 1
  rc=$?
  echo "world $world: PyNccl client rc=$rc in $(($(date +%s) - start)) s," \
    "$(grep -h 'wrong results' "$dir/pynccl.txt" | sed 's/^\[default0\]://')" | tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || failed+=("world $world PyNccl client")
  # Again in registered windows (ncclMemAlloc + ncclCommWindowRegister): zero copy, every size.
  start=$(date +%s)
  limited "$dir/pynccl_windows.txt" env "${SHIM_ENV[@]}" SYMMEM_NCCL="${SHIM_MODE:-all}" python3 -m torch.distributed.run \
    --nproc-per-node "$world" --tee 3 tests/nccl/pynccl_client.py --shim "$SHIM" --shim-only --windows --reps 1
  rc=$?
  echo "world $world: PyNccl client on windows rc=$rc in $(($(date +%s) - start)) s," \
    "$(grep -h 'wrong results' "$dir/pynccl_windows.txt" | sed 's/^\[default0\]://')" | tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || failed+=("world $world PyNccl client on windows")
done

# The negative control: with SYMMEM_NCCL=off every call reaches the stand-in, which moves nothing.
# The run must go through, and the comparison of its data alone (no route check, which would fail
# by itself) must find the group sums wrong.
if [ -z "${SHIM_MODE:-}" ]; then
  dir="$OUT/negative_control"
  steps "$dir" 2 off groups data
  rc=$?
  if [ "$rc" = 1 ] && grep -q 'WRONG\|DIFFERENT FROM' "$dir/compare.txt"; then
    echo "negative control (2 ranks, SYMMEM_NCCL=off): the comparison found the stand-in's results wrong, as it must" |
      tee -a "$OUT/summary.txt"
  else
    echo "negative control (2 ranks, SYMMEM_NCCL=off): INCONCLUSIVE (rc=$rc: $(tail -n 1 "$dir/compare.txt"))" |
      tee -a "$OUT/summary.txt"
    failed+=("the negative control")
  fi
fi
if [ ${#failed[@]} = 0 ]; then
  echo "passed" | tee -a "$OUT/summary.txt"
  exit 0
fi
echo "FAILED: $(printf "%s; " "${failed[@]}")" | tee -a "$OUT/summary.txt"
exit 1
