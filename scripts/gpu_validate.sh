#!/usr/bin/env bash
# Everything the GPU machine checks in one call (device time is scarce): the main job on the
# default config, the GPU test suite, the Python package's GPU tests, and the benchmarks of every op
# at the DeepSeek-V3.2 serving shapes, side by side with anchor libraries when given. Logs go to $OUT (or ./gpu-out).
# Usage: scripts/gpu_validate.sh BIN_DIR [ANCHOR_DIR]
#   BIN_DIR     holds mlajit, mlajit_gpu_tests and libmlajit.so (the Python tests load that one), and
#               _fastcall.abi3.so (target mlajit_fastcall) for the Python package
#   ANCHOR_DIR  optional: libflashmla_anchor.so / libdeepgemm_anchor.so exposing the C ABIs of
#               src/ops/sparse_prefill/bench.hpp and src/ops/mla_indexer/bench.hpp (never built here)
# The sanitizer runs are scripts/gpu_sanitize.sh.
set -uo pipefail
B=${1:?usage: scripts/gpu_validate.sh BIN_DIR [ANCHOR_DIR]}
A=${2:-}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export MLAJIT_CACHE_DIR=/tmp/mlajit-gpu-cache
step() { echo "=== $1 ($(date +%T))"; }
anchor() { [ -n "$A" ] && [ -f "$A/$1" ] && echo "--anchor $A/$1"; }

step info
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
"$B/mlajit" info --json > "$OUT/info.json"; "$B/mlajit" --version

step "main job: build + check of examples/deepseek_v32.json"
mkdir -p cache && chmod 700 cache
timeout 120 "$B/mlajit" build examples/deepseek_v32.json --cache-dir cache
timeout 120 "$B/mlajit" check examples/deepseek_v32.json --cache-dir cache --require-gpu 2>&1 | tee "$OUT/check.log"

step "GPU test suite"
# 600 s: the sparse_prefill suite alone takes a few minutes with a cold cache (it compiles every mode)
timeout 600 "$B/mlajit_gpu_tests" > "$OUT/gpu_tests.log" 2>&1; echo "gpu tests exit $?"
grep -E "ERROR|FAILED|test cases|assertions|MESSAGE: (launch|disk|cold|remote|memory hit)" "$OUT/gpu_tests.log" | head -40

step "Python package on the GPU (torch custom ops, torch.compile, CUDA graphs, bit-exactness vs the C API)"
rm -rf /tmp/mlajit-py && mkdir -p /tmp/mlajit-py && cp -r python/mlajit /tmp/mlajit-py/
# The C extension of the eager launch path: BIN_DIR's (cmake --build build --target mlajit_fastcall),
# else compiled here; without it the package launches through ctypes (the overhead test says which).
if [ -f "$B/_fastcall.abi3.so" ]; then
  cp "$B/_fastcall.abi3.so" /tmp/mlajit-py/mlajit/
else
  cc -O2 -shared -fPIC -Iinclude -I"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
    python/src/_fastcall.c -o /tmp/mlajit-py/mlajit/_fastcall.abi3.so || echo "mlajit._fastcall not built: ctypes path"
fi
( cd python/tests && PYTHONPATH=/tmp/mlajit-py MLAJIT_LIBRARY="$(realpath "../../$B/libmlajit.so")" \
    timeout 200 python3 -m pytest -q -rs -s . > "$OUT/python_tests.log" 2>&1; echo "python tests exit $?" )
grep -E "passed|failed|skipped|overhead|µs|us per" "$OUT/python_tests.log" | tail -12

step benchmarks
{
for op in kv_cache_store kv_cache_gather; do
  "$B/mlajit" bench $op --shape tokens=65536,heads=1,head_size=576,dtype=fp8_e4m3,quantization_granularity=64
  "$B/mlajit" bench $op --shape tokens=65536,heads=1,head_size=576,dtype=bf16
  "$B/mlajit" bench $op --shape tokens=16384,heads=8,head_size=128,dtype=fp8_e4m3,mla=0,quantization_granularity=128,scale_fmt=ue8m0
done
for kv in 8192 32768 65536; do
  "$B/mlajit" bench mla_indexer --shape heads=64,tokens=4096,keys=$kv,top_k=2048 --reps 10 $(anchor libdeepgemm_anchor.so)
  "$B/mlajit" bench mla_indexer --shape heads=128,tokens=4096,keys=$kv,top_k=2048 --reps 10
done
for kv in 8192 32768 65536 131072; do
  "$B/mlajit" bench sparse_prefill --shape keys=$kv,kv_dtype=bf16,sink=1 --reps 10 $(anchor libflashmla_anchor.so)
  "$B/mlajit" bench sparse_prefill --shape keys=$kv,kv_dtype=fp8_e4m3,quantization_granularity=576,sink=1 --reps 10 $(anchor libflashmla_anchor.so)
  "$B/mlajit" bench sparse_prefill --shape keys=$kv,kv_dtype=fp8_e4m3,quantization_granularity=576,sink=1,kv_staging=bf16 --reps 10 $(anchor libflashmla_anchor.so)
done
} 2>&1 | tee "$OUT/bench.log"
step done
