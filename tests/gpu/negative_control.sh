#!/usr/bin/env bash
# Negative control of the scenario GPU tests (ownership, mismatch, stress, kill; STYLE habit 13):
# builds them against the library of an older commit (default 6cf5c42: raw-pointer API, heap
# inferred from addresses, one growing scratch buffer, no kMismatch) through
# tests/gpu/api_compat.hpp, runs each test on its own, and reports which ones fail there, as they must.
#
#   tests/gpu/negative_control.sh [COMMIT] [RANKS]
#
# Needs this tree's build (build/symmem-run: the kill tests need --expect-killed) and RANKS GPUs
# (default 2). Read-only for the repository: the old tree is extracted with git archive into a
# temporary directory, which is kept for inspection (its path is printed).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
commit=${1:-6cf5c42}
ranks=${2:-2}
launcher="$root/build/symmem-run"
[[ -x "$launcher" ]] || { echo "build this tree first (no $launcher)"; exit 2; }
# NEGCTL_DIR reuses (or creates) a build directory, e.g. to build here and run on a GPU machine;
# BUILD_ONLY=1 stops after the build.
work=${NEGCTL_DIR:-$(mktemp -d /tmp/symmem-negative-control-XXXXXX)}
if [[ ! -x "$work/build/old_api_gpu_tests" ]]; then
mkdir -p "$work/old"
git -C "$root" archive "$commit" | tar -x -C "$work/old"
gpu="$root/tests/gpu"
cat >"$work/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.24)
project(symmem_negative_control LANGUAGES CXX CUDA)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CUDA_STANDARD 17)
set(SYMMEM_BUILD_TESTS OFF CACHE BOOL "" FORCE)
set(SYMMEM_BUILD_BENCH OFF CACHE BOOL "" FORCE)
find_package(CUDAToolkit REQUIRED)
add_subdirectory(old)
find_library(NCCL_LIBRARY nccl HINTS \${CUDAToolkit_LIBRARY_DIR} REQUIRED)
add_executable(old_api_gpu_tests
  $gpu/main.cpp $gpu/fixture.cpp $gpu/device_memory.cpp $gpu/oracle.cpp $gpu/calls.cpp $gpu/test_kernels.cu
  $gpu/test_ownership.cpp $gpu/test_mismatch.cpp $gpu/test_stress.cpp $root/tests/harness/test_main.cpp)
target_include_directories(old_api_gpu_tests PRIVATE $work/old/src $gpu $root/tests/harness)
target_compile_definitions(old_api_gpu_tests PRIVATE SYMMEM_TEST_OLD_API=1)
target_link_libraries(old_api_gpu_tests PRIVATE symmem \${NCCL_LIBRARY})
set_target_properties(old_api_gpu_tests PROPERTIES CUDA_ARCHITECTURES 90 BUILD_RPATH "\${CUDAToolkit_LIBRARY_DIR}")
add_executable(old_api_kill_tests $gpu/test_kill.cpp)
target_include_directories(old_api_kill_tests PRIVATE $gpu)
target_compile_definitions(old_api_kill_tests PRIVATE SYMMEM_TEST_OLD_API=1)
target_link_libraries(old_api_kill_tests PRIVATE symmem)
EOF
cmake -S "$work" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" -j"$(nproc)" --target old_api_gpu_tests old_api_kill_tests
fi
[[ "${BUILD_ONLY:-0}" == 1 ]] && exit 0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

tests=(scratch_is_not_shared_between_collectives graph_replay_after_larger_eager_calls
       graph_replays_of_every_algorithm_after_larger_eager_calls rank_dependent_placement
       rank_dependent_symmetric_offsets_are_a_mismatch mismatched_calls_fail_on_every_rank
       interleaved_collectives_under_load reductions_up_to_256_mib)
summary=()
# run_case NAME IF_IT_PASSES IF_IT_FAILS COMMAND...: runs COMMAND, logs it, records the verdict.
run_case() {
  local name=$1 passes=$2 fails=$3
  shift 3
  set +e
  "$@" 2>&1 | tee "$work/$name.log"
  local rc=${PIPESTATUS[0]}
  set -e
  local verdict=$passes
  [[ $rc -eq 77 ]] && verdict='skipped (no GPUs?)'
  [[ $rc -ne 0 && $rc -ne 77 ]] && verdict=$fails
  summary+=("$name: rc=$rc, $verdict")
}
for t in "${tests[@]}"; do
  echo "=== $t on $commit"
  run_case "$t" 'DOES NOT FAIL on the old tree' 'fails on the old tree (good)' \
    "$launcher" -n "$ranks" --timeout 600 "$work/build/old_api_gpu_tests" "$t"
done
for path in sm low_latency copy_engine graph; do
  for connections in "" 1; do
    name="kill_$path${connections:+_max_connections_1}"
    echo "=== $name on $commit"
    run_case "$name" 'passes on the old tree' 'fails on the old tree' \
      env ${connections:+CUDA_DEVICE_MAX_CONNECTIONS=$connections} "$launcher" -n 2 --timeout 120 --expect-killed 1 \
      "$work/build/old_api_kill_tests" "$path"
  done
done
echo
echo "Negative control against $commit (logs in $work):"
printf '  %s\n' "${summary[@]}"
