#!/usr/bin/env bash
# Collects what scripts/gpu_run.sh runs into build-bundle/ (stripped) and packs it as
# .device/bundle.tar.xz, to carry to a GPU machine with the working tree (which holds the Python
# package and the tests). Build first: scripts/build.sh, or at least the targets copied below.
#
#   scripts/bundle.sh
#   OLD_CAPI=path OLD_COMMIT=rev scripts/bundle.sh   also an older build's libsymmem_capi.so, for
#                                                    gpu_run.sh's moe_ab step (the same C ABI)
#   OLD_TORCH_TREE=dir scripts/bundle.sh             also an older checkout's python/ and
#                                                    build/libsymmem_capi.so, for its host_cost_ab step
#   SANITIZER_WHEEL=file scripts/bundle.sh           also compute-sanitizer, from the wheel of
#                                                    `pip download --no-deps nvidia-cuda-sanitizer-api`
#                                                    (gpu_run.sh's sanitize_all_to_all step)
#
# build-bundle/COMMIT names the commit the binaries and the Python package come from ("-dirty" with
# uncommitted changes to either): the benches write it into every CSV row.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf build-bundle && mkdir -p build-bundle
cp build/symmem-bench build/symmem-run build/tests/symmem_gpu_tests build/tests/symmem_kill_tests \
  build/tests/symmem_shared_gpu_tests build/tests/symmem_shared_gpu_moe_tests build-bundle/
cp build/libsymmem_capi.so build-bundle/  # the Python package's native library (SYMMEM_LIBRARY)
# symmem._fastcall, loaded from beside that library (where the build made it).
if [ -f build/_fastcall.abi3.so ]; then cp build/_fastcall.abi3.so build-bundle/; fi
# The CUDA example on the heap (gpu_run.sh's cuda_example step).
if [ -f build/examples/symmem_example_one_shot_all_reduce ]; then
  cp build/examples/symmem_example_one_shot_all_reduce build-bundle/
fi
# libsymmem_nccl.so, its shared-GPU test and stand-in NCCL (scripts/gpu_nccl_shim.sh, docs/nccl.md),
# and nccl-tests when scripts/nccl_tests_build.sh made them.
if [ -f build/libsymmem_nccl.so ]; then
  cp build/libsymmem_nccl.so build/tests/symmem_shared_gpu_shim_tests build/tests/libsymmem_fake_nccl.so \
    build/tests/symmem_fake_nccl_data_tests build-bundle/
fi
if [ -d build-nccl-tests/bin ]; then
  mkdir -p build-bundle/nccl-tests && cp build-nccl-tests/bin/* build-nccl-tests/COMMIT build-bundle/nccl-tests/
fi
if [ -n "${OLD_CAPI:-}" ]; then
  mkdir -p build-bundle/old && cp "$OLD_CAPI" build-bundle/old/libsymmem_capi.so &&
    echo "${OLD_COMMIT:?OLD_CAPI needs OLD_COMMIT, the commit it was built from}" > build-bundle/old/COMMIT
fi
if [ -n "${OLD_TORCH_TREE:-}" ]; then
  mkdir -p build-bundle/old_torch && cp -r "$OLD_TORCH_TREE/python" build-bundle/old_torch/ &&
    find build-bundle/old_torch -name __pycache__ -prune -exec rm -rf {} + &&
    cp "$OLD_TORCH_TREE/build/libsymmem_capi.so" build-bundle/old_torch/ &&
    # (and its symmem._fastcall where that build has one: the package loads it from beside the library)
    { [ ! -f "$OLD_TORCH_TREE/build/_fastcall.abi3.so" ] || cp "$OLD_TORCH_TREE/build/_fastcall.abi3.so" build-bundle/old_torch/; } &&
    echo "$(git -C "$OLD_TORCH_TREE" rev-parse --short HEAD)$(git -C "$OLD_TORCH_TREE" diff --quiet HEAD -- src python || echo -dirty)" \
      > build-bundle/old_torch/COMMIT
fi
if [ -n "${SANITIZER_WHEEL:-}" ]; then
  rm -rf build-bundle/unzip
  mkdir -p build-bundle/unzip
  unzip -q "$SANITIZER_WHEEL" -d build-bundle/unzip
  sanitizer=$(ls -d build-bundle/unzip/nvidia/cu*/compute-sanitizer 2> /dev/null | head -1)
  [ -x "$sanitizer/compute-sanitizer" ] || { echo "SANITIZER_WHEEL: no nvidia/cu*/compute-sanitizer in $SANITIZER_WHEEL"; exit 1; }
  mv "$sanitizer" build-bundle/
  rm -rf build-bundle/unzip build-bundle/compute-sanitizer/docs build-bundle/compute-sanitizer/include
fi
find build-bundle -type f \( -name 'symmem*' -o -name '*.so' -o -path '*/nccl-tests/*' \) -not -path '*/compute-sanitizer/*' -exec strip {} + 2>/dev/null || true
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include tools tests python || echo -dirty)" > build-bundle/COMMIT
mkdir -p .device && tar cJf .device/bundle.tar.xz build-bundle
du -sh build-bundle .device/bundle.tar.xz
