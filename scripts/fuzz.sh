#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan; build-fuzz/) and runs each for SECONDS (default
# 20, as in CI) over a copy of its seed corpus (tests/fuzz/corpus/<target>). A crash, sanitizer
# report, leak or timeout stops that target and fails the script; the reproducer is left in
# build-fuzz/run/<target>/artifacts/ -- add it to tests/fuzz/regressions/<target>/ with the fix
# (the unit suite replays every file there).
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (targets: config cache_entry shape cache_archive;
# CI runs the first three, for its time budget: cache_archive is run by hand and replayed by the unit suite)
#   JOBS=N parallel compile jobs (default nproc); FUZZ_OPT="-O0" optimization (see below)
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config cache_entry shape)
command -v clang++ >/dev/null || { echo "fuzz.sh needs clang++ (apt-get install clang)" >&2; exit 2; }
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# FUZZ_OPT overrides the optimization flags (default -O2 -g, as RelWithDebInfo): "-O0" compiles in a
# third of the time or less (clang -O1: 28 s, -O0: 10 s of CPU for src/jit/disk_cache.cpp), for
# local runs of I/O-bound targets such as cache_entry on a small machine.
# Measured (2026-11-23, shared 2 cores): FUZZ_OPT=-O0 JOBS=2 fuzz.sh 600 cache_entry: build 9.5 min,
# 166,863 executions in 600 s (277/s), no finding.
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DMLAJIT_FUZZ=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="${FUZZ_OPT:--O2 -g} -DNDEBUG" -DMLAJIT_BUILD_TESTS=OFF "${launcher[@]}" \
  >/dev/null || exit 1
cmake --build build-fuzz -j"${JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}" || exit 1
status=0
for t in "${targets[@]}"; do
  run=build-fuzz/run/$t
  mkdir -p "$run/corpus" "$run/artifacts"
  # The JSON readers get the dictionary of nesting, edge numbers and escapes (tests/fuzz/json.dict);
  # fuzz_config also mutates structurally (duplicate members, values nested around the limit).
  dict=()
  [ "$t" != shape ] && dict=(-dict=tests/fuzz/json.dict)
  ./build-fuzz/fuzz_"$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="$run/artifacts/" "$run/corpus" "tests/fuzz/corpus/$t" > "$run/log.txt" 2>&1
  rc=$?
  runs=$(grep -E "^stat::number_of_executed_units" "$run/log.txt" | awk '{print $2}')
  echo "fuzz_$t: exit $rc, ${runs:-?} executions in ${secs} s"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E "ERROR|FUZZ BUG|runtime error|SUMMARY" "$run/log.txt" | head -5
    ls "$run/artifacts"
  fi
done
exit $status
