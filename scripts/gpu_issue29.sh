#!/usr/bin/env bash
# Issue 29's checks on one GPU (H100 or H200): the device API and symmem.triton, from a bundle of
# prebuilt binaries (it builds nothing), in about 8 minutes. Run from the repository root:
#
#   scripts/gpu_issue29.sh BUNDLE [STAGE ...]   stages: env ops shared cuda fused bench (default: all)
#
# BUNDLE (a folder, or a tar.xz of one) holds at least libsymmem_capi.so (the Python package's
# native library, SYMMEM_LIBRARY), symmem_example_one_shot_all_reduce (examples/cuda) and COMMIT, as
# scripts/bundle.sh collects them from a build of this tree. The Python package comes from this
# working tree (python/). Needs Python with torch, Triton and pytest.
#   env     the GPU, versions, commit
#   ops     the examples' torch ops at world 1 (opcheck), pytest
#   shared  tests/python/triton_gpu at 2, 4 and 8 ranks sharing the GPU (SYMMEM_TEST_SHARED_GPU=1):
#           bit-exact against symmem's CUDA collectives, mismatches, a rank that never launches,
#           1000 graph replays
#   cuda    the CUDA example (public headers only) at 2, 4 and 8 ranks, and with a dead rank
#   fused   world 1: the Triton all-gather + matmul against torch.mm, K=16384 N=6656 (CSV)
#   bench   symmem.bench.kernels at world 1 on one small shape (that it runs, writes its CSV and
#           plot; its figures need 2 GPUs or more: the measurement issue runs it with torchrun)
#
# What comes back is at most 5 files in $OUT (default ./out-issue29; a device returns 8 at most),
# each rewritten as the run goes, so that a run cut short still returns what it did:
#   summary.txt            each stage's status and time, the failed tests and each failed stage's tail
#   triton_shared_gpu.log  the shared-GPU pytest run in full (tracebacks of failures, thread dumps of hangs)
#   cuda_examples.log      the CUDA example's runs, one after the other
#   fused_world1.csv       the world-1 fused example against torch.mm
#   logs.tar.gz            everything else: env, the ops and fused logs, the shared run's JUnit XML,
#                          the bench's CSV, plot and log
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
if [ $# -lt 1 ] || [ ! -e "$1" ]; then
  echo "usage: $0 BUNDLE [STAGE ...]" >&2
  exit 2
fi
B=$1
shift
if [ -f "$B" ]; then  # a tarball: unpack it beside itself
  dir=$(mktemp -d)
  tar xJf "$B" -C "$dir" && B=$(find "$dir" -name COMMIT -printf '%h\n' | head -1)
fi
BUNDLE=$(cd "$B" && pwd)
STAGES=${*:-env ops shared cuda fused bench}
OUT=${OUT:-$PWD/out-issue29}
LOGS=$(mktemp -d)  # what logs.tar.gz holds
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMMEM_LIBRARY="$BUNDLE/libsymmem_capi.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/symmem-triton-cache}
export PYTHONUNBUFFERED=1  # a stage killed at its limit keeps everything it printed
COMMIT=$(cat "$BUNDLE/COMMIT" 2>/dev/null || git rev-parse --short HEAD)
START=$(date +%s)
BUDGET_S=${BUDGET_S:-480}

pack() { tar czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null; }
trap pack EXIT

# run NAME LOG LIMIT_S COMMAND...: runs COMMAND, its output appended to LOG, within LIMIT_S and what
# is left of the budget; records its status in summary.txt, with the log's tail when it failed.
run() {
  local name=$1 log=$2 limit=$3 left rc began
  shift 3
  left=$((BUDGET_S - ($(date +%s) - START)))
  if [ "$left" -lt 15 ]; then
    echo "$name: not run (budget spent)" | tee -a "$OUT/summary.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  began=$(date +%s)
  echo "== $name (limit ${limit} s)"
  echo "== $name (limit ${limit} s)" >> "$log"
  timeout -k 10 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  echo "$name: rc=$rc $(( $(date +%s) - began )) s" | tee -a "$OUT/summary.txt"
  if [ "$rc" != 0 ]; then
    { grep -E '^(FAILED|ERROR) ' "$log"; echo "-- last lines of $(basename "$log"):"; tail -n 25 "$log"; } \
      >> "$OUT/summary.txt" 2>/dev/null
  fi
  tail -n 3 "$log"
  pack
}

echo "commit $COMMIT, $(date -u +%FT%TZ), bundle: $(find "$BUNDLE" -maxdepth 1 -type f -printf '%f ')" > "$OUT/summary.txt"
for stage in $STAGES; do
  case $stage in
    env)
      { nvidia-smi; python3 -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, \
'triton', triton.__version__, torch.cuda.get_device_name(0))"; echo "commit $COMMIT"; } > "$LOGS/env.txt" 2>&1
      head -n 20 "$LOGS/env.txt" | grep -E 'NVIDIA|torch|CUDA Version' >> "$OUT/summary.txt"
      pack
      ;;
    ops)
      run triton_ops_world1 "$LOGS/triton_ops_world1.log" 120 \
        python3 -m pytest -v -p no:cacheprovider -rA tests/python/triton_gpu/test_triton_ops_world1.py
      ;;
    shared)
      SYMMEM_TEST_SHARED_GPU=1 CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER SYMMEM_SHARED_GPU_WORLDS="2 4 8" \
        run triton_shared_gpu "$OUT/triton_shared_gpu.log" 330 \
        python3 -m pytest -v -p no:cacheprovider -rA -o faulthandler_timeout=150 \
        --junitxml="$LOGS/triton_shared_gpu.xml" tests/python/triton_gpu/test_triton_shared_gpu.py
      ;;
    cuda)
      for world in 2 4 8; do
        SYMMEM_TEST_SHARED_GPU=1 CUDA_DEVICE_MAX_CONNECTIONS=32 run "cuda_example_${world}_ranks" \
          "$OUT/cuda_examples.log" 60 "$BUNDLE/symmem_example_one_shot_all_reduce" --threads "$world"
      done
      SYMMEM_TEST_SHARED_GPU=1 CUDA_DEVICE_MAX_CONNECTIONS=32 run cuda_example_dead_rank \
        "$OUT/cuda_examples.log" 60 "$BUNDLE/symmem_example_one_shot_all_reduce" --threads 4 --dead-rank
      ;;
    fused)
      run fused_world1 "$LOGS/fused_world1.log" 150 python3 -m symmem.triton.examples.all_gather_matmul \
        --world1-vs-mm --csv "$OUT/fused_world1.csv" --commit "$COMMIT" --dtype float16
      ;;
    bench)
      run bench_kernels_smoke "$LOGS/bench_kernels_smoke.log" 120 torchrun --nproc-per-node 1 \
        -m symmem.bench.kernels --shapes 2048x4096 --sms 4,16 --reps 2 --calls 3 --out "$LOGS/bench_kernels_smoke"
      ;;
    *) echo "unknown stage $stage" | tee -a "$OUT/summary.txt" ;;
  esac
done
echo "done in $(( $(date +%s) - START )) s" | tee -a "$OUT/summary.txt"
