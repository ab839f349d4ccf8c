#!/usr/bin/env bash
# Collects what scripts/h200_session.sh runs into build-bundle/ (stripped, to carry to a GPU
# machine): this tree's build, and the 6cf5c42 binaries for the negative control and the A/B
# (tests/gpu/negative_control.sh with NEGCTL_DIR=build-negctl BUILD_ONLY=1; WITH_OLD=1, OLD_BENCH=path;
# OLD_SHARED_GPU_TESTS=path adds an old shared-GPU test binary for scripts/gpu_issue28.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf build-bundle && mkdir -p build-bundle
cp build/symmem-bench build/symmem-copy-probe build/symmem-run build/tests/symmem_gpu_tests build/tests/symmem_kill_tests build/tests/symmem_shared_gpu_tests build/tests/symmem_shared_gpu_moe_tests build-bundle/
cp build/libsymmem_capi.so build-bundle/  # the Python package's native library (SYMMEM_LIBRARY)
# libsymmem_nccl.so, its shared-GPU test and stand-in NCCL (scripts/gpu_nccl_shim.sh, docs/nccl.md),
# and nccl-tests when scripts/nccl_tests_build.sh made them.
if [ -f build/libsymmem_nccl.so ]; then
  cp build/libsymmem_nccl.so build/tests/symmem_shared_gpu_shim_tests build/tests/libsymmem_fake_nccl.so build-bundle/
fi
[ -d build-nccl-tests/bin ] && mkdir -p build-bundle/nccl-tests && cp build-nccl-tests/bin/* build-nccl-tests/COMMIT build-bundle/nccl-tests/
# The CUDA example on the heap (scripts/gpu_issue29.sh runs it).
[ -f build/examples/symmem_example_one_shot_all_reduce ] && cp build/examples/symmem_example_one_shot_all_reduce build-bundle/
[ -n "${WITH_OLD:-}" ] || rm -f build-bundle/old_* 2>/dev/null
[ -n "${WITH_OLD:-}" ] && [ -d build-negctl/build ] && cp build-negctl/build/old_api_gpu_tests build-negctl/build/old_api_kill_tests build-bundle/
[ -n "${OLD_BENCH:-}" ] && cp "$OLD_BENCH" build-bundle/old-symmem-bench
[ -n "${OLD_BENCH:-}" ] && [ -n "${OLD_COMMIT:-}" ] && echo "$OLD_COMMIT" > build-bundle/OLD_COMMIT
[ -n "${OLD_SHARED_GPU_TESTS:-}" ] && cp "$OLD_SHARED_GPU_TESTS" build-bundle/old_symmem_shared_gpu_tests
[ -n "${MID_BENCH:-}" ] && cp "$MID_BENCH" build-bundle/mid-symmem-bench
[ -n "${MID_BENCH:-}" ] && [ -n "${MID_COMMIT:-}" ] && echo "$MID_COMMIT" > build-bundle/MID_COMMIT
# OLD_CAPI=path [OLD_COMMIT=rev]: an older build's Python library for A/B runs (step moe_ab).
if [ -n "${OLD_CAPI:-}" ]; then
  mkdir -p build-bundle/old && cp "$OLD_CAPI" build-bundle/old/libsymmem_capi.so && strip build-bundle/old/libsymmem_capi.so &&
    echo "${OLD_COMMIT:?OLD_CAPI needs OLD_COMMIT, the commit it was built from}" > build-bundle/old/COMMIT
fi
# OLD_TORCH_TREE=dir: an older checkout's Python package and build/libsymmem_capi.so (step torch_cost).
if [ -n "${OLD_TORCH_TREE:-}" ]; then
  mkdir -p build-bundle/old_torch && cp -r "$OLD_TORCH_TREE/python" build-bundle/old_torch/ &&
    find build-bundle/old_torch -name __pycache__ -prune -exec rm -rf {} + &&
    cp "$OLD_TORCH_TREE/build/libsymmem_capi.so" build-bundle/old_torch/ && strip build-bundle/old_torch/libsymmem_capi.so &&
    echo "$(git -C "$OLD_TORCH_TREE" rev-parse --short HEAD)$(git -C "$OLD_TORCH_TREE" diff --quiet HEAD -- src python || echo -dirty)" \
      > build-bundle/old_torch/COMMIT
fi
# MUTANT_MOE_TESTS=path: a shared-GPU MoE test binary built with a planted bug (step moe_mutant: must fail).
[ -n "${MUTANT_MOE_TESTS:-}" ] && cp "$MUTANT_MOE_TESTS" build-bundle/mutant_symmem_shared_gpu_moe_tests
strip build-bundle/* build-bundle/nccl-tests/* 2>/dev/null || true
# The commit the binaries and the Python package (carried in the working tree) come from: the benches
# write it into every CSV row, so a change to either marks it dirty.
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include tools tests python || echo -dirty)" > build-bundle/COMMIT
du -sh build-bundle
