#!/usr/bin/env bash
# The GPU tests of symmem.torch: tests/python/gpu/run.sh [ranks] [pytest args...]
# Exits 77 (skipped) without torch or without enough GPUs, saying which. With
# SYMMEM_TEST_SHARED_GPU=1 every rank runs on GPU 0 (below).
set -uo pipefail
cd "$(dirname "$0")/../../.."
ranks=${1:-2}; shift || true
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
preload=()
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null) || {
  echo "SKIPPED: symmem.torch GPU tests need torch (python3 -c 'import torch' fails)"; exit 77; }
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
if [ "${SYMMEM_TEST_SHARED_GPU:-0}" = 1 ]; then
  # Every rank on GPU 0. The real NCCL refuses two ranks on one GPU, so torch.distributed's NCCL
  # (the suite's reference) is the stand-in that moves data through the host (tests/nccl/
  # fake_nccl_exchange.cpp), behind the shim with SYMMEM_NCCL=off (the shim exports all of
  # nccl.h and serves nothing). Tests that need a GPU per rank skip, saying so.
  if [ "$gpus" -lt 1 ]; then echo "SKIPPED: symmem.torch GPU tests on a shared GPU need a GPU"; exit 77; fi
  # shellcheck source=scripts/shared_gpu_shim_inputs.sh
  source scripts/shared_gpu_shim_inputs.sh  # SHIM, FAKE_NCCL: absolute, present (else exit 2)
  shared_gpu_shim_inputs "the symmem.torch GPU tests"
  mkdir -p "$logs/meet"
  # The stand-in waits for a peer's part up to this (its default is 60 s; ranks taking turns on the
  # GPU can be slower than that at their first Triton compiles), past which every test's own bound.
  export SYMMEM_NCCL=off SYMMEM_NCCL_LIBRARY="$FAKE_NCCL" SYMMEM_FAKE_NCCL_MOVE_DATA=1 \
    SYMMEM_FAKE_NCCL_MEETING_DIR="$logs/meet" SYMMEM_NCCL_TIMEOUT_MS=${SYMMEM_NCCL_TIMEOUT_MS:-300000}
  preload=(env LD_PRELOAD="$SHIM")  # the test processes only, not this script's tools
elif [ "$gpus" -lt "$ranks" ]; then
  echo "SKIPPED: symmem.torch GPU tests need $ranks GPUs, this machine has $gpus"; exit 77
fi
# Bounded: every test (tests/python/deadline.py: 240 s unless marked, SYMMEM_TEST_DEADLINE_SCALE
# scales every bound; a rank past its test's bound dumps its stacks and exits, and torchrun stops
# the others, dumping theirs) and the whole run, both jobs (SYMMEM_TEST_SUITE_TIMEOUT_S, 1200 s).
#
# Two jobs: the tests marked own_job (torch's NVSHMEM backend, which a process takes only before
# its first symmetric allocation) run in fresh processes after the others. A -m of the caller's
# replaces these selections.
# A TERM or INT (a caller's own timeout) stops the running job: `timeout` keeps its command in a
# process group of its own, which a signal to this script's group would not reach.
stopped=0
trap 'stopped=1; [ -f "$logs/pid" ] && kill -TERM "$(cat "$logs/pid")" 2> /dev/null' TERM INT
ends=$((SECONDS + ${SYMMEM_TEST_SUITE_TIMEOUT_S:-1200}))

# job LOG PYTEST_ARGS...: one torchrun job, its output also into LOG, its exit code in $status.
job() {
  local log=$1
  shift
  rm -f "$logs/pid" "$logs/rc"
  {
    timeout --kill-after=30 "$((ends > SECONDS + 1 ? ends - SECONDS : 1))" ${preload[@]+"${preload[@]}"} \
      python3 -m torch.distributed.run --nproc-per-node "$ranks" --tee 3 \
      -m pytest tests/python/gpu -p no:cacheprovider -q -rsx "$@" &
    echo $! > "$logs/pid"
    wait $!
    echo $? > "$logs/rc"
  } 2>&1 | tee "$log" &
  local pipeline=$!
  wait "$pipeline"  # returns early on a trapped signal: then wait until the stopped job has ended
  while kill -0 "$pipeline" 2> /dev/null; do wait "$pipeline"; done
  rm -f "$logs/pid"
  status=$(cat "$logs/rc" 2> /dev/null || echo 143)
}

# Rank 0's counts of a job, from pytest's last line.
counts() {
  local line
  line=$(grep -aE '^(\[default0\]:)?=* ?[0-9]+ (passed|failed|skipped|deselected|errors?)' "$1" | tail -1)
  echo "${line:-no summary (stopped?)}" | sed 's/^\[default0\]://'
}

# Each job may select nothing (a -k that leaves none of its tests); the run fails if neither ran any.
export SYMMEM_TESTS_NONE_SELECTED_OK=1
job "$logs/main" -m "not own_job" "$@"
first=$status
second=143
if [ "$stopped" = 0 ]; then
  echo "== the own_job tests, in a job of their own"
  job "$logs/own_job" -m own_job "$@"
  second=$status
fi
echo "symmem.torch GPU suite, $ranks ranks: main job rc=$first: $(counts "$logs/main"); own_job job rc=$second: $(counts "$logs/own_job" 2> /dev/null)"
[ "$first" -ne 0 ] && exit "$first"
[ "$second" -ne 0 ] && exit "$second"
ran() { counts "$1" 2> /dev/null | grep -qE '[0-9]+ (passed|failed|skipped|errors?)'; }
if ! ran "$logs/main" && ! ran "$logs/own_job"; then
  echo "no test selected"
  exit 5
fi
exit 0
