#!/usr/bin/env bash
# compute-sanitizer over every op's GPU tests: memcheck (out-of-bounds / misaligned accesses),
# racecheck (shared-memory hazards) and synccheck (illegal barrier use), one process per
# (tool, op group), all at once on the one GPU (the tools are CPU-bound), each under a time limit.
# The timing-only cases (disk hit, cold compile, launch overhead, tuning sweeps) are left out.
# Usage: scripts/gpu_sanitize.sh BIN_DIR [SECONDS_PER_RUN]   (BIN_DIR holds mlajit_gpu_tests)
# Logs: $LOGS (default gpu-out/sanitize), one per run, and summary.txt. Exit 1 if any tool reported
# an error or hazard, a run failed its tests or ran out of time.
set -uo pipefail
B=${1:?usage: scripts/gpu_sanitize.sh BIN_DIR [SECONDS_PER_RUN]}
LIMIT=${2:-170}
LOGS=${LOGS:-gpu-out/sanitize}
mkdir -p "$LOGS"
export MLAJIT_CACHE_DIR=${MLAJIT_CACHE_DIR:-/tmp/mlajit-sanitize-cache}

# op group -> doctest filters
declare -A GROUPS_=(
  [kv_cache]='-ts=kv_cache gpu'
  [mla_indexer]='-ts=gpu mla_indexer'
  [sparse_prefill]='-ts=sparse_prefill_small,sparse_prefill'
  [runtime]='-tc=runtime launches*,8 threads asking*,an entry needing*,a candidate with a wrong output*,gather and remap workloads*'
)
declare -A TOOL_FLAGS=(
  [memcheck]='--tool memcheck --leak-check no'
  [racecheck]='--tool racecheck --racecheck-report hazard'
  [synccheck]='--tool synccheck'
)

pids=()
for tool in memcheck racecheck synccheck; do
  for g in "${!GROUPS_[@]}"; do
    # shellcheck disable=SC2086
    ( timeout "$LIMIT" compute-sanitizer ${TOOL_FLAGS[$tool]} --error-exitcode 9 "$B/mlajit_gpu_tests" "${GROUPS_[$g]}" \
        > "$LOGS/$tool-$g.log" 2>&1
      echo "exit $?" >> "$LOGS/$tool-$g.log" ) &
    pids+=($!)
  done
done
wait "${pids[@]}"

status=0
{
  printf '%-10s %-15s %-6s %-45s %s\n' tool group exit "sanitizer summary" "doctest"
  for tool in memcheck racecheck synccheck; do
    for g in kv_cache mla_indexer sparse_prefill runtime; do
      f="$LOGS/$tool-$g.log"
      code=$(tail -n 1 "$f" | sed 's/exit //')
      summ=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$f" | tail -n 1 | sed 's/========= //')
      cases=$(grep -E "test cases:" "$f" | tail -n 1 | sed 's/\[doctest\] //')
      printf '%-10s %-15s %-6s %-45s %s\n' "$tool" "$g" "$code" "${summ:-none}" "${cases:-none}"
      [ "$code" = 0 ] || status=1
    done
  done
} | tee "$LOGS/summary.txt"
exit $status
