#!/bin/sh
# Builds the sm_90a prefill harness (no GPU needed) into build-p90/ and prints the register/spill
# report. Run from anywhere; needs nvcc (12.4+, built with 13.0).
#   dev/prefill90/build.sh          -> build-p90/prefill90_harness
#   DEBUG_WAIT=1 dev/prefill90/build.sh -> build-p90/prefill90_harness_dbg (mbarrier waits trap
#                                      with a report after ~1e6 tries instead of hanging)
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT_DIR:-$root/build-p90}
name=prefill90_harness
flags=""
if [ -n "$DEBUG_WAIT" ]; then name=prefill90_harness_dbg; flags="-DMJ_MBAR_WAIT_LIMIT=1000000"; fi
mkdir -p "$out"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$root/templates" $flags -Xptxas -v \
  -Xcompiler -static-libstdc++,-static-libgcc -o "$out/$name" "$root/dev/prefill90/harness.cu" \
  2> "$out/$name.ptxas.log" || { cat "$out/$name.ptxas.log"; exit 1; }
grep -E "Compiling entry|spill|C75" "$out/$name.ptxas.log" | grep -v "fill_bf16" | paste - - |
  sed -E "s/ptxas info *: Compiling entry function '([a-z0-9_]+)'.*Function properties.*\t */\1: /" || true
