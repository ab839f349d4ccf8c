#!/usr/bin/env bash
# The host code under the compilers' sanitizers, on a machine without a GPU: builds
# symmem_unit_tests into build-tsan/ (ThreadSanitizer) and build-asan/ (AddressSanitizer and
# UndefinedBehaviorSanitizer), the C++ host code instrumented, the CUDA sources (kernels only) built
# as usual, and runs it. ThreadSanitizer runs the tests that start threads or processes (the NCCL
# shim's groups, registry, rendezvous and last-error slots, the bootstrap and its descriptor
# exchange, the store, agreed settings, thread-local exits, the launcher): it slows the plan sweeps a
# hundredfold. AddressSanitizer runs every test.
#
#   scripts/host_sanitizers.sh [tsan] [asan]     (default: both; a build takes 10-25 min on 2 cores)
#
# Exit status 1 when a test failed or a sanitizer reported anything; the logs are
# build-tsan/sanitizer_*.log and build-asan/sanitizer_*.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

kinds=("$@")
[ ${#kinds[@]} -eq 0 ] && kinds=(tsan asan)
for kind in "${kinds[@]}"; do
  [ "$kind" = tsan ] || [ "$kind" = asan ] || { echo "unknown sanitizer: $kind (tsan, asan)" >&2; exit 1; }
done
if ! command -v nvcc > /dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break; done
fi
export CCACHE_BASEDIR=$PWD
# The unit tests' names that select every test starting a thread or a process (the harness takes
# one substring a run).
threaded_tests=(nccl bootstrap store thread exit_safe agreed fd_exchange agree_on_outcome ranks_with_different launcher)
status=0

build() {  # build DIR FLAGS
  local dir=$1 flags=$2
  mkdir -p "$dir"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSYMMEM_BUILD_TESTS=ON -DSYMMEM_BUILD_BENCH=OFF \
    -DSYMMEM_BUILD_PYTHON=OFF -DCMAKE_CXX_FLAGS="$flags -g -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" > "$dir/sanitizer_configure.log" 2>&1 &&
    cmake --build "$dir" -j "$(nproc)" --target symmem_unit_tests > "$dir/sanitizer_build.log" 2>&1 ||
    { echo "$dir: build failed (see $dir/sanitizer_configure.log, sanitizer_build.log)" >&2; return 1; }
}

run() {  # run DIR NAME [FILTER]: one run of the unit tests, judged by its exit status and its log
  local dir=$1 name=$2 filter=${3:-}
  local log="$dir/sanitizer_$name.log"
  timeout 3600 "$dir/tests/symmem_unit_tests" $filter > "$log" 2>&1
  local rc=$?
  local reports
  reports=$(grep -c -E "WARNING: ThreadSanitizer|ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer" "$log")
  echo "$name: rc=$rc, sanitizer reports: $reports, $(tail -1 "$log")"
  [ "$rc" = 0 ] && [ "$reports" = 0 ] || status=1
}

for kind in "${kinds[@]}"; do
  case $kind in
    tsan)
      build build-tsan "-fsanitize=thread" || { status=1; continue; }
      # halt_on_error=0: every race of a run is reported (the run then exits 66).
      export TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1"
      for filter in "${threaded_tests[@]}"; do run build-tsan "tsan_$filter" "$filter"; done ;;
    asan)
      build build-asan "-fsanitize=address,undefined" || { status=1; continue; }
      export ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1"
      run build-asan asan_all ;;
  esac
done
exit $status
