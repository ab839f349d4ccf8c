#!/usr/bin/env bash
# One device call: issue 28's checks (scripts/gpu_issue28.sh) and the NaN mutant of the shared-GPU
# suite, from .device/bundle28.tar.xz (build-bundle/ plus build-mutants/nan_by_rank), with every log
# packed so that at most 8 files come back under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
work=$(mktemp -d)
tar xJf .device/bundle28.tar.xz -C "$work"
B=$work/build-bundle
OUT=$work/o28 timeout ${ISSUE28_S:-480} scripts/gpu_issue28.sh "$B" > "$work/o28.stdout" 2>&1
cp "$work/o28/summary.txt" "$OUT/issue28_summary.txt" 2>/dev/null
cp "$work/o28/host_cost_ab_summary.txt" "$OUT/host_cost_ab_summary.txt" 2>/dev/null
cp "$work/o28/host_cost_ab.csv" "$OUT/host_cost_ab.csv" 2>/dev/null
if [ -x "$B/nan_by_rank" ]; then
  SYMMEM_SHARED_GPU_WORLDS="2 4" timeout 120 "$B/nan_by_rank" max_min_ignore_nan > "$work/o28/mutant_nan_by_rank.log" 2>&1
  echo "mutant nan_by_rank rc=$? (1 with a FAIL line: caught): $(grep -m1 -o 'FAIL.*' "$work/o28/mutant_nan_by_rank.log" | cut -c1-200)" \
    | tee -a "$OUT/issue28_summary.txt"
fi
tar czf "$OUT/issue28_logs.tar.gz" -C "$work" o28 o28.stdout
cat "$OUT/issue28_summary.txt"
