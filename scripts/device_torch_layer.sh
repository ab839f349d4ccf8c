#!/usr/bin/env bash
# One device call for issue 27 (builds nothing; .device/ carries the libraries):
#   .device/new/libsymmem_capi.so   this tree's C ABI      .device/old/{libsymmem_capi.so,python,COMMIT}  8ad5a53's
# Stages, each under its own deadline, logs written to $OUT as they go:
#   1. the symmem.torch GPU tests at world 1 on this tree  -> torch_tests_1_rank.log
#   2. the issue's scenarios on 8ad5a53 (must fail)         -> torch_layer_tests_8ad5a53_must_fail.log
#   3. host cost per call, 8ad5a53 and this tree interleaved -> torch_host_cost_ab.csv / .txt
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')
export SYMMEM_GPU_KIND="$gpu"
stage=${1:-all}
echo "gpu $gpu, commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- src include python tests 2>/dev/null || echo -dirty)" | tee "$OUT/session.txt"
if [ "$stage" = all ] || [ "$stage" = tests ]; then
  SYMMEM_LIBRARY=$PWD/.device/new/libsymmem_capi.so timeout ${TESTS_S:-330} tests/python/gpu/run.sh 1 ${TESTS_ARGS:-} \
    2>&1 | tee "$OUT/torch_tests_1_rank.log" | tail -5
fi
if [ "$stage" = all ] || [ "$stage" = old ]; then
  PYTHONPATH=$PWD/.device/old/python SYMMEM_LIBRARY=$PWD/.device/old/libsymmem_capi.so timeout ${OLD_S:-150} \
    python3 -m torch.distributed.run --nproc-per-node 1 -m pytest tests/python/gpu/test_torch_layer_gpu.py \
    -p no:cacheprovider -q -rs -k "${OLD_K:-two_streams_on_one or nan or fsdp_never or async_work_orders or group_cycles}" \
    2>&1 | tee "$OUT/torch_layer_tests_8ad5a53_must_fail.log" | tail -8
fi
if [ "$stage" = all ] || [ "$stage" = cost ]; then
  timeout ${COST_S:-150} python3 tools/torch_host_cost_ab.py --tree "8ad5a53=.device/old:.device/old/libsymmem_capi.so" \
    --tree "new=.:.device/new/libsymmem_capi.so" --reps ${REPS:-5} --samples ${SAMPLES:-7} --cpu ${PIN_CPU:-3} --gpu "$gpu" --out "$OUT/torch_host_cost_ab.csv" \
    2>&1 | tee "$OUT/torch_host_cost_ab.txt"
fi
