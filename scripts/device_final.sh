#!/usr/bin/env bash
# The session's checks on one GPU, from prebuilt binaries (builds nothing), in stages, each under
# its own deadline; every log lands under $OUT/work and is packed into $OUT/logs.tar.gz after each
# stage (the device returns at most 8 files: summary.txt, logs.tar.gz and a few CSVs).
#
#   scripts/device_final.sh STAGE...      (from the repository root)
#
# .device/ carries: bundle.tar.xz (scripts/bundle.sh of this tree: build-bundle/ with COMMIT) and,
# for the A/B and the negative controls, old/ (8ad5a53: libsymmem_capi.so, python/, COMMIT).
# Stages:
#   torch       symmem.torch GPU tests at world 1 (issues 27, 29's ops, 30's ops)
#   torch_old   issue 27's scenarios on 8ad5a53's package (must fail)
#   torch_cost  host us per eager st.all_reduce, 8ad5a53 and this tree interleaved (CSV)
#   gpu1        the C++ GPU tests at world 1 (symmem-run -n 1)
#   shared      the shared-GPU suite at 2, 3, 4, 8 ranks, one world per run
#   moe         scripts/gpu_issue30.sh (all-to-all and MoE: shared GPU at 2, 3, 4, 8; world-1 benches)
#   triton      scripts/gpu_issue29.sh (device API and symmem.triton: shared GPU at 2, 4, 8; fused world 1)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
W=$OUT/work
mkdir -p "$W"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ ! -d "$W/bundle" ]; then
  mkdir -p "$W/unpack" && tar xJf .device/bundle.tar.xz -C "$W/unpack" && mv "$W/unpack/build-bundle" "$W/bundle"
fi
B=$W/bundle
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
export SYMMEM_GPU_KIND="$GPU"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
pack() { tar czf "$OUT/logs.tar.gz" -C "$W" --exclude bundle --exclude unpack . 2>/dev/null; }
step() {  # name limit_s command...: its output into $W/name.log
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$W/$name.log" 2>&1
  rc=$?
  say "$name: rc=$rc in $(($(date +%s) - t0)) s: $(grep -E 'passed|failed' "$W/$name.log" | tail -1 | cut -c1-160)"
  pack
}
say "$(date -u +%FT%TZ) $GPU, this tree $(cat "$B/COMMIT"), old $(cat .device/old/COMMIT 2>/dev/null)"
for stage in "$@"; do
  case $stage in
    torch)
      step torch_tests_1_rank 300 env SYMMEM_LIBRARY="$B/libsymmem_capi.so" tests/python/gpu/run.sh 1 ;;
    torch_old)
      step torch_layer_tests_8ad5a53_must_fail 150 env PYTHONPATH="$PWD/.device/old/python" \
        SYMMEM_LIBRARY="$PWD/.device/old/libsymmem_capi.so" python3 -m torch.distributed.run --nproc-per-node 1 \
        -m pytest tests/python/gpu/test_torch_layer_gpu.py -p no:cacheprovider -q -rA \
        -k "${OLD_K:-two_streams_on_one or fsdp_never or async_work_orders or group_cycles or across_a_capture or unrelated}" ;;
    triton_ops)
      step triton_ops_world1 120 env SYMMEM_LIBRARY="$B/libsymmem_capi.so" PYTHONPATH="$PWD/python" \
        python3 -m pytest -q -p no:cacheprovider -rA tests/python/triton_gpu/test_triton_ops_world1.py ;;
    torch_cost)
      cp "$B/libsymmem_capi.so" "$W/libsymmem_capi.so" && cp "$B/COMMIT" "$W/COMMIT"
      step torch_host_cost_ab 240 python3 tools/torch_host_cost_ab.py \
        --tree "8ad5a53=.device/old:.device/old/libsymmem_capi.so" --tree "new=.:$W/libsymmem_capi.so" \
        --reps "${REPS:-9}" --samples 7 --cpu 3 --gpu "$GPU" --out "$OUT/torch_host_cost_ab.csv" ;;
    gpu1)
      step gpu_tests_1_rank 200 "$B/symmem-run" -n 1 --timeout 190 "$B/symmem_gpu_tests" ;;
    shared)
      for w in 2 3 4 8; do
        step "shared_gpu_world_$w" 150 env SYMMEM_SHARED_GPU_WORLDS=$w "$B/symmem_shared_gpu_tests"
      done ;;
    moe)
      mkdir -p "$W/moe"
      OUT=$W/moe BUDGET_S=${MOE_S:-420} timeout 460 scripts/gpu_issue30.sh "$B" > "$W/moe.log" 2>&1
      say "moe: rc=$? $(tr '\n' ';' < "$W/moe/summary.txt" 2>/dev/null | cut -c1-600)"
      cp "$W/moe/moe_1.csv" "$OUT/" 2>/dev/null; pack ;;
    triton)
      mkdir -p "$W/triton"
      OUT=$W/triton BUDGET_S=${TRITON_S:-420} timeout 460 scripts/gpu_issue29.sh "$B" env ops shared cuda fused \
        > "$W/triton.log" 2>&1
      say "triton: rc=$? $(grep -E 'rc=' "$W/triton/summary.txt" 2>/dev/null | tr '\n' ';' | cut -c1-600)"
      cp "$W/triton/fused_world1.csv" "$OUT/" 2>/dev/null; pack ;;
    *) say "unknown stage $stage" ;;
  esac
done
say "$(date -u +%FT%TZ) done"
