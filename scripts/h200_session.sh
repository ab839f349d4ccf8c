#!/usr/bin/env bash
# The GPU session behind bench/results/h200 (2 x H200): run on the device machine from the
# repository root with binaries built here and carried in build-bundle/ (scripts/bundle.sh).
#   scripts/h200_session.sh tests    GPU tests (2 ranks), kill tests, negative control on 6cf5c42
#   scripts/h200_session.sh bench    all-gather sweep, vLLM tables (eager, graph), A/B vs 6cf5c42
#   scripts/h200_session.sh vllm | sanitize | only   vLLM tables; racecheck; TESTS=/NEGATIVE_TESTS= by name
#   scripts/h200_session.sh torch    symmem.torch GPU tests (torchrun, 2 ranks) and python -m symmem.bench.torch
#   scripts/h200_session.sh torch_pdl   SYMMEM_PDL=1/0 A/B (vLLM table, graph), then the torch stage
#   scripts/h200_session.sh scatter_ab | tune_medium | final_torch   (see each stage)
#   scripts/h200_session.sh single_gpu | chunked_gemm   world-1 GPU tests, memcheck, host cost; chunked GEMM (one GPU)
#   scripts/h200_session.sh fused    issue 12: all_gather_matmul GPU tests (torchrun, 2 ranks), then its
#                                    benchmark against gemm_alone, nccl_then_gemm and torch's fused op
#   scripts/h200_session.sh fused_single   issue 12 on one GPU: tests, bench and memcheck at world 1
#   scripts/h200_session.sh reduce_single  issue 12's matmul_reduce_scatter on one GPU: tests, bench, memcheck
#   scripts/h200_session.sh fused_gemm_tiles   the fused GEMM's tile configurations against cuBLASLt (one GPU)
#   scripts/h200_session.sh shared_gpu   one GPU: the shared-GPU tests (2-8 ranks as threads) and their mutants
#   scripts/h200_session.sh survey   first 2-GPU call: small-message sweeps, GPU tests, fused, hierarchical (one deadline)
#   scripts/h200_session.sh final_two_gpu   the committed 2-GPU figures after a survey (one deadline)
#   scripts/h200_session.sh copy_engine_ab   the copy-engine fixed cost against two earlier binaries, then its tests
#   scripts/h200_session.sh across_nodes_checks   kill and torch paths across simulated nodes, torch tests
#   scripts/h200_session.sh final_checks   the last 2-GPU checks of session 14 (tests, failure paths, copy engine A/B)
#   scripts/h200_session.sh fsdp_probe   issue 11: reduce-scatter by SM budget, FSDP2 steps by budget, traced
#   scripts/h200_session.sh fsdp_final   issue 11's committed figures: FSDP tests, step bench (both prefetches)
#   scripts/h200_session.sh hierarchical   issue 13: its tests on 1 node x 2 and 2 simulated nodes x 1, the
#                                          kill path, symmem.torch across nodes, and the all-gather sweeps
# Logs and CSVs go to $OUT/session_<stage>.tgz (or ./session-out).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=build-bundle
export SYMMEM_COMMIT=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
FINAL=${OUT:-session-out}
OUT=$(mktemp -d)  # everything goes into one archive at the end ($FINAL/session.tgz)
mkdir -p "$FINAL"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/gpus_$1.txt" 2>&1

# Every GPU test on 2 ranks: the committed log.
gpu_tests() {
  timeout 420 "$B/symmem-run" -n 2 --timeout 400 "$B/symmem_gpu_tests" > "$OUT/gpu_tests_2_ranks.log" 2>&1
  echo "gpu tests rc=$?" >> "$OUT/summary.txt"
}

# A fused op's bench at world 1: fused_bench_1 NAME [bench args] -> $FINAL/NAME_1/, NAME_bench_1.log.
fused_bench_1() {
  local name=$1; shift
  timeout ${FUSED_BENCH_S:-200} python3 -m torch.distributed.run --nproc-per-node 1 -m symmem.bench.all_gather_matmul \
    "$@" --out "$FINAL/${name}_1" --reps 7 ${FUSED_BENCH_ARGS:-} > "$FINAL/${name}_bench_1.log" 2>&1
  echo "$name bench (1 rank) rc=$?" >> "$FINAL/summary.txt"
}

# Memcheck of the fused GPU tests a pytest -k selection picks, at world 1 (unless SKIP_MEMCHECK):
# fused_memcheck_1 NAME SELECTION -> $FINAL/NAME_memcheck_1.log.
fused_memcheck_1() {
  [ -n "${SKIP_MEMCHECK:-}" ] && return
  timeout 240 compute-sanitizer --report-api-errors no --error-exitcode 3 --tool memcheck \
    --target-processes all python3 -m torch.distributed.run --nproc-per-node 1 -m pytest tests/python/gpu \
    -p no:cacheprovider -q -k "$2" > "$FINAL/$1_memcheck_1.log" 2>&1
  echo "$1 memcheck (1 rank) rc=$?" >> "$FINAL/summary.txt"
}

# Chunked GEMM (issue 12's floor): the issue's shapes, fp16 and bf16, every layout checked.
chunked_gemms() {
  for d in fp16 bf16; do
    for m in 4096 8192 16384; do
      timeout 120 "$B/symmem-bench" chunked_gemm --gpus 1 -d $d --gemm ${m}x6656x16384 --chunks 2,4,8 -n 10 --reps 7 \
        --csv "$OUT/chunked_gemm_${d}_$m.csv" --json /dev/null > "$OUT/chunked_gemm_${d}_$m.txt" 2>&1
      echo "chunked_gemm $d $m rc=$?" >> "$OUT/summary.txt"
    done
  done
}

# The named GPU tests built against 6cf5c42 (tests/gpu/negative_control.sh), each on its own.
old_tests() {
  for t in "$@"; do
    timeout 120 "$B/symmem-run" -n 2 --timeout 110 "$B/old_api_gpu_tests" "$t" > "$OUT/old_$t.log" 2>&1
    echo "old $t rc=$?" >> "$OUT/summary.txt"
  done
}

# The all-gather sweep, 1 MiB to 256 MiB per rank, every symmem algorithm against every NCCL row.
all_gather_sweep() {
  timeout 200 "$B/symmem-bench" all_gather --gpus 2 -b 1M -e 256M -f 2 -n 20 -w 5 --reps 5 \
    --csv "$OUT/all_gather_2.csv" --json "$OUT/all_gather_2.json" > "$OUT/all_gather_2.txt" 2>&1
  echo "all_gather rc=$?" >> "$OUT/summary.txt"
}

# The vLLM all-reduce table (T x 8192 bf16), eager and replayed from CUDA graphs.
vllm_tables() {
  for mode in eager graph; do
    graph=""; [ $mode = graph ] && graph=--graph
    timeout 150 "$B/symmem-bench" all_reduce --gpus 2 --vllm-table -n 20 -w 5 --reps 5 $graph \
      --csv "$OUT/vllm_table_${mode}_2.csv" --json "$OUT/vllm_table_${mode}_2.json" > "$OUT/vllm_table_${mode}_2.txt" 2>&1
    echo "vllm $mode rc=$?" >> "$OUT/summary.txt"
  done
}

# symmem.torch: the Python package from python/ with the carried native library.
torch_stage() {
  # Written straight into $FINAL, so that what finished comes back even if a later step is cut.
  export SYMMEM_LIBRARY="$PWD/$B/libsymmem_capi.so" PYTHONPATH="$PWD/python"
  if [ -z "${SKIP_TORCH_TESTS:-}" ]; then
    timeout ${TORCH_TESTS_S:-240} tests/python/gpu/run.sh 2 ${PYTEST_ARGS:-} > "$FINAL/torch_tests_2_ranks.log" 2>&1
    echo "torch tests rc=$?" >> "$FINAL/summary.txt"
  fi
  [ -n "${SKIP_TORCH_BENCH:-}" ] && return
  timeout ${TORCH_BENCH_S:-150} python3 -m torch.distributed.run --nproc-per-node 2 -m symmem.bench.torch \
    --out "$FINAL/torch" ${TORCH_BENCH_ARGS:-} > "$FINAL/torch_bench_2.log" 2>&1
  echo "torch bench rc=$?" >> "$FINAL/summary.txt"
  timeout ${TORCH_OVERHEAD_S:-60} python3 -m torch.distributed.run --nproc-per-node 2 -m symmem.bench.overhead > "$FINAL/torch_overhead_2.log" 2>&1
  echo "torch overhead rc=$?" >> "$FINAL/summary.txt"
}

# Programmatic dependent launch on and off (SYMMEM_PDL), alternating, 2 rounds: the vLLM
# all-reduce table replayed from graphs.
pdl_ab() {
  mkdir -p "$FINAL/pdl_ab"
  for rep in 1 2; do
    for pdl in 1 0; do
      SYMMEM_PDL=$pdl timeout ${PDL_AB_S:-40} "$B/symmem-bench" all_reduce --gpus 2 --vllm-table -n 20 -w 5 --reps 3 \
        --graph --nccl 0 --csv "$FINAL/pdl_ab/vllm_graph_pdl${pdl}_${rep}.csv" --json /dev/null \
        > "$FINAL/pdl_ab/vllm_graph_pdl${pdl}_${rep}.txt" 2>&1
      echo "pdl=$pdl rep $rep rc=$?" >> "$FINAL/summary.txt"
    done
  done
}

# Every GPU test on 2 ranks, written straight into $FINAL (the stages that write as they go).
gpu_tests_into_final() {
  timeout ${GPU_TESTS_S:-240} "$B/symmem-run" -n 2 --timeout 230 "$B/symmem_gpu_tests" > "$FINAL/gpu_tests_2_ranks.log" 2>&1
  echo "gpu tests rc=$?" >> "$FINAL/summary.txt"
}

# The named kill tests (rank 1 killed, the other must fail naming it), into $FINAL.
kill_tests_into_final() {
  for path in "$@"; do
    timeout 60 "$B/symmem-run" -n 2 --timeout 50 --expect-killed 1 "$B/symmem_kill_tests" $path > "$FINAL/kill_$path.log" 2>&1
    echo "kill $path rc=$?" >> "$FINAL/summary.txt"
  done
}

# The 2-GPU stages of session 14 run under one deadline and write straight into $FINAL, so that
# what finished comes back. start_deadline DEFAULT_S (SURVEY_S overrides); left N: N seconds, or
# what is left of the deadline (at least 5).
start_deadline() {
  export SYMMEM_LIBRARY="$PWD/$B/libsymmem_capi.so" PYTHONPATH="$PWD/python"
  deadline=$((SECONDS + ${SURVEY_S:-$1}))
}
left() { local l=$((deadline - SECONDS)); [ $l -gt $1 ] && echo $1 || echo $((l > 5 ? l : 5)); }
# run_logged NAME LIMIT_S LOG command...: the command under the deadline, its rc in the summary.
run_logged() {
  local name=$1 limit=$2 log=$3; shift 3
  timeout $(left $limit) "$@" > "$log" 2>&1
  echo "$name rc=$?" >> "$FINAL/summary.txt"
}

# Issue 14: all-gather and reduce-scatter, 1 KiB to 256 KiB per rank, low latency and the SM
# algorithms against NCCL, eager and graph, into $FINAL/small: small_sweeps REPS [bench args].
small_sweeps() {
  local reps=$1; shift
  mkdir -p "$FINAL/small"
  for op in all_gather reduce_scatter; do
    local algos=low_latency,push,pull; [ $op = reduce_scatter ] && algos=low_latency,two_shot_push,two_shot
    for g in "" --graph; do
      local name=${op}${g:+_graph}_2
      run_logged "small $name" 90 "$FINAL/small/$name.txt" "$B/symmem-bench" $op --gpus 2 -b 1K -e 256K -f 2 \
        -n 50 -w 10 --reps $reps $g --algos $algos --csv "$FINAL/small/$name.csv" --json /dev/null "$@"
    done
  done
}

# Issue 13: the copy-engine and hierarchical all-gather on 1 node x 2 and 2 simulated nodes x 1,
# every NCCL row interleaved: hier_sweeps FROM DIR -> DIR/all_gather_<layout>.{csv,txt}.
hier_sweeps() {
  mkdir -p "$2"
  for layout in 1x2 2x1; do
    local sim=""; [ $layout = 2x1 ] && sim="--simulate-nodes 2"
    run_logged "bench hierarchical $layout" 100 "$2/all_gather_$layout.txt" "$B/symmem-bench" all_gather --gpus 2 \
      $sim -b $1 -e 256M -f 2 -n 10 -w 3 --reps 5 --algos copy_engine,hierarchical \
      --csv "$2/all_gather_$layout.csv" --json /dev/null
  done
}

# The copy-engine all-gather of this tree and of earlier binaries ($B/<which>-symmem-bench, their
# commits in $B/<WHICH>_COMMIT), interleaved, 2 rounds: ce_ab DIR LARGEST which...
ce_ab() {
  local dir=$1 largest=$2; shift 2
  mkdir -p "$dir"
  for rep in 1 2; do
    for which in "$@"; do
      local bench="$B/symmem-bench" commit=$SYMMEM_COMMIT
      [ $which != new ] && bench="$B/$which-symmem-bench" && commit=$(cat "$B/${which^^}_COMMIT" 2>/dev/null || echo $which)
      SYMMEM_COMMIT=$commit run_logged "ce ab $which $rep" 45 "$dir/${which}_$rep.txt" "$bench" all_gather --gpus 2 \
        -b 1M -e $largest -f 4 -n 10 -w 3 --reps 5 --algos copy_engine,hierarchical --csv "$dir/${which}_$rep.csv" \
        --json /dev/null
    done
  done
}

# The hierarchical GPU tests in both layouts.
hier_tests() {
  run_logged "hierarchical tests 1x2" 120 "$FINAL/hier_tests_1x2.log" \
    "$B/symmem-run" -n 2 --timeout 110 "$B/symmem_gpu_tests" hierarchical
  run_logged "hierarchical tests 2x1" 120 "$FINAL/hier_tests_2x1.log" \
    "$B/symmem-run" -n 2 --simulate-nodes 2 --timeout 110 "$B/symmem_gpu_tests" hierarchical
}

# The failure paths of the copy engine (also with one hardware queue) and across nodes, and
# symmem.torch across simulated nodes.
copy_engine_and_node_checks() {
  run_logged "kill copy_engine" 40 "$FINAL/kill_copy_engine.log" \
    "$B/symmem-run" -n 2 --timeout 35 --expect-killed 1 "$B/symmem_kill_tests" copy_engine
  CUDA_DEVICE_MAX_CONNECTIONS=1 run_logged "kill copy_engine max_connections_1" 40 \
    "$FINAL/kill_copy_engine_max_connections_1.log" \
    "$B/symmem-run" -n 2 --timeout 35 --expect-killed 1 "$B/symmem_kill_tests" copy_engine
  run_logged "kill hierarchical" 50 "$FINAL/kill_hierarchical.log" \
    "$B/symmem-run" -n 2 --simulate-nodes 2 --timeout 45 --expect-killed 1 "$B/symmem_kill_tests" hierarchical
  SYMMEM_NODE_SIZE=1 run_logged "torch across nodes" 90 "$FINAL/torch_nodes.log" tests/python/gpu/run.sh 2 -k simulated_nodes
}

# Every C++ GPU test, both fused ops' tests and their benches (REPS samples each) on 2 ranks.
gpu_and_fused() {
  run_logged "gpu tests" 120 "$FINAL/gpu_tests_2_ranks.log" "$B/symmem-run" -n 2 --timeout 110 "$B/symmem_gpu_tests"
  run_logged "fused tests" 120 "$FINAL/fused_tests_2_ranks.log" tests/python/gpu/run.sh 2 -k "fused or matmul"
  for op in all_gather_matmul matmul_reduce_scatter; do
    run_logged "$op bench" 120 "$FINAL/${op}_bench_2.log" python3 -m torch.distributed.run --nproc-per-node 2 \
      -m symmem.bench.all_gather_matmul --op $op --reps $1 --out "$FINAL/fused"
  done
}

case "$1" in
survey)
  # First 2-GPU call of a session (tree 2768618 in session 14): the copy probe, issue 14's sweeps
  # over every block count with the tuning table they pick, every GPU test, both fused ops,
  # issue 13's tests and sweeps.
  start_deadline 570
  run_logged "copy probe (2 GPUs)" 30 "$FINAL/copy_probe_2.txt" "$B/symmem-copy-probe"
  small_sweeps 5 --blocks 4,8,16,32,64,128 --tune "$FINAL/small/tune.json"
  gpu_and_fused 9
  hier_tests
  hier_sweeps 1M "$FINAL/hierarchical"
  ;;
shared_gpu)
  # One GPU: the multi-rank protocols with 2-8 ranks as threads (tests/gpu/shared_gpu_tests.cpp),
  # then the mutants (carry build-mutants/ from tests/gpu/shared_gpu_mutants.sh build).
  timeout 300 "$B/symmem_shared_gpu_tests" > "$FINAL/shared_gpu_tests.log" 2>&1
  echo "shared-GPU tests rc=$?" >> "$FINAL/summary.txt"
  [ -d build-mutants ] && bash tests/gpu/shared_gpu_mutants.sh run > "$FINAL/shared_gpu_mutants.log" 2>&1
  echo "shared-GPU mutants rc=$?" >> "$FINAL/summary.txt"
  ;;
final_two_gpu)
  # The committed small-message figures with the tuned table (auto), the copy engine against the
  # binary before (ABAB), issue 13's sweeps, every test the tree touched, the overlap phases, FSDP2.
  start_deadline 575
  small_sweeps 7
  ce_ab "$FINAL/hier_ab" 64M new old
  hier_sweeps 16M "$FINAL/hierarchical"
  gpu_and_fused 9
  copy_engine_and_node_checks
  run_logged overlap 60 "$FINAL/overlap_2.txt" "$B/symmem-bench" overlap --gpus 2 -n 10 --reps 5 \
    --csv "$FINAL/overlap_2.csv" --json /dev/null
  run_logged "fsdp tests" 80 "$FINAL/fsdp_tests_2_ranks.log" tests/python/gpu/run.sh 2 -k fsdp
  run_logged "fsdp bench" 300 "$FINAL/fsdp_bench_2.log" python3 -m torch.distributed.run --nproc-per-node 2 \
    -m symmem.bench.fsdp --out "$FINAL/fsdp" --steps 24
  ;;
copy_engine_ab)
  # The copy engine's fixed cost against two earlier binaries (ABC x 2), issue 13's sweeps, the
  # tests the watchdog change touches, both fused ops (15 samples), the shared-GPU tests.
  start_deadline 575
  ce_ab "$FINAL/ce_ab" 16M new mid old
  hier_sweeps 16M "$FINAL/hierarchical"
  copy_engine_and_node_checks
  gpu_and_fused 15
  SYMMEM_SHARED_GPU_WORLDS="${SHARED_WORLDS:-2 4}" run_logged "shared-GPU tests" 200 "$FINAL/shared_gpu_tests.log" \
    "$B/symmem_shared_gpu_tests"
  ;;
across_nodes_checks)
  # After the fixes of the failure path across nodes: those checks, the hierarchical tests, every
  # symmem.torch GPU test (2 ranks).
  start_deadline 575
  copy_engine_and_node_checks
  hier_tests
  run_logged "torch tests" 200 "$FINAL/torch_tests_2_ranks.log" tests/python/gpu/run.sh 2
  ;;
final_checks)
  # After the review fixes (batch on a side stream for default streams, the own copy on a stream
  # of default priority, the network stream joined after a failure): every GPU test, the failure
  # paths, the copy engine against 2768618 and issue 13's sweeps again, the fused and torch tests,
  # the shared-GPU tests.
  start_deadline 540
  run_logged "gpu tests" 120 "$FINAL/gpu_tests_2_ranks.log" "$B/symmem-run" -n 2 --timeout 110 "$B/symmem_gpu_tests"
  copy_engine_and_node_checks
  hier_tests
  ce_ab "$FINAL/ce_ab" 16M new old
  hier_sweeps 16M "$FINAL/hierarchical"
  run_logged "fused tests" 120 "$FINAL/fused_tests_2_ranks.log" tests/python/gpu/run.sh 2 -k "fused or matmul"
  run_logged "torch tests" 150 "$FINAL/torch_tests_2_ranks.log" tests/python/gpu/run.sh 2
  SYMMEM_SHARED_GPU_WORLDS="${SHARED_WORLDS:-2 3 4}" run_logged "shared-GPU tests" 200 "$FINAL/shared_gpu_tests.log" \
    "$B/symmem_shared_gpu_tests"
  ;;
hierarchical)
  # Tests: one node (the hierarchical cases of the suite), two simulated nodes (each rank its own
  # NCCL_HOSTID), a dead rank behind NCCL, symmem.torch unchanged across nodes.
  timeout 300 "$B/symmem-run" -n 2 --timeout 290 "$B/symmem_gpu_tests" hierarchical > "$OUT/hier_tests_1x2.log" 2>&1
  echo "hierarchical tests 1x2 rc=$?" >> "$OUT/summary.txt"
  timeout 300 "$B/symmem-run" -n 2 --simulate-nodes 2 --timeout 290 "$B/symmem_gpu_tests" hierarchical \
    > "$OUT/hier_tests_2x1.log" 2>&1
  echo "hierarchical tests 2x1 rc=$?" >> "$OUT/summary.txt"
  timeout 60 "$B/symmem-run" -n 2 --simulate-nodes 2 --timeout 50 --expect-killed 1 "$B/symmem_kill_tests" hierarchical \
    > "$OUT/kill_hierarchical.log" 2>&1
  echo "kill hierarchical rc=$?" >> "$OUT/summary.txt"
  SYMMEM_LIBRARY=$B/libsymmem_capi.so SYMMEM_NODE_SIZE=1 timeout 300 tests/python/gpu/run.sh 2 -k simulated_nodes \
    > "$OUT/torch_nodes.log" 2>&1
  echo "torch across nodes rc=$?" >> "$OUT/summary.txt"
  # The bar's sweeps (16 MiB per rank up), every NCCL row interleaved with symmem's.
  for layout in 1x2 2x1; do
    sim=""; [ $layout = 2x1 ] && sim="--simulate-nodes 2"
    timeout ${HIER_BENCH_S:-150} "$B/symmem-bench" all_gather --gpus 2 $sim -b 1M -e 256M -f 2 -n 10 -w 3 --reps 5 \
      --algos copy_engine,hierarchical --csv "$OUT/hierarchical_$layout.csv" --json /dev/null \
      > "$OUT/hierarchical_$layout.txt" 2>&1
    echo "bench hierarchical $layout rc=$?" >> "$OUT/summary.txt"
  done
  ;;
torch)
  torch_stage
  ;;
torch_tuned)
  # The 3 MiB all-reduce (T=192, between the table's 2 and 4 MiB entries): sweep, take the fastest
  # as the table's 3 MiB entry, then the torch tests and benches with that table.
  timeout 60 "$B/symmem-bench" all_reduce --gpus 2 -d bf16 -b 3M -e 3M -n 20 -w 5 --reps 5 --graph --nccl 0 \
    --algos one_shot_push,two_shot_push,two_shot,one_shot --blocks 32,64,128 \
    --csv "$FINAL/tune_ar_3m_2.csv" --json /dev/null > "$FINAL/tune_ar_3m_2.txt" 2>&1
  python3 scripts/tune_entry.py "$FINAL/tune_ar_3m_2.csv" tuning/NVIDIA_H200.json all_reduce 2 3145728 \
    "$FINAL/NVIDIA_H200.json" >> "$FINAL/summary.txt" 2>&1
  export SYMMEM_TUNING_FILE="$FINAL/NVIDIA_H200.json"
  torch_stage
  ;;
fused)
  # Issue 12: the fused op's GPU tests first (a wrong or hung GEMM shows there, bounded), then the
  # issue's shapes (K = 16384, N = 6656, M = 4096 / 8192 / 16384), fp16 and bf16, interleaved.
  export SYMMEM_LIBRARY="$PWD/$B/libsymmem_capi.so" PYTHONPATH="$PWD/python"
  # First: do copies between GPUs progress while a kernel holds every SM (the pulls rest on it)?
  timeout 60 "$B/symmem-copy-probe" > "$FINAL/copy_probe_2.txt" 2>&1
  echo "copy probe (2 GPUs) rc=$?" >> "$FINAL/summary.txt"
  timeout ${FUSED_TESTS_S:-420} tests/python/gpu/run.sh 2 -k "fused or matmul" -x > "$FINAL/fused_tests_2_ranks.log" 2>&1
  echo "fused tests rc=$?" >> "$FINAL/summary.txt"
  timeout ${FUSED_BENCH_S:-300} python3 -m torch.distributed.run --nproc-per-node 2 -m symmem.bench.all_gather_matmul \
    --out "$FINAL/fused" ${FUSED_BENCH_ARGS:-} > "$FINAL/fused_bench_2.log" 2>&1
  echo "fused bench rc=$?" >> "$FINAL/summary.txt"
  timeout ${FUSED_BENCH_S:-300} python3 -m torch.distributed.run --nproc-per-node 2 -m symmem.bench.all_gather_matmul \
    --op matmul_reduce_scatter --out "$FINAL/fused" ${FUSED_BENCH_ARGS:-} > "$FINAL/reduce_bench_2.log" 2>&1
  echo "matmul_reduce_scatter bench rc=$?" >> "$FINAL/summary.txt"
  ;;
reduce_single)
  # matmul_reduce_scatter on one GPU (world 1: the GEMM with float32 output and its tile counters,
  # then the sums; no copies): its tests, the bench against torch.mm, memcheck of a few calls.
  export SYMMEM_LIBRARY="$PWD/$B/libsymmem_capi.so" PYTHONPATH="$PWD/python"
  timeout ${FUSED_TESTS_S:-200} tests/python/gpu/run.sh 1 -k "matmul_reduce_scatter and not killed" \
    > "$FINAL/reduce_tests_1_rank.log" 2>&1
  echo "matmul_reduce_scatter tests (1 rank) rc=$?" >> "$FINAL/summary.txt"
  fused_bench_1 reduce --op matmul_reduce_scatter
  fused_memcheck_1 reduce "matmul_reduce_scatter and test_matches_nccl_and_matmul"
  ;;
fused_single)
  # Issue 12 on one GPU (world 1): which copies progress while a kernel holds every SM; the test
  # that fills every SM with the binary before the fix (negative control: must fail, by deadline);
  # the fused op's tests (every copy and flag is local); the bench at world 1 (symmem_fused against
  # torch.mm of the same A: the GEMM's own cost plus the own shard's copy); memcheck of a few calls.
  export SYMMEM_LIBRARY="$PWD/$B/libsymmem_capi.so" PYTHONPATH="$PWD/python"
  timeout 60 "$B/symmem-copy-probe" > "$FINAL/copy_probe_1.txt" 2>&1
  echo "copy probe rc=$?" >> "$FINAL/summary.txt"
  if [ -f "$B/old_libsymmem_capi.so" ]; then
    SYMMEM_LIBRARY="$PWD/$B/old_libsymmem_capi.so" SYMMEM_TIMEOUT_MS=5000 timeout 120 tests/python/gpu/run.sh 1 \
      -k fill_every_sm > "$FINAL/fused_negative_control_1.log" 2>&1
    echo "fused negative control (old library, expect failure) rc=$?" >> "$FINAL/summary.txt"
  fi
  timeout ${FUSED_TESTS_S:-200} tests/python/gpu/run.sh 1 -k "fused and not killed" > "$FINAL/fused_tests_1_rank.log" 2>&1
  echo "fused tests (1 rank) rc=$?" >> "$FINAL/summary.txt"
  fused_bench_1 fused
  fused_memcheck_1 fused "test_matches_nccl_and_matmul"
  ;;
fused_gemm_tiles)
  # The fused op's GEMM without communication (every flag set) in each tile configuration and tile
  # order, against cuBLASLt, interleaved: needs a build with -DSYMMEM_BUILD_GEMM_VARIANTS=ON.
  mkdir -p "$FINAL/fused_gemm_tiles"
  for d in fp16 bf16; do
    for m in 4096 8192 16384; do
      timeout 120 "$B/symmem-bench" chunked_gemm --gpus 1 -d $d --gemm ${m}x6656x16384 --chunks 2 -n 10 --reps 7 \
        --csv "$FINAL/fused_gemm_tiles/${d}_$m.csv" --json /dev/null > "$FINAL/fused_gemm_tiles/${d}_$m.txt" 2>&1
      echo "fused_gemm_tiles $d $m rc=$?" >> "$FINAL/summary.txt"
    done
  done
  ;;
fsdp_probe)
  # Issue 11, where the FSDP2 step's time goes: the reduce-scatter alone by SM budget at layer
  # sizes, then the step with SM budgets for symmem's collectives, each row traced once.
  start_deadline 560
  [ -n "${PROBE_BLOCKS:-}" ] && run_logged "reduce-scatter by blocks" 90 "$FINAL/reduce_scatter_blocks_2.txt" "$B/symmem-bench" reduce_scatter \
    --gpus 2 -b 32M -e 256M -f 2 -n 10 -w 3 --reps 3 --blocks $PROBE_BLOCKS --algos two_shot \
    --csv "$FINAL/reduce_scatter_blocks_2.csv" --json /dev/null
  if [ -n "${FSDP_TESTS:-}" ]; then
    run_logged "fsdp tests" 120 "$FINAL/fsdp_tests_2_ranks.log" tests/python/gpu/run.sh 2 -k fsdp
    SYMMEM_TEST_SHARED_FSDP_COMMUNICATOR=1 run_logged "fsdp skewed streams, shared communicator (must fail)" 90 \
      "$FINAL/fsdp_tests_shared_communicator.log" tests/python/gpu/run.sh 2 -k skewed_streams
  fi
  run_logged "fsdp probe" 420 "$FINAL/fsdp_probe_2.log" python3 -m torch.distributed.run --nproc-per-node 2 \
    -m symmem.bench.fsdp --out "$FINAL/fsdp" ${FSDP_BENCH_ARGS:-}
  [ -n "${FSDP_BENCH_ARGS2:-}" ] && run_logged "fsdp probe 2" 420 "$FINAL/fsdp_probe_2b.log" python3 -m \
    torch.distributed.run --nproc-per-node 2 -m symmem.bench.fsdp --out "$FINAL/fsdp2" $FSDP_BENCH_ARGS2
  ;;
fsdp_final)
  # Issue 11's committed figures: every FSDP GPU test, the skewed-streams test with the all-gathers
  # put back on the group's communicator (must fail), then the step benchmark, implicit and
  # explicit prefetch (each run interleaved).
  start_deadline 560
  run_logged "fsdp tests" 150 "$FINAL/fsdp_tests_2_ranks.log" tests/python/gpu/run.sh 2 -k fsdp
  SYMMEM_TEST_SHARED_FSDP_COMMUNICATOR=1 run_logged "fsdp skewed streams, shared communicator (must fail)" 90 \
    "$FINAL/fsdp_tests_shared_communicator.log" tests/python/gpu/run.sh 2 -k skewed_streams
  for p in implicit explicit; do
    run_logged "fsdp bench $p" 200 "$FINAL/fsdp_bench_$p.log" python3 -m torch.distributed.run --nproc-per-node 2 \
      -m symmem.bench.fsdp --out "$FINAL/fsdp_$p" --prefetch $p --steps ${FSDP_STEPS:-30} ${FSDP_BENCH_ARGS:-}
  done
  ;;
torch_checks)
  # Every symmem.torch GPU test (2 ranks), then the ones across 2 simulated nodes (FSDP included).
  start_deadline 400
  run_logged "torch tests" 240 "$FINAL/torch_tests_2_ranks.log" tests/python/gpu/run.sh 2
  SYMMEM_NODE_SIZE=1 run_logged "torch tests, 2 simulated nodes" 120 "$FINAL/torch_nodes.log" \
    tests/python/gpu/run.sh 2 -k simulated_nodes
  ;;
fsdp)
  # FSDP2 on symmem: its GPU tests (torchrun, 2 ranks) and the training-step benchmark.
  export SYMMEM_LIBRARY="$PWD/$B/libsymmem_capi.so" PYTHONPATH="$PWD/python"
  timeout ${FSDP_TESTS_S:-200} tests/python/gpu/run.sh 2 -k "fsdp" > "$FINAL/fsdp_tests_2_ranks.log" 2>&1
  echo "fsdp tests rc=$?" >> "$FINAL/summary.txt"
  timeout ${FSDP_BENCH_S:-300} python3 -m torch.distributed.run --nproc-per-node 2 -m symmem.bench.fsdp \
    --out "$FINAL/fsdp" ${FSDP_BENCH_ARGS:-} > "$FINAL/fsdp_bench_2.log" 2>&1
  echo "fsdp bench rc=$?" >> "$FINAL/summary.txt"
  ;;
final_torch)
  # The committed figures of issue 10: PDL on/off A/B (vLLM table, graph replays, ABAB), every
  # C++ GPU test and four kill tests, then the torch stage (tests, bench, overhead).
  pdl_ab
  gpu_tests_into_final
  kill_tests_into_final sm low_latency copy_engine graph
  torch_stage
  # Where the small-message issue starts: all-gather and reduce-scatter from 1 KiB to 256 KiB per
  # rank against NCCL (plain and symmetric), eager and graph.
  mkdir -p "$FINAL/small"
  for op in all_gather reduce_scatter; do
    for g in "" --graph; do
      timeout ${SMALL_S:-90} "$B/symmem-bench" $op --gpus 2 -b 1K -e 256K -f 2 -n 50 -w 10 --reps 5 $g \
        --csv "$FINAL/small/${op}${g:+_graph}_2.csv" --json /dev/null > "$FINAL/small/${op}${g:+_graph}_2.txt" 2>&1
      echo "small $op $g rc=$?" >> "$FINAL/summary.txt"
    done
  done
  ;;
scatter_ab)
  # The unrolled scatter (this tree) against the binary before it ($B/old-symmem-bench), ABAB, on
  # the push all-reduces from 1.5 to 8 MiB; then tune_medium with this tree.
  mkdir -p "$FINAL/scatter_ab"
  for rep in 1 2; do
    for which in new old; do
      bench="$B/symmem-bench"; [ $which = old ] && bench="$B/old-symmem-bench"
      for size in 1536K 3M 4M 8M; do
        timeout 40 "$bench" all_reduce --gpus 2 -d bfloat16 -b $size -e $size -n 20 -w 5 --reps 3 --graph --nccl 0 \
          --algos one_shot_push,two_shot_push --blocks 64,96,128,132 \
          --csv "$FINAL/scatter_ab/${which}_${size}_${rep}.csv" --json /dev/null \
          > "$FINAL/scatter_ab/${which}_${size}_${rep}.txt" 2>&1
        echo "scatter_ab $which $size $rep rc=$?" >> "$FINAL/summary.txt"
      done
    done
  done
  ;&
tune_medium)
  # The all-reduce between 1.5 and 4 MiB (vLLM's T = 96..256), where the shipped table's block
  # counts leave a partial last iteration: every in-place-capable algorithm x block count, graph
  # replays; the fastest per size becomes the table's entry (scripts/tune_entry.py), then the GPU
  # tests and the torch stage run with that table.
  mkdir -p "$FINAL/tune"
  table=tuning/NVIDIA_H200.json
  for size in 1536K 2M 3M 4M; do
    timeout 60 "$B/symmem-bench" all_reduce --gpus 2 -d bfloat16 -b $size -e $size -n 20 -w 5 --reps 3 --graph --nccl 0 \
      --algos one_shot_push,two_shot,two_shot_push --blocks ${TUNE_BLOCKS:-48,64,96,112,128,132} \
      --csv "$FINAL/tune/ar_${size}_2.csv" --json /dev/null > "$FINAL/tune/ar_${size}_2.txt" 2>&1
    rc=$?
    echo "tune $size rc=$rc" >> "$FINAL/summary.txt"
    bytes=$(python3 -c "import sys; s=sys.argv[1]; print(int(float(s[:-1]) * (1 << (10 if s[-1] == 'K' else 20))))" $size)
    # Only a complete sweep sets an entry.
    [ $rc = 0 ] && python3 scripts/tune_entry.py "$FINAL/tune/ar_${size}_2.csv" $table all_reduce 2 $bytes "$FINAL/tune/NVIDIA_H200.json" \
      >> "$FINAL/summary.txt" 2>&1 && table="$FINAL/tune/NVIDIA_H200.json"
  done
  export SYMMEM_TUNING_FILE="$FINAL/tune/NVIDIA_H200.json"
  gpu_tests_into_final
  kill_tests_into_final sm graph
  torch_stage
  ;;
torch_pdl)
  # Programmatic dependent launch on and off (SYMMEM_PDL), alternating, on the vLLM all-reduce
  # table replayed from graphs; then the torch stage (PDL on, the default).
  pdl_ab
  torch_stage
  ;;
tests)
  gpu_tests
  for path in sm low_latency copy_engine graph; do
    for conn in "" 1; do
      name="kill_${path}${conn:+_max_connections_1}"
      env ${conn:+CUDA_DEVICE_MAX_CONNECTIONS=$conn} timeout 100 "$B/symmem-run" -n 2 --timeout 90 --expect-killed 1 \
        "$B/symmem_kill_tests" "$path" > "$OUT/$name.log" 2>&1
      echo "$name rc=$?" >> "$OUT/summary.txt"
    done
  done
  # Negative control: the same scenario tests built against 6cf5c42 (tests/gpu/negative_control.sh).
  old_tests ${NEGATIVE_TESTS:-scratch_is_not_shared_between_collectives graph_replay_after_larger_eager_calls \
           rank_dependent_placement rank_dependent_symmetric_offsets_are_a_mismatch \
           mismatched_calls_fail_on_every_rank interleaved_collectives_under_load}
  [ -n "${NEGATIVE_TESTS:-}" ] || env CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 100 "$B/symmem-run" -n 2 --timeout 90 --expect-killed 1 \
    "$B/old_api_kill_tests" copy_engine > "$OUT/old_kill_copy_engine_max_connections_1.log" 2>&1
  echo "old kill_copy_engine_max_connections_1 rc=$?" >> "$OUT/summary.txt"
  ;;
bench)
  all_gather_sweep
  vllm_tables
  # Cost of the trustworthy core (signed flags, cleared low-latency lines) against 6cf5c42:
  # the same two cases, old and new binaries alternating (ABAB), 0.5 MiB all-reduce and 64 KiB
  # all-gather, eager and graph.
  for rep in 1 2 3 4; do
    for which in new old; do
      bench="$B/symmem-bench"; [ $which = old ] && bench="$B/old-symmem-bench"
      for g in "" --graph; do
        timeout 60 "$bench" all_reduce --gpus 2 -d bf16 -b 512K -e 512K -n 50 -w 10 --nccl 0 --algos auto $g \
          --csv "$OUT/ab_ar_${which}_${rep}${g:+_graph}.csv" > "$OUT/ab_ar_${which}_${rep}${g:+_graph}.txt" 2>&1
        timeout 60 "$bench" all_gather --gpus 2 -b 64K -e 64K -n 50 -w 10 --nccl 0 --algos auto $g \
          --csv "$OUT/ab_ag_${which}_${rep}${g:+_graph}.csv" > "$OUT/ab_ag_${which}_${rep}${g:+_graph}.txt" 2>&1
      done
    done
  done
  echo "ab done" >> "$OUT/summary.txt"
  ;;
final)
  # The committed figures of the final tree: every GPU test, the all-gather sweep, the vLLM tables.
  gpu_tests
  all_gather_sweep
  vllm_tables
  ;;
sanitize)
  # racecheck over the graph-replay tests (barriers, low-latency lines, parity areas).
  for t in all_reduce_graph_replays_follow_inputs_changed_in_place all_gather_graph_replays_follow_inputs_changed_in_place; do
    SYMMEM_TIMEOUT_MS=600000 timeout 240 "$B/symmem-run" -n 2 --timeout 230 \
      compute-sanitizer --report-api-errors no --error-exitcode 3 --tool racecheck \
      "$B/symmem_gpu_tests" "$t" > "$OUT/racecheck_$t.log" 2>&1
    echo "racecheck $t rc=$?" >> "$OUT/summary.txt"
  done
  ;;
chunked_gemm)
  chunked_gemms
  ;;
single_gpu)
  # What one GPU can check (world 1): every GPU test, memcheck over the low-latency tests, and
  # the host cost per call (symmem-bench host_cost) at 1 KiB and 64 KiB per rank.
  timeout ${GPU_TESTS_S:-240} "$B/symmem-run" -n 1 --timeout 230 "$B/symmem_gpu_tests" > "$OUT/gpu_tests_1_rank.log" 2>&1
  echo "gpu tests (1 rank) rc=$?" >> "$OUT/summary.txt"
  for t in low_latency_payloads all_gather_is_bit_exact reduce_scatter_matches; do
    timeout 180 "$B/symmem-run" -n 1 --timeout 170 compute-sanitizer --report-api-errors no --error-exitcode 3 --tool memcheck \
      "$B/symmem_gpu_tests" "$t" > "$OUT/memcheck_$t.log" 2>&1
    echo "memcheck $t rc=$?" >> "$OUT/summary.txt"
  done
  chunked_gemms
  # Overlap bench smoke test (world 1).
  timeout 120 "$B/symmem-bench" overlap --gpus 1 -n 5 --reps 3 --csv "$OUT/overlap_1.csv" --json /dev/null \
    > "$OUT/overlap_1.txt" 2>&1
  echo "overlap (1 rank) rc=$?" >> "$OUT/summary.txt"
  [ -n "${SKIP_HOST_COST:-}" ] || for b in 1K 64K; do
    timeout 120 "$B/symmem-bench" host_cost --gpus 1 -b $b -n 200 --reps 15 \
      --csv "$OUT/host_cost_1_$b.csv" --json /dev/null > "$OUT/host_cost_1_$b.txt" 2>&1
    echo "host_cost $b rc=$?" >> "$OUT/summary.txt"
  done
  ;;
vllm)
  vllm_tables
  ;;
only)
  # A few GPU tests by name (new tree), then the named negative-control tests (old tree).
  for t in ${TESTS:-}; do
    timeout 200 "$B/symmem-run" -n 2 --timeout 190 "$B/symmem_gpu_tests" "$t" > "$OUT/$t.log" 2>&1
    echo "$t rc=$?" >> "$OUT/summary.txt"
  done
  old_tests ${NEGATIVE_TESTS:-}
  ;;
esac
# Stages write their summary into $OUT (archived) or straight into $FINAL (the torch stages).
cat "$OUT/summary.txt" "$FINAL/summary.txt" 2>/dev/null > "$FINAL/summary_$1.txt"
cat "$FINAL/summary_$1.txt"
tar czf "$FINAL/session_$1.tgz" -C "$OUT" .
