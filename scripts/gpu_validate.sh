#!/usr/bin/env bash
# Everything the GPU machine checks in one call (device time is scarce): the main job on the
# default config, the GPU test suite, compute-sanitizer memcheck on the functional GPU cases, the
# benchmarks of every op at the issues' shapes, and a tune run. Logs go to $OUT (or ./gpu-out).
# Usage: scripts/gpu_validate.sh BIN_DIR   (a folder holding the mlajit and mlajit_gpu_tests binaries)
set -uo pipefail
B=${1:?usage: scripts/gpu_validate.sh BIN_DIR}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export MLAJIT_CACHE_DIR=/tmp/mlajit-gpu-cache
step() { echo "=== $1 ($(date +%T))"; }

step info
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
"$B/mlajit" info --json > "$OUT/info.json"; "$B/mlajit" info

step "main job: build + check of examples/deepseek_v32.json"
mkdir -p cache && chmod 700 cache
timeout 120 "$B/mlajit" build examples/deepseek_v32.json --cache-dir cache
timeout 120 "$B/mlajit" check examples/deepseek_v32.json --cache-dir cache 2>&1 | tee "$OUT/check.log"

step "GPU test suite"
timeout 240 "$B/mlajit_gpu_tests" 2>&1 > "$OUT/gpu_tests.log"; echo "gpu tests exit $?"
grep -E "ERROR|FAILED|test cases|assertions|MESSAGE: (launch|disk|cold|sparse_prefill)" "$OUT/gpu_tests.log" | head -60

step benchmarks
{
for op in kv_cache_store kv_cache_gather; do
  "$B/mlajit" bench $op --shape tokens=65536,heads=1,head_size=576,dtype=fp8_e4m3,granularity=64
  "$B/mlajit" bench $op --shape tokens=65536,heads=1,head_size=576,dtype=bf16
  "$B/mlajit" bench $op --shape tokens=16384,heads=8,head_size=128,dtype=fp8_e4m3,mla=0,granularity=128,scale_fmt=ue8m0
done
for h in 128 64; do for c in 4096 28672 61440; do
  "$B/mlajit" bench mla_indexer --shape heads=$h,new_tokens=4096,cached_tokens=$c,top_k=2048
done; done
for kv in 8192 32768 131072; do
  "$B/mlajit" bench sparse_prefill --shape s_kv=$kv,kv_dtype=bf16
  "$B/mlajit" bench sparse_prefill --shape s_kv=$kv,kv_dtype=fp8_e4m3,scale_block_size=576
done
"$B/mlajit" bench sparse_prefill --shape s_kv=32768,kv_dtype=fp8_e4m3,scale_block_size=64
"$B/mlajit" bench sparse_prefill --shape s_kv=32768,kv_dtype=fp8_e4m3,scale_block_size=64,path=sm90
"$B/mlajit" bench sparse_prefill --shape s_kv=32768,kv_dtype=bf16,path=sm80
} 2>&1 | tee "$OUT/bench.log"

step "tune the default config"
timeout 90 "$B/mlajit" tune examples/deepseek_v32.json --json > "$OUT/tune.json" 2> "$OUT/tune.err"; echo "tune exit $?"
tail -3 "$OUT/tune.err"

step "compute-sanitizer memcheck (functional cases)"
timeout 200 compute-sanitizer --tool memcheck --leak-check no "$B/mlajit_gpu_tests" \
  -tse="sparse_prefill" -tce="a row of 131072*,disk hit*,cold compile*,launch overhead*,kv_cache_store sweep*,time_launches*" \
  > "$OUT/memcheck.log" 2>&1; echo "memcheck exit $?"
grep -E "ERROR SUMMARY|test cases|========= (Invalid|Program hit)" "$OUT/memcheck.log" | head -10
step done
