#!/usr/bin/env bash
# The GPU tests of symmem.torch: tests/python/gpu/run.sh [ranks] [pytest args...]
# Exits 77 (skipped) without torch or without enough GPUs, saying which.
set -uo pipefail
cd "$(dirname "$0")/../../.."
ranks=${1:-2}; shift || true
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null) || {
  echo "SKIPPED: symmem.torch GPU tests need torch (python3 -c 'import torch' fails)"; exit 77; }
if [ "$gpus" -lt "$ranks" ]; then
  echo "SKIPPED: symmem.torch GPU tests need $ranks GPUs, this machine has $gpus"; exit 77
fi
# Bounded: every test (tests/python/deadline.py: 240 s unless marked, SYMMEM_TEST_DEADLINE_SCALE
# scales every bound; a rank past its test's bound dumps its stacks and exits, and torchrun stops
# the others, dumping theirs) and each job (SYMMEM_TEST_SUITE_TIMEOUT_S, 1200 s).
job() {
  timeout --kill-after=30 "${SYMMEM_TEST_SUITE_TIMEOUT_S:-1200}" \
    python3 -m torch.distributed.run --nproc-per-node "$ranks" --tee 3 \
    -m pytest tests/python/gpu -p no:cacheprovider -q -rs "$@"
}
# Two jobs: the tests marked own_job (torch's NVSHMEM backend, which a process takes only before
# its first symmetric allocation) run in fresh processes after the others. A -m of the caller's
# replaces these selections.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
job -m "not own_job" "$@" 2>&1 | tee "$logs/main"
first=${PIPESTATUS[0]}
echo "== the own_job tests, in a job of their own"
SYMMEM_TESTS_NONE_SELECTED_OK=1 job -m own_job "$@" 2>&1 | tee "$logs/own_job"
second=${PIPESTATUS[0]}
# Both jobs' counts (rank 0's) on the last line, where gpu_run.sh's step summary reads them.
counts() { grep -aE '^(\[default0\]:)?[=]* ?[0-9]+ (passed|failed|skipped|deselected)' "$1" | tail -1 | sed 's/^\[default0\]://'; }
echo "symmem.torch GPU suite, $ranks ranks: main job rc=$first: $(counts "$logs/main"); own_job job rc=$second: $(counts "$logs/own_job")"
[ "$first" -ne 0 ] && exit "$first"
exit "$second"
