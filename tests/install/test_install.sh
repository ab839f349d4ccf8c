#!/usr/bin/env bash
# Installs a build of symmem into a scratch prefix and builds and runs a project that uses it
# (tests/install/consumer: find_package(symmem), target symmem::symmem), and the CUDA example of
# examples/ against it. No GPU needed.
#   test_install.sh BUILD_DIR SOURCE_DIR CMAKE CXX_COMPILER CUDA_TOOLKIT_ROOT
set -euo pipefail
build=$1 src=$2 cmake=$3 cxx=$4 cuda=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
for f in include/symmem/symmem.hpp include/symmem/symmem_c.h include/symmem/device.cuh include/symmem/user_call.hpp lib/libsymmem.a lib/cmake/symmem/symmemConfig.cmake \
         lib/cmake/symmem/symmemConfigVersion.cmake lib/cmake/symmem/symmemTargets.cmake bin/symmem-run; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f" >&2; cat "$work/install.log" >&2; exit 1; }
done
# symmem-bench is installed whenever it was built (SYMMEM_BUILD_BENCH).
if [ -e "$build/symmem-bench" ] && [ ! -e "$prefix/bin/symmem-bench" ]; then
  echo "not installed: bin/symmem-bench" >&2
  exit 1
fi
"$cmake" -S "$src/tests/install/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCUDAToolkit_ROOT="$cuda" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; exit 1; }
"$cmake" --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
"$work/consumer/symmem_consumer"
if [ -e "$work/consumer/symmem_c_consumer" ]; then "$work/consumer/symmem_c_consumer"; fi
# The CUDA example on the heap (examples/) builds against the installed package alone, as a user's
# project would (public headers, symmem::symmem), and starts (77: no GPU here, skipped).
"$cmake" -S "$src/examples" -B "$work/examples" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DCUDAToolkit_ROOT="$cuda" -DCMAKE_BUILD_TYPE=Release \
  >"$work/examples-configure.log" 2>&1 || { cat "$work/examples-configure.log" >&2; exit 1; }
"$cmake" --build "$work/examples" >"$work/examples-build.log" 2>&1 || { cat "$work/examples-build.log" >&2; exit 1; }
rc=0
"$work/examples/symmem_example_one_shot_all_reduce" --threads 2 || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 77 ] || { echo "the installed-package example exited $rc" >&2; exit 1; }
# The installed launcher runs.
"$prefix/bin/symmem-run" -n 1 --timeout 30 /bin/true
echo "installed into $prefix and consumed: ok"
