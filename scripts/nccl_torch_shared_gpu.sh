#!/usr/bin/env bash
# Unchanged PyTorch (DDP, FSDP2, tensor parallelism, a decode step from a CUDA graph, groups split
# from the default one) and a client in the shape of vLLM's PyNccl (tests/nccl/pynccl_client.py
# --shim-only: the shim loaded by path, eager calls and graph replays, exact) through
# libsymmem_nccl.so at several ranks with ONE GPU, from prebuilt
# binaries (builds nothing): WORLD processes under torchrun, every rank on GPU 0
# (SYMMEM_TEST_SHARED_GPU=1), the shim preloaded in front of the stand-in NCCL
# (tests/nccl/fake_nccl.cpp: the real one refuses two ranks on one GPU), SYMMEM_NCCL=all. The
# stand-in moves no data, so every result must come from symmem: each rank's losses, parameters,
# decode outputs and group sums are held against tests/nccl/torch_steps.py's one-process
# reference (--reference WORLD) within the bound of the reduction order, and the shim's route logs
# must show every call it saw served (one-rank groups too: SYMMEM_TEST_NCCL_ONE_RANK). Not covered
# here: what PyTorch broadcasts or scatters (DDP's first synchronisation of the weights, TP's
# sharding from rank 0) goes to the stand-in and moves nothing, so every rank makes its weights
# itself (the seed). Processes sharing a GPU take turns on it: the step times say nothing.
#
#   scripts/nccl_torch_shared_gpu.sh [WORLDS]      # default "2 3 4 8"
#
# Environment (all optional): SHIM (default build/libsymmem_nccl.so), FAKE_NCCL (default
# build/tests/libsymmem_fake_nccl.so), OUT (default nccl_torch_shared_gpu_out: per world its
# result files, logs and comparison; summary.txt), LIMIT_S (each command's limit, default 150),
# SHIM_MODE (default all; without it, a last run at 2 ranks with SYMMEM_NCCL=off, every call
# forwarded to the stand-in, must fail: the negative control).
# Exit status: 1 when a world's run failed or its comparison did, the client failed, or the
# negative control passed.
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

# limited LOG COMMAND...: COMMAND under `timeout LIMIT_S`, its output in LOG; its exit status.
limited() {
  local log=$1
  shift
  timeout --kill-after=15 "$LIMIT_S" "$@" > "$log" 2>&1 &
  CHILD=$!
  wait "$CHILD"
  local rc=$?
  CHILD=""
  return "$rc"
}

# The shim in front of the stand-in, every rank on GPU 0; one-rank groups served too (the
# stand-in's answer for them, no data moved, would be right by accident).
SHIM_ENV=(SYMMEM_NCCL_LIBRARY="$FAKE_NCCL" SYMMEM_TEST_SHARED_GPU=1 SYMMEM_TEST_NCCL_ONE_RANK=1
  SYMMEM_NCCL_TIMEOUT_MS=60000 SYMMEM_FAKE_NCCL_MEETING_DIR="$OUT/meet")

# steps DIR WORLD MODE PARTS: the reference, the run through the shim (torchrun; --tee 3: every
# rank's output in the log) and their comparison in DIR/compare.txt; exit status 0 when they agree
# and the shim forwarded nothing.
steps() {
  local dir=$1 world=$2 mode=$3 parts=$4
  mkdir -p "$dir"
  limited "$dir/reference.log" python3 tests/nccl/torch_steps.py --reference "$world" --parts "$parts" \
    --out "$dir/reference" || { echo "the reference failed (see reference.log)" > "$dir/compare.txt"; return 1; }
  limited "$dir/shim.log" env "${SHIM_ENV[@]}" SYMMEM_NCCL="$mode" LD_PRELOAD="$SHIM" \
    SYMMEM_NCCL_ROUTE_LOG="$dir/route" \
    python3 -m torch.distributed.run --nproc-per-node "$world" --tee 3 tests/nccl/torch_steps.py --parts "$parts" \
    --out "$dir/shim" || { echo "the run through the shim failed (see shim.log)" > "$dir/compare.txt"; return 1; }
  python3 tests/nccl/torch_steps.py --compare "$dir/reference" "$dir/shim" --ranks "$world" --routes "$dir/route" \
    --mode all --none-forwarded > "$dir/compare.txt" 2>&1
}

failed=0
for world in $WORLDS; do
  dir="$OUT/$world"
  steps "$dir" "$world" "${SHIM_MODE:-all}" ddp,fsdp2,tp,groups
  rc=$?
  [ "$rc" = 0 ] && rm -f "$dir"/*.pt  # agreed: megabytes of parameters per rank (kept to diagnose a failure)
  echo "world $world: rc=$rc, $(tail -n 2 "$dir/compare.txt" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || failed=1
  # vLLM's PyNccl shape: the shim loaded by path (ctypes), eager calls and graph replays, exact.
  limited "$dir/pynccl.txt" env "${SHIM_ENV[@]}" SYMMEM_NCCL="${SHIM_MODE:-all}" python3 -m torch.distributed.run \
    --nproc-per-node "$world" --tee 3 tests/nccl/pynccl_client.py --shim "$SHIM" --shim-only --reps 1
  rc=$?
  echo "world $world: PyNccl client rc=$rc, $(grep -h 'wrong results' "$dir/pynccl.txt" | sed 's/^\[default0\]://')" |
    tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || failed=1
done

# The negative control: with SYMMEM_NCCL=off every call reaches the stand-in, which moves nothing,
# so the comparison must fail (quick parts only).
if [ -z "${SHIM_MODE:-}" ]; then
  dir="$OUT/negative_control"
  if steps "$dir" 2 off ddp,groups; then
    echo "negative control (2 ranks, SYMMEM_NCCL=off): PASSED, which it must not" | tee -a "$OUT/summary.txt"
    failed=1
  else
    echo "negative control (2 ranks, SYMMEM_NCCL=off): failed as it must:" \
      "$(tail -n 2 "$dir/compare.txt" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
  fi
  rm -f "$dir"/*.pt
fi
exit "$failed"
