#!/usr/bin/env bash
# Issue 30's GPU checks on ONE GPU, from prebuilt binaries (builds nothing), about 8 minutes:
#   scripts/bundle.sh                       # here: build-bundle/ (needs a fresh scripts/build.sh)
#   scripts/gpu_issue30.sh build-bundle     # on the GPU machine, from the repository root
# The bundle must hold symmem_shared_gpu_moe_tests, symmem-bench and libsymmem_capi.so (the Python
# package comes from this working tree). Everything lands under $OUT (default ./gpu_issue30_out)
# as it goes, one log or CSV per step:
#   gpu.txt                        the GPU, driver, torch
#   shared_gpu_moe_<W>.log         symmem_shared_gpu_moe_tests at W = 2, 3, 4, 8 ranks sharing the GPU
#   bench_all_to_all_1_<mode>.csv  symmem-bench all_to_all, world 1 (local cost only), eager / graph
#   torch_moe_1_rank.log           tests/python/gpu/test_moe_gpu.py under torchrun, one rank
#   moe_1.csv / .txt / .png        python -m symmem.bench.moe, world 1 (local cost only)
#   summary.txt                    each step's exit code and seconds
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUNDLE=$(cd "${1:?usage: scripts/gpu_issue30.sh BUNDLE_DIR}" && pwd)
OUT=${OUT:-$PWD/gpu_issue30_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export SYMMEM_LIBRARY="$BUNDLE/libsymmem_capi.so"
if [ -f "$BUNDLE/COMMIT" ]; then
  SYMMEM_COMMIT=$(cat "$BUNDLE/COMMIT")
  export SYMMEM_COMMIT
fi
START=$(date +%s)
BUDGET=${BUDGET_S:-470}

# step NAME LIMIT_S LOG COMMAND...: runs COMMAND under `timeout` with its output in LOG, never
# past the budget; appends its exit code and duration to summary.txt.
step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -le 10 ]; then
    echo "$name: skipped (budget spent)" | tee -a "$OUT/summary.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $(($(date +%s) - t0)) s (limit $limit s)" | tee -a "$OUT/summary.txt"
}

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  echo "commit ${SYMMEM_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
} > "$OUT/gpu.txt" 2>&1

# 1. The shared-GPU suite: every all-to-all and MoE case at each world size. Every rank's streams
# need hardware queues of their own (32, read when CUDA starts; the suite sets it only where the
# environment does not, so an inherited CUDA_DEVICE_MAX_CONNECTIONS=1 would put the ranks' streams
# on one queue, where a waiting kernel holds its peers' work behind it).
for w in 2 3 4 8; do
  case $w in 2 | 3) limit=55 ;; 4) limit=60 ;; *) limit=95 ;; esac
  step "shared_gpu_moe_$w" "$limit" "$OUT/shared_gpu_moe_$w.log" \
    env SYMMEM_SHARED_GPU_WORLDS="$w" CUDA_DEVICE_MAX_CONNECTIONS=32 "$BUNDLE/symmem_shared_gpu_moe_tests"
done

# 2. symmem-bench all_to_all at world 1: local cost of every form and algorithm, eager and graph.
for mode in eager graph; do
  flag=""
  [ "$mode" = graph ] && flag="--graph"
  # shellcheck disable=SC2086  # $flag is empty or one word
  step "bench_all_to_all_1_$mode" 20 "$OUT/bench_all_to_all_1_$mode.log" "$BUNDLE/symmem-bench" all_to_all \
    --gpus 1 -b 1K -e 64M -f 4 -n 20 -w 3 --reps 3 $flag --csv "$OUT/bench_all_to_all_1_$mode.csv" --json /dev/null
done

# 3. The torch ops and ExpertParallel on the GPU, one rank.
step torch_moe_1_rank 60 "$OUT/torch_moe_1_rank.log" python3 -m torch.distributed.run --nproc-per-node 1 -m pytest \
  tests/python/gpu/test_moe_gpu.py -p no:cacheprovider -q -rs

# 4. The MoE bench at world 1 (DeepSeek-V3 shape: decode 1 / 128, prefill 4096; bf16 and fp8).
# torch's NVSHMEM heap must hold the torch_vdev_2d row's worst-case buffers (prefill: ~1.2 GB).
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-16G}
step moe_bench_1 90 "$OUT/moe_bench_1.log" python3 -m torch.distributed.run --nproc-per-node 1 -m symmem.bench.moe \
  --out "$OUT" --reps 3 --calls 10 --replays 3

echo "total $(($(date +%s) - START)) s" | tee -a "$OUT/summary.txt"
