#!/usr/bin/env bash
# The GPU measurement runner: tests and benchmarks on a machine of 1 to 8 GPUs, from binaries built
# elsewhere and carried (scripts/bundle.sh); it builds nothing. Run from the repository root:
#
#   scripts/gpu_run.sh NAME LANE... [-- LANE...]...
#
# A LANE is "DEVICES:STEP STEP ...": its steps run one after the other on those GPUs
# (CUDA_VISIBLE_DEVICES=DEVICES; a step uses every GPU of its lane, one rank per GPU). The lanes of
# one phase run at the same time on disjoint GPUs; `--` starts the next phase once every lane of
# this one has finished. Inside a lane, "A & B > C" runs A and B at once, then C. Example (4 GPUs):
# the 2-rank tests on GPUs 0-1 while the one-GPU suites run on GPUs 2 and 3, then the benchmarks on
# all four:
#   scripts/gpu_run.sh checks "0,1:gpu_tests kill_tests torch_tests" "2:shared_gpu_tests" \
#     "3:triton_shared_gpu_tests" -- "0,1,2,3:all_gather all_reduce_vllm moe"
# `scripts/gpu_run.sh --list` prints the steps (docs/benchmarking.md describes each).
#
# What it writes, under $OUT (default ./gpu-run-out):
#   NAME.tgz         every step's log and result, in the layout of bench/results: <machine>/
#                    (<machine> = h200x4 for a lane of 4 x H200: the GPU kind and the lane's GPU count)
#                    holds <what>_<ranks>.csv and .png, <machine>/tests/<suite>_<ranks>.log the test
#                    logs; logs/ every step's full output. To commit it:
#                    tar xzf NAME.tgz -C bench/results --exclude ./logs
#   NAME_summary.txt one line per step: exit code, seconds, the last line saying what passed.
# NAME.tgz is rewritten after every step (a device machine returns a few files, and a run cut
# short keeps what it finished).
#
# Every step runs under `timeout`, never past BUDGET_S (default 540) from the start; what is left
# when the budget is spent is skipped and said so. Benchmarks of lanes that run at once share the
# host and the NVSwitch: every bench interleaves symmem with its references within its own run, so
# a comparison within a CSV holds; the logs of such steps say "concurrent".
#
# Settings: BUNDLE (default .device/bundle.tar.xz, or a build-bundle/ folder), BUDGET_S, OUT,
# GPU_RUN_WORK (default /tmp/symmem-gpu-run, kept between runs of a warm machine), and per step
# below (SHARED_WORLDS; SHARED_FILTER: only the cases of shared_gpu_tests whose name holds it;
# FSDP_STEPS; MOE_PATHS: the paths of moe_combine_paths (default "registers bulk reduced"); MOE_AB_ARGS, MOE_PATHS_ARGS, FUSED_ARGS: more arguments of moe_ab's, moe_combine_paths' and
# fused_b_transposed's benches; ...). DRY_RUN=1 prints each step's command instead of running it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

# One line per step: its name and what it runs (--list prints them).
STEPS='
gpu_tests                  C++ GPU tests, one process per GPU (symmem_gpu_tests)
kill_tests                 a rank killed mid-loop on the SM, low-latency, copy-engine and graph paths (2 ranks)
hierarchical_tests         the hierarchical tests on 1 node x N and N simulated nodes x 1 (2 ranks)
torch_tests                every symmem.torch GPU test (tests/python/gpu/run.sh)
torch_tests_a              the same, first half: every file but those of the second half (docs, FSDP, fused ops, torch layer)
torch_tests_b              the same, second half: MoE, torch, Triton, nodes
torch_tests_simulated_nodes  symmem.torch across simulated nodes (SYMMEM_NODE_SIZE)
shared_gpu_tests           C++ multi-rank protocols, ranks as threads on one GPU (SHARED_WORLDS, default 2 3 4 8)
shared_gpu_moe_tests       all-to-all and MoE on one GPU, every combine path (SHARED_WORLDS)
shared_gpu_shim_tests      libsymmem_nccl.so served on one GPU behind a stand-in NCCL (SHARED_WORLDS)
shared_gpu_nccl_tests      nccl-tests'"'"' data checks through libsymmem_nccl.so, processes on one GPU (SHARED_WORLDS)
shared_gpu_torch_tests     the symmem.torch GPU suite with every rank on one GPU, NCCL a stand-in moving data on the host (SHARED_WORLDS)
shared_gpu_torch_shim      unchanged PyTorch (DDP, FSDP2, TP, graphs, groups) through libsymmem_nccl.so, processes on one GPU (SHARED_WORLDS)
triton_shared_gpu_tests    symmem.triton on one GPU at 2, 3, 4, 8 ranks
triton_ops_tests           the symmem.triton example ops at world 1
cuda_example               the CUDA example at 2, 3, 4, 8 ranks on one GPU, and with a dead rank
sanitize_all_to_all        compute-sanitizer memcheck, racecheck, synccheck on the all-to-all kernels, world 1 only (COMPUTE_SANITIZER)
all_gather                 symmem-bench all_gather, 1 KiB-256 MiB per rank, eager
all_gather_graph           the same replayed from CUDA graphs, 1 KiB-16 MiB
all_gather_sm_budget       all_gather at three fp16 shapes over 4-128 blocks, NCCL at 4-32 CTAs
all_gather_pull_vs_push    pull against push under an SM budget (8, 16, 32 blocks), 1-256 MiB
all_gather_hierarchical    the hierarchical all-gather over 1 node, and over 2 simulated nodes, 16-256 MiB
all_reduce                 symmem-bench all_reduce, 1 KiB-256 MiB, eager
all_reduce_vllm            vLLM'"'"'s all-reduce table (T x 8192 bf16), eager and from CUDA graphs
all_reduce_graph_small     all_reduce 1-64 KiB from CUDA graphs
reduce_scatter             symmem-bench reduce_scatter, 1 KiB-256 MiB, eager
reduce_scatter_graph_small reduce_scatter 1-256 KiB from CUDA graphs
all_to_all                 symmem-bench all_to_all: uniform eager and graph, zipf and one-hot splits
all_to_all_graph_blocks    all_to_all 16-256 KiB from graphs over 8-64 blocks
all_to_all_blocks          all_to_all 256 KiB-64 MiB, push and pull: uniform over 4-128 blocks, zipf and one-hot over 16-128
all_to_all_vdev            symmem.bench.all_to_all_vdev: device splits against torch and NCCL
moe                        symmem.bench.moe: MoE dispatch / combine against vLLM'"'"'s path and NCCL
moe_sm_budget              decode-128 (both layouts) and prefill-4096 (rank-major): the default, and 24-132 blocks
moe_combine_paths          the combine forced to each path (SYMMEM_MOE_COMBINE=registers, bulk, reduced)
moe_ab                     moe with this bundle and an older library alternating (bundle.sh OLD_CAPI), merged with one figure
overlap                    symmem-bench overlap: GEMM + in-place all-gather on two streams
fused                      symmem.bench.all_gather_matmul: all_gather_matmul and matmul_reduce_scatter
fused_b_transposed         the fused ops with B = W.t() (column-major, read in place) against a contiguous B
all_gather_matmul_triton   the Triton all-gather + matmul example against the CUDA op
triton_gemm_vs_mm          the Triton example'"'"'s GEMM against torch.mm at world 1
torch_collectives          symmem.bench.torch: the drop-ins against NCCL and torch symm_mem (Triton row too)
torch_local_all_reduce     symmem.bench.torch: TPAllReduce on plain tensors of 8-128 MiB against NCCL
torch_overhead             symmem.bench.overhead: host cost per call of each layer
skew                       symmem.bench.skew: what a late rank costs an all-reduce beyond its lateness, NCCL against symmem
skew_ab                    skew with this bundle and an older library alternating (bundle.sh OLD_CAPI), merged with one figure
triton_all_gather          symmem.bench.kernels: user all-gather kernels (Triton, CUDA) against NCCL per SM count
triton_all_gather_graph    the same from CUDA graphs
triton_all_gather_tiles    the Triton all-gather at 16 programs per tile shape (TILE_SWEEP)
triton_all_reduce_grids    the Triton one-shot all-reduce per grid (TRITON_GRIDS) against torch one_shot
host_cost                  symmem-bench host_cost (one GPU): CPU time per call, 1 KiB and 64 KiB
nccl_shim                  libsymmem_nccl.so: nccl-tests, a PyNccl client, PyTorch steps and a killed rank, against plain NCCL
nccl_tests_repeat          nccl-tests 1-256 KiB through libsymmem_nccl.so and plain, NCCL_REPEATS times (default 4, each order twice): medians and plain NCCL'"'"'s own spread
host_cost_ab               tools/torch_host_cost_ab.py: an older tree (bundle.sh OLD_TORCH_TREE) against this one
host_cost_torch            tools/torch_host_cost_ab.py: host cost per call of this tree beside NCCL (world 1)
chunked_gemm               symmem-bench chunked_gemm (one GPU): one GEMM against row blocks
fsdp_step                  symmem.bench.fsdp: an FSDP2 training step, implicit and explicit prefetch
tune                       every algorithm x block count; writes the tuning tables (--tune)
tuned                      the tables of tune merged and used: all_gather, all_reduce_vllm, reduce_scatter
'
if [ "${1:-}" = --list ]; then
  echo "$STEPS" | sed '/^$/d'
  exit 0
fi
NAME=${1:?usage: scripts/gpu_run.sh NAME LANE... [-- LANE...]... (--list: the steps)}
shift
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
START=$SECONDS  # the budget counts from here: unpacking too
OUT=${OUT:-$PWD/gpu-run-out}
W=${GPU_RUN_WORK:-/tmp/symmem-gpu-run}
DRY=${DRY_RUN:-0}
mkdir -p "$OUT" "$W"
BUNDLE=${BUNDLE:-.device/bundle.tar.xz}
if [ -d "$BUNDLE" ]; then
  B=$(cd "$BUNDLE" && pwd)
elif [ "$DRY" = 1 ] && [ ! -e "$BUNDLE" ]; then
  B=$W/bundle
else
  # A warm machine keeps $W: a bundle is unpacked once per content.
  B=$W/bundle_$(md5sum "$BUNDLE" | cut -c1-12)
  if [ ! -d "$B" ]; then
    rm -rf "$W/unpack" && mkdir -p "$W/unpack" && tar xJf "$BUNDLE" -C "$W/unpack" && mv "$W/unpack/build-bundle" "$B"
  fi
fi
export SYMMEM_LIBRARY="$B/libsymmem_capi.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
SYMMEM_COMMIT=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
if [ "$DRY" = 1 ]; then
  GPU=${GPU_KIND:-NVIDIA H200} GPUS=${GPU_COUNT:-4}
else
  GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  GPUS=$(nvidia-smi -L | wc -l)
fi
export SYMMEM_COMMIT SYMMEM_GPU_KIND="$GPU"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$W/triton-cache}
# torch's NVSHMEM heap must hold the torch_vdev rows' buffers (symmem.bench.moe, all_to_all_vdev).
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-8G}
BUDGET=${BUDGET_S:-540}
SUMMARY=$OUT/${NAME}_summary.txt
# A lane's folder in bench/results: the GPU kind and the lane's GPU count ("NVIDIA H100 80GB HBM3",
# a lane of 2 GPUs -> h100x2), whatever the machine's count: 2 GPUs of a 4-GPU machine are the
# same NVSwitch fabric as a 2-GPU machine. run_lane sets MACHINE, RESULTS (CSVs and figures) and
# TESTS (the test logs) for its steps.
KIND=$(sed -E 's/^NVIDIA //; s/ .*//' <<< "$GPU" | tr '[:upper:]' '[:lower:]')
R=$W/$NAME                 # what NAME.tgz holds
L=$R/logs                  # every step's output
mkdir -p "$L"

say() {
  # shellcheck disable=SC2016  # $1 and $2 are the inner shell's arguments
  flock "$W/lock" bash -c 'echo "$1" >> "$2"' _ "$*" "$SUMMARY"
  echo "$*"
}
# Written beside and renamed: a pack cut short leaves the previous archive whole.
pack() {
  [ "$DRY" = 1 ] && return
  # shellcheck disable=SC2016  # the inner shell's arguments
  flock "$W/lock" bash -c 'tar czf "$1.part" -C "$2" . 2>/dev/null && mv "$1.part" "$1"' _ "$OUT/$NAME.tgz" "$R"
}

# step LOG LIMIT_S COMMAND...: COMMAND on this lane's GPUs under the limit and what is left of the
# budget, its output in $L/LOG.log (a test's log is copied to tests/ by test_step).
step() {
  local name=$1 limit=$2 left t0 rc
  shift 2
  if [ "$DRY" = 1 ]; then
    echo "[$DEV] $name: $*"
    return 0
  fi
  left=$((BUDGET - (SECONDS - START)))
  if [ "$left" -lt 15 ]; then
    say "$name [$DEV]: not run (budget spent)"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$SECONDS
  echo "== $name on GPUs $DEV ($GPU, ${NG} ranks, commit $SYMMEM_COMMIT, $(date -u +%FT%TZ), limit ${limit} s${CONCURRENT:+, concurrent with other lanes})" > "$L/$name.log"
  timeout -k 10 "$limit" "$@" >> "$L/$name.log" 2>&1
  rc=$?
  say "$name [$DEV]: rc=$rc in $((SECONDS - t0)) s: $(grep -aE 'passed|failed|FAIL|wrong|SKIPPED' "$L/$name.log" | tail -1 | cut -c1-200)"
  pack
  return $rc
}

# A test: its log also goes to tests/NAME.log (the latest log of a suite, as bench/results keeps).
test_step() {
  local name=$1
  step "$@"
  [ "$DRY" = 1 ] || cp "$L/$name.log" "$TESTS/$name.log"
}

# keep CSV NAME [FIGURE]: a result into the machine's folder as NAME.csv, with the figure beside it
# (FIGURE: a PNG the bench wrote, or the name of one tools/plot_results.py draws from the CSV).
keep() {
  local csv=$1 name=$2 figure=${3:-}
  if [ "$DRY" = 1 ]; then
    echo "      -> $MACHINE/$name.csv"
    return
  fi
  [ -f "$csv" ] || return
  cp "$csv" "$RESULTS/$name.csv"
  if [ -n "$figure" ] && [ -f "$figure" ]; then
    cp "$figure" "$RESULTS/$name.png"
  elif [ -n "$figure" ]; then
    rm -rf "$W/plot" && python3 tools/plot_results.py "$csv" --out "$W/plot" > /dev/null 2>&1 &&
      [ -f "$W/plot/$figure" ] && cp "$W/plot/$figure" "$RESULTS/$name.png"
  fi
  pack
}

# merge_csvs OUT IN...: the rows of CSVs with one header, in one file.
merge_csvs() {
  local out=$1
  shift
  [ "$DRY" = 1 ] && return
  [ -f "$1" ] || return
  { head -1 "$1" && tail -q -n +2 "$@"; } > "$out"
}

# bench NAME LIMIT FIGURE symmem-bench ARGS...: a symmem-bench run kept as NAME.csv.
bench() {
  local name=$1 limit=$2 figure=$3
  shift 3
  step "$name" "$limit" "$B/symmem-bench" "$@" --gpus "$NG" --csv "$L/$name.csv" --json /dev/null
  keep "$L/$name.csv" "$name" "$figure"
}

# torchbench NAME LIMIT MODULE STEM ARGS...: python -m symmem.bench.MODULE under torchrun on this
# lane's GPUs; its STEM.csv and STEM.png kept as NAME.
torchbench() {
  local name=$1 limit=$2 module=$3 stem=$4
  shift 4
  step "$name" "$limit" python3 -m torch.distributed.run --nproc-per-node "$NG" -m "symmem.bench.$module" \
    --out "$L/$name" "$@"
  keep "$L/$name/$stem.csv" "$name" "$L/$name/$stem.png"
}

# ab_runs NAME MODULE ARGS...: symmem.bench.MODULE ABAB, this bundle's library against
# old/libsymmem_capi.so (bundle.sh OLD_CAPI) under this tree's Python package (for changes that keep
# the C ABI), both through ctypes (SYMMEM_FASTCALL=0: the old library has no _fastcall beside it);
# run R of library LIB writes $L/NAME_LIB_R_<ranks>/. Fails, saying so, without an old library. A
# library before 292d943 takes no EpConfig::max_blocks -1 (moe_ab's runs fail on it): give moe_ab
# budgets there (MOE_AB_ARGS=--blocks=32).
ab_runs() {
  local name=$1 module=$2 n=$NG rep lib
  shift 2
  [ -f "$B/old/COMMIT" ] || { say "$name: no old library in the bundle (bundle.sh OLD_CAPI)"; return 1; }
  for rep in 1 2; do
    for lib in old new; do
      local so="$B/libsymmem_capi.so" commit=$SYMMEM_COMMIT
      [ "$lib" = old ] && so="$B/old/libsymmem_capi.so" && commit=$(cat "$B/old/COMMIT")
      step "${name}_${lib}_${rep}_$n" 150 env SYMMEM_LIBRARY="$so" SYMMEM_COMMIT="$commit" SYMMEM_FASTCALL=0 \
        python3 -m torch.distributed.run --nproc-per-node "$n" -m "symmem.bench.$module" "$@" \
        --out "$L/${name}_${lib}_${rep}_$n"
    done
  done
}

# ab_merged NAME MODULE ARGS...: ab_runs, then its runs' CSVs (MODULE_N.csv each) merged into
# NAME_N.csv (their commit column tells the libraries apart) with one figure, the module's --replot.
ab_merged() {
  local name=$1 module=$2 n=$NG
  ab_runs "$@" || return
  merge_csvs "$L/${name}_$n.csv" "$L/${name}_old_1_$n/${module}_$n.csv" "$L/${name}_new_1_$n/${module}_$n.csv" \
    "$L/${name}_old_2_$n/${module}_$n.csv" "$L/${name}_new_2_$n/${module}_$n.csv"
  [ "$DRY" = 1 ] || python3 -m "symmem.bench.$module" --replot "$L/${name}_$n.csv" --out "$L" --stem "${name}_$n"
  keep "$L/${name}_$n.csv" "${name}_$n" "$L/${name}_$n.png"
}

run_step() {
  local s=$1 n=$NG
  local shared_env=(env SYMMEM_TEST_SHARED_GPU=1 CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER)
  case $s in
    # --- tests ---
    gpu_tests) test_step "gpu_tests_${n}_ranks" 300 "$B/symmem-run" -n "$n" --timeout 290 "$B/symmem_gpu_tests" ;;
    kill_tests)
      for path in sm low_latency copy_engine graph; do
        test_step "kill_${path}_2_ranks" 60 "$B/symmem-run" -n 2 --timeout 50 --expect-killed 1 "$B/symmem_kill_tests" "$path"
      done ;;
    hierarchical_tests)
      test_step "hierarchical_tests_1x$n" 120 "$B/symmem-run" -n "$n" --timeout 110 "$B/symmem_gpu_tests" hierarchical
      test_step "hierarchical_tests_${n}x1" 120 "$B/symmem-run" -n "$n" --simulate-nodes "$n" --timeout 110 \
        "$B/symmem_gpu_tests" hierarchical ;;
    torch_tests) test_step "torch_tests_${n}_ranks" 420 tests/python/gpu/run.sh "$n" ;;
    # The same tests in two halves by file, for two pairs of GPUs at once.
    torch_tests_a) test_step "torch_tests_a_${n}_ranks" 420 tests/python/gpu/run.sh "$n" \
      -k "not (test_moe_gpu or test_torch_gpu or test_triton_gpu or test_nodes_gpu)" ;;
    torch_tests_b) test_step "torch_tests_b_${n}_ranks" 420 tests/python/gpu/run.sh "$n" \
      -k "test_moe_gpu or test_torch_gpu or test_triton_gpu or test_nodes_gpu" ;;
    torch_tests_simulated_nodes) test_step "torch_tests_simulated_nodes_${n}_ranks" 150 \
      env SYMMEM_NODE_SIZE=$((n / 2)) tests/python/gpu/run.sh "$n" -k simulated_nodes ;;
    shared_gpu_tests)
      for w in ${SHARED_WORLDS:-2 3 4 8}; do
        test_step "shared_gpu_tests_${w}_ranks" 200 env SYMMEM_SHARED_GPU_WORLDS="$w" "$B/symmem_shared_gpu_tests" \
          ${SHARED_FILTER:-}
      done ;;
    shared_gpu_moe_tests)
      for w in ${SHARED_WORLDS:-2 3 4 8}; do
        test_step "shared_gpu_moe_tests_${w}_ranks" 150 env SYMMEM_SHARED_GPU_WORLDS="$w" CUDA_DEVICE_MAX_CONNECTIONS=32 \
          SYMMEM_MOE_COMBINE=registers "$B/symmem_shared_gpu_moe_tests"
        test_step "shared_gpu_moe_tests_bulk_${w}_ranks" 120 env SYMMEM_SHARED_GPU_WORLDS="$w" \
          CUDA_DEVICE_MAX_CONNECTIONS=32 SYMMEM_MOE_COMBINE=bulk "$B/symmem_shared_gpu_moe_tests" moe_
        test_step "shared_gpu_moe_tests_reduced_${w}_ranks" 120 env SYMMEM_SHARED_GPU_WORLDS="$w" \
          CUDA_DEVICE_MAX_CONNECTIONS=32 SYMMEM_MOE_COMBINE=reduced "$B/symmem_shared_gpu_moe_tests" moe_
      done ;;
    shared_gpu_shim_tests)
      for w in ${SHARED_WORLDS:-2 3 4 8}; do
        test_step "shared_gpu_shim_tests_${w}_ranks" 120 env SYMMEM_SHIM_TEST_WORLDS="$w" \
          SYMMEM_NCCL_LIBRARY="$B/libsymmem_fake_nccl.so" LD_LIBRARY_PATH="$B" "$B/symmem_shared_gpu_shim_tests"
      done ;;
    shared_gpu_nccl_tests)
      local worlds=${SHARED_WORLDS:-2 3 4 8}
      local name="shared_gpu_nccl_tests_${worlds// /_}_ranks"
      test_step "$name" 400 env NCCL_TESTS_BIN="$B/nccl-tests" SHIM="$B/libsymmem_nccl.so" \
        FAKE_NCCL="$B/libsymmem_fake_nccl.so" OUT="$L/$name" scripts/nccl_tests_shared_gpu.sh "$worlds"
      [ "$DRY" = 1 ] || cp "$L/$name/summary.txt" "$TESTS/${name}_summary.txt" 2>/dev/null ;;
    shared_gpu_torch_shim)
      local worlds=${SHARED_WORLDS:-2 3 4 8}
      local name="shared_gpu_torch_shim_${worlds// /_}_ranks"
      test_step "$name" 540 env SHIM="$B/libsymmem_nccl.so" FAKE_NCCL="$B/libsymmem_fake_nccl.so" OUT="$L/$name" \
        scripts/nccl_torch_shared_gpu.sh "$worlds"
      [ "$DRY" = 1 ] || cp "$L/$name/summary.txt" "$TESTS/${name}_summary.txt" 2>/dev/null
      [ "$DRY" = 1 ] || for f in "$L/$name"/*/compare.txt "$L/$name"/*/pynccl.txt "$L/$name"/*/pynccl_windows.txt; do
        [ -f "$f" ] && cp "$f" "$TESTS/${name}_$(basename "$(dirname "$f")")_$(basename "$f")"
      done ;;
    shared_gpu_torch_tests)
      test_step fake_nccl_data_tests 300 env FAKE_NCCL="$B/libsymmem_fake_nccl.so" "$B/symmem_fake_nccl_data_tests"
      for w in ${SHARED_WORLDS:-2 3 4 8}; do
        test_step "shared_gpu_torch_tests_${w}_ranks" 540 env SYMMEM_TEST_SHARED_GPU=1 SHIM="$B/libsymmem_nccl.so" \
          FAKE_NCCL="$B/libsymmem_fake_nccl.so" tests/python/gpu/run.sh "$w" ${SHARED_TORCH_ARGS:-}
      done ;;
    triton_shared_gpu_tests)
      test_step triton_shared_gpu_tests_2_3_4_8_ranks 400 "${shared_env[@]}" SYMMEM_SHARED_GPU_WORLDS="2 3 4 8" \
        python3 -m pytest -v -p no:cacheprovider -rA -o faulthandler_timeout=150 tests/python/triton_gpu/test_triton_shared_gpu.py ;;
    triton_ops_tests) test_step triton_ops_1_rank 150 python3 -m pytest -v -p no:cacheprovider -rA \
      tests/python/triton_gpu/test_triton_ops_world1.py ;;
    cuda_example)
      for w in 2 3 4 8; do
        test_step "cuda_example_${w}_ranks" 60 "${shared_env[@]}" "$B/symmem_example_one_shot_all_reduce" --threads "$w"
      done
      test_step cuda_example_dead_rank_4_ranks 60 "${shared_env[@]}" "$B/symmem_example_one_shot_all_reduce" \
        --threads 4 --dead-rank ;;
    # --- symmem-bench (n ranks) ---
    sanitize_all_to_all)  # world 1 only: the sanitizer serialises kernels, so ranks that wait for each
      # other cannot run under it. COMPUTE_SANITIZER: its path; default the bundle's (bundle.sh
      # SANITIZER_WHEEL), else compute-sanitizer on the PATH
      [ "$n" = 1 ] || { say "sanitize_all_to_all: world 1, in a lane of one GPU (this lane has $n)"; return; }
      local sanitizer=${COMPUTE_SANITIZER:-compute-sanitizer} tool splits
      [ -z "${COMPUTE_SANITIZER:-}" ] && [ -x "$B/compute-sanitizer/compute-sanitizer" ] &&
        sanitizer=$B/compute-sanitizer/compute-sanitizer
      command -v "$sanitizer" > /dev/null || { say "sanitize_all_to_all: no compute-sanitizer (COMPUTE_SANITIZER)"; return; }
      for tool in memcheck racecheck synccheck; do
        for splits in zipf uniform; do  # (the variable kernels, the uniform ones; one rank sends all to itself)
          test_step "sanitize_all_to_all_${tool}_${splits}_1_rank" 150 "$sanitizer" --tool "$tool" \
            --target-processes all --error-exitcode 9 "$B/symmem-bench" all_to_all --gpus 1 -b 4K -e 4M -f 32 \
            -n 2 -w 1 --reps 1 --splits "$splits" --nccl 0 --csv /dev/null --json /dev/null
        done
      done ;;
    all_gather) bench "all_gather_$n" 200 all_gather_latency_vs_size.png all_gather -b 1K -e 256M -f 2 -n 20 -w 5 --reps 5 ;;
    all_gather_graph) bench "all_gather_graph_$n" 120 all_gather_latency_vs_size.png \
      all_gather -b 1K -e 16M -f 4 -n 20 -w 5 --reps 5 --graph ;;
    all_gather_sm_budget) bench "all_gather_sm_budget_$n" 200 all_gather_busbw_vs_sms_128M.png all_gather -d float16 \
      --shapes 2048x4096,8192x8192,16384x16384 -n 10 -w 3 --blocks 4,8,16,32,64,96,128 --nccl-ctas 4,8,16,32 ;;
    all_gather_pull_vs_push) bench "all_gather_pull_vs_push_sm_budget_$n" 150 all_gather_busbw_vs_sms_64M.png \
      all_gather -b 1M -e 256M -f 4 -n 10 -w 3 --blocks 8,16,32 --algos pull,push --nccl 0 ;;
    all_gather_hierarchical)
      bench "all_gather_hierarchical_1x${n}_$n" 150 all_gather_latency_vs_size.png all_gather -b 16M -e 256M -f 2 \
        -n 10 -w 3 --reps 5 --algos copy_engine,hierarchical
      bench "all_gather_hierarchical_2x$((n / 2))_$n" 200 all_gather_latency_vs_size.png all_gather --simulate-nodes 2 \
        -b 16M -e 256M -f 2 -n 10 -w 3 --reps 5 --algos copy_engine,hierarchical ;;
    all_reduce) bench "all_reduce_$n" 200 all_reduce_latency_vs_size.png all_reduce -b 1K -e 256M -f 4 -n 20 -w 5 --reps 5 ;;
    all_reduce_vllm)
      bench "all_reduce_vllm_eager_$n" 150 all_reduce_latency_vs_size.png all_reduce --vllm-table -n 20 -w 5 --reps 5
      bench "all_reduce_vllm_graph_$n" 150 all_reduce_latency_vs_size.png all_reduce --vllm-table -n 20 -w 5 --reps 5 --graph ;;
    all_reduce_graph_small) bench "all_reduce_graph_small_$n" 100 all_reduce_latency_vs_size.png \
      all_reduce -b 1K -e 64K -f 2 -n 50 -w 10 --reps 7 --graph ;;
    reduce_scatter) bench "reduce_scatter_$n" 200 reduce_scatter_latency_vs_size.png \
      reduce_scatter -b 1K -e 256M -f 4 -n 20 -w 5 --reps 5 ;;
    reduce_scatter_graph_small) bench "reduce_scatter_graph_small_$n" 100 reduce_scatter_latency_vs_size.png \
      reduce_scatter -b 1K -e 256K -f 2 -n 50 -w 10 --reps 7 --graph ;;
    all_to_all)
      bench "all_to_all_$n" 150 all_to_all_latency_vs_size.png all_to_all -b 1K -e 64M -f 4 -n 20 -w 5 --reps 5
      bench "all_to_all_graph_$n" 100 all_to_all_latency_vs_size.png all_to_all -b 1K -e 1M -f 4 -n 20 -w 5 --reps 5 --graph
      bench "all_to_all_zipf_$n" 100 "" all_to_all -b 4K -e 64M -f 4 -n 20 -w 5 --reps 5 --splits zipf
      bench "all_to_all_onehot_$n" 100 "" all_to_all -b 4K -e 64M -f 4 -n 20 -w 5 --reps 5 --splits onehot ;;
    all_to_all_graph_blocks) bench "all_to_all_graph_blocks_$n" 120 "" all_to_all -b 16K -e 256K -f 2 -n 20 -w 5 \
      --reps 5 --graph --algos low_latency,push --blocks 8,16,24,32,48,64 ;;
    all_to_all_blocks)
      bench "all_to_all_blocks_$n" 120 "" all_to_all -b 256K -e 64M -f 2 -n 20 -w 5 --reps 3 --algos push,pull \
        --blocks 4,8,16,32,48,64,96,128
      bench "all_to_all_blocks_zipf_$n" 120 "" all_to_all -b 256K -e 64M -f 4 -n 20 -w 5 --reps 3 --splits zipf \
        --algos push,pull --blocks 16,32,64,96,128
      bench "all_to_all_blocks_onehot_$n" 120 "" all_to_all -b 256K -e 64M -f 4 -n 20 -w 5 --reps 3 --splits onehot \
        --algos push,pull --blocks 16,32,64,96,128 ;;
    overlap)
      bench "overlap_$n" 100 overlap.png overlap -n 10 --reps 5
      keep "$L/overlap_${n}_phases.csv" "overlap_phases_$n" ;;
    host_cost)
      for b in 1K 64K; do
        step "host_cost_${b}_$n" 100 "$B/symmem-bench" host_cost --gpus "$n" -b $b -n 200 --reps 15 \
          --csv "$L/host_cost_${b}_$n.csv" --json /dev/null
      done
      merge_csvs "$L/host_cost_$n.csv" "$L/host_cost_1K_$n.csv" "$L/host_cost_64K_$n.csv"
      keep "$L/host_cost_$n.csv" "host_cost_$n" host_cost_1K.png ;;
    chunked_gemm)  # one GPU whatever the lane: kept with the 1-GPU results
      local MACHINE=${KIND}x1 RESULTS=$R/${KIND}x1
      mkdir -p "$RESULTS"
      for d in float16 bfloat16; do
        for m in 4096 8192 16384; do
          step "chunked_gemm_${d}_$m" 120 "$B/symmem-bench" chunked_gemm --gpus 1 -d $d --gemm ${m}x6656x16384 \
            --chunks 2,4,8 -n 10 --reps 7 --csv "$L/chunked_gemm_${d}_$m.csv" --json /dev/null
        done
      done
      merge_csvs "$L/chunked_gemm_1.csv" "$L"/chunked_gemm_*_*.csv
      keep "$L/chunked_gemm_1.csv" chunked_gemm_1 chunked_gemm_float16.png ;;
    tune)  # every algorithm x block count, the table chosen from it (--tune), in logs/; TUNE_NCCL=1 adds NCCL's rows
      local nccl=(--nccl 0)
      [ "${TUNE_NCCL:-0}" = 1 ] && nccl=()
      for op in all_gather all_reduce reduce_scatter; do
        step "tune_${op}_$n" 200 "$B/symmem-bench" "$op" -b 1K -e 256M -f 2 -n 10 -w 3 --reps 3 \
          --blocks 8,16,32,64,128 "${nccl[@]}" --tune "$L/tune_${op}_$n.json" --gpus "$n" --csv "$L/tune_${op}_$n.csv" \
          --json /dev/null
      done ;;
    tuned)  # the tables tune wrote, merged (tools/merge_tuning.py: logs/tuning_N.json, for tuning/) and used
      if [ "$DRY" != 1 ]; then
        rm -f "$L/tuning_$n.json"
        if ! python3 tools/merge_tuning.py "$L/tuning_$n.json" "$L"/tune_*_"$n".json > "$L/tuned_merge.log" 2>&1; then
          say "tuned [$DEV]: not run (no tables to merge: $(tail -1 "$L/tuned_merge.log"))"
          return
        fi
      fi
      export SYMMEM_TUNING_FILE="$L/tuning_$n.json"
      run_step all_gather
      run_step all_reduce_vllm
      run_step reduce_scatter
      unset SYMMEM_TUNING_FILE ;;
    # --- symmem.bench modules (torchrun, n ranks) ---
    all_to_all_vdev) torchbench "all_to_all_vdev_$n" 150 all_to_all_vdev "all_to_all_vdev_$n" ;;
    moe) torchbench "moe_$n" 240 moe "moe_$n" --reps 5 ;;
    moe_sm_budget) torchbench "moe_sm_budget_$n" 200 moe "moe_$n" --reps 5 --shapes decode_128,prefill_4096 \
      --impls symmem_expert_major,symmem_rank_major,vllm_ag_rs --blocks=-1,24,32,40,48,64,96,132 ;;
    moe_combine_paths)  # one run per path, each with its reference rows
      for path in ${MOE_PATHS:-registers bulk reduced}; do
        (export SYMMEM_MOE_COMBINE=$path
          torchbench "moe_combine_${path}_$n" 150 moe "moe_$n" --reps 5 \
            --shapes decode_1,decode_128,prefill_4096 --impls symmem_expert_major,symmem_rank_major,vllm_ag_rs \
            ${MOE_PATHS_ARGS:-})
      done ;;
    moe_ab) ab_merged moe_ab moe --reps 5 --impls "${MOE_AB_IMPLS:-symmem_expert_major,symmem_rank_major,vllm_ag_rs}" \
      ${MOE_AB_ARGS:-} ;;
    fused)
      for op in all_gather_matmul matmul_reduce_scatter; do
        torchbench "${op}_$n" 200 all_gather_matmul "$op" --op $op --reps 7
      done ;;
    fused_b_transposed)  # B given as W.t() (read in place, column-major) against a contiguous B, same run
      for op in all_gather_matmul matmul_reduce_scatter; do
        torchbench "${op}_b_transposed_$n" 150 all_gather_matmul "$op" --op $op --reps 7 --dtypes fp16 bf16 \
          --impls gemm_alone symmem_fused symmem_fused_b_transposed ${FUSED_ARGS:-}
      done ;;
    all_gather_matmul_triton) torchbench "all_gather_matmul_triton_$n" 300 all_gather_matmul all_gather_matmul --reps 7 \
      --dtypes fp16 --impls gemm_alone nccl_then_gemm symmem_fused symmem_triton_fused ;;
    triton_gemm_vs_mm)  # one GPU whatever the lane: kept with the 1-GPU results
      local MACHINE=${KIND}x1 RESULTS=$R/${KIND}x1
      mkdir -p "$RESULTS"
      step triton_gemm_vs_mm_1 200 python3 -m symmem.triton.examples.all_gather_matmul --world1-vs-mm \
      --csv "$L/triton_gemm_vs_mm_1.csv" --commit "$SYMMEM_COMMIT" --dtype float16
      keep "$L/triton_gemm_vs_mm_1.csv" triton_gemm_vs_mm_1 ;;
    torch_collectives) torchbench "torch_collectives_$n" 240 torch "torch_bench_$n" --triton ;;
    torch_local_all_reduce)  # TPAllReduce on plain tensors, 8-128 MiB (the planner's local-operand rules) against NCCL
      torchbench "torch_local_all_reduce_$n" 240 torch "torch_bench_$n" --ops all_reduce \
        --tokens 512 1024 2048 4096 8192 --no-symm-mem --reps 9 ;;
    skew) torchbench "skew_$n" 200 skew "skew_$n" ;;
    skew_ab) ab_merged skew_ab skew --stem "skew_$n" ;;
    torch_overhead) step "torch_overhead_$n" 90 python3 -m torch.distributed.run --nproc-per-node "$n" -m symmem.bench.overhead ;;
    triton_all_gather) torchbench "triton_all_gather_$n" 240 kernels "kernels_$n" --reps 5 ;;
    triton_all_gather_graph) torchbench "triton_all_gather_graph_$n" 240 kernels "kernels_$n" --reps 5 --graph ;;
    triton_all_gather_tiles)  # tiles as warps:bytes per thread, at 16 programs against the CUDA pull at 16 blocks
      for cfg in ${TILE_SWEEP:-16:64 16:128 32:64}; do
        torchbench "triton_all_gather_tile_w${cfg%%:*}_b${cfg#*:}_$n" 60 kernels "kernels_$n" --reps 5 --sms 16 \
          --impls symmem_cuda_pull,symmem_triton_pull,symmem_triton_push --triton-warps "${cfg%%:*}" \
          --triton-bytes-per-thread "${cfg#*:}"
      done ;;
    triton_all_reduce_grids) torchbench "triton_all_reduce_grids_$n" 240 torch "torch_bench_$n" --triton \
      --ops all_reduce --triton-grids "${TRITON_GRIDS:-48:16,64:16,32:32,64:32,24:64}" ;;
    nccl_shim)  # libsymmem_nccl.so against plain NCCL (scripts/gpu_nccl_shim.sh; NCCL_SHIM_ONLY: its steps to run;
      # NCCL_SHIM_S: its budget, 300 s on one GPU, 540 from two on; the step's own limit 30 s more,
      # so that the script ends on its budget and reports which of its steps that skipped)
      local shim_s=${NCCL_SHIM_S:-$([ "$n" = 1 ] && echo 300 || echo 540)}
      step "nccl_shim_$n" $((shim_s + 30)) env OUT="$L/nccl_shim_$n" BUDGET_S="$shim_s" \
        ONLY="${NCCL_SHIM_ONLY:-}" MODES="${NCCL_SHIM_MODES:-processes threads}" TYPES="${NCCL_SHIM_TYPES:-bfloat16 half float}" \
        scripts/gpu_nccl_shim.sh "$n" "$B"
      if [ "$DRY" != 1 ] && [ -d "$L/nccl_shim_$n" ]; then
        # The torch steps' per-rank results (parameters, megabytes) served their comparison.
        find "$L/nccl_shim_$n" -name '*.pt' -delete
        keep "$L/nccl_shim_$n/nccl_tests/nccl_tests.csv" "nccl_tests_$n"
        keep "$L/nccl_shim_$n/nccl_tests_windows/nccl_tests.csv" "nccl_tests_windows_$n"
        keep "$L/nccl_shim_$n/pynccl.csv" "nccl_shim_pynccl_$n"
        keep "$L/nccl_shim_$n/pynccl_workspace_256.csv" "nccl_shim_pynccl_workspace_256_$n"
        keep "$L/nccl_shim_$n/pynccl_windows.csv" "nccl_shim_pynccl_windows_$n"
        cp -r "$L/nccl_shim_$n" "$TESTS/" 2>/dev/null
      fi ;;
    nccl_tests_repeat)  # where a call takes ~10 us: forwarded rows held to plain NCCL's spread against itself, served rows per placement
      step "nccl_tests_repeat_$n" 420 env OUT="$L/nccl_tests_repeat_$n" REPEATS="${NCCL_REPEATS:-4}" \
        MODES="${NCCL_SHIM_MODES:-processes threads}" COLLECTIVES="${NCCL_REPEAT_COLLECTIVES:-all_reduce reduce_scatter alltoall}" \
        TYPES="${NCCL_SHIM_TYPES:-bfloat16}" SWEEP="-b 1K -e 256K -f 4 -n 100 -w 20 -c 1" \
        SHIM="$B/libsymmem_nccl.so" NCCL_TESTS_BIN="$B/nccl-tests" scripts/nccl_tests_run.sh "$n"
      keep "$L/nccl_tests_repeat_$n/nccl_tests.csv" "nccl_tests_repeat_$n"
      [ "$DRY" = 1 ] || cp "$L/nccl_tests_repeat_$n/summary.txt" "$TESTS/nccl_tests_repeat_${n}_summary.txt" 2>/dev/null ;;
    host_cost_ab)  # host and graph cost of st.all_reduce at 0.5 MiB, world 1: an older tree (bundle.sh OLD_TORCH_TREE) and this one interleaved
      [ -f "$B/old_torch/COMMIT" ] || { say "host_cost_ab: no old tree in the bundle (bundle.sh OLD_TORCH_TREE)"; return; }
      [ "$n" = 1 ] || { say "host_cost_ab: world 1, in a lane of one GPU (this lane has $n)"; return; }
      step torch_host_cost_ab_1 300 python3 tools/torch_host_cost_ab.py \
        --tree "$(cat "$B/old_torch/COMMIT")=$B/old_torch:$B/old_torch/libsymmem_capi.so" --tree "new=.:$B/libsymmem_capi.so" \
        --reps "${REPS:-5}" --samples 5 --cpu 3 --gpu "$GPU" --out "$L/torch_host_cost_ab_1.csv"
      keep "$L/torch_host_cost_ab_1.csv" torch_host_cost_ab_1 ;;
    host_cost_torch)  # the same rows, this tree alone, with NCCL's all_reduce beside them (world 1)
      [ "$n" = 1 ] || { say "host_cost_torch: world 1, in a lane of one GPU (this lane has $n)"; return; }
      step torch_host_cost_1 200 python3 tools/torch_host_cost_ab.py --tree "$SYMMEM_COMMIT=.:$B/libsymmem_capi.so" \
        --reps "${REPS:-5}" --samples 5 --cpu 3 --gpu "$GPU" --out "$L/torch_host_cost_1.csv" --plot
      keep "$L/torch_host_cost_1.csv" torch_host_cost_1 "$L/torch_host_cost_1_host.png" ;;
    fsdp_step)
      for prefetch in implicit explicit; do
        torchbench "fsdp_step_${prefetch}_prefetch_$n" 300 fsdp "fsdp_step_$n" --prefetch $prefetch \
          --steps "${FSDP_STEPS:-30}"
      done ;;
    *) say "unknown step $s (scripts/gpu_run.sh --list)" ;;
  esac
}

# A lane may chain groups: "0:shared_gpu_tests & 1:triton_shared_gpu_tests > 0,1:all_gather" runs the
# first two at once, then the third once both are done ('&' at once, '>' after).
run_group() {
  local spec=$1 seq part pids
  local -a seqs parts
  IFS='>' read -ra seqs <<< "$spec"
  for seq in "${seqs[@]}"; do
    IFS='&' read -ra parts <<< "$seq"
    # "concurrent" in a step's log: other lanes of the phase, or other parts of this group, run beside it.
    if [ -n "${OTHER_LANES:-}" ] || [ ${#parts[@]} -gt 1 ]; then export CONCURRENT=1; else unset CONCURRENT; fi
    pids=()
    for part in "${parts[@]}"; do
      part=$(sed 's/^ *//; s/ *$//' <<< "$part")
      if [ -n "$part" ]; then
        run_lane "$part" &
        pids+=($!)
      fi
    done
    wait "${pids[@]}"
  done
}

run_lane() {  # DEVICES:STEPS
  local spec=$1
  export DEV=${spec%%:*}
  export CUDA_VISIBLE_DEVICES=$DEV
  NG=$(($(tr -cd ',' <<< "$DEV" | wc -c) + 1))
  export NG
  MACHINE=${KIND}x$NG RESULTS=$R/${KIND}x$NG TESTS=$R/${KIND}x$NG/tests
  mkdir -p "$TESTS"
  # Lanes at once: torchrun's rendezvous port apart per lane (tests/python/gpu/run.sh too).
  export PET_MASTER_PORT=$((29500 + 10 * ${DEV%%,*}))
  for s in ${spec#*:}; do run_step "$s"; done
}

if [ "$DRY" != 1 ]; then
  {
    echo "$(date -u +%FT%TZ) $NAME: $GPU x $GPUS, commit $SYMMEM_COMMIT, budget ${BUDGET} s"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,power.draw --format=csv,noheader
    nvidia-smi topo -m 2>/dev/null | head -8
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1
  } > "$L/machine.txt" 2>&1
  say "$(head -1 "$L/machine.txt")"
fi
phase=()
run_phase() {
  [ ${#phase[@]} -eq 0 ] && return
  local pids=() lane
  unset OTHER_LANES
  if [ ${#phase[@]} -gt 1 ]; then export OTHER_LANES=1; fi
  for lane in "${phase[@]}"; do
    run_group "$lane" &
    pids+=($!)
  done
  wait "${pids[@]}"
  phase=()
}
for a in "$@"; do
  if [ "$a" = "--" ]; then run_phase; else phase+=("$a"); fi
done
run_phase
[ "$DRY" = 1 ] || say "$(date -u +%FT%TZ) $NAME done in $((SECONDS - START)) s"
pack
