#!/usr/bin/env bash
# Issue 29's checks on one GPU (H100 or H200): the device API and symmem.triton, from a bundle of
# prebuilt binaries (it builds nothing), in about 8 minutes. Run from the repository root:
#
#   scripts/gpu_issue29.sh BUNDLE [STAGE ...]   stages: env ops shared cuda fused bench (default: all)
#
# BUNDLE is what scripts/bundle.sh collects (build-bundle/): libsymmem_capi.so (the Python package's
# native library, SYMMEM_LIBRARY), symmem_example_one_shot_all_reduce (examples/cuda) and COMMIT.
# The Python package comes from this working tree (python/). Needs Python with torch, Triton and
# pytest. Every log and CSV goes to $OUT (default ./out-issue29) as it is written; summary.txt
# lists each stage's exit status and time.
#   env     the GPU, versions, commit
#   ops     the examples' torch ops at world 1 (opcheck), pytest
#   shared  tests/python/triton_gpu at 2, 4 and 8 ranks sharing the GPU (SYMMEM_TEST_SHARED_GPU=1):
#           bit-exact against symmem's CUDA collectives, mismatches, a rank that never launches,
#           1000 graph replays
#   cuda    the CUDA example (public headers only) at 2, 4 and 8 ranks, and with a dead rank
#   fused   world 1: the Triton all-gather + matmul against torch.mm, K=16384 N=6656 (CSV)
#   bench   symmem.bench.kernels at world 1 on one small shape (that it runs, writes its CSV and
#           plot; its figures need 2 GPUs or more: the measurement issue runs it with torchrun)
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] && [ -d "$1" ] || { echo "usage: $0 BUNDLE [STAGE ...]" >&2; exit 2; }
BUNDLE=$(cd "$1" && pwd)
shift
STAGES=${*:-env ops shared cuda fused bench}
OUT=${OUT:-$PWD/out-issue29}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMMEM_LIBRARY="$BUNDLE/libsymmem_capi.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/symmem-triton-cache}
COMMIT=$(cat "$BUNDLE/COMMIT" 2>/dev/null || git rev-parse --short HEAD)
START=$(date +%s)
BUDGET_S=${BUDGET_S:-480}

# run NAME LIMIT_S COMMAND...: runs COMMAND into $OUT/NAME.log within LIMIT_S and what is left of
# the budget; records its status in summary.txt.
run() {
  local name=$1 limit=$2 left rc began
  shift 2
  left=$((BUDGET_S - ($(date +%s) - START)))
  if [ "$left" -lt 15 ]; then
    echo "$name: not run (budget spent)" | tee -a "$OUT/summary.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  began=$(date +%s)
  echo "== $name (limit ${limit} s)"
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc $(( $(date +%s) - began )) s" | tee -a "$OUT/summary.txt"
  tail -n 3 "$OUT/$name.log"
}

echo "commit $COMMIT, $(date -u +%FT%TZ)" > "$OUT/summary.txt"
for stage in $STAGES; do
  case $stage in
    env)
      { nvidia-smi; python3 -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, \
'triton', triton.__version__, torch.cuda.get_device_name(0))"; echo "commit $COMMIT"; } > "$OUT/env.txt" 2>&1
      ;;
    ops)
      run triton_ops_world1 120 python3 -m pytest -v -p no:cacheprovider tests/python/triton_gpu/test_triton_ops_world1.py
      ;;
    shared)
      SYMMEM_TEST_SHARED_GPU=1 CUDA_DEVICE_MAX_CONNECTIONS=32 SYMMEM_SHARED_GPU_WORLDS="2 4 8" \
        run triton_shared_gpu 330 python3 -m pytest -v -p no:cacheprovider -rA \
        --junitxml="$OUT/triton_shared_gpu.xml" tests/python/triton_gpu/test_triton_shared_gpu.py
      ;;
    cuda)
      for world in 2 4 8; do
        SYMMEM_TEST_SHARED_GPU=1 CUDA_DEVICE_MAX_CONNECTIONS=32 \
          run "cuda_example_${world}_ranks" 60 "$BUNDLE/symmem_example_one_shot_all_reduce" --threads "$world"
      done
      SYMMEM_TEST_SHARED_GPU=1 CUDA_DEVICE_MAX_CONNECTIONS=32 \
        run cuda_example_dead_rank 60 "$BUNDLE/symmem_example_one_shot_all_reduce" --threads 4 --dead-rank
      ;;
    fused)
      if [ -f python/symmem/triton/examples/all_gather_matmul.py ]; then
        run fused_world1 150 python3 -m symmem.triton.examples.all_gather_matmul --world1-vs-mm \
          --csv "$OUT/fused_world1.csv" --commit "$COMMIT" --dtype float16
      else
        echo "fused: not run (no all_gather_matmul example in this tree)" | tee -a "$OUT/summary.txt"
      fi
      ;;
    bench)
      run bench_kernels_smoke 120 torchrun --nproc-per-node 1 -m symmem.bench.kernels --shapes 2048x4096 \
        --sms 4,16 --reps 2 --calls 3 --out "$OUT/bench_kernels_smoke"
      ;;
    *) echo "unknown stage $stage" | tee -a "$OUT/summary.txt" ;;
  esac
done
echo "done in $(( $(date +%s) - START )) s" | tee -a "$OUT/summary.txt"
