#!/usr/bin/env bash
# Sourced by scripts/nccl_tests_run.sh and scripts/nccl_tests_shared_gpu.sh (not run on its own):
# one nccl-tests run as RANKS processes that meet through tools/nccl_tests' minimal MPI.
#
#   nccl_tests_processes RANKS LOG LIMIT_S COMMAND...
#
# Starts COMMAND RANKS times (MINI_MPI_RANK/SIZE/JOB set, each under `timeout LIMIT_S`), waits for
# all, and leaves LOG: rank 0's output (nccl-tests prints from rank 0), then each failed rank's,
# commented out so that none of its lines parses as a result row, and the other ranks' symmem
# warnings (commented out too: the harness may count them). NCCL_TESTS_FAILED_RANKS lists the
# failed ranks (" 1 3"); the status is 1 when there are any. NCCL_TESTS_PIDS holds the ranks under
# way, for the caller's trap to kill when it is itself killed.
NCCL_TESTS_PIDS=()
NCCL_TESTS_FAILED_RANKS=""

nccl_tests_processes() {
  local ranks=$1 log=$2 limit=$3
  shift 3
  local job="nccl-tests-$$-$RANDOM" r
  NCCL_TESTS_PIDS=()
  for ((r = 0; r < ranks; r++)); do
    env MINI_MPI_RANK=$r MINI_MPI_SIZE="$ranks" MINI_MPI_JOB="$job" timeout --kill-after=10 "$limit" "$@" \
      > "$log.rank$r" 2>&1 &
    NCCL_TESTS_PIDS+=($!)
  done
  NCCL_TESTS_FAILED_RANKS=""
  for ((r = 0; r < ranks; r++)); do wait "${NCCL_TESTS_PIDS[$r]}" || NCCL_TESTS_FAILED_RANKS="$NCCL_TESTS_FAILED_RANKS $r"; done
  NCCL_TESTS_PIDS=()
  mv "$log.rank0" "$log"
  for ((r = 1; r < ranks; r++)); do
    if [[ " $NCCL_TESTS_FAILED_RANKS " == *" $r "* ]]; then
      { echo "## rank $r failed:"; sed 's/^/# /' "$log.rank$r"; } >> "$log"
    else
      grep 'symmem warning' "$log.rank$r" | sed "s/^/# rank $r: /" >> "$log"
    fi
    rm -f "$log.rank$r"
  done
  [ -z "$NCCL_TESTS_FAILED_RANKS" ]
}
